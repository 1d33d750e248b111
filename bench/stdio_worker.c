/*
 * stdio_worker.c - a single-threaded program that allocates and then
 * reads a file with getc(): what a process pays when it stops being
 * single-threaded (bench/stdio_cost.py).
 *
 * Holds MIB MiB in 1 MiB blocks (touched, never freed until exit), then
 * reads FILE byte by byte with getc() and prints one line:
 *   threads=T ns=N sum=S pid=P
 * T is its thread count (/proc/self/task) after the loop, N the loop's
 * CLOCK_MONOTONIC time, S the bytes' sum (so the loop is not optimised
 * away). Then it waits for a line on stdin, so that the driver can ask
 * memtallyd whether it was counted, and exits.
 *
 * It is not linked to memtally: the preload under test is LD_PRELOADed.
 * usage: bench_stdio_worker MIB FILE
 */
#define _GNU_SOURCE
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static int thread_count(void)
{
	DIR *d = opendir("/proc/self/task");
	if (!d)
		return -1;
	int n = 0;
	struct dirent *e;
	while ((e = readdir(d)))
		n += e->d_name[0] != '.';
	closedir(d);
	return n;
}

static unsigned long long now_ns(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (unsigned long long)ts.tv_sec * 1000000000ull +
	       (unsigned long long)ts.tv_nsec;
}

int main(int argc, char **argv)
{
	if (argc != 3) {
		fprintf(stderr, "usage: bench_stdio_worker MIB FILE\n");
		return 2;
	}
	size_t mib = strtoul(argv[1], NULL, 10);
	/* volatile: the blocks are really allocated and touched. */
	char *volatile *blocks = calloc(mib + 1, sizeof(char *));
	for (size_t i = 0; i < mib; i++) {
		blocks[i] = malloc(1u << 20);
		memset(blocks[i], (int)i, 1u << 20);
	}
	/* A moment for a refresh thread to start, as it would in a real
	 * program between its allocations and its work. */
	usleep(50000);
	FILE *f = fopen(argv[2], "r");
	if (!f) {
		perror(argv[2]);
		return 1;
	}
	unsigned long long t0 = now_ns();
	long sum = 0;
	int c;
	while ((c = getc(f)) != EOF)
		sum += c;
	unsigned long long t1 = now_ns();
	fclose(f);
	printf("threads=%d ns=%llu sum=%ld pid=%d\n", thread_count(), t1 - t0,
	       sum, (int)getpid());
	fflush(stdout);
	char line[16];
	if (!fgets(line, sizeof(line), stdin))
		return 0;
	return 0;
}
