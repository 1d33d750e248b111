/*
 * bench_common.h - what the C benchmarks share: a clock, CPU pinning,
 * percentiles, a bounded string builder, the proof of the allocator a
 * process actually runs on and how a worker's proof ends, and a memtallyd
 * started for a run.
 *
 * The allocator proof is several independent signs, each reported when it
 * fails (see bench/results/alloc_overhead.md): jemalloc's mallctl("version") answers or,
 * for glibc, no mallctl exists in the process;
 * malloc_usable_size(malloc(100)) is jemalloc's size class 112 or glibc's
 * 104; jemalloc's stats.allocated grows while 1 MiB is held; and dladdr()
 * of the global `malloc` names the library that serves it (libjemalloc or
 * libc, or a front end that wraps them). The accounting half of the proof
 * is each suite's own (what must move depends on what it measures), and so
 * is the evidence a preload gives of itself (alloc_overhead.c).
 *
 * A worker linked with -ljemalloc defines BENCH_LINKED_JEMALLOC before
 * including this.
 */
#ifndef MEMTALLY_BENCH_COMMON_H
#define MEMTALLY_BENCH_COMMON_H

#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <malloc.h>
#include <sched.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

/* Keeps the compiler from eliding an allocation: `p` escapes, memory is
 * clobbered. */
#define BENCH_ESCAPE(p) __asm__ __volatile__("" : : "r"(p) : "memory")

#define BENCH_JE_CLASS_100     112 /* jemalloc's size class for malloc(100) */
#define BENCH_GLIBC_USABLE_100 104 /* glibc: 112-byte chunk minus header */
#define BENCH_HOLD_BLOCKS      16
#define BENCH_HOLD_SIZE        (64 * 1024)

typedef int (*bench_mallctl_fn)(const char *, void *, size_t *, void *, size_t);

#ifdef BENCH_LINKED_JEMALLOC
/* Declared here rather than through <jemalloc/jemalloc.h>, which redefines
 * the malloc family's prototypes; referencing it keeps libjemalloc in
 * DT_NEEDED under --as-needed. */
int mallctl(const char *name, void *oldp, size_t *oldlenp, void *newp,
            size_t newlen);
#endif

static inline uint64_t bench_now_ns(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

static inline int bench_pin_cpu(int cpu)
{
	cpu_set_t set;
	CPU_ZERO(&set);
	CPU_SET(cpu, &set);
	return sched_setaffinity(0, sizeof(set), &set) ? -errno : 0;
}

/* Append printf output to a fixed buffer; never overflows. */
struct bench_sbuf {
	char b[4096];
	size_t n;
	int fails; /* lines added with bench_flag() */
};

static inline void bench_sb_vadd(struct bench_sbuf *s, const char *fmt,
                                 va_list ap)
{
	if (s->n >= sizeof(s->b) - 1)
		return;
	int k = vsnprintf(s->b + s->n, sizeof(s->b) - s->n, fmt, ap);
	if (k > 0)
		s->n += (size_t)k;
	if (s->n >= sizeof(s->b))
		s->n = sizeof(s->b) - 1;
}

__attribute__((format(printf, 2, 3))) static inline void
bench_sb_add(struct bench_sbuf *s, const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	bench_sb_vadd(s, fmt, ap);
	va_end(ap);
}

/* One failed sign of a proof: a line of `why`. */
__attribute__((format(printf, 2, 3))) static inline void
bench_flag(struct bench_sbuf *why, const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	bench_sb_add(why, "  - ");
	bench_sb_vadd(why, fmt, ap);
	bench_sb_add(why, "\n");
	va_end(ap);
	why->fails++;
}

/* A JSON string (escaping what JSON requires). */
static inline void bench_sb_json_str(struct bench_sbuf *s, const char *v)
{
	if (!v) {
		bench_sb_add(s, "null");
		return;
	}
	bench_sb_add(s, "\"");
	for (; *v; v++) {
		unsigned char c = (unsigned char)*v;
		if (c == '"' || c == '\\')
			bench_sb_add(s, "\\%c", c);
		else if (c < 0x20)
			bench_sb_add(s, "\\u%04x", c);
		else
			bench_sb_add(s, "%c", c);
	}
	bench_sb_add(s, "\"");
}

static inline bench_mallctl_fn bench_mallctl(void)
{
#ifdef BENCH_LINKED_JEMALLOC
	return mallctl;
#else
	bench_mallctl_fn f;
	*(void **)&f = dlsym(RTLD_DEFAULT, "mallctl");
	return f;
#endif
}

static inline int bench_je_allocated(bench_mallctl_fn mc, size_t *out)
{
	uint64_t epoch = 1;
	size_t sz = sizeof(epoch);
	if (!mc || mc("epoch", &epoch, &sz, &epoch, sz))
		return -1;
	sz = sizeof(*out);
	return mc("stats.allocated", out, &sz, NULL, 0) ? -1 : 0;
}

/* What the allocator proof finds in this process. */
struct bench_alloc_facts {
	bench_mallctl_fn mc;
	const char *version;     /* mallctl("version"), or NULL */
	size_t usable;           /* malloc_usable_size(malloc(100)) */
	const char *malloc_from; /* the library that defines malloc */
	int have_stats;
	int64_t stats_delta; /* stats.allocated's growth while 1 MiB is held */
};

static inline void bench_alloc_facts(struct bench_alloc_facts *f)
{
	*f = (struct bench_alloc_facts){.mc = bench_mallctl(),
	                                .malloc_from = "?"};
	if (f->mc) {
		size_t sz = sizeof(f->version);
		if (f->mc("version", &f->version, &sz, NULL, 0))
			f->version = NULL;
	}

	void *p = malloc(100);
	BENCH_ESCAPE(p);
	f->usable = malloc_usable_size(p);
	free(p);

	Dl_info info;
	void *sym = dlsym(RTLD_DEFAULT, "malloc");
	if (sym && dladdr(sym, &info) && info.dli_fname)
		f->malloc_from = info.dli_fname;

	size_t a0 = 0, a1 = 0;
	f->have_stats = bench_je_allocated(f->mc, &a0) == 0;
	void *blk[BENCH_HOLD_BLOCKS];
	for (int i = 0; i < BENCH_HOLD_BLOCKS; i++) {
		blk[i] = malloc(BENCH_HOLD_SIZE);
		BENCH_ESCAPE(blk[i]);
	}
	if (f->have_stats)
		f->have_stats = bench_je_allocated(f->mc, &a1) == 0;
	for (int i = 0; i < BENCH_HOLD_BLOCKS; i++)
		free(blk[i]);
	f->stats_delta = f->have_stats ? (int64_t)a1 - (int64_t)a0 : 0;
}

static inline void bench_check_jemalloc(const struct bench_alloc_facts *f,
                                        struct bench_sbuf *why)
{
	int64_t held = (int64_t)BENCH_HOLD_BLOCKS * BENCH_HOLD_SIZE;
	if (!f->mc)
		bench_flag(why, "no mallctl in the process "
		                "(dlsym(RTLD_DEFAULT, \"mallctl\") is NULL): "
		                "jemalloc is not loaded");
	else if (!f->version)
		bench_flag(why, "mallctl(\"version\") failed");
	if (f->usable != BENCH_JE_CLASS_100)
		bench_flag(why,
		           "malloc_usable_size(malloc(100)) = %zu; "
		           "jemalloc's size class is %d (glibc gives %d)",
		           f->usable, BENCH_JE_CLASS_100,
		           BENCH_GLIBC_USABLE_100);
	if (!f->have_stats || f->stats_delta < held)
		bench_flag(why,
		           "jemalloc stats.allocated grew by %" PRId64
		           " bytes while %" PRId64 " were held%s",
		           f->stats_delta, held,
		           f->have_stats ? "" : " (no stats)");
}

static inline void bench_check_glibc(const struct bench_alloc_facts *f,
                                     struct bench_sbuf *why)
{
	if (f->mc)
		bench_flag(why, "mallctl is present: jemalloc is "
		                "loaded, expected glibc");
	if (f->usable != BENCH_GLIBC_USABLE_100)
		bench_flag(why,
		           "malloc_usable_size(malloc(100)) = %zu; "
		           "glibc gives %d",
		           f->usable, BENCH_GLIBC_USABLE_100);
}

/*
 * Prove which allocator serves malloc in this process. `malloc_lib` names
 * the library that must define the global malloc (a preload that wraps the
 * allocator), NULL for the allocator's own: libjemalloc, or libc.so.
 * Appends JSON fields (no braces) describing what was found to `js`, one
 * line per failed sign to `why`; returns the number of failed signs so far
 * in `why`.
 */
static inline int bench_prove_allocator(bool expect_jemalloc,
                                        const char *malloc_lib,
                                        struct bench_sbuf *js,
                                        struct bench_sbuf *why)
{
	struct bench_alloc_facts f;
	bench_alloc_facts(&f);
	if (expect_jemalloc)
		bench_check_jemalloc(&f, why);
	else
		bench_check_glibc(&f, why);
	if (!malloc_lib)
		malloc_lib = expect_jemalloc ? "libjemalloc" : "libc.so";
	if (!strstr(f.malloc_from, malloc_lib))
		bench_flag(why,
		           "the global malloc is defined in %s, expected %s",
		           f.malloc_from, malloc_lib);

	bench_sb_add(js, "\"expect\": \"%s\", \"jemalloc_version\": ",
	             expect_jemalloc ? "jemalloc" : "glibc");
	bench_sb_json_str(js, f.version);
	bench_sb_add(js,
	             ", \"usable_size_100\": %zu, \"malloc_from\": ", f.usable);
	bench_sb_json_str(js, f.malloc_from);
	bench_sb_add(js, ", \"stats_allocated_delta\": %" PRId64,
	             f.stats_delta);
	return why->fails;
}

/* --expect's value: absent, jemalloc or glibc. */
static inline bool bench_expect_valid(const char *expect)
{
	return !expect || !strcmp(expect, "jemalloc") ||
	       !strcmp(expect, "glibc");
}

/*
 * What a worker sets up before its proof: the allocator it expects
 * (--expect's, valid, or by default the one the binary is linked with),
 * and --cpu's pinning (if >= 0). Returns 0, or the exit code 2.
 */
static inline int bench_worker_setup(const char *binary, const char *expect,
                                     int cpu, bool *expect_je)
{
#ifdef BENCH_LINKED_JEMALLOC
	*expect_je = expect ? !strcmp(expect, "jemalloc") : true;
#else
	*expect_je = expect ? !strcmp(expect, "jemalloc") : false;
#endif
	if (cpu >= 0 && bench_pin_cpu(cpu)) {
		fprintf(stderr, "%s: cannot pin to CPU %d\n", binary, cpu);
		return 2;
	}
	return 0;
}

/*
 * The end of a worker's proof. A failed one goes to stderr with every
 * wrong sign and what was found, and the exit code 3 is returned;
 * otherwise the proof goes to stdout as "ready JSON" when the worker
 * serves a driver, to stderr as "proof: JSON" when not, and 0 is returned.
 * `what` names the configuration proved in a failure (" for variant X"),
 * or is "".
 */
static inline int bench_proof_verdict(const char *binary, const char *what,
                                      bool expect_je, bool serving,
                                      const struct bench_sbuf *js,
                                      const struct bench_sbuf *why)
{
	if (why->fails) {
		fprintf(stderr,
		        "%s: PROOF FAILED%s (expected allocator %s): "
		        "%d sign(s) wrong:\n%s  found: %s\n",
		        binary, what, expect_je ? "jemalloc" : "glibc",
		        why->fails, why->b, js->b);
		return 3;
	}
	if (serving) {
		printf("ready %s\n", js->b);
		fflush(stdout);
	} else {
		fprintf(stderr, "proof: %s\n", js->b);
	}
	return 0;
}

/* qsort's comparison of two uint64_t, for medians and percentiles. */
static inline int bench_cmp_u64(const void *a, const void *b)
{
	uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
	return x < y ? -1 : x > y;
}

/* The summary of timed runs: sorts `t` (n > 0). */
struct bench_pcts {
	uint64_t p50, p99, min, max;
};

static inline struct bench_pcts bench_percentiles(uint64_t *t, size_t n)
{
	qsort(t, n, sizeof(t[0]), bench_cmp_u64);
	return (struct bench_pcts){.p50 = t[n / 2],
	                           .p99 = t[n * 99 / 100],
	                           .min = t[0],
	                           .max = t[n - 1]};
}

static inline void bench_nap_us(long us)
{
	struct timespec ts = {.tv_sec = us / 1000000,
	                      .tv_nsec = (us % 1000000) * 1000};
	nanosleep(&ts, NULL);
}

#endif /* MEMTALLY_BENCH_COMMON_H */
