/*
 * mt_young - a small process that allocates at its start and then waits,
 * with no flush of its own: when (and whether) it registers is the
 * preload's decision alone.
 *
 * usage: mt_young KIB
 * Holds KIB KiB in 64 KiB blocks (touched), prints "held", then on each
 * line "more KIB" from stdin holds that much more and prints "held"; on
 * "exec KIB" execs itself as "mt_young KIB" (same pid, a new image); on
 * "attached" asks the preload's memtally_attached() and prints
 * "attached=0" or "attached=1" ("attached=-1" without a preload); exits
 * at EOF.
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

int main(int argc, char **argv)
{
	if (argc != 2)
		return 2;
	hold(strtoul(argv[1], NULL, 10));
	mt_say("held");
	const char *line;
	while ((line = mt_wait())) {
		unsigned long kib;
		if (sscanf(line, "more %lu", &kib) == 1) {
			hold(kib);
			mt_say("held");
		} else if (strcmp(line, "attached") == 0) {
			bool (*f)(void) = (bool (*)(void))dlsym(
			    RTLD_DEFAULT, "memtally_attached");
			mt_say("attached=%d", f ? (int)f() : -1);
		} else if (sscanf(line, "exec %lu", &kib) == 1) {
			char arg[32];
			snprintf(arg, sizeof(arg), "%lu", kib);
			char *args[] = {argv[0], arg, NULL};
			execv("/proc/self/exe", args);
			return 3;
		}
	}
	return 0;
}
