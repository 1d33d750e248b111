/*
 * mt_forklock - one thread maps and unmaps through libmt_forklock (under
 * the library's lock) without pause, another maps and unmaps by itself,
 * while the main thread forks COUNT times, each child exiting at once
 * (after the library's child handler has mapped memory); prints "no
 * deadlock" at the end.
 * Without memtally this always ends. usage: mt_forklock [COUNT]
 */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
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

/* Maps outside the library's lock: often inside memtally's table when a
 * fork copies the process. */
static void *churn_plain(void *arg)
{
	(void)arg;
	for (;;) {
		void *p = mmap(NULL, 1 << 16, PROT_READ | PROT_WRITE,
		               MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
		if (p != MAP_FAILED)
			munmap(p, 1 << 16);
	}
	return NULL;
}

int main(int argc, char **argv)
{
	int count = argc > 1 ? atoi(argv[1]) : 2000;
	pthread_t t, u;
	if (pthread_create(&t, NULL, churn, NULL) != 0 ||
	    pthread_create(&u, NULL, churn_plain, NULL) != 0)
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
