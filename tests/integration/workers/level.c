/*
 * level - hold a level of heap memory that the harness moves up and
 * down, one command at a time, so that every level is seen by the server
 * before the next (the harness waits for it) and nothing depends on timing.
 *   "set N"   hold exactly N MiB in 1 MiB blocks (exactly a jemalloc size
 *             class): allocate or free the newest blocks, flush, print
 *             "at N"
 *   "churn"   malloc and free 64 KiB blocks (each a flush of its own)
 *             until the over-limit callback has run (at once if it ran
 *             already), at most 100000 pairs; print "churned K" (K =
 *             pairs completed before it ran)
 * With MT_LEVEL_CALLBACK=1 it registers an over-limit callback through
 * memtally_on_over_limit() (looked up with dlsym, so it runs unmodified
 * without the preload too), which writes "over-limit K" (K = calls so far)
 * straight to stdout with write(2): no stdio lock, no allocation.
 * usage: mt_worker level [MIB]
 */
#include "mt_common.h"

#include <stdatomic.h>

static atomic_uint calls;

static void on_over_limit(void *arg)
{
	(void)arg;
	unsigned k = atomic_fetch_add(&calls, 1) + 1;
	char line[32];
	int n = snprintf(line, sizeof(line), "over-limit %u\n", k);
	ssize_t w = write(1, line, (size_t)n);
	(void)w;
}

static void cmd_set(const char *arg)
{
	size_t held = mt_hold_level(strtoul(arg, NULL, 10));
	mt_flush(); /* also when the level did not move */
	mt_say("at %zu", held);
}

static void cmd_churn(const char *arg)
{
	(void)arg;
	unsigned long k = 0;
	for (; k < 100000 && atomic_load(&calls) == 0; k++) {
		void *volatile p = malloc(64 << 10);
		free(p);
	}
	mt_say("churned %lu", k);
}

static int level_main(int argc, char **argv)
{
	const char *cb = getenv("MT_LEVEL_CALLBACK");
	if (cb && cb[0] == '1') {
		int (*reg)(void (*)(void *), void *) =
		    (int (*)(void (*)(void *), void *))dlsym(
		        RTLD_DEFAULT, "memtally_on_over_limit");
		if (!reg || reg(on_over_limit, NULL) != 0) {
			mt_say("no memtally_on_over_limit");
			return 1;
		}
	}
	mt_hold_level(argc > 1 ? strtoul(argv[1], NULL, 10) : 0);
	mt_flush();
	mt_ready();
	static const struct mt_cmd cmds[] = {
	    {"set", cmd_set}, {"churn", cmd_churn}, {NULL, NULL}};
	return mt_serve(cmds, 0);
}

const struct mt_sub mt_level = {"level", "[MIB]", level_main};
