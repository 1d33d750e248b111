/*
 * stacks - the small stacks a program may give the code that allocates:
 * a thread of PTHREAD_STACK_MIN (16 KiB, its TLS carved out of it) that
 * allocates, and a signal handler on an alternate stack of SIGSTKSZ
 * (8 KiB) that maps and unmaps memory (mmap is async-signal-safe; malloc
 * is not). Both run 200 ms after the start, when a process with a
 * reachable memtallyd registers at its next call, from that very stack.
 *
 * usage: mt_worker stacks
 * Prints "ok" and exits 0; a registration that needs more stack than the
 * program gave dies with SIGSEGV.
 */
#include "mt_common.h"

#include <limits.h>
#include <pthread.h>
#include <signal.h>
#include <sys/mman.h>

static void *small(void *arg)
{
	(void)arg;
	for (int i = 0; i < 4; i++)
		mt_touch(malloc(64u << 10), 64u << 10); /* past a flush */
	return NULL;
}

static void *volatile mapped;

static void on_usr1(int sig)
{
	(void)sig;
	void *p = mmap(NULL, 1u << 20, PROT_READ | PROT_WRITE,
	               MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (p != MAP_FAILED) {
		mapped = p;
		munmap(p, 1u << 20);
	}
}

static int stacks_main(int argc, char **argv)
{
	(void)argc;
	(void)argv;
	/* A counted mapping older than the reconcile's period: the handler's
	 * mmap below checks it too. */
	char *a = mmap(NULL, 512u << 10, PROT_READ | PROT_WRITE,
	               MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (a == MAP_FAILED)
		return 1;
	mt_touch(a, 512u << 10);
	usleep(200000);

	/* 8 KiB, the classic SIGSTKSZ, behind a guard page. Reserved, not
	 * committed (no count, so no call that may register): the process's
	 * first such call is the handler's. */
	size_t sz = 8192;
	char *g = mmap(NULL, sz + 4096, PROT_READ | PROT_WRITE,
	               MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
	if (g == MAP_FAILED || mprotect(g, 4096, PROT_NONE))
		return 1;
	stack_t ss = {.ss_sp = g + 4096, .ss_size = sz};
	struct sigaction sa = {.sa_handler = on_usr1, .sa_flags = SA_ONSTACK};
	if (sigaltstack(&ss, NULL) || sigaction(SIGUSR1, &sa, NULL))
		return 1;
	raise(SIGUSR1);
	if (!mapped)
		return 1;

	pthread_attr_t at;
	pthread_attr_init(&at);
	pthread_attr_setstacksize(&at, PTHREAD_STACK_MIN);
	pthread_t t;
	if (pthread_create(&t, &at, small, NULL))
		return 1;
	pthread_join(t, NULL);
	mt_say("ok");
	return 0;
}

const struct mt_sub mt_stacks = {"stacks", "", stacks_main};
