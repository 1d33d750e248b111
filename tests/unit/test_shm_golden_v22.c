/*
 * test_shm_golden_v22.c - layout 2.2 (the allocator's free bytes) against
 * its committed images (tests/golden/header-v2.2.bin, table-v2.2.bin),
 * and the promise of a minor version: a 2.1 reader still works on a 2.2
 * segment, and this build reads the 2.1 images with no free bytes.
 *
 * "A 2.1 reader" is written here from 2.1's own rules, with literal
 * offsets (no struct of this build): accept major 2 with compat_minor <=
 * 1, read the lanes, overflow and lane 0's mapped word at their 2.1
 * offsets. The 2.2 images must give it exactly what the 2.1 images gave
 * (but the fleet's bytes, which now include the free bytes).
 */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "golden_image.h"
#include "mtshm.h"

#define G_HSIZE 4096u
#define G_TSIZE 2048u
#define G_FREE  (2u * 1048576u)

static unsigned char h21[G_HSIZE], h22[G_HSIZE];
static unsigned char t21[G_TSIZE], t22[G_TSIZE];

static void load(const char *name, unsigned char *buf, size_t size)
{
	char path[512];
	snprintf(path, sizeof(path), "%s/%s", MEMTALLY_GOLDEN_DIR, name);
	golden_load(path, buf, size);
}

static void load_all(void)
{
	load("header-v2.1.bin", h21, G_HSIZE);
	load("header-v2.2.bin", h22, G_HSIZE);
	load("table-v2.1.bin", t21, G_TSIZE);
	load("table-v2.2.bin", t22, G_TSIZE);
}

TestSuite(golden22, .init = load_all);

/* 2.1's acceptance rule, as a 2.1 build applies it. */
static int reader21_accepts(const unsigned char *h)
{
	return golden_le(h, 0, 8) == UINT64_C(0x594c4c41544d454d) &&
	       golden_le(h, 8, 2) == 2 && golden_le(h, 12, 2) <= 1 &&
	       golden_le(h, 16, 4) == 4096;
}

/* 2.1's process total: lanes [0, lanes_used) at 128k + 64 + 8, overflow
 * at 56, and lane 0's mapped word at 64 + 24, for slot i of stride 512
 * and 4 lanes. */
static int64_t reader21_total(const unsigned char *t, uint32_t i)
{
	size_t s = (size_t)i * 512;
	uint64_t used = golden_le(t, s + 52, 4);
	if (used > 4)
		used = 4;
	uint64_t sum = golden_le(t, s + 56, 8);
	for (uint64_t k = 0; k < used; k++)
		sum += golden_le(t, s + 128 * k + 64 + 8, 8);
	return (int64_t)(sum + golden_le(t, s + 64 + 24, 8));
}

Test(golden22, header_is_2_1_plus_the_new_words)
{
	cr_expect_eq(golden_le(h22, 10, 2), 2, "version_minor");
	cr_expect_eq(golden_le(h22, 12, 2), 0,
	             "compat_minor: 2.0 readers accepted");
	cr_expect_eq(golden_le(h22, 128 + 88, 8), G_FREE,
	             "fleet.allocator_free");
	cr_expect_eq(golden_le(h22, 128 + 8, 8),
	             golden_le(h21, 128 + 8, 8) + G_FREE,
	             "fleet bytes include the free bytes");
	for (size_t off = 0; off < G_HSIZE; off++) {
		if (off == 10 || (off >= 136 && off < 144) ||
		    (off >= 216 && off < 224))
			continue;
		cr_expect_eq(h22[off], h21[off], "byte %zu differs from 2.1",
		             off);
	}
}

Test(golden22, table_is_2_1_plus_lane_0_free_words)
{
	cr_expect_eq(golden_le(t22, 64 + 32, 8), 4, "slot 0 free_seq");
	cr_expect_eq(golden_le(t22, 64 + 40, 8), G_FREE, "slot 0 free_bytes");
	cr_expect_eq(golden_le(t22, 64 + 48, 8), 754096, "slot 0 free_heap");
	for (size_t off = 0; off < G_TSIZE; off++) {
		if (off >= 96 && off < 120)
			continue;
		cr_expect_eq(t22[off], t21[off], "byte %zu differs from 2.1",
		             off);
	}
}

Test(golden22, a_2_1_reader_still_works)
{
	cr_expect(reader21_accepts(h21));
	cr_expect(reader21_accepts(h22), "2.1 refuses 2.2");
	for (uint32_t i = 0; i < 3; i++)
		cr_expect_eq(reader21_total(t22, i), reader21_total(t21, i),
		             "slot %u", i);
	cr_expect_eq(reader21_total(t22, 0), 754096 + 3 * 1048576);
	cr_expect_eq(reader21_total(t22, 2), 900 + 4096);
}

Test(golden22, this_build_reads_both)
{
	static unsigned char h[G_HSIZE] __attribute__((aligned(4096)));
	static unsigned char t[G_TSIZE] __attribute__((aligned(4096)));
	struct mtshm_layout l;
	struct mtshm_fleet f;
	const unsigned char *hs[2] = {h21, h22};
	const unsigned char *ts[2] = {t21, t22};
	const uint64_t free0[2] = {0, G_FREE};
	for (int v = 0; v < 2; v++) {
		memcpy(h, hs[v], G_HSIZE);
		memcpy(t, ts[v], G_TSIZE);
		cr_assert_eq(mtshm_layout_read(h, G_HSIZE, &l), 0, "2.%d",
		             v + 1);
		cr_assert_eq(mtshm_fleet_read((struct mtshm_header *)h, &f), 0);
		cr_expect_eq(f.allocator_free, free0[v], "2.%d fleet", v + 1);
		cr_expect_eq(f.mapped, 3 * 1048576 + 4096);
		int absurd;
		uint64_t flushes, fr = 99;
		struct mtshm_slot_id *s0 = mtshm_slot(&l, t, 0);
		struct mtshm_slot_id *s2 = mtshm_slot(&l, t, 2);
		int64_t heap0 =
		    mtshm_slot_sum(s0, l.lane_count, &flushes, &absurd);
		cr_expect_eq(heap0, 754096, "heap of slot 0, free bytes apart");
		struct mtshm_free_held h0 = {0}, h2 = {0};
		cr_expect_eq(
		    mtshm_free_now(s0, (uint64_t)heap0, &h0, &fr, &absurd), 1);
		cr_expect_not(absurd);
		cr_expect_eq(fr, free0[v], "2.%d slot 0 free", v + 1);
		/* 1 MiB more heap since the sample: taken out of the free. */
		cr_expect_eq(mtshm_free_now(s0, (uint64_t)heap0 + 1048576, &h0,
		                            &fr, &absurd),
		             1);
		cr_expect_eq(fr, free0[v] ? free0[v] - 1048576 : 0);
		/* Half the heap freed since: counted as free (held). */
		cr_expect_eq(
		    mtshm_free_now(s0, (uint64_t)heap0 / 2, &h0, &fr, &absurd),
		    1);
		cr_expect_eq(fr, free0[v] ? (uint64_t)heap0 + free0[v] -
		                                (uint64_t)heap0 / 2
		                          : 0);
		cr_expect_eq(mtshm_free_now(s2, 900, &h2, &fr, &absurd), 1);
		cr_expect_eq(fr, 0, "slot 2 never sampled");
	}
}
