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
#include <pthread.h>
#include <threads.h>
#include <stdlib.h>
#include <string.h>
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

/* The library's front ends, as the core asks them (attach.c): jemalloc's,
 * and memtally_account()'s for what a program counts of its own (memory
 * that is not malloc's), as in libmemtally (linked.c). */
const struct mtc_front *const mtc_fronts[] = {&mtj_front, &mta_front, NULL};

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
