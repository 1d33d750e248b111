/*
 * share - hold MIB MiB in one of three ways, print "ready pids=P[,C...]"
 * and wait on stdin (EOF or "exit": exit; the children die with it):
 *   private  malloc and write MIB MiB, then fork CHILDREN children: the
 *            pages are shared copy-on-write by every process
 *   shared   a MAP_SHARED anonymous mapping of MIB MiB, written by the
 *            parent and read by every child
 *   memfd    MIB MiB written into a memfd that is never mapped
 * Each child makes an allocator call (so that it registers) and pauses;
 * with `quiet`, it makes none and never registers; with `clonevm`, it is
 * made by clone(CLONE_VM) (it shares the parent's address space, as a
 * vfork child does) and never registers either.
 * usage: mt_worker share MODE MIB [CHILDREN [quiet|clonevm]]
 */
#include "mt_common.h"

#include <sched.h>
#include <signal.h>
#include <stdbool.h>
#include <sys/syscall.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>

static void child(const volatile char *shared, size_t len, bool quiet)
{
	prctl(PR_SET_PDEATHSIG, SIGKILL);
	unsigned sum = 0;
	for (size_t i = 0; shared && i < len; i += 4096)
		sum += (unsigned char)shared[i];
	if (!quiet) {
		free(malloc(100 + (sum & 1)));
		mt_flush();
	}
	for (;;)
		pause();
}

/* A CLONE_VM child: the parent's memory is its own, no libc state of
 * its own (raw syscalls only). */
static int vm_child(void *arg)
{
	(void)arg;
	syscall(SYS_prctl, PR_SET_PDEATHSIG, SIGKILL, 0, 0, 0);
	for (;;)
		syscall(SYS_pause);
	return 0;
}

static int share_main(int argc, char **argv)
{
	if (argc < 3)
		return 2;
	const char *mode = argv[1];
	size_t len = strtoul(argv[2], NULL, 10) * MIB;
	unsigned nkids = argc > 3 ? (unsigned)strtoul(argv[3], NULL, 10) : 0;
	bool quiet = argc > 4 && strcmp(argv[4], "quiet") == 0;
	bool vm = argc > 4 && strcmp(argv[4], "clonevm") == 0;
	char *shared = NULL;
	if (strcmp(mode, "private") == 0) {
		char *b = malloc(len);
		if (!b)
			return 1;
		mt_touch(b, len);
		mt_flush();
	} else if (strcmp(mode, "shared") == 0) {
		shared = mmap(NULL, len, PROT_READ | PROT_WRITE,
		              MAP_SHARED | MAP_ANONYMOUS, -1, 0);
		if (shared == MAP_FAILED)
			return 1;
		memset(shared, 1, len);
	} else if (strcmp(mode, "memfd") == 0) {
		int fd = memfd_create("mt-share", MFD_CLOEXEC);
		static char chunk[1 << 16];
		memset(chunk, 1, sizeof(chunk));
		for (size_t off = 0; fd >= 0 && off < len; off += sizeof(chunk))
			if (write(fd, chunk, sizeof(chunk)) != sizeof(chunk))
				return 1;
		if (fd < 0)
			return 1;
	} else {
		return 2;
	}
	free(malloc(100));
	mt_flush();
	char pids[4096];
	int n = snprintf(pids, sizeof(pids), "%d", (int)getpid());
	for (unsigned i = 0; i < nkids; i++) {
		if (vm) {
			size_t stack = 64 * 1024;
			char *st = mmap(NULL, stack, PROT_READ | PROT_WRITE,
			                MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
			pid_t pid = st == MAP_FAILED
			                ? -1
			                : clone(vm_child, st + stack,
			                        CLONE_VM | SIGCHLD, NULL);
			if (pid < 0)
				return 1;
			if (n < (int)sizeof(pids) - 16)
				n +=
				    snprintf(pids + n, sizeof(pids) - (size_t)n,
				             ",%d", (int)pid);
			continue;
		}
		pid_t pid = fork();
		if (pid < 0)
			return 1;
		if (pid == 0)
			child(shared, shared ? len : 0, quiet);
		if (n < (int)sizeof(pids) - 16)
			n += snprintf(pids + n, sizeof(pids) - (size_t)n, ",%d",
			              (int)pid);
	}
	mt_say("ready pids=%s", pids);
	mt_serve(NULL, 0);
	return 0;
}

const struct mt_sub mt_share = {"share", "MODE MIB [CHILDREN [quiet]]",
                                share_main};
