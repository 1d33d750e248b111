/*
 * churn - THREADS threads allocate and free at random for SECONDS, then
 * free everything and exit. usage: mt_worker churn [THREADS] [SECONDS]
 * [ATTACH_S]. With ATTACH_S, it then waits up to that many seconds for the
 * preload to be registered (exit 3 if it never is): a registration that
 * timed out on a loaded machine is retried by the library's back-off, and
 * a test counting registrations must not race the worker's exit.
 */
#include "mt_common.h"

#include <pthread.h>
#include <stdbool.h>

static double seconds = 2;

static void *work(void *arg)
{
	uint64_t s = (uintptr_t)arg * 0x9E3779B97F4A7C15ull + 7;
	enum { N = 512 };
	void *live[N] = {0};
	double end = mt_now_s() + seconds;
	for (unsigned it = 0;; it++) {
		if ((it & 1023) == 0 && mt_now_s() > end)
			break;
		s ^= s << 13, s ^= s >> 7, s ^= s << 17;
		unsigned i = s % N;
		free(live[i]);
		size_t n = (s >> 20) % 16 ? 8 + (s >> 32) % 4096
		                          : 4096 + (s >> 32) % (256 * 1024);
		live[i] = (s >> 10) % 3 ? malloc(n) : calloc(1, n);
	}
	for (unsigned i = 0; i < N; i++)
		free(live[i]);
	return NULL;
}

static int churn_main(int argc, char **argv)
{
	int n = argc > 1 ? atoi(argv[1]) : 4;
	if (argc > 2)
		seconds = atof(argv[2]);
	pthread_t t[64];
	if (n > 64)
		n = 64;
	for (int i = 0; i < n; i++)
		pthread_create(&t[i], NULL, work, (void *)(uintptr_t)(i + 1));
	for (int i = 0; i < n; i++)
		pthread_join(t[i], NULL);
	if (argc > 3) {
		bool (*attached)(void) =
		    (bool (*)(void))dlsym(RTLD_DEFAULT, "memtally_attached");
		double end = mt_now_s() + atof(argv[3]);
		while (!attached || !attached()) {
			if (!attached || mt_now_s() > end)
				return 3;
			usleep(50 * 1000);
		}
	}
	return 0;
}

const struct mt_sub mt_churn = {"churn", "[THREADS] [SECONDS] [ATTACH_S]",
                                churn_main};
