/*
 * fuzz_frame.c - libFuzzer target: a byte stream read the way memtallyd
 * reads a connection.
 *
 * The input is what a peer sent. Frames are taken from it one after
 * another: the varint prefix (limit MTFRAME_DEFAULT_MAX), then the body
 * unpacked as a memtally.v1.Request. A refused prefix or an undecodable
 * body ends the stream, as it ends a connection; a frame cut short ends it
 * as "need more". Beyond "no crash, no leak, no read past the input", each
 * decoded Request must survive a round trip through mtframe_pack().
 */
#include "mtframe.h"
#include "memtally.pb-c.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* Whether the Request or its body kept fields this build does not know. */
static int has_unknown_fields(const Memtally__V1__Request *req)
{
	if (req->base.n_unknown_fields)
		return 1;
	/* Every body member is a message; the union's first member stands
	 * for all of them. */
	return req->body_case != MEMTALLY__V1__REQUEST__BODY__NOT_SET &&
	       ((const ProtobufCMessage *)req->register_)->n_unknown_fields;
}

/*
 * Check an unpacked Request survives mtframe_pack and a second decode.
 *
 * Unknown fields are repacked by protobuf-c as it kept them, and it keeps
 * some it would then refuse: 1.4.1 takes an overlong tag of field number 0
 * (body 80 00 00) as an unknown field, re-encodes its tag canonically as
 * 00, and rejects that. Such a Request need not survive re-decoding; the
 * server never repacks what it received.
 */
static void round_trip(const Memtally__V1__Request *req)
{
	size_t need = mtframe_packed_size(&req->base);
	uint8_t *buf = malloc(need);
	if (!buf)
		abort();
	if (mtframe_pack(&req->base, buf, need) != need)
		abort();
	if (need > 0 && mtframe_pack(&req->base, buf, need - 1) != 0)
		abort();
	uint64_t len;
	int r = mtframe_decode_len(buf, need, UINT64_MAX, &len);
	if (r <= 0 || (size_t)r + len != need)
		abort();
	Memtally__V1__Request *again =
	    memtally__v1__request__unpack(NULL, len, buf + r);
	if (!again && !has_unknown_fields(req))
		abort();
	if (again &&
	    (again->id != req->id || again->body_case != req->body_case))
		abort();
	if (again)
		memtally__v1__request__free_unpacked(again, NULL);
	free(buf);
}

/* Touch what a server would read, so the fuzzer sees every branch. */
static size_t inspect(const Memtally__V1__Request *req)
{
	size_t n = 0;
	switch (req->body_case) {
	case MEMTALLY__V1__REQUEST__BODY_REGISTER:
		n += strlen(req->register_->group);
		n += strlen(req->register_->task);
		n += strlen(req->register_->client_version);
		break;
	case MEMTALLY__V1__REQUEST__BODY_GET_USAGE:
		if (req->get_usage->scope_case ==
		    MEMTALLY__V1__GET_USAGE__SCOPE_GROUP)
			n += strlen(req->get_usage->group);
		break;
	case MEMTALLY__V1__REQUEST__BODY_LIST_PROCESSES:
		n += strlen(req->list_processes->group);
		break;
	case MEMTALLY__V1__REQUEST__BODY_ADMIT:
		n += strlen(req->admit->group) + strlen(req->admit->task);
		break;
	case MEMTALLY__V1__REQUEST__BODY_RELEASE:
		n += strlen(req->release->reservation);
		break;
	case MEMTALLY__V1__REQUEST__BODY_SET_LIMIT:
		if (req->set_limit->scope_case ==
		    MEMTALLY__V1__SET_LIMIT__SCOPE_GROUP)
			n += strlen(req->set_limit->group);
		break;
	default:
		break;
	}
	return n;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	size_t off = 0;
	while (off < size) {
		uint64_t len = 0;
		int r = mtframe_decode_len(data + off, size - off,
		                           MTFRAME_DEFAULT_MAX, &len);
		if (r == 0)
			break; /* prefix incomplete: wait for more */
		if (r < 0) {
			if (r != MTFRAME_EVARINT && r != MTFRAME_ETOOBIG)
				abort();
			break; /* error Response, close */
		}
		if (r > MTFRAME_MAX_VARINT || len > MTFRAME_DEFAULT_MAX)
			abort();
		off += (size_t)r;
		if (len > size - off)
			break; /* body incomplete: wait for more */
		Memtally__V1__Request *req =
		    memtally__v1__request__unpack(NULL, len, data + off);
		if (!req)
			break; /* undecodable: error Response, close */
		volatile size_t sink = inspect(req);
		(void)sink;
		round_trip(req);
		memtally__v1__request__free_unpacked(req, NULL);
		off += len;
	}
	return 0;
}
