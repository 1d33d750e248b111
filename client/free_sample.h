/*
 * free_sample.h - when a front end samples the allocator's free memory,
 * and how the sample reaches the slot (free_sample.c).
 */
#ifndef MEMTALLY_FREE_SAMPLE_H
#define MEMTALLY_FREE_SAMPLE_H

#include <stdbool.h>
#include <stdint.h>

/*
 * The allocator's free memory (layout 2.2): what it keeps of what the
 * program freed, resident but not given back. The glibc front end samples
 * it (mtc_front_sample(), after a flush: account.c calls it) every
 * MTC_FREE_INTERVAL_NS, and sooner when the heap moved by MTC_FREE_MOVED
 * or an eighth (looked at every MTC_FREE_CHECK_NS at most; free_sample.c says
 * why); the jemalloc front end at memtally_flush(), without `interval`:
 * only when the heap moved so, and never the slot's first sample (the
 * refresh thread's: a process that has none is counted at its heap).
 * mtc_free_due() says whether a sample is due and, when it returns
 * true, gives the calling thread the turn and fills `fs`;
 * mtc_free_publish() gives the turn back after storing `held` (the bytes
 * the allocator holds from the system for the heap, in use or free) less
 * the slot's heap bytes into lane 0.
 */
#define MTC_FREE_INTERVAL_NS  (100u * 1000000u)
#define MTC_FREE_CHECK_NS     (10u * 1000000u)
#define MTC_FREE_SPACE_MAX_NS (UINT64_C(2) * 1000000000u)
#define MTC_FREE_MOVED        (INT64_C(4) << 20)
struct mtc_free_sample {
	uint64_t cpu_ns;     /* the thread's CPU time when it began */
	int64_t heap_before; /* the slot's heap bytes then */
};
bool mtc_free_due(struct mtc_free_sample *fs, bool interval);
bool mtc_free_refresh_due(struct mtc_free_sample *fs, uint64_t stale_ns,
                          bool busy);
void mtc_free_publish(const struct mtc_free_sample *fs, uint64_t held);

#endif /* MEMTALLY_FREE_SAMPLE_H */
