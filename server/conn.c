/*
 * conn.c - the listeners (the Unix socket, and TCP when configured) and
 * their connections.
 *
 * Each connection has an input buffer and a count of response bytes handed
 * to libuv but not yet written. A frame is answered as soon as it is
 * complete (mts_input()). The responses of one turn are written together
 * by conn_write: uv_try_write first, then one uv_write for the rest. libuv
 * keeps writes in order, so responses leave in request order.
 *
 * Nothing a peer does may stall the others, so each connection is bounded
 * three ways:
 *  - input: we read READ_CHUNK bytes at a time and answer before reading
 *    more. The buffer holds at most one partial frame plus one read.
 *  - output: when unwritten output reaches MTS_OUT_HIGH we stop reading
 *    and answering ("paused") until it drains below MTS_OUT_LOW.
 *  - time: a turn answers at most MTS_FRAMES_PER_TURN frames. A connection
 *    with more complete frames stops reading and joins the backlog. An
 *    idle handle serves the backlog one turn per connection per loop
 *    iteration, so every other connection's events run in between. And a
 *    peer uid has at most MTS_FRAMES_PER_UID_ITER frames answered per
 *    iteration over all its connections, taking at most
 *    MTS_NS_PER_UID_ITER of the loop (a frame at least; both kept beside
 *    its connection count, net->conn_uids): a connection of a uid that
 *    spent them waits in the backlog for the next iteration, so one uid's
 *    many connections take one uid's share of the loop, not one each.
 * A connection reads only while it is in none of these states and not
 * closing. `reading` mirrors uv_read_start/stop.
 *
 * N peers could still hold N times these bounds, so the server as a whole
 * has a budget too (struct mts_conns in mts_conn.h):
 *  - connections: past max_connections a new connection is accepted,
 *    closed at once, logged and counted
 *    (memtally_connections_rejected_total). The log says the count, at
 *    most once a second. The last admin_reserve places are for admins, so
 *    root can always get in to look. We accept and close rather than
 *    leave the connection in the listen backlog for two reasons. The peer
 *    sees EOF at once and a worker's client retries with back-off (fail
 *    open), where a connection left in the backlog would hang until its
 *    timeout with nothing in our logs. And libuv stops watching a listener
 *    whose pending connection is not accepted, so the next connection
 *    would wait too.
 *  - bytes: `held` is what a connection holds, its input buffer's
 *    capacity plus its unwritten output. net->buffered is their sum.
 *    Reads go into one shared buffer, and only what is left unanswered is
 *    copied into the connection's own. A peer that sends whole requests
 *    and reads its answers holds next to nothing. When the sum passes
 *    max_buffered, every connection holding more than its fair share
 *    stops reading and answering ("throttled"), which freezes what it
 *    holds. A connection under its share goes on, so a well-behaved
 *    client is answered throughout. Throttling ends for all once the sum
 *    is back under MTS_BUDGET_LOW_PCT of the cap; a peer that reads drains
 *    its output. If the sum is still over the cap MTS_BUDGET_GRACE_MS
 *    later, the largest holders are disconnected, largest first, until it
 *    is not. Peers that do not read their answers thus cannot make the
 *    server hold much more than the cap. Pressure is logged once per
 *    episode, each eviction once, and both are counted in /metrics.
 *  - per uid: past max_connections_per_uid connections of one peer uid, a
 *    new one of that uid is accepted and closed at once, as above. One
 *    user thus cannot take max_connections for itself. The uid comes from
 *    SO_PEERCRED at accept, or from sock_diag for a TCP peer on this host.
 *    Watch subscribers count too. TCP peers of unknown uid share one
 *    bucket, MTS_UID_TCP, capped by max_connections_unidentified. Admins
 *    are exempt.
 *  - idle: a connection with no complete request for idle_ms is closed
 *    (on_idle_timer). A Watch subscriber is exempt because it waits by
 *    design. Subscribers are bounded per uid by max_watch_per_uid instead:
 *    dispatch.c counts them in reg->watch_uids and conn_close uncounts
 *    them.
 *
 * Lifetime: a connection is closed on a read or write error, after a bad
 * frame once its error answer is written, and on EOF once every buffered
 * request is answered and written. Memory is freed in the close callback.
 * libuv runs pending write callbacks (UV_ECANCELED) before it.
 *
 * Both transports share all of this: a connection's handle is a uv_pipe_t
 * or a uv_tcp_t used as a uv_stream_t. A TCP peer has no SO_PEERCRED and
 * no pid, so it cannot Register. Its uid comes from sock_diag when it is
 * on this host (conn_tcp_setup), else it needs the token (dispatch.c).
 *
 * Watch: a connection that sent a Watch gets every event pushed as a
 * Response with the Watch's id. Pushed events use the same write path and
 * count towards the same output bound. A subscriber whose unwritten output
 * reaches MTS_OUT_HIGH is not reading, so it is disconnected, logged and
 * counted (conn_stats.watch_disconnects). Queueing events for it without
 * bound would exhaust memory, and dropping them silently would leave a gap
 * it could not see. A client that reconnects and watches again gets the
 * current state first. An event raised while a connection's own request
 * is being answered goes into that turn's output, so it stays in order
 * with the answers around it.
 */
#include "mts_conn.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <libgen.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include "mts_auth.h"
#include "mts_config.h"
#include "mts_dispatch.h"
#include "mts_log.h"
#include "mts_policy.h"
#include "mts_registry.h"
#include "mt_sockdiag.h"

#define READ_CHUNK (64u * 1024u)

struct mts_conn {
	union {
		uv_stream_t stream; /* stream.data = this */
		uv_pipe_t pipe;
		uv_tcp_t tcp;
	} h;
	struct mts_conns *net;
	struct mts_conn *prev, *next; /* net->conns */
	struct mts_conn *bnext;       /* net->backlog_head */
	struct mts_peer peer;
	uint8_t *in;
	size_t in_off; /* in[in_off, in_len) is not answered yet */
	size_t in_len;
	size_t in_cap;
	size_t out_pending; /* bytes in uv_write requests not completed */
	size_t held;        /* in_cap + out_pending, as in net->buffered */
	bool reading;
	bool paused;     /* output over MTS_OUT_HIGH */
	bool throttled;  /* over its share while the server is over budget */
	bool backlogged; /* turn spent, more frames waiting */
	bool eof;        /* the peer will send nothing more */
	bool close_after_write;
	bool closing;
	bool uid_counted;   /* counted in net->conn_uids under uid_key */
	uint32_t uid_key;   /* peer uid, or MTS_UID_TCP */
	bool remote;        /* a TCP peer on another host: addr_key is set */
	bool addr_counted;  /* counted in net->conn_addrs under addr_key */
	uint32_t addr_key;  /* a hash of its address (an IPv6 one's /64) */
	uint64_t last_ms;   /* uv_now() of accept or of the latest request */
	uint64_t accept_ms; /* uv_now() of accept */
	struct mts_buf *turn_out; /* the output of the turn in progress */
};

struct write_req {
	uv_write_t req; /* req.data = this */
	struct mts_conn *conn;
	uint8_t *data;
	size_t len;
};

static void conn_process(struct mts_conn *c);
static void on_alloc(uv_handle_t *h, size_t suggested, uv_buf_t *buf);
static void on_read(uv_stream_t *s, ssize_t nread, const uv_buf_t *buf);
static void on_idle(uv_idle_t *h);
static void backlog_add(struct mts_conn *c);
static void conn_close(struct mts_conn *c);
static void on_budget_timer(uv_timer_t *t);

static void on_conn_closed(uv_handle_t *h)
{
	struct mts_conn *c = h->data;
	free(c->in);
	free(c);
}

static bool list_remove(struct mts_conn **head, struct mts_conn **tail,
                        struct mts_conn *c)
{
	struct mts_conn *prev = NULL;
	for (struct mts_conn *x = *head; x; x = x->bnext) {
		if (x == c) {
			if (prev)
				prev->bnext = c->bnext;
			else
				*head = c->bnext;
			if (*tail == c)
				*tail = prev;
			return true;
		}
		prev = x;
	}
	return false;
}

static void backlog_remove(struct mts_conns *net, struct mts_conn *c)
{
	/* In the backlog, or set aside by on_idle while it runs. */
	if (!list_remove(&net->backlog_head, &net->backlog_tail, c))
		(void)list_remove(&net->skip_head, &net->skip_tail, c);
	c->bnext = NULL;
	c->backlogged = false;
}

static void stop_reading(struct mts_conn *c)
{
	if (c->reading) {
		uv_read_stop(&c->h.stream);
		c->reading = false;
	}
}

/* A connection may hold this much while the server is over budget. */
static size_t fair_share(const struct mts_conns *net)
{
	uint64_t n = net->nconns ? net->nconns : 1;
	uint64_t share = net->max_buffered / (2 * n);
	return share < MTS_CONN_FLOOR ? MTS_CONN_FLOOR : (size_t)share;
}

static void throttle(struct mts_conn *c)
{
	if (c->throttled || c->closing)
		return;
	c->throttled = true;
	stop_reading(c);
	c->net->conn_stats.throttled++;
	mts_log_uid(mts_peer_log_uid(&c->peer), MTS_LOG_DEBUG,
	            "over the server's buffer budget, throttled",
	            "peer_pid=%u tcp=%d held=%zu", c->peer.pid, c->peer.tcp,
	            c->held);
}

/* Back under the low mark: everyone may read again. Each throttled
 * connection gets a turn from the idle handle (not from here: this runs
 * inside other connections' callbacks). */
static void budget_relieved(struct mts_conns *net)
{
	net->pressure = false;
	net->over_since_ms = 0;
	uint32_t n = 0;
	for (struct mts_conn *c = net->conns; c; c = c->next) {
		if (!c->throttled)
			continue;
		c->throttled = false;
		n++;
		if (!c->closing && !c->backlogged)
			backlog_add(c);
	}
	if (net->budget_timer_open)
		uv_timer_stop(&net->budget_timer);
	mts_log_scope("max_buffered", MTS_LOG_INFO,
	              "buffered bytes back under budget",
	              "buffered=%llu max_buffered=%llu resumed=%u",
	              (unsigned long long)net->buffered,
	              (unsigned long long)net->max_buffered, n);
}

static void budget_grew(struct mts_conns *net, struct mts_conn *c)
{
	if (net->pressure) {
		if (!net->over_since_ms)
			net->over_since_ms = uv_now(net->loop);
		if (c->held > fair_share(net))
			throttle(c);
		return;
	}
	if (net->buffered <= net->max_buffered)
		return;
	net->pressure = true;
	net->over_since_ms = uv_now(net->loop);
	net->conn_stats.pressure++;
	size_t share = fair_share(net);
	uint32_t n = 0;
	for (struct mts_conn *x = net->conns; x; x = x->next) {
		if (x->held > share && !x->throttled && !x->closing) {
			throttle(x);
			n++;
		}
	}
	mts_log_scope(
	    "max_buffered", MTS_LOG_WARN,
	    "connections hold more than max_buffered; throttling the "
	    "largest (reading stopped until their output drains)",
	    "buffered=%llu max_buffered=%llu connections=%u share=%zu "
	    "throttled=%u",
	    (unsigned long long)net->buffered,
	    (unsigned long long)net->max_buffered, net->nconns, share, n);
	if (net->budget_timer_open)
		uv_timer_start(&net->budget_timer, on_budget_timer,
		               MTS_BUDGET_CHECK_MS, MTS_BUDGET_CHECK_MS);
}

/* While under pressure, throttled peers that do not drain their output
 * keep the total high. Once pressure has lasted the grace period,
 * disconnect the largest holders until the total is under the low mark,
 * where throttling ends. Stopping at the cap instead could leave the total
 * between the two for good. A throttled peer holding a partial frame is
 * not read, so it never shrinks, and nothing would ever resume it. A peer
 * that reads its answers is not the largest for long. */
static void on_budget_timer(uv_timer_t *t)
{
	struct mts_conns *net = t->data;
	if (!net->pressure) {
		uv_timer_stop(t);
		return;
	}
	uint64_t now = uv_now(net->loop);
	uint64_t low = net->max_buffered / 100 * MTS_BUDGET_LOW_PCT;
	if (net->buffered <= low) {
		budget_relieved(net);
		return;
	}
	if (!net->over_since_ms)
		net->over_since_ms = now;
	if (now - net->over_since_ms < MTS_BUDGET_GRACE_MS)
		return;
	while (net->pressure && net->buffered > low) {
		struct mts_conn *big = NULL;
		for (struct mts_conn *c = net->conns; c; c = c->next)
			if (!c->closing && (!big || c->held > big->held))
				big = c;
		if (!big || big->held == 0)
			break;
		net->conn_stats.evicted++;
		mts_log_uid(mts_peer_log_uid(&big->peer), MTS_LOG_WARN,
		            "connection holds the most while over max_buffered "
		            "and did not drain; disconnected",
		            "peer_pid=%u tcp=%d held=%zu buffered=%llu "
		            "max_buffered=%llu",
		            big->peer.pid, big->peer.tcp, big->held,
		            (unsigned long long)net->buffered,
		            (unsigned long long)net->max_buffered);
		conn_close(big); /* relieves the budget once under `low` */
	}
	if (net->pressure)
		net->over_since_ms = now;
}

/* Bring c->held and net->buffered up to date after its input buffer or
 * its unwritten output changed. A closing connection holds nothing: its
 * memory is freed by the close and write callbacks that follow. */
static void conn_account(struct mts_conn *c)
{
	struct mts_conns *net = c->net;
	size_t now = c->closing ? 0 : c->in_cap + c->out_pending;
	size_t was = c->held;
	c->held = now;
	net->buffered = net->buffered - was + now;
	net->conn_stats.buffered = net->buffered;
	if (now > was)
		budget_grew(net, c);
	else if (net->pressure &&
	         net->buffered <= net->max_buffered / 100 * MTS_BUDGET_LOW_PCT)
		budget_relieved(net);
}

static void conn_close(struct mts_conn *c)
{
	if (c->closing)
		return;
	c->closing = true;
	/* We may be inside this connection's own turn (a request's event
	 * that cannot be written to it): the rest of its frames must not be
	 * served, and its fd number is about to be reused. */
	c->peer.gone = true;
	c->peer.fd = -1;
	struct mts_conns *net = c->net;
	conn_account(c);
	if (c->backlogged)
		backlog_remove(net, c);
	if (c->prev)
		c->prev->next = c->next;
	else
		net->conns = c->next;
	if (c->next)
		c->next->prev = c->prev;
	net->nconns--;
	net->conn_stats.open = net->nconns;
	if (c->uid_counted) {
		mts_uid_count_sub(&net->conn_uids, c->uid_key);
		c->uid_counted = false;
	}
	if (c->addr_counted) {
		mts_uid_count_sub(&net->conn_addrs, c->addr_key);
		c->addr_counted = false;
	}
	if (c->peer.watch_counted) {
		mts_uid_count_sub(&net->reg->watch_uids, c->uid_key);
		c->peer.watch_counted = false;
	}
	mts_log_uid(mts_peer_log_uid(&c->peer), MTS_LOG_DEBUG,
	            "connection closed", "peer_pid=%u tcp=%d", c->peer.pid,
	            c->peer.tcp);
	uv_close((uv_handle_t *)&c->h.stream, on_conn_closed);
}

static void resume_reading(struct mts_conn *c)
{
	if (c->reading || c->closing || c->paused || c->backlogged || c->eof ||
	    c->close_after_write || c->throttled)
		return;
	int err = uv_read_start(&c->h.stream, on_alloc, on_read);
	if (err < 0) {
		conn_close(c);
		return;
	}
	c->reading = true;
}

/* Close once nothing is left to do: the peer is done (EOF) or we decided
 * to close, and every answer is written. */
static void conn_maybe_finish(struct mts_conn *c)
{
	if (c->closing || c->out_pending > 0)
		return;
	if (c->close_after_write ||
	    (c->eof && !c->paused && !c->backlogged && !c->throttled))
		conn_close(c);
}

static void backlog_add(struct mts_conn *c)
{
	struct mts_conns *net = c->net;
	/* Once only: queued twice, the tail would point at itself (on_idle
	 * would count for ever) or cut off every connection behind it. */
	if (c->backlogged)
		return;
	c->backlogged = true;
	c->bnext = NULL;
	if (net->backlog_tail)
		net->backlog_tail->bnext = c;
	else
		net->backlog_head = c;
	net->backlog_tail = c;
	if (!uv_is_active((uv_handle_t *)&net->idle))
		uv_idle_start(&net->idle, on_idle);
}

static void on_write(uv_write_t *req, int status)
{
	struct write_req *w = req->data;
	struct mts_conn *c = w->conn;
	c->out_pending -= w->len;
	free(w->data);
	free(w);
	if (c->closing)
		return;
	conn_account(c);
	if (status < 0) {
		mts_log_uid(mts_peer_log_uid(&c->peer), MTS_LOG_DEBUG,
		            "write failed, closing", "peer_pid=%u err=%s",
		            c->peer.pid, uv_err_name(status));
		conn_close(c);
		return;
	}
	if (c->paused && c->out_pending <= MTS_OUT_LOW) {
		/* Answer what was buffered while paused; conn_process reads
		 * again once nothing answerable is left. One queued for a turn
		 * (budget_relieved queues the throttled, paused or not) waits
		 * for that turn: one turn per loop iteration. */
		c->paused = false;
		if (!c->backlogged)
			conn_process(c);
	}
	conn_maybe_finish(c);
}

/* sendmsg() out's bytes with the peer's pending descriptors
 * (SCM_RIGHTS) on the first one. Returns the bytes written (0: the socket
 * took none; the descriptors are then not sent) or -errno. */
static int send_with_fds(struct mts_conn *c, const struct mts_buf *out)
{
	uv_os_fd_t fd;
	if (uv_fileno((uv_handle_t *)&c->h.stream, &fd) < 0 || out->len == 0)
		return 0;
	union {
		struct cmsghdr h;
		char buf[CMSG_SPACE(sizeof(c->peer.send_fds))];
	} cm;
	memset(&cm, 0, sizeof(cm));
	size_t nfds = c->peer.nsend_fds;
	struct iovec iov = {.iov_base = out->data, .iov_len = out->len};
	struct msghdr mh = {.msg_iov = &iov,
	                    .msg_iovlen = 1,
	                    .msg_control = cm.buf,
	                    .msg_controllen = CMSG_SPACE(nfds * sizeof(int))};
	struct cmsghdr *ch = CMSG_FIRSTHDR(&mh);
	ch->cmsg_level = SOL_SOCKET;
	ch->cmsg_type = SCM_RIGHTS;
	ch->cmsg_len = CMSG_LEN(nfds * sizeof(int));
	memcpy(CMSG_DATA(ch), c->peer.send_fds, nfds * sizeof(int));
	ssize_t n;
	do
		n = sendmsg(fd, &mh, MSG_DONTWAIT | MSG_NOSIGNAL);
	while (n < 0 && errno == EINTR);
	if (n < 0)
		return errno == EAGAIN ? 0 : -errno;
	return (int)n;
}

/* Hand `out`'s bytes to the peer; ownership of out->data moves here.
 *
 * Write at once what the socket takes (uv_try_write) and queue only the
 * rest with uv_write. A uv_write that libuv completes at once still costs
 * an epoll_ctl(EPOLL_CTL_MOD) on the next loop iteration, and nearly
 * every answer fits in the socket buffer. Writing at once is done only
 * when nothing of ours is queued, because bytes written now must not
 * overtake queued ones. libuv refuses too, with UV_EAGAIN, while its write
 * queue holds bytes. Bytes written at once are never pending, so
 * out_pending, `held` and the server's budget see only what is really
 * queued. */
static int conn_write(struct mts_conn *c, struct mts_buf *out)
{
	size_t done = 0;
	if (c->peer.nsend_fds) {
		/* A Registered answer: its descriptors ride on its first
		 * byte. Only when nothing of ours is queued ahead of it (a
		 * worker registers on a connection of its own); otherwise
		 * the answer goes without them and the worker, finding none,
		 * runs uncounted and retries later. */
		int n = 0;
		if (c->out_pending == 0)
			n = send_with_fds(c, out);
		c->peer.nsend_fds = 0;
		if (n < 0) {
			mts_log_uid(mts_peer_log_uid(&c->peer), MTS_LOG_DEBUG,
			            "write failed, closing",
			            "peer_pid=%u err=%s", c->peer.pid,
			            strerror(-n));
			return n;
		}
		done = (size_t)n;
		if (done == out->len) {
			mts_buf_free(out);
			return 0;
		}
	}
	if (c->out_pending == 0 && done == 0) {
		uv_buf_t b = uv_buf_init((char *)out->data, (unsigned)out->len);
		int n = uv_try_write(&c->h.stream, &b, 1);
		if (n >= 0) {
			done = (size_t)n;
		} else if (n != UV_EAGAIN) {
			mts_log_uid(mts_peer_log_uid(&c->peer), MTS_LOG_DEBUG,
			            "write failed, closing",
			            "peer_pid=%u err=%s", c->peer.pid,
			            uv_err_name(n));
			return n;
		}
		if (done == out->len) {
			mts_buf_free(out);
			return 0;
		}
	}
	struct write_req *w = malloc(sizeof(*w));
	if (!w)
		return -ENOMEM;
	w->conn = c;
	size_t rest = out->len - done;
	if (done > 0) {
		/* Keep only what is left, so that what back-pressure counts
		 * is the memory held (as below). */
		uint8_t *p = malloc(rest);
		if (!p) {
			free(w);
			return -ENOMEM;
		}
		memcpy(p, out->data + done, rest);
		mts_buf_free(out);
		out->data = p;
		out->len = out->cap = rest;
	} else if (out->cap - out->len > out->len / 4 + 64) {
		/* A turn's output sits in a buffer grown by doubling from 4
		 * KiB, so a turn of small answers leaves most of it unused.
		 * Give the slack back, so that MTS_OUT_HIGH of pending output,
		 * which back-pressure counts, is close to the memory it really
		 * holds, not a multiple of it. */
		uint8_t *shrunk = realloc(out->data, out->len ? out->len : 1);
		if (shrunk) {
			out->data = shrunk;
			out->cap = out->len;
		}
	}
	w->data = out->data;
	w->len = rest;
	w->req.data = w;
	uv_buf_t b = uv_buf_init((char *)w->data, (unsigned)w->len);
	int err = uv_write(&w->req, &c->h.stream, &b, 1, on_write);
	if (err < 0) {
		/* An error return means the callback never runs. */
		free(w);
		return err;
	}
	c->out_pending += w->len;
	memset(out, 0, sizeof(*out));
	conn_account(c);
	return 0;
}

/* Every read lands in the server's one scratch buffer: libuv calls
 * on_alloc, reads and calls on_read for one stream at a time, and on_read
 * copies the bytes out before returning. */
static void on_alloc(uv_handle_t *h, size_t suggested, uv_buf_t *buf)
{
	struct mts_conn *c = h->data;
	(void)suggested;
	*buf = uv_buf_init((char *)c->net->scratch,
	                   c->net->scratch ? READ_CHUNK : 0);
}

/* Append a read to the connection's input (what is not answered yet).
 * The buffer grows to what it must hold, by half again at least so that
 * a large frame arriving in reads is not copied over and over, but not
 * past one frame's worth. */
static int conn_append(struct mts_conn *c, const uint8_t *data, size_t n)
{
	/* Reading happens only when nothing answerable is buffered: move
	 * the partial frame (if any) to the front once, here. */
	if (c->in_off > 0) {
		memmove(c->in, c->in + c->in_off, c->in_len - c->in_off);
		c->in_len -= c->in_off;
		c->in_off = 0;
	}
	size_t need = c->in_len + n;
	if (need > c->in_cap) {
		size_t cap = c->in_cap + c->in_cap / 2;
		size_t most = MTS_MAX_FRAME + 16u + READ_CHUNK;
		if (cap > most)
			cap = most;
		if (cap < need)
			cap = need;
		uint8_t *p = realloc(c->in, cap);
		if (!p)
			return -ENOMEM;
		c->in = p;
		c->in_cap = cap;
	}
	memcpy(c->in + c->in_len, data, n);
	c->in_len = need;
	conn_account(c);
	return 0;
}

/* The word kept beside c's uid's connection count: the iteration it last
 * had frames answered in (its low 24 bits, in bits 40-63), how many (bits
 * 32-39) and the loop's microseconds they took (bits 0-31). NULL for a
 * connection left uncounted (out of memory): it is not held to it. */
static uint64_t *uid_frames(struct mts_conn *c)
{
	return c->uid_counted
	           ? mts_uid_count_bytes(&c->net->conn_uids, c->uid_key)
	           : NULL;
}

#define ITER_OF(w)    ((uint32_t)((w) >> 40))
#define ITER_NOW(net) ((net)->iter & 0xffffffu)

/* What c's uid has used of this loop iteration's share: frames and ns. */
static void uid_share_used(struct mts_conn *c, uint32_t *frames, uint64_t *ns)
{
	const uint64_t *w = uid_frames(c);
	*frames = 0;
	*ns = 0;
	if (w && ITER_OF(*w) == ITER_NOW(c->net)) {
		*frames = (uint32_t)(*w >> 32) & 0xffu;
		*ns = (uint64_t)(uint32_t)*w * 1000u;
	}
}

/* Frames c's uid may still have answered in this loop iteration (0 once
 * its frames or its time are spent), and the time left in *ns. */
static unsigned uid_frames_left(struct mts_conn *c, uint64_t *ns)
{
	uint32_t frames;
	uint64_t used;
	uid_share_used(c, &frames, &used);
	if (frames >= MTS_FRAMES_PER_UID_ITER || used >= MTS_NS_PER_UID_ITER)
		return 0;
	if (ns)
		*ns = MTS_NS_PER_UID_ITER - used;
	return MTS_FRAMES_PER_UID_ITER - frames;
}

static void uid_frames_spend(struct mts_conn *c, unsigned n, uint64_t ns)
{
	uint64_t *w = uid_frames(c);
	if (!w || (!n && !ns))
		return;
	uint32_t frames;
	uint64_t used;
	uid_share_used(c, &frames, &used);
	frames += n;
	if (frames > 0xffu)
		frames = 0xffu;
	uint64_t us = (used + ns) / 1000u;
	if (us > UINT32_MAX)
		us = UINT32_MAX;
	*w = (uint64_t)ITER_NOW(c->net) << 40 | (uint64_t)frames << 32 | us;
}

static void on_iteration(uv_prepare_t *h)
{
	struct mts_conns *net = h->data;
	net->iter++;
}

/* One turn: answer buffered frames within the budgets, then decide
 * whether to read more, wait for the output to drain, or come back on the
 * next loop iteration. */
static void conn_process(struct mts_conn *c)
{
	if (c->closing || c->close_after_write)
		return;
	if (c->throttled) {
		/* budget_relieved() gives it its turn back. */
		stop_reading(c);
		return;
	}
	uint64_t ns_left = 0;
	unsigned left = uid_frames_left(c, &ns_left);
	if (!left) {
		/* Its uid's share of this iteration is spent: the next. */
		stop_reading(c);
		backlog_add(c);
		return;
	}
	struct mts_buf out = {0};
	unsigned answered = 0;
	struct mts_budget budget = {
	    .out_bytes = c->out_pending >= MTS_OUT_HIGH
	                     ? 0
	                     : MTS_OUT_HIGH - c->out_pending,
	    .frames = left < MTS_FRAMES_PER_TURN ? left : MTS_FRAMES_PER_TURN,
	    .answered = &answered,
	};
	uint64_t t0 = mts_now_monotonic();
	budget.until_ns = t0 + ns_left;
	/* Over budget, a turn of a connection still under its share adds at
	 * most about that share (one answer at least), not MTS_OUT_HIGH. */
	if (c->net->pressure && budget.out_bytes > MTS_CONN_FLOOR)
		budget.out_bytes = MTS_CONN_FLOOR;
	size_t used = 0;
	c->turn_out = &out;
	/* c->in is NULL for a peer holding nothing (NULL + 0 is undefined). */
	const uint8_t *in = c->in ? c->in + c->in_off : NULL;
	int r = mts_input(c->net->reg, &c->peer, in, c->in_len - c->in_off,
	                  &out, budget, &used);
	c->turn_out = NULL;
	uid_frames_spend(c, answered, mts_now_monotonic() - t0);
	if (c->closing) {
		/* An event pushed during the turn found us not reading. */
		mts_buf_free(&out);
		return;
	}
	if (used > 0)
		c->last_ms = uv_now(c->net->loop); /* not idle */
	c->in_off += used;
	if (c->in_off == c->in_len && c->in_cap > 0) {
		/* Everything answered: hold nothing for an idle peer (the
		 * next read comes through the scratch buffer). */
		free(c->in);
		c->in = NULL;
		c->in_off = c->in_len = c->in_cap = 0;
		conn_account(c);
	}
	if (out.len > 0 && conn_write(c, &out) < 0) {
		mts_buf_free(&out);
		conn_close(c);
		return;
	}
	mts_buf_free(&out);

	switch (r) {
	case 0:
		resume_reading(c);
		conn_maybe_finish(c);
		return;
	case MTS_MORE:
		stop_reading(c);
		if (c->out_pending >= MTS_OUT_HIGH) {
			c->paused = true; /* on_write resumes */
			mts_log_uid(mts_peer_log_uid(&c->peer), MTS_LOG_DEBUG,
			            "peer not reading, paused",
			            "peer_pid=%u pending=%zu", c->peer.pid,
			            c->out_pending);
		} else {
			backlog_add(c); /* on_idle resumes */
		}
		return;
	case MTS_CLOSE:
		if (c->peer.token_refused)
			c->net->conn_stats.untokened++;
		c->close_after_write = true;
		stop_reading(c);
		conn_maybe_finish(c);
		return;
	default:
		mts_log(MTS_LOG_ERROR, "out of memory answering a request",
		        "peer_pid=%u", c->peer.pid);
		conn_close(c);
		return;
	}
}

/* Once per loop iteration while any connection is backlogged: give each
 * of them (those queued before this call) one more turn. Entries are
 * popped from the live list, never walked on a detached copy: a turn can
 * close another backlogged connection (a Watch event that fails to write
 * to it), and backlog_remove() must find it where it looks, or the walk
 * would stop there and strand every connection after it. */
static void on_idle(uv_idle_t *h)
{
	struct mts_conns *net = h->data;
	uint32_t n = 0;
	for (struct mts_conn *x = net->backlog_head; x; x = x->bnext)
		n++;
	while (n-- > 0 && net->backlog_head) {
		struct mts_conn *c = net->backlog_head;
		net->backlog_head = c->bnext;
		if (!net->backlog_head)
			net->backlog_tail = NULL;
		c->bnext = NULL;
		if (!uid_frames_left(c, NULL)) {
			/* Its uid's share is spent: set aside, still
			 * backlogged, and put back in front of those served
			 * (which went to the tail), so that a uid's
			 * connections take their turns round by round. */
			if (net->skip_tail)
				net->skip_tail->bnext = c;
			else
				net->skip_head = c;
			net->skip_tail = c;
			continue;
		}
		c->backlogged = false;
		conn_process(c); /* may queue c again, at the tail */
	}
	if (net->skip_head) {
		net->skip_tail->bnext = net->backlog_head;
		if (!net->backlog_head)
			net->backlog_tail = net->skip_tail;
		net->backlog_head = net->skip_head;
		net->skip_head = net->skip_tail = NULL;
	}
	if (!net->backlog_head)
		uv_idle_stop(h);
}

static void on_read(uv_stream_t *s, ssize_t nread, const uv_buf_t *buf)
{
	struct mts_conn *c = s->data;
	if (nread > 0) {
		const uint8_t *data = (const uint8_t *)buf->base;
		if (conn_append(c, data, (size_t)nread) < 0) {
			mts_log(MTS_LOG_ERROR,
			        "out of memory reading a request, closing",
			        "peer_pid=%u", c->peer.pid);
			conn_close(c);
			return;
		}
		conn_process(c);
		return;
	}
	if (nread == UV_EOF) {
		/* A half-closed peer may still read: answer what it sent. */
		c->eof = true;
		stop_reading(c);
		conn_maybe_finish(c);
		return;
	}
	if (nread < 0) {
		mts_log_uid(mts_peer_log_uid(&c->peer), MTS_LOG_DEBUG,
		            "read failed, closing", "peer_pid=%u err=%s",
		            c->peer.pid, uv_err_name((int)nread));
		conn_close(c);
	}
}

/* A peer of unknown uid that has not shown the token yet: it may be
 * anyone, and holds a place the token's holders share. */
static bool untokened(const struct mts_conn *c)
{
	return c->uid_key == MTS_UID_TCP && !c->peer.token_seen &&
	       !c->closing && !c->close_after_write;
}

static void close_untokened(struct mts_conn *c, const char *why)
{
	char who[MTS_PEER_WHO_MAX];
	c->net->conn_stats.untokened++;
	mts_log_uid(MTS_UID_TCP, MTS_LOG_DEBUG,
	            "connection of unknown uid closed without the token",
	            "%s why=%s", mts_peer_who(&c->peer, who, sizeof(who)), why);
	conn_close(c);
}

/*
 * Unknown-uid places full (all of them, or its address's share): the
 * oldest connection there that has not shown the token gives its place to
 * `c`, as sshd's MaxStartups drops connections not yet authenticated. A
 * scheduler holding the token shows it in its first request, a round
 * trip after connecting, and keeps its place from then on; a peer without
 * it cannot keep places from those that have it by opening connections
 * and sending nothing. False when every place there has shown the token.
 */
static bool untokened_make_room(struct mts_conn *c, bool by_addr)
{
	/* The oldest: a scheduler's connection has as many accepts of grace
	 * as there are places to show the token. (Sparing those whose first
	 * request is coming in would let a peer that sends one byte on each
	 * of its own take the newest, a scheduler's, first.) */
	struct mts_conn *oldest = NULL;
	for (struct mts_conn *x = c->net->conns; x; x = x->next)
		if (x != c && untokened(x) && x->uid_counted &&
		    (!by_addr ||
		     (x->addr_counted && x->addr_key == c->addr_key)) &&
		    (!oldest || x->accept_ms <= oldest->accept_ms))
			oldest = x;
	if (!oldest)
		return false;
	close_untokened(oldest, "its place taken by a newer connection");
	return true;
}

/*
 * The per-uid cap: count `c` under its peer's uid, and close it at once if
 * that uid already has its cap open, as the global cap does. One uid
 * holding connections open must not lock the others out. The uid is from
 * SO_PEERCRED, or sock_diag for a TCP peer on this host. Every peer of
 * unknown uid counts under MTS_UID_TCP, capped by
 * max_connections_unidentified. Admins are exempt and bounded by
 * max_connections only. Returns false when `c` was closed.
 */
static bool uid_admit(struct mts_conn *c, bool admin)
{
	struct mts_conns *net = c->net;
	c->uid_key = c->peer.has_cred ? c->peer.uid : MTS_UID_TCP;
	uint32_t open = mts_uid_count_get(&net->conn_uids, c->uid_key);
	uint32_t cap = c->uid_key == MTS_UID_TCP ? net->max_conns_unidentified
	                                         : net->max_conns_per_uid;
	/* A remote peer of unknown uid, one address of many that share
	 * max_connections_unidentified: an eighth of it each (at least 4: a
	 * client holding a Watch beside its requests, a few schedulers
	 * behind one NAT), so that one host holding connections open cannot
	 * lock the others out. */
	bool by_addr = false;
	if (c->uid_key == MTS_UID_TCP && c->remote && !admin) {
		uint32_t per = cap / 8 > 4 ? cap / 8 : 4;
		uint32_t here =
		    mts_uid_count_get(&net->conn_addrs, c->addr_key);
		if (here >= per) {
			by_addr = true;
			open = here;
			cap = per;
		}
	}
	if (open >= cap && !admin &&
	    !(c->uid_key == MTS_UID_TCP && untokened_make_room(c, by_addr))) {
		char who[MTS_PEER_WHO_MAX];
		net->conn_stats.rejected_uid++;
		net->uid_rejected_unlogged++;
		uint64_t now = uv_now(net->loop);
		if (!net->uid_rejected_logged_ms ||
		    now - net->uid_rejected_logged_ms >= 1000) {
			bool anon = c->uid_key == MTS_UID_TCP;
			mts_log(
			    MTS_LOG_WARN,
			    by_addr
			        ? "an eighth of max_connections_unidentified "
			          "reached for this address; its new "
			          "connections are closed at once"
			    : anon ? "max_connections_unidentified reached; "
			             "new TCP connections of unknown uid are "
			             "closed at once"
			           : "max_connections_per_uid reached for this "
			             "uid; its new connections are closed at "
			             "once",
			    "%s open=%u cap=%u rejected=%llu",
			    mts_peer_who(&c->peer, who, sizeof(who)), open, cap,
			    (unsigned long long)net->uid_rejected_unlogged);
			net->uid_rejected_logged_ms = now;
			net->uid_rejected_unlogged = 0;
		}
		conn_close(c);
		return false;
	}
	/* Out of memory: not counted (nor capped), which is all it costs. */
	c->uid_counted = mts_uid_count_add(&net->conn_uids, c->uid_key) == 0;
	if (c->uid_key == MTS_UID_TCP && c->remote)
		c->addr_counted =
		    mts_uid_count_add(&net->conn_addrs, c->addr_key) == 0;
	return true;
}

/* A new connection record, linked into the server's list (conn_close()
 * unlinks it), or NULL when out of memory. */
const size_t mts_conn_record_bytes = sizeof(struct mts_conn);

static struct mts_conn *conn_new(struct mts_conns *net, bool tcp)
{
	struct mts_conn *c = calloc(1, sizeof(*c));
	if (!c) {
		mts_log(MTS_LOG_ERROR, "out of memory accepting a connection",
		        NULL);
		return NULL;
	}
	c->net = net;
	c->peer.fd = -1;
	c->peer.tcp = tcp;
	if (tcp)
		uv_tcp_init(net->loop, &c->h.tcp);
	else
		uv_pipe_init(net->loop, &c->h.pipe, 0);
	c->h.stream.data = c;
	c->next = net->conns;
	if (net->conns)
		net->conns->prev = c;
	net->conns = c;
	net->nconns++;
	net->conn_stats.open = net->nconns;
	net->conn_stats.max = net->max_conns;
	net->conn_stats.buffered_max = net->max_buffered;
	net->conn_stats.max_per_uid = net->max_conns_per_uid;
	return c;
}

/* Over max_connections: the connection was accepted only to be closed
 * (see the top of this file). A flood must not flood the log too: one
 * line a second. */
static void conn_refuse_over_max(struct mts_conn *c, bool admin)
{
	struct mts_conns *net = c->net;
	net->conn_stats.rejected++;
	net->rejected_unlogged++;
	uint64_t now = uv_now(net->loop);
	if (!net->rejected_logged_ms || now - net->rejected_logged_ms >= 1000) {
		mts_log(MTS_LOG_WARN,
		        "max_connections reached; new connections are closed "
		        "at once",
		        "max_connections=%u admin_reserve=%u admin=%d tcp=%d "
		        "rejected=%llu",
		        net->max_conns, net->admin_reserve, admin, c->peer.tcp,
		        (unsigned long long)net->rejected_unlogged);
		net->rejected_logged_ms = now;
		net->rejected_unlogged = 0;
	}
	conn_close(c);
}

/* Who is at the other end of a Unix socket: SO_PEERCRED, taken once at
 * accept (the kernel's record of the connecting process). */
static void conn_peer_cred(struct mts_conn *c)
{
	uv_os_fd_t fd;
	if (uv_fileno((uv_handle_t *)&c->h.stream, &fd) != 0)
		return;
	struct ucred cred;
	socklen_t len = sizeof(cred);
	struct timespec ts;
	c->peer.fd = fd;
	if (clock_gettime(CLOCK_BOOTTIME, &ts) == 0)
		c->peer.accept_boot_ns =
		    (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
	if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &len) == 0 &&
	    cred.pid > 0) {
		c->peer.has_cred = true;
		c->peer.pid = (uint32_t)cred.pid;
		c->peer.uid = (uint32_t)cred.uid;
		c->peer.gid = (uint32_t)cred.gid;
	}
}

/*
 * A TCP peer has no SO_PEERCRED, but a peer on this host is a uid all the
 * same: the kernel knows who owns its end of the connection (sockdiag.c).
 * When found, the peer is that uid for caps, ownership of its
 * reservations, authorisation and the logs, as on the Unix socket. It has
 * no pid, so it cannot Register. When not found (a remote peer, a peer
 * that has closed or half-closed, no sock_diag), it is unidentified, and
 * every request needs the token (dispatch.c). This is the only place a
 * TCP connection gets a uid, once, at accept. A later retry would ask
 * about a connection whose peer may be gone, so there is none. Also sets
 * its address for the logs and turns off the Nagle delay.
 */
static void conn_tcp_setup(struct mts_conn *c)
{
	struct sockaddr_storage peer, local;
	int plen = sizeof(peer), llen = sizeof(local);
	uv_tcp_nodelay(&c->h.tcp, 1);
	snprintf(c->peer.addr, sizeof(c->peer.addr), "?");
	if (uv_tcp_getpeername(&c->h.tcp, (struct sockaddr *)&peer, &plen) ||
	    uv_tcp_getsockname(&c->h.tcp, (struct sockaddr *)&local, &llen))
		return;
	mt_addr_format((struct sockaddr *)&peer, c->peer.addr,
	               sizeof(c->peer.addr));
	if (!mt_addr_is_local((struct sockaddr *)&peer,
	                      (struct sockaddr *)&local)) {
		c->remote = true;
		c->addr_key = mt_addr_key((struct sockaddr *)&peer);
		return;
	}
	uv_os_fd_t fd;
	if (uv_fileno((uv_handle_t *)&c->h.tcp, &fd) != 0)
		return;
	uint32_t uid;
	int err = mt_sockdiag_uid(fd, (struct sockaddr *)&peer,
	                          (struct sockaddr *)&local, &uid);
	if (err < 0) {
		mts_log_uid(mts_peer_log_uid(&c->peer), MTS_LOG_DEBUG,
		            "tcp peer's uid not found", "peer=%s err=%s",
		            c->peer.addr, strerror(-err));
		return;
	}
	c->peer.has_cred = true;
	c->peer.uid = uid;
	c->peer.gid = UINT32_MAX; /* unknown: sock_diag gives the uid only */
}

/* Root, the server's uid, admin_uid, a Unix peer in admin_gid: exempt
 * from the per-uid caps and allowed into the admin reserve. */
static bool conn_is_admin(struct mts_conn *c)
{
	return c->peer.has_cred &&
	       mts_authorise(c->net->reg, &c->peer, NULL) != MTS_AUTH_NONE;
}

static void refuse_unallocated(struct mts_conns *net, uv_stream_t *listener,
                               bool tcp);

static void accept_one(uv_stream_t *listener, int status, bool tcp)
{
	struct mts_conns *net = listener->data;
	if (status < 0) {
		mts_log_scope("accept", MTS_LOG_WARN, "accept failed", "err=%s",
		              uv_err_name(status));
		return;
	}
	struct mts_conn *c = conn_new(net, tcp);
	if (!c) {
		refuse_unallocated(net, listener, tcp);
		return;
	}
	int err = uv_accept(listener, &c->h.stream);
	if (err < 0) {
		mts_log_scope("accept", MTS_LOG_WARN, "accept failed", "err=%s",
		              uv_err_name(err));
		conn_close(c);
		return;
	}
	c->last_ms = c->accept_ms = uv_now(net->loop);
	if (tcp)
		conn_tcp_setup(c);
	else
		conn_peer_cred(c);
	/* Who it is decides which caps apply: the last admin_reserve
	 * places of max_connections are kept for admins. */
	bool admin = conn_is_admin(c);
	uint32_t room =
	    admin ? net->max_conns : net->max_conns - net->admin_reserve;
	if (net->nconns > room) {
		conn_refuse_over_max(c, admin);
		return;
	}
	if (!uid_admit(c, admin))
		return;
	char who[MTS_PEER_WHO_MAX];
	mts_log_uid(mts_peer_log_uid(&c->peer), MTS_LOG_DEBUG,
	            "connection accepted", "%s admin=%d",
	            mts_peer_who(&c->peer, who, sizeof(who)), admin);
	resume_reading(c);
}

static void on_spare_closed(uv_handle_t *h)
{
	struct mts_conns *net = h->data;
	net->spare_busy = false;
	/* A connection came while the spare was closing: serve it now. */
	if (net->spare_again && net->listening) {
		net->spare_again = false;
		accept_one((uv_stream_t *)&net->listener, 0, false);
	}
	if (net->spare_again_tcp && net->tcp_listening) {
		net->spare_again_tcp = false;
		accept_one((uv_stream_t *)&net->tcp_listener, 0, true);
	}
}

/* No record for a new connection (out of memory): accept it into the
 * spare handle and close it, so the peer sees EOF (and a worker's client
 * backs off) and the listener is watched again. */
static void refuse_unallocated(struct mts_conns *net, uv_stream_t *listener,
                               bool tcp)
{
	if (net->spare_busy) {
		if (tcp)
			net->spare_again_tcp = true;
		else
			net->spare_again = true;
		return;
	}
	if (tcp)
		uv_tcp_init(net->loop, &net->spare.tcp);
	else
		uv_pipe_init(net->loop, &net->spare.pipe, 0);
	net->spare.handle.data = net;
	net->spare_busy = true;
	if (uv_accept(listener, &net->spare.stream) == 0)
		net->conn_stats.rejected++;
	uv_close(&net->spare.handle, on_spare_closed);
}

static void on_connection(uv_stream_t *listener, int status)
{
	accept_one(listener, status, false);
}

static void on_tcp_connection(uv_stream_t *listener, int status)
{
	accept_one(listener, status, true);
}

/* mkdir -p of `dir`, new directories 0755 (chmod: the umask must not
 * decide who can reach the socket). */
static int make_dirs(const char *dir)
{
	char path[sizeof(((struct sockaddr_un *)0)->sun_path)];
	size_t len = strlen(dir);
	if (len >= sizeof(path))
		return -ENAMETOOLONG;
	memcpy(path, dir, len + 1);
	for (size_t i = 1; i <= len; i++) {
		if (path[i] != '/' && path[i] != '\0')
			continue;
		char saved = path[i];
		path[i] = '\0';
		if (mkdir(path, 0755) == 0) {
			if (chmod(path, 0755) < 0)
				return -errno;
		} else if (errno != EEXIST) {
			return -errno;
		}
		path[i] = saved;
	}
	return 0;
}

/* Can nobody but root and us rename entries in the directory `st`? Else
 * -EPERM and `msg` says why. */
static int dir_safe(const struct stat *st, const char *name, char *msg,
                    size_t cap)
{
	uid_t me = geteuid();
	if (st->st_uid != 0 && st->st_uid != me) {
		snprintf(msg, cap,
		         "directory %s is owned by uid %u, not by root "
		         "or memtallyd's uid %u: move the socket or "
		         "state file, or chown the directory",
		         name, (unsigned)st->st_uid, (unsigned)me);
		return -EPERM;
	}
	if ((st->st_mode & (S_IWGRP | S_IWOTH)) && !(st->st_mode & S_ISVTX)) {
		snprintf(msg, cap,
		         "directory %s is writable by group or others "
		         "(mode %04o) without the sticky bit: chmod "
		         "go-w (or +t) it, or move the socket or state "
		         "file",
		         name, (unsigned)(st->st_mode & 07777));
		return -EPERM;
	}
	return 0;
}

/* As many symlinks as the kernel follows in one path lookup. */
#define MAX_LINKS 40

/*
 * Walk the directory `dir` as written, one component at a time, with
 * openat(O_PATH | O_NOFOLLOW), so each step is examined before it is
 * taken. A symlink on the way is followed only if root or we own it. Its
 * owner could point it elsewhere at any time, such as at a directory of
 * theirs holding their own server's socket. Every directory passed
 * through must be one only root or we can change, or the symlink in it
 * could be replaced. The walk stops at the first component that does not
 * exist, or is not a directory. make_dirs() creates the missing rest,
 * under a checked directory.
 */
static int links_check(const char *dir, char *msg, size_t cap)
{
	char todo[2 * PATH_MAX], shown[PATH_MAX], target[PATH_MAX];
	if (snprintf(todo, sizeof(todo), "%s", dir) >= PATH_MAX) {
		snprintf(msg, cap, "path too long: %s", dir);
		return -ENAMETOOLONG;
	}
	bool abs = dir[0] == '/';
	snprintf(shown, sizeof(shown), "%s", abs ? "/" : ".");
	int dfd = open(shown, O_PATH | O_DIRECTORY | O_CLOEXEC);
	if (dfd < 0) {
		int err = -errno;
		snprintf(msg, cap, "cannot examine directory %s: %s", shown,
		         strerror(-err));
		return err;
	}
	uid_t me = geteuid();
	int links = 0, err = 0;
	char *p = todo;
	for (;;) {
		while (*p == '/')
			p++;
		if (!*p)
			break;
		char *name = p;
		p += strcspn(p, "/");
		if (*p)
			*p++ = '\0';
		if (strcmp(name, ".") == 0)
			continue;
		size_t n = strlen(shown);
		if (snprintf(shown + n, sizeof(shown) - n, "%s%s",
		             shown[n - 1] == '/' ? "" : "/",
		             name) >= (int)(sizeof(shown) - n)) {
			err = -ENAMETOOLONG;
			snprintf(msg, cap, "path too long: %s", dir);
			break;
		}
		int fd = openat(dfd, name, O_PATH | O_NOFOLLOW | O_CLOEXEC);
		struct stat st;
		if (fd < 0 || fstat(fd, &st) < 0) {
			err = errno == ENOENT ? 0 : -errno;
			if (err)
				snprintf(msg, cap, "cannot examine %s: %s",
				         shown, strerror(-err));
			if (fd >= 0)
				close(fd);
			break;
		}
		if (S_ISDIR(st.st_mode)) {
			err = dir_safe(&st, shown, msg, cap);
			close(dfd);
			dfd = fd;
			if (err)
				break;
			continue;
		}
		if (!S_ISLNK(st.st_mode)) {
			close(fd);
			break;
		}
		if (st.st_uid != 0 && st.st_uid != me) {
			snprintf(
			    msg, cap,
			    "symlink %s is owned by uid %u, not by root or "
			    "memtallyd's uid %u: its owner can point it "
			    "elsewhere; use a path without it, or replace "
			    "it by one root owns",
			    shown, (unsigned)st.st_uid, (unsigned)me);
			close(fd);
			err = -EPERM;
			break;
		}
		/* Empty path: the link the O_PATH descriptor is. */
		ssize_t len = readlinkat(fd, "", target, sizeof(target));
		close(fd);
		if (len < 0 || (size_t)len >= sizeof(target) ||
		    ++links > MAX_LINKS) {
			err = len < 0                         ? -errno
			      : (size_t)len >= sizeof(target) ? -ENAMETOOLONG
			                                      : -ELOOP;
			snprintf(msg, cap, "cannot follow symlink %s: %s",
			         shown, strerror(-err));
			break;
		}
		target[len] = '\0';
		/* Walk the target, then what was left after the link. */
		char rest[PATH_MAX];
		snprintf(rest, sizeof(rest), "%s", p);
		if (snprintf(todo, sizeof(todo), "%s/%s", target, rest) >=
		    (int)sizeof(todo)) {
			err = -ENAMETOOLONG;
			snprintf(msg, cap, "cannot follow symlink %s: %s",
			         shown, strerror(-err));
			break;
		}
		p = todo;
		if (target[0] == '/') {
			int root = open("/", O_PATH | O_DIRECTORY | O_CLOEXEC);
			if (root < 0) {
				err = -errno;
				snprintf(msg, cap, "cannot examine /: %s",
				         strerror(-err));
				break;
			}
			close(dfd);
			dfd = root;
			snprintf(shown, sizeof(shown), "/");
		} else {
			/* Relative to the link's directory. */
			char *slash = strrchr(shown, '/');
			slash[slash == shown ? 1 : 0] = '\0';
		}
	}
	close(dfd);
	return err;
}

/*
 * Whoever may rename entries in a directory on the way to the socket or
 * the restart record can put their own files, symlinks or directories
 * there, between our checks and our uses. Whoever owns a symlink on the
 * way can point it elsewhere. So, as OpenSSH's StrictModes does for its
 * key files, every symlink on the path as written must be owned by root
 * or by us (links_check). Every directory passed through, and every
 * directory from `file`'s up to /, must be owned by root or by us. It
 * must not be writable by group or others unless it is sticky, like /tmp,
 * where only an entry's owner may rename it. When `file`'s directory does
 * not exist yet, the walk starts at the nearest existing one above it,
 * where make_dirs() would create it. This costs a few system calls, once
 * at start. Returns 0, or -EPERM with `msg` saying which directory or
 * symlink and why, or -errno when one cannot be examined.
 */
int mts_dir_check(const char *file, char *msg, size_t cap)
{
	char dir[PATH_MAX], real[PATH_MAX];
	if (snprintf(dir, sizeof(dir), "%s", file) >= (int)sizeof(dir)) {
		snprintf(msg, cap, "path too long: %s", file);
		return -ENAMETOOLONG;
	}
	char *d = dirname(dir);
	/* The file itself is never followed: the socket's path must not
	 * exist or be a socket (mts_socket_prepare), the restart record is
	 * opened O_NOFOLLOW. */
	int err = links_check(d, msg, cap);
	if (err < 0)
		return err;
	while (!realpath(d, real)) {
		if (errno != ENOENT || strcmp(d, "/") == 0 ||
		    strcmp(d, ".") == 0) {
			err = -errno;
			snprintf(msg, cap, "cannot examine directory %s: %s", d,
			         strerror(-err));
			return err;
		}
		memmove(dir, d, strlen(d) + 1);
		d = dirname(dir);
	}
	for (;;) {
		struct stat st;
		if (stat(real, &st) < 0) {
			err = -errno;
			snprintf(msg, cap, "cannot examine directory %s: %s",
			         real, strerror(-err));
			return err;
		}
		err = dir_safe(&st, real, msg, cap);
		if (err < 0)
			return err;
		if (strcmp(real, "/") == 0)
			return 0;
		char *slash = strrchr(real, '/');
		slash[slash == real ? 1 : 0] = '\0';
	}
}

int mts_socket_prepare(const char *path)
{
	struct sockaddr_un sa = {.sun_family = AF_UNIX};
	size_t len = strlen(path);
	if (len == 0 || len >= sizeof(sa.sun_path))
		return -ENAMETOOLONG;
	memcpy(sa.sun_path, path, len + 1);

	char dir[sizeof(sa.sun_path)];
	memcpy(dir, path, len + 1);
	int err = make_dirs(dirname(dir));
	if (err < 0)
		return err;

	struct stat st;
	if (lstat(path, &st) < 0)
		return errno == ENOENT ? 0 : -errno;
	if (!S_ISSOCK(st.st_mode))
		return -EEXIST; /* never delete a file we did not make */

	/* A non-blocking connect never waits: refused means nobody
	 * listens (stale); success or a full backlog means a live server. */
	int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
	if (fd < 0)
		return -errno;
	int r = connect(fd, (struct sockaddr *)&sa, sizeof(sa));
	int cerr = r == 0 ? 0 : errno;
	close(fd);
	if (cerr == 0 || cerr == EAGAIN || cerr == EINPROGRESS)
		return -EADDRINUSE;
	if (cerr != ECONNREFUSED)
		return -cerr;
	if (unlink(path) < 0 && errno != ENOENT)
		return -errno;
	char q[MTS_LOGQ_MAX];
	mts_log(MTS_LOG_INFO, "removed stale socket", "path=%s",
	        mts_logq(q, sizeof(q), path));
	return 0;
}

/*
 * The idle timeout: a connection that has sent no request for idle_ms is
 * closed, so that peers which open connections and leave them do not hold
 * a share of max_connections (and of their uid's) for ever. A Watch
 * subscriber waits for events by design and is never idle. A peer that
 * reconnects is served like any other (the client library reconnects by
 * itself).
 */
static void on_idle_timer(uv_timer_t *t)
{
	struct mts_conns *net = t->data;
	uint64_t now = uv_now(net->loop);
	struct mts_conn *next;
	for (struct mts_conn *c = net->conns; c; c = next) {
		next = c->next;
		if (untokened(c) && now - c->accept_ms >= MTS_TOKEN_WAIT_MS) {
			close_untokened(c, "no request with the token in time");
			continue;
		}
		if (!net->idle_ms || c->peer.watching || c->closing ||
		    now - c->last_ms < net->idle_ms)
			continue;
		net->conn_stats.idle_closed++;
		char who[MTS_PEER_WHO_MAX];
		mts_log_uid(mts_peer_log_uid(&c->peer), MTS_LOG_DEBUG,
		            "connection idle, closed", "%s idle_ms=%llu",
		            mts_peer_who(&c->peer, who, sizeof(who)),
		            (unsigned long long)(now - c->last_ms));
		conn_close(c);
	}
}

/* What both listeners need: the backlog's idle handle, the budget and
 * its timer, the scratch buffer. Once. */
static int conns_init(struct mts_conns *net)
{
	if (net->idle_open)
		return 0;
	net->max_conns =
	    net->cfg->max_conns ? net->cfg->max_conns : MTS_DEFAULT_MAX_CONNS;
	net->max_buffered = net->cfg->max_buffered ? net->cfg->max_buffered
	                                           : MTS_DEFAULT_MAX_BUFFERED;
	/* A fraction of the whole by default: four uids at their cap leave
	 * half of it to everyone else. */
	net->max_conns_per_uid = net->cfg->max_conns_per_uid
	                             ? net->cfg->max_conns_per_uid
	                             : net->max_conns / MTS_DEFAULT_PER_UID_DIV;
	if (net->max_conns_per_uid == 0)
		net->max_conns_per_uid = 1;
	net->max_conns_unidentified = net->cfg->max_conns_unidentified
	                                  ? net->cfg->max_conns_unidentified
	                                  : MTS_DEFAULT_MAX_CONNS_UNIDENTIFIED;
	/* No reserve when there is a single place: it would lock out
	 * everyone but the admins. */
	uint32_t reserve = net->max_conns / MTS_ADMIN_RESERVE_DIV;
	if (reserve < 1)
		reserve = 1;
	if (reserve > MTS_ADMIN_RESERVE_MAX)
		reserve = MTS_ADMIN_RESERVE_MAX;
	net->admin_reserve = net->max_conns > 1 ? reserve : 0;
	net->idle_ms = net->cfg->no_idle_timeout   ? 0
	               : net->cfg->idle_timeout_ms ? net->cfg->idle_timeout_ms
	                                           : MTS_DEFAULT_IDLE_MS;
	if (!net->scratch) {
		net->scratch = malloc(READ_CHUNK);
		if (!net->scratch)
			return -ENOMEM;
	}
	int err = uv_timer_init(net->loop, &net->budget_timer);
	if (err < 0)
		return err;
	net->budget_timer.data = net;
	net->budget_timer_open = true;
	err = uv_idle_init(net->loop, &net->idle);
	if (err < 0)
		return err;
	net->idle.data = net;
	net->idle_open = true;
	err = uv_prepare_init(net->loop, &net->iter_prep);
	if (err < 0)
		return err;
	net->iter_prep.data = net;
	net->iter_prep_open = true;
	uv_prepare_start(&net->iter_prep, on_iteration);
	uv_unref((uv_handle_t *)&net->iter_prep);
	err = uv_timer_init(net->loop, &net->idle_timer);
	if (err < 0)
		return err;
	net->idle_timer.data = net;
	net->idle_timer_open = true;
	/* Checked every quarter of the timeout, and at least every fifth of
	 * the token's wait: a connection goes between 1 and 1.25 timeouts
	 * after its last request, one of unknown uid between 1 and 1.2
	 * waits after accept without the token. */
	uint64_t every = MTS_TOKEN_WAIT_MS / 5;
	if (net->idle_ms && net->idle_ms / 4 < every)
		every = net->idle_ms / 4 ? net->idle_ms / 4 : 1;
	uv_timer_start(&net->idle_timer, on_idle_timer, every, every);
	/* Not a reason to keep the loop running. */
	uv_unref((uv_handle_t *)&net->idle_timer);
	return 0;
}

/*
 * The socket is born with its mode and group. bind() creates the file with
 * the umask's mode and our group. A chmod or chown by path after it acts
 * on whatever is at that path by then, which in a directory another user
 * can write may be their symlink to any file. So the socket is bound
 * inside a fresh directory of our own beside the target (mkdtemp: 0700,
 * ours). Its parent was checked at start (mts_dir_check), so nobody else
 * may rename its entries. There the socket gets its mode and group
 * through the directory's descriptor, where nobody else can reach it. It
 * is listened on, and only then renamed into place with RENAME_NOREPLACE.
 * A server that took the path since mts_socket_prepare() thus keeps it
 * (-EADDRINUSE). The bind goes through /proc/self/fd/N, so the temporary
 * path is never longer than sun_path allows. The descriptor is handed to
 * libuv with uv_pipe_open(), so libuv knows no path to unlink at close.
 * mts_server_free() removes the socket, if it is still ours.
 */
static int bind_in(struct mts_conns *net, int dfd, int *out)
{
	struct sockaddr_un sa = {.sun_family = AF_UNIX};
	snprintf(sa.sun_path, sizeof(sa.sun_path), "/proc/self/fd/%d/s", dfd);
	int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
	if (fd < 0)
		return -errno;
	struct stat st;
	if (bind(fd, (struct sockaddr *)&sa, sizeof(sa)) < 0 ||
	    fchmodat(dfd, "s", 0660, 0) < 0 ||
	    (net->cfg->has_gid &&
	     fchownat(dfd, "s", (uid_t)-1, (gid_t)net->cfg->gid,
	              AT_SYMLINK_NOFOLLOW) < 0) ||
	    fstatat(dfd, "s", &st, AT_SYMLINK_NOFOLLOW) < 0) {
		int err = -errno;
		close(fd);
		return err;
	}
	/* The file we made: the socket-file check and the removal at exit
	 * compare the path with it. */
	net->sock_dev = st.st_dev;
	net->sock_ino = st.st_ino;
	net->sock_known = true;
	*out = fd;
	return 0;
}

/* Move the socket from the private directory to `path`, never over
 * anything there. Filesystems without RENAME_NOREPLACE: a hard link,
 * which never replaces either. */
static int move_into_place(int dfd, const char *path)
{
	if (renameat2(dfd, "s", AT_FDCWD, path, RENAME_NOREPLACE) == 0)
		return 0;
	if (errno != EINVAL && errno != ENOSYS)
		return errno == EEXIST ? -EADDRINUSE : -errno;
	if (linkat(dfd, "s", AT_FDCWD, path, 0) < 0)
		return errno == EEXIST ? -EADDRINUSE : -errno;
	return 0;
}

int mts_listen(struct mts_conns *net)
{
	const char *path = net->cfg->socket_path;
	int err = conns_init(net);
	if (err < 0)
		return err;
	char tmp[PATH_MAX];
	char dir[PATH_MAX];
	if (snprintf(dir, sizeof(dir), "%s", path) >= (int)sizeof(dir) ||
	    snprintf(tmp, sizeof(tmp), "%s/.memtallyd-XXXXXX", dirname(dir)) >=
	        (int)sizeof(tmp))
		return -ENAMETOOLONG;
	if (!mkdtemp(tmp))
		return -errno;
	int dfd = open(tmp, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
	if (dfd < 0) {
		err = -errno;
		rmdir(tmp);
		return err;
	}
	int fd = -1;
	err = bind_in(net, dfd, &fd);
	if (err == 0)
		err = uv_pipe_init(net->loop, &net->listener, 0);
	if (err == 0) {
		net->listener.data = net;
		net->listening = true; /* open: close it on stop */
		err = uv_pipe_open(&net->listener, fd);
		if (err < 0)
			close(fd); /* not the handle's yet */
	} else if (fd >= 0) {
		close(fd);
	}
	if (err == 0)
		err = uv_listen((uv_stream_t *)&net->listener, SOMAXCONN,
		                on_connection);
	if (err == 0)
		err = move_into_place(dfd, path);
	if (err == 0)
		net->socket_bound = true;
	unlinkat(dfd, "s", 0); /* the link fallback's, or after a failure */
	close(dfd);
	rmdir(tmp);
	return err;
}

int mts_listen_tcp(struct mts_conns *net)
{
	struct sockaddr_storage ss;
	socklen_t sslen;
	bool loopback;
	char q[MTS_LOGQ_MAX];
	int err = conns_init(net);
	if (err < 0)
		return err;
	err = mts_parse_hostport(net->cfg->tcp_addr, &ss, &sslen, &loopback);
	if (err < 0)
		return err;
	/* A name, resolved now: the loopback rule the config check could
	 * apply only to a literal. */
	if (!loopback && !net->cfg->tcp_allow_remote) {
		mts_log(MTS_LOG_ERROR,
		        "tcp resolves to an address that is not loopback; set "
		        "tcp_allow_remote = true to listen on it",
		        "addr=%s", mts_logq(q, sizeof(q), net->cfg->tcp_addr));
		return UV_EADDRNOTAVAIL;
	}
	err = uv_tcp_init(net->loop, &net->tcp_listener);
	if (err < 0)
		return err;
	net->tcp_listener.data = net;
	net->tcp_listening = true; /* the handle is open: close it on stop */
	err = uv_tcp_bind(&net->tcp_listener, (struct sockaddr *)&ss, 0);
	if (err < 0)
		return err;
	err = uv_listen((uv_stream_t *)&net->tcp_listener, SOMAXCONN,
	                on_tcp_connection);
	if (err < 0)
		return err;
	struct sockaddr_storage bound;
	int len = sizeof(bound);
	if (uv_tcp_getsockname(&net->tcp_listener, (struct sockaddr *)&bound,
	                       &len) == 0)
		net->tcp_port =
		    ntohs(bound.ss_family == AF_INET6
		              ? ((struct sockaddr_in6 *)&bound)->sin6_port
		              : ((struct sockaddr_in *)&bound)->sin_port);
	mts_log(MTS_LOG_INFO, "tcp listening",
	        "addr=%s port=%u loopback=%d "
	        "token=%s",
	        mts_logq(q, sizeof(q), net->cfg->tcp_addr), net->tcp_port,
	        loopback, net->reg->policy.tcp_token ? "set" : "none");
	return 0;
}

void mts_conns_reauthorise(struct mts_conns *net, bool token_changed)
{
	for (struct mts_conn *c = net->conns; c; c = c->next) {
		struct mts_peer *p = &c->peer;
		if (!p->watching || !p->watch_admin)
			continue;
		if (mts_authorise(net->reg, p, NULL) != MTS_AUTH_NONE)
			continue;
		if (p->watch_by_token && !token_changed)
			continue;
		p->watch_admin = false;
		p->watch_by_token = false;
		/* An admin's subscription was never counted against its
		 * uid's max_watch_per_uid: it is now (past the cap maybe, so
		 * that the uid opens no more). */
		if (!p->watch_own && !p->watch_counted)
			p->watch_counted =
			    mts_uid_count_add(&net->reg->watch_uids,
			                      c->uid_key) == 0;
		mts_log_uid(mts_peer_log_uid(p), MTS_LOG_INFO,
		            "watch subscriber no longer an admin after the "
		            "reload: it sees what show_others lets it",
		            "peer_pid=%u tcp=%d", p->pid, p->tcp);
	}
}

void mts_watch_broadcast(void *ctx, const struct mts_event *ev)
{
	struct mts_conns *net = ctx;
	struct mts_conn *next;
	for (struct mts_conn *c = net->conns; c; c = next) {
		next = c->next;
		if (!c->peer.watching || c->closing || c->close_after_write ||
		    !mts_event_visible(net->reg, &c->peer, ev))
			continue;
		if (c->out_pending >= MTS_OUT_HIGH) {
			net->conn_stats.watch_disconnects++;
			mts_log_uid(
			    mts_peer_log_uid(&c->peer), MTS_LOG_WARN,
			    "watch subscriber not reading, disconnected",
			    "peer_pid=%u tcp=%d pending=%zu", c->peer.pid,
			    c->peer.tcp, c->out_pending);
			conn_close(c);
			continue;
		}
		if (c->turn_out) {
			/* Its own request raised the event: keep order. */
			if (mts_event_append(net->reg, c->peer.watch_id, ev,
			                     c->turn_out) == 0)
				net->conn_stats.watch_events++;
			continue;
		}
		struct mts_buf out = {0};
		if (mts_event_append(net->reg, c->peer.watch_id, ev, &out) <
		        0 ||
		    conn_write(c, &out) < 0) {
			mts_buf_free(&out);
			conn_close(c);
			continue;
		}
		net->conn_stats.watch_events++;
	}
}

void mts_conns_close(struct mts_conns *net)
{
	if (net->listening) {
		/* libuv unlinks no path: it did not bind the socket
		 * (mts_listen), mts_server_free() removes it if ours. */
		uv_close((uv_handle_t *)&net->listener, NULL);
		net->listening = false;
	}
	if (net->tcp_listening) {
		uv_close((uv_handle_t *)&net->tcp_listener, NULL);
		net->tcp_listening = false;
	}
	while (net->conns)
		conn_close(net->conns);
	if (net->idle_open) {
		uv_close((uv_handle_t *)&net->idle, NULL);
		net->idle_open = false;
	}
	if (net->iter_prep_open) {
		uv_close((uv_handle_t *)&net->iter_prep, NULL);
		net->iter_prep_open = false;
	}
	if (net->budget_timer_open) {
		uv_close((uv_handle_t *)&net->budget_timer, NULL);
		net->budget_timer_open = false;
	}
	if (net->idle_timer_open) {
		uv_close((uv_handle_t *)&net->idle_timer, NULL);
		net->idle_timer_open = false;
	}
	mts_uid_counts_free(&net->conn_uids);
	mts_uid_counts_free(&net->conn_addrs);
	/* No read can come: every stream is closing. */
	free(net->scratch);
	net->scratch = NULL;
}
