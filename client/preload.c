/*
 * preload.c - libmemtally_preload.so: jemalloc itself, counted for free.
 *
 * The library *is* the process's allocator: Debian's libjemalloc_pic.a is
 * linked in whole and its public API is exported under its plain names
 * (the malloc family, mallocx & co, mallctl*, malloc_stats_print, C++
 * operator new/delete; preload.map lists them). Preloaded, these are the
 * first definitions in the global search order, so every caller in the
 * process reaches them without any forwarding: a 16 B malloc+free pair
 * executes exactly the instructions of jemalloc alone (bench/RESULTS.md).
 * A program that is itself linked to libjemalloc.so.2 (redis-server) still
 * has one heap: all its calls, mallctl and malloc_usable_size included,
 * bind to these copies; libjemalloc.so.2 stays mapped and runs only its
 * own initialisation (an idle arena of its own, a few pages).
 *
 * Counting is the jemalloc front end's (jemalloc_fe.c): each thread sets
 * jemalloc's activity callback, which publishes its net every 64 KiB of
 * activity; the main thread at load (constructor below), every other
 * thread as it starts (the pthread_create wrapper below). Without the
 * callback the front end counts on every call through jemalloc's hooks.
 *
 * Memory mappings: jemalloc maps its extents with mmap() and returns them
 * with munmap() (or keeps them and purges with madvise()); those calls are
 * made from this library's own code, and libjemalloc.so.2's idle instance
 * maps its own few pages from that library. An interposer that counts a
 * program's own mappings must not count either: their bytes are already
 * in (or, for the idle instance, outside) jemalloc's counters.
 */
#define _GNU_SOURCE
#include "client_internal.h"

#include <dlfcn.h>
#include <errno.h>
#include <malloc.h>
#include <mqueue.h>
#include <pthread.h>
#include <signal.h>
#include <threads.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define PL_EXPORT __attribute__((visibility("default")))

/* jemalloc's, linked in (declared here: <jemalloc/jemalloc.h> would
 * redeclare the malloc family). */
int mallctl(const char *name, void *oldp, size_t *oldlenp, void *newp,
            size_t newlen);

/* Where jemalloc keeps the calling thread's counters and activity
 * callback: offsets in its thread-local state, measured at build time from
 * the archive linked here (jemalloc_tsd_probe.c). Reaching them directly
 * spares a process the ~150,000 instructions of jemalloc's first mallctl,
 * which the preload would otherwise pay at every start. */
#include "jemalloc_tsd.h"

#if MTJ_TSD_KNOWN
extern __thread unsigned char je_tsd_tls[]
    __attribute__((tls_model("initial-exec")));

static int pl_counters(const uint64_t **a, const uint64_t **d)
{
	/* The thread's jemalloc state set up, as mallctl's lookup would. */
	free(malloc(1));
	*a = (const uint64_t *)(const void *)(je_tsd_tls + MTJ_TSD_ALLOCATED);
	*d = (const uint64_t *)(const void *)(je_tsd_tls + MTJ_TSD_DEALLOCATED);
	return 0;
}

static int pl_set_callback(const void *thunk, size_t len)
{
	memcpy(je_tsd_tls + MTJ_TSD_CALLBACK, thunk, len);
	return 0;
}

static const struct mtj_direct pl_direct = {pl_counters, pl_set_callback};
#define PL_DIRECT (&pl_direct)
#else
#define PL_DIRECT NULL
#endif

static int pl_init(void)
{
	mtj_use_direct(PL_DIRECT);
	return mtj_init(mallctl, 1);
}

__attribute__((constructor(101))) static void pl_constructor(void)
{
	mtc_at_load = true;
	pl_init();
	mtc_at_load = false;
}

/* The library's one front end, as the core asks it (attach.c). */
const struct mtc_front *const mtc_fronts[] = {&mtj_front, NULL};

/* ---- threads ------------------------------------------------------------
 * jemalloc's activity callback is per thread: a new thread sets it before
 * it runs the program's start routine. */

struct pl_start {
	void *(*fn)(void *);
	void *arg;
};

static void *pl_trampoline(void *p)
{
	struct pl_start s = *(struct pl_start *)p;
	free(p);
	mtj_thread_start();
	return s.fn(s.arg);
}

typedef int (*pl_create_fn)(pthread_t *, const pthread_attr_t *,
                            void *(*)(void *), void *);

PL_EXPORT int pthread_create(pthread_t *tid, const pthread_attr_t *attr,
                             void *(*fn)(void *), void *arg)
{
	static pl_create_fn real;
	pl_create_fn f = __atomic_load_n(&real, __ATOMIC_RELAXED);
	if (!f) {
		*(void **)&f = dlsym(RTLD_NEXT, "pthread_create");
		if (!f)
			return EAGAIN;
		__atomic_store_n(&real, f, __ATOMIC_RELAXED);
	}
	if (mtj_mode() != MTJ_CALLBACK)
		return f(tid, attr, fn, arg);
	struct pl_start *s = malloc(sizeof(*s));
	if (!s)
		return f(tid, attr, fn, arg);
	s->fn = fn;
	s->arg = arg;
	int r = f(tid, attr, pl_trampoline, s);
	if (r)
		free(s);
	return r;
}

/* C11 threads: glibc starts them without its exported pthread_create,
 * so they are set up here the same way. */
struct pl_thrd {
	int (*fn)(void *);
	void *arg;
};

static int pl_thrd_trampoline(void *p)
{
	struct pl_thrd s = *(struct pl_thrd *)p;
	free(p);
	mtj_thread_start();
	return s.fn(s.arg);
}

typedef int (*pl_thrd_create_fn)(thrd_t *, int (*)(void *), void *);

PL_EXPORT int thrd_create(thrd_t *tid, int (*fn)(void *), void *arg)
{
	static pl_thrd_create_fn real;
	pl_thrd_create_fn f = __atomic_load_n(&real, __ATOMIC_RELAXED);
	if (!f) {
		*(void **)&f = dlsym(RTLD_NEXT, "thrd_create");
		if (!f)
			return thrd_error;
		__atomic_store_n(&real, f, __ATOMIC_RELAXED);
	}
	if (mtj_mode() != MTJ_CALLBACK)
		return f(tid, fn, arg);
	struct pl_thrd *s = malloc(sizeof(*s));
	if (!s)
		return f(tid, fn, arg);
	s->fn = fn;
	s->arg = arg;
	int r = f(tid, pl_thrd_trampoline, s);
	if (r != thrd_success)
		free(s);
	return r;
}

/* ---- threads glibc starts for a notification ------------------------------
 * timer_create and mq_notify with SIGEV_THREAD run each notification in a
 * thread glibc makes itself, without its exported pthread_create. The
 * notification's function and value are replaced by a trampoline and a
 * record of both, which sets the thread up first. A notification thread
 * already started when timer_delete returns may not have read its record
 * yet, so records are never freed: a deleted timer's (or a fired or
 * cancelled mq_notify's) is reused by a later registration once
 * PL_NOTE_GRACE_NS have passed. They are as many as the registrations
 * alive at once, and those retired within the grace. */
#define PL_NOTE_GRACE_NS (UINT64_C(10) * 1000000000u)

enum { PL_NOTE_TIMER = 1, PL_NOTE_MQ = 2 };

struct pl_note {
	void (*fn)(union sigval);
	union sigval val;
	int kind;            /* PL_NOTE_*, 0: free */
	timer_t timer;       /* PL_NOTE_TIMER */
	mqd_t mq;            /* PL_NOTE_MQ */
	uint64_t retired_ns; /* free since then (0: never used) */
	struct pl_note *next;
};

static pthread_mutex_t pl_notes_lock = PTHREAD_MUTEX_INITIALIZER;
static struct pl_note *pl_notes;
static uint32_t pl_notes_live; /* read without the lock: none to find */

static uint64_t pl_now_ns(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

/* A record for a registration of `kind` about to be made, or NULL. */
static struct pl_note *note_get(int kind, mqd_t mq, void (*fn)(union sigval),
                                union sigval val)
{
	uint64_t now = pl_now_ns();
	pthread_mutex_lock(&pl_notes_lock);
	struct pl_note *n = pl_notes;
	while (n && (n->kind ||
	             (n->retired_ns && now - n->retired_ns < PL_NOTE_GRACE_NS)))
		n = n->next;
	if (!n && (n = calloc(1, sizeof(*n)))) {
		n->next = pl_notes;
		pl_notes = n;
	}
	if (n) {
		__atomic_store_n(&n->fn, fn, __ATOMIC_RELAXED);
		__atomic_store_n(&n->val.sival_ptr, val.sival_ptr,
		                 __ATOMIC_RELAXED);
		n->kind = kind;
		n->mq = mq;
		n->timer = 0;
		pl_notes_live++;
	}
	pthread_mutex_unlock(&pl_notes_lock);
	return n;
}

static void note_retire_locked(struct pl_note *n)
{
	if (!n->kind)
		return;
	n->kind = 0;
	n->retired_ns = pl_now_ns();
	pl_notes_live--;
}

static void note_retire(struct pl_note *n)
{
	pthread_mutex_lock(&pl_notes_lock);
	note_retire_locked(n);
	pthread_mutex_unlock(&pl_notes_lock);
}

/* A timer's id, known once timer_create returns. */
static void note_timer(struct pl_note *n, timer_t timer)
{
	pthread_mutex_lock(&pl_notes_lock);
	n->timer = timer;
	pthread_mutex_unlock(&pl_notes_lock);
}

/* Retire the records of a timer deleted, or of a queue whose registration
 * was removed or that was closed (which removes it). */
static void note_retire_of(int kind, timer_t timer, mqd_t mq)
{
	if (!__atomic_load_n(&pl_notes_live, __ATOMIC_RELAXED))
		return;
	pthread_mutex_lock(&pl_notes_lock);
	for (struct pl_note *n = pl_notes; n; n = n->next)
		if (n->kind == kind &&
		    (kind == PL_NOTE_TIMER ? n->timer == timer : n->mq == mq))
			note_retire_locked(n);
	pthread_mutex_unlock(&pl_notes_lock);
}

static void pl_note_trampoline(union sigval v)
{
	struct pl_note *n = v.sival_ptr;
	void (*fn)(union sigval) = __atomic_load_n(&n->fn, __ATOMIC_RELAXED);
	union sigval val;
	val.sival_ptr = __atomic_load_n(&n->val.sival_ptr, __ATOMIC_RELAXED);
	/* A queue's registration ends with its notification. */
	pthread_mutex_lock(&pl_notes_lock);
	if (n->kind == PL_NOTE_MQ)
		note_retire_locked(n);
	pthread_mutex_unlock(&pl_notes_lock);
	mtj_thread_start();
	fn(val);
}

/* The event to hand glibc: `ev` with the trampoline, or `evp` as it is
 * (not a thread notification, not counting by callback, no record). */
static const struct sigevent *note_event(int kind, mqd_t mq,
                                         const struct sigevent *evp,
                                         struct sigevent *ev,
                                         struct pl_note **n)
{
	*n = NULL;
	if (!evp || evp->sigev_notify != SIGEV_THREAD ||
	    !evp->sigev_notify_function || mtj_mode() != MTJ_CALLBACK)
		return evp;
	*n = note_get(kind, mq, evp->sigev_notify_function, evp->sigev_value);
	if (!*n)
		return evp;
	*ev = *evp;
	ev->sigev_notify_function = pl_note_trampoline;
	ev->sigev_value.sival_ptr = *n;
	return ev;
}

/* The next definition of `name` (glibc's), looked up once. */
#define PL_REAL(name, type)                                                    \
	static type real_##name;                                               \
	type f = __atomic_load_n(&real_##name, __ATOMIC_RELAXED);              \
	if (!f) {                                                              \
		*(void **)&f = dlsym(RTLD_NEXT, #name);                        \
		if (!f) {                                                      \
			errno = ENOSYS;                                        \
			return -1;                                             \
		}                                                              \
		__atomic_store_n(&real_##name, f, __ATOMIC_RELAXED);           \
	}

typedef int (*pl_timer_create_fn)(clockid_t, struct sigevent *, timer_t *);
typedef int (*pl_timer_delete_fn)(timer_t);
typedef int (*pl_mq_notify_fn)(mqd_t, const struct sigevent *);
typedef int (*pl_mq_close_fn)(mqd_t);

PL_EXPORT int timer_create(clockid_t clk, struct sigevent *evp, timer_t *id)
{
	PL_REAL(timer_create, pl_timer_create_fn)
	struct sigevent ev;
	struct pl_note *n;
	const struct sigevent *use = note_event(PL_NOTE_TIMER, 0, evp, &ev, &n);
	int r = f(clk, (struct sigevent *)use, id);
	int e = errno;
	if (n) {
		if (r == 0)
			note_timer(n, *id);
		else
			note_retire(n);
	}
	errno = e;
	return r;
}

PL_EXPORT int timer_delete(timer_t id)
{
	PL_REAL(timer_delete, pl_timer_delete_fn)
	int r = f(id);
	int e = errno;
	if (r == 0)
		note_retire_of(PL_NOTE_TIMER, id, 0);
	errno = e;
	return r;
}

PL_EXPORT int mq_notify(mqd_t mq, const struct sigevent *evp)
{
	PL_REAL(mq_notify, pl_mq_notify_fn)
	if (!evp) { /* unregister */
		int r = f(mq, evp);
		int e = errno;
		if (r == 0)
			note_retire_of(PL_NOTE_MQ, 0, mq);
		errno = e;
		return r;
	}
	struct sigevent ev;
	struct pl_note *n;
	const struct sigevent *use = note_event(PL_NOTE_MQ, mq, evp, &ev, &n);
	int r = f(mq, use);
	int e = errno;
	if (n && r != 0)
		note_retire(n);
	errno = e;
	return r;
}

PL_EXPORT int mq_close(mqd_t mq)
{
	PL_REAL(mq_close, pl_mq_close_fn)
	int r = f(mq);
	int e = errno;
	if (r == 0)
		note_retire_of(PL_NOTE_MQ, 0, mq);
	errno = e;
	return r;
}

/* Public: set up the calling thread (a thread the program made some other
 * way than pthread_create or thrd_create). Idempotent. */
PL_EXPORT int memtally_init(void)
{
	if (!mtc_init())
		return MEMTALLY_EDISABLED;
	return pl_init();
}

/* ---- what jemalloc does not define --------------------------------------
 * glibc's versions would allocate from glibc's own heap, and the block
 * would then be freed into jemalloc. */

PL_EXPORT void *pvalloc(size_t n)
{
	size_t page = (size_t)sysconf(_SC_PAGESIZE);
	size_t r;
	if (__builtin_add_overflow(n, page - 1, &r)) {
		errno = ENOMEM;
		return NULL;
	}
	r &= ~(page - 1);
	return memalign(page, r ? r : page);
}

PL_EXPORT void *reallocarray(void *p, size_t n, size_t m)
{
	size_t total;
	if (__builtin_mul_overflow(n, m, &total)) {
		errno = ENOMEM;
		return NULL;
	}
	return realloc(p, total);
}

/* C23 sized frees (glibc >= 2.39 declares them). */
PL_EXPORT void free_sized(void *p, size_t n)
{
	(void)n;
	free(p);
}

PL_EXPORT void free_aligned_sized(void *p, size_t align, size_t n)
{
	(void)align;
	(void)n;
	free(p);
}

/* ---- for tests and benchmarks ------------------------------------------- */

/* "jemalloc <version>": the allocator every call reaches. */
PL_EXPORT const char *memtally_preload_allocator(void)
{
	static char buf[96];
	const char *v = NULL;
	size_t sz = sizeof(v);
	if (mallctl("version", &v, &sz, NULL, 0) || !v)
		return "fallback";
	strcpy(buf, "jemalloc ");
	strncat(buf, v, sizeof(buf) - 10);
	return buf;
}

/* How the preload counts: "activity-callback", "counting" (the fallback:
 * a check on every call) or "off". */
PL_EXPORT const char *memtally_preload_front_end(void)
{
	switch (mtj_mode()) {
	case MTJ_CALLBACK:
		return "activity-callback";
	case MTJ_COUNTING:
		return "counting";
	default:
		return "off";
	}
}
