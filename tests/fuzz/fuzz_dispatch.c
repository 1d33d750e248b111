/*
 * fuzz_dispatch.c - libFuzzer target: a connection's input as memtallyd
 * answers it, through the real mts_input() / mts_dispatch() and the
 * registry behind them, over a real (small) header and slot tables. No
 * socket: the "connection" is the fuzz input, the answers go to a
 * buffer.
 *
 * Each input is delivered twice:
 *   1. whole, by a local peer with credentials (this process), with no
 *      budget, as a test would;
 *   2. in chunks of 1..64 bytes (the chunk size is derived from the input)
 *      by a TCP peer (no credentials), with conn.c's per-turn budget, the
 *      unconsumed tail carried over as conn.c carries it.
 * Each pass stops at MTS_CLOSE, as the connection would. Beyond "no crash,
 * no leak, no read past the input": every byte appended to the output must
 * be a sequence of complete frames each decoding as a Response; a pass must
 * consume input only in whole frames; and a pass that is not closed must
 * leave less than one complete frame unconsumed.
 *
 * The server (registry + header memfd "mt-fuzz-<pid>", 4 slots, a slot
 * table per uid that registers) lives for the whole run, as memtallyd
 * does; every 64 inputs it ticks, so registered state is aged the way the
 * daemon ages it. The objects are anonymous: nothing outlives the run, and
 * with no socket there is no restart record either. A Register answer's
 * descriptors are only borrowed from the registry (there is no socket to
 * pass them on), so they need no closing here.
 */
/* The shared test fixture, without its Criterion part. */
#define FX_NO_CRITERION
#include "../unit/test_server_fixture.h"

#include "memtally.pb-c.h"
#include "mtframe.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static int ready;

static void cleanup(void)
{
	if (!ready)
		return;
	ready = 0;
	fx_server_close();
}

int LLVMFuzzerInitialize(int *argc, char ***argv);
int LLVMFuzzerInitialize(int *argc, char ***argv)
{
	(void)argc;
	(void)argv;
	mts_log_set_level((enum mts_log_level)(MTS_LOG_ERROR + 1)); /* silence the per-frame warnings */
	struct mts_config cfg = fx_config("fuzz", 4);
	if (fx_server_open(&cfg) != 0) {
		fprintf(stderr, "fuzz_dispatch: cannot start a server\n");
		abort();
	}
	ready = 1;
	atexit(cleanup);
	return 0;
}

/* out[from..] must be whole frames, each a decodable Response. */
static void check_output(const struct mts_buf *out, size_t from)
{
	size_t pos = from;
	while (pos < out->len) {
		uint64_t blen;
		int n = mtframe_decode_len(out->data + pos, out->len - pos,
		                           UINT64_MAX, &blen);
		if (n <= 0 || blen > out->len - pos - (size_t)n)
			abort(); /* a torn or malformed response frame */
		Memtally__V1__Response *r = memtally__v1__response__unpack(
		    NULL, (size_t)blen, out->data + pos + n);
		if (!r)
			abort(); /* the server wrote something undecodable */
		memtally__v1__response__free_unpacked(r, NULL);
		pos += (size_t)n + (size_t)blen;
	}
}

/* Whether in[0..len) starts with a complete frame the server would take
 * (prefix valid and within the limit, body all there), or a bad prefix. */
static int has_actionable_frame(const uint8_t *in, size_t len)
{
	uint64_t blen;
	int n = mtframe_decode_len(in, len, MTS_MAX_FRAME, &blen);
	if (n < 0)
		return 1;
	return n > 0 && len - (size_t)n >= blen;
}

static void pass_whole(const uint8_t *data, size_t size)
{
	struct mts_peer peer = {.fd = -1,
	                        .has_cred = true,
	                        .pid = (uint32_t)getpid(),
	                        .uid = (uint32_t)getuid(),
	                        .gid = (uint32_t)getgid()};
	const struct mts_budget unlimited = {.out_bytes = SIZE_MAX,
	                                     .frames = UINT32_MAX};
	struct mts_buf out = {0};
	size_t used = 0;
	int r = mts_input(&srv.reg, &peer, data, size, &out, unlimited, &used);
	if (used > size)
		abort();
	if (r == 0 && has_actionable_frame(data + used, size - used))
		abort(); /* it stopped with a frame it should have answered */
	if (r == MTS_MORE)
		abort(); /* no budget, so never "more" */
	check_output(&out, 0);
	mts_buf_free(&out);
}

static void pass_chunked(const uint8_t *data, size_t size)
{
	struct mts_peer peer = {.fd = -1, .tcp = true};
	const struct mts_budget turn = {.out_bytes = MTS_OUT_HIGH,
	                                .frames = MTS_FRAMES_PER_TURN};
	size_t chunk = 1;
	for (size_t i = 0; i < size; i++)
		chunk = chunk * 31 + data[i];
	chunk = chunk % 64 + 1;

	uint8_t *pending = malloc(size ? size : 1);
	if (!pending)
		abort();
	size_t plen = 0, fed = 0;
	struct mts_buf out = {0};
	int r = 0;
	while (r != MTS_CLOSE) {
		if (r != MTS_MORE) {
			if (fed == size)
				break;
			size_t take = size - fed < chunk ? size - fed : chunk;
			memcpy(pending + plen, data + fed, take);
			plen += take;
			fed += take;
		}
		size_t before = out.len, used = 0;
		r = mts_input(&srv.reg, &peer, pending, plen, &out, turn,
		              &used);
		if (r < 0 || used > plen)
			abort();
		check_output(&out, before);
		memmove(pending, pending + used, plen - used);
		plen -= used;
		/* conn.c writes the output out before reading on. */
		out.len = 0;
	}
	if (r != MTS_CLOSE && has_actionable_frame(pending, plen))
		abort();
	free(pending);
	mts_buf_free(&out);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	static unsigned runs;
	pass_whole(data, size);
	pass_chunked(data, size);
	if (++runs % 64 == 0) {
		mts_core_tick(&srv.reg);
		uv_run(&loop, UV_RUN_NOWAIT);
	}
	return 0;
}
