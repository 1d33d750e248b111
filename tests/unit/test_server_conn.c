/*
 * test_server_conn.c - the transports and Watch streams on real sockets:
 * a Unix-socket subscriber gets events pushed with its Watch id, in order
 * with the answers to its own requests; a subscriber that stops reading is
 * disconnected once its unwritten output reaches the bound, not buffered
 * without end; a TCP peer speaks the same protocol, cannot Register, and
 * needs the token to SetLimit.
 *
 * The server and its clients share this process: the clients use plain
 * non-blocking sockets and the test runs the loop between their steps.
 */
#include "server.h"

#include <criterion/criterion.h>
#include <errno.h>
#include <netinet/in.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include "log.h"

#define TOKEN "conn-test-token-0123456789"

static uv_loop_t loop;
static struct mts_server srv;
static struct mts_policy pol;
static char segname[64];
static char sockpath[108];

static void setup(void)
{
	mts_log_set_level(MTS_LOG_ERROR);
	snprintf(segname, sizeof(segname), "/mt-s3-conn-%ld", (long)getpid());
	snprintf(sockpath, sizeof(sockpath), "/tmp/mt-s3-conn-%ld.sock",
	         (long)getpid());
	unlink(sockpath);
	mts_policy_defaults(&pol);
	pol.tcp_token = strdup(TOKEN);
	struct mts_config cfg = {
	    .socket_path = sockpath,
	    .segment = segname,
	    .slots = 8,
	    .lanes = 2,
	    .tick_ms = 60000,
	    .threshold = 1000,
	    .policy = &pol,
	    .tcp_addr = "127.0.0.1:0",
	};
	cr_assert_eq(uv_loop_init(&loop), 0);
	cr_assert_eq(mts_server_init(&srv, &loop, &cfg), 0);
	cr_assert_gt(srv.tcp_port, 0);
}

static void teardown(void)
{
	mts_server_stop(&srv);
	uv_run(&loop, UV_RUN_DEFAULT);
	mts_server_free(&srv);
	cr_assert_eq(uv_loop_close(&loop), 0, "a handle was left open");
	mtshm_unlink(segname);
	mts_policy_free(&pol);
	cr_assert_neq(access(sockpath, F_OK), 0, "socket file left behind");
}

TestSuite(conn, .init = setup, .fini = teardown, .timeout = 60);

struct client {
	int fd;
	uint8_t buf[1 << 16];
	size_t len;
};

static void client_unix(struct client *c)
{
	struct sockaddr_un sa = {.sun_family = AF_UNIX};
	snprintf(sa.sun_path, sizeof(sa.sun_path), "%s", sockpath);
	c->fd = socket(AF_UNIX, SOCK_STREAM, 0);
	cr_assert_geq(c->fd, 0);
	cr_assert_eq(connect(c->fd, (struct sockaddr *)&sa, sizeof(sa)), 0);
	c->len = 0;
}

static void client_tcp(struct client *c)
{
	struct sockaddr_in sa = {.sin_family = AF_INET,
	                         .sin_port = htons(srv.tcp_port),
	                         .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
	c->fd = socket(AF_INET, SOCK_STREAM, 0);
	cr_assert_geq(c->fd, 0);
	cr_assert_eq(connect(c->fd, (struct sockaddr *)&sa, sizeof(sa)), 0);
	c->len = 0;
}

static void client_send(struct client *c, uint64_t id,
                        Memtally__V1__Request *req)
{
	uint8_t frame[1024];
	req->id = id;
	size_t n = mtframe_pack(&req->base, frame, sizeof(frame));
	cr_assert_gt(n, 0);
	cr_assert_eq(write(c->fd, frame, n), (ssize_t)n);
}

/* Run the loop until one whole Response is readable, and decode it. */
static Memtally__V1__Response *client_recv(struct client *c)
{
	for (int spins = 0; spins < 20000; spins++) {
		uint64_t blen;
		int n = mtframe_decode_len(c->buf, c->len, UINT64_MAX, &blen);
		if (n > 0 && c->len >= (size_t)n + blen) {
			Memtally__V1__Response *r =
			    memtally__v1__response__unpack(NULL, blen,
			                                   c->buf + n);
			cr_assert_not_null(r);
			size_t used = (size_t)n + blen;
			memmove(c->buf, c->buf + used, c->len - used);
			c->len -= used;
			return r;
		}
		uv_run(&loop, UV_RUN_NOWAIT);
		ssize_t got = recv(c->fd, c->buf + c->len,
		                   sizeof(c->buf) - c->len, MSG_DONTWAIT);
		if (got > 0)
			c->len += (size_t)got;
		else if (got == 0)
			return NULL; /* closed by the server */
		else
			cr_assert(errno == EAGAIN || errno == EWOULDBLOCK);
		if (got <= 0)
			poll(NULL, 0, 1);
	}
	cr_assert_fail("no response");
	return NULL;
}

static void watch(struct client *c, uint64_t id)
{
	Memtally__V1__Request req = MEMTALLY__V1__REQUEST__INIT;
	Memtally__V1__Watch w = MEMTALLY__V1__WATCH__INIT;
	req.body_case = MEMTALLY__V1__REQUEST__BODY_WATCH;
	req.watch = &w;
	client_send(c, id, &req);
	Memtally__V1__Response *r = client_recv(c);
	cr_assert_eq(r->id, id);
	cr_assert_eq(r->body_case, MEMTALLY__V1__RESPONSE__BODY_EVENT);
	cr_assert_str_eq(r->event->scope, "fleet");
	memtally__v1__response__free_unpacked(r, NULL);
}

static void set_fleet(struct client *c, uint64_t id, uint64_t bytes,
                      const char *token)
{
	Memtally__V1__Request req = MEMTALLY__V1__REQUEST__INIT;
	Memtally__V1__SetLimit q = MEMTALLY__V1__SET_LIMIT__INIT;
	q.scope_case = MEMTALLY__V1__SET_LIMIT__SCOPE_FLEET;
	q.fleet = 1;
	q.bytes = bytes;
	q.token = (char *)(token ? token : "");
	req.body_case = MEMTALLY__V1__REQUEST__BODY_SET_LIMIT;
	req.set_limit = &q;
	client_send(c, id, &req);
}

Test(conn, watch_pushes_events_in_order)
{
	struct client w, other;
	client_unix(&w);
	client_unix(&other);
	watch(&w, 100);
	/* 50 bytes reserved, so a limit of 10 is `over`. */
	Memtally__V1__Request req = MEMTALLY__V1__REQUEST__INIT;
	Memtally__V1__Admit a = MEMTALLY__V1__ADMIT__INIT;
	a.bytes = 50;
	req.body_case = MEMTALLY__V1__REQUEST__BODY_ADMIT;
	req.admit = &a;
	client_send(&other, 1, &req);
	Memtally__V1__Response *r = client_recv(&other);
	cr_assert(r->admit_result->admitted);
	memtally__v1__response__free_unpacked(r, NULL);

	/* Another connection changes the limit (this test runs as root or
	 * as the server's uid: authorised). The subscriber gets the event
	 * with its Watch id. */
	set_fleet(&other, 2, 10, NULL);
	r = client_recv(&other);
	cr_assert_null(r->error, "%s", r->error ? r->error->message : "");
	cr_assert_eq(r->limit_set->bytes, 10);
	memtally__v1__response__free_unpacked(r, NULL);
	r = client_recv(&w);
	cr_assert_eq(r->id, 100);
	cr_assert_str_eq(r->event->scope, "fleet");
	cr_assert_eq(r->event->state, MEMTALLY__V1__STATE__STATE_OVER);
	cr_assert_eq(r->event->previous, MEMTALLY__V1__STATE__STATE_OK);
	cr_assert_eq(r->event->reserved_bytes, 50);
	cr_assert_eq(r->event->limit, 10);
	memtally__v1__response__free_unpacked(r, NULL);

	/* The subscriber's own request: its event comes first, then the
	 * answer, both on the one stream. */
	set_fleet(&w, 7, 0, NULL);
	r = client_recv(&w);
	cr_assert_eq(r->id, 100);
	cr_assert_eq(r->event->state, MEMTALLY__V1__STATE__STATE_OK);
	memtally__v1__response__free_unpacked(r, NULL);
	r = client_recv(&w);
	cr_assert_eq(r->id, 7);
	cr_assert_eq(r->body_case, MEMTALLY__V1__RESPONSE__BODY_LIMIT_SET);
	memtally__v1__response__free_unpacked(r, NULL);
	cr_assert_eq(srv.reg.stats.events, 3);
	close(w.fd);
	close(other.fd);
}

Test(conn, subscriber_that_never_reads_is_dropped)
{
	struct client w, quiet;
	client_unix(&w);
	client_unix(&quiet);
	watch(&w, 1);
	int small = 4096;
	setsockopt(w.fd, SOL_SOCKET, SO_RCVBUF, &small, sizeof(small));
	/* A reserved figure, and a limit flipped under it: one event per
	 * flip, and w never reads another byte. */
	srv.reg.totals.reserved = 100;
	uint64_t prev, now;
	uint64_t flips = 0;
	while (srv.reg.stats.watch_disconnects == 0) {
		cr_assert_lt(flips, 1000000, "never disconnected");
		cr_assert_eq(mts_limit_set_fleet(&srv.reg, flips % 2 ? 0 : 50,
		                                 &prev, &now),
		             0);
		flips++;
		if (flips % 256 == 0)
			uv_run(&loop, UV_RUN_NOWAIT);
	}
	/* Bounded: the queue never grew much past MTS_OUT_HIGH of events
	 * (about 80 bytes each) plus what the socket buffers hold. */
	cr_assert_lt(flips, (MTS_OUT_HIGH + (8u << 20)) / 40u);
	cr_assert_eq(srv.nconns, 1, "the quiet client stays");
	/* The dropped subscriber sees the stream end. */
	uv_run(&loop, UV_RUN_NOWAIT);
	char buf[65536];
	ssize_t got;
	do
		got = recv(w.fd, buf, sizeof(buf), 0);
	while (got > 0);
	cr_assert_eq(got, 0, "stream not closed (%s)", strerror(errno));
	close(w.fd);
	close(quiet.fd);
}

Test(conn, tcp_speaks_the_protocol_without_credentials)
{
	struct client t;
	client_tcp(&t);
	Memtally__V1__Request req = MEMTALLY__V1__REQUEST__INIT;
	Memtally__V1__GetUsage q = MEMTALLY__V1__GET_USAGE__INIT;
	req.body_case = MEMTALLY__V1__REQUEST__BODY_GET_USAGE;
	req.get_usage = &q;
	client_send(&t, 1, &req);
	Memtally__V1__Response *r = client_recv(&t);
	cr_assert_eq(r->id, 1);
	cr_assert_eq(r->body_case, MEMTALLY__V1__RESPONSE__BODY_USAGE);
	memtally__v1__response__free_unpacked(r, NULL);

	Memtally__V1__Register reg = MEMTALLY__V1__REGISTER__INIT;
	req.body_case = MEMTALLY__V1__REQUEST__BODY_REGISTER;
	req.register_ = &reg;
	client_send(&t, 2, &req);
	r = client_recv(&t);
	cr_assert_not_null(r->error);
	cr_assert_eq(r->error->code,
	             MEMTALLY__V1__ERROR_CODE__ERROR_NO_PEER_CREDENTIALS);
	memtally__v1__response__free_unpacked(r, NULL);

	set_fleet(&t, 3, 1000, NULL);
	r = client_recv(&t);
	cr_assert_not_null(r->error);
	cr_assert_eq(r->error->code,
	             MEMTALLY__V1__ERROR_CODE__ERROR_PERMISSION_DENIED);
	memtally__v1__response__free_unpacked(r, NULL);
	set_fleet(&t, 4, 1000, "not-the-token-at-all");
	r = client_recv(&t);
	cr_assert_not_null(r->error);
	memtally__v1__response__free_unpacked(r, NULL);
	set_fleet(&t, 5, 1000, TOKEN);
	r = client_recv(&t);
	cr_assert_null(r->error);
	cr_assert_eq(r->limit_set->bytes, 1000);
	memtally__v1__response__free_unpacked(r, NULL);
	cr_assert_eq(srv.reg.totals.limit, 1000);

	/* A TCP peer may watch, too. */
	watch(&t, 6);
	close(t.fd);
}
