/*
 * mt_account - a program linked to libmemtally that counts memory of its
 * own with memtally_account() beside its malloc'd memory, as one run
 * under a preload (memtally run's) does. It mallocs and touches MALLOC
 * MiB, accounts OWN MiB more, flushes and answers "held"; on its next
 * line of stdin it frees the malloc'd MiB, flushes and answers "freed";
 * on the next it exits. usage: mt_account MALLOC OWN
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "memtally.h"

#define MIB (1024 * 1024)

static void wait_line(void)
{
	char line[64];
	if (!fgets(line, sizeof(line), stdin))
		exit(0);
}

int main(int argc, char **argv)
{
	if (argc < 3)
		return 2;
	size_t m = strtoul(argv[1], NULL, 10) * MIB;
	int64_t own = (int64_t)strtoul(argv[2], NULL, 10) * MIB;
	char *p = malloc(m);
	if (!p)
		return 1;
	memset(p, 1, m);
	memtally_account(own);
	memtally_flush();
	printf("held\n");
	fflush(stdout);
	wait_line();
	free(p);
	memtally_flush();
	printf("freed\n");
	fflush(stdout);
	wait_line();
	memtally_account(-own);
	return 0;
}
