/*
 * procfs.c - the facts memtallyd reads from /proc. At registration it
 * reads a process's start time, its identity across pid reuse, and its
 * comm, for humans. Every rss_interval rss.c reads its memory from
 * /proc/PID/status (smaps_rollup for an untrusted process) on a thread of
 * its own, through a live thread's /proc/PID/task/TID when the main
 * thread has exited.
 *
 * /proc/PID/stat is "pid (comm) state ppid ...", and the process chooses
 * its comm, which may hold spaces, ')' and newlines. The only safe anchor
 * is the LAST ')' in the file. Fields 3.. follow it, space-separated. The
 * stat read is a small read of a pseudo-file, done on the loop once per
 * registration.
 */
#include "mts_procfs.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* ppid is field 4, starttime 22; fields after ')' start at 3. */
#define PPID_FIELD             4
#define STARTTIME_FIELD        22
#define FIRST_FIELD_AFTER_COMM 3

/* arg_start: where the program's arguments begin, placed anew (and
 * randomised) by each exec. */
#define ARG_START_FIELD 48

int mts_parse_stat_starttime(const char *stat, uint64_t *out)
{
	return mts_parse_stat_field(stat, STARTTIME_FIELD, out);
}

int mts_parse_stat_field(const char *stat, int want, uint64_t *out)
{
	const char *p = strrchr(stat, ')');
	if (!p || want < FIRST_FIELD_AFTER_COMM)
		return -EINVAL;
	p++;
	for (int field = FIRST_FIELD_AFTER_COMM; field <= want; field++) {
		if (*p != ' ')
			return -EINVAL;
		while (*p == ' ')
			p++;
		if (*p == '\0')
			return -EINVAL;
		if (field == want) {
			if (*p < '0' || *p > '9')
				return -EINVAL;
			char *end;
			errno = 0;
			unsigned long long v = strtoull(p, &end, 10);
			if (errno ||
			    (*end != ' ' && *end != '\n' && *end != '\0'))
				return -EINVAL;
			*out = v;
			return 0;
		}
		while (*p && *p != ' ')
			p++;
	}
	return -EINVAL;
}

ssize_t mts_read_small(const char *dir, const char *name, char *buf, size_t cap)
{
	char path[600];
	if ((size_t)snprintf(path, sizeof(path), "%s/%s", dir, name) >=
	    sizeof(path))
		return -ENAMETOOLONG;
	int fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return -errno;
	size_t len = 0;
	while (len < cap - 1) {
		ssize_t r = read(fd, buf + len, cap - 1 - len);
		if (r < 0 && errno == EINTR)
			continue;
		if (r < 0) {
			int err = -errno;
			close(fd);
			return err;
		}
		if (r == 0)
			break;
		len += (size_t)r;
	}
	close(fd);
	buf[len] = '\0';
	return (ssize_t)len;
}

ssize_t mts_read_proc_file(pid_t pid, const char *name, char *buf, size_t cap)
{
	char dir[32];
	snprintf(dir, sizeof(dir), "/proc/%d", (int)pid);
	return mts_read_small(dir, name, buf, cap);
}

ssize_t mts_read_short_lines(int fd, char *buf, size_t cap)
{
	if (cap == 0)
		return -EINVAL;
	char chunk[4096];
	size_t len = 0, line = 0; /* line: where the current line starts */
	bool skip = false;        /* in a line left out, to its newline */
	for (;;) {
		ssize_t r = read(fd, chunk, sizeof(chunk));
		if (r < 0 && errno == EINTR)
			continue;
		if (r < 0)
			return -errno;
		if (r == 0)
			break;
		for (ssize_t i = 0; i < r; i++) {
			char c = chunk[i];
			if (skip) {
				skip = c != '\n';
				continue;
			}
			if (len + 1 >= cap ||
			    (c != '\n' && len - line >= MTS_PROC_LINE_MAX)) {
				len = line; /* this line goes */
				skip = c != '\n';
				continue;
			}
			buf[len++] = c;
			if (c == '\n')
				line = len;
		}
	}
	/* A last line without its newline (cut short) is kept. */
	buf[len] = '\0';
	return (ssize_t)len;
}

static ssize_t read_status_at(const char *path, char *buf, size_t cap)
{
	int fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return -errno;
	ssize_t n = mts_read_short_lines(fd, buf, cap);
	close(fd);
	return n;
}

ssize_t mts_read_proc_status(pid_t pid, char *buf, size_t cap)
{
	char path[32];
	snprintf(path, sizeof(path), "/proc/%d/status", (int)pid);
	return read_status_at(path, buf, cap);
}

ssize_t mts_read_thread_file(pid_t pid, pid_t tid, const char *name, char *buf,
                             size_t cap)
{
	char dir[64];
	snprintf(dir, sizeof(dir), "/proc/%d/task/%d", (int)pid, (int)tid);
	return mts_read_small(dir, name, buf, cap);
}

ssize_t mts_read_thread_status(pid_t pid, pid_t tid, char *buf, size_t cap)
{
	char path[64];
	snprintf(path, sizeof(path), "/proc/%d/task/%d/status", (int)pid,
	         (int)tid);
	return read_status_at(path, buf, cap);
}

pid_t mts_live_thread(pid_t pid)
{
	char path[48];
	snprintf(path, sizeof(path), "/proc/%d/task", (int)pid);
	/* open, then fdopendir, as rss.c's descriptor walk does: it runs on
	 * the reader thread while the loop closes and accepts sockets, and
	 * the descriptor must be known as created here (ThreadSanitizer
	 * sees opendir's own open as no creation, and the reuse of a number
	 * the loop closed as a race). */
	int fd = open(path, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	if (fd < 0)
		return -ESRCH;
	DIR *d = fdopendir(fd);
	if (!d) {
		close(fd);
		return -ESRCH;
	}
	pid_t tid = -ESRCH;
	struct dirent *e;
	while (tid < 0 && (e = readdir(d))) {
		char *end;
		long t = strtol(e->d_name, &end, 10);
		if (*end == '\0' && t > 0 && t <= INT32_MAX && t != pid)
			tid = (pid_t)t;
	}
	closedir(d);
	return tid;
}

int mts_parse_stat_comm(const char *stat, char *buf, size_t cap)
{
	if (cap == 0)
		return -EINVAL;
	buf[0] = '\0';
	const char *open = strchr(stat, '(');
	const char *close = strrchr(stat, ')');
	if (!open || !close || close < open)
		return -EINVAL;
	size_t len = (size_t)(close - open - 1);
	if (len > cap - 1)
		len = cap - 1;
	memcpy(buf, open + 1, len);
	buf[len] = '\0';
	return 0;
}

/* /proc/PID/stat's text into buf[cap], and its start time. comm is at
 * most 64 bytes on current kernels; 52 numeric fields follow: 2 KiB holds
 * it all with room to spare. 0 or -errno. */
#define STAT_TEXT_MAX 2048
static int read_stat_text(pid_t pid, char *buf, uint64_t *start_time)
{
	ssize_t n = mts_read_proc_file(pid, "stat", buf, STAT_TEXT_MAX);
	if (n < 0)
		return (int)n;
	/* An embedded NUL would hide the tail from strrchr: refuse. */
	if (strlen(buf) != (size_t)n)
		return -EINVAL;
	return mts_parse_stat_starttime(buf, start_time);
}

int mts_read_stat(pid_t pid, uint64_t *start_time, char *comm, size_t cap)
{
	if (comm && cap)
		comm[0] = '\0';
	char buf[STAT_TEXT_MAX];
	int err = read_stat_text(pid, buf, start_time);
	if (err == 0 && comm)
		mts_parse_stat_comm(buf, comm, cap);
	return err;
}

int mts_read_exec_mark(pid_t pid, uint64_t *start_time, uint64_t *mark)
{
	char buf[STAT_TEXT_MAX];
	int err = read_stat_text(pid, buf, start_time);
	if (err == 0)
		err = mts_parse_stat_field(buf, ARG_START_FIELD, mark);
	return err;
}

int mts_read_parent(pid_t pid, uint32_t *ppid, uint64_t *start_time)
{
	char buf[STAT_TEXT_MAX];
	uint64_t pp;
	int err = read_stat_text(pid, buf, start_time);
	if (err == 0)
		err = mts_parse_stat_field(buf, PPID_FIELD, &pp);
	if (err == 0 && pp > UINT32_MAX)
		err = -EINVAL;
	if (err == 0)
		*ppid = (uint32_t)pp;
	return err;
}

int mts_read_starttime(pid_t pid, uint64_t *out)
{
	return mts_read_stat(pid, out, NULL, 0);
}

/* One uid of a Uid: line at *p, moved past it. 0 or -EINVAL. */
static int uid_field(const char **p, uint32_t *out)
{
	while (**p == ' ' || **p == '\t')
		(*p)++;
	if (**p < '0' || **p > '9')
		return -EINVAL;
	char *end;
	errno = 0;
	unsigned long v = strtoul(*p, &end, 10);
	if (errno || v > UINT32_MAX || (*end != '\t' && *end != ' '))
		return -EINVAL;
	*out = (uint32_t)v;
	*p = end;
	return 0;
}

int mts_read_uids(pid_t pid, uint32_t *real, uint32_t *effective)
{
	char buf[4096];
	ssize_t n = mts_read_proc_status(pid, buf, sizeof(buf));
	if (n < 0)
		return (int)n;
	uint32_t u[2];
	int err = mts_parse_uid_fields(buf, u, 2);
	if (err == 0) {
		*real = u[0];
		if (effective)
			*effective = u[1];
	}
	return err;
}

int mts_parse_uid_fields(const char *status, uint32_t *uids, unsigned n)
{
	const char *p = strstr(status, "\nUid:");
	if (!p)
		return -EINVAL;
	p += 5;
	for (unsigned i = 0; i < n; i++) {
		int err = uid_field(&p, &uids[i]);
		if (err < 0)
			return err;
	}
	return 0;
}

int mts_read_real_uid(pid_t pid, uint32_t *out)
{
	return mts_read_uids(pid, out, NULL);
}

int mts_read_state_ppid(pid_t pid, char *state, uint32_t *ppid)
{
	char buf[512];
	ssize_t n = mts_read_proc_file(pid, "stat", buf, sizeof(buf));
	if (n < 0)
		return (int)n;
	const char *rp = strrchr(buf, ')'); /* comm may hold anything */
	unsigned pp = 0;
	char st = 0;
	if (!rp || sscanf(rp + 1, " %c %u", &st, &pp) != 2)
		return -EINVAL;
	*state = st;
	*ppid = pp;
	return 0;
}

int mts_add_ancestors(uint32_t pid, uint32_t *set, uint32_t *n, uint32_t cap)
{
	char state;
	uint32_t pp;
	if (mts_read_state_ppid((pid_t)pid, &state, &pp) < 0)
		return -ESRCH;
	for (uint32_t i = 0; i < MTS_ANCESTRY_MAX && pp > 1; i++) {
		for (uint32_t j = 0; j < *n; j++)
			if (set[j] == pp)
				return 0;
		if (*n == cap)
			return -ENOSPC;
		uint32_t gp, again;
		if (mts_read_state_ppid((pid_t)pp, &state, &gp) < 0 ||
		    mts_read_state_ppid((pid_t)pid, &state, &again) < 0 ||
		    again != pp)
			return -ESRCH;
		set[(*n)++] = pp;
		pid = pp;
		pp = gp;
	}
	return 0;
}

/* The next number of a statm line at *p, and past its separator. */
static int statm_field(const char **p, unsigned long long *out)
{
	char *end;
	if (**p < '0' || **p > '9')
		return -EINVAL;
	errno = 0;
	*out = strtoull(*p, &end, 10);
	if (errno || (*end != ' ' && *end != '\n' && *end != '\0'))
		return -EINVAL;
	*p = *end == ' ' ? end + 1 : end;
	return 0;
}

int mts_parse_statm_rss(const char *statm, uint64_t page_size, uint64_t *rss,
                        uint64_t *anon)
{
	/* "size resident shared text lib data dt", in pages; `shared` is
	 * the resident file and shmem pages, so resident - shared is the
	 * anonymous part (RssAnon). */
	const char *p = statm;
	unsigned long long size, res, shared = 0;
	if (statm_field(&p, &size) || *p == '\n' || *p == '\0' ||
	    statm_field(&p, &res))
		return -EINVAL;
	if (anon && statm_field(&p, &shared))
		return -EINVAL;
	uint64_t bytes;
	if (__builtin_mul_overflow((uint64_t)res, page_size, &bytes))
		return -EINVAL;
	*rss = bytes;
	if (anon)
		*anon = shared < res ? (uint64_t)(res - shared) * page_size : 0;
	return 0;
}
