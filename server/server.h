/*
 * server.h - private header of memtallyd. Nothing outside server/ (and its
 * unit tests) includes it.
 *
 * Pieces and who owns what:
 *  - struct mts_registry (registry.c): the authoritative record of every
 *    registered worker (pid, start time, uid, pidfd), the slot allocator,
 *    the group table, and the totals of the latest tick. It is the only
 *    writer of server-owned slot fields and of the header's fleet snapshot.
 *  - dispatch.c: one request frame in, one response frame out. No sockets,
 *    so tests and fuzz targets drive it with plain buffers.
 *  - conn.c: the Unix listener and per-connection buffers (framing,
 *    pipelining, back-pressure).
 *  - server.c: lifecycle (listener, restart record, header, tick, stop).
 *  - state.c: the restart record; adopt.c: adoption after a restart.
 *  - main.c: flags, signals, the loop.
 *  - config.c: the INI file and flags -> struct mts_settings.
 *  - limits.c: hysteresis states, limits, Watch events, enforcement.
 *  - admit.c: admission, reservations and their reconciliation by task.
 *  - auth.c: who may SetLimit or release another's reservation.
 *  - rss.c: resident set sizes read from /proc at their own cadence.
 *  - hooks.c (hooks.h): a shell command run at every fleet or group state
 *    change, asynchronously, one per scope at a time, bounded in time.
 *
 * Everything runs on one libuv loop thread; nothing here is locked.
 * Functions return 0 or -errno unless their comment says otherwise.
 */
#ifndef MEMTALLY_SERVER_H
#define MEMTALLY_SERVER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/socket.h>
#include <sys/types.h>

#include <uv.h>

#include "hooks.h"
#include "memtally.pb-c.h"
#include "memtally_query.h"
#include "mtcommon.h"
#include "mtframe.h"
#include "mtshm.h"

#define MTS_VERSION MEMTALLY_VERSION_STRING

#define MTS_DEFAULT_SOCKET    MT_DEFAULT_SOCKET
#define MTS_DEFAULT_SEGMENT   "memtally"
#define MTS_DEFAULT_SLOTS     4096u
#define MTS_DEFAULT_TICK_MS   10u
#define MTS_TICK_MAX_MS       60000u
#define MTS_DEFAULT_THRESHOLD MT_DEFAULT_THRESHOLD

/* Largest group or task name a worker may register (the client keeps at
 * most 63 bytes of a group; this leaves room without being unbounded). */
#define MTS_NAME_MAX 255u

/* ---- procfs.c -------------------------------------------------------- */

/* Start time (field 22 of /proc/PID/stat, clock ticks since boot) from the
 * text of a stat file. Parses after the last ')' because comm may hold
 * spaces and parentheses. Returns 0 or -EINVAL. */
int mts_parse_stat_starttime(const char *stat, uint64_t *out);

/* Read the start time of `pid`. Returns 0, -ENOENT/-ESRCH (gone), -EINVAL. */
int mts_read_starttime(pid_t pid, uint64_t *out);

/* False when `pid` does not exist or has exited (a zombie not yet
 * reaped); true when it runs or we cannot tell. A heuristic for other
 * servers only: workers are tracked by pidfd and start time. */
bool mts_pid_running(pid_t pid);

/* Read /proc/PID/comm into buf (NUL-terminated, newline stripped); on
 * failure buf holds "". */
void mts_read_comm(pid_t pid, char *buf, size_t cap);

/* ---- policy: what config.c produces, limits.c applies ------- */

/* What limits compare: accounted heap bytes, resident set, or the larger
 * of the two (per process, per group and for the fleet, each on its own
 * sums). */
enum mts_measure {
	MTS_MEASURE_ACCOUNTED = 0,
	MTS_MEASURE_RSS = 1,
	MTS_MEASURE_MAX = 2,
};

/* "accounted", "rss", "max". */
const char *mts_measure_name(enum mts_measure m);

/* A [group NAME] section. */
struct mts_group_policy {
	char *name;
	uint64_t limit;   /* 0 = none */
	uint32_t high_bp; /* 0 = the fleet's watermark */
};

/* Percentages are kept in basis points (1% = 100 bp) so "92.5" is exact. */
#define MTS_BP_ONE 10000u

#define MTS_DEFAULT_HIGH_BP       9000u  /* 90% */
#define MTS_DEFAULT_HYST_BP       500u   /* 5% */
#define MTS_DEFAULT_RSS_MS        1000u
#define MTS_DEFAULT_TTL_S         300u
#define MTS_DEFAULT_MAX_TTL_S     86400u
#define MTS_DEFAULT_GRACE_MS      10000u
/* A peer may hold at most this many reservations in all; each is ~100 B. */
#define MTS_RESV_MAX              65536u
/* "r-" + 16 hex digits. */
#define MTS_RESV_ID_LEN           18u
/* [admission] max_reservations_per_uid: one uid's outstanding
 * reservations, so that one peer holding many cannot use up MTS_RESV_MAX
 * for everyone. Admins are exempt (auth.c). */
#define MTS_DEFAULT_MAX_RESV_PER_UID 1024u

/* Everything a SIGHUP reload may change. Strings are owned (malloc). */
struct mts_policy {
	uint64_t fleet_limit;   /* 0 = none */
	uint32_t high_bp;       /* fleet (and default) watermark */
	uint32_t hyst_bp;       /* hysteresis, of the limit */
	uint64_t process_limit; /* default per-process limit, 0 = none */
	enum mts_measure measure;
	uint32_t rss_interval_ms;
	struct mts_group_policy *groups;
	uint32_t ngroups;
	uint32_t default_ttl_s;
	uint32_t max_ttl_s;
	int enforce_signal; /* 0 = enforcement off */
	uint32_t grace_ms;
	bool has_admin_uid;
	uint32_t admin_uid;
	bool has_admin_gid;
	uint32_t admin_gid;
	char *tcp_token; /* NULL = none: no TCP peer is authorised */
	uint32_t max_resv_per_uid; /* 0 = no per-uid cap */
	uint32_t growth_window_ms;    /* rate.c: the rate's window */
	uint32_t forecast_horizon_ms; /* `high` when the limit is forecast
	                                 within this; 0 = off */
};

/* Defaults: no limits, 90% watermark, 5% hysteresis, accounted, ... */
void mts_policy_defaults(struct mts_policy *p);
/* Deep copy into *dst (which is overwritten, not freed). 0 or -ENOMEM. */
int mts_policy_copy(struct mts_policy *dst, const struct mts_policy *src);
/* Free the strings and groups; the struct is zeroed. Accepts NULL. */
void mts_policy_free(struct mts_policy *p);
/* The [group NAME] entry for `name`, or NULL. */
const struct mts_group_policy *mts_policy_group(const struct mts_policy *p,
                                                const char *name);

/* A state change, as pushed to Watch subscribers. */
struct mts_event {
	const char *scope; /* "fleet", "group:NAME", "pid:N" */
	uint32_t state;    /* enum mtshm_state */
	uint32_t previous;
	uint64_t bytes;    /* accounted */
	uint64_t rss;
	uint64_t limit;
	uint64_t reserved;
	uint64_t time_ns; /* CLOCK_REALTIME */
	const char *reason; /* why, in words: "forecast: limit in 12 s ..." */
	double growth;      /* bytes per second of the measured figure */
	double forecast_s;  /* seconds to the limit, 0 = no forecast */
};

struct mts_resv;
struct mts_task;
struct mts_rss_sweep;

/* ---- rate.c: growth rate and forecast --------------------------------- */

#define MTS_DEFAULT_GROWTH_WINDOW_MS 10000u
#define MTS_GROWTH_WINDOW_MIN_MS     1000u
#define MTS_GROWTH_WINDOW_MAX_MS     3600000u
#define MTS_FORECAST_HORIZON_MAX_MS  86400000u
/* Fleet and groups are sampled this often (a tick longer than this: every
 * tick); processes MTS_RATE_PROC_SLICES ticks apart, a slice of them per
 * tick, so no tick makes a second pass over every process. */
#define MTS_RATE_SAMPLE_MS   100u
#define MTS_RATE_PROC_SLICES 32u
/* A forecast `high` is left only when the forecast is beyond the horizon
 * plus this margin (or gone) for one growth window. */
#define MTS_FORECAST_LEAVE_PCT 50u

/* The weighted sums behind one rate (rate.c). 64 bytes: one line. */
struct mts_rate {
	double s0, st, sv, stt, stv; /* relative to the latest sample */
	uint64_t last_ns;            /* CLOCK_MONOTONIC; 0 = no sample */
	uint64_t last_v;
	uint64_t first_ns; /* start of the current run of samples */
};

/* The fleet's and a group's rate: an ordinary least-squares line through
 * the samples of the last window (a ring of at most MTS_WRATE_SAMPLES,
 * spaced at least window / (MTS_WRATE_SAMPLES - 1) apart). Unlike the
 * weighted fit of a process's rate, it forgets a sample entirely once it
 * is a window old: a figure flat for a window reads exactly 0. */
#define MTS_WRATE_SAMPLES 64u
struct mts_wrate {
	uint64_t t[MTS_WRATE_SAMPLES]; /* CLOCK_MONOTONIC ns */
	uint64_t v[MTS_WRATE_SAMPLES];
	uint32_t head; /* next write */
	uint32_t n;
};

/* Add sample `v` at `now_ns` (kept if the newest is old enough). */
void mts_wrate_add(struct mts_wrate *r, uint64_t now_ns, uint64_t v,
                   uint64_t window_ns);
/* Slope in bytes per second of the samples of the window ending at the
 * newest; 0 until they span a fifth of the window. */
double mts_wrate_get(const struct mts_wrate *r, uint64_t window_ns);

/* exp() of the last interval, reused while intervals repeat (a slice of
 * processes sampled at one tick all have the same). */
struct mts_decay_cache {
	uint64_t dt_ns, window_ns;
	double decay;
};

/* Forecast hysteresis of one scope. */
struct mts_forecast_gate {
	bool on;                 /* the forecast holds the scope `high` */
	uint64_t clear_since_ns; /* out of the margin since, 0 = not */
};

void mts_rate_reset(struct mts_rate *r);
/* e^(-dt / tau) for a window (cached in `c` when not NULL). */
double mts_rate_decay(struct mts_decay_cache *c, uint64_t dt_ns,
                      uint64_t window_ns);
/* Add sample `v` taken at `now_ns`. */
void mts_rate_add(struct mts_rate *r, uint64_t now_ns, uint64_t v,
                  uint64_t window_ns, struct mts_decay_cache *cache);
/* Bytes per second (negative: shrinking); 0 until the samples span a
 * fifth of the window. */
double mts_rate_get(const struct mts_rate *r, uint64_t window_ns);
/* Seconds until `value` reaches `limit` at `rate`; 0 = no forecast (no
 * limit, not growing, or already there). */
double mts_forecast_s(double rate, uint64_t value, uint64_t limit);
/* Step the gate with the current forecast `secs` (0 = none): on when
 * secs <= horizon; off again only after hold_ns beyond horizon x (1 +
 * MTS_FORECAST_LEAVE_PCT%) or without a forecast. horizon_ms 0: always
 * off. Returns g->on. */
bool mts_forecast_gate(struct mts_forecast_gate *g, double secs,
                       uint64_t horizon_ms, uint64_t hold_ns, uint64_t now_ns);

/* ---- registry.c ------------------------------------------------------ */

/* A registered worker. Lives from registration until its uv_poll's close
 * callback; `slot` is released (pid = 0) when it exits, before that.
 *
 * Every tick reads (and may write) the first 64 bytes of each process: the
 * sum's and the limits pass's fields. They come first and the record is
 * MTS_PROC_ALIGN-aligned, so a tick touches one line per process instead
 * of four scattered ones (at 16384 processes the tick is bound by lines
 * moved, bench/RESULTS.md, server). Keep tick-time fields in that line. */
#define MTS_PROC_ALIGN 64u
struct mts_proc {
	/* Hot: each tick (sum, limits). */
	uint64_t bytes; /* latest tick: heap (negative sums show as 0) +
			 * mapped; what limits compare */
	uint64_t peak;
	uint64_t error_bytes; /* threshold x threads */
	uint64_t rss;   /* resident bytes, /proc/PID/statm, slower cadence */
	uint64_t limit; /* per-process limit in force, 0 = none */
	uint64_t mapped; /* part of `bytes`: memory it mapped itself (the
			  * lanes' flush count, for queries only, is read
			  * from the slot then: it has no place here) */
	uint32_t slot;
	uint32_t group; /* index in reg->groups */
	uint32_t threads;
	uint16_t state; /* enum mtshm_state against `limit` */
	bool corrupt;   /* sticky until the slot is reset */
	/* Growth rate (rate.c): one slice of processes per tick, never in
	 * the hot line above. */
	struct mts_rate rate;
	/* Warm: enforcement and reservations (only while they have work). */
	uint32_t pid;
	uint32_t dense; /* index in reg->dense */
	char *task;
	uint64_t last_signal_ns; /* enforcement: CLOCK_MONOTONIC, 0 = never */
	/* Cold: registration, exit, queries. */
	uv_poll_t poll; /* on the pidfd; poll.data = this */
	struct mts_registry *reg;
	struct mts_table *table; /* its uid's slot table */
	uint64_t slot_gen;       /* generation of its slot assignment */
	struct mts_proc *hnext; /* pid hash chain */
	uint32_t uid;
	int pidfd;
	uint64_t start_time;
	uint64_t image_id;
	uint64_t registered_ns; /* CLOCK_REALTIME */
	char comm[64];
	uint64_t limit_set; /* SetLimit{pid}; 0 = the default applies */
	/* admit.c: whether the worker is an admin's (auth.c), cached for
	 * the tick; valid while admin_epoch is reg->admin_epoch and uid and
	 * image_id are still admin_uid and admin_image. */
	uint32_t admin_epoch; /* 0: not known */
	uint32_t admin_uid;
	uint64_t admin_image;
	bool admin;
};

/* A group with at least one registered process, a limit, a watermark of
 * its own or an outstanding reservation. Its index is written to
 * slot->group; the entry is dropped when none of these is left. */
struct mts_group {
	char *name; /* NULL: free entry */
	uint32_t processes;
	uint64_t bytes; /* latest tick, mapped included */
	uint64_t mapped;
	uint64_t peak;
	uint64_t error_bytes;
	/* Filled by the limits code. */
	uint64_t rss;
	uint64_t limit;    /* 0 = none */
	uint64_t reserved; /* outstanding admission reservations */
	uint32_t state;    /* enum mtshm_state */
	uint32_t high_bp;      /* own watermark (basis points), 0 = fleet's */
	uint32_t reservations; /* outstanding reservations naming the group */
	/* admit.c: the exact sum behind `reserved` (which saturates), kept
	 * up to date as reservations come and go. */
	unsigned __int128 reserved_sum;
	/* rate.c: the measured figure's rate, sampled by the tick. */
	struct mts_wrate rate;
	double growth;     /* bytes per second, as of the latest sample */
	struct mts_forecast_gate fgate;
};

/* Fleet figures as of the latest tick (or exit, which subtracts at once). */
struct mts_totals {
	uint64_t bytes; /* heap + mapped */
	uint64_t mapped;
	uint64_t peak;
	uint64_t error_bytes;
	uint64_t ticks;
	uint64_t heartbeat_ns; /* CLOCK_MONOTONIC at the latest tick */
	uint32_t processes;
	uint32_t unregistered;
	/* Filled by the limits code. */
	uint64_t rss;
	uint64_t limit;    /* fleet limit, 0 = none */
	uint64_t reserved; /* outstanding admission reservations */
	uint32_t state;    /* enum mtshm_state */
	uint32_t reservations; /* outstanding reservations (count) */
	/* rate.c, as for a group. */
	struct mts_wrate rate;
	double growth;
	struct mts_forecast_gate fgate;
	uint64_t rate_ns;    /* CLOCK_MONOTONIC of the latest sample */
	uint32_t rate_slice; /* processes sampled next: dense[] slice */
};

/* Why an Admit was denied, for the logs and the metrics' `reason` label. */
enum mts_denial {
	MTS_DENY_FLEET_LIMIT, /* fleet bytes + reserved + request > limit */
	MTS_DENY_GROUP_LIMIT,
	MTS_DENY_INVALID, /* a malformed request */
	MTS_DENY_UID_CAP, /* the uid holds max_reservations_per_uid */
	MTS_DENY__COUNT,
};

/* Counters for /metrics. Written and read on the loop thread only. */
struct mts_stats {
	uint64_t registrations;      /* successful Register */
	uint64_t reclaims;           /* slots reclaimed at a worker's exit */
	uint64_t admissions;         /* Admit granted */
	uint64_t denials[MTS_DENY__COUNT];
	uint64_t releases;           /* reservations ended by Release */
	uint64_t expirations;        /* reservations ended by their TTL */
	uint64_t enforcement_signals;
	uint64_t events;             /* Watch events sent */
	uint64_t protocol_errors;    /* error responses for bad frames */
	uint64_t last_tick_ns;       /* duration of the latest tick */
	uint64_t tick_ns_sum;        /* all ticks' durations, for _sum */
	uint64_t tick_count;
	uint64_t fulfilled;          /* reservations ended: task's end */
	uint64_t watch_disconnects;  /* Watch subscribers not reading */
	uint64_t reloads;            /* SIGHUP reloads applied */
	uint64_t reload_failures;    /* SIGHUP reloads rejected (bad value) */
	uint64_t auth_denials;       /* SetLimit/Release refused */
	/* conn.c: the server-wide connection budget. */
	uint64_t conn_rejected;  /* accepted over max_connections, closed */
	uint64_t conn_throttled; /* reading stopped: over max_buffered */
	uint64_t conn_evicted;   /* disconnected: largest holder, over it */
	uint64_t conn_pressure;  /* times the buffered total passed the cap */
	uint64_t conn_open;      /* gauge: open connections */
	uint64_t conn_buffered;  /* gauge: their input + unwritten output */
	uint64_t conn_max;       /* max_connections in force */
	uint64_t buffered_max;   /* max_buffered in force */
	/* conn.c: per-uid connection cap and idle timeout. */
	uint64_t conn_rejected_uid; /* closed: over max_connections_per_uid */
	uint64_t conn_idle_closed;  /* closed: no request for idle_timeout */
	uint64_t conn_max_per_uid;  /* max_connections_per_uid in force */
};

/* "fleet_limit", "group_limit", "invalid": the `reason` label. */
const char *mts_denial_name(enum mts_denial d);

/*
 * A uid's slot table (mtshm.h): the only shared memory a worker can write,
 * holding the slots of that uid's processes only. Created at the first
 * registration of a process of the uid. When its last process leaves it
 * is kept idle for MTS_TABLE_IDLE_MS (a uid whose short-lived processes
 * come one at a time, like cron jobs or a shell's commands, would
 * otherwise pay a memfd creation, sealing and mapping per process:
 * measured +35 us of server CPU per registration), and at most
 * MTS_TABLES_IDLE_MAX tables are idle at once. The workers keep their
 * own mappings either way.
 */
#define MTS_TABLE_IDLE_MS   10000u
#define MTS_TABLES_IDLE_MAX 16u
struct mts_table {
	uint32_t uid;
	uint32_t procs;       /* registered processes whose slot is in it */
	uint64_t idle_since_ns; /* CLOCK_MONOTONIC when procs fell to 0;
	                           0 while in use */
	struct mtshm_map map; /* fd kept: handed to the uid's workers */
};

struct mts_state;

/* A count per uid (open addressing): reservations per owner (admit.c),
 * connections per peer uid (conn.c). MTS_UID_TCP stands for every peer
 * without credentials (TCP): one bucket. */
#define MTS_UID_TCP UINT32_MAX
struct mts_uid_count {
	uint32_t uid;
	uint32_t count; /* 0: free entry */
};
struct mts_uid_counts {
	struct mts_uid_count *e;
	uint32_t mask; /* entries - 1; e == NULL: empty */
	uint32_t used;
};

/* Refused workers remembered (see mts_registry.refused): retries of more
 * distinct workers than this at once are counted again. */
#define MTS_REFUSED_REMEMBERED 64u

struct mts_registry {
	uv_loop_t *loop;
	struct mtshm_map *map;     /* the header: ours is the writable map */
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
	struct mtshm_slot_id **slot_at; /* slot_count: slot s in its table,
	                                   NULL = free */
	uint64_t *slot_gens;            /* slot_count: latest generation */
	struct mts_state *state;        /* restart record, or NULL */

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

	struct mts_totals totals;
	struct mts_stats stats;

	/* Limits, admission, events (limits.c, admit.c). */
	struct mts_policy policy; /* in force; owned (deep copy) */
	uint32_t server_uid;      /* geteuid() at init: always authorised */
	struct mts_resv **resv;   /* outstanding reservations, unordered */
	uint32_t nresv;
	uint32_t resv_cap;
	struct mts_resv **resv_ids; /* id -> reservation, open addressing */
	uint32_t resv_ids_mask;
	struct mts_resv **resv_heap; /* TTL still applies, by expiry (min) */
	uint32_t resv_nheap;         /* capacity: resv_cap */
	unsigned __int128 resv_sum;  /* exact sum behind totals.reserved */
	struct mts_task **tasks; /* task name -> its reservations, chained */
	uint32_t tasks_mask;
	uint32_t ntasks;
	struct mts_task *tasks_seen;  /* tasks a worker registered with */
	uint64_t fleet_over_since_ns; /* CLOCK_MONOTONIC; 0 = not over */
	bool enforce_idle_logged;     /* "nothing to signal" said once */
	bool closed;                  /* mts_registry_close() ran */
	/* Called on every state change (Watch). May be NULL. */
	void (*on_event)(void *ctx, const struct mts_event *ev);
	void *event_ctx;
	struct mts_rss_sweep *rss_sweep; /* the sweep in flight, or NULL */
	/* The last workers refused a slot, so that a worker's
	 * retries are not counted again in totals.unregistered. */
	struct {
		uint32_t pid;
		uint64_t start_time;
	} refused[MTS_REFUSED_REMEMBERED];
	uint32_t refused_next;
	/* admit.c: outstanding reservations per owner uid, and what the
	 * cached admin flags of workers (mts_proc.admin) were computed
	 * against; a change of any bumps admin_epoch. */
	struct mts_uid_counts resv_uids;
	uint32_t admin_epoch;
	uint32_t admin_seen[5]; /* server uid, has/uid, has/gid */
};

/* Outcome of a registration, for the Registered answer. */
struct mts_reg_result {
	uint32_t slot;
	uint64_t slot_generation;
	const char *group; /* owned by the registry */
	int fds[2];        /* header (read-only), the uid's table: borrowed,
	                      sent with the answer (SCM_RIGHTS) */
};

/* Who is on the other end of a connection. */
struct mts_peer {
	int fd; /* the socket, for SO_PEERPIDFD; -1 when there is none */
	bool has_cred;
	uint32_t pid; /* SO_PEERCRED */
	uint32_t uid;
	uint32_t gid;      /* SO_PEERCRED (valid with has_cred) */
	bool tcp;          /* a TCP peer: no credentials, token only */
	bool watching;     /* set by a Watch request: events are pushed */
	uint64_t watch_id; /* the Watch request's id, echoed on events */
	bool gone; /* closed by the server during a turn (an event that could
	            * not be written to it): mts_input() stops, fd is -1 */
	/* Descriptors to pass with the next answer written (a Registered):
	 * borrowed from the registry, attached to its first byte. */
	int send_fds[2];
	uint8_t nsend_fds;
};

/* `map` must be a freshly created header (its fd kept); the registry
 * keeps pointers to map, label and state (NULL: no restart record). */
int mts_registry_init(struct mts_registry *reg, uv_loop_t *loop,
                      struct mtshm_map *map, const char *label,
                      struct mts_state *state);

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

/* One aggregation pass; publishes the fleet snapshot. */
void mts_tick(struct mts_registry *reg);

/* Publish reg->totals into the header under the seqlock. */
void mts_publish(struct mts_registry *reg);

/* The registered process `pid`, or NULL. */
struct mts_proc *mts_find_pid(const struct mts_registry *reg, uint32_t pid);

/* The live group named `name`, or NULL. */
struct mts_group *mts_find_group(const struct mts_registry *reg,
                                 const char *name);

/* ---- state.c: the restart record ------------------------------------- */

/*
 * What a restarted memtallyd needs to adopt the workers of the one before:
 * a file only the server can write (owned by its uid, mode 0600, one link,
 * opened without following symlinks), with the geometry, the instance id
 * and one fixed-size record per slot (pid, uid, start time, image id,
 * generation, group, task). Written with pwrite() as workers come and go,
 * never mapped: a truncated or damaged file reads as fewer records, it
 * cannot fault. An flock() held for the server's life tells a second
 * server that this one is alive.
 */
struct mts_state_rec {
	uint32_t pid;           /*   0 0 = free */
	uint32_t uid;           /*   4 */
	uint64_t start_time;    /*   8 /proc/PID/stat starttime */
	uint64_t image_id;      /*  16 */
	uint64_t registered_ns; /*  24 CLOCK_REALTIME */
	uint64_t slot_gen;      /*  32 */
	uint64_t check;         /*  40 MTS_STATE_REC_CHECK ^ pid ^ slot */
	char group[64];         /*  48 */
	char task[64];          /* 112 */
	uint8_t spare[80];      /* 176 */
};
#define MTS_STATE_REC_SIZE 256u
_Static_assert(sizeof(struct mts_state_rec) == MTS_STATE_REC_SIZE, "rec");

/* Geometry and identity a state file records (and a restart adopts). */
struct mts_state_info {
	uint32_t slots;
	uint32_t lanes;
	uint64_t threshold;
	uint64_t instance;
};

/*
 * Open (or create) the state file at `path` and lock it. When it exists,
 * is ours and valid, and `reset` is false, *adopt is set and *info gets
 * what it records; otherwise it is (re)initialised from *info (a file we
 * do not own, with other links or the wrong mode is never written: it is
 * unlinked and replaced, or, when that fails, the server runs without a
 * restart record: *out = NULL, warning logged). Returns 0, -EBUSY (a live
 * server holds the lock) or -errno.
 */
int mts_state_open(const char *path, bool reset, struct mts_state_info *info,
                   bool *adopt, struct mts_state **out);
/* Record `p` in its slot's entry / free slot `slot`'s entry. Errors are
 * logged once and otherwise ignored: the record is a convenience for the
 * next server, never a reason to refuse a worker. An entry is written when
 * a worker registers, not cleared when it exits (one pwrite per worker,
 * not two): a restarted server drops entries whose pid is gone or has
 * another start time, and a reused slot's entry is overwritten. */
void mts_state_put(struct mts_state *st, const struct mts_registry *reg,
                   const struct mts_proc *p);
void mts_state_clear(struct mts_state *st, uint32_t slot);
/* Read record `slot` into *rec. Returns 0, or -ENOENT for a free or
 * unreadable entry. */
int mts_state_get(struct mts_state *st, uint32_t slot,
                  struct mts_state_rec *rec);
/* Close and unlock (the file stays for the next server). NULL is fine. */
void mts_state_close(struct mts_state *st);

/* ---- adopt.c (and its registry entry points) --------------------------- */

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
	char group[64]; /* "" = "default" */
	char task[64];
};

/*
 * Rebuild the registry from the restart record: each recorded worker whose
 * pid is alive with the recorded start time is adopted with a fresh pidfd,
 * its slot table reopened from the worker's own mapping; the others are
 * freed. Counts both. Call right after mts_registry_init().
 */
int mts_adopt(struct mts_registry *reg, uint32_t *kept, uint32_t *dropped);

/* The table of `uid`, or NULL. */
struct mts_table *mts_table_find(const struct mts_registry *reg, uint32_t uid);

/* The memfd name of `uid`'s table, "LABEL-slots:INSTANCE:UID": made by
 * the server that creates it, looked for by one that adopts it. */
void mts_table_label(const struct mts_registry *reg, uint32_t uid, char *buf,
                     size_t cap);

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

/* Recompute the free-slot stack from by_slot[] (after adoption). */
void mts_registry_rebuild_free(struct mts_registry *reg);

/* ---- dispatch.c ------------------------------------------------------ */

/* A growable byte buffer. */
struct mts_buf {
	uint8_t *data;
	size_t len;
	size_t cap;
};

int mts_buf_reserve(struct mts_buf *b, size_t more);
void mts_buf_free(struct mts_buf *b);

#define MTS_MAX_FRAME MTFRAME_DEFAULT_MAX

/* Returned (positive) by mts_dispatch/mts_input: the connection must be
 * closed once the response already appended has been written. */
#define MTS_CLOSE 1
/* Returned by mts_input: it stopped at a budget with input left over;
 * call again later (after the output drains, or on the next turn). */
#define MTS_MORE 2

/*
 * Answer one packed Request body: append one framed Response to `out`.
 * Returns 0, MTS_CLOSE (undecodable: error answer, then close) or -ENOMEM
 * (nothing appended; the caller should drop the connection). A Watch sets
 * peer->watching and peer->watch_id; the caller then pushes events.
 */
int mts_dispatch(struct mts_registry *reg, struct mts_peer *peer,
                 const uint8_t *body, size_t len, struct mts_buf *out);

/* Append Response{id, event = ev} (a pushed Watch event) to `out`.
 * 0 or -ENOMEM. */
int mts_event_append(const struct mts_registry *reg, uint64_t id,
                     const struct mts_event *ev, struct mts_buf *out);

/* How much one mts_input() call may do. */
struct mts_budget {
	size_t out_bytes; /* stop once out->len reaches this */
	unsigned frames;  /* stop after answering this many frames */
};

/*
 * Split in[0..len) into frames and answer each in order, appending the
 * responses to `out`, until the input holds no complete frame or the
 * budget is spent. *consumed is how many input bytes were used. Returns 0
 * (no complete frame left), MTS_MORE (budget spent, input left), MTS_CLOSE
 * (a bad frame was answered; stop reading and close after the write) or
 * -ENOMEM.
 */
int mts_input(struct mts_registry *reg, struct mts_peer *peer,
              const uint8_t *in, size_t len, struct mts_buf *out,
              struct mts_budget budget, size_t *consumed);

/* ---- conn.c ---------------------------------------------------------- */

/* Per-connection output above which we stop reading from the peer. */
#define MTS_OUT_HIGH (4u << 20)
#define MTS_OUT_LOW  (1u << 20)
/* Frames one connection may have answered per loop turn before the others
 * get theirs: a peer pipelining thousands of requests must not stall the
 * loop. */
#define MTS_FRAMES_PER_TURN 64u

/*
 * The server-wide budget: at most max_connections open, and at
 * most max_buffered bytes of input and unwritten output over all of them.
 * Past the cap every connection holding more than its fair share (the
 * cap over twice the connections, at least MTS_CONN_FLOOR) stops reading
 * ("throttled") until the total is back under MTS_BUDGET_LOW_PCT of the
 * cap; if it is not back there MTS_BUDGET_GRACE_MS after the pressure
 * began, the largest holders are disconnected until it is. See conn.c.
 */
#define MTS_DEFAULT_MAX_CONNS    1024u
#define MTS_MAX_CONNS_MAX        1000000u
#define MTS_DEFAULT_MAX_BUFFERED (UINT64_C(64) << 20)
#define MTS_MAX_BUFFERED_MIN     (UINT64_C(1) << 20)
#define MTS_CONN_FLOOR           (64u * 1024u)
#define MTS_BUDGET_LOW_PCT       75u
#define MTS_BUDGET_GRACE_MS      1000u
#define MTS_BUDGET_CHECK_MS      100u
/* Per peer uid (TCP peers are one bucket); admins are exempt. */
#define MTS_DEFAULT_MAX_CONNS_PER_UID 256u
/* A connection with no request for this long is closed (Watch
 * subscribers excepted); checked every quarter of it. */
#define MTS_DEFAULT_IDLE_MS 60000u
#define MTS_IDLE_MAX_MS     86400000u
/* Open files memtallyd wants besides one pidfd per slot and one socket
 * per connection: listeners, the loop's own, /metrics, RSS reads in
 * flight, a shared-memory descriptor per uid with workers (main.c). */
#define MTS_NOFILE_MARGIN 256u

struct mts_server;

/* Make sure `path` is free to bind: create its parent directory (0755) if
 * missing, replace a stale socket, refuse (-EADDRINUSE) if a server
 * answers there, refuse (-EEXIST) a file that is not a socket. */
int mts_socket_prepare(const char *path);

/* Bind, chmod 0660 and listen on srv->cfg.socket_path. */
int mts_listen(struct mts_server *srv);

/* Listen on TCP srv->cfg.tcp_addr (already validated). */
int mts_listen_tcp(struct mts_server *srv);

/* Close the listener and every connection. */
void mts_conns_close(struct mts_server *srv);

/*
 * reg->on_event of a server: push `ev` to every watching connection as
 * Response{id = its Watch id, event}. A subscriber whose unwritten output
 * has reached MTS_OUT_HIGH is not reading: it is disconnected (and
 * counted in stats.watch_disconnects) rather than buffered without bound;
 * it learns the current state again when it reconnects and watches.
 */
void mts_watch_broadcast(void *ctx, const struct mts_event *ev);

/* ---- server.c -------------------------------------------------------- */

struct mts_config {
	const char *socket_path;
	const char *segment; /* label of the shared objects */
	const char *state_path; /* restart record; NULL: next to the socket
	                           (SOCKET.state), none without a socket */
	uint32_t slots;
	uint32_t lanes;
	uint32_t tick_ms;
	uint64_t threshold;
	bool reset;
	/* Policy and listeners. Zero/NULL is the default for each. */
	const struct mts_policy *policy; /* NULL: mts_policy_defaults() */
	const char *tcp_addr;            /* HOST:PORT to listen on, or NULL */
	const char *metrics_addr; /* --metrics / [server] metrics, stored */
	bool has_gid;             /* chown the socket to `gid` */
	uint32_t gid;
	/* The connection budget; 0 = the default. */
	uint32_t max_conns;
	uint64_t max_buffered;
	/* Per peer uid, 0 = the default; and the idle timeout (0 = the
	 * default unless no_idle_timeout). */
	uint32_t max_conns_per_uid;
	uint32_t idle_timeout_ms;
	bool no_idle_timeout;
	const struct mts_hook_conf *hooks; /* [hooks], or NULL: none */
};

struct mts_conn;
struct mts_metrics;

struct mts_server {
	uv_loop_t *loop;
	struct mts_config cfg;
	struct mtshm_map map; /* the shared header */
	struct mts_registry reg;
	uv_pipe_t listener;
	uv_timer_t tick;
	struct mts_conn *conns; /* doubly linked list of open connections */
	uint32_t nconns;
	/* Connections with answerable input left after their turn, served
	 * one turn each per loop iteration from `idle`. */
	struct mts_conn *backlog_head, *backlog_tail;
	uv_idle_t idle;
	bool idle_open;
	bool listening;    /* the listener handle is open */
	bool socket_bound; /* we created the socket file: remove it at exit */
	bool stopping;
	/* TCP, RSS sweep, metrics. */
	uv_tcp_t tcp_listener;
	bool tcp_listening;   /* the TCP listener handle is open */
	uint16_t tcp_port;    /* bound port (useful with port 0) */
	uv_timer_t rss_timer; /* RSS sweep every policy.rss_interval_ms */
	bool rss_timer_open;
	uint32_t rss_interval_ms; /* the interval the timer runs at */
	struct mts_metrics *metrics; /* --metrics endpoint, or NULL */
	struct mts_hooks *hooks;     /* state hooks (hooks.c), or NULL */
	/* The socket file as created, checked about once a second from the
	 * tick so its removal under a running server is logged with what to
	 * do. */
	dev_t sock_dev;
	ino_t sock_ino;
	bool sock_known; /* the dev/ino above are valid */
	bool sock_gone;  /* already reported */
	struct mts_state *state; /* the restart record, or NULL */
	uint64_t files_checked_ms;  /* uv_now() of the last check */
	/* conn.c: the server-wide connection budget. */
	uint32_t max_conns;     /* cfg.max_conns or the default */
	uint64_t max_buffered;  /* cfg.max_buffered or the default */
	uint64_t buffered;      /* sum of every connection's input + output */
	bool pressure;          /* over the cap, not yet under the low mark */
	uint64_t over_since_ms; /* uv_now() the total passed the cap, or 0 */
	uv_timer_t budget_timer; /* eviction check while under pressure */
	bool budget_timer_open;
	uint8_t *scratch;        /* shared read buffer, READ_CHUNK bytes */
	uint64_t rejected_logged_ms; /* rate limit of the rejection log */
	uint64_t rejected_unlogged;
	/* conn.c: open connections per peer uid, and the idle sweep. */
	struct mts_uid_counts conn_uids;
	uint32_t max_conns_per_uid; /* cfg's or the default */
	uint32_t idle_ms;           /* 0 = connections never idle out */
	uv_timer_t idle_timer;
	bool idle_timer_open;
	uint64_t uid_rejected_logged_ms;
	uint64_t uid_rejected_unlogged;
};

/* Whether the file at cfg.socket_path is still the socket this server
 * bound (true when that is unknown). Another server may have taken the
 * path after ours was deleted: its socket must not be removed by us. */
bool mts_socket_is_ours(const struct mts_server *srv);

/* Listen on cfg->socket_path (first, see server.c; skipped when NULL, as
 * unit tests do), create the segment and the registry, start the tick
 * timer. Returns 0, -EBUSY (a live server holds the restart record) or
 * -errno; on failure the caller runs the loop (to finish closing handles),
 * then calls mts_server_free(). */
int mts_server_init(struct mts_server *srv, uv_loop_t *loop,
                    const struct mts_config *cfg);

/* Close every handle the server owns; uv_run then returns. Idempotent. */
void mts_server_stop(struct mts_server *srv);

/* Install a new policy (SIGHUP reload or start): limits, watermarks,
 * groups, admission and enforcement settings, auth. Applies at once:
 * states are re-evaluated and events sent. Returns 0 or -ENOMEM (the old
 * policy is then kept). */
int mts_server_apply_policy(struct mts_server *srv,
                            const struct mts_policy *pol);

/* Install a new [hooks] configuration (SIGHUP reload): it applies to the
 * hooks started from now on. 0 or -ENOMEM (the old one is kept). */
int mts_server_apply_hooks(struct mts_server *srv,
                           const struct mts_hook_conf *conf);

/* After the loop has drained: unmap the header, close the restart record,
 * remove the socket file, free memory. */
void mts_server_free(struct mts_server *srv);

/* Realtime and monotonic clocks in ns. */
uint64_t mts_now_realtime(void);
uint64_t mts_now_monotonic(void);

/* ---- limits, admission, auth, rss, config ------------------------------- */

/* Group entries (registry.c). The index stays valid while the entry lives;
 * `reg->groups` may move when an entry is created. */
bool mts_name_ok(const char *s);
/* Index of group `name`, creating an empty entry if needed. 0 or -ENOMEM. */
int mts_group_ensure(struct mts_registry *reg, const char *name,
                     uint32_t *index);
/* Free entry `index` if nothing keeps it (processes, limit, watermark,
 * reservations). */
void mts_group_gc(struct mts_registry *reg, uint32_t index);

/* limits.c */

/*
 * The hysteresis state machine. `value` is the figure compared (already
 * including reservations where they count); limit 0 means no limit (ok).
 *   ok/high -> over   when value > limit
 *   ok      -> high   when value >= limit x high
 *   over    -> high   only when value < limit x (1 - hyst)
 *   high    -> ok     only when value < limit x (high - hyst)
 * Leaving `over` may land directly in `ok` when both lower marks are
 * passed at once. `forecast` (the scope's forecast gate is on) makes what
 * would be `ok` `high`.
 */
uint32_t mts_state_next(uint32_t cur, uint64_t value, uint64_t limit,
                        uint32_t high_bp, uint32_t hyst_bp, bool forecast);

/* The figure limits compare, per reg->policy.measure. */
uint64_t mts_measured(const struct mts_registry *reg, uint64_t accounted,
                      uint64_t rss);

/* The growth window in force, in ns. */
uint64_t mts_growth_window_ns(const struct mts_registry *reg);
/* What the fleet's or a group's state compares (measured + reserved),
 * and its forecast: seconds to the limit at the current rate, 0 = none. */
uint64_t mts_fleet_value(const struct mts_registry *reg);
uint64_t mts_group_value(const struct mts_registry *reg,
                         const struct mts_group *g);
double mts_fleet_forecast(const struct mts_registry *reg);
double mts_group_forecast(const struct mts_registry *reg,
                          const struct mts_group *g);
/* A process's rate and forecast against its own limit. */
double mts_proc_growth(const struct mts_registry *reg,
                       const struct mts_proc *p);
double mts_proc_forecast(const struct mts_registry *reg,
                         const struct mts_proc *p);

/* Sample the fleet's and every group's measured figure (the tick calls it
 * every MTS_RATE_SAMPLE_MS). */
void mts_rates_sample(struct mts_registry *reg, uint64_t now_ns);

/* Re-evaluate fleet and group states (and every process's when `procs`),
 * write slot flags, send events. The caller publishes. */
void mts_limits_eval(struct mts_registry *reg, bool procs);

/* One process's part of mts_limits_eval(reg, true). The tick calls it
 * while the process's line is in cache instead of a second pass. */
void mts_limits_eval_proc(struct mts_registry *reg, struct mts_proc *p);

/* A process that was over its own limit leaves (exit, pid reuse): its
 * subscribers hear it is no longer over. */
void mts_limits_proc_gone(struct mts_registry *reg,
                          const struct mts_proc *p);

/* Install `pol` (deep copy) and apply it: fleet, group and default process
 * limits, watermarks; runtime SetLimit values for the fleet and groups are
 * replaced by the policy's, per-pid ones are kept. 0 or -ENOMEM. */
int mts_limits_apply_policy(struct mts_registry *reg,
                            const struct mts_policy *pol);

/* SetLimit. *previous gets the limit in force before, *now the one after
 * (for a pid, 0 falls back to the default per-process limit). Return 0,
 * -ENOENT (pid not registered), -EINVAL (bad group name), -ENOMEM. */
int mts_limit_set_fleet(struct mts_registry *reg, uint64_t bytes,
                        uint64_t *previous, uint64_t *now);
int mts_limit_set_group(struct mts_registry *reg, const char *name,
                        uint64_t bytes, uint64_t *previous, uint64_t *now);
int mts_limit_set_pid(struct mts_registry *reg, uint32_t pid, uint64_t bytes,
                      uint64_t *previous, uint64_t *now);

/* Enforcement step of a tick (no-op unless policy.enforce_signal). */
void mts_enforce(struct mts_registry *reg, uint64_t now_ns);

/* admit.c */

struct mts_resv {
	char id[MTS_RESV_ID_LEN + 1];
	bool has_owner; /* false: made over TCP (no credentials) */
	uint32_t uid;   /* owner */
	uint32_t group; /* index in reg->groups (keeps the entry alive) */
	struct mts_task *task; /* NULL: no task */
	struct mts_resv *tnext; /* the task's reservations, oldest first */
	uint32_t index;         /* in reg->resv */
	uint32_t heap_index;    /* in reg->resv_heap; UINT32_MAX: not there */
	bool taken_over;        /* a worker of its task registered: no TTL */
	uint64_t bytes;         /* granted */
	uint64_t effective;     /* counted now: bytes minus what the task's
	                           workers already use, floored at 0 */
	uint64_t created_ns;    /* CLOCK_REALTIME */
	uint64_t expires_ns;    /* CLOCK_MONOTONIC */
	uint32_t ttl_s;
};

/* What one kind of a task's workers use (admit.c): [0] admins' workers,
 * [1] workers of a uid that owns none of the task's reservations, then
 * one entry per owner uid of its reservations. */
struct mts_task_share {
	uint32_t uid;      /* owners' entries */
	uint32_t resv;     /* owners' entries: its reservations of the task */
	uint32_t live;     /* live workers, latest tick */
	uint64_t measured; /* their measured bytes, latest tick */
	uint64_t counted;  /* `measured` as of the last recount */
	uint64_t left;     /* a recount's scratch */
	bool was_live;     /* live > 0 at the last recount */
};

struct mts_task {
	struct mts_task *hnext;
	char *name;
	uint64_t hash;
	struct mts_resv *resv; /* oldest first */
	uint32_t live;         /* live workers with this task, latest tick */
	uint64_t measured;     /* their measured bytes, latest tick */
	uint64_t counted;      /* `measured` its reservations count against */
	bool seen;             /* a worker of the task registered */
	struct mts_task *snext, *sprev; /* reg->tasks_seen, once seen */
	struct mts_task_share *shares;  /* see mts_task_share */
	uint32_t nshares, shares_cap;
	bool dirty; /* reservations came or went since the last recount */
};

struct mts_admit_req {
	uint64_t bytes;
	const char *group; /* "" or NULL = "default" */
	const char *task;  /* "" or NULL = none */
	uint32_t ttl_s;    /* 0 = policy default */
};

struct mts_admit_out {
	bool admitted;
	enum mts_denial reason; /* when !admitted */
	char scope[MTS_NAME_MAX + 8]; /* "fleet" or "group:NAME" */
	double growth;      /* of the scope that decided, bytes per second */
	double forecast_s;  /* its seconds to the limit, 0 = no forecast */
	uint64_t measured;  /* of the scope that decided (fleet if granted) */
	uint64_t reserved;
	uint64_t requested;
	uint64_t limit;
	uint32_t ttl_s;
	char id[MTS_RESV_ID_LEN + 1];
	char why[384]; /* human reason */
};

/* Decide an Admit; a grant creates a reservation. Logs the decision and
 * counts it. Returns 0 (see out->admitted), -EINVAL (malformed: bytes 0 or
 * a bad name; counted as a denial "invalid"), -ENOSPC (MTS_RESV_MAX
 * outstanding), -ENOMEM. */
int mts_admit(struct mts_registry *reg, const struct mts_peer *peer,
              const struct mts_admit_req *req, struct mts_admit_out *out);

/* The decision alone, for a valid request of `bytes` to `group`: the
 * per-uid reservation cap, then the fleet limit, then the group's; fills
 * out (admitted, or the reason, scope, figures and words that decided).
 * Reads the registry and changes nothing: no reservation, no counter, no
 * log line. */
void mts_admit_decide(const struct mts_registry *reg,
                      const struct mts_peer *peer, const char *group,
                      uint64_t bytes, struct mts_admit_out *out);

/* Release reservation `id`. Returns 0 (*bytes = its granted bytes),
 * -ENOENT, -EPERM (logged and counted). */
int mts_release(struct mts_registry *reg, const struct mts_peer *peer,
                const char *id, const char *token, uint64_t *bytes);

/* The reservation `id`, or NULL. */
struct mts_resv *mts_resv_find(const struct mts_registry *reg,
                               const char *id);

/* Tick step: measure each task's workers, end reservations whose TTL
 * passed or whose task's workers all exited, recompute what each counts
 * and the reserved sums. */
void mts_resv_tick(struct mts_registry *reg, uint64_t now_ns);

/* Recompute every reservation's count and the reserved sums from scratch,
 * from the latest task figures. Admit, Release and the tick keep them up
 * to date incrementally; this is the reference they agree with. */
void mts_resv_sums(struct mts_registry *reg);

/* Worker `p` registered with a task: the reservations of that task it may
 * take over (its owner's uid or an admin's: docs/ARCHITECTURE.md,
 * ownership) are taken over. */
void mts_resv_worker_registered(struct mts_registry *reg, struct mts_proc *p);

/* Free every reservation and task (registry teardown). */
void mts_resv_free_all(struct mts_registry *reg);

/* auth.c */

/* Why a peer is authorised; MTS_AUTH_NONE = it is not. */
enum mts_auth {
	MTS_AUTH_NONE = 0,
	MTS_AUTH_ROOT,
	MTS_AUTH_SERVER_UID,
	MTS_AUTH_ADMIN_UID,
	MTS_AUTH_ADMIN_GID,
	MTS_AUTH_TOKEN,
	MTS_AUTH_OWNER,
};

const char *mts_auth_name(enum mts_auth a);

/* May `peer` change limits (or release anyone's reservation)? `token` is
 * the body's token ("" or NULL = none). */
enum mts_auth mts_authorise(const struct mts_registry *reg,
                            const struct mts_peer *peer, const char *token);

/* May `peer` release `r`: its owner, or anyone mts_authorise() allows. A
 * reservation made over TCP is owned by every TCP peer alike. */
enum mts_auth mts_authorise_release(const struct mts_registry *reg,
                                    const struct mts_peer *peer,
                                    const char *token,
                                    const struct mts_resv *r);

/* Is `uid` root, the server's uid or admin_uid (admin_gid needs a
 * process: mts_peer_in_group, mts_pid_in_group)? */
bool mts_uid_is_admin(const struct mts_registry *reg, uint32_t uid);

/* Is `gid` the effective or a supplementary group of process `pid`
 * (/proc/PID/status)? False when it cannot be read. */
bool mts_pid_in_group(uint32_t pid, uint32_t gid);

/* The count of `uid`, 0 when it has none. */
uint32_t mts_uid_count_get(const struct mts_uid_counts *t, uint32_t uid);
/* Count one more for `uid`. 0 or -ENOMEM (nothing counted). */
int mts_uid_count_add(struct mts_uid_counts *t, uint32_t uid);
/* Count one less (a uid at 0 leaves the table). */
void mts_uid_count_sub(struct mts_uid_counts *t, uint32_t uid);
void mts_uid_counts_free(struct mts_uid_counts *t);

/* Constant-time (in the secret's content) comparison of two strings. */
bool mts_token_equal(const char *secret, const char *given);

/* Is `gid` the peer's primary group or one of its supplementary groups
 * (SO_PEERGROUPS on its socket, else /proc/PID/status)? */
bool mts_peer_in_group(const struct mts_peer *peer, uint32_t gid);

/* rss.c and procfs.c */

/* Resident bytes of `pid` from /proc/PID/statm. 0 or -errno. */
int mts_read_rss(pid_t pid, uint64_t *out);
/* Parse the text of a statm file: resident pages x page_size. */
int mts_parse_statm_rss(const char *statm, uint64_t page_size, uint64_t *out);

/* Start a sweep of every registered process's RSS on the libuv thread
 * pool (skipped while one is in flight); results are applied on the loop
 * thread, to the processes still registered with the same pid and start
 * time. */
void mts_rss_sweep_start(struct mts_registry *reg);
/* The same, synchronously on the calling (loop) thread. */
void mts_rss_sweep_sync(struct mts_registry *reg);
/* Set p->rss and keep its group's and the fleet's RSS sums in step. */
void mts_proc_set_rss(struct mts_registry *reg, struct mts_proc *p,
                      uint64_t rss);


/* config.c */

/* Everything main needs: server settings, policy, log level, reload
 * bookkeeping. Strings are owned. */
struct mts_settings {
	struct mts_config cfg; /* strings point into `owned` */
	struct mts_policy policy;
	int log_level;       /* enum mts_log_level */
	char *config_path;   /* NULL: no file */
	char *owned[8];      /* socket, segment, tcp, metrics, state */
	struct mts_hook_conf hooks; /* [hooks] */
};

/* One command-line value that overrides a key of the file. */
struct mts_override {
	const char *flag;    /* "--fleet-limit", for messages */
	const char *section; /* "server", "limits" */
	const char *key;
	const char *value;
};

/*
 * Build settings: defaults, then the file at `path` (NULL = none), then
 * the overrides in order. On a bad value returns -EINVAL with a one-line
 * message naming the key or flag in err (e.g. "memtallyd.conf:12: [limits]
 * fleet: expected a size like 64GiB, or none; got 'x'"); -ENOENT/-EACCES
 * when the file cannot be read (message in err); -ENOMEM. *out is
 * untouched on failure.
 */
int mts_settings_load(struct mts_settings *out, const char *path,
                      const struct mts_override *ov, size_t nov, char *err,
                      size_t errlen);
void mts_settings_free(struct mts_settings *s);

/* Parse "90", "92.5", "90%" (0 to 100, two decimals at most) into basis
 * points. 0 or -EINVAL. */
int mts_parse_percent(const char *s, uint32_t *bp);
/* "SIGTERM", "TERM", "term", "15"; "" -> 0 (off). 0 or -EINVAL. */
int mts_parse_signal(const char *s, int *sig);
/*
 * A listening address, HOST:PORT (the one syntax, mt_split_hostport()),
 * into *ss and *len. HOST is an IPv4 literal, an IPv6 literal in brackets
 * ("[::1]", "[::]"), "localhost" (always 127.0.0.1, so the address does
 * not depend on resolver order) or a name getaddrinfo() resolves (its
 * first address). PORT 0 lets the kernel choose. *loopback says whether
 * the address is a loopback one. 0 or -EINVAL (malformed, or a name that
 * does not resolve). Used for --tcp and --metrics alike.
 */
int mts_parse_hostport(const char *s, struct sockaddr_storage *ss,
                       socklen_t *len,
                       bool *loopback);

#endif /* MEMTALLY_SERVER_H */
