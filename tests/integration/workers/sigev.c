/*
 * sigev - hold MIB mebibytes, allocated in the notification of a timer
 * made with timer_create(SIGEV_THREAD): glibc runs each notification in a
 * thread of its own making, started without its exported pthread_create.
 * The notification asks memtally nothing: what it holds is counted only
 * if its thread was set up when it started. Then "ready pid=P", and serve.
 * usage: mt_worker sigev MIB
 */
#include "mt_common.h"

#include <semaphore.h>
#include <signal.h>
#include <time.h>

static size_t mib;
static void **blocks;
static sem_t done;

static void hold(union sigval v)
{
	(void)v;
	for (size_t i = 0; i < mib; i++) {
		blocks[i] = malloc(MIB);
		mt_touch(blocks[i], MIB);
	}
	sem_post(&done);
}

static int sigev_main(int argc, char **argv)
{
	mib = argc > 1 ? strtoul(argv[1], NULL, 10) : 32;
	blocks = calloc(mib + 1, sizeof(void *));
	sem_init(&done, 0, 0);
	struct sigevent ev = {.sigev_notify = SIGEV_THREAD,
	                      .sigev_notify_function = hold};
	timer_t t;
	if (timer_create(CLOCK_MONOTONIC, &ev, &t) != 0)
		return 1;
	struct itimerspec its = {.it_value = {.tv_nsec = 1000000}};
	if (timer_settime(t, 0, &its, NULL) != 0)
		return 1;
	while (sem_wait(&done) != 0)
		;
	if (timer_delete(t) != 0)
		return 1;
	mt_flush();
	mt_ready();
	static const struct mt_cmd cmds[] = {{NULL, NULL}};
	return mt_serve(cmds, 0);
}

const struct mt_sub mt_sigev = {"sigev", "MIB", sigev_main};
