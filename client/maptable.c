/*
 * maptable.c - the set of counted mapped ranges (see maptable.h).
 *
 * Lookups are binary searches; an add or a remove moves the entries after
 * it (memmove), which is cheap next to the mmap or munmap system call it
 * accompanies for the few thousand regions a process maps itself (the
 * kernel allows 65530 mappings per process by default).
 */
#include "maptable.h"

#include <string.h>

/* First index whose range ends after `a` (v[i].hi > a), or n. */
static size_t first_after(const struct mtc_maptable *t, uintptr_t a)
{
	size_t lo = 0, hi = t->n;
	while (lo < hi) {
		size_t mid = lo + (hi - lo) / 2;
		if (t->v[mid].hi > a)
			hi = mid;
		else
			lo = mid + 1;
	}
	return lo;
}

/* First index at or after `from` whose range starts at or after `a`. */
static size_t first_from(const struct mtc_maptable *t, size_t from, uintptr_t a)
{
	size_t lo = from, hi = t->n;
	while (lo < hi) {
		size_t mid = lo + (hi - lo) / 2;
		if (t->v[mid].lo >= a)
			hi = mid;
		else
			lo = mid + 1;
	}
	return lo;
}

static uint64_t overlap(struct mtc_range r, uintptr_t lo, uintptr_t hi)
{
	uintptr_t a = r.lo > lo ? r.lo : lo;
	uintptr_t b = r.hi < hi ? r.hi : hi;
	return b > a ? (uint64_t)(b - a) : 0;
}

static int room(struct mtc_maptable *t, size_t want)
{
	if (want <= t->cap)
		return 0;
	return t->grow ? t->grow(t, want) : -1;
}

/* Replace entries [j0, j1) by the k entries of `with`. The caller made
 * room when k > j1 - j0. */
static void splice(struct mtc_maptable *t, size_t j0, size_t j1,
                   const struct mtc_range *with, size_t k)
{
	size_t tail = t->n - j1;
	memmove(&t->v[j0 + k], &t->v[j1], tail * sizeof(t->v[0]));
	for (size_t i = 0; i < k; i++)
		t->v[j0 + i] = with[i];
	t->n = j0 + k + tail;
}

uint64_t mtc_maptable_remove(struct mtc_maptable *t, uintptr_t lo, uintptr_t hi,
                             struct mtc_range *removed, size_t cap,
                             size_t *nremoved)
{
	if (nremoved)
		*nremoved = 0;
	if (lo >= hi || t->n == 0)
		return 0;
	size_t j0 = first_after(t, lo);
	size_t j1 = first_from(t, j0, hi);
	if (j0 >= j1)
		return 0;
	uint64_t gone = 0;
	for (size_t j = j0; j < j1; j++) {
		uint64_t o = overlap(t->v[j], lo, hi);
		gone += o;
		if (removed && *nremoved < cap && o) {
			struct mtc_range r = t->v[j];
			removed[*nremoved].lo = r.lo > lo ? r.lo : lo;
			removed[*nremoved].hi = r.hi < hi ? r.hi : hi;
			(*nremoved)++;
		}
	}
	struct mtc_range keep[2];
	size_t k = 0;
	if (t->v[j0].lo < lo)
		keep[k++] = (struct mtc_range){t->v[j0].lo, lo};
	if (t->v[j1 - 1].hi > hi)
		keep[k++] = (struct mtc_range){hi, t->v[j1 - 1].hi};
	if (k > j1 - j0 && room(t, t->n + 1) != 0) {
		/* A split with no room for its second half: uncount the
		 * smaller remnant now rather than lose track of it. */
		uint64_t a = keep[0].hi - keep[0].lo;
		uint64_t b = keep[1].hi - keep[1].lo;
		gone += a < b ? a : b;
		if (a < b)
			keep[0] = keep[1];
		k = 1;
	}
	splice(t, j0, j1, keep, k);
	t->total -= gone;
	return gone;
}

uint64_t mtc_maptable_add(struct mtc_maptable *t, uintptr_t lo, uintptr_t hi)
{
	if (lo >= hi)
		return 0;
	/* Whatever of [lo, hi) is still counted is stale: the kernel just
	 * handed the range out again. */
	mtc_maptable_remove(t, lo, hi, NULL, 0, NULL);
	size_t i = first_after(t, lo); /* first range after [lo, hi) */
	int left = i > 0 && t->v[i - 1].hi == lo;
	int right = i < t->n && t->v[i].lo == hi;
	if (left && right) {
		struct mtc_range m = {t->v[i - 1].lo, t->v[i].hi};
		splice(t, i - 1, i + 1, &m, 1);
	} else if (left) {
		t->v[i - 1].hi = hi;
	} else if (right) {
		t->v[i].lo = lo;
	} else {
		if (room(t, t->n + 1) != 0)
			return 0;
		struct mtc_range m = {lo, hi};
		splice(t, i, i, &m, 1);
	}
	t->total += hi - lo;
	return hi - lo;
}

size_t mtc_maptable_pieces(const struct mtc_maptable *t, uintptr_t lo,
                           uintptr_t hi, struct mtc_range *out, size_t cap)
{
	size_t k = 0;
	for (size_t j = first_after(t, lo);
	     j < t->n && t->v[j].lo < hi && k < cap; j++) {
		uintptr_t a = t->v[j].lo > lo ? t->v[j].lo : lo;
		uintptr_t b = t->v[j].hi < hi ? t->v[j].hi : hi;
		out[k++] = (struct mtc_range){a, b};
	}
	return k;
}

uint64_t mtc_maptable_counted(const struct mtc_maptable *t, uintptr_t lo,
                              uintptr_t hi)
{
	uint64_t c = 0;
	for (size_t j = first_after(t, lo); j < t->n && t->v[j].lo < hi; j++)
		c += overlap(t->v[j], lo, hi);
	return c;
}
