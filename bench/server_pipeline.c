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

/* A connection to the server at `sock`, or -1 (the proof failed, said on
 * stderr). */
static int connect_to(const char *sock)
{
	int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
	struct sockaddr_un sa = {.sun_family = AF_UNIX};
	snprintf(sa.sun_path, sizeof(sa.sun_path), "%s", sock);
	if (fd < 0 || connect(fd, (struct sockaddr *)&sa, sizeof(sa))) {
		fprintf(stderr, "PROOF FAILED: cannot connect to %s: %s\n",
		        sock, strerror(errno));
		if (fd >= 0)
			close(fd);
		return -1;
	}
	return fd;
}

/* `window` GetUsage frames with ids from *id on, packed into wbuf (cap
 * bytes). Returns their length, 0 if they do not fit. */
static size_t pack_window(uint8_t *wbuf, size_t cap, int window, uint64_t *id)
{
	size_t wl = 0;
	for (int i = 0; i < window; i++) {
		Memtally__V1__GetUsage gu = MEMTALLY__V1__GET_USAGE__INIT;
		Memtally__V1__Request rq = MEMTALLY__V1__REQUEST__INIT;
		rq.id = (*id)++;
		rq.body_case = MEMTALLY__V1__REQUEST__BODY_GET_USAGE;
		rq.get_usage = &gu;
		size_t k = mtframe_pack(&rq.base, wbuf + wl, cap - wl);
		if (!k)
			return 0;
		wl += k;
	}
	return wl;
}

static int write_all(int fd, const uint8_t *buf, size_t len)
{
	for (size_t off = 0; off < len;) {
		ssize_t n = write(fd, buf + off, len - off);
		if (n <= 0) {
			fprintf(stderr, "PROOF FAILED: write: %s\n",
			        strerror(errno));
			return -1;
		}
		off += (size_t)n;
	}
	return 0;
}

/* A window's `window` answers: each a Usage, no error, ids from `first`
 * on in order. Returns 0 or -1 (the proof failed, said on stderr). */
static int read_window(int fd, uint64_t first, int window)
{
	for (int i = 0; i < window; i++) {
		size_t pre;
		uint64_t blen;
		if (next_frame(fd, &pre, &blen)) {
			fprintf(stderr, "PROOF FAILED: no response frame\n");
			return -1;
		}
		Memtally__V1__Response *r =
		    memtally__v1__response__unpack(NULL, blen, rbuf + pre);
		if (!r || r->id != first + (uint64_t)i || r->error ||
		    r->body_case != MEMTALLY__V1__RESPONSE__BODY_USAGE) {
			fprintf(stderr,
			        "PROOF FAILED: response %d of a window: %s\n",
			        i,
			        !r                             ? "undecodable"
			        : r->error                     ? "an error"
			        : r->id != first + (uint64_t)i ? "wrong id"
			                                       : "no Usage");
			return -1;
		}
		memtally__v1__response__free_unpacked(r, NULL);
		memmove(rbuf, rbuf + pre + blen, rlen - pre - blen);
		rlen -= pre + blen;
	}
	return 0;
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
	int fd = connect_to(sock);
	if (fd < 0)
		return 3;
	size_t cap = (size_t)window * 64;
	uint8_t *wbuf = malloc(cap);
	if (!wbuf)
		return 2;
	uint64_t id = 1, done = 0;
	uint64_t t0 = bench_now_ns(), deadline = t0 + (uint64_t)(seconds * 1e9);
	uint64_t t_end;
	do {
		uint64_t first = id;
		size_t wl = pack_window(wbuf, cap, window, &id);
		if (!wl)
			return 2;
		if (write_all(fd, wbuf, wl) || read_window(fd, first, window))
			return 3;
		done += (uint64_t)window;
		t_end = bench_now_ns();
	} while (t_end < deadline);
	close(fd);
	double secs = (double)(t_end - t0) / 1e9;
	printf("{\"window\": %d, \"requests\": %" PRIu64 ", \"seconds\": %.3f, "
	       "\"per_second\": %.0f}\n",
	       window, done, secs, (double)done / secs);
	free(wbuf);
	return 0;
}
