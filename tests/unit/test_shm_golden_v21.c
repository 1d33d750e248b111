/*
 * test_shm_golden_v21.c - layout 2.1 (mapped bytes) against its committed
 * images (tests/golden/header-v2.1.bin, table-v2.1.bin), and the promise
 * of a minor version: a 2.0 reader still works on a 2.1 segment, and this
 * build reads the 2.0 images with no mapped bytes.
 *
 * "A 2.0 reader" is written here from 2.0's own rules, with literal
 * offsets (no struct of this build): accept major 2 with compat_minor <=
 * 0, read the geometry, the fleet words and the lanes at their 2.0
 * offsets. The 2.1 images must give it exactly what the 2.0 images gave
 * (but the fleet's bytes, which now include the mapped bytes).
 */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "golden_image.h"
#include "mtshm.h"

#define G_HSIZE 4096u
#define G_TSIZE 2048u

static unsigned char h20[G_HSIZE], h21[G_HSIZE];
static unsigned char t20[G_TSIZE], t21[G_TSIZE];

static void load(const char *name, unsigned char *buf, size_t size)
{
	char path[512];
	snprintf(path, sizeof(path), "%s/%s", MEMTALLY_GOLDEN_DIR, name);
	golden_load(path, buf, size);
}

static void load_all(void)
{
	load("header-v2.0.bin", h20, G_HSIZE);
	load("header-v2.1.bin", h21, G_HSIZE);
	load("table-v2.0.bin", t20, G_TSIZE);
	load("table-v2.1.bin", t21, G_TSIZE);
}

TestSuite(golden21, .init = load_all);

/* 2.0's acceptance rule, as a 2.0 build applies it. */
static int reader20_accepts(const unsigned char *h)
{
	return golden_le(h, 0, 8) == UINT64_C(0x594c4c41544d454d) &&
	       golden_le(h, 8, 2) == 2 && golden_le(h, 12, 2) <= 0 &&
	       golden_le(h, 16, 4) == 4096;
}

/* 2.0's slot sum: lanes [0, lanes_used) at 128k + 64 + 8, plus overflow at
 * 56, for slot i of stride 512 and 4 lanes. */
static int64_t reader20_sum(const unsigned char *t, uint32_t i)
{
	size_t s = (size_t)i * 512;
	uint64_t used = golden_le(t, s + 52, 4);
	if (used > 4)
		used = 4;
	uint64_t sum = golden_le(t, s + 56, 8);
	for (uint64_t k = 0; k < used; k++)
		sum += golden_le(t, s + 128 * k + 64 + 8, 8);
	return (int64_t)sum;
}

Test(golden21, header_is_2_0_plus_the_new_words)
{
	cr_expect_eq(golden_le(h21, 10, 2), 1, "version_minor");
	cr_expect_eq(golden_le(h21, 12, 2), 0,
	             "compat_minor: 2.0 readers accepted");
	cr_expect_eq(golden_le(h21, 128 + 80, 8), 3 * 1048576 + 4096,
	             "fleet.mapped");
	cr_expect_eq(golden_le(h21, 128 + 8, 8),
	             golden_le(h20, 128 + 8, 8) + 3 * 1048576 + 4096,
	             "fleet bytes include mapped");
	for (size_t off = 0; off < G_HSIZE; off++) {
		if (off == 10 || (off >= 136 && off < 144) ||
		    (off >= 208 && off < 216))
			continue;
		cr_expect_eq(h21[off], h20[off], "byte %zu differs from 2.0",
			     off);
	}
}

Test(golden21, table_is_2_0_plus_lane_0_mapped)
{
	cr_expect_eq(golden_le(t21, 64 + 24, 8), 3 * 1048576, "slot 0 mapped");
	cr_expect_eq(golden_le(t21, 1024 + 64 + 24, 8), 4096, "slot 2 mapped");
	for (size_t off = 0; off < G_TSIZE; off++) {
		if ((off >= 88 && off < 96) || (off >= 1112 && off < 1120))
			continue;
		cr_expect_eq(t21[off], t20[off], "byte %zu differs from 2.0",
			     off);
	}
}

Test(golden21, a_2_0_reader_still_works)
{
	cr_expect(reader20_accepts(h20));
	cr_expect(reader20_accepts(h21), "2.0 refuses 2.1");
	cr_expect_eq(reader20_sum(t21, 0), reader20_sum(t20, 0));
	cr_expect_eq(reader20_sum(t21, 0), 754096, "2.0 sum of slot 0");
	cr_expect_eq(reader20_sum(t21, 2), 900, "2.0 sum of slot 2");
}

Test(golden21, this_build_reads_both)
{
	static unsigned char h[G_HSIZE] __attribute__((aligned(4096)));
	static unsigned char t[G_TSIZE] __attribute__((aligned(4096)));
	struct mtshm_layout l;
	struct mtshm_fleet f;
	const unsigned char *hs[2] = {h20, h21};
	const unsigned char *ts[2] = {t20, t21};
	const uint64_t mapped0[2] = {0, 3 * 1048576};
	const uint64_t mapped2[2] = {0, 4096};
	for (int v = 0; v < 2; v++) {
		memcpy(h, hs[v], G_HSIZE);
		memcpy(t, ts[v], G_TSIZE);
		cr_assert_eq(mtshm_layout_read(h, G_HSIZE, &l), 0, "2.%d", v);
		cr_assert_eq(mtshm_fleet_read((struct mtshm_header *)h, &f), 0);
		cr_expect_eq(f.mapped, mapped0[v] + mapped2[v], "2.%d fleet", v);
		int absurd;
		uint64_t flushes;
		struct mtshm_slot_id *s0 = mtshm_slot(&l, t, 0);
		struct mtshm_slot_id *s2 = mtshm_slot(&l, t, 2);
		cr_expect_eq(mtshm_slot_mapped(s0, &absurd), mapped0[v]);
		cr_expect_not(absurd);
		cr_expect_eq(mtshm_slot_mapped(s2, &absurd), mapped2[v]);
		cr_expect_eq(mtshm_slot_sum(s0, l.lane_count, &flushes, &absurd),
			     754096, "heap of slot 0 without its mapped bytes");
	}
}

Test(golden21, negative_or_absurd_mapped_is_refused)
{
	static unsigned char t[G_TSIZE] __attribute__((aligned(4096)));
	struct mtshm_layout l;
	cr_assert_eq(mtshm_layout_read(h21, G_HSIZE, &l), 0);
	memcpy(t, t21, G_TSIZE);
	struct mtshm_slot_id *s0 = mtshm_slot(&l, t, 0);
	int absurd;
	mtshm_lane(s0, 0)->mapped = -4096;
	cr_expect_eq(mtshm_slot_mapped(s0, &absurd), 0);
	cr_expect(absurd, "negative mapped");
	mtshm_lane(s0, 0)->mapped = MTSHM_ABSURD_BYTES + 1;
	mtshm_slot_mapped(s0, &absurd);
	cr_expect(absurd, "beyond 1 PiB");
}
