/*
 * mts_guard.h - the node guard (guard.c): the node's memory as the kernel
 * sees it (a memory cgroup's usage and limit, or /proc/meminfo), a line
 * below its limit, and past the line the eviction of one task, chosen by
 * what it holds beyond its reservation.
 */
#ifndef MTS_GUARD_H
#define MTS_GUARD_H

#include <stdbool.h>
#include <stdint.h>

#include "mts_policy.h"
#include "mts_registry.h"

/* How often the node is read: often enough to act between two steps of
 * a leak of a few hundred MiB/s, cheap enough to be unseen (guard.c). */
#define MTS_GUARD_CHECK_MS 100u
/* A candidate growing slower than this is not growing (rate noise). */
#define MTS_GUARD_GROWTH_MIN (1.0 * (1 << 20))
/* Decision records name at most this many candidates, largest first. */
#define MTS_GUARD_LOG_CANDIDATES 8u
/* Descendants of one eviction's workers looked for and killed. */
#define MTS_GUARD_TREE_MAX 4096u

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
};

/* The node as of the latest read. */
struct mts_node_fig {
	uint64_t usage; /* what the kernel could not reclaim without an OOM:
	                   usage less inactive file pages */
	uint64_t limit;
	uint64_t line; /* the guard's line against that limit */
};

/* One candidate for eviction: the workers of one task of one uid, or one
 * process without a task. */
struct mts_guard_cand {
	const char *task; /* "" for a process without one */
	uint32_t uid;
	uint32_t pid;      /* the first worker's */
	uint32_t workers;  /* registered processes */
	uint64_t used;     /* vouched bytes of its workers (measure) */
	uint64_t reserved; /* its reservations' granted bytes */
	double growth;     /* bytes per second, its workers' sum */
	uint64_t first_ns; /* its oldest worker's registration (realtime) */
	bool eligible;     /* may be chosen (trust rules) */
};

/* Why a candidate was chosen: the rule that decided. */
enum mts_guard_rule {
	MTS_GUARD_BEYOND = 0, /* furthest beyond its reservation */
	MTS_GUARD_GROWTH,     /* none beyond: fastest growing */
	MTS_GUARD_YOUNGEST,   /* none beyond, none growing: youngest */
};

/* The guard's state (reg->guard), written by guard.c alone. */
struct mts_guard_state {
	struct mts_node_src src; /* kind NONE: off */
	struct mts_node_fig node;
	bool known; /* node holds a read */
	bool evict_trusted;
	uint32_t interval_ms;
	uint64_t last_eviction_ns; /* CLOCK_MONOTONIC; 0 = never */
	bool idle_logged;          /* "past the line, no candidate" said */
	bool read_failed_logged;
	/* For /metrics. */
	uint64_t evictions;
	uint64_t reads;
	uint64_t read_ns;   /* their total time */
	uint64_t signalled; /* processes killed by evictions */
};

/* The line for `limit` under `pol` (a fraction, bytes below, or bytes). */
uint64_t mts_guard_line(const struct mts_policy *pol, uint64_t limit);

/*
 * Find the node per [guard] (enabled, cgroup), read it once and check the
 * line against it: a line above the node's limit, or below what
 * memtallyd needs itself (its resident memory now plus `reserve`, the
 * most its buffers may take), is an error with one line in err naming
 * the key and the figures. 0 (src->kind NONE when the guard is off),
 * -EINVAL.
 */
int mts_guard_setup(const struct mts_policy *pol, uint64_t reserve,
                    struct mts_node_src *src, struct mts_node_fig *fig,
                    char *err, size_t errlen);

/* Read the node now. 0 or -errno. */
int mts_node_read(const struct mts_node_src *src, struct mts_node_fig *fig);

/* Install a source found by mts_guard_setup() and the policy's guard
 * settings. */
void mts_guard_apply(struct mts_registry *reg, const struct mts_node_src *src,
                     const struct mts_node_fig *fig);

/* The timer's step: read the node; past the line, at most once per
 * interval, evict one candidate. */
void mts_guard_check(struct mts_registry *reg, uint64_t now_ns);

/* For admission: the node's usage and line as of the latest read; false
 * when the guard is off or has no figure. */
bool mts_guard_node(const struct mts_registry *reg, uint64_t *usage,
                    uint64_t *line);

/*
 * The candidates (malloc'd, *n of them; free it) and the index of the
 * one the rule chooses, or -1 when none may be. *rule says why. Reads
 * the registry and changes nothing.
 */
int mts_guard_candidates(const struct mts_registry *reg,
                         struct mts_guard_cand **out, uint32_t *n, int *chosen,
                         enum mts_guard_rule *rule);

/* "beyond its reservation", "fastest growing", "youngest". */
const char *mts_guard_rule_name(enum mts_guard_rule r);

#endif /* MTS_GUARD_H */
