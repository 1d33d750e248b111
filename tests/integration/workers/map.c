/*
 * map - maps anonymous memory itself, as runtimes with their own heaps
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
 *   "touch O N"    touch MiB [O, O+N) of the region (mt_worker.c)
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
 *   "flush", "malloc N T", "free": mt_worker.c's (every command flushes
 *                  first)
 *   "fork [H]"     fork a child that keeps every mapping (and allocates H
 *                  MiB of heap), registers and prints "child pid=N", then
 *                  waits for SIGTERM
 *   "fork_advice A"  madvise the whole region with A: dontfork (a fork's
 *                  child does not get it) or dofork: "ok fork_advice R"
 * usage: mt_worker map
 */
#include "mt_common.h"

#include <signal.h>
#include <stdbool.h>
#include <sys/mman.h>

static char *resv;
static size_t resv_len;

/* Two numbers, O and N, of a command's argument. */
static int two(const char *arg, unsigned long *t, unsigned long *n)
{
	if (sscanf(arg, "%lu %lu", t, n) == 2)
		return 1;
	mt_say("error usage");
	return 0;
}

static int one(const char *arg, unsigned long *n)
{
	if (sscanf(arg, "%lu", n) == 1)
		return 1;
	mt_say("error usage");
	return 0;
}

/* The region: N MiB private anonymous read-write, untouched; false (and
 * the error said) when it cannot be made. */
static bool map_region(const char *arg)
{
	unsigned long n;
	if (!one(arg, &n))
		return false;
	char *p = mmap(NULL, n * MIB, PROT_READ | PROT_WRITE,
	               MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (p == MAP_FAILED) {
		mt_say("error mmap");
		return false;
	}
	mt_region = p;
	mt_region_len = n * MIB;
	return true;
}

static void cmd_map(const char *arg)
{
	if (!map_region(arg))
		return;
	mt_touch(mt_region, mt_region_len);
	mt_say("ok mapped %p", (void *)mt_region);
}

static void cmd_guard_half(const char *arg)
{
	(void)arg;
	/* As unmap_half, but the upper half stays this process's,
	 * inaccessible: a call wider than the lower half then reaches only
	 * its own reservation, never what the allocator (or a thread it set
	 * up) mapped into a hole meanwhile. */
	size_t half = mt_region_len / 2;
	void *p = mmap(mt_region + half, mt_region_len - half, PROT_NONE,
	               MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED | MAP_NORESERVE,
	               -1, 0);
	mt_region_len = half;
	mt_say("ok guarded %d", p == MAP_FAILED ? -1 : 0);
}

static void cmd_unmap_half(const char *arg)
{
	(void)arg;
	size_t half = mt_region_len / 2;
	int r = munmap(mt_region + half, mt_region_len - half);
	mt_region_len = half;
	mt_say("ok unmapped %d", r);
}

static void cmd_grow(const char *arg)
{
	unsigned long n;
	if (!one(arg, &n))
		return;
	void *p = mremap(mt_region, mt_region_len, n * MIB, MREMAP_MAYMOVE);
	if (p == MAP_FAILED) {
		mt_say("error mremap");
		return;
	}
	mt_region = p;
	mt_region_len = n * MIB;
	mt_touch(mt_region, mt_region_len);
	mt_say("ok grown %p", p);
}

static void cmd_shared(const char *arg)
{
	unsigned long n;
	if (!one(arg, &n))
		return;
	char *p = mmap(NULL, n * MIB, PROT_READ | PROT_WRITE,
	               MAP_SHARED | MAP_ANONYMOUS, -1, 0);
	if (p != MAP_FAILED)
		mt_touch(p, n * MIB);
	mt_say("ok shared");
}

static void cmd_reserve(const char *arg)
{
	unsigned long n;
	if (!one(arg, &n))
		return;
	void *p =
	    mmap(NULL, n * MIB, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (p != MAP_FAILED) {
		resv = p;
		resv_len = n * MIB;
	}
	mt_say("ok reserved %d", p != MAP_FAILED);
}

static void cmd_commit(const char *arg)
{
	unsigned long t, n;
	if (!two(arg, &t, &n))
		return;
	int r = mprotect(resv + t * MIB, n * MIB, PROT_READ | PROT_WRITE);
	if (r == 0)
		mt_touch(resv + t * MIB, n * MIB);
	mt_say("%s committed", r == 0 ? "ok" : "error");
}

static void cmd_decommit(const char *arg)
{
	unsigned long t, n;
	if (!two(arg, &t, &n))
		return;
	madvise(resv + t * MIB, n * MIB, MADV_DONTNEED);
	int r = mprotect(resv + t * MIB, n * MIB, PROT_NONE);
	mt_say("%s decommitted", r == 0 ? "ok" : "error");
}

static void cmd_commit_fixed(const char *arg)
{
	unsigned long t, n;
	if (!two(arg, &t, &n))
		return;
	void *p = mmap(resv + t * MIB, n * MIB, PROT_READ | PROT_WRITE,
	               MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED, -1, 0);
	if (p != MAP_FAILED)
		mt_touch(p, n * MIB);
	mt_flush(); /* counted as touched: at the reconcile */
	mt_say("%s committed", p != MAP_FAILED ? "ok" : "error");
}

static void cmd_uncommit_fixed(const char *arg)
{
	unsigned long t, n;
	if (!two(arg, &t, &n))
		return;
	void *p = mmap(resv + t * MIB, n * MIB, PROT_NONE,
	               MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED | MAP_NORESERVE,
	               -1, 0);
	mt_say("%s uncommitted", p != MAP_FAILED ? "ok" : "error");
}

static void cmd_protect(const char *arg)
{
	unsigned long t, n;
	char what[16];
	if (sscanf(arg, "%lu %lu %15s", &t, &n, what) != 3) {
		mt_say("error usage");
		return;
	}
	int prot = strcmp(what, "rx") == 0   ? PROT_READ | PROT_EXEC
	           : strcmp(what, "ro") == 0 ? PROT_READ
	                                     : PROT_NONE;
	int r = mprotect(resv + t * MIB, n * MIB, prot);
	mt_say("%s protected", r == 0 ? "ok" : "error");
}

static void cmd_pkey_commit(const char *arg)
{
	unsigned long t, n;
	if (!two(arg, &t, &n))
		return;
	int r =
	    pkey_mprotect(resv + t * MIB, n * MIB, PROT_READ | PROT_WRITE, -1);
	if (r == 0)
		mt_touch(resv + t * MIB, n * MIB);
	mt_say("%s committed", r == 0 ? "ok" : "error");
}

static void cmd_move_resv(const char *arg)
{
	(void)arg;
	/* A fresh place to move to, then MREMAP_FIXED. */
	void *to = mmap(NULL, resv_len, PROT_NONE,
	                MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
	void *p = to == MAP_FAILED ? MAP_FAILED
	                           : mremap(resv, resv_len, resv_len,
	                                    MREMAP_MAYMOVE | MREMAP_FIXED, to);
	/* Before Linux 6.17 the kernel moves one mapping at a time, and a
	 * reservation with commits is several: EFAULT, nothing moved, the
	 * figure as it was. */
	if (p != MAP_FAILED)
		resv = p;
	else if (to != MAP_FAILED)
		munmap(to, resv_len);
	mt_say("ok %s", p != MAP_FAILED ? "moved" : "unmoved");
}

static void cmd_unreserve(const char *arg)
{
	(void)arg;
	int r = munmap(resv, resv_len);
	resv_len = 0;
	mt_say("%s unreserved", r == 0 ? "ok" : "error");
}

static void cmd_protect_ro(const char *arg)
{
	(void)arg;
	int r = mprotect(mt_region, mt_region_len, PROT_READ);
	mt_say("%s protected", r == 0 ? "ok" : "error");
}

static void cmd_unmap(const char *arg)
{
	(void)arg;
	int r = munmap(mt_region, mt_region_len);
	mt_region_len = 0;
	mt_say("ok unmapped %d", r);
}

static void cmd_map_lazy(const char *arg)
{
	if (map_region(arg))
		mt_say("ok mapped %p", (void *)mt_region);
}

static void cmd_read(const char *arg)
{
	unsigned long t, n;
	char what[16];
	int k = sscanf(arg, "%lu %lu %15s", &t, &n, what);
	if (k < 2) {
		mt_say("error usage");
		return;
	}
	int huge = k == 3 && strcmp(what, "huge") == 0;
	madvise(mt_region + t * MIB, n * MIB,
	        huge ? MADV_HUGEPAGE : MADV_NOHUGEPAGE);
	unsigned long sum = 0;
	for (size_t i = 0; i < n * MIB; i += 4096)
		sum += ((volatile char *)mt_region)[t * MIB + i];
	mt_say("ok read %lu", sum);
}

static void cmd_advise(const char *arg)
{
	unsigned long t, n;
	char what[16];
	if (sscanf(arg, "%lu %lu %15s", &t, &n, what) != 3) {
		mt_say("error usage");
		return;
	}
	int a = strcmp(what, "free") == 0      ? MADV_FREE
	        : strcmp(what, "pageout") == 0 ? MADV_PAGEOUT
	        : strcmp(what, "remove") == 0  ? MADV_REMOVE
	                                       : MADV_DONTNEED;
	int r = madvise(mt_region + t * MIB, n * MIB, a);
	mt_say("ok advised %d", r);
}

static void cmd_unmap_wide(const char *arg)
{
	unsigned long t, n;
	if (!two(arg, &t, &n))
		return;
	int r = munmap(mt_region + t * MIB, n * MIB);
	mt_say("ok unmapped %d", r);
}

static void cmd_fork(const char *arg)
{
	unsigned long heap = strtoul(arg, NULL, 10);
	pid_t c = fork();
	if (c == 0) {
		if (heap)
			mt_touch(malloc(heap * MIB), heap * MIB);
		mt_flush(); /* registers as a process of its own */
		mt_say("child pid=%d", (int)getpid());
		for (;;)
			pause();
	}
	mt_say("ok forked %d", (int)c);
}

static void cmd_fork_advice(const char *arg)
{
	int advice = strcmp(arg, "dontfork") == 0 ? MADV_DONTFORK
	             : strcmp(arg, "dofork") == 0 ? MADV_DOFORK
	                                          : -1;
	if (advice < 0 || !mt_region) {
		mt_say("error usage");
		return;
	}
	int r = madvise(mt_region, mt_region_len, advice);
	mt_say("ok fork_advice %d", r);
}

static int map_main(int argc, char **argv)
{
	(void)argc, (void)argv;
	mt_flush(); /* registered from the start */
	mt_ready();
	static const struct mt_cmd cmds[] = {
	    {"map", cmd_map},
	    {"guard_half", cmd_guard_half},
	    {"unmap_half", cmd_unmap_half},
	    {"grow", cmd_grow},
	    {"shared", cmd_shared},
	    {"reserve", cmd_reserve},
	    {"commit", cmd_commit},
	    {"decommit", cmd_decommit},
	    {"commit_fixed", cmd_commit_fixed},
	    {"uncommit_fixed", cmd_uncommit_fixed},
	    {"protect", cmd_protect},
	    {"pkey_commit", cmd_pkey_commit},
	    {"move_resv", cmd_move_resv},
	    {"unreserve", cmd_unreserve},
	    {"protect_ro", cmd_protect_ro},
	    {"unmap", cmd_unmap},
	    {"map_lazy", cmd_map_lazy},
	    {"read", cmd_read},
	    {"advise", cmd_advise},
	    {"unmap_wide", cmd_unmap_wide},
	    {"fork", cmd_fork},
	    {"fork_advice", cmd_fork_advice},
	    {NULL, NULL},
	};
	/* The first flush of each command: stdio's buffers, now allocated. */
	return mt_serve(cmds, MT_FLUSH_FIRST);
}

const struct mt_sub mt_map = {"map", "", map_main};
