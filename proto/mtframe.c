/*
 * mtframe.c - varint length prefixes. The decoder is written for hostile
 * input: it never reads past `len`, rejects a varint that runs past 10
 * bytes, and rejects a length over the caller's limit before anyone
 * allocates for it.
 */
#include "mtframe.h"

int mtframe_decode_len(const uint8_t *buf, size_t len, uint64_t max_body,
		       uint64_t *body_len)
{
	uint64_t v = 0;
	for (size_t i = 0; i < MTFRAME_MAX_VARINT; i++) {
		if (i == len)
			return 0;
		uint8_t b = buf[i];
		/* The 10th byte may only carry the top bit of a u64. */
		if (i == MTFRAME_MAX_VARINT - 1 && b > 1)
			return MTFRAME_EVARINT;
		v |= (uint64_t)(b & 0x7f) << (7 * i);
		if (!(b & 0x80)) {
			if (v > max_body)
				return MTFRAME_ETOOBIG;
			*body_len = v;
			return (int)i + 1;
		}
	}
	return MTFRAME_EVARINT;
}

size_t mtframe_encode_len(uint64_t v, uint8_t *out)
{
	size_t n = 0;
	while (v >= 0x80) {
		out[n++] = (uint8_t)(v | 0x80);
		v >>= 7;
	}
	out[n++] = (uint8_t)v;
	return n;
}

size_t mtframe_packed_size(const ProtobufCMessage *msg)
{
	uint8_t tmp[MTFRAME_MAX_VARINT];
	size_t body = protobuf_c_message_get_packed_size(msg);
	return mtframe_encode_len(body, tmp) + body;
}

size_t mtframe_pack(const ProtobufCMessage *msg, uint8_t *buf, size_t cap)
{
	uint8_t pre[MTFRAME_MAX_VARINT];
	size_t body = protobuf_c_message_get_packed_size(msg);
	size_t n = mtframe_encode_len(body, pre);
	if (cap < n + body)
		return 0;
	for (size_t i = 0; i < n; i++)
		buf[i] = pre[i];
	protobuf_c_message_pack(msg, buf + n);
	return n + body;
}
