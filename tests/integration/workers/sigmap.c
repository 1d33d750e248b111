/*
 * sigmap - maps and unmaps in a loop while another thread keeps
 * signalling it, and the signal handler maps and unmaps too: a handler
 * that lands while the mmap interposer holds (or is taking) its lock must
 * map uncounted, never wait for the lock its own thread holds.
 * usage: mt_worker sigmap SECONDS; prints "done ITERATIONS HANDLED" and
 * exits 0, or "stalled" and exits 2 when the loop stops moving for 3 s.
 */
#include "mt_common.h"

#include <pthread.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/syscall.h>

static volatile long handled, iterations;
static volatile int stop;
static pid_t main_tid;

static void on_signal(int sig)
{
	(void)sig;
	void *p = mmap(NULL, 4096, PROT_READ | PROT_WRITE,
	               MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (p != MAP_FAILED)
		munmap(p, 4096);
	handled++;
}

static void *signaller(void *arg)
{
	(void)arg;
	unsigned s = 1;
	while (!stop) {
		s = s * 1103515245u + 12345u;
		for (volatile unsigned k = (s >> 16) % 4000; k; k--)
			;
		syscall(SYS_tgkill, getpid(), main_tid, SIGUSR1);
	}
	return NULL;
}

static void *watchdog(void *arg)
{
	long seconds = (long)(intptr_t)arg, last = -1;
	time_t start = time(NULL);
	for (;;) {
		sleep(1);
		if (time(NULL) - start >= seconds) {
			stop = 1;
			printf("done %ld %ld\n", iterations, handled);
			fflush(stdout);
			_exit(0);
		}
		if ((time(NULL) - start) % 3 == 0) {
			if (iterations == last) {
				printf("stalled\n");
				fflush(stdout);
				_exit(2);
			}
			last = iterations;
		}
	}
}

static int sigmap_main(int argc, char **argv)
{
	long seconds = argc > 1 ? atol(argv[1]) : 5;
	main_tid = gettid();
	struct sigaction sa = {.sa_handler = on_signal, .sa_flags = SA_RESTART};
	sigaction(SIGUSR1, &sa, NULL);
	pthread_t t, w;
	pthread_create(&w, NULL, watchdog, (void *)(intptr_t)seconds);
	pthread_create(&t, NULL, signaller, NULL);
	for (;;) {
		void *p = mmap(NULL, 8192, PROT_READ | PROT_WRITE,
		               MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
		if (p != MAP_FAILED)
			munmap(p, 8192);
		iterations++;
	}
	return 0; /* not reached: the watchdog ends the process */
}

const struct mt_sub mt_sigmap = {"sigmap", "SECONDS", sigmap_main};
