/*
 * memtally_query.h - the scheduler side of memtally.
 *
 * A scheduler (or any tool) asks memtallyd how much memory the fleet of
 * workers holds before it starts more work. This header is the C client of
 * the query protocol (proto/memtally.proto) over the server's Unix socket;
 * it exposes plain C structs and never a protobuf type, so a caller needs
 * neither protobuf-c nor the generated code.
 *
 *	memtally_query *q;
 *	struct memtally_usage *u;
 *	int err = memtally_query_open(&q, NULL, 0);
 *	if (err == 0)
 *		err = memtally_query_usage(q, &u);
 *	if (err == 0 && u->limit && u->bytes + u->reserved + need > u->limit)
 *		... refuse the task ...
 *	memtally_usage_free(u);
 *	memtally_query_close(q);
 *
 * Conventions, as in memtally.h: every call returns 0 or a negative code,
 * either -errno or one of the MEMTALLY_E* codes (memtally_strerror() names
 * both). Every result is allocated by the library, owned by the caller and
 * released with its matching *_free() function; destructors accept NULL.
 * Strings in results are never NULL ("" when the server sent none).
 *
 * A scheduler asks before it starts a task, and is told no with the
 * figures that decided it:
 *
 *	struct memtally_admit_req rq = {.bytes = need, .group = "etl",
 *	                                .task = task_id, .ttl_seconds = 600};
 *	struct memtally_admit_result *ar;
 *	err = memtally_query_admit(q, &rq, &ar);
 *	if (err == 0 && ar->admitted)
 *		... start the task with MEMTALLY_TASK=task_id; keep
 *		    ar->reservation for memtally_query_release() ...
 *	else if (err == 0)
 *		... refused: ar->reason, ar->limit, ar->top[] ...
 *	memtally_admit_result_free(ar);
 *
 * Calls block for at most the handle's timeout. A handle is one connection
 * and is not thread-safe: use it from one thread at a time, or open one per
 * thread (connections are cheap). After a transport failure (timeout,
 * reset, garbled answer) the connection is dropped and the next call
 * reconnects, so a long-lived handle survives a server restart. A query
 * that finds its idle connection closed by the server before any answer
 * arrived is sent once more on a new connection (queries are safe to
 * repeat). Admit, Release and SetLimit change the server's state and are
 * never sent twice: before sending one on an idle connection the library
 * checks that the server has not closed it, and it sends it again on a new
 * connection only when the first could not even be written whole (so the
 * server cannot have acted on it). If the connection fails after the
 * request was written, the call fails and memtally_query_last_error() says
 * that the request may have taken effect (an admission then holds until
 * its TTL). No other failure is retried. The socket is close-on-exec and
 * never raises SIGPIPE.
 */
#ifndef MEMTALLY_QUERY_H
#define MEMTALLY_QUERY_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "memtally.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Timeout of each call when memtally_query_open() is given 0. */
#define MEMTALLY_QUERY_DEFAULT_TIMEOUT_MS 5000

typedef struct memtally_query memtally_query;

/* Values as on the wire (memtally.v1.State). */
enum memtally_state {
	MEMTALLY_STATE_OK = 0,   /* below the high watermark */
	MEMTALLY_STATE_HIGH = 1, /* at or over the high watermark */
	MEMTALLY_STATE_OVER = 2, /* over the limit (until below hysteresis) */
};

/* Why a process's claims count as they do (memtally_process.trust): in
 * full (a trusted uid), or as the kernel vouches for them: its uid is not
 * trusted; it left a trusted uid without exec (trust_uid: its uid now);
 * its slot is in reach of a worker that did (trust_uid: that worker's uid
 * now); the server cannot read its slot (a hole punched in it that no
 * memory could fill); it exec'd an image that has not registered (its
 * slot holds the old image's claim). UNKNOWN: a server from before. */
enum memtally_trust {
	MEMTALLY_TRUST_UNKNOWN = 0,
	MEMTALLY_TRUST_FULL = 1,
	MEMTALLY_TRUST_UID = 2,
	MEMTALLY_TRUST_LEFT = 3,
	MEMTALLY_TRUST_IN_REACH = 4,
	MEMTALLY_TRUST_SLOT_UNREADABLE = 5,
	MEMTALLY_TRUST_EXEC_UNREGISTERED = 6,
};

/* Figures of one group. A limit of 0 means no limit. */
struct memtally_group_usage {
	const char *name;
	uint64_t bytes;
	uint64_t peak;
	uint64_t limit;
	enum memtally_state state;
	uint32_t processes;
	uint64_t reserved;       /* outstanding admission reservations */
	uint64_t error_bytes;    /* the figures are exact to +/- this */
	uint64_t rss;            /* resident bytes (0: not reported) */
	uint32_t reservations;   /* outstanding reservations */
	uint64_t high_watermark; /* `high` from here, bytes; 0 = no limit */
	double growth;           /* bytes per second of the measured figure
	                          * over the server's growth window;
	                          * negative: shrinking */
	double seconds_to_limit; /* at that rate; 0 = no forecast (no limit,
	                          * not growing, or already over) */
	uint64_t mapped;         /* part of `bytes`: memory the workers
	                          * mapped themselves (0: not reported) */
	uint64_t allocator_free; /* part of `bytes`: memory the workers'
	                          * allocators keep free for them (0: not
	                          * reported) */
	uint64_t unvouched;      /* claimed by members of untrusted uids beyond
	                          * what the kernel vouches for: left out of
	                          * `bytes` (see memtally_usage) */
	/* Zero. Elements of an array (memtally_usage.groups) cannot grow
	 * without changing the array's stride: later fields take these. */
	uint64_t reserved_words[2];
};

/* Fleet figures, and the groups they break down into. */
struct memtally_usage {
	uint64_t bytes; /* accounted bytes of every worker: live heap +
	                 * `mapped` + `allocator_free` */
	uint64_t peak;
	uint64_t limit; /* 0 = no fleet limit */
	uint64_t reserved;
	enum memtally_state state;
	uint32_t processes;
	uint64_t error_bytes;  /* threshold x live threads */
	uint32_t unregistered; /* workers refused for lack of slots */
	uint64_t ticks;        /* server aggregation ticks so far */
	uint64_t threshold;    /* flush threshold workers use, bytes */
	uint32_t slots;
	uint32_t slots_free;
	uint64_t rss; /* resident bytes of every worker (0: not reported) */
	const char *measure;       /* what limits compare: "accounted", "rss",
	                            * "max" (the larger), "" (not reported) */
	uint32_t reservations;     /* outstanding reservations */
	uint64_t process_limit;    /* default per-process limit, 0 = none */
	uint64_t high_watermark;   /* `high` from here, bytes; 0 = no limit */
	double growth;             /* as for a group, of the fleet */
	double seconds_to_limit;   /* 0 = no forecast */
	uint32_t growth_window_ms; /* the window of the rates (0: not
	                            * reported) */
	uint32_t forecast_horizon_ms; /* `high` when the limit is forecast
	                               * within this; 0 = off */
	size_t n_groups;
	struct memtally_group_usage *groups;
	uint64_t mapped; /* part of `bytes`: anonymous memory the workers
	                  * mapped themselves (pymalloc arenas, GGC pages,
	                  * ...) (0: not reported) */
	uint64_t allocator_free; /* part of `bytes`: memory the workers'
	                          * allocators keep free for them, resident
	                          * but not given back (glibc's freed chunks);
	                          * heap = bytes - mapped - allocator_free (0:
	                          * not reported) */
	uint64_t unvouched;      /* what workers of uids the server does not
	                          * trust claim beyond what the kernel vouches
	                          * for (resident and swapped anonymous memory,
	                          * plus a bounded allowance): left out of `bytes`,
	                          * of the state and of admission for other users
	                          * (0: none, or not reported) */
};

/* One registered worker process. */
struct memtally_process {
	uint32_t pid;
	const char *group;
	uint64_t bytes; /* heap (negative counts show as 0) + mapped +
	                 * allocator_free */
	uint64_t peak;
	uint64_t limit; /* 0 = no per-process limit */
	bool over_limit;
	bool corrupt; /* absurd counters: quarantined, not summed */
	uint32_t uid;
	uint32_t slot;
	uint32_t threads;    /* live accounted threads */
	uint64_t flushes;    /* into its lanes; a thread's latest quiet ones
	                      * (fewer than 64) join at its next full flush */
	const char *task;    /* "" = none */
	uint64_t start_time; /* /proc/PID/stat field 22, clock ticks */
	const char *comm;
	uint64_t error_bytes;
	uint64_t registered_ns;    /* CLOCK_REALTIME at registration */
	uint64_t rss;              /* resident bytes (0: not reported) */
	enum memtally_state state; /* against its own limit */
	double growth;             /* bytes per second (sampled less often
	                            * than the fleet's) */
	double seconds_to_limit;   /* to its own limit; 0 = no forecast */
	uint64_t mapped;           /* part of `bytes` (see memtally_usage) */
	uint64_t allocator_free;   /* part of `bytes` (see memtally_usage) */
	uint64_t unvouched;        /* the part of `bytes` the kernel does not
	                            * vouch for: not added to its group or the
	                            * fleet (see memtally_usage) */
	uint32_t trust;            /* enum memtally_trust: why `unvouched` */
	uint32_t trust_uid; /* MEMTALLY_TRUST_LEFT, _IN_REACH: see there */
	/* Of an untrusted process's counted figure and `rss`: what the
	 * processes it started that never registered hold (0 for a trusted
	 * one). It took the last reserved word, so the size is unchanged. */
	uint64_t descendant_bytes;
};

/*
 * The socket path a handle opened with socket_path == NULL uses:
 * $MEMTALLY_SOCKET when set and not empty, else MEMTALLY_DEFAULT_SOCKET.
 * The string belongs to the environment or is static; do not free it.
 */
MEMTALLY_EXTERN const char *memtally_query_default_socket(void);

/*
 * Connect to memtallyd at `socket_path` (NULL: see
 * memtally_query_default_socket(); the path is copied). `timeout_ms`
 * bounds every call on the handle, connecting included: > 0 milliseconds,
 * 0 for MEMTALLY_QUERY_DEFAULT_TIMEOUT_MS, < 0 to wait forever.
 * On success *out is a handle for memtally_query_close(); on failure *out
 * is NULL and the return is -EINVAL (out NULL, path ""), -ENAMETOOLONG (path
 * over 107 bytes), -ENOMEM, -ETIMEDOUT, or connect()'s -errno: -ENOENT and
 * -ECONNREFUSED usually mean memtallyd is not running.
 */
MEMTALLY_EXTERN int memtally_query_open(memtally_query **out,
                                        const char *socket_path,
                                        int timeout_ms);

/*
 * The same over TCP, to memtallyd's --tcp listener: `host_port` is
 * "HOST:PORT" or "[IPV6]:PORT" (copied). Queries and admission are open
 * there; SetLimit and releasing another's reservation need the server's
 * token (memtally_query_set_token()). Name resolution is not bounded by
 * the timeout. -EINVAL for a malformed `host_port`, -EHOSTUNREACH when the
 * name does not resolve (memtally_query_last_error() is lost with the
 * handle), else as memtally_query_open().
 */
MEMTALLY_EXTERN int memtally_query_open_tcp(memtally_query **out,
                                            const char *host_port,
                                            int timeout_ms);

/* Close the connection and free the handle. Accepts NULL. */
MEMTALLY_EXTERN void memtally_query_close(memtally_query *q);

/*
 * Why the last call on `q` failed, in words: the server's own message when
 * it answered an error, a description of the fault when its answer made no
 * sense (MEMTALLY_EPROTO) or it closed the connection, "" otherwise and
 * after a call that succeeded.
 * Owned by the handle, valid until the next call on it. Never NULL.
 */
MEMTALLY_EXTERN const char *memtally_query_last_error(const memtally_query *q);

/*
 * Errors every query call below may return, besides the ones it names:
 *   -EINVAL           an argument is NULL or out of range
 *   -ENOMEM
 *   -ETIMEDOUT        no complete answer within the handle's timeout
 *   -ECONNRESET       the server closed the connection (or reset it)
 *   -errno            of reconnecting, as memtally_query_open()
 *   MEMTALLY_EPROTO   an answer that does not decode, answers another
 *                     request, or lacks the body asked for
 *   MEMTALLY_EBADREQUEST, MEMTALLY_EUNSUPPORTED, MEMTALLY_ESERVER
 *                     the server's error answers
 *   -EBUSY            the handle is watching (memtally_query_watch_start)
 * On failure the out-parameters are set to NULL (and 0).
 */

/*
 * Fleet figures with every group. *out is the caller's, to free with
 * memtally_usage_free().
 */
MEMTALLY_EXTERN int memtally_query_usage(memtally_query *q,
                                         struct memtally_usage **out);

/*
 * Figures of one group: (*out)->groups holds exactly that group
 * (n_groups == 1); the fleet fields are as the server reports them
 * alongside. A group the server has not seen yet (no worker, reservation
 * or [group] section) answers all zero: a scheduler may ask before its
 * first task starts. MEMTALLY_EBADREQUEST for a name that is not one (over
 * 255 bytes, not UTF-8, a control character). Free with
 * memtally_usage_free().
 */
MEMTALLY_EXTERN int memtally_query_group(memtally_query *q, const char *group,
                                         struct memtally_usage **out);

/* Free a result of memtally_query_usage() or _group(). Accepts NULL. */
MEMTALLY_EXTERN void memtally_usage_free(struct memtally_usage *u);

/*
 * One process by pid (non-zero). MEMTALLY_ENOTFOUND when no registered
 * worker has that pid. Free with memtally_process_free().
 */
MEMTALLY_EXTERN int memtally_query_process(memtally_query *q, uint32_t pid,
                                           struct memtally_process **out);

/* Free a result of memtally_query_process(). Accepts NULL. */
MEMTALLY_EXTERN void memtally_process_free(struct memtally_process *p);

/*
 * Every registered process, or those of `group` (NULL or "": all), in the
 * server's order (largest bytes first). *out_array holds *n records, NULL
 * when there are none; free it with memtally_processes_free().
 */
MEMTALLY_EXTERN int
memtally_query_processes(memtally_query *q, const char *group,
                         struct memtally_process **out_array, size_t *n);

/* Free an array from memtally_query_processes(). Accepts NULL. */
MEMTALLY_EXTERN void memtally_processes_free(struct memtally_process *array);

/* ---- admission ------------------------------------------------------ */

/*
 * What a task asks for. Strings are only read during the call. The caller
 * allocates it, so it carries room to grow: `reserved` must be zero
 * (initialise the struct with `= {...}` or memset), or the call returns
 * -EINVAL; a later release gives those words a meaning whose zero is
 * today's behaviour.
 */
struct memtally_admit_req {
	uint64_t bytes;       /* > 0 */
	const char *group;    /* NULL or "": the default group */
	const char *task;     /* NULL or "": none; else the MEMTALLY_TASK its
	                       * workers will register with */
	uint32_t ttl_seconds; /* 0: the server's default */
	uint32_t flags;       /* MEMTALLY_ADMIT_*, or 0 */
	union {
		/* NULL or "": none. With a kind (what runs again and
		 * again: a job name), the server sizes the reservation
		 * from the kind's recent peaks, and `bytes` may be 0 (a
		 * server from before kinds then answers
		 * MEMTALLY_EBADREQUEST). */
		const char *kind;
		uint64_t kind_word; /* keeps the layout on 32-bit targets */
	};
	uint64_t reserved[3]; /* zero */
};

/* memtally_admit_req.flags: this Admit repeats one of the same task that
 * went unanswered (a timeout). If the server granted that one, to this
 * process, and no worker of the task took it over, its grant is the
 * answer, and no second one is made. A server from before the flag
 * decides it as any Admit. */
#define MEMTALLY_ADMIT_AGAIN 1u
/* memtally_admit_req.flags: the asking process runs the task's command
 * and releases the reservation when it ends (as `memtally run` does): its
 * workers exiting between two steps of the command does not end it; the
 * asker's own exit does, once none of them is left. A server from before
 * the flag ends it with its workers. */
#define MEMTALLY_ADMIT_UNTIL_RELEASE 2u

/*
 * The server's answer. Granted: `reservation` names it and the figures are
 * as the server counted them with the grant. Denied: `reason` says why,
 * `limit` and `limit_scope` name the limit that decided, and `top` holds
 * the largest consumers at that moment (largest first).
 */
struct memtally_admit_result {
	bool admitted;
	const char *reservation; /* "" when denied */
	const char *reason;      /* "" when admitted */
	uint64_t fleet_bytes;    /* measured bytes (of the limit's scope) */
	uint64_t reserved_bytes; /* outstanding reservations before this */
	uint64_t requested_bytes;
	uint64_t limit;          /* 0 = none */
	const char *limit_scope; /* "fleet", "group:NAME", "" */
	const char *measure;     /* what fleet_bytes measures (see
	                          * memtally_usage.measure) */
	uint32_t ttl_seconds;    /* granted: the TTL in force */
	double growth;           /* of the deciding scope (limit_scope, the
	                          * fleet when granted), bytes per second */
	double seconds_to_limit; /* its forecast; 0 = none */
	size_t n_top;
	struct memtally_process *top; /* NULL when n_top == 0 */
	/* What the reservation sets aside (or would have, when denied) and
	 * why: "declared", or "212 MiB: p95 of 37 runs of kind xz + 10%".
	 * 0 and "" from a server from before kinds. */
	uint64_t reserved_for_task;
	const char *sized_by;
	uint64_t declared_bytes; /* req->bytes as the server saw it */
	/* Denied: the rule that decided (memtally_denials_total's reason):
	 * fleet_limit, group_limit, node_line, host_limit, uid_reservations,
	 * uid_reserved_bytes, group_not_allowed, kinds. "" when admitted
	 * or from an older server. group_not_allowed never turns into a
	 * grant for this peer; kinds not until old kinds age out. */
	const char *denied_by;
};

/*
 * Ask to start a task of req->bytes. Returns 0 whether admitted or denied
 * (see (*out)->admitted); an error only when there is no answer. Never
 * sent twice (see the top of this header): after a connection failure
 * with the request written, memtally_query_last_error() says the
 * admission may have been granted. Free *out with
 * memtally_admit_result_free(). -EINVAL for req NULL, or bytes 0 without
 * a kind.
 */
MEMTALLY_EXTERN int memtally_query_admit(memtally_query *q,
                                         const struct memtally_admit_req *req,
                                         struct memtally_admit_result **out);

/* Free a result of memtally_query_admit(). Accepts NULL. */
MEMTALLY_EXTERN void
memtally_admit_result_free(struct memtally_admit_result *r);

/*
 * End a reservation before its TTL. *bytes_out (may be NULL) is the size
 * it held. MEMTALLY_ENOTFOUND when the server knows no such reservation
 * (released, expired, or never granted), MEMTALLY_EPERM when it is
 * someone else's and the peer is not authorised.
 */
MEMTALLY_EXTERN int memtally_query_release(memtally_query *q,
                                           const char *reservation,
                                           uint64_t *bytes_out);

/* A reservation as memtallyd holds it (memtally_query_reservation). Names
 * are at most 255 bytes. */
struct memtally_reservation {
	uint64_t bytes; /* granted */
	int taken_over; /* a worker of its task took it over */
	char task[256]; /* "" = none */
	char group[256];
};

/*
 * Look at a reservation without ending it: whether memtallyd holds it, for
 * which task. Errors as memtally_query_release()'s; a server from before
 * this call answers MEMTALLY_EUNSUPPORTED.
 */
MEMTALLY_EXTERN int
memtally_query_reservation(memtally_query *q, const char *reservation,
                           struct memtally_reservation *out);

/* ---- kinds ---------------------------------------------------------- */

/* One finished task of a kind. */
struct memtally_kind_run {
	uint64_t peak;        /* its workers' vouched bytes at their largest */
	uint64_t end_time_ns; /* the server's CLOCK_REALTIME at its end */
	bool evicted;         /* ended by the server's node guard */
};

/* A kind as one uid runs it (the server keeps kinds per uid). */
struct memtally_kind {
	const char *kind; /* "" when withheld (another uid's, show_others) */
	uint32_t uid;
	uint32_t runs;       /* runs the learned size is taken from */
	uint64_t runs_total; /* runs ever recorded */
	uint64_t evictions;
	uint64_t learned;       /* bytes; 0 = no history in the horizon */
	const char *learned_by; /* "p95 of 37 runs + 10%", "" */
	uint32_t outstanding;   /* reservations naming it now */
	size_t n_last;
	const struct memtally_kind_run *last; /* newest first, <= 8 */
};

struct memtally_kinds {
	double quantile; /* the server's estimator: percent */
	double margin;   /* percent added */
	uint32_t window; /* runs looked at, at most */
	uint64_t horizon_s;
	uint64_t default_size; /* reserved for a kind with no history */
	size_t n_kinds;
	const struct memtally_kind *kinds; /* by uid, then name */
};

/* Steps of a kind's profile (memtally_kind_profile). */
#define MEMTALLY_KIND_STEPS 8

/*
 * The learned sizes of the kinds the peer may see (`kind` NULL or "":
 * every one; else that name only). Free *out with memtally_kinds_free().
 * MEMTALLY_EUNSUPPORTED from a server from before kinds.
 */
MEMTALLY_EXTERN int memtally_query_kinds(memtally_query *q, const char *kind,
                                         struct memtally_kinds **out);

/*
 * The profile of k->kinds[i]: what its next task is expected to hold in
 * each of MEMTALLY_KIND_STEPS equal steps of *length_ms (a reservation
 * of it with a task follows these steps). 0, or MEMTALLY_ENOTFOUND when the
 * kind has no runs with a length (or the server is from before profiles),
 * -EINVAL for a bad index.
 */
MEMTALLY_EXTERN int memtally_kind_profile(const struct memtally_kinds *k,
                                          size_t i, uint32_t *length_ms,
                                          uint64_t bytes[MEMTALLY_KIND_STEPS]);

/* Free a result of memtally_query_kinds(). Accepts NULL. */
MEMTALLY_EXTERN void memtally_kinds_free(struct memtally_kinds *k);

/* ---- limits --------------------------------------------------------- */

/*
 * The server's tcp_token, sent with every request from then on. It
 * authorises SetLimit and Release for a peer that is not an admin by uid,
 * and a TCP connection the server cannot tie to a local uid (a remote
 * peer) needs it on every request.
 * `token` is copied; NULL or "" sends none. Returns 0, -EINVAL, -ENOMEM.
 */
MEMTALLY_EXTERN int memtally_query_set_token(memtally_query *q,
                                             const char *token);

enum memtally_scope {
	MEMTALLY_SCOPE_FLEET = 0,
	MEMTALLY_SCOPE_GROUP = 1, /* the group named `group` */
	MEMTALLY_SCOPE_PID = 2,   /* the process `pid` */
};

/*
 * Set the limit of the fleet, of a group or of one process to `bytes`
 * (0 removes it). `group` is read for MEMTALLY_SCOPE_GROUP only (not NULL
 * or ""), `pid` for MEMTALLY_SCOPE_PID only (non-zero). *previous_out
 * (may be NULL) is the limit before, 0 for none. Needs an authorised peer
 * (root, the server's user or a configured admin uid/gid; over TCP the
 * token given to memtally_query_set_token()): MEMTALLY_EPERM otherwise.
 * MEMTALLY_ENOTFOUND for a pid that is not registered.
 */
MEMTALLY_EXTERN int memtally_query_set_limit(memtally_query *q,
                                             enum memtally_scope scope,
                                             const char *group, uint32_t pid,
                                             uint64_t bytes,
                                             uint64_t *previous_out);

/*
 * memtally_query_set_limit(), and *now_out (may be NULL) the limit in
 * force after it, as memtallyd answers: for a pid, 0 removes its own
 * limit and the default per-process limit ([limits] process) applies
 * again, which *now_out then is (0: none).
 */
MEMTALLY_EXTERN int
memtally_query_set_limit2(memtally_query *q, enum memtally_scope scope,
                          const char *group, uint32_t pid, uint64_t bytes,
                          uint64_t *previous_out, uint64_t *now_out);

/* ---- watching state changes ------------------------------------------ */

/* One state change (fleet, group or process), with the figures. */
struct memtally_event {
	const char *scope; /* "fleet", "group:NAME", "pid:N" */
	enum memtally_state state;
	enum memtally_state previous;
	uint64_t bytes;
	uint64_t limit; /* 0 = none */
	uint64_t reserved;
	uint64_t time_ns;        /* the server's CLOCK_REALTIME at the change */
	uint64_t rss;            /* resident bytes of the scope */
	const char *measure;     /* what was compared with the limit */
	const char *reason;      /* why, in words ("" from an older server) */
	double growth;           /* the scope's bytes per second then */
	double seconds_to_limit; /* its forecast then; 0 = none */
};

/*
 * Called for each event. `ev` and its strings live until the callback
 * returns. Return 0 for more, non-zero to stop watching.
 */
typedef int (*memtally_event_cb)(const struct memtally_event *ev, void *arg);

/*
 * Subscribe and call `cb` for every event until it returns non-zero
 * (then 0 is returned), the server closes the stream (-ECONNRESET), or no
 * event arrives within the handle's timeout (-ETIMEDOUT: open the handle
 * with timeout_ms < 0 to wait for ever). A watch occupies the connection:
 * when it ends the connection is closed, and the next call on the handle
 * reconnects. Errors as for every call, and the server's error answer to
 * the Watch request (MEMTALLY_EUNSUPPORTED from a server without it).
 */
MEMTALLY_EXTERN int memtally_query_watch(memtally_query *q,
                                         memtally_event_cb cb, void *arg);

/*
 * The same, for a caller's own event loop (poll, epoll, libuv's uv_poll):
 *
 *	memtally_query_watch_start(q);
 *	fd = memtally_query_fd(q);   ... wait for fd readable, then:
 *	while ((err = memtally_query_watch_next(q, &ev)) == 0)
 *		handle(&ev);
 *	if (err != -EAGAIN)
 *		... the watch is over (closed, error) ...
 *
 * memtally_query_watch_start() sends the Watch request (blocking for at
 * most the handle's timeout) and returns 0 or an error as any call.
 * From then on the handle is watching: other requests on it fail with
 * -EBUSY until memtally_query_watch_stop() (or an error) ends the watch.
 *
 * memtally_query_watch_next() never blocks: it reads what the socket
 * holds and returns 0 with the next event in *ev_out, or -EAGAIN when no
 * whole event has arrived (wait for the fd to be readable again). Call it
 * until -EAGAIN after each wake-up: events may already be buffered in the
 * handle (this matters with edge-triggered polling). The strings in
 * *ev_out belong to the handle and last until its next call. Any other
 * return ends the watch and closes the connection: -ECONNRESET (the
 * server closed it), MEMTALLY_EPROTO, the server's error answer, -EINVAL
 * (not watching).
 */
MEMTALLY_EXTERN int memtally_query_watch_start(memtally_query *q);

/* For the watches `q` starts from now on: `own` non-zero asks for the
 * events of the caller's own uid only (and those of no uid: the fleet,
 * groups). An admin sees every uid's events, another user's too where the
 * server shows them (show_others = all): a job runner watching for its
 * task's eviction ("task:NAME") sets it, so that another uid's task of the
 * same name is not taken for its own. An older server ignores it. 0, or
 * -EINVAL for a NULL handle. */
MEMTALLY_EXTERN int memtally_query_watch_own(memtally_query *q, int own);
MEMTALLY_EXTERN int memtally_query_watch_next(memtally_query *q,
                                              struct memtally_event *ev_out);

/* End a watch: close the connection (the next call reconnects). Does
 * nothing when the handle is not watching. */
MEMTALLY_EXTERN void memtally_query_watch_stop(memtally_query *q);

/*
 * The handle's connected socket, for poll(): readable when
 * memtally_query_watch_next() has something to read. -1 while
 * disconnected. Owned by the handle: do not read, write or close it.
 */
MEMTALLY_EXTERN int memtally_query_fd(const memtally_query *q);

/* ---- sizes ------------------------------------------------------------ */

/*
 * Parse a byte size as memtallyd's flags and config do: digits with an
 * optional fraction, then an optional unit, case-insensitive. K, M, G, T
 * and KiB, MiB, GiB, TiB (and Ki, Mi, ...) are powers of 1024; KB, MB,
 * GB, TB powers of 1000; B or nothing is bytes. A fraction needs a unit
 * ("1.5G"); the result is rounded down, but a size that is not 0 never
 * to 0 (for a limit, 0 is none). No sign, spaces or hex. Returns 0,
 * -EINVAL (not a size), -ERANGE (over UINT64_MAX) or -EDOM (not 0, but
 * less than a byte: "0.0000001K").
 */
MEMTALLY_EXTERN int memtally_parse_size(const char *s, uint64_t *out);

/* "ok", "high", "over", or "unknown" for a value from a newer server. */
MEMTALLY_EXTERN const char *memtally_state_name(enum memtally_state s);

#ifdef __cplusplus
}
#endif

#endif /* MEMTALLY_QUERY_H */
