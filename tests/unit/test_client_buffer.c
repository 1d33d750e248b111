#define _GNU_SOURCE
/*
 * memtally_buf, memtally_arena and memtally_pool: correctness, and that
 * memtally_process_bytes() moves by exactly the chunk (or capacity) sizes
 * they obtain and give back, never per allocation. No server: the library
 * counts locally (fail open), which is what process_bytes reports.
 */
#include <criterion/criterion.h>
#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "memtally.h"

static void setup(void)
{
	/* Nobody listens here: the library must count locally. */
	setenv("MEMTALLY_SOCKET", "/nonexistent/memtally-test.sock", 1);
}

/* ---- buffer ------------------------------------------------------------ */

Test(client_buffer, append_grows_by_doubling, .init = setup)
{
	memtally_buf b;
	memtally_buf_init(&b, 0);
	int64_t base = memtally_process_bytes();
	cr_assert_null(b.data);
	cr_assert_eq(memtally_buf_append(&b, "abc", 3), 0);
	cr_assert_eq(b.len, 3);
	cr_assert_eq(b.cap, 64, "first capacity %zu", b.cap);
	cr_assert_eq(memtally_process_bytes() - base, 64);
	size_t prev = b.cap;
	int growths = 0;
	for (int i = 0; i < 10000; i++) {
		uint8_t c = (uint8_t)i;
		cr_assert_eq(memtally_buf_append(&b, &c, 1), 0);
		if (b.cap != prev) {
			cr_assert_eq(b.cap, prev * 2);
			prev = b.cap;
			growths++;
		}
		cr_assert_eq(memtally_process_bytes() - base, (int64_t)b.cap);
	}
	cr_assert_eq(growths, 8); /* 64 -> 16384 */
	cr_assert_eq(memcmp(b.data, "abc", 3), 0);
	for (int i = 0; i < 10000; i++)
		cr_assert_eq(b.data[3 + i], (uint8_t)i);
	memtally_buf_free(&b);
	cr_assert_eq(b.len, 0);
	cr_assert_eq(b.cap, 0);
	cr_assert_eq(memtally_process_bytes(), base);
}

Test(client_buffer, grow_1_5x, .init = setup)
{
	memtally_buf b;
	memtally_buf_init(&b, MEMTALLY_BUF_GROW_1_5X);
	cr_assert_eq(memtally_buf_reserve(&b, 100), 0);
	cr_assert_eq(b.cap, 100);
	cr_assert_eq(b.len, 0);
	char x[101] = {0};
	cr_assert_eq(memtally_buf_append(&b, x, 101), 0);
	cr_assert_eq(b.cap, 150);
	memtally_buf_free(&b);
}

Test(client_buffer, finish_hands_over_shrunk_and_accounted, .init = setup)
{
	int64_t base = memtally_process_bytes();
	memtally_buf b;
	memtally_buf_init(&b, 0);
	char chunk[1000];
	memset(chunk, 'x', sizeof(chunk));
	for (int i = 0; i < 5; i++)
		cr_assert_eq(memtally_buf_append(&b, chunk, sizeof(chunk)), 0);
	size_t len = 0;
	char *p = memtally_buf_finish(&b, &len);
	cr_assert_not_null(p);
	cr_assert_eq(len, 5000);
	cr_assert_eq(p[4999], 'x');
	cr_assert_eq(memtally_process_bytes() - base, 5000);
	cr_assert_null(b.data);
	cr_assert_eq(b.len, 0);
	memtally_buf_free_data(p, len);
	cr_assert_eq(memtally_process_bytes(), base);

	/* Empty: a real 1-byte block, balanced by free_data(p, 0). */
	p = memtally_buf_finish(&b, &len);
	cr_assert_not_null(p);
	cr_assert_eq(len, 0);
	cr_assert_eq(memtally_process_bytes() - base, 1);
	memtally_buf_free_data(p, len);
	cr_assert_eq(memtally_process_bytes(), base);
	memtally_buf_free(NULL);
	memtally_buf_free_data(NULL, 0);
}

Test(client_buffer, no_account_counts_nothing, .init = setup)
{
	int64_t base = memtally_process_bytes();
	memtally_buf b;
	memtally_buf_init(&b, MEMTALLY_NO_ACCOUNT);
	for (int i = 0; i < 100000; i++)
		cr_assert_eq(memtally_buf_append(&b, "0123456789", 10), 0);
	cr_assert_eq(memtally_process_bytes(), base);
	size_t len;
	void *p = memtally_buf_finish(&b, &len);
	cr_assert_eq(len, 1000000);
	free(p);
	cr_assert_eq(memtally_process_bytes(), base);
}

Test(client_buffer, overflowing_request_is_enomem, .init = setup)
{
	memtally_buf b;
	memtally_buf_init(&b, 0);
	cr_assert_eq(memtally_buf_append(&b, "a", 1), 0);
	int64_t before = memtally_process_bytes();
	cr_assert_eq(memtally_buf_reserve(&b, SIZE_MAX), -ENOMEM);
	cr_assert_eq(memtally_buf_reserve(&b, SIZE_MAX / 2), -ENOMEM);
	cr_assert_eq(b.len, 1);
	cr_assert_eq(memtally_process_bytes(), before);
	memtally_buf_free(&b);
}

/* ---- arena ------------------------------------------------------------- */

Test(client_arena, bump_allocates_per_chunk_accounting, .init = setup)
{
	int64_t base = memtally_process_bytes();
	memtally_arena *a = NULL;
	cr_assert_eq(memtally_arena_create(&a, 4096, 0), 0);
	cr_assert_not_null(a);
	cr_assert_eq(memtally_process_bytes(), base, "no chunk before use");
	uint8_t *prev = NULL;
	for (int i = 0; i < 100; i++) {
		uint8_t *p = memtally_arena_alloc(a, 24);
		cr_assert_not_null(p);
		cr_assert_eq((uintptr_t)p % 16, 0);
		memset(p, i, 24);
		if (prev && i < 100)
			cr_assert(p != prev);
		prev = p;
	}
	/* 100 x 32 bytes (rounded) in 4096-byte chunks less a header: one
	 * chunk is 4096 - 16 bytes of payload = 127 blocks... so one chunk. */
	cr_assert_eq(memtally_arena_accounted(a), 4096);
	cr_assert_eq(memtally_process_bytes() - base, 4096);
	for (int i = 0; i < 100; i++)
		cr_assert_not_null(memtally_arena_alloc(a, 32));
	cr_assert_eq(memtally_arena_accounted(a), 8192);
	cr_assert_eq(memtally_process_bytes() - base, 8192);

	/* A request larger than a chunk gets its own chunk. */
	uint8_t *big = memtally_arena_alloc(a, 100000);
	cr_assert_not_null(big);
	memset(big, 1, 100000);
	size_t acc = memtally_arena_accounted(a);
	cr_assert_gt(acc, 8192 + 100000);
	cr_assert_eq(memtally_process_bytes() - base, (int64_t)acc);

	/* Reset keeps the first chunk only, and reuses it. */
	memtally_arena_reset(a);
	cr_assert_eq(memtally_arena_accounted(a), 4096);
	cr_assert_eq(memtally_process_bytes() - base, 4096);
	cr_assert_not_null(memtally_arena_alloc(a, 16));
	cr_assert_eq(memtally_process_bytes() - base, 4096);

	memtally_arena_destroy(a);
	cr_assert_eq(memtally_process_bytes(), base);
	memtally_arena_destroy(NULL);
	memtally_arena_reset(NULL);
}

Test(client_arena, allocations_do_not_overlap, .init = setup)
{
	memtally_arena *a;
	cr_assert_eq(memtally_arena_create(&a, 0, MEMTALLY_NO_ACCOUNT), 0);
	int64_t base = memtally_process_bytes();
	enum { N = 5000 };
	static uint8_t *ptr[N];
	static size_t sz[N];
	for (int i = 0; i < N; i++) {
		sz[i] = (size_t)(i * 7919 % 300) + 1;
		ptr[i] = memtally_arena_alloc(a, sz[i]);
		cr_assert_not_null(ptr[i]);
		memset(ptr[i], (int)(i & 0xff), sz[i]);
	}
	for (int i = 0; i < N; i++)
		for (size_t k = 0; k < sz[i]; k++)
			cr_assert_eq(ptr[i][k], (uint8_t)(i & 0xff));
	cr_assert_eq(memtally_process_bytes(), base);
	memtally_arena_destroy(a);
}

Test(client_arena, bad_chunk_size_is_einval, .init = setup)
{
	memtally_arena *a = (memtally_arena *)1;
	cr_assert_eq(memtally_arena_create(&a, 16, 0), -EINVAL);
	cr_assert_null(a);
}

/* ---- pool -------------------------------------------------------------- */

Test(client_pool, get_put_reuse_and_chunk_accounting, .init = setup)
{
	int64_t base = memtally_process_bytes();
	memtally_pool *p = NULL;
	cr_assert_eq(memtally_pool_create(&p, 40, 8, 0), 0);
	cr_assert_eq(memtally_pool_block_size(p), 48);
	size_t chunk = memtally_pool_accounted(p);
	cr_assert_geq(chunk, 8 * 48);
	cr_assert_eq(memtally_process_bytes() - base, (int64_t)chunk);

	void *b[8];
	for (int i = 0; i < 8; i++) {
		b[i] = memtally_pool_get(p);
		cr_assert_not_null(b[i]);
		cr_assert_eq((uintptr_t)b[i] % 16, 0);
		memset(b[i], i, 48);
		for (int k = 0; k < i; k++)
			cr_assert(b[k] != b[i]);
	}
	/* Exhausted, no MEMTALLY_POOL_GROW: NULL, nothing accounted. */
	cr_assert_null(memtally_pool_get(p));
	cr_assert_eq(memtally_process_bytes() - base, (int64_t)chunk);
	for (int i = 0; i < 8; i++)
		cr_assert_eq(((uint8_t *)b[i])[47], (uint8_t)i);
	memtally_pool_put(p, b[3]);
	cr_assert_eq(memtally_pool_get(p), b[3]);
	cr_assert_null(memtally_pool_get(p));
	for (int i = 0; i < 8; i++)
		memtally_pool_put(p, b[i]);
	memtally_pool_put(p, NULL);
	for (int i = 0; i < 8; i++)
		cr_assert_not_null(memtally_pool_get(p));
	memtally_pool_destroy(p);
	cr_assert_eq(memtally_process_bytes(), base);
	memtally_pool_destroy(NULL);
}

Test(client_pool, grow_adds_accounted_chunks, .init = setup)
{
	int64_t base = memtally_process_bytes();
	memtally_pool *p;
	cr_assert_eq(memtally_pool_create(&p, 64, 4, MEMTALLY_POOL_GROW), 0);
	size_t chunk = memtally_pool_accounted(p);
	for (int i = 0; i < 10; i++)
		cr_assert_not_null(memtally_pool_get(p));
	/* 10 blocks of 4 per chunk: 3 chunks. */
	cr_assert_eq(memtally_pool_accounted(p), 3 * chunk);
	cr_assert_eq(memtally_process_bytes() - base, (int64_t)(3 * chunk));
	memtally_pool_destroy(p);
	cr_assert_eq(memtally_process_bytes(), base);
}

Test(client_pool, bad_arguments_are_einval, .init = setup)
{
	memtally_pool *p = (memtally_pool *)1;
	cr_assert_eq(memtally_pool_create(&p, 0, 4, 0), -EINVAL);
	cr_assert_null(p);
	cr_assert_eq(memtally_pool_create(&p, 16, 0, 0), -EINVAL);
	cr_assert_eq(memtally_pool_create(&p, SIZE_MAX / 4, 4, 0), -EINVAL);
}
