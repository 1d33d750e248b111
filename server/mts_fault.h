/*
 * mts_fault.h - a page of a slot table that faults when memtallyd touches
 * it (fault.c).
 *
 * A worker holds its uid's table read-write, so it can punch a hole in
 * it (fallocate, madvise MADV_REMOVE). Reading a hole allocates a page,
 * and under strict overcommit (vm.overcommit_memory = 2) at the commit
 * limit that allocation fails: the reader gets SIGBUS. memtallyd reads
 * every slot at every tick, so one worker could kill it. Instead, a
 * SIGBUS inside a watched table is answered by mapping one of a few spare
 * pages (allocated at start, so mapping one needs no new memory) over the
 * faulting page: the access is made again and goes on, and the registry
 * learns at its next tick which of its slots it can no longer read.
 */
#ifndef MTS_FAULT_H
#define MTS_FAULT_H

#include <stddef.h>
#include <stdint.h>

/* Spare pages: one per faulted page, up to this many at once; past them,
 * the faulted pages share the last one. */
#define MTS_FAULT_SPARES 16u

/* Install the SIGBUS handler and allocate the spares, for at most
 * `max_ranges` watched mappings at once. Once per process: a second call
 * does nothing. 0 or -errno. */
int mts_fault_init(uint32_t max_ranges);

/* Watch [base, base + len) (a slot table's mapping), or stop. Without
 * mts_fault_init (a registry in a unit test) nothing is watched and
 * mts_fault_watch returns 0. -ENOSPC when every range is taken. */
int mts_fault_watch(void *base, size_t len);
void mts_fault_unwatch(void *base);

/* Faulted pages answered so far: a change says "scan". */
uint64_t mts_fault_count(void);

/* Every part of [base, base + len) mapped over by a spare, as found in
 * /proc/self/maps: fn(arg, addr, bytes) per part. 0 or -errno. */
int mts_fault_scan(void *base, size_t len,
                   void (*fn)(void *arg, void *addr, size_t bytes), void *arg);

/* Map page `addr` of a watched mapping back onto its object (fd, at
 * `off`), freeing the spare it had. 0 or -errno (the spare stays). */
int mts_fault_restore(void *addr, int fd, uint64_t off);

/* What the handler does for a faulting address: map a spare over its
 * page. For tests, which cannot make the kernel fail a page of a sealed
 * table. 0 or -errno. */
int mts_fault_replace(void *addr);

#endif /* MTS_FAULT_H */
