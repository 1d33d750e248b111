/*
 * maptable.h - the set of address ranges a process has counted as mapped.
 *
 * A sorted array of disjoint, non-adjacent half-open ranges [lo, hi) of
 * page-aligned addresses, and the number of bytes they cover. Counting a
 * region adds its range; unmapping (all of a region or a part of it)
 * removes exactly the part of the range that is in the set, so a region is
 * counted once and uncounted once whatever pieces it is unmapped in, and
 * an unmap of memory that was never counted (the allocator's, a file
 * mapping) subtracts nothing. Adding a range that overlaps the set (the
 * kernel handed out an address we still held: a region whose munmap we
 * did not see) first drops the overlap, so a stale entry cannot be
 * counted twice.
 *
 * Not thread-safe: the caller holds its lock. Never allocates: the array
 * lives in memory the caller hands over through `grow`, which may fail;
 * then an add is not counted (and so will not be uncounted), and a split
 * that finds no room uncounts the smaller piece early. Both keep the
 * invariant total == sum of ranges.
 */
#ifndef MEMTALLY_MAPTABLE_H
#define MEMTALLY_MAPTABLE_H

#include <stddef.h>
#include <stdint.h>

struct mtc_range {
	uintptr_t lo, hi; /* [lo, hi), page-aligned, lo < hi */
};

struct mtc_maptable {
	struct mtc_range *v;
	size_t n, cap;
	uint64_t total; /* bytes covered by v[0..n) */
	/* Give the table room for at least `want` entries (moving v[0..n)
	 * if needed) and set v and cap; 0 or -errno. */
	int (*grow)(struct mtc_maptable *t, size_t want);
};

/* Count [lo, hi). Returns the bytes added (0 when there was no room). */
uint64_t mtc_maptable_add(struct mtc_maptable *t, uintptr_t lo, uintptr_t hi);

/* Uncount whatever part of [lo, hi) is counted. Returns the bytes removed.
 * When `removed` is not NULL, up to `cap` removed ranges are written
 * there and *nremoved set (so a failed operation can put them back). */
uint64_t mtc_maptable_remove(struct mtc_maptable *t, uintptr_t lo,
			     uintptr_t hi, struct mtc_range *removed,
			     size_t cap, size_t *nremoved);

/* The parts of [lo, hi) in the set, in address order, clipped to [lo, hi):
 * at most `cap` written to `out`; returns how many. When that is `cap`,
 * more may follow: ask again from out[cap - 1].hi. */
size_t mtc_maptable_pieces(const struct mtc_maptable *t, uintptr_t lo,
                           uintptr_t hi, struct mtc_range *out, size_t cap);

/* Bytes of [lo, hi) that are counted. */
uint64_t mtc_maptable_counted(const struct mtc_maptable *t, uintptr_t lo,
			      uintptr_t hi);

#endif /* MEMTALLY_MAPTABLE_H */
