/*
 * rate.c - growth rate of a figure and the forecast of its limit.
 *
 * Two least-squares fits, both lines through samples rather than averages
 * of sample-to-sample differences, so a one-tick spike (or a step) never
 * shows as a burst of rate: a step of S bytes moves the slope by at most
 * ~2.5 S / window (tests/unit/test_server_rate.c), spread over the window,
 * never S / tick.
 *
 * - Fleet and groups (struct mts_wrate): an ordinary fit over the samples
 *   of the last growth window, from a ring of 64. A steady ramp is read
 *   exactly once it has lasted one window, and a figure flat for a window
 *   reads exactly 0 (no forecast), whatever happened before. O(64) per
 *   sample, every MTS_RATE_SAMPLE_MS, for 1 + groups figures.
 * - Processes (struct mts_rate): 16384 rings would be 16 MiB, so an
 *   exponentially weighted fit in 64 bytes, O(1) per sample: weight
 *   e^(-age / tau), tau = window / 5, so a sample one window old weighs
 *   under 1% and a ramp is tracked to within ~5% after one window. The
 *   price: an old step fades rather than leaving, so a flat process can
 *   read a small residual rate for a few windows after a big change.
 *
 * The weighted sums are kept relative to the latest sample (time 0, value
 * 0) and shifted when a new one comes, so the doubles hold differences
 * over about one window, never absolute byte counts or clock readings: no
 * precision is lost on a fleet of terabytes. The window fit works on
 * differences from its newest sample for the same reason.
 */
#include "mts_rate.h"

#include <math.h>

#include "mts_limits.h"
#include "mts_registry.h"

/* The weights' time constant, in windows. */
#define TAU_PER_WINDOW 5.0

void mts_rate_reset(struct mts_rate *r)
{
	*r = (struct mts_rate){0};
}

double mts_rate_decay(struct mts_decay_cache *c, uint64_t dt_ns,
                      uint64_t window_ns)
{
	if (c && c->dt_ns == dt_ns && c->window_ns == window_ns)
		return c->decay;
	double d = exp(-(double)dt_ns * TAU_PER_WINDOW / (double)window_ns);
	if (c) {
		c->dt_ns = dt_ns;
		c->window_ns = window_ns;
		c->decay = d;
	}
	return d;
}

void mts_rate_add(struct mts_rate *r, uint64_t now_ns, uint64_t v,
                  uint64_t window_ns, struct mts_decay_cache *cache)
{
	/* First sample, or none for a whole window (a stalled loop, a
	 * measure changed): start afresh rather than fit a line through
	 * points that old. */
	if (r->last_ns == 0 || now_ns < r->last_ns ||
	    now_ns - r->last_ns > window_ns) {
		*r = (struct mts_rate){.s0 = 1,
		                       .last_ns = now_ns,
		                       .last_v = v,
		                       .first_ns = now_ns};
		return;
	}
	uint64_t dt_ns = now_ns - r->last_ns;
	if (dt_ns == 0)
		return;
	double d = mts_rate_decay(cache, dt_ns, window_ns);
	double dt = (double)dt_ns / 1e9;
	double dv =
	    v >= r->last_v ? (double)(v - r->last_v) : -(double)(r->last_v - v);
	double s0 = r->s0 * d, st = r->st * d, sv = r->sv * d;
	double stt = r->stt * d, stv = r->stv * d;
	/* Move the origin to the new sample: every old point is dt earlier
	 * and dv lower than before. */
	r->stt = stt - 2 * dt * st + dt * dt * s0;
	r->stv = stv - dt * sv - dv * st + dt * dv * s0;
	r->st = st - dt * s0;
	r->sv = sv - dv * s0;
	r->s0 = s0 + 1; /* the new point, at (0, 0) */
	r->last_ns = now_ns;
	r->last_v = v;
}

double mts_rate_get(const struct mts_rate *r, uint64_t window_ns)
{
	/* Until the samples span tau, a line through the first few would
	 * follow whatever happened between them. */
	if (r->last_ns == 0 ||
	    (double)(r->last_ns - r->first_ns) * TAU_PER_WINDOW <
	        (double)window_ns)
		return 0;
	double den = r->s0 * r->stt - r->st * r->st;
	if (!(den > 0))
		return 0;
	return (r->s0 * r->stv - r->st * r->sv) / den;
}

double mts_forecast_s(double rate, uint64_t value, uint64_t limit)
{
	if (limit == 0 || value >= limit || !(rate > 0))
		return 0;
	double s = (double)(limit - value) / rate;
	/* A positive rate so small that the time is not a number worth
	 * showing is no forecast. */
	return s > 0 && s < 1e12 ? s : 0;
}

bool mts_forecast_gate(struct mts_forecast_gate *g, double secs,
                       uint64_t horizon_ms, uint64_t hold_ns, uint64_t now_ns)
{
	if (horizon_ms == 0) {
		*g = (struct mts_forecast_gate){0};
		return false;
	}
	double horizon = (double)horizon_ms / 1000;
	if (secs > 0 && secs <= horizon) {
		g->on = true;
		g->clear_since_ns = 0;
	} else if (g->on && secs > 0 &&
	           secs <= horizon * (1 + MTS_FORECAST_LEAVE_PCT / 100.0)) {
		g->clear_since_ns = 0; /* in the margin: stays */
	} else if (g->on) {
		/* Leave only once the forecast has stayed out of the margin
		 * (or gone) for hold_ns: a noisy rate dips out and back. */
		if (g->clear_since_ns == 0)
			g->clear_since_ns = now_ns ? now_ns : 1;
		else if (now_ns - g->clear_since_ns >= hold_ns)
			*g = (struct mts_forecast_gate){0};
	}
	return g->on;
}

/* ---- the window fit (fleet and groups) ----------------------------------- */

static uint32_t wrate_at(const struct mts_wrate *r, uint32_t back)
{
	return (r->head + MTS_WRATE_SAMPLES - 1 - back) % MTS_WRATE_SAMPLES;
}

void mts_wrate_add(struct mts_wrate *r, uint64_t now_ns, uint64_t v,
                   uint64_t window_ns)
{
	if (r->n > 0) {
		uint64_t newest = r->t[wrate_at(r, 0)];
		if (now_ns < newest)
			return;
		/* Closer than the spacing: the newest sample moves instead,
		 * so the ring always ends at the latest figure. */
		uint64_t gap = window_ns / (MTS_WRATE_SAMPLES - 1);
		if (r->n > 1 && now_ns - r->t[wrate_at(r, 1)] < gap) {
			uint32_t i = wrate_at(r, 0);
			r->t[i] = now_ns;
			r->v[i] = v;
			return;
		}
	}
	r->t[r->head] = now_ns;
	r->v[r->head] = v;
	r->head = (r->head + 1) % MTS_WRATE_SAMPLES;
	if (r->n < MTS_WRATE_SAMPLES)
		r->n++;
}

double mts_wrate_get(const struct mts_wrate *r, uint64_t window_ns)
{
	if (r->n < 2)
		return 0;
	uint32_t ni = wrate_at(r, 0);
	uint64_t tn = r->t[ni], vn = r->v[ni];
	/* Relative to the newest sample, as for the weighted fit. */
	double sx = 0, sy = 0, sxx = 0, sxy = 0, oldest = 0;
	uint32_t k = 0;
	for (uint32_t b = 0; b < r->n; b++) {
		uint32_t i = wrate_at(r, b);
		if (tn - r->t[i] > window_ns)
			break;
		double x = -(double)(tn - r->t[i]) / 1e9;
		double y = r->v[i] >= vn ? (double)(r->v[i] - vn)
		                         : -(double)(vn - r->v[i]);
		sx += x;
		sy += y;
		sxx += x * x;
		sxy += x * y;
		oldest = x;
		k++;
	}
	if (k < 2 || -oldest * TAU_PER_WINDOW * 1e9 < (double)window_ns)
		return 0;
	double den = k * sxx - sx * sx;
	if (!(den > 0))
		return 0;
	return (k * sxy - sx * sy) / den;
}

/* ---- the registry's rates ------------------------------------------------ */

uint64_t mts_growth_window_ns(const struct mts_registry *reg)
{
	uint32_t ms = reg->policy.growth_window_ms;
	return (uint64_t)(ms ? ms : MTS_DEFAULT_GROWTH_WINDOW_MS) * 1000000u;
}

uint64_t mts_fleet_value(const struct mts_registry *reg)
{
	const struct mts_totals *t = &reg->totals;
	return mt_sat_add(mts_measured(reg, t->bytes, t->rss), t->reserved);
}

uint64_t mts_group_value(const struct mts_registry *reg,
                         const struct mts_group *g)
{
	return mt_sat_add(mts_measured(reg, g->bytes, g->rss), g->reserved);
}

/* The distance is to what the state compares (reservations count as
 * used), the rate that of the measured figure alone: a grant is a step,
 * not growth. */
double mts_fleet_forecast(const struct mts_registry *reg)
{
	return mts_forecast_s(reg->totals.growth, mts_fleet_value(reg),
	                      reg->totals.limit);
}

double mts_group_forecast(const struct mts_registry *reg,
                          const struct mts_group *g)
{
	return mts_forecast_s(g->growth, mts_group_value(reg, g), g->limit);
}

double mts_proc_growth(const struct mts_registry *reg, const struct mts_proc *p)
{
	return mts_rate_get(&p->rate, mts_growth_window_ns(reg));
}

double mts_proc_forecast(const struct mts_registry *reg,
                         const struct mts_proc *p)
{
	return mts_forecast_s(mts_proc_growth(reg, p),
	                      mts_measured(reg, p->bytes, p->rss), p->limit);
}

void mts_rates_sample(struct mts_registry *reg, uint64_t now_ns)
{
	uint64_t w = mts_growth_window_ns(reg);
	struct mts_totals *t = &reg->totals;
	mts_wrate_add(&t->rate, now_ns, mts_measured(reg, t->bytes, t->rss), w);
	t->growth = mts_wrate_get(&t->rate, w);
	t->rate_ns = now_ns;
	for (uint32_t i = 0; i < reg->groups_used; i++) {
		struct mts_group *g = &reg->groups[i];
		if (!g->name)
			continue;
		mts_wrate_add(&g->rate, now_ns,
		              mts_measured(reg, g->bytes, g->rss), w);
		g->growth = mts_wrate_get(&g->rate, w);
	}
}
