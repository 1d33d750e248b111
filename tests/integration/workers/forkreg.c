/*
 * forkreg - a fork while another thread registers: the child must not be
 * handed the registration's socket or the descriptors it received. A
 * thread allocates 1 MiB (a flush: it registers, and waits for an answer
 * the harness's server holds back); once the process holds the
 * registration's socket, the main thread forks. The child counts its
 * sockets and memfds, without allocating (an allocation of its own could
 * register and open one), and prints "child sockets=N memfds=M". (The
 * received descriptors are held for microseconds: the memfd count is
 * reported, not aimed at.) Exits 3 if no socket showed up in 10 s.
 *
 * usage: mt_worker forkreg
 *
 * nostdio - a daemon that closed its standard descriptors: closes 0, 1 and
 * 2, then allocates and touches 4 MiB (under MEMTALLY_TASK its first
 * flush registers), frees it and exits 0. The harness's server looks at
 * which of 0-2 the process holds while it registers.
 *
 * usage: mt_worker nostdio
 */
#define _GNU_SOURCE
#include "mt_common.h"

#include <dirent.h>
#include <fcntl.h>
#include <pthread.h>
#include <sys/syscall.h>
#include <sys/wait.h>

static void *registers(void *arg)
{
	(void)arg;
	char *p = malloc(MIB);
	mt_touch(p, MIB);
	mt_flush();
	free(p);
	return NULL;
}

/* This process's sockets and memfds, by getdents64 on /proc/self/fd: no
 * allocation. */
static void count_fds(unsigned *sockets_out, unsigned *memfds_out)
{
	int dir = open("/proc/self/fd", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	char buf[8192], path[300], link[256];
	unsigned sockets = 0, memfds = 0;
	long n;
	while (dir >= 0 &&
	       (n = syscall(SYS_getdents64, dir, buf, sizeof(buf))) > 0) {
		for (long off = 0; off < n;) {
			struct dirent64 *d = (struct dirent64 *)(buf + off);
			off += d->d_reclen;
			if (d->d_name[0] < '0' || d->d_name[0] > '9' ||
			    atoi(d->d_name) == dir)
				continue;
			snprintf(path, sizeof(path), "/proc/self/fd/%s",
			         d->d_name);
			ssize_t k = readlink(path, link, sizeof(link) - 1);
			if (k <= 0)
				continue;
			link[k] = '\0';
			sockets += strncmp(link, "socket:", 7) == 0;
			memfds += strncmp(link, "/memfd:", 7) == 0;
		}
	}
	if (dir >= 0)
		close(dir);
	*sockets_out = sockets;
	*memfds_out = memfds;
}

static int forkreg_main(int argc, char **argv)
{
	(void)argc;
	(void)argv;
	pthread_t t;
	if (pthread_create(&t, NULL, registers, NULL) != 0)
		return 1;
	unsigned sockets = 0, memfds = 0;
	for (int i = 0; i < 1000 && !sockets; i++) {
		struct timespec ts = {0, 10 * 1000 * 1000};
		nanosleep(&ts, NULL);
		count_fds(&sockets, &memfds);
	}
	if (!sockets) {
		mt_say("no registration in flight");
		pthread_join(t, NULL);
		return 3;
	}
	fflush(stdout);
	pid_t pid = fork();
	if (pid == 0) {
		char out[96];
		count_fds(&sockets, &memfds);
		int len =
		    snprintf(out, sizeof(out), "child sockets=%u memfds=%u\n",
		             sockets, memfds);
		_exit(write(1, out, (size_t)len) == len ? 0 : 1);
	}
	int st;
	waitpid(pid, &st, 0);
	pthread_join(t, NULL);
	return WIFEXITED(st) ? WEXITSTATUS(st) : 1;
}

const struct mt_sub mt_forkreg = {"forkreg", "", forkreg_main};

static int nostdio_main(int argc, char **argv)
{
	(void)argc;
	(void)argv;
	for (int fd = 0; fd < 3; fd++)
		close(fd);
	char *p = malloc(4 * MIB);
	if (!p)
		return 1;
	mt_touch(p, 4 * MIB);
	mt_flush();
	free(p);
	return 0;
}

const struct mt_sub mt_nostdio = {"nostdio", "", nostdio_main};
