/*
 * mts_guard.h - the node guard (guard.c): past the node's line (node.c),
 * the eviction of one task, chosen by what it holds beyond its
 * reservation.
 */
#ifndef MTS_GUARD_H
#define MTS_GUARD_H

#include <stdbool.h>
#include <stdint.h>

#include "mts_node.h"
#include "mts_policy.h"
#include "mts_registry.h"

/* A candidate growing slower than this is not growing (rate noise). */
#define MTS_GUARD_GROWTH_MIN (1.0 * (1 << 20))
/* Decision records name at most this many candidates, largest first. */
#define MTS_GUARD_LOG_CANDIDATES 8u
/* Descendants of one eviction's workers looked for and killed. */
#define MTS_GUARD_TREE_MAX 4096u
/* Processes a `memtally run` started that never registered (guard.c):
 * its task keeps at most this many of the topmost as roots of its tree
 * (their descendants are walked anyway, and the run kills what is left of
 * its own after an eviction). */
#define MTS_GUARD_ROOTS_MAX 16u
/* A task stays paused while the node's room (limit - usage) holds a
 * quarter of the gap between its line and its limit plus what the node
 * rises in this long at its latest rate: three checks, time to see the
 * rise, decide and have a SIGKILL free the task's memory. */
#define MTS_GUARD_HOLD_FLOOR_DIV  4u
#define MTS_GUARD_HOLD_HORIZON_MS 300u

/* One candidate for eviction: the workers of one task of one uid, or one
 * process without a task. */
struct mts_guard_cand {
	const char *task; /* "" for a process without one */
	uint32_t uid;
	uint32_t pid;             /* the first worker's */
	uint32_t workers;         /* registered processes */
	uint64_t used;            /* vouched bytes of its workers (measure) */
	uint64_t reserved;        /* its reservations' granted bytes, with its
	                           * part of those without an owner */
	uint64_t ownerless;       /* the task's reservations without an owner */
	uint64_t ownerless_since; /* the first of them granted (realtime) */
	bool shared;         /* was served its part of them (share_ownerless) */
	bool ownerless_ours; /* an eviction of it ends them: its workers
	                      * joined the task first, or alone */
	double growth;       /* bytes per second, its workers' sum */
	uint64_t first_ns;   /* its oldest worker's registration (realtime) */
	bool eligible;       /* may be chosen (trust rules) */
	uint64_t uid_beyond; /* what its uid's eligible candidates hold
	                      * beyond their reservations, together */
	/* Processes its `memtally run` started that never registered:
	 * their figures are in `used`, the topmost roots of its tree. */
	uint32_t nroots;
	uint32_t root_pid[MTS_GUARD_ROOTS_MAX];
	uint64_t root_start[MTS_GUARD_ROOTS_MAX];
};

/* Why a candidate was chosen: the rule that decided. */
enum mts_guard_rule {
	MTS_GUARD_BEYOND = 0, /* furthest beyond its reservation */
	MTS_GUARD_GROWTH,     /* none beyond: fastest growing */
	MTS_GUARD_YOUNGEST,   /* none beyond, none growing: youngest */
};

/* The timer's step: read the node; past the line, at most once per
 * interval, evict one candidate. */
void mts_guard_check(struct mts_registry *reg, uint64_t now_ns);

/*
 * The candidates (malloc'd, *n of them; free it) and the index of the
 * one the rule chooses, or -1 when none may be. *rule says why. Reads
 * the registry and changes nothing.
 */
int mts_guard_candidates(const struct mts_registry *reg,
                         struct mts_guard_cand **out, uint32_t *n, int *chosen,
                         enum mts_guard_rule *rule);

/* May a task be paused (or stay paused) with the node at `usage`, its
 * `line` and `limit`, rising at `rise_bps`? (MTS_GUARD_HOLD_*) */
bool mts_guard_hold_safe(uint64_t usage, uint64_t line, uint64_t limit,
                         double rise_bps);

/* Resume the task the guard holds paused, if any, saying `why`: memtallyd
 * stopping, the guard turned off or blind. Never leave a worker stopped. */
void mts_guard_release(struct mts_registry *reg, const char *why);

/* A worker the restart record marks as held by the memtallyd before
 * (killed while it held it): SIGCONT it and its descendants. */
void mts_guard_resume_adopted(uint32_t pid, int pidfd);

/* "beyond its reservation", "fastest growing", "youngest". */
const char *mts_guard_rule_name(enum mts_guard_rule r);

#endif /* MTS_GUARD_H */
