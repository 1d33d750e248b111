/*
 * fuzz_segment.c - libFuzzer target: arbitrary bytes as a mapped segment.
 *
 * What a client maps from /dev/shm may be anything a local user with
 * access wrote there. The input is copied into a buffer of exactly its
 * size (malloc's alignment satisfies the header's), so ASan catches any
 * read past it; mtshm_validate() must judge it without reading beyond
 * `size`, and when it accepts, every declared slot must lie inside the
 * buffer and sum without overflow.
 */
#include "mtshm.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	/* malloc(0) may return NULL; keep one byte so the pointer is real. */
	unsigned char *buf = malloc(size ? size : 1);
	if (!buf)
		abort();
	if (size)
		memcpy(buf, data, size);

	int err = mtshm_validate(buf, size);
	switch (err) {
	case 0:
	case MTSHM_EBADMAGIC:
	case MTSHM_EVERSION:
	case MTSHM_ETRUNCATED:
	case MTSHM_ELAYOUT:
	case MTSHM_EBYTEORDER:
		break;
	default:
		abort(); /* a code the header does not list */
	}
	if (err == 0) {
		struct mtshm_map m = {
		    .base = buf, .size = size, .hdr = (void *)buf};
		const struct mtshm_header *h = m.hdr;
		for (uint32_t i = 0; i < h->slot_count; i++) {
			struct mtshm_slot_id *s = mtshm_slot(&m, i);
			uint64_t flushes;
			int absurd;
			int64_t sum = mtshm_slot_sum(&m, s, &flushes, &absurd);
			if (!absurd && (sum > MTSHM_ABSURD_BYTES ||
			                sum < -MTSHM_ABSURD_BYTES))
				abort(); /* an unflagged absurd total */
		}
		/* An odd seq is a writer inside (or one that died there):
		 * mtshm_fleet_read() waits for it by design, so only a settled
		 * snapshot is read here. */
		if (h->fleet.seq % 2 == 0) {
			struct mtshm_fleet f;
			mtshm_fleet_read(h, &f);
		}
	}
	free(buf);
	return 0;
}
