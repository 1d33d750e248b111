/*
 * memtallyd_child.h - memtallyd as a child process: the one way the C unit
 * tests and the C benchmarks start a real server.
 *
 * Each server gets a temporary directory of its own for its socket, log
 * and restart record, and a segment label of this process's, so that
 * tests and benchmarks running side by side never meet. The child dies
 * with its parent, even one that crashes before its teardown (a leftover
 * server keeps CTest's output pipe open). mtd_start() returns once the
 * socket accepts connections.
 *
 * Needs _GNU_SOURCE (CPU pinning) before the first system header.
 */
#ifndef MEMTALLY_TEST_MEMTALLYD_CHILD_H
#define MEMTALLY_TEST_MEMTALLYD_CHILD_H

#include <errno.h>
#include <fcntl.h>
#include <sched.h>
#include <signal.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

struct mtd_child {
	char dir[64], sock[128], state[160], log[128], seg[64];
	pid_t pid;
};

/* Whether something accepts connections at the Unix socket `path` now. */
static inline __attribute__((unused)) bool mtd_connectable(const char *path)
{
	struct sockaddr_un sa = {.sun_family = AF_UNIX};
	if (strlen(path) >= sizeof(sa.sun_path))
		return false;
	memcpy(sa.sun_path, path, strlen(path) + 1);
	int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
	if (fd < 0)
		return false;
	bool ok = connect(fd, (struct sockaddr *)&sa, sizeof(sa)) == 0;
	close(fd);
	return ok;
}

static inline uint64_t mtd_now_ms(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
}

/* Say on stderr why the server is not there, with the end of its log. */
static inline void mtd_print_log(const struct mtd_child *s, const char *why)
{
	char buf[4096];
	ssize_t n = 0;
	int fd = open(s->log, O_RDONLY | O_CLOEXEC);
	if (fd >= 0) {
		off_t size = lseek(fd, 0, SEEK_END);
		off_t from = size > (off_t)sizeof(buf) - 1
		                 ? size - (off_t)sizeof(buf) + 1
		                 : 0;
		n = pread(fd, buf, sizeof(buf) - 1, from);
		close(fd);
	}
	buf[n > 0 ? n : 0] = '\0';
	fprintf(stderr, "memtallyd %s; its log (%s):\n%s\n", why, s->log, buf);
}

/* Stop the server (if it runs) as its service manager would, and remove
 * what it left: the log too, unless `keep_log` or the server did not exit
 * 0 (a sanitizer's report at exit: a leak, TSan's 66), when stderr says
 * where it is. Returns its wait status, 0 for a clean exit. Its shared
 * memory is sealed memfds: nothing of it outlives the server and its
 * workers. */
static inline __attribute__((unused)) int mtd_stop(struct mtd_child *s,
                                                   bool keep_log)
{
	int status = 0;
	if (s->pid > 0) {
		kill(s->pid, SIGTERM);
		while (waitpid(s->pid, &status, 0) < 0 && errno == EINTR)
			;
		s->pid = 0;
		if (status != 0) {
			mtd_print_log(s, "did not exit 0 at its stop");
			keep_log = true;
		}
	}
	if (!s->dir[0])
		return status;
	unlink(s->sock);
	unlink(s->state);
	if (keep_log) {
		fprintf(stderr, "memtallyd's log: %s\n", s->log);
		return status;
	}
	unlink(s->log);
	rmdir(s->dir);
	s->dir[0] = '\0';
	return status;
}

/*
 * Start memtallyd (`exe`) with --socket and --segment of its own, then
 * `args` (NULL-terminated, at most 24; may be NULL); its stdout and stderr
 * go to the log, and it runs pinned to `cpu` if that is >= 0. `tag` names
 * the caller in the directory and the segment. Waits until the socket
 * accepts, at most 10 s (times MEMTALLY_TEST_TIMEOUT_MULT). Returns 0, or
 * -1 with the server gone and its log on stderr; mtd_stop() removes the
 * rest either way.
 */
static inline __attribute__((unused)) int mtd_start(struct mtd_child *s,
                                                    const char *tag,
                                                    const char *exe, int cpu,
                                                    const char *const *args)
{
	memset(s, 0, sizeof(*s));
	snprintf(s->dir, sizeof(s->dir), "/tmp/mt-%s-XXXXXX", tag);
	if (!mkdtemp(s->dir)) {
		s->dir[0] = '\0';
		return -1;
	}
	snprintf(s->sock, sizeof(s->sock), "%s/memtally.sock", s->dir);
	snprintf(s->state, sizeof(s->state), "%s.state", s->sock);
	snprintf(s->log, sizeof(s->log), "%s/memtallyd.log", s->dir);
	snprintf(s->seg, sizeof(s->seg), "/mt-%s-%ld", tag, (long)getpid());
	const char *argv[32] = {exe, "--socket", s->sock, "--segment", s->seg};
	for (int i = 0; args && args[i] && i < 24; i++)
		argv[5 + i] = args[i];

	pid_t parent = getpid();
	pid_t pid = fork();
	if (pid < 0)
		return -1;
	if (pid == 0) {
		prctl(PR_SET_PDEATHSIG, SIGKILL);
		if (getppid() != parent) /* it went before the line above */
			_exit(1);
		int fd = open(s->log, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC,
		              0600);
		if (fd >= 0) {
			dup2(fd, 1);
			dup2(fd, 2);
		}
		if (cpu >= 0) {
			cpu_set_t set;
			CPU_ZERO(&set);
			CPU_SET(cpu, &set);
			sched_setaffinity(0, sizeof(set), &set);
		}
		execv(exe, (char *const *)argv);
		_exit(127);
	}
	s->pid = pid;

	const char *m = getenv("MEMTALLY_TEST_TIMEOUT_MULT");
	double mult = m && atof(m) > 0 ? atof(m) : 1;
	uint64_t end = mtd_now_ms() + (uint64_t)(10000 * mult);
	while (!mtd_connectable(s->sock)) {
		bool exited = waitpid(pid, NULL, WNOHANG) == pid;
		if (exited || mtd_now_ms() > end) {
			if (!exited) {
				kill(pid, SIGKILL);
				waitpid(pid, NULL, 0);
			}
			s->pid = 0;
			mtd_print_log(s, exited ? "exited at start"
			                        : "did not start in time");
			return -1;
		}
		struct timespec ts = {0, 10 * 1000 * 1000};
		nanosleep(&ts, NULL);
	}
	return 0;
}

#endif /* MEMTALLY_TEST_MEMTALLYD_CHILD_H */
