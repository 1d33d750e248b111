/*
 * arena.c - memtally_arena, a thread-confined bump allocator.
 *
 * Memory comes from chunks obtained with malloc(); each chunk is accounted
 * with one memtally_account() when it is obtained and one when it is given
 * back, never per allocation, so an allocation is a pointer bump and a
 * compare. Memory is not zeroed. Everything is released at once, by
 * memtally_arena_reset() (which keeps the first chunk for reuse) or
 * memtally_arena_destroy().
 *
 * Invariants: `cur` is the newest chunk and the only one allocated from;
 * every chunk is on the `cur -> prev` list; `accounted` is the sum of the
 * sizes of the listed chunks (including their headers) and is exactly what
 * this arena has added to memtally_account() (0 with MEMTALLY_NO_ACCOUNT).
 * No locks: an arena belongs to one thread at a time.
 */
#include <errno.h>
#include <stdint.h>
#include <stdlib.h>

#include "memtally.h"

#define ARENA_ALIGN 16
/*
 * 16 KiB by default, by measurement (bench/results/allocators.md).
 * jemalloc 5.3 serves blocks up to 32 KiB from the thread cache.
 * Larger ones come from the arena's extents, whose pages jemalloc returns
 * to the kernel, so a chunk of 64 KiB costs a syscall or page faults.
 */
#define ARENA_DEFAULT_CHUNK (16 * 1024)

struct arena_chunk {
	struct arena_chunk *prev;
	size_t size; /* whole chunk, header included */
	/* 16-byte aligned payload follows */
	_Alignas(ARENA_ALIGN) unsigned char mem[];
};

struct memtally_arena {
	unsigned char *next; /* bump pointer in cur */
	unsigned char *end;  /* end of cur's payload */
	struct arena_chunk *cur;
	size_t chunk_size;
	size_t accounted;
	unsigned flags;
};

static void arena_account(memtally_arena *a, int64_t delta)
{
	if (!(a->flags & MEMTALLY_NO_ACCOUNT))
		memtally_account(delta);
}

int memtally_arena_create(memtally_arena **out, size_t chunk_size,
                          unsigned flags)
{
	*out = NULL;
	if (chunk_size == 0)
		chunk_size = ARENA_DEFAULT_CHUNK;
	if (chunk_size <= sizeof(struct arena_chunk) + ARENA_ALIGN ||
	    chunk_size > SIZE_MAX / 2)
		return -EINVAL;
	memtally_arena *a = malloc(sizeof(*a));
	if (!a)
		return -ENOMEM;
	a->next = a->end = NULL;
	a->cur = NULL;
	a->chunk_size = chunk_size;
	a->accounted = 0;
	a->flags = flags;
	*out = a;
	return 0;
}

/* Slow path: a new chunk big enough for `size`. */
void *memtally__arena_alloc_slow(memtally_arena *a, size_t size)
{
	size_t hdr = sizeof(struct arena_chunk);
	if (size > SIZE_MAX / 2 - hdr)
		return NULL;
	size_t csize = a->chunk_size;
	if (size > csize - hdr)
		csize = hdr + size;
	struct arena_chunk *c = malloc(csize);
	if (!c)
		return NULL;
	c->size = csize;
	c->prev = a->cur;
	a->cur = c;
	a->accounted += csize;
	arena_account(a, (int64_t)csize);
	a->next = c->mem + size;
	a->end = (unsigned char *)c + csize;
	return c->mem;
}

void *memtally_arena_alloc(memtally_arena *a, size_t size)
{
	size_t rounded =
	    (size + (ARENA_ALIGN - 1)) & ~(size_t)(ARENA_ALIGN - 1);
	if (rounded < size)
		return NULL;
	if ((size_t)(a->end - a->next) >= rounded) {
		void *p = a->next;
		a->next += rounded;
		return p;
	}
	return memtally__arena_alloc_slow(a, rounded);
}

/* Free every chunk newer than `keep` (NULL: all of them). */
static void arena_free_chunks(memtally_arena *a, struct arena_chunk *keep)
{
	struct arena_chunk *c = a->cur;
	size_t freed = 0;
	while (c && c != keep) {
		struct arena_chunk *prev = c->prev;
		freed += c->size;
		free(c);
		c = prev;
	}
	a->cur = c;
	a->accounted -= freed;
	if (freed)
		arena_account(a, -(int64_t)freed);
}

void memtally_arena_reset(memtally_arena *a)
{
	if (!a || !a->cur)
		return;
	/* Keep the oldest chunk if it is an ordinary one: the next round of
	 * allocations reuses it without malloc or accounting. */
	struct arena_chunk *first = a->cur;
	while (first->prev)
		first = first->prev;
	if (first->size != a->chunk_size)
		first = NULL;
	arena_free_chunks(a, first);
	if (first) {
		a->next = first->mem;
		a->end = (unsigned char *)first + first->size;
	} else {
		a->next = a->end = NULL;
	}
}

size_t memtally_arena_accounted(const memtally_arena *a)
{
	return a ? a->accounted : 0;
}

void memtally_arena_destroy(memtally_arena *a)
{
	if (!a)
		return;
	arena_free_chunks(a, NULL);
	free(a);
}
