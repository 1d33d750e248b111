/*
 * cancel - malloc and free are no cancellation points (POSIX): a thread
 * with a cancel pending that allocates must come back from malloc. The
 * allocation passes the 64 KiB publish threshold, so it may register or
 * try to (with no server, connect fails); the calls a registration makes
 * (connect, poll, recvmsg, close, reading /proc) are cancellation points.
 *
 * usage: mt_worker cancel
 * Prints "malloc returned, thread cancelled after" and exits 0, or
 * "cancelled inside malloc" and exits 1.
 */
#include "mt_common.h"

#include <pthread.h>

static int go, reached;

static void *body(void *arg)
{
	(void)arg;
	/* No cancellation point until malloc: the cancel stays pending. */
	while (!__atomic_load_n(&go, __ATOMIC_ACQUIRE))
		;
	char *p = malloc(4u << 20);
	mt_touch(p, 4u << 20);
	__atomic_store_n(&reached, 1, __ATOMIC_RELEASE);
	free(p);
	pthread_testcancel();
	return NULL;
}

static int cancel_main(int argc, char **argv)
{
	(void)argc;
	(void)argv;
	pthread_t t;
	if (pthread_create(&t, NULL, body, NULL) != 0)
		return 2;
	pthread_cancel(t);
	__atomic_store_n(&go, 1, __ATOMIC_RELEASE);
	void *ret;
	pthread_join(t, &ret);
	if (!__atomic_load_n(&reached, __ATOMIC_ACQUIRE)) {
		mt_say("cancelled inside malloc");
		return 1;
	}
	mt_say("malloc returned, thread %s after",
	       ret == PTHREAD_CANCELED ? "cancelled" : "not cancelled");
	return ret == PTHREAD_CANCELED ? 0 : 1;
}

const struct mt_sub mt_cancel = {"cancel", "", cancel_main};
