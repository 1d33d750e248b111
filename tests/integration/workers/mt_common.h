/*
 * mt_common.h - what the subcommands of mt_worker share (mt_worker.c holds
 * it once). The worker runs under LD_PRELOAD=libmemtally_preload.so as an
 * unmodified program would: it never links memtally; what it needs of it
 * (memtally_flush, to make a count exact at a chosen moment) it looks up
 * with dlsym, and it still runs when it is absent.
 *
 * A subcommand is one .c file defining a `struct mt_sub` (listed in
 * mt_worker.c): `mt_worker NAME ARGS...` runs its main with argv[0] = NAME.
 * A subcommand driven over stdin hands its table of commands to mt_serve,
 * which also answers the common commands (mt_worker.c lists them).
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

/* One command of a loop: the line's first word, and its handler, given
 * the rest of the line ("" when there is none). */
struct mt_cmd {
	const char *name;
	void (*run)(const char *arg);
};

/* One subcommand: `mt_worker NAME ARGS...`. */
struct mt_sub {
	const char *name;
	const char *usage; /* its arguments, for mt_worker's usage text */
	int (*main)(int argc, char **argv);
};

/* mt_serve's flags. */
enum {
	MT_FLUSH_FIRST = 1, /* memtally_flush() before every command */
};

/*
 * Read commands from stdin until EOF or "exit" (then return 0): `cmds`
 * (may be NULL, ended by a NULL name) first, then the common commands; an
 * unknown one is answered "error unknown CMD".
 */
int mt_serve(const struct mt_cmd *cmds, unsigned flags);

/* memtally_flush() of the preload, if loaded. */
void mt_flush(void);

/* Print a line and flush stdout, for the harness to read. */
#define mt_say(...)                                                            \
	do {                                                                   \
		printf(__VA_ARGS__);                                           \
		fputc('\n', stdout);                                           \
		fflush(stdout);                                                \
	} while (0)

/* "ready pid=P", the usual first line. */
void mt_ready(void);

/* Block until the harness closes our stdin or writes a line; returns the
 * line (static buffer) or NULL at EOF. */
const char *mt_wait(void);

/* CLOCK_MONOTONIC in seconds, for workers paced by the clock. */
double mt_now_s(void);

/* Touch every page so the memory is real, as a worker's would be. */
void mt_touch(void *p, size_t n);

/* Hold `mib` MiB (at most 8192) in 1 MiB blocks (exactly a jemalloc size
 * class), touched: allocate or free the newest blocks, then flush if the
 * level moved (exit 12 if malloc fails). Returns the MiB held. */
size_t mt_hold_level(double mib);

/* Exec this program again (same pid, a new image) as `mt_worker ARGS...`
 * (args[0]: the subcommand); returns only if execv failed. */
void mt_exec_self(char *const args[]);

/* The region a subcommand maps (map, sparse): "touch O N" writes MiB
 * [O, O+N) of it. */
extern char *mt_region;
extern size_t mt_region_len;

#endif
