/*
 * idle - a thread that allocates a large block, goes idle, frees it on
 * command and goes idle again, without any further allocator call of its
 * own: what the process shows meanwhile is only what that thread's single
 * malloc or free published.
 *
 * usage: mt_worker idle MIB
 * Prints "held front=F" once the thread holds MIB MiB (F: the preload's
 * counting front end, or "none"), then on the line "free" from stdin
 * prints "freed" once the thread has freed it; on "poke" the thread makes
 * one small malloc+free and prints "poked".
 */
#include "mt_common.h"

#include <pthread.h>

static size_t mib = 256;
static int to_thread[2], from_thread[2];

static void *idle_thread(void *arg)
{
	(void)arg;
	char c;
	void *p = malloc(mib * MIB);
	/* Escapes, so the compiler cannot drop the malloc/free pair. */
	__asm__ volatile("" : : "r"(p) : "memory");
	if (write(from_thread[1], "h", 1) != 1)
		return NULL;
	/* Idle: blocked in read(), no allocator call. */
	if (read(to_thread[0], &c, 1) != 1)
		return NULL;
	free(p);
	if (write(from_thread[1], "f", 1) != 1)
		return NULL;
	while (read(to_thread[0], &c, 1) == 1) {
		void *q = malloc(16);
		__asm__ volatile("" : : "r"(q) : "memory");
		free(q);
		if (write(from_thread[1], "p", 1) != 1)
			return NULL;
	}
	return NULL;
}

/* Hand the thread one byte, wait for its answer. */
static void ask(const char *what, const char *answer)
{
	char c;
	if (write(to_thread[1], what, 1) != 1 ||
	    read(from_thread[0], &c, 1) != 1)
		exit(1);
	mt_say("%s", answer);
}

static void cmd_free(const char *arg)
{
	(void)arg;
	ask("x", "freed");
}

static void cmd_poke(const char *arg)
{
	(void)arg;
	ask("p", "poked");
}

static int idle_main(int argc, char **argv)
{
	if (argc > 1)
		mib = strtoul(argv[1], NULL, 10);
	if (pipe(to_thread) || pipe(from_thread))
		return 1;
	const char *(*front)(void) = (const char *(*)(void))dlsym(
	    RTLD_DEFAULT, "memtally_preload_front_end");
	pthread_t t;
	char c;
	if (pthread_create(&t, NULL, idle_thread, NULL) ||
	    read(from_thread[0], &c, 1) != 1)
		return 1;
	mt_say("held front=%s", front ? front() : "none");
	static const struct mt_cmd cmds[] = {
	    {"free", cmd_free}, {"poke", cmd_poke}, {NULL, NULL}};
	mt_serve(cmds, 0);
	close(to_thread[1]);
	pthread_join(t, NULL);
	return 0;
}

const struct mt_sub mt_idle = {"idle", "MIB", idle_main};
