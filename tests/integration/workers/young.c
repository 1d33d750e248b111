/*
 * young - a small process that allocates at its start and then waits,
 * with no flush of its own: when (and whether) it registers is the
 * preload's decision alone.
 *
 * usage: mt_worker young KIB
 * Holds KIB KiB in 64 KiB blocks (touched), prints "held", then on each
 * line "more KIB" from stdin holds that much more and prints "held"; on
 * "exec KIB" execs itself as "mt_worker young KIB" (same pid, a new image); on
 * "attached" asks the preload's memtally_attached() and prints
 * "attached=0" or "attached=1" ("attached=-1" without a preload).
 */
#include "mt_common.h"

#include <stdbool.h>

#define KIB  1024u
#define STEP (64u * KIB)

static void hold(unsigned long kib)
{
	for (unsigned long done = 0; done < kib * KIB; done += STEP) {
		void *p = malloc(STEP);
		if (!p)
			exit(1);
		mt_touch(p, STEP);
		/* Kept: the block escapes, so the malloc stays. */
		__asm__ volatile("" : : "r"(p) : "memory");
	}
}

static void cmd_more(const char *arg)
{
	hold(strtoul(arg, NULL, 10));
	mt_say("held");
}

static void cmd_attached(const char *arg)
{
	(void)arg;
	bool (*f)(void) =
	    (bool (*)(void))dlsym(RTLD_DEFAULT, "memtally_attached");
	mt_say("attached=%d", f ? (int)f() : -1);
}

static void cmd_exec(const char *arg)
{
	char kib[32];
	snprintf(kib, sizeof(kib), "%lu", strtoul(arg, NULL, 10));
	char *args[] = {"young", kib, NULL};
	mt_exec_self(args);
	exit(3);
}

static int young_main(int argc, char **argv)
{
	if (argc != 2)
		return 2;
	hold(strtoul(argv[1], NULL, 10));
	mt_say("held");
	static const struct mt_cmd cmds[] = {{"more", cmd_more},
	                                     {"attached", cmd_attached},
	                                     {"exec", cmd_exec},
	                                     {NULL, NULL}};
	return mt_serve(cmds, 0);
}

const struct mt_sub mt_young = {"young", "KIB", young_main};
