/*
 * rss.c - the resident set of every registered worker, read from
 * /proc/PID/statm every rss_interval (1 s by default), not every tick.
 *
 * Reading statm is a small open/read/close, but for thousands of workers
 * that is milliseconds of blocking syscalls, which the loop must not spend
 * between two ticks. So a sweep copies (pid, start time) of every
 * registered process, reads their statm files on the libuv thread pool,
 * and applies the results back on the loop thread to the processes that
 * are still registered with the same pid and start time. Only one sweep is
 * in flight at a time; a timer that fires during one is skipped.
 *
 * The sweep thread touches nothing but its own array: the registry is
 * never read off the loop thread. A process that exits and whose pid is
 * reused during the sweep may have the newcomer's RSS read for it; the
 * start-time check at apply time drops such a result once the registry
 * saw the exit, and otherwise the next sweep corrects it.
 *
 * A newly registered process shows RSS 0 until the next sweep (at most
 * rss_interval later); registration itself reads nothing more from /proc.
 *
 * For a process of an untrusted uid the sweep reads /proc/PID/status
 * instead, which also gives the kernel's figure vouch.c compares its claim
 * with (RssAnon + VmSwap); mts_rss_sweep_vouch() reads just those whose
 * claims ran ahead of it, between two full sweeps.
 *
 * The group and fleet RSS sums move with every change of a process's RSS
 * (mts_proc_set_rss), so they always equal the sum over registered
 * processes, as the accounted bytes do.
 */
#include "mts_rss.h"

#include <errno.h>
#include <stdlib.h>

#include "mts_defs.h"
#include "mts_log.h"
#include "mts_procfs.h"
#include "mts_registry.h"
#include "mts_vouch.h"

struct rss_entry {
	uint32_t pid;
	int err;
	bool kernel; /* an untrusted process: /proc/PID/status, for vouch.c */
	uint64_t start_time;
	uint64_t rss;
	uint64_t anon; /* RssAnon + VmSwap, with `kernel` */
};

struct mts_rss_sweep {
	uv_work_t req; /* req.data = this */
	struct mts_registry *reg;
	uint32_t n;
	struct rss_entry e[];
};

static uint64_t sat_sub(uint64_t a, uint64_t b)
{
	return a > b ? a - b : 0;
}

void mts_proc_set_rss(struct mts_registry *reg, struct mts_proc *p,
                      uint64_t rss)
{
	struct mts_group *g = &reg->groups[p->group];
	g->rss = mt_sat_add(sat_sub(g->rss, p->rss), rss);
	reg->totals.rss = mt_sat_add(sat_sub(reg->totals.rss, p->rss), rss);
	p->rss = rss;
}

/* Read one entry: statm for most, status (which also has the anonymous
 * and swapped figures, at ~2.5x the cost) for untrusted processes. */
static void entry_read(struct rss_entry *e)
{
	if (e->kernel)
		e->err = mts_read_status_mem((int)e->pid, &e->rss, &e->anon);
	else
		e->err = mts_read_rss((pid_t)e->pid, &e->rss);
}

/* Apply a read entry to `p` (same pid and start time). */
static void entry_apply(struct mts_registry *reg, struct mts_proc *p,
                        const struct rss_entry *e)
{
	mts_proc_set_rss(reg, p, e->rss);
	if (e->kernel && p->untrusted) {
		p->vouch.kernel = e->anon;
		p->vouch.kernel_ns = mts_now_monotonic();
		p->vouch.claim_at_read = p->bytes;
	}
}

static void entry_fill(struct rss_entry *e, const struct mts_proc *p)
{
	e->pid = p->pid;
	e->start_time = p->start_time;
	e->err = 0;
	e->kernel = p->untrusted;
	e->rss = 0;
	e->anon = 0;
}

void mts_rss_sweep_sync(struct mts_registry *reg)
{
	for (uint32_t i = 0; i < reg->ndense; i++) {
		struct mts_proc *p = reg->by_slot[reg->dense[i]];
		struct rss_entry e;
		entry_fill(&e, p);
		entry_read(&e);
		if (e.err == 0)
			entry_apply(reg, p, &e);
	}
}

static void sweep_work(uv_work_t *req)
{
	struct mts_rss_sweep *sw = req->data;
	for (uint32_t i = 0; i < sw->n; i++)
		entry_read(&sw->e[i]);
}

static void sweep_done(uv_work_t *req, int status)
{
	struct mts_rss_sweep *sw = req->data;
	struct mts_registry *reg = sw->reg;
	reg->rss->sweep = NULL;
	if (status == 0 && !reg->closed) {
		for (uint32_t i = 0; i < sw->n; i++) {
			const struct rss_entry *e = &sw->e[i];
			if (e->err < 0)
				continue; /* gone: its pidfd says so */
			struct mts_proc *p = mts_find_pid(reg, e->pid);
			if (p && p->start_time == e->start_time)
				entry_apply(reg, p, e);
		}
	}
	free(sw);
}

/* A sweep of every registered process, or (`early`) only of those whose
 * kernel figure vouch.c wants read before the next full sweep. */
static void sweep_start(struct mts_registry *reg, bool early)
{
	if (reg->rss->sweep || reg->closed || reg->ndense == 0)
		return;
	struct mts_rss_sweep *sw =
	    malloc(sizeof(*sw) + (size_t)reg->ndense * sizeof(sw->e[0]));
	if (!sw) {
		mts_log(MTS_LOG_WARN, "out of memory for an RSS sweep", NULL);
		return;
	}
	sw->reg = reg;
	sw->n = 0;
	sw->req.data = sw;
	for (uint32_t i = 0; i < reg->ndense; i++) {
		const struct mts_proc *p = reg->by_slot[reg->dense[i]];
		if (!early || mts_vouch_want_read(p))
			entry_fill(&sw->e[sw->n++], p);
	}
	if (sw->n == 0) {
		free(sw);
		return;
	}
	int err = uv_queue_work(reg->loop, &sw->req, sweep_work, sweep_done);
	if (err < 0) {
		/* No thread pool: read them here rather than never. */
		free(sw);
		mts_rss_sweep_sync(reg);
		return;
	}
	reg->rss->sweep = sw;
}

void mts_rss_sweep_start(struct mts_registry *reg)
{
	sweep_start(reg, false);
}

void mts_rss_want_vouch(struct mts_registry *reg)
{
	reg->rss->vouch_wanted = true;
}

void mts_rss_sweep_vouch(struct mts_registry *reg, uint64_t now_ns)
{
	if (!reg->rss->vouch_wanted ||
	    now_ns - reg->rss->vouch_sweep_ns <
	        (uint64_t)MTS_VOUCH_SWEEP_MS * 1000000u)
		return;
	reg->rss->vouch_wanted = false;
	reg->rss->vouch_sweep_ns = now_ns;
	sweep_start(reg, true);
}
