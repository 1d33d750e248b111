/*
 * test_server_dispatch.c - the request dispatcher and the registry behind
 * it, driven with plain buffers (no socket): framing errors, pipelining,
 * back-pressure, Register (repeat, exec, pid reuse, no slots), GetUsage
 * and ListProcesses against counters written straight into the segment,
 * and a worker's exit leaving the published totals in the same loop
 * iteration.
 *
 * Workers are real processes: forked children that wait on a pipe, so a
 * pidfd and /proc/PID/stat exist for them. Every test runs in its own
 * process (Criterion), names its segment after its pid, kills its children
 * and ends by checking that the loop closes with no live handle.
 */
#include "test_server_fixture.h"

#include <sys/stat.h>

#include "mts_figures.h"
#include "mts_procfs.h"

#include <fcntl.h>
#include <sys/syscall.h>

/* Four slots: the tests fill every one with workers of one uid. */
static void setup(void)
{
	fx_start_slots(NULL, 4);
}

TestSuite(dispatch, .init = setup, .fini = fx_stop, .timeout = 30);

static const struct mts_budget unlimited = {.out_bytes = SIZE_MAX,
                                            .frames = UINT32_MAX};

static struct mts_peer peer_of(pid_t pid)
{
	return fx_peer(pid, FX_UID);
}

/* Decode the framed response at out[*pos..], advancing *pos. */
static Memtally__V1__Response *next_response(const struct mts_buf *out,
                                             size_t *pos)
{
	uint64_t blen;
	int n = mtframe_decode_len(out->data + *pos, out->len - *pos,
	                           UINT64_MAX, &blen);
	cr_assert_gt(n, 0, "no complete response frame");
	cr_assert_leq(*pos + (size_t)n + blen, out->len);
	Memtally__V1__Response *r =
	    memtally__v1__response__unpack(NULL, blen, out->data + *pos + n);
	cr_assert_not_null(r, "response does not decode");
	*pos += (size_t)n + blen;
	return r;
}

/* The peer of the latest do_register(): the descriptors it is to get. */
static struct mts_peer last_peer;

static Memtally__V1__Response *
register_as(pid_t pid, const char *group, uint64_t image_id, bool if_registered)
{
	Memtally__V1__Request req = MEMTALLY__V1__REQUEST__INIT;
	Memtally__V1__Register reg = MEMTALLY__V1__REGISTER__INIT;
	reg.group = (char *)group;
	reg.image_id = image_id;
	reg.if_registered = if_registered;
	req.id = 7;
	req.body_case = MEMTALLY__V1__REQUEST__BODY_REGISTER;
	req.register_ = &reg;
	struct mts_peer peer = peer_of(pid);
	Memtally__V1__Response *r = fx_call(&peer, &req);
	last_peer = peer;
	return r;
}

static Memtally__V1__Response *do_register(pid_t pid, const char *group,
                                           uint64_t image_id)
{
	return register_as(pid, group, image_id, false);
}

static uint32_t register_ok(pid_t pid, const char *group, uint64_t image_id)
{
	Memtally__V1__Response *r = do_register(pid, group, image_id);
	cr_assert_null(r->error, "register failed: %s",
	               r->error ? r->error->message : "");
	cr_assert_eq(r->body_case, MEMTALLY__V1__RESPONSE__BODY_REGISTERED);
	uint32_t slot = r->registered->slot;
	memtally__v1__response__free_unpacked(r, NULL);
	return slot;
}

static Memtally__V1__Response *get_usage(int scope, const char *group,
                                         uint32_t pid)
{
	Memtally__V1__Request req = MEMTALLY__V1__REQUEST__INIT;
	Memtally__V1__GetUsage q = MEMTALLY__V1__GET_USAGE__INIT;
	q.scope_case = scope;
	if (scope == MEMTALLY__V1__GET_USAGE__SCOPE_GROUP)
		q.group = (char *)group;
	if (scope == MEMTALLY__V1__GET_USAGE__SCOPE_PID)
		q.pid = pid;
	req.id = 9;
	req.body_case = MEMTALLY__V1__REQUEST__BODY_GET_USAGE;
	req.get_usage = &q;
	struct mts_peer peer = peer_of(getpid());
	return fx_call(&peer, &req);
}

/* What a worker's client would do: lane 0 holds `bytes`. */
static void write_lane(uint32_t slot, int64_t bytes, uint32_t threads)
{
	struct mtshm_slot_id *s = mts_slot(&srv.reg, slot);
	mtshm_store_relaxed32(&s->threads, threads);
	mtshm_store_relaxed32(&s->lanes_used, 1);
	mtshm_store_relaxeds64(&mtshm_lane(s, 0)->bytes, bytes);
	mtshm_store_relaxed64(&mtshm_lane(s, 0)->flushes, 3);
}

/* Register `pid` in `group` (image 1) holding `bytes` on one thread, as
 * its client would have flushed them; its slot. */
static uint32_t worker(pid_t pid, const char *group, int64_t bytes)
{
	uint32_t slot = register_ok(pid, group, 1);
	write_lane(slot, bytes, 1);
	return slot;
}

static void expect_error(Memtally__V1__Response *r, uint64_t id,
                         Memtally__V1__ErrorCode code)
{
	cr_assert_not_null(r->error);
	cr_assert_eq(r->id, id);
	cr_assert_eq(r->error->code, code, "code %d, want %d (%s)",
	             r->error->code, code, r->error->message);
	cr_assert_gt(strlen(r->error->message), 0);
	memtally__v1__response__free_unpacked(r, NULL);
}

/* ---- envelope ---------------------------------------------------------- */

Test(dispatch, no_body_is_invalid)
{
	Memtally__V1__Request req = MEMTALLY__V1__REQUEST__INIT;
	req.id = 42;
	struct mts_peer peer = peer_of(getpid());
	expect_error(fx_call(&peer, &req), 42,
	             MEMTALLY__V1__ERROR_CODE__ERROR_INVALID_REQUEST);
}

Test(dispatch, empty_admit_invalid_watch_answered)
{
	/* Admission bodies are implemented (see test_server_admit.c and
	 * test_server_limits.c); an Admit of nothing is malformed. */
	Memtally__V1__Request req = MEMTALLY__V1__REQUEST__INIT;
	Memtally__V1__Admit admit = MEMTALLY__V1__ADMIT__INIT;
	Memtally__V1__Watch watch = MEMTALLY__V1__WATCH__INIT;
	struct mts_peer peer = peer_of(getpid());
	req.id = 5;
	req.body_case = MEMTALLY__V1__REQUEST__BODY_ADMIT;
	req.admit = &admit;
	expect_error(fx_call(&peer, &req), 5,
	             MEMTALLY__V1__ERROR_CODE__ERROR_INVALID_REQUEST);
	cr_assert_eq(srv.reg.adm->stats.denials[MTS_DENY_INVALID], 1);
	req.body_case = MEMTALLY__V1__REQUEST__BODY_WATCH;
	req.watch = &watch;
	Memtally__V1__Response *r = fx_call(&peer, &req);
	cr_assert_null(r->error);
	cr_assert_eq(r->body_case, MEMTALLY__V1__RESPONSE__BODY_EVENT);
	cr_assert_str_eq(r->event->scope, "fleet");
	cr_assert(peer.watching);
	cr_assert_eq(peer.watch_id, 5);
	memtally__v1__response__free_unpacked(r, NULL);
}

Test(dispatch, unknown_body_field_unsupported)
{
	/* id = 3, then field 20 (length-delimited, empty): a body from a
	 * newer protocol. */
	const uint8_t body[] = {0x08, 0x03, 0xa2, 0x01, 0x00};
	struct mts_buf out = {0};
	size_t pos = 0;
	struct mts_peer peer = peer_of(getpid());
	cr_assert_eq(mts_dispatch(&srv.reg, &peer, body, sizeof(body), &out),
	             0);
	expect_error(next_response(&out, &pos), 3,
	             MEMTALLY__V1__ERROR_CODE__ERROR_UNSUPPORTED);
	mts_buf_free(&out);
}

Test(dispatch, undecodable_answers_then_closes)
{
	const uint8_t junk[] = {0xff, 0xff, 0xff};
	struct mts_buf out = {0};
	size_t pos = 0;
	struct mts_peer peer = peer_of(getpid());
	cr_assert_eq(mts_dispatch(&srv.reg, &peer, junk, sizeof(junk), &out),
	             MTS_CLOSE);
	expect_error(next_response(&out, &pos), 0,
	             MEMTALLY__V1__ERROR_CODE__ERROR_UNDECODABLE);
	mts_buf_free(&out);
}

/* A GetUsage request (id 9) with `extra` unknown varint fields (field
 * 15, value 0), `inside` of them in its body; its length in *len. */
static uint8_t *many_fields(int extra, int inside, size_t *len)
{
	uint8_t *b = malloc(16 + 2 * (size_t)extra);
	size_t n = 0;
	b[n++] = 0x08; /* id = 9 */
	b[n++] = 0x09;
	for (int i = 0; i < extra - inside; i++) {
		b[n++] = 0x78; /* field 15, varint */
		b[n++] = 0x00;
	}
	b[n++] = 0x22; /* field 4, get_usage */
	size_t at = n++;
	for (int i = 0; i < inside; i++) {
		b[n++] = 0x78;
		b[n++] = 0x00;
	}
	b[at] = (uint8_t)(n - at - 1); /* < 128 in these tests */
	*len = n;
	return b;
}

Test(dispatch, a_request_of_too_many_fields_is_not_decoded)
{
	struct mts_peer peer = peer_of(getpid());
	const struct {
		int extra, inside;
		bool ok;
	} c[] = {
	    /* id, get_usage and 60 unknown fields: within 64. */
	    {60, 30, true},
	    {62, 62, true},
	    /* 65 and more, before the body, or within it. */
	    {63, 0, false},
	    {63, 63, false},
	    {2000, 10, false},
	};
	for (size_t i = 0; i < sizeof(c) / sizeof(c[0]); i++) {
		size_t len;
		uint8_t *b = many_fields(c[i].extra, c[i].inside, &len);
		struct mts_buf out = {0};
		size_t pos = 0;
		uint64_t errs = srv.reg.req->protocol_errors;
		int rc = mts_dispatch(&srv.reg, &peer, b, len, &out);
		Memtally__V1__Response *r = next_response(&out, &pos);
		if (c[i].ok) {
			cr_assert_eq(rc, 0, "case %zu", i);
			cr_assert_eq(r->id, 9);
			cr_assert_eq(r->body_case,
			             MEMTALLY__V1__RESPONSE__BODY_USAGE);
			memtally__v1__response__free_unpacked(r, NULL);
		} else {
			cr_assert_eq(rc, MTS_CLOSE, "case %zu", i);
			expect_error(
			    r, 0, MEMTALLY__V1__ERROR_CODE__ERROR_UNDECODABLE);
			cr_assert_eq(srv.reg.req->protocol_errors, errs + 1);
		}
		mts_buf_free(&out);
		free(b);
	}
}

/* The error's message must start with `prefix`. */
static void expect_invalid(Memtally__V1__Response *r, uint64_t id,
                           const char *prefix)
{
	cr_assert_not_null(r->error);
	cr_assert(strncmp(r->error->message, prefix, strlen(prefix)) == 0,
	          "message \"%s\", want \"%s...\"", r->error->message, prefix);
	expect_error(r, id, MEMTALLY__V1__ERROR_CODE__ERROR_INVALID_REQUEST);
}

Test(dispatch, a_bad_name_is_named_wherever_it_comes)
{
	struct mts_peer peer = peer_of(getpid());
	Memtally__V1__Request req = MEMTALLY__V1__REQUEST__INIT;
	req.id = 11;

	/* Filters no group or kind can bear: refused, not an empty list. */
	Memtally__V1__ListProcesses lp = MEMTALLY__V1__LIST_PROCESSES__INIT;
	lp.group = "\xff\xfe";
	req.body_case = MEMTALLY__V1__REQUEST__BODY_LIST_PROCESSES;
	req.list_processes = &lp;
	expect_invalid(fx_call(&peer, &req), 11, "group:");
	Memtally__V1__Kinds kq = MEMTALLY__V1__KINDS__INIT;
	kq.kind = "a\x01";
	req.body_case = MEMTALLY__V1__REQUEST__BODY_KINDS;
	req.kinds = &kq;
	expect_invalid(fx_call(&peer, &req), 11, "kind:");

	/* Admit says which of its names is wrong. */
	Memtally__V1__Admit ad = MEMTALLY__V1__ADMIT__INIT;
	ad.bytes = 100;
	ad.kind = "k\xff";
	req.body_case = MEMTALLY__V1__REQUEST__BODY_ADMIT;
	req.admit = &ad;
	expect_invalid(fx_call(&peer, &req), 11, "kind:");
	ad.kind = "";
	ad.task = "t\xe2\x80\xae";
	expect_invalid(fx_call(&peer, &req), 11, "task:");
	ad.task = "";
	ad.group = "g\xed\xa0\x80";
	expect_invalid(fx_call(&peer, &req), 11, "group:");
	ad.group = "";
	ad.bytes = 0;
	expect_invalid(fx_call(&peer, &req), 11, "bytes must be above 0");
	cr_assert_eq(srv.reg.adm->stats.denials[MTS_DENY_INVALID], 4);
	cr_assert_eq(srv.reg.adm->stats.admissions, 0);
}

Test(dispatch, a_name_holding_a_zero_byte_is_refused_not_cut)
{
	/* Request{id 12, admit{bytes 100, kind "nul\0\x1b[31m"}}: protobuf-c
	 * would hand over "nul", and its checks would pass. */
	const uint8_t frame[] = {0x08, 12,   0x32, 14,  0x08, 100,
	                         0x3a, 0x00, 'n',  'u', 'l',  0x00,
	                         0x1b, '[',  '3',  '1', 'm'};
	uint8_t b[sizeof(frame)];
	memcpy(b, frame, sizeof(b));
	/* The kind's field number: looked up, not assumed. */
	const ProtobufCFieldDescriptor *f =
	    protobuf_c_message_descriptor_get_field_by_name(
	        &memtally__v1__admit__descriptor, "kind");
	cr_assert_not_null(f);
	b[6] = (uint8_t)(f->id << 3 | 2);
	b[7] = 9;
	b[3] = (uint8_t)(sizeof(b) - 4);
	struct mts_peer peer = peer_of(getpid());
	struct mts_buf out = {0};
	size_t pos = 0;
	cr_assert_eq(mts_dispatch(&srv.reg, &peer, b, sizeof(b), &out), 0);
	expect_invalid(next_response(&out, &pos), 12, "kind:");
	cr_assert_eq(srv.reg.adm->stats.admissions, 0);
	mts_buf_free(&out);

	/* The same kind without the 0 byte and what follows: granted. */
	b[7] = 3;
	b[3] = 4 + 3;
	struct mts_buf out2 = {0};
	pos = 0;
	cr_assert_eq(mts_dispatch(&srv.reg, &peer, b, 4 + 4 + 3, &out2), 0);
	Memtally__V1__Response *r = next_response(&out2, &pos);
	cr_assert_null(r->error, "%s", r->error ? r->error->message : "");
	cr_assert(r->admit_result->admitted);
	memtally__v1__response__free_unpacked(r, NULL);
	mts_buf_free(&out2);
}

Test(dispatch, frame_too_large)
{
	uint8_t in[MTFRAME_MAX_VARINT];
	size_t n = mtframe_encode_len(MTS_MAX_FRAME + 1, in);
	struct mts_buf out = {0};
	size_t used = 99, pos = 0;
	struct mts_peer peer = peer_of(getpid());
	/* Refused from the prefix alone, before any body arrives. */
	cr_assert_eq(mts_input(&srv.reg, &peer, in, n, &out, unlimited, &used),
	             MTS_CLOSE);
	cr_assert_eq(used, 0);
	expect_error(next_response(&out, &pos), 0,
	             MEMTALLY__V1__ERROR_CODE__ERROR_FRAME_TOO_LARGE);
	mts_buf_free(&out);
}

Test(dispatch, bad_varint)
{
	uint8_t in[11];
	memset(in, 0xff, sizeof(in));
	struct mts_buf out = {0};
	size_t used, pos = 0;
	struct mts_peer peer = peer_of(getpid());
	cr_assert_eq(
	    mts_input(&srv.reg, &peer, in, sizeof(in), &out, unlimited, &used),
	    MTS_CLOSE);
	expect_error(next_response(&out, &pos), 0,
	             MEMTALLY__V1__ERROR_CODE__ERROR_UNDECODABLE);
	mts_buf_free(&out);
}

/* Three GetUsage frames (ids 1..3) and half of a fourth. */
static size_t pipelined_input(uint8_t *in, size_t cap, size_t *whole)
{
	size_t len = 0;
	for (uint64_t id = 1; id <= 4; id++) {
		Memtally__V1__Request req = MEMTALLY__V1__REQUEST__INIT;
		Memtally__V1__GetUsage q = MEMTALLY__V1__GET_USAGE__INIT;
		req.id = id;
		req.body_case = MEMTALLY__V1__REQUEST__BODY_GET_USAGE;
		req.get_usage = &q;
		if (id == 4)
			*whole = len;
		len += mtframe_pack(&req.base, in + len, cap - len);
	}
	return len - 1; /* cut the last frame short */
}

Test(dispatch, pipelined_in_order_and_partial_frame_kept)
{
	uint8_t in[256];
	size_t whole;
	size_t len = pipelined_input(in, sizeof(in), &whole);
	struct mts_buf out = {0};
	size_t used, pos = 0;
	struct mts_peer peer = peer_of(getpid());
	cr_assert_eq(
	    mts_input(&srv.reg, &peer, in, len, &out, unlimited, &used), 0);
	cr_assert_eq(used, whole, "the partial frame must stay buffered");
	for (uint64_t id = 1; id <= 3; id++) {
		Memtally__V1__Response *r = next_response(&out, &pos);
		cr_assert_eq(r->id, id);
		cr_assert_eq(r->body_case, MEMTALLY__V1__RESPONSE__BODY_USAGE);
		memtally__v1__response__free_unpacked(r, NULL);
	}
	cr_assert_eq(pos, out.len);
	mts_buf_free(&out);
}

Test(dispatch, budgets_stop_answering)
{
	uint8_t in[256];
	size_t whole;
	size_t len = pipelined_input(in, sizeof(in), &whole);
	struct mts_peer peer = peer_of(getpid());
	/* An output budget of one byte, then a budget of two frames: each
	 * stops with MTS_MORE and leaves the rest in the input. */
	const struct mts_budget budgets[] = {
	    {.out_bytes = 1, .frames = UINT32_MAX},
	    {.out_bytes = SIZE_MAX, .frames = 2},
	};
	const uint64_t answered[] = {1, 2};
	for (int b = 0; b < 2; b++) {
		struct mts_buf out = {0};
		size_t used, pos = 0;
		cr_assert_eq(mts_input(&srv.reg, &peer, in, len, &out,
		                       budgets[b], &used),
		             MTS_MORE);
		for (uint64_t id = 1; id <= answered[b]; id++) {
			Memtally__V1__Response *r = next_response(&out, &pos);
			cr_assert_eq(r->id, id);
			memtally__v1__response__free_unpacked(r, NULL);
		}
		cr_assert_eq(pos, out.len, "answered past the budget");
		cr_assert_lt(used, whole);
		cr_assert_gt(used, 0);
		/* The rest is answered by the next call, in order. */
		size_t used2;
		cr_assert_eq(mts_input(&srv.reg, &peer, in + used, len - used,
		                       &out, unlimited, &used2),
		             0);
		cr_assert_eq(used + used2, whole);
		for (uint64_t id = answered[b] + 1; id <= 3; id++) {
			Memtally__V1__Response *r = next_response(&out, &pos);
			cr_assert_eq(r->id, id);
			memtally__v1__response__free_unpacked(r, NULL);
		}
		cr_assert_eq(pos, out.len);
		mts_buf_free(&out);
	}
}

/* ---- Register ---------------------------------------------------------- */

Test(dispatch, register_publishes_slot)
{
	pid_t kid = fx_spawn();
	Memtally__V1__Response *r = do_register(kid, "", 11);
	cr_assert_null(r->error);
	cr_assert_eq(r->id, 7);
	Memtally__V1__Registered *ok = r->registered;
	cr_assert_str_eq(ok->group, "default");
	cr_assert_str_eq(ok->segment, segname + 1); /* a label, no '/' */
	cr_assert_eq(ok->threshold, 1000);
	cr_assert_eq(ok->segment_generation, srv.map.hdr->generation);
	struct mtshm_slot_id *s = mts_slot(&srv.reg, ok->slot);
	cr_assert_eq(mtshm_load_acquire32(&s->pid), (uint32_t)kid);
	cr_assert_eq(s->uid, 1000);
	cr_assert_eq(s->generation, ok->slot_generation);
	uint64_t st;
	cr_assert_eq(mts_read_starttime(kid, &st), 0);
	cr_assert_eq(s->start_time, st);
	/* The answer carries the header (read-only, write-sealed) and the
	 * table of the peer's uid (resize-sealed), in that order. */
	cr_assert_eq(last_peer.nsend_fds, 2);
	int hs = fcntl(last_peer.send_fds[0], F_GET_SEALS);
	int ts = fcntl(last_peer.send_fds[1], F_GET_SEALS);
	cr_assert_eq(hs & MTSHM_SEALS_HEADER, MTSHM_SEALS_HEADER);
	cr_assert_eq(ts & MTSHM_SEALS_TABLE, MTSHM_SEALS_TABLE);
	cr_assert_eq(fcntl(last_peer.send_fds[0], F_GETFL) & O_ACCMODE,
	             O_RDONLY);
	struct mts_table *t = mts_table_find(&srv.reg, 1000);
	cr_assert_not_null(t);
	cr_assert_eq(last_peer.send_fds[1], t->map.fd);
	cr_assert_eq((char *)s,
	             (char *)t->map.base +
	                 (size_t)ok->slot * srv.reg.layout.slot_stride);
	memtally__v1__response__free_unpacked(r, NULL);
	cr_assert_eq(srv.reg.nfree, 3);
}

Test(dispatch, repeat_keeps_slot_exec_resets_it)
{
	pid_t kid = fx_spawn();
	uint32_t slot = register_ok(kid, "a", 1);
	struct mtshm_slot_id *s = mts_slot(&srv.reg, slot);
	uint64_t gen = s->generation;
	write_lane(slot, 5000, 1);
	mts_core_tick(&srv.reg);

	/* Same image: same slot, counters untouched. */
	cr_assert_eq(register_ok(kid, "a", 1), slot);
	cr_assert_eq(s->generation, gen);
	cr_assert_eq(mtshm_lane(s, 0)->bytes, 5000);

	/* New image (exec): same slot, zeroed, new generation, new group,
	 * and its old bytes leave the published total at once. */
	cr_assert_eq(register_ok(kid, "b", 2), slot);
	cr_assert_eq(s->generation, gen + 1);
	cr_assert_eq(mtshm_lane(s, 0)->bytes, 0);
	cr_assert_eq(s->lanes_used, 0);
	struct mtshm_fleet f;
	cr_assert_eq(mtshm_fleet_read(srv.map.hdr, &f), 0);
	cr_assert_eq(f.bytes, 0);
	cr_assert_eq(f.processes, 1);
	cr_assert_null(mts_find_group(&srv.reg, "a"), "empty group kept");
	cr_assert_not_null(mts_find_group(&srv.reg, "b"));
	cr_assert_eq(srv.reg.nfree, 3);
}

Test(dispatch, if_registered_only_replaces)
{
	/* A process nobody registered: told so; no slot, group or count. */
	pid_t kid = fx_spawn();
	uint32_t nfree = srv.reg.nfree;
	expect_error(register_as(kid, "a", 1, true), 7,
	             MEMTALLY__V1__ERROR_CODE__ERROR_NOT_REGISTERED);
	cr_assert_eq(last_peer.nsend_fds, 0, "descriptors sent with a no");
	cr_assert_null(mts_find_pid(&srv.reg, (uint32_t)kid));
	cr_assert_null(mts_find_group(&srv.reg, "a"));
	cr_assert_eq(srv.reg.totals.processes, 0);
	cr_assert_eq(srv.reg.totals.unregistered, 0);
	cr_assert_eq(srv.reg.nfree, nfree);

	/* Registered (image 1): a new image asking so replaces it, as an
	 * exec's registration does: same slot, zeroed, new generation. */
	uint32_t slot = register_ok(kid, "a", 1);
	struct mtshm_slot_id *s = mts_slot(&srv.reg, slot);
	uint64_t gen = s->generation;
	write_lane(slot, 5000, 1);
	mts_core_tick(&srv.reg);
	Memtally__V1__Response *r = register_as(kid, "b", 2, true);
	cr_assert_null(r->error, "%s", r->error ? r->error->message : "");
	cr_assert_eq(r->registered->slot, slot);
	cr_assert_eq(last_peer.nsend_fds, 2);
	memtally__v1__response__free_unpacked(r, NULL);
	cr_assert_eq(s->generation, gen + 1);
	cr_assert_eq(mtshm_lane(s, 0)->bytes, 0);
	cr_assert_eq(srv.reg.totals.processes, 1);
	cr_assert_not_null(mts_find_group(&srv.reg, "b"));

	/* The pid now names a later process: the old entry is reclaimed
	 * and the newcomer, which asked only to replace, gets nothing. */
	mts_find_pid(&srv.reg, (uint32_t)kid)->start_time++;
	expect_error(register_as(kid, "b", 3, true), 7,
	             MEMTALLY__V1__ERROR_CODE__ERROR_NOT_REGISTERED);
	cr_assert_null(mts_find_pid(&srv.reg, (uint32_t)kid));
	cr_assert_eq(srv.reg.totals.processes, 0);
	uv_run(&loop, UV_RUN_NOWAIT); /* run the old poll's close */
}

Test(dispatch, pid_reuse_reclaims)
{
	pid_t kid = fx_spawn();
	uint32_t slot = register_ok(kid, "a", 1);
	write_lane(slot, 5000, 1);
	mts_core_tick(&srv.reg);
	/* Pretend the registry saw an earlier process with this pid. */
	struct mts_proc *p = mts_find_pid(&srv.reg, (uint32_t)kid);
	cr_assert_not_null(p);
	p->start_time++;
	uint64_t gen = mts_slot(&srv.reg, slot)->generation;
	/* The old entry is reclaimed (its bytes leave the totals) and the
	 * newcomer gets a fresh slot: the freed one, re-initialised. */
	cr_assert_eq(register_ok(kid, "a", 1), slot);
	cr_assert_eq(mts_slot(&srv.reg, slot)->generation, gen + 1);
	cr_assert_eq(mtshm_lane(mts_slot(&srv.reg, slot), 0)->bytes, 0);
	cr_assert_eq(srv.reg.totals.bytes, 0);
	cr_assert_eq(srv.reg.totals.processes, 1);
	cr_assert_eq(srv.reg.stats.reclaims, 1);
	uv_run(&loop, UV_RUN_NOWAIT); /* run the old poll's close */
}

Test(dispatch, bad_names_and_no_credentials)
{
	pid_t kid = fx_spawn();
	expect_error(do_register(kid, "a\x01", 1), 7,
	             MEMTALLY__V1__ERROR_CODE__ERROR_INVALID_REQUEST);
	char longname[MTS_NAME_MAX + 2];
	memset(longname, 'g', sizeof(longname) - 1);
	longname[sizeof(longname) - 1] = '\0';
	expect_error(do_register(kid, longname, 1), 7,
	             MEMTALLY__V1__ERROR_CODE__ERROR_INVALID_REQUEST);

	Memtally__V1__Request req = MEMTALLY__V1__REQUEST__INIT;
	Memtally__V1__Register reg = MEMTALLY__V1__REGISTER__INIT;
	req.id = 8;
	req.body_case = MEMTALLY__V1__REQUEST__BODY_REGISTER;
	req.register_ = &reg;
	struct mts_peer anon = {.fd = -1};
	expect_error(fx_call(&anon, &req), 8,
	             MEMTALLY__V1__ERROR_CODE__ERROR_NO_PEER_CREDENTIALS);
	reg.layout_major = MTSHM_VERSION_MAJOR + 1;
	struct mts_peer peer = peer_of(kid);
	expect_error(fx_call(&peer, &req), 8,
	             MEMTALLY__V1__ERROR_CODE__ERROR_UNSUPPORTED);
	cr_assert_eq(srv.reg.nfree, 4);

	/* A group name is echoed in GetUsage's answer: one that is not a
	 * name (cut UTF-8, a control character) is refused, not echoed. */
	expect_error(
	    get_usage(MEMTALLY__V1__GET_USAGE__SCOPE_GROUP, "etl\xe3\x83", 0),
	    9, MEMTALLY__V1__ERROR_CODE__ERROR_INVALID_REQUEST);
	expect_error(
	    get_usage(MEMTALLY__V1__GET_USAGE__SCOPE_GROUP, "a\x1b[2J", 0), 9,
	    MEMTALLY__V1__ERROR_CODE__ERROR_INVALID_REQUEST);
	Memtally__V1__Response *r =
	    get_usage(MEMTALLY__V1__GET_USAGE__SCOPE_GROUP, "not-yet", 0);
	cr_assert_null(r->error);
	cr_assert_str_eq(r->usage->group->name, "not-yet");
	cr_assert_eq(r->usage->group->bytes, 0);
	memtally__v1__response__free_unpacked(r, NULL);
}

Test(dispatch, dead_peer_not_registered)
{
	pid_t kid = fx_spawn();
	kill(kid, SIGKILL);
	waitpid(kid, NULL, 0);
	expect_error(do_register(kid, "a", 1), 7,
	             MEMTALLY__V1__ERROR_CODE__ERROR_NOT_FOUND);
	cr_assert_eq(srv.reg.nfree, 4);
}

Test(dispatch, no_slots_counts_unregistered)
{
	for (int i = 0; i < 4; i++)
		register_ok(fx_spawn(), "g", 1);
	expect_error(do_register(fx_spawn(), "g", 1), 7,
	             MEMTALLY__V1__ERROR_CODE__ERROR_NO_SLOTS);
	mts_core_tick(&srv.reg);
	Memtally__V1__Response *r =
	    get_usage(MEMTALLY__V1__GET_USAGE__SCOPE__NOT_SET, NULL, 0);
	cr_assert_eq(r->usage->unregistered, 1);
	cr_assert_eq(r->usage->slots_free, 0);
	cr_assert_eq(r->usage->processes, 4);
	memtally__v1__response__free_unpacked(r, NULL);
	struct mtshm_fleet f;
	cr_assert_eq(mtshm_fleet_read(srv.map.hdr, &f), 0);
	cr_assert_eq(f.unregistered, 1);
}

/* ---- usage, listing, exit ---------------------------------------------- */

Test(dispatch, usage_and_list)
{
	pid_t a = fx_spawn(), b = fx_spawn(), c = fx_spawn();
	uint32_t sa = register_ok(a, "etl", 1);
	uint32_t sb = register_ok(b, "etl", 1);
	uint32_t sc = register_ok(c, "web", 1);
	write_lane(sa, 1000, 1);
	write_lane(sb, 3000, 2);
	write_lane(sc, -50, 1); /* frees of another's memory: shows as 0 */
	mts_core_tick(&srv.reg);

	Memtally__V1__Response *r =
	    get_usage(MEMTALLY__V1__GET_USAGE__SCOPE__NOT_SET, NULL, 0);
	Memtally__V1__Usage *u = r->usage;
	cr_assert_eq(u->fleet_bytes, 4000);
	cr_assert_eq(u->fleet_peak, 4000);
	cr_assert_eq(u->processes, 3);
	cr_assert_eq(u->error_bytes, 4 * 1000);
	cr_assert_eq(u->ticks, 1);
	cr_assert_eq(u->threshold, 1000);
	cr_assert_eq(u->slots, 4);
	cr_assert_eq(u->slots_free, 1);
	cr_assert_eq(u->fleet_limit, 0);
	cr_assert_eq(u->state, MEMTALLY__V1__STATE__STATE_OK);
	cr_assert_eq(u->n_groups, 2);
	for (size_t i = 0; i < u->n_groups; i++) {
		Memtally__V1__GroupUsage *g = u->groups[i];
		bool etl = strcmp(g->name, "etl") == 0;
		cr_assert_eq(g->bytes, etl ? 4000 : 0);
		cr_assert_eq(g->processes, etl ? 2 : 1);
		cr_assert_eq(g->error_bytes, etl ? 3000 : 1000);
	}
	memtally__v1__response__free_unpacked(r, NULL);

	struct mtshm_fleet f;
	cr_assert_eq(mtshm_fleet_read(srv.map.hdr, &f), 0);
	cr_assert_eq(f.bytes, 4000);
	cr_assert_eq(f.processes, 3);
	cr_assert_eq(f.ticks, 1);
	cr_assert_eq(f.seq % 2, 0);
	cr_assert_gt(f.heartbeat_ns, 0);
	cr_assert_eq(mts_slot(&srv.reg, sb)->peak, 3000);

	r = get_usage(MEMTALLY__V1__GET_USAGE__SCOPE_GROUP, "etl", 0);
	cr_assert_eq(r->usage->group->bytes, 4000);
	cr_assert_eq(r->usage->group->processes, 2);
	cr_assert_eq(r->usage->n_groups, 0);
	memtally__v1__response__free_unpacked(r, NULL);
	r = get_usage(MEMTALLY__V1__GET_USAGE__SCOPE_GROUP, "nobody", 0);
	cr_assert_str_eq(r->usage->group->name, "nobody");
	cr_assert_eq(r->usage->group->processes, 0);
	memtally__v1__response__free_unpacked(r, NULL);

	r = get_usage(MEMTALLY__V1__GET_USAGE__SCOPE_PID, NULL, (uint32_t)b);
	Memtally__V1__ProcessInfo *pi = r->usage->process;
	cr_assert_eq(pi->pid, (uint32_t)b);
	cr_assert_str_eq(pi->group, "etl");
	cr_assert_eq(pi->bytes, 3000);
	cr_assert_eq(pi->threads, 2);
	cr_assert_eq(pi->flushes, 3);
	cr_assert_eq(pi->slot, sb);
	cr_assert_eq(pi->uid, 1000);
	cr_assert_eq(pi->error_bytes, 2000);
	cr_assert_gt(pi->registered_ns, 0);
	cr_assert_gt(pi->start_time, 0);
	cr_assert_gt(strlen(pi->comm), 0);
	memtally__v1__response__free_unpacked(r, NULL);
	expect_error(get_usage(MEMTALLY__V1__GET_USAGE__SCOPE_PID, NULL, 1), 9,
	             MEMTALLY__V1__ERROR_CODE__ERROR_NOT_FOUND);

	Memtally__V1__Request req = MEMTALLY__V1__REQUEST__INIT;
	Memtally__V1__ListProcesses lp = MEMTALLY__V1__LIST_PROCESSES__INIT;
	req.body_case = MEMTALLY__V1__REQUEST__BODY_LIST_PROCESSES;
	req.list_processes = &lp;
	struct mts_peer peer = peer_of(getpid());
	r = fx_call(&peer, &req);
	Memtally__V1__ProcessList *pl = r->process_list;
	cr_assert_eq(pl->n_processes, 3);
	cr_assert_eq(pl->processes[0]->pid, (uint32_t)b);
	cr_assert_eq(pl->processes[1]->pid, (uint32_t)a);
	cr_assert_eq(pl->processes[2]->pid, (uint32_t)c);
	cr_assert_eq(pl->processes[2]->bytes, 0);
	memtally__v1__response__free_unpacked(r, NULL);
	lp.group = "web";
	r = fx_call(&peer, &req);
	cr_assert_eq(r->process_list->n_processes, 1);
	cr_assert_eq(r->process_list->processes[0]->pid, (uint32_t)c);
	memtally__v1__response__free_unpacked(r, NULL);
}

/* ---- the figures table against the protocol ---------------------------- */

/* The protobuf type a figure of `unit` is sent as. */
static ProtobufCType wire_type(enum mts_fig_unit unit)
{
	switch (unit) {
	case MTS_FIG_BYTES:
		return PROTOBUF_C_TYPE_UINT64;
	case MTS_FIG_COUNT:
		return PROTOBUF_C_TYPE_UINT32;
	case MTS_FIG_STATE:
		return PROTOBUF_C_TYPE_ENUM;
	case MTS_FIG_BYTES_PER_S:
		return PROTOBUF_C_TYPE_DOUBLE;
	}
	return PROTOBUF_C_TYPE_BYTES;
}

/* Row k's value in a test: distinct per row and per scope. */
static double row_value(const struct mts_figure *f, size_t k, bool group)
{
	if (f->unit == MTS_FIG_STATE)
		return group ? MTSHM_STATE_OVER : MTSHM_STATE_HIGH;
	return (double)(1000 * (k + 1) + (group ? 7 : 0)) +
	       (f->unit == MTS_FIG_BYTES_PER_S ? 0.5 : 0);
}

static void set_row(struct mts_figures *v, const struct mts_figure *f, double x)
{
	char *at = (char *)v + f->offset;
	switch (f->unit) {
	case MTS_FIG_BYTES:
		*(uint64_t *)at = (uint64_t)x;
		break;
	case MTS_FIG_COUNT:
	case MTS_FIG_STATE:
		*(uint32_t *)at = (uint32_t)x;
		break;
	case MTS_FIG_BYTES_PER_S:
		*(double *)at = x;
		break;
	}
}

static double field_of(const ProtobufCMessage *m, unsigned id)
{
	const ProtobufCFieldDescriptor *fd =
	    protobuf_c_message_descriptor_get_field(m->descriptor, id);
	const char *at = (const char *)m + fd->offset;
	switch (fd->type) {
	case PROTOBUF_C_TYPE_UINT64:
		return (double)*(const uint64_t *)at;
	case PROTOBUF_C_TYPE_UINT32:
		return *(const uint32_t *)at;
	case PROTOBUF_C_TYPE_ENUM:
		return *(const int *)at;
	case PROTOBUF_C_TYPE_DOUBLE:
		return *(const double *)at;
	default:
		cr_assert_fail("field %u: unexpected type", id);
	}
	return 0;
}

/* Every field of `d` is a table row's, or one of `own` (filled by
 * dispatch.c itself): a field added to the protocol without either would
 * go out as 0. */
static void assert_covered(const ProtobufCMessageDescriptor *d, bool group,
                           const char *const *own)
{
	for (unsigned i = 0; i < d->n_fields; i++) {
		const ProtobufCFieldDescriptor *fd = &d->fields[i];
		bool found = false;
		for (size_t k = 0; k < mts_figure_count; k++) {
			const struct mts_figure *f = &mts_figure_table[k];
			unsigned id = group ? f->group_field : f->usage_field;
			found |= (f->out & MTS_FIG_PROTO) && id == fd->id;
		}
		for (const char *const *n = own; *n; n++)
			found |= strcmp(*n, fd->name) == 0;
		cr_expect(found, "%s.%s is in no row of mts_figure_table",
		          d->name, fd->name);
	}
}

/* Each row of the table reaches the Usage and GroupUsage fields it names,
 * with their types; every figure field of both is a row's. */
Test(dispatch, figures_reach_their_fields)
{
	for (size_t k = 0; k < mts_figure_count; k++) {
		const struct mts_figure *f = &mts_figure_table[k];
		if (!(f->out & MTS_FIG_PROTO))
			continue;
		const ProtobufCFieldDescriptor *u =
		    protobuf_c_message_descriptor_get_field(
		        &memtally__v1__usage__descriptor, f->usage_field);
		const ProtobufCFieldDescriptor *g =
		    protobuf_c_message_descriptor_get_field(
		        &memtally__v1__group_usage__descriptor, f->group_field);
		cr_assert(u && g, "%s: no field %u / %u", f->name,
		          f->usage_field, f->group_field);
		cr_assert_eq(u->type, wire_type(f->unit), "Usage.%s", u->name);
		cr_assert_eq(g->type, wire_type(f->unit), "GroupUsage.%s",
		             g->name);
	}
	static const char *const fleet_own[] = {"groups",
	                                        "group",
	                                        "process",
	                                        "unregistered",
	                                        "ticks",
	                                        "threshold",
	                                        "slots",
	                                        "slots_free",
	                                        "measure",
	                                        "process_limit",
	                                        "high_watermark_bytes",
	                                        "seconds_to_limit",
	                                        "growth_window_ms",
	                                        "forecast_horizon_ms",
	                                        "node_bytes",
	                                        "node_line",
	                                        "node_limit",
	                                        "node_source",
	                                        "node_edge",
	                                        NULL};
	static const char *const group_own[] = {"name", "high_watermark_bytes",
	                                        "seconds_to_limit", NULL};
	assert_covered(&memtally__v1__usage__descriptor, false, fleet_own);
	assert_covered(&memtally__v1__group_usage__descriptor, true, group_own);

	pid_t a = fx_spawn();
	register_ok(a, "g", 1);
	mts_core_tick(&srv.reg);
	struct mts_group *grp = mts_find_group(&srv.reg, "g");
	cr_assert_not_null(grp);
	for (size_t k = 0; k < mts_figure_count; k++) {
		const struct mts_figure *f = &mts_figure_table[k];
		set_row(&srv.reg.totals.fig, f, row_value(f, k, false));
		set_row(&grp->fig, f, row_value(f, k, true));
	}
	Memtally__V1__Response *r =
	    get_usage(MEMTALLY__V1__GET_USAGE__SCOPE__NOT_SET, NULL, 0);
	cr_assert_eq(r->usage->n_groups, 1);
	for (size_t k = 0; k < mts_figure_count; k++) {
		const struct mts_figure *f = &mts_figure_table[k];
		if (!(f->out & MTS_FIG_PROTO))
			continue;
		double fleet = field_of(&r->usage->base, f->usage_field);
		double group =
		    field_of(&r->usage->groups[0]->base, f->group_field);
		cr_expect_eq(fleet, row_value(f, k, false), "fleet %s: %g",
		             f->name, fleet);
		cr_expect_eq(group, row_value(f, k, true), "group %s: %g",
		             f->name, group);
	}
	memtally__v1__response__free_unpacked(r, NULL);
}

/* What the glibc front end does: a sample of its free bytes in lane 0. */
static void write_free(uint32_t slot, int64_t free_bytes, int64_t heap_at)
{
	mtshm_free_store(mts_slot(&srv.reg, slot), free_bytes, heap_at);
}

/* The allocator's free bytes: part of a process's bytes, its group's and
 * the fleet's, shown on their own, what the allocator held at the sample
 * less the heap since (what the program frees counts as free until the
 * next sample), kept while a sample is being written, gone with the
 * process. */
Test(dispatch, allocator_free_is_part_of_the_figures)
{
	pid_t a = fx_spawn(), b = fx_spawn();
	uint32_t sa = worker(a, "py", 10000);
	worker(b, "py", 3000);
	write_free(sa, 6000, 10000); /* glibc held 16000 at heap 10000 */
	mts_core_tick(&srv.reg);
	Memtally__V1__Response *r =
	    get_usage(MEMTALLY__V1__GET_USAGE__SCOPE__NOT_SET, NULL, 0);
	cr_assert_eq(r->usage->fleet_bytes, 19000);
	cr_assert_eq(r->usage->allocator_free_bytes, 6000);
	cr_assert_eq(r->usage->n_groups, 1);
	cr_assert_eq(r->usage->groups[0]->bytes, 19000);
	cr_assert_eq(r->usage->groups[0]->allocator_free_bytes, 6000);
	memtally__v1__response__free_unpacked(r, NULL);
	r = get_usage(MEMTALLY__V1__GET_USAGE__SCOPE_PID, NULL, (uint32_t)a);
	cr_assert_eq(r->usage->process->bytes, 16000);
	cr_assert_eq(r->usage->process->allocator_free_bytes, 6000);
	memtally__v1__response__free_unpacked(r, NULL);
	struct mtshm_fleet f;
	cr_assert_eq(mtshm_fleet_read(srv.map.hdr, &f), 0);
	cr_assert_eq(f.allocator_free, 6000);
	cr_assert_eq(f.bytes, 19000);

	/* The heap grew by 4000 out of the free memory: 2000 left. */
	write_lane(sa, 14000, 1);
	mts_core_tick(&srv.reg);
	cr_assert_eq(srv.reg.totals.allocator_free, 2000);
	cr_assert_eq(srv.reg.totals.bytes, 14000 + 2000 + 3000);
	/* It shrank to 5000: what it freed counts as free until the next
	 * sample (glibc still held 16000 when last asked). */
	write_lane(sa, 5000, 1);
	mts_core_tick(&srv.reg);
	cr_assert_eq(srv.reg.totals.allocator_free, 11000);
	cr_assert_eq(srv.reg.totals.bytes, 16000 + 3000);
	/* A new sample says what glibc gave back. */
	write_free(sa, 1000, 5000);
	mts_core_tick(&srv.reg);
	cr_assert_eq(srv.reg.totals.allocator_free, 1000);
	/* The heap goes past what was held, then back: the peak is held. */
	write_lane(sa, 8000, 1);
	mts_core_tick(&srv.reg);
	cr_assert_eq(srv.reg.totals.allocator_free, 0);
	write_lane(sa, 5000, 1);
	mts_core_tick(&srv.reg);
	cr_assert_eq(srv.reg.totals.allocator_free, 3000);
	/* A sample being written is not read: the last value stands. */
	struct mtshm_lane *l = mtshm_lane(mts_slot(&srv.reg, sa), 0);
	mtshm_store_relaxed64(&l->free_seq,
	                      mtshm_load_relaxed64(&l->free_seq) + 1);
	mtshm_store_relaxeds64(&l->free_bytes, 999999);
	mts_core_tick(&srv.reg);
	cr_assert_eq(srv.reg.totals.allocator_free, 3000);
	/* A negative sample is a lie: the slot is quarantined. (The
	 * writer makes an odd sequence even again first.) */
	write_free(sa, -1, 5000);
	mts_core_tick(&srv.reg);
	cr_assert(mts_slot(&srv.reg, sa)->flags & MTSHM_SLOT_CORRUPT);
	cr_assert_eq(srv.reg.totals.allocator_free, 0);
	cr_assert_eq(srv.reg.totals.bytes, 3000);
}

/* Exit takes a process's free bytes out with the rest of its figure. */
Test(dispatch, allocator_free_leaves_with_its_process)
{
	pid_t a = fx_spawn(), b = fx_spawn();
	uint32_t sa = worker(a, "py", 1000);
	uint32_t sb = worker(b, "py", 2000);
	write_free(sa, 500, 1000);
	write_free(sb, 700, 2000);
	mts_core_tick(&srv.reg);
	cr_assert_eq(srv.reg.totals.allocator_free, 1200);
	cr_assert_eq(srv.reg.groups[0].allocator_free, 1200);
	kill(a, SIGKILL);
	waitpid(a, NULL, 0);
	FX_RUN_UNTIL(srv.reg.totals.processes == 1);
	cr_assert_eq(srv.reg.totals.allocator_free, 700);
	cr_assert_eq(srv.reg.totals.bytes, 2700);
	cr_assert_eq(srv.reg.groups[0].allocator_free, 700);
}

Test(dispatch, corrupt_slot_quarantined)
{
	pid_t a = fx_spawn(), b = fx_spawn();
	worker(a, "g", 1000);
	uint32_t sb = worker(b, "g", MTSHM_ABSURD_BYTES + 1);
	mts_core_tick(&srv.reg);
	cr_assert_eq(srv.reg.totals.bytes, 1000);
	cr_assert(mts_slot(&srv.reg, sb)->flags & MTSHM_SLOT_CORRUPT);
	Memtally__V1__Response *r =
	    get_usage(MEMTALLY__V1__GET_USAGE__SCOPE_PID, NULL, (uint32_t)b);
	cr_assert(r->usage->process->corrupt);
	cr_assert_eq(r->usage->process->bytes, 0);
	memtally__v1__response__free_unpacked(r, NULL);
	/* Sticky until the slot is reset: a sane value later does not
	 * bring back a slot that once lied. */
	write_lane(sb, 10, 1);
	mts_core_tick(&srv.reg);
	cr_assert_eq(srv.reg.totals.bytes, 1000);
}

/* A figure below zero is clamped at 0 and logged once when it starts,
 * never published: a mapped figure below 0 (the process would have
 * unmapped more than it mapped since it started) leaves the process's
 * heap counted, not quarantined; a heap sum below 0 past its error bar
 * likewise. A dip within the error bar (a thread freeing what another
 * allocated flushed first) is clamped without a word. */
Test(dispatch, figure_below_zero_clamped_and_logged)
{
	pid_t a = fx_spawn(), b = fx_spawn();
	worker(a, "g", 1000);
	uint32_t sb = worker(b, "g", 5000);
	struct mtshm_slot_id *s = mts_slot(&srv.reg, sb);
	/* 64 MiB unmapped more than mapped: the unsigned total wrapped. */
	mtshm_store_relaxeds64(&mtshm_lane(s, 0)->mapped, -(INT64_C(64) << 20));
	const char *log = fx_tick_logged();
	cr_assert_eq(srv.reg.totals.bytes, 6000, "heap kept, mapped 0: %llu",
	             (unsigned long long)srv.reg.totals.bytes);
	cr_assert_eq(srv.reg.totals.mapped, 0);
	struct mts_proc *pb = mts_find_pid(&srv.reg, (uint32_t)b);
	cr_assert_not(pb->corrupt);
	cr_assert_eq(pb->bytes, 5000);
	cr_assert_eq(s->flags & MTSHM_SLOT_CORRUPT, 0);
	cr_assert_not_null(strstr(log, "figure below zero"), "log: %s", log);
	cr_assert_not_null(strstr(log, "part=mapped"), "log: %s", log);
	/* Logged when it starts, not at every tick. */
	log = fx_tick_logged();
	cr_assert_null(strstr(log, "figure below zero"), "log: %s", log);
	cr_assert_eq(srv.reg.totals.bytes, 6000);

	/* The heap: a dip within threshold x threads is drift, silent. */
	mtshm_store_relaxeds64(&mtshm_lane(s, 0)->mapped, 0);
	write_lane(sb, -(int64_t)srv.reg.threshold / 2, 1);
	log = fx_tick_logged();
	cr_assert_eq(srv.reg.totals.bytes, 1000);
	cr_assert_null(strstr(log, "figure below zero"), "log: %s", log);
	/* Past it: clamped and logged. */
	write_lane(sb, -(INT64_C(100) << 20), 1);
	log = fx_tick_logged();
	cr_assert_eq(srv.reg.totals.bytes, 1000);
	cr_assert_eq(pb->bytes, 0);
	cr_assert_not_null(strstr(log, "part=heap"), "log: %s", log);
	cr_assert_not(pb->corrupt);
}

/* A producer thread's lane climbs for ever, a consumer's falls: each lane
 * alone is far past the absurd mark, but the process holds 4 KiB. It is
 * counted, not quarantined. */
Test(dispatch, lanes_past_the_mark_with_a_sane_total_count)
{
	pid_t a = fx_spawn();
	uint32_t sa = register_ok(a, "g", 1);
	struct mtshm_slot_id *s = mts_slot(&srv.reg, sa);
	mtshm_store_relaxed32(&s->lanes_used, 2);
	mtshm_store_relaxeds64(&mtshm_lane(s, 0)->bytes, INT64_C(3) << 60);
	mtshm_store_relaxeds64(&mtshm_lane(s, 1)->bytes,
	                       -(INT64_C(3) << 60) + 4096);
	mts_core_tick(&srv.reg);
	cr_assert_eq(srv.reg.totals.bytes, 4096);
	cr_assert_eq(s->flags & MTSHM_SLOT_CORRUPT, 0);
	cr_assert_not(mts_find_pid(&srv.reg, (uint32_t)a)->corrupt);
}

Test(dispatch, exit_leaves_totals_in_same_iteration)
{
	pid_t a = fx_spawn(), b = fx_spawn();
	worker(a, "g", 1000);
	uint32_t sb = worker(b, "h", 7000);
	mts_core_tick(&srv.reg);
	struct mtshm_fleet f;
	cr_assert_eq(mtshm_fleet_read(srv.map.hdr, &f), 0);
	cr_assert_eq(f.bytes, 8000);

	struct mtshm_slot_id *sbp = mts_slot(&srv.reg, sb);
	kill(b, SIGKILL);
	waitpid(b, NULL, 0);
	/* No tick runs (it is 60 s away): only the pidfd callback can
	 * change the totals. */
	uint64_t ticks = f.ticks;
	FX_RUN_UNTIL(srv.reg.totals.processes == 1);
	cr_assert_eq(mtshm_fleet_read(srv.map.hdr, &f), 0);
	cr_assert_eq(f.bytes, 1000);
	cr_assert_eq(f.processes, 1);
	cr_assert_eq(f.ticks, ticks);
	/* a, of the same uid, keeps the table mapped. */
	cr_assert_eq(sbp->pid, 0);
	cr_assert_null(mts_slot(&srv.reg, sb));
	cr_assert_null(mts_find_pid(&srv.reg, (uint32_t)b));
	cr_assert_null(mts_find_group(&srv.reg, "h"));
	cr_assert_eq(srv.reg.nfree, 3);
	Memtally__V1__Response *r =
	    get_usage(MEMTALLY__V1__GET_USAGE__SCOPE__NOT_SET, NULL, 0);
	cr_assert_eq(r->usage->fleet_bytes, 1000);
	cr_assert_eq(r->usage->fleet_peak, 8000);
	cr_assert_eq(r->usage->n_groups, 1);
	memtally__v1__response__free_unpacked(r, NULL);

	/* The freed slot is handed out again, with a new generation. */
	uint64_t gen = srv.reg.slot_gens[sb];
	cr_assert_eq(register_ok(fx_spawn(), "h", 1), sb);
	cr_assert_eq(mts_slot(&srv.reg, sb)->generation, gen + 1);
}

/* Each uid gets a table of its own: a worker can write only the slots of
 * its own uid's processes. The table goes with the uid's last process. */
Test(dispatch, each_uid_has_its_own_table)
{
	pid_t a = fx_spawn(), b = fx_spawn();
	uint32_t sa = register_ok(a, "g", 1); /* uid 1000, see peer_of */
	struct mts_peer pb = peer_of(b);
	pb.uid = 2000;
	Memtally__V1__Request req = MEMTALLY__V1__REQUEST__INIT;
	Memtally__V1__Register rg = MEMTALLY__V1__REGISTER__INIT;
	rg.image_id = 1;
	req.body_case = MEMTALLY__V1__REQUEST__BODY_REGISTER;
	req.register_ = &rg;
	Memtally__V1__Response *r = fx_call(&pb, &req);
	cr_assert_null(r->error);
	uint32_t sb = r->registered->slot;
	memtally__v1__response__free_unpacked(r, NULL);
	struct mts_table *ta = mts_table_find(&srv.reg, 1000);
	struct mts_table *tb = mts_table_find(&srv.reg, 2000);
	cr_assert(ta && tb && ta != tb);
	cr_assert_neq(ta->map.ino, tb->map.ino);
	cr_assert_eq(pb.send_fds[1], tb->map.fd);
	cr_assert_eq(srv.reg.ntables, 2);
	/* Slot sb in uid 1000's table is not b's: scribbling it changes
	 * nothing the server counts. */
	struct mtshm_slot_id *fake =
	    mtshm_slot(&srv.reg.layout, ta->map.base, sb);
	fake->overflow = 123456;
	write_lane(sa, 1000, 1);
	write_lane(sb, 2000, 1);
	mts_core_tick(&srv.reg);
	cr_assert_eq(srv.reg.totals.bytes, 3000);
	kill(b, SIGKILL);
	waitpid(b, NULL, 0);
	FX_RUN_UNTIL(tb->procs == 0);
	/* Idle, kept for the uid's next process: the same object again. */
	cr_assert_neq(tb->idle_since_ns, 0);
	uint64_t ino = tb->map.ino;
	pid_t b2 = fx_spawn();
	struct mts_peer pb2 = peer_of(b2);
	pb2.uid = 2000;
	r = fx_call(&pb2, &req);
	cr_assert_null(r->error);
	memtally__v1__response__free_unpacked(r, NULL);
	cr_assert_eq(mts_table_find(&srv.reg, 2000), tb);
	cr_assert_eq(tb->map.ino, ino);
	cr_assert_eq(tb->idle_since_ns, 0);
	kill(b2, SIGKILL);
	waitpid(b2, NULL, 0);
	FX_RUN_UNTIL(tb->procs == 0);
	/* Released once idle long enough; uid 1000's, in use, stays. */
	mts_tables_sweep(&srv.reg, tb->idle_since_ns +
	                               (uint64_t)MTS_TABLE_IDLE_MS * 1000000u);
	cr_assert_null(mts_table_find(&srv.reg, 2000));
	cr_assert_eq(mts_table_find(&srv.reg, 1000), ta);
	cr_assert_eq(srv.reg.ntables, 1);
}

/* At most MTS_TABLES_IDLE_MAX tables are kept idle: the oldest goes. */
Test(dispatch, idle_tables_are_bounded)
{
	Memtally__V1__Request req = MEMTALLY__V1__REQUEST__INIT;
	Memtally__V1__Register rg = MEMTALLY__V1__REGISTER__INIT;
	rg.image_id = 1;
	req.body_case = MEMTALLY__V1__REQUEST__BODY_REGISTER;
	req.register_ = &rg;
	for (uint32_t u = 0; u < MTS_TABLES_IDLE_MAX + 2; u++) {
		pid_t k = fx_spawn();
		struct mts_peer pk = peer_of(k);
		pk.uid = 3000 + u;
		Memtally__V1__Response *r = fx_call(&pk, &req);
		cr_assert_null(r->error);
		memtally__v1__response__free_unpacked(r, NULL);
		kill(k, SIGKILL);
		waitpid(k, NULL, 0);
		FX_RUN_UNTIL(mts_table_find(&srv.reg, 3000 + u)->procs == 0);
		nkids = 0; /* reaped */
	}
	cr_assert_eq(srv.reg.ntables, MTS_TABLES_IDLE_MAX);
	cr_assert_null(mts_table_find(&srv.reg, 3000));
	cr_assert_null(mts_table_find(&srv.reg, 3001));
	cr_assert_not_null(mts_table_find(&srv.reg, 3002));
}

/* Watch as `peer` (own: Watch.own): 0 when subscribed (the first event
 * answers), else the error code. */
static int watch_as(struct mts_peer *peer, bool own, uint64_t id)
{
	Memtally__V1__Request req = MEMTALLY__V1__REQUEST__INIT;
	Memtally__V1__Watch watch = MEMTALLY__V1__WATCH__INIT;
	watch.own = own;
	req.id = id;
	req.body_case = MEMTALLY__V1__REQUEST__BODY_WATCH;
	req.watch = &watch;
	Memtally__V1__Response *r = fx_call(peer, &req);
	cr_assert_eq(r->id, id);
	int code = r->error ? (int)r->error->code : 0;
	if (!code)
		cr_assert_eq(r->body_case, MEMTALLY__V1__RESPONSE__BODY_EVENT);
	memtally__v1__response__free_unpacked(r, NULL);
	return code;
}

/* One uid holds at most max_watch_per_uid subscriptions to everything it
 * may see. Its subscriptions to its own tasks' events (each `memtally
 * run` holds one) are bounded by its connections instead: a job runner's
 * 17th run of one user must still learn of its eviction. */
Test(dispatch, the_watch_cap_leaves_own_subscriptions_out)
{
	const int denied = MEMTALLY__V1__ERROR_CODE__ERROR_PERMISSION_DENIED;
	srv.reg.policy.watch_per_uid = 2;
	struct mts_peer p[6];
	for (int i = 0; i < 6; i++)
		p[i] = peer_of(getpid());
	cr_assert_eq(watch_as(&p[0], false, 1), 0);
	cr_assert_eq(watch_as(&p[1], false, 2), 0);
	cr_assert_eq(watch_as(&p[2], false, 3), denied);
	cr_assert_not(p[2].watching);
	for (int i = 3; i < 6; i++) {
		cr_assert_eq(watch_as(&p[i], true, 10 + (uint64_t)i), 0);
		cr_assert(p[i].watching && p[i].watch_own);
		cr_assert_not(p[i].watch_counted);
	}
	cr_assert_eq(mts_uid_count_get(&srv.reg.watch_uids, FX_UID), 2);
	/* An own subscription asking for everything is capped as a new
	 * one: refused, and it stays its own. */
	cr_assert_eq(watch_as(&p[3], false, 20), denied);
	cr_assert(p[3].watching && p[3].watch_own);
	/* A second broad Watch on a counted connection is the same one. */
	cr_assert_eq(watch_as(&p[0], false, 21), 0);
	cr_assert_eq(mts_uid_count_get(&srv.reg.watch_uids, FX_UID), 2);
	/* Another uid has places of its own. */
	struct mts_peer q = fx_peer(getpid(), FX_UID + 1);
	cr_assert_eq(watch_as(&q, false, 22), 0);
	cr_assert(q.watch_counted);
}

/* ---- adoption at a restart -------------------------------------------- */

/* Adopt `pid` of `uid` into `slot` of `t`, in `group`: what the restart
 * record's entry would give. 0 or -errno. */
static int adopt(struct mts_table *t, uint32_t slot, pid_t pid, uint32_t uid,
                 const char *group)
{
	struct mts_adopted a = {.slot = slot, .pid = (uint32_t)pid, .uid = uid};
	a.pidfd = (int)syscall(SYS_pidfd_open, pid, 0);
	cr_assert_geq(a.pidfd, 0);
	cr_assert_eq(mts_read_starttime(pid, &a.start_time), 0);
	snprintf(a.group, sizeof(a.group), "%s", group);
	int err = mts_registry_adopt_slot(&srv.reg, &a, t);
	if (err < 0 && err != -EAGAIN)
		close(a.pidfd);
	return err;
}

static struct mts_table *adopted_table(uint32_t uid)
{
	char label[96];
	struct mtshm_map m;
	mts_table_label(&srv.reg, uid, label, sizeof(label));
	cr_assert_eq(mtshm_table_create(label, &srv.reg.layout, &m), 0);
	cr_assert_eq(mts_table_adopt(&srv.reg, uid, &m), 0);
	return mts_table_find(&srv.reg, uid);
}

Test(dispatch, an_adopted_table_with_a_worker_is_never_swept)
{
	/* A restart: the record's first entry of a uid cannot be adopted
	 * (its group name is cut), so the table is marked idle; the second
	 * is adopted into it. Swept as idle 10 s later, the table would be
	 * unmapped under its worker: the next tick would read freed memory. */
	fx_start();
	struct mts_table *t = adopted_table(1500);
	pid_t a = fx_spawn(), b = fx_spawn();
	cr_assert_eq(adopt(t, 3, a, 1500, "a\xc3"), -EINVAL);
	mts_table_gc(&srv.reg, t);
	cr_assert_neq(t->idle_since_ns, 0);
	cr_assert_eq(adopt(t, 4, b, 1500, "default"), 0);
	mts_registry_rebuild_free(&srv.reg);
	cr_assert_eq(t->idle_since_ns, 0, "a table with a worker marked idle");
	mts_tables_sweep(&srv.reg, mts_now_monotonic() + UINT64_C(11000000000));
	cr_assert_eq(mts_table_find(&srv.reg, 1500), t, "swept under a worker");
	fx_write(4, 3 * (int64_t)MIB);
	mts_core_tick(&srv.reg);
	cr_assert_eq(mts_find_pid(&srv.reg, (uint32_t)b)->bytes, 3 * MIB);
}

Test(dispatch, a_slot_not_adopted_gets_a_generation_never_given)
{
	/* The last server gave slot 0 of this uid's table generation 41;
	 * its worker was not adopted (its record entry never written) but
	 * the table was, through another worker. Registering again, that
	 * worker must not get slot 0 at generation 41 again: it would take
	 * the answer for an adoption and keep lanes slot_init zeroed. Found
	 * in review: generations started at 1 in every server. */
	fx_start_slots(NULL, 256); /* a table of 32 pages */
	struct mts_table *t = adopted_table(FX_UID);
	mtshm_store_relaxed64(
	    &mtshm_slot(&srv.reg.layout, t->map.base, 0)->generation, 41);
	cr_assert_eq(adopt(t, 4, fx_spawn(), FX_UID, "default"), 0);
	struct stat st0, st;
	cr_assert_eq(fstat(t->map.fd, &st0), 0);
	mts_registry_rebuild_free(&srv.reg);
	/* Read where the table has data only: a read of every slot would
	 * allocate every page of it (4 GiB a uid at the largest layout;
	 * found in review of this fix). */
	cr_assert_eq(fstat(t->map.fd, &st), 0);
	cr_assert_eq(st.st_blocks, st0.st_blocks,
	             "the scan allocated %lld blocks",
	             (long long)(st.st_blocks - st0.st_blocks));
	cr_assert_gt((uint64_t)srv.reg.slot_count * srv.reg.layout.slot_stride,
	             (uint64_t)st.st_blocks * 512 * 2,
	             "a table too small to show it");
	uint32_t slot = fx_register(fx_spawn(), "", "");
	cr_assert_eq(slot, 0, "the lowest free slot is handed out first");
	cr_assert_gt(srv.reg.slot_gens[0], 41, "generation %llu given again",
	             (unsigned long long)srv.reg.slot_gens[0]);
	cr_assert_eq(mtshm_load_relaxed64(&srv.reg.slot_at[0]->generation),
	             srv.reg.slot_gens[0]);
}

Test(dispatch, an_exited_worker_not_yet_reaped_is_not_adopted)
{
	/* Its start time still matches and its pidfd opens; its last
	 * figures would count, and maybe fire a hook, before the poll says
	 * it is gone. */
	fx_start();
	struct mts_table *t = adopted_table(1500);
	pid_t z = fork();
	cr_assert_geq(z, 0);
	if (z == 0)
		_exit(0);
	siginfo_t si = {0};
	cr_assert_eq(waitid(P_PID, (id_t)z, &si, WEXITED | WNOWAIT), 0);
	cr_assert_eq(adopt(t, 3, z, 1500, "default"), -ESRCH);
	cr_assert_null(mts_find_pid(&srv.reg, (uint32_t)z));
	waitpid(z, NULL, 0);
}

Test(dispatch, the_restart_record_keeps_whole_names)
{
	/* Register takes names of up to 255 bytes: the record must keep
	 * them whole, or a restart adopts the worker into another group or
	 * task (cut at 63 bytes), or drops it (cut inside a character). */
	fx_start_with_record("names");
	char group[256], task[256];
	memset(group, 'g', 255);
	group[255] = '\0';
	task[0] = '\0';
	for (int i = 0; i < 40; i++) /* 80 bytes of Cyrillic */
		strcat(task, "\xd0\xb6");
	uint32_t slot = fx_register(fx_spawn(), group, task);
	struct mts_state_rec r;
	cr_assert_eq(mts_state_get(srv.reg.state, slot, &r), 0);
	cr_assert_str_eq(r.group, group);
	cr_assert_str_eq(r.task, task);
	cr_assert(mt_name_ok(r.task));
}

Test(dispatch, a_processs_own_limit_outlives_a_restart)
{
	/* SetLimit on a pid survives a reload; memtallyd killed and
	 * restarted, it must too: in the record, and back at adoption. */
	fx_start_with_record("limit");
	pid_t w = fx_spawn();
	uint32_t slot = fx_register(w, "", "");
	uint64_t prev, now;
	cr_assert_eq(
	    mts_limit_set_pid(&srv.reg, (uint32_t)w, 7 * MIB, &prev, &now), 0);
	struct mts_state_rec r;
	cr_assert_eq(mts_state_get(srv.reg.state, slot, &r), 0);
	cr_assert_eq(r.limit_set, 7 * MIB);
	/* What the next server adopts from that entry. */
	struct mts_table *t = adopted_table(1500);
	pid_t b = fx_spawn();
	struct mts_adopted a = {.slot = 5, .pid = (uint32_t)b, .uid = 1500};
	a.pidfd = (int)syscall(SYS_pidfd_open, b, 0);
	cr_assert_eq(mts_read_starttime(b, &a.start_time), 0);
	a.limit_set = r.limit_set;
	cr_assert_eq(mts_registry_adopt_slot(&srv.reg, &a, t), 0);
	mts_registry_rebuild_free(&srv.reg);
	const struct mts_proc *p = mts_find_pid(&srv.reg, (uint32_t)b);
	cr_assert_eq(p->limit, 7 * MIB);
	cr_assert_eq(p->limit_set, 7 * MIB);
	cr_assert_eq(mtshm_load_relaxed64(&srv.reg.slot_at[5]->limit), 7 * MIB);
}
