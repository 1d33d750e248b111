/*
 * mts_admit.h - admission: Admit decisions, reservations and their
 * reconciliation with the workers of their task (admit.c).
 */
#ifndef MTS_ADMIT_H
#define MTS_ADMIT_H

#include <stdbool.h>
#include <stdint.h>

#include "mts_kinds.h"
#include "mts_registry.h"

struct mts_kind;

/* Why an Admit was denied, for the logs and the metrics' `reason` label. */
enum mts_denial {
	MTS_DENY_FLEET_LIMIT, /* fleet bytes + reserved + request > limit */
	MTS_DENY_GROUP_LIMIT,
	MTS_DENY_INVALID,           /* a malformed request */
	MTS_DENY_UID_CAP,           /* the uid holds max_reservations_per_uid */
	MTS_DENY_GROUP_NOT_ALLOWED, /* the group's uids/gids exclude the peer */
	MTS_DENY_UID_BYTES,         /* past max_reserved_bytes_per_uid */
	MTS_DENY_KIND_CAP, /* a new kind past max_kinds_per_uid/max_kinds */
	MTS_DENY_NODE, /* node usage + reserved + request > the guard's line */
	MTS_DENY_HOST_LIMIT, /* in_process: past the asker's own host_limit */
	MTS_DENY_FULL,       /* the server holds MTS_RESV_MAX reservations */
	MTS_DENY__COUNT,
};

/* "fleet_limit", "group_limit", "invalid": the `reason` label. */
const char *mts_denial_name(enum mts_denial d);

/* Admission's counters, read by /metrics. */
struct mts_admit_stats {
	uint64_t admissions; /* Admit granted */
	uint64_t denials[MTS_DENY__COUNT];
	uint64_t releases;     /* reservations ended by Release */
	uint64_t expirations;  /* reservations ended by their TTL */
	uint64_t fulfilled;    /* reservations ended: their task's end */
	uint64_t auth_denials; /* Release refused to a peer */
};

/*
 * A request denied and asking again (`memtally run --wait`): who asks
 * (its uid and task), since when, and what it asked for last.
 * Once it has waited [admission] queue, the one waiting longest keeps its
 * room from younger requests.
 */
#define MTS_WAITERS 64u
/* Places one uid may hold (admins: any): one user asking for 64 tasks
 * every few seconds would otherwise hold every place, and the head, so
 * that nobody else's large request is ever kept room for. */
#define MTS_WAITERS_PER_UID (MTS_WAITERS / 8u)
struct mts_waiter {
	uint64_t who;      /* hash of the uid and the task name */
	uint64_t first_ns; /* CLOCK_MONOTONIC: its first denial in this wait */
	uint64_t last_ns;  /* its last ask */
	uint64_t bytes;    /* what it asks for */
	bool profiled;     /* and the profile it would follow */
	bool in_process;   /* run inside its asker (Admit.in_process) */
	struct mts_kind_profile prof;
};

/*
 * Admission's state, changed by admit.c alone (others read its counts):
 * the outstanding reservations, indexed by id, by expiry and by task, the
 * per-owner counts behind max_reservations_per_uid, and what the cached
 * admin flags of workers were computed against.
 */
struct mts_admission {
	struct mts_resv **resv; /* outstanding reservations, unordered */
	uint32_t nresv;
	uint32_t resv_cap;
	struct mts_resv **resv_ids; /* id -> reservation, open addressing */
	uint32_t resv_ids_mask;
	struct mts_resv **resv_heap; /* TTL still applies, by expiry (min) */
	uint32_t resv_nheap;         /* capacity: resv_cap */
	unsigned __int128 resv_sum;  /* exact sum behind totals.reserved */
	uint32_t nprofiled;          /* of them, following a profile */
	uint32_t nhosted;            /* of them, run inside their asker */
	/* Requests denied and asking again (admit.c: the queue). */
	struct mts_waiter waiters[MTS_WAITERS];
	uint32_t nwaiters;
	struct mts_task **tasks; /* task name -> its reservations, chained */
	uint32_t tasks_mask;
	uint32_t ntasks;
	struct mts_task *tasks_seen; /* tasks a worker registered with */
	/* Outstanding reservations per owner uid; a change of the admin
	 * policy (server uid, admin_uid, admin_gid) bumps admin_epoch, which
	 * the workers' cached flags (mts_proc.admin) are checked against. */
	struct mts_uid_counts resv_uids;
	uint32_t admin_epoch;
	uint32_t admin_seen[5]; /* server uid, has/uid, has/gid */
	struct mts_admit_stats stats;
	/* A reservation came or went since the record was last taken
	 * (mts_resv_encode): the server writes it again soon. */
	bool resv_dirty;
};

/* Slots of a run's own profile, and the first slot's length. */
#define MTS_RESV_SLOTS   32u
#define MTS_RESV_SLOT_MS 25u

struct mts_resv {
	char id[MTS_RESV_ID_LEN + 1];
	bool has_owner;   /* false: made over TCP (no credentials) */
	uint32_t uid;     /* owner */
	bool admin_asked; /* its asker was an admin by admin_gid (not kept
	                     across a restart: then by uid only) */
	/* The process that asked (a local peer's), by pid and start time:
	 * workers of another uid that descend from it are its command's, of
	 * the first such uid only (`switched_uid`). */
	uint32_t asker_pid;
	uint64_t asker_start;
	bool has_switched;
	uint32_t switched_uid;
	uint32_t group; /* index in reg->groups (keeps the entry alive) */
	struct mts_task *task;  /* NULL: no task */
	struct mts_resv *tnext; /* the task's reservations, oldest first */
	uint32_t index;         /* in reg->adm.resv */
	uint32_t heap_index; /* in reg->adm.resv_heap; UINT32_MAX: not there */
	bool taken_over;     /* a worker of its task registered: max_ttl
	                        from creation instead of its TTL */
	uint64_t bytes;      /* granted */
	uint64_t effective;  /* counted now: bytes minus what the task's
	                        workers already use, floored at 0 */
	uint64_t created_ns; /* CLOCK_REALTIME */
	uint64_t created_mono_ns; /* CLOCK_MONOTONIC */
	uint64_t expires_ns;      /* CLOCK_MONOTONIC: its deadline now */
	uint32_t ttl_s;
	/* Kinds (kinds.c). `kind` is the kind its task belongs to, or NULL.
	 * `declared` is what the Admit declared, 0 for nothing. `bytes` may
	 * be a learned size below or above it, and the node guard compares
	 * use with both. `peak` is the task's peak so far: the largest sum,
	 * at a tick, of what its workers that may act on it count toward
	 * others (vouch.c). */
	struct mts_kind *kind;
	uint64_t declared;
	uint64_t peak;
	bool evicted; /* the node guard ended its task: its run is recorded
	                 (mts_resv_evicted), not again at its end */
	/* What it sets aside now: `bytes`, or, when it follows its kind's
	 * profile, the profile's step for the task's age (admit.c). */
	uint64_t want;
	uint64_t use; /* its workers' vouched bytes, latest tick (kinds) */
	bool profiled;
	struct mts_kind_profile prof;
	/* The run as its kind will keep it: the largest use in each of
	 * MTS_RESV_SLOTS slots of slot_ms from its first worker on. */
	uint64_t started_mono_ns;
	/* The last tick that saw it hold memory: where its run ends. */
	uint64_t last_seen_ns;
	uint32_t slot_ms;
	uint64_t slots[MTS_RESV_SLOTS];
	/* A task run inside the asking process (Admit.in_process): `host`
	 * is that process, known by pid and slot generation (it may exit
	 * before the reservation ends). Its use is the host's vouched growth
	 * since `host_base`, or, with a `host_tid`, what that thread's lane
	 * grew since `lane_base` (admit.c, hosted_tick). */
	bool hosted;
	uint32_t host_pid;
	uint32_t host_tid;
	uint64_t host_gen;
	uint64_t host_base;
	uint64_t host_low; /* the host's least vouched figure since then */
	/* What the host held of its own (all but its other tasks' use) at
	 * the grant: admitted with it, so the guard counts it reserved. */
	uint64_t host_own_base;
	int64_t lane_base;
	bool lane_known;     /* lane_base is the thread's lane's at its start */
	uint64_t lane_carry; /* restored: the use the lane's base carries */
	/* The host's start time and slot. A restarted server restores the
	 * reservation `host_unbound` until it finds its host again by pid,
	 * start time and uid (hosted_tick; its /proc entry is looked at once
	 * a second, `host_check_ns`, while it has not registered), then
	 * `host_settling` until the host's figures have been read. */
	uint64_t host_start;
	uint32_t host_slot;
	/* Restored taken over, and none of its task's workers seen live by
	 * this server yet: ended so, it ended while no server watched, and
	 * its kind learns nothing of it. */
	bool restored_unseen;
	bool host_unbound;
	bool host_settling;
	uint64_t host_check_ns;
	/* What its run's command holds that no worker registered for (a
	 * static binary, a program that drops the preload) is read by a
	 * full resident sweep (rss.c, mts_resv_run_read): the proportional
	 * figure of the processes below its asker is its `use` and `peak`
	 * (its kind learns it), not in the counted figures (the node's
	 * figure holds it). `tree_run`: once they held memory the run
	 * counts as running, as a worker's taking it over makes it (kept in
	 * the record). */
	bool tree_run;
	bool tree_cut; /* a read of it stopped at the budget: teaches nothing */
	/* Admit.until_release: its asker (a run) releases it at its
	 * command's end. Its workers' exit does not end it while the asker
	 * lives (its /proc entry read once a second at most,
	 * `asker_check_ns`, while no worker of it is left); the asker's
	 * exit does once no worker is left. */
	bool until_release;
	bool asker_gone;
	uint64_t asker_check_ns;
};

/* What one kind of a task's workers use (admit.c): [0] admins' workers,
 * [1] workers of a uid that owns none of the task's reservations, then
 * one entry per owner uid of its reservations. */
struct mts_task_share {
	uint32_t uid;      /* owners' entries */
	uint32_t resv;     /* owners' entries: its reservations of the task */
	uint32_t live;     /* live workers, latest tick */
	uint64_t measured; /* their measured bytes, latest tick */
	uint64_t vouched;  /* of those, what counts toward others */
	uint64_t counted;  /* `measured` as of the last recount */
	uint64_t left;     /* a recount's scratch */
	bool was_live;     /* live > 0 at the last recount */
};

#define MTS_TASK_AWAIT_MAX 8

struct mts_task {
	struct mts_task *hnext;
	char *name;
	uint64_t hash;
	struct mts_resv *resv; /* oldest first */
	uint32_t live;         /* live workers with this task, latest tick */
	uint64_t measured;     /* their measured bytes, latest tick */
	uint64_t counted;      /* `measured` its reservations count against */
	bool seen;             /* a worker of the task registered */
	struct mts_task *snext, *sprev; /* reg->adm.tasks_seen, once seen */
	struct mts_task_share *shares;  /* see mts_task_share */
	uint32_t nshares, shares_cap;
	bool dirty;      /* reservations came or went since the last recount */
	uint32_t kinded; /* its reservations that name a kind: their
	                    peaks are followed each tick */
	/* Live workers of the task a restart found but could not adopt
	 * (mts_task_awaited): its reservations restored taken over wait for
	 * them to register again, or to be gone, before they end. Looked
	 * at once a second (`await_check_ns`). */
	struct {
		uint32_t pid;
		uint64_t start_time;
	} await[MTS_TASK_AWAIT_MAX];
	uint32_t nawait;
	uint64_t await_check_ns;
};

struct mts_admit_req {
	uint64_t bytes;
	const char *group;   /* "" or NULL = "default" */
	const char *task;    /* "" or NULL = none */
	uint32_t ttl_s;      /* 0 = policy default */
	const char *kind;    /* "" or NULL = none; with a kind, bytes may be
	                        0 (the kind's learned size is reserved) */
	bool in_process;     /* the task runs inside the asking process */
	uint32_t thread;     /* with in_process: its tid; 0 = the process */
	uint64_t host_limit; /* with in_process: the asker's own limit */
	bool again; /* repeats an unanswered Admit of the same task: that
	               one's grant, if it was made, answers it */
	bool until_release; /* the asker runs the command and releases it */
};

struct mts_admit_out {
	bool admitted;
	enum mts_denial reason;       /* when !admitted */
	char scope[MTS_NAME_MAX + 8]; /* "fleet" or "group:NAME" */
	double growth;     /* of the scope that decided, bytes per second */
	double forecast_s; /* its seconds to the limit, 0 = no forecast */
	uint64_t measured; /* of the scope that decided (fleet if granted) */
	uint64_t reserved;
	uint64_t requested;
	uint64_t limit;
	uint32_t ttl_s;
	char id[MTS_RESV_ID_LEN + 1];
	char why[384];      /* human reason */
	uint64_t reserve;   /* what the reservation sets aside (or would) */
	uint64_t need;      /* what it needs beyond the counted figures: its
	                       bytes, or its profile's beside the others' */
	uint64_t kept;      /* more needed beside the request waiting longest */
	uint64_t declared;  /* what the Admit declared, 0 = nothing */
	char sized_by[320]; /* why `reserve`: "212 MiB: p95 of 37 runs of
	                       kind xz + 10%", "declared" */
	bool hosted;        /* granted in_process: the asker's growth counts */
};

/* Decide an Admit; a grant creates a reservation. Logs the decision and
 * counts it. With a kind, the reservation is sized from the kind's runs
 * by the peer's uid (kinds.c; out->reserve, out->sized_by). Returns 0
 * (see out->admitted), -EINVAL (malformed: bytes 0 without a kind, or
 * a bad name; counted as a denial "invalid"), -ENOMEM. A server holding
 * MTS_RESV_MAX reservations denies (MTS_DENY_FULL). */
int mts_admit(struct mts_registry *reg, const struct mts_peer *peer,
              const struct mts_admit_req *req, struct mts_admit_out *out);

/* The decision alone, for a valid request of `bytes` to `group`. The
 * checks run in this order: the per-uid reservation cap, the group's
 * access and the uid's cap on new groups, the per-uid reserved bytes,
 * the fleet limit, the group's limit, and last the node guard's line by
 * the node's own figure. Fills `out` with admitted, or with the reason,
 * scope, figures and words that decided. Reads the registry and changes
 * nothing: no reservation, no counter, no log line. */
void mts_admit_decide(const struct mts_registry *reg,
                      const struct mts_peer *peer, const char *group,
                      uint64_t bytes, struct mts_admit_out *out);

/* The same for a task expected to follow `prof` (NULL: `bytes` held from
 * the start), run inside its asker when `in_process` (its gap is pooled
 * with `host_gap`, not `pool_gap`), asked by `who` (mts_waiter; 0: not a
 * task). Unless `who`
 * is the request waiting longest, that request's need is kept free too
 * ([admission] queue). The fleet, group and node checks compare against
 * the limit what the profiled reservations will grow into, plus the new
 * task's own profile. They look over the new task's life, or, for a
 * request without a profile, until those reservations are expected to
 * end. */
void mts_admit_decide_profile(const struct mts_registry *reg,
                              const struct mts_peer *peer, const char *group,
                              uint64_t bytes,
                              const struct mts_kind_profile *prof,
                              bool in_process, uint64_t who,
                              struct mts_admit_out *out);

/* Release reservation `id`. Returns 0 (*bytes = its granted bytes),
 * -ENOENT, -EPERM (logged and counted). */
int mts_release(struct mts_registry *reg, const struct mts_peer *peer,
                const char *id, const char *token, uint64_t *bytes);

/* The reservation `id`, or NULL. */
struct mts_resv *mts_resv_find(const struct mts_registry *reg, const char *id);

/* Tick step: measure each task's workers, end reservations whose TTL
 * passed or whose task's workers all exited, recompute what each counts
 * and the reserved sums. */
void mts_resv_tick(struct mts_registry *reg, uint64_t now_ns);

/* The policy changed (a reload): every reservation's TTL is cut to a
 * lowered max_ttl and its end recomputed, as a restart would; those past
 * their new end end at the next tick. */
void mts_resv_policy_changed(struct mts_registry *reg);

/* Recompute every reservation's count and the reserved sums from scratch,
 * from the latest task figures. Admit, Release and the tick keep them up
 * to date incrementally; this is the reference they agree with. */
void mts_resv_sums(struct mts_registry *reg);

/* Worker `p` registered with a task: the reservations of that task it may
 * take over (its owner's uid or an admin's: docs/ARCHITECTURE.md,
 * ownership) are taken over. */
void mts_resv_worker_registered(struct mts_registry *reg, struct mts_proc *p);

/* A restart found worker `pid` (started at `start_time`) of `task` alive
 * but could not adopt it (its slot table not reopened): it registers again
 * later. Until it has, or is gone, the task's reservations restored taken
 * over are not ended for want of a live worker (at most
 * MTS_TASK_AWAIT_MAX such workers a task are waited for). */
/* A live worker whose slot a restart holds (its record entry lost): it
 * may be a worker of any restored, taken-over reservation of its uid (not
 * one without an owner: the slot's identity is the uid's to write), whose
 * task it does not say; each waits for it
 * as for an awaited worker, until it registers again or is gone. Ended at
 * the first tick instead ("its task's workers exited"), their room was
 * given to others while the worker ran. */
void mts_task_awaited_held(struct mts_registry *reg, uint32_t uid, uint32_t pid,
                           uint64_t start_time);
void mts_task_awaited(struct mts_registry *reg, const char *task, uint32_t pid,
                      uint64_t start_time);

/*
 * The runs: local processes (a `memtally run`) that asked for live
 * reservations of one task only, by pid and start time, each with the
 * oldest of those reservations, sorted by pid. A process holding
 * reservations of two tasks (a scheduler) is none: what it started could
 * be either's. NULL with *n = 0 when there are none or out of memory;
 * the caller frees the array. What is below a run and never registered
 * is its task's (the node guard, the resident sweep).
 */
struct mts_run_ref {
	uint32_t pid; /* first: sorted and searched with mt_cmp_u32 */
	uint64_t start;
	uint32_t uid;
	struct mts_resv *r;
};
struct mts_run_ref *mts_resv_runs(const struct mts_registry *reg, uint32_t *n);
/* The run of `pid` (started at `start`) in runs[0..n), or NULL. */
const struct mts_run_ref *mts_run_find(const struct mts_run_ref *runs,
                                       uint32_t n, uint32_t pid,
                                       uint64_t start);
/* A resident sweep read the run of `r` (mts_run_ref.r, of a list taken
 * since the last change to the reservations): its unregistered
 * descendants hold `held` bytes in `nproc` processes; `gone`, the run
 * itself is (then `r` ends if its command was seen holding memory: the
 * run died without its release); `cut`, the read stopped at its uid's
 * budget before the end (then its run teaches its kind nothing). */
void mts_resv_run_read(struct mts_registry *reg, struct mts_resv *r, bool gone,
                       bool cut, uint64_t held, uint32_t nproc);

/* The bytes granted to the reservations of `task` that `uid` owns; in
 * *ownerless, those granted to its reservations without an owner (TCP),
 * which every worker of the task counts against, whatever its uid, and in
 * *since when the first of those was granted (CLOCK_REALTIME ns; 0: none). */
uint64_t mts_task_reserved(const struct mts_registry *reg, const char *task,
                           uint32_t uid, uint64_t *ownerless, uint64_t *since);
/* Does `uid` own a live reservation of `task` (has_owner), or is there
 * one without an owner, made over TCP (!has_owner)? */
bool mts_task_owned_by(const struct mts_registry *reg, const char *task,
                       bool has_owner, uint32_t uid);
/* The node guard evicted `uid`'s workers of `task`: each of its
 * reservations with a kind that `uid` owns, and those no one owns when
 * `ownerless` (the workers joined the task first, or no other uid's name
 * it), records its run as evicted, with the peak it reached (kinds.c). A
 * stranger naming the task later marks no scheduler's grant. */
void mts_task_evicted(struct mts_registry *reg, const char *task, uint32_t uid,
                      bool ownerless);
/* Whether process `p` runs tasks inside it (Admit.in_process) now, and
 * what it may then hold: its own memory (all but its tasks' use), no more
 * than it was at the latest of their grants (each grant admitted what the
 * host held then; what it took since, nobody did), and what its tasks
 * were granted, as a task's workers may hold its grants.
 * mts_host_granted: what the tasks run inside `pid` were granted (0: it
 * runs none). mts_host_evicted: their runs recorded as evicted. */
bool mts_host_allowance(const struct mts_registry *reg,
                        const struct mts_proc *p, uint64_t *allowance);
uint64_t mts_host_granted(const struct mts_registry *reg, uint32_t pid);
void mts_host_evicted(struct mts_registry *reg, uint32_t pid);

/*
 * The reservations' record (admit.c): mts_resv_encode takes every
 * reservation (those run inside their asker too) into a buffer the caller
 * frees (0 or -ENOMEM), in the order they were granted, not yet sealed
 * (mts_record_seal, mts_kinds_write: off the loop); mts_resv_restore
 * links those of a record taken in this boot back in, with their ids,
 * owners, groups, tasks, kinds, times and runs, before the workers are
 * adopted: one that was taken over stays so, and with `workers_back` (the
 * workers are about to be adopted) the first tick ends it if none of its
 * task's workers came back. A record of another boot is
 * dropped whole; one that is no record, or damaged, is -EINVAL with
 * nothing of it after the damage restored. *kept and *dropped count the
 * reservations linked and refused (past max_ttl, an id taken, out of
 * range, the server full).
 */
int mts_resv_encode(const struct mts_registry *reg, unsigned char **out,
                    size_t *len);
int mts_resv_restore(struct mts_registry *reg, const unsigned char *d,
                     size_t len, bool workers_back, uint32_t *kept,
                     uint32_t *dropped);

/* Free every reservation and task (registry teardown). */
void mts_resv_free_all(struct mts_registry *reg);

#endif /* MTS_ADMIT_H */
