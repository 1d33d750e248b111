/*
 * exec - the exec case. "mt_worker exec BEFORE AFTER": hold BEFORE MiB,
 * print "before pid=P", wait for a line on stdin, then exec itself as
 * "mt_worker exec --after AFTER", which holds AFTER MiB, prints
 * "after pid=P" and serves (mt_serve).
 */
#include "mt_common.h"

static void hold(size_t mib)
{
	for (size_t i = 0; i < mib; i++)
		mt_touch(malloc(MIB), MIB);
	mt_flush();
}

static int exec_main(int argc, char **argv)
{
	if (argc > 2 && strcmp(argv[1], "--after") == 0) {
		hold(strtoul(argv[2], NULL, 10));
		mt_say("after pid=%d", (int)getpid());
		return mt_serve(NULL, 0);
	}
	hold(argc > 1 ? strtoul(argv[1], NULL, 10) : 200);
	mt_say("before pid=%d", (int)getpid());
	mt_wait();
	char *args[] = {argv[0], "--after", argc > 2 ? argv[2] : "50", NULL};
	mt_exec_self(args);
	return 1;
}

const struct mt_sub mt_exec = {"exec", "BEFORE_MIB AFTER_MIB", exec_main};
