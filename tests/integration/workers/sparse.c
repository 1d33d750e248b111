/*
 * sparse - a single-threaded program that maps more than it touches and
 * then waits, with no flush of its own and no allocator or mapping call
 * while it waits (blocked in read(2)): what it shows meanwhile is up to
 * the preload's own bookkeeping and memtallyd.
 *
 * Commands, one per stdin line, each answered "ok" once done:
 *   "map N"        mmap N MiB private anonymous read-write, untouched
 *   "touch O N"    write MiB [O, O+N) of it, no system call (mt_worker.c:
 *                  "ok touched")
 *   "dontneed O N" madvise(MADV_DONTNEED) MiB [O, O+N) of it
 *   "poke"         one 1 MiB malloc, written, and its free (an allocator
 *                  call that publishes)
 * usage: mt_worker sparse; prints "ready pid=N" first.
 */
#include "mt_common.h"

#include <sys/mman.h>

static void cmd_map(const char *arg)
{
	unsigned long n = strtoul(arg, NULL, 10);
	mt_region = mmap(NULL, n * MIB, PROT_READ | PROT_WRITE,
	                 MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (mt_region == MAP_FAILED)
		exit(1);
	mt_region_len = n * MIB;
	mt_say("ok");
}

static void cmd_dontneed(const char *arg)
{
	unsigned long o, n;
	if (sscanf(arg, "%lu %lu", &o, &n) != 2 ||
	    madvise(mt_region + o * MIB, n * MIB, MADV_DONTNEED))
		exit(1);
	mt_say("ok");
}

static void cmd_poke(const char *arg)
{
	(void)arg;
	char *p = malloc(MIB);
	if (!p)
		exit(1);
	mt_touch(p, MIB);
	/* Escapes: the compiler keeps the pair. */
	__asm__ volatile("" : : "r"(p) : "memory");
	free(p);
	mt_say("ok");
}

static int sparse_main(int argc, char **argv)
{
	(void)argc, (void)argv;
	mt_ready();
	static const struct mt_cmd cmds[] = {{"map", cmd_map},
	                                     {"dontneed", cmd_dontneed},
	                                     {"poke", cmd_poke},
	                                     {NULL, NULL}};
	return mt_serve(cmds, 0);
}

const struct mt_sub mt_sparse = {"sparse", "", sparse_main};
