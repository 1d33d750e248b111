/*
 * errno - the allocator keeps the program's errno, as free() must (POSIX;
 * glibc since 2.33): a program may free in an error path before it reads
 * errno. Each round sets errno to EPIPE, then mallocs, callocs and
 * reallocs 1 MiB (touched) and frees it: every call passes the 64 KiB
 * publish threshold, so each may publish, register or try to (with no
 * server, a registration fails on its socket calls). errno must still be
 * EPIPE after every call.
 *
 * usage: mt_worker errno ROUNDS
 * Rounds are 5 ms apart. Prints "errno kept over N rounds" and exits 0,
 * or "errno changed to E by OP in round R" and exits 1.
 */
#include "mt_common.h"

#include <errno.h>
#include <time.h>

#define BLOCK (1u << 20)

static int changed(const char *op, unsigned long round)
{
	int e = errno;
	if (e == EPIPE)
		return 0;
	mt_say("errno changed to %d by %s in round %lu", e, op, round);
	return 1;
}

static int errno_main(int argc, char **argv)
{
	if (argc != 2)
		return 2;
	unsigned long rounds = strtoul(argv[1], NULL, 10);
	for (unsigned long r = 0; r < rounds; r++) {
		errno = EPIPE;
		char *p = malloc(BLOCK);
		if (!p || changed("malloc", r))
			return 1;
		mt_touch(p, BLOCK);
		errno = EPIPE;
		free(p);
		if (changed("free", r))
			return 1;
		p = calloc(1, BLOCK);
		if (!p || changed("calloc", r))
			return 1;
		mt_touch(p, BLOCK);
		p = realloc(p, 2 * BLOCK);
		if (!p || changed("realloc", r))
			return 1;
		mt_touch(p, 2 * BLOCK);
		free(p);
		if (changed("free", r))
			return 1;
		/* nanosleep sets errno only when it fails. */
		struct timespec ts = {0, 5000000};
		nanosleep(&ts, NULL);
	}
	mt_say("errno kept over %lu rounds", rounds);
	return 0;
}

const struct mt_sub mt_errno = {"errno", "ROUNDS", errno_main};
