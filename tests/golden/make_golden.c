/*
 * make_golden.c - writes the golden segment images of layouts 1.0 and 1.1.
 *
 * The image is a small segment (4 slots x 4 lanes, 4096 + 4 * 512 bytes)
 * whose every non-zero field has a fixed, documented value: nothing here
 * is random or read from the clock, so two runs produce the same bytes.
 * tests/unit/test_shm_golden.c knows these values and checks that every
 * build reads them back through the published geometry, and rejects the
 * corrupted variants it derives from them.
 *
 * The committed image is the reference, not this program: once a layout
 * version's image is committed it is never regenerated after a change to
 * mtshm.h, because its whole point is to catch such a change. A new layout
 * version gets its own image (and its own branch here). The version words
 * below are therefore literals, not MTSHM_VERSION_*.
 *
 * 1.1 is the 1.0 image with minor 1 and the per-slot names region after
 * the slots (names for slots 0 and 2).
 *
 * Usage: make_golden [--v1.1] OUT.bin   (see tests/golden/README.md)
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
	GOLDEN_SIZE = MTSHM_HEADER_SIZE + GOLDEN_SLOTS * GOLDEN_STRIDE,
	GOLDEN11_NAMES = GOLDEN_SIZE,
	GOLDEN11_SIZE = GOLDEN_SIZE + GOLDEN_SLOTS * 256,
};

/* The 1.1 additions, with literal offsets and values. */
static void fill_v11(unsigned char *img)
{
	struct mtshm_header *h = (struct mtshm_header *)img;
	h->version_minor = 1;
	h->segment_size = GOLDEN11_SIZE;
	h->names_offset = GOLDEN11_NAMES;
	h->names_stride = 256;
	struct mtshm_slot_names *n =
		(struct mtshm_slot_names *)(img + GOLDEN11_NAMES);
	n[0].image_id = UINT64_C(0xfeedface12345678);
	n[0].registered_ns = UINT64_C(1700000001000000000);
	strcpy(n[0].group, "etl");
	strcpy(n[0].task, "job-42");
	n[2].image_id = 77;
	n[2].registered_ns = UINT64_C(1700000002000000000);
	strcpy(n[2].group, "ml");
}

/* Slot i of the image, addressed the way a reader must: offset + stride. */
static struct mtshm_slot_id *slot(unsigned char *img, uint32_t i)
{
	return (struct mtshm_slot_id *)(img + MTSHM_HEADER_SIZE +
	                                (size_t)i * GOLDEN_STRIDE);
}

static void fill(unsigned char *img)
{
	struct mtshm_header *h = (struct mtshm_header *)img;
	h->magic = MTSHM_MAGIC;
	h->version_major = 1;
	h->version_minor = 0;
	h->compat_minor = 0;
	h->header_size = MTSHM_HEADER_SIZE;
	h->slot_offset = MTSHM_HEADER_SIZE;
	h->slot_stride = GOLDEN_STRIDE;
	h->slot_count = GOLDEN_SLOTS;
	h->lane_count = GOLDEN_LANES;
	h->line_size = MTSHM_LINE;
	h->segment_size = GOLDEN_SIZE;
	h->generation = UINT64_C(0x0123456789abcdef);
	h->server_pid = 4242;
	h->server_uid = 1000;
	h->created_ns = UINT64_C(1700000000123456789);
	h->threshold = 65536;

	/* Fleet totals consistent with the slots below: slot 0 (754096) +
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

	/* Slot 0: two claimed lanes plus overflow; lane 2 holds a stale value
	 * beyond lanes_used that a reader must not sum. */
	struct mtshm_slot_id *s = slot(img, 0);
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
	s = slot(img, 2);
	s->pid = 5678;
	s->uid = 1001;
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

	/* Slot 3: a lane with an absurd counter (2^60): quarantined. */
	s = slot(img, 3);
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

int main(int argc, char **argv)
{
	int v11 = argc == 3 && strcmp(argv[1], "--v1.1") == 0;
	if (argc != 2 + v11) {
		fprintf(stderr, "usage: %s [--v1.1] OUT.bin\n", argv[0]);
		return 2;
	}
	size_t size = v11 ? GOLDEN11_SIZE : GOLDEN_SIZE;
	const char *path = argv[1 + v11];
	/* Aligned like a mapping, and zeroed: every byte not set above,
	 * reserved words included, is zero in the image. */
	unsigned char *img = aligned_alloc(MTSHM_HEADER_SIZE, 2 * 4096 * 2);
	if (!img) {
		perror("aligned_alloc");
		return 1;
	}
	memset(img, 0, size);
	fill(img);
	if (v11)
		fill_v11(img);
	if (mtshm_validate(img, size) != 0) {
		fprintf(stderr, "%s: generated image does not validate\n",
		        argv[0]);
		return 1;
	}

	FILE *out = fopen(path, "wb");
	if (!out) {
		perror(path);
		return 1;
	}
	if (fwrite(img, 1, size, out) != size || fclose(out) != 0) {
		perror(path);
		return 1;
	}
	free(img);
	return 0;
}
