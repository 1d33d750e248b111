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
 * Calls block for at most the handle's timeout. A handle is one connection
 * and is not thread-safe: use it from one thread at a time, or open one per
 * thread (connections are cheap). After a transport failure (timeout,
 * reset, garbled answer) the connection is dropped and the next call
 * reconnects, so a long-lived handle survives a server restart. A query
 * that finds its idle connection closed by the server before any answer
 * arrived is sent once more on a new connection (queries are safe to
 * repeat); no other failure is retried. The socket is close-on-exec and
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

/*
 * The server's error answers, beyond MEMTALLY_ESERVER (-4004, any other
 * error answer). memtally_query_last_error() holds the server's message.
 */
#define MEMTALLY_ENOTFOUND    (-4005) /* no such pid, group or reservation */
#define MEMTALLY_EPERM        (-4006) /* the request needs an authorised peer */
#define MEMTALLY_ENOSLOTS     (-4007) /* the segment has no free slot */
#define MEMTALLY_EUNSUPPORTED (-4008) /* the server does not implement it */
#define MEMTALLY_EBADREQUEST  (-4009) /* the server rejected the request */

/* Timeout of each call when memtally_query_open() is given 0. */
#define MEMTALLY_QUERY_DEFAULT_TIMEOUT_MS 5000

typedef struct memtally_query memtally_query;

/* Values as on the wire (memtally.v1.State). */
enum memtally_state {
	MEMTALLY_STATE_OK = 0,   /* below the high watermark */
	MEMTALLY_STATE_HIGH = 1, /* at or over the high watermark */
	MEMTALLY_STATE_OVER = 2, /* over the limit (until below hysteresis) */
};

/* Figures of one group. A limit of 0 means no limit. */
struct memtally_group_usage {
	const char *name;
	uint64_t bytes;
	uint64_t peak;
	uint64_t limit;
	enum memtally_state state;
	uint32_t processes;
	uint64_t reserved;    /* outstanding admission reservations */
	uint64_t error_bytes; /* the figures are exact to +/- this */
};

/* Fleet figures, and the groups they break down into. */
struct memtally_usage {
	uint64_t bytes; /* accounted live heap bytes of every worker */
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
	size_t n_groups;
	struct memtally_group_usage *groups;
};

/* One registered worker process. */
struct memtally_process {
	uint32_t pid;
	const char *group;
	uint64_t bytes; /* negative counts show as 0 */
	uint64_t peak;
	uint64_t limit; /* 0 = no per-process limit */
	bool over_limit;
	bool corrupt; /* absurd counters: quarantined, not summed */
	uint32_t uid;
	uint32_t slot;
	uint32_t threads; /* live accounted threads */
	uint64_t flushes;
	const char *task;    /* "" = none */
	uint64_t start_time; /* /proc/PID/stat field 22, clock ticks */
	const char *comm;
	uint64_t error_bytes;
	uint64_t registered_ns; /* CLOCK_REALTIME at registration */
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
 * alongside. MEMTALLY_ENOTFOUND when the server knows no such group.
 * Free with memtally_usage_free().
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

/* "ok", "high", "over", or "unknown" for a value from a newer server. */
MEMTALLY_EXTERN const char *memtally_state_name(enum memtally_state s);

#ifdef __cplusplus
}
#endif

#endif /* MEMTALLY_QUERY_H */
