/*
 * mts_vouch_types.h - the per-uid and per-process figures of vouch.c,
 * kept in the registry's records (struct mts_table, struct mts_proc).
 * They are apart from mts_vouch.h, whose functions walk the registry, so
 * that the registry's header can hold them without including what works
 * on the registry.
 */
#ifndef MTS_VOUCH_TYPES_H
#define MTS_VOUCH_TYPES_H

#include <stdbool.h>
#include <stdint.h>

/* Per uid, kept in its slot table's record (struct mts_table). The sums
 * are the latest tick's; the clock fields carry from tick to tick. */
struct mts_vouch_uid {
	bool trusted;        /* its claims count in full toward everyone */
	uint64_t unvouched;  /* sum of max(0, claim - what counts) */
	uint64_t excess;     /* sum of max(0, claim - kernel figure) */
	uint64_t allow_left; /* during a tick: allowance not handed out */
	/* The allowance's clock. An excess starts a run; the allowance is
	 * spent once a run has lasted untouched_time, and comes back only
	 * after a whole untouched_time without excess. */
	uint64_t run_since_ns;  /* 0 = no excess now */
	uint64_t rest_since_ns; /* 0 = an excess now */
	bool spent;
};

/* The fleet's share of the allowances during a tick (registry). */
struct mts_vouch_fleet {
	uint64_t allow_left;
};

/* Per untrusted process, kept in its record (struct mts_proc): the
 * kernel's figure of what it holds (read by the RSS sweep) and when it
 * was read. */
struct mts_vouch_proc {
	/* Proportional anonymous + swapped + shared memory: a page shared
	 * by n processes counts 1/n in each. */
	uint64_t kernel;
	uint64_t kernel_ns;     /* CLOCK_MONOTONIC of the read; 0 = none yet */
	uint64_t claim_at_read; /* the process's bytes when it was applied */
	uint64_t memfd; /* bytes of the memfds it holds, charged to it */
	/* Part of `kernel` and of its resident figure: what its descendants
	 * that never registered hold (rss.c, family_read), as of the last
	 * full sweep, and how many they were. */
	uint64_t family_held;
	uint64_t family_rss;
	uint64_t family_shmem; /* the shared part of family_held */
	uint32_t family_n;
	bool family_cut_said;  /* that its uid's budget left some out */
	uint64_t next_read_ns; /* no early read before (its reads' cost) */
	uint64_t read_cost_ns; /* of its last read */
	/* A read of its smaps_rollup once did not return in time (rss.c):
	 * its figures come from /proc/PID/status from then on. */
	bool read_stalled;
};

#endif /* MTS_VOUCH_TYPES_H */
