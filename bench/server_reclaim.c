/*
 * server_reclaim.c - exit-to-reclaim latency of memtallyd (the `server`
 * suite): from SIGKILL of a registered worker to the moment the
 * server has freed its slot and published a fleet total without it.
 *
 * The driver starts a real memtallyd (--tick MS, its own socket and
 * label), then N times: starts a real worker (this program with
 * --worker, under LD_PRELOAD=libmemtally_preload.so, so it registers and
 * flushes like any preloaded process) that allocates and touches --mib MiB
 * and sleeps; waits until the worker's slot (pid set by the server) holds
 * at least 90% of those bytes in its lanes; opens a pidfd of its own on
 * the worker; sends SIGKILL at t0 and spins, reading the shared memory
 * without a lock, until
 *   t_exit     its own pidfd is readable (the kernel says the worker
 *              exited: the same event the server's pidfd sees),
 *   t_freed    the worker's slot has pid 0 again (the server released it),
 *   t_reclaim  the header's fleet snapshot (seqlock), published after
 *              the kill, shows no process and no bytes (one worker is
 *              alive at a time).
 * The spin yields the CPU every round (2 CPUs: the server must run) and is
 * bounded by a 5 s deadline; a miss is an error, not a sample.
 *
 * The shared objects are anonymous memfds the server hands to its workers
 * only: the driver opens them through the server's own descriptors,
 * /proc/SERVER/fd/N (the server is its child, of its uid), and maps them
 * as a worker would (mtshm_map_fd: seals and size checked, the header
 * read-only). The header "LABEL" lives as long as the server; the uid's
 * slot table "LABEL-slots:..." is created at the worker's registration and
 * released by the server with its last process, so it is looked up again
 * for each worker (the driver's mapping keeps it readable after the kill).
 *
 * A tick of 1000 ms against the default 10 ms shows whether reclaim waits
 * for a tick (it should not: the server watches each worker's pidfd and
 * releases the slot in the loop iteration that sees the exit).
 *
 * Prints one JSON object on stdout: percentiles in µs of kill->exit,
 * kill->reclaim and exit->reclaim.
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
#include <sys/pidfd.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "mtshm.h"
#include "mtshm_atomic.h"

#include "bench_common.h"
#include "memtallyd_child.h"

#define DEADLINE_NS (5 * UINT64_C(1000000000))

/* --worker: allocate and touch `mib` MiB in 64 KiB blocks, then wait. */
static int worker(long mib)
{
	size_t n = (size_t)mib * 16;
	for (size_t i = 0; i < n; i++) {
		char *b = malloc(64 * 1024);
		if (!b)
			return 1;
		memset(b, (int)i, 64 * 1024);
		/* kept: the bytes must stay accounted until the kill */
		__asm__ volatile("" : : "r"(b) : "memory");
	}
	for (;;)
		pause();
}

/*
 * Map the server's object whose memfd name is `name` (prefix_only: whose
 * name starts with it) with `seals` and `size`, through /proc/SERVER/fd.
 * Returns 0 or -1.
 */
static int map_server_object(pid_t srv, const char *name, int prefix_only,
                             unsigned seals, uint64_t size,
                             struct mtshm_map *out)
{
	char dir[64];
	snprintf(dir, sizeof(dir), "/proc/%d/fd", (int)srv);
	DIR *d = opendir(dir);
	if (!d)
		return -1;
	int rc = -1;
	struct dirent *e;
	while (rc && (e = readdir(d))) {
		if (e->d_name[0] == '.')
			continue;
		char path[384], target[256];
		snprintf(path, sizeof(path), "%s/%s", dir, e->d_name);
		ssize_t n = readlink(path, target, sizeof(target) - 1);
		if (n <= 0)
			continue;
		target[n] = 0;
		if (prefix_only ? strncmp(target, name, strlen(name))
		                : strcmp(target, name))
			continue;
		int fd = open(
		    path, ((seals & F_SEAL_FUTURE_WRITE) ? O_RDONLY : O_RDWR) |
		              O_CLOEXEC);
		if (fd < 0)
			continue;
		if (mtshm_map_fd(fd, seals, size, out) == 0)
			rc = 0;
		close(fd);
	}
	closedir(d);
	return rc;
}

/* The slot the server gave `pid` in `table`, or -1. */
static int64_t find_slot(const struct mtshm_layout *l,
                         const struct mtshm_map *table, pid_t pid)
{
	if (!table->base)
		return -1;
	for (uint32_t i = 0; i < l->slot_count; i++)
		if (mtshm_load_acquire32(&mtshm_slot(l, table->base, i)->pid) ==
		    (uint32_t)pid)
			return i;
	return -1;
}

/* What the worker has published into slot `s`. */
static int64_t slot_total(const struct mtshm_layout *l, struct mtshm_slot_id *s)
{
	uint64_t flushes;
	int absurd;
	return mtshm_slot_sum(s, l->lane_count, &flushes, &absurd);
}

static void stats(const char *name, uint64_t *v, int n, int last)
{
	struct bench_pcts pc = bench_percentiles(v, (size_t)n);
	printf("\"%s\": {\"p50_us\": %.1f, \"p99_us\": %.1f, \"max_us\": %.1f, "
	       "\"min_us\": %.1f}%s",
	       name, pc.p50 / 1e3, pc.p99 / 1e3, pc.max / 1e3, pc.min / 1e3,
	       last ? "" : ", ");
}

/* ---- the run --------------------------------------------------------- */

/* The command line; worker_mib > 0: run as a worker. */
struct opts {
	const char *memtallyd, *preload;
	long tick_ms, mib, worker_mib;
	int n;
};

static int parse_args(int argc, char **argv, struct opts *o)
{
	*o = (struct opts){.tick_ms = 10, .mib = 10, .n = 200};
	for (int i = 1; i < argc; i++) {
		const char *v = i + 1 < argc ? argv[i + 1] : NULL;
		if (v && !strcmp(argv[i], "--worker")) {
			o->worker_mib = atol(v);
			return 0;
		} else if (v && !strcmp(argv[i], "--memtallyd"))
			o->memtallyd = v, i++;
		else if (v && !strcmp(argv[i], "--preload"))
			o->preload = v, i++;
		else if (v && !strcmp(argv[i], "--tick"))
			o->tick_ms = atol(v), i++;
		else if (v && !strcmp(argv[i], "--n"))
			o->n = atoi(v), i++;
		else if (v && !strcmp(argv[i], "--mib"))
			o->mib = atol(v), i++;
		else {
			fprintf(
			    stderr,
			    "usage: bench_server_reclaim --memtallyd PATH "
			    "--preload LIB [--tick MS] [--n N] [--mib M]\n");
			return -1;
		}
	}
	return !o->memtallyd || !o->preload || o->n < 1 || o->mib < 1 ||
	               o->tick_ms < 1
	           ? -1
	           : 0;
}

/* What a run holds and measures (ns, one per kill). */
struct run {
	struct mtd_child srv;
	char hdr_name[128], tbl_prefix[128]; /* the server's memfds */
	struct mtshm_map m, table;           /* its header, our uid's table */
	struct mtshm_layout layout;
	pid_t w; /* the worker alive now, if any */
	char *wargv[4], *wenv[3];
	char self[4096], env_preload[4200], env_sock[300], mibs[32];
	int64_t want; /* bytes a worker's slot holds once it is ready */
	uint64_t *k2e, *k2f, *k2r, *e2r;
};

/* A real memtallyd, and its header mapped as a worker maps it. */
static int start_server(const struct opts *o, struct run *r)
{
	char tick[32];
	snprintf(tick, sizeof(tick), "%ld", o->tick_ms);
	const char *args[] = {"--tick",  tick,          "--slots", "256",
	                      "--reset", "--log-level", "warn",    NULL};
	if (mtd_start(&r->srv, "bench-reclaim", o->memtallyd, -1, args))
		return -1;
	/* --segment /NAME: the server names its memfds NAME. */
	const char *seg = r->srv.seg + 1;
	snprintf(r->hdr_name, sizeof(r->hdr_name), "/memfd:%s (deleted)", seg);
	snprintf(r->tbl_prefix, sizeof(r->tbl_prefix), "/memfd:%s-slots:", seg);
	uint64_t deadline = bench_now_ns() + DEADLINE_NS;
	while (bench_now_ns() < deadline &&
	       map_server_object(r->srv.pid, r->hdr_name, 0, MTSHM_SEALS_HEADER,
	                         MTSHM_HEADER_SIZE, &r->m) != 0)
		bench_nap_us(10000);
	if (!r->m.base || mtshm_layout_read(r->m.base, r->m.size, &r->layout)) {
		fprintf(stderr, "memtallyd did not start (see %s)\n",
		        r->srv.log);
		return -1;
	}
	return 0;
}

/* The workers' command (this program, --worker) and environment (the
 * preload, the server's socket), and room for the figures. */
static int prepare_workers(const struct opts *o, struct run *r)
{
	ssize_t sl = readlink("/proc/self/exe", r->self, sizeof(r->self) - 1);
	if (sl <= 0)
		return -1;
	r->self[sl] = 0;
	snprintf(r->env_preload, sizeof(r->env_preload), "LD_PRELOAD=%s",
	         o->preload);
	snprintf(r->env_sock, sizeof(r->env_sock), "MEMTALLY_SOCKET=%s",
	         r->srv.sock);
	snprintf(r->mibs, sizeof(r->mibs), "%ld", o->mib);
	r->wenv[0] = r->env_preload, r->wenv[1] = r->env_sock;
	r->wargv[0] = r->self, r->wargv[1] = (char *)"--worker";
	r->wargv[2] = r->mibs;
	r->want = o->mib * (INT64_C(1) << 20) * 9 / 10;
	r->k2e = calloc((size_t)o->n, sizeof(uint64_t));
	r->k2f = calloc((size_t)o->n, sizeof(uint64_t));
	r->k2r = calloc((size_t)o->n, sizeof(uint64_t));
	r->e2r = calloc((size_t)o->n, sizeof(uint64_t));
	return r->k2e && r->k2f && r->k2r && r->e2r ? 0 : -1;
}

/* Start a worker and wait until it is ready: registered (the server wrote
 * its pid into a slot) and flushed (its lanes hold the bytes). Returns
 * its slot, or -1. */
static int64_t start_worker(struct run *r)
{
	r->w = fork();
	if (r->w < 0) {
		r->w = 0;
		return -1;
	}
	if (r->w == 0) {
		execve(r->self, r->wargv, r->wenv);
		_exit(127);
	}
	int64_t slot = -1;
	uint64_t deadline = bench_now_ns() + DEADLINE_NS;
	for (;;) {
		if (!r->table.base)
			map_server_object(r->srv.pid, r->tbl_prefix, 1,
			                  MTSHM_SEALS_TABLE,
			                  r->layout.table_size, &r->table);
		if (slot < 0)
			slot = find_slot(&r->layout, &r->table, r->w);
		if (slot < 0)
			mtshm_close(&r->table); /* not there yet: again */
		if (slot >= 0 &&
		    slot_total(&r->layout, mtshm_slot(&r->layout, r->table.base,
		                                      (uint32_t)slot)) >=
		        r->want)
			return slot;
		if (bench_now_ns() > deadline) {
			fprintf(stderr,
			        "worker %d not registered with %" PRId64
			        " bytes within 5 s (slot %" PRId64 ")\n",
			        (int)r->w, r->want, slot);
			return -1;
		}
		bench_nap_us(200);
	}
}

/* Kill the worker in `slot` and spin until it is reclaimed: kill->exit,
 * ->slot freed, ->reclaimed and exit->reclaimed go to run `it`. One
 * worker at a time: reclaimed means a snapshot published after the kill
 * with no process and no bytes left. Returns 0 or -1. */
static int time_reclaim(struct run *r, int64_t slot, int it)
{
	struct mtshm_slot_id *s =
	    mtshm_slot(&r->layout, r->table.base, (uint32_t)slot);
	struct mtshm_fleet f;
	if (mtshm_fleet_read(r->m.hdr, &f) != 0)
		return -1;
	uint64_t seq0 = f.seq;
	int pfd = pidfd_open(r->w, 0);
	if (pfd < 0)
		return -1;
	uint64_t t0 = bench_now_ns(), t_exit = 0, t_freed = 0, t_rec = 0;
	kill(r->w, SIGKILL);
	uint64_t deadline = t0 + DEADLINE_NS;
	while (!t_rec || !t_exit) {
		uint64_t t = bench_now_ns();
		if (!t_exit) {
			struct pollfd p = {.fd = pfd, .events = POLLIN};
			if (poll(&p, 1, 0) > 0)
				t_exit = t;
		}
		if (!t_freed && mtshm_load_acquire32(&s->pid) != (uint32_t)r->w)
			t_freed = t;
		if (t_freed && !t_rec && mtshm_fleet_read(r->m.hdr, &f) == 0 &&
		    f.seq > seq0 && f.processes == 0 && f.bytes == 0)
			t_rec = t;
		if (t > deadline) {
			fprintf(stderr,
			        "kill %d: not reclaimed within 5 s "
			        "(exit %s, slot %s)\n",
			        it, t_exit ? "seen" : "not seen",
			        t_freed ? "freed" : "held");
			close(pfd);
			return -1;
		}
		sched_yield();
	}
	close(pfd);
	waitpid(r->w, NULL, 0);
	r->w = 0;
	mtshm_close(&r->table); /* the server released it already */
	r->k2e[it] = t_exit - t0;
	r->k2f[it] = t_freed - t0;
	r->k2r[it] = t_rec - t0;
	/* Exit and reclaim are seen by the same spin: exit first unless both
	 * landed between two of its rounds. */
	r->e2r[it] = t_rec > t_exit ? t_rec - t_exit : 0;
	return 0;
}

static void report(const struct opts *o, struct run *r)
{
	printf("{\"tick_ms\": %ld, \"n\": %d, \"mib\": %ld, ", o->tick_ms, o->n,
	       o->mib);
	stats("kill_to_exit", r->k2e, o->n, 0);
	stats("kill_to_slot_freed", r->k2f, o->n, 0);
	stats("kill_to_reclaim", r->k2r, o->n, 0);
	stats("exit_to_reclaim", r->e2r, o->n, 1);
	printf("}\n");
}

/* Stop what still runs and remove what the run left (but the server's
 * log after a failure). */
static void clean_up(struct run *r, int rc)
{
	if (r->w > 0) {
		kill(r->w, SIGKILL);
		waitpid(r->w, NULL, 0);
	}
	mtshm_close(&r->table);
	mtshm_close(&r->m);
	free(r->k2e);
	free(r->k2f);
	free(r->k2r);
	free(r->e2r);
	mtd_stop(&r->srv, rc != 0);
}

int main(int argc, char **argv)
{
	struct opts o;
	if (parse_args(argc, argv, &o))
		return 2;
	if (o.worker_mib)
		return worker(o.worker_mib);
	static struct run r = {.m = {.fd = -1}, .table = {.fd = -1}};
	int rc = 2;
	if (!start_server(&o, &r) && !prepare_workers(&o, &r)) {
		int it = 0;
		for (; it < o.n; it++) {
			int64_t slot = start_worker(&r);
			if (slot < 0 || time_reclaim(&r, slot, it))
				break;
		}
		if (it == o.n) {
			report(&o, &r);
			rc = 0;
		}
	}
	clean_up(&r, rc);
	return rc;
}
