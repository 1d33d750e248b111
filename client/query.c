/*
 * query.c - the scheduler's query library (memtally_query.h).
 *
 * One handle is one Unix-socket connection to memtallyd and carries one
 * request at a time: pack a Request with the next id, write it whole, read
 * until one complete delimited Response is buffered, check that it answers
 * this request, and copy the figures into plain C structs. Nothing is
 * pipelined, so the only response that may legitimately arrive is the one
 * for the request just sent; anything else means the stream is out of step.
 *
 * Invariants:
 *  - The socket is blocking, but every send and recv passes MSG_DONTWAIT
 *    and waits in poll() against one deadline per call, so a call never
 *    blocks past the handle's timeout however the server dribbles bytes.
 *  - After any transport fault (timeout, EOF, a frame that does not decode,
 *    an answer to another id) the connection is closed, because the bytes
 *    still in flight would be taken as the answer to the next request. The
 *    next call reconnects. A server error answer leaves the stream in step
 *    and the connection open, except for the two errors after which the
 *    server itself closes it.
 *  - Each result is one allocation (structs, arrays and strings together),
 *    so its free function is a single free() and no partial result leaks.
 */
#define _GNU_SOURCE

#include <errno.h>
#include <poll.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include "memtally.pb-c.h"
#include "memtally_query.h"
#include "mtframe.h"

/*
 * Largest response body accepted. A process packs to at most ~130 bytes
 * (every field large, 15-byte group, comm and 21-byte task), so a
 * ProcessList of 16384 slots is about 2 MiB and one of the server's
 * 1048576 maximum about 130 MiB. The bound only stops a garbled length
 * prefix from making us allocate without limit; it is generous for any
 * realistic fleet.
 */
#define QUERY_MAX_RESPONSE (64u << 20)
#define QUERY_RBUF_MIN     4096u

struct memtally_query {
	int fd;         /* -1 while disconnected */
	int timeout_ms; /* < 0: no deadline */
	uint64_t next_id;
	uint8_t *rbuf; /* received bytes not yet consumed */
	size_t rlen;
	size_t rcap;
	char *path;
	char errmsg[256];
};

const char *memtally_query_default_socket(void)
{
	const char *env = getenv("MEMTALLY_SOCKET");
	return env && env[0] ? env : MEMTALLY_DEFAULT_SOCKET;
}

const char *memtally_state_name(enum memtally_state s)
{
	switch (s) {
	case MEMTALLY_STATE_OK:
		return "ok";
	case MEMTALLY_STATE_HIGH:
		return "high";
	case MEMTALLY_STATE_OVER:
		return "over";
	}
	return "unknown";
}

const char *memtally_query_last_error(const memtally_query *q)
{
	return q ? q->errmsg : "";
}

/* Record why a call failed and return `err`, so a failure path is one
 * statement: return query_fail(q, MEMTALLY_EPROTO, "...", ...). */
__attribute__((format(printf, 3, 4))) static int
query_fail(memtally_query *q, int err, const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(q->errmsg, sizeof(q->errmsg), fmt, ap);
	va_end(ap);
	return err;
}

/* ---- time ---------------------------------------------------------- */

static int64_t now_ms(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* Deadline of a call starting now; -1 means none. */
static int64_t query_deadline(const memtally_query *q)
{
	return q->timeout_ms < 0 ? -1 : now_ms() + q->timeout_ms;
}

/* Milliseconds left before `deadline` for poll(): -1 forever, 0 expired. */
static int remaining_ms(int64_t deadline)
{
	if (deadline < 0)
		return -1;
	int64_t left = deadline - now_ms();
	if (left <= 0)
		return 0;
	return left > 1000000 ? 1000000 : (int)left;
}

/* Wait until `fd` is ready for `events` or the deadline passes. Errors and
 * hang-ups count as ready: the following send/recv reports them. */
static int wait_fd(int fd, short events, int64_t deadline)
{
	for (;;) {
		struct pollfd p = {.fd = fd, .events = events};
		int left = remaining_ms(deadline);
		if (left == 0)
			return -ETIMEDOUT;
		int n = poll(&p, 1, left);
		if (n > 0)
			return 0;
		if (n == 0)
			return -ETIMEDOUT;
		if (errno != EINTR)
			return -errno;
	}
}

/* ---- connection ---------------------------------------------------- */

static void query_disconnect(memtally_query *q)
{
	if (q->fd >= 0)
		close(q->fd);
	q->fd = -1;
	q->rlen = 0;
}

/*
 * Connect within the deadline. A Unix-socket connect completes at once
 * unless the listener's backlog is full; then a blocking connect waits for
 * room for up to SO_SNDTIMEO and fails with EAGAIN, which is our timeout.
 * (A non-blocking connect would fail with EAGAIN at once and leave nothing
 * to poll for.)
 */
static int query_connect(memtally_query *q, int64_t deadline)
{
	struct sockaddr_un sa = {.sun_family = AF_UNIX};
	size_t len = strlen(q->path);
	if (len >= sizeof(sa.sun_path))
		return -ENAMETOOLONG;
	memcpy(sa.sun_path, q->path, len + 1);

	int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
	if (fd < 0)
		return -errno;
	int err;
	for (;;) {
		int left = remaining_ms(deadline);
		if (left == 0) {
			err = -ETIMEDOUT;
			goto fail_close_fd;
		}
		if (left > 0) {
			struct timeval tv = {.tv_sec = left / 1000,
			                     .tv_usec = (left % 1000) * 1000};
			if (setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv,
			               sizeof(tv)) < 0) {
				err = -errno;
				goto fail_close_fd;
			}
		}
		if (connect(fd, (struct sockaddr *)&sa, sizeof(sa)) == 0)
			break;
		if (errno == EINTR)
			continue;
		err = errno == EAGAIN ? -ETIMEDOUT : -errno;
		goto fail_close_fd;
	}
	q->fd = fd;
	q->rlen = 0;
	return 0;

fail_close_fd:
	close(fd);
	return err;
}

int memtally_query_open(memtally_query **out, const char *socket_path,
                        int timeout_ms)
{
	if (!out)
		return -EINVAL;
	*out = NULL;
	if (!socket_path)
		socket_path = memtally_query_default_socket();
	if (!socket_path[0])
		return -EINVAL;

	memtally_query *q = calloc(1, sizeof(*q));
	if (!q)
		return -ENOMEM;
	q->fd = -1;
	q->next_id = 1;
	q->timeout_ms =
	    timeout_ms ? timeout_ms : MEMTALLY_QUERY_DEFAULT_TIMEOUT_MS;
	int err = -ENOMEM;
	q->path = strdup(socket_path);
	if (!q->path)
		goto fail_free_handle;
	err = query_connect(q, query_deadline(q));
	if (err)
		goto fail_free_path;
	*out = q;
	return 0;

fail_free_path:
	free(q->path);
fail_free_handle:
	free(q);
	return err;
}

void memtally_query_close(memtally_query *q)
{
	if (!q)
		return;
	query_disconnect(q);
	free(q->rbuf);
	free(q->path);
	free(q);
}

/* ---- one request, one response ------------------------------------- */

static int send_all(memtally_query *q, const uint8_t *buf, size_t len,
                    int64_t deadline)
{
	size_t off = 0;
	while (off < len) {
		ssize_t n = send(q->fd, buf + off, len - off,
		                 MSG_NOSIGNAL | MSG_DONTWAIT);
		if (n >= 0) {
			off += (size_t)n;
			continue;
		}
		if (errno == EINTR)
			continue;
		if (errno != EAGAIN && errno != EWOULDBLOCK)
			return errno == EPIPE ? -ECONNRESET : -errno;
		int err = wait_fd(q->fd, POLLOUT, deadline);
		if (err)
			return err;
	}
	return 0;
}

static int rbuf_reserve(memtally_query *q, size_t need)
{
	if (need <= q->rcap)
		return 0;
	size_t cap = q->rcap ? q->rcap : QUERY_RBUF_MIN;
	while (cap < need)
		cap *= 2;
	uint8_t *p = realloc(q->rbuf, cap);
	if (!p)
		return -ENOMEM;
	q->rbuf = p;
	q->rcap = cap;
	return 0;
}

/*
 * Read until one whole frame is buffered. On success the body is
 * q->rbuf[*body_off, *body_off + *body_len) and the frame ends at
 * *body_off + *body_len, which the caller consumes.
 */
static int recv_frame(memtally_query *q, int64_t deadline, size_t *body_off,
                      size_t *body_len)
{
	for (;;) {
		uint64_t blen = 0;
		int pre = mtframe_decode_len(q->rbuf, q->rlen,
		                             QUERY_MAX_RESPONSE, &blen);
		if (pre < 0)
			return query_fail(q, MEMTALLY_EPROTO,
			                  "bad response length prefix (%s)",
			                  pre == MTFRAME_ETOOBIG ? "over 64 MiB"
			                                         : "varint");
		size_t need =
		    pre > 0 ? (size_t)pre + (size_t)blen : q->rlen + 1;
		if (pre > 0 && q->rlen >= need) {
			*body_off = (size_t)pre;
			*body_len = (size_t)blen;
			return 0;
		}
		/* Room for the whole frame once its length is known, and for
		 * a useful read before then. */
		int err = rbuf_reserve(q, need > q->rlen + QUERY_RBUF_MIN
		                              ? need
		                              : q->rlen + QUERY_RBUF_MIN);
		if (err)
			return err;
		ssize_t n = recv(q->fd, q->rbuf + q->rlen, q->rcap - q->rlen,
		                 MSG_DONTWAIT);
		if (n > 0) {
			q->rlen += (size_t)n;
			continue;
		}
		if (n == 0)
			return query_fail(q, -ECONNRESET,
			                  "the server closed the connection");
		if (errno == EINTR)
			continue;
		if (errno != EAGAIN && errno != EWOULDBLOCK)
			return -errno;
		err = wait_fd(q->fd, POLLIN, deadline);
		if (err)
			return err;
	}
}

static int map_server_error(Memtally__V1__ErrorCode code)
{
	switch (code) {
	case MEMTALLY__V1__ERROR_CODE__ERROR_INVALID_REQUEST:
		return MEMTALLY_EBADREQUEST;
	case MEMTALLY__V1__ERROR_CODE__ERROR_NOT_FOUND:
		return MEMTALLY_ENOTFOUND;
	case MEMTALLY__V1__ERROR_CODE__ERROR_PERMISSION_DENIED:
		return MEMTALLY_EPERM;
	case MEMTALLY__V1__ERROR_CODE__ERROR_NO_SLOTS:
		return MEMTALLY_ENOSLOTS;
	case MEMTALLY__V1__ERROR_CODE__ERROR_UNSUPPORTED:
		return MEMTALLY_EUNSUPPORTED;
	default:
		return MEMTALLY_ESERVER;
	}
}

/* The server closes the connection after these; so do we, at once. */
static bool server_error_closes(Memtally__V1__ErrorCode code)
{
	return code == MEMTALLY__V1__ERROR_CODE__ERROR_FRAME_TOO_LARGE ||
	       code == MEMTALLY__V1__ERROR_CODE__ERROR_UNDECODABLE;
}

/*
 * Send `req` with the next id and read one response into *out. A
 * transport fault closes the connection (see the invariants at the top);
 * *stale tells whether it was the kind a server restart leaves on an idle
 * connection: reset or EOF before any byte of the answer.
 */
static int query_exchange(memtally_query *q, Memtally__V1__Request *req,
                          int64_t deadline, Memtally__V1__Response **out,
                          bool *stale)
{
	*out = NULL;
	*stale = false;
	req->id = q->next_id++;
	size_t len = mtframe_packed_size(&req->base);
	uint8_t *wbuf = malloc(len);
	if (!wbuf)
		return -ENOMEM;
	mtframe_pack(&req->base, wbuf, len);
	int err = send_all(q, wbuf, len, deadline);
	free(wbuf);
	size_t off = 0, blen = 0;
	if (!err)
		err = recv_frame(q, deadline, &off, &blen);
	if (err) {
		*stale = err == -ECONNRESET && q->rlen == 0;
		goto fail_disconnect;
	}
	*out = memtally__v1__response__unpack(NULL, blen, q->rbuf + off);
	q->rlen -= off + blen;
	memmove(q->rbuf, q->rbuf + off + blen, q->rlen);
	if (!*out) {
		err = query_fail(q, MEMTALLY_EPROTO,
		                 "undecodable response (%zu bytes)", blen);
		goto fail_disconnect;
	}
	return 0;

fail_disconnect:
	query_disconnect(q);
	return err;
}

/*
 * Send `req` (its id is assigned here) and return the response in *out,
 * which the caller frees with memtally__v1__response__free_unpacked().
 * Fails unless the response answers this request, carries no error and
 * has the body `want`.
 *
 * A connection that sat idle may have been closed by a server restart, and
 * the kernel only says so when it is used. Every request sent here is a
 * query, safe to repeat, so one that meets a stale connection is sent once
 * more on a fresh one. (Admit, which is not idempotent, must not take this
 * path unchanged.)
 */
static int query_call(memtally_query *q, Memtally__V1__Request *req,
                      Memtally__V1__Response__BodyCase want,
                      Memtally__V1__Response **out)
{
	*out = NULL;
	int64_t deadline = query_deadline(q);
	Memtally__V1__Response *resp;
	int err;
	for (int attempt = 0;; attempt++) {
		q->errmsg[0] = '\0';
		bool reused = q->fd >= 0, stale;
		if (!reused) {
			err = query_connect(q, deadline);
			if (err)
				return err;
		}
		err = query_exchange(q, req, deadline, &resp, &stale);
		if (!err)
			break;
		if (!(stale && reused && attempt == 0))
			return err;
	}

	/* A server that could not decode our request cannot know its id and
	 * answers with id 0; that error is still the answer to this request. */
	bool id_ok = resp->id == req->id || (resp->id == 0 && resp->error);
	if (!id_ok) {
		err = query_fail(
		    q, MEMTALLY_EPROTO,
		    "response id %llu answers no request (sent %llu)",
		    (unsigned long long)resp->id, (unsigned long long)req->id);
		memtally__v1__response__free_unpacked(resp, NULL);
		query_disconnect(q);
		return err;
	}
	if (resp->error) {
		Memtally__V1__ErrorCode code = resp->error->code;
		const char *msg = resp->error->message;
		if (msg && msg[0])
			query_fail(q, 0, "%s", msg);
		else
			query_fail(q, 0, "server error code %d", (int)code);
		err = map_server_error(code);
		bool closes = server_error_closes(code) || resp->id != req->id;
		memtally__v1__response__free_unpacked(resp, NULL);
		if (closes)
			query_disconnect(q);
		return err;
	}
	if (resp->body_case != want) {
		/* The stream is still in step: keep the connection. */
		query_fail(q, 0, "response body %d, expected %d",
		           (int)resp->body_case, (int)want);
		memtally__v1__response__free_unpacked(resp, NULL);
		return MEMTALLY_EPROTO;
	}
	*out = resp;
	return 0;
}

/* ---- results ------------------------------------------------------- */

/* Copy `s` into the string pool at *cursor and advance it. */
static const char *pool_put(char **cursor, const char *s)
{
	char *dst = *cursor;
	size_t n = strlen(s) + 1;
	memcpy(dst, s, n);
	*cursor += n;
	return dst;
}

static const char *str_or_empty(const char *s)
{
	return s ? s : "";
}

_Static_assert(sizeof(struct memtally_usage) %
                       _Alignof(struct memtally_group_usage) ==
                   0,
               "the groups array follows the usage struct in one block");

static struct memtally_usage *
usage_from_pb(const Memtally__V1__Usage *u,
              Memtally__V1__GroupUsage *const *groups, size_t n)
{
	size_t size = sizeof(struct memtally_usage) +
	              n * sizeof(struct memtally_group_usage);
	for (size_t i = 0; i < n; i++)
		size += strlen(str_or_empty(groups[i]->name)) + 1;
	struct memtally_usage *r = calloc(1, size);
	if (!r)
		return NULL;
	*r = (struct memtally_usage){
	    .bytes = u->fleet_bytes,
	    .peak = u->fleet_peak,
	    .limit = u->fleet_limit,
	    .reserved = u->reserved_bytes,
	    .state = (enum memtally_state)u->state,
	    .processes = u->processes,
	    .error_bytes = u->error_bytes,
	    .unregistered = u->unregistered,
	    .ticks = u->ticks,
	    .threshold = u->threshold,
	    .slots = u->slots,
	    .slots_free = u->slots_free,
	    .n_groups = n,
	    .groups = n ? (struct memtally_group_usage *)(r + 1) : NULL,
	};
	char *pool = (char *)(r + 1) + n * sizeof(struct memtally_group_usage);
	for (size_t i = 0; i < n; i++) {
		const Memtally__V1__GroupUsage *g = groups[i];
		r->groups[i] = (struct memtally_group_usage){
		    .name = pool_put(&pool, str_or_empty(g->name)),
		    .bytes = g->bytes,
		    .peak = g->peak,
		    .limit = g->limit,
		    .state = (enum memtally_state)g->state,
		    .processes = g->processes,
		    .reserved = g->reserved_bytes,
		    .error_bytes = g->error_bytes,
		};
	}
	return r;
}

static struct memtally_process *
processes_from_pb(Memtally__V1__ProcessInfo *const *infos, size_t n)
{
	size_t size = n * sizeof(struct memtally_process);
	for (size_t i = 0; i < n; i++)
		size += strlen(str_or_empty(infos[i]->group)) +
		        strlen(str_or_empty(infos[i]->task)) +
		        strlen(str_or_empty(infos[i]->comm)) + 3;
	struct memtally_process *r = calloc(1, size);
	if (!r)
		return NULL;
	char *pool = (char *)(r + n);
	for (size_t i = 0; i < n; i++) {
		const Memtally__V1__ProcessInfo *p = infos[i];
		r[i] = (struct memtally_process){
		    .pid = p->pid,
		    .group = pool_put(&pool, str_or_empty(p->group)),
		    .bytes = p->bytes,
		    .peak = p->peak,
		    .limit = p->limit,
		    .over_limit = p->over_limit,
		    .corrupt = p->corrupt,
		    .uid = p->uid,
		    .slot = p->slot,
		    .threads = p->threads,
		    .flushes = p->flushes,
		    .task = pool_put(&pool, str_or_empty(p->task)),
		    .start_time = p->start_time,
		    .comm = pool_put(&pool, str_or_empty(p->comm)),
		    .error_bytes = p->error_bytes,
		    .registered_ns = p->registered_ns,
		};
	}
	return r;
}

/* GetUsage with `gu` as its scope; the Usage body in *resp on success. */
static int get_usage(memtally_query *q, Memtally__V1__GetUsage *gu,
                     Memtally__V1__Response **resp)
{
	Memtally__V1__Request req = MEMTALLY__V1__REQUEST__INIT;
	req.body_case = MEMTALLY__V1__REQUEST__BODY_GET_USAGE;
	req.get_usage = gu;
	return query_call(q, &req, MEMTALLY__V1__RESPONSE__BODY_USAGE, resp);
}

int memtally_query_usage(memtally_query *q, struct memtally_usage **out)
{
	if (!out)
		return -EINVAL;
	*out = NULL;
	if (!q)
		return -EINVAL;
	Memtally__V1__GetUsage gu = MEMTALLY__V1__GET_USAGE__INIT;
	gu.scope_case = MEMTALLY__V1__GET_USAGE__SCOPE_FLEET;
	gu.fleet = 1;
	Memtally__V1__Response *resp;
	int err = get_usage(q, &gu, &resp);
	if (err)
		return err;
	const Memtally__V1__Usage *u = resp->usage;
	*out = usage_from_pb(u, u->groups, u->n_groups);
	memtally__v1__response__free_unpacked(resp, NULL);
	return *out ? 0 : -ENOMEM;
}

int memtally_query_group(memtally_query *q, const char *group,
                         struct memtally_usage **out)
{
	if (!out)
		return -EINVAL;
	*out = NULL;
	if (!q || !group)
		return -EINVAL;
	Memtally__V1__GetUsage gu = MEMTALLY__V1__GET_USAGE__INIT;
	gu.scope_case = MEMTALLY__V1__GET_USAGE__SCOPE_GROUP;
	gu.group = (char *)group; /* protobuf-c only reads it */
	Memtally__V1__Response *resp;
	int err = get_usage(q, &gu, &resp);
	if (err)
		return err;
	err = 0;
	if (!resp->usage->group)
		err = query_fail(q, MEMTALLY_EPROTO,
		                 "usage of group '%s' lacks the group", group);
	else if (!(*out = usage_from_pb(resp->usage, &resp->usage->group, 1)))
		err = -ENOMEM;
	memtally__v1__response__free_unpacked(resp, NULL);
	return err;
}

void memtally_usage_free(struct memtally_usage *u)
{
	free(u);
}

int memtally_query_process(memtally_query *q, uint32_t pid,
                           struct memtally_process **out)
{
	if (!out)
		return -EINVAL;
	*out = NULL;
	if (!q || pid == 0)
		return -EINVAL;
	Memtally__V1__GetUsage gu = MEMTALLY__V1__GET_USAGE__INIT;
	gu.scope_case = MEMTALLY__V1__GET_USAGE__SCOPE_PID;
	gu.pid = pid;
	Memtally__V1__Response *resp;
	int err = get_usage(q, &gu, &resp);
	if (err)
		return err;
	err = 0;
	Memtally__V1__ProcessInfo *p = resp->usage->process;
	if (!p || p->pid != pid)
		err = query_fail(q, MEMTALLY_EPROTO,
		                 "usage of pid %u lacks that process",
		                 (unsigned)pid);
	else if (!(*out = processes_from_pb(&resp->usage->process, 1)))
		err = -ENOMEM;
	memtally__v1__response__free_unpacked(resp, NULL);
	return err;
}

void memtally_process_free(struct memtally_process *p)
{
	free(p);
}

int memtally_query_processes(memtally_query *q, const char *group,
                             struct memtally_process **out_array, size_t *n)
{
	if (!out_array || !n)
		return -EINVAL;
	*out_array = NULL;
	*n = 0;
	if (!q)
		return -EINVAL;
	Memtally__V1__ListProcesses lp = MEMTALLY__V1__LIST_PROCESSES__INIT;
	if (group)
		lp.group = (char *)group; /* protobuf-c only reads it */
	Memtally__V1__Request req = MEMTALLY__V1__REQUEST__INIT;
	req.body_case = MEMTALLY__V1__REQUEST__BODY_LIST_PROCESSES;
	req.list_processes = &lp;
	Memtally__V1__Response *resp;
	int err = query_call(q, &req, MEMTALLY__V1__RESPONSE__BODY_PROCESS_LIST,
	                     &resp);
	if (err)
		return err;
	const Memtally__V1__ProcessList *pl = resp->process_list;
	size_t count = pl->n_processes;
	if (count) {
		*out_array = processes_from_pb(pl->processes, count);
		if (*out_array)
			*n = count;
		else
			err = -ENOMEM;
	}
	memtally__v1__response__free_unpacked(resp, NULL);
	return err;
}

void memtally_processes_free(struct memtally_process *array)
{
	free(array);
}
