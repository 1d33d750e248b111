/*
 * server_query.c - query latency over the Unix socket against a real
 * memtallyd, beside a bare round trip on this machine (the `server`
 * suite; target: GetUsage p99 on one connection within 2x a bare round
 * trip).
 *
 * Bare round trip: a forked child echoes 64 bytes over an AF_UNIX stream
 * socketpair; the parent times write + read of 64 bytes. GetUsage: one
 * connection with memtally_query_open(), memtally_query_usage() timed
 * call by call (request packing, the server's answer, decoding and the
 * result's allocation included). Both are sequential, one request in
 * flight (pipelining is not measured here).
 *
 * Proof: every GetUsage must succeed (a failure exits 3, with the
 * library's message), so the numbers are of real answers from a server.
 * Prints one JSON object on stdout.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <inttypes.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "memtally.h"
#include "memtally_query.h"

#include "bench_common.h"

static int full_io(int fd, char *buf, size_t n, int wr)
{
	size_t done = 0;
	while (done < n) {
		ssize_t k = wr ? write(fd, buf + done, n - done)
		               : read(fd, buf + done, n - done);
		if (k <= 0)
			return -1;
		done += (size_t)k;
	}
	return 0;
}

static void pct(const char *name, uint64_t *t, int n)
{
	qsort(t, (size_t)n, sizeof(t[0]), bench_cmp_u64);
	printf("\"%s\": {\"n\": %d, \"p50_ns\": %" PRIu64 ", \"p99_ns\": %" PRIu64
	       ", \"p999_ns\": %" PRIu64 ", \"min_ns\": %" PRIu64 "}",
	       name, n, t[n / 2], t[(int)((long)n * 99 / 100)],
	       t[(int)((long)n * 999 / 1000)], t[0]);
}

/* A bare round trip of 64 bytes over a socketpair to a child that echoes
 * them, n times after 1000 warm-up ones, into t. Returns 0 or -1. */
static int time_bare_rtt(uint64_t *t, int n)
{
	int sv[2];
	if (socketpair(AF_UNIX, SOCK_STREAM, 0, sv))
		return -1;
	pid_t child = fork();
	if (child == 0) {
		close(sv[0]);
		char b[64];
		while (full_io(sv[1], b, sizeof(b), 0) == 0)
			if (full_io(sv[1], b, sizeof(b), 1))
				break;
		_exit(0);
	}
	close(sv[1]);
	char b[64] = {0};
	for (int i = 0; i < 1000; i++)
		if (full_io(sv[0], b, 64, 1) || full_io(sv[0], b, 64, 0))
			return -1;
	for (int i = 0; i < n; i++) {
		uint64_t t0 = bench_now_ns();
		if (full_io(sv[0], b, 64, 1) || full_io(sv[0], b, 64, 0))
			return -1;
		t[i] = bench_now_ns() - t0;
	}
	close(sv[0]);
	waitpid(child, NULL, 0);
	return 0;
}

/* GetUsage on one connection to the server at `sock`, n times after 1000
 * warm-up calls, into t; every call must succeed. Returns 0 or -1 (the
 * proof failed, said on stderr). */
static int time_get_usage(const char *sock, uint64_t *t, int n)
{
	memtally_query *q;
	int rc = memtally_query_open(&q, sock, 5000);
	if (rc) {
		fprintf(stderr, "PROOF FAILED: cannot connect to %s: %s\n", sock,
		        memtally_strerror(rc));
		return -1;
	}
	for (int i = 0; i < n + 1000; i++) {
		struct memtally_usage *u;
		uint64_t t0 = bench_now_ns();
		rc = memtally_query_usage(q, &u);
		uint64_t dt = bench_now_ns() - t0;
		if (rc) {
			fprintf(stderr, "PROOF FAILED: GetUsage: %s (%s)\n",
			        memtally_strerror(rc),
			        memtally_query_last_error(q));
			return -1;
		}
		memtally_usage_free(u);
		if (i >= 1000)
			t[i - 1000] = dt;
	}
	memtally_query_close(q);
	return 0;
}

int main(int argc, char **argv)
{
	const char *sock = NULL;
	int n = 20000, cpu = -1;
	for (int i = 1; i + 1 < argc; i += 2) {
		if (!strcmp(argv[i], "--socket"))
			sock = argv[i + 1];
		else if (!strcmp(argv[i], "--n"))
			n = atoi(argv[i + 1]);
		else if (!strcmp(argv[i], "--cpu"))
			cpu = atoi(argv[i + 1]);
	}
	if (!sock || n < 1000) {
		fprintf(stderr, "usage: bench_server_query --socket PATH "
		                "[--n N>=1000] [--cpu N]\n");
		return 2;
	}
	if (cpu >= 0)
		bench_pin_cpu(cpu);
	uint64_t *t = calloc((size_t)n, sizeof(*t));
	if (!t || time_bare_rtt(t, n))
		return 2;
	printf("{");
	pct("bare_rtt", t, n);
	if (time_get_usage(sock, t, n))
		return 3;
	printf(", ");
	pct("get_usage", t, n);
	printf("}\n");
	free(t);
	return 0;
}
