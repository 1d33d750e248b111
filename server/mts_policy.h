/*
 * mts_policy.h - the policy: what the configuration produces and limits.c
 * applies (limits, watermarks, measure, admission), and the state-change
 * event Watch subscribers and hooks hear.
 */
#ifndef MTS_POLICY_H
#define MTS_POLICY_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "mts_defs.h"

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

/* A [group NAME] section. `uids` and `gids` (owned arrays) say who may
 * join the group; a group with neither is open to every uid. */
struct mts_group_policy {
	char *name;
	uint64_t limit;   /* 0 = none */
	uint32_t high_bp; /* 0 = the fleet's watermark */
	uint32_t *uids;
	uint32_t nuids;
	uint32_t *gids;
	uint32_t ngids;
};

/* Percentages are kept in basis points (1% = 100 bp) so "92.5" is exact. */
#define MTS_BP_ONE 10000u

/* A token (tcp_token, [metrics] token_file): its length in bytes. */
#define MTS_TOKEN_MAX 512u

#define MTS_DEFAULT_HIGH_BP   9000u /* 90% */
#define MTS_DEFAULT_HYST_BP   500u  /* 5% */
#define MTS_DEFAULT_RSS_MS    1000u
#define MTS_DEFAULT_TTL_S     300u
#define MTS_DEFAULT_MAX_TTL_S 86400u
#define MTS_DEFAULT_GRACE_MS  10000u
/* A peer may hold at most this many reservations in all; each is ~100 B. */
#define MTS_RESV_MAX 65536u
/* "r-" + 16 hex digits. */
#define MTS_RESV_ID_LEN 18u
/* [admission] max_reservations_per_uid: one uid's outstanding
 * reservations, so that one peer holding many cannot use up MTS_RESV_MAX
 * for everyone. Admins are exempt (auth.c). */
#define MTS_DEFAULT_MAX_RESV_PER_UID 1024u
/* [trust]: what an untrusted uid's claims may exceed the kernel's figure
 * of its processes by (memory allocated but not touched yet), and for how
 * long an excess may stay before it is no longer vouched for. */
#define MTS_DEFAULT_UNTOUCHED_ALLOWANCE (UINT64_C(256) << 20)
#define MTS_DEFAULT_UNTOUCHED_MS        10000u
/* [trust] untouched_allowance_total: all untrusted uids' allowances
 * together, so that N accounts cannot multiply one. One allowance's worth:
 * a fresh large allocation is what it is for, and one at a time is what
 * a node sees. */
#define MTS_DEFAULT_UNTOUCHED_TOTAL (UINT64_C(256) << 20)
#define MTS_UNTOUCHED_MAX_MS        3600000u
/* [trust] trusted_uids: at most this many (root and the server's own uid
 * are trusted besides, always). */
#define MTS_TRUSTED_UIDS_MAX 64u
/* The per-uid caps' defaults are this fraction of the whole (slots,
 * max_connections, the fleet limit for reserved bytes): four uids at
 * their caps hold half of it and leave the other half to everyone else.
 * A node whose jobs all run as one uid (a scheduler's) says `none`. */
#define MTS_DEFAULT_PER_UID_DIV 8u
/* [admission] max_reserved_bytes_per_uid: by default 1/8 of the fleet
 * limit (none without a fleet limit). */
#define MTS_DEFAULT_RESV_BYTES_BP (MTS_BP_ONE / MTS_DEFAULT_PER_UID_DIV)
/* [server] max_watch_per_uid: Watch subscriptions one uid holds open. A
 * subscriber never idles out and every event is written to each, so the
 * cap is well below the connections': a terminal's `memtally watch` and a
 * scheduler's subscription need a few. */
#define MTS_DEFAULT_WATCH_PER_UID 16u
/* [limits] max_groups_per_uid: distinct group names one uid may bring
 * into existence (groups of the configuration do not count). */
#define MTS_DEFAULT_GROUPS_PER_UID 64u
/* [limits] max_slots_per_uid: 0 in the policy means the default,
 * slots / MTS_DEFAULT_PER_UID_DIV, so that one uid cannot take every slot. */
/* "none" for a per-uid cap whose 0 means "the default". */
#define MTS_CAP_NONE UINT32_MAX
/* [metrics] max_groups: group series on /metrics; the rest are summed
 * into one series group="_other". */
#define MTS_DEFAULT_METRICS_GROUPS 256u

/* [kinds] (kinds.c): the estimator (a quantile of the recent runs'
 * peaks plus a margin), the runs it looks at (the last `window`, none
 * older than `horizon`), what a kind with no history gets, and the
 * bounds on how many kinds one uid and the server keep. */
#define MTS_KIND_RUNS                64u /* the most runs kept per kind */
#define MTS_DEFAULT_KIND_QUANTILE_BP 9500u
#define MTS_DEFAULT_KIND_MARGIN_BP   1000u
#define MTS_DEFAULT_KIND_HORIZON_S   (7u * 86400u)
#define MTS_DEFAULT_KIND_SIZE        (UINT64_C(1) << 30)
#define MTS_DEFAULT_KIND_SIZE_BP     (MTS_BP_ONE / MTS_DEFAULT_PER_UID_DIV)
#define MTS_DEFAULT_KINDS_PER_UID    64u
#define MTS_DEFAULT_KINDS_MAX        4096u
#define MTS_KINDS_MAX_MAX            (1u << 20)
/* [guard] enabled: auto turns the node guard on where the node has a
 * limit memtallyd can see (a memory cgroup with one). */
enum mts_guard_mode {
	MTS_GUARD_AUTO = 0,
	MTS_GUARD_ON,
	MTS_GUARD_OFF,
};
/* [guard] line by default: 90% of the node's limit. */
#define MTS_DEFAULT_GUARD_LINE_BP 9000u
/* [guard] interval: at most one eviction per this while the node comes
 * back below its line. */
#define MTS_DEFAULT_GUARD_INTERVAL_MS 2000u
#define MTS_GUARD_INTERVAL_MIN_MS     100u
#define MTS_GUARD_INTERVAL_MAX_MS     3600000u

/* [server] show_others: what a peer that is not an admin sees of the
 * processes of other uids. */
enum mts_show {
	MTS_SHOW_COUNTS = 0, /* pid, uid and figures; no names */
	MTS_SHOW_NONE,       /* nothing: as if they were not registered */
	MTS_SHOW_ALL,        /* everything, names included */
};

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
	/* Root (and a memtallyd running as root, its own uid) has admin
	 * rights: true by default. False where root is not the node's
	 * operator: a DaemonSet whose socket reaches pods that run as root,
	 * without user namespaces. */
	bool root_admin;
	bool has_admin_uid;
	uint32_t admin_uid;
	bool has_admin_gid;
	uint32_t admin_gid;
	char *tcp_token;           /* NULL = none: no TCP peer is authorised */
	uint32_t max_resv_per_uid; /* 0 = no per-uid cap */
	/* Outstanding reserved bytes per uid: a size (resv_bytes_per_uid),
	 * else a fraction of the fleet limit (resv_bytes_bp); both 0 = no
	 * cap. Admins are exempt. */
	uint64_t resv_bytes_per_uid;
	uint32_t resv_bytes_bp;
	uint32_t slots_per_uid;       /* 0 = slots / 8, MTS_CAP_NONE = no cap */
	uint32_t watch_per_uid;       /* 0 = no cap */
	uint32_t groups_per_uid;      /* 0 = no cap */
	bool metrics_per_process;     /* per-process series on /metrics */
	enum mts_show show_others;    /* of other uids' processes */
	uint32_t metrics_max_groups;  /* group series on /metrics, >= 1 */
	uint32_t growth_window_ms;    /* rate.c: the rate's window */
	uint32_t forecast_horizon_ms; /* `high` when the limit is forecast
	                                 within this; 0 = off */
	/* [trust] (vouch.c): uids whose claims count in full toward
	 * everyone (root and the server's uid always do), and the bounded,
	 * time-limited allowance of every other uid. */
	uint32_t trusted_uids[MTS_TRUSTED_UIDS_MAX];
	uint32_t ntrusted;
	uint64_t untouched_allowance;
	uint64_t untouched_total;
	uint32_t untouched_ms;
	/* [kinds] (kinds.c). default_size is kind_default_size when set,
	 * else kind_default_bp of the fleet limit, else
	 * MTS_DEFAULT_KIND_SIZE without a fleet limit. */
	uint32_t kind_quantile_bp;
	uint32_t kind_margin_bp;
	uint32_t kind_window;    /* 1..MTS_KIND_RUNS */
	uint32_t kind_horizon_s; /* runs older than this are forgotten */
	uint64_t kind_default_size;
	uint32_t kind_default_bp;
	bool admit_queue;        /* a request waiting long keeps its room */
	uint32_t admit_queue_ms; /* ... once it has waited this long */
	/* A learned reservation follows the kind's profile over the task's
	 * life. */
	bool kind_follow_profile;
	uint32_t kind_pool_gap_bp; /* of the pooled gap admission keeps */
	uint32_t kind_host_gap_bp; /* ... of tasks run inside a shared host */
	bool kind_reserve_learned; /* a declaration is a ceiling, not the
	                              reservation, once a size is learned */
	uint32_t kinds_per_uid;    /* 0 = no cap */
	uint32_t kinds_max;        /* >= 1 */
	bool metrics_per_kind;     /* per-kind series on /metrics */
	/* [metrics] token_file's token (at most MTS_TOKEN_MAX): NULL =
	 * /metrics asks for none */
	char *metrics_token;
	/* [guard] (guard.c): where the node's figure comes from (NULL:
	 * memtallyd's own memory cgroup, "": /proc/meminfo, else a cgroup
	 * directory), its line (a fraction of the node's limit, else bytes
	 * below it, else bytes), the eviction interval, whether trusted
	 * processes without a task may be chosen, and whether a growing task
	 * is paused before it is evicted. */
	enum mts_guard_mode guard_mode;
	char *guard_cgroup;
	uint32_t guard_line_bp;
	uint64_t guard_line_below;
	uint64_t guard_line_bytes;
	uint32_t guard_interval_ms;
	bool guard_evict_trusted;
	bool guard_pause;
};

/* The defaults of every key of the policy: config.c's key table, where
 * each key's default is (no limits, 90% watermark, 5% hysteresis, ...). */
void mts_policy_defaults(struct mts_policy *p);
/* Deep copy into *dst (which is overwritten, not freed). 0 or -ENOMEM. */
int mts_policy_copy(struct mts_policy *dst, const struct mts_policy *src);
/* Free the strings and groups; the struct is zeroed. Accepts NULL. */
void mts_policy_free(struct mts_policy *p);
/* The [group NAME] entry for `name`, or NULL. */
const struct mts_group_policy *mts_policy_group(const struct mts_policy *p,
                                                const char *name);
/* The [group NAME] entry for `name`, added (all zero but its name) if
 * there is none. NULL when out of memory. */
struct mts_group_policy *mts_policy_group_add(struct mts_policy *p,
                                              const char *name);

/* A state change, as pushed to Watch subscribers. */
struct mts_event {
	const char *scope; /* "fleet", "group:NAME", "pid:N" */
	uint32_t state;    /* enum mtshm_state */
	uint32_t previous;
	uint64_t bytes; /* accounted */
	uint64_t rss;
	uint64_t limit;
	uint64_t reserved;
	uint64_t time_ns;   /* CLOCK_REALTIME */
	const char *reason; /* why, in words: "forecast: limit in 12 s ..." */
	double growth;      /* bytes per second of the measured figure */
	double forecast_s;  /* seconds to the limit, 0 = no forecast */
	const char
	    *measure; /* what limits compare: "accounted", ...; or NULL */
	bool has_uid; /* a process's event: whose (show_others) */
	uint32_t uid;
	/* The node guard's event of a task: the processes its workers
	 * descend from (whose run they are), sorted. */
	const uint32_t *ancestors;
	uint32_t nancestors;
	/* The fleet's or the group's figures (mts_figures.h); NULL for
	 * other scopes. */
	const struct mts_figures *figures;
};

#endif /* MTS_POLICY_H */
