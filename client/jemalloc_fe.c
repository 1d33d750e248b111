/*
 * jemalloc_fe.c - the jemalloc front end: jemalloc counts, we publish.
 *
 * jemalloc 5.3 keeps per-thread cumulative counters of the usable bytes a
 * thread allocated and deallocated (thread.allocatedp/deallocatedp) on its
 * fast path anyway, and runs a per-thread "activity callback"
 * (experimental.thread.activity_callback) with both counters after every
 * 64 KiB of allocation and after every 64 KiB of deallocation by that
 * thread, and at once after any single call of 64 KiB or more. The
 * callback publishes the thread's net (allocated - deallocated) into its
 * lane: nothing at all is added to malloc or free. Accuracy: between two
 * callbacks a thread has allocated < 64 KiB and freed < 64 KiB, so what it
 * has not published is within (-64 KiB, +64 KiB), the default threshold's
 * bound; a large block, allocated or freed, is published inside that very
 * call.
 *
 * Where it runs: inside jemalloc, after the allocation or free is complete
 * and with no allocator lock held (jemalloc's thread_event hook, run only
 * at re-entrancy level 0). It may re-enter itself if anything it runs
 * allocates past the next event (the over-limit callback, or pthread
 * bookkeeping), so `th.busy` guards it; attach and publish never allocate.
 *
 * The setting is per thread: each thread must install it (mtj_thread_start)
 * when it starts; the preload does that for the main thread at load and
 * for every thread made by pthread_create; a linked worker calls
 * memtally_init() in each thread.
 *
 * Fallback (the preload only): if the mallctl is missing or fails, the
 * preload counts from the same counters on every allocator call. Each call
 * compares the thread's net with what it last published and publishes
 * once |drift| reaches the threshold (mtj_check). The calls arrive through
 * jemalloc's experimental.hooks: alloc hooks run after the allocation,
 * free hooks before the free, so a free is seen at the thread's next
 * call. Hooks send every call through jemalloc's slow path and hook
 * dispatch, many times the cost of a 16 B pair
 * (bench/results/alloc_overhead.md): a
 * fallback that keeps the figures right.
 * MEMTALLY_TEST_NO_ACTIVITY_CALLBACK=1 makes the mallctl fail on purpose
 * so that tests can exercise the fallback.
 */
#define _GNU_SOURCE
#include "client_internal.h"

#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

/* jemalloc's experimental.thread.activity_callback thunk. */
struct mtj_thunk {
	void (*cb)(void *uctx, uint64_t allocated, uint64_t deallocated);
	void *uctx;
};

/* jemalloc's experimental.hooks.install argument (hook.h, 5.3). */
struct mtj_hooks {
	void (*alloc)(void *extra, int type, void *result, uintptr_t raw,
	              uintptr_t args[3]);
	void (*dalloc)(void *extra, int type, void *addr, uintptr_t args[3]);
	void (*expand)(void *extra, int type, void *addr, size_t old_usize,
	               size_t new_usize, uintptr_t raw, uintptr_t args[4]);
	void *extra;
};

/*
 * Per thread: pointers to jemalloc's cumulative counters, the net
 * published so far, and (counting mode) the window of nets that need no
 * flush: a flush is due when (net - low) > span, i.e. when |net - flushed|
 * >= threshold. A new thread starts with its pointers on a sentinel whose
 * net is 1 and an empty window, so in counting mode the one window check
 * sends it to the slow path; in callback mode nothing reads them until
 * the thread installs the callback.
 */
struct mtj_tls {
	const uint64_t *allocp;
	const uint64_t *deallocp;
	uint64_t low;
	uint64_t span;
	uint64_t flushed;
	uint8_t installed; /* callback set for this thread */
	struct mtc_thread th;
};

static const uint64_t mtj_zero;
static const uint64_t mtj_one = 1;
static __thread struct mtj_tls mtj_t MTC_TLS = {.allocp = &mtj_one,
                                                .deallocp = &mtj_zero};

static struct {
	mtj_mallctl_fn mallctl;
	const struct mtj_direct *direct;
	int mode;      /* enum mtj_mode */
	int test_fail; /* MEMTALLY_TEST_NO_ACTIVITY_CALLBACK=1 */
	pthread_key_t key;
	pthread_once_t key_once;
	pthread_once_t mode_once;
	int allow_counting;
} mtj = {.key_once = PTHREAD_ONCE_INIT, .mode_once = PTHREAD_ONCE_INIT};

static inline int new_thread(const struct mtj_tls *t)
{
	return t->allocp == &mtj_one;
}

/* A thread that counts nothing (no jemalloc, or disabled). */
static inline int mute_thread(const struct mtj_tls *t)
{
	return t->allocp == &mtj_zero;
}

static uint64_t net_now(const struct mtj_tls *t)
{
	return *t->allocp - *t->deallocp;
}

/* Publish the thread's drift and re-centre its counting window. */
static void publish_now(struct mtj_tls *t)
{
	uint64_t net = net_now(t);
	int64_t d = (int64_t)(net - t->flushed);
	if (d)
		mtc_publish(&t->th, d);
	t->flushed = net;
	uint64_t half = mtc_threshold() - 1;
	t->low = net - half;
	t->span = 2 * half;
}

/* ---- callback mode ---------------------------------------------------- */

/* The rest of on_activity(): a publish of the threshold or more, or one
 * the quiet path cannot make (no lane yet, a re-attach, not attached). */
__attribute__((noinline)) static void activity_slow(struct mtj_tls *t,
                                                    uint64_t net)
{
	int64_t d = (int64_t)(net - t->flushed);
	if (t->th.busy || !d)
		return;
	/* The program's errno survives it (a registration's socket calls):
	 * free() keeps errno, and a program may free in an error path
	 * before it reads errno. */
	int e = errno;
	t->th.busy = 1;
	t->flushed = net;
	mtc_publish(&t->th, d);
	t->th.busy = 0;
	mtc_after_flush(&t->th);
	errno = e;
}

/* jemalloc's activity callback: publish the thread's net since the last
 * one. `allocated`/`deallocated` are the very counters allocp/deallocp
 * point at. Mostly a quiet publish (the lane's add, no call: a thread
 * churning blocks of half the event interval meets an event on every
 * pair, one of 64 KiB or more two); the server's heartbeat is looked at
 * every MTC_VERIFY_EVERY of them. Quiet publishes are armed only by a
 * full one, after which nothing here allocates until `busy` is down. */
static void on_activity(void *uctx, uint64_t allocated, uint64_t deallocated)
{
	struct mtj_tls *t = uctx;
	uint64_t net = allocated - deallocated;
	if (__builtin_expect(
	        mtc_publish_quiet(&t->th, (int64_t)(net - t->flushed)), 1)) {
		t->flushed = net;
		return;
	}
	activity_slow(t, net);
}

/* ---- thread exit ------------------------------------------------------ */

/* TSD destructor: flush, and come back for up to three more rounds so that
 * frees made by other destructors are still seen; then release the lane. */
static void on_thread_exit(void *arg)
{
	struct mtj_tls *t = &mtj_t;
	uintptr_t round = (uintptr_t)arg;
	if (new_thread(t) || mute_thread(t))
		return;
	t->th.busy = 1;
	publish_now(t);
	mtc_over_handoff(&t->th); /* no callback in a dying thread */
	if (round < 3)
		pthread_setspecific(mtj.key, (void *)(round + 1));
	else
		mtc_thread_exit(&t->th);
	t->th.busy = 0;
}

static void make_key(void)
{
	pthread_key_create(&mtj.key, on_thread_exit);
}

/* The calling thread's cumulative counters: directly where the front end
 * knows them, else through mallctl, whose first call in a process builds
 * jemalloc's whole ctl state (docs/ARCHITECTURE.md, "The jemalloc front
 * end"). */
static int counters(const uint64_t **a, const uint64_t **d)
{
	if (mtj.direct)
		return mtj.direct->counters(a, d);
	size_t sz = sizeof(*a);
	if (mtj.mallctl("thread.allocatedp", (void *)a, &sz, NULL, 0) ||
	    mtj.mallctl("thread.deallocatedp", (void *)d, &sz, NULL, 0))
		return -ENOENT;
	return 0;
}

/* Point the thread at jemalloc's counters and arrange its exit flush.
 * False (and the thread muted) when jemalloc or memtally is not there. */
static int setup_thread(struct mtj_tls *t)
{
	const uint64_t *a = NULL, *d = NULL;
	int ok = mtj.mallctl && mtc_init() && counters(&a, &d) == 0 && a && d;
	if (!ok) {
		/* Count nothing for this thread, never come back. */
		t->allocp = t->deallocp = &mtj_zero;
		t->low = 0;
		t->span = UINT64_MAX;
		return 0;
	}
	t->allocp = a;
	t->deallocp = d;
	pthread_once(&mtj.key_once, make_key);
	pthread_setspecific(mtj.key, (void *)1);
	return 1;
}

/* Install the activity callback for the calling thread: 0, or -errno of
 * the mallctl. */
static int install_callback(struct mtj_tls *t)
{
	if (mtj.test_fail)
		return -ENOENT;
	struct mtj_thunk thunk = {on_activity, t};
	if (mtj.direct)
		return mtj.direct->set_callback(&thunk, sizeof(thunk));
	int err = mtj.mallctl("experimental.thread.activity_callback", NULL,
	                      NULL, &thunk, sizeof(thunk));
	return -err;
}

/* ---- counting mode (fallback) ----------------------------------------- */

/* Set up the calling thread, or publish its net. Never recurses: the
 * allocations it makes (pthread_setspecific, registration) see `busy`. */
__attribute__((noinline)) static void count_slow(void)
{
	struct mtj_tls *t = &mtj_t;
	if (t->th.busy)
		return;
	int e = errno; /* as activity_slow() */
	t->th.busy = 1;
	if (new_thread(t) && !setup_thread(t)) {
		t->th.busy = 0;
		errno = e;
		return;
	}
	publish_now(t);
	t->th.busy = 0;
	mtc_after_flush(&t->th);
	errno = e;
}

/* True when no flush is due: two loads, a subtract, a compare. */
static inline void mtj_check(void)
{
	const struct mtj_tls *t = &mtj_t;
	if (__builtin_expect((*t->allocp - *t->deallocp) - t->low > t->span, 0))
		count_slow();
}

static void hook_alloc(void *extra, int type, void *result, uintptr_t raw,
                       uintptr_t args[3])
{
	(void)extra, (void)type, (void)result, (void)raw, (void)args;
	mtj_check();
}

static void hook_dalloc(void *extra, int type, void *addr, uintptr_t args[3])
{
	(void)extra, (void)type, (void)addr, (void)args;
	mtj_check();
}

static void hook_expand(void *extra, int type, void *addr, size_t old_usize,
                        size_t new_usize, uintptr_t raw, uintptr_t args[4])
{
	(void)extra, (void)type, (void)addr, (void)old_usize;
	(void)new_usize, (void)raw, (void)args;
	mtj_check();
}

static int install_hooks(void)
{
	static const struct mtj_hooks hooks = {hook_alloc, hook_dalloc,
	                                       hook_expand, NULL};
	void *handle = NULL;
	size_t sz = sizeof(handle);
	return -mtj.mallctl("experimental.hooks.install", &handle, &sz,
	                    (void *)&hooks, sizeof(hooks));
}

/* ---- choosing the mode ------------------------------------------------ */

static void choose_mode(void)
{
	const char *f = getenv("MEMTALLY_TEST_NO_ACTIVITY_CALLBACK");
	mtj.test_fail = f && f[0] == '1';
	struct mtj_tls *t = &mtj_t;
	if (!mtj.mallctl || !mtc_init()) {
		mtj.mode = MTJ_OFF;
		return;
	}
	if (!setup_thread(t)) {
		mtj.mode = MTJ_OFF;
		return;
	}
	int err = install_callback(t);
	if (!err) {
		/* What this thread allocated before is published now, as the
		 * interposer did at a thread's first call. */
		t->installed = 1;
		mtj.mode = MTJ_CALLBACK;
		mtc_debug("counting through jemalloc's activity callback");
		t->th.busy = 1;
		publish_now(t);
		t->th.busy = 0;
		return;
	}
	if (mtj.allow_counting && install_hooks() == 0) {
		mtj.mode = MTJ_COUNTING;
		mtc_debug("activity callback unavailable (%s); counting on "
		          "every call through jemalloc's hooks",
		          strerror(-err));
		t->th.busy = 1;
		publish_now(t);
		t->th.busy = 0;
		return;
	}
	mtc_debug("activity callback unavailable (%s); not counting",
	          strerror(-err));
	mtj.mode = MTJ_OFF;
}

void mtj_use_direct(const struct mtj_direct *d)
{
	if (!mtj.mallctl)
		mtj.direct = d;
}

int mtj_init(mtj_mallctl_fn mallctl, int allow_counting)
{
	if (!mtj.mallctl) {
		mtj.mallctl = mallctl;
		mtj.allow_counting = allow_counting;
	}
	pthread_once(&mtj.mode_once, choose_mode);
	/* The thread that chose the mode is set up; any other one here. */
	return mtj_thread_start();
}

int mtj_thread_start(void)
{
	struct mtj_tls *t = &mtj_t;
	switch (mtj.mode) {
	case MTJ_CALLBACK:
		if (t->installed)
			return 0;
		if (t->th.busy || mute_thread(t))
			return MEMTALLY_EDISABLED;
		t->th.busy = 1;
		if (new_thread(t) && !setup_thread(t)) {
			t->th.busy = 0;
			return MEMTALLY_EDISABLED;
		}
		int err = install_callback(t);
		t->installed = !err;
		if (!err)
			publish_now(t);
		t->th.busy = 0;
		if (!err)
			mtc_after_flush(&t->th);
		return err;
	case MTJ_COUNTING:
		if (new_thread(t))
			count_slow();
		return 0;
	default:
		return MEMTALLY_EDISABLED;
	}
}

int mtj_mode(void)
{
	return mtj.mode;
}

/* ---- what the core asks of a front end -------------------------------- */

static void je_sample(void);

/* A thread that never called memtally_init() (a linked worker) or that
 * started before the preload's hook was in place is set up here, once the
 * process has chosen the callback. */
static int je_flush(void)
{
	struct mtj_tls *t = &mtj_t;
	if (mtj.mode == MTJ_CALLBACK && !t->installed)
		mtj_thread_start();
	if (new_thread(t) || mute_thread(t) || t->th.busy)
		return 0;
	t->th.busy = 1;
	publish_now(t);
	t->th.busy = 0;
	mtc_after_flush(&t->th);
	je_sample();
	return 0;
}

static int64_t je_drift(void)
{
	struct mtj_tls *t = &mtj_t;
	if (new_thread(t) || mute_thread(t))
		return 0;
	return (int64_t)(net_now(t) - t->flushed);
}

static void je_force_slow(void)
{
	/* Counting mode: the next call flushes (and registers the child of
	 * a fork). Callback mode: the next event or memtally_flush() does,
	 * and not quietly: the lane is the parent's. */
	mtj_t.span = 0;
	mtc_quiet_off(&mtj_t.th);
}

/*
 * The refresh thread's round (refresh.c) under jemalloc.
 *
 * What jemalloc holds for the heap and could give back: stats.active is
 * the pages of live extents (what the program has, and the free regions
 * of slabs still in use); dirty and muzzy pages are freed extents jemalloc
 * keeps resident until its decay purges them. Both after an `epoch`
 * (jemalloc merges its arenas' statistics under each arena's statistics
 * locks, held briefly one at a time). Retained extents (unmapped or
 * purged address space) are not resident and not counted.
 *
 * jemalloc's decay runs only inside the process's calls to it: a process
 * that frees and goes quiet would keep its dirty pages for as long as it
 * stays quiet. While the last sample saw some, each round asks jemalloc
 * to run its decay (`arena.<all>.decay`: what is due by jemalloc's own
 * clock, as its background thread would, never all at once), then
 * samples again: the pages leave over jemalloc's decay time (10 s by
 * default), and the figure follows them down round by round.
 *
 * A busy process (it published since the last round) runs jemalloc's
 * decay in its own calls and is left alone, but for the samples the
 * server needs from here, the only place jemalloc is sampled: the
 * slot's first (the thread's first round, as soon as it starts: a
 * process that frees before it ever went quiet is then held at what it
 * held, not counted at its shrunken heap), one after the heap moved by
 * an eighth, and one every 10 s (what it freed is counted as free until
 * a sample says what jemalloc gave back).
 */
/* Statistics unavailable: do not ask again. */
static int je_broken;
/* Dirty + muzzy pages at the last sample. */
static size_t je_kept;

/* Sample what jemalloc holds for the heap, its decay run first when
 * `decay`, and give the turn back (held 0: nothing free). */
static void je_sample_now(mtj_mallctl_fn ctl, struct mtc_free_sample *fs,
                          bool decay)
{
	if (decay)
		ctl("arena.4096.decay", NULL, NULL, NULL, 0);
	uint64_t epoch = 1;
	size_t active = 0, pdirty = 0, pmuzzy = 0, page = 0;
	size_t esz = sizeof(epoch), sz = sizeof(size_t);
	int err = ctl("epoch", &epoch, &esz, &epoch, sizeof(epoch));
	err = err ? err : ctl("stats.active", &active, &sz, NULL, 0);
	err = err ? err : ctl("arenas.page", &page, &sz, NULL, 0);
	/* 4096: MALLCTL_ARENAS_ALL, the arenas merged. */
	const char *dirty = "stats.arenas.4096.pdirty";
	const char *muzzy = "stats.arenas.4096.pmuzzy";
	err = err ? err : ctl(dirty, &pdirty, &sz, NULL, 0);
	err = err ? err : ctl(muzzy, &pmuzzy, &sz, NULL, 0);
	if (err) {
		je_broken = 1;
		mtc_debug("jemalloc's statistics unavailable (%d): its free "
		          "pages are not counted",
		          err);
		active = pdirty = pmuzzy = 0;
	}
	size_t kept = pdirty + pmuzzy;
	__atomic_store_n(&je_kept, kept, __ATOMIC_RELAXED);
	mtc_free_publish(fs, active + kept * page);
}

static void je_refresh(bool busy)
{
	static int tcache_off; /* this thread's cache given back */
	mtj_mallctl_fn ctl = mtj.mallctl;
	if (!ctl || je_broken || mtj.mode == MTJ_OFF)
		return;
	if (!tcache_off) {
		/* This thread never allocates: the thread cache jemalloc made
		 * for it at its first mallctl (hundreds of KiB of bins) goes
		 * back, not to be counted as the program's free memory. Only
		 * the refresh thread comes here. */
		bool off = false;
		ctl("thread.tcache.enabled", NULL, NULL, &off, sizeof(off));
		tcache_off = 1;
	}
	/* Quiet: with pages kept, every round (decay moves them); otherwise
	 * when the heap moved, or every 10 s. */
	struct mtc_free_sample fs;
	bool kept = __atomic_load_n(&je_kept, __ATOMIC_RELAXED) != 0;
	uint64_t stale = kept && !busy ? 1 : UINT64_C(10) * 1000000000u;
	if (!mtc_free_refresh_due(&fs, stale, busy))
		return;
	je_sample_now(ctl, &fs, kept && !busy);
}

/*
 * memtally_flush() (je_flush): the program asks for its figure now, and a
 * process that just freed much is counted at what it freed as jemalloc's
 * free memory until a sample says what jemalloc gave back. So a flush
 * samples when the heap moved by an eighth since the last sample (looked
 * at every 10 ms at most, as a glibc flush does), never for the time
 * alone: the refresh thread takes those, and the slot's first. A process
 * that has no refresh thread (single-threaded and small) has no sample
 * and is counted at its heap. The same turn and spacing as every sample
 * (free_sample.c).
 */
static void je_sample(void)
{
	mtj_mallctl_fn ctl = mtj.mallctl;
	if (!ctl || je_broken || mtj.mode == MTJ_OFF)
		return;
	struct mtc_free_sample fs;
	if (mtc_free_due(&fs, false))
		je_sample_now(ctl, &fs, false);
}

const struct mtc_front mtj_front = {
    .flush = je_flush,
    .drift = je_drift,
    .force_slow = je_force_slow,
    .refresh = je_refresh,
};
