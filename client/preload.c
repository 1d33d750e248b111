/*
 * preload.c - libmemtally_preload.so, the malloc interposer.
 *
 * Every entry of the malloc family and every C++ operator new/delete is
 * defined here and forwarded to the process's libjemalloc.so.2, bound
 * explicitly (dlopen of that library, dlsym in it): the next "malloc" in the
 * global search order may be glibc's or jemalloc's depending on the program,
 * and jemalloc's own operator new would bypass a malloc-only interposer.
 *
 * Sizes are learned from jemalloc's per-thread cumulative counters
 * (thread.allocatedp / thread.deallocatedp: usable sizes, maintained on
 * jemalloc's fast path anyway). Each call first compares the thread's net
 * (allocated - deallocated) with what it last published and then tail-calls
 * jemalloc, so the common path adds two loads, a subtract and one compare:
 * measured +0.7..1.8 ns per pair, against +2.1..7 ns for sallocx on every
 * free and +3 ns for reading the counters after each call (measured on
 * the benchmark machine, bench/RESULTS.md).
 * The price is that a call's own bytes are seen at the thread's next call;
 * allocations of MTC_LARGE bytes or more are checked after the call so a
 * big block is seen at once.
 *
 * Bootstrap: until jemalloc's entry points are resolved, allocations (made
 * by dlopen/dlsym themselves) come from a static buffer and frees of it are
 * ignored. Resolution runs on the first call or in the constructor.
 */
#define _GNU_SOURCE
#include "client_internal.h"

#include <dlfcn.h>
#include <errno.h>
#include <pthread.h>
#include <stddef.h>
#include <string.h>
#include <unistd.h>

#define PL_EXPORT __attribute__((visibility("default")))
#define MTC_LARGE (64 * 1024)

/* ---- jemalloc's entry points ------------------------------------------ */

/* jemalloc's non-standard API, which no other allocator defines: called by
 * name (we link libjemalloc.so.2) to bootstrap before dlsym has run. */
void *mallocx(size_t size, int flags);
void *rallocx(void *ptr, size_t size, int flags);
void dallocx(void *ptr, int flags);
size_t sallocx(const void *ptr, int flags);
#define PL_MALLOCX_ZERO 0x40
#define PL_MALLOCX_ALIGN(a) ((int)__builtin_ctzl(a))

typedef void *(*fn_new)(size_t);
typedef void *(*fn_new_nt)(size_t, const void *);
typedef void *(*fn_new_al)(size_t, size_t);
typedef void *(*fn_new_al_nt)(size_t, size_t, const void *);
typedef void (*fn_del)(void *);
typedef void (*fn_del_nt)(void *, const void *);
typedef void (*fn_del_al)(void *, size_t);
typedef void (*fn_del_al_nt)(void *, size_t, const void *);
typedef void (*fn_del_sz)(void *, size_t);
typedef void (*fn_del_sz_al)(void *, size_t, size_t);

static void *boot_malloc(size_t n);
static void boot_free(void *p);
static void *boot_calloc(size_t n, size_t m);
static void *boot_realloc(void *p, size_t n);
static int boot_posix_memalign(void **out, size_t align, size_t n);
static void *boot_aligned_alloc(size_t align, size_t n);
static size_t boot_usable_size(void *p);

/*
 * Where every call goes. The C entries start at bootstrap functions that
 * resolve jemalloc's own entry points on first use (until then, and if a
 * symbol were missing, they serve the call through jemalloc's mallocx API,
 * so even memory allocated during dlsym belongs to the one heap). The C++
 * operators are resolved before any of them can be reached: every
 * operator entry calls ensure() first.
 */
static struct {
	void *(*malloc)(size_t);
	void (*free)(void *);
	void *(*calloc)(size_t, size_t);
	void *(*realloc)(void *, size_t);
	int (*posix_memalign)(void **, size_t, size_t);
	void *(*aligned_alloc)(size_t, size_t);
	void *(*memalign)(size_t, size_t);
	size_t (*malloc_usable_size)(void *);
	int (*mallctl)(const char *, void *, size_t *, void *, size_t);
	fn_new znwm, znam;
	fn_new_nt znwm_nt, znam_nt;
	fn_new_al znwm_al, znam_al;
	fn_new_al_nt znwm_al_nt, znam_al_nt;
	fn_del zdlpv, zdapv;
	fn_del_nt zdlpv_nt, zdapv_nt;
	fn_del_al zdlpv_al, zdapv_al;
	fn_del_al_nt zdlpv_al_nt, zdapv_al_nt;
	fn_del_sz zdlpvm, zdapvm;
	fn_del_sz_al zdlpvm_al, zdapvm_al;
} je = {
	.malloc = boot_malloc,
	.free = boot_free,
	.calloc = boot_calloc,
	.realloc = boot_realloc,
	.posix_memalign = boot_posix_memalign,
	.aligned_alloc = boot_aligned_alloc,
	.memalign = boot_aligned_alloc,
	.malloc_usable_size = boot_usable_size,
};

static int pl_resolved;  /* 1 once `je` is complete (acquire/release) */
static int pl_resolving; /* set while dlopen/dlsym run */

/* Store a resolved symbol into `*slot` unless it is missing. */
static void bind(void *h, void *slot, const char *name)
{
	void *f = dlsym(h, name);
	if (f)
		__atomic_store_n((void **)slot, f, __ATOMIC_RELAXED);
}

static void resolve(void)
{
	if (__atomic_load_n(&pl_resolved, __ATOMIC_ACQUIRE) || pl_resolving)
		return;
	pl_resolving = 1;
	/* Our DT_NEEDED, so already loaded: bind in it, not in the global
	 * search order (where "malloc" may be glibc's). */
	void *h = dlopen("libjemalloc.so.2", RTLD_NOW | RTLD_NOLOAD);
	if (h) {
		bind(h, &je.malloc, "malloc");
		bind(h, &je.free, "free");
		bind(h, &je.calloc, "calloc");
		bind(h, &je.realloc, "realloc");
		bind(h, &je.posix_memalign, "posix_memalign");
		bind(h, &je.aligned_alloc, "aligned_alloc");
		bind(h, &je.memalign, "memalign");
		bind(h, &je.malloc_usable_size, "malloc_usable_size");
		bind(h, &je.mallctl, "mallctl");
	}
	/* Each operator from jemalloc, or else from the next definition in
	 * the search order (libstdc++'s, which calls our malloc). */
	static const struct {
		size_t off;
		const char *name;
	} ops[] = {
#define OP(field, sym) {offsetof(__typeof__(je), field), sym}
		OP(znwm, "_Znwm"),
		OP(znam, "_Znam"),
		OP(znwm_nt, "_ZnwmRKSt9nothrow_t"),
		OP(znam_nt, "_ZnamRKSt9nothrow_t"),
		OP(znwm_al, "_ZnwmSt11align_val_t"),
		OP(znam_al, "_ZnamSt11align_val_t"),
		OP(znwm_al_nt, "_ZnwmSt11align_val_tRKSt9nothrow_t"),
		OP(znam_al_nt, "_ZnamSt11align_val_tRKSt9nothrow_t"),
		OP(zdlpv, "_ZdlPv"),
		OP(zdapv, "_ZdaPv"),
		OP(zdlpv_nt, "_ZdlPvRKSt9nothrow_t"),
		OP(zdapv_nt, "_ZdaPvRKSt9nothrow_t"),
		OP(zdlpv_al, "_ZdlPvSt11align_val_t"),
		OP(zdapv_al, "_ZdaPvSt11align_val_t"),
		OP(zdlpv_al_nt, "_ZdlPvSt11align_val_tRKSt9nothrow_t"),
		OP(zdapv_al_nt, "_ZdaPvSt11align_val_tRKSt9nothrow_t"),
		OP(zdlpvm, "_ZdlPvm"),
		OP(zdapvm, "_ZdaPvm"),
		OP(zdlpvm_al, "_ZdlPvmSt11align_val_t"),
		OP(zdapvm_al, "_ZdaPvmSt11align_val_t"),
#undef OP
	};
	for (size_t i = 0; i < sizeof(ops) / sizeof(ops[0]); i++) {
		void *slot = (char *)&je + ops[i].off;
		if (h)
			bind(h, slot, ops[i].name);
		if (!*(void **)slot)
			bind(RTLD_NEXT, slot, ops[i].name);
	}
	pl_resolving = 0;
	__atomic_store_n(&pl_resolved, 1, __ATOMIC_RELEASE);
	if (!h || !je.mallctl)
		mtc_debug("libjemalloc.so.2 not bound; not counting");
}

__attribute__((constructor(101))) static void pl_constructor(void)
{
	resolve();
}

/* Bootstrap entries: resolve, then go to jemalloc's entry if bound, else
 * serve through mallocx & co (also what happens during resolve itself).
 * booted() says whether `field` now holds something else than `boot`. */
static int booted(void *field, void *boot)
{
	resolve();
	return __atomic_load_n((void **)field, __ATOMIC_RELAXED) != boot;
}

static void *boot_malloc(size_t n)
{
	if (booted(&je.malloc, (void *)boot_malloc))
		return je.malloc(n);
	return mallocx(n ? n : 1, 0);
}

static void boot_free(void *p)
{
	if (booted(&je.free, (void *)boot_free))
		je.free(p);
	else if (p)
		dallocx(p, 0);
}

static void *boot_calloc(size_t n, size_t m)
{
	size_t t;
	if (booted(&je.calloc, (void *)boot_calloc))
		return je.calloc(n, m);
	if (__builtin_mul_overflow(n, m, &t)) {
		errno = ENOMEM;
		return NULL;
	}
	return mallocx(t ? t : 1, PL_MALLOCX_ZERO);
}

static void *boot_realloc(void *p, size_t n)
{
	if (booted(&je.realloc, (void *)boot_realloc))
		return je.realloc(p, n);
	if (!p)
		return mallocx(n ? n : 1, 0);
	return rallocx(p, n ? n : 1, 0);
}

static int boot_posix_memalign(void **out, size_t align, size_t n)
{
	if (booted(&je.posix_memalign, (void *)boot_posix_memalign))
		return je.posix_memalign(out, align, n);
	if (!align || (align & (align - 1)) || align % sizeof(void *))
		return EINVAL;
	void *p = mallocx(n ? n : 1, PL_MALLOCX_ALIGN(align));
	if (!p)
		return ENOMEM;
	*out = p;
	return 0;
}

static void *boot_aligned_alloc(size_t align, size_t n)
{
	if (booted(&je.aligned_alloc, (void *)boot_aligned_alloc))
		return je.aligned_alloc(align, n);
	if (!align || (align & (align - 1))) {
		errno = EINVAL;
		return NULL;
	}
	return mallocx(n ? n : 1, PL_MALLOCX_ALIGN(align));
}

static size_t boot_usable_size(void *p)
{
	if (booted(&je.malloc_usable_size, (void *)boot_usable_size))
		return je.malloc_usable_size(p);
	return p ? sallocx(p, 0) : 0;
}

/* ---- accounting ------------------------------------------------------- */

/*
 * Per thread: pointers to jemalloc's cumulative counters, the net published
 * so far, and the window of nets that need no flush: a flush is due when
 * (net - low) > span, i.e. when |net - flushed| >= threshold. A new thread
 * starts with its pointers on a sentinel whose net is 1 and an empty
 * window, so the one window check sends it to the slow path: no separate
 * "is this thread set up" test on the fast path.
 */
struct pl_tls {
	const uint64_t *allocp;
	const uint64_t *deallocp;
	uint64_t low;
	uint64_t span;
	uint64_t flushed;
	struct mtc_thread th;
};

static const uint64_t pl_zero;
static const uint64_t pl_one = 1;
static __thread struct pl_tls pl_t MTC_TLS = {.allocp = &pl_one,
					      .deallocp = &pl_zero};
static pthread_key_t pl_key;
static pthread_once_t pl_key_once = PTHREAD_ONCE_INIT;

static inline int new_thread(const struct pl_tls *t)
{
	return t->allocp == &pl_one;
}

/* A thread that counts nothing (jemalloc not bound, or disabled). */
static inline int mute_thread(const struct pl_tls *t)
{
	return t->allocp == &pl_zero;
}

static uint64_t net_now(const struct pl_tls *t)
{
	return *t->allocp - *t->deallocp;
}

static void publish_now(struct pl_tls *t)
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

/* TSD destructor: flush, and come back for up to three more rounds so that
 * frees made by other destructors are still seen; then release the lane. */
static void pl_thread_exit(void *arg)
{
	struct pl_tls *t = &pl_t;
	uintptr_t round = (uintptr_t)arg;
	if (new_thread(t) || mute_thread(t))
		return;
	t->th.busy = 1;
	publish_now(t);
	mtc_over_handoff(&t->th); /* no callback in a dying thread */
	if (round < 3)
		pthread_setspecific(pl_key, (void *)(round + 1));
	else
		mtc_thread_exit(&t->th);
	t->th.busy = 0;
}

static void make_key(void)
{
	pthread_key_create(&pl_key, pl_thread_exit);
}

/* Set up the calling thread, or publish its net. Never recurses: the
 * allocations it makes (pthread_setspecific, registration) see `busy`.
 * Every caller runs it before forwarding a call to jemalloc or after that
 * call returned, never from inside jemalloc, so no allocator lock is held
 * here, and the over-limit callback may run at its end (mtc_after_flush,
 * once `busy` is released and the window is re-centred). */
__attribute__((noinline)) static void pl_slow(void)
{
	struct pl_tls *t = &pl_t;
	if (t->th.busy)
		return;
	resolve();
	if (!__atomic_load_n(&pl_resolved, __ATOMIC_ACQUIRE))
		return; /* inside resolve(): stay on the slow path */
	t->th.busy = 1;
	if (new_thread(t)) {
		const uint64_t *a = NULL, *d = NULL;
		size_t sz = sizeof(a);
		int ok = je.mallctl && mtc_init() &&
			 je.mallctl("thread.allocatedp", &a, &sz, NULL, 0) ==
				 0 &&
			 je.mallctl("thread.deallocatedp", &d, &sz, NULL, 0) ==
				 0 &&
			 a && d;
		if (!ok) {
			/* Count nothing for this thread, never come back. */
			t->allocp = t->deallocp = &pl_zero;
			t->low = 0;
			t->span = UINT64_MAX;
			t->th.busy = 0;
			return;
		}
		t->allocp = a;
		t->deallocp = d;
		pthread_once(&pl_key_once, make_key);
		pthread_setspecific(pl_key, (void *)1);
	}
	publish_now(t);
	t->th.busy = 0;
	mtc_after_flush(&t->th);
}

/* True when no flush is due: two loads, a subtract, a compare. */
static inline __attribute__((always_inline)) int pl_quiet(void)
{
	const struct pl_tls *t = &pl_t;
	return (*t->allocp - *t->deallocp) - t->low <= t->span;
}

static inline __attribute__((always_inline)) void pl_check(void)
{
	if (__builtin_expect(!pl_quiet(), 0))
		pl_slow();
}

int mtc_front_flush(void)
{
	struct pl_tls *t = &pl_t;
	if (new_thread(t)) {
		pl_slow();
		return 0;
	}
	if (mute_thread(t) || t->th.busy)
		return 0;
	t->th.busy = 1;
	publish_now(t);
	t->th.busy = 0;
	mtc_after_flush(&t->th);
	return 0;
}

int64_t mtc_front_drift(void)
{
	struct pl_tls *t = &pl_t;
	if (new_thread(t) || mute_thread(t))
		return 0;
	return (int64_t)(net_now(t) - t->flushed);
}

void mtc_front_force_slow(void)
{
	pl_t.span = 0;
}

/* ---- the malloc family ------------------------------------------------
 * The common case is the check and a tail call into jemalloc; anything
 * else (a flush due, a new thread, a large block) goes through an
 * out-of-line slow entry so the fast one needs no stack frame. Blocks of
 * MTC_LARGE bytes or more are checked after the call: a big allocation is
 * seen at once rather than at the thread's next call. */

__attribute__((noinline)) static void *malloc_slow(size_t n)
{
	if (n >= MTC_LARGE) {
		void *p = je.malloc(n);
		pl_check();
		return p;
	}
	pl_slow();
	return je.malloc(n);
}

PL_EXPORT void *malloc(size_t n)
{
	if (__builtin_expect(n < MTC_LARGE && pl_quiet(), 1))
		return je.malloc(n);
	return malloc_slow(n);
}

__attribute__((noinline)) static void free_slow(void *p)
{
	pl_slow();
	je.free(p);
}

PL_EXPORT void free(void *p)
{
	if (__builtin_expect(pl_quiet(), 1))
		return je.free(p);
	free_slow(p);
}

PL_EXPORT void *calloc(size_t n, size_t m)
{
	size_t total;
	if (__builtin_mul_overflow(n, m, &total) || total >= MTC_LARGE) {
		void *p = je.calloc(n, m);
		pl_check();
		return p;
	}
	pl_check();
	return je.calloc(n, m);
}

PL_EXPORT void *realloc(void *p, size_t n)
{
	if (n >= MTC_LARGE) {
		void *q = je.realloc(p, n);
		pl_check();
		return q;
	}
	pl_check();
	return je.realloc(p, n);
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

PL_EXPORT int posix_memalign(void **out, size_t align, size_t n)
{
	int r = je.posix_memalign(out, align, n);
	pl_check();
	return r;
}

PL_EXPORT void *aligned_alloc(size_t align, size_t n)
{
	void *p = je.aligned_alloc(align, n);
	pl_check();
	return p;
}

PL_EXPORT void *memalign(size_t align, size_t n)
{
	void *p = je.memalign(align, n);
	pl_check();
	return p;
}

PL_EXPORT void *valloc(size_t n)
{
	return memalign((size_t)sysconf(_SC_PAGESIZE), n);
}

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

PL_EXPORT size_t malloc_usable_size(void *p)
{
	return je.malloc_usable_size(p);
}

/* C23 sized frees (glibc >= 2.39 declares them): plain free is exact here,
 * since sizes come from jemalloc's counters. */
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

/* ---- C++ operator new / delete ----------------------------------------
 * Forwarded to jemalloc's own operators, which implement the new_handler
 * loop and throw std::bad_alloc; we only add the check. Called before the
 * constructor ran, they resolve first (C++ static initialisers of
 * libraries initialised before this one). */

static inline void ensure(void)
{
	if (__builtin_expect(
		    !__atomic_load_n(&pl_resolved, __ATOMIC_ACQUIRE), 0))
		resolve();
}

#define PL_NEW(sym, field)                                                   \
	PL_EXPORT void *sym(size_t n)                                        \
	{                                                                    \
		ensure();                                                    \
		void *p = je.field(n);                                       \
		pl_check();                                                  \
		return p;                                                    \
	}
#define PL_NEW_NT(sym, field)                                                \
	PL_EXPORT void *sym(size_t n, const void *nt)                        \
	{                                                                    \
		ensure();                                                    \
		void *p = je.field(n, nt);                                   \
		pl_check();                                                  \
		return p;                                                    \
	}
#define PL_NEW_AL(sym, field)                                                \
	PL_EXPORT void *sym(size_t n, size_t al)                             \
	{                                                                    \
		ensure();                                                    \
		void *p = je.field(n, al);                                   \
		pl_check();                                                  \
		return p;                                                    \
	}
#define PL_NEW_AL_NT(sym, field)                                             \
	PL_EXPORT void *sym(size_t n, size_t al, const void *nt)             \
	{                                                                    \
		ensure();                                                    \
		void *p = je.field(n, al, nt);                               \
		pl_check();                                                  \
		return p;                                                    \
	}
#define PL_DEL(sym, field, params, args)                                     \
	PL_EXPORT void sym params                                            \
	{                                                                    \
		ensure();                                                    \
		pl_check();                                                  \
		je.field args;                                               \
	}

/* Declarations keep -Wmissing-prototypes quiet for the mangled names. */
void *_Znwm(size_t);
void *_Znam(size_t);
void *_ZnwmRKSt9nothrow_t(size_t, const void *);
void *_ZnamRKSt9nothrow_t(size_t, const void *);
void *_ZnwmSt11align_val_t(size_t, size_t);
void *_ZnamSt11align_val_t(size_t, size_t);
void *_ZnwmSt11align_val_tRKSt9nothrow_t(size_t, size_t, const void *);
void *_ZnamSt11align_val_tRKSt9nothrow_t(size_t, size_t, const void *);
void _ZdlPv(void *);
void _ZdaPv(void *);
void _ZdlPvRKSt9nothrow_t(void *, const void *);
void _ZdaPvRKSt9nothrow_t(void *, const void *);
void _ZdlPvSt11align_val_t(void *, size_t);
void _ZdaPvSt11align_val_t(void *, size_t);
void _ZdlPvSt11align_val_tRKSt9nothrow_t(void *, size_t, const void *);
void _ZdaPvSt11align_val_tRKSt9nothrow_t(void *, size_t, const void *);
void _ZdlPvm(void *, size_t);
void _ZdaPvm(void *, size_t);
void _ZdlPvmSt11align_val_t(void *, size_t, size_t);
void _ZdaPvmSt11align_val_t(void *, size_t, size_t);

PL_NEW(_Znwm, znwm)
PL_NEW(_Znam, znam)
PL_NEW_NT(_ZnwmRKSt9nothrow_t, znwm_nt)
PL_NEW_NT(_ZnamRKSt9nothrow_t, znam_nt)
PL_NEW_AL(_ZnwmSt11align_val_t, znwm_al)
PL_NEW_AL(_ZnamSt11align_val_t, znam_al)
PL_NEW_AL_NT(_ZnwmSt11align_val_tRKSt9nothrow_t, znwm_al_nt)
PL_NEW_AL_NT(_ZnamSt11align_val_tRKSt9nothrow_t, znam_al_nt)
PL_DEL(_ZdlPv, zdlpv, (void *p), (p))
PL_DEL(_ZdaPv, zdapv, (void *p), (p))
PL_DEL(_ZdlPvRKSt9nothrow_t, zdlpv_nt, (void *p, const void *nt), (p, nt))
PL_DEL(_ZdaPvRKSt9nothrow_t, zdapv_nt, (void *p, const void *nt), (p, nt))
PL_DEL(_ZdlPvSt11align_val_t, zdlpv_al, (void *p, size_t al), (p, al))
PL_DEL(_ZdaPvSt11align_val_t, zdapv_al, (void *p, size_t al), (p, al))
PL_DEL(_ZdlPvSt11align_val_tRKSt9nothrow_t, zdlpv_al_nt,
       (void *p, size_t al, const void *nt), (p, al, nt))
PL_DEL(_ZdaPvSt11align_val_tRKSt9nothrow_t, zdapv_al_nt,
       (void *p, size_t al, const void *nt), (p, al, nt))
PL_DEL(_ZdlPvm, zdlpvm, (void *p, size_t n), (p, n))
PL_DEL(_ZdaPvm, zdapvm, (void *p, size_t n), (p, n))
PL_DEL(_ZdlPvmSt11align_val_t, zdlpvm_al, (void *p, size_t n, size_t al),
       (p, n, al))
PL_DEL(_ZdaPvmSt11align_val_t, zdapvm_al, (void *p, size_t n, size_t al),
       (p, n, al))

/* Which allocator the forwarded calls reach, for tests and benchmarks:
 * "jemalloc <version>" or "fallback". */
PL_EXPORT const char *memtally_preload_allocator(void)
{
	static char buf[96];
	const char *v = NULL;
	size_t sz = sizeof(v);
	ensure();
	if (!je.mallctl || je.mallctl("version", &v, &sz, NULL, 0) || !v)
		return "fallback";
	strcpy(buf, "jemalloc ");
	strncat(buf, v, sizeof(buf) - 10);
	return buf;
}
