/*
 * test_shm_golden_minor.c - the minor versions of layout 2 against their
 * committed images (tests/golden/header-v2.N.bin, table-v2.N.bin), and
 * the promise of a minor version: the reader of the version before still
 * works on the new segment, and this build reads the older images with
 * the new words at 0.
 *
 * One row of `steps` per minor version: the fleet word it added to the
 * header, the words it added to lane 0 of slots, and what the reader of
 * the version before reads there. "A 2.N reader" is written here from
 * 2.N's own rules, with literal offsets (no struct of this build): accept
 * major 2 with compat_minor <= N, read the lanes and the overflow, and
 * from 2.1 on lane 0's mapped word. The new images must give it exactly
 * what the old images gave (but the fleet's bytes, which include the new
 * bytes).
 */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "golden_image.h"
#include "mtshm.h"

#define G_HSIZE   4096u
#define G_TSIZE   2048u
#define G_MAPPED0 (3u * 1048576u) /* slot 0's mapped bytes, from 2.1 */
#define G_MAPPED2 4096u           /* slot 2's */
#define G_FREE    (2u * 1048576u) /* slot 0's allocator free, from 2.2 */
#define G_HEAP0   754096          /* slot 0's heap bytes */
#define G_HEAP2   900             /* slot 2's */

/* The images of 2.0, 2.1 and 2.2. */
static struct {
	unsigned char h[G_HSIZE], t[G_TSIZE];
} img[3];

struct word {
	size_t off;
	uint64_t value;
	const char *what;
};

static const struct step {
	unsigned minor;       /* the new version is 2.minor */
	struct word fleet;    /* the header's new fleet word */
	struct word lane0[3]; /* the table's new words (what 0: no more) */
	int64_t old_total[3]; /* what the 2.(minor-1) reader reads, slots 0-2 */
} steps[] = {
    {1,
     {128 + 80, G_MAPPED0 + G_MAPPED2, "fleet.mapped"},
     {{64 + 24, G_MAPPED0, "slot 0 mapped"},
      {1024 + 64 + 24, G_MAPPED2, "slot 2 mapped"}},
     {G_HEAP0, -1, G_HEAP2}},
    {2,
     {128 + 88, G_FREE, "fleet.allocator_free"},
     {{64 + 32, 4, "slot 0 free_seq"},
      {64 + 40, G_FREE, "slot 0 free_bytes"},
      {64 + 48, G_HEAP0, "slot 0 free_heap"}},
     {G_HEAP0 + G_MAPPED0, -1, G_HEAP2 + G_MAPPED2}},
};

static void load(const char *what, unsigned minor, unsigned char *buf,
                 size_t size)
{
	char path[512];
	snprintf(path, sizeof(path), "%s/%s-v2.%u.bin", MEMTALLY_GOLDEN_DIR,
	         what, minor);
	golden_load(path, buf, size);
}

static void load_all(void)
{
	for (unsigned m = 0; m < 3; m++) {
		load("header", m, img[m].h, G_HSIZE);
		load("table", m, img[m].t, G_TSIZE);
	}
}

TestSuite(golden_minor, .init = load_all);

/* 2.`minor`'s acceptance rule, as a build of that version applies it. */
static int old_reader_accepts(unsigned minor, const unsigned char *h)
{
	return golden_le(h, 0, 8) == UINT64_C(0x594c4c41544d454d) &&
	       golden_le(h, 8, 2) == 2 && golden_le(h, 12, 2) <= minor &&
	       golden_le(h, 16, 4) == 4096;
}

/* 2.`minor`'s process total: lanes [0, lanes_used) at 128k + 64 + 8,
 * overflow at 56, and from 2.1 on lane 0's mapped word at 64 + 24, for
 * slot i of stride 512 and 4 lanes. */
static int64_t old_reader_total(unsigned minor, const unsigned char *t,
                                uint32_t i)
{
	size_t s = (size_t)i * 512;
	uint64_t used = golden_le(t, s + 52, 4);
	if (used > 4)
		used = 4;
	uint64_t sum = golden_le(t, s + 56, 8);
	for (uint64_t k = 0; k < used; k++)
		sum += golden_le(t, s + 128 * k + 64 + 8, 8);
	if (minor >= 1)
		sum += golden_le(t, s + 64 + 24, 8);
	return (int64_t)sum;
}

static int in_word(size_t off, const struct word *w)
{
	return w->what && off >= w->off && off < w->off + 8;
}

Test(golden_minor, header_is_the_previous_plus_the_new_words)
{
	for (size_t i = 0; i < sizeof(steps) / sizeof(steps[0]); i++) {
		const struct step *st = &steps[i];
		const unsigned char *new = img[st->minor].h;
		const unsigned char *old = img[st->minor - 1].h;
		cr_expect_eq(golden_le(new, 10, 2), st->minor,
		             "2.%u version_minor", st->minor);
		cr_expect_eq(golden_le(new, 12, 2), 0,
		             "2.%u compat_minor: 2.0 readers accepted",
		             st->minor);
		cr_expect_eq(golden_le(new, st->fleet.off, 8), st->fleet.value,
		             "2.%u %s", st->minor, st->fleet.what);
		cr_expect_eq(golden_le(new, 128 + 8, 8),
		             golden_le(old, 128 + 8, 8) + st->fleet.value,
		             "2.%u fleet bytes include %s", st->minor,
		             st->fleet.what);
		for (size_t off = 0; off < G_HSIZE; off++) {
			if (off == 10 || (off >= 136 && off < 144) ||
			    in_word(off, &st->fleet))
				continue;
			cr_expect_eq(new[off], old[off],
			             "2.%u: byte %zu differs from 2.%u",
			             st->minor, off, st->minor - 1);
		}
	}
}

Test(golden_minor, table_is_the_previous_plus_lane_0_words)
{
	for (size_t i = 0; i < sizeof(steps) / sizeof(steps[0]); i++) {
		const struct step *st = &steps[i];
		const unsigned char *new = img[st->minor].t;
		const unsigned char *old = img[st->minor - 1].t;
		for (int w = 0; w < 3 && st->lane0[w].what; w++)
			cr_expect_eq(golden_le(new, st->lane0[w].off, 8),
			             st->lane0[w].value, "2.%u %s", st->minor,
			             st->lane0[w].what);
		for (size_t off = 0; off < G_TSIZE; off++) {
			if (in_word(off, &st->lane0[0]) ||
			    in_word(off, &st->lane0[1]) ||
			    in_word(off, &st->lane0[2]))
				continue;
			cr_expect_eq(new[off], old[off],
			             "2.%u: byte %zu differs from 2.%u",
			             st->minor, off, st->minor - 1);
		}
	}
}

Test(golden_minor, the_previous_reader_still_works)
{
	for (size_t i = 0; i < sizeof(steps) / sizeof(steps[0]); i++) {
		const struct step *st = &steps[i];
		unsigned was = st->minor - 1;
		cr_expect(old_reader_accepts(was, img[was].h), "2.%u", was);
		cr_expect(old_reader_accepts(was, img[st->minor].h),
		          "2.%u refuses 2.%u", was, st->minor);
		for (uint32_t s = 0; s < 3; s++) {
			int64_t got =
			    old_reader_total(was, img[st->minor].t, s);
			cr_expect_eq(got, old_reader_total(was, img[was].t, s),
			             "2.%u reader, slot %u", was, s);
			if (st->old_total[s] >= 0)
				cr_expect_eq(got, st->old_total[s],
				             "2.%u reader, slot %u", was, s);
		}
	}
}

/* 2.1: this build reads the mapped bytes of 2.1, and 0 from 2.0. */
Test(golden_minor, this_build_reads_2_0_and_2_1)
{
	static unsigned char h[G_HSIZE] __attribute__((aligned(4096)));
	static unsigned char t[G_TSIZE] __attribute__((aligned(4096)));
	struct mtshm_layout l;
	struct mtshm_fleet f;
	const unsigned char *hs[2] = {img[0].h, img[1].h};
	const unsigned char *ts[2] = {img[0].t, img[1].t};
	const uint64_t mapped0[2] = {0, 3 * 1048576};
	const uint64_t mapped2[2] = {0, 4096};
	for (int v = 0; v < 2; v++) {
		memcpy(h, hs[v], G_HSIZE);
		memcpy(t, ts[v], G_TSIZE);
		cr_assert_eq(mtshm_layout_read(h, G_HSIZE, &l), 0, "2.%d", v);
		cr_assert_eq(mtshm_fleet_read((struct mtshm_header *)h, &f), 0);
		cr_expect_eq(f.mapped, mapped0[v] + mapped2[v], "2.%d fleet",
		             v);
		int absurd;
		uint64_t flushes;
		struct mtshm_slot_id *s0 = mtshm_slot(&l, t, 0);
		struct mtshm_slot_id *s2 = mtshm_slot(&l, t, 2);
		cr_expect_eq(mtshm_slot_mapped(s0, &absurd), mapped0[v]);
		cr_expect_not(absurd);
		cr_expect_eq(mtshm_slot_mapped(s2, &absurd), mapped2[v]);
		cr_expect_eq(
		    mtshm_slot_sum(s0, l.lane_count, &flushes, &absurd), 754096,
		    "heap of slot 0 without its mapped bytes");
	}
}

Test(golden_minor, negative_or_absurd_mapped_is_refused)
{
	static unsigned char t[G_TSIZE] __attribute__((aligned(4096)));
	struct mtshm_layout l;
	cr_assert_eq(mtshm_layout_read(img[1].h, G_HSIZE, &l), 0);
	memcpy(t, img[1].t, G_TSIZE);
	struct mtshm_slot_id *s0 = mtshm_slot(&l, t, 0);
	int absurd;
	mtshm_lane(s0, 0)->mapped = -4096;
	cr_expect_eq(mtshm_slot_mapped(s0, &absurd), 0);
	cr_expect(absurd, "negative mapped");
	mtshm_lane(s0, 0)->mapped = MTSHM_ABSURD_BYTES + 1;
	mtshm_slot_mapped(s0, &absurd);
	cr_expect(absurd, "beyond 1 PiB");
}

/* 2.2: this build reads the free bytes of 2.2, and none from 2.1. */
Test(golden_minor, this_build_reads_2_1_and_2_2)
{
	static unsigned char h[G_HSIZE] __attribute__((aligned(4096)));
	static unsigned char t[G_TSIZE] __attribute__((aligned(4096)));
	struct mtshm_layout l;
	struct mtshm_fleet f;
	const unsigned char *hs[2] = {img[1].h, img[2].h};
	const unsigned char *ts[2] = {img[1].t, img[2].t};
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
