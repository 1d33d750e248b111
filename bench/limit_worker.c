/*
 * limit_worker - a program that takes its heap across a limit in 64 KiB
 * blocks at a moment it reports, for bench/limit_reaction.py. Never
 * linked to memtally: it runs under either preload like any program.
 *
 * Reads one command per line on stdin, answers one line on stdout:
 *   "hold N"   hold N blocks of 64 KiB (malloc'd and touched), then
 *              memtally_flush() (looked up with dlsym): "held N"
 *   "burst K"  malloc K more blocks back to back, each touched:
 *              "burst T0 T1" (CLOCK_MONOTONIC ns before the first malloc
 *              and after the last)
 *   "free"     free every block, memtally_flush(): "freed"
 * It prints "ready ALLOCATOR" first (memtally_preload_allocator(), or
 * "none").
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define BLOCK   (64u << 10)
#define MAX_BLK 65536u

static void *blocks[MAX_BLK];
static unsigned held;

static uint64_t now_ns(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

static void flush(void)
{
	int (*f)(void) = (int (*)(void))dlsym(RTLD_DEFAULT, "memtally_flush");
	if (f)
		f();
}

static void grow(unsigned n)
{
	while (n-- && held < MAX_BLK) {
		char *p = malloc(BLOCK);
		if (!p) {
			perror("malloc");
			exit(1);
		}
		memset(p, 1, BLOCK);
		blocks[held++] = p;
	}
}

int main(void)
{
	const char *(*alloc)(void) = (const char *(*)(void))dlsym(
	    RTLD_DEFAULT, "memtally_preload_allocator");
	setvbuf(stdout, NULL, _IOLBF, 0);
	printf("ready %s\n", alloc ? alloc() : "none");
	char line[128];
	while (fgets(line, sizeof(line), stdin)) {
		unsigned n = 0;
		if (sscanf(line, "hold %u", &n) == 1) {
			while (held > n)
				free(blocks[--held]);
			grow(n - held);
			flush();
			printf("held %u\n", held);
		} else if (sscanf(line, "burst %u", &n) == 1) {
			uint64_t t0 = now_ns();
			grow(n);
			uint64_t t1 = now_ns();
			printf("burst %llu %llu\n", (unsigned long long)t0,
			       (unsigned long long)t1);
		} else if (strncmp(line, "free", 4) == 0) {
			while (held)
				free(blocks[--held]);
			flush();
			printf("freed\n");
		} else {
			break;
		}
	}
	return 0;
}
