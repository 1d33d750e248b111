/*
 * mt_idle - a thread that allocates a large block, goes idle, frees it on
 * command and goes idle again, without any further allocator call of its
 * own: what the process shows meanwhile is only what that thread's single
 * malloc or free published.
 *
 * usage: mt_idle MIB
 * Prints "held front=F" once the thread holds MIB MiB (F: the preload's
 * counting front end, or "none"), then on the line "free" from stdin
 * prints "freed" once the thread has freed it; on "poke" the thread makes
 * one small malloc+free and prints "poked"; exits at EOF.
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

int main(int argc, char **argv)
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
	const char *line;
	while ((line = mt_wait())) {
		if (strcmp(line, "free") == 0) {
			if (write(to_thread[1], "x", 1) != 1 ||
			    read(from_thread[0], &c, 1) != 1)
				return 1;
			mt_say("freed");
		} else if (strcmp(line, "poke") == 0) {
			if (write(to_thread[1], "p", 1) != 1 ||
			    read(from_thread[0], &c, 1) != 1)
				return 1;
			mt_say("poked");
		}
	}
	close(to_thread[1]);
	pthread_join(t, NULL);
	return 0;
}
