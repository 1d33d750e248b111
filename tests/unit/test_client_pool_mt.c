#define _GNU_SOURCE
/*
 * A memtally_pool created with MEMTALLY_POOL_LOCKED, shared by threads:
 * every block handed out is a different one (each thread's pattern
 * survives), and the pool's chunks are accounted once, by the thread that
 * created it. Runs under TSan too (the _mt suffix).
 */
#include <criterion/criterion.h>
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "memtally.h"

static void setup(void)
{
	/* Nobody listens here: the library must count locally. */
	setenv("MEMTALLY_SOCKET", "/nonexistent/memtally-test.sock", 1);
}

#define LOCKED_THREADS 4
#define LOCKED_ROUNDS  20000

static void *locked_work(void *arg)
{
	memtally_pool *p = arg;
	void *mine[16];
	for (int r = 0; r < LOCKED_ROUNDS; r++) {
		for (int i = 0; i < 16; i++) {
			mine[i] = memtally_pool_get(p);
			if (!mine[i])
				return (void *)1;
			memset(mine[i], r & 0xff, 32);
		}
		for (int i = 0; i < 16; i++) {
			if (((uint8_t *)mine[i])[31] != (uint8_t)(r & 0xff))
				return (void *)2;
			memtally_pool_put(p, mine[i]);
		}
	}
	return NULL;
}

Test(client_pool, locked_pool_is_shared_safely, .init = setup,
     .timeout = 60)
{
	int64_t base = memtally_process_bytes();
	memtally_pool *p;
	cr_assert_eq(memtally_pool_create(&p, 32, 64,
	                                  MEMTALLY_POOL_LOCKED |
	                                      MEMTALLY_POOL_GROW),
	             0);
	pthread_t t[LOCKED_THREADS];
	for (int i = 0; i < LOCKED_THREADS; i++)
		pthread_create(&t[i], NULL, locked_work, p);
	for (int i = 0; i < LOCKED_THREADS; i++) {
		void *r;
		pthread_join(t[i], &r);
		cr_assert_null(r, "thread %d failed (%p)", i, r);
	}
	/* 4 threads x 16 blocks fit in one 64-block chunk. */
	cr_assert_eq(memtally_process_bytes() - base,
	             (int64_t)memtally_pool_accounted(p));
	memtally_pool_destroy(p);
	cr_assert_eq(memtally_process_bytes(), base);
}
