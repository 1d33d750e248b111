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
 * whose figures it can write anyway.
 *
 * A recorded worker that cannot be adopted is dropped, not lost. That
 * happens when its table cannot be reopened, for example by a server
 * without the capability. Its client sees the heartbeat of the header it
 * mapped stop, re-registers at its next flush and carries the total it
 * had published into its new slot.
 */
#include "mts_adopt.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/pidfd.h>
#include <unistd.h>

#include "mts_guard.h"
#include "mts_log.h"
#include "mts_procfs.h"
#include "mts_registry.h"
#include "mts_state.h"
#include "mtshm.h"

/*
 * Find the mapping of `label` (a memfd) in /proc/PID/maps and open it
 * through /proc/PID/map_files. Returns the descriptor or -errno.
 */
static int open_worker_table(uint32_t pid, const char *label)
{
	char path[64], want[128];
	snprintf(path, sizeof(path), "/proc/%u/maps", pid);
	snprintf(want, sizeof(want), "/memfd:%s (deleted)", label);
	FILE *f = fopen(path, "re");
	if (!f)
		return -errno;
	char line[512];
	int fd = -ENOENT;
	while (fgets(line, sizeof(line), f)) {
		size_t n = strlen(line);
		if (n && line[n - 1] == '\n')
			line[--n] = 0;
		const char *name = strstr(line, " /memfd:");
		if (!name || strcmp(name + 1, want) != 0)
			continue;
		char range[64];
		const char *sp = strchr(line, ' ');
		size_t rl = (size_t)(sp - line);
		if (rl >= sizeof(range))
			continue;
		memcpy(range, line, rl);
		range[rl] = 0;
		char mf[128];
		snprintf(mf, sizeof(mf), "/proc/%u/map_files/%s", pid, range);
		fd = open(mf, O_RDWR | O_CLOEXEC);
		if (fd < 0)
			fd = -errno;
		else
			break;
	}
	fclose(f);
	return fd;
}

/* The table of `uid`: already adopted, or reopened from worker `pid`. */
static int table_for(struct mts_registry *reg, uint32_t uid, uint32_t pid,
                     struct mts_table **out)
{
	*out = mts_table_find(reg, uid);
	if (*out)
		return 0;
	char label[96];
	mts_table_label(reg, uid, label, sizeof(label));
	int fd = open_worker_table(pid, label);
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

int mts_adopt(struct mts_registry *reg, uint32_t *kept, uint32_t *dropped)
{
	char q[MTS_LOGQ_MAX], qg[MTS_LOGQ_MAX];
	*kept = *dropped = 0;
	for (uint32_t i = 0; i < reg->slot_count; i++) {
		struct mts_state_rec r;
		if (mts_state_get(reg->state, i, &r) < 0)
			continue;
		uint64_t st = 0;
		char comm[sizeof(((struct mts_adopted *)0)->comm)];
		int pidfd = -1;
		/* Open the pidfd first, then check the start time: if the
		 * pid was reused in between, the start time says so. */
		if (r.pid <= INT32_MAX)
			pidfd = pidfd_open((pid_t)r.pid, 0);
		if (pidfd < 0 ||
		    mts_read_stat((pid_t)r.pid, &st, comm, sizeof(comm)) < 0 ||
		    st != r.start_time) {
			if (pidfd >= 0)
				close(pidfd);
			mts_state_clear(reg->state, i);
			++*dropped;
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
		int err = table_for(reg, r.uid, r.pid, &table);
		if (err < 0) {
			close(pidfd);
			mts_state_clear(reg->state, i);
			++*dropped;
			mts_log_uid(
			    r.uid, MTS_LOG_WARN,
			    "cannot reopen a live worker's slot table; it "
			    "re-registers at its next flush, keeping its count",
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
			mts_log_uid(r.uid, MTS_LOG_WARN, "cannot adopt worker",
			            "slot=%u pid=%u err=%s", i, r.pid,
			            strerror(-err));
			continue;
		}
		++*kept;
		mts_log_uid(
		    r.uid, MTS_LOG_INFO, "worker adopted",
		    "pid=%u uid=%u slot=%u group=%s task=%s", r.pid, r.uid, i,
		    mts_logq(q, sizeof(q), a.group[0] ? a.group : "default"),
		    mts_logq(qg, sizeof(qg), a.task));
	}
	mts_registry_rebuild_free(reg);
	return 0;
}
