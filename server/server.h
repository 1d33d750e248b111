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
 *  - server.c: lifecycle (segment, listener, tick timer, stop).
 *  - main.c: flags, signals, the loop.
 *
 * Everything runs on one libuv loop thread; nothing here is locked.
 * Functions return 0 or -errno unless their comment says otherwise.
 */
#ifndef MEMTALLY_SERVER_H
#define MEMTALLY_SERVER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include <uv.h>

#include "memtally.pb-c.h"
#include "mtframe.h"
#include "mtshm.h"

#define MTS_VERSION "0.1.0"

#define MTS_DEFAULT_SOCKET    "/run/memtally/memtally.sock"
#define MTS_DEFAULT_SEGMENT   "/memtally"
#define MTS_DEFAULT_SLOTS     4096u
#define MTS_DEFAULT_TICK_MS   10u
#define MTS_TICK_MAX_MS       60000u
#define MTS_DEFAULT_THRESHOLD (64u * 1024u)

/* Largest group or task name a worker may register (the client keeps at
 * most 63 bytes of a group; this leaves room without being unbounded). */
#define MTS_NAME_MAX 255u

/* ---- size.c ---------------------------------------------------------- */

/*
 * Parse a byte size: digits with an optional fraction, then an optional
 * unit. K, M, G, T and KiB, MiB, GiB, TiB (and Ki, Mi, ...) are powers of
 * 1024; KB, MB, GB, TB are powers of 1000; B or nothing is bytes. Units
 * are case-insensitive. A fraction needs a unit ("1.5G"); the result is
 * rounded down to whole bytes. Returns 0, -EINVAL (not a size) or -ERANGE
 * (over UINT64_MAX).
 */
int mt_parse_size(const char *s, uint64_t *out);

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

/* ---- registry.c ------------------------------------------------------ */

/* A registered worker. Lives from registration until its uv_poll's close
 * callback; `slot` is released (pid = 0) when it exits, before that. */
struct mts_proc {
	uv_poll_t poll; /* on the pidfd; poll.data = this */
	struct mts_registry *reg;
	struct mts_proc *hnext; /* pid hash chain */
	uint32_t pid;
	uint32_t uid;
	uint32_t slot;
	uint32_t dense; /* index in reg->dense */
	uint32_t group; /* index in reg->groups */
	uint32_t threads;
	int pidfd;
	bool corrupt; /* sticky until the slot is reset */
	uint64_t start_time;
	uint64_t image_id;
	uint64_t registered_ns; /* CLOCK_REALTIME */
	uint64_t bytes;         /* latest tick; negative sums show as 0 */
	uint64_t peak;
	uint64_t flushes;
	uint64_t error_bytes; /* threshold x threads */
	char *task;
	char comm[64];
	/* Issue 3 (limits): filled by the limits code. */
	uint64_t rss;      /* resident bytes, /proc/PID/statm, slower cadence */
	uint64_t limit;    /* per-process limit in force, 0 = none */
	uint32_t state;    /* enum mtshm_state against `limit` */
};

/* A group with at least one registered process. Its index is written to
 * slot->group; a group is dropped when its last process leaves. */
struct mts_group {
	char *name; /* NULL: free entry */
	uint32_t processes;
	uint64_t bytes; /* latest tick */
	uint64_t peak;
	uint64_t error_bytes;
	/* Issue 3 (limits): filled by the limits code. */
	uint64_t rss;
	uint64_t limit;    /* 0 = none */
	uint64_t reserved; /* outstanding admission reservations */
	uint32_t state;    /* enum mtshm_state */
};

/* Fleet figures as of the latest tick (or exit, which subtracts at once). */
struct mts_totals {
	uint64_t bytes;
	uint64_t peak;
	uint64_t error_bytes;
	uint64_t ticks;
	uint64_t heartbeat_ns; /* CLOCK_MONOTONIC at the latest tick */
	uint32_t processes;
	uint32_t unregistered;
	/* Issue 3 (limits): filled by the limits code. */
	uint64_t rss;
	uint64_t limit;    /* fleet limit, 0 = none */
	uint64_t reserved; /* outstanding admission reservations */
	uint32_t state;    /* enum mtshm_state */
};

/* Why an Admit was denied, for the logs and the metrics' `reason` label. */
enum mts_denial {
	MTS_DENY_FLEET_LIMIT, /* fleet bytes + reserved + request > limit */
	MTS_DENY_GROUP_LIMIT,
	MTS_DENY_INVALID, /* a malformed request */
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
};

struct mts_registry {
	uv_loop_t *loop;
	struct mtshm_map *map;
	const char *segment_name;
	uint32_t slot_count;
	uint64_t threshold;

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
	uint64_t registrations;
	uint64_t exits;
	struct mts_stats stats;
};

/* Outcome of a registration, for the Registered answer. */
struct mts_reg_result {
	uint32_t slot;
	uint64_t slot_generation;
	const char *group; /* owned by the registry */
};

/* Who is on the other end of a connection. */
struct mts_peer {
	int fd; /* the socket, for SO_PEERPIDFD; -1 when there is none */
	bool has_cred;
	uint32_t pid; /* SO_PEERCRED */
	uint32_t uid;
};

/* `map` must be a freshly created segment; the registry keeps pointers to
 * map and segment_name. */
int mts_registry_init(struct mts_registry *reg, uv_loop_t *loop,
                      struct mtshm_map *map, const char *segment_name);

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
 * (nothing appended; the caller should drop the connection).
 */
int mts_dispatch(struct mts_registry *reg, const struct mts_peer *peer,
                 const uint8_t *body, size_t len, struct mts_buf *out);

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
int mts_input(struct mts_registry *reg, const struct mts_peer *peer,
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

struct mts_server;

/* Make sure `path` is free to bind: create its parent directory (0755) if
 * missing, replace a stale socket, refuse (-EADDRINUSE) if a server
 * answers there, refuse (-EEXIST) a file that is not a socket. */
int mts_socket_prepare(const char *path);

/* Bind, chmod 0660 and listen on srv->cfg.socket_path. */
int mts_listen(struct mts_server *srv);

/* Close the listener and every connection. */
void mts_conns_close(struct mts_server *srv);

/* ---- server.c -------------------------------------------------------- */

struct mts_config {
	const char *socket_path;
	const char *segment;
	uint32_t slots;
	uint32_t lanes;
	uint32_t tick_ms;
	uint64_t threshold;
	bool reset;
};

struct mts_conn;

struct mts_server {
	uv_loop_t *loop;
	struct mts_config cfg;
	struct mtshm_map map;
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
};

/* Listen on cfg->socket_path (first, see server.c; skipped when NULL, as
 * unit tests do), create the segment and the registry, start the tick
 * timer. Returns 0, -EBUSY (a live server publishes into that segment) or
 * -errno; on failure the caller runs the loop (to finish closing handles),
 * then calls mts_server_free(). */
int mts_server_init(struct mts_server *srv, uv_loop_t *loop,
                    const struct mts_config *cfg);

/* Close every handle the server owns; uv_run then returns. Idempotent. */
void mts_server_stop(struct mts_server *srv);

/* After the loop has drained: unmap the segment (it stays in /dev/shm),
 * remove the socket file, free memory. */
void mts_server_free(struct mts_server *srv);

/* Realtime and monotonic clocks in ns. */
uint64_t mts_now_realtime(void);
uint64_t mts_now_monotonic(void);

#endif /* MEMTALLY_SERVER_H */
