/*
 * mts_registry.h - the registry: every registered worker (pid, start time,
 * uid, pidfd, slot), the slot tables, groups, totals and counters, and
 * the peer of a connection (registry.c). Only mts_publish() writes the
 * header's fleet snapshot. The registry writes a slot's identity (pid,
 * uid, start time, generation, group) and resets it; the tick (core.c)
 * and the limits (limits.c) write its flags, peak and limit.
 */
#ifndef MTS_REGISTRY_H
#define MTS_REGISTRY_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include <uv.h>

#include "mts_defs.h"
#include "mts_figures.h"
#include "mtshm.h"
#include "mts_policy.h"
#include "mts_rate.h"
#include "mts_uidcount.h"
#include "mts_admit_types.h"
#include "mts_vouch_types.h"

/* Per-pid limits a restart keeps for workers it could not adopt. */
#define MTS_KEPT_LIMITS 64

struct mts_resv;
struct mts_task;
struct mts_admission;
struct mts_kinds;
struct mts_limits_state;
struct mts_rss_state;
struct mts_tick_stats;
struct mts_dispatch_stats;
struct mts_guard_state;

/* A registered worker. Lives from registration until its uv_poll's close
 * callback. `slot` is released (pid = 0) before that, when it exits.
 *
 * With many processes the tick is bound by the cache lines it moves (see
 * bench/results/server.md). So the record is MTS_PROC_ALIGN-aligned and
 * the fields every tick reads or writes come first. The sum's and the
 * limits' fields fill the first 64 bytes. `clamped` and the mapped
 * bound's fields after it are the other tick-time fields. They start the
 * second line, which every tick therefore reads too. The growth rate,
 * which one slice of processes per tick updates, follows them. Keep
 * tick-time fields in those two lines. */
#define MTS_PROC_ALIGN 64u
/* Parts of a process's figure the tick clamps at 0 (mts_proc.clamped):
 * the lanes' sum, below 0 past its error bar; mapped below 0 (it would
 * have unmapped more than it mapped since it started). */
#define MTS_CLAMPED_HEAP   1u
#define MTS_CLAMPED_MAPPED 2u

struct mts_proc {
	/* Hot: each tick (sum, limits). */
	uint64_t bytes; /* latest tick: heap (negative sums show as 0) +
	                 * mapped + allocator_free; what limits compare */
	uint64_t peak;
	uint64_t error_bytes; /* threshold x threads */
	uint64_t rss;         /* resident anonymous and shared bytes (rss.c),
	                       * slower cadence */
	uint64_t limit;       /* per-process limit in force, 0 = none */
	uint64_t mapped;      /* part of `bytes`: memory it mapped itself (the
	                       * lanes' flush count, for queries only, is read
	                       * from the slot then: it has no place here) */
	uint32_t slot;
	uint32_t group; /* index in reg->groups */
	uint32_t threads;
	uint8_t state;  /* enum mtshm_state against `limit` */
	bool untrusted; /* its uid's claims count toward others only as far
	                 * as the kernel vouches for them (vouch.c) */
	bool corrupt;   /* sticky until the slot is reset */
	bool has_free;  /* allocator_free was sampled: read it */
	/* MTS_CLAMPED_*: parts of its figure clamped at 0 now (logged when
	 * the clamping starts). Byte 64: the second line, read every tick. */
	uint8_t clamped;
	/* The state its last Watch event said (limits.c): it may lag
	 * `state` while its uid's event budget is spent. */
	uint8_t told_state;
	/* Its mapped bytes against the kernel's (mts_mapped_read in rss.c).
	 * `mapped_seen` is lane 0's figure at the latest tick, and `mapped`
	 * the part of it that counts. The figure rose last at
	 * `mapped_rose_ns`. It is young, and counted in full, until a kernel
	 * read made MTS_MAPPED_YOUNG_MS after that. `mapped_capped` means it
	 * is above what the latest such read allows. These sit beside
	 * `clamped`, in the line the tick reads anyway. */
	bool mapped_young;
	bool mapped_capped;
	uint64_t mapped_seen;
	uint64_t mapped_rose_ns;
	/* Growth rate (rate.c): one slice of processes per tick, past the
	 * first line. */
	struct mts_rate rate;
	/* Warm: enforcement and reservations (only while they have work). */
	uint32_t pid;
	uint32_t dense; /* index in reg->dense */
	char *task;
	uint64_t last_signal_ns; /* enforcement: CLOCK_MONOTONIC, 0 = never */
	/* Part of `bytes`: what its allocator keeps free (layout 2.2), from
	 * the client's sample. Outside the hot line: only processes whose
	 * front end samples it (has_free) touch it at a tick. */
	uint64_t allocator_free;
	/* What the allocator was last taken to hold for its heap, and from
	 * which sample (mtshm_free_now()). */
	struct mtshm_free_held free_held;
	/* Its heap + mapped bytes when its resident figure was last set
	 * (mts_proc_set_rss), the most they have been since, and whether it
	 * has been set since it registered: the allocator's free memory
	 * counts only as far as that figure leaves room for it (core.c,
	 * free_resident). */
	uint64_t rss_heap;
	uint64_t rss_heap_peak;
	bool rss_known;
	/* Registered as a trusted uid, later seen with untrusted real,
	 * effective and saved uids (left_uid, the effective one): untrusted
	 * until it registers again (rss.c). */
	bool uid_left;
	uint32_t left_uid;
	/* It exec'd an image that has not registered (rss.c, exec_seen):
	 * its slot holds the old image's claim, which no one updates now.
	 * Untrusted, counted as the kernel vouches, until an image of it
	 * registers. `exec_mark` is its arg_start when it registered (0:
	 * unreadable, no detection). */
	bool image_stale;
	uint64_t exec_mark;
	/* Its slot is in reach of a worker that left its table's uid
	 * (mts_table.tainted): untrusted until it registers again, its
	 * claims' excess that worker's uid's (left_uid; vouch.c). */
	bool exposed;
	/* memtallyd could not read its slot's page (a hole punched in it,
	 * under strict overcommit; fault.c): untrusted until it registers
	 * again on a page it can read. */
	bool slot_lost;
	/* Taken over after a restart with its slot, counters and lanes, and
	 * not registered again since (an exec). */
	bool adopted;
	/* Told once that it runs tasks (Admit.in_process) on more threads
	 * than its slot has lanes (admit.c, lanes_short). */
	bool lanes_short;
	/* The bound of its mapped bytes by the kernel's figure (rss.c).
	 * `cap` is its anonymous resident bytes at the latest read made once
	 * the figure was no longer young; UINT64_MAX after a rise lifts it.
	 * `ask_flushes` is its slot's flush count when memtallyd asked it to
	 * reconcile (MTSHM_SLOT_RECONCILE). `ever`: it had mapped bytes. */
	struct {
		uint64_t cap;
		uint64_t ask_flushes;
		bool ever;
	} map;
	/* Untrusted processes only: the part of `bytes` the kernel does not
	 * vouch for as of the latest tick, and vouch.c's own figures. */
	uint64_t unvouched;
	struct mts_vouch_proc vouch;
	/* Cold: registration, exit, queries. */
	uv_poll_t poll; /* on the pidfd; poll.data = this */
	struct mts_registry *reg;
	struct mts_table *table; /* its uid's slot table */
	uint64_t slot_gen;       /* generation of its slot assignment */
	struct mts_proc *hnext;  /* pid hash chain */
	uint32_t uid;
	/* Whose share of its task it counts in: `uid`, or the owner of a
	 * reservation of the task whose asking process (`task_asker`) it
	 * descends from, while that reservation lasts (the owner's command
	 * switched user; admit.c). */
	uint32_t task_uid;
	uint32_t task_asker;
	int pidfd;
	uint64_t start_time;
	uint64_t image_id;
	uint64_t registered_ns; /* CLOCK_REALTIME */
	char comm[64];
	uint64_t limit_set; /* SetLimit{pid}; 0 = the default applies */
	struct mts_admin_cache admin; /* admit.c's */
};

/* What Watch was last told of a scope (the fleet, a group), and the
 * token bucket of its events (limits.c): Admit and Release move a scope's
 * state at request rate, and every subscriber hears each change. */
struct mts_scope_told {
	uint32_t state; /* the state its latest event said */
	double tokens;
	uint64_t ns; /* CLOCK_MONOTONIC of the last refill, 0 = full */
};

/* A group with at least one registered process, a limit, a watermark of
 * its own or an outstanding reservation. Its index is written to
 * slot->group; the entry is dropped when none of these is left. */
struct mts_group {
	char *name; /* NULL: free entry */
	/* The uid whose worker or Admit brought the name into existence,
	 * counted in reg->groups_by_uid; MTS_UID_TCP when none is counted
	 * (configured groups, admins, TCP peers). */
	uint32_t creator;
	uint32_t unvouched_uid; /* whose `unvouched`: a uid, or MTS_UID_MIXED */
	/* bytes, peak, limit, state, ... (mts_figures.h); of untrusted uids
	 * `bytes` holds only what is vouched for. */
	MTS_FIGURES_EMBED;
	uint32_t high_bp; /* own watermark (basis points), 0 = fleet's */
	/* admit.c: the exact sum behind `reserved` (which saturates), kept
	 * up to date as reservations come and go. */
	unsigned __int128 reserved_sum;
	/* rate.c: the measured figure's rate, sampled by the tick. */
	struct mts_wrate rate;
	struct mts_forecast_gate fgate;
	struct mts_scope_told told;
};

/* Fleet figures as of the latest tick (or exit, which subtracts at once):
 * those a group has too (mts_figures.h), then the fleet's own. */
struct mts_totals {
	MTS_FIGURES_EMBED;
	uint64_t allowance; /* the part of `bytes` no kernel figure holds yet
	                     * (vouch.c): never a reason to enforce */
	uint64_t ticks;
	uint64_t heartbeat_ns; /* CLOCK_MONOTONIC at the latest tick */
	uint32_t unregistered;
	/* rate.c, as for a group. */
	struct mts_wrate rate;
	struct mts_forecast_gate fgate;
	struct mts_scope_told told;
	uint64_t rate_ns;    /* CLOCK_MONOTONIC of the latest sample */
	uint32_t rate_slice; /* processes sampled next: dense[] slice */
};

/* Counters for /metrics. Written and read on the loop thread only. */
struct mts_stats {
	uint64_t registrations; /* successful Register */
	uint64_t reclaims;      /* slots reclaimed at a worker's exit */
};

/*
 * A uid's slot table (mtshm.h): the only shared memory a worker can write,
 * holding the slots of that uid's processes only. It is created at the
 * first registration of a process of the uid. When its last process
 * leaves, it is kept idle for MTS_TABLE_IDLE_MS. Otherwise a uid whose
 * short-lived processes come one at a time, like cron jobs or a shell's
 * commands, would pay a memfd creation, sealing and mapping per process.
 * At most MTS_TABLES_IDLE_MAX tables are idle at once. The workers keep
 * their own mappings either way.
 */
#define MTS_TABLE_IDLE_MS   10000u
#define MTS_TABLES_IDLE_MAX 16u
#define MTS_TABLE_LOST_MAX  16u

struct mts_table {
	uint32_t uid;
	uint32_t procs;         /* registered processes whose slot is in it */
	uint32_t held;          /* its slots held for a live process the
	                           restart did not adopt (mts_held_slot) */
	uint64_t idle_since_ns; /* CLOCK_MONOTONIC when procs fell to 0;
	                           0 while in use */
	struct mtshm_map map;   /* fd kept: handed to the uid's workers */
	struct mts_vouch_uid vouch; /* vouch.c */
	/* A worker that left this table's (trusted) uid without exec still
	 * maps its window on it, and can move that mapping over any page of
	 * the table (remap_file_pages) or grow it (mremap): every slot is in
	 * reach of whoever controls it now, for the table's life. Set by
	 * mts_table_taint; `taint_new` until vouch.c has looked at the
	 * table's processes; `tainted_uid` is the first leaver's uid now. */
	bool tainted, taint_new;
	uint32_t tainted_uid;
	/* Pages memtallyd could not read (fault.c): a spare stands in for
	 * each since. Page-aligned byte offsets in the table, as of the
	 * latest scan (mts_tables_faults); kept here, not allocated, since
	 * they are found when the machine has no memory to spare. More than
	 * fit: `lost_all`, every slot of the table counts as on one. */
	uint64_t lost[MTS_TABLE_LOST_MAX];
	uint32_t nlost;
	bool lost_all;
	bool lost_new; /* grew; vouch.c has not looked at its processes */
	/* Its processes' Watch events: a token bucket (limits.c). */
	double ev_tokens;
	uint64_t ev_ns; /* CLOCK_MONOTONIC of the last refill, 0 = full */
};

struct mts_state;

/* Refused workers remembered (see mts_registry.refused): retries of more
 * distinct workers than this at once are counted again. */
#define MTS_REFUSED_REMEMBERED 64u

/*
 * What the modules above the registry (vouching, admission, limits,
 * permissions) want to hear of it or to decide for it. It is given once
 * at init; mts_core_init() fills it. The registry calls these and knows
 * nothing of what they do. A NULL member is not called: with no
 * is_admin no one is an admin, and with no may_join anyone may join.
 */
struct mts_peer;
struct mts_registry_watch {
	/* `p` registered, was adopted after a restart, or began a new
	 * image (exec): its slot and group are set, its figures zero. */
	void (*joined)(struct mts_registry *reg, struct mts_proc *p);
	/* `p` leaves (exit) or its image ends (exec); its figures are still
	 * in the totals. */
	void (*leaving)(struct mts_registry *reg, const struct mts_proc *p);
	/* A uid got a slot table (created, or adopted after a restart). */
	void (*table_added)(struct mts_registry *reg, struct mts_table *t);
	/* Is `peer` an admin (exempt from the per-uid caps)? */
	bool (*is_admin)(const struct mts_registry *reg,
	                 const struct mts_peer *peer);
	/* May `peer` put a worker in group `name`? */
	bool (*may_join)(const struct mts_registry *reg,
	                 const struct mts_peer *peer, const char *name);
	/* Group `g` loses its entry (no member, limit or reservation
	 * left). */
	void (*group_gone)(struct mts_registry *reg, struct mts_group *g);
};

struct mts_registry {
	uv_loop_t *loop;
	const struct mts_registry_watch *watch; /* never NULL after init */
	/* Test switch MEMTALLY_TEST_NO_PEERPIDFD=1, read once at init:
	 * behave as on a kernel without SO_PEERPIDFD (registry.c). */
	bool no_peerpidfd;
	struct mtshm_map *map;      /* the header: ours is the writable map */
	struct mtshm_layout layout; /* private copy; never read back */
	int hdr_ro_fd;              /* read-only descriptor for workers */
	const char *label;          /* names the memfds (/proc/PID/maps) */
	uint64_t instance;          /* random, in table labels, kept across
	                               restarts through the state file */
	uint32_t slot_count;
	uint64_t threshold;

	struct mts_table **tables; /* one per uid with a registered process */
	uint32_t ntables;
	uint32_t tables_cap;
	uint64_t faults_seen; /* mts_fault_count() at the latest scan */
	bool lost_any;        /* a table has pages a spare stands in for */
	uint64_t lost_try_ns; /* CLOCK_MONOTONIC of the latest try to mend */
	struct mtshm_slot_id **slot_at; /* slot_count: slot s in its table,
	                                   NULL = free */
	uint64_t *slot_gens;            /* slot_count: latest generation */
	struct mts_state *state;        /* restart record, or NULL */

	/* Slots of adopted tables that name a live process of the table's
	 * uid the restart did not adopt (its record entry unwritten or
	 * damaged, its adoption failed). It still publishes into them, so
	 * they stay out of the free stack, neither zeroed nor handed to
	 * another worker, until it registers again (its client then
	 * carries their total into its new slot) or is gone
	 * (mts_registry_rebuild_free, mts_tables_sweep). */
	struct mts_held_slot {
		uint32_t slot, pid, uid;
		uint64_t start_time;
		uint64_t done_ns; /* CLOCK_MONOTONIC it re-registered, or 0 */
	} * held;
	uint32_t nheld;
	uint64_t held_check_ns;
	/* Per-pid limits of live workers a restart could not adopt (they
	 * register again): applied at that registration, the process known
	 * by its start time (mts_registry_keep_limit). */
	struct mts_kept_limit {
		uint32_t pid;
		uint64_t start_time, limit;
	} kept_limits[MTS_KEPT_LIMITS];
	uint32_t nkept_limits;

	struct mts_proc **by_slot; /* slot_count entries, NULL = free */
	uint32_t *free_slots;      /* stack of free slot indices */
	uint32_t nfree;
	uint32_t *dense; /* registered slots, dense: the tick walks these */
	uint32_t ndense;
	struct mts_proc **hash; /* pid -> proc, chained */
	uint32_t hash_mask;

	struct mts_group *groups;
	uint32_t groups_used; /* entries [0, groups_used) may be live */
	uint32_t groups_cap;
	/* Live groups each uid brought into existence (max_groups_per_uid);
	 * admins are not counted. */
	struct mts_uid_counts groups_by_uid;
	/* Watch subscriptions open per peer uid (max_watch_per_uid; admins
	 * are not counted): dispatch.c adds, conn.c subtracts at close. */
	struct mts_uid_counts watch_uids;

	struct mts_totals totals;
	struct mts_stats stats;
	struct mts_vouch_fleet vouch; /* vouch.c, during a tick */

	struct mts_policy policy; /* in force; owned (deep copy) */
	uint32_t server_uid;      /* geteuid() at init: always authorised */
	bool closed;              /* mts_registry_close() ran */
	/* The state of the modules above the registry, each written by its
	 * own module only and opaque here: core.c allocates them with the
	 * registry (mts_core_init); NULL with mts_registry_init alone. */
	struct mts_admission *adm;      /* admit.c: reservations, tasks */
	struct mts_kinds *kinds;        /* kinds.c: learned sizes */
	struct mts_limits_state *lim;   /* limits.c: enforcement, events */
	struct mts_rss_state *rss;      /* rss.c: sweeps in flight */
	struct mts_tick_stats *tick;    /* core.c: tick timings */
	struct mts_dispatch_stats *req; /* dispatch.c: request counters */
	struct mts_guard_state *guard;  /* guard.c: the node guard */
	/* The last refusals, so that a worker's retries are neither counted
	 * again in totals.unregistered (no free slot) nor logged again
	 * (a group it may not join). */
	struct {
		struct {
			uint32_t pid;
			uint64_t start_time;
		} slot[MTS_REFUSED_REMEMBERED];
		uint32_t slot_next;
		struct {
			uint32_t uid;
			uint64_t hash;
		} group[MTS_REFUSED_REMEMBERED];
		uint32_t group_next;
	} refused;
};

/* Outcome of a registration, for the Registered answer. */
struct mts_reg_result {
	uint32_t slot;
	uint64_t slot_generation;
	const char *group; /* owned by the registry */
	int fds[2];        /* header (read-only), the uid's table: borrowed,
	                      sent with the answer (SCM_RIGHTS) */
};

/* Who is on the other end of a connection. A Unix peer has SO_PEERCRED; a
 * TCP peer on this host has the uid the kernel reports for its socket
 * (sock_diag: has_cred, uid, no pid and no gid); any other TCP peer is
 * unidentified (has_cred false) and needs the token on every request. */
struct mts_peer {
	int fd;        /* the socket, for SO_PEERPIDFD; -1 when there is none */
	bool has_cred; /* uid known (and, on the Unix socket, pid and gid) */
	uint32_t pid;  /* SO_PEERCRED; 0 over TCP */
	uint32_t uid;
	uint32_t gid; /* SO_PEERCRED (valid with has_cred, not TCP) */
	/* CLOCK_BOOTTIME (ns) when the connection was accepted: a process
	 * started after it cannot be the one that connected. */
	uint64_t accept_boot_ns;
	bool tcp;            /* a TCP peer */
	bool token_ok;       /* the request being answered carries the
	                      * server's tcp_token (set by mts_dispatch) */
	bool token_seen;     /* some request on it carried it */
	bool token_refused;  /* of unknown uid, it asked without it: the
	                      * connection is closed after the answer */
	char addr[64];       /* a TCP peer's address:port, for the logs */
	bool watching;       /* set by a Watch request: events are pushed */
	uint64_t watch_id;   /* the Watch request's id, echoed on events */
	bool watch_admin;    /* an admin when it sent the Watch: every uid's
	                      * events reach it (show_others); asked again
	                      * at each reload (mts_conns_reauthorise) */
	bool watch_by_token; /* it was the token that made it one */
	bool watch_own;      /* Watch.own: only its own uid's events */
	bool watch_counted;  /* counted in reg->watch_uids under `uid` */
	bool gone; /* closed by the server during a turn (an event that could
	            * not be written to it): mts_input() stops, fd is -1 */
	/* Descriptors to pass with the next answer written (a Registered):
	 * borrowed from the registry, attached to its first byte. */
	int send_fds[2];
	uint8_t nsend_fds;
};

/* The uid a peer's log lines are budgeted under (mts_log_uid): its
 * own (a TCP peer's too, when sock_diag named it), or MTS_UID_TCP for
 * every peer of unknown uid. */
static inline unsigned mts_peer_log_uid(const struct mts_peer *peer)
{
	return peer->has_cred ? peer->uid : MTS_UID_TCP;
}

/* `map` must be a freshly created header (its fd kept); the registry
 * keeps pointers to map, label and state (NULL: no restart record). */
int mts_registry_init(struct mts_registry *reg, uv_loop_t *loop,
                      struct mtshm_map *map, const char *label,
                      struct mts_state *state,
                      const struct mts_registry_watch *watch);

/* Slot `slot`'s identity in its table, or NULL when the slot is free. */
static inline struct mtshm_slot_id *mts_slot(const struct mts_registry *reg,
                                             uint32_t slot)
{
	return reg->slot_at[slot];
}

/* Close every pidfd poll handle (their close callbacks free the procs).
 * Slots are left as they are for the next server. */
void mts_registry_close(struct mts_registry *reg);

/* Free the tables. Call after the loop ran the close callbacks. */
void mts_registry_free(struct mts_registry *reg);

/*
 * Register the peer per docs/ARCHITECTURE.md. Returns 0 and fills *res, or
 * a negative code: -ENOSPC (no free slot; counted as unregistered),
 * -ESRCH (the peer is gone), -EINVAL (a bad name), -errno.
 */
int mts_register(struct mts_registry *reg, const struct mts_peer *peer,
                 const char *group, const char *task, uint64_t image_id,
                 struct mts_reg_result *res);

/*
 * mts_register() for a new image of a process that may already be
 * registered (it may follow an exec): registers, replacing the old
 * image's slot, only if this process (pid and start time) is registered;
 * otherwise -ENOENT, with nothing created and no /proc read.
 */
int mts_register_if_known(struct mts_registry *reg, const struct mts_peer *peer,
                          const char *group, const char *task,
                          uint64_t image_id, struct mts_reg_result *res);

/* Publish reg->totals into the header under the seqlock. */
void mts_publish(struct mts_registry *reg);

/* The start time of the local process `peer` names, known to be the one
 * that connected (SO_PEERPIDFD, or the registration's vouching where the
 * kernel lacks it). 0, or -errno: no process to name (TCP, gone, or its
 * pid now another's). */
int mts_peer_start_time(const struct mts_registry *reg,
                        const struct mts_peer *peer, uint64_t *start);

/* The registered process `pid`, or NULL. */
struct mts_proc *mts_find_pid(const struct mts_registry *reg, uint32_t pid);

/* The live group named `name`, or NULL. */
struct mts_group *mts_find_group(const struct mts_registry *reg,
                                 const char *name);

/* Group entries (registry.c). The index stays valid while the entry lives;
 * `reg->groups` may move when an entry is created. Names are checked with
 * mt_name_ok() (mtcommon.h). */
/* Index of group `name`, creating an empty entry if needed. 0 or -ENOMEM. */
int mts_group_ensure(struct mts_registry *reg, const char *name,
                     uint32_t *index);
/* The same for a peer: a group it may not join (mts_may_join_group) is
 * -EACCES; a new group past its uid's max_groups_per_uid is -EDQUOT
 * (admins exempt). Nothing is created then. */
int mts_group_ensure_peer(struct mts_registry *reg, const struct mts_peer *peer,
                          const char *name, uint32_t *index);
/* Slots one (non-admin) uid may hold: max_slots_per_uid, by default
 * slot_count / MTS_DEFAULT_PER_UID_DIV; MTS_CAP_NONE = no cap. */
uint32_t mts_slots_per_uid(const struct mts_registry *reg);
/* Free entry `index` if nothing keeps it (processes, limit, watermark,
 * reservations). */
void mts_group_gc(struct mts_registry *reg, uint32_t index);

/* ---- slot tables and adoption after a restart (adopt.c drives these) ---- */

/* A live worker found in the restart record, checked against /proc. */
struct mts_adopted {
	uint32_t slot;
	uint32_t pid;
	uint32_t uid;
	int pidfd; /* opened before the start time was checked */
	uint64_t start_time;
	uint64_t image_id;
	uint64_t registered_ns;
	uint64_t slot_gen;
	char group[MT_NAME_MAX + 1]; /* "" = "default" */
	char task[MT_NAME_MAX + 1];
	char comm[64];      /* from the same /proc/PID/stat as start_time */
	uint64_t limit_set; /* its SetLimit{pid}; 0: none */
	/* The restart record's: the registered image's arg_start (0:
	 * unknown), its name, and whether it exec'd one that has not
	 * registered. */
	uint64_t exec_mark;
	char registered_comm[64];
	bool image_stale;
};

/* A command name as answers carry it: UTF-8 without hostile code points,
 * each byte that is not one a '?', cut to cap - 1 bytes (registry.c). */
void mts_comm_copy(char *dst, size_t cap, const char *src);

/* The table of `uid`, or NULL. */
struct mts_table *mts_table_find(const struct mts_registry *reg, uint32_t uid);

/* The memfd name of `uid`'s table, "LABEL-slots:INSTANCE:UID": made by
 * the server that creates it, looked for by one that adopts it. */
void mts_table_label(const struct mts_registry *reg, uint32_t uid, char *buf,
                     size_t cap);

/* A process of table `t` left `t`'s uid (now `uid`) without exec: taint
 * `t` (see mts_table.tainted), in its processes' restart entries too. */
void mts_table_taint(struct mts_registry *reg, struct mts_table *t,
                     uint32_t uid);

/* Take over `map` (a table reopened from a worker, fd kept) as uid's
 * table. 0 or -ENOMEM (the caller still owns map). */
int mts_table_adopt(struct mts_registry *reg, uint32_t uid,
                    struct mtshm_map *map);

/* Registry side of adoption: take over a slot as it is (counters, lanes
 * and generation untouched), in `table`. On success the registry owns
 * a->pidfd; on -EAGAIN too (its handle close frees it); on another error
 * the caller still owns it. */
int mts_registry_adopt_slot(struct mts_registry *reg,
                            const struct mts_adopted *a,
                            struct mts_table *table);

/* `t` may have lost its last process: mark it idle (see struct
 * mts_table), freeing the longest idle table beyond MTS_TABLES_IDLE_MAX. */
void mts_table_gc(struct mts_registry *reg, struct mts_table *t);

/* Free the tables idle for MTS_TABLE_IDLE_MS or more at `now_ns`
 * (CLOCK_MONOTONIC). The tick calls it. */
void mts_tables_sweep(struct mts_registry *reg, uint64_t now_ns);

/* Pages of the tables memtallyd could not read since the latest scan
 * (fault.c): each table's `lost` again (`lost_new` where it grew, for
 * vouch.c). Once a second while there are some, each is given its memory
 * again if the machine has it, and mapped back. Costs one atomic load
 * and a flag otherwise. The tick calls it first. */
void mts_tables_faults(struct mts_registry *reg);
/* Is slot `slot` of `t` on a page memtallyd could not read? */
bool mts_table_slot_lost(const struct mts_registry *reg,
                         const struct mts_table *t, uint32_t slot);

/* Recompute the free-slot stack from by_slot[], and start each slot's
 * generations above what the adopted tables hold (after adoption). */
void mts_registry_rebuild_free(struct mts_registry *reg);

/* A restart could not adopt live worker `pid` (started at `start_time`),
 * whose per-pid limit was `limit`: it is its own again when the worker
 * registers again. The last MTS_KEPT_LIMITS are kept. */
void mts_registry_keep_limit(struct mts_registry *reg, uint32_t pid,
                             uint64_t start_time, uint64_t limit);

/* Write `p`'s entry in the restart record (mts_state_put). */
void mts_registry_record(const struct mts_registry *reg,
                         const struct mts_proc *p);

#endif /* MTS_REGISTRY_H */
