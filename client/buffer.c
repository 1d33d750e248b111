/*
 * buffer.c - memtally_buf, a growable byte buffer whose capacity is
 * accounted through memtally_account().
 *
 * Invariants: len <= cap; `data` is NULL exactly when cap is 0; unless the
 * buffer was initialised with MEMTALLY_NO_ACCOUNT, exactly `cap` bytes are
 * accounted for it (one memtally_account() per growth, never per append),
 * so memtally_process_bytes() moves by the capacity the buffer holds, not
 * by what was written into it.
 *
 * Growth policy: 2x by default (MEMTALLY_BUF_GROW_1_5X selects 1.5x for
 * comparison), chosen by bench/buffer_growth
 * (bench/results/buffer_growth.md). With jemalloc, 2x is faster than 1.5x in
 * every case; with glibc the two do not differ significantly. The reason is the
 * number of reallocations: 1.5x takes 36 growths to 64 MiB where 2x
 * takes 21. Every large jemalloc realloc copies into fresh pages that
 * fault in, since jemalloc returns freed pages to the kernel. glibc
 * moves large blocks with mremap() without copying, so for it the count
 * hardly matters. Arrow's BufferBuilder (ARROW-6450) made the same
 * choice. 2x is never slower here. Its extra slack is at most one
 * capacity's worth of memory, and that slack is accounted, so a
 * scheduler sees it.
 */
#include <errno.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "memtally.h"

#define MEMTALLY__BUF_MIN_CAP 64

static void buf_account(const memtally_buf *b, int64_t delta)
{
	if (!(b->flags & MEMTALLY_NO_ACCOUNT))
		memtally_account(delta);
}

void memtally_buf_init(memtally_buf *b, unsigned flags)
{
	b->data = NULL;
	b->len = 0;
	b->cap = 0;
	b->flags = flags;
	b->reserved32 = 0;
	b->reserved[0] = b->reserved[1] = 0;
}

/* The capacity to grow to so that `need` bytes fit. */
static size_t buf_next_cap(const memtally_buf *b, size_t need)
{
	size_t cap = b->cap;
	size_t grown;
	if (b->flags & MEMTALLY_BUF_GROW_1_5X)
		grown = cap + cap / 2;
	else
		grown = cap * 2;
	if (grown < cap) /* overflow */
		grown = need;
	if (grown < need)
		grown = need;
	if (grown < MEMTALLY__BUF_MIN_CAP)
		grown = MEMTALLY__BUF_MIN_CAP;
	return grown;
}

/* Slow path of reserve and append. */
static int buf_grow(memtally_buf *b, size_t extra)
{
	/* No object may exceed PTRDIFF_MAX bytes; refuse such a request here
	 * rather than ask the allocator (sanitizers abort on it). */
	if (extra > (size_t)PTRDIFF_MAX - b->len)
		return -ENOMEM;
	size_t need = b->len + extra;
	if (need <= b->cap)
		return 0;
	size_t cap = buf_next_cap(b, need);
	if (cap > (size_t)PTRDIFF_MAX)
		cap = need;
	uint8_t *p = realloc(b->data, cap);
	if (!p)
		return -ENOMEM;
	buf_account(b, (int64_t)(cap - b->cap));
	b->data = p;
	b->cap = cap;
	return 0;
}

int memtally_buf_reserve(memtally_buf *b, size_t extra)
{
	if (b->cap - b->len >= extra)
		return 0;
	return buf_grow(b, extra);
}

int memtally_buf_append(memtally_buf *b, const void *src, size_t n)
{
	if (b->cap - b->len < n) {
		int rc = buf_grow(b, n);
		if (rc)
			return rc;
	}
	if (n)
		memcpy(b->data + b->len, src, n);
	b->len += n;
	return 0;
}

void *memtally_buf_finish(memtally_buf *b, size_t *len)
{
	size_t n = b->len;
	uint8_t *p = b->data;
	if (!p) {
		/* Nothing was written: still hand out a real block, so that
		 * the caller's free path is the same in every case. */
		p = malloc(1);
		if (!p)
			return NULL;
		buf_account(b, 1);
		b->cap = 1;
	}
	/* Give the slack back; if the allocator refuses to shrink, keep the
	 * block as it is and account what it is. */
	size_t keep = n ? n : 1;
	if (keep < b->cap) {
		uint8_t *q = realloc(p, keep);
		if (q) {
			buf_account(b, -(int64_t)(b->cap - keep));
			p = q;
			b->cap = keep;
		}
	}
	size_t accounted = b->cap;
	unsigned flags = b->flags;
	memtally_buf_init(b, flags);
	if (len)
		*len = n;
	if (flags & MEMTALLY_NO_ACCOUNT)
		return p;
	/* The block is accounted as `keep` bytes when shrinking worked; when
	 * it did not, settle the difference now so that
	 * memtally_buf_free_data(p, len) balances it. */
	if (accounted != keep)
		memtally_account(-(int64_t)(accounted - keep));
	return p;
}

void memtally_buf_free_data(void *data, size_t len)
{
	if (!data)
		return;
	memtally_account(-(int64_t)(len ? len : 1));
	free(data);
}

void memtally_buf_free(memtally_buf *b)
{
	if (!b)
		return;
	if (b->data) {
		buf_account(b, -(int64_t)b->cap);
		free(b->data);
	}
	memtally_buf_init(b, b->flags);
}
