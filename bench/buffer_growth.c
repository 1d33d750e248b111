/*
 * buffer_growth.c - the worker of the buffer_growth benchmark.
 *
 * Arrow's BufferBuilder (ARROW-6450) chose 2x over 1.5x growth from three
 * cases: tiny (8-byte), small (700-byte) and large (1.5 MB) appends into
 * one builder, with jemalloc and with the system allocator. This worker
 * runs the same cases on memtally_buf, for both growth factors, with the
 * buffer's accounting on (memtally_account() per growth) and off
 * (MEMTALLY_NO_ACCOUNT), and reports nanoseconds per built buffer; the
 * driver (buffer_growth.py) turns that into bytes per second.
 *
 * Which allocator serves malloc is fixed by how the worker was linked, so
 * the source is built twice: bench_bufgrow_je (-ljemalloc) and
 * bench_bufgrow_glibc. Before measuring anything, the worker proves the
 * allocator (bench_common.h) and that the accounting moves: a buffer built
 * with accounting on must move memtally_process_bytes() by exactly its
 * capacity and back to zero after memtally_buf_free_data(); with it off,
 * not at all. Every timed run checks that again and fails loudly.
 *
 * `--serve` reads "run WRITE GROWTH ACCT" lines (WRITE tiny|small|large,
 * GROWTH 1.5|2, ACCT on|off) and answers "ns N cap C growths G moved M";
 * `--case WRITE --growth G --acct A` runs once. Diagnostics on stderr.
 */
#define _GNU_SOURCE
#include "bench_common.h"

#include <unistd.h>

#include "memtally.h"

#ifdef BENCH_LINKED_JEMALLOC
#define BENCH_BINARY "bench_bufgrow_je"
#else
#define BENCH_BINARY "bench_bufgrow_glibc"
#endif

struct write_case {
	const char *name;
	size_t chunk;
};

/* The chunk sizes of Arrow's builder-benchmark. */
static const struct write_case writes[] = {
    {"tiny", 8},
    {"small", 700},
    {"large", 1500000},
};

static size_t total_bytes = (size_t)64 << 20;
static uint8_t *src; /* the bytes appended, one large chunk's worth */

struct run_result {
	uint64_t ns;
	size_t cap;     /* capacity before finish */
	int growths;    /* reallocations */
	int64_t moved;  /* process_bytes change before finish */
	int64_t after;  /* process_bytes change after free */
};

#if defined(__clang__)
#define BENCH_LOOP __attribute__((noinline))
#else
#define BENCH_LOOP __attribute__((noinline, noclone))
#endif

/* Build one buffer of total_bytes in `chunk`-byte appends, finish it and
 * free what finish handed out. */
BENCH_LOOP static int build_one(size_t chunk, unsigned flags,
                                struct run_result *r)
{
	int64_t m0 = memtally_process_bytes();
	uint64_t t0 = bench_now_ns();
	memtally_buf b;
	memtally_buf_init(&b, flags);
	size_t n = total_bytes / chunk;
	size_t prev = 0;
	int growths = 0;
	for (size_t i = 0; i < n; i++) {
		if (memtally_buf_append(&b, src, chunk))
			return -1;
		if (__builtin_expect(b.cap != prev, 0))
			prev = b.cap, growths++;
	}
	BENCH_ESCAPE(b.data);
	int64_t moved = memtally_process_bytes() - m0;
	size_t cap = b.cap;
	size_t len;
	void *p = memtally_buf_finish(&b, &len);
	BENCH_ESCAPE(p);
	if (flags & MEMTALLY_NO_ACCOUNT)
		free(p);
	else
		memtally_buf_free_data(p, len);
	r->ns = bench_now_ns() - t0;
	r->cap = cap;
	r->growths = growths;
	r->moved = moved;
	r->after = memtally_process_bytes() - m0;
	return 0;
}

static const struct write_case *find_write(const char *name)
{
	for (size_t i = 0; i < sizeof(writes) / sizeof(writes[0]); i++)
		if (!strcmp(writes[i].name, name))
			return &writes[i];
	return NULL;
}

static int parse_flags(const char *growth, const char *acct, unsigned *flags)
{
	*flags = 0;
	if (!strcmp(growth, "1.5"))
		*flags |= MEMTALLY_BUF_GROW_1_5X;
	else if (strcmp(growth, "2"))
		return -1;
	if (!strcmp(acct, "off"))
		*flags |= MEMTALLY_NO_ACCOUNT;
	else if (strcmp(acct, "on"))
		return -1;
	return 0;
}

/* The accounting half of the proof, for one run. */
static int check_accounting(unsigned flags, const struct run_result *r,
                            struct bench_sbuf *why)
{
	int before = why->fails;
	if (flags & MEMTALLY_NO_ACCOUNT) {
		if (r->moved != 0 || r->after != 0)
			bench_flag(why,
			           "accounting off, yet memtally_process_bytes() "
			           "moved by %" PRId64 " (%" PRId64 " after)",
			           r->moved, r->after);
	} else {
		if (r->moved != (int64_t)r->cap)
			bench_flag(why,
			           "accounting on: memtally_process_bytes() moved "
			           "by %" PRId64 ", the buffer's capacity is %zu",
			           r->moved, r->cap);
		if (r->after != 0)
			bench_flag(why,
			           "accounting on: memtally_process_bytes() is "
			           "%+" PRId64 " after the buffer was freed",
			           r->after);
	}
	return why->fails - before;
}

static int run_and_print(const struct write_case *w, unsigned flags)
{
	struct run_result r;
	struct bench_sbuf why = {0};
	if (build_one(w->chunk, flags, &r)) {
		printf("error out of memory\n");
		return -1;
	}
	if (check_accounting(flags, &r, &why)) {
		printf("error PROOF FAILED: %s", why.b);
		fprintf(stderr, BENCH_BINARY ": PROOF FAILED:\n%s", why.b);
		return -1;
	}
	printf("ns %" PRIu64 " cap %zu growths %d moved %" PRId64 "\n", r.ns,
	       r.cap, r.growths, r.moved);
	return 0;
}

static int serve(void)
{
	char line[256];
	setvbuf(stdout, NULL, _IOLBF, 0);
	while (fgets(line, sizeof(line), stdin)) {
		char cmd[16], wname[16], growth[8], acct[8];
		int k = sscanf(line, "%15s %15s %7s %7s", cmd, wname, growth,
		               acct);
		if (k >= 1 && !strcmp(cmd, "quit"))
			return 0;
		const struct write_case *w = k == 4 ? find_write(wname) : NULL;
		unsigned flags;
		if (!w || strcmp(cmd, "run") ||
		    parse_flags(growth, acct, &flags)) {
			printf("error bad command: %s", line);
			continue;
		}
		if (run_and_print(w, flags))
			return 3;
	}
	return 0;
}

static void usage(FILE *f)
{
	fprintf(f, "usage: " BENCH_BINARY " [--expect jemalloc|glibc] "
	           "[--cpu N] [--mib N]\n"
	           "         (--serve | --proof | --case tiny|small|large "
	           "--growth 1.5|2 --acct on|off)\n");
}

/* The command line. */
struct opts {
	const char *expect, *case_name, *growth, *acct;
	int cpu, serve, proof_only;
};

/* Returns -1 to go on, else the exit code (0 after --help). */
static int parse_args(int argc, char **argv, struct opts *o)
{
	*o = (struct opts){.growth = "2", .acct = "on", .cpu = -1};
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
		} else if (v && !strcmp(a, "--expect")) {
			o->expect = v, i++;
		} else if (v && !strcmp(a, "--case")) {
			o->case_name = v, i++;
		} else if (v && !strcmp(a, "--growth")) {
			o->growth = v, i++;
		} else if (v && !strcmp(a, "--acct")) {
			o->acct = v, i++;
		} else if (v && !strcmp(a, "--cpu")) {
			o->cpu = atoi(v), i++;
		} else if (v && !strcmp(a, "--mib")) {
			total_bytes = (size_t)strtoull(v, NULL, 10) << 20, i++;
		} else {
			fprintf(stderr, BENCH_BINARY ": bad argument: %s\n", a);
			usage(stderr);
			return 2;
		}
	}
	return -1;
}

/* The proof: allocator, then accounting on and off on a small buffer
 * (large enough to grow several times). Returns 0 or the exit code. */
static int prove(bool expect_je, bool serving)
{
	static struct bench_sbuf js, why;
	bench_sb_add(&js, "{\"binary\": \"" BENCH_BINARY "\", \"pid\": %d, ",
	             (int)getpid());
	bench_prove_allocator(expect_je, NULL, &js, &why);
	size_t saved = total_bytes;
	total_bytes = (size_t)1 << 20;
	struct run_result on, off;
	if (build_one(700, 0, &on) ||
	    build_one(700, MEMTALLY_NO_ACCOUNT, &off)) {
		fprintf(stderr, BENCH_BINARY ": out of memory\n");
		return 2;
	}
	total_bytes = saved;
	check_accounting(0, &on, &why);
	check_accounting(MEMTALLY_NO_ACCOUNT, &off, &why);
	bench_sb_add(&js,
	             ", \"acct_on_moved\": %" PRId64 ", \"acct_on_cap\": %zu"
	             ", \"acct_off_moved\": %" PRId64 ", \"failed_signs\": %d}",
	             on.moved, on.cap, off.moved, why.fails);
	return bench_proof_verdict(BENCH_BINARY, "", expect_je, serving, &js,
	                           &why);
}

int main(int argc, char **argv)
{
	struct opts o;
	int rc = parse_args(argc, argv, &o);
	if (rc >= 0)
		return rc;
	const struct write_case *w =
	    o.case_name ? find_write(o.case_name) : NULL;
	unsigned flags = 0;
	bool expect_je;
	if ((o.case_name && !w) || parse_flags(o.growth, o.acct, &flags) ||
	    (!o.serve && !o.proof_only && !w) || total_bytes == 0 ||
	    !bench_expect_valid(o.expect)) {
		usage(stderr);
		return 2;
	}
	if (bench_worker_setup(BENCH_BINARY, o.expect, o.cpu, &expect_je))
		return 2;
	src = malloc(writes[2].chunk);
	if (!src)
		return 2;
	memset(src, 0x5a, writes[2].chunk);
	if ((rc = prove(expect_je, o.serve)))
		return rc;
	if (o.serve)
		return serve();
	if (o.proof_only)
		return 0;
	return run_and_print(w, flags) ? 3 : 0;
}
