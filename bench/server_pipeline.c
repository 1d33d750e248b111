/*
 * server_pipeline.c - pipelined GetUsage throughput on one connection to a
 * real memtallyd (the `server` suite; target: >= 200k/s on one core).
 *
 * The protocol lets a client keep many requests in flight (each Response
 * echoes its Request's id). This client packs a window of W GetUsage
 * requests (ids consecutive) with the wire format's varint length prefix,
 * writes them in one write(), then reads and decodes W responses, checking
 * each id and that it carries a Usage and no error; repeated for about
 * --seconds. Proof: every response decoded and matched (else exit 3).
 * Prints one JSON object on stdout.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include "memtally.pb-c.h"
#include "mtframe.h"

#include "bench_common.h"

static uint8_t rbuf[1 << 20];
static size_t rlen;

/* Read until one whole frame is buffered; returns its prefix length and
 * body length, or -1. */
static int next_frame(int fd, size_t *pre, uint64_t *blen)
{
	for (;;) {
		int k = mtframe_decode_len(rbuf, rlen, MTFRAME_DEFAULT_MAX, blen);
		if (k < 0)
			return -1;
		if (k > 0 && rlen >= (size_t)k + *blen) {
			*pre = (size_t)k;
			return 0;
		}
		ssize_t n = read(fd, rbuf + rlen, sizeof(rbuf) - rlen);
		if (n <= 0)
			return -1;
		rlen += (size_t)n;
	}
}

int main(int argc, char **argv)
{
	const char *sock = NULL;
	int window = 64;
	double seconds = 1.0;
	for (int i = 1; i + 1 < argc; i += 2) {
		if (!strcmp(argv[i], "--socket"))
			sock = argv[i + 1];
		else if (!strcmp(argv[i], "--window"))
			window = atoi(argv[i + 1]);
		else if (!strcmp(argv[i], "--seconds"))
			seconds = atof(argv[i + 1]);
	}
	if (!sock || window < 1 || window > 4096) {
		fprintf(stderr, "usage: bench_server_pipeline --socket PATH "
		                "[--window W] [--seconds S]\n");
		return 2;
	}
	int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
	struct sockaddr_un sa = {.sun_family = AF_UNIX};
	snprintf(sa.sun_path, sizeof(sa.sun_path), "%s", sock);
	if (fd < 0 || connect(fd, (struct sockaddr *)&sa, sizeof(sa))) {
		fprintf(stderr, "PROOF FAILED: cannot connect to %s: %s\n", sock,
		        strerror(errno));
		return 3;
	}
	size_t cap = (size_t)window * 64;
	uint8_t *wbuf = malloc(cap);
	if (!wbuf)
		return 2;
	uint64_t id = 1, done = 0;
	uint64_t t0 = bench_now_ns(), deadline = t0 + (uint64_t)(seconds * 1e9);
	uint64_t t_end;
	for (;;) {
		size_t wl = 0;
		uint64_t first = id;
		for (int i = 0; i < window; i++) {
			Memtally__V1__GetUsage gu = MEMTALLY__V1__GET_USAGE__INIT;
			Memtally__V1__Request rq = MEMTALLY__V1__REQUEST__INIT;
			rq.id = id++;
			rq.body_case = MEMTALLY__V1__REQUEST__BODY_GET_USAGE;
			rq.get_usage = &gu;
			size_t k = mtframe_pack(&rq.base, wbuf + wl, cap - wl);
			if (!k)
				return 2;
			wl += k;
		}
		for (size_t off = 0; off < wl;) {
			ssize_t n = write(fd, wbuf + off, wl - off);
			if (n <= 0) {
				fprintf(stderr, "PROOF FAILED: write: %s\n",
				        strerror(errno));
				return 3;
			}
			off += (size_t)n;
		}
		for (int i = 0; i < window; i++) {
			size_t pre;
			uint64_t blen;
			if (next_frame(fd, &pre, &blen)) {
				fprintf(stderr, "PROOF FAILED: no response "
				                "frame\n");
				return 3;
			}
			Memtally__V1__Response *r = memtally__v1__response__unpack(
			    NULL, blen, rbuf + pre);
			if (!r || r->id != first + (uint64_t)i || r->error ||
			    r->body_case != MEMTALLY__V1__RESPONSE__BODY_USAGE) {
				fprintf(stderr,
				        "PROOF FAILED: response %d of a window: "
				        "%s\n",
				        i,
				        !r ? "undecodable"
				        : r->error ? "an error"
				        : r->id != first + (uint64_t)i
				            ? "wrong id"
				            : "no Usage");
				return 3;
			}
			memtally__v1__response__free_unpacked(r, NULL);
			memmove(rbuf, rbuf + pre + blen, rlen - pre - blen);
			rlen -= pre + blen;
		}
		done += (uint64_t)window;
		t_end = bench_now_ns();
		if (t_end >= deadline)
			break;
	}
	close(fd);
	double secs = (double)(t_end - t0) / 1e9;
	printf("{\"window\": %d, \"requests\": %" PRIu64 ", \"seconds\": %.3f, "
	       "\"per_second\": %.0f}\n",
	       window, done, secs, (double)done / secs);
	free(wbuf);
	return 0;
}
