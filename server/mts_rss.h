/*
 * mts_rss.h - resident set sizes, read from /proc at their own cadence
 * on the thread pool and applied on the loop (rss.c).
 */
#ifndef MTS_RSS_H
#define MTS_RSS_H

#include <stdint.h>
#include <sys/types.h>

#include "mts_registry.h"

/* rss.c's own state (reg->rss). */
struct mts_rss_state {
	struct mts_rss_sweep *sweep; /* the sweep in flight, or NULL */
	/* The latest tick found untrusted claims ahead of their kernel
	 * figures (mts_rss_want_vouch); the last such sweep started at
	 * vouch_sweep_ns. */
	bool vouch_wanted;
	uint64_t vouch_sweep_ns;
	/* The latest full sweep: when it started, and how long it took. */
	uint64_t full_started_ns;
	uint64_t full_cost_ns;
	bool start_failed; /* the latest sweep's reader did not start */
	/* A read of another uid's process was refused (no ptrace access):
	 * said once, the first time. */
	bool refused_said;
};

/*
 * A process's mapped bytes (lane 0's `mapped`) against the kernel's
 * figure. Its counted pages that are resident are anonymous, so they are
 * never more than its RssAnon. Once its mapped figure is
 * MTS_MAPPED_YOUNG_MS old, a kernel read bounds it by RssAnon until it
 * rises again (tick_mapped in core.c). That age is the longest the client
 * counts a new mapping in full. So a process that makes no call at all,
 * whose client cannot reconcile, is counted for no more than it holds.
 * A read may find the figure off by more than MTS_MAPPED_SLACK either
 * way: above RssAnon, or RssAnon above the whole claim, when pages were
 * given back and written again without a call. That read raises
 * MTSHM_SLOT_RECONCILE. The client's next publish, from any thread, then
 * reconciles its mapped bytes with the kernel's resident pages. The flag
 * comes down at the first read after the slot's flush count moved.
 */
#define MTS_MAPPED_YOUNG_MS 2000u
#define MTS_MAPPED_SLACK    (UINT64_C(8) << 20)
/* Apply a kernel read of `p` made at `read_ns`: `anon` its RssAnon. */
void mts_mapped_read(struct mts_registry *reg, struct mts_proc *p,
                     uint64_t anon, uint64_t read_ns);
/* Is `p`'s mapped figure old enough for its bounding read, not yet made? */
static inline bool mts_mapped_read_due(const struct mts_proc *p, uint64_t now)
{
	return p->mapped_young && now - p->mapped_rose_ns >=
	                              (uint64_t)MTS_MAPPED_YOUNG_MS * 1000000u;
}

/* The tick found claims to check (vouch.c's mts_vouch_end said so): the
 * next mts_rss_sweep_vouch() reads them. */
void mts_rss_want_vouch(struct mts_registry *reg);

/* Start a sweep of every registered process's RSS on a thread of its own
 * (skipped while one is in flight); mts_rss_poll applies the results on
 * the loop thread, to the processes still registered with the same pid and
 * start time. */
void mts_rss_sweep_start(struct mts_registry *reg);
/* The same for only the untrusted processes whose claims ran ahead of
 * their kernel figures (mts_vouch_want_read), when the latest tick asked
 * for it (mts_rss_want_vouch) and the previous such sweep is at least
 * MTS_VOUCH_SWEEP_MS old. Called by the server after its tick: the tick
 * itself starts no reader. */
void mts_rss_sweep_vouch(struct mts_registry *reg, uint64_t now_ns);
/* A full sweep, synchronously on the calling (loop) thread (tests). */
void mts_rss_sweep_sync(struct mts_registry *reg);
/* Each tick: apply the sweep in flight if it is done, or give it up if
 * its reader has been stuck on one process past that read's limit (that
 * process is then read from its status only). */
void mts_rss_poll(struct mts_registry *reg, uint64_t now_ns);
/* Let go of the sweep in flight, done or not (memtallyd stops). */
void mts_rss_free(struct mts_registry *reg);
/* Readers given up for stuck whose read has not returned yet. */
int mts_rss_stuck_readers(void);
/* Set p->rss and keep its group's and the fleet's RSS sums in step. */
void mts_proc_set_rss(struct mts_registry *reg, struct mts_proc *p,
                      uint64_t rss);

#endif /* MTS_RSS_H */
