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
#include <malloc.h>
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
/* Declared here rather than through <jemalloc/jemalloc.h>, which redefines
 * the malloc family's prototypes. Referencing it also keeps libjemalloc in
 * DT_NEEDED under --as-needed. */
int mallctl(const char *name, void *oldp, size_t *oldlenp, void *newp,
            size_t newlen);
#define BENCH_BINARY "bench_alloc_je"
#else
#define BENCH_BINARY "bench_alloc_plain"
#endif

/* The helpers every suite shares: clock, pinning, the allocator proof's
 * string buffers, BENCH_ESCAPE. */
#include "bench_common.h"

#define HOLD_BLOCKS      BENCH_HOLD_BLOCKS
#define HOLD_SIZE        BENCH_HOLD_SIZE
#define HOLD_BYTES       ((int64_t)HOLD_BLOCKS * HOLD_SIZE)
#define JE_CLASS_100     BENCH_JE_CLASS_100
#define GLIBC_USABLE_100 BENCH_GLIBC_USABLE_100

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
 * almost never (RESULTS.md, "Flushes per pair").
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

typedef bench_mallctl_fn mallctl_fn;

/* The process's view of the allocator and of memtally, resolved once. */
static struct {
	enum variant variant;
	int expect_jemalloc;
	mallctl_fn mallctl;
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
	g.mallctl = mallctl;
	g.process_bytes = memtally_process_bytes;
	g.flush = memtally_flush;
	g.attached = memtally_attached;
#else
	*(void **)&g.mallctl = dlsym(RTLD_DEFAULT, "mallctl");
	*(void **)&g.process_bytes =
	    dlsym(RTLD_DEFAULT, "memtally_process_bytes");
	*(void **)&g.flush = dlsym(RTLD_DEFAULT, "memtally_flush");
	*(void **)&g.attached = dlsym(RTLD_DEFAULT, "memtally_attached");
#endif
	*(void **)&g.preload_allocator =
	    dlsym(RTLD_DEFAULT, "memtally_preload_allocator");
}

static int je_allocated(size_t *out)
{
	return bench_je_allocated(g.mallctl, out);
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

/*
 * Prove the allocator and the accounting. Writes a JSON object describing
 * what was found into `js` and one line per failed sign into `why`.
 * Returns the number of failed signs.
 */
static int prove(struct bench_sbuf *js, struct bench_sbuf *why)
{
	/* Sign 1: jemalloc's control interface. */
	const char *version = NULL;
	if (g.mallctl) {
		size_t sz = sizeof(version);
		if (g.mallctl("version", &version, &sz, NULL, 0))
			version = NULL;
	}

	/* Sign 2: the size class of a 100-byte block. */
	void *p = malloc(100);
	BENCH_ESCAPE(p);
	size_t usable = malloc_usable_size(p);
	free(p);

	/* Sign 3: which library the global `malloc` symbol lives in. */
	const char *malloc_from = "?";
	Dl_info info;
	void *sym = dlsym(RTLD_DEFAULT, "malloc");
	if (sym && dladdr(sym, &info) && info.dli_fname)
		malloc_from = info.dli_fname;

	/* Preload's own answer (only present under the preload). */
	const char *pre = g.preload_allocator ? g.preload_allocator() : NULL;

	/* Signs 4 and 5: hold 1 MiB; jemalloc's stats and memtally's total
	 * must both see it. */
	size_t a0 = 0, a1 = 0;
	int have_stats = je_allocated(&a0) == 0;
	int64_t m0 = 0, m1 = 0, m2 = 0;
	if (g.flush)
		g.flush();
	if (g.process_bytes)
		m0 = g.process_bytes();
	void *blk[HOLD_BLOCKS];
	hold(blk);
	if (have_stats)
		have_stats = je_allocated(&a1) == 0;
	if (g.flush)
		g.flush();
	if (g.process_bytes)
		m1 = g.process_bytes();
	unhold(blk);
	if (g.flush)
		g.flush();
	if (g.process_bytes)
		m2 = g.process_bytes();
	int64_t stats_delta = have_stats ? (int64_t)a1 - (int64_t)a0 : 0;
	bool attached = g.attached ? g.attached() : false;

	if (g.expect_jemalloc) {
		if (!g.mallctl)
			bench_flag(why, "no mallctl in the process "
			          "(dlsym(RTLD_DEFAULT, \"mallctl\") is "
			          "NULL): jemalloc is not loaded");
		else if (!version)
			bench_flag(why, "mallctl(\"version\") failed");
		if (usable != JE_CLASS_100)
			bench_flag(why,
			     "malloc_usable_size(malloc(100)) = "
			     "%zu; jemalloc's size class is %d "
			     "(glibc gives %d)",
			     usable, JE_CLASS_100, GLIBC_USABLE_100);
		if (!have_stats || stats_delta < HOLD_BYTES)
			bench_flag(why,
			     "jemalloc stats.allocated grew by "
			     "%" PRId64 " bytes while %" PRId64 " were held%s",
			     stats_delta, HOLD_BYTES,
			     have_stats ? "" : " (no stats)");
		const char *want = g.variant == V_PRELOAD
		                       ? "libmemtally_preload"
		                       : "libjemalloc";
		if (!strstr(malloc_from, want))
			bench_flag(why,
			     "the global malloc is defined in %s, "
			     "expected %s",
			     malloc_from, want);
		if (g.variant == V_PRELOAD &&
		    (!pre || strncmp(pre, "jemalloc", 8) != 0))
			bench_flag(why,
			     "memtally_preload_allocator() = %s; "
			     "expected \"jemalloc <version>\"",
			     pre ? pre : "(absent: preload not loaded)");
	} else {
		if (g.mallctl)
			bench_flag(why, "mallctl is present: jemalloc "
			          "is loaded, expected glibc");
		if (usable != GLIBC_USABLE_100)
			bench_flag(why,
			     "malloc_usable_size(malloc(100)) = "
			     "%zu; glibc gives %d",
			     usable, GLIBC_USABLE_100);
		const char *want = g.variant == V_GLIBCFE
		                       ? "libmemtally_glibc"
		                       : "libc.so";
		if (!strstr(malloc_from, want))
			bench_flag(why,
			     "the global malloc is defined in %s, "
			     "expected %s",
			     malloc_from, want);
		if (g.variant == V_GLIBCFE &&
		    (!pre || strncmp(pre, "glibc", 5) != 0))
			bench_flag(why,
			     "memtally_preload_allocator() = %s; "
			     "expected \"glibc <version>\"",
			     pre ? pre : "(absent: front end not loaded)");
	}

	int64_t held = m1 - m0, left = m2 - m0;
	if (g.variant == V_INLINE || g.variant == V_PRELOAD ||
	    g.variant == V_LINKED || g.variant == V_GLIBCFE) {
		if (!g.process_bytes)
			bench_flag(why, "memtally_process_bytes not "
			          "found: no accounting loaded");
		else if (held < HOLD_BYTES ||
		         held > HOLD_BYTES + MEMTALLY_DEFAULT_THRESHOLD)
			bench_flag(why,
			     "memtally_process_bytes() moved by "
			     "%" PRId64 " while %" PRId64 " bytes were held",
			     held, HOLD_BYTES);
		else if (left < -MEMTALLY_DEFAULT_THRESHOLD ||
		         left > MEMTALLY_DEFAULT_THRESHOLD)
			bench_flag(why,
			     "memtally_process_bytes() still "
			     "%+" PRId64 " after the blocks were "
			     "freed",
			     left);
	} else if (g.process_bytes && (held != 0 || left != 0)) {
		bench_flag(why,
		     "accounting is off, yet "
		     "memtally_process_bytes() moved by %" PRId64,
		     held);
	}
	if (g.variant != V_PRELOAD && g.variant != V_GLIBCFE && pre)
		bench_flag(why, "libmemtally_preload is loaded in a "
		          "variant that must not use it");

	bench_sb_add(js,
	       "{\"variant\": \"%s\", \"binary\": \"%s\", "
	       "\"expect\": \"%s\", \"pid\": %d, \"jemalloc_version\": ",
	       variant_names[g.variant], BENCH_BINARY,
	       g.expect_jemalloc ? "jemalloc" : "glibc", (int)getpid());
	bench_sb_json_str(js, version);
	bench_sb_add(js, ", \"usable_size_100\": %zu, \"malloc_from\": ", usable);
	bench_sb_json_str(js, malloc_from);
	bench_sb_add(js, ", \"preload_allocator\": ");
	bench_sb_json_str(js, pre);
	bench_sb_add(js, ", \"stats_allocated_delta\": %" PRId64, stats_delta);
	bench_sb_add(js, ", \"memtally_api\": %s",
	       g.process_bytes ? "true" : "false");
	bench_sb_add(js, ", \"process_bytes_held_delta\": %" PRId64, held);
	bench_sb_add(js, ", \"process_bytes_after_delta\": %" PRId64, left);
	bench_sb_add(js, ", \"attached\": %s", attached ? "true" : "false");
	bench_sb_add(js, ", \"lane_flushes\": %" PRId64, lane_flushes());
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

int main(int argc, char **argv)
{
	const char *variant = NULL, *expect = NULL, *case_name = NULL;
	unsigned long long iters = 0, reps = 1;
	int cpu = -1, do_serve = 0, proof_only = 0;
	for (int i = 1; i < argc; i++) {
		const char *a = argv[i];
		const char *v = i + 1 < argc ? argv[i + 1] : NULL;
		if (!strcmp(a, "--serve")) {
			do_serve = 1;
		} else if (!strcmp(a, "--proof")) {
			proof_only = 1;
		} else if (!strcmp(a, "--help")) {
			usage(stdout);
			return 0;
		} else if (v && !strcmp(a, "--variant")) {
			variant = v, i++;
		} else if (v && !strcmp(a, "--expect")) {
			expect = v, i++;
		} else if (v && !strcmp(a, "--case")) {
			case_name = v, i++;
		} else if (v && !strcmp(a, "--iters")) {
			iters = strtoull(v, NULL, 10), i++;
		} else if (v && !strcmp(a, "--reps")) {
			reps = strtoull(v, NULL, 10), i++;
		} else if (v && !strcmp(a, "--cpu")) {
			cpu = atoi(v), i++;
		} else if (v && !strcmp(a, "--segment")) {
			g.segment = v, i++;
		} else {
			fprintf(stderr, BENCH_BINARY ": bad argument: %s\n", a);
			usage(stderr);
			return 2;
		}
	}

	int vi = -1;
	for (int k = 0; k < V_COUNT && variant; k++)
		if (!strcmp(variant, variant_names[k]))
			vi = k;
#ifdef BENCH_LINKED_JEMALLOC
	int vok = vi == V_JEMALLOC || vi == V_INLINE || vi == V_LINKED;
#else
	int vok = vi == V_PRELOAD || vi == V_GLIBC || vi == V_GLIBCFE;
#endif
	{
		cpu_set_t set;
		ncpus = 0;
		if (!sched_getaffinity(0, sizeof(set), &set))
			for (int k = 0; k < CPU_SETSIZE && ncpus < MAX_THREADS;
			     k++)
				if (CPU_ISSET(k, &set))
					cpu_list[ncpus++] = k;
		if (!ncpus)
			cpu_list[ncpus++] = 0;
	}
	const struct bench_case *c = case_name ? find_case(case_name) : NULL;
	if (!vok ||
	    (expect && strcmp(expect, "jemalloc") && strcmp(expect, "glibc")) ||
	    (case_name && !c) || (!do_serve && !proof_only && (!c || !iters))) {
		fprintf(stderr,
		        BENCH_BINARY ": bad or missing "
		                     "--variant/--expect/--case/--iters\n");
		usage(stderr);
		return 2;
	}
	g.variant = (enum variant)vi;
	g.expect_jemalloc =
	    expect ? !strcmp(expect, "jemalloc")
	           : g.variant != V_GLIBC && g.variant != V_GLIBCFE;
	if (cpu >= 0 && bench_pin_cpu(cpu)) {
		fprintf(stderr, BENCH_BINARY ": cannot pin to CPU %d\n", cpu);
		return 2;
	}

	resolve_api();
#ifdef BENCH_LINKED_JEMALLOC
	int init_err = 0;
	if (g.variant == V_LINKED)
		init_err = memtally_init();
#endif
	static struct bench_sbuf js, why;
	int bad = prove(&js, &why);
#ifdef BENCH_LINKED_JEMALLOC
	if (init_err) {
		bench_flag(&why, "memtally_init() = %d (%s)", init_err,
		           memtally_strerror(init_err));
		bad = why.fails;
	}
#endif
	if (bad) {
		fprintf(stderr,
		        BENCH_BINARY
		        ": PROOF FAILED for variant %s "
		        "(expected allocator %s): %d sign(s) wrong:\n%s"
		        "  found: %s\n",
		        variant_names[g.variant],
		        g.expect_jemalloc ? "jemalloc" : "glibc", bad, why.b,
		        js.b);
		return 3;
	}
	if (do_serve) {
		printf("ready %s\n", js.b);
		fflush(stdout);
		return serve();
	}
	fprintf(stderr, "proof: %s\n", js.b);
	if (proof_only)
		return 0;
	for (unsigned long long r = 0; r < reps; r++) {
		uint64_t ns = timed_run(c, iters);
		printf("%s %s %.3f ns/op (%llu ops)\n", case_name,
		       variant_names[g.variant], (double)ns / (double)iters,
		       iters);
	}
	return 0;
}
