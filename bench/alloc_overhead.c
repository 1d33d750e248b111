/*
 * alloc_overhead.c - the worker of the alloc_overhead benchmark, the cases
 * of Comet's alloc_overhead benchmark (apache/datafusion-comet#5934).
 *
 * One process measures one variant: which allocator serves malloc and who
 * counts the bytes is fixed by how the process was linked and loaded, never
 * by a flag, so the same source is built twice:
 *
 *   bench_alloc_je     linked with -ljemalloc (jemalloc's malloc replaces
 *                      glibc's) and libmemtally (static). Variants
 *                      `jemalloc` (no accounting), `inline`
 *                      (memtally_account(+size) after malloc and
 *                      memtally_account(-size) before free, as a program
 *                      that knows its sizes would call it) and `linked`
 *                      (memtally_init() in every thread: jemalloc's
 *                      activity callback counts, nothing in the loop).
 *   bench_alloc_plain  linked with nothing special. Variant `glibc` run as
 *                      is, variant `preload` run under
 *                      LD_PRELOAD=libmemtally_preload.so, variant `glibcfe`
 *                      under LD_PRELOAD=libmemtally_glibc.so (glibc's
 *                      malloc, counted by the glibc front end).
 *
 * A benchmark that runs on the wrong allocator still prints plausible
 * numbers (the Comet run's first "jemalloc" baseline was glibc), so before measuring
 * anything the worker proves what it runs on and exits non-zero, naming
 * every failed sign, when the proof fails:
 *  - allocator: jemalloc's mallctl("version") answers (or, for glibc, no
 *    mallctl exists in the process); malloc_usable_size(malloc(100)) is
 *    jemalloc's size class 112 (glibc: 104); stats.allocated grows by the
 *    1 MiB the worker holds; dladdr() of the global `malloc` names the
 *    library that serves it; under the preload, memtally_preload_allocator()
 *    reports "jemalloc ...".
 *  - accounting: memtally_process_bytes() rises by 1 MiB (and not by twice
 *    that) while the worker holds 16 x 64 KiB, and falls back after; for the
 *    variants without accounting it does not move (or does not exist).
 *
 * Modes: `--serve` reads commands on stdin ("run CASE N", "probe CASE",
 * "quit") and answers one line each on stdout, so a driver can interleave
 * the variants' repetitions while every worker stays warm; `--case CASE
 * --iters N` runs once and prints ns per pair. Diagnostics go to stderr.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <sched.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "memtally.h"
#include "mtshm.h"

#ifdef BENCH_LINKED_JEMALLOC
#define BENCH_BINARY "bench_alloc_je"
#else
#define BENCH_BINARY "bench_alloc_plain"
#endif

/* The helpers every suite shares: clock, pinning, the allocator proof and
 * its string buffers, BENCH_ESCAPE. */
#include "bench_common.h"

#define HOLD_BLOCKS      BENCH_HOLD_BLOCKS
#define HOLD_SIZE        BENCH_HOLD_SIZE
#define HOLD_BYTES       ((int64_t)HOLD_BLOCKS * HOLD_SIZE)

/* What one op of a case does (one timed unit; see each body below). */
enum kind { K_PAIR, K_FILL, K_GROW, K_CHURN };

struct bench_case {
	const char *name;
	size_t size;
	enum kind kind;
	int parallel; /* run on all CPUs: name ends in _x<threads> (or, for
	               * threshold_churn, always all CPUs) */
};

/* The reference's single-thread cases, plus one beyond them: 80 KiB (a
 * jemalloc size class) is over the 64 KiB threshold, so the inline API
 * flushes on every call. At exactly 64 KiB the flush probe of the current
 * client shows the inline API flushing on every call too, the preload
 * almost never (bench/results/alloc_overhead.md, "Flushes per pair").
 * Then the reference's other cases:
 *  - alloc_fill_free_64kb: malloc 64 KiB, memset all of it, free.
 *  - grow_vec_to_64kb: one op = a vector of 8-byte elements grown by push
 *    from a 16-byte malloc, realloc doubling its capacity when full, up to
 *    64 KiB (8192 pushes, 12 reallocs), then freed. The inline variant
 *    accounts each capacity change (+new -old) and -cap at free.
 *  - threshold_churn: all CPUs, thread i pinned to CPU i. One op = two
 *    48 KiB mallocs held in a 2-slot ring, then both freed (2 pairs; the
 *    time reported is per pair per thread). A thread's drift goes
 *    +48K, +96K (crosses +64K: flush), -48K, -96K (crosses -64K: flush):
 *    two flushes per op into the shared counter from every thread at once,
 *    the parallel case around the flush threshold.
 *  - parallel_alloc_free_{32,64}kb_x<N>: alloc_free on N threads started
 *    together behind a barrier, thread i pinned to CPU i; ns per pair per
 *    thread = wall time from the barrier to the last thread's end / pairs. */
static const struct bench_case cases[] = {
    {"alloc_free_16b", 16, K_PAIR, 0},
    {"alloc_free_256b", 256, K_PAIR, 0},
    {"alloc_free_4096b", 4096, K_PAIR, 0},
    {"alloc_free_32kb", 32 * 1024, K_PAIR, 0},
    {"alloc_free_64kb", 64 * 1024, K_PAIR, 0},
    {"alloc_free_80kb", 80 * 1024, K_PAIR, 0},
    {"alloc_fill_free_64kb", 64 * 1024, K_FILL, 0},
    {"grow_vec_to_64kb", 64 * 1024, K_GROW, 0},
    {"threshold_churn", 48 * 1024, K_CHURN, 1},
    {"parallel_alloc_free_32kb_x", 32 * 1024, K_PAIR, 1},
    {"parallel_alloc_free_64kb_x", 64 * 1024, K_PAIR, 1},
};

#define MAX_THREADS 256
/* The CPUs this process may use, recorded before it pins itself. */
static int ncpus;
static int cpu_list[MAX_THREADS];

enum variant {
	V_JEMALLOC,
	V_INLINE,
	V_PRELOAD,
	V_GLIBC,
	V_LINKED,
	V_GLIBCFE,
	V_COUNT
};
static const char *const variant_names[] = {
    "jemalloc", "inline", "preload", "glibc", "linked", "glibcfe"};

/* The process's view of the allocator and of memtally, resolved once. */
static struct {
	enum variant variant;
	int expect_jemalloc;
	int64_t (*process_bytes)(void);
	int (*flush)(void);
	bool (*attached)(void);
	const char *(*preload_allocator)(void);
	const char *segment; /* label of the server's objects, for lane
	                        flush counts */
} g;

/* ---- the timed loops ------------------------------------------------- */

/* Not inlined, not cloned: one symbol each, so callgrind can count just
 * these (--toggle-collect=bench_loop_*) and each variant runs the same
 * machine code apart from the accounting. */
#if defined(__clang__)
#define BENCH_LOOP __attribute__((noinline, aligned(64)))
#else
#define BENCH_LOOP __attribute__((noinline, noclone, aligned(64)))
#endif
BENCH_LOOP uint64_t bench_loop_plain(size_t size, uint64_t n)
{
	for (uint64_t i = 0; i < n; i++) {
		void *p = malloc(size);
		BENCH_ESCAPE(p);
		free(p);
	}
	return n;
}

#ifdef BENCH_LINKED_JEMALLOC
BENCH_LOOP uint64_t bench_loop_inline(size_t size, uint64_t n)
{
	for (uint64_t i = 0; i < n; i++) {
		void *p = malloc(size);
		memtally_account((int64_t)size);
		BENCH_ESCAPE(p);
		memtally_account(-(int64_t)size);
		free(p);
	}
	return n;
}
#endif

/* The bodies of the other cases; `acct` is a constant at every call site,
 * so each loop below is specialised, as the pair loops are: 0 = no
 * accounting, 1 = memtally_account(), 2 = memtally_account() counting the
 * calls that flushed (for the probe, never timed). */
#ifdef BENCH_LINKED_JEMALLOC
static int probe_flush_count;
#endif

static inline __attribute__((always_inline)) void acct_add(int acct,
                                                           int64_t d)
{
#ifdef BENCH_LINKED_JEMALLOC
	if (acct == 1) {
		memtally_account(d);
	} else if (acct == 2) {
		/* A flush re-centres `biased`: the add is not seen in it. */
		uint64_t b = memtally__t.biased;
		memtally_account(d);
		probe_flush_count += memtally__t.biased != b + (uint64_t)d;
	}
#else
	(void)acct;
	(void)d;
#endif
}

static inline __attribute__((always_inline)) void
body_fill(int acct, size_t size, uint64_t i)
{
	void *p = malloc(size);
	acct_add(acct, (int64_t)size);
	memset(p, (int)(i & 0xff), size);
	BENCH_ESCAPE(p);
	acct_add(acct, -(int64_t)size);
	free(p);
}

/* The growth step is out of line, as a real vector's is (Rust's
 * RawVec::grow_one, C++'s _M_realloc_insert): the push loop is then the
 * same machine code in every variant, and only the 12 growths and the
 * final free differ by the accounting. With it inlined, the inline API's
 * calls changed the register allocation of the push loop itself and the
 * difference measured was that, not the accounting. */
struct vec {
	uint64_t *v;
	size_t cap;
}; /* returned in two registers: the push loop keeps both in registers */
#define DEFINE_GROW(name, acct)                                              \
	static __attribute__((noinline)) struct vec name(struct vec a)        \
	{                                                                     \
		uint64_t *nv = realloc(a.v, a.cap * 2);                       \
		if (!nv)                                                      \
			abort();                                              \
		acct_add(acct, (int64_t)a.cap); /* +2cap -cap */              \
		return (struct vec){nv, a.cap * 2};                           \
	}
DEFINE_GROW(grow_plain, 0)
#ifdef BENCH_LINKED_JEMALLOC
DEFINE_GROW(grow_inline, 1)
DEFINE_GROW(grow_probe, 2)
#endif

static inline __attribute__((always_inline)) void body_grow(int acct,
                                                            size_t limit)
{
	struct vec a = {malloc(16), 16};
	size_t len = 0;
	acct_add(acct, (int64_t)a.cap);
	while (len * sizeof(*a.v) < limit) {
		if (__builtin_expect((len + 1) * sizeof(*a.v) > a.cap, 0)) {
#ifdef BENCH_LINKED_JEMALLOC
			a = acct == 2   ? grow_probe(a)
			    : acct == 1 ? grow_inline(a)
			                : grow_plain(a);
#else
			a = grow_plain(a);
#endif
		}
		a.v[len] = len;
		len++;
		BENCH_ESCAPE(a.v);
	}
	size_t cap = a.cap;
	uint64_t *v = a.v;
	acct_add(acct, -(int64_t)cap);
	free(v);
}

static inline __attribute__((always_inline)) void body_churn(int acct,
                                                             size_t size)
{
	void *ring[2];
	ring[0] = malloc(size);
	acct_add(acct, (int64_t)size);
	BENCH_ESCAPE(ring[0]);
	ring[1] = malloc(size);
	acct_add(acct, (int64_t)size);
	BENCH_ESCAPE(ring[1]);
	acct_add(acct, -(int64_t)size);
	free(ring[0]);
	acct_add(acct, -(int64_t)size);
	free(ring[1]);
}

/* The push loop of grow_vec_to_64kb is ~9 instructions run 8192 times per
 * op, so where it falls relative to 32-byte fetch blocks decides its speed:
 * with default alignment it sat inside one block in bench_loop_grow_plain
 * and straddled two in bench_loop_grow_inline (the accounting before it
 * shifted it by 40 bytes), and the inline variant measured +2.5 us per op
 * (+45%) for +390 instructions, all of them outside that loop. Both loops
 * are aligned to 64 bytes so they differ only by the accounting. */
#if defined(__GNUC__) && !defined(__clang__)
#define BENCH_GROW_LOOP BENCH_LOOP __attribute__((optimize("align-loops=64")))
#else
#define BENCH_GROW_LOOP BENCH_LOOP
#endif

BENCH_LOOP uint64_t bench_loop_fill_plain(size_t size, uint64_t n)
{
	for (uint64_t i = 0; i < n; i++)
		body_fill(0, size, i);
	return n;
}
BENCH_GROW_LOOP uint64_t bench_loop_grow_plain(size_t size, uint64_t n)
{
	for (uint64_t i = 0; i < n; i++)
		body_grow(0, size);
	return n;
}
BENCH_LOOP uint64_t bench_loop_churn_plain(size_t size, uint64_t n)
{
	for (uint64_t i = 0; i < n; i++)
		body_churn(0, size);
	return n;
}
#ifdef BENCH_LINKED_JEMALLOC
BENCH_LOOP uint64_t bench_loop_fill_inline(size_t size, uint64_t n)
{
	for (uint64_t i = 0; i < n; i++)
		body_fill(1, size, i);
	return n;
}
BENCH_GROW_LOOP uint64_t bench_loop_grow_inline(size_t size, uint64_t n)
{
	for (uint64_t i = 0; i < n; i++)
		body_grow(1, size);
	return n;
}
BENCH_LOOP uint64_t bench_loop_churn_inline(size_t size, uint64_t n)
{
	for (uint64_t i = 0; i < n; i++)
		body_churn(1, size);
	return n;
}

/* The flush probe's copy of the three loops above (not timed). */
static __attribute__((noinline)) int probe_loop_tls(int kind, size_t size,
                                                    uint64_t n)
{
	probe_flush_count = 0;
	for (uint64_t i = 0; i < n; i++) {
		if (kind == K_FILL)
			body_fill(2, size, i);
		else if (kind == K_GROW)
			body_grow(2, size);
		else
			body_churn(2, size);
	}
	return probe_flush_count;
}
#endif

static uint64_t run_loop(const struct bench_case *c, uint64_t n)
{
	size_t size = c->size;
#ifdef BENCH_LINKED_JEMALLOC
	if (g.variant == V_INLINE) {
		switch (c->kind) {
		case K_FILL:
			return bench_loop_fill_inline(size, n);
		case K_GROW:
			return bench_loop_grow_inline(size, n);
		case K_CHURN:
			return bench_loop_churn_inline(size, n);
		default:
			return bench_loop_inline(size, n);
		}
	}
#endif
	switch (c->kind) {
	case K_FILL:
		return bench_loop_fill_plain(size, n);
	case K_GROW:
		return bench_loop_grow_plain(size, n);
	case K_CHURN:
		return bench_loop_churn_plain(size, n);
	default:
		return bench_loop_plain(size, n);
	}
}

/* ---- parallel runs ------------------------------------------------------ */

struct par_thread {
	pthread_t tid;
	int cpu;
	const struct bench_case *c;
	uint64_t n;
	pthread_barrier_t *bar;
	uint64_t t0, t1;
	int pin_err;
};

static void *par_main(void *arg)
{
	struct par_thread *t = arg;
	cpu_set_t set;
	CPU_ZERO(&set);
	CPU_SET(t->cpu, &set);
	t->pin_err = pthread_setaffinity_np(pthread_self(), sizeof(set), &set);
#ifdef BENCH_LINKED_JEMALLOC
	/* A linked worker sets up each thread it starts. */
	if (g.variant == V_LINKED && memtally_init() != 0)
		t->pin_err = 1;
#endif
	/* A short warm-up of this thread's caches (allocator and memtally
	 * thread-local state), outside the timed region. */
	run_loop(t->c, t->n / 16 + 1);
	pthread_barrier_wait(t->bar);
	t->t0 = bench_now_ns();
	run_loop(t->c, t->n);
	t->t1 = bench_now_ns();
	return NULL;
}

/* Wall ns of n ops on each of `threads` threads, from the earliest start
 * after the barrier to the latest end; 0 on error. */
static uint64_t par_run(const struct bench_case *c, int threads, uint64_t n)
{
	static struct par_thread t[MAX_THREADS];
	pthread_barrier_t bar;
	pthread_barrier_init(&bar, NULL, (unsigned)threads);
	int started = 0, err = 0;
	for (int i = 0; i < threads; i++) {
		t[i] = (struct par_thread){.cpu = cpu_list[i % ncpus], .c = c,
		                           .n = n, .bar = &bar};
		if (pthread_create(&t[i].tid, NULL, par_main, &t[i])) {
			err = 1;
			break;
		}
		started++;
	}
	if (err) {
		/* Cannot release the barrier without all threads: give up. */
		fprintf(stderr, BENCH_BINARY ": pthread_create failed\n");
		exit(4);
	}
	uint64_t lo = UINT64_MAX, hi = 0;
	for (int i = 0; i < started; i++) {
		pthread_join(t[i].tid, NULL);
		if (t[i].pin_err)
			err = 1;
		if (t[i].t0 < lo)
			lo = t[i].t0;
		if (t[i].t1 > hi)
			hi = t[i].t1;
	}
	pthread_barrier_destroy(&bar);
	if (err)
		fprintf(stderr, BENCH_BINARY ": could not pin a thread\n");
	return err ? 0 : hi - lo;
}

/* Threads of a case: 1, or for a parallel one the _x<N> of its name (all
 * CPUs for threshold_churn). Stored by find_case(). */
static int case_threads;

/* Elapsed ns of n ops (wall, for a parallel case). */
static uint64_t timed_run(const struct bench_case *c, uint64_t n)
{
	if (c->parallel)
		return par_run(c, case_threads, n);
	uint64_t t0 = bench_now_ns();
	run_loop(c, n);
	return bench_now_ns() - t0;
}

/* ---- what the process runs on ------------------------------------------ */

static void resolve_api(void)
{
#ifdef BENCH_LINKED_JEMALLOC
	g.process_bytes = memtally_process_bytes;
	g.flush = memtally_flush;
	g.attached = memtally_attached;
#else
	*(void **)&g.process_bytes =
	    dlsym(RTLD_DEFAULT, "memtally_process_bytes");
	*(void **)&g.flush = dlsym(RTLD_DEFAULT, "memtally_flush");
	*(void **)&g.attached = dlsym(RTLD_DEFAULT, "memtally_attached");
#endif
	*(void **)&g.preload_allocator =
	    dlsym(RTLD_DEFAULT, "memtally_preload_allocator");
}

/*
 * Lane flushes of this process's slot, or -1. The client mapped the
 * server's header (read-only) and our uid's slot table (read-write) when it
 * registered: both are memfds named after the server's label (`--segment`),
 * the table "LABEL-slots:...". They are found in /proc/self/maps and read
 * where they are already mapped; the layout comes from the header, as the
 * client takes it (mtshm_layout_read).
 */
static int64_t lane_flushes(void)
{
	if (!g.segment)
		return -1;
	const char *label = g.segment + (g.segment[0] == '/');
	char hdr_name[256], tbl_prefix[256];
	snprintf(hdr_name, sizeof(hdr_name), "/memfd:%s (deleted)", label);
	snprintf(tbl_prefix, sizeof(tbl_prefix), "/memfd:%s-slots:", label);
	FILE *f = fopen("/proc/self/maps", "re");
	if (!f)
		return -1;
	struct {
		uintptr_t lo, hi;
	} tables[16];
	int ntables = 0;
	struct mtshm_layout layout;
	int have_layout = 0;
	char line[512];
	while (fgets(line, sizeof(line), f)) {
		line[strcspn(line, "\n")] = 0;
		const char *name = strstr(line, " /memfd:");
		unsigned long lo, hi;
		if (!name || sscanf(line, "%lx-%lx", &lo, &hi) != 2)
			continue;
		name++;
		if (!strcmp(name, hdr_name) &&
		    mtshm_layout_read((void *)lo, hi - lo, &layout) == 0)
			have_layout = 1; /* the latest attachment's, or an equal */
		else if (!strncmp(name, tbl_prefix, strlen(tbl_prefix)) &&
		         ntables < 16)
			tables[ntables].lo = lo, tables[ntables++].hi = hi;
	}
	fclose(f);
	if (!have_layout)
		return -1;
	uint32_t pid = (uint32_t)getpid();
	for (int t = 0; t < ntables; t++) {
		if (tables[t].hi - tables[t].lo < layout.table_size)
			continue;
		void *base = (void *)tables[t].lo;
		for (uint32_t i = 0; i < layout.slot_count; i++) {
			struct mtshm_slot_id *s = mtshm_slot(&layout, base, i);
			if (mtshm_load_acquire32(&s->pid) != pid)
				continue;
			uint64_t fl = 0;
			int absurd;
			mtshm_slot_sum(s, layout.lane_count, &fl, &absurd);
			return (int64_t)fl;
		}
	}
	return -1;
}

static void hold(void **blk)
{
	for (int i = 0; i < HOLD_BLOCKS; i++) {
		blk[i] = malloc(HOLD_SIZE);
		BENCH_ESCAPE(blk[i]);
#ifdef BENCH_LINKED_JEMALLOC
		if (g.variant == V_INLINE)
			memtally_account(HOLD_SIZE);
#endif
	}
}

static void unhold(void **blk)
{
	for (int i = 0; i < HOLD_BLOCKS; i++) {
#ifdef BENCH_LINKED_JEMALLOC
		if (g.variant == V_INLINE)
			memtally_account(-HOLD_SIZE);
#endif
		free(blk[i]);
	}
}

/* The library that must define the global malloc: the preload's, for the
 * variants that wrap the allocator; NULL for the allocator's own. */
static const char *malloc_lib(void)
{
	if (g.variant == V_PRELOAD)
		return "libmemtally_preload";
	if (g.variant == V_GLIBCFE)
		return "libmemtally_glibc";
	return NULL;
}

/* The preload's own evidence: memtally_preload_allocator() (only present
 * under a preload) names the allocator it serves, and it is absent in the
 * variants that must not load it. */
static void prove_preload(const char *pre, struct bench_sbuf *why)
{
	if (g.variant == V_PRELOAD &&
	    (!pre || strncmp(pre, "jemalloc", 8) != 0))
		bench_flag(why,
		           "memtally_preload_allocator() = %s; "
		           "expected \"jemalloc <version>\"",
		           pre ? pre : "(absent: preload not loaded)");
	if (g.variant == V_GLIBCFE && (!pre || strncmp(pre, "glibc", 5) != 0))
		bench_flag(why,
		           "memtally_preload_allocator() = %s; "
		           "expected \"glibc <version>\"",
		           pre ? pre : "(absent: front end not loaded)");
	if (g.variant != V_PRELOAD && g.variant != V_GLIBCFE && pre)
		bench_flag(why, "libmemtally_preload is loaded in a "
		                "variant that must not use it");
}

static int64_t process_bytes_now(void)
{
	if (g.flush)
		g.flush();
	return g.process_bytes ? g.process_bytes() : 0;
}

/* The accounting: memtally_process_bytes() rises by the 1 MiB held (not
 * by twice that) and falls back after, in the variants that count; in the
 * others it does not move (or does not exist). */
static void prove_accounting(struct bench_sbuf *js, struct bench_sbuf *why)
{
	void *blk[HOLD_BLOCKS];
	int64_t m0 = process_bytes_now();
	hold(blk);
	int64_t m1 = process_bytes_now();
	unhold(blk);
	int64_t m2 = process_bytes_now();
	int64_t held = m1 - m0, left = m2 - m0;
	if (g.variant == V_INLINE || g.variant == V_PRELOAD ||
	    g.variant == V_LINKED || g.variant == V_GLIBCFE) {
		if (!g.process_bytes)
			bench_flag(why, "memtally_process_bytes not "
			                "found: no accounting loaded");
		else if (held < HOLD_BYTES ||
		         held > HOLD_BYTES + MEMTALLY_DEFAULT_THRESHOLD)
			bench_flag(why,
			           "memtally_process_bytes() moved by %" PRId64
			           " while %" PRId64 " bytes were held",
			           held, HOLD_BYTES);
		else if (left < -MEMTALLY_DEFAULT_THRESHOLD ||
		         left > MEMTALLY_DEFAULT_THRESHOLD)
			bench_flag(why,
			           "memtally_process_bytes() still "
			           "%+" PRId64 " after the blocks were freed",
			           left);
	} else if (g.process_bytes && (held != 0 || left != 0)) {
		bench_flag(why,
		           "accounting is off, yet "
		           "memtally_process_bytes() moved by %" PRId64,
		           held);
	}
	bool attached = g.attached ? g.attached() : false;
	bench_sb_add(js, ", \"memtally_api\": %s",
	             g.process_bytes ? "true" : "false");
	bench_sb_add(js, ", \"process_bytes_held_delta\": %" PRId64, held);
	bench_sb_add(js, ", \"process_bytes_after_delta\": %" PRId64, left);
	bench_sb_add(js, ", \"attached\": %s", attached ? "true" : "false");
	bench_sb_add(js, ", \"lane_flushes\": %" PRId64, lane_flushes());
}

/*
 * Prove the allocator (bench_common.h), the preload's own evidence and the
 * accounting. Writes a JSON object describing what was found into `js` and
 * one line per failed sign into `why`. Returns the number of failed signs.
 */
static int prove(struct bench_sbuf *js, struct bench_sbuf *why)
{
	const char *pre = g.preload_allocator ? g.preload_allocator() : NULL;
	bench_sb_add(js,
	             "{\"variant\": \"%s\", \"binary\": \"%s\", "
	             "\"pid\": %d, ",
	             variant_names[g.variant], BENCH_BINARY, (int)getpid());
	bench_prove_allocator(g.expect_jemalloc, malloc_lib(), js, why);
	prove_preload(pre, why);
	bench_sb_add(js, ", \"preload_allocator\": ");
	bench_sb_json_str(js, pre);
	prove_accounting(js, why);
	bench_sb_add(js, ", \"failed_signs\": %d}", why->fails);
	return why->fails;
}

/* ---- flush probe -------------------------------------------------------- */

/*
 * How many flushes one pair of `size` causes, measured on a copy of the
 * timed loop. With a server, from this process's lane flush counter in its
 * slot; otherwise, for the inline API, from its thread-local state (a
 * flush re-centres `biased`, so the add is not seen in it). -1: unknown
 * (the preload without a server).
 */
static double probe_flushes(const struct bench_case *c, int pairs,
                            const char **method)
{
	size_t size = c->size;
	(void)size;
	int64_t f0 = lane_flushes();
	if (f0 >= 0) {
		/* One thread: the lane counter is per process. */
		run_loop(c, (uint64_t)pairs);
		*method = "slot";
		return (double)(lane_flushes() - f0) / pairs;
	}
#ifdef BENCH_LINKED_JEMALLOC
	if (g.variant == V_INLINE && c->kind != K_PAIR) {
		*method = "tls";
		return (double)probe_loop_tls(c->kind, size, (uint64_t)pairs) /
		       pairs;
	}
	if (g.variant == V_INLINE) {
		int n = 0;
		for (int i = 0; i < pairs; i++) {
			void *p = malloc(size);
			uint64_t b = memtally__t.biased;
			memtally_account((int64_t)size);
			n += memtally__t.biased != b + size;
			BENCH_ESCAPE(p);
			b = memtally__t.biased;
			memtally_account(-(int64_t)size);
			n += memtally__t.biased != b - size;
			free(p);
		}
		*method = "tls";
		return (double)n / pairs;
	}
#endif
	if (g.variant == V_JEMALLOC || g.variant == V_GLIBC) {
		*method = "none";
		return 0;
	}
	*method = "unknown";
	return -1;
}

/* ---- command line ------------------------------------------------------- */

static const struct bench_case *find_case(const char *name)
{
	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		const struct bench_case *c = &cases[i];
		size_t k = strlen(c->name);
		if (c->parallel && c->name[k - 1] == 'x') {
			char *end;
			if (strncmp(c->name, name, k))
				continue;
			long t = strtol(name + k, &end, 10);
			if (end == name + k || *end || t < 1 ||
			    t > MAX_THREADS)
				continue;
			case_threads = (int)t;
			return c;
		}
		if (!strcmp(c->name, name)) {
			case_threads = c->parallel ? ncpus : 1;
			return c;
		}
	}
	return NULL;
}

static void usage(FILE *f)
{
	fprintf(
	    f,
	    "usage: " BENCH_BINARY " --variant %s [--expect jemalloc|glibc]\n"
	    "         [--cpu N] [--segment NAME]\n"
	    "         (--serve | --proof | --case CASE --iters N [--reps R])\n"
	    "cases:",
#ifdef BENCH_LINKED_JEMALLOC
	    "jemalloc|inline|linked"
#else
	    "glibc|preload|glibcfe"
#endif
	);
	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++)
		fprintf(f, " %s%s", cases[i].name,
		        cases[i].name[strlen(cases[i].name) - 1] == 'x'
		            ? "<threads>"
		            : "");
	fprintf(f, "\n");
}

static int serve(void)
{
	char line[256];
	setvbuf(stdout, NULL, _IOLBF, 0);
	while (fgets(line, sizeof(line), stdin)) {
		char cmd[16], name[64];
		unsigned long long n = 0;
		int k = sscanf(line, "%15s %63s %llu", cmd, name, &n);
		if (k >= 1 && !strcmp(cmd, "quit"))
			return 0;
		const struct bench_case *c = k >= 2 ? find_case(name) : NULL;
		if (k == 3 && !strcmp(cmd, "run") && c && n > 0) {
			uint64_t ns = timed_run(c, n);
			if (ns)
				printf("ns %" PRIu64 "\n", ns);
			else
				printf("error run failed\n");
		} else if (k >= 2 && !strcmp(cmd, "probe") && c) {
			const char *method = "";
			double f = probe_flushes(c, 64, &method);
			printf("flushes %.3f %s\n", f, method);
		} else {
			printf("error bad command: %s", line);
		}
	}
	return 0;
}

/* The command line. */
struct opts {
	const char *variant, *expect, *case_name;
	unsigned long long iters, reps;
	int cpu, serve, proof_only;
};

/* Returns -1 to go on, else the exit code (0 after --help). */
static int parse_args(int argc, char **argv, struct opts *o)
{
	*o = (struct opts){.reps = 1, .cpu = -1};
	for (int i = 1; i < argc; i++) {
		const char *a = argv[i];
		const char *v = i + 1 < argc ? argv[i + 1] : NULL;
		if (!strcmp(a, "--serve")) {
			o->serve = 1;
		} else if (!strcmp(a, "--proof")) {
			o->proof_only = 1;
		} else if (!strcmp(a, "--help")) {
			usage(stdout);
			return 0;
		} else if (v && !strcmp(a, "--variant")) {
			o->variant = v, i++;
		} else if (v && !strcmp(a, "--expect")) {
			o->expect = v, i++;
		} else if (v && !strcmp(a, "--case")) {
			o->case_name = v, i++;
		} else if (v && !strcmp(a, "--iters")) {
			o->iters = strtoull(v, NULL, 10), i++;
		} else if (v && !strcmp(a, "--reps")) {
			o->reps = strtoull(v, NULL, 10), i++;
		} else if (v && !strcmp(a, "--cpu")) {
			o->cpu = atoi(v), i++;
		} else if (v && !strcmp(a, "--segment")) {
			g.segment = v, i++;
		} else {
			fprintf(stderr, BENCH_BINARY ": bad argument: %s\n", a);
			usage(stderr);
			return 2;
		}
	}
	return -1;
}

/* The variant named, if this binary can run it; -1 otherwise. */
static int find_variant(const char *name)
{
	int vi = -1;
	for (int k = 0; k < V_COUNT && name; k++)
		if (!strcmp(name, variant_names[k]))
			vi = k;
#ifdef BENCH_LINKED_JEMALLOC
	int ok = vi == V_JEMALLOC || vi == V_INLINE || vi == V_LINKED;
#else
	int ok = vi == V_PRELOAD || vi == V_GLIBC || vi == V_GLIBCFE;
#endif
	return ok ? vi : -1;
}

/* Record the CPUs this process may use, before it pins itself. */
static void record_cpus(void)
{
	cpu_set_t set;
	ncpus = 0;
	if (!sched_getaffinity(0, sizeof(set), &set))
		for (int k = 0; k < CPU_SETSIZE && ncpus < MAX_THREADS; k++)
			if (CPU_ISSET(k, &set))
				cpu_list[ncpus++] = k;
	if (!ncpus)
		cpu_list[ncpus++] = 0;
}

/* Check the options, set up the variant and pin. Returns 0 or the exit
 * code; `*c` is the case to run, if any. */
static int set_up(const struct opts *o, const struct bench_case **c)
{
	int vi = find_variant(o->variant);
	record_cpus();
	*c = o->case_name ? find_case(o->case_name) : NULL;
	if (vi < 0 ||
	    (o->expect && strcmp(o->expect, "jemalloc") &&
	     strcmp(o->expect, "glibc")) ||
	    (o->case_name && !*c) ||
	    (!o->serve && !o->proof_only && (!*c || !o->iters))) {
		fprintf(stderr,
		        BENCH_BINARY ": bad or missing "
		                     "--variant/--expect/--case/--iters\n");
		usage(stderr);
		return 2;
	}
	g.variant = (enum variant)vi;
	g.expect_jemalloc =
	    o->expect ? !strcmp(o->expect, "jemalloc")
	              : g.variant != V_GLIBC && g.variant != V_GLIBCFE;
	if (o->cpu >= 0 && bench_pin_cpu(o->cpu)) {
		fprintf(stderr, BENCH_BINARY ": cannot pin to CPU %d\n",
		        o->cpu);
		return 2;
	}
	resolve_api();
	return 0;
}

/* Prove the process (a linked worker sets up memtally first); the proof
 * is printed as bench_proof_verdict() says. Returns 0 or the exit code. */
static int prove_or_refuse(bool serving)
{
	static struct bench_sbuf js, why;
#ifdef BENCH_LINKED_JEMALLOC
	int init_err = g.variant == V_LINKED ? memtally_init() : 0;
#endif
	prove(&js, &why);
#ifdef BENCH_LINKED_JEMALLOC
	if (init_err)
		bench_flag(&why, "memtally_init() = %d (%s)", init_err,
		           memtally_strerror(init_err));
#endif
	char what[64];
	snprintf(what, sizeof(what), " for variant %s",
	         variant_names[g.variant]);
	return bench_proof_verdict(BENCH_BINARY, what, g.expect_jemalloc,
	                           serving, &js, &why);
}

/* --case: `reps` timed runs of `iters` ops, ns per op each. */
static void run_case(const struct opts *o, const struct bench_case *c)
{
	for (unsigned long long r = 0; r < o->reps; r++) {
		uint64_t ns = timed_run(c, o->iters);
		printf("%s %s %.3f ns/op (%llu ops)\n", o->case_name,
		       variant_names[g.variant], (double)ns / (double)o->iters,
		       o->iters);
	}
}

int main(int argc, char **argv)
{
	struct opts o;
	const struct bench_case *c;
	int rc = parse_args(argc, argv, &o);
	if (rc >= 0)
		return rc;
	if ((rc = set_up(&o, &c)) || (rc = prove_or_refuse(o.serve)))
		return rc;
	if (o.serve)
		return serve();
	if (!o.proof_only)
		run_case(&o, c);
	return 0;
}
