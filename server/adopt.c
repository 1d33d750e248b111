/*
 * adopt.c - restart without loss: take over the workers a previous
 * memtallyd left behind, with their counts.
 *
 * A worker never notices a server restart, because its lanes are in its
 * uid's slot table, which lives as long as some worker maps it. A new
 * server needs (1) who those workers are and (2) the tables themselves.
 *
 * (1) comes from the restart record (state.c), a file only the server's
 * uid can write. Nothing a worker wrote is used to decide who is adopted.
 * A record is taken only if its pid is alive with the recorded start time,
 * checked after a pidfd is opened, as at registration. Pids are reused,
 * start times are not. So a forged slot cannot make an unrelated process
 * a target of enforcement.
 *
 * (2) comes from the workers' own mappings. The table of uid U is the
 * memfd "<label>-slots:<instance>:<U>" that a live recorded worker of U
 * maps, and /proc/PID/map_files gives a descriptor of it. That needs
 * CAP_CHECKPOINT_RESTORE or CAP_SYS_ADMIN, and, for another user's
 * process, CAP_SYS_PTRACE and CAP_DAC_READ_SEARCH. A root memtallyd has
 * them, and the systemd unit keeps them in its bounding set. The table is
 * mapped only if it is sealed against resizing and exactly the size the
 * layout says, like any table. A worker could map a table of its own
 * making under that name. It would only be believed for its own uid,
 * whose figures it can write anyway; and a recorded worker whose uid is
 * no longer the recorded one (it called setuid without exec) is dropped,
 * so it cannot hand the recorded uid a table of its new uid's making.
 *
 * A worker's maps are its own to arrange, and a restart must not wait on
 * them. A mapping is considered only if its device is the memfds' (the
 * server's own header's): a regular file named to look like a table, a
 * file under a read lease (whose open would wait for the lease break) or
 * on a FUSE mount (whose open waits on its daemon) is not one. The open
 * is non-blocking, and the file opened is checked to be on that device.
 * Reading /proc/PID/maps waits for the process's mmap lock, which it can
 * hold for as long as it likes, and the mapping can be swapped between
 * the read and the open. So the lookup and open run on a thread of their
 * own, waited on for MTS_ADOPT_OPEN_MS at most. A uid whose open did not
 * finish in time is not tried again, and after MTS_ADOPT_STALLS_MAX such
 * waits, or as long in all, no table is reopened: their workers
 * re-register.
 *
 * A recorded worker that cannot be adopted is dropped, not lost. That
 * happens when its table cannot be reopened, for example by a server
 * without the capability. Its client sees the heartbeat of the header it
 * mapped stop (at a flush, or its refresh thread's round), re-registers
 * and carries the total it had published into its new slot.
 */
#include "mts_adopt.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/pidfd.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include "mts_admit.h"
#include "mts_guard.h"
#include "mtcommon.h"
#include "mts_log.h"
#include "mts_procfs.h"
#include "mts_registry.h"
#include "mts_state.h"
#include "mts_vouch.h"
#include "mtshm.h"

/* How long a restart waits for one worker's table to open, and for how
 * many such waits in all. */
#define MTS_ADOPT_OPEN_MS    2000
#define MTS_ADOPT_STALLS_MAX 4u

/* Field `n` (from 0) of a maps line ("start-end perms offset MAJ:MIN
 * inode path"), or NULL. */
static const char *maps_field(const char *line, int n)
{
	const char *p = line;
	for (int field = 0; field < n; field++) {
		p = strchr(p, ' ');
		if (!p)
			return NULL;
		p++;
	}
	return p;
}

/* The device of a maps line, or 0. */
static uint64_t maps_line_dev(const char *line)
{
	const char *p = maps_field(line, 3);
	if (!p)
		return 0;
	char *end;
	unsigned long maj = strtoul(p, &end, 16);
	if (*end != ':')
		return 0;
	unsigned long min = strtoul(end + 1, &end, 16);
	if (*end != ' ')
		return 0;
	return makedev(maj, min);
}

/* "start-end" of a maps line, hex digits only: anything else is not the
 * kernel's range (a path the worker chose, a line read in parts). */
static bool range_ok(const char *r, size_t len)
{
	size_t dash = 0;
	for (size_t i = 0; i < len; i++) {
		char c = r[i];
		if (c == '-' && !dash && i > 0)
			dash = i;
		else if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f')))
			return false;
	}
	return dash && dash + 1 < len;
}

/* The inode of a maps line (its fifth field), or 0. */
static uint64_t maps_line_ino(const char *line)
{
	const char *p = maps_field(line, 4);
	if (!p)
		return 0;
	char *end;
	unsigned long long ino = strtoull(p, &end, 10);
	return end != p && *end == ' ' ? ino : 0;
}

/*
 * Find the mapping of `label` (a memfd on device `dev`) in /proc/PID/maps
 * and open it through /proc/PID/map_files. Returns the descriptor or
 * -errno.
 *
 * The worker chooses the paths in its maps, so a line is believed only
 * whole (read to its newline: a line read in parts once let a path's tail
 * pass for a line, whose "range" ../root/proc/self/fd/N opened one of
 * memtallyd's own descriptors, another uid's table, for the worker's
 * uid), its range only the kernel's form, and what opened only if it is
 * that very memfd: the inode the line names, and the name the kernel
 * gives the descriptor.
 */
static int open_worker_table(uint32_t pid, const char *label, uint64_t dev)
{
	char path[64], want[128];
	snprintf(path, sizeof(path), "/proc/%u/maps", pid);
	snprintf(want, sizeof(want), "/memfd:%s (deleted)", label);
	FILE *f = fopen(path, "re");
	if (!f)
		return -errno;
	char *line = NULL;
	size_t cap = 0;
	ssize_t got;
	int fd = -ENOENT;
	while ((got = getline(&line, &cap, f)) > 0) {
		size_t n = (size_t)got;
		if (line[n - 1] != '\n')
			continue; /* not a whole line */
		line[--n] = 0;
		const char *name = strstr(line, " /memfd:");
		if (!name || strcmp(name + 1, want) != 0 ||
		    maps_line_dev(line) != dev)
			continue;
		const char *sp = strchr(line, ' ');
		size_t rl = (size_t)(sp - line);
		uint64_t ino = maps_line_ino(line);
		char range[64];
		if (rl >= sizeof(range) || !range_ok(line, rl) || !ino)
			continue;
		memcpy(range, line, rl);
		range[rl] = 0;
		char mf[128];
		snprintf(mf, sizeof(mf), "/proc/%u/map_files/%s", pid, range);
		fd = open(mf, O_RDWR | O_NONBLOCK | O_CLOEXEC);
		if (fd < 0) {
			fd = -errno;
			continue;
		}
		/* The mapping may have been replaced since the line was
		 * read; and it must be the memfd the line names. */
		struct stat st;
		char self[64], is[160];
		snprintf(self, sizeof(self), "/proc/self/fd/%d", fd);
		ssize_t il = readlink(self, is, sizeof(is) - 1);
		if (il > 0)
			is[il] = 0;
		if (fstat(fd, &st) == 0 && S_ISREG(st.st_mode) &&
		    (uint64_t)st.st_dev == dev && (uint64_t)st.st_ino == ino &&
		    il > 0 && strcmp(is, want) == 0)
			break;
		close(fd);
		fd = -ENOENT;
	}
	free(line);
	fclose(f);
	return fd;
}

/* One open_worker_table() on a thread of its own. Owned by that thread
 * and the restart until both let go (`refs`). */
struct table_open {
	atomic_int refs;
	atomic_bool abandoned;
	int efd;       /* written once the open is done */
	atomic_int fd; /* its result: released before the eventfd's write
	                * (which no sanitizer sees as a hand-over) */
	uint32_t pid;
	uint64_t dev;
	char label[96];
};

static void table_open_drop(struct table_open *t)
{
	if (atomic_fetch_sub(&t->refs, 1) != 1)
		return;
	int fd = atomic_load(&t->fd);
	if (atomic_load(&t->abandoned) && fd >= 0)
		close(fd);
	close(t->efd);
	free(t);
}

static void *table_opener(void *arg)
{
	struct table_open *t = arg;
	atomic_store_explicit(&t->fd,
	                      open_worker_table(t->pid, t->label, t->dev),
	                      memory_order_release);
	eventfd_write(t->efd, 1);
	table_open_drop(t);
	return NULL;
}

/* open_worker_table(), given up after wait_ns (-ETIMEDOUT). */
static int open_worker_table_bounded(uint32_t pid, const char *label,
                                     uint64_t dev, uint64_t wait_ns)
{
	struct table_open *t = calloc(1, sizeof(*t));
	if (!t)
		return -ENOMEM;
	t->efd = eventfd(0, EFD_CLOEXEC);
	if (t->efd < 0) {
		free(t);
		return -errno;
	}
	atomic_init(&t->refs, 2);
	atomic_init(&t->abandoned, false);
	atomic_init(&t->fd, -ETIMEDOUT);
	t->pid = pid;
	t->dev = dev;
	snprintf(t->label, sizeof(t->label), "%s", label);
	int err = mt_thread_detached(NULL, table_opener, t, 128u * 1024u, NULL);
	if (err) {
		close(t->efd);
		free(t);
		return err;
	}
	uint64_t end = mts_now_monotonic() + wait_ns;
	struct pollfd pfd = {.fd = t->efd, .events = POLLIN};
	int fd = -ETIMEDOUT;
	for (;;) {
		uint64_t now = mts_now_monotonic();
		if (now >= end)
			break;
		int n = poll(&pfd, 1, (int)((end - now) / 1000000u) + 1);
		if (n > 0) {
			fd = atomic_load_explicit(&t->fd, memory_order_acquire);
			break;
		}
		if (n < 0 && errno != EINTR)
			break;
	}
	if (fd == -ETIMEDOUT)
		atomic_store(&t->abandoned, true);
	table_open_drop(t);
	return fd;
}

/* uids whose table's open did not finish in time: not tried again; and
 * the time all opens may still take. A lookup that fails just within its
 * wait (a worker holding its mmap lock 1.9 s, then no table found) marks
 * no uid, but spends this: 512 such workers would otherwise hold the
 * restart for a quarter of an hour. */
struct stalls {
	uint32_t uid[MTS_ADOPT_STALLS_MAX];
	uint32_t n;
	uint64_t left_ns;
};

static bool stalled(const struct stalls *s, uint32_t uid)
{
	if (s->n >= MTS_ADOPT_STALLS_MAX || s->left_ns == 0)
		return true;
	for (uint32_t i = 0; i < s->n; i++)
		if (s->uid[i] == uid)
			return true;
	return false;
}

/* The table of `uid`: already adopted, or reopened from worker `pid`. */
static int table_for(struct mts_registry *reg, uint32_t uid, uint32_t pid,
                     struct stalls *stalls, struct mts_table **out)
{
	*out = mts_table_find(reg, uid);
	if (*out)
		return 0;
	if (stalled(stalls, uid))
		return -ETIMEDOUT;
	char label[96];
	mts_table_label(reg, uid, label, sizeof(label));
	uint64_t wait = (uint64_t)MTS_ADOPT_OPEN_MS * 1000000u;
	if (wait > stalls->left_ns)
		wait = stalls->left_ns;
	uint64_t t0 = mts_now_monotonic();
	int fd = open_worker_table_bounded(pid, label, reg->map->dev, wait);
	uint64_t took = mts_now_monotonic() - t0;
	stalls->left_ns = took < stalls->left_ns ? stalls->left_ns - took : 0;
	if (fd == -ETIMEDOUT)
		stalls->uid[stalls->n++] = uid;
	if (fd < 0)
		return fd;
	struct mtshm_map map;
	int err =
	    mtshm_map_fd(fd, MTSHM_SEALS_TABLE, reg->layout.table_size, &map);
	if (err) {
		close(fd);
		return err;
	}
	map.fd = fd; /* kept: handed to the uid's workers */
	if ((err = mts_table_adopt(reg, uid, &map)) < 0) {
		mtshm_close(&map);
		return err;
	}
	*out = mts_table_find(reg, uid);
	return 0;
}

void mts_adopt_resume_held(struct mts_state *st, uint32_t slots)
{
	for (uint32_t i = 0; i < slots; i++) {
		struct mts_state_rec r;
		if (mts_state_get(st, i, &r) < 0 || !r.held ||
		    r.pid > INT32_MAX)
			continue;
		uint64_t start = 0;
		char comm[32];
		int pidfd = pidfd_open((pid_t)r.pid, 0);
		if (pidfd < 0)
			continue;
		/* As adoption checks it: the pidfd first, then the start
		 * time, so a reused pid is never signalled. */
		/* Whatever its uid now: a worker that left its uid since is
		 * the same process, and stays stopped for ever otherwise. */
		if (mts_read_stat((pid_t)r.pid, &start, comm, sizeof(comm)) ==
		        0 &&
		    start == r.start_time)
			mts_guard_resume_adopted(r.pid, pidfd);
		close(pidfd);
	}
}

/* The trusted uids live workers left without exec while no server ran,
 * each with its uid now: those workers still map their windows on the
 * uids' tables (vouch.c). */
struct leavers {
	uint32_t *uid, *now_uid;
	uint32_t n, cap;
	bool lost; /* one not remembered (no memory): taint every table */
};

static void leaver_add(struct leavers *l, uint32_t uid, uint32_t now_uid)
{
	for (uint32_t i = 0; i < l->n; i++)
		if (l->uid[i] == uid)
			return;
	if (l->n == l->cap) {
		uint32_t cap = l->cap ? 2 * l->cap : 8;
		uint32_t *u = realloc(l->uid, cap * sizeof(*u));
		if (u)
			l->uid = u;
		uint32_t *v = u ? realloc(l->now_uid, cap * sizeof(*v)) : NULL;
		if (v)
			l->now_uid = v;
		if (!u || !v) {
			l->lost = true;
			return;
		}
		l->cap = cap;
	}
	l->uid[l->n] = uid;
	l->now_uid[l->n++] = now_uid;
}

/* Taint the tables they left, once adopted: the processes adopted in them
 * are untrusted (a table not adopted is a new one, out of their reach). */
static void leavers_taint(struct mts_registry *reg, struct leavers *l)
{
	for (uint32_t i = 0; i < reg->ntables; i++) {
		struct mts_table *t = reg->tables[i];
		for (uint32_t k = 0; k < l->n; k++)
			if (l->uid[k] == t->uid)
				mts_table_taint(reg, t, l->now_uid[k]);
		if (l->lost && t->vouch.trusted)
			mts_table_taint(reg, t, t->uid);
	}
	mts_vouch_taint_apply(reg);
	free(l->uid);
	free(l->now_uid);
}

int mts_adopt(struct mts_registry *reg, uint32_t *kept, uint32_t *dropped)
{
	struct leavers left = {0};
	char q[MTS_LOGQ_MAX], qg[MTS_LOGQ_MAX];
	struct stalls stalls = {
	    .n = 0,
	    .left_ns =
	        (uint64_t)MTS_ADOPT_STALLS_MAX * MTS_ADOPT_OPEN_MS * 1000000u,
	};
	*kept = *dropped = 0;
	for (uint32_t i = 0; i < reg->slot_count; i++) {
		struct mts_state_rec r;
		if (mts_state_get(reg->state, i, &r) < 0)
			continue;
		uint64_t st = 0;
		char comm[sizeof(((struct mts_adopted *)0)->comm)];
		int pidfd = -1;
		uint32_t ruid = 0, euid = 0;
		/* Open the pidfd first, then check the start time: if the
		 * pid was reused in between, the start time says so. A
		 * worker that changed its uid since it registered registers
		 * again, as what it is now. */
		if (r.pid <= INT32_MAX)
			pidfd = pidfd_open((pid_t)r.pid, 0);
		bool same =
		    pidfd >= 0 &&
		    mts_read_stat((pid_t)r.pid, &st, comm, sizeof(comm)) == 0 &&
		    st == r.start_time;
		bool uids =
		    same && mts_read_uids((pid_t)r.pid, &ruid, &euid) == 0;
		if (!uids || euid != r.uid) {
			/* Alive, the same process, no longer its trusted
			 * uid (real and effective): it registers again as
			 * what it is now. */
			if (uids && mts_uid_trusted(reg, r.uid) &&
			    !mts_uid_trusted(reg, euid) &&
			    !mts_uid_trusted(reg, ruid))
				leaver_add(&left, r.uid, euid);
			/* Paused by the guard of the memtallyd before: it
			 * goes on, whatever its uid now (it would stay
			 * stopped for ever). Its task's reservations wait
			 * for its registration as what it is now. */
			if (same && r.held)
				mts_guard_resume_adopted(r.pid, pidfd);
			if (same) {
				mts_task_awaited(reg, r.task, r.pid,
				                 r.start_time);
				mts_registry_keep_limit(
				    reg, r.pid, r.start_time, r.limit_set);
			}
			if (pidfd >= 0)
				close(pidfd);
			mts_state_clear(reg->state, i);
			++*dropped;
			if (same)
				mts_log_uid(r.uid, MTS_LOG_INFO,
				            "a live worker changed its uid: it "
				            "registers again as what it is now",
				            "slot=%u pid=%u euid=%u", i, r.pid,
				            euid);
			else
				mts_log_uid(r.uid, MTS_LOG_INFO,
				            "slot of a dead worker reclaimed",
				            "slot=%u pid=%u", i, r.pid);
			continue;
		}
		/* Paused by the node guard of a memtallyd that died
		 * holding it: it goes on, adopted or not. */
		if (r.held) {
			mts_guard_resume_adopted(r.pid, pidfd);
			r.held = 0;
			mts_state_put(reg->state, i, &r);
		}
		struct mts_table *table;
		int err = table_for(reg, r.uid, r.pid, &stalls, &table);
		if (err < 0) {
			close(pidfd);
			mts_state_clear(reg->state, i);
			++*dropped;
			/* Its task's reservations wait for it, and its
			 * per-pid limit is its own again when it does. */
			mts_task_awaited(reg, r.task, r.pid, r.start_time);
			mts_registry_keep_limit(reg, r.pid, r.start_time,
			                        r.limit_set);
			mts_log_uid(
			    r.uid, MTS_LOG_WARN,
			    "cannot reopen a live worker's slot table; it "
			    "re-registers once it sees the restart, keeping "
			    "its count",
			    "slot=%u pid=%u uid=%u err=%s", i, r.pid, r.uid,
			    mtshm_strerror(err));
			continue;
		}
		struct mts_adopted a = {
		    .slot = i,
		    .pid = r.pid,
		    .uid = r.uid,
		    .start_time = st,
		    .pidfd = pidfd,
		    .image_id = r.image_id,
		    .registered_ns = r.registered_ns,
		    .slot_gen = r.slot_gen,
		};
		snprintf(a.group, sizeof(a.group), "%s", r.group);
		snprintf(a.task, sizeof(a.task), "%s", r.task);
		a.limit_set = r.limit_set;
		snprintf(a.comm, sizeof(a.comm), "%s", comm);
		a.exec_mark = r.exec_mark;
		snprintf(a.registered_comm, sizeof(a.registered_comm), "%.*s",
		         (int)sizeof(r.comm) - 1, r.comm);
		a.image_stale = r.image_stale != 0;
		err = mts_registry_adopt_slot(reg, &a, table);
		if (err < 0) {
			/* -EAGAIN: the poll could not start and the registry
			 * closed the pidfd. Otherwise out of memory or a bad
			 * name. Either way the worker re-registers when it
			 * sees the heartbeat stale. */
			if (err != -EAGAIN)
				close(pidfd);
			mts_state_clear(reg->state, i);
			mts_table_gc(reg, table);
			++*dropped;
			mts_task_awaited(reg, r.task, r.pid, r.start_time);
			mts_registry_keep_limit(reg, r.pid, r.start_time,
			                        r.limit_set);
			mts_log_uid(r.uid, MTS_LOG_WARN, "cannot adopt worker",
			            "slot=%u pid=%u err=%s", i, r.pid,
			            strerror(-err));
			continue;
		}
		++*kept;
		/* Its table was tainted under the server before: it is
		 * again, whether the leaver is still there or not (gone, or
		 * registered again as what it is now). */
		if (r.tainted)
			leaver_add(&left, r.uid, r.taint_uid);
		mts_log_uid(
		    r.uid, MTS_LOG_INFO, "worker adopted",
		    "pid=%u uid=%u slot=%u group=%s task=%s", r.pid, r.uid, i,
		    mts_logq(q, sizeof(q), a.group[0] ? a.group : "default"),
		    mts_logq(qg, sizeof(qg), a.task));
	}
	mts_registry_rebuild_free(reg);
	/* A held slot's worker (its record entry lost) may run a task whose
	 * reservation was restored taken over: it waits for the worker. */
	for (uint32_t k = 0; k < reg->nheld; k++)
		mts_task_awaited_held(reg, reg->held[k].uid, reg->held[k].pid,
		                      reg->held[k].start_time);
	leavers_taint(reg, &left);
	return 0;
}
