/*
 * mt_common.h - helpers for the integration-test workers. These programs
 * run under LD_PRELOAD=libmemtally_preload.so as unmodified programs would:
 * they never link memtally; what they need of it (memtally_flush, to make a
 * count exact at a chosen moment) they look up with dlsym, and they still
 * run when it is absent.
 */
#ifndef MT_COMMON_H
#define MT_COMMON_H

#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define MIB (1024u * 1024u)

/*
 * stdio's buffers are static: stdio would otherwise malloc them at the
 * first printf/fgets, i.e. after the worker's last flush, and jemalloc's
 * activity callback may publish that little drift whenever the thread's
 * next 64 KiB event falls, so an idle worker's figure could still move by
 * a few KiB after "ready". With these, an idle worker allocates nothing.
 */
__attribute__((constructor)) static void mt_static_stdio(void)
{
	static char in[4096], out[4096];
	setvbuf(stdin, in, _IOFBF, sizeof(in));
	setvbuf(stdout, out, _IOFBF, sizeof(out));
}

/* memtally_flush() of the preload, if loaded. */
static inline void mt_flush(void)
{
	int (*f)(void) = (int (*)(void))dlsym(RTLD_DEFAULT, "memtally_flush");
	if (f)
		f();
}

/* Print a line and flush stdout, for the harness to read. */
#define mt_say(...)                                                          \
	do {                                                                 \
		printf(__VA_ARGS__);                                         \
		fputc('\n', stdout);                                         \
		fflush(stdout);                                              \
	} while (0)

/* Block until the harness closes our stdin or writes a line; returns the
 * line (static buffer) or NULL at EOF. */
static inline const char *mt_wait(void)
{
	static char line[256];
	if (!fgets(line, sizeof(line), stdin))
		return NULL;
	line[strcspn(line, "\n")] = 0;
	return line;
}

/* CLOCK_MONOTONIC in seconds, for workers paced by the clock. */
static inline double mt_now_s(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

/* Touch every page so the memory is real, as a worker's would be. */
static inline void mt_touch(void *p, size_t n)
{
	for (size_t i = 0; i < n; i += 4096)
		((volatile char *)p)[i] = 1;
}

#endif
