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
 * free and +3 ns for reading the counters after each call (DESIGN.md).
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

static struct {
	void *(*malloc)(size_t);
	void (*free)(void *);
	void *(*calloc)(size_t, size_t);
	void *(*realloc)(void *, size_t);
	int (*posix_memalign)(void **, size_t, size_t);
	void *(*aligned_alloc)(size_t, size_t);
	void *(*memalign)(size_t, size_t);
	void *(*valloc)(size_t);
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
} je;

static int pl_resolved;  /* 1 once `je` is complete (acquire/release) */
static int pl_resolving; /* set while dlopen/dlsym run */
static int pl_counting;  /* 0: forward only (counters unavailable) */

/* Bootstrap heap for allocations made while resolving. Each block carries
 * its size in front so realloc can copy it. */
static _Alignas(64) unsigned char pl_boot[64 * 1024];
static size_t pl_boot_used;

static inline int in_boot(const void *p)
{
	return (uintptr_t)p - (uintptr_t)pl_boot < sizeof(pl_boot);
}

static void *boot_alloc(size_t n, size_t align)
{
	if (align < 16)
		align = 16;
	size_t off = (pl_boot_used + 16 + align - 1) & ~(align - 1);
	if (n > sizeof(pl_boot) || off + n > sizeof(pl_boot))
		return NULL;
	memcpy(pl_boot + off - sizeof(size_t), &n, sizeof(size_t));
	pl_boot_used = off + n;
	return pl_boot + off;
}

static size_t boot_size(const void *p)
{
	size_t n;
	memcpy(&n, (const unsigned char *)p - sizeof(size_t), sizeof(n));
	return n;
}

static void resolve(void)
{
	if (__atomic_load_n(&pl_resolved, __ATOMIC_ACQUIRE) || pl_resolving)
		return;
	pl_resolving = 1;
	void *h = dlopen("libjemalloc.so.2", RTLD_NOW | RTLD_NOLOAD);
	if (!h)
		h = dlopen("libjemalloc.so.2", RTLD_NOW | RTLD_GLOBAL);
#define SYM(field, name) (*(void **)&je.field = h ? dlsym(h, name) : NULL)
	SYM(malloc, "malloc");
	SYM(free, "free");
	SYM(calloc, "calloc");
	SYM(realloc, "realloc");
	SYM(posix_memalign, "posix_memalign");
	SYM(aligned_alloc, "aligned_alloc");
	SYM(memalign, "memalign");
	SYM(valloc, "valloc");
	SYM(malloc_usable_size, "malloc_usable_size");
	SYM(mallctl, "mallctl");
	SYM(znwm, "_Znwm");
	SYM(znam, "_Znam");
	SYM(znwm_nt, "_ZnwmRKSt9nothrow_t");
	SYM(znam_nt, "_ZnamRKSt9nothrow_t");
	SYM(znwm_al, "_ZnwmSt11align_val_t");
	SYM(znam_al, "_ZnamSt11align_val_t");
	SYM(znwm_al_nt, "_ZnwmSt11align_val_tRKSt9nothrow_t");
	SYM(znam_al_nt, "_ZnamSt11align_val_tRKSt9nothrow_t");
	SYM(zdlpv, "_ZdlPv");
	SYM(zdapv, "_ZdaPv");
	SYM(zdlpv_nt, "_ZdlPvRKSt9nothrow_t");
	SYM(zdapv_nt, "_ZdaPvRKSt9nothrow_t");
	SYM(zdlpv_al, "_ZdlPvSt11align_val_t");
	SYM(zdapv_al, "_ZdaPvSt11align_val_t");
	SYM(zdlpv_al_nt, "_ZdlPvSt11align_val_tRKSt9nothrow_t");
	SYM(zdapv_al_nt, "_ZdaPvSt11align_val_tRKSt9nothrow_t");
	SYM(zdlpvm, "_ZdlPvm");
	SYM(zdapvm, "_ZdaPvm");
	SYM(zdlpvm_al, "_ZdlPvmSt11align_val_t");
	SYM(zdapvm_al, "_ZdaPvmSt11align_val_t");
	int ok = je.malloc && je.free && je.calloc && je.realloc &&
		 je.posix_memalign && je.aligned_alloc && je.memalign &&
		 je.valloc && je.malloc_usable_size && je.znwm && je.znam &&
		 je.znwm_nt && je.znam_nt && je.zdlpv && je.zdapv &&
		 je.zdlpv_nt && je.zdapv_nt && je.zdlpvm && je.zdapvm &&
		 je.znwm_al && je.znam_al && je.znwm_al_nt && je.znam_al_nt &&
		 je.zdlpv_al && je.zdapv_al && je.zdlpv_al_nt &&
		 je.zdapv_al_nt && je.zdlpvm_al && je.zdapvm_al;
	if (!ok) {
		/* No usable jemalloc: fail open onto whatever comes next in
		 * the search order (glibc, libstdc++), and count nothing. */
		h = RTLD_NEXT;
		SYM(malloc, "malloc");
		SYM(free, "free");
		SYM(calloc, "calloc");
		SYM(realloc, "realloc");
		SYM(posix_memalign, "posix_memalign");
		SYM(aligned_alloc, "aligned_alloc");
		SYM(memalign, "memalign");
		SYM(valloc, "valloc");
		SYM(malloc_usable_size, "malloc_usable_size");
		je.mallctl = NULL;
		SYM(znwm, "_Znwm");
		SYM(znam, "_Znam");
		SYM(znwm_nt, "_ZnwmRKSt9nothrow_t");
		SYM(znam_nt, "_ZnamRKSt9nothrow_t");
		SYM(znwm_al, "_ZnwmSt11align_val_t");
		SYM(znam_al, "_ZnamSt11align_val_t");
		SYM(znwm_al_nt, "_ZnwmSt11align_val_tRKSt9nothrow_t");
		SYM(znam_al_nt, "_ZnamSt11align_val_tRKSt9nothrow_t");
		SYM(zdlpv, "_ZdlPv");
		SYM(zdapv, "_ZdaPv");
		SYM(zdlpv_nt, "_ZdlPvRKSt9nothrow_t");
		SYM(zdapv_nt, "_ZdaPvRKSt9nothrow_t");
		SYM(zdlpv_al, "_ZdlPvSt11align_val_t");
		SYM(zdapv_al, "_ZdaPvSt11align_val_t");
		SYM(zdlpv_al_nt, "_ZdlPvSt11align_val_tRKSt9nothrow_t");
		SYM(zdapv_al_nt, "_ZdaPvSt11align_val_tRKSt9nothrow_t");
		SYM(zdlpvm, "_ZdlPvm");
		SYM(zdapvm, "_ZdaPvm");
		SYM(zdlpvm_al, "_ZdlPvmSt11align_val_t");
		SYM(zdapvm_al, "_ZdaPvmSt11align_val_t");
	}
#undef SYM
	pl_counting = ok && je.mallctl != NULL;
	pl_resolving = 0;
	__atomic_store_n(&pl_resolved, 1, __ATOMIC_RELEASE);
	if (!ok)
		mtc_debug("libjemalloc.so.2 not usable; forwarding without "
			  "counting");
}

__attribute__((constructor(101))) static void pl_constructor(void)
{
	resolve();
}

/* ---- accounting ------------------------------------------------------- */

/*
 * Per thread: pointers to jemalloc's cumulative counters, the net published
 * so far, and the window [low, low + span] of nets that need no flush. A
 * new thread has allocp == NULL and takes the slow path once.
 */
struct pl_tls {
	const uint64_t *allocp;
	const uint64_t *deallocp;
	uint64_t low;
	uint64_t span;
	uint64_t flushed;
	struct mtc_thread th;
};

static __thread struct pl_tls pl_t MTC_TLS;
static pthread_key_t pl_key;
static pthread_once_t pl_key_once = PTHREAD_ONCE_INIT;
static const uint64_t pl_zero;

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
	uint64_t T = mtc_threshold();
	t->low = net - T;
	t->span = 2 * T;
}

/* TSD destructor: flush, and come back for up to three more rounds so that
 * frees made by other destructors are still seen; then release the lane. */
static void pl_thread_exit(void *arg)
{
	struct pl_tls *t = &pl_t;
	uintptr_t round = (uintptr_t)arg;
	if (!t->allocp || t->allocp == &pl_zero)
		return;
	t->th.busy = 1;
	publish_now(t);
	if (round < 3) {
		pthread_setspecific(pl_key, (void *)(round + 1));
	} else {
		mtc_thread_exit(&t->th);
	}
	t->th.busy = 0;
}

static void make_key(void)
{
	pthread_key_create(&pl_key, pl_thread_exit);
}

__attribute__((noinline)) static void pl_slow(struct pl_tls *t)
{
	if (t->th.busy || !__atomic_load_n(&pl_resolved, __ATOMIC_ACQUIRE))
		return;
	t->th.busy = 1;
	if (!t->allocp) {
		const uint64_t *a = NULL, *d = NULL;
		size_t sz = sizeof(a);
		int ok = pl_counting && mtc_init() &&
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
}

/* The check every entry point makes before (or, for large blocks, after)
 * forwarding: two loads, a subtract, a compare. */
static inline __attribute__((always_inline)) void pl_check(void)
{
	struct pl_tls *t = &pl_t;
	if (__builtin_expect(t->allocp == NULL, 0)) {
		pl_slow(t);
		return;
	}
	uint64_t net = *t->allocp - *t->deallocp;
	if (__builtin_expect(net - t->low > t->span, 0))
		pl_slow(t);
}

int mtc_front_flush(void)
{
	struct pl_tls *t = &pl_t;
	if (!t->allocp) {
		pl_slow(t);
		return 0;
	}
	if (t->allocp == &pl_zero || t->th.busy)
		return 0;
	t->th.busy = 1;
	publish_now(t);
	t->th.busy = 0;
	return 0;
}

int64_t mtc_front_drift(void)
{
	struct pl_tls *t = &pl_t;
	return t->allocp ? (int64_t)(net_now(t) - t->flushed) : 0;
}

void mtc_front_force_slow(void)
{
	pl_t.span = 0;
}

/* ---- the malloc family ------------------------------------------------ */

static void *boot_or_resolve(size_t n, size_t align)
{
	resolve();
	if (__atomic_load_n(&pl_resolved, __ATOMIC_ACQUIRE))
		return NULL;
	return boot_alloc(n, align);
}

PL_EXPORT void *malloc(size_t n)
{
	if (__builtin_expect(!je.malloc, 0)) {
		void *p = boot_or_resolve(n, 16);
		if (p || !je.malloc)
			return p;
	}
	if (__builtin_expect(n >= MTC_LARGE, 0)) {
		void *p = je.malloc(n);
		pl_check();
		return p;
	}
	pl_check();
	return je.malloc(n);
}

PL_EXPORT void free(void *p)
{
	if (__builtin_expect(in_boot(p), 0))
		return;
	if (__builtin_expect(!je.free, 0)) {
		resolve();
		if (!je.free)
			return; /* cannot be ours: leak rather than crash */
	}
	pl_check();
	je.free(p);
}

PL_EXPORT void *calloc(size_t n, size_t m)
{
	if (__builtin_expect(!je.calloc, 0)) {
		size_t t;
		if (__builtin_mul_overflow(n, m, &t))
			return NULL;
		void *p = boot_or_resolve(t, 16);
		if (p || !je.calloc)
			return p; /* the boot buffer is zero: never reused */
	}
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
	if (__builtin_expect(in_boot(p) || !je.realloc, 0)) {
		resolve();
		if (!je.malloc)
			return boot_alloc(n, 16);
		void *q = je.malloc(n);
		if (q && p) {
			size_t old = boot_size(p);
			memcpy(q, p, old < n ? old : n);
		}
		pl_check();
		return q;
	}
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
	if (__builtin_expect(!je.posix_memalign, 0)) {
		resolve();
		if (!je.posix_memalign) {
			if (!align || (align & (align - 1)) ||
			    align % sizeof(void *))
				return EINVAL;
			*out = boot_alloc(n, align);
			return *out ? 0 : ENOMEM;
		}
	}
	int r = je.posix_memalign(out, align, n);
	pl_check();
	return r;
}

PL_EXPORT void *aligned_alloc(size_t align, size_t n)
{
	if (__builtin_expect(!je.aligned_alloc, 0)) {
		resolve();
		if (!je.aligned_alloc)
			return boot_alloc(n, align);
	}
	void *p = je.aligned_alloc(align, n);
	pl_check();
	return p;
}

PL_EXPORT void *memalign(size_t align, size_t n)
{
	if (__builtin_expect(!je.memalign, 0)) {
		resolve();
		if (!je.memalign)
			return boot_alloc(n, align);
	}
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
	if (!p)
		return 0;
	if (in_boot(p))
		return boot_size(p);
	resolve();
	return je.malloc_usable_size ? je.malloc_usable_size(p) : 0;
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
		if (__builtin_expect(in_boot(p), 0))                         \
			return;                                              \
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
