/*
 * mts_rate.h - growth rates and forecasts: the weighted fit of a process
 * and the windowed line of the fleet and its groups (rate.c).
 */
#ifndef MTS_RATE_H
#define MTS_RATE_H

#include <stdbool.h>
#include <stdint.h>

#define MTS_DEFAULT_GROWTH_WINDOW_MS 10000u
#define MTS_GROWTH_WINDOW_MIN_MS     1000u
#define MTS_GROWTH_WINDOW_MAX_MS     3600000u
#define MTS_FORECAST_HORIZON_MAX_MS  86400000u
/* Fleet and groups are sampled this often (a tick longer than this: every
 * tick); processes MTS_RATE_PROC_SLICES ticks apart, a slice of them per
 * tick, so no tick makes a second pass over every process. */
#define MTS_RATE_SAMPLE_MS   100u
#define MTS_RATE_PROC_SLICES 32u
/* A forecast `high` is left only when the forecast is beyond the horizon
 * plus this margin (or gone) for one growth window. */
#define MTS_FORECAST_LEAVE_PCT 50u

/* The weighted sums behind one rate (rate.c). 64 bytes: one line. */
struct mts_rate {
	double s0, st, sv, stt, stv; /* relative to the latest sample */
	uint64_t last_ns;            /* CLOCK_MONOTONIC; 0 = no sample */
	uint64_t last_v;
	uint64_t first_ns; /* start of the current run of samples */
};

/* The fleet's and a group's rate: the slope both halves of the last
 * window show, each half's the Theil-Sen median of its pairwise slopes
 * (rate.c), over a ring of at most MTS_WRATE_SAMPLES spaced at least
 * window / (MTS_WRATE_SAMPLES - 1) apart. A step reads 0 from a few
 * samples after it, a ramp exactly; unlike the weighted fit of a
 * process's rate, a sample is forgotten once it is a window old. */
#define MTS_WRATE_SAMPLES 64u
struct mts_wrate {
	uint64_t t[MTS_WRATE_SAMPLES]; /* CLOCK_MONOTONIC ns */
	uint64_t v[MTS_WRATE_SAMPLES];
	uint32_t head; /* next write */
	uint32_t n;
};

/* Add sample `v` at `now_ns` (kept if the newest is old enough). */
void mts_wrate_add(struct mts_wrate *r, uint64_t now_ns, uint64_t v,
                   uint64_t window_ns);
/* Slope in bytes per second of the samples of the window ending at the
 * newest; 0 until they span a fifth of the window. */
double mts_wrate_get(const struct mts_wrate *r, uint64_t window_ns);

/* exp() of the last interval, reused while intervals repeat (a slice of
 * processes sampled at one tick all have the same). */
struct mts_decay_cache {
	uint64_t dt_ns, window_ns;
	double decay;
};

/* Forecast hysteresis of one scope. */
struct mts_forecast_gate {
	bool on;                 /* the forecast holds the scope `high` */
	uint64_t clear_since_ns; /* out of the margin since, 0 = not */
};

void mts_rate_reset(struct mts_rate *r);
/* e^(-dt / tau) for a window (cached in `c` when not NULL). */
double mts_rate_decay(struct mts_decay_cache *c, uint64_t dt_ns,
                      uint64_t window_ns);
/* Add sample `v` taken at `now_ns`. */
void mts_rate_add(struct mts_rate *r, uint64_t now_ns, uint64_t v,
                  uint64_t window_ns, struct mts_decay_cache *cache);
/* Bytes per second (negative: shrinking); 0 until the samples span a
 * fifth of the window. */
double mts_rate_get(const struct mts_rate *r, uint64_t window_ns);
/* Seconds until `value` reaches `limit` at `rate`; 0 = no forecast (no
 * limit, not growing, or already there). */
double mts_forecast_s(double rate, uint64_t value, uint64_t limit);
/* Step the gate with the current forecast `secs` (0 = none): on when
 * secs <= horizon; off again only after hold_ns beyond horizon x (1 +
 * MTS_FORECAST_LEAVE_PCT%) or without a forecast. horizon_ms 0: always
 * off. Returns g->on. */
bool mts_forecast_gate(struct mts_forecast_gate *g, double secs,
                       uint64_t horizon_ms, uint64_t hold_ns, uint64_t now_ns);

#endif /* MTS_RATE_H */
