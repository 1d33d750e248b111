/*
 * kin - a registered worker with descendants that never register, made
 * the ways that could fool memtallyd into counting what they share twice
 * or into hiding what they hold. Print "ready pids=W[,...]" (the worker
 * first) and wait on stdin (EOF or "exit": exit; the others die with it):
 *   zombievm    the worker writes MIB MiB; a clone(CLONE_VM) child of it
 *               starts a thread and ends its main thread (its task then
 *               has no address space)
 *   zombiefork  three fork children write MIB MiB each, start a thread
 *               and end their main threads
 *   clonepar    a registered fork child writes MIB MiB and makes a
 *               clone(CLONE_VM|CLONE_PARENT) of itself: a child of the
 *               worker sharing the registered child's memory
 *   clonewrap   the same, the clone's pid below the registered child's
 *               (pids used up until they wrap: for a small pid_max)
 *   memfdmap    the worker writes MIB MiB into a memfd it never maps; a
 *               fork child maps and reads all of it
 *   churn       a fork child with 100 children writing MIB MiB each,
 *               while a thread of the worker forks short-lived children
 *               (1 MiB, 3 ms) one after another
 * The processes that must not register make no allocator call (raw
 * system calls only).
 * usage: mt_worker kin MODE MIB
 */
#include "mt_common.h"

#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdbool.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <sys/wait.h>

#define STACK (64 * 1024)

static char *raw_map(size_t len)
{
	long m = syscall(SYS_mmap, NULL, len, PROT_READ | PROT_WRITE,
	                 MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	return m == -1 ? NULL : (char *)m;
}

static void raw_write(char *m, size_t len)
{
	for (size_t i = 0; m && i < len; i += 4096)
		m[i] = 1;
}

static int sleeper(void *arg)
{
	(void)arg;
	syscall(SYS_prctl, PR_SET_PDEATHSIG, SIGKILL, 0, 0, 0);
	for (;;)
		syscall(SYS_pause);
	return 0;
}

/* Start a thread that sleeps, then end the calling (main) thread. */
static void leave_a_thread(void)
{
	char *st = raw_map(STACK);
	if (!st || clone(sleeper, st + STACK,
	                 CLONE_VM | CLONE_THREAD | CLONE_SIGHAND | CLONE_FS |
	                     CLONE_FILES,
	                 NULL) < 0)
		syscall(SYS_exit_group, 1);
	syscall(SYS_exit, 0); /* this thread only */
}

static int vm_child(void *arg)
{
	(void)arg;
	syscall(SYS_prctl, PR_SET_PDEATHSIG, SIGKILL, 0, 0, 0);
	leave_a_thread();
	return 0;
}

static void *churn(void *arg)
{
	size_t len = 1u << 20;
	(void)arg;
	for (;;) {
		pid_t p = fork();
		if (p == 0) {
			raw_write(raw_map(len), len);
			usleep(3000);
			_exit(0);
		}
		if (p > 0)
			waitpid(p, NULL, 0);
	}
	return NULL;
}

static int append(char *pids, size_t cap, int n, pid_t pid)
{
	return n + snprintf(pids + n, cap - (size_t)n, ",%d", (int)pid);
}

static int kin_main(int argc, char **argv)
{
	if (argc < 3)
		return 2;
	const char *mode = argv[1];
	size_t len = strtoul(argv[2], NULL, 10) * MIB;
	char pids[1024];
	int n = snprintf(pids, sizeof(pids), "%d", (int)getpid());
	free(malloc(100));
	mt_flush();
	if (strcmp(mode, "zombievm") == 0) {
		char *b = malloc(len);
		if (!b)
			return 1;
		mt_touch(b, len);
		mt_flush();
		char *st = raw_map(STACK);
		pid_t p =
		    st ? clone(vm_child, st + STACK, CLONE_VM | SIGCHLD, NULL)
		       : -1;
		if (p < 0)
			return 1;
		n = append(pids, sizeof(pids), n, p);
	} else if (strcmp(mode, "zombiefork") == 0) {
		for (int i = 0; i < 3; i++) {
			pid_t c = fork();
			if (c < 0)
				return 1;
			if (c == 0) {
				syscall(SYS_prctl, PR_SET_PDEATHSIG, SIGKILL, 0,
				        0, 0);
				raw_write(raw_map(len), len);
				leave_a_thread();
			}
			n = append(pids, sizeof(pids), n, c);
		}
	} else if (strcmp(mode, "clonepar") == 0 ||
	           strcmp(mode, "clonewrap") == 0) {
		bool wrap = strcmp(mode, "clonewrap") == 0;
		int fd[2];
		if (pipe(fd))
			return 1;
		pid_t c = fork();
		if (c < 0)
			return 1;
		if (c == 0) {
			prctl(PR_SET_PDEATHSIG, SIGKILL);
			/* Small still, so each fork is quick. */
			pid_t me = getpid();
			for (long q = me; wrap && q >= me;) {
				q = syscall(SYS_clone, SIGCHLD, 0, 0, 0, 0);
				if (q == 0)
					syscall(SYS_exit_group, 0);
				if (q < 0)
					_exit(1);
				syscall(SYS_wait4, (pid_t)q, NULL, 0, NULL);
			}
			char *b = malloc(len);
			if (!b)
				_exit(1);
			mt_touch(b, len);
			mt_flush(); /* it registers */
			char *st = raw_map(STACK);
			pid_t x = st ? clone(sleeper, st + STACK,
			                     CLONE_VM | CLONE_PARENT, NULL)
			             : -1;
			int v[2] = {(int)getpid(), (int)x};
			if (x < 0 || write(fd[1], v, sizeof(v)) != sizeof(v))
				_exit(1);
			for (;;)
				pause();
		}
		int v[2];
		if (read(fd[0], v, sizeof(v)) != sizeof(v))
			return 1;
		n = append(pids, sizeof(pids), n, v[0]);
		n = append(pids, sizeof(pids), n, v[1]);
	} else if (strcmp(mode, "memfdmap") == 0) {
		int fd = memfd_create("mt-kin", 0);
		static char chunk[1 << 16];
		memset(chunk, 1, sizeof(chunk));
		for (size_t off = 0; fd >= 0 && off < len; off += sizeof(chunk))
			if (write(fd, chunk, sizeof(chunk)) != sizeof(chunk))
				return 1;
		if (fd < 0)
			return 1;
		pid_t c = fork();
		if (c < 0)
			return 1;
		if (c == 0) {
			syscall(SYS_prctl, PR_SET_PDEATHSIG, SIGKILL, 0, 0, 0);
			long m = syscall(SYS_mmap, NULL, len, PROT_READ,
			                 MAP_SHARED, fd, 0);
			volatile char *p = m == -1 ? NULL : (volatile char *)m;
			unsigned sum = 0;
			for (size_t i = 0; p && i < len; i += 4096)
				sum += (unsigned char)p[i];
			(void)sum;
			for (;;)
				syscall(SYS_pause);
		}
		n = append(pids, sizeof(pids), n, c);
	} else if (strcmp(mode, "churn") == 0) {
		pid_t k = fork();
		if (k < 0)
			return 1;
		if (k == 0) {
			syscall(SYS_prctl, PR_SET_PDEATHSIG, SIGKILL, 0, 0, 0);
			for (int i = 0; i < 100; i++) {
				if (syscall(SYS_fork) == 0) {
					syscall(SYS_prctl, PR_SET_PDEATHSIG,
					        SIGKILL, 0, 0, 0);
					raw_write(raw_map(len), len);
					for (;;)
						syscall(SYS_pause);
				}
			}
			for (;;)
				syscall(SYS_pause);
		}
		pthread_t t;
		if (pthread_create(&t, NULL, churn, NULL))
			return 1;
		n = append(pids, sizeof(pids), n, k);
	} else {
		return 2;
	}
	mt_say("ready pids=%s", pids);
	mt_serve(NULL, 0);
	return 0;
}

const struct mt_sub mt_kin = {"kin", "MODE MIB", kin_main};
