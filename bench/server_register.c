/*
 * server_register.c - what one worker's registration costs, on the
 * worker's side (latency) and on memtallyd's (CPU per registration and
 * exit), against a real memtallyd (the `server` suite).
 *
 * The driver starts memtallyd (--memtallyd PATH, its own socket, label
 * and restart record in a fresh directory, the default log level, pinned
 * to --server-cpu), then forks N short-lived workers one after another.
 * Each worker is this program after fork(), linked with libmemtally and
 * nothing preloaded: it times
 *
 *     memtally_account(1 << 20); memtally_flush();
 *
 * (the first call on a thread takes the slow path and registers: connect,
 * Register, the Registered answer, mapping what it names; the flush then
 * publishes the MiB into the slot), checks that it is attached and that
 * its published total is the MiB, reports through a pipe and exits. The
 * parent waits for the server's log to say that worker exited (so the
 * server has finished with one worker before the next one starts, and a
 * worker's exit is part of what is measured), then forks the next.
 * memtallyd's CPU time (utime + stime of /proc/PID/stat, and the
 * nanosecond run time of /proc/PID/task/STAR/schedstat) is read before the
 * first measured worker and after the last one's exit: their difference
 * over N is the server's CPU per registration + exit.
 *
 * --holder: one more worker registers first and stays registered for the
 * whole run, as the other workers of a uid do on a busy node. Without it
 * every measured worker is the only process of its uid; servers that keep
 * per-uid objects create and drop them for each one.
 *
 * The same source builds against any tree whose client API has
 * memtally_account, memtally_flush, memtally_attached and
 * memtally_query_usage (bench/server.py --side-by-side compiles it against
 * a baseline tree's headers and libmemtally.a), so two servers with their
 * own clients can be run interleaved.
 *
 * Proof (a failed sign prints "PROOF FAILED" and exits 3): every worker's
 * memtally_flush() returned 0, memtally_attached() was true and its
 * published total was exactly 1 MiB; the server's log has a
 * "worker registered" and then a "worker exited" line with each worker's
 * pid; GetUsage lists no process but the holder before and after the run;
 * and the server's own count at shutdown ("stopped registrations=R
 * exits=E") is every worker, warm-up and holder included.
 *
 * Prints one JSON object on stdout.
 */
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "memtally.h"
#include "memtally_query.h"

#include "bench_common.h"
#include "memtallyd_child.h"

#define DEADLINE_NS  (5 * UINT64_C(1000000000))
#define WORKER_BYTES (INT64_C(1) << 20)

/* What a worker reports to the parent. */
struct wres {
	int32_t pid;
	int32_t rc;       /* memtally_flush() */
	int32_t attached; /* memtally_attached() */
	int32_t pad;
	int64_t published; /* memtally_process_bytes() after the flush */
	uint64_t ns;       /* account + flush */
};

/* The worker: register by accounting, report, leave (or wait, holder). */
static void worker(int out, int hold)
{
	struct wres r = {.pid = (int32_t)getpid()};
	uint64_t t0 = bench_now_ns();
	memtally_account(WORKER_BYTES);
	r.rc = memtally_flush();
	uint64_t t1 = bench_now_ns();
	r.ns = t1 - t0;
	r.attached = memtally_attached();
	r.published = memtally_process_bytes();
	if (write(out, &r, sizeof(r)) != (ssize_t)sizeof(r))
		_exit(1);
	if (hold) {
		char c;
		while (read(hold, &c, 1) < 0 && errno == EINTR)
			;
	}
	exit(0);
}

/* ---- the server's log -------------------------------------------------- */

/* Follows memtallyd's log file as it grows, line by line. */
struct logf {
	int fd;
	char buf[65536];
	size_t n;
	uint64_t registrations, exits; /* from "stopped" */
	int stopped;
};

/* The pid of a line's `pid=` field, or -1. */
static long line_pid(const char *l)
{
	const char *p = strstr(l, " pid=");
	return p ? strtol(p + 5, NULL, 10) : -1;
}

/*
 * Read what the log has gained; for each complete line call back: sets
 * *reg / *ex when `pid` registered / exited. Returns 0, -1 on error.
 */
static int log_poll(struct logf *lf, long pid, int *reg, int *ex)
{
	for (;;) {
		if (lf->n >= sizeof(lf->buf) - 1)
			lf->n = 0; /* an absurd line: drop it */
		ssize_t k =
		    read(lf->fd, lf->buf + lf->n, sizeof(lf->buf) - 1 - lf->n);
		if (k < 0)
			return -1;
		if (k == 0)
			return 0;
		lf->n += (size_t)k;
		lf->buf[lf->n] = 0;
		char *s = lf->buf, *nl;
		while ((nl = strchr(s, '\n'))) {
			*nl = 0;
			if (strstr(s, "msg=\"worker registered\"") &&
			    line_pid(s) == pid)
				*reg = 1;
			else if (strstr(s, "msg=\"worker exited\"") &&
			         line_pid(s) == pid)
				*ex = *reg ? 1 : -1; /* exit before register */
			else if (strstr(s, "msg=\"stopped\"")) {
				const char *r = strstr(s, "registrations=");
				const char *e = strstr(s, "exits=");
				if (r && e) {
					lf->registrations =
					    strtoull(r + 14, NULL, 10);
					lf->exits = strtoull(e + 6, NULL, 10);
					lf->stopped = 1;
				}
			}
			s = nl + 1;
		}
		lf->n -= (size_t)(s - lf->buf);
		memmove(lf->buf, s, lf->n);
	}
}

/* Wait until the log shows `pid` registered and exited. 0, or -1. */
static int log_wait_exit(struct logf *lf, long pid, int *reg)
{
	int ex = 0;
	uint64_t deadline = bench_now_ns() + DEADLINE_NS;
	for (;;) {
		if (log_poll(lf, pid, reg, &ex) < 0)
			return -1;
		if (ex)
			return ex > 0 ? 0 : -1;
		if (bench_now_ns() > deadline)
			return -1;
		bench_nap_us(50);
	}
}

/* ---- the server's CPU time --------------------------------------------- */

struct cpu {
	uint64_t ticks;  /* utime + stime, clock ticks */
	uint64_t run_ns; /* sum of schedstat's run time over its threads */
};

static int read_cpu(pid_t pid, struct cpu *c)
{
	char path[64], buf[1024];
	snprintf(path, sizeof(path), "/proc/%d/stat", (int)pid);
	int fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return -1;
	ssize_t k = read(fd, buf, sizeof(buf) - 1);
	close(fd);
	if (k <= 0)
		return -1;
	buf[k] = 0;
	char *p = strrchr(buf, ')');
	if (!p)
		return -1;
	/* Field 3 (state) follows ") "; utime and stime are 14 and 15. */
	p += 2;
	for (int f = 3; f < 14 && p; f++) {
		p = strchr(p, ' ');
		if (p)
			p++;
	}
	if (!p)
		return -1;
	char *end;
	uint64_t ut = strtoull(p, &end, 10);
	uint64_t st = strtoull(end, NULL, 10);
	c->ticks = ut + st;

	c->run_ns = 0;
	snprintf(path, sizeof(path), "/proc/%d/task", (int)pid);
	DIR *d = opendir(path);
	if (!d)
		return -1;
	struct dirent *e;
	while ((e = readdir(d))) {
		if (e->d_name[0] == '.')
			continue;
		char sp[512];
		snprintf(sp, sizeof(sp), "%s/%s/schedstat", path, e->d_name);
		fd = open(sp, O_RDONLY | O_CLOEXEC);
		if (fd < 0)
			continue;
		k = read(fd, buf, sizeof(buf) - 1);
		close(fd);
		if (k > 0) {
			buf[k] = 0;
			c->run_ns += strtoull(buf, NULL, 10);
		}
	}
	closedir(d);
	return 0;
}

/* ---- GetUsage ------------------------------------------------------------ */

/* Processes the server lists now, or -1. */
static long usage_processes(const char *sock)
{
	memtally_query *q = NULL;
	struct memtally_usage *u = NULL;
	long n = -1;
	if (memtally_query_open(&q, sock, 2000) == 0 &&
	    memtally_query_usage(q, &u) == 0)
		n = u->processes;
	memtally_usage_free(u);
	memtally_query_close(q);
	return n;
}

static uint64_t at(const uint64_t *v, int n, int permille)
{
	return v[(size_t)((long)(n - 1) * permille / 1000)];
}

/* The parent's end of the holder's pipe: a worker must not keep it. */
static int close_in_child = -1;

/* Fork one worker and collect its report. 0, or -1 (why in `why`). */
static int run_worker(int hold_fd, struct wres *r, pid_t *pid_out,
                      struct bench_sbuf *why)
{
	int p[2];
	if (pipe2(p, O_CLOEXEC))
		return -1;
	pid_t w = fork();
	if (w < 0) {
		close(p[0]);
		close(p[1]);
		return -1;
	}
	if (w == 0) {
		close(p[0]);
		if (close_in_child >= 0)
			close(close_in_child);
		worker(p[1], hold_fd);
	}
	close(p[1]);
	*pid_out = w;
	ssize_t k = -1;
	struct pollfd pf = {.fd = p[0], .events = POLLIN};
	/* A worker that hangs in its registration is a failure, not a wait. */
	if (poll(&pf, 1, (int)(DEADLINE_NS / 1000000)) > 0)
		k = read(p[0], r, sizeof(*r));
	close(p[0]);
	if (k != (ssize_t)sizeof(*r))
		kill(w, SIGKILL);
	if (k != (ssize_t)sizeof(*r)) {
		bench_flag(why, "worker %d reported nothing within 5 s",
		           (int)w);
		return -1;
	}
	if (r->rc != 0 || !r->attached || r->published != WORKER_BYTES) {
		bench_flag(why,
		           "worker %d: memtally_flush() = %d (%s), "
		           "memtally_attached() = %s, published %" PRId64
		           " of %" PRId64 " bytes: not attached to the server",
		           (int)w, r->rc, memtally_strerror(r->rc),
		           r->attached ? "true" : "false", r->published,
		           WORKER_BYTES);
		return -1;
	}
	return 0;
}

/* ---- the run --------------------------------------------------------- */

/* The command line. */
struct opts {
	const char *memtallyd;
	long tick_ms, slots;
	int n, warmup, holder, cpu, server_cpu;
};

static int parse_args(int argc, char **argv, struct opts *o)
{
	*o = (struct opts){.tick_ms = 1000,
	                   .slots = 4096,
	                   .n = 2000,
	                   .warmup = 50,
	                   .server_cpu = -2};
	o->cpu = (int)sysconf(_SC_NPROCESSORS_ONLN) - 1;
	for (int i = 1; i < argc; i++) {
		const char *v = i + 1 < argc ? argv[i + 1] : NULL;
		if (!strcmp(argv[i], "--holder"))
			o->holder = 1;
		else if (v && !strcmp(argv[i], "--memtallyd"))
			o->memtallyd = v, i++;
		else if (v && !strcmp(argv[i], "--n"))
			o->n = atoi(v), i++;
		else if (v && !strcmp(argv[i], "--warmup"))
			o->warmup = atoi(v), i++;
		else if (v && !strcmp(argv[i], "--tick"))
			o->tick_ms = atol(v), i++;
		else if (v && !strcmp(argv[i], "--slots"))
			o->slots = atol(v), i++;
		else if (v && !strcmp(argv[i], "--cpu"))
			o->cpu = atoi(v), i++;
		else if (v && !strcmp(argv[i], "--server-cpu"))
			o->server_cpu = atoi(v), i++;
		else {
			fprintf(stderr,
			        "usage: bench_server_register --memtallyd PATH "
			        "[--n N] [--warmup W] [--holder] [--tick MS] "
			        "[--slots S] [--cpu C] [--server-cpu C] "
			        "(C = -1: not pinned; --server-cpu defaults to "
			        "--cpu)\n");
			return -1;
		}
	}
	if (o->server_cpu == -2)
		o->server_cpu = o->cpu;
	return !o->memtallyd || o->n < 1 || o->warmup < 0 || o->tick_ms < 1 ||
	               o->slots < 2
	           ? -1
	           : 0;
}

/* What a run holds and finds. */
struct run {
	struct mtd_child srv;
	struct logf lf;
	uint64_t *lat; /* client latency of each timed worker */
	pid_t hold_pid;
	int hold_pipe[2];
	int reg_seen, total; /* workers seen in the log, workers run */
	struct cpu c0, c1;   /* the server's CPU before and after */
	long before, after;  /* GetUsage's processes */
	struct bench_sbuf why;
};

/* The steps below return 0 to go on, 1 when a sign of the proof failed
 * (in r->why: the run stops, the proof reports it), -1 on an error. */

/* Does this memtallyd take --log-budget (an older one, run side by
 * side, does not, and writes every line anyway)? */
static int takes_log_budget(const char *memtallyd)
{
	char cmd[4200];
	snprintf(cmd, sizeof(cmd), "'%s' --help 2>&1", memtallyd);
	FILE *f = popen(cmd, "r");
	if (!f)
		return 0;
	char line[512];
	int found = 0;
	while (fgets(line, sizeof(line), f))
		found |= strstr(line, "--log-budget") != NULL;
	pclose(f);
	return found;
}

/* memtallyd at its default log level (info): one line per registration
 * and per exit, as a deployed server writes them, every one of them (the
 * proof reads each worker's; a budget would hold most back). Then pin
 * ourselves. */
static int start_server(struct opts *o, struct run *r)
{
	char tick[32], nslots[32];
	snprintf(tick, sizeof(tick), "%ld", o->tick_ms);
	snprintf(nslots, sizeof(nslots), "%ld", o->slots);
	const char *args[] = {"--tick", tick, "--slots", nslots,
	                      NULL,     NULL, NULL};
	if (takes_log_budget(o->memtallyd)) {
		args[4] = "--log-budget";
		args[5] = "none";
	}
	if (mtd_start(&r->srv, "bench-register", o->memtallyd, o->server_cpu,
	              args))
		return -1;
	setenv("MEMTALLY_SOCKET", r->srv.sock, 1);
	if (o->cpu >= 0 && bench_pin_cpu(o->cpu)) {
		fprintf(stderr, "cannot pin to CPU %d\n", o->cpu);
		o->cpu = -1;
	}
	r->lf.fd = open(r->srv.log, O_RDONLY | O_CLOEXEC);
	if (r->lf.fd < 0) {
		fprintf(stderr, "cannot read memtallyd's log %s\n", r->srv.log);
		return -1;
	}
	return 0;
}

/* The holder: a worker that stays registered through the run. It waits
 * on its pipe's read end; the parent closing the write end (the only
 * copy) releases it. */
static int start_holder(struct run *r)
{
	if (pipe2(r->hold_pipe, O_CLOEXEC))
		return -1;
	struct wres w;
	close_in_child = r->hold_pipe[1];
	if (run_worker(r->hold_pipe[0], &w, &r->hold_pid, &r->why))
		return 1;
	close(r->hold_pipe[0]);
	r->hold_pipe[0] = -1;
	r->total++;
	return 0;
}

static int release_holder(struct run *r)
{
	close(r->hold_pipe[1]);
	r->hold_pipe[1] = -1;
	waitpid(r->hold_pid, NULL, 0);
	int reg = 1;
	if (log_wait_exit(&r->lf, r->hold_pid, &reg))
		bench_flag(&r->why, "the holder's exit is not in the log");
	r->hold_pid = 0;
	return 0;
}

/* Warm-up then timed workers, one at a time: each registers, exits, and
 * its two lines are in the server's log before the next starts. */
static int run_workers(const struct opts *o, struct run *r)
{
	for (int i = -o->warmup; i < o->n; i++) {
		if (i == 0 && read_cpu(r->srv.pid, &r->c0)) {
			fprintf(stderr, "cannot read /proc/%d/stat\n",
			        (int)r->srv.pid);
			return -1;
		}
		struct wres w;
		pid_t pid = 0;
		int err = run_worker(-1, &w, &pid, &r->why);
		if (pid > 0)
			waitpid(pid, NULL, 0);
		if (err)
			return 1;
		r->total++;
		int reg = 0;
		if (log_wait_exit(&r->lf, pid, &reg)) {
			bench_flag(&r->why,
			           "the server's log has no \"worker %s\" line "
			           "for worker %d within 5 s",
			           reg ? "exited" : "registered", (int)pid);
			return 1;
		}
		r->reg_seen++;
		if (i >= 0)
			r->lat[i] = w.ns;
	}
	return 0;
}

/* The run: the holder, GetUsage before, the workers, GetUsage after. */
static int measure(const struct opts *o, struct run *r)
{
	int k;
	if (o->holder && (k = start_holder(r)))
		return k;
	r->before = usage_processes(r->srv.sock);
	if (r->before != o->holder)
		bench_flag(&r->why,
		           "GetUsage lists %ld processes before the run, "
		           "expected %d",
		           r->before, o->holder);
	if ((k = run_workers(o, r)))
		return k;
	if (read_cpu(r->srv.pid, &r->c1)) {
		fprintf(stderr, "cannot read /proc/%d/stat\n", (int)r->srv.pid);
		return -1;
	}
	r->after = usage_processes(r->srv.sock);
	if (r->after != o->holder)
		bench_flag(&r->why,
		           "GetUsage lists %ld processes after the run, "
		           "expected %d (every worker reclaimed)",
		           r->after, o->holder);
	return o->holder ? release_holder(r) : 0;
}

/* Stop the server and check its own count at shutdown. Returns the
 * number of failed signs, reported on stderr. */
static int prove(struct run *r)
{
	kill(r->srv.pid, SIGTERM);
	waitpid(r->srv.pid, NULL, 0);
	r->srv.pid = 0;
	if (r->lf.fd >= 0) {
		int r0 = 0, e0 = 0;
		log_poll(&r->lf, -2, &r0, &e0);
	}
	struct logf *lf = &r->lf;
	if (!r->why.fails &&
	    (!lf->stopped || lf->registrations != (uint64_t)r->total ||
	     lf->exits != (uint64_t)r->total))
		bench_flag(&r->why,
		           "the server counted registrations=%" PRIu64
		           " exits=%" PRIu64 " at shutdown%s; %d workers ran",
		           lf->registrations, lf->exits,
		           lf->stopped ? "" : " (no \"stopped\" line)",
		           r->total);
	if (r->why.fails)
		fprintf(stderr, "PROOF FAILED (%d sign%s):\n%s", r->why.fails,
		        r->why.fails > 1 ? "s" : "", r->why.b);
	return r->why.fails;
}

static void report(const struct opts *o, struct run *r)
{
	int n = o->n;
	uint64_t *lat = r->lat;
	qsort(lat, (size_t)n, sizeof(*lat), bench_cmp_u64);
	uint64_t sum = 0;
	for (int i = 0; i < n; i++)
		sum += lat[i];
	double hz = (double)sysconf(_SC_CLK_TCK);
	double cpu_us = (double)(r->c1.ticks - r->c0.ticks) / hz * 1e6 / n;
	double run_us = (double)(r->c1.run_ns - r->c0.run_ns) / 1e3 / n;
	printf(
	    "{\"n\": %d, \"warmup\": %d, \"holder\": %s, \"tick_ms\": %ld, "
	    "\"slots\": %ld, \"cpu\": %d, \"server_cpu\": %d, "
	    "\"latency_us\": {\"min\": %.1f, \"p25\": %.1f, \"p50\": %.1f, "
	    "\"p75\": %.1f, \"p99\": %.1f, \"max\": %.1f, \"mean\": %.1f}, "
	    "\"server_cpu_us_per_worker\": %.2f, "
	    "\"server_run_us_per_worker\": %.2f, "
	    "\"server_cpu_ticks\": %" PRIu64 ", "
	    "\"proof\": {\"workers_attached\": %d, \"log_registered_exited\": "
	    "%d, \"usage_processes_before\": %ld, "
	    "\"usage_processes_after\": %ld, \"server_registrations\": %" PRIu64
	    ", \"server_exits\": %" PRIu64 "}}\n",
	    n, o->warmup, o->holder ? "true" : "false", o->tick_ms, o->slots,
	    o->cpu, o->server_cpu, lat[0] / 1e3, at(lat, n, 250) / 1e3,
	    at(lat, n, 500) / 1e3, at(lat, n, 750) / 1e3, at(lat, n, 990) / 1e3,
	    lat[n - 1] / 1e3, (double)sum / n / 1e3, cpu_us, run_us,
	    r->c1.ticks - r->c0.ticks, r->total, r->reg_seen, r->before,
	    r->after, r->lf.registrations, r->lf.exits);
}

/* Whatever still runs is stopped, what the run left is removed (but the
 * server's log after a failure). */
static void clean_up(struct run *r, int rc)
{
	if (r->hold_pipe[1] >= 0)
		close(r->hold_pipe[1]);
	if (r->hold_pipe[0] >= 0)
		close(r->hold_pipe[0]);
	if (r->hold_pid > 0) {
		kill(r->hold_pid, SIGKILL);
		waitpid(r->hold_pid, NULL, 0);
	}
	if (r->lf.fd >= 0)
		close(r->lf.fd);
	free(r->lat);
	mtd_stop(&r->srv, rc != 0);
}

int main(int argc, char **argv)
{
	struct opts o;
	if (parse_args(argc, argv, &o))
		return 2;
	unsetenv("LD_PRELOAD");
	static struct run r = {
	    .lf = {.fd = -1}, .hold_pipe = {-1, -1}, .before = -1, .after = -1};
	r.lat = calloc((size_t)o.n, sizeof(uint64_t));
	int rc = 2;
	if (r.lat && !start_server(&o, &r) && measure(&o, &r) >= 0) {
		rc = prove(&r) ? 3 : 0;
		if (!rc)
			report(&o, &r);
	}
	clean_up(&r, rc);
	return rc;
}
