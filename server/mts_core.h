/*
 * mts_core.h - the server's core: the registry together with the modules
 * that act on its figures (core.c). Start and end a registry here, not
 * with mts_registry_init/free, so that it is wired to them.
 */
#ifndef MTS_CORE_H
#define MTS_CORE_H

#include <uv.h>

#include "mts_registry.h"

/* core.c's own counters (reg->tick), for /metrics. */
struct mts_tick_stats {
	uint64_t last_ns; /* duration of the latest tick */
	uint64_t sum_ns;  /* all ticks' durations */
	uint64_t count;
};

/* mts_registry_init() with the server's watch: vouching, reservations,
 * limits and group permissions follow the registry's processes. */
int mts_core_init(struct mts_registry *reg, uv_loop_t *loop,
                  struct mtshm_map *map, const char *label,
                  struct mts_state *state);
/* Reservations, then the registry's tables. Call after the loop ran the
 * close callbacks (see mts_registry_free). */
void mts_core_free(struct mts_registry *reg);

/* One aggregation pass: sum every registered slot, settle what is
 * vouched for, reconcile reservations, sample rates, evaluate limits,
 * enforce, and publish the fleet snapshot. */
void mts_core_tick(struct mts_registry *reg);

#endif /* MTS_CORE_H */
