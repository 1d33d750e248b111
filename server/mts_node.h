/*
 * mts_node.h - the node's memory as the kernel sees it (a memory cgroup's
 * usage and limit, or /proc/meminfo) and the node guard's line below its
 * limit (node.c), with the guard's state, which guard.c's evictions
 * share: what admission keeps grants under and the guard evicts past.
 */
#ifndef MTS_NODE_H
#define MTS_NODE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "mts_policy.h"
#include "mts_registry.h"

/* How often the node is read: often enough to act between two steps of
 * a leak of a few hundred MiB/s, cheap enough to be unseen (guard.c). */
#define MTS_GUARD_CHECK_MS 100u
/* Reads kept for the node's rise: three checks' span (guard.c). */
#define MTS_GUARD_SEEN 4u

struct mts_guard_hold;

enum mts_node_kind {
	MTS_NODE_NONE = 0,  /* the guard is off */
	MTS_NODE_CGROUP_V2, /* memory.current, memory.max, memory.stat */
	MTS_NODE_CGROUP_V1, /* memory.usage_in_bytes, limit_in_bytes, stat */
	MTS_NODE_MEMINFO,   /* MemTotal, MemAvailable */
};

/* Where the node's figure comes from (mts_guard_setup). */
struct mts_node_src {
	enum mts_node_kind kind;
	char dir[512]; /* the cgroup directory; "" for meminfo */
	char proc[64]; /* where procfs is: "" for /proc (a test's tree) */
};

/*
 * The node as of the latest read, against two edges. Memory: what the
 * kernel could not reclaim without an OOM kill (the usage less inactive
 * file pages) against the limit. Commit, only under strict overcommit
 * (vm.overcommit_memory = 2): Committed_AS against CommitLimit, past
 * which the kernel refuses allocations (malloc returns NULL) long before
 * it runs out of pages. The guard acts on the edge with less room below
 * its line (mts_node_edge).
 */
struct mts_node_fig {
	/* The edge the guard acts on and admission keeps grants under. */
	uint64_t usage;
	uint64_t limit;
	uint64_t line;
	bool by_commit; /* that edge is the commit's */
	/* Memory, always. */
	uint64_t mem_usage, mem_limit, mem_line;
	/* Commit, under strict overcommit; all 0 otherwise. */
	uint64_t committed, commit_limit, commit_line;
};

/* The guard's state (reg->guard), written by guard.c alone. */
struct mts_guard_state {
	struct mts_node_src src; /* kind NONE: off */
	struct mts_node_fig node;
	bool known; /* node holds a read */
	bool evict_trusted;
	bool pause; /* [guard] pause */
	uint32_t interval_ms;
	uint64_t last_eviction_ns; /* CLOCK_MONOTONIC; 0 = never */
	bool idle_logged;          /* "past the line, no candidate" said */
	bool read_failed_logged;
	/* The last reads' room below the line (line - usage of the edge
	 * then), for how fast the node rises (a ring). Room, not usage: it
	 * runs on when the edge changes, since the two rooms meet there. */
	int64_t seen_room[MTS_GUARD_SEEN];
	uint64_t seen_ns[MTS_GUARD_SEEN];
	uint32_t seen_head, seen_n;
	struct mts_guard_hold *hold; /* the task paused, or NULL */
	/* For /metrics. */
	uint64_t pauses;  /* tasks paused */
	uint64_t resumed; /* of those, resumed (not evicted) */
	uint64_t evictions;
	uint64_t reads;
	uint64_t read_ns;   /* their total time */
	uint64_t signalled; /* processes killed by evictions */
};

/* The line for `limit` under `pol` (a fraction, bytes below, or bytes).
 * A line of "limit - X" keeps at most half of `limit` below it. */
uint64_t mts_guard_line(const struct mts_policy *pol, uint64_t limit);

/*
 * Find the node per [guard] (enabled, cgroup), read it once and check the
 * line against it. A line above the node's limit is an error. So is a
 * line below what memtallyd needs itself: its resident memory now plus
 * `reserve`, the most its buffers may take. The error is one line in
 * `err` naming the key and the figures. Returns 0 (src->kind
 * MTS_NODE_NONE when the guard is off) or -EINVAL.
 */
int mts_guard_setup(const struct mts_policy *pol, uint64_t reserve,
                    struct mts_node_src *src, struct mts_node_fig *fig,
                    char *err, size_t errlen);

/* Read the node now: its memory (usage and limit, also as the edge, with
 * no line yet) and, under strict overcommit, its commit. 0 or -errno. */
int mts_node_read(const struct mts_node_src *src, struct mts_node_fig *fig);

/*
 * Set the lines of a read and the edge the guard acts on. The memory's
 * line is the policy's (mts_guard_line; a limit lowered under a line of
 * bytes takes the line to 95% of it). The commit's is the same fraction
 * of CommitLimit (for a line in bytes, the memory line's fraction). The
 * edge is the one with less room below its line, so what a grant or an
 * eviction is judged against is whichever the kernel would enforce first.
 */
void mts_node_edge(const struct mts_policy *pol, struct mts_node_fig *fig);

/* Install a source found by mts_guard_setup() and the policy's guard
 * settings. */
void mts_guard_apply(struct mts_registry *reg, const struct mts_node_src *src,
                     const struct mts_node_fig *fig);

/*
 * Where /proc/PID/cgroup's `text` (changed in place) puts the process in
 * a memory cgroup: v1's memory hierarchy where that controller has one,
 * else the unified (v2) hierarchy. *base is the hierarchy's mount point,
 * path the cgroup under it. 0, or -ENOENT.
 */
int mts_node_cgroup_path(char *text, const char **base, char *path, size_t len);

/*
 * The cgroup with the smallest memory limit around the process whose
 * /proc/PID/cgroup is `text` (changed in place): its path, each parent,
 * and the hierarchy's root, under `root` ("": the machine's
 * /sys/fs/cgroup; a test's tree). Sets src's kind and dir. 0, or -ENOENT
 * when none has a limit.
 */
int mts_node_find_cgroup(char *text, const char *root,
                         struct mts_node_src *src);

/* The edge the guard acts on: "memory" or "commit". */
const char *mts_node_edge_name(const struct mts_node_fig *fig);

/* The node as of the latest read, for admission (its usage and line: the
 * edge nearest its line) and queries (its source's name in *source, if
 * not NULL); NULL when the guard is off or has no figure. */
const struct mts_node_fig *mts_guard_figure(const struct mts_registry *reg,
                                            const char **source);

/* "cgroup2", "cgroup1", "meminfo", "off". */
const char *mts_node_kind_name(enum mts_node_kind k);

#endif /* MTS_NODE_H */
