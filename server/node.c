/*
 * node.c - the node's memory as the kernel sees it, and the node guard's
 * line below its limit: what admission (admit.c) keeps grants under and
 * what the guard (guard.c) evicts past.
 *
 * The figure is what the kernel sees, not what memtally counts. Page
 * cache, processes nobody registered and a worker that understates are all
 * in it. memtallyd may run in a memory cgroup with a limit (a container, a
 * Slurm job, a unit with MemoryMax=), or [guard] cgroup may name one. The
 * figure is then that cgroup's usage (v2 memory.current, v1
 * memory.usage_in_bytes) less its inactive file pages (memory.stat). Those
 * pages are the part the kernel reclaims before it kills anyone, so the
 * rest is the working set kubelet evicts on. Elsewhere the figure is
 * /proc/meminfo's MemTotal less MemAvailable. Of memtallyd's cgroup and
 * its ancestors, the one with the smallest limit is the node, because a
 * Slurm step inside its job, or a container inside its pod, is limited by
 * the enclosing one (and a larger limit inside a smaller one binds
 * nothing).
 *
 * Under strict overcommit (vm.overcommit_memory = 2) the kernel's first
 * edge may be another: it refuses an allocation that would take the
 * machine's commit charge (Committed_AS) past CommitLimit, and most
 * programs die of a NULL malloc long before any page runs out. The node
 * then has two edges, and the guard acts on the one with less room below
 * its line (mts_node_edge). The commit line is [guard] line's fraction
 * of CommitLimit (for a line in bytes, the fraction the memory's line is
 * of its limit). The mode is read at every check, since a sysctl
 * changes it without telling memtallyd.
 *
 * Every MTS_GUARD_CHECK_MS the loop reads three small files of the cgroup
 * (the usage, the limit and memory.stat), or /proc/meminfo, and
 * vm.overcommit_memory (and /proc/meminfo in a cgroup when it is 2). Each
 * read is a small open, read and close, a small share of the loop's core;
 * memtally_guard_read_seconds_total in /metrics shows what they cost.
 * Nothing is read per process, except at an eviction, for the tree of the
 * task chosen.
 */
#include "mts_node.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "mts_defs.h"
#include "mts_log.h"
#include "mts_policy.h"
#include "mts_procfs.h"
#include "mts_registry.h"

/* A v1 limit at or above this is no limit (the kernel shows "unlimited"
 * as PAGE_COUNTER_MAX pages). */
#define V1_UNLIMITED (UINT64_C(1) << 62)

uint64_t mts_guard_line(const struct mts_policy *pol, uint64_t limit)
{
	if (pol->guard_line_bp)
		return (uint64_t)((unsigned __int128)limit *
		                  pol->guard_line_bp / MTS_BP_ONE);
	/* "limit - X" keeps at most half the limit below the line: a limit
	 * resized near X (systemctl set-property, a pod resize) would
	 * otherwise put the line a few MiB above 0 and evict every task,
	 * one an interval. Half, so the line never falls as the limit
	 * grows, and a node keeps half its memory usable whatever X is. */
	if (pol->guard_line_below) {
		uint64_t keep = limit / 2;
		if (pol->guard_line_below < keep)
			keep = pol->guard_line_below;
		return limit - keep;
	}
	return pol->guard_line_bytes;
}

/* ---- reading the node ---------------------------------------------------- */

/* A number file ("max" for v2's no limit: 0). 0 or -errno. */
static int read_u64(const char *dir, const char *name, uint64_t *out)
{
	char buf[64];
	ssize_t n = mts_read_small(dir, name, buf, sizeof(buf));
	if (n < 0)
		return (int)n;
	if (strncmp(buf, "max", 3) == 0) {
		*out = 0;
		return 0;
	}
	char *end;
	errno = 0;
	unsigned long long v = strtoull(buf, &end, 10);
	if (errno || end == buf)
		return -EINVAL;
	*out = v;
	return 0;
}

/* Where the value of `key` begins in a "key value" list (memory.stat,
 * meminfo), or NULL when no line starts with it. */
static const char *stat_find(const char *text, const char *key)
{
	size_t kl = strlen(key);
	for (const char *p = text; p && *p;) {
		if (strncmp(p, key, kl) == 0 && (p[kl] == ' ' || p[kl] == ':'))
			return p + kl + 1 + strspn(p + kl + 1, " :");
		p = strchr(p, '\n');
		if (p)
			p++;
	}
	return NULL;
}

/* The value of `key` in a "key value" list (memory.stat, meminfo), times
 * `unit`; 0 when it is not there. */
static uint64_t stat_value(const char *text, const char *key, uint64_t unit)
{
	const char *v = stat_find(text, key);
	return v ? strtoull(v, NULL, 10) * unit : 0;
}

static const char *proc_dir(const struct mts_node_src *src)
{
	return src->proc[0] ? src->proc : "/proc";
}

/* vm.overcommit_memory is 2: the kernel refuses what would take the
 * commit charge past CommitLimit. Unreadable: the heuristic modes'
 * default, where only the memory edge holds. */
static bool strict_overcommit(const char *proc)
{
	char dir[96], buf[16];
	snprintf(dir, sizeof(dir), "%s/sys/vm", proc);
	return mts_read_small(dir, "overcommit_memory", buf, sizeof(buf)) > 0 &&
	       buf[0] == '2';
}

int mts_node_read(const struct mts_node_src *src, struct mts_node_fig *fig)
{
	char stat[4096];
	uint64_t usage = 0, limit = 0, inactive;
	int err = 0;
	bool meminfo = false;
	switch (src->kind) {
	case MTS_NODE_CGROUP_V2:
	case MTS_NODE_CGROUP_V1: {
		bool v2 = src->kind == MTS_NODE_CGROUP_V2;
		err = read_u64(src->dir,
		               v2 ? "memory.current" : "memory.usage_in_bytes",
		               &usage);
		if (!err)
			err = read_u64(src->dir,
			               v2 ? "memory.max"
			                  : "memory.limit_in_bytes",
			               &limit);
		if (!err && mts_read_small(src->dir, "memory.stat", stat,
		                           sizeof(stat)) < 0)
			err = -EIO;
		if (err)
			return err;
		if (!v2 && limit >= V1_UNLIMITED)
			limit = 0;
		inactive = stat_value(
		    stat, v2 ? "inactive_file" : "total_inactive_file", 1);
		usage = usage > inactive ? usage - inactive : 0;
		break;
	}
	case MTS_NODE_MEMINFO: {
		if (mts_read_small(proc_dir(src), "meminfo", stat,
		                   sizeof(stat)) < 0)
			return -EIO;
		/* Without MemAvailable (a virtualised /proc that leaves it
		 * out) the node would read as full, and the guard would
		 * evict a task every interval: a read error instead. */
		if (!stat_find(stat, "MemAvailable"))
			return -EIO;
		meminfo = true;
		limit = stat_value(stat, "MemTotal", 1024);
		uint64_t avail = stat_value(stat, "MemAvailable", 1024);
		usage = limit > avail ? limit - avail : 0;
		break;
	}
	default:
		return -ENOENT;
	}
	memset(fig, 0, sizeof(*fig));
	fig->usage = fig->mem_usage = usage;
	fig->limit = fig->mem_limit = limit;
	/* The commit edge holds inside a cgroup too: the charge is the
	 * machine's. One more small read a check, two in a cgroup when
	 * overcommit is strict. */
	if (strict_overcommit(proc_dir(src)) &&
	    (meminfo || mts_read_small(proc_dir(src), "meminfo", stat,
	                               sizeof(stat)) > 0)) {
		fig->commit_limit = stat_value(stat, "CommitLimit", 1024);
		fig->committed = stat_value(stat, "Committed_AS", 1024);
	}
	return 0;
}

void mts_node_edge(const struct mts_policy *pol, struct mts_node_fig *fig)
{
	uint64_t line = mts_guard_line(pol, fig->mem_limit);
	/* A limit lowered under a line of bytes: the line follows it. */
	if (line >= fig->mem_limit)
		line = fig->mem_limit - fig->mem_limit / 20;
	fig->mem_line = line;
	fig->usage = fig->mem_usage;
	fig->limit = fig->mem_limit;
	fig->line = line;
	fig->by_commit = false;
	if (!fig->commit_limit || !fig->mem_limit) {
		fig->commit_line = 0;
		return;
	}
	/* A fraction of its limit, as [guard] line, or as the memory's
	 * line is of its limit when the line is in bytes. */
	fig->commit_line =
	    pol->guard_line_bp
	        ? mts_guard_line(pol, fig->commit_limit)
	        : (uint64_t)((unsigned __int128)fig->commit_limit * line /
	                     fig->mem_limit);
	/* Signed rooms: either may be past its line. Both are below 2^62. */
	int64_t mem_room = (int64_t)line - (int64_t)fig->mem_usage;
	int64_t commit_room =
	    (int64_t)fig->commit_line - (int64_t)fig->committed;
	if (commit_room < mem_room) {
		fig->usage = fig->committed;
		fig->limit = fig->commit_limit;
		fig->line = fig->commit_line;
		fig->by_commit = true;
	}
}

/* The kind of cgroup at `dir` (v2 or v1 memory files), or NONE. */
static enum mts_node_kind cgroup_kind(const char *dir)
{
	char path[600];
	snprintf(path, sizeof(path), "%s/memory.max", dir);
	if (access(path, R_OK) == 0)
		return MTS_NODE_CGROUP_V2;
	snprintf(path, sizeof(path), "%s/memory.limit_in_bytes", dir);
	if (access(path, R_OK) == 0)
		return MTS_NODE_CGROUP_V1;
	return MTS_NODE_NONE;
}

int mts_node_cgroup_path(char *text, const char **base, char *path, size_t len)
{
	*base = NULL;
	for (char *save = NULL, *l = strtok_r(text, "\n", &save); l;
	     l = strtok_r(NULL, "\n", &save)) {
		/* hierarchy-id:controllers:path */
		char *c1 = strchr(l, ':');
		char *c2 = c1 ? strchr(c1 + 1, ':') : NULL;
		if (!c2)
			continue;
		*c1 = *c2 = '\0';
		const char *ctrls = c1 + 1;
		bool memory = false;
		for (const char *c = ctrls; *c;
		     c += strcspn(c, ","), c += *c == ',') {
			if (strncmp(c, "memory", 6) == 0 &&
			    (c[6] == ',' || c[6] == '\0'))
				memory = true;
		}
		if (memory) {
			*base = "/sys/fs/cgroup/memory";
			snprintf(path, len, "%s", c2 + 1);
			return 0;
		}
		/* The unified hierarchy: id 0, no controllers named. */
		if (strcmp(l, "0") == 0 && !ctrls[0] && !*base) {
			*base = "/sys/fs/cgroup";
			snprintf(path, len, "%s", c2 + 1);
		}
	}
	return *base ? 0 : -ENOENT;
}

int mts_node_find_cgroup(char *text, const char *root, struct mts_node_src *src)
{
	char path[512] = "";
	const char *base;
	if (mts_node_cgroup_path(text, &base, path, sizeof(path)) < 0)
		return -ENOENT;
	/* The smallest limit up the tree, not the nearest: an ancestor's
	 * smaller limit binds the cgroups under it (the kernel's OOM killer
	 * acts at the ancestor), and a guard on the nearest one's larger
	 * limit would never act. */
	struct mts_node_src best = {.kind = MTS_NODE_NONE};
	uint64_t best_limit = 0;
	for (;;) {
		struct mts_node_src at = {.kind = MTS_NODE_NONE};
		snprintf(at.dir, sizeof(at.dir), "%s%s%s", root, base,
		         strcmp(path, "/") == 0 ? "" : path);
		at.kind = cgroup_kind(at.dir);
		struct mts_node_fig f;
		if (at.kind != MTS_NODE_NONE && mts_node_read(&at, &f) == 0 &&
		    f.limit && (!best_limit || f.limit < best_limit)) {
			best = at;
			best_limit = f.limit;
		}
		/* Up to the hierarchy's root, tried last: in a container on
		 * cgroup v1 without a cgroup namespace, the path is the
		 * host's and the container's own cgroup is mounted there. */
		char *slash = strrchr(path, '/');
		if (!slash || strcmp(path, "/") == 0)
			break;
		if (slash == path)
			slash[1] = '\0';
		else
			*slash = '\0';
	}
	*src = best;
	return best_limit ? 0 : -ENOENT;
}

/* The cgroup around memtallyd (itself or an ancestor) with the smallest
 * memory limit. 0, or -ENOENT when none has a limit. */
static int own_cgroup(struct mts_node_src *src)
{
	char text[4096];
	if (mts_read_small("/proc/self", "cgroup", text, sizeof(text)) < 0)
		return -ENOENT;
	return mts_node_find_cgroup(text, "", src);
}

/* memtallyd's resident bytes now. */
static uint64_t own_resident(void)
{
	char buf[128];
	uint64_t res;
	if (mts_read_small("/proc/self", "statm", buf, sizeof(buf)) < 0 ||
	    mts_parse_statm_rss(buf, (uint64_t)sysconf(_SC_PAGESIZE), &res,
	                        NULL) < 0)
		return 0;
	return res;
}

const char *mts_node_kind_name(enum mts_node_kind k)
{
	switch (k) {
	case MTS_NODE_CGROUP_V2:
		return "cgroup2";
	case MTS_NODE_CGROUP_V1:
		return "cgroup1";
	case MTS_NODE_MEMINFO:
		return "meminfo";
	default:
		return "off";
	}
}

int mts_guard_setup(const struct mts_policy *pol, uint64_t reserve,
                    struct mts_node_src *src, struct mts_node_fig *fig,
                    char *err, size_t errlen)
{
	char a[32], b[32], c[32], d[32], e[32];
	memset(src, 0, sizeof(*src));
	memset(fig, 0, sizeof(*fig));
	if (pol->guard_mode == MTS_GUARD_OFF)
		return 0;
	const char *cg = pol->guard_cgroup;
	if (cg && cg[0]) {
		snprintf(src->dir, sizeof(src->dir), "%s", cg);
		src->kind = cgroup_kind(cg);
		if (src->kind == MTS_NODE_NONE) {
			snprintf(err, errlen,
			         "[guard] cgroup: '%s' is not a memory cgroup "
			         "(no memory.max or memory.limit_in_bytes)",
			         cg);
			return -EINVAL;
		}
	} else if (!cg && own_cgroup(src) < 0) {
		/* No limit around memtallyd: on a whole machine the guard
		 * runs only when asked, on MemAvailable. */
		if (pol->guard_mode == MTS_GUARD_AUTO)
			return 0;
		src->kind = MTS_NODE_MEMINFO;
	} else if (cg) {
		/* cgroup = none: the whole machine, which auto leaves off as
		 * it does where no cgroup limits memtallyd (killing tasks
		 * there is a choice an operator makes: enabled = true). */
		if (pol->guard_mode == MTS_GUARD_AUTO)
			return 0;
		src->kind = MTS_NODE_MEMINFO;
	}
	int r = mts_node_read(src, fig);
	if (r < 0 || fig->limit == 0) {
		snprintf(err, errlen,
		         "[guard] cgroup: cannot read the memory usage and "
		         "limit of %s: %s",
		         src->dir[0] ? src->dir : "/proc/meminfo",
		         r < 0 ? strerror(-r) : "it has no limit");
		return -EINVAL;
	}
	uint64_t line = mts_guard_line(pol, fig->limit);
	if (line >= fig->limit) {
		snprintf(err, errlen,
		         "[guard] line: %s is at or above the node's limit, %s "
		         "(%s %s): the kernel would act first",
		         mt_format_size(a, sizeof(a), line),
		         mt_format_size(b, sizeof(b), fig->limit),
		         mts_node_kind_name(src->kind),
		         src->dir[0] ? src->dir : "/proc/meminfo");
		return -EINVAL;
	}
	uint64_t rss = own_resident();
	uint64_t need = mt_sat_add(rss, reserve);
	if (line < need) {
		snprintf(err, errlen,
		         "[guard] line: %s is below what memtallyd needs "
		         "itself, %s (%s resident now and up to %s of "
		         "connection buffers, [server] max_buffered), of a "
		         "node limited to %s",
		         mt_format_size(a, sizeof(a), line),
		         mt_format_size(b, sizeof(b), need),
		         mt_format_size(c, sizeof(c), rss),
		         mt_format_size(d, sizeof(d), reserve),
		         mt_format_size(e, sizeof(e), fig->limit));
		return -EINVAL;
	}
	mts_node_edge(pol, fig);
	return 0;
}

void mts_guard_apply(struct mts_registry *reg, const struct mts_node_src *src,
                     const struct mts_node_fig *fig)
{
	struct mts_guard_state *g = reg->guard;
	bool was = g->src.kind != MTS_NODE_NONE;
	g->src = *src;
	g->node = *fig;
	g->known = src->kind != MTS_NODE_NONE;
	g->evict_trusted = reg->policy.guard_evict_trusted;
	g->interval_ms = reg->policy.guard_interval_ms;
	g->pause = reg->policy.guard_pause;
	g->read_failed_logged = false;
	if (src->kind == MTS_NODE_NONE) {
		if (was || reg->policy.guard_mode != MTS_GUARD_OFF)
			mts_log(MTS_LOG_INFO,
			        "node guard off: no memory limit around "
			        "memtallyd (set [guard] enabled = true to "
			        "guard MemAvailable)",
			        "mode=%s",
			        reg->policy.guard_mode == MTS_GUARD_OFF
			            ? "false"
			            : "auto");
		return;
	}
	mts_log(MTS_LOG_INFO, "node guard on",
	        "source=%s path=%s usage=%llu limit=%llu line=%llu "
	        "interval_ms=%u evict_trusted=%d pause=%d",
	        mts_node_kind_name(src->kind),
	        src->dir[0] ? src->dir : "/proc/meminfo",
	        (unsigned long long)fig->mem_usage,
	        (unsigned long long)fig->mem_limit,
	        (unsigned long long)fig->mem_line, g->interval_ms,
	        g->evict_trusted, g->pause);
	if (reg->policy.guard_line_below > fig->mem_limit / 2)
		mts_log(MTS_LOG_WARN,
		        "node guard: [guard] line keeps half the node's limit "
		        "below it, not the bytes it names (more than half)",
		        "below=%llu limit=%llu line=%llu",
		        (unsigned long long)reg->policy.guard_line_below,
		        (unsigned long long)fig->mem_limit,
		        (unsigned long long)fig->mem_line);
	if (fig->commit_limit)
		mts_log(MTS_LOG_INFO,
		        "node guard: overcommit is strict, the commit charge "
		        "is guarded too",
		        "committed=%llu commit_limit=%llu commit_line=%llu "
		        "edge=%s",
		        (unsigned long long)fig->committed,
		        (unsigned long long)fig->commit_limit,
		        (unsigned long long)fig->commit_line,
		        mts_node_edge_name(fig));
}

const char *mts_node_edge_name(const struct mts_node_fig *fig)
{
	return fig->by_commit ? "commit" : "memory";
}

const struct mts_node_fig *mts_guard_figure(const struct mts_registry *reg,
                                            const char **source)
{
	const struct mts_guard_state *g = reg->guard;
	if (!g || g->src.kind == MTS_NODE_NONE || !g->known)
		return NULL;
	if (source)
		*source = mts_node_kind_name(g->src.kind);
	return &g->node;
}
