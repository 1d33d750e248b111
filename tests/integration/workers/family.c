/*
 * family - allocate hundreds of MiB through every entry of the malloc
 * family (and jemalloc's mallocx/rallocx/dallocx/sdallocx where the
 * process has them) from several threads, free part of it at random, let the
 * threads exit (their blocks stay live), then report jemalloc's own idea of the
 * heap: stats.allocated after thread.tcache.flush and epoch.
 * Prints "allocated=N threads=T" and waits on stdin.
 * usage: mt_worker family [THREADS] [MIB_PER_THREAD]
 */
#include "mt_common.h"

#include <malloc.h>
#include <pthread.h>

static size_t mib_per_thread = 64;

/* jemalloc's own API, found at run time (absent under glibc). */
static void *(*je_mallocx)(size_t, int);
static void *(*je_rallocx)(void *, size_t, int);
static void (*je_dallocx)(void *, int);
static void (*je_sdallocx)(void *, size_t, int);
static size_t (*je_sallocx)(const void *, int);

static void find_jemalloc_api(void)
{
	*(void **)&je_mallocx = dlsym(RTLD_DEFAULT, "mallocx");
	*(void **)&je_rallocx = dlsym(RTLD_DEFAULT, "rallocx");
	*(void **)&je_dallocx = dlsym(RTLD_DEFAULT, "dallocx");
	*(void **)&je_sdallocx = dlsym(RTLD_DEFAULT, "sdallocx");
	*(void **)&je_sallocx = dlsym(RTLD_DEFAULT, "sallocx");
	if (!je_mallocx || !je_rallocx || !je_dallocx || !je_sdallocx ||
	    !je_sallocx)
		je_mallocx = NULL;
}

/* Free through one of the entries that free. */
static void family_free(void *p, uint64_t r)
{
	if (je_mallocx && r % 3 == 1)
		je_dallocx(p, 0);
	else if (je_mallocx && r % 3 == 2)
		je_sdallocx(p, je_sallocx(p, 0), 0);
	else
		free(p);
}

static uint64_t rng(uint64_t *s)
{
	*s ^= *s << 13;
	*s ^= *s >> 7;
	*s ^= *s << 17;
	return *s;
}

/* One allocation through entry `k` of the family, of about `n` bytes. */
static void *family_alloc(int k, size_t n, void *old)
{
	void *p = NULL;
	switch (k) {
	case 0:
		return malloc(n);
	case 1:
		return calloc(n / 16 + 1, 16);
	case 2:
		return realloc(old, n); /* grows or moves `old` */
	case 3:
		return reallocarray(NULL, n / 8 + 1, 8);
	case 4:
		return posix_memalign(&p, 64, n) ? NULL : p;
	case 5:
		return aligned_alloc(4096, (n + 4095) & ~(size_t)4095);
	case 6:
		return memalign(256, n);
	case 7:
		return valloc(n);
	case 8:
		return pvalloc(n);
	case 9:
		return je_mallocx ? je_mallocx(n, 0) : malloc(n);
	default: /* rallocx grows or moves `old` */
		return je_mallocx && old ? je_rallocx(old, n, 0)
		                         : realloc(old, n);
	}
}

static void *work(void *arg)
{
	uint64_t seed = (uintptr_t)arg * 2654435761u + 1;
	size_t budget = mib_per_thread * MIB, used = 0;
	enum { SLOTS = 4096 };
	void **keep = calloc(SLOTS, sizeof(void *));
	size_t nkeep = 0;
	while (used < budget && nkeep < SLOTS) {
		int k = (int)(rng(&seed) % 11);
		/* Mostly small and medium blocks, some large ones. */
		size_t n = rng(&seed) % 8 ? 16 + rng(&seed) % 8192
		                          : 65536 + rng(&seed) % (2 * MIB);
		void *old = (k == 2 || k == 10) && nkeep ? keep[--nkeep] : NULL;
		void *p = family_alloc(k, n, old);
		if (!p)
			continue;
		used += n;
		if (rng(&seed) % 3 == 0) {
			family_free(p, rng(&seed)); /* a third at once */
		} else {
			keep[nkeep++] = p;
		}
		/* Shrink some blocks in place or by moving. */
		if (nkeep && rng(&seed) % 16 == 0) {
			size_t i = rng(&seed) % nkeep;
			void *q = realloc(keep[i], 32);
			if (q)
				keep[i] = q;
		}
		/* And free some older ones at random. */
		if (nkeep > 8 && rng(&seed) % 5 == 0) {
			size_t i = rng(&seed) % nkeep;
			family_free(keep[i], rng(&seed));
			keep[i] = keep[--nkeep];
		}
	}
	return keep; /* leaked on purpose: live after the thread exits */
}

static int family_main(int argc, char **argv)
{
	int nthreads = argc > 1 ? atoi(argv[1]) : 4;
	find_jemalloc_api();
	if (argc > 2)
		mib_per_thread = strtoul(argv[2], NULL, 10);
	pthread_t t[64];
	if (nthreads > 64)
		nthreads = 64;
	for (int i = 0; i < nthreads; i++)
		pthread_create(&t[i], NULL, work, (void *)(uintptr_t)(i + 1));
	for (int i = 0; i < nthreads; i++)
		pthread_join(t[i], NULL);

	int (*mallctl)(const char *, void *, size_t *, void *, size_t) =
	    (int (*)(const char *, void *, size_t *, void *, size_t))dlsym(
	        RTLD_DEFAULT, "mallctl");
	size_t allocated = 0, sz = sizeof(allocated);
	uint64_t epoch = 1;
	if (mallctl) {
		mallctl("thread.tcache.flush", NULL, NULL, NULL, 0);
		mallctl("epoch", NULL, NULL, &epoch, sizeof(epoch));
		mallctl("stats.allocated", &allocated, &sz, NULL, 0);
	}
	mt_flush();
	mt_say("allocated=%zu threads=1 jemalloc=%d", allocated, mallctl != 0);
	mt_serve(NULL, 0);
	return 0;
}

const struct mt_sub mt_family = {"family", "[THREADS] [MIB_PER_THREAD]",
                                 family_main};
