/*
 * The golden image of layout 1.1 (tests/golden/segment-v1.1.bin): the 1.0
 * image plus the per-slot names region. This build must accept it, read
 * the names through the published offset and stride, and reject a names
 * region that is cut off or overlaps the slots.
 */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "mtshm.h"

#define GOLDEN11 MEMTALLY_GOLDEN_DIR "/segment-v1.1.bin"
#define SIZE11   7168u

static unsigned char *load(size_t *size)
{
	FILE *f = fopen(GOLDEN11, "rb");
	cr_assert_not_null(f, "cannot open %s", GOLDEN11);
	unsigned char *img = aligned_alloc(4096, 8192);
	cr_assert_not_null(img);
	memset(img, 0, 8192);
	*size = fread(img, 1, 8192, f);
	fclose(f);
	cr_assert_eq(*size, SIZE11);
	return img;
}

static struct mtshm_map as_map(unsigned char *img, size_t size)
{
	struct mtshm_map m = {img, size, (struct mtshm_header *)img};
	return m;
}

Test(golden11, accepted_and_names_read_back)
{
	size_t size;
	unsigned char *img = load(&size);
	cr_assert_eq(mtshm_validate(img, size), 0);
	struct mtshm_map m = as_map(img, size);
	cr_expect_eq(m.hdr->version_minor, 1);
	cr_expect_eq(m.hdr->compat_minor, 0);
	/* Literal offsets: names_offset at 80, names_stride at 84. */
	uint32_t off, stride;
	memcpy(&off, img + 80, 4);
	memcpy(&stride, img + 84, 4);
	cr_expect_eq(off, 6144);
	cr_expect_eq(stride, 256);
	struct mtshm_slot_names *n0 = mtshm_names(&m, 0);
	cr_assert_eq((unsigned char *)n0, img + 6144);
	cr_expect_eq(n0->image_id, UINT64_C(0xfeedface12345678));
	cr_expect_str_eq(n0->group, "etl");
	cr_expect_str_eq(n0->task, "job-42");
	struct mtshm_slot_names *n2 = mtshm_names(&m, 2);
	cr_expect_eq((unsigned char *)n2, img + 6144 + 2 * 256);
	cr_expect_str_eq(n2->group, "ml");
	cr_expect_eq(n2->image_id, 77);
	cr_expect_eq(mtshm_names(&m, 1)->image_id, 0);
	/* The slots are those of 1.0. */
	cr_expect_eq(mtshm_slot_sum(&m, mtshm_slot(&m, 0), NULL, NULL), 754096);
	free(img);
}

Test(golden11, names_cut_off_is_truncated)
{
	size_t size;
	unsigned char *img = load(&size);
	cr_expect_eq(mtshm_validate(img, size - 1), MTSHM_ETRUNCATED);
	cr_expect_eq(mtshm_validate(img, 6144), MTSHM_ETRUNCATED);
	free(img);
}

Test(golden11, names_overlapping_slots_or_misdeclared_are_rejected)
{
	size_t size;
	unsigned char *img = load(&size);
	struct mtshm_header *h = (struct mtshm_header *)img;
	h->names_offset = 6144 - 128; /* inside the last slot */
	cr_expect_eq(mtshm_validate(img, size), MTSHM_ELAYOUT);
	h->names_offset = 6144;
	h->names_stride = 128; /* smaller than an entry */
	cr_expect_eq(mtshm_validate(img, size), MTSHM_ELAYOUT);
	h->names_stride = 256;
	h->segment_size = 6144; /* declared size ends before the names */
	cr_expect_eq(mtshm_validate(img, size), MTSHM_ELAYOUT);
	h->segment_size = SIZE11;
	cr_expect_eq(mtshm_validate(img, size), 0);
	free(img);
}

Test(golden11, a_10_reader_view_ignores_names)
{
	/* names_offset 0 in a 1.1 segment means "no names": accepted, and
	 * mtshm_names() says so. */
	size_t size;
	unsigned char *img = load(&size);
	struct mtshm_header *h = (struct mtshm_header *)img;
	h->names_offset = 0;
	cr_expect_eq(mtshm_validate(img, size), 0);
	struct mtshm_map m = as_map(img, size);
	cr_expect_null(mtshm_names(&m, 0));
	free(img);
}
