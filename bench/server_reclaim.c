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
		int fd = open(path, ((seals & F_SEAL_FUTURE_WRITE) ? O_RDONLY
		                                                   : O_RDWR) |
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
static int64_t slot_total(const struct mtshm_layout *l,
                          struct mtshm_slot_id *s)
{
	uint64_t flushes;
	int absurd;
	return mtshm_slot_sum(s, l->lane_count, &flushes, &absurd);
}

static void stats(const char *name, uint64_t *v, int n, int last)
{
	qsort(v, (size_t)n, sizeof(*v), bench_cmp_u64);
	printf("\"%s\": {\"p50_us\": %.1f, \"p99_us\": %.1f, \"max_us\": %.1f, "
	       "\"min_us\": %.1f}%s",
	       name, v[n / 2] / 1e3, v[(size_t)n * 99 / 100] / 1e3,
	       v[n - 1] / 1e3, v[0] / 1e3, last ? "" : ", ");
}

int main(int argc, char **argv)
{
	const char *memtallyd = NULL, *preload = NULL;
	long tick_ms = 10, mib = 10;
	int n = 200;
	for (int i = 1; i < argc; i++) {
		const char *v = i + 1 < argc ? argv[i + 1] : NULL;
		if (v && !strcmp(argv[i], "--worker"))
			return worker(atol(v));
		else if (v && !strcmp(argv[i], "--memtallyd"))
			memtallyd = v, i++;
		else if (v && !strcmp(argv[i], "--preload"))
			preload = v, i++;
		else if (v && !strcmp(argv[i], "--tick"))
			tick_ms = atol(v), i++;
		else if (v && !strcmp(argv[i], "--n"))
			n = atoi(v), i++;
		else if (v && !strcmp(argv[i], "--mib"))
			mib = atol(v), i++;
		else {
			fprintf(
			    stderr,
			    "usage: bench_server_reclaim --memtallyd PATH "
			    "--preload LIB [--tick MS] [--n N] [--mib M]\n");
			return 2;
		}
	}
	if (!memtallyd || !preload || n < 1 || mib < 1 || tick_ms < 1)
		return 2;

	char dir[] = "/tmp/mtbench-reclaim-XXXXXX";
	if (!mkdtemp(dir))
		return 2;
	char sock[256], state[300], seg[64], tick[32], log[256];
	char hdr_name[128], tbl_prefix[128];
	snprintf(sock, sizeof(sock), "%s/memtally.sock", dir);
	snprintf(state, sizeof(state), "%s.state", sock);
	snprintf(log, sizeof(log), "%s/memtallyd.log", dir);
	/* --segment /NAME: the server names its memfds NAME. */
	snprintf(seg, sizeof(seg), "/mtbench-reclaim-%d", (int)getpid());
	snprintf(hdr_name, sizeof(hdr_name), "/memfd:%s (deleted)", seg + 1);
	snprintf(tbl_prefix, sizeof(tbl_prefix), "/memfd:%s-slots:", seg + 1);
	snprintf(tick, sizeof(tick), "%ld", tick_ms);

	pid_t srv = fork();
	if (srv < 0)
		return 2;
	if (srv == 0) {
		int fd = open(log, O_WRONLY | O_CREAT | O_TRUNC, 0600);
		if (fd >= 0)
			dup2(fd, 2);
		execl(memtallyd, memtallyd, "--socket", sock, "--segment", seg,
		      "--tick", tick, "--slots", "256", "--reset",
		      "--log-level", "warn", (char *)NULL);
		_exit(127);
	}
	int rc = 2;
	pid_t w = 0; /* the worker alive now, if any */
	uint64_t *k2e = NULL, *k2f = NULL, *k2r = NULL, *e2r = NULL;
	struct mtshm_map m = {.fd = -1}, table = {.fd = -1};
	struct mtshm_layout layout;
	uint64_t deadline = bench_now_ns() + DEADLINE_NS;
	while (bench_now_ns() < deadline &&
	       !(bench_socket_up(sock) &&
	         map_server_object(srv, hdr_name, 0, MTSHM_SEALS_HEADER,
	                           MTSHM_HEADER_SIZE, &m) == 0))
		bench_nap_us(10000);
	if (!m.base || mtshm_layout_read(m.base, m.size, &layout)) {
		fprintf(stderr, "memtallyd did not start (see %s)\n", log);
		goto out_server;
	}

	char self[4096];
	ssize_t sl = readlink("/proc/self/exe", self, sizeof(self) - 1);
	if (sl <= 0)
		goto out_server;
	self[sl] = 0;
	char env_preload[4200], env_sock[300], mibs[32];
	snprintf(env_preload, sizeof(env_preload), "LD_PRELOAD=%s", preload);
	snprintf(env_sock, sizeof(env_sock), "MEMTALLY_SOCKET=%s", sock);
	snprintf(mibs, sizeof(mibs), "%ld", mib);
	char *wenv[] = {env_preload, env_sock, NULL};
	int64_t want = mib * (INT64_C(1) << 20) * 9 / 10;

	k2e = calloc((size_t)n, sizeof(uint64_t));
	k2f = calloc((size_t)n, sizeof(uint64_t));
	k2r = calloc((size_t)n, sizeof(uint64_t));
	e2r = calloc((size_t)n, sizeof(uint64_t));
	if (!k2e || !k2f || !k2r || !e2r)
		goto out_server;
	for (int it = 0; it < n; it++) {
		w = fork();
		if (w < 0) {
			w = 0;
			goto out_server;
		}
		if (w == 0) {
			execle(self, self, "--worker", mibs, (char *)NULL,
			       wenv);
			_exit(127);
		}
		/* Ready: registered (the server wrote our pid into a slot)
		 * and flushed (its lanes hold the bytes). */
		int64_t slot = -1;
		deadline = bench_now_ns() + DEADLINE_NS;
		for (;;) {
			if (!table.base)
				map_server_object(srv, tbl_prefix, 1,
				                  MTSHM_SEALS_TABLE,
				                  layout.table_size, &table);
			if (slot < 0)
				slot = find_slot(&layout, &table, w);
			if (slot < 0)
				mtshm_close(&table); /* not there yet: again */
			if (slot >= 0 &&
			    slot_total(&layout,
			               mtshm_slot(&layout, table.base,
			                          (uint32_t)slot)) >= want)
				break;
			if (bench_now_ns() > deadline) {
				fprintf(stderr,
				        "worker %d not registered with %" PRId64
				        " bytes within 5 s (slot %" PRId64
				        ")\n",
				        (int)w, want, slot);
				goto out_server;
			}
			bench_nap_us(200);
		}
		struct mtshm_slot_id *s =
		    mtshm_slot(&layout, table.base, (uint32_t)slot);
		/* One worker at a time: reclaimed means a snapshot published
		 * after the kill with no process and no bytes left. */
		struct mtshm_fleet f;
		if (mtshm_fleet_read(m.hdr, &f) != 0)
			goto out_server;
		uint64_t seq0 = f.seq;
		int pfd = pidfd_open(w, 0);
		if (pfd < 0)
			goto out_server;

		uint64_t t0 = bench_now_ns(), t_exit = 0, t_freed = 0, t_rec = 0;
		kill(w, SIGKILL);
		deadline = t0 + DEADLINE_NS;
		while (!t_rec || !t_exit) {
			uint64_t t = bench_now_ns();
			if (!t_exit) {
				struct pollfd p = {.fd = pfd, .events = POLLIN};
				if (poll(&p, 1, 0) > 0)
					t_exit = t;
			}
			if (!t_freed &&
			    mtshm_load_acquire32(&s->pid) != (uint32_t)w)
				t_freed = t;
			if (t_freed && !t_rec &&
			    mtshm_fleet_read(m.hdr, &f) == 0 && f.seq > seq0 &&
			    f.processes == 0 && f.bytes == 0)
				t_rec = t;
			if (t > deadline) {
				fprintf(stderr,
				        "kill %d: not reclaimed within 5 s "
				        "(exit %s, slot %s)\n",
				        it, t_exit ? "seen" : "not seen",
				        t_freed ? "freed" : "held");
				close(pfd);
				goto out_server;
			}
			sched_yield();
		}
		close(pfd);
		waitpid(w, NULL, 0);
		w = 0;
		mtshm_close(&table); /* the server released it already */
		k2e[it] = t_exit - t0;
		k2f[it] = t_freed - t0;
		k2r[it] = t_rec - t0;
		/* Exit and reclaim are seen by the same spin: exit first
		 * unless both landed between two of its rounds. */
		e2r[it] = t_rec > t_exit ? t_rec - t_exit : 0;
	}
	printf("{\"tick_ms\": %ld, \"n\": %d, \"mib\": %ld, ", tick_ms, n, mib);
	stats("kill_to_exit", k2e, n, 0);
	stats("kill_to_slot_freed", k2f, n, 0);
	stats("kill_to_reclaim", k2r, n, 0);
	stats("exit_to_reclaim", e2r, n, 1);
	printf("}\n");
	rc = 0;

out_server:
	if (w > 0) {
		kill(w, SIGKILL);
		waitpid(w, NULL, 0);
	}
	mtshm_close(&table);
	mtshm_close(&m);
	kill(srv, SIGTERM);
	waitpid(srv, NULL, 0);
	unlink(sock);
	unlink(state);
	free(k2e);
	free(k2f);
	free(k2r);
	free(e2r);
	if (rc) {
		/* Keep memtallyd's log for the post-mortem. */
		fprintf(stderr, "memtallyd's log: %s\n", log);
		return rc;
	}
	unlink(log);
	rmdir(dir);
	return rc;
}
