/*
 * server.h - memtallyd's lifecycle (server.c): struct mts_server, which
 * owns the loop's handles. It also includes every module's header, for
 * the unit tests, fuzz targets and benchmarks that drive the whole
 * server; a module of memtallyd includes only the headers of the modules
 * it uses. Nothing outside server/, tests/ and bench/ includes it.
 *
 * The modules, one line each (header: source):
 *  - main.c: flags, config file, signals and reload, the loop.
 *  - server.h: server.c: start and stop; the timers (tick, RSS sweep,
 *    node guard) and what runs beside each tick (log flush, file checks).
 *  - mts_core.h: core.c: the tick, mts_core_tick(), and the wiring of the
 *    registry's notifications to the modules above it.
 *  - mts_registry.h: registry.c: registered workers, slot tables, groups,
 *    totals, counters, the header's fleet snapshot; a connection's peer.
 *  - mts_fault.h: fault.c: a slot-table page that faults (SIGBUS) when
 *    memtallyd touches it is answered with a spare page, not a crash.
 *  - mts_figures.h: figures.c: the figures the fleet and each group
 *    share, and the table /metrics, GetUsage and the hooks show them by.
 *  - mts_policy.h: policy.c: what config.c produces and limits.c
 *    applies (copy, free, lookups, name checks), and the state-change
 *    event.
 *  - mts_limits.h: limits.c: states with hysteresis, limits, Watch
 *    events, enforcement, the registry's growth rates.
 *  - mts_rate.h: rate.c: the arithmetic of growth rates and forecasts.
 *  - mts_admit.h: admit.c: Admit decisions, reservations, tasks;
 *    mts_admit_types.h: what admit.c keeps in each process's record.
 *  - mts_kinds.h: kinds.c: kinds, their learned sizes and their record.
 *  - mts_node.h: node.c: the node's memory and the guard's line below it.
 *  - mts_guard.h: guard.c: the node guard's evictions past that line.
 *  - mts_vouch.h: vouch.c: how much of an untrusted uid's claim counts
 *    toward others; mts_vouch_types.h: its figures in the records.
 *  - mts_auth.h: auth.c: who may SetLimit or end another's reservation.
 *  - mts_uidcount.h: uidcount.c: counts and bytes kept per uid.
 *  - mts_dispatch.h: dispatch.c: request frames in, response frames out.
 *  - mts_conn.h: conn.c: listeners, connections, back-pressure, Watch.
 *  - mt_sockdiag.h (common/): the uid behind a local TCP connection.
 *  - mts_state.h: state.c: the restart record.
 *  - mts_adopt.h: adopt.c: adoption of live workers after a restart.
 *  - mts_rss.h: rss.c: resident sets, the kernel's figures for vouching
 *    and for the mapped bound, read off the loop.
 *  - mts_procfs.h: procfs.c: what /proc says of a process.
 *  - mts_config.h: config.c: the key table; the INI file and flags ->
 *    settings, their defaults, --help, the start-up log, the reload diff.
 *  - mts_values.h: values.c: the types of keys (parse, print, default)
 *    and the small parsers shared (percent, signal, HOST:PORT, ids).
 *  - mts_hooks.h: hooks.c: a command at every fleet or group state change.
 *  - mts_metrics.h: metrics.c: the Prometheus endpoint.
 *  - mts_log.h: log.c: logfmt lines and their per-uid budget.
 *  - mts_defs.h: version, defaults, name length, clocks.
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

#include "mts_admit.h"
#include "mts_adopt.h"
#include "mts_auth.h"
#include "mts_config.h"
#include "mts_conn.h"
#include "mts_core.h"
#include "mts_defs.h"
#include "mts_dispatch.h"
#include "mts_figures.h"
#include "mts_guard.h"
#include "mts_hooks.h"
#include "mts_kinds.h"
#include "mts_limits.h"
#include "memtally.pb-c.h"
#include "mtframe.h"
#include "mtshm.h"
#include "mts_fault.h"
#include "mts_policy.h"
#include "mts_procfs.h"
#include "mts_rate.h"
#include "mts_registry.h"
#include "mts_rss.h"
#include "mts_state.h"
#include "mts_values.h"
#include "mts_vouch.h"

struct mts_conn;
struct mts_metrics;

/* A record the server keeps for the next one, written off the loop (on
 * the thread pool, one write at a time; one taken at stop is written after
 * the one in flight). A failure is logged once while it lasts and the
 * record tried again; it changes nothing else: the record is a
 * convenience for the next server. */
struct mts_rec_write;
struct mts_recfile {
	char path[4096];                /* "" = none */
	const char *what;               /* for the log: "the learned sizes" */
	uint64_t checked_ms;            /* uv_now() of the last look */
	uint64_t taken_ms;              /* uv_now() of the last record taken */
	uint64_t cost_ms;               /* what taking it cost the loop last */
	bool failed;                    /* logged once */
	struct mts_rec_write *inflight; /* on the thread pool, or NULL */
	unsigned char *final;           /* taken at stop, written after it */
	size_t final_len;
};

struct mts_server {
	uv_loop_t *loop;
	struct mts_config cfg;
	struct mtshm_map map; /* the shared header */
	struct mts_registry reg;
	struct mts_conns net; /* listeners and connections: conn.c's */
	uv_timer_t tick;
	bool stopping;
	/* RSS sweep, metrics, hooks. */
	uv_timer_t rss_timer; /* RSS sweep every policy.rss_interval_ms */
	bool rss_timer_open;
	uint32_t rss_interval_ms; /* the interval the timer runs at */
	uv_timer_t guard_timer;   /* the node guard's reads (guard.c) */
	bool guard_timer_open;
	struct mts_metrics *metrics; /* --metrics endpoint, or NULL */
	struct mts_hooks *hooks;     /* state hooks (hooks.c), or NULL */
	/* The socket file as created (srv->net.sock_*) is checked about once
	 * a second from the tick timer: gone or replaced, it is reported. */
	bool sock_gone;                       /* already reported */
	struct mts_state *state;              /* the restart record, or NULL */
	uint64_t files_checked_ms;            /* uv_now() of the last check */
	struct mts_reload_stats reload_stats; /* main.c's SIGHUP reloads */
	/* The learned sizes' record (STATE.kinds): written from the tick
	 * timer at most every MTS_KINDS_SAVE_MS while changed, and at stop. */
	struct mts_recfile kinds;
	/* The reservations' record (STATE.resv): written a moment after a
	 * reservation comes or goes (MTS_RESV_SAVE_MS), every
	 * MTS_RESV_REFRESH_MS while any is held, and at stop. */
	struct mts_recfile resv;
};

/* How often the learned sizes' record is written while runs come: a
 * memtallyd killed with -9 loses at most this much of what it learned. */
#define MTS_KINDS_SAVE_MS 2000u
/* A memtallyd killed with -9 forgets the grants and releases of at most
 * the last MTS_RESV_SAVE_MS, and the peaks of its reservations' runs of
 * at most the last MTS_RESV_REFRESH_MS. */
#define MTS_RESV_SAVE_MS    200u
#define MTS_RESV_REFRESH_MS 5000u

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
 * hooks started from now on. `conf` is taken over (mts_hooks_configure):
 * the caller copies it before it applies anything, so that a reload that
 * runs out of memory changes nothing. */
void mts_server_apply_hooks(struct mts_server *srv, struct mts_hook_conf *conf);

/* Install the node guard's source, found and checked against the policy
 * by mts_guard_setup() (at start and at each reload, before the policy
 * is applied: a bad line rejects the whole configuration). */
void mts_server_apply_guard(struct mts_server *srv,
                            const struct mts_node_src *src,
                            const struct mts_node_fig *fig);

/* After the loop has drained: unmap the header, close the restart record,
 * remove the socket file, free memory. */
void mts_server_free(struct mts_server *srv);

#endif /* MEMTALLY_SERVER_H */
