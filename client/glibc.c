/*
 * glibc.c - libmemtally_glibc.so: counting under the program's own glibc
 * malloc, without switching it to jemalloc.
 *
 * The malloc family is defined here and served by glibc's own entry points
 * (__libc_malloc & co, bound by name: whatever else the program loads, its
 * blocks come from glibc's heap). C++ operator new/delete are libstdc++'s,
 * which call malloc and free, so they reach us without definitions of
 * their own; nothing of jemalloc is loaded.
 *
 * The unit is glibc's chunk size, read from the chunk's header as
 * malloc_usable_size() reads it (size field at p - 8, low three bits
 * flags), so a process's total is what mallinfo2() calls in use,
 * uordblks + hblkhd, to within the flush threshold per thread -- except
 * blocks the program freed that glibc keeps in its per-thread caches
 * (tcache: at most 7 blocks of each size up to 1032 bytes per thread),
 * which mallinfo2() still counts as in use and we do not, and the pad
 * before a chunk memalign & co aligned inside its own mapping (less than
 * the alignment), which hblkhd has and the size leaves out: the process's
 * allocator free bytes (below) count it.
 *
 * Each call adds one load of the header and one add to a thread-local
 * counter with a branch on its carry (struct gl_tls, below); the call
 * into glibc goes through the GOT. A 64 KiB pair flushes twice, and
 * both publishes are quiet (publish.h, inline in malloc and in free's
 * slow path) but one in 64, which looks at the server's heartbeat. What
 * each costs over glibc alone: bench/results/insn_per_pair.md.
 * The slow path flushes at thread exit and handles fork, as account.c
 * does for the inline API. That API stays available: a program linked
 * to libmemtally reaches account.c here.
 * Memory the program maps itself is counted by mmap.c, as in the jemalloc
 * preload; glibc's malloc maps through its internal mmap, never through
 * ours.
 *
 * glibc gives back to the kernel only the top of its heap (and blocks it
 * mmapped on their own): what the program frees below the top stays
 * resident, free for the program's next allocations. That memory is held
 * by the process as surely as its live blocks, so it is counted too, as
 * the process's allocator_free bytes: after a full flush (never after a
 * quiet one, so never on a common malloc or free), every
 * MTC_FREE_INTERVAL_NS or when the heap moved by an eighth (at least
 * MTC_FREE_MOVED), one thread asks mallinfo2() for what glibc holds from
 * the system (arena + hblkhd) and stores that less the process's heap
 * bytes (free_sample.c). mallinfo2() walks glibc's free lists under each
 * arena's lock. A slower walk spaces the next sample out (free_sample.c,
 * mtc_free_publish).
 */
#define _GNU_SOURCE
#include "client_internal.h"

#include <errno.h>
#include <gnu/libc-version.h>
#include <malloc.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#define GL_EXPORT __attribute__((visibility("default")))

/* glibc's own entry points (GLIBC_2.2.5), never another allocator's,
 * called through the GOT: no PLT stub on the way (noplt). */
#define GL_LIBC __attribute__((noplt))
GL_LIBC void *__libc_malloc(size_t n);
GL_LIBC void __libc_free(void *p);
GL_LIBC void *__libc_calloc(size_t n, size_t m);
GL_LIBC void *__libc_realloc(void *p, size_t n);
GL_LIBC void *__libc_memalign(size_t align, size_t n);
GL_LIBC void *__libc_valloc(size_t n);
GL_LIBC void *__libc_pvalloc(size_t n);

/*
 * The bytes counted for the live block `p`: its chunk's size field (at
 * p - 8, low three bits flags), as malloc_usable_size() reads it, the
 * same for every block and at both ends, malloc and free. An mmapped
 * chunk that memalign & co aligned within its mapping also has a pad
 * before it (the word at p - 16) that the size leaves out: mallinfo2()'s
 * hblkhd has it, and so the allocator's free memory the process is
 * sampled for (arena + hblkhd less the heap's bytes) counts it.
 */
static inline uint64_t chunk_bytes(const void *p)
{
	return ((const size_t *)p)[-1] & ~(size_t)7;
}

/*
 * Per thread: two counters that only grow, `alloc` (bytes of blocks the
 * thread was given) and `freed` (bytes of blocks it gave back). The last
 * flush starts both at -T (T = threshold, modulo 2^64), so the add that
 * brings either to T bytes since that flush carries out of 64 bits. A
 * call costs one add to thread-local memory and one branch on the carry.
 * Both start from the same value, so the unflushed drift is alloc - freed
 * (+ carry), with each side below T: within (-T, +T), as with the inline
 * API. This is the scheme of jemalloc's activity callback: a flush after
 * every T bytes allocated, and after every T bytes freed.
 *
 * A new thread starts with both counters at 2^64 - 1: its first call
 * carries and sets it up. A disabled process puts them at 0, which 2^64
 * bytes would carry. `carry` keeps drift the counters no longer hold
 * (after a fork, or added while the thread flushed).
 */
struct gl_tls {
	uint64_t alloc;
	int64_t carry; /* between the two: stored apart, not as one vector */
	uint64_t freed;
	uint64_t win;         /* -T of the last full flush, the quiet path's */
	uint8_t set;          /* set up (1), or disabled (2) */
	struct mtc_thread th; /* th.exited: past its exit flush, every call
	                       * publishes (into the slot's overflow) */
};

static __thread struct gl_tls gl MTC_TLS = {
    .alloc = UINT64_MAX,
    .freed = UINT64_MAX,
};

static void gl_sample(void);

static pthread_key_t gl_key;
static pthread_once_t gl_key_once = PTHREAD_ONCE_INIT;

static int64_t gl_drift(const struct gl_tls *t)
{
	if (t->set == 2)
		return 0;
	return t->carry + (int64_t)(t->alloc - t->freed);
}

/* Take the drift out of the counters (into the return value) and start a
 * new window: the next call carries after `window` bytes (1: at once). */
static int64_t gl_take(struct gl_tls *t, uint64_t window)
{
	int64_t d = gl_drift(t);
	t->carry = 0;
	t->alloc = t->freed = -window;
	return d;
}

/* Publish `d` in full (mtc_publish: the server's flags and heartbeat are
 * looked at), then run the callback the flush found due and sample
 * glibc's free memory when a sample is due, both outside the busy guard.
 * After the thread's exit flush, into the slot's overflow, and the next
 * call comes back here. */
static void gl_publish(struct gl_tls *t, int64_t d)
{
	t->th.busy = 1;
	if (d)
		mtc_publish(&t->th, d);
	/* Keep what was counted re-entrantly meanwhile (our own attach);
	 * the quiet path publishes the counters only, not `carry`. */
	t->win = -mtc_threshold();
	int64_t extra = gl_take(t, t->th.exited ? 1 : -t->win);
	t->carry = extra;
	if (extra)
		mtc_quiet_off(&t->th);
	t->th.busy = 0;
	if (!t->th.exited) {
		mtc_after_flush(&t->th);
		gl_sample();
	}
}

static void gl_on_exit(void *unused)
{
	(void)unused;
	struct gl_tls *t = &gl;
	if (t->set != 1)
		return;
	t->th.busy = 1;
	int64_t d = gl_take(t, 1);
	if (d)
		mtc_publish(&t->th, d);
	mtc_thread_exit(&t->th); /* hands a due callback to another thread */
	t->th.busy = 0;
}

static void gl_make_key(void)
{
	pthread_key_create(&gl_key, gl_on_exit);
}

/* The rest of gl_slow(): a new or disabled thread, a re-entered one,
 * and a publish the quiet path cannot make. */
static void gl_slow_rare_errno(void)
{
	struct gl_tls *t = &gl;
	if (t->th.busy || t->set == 2)
		return; /* re-entered from our own publish: keep counting */
	if (!t->set) {
		t->th.busy = 1;
		if (!mtc_init()) {
			/* Disabled: never come back here. */
			t->set = 2;
			t->carry = 0;
			t->alloc = t->freed = 0;
			t->th.busy = 0;
			return;
		}
		pthread_once(&gl_key_once, gl_make_key);
		pthread_setspecific(gl_key, t);
		t->set = 1;
		t->th.busy = 0;
	}
	gl_publish(t, gl_take(t, 1));
}

/* The program's errno survives it: a registration's socket calls, the
 * refresh thread's start. free() keeps errno (glibc since 2.33, POSIX),
 * and a program may free in an error path before it reads errno. */
__attribute__((noinline)) static void gl_slow_rare(void)
{
	int e = errno;
	gl_slow_rare_errno();
	errno = e;
}

/*
 * A counter carried: T bytes allocated or freed since the last flush (a
 * thread churning blocks of T or more comes here on every call), a new
 * thread, or one forced here (fork, thread exit). The common case is the
 * quiet publish: the lane's add and a new window, no call. Quiet
 * publishes are armed only by gl_publish()'s full one, for a set-up
 * thread whose drift is all in its counters (`carry` 0): a new, disabled
 * or exited thread, and one that keeps a carry, has none. True when made;
 * inlined into malloc and free, whose carry branch then makes no call.
 */
static inline __attribute__((always_inline)) bool gl_quiet(struct gl_tls *t)
{
	/* The counters as stored: the caller's add stays an add to memory
	 * rather than keeping its sum in a register for us. */
	__asm__("" ::: "memory");
	if (__builtin_expect(
	        mtc_publish_quiet(&t->th, (int64_t)(t->alloc - t->freed)), 1)) {
		t->alloc = t->freed = t->win;
		return true;
	}
	return false;
}

/* The same for the rest of the family, and the slow path behind it. */
__attribute__((noinline)) static void *gl_slow(void *p)
{
	if (!gl_quiet(&gl))
		gl_slow_rare();
	return p;
}

static inline void *counted(void *p)
{
	if (p && __builtin_add_overflow(gl.alloc, chunk_bytes(p), &gl.alloc))
		return gl_slow(p);
	return p;
}

GL_EXPORT void *malloc(size_t n)
{
	void *p = __libc_malloc(n);
	if (__builtin_expect(p != NULL, 1) &&
	    __builtin_expect(
	        __builtin_add_overflow(gl.alloc, chunk_bytes(p), &gl.alloc),
	        0) &&
	    !gl_quiet(&gl))
		gl_slow_rare();
	return p;
}

/* A free whose count carried flushes after glibc has the block back,
 * since the flush may sample glibc's free memory, which must not see the
 * block as still held by glibc and no longer by the program (nor can a
 * quiet publish come first: a sample by another thread in between would
 * find the block out of the heap and still in what glibc holds). Out of
 * free() itself, which then needs no frame. */
__attribute__((noinline)) static void free_slow(void *p)
{
	__libc_free(p);
	if (!gl_quiet(&gl))
		gl_slow_rare();
}

GL_EXPORT void free(void *p)
{
	if (!p)
		return;
	if (__builtin_expect(
	        __builtin_add_overflow(gl.freed, chunk_bytes(p), &gl.freed),
	        0)) {
		free_slow(p);
		return;
	}
	__libc_free(p);
}

GL_EXPORT void *calloc(size_t n, size_t m)
{
	void *p = __libc_calloc(n, m);
	if (p && __builtin_add_overflow(gl.alloc, chunk_bytes(p), &gl.alloc))
		return gl_slow(p);
	return p;
}

GL_EXPORT void *realloc(void *p, size_t n)
{
	uint64_t old = p ? chunk_bytes(p) : 0;
	void *q = __libc_realloc(p, n);
	/* Both counts after glibc is done, each with its own carry test. */
	int slow = 0;
	if (q)
		slow =
		    __builtin_add_overflow(gl.alloc, chunk_bytes(q), &gl.alloc);
	if (q || (p && n == 0)) /* the old block is gone (moved or freed) */
		slow |= __builtin_add_overflow(gl.freed, old, &gl.freed);
	if (slow)
		return gl_slow(q);
	return q;
}

GL_EXPORT void *reallocarray(void *p, size_t n, size_t m)
{
	size_t total;
	if (__builtin_mul_overflow(n, m, &total)) {
		errno = ENOMEM;
		return NULL;
	}
	return realloc(p, total);
}

GL_EXPORT int posix_memalign(void **out, size_t align, size_t n)
{
	if (!align || (align & (align - 1)) || align % sizeof(void *))
		return EINVAL;
	void *p = __libc_memalign(align, n);
	if (!p)
		return ENOMEM;
	*out = counted(p);
	return 0;
}

/* glibc before 2.38 takes any alignment in aligned_alloc (it is memalign
 * there, which rounds it up); 2.38 refuses what C11 does. As the host's
 * glibc does, so that a program behaves the same with memtally. */
static bool aligned_alloc_strict(void)
{
	static int strict = -1;
	int s = __atomic_load_n(&strict, __ATOMIC_RELAXED);
	if (s < 0) {
		const char *v = gnu_get_libc_version();
		unsigned major = 0, minor = 0;
		while (*v >= '0' && *v <= '9')
			major = major * 10 + (unsigned)(*v++ - '0');
		if (*v == '.')
			v++;
		while (*v >= '0' && *v <= '9')
			minor = minor * 10 + (unsigned)(*v++ - '0');
		s = major > 2 || (major == 2 && minor >= 38);
		__atomic_store_n(&strict, s, __ATOMIC_RELAXED);
	}
	return s;
}

GL_EXPORT void *aligned_alloc(size_t align, size_t n)
{
	if ((!align || (align & (align - 1))) && aligned_alloc_strict()) {
		errno = EINVAL;
		return NULL;
	}
	return counted(__libc_memalign(align, n));
}

GL_EXPORT void *memalign(size_t align, size_t n)
{
	return counted(__libc_memalign(align, n));
}

GL_EXPORT void *valloc(size_t n)
{
	return counted(__libc_valloc(n));
}

GL_EXPORT void *pvalloc(size_t n)
{
	return counted(__libc_pvalloc(n));
}

/* Defined here, or a program that links another allocator's
 * malloc_usable_size would ask it of glibc's blocks: glibc's own answer,
 * from the same header (an mmapped chunk has a two-word header, others
 * lend the next chunk's first word). */
GL_EXPORT size_t malloc_usable_size(void *p)
{
	if (!p)
		return 0;
	size_t s = ((const size_t *)p)[-1];
	return (s & ~(size_t)7) - ((s & 2) ? 2 : 1) * sizeof(size_t);
}

/* C23 sized frees: the size comes from the header anyway. */
GL_EXPORT void free_sized(void *p, size_t n)
{
	(void)n;
	free(p);
}

GL_EXPORT void free_aligned_sized(void *p, size_t align, size_t n)
{
	(void)align;
	(void)n;
	free(p);
}

/* What the core asks of the malloc family's counters (attach.c). */
static int gl_flush(void)
{
	struct gl_tls *t = &gl;
	if (!t->set) {
		gl_slow(NULL); /* sets the thread up, publishes, samples */
	} else if (t->set == 1 && !t->th.busy) {
		gl_publish(t, gl_take(t, 1));
	}
	return 0;
}

static int64_t gl_front_drift(void)
{
	return gl_drift(&gl);
}

static void gl_force_slow(void)
{
	struct gl_tls *t = &gl;
	if (t->set == 1) {
		t->carry += gl_take(t, 1);
		mtc_quiet_off(&t->th);
	}
}

/* After a flush: glibc's footprint, when a sample is due. */
static void gl_sample(void)
{
	struct mtc_free_sample fs;
	if (!mtc_free_due(&fs, true))
		return;
	struct mallinfo2 mi = mallinfo2();
	mtc_free_publish(&fs, mi.arena + mi.hblkhd);
}

/* The refresh thread's sample (refresh.c): the same as after a flush,
 * owed only when the heap moved since the last one. Never for its age:
 * glibc's free memory changes only in the program's own calls, which
 * move the heap. The walk of a large free list is long, under the
 * arena's lock (docs/ARCHITECTURE.md, "The refresh thread"). So an idle
 * process is sampled once after it went quiet, then left alone. A busy
 * one is sampled by its own flushes. */
static void gl_refresh(bool busy)
{
	struct mtc_free_sample fs;
	if (busy || !mtc_free_refresh_due(&fs, 0, false))
		return;
	struct mallinfo2 mi = mallinfo2();
	mtc_free_publish(&fs, mi.arena + mi.hblkhd);
}

static const struct mtc_front gl_front = {
    .flush = gl_flush,
    .drift = gl_front_drift,
    .force_slow = gl_force_slow,
    .sample = gl_sample,
    .refresh = gl_refresh,
};

/* The malloc family's counters, and memtally_account()'s (account.c) for
 * a program that also calls the inline API. */
const struct mtc_front *const mtc_fronts[] = {&gl_front, &mta_front, NULL};

/* A program that calls memtally_init() (written for a linked
 * libmemtally): everything is counted already. */
GL_EXPORT int memtally_init(void)
{
	return mtc_init() ? 0 : MEMTALLY_EDISABLED;
}

/* Which allocator the calls reach, for tests and benchmarks. */
GL_EXPORT const char *memtally_preload_allocator(void)
{
	static char buf[48];
	snprintf(buf, sizeof(buf), "glibc %s", gnu_get_libc_version());
	return buf;
}
