/*
 * make_golden.c - writes the golden images of layout 2.0: the header page
 * and a slot table.
 *
 * Layout 2.0 has two kinds of shared object (shm/mtshm.h): a 4096-byte
 * header and one slot table per uid. The header image declares 4 slots x
 * 4 lanes (stride 512, table_size 2048); the table image is such a table
 * (2048 bytes) with slots 0, 2 and 3 in use. Every non-zero field has a
 * fixed, documented value: nothing here is random or read from the clock,
 * so two runs produce the same bytes. tests/unit/test_shm_golden.c knows
 * these values and checks that every build reads them back byte for byte
 * and through the layout, and rejects the corrupted variants it derives.
 *
 * The committed images are the reference, not this program: once a layout
 * version's image is committed it is never regenerated after a change to
 * mtshm.h, because its whole point is to catch such a change. A new layout
 * version gets its own images (and its own branch here). The version words
 * below are therefore literals, not MTSHM_VERSION_*. The images of layouts
 * 1.0 and 1.1 (segment-v1.*.bin) were written by this program's earlier
 * revisions and stay committed as they are: 2.0 readers must refuse them.
 *
 * Layout 2.1 (mapped bytes) is 2.0 plus two words that were zero: lane
 * 0's `mapped` and `fleet.mapped`. Its images (--minor 1) are the 2.0
 * images with those words set, the fleet's bytes including them, and the
 * version word 2.1.
 *
 * Usage: make_golden --header OUT.bin | --table OUT.bin [--minor 1]
 *        (see tests/golden/README.md)
 */
#include "mtshm.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#if !defined(__BYTE_ORDER__) || __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "the golden image is little-endian: generate it on a little-endian host"
#endif

enum {
	GOLDEN_SLOTS = 4,
	GOLDEN_LANES = 4,
	GOLDEN_STRIDE = GOLDEN_LANES * MTSHM_LINE,
	GOLDEN_TABLE = GOLDEN_SLOTS * GOLDEN_STRIDE, /* 2048 */
};

/* Layout 2.1's mapped bytes in the images: slot 0 and slot 2. */
#define GOLDEN_MAPPED_0 (3 * 1048576)
#define GOLDEN_MAPPED_2 4096
/* Layout 2.2's allocator free bytes: slot 0's sample, at its heap. */
#define GOLDEN_FREE_0      (2 * 1048576)
#define GOLDEN_FREE_HEAP_0 754096

static void fill_header(unsigned char *img)
{
	struct mtshm_header *h = (struct mtshm_header *)img;
	h->magic = MTSHM_MAGIC;
	h->version_major = 2;
	h->version_minor = 0;
	h->compat_minor = 0;
	h->header_size = MTSHM_HEADER_SIZE;
	h->reserved_off = 0;
	h->slot_stride = GOLDEN_STRIDE;
	h->slot_count = GOLDEN_SLOTS;
	h->lane_count = GOLDEN_LANES;
	h->line_size = MTSHM_LINE;
	h->table_size = GOLDEN_TABLE;
	h->generation = UINT64_C(0x0123456789abcdef);
	h->server_pid = 4242;
	h->server_uid = 1000;
	h->created_ns = UINT64_C(1700000000123456789);
	h->threshold = 65536;

	/* Fleet totals consistent with the table below: slot 0 (754096) +
	 * slot 2 (900); slot 3 is corrupt and not summed. 7 live threads. */
	struct mtshm_fleet *f = &h->fleet;
	f->seq = 6;
	f->bytes = 754996;
	f->peak = 800000;
	f->limit = 800000;
	f->reserved = 4096;
	f->error_bytes = 7 * 65536;
	f->heartbeat_ns = UINT64_C(123456789000);
	f->ticks = 3;
	f->state = MTSHM_STATE_HIGH;
	f->processes = 3;
	f->unregistered = 1;
}

/* Slot i of the table image: i * stride, as a reader addresses it. */
static struct mtshm_slot_id *slot(unsigned char *table, uint32_t i);

/* 2.1: the version word, and the fleet's mapped bytes (part of bytes). */
static void fill_header_21(unsigned char *img)
{
	struct mtshm_header *h = (struct mtshm_header *)img;
	fill_header(img);
	h->version_minor = 1;
	h->fleet.mapped = GOLDEN_MAPPED_0 + GOLDEN_MAPPED_2;
	h->fleet.bytes += GOLDEN_MAPPED_0 + GOLDEN_MAPPED_2;
}

/* 2.2: the version word, and the fleet's allocator free bytes (part of
 * bytes). */
static void fill_header_22(unsigned char *img)
{
	struct mtshm_header *h = (struct mtshm_header *)img;
	fill_header_21(img);
	h->version_minor = 2;
	h->fleet.allocator_free = GOLDEN_FREE_0;
	h->fleet.bytes += GOLDEN_FREE_0;
}

static struct mtshm_slot_id *slot(unsigned char *table, uint32_t i)
{
	return (struct mtshm_slot_id *)(table + (size_t)i * GOLDEN_STRIDE);
}

static void fill_table(unsigned char *t)
{
	/* Slot 0: two claimed lanes plus overflow; lane 2 holds a stale value
	 * beyond lanes_used that a reader must not sum. */
	struct mtshm_slot_id *s = slot(t, 0);
	s->pid = 1234;
	s->uid = 1000;
	s->generation = 7;
	s->start_time = 987654;
	s->limit = UINT64_C(1) << 30;
	s->peak = 760000;
	s->flags = 0;
	s->group = 1;
	s->threads = 3;
	s->lanes_used = 2;
	s->overflow = 4096;
	mtshm_lane(s, 0)->owner = 1234;
	mtshm_lane(s, 0)->bytes = 1000000;
	mtshm_lane(s, 0)->flushes = 10;
	mtshm_lane(s, 1)->owner = 1240;
	mtshm_lane(s, 1)->bytes = -250000;
	mtshm_lane(s, 1)->flushes = 5;
	mtshm_lane(s, 2)->bytes = 777;
	mtshm_lane(s, 2)->flushes = 99;

	/* Slot 1: free (all zero). */

	/* Slot 2: every lane claimed, negative overflow, over its limit. */
	s = slot(t, 2);
	s->pid = 5678;
	s->uid = 1000;
	s->generation = 2;
	s->start_time = 123;
	s->limit = 500;
	s->peak = 1000;
	s->flags = MTSHM_SLOT_OVER_LIMIT;
	s->group = 2;
	s->threads = 4;
	s->lanes_used = 4;
	s->overflow = -100;
	for (uint32_t k = 0; k < 4; k++) {
		mtshm_lane(s, k)->owner = 5678 + k;
		mtshm_lane(s, k)->bytes = 100 * (int64_t)(k + 1);
		mtshm_lane(s, k)->flushes = k + 1;
	}

	/* Slot 3: a total no machine holds (2^60 + 5): quarantined. */
	s = slot(t, 3);
	s->pid = 9999;
	s->uid = 1000;
	s->generation = 1;
	s->start_time = 5;
	s->flags = MTSHM_SLOT_CORRUPT;
	s->group = 1;
	s->threads = 1;
	s->lanes_used = 1;
	s->overflow = 5;
	mtshm_lane(s, 0)->owner = 9999;
	mtshm_lane(s, 0)->bytes = INT64_C(1) << 60;
	mtshm_lane(s, 0)->flushes = 1;
}

/* 2.1: lane 0's mapped word of the live slots (the corrupt one keeps 0). */
static void fill_table_21(unsigned char *t)
{
	fill_table(t);
	mtshm_lane(slot(t, 0), 0)->mapped = GOLDEN_MAPPED_0;
	mtshm_lane(slot(t, 2), 0)->mapped = GOLDEN_MAPPED_2;
}

/* 2.2: slot 0's sample of its allocator's free bytes (seq 4: two
 * samples stored), taken at its heap of the image. */
static void fill_table_22(unsigned char *t)
{
	fill_table_21(t);
	mtshm_lane(slot(t, 0), 0)->free_seq = 4;
	mtshm_lane(slot(t, 0), 0)->free_bytes = GOLDEN_FREE_0;
	mtshm_lane(slot(t, 0), 0)->free_heap = GOLDEN_FREE_HEAP_0;
}

int main(int argc, char **argv)
{
	int minor = 0;
	if (argc == 5 && strcmp(argv[3], "--minor") == 0) {
		minor = strcmp(argv[4], "1") == 0   ? 1
		        : strcmp(argv[4], "2") == 0 ? 2
		                                    : -1;
		argc = minor < 0 ? 0 : 3;
	}
	int header = argc == 3 && strcmp(argv[1], "--header") == 0;
	int table = argc == 3 && strcmp(argv[1], "--table") == 0;
	if (!header && !table) {
		fprintf(stderr,
		        "usage: %s --header|--table OUT.bin [--minor 1|2]\n",
		        argv[0]);
		return 2;
	}
	size_t size = header ? MTSHM_HEADER_SIZE : GOLDEN_TABLE;
	/* Aligned like a mapping, and zeroed: every byte not set above,
	 * reserved words included, is zero in the image. */
	unsigned char *img = aligned_alloc(MTSHM_HEADER_SIZE, MTSHM_HEADER_SIZE);
	if (!img) {
		perror("aligned_alloc");
		return 1;
	}
	memset(img, 0, MTSHM_HEADER_SIZE);
	if (header) {
		(minor == 2   ? fill_header_22
		 : minor == 1 ? fill_header_21
		              : fill_header)(img);
		if (mtshm_validate(img, size) != 0) {
			fprintf(stderr, "%s: generated header does not validate\n",
			        argv[0]);
			return 1;
		}
	} else {
		(minor == 2   ? fill_table_22
		 : minor == 1 ? fill_table_21
		              : fill_table)(img);
	}

	FILE *out = fopen(argv[2], "wb");
	if (!out) {
		perror(argv[2]);
		return 1;
	}
	if (fwrite(img, 1, size, out) != size || fclose(out) != 0) {
		perror(argv[2]);
		return 1;
	}
	free(img);
	return 0;
}
