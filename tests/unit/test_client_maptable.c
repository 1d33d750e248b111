/*
 * test_client_maptable.c - the set of counted mapped ranges behind the
 * preload's `mapped` figure (client/maptable.c): a region is counted
 * once and uncounted exactly once, whatever pieces it is unmapped in;
 * memory never counted subtracts nothing; a table that cannot grow stays
 * consistent. Checked case by case and against a page bitmap over random
 * operations.
 */
#define _GNU_SOURCE /* rand_r, whichever criterion.h the build uses */
#include <criterion/criterion.h>
#include <stdlib.h>
#include <string.h>

#include "maptable.h"

#define PG 4096u
#define CAP_MAX 4096u

static struct mtc_range store[CAP_MAX];
static size_t grow_limit = CAP_MAX;

static int grow(struct mtc_maptable *t, size_t want)
{
	if (want > grow_limit)
		return -1;
	t->v = store;
	t->cap = grow_limit;
	return 0;
}

static struct mtc_maptable fresh(size_t limit)
{
	grow_limit = limit;
	memset(store, 0, sizeof(store));
	return (struct mtc_maptable){.grow = grow};
}

static uintptr_t pg(uintptr_t n)
{
	return 0x100000000u + n * PG;
}

/* Sorted, disjoint, non-adjacent, and total is their sum. */
static void check_shape(const struct mtc_maptable *t)
{
	uint64_t sum = 0;
	for (size_t i = 0; i < t->n; i++) {
		cr_assert_lt(t->v[i].lo, t->v[i].hi, "entry %zu empty", i);
		if (i)
			cr_assert_gt(t->v[i].lo, t->v[i - 1].hi,
				     "entries %zu, %zu overlap or touch", i - 1,
				     i);
		sum += t->v[i].hi - t->v[i].lo;
	}
	cr_assert_eq(sum, t->total, "total %llu, ranges %llu",
		     (unsigned long long)t->total, (unsigned long long)sum);
}

Test(maptable, whole_region_counted_and_uncounted_once)
{
	struct mtc_maptable t = fresh(CAP_MAX);
	cr_assert_eq(mtc_maptable_add(&t, pg(0), pg(64)), 64 * PG);
	cr_assert_eq(t.total, 64 * PG);
	cr_assert_eq(mtc_maptable_remove(&t, pg(0), pg(64), NULL, 0, NULL),
		     64 * PG);
	cr_assert_eq(t.total, 0);
	cr_assert_eq(mtc_maptable_remove(&t, pg(0), pg(64), NULL, 0, NULL), 0,
		     "a second munmap subtracts nothing");
	check_shape(&t);
}

Test(maptable, partial_unmaps_subtract_their_part)
{
	struct mtc_maptable t = fresh(CAP_MAX);
	mtc_maptable_add(&t, pg(0), pg(100));
	/* Upper half, then a hole in the middle (a split), then a range
	 * reaching past the region's end. */
	cr_assert_eq(mtc_maptable_remove(&t, pg(50), pg(100), NULL, 0, NULL),
		     50 * PG);
	cr_assert_eq(mtc_maptable_remove(&t, pg(10), pg(20), NULL, 0, NULL),
		     10 * PG);
	cr_assert_eq(t.n, 2);
	cr_assert_eq(mtc_maptable_remove(&t, pg(45), pg(500), NULL, 0, NULL),
		     5 * PG);
	cr_assert_eq(t.total, 35 * PG);
	cr_assert_eq(mtc_maptable_counted(&t, pg(0), pg(100)), 35 * PG);
	cr_assert_eq(mtc_maptable_counted(&t, pg(10), pg(20)), 0);
	check_shape(&t);
}

Test(maptable, never_counted_memory_subtracts_nothing)
{
	struct mtc_maptable t = fresh(CAP_MAX);
	mtc_maptable_add(&t, pg(100), pg(110));
	cr_assert_eq(mtc_maptable_remove(&t, pg(0), pg(100), NULL, 0, NULL),
		     0);
	cr_assert_eq(mtc_maptable_remove(&t, pg(110), pg(200), NULL, 0, NULL),
		     0);
	cr_assert_eq(t.total, 10 * PG);
	check_shape(&t);
}

Test(maptable, adjacent_regions_merge_and_unmap_across)
{
	struct mtc_maptable t = fresh(CAP_MAX);
	mtc_maptable_add(&t, pg(0), pg(10));
	mtc_maptable_add(&t, pg(20), pg(30));
	mtc_maptable_add(&t, pg(10), pg(20)); /* fills the gap */
	cr_assert_eq(t.n, 1);
	cr_assert_eq(t.total, 30 * PG);
	struct mtc_range back[4];
	size_t nb;
	cr_assert_eq(mtc_maptable_remove(&t, pg(5), pg(25), back, 4, &nb),
		     20 * PG);
	cr_assert_eq(nb, 1);
	cr_assert_eq(back[0].lo, pg(5));
	cr_assert_eq(back[0].hi, pg(25));
	check_shape(&t);
}

Test(maptable, a_stale_range_is_not_counted_twice)
{
	struct mtc_maptable t = fresh(CAP_MAX);
	mtc_maptable_add(&t, pg(0), pg(10));
	/* The kernel hands out pages 5..15 again: its munmap was not seen. */
	cr_assert_eq(mtc_maptable_add(&t, pg(5), pg(15)), 10 * PG);
	cr_assert_eq(t.total, 15 * PG);
	check_shape(&t);
}

Test(maptable, no_room_keeps_the_total_true)
{
	struct mtc_maptable t = fresh(2);
	mtc_maptable_add(&t, pg(0), pg(10));
	mtc_maptable_add(&t, pg(20), pg(30));
	cr_assert_eq(mtc_maptable_add(&t, pg(40), pg(50)), 0,
		     "no room: not counted");
	cr_assert_eq(mtc_maptable_remove(&t, pg(40), pg(50), NULL, 0, NULL),
		     0, "so not uncounted");
	/* A split with no room: the smaller remnant (1 page) goes now. */
	cr_assert_eq(mtc_maptable_remove(&t, pg(21), pg(22), NULL, 0, NULL),
		     2 * PG);
	cr_assert_eq(t.total, 18 * PG);
	cr_assert_eq(mtc_maptable_counted(&t, pg(22), pg(30)), 8 * PG);
	check_shape(&t);
}

Test(maptable, random_operations_match_a_page_bitmap)
{
	enum { PAGES = 2048, OPS = 20000 };
	static unsigned char bit[PAGES];
	struct mtc_maptable t = fresh(CAP_MAX);
	memset(bit, 0, sizeof(bit));
	unsigned seed = 12345;
	for (int op = 0; op < OPS; op++) {
		uintptr_t a = (uintptr_t)rand_r(&seed) % PAGES;
		uintptr_t n = 1 + (uintptr_t)rand_r(&seed) % 64;
		uintptr_t b = a + n > PAGES ? PAGES : a + n;
		uint64_t want = 0;
		if (rand_r(&seed) % 2) {
			for (uintptr_t i = a; i < b; i++)
				want += !bit[i], bit[i] = 1;
			uint64_t got = mtc_maptable_add(&t, pg(a), pg(b));
			cr_assert_eq(got, (b - a) * PG, "add %zu", (size_t)op);
		} else {
			for (uintptr_t i = a; i < b; i++)
				want += bit[i], bit[i] = 0;
			uint64_t got = mtc_maptable_remove(&t, pg(a), pg(b),
							   NULL, 0, NULL);
			cr_assert_eq(got, want * PG, "remove %zu: %llu != %llu",
				     (size_t)op, (unsigned long long)got,
				     (unsigned long long)(want * PG));
		}
		check_shape(&t);
	}
	uint64_t pages = 0;
	for (int i = 0; i < PAGES; i++)
		pages += bit[i];
	cr_assert_eq(t.total, pages * PG);
}

/* The parts of a range that are in the set, clipped, in order, and handed
 * out `cap` at a time. */
Test(maptable, pieces_are_the_clipped_overlap)
{
	struct mtc_maptable t = fresh(CAP_MAX);
	mtc_maptable_add(&t, pg(0), pg(10));
	mtc_maptable_add(&t, pg(20), pg(30));
	mtc_maptable_add(&t, pg(40), pg(50));
	struct mtc_range out[2];
	cr_assert_eq(mtc_maptable_pieces(&t, pg(5), pg(45), out, 2), 2);
	cr_assert_eq(out[0].lo, pg(5));
	cr_assert_eq(out[0].hi, pg(10));
	cr_assert_eq(out[1].lo, pg(20));
	cr_assert_eq(out[1].hi, pg(30));
	/* Full: the rest from the last one's end. */
	cr_assert_eq(mtc_maptable_pieces(&t, out[1].hi, pg(45), out, 2), 1);
	cr_assert_eq(out[0].lo, pg(40));
	cr_assert_eq(out[0].hi, pg(45));
	cr_assert_eq(mtc_maptable_pieces(&t, pg(10), pg(20), out, 2), 0,
	             "a gap has no pieces");
	cr_assert_eq(mtc_maptable_pieces(&t, pg(60), pg(70), out, 2), 0);
	cr_assert_eq(t.total, 30 * PG, "pieces change nothing");
}
