/*
 * mt_map - maps anonymous memory itself, as runtimes with their own heaps
 * do, and allocates through malloc, on command (one per stdin line; each
 * answered with "ok ..." once done and flushed):
 *   "map N"        mmap N MiB private anonymous read-write, touch it
 *   "unmap_half"   munmap the upper half of that region
 *   "guard_half"   map the upper half PROT_NONE over itself (kept, not
 *                  counted)
 *   "grow N"       mremap the region to N MiB (may move), touch it
 *   "shared N"     mmap N MiB shared anonymous, touch it (not counted)
 *   "reserve N"    mmap N MiB PROT_NONE (a reservation: not counted)
 *   "commit O N"   mprotect MiB [O, O+N) of the reservation read-write and
 *                  touch them (V8, .NET)
 *   "decommit O N" give those pages back (madvise) and mprotect PROT_NONE
 *   "commit_fixed O N"   mmap(MAP_FIXED) read-write over them, touch
 *                        (HotSpot)
 *   "uncommit_fixed O N" mmap(MAP_FIXED | MAP_NORESERVE) PROT_NONE over them
 *   "protect O N P"  mprotect MiB [O, O+N) of the reservation to P: "rx"
 *                  (read-execute), "ro" (read-only), "none"
 *   "pkey_commit O N"  as commit, through pkey_mprotect (key -1)
 *   "move_resv"    mremap the whole reservation elsewhere (MREMAP_MAYMOVE
 *                  | MREMAP_FIXED to a fresh address): "ok moved", or
 *                  "ok unmoved" where the kernel cannot move it
 *   "unreserve"    munmap the reservation
 *   "protect_ro"   mprotect the region read-only (stays counted)
 *   "unmap"        munmap the region (what is left of it)
 *   "map_lazy N"   mmap N MiB private anonymous read-write, untouched
 *   "touch O N"    touch MiB [O, O+N) of the region
 *   "read O N [huge]"  read a byte of each page of MiB [O, O+N) of the
 *                  region, writing none (untouched pages: the kernel's zero
 *                  page). Small pages (MADV_NOHUGEPAGE), or with "huge"
 *                  transparent huge pages (MADV_HUGEPAGE: the huge zero
 *                  page, where the kernel has it on)
 *   "advise O N A" madvise MiB [O, O+N) of the region (N may run past
 *                  its end) with A: dontneed, free, pageout, remove:
 *                  "ok advised R" (R: madvise's return value)
 *   "unmap_wide O N"  munmap MiB [O, O+N) from the region's start (may
 *                  cover more than the region, or memory already gone)
 *   "flush"        memtally_flush() only (every command flushes first)
 *   "malloc N T"   malloc N MiB in 16 MiB blocks over T threads, touch
 *   "free"         free those blocks
 *   "fork"         fork a child that keeps every mapping, registers and
 *                  prints "child pid=N", then waits for SIGTERM
 *   "exit"
 * usage: mt_map
 */
#include "mt_common.h"

#include <pthread.h>
#include <signal.h>
#include <sys/mman.h>

#define BLOCK (16u * MIB)
#define MAX_BLOCKS 1024

static char *region;
static size_t region_len;
static char *resv;
static size_t resv_len;
static void *blocks[MAX_BLOCKS];
static size_t nblocks;

struct job {
	size_t from, to;
};

static void *alloc_some(void *arg)
{
	struct job *j = arg;
	for (size_t i = j->from; i < j->to; i++) {
		blocks[i] = malloc(BLOCK);
		if (blocks[i])
			mt_touch(blocks[i], BLOCK);
	}
	mt_flush();
	return NULL;
}

static void *free_some(void *arg)
{
	struct job *j = arg;
	for (size_t i = j->from; i < j->to; i++) {
		free(blocks[i]);
		blocks[i] = NULL;
	}
	mt_flush();
	return NULL;
}

static void on_threads(void *(*fn)(void *), size_t n, size_t threads)
{
	pthread_t t[16];
	struct job j[16];
	if (threads < 1 || threads > 16)
		threads = 1;
	for (size_t k = 0; k < threads; k++) {
		j[k].from = n * k / threads;
		j[k].to = n * (k + 1) / threads;
		pthread_create(&t[k], NULL, fn, &j[k]);
	}
	for (size_t k = 0; k < threads; k++)
		pthread_join(t[k], NULL);
}

int main(void)
{
	mt_flush(); /* registered from the start */
	mt_say("ready pid=%d", (int)getpid());
	const char *cmd;
	unsigned long n, t;
	char what[16];
	int k;
	while ((cmd = mt_wait()) && strcmp(cmd, "exit") != 0) {
		mt_flush(); /* stdio's buffers, now allocated */
		if (sscanf(cmd, "map %lu", &n) == 1) {
			char *p = mmap(NULL, n * MIB, PROT_READ | PROT_WRITE,
				       MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
			if (p == MAP_FAILED) {
				mt_say("error mmap");
				continue;
			}
			region = p;
			region_len = n * MIB;
			mt_touch(region, region_len);
			mt_say("ok mapped %p", (void *)region);
		} else if (strcmp(cmd, "guard_half") == 0) {
			/* As unmap_half, but the upper half stays this
			 * process's, inaccessible: a call wider than the
			 * lower half then reaches only its own reservation,
			 * never what the allocator (or a thread it set up)
			 * mapped into a hole meanwhile. */
			size_t half = region_len / 2;
			void *p = mmap(region + half, region_len - half,
			               PROT_NONE,
			               MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED |
			                   MAP_NORESERVE,
			               -1, 0);
			region_len = half;
			mt_say("ok guarded %d", p == MAP_FAILED ? -1 : 0);
		} else if (strcmp(cmd, "unmap_half") == 0) {
			size_t half = region_len / 2;
			int r = munmap(region + half, region_len - half);
			region_len = half;
			mt_say("ok unmapped %d", r);
		} else if (sscanf(cmd, "grow %lu", &n) == 1) {
			void *p = mremap(region, region_len, n * MIB,
					 MREMAP_MAYMOVE);
			if (p == MAP_FAILED) {
				mt_say("error mremap");
				continue;
			}
			region = p;
			region_len = n * MIB;
			mt_touch(region, region_len);
			mt_say("ok grown %p", p);
		} else if (sscanf(cmd, "shared %lu", &n) == 1) {
			char *p = mmap(NULL, n * MIB, PROT_READ | PROT_WRITE,
				       MAP_SHARED | MAP_ANONYMOUS, -1, 0);
			if (p != MAP_FAILED)
				mt_touch(p, n * MIB);
			mt_say("ok shared");
		} else if (sscanf(cmd, "reserve %lu", &n) == 1) {
			void *p = mmap(NULL, n * MIB, PROT_NONE,
				       MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
			if (p != MAP_FAILED) {
				resv = p;
				resv_len = n * MIB;
			}
			mt_say("ok reserved %d", p != MAP_FAILED);
		} else if (sscanf(cmd, "commit %lu %lu", &t, &n) == 2) {
			int r = mprotect(resv + t * MIB, n * MIB,
			                 PROT_READ | PROT_WRITE);
			if (r == 0)
				mt_touch(resv + t * MIB, n * MIB);
			mt_say("%s committed", r == 0 ? "ok" : "error");
		} else if (sscanf(cmd, "decommit %lu %lu", &t, &n) == 2) {
			madvise(resv + t * MIB, n * MIB, MADV_DONTNEED);
			int r = mprotect(resv + t * MIB, n * MIB, PROT_NONE);
			mt_say("%s decommitted", r == 0 ? "ok" : "error");
		} else if (sscanf(cmd, "commit_fixed %lu %lu", &t, &n) == 2) {
			void *p = mmap(
			    resv + t * MIB, n * MIB, PROT_READ | PROT_WRITE,
			    MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED, -1, 0);
			if (p != MAP_FAILED)
				mt_touch(p, n * MIB);
			mt_flush(); /* counted as touched: at the reconcile */
			mt_say("%s committed",
			       p != MAP_FAILED ? "ok" : "error");
		} else if (sscanf(cmd, "uncommit_fixed %lu %lu", &t, &n) == 2) {
			void *p = mmap(resv + t * MIB, n * MIB, PROT_NONE,
			               MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED |
			                   MAP_NORESERVE,
			               -1, 0);
			mt_say("%s uncommitted",
			       p != MAP_FAILED ? "ok" : "error");
		} else if (sscanf(cmd, "protect %lu %lu %15s", &t, &n, what) ==
		           3) {
			int prot = strcmp(what, "rx") == 0
			               ? PROT_READ | PROT_EXEC
			           : strcmp(what, "ro") == 0 ? PROT_READ
			                                     : PROT_NONE;
			int r = mprotect(resv + t * MIB, n * MIB, prot);
			mt_say("%s protected", r == 0 ? "ok" : "error");
		} else if (sscanf(cmd, "pkey_commit %lu %lu", &t, &n) == 2) {
			int r = pkey_mprotect(resv + t * MIB, n * MIB,
			                      PROT_READ | PROT_WRITE, -1);
			if (r == 0)
				mt_touch(resv + t * MIB, n * MIB);
			mt_say("%s committed", r == 0 ? "ok" : "error");
		} else if (strcmp(cmd, "move_resv") == 0) {
			/* A fresh place to move to, then MREMAP_FIXED. */
			void *to = mmap(
			    NULL, resv_len, PROT_NONE,
			    MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
			void *p =
			    to == MAP_FAILED
			        ? MAP_FAILED
			        : mremap(resv, resv_len, resv_len,
			                 MREMAP_MAYMOVE | MREMAP_FIXED, to);
			/* Before Linux 6.17 the kernel moves one mapping at a
			 * time, and a reservation with commits is several:
			 * EFAULT, nothing moved, the figure as it was. */
			if (p != MAP_FAILED)
				resv = p;
			else if (to != MAP_FAILED)
				munmap(to, resv_len);
			mt_say("ok %s", p != MAP_FAILED ? "moved" : "unmoved");
		} else if (strcmp(cmd, "unreserve") == 0) {
			int r = munmap(resv, resv_len);
			resv_len = 0;
			mt_say("%s unreserved", r == 0 ? "ok" : "error");
		} else if (strcmp(cmd, "protect_ro") == 0) {
			int r = mprotect(region, region_len, PROT_READ);
			mt_say("%s protected", r == 0 ? "ok" : "error");
		} else if (strcmp(cmd, "unmap") == 0) {
			int r = munmap(region, region_len);
			region_len = 0;
			mt_say("ok unmapped %d", r);
		} else if (sscanf(cmd, "map_lazy %lu", &n) == 1) {
			char *p = mmap(NULL, n * MIB, PROT_READ | PROT_WRITE,
			               MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
			if (p == MAP_FAILED) {
				mt_say("error mmap");
				continue;
			}
			region = p;
			region_len = n * MIB;
			mt_say("ok mapped %p", (void *)region);
		} else if (sscanf(cmd, "touch %lu %lu", &t, &n) == 2) {
			mt_touch(region + t * MIB, n * MIB);
			mt_say("ok touched");
		} else if ((k = sscanf(cmd, "read %lu %lu %15s", &t, &n, what)) >=
		           2) {
			int huge = k == 3 && strcmp(what, "huge") == 0;
			madvise(region + t * MIB, n * MIB,
			        huge ? MADV_HUGEPAGE : MADV_NOHUGEPAGE);
			unsigned long sum = 0;
			for (size_t i = 0; i < n * MIB; i += 4096)
				sum += ((volatile char *)region)[t * MIB + i];
			mt_say("ok read %lu", sum);
		} else if (sscanf(cmd, "advise %lu %lu %15s", &t, &n, what) ==
		           3) {
			int a = strcmp(what, "free") == 0      ? MADV_FREE
			        : strcmp(what, "pageout") == 0 ? MADV_PAGEOUT
			        : strcmp(what, "remove") == 0  ? MADV_REMOVE
			                                       : MADV_DONTNEED;
			int r = madvise(region + t * MIB, n * MIB, a);
			mt_say("ok advised %d", r);
		} else if (sscanf(cmd, "unmap_wide %lu %lu", &t, &n) == 2) {
			int r = munmap(region + t * MIB, n * MIB);
			mt_say("ok unmapped %d", r);
		} else if (strcmp(cmd, "flush") == 0) {
			mt_say("ok flushed");
		} else if (sscanf(cmd, "malloc %lu %lu", &n, &t) == 2) {
			nblocks = n * MIB / BLOCK;
			if (nblocks > MAX_BLOCKS)
				nblocks = MAX_BLOCKS;
			on_threads(alloc_some, nblocks, t);
			mt_flush();
			mt_say("ok allocated");
		} else if (strcmp(cmd, "fork") == 0) {
			pid_t c = fork();
			if (c == 0) {
				mt_flush(); /* registers as a process of its own */
				mt_say("child pid=%d", (int)getpid());
				for (;;)
					pause();
			}
			mt_say("ok forked %d", (int)c);
		} else if (strcmp(cmd, "free") == 0) {
			on_threads(free_some, nblocks, 2);
			mt_flush();
			mt_say("ok freed");
		} else {
			mt_say("error unknown");
		}
	}
	return 0;
}
