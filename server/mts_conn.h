/*
 * mts_conn.h - the Unix and TCP listeners and the connections: framing,
 * pipelining, back-pressure, the server-wide budget, Watch broadcast
 * (conn.c).
 */
#ifndef MTS_CONN_H
#define MTS_CONN_H

#include <sys/types.h>

#include "mts_dispatch.h"
#include "mts_policy.h"

/* Per-connection output above which we stop reading from the peer. */
#define MTS_OUT_HIGH (4u << 20)
#define MTS_OUT_LOW  (1u << 20)
/* Frames one connection may have answered per loop turn before the others
 * get theirs: a peer pipelining thousands of requests must not stall the
 * loop. */
#define MTS_FRAMES_PER_TURN 64u
/* Frames one peer uid may have answered per loop iteration over all its
 * connections (max_connections_per_uid of them), and the loop's time they
 * may take (a frame at least): one uid's 128 busy connections took 128
 * turns an iteration, and the tick, the timers and every other peer
 * waited behind them (3 ticks a second instead of 100). The time bounds
 * requests that cost more than most (a list of thousands of processes,
 * a build under a sanitizer), where 64 of them would still be long. */
#define MTS_FRAMES_PER_UID_ITER 64u
#define MTS_NS_PER_UID_ITER     (2u * 1000u * 1000u)

/*
 * The server-wide budget: at most max_connections open, and at most
 * max_buffered bytes of input and unwritten output over all of them. Past
 * the cap, every connection holding more than its fair share stops
 * reading ("throttled") until the total is back under MTS_BUDGET_LOW_PCT
 * of the cap. The fair share is the cap over twice the connections, at
 * least MTS_CONN_FLOOR. If the total is not back under MTS_BUDGET_GRACE_MS
 * after the pressure began, the largest holders are disconnected until it
 * is. See conn.c. The keys' defaults and bounds (max_connections,
 * max_buffered, per uid, idle timeout) are in mts_config.h.
 */
#define MTS_CONN_FLOOR      (64u * 1024u)
#define MTS_BUDGET_LOW_PCT  75u
#define MTS_BUDGET_GRACE_MS 1000u
#define MTS_BUDGET_CHECK_MS 100u
/* The last max_connections / MTS_ADMIN_RESERVE_DIV connections (at least
 * 1, at most MTS_ADMIN_RESERVE_MAX) are for admins only, so that with
 * every other uid at its cap root can still ask what is going on. */
#define MTS_ADMIN_RESERVE_DIV 16u
#define MTS_ADMIN_RESERVE_MAX 8u
/* Open files memtallyd wants besides one pidfd per slot and one socket
 * per connection: listeners, the loop's own, /metrics, RSS reads in
 * flight, a shared-memory descriptor per uid with workers (main.c). */
#define MTS_NOFILE_MARGIN 256u

/* A TCP connection of unknown uid that has sent no request carrying the
 * token this long after accept is closed: it holds a place the token's
 * holders share (conn.c). */
#define MTS_TOKEN_WAIT_MS 5000u

/* conn.c's counters, read by /metrics. */
struct mts_conn_stats {
	uint64_t rejected;     /* accepted over max_connections, closed */
	uint64_t throttled;    /* reading stopped: over max_buffered */
	uint64_t evicted;      /* disconnected: largest holder, over it */
	uint64_t pressure;     /* times the buffered total passed the cap */
	uint64_t open;         /* gauge: open connections */
	uint64_t buffered;     /* gauge: their input + unwritten output */
	uint64_t max;          /* max_connections in force */
	uint64_t buffered_max; /* max_buffered in force */
	uint64_t rejected_uid; /* closed: over max_connections_per_uid */
	uint64_t idle_closed;  /* closed: no request for idle_timeout */
	uint64_t untokened;    /* closed: unknown uid, no token in time
	                        * (MTS_TOKEN_WAIT_MS) or its place taken */
	uint64_t max_per_uid;  /* max_connections_per_uid in force */
	uint64_t watch_events; /* events pushed to Watch subscribers */
	uint64_t watch_disconnects; /* subscribers dropped: not reading */
};

struct mts_conn;
struct mts_config;

/*
 * The listeners and connections, which conn.c alone changes: the open
 * connections and their backlog, the server-wide and per-uid budgets,
 * the idle sweep and the counters /metrics shows.
 */
struct mts_conns {
	uv_pipe_t listener;
	bool listening;    /* the listener handle is open */
	bool socket_bound; /* we created the socket file: remove it at exit */
	uv_tcp_t tcp_listener;
	bool tcp_listening;     /* the TCP listener handle is open */
	uint16_t tcp_port;      /* bound port (useful with port 0) */
	struct mts_conn *conns; /* doubly linked list of open connections */
	uint32_t nconns;
	struct mts_conn_stats conn_stats; /* for /metrics */
	/* Connections with answerable input left after their turn, served
	 * one turn each per loop iteration from `idle`. */
	struct mts_conn *backlog_head, *backlog_tail;
	/* on_idle's: those whose uid's share was spent, put back in front. */
	struct mts_conn *skip_head, *skip_tail;
	uv_idle_t idle;
	bool idle_open;
	/* Loop iterations, counted before each poll: each uid's share
	 * (MTS_FRAMES_PER_UID_ITER, MTS_NS_PER_UID_ITER) is renewed at each. */
	uv_prepare_t iter_prep;
	bool iter_prep_open;
	uint32_t iter;
	/* The server-wide connection budget. */
	uint32_t max_conns;      /* cfg.max_conns or the default */
	uint64_t max_buffered;   /* cfg.max_buffered or the default */
	uint64_t buffered;       /* sum of every connection's input + output */
	bool pressure;           /* over the cap, not yet under the low mark */
	uint64_t over_since_ms;  /* uv_now() the total passed the cap, or 0 */
	uv_timer_t budget_timer; /* eviction check while under pressure */
	bool budget_timer_open;
	uint8_t *scratch;            /* shared read buffer, READ_CHUNK bytes */
	uint64_t rejected_logged_ms; /* rate limit of the rejection log */
	uint64_t rejected_unlogged;
	/* Open connections per peer uid, and the idle sweep. */
	struct mts_uid_counts conn_uids;
	/* Remote peers of unknown uid, per address: each gets an eighth of
	 * max_conns_unidentified. */
	struct mts_uid_counts conn_addrs;
	uint32_t max_conns_per_uid;      /* cfg's or the default */
	uint32_t max_conns_unidentified; /* likewise, for MTS_UID_TCP */
	uint32_t admin_reserve;          /* of max_conns, admins only */
	uint32_t idle_ms;                /* 0 = connections never idle out */
	uv_timer_t idle_timer;
	bool idle_timer_open;
	uint64_t uid_rejected_logged_ms;
	uint64_t uid_rejected_unlogged;
	/* The socket file as created (mts_listen): the server checks that
	 * the path still names it. */
	dev_t sock_dev;
	ino_t sock_ino;
	bool sock_known; /* the dev/ino above are valid */
	/* What connections need of the server, set before mts_listen(): its
	 * loop, the registry requests act on, the configuration (socket
	 * path and mode, TCP address, budgets). */
	uv_loop_t *loop;
	struct mts_registry *reg;
	const struct mts_config *cfg;
	/* A connection whose record cannot be allocated is still taken off
	 * its listener, into this handle, and closed: libuv watches a
	 * listener again only once its pending connection is accepted, so
	 * one failed calloc would otherwise stop all accepting for good. */
	union {
		uv_handle_t handle;
		uv_stream_t stream;
		uv_pipe_t pipe;
		uv_tcp_t tcp;
	} spare;
	bool spare_busy;                   /* closing */
	bool spare_again, spare_again_tcp; /* a listener to serve after */
};

/* What a connection's record costs before its buffers (for tests). */
extern const size_t mts_conn_record_bytes;

/* May `file` (the socket, the restart record) live where it is: is every
 * directory from its own up to / owned by root or us, and not writable by
 * group or others unless sticky? 0, or -EPERM / -errno with `msg` naming
 * the directory and why (conn.c). */
int mts_dir_check(const char *file, char *msg, size_t cap);

/* Make sure `path` is free to bind: create its parent directory (0755) if
 * missing, replace a stale socket, refuse (-EADDRINUSE) if a server
 * answers there, refuse (-EEXIST) a file that is not a socket. */
int mts_socket_prepare(const char *path);

/* Listen on cfg->socket_path: a socket made mode 0660, group
 * cfg.gid, in a private directory and renamed into place (conn.c);
 * -EADDRINUSE if the path is taken meanwhile. */
int mts_listen(struct mts_conns *net);

/* Listen on TCP cfg->tcp_addr (already validated). */
int mts_listen_tcp(struct mts_conns *net);

/* Close the listener and every connection. */
void mts_conns_close(struct mts_conns *net);

/*
 * Called from the server's reg->lim->on_event (server.c), with ctx its
 * struct mts_conns. Pushes `ev` to every watching connection as
 * Response{id = its Watch id, event}. A subscriber whose unwritten output
 * has reached MTS_OUT_HIGH is not reading. It is disconnected and counted
 * in conn_stats.watch_disconnects rather than buffered without bound. It
 * learns the current state again when it reconnects and watches.
 */
void mts_watch_broadcast(void *ctx, const struct mts_event *ev);

/*
 * After a reload: a Watch subscriber made an admin by its uid or gid
 * (admin_uid, admin_gid, root_admin) or by the token keeps every uid's
 * events only while the new policy still makes it one; one that had the
 * token loses them when `token_changed` (a leaked token is rotated).
 */
void mts_conns_reauthorise(struct mts_conns *net, bool token_changed);

#endif /* MTS_CONN_H */
