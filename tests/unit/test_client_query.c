/*
 * test_cli_query.c - the scheduler query library against a scripted fake
 * server.
 *
 * Each test starts a thread that listens on its own Unix socket, decodes
 * the library's requests and answers through a per-test handler, which may
 * answer correctly, with an error, with the wrong id, byte by byte, with
 * garbage, or not at all. That exercises the parts a real server rarely
 * shows: partial reads, timeouts, out-of-step streams and reconnection.
 */
#define _GNU_SOURCE

#include <errno.h>
#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include <criterion/criterion.h>

#define FX_NO_SERVER /* a scripted fake plays the server */
#include "test_server_fixture.h"

#include "memtally.pb-c.h"
#include "memtally_query.h"
#include "mtframe.h"

/* ---- the fake server ----------------------------------------------- */

struct fake;
/* Answer `req`, the n-th request of the server (from 1). Return false to
 * close the connection. */
typedef bool (*fake_handler)(struct fake *f, int fd,
                             const Memtally__V1__Request *req, int n);

struct fake {
	char path[108];
	int lfd;
	pthread_t thread;
	fake_handler handler;
	atomic_int requests;
	atomic_int connections;
	atomic_int closed;   /* connections the fake has closed */
	uint64_t ids[64];    /* ids of the requests seen */
	char groups[64][64]; /* group of each GetUsage/ListProcesses */
};

static int test_mult(void)
{
	const char *m = getenv("MEMTALLY_TEST_TIMEOUT_MULT");
	return m && atoi(m) > 0 ? atoi(m) : 1;
}

static void write_all(int fd, const void *buf, size_t len)
{
	const uint8_t *p = buf;
	while (len) {
		ssize_t n = send(fd, p, len, MSG_NOSIGNAL);
		if (n <= 0)
			return;
		p += n;
		len -= (size_t)n;
	}
}

static void send_response(int fd, Memtally__V1__Response *r)
{
	size_t n = mtframe_packed_size(&r->base);
	uint8_t *buf = malloc(n);
	cr_assert_not_null(buf);
	mtframe_pack(&r->base, buf, n);
	write_all(fd, buf, n);
	free(buf);
}

/* Read one request frame; NULL at EOF. */
static Memtally__V1__Request *read_request(int fd)
{
	uint8_t buf[4096];
	size_t len = 0;
	for (;;) {
		uint64_t blen;
		int pre = mtframe_decode_len(buf, len, sizeof(buf), &blen);
		cr_assert_geq(pre, 0, "the library sent a bad length prefix");
		if (pre > 0 && len >= (size_t)pre + blen) {
			cr_assert_eq(len, (size_t)pre + blen,
			             "the library pipelined unasked");
			Memtally__V1__Request *req =
			    memtally__v1__request__unpack(NULL, blen,
			                                  buf + pre);
			cr_assert_not_null(req, "undecodable request");
			return req;
		}
		ssize_t n = read(fd, buf + len, sizeof(buf) - len);
		if (n <= 0)
			return NULL;
		len += (size_t)n;
	}
}

static void *fake_main(void *arg)
{
	struct fake *f = arg;
	for (;;) {
		int fd = accept(f->lfd, NULL, NULL);
		if (fd < 0)
			return NULL; /* shut down */
		atomic_fetch_add(&f->connections, 1);
		Memtally__V1__Request *req;
		bool open = true;
		while (open && (req = read_request(fd))) {
			int n = atomic_fetch_add(&f->requests, 1) + 1;
			if (n <= 64) {
				f->ids[n - 1] = req->id;
				const char *g = "";
				if (req->body_case ==
				    MEMTALLY__V1__REQUEST__BODY_LIST_PROCESSES)
					g = req->list_processes->group;
				else if (
				    req->body_case ==
				        MEMTALLY__V1__REQUEST__BODY_GET_USAGE &&
				    req->get_usage->scope_case ==
				        MEMTALLY__V1__GET_USAGE__SCOPE_GROUP)
					g = req->get_usage->group;
				snprintf(f->groups[n - 1], 64, "%s", g);
			}
			open = f->handler(f, fd, req, n);
			memtally__v1__request__free_unpacked(req, NULL);
		}
		close(fd);
		atomic_fetch_add(&f->closed, 1);
	}
}

static void fake_start(struct fake *f, fake_handler h)
{
	static int seq;
	memset(f, 0, sizeof(*f));
	f->handler = h;
	snprintf(f->path, sizeof(f->path), "/tmp/mtq-test-%d-%d.sock",
	         (int)getpid(), seq++);
	f->lfd = fx_listen_unix(f->path);
	cr_assert_geq(f->lfd, 0);
	cr_assert_eq(pthread_create(&f->thread, NULL, fake_main, f), 0);
}

static void fake_stop(struct fake *f)
{
	shutdown(f->lfd, SHUT_RDWR); /* wakes accept() */
	pthread_join(f->thread, NULL);
	close(f->lfd);
	unlink(f->path);
}

/* ---- canned answers ------------------------------------------------ */

static bool answer_usage(struct fake *f, int fd,
                         const Memtally__V1__Request *req, int n)
{
	Memtally__V1__GroupUsage g[2], *gp[2] = {&g[0], &g[1]};
	memtally__v1__group_usage__init(&g[0]);
	memtally__v1__group_usage__init(&g[1]);
	g[0].name = "batch";
	g[0].bytes = 1000;
	g[0].peak = 2000;
	g[0].processes = 2;
	g[1].name = "web";
	g[1].bytes = 5000;
	g[1].limit = 8000;
	g[1].state = MEMTALLY__V1__STATE__STATE_HIGH;
	g[1].reserved_bytes = 300;
	g[1].error_bytes = 65536;
	Memtally__V1__ProcessInfo p = MEMTALLY__V1__PROCESS_INFO__INIT;
	p.pid = req->get_usage->pid;
	p.group = "web";
	p.bytes = 4096;
	p.comm = "worker";
	p.task = "t-1";
	p.over_limit = 1;
	p.threads = 3;

	Memtally__V1__Usage u = MEMTALLY__V1__USAGE__INIT;
	u.fleet_bytes = 6000;
	u.fleet_peak = 7000;
	u.fleet_limit = 10000;
	u.reserved_bytes = 300;
	u.state = MEMTALLY__V1__STATE__STATE_OVER;
	u.processes = 4;
	u.error_bytes = 262144;
	u.unregistered = 1;
	u.ticks = 99;
	u.threshold = 65536;
	u.slots = 64;
	u.slots_free = 60;
	switch (req->get_usage->scope_case) {
	case MEMTALLY__V1__GET_USAGE__SCOPE_GROUP:
		u.group = strcmp(req->get_usage->group, "web") ? NULL : &g[1];
		break;
	case MEMTALLY__V1__GET_USAGE__SCOPE_PID:
		u.process = &p;
		break;
	default:
		u.n_groups = 2;
		u.groups = gp;
	}
	Memtally__V1__Response r = MEMTALLY__V1__RESPONSE__INIT;
	r.id = req->id;
	r.body_case = MEMTALLY__V1__RESPONSE__BODY_USAGE;
	r.usage = &u;
	send_response(fd, &r);
	return true;
}

static bool answer_processes(struct fake *f, int fd,
                             const Memtally__V1__Request *req, int n)
{
	Memtally__V1__ProcessInfo p[3], *pp[3] = {&p[0], &p[1], &p[2]};
	static const char *groups[3] = {"a", "b", "a"};
	for (int i = 0; i < 3; i++) {
		memtally__v1__process_info__init(&p[i]);
		p[i].pid = 100 + (uint32_t)i;
		p[i].group = (char *)groups[i];
		p[i].bytes = 3000 - 1000 * (uint64_t)i;
		p[i].comm = i == 1 ? "" : "proc";
		p[i].corrupt = i == 2;
		p[i].registered_ns = 42;
	}
	Memtally__V1__ProcessList pl = MEMTALLY__V1__PROCESS_LIST__INIT;
	const char *want = req->list_processes->group;
	Memtally__V1__ProcessInfo *sel[3];
	for (int i = 0; i < 3; i++)
		if (!want[0] || !strcmp(want, groups[i]))
			sel[pl.n_processes++] = pp[i];
	pl.processes = sel;
	Memtally__V1__Response r = MEMTALLY__V1__RESPONSE__INIT;
	r.id = req->id;
	r.body_case = MEMTALLY__V1__RESPONSE__BODY_PROCESS_LIST;
	r.process_list = &pl;
	send_response(fd, &r);
	return true;
}

static bool answer_any(struct fake *f, int fd, const Memtally__V1__Request *req,
                       int n)
{
	if (req->body_case == MEMTALLY__V1__REQUEST__BODY_LIST_PROCESSES)
		return answer_processes(f, fd, req, n);
	return answer_usage(f, fd, req, n);
}

static void send_error(int fd, uint64_t id, Memtally__V1__ErrorCode code,
                       char *msg)
{
	Memtally__V1__Error e = MEMTALLY__V1__ERROR__INIT;
	e.code = code;
	e.message = msg;
	Memtally__V1__Response r = MEMTALLY__V1__RESPONSE__INIT;
	r.id = id;
	r.error = &e;
	send_response(fd, &r);
}

/* ---- tests --------------------------------------------------------- */

static memtally_query *open_ok(struct fake *f, int timeout_ms)
{
	memtally_query *q = NULL;
	int err = memtally_query_open(&q, f->path, timeout_ms);
	cr_assert_eq(err, 0, "open: %s", strerror(-err));
	cr_assert_not_null(q);
	return q;
}

/*
 * A test against a fake server answering with `handler`, through a handle
 * `q` opened on it with a timeout of `open_ms` (0: the default, 5 s): the body
 * gets both; the handle is closed and the server stopped after it.
 */
#define FAKE_TEST_OPEN(suite, name, handler, open_ms, ...)                     \
	static void suite##_##name##_body(struct fake *f, memtally_query *q);  \
	Test(suite, name, ##__VA_ARGS__)                                       \
	{                                                                      \
		struct fake fk;                                                \
		fake_start(&fk, handler);                                      \
		memtally_query *q = open_ok(&fk, open_ms);                     \
		suite##_##name##_body(&fk, q);                                 \
		memtally_query_close(q);                                       \
		fake_stop(&fk);                                                \
	}                                                                      \
	static void suite##_##name##_body(struct fake *f, memtally_query *q)

#define FAKE_TEST(suite, name, handler, ...)                                   \
	FAKE_TEST_OPEN(suite, name, handler, 0, ##__VA_ARGS__)

FAKE_TEST(query, usage_fleet_copies_every_field, answer_usage)
{
	struct memtally_usage *u;
	cr_assert_eq(memtally_query_usage(q, &u), 0);
	cr_expect_eq(u->bytes, 6000);
	cr_expect_eq(u->peak, 7000);
	cr_expect_eq(u->limit, 10000);
	cr_expect_eq(u->reserved, 300);
	cr_expect_eq(u->state, MEMTALLY_STATE_OVER);
	cr_expect_eq(u->processes, 4);
	cr_expect_eq(u->error_bytes, 262144);
	cr_expect_eq(u->unregistered, 1);
	cr_expect_eq(u->ticks, 99);
	cr_expect_eq(u->threshold, 65536);
	cr_expect_eq(u->slots, 64);
	cr_expect_eq(u->slots_free, 60);
	cr_assert_eq(u->n_groups, 2);
	cr_expect_str_eq(u->groups[0].name, "batch");
	cr_expect_eq(u->groups[0].bytes, 1000);
	cr_expect_eq(u->groups[0].peak, 2000);
	cr_expect_eq(u->groups[0].limit, 0);
	cr_expect_eq(u->groups[0].processes, 2);
	cr_expect_str_eq(u->groups[1].name, "web");
	cr_expect_eq(u->groups[1].state, MEMTALLY_STATE_HIGH);
	cr_expect_eq(u->groups[1].limit, 8000);
	cr_expect_eq(u->groups[1].reserved, 300);
	cr_expect_eq(u->groups[1].error_bytes, 65536);
	cr_expect_str_eq(memtally_query_last_error(q), "");
	memtally_usage_free(u);
}

FAKE_TEST(query, group_scope_returns_one_group, answer_usage)
{
	struct memtally_usage *u;
	cr_assert_eq(memtally_query_group(q, "web", &u), 0);
	cr_expect_str_eq(f->groups[0], "web");
	cr_assert_eq(u->n_groups, 1);
	cr_expect_str_eq(u->groups[0].name, "web");
	cr_expect_eq(u->groups[0].bytes, 5000);
	cr_expect_eq(u->bytes, 6000);
	memtally_usage_free(u);
	/* A Usage without the group asked for is the server's fault. */
	cr_expect_eq(memtally_query_group(q, "nope", &u), MEMTALLY_EPROTO);
	cr_expect_null(u);
	cr_expect_eq(memtally_query_group(q, NULL, &u), -EINVAL);
}

FAKE_TEST(query, process_scope, answer_usage)
{
	struct memtally_process *p;
	cr_assert_eq(memtally_query_process(q, 4242, &p), 0);
	cr_expect_eq(p->pid, 4242);
	cr_expect_str_eq(p->group, "web");
	cr_expect_str_eq(p->comm, "worker");
	cr_expect_str_eq(p->task, "t-1");
	cr_expect_eq(p->bytes, 4096);
	cr_expect(p->over_limit);
	cr_expect_not(p->corrupt);
	cr_expect_eq(p->threads, 3);
	memtally_process_free(p);
	cr_expect_eq(memtally_query_process(q, 0, &p), -EINVAL);
	cr_expect_null(p);
}

FAKE_TEST(query, processes_all_filtered_and_empty, answer_processes)
{
	struct memtally_process *p;
	size_t n;
	cr_assert_eq(memtally_query_processes(q, NULL, &p, &n), 0);
	cr_assert_eq(n, 3);
	cr_expect_eq(p[0].pid, 100);
	cr_expect_eq(p[0].bytes, 3000);
	cr_expect_str_eq(p[1].comm, "");
	cr_expect_str_eq(p[1].task, "");
	cr_expect(p[2].corrupt);
	cr_expect_eq(p[2].registered_ns, 42);
	cr_expect_str_eq(p[2].group, "a");
	memtally_processes_free(p);

	cr_assert_eq(memtally_query_processes(q, "a", &p, &n), 0);
	cr_expect_str_eq(f->groups[1], "a");
	cr_expect_eq(n, 2);
	memtally_processes_free(p);

	cr_assert_eq(memtally_query_processes(q, "none", &p, &n), 0);
	cr_expect_eq(n, 0);
	cr_expect_null(p);
	cr_expect_eq(atomic_load(&f->connections), 1, "one connection reused");
}

FAKE_TEST(query, request_ids_increase, answer_any)
{
	struct memtally_usage *u;
	for (int i = 0; i < 5; i++) {
		cr_assert_eq(memtally_query_usage(q, &u), 0);
		memtally_usage_free(u);
	}
	cr_assert_eq(atomic_load(&f->requests), 5);
	for (int i = 1; i < 5; i++)
		cr_expect_gt(f->ids[i], f->ids[i - 1]);
	cr_expect_neq(f->ids[0], 0, "id 0 is what the server uses for errors");
}

static bool answer_wrong_id_first(struct fake *f, int fd,
                                  const Memtally__V1__Request *req, int n)
{
	if (n == 1) {
		Memtally__V1__Request copy = *req;
		copy.id += 7;
		return answer_usage(f, fd, &copy, n);
	}
	return answer_usage(f, fd, req, n);
}

FAKE_TEST(query, wrong_id_is_eproto_then_reconnects, answer_wrong_id_first)
{
	struct memtally_usage *u;
	cr_expect_eq(memtally_query_usage(q, &u), MEMTALLY_EPROTO);
	cr_expect_null(u);
	cr_expect_neq(strstr(memtally_query_last_error(q), "id"), NULL);
	cr_assert_eq(memtally_query_usage(q, &u), 0);
	cr_expect_eq(u->bytes, 6000);
	cr_expect_str_eq(memtally_query_last_error(q), "");
	cr_expect_eq(atomic_load(&f->connections), 2);
	memtally_usage_free(u);
}

static const struct {
	Memtally__V1__ErrorCode code;
	int err;
} error_map[] = {
    {MEMTALLY__V1__ERROR_CODE__ERROR_NOT_FOUND, MEMTALLY_ENOTFOUND},
    {MEMTALLY__V1__ERROR_CODE__ERROR_PERMISSION_DENIED, MEMTALLY_EPERM},
    {MEMTALLY__V1__ERROR_CODE__ERROR_NO_SLOTS, MEMTALLY_ENOSLOTS},
    {MEMTALLY__V1__ERROR_CODE__ERROR_UNSUPPORTED, MEMTALLY_EUNSUPPORTED},
    {MEMTALLY__V1__ERROR_CODE__ERROR_INVALID_REQUEST, MEMTALLY_EBADREQUEST},
    {MEMTALLY__V1__ERROR_CODE__ERROR_INTERNAL, MEMTALLY_ESERVER},
    {MEMTALLY__V1__ERROR_CODE__ERROR_NO_PEER_CREDENTIALS, MEMTALLY_ESERVER},
};
#define N_ERRORS (sizeof(error_map) / sizeof(error_map[0]))

static bool answer_errors(struct fake *f, int fd,
                          const Memtally__V1__Request *req, int n)
{
	if ((size_t)n <= N_ERRORS) {
		char msg[32];
		snprintf(msg, sizeof(msg), "error %d", n);
		send_error(fd, req->id, error_map[n - 1].code, msg);
		return true;
	}
	return answer_any(f, fd, req, n);
}

FAKE_TEST(query, server_errors_map_and_keep_the_connection, answer_errors)
{
	for (size_t i = 0; i < N_ERRORS; i++) {
		struct memtally_process *p;
		size_t n;
		cr_expect_eq(memtally_query_processes(q, "g", &p, &n),
		             error_map[i].err, "error %zu", i + 1);
		cr_expect_null(p);
		cr_expect_eq(n, 0);
		char want[32];
		snprintf(want, sizeof(want), "error %zu", i + 1);
		cr_expect_str_eq(memtally_query_last_error(q), want);
	}
	struct memtally_usage *u;
	cr_assert_eq(memtally_query_usage(q, &u), 0);
	memtally_usage_free(u);
	cr_expect_eq(atomic_load(&f->connections), 1);
}

/* The server could not decode the request: error with id 0, then close. */
static bool answer_undecodable_first(struct fake *f, int fd,
                                     const Memtally__V1__Request *req, int n)
{
	if (n == 1) {
		send_error(fd, 0, MEMTALLY__V1__ERROR_CODE__ERROR_UNDECODABLE,
		           "");
		return false;
	}
	return answer_any(f, fd, req, n);
}

FAKE_TEST(query, id0_error_answers_and_reconnects, answer_undecodable_first)
{
	struct memtally_usage *u;
	cr_expect_eq(memtally_query_usage(q, &u), MEMTALLY_ESERVER);
	cr_expect_str_eq(memtally_query_last_error(q), "server error code 6");
	cr_assert_eq(memtally_query_usage(q, &u), 0);
	memtally_usage_free(u);
	cr_expect_eq(atomic_load(&f->connections), 2);
}

/* Every response byte in its own write, with pauses: partial reads. */
static bool answer_byte_by_byte(struct fake *f, int fd,
                                const Memtally__V1__Request *req, int n)
{
	int pair[2];
	cr_assert_eq(socketpair(AF_UNIX, SOCK_STREAM, 0, pair), 0);
	answer_any(f, pair[0], req, n);
	close(pair[0]);
	uint8_t b;
	while (read(pair[1], &b, 1) == 1) {
		write_all(fd, &b, 1);
		usleep(500);
	}
	close(pair[1]);
	return true;
}

FAKE_TEST_OPEN(query, response_in_single_bytes, answer_byte_by_byte,
               5000 * test_mult())
{
	struct memtally_process *p;
	size_t n;
	cr_assert_eq(memtally_query_processes(q, NULL, &p, &n), 0);
	cr_expect_eq(n, 3);
	cr_expect_str_eq(p[0].comm, "proc");
	memtally_processes_free(p);
	struct memtally_usage *u;
	cr_assert_eq(memtally_query_usage(q, &u), 0);
	cr_expect_eq(u->n_groups, 2);
	memtally_usage_free(u);
}

static bool answer_nothing(struct fake *f, int fd,
                           const Memtally__V1__Request *req, int n)
{
	return true;
}

static int64_t mono_ms(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

FAKE_TEST_OPEN(query, silent_server_times_out, answer_nothing, 200,
               .timeout = 20)
{
	struct memtally_usage *u;
	int64_t t0 = mono_ms();
	cr_expect_eq(memtally_query_usage(q, &u), -ETIMEDOUT);
	int64_t took = mono_ms() - t0;
	cr_expect_geq(took, 190, "gave up early: %lld ms", (long long)took);
	cr_expect_lt(took, 2000 * test_mult(), "took %lld ms", (long long)took);
	cr_expect_null(u);
}

static bool answer_close(struct fake *f, int fd,
                         const Memtally__V1__Request *req, int n)
{
	return false;
}

FAKE_TEST(query, server_close_is_econnreset, answer_close)
{
	struct memtally_usage *u;
	/* The first call takes the idle connection for a stale one and
	 * tries once more on a new connection, which fails the same way. */
	cr_expect_eq(memtally_query_usage(q, &u), -ECONNRESET);
	cr_expect_neq(memtally_query_last_error(q)[0], '\0');
	cr_expect_eq(atomic_load(&f->connections), 2);
	cr_expect_eq(atomic_load(&f->requests), 2);
	/* The next call reconnects; a fresh connection is not retried. */
	cr_expect_eq(memtally_query_usage(q, &u), -ECONNRESET);
	cr_expect_eq(atomic_load(&f->connections), 3);
	cr_expect_eq(atomic_load(&f->requests), 3);
}

/* The server closes each connection after one answer, as a restart
 * between two queries would. */
static bool answer_once(struct fake *f, int fd,
                        const Memtally__V1__Request *req, int n)
{
	answer_any(f, fd, req, n);
	return false;
}

FAKE_TEST(query, stale_connection_is_retried_once, answer_once)
{
	struct memtally_usage *u;
	for (int i = 0; i < 3; i++) {
		/* The server has closed the connection query i-1 used. */
		uint64_t end = fx_deadline_ms(5000);
		while (atomic_load(&f->closed) < i) {
			cr_assert_lt(fx_ms(), end, "the fake never closed");
			poll(NULL, 0, 1);
		}
		cr_assert_eq(memtally_query_usage(q, &u), 0, "query %d", i);
		cr_expect_str_eq(memtally_query_last_error(q), "");
		memtally_usage_free(u);
	}
	/* Query 0 used the connection from open; 1 and 2 each found the
	 * previous one closed and reconnected without failing. */
	cr_expect_eq(atomic_load(&f->connections), 3);
	cr_expect_eq(atomic_load(&f->requests), 3);
}

static bool answer_garbage(struct fake *f, int fd,
                           const Memtally__V1__Request *req, int n)
{
	static const uint8_t bad_varint[11] = {
	    0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01};
	static const uint8_t huge[] = {0x80, 0x80, 0x80, 0x40}; /* 128 MiB */
	static const uint8_t junk[] = {0x03, 0xff, 0xff, 0xff};
	switch (n) {
	case 1:
		write_all(fd, bad_varint, sizeof(bad_varint));
		break;
	case 2:
		write_all(fd, huge, sizeof(huge));
		break;
	case 3:
		write_all(fd, junk, sizeof(junk));
		break;
	default:
		return answer_any(f, fd, req, n);
	}
	return true;
}

FAKE_TEST(query, garbled_answers_are_eproto, answer_garbage)
{
	struct memtally_usage *u;
	for (int i = 0; i < 3; i++) {
		cr_expect_eq(memtally_query_usage(q, &u), MEMTALLY_EPROTO,
		             "garbage %d", i + 1);
		cr_expect_neq(memtally_query_last_error(q)[0], '\0');
	}
	cr_assert_eq(memtally_query_usage(q, &u), 0);
	memtally_usage_free(u);
	cr_expect_eq(atomic_load(&f->connections), 4);
}

static size_t put_varint(uint8_t *p, uint64_t v)
{
	size_t n = 0;
	for (; v >= 0x80; v >>= 7)
		p[n++] = (uint8_t)(v | 0x80);
	p[n++] = (uint8_t)v;
	return n;
}

/* 8 MiB of empty process entries (2 bytes each), then a real answer:
 * unpacked in full they would be ~900 MB. */
static bool answer_empty_entries(struct fake *f, int fd,
                                 const Memtally__V1__Request *req, int n)
{
	if (n > 1)
		return answer_processes(f, fd, req, n);
	size_t plen = (size_t)8 << 20, cap = plen + 64, off = 0;
	uint8_t *b = malloc(cap);
	cr_assert_not_null(b);
	uint8_t head[32];
	size_t h = 0;
	head[h++] = 0x08; /* id */
	h += put_varint(head + h, req->id);
	head[h++] = 0x2a; /* process_list */
	h += put_varint(head + h, plen);
	off += put_varint(b, h + plen);
	memcpy(b + off, head, h);
	off += h;
	for (size_t i = 0; i < plen; i += 2) {
		b[off++] = 0x0a; /* processes, empty */
		b[off++] = 0x00;
	}
	write_all(fd, b, off);
	free(b);
	return true;
}

/* 8 MiB built and read: a handle's default wait (5 s) was too short for
 * a ThreadSanitizer build on a loaded machine, which timed out instead. */
FAKE_TEST_OPEN(query, an_answer_that_would_unpack_huge_is_eproto,
               answer_empty_entries, 60000, .timeout = 120)
{
	struct memtally_process *p;
	size_t n;
	int err = memtally_query_processes(q, NULL, &p, &n);
	cr_assert_eq(err, MEMTALLY_EPROTO, "%d: %s", err,
	             memtally_query_last_error(q));
	cr_expect(strstr(memtally_query_last_error(q), "undecodable"), "%s",
	          memtally_query_last_error(q));
	cr_assert_eq(memtally_query_processes(q, NULL, &p, &n), 0);
	cr_expect_eq(n, 3);
	memtally_processes_free(p);
}

/* A call refused before it reaches the server reports no earlier reason. */
FAKE_TEST(query, a_refused_call_reports_no_earlier_reason, answer_garbage)
{
	struct memtally_usage *u;
	cr_assert_eq(memtally_query_usage(q, &u), MEMTALLY_EPROTO);
	cr_assert_neq(memtally_query_last_error(q)[0], '\0');
	struct memtally_admit_req bad = {0};
	struct memtally_admit_result *ar;
	cr_assert_eq(memtally_query_admit(q, &bad, &ar), -EINVAL);
	cr_expect_str_eq(memtally_query_last_error(q), "");
}

/* A ProcessList in answer to GetUsage: in step, but not what was asked. */
static bool answer_wrong_body(struct fake *f, int fd,
                              const Memtally__V1__Request *req, int n)
{
	if (req->body_case == MEMTALLY__V1__REQUEST__BODY_GET_USAGE) {
		Memtally__V1__ListProcesses lp =
		    MEMTALLY__V1__LIST_PROCESSES__INIT;
		Memtally__V1__Request copy = *req;
		copy.body_case = MEMTALLY__V1__REQUEST__BODY_LIST_PROCESSES;
		copy.list_processes = &lp;
		return answer_processes(f, fd, &copy, n);
	}
	return answer_processes(f, fd, req, n);
}

FAKE_TEST(query, wrong_body_is_eproto, answer_wrong_body)
{
	struct memtally_usage *u;
	cr_expect_eq(memtally_query_usage(q, &u), MEMTALLY_EPROTO);
	struct memtally_process *p;
	size_t n;
	cr_assert_eq(memtally_query_processes(q, NULL, &p, &n), 0);
	memtally_processes_free(p);
}

Test(query, open_errors)
{
	memtally_query *q = (memtally_query *)&q;
	cr_expect_eq(memtally_query_open(NULL, "/tmp/x", 0), -EINVAL);
	cr_expect_eq(memtally_query_open(&q, "/nonexistent/memtally.sock", 0),
	             -ENOENT);
	cr_expect_null(q);
	cr_expect_eq(memtally_query_open(&q, "", 0), -EINVAL);
	char long_path[200];
	memset(long_path, 'a', sizeof(long_path) - 1);
	long_path[sizeof(long_path) - 1] = '\0';
	long_path[0] = '/';
	cr_expect_eq(memtally_query_open(&q, long_path, 0), -ENAMETOOLONG);

	/* A socket nobody listens on any more. */
	struct fake f;
	fake_start(&f, answer_any);
	fake_stop(&f);
	int s = socket(AF_UNIX, SOCK_STREAM, 0);
	struct sockaddr_un sa = {.sun_family = AF_UNIX};
	strcpy(sa.sun_path, f.path);
	cr_assert_eq(bind(s, (struct sockaddr *)&sa, sizeof(sa)), 0);
	close(s);
	cr_expect_eq(memtally_query_open(&q, f.path, 0), -ECONNREFUSED);
	unlink(f.path);
}

Test(query, default_socket_from_environment)
{
	unsetenv("MEMTALLY_SOCKET");
	cr_expect_str_eq(memtally_query_default_socket(),
	                 MEMTALLY_DEFAULT_SOCKET);
	setenv("MEMTALLY_SOCKET", "", 1);
	cr_expect_str_eq(memtally_query_default_socket(),
	                 MEMTALLY_DEFAULT_SOCKET);
	struct fake f;
	fake_start(&f, answer_any);
	setenv("MEMTALLY_SOCKET", f.path, 1);
	cr_expect_str_eq(memtally_query_default_socket(), f.path);
	memtally_query *q;
	cr_assert_eq(memtally_query_open(&q, NULL, 0), 0);
	struct memtally_usage *u;
	cr_expect_eq(memtally_query_usage(q, &u), 0);
	memtally_usage_free(u);
	memtally_query_close(q);
	fake_stop(&f);
}

Test(query, destructors_and_names)
{
	memtally_query_close(NULL);
	memtally_usage_free(NULL);
	memtally_process_free(NULL);
	memtally_processes_free(NULL);
	cr_expect_str_eq(memtally_query_last_error(NULL), "");
	cr_expect_str_eq(memtally_state_name(MEMTALLY_STATE_OK), "ok");
	cr_expect_str_eq(memtally_state_name(MEMTALLY_STATE_HIGH), "high");
	cr_expect_str_eq(memtally_state_name(MEMTALLY_STATE_OVER), "over");
	cr_expect_str_eq(memtally_state_name((enum memtally_state)7),
	                 "unknown");
}

/* ---- admission, release, limits ------------------------------------ */

/* What the fake saw of the latest state-changing request. */
static struct {
	uint64_t bytes;
	char group[64];
	char task[64];
	uint32_t ttl;
	char reservation[64];
	char token[64];
	int scope_case;
	uint32_t pid;
} seen;

static void process_info(Memtally__V1__ProcessInfo *p, uint32_t pid,
                         uint64_t bytes)
{
	memtally__v1__process_info__init(p);
	p->pid = pid;
	p->group = "etl";
	p->bytes = bytes;
	p->rss_bytes = bytes + 4096;
	p->state = MEMTALLY__V1__STATE__STATE_HIGH;
	p->comm = "worker";
	p->task = "";
}

/* Admit: granted below 1000 bytes, else denied with two top processes.
 * Release and SetLimit: echoed. Usage and lists: as answer_any. */
static bool answer_admin(struct fake *f, int fd,
                         const Memtally__V1__Request *req, int n)
{
	Memtally__V1__Response r = MEMTALLY__V1__RESPONSE__INIT;
	r.id = req->id;
	Memtally__V1__AdmitResult ar = MEMTALLY__V1__ADMIT_RESULT__INIT;
	Memtally__V1__ProcessInfo top[2], *tp[2] = {&top[0], &top[1]};
	Memtally__V1__Released rel = MEMTALLY__V1__RELEASED__INIT;
	Memtally__V1__LimitSet ls = MEMTALLY__V1__LIMIT_SET__INIT;
	switch (req->body_case) {
	case MEMTALLY__V1__REQUEST__BODY_ADMIT:
		seen.bytes = req->admit->bytes;
		snprintf(seen.group, 64, "%s", req->admit->group);
		snprintf(seen.task, 64, "%s", req->admit->task);
		seen.ttl = req->admit->ttl_seconds;
		r.body_case = MEMTALLY__V1__RESPONSE__BODY_ADMIT_RESULT;
		r.admit_result = &ar;
		ar.admitted = req->admit->bytes < 1000;
		ar.fleet_bytes = 500;
		ar.reserved_bytes = 300;
		ar.requested_bytes = req->admit->bytes;
		ar.limit = 1000;
		ar.limit_scope = "fleet";
		ar.measure = "accounted";
		if (ar.admitted) {
			ar.reservation = "r-42";
			ar.ttl_seconds = 60;
		} else {
			ar.reason = "fleet limit";
			process_info(&top[0], 7, 400);
			process_info(&top[1], 8, 100);
			ar.n_top = 2;
			ar.top = tp;
		}
		break;
	case MEMTALLY__V1__REQUEST__BODY_RELEASE:
		snprintf(seen.reservation, 64, "%s", req->release->reservation);
		snprintf(seen.token, 64, "%s", req->release->token);
		if (strcmp(req->release->reservation, "r-42") != 0) {
			send_error(fd, req->id,
			           MEMTALLY__V1__ERROR_CODE__ERROR_NOT_FOUND,
			           "no reservation");
			return true;
		}
		r.body_case = MEMTALLY__V1__RESPONSE__BODY_RELEASED;
		r.released = &rel;
		rel.reservation = req->release->reservation;
		rel.bytes = 600;
		break;
	case MEMTALLY__V1__REQUEST__BODY_SET_LIMIT:
		seen.scope_case = (int)req->set_limit->scope_case;
		seen.bytes = req->set_limit->bytes;
		seen.pid = req->set_limit->pid;
		snprintf(seen.group, 64, "%s",
		         req->set_limit->scope_case ==
		                 MEMTALLY__V1__SET_LIMIT__SCOPE_GROUP
		             ? req->set_limit->group
		             : "");
		snprintf(seen.token, 64, "%s", req->set_limit->token);
		if (strcmp(req->set_limit->token, "sesame") != 0) {
			send_error(
			    fd, req->id,
			    MEMTALLY__V1__ERROR_CODE__ERROR_PERMISSION_DENIED,
			    "SetLimit needs root");
			return true;
		}
		r.body_case = MEMTALLY__V1__RESPONSE__BODY_LIMIT_SET;
		r.limit_set = &ls;
		ls.bytes = req->set_limit->bytes;
		ls.previous = 12345;
		break;
	default:
		return answer_any(f, fd, req, n);
	}
	send_response(fd, &r);
	return true;
}

FAKE_TEST(admit, granted_and_denied_copy_every_field, answer_admin)
{
	struct memtally_admit_req rq = {
	    .bytes = 600, .group = "etl", .task = "t-9", .ttl_seconds = 30};
	struct memtally_admit_result *a;
	cr_assert_eq(memtally_query_admit(q, &rq, &a), 0);
	cr_expect_eq(seen.bytes, 600);
	cr_expect_str_eq(seen.group, "etl");
	cr_expect_str_eq(seen.task, "t-9");
	cr_expect_eq(seen.ttl, 30);
	cr_expect(a->admitted);
	cr_expect_str_eq(a->reservation, "r-42");
	cr_expect_str_eq(a->reason, "");
	cr_expect_eq(a->ttl_seconds, 60);
	cr_expect_eq(a->n_top, 0);
	cr_expect_null(a->top);
	memtally_admit_result_free(a);

	rq = (struct memtally_admit_req){.bytes = 5000};
	cr_assert_eq(memtally_query_admit(q, &rq, &a), 0, "a denial is 0");
	cr_expect_str_eq(seen.group, "", "NULL group goes as empty");
	cr_expect_not(a->admitted);
	cr_expect_str_eq(a->reservation, "");
	cr_expect_str_eq(a->reason, "fleet limit");
	cr_expect_eq(a->fleet_bytes, 500);
	cr_expect_eq(a->reserved_bytes, 300);
	cr_expect_eq(a->requested_bytes, 5000);
	cr_expect_eq(a->limit, 1000);
	cr_expect_str_eq(a->limit_scope, "fleet");
	cr_expect_str_eq(a->measure, "accounted");
	cr_assert_eq(a->n_top, 2);
	cr_expect_eq(a->top[0].pid, 7);
	cr_expect_eq(a->top[0].bytes, 400);
	cr_expect_eq(a->top[0].rss, 400 + 4096);
	cr_expect_eq(a->top[0].state, MEMTALLY_STATE_HIGH);
	cr_expect_str_eq(a->top[1].group, "etl");
	cr_expect_str_eq(a->top[1].comm, "worker");
	memtally_admit_result_free(a);

	cr_expect_eq(memtally_query_admit(q, NULL, &a), -EINVAL);
	cr_expect_null(a);
	rq.bytes = 0;
	cr_expect_eq(memtally_query_admit(q, &rq, &a), -EINVAL);
	/* Words reserved for later fields must be zero: an old library
	 * refuses a request that means more than it knows. */
	rq = (struct memtally_admit_req){.bytes = 10, .reserved = {0, 0, 1}};
	cr_expect_eq(memtally_query_admit(q, &rq, &a), -EINVAL);
	/* Flags it does not know, likewise. */
	rq = (struct memtally_admit_req){.bytes = 10, .flags = 4};
	cr_expect_eq(memtally_query_admit(q, &rq, &a), -EINVAL);
	memtally_admit_result_free(NULL);
}

FAKE_TEST(admit, release_and_set_limit, answer_admin)
{
	uint64_t b = 1;
	cr_assert_eq(memtally_query_release(q, "r-42", &b), 0);
	cr_expect_eq(b, 600);
	cr_expect_str_eq(seen.reservation, "r-42");
	cr_expect_str_eq(seen.token, "", "no token unless set");
	cr_expect_eq(memtally_query_release(q, "r-43", &b), MEMTALLY_ENOTFOUND);
	cr_expect_eq(b, 0);
	cr_expect_str_eq(memtally_query_last_error(q), "no reservation");
	cr_expect_eq(memtally_query_release(q, "", NULL), -EINVAL);

	uint64_t prev = 1;
	cr_expect_eq(memtally_query_set_limit(q, MEMTALLY_SCOPE_FLEET, NULL, 0,
	                                      1 << 30, &prev),
	             MEMTALLY_EPERM);
	cr_expect_eq(prev, 0);
	cr_expect_str_eq(memtally_query_last_error(q), "SetLimit needs root");
	cr_assert_eq(memtally_query_set_token(q, "sesame"), 0);
	cr_assert_eq(memtally_query_set_limit(q, MEMTALLY_SCOPE_FLEET, NULL, 0,
	                                      1 << 30, &prev),
	             0);
	cr_expect_eq(seen.scope_case, MEMTALLY__V1__SET_LIMIT__SCOPE_FLEET);
	cr_expect_eq(seen.bytes, 1 << 30);
	cr_expect_eq(prev, 12345);
	cr_assert_eq(memtally_query_set_limit(q, MEMTALLY_SCOPE_GROUP, "etl",
	                                      99, 0, NULL),
	             0);
	cr_expect_eq(seen.scope_case, MEMTALLY__V1__SET_LIMIT__SCOPE_GROUP);
	cr_expect_str_eq(seen.group, "etl");
	cr_expect_eq(seen.bytes, 0, "0 removes the limit");
	cr_assert_eq(memtally_query_set_limit(q, MEMTALLY_SCOPE_PID, NULL, 4242,
	                                      77, NULL),
	             0);
	cr_expect_eq(seen.scope_case, MEMTALLY__V1__SET_LIMIT__SCOPE_PID);
	cr_expect_eq(seen.pid, 4242);
	/* The token goes with Release too. */
	cr_assert_eq(memtally_query_release(q, "r-42", NULL), 0);
	cr_expect_str_eq(seen.token, "sesame");
	cr_assert_eq(memtally_query_set_token(q, NULL), 0);
	cr_assert_eq(memtally_query_release(q, "r-42", NULL), 0);
	cr_expect_str_eq(seen.token, "");

	cr_expect_eq(
	    memtally_query_set_limit(q, MEMTALLY_SCOPE_GROUP, "", 0, 1, NULL),
	    -EINVAL);
	cr_expect_eq(
	    memtally_query_set_limit(q, MEMTALLY_SCOPE_PID, NULL, 0, 1, NULL),
	    -EINVAL);
	cr_expect_eq(memtally_query_set_limit(q, (enum memtally_scope)9, NULL,
	                                      1, 1, NULL),
	             -EINVAL);
	cr_expect_eq(atomic_load(&f->connections), 1);
}

/* Admit, then close without answering: the server may have granted it. */
static bool answer_admit_then_close(struct fake *f, int fd,
                                    const Memtally__V1__Request *req, int n)
{
	if (req->body_case == MEMTALLY__V1__REQUEST__BODY_ADMIT)
		return false;
	return answer_admin(f, fd, req, n);
}

FAKE_TEST(admit, never_sent_twice_when_the_answer_is_lost,
          answer_admit_then_close)
{
	struct memtally_admit_req rq = {.bytes = 10};
	struct memtally_admit_result *a;
	cr_expect_eq(memtally_query_admit(q, &rq, &a), -ECONNRESET);
	cr_expect_null(a);
	/* A query in the same place is sent again (test
	 * server_close_is_econnreset); an Admit is not. */
	cr_expect_eq(atomic_load(&f->requests), 1, "Admit sent twice");
	cr_expect_neq(strstr(memtally_query_last_error(q), "may have"), NULL,
	              "last error: %s", memtally_query_last_error(q));
	/* The handle recovers for the next call. */
	struct memtally_usage *u;
	cr_assert_eq(memtally_query_usage(q, &u), 0);
	memtally_usage_free(u);
	cr_expect_eq(atomic_load(&f->connections), 2);
}

/* Each connection gets one answer, then the server closes it: a restart
 * between two calls. */
static bool answer_admin_once(struct fake *f, int fd,
                              const Memtally__V1__Request *req, int n)
{
	answer_admin(f, fd, req, n);
	return false;
}

FAKE_TEST(admit, idle_connection_closed_by_the_server_is_replaced_first,
          answer_admin_once)
{
	struct memtally_usage *u;
	cr_assert_eq(memtally_query_usage(q, &u), 0);
	memtally_usage_free(u);
	/* Wait until the server's close has reached us, as it would have
	 * after a restart: the library must see it before sending. */
	struct pollfd p = {.fd = memtally_query_fd(q), .events = POLLIN};
	cr_assert_eq(poll(&p, 1, 5000 * test_mult()), 1);
	struct memtally_admit_req rq = {.bytes = 10};
	struct memtally_admit_result *a;
	cr_assert_eq(memtally_query_admit(q, &rq, &a), 0, "last error: %s",
	             memtally_query_last_error(q));
	cr_expect(a->admitted);
	memtally_admit_result_free(a);
	cr_expect_eq(atomic_load(&f->requests), 2, "one usage, one admit");
	cr_expect_eq(atomic_load(&f->connections), 2);
	uint64_t prev;
	cr_assert_eq(poll(&p, 1, 0) >= 0, 1);
	p.fd = memtally_query_fd(q);
	cr_assert_eq(poll(&p, 1, 5000 * test_mult()), 1);
	cr_expect_eq(memtally_query_set_limit(q, MEMTALLY_SCOPE_FLEET, NULL, 0,
	                                      1, &prev),
	             MEMTALLY_EPERM, "sent once, on a new connection");
	cr_expect_eq(atomic_load(&f->requests), 3);
}

/* ---- watch --------------------------------------------------------- */

static void send_event(int fd, uint64_t id, const char *scope,
                       Memtally__V1__State from, Memtally__V1__State to,
                       uint64_t bytes)
{
	Memtally__V1__Event e = MEMTALLY__V1__EVENT__INIT;
	e.scope = (char *)scope;
	e.state = to;
	e.previous = from;
	e.bytes = bytes;
	e.limit = 1000;
	e.reserved_bytes = 10;
	e.time_ns = 1700000000000000000ull;
	e.rss_bytes = bytes * 2;
	e.measure = "accounted";
	Memtally__V1__Response r = MEMTALLY__V1__RESPONSE__INIT;
	r.id = id;
	r.body_case = MEMTALLY__V1__RESPONSE__BODY_EVENT;
	r.event = &e;
	send_response(fd, &r);
}

static atomic_int watch_go; /* the test lets the fake send event 3 */

/* Watch: an acknowledgement without a body, two events at once, a third
 * when the test says, then close. */
static bool answer_watch(struct fake *f, int fd,
                         const Memtally__V1__Request *req, int n)
{
	if (req->body_case != MEMTALLY__V1__REQUEST__BODY_WATCH)
		return answer_any(f, fd, req, n);
	Memtally__V1__Response ack = MEMTALLY__V1__RESPONSE__INIT;
	ack.id = req->id;
	send_response(fd, &ack);
	send_event(fd, req->id, "fleet", MEMTALLY__V1__STATE__STATE_OK,
	           MEMTALLY__V1__STATE__STATE_HIGH, 850);
	send_event(fd, req->id, "group:etl", MEMTALLY__V1__STATE__STATE_HIGH,
	           MEMTALLY__V1__STATE__STATE_OVER, 1100);
	while (!atomic_load(&watch_go))
		usleep(1000);
	send_event(fd, req->id, "pid:7", MEMTALLY__V1__STATE__STATE_OVER,
	           MEMTALLY__V1__STATE__STATE_OK, 3);
	return false;
}

struct seen_events {
	int n;
	char scopes[4][32];
	int stop_at;
};

static int on_event(const struct memtally_event *ev, void *arg)
{
	struct seen_events *s = arg;
	if (s->n < 4)
		snprintf(s->scopes[s->n], 32, "%s", ev->scope);
	s->n++;
	if (s->n == 1) {
		cr_expect_eq(ev->state, MEMTALLY_STATE_HIGH);
		cr_expect_eq(ev->previous, MEMTALLY_STATE_OK);
		cr_expect_eq(ev->bytes, 850);
		cr_expect_eq(ev->rss, 1700);
		cr_expect_eq(ev->limit, 1000);
		cr_expect_eq(ev->reserved, 10);
		cr_expect_eq(ev->time_ns, 1700000000000000000ull);
		cr_expect_str_eq(ev->measure, "accounted");
		atomic_store(&watch_go, 1);
	}
	return s->n == s->stop_at;
}

FAKE_TEST_OPEN(watch, blocking_until_the_server_closes, answer_watch,
               5000 * test_mult())
{
	struct seen_events s = {.stop_at = -1};
	cr_expect_eq(memtally_query_watch(q, on_event, &s), -ECONNRESET);
	cr_assert_eq(s.n, 3);
	cr_expect_str_eq(s.scopes[1], "group:etl");
	cr_expect_str_eq(s.scopes[2], "pid:7");
	/* The handle is usable again, on a new connection. */
	struct memtally_usage *u;
	cr_assert_eq(memtally_query_usage(q, &u), 0);
	memtally_usage_free(u);
	cr_expect_eq(atomic_load(&f->connections), 2);
}

FAKE_TEST_OPEN(watch, callback_stops_it, answer_watch, 5000 * test_mult())
{
	struct seen_events s = {.stop_at = 2};
	cr_expect_eq(memtally_query_watch(q, on_event, &s), 0);
	cr_expect_eq(s.n, 2);
	cr_expect_eq(memtally_query_fd(q), -1, "the stream is closed");
}

FAKE_TEST_OPEN(watch, non_blocking_from_a_poll_loop, answer_watch,
               5000 * test_mult())
{
	struct memtally_event ev;
	cr_expect_eq(memtally_query_watch_next(q, &ev), -EINVAL,
	             "not watching yet");
	cr_assert_eq(memtally_query_watch_start(q), 0);
	cr_expect_eq(memtally_query_watch_start(q), -EBUSY);
	struct memtally_usage *u;
	cr_expect_eq(memtally_query_usage(q, &u), -EBUSY);
	cr_expect_null(u);
	int fd = memtally_query_fd(q);
	cr_assert_geq(fd, 0);
	int got = 0, rc = 0;
	while (got < 3) {
		rc = memtally_query_watch_next(q, &ev);
		if (rc == 0) {
			if (++got == 1) {
				cr_expect_str_eq(ev.scope, "fleet");
				atomic_store(&watch_go, 1);
			}
			continue;
		}
		cr_assert_eq(rc, -EAGAIN, "watch_next: %d", rc);
		struct pollfd p = {.fd = fd, .events = POLLIN};
		cr_assert_eq(poll(&p, 1, 5000 * test_mult()), 1);
	}
	cr_expect_str_eq(ev.scope, "pid:7");
	cr_expect_eq(ev.state, MEMTALLY_STATE_OK);
	/* Then the server closes: the watch ends with -ECONNRESET. */
	for (;;) {
		rc = memtally_query_watch_next(q, &ev);
		if (rc != -EAGAIN)
			break;
		struct pollfd p = {.fd = fd, .events = POLLIN};
		cr_assert_eq(poll(&p, 1, 5000 * test_mult()), 1);
	}
	cr_expect_eq(rc, -ECONNRESET);
	cr_expect_eq(memtally_query_watch_next(q, &ev), -EINVAL);
	cr_assert_eq(memtally_query_usage(q, &u), 0);
	memtally_usage_free(u);
}

FAKE_TEST_OPEN(watch, stop_and_reuse, answer_watch, 5000 * test_mult())
{
	cr_assert_eq(memtally_query_watch_start(q), 0);
	memtally_query_watch_stop(q);
	memtally_query_watch_stop(q); /* not watching: nothing */
	memtally_query_watch_stop(NULL);
	atomic_store(&watch_go, 1); /* let the fake's first watch finish */
	struct memtally_usage *u;
	cr_assert_eq(memtally_query_usage(q, &u), 0);
	memtally_usage_free(u);
}

static bool answer_watch_unsupported(struct fake *f, int fd,
                                     const Memtally__V1__Request *req, int n)
{
	if (req->body_case == MEMTALLY__V1__REQUEST__BODY_WATCH) {
		send_error(fd, req->id,
		           MEMTALLY__V1__ERROR_CODE__ERROR_UNSUPPORTED,
		           "no watch here");
		return true;
	}
	return answer_any(f, fd, req, n);
}

static int never(const struct memtally_event *ev, void *arg)
{
	cr_expect_fail("no event expected");
	return 1;
}

FAKE_TEST(watch, server_error_ends_it, answer_watch_unsupported)
{
	cr_expect_eq(memtally_query_watch(q, never, NULL),
	             MEMTALLY_EUNSUPPORTED);
	cr_expect_str_eq(memtally_query_last_error(q), "no watch here");
	cr_expect_eq(memtally_query_watch(NULL, never, NULL), -EINVAL);
	cr_expect_eq(memtally_query_watch(q, NULL, NULL), -EINVAL);
}

static bool answer_nothing_to_watch(struct fake *f, int fd,
                                    const Memtally__V1__Request *req, int n)
{
	return true;
}

FAKE_TEST_OPEN(watch, quiet_stream_times_out_with_the_handle,
               answer_nothing_to_watch, 200, .timeout = 20)
{
	int64_t t0 = mono_ms();
	cr_expect_eq(memtally_query_watch(q, never, NULL), -ETIMEDOUT);
	cr_expect_geq(mono_ms() - t0, 190);
}

/* ---- usage gains RSS, state and the limit settings ------------------- */

static bool answer_usage_v3(struct fake *f, int fd,
                            const Memtally__V1__Request *req, int n)
{
	Memtally__V1__GroupUsage g = MEMTALLY__V1__GROUP_USAGE__INIT;
	Memtally__V1__GroupUsage *gp = &g;
	g.name = "etl";
	g.rss_bytes = 777;
	g.reservations = 2;
	g.high_watermark_bytes = 800;
	Memtally__V1__Usage u = MEMTALLY__V1__USAGE__INIT;
	u.rss_bytes = 999;
	u.measure = "max";
	u.reservations = 3;
	u.process_limit = 1 << 20;
	u.high_watermark_bytes = 900;
	u.n_groups = 1;
	u.groups = &gp;
	Memtally__V1__Response r = MEMTALLY__V1__RESPONSE__INIT;
	r.id = req->id;
	r.body_case = MEMTALLY__V1__RESPONSE__BODY_USAGE;
	r.usage = &u;
	send_response(fd, &r);
	return true;
}

FAKE_TEST(query, usage_has_rss_and_limit_settings, answer_usage_v3)
{
	struct memtally_usage *u;
	cr_assert_eq(memtally_query_usage(q, &u), 0);
	cr_expect_eq(u->rss, 999);
	cr_expect_str_eq(u->measure, "max");
	cr_expect_eq(u->reservations, 3);
	cr_expect_eq(u->process_limit, 1 << 20);
	cr_expect_eq(u->high_watermark, 900);
	cr_assert_eq(u->n_groups, 1);
	cr_expect_str_eq(u->groups[0].name, "etl");
	cr_expect_eq(u->groups[0].rss, 777);
	cr_expect_eq(u->groups[0].reservations, 2);
	cr_expect_eq(u->groups[0].high_watermark, 800);
	memtally_usage_free(u);
}

/* ---- sizes ------------------------------------------------------------ */

Test(size, parses_like_the_server)
{
	static const struct {
		const char *s;
		int err;
		uint64_t v;
	} cases[] = {
	    {"0", 0, 0},
	    {"4096", 0, 4096},
	    {"12b", 0, 12},
	    {"64KiB", 0, 64 << 10},
	    {"64k", 0, 64 << 10},
	    {"64KB", 0, 64000},
	    {"512MiB", 0, 512ull << 20},
	    {"512mi", 0, 512ull << 20},
	    {"1.5G", 0, 3ull << 29},
	    {"1.5GB", 0, 1500000000ull},
	    {"64GiB", 0, 64ull << 30},
	    {"2T", 0, 2ull << 40},
	    {"1TB", 0, 1000000000000ull},
	    /* Not 0, but under a byte: refused, never 0 (none, for a
	     * limit). A zero written with a fraction is 0. */
	    {"0.0001K", -EDOM, 0},
	    {"0.00000000000000000000001K", -EDOM, 0},
	    {"0.0K", 0, 0},
	    {"0.001K", 0, 1},
	    {"1.9999999999999999999999K", 0, 2047},
	    {"18446744073709551615", 0, UINT64_MAX},
	    {"18446744073709551616", -ERANGE, 0},
	    {"16777216T", -ERANGE, 0},
	    {"99999999999999999999999999999", -ERANGE, 0},
	    {"", -EINVAL, 0},
	    {"K", -EINVAL, 0},
	    {".5G", -EINVAL, 0},
	    {"1.", -EINVAL, 0},
	    {"1.5", -EINVAL, 0},
	    {"1.5B", -EINVAL, 0},
	    {"-1", -EINVAL, 0},
	    {"+1", -EINVAL, 0},
	    {" 1G", -EINVAL, 0},
	    {"1 G", -EINVAL, 0},
	    {"1G ", -EINVAL, 0},
	    {"0x10", -EINVAL, 0},
	    {"1PiB", -EINVAL, 0},
	    {"1GiBs", -EINVAL, 0},
	};
	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		uint64_t v = 7;
		int err = memtally_parse_size(cases[i].s, &v);
		cr_expect_eq(err, cases[i].err, "'%s': %d", cases[i].s, err);
		if (cases[i].err == 0)
			cr_expect_eq(v, cases[i].v, "'%s': %llu", cases[i].s,
			             (unsigned long long)v);
		else
			cr_expect_eq(v, 7, "'%s' wrote on failure", cases[i].s);
	}
	uint64_t v;
	cr_expect_eq(memtally_parse_size(NULL, &v), -EINVAL);
	cr_expect_eq(memtally_parse_size("1", NULL), -EINVAL);
}
