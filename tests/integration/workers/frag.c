/*
 * frag - a worker that leaves glibc's heap full of holes: on "frag" it
 * allocates MIB MiB in blocks of BLOCK bytes (touched) and frees every
 * other one, so half the heap is free memory glibc cannot give back (each free
 * block sits between two live ones); on "free" it frees the rest, and
 * glibc, its heap free from top to bottom, gives it back. On "report" it
 * waits WAIT_MS, calls memtally_flush() (which samples glibc's free
 * memory when a sample is due) and prints
 *   "report inuse=U held=H walk_us=W"
 * with mallinfo2()'s in-use bytes (uordblks + hblkhd), what glibc holds
 * from the system (arena + hblkhd) and how long that mallinfo2() took.
 * "frag" and "free" answer "fragmented" and "freed" when done; "churn"
 * allocates and frees 128 KiB 200 times (activity that flushes, and so
 * notices a server that went away) and answers "churned"; "trim" calls
 * malloc_trim(0) (glibc gives the holes' pages back, its own figures
 * unmoved) and answers "trimmed"; "thin" is "frag" keeping one block in 64
 * and answers "thinned". First it
 * prints "ready pid=P".
 * usage: mt_worker frag MIB [BLOCK]
 */
#include "mt_common.h"

#include <malloc.h>
#include <time.h>

#define WAIT_MS 150

static void report(void)
{
	struct timespec ts = {0, WAIT_MS * 1000000L}, t0, t1;
	nanosleep(&ts, NULL);
	mt_flush();
	clock_gettime(CLOCK_MONOTONIC, &t0);
	struct mallinfo2 mi = mallinfo2();
	clock_gettime(CLOCK_MONOTONIC, &t1);
	long us = (t1.tv_sec - t0.tv_sec) * 1000000L +
	          (t1.tv_nsec - t0.tv_nsec) / 1000;
	mt_say("report inuse=%zu held=%zu walk_us=%ld", mi.uordblks + mi.hblkhd,
	       mi.arena + mi.hblkhd, us);
}

static void **blocks;
static size_t n, block;

static void cmd_frag(const char *arg)
{
	(void)arg;
	for (size_t i = 0; i < n; i++) {
		blocks[i] = malloc(block);
		mt_touch(blocks[i], block);
	}
	for (size_t i = 0; i < n; i += 2) {
		free(blocks[i]);
		blocks[i] = NULL;
	}
	mt_say("fragmented");
}

static void cmd_free(const char *arg)
{
	(void)arg;
	for (size_t i = 0; i < n; i++) {
		free(blocks[i]);
		blocks[i] = NULL;
	}
	mt_say("freed");
}

static void cmd_churn(const char *arg)
{
	(void)arg;
	for (int i = 0; i < 200; i++) {
		void *volatile x = malloc(128u << 10);
		mt_touch(x, 128u << 10);
		free(x);
	}
	mt_say("churned");
}

/* As "frag", but every 64th block is kept, the rest freed: long runs of
 * free memory between them, whole pages malloc_trim can give back. */
static void cmd_thin(const char *arg)
{
	(void)arg;
	for (size_t i = 0; i < n; i++) {
		blocks[i] = malloc(block);
		mt_touch(blocks[i], block);
	}
	for (size_t i = 0; i < n; i++)
		if (i % 64) {
			free(blocks[i]);
			blocks[i] = NULL;
		}
	mt_say("thinned");
}

static void cmd_trim(const char *arg)
{
	(void)arg;
	malloc_trim(0);
	mt_say("trimmed");
}

static void cmd_report(const char *arg)
{
	(void)arg;
	report();
}

static int frag_main(int argc, char **argv)
{
	size_t mib = argc > 1 ? strtoul(argv[1], NULL, 10) : 64;
	block = argc > 2 ? strtoul(argv[2], NULL, 10) : 256;
	if (block < 16)
		block = 16;
	n = mib * MIB / block;
	blocks = calloc(n, sizeof(void *));
	if (!blocks)
		return 1;
	mt_ready();
	static const struct mt_cmd cmds[] = {
	    {"frag", cmd_frag},     {"free", cmd_free}, {"churn", cmd_churn},
	    {"report", cmd_report}, {"trim", cmd_trim}, {"thin", cmd_thin},
	    {NULL, NULL},
	};
	int r = mt_serve(cmds, 0);
	free(blocks);
	return r;
}

const struct mt_sub mt_frag = {"frag", "MIB [BLOCK]", frag_main};
