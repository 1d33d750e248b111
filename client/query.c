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
 * Requests that change the server's state (Admit, Release, SetLimit) are
 * not repeatable: sending one twice could reserve twice or report the wrong
 * previous limit. They are sent again only when the first copy was not
 * written whole, which for a stream socket means the server cannot have
 * read all of it; and before one goes out on an idle connection, a
 * zero-timeout poll() checks that the server has not already closed it
 * (the common case after a server restart), so the ambiguous case (the
 * connection fails after the request was written) is left to real faults.
 *
 * A Watch turns the connection into a one-way stream of events with the
 * Watch request's id. The handle is then `watching`: it refuses other
 * requests, and memtally_query_watch_next() reads without blocking so the
 * caller can drive it from its own poll loop.
 *
 * Invariants:
 *  - The socket is blocking, but every send and recv passes MSG_DONTWAIT
 *    and waits in poll() against one deadline per call, so a call never
 *    blocks past the handle's timeout however the server dribbles bytes.
 *  - After any transport fault (timeout, EOF, a frame that does not decode,
 *    an answer to another id) the connection is closed, because the bytes
 *    still in flight would be taken as the answer to the next request. The
 *    next call reconnects. A server error answer leaves the stream in step
 *    and the connection open, except for the errors after which the
 *    server itself may close it (server_error_closes).
 *  - Each result is one allocation (structs, arrays and strings together),
 *    so its free function is a single free() and no partial result leaks.
 */
#define _GNU_SOURCE

#include <errno.h>
#include <libgen.h>
#include <math.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include "memtally.pb-c.h"
#include "memtally_query.h"
#include "query_msg.h"
#include "mt_sockdiag.h"
#include "mtcommon.h"
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
#define QUERY_RBUF_KEEP    (1u << 20) /* kept between answers, at most */

struct memtally_query {
	int fd;         /* -1 while disconnected */
	int timeout_ms; /* < 0: no deadline */
	uint64_t next_id;
	uint8_t *rbuf; /* received bytes not yet consumed */
	size_t rlen;
	size_t rcap;
	char *path; /* socket path, or HOST:PORT when `tcp` */
	bool tcp;
	char *token;        /* sent with every request; NULL = none */
	bool token_vouched; /* the server on `fd` may be given it */
	bool watching;      /* a Watch was sent: only events arrive now */
	bool watch_own;     /* memtally_query_watch_own(): Watch.own */
	uint64_t watch_id;  /* its request id */
	Memtally__V1__Response *event; /* the last event of watch_next() */
	char errmsg[256];
};

const char *memtally_query_default_socket(void)
{
	const char *env = getenv("MEMTALLY_SOCKET");
	return env && env[0] ? env : MT_DEFAULT_SOCKET;
}

const char *memtally_state_name(enum memtally_state s)
{
	return mt_state_name((unsigned)s);
}

int memtally_parse_size(const char *s, uint64_t *out)
{
	return mt_parse_size(s, out);
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

/* Wait for `events` on `fd` until the deadline (now_ms() time; -1:
 * none). */
static int wait_fd(int fd, short events, int64_t deadline)
{
	return mt_wait_fd(fd, events,
	                  deadline < 0 ? UINT64_MAX
	                               : (uint64_t)deadline * 1000000u);
}

/* ---- connection ---------------------------------------------------- */

static void query_disconnect(memtally_query *q)
{
	if (q->fd >= 0)
		close(q->fd);
	q->fd = -1;
	q->rlen = 0;
	q->watching = false;
	q->token_vouched = false;
}

/*
 * Is the idle connection unusable? Any readiness means so: EOF (the server
 * closed it, e.g. it restarted), an error, or bytes nobody asked for. A
 * zero-timeout poll, done only before requests that must not be repeated.
 */
static bool conn_unusable(const memtally_query *q)
{
	if (q->rlen)
		return true;
	struct pollfd p = {.fd = q->fd, .events = POLLIN | POLLRDHUP};
	return poll(&p, 1, 0) != 0;
}

/*
 * Connect within the deadline. A Unix-socket connect completes at once
 * unless the listener's backlog is full; then a blocking connect waits for
 * room for up to SO_SNDTIMEO and fails with EAGAIN, which is our timeout.
 * (A non-blocking connect would fail with EAGAIN at once and leave nothing
 * to poll for.)
 */
static int unix_connect(memtally_query *q, int64_t deadline)
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

/* Connect one address within the deadline (a non-blocking connect). */
static int tcp_connect_one(const struct addrinfo *ai, int64_t deadline,
                           int *fd_out)
{
	int fd =
	    socket(ai->ai_family, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK,
	           ai->ai_protocol);
	if (fd < 0)
		return -errno;
	int err = 0;
	if (connect(fd, ai->ai_addr, ai->ai_addrlen) < 0) {
		if (errno != EINPROGRESS) {
			err = -errno;
			goto fail_close_fd;
		}
		err = wait_fd(fd, POLLOUT, deadline);
		if (err)
			goto fail_close_fd;
		int soerr = 0;
		socklen_t len = sizeof(soerr);
		if (getsockopt(fd, SOL_SOCKET, SO_ERROR, &soerr, &len) < 0)
			soerr = errno;
		if (soerr) {
			err = -soerr;
			goto fail_close_fd;
		}
	}
	/* One small request, one small answer: do not wait to coalesce. */
	int one = 1;
	setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
	*fd_out = fd;
	return 0;

fail_close_fd:
	close(fd);
	return err;
}

/*
 * Connect to HOST:PORT, trying each address it resolves to. Name
 * resolution itself (getaddrinfo) is not bounded by the deadline: use an
 * address or a name from /etc/hosts where that matters.
 */
static int tcp_connect(memtally_query *q, int64_t deadline)
{
	char host[256], port[8];
	uint16_t port_n;
	if (mt_split_hostport(q->path, host, sizeof(host), &port_n))
		return -EINVAL;
	snprintf(port, sizeof(port), "%u", port_n);
	struct addrinfo hints = {.ai_socktype = SOCK_STREAM,
	                         .ai_flags = AI_NUMERICSERV};
	struct addrinfo *res;
	/* "localhost" is 127.0.0.1, as memtallyd reads it for its own
	 * address: /etc/hosts lists ::1 first, where any user may listen on
	 * the same port and take the token every request carries. */
	if (strcasecmp(host, "localhost") == 0)
		snprintf(host, sizeof(host), "127.0.0.1");
	int gai = getaddrinfo(host, port, &hints, &res);
	if (gai)
		return query_fail(q, gai == EAI_SYSTEM ? -errno : -EHOSTUNREACH,
		                  "cannot resolve '%s': %s", host,
		                  gai_strerror(gai));
	int err = -EHOSTUNREACH;
	for (struct addrinfo *ai = res; ai; ai = ai->ai_next) {
		int fd = -1;
		err = tcp_connect_one(ai, deadline, &fd);
		if (err == 0) {
			q->fd = fd;
			q->rlen = 0;
			break;
		}
		if (err == -ETIMEDOUT)
			break;
	}
	freeaddrinfo(res);
	return err;
}

static int query_connect(memtally_query *q, int64_t deadline)
{
	return q->tcp ? tcp_connect(q, deadline) : unix_connect(q, deadline);
}

/* The common part of both opens: `target` is a path or HOST:PORT. */
static int query_open(memtally_query **out, const char *target, bool tcp,
                      int timeout_ms)
{
	memtally_query *q = calloc(1, sizeof(*q));
	if (!q)
		return -ENOMEM;
	q->fd = -1;
	q->tcp = tcp;
	q->next_id = 1;
	q->timeout_ms =
	    timeout_ms ? timeout_ms : MEMTALLY_QUERY_DEFAULT_TIMEOUT_MS;
	int err = -ENOMEM;
	q->path = strdup(target);
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

int memtally_query_open_tcp(memtally_query **out, const char *host_port,
                            int timeout_ms)
{
	if (!out)
		return -EINVAL;
	*out = NULL;
	if (!host_port || !host_port[0])
		return -EINVAL;
	char host[256];
	uint16_t port;
	if (mt_split_hostport(host_port, host, sizeof(host), &port))
		return -EINVAL;
	return query_open(out, host_port, true, timeout_ms);
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
	return query_open(out, socket_path, false, timeout_ms);
}

void memtally_query_close(memtally_query *q)
{
	if (!q)
		return;
	query_disconnect(q);
	if (q->event)
		memtally__v1__response__free_unpacked(q->event, NULL);
	free(q->rbuf);
	free(q->path);
	free(q->token);
	free(q);
}

int memtally_query_set_token(memtally_query *q, const char *token)
{
	if (!q)
		return -EINVAL;
	char *copy = NULL;
	if (token && token[0] && !(copy = strdup(token)))
		return -ENOMEM;
	free(q->token);
	q->token = copy;
	return 0;
}

/* ---- one request, one response ------------------------------------- */

static int send_all(memtally_query *q, const uint8_t *buf, size_t len,
                    int64_t deadline)
{
	return mt_send_all(q->fd, buf, len,
	                   deadline < 0 ? UINT64_MAX
	                                : (uint64_t)deadline * 1000000u);
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
 * Is one whole frame buffered? 1 with its body at
 * q->rbuf[*body_off, *body_off + *body_len) (the frame ends there and the
 * caller consumes it), 0 when more bytes are needed (*body_off then holds
 * how many the frame needs in all, or rlen + 1 while its length is still
 * incomplete), MEMTALLY_EPROTO for a bad length prefix.
 */
static int frame_buffered(memtally_query *q, size_t *body_off, size_t *body_len)
{
	uint64_t blen = 0;
	int pre =
	    mtframe_decode_len(q->rbuf, q->rlen, QUERY_MAX_RESPONSE, &blen);
	if (pre < 0)
		return query_fail(
		    q, MEMTALLY_EPROTO, "bad response length prefix (%s)",
		    pre == MTFRAME_ETOOBIG ? "over 64 MiB" : "varint");
	size_t need = pre > 0 ? (size_t)pre + (size_t)blen : q->rlen + 1;
	if (pre > 0 && q->rlen >= need) {
		*body_off = (size_t)pre;
		*body_len = (size_t)blen;
		return 1;
	}
	*body_off = need;
	return 0;
}

/*
 * One non-blocking read toward a frame of `need` bytes: 0 when bytes
 * arrived, -EAGAIN when none are there, -ECONNRESET at EOF, -errno.
 */
static int recv_some(memtally_query *q, size_t need)
{
	/* Room for the whole frame once its length is known, and for a
	 * useful read before then. */
	int err = rbuf_reserve(q, need > q->rlen + QUERY_RBUF_MIN
	                              ? need
	                              : q->rlen + QUERY_RBUF_MIN);
	if (err)
		return err;
	for (;;) {
		ssize_t n = recv(q->fd, q->rbuf + q->rlen, q->rcap - q->rlen,
		                 MSG_DONTWAIT);
		if (n > 0) {
			q->rlen += (size_t)n;
			return 0;
		}
		if (n == 0)
			return query_fail(q, -ECONNRESET,
			                  "the server closed the connection");
		if (errno == EINTR)
			continue;
		if (errno == EAGAIN || errno == EWOULDBLOCK)
			return -EAGAIN;
		return -errno;
	}
}

/*
 * Read until one whole frame is buffered; see frame_buffered() for where
 * its body is on success.
 */
static int recv_frame(memtally_query *q, int64_t deadline, size_t *body_off,
                      size_t *body_len)
{
	for (;;) {
		int r = frame_buffered(q, body_off, body_len);
		if (r)
			return r < 0 ? r : 0;
		r = recv_some(q, *body_off);
		if (r == -EAGAIN)
			r = wait_fd(q->fd, POLLIN, deadline);
		if (r)
			return r;
	}
}

/* Every call starts with no reason recorded: one it refuses before
 * reaching the server must not report an earlier call's. */
static void query_begin(memtally_query *q)
{
	if (q)
		q->errmsg[0] = '\0';
}

/* What unpacking one response may allocate: QUERY_UNPACK_RATIO times its
 * size and QUERY_UNPACK_EXTRA more. A real answer unpacks to a few times
 * its size (a process entry of ~50-130 bytes to ~260). An entry can be
 * packed in 2 bytes though, so a peer's 64 MiB of empty entries would
 * unpack to ~13 GB, and the host would meet the OOM killer instead of an
 * error. The blocks are malloc's, so free_unpacked(.., NULL) frees them. */
#define QUERY_UNPACK_RATIO 16u
#define QUERY_UNPACK_EXTRA (1u << 20)

static void *budget_alloc(void *data, size_t size)
{
	size_t *left = data;
	if (size > *left)
		return NULL;
	*left -= size;
	return malloc(size);
}

static void budget_free(void *data, void *p)
{
	(void)data;
	free(p);
}

/* Unpack the frame at q->rbuf[off, off + blen) and consume it. NULL (with
 * the reason recorded) when it does not decode. */
static Memtally__V1__Response *take_frame(memtally_query *q, size_t off,
                                          size_t blen)
{
	size_t left = QUERY_UNPACK_RATIO * blen + QUERY_UNPACK_EXTRA;
	ProtobufCAllocator budget = {budget_alloc, budget_free, &left};
	Memtally__V1__Response *r =
	    memtally__v1__response__unpack(&budget, blen, q->rbuf + off);
	q->rlen -= off + blen;
	memmove(q->rbuf, q->rbuf + off + blen, q->rlen);
	if (q->rlen == 0 && q->rcap > QUERY_RBUF_KEEP) {
		/* One large answer does not pin its buffer for the handle's
		 * life. */
		free(q->rbuf);
		q->rbuf = NULL;
		q->rcap = 0;
	}
	if (!r)
		query_fail(q, MEMTALLY_EPROTO,
		           "undecodable response (%zu bytes)", blen);
	return r;
}

/* Root, this user, or $MEMTALLY_SERVER_UID (a service user of its own):
 * the uids a server we give the token to may run as. */
static bool uid_trusted(uint32_t uid)
{
	if (uid == 0 || uid == geteuid())
		return true;
	const char *su = getenv("MEMTALLY_SERVER_UID");
	char *end;
	if (!su || *su < '0' || *su > '9')
		return false;
	unsigned long v = strtoul(su, &end, 10);
	return *end == '\0' && v == uid;
}

/*
 * May the server on q->fd be given the token? The token is admin rights,
 * and it goes to whoever listens where we connect: on a TCP port any user
 * may bind while memtallyd is down (a restart, boot order), or a socket
 * in a directory any user may write. So the listener must be a uid we
 * trust (uid_trusted), as the worker library checks before it registers:
 *  - Unix: its SO_PEERCRED uid, or the owner of the socket's directory
 *    when only that owner may write there (a service user's /run dir);
 *  - TCP to an address of this host: the uid of its end of the
 *    connection, from the kernel (sock_diag), once the server has
 *    accepted it (within the deadline). No such socket here means
 *    the port is forwarded to another network namespace, where no user
 *    of this one can listen. A remote server cannot be checked from
 *    here; there the token is what the network between is trusted with.
 * 0, or -EACCES (ours, not the server's refusal) with the reason in
 * q->errmsg; -ECONNRESET or -ETIMEDOUT when the connection itself fails.
 */
static int token_vouch(memtally_query *q, int64_t deadline)
{
	if (q->tcp) {
		struct sockaddr_storage peer, local;
		socklen_t pl = sizeof(peer), ll = sizeof(local);
		if (getpeername(q->fd, (struct sockaddr *)&peer, &pl) < 0 ||
		    getsockname(q->fd, (struct sockaddr *)&local, &ll) < 0)
			return -errno;
		if (!mt_addr_is_local((struct sockaddr *)&peer,
		                      (struct sockaddr *)&local))
			return 0;
		uint32_t uid;
		int err;
		/* Until the server accept()s, its end is held by no process
		 * and names no one (-EAGAIN): a busy memtallyd takes a
		 * moment, within the deadline. */
		for (int nap = 1;; nap = nap < 64 ? nap * 2 : 64) {
			err = mt_sockdiag_uid(q->fd, (struct sockaddr *)&peer,
			                      (struct sockaddr *)&local, &uid);
			int left = remaining_ms(deadline);
			if (err != -EAGAIN || left == 0)
				break;
			poll(NULL, 0, left > 0 && left < nap ? left : nap);
		}
		if (err == -ENOENT)
			return 0;
		/* Closed on us (memtallyd at its connection caps, or
		 * stopping), or never accepted in time: the connection's
		 * fault, as the request's answer would have been, not a
		 * refusal. */
		if (err == -ENOTCONN)
			return query_fail(q, -ECONNRESET,
			                  "the server closed the connection");
		if (err == -EAGAIN)
			return query_fail(q, -ETIMEDOUT,
			                  "the server did not accept the "
			                  "connection in time");
		if (err)
			return query_fail(q, -EACCES,
			                  "not sending the token to %s: cannot "
			                  "tell which user listens there (%s)",
			                  q->path, strerror(-err));
		if (uid_trusted(uid))
			return 0;
		return query_fail(q, -EACCES,
		                  "not sending the token to %s: uid %u listens "
		                  "there, not root, this user or "
		                  "$MEMTALLY_SERVER_UID",
		                  q->path, uid);
	}
	struct ucred c;
	socklen_t len = sizeof(c);
	if (getsockopt(q->fd, SOL_SOCKET, SO_PEERCRED, &c, &len) < 0)
		return -errno;
	if (uid_trusted(c.uid))
		return 0;
	char dir[sizeof(((struct sockaddr_un *)0)->sun_path)];
	snprintf(dir, sizeof(dir), "%s", q->path);
	struct stat st;
	if (stat(dirname(dir), &st) == 0 && st.st_uid == c.uid &&
	    !(st.st_mode & (S_IWGRP | S_IWOTH)))
		return 0;
	return query_fail(q, -EACCES,
	                  "not sending the token to %s: uid %u listens there, "
	                  "not root, this user, $MEMTALLY_SERVER_UID or the "
	                  "sole owner of its directory",
	                  q->path, c.uid);
}

/* Give `req` the next id and write it whole. */
static int send_request(memtally_query *q, Memtally__V1__Request *req,
                        int64_t deadline)
{
	req->id = q->next_id++;
	/* With every request: a TCP connection the server cannot tie to a
	 * local uid needs it on each one. But only to a server that may
	 * have it (token_vouch), asked once per connection. */
	if (q->token) {
		if (!q->token_vouched) {
			int err = token_vouch(q, deadline);
			if (err)
				return err;
			q->token_vouched = true;
		}
		req->token = q->token;
	}
	size_t len = mtframe_packed_size(&req->base);
	uint8_t *wbuf = malloc(len);
	if (!wbuf)
		return -ENOMEM;
	mtframe_pack(&req->base, wbuf, len);
	int err = send_all(q, wbuf, len, deadline);
	free(wbuf);
	return err;
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
/* And the PERMISSION_DENIED of a peer of unknown uid that asked without
 * the token (its message says a token is needed): the server closes that
 * connection too. */
static bool server_error_closes(Memtally__V1__ErrorCode code, const char *msg)
{
	return code == MEMTALLY__V1__ERROR_CODE__ERROR_FRAME_TOO_LARGE ||
	       code == MEMTALLY__V1__ERROR_CODE__ERROR_UNDECODABLE ||
	       (code == MEMTALLY__V1__ERROR_CODE__ERROR_PERMISSION_DENIED &&
	        msg && strncmp(msg, "a token is needed", 17) == 0);
}

/*
 * Send `req` with the next id and read one response into *out. A
 * transport fault closes the connection (see the invariants at the top);
 * *stale tells whether it was the kind a server restart leaves on an idle
 * connection: reset or EOF before any byte of the answer. *sent tells
 * whether the request was written whole, so that the server may have
 * acted on it.
 */
static int query_exchange(memtally_query *q, Memtally__V1__Request *req,
                          int64_t deadline, Memtally__V1__Response **out,
                          bool *stale, bool *sent)
{
	*out = NULL;
	*stale = false;
	int err = send_request(q, req, deadline);
	*sent = err == 0;
	size_t off = 0, blen = 0;
	if (!err)
		err = recv_frame(q, deadline, &off, &blen);
	if (err) {
		*stale = err == -ECONNRESET && q->rlen == 0;
		goto fail_disconnect;
	}
	*out = take_frame(q, off, blen);
	if (!*out) {
		err = MEMTALLY_EPROTO;
		goto fail_disconnect;
	}
	return 0;

fail_disconnect:
	query_disconnect(q);
	return err;
}

/* Say that a request that changes the server's state was written before
 * its connection failed: the server may have acted on it. */
static int sent_but_lost(memtally_query *q, int err)
{
	char why[sizeof(q->errmsg)];
	snprintf(why, sizeof(why), "%s",
	         q->errmsg[0] ? q->errmsg : memtally_strerror(err));
	return query_fail(q, err,
	                  "%s, after the request was sent: the server may "
	                  "have acted on it",
	                  why);
}

/*
 * Send `req` (its id is assigned here) and return the response in *out,
 * which the caller frees with memtally__v1__response__free_unpacked().
 * Fails unless the response answers this request, carries no error and
 * has the body `want`.
 *
 * A connection that sat idle may have been closed by a server restart, and
 * the kernel only says so when it is used. A `repeatable` request (a
 * query) that meets a stale connection is sent once more on a fresh one.
 * One that is not (Admit, Release, SetLimit) first has its idle
 * connection checked, and is sent again only if it could not be written
 * whole: see the top of this file.
 */
static int query_call(memtally_query *q, Memtally__V1__Request *req,
                      Memtally__V1__Response__BodyCase want, bool repeatable,
                      Memtally__V1__Response **out)
{
	*out = NULL;
	if (q->watching)
		return -EBUSY;
	int64_t deadline = query_deadline(q);
	Memtally__V1__Response *resp;
	int err;
	for (int attempt = 0;; attempt++) {
		q->errmsg[0] = '\0';
		if (!repeatable && q->fd >= 0 && conn_unusable(q))
			query_disconnect(q);
		bool reused = q->fd >= 0, stale, sent;
		if (!reused) {
			err = query_connect(q, deadline);
			if (err)
				return err;
		}
		err = query_exchange(q, req, deadline, &resp, &stale, &sent);
		if (!err)
			break;
		bool again = repeatable ? stale : !sent && err == -ECONNRESET;
		if (again && reused && attempt == 0)
			continue;
		if (!repeatable && sent)
			return sent_but_lost(q, err);
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
		bool closes =
		    server_error_closes(code, msg) || resp->id != req->id;
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

/* A rate from the wire: a number, or 0 (a NaN or infinity is no figure). */
static double rate_or_0(double v)
{
	return isfinite(v) ? v : 0;
}

/* A forecast from the wire: seconds > 0, else 0 (none). */
static double forecast_or_0(double v)
{
	return isfinite(v) && v > 0 ? v : 0;
}

_Static_assert(sizeof(struct memtally_usage) %
                       _Alignof(struct memtally_group_usage) ==
                   0,
               "the groups array follows the usage struct in one block");

static struct memtally_usage *
usage_from_pb(const Memtally__V1__Usage *u,
              Memtally__V1__GroupUsage *const *groups, size_t n)
{
	const char *measure = str_or_empty(u->measure);
	size_t size = sizeof(struct memtally_usage) +
	              n * sizeof(struct memtally_group_usage) +
	              strlen(measure) + 1;
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
	    .rss = u->rss_bytes,
	    .reservations = u->reservations,
	    .process_limit = u->process_limit,
	    .high_watermark = u->high_watermark_bytes,
	    .growth = rate_or_0(u->growth_bytes_per_s),
	    .seconds_to_limit = forecast_or_0(u->seconds_to_limit),
	    .growth_window_ms = u->growth_window_ms,
	    .forecast_horizon_ms = u->forecast_horizon_ms,
	    .mapped = u->mapped_bytes,
	    .allocator_free = u->allocator_free_bytes,
	    .unvouched = u->unvouched_bytes,
	    .n_groups = n,
	    .groups = n ? (struct memtally_group_usage *)(r + 1) : NULL,
	};
	char *pool = (char *)(r + 1) + n * sizeof(struct memtally_group_usage);
	r->measure = pool_put(&pool, measure);
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
		    .rss = g->rss_bytes,
		    .reservations = g->reservations,
		    .high_watermark = g->high_watermark_bytes,
		    .growth = rate_or_0(g->growth_bytes_per_s),
		    .seconds_to_limit = forecast_or_0(g->seconds_to_limit),
		    .mapped = g->mapped_bytes,
		    .allocator_free = g->allocator_free_bytes,
		    .unvouched = g->unvouched_bytes,
		};
	}
	return r;
}

/* Bytes the strings of `n` processes take in a string pool. */
static size_t processes_pool_size(Memtally__V1__ProcessInfo *const *infos,
                                  size_t n)
{
	size_t size = 0;
	for (size_t i = 0; i < n; i++)
		size += strlen(str_or_empty(infos[i]->group)) +
		        strlen(str_or_empty(infos[i]->task)) +
		        strlen(str_or_empty(infos[i]->comm)) + 3;
	return size;
}

/* Fill r[0..n) from `infos`, their strings going to the pool at *pool. */
static void processes_fill(struct memtally_process *r, char **pool,
                           Memtally__V1__ProcessInfo *const *infos, size_t n)
{
	for (size_t i = 0; i < n; i++) {
		const Memtally__V1__ProcessInfo *p = infos[i];
		r[i] = (struct memtally_process){
		    .pid = p->pid,
		    .group = pool_put(pool, str_or_empty(p->group)),
		    .bytes = p->bytes,
		    .peak = p->peak,
		    .limit = p->limit,
		    .over_limit = p->over_limit,
		    .corrupt = p->corrupt,
		    .uid = p->uid,
		    .slot = p->slot,
		    .threads = p->threads,
		    .flushes = p->flushes,
		    .task = pool_put(pool, str_or_empty(p->task)),
		    .start_time = p->start_time,
		    .comm = pool_put(pool, str_or_empty(p->comm)),
		    .error_bytes = p->error_bytes,
		    .registered_ns = p->registered_ns,
		    .rss = p->rss_bytes,
		    .state = (enum memtally_state)p->state,
		    .growth = rate_or_0(p->growth_bytes_per_s),
		    .seconds_to_limit = forecast_or_0(p->seconds_to_limit),
		    .mapped = p->mapped_bytes,
		    .allocator_free = p->allocator_free_bytes,
		    .unvouched = p->unvouched_bytes,
		    .trust =
		        (uint32_t)p->trust <= MEMTALLY_TRUST_EXEC_UNREGISTERED
		            ? (uint32_t)p->trust
		            : MEMTALLY_TRUST_UNKNOWN,
		    .trust_uid = p->trust_uid,
		    .descendant_bytes = p->descendant_bytes,
		};
	}
}

static struct memtally_process *
processes_from_pb(Memtally__V1__ProcessInfo *const *infos, size_t n)
{
	struct memtally_process *r =
	    calloc(1, n * sizeof(*r) + processes_pool_size(infos, n));
	if (!r)
		return NULL;
	char *pool = (char *)(r + n);
	processes_fill(r, &pool, infos, n);
	return r;
}

/* GetUsage with `gu` as its scope; the Usage body in *resp on success. */
static int get_usage(memtally_query *q, Memtally__V1__GetUsage *gu,
                     Memtally__V1__Response **resp)
{
	Memtally__V1__Request req = MEMTALLY__V1__REQUEST__INIT;
	req.body_case = MEMTALLY__V1__REQUEST__BODY_GET_USAGE;
	req.get_usage = gu;
	return query_call(q, &req, MEMTALLY__V1__RESPONSE__BODY_USAGE, true,
	                  resp);
}

int memtally_query_usage_msg(memtally_query *q, struct memtally_usage **out,
                             Memtally__V1__Response **msg)
{
	query_begin(q);
	if (!out)
		return -EINVAL;
	*out = NULL;
	if (msg)
		*msg = NULL;
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
	if (*out && msg)
		*msg = resp;
	else
		memtally__v1__response__free_unpacked(resp, NULL);
	return *out ? 0 : -ENOMEM;
}

int memtally_query_usage(memtally_query *q, struct memtally_usage **out)
{
	return memtally_query_usage_msg(q, out, NULL);
}

int memtally_query_group(memtally_query *q, const char *group,
                         struct memtally_usage **out)
{
	query_begin(q);
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
	query_begin(q);
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
	query_begin(q);
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
	                     true, &resp);
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

/* ---- admission ----------------------------------------------------- */

_Static_assert(sizeof(struct memtally_admit_result) %
                       _Alignof(struct memtally_process) ==
                   0,
               "the top array follows the admit result in one block");

static struct memtally_admit_result *
admit_from_pb(const Memtally__V1__AdmitResult *a)
{
	const char *rsv = str_or_empty(a->reservation);
	const char *reason = str_or_empty(a->reason);
	const char *scope = str_or_empty(a->limit_scope);
	const char *measure = str_or_empty(a->measure);
	const char *sized_by = str_or_empty(a->sized_by);
	const char *denied_by = str_or_empty(a->denied_by);
	size_t n = a->n_top;
	size_t size = sizeof(struct memtally_admit_result) +
	              n * sizeof(struct memtally_process) +
	              processes_pool_size(a->top, n) + strlen(rsv) +
	              strlen(reason) + strlen(scope) + strlen(measure) +
	              strlen(sized_by) + strlen(denied_by) + 6;
	struct memtally_admit_result *r = calloc(1, size);
	if (!r)
		return NULL;
	struct memtally_process *top = (struct memtally_process *)(r + 1);
	char *pool = (char *)(top + n);
	*r = (struct memtally_admit_result){
	    .admitted = a->admitted,
	    .reservation = pool_put(&pool, rsv),
	    .reason = pool_put(&pool, reason),
	    .fleet_bytes = a->fleet_bytes,
	    .reserved_bytes = a->reserved_bytes,
	    .requested_bytes = a->requested_bytes,
	    .limit = a->limit,
	    .limit_scope = pool_put(&pool, scope),
	    .measure = pool_put(&pool, measure),
	    .ttl_seconds = a->ttl_seconds,
	    .growth = rate_or_0(a->growth_bytes_per_s),
	    .seconds_to_limit = forecast_or_0(a->seconds_to_limit),
	    .n_top = n,
	    .top = n ? top : NULL,
	    .reserved_for_task = a->reserved_for_task,
	    .sized_by = pool_put(&pool, sized_by),
	    .declared_bytes = a->declared_bytes,
	    .denied_by = pool_put(&pool, denied_by),
	};
	processes_fill(top, &pool, a->top, n);
	return r;
}

int memtally_query_admit(memtally_query *q,
                         const struct memtally_admit_req *req,
                         struct memtally_admit_result **out)
{
	query_begin(q);
	if (!out)
		return -EINVAL;
	*out = NULL;
	bool kind = req && req->kind && req->kind[0];
	if (!q || !req || (req->bytes == 0 && !kind) ||
	    (req->flags &
	     ~(MEMTALLY_ADMIT_AGAIN | MEMTALLY_ADMIT_UNTIL_RELEASE)))
		return -EINVAL;
	for (size_t i = 0; i < sizeof(req->reserved) / sizeof(req->reserved[0]);
	     i++)
		if (req->reserved[i])
			return -EINVAL;
	Memtally__V1__Admit ad = MEMTALLY__V1__ADMIT__INIT;
	ad.bytes = req->bytes;
	/* protobuf-c only reads the strings. */
	if (req->group)
		ad.group = (char *)req->group;
	if (req->task)
		ad.task = (char *)req->task;
	ad.ttl_seconds = req->ttl_seconds;
	if (kind)
		ad.kind = (char *)req->kind;
	ad.again = (req->flags & MEMTALLY_ADMIT_AGAIN) != 0;
	ad.until_release = (req->flags & MEMTALLY_ADMIT_UNTIL_RELEASE) != 0;
	Memtally__V1__Request rq = MEMTALLY__V1__REQUEST__INIT;
	rq.body_case = MEMTALLY__V1__REQUEST__BODY_ADMIT;
	rq.admit = &ad;
	Memtally__V1__Response *resp;
	int err = query_call(q, &rq, MEMTALLY__V1__RESPONSE__BODY_ADMIT_RESULT,
	                     false, &resp);
	if (err)
		return err;
	const Memtally__V1__AdmitResult *a = resp->admit_result;
	if (a->admitted && !(a->reservation && a->reservation[0]))
		err = query_fail(q, MEMTALLY_EPROTO,
		                 "an admission without a reservation id");
	else if (!(*out = admit_from_pb(a)))
		err = -ENOMEM;
	memtally__v1__response__free_unpacked(resp, NULL);
	return err;
}

void memtally_admit_result_free(struct memtally_admit_result *r)
{
	free(r);
}

/* ---- kinds -------------------------------------------------------- */

/* A kind's profile, kept beside the public result. */
struct kind_profile {
	uint32_t length_ms; /* 0: none */
	uint64_t bytes[MEMTALLY_KIND_STEPS];
};

int memtally_query_kinds(memtally_query *q, const char *kind,
                         struct memtally_kinds **out)
{
	query_begin(q);
	if (!out)
		return -EINVAL;
	*out = NULL;
	if (!q)
		return -EINVAL;
	Memtally__V1__Kinds kq = MEMTALLY__V1__KINDS__INIT;
	if (kind)
		kq.kind = (char *)kind; /* protobuf-c only reads it */
	Memtally__V1__Request req = MEMTALLY__V1__REQUEST__INIT;
	req.body_case = MEMTALLY__V1__REQUEST__BODY_KINDS;
	req.kinds = &kq;
	Memtally__V1__Response *resp;
	int err = query_call(q, &req, MEMTALLY__V1__RESPONSE__BODY_KINDS_RESULT,
	                     true, &resp);
	if (err)
		return err;
	const Memtally__V1__KindsResult *r = resp->kinds_result;
	/* One block: the result, the kinds, their runs, their profiles
	 * (memtally_kind_profile), then the strings. */
	size_t nk = r->n_kinds, nr = 0, pool = 0;
	for (size_t i = 0; i < nk; i++) {
		nr += r->kinds[i]->n_last;
		pool += strlen(str_or_empty(r->kinds[i]->kind)) +
		        strlen(str_or_empty(r->kinds[i]->learned_by)) + 2;
	}
	struct memtally_kinds *k =
	    calloc(1, sizeof(*k) + nk * sizeof(struct memtally_kind) +
	                  nr * sizeof(struct memtally_kind_run) +
	                  nk * sizeof(struct kind_profile) + pool);
	if (!k) {
		memtally__v1__response__free_unpacked(resp, NULL);
		return -ENOMEM;
	}
	struct memtally_kind *ks = (struct memtally_kind *)(k + 1);
	struct memtally_kind_run *runs = (struct memtally_kind_run *)(ks + nk);
	struct kind_profile *profs = (struct kind_profile *)(runs + nr);
	char *cursor = (char *)(profs + nk);
	k->quantile = rate_or_0(r->quantile);
	k->margin = rate_or_0(r->margin);
	k->window = r->window;
	k->horizon_s = r->horizon_s;
	k->default_size = r->default_size;
	k->n_kinds = nk;
	k->kinds = nk ? ks : NULL;
	for (size_t i = 0; i < nk; i++) {
		const Memtally__V1__KindInfo *ki = r->kinds[i];
		ks[i] = (struct memtally_kind){
		    .kind = pool_put(&cursor, str_or_empty(ki->kind)),
		    .uid = ki->uid,
		    .runs = ki->runs,
		    .runs_total = ki->runs_total,
		    .evictions = ki->evictions,
		    .learned = ki->learned_bytes,
		    .learned_by =
		        pool_put(&cursor, str_or_empty(ki->learned_by)),
		    .outstanding = ki->outstanding,
		    .n_last = ki->n_last,
		    .last = ki->n_last ? runs : NULL,
		};
		if (ki->length_ms &&
		    ki->n_profile_bytes == MEMTALLY_KIND_STEPS) {
			profs[i].length_ms = ki->length_ms;
			memcpy(profs[i].bytes, ki->profile_bytes,
			       sizeof(profs[i].bytes));
		}
		for (size_t j = 0; j < ki->n_last; j++)
			*runs++ = (struct memtally_kind_run){
			    .peak = ki->last[j]->peak_bytes,
			    .end_time_ns = ki->last[j]->end_time_ns,
			    .evicted = ki->last[j]->evicted,
			};
	}
	memtally__v1__response__free_unpacked(resp, NULL);
	*out = k;
	return 0;
}

void memtally_kinds_free(struct memtally_kinds *k)
{
	free(k);
}

int memtally_kind_profile(const struct memtally_kinds *k, size_t i,
                          uint32_t *length_ms,
                          uint64_t bytes[MEMTALLY_KIND_STEPS])
{
	if (!k || i >= k->n_kinds)
		return -EINVAL;
	/* The profiles follow the runs in the block memtally_query_kinds
	 * allocated (a struct memtally_kind has no room for them: its size
	 * is the ABI's). */
	size_t nr = 0;
	for (size_t j = 0; j < k->n_kinds; j++)
		nr += k->kinds[j].n_last;
	const struct memtally_kind_run *runs =
	    (const struct memtally_kind_run *)(k->kinds + k->n_kinds);
	const struct kind_profile *p =
	    (const struct kind_profile *)(runs + nr) + i;
	if (!p->length_ms)
		return MEMTALLY_ENOTFOUND;
	if (length_ms)
		*length_ms = p->length_ms;
	if (bytes)
		memcpy(bytes, p->bytes, sizeof(p->bytes));
	return 0;
}

int memtally_query_release(memtally_query *q, const char *reservation,
                           uint64_t *bytes_out)
{
	query_begin(q);
	if (bytes_out)
		*bytes_out = 0;
	if (!q || !reservation || !reservation[0])
		return -EINVAL;
	Memtally__V1__Release rel = MEMTALLY__V1__RELEASE__INIT;
	/* protobuf-c only reads the strings. */
	rel.reservation = (char *)reservation;
	if (q->token)
		rel.token = q->token;
	Memtally__V1__Request rq = MEMTALLY__V1__REQUEST__INIT;
	rq.body_case = MEMTALLY__V1__REQUEST__BODY_RELEASE;
	rq.release = &rel;
	Memtally__V1__Response *resp;
	int err = query_call(q, &rq, MEMTALLY__V1__RESPONSE__BODY_RELEASED,
	                     false, &resp);
	if (err)
		return err;
	if (bytes_out)
		*bytes_out = resp->released->bytes;
	memtally__v1__response__free_unpacked(resp, NULL);
	return 0;
}

int memtally_query_reservation(memtally_query *q, const char *reservation,
                               struct memtally_reservation *out)
{
	query_begin(q);
	if (out)
		memset(out, 0, sizeof(*out));
	if (!q || !out || !reservation || !reservation[0])
		return -EINVAL;
	Memtally__V1__Reservation rv = MEMTALLY__V1__RESERVATION__INIT;
	rv.reservation = (char *)reservation; /* only read */
	Memtally__V1__Request rq = MEMTALLY__V1__REQUEST__INIT;
	rq.body_case = MEMTALLY__V1__REQUEST__BODY_RESERVATION;
	rq.reservation = &rv;
	if (q->token)
		rq.token = q->token;
	Memtally__V1__Response *resp;
	int err = query_call(
	    q, &rq, MEMTALLY__V1__RESPONSE__BODY_RESERVATION_INFO, true, &resp);
	if (err)
		return err;
	const Memtally__V1__ReservationInfo *ri = resp->reservation_info;
	out->bytes = ri->bytes;
	out->taken_over = ri->taken_over;
	snprintf(out->task, sizeof(out->task), "%s", ri->task ? ri->task : "");
	snprintf(out->group, sizeof(out->group), "%s",
	         ri->group ? ri->group : "");
	memtally__v1__response__free_unpacked(resp, NULL);
	return 0;
}

/* ---- limits -------------------------------------------------------- */

int memtally_query_set_limit(memtally_query *q, enum memtally_scope scope,
                             const char *group, uint32_t pid, uint64_t bytes,
                             uint64_t *previous_out)
{
	return memtally_query_set_limit2(q, scope, group, pid, bytes,
	                                 previous_out, NULL);
}

int memtally_query_set_limit2(memtally_query *q, enum memtally_scope scope,
                              const char *group, uint32_t pid, uint64_t bytes,
                              uint64_t *previous_out, uint64_t *now_out)
{
	query_begin(q);
	if (previous_out)
		*previous_out = 0;
	if (!q)
		return -EINVAL;
	Memtally__V1__SetLimit sl = MEMTALLY__V1__SET_LIMIT__INIT;
	switch (scope) {
	case MEMTALLY_SCOPE_FLEET:
		sl.scope_case = MEMTALLY__V1__SET_LIMIT__SCOPE_FLEET;
		sl.fleet = 1;
		break;
	case MEMTALLY_SCOPE_GROUP:
		if (!group || !group[0])
			return -EINVAL;
		sl.scope_case = MEMTALLY__V1__SET_LIMIT__SCOPE_GROUP;
		sl.group = (char *)group; /* protobuf-c only reads it */
		break;
	case MEMTALLY_SCOPE_PID:
		if (pid == 0)
			return -EINVAL;
		sl.scope_case = MEMTALLY__V1__SET_LIMIT__SCOPE_PID;
		sl.pid = pid;
		break;
	default:
		return -EINVAL;
	}
	sl.bytes = bytes;
	if (q->token)
		sl.token = q->token;
	Memtally__V1__Request rq = MEMTALLY__V1__REQUEST__INIT;
	rq.body_case = MEMTALLY__V1__REQUEST__BODY_SET_LIMIT;
	rq.set_limit = &sl;
	Memtally__V1__Response *resp;
	int err = query_call(q, &rq, MEMTALLY__V1__RESPONSE__BODY_LIMIT_SET,
	                     false, &resp);
	if (err)
		return err;
	if (previous_out)
		*previous_out = resp->limit_set->previous;
	if (now_out)
		*now_out = resp->limit_set->bytes;
	memtally__v1__response__free_unpacked(resp, NULL);
	return 0;
}

/* ---- watching ------------------------------------------------------ */

int memtally_query_fd(const memtally_query *q)
{
	return q ? q->fd : -1;
}

static void drop_event(memtally_query *q)
{
	if (q->event)
		memtally__v1__response__free_unpacked(q->event, NULL);
	q->event = NULL;
}

int memtally_query_watch_own(memtally_query *q, int own)
{
	if (!q)
		return -EINVAL;
	q->watch_own = own != 0;
	return 0;
}

int memtally_query_watch_start(memtally_query *q)
{
	query_begin(q);
	if (!q)
		return -EINVAL;
	if (q->watching)
		return -EBUSY;
	drop_event(q);
	Memtally__V1__Watch w = MEMTALLY__V1__WATCH__INIT;
	w.own = q->watch_own;
	Memtally__V1__Request rq = MEMTALLY__V1__REQUEST__INIT;
	rq.body_case = MEMTALLY__V1__REQUEST__BODY_WATCH;
	rq.watch = &w;
	int64_t deadline = query_deadline(q);
	/* A Watch is safe to repeat, and the answer is read later: check
	 * the idle connection first, and send again once if it could not be
	 * written (the server closed it meanwhile). */
	for (int attempt = 0;; attempt++) {
		q->errmsg[0] = '\0';
		if (q->fd >= 0 && conn_unusable(q))
			query_disconnect(q);
		bool reused = q->fd >= 0;
		int err = reused ? 0 : query_connect(q, deadline);
		if (err)
			return err;
		err = send_request(q, &rq, deadline);
		if (!err)
			break;
		query_disconnect(q);
		if (!(err == -ECONNRESET && reused && attempt == 0))
			return err;
	}
	q->watching = true;
	q->watch_id = rq.id;
	return 0;
}

void memtally_query_watch_stop(memtally_query *q)
{
	if (!q || !q->watching)
		return;
	drop_event(q);
	query_disconnect(q);
}

/* The watch failed with `err`: end it. */
static int watch_fail(memtally_query *q, int err)
{
	query_disconnect(q);
	return err;
}

/*
 * Turn one response of the watch stream into an event. 0 with *ev filled,
 * 1 for a response that carries no event (an acknowledgement: skip it),
 * or an error that ends the watch. Takes ownership of `r`.
 */
static int watch_take(memtally_query *q, Memtally__V1__Response *r,
                      struct memtally_event *ev)
{
	int err;
	if (r->error) {
		/* The server's error answer to the Watch, or a bad frame of
		 * ours (id 0): the stream is over either way. */
		const char *msg = r->error->message;
		if (msg && msg[0])
			query_fail(q, 0, "%s", msg);
		else
			query_fail(q, 0, "server error code %d",
			           (int)r->error->code);
		err = map_server_error(r->error->code);
		goto fail_free;
	}
	if (r->id != q->watch_id) {
		err = query_fail(q, MEMTALLY_EPROTO,
		                 "response id %llu on a watch of id %llu",
		                 (unsigned long long)r->id,
		                 (unsigned long long)q->watch_id);
		goto fail_free;
	}
	if (r->body_case == MEMTALLY__V1__RESPONSE__BODY__NOT_SET) {
		memtally__v1__response__free_unpacked(r, NULL);
		return 1;
	}
	if (r->body_case != MEMTALLY__V1__RESPONSE__BODY_EVENT) {
		err = query_fail(q, MEMTALLY_EPROTO,
		                 "response body %d on a watch",
		                 (int)r->body_case);
		goto fail_free;
	}
	const Memtally__V1__Event *e = r->event;
	*ev = (struct memtally_event){
	    .scope = str_or_empty(e->scope),
	    .state = (enum memtally_state)e->state,
	    .previous = (enum memtally_state)e->previous,
	    .bytes = e->bytes,
	    .limit = e->limit,
	    .reserved = e->reserved_bytes,
	    .time_ns = e->time_ns,
	    .rss = e->rss_bytes,
	    .measure = str_or_empty(e->measure),
	    .reason = str_or_empty(e->reason),
	    .growth = rate_or_0(e->growth_bytes_per_s),
	    .seconds_to_limit = forecast_or_0(e->seconds_to_limit),
	};
	q->event = r; /* ev's strings live in it until the next call */
	return 0;

fail_free:
	memtally__v1__response__free_unpacked(r, NULL);
	return watch_fail(q, err);
}

int memtally_query_watch_next(memtally_query *q, struct memtally_event *ev_out)
{
	query_begin(q);
	if (!q || !ev_out)
		return -EINVAL;
	drop_event(q);
	if (!q->watching)
		return -EINVAL;
	q->errmsg[0] = '\0';
	for (;;) {
		size_t off = 0, blen = 0;
		int r = frame_buffered(q, &off, &blen);
		if (r < 0)
			return watch_fail(q, r);
		if (r == 0) {
			r = recv_some(q, off);
			if (r == -EAGAIN)
				return r;
			if (r)
				return watch_fail(q, r);
			continue;
		}
		Memtally__V1__Response *resp = take_frame(q, off, blen);
		if (!resp)
			return watch_fail(q, MEMTALLY_EPROTO);
		r = watch_take(q, resp, ev_out);
		if (r <= 0)
			return r;
	}
}

int memtally_query_watch(memtally_query *q, memtally_event_cb cb, void *arg)
{
	if (!q || !cb)
		return -EINVAL;
	int err = memtally_query_watch_start(q);
	if (err)
		return err;
	for (;;) {
		struct memtally_event ev;
		err = memtally_query_watch_next(q, &ev);
		if (err == 0) {
			if (cb(&ev, arg)) {
				memtally_query_watch_stop(q);
				return 0;
			}
			continue;
		}
		if (err != -EAGAIN)
			return err;
		/* The timeout bounds each wait for the next event. */
		err = wait_fd(q->fd, POLLIN, query_deadline(q));
		if (err) {
			memtally_query_watch_stop(q);
			if (err == -ETIMEDOUT)
				return query_fail(q, err,
				                  "no event within %d ms",
				                  q->timeout_ms);
			return err;
		}
	}
}
