/*
 * fork - hold MIB MiB, then fork. The child allocates one small block
 * (so it reaches a flush and registers), prints "child pid=P", and waits on
 * stdin like the parent. usage: mt_worker fork MIB
 */
#include "mt_common.h"

#include <fcntl.h>
#include <sched.h>
#include <signal.h>
#include <stdbool.h>
#include <string.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

static int fork_main(int argc, char **argv)
{
	size_t mib = argc > 1 ? strtoul(argv[1], NULL, 10) : 50;
	void **b = calloc(mib + 1, sizeof(void *));
	for (size_t i = 0; i < mib; i++) {
		b[i] = malloc(MIB);
		mt_touch(b[i], MIB);
	}
	mt_flush();
	pid_t pid = fork();
	if (pid == 0) {
		free(malloc(100)); /* first allocator call after the fork */
		mt_flush();
		mt_say("child pid=%d", (int)getpid());
		mt_serve(NULL, 0);
		_exit(0);
	}
	mt_say("parent pid=%d", (int)getpid());
	mt_serve(NULL, 0);
	kill(pid, SIGKILL);
	waitpid(pid, NULL, 0);
	return 0;
}

const struct mt_sub mt_fork = {"fork", "MIB", fork_main};

/*
 * chain - a chain of DEPTH nested forks, none exec'ing (a shell's
 * subshells, a daemon forking again): each process allocates (so it
 * registers), then forks the next and waits for it. The last holds MIB
 * MiB, prints "leaf pid=P level=N" and waits on stdin; the chain ends
 * with it. usage: mt_worker chain DEPTH MIB
 */
static int chain_main(int argc, char **argv)
{
	int depth = argc > 1 ? atoi(argv[1]) : 20;
	size_t mib = argc > 2 ? strtoul(argv[2], NULL, 10) : 16;
	for (int level = 0;; level++) {
		free(malloc(100));
		mt_flush();
		if (level == depth)
			break;
		pid_t pid = fork();
		if (pid < 0)
			return 1;
		if (pid > 0) {
			int st = 0;
			waitpid(pid, &st, 0);
			_exit(WIFEXITED(st) ? WEXITSTATUS(st) : 1);
		}
	}
	void **b = calloc(mib + 1, sizeof(void *));
	for (size_t i = 0; i < mib; i++) {
		b[i] = malloc(MIB);
		mt_touch(b[i], MIB);
	}
	mt_flush();
	mt_say("leaf pid=%d level=%d", (int)getpid(), depth);
	mt_serve(NULL, 0);
	return 0;
}

const struct mt_sub mt_chain = {"chain", "DEPTH MIB", chain_main};

/*
 * unseen - hold MIB MiB, then fork in a way that runs no atfork handler:
 * HOW is "_Fork" (glibc's _Fork()) or "clone" (a raw clone system call
 * with SIGCHLD, as a sandbox or a runtime of its own makes). The child
 * holds MORE MiB more, prints "child pid=P" and waits on stdin, as does
 * the parent ("parent pid=P"). Run it with no refresh thread
 * (MEMTALLY_REFRESH_MS=0): a fork without handlers is safe only when no
 * other thread holds a lock the child needs. With UID, the child gives
 * its uids up for UID with setuid(), before its first allocation
 * ("early", as a launcher that drops to run untrusted code) or after it
 * ("late"), and its line says how many writable mappings of its parent's
 * slot table it still has ("child pid=P writable=N"): whatever runs as
 * UID could write every claim there.
 * usage: mt_worker unseen MIB MORE HOW [UID early|late]
 */

/* Writable mappings of uid `uid`'s slot table ("<label>-slots:<i>:<uid>"),
 * read with open() and read() into static memory: no allocation, which
 * would set a child forked without our handlers up, and fence its
 * parent's windows, before they are counted. */
static int table_writable(uid_t uid)
{
	static char buf[1 << 20];
	int fd = open("/proc/self/maps", O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return -1;
	size_t len = 0;
	ssize_t r;
	while (len < sizeof(buf) - 1 &&
	       (r = read(fd, buf + len, sizeof(buf) - 1 - len)) > 0)
		len += (size_t)r;
	close(fd);
	buf[len] = 0;
	char end[32];
	snprintf(end, sizeof(end), ":%u", (unsigned)uid);
	size_t el = strlen(end);
	int n = 0;
	for (char *line = buf; *line;) {
		char *nl = strchr(line, '\n');
		char *next = nl ? nl + 1 : line + strlen(line);
		if (nl)
			*nl = 0;
		char *del = strstr(line, " (deleted)");
		if (del)
			*del = 0;
		char *perms = strchr(line, ' ');
		size_t ll = strlen(line);
		if (perms && perms[2] == 'w' && strstr(line, "-slots:") &&
		    ll > el && strcmp(line + ll - el, end) == 0)
			n++;
		line = next;
	}
	return n;
}

static int unseen_main(int argc, char **argv)
{
	if (argc < 4)
		return 2;
	size_t mib = strtoul(argv[1], NULL, 10);
	size_t more = strtoul(argv[2], NULL, 10);
	bool drop = argc > 5;
	uid_t to = drop ? (uid_t)strtoul(argv[4], NULL, 10) : 0;
	bool early = drop && strcmp(argv[5], "early") == 0;
	uid_t parent_uid = getuid();
	void **b = calloc(mib + more + 1, sizeof(void *));
	for (size_t i = 0; i < mib; i++) {
		b[i] = malloc(MIB);
		mt_touch(b[i], MIB);
	}
	mt_flush();
	fflush(stdout);
	pid_t pid;
	if (strcmp(argv[3], "_Fork") == 0)
		pid = _Fork();
	else if (strcmp(argv[3], "clone") == 0)
		pid =
		    (pid_t)syscall(SYS_clone, SIGCHLD, NULL, NULL, NULL, NULL);
	else
		return 2;
	if (pid < 0)
		return 1;
	if (pid == 0) {
		int left = -1;
		if (early) {
			/* Counted before any allocation: its own would fence
			 * the windows whatever the set-uid call did. */
			if (setuid(to) != 0)
				_exit(3);
			left = table_writable(parent_uid);
		}
		for (size_t i = mib; i < mib + more; i++) {
			b[i] = malloc(MIB);
			mt_touch(b[i], MIB);
		}
		mt_flush();
		if (drop && !early) {
			if (setuid(to) != 0)
				_exit(3);
			left = table_writable(parent_uid);
		}
		if (drop)
			mt_say("child pid=%d writable=%d", (int)getpid(), left);
		else
			mt_say("child pid=%d", (int)getpid());
		mt_serve(NULL, 0);
		_exit(0);
	}
	mt_say("parent pid=%d", (int)getpid());
	mt_serve(NULL, 0);
	kill(pid, SIGKILL);
	waitpid(pid, NULL, 0);
	return 0;
}

const struct mt_sub mt_unseen = {"unseen", "MIB MORE HOW [UID early|late]",
                                 unseen_main};
