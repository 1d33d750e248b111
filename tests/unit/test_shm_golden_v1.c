/*
 * test_shm_golden_v1.c - the golden images of layouts 1.0 and 1.1
 * (tests/golden/segment-v1.0.bin and segment-v1.1.bin) are refused by a
 * 2.0 build.
 *
 * Layout 1.x was one named object, the header followed by the slots (and,
 * in 1.1, a per-slot names region); 2.0 is a sealed header object plus a
 * slot table per uid. A reader of one must never address the other's
 * bytes, so every 2.0 entry point that judges a header says
 * MTSHM_EVERSION for both images: mtshm_validate() on the whole image and
 * on its header page, mtshm_layout_read() (which then leaves the layout
 * zeroed), and mtshm_map_fd() on a sealed object holding it, as a worker
 * would be handed one. The images are refusal fixtures now: their bytes
 * are checked at the 1.x offsets so that they stay what they were.
 */
#define _GNU_SOURCE
#include "golden_image.h"
#include "mtshm.h"

#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#define GOLDEN10 MEMTALLY_GOLDEN_DIR "/segment-v1.0.bin"
#define GOLDEN11 MEMTALLY_GOLDEN_DIR "/segment-v1.1.bin"
#define SIZE10   6144u
#define SIZE11   7168u

static unsigned char *load(const char *path, size_t want)
{
	FILE *f = fopen(path, "rb");
	cr_assert_not_null(f, "cannot open %s", path);
	unsigned char *img = aligned_alloc(4096, 8192);
	cr_assert_not_null(img);
	memset(img, 0, 8192);
	size_t n = fread(img, 1, 8192, f);
	fclose(f);
	cr_assert_eq(n, want, "%s: %zu bytes, want %zu", path, n, want);
	return img;
}

static void expect_code(int got, int want, const char *what)
{
	cr_expect_eq(got, want, "%s: got %d (%s), want %d (%s)", what, got,
	             mtshm_strerror(got), want, mtshm_strerror(want));
}

/* The 1.x bytes a 1.x reader used, at their 1.x offsets. */
static void check_v1_bytes(const unsigned char *g, uint64_t minor,
                           uint64_t size)
{
	cr_assert_eq(memcmp(g, "MEMTALLY", 8), 0, "magic bytes at 0");
	cr_expect_eq(golden_le(g, 8, 2), 1, "version_major at 8");
	cr_expect_eq(golden_le(g, 10, 2), minor, "version_minor at 10");
	cr_expect_eq(golden_le(g, 12, 2), 0, "compat_minor at 12");
	cr_expect_eq(golden_le(g, 16, 4), 4096, "header_size at 16");
	cr_expect_eq(golden_le(g, 20, 4), 4096, "slot_offset at 20 (1.x)");
	cr_expect_eq(golden_le(g, 24, 4), 512, "slot_stride at 24");
	cr_expect_eq(golden_le(g, 28, 4), 4, "slot_count at 28");
	cr_expect_eq(golden_le(g, 32, 4), 4, "lane_count at 32");
	cr_expect_eq(golden_le(g, 40, 8), size, "segment_size at 40 (1.x)");
	cr_expect_eq(golden_le(g, 128 + 8, 8), 754996, "fleet.bytes");
	cr_expect_eq(golden_le(g, 4096 + 0, 4), 1234,
	             "slot 0 pid, after the header");
}

/* Everything a 2.0 reader does with a header, on image `img`. */
static void check_refused(unsigned char *img, size_t size, const char *name)
{
	char what[128];
	snprintf(what, sizeof(what), "%s, whole image", name);
	expect_code(mtshm_validate(img, size), MTSHM_EVERSION, what);
	snprintf(what, sizeof(what), "%s, header page", name);
	expect_code(mtshm_validate(img, MTSHM_HEADER_SIZE), MTSHM_EVERSION,
	            what);

	struct mtshm_layout l, zero;
	memset(&l, 0xa5, sizeof(l));
	memset(&zero, 0, sizeof(zero));
	snprintf(what, sizeof(what), "%s, layout", name);
	expect_code(mtshm_layout_read(img, size, &l), MTSHM_EVERSION, what);
	cr_expect_eq(memcmp(&l, &zero, sizeof(l)), 0, "%s: layout not zeroed",
	             name);

	/* As a sealed object, whole or cut to a page, as a worker would be
	 * handed it: refused, nothing left mapped. */
	size_t sizes[2] = {size, MTSHM_HEADER_SIZE};
	for (int i = 0; i < 2; i++) {
		int fd = memfd_create("golden-v1", MFD_CLOEXEC |
		                                       MFD_ALLOW_SEALING);
		cr_assert_geq(fd, 0);
		cr_assert_eq(write(fd, img, sizes[i]), (ssize_t)sizes[i]);
		cr_assert_eq(fcntl(fd, F_ADD_SEALS, MTSHM_SEALS_HEADER), 0);
		struct mtshm_map m;
		snprintf(what, sizeof(what), "%s, sealed object of %zu bytes",
		         name, sizes[i]);
		expect_code(mtshm_map_fd(fd, MTSHM_SEALS_HEADER, 0, &m),
		            MTSHM_EVERSION, what);
		cr_expect_null(m.base, "%s: left mapped", what);
		close(fd);
	}
}

Test(golden_v1, v10_bytes_unchanged)
{
	unsigned char *img = load(GOLDEN10, SIZE10);
	check_v1_bytes(img, 0, SIZE10);
	free(img);
}

Test(golden_v1, v11_bytes_unchanged)
{
	unsigned char *img = load(GOLDEN11, SIZE11);
	check_v1_bytes(img, 1, SIZE11);
	cr_expect_eq(golden_le(img, 80, 4), 6144, "names_offset at 80 (1.1)");
	cr_expect_eq(golden_le(img, 84, 4), 256, "names_stride at 84 (1.1)");
	cr_expect_eq(memcmp(img + 6144 + 16, "etl", 4), 0, "slot 0 group");
	free(img);
}

Test(golden_v1, v10_refused)
{
	unsigned char *img = load(GOLDEN10, SIZE10);
	check_refused(img, SIZE10, "1.0");
	free(img);
}

Test(golden_v1, v11_refused)
{
	unsigned char *img = load(GOLDEN11, SIZE11);
	check_refused(img, SIZE11, "1.1");
	free(img);
}

Test(golden_v1, v1_relabelled_as_2_is_still_not_a_2_header)
{
	/* The version is not the only guard: a 1.x header with its major
	 * rewritten declares a table_size (1.x segment_size) that is not
	 * its slots, so 2.0 still refuses to take a layout from it. */
	const char *paths[2] = {GOLDEN10, GOLDEN11};
	size_t sizes[2] = {SIZE10, SIZE11};
	for (int i = 0; i < 2; i++) {
		unsigned char *img = load(paths[i], sizes[i]);
		img[8] = 2; /* version_major, little-endian */
		img[10] = 0;
		expect_code(mtshm_validate(img, sizes[i]), MTSHM_ELAYOUT,
		            paths[i]);
		free(img);
	}
}
