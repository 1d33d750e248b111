/*
 * mt_forklock - one thread maps and unmaps through libmt_forklock (under
 * the library's lock) without pause while the main thread forks COUNT
 * times, each child exiting at once; prints "no deadlock" at the end.
 * Without memtally this always ends. usage: mt_forklock [COUNT]
 */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

void *forklock_alloc(size_t n);
void forklock_free(void *p, size_t n);

static void *churn(void *arg)
{
	(void)arg;
	for (;;) {
		void *p = forklock_alloc(1 << 16);
		if (p)
			forklock_free(p, 1 << 16);
	}
	return NULL;
}

int main(int argc, char **argv)
{
	int count = argc > 1 ? atoi(argv[1]) : 2000;
	pthread_t t;
	if (pthread_create(&t, NULL, churn, NULL) != 0)
		return 1;
	for (int i = 0; i < count; i++) {
		pid_t c = fork();
		if (c < 0)
			return 1;
		if (c == 0)
			_exit(0);
		waitpid(c, NULL, 0);
	}
	printf("no deadlock\n");
	fflush(stdout);
	return 0;
}
