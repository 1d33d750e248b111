/*
 * allocators.c - the worker of the allocators benchmark.
 *
 * Panama's AllocatorsForLongRun (OpenJDK foreign-jextract) timed one "op" of N allocations
 * followed by their release, for N = 1 .. 1000, with malloc/free, an arena,
 * a pool, an exhausted pool and a locked pool. This worker runs the same
 * ops on memtally's client, all with accounting on:
 *
 *   malloc_free     N x (malloc + memtally_account(+64)), then N x
 *                   (memtally_account(-64) + free): the inline API per block
 *   arena           create a memtally_arena (default chunk, 16 KiB), N x
 *                   64-byte allocations, destroy it: one accounted chunk
 *                   per 16 KiB of allocations (4 at N = 1000)
 *   arena_reuse     a long-lived arena: N allocations, then reset (the
 *                   first chunk is kept, so no malloc and no accounting)
 *   pool            a long-lived thread-confined memtally_pool of 64-byte
 *                   blocks, big enough: N gets, N puts
 *   pool_exhausted  a pool with no free block and no MEMTALLY_POOL_GROW:
 *                   every get returns NULL and falls back to malloc_free's
 *                   path, as a caller would
 *   pool_locked     the pool with MEMTALLY_POOL_LOCKED (uncontended mutex)
 *
 * Built twice like buffer_growth (bench_allocs_je / bench_allocs_glibc);
 * the allocator is proved by bench_common.h, and the accounting by running
 * each case once at start: memtally_process_bytes() must move by N x 64
 * mid-op for malloc_free and pool_exhausted, by the arena's chunk bytes
 * (not per allocation) for arena, by the pool's chunk bytes at its creation
 * for pool, and come back to where it was after each op.
 *
 * `--serve` reads "run CASE N OPS" and answers "ns T" (T for OPS ops);
 * `--proof` proves and exits.
 */
#define _GNU_SOURCE
#include "bench_common.h"

#include <unistd.h>

#include "memtally.h"

#ifdef BENCH_LINKED_JEMALLOC
#define BENCH_BINARY "bench_allocs_je"
#else
#define BENCH_BINARY "bench_allocs_glibc"
#endif

#define BLOCK   64
#define MAX_N   1000
#ifndef CHUNK
#define CHUNK (16 * 1024) /* the arena default */
#endif

static void *ptrs[MAX_N];
static memtally_arena *reuse_arena;
static memtally_pool *pool, *pool_locked, *pool_empty;
static void *pool_empty_block; /* the one block of pool_empty, held */

#if defined(__clang__)
#define BENCH_OP __attribute__((noinline))
#else
#define BENCH_OP __attribute__((noinline, noclone))
#endif

BENCH_OP static void op_malloc_free(int n)
{
	for (int i = 0; i < n; i++) {
		ptrs[i] = malloc(BLOCK);
		memtally_account(BLOCK);
		BENCH_ESCAPE(ptrs[i]);
	}
	for (int i = 0; i < n; i++) {
		memtally_account(-BLOCK);
		free(ptrs[i]);
	}
}

BENCH_OP static void op_arena(int n)
{
	memtally_arena *a;
	if (memtally_arena_create(&a, 0, 0))
		abort();
	for (int i = 0; i < n; i++) {
		ptrs[i] = memtally_arena_alloc(a, BLOCK);
		BENCH_ESCAPE(ptrs[i]);
	}
	memtally_arena_destroy(a);
}

BENCH_OP static void op_arena_reuse(int n)
{
	for (int i = 0; i < n; i++) {
		ptrs[i] = memtally_arena_alloc(reuse_arena, BLOCK);
		BENCH_ESCAPE(ptrs[i]);
	}
	memtally_arena_reset(reuse_arena);
}

static inline void pool_op(memtally_pool *p, int n)
{
	for (int i = 0; i < n; i++) {
		ptrs[i] = memtally_pool_get(p);
		BENCH_ESCAPE(ptrs[i]);
	}
	for (int i = 0; i < n; i++)
		memtally_pool_put(p, ptrs[i]);
}

BENCH_OP static void op_pool(int n) { pool_op(pool, n); }

BENCH_OP static void op_pool_locked(int n) { pool_op(pool_locked, n); }

BENCH_OP static void op_pool_exhausted(int n)
{
	for (int i = 0; i < n; i++) {
		void *b = memtally_pool_get(pool_empty);
		if (!b) {
			b = malloc(BLOCK);
			memtally_account(BLOCK);
		}
		ptrs[i] = b;
		BENCH_ESCAPE(b);
	}
	/* Every block came from malloc (the pool had none to give). */
	for (int i = 0; i < n; i++) {
		memtally_account(-BLOCK);
		free(ptrs[i]);
	}
}

struct op_case {
	const char *name;
	void (*op)(int n);
};

static const struct op_case cases[] = {
    {"malloc_free", op_malloc_free},
    {"arena", op_arena},
    {"arena_reuse", op_arena_reuse},
    {"pool", op_pool},
    {"pool_exhausted", op_pool_exhausted},
    {"pool_locked", op_pool_locked},
};
#define NCASES (sizeof(cases) / sizeof(cases[0]))

static const struct op_case *find_case(const char *name)
{
	for (size_t i = 0; i < NCASES; i++)
		if (!strcmp(cases[i].name, name))
			return &cases[i];
	return NULL;
}

static int setup(void)
{
	if (memtally_arena_create(&reuse_arena, 0, 0))
		return -1;
	/* Enough blocks for the largest op, in one chunk. */
	if (memtally_pool_create(&pool, BLOCK, MAX_N, 0) ||
	    memtally_pool_create(&pool_locked, BLOCK, MAX_N,
	                         MEMTALLY_POOL_LOCKED) ||
	    memtally_pool_create(&pool_empty, BLOCK, 1, 0))
		return -1;
	pool_empty_block = memtally_pool_get(pool_empty);
	return pool_empty_block ? 0 : -1;
}

/*
 * The accounting half of the proof: run each case with N = MAX_N, looking
 * at memtally_process_bytes() in the middle of the op (after the
 * allocations) by hand-inlined copies of the ops.
 */
static void prove_accounting(struct bench_sbuf *js, struct bench_sbuf *why)
{
	int n = MAX_N;
	int64_t base = memtally_process_bytes();
	int64_t reuse0 = (int64_t)memtally_arena_accounted(reuse_arena);

	for (int i = 0; i < n; i++) {
		ptrs[i] = malloc(BLOCK);
		memtally_account(BLOCK);
	}
	int64_t mf = memtally_process_bytes() - base;
	op_malloc_free(0);
	for (int i = 0; i < n; i++) {
		memtally_account(-BLOCK);
		free(ptrs[i]);
	}
	if (mf != (int64_t)n * BLOCK)
		bench_flag(why, "malloc_free: process_bytes moved by %" PRId64
		                ", expected %d",
		           mf, n * BLOCK);

	memtally_arena *a;
	if (memtally_arena_create(&a, 0, 0))
		abort();
	for (int i = 0; i < n; i++)
		ptrs[i] = memtally_arena_alloc(a, BLOCK);
	int64_t ar = memtally_process_bytes() - base;
	int64_t ar_acc = (int64_t)memtally_arena_accounted(a);
	memtally_arena_destroy(a);
	if (ar != ar_acc || ar % CHUNK != 0 || ar < (int64_t)n * BLOCK)
		bench_flag(why, "arena: process_bytes moved by %" PRId64
		                "; expected whole %d-byte chunks holding %d "
		                "bytes (arena says %" PRId64 ")",
		           ar, CHUNK, n * BLOCK, ar_acc);

	int64_t before_pool = memtally_process_bytes();
	memtally_pool *p;
	if (memtally_pool_create(&p, BLOCK, MAX_N, 0))
		abort();
	int64_t pl = memtally_process_bytes() - before_pool;
	int64_t pl_acc = (int64_t)memtally_pool_accounted(p);
	pool_op(p, n);
	int64_t pl_after = memtally_process_bytes() - before_pool;
	memtally_pool_destroy(p);
	if (pl != pl_acc || pl < (int64_t)n * BLOCK || pl_after != pl)
		bench_flag(why, "pool: process_bytes moved by %" PRId64
		                " at creation (pool says %" PRId64 "), %" PRId64
		                " after an op",
		           pl, pl_acc, pl_after);

	for (size_t c = 0; c < NCASES; c++)
		cases[c].op(n);
	/* arena_reuse keeps its first chunk, accounted, on purpose. */
	int64_t kept = (int64_t)memtally_arena_accounted(reuse_arena) - reuse0;
	int64_t left = memtally_process_bytes() - base - kept;
	if (left != 0 || kept != CHUNK)
		bench_flag(why, "process_bytes is %+" PRId64 " after every case "
		                "ran and released (beyond the %" PRId64 " bytes "
		                "arena_reuse keeps; expected %d)",
		           left, kept, CHUNK);
	bench_sb_add(js,
	             ", \"malloc_free_moved\": %" PRId64
	             ", \"arena_moved\": %" PRId64 ", \"pool_moved\": %" PRId64
	             ", \"left\": %" PRId64,
	             mf, ar, pl, left);
}

static int serve(void)
{
	char line[256];
	setvbuf(stdout, NULL, _IOLBF, 0);
	while (fgets(line, sizeof(line), stdin)) {
		char cmd[16], name[32];
		int n = 0;
		unsigned long long ops = 0;
		int k = sscanf(line, "%15s %31s %d %llu", cmd, name, &n, &ops);
		if (k >= 1 && !strcmp(cmd, "quit"))
			return 0;
		const struct op_case *c = k == 4 ? find_case(name) : NULL;
		if (!c || strcmp(cmd, "run") || n < 1 || n > MAX_N || !ops) {
			printf("error bad command: %s", line);
			continue;
		}
		uint64_t t0 = bench_now_ns();
		for (unsigned long long i = 0; i < ops; i++)
			c->op(n);
		printf("ns %" PRIu64 "\n", bench_now_ns() - t0);
	}
	return 0;
}

/* --serve or --proof, --expect, --cpu. Returns -1 to go on, else the
 * exit code. */
static int parse_args(int argc, char **argv, const char **expect, int *cpu,
                      int *serving)
{
	for (int i = 1; i < argc; i++) {
		const char *a = argv[i];
		const char *v = i + 1 < argc ? argv[i + 1] : NULL;
		if (!strcmp(a, "--serve")) {
			*serving = 1;
		} else if (!strcmp(a, "--proof")) {
			*serving = 0;
		} else if (v && !strcmp(a, "--expect")) {
			*expect = v, i++;
		} else if (v && !strcmp(a, "--cpu")) {
			*cpu = atoi(v), i++;
		} else {
			fprintf(stderr,
			        "usage: " BENCH_BINARY " [--expect jemalloc|glibc] "
			        "[--cpu N] (--serve | --proof)\n");
			return 2;
		}
	}
	return -1;
}

int main(int argc, char **argv)
{
	const char *expect = NULL;
	int cpu = -1, serving = 0;
	bool expect_je;
	int rc = parse_args(argc, argv, &expect, &cpu, &serving);
	if (rc >= 0)
		return rc;
	if (!bench_expect_valid(expect) ||
	    bench_worker_setup(BENCH_BINARY, expect, cpu, &expect_je))
		return 2;
	if (setup()) {
		fprintf(stderr, BENCH_BINARY ": setup failed\n");
		return 2;
	}
	static struct bench_sbuf js, why;
	bench_sb_add(&js, "{\"binary\": \"" BENCH_BINARY "\", \"pid\": %d, ",
	             (int)getpid());
	bench_prove_allocator(expect_je, NULL, &js, &why);
	prove_accounting(&js, &why);
	bench_sb_add(&js, ", \"failed_signs\": %d}", why.fails);
	if ((rc = bench_proof_verdict(BENCH_BINARY, "", expect_je, serving, &js,
	                              &why)))
		return rc;
	return serving ? serve() : 0;
}
