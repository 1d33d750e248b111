/*
 * thrd - hold MIB mebibytes, allocated by a thread made with C11's
 * thrd_create (which glibc starts without its exported pthread_create),
 * print "ready pid=P" and serve. The thread asks memtally nothing: what it
 * holds is counted only if the thread was set up when it started.
 * usage: mt_worker thrd MIB
 */
#include "mt_common.h"

#include <threads.h>

static size_t mib;
static void **blocks;

static int hold(void *arg)
{
	(void)arg;
	for (size_t i = 0; i < mib; i++) {
		blocks[i] = malloc(MIB);
		mt_touch(blocks[i], MIB);
	}
	return 0;
}

static int thrd_main(int argc, char **argv)
{
	mib = argc > 1 ? strtoul(argv[1], NULL, 10) : 32;
	blocks = calloc(mib + 1, sizeof(void *));
	thrd_t t;
	if (thrd_create(&t, hold, NULL) != thrd_success)
		return 1;
	thrd_join(t, NULL);
	mt_flush();
	mt_ready();
	static const struct mt_cmd cmds[] = {{NULL, NULL}};
	return mt_serve(cmds, 0);
}

const struct mt_sub mt_thrd = {"thrd", "MIB", thrd_main};
