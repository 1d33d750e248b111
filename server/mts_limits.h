/*
 * mts_limits.h - hysteresis states, limits, enforcement, and the figures
 * they compare, and the registry's growth rates and forecasts (limits.c, on
 * the rate arithmetic of rate.c).
 */
#ifndef MTS_LIMITS_H
#define MTS_LIMITS_H

#include <stdbool.h>
#include <stdint.h>

#include "mts_registry.h"

/* limits.c's own state (reg->lim). */
struct mts_limits_state {
	uint64_t fleet_over_since_ns; /* CLOCK_MONOTONIC; 0 = not over */
	bool enforce_idle_logged;     /* "nothing to signal" said once */
	uint64_t enforcement_signals; /* signals sent, for /metrics */
	/* A process's over/back-under change was held back by its uid's
	 * event budget this tick (owed), or the last (owed_seen): the next
	 * evaluation looks at every process for it. */
	bool owed, owed_seen;
	/* Called on every state change (Watch). May be NULL. */
	void (*on_event)(void *ctx, const struct mts_event *ev);
	void *event_ctx;
};

/*
 * The hysteresis state machine. `value` is the figure compared (already
 * including reservations where they count); limit 0 means no limit (ok).
 *   ok/high -> over   when value > limit
 *   ok      -> high   when value >= limit x high
 *   over    -> high   only when value < limit x (1 - hyst)
 *   high    -> ok     only when value < limit x (high - hyst)
 * Leaving `over` may land directly in `ok` when both lower marks are
 * passed at once. `forecast` (the scope's forecast gate is on) makes what
 * would be `ok` `high`.
 */
uint32_t mts_state_next(uint32_t cur, uint64_t value, uint64_t limit,
                        uint32_t high_bp, uint32_t hyst_bp, bool forecast);

/* Before an evaluation of every process (the tick's pass): what was held
 * back by a uid's event budget at the last is looked at again. */
void mts_limits_procs_begin(struct mts_registry *reg);

/* The figure limits compare, per reg->policy.measure. */
uint64_t mts_measured(const struct mts_registry *reg, uint64_t accounted,
                      uint64_t rss);

/* The growth window in force, in ns. */
uint64_t mts_growth_window_ns(const struct mts_registry *reg);
/* What the fleet's or a group's state compares (measured + reserved),
 * and its forecast: seconds to the limit at the current rate, 0 = none. */
uint64_t mts_fleet_value(const struct mts_registry *reg);
uint64_t mts_group_value(const struct mts_registry *reg,
                         const struct mts_group *g);
double mts_fleet_forecast(const struct mts_registry *reg);
double mts_group_forecast(const struct mts_registry *reg,
                          const struct mts_group *g);
/* A process's rate and forecast against its own limit. */
double mts_proc_growth(const struct mts_registry *reg,
                       const struct mts_proc *p);
double mts_proc_forecast(const struct mts_registry *reg,
                         const struct mts_proc *p);

/* Sample the fleet's and every group's measured figure (the tick calls it
 * every MTS_RATE_SAMPLE_MS). */
void mts_rates_sample(struct mts_registry *reg, uint64_t now_ns);

/* Re-evaluate fleet and group states (and every process's when `procs`),
 * write slot flags, send events. The caller publishes. */
void mts_limits_eval(struct mts_registry *reg, bool procs);
/* Group `g` loses its entry: if Watch last heard it in another state than
 * ok, it hears ok now (the registry's group_gone). */
void mts_limits_group_gone(struct mts_registry *reg, struct mts_group *g);

/* One process's part of mts_limits_eval(reg, true). The tick calls it
 * while the process's line is in cache instead of a second pass. */
void mts_limits_eval_proc(struct mts_registry *reg, struct mts_proc *p);

/* A process that was over its own limit leaves (exit, pid reuse): its
 * subscribers hear it is no longer over. */
void mts_limits_proc_gone(struct mts_registry *reg, const struct mts_proc *p);

/* Install `pol` (deep copy) and apply it: fleet, group and default process
 * limits, watermarks; runtime SetLimit values for the fleet and groups are
 * replaced by the policy's, per-pid ones are kept. 0 or -ENOMEM. */
int mts_limits_apply_policy(struct mts_registry *reg,
                            const struct mts_policy *pol);

/* SetLimit. *previous gets the limit in force before, *now the one after
 * (for a pid, 0 falls back to the default per-process limit). Return 0,
 * -ENOENT (pid not registered), -EINVAL (bad group name), -ENOMEM. */
int mts_limit_set_fleet(struct mts_registry *reg, uint64_t bytes,
                        uint64_t *previous, uint64_t *now);
int mts_limit_set_group(struct mts_registry *reg, const char *name,
                        uint64_t bytes, uint64_t *previous, uint64_t *now);
int mts_limit_set_pid(struct mts_registry *reg, uint32_t pid, uint64_t bytes,
                      uint64_t *previous, uint64_t *now);

/* Enforcement step of a tick (no-op unless policy.enforce_signal). */
void mts_enforce(struct mts_registry *reg, uint64_t now_ns);

#endif /* MTS_LIMITS_H */
