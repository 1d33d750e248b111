/*
 * wild - a buggy program: it takes a 256 KiB block (above glibc's mmap
 * threshold, so a mapping of its own under either allocator) and, at "go",
 * writes backwards from the block's start one byte at a time, as an
 * underrunning loop would, until it faults. Without memtally it dies at
 * once with SIGSEGV; memtally must not turn that into writes over other
 * processes' figures.
 *   ORDER "later": memtally attaches first (a flush), the block comes
 *                  after; "first": the block is the program's first
 *                  allocation, so memtally attaches (and maps its slot)
 *                  right after the block was mapped.
 *   prints "ready block=ADDR" once set up; "survived" if the writes ran
 *   the whole distance without a fault.
 * usage: mt_worker wild ORDER [MIB]   (how far to write, default 64)
 */
#include "mt_common.h"

#include <stddef.h>

static int wild_main(int argc, char **argv)
{
	int first = argc > 1 && strcmp(argv[1], "first") == 0;
	size_t mib = argc > 2 ? strtoul(argv[2], NULL, 10) : 64;
	char *block = first ? malloc(256 * 1024) : NULL;
	/* Something to count, then a flush: the client registers and maps
	 * its slot (before the block is taken, in "later"). */
	for (int i = 0; i < 8; i++) {
		void *p = malloc(96 * 1024);
		mt_touch(p, 96 * 1024);
		free(p);
	}
	mt_flush();
	if (!first)
		block = malloc(256 * 1024);
	mt_touch(block, 256 * 1024);
	mt_flush();
	mt_say("ready block=%p", (void *)block);
	const char *cmd = mt_wait();
	if (!cmd || strcmp(cmd, "go") != 0)
		return 0;
	volatile char *p = block;
	for (size_t i = 1; i <= mib * MIB; i++)
		p[-(ptrdiff_t)i] = 0x5a;
	mt_say("survived");
	return 0;
}

const struct mt_sub mt_wild = {"wild", "ORDER [MIB]", wild_main};
