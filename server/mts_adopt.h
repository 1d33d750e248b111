/*
 * mts_adopt.h - adoption after a restart: live workers of the restart
 * record and their slot tables taken over as they are (adopt.c, with its
 * registry entry points in registry.c).
 */
#ifndef MTS_ADOPT_H
#define MTS_ADOPT_H

#include <stdint.h>

#include "mts_registry.h"

/* A live worker found in the restart record, checked against /proc. */
struct mts_adopted {
	uint32_t slot;
	uint32_t pid;
	uint32_t uid;
	int pidfd; /* opened before the start time was checked */
	uint64_t start_time;
	uint64_t image_id;
	uint64_t registered_ns;
	uint64_t slot_gen;
	char group[64]; /* "" = "default" */
	char task[64];
};

/*
 * Rebuild the registry from the restart record: each recorded worker whose
 * pid is alive with the recorded start time is adopted with a fresh pidfd,
 * its slot table reopened from the worker's own mapping; the others are
 * freed. Counts both. Call right after mts_registry_init().
 */
int mts_adopt(struct mts_registry *reg, uint32_t *kept, uint32_t *dropped);

/* The table of `uid`, or NULL. */
struct mts_table *mts_table_find(const struct mts_registry *reg, uint32_t uid);

/* The memfd name of `uid`'s table, "LABEL-slots:INSTANCE:UID": made by
 * the server that creates it, looked for by one that adopts it. */
void mts_table_label(const struct mts_registry *reg, uint32_t uid, char *buf,
                     size_t cap);

/* Take over `map` (a table reopened from a worker, fd kept) as uid's
 * table. 0 or -ENOMEM (the caller still owns map). */
int mts_table_adopt(struct mts_registry *reg, uint32_t uid,
                    struct mtshm_map *map);

/* Registry side of adoption: take over a slot as it is (counters, lanes
 * and generation untouched), in `table`. On success the registry owns
 * a->pidfd; on -EAGAIN too (its handle close frees it); on another error
 * the caller still owns it. */
int mts_registry_adopt_slot(struct mts_registry *reg,
                            const struct mts_adopted *a,
                            struct mts_table *table);

/* `t` may have lost its last process: mark it idle (see struct
 * mts_table), freeing the longest idle table beyond MTS_TABLES_IDLE_MAX. */
void mts_table_gc(struct mts_registry *reg, struct mts_table *t);

/* Free the tables idle for MTS_TABLE_IDLE_MS or more at `now_ns`
 * (CLOCK_MONOTONIC). The tick calls it. */
void mts_tables_sweep(struct mts_registry *reg, uint64_t now_ns);

/* Recompute the free-slot stack from by_slot[] (after adoption). */
void mts_registry_rebuild_free(struct mts_registry *reg);

#endif /* MTS_ADOPT_H */
