/*
 * mts_vouch_types.h - the per-uid and per-process figures of vouch.c,
 * kept in the registry's records (struct mts_table, struct mts_proc):
 * apart from
 * mts_vouch.h, whose functions walk the registry, so that the registry's
 * header can hold them without including what works on the registry.
 */
#ifndef MTS_VOUCH_TYPES_H
#define MTS_VOUCH_TYPES_H

#include <stdbool.h>
#include <stdint.h>

/* Per uid, kept in its slot table's record (struct mts_table). The sums
 * are the latest tick's; the rest carries from tick to tick. */
struct mts_vouch_uid {
	bool trusted;     /* its claims count in full toward everyone */
	uint64_t claimed; /* sum of its processes' claims */
	uint64_t vouched; /* the part of `claimed` that counts for others */
	uint64_t excess;  /* sum of max(0, claim - kernel figure) */
	/* During a tick: excess not yet handed out, as stale (no longer
	 * vouched) and as allowance (vouched). */
	uint64_t stale_left;
	uint64_t allow_left;
	/* The smallest excess seen in the current bucket and in the one
	 * before it, each `untouched_time` long: an excess present for a
	 * whole window (their minimum) is stale. */
	uint64_t min_cur;
	uint64_t min_prev;
	uint64_t bucket_ns; /* start of the current bucket; 0 = none yet */
	bool has_prev;
};

/* Per untrusted process, kept in its record (struct mts_proc): the
 * kernel's figure (resident and swapped anonymous memory, read by the RSS
 * sweep) and when it was read. */
struct mts_vouch_proc {
	uint64_t kernel;
	uint64_t kernel_ns;     /* CLOCK_MONOTONIC of the read; 0 = none yet */
	uint64_t claim_at_read; /* the process's bytes when it was applied */
};

#endif /* MTS_VOUCH_TYPES_H */
