/*
 * pool.c - memtally_pool, fixed-size blocks from accounted chunks.
 *
 * A pool hands out blocks of one size from chunks obtained with malloc();
 * each chunk is accounted with one memtally_account() when obtained and one
 * when the pool is destroyed, never per block. Free blocks form an
 * intrusive singly linked list (the link lives in the free block itself);
 * blocks never yet handed out are carved from the newest chunk by a bump
 * pointer, so creating a pool touches no memory beyond its first chunk's
 * header. Chunks are given back only by memtally_pool_destroy().
 *
 * When no block is free: with MEMTALLY_POOL_GROW the pool obtains another
 * chunk; without it memtally_pool_get() returns NULL and the caller falls
 * back to something else (the "exhausted pool" case of bench/allocators).
 *
 * The default pool is thread-confined: no locks, no atomics. With
 * MEMTALLY_POOL_LOCKED every get and put takes a mutex, so one pool may be
 * shared by threads; bench/allocators measures what that costs.
 *
 * Invariants: every block on `free_list` or in [next, end) lies in one of
 * the chunks on `chunks`; `accounted` is the sum of the chunk sizes and is
 * exactly what this pool added to memtally_account() (0 with
 * MEMTALLY_NO_ACCOUNT).
 */
#include <errno.h>
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>

#include "memtally.h"

#define POOL_ALIGN 16

struct pool_chunk {
	struct pool_chunk *prev;
	size_t size;
	_Alignas(POOL_ALIGN) unsigned char mem[];
};

struct pool_free {
	struct pool_free *next;
};

struct memtally_pool {
	struct pool_free *free_list;
	unsigned char *next; /* never-used blocks of the newest chunk */
	unsigned char *end;
	struct pool_chunk *chunks;
	size_t block_size;
	size_t blocks_per_chunk;
	size_t accounted;
	unsigned flags;
	pthread_mutex_t lock; /* used only with MEMTALLY_POOL_LOCKED */
};

static int pool_add_chunk(memtally_pool *p)
{
	size_t payload = p->block_size * p->blocks_per_chunk;
	size_t csize = sizeof(struct pool_chunk) + payload;
	struct pool_chunk *c = malloc(csize);
	if (!c)
		return -ENOMEM;
	c->size = csize;
	c->prev = p->chunks;
	p->chunks = c;
	p->next = c->mem;
	p->end = c->mem + payload;
	p->accounted += csize;
	if (!(p->flags & MEMTALLY_NO_ACCOUNT))
		memtally_account((int64_t)csize);
	return 0;
}

int memtally_pool_create(memtally_pool **out, size_t block_size,
                         size_t blocks_per_chunk, unsigned flags)
{
	*out = NULL;
	if (block_size == 0 || blocks_per_chunk == 0)
		return -EINVAL;
	if (block_size < sizeof(struct pool_free))
		block_size = sizeof(struct pool_free);
	block_size = (block_size + POOL_ALIGN - 1) & ~(size_t)(POOL_ALIGN - 1);
	if (block_size == 0 ||
	    blocks_per_chunk > (SIZE_MAX / 2 - sizeof(struct pool_chunk)) /
	                           block_size)
		return -EINVAL;
	memtally_pool *p = malloc(sizeof(*p));
	if (!p)
		return -ENOMEM;
	p->free_list = NULL;
	p->next = p->end = NULL;
	p->chunks = NULL;
	p->block_size = block_size;
	p->blocks_per_chunk = blocks_per_chunk;
	p->accounted = 0;
	p->flags = flags;
	int rc = pthread_mutex_init(&p->lock, NULL);
	if (rc)
		goto fail_free_pool;
	rc = pool_add_chunk(p);
	if (rc)
		goto fail_destroy_lock;
	*out = p;
	return 0;

fail_destroy_lock:
	pthread_mutex_destroy(&p->lock);
fail_free_pool:
	free(p);
	return rc > 0 ? -rc : rc;
}

static void *pool_get(memtally_pool *p)
{
	struct pool_free *f = p->free_list;
	if (f) {
		p->free_list = f->next;
		return f;
	}
	if (p->next == p->end) {
		if (!(p->flags & MEMTALLY_POOL_GROW) || pool_add_chunk(p))
			return NULL;
	}
	void *b = p->next;
	p->next += p->block_size;
	return b;
}

static void pool_put(memtally_pool *p, void *block)
{
	struct pool_free *f = block;
	f->next = p->free_list;
	p->free_list = f;
}

void *memtally_pool_get(memtally_pool *p)
{
	if (!(p->flags & MEMTALLY_POOL_LOCKED))
		return pool_get(p);
	pthread_mutex_lock(&p->lock);
	void *b = pool_get(p);
	pthread_mutex_unlock(&p->lock);
	return b;
}

void memtally_pool_put(memtally_pool *p, void *block)
{
	if (!block)
		return;
	if (!(p->flags & MEMTALLY_POOL_LOCKED)) {
		pool_put(p, block);
		return;
	}
	pthread_mutex_lock(&p->lock);
	pool_put(p, block);
	pthread_mutex_unlock(&p->lock);
}

size_t memtally_pool_block_size(const memtally_pool *p)
{
	return p->block_size;
}

size_t memtally_pool_accounted(const memtally_pool *p)
{
	return p ? p->accounted : 0;
}

void memtally_pool_destroy(memtally_pool *p)
{
	if (!p)
		return;
	struct pool_chunk *c = p->chunks;
	while (c) {
		struct pool_chunk *prev = c->prev;
		free(c);
		c = prev;
	}
	if (p->accounted && !(p->flags & MEMTALLY_NO_ACCOUNT))
		memtally_account(-(int64_t)p->accounted);
	pthread_mutex_destroy(&p->lock);
	free(p);
}
