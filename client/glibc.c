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
 * flags; an mmapped chunk also counts its leading pad, the word at
 * p - 16), so a process's total is what mallinfo2() calls in use,
 * uordblks + hblkhd, to within the flush threshold per thread -- except
 * blocks the program freed that glibc keeps in its per-thread caches
 * (tcache: at most 7 blocks of each size up to 1032 bytes per thread),
 * which mallinfo2() still counts as in use and we do not.
 *
 * Each call adds one load of the header and memtally_account() (a
 * thread-local add and a compare; account.c flushes, publishes at thread
 * exit and handles fork, as for the inline API). Memory the program maps
 * itself is counted by mmap.c, as in the jemalloc preload; glibc's malloc
 * maps through its internal mmap, never through ours.
 *
 * glibc gives back to the kernel only the top of its heap (and blocks it
 * mmapped on their own): what the program frees below the top stays
 * resident, free for the program's next allocations. That memory is held
 * by the process as surely as its live blocks, so it is counted too, as
 * the process's allocator_free bytes: after a flush, every
 * MTC_FREE_INTERVAL_NS or when the heap moved by an eighth (at least
 * MTC_FREE_MOVED), one thread asks mallinfo2() for what glibc holds from
 * the system (arena + hblkhd) and stores that less the process's heap
 * bytes (attach.c). mallinfo2() walks glibc's free lists under each
 * arena's lock, typically in a few microseconds; a slower walk spaces the
 * next sample out (never more than 0.5% of the thread's CPU time, and at
 * most 2 s).
 */
#define _GNU_SOURCE
#include "client_internal.h"

#include <errno.h>
#include <gnu/libc-version.h>
#include <malloc.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#define GL_EXPORT __attribute__((visibility("default")))

/* glibc's own entry points (GLIBC_2.2.5), never another allocator's. */
void *__libc_malloc(size_t n);
void __libc_free(void *p);
void *__libc_calloc(size_t n, size_t m);
void *__libc_realloc(void *p, size_t n);
void *__libc_memalign(size_t align, size_t n);
void *__libc_valloc(size_t n);
void *__libc_pvalloc(size_t n);

#define GL_IS_MMAPPED 0x2u

/* The bytes glibc's mallinfo2() counts for the live block `p`. */
static inline int64_t chunk_bytes(const void *p)
{
	const size_t *h = (const size_t *)p;
	size_t sz = h[-1];
	size_t bytes = sz & ~(size_t)7;
	if (sz & GL_IS_MMAPPED)
		bytes += h[-2]; /* the pad before an aligned mmapped chunk */
	return (int64_t)bytes;
}

static inline void *counted(void *p)
{
	if (p)
		memtally_account(chunk_bytes(p));
	return p;
}

GL_EXPORT void *malloc(size_t n)
{
	return counted(__libc_malloc(n));
}

GL_EXPORT void free(void *p)
{
	if (!p)
		return;
	/* Counted once glibc has it back: a flush here may sample glibc's
	 * free memory (mtc_front_sample), which must not see the block as
	 * still held by glibc and no longer by the program. */
	int64_t n = chunk_bytes(p);
	__libc_free(p);
	memtally_account(-n);
}

GL_EXPORT void *calloc(size_t n, size_t m)
{
	return counted(__libc_calloc(n, m));
}

GL_EXPORT void *realloc(void *p, size_t n)
{
	int64_t old = p ? chunk_bytes(p) : 0;
	void *q = __libc_realloc(p, n);
	if (q)
		memtally_account(chunk_bytes(q) - old);
	else if (p && n == 0)
		memtally_account(-old); /* glibc freed it */
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

GL_EXPORT void *aligned_alloc(size_t align, size_t n)
{
	if (!align || (align & (align - 1))) {
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

/* The core's hooks into the front end: account.c's counting is the
 * whole of it here. */
int mtc_front_flush(void)
{
	return mta_front_flush();
}

int64_t mtc_front_drift(void)
{
	return mta_front_drift();
}

void mtc_front_force_slow(void)
{
	mta_front_force_slow();
}

/* After a flush: glibc's footprint, when a sample is due. */
void mtc_front_sample(void)
{
	struct mtc_free_sample fs;
	if (!mtc_free_due(&fs))
		return;
	struct mallinfo2 mi = mallinfo2();
	mtc_free_publish(&fs, mi.arena + mi.hblkhd);
}

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
