/*
 * fuzz_segment.c - libFuzzer target: arbitrary bytes as a shared header
 * (and, after it, a slot table).
 *
 * A worker maps the header it is handed read-only, after checking its
 * seals; what is in it was written by whoever created the object, which a
 * worker cannot know to be memtallyd. The input is copied into a buffer of
 * exactly its size (malloc's alignment satisfies the header's), so ASan
 * catches any read past it. Checked:
 *
 *  - mtshm_validate() and mtshm_layout_read() judge it without reading
 *    beyond `size`, return only the codes mtshm.h lists, and agree;
 *    a refused header leaves the layout zeroed.
 *  - an accepted header gives a possible layout (lanes in 1..64, slots in
 *    1..2^20, a stride of whole lines holding every lane, table_size equal
 *    to slot_count x slot_stride), copied exactly from the header.
 *  - when the input carries at least a whole table after the header page,
 *    that table is summed as the server sums it: every slot, addressed
 *    through the private layout, lies inside the table, and
 *    mtshm_slot_sum() never returns an unflagged absurd total.
 *  - mtshm_fleet_read() on a settled snapshot.
 */
#include "mtshm.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static int listed(int err)
{
	switch (err) {
	case 0:
	case MTSHM_EBADMAGIC:
	case MTSHM_EVERSION:
	case MTSHM_ETRUNCATED:
	case MTSHM_ELAYOUT:
	case MTSHM_EBYTEORDER:
		return 1;
	default:
		return 0;
	}
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	/* malloc(0) may return NULL; keep one byte so the pointer is real. */
	unsigned char *buf = malloc(size ? size : 1);
	if (!buf)
		abort();
	if (size)
		memcpy(buf, data, size);

	int err = mtshm_validate(buf, size);
	if (!listed(err))
		abort(); /* a code the header does not list */
	struct mtshm_layout l, zero;
	memset(&l, 0xa5, sizeof(l));
	memset(&zero, 0, sizeof(zero));
	int lerr = mtshm_layout_read(buf, size, &l);
	if (lerr != err)
		abort(); /* the two judges disagree */
	if (err) {
		if (memcmp(&l, &zero, sizeof(l)) != 0)
			abort(); /* a refused header left a layout */
		if (!mtshm_strerror(err))
			abort();
		free(buf);
		return 0;
	}

	const struct mtshm_header *h = (const void *)buf;
	if (l.lane_count < 1 || l.lane_count > MTSHM_MAX_LANES ||
	    l.slot_count < 1 || l.slot_count > MTSHM_MAX_SLOTS ||
	    l.slot_stride % MTSHM_LINE ||
	    l.slot_stride < (uint64_t)l.lane_count * MTSHM_LINE ||
	    l.table_size != (uint64_t)l.slot_count * l.slot_stride)
		abort(); /* an impossible layout accepted */
	if (l.lane_count != h->lane_count || l.slot_count != h->slot_count ||
	    l.slot_stride != h->slot_stride || l.table_size != h->table_size ||
	    l.threshold != h->threshold || l.generation != h->generation)
		abort(); /* the layout is not the header's */

	/* The bytes after the header page, as a table of this layout. */
	size_t rest = size - MTSHM_HEADER_SIZE;
	if (rest >= l.table_size) {
		unsigned char *table = buf + MTSHM_HEADER_SIZE;
		for (uint32_t i = 0; i < l.slot_count; i++) {
			struct mtshm_slot_id *s = mtshm_slot(&l, table, i);
			size_t at = (size_t)((unsigned char *)s - table);
			if (at + (size_t)l.lane_count * MTSHM_LINE > l.table_size)
				abort(); /* a slot beyond its table */
			uint64_t flushes;
			int absurd;
			int64_t sum = mtshm_slot_sum(s, l.lane_count, &flushes,
			                             &absurd);
			if (!absurd && (sum > MTSHM_ABSURD_BYTES ||
			                sum < -MTSHM_ABSURD_BYTES))
				abort(); /* an unflagged absurd total */
		}
	}
	/* An odd seq is a writer inside (or one that died there):
	 * mtshm_fleet_read() waits for it by design, so only a settled
	 * snapshot is read here. */
	if (h->fleet.seq % 2 == 0) {
		struct mtshm_fleet f;
		mtshm_fleet_read(h, &f);
	}
	free(buf);
	return 0;
}
