/*
 * free_sample.c - the allocator's free memory (layout 2.2): when a front
 * end samples it, and how its figure is stored into the slot.
 */
#define _GNU_SOURCE
#include "core.h"

#include <stdint.h>
#include <time.h>

#include "mtcommon.h"

/*
 * A sample is due every MTC_FREE_INTERVAL_NS, and sooner when the heap
 * moved by MTC_FREE_MOVED or an eighth since the last one: a burst of
 * allocation or of frees shorter than the interval, followed by a quiet
 * spell, would otherwise leave the figure at what it was before the
 * burst for as long as the process stays quiet.
 */
/* When this thread last looked at how far the heap moved: at most every
 * MTC_FREE_CHECK_NS, since summing the lanes reads lines other threads
 * write. */
static __thread uint64_t free_checked_ns MTC_TLS;

static int64_t free_enough(int64_t last)
{
	return last / 8 > MTC_FREE_MOVED ? last / 8 : MTC_FREE_MOVED;
}

static uint64_t thread_cpu_ns(void)
{
	struct timespec ts;
	if (clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts) != 0)
		return 0;
	return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

/* The sampling turn (one thread at a time), and what the sample needs
 * from before the allocator is asked. */
static bool free_take_turn(const struct mtc_attachment *a,
                           struct mtc_free_sample *fs)
{
	uint32_t zero = 0;
	if (!__atomic_compare_exchange_n(&mtc_proc.free_turn, &zero, 1, 0,
	                                 __ATOMIC_ACQUIRE, __ATOMIC_RELAXED))
		return false;
	/* Until this sample is stored, nobody else starts one. */
	mtshm_store_relaxed64(&mtc_proc.free_min_ns, UINT64_MAX);
	fs->cpu_ns = thread_cpu_ns();
	fs->heap_before = slot_total(a);
	return true;
}

/* The attachment to sample for, now (*now), or NULL when sampling is off
 * or the last sample's cost says not yet (free_min_ns). */
static const struct mtc_attachment *free_ready(uint64_t *now)
{
	const struct mtc_attachment *a = cur_att();
	/* Inside fork() the slot may be the parent's (publish.h). */
	if (!a || mtc_proc.free_off || mtc_forking)
		return NULL;
	*now = mt_mono_ns();
	if (*now < mtshm_load_relaxed64(&mtc_proc.free_min_ns))
		return NULL;
	return a;
}

bool mtc_free_due(struct mtc_free_sample *fs, bool interval)
{
	uint64_t now;
	const struct mtc_attachment *a = free_ready(&now);
	if (!a)
		return false;
	bool first = !mtshm_load_relaxed64(&mtc_proc.free_last_ns);
	if (first && !interval)
		return false;
	if (!first &&
	    (!interval || now < mtshm_load_relaxed64(&mtc_proc.free_next_ns))) {
		if (now - free_checked_ns < MTC_FREE_CHECK_NS)
			return false;
		free_checked_ns = now;
		int64_t last = mtshm_load_relaxeds64(&mtc_proc.free_heap);
		int64_t heap = slot_total(a);
		int64_t moved = heap > last ? heap - last : last - heap;
		if (moved < free_enough(last))
			return false;
	}
	return free_take_turn(a, fs);
}

/*
 * The refresh thread's test: a sample is owed when the heap moved since
 * the last one (a burst of frees that ended between two samples), when
 * this slot has none yet, or when the last is `stale_ns` old (0: never
 * for its age alone); never sooner than the last sample's cost allows
 * (free_min_ns). A quiet process whose heap has not moved costs a clock
 * read and a sum of its lanes. For a `busy` one, a move counts only as a
 * flush's does (an eighth, MTC_FREE_MOVED at least): the server counts
 * what it frees as the allocator's free memory until the next sample
 * (mtshm_free_now), so a front end that samples only here (jemalloc)
 * must not leave a busy process without one after it shrank.
 */
bool mtc_free_refresh_due(struct mtc_free_sample *fs, uint64_t stale_ns,
                          bool busy)
{
	uint64_t now;
	const struct mtc_attachment *a = free_ready(&now);
	if (!a)
		return false;
	uint64_t last = mtshm_load_relaxed64(&mtc_proc.free_last_ns);
	if (last && (!stale_ns || now - last < stale_ns)) {
		int64_t was = mtshm_load_relaxeds64(&mtc_proc.free_heap);
		int64_t heap = slot_total(a);
		int64_t moved = heap > was ? heap - was : was - heap;
		if (moved == 0 || (busy && moved < free_enough(was)))
			return false;
	}
	return free_take_turn(a, fs);
}

void mtc_free_publish(const struct mtc_free_sample *fs, uint64_t held)
{
	const struct mtc_attachment *a = cur_att();
	bool again = false;
	if (a) {
		/* The heap before and after the allocator was asked: a block
		 * another thread freed meanwhile may be out of the heap and
		 * still in `held`, or the other way round; the larger heap
		 * errs low, never counting memory given back. */
		int64_t after = slot_total(a);
		int64_t heap =
		    after > fs->heap_before ? after : fs->heap_before;
		int64_t hs = heap < 0 ? 0 : heap;
		int64_t f =
		    held > (uint64_t)hs ? (int64_t)(held - (uint64_t)hs) : 0;
		if (f > MTSHM_ABSURD_BYTES)
			f = MTSHM_ABSURD_BYTES;
		/* One writer at a time: free_turn. */
		mtshm_free_store(a->slot, f, after);
		mtshm_store_relaxeds64(&mtc_proc.free_heap, after);
		int64_t moved = after > fs->heap_before
		                    ? after - fs->heap_before
		                    : fs->heap_before - after;
		again = moved >= free_enough(fs->heap_before);
	}
	/*
	 * The next sample waits 200 times the CPU time this one took, so
	 * sampling never takes more than 0.5% of the thread's time.
	 * Above a millisecond it waits 1000 times: the allocator holds its
	 * arena's lock while it walks, and a walk long enough to be felt
	 * comes rarely (docs/ARCHITECTURE.md, "The allocator's free memory").
	 * It never waits more than MTC_FREE_SPACE_MAX_NS, so no figure stays
	 * stale for long.
	 * CPU time, not wall time: a thread descheduled meanwhile cost the
	 * process nothing.
	 * A heap that moved much while the allocator was asked is sampled
	 * again at the next flush, whatever the cost.
	 */
	uint64_t now = mt_mono_ns();
	if (a)
		mtshm_store_relaxed64(&mtc_proc.free_last_ns, now);
	uint64_t cpu = thread_cpu_ns();
	uint64_t took = cpu > fs->cpu_ns ? cpu - fs->cpu_ns : 0;
	uint64_t space = took * (took > 1000000u ? 1000u : 200u);
	if (space > MTC_FREE_SPACE_MAX_NS)
		space = MTC_FREE_SPACE_MAX_NS;
	if (again)
		space = 0;
	mtshm_store_relaxed64(&mtc_proc.free_next_ns,
	                      now + (space > MTC_FREE_INTERVAL_NS || again
	                                 ? space
	                                 : MTC_FREE_INTERVAL_NS));
	mtshm_store_relaxed64(&mtc_proc.free_min_ns, now + space);
	__atomic_store_n(&mtc_proc.free_turn, 0, __ATOMIC_RELEASE);
}
