/*
 * adopt.c - restart without loss: take over the segment a previous
 * memtallyd left behind, with the live workers still writing into it.
 *
 * A worker never notices a server restart: its lanes are in shared memory,
 * not in the server. So a new server that finds a compatible segment keeps
 * it (same object, same generation) and rebuilds its registry from the
 * slots: a slot whose pid is alive with the start time recorded in the
 * slot is the same process (pids are reused, start times are not) and is
 * adopted with a fresh pidfd; any other slot is reclaimed. Group, task and
 * image id come from the per-slot names region (layout 1.1); a 1.0
 * segment has none, and its workers are adopted into group "default".
 *
 * Identity read back from the segment is only used to *find* candidates:
 * each one is checked against /proc before it is trusted, as at
 * registration. What cannot be adopted (a segment of another layout, a
 * corrupt header) is replaced, and its workers re-register at their next
 * flush when they see its heartbeat stop.
 */
#include "server.h"

#include <errno.h>
#include <string.h>
#include <sys/pidfd.h>
#include <unistd.h>

#include "log.h"

/* Copy a NUL-terminated name out of a fixed shared field, never trusting
 * it to be terminated. */
static void copy_name(char *dst, size_t cap, const char *src, size_t srccap)
{
	size_t n = strnlen(src, srccap);
	if (n >= cap)
		n = cap - 1;
	memcpy(dst, src, n);
	dst[n] = 0;
}

int mts_segment_setup(const struct mts_config *cfg, struct mtshm_map *map,
		      bool *adopted)
{
	char q[MTS_LOGQ_MAX];
	*adopted = false;
	if (!cfg->reset) {
		int err = mtshm_open(cfg->segment, 1, map);
		if (err == 0) {
			struct mtshm_header *h = map->hdr;
			if (h->slot_count != cfg->slots ||
			    h->lane_count != cfg->lanes)
				mts_log(MTS_LOG_WARN,
					"adopting the segment with its own "
					"geometry (--reset to apply the "
					"configured one)",
					"segment=%s slots=%u lanes=%u "
					"configured_slots=%u configured_lanes=%u",
					mts_logq(q, sizeof(q), cfg->segment),
					h->slot_count, h->lane_count,
					cfg->slots, cfg->lanes);
			h->server_pid = (uint32_t)getpid();
			h->server_uid = (uint32_t)getuid();
			mt_store_relaxed64(&h->threshold, cfg->threshold);
			*adopted = true;
			return 0;
		}
		if (err != -ENOENT)
			mts_log(MTS_LOG_WARN,
				"existing segment cannot be adopted, "
				"replacing it",
				"segment=%s err=%s",
				mts_logq(q, sizeof(q), cfg->segment),
				mtshm_strerror(err));
	}
	struct mtshm_params params = {
		.slots = cfg->slots,
		.lanes = cfg->lanes,
		.threshold = cfg->threshold,
		.mode = 0660,
		.gid = cfg->has_gid ? (int)cfg->gid : -1,
	};
	return mtshm_create(cfg->segment, &params, map);
}

int mts_adopt(struct mts_registry *reg, uint32_t *kept, uint32_t *dropped)
{
	const struct mtshm_map *m = reg->map;
	char q[MTS_LOGQ_MAX], qg[MTS_LOGQ_MAX];
	*kept = *dropped = 0;
	for (uint32_t i = 0; i < m->hdr->slot_count; i++) {
		struct mtshm_slot_id *s = mtshm_slot(m, i);
		uint32_t pid = mt_load_acquire32(&s->pid);
		if (!pid)
			continue;
		uint64_t recorded = mt_load_relaxed64(&s->start_time);
		uint64_t st = 0;
		int pidfd = -1;
		/* Open the pidfd first, then check the start time: if the
		 * pid was reused in between, the start time says so. */
		if (pid <= INT32_MAX)
			pidfd = pidfd_open((pid_t)pid, 0);
		if (pidfd < 0 || mts_read_starttime((pid_t)pid, &st) < 0 ||
		    st != recorded) {
			if (pidfd >= 0)
				close(pidfd);
			mts_registry_drop_slot(reg, i);
			++*dropped;
			mts_log(MTS_LOG_INFO, "slot of a dead worker reclaimed",
				"slot=%u pid=%u", i, pid);
			continue;
		}
		struct mts_adopted a = {
			.slot = i,
			.pid = pid,
			.uid = mt_load_relaxed32(&s->uid),
			.start_time = st,
			.pidfd = pidfd,
		};
		const struct mtshm_slot_names *n = mtshm_names(m, i);
		if (n) {
			a.image_id = n->image_id;
			a.registered_ns = n->registered_ns;
			copy_name(a.group, sizeof(a.group), n->group,
				  sizeof(n->group));
			copy_name(a.task, sizeof(a.task), n->task,
				  sizeof(n->task));
		}
		int err = mts_registry_adopt_slot(reg, &a);
		if (err == -EAGAIN) {
			/* The poll could not start; the registry closed
			 * the pidfd. Free the slot: the worker re-registers
			 * when it sees the heartbeat stale. */
			mts_registry_drop_slot(reg, i);
			++*dropped;
			continue;
		}
		if (err < 0) {
			/* Out of memory or a bad name: let the worker
			 * re-register rather than keep a slot we cannot
			 * track. */
			close(pidfd);
			mts_registry_drop_slot(reg, i);
			++*dropped;
			mts_log(MTS_LOG_WARN, "cannot adopt worker",
				"slot=%u pid=%u err=%s", i, pid,
				strerror(-err));
			continue;
		}
		++*kept;
		mts_log(MTS_LOG_INFO, "worker adopted",
			"pid=%u slot=%u group=%s task=%s", pid, i,
			mts_logq(q, sizeof(q), a.group[0] ? a.group : "default"),
			mts_logq(qg, sizeof(qg), a.task));
	}
	mts_registry_rebuild_free(reg);
	return 0;
}
