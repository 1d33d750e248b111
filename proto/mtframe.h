/*
 * mtframe.h - varint length-delimited framing (protobuf's delimited format).
 *
 * Shared by the server, the worker client's registration and the query
 * library. Knows nothing of sockets.
 */
#ifndef MEMTALLY_FRAME_H
#define MEMTALLY_FRAME_H

#include <stddef.h>
#include <stdint.h>

#include <protobuf-c/protobuf-c.h>

#define MTFRAME_MAX_VARINT 10
/* Default largest frame body a peer may send. */
#define MTFRAME_DEFAULT_MAX (1u << 20)

/* Errors of this component (reserved negative range). */
#define MTFRAME_EVARINT  (-3101) /* a varint longer than 10 bytes */
#define MTFRAME_ETOOBIG  (-3102) /* length over the caller's limit */

/*
 * Decode the length prefix at buf[0..len). Returns the number of prefix
 * bytes (> 0) and stores the body length in *body_len; 0 when more bytes
 * are needed; MTFRAME_EVARINT for a varint that never ends within 10
 * bytes; MTFRAME_ETOOBIG when the length exceeds max_body.
 */
int mtframe_decode_len(const uint8_t *buf, size_t len, uint64_t max_body,
		       uint64_t *body_len);

/* Encode v as a varint into out (at least MTFRAME_MAX_VARINT bytes);
 * returns the number of bytes written. */
size_t mtframe_encode_len(uint64_t v, uint8_t *out);

/*
 * Pack `msg` with its length prefix into buf[0..cap). Returns the total
 * bytes written, or 0 when cap is too small. Never allocates.
 */
size_t mtframe_pack(const ProtobufCMessage *msg, uint8_t *buf, size_t cap);

/* Bytes mtframe_pack() needs for `msg`. */
size_t mtframe_packed_size(const ProtobufCMessage *msg);

#endif /* MEMTALLY_FRAME_H */
