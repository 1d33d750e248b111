/*
 * test_frame_varint.c - the varint length prefix and mtframe_pack().
 *
 * The decoder faces hostile bytes, so besides round trips these tests pin
 * its three refusals (need more, EVARINT, ETOOBIG) at their exact
 * boundaries, and run every decode over a buffer that ends where an
 * inaccessible page begins: a read past `len` is a SIGSEGV in any build.
 */
#define _GNU_SOURCE
#include "mtframe.h"
#include "memtally.pb-c.h"

#include <criterion/criterion.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

/* A copy of src[0..n) placed so that byte n is on a PROT_NONE page. The
 * mapping is left to process exit: each test is its own process. */
static uint8_t *guarded_copy(const void *src, size_t n)
{
	size_t pg = (size_t)sysconf(_SC_PAGESIZE);
	size_t body = (n + pg - 1) / pg * pg;
	uint8_t *map = mmap(NULL, body + pg, PROT_READ | PROT_WRITE,
	                    MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	cr_assert_neq(map, MAP_FAILED);
	cr_assert_eq(mprotect(map + body, pg, PROT_NONE), 0);
	uint8_t *p = map + body - n;
	if (n)
		memcpy(p, src, n);
	return p;
}

/* mtframe_decode_len over exactly buf[0..len), nothing readable after. */
static int decode(const uint8_t *buf, size_t len, uint64_t max_body,
                  uint64_t *body_len)
{
	return mtframe_decode_len(guarded_copy(buf, len), len, max_body,
	                          body_len);
}

static const struct {
	uint64_t v;
	size_t n; /* encoded length */
} lengths[] = {
    {0, 1},
    {1, 1},
    {127, 1},
    {128, 2},
    {300, 2},
    {16383, 2},
    {16384, 3},
    {MTFRAME_DEFAULT_MAX, 3},
    {UINT64_C(1) << 32, 5},
    {UINT64_C(1) << 63, 10},
    {UINT64_MAX, 10},
};
#define NLENGTHS (sizeof(lengths) / sizeof(lengths[0]))

Test(varint, round_trip)
{
	for (size_t i = 0; i < NLENGTHS; i++) {
		uint64_t v = lengths[i].v;
		uint8_t buf[MTFRAME_MAX_VARINT + 4];
		memset(buf, 0xee, sizeof(buf));
		size_t n = mtframe_encode_len(v, buf);
		cr_expect_eq(n, lengths[i].n, "%llu: %zu bytes, want %zu",
		             (unsigned long long)v, n, lengths[i].n);
		cr_expect_eq(buf[n], 0xee, "%llu: wrote past its length",
		             (unsigned long long)v);

		uint64_t got = 12345;
		int r = decode(buf, n, UINT64_MAX, &got);
		cr_expect_eq(r, (int)n, "%llu: decode returned %d",
		             (unsigned long long)v, r);
		cr_expect_eq(got, v, "%llu: decoded %llu",
		             (unsigned long long)v, (unsigned long long)got);

		/* The body that follows is not part of the prefix. */
		got = 12345;
		r = decode(buf, n + 4, UINT64_MAX, &got);
		cr_expect_eq(r, (int)n);
		cr_expect_eq(got, v);
	}
}

Test(varint, known_encodings)
{
	static const struct {
		uint64_t v;
		uint8_t bytes[MTFRAME_MAX_VARINT];
		size_t n;
	} known[] = {
	    {0, {0x00}, 1},
	    {1, {0x01}, 1},
	    {127, {0x7f}, 1},
	    {128, {0x80, 0x01}, 2},
	    {300, {0xac, 0x02}, 2}, /* the protobuf documentation's */
	    {16384, {0x80, 0x80, 0x01}, 3},
	    {UINT64_C(1) << 63,
	     {0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x01},
	     10},
	    {UINT64_MAX,
	     {0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01},
	     10},
	};
	for (size_t i = 0; i < sizeof(known) / sizeof(known[0]); i++) {
		uint8_t buf[MTFRAME_MAX_VARINT];
		size_t n = mtframe_encode_len(known[i].v, buf);
		cr_expect_eq(n, known[i].n);
		cr_expect_arr_eq(buf, known[i].bytes, known[i].n,
		                 "encoding of %llu",
		                 (unsigned long long)known[i].v);
	}
}

Test(varint, same_bytes_as_protobuf_c)
{
	/* A Request with only `id` packs as tag 0x08 then id as a varint:
	 * protobuf-c's own encoder, to compare ours with. */
	for (size_t i = 0; i < NLENGTHS; i++) {
		uint64_t v = lengths[i].v;
		if (v == 0)
			continue; /* proto3 omits a zero field */
		Memtally__V1__Request req = MEMTALLY__V1__REQUEST__INIT;
		req.id = v;
		uint8_t pb[16], ours[MTFRAME_MAX_VARINT];
		size_t pn = memtally__v1__request__pack(&req, pb);
		size_t n = mtframe_encode_len(v, ours);
		cr_assert_eq(pb[0], 0x08);
		cr_expect_eq(pn, n + 1, "%llu", (unsigned long long)v);
		cr_expect_arr_eq(pb + 1, ours, n, "%llu",
		                 (unsigned long long)v);
	}
}

Test(varint, every_strict_prefix_needs_more)
{
	for (size_t i = 0; i < NLENGTHS; i++) {
		uint8_t buf[MTFRAME_MAX_VARINT];
		size_t n = mtframe_encode_len(lengths[i].v, buf);
		for (size_t len = 0; len < n; len++) {
			uint64_t got = 12345;
			int r = decode(buf, len, UINT64_MAX, &got);
			cr_expect_eq(r, 0, "%llu, first %zu of %zu bytes: %d",
			             (unsigned long long)lengths[i].v, len, n,
			             r);
			cr_expect_eq(got, 12345, "body_len set on need-more");
		}
	}
}

Test(varint, ten_continuation_bytes)
{
	uint8_t buf[16];
	uint64_t got = 12345;
	memset(buf, 0x80, sizeof(buf));
	cr_expect_eq(decode(buf, 10, UINT64_MAX, &got), MTFRAME_EVARINT);
	cr_expect_eq(decode(buf, 16, UINT64_MAX, &got), MTFRAME_EVARINT);
	memset(buf, 0xff, sizeof(buf));
	cr_expect_eq(decode(buf, 10, UINT64_MAX, &got), MTFRAME_EVARINT);
	cr_expect_eq(decode(buf, 16, UINT64_MAX, &got), MTFRAME_EVARINT);
	/* Nine are still a prefix. */
	cr_expect_eq(decode(buf, 9, UINT64_MAX, &got), 0);
	cr_expect_eq(got, 12345);
}

Test(varint, tenth_byte_over_one)
{
	/* The 10th byte holds bit 63 only: 0 or 1, without continuation. */
	uint8_t buf[MTFRAME_MAX_VARINT];
	uint64_t got;
	static const uint8_t bad_last[] = {0x02, 0x03, 0x7f, 0x81};
	for (size_t i = 0; i < sizeof(bad_last); i++) {
		memset(buf, 0xff, 9);
		buf[9] = bad_last[i];
		got = 12345;
		cr_expect_eq(decode(buf, 10, UINT64_MAX, &got), MTFRAME_EVARINT,
		             "10th byte 0x%02x", bad_last[i]);
		cr_expect_eq(got, 12345);
		memset(buf, 0x80, 9);
		cr_expect_eq(decode(buf, 10, UINT64_MAX, &got), MTFRAME_EVARINT,
		             "0x80 x 9 + 0x%02x", bad_last[i]);
	}
	memset(buf, 0xff, 9);
	buf[9] = 0x01;
	cr_expect_eq(decode(buf, 10, UINT64_MAX, &got), 10);
	cr_expect_eq(got, UINT64_MAX);
	buf[9] = 0x00;
	cr_expect_eq(decode(buf, 10, UINT64_MAX, &got), 10);
	cr_expect_eq(got, INT64_MAX);
}

Test(varint, length_over_max_body)
{
	static const uint64_t maxes[] = {
	    0, 1, 127, 128, 16383, MTFRAME_DEFAULT_MAX, UINT64_MAX - 1};
	for (size_t i = 0; i < sizeof(maxes) / sizeof(maxes[0]); i++) {
		uint64_t max = maxes[i];
		uint8_t buf[MTFRAME_MAX_VARINT];
		uint64_t got = 12345;
		size_t n = mtframe_encode_len(max, buf);
		cr_expect_eq(decode(buf, n, max, &got), (int)n,
		             "length %llu at its limit",
		             (unsigned long long)max);
		cr_expect_eq(got, max);

		got = 12345;
		n = mtframe_encode_len(max + 1, buf);
		cr_expect_eq(decode(buf, n, max, &got), MTFRAME_ETOOBIG,
		             "length %llu over a limit of %llu",
		             (unsigned long long)(max + 1),
		             (unsigned long long)max);
		cr_expect_eq(got, 12345, "body_len set on ETOOBIG");
	}
	uint8_t huge[MTFRAME_MAX_VARINT];
	uint64_t got;
	size_t n = mtframe_encode_len(UINT64_MAX, huge);
	cr_expect_eq(decode(huge, n, MTFRAME_DEFAULT_MAX, &got),
	             MTFRAME_ETOOBIG);
}

/* --- mtframe_pack ----------------------------------------------------- */

/* A Register request; `group` may be long, to need a 2-byte prefix. */
static Memtally__V1__Request *make_register(const char *group)
{
	static Memtally__V1__Register reg = MEMTALLY__V1__REGISTER__INIT;
	static Memtally__V1__Request req = MEMTALLY__V1__REQUEST__INIT;
	reg.group = (char *)group;
	reg.task = "nightly-etl";
	reg.image_id = UINT64_C(0xdeadbeefcafe);
	reg.layout_major = 1;
	reg.layout_minor = 0;
	reg.client_version = "0.1.0";
	req.id = 42;
	req.body_case = MEMTALLY__V1__REQUEST__BODY_REGISTER;
	req.register_ = &reg;
	return &req;
}

/* Pack with every too-small cap, then with the exact cap, and decode the
 * frame back. */
static void pack_and_decode(const Memtally__V1__Request *req,
                            size_t want_prefix)
{
	const ProtobufCMessage *msg = &req->base;
	size_t body = protobuf_c_message_get_packed_size(msg);
	size_t need = mtframe_packed_size(msg);
	cr_assert_eq(need, want_prefix + body);

	enum { GUARD = 16 };
	uint8_t *buf = malloc(need + GUARD);
	cr_assert_not_null(buf);
	for (size_t cap = 0; cap < need; cap++) {
		memset(buf, 0xa5, need + GUARD);
		cr_expect_eq(mtframe_pack(msg, buf, cap), 0, "cap %zu of %zu",
		             cap, need);
		for (size_t i = cap; i < need + GUARD; i++)
			cr_assert_eq(buf[i], 0xa5,
			             "cap %zu: byte %zu written past it", cap,
			             i);
	}

	memset(buf, 0xa5, need + GUARD);
	cr_assert_eq(mtframe_pack(msg, buf, need), need);
	for (size_t i = need; i < need + GUARD; i++)
		cr_assert_eq(buf[i], 0xa5, "exact cap: byte %zu written", i);
	/* More room changes nothing. */
	uint8_t *roomy = calloc(1, need + 100);
	cr_assert_eq(mtframe_pack(msg, roomy, need + 100), need);
	cr_expect_arr_eq(roomy, buf, need);
	free(roomy);

	uint64_t body_len = 0;
	int r = mtframe_decode_len(guarded_copy(buf, need), need,
	                           MTFRAME_DEFAULT_MAX, &body_len);
	cr_assert_eq(r, (int)want_prefix);
	cr_assert_eq(body_len, body);
	Memtally__V1__Request *back =
	    memtally__v1__request__unpack(NULL, body_len, buf + r);
	cr_assert_not_null(back, "the body does not unpack");
	cr_expect_eq(back->id, req->id);
	cr_assert_eq(back->body_case, MEMTALLY__V1__REQUEST__BODY_REGISTER);
	cr_expect_str_eq(back->register_->group, req->register_->group);
	cr_expect_str_eq(back->register_->task, req->register_->task);
	cr_expect_eq(back->register_->image_id, req->register_->image_id);
	cr_expect_eq(back->register_->layout_major, 1);
	cr_expect_eq(back->register_->layout_minor, 0);
	cr_expect_str_eq(back->register_->client_version, "0.1.0");
	memtally__v1__request__free_unpacked(back, NULL);
	free(buf);
}

Test(pack, small_request)
{
	pack_and_decode(make_register("batch"), 1);
}

Test(pack, request_with_a_two_byte_prefix)
{
	static char group[300];
	memset(group, 'g', sizeof(group) - 1);
	pack_and_decode(make_register(group), 2);
}

Test(pack, empty_request_is_a_zero_length_frame)
{
	Memtally__V1__Request req = MEMTALLY__V1__REQUEST__INIT;
	uint8_t buf[4] = {0xa5, 0xa5, 0xa5, 0xa5};
	cr_expect_eq(mtframe_pack(&req.base, buf, 0), 0);
	cr_expect_eq(buf[0], 0xa5);
	cr_assert_eq(mtframe_pack(&req.base, buf, sizeof(buf)), 1);
	cr_expect_eq(buf[0], 0x00);
	cr_expect_eq(buf[1], 0xa5);
	uint64_t body_len = 99;
	cr_assert_eq(mtframe_decode_len(buf, 1, MTFRAME_DEFAULT_MAX, &body_len),
	             1);
	cr_expect_eq(body_len, 0);
	Memtally__V1__Request *back =
	    memtally__v1__request__unpack(NULL, 0, buf + 1);
	cr_assert_not_null(back);
	cr_expect_eq(back->id, 0);
	cr_expect_eq(back->body_case, MEMTALLY__V1__REQUEST__BODY__NOT_SET);
	memtally__v1__request__free_unpacked(back, NULL);
}

Test(pack, pipelined_frames_decode_in_order)
{
	/* Two frames back to back, read the way a server reads a stream. */
	Memtally__V1__Request a = MEMTALLY__V1__REQUEST__INIT;
	Memtally__V1__Request b = MEMTALLY__V1__REQUEST__INIT;
	Memtally__V1__GetUsage usage = MEMTALLY__V1__GET_USAGE__INIT;
	usage.scope_case = MEMTALLY__V1__GET_USAGE__SCOPE_FLEET;
	usage.fleet = 1;
	a.id = 1;
	a.body_case = MEMTALLY__V1__REQUEST__BODY_GET_USAGE;
	a.get_usage = &usage;
	b = *make_register("batch");
	b.id = 2;

	uint8_t buf[256];
	size_t na = mtframe_pack(&a.base, buf, sizeof(buf));
	cr_assert_gt(na, 0);
	size_t nb = mtframe_pack(&b.base, buf + na, sizeof(buf) - na);
	cr_assert_gt(nb, 0);

	const uint8_t *p = guarded_copy(buf, na + nb);
	size_t off = 0;
	uint64_t ids[2];
	for (int i = 0; i < 2; i++) {
		uint64_t len;
		int r = mtframe_decode_len(p + off, na + nb - off,
		                           MTFRAME_DEFAULT_MAX, &len);
		cr_assert_gt(r, 0);
		off += (size_t)r;
		cr_assert_leq(len, na + nb - off);
		Memtally__V1__Request *m =
		    memtally__v1__request__unpack(NULL, len, p + off);
		cr_assert_not_null(m);
		ids[i] = m->id;
		memtally__v1__request__free_unpacked(m, NULL);
		off += len;
	}
	cr_expect_eq(off, na + nb);
	cr_expect_eq(ids[0], 1);
	cr_expect_eq(ids[1], 2);
}
