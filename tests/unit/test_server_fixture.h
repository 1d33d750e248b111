/*
 * test_server_fixture.h - the one way tests and fuzzers start an in-process
 * server, and everything that goes with it (memtallyd itself as a child
 * is tests/support/memtallyd_child.h's):
 *
 *   - child processes that die with the test (fx_fork), and a clock to
 *     poll against with a deadline (fx_ms, fx_deadline_ms);
 *   - a listening Unix socket (fx_listen_unix), for fake servers;
 *   - an in-process server on a private segment (fx_config,
 *     fx_server_open, fx_server_close), socket and TCP only when asked;
 *     left out where server.h is not at hand (define FX_NO_SERVER);
 *   - the Criterion helpers of the server unit tests: real child processes
 *     as workers, requests dispatched from plain buffers, the events the
 *     registry raises captured in order; left out for the fuzzers (define
 *     FX_NO_CRITERION).
 *
 * Each test is its own process (Criterion), so the statics here are per
 * test. fx_stop() kills the children and asserts that the loop closes with
 * no live handle.
 */
#ifndef MEMTALLY_TEST_SERVER_FIXTURE_H
#define MEMTALLY_TEST_SERVER_FIXTURE_H

#include <errno.h>
#include <poll.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

/* ---- processes and time ------------------------------------------------ */

/* Milliseconds on the monotonic clock. */
static inline __attribute__((unused)) uint64_t fx_ms(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
}

/* A deadline `ms` from now, stretched by MEMTALLY_TEST_TIMEOUT_MULT
 * (sanitizer builds run slower). */
static inline __attribute__((unused)) uint64_t fx_deadline_ms(uint64_t ms)
{
	const char *m = getenv("MEMTALLY_TEST_TIMEOUT_MULT");
	double mult = m && atof(m) > 0 ? atof(m) : 1;
	return fx_ms() + (uint64_t)((double)ms * mult);
}

/* In a child: be killed when the test process goes, even if it crashes
 * before its teardown (a leftover child keeps CTest's output pipe open).
 * A change of uid clears the setting: call it again after one. */
static inline __attribute__((unused)) void fx_die_with(pid_t parent)
{
	prctl(PR_SET_PDEATHSIG, SIGKILL);
	if (getppid() != parent) /* it went before the line above */
		_exit(1);
}

/* fork(), the child bound to die with this process. */
static inline __attribute__((unused)) pid_t fx_fork(void)
{
	pid_t parent = getpid();
	pid_t pid = fork();
	if (pid == 0)
		fx_die_with(parent);
	return pid;
}

static __attribute__((unused)) char segname[64];
static __attribute__((unused)) char sockpath[108];

/* The name of a server's shared objects, of this process. */
static inline __attribute__((unused)) const char *fx_segname(const char *tag)
{
	snprintf(segname, sizeof(segname), "/mt-%s-%ld", tag, (long)getpid());
	return segname;
}

/* A socket path of this process in /tmp, with nothing there yet. */
static inline __attribute__((unused)) const char *fx_sockpath(const char *tag)
{
	snprintf(sockpath, sizeof(sockpath), "/tmp/mt-%s-%ld.sock", tag,
	         (long)getpid());
	unlink(sockpath);
	return sockpath;
}

/* A Unix stream socket listening at `path` (removed first); its
 * descriptor or -errno. */
static inline __attribute__((unused)) int fx_listen_unix(const char *path)
{
	struct sockaddr_un sa = {.sun_family = AF_UNIX};
	if (strlen(path) >= sizeof(sa.sun_path))
		return -ENAMETOOLONG;
	strcpy(sa.sun_path, path);
	unlink(path);
	int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
	if (fd < 0)
		return -errno;
	if (bind(fd, (struct sockaddr *)&sa, sizeof(sa)) != 0 ||
	    listen(fd, 8) != 0) {
		int err = -errno;
		close(fd);
		return err;
	}
	return fd;
}

/* ---- an in-process server ---------------------------------------------- */

#ifndef FX_NO_SERVER
#include "server.h"

#include "mts_log.h"
#include "mts_metrics.h"

static __attribute__((unused)) uv_loop_t loop;
static __attribute__((unused)) struct mts_server srv;

/* What every test server shares: a private segment named after `tag` and
 * this process, `slots` slots of 2 lanes, threshold 1000, no socket, and
 * no timer tick (tests and fuzzers call mts_core_tick() themselves). The
 * caller adds what it needs. */
static inline __attribute__((unused)) struct mts_config
fx_config(const char *tag, uint32_t slots)
{
	return (struct mts_config){
	    .segment = fx_segname(tag),
	    .slots = slots,
	    .lanes = 2,
	    .tick_ms = 60000,
	    .threshold = 1000,
	};
}

/* Start `srv` on `loop`; 0 or what failed. */
static inline __attribute__((unused)) int
fx_server_open(const struct mts_config *cfg)
{
	int err = uv_loop_init(&loop);
	if (err)
		return err;
	err = mts_server_init(&srv, &loop, cfg);
	if (err)
		uv_loop_close(&loop);
	return err;
}

/* Stop it and run the loop dry; what uv_loop_close() says (UV_EBUSY: a
 * handle was left open). */
static inline __attribute__((unused)) int fx_server_close(void)
{
	mts_server_stop(&srv);
	uv_run(&loop, UV_RUN_DEFAULT);
	mts_server_free(&srv);
	return uv_loop_close(&loop);
}

/* ---- Criterion helpers of the server unit tests ------------------------- */

#ifndef FX_NO_CRITERION
#include <criterion/criterion.h>

#define FX_MAX_KIDS   16
#define FX_MAX_EVENTS 256
#define MIB           (UINT64_C(1) << 20)

struct fx_event {
	char scope[MTS_NAME_MAX + 8];
	uint32_t state, previous;
	uint64_t bytes, limit, reserved;
};

static __attribute__((unused)) pid_t kids[FX_MAX_KIDS];
static __attribute__((unused)) int nkids;
static __attribute__((unused)) struct fx_event events[FX_MAX_EVENTS];
static __attribute__((unused)) int nevents;

static inline void fx_on_event(void *ctx, const struct mts_event *ev)
{
	(void)ctx;
	cr_assert_lt(nevents, FX_MAX_EVENTS);
	struct fx_event *e = &events[nevents++];
	snprintf(e->scope, sizeof(e->scope), "%s", ev->scope);
	e->state = ev->state;
	e->previous = ev->previous;
	e->bytes = ev->bytes;
	e->limit = ev->limit;
	e->reserved = ev->reserved;
}

/* Run the loop until `cond` holds; fail, naming it, if it does not within
 * 20 s (stretched for sanitizer builds). */
#define FX_RUN_UNTIL(cond)                                                     \
	do {                                                                   \
		uint64_t fx_end_ = fx_deadline_ms(20000);                      \
		while (!(cond)) {                                              \
			cr_assert_lt(fx_ms(), fx_end_, "never: %s", #cond);    \
			uv_run(&loop, UV_RUN_NOWAIT);                          \
			poll(NULL, 0, 1);                                      \
		}                                                              \
	} while (0)

/* Start the server `cfg` describes (from fx_config()), quietly. */
static inline void fx_start_config(const struct mts_config *cfg)
{
	mts_log_set_level(MTS_LOG_ERROR); /* keep test output quiet */
	cr_assert_eq(fx_server_open(cfg), 0, "the server did not start");
}

/* The uid fx_register() gives its workers. The fixture's children run as
 * root, whatever uid their peer says: trusting FX_UID keeps the figures
 * what the slots say (a test of trust itself uses another uid). */
#define FX_UID 1000u

/* The restart record the next fx_start*() opens (NULL: none, as the
 * fixture's servers have no socket to put it beside). */
static __attribute__((unused)) const char *fx_state_path;

/* Start a server of `slots` slots with `pol` (NULL = defaults); events
 * are captured. */
static inline void fx_start_slots(const struct mts_policy *pol, uint32_t slots)
{
	static struct mts_policy with_fx;
	if (!pol) {
		mts_policy_defaults(&with_fx);
	} else {
		with_fx = *pol; /* shallow: the server copies it */
	}
	if (with_fx.ntrusted < MTS_TRUSTED_UIDS_MAX)
		with_fx.trusted_uids[with_fx.ntrusted++] = FX_UID;
	pol = &with_fx;
	struct mts_config cfg = fx_config("s3-test", slots);
	cfg.policy = pol;
	cfg.state_path = fx_state_path;
	fx_start_config(&cfg);
	/* A few slots would make the default per-uid slot cap smaller
	 * still: tests of other things register more workers of one uid. Tests
	 * of the cap set max_slots_per_uid in their policy. */
	if (srv.reg.policy.slots_per_uid == 0)
		srv.reg.policy.slots_per_uid = MTS_CAP_NONE;
	/* Likewise the default cap on reserved bytes, a fraction of the fleet
	 * limit: tests of admission by the limits reserve more as one uid.
	 * Tests of the cap set it after the start. */
	if (srv.reg.policy.resv_bytes_bp == MTS_DEFAULT_RESV_BYTES_BP &&
	    !srv.reg.policy.resv_bytes_per_uid)
		srv.reg.policy.resv_bytes_bp = 0;
	srv.reg.lim->on_event = fx_on_event;
	srv.reg.lim->event_ctx = NULL;
	nevents = 0;
}

static inline void fx_start_policy(const struct mts_policy *pol)
{
	fx_start_slots(pol, 8);
}

static inline void fx_start(void)
{
	fx_start_policy(NULL);
}

/* fx_start() with a restart record, /tmp/mt-TAG-PID.state, unlinked once
 * the server holds it open. */
static inline __attribute__((unused)) void fx_start_with_record(const char *tag)
{
	static char path[96];
	snprintf(path, sizeof(path), "/tmp/mt-%s-%d.state", tag, (int)getpid());
	unlink(path);
	fx_state_path = path;
	fx_start();
	fx_state_path = NULL;
	cr_assert_not_null(srv.reg.state, "no restart record");
	unlink(path);
}

static inline void fx_stop(void)
{
	for (int i = 0; i < nkids; i++) {
		kill(kids[i], SIGKILL);
		waitpid(kids[i], NULL, 0);
	}
	nkids = 0;
	cr_assert_eq(fx_server_close(), 0, "a handle was left open");
}

/* A child that runs `body(arg)` (which may _exit(1) on failure), then
 * says it is ready and waits to be killed. Returns once it is ready. */
static inline pid_t fx_spawn_ready(void (*body)(void *), void *arg)
{
	int p[2];
	cr_assert_eq(pipe(p), 0);
	pid_t pid = fx_fork();
	cr_assert_geq(pid, 0);
	if (pid == 0) {
		close(p[0]);
		if (body)
			body(arg);
		char c = 'x';
		if (write(p[1], &c, 1) != 1)
			_exit(1);
		for (;;)
			pause();
	}
	close(p[1]);
	char c;
	cr_assert_eq(read(p[0], &c, 1), 1, "child did not start");
	close(p[0]);
	cr_assert_lt(nkids, FX_MAX_KIDS);
	kids[nkids++] = pid;
	return pid;
}

struct fx_holding {
	pid_t parent;
	long uid;
	size_t hold;
};

static inline void fx_hold_body(void *arg)
{
	const struct fx_holding *h = arg;
	if (h->uid >= 0 &&
	    (setresgid((gid_t)h->uid, (gid_t)h->uid, (gid_t)h->uid) ||
	     setresuid((uid_t)h->uid, (uid_t)h->uid, (uid_t)h->uid)))
		_exit(1);
	fx_die_with(h->parent); /* again: the uid change cleared it */
	if (h->hold) {
		char *m = malloc(h->hold);
		if (!m)
			_exit(1);
		memset(m, 1, h->hold);
		/* Kept: the stores must reach memory. */
		__asm__ volatile("" : : "r"(m) : "memory");
	}
}

/* A child of `uid` (-1: ours) that holds `hold` bytes of anonymous
 * memory it wrote, waiting to be killed. */
static inline pid_t fx_spawn_as_holding(long uid, size_t hold)
{
	struct fx_holding h = {.parent = getpid(), .uid = uid, .hold = hold};
	return fx_spawn_ready(fx_hold_body, &h);
}

/* A child that lives until killed. */
static inline pid_t fx_spawn_as(long uid)
{
	return fx_spawn_as_holding(uid, 0);
}

static inline pid_t fx_spawn(void)
{
	return fx_spawn_as(-1);
}

/* Kill a child and run the loop until the registry saw it go. */
static inline void fx_kill(pid_t pid)
{
	kill(pid, SIGKILL);
	waitpid(pid, NULL, 0);
	for (int i = 0; i < nkids; i++)
		if (kids[i] == pid)
			kids[i] = kids[--nkids];
	FX_RUN_UNTIL(!mts_find_pid(&srv.reg, (uint32_t)pid));
}

static inline struct mts_peer fx_peer(pid_t pid, uint32_t uid)
{
	return (struct mts_peer){.fd = -1,
	                         .has_cred = true,
	                         .pid = (uint32_t)pid,
	                         .uid = uid,
	                         .gid = uid};
}

static inline Memtally__V1__Response *fx_call(struct mts_peer *peer,
                                              const Memtally__V1__Request *req)
{
	size_t len = protobuf_c_message_get_packed_size(&req->base);
	uint8_t *body = malloc(len ? len : 1);
	protobuf_c_message_pack(&req->base, body);
	struct mts_buf out = {0};
	int rc = mts_dispatch(&srv.reg, peer, body, len, &out);
	uint64_t blen;
	int n = mtframe_decode_len(out.data, out.len, UINT64_MAX, &blen);
	cr_assert_gt(n, 0);
	cr_assert_eq((size_t)n + blen, out.len, "not exactly one response");
	Memtally__V1__Response *r =
	    memtally__v1__response__unpack(NULL, blen, out.data + n);
	cr_assert_not_null(r);
	/* A peer of unknown uid asking without the token is answered, and
	 * its connection closed; every other answer keeps it. */
	bool refused = !peer->has_cred && r->error &&
	               r->error->code ==
	                   MEMTALLY__V1__ERROR_CODE__ERROR_PERMISSION_DENIED &&
	               strstr(r->error->message, "a token is needed");
	cr_assert_eq(rc, refused ? MTS_CLOSE : 0, "mts_dispatch: %d", rc);
	free(body);
	mts_buf_free(&out);
	return r;
}

/* Register `pid` as a worker of `uid`; its slot. */
static inline uint32_t fx_register_as(pid_t pid, uint32_t uid,
                                      const char *group, const char *task)
{
	Memtally__V1__Request req = MEMTALLY__V1__REQUEST__INIT;
	Memtally__V1__Register reg = MEMTALLY__V1__REGISTER__INIT;
	reg.group = (char *)group;
	reg.task = (char *)task;
	reg.image_id = 1;
	req.body_case = MEMTALLY__V1__REQUEST__BODY_REGISTER;
	req.register_ = &reg;
	struct mts_peer peer = fx_peer(pid, uid);
	Memtally__V1__Response *r = fx_call(&peer, &req);
	cr_assert_null(r->error, "register: %s",
	               r->error ? r->error->message : "");
	uint32_t slot = r->registered->slot;
	memtally__v1__response__free_unpacked(r, NULL);
	return slot;
}

static inline uint32_t fx_register(pid_t pid, const char *group,
                                   const char *task)
{
	return fx_register_as(pid, FX_UID, group, task);
}

/* Register again as `pid` of `uid` with image id `image` (an exec says
 * so; the id is the client's word). */
static inline __attribute__((unused)) void
fx_register_image(pid_t pid, uint32_t uid, uint64_t image)
{
	Memtally__V1__Request req = MEMTALLY__V1__REQUEST__INIT;
	Memtally__V1__Register r = MEMTALLY__V1__REGISTER__INIT;
	r.group = r.task = (char *)"";
	r.image_id = image;
	req.body_case = MEMTALLY__V1__REQUEST__BODY_REGISTER;
	req.register_ = &r;
	struct mts_peer peer = fx_peer(pid, uid);
	Memtally__V1__Response *a = fx_call(&peer, &req);
	cr_assert_null(a->error, "%s", a->error ? a->error->message : "");
	memtally__v1__response__free_unpacked(a, NULL);
}

/* The /metrics exposition as a NUL-terminated string; the caller frees
 * it. */
static inline __attribute__((unused)) char *fx_metrics_text(void)
{
	struct mts_buf b = {0};
	cr_assert_eq(mts_metrics_render(&srv.reg, &srv.net.conn_stats,
	                                &srv.reload_stats, &b),
	             0);
	cr_assert_eq(mts_buf_reserve(&b, 1), 0);
	b.data[b.len] = '\0';
	cr_assert_eq(strlen((char *)b.data), b.len, "a NUL in the text");
	return (char *)b.data;
}

/* What a worker's client would do: lane 0 holds `bytes`. */
static inline void fx_write(uint32_t slot, int64_t bytes)
{
	struct mtshm_slot_id *s = mts_slot(&srv.reg, slot);
	mtshm_store_relaxed32(&s->threads, 1);
	mtshm_store_relaxed32(&s->lanes_used, 1);
	mtshm_store_relaxeds64(&mtshm_lane(s, 0)->bytes, bytes);
}

/* The pid fx_admit() asks as: 0, none (a peer whose pid is unknown). */
static pid_t fx_asker;

static inline Memtally__V1__Response *fx_admit(uint32_t uid, uint64_t bytes,
                                               const char *group,
                                               const char *task, uint32_t ttl)
{
	Memtally__V1__Request req = MEMTALLY__V1__REQUEST__INIT;
	Memtally__V1__Admit a = MEMTALLY__V1__ADMIT__INIT;
	a.bytes = bytes;
	a.group = (char *)(group ? group : "");
	a.task = (char *)(task ? task : "");
	a.ttl_seconds = ttl;
	req.id = 21;
	req.body_case = MEMTALLY__V1__REQUEST__BODY_ADMIT;
	req.admit = &a;
	/* Asked by no process of ours (fx_asker 0): every worker a test
	 * spawns descends from this one, and would be the asker's command
	 * (admit.c, switched_user). A test sets fx_asker to ask as one. */
	struct mts_peer peer = fx_peer(fx_asker, uid);
	return fx_call(&peer, &req);
}

/* An Admit by `pid` (of `uid`) of a task of `kind` run inside it, on
 * thread `thread` (0: the whole process), within `host_limit` (0: none). */
static inline __attribute__((unused)) Memtally__V1__Response *
fx_admit_hosted(pid_t pid, uint32_t uid, uint64_t bytes, const char *kind,
                uint32_t thread, uint64_t host_limit)
{
	Memtally__V1__Request req = MEMTALLY__V1__REQUEST__INIT;
	Memtally__V1__Admit a = MEMTALLY__V1__ADMIT__INIT;
	a.bytes = bytes;
	a.group = a.task = (char *)"";
	a.kind = (char *)kind;
	a.in_process = true;
	a.thread = thread;
	a.host_limit = host_limit;
	req.id = 61;
	req.body_case = MEMTALLY__V1__REQUEST__BODY_ADMIT;
	req.admit = &a;
	struct mts_peer peer = fx_peer(pid, uid);
	return fx_call(&peer, &req);
}

/* Run one tick with the server's log (stderr) captured; returns what it
 * wrote (static buffer). */
static inline __attribute__((unused)) const char *fx_tick_logged(void)
{
	static char buf[4096];
	FILE *f = tmpfile();
	cr_assert_not_null(f);
	int saved = dup(STDERR_FILENO);
	cr_assert_geq(saved, 0);
	dup2(fileno(f), STDERR_FILENO);
	mts_log_set_level(MTS_LOG_WARN);
	mts_core_tick(&srv.reg);
	mts_log_set_level(MTS_LOG_ERROR);
	dup2(saved, STDERR_FILENO);
	close(saved);
	rewind(f);
	size_t n = fread(buf, 1, sizeof(buf) - 1, f);
	buf[n] = 0;
	fclose(f);
	return buf;
}

static inline Memtally__V1__Response *fx_set_limit(struct mts_peer *peer,
                                                   int scope, const char *group,
                                                   uint32_t pid, uint64_t bytes,
                                                   const char *token)
{
	Memtally__V1__Request req = MEMTALLY__V1__REQUEST__INIT;
	Memtally__V1__SetLimit q = MEMTALLY__V1__SET_LIMIT__INIT;
	q.scope_case = scope;
	if (scope == MEMTALLY__V1__SET_LIMIT__SCOPE_FLEET)
		q.fleet = 1;
	if (scope == MEMTALLY__V1__SET_LIMIT__SCOPE_GROUP)
		q.group = (char *)group;
	if (scope == MEMTALLY__V1__SET_LIMIT__SCOPE_PID)
		q.pid = pid;
	q.bytes = bytes;
	q.token = (char *)(token ? token : "");
	req.id = 31;
	req.body_case = MEMTALLY__V1__REQUEST__BODY_SET_LIMIT;
	req.set_limit = &q;
	return fx_call(peer, &req);
}

static inline void fx_expect_error(Memtally__V1__Response *r,
                                   Memtally__V1__ErrorCode code)
{
	cr_assert_not_null(r->error, "expected an error");
	cr_assert_eq(r->error->code, code, "code %d, want %d (%s)",
	             r->error->code, code, r->error->message);
	memtally__v1__response__free_unpacked(r, NULL);
}

static inline struct mtshm_fleet fx_fleet(void)
{
	struct mtshm_fleet f;
	cr_assert_eq(mtshm_fleet_read(srv.map.hdr, &f), 0);
	return f;
}

#endif /* FX_NO_CRITERION */
#endif /* FX_NO_SERVER */
#endif /* MEMTALLY_TEST_SERVER_FIXTURE_H */
