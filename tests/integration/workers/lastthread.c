/*
 * lastthread - the program's main thread calls pthread_exit(); the process
 * ends (exit status 0) when its other thread, which allocates and frees
 * 2,000 blocks of 64 KiB three times 300 ms apart, returns: glibc ends a
 * process as its last thread ends.
 *
 * usage: mt_worker lastthread
 * Prints "cleanup ok" once a thread ended by pthread_exit() ran its
 * cleanup handler and was joined with its value, then "done" from the
 * other thread; the process must then end on its own, with status 0.
 */
#include "mt_common.h"

#include <pthread.h>

static void *churn(void *arg)
{
	(void)arg;
	static void *b[2000];
	for (int round = 0; round < 3; round++) {
		for (int i = 0; i < 2000; i++)
			mt_touch(b[i] = malloc(64u << 10), 64u << 10);
		for (int i = 0; i < 2000; i++)
			free(b[i]);
		usleep(300000);
	}
	mt_say("done");
	return NULL;
}

static int cleaned;

static void cleanup(void *arg)
{
	(void)arg;
	cleaned = 1;
}

/* pthread_exit() from a thread that is not the main one: its cleanup
 * handlers run and its value reaches pthread_join(), as without memtally
 * (the preloads interpose pthread_exit). */
static void *exits(void *arg)
{
	pthread_cleanup_push(cleanup, NULL);
	pthread_exit(arg);
	pthread_cleanup_pop(0);
	return NULL;
}

static int lastthread_main(int argc, char **argv)
{
	(void)argc;
	(void)argv;
	pthread_t t;
	void *got = NULL;
	if (pthread_create(&t, NULL, exits, (void *)7) ||
	    pthread_join(t, &got) || got != (void *)7 || !cleaned)
		return 1;
	mt_say("cleanup ok");
	if (pthread_create(&t, NULL, churn, NULL))
		return 1;
	pthread_exit(NULL);
}

const struct mt_sub mt_lastthread = {"lastthread", "", lastthread_main};
