/*
 * test_server_rate.c - the growth rate (rate.c) and the forecast's
 * hysteresis, on synthetic values with synthetic timestamps: a steady ramp
 * is tracked, a flat figure reads 0, a shrinking one negative, a step does
 * not spike, noise does not flap the forecast state.
 */
#include <criterion/criterion.h>
#include <math.h>
#include <string.h>

#include "server.h"

#define MIB   (1024.0 * 1024.0)
#define SEC   UINT64_C(1000000000)
#define MS    UINT64_C(1000000)
#define T0    (1000 * SEC) /* any monotonic start */
#define STEP  (100 * MS)   /* the fleet's sampling cadence */
#define WIN10 (10 * SEC)

/* |a - b| <= eps (the TSan stand-in for Criterion has no float_eq). */
#define assert_near(a, b, eps, ...)                                            \
	cr_assert(fabs((double)(a) - (double)(b)) <= (eps), __VA_ARGS__)

/* Feed f(t) every STEP for [from, to) seconds; the rate after each sample
 * goes to the callback when there is one. */
typedef double (*level_fn)(double t);

static double feed(struct mts_rate *r, level_fn f, double from, double to,
                   uint64_t window, double *min_rate, double *max_rate)
{
	double rate = 0;
	for (double t = from; t < to - 1e-9; t += (double)STEP / SEC) {
		uint64_t now = T0 + (uint64_t)llround(t * SEC);
		mts_rate_add(r, now, (uint64_t)llround(f(t)), window, NULL);
		rate = mts_rate_get(r, window);
		if (min_rate && rate < *min_rate)
			*min_rate = rate;
		if (max_rate && rate > *max_rate)
			*max_rate = rate;
	}
	return rate;
}

static double flat(double t)
{
	(void)t;
	return 512 * MIB;
}

/* 40 MiB/s from t = 20 s, flat before. */
static double ramp(double t)
{
	return 64 * MIB + (t > 20 ? (t - 20) * 40 * MIB : 0);
}

static double shrink(double t)
{
	return 1024 * MIB - (t > 20 ? (t - 20) * 20 * MIB : 0);
}

/* 100 MiB more from t = 20 s on. */
static double step(double t)
{
	return 64 * MIB + (t >= 20 ? 100 * MIB : 0);
}

/* 1 TiB plus 1 MiB/s: the sums must not lose the slope to the level. */
static double huge_ramp(double t)
{
	return 1099511627776.0 + t * MIB;
}

/* Flat at 200 MiB, with up to +/- 8 MiB of noise per sample
 * (deterministic). */
static unsigned noise_seed = 12345;
static double noisy(double t)
{
	(void)t;
	noise_seed = noise_seed * 1103515245u + 12345u;
	double u = (double)((noise_seed >> 8) & 0xffff) / 65535.0; /* 0..1 */
	return 200 * MIB + (u * 2 - 1) * 8 * MIB;
}

Test(rate, steady_ramp_within_window)
{
	struct mts_rate r = {0};
	feed(&r, ramp, 0, 20, WIN10, NULL, NULL);
	assert_near(mts_rate_get(&r, WIN10), 0, 1, "flat before");
	double got = feed(&r, ramp, 20, 30.05, WIN10, NULL, NULL);
	cr_assert(got > 0.9 * 40 * MIB && got < 1.02 * 40 * MIB,
	          "after one window: %.1f MiB/s, want 40", got / MIB);
	/* And then exactly, as the flat part fades. */
	got = feed(&r, ramp, 30.05, 45, WIN10, NULL, NULL);
	cr_assert(fabs(got - 40 * MIB) < 0.01 * 40 * MIB, "%.3f MiB/s",
	          got / MIB);
}

Test(rate, flat_is_zero_and_shrinking_negative)
{
	struct mts_rate r = {0};
	double got = feed(&r, flat, 0, 30, WIN10, NULL, NULL);
	cr_assert(fabs(got) < 1.0, "flat: %f B/s", got);
	mts_rate_reset(&r);
	got = feed(&r, shrink, 0, 31, WIN10, NULL, NULL);
	cr_assert(got < -0.9 * 20 * MIB && got > -1.02 * 20 * MIB,
	          "shrinking: %.1f MiB/s", got / MIB);
	cr_assert_eq(mts_forecast_s(got, 100, 1000), 0, "no forecast");
}

Test(rate, step_does_not_spike)
{
	struct mts_rate r = {0};
	double lo = 0, hi = 0;
	feed(&r, step, 0, 20, WIN10, NULL, NULL);
	feed(&r, step, 20, 40, WIN10, &lo, &hi);
	/* A two-sample difference would read 1000 MiB/s; the fit spreads
	 * the 100 MiB over the window: at most ~2 x 100 MiB / 10 s. */
	cr_assert(hi < 25 * MIB, "step peak %.1f MiB/s", hi / MIB);
	double end = feed(&r, step, 40, 60, WIN10, NULL, NULL);
	cr_assert(fabs(end) < 0.5 * MIB, "settles: %.2f MiB/s", end / MIB);
}

Test(rate, large_values_keep_precision)
{
	struct mts_rate r = {0};
	double got = feed(&r, huge_ramp, 0, 20, WIN10, NULL, NULL);
	cr_assert(fabs(got - MIB) < 0.001 * MIB, "%.6f MiB/s", got / MIB);
}

Test(rate, nothing_until_a_fifth_of_the_window)
{
	struct mts_rate r = {0};
	mts_rate_add(&r, T0, 0, WIN10, NULL);
	mts_rate_add(&r, T0 + STEP, 100 << 20, WIN10, NULL);
	cr_assert_eq(mts_rate_get(&r, WIN10), 0);
	for (uint64_t k = 2; k <= 20; k++)
		mts_rate_add(&r, T0 + k * STEP, (100 + k) << 20, WIN10, NULL);
	cr_assert_gt(mts_rate_get(&r, WIN10), 0);
	/* A gap of more than a window starts afresh. */
	mts_rate_add(&r, T0 + 20 * STEP + 11 * SEC, 5000u << 20, WIN10, NULL);
	cr_assert_eq(mts_rate_get(&r, WIN10), 0);
}

Test(rate, decay_cache)
{
	struct mts_decay_cache c = {0};
	double a = mts_rate_decay(&c, STEP, WIN10);
	assert_near(a, exp(-0.05), 1e-12, "off by more than allowed");
	assert_near(mts_rate_decay(&c, STEP, WIN10), a, 0,
	            "off by more than allowed");
	assert_near(mts_rate_decay(&c, 2 * STEP, WIN10), exp(-0.1), 1e-12, "%s",
	            "near");
}

Test(forecast, seconds_to_limit)
{
	assert_near(mts_forecast_s(10.0, 100, 1100), 100.0, 1e-9,
	            "off by more than allowed");
	cr_assert_eq(mts_forecast_s(10.0, 100, 0), 0, "no limit");
	cr_assert_eq(mts_forecast_s(0.0, 100, 1000), 0, "flat");
	cr_assert_eq(mts_forecast_s(-5.0, 100, 1000), 0, "shrinking");
	cr_assert_eq(mts_forecast_s(10.0, 1000, 1000), 0, "at the limit");
	cr_assert_eq(mts_forecast_s(10.0, 2000, 1000), 0, "over");
	cr_assert_eq(mts_forecast_s(NAN, 100, 1000), 0);
}

Test(forecast, gate_hysteresis)
{
	struct mts_forecast_gate g = {0};
	uint64_t hold = 2 * SEC, now = T0;
	/* horizon 30 s: off at 31 s, on at 30 s. */
	cr_assert_not(mts_forecast_gate(&g, 31, 30000, hold, now));
	cr_assert_not(mts_forecast_gate(&g, 0, 30000, hold, now));
	cr_assert(mts_forecast_gate(&g, 30, 30000, hold, now));
	/* In the margin (up to 45 s): stays, however long. */
	for (int i = 0; i < 100; i++)
		cr_assert(
		    mts_forecast_gate(&g, 44, 30000, hold, now += 100 * MS));
	/* Out of the margin or gone: stays until `hold` has passed... */
	cr_assert(mts_forecast_gate(&g, 46, 30000, hold, now += 100 * MS));
	cr_assert(mts_forecast_gate(&g, 0, 30000, hold, now += SEC));
	/* ... and a dip back into the margin restarts the wait. */
	cr_assert(mts_forecast_gate(&g, 40, 30000, hold, now += 100 * MS));
	cr_assert(mts_forecast_gate(&g, 0, 30000, hold, now += SEC));
	cr_assert(mts_forecast_gate(&g, 0, 30000, hold, now += SEC));
	cr_assert_not(mts_forecast_gate(&g, 0, 30000, hold, now += SEC));
	/* Off (no horizon): never on. */
	cr_assert_not(mts_forecast_gate(&g, 1, 0, hold, now));
}

/* A noisy flat figure far from its limit: the forecast never comes near
 * the horizon, so the gate never turns on. */
Test(forecast, noisy_flat_does_not_flap)
{
	struct mts_rate r = {0};
	struct mts_forecast_gate g = {0};
	uint64_t win = 5 * SEC, limit = 400u << 20;
	int changes = 0;
	bool was = false;
	for (uint64_t k = 0; k < 300; k++) { /* 30 s */
		uint64_t now = T0 + k * STEP;
		uint64_t v = (uint64_t)noisy(0);
		mts_rate_add(&r, now, v, win, NULL);
		double fc = mts_forecast_s(mts_rate_get(&r, win), v, limit);
		bool on = mts_forecast_gate(&g, fc, 10000, win, now);
		changes += on != was;
		was = on;
		cr_assert(fabs(mts_rate_get(&r, win)) < 10 * MIB, "%f MiB/s",
		          mts_rate_get(&r, win) / MIB);
	}
	cr_assert_eq(changes, 0);
}

Test(forecast, state_machine_input)
{
	/* limit 1000, high at 80%, hysteresis 5%. */
	cr_assert_eq(mts_state_next(MTSHM_STATE_OK, 100, 1000, 8000, 500, true),
	             MTSHM_STATE_HIGH);
	cr_assert_eq(
	    mts_state_next(MTSHM_STATE_HIGH, 100, 1000, 8000, 500, false),
	    MTSHM_STATE_OK);
	cr_assert_eq(
	    mts_state_next(MTSHM_STATE_OK, 1001, 1000, 8000, 500, true),
	    MTSHM_STATE_OVER);
	cr_assert_eq(mts_state_next(MTSHM_STATE_OK, 100, 0, 8000, 500, true),
	             MTSHM_STATE_OK, "no limit, no state");
}

/* ---- the window fit of the fleet and groups ----------------------------- */

static double wfeed(struct mts_wrate *r, level_fn f, double from, double to,
                    uint64_t window, double *max_rate)
{
	double rate = 0;
	for (double t = from; t < to - 1e-9; t += (double)STEP / SEC) {
		uint64_t now = T0 + (uint64_t)llround(t * SEC);
		mts_wrate_add(r, now, (uint64_t)llround(f(t)), window);
		rate = mts_wrate_get(r, window);
		if (max_rate && rate > *max_rate)
			*max_rate = rate;
	}
	return rate;
}

Test(wrate, ramp_exact_after_one_window)
{
	static struct mts_wrate r;
	wfeed(&r, ramp, 0, 20, WIN10, NULL);
	cr_assert_eq(mts_wrate_get(&r, WIN10), 0, "flat before");
	double got = wfeed(&r, ramp, 20, 30.2, WIN10, NULL);
	cr_assert(fabs(got - 40 * MIB) < 0.01 * 40 * MIB, "%.3f MiB/s",
	          got / MIB);
	/* 3 s window: samples every 100 ms, the ring holds more than it. */
	memset(&r, 0, sizeof(r));
	got = wfeed(&r, ramp, 0, 23.2, 3 * SEC, NULL);
	cr_assert(fabs(got - 40 * MIB) < 0.01 * 40 * MIB, "%.3f MiB/s",
	          got / MIB);
}

Test(wrate, ring_spans_the_window_at_any_cadence)
{
	/* Sampled every 100 ms, a 10 s window's ring of 64 must reach back
	 * a whole window (kept samples ~160 ms apart), not 6.4 s. */
	static struct mts_wrate r;
	wfeed(&r, ramp, 0, 30, WIN10, NULL);
	uint64_t newest = 0, oldest = UINT64_MAX;
	for (uint32_t i = 0; i < r.n; i++) {
		newest = r.t[i] > newest ? r.t[i] : newest;
		oldest = r.t[i] < oldest ? r.t[i] : oldest;
	}
	cr_assert_eq(r.n, MTS_WRATE_SAMPLES);
	cr_assert_geq(newest - oldest, WIN10, "the ring spans %.1f s",
	              (double)(newest - oldest) / SEC);
}

Test(wrate, flat_after_a_step_is_exactly_zero)
{
	static struct mts_wrate r;
	double hi = 0;
	wfeed(&r, step, 0, 20, WIN10, NULL);
	wfeed(&r, step, 20, 30, WIN10, &hi);
	cr_assert(hi < 25 * MIB, "step peak %.1f MiB/s", hi / MIB);
	double got = wfeed(&r, step, 30, 31, WIN10, NULL);
	cr_assert_eq(got, 0, "a window after the step: %f B/s", got);
	cr_assert_eq(mts_forecast_s(got, 100, 1000), 0);
}

Test(wrate, shrinking_and_large)
{
	static struct mts_wrate r;
	double got = wfeed(&r, shrink, 0, 31, WIN10, NULL);
	cr_assert(fabs(got + 20 * MIB) < 0.01 * 20 * MIB, "%.2f MiB/s",
	          got / MIB);
	memset(&r, 0, sizeof(r));
	got = wfeed(&r, huge_ramp, 0, 20, WIN10, NULL);
	cr_assert(fabs(got - MIB) < 0.001 * MIB, "%.6f MiB/s", got / MIB);
}

Test(wrate, noisy_flat_does_not_flap)
{
	static struct mts_wrate r;
	struct mts_forecast_gate g = {0};
	uint64_t win = 4 * SEC, limit = 400u << 20;
	int changes = 0;
	for (uint64_t k = 0; k < 300; k++) { /* 30 s */
		uint64_t now = T0 + k * STEP;
		uint64_t v = (uint64_t)noisy(0);
		mts_wrate_add(&r, now, v, win);
		double rate = mts_wrate_get(&r, win);
		cr_assert(fabs(rate) < 10 * MIB, "%f MiB/s", rate / MIB);
		double fc = mts_forecast_s(rate, v, limit);
		changes += mts_forecast_gate(&g, fc, 10000, win, now);
	}
	cr_assert_eq(changes, 0);
}

/* ---- a step is not growth ------------------------------------------------ */

/* 600 MiB more at t = 20 s (three workers allocating 200 MiB at once),
 * flat before and after. */
static double big_step(double t)
{
	return 64 * MIB + (t >= 20 ? 600 * MIB : 0);
}

/* The same 600 MiB in three steps 100 ms apart, as workers starting one
 * after another do. */
static double staircase(double t)
{
	return 64 * MIB + (t >= 20 ? 200 * MIB : 0) +
	       (t >= 20.1 ? 200 * MIB : 0) + (t >= 20.2 ? 200 * MIB : 0);
}

/* 40 MiB/s from t = 20 s, with 300 MiB more at once at t = 27 s. */
static double ramp_with_step(double t)
{
	return ramp(t) + (t >= 27 ? 300 * MIB : 0);
}

/* 40 MiB/s held in whole MiB, as a worker holding 1 MiB blocks does. */
static double ramp_mib(double t)
{
	return floor(ramp(t) / MIB + 0.5) * MIB;
}

/* The largest |rate| from `settle` seconds after the step to the end. */
static double after_step(level_fn f, uint64_t window, double settle)
{
	static struct mts_wrate r;
	memset(&r, 0, sizeof(r));
	wfeed(&r, f, 0, 20, window, NULL);
	double worst = 0;
	for (double t = 20; t < 20 + 3 * (double)window / SEC; t += 0.1) {
		uint64_t now = T0 + (uint64_t)llround(t * SEC);
		mts_wrate_add(&r, now, (uint64_t)llround(f(t)), window);
		double rate = mts_wrate_get(&r, window);
		if (t >= 20 + settle && fabs(rate) > worst)
			worst = fabs(rate);
	}
	return worst;
}

Test(wrate, step_then_flat_is_no_growth)
{
	/* At every window length, from the third sample after the step
	 * (and through the time it crosses the middle of the window) the
	 * rate is exactly 0: no forecast. A least-squares line through the
	 * window reads up to ~1.5 x 600 MiB / window (450 MiB/s at 2 s). */
	uint64_t windows[] = {2 * SEC, 3 * SEC, WIN10};
	for (unsigned i = 0; i < 3; i++) {
		double w = after_step(big_step, windows[i], 0.25);
		cr_assert_eq(w, 0, "step, window %.0f s: %.1f MiB/s",
		             (double)windows[i] / SEC, w / MIB);
		w = after_step(staircase, windows[i], 0.45);
		cr_assert_eq(w, 0, "three steps, window %.0f s: %.1f MiB/s",
		             (double)windows[i] / SEC, w / MIB);
	}
	cr_assert_eq(mts_forecast_s(0, 664u << 20, 1024u << 20), 0);
}

Test(wrate, ramp_with_a_step_reads_the_ramp)
{
	/* The step lands while the ramp fills the window: the rate stays
	 * the ramp's, where a least-squares line adds up to ~45 MiB/s. */
	static struct mts_wrate r;
	wfeed(&r, ramp_with_step, 0, 30.2, WIN10, NULL);
	for (double t = 30.2; t < 45; t += 0.1) {
		uint64_t now = T0 + (uint64_t)llround(t * SEC);
		mts_wrate_add(&r, now, (uint64_t)llround(ramp_with_step(t)),
		              WIN10);
		double got = mts_wrate_get(&r, WIN10);
		cr_assert(fabs(got - 40 * MIB) < 0.01 * 40 * MIB,
		          "at %.1f s: %.3f MiB/s", t, got / MIB);
	}
}

Test(wrate, ramp_in_whole_mib_within_one_percent)
{
	/* Held in 1 MiB blocks and sampled 100 ms apart with up to 20 ms of
	 * lateness, as a loaded tick does: 40 MiB/s within 1% once the ramp
	 * has lasted a window, at 3 s (the integration tests') and 10 s. */
	uint64_t windows[] = {3 * SEC, WIN10};
	for (unsigned i = 0; i < 2; i++) {
		static struct mts_wrate r;
		memset(&r, 0, sizeof(r));
		unsigned jit = 777;
		double w = (double)windows[i] / SEC;
		for (double t = 0; t < 20 + 3 * w; t += 0.1) {
			jit = jit * 1103515245u + 12345u;
			double late = (double)((jit >> 8) % 21) / 1000;
			uint64_t now = T0 + (uint64_t)llround((t + late) * SEC);
			mts_wrate_add(&r, now,
			              (uint64_t)llround(ramp_mib(t + late)),
			              windows[i]);
			double got = mts_wrate_get(&r, windows[i]);
			if (t >= 20 + w)
				cr_assert(
				    fabs(got - 40 * MIB) < 0.01 * 40 * MIB,
				    "window %.0f s, at %.1f s: %.3f MiB/s", w,
				    t, got / MIB);
		}
	}
}

Test(wrate, noise_then_step_gives_no_forecast)
{
	/* +/- 8 MiB every 100 ms around 200 MiB under a 700 MiB limit, then
	 * 150 MiB more at once and the same noise: the forecast never comes
	 * within a 10 s horizon (35 MiB/s would make it; a least-squares
	 * line reads ~55 MiB/s as the step crosses the window). */
	static struct mts_wrate r;
	struct mts_forecast_gate g = {0};
	uint64_t win = 4 * SEC, limit = 700u << 20;
	double worst = 0;
	for (uint64_t k = 0; k < 400; k++) { /* 40 s */
		uint64_t now = T0 + k * STEP;
		uint64_t v = (uint64_t)noisy(0) + (k >= 200 ? 150u << 20 : 0);
		mts_wrate_add(&r, now, v, win);
		double rate = mts_wrate_get(&r, win);
		worst = fabs(rate) > worst ? fabs(rate) : worst;
		double fc = mts_forecast_s(rate, v, limit);
		cr_assert_not(mts_forecast_gate(&g, fc, 10000, win, now),
		              "forecast %.1f s at %.1f s (%.1f MiB/s)", fc,
		              (double)(k * STEP) / SEC, rate / MIB);
	}
	cr_assert(worst < 10 * MIB, "%.1f MiB/s", worst / MIB);
}
