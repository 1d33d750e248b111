/*
 * test_client_overlimit.c - memtally_on_over_limit(): the callback runs
 * once per rising edge of the slot's over-limit flag, at a flush, in the
 * flushing thread, never nested in itself, and re-arms when the flag
 * clears.
 *
 * The flag is the server's to write; here the test plays the server. A
 * fake listener answers Register with a segment the test created, so the
 * test owns the slot and can raise and clear the flag at will, with no
 * tick racing it; and see what a fork's handlers publish where. Each test
 * runs in its own process (Criterion), so the library's process-wide
 * state starts fresh every time.
 */
#define _GNU_SOURCE

#include <criterion/criterion.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#define FX_NO_SERVER /* the test plays the server itself */
#include "test_server_fixture.h"

#include "memtally.h"
#include "memtally.pb-c.h"
#include "mtframe.h"
#include "mtshm.h"
#include "mtshm_atomic.h"

#define THRESHOLD 4096
#define SLOT_GEN  7

static struct {
	struct mtshm_map map;   /* the header */
	struct mtshm_map table; /* our uid's slot table */
	int hdr_ro;             /* what workers are handed */
	struct mtshm_slot_id *slot;
	int lfd;
	pthread_t thread;
} fx;

/* Answer every Register on every connection with slot 0 of our segment. */
static void *fake_server(void *arg)
{
	(void)arg;
	for (;;) {
		int fd = accept(fx.lfd, NULL, NULL);
		if (fd < 0)
			return NULL;
		uint8_t buf[1024];
		size_t len = 0;
		for (;;) {
			uint64_t blen;
			int pre =
			    mtframe_decode_len(buf, len, sizeof(buf), &blen);
			if (pre > 0 && len >= (size_t)pre + blen) {
				Memtally__V1__Request *req =
				    memtally__v1__request__unpack(NULL, blen,
				                                  buf + pre);
				Memtally__V1__Registered reg =
				    MEMTALLY__V1__REGISTERED__INIT;
				reg.segment = "mt-ol";
				reg.slot = 0;
				reg.slot_generation = SLOT_GEN;
				reg.segment_generation = fx.map.hdr->generation;
				reg.threshold = THRESHOLD;
				Memtally__V1__Response r =
				    MEMTALLY__V1__RESPONSE__INIT;
				r.id = req ? req->id : 0;
				r.body_case =
				    MEMTALLY__V1__RESPONSE__BODY_REGISTERED;
				r.registered = &reg;
				uint8_t out[512];
				size_t n =
				    mtframe_pack(&r.base, out, sizeof(out));
				/* Both descriptors ride on the answer,
				 * as memtallyd sends them. */
				union {
					struct cmsghdr h;
					char b[CMSG_SPACE(2 * sizeof(int))];
				} cm;
				memset(&cm, 0, sizeof(cm));
				int fds[2] = {fx.hdr_ro, fx.table.fd};
				struct iovec iov = {out, n};
				struct msghdr mh = {.msg_iov = &iov,
				                    .msg_iovlen = 1,
				                    .msg_control = cm.b,
				                    .msg_controllen =
				                        sizeof(cm.b)};
				struct cmsghdr *c = CMSG_FIRSTHDR(&mh);
				c->cmsg_level = SOL_SOCKET;
				c->cmsg_type = SCM_RIGHTS;
				c->cmsg_len = CMSG_LEN(sizeof(fds));
				memcpy(CMSG_DATA(c), fds, sizeof(fds));
				ssize_t w = sendmsg(fd, &mh, MSG_NOSIGNAL);
				(void)w;
				memtally__v1__request__free_unpacked(req, NULL);
				break;
			}
			ssize_t n = read(fd, buf + len, sizeof(buf) - len);
			if (n <= 0)
				break;
			len += (size_t)n;
		}
		close(fd);
	}
}

static void setup(void)
{
	struct mtshm_params p = {
	    .slots = 4, .lanes = 4, .threshold = THRESHOLD};
	cr_assert_eq(mtshm_header_create("mt-ol", &p, &fx.map), 0);
	struct mtshm_layout l;
	cr_assert_eq(mtshm_layout_read(fx.map.base, fx.map.size, &l), 0);
	cr_assert_eq(mtshm_table_create("mt-ol-slots", &l, &fx.table), 0);
	fx.hdr_ro = mtshm_reopen_ro(fx.map.fd);
	cr_assert_geq(fx.hdr_ro, 0);
	fx.slot = mtshm_slot(&l, fx.table.base, 0);
	mtshm_store_relaxed64(&fx.slot->generation, SLOT_GEN);
	mtshm_store_release32(&fx.slot->pid, (uint32_t)getpid());

	fx.lfd = fx_listen_unix(fx_sockpath("ol"));
	cr_assert_geq(fx.lfd, 0);
	cr_assert_eq(pthread_create(&fx.thread, NULL, fake_server, NULL), 0);
	setenv("MEMTALLY_SOCKET", sockpath, 1);
}

static void teardown(void)
{
	shutdown(fx.lfd, SHUT_RDWR);
	pthread_join(fx.thread, NULL);
	close(fx.lfd);
	unlink(sockpath);
	close(fx.hdr_ro);
	mtshm_close(&fx.table);
	mtshm_close(&fx.map);
}

static void set_flag(bool over)
{
	mtshm_store_relaxed32(&fx.slot->flags,
	                      over ? MTSHM_SLOT_OVER_LIMIT : 0);
}

/* A flush of the calling thread with something to publish. */
static void flush(void)
{
	memtally_account(8);
	memtally_flush();
}

static atomic_int calls;
static pthread_t cb_thread;

static void count_cb(void *arg)
{
	cb_thread = pthread_self();
	atomic_fetch_add(&calls, 1);
	if (arg)
		atomic_fetch_add((atomic_int *)arg, 1);
}

static void attach(void)
{
	memtally_account(1);
	cr_assert_eq(memtally_flush(), 0, "not attached to the fake");
	cr_assert(memtally_attached());
}

Test(over_limit, once_per_rising_edge, .init = setup, .fini = teardown)
{
	atomic_int mine = 0;
	cr_assert_eq(memtally_on_over_limit(count_cb, &mine), 0);
	attach();
	flush();
	cr_expect_eq(atomic_load(&calls), 0, "flag clear: no call");

	set_flag(true);
	cr_expect(memtally_over_limit(), "read directly, no flush needed");
	cr_expect_eq(atomic_load(&calls), 0, "only at a flush");
	flush();
	cr_expect_eq(atomic_load(&calls), 1);
	cr_expect_eq(atomic_load(&mine), 1, "with its argument");
	cr_expect(pthread_equal(cb_thread, pthread_self()),
	          "in the flushing thread");
	/* Still up: no more calls, through either kind of flush. */
	flush();
	memtally_account(3 * THRESHOLD);
	memtally_account(-3 * THRESHOLD);
	cr_expect_eq(atomic_load(&calls), 1);

	/* Cleared and seen cleared by a flush: re-armed. */
	set_flag(false);
	cr_expect(!memtally_over_limit());
	flush();
	cr_expect_eq(atomic_load(&calls), 1);
	set_flag(true);
	memtally_account(THRESHOLD); /* the slow path flushes, then calls */
	cr_expect_eq(atomic_load(&calls), 2);

	/* A flag that clears and rises between two flushes is no edge. */
	set_flag(false);
	set_flag(true);
	flush();
	cr_expect_eq(atomic_load(&calls), 2);

	/* Removed: the next edge calls nothing. */
	cr_assert_eq(memtally_on_over_limit(NULL, NULL), 0);
	set_flag(false);
	flush();
	set_flag(true);
	flush();
	cr_expect_eq(atomic_load(&calls), 2);
}

Test(over_limit, registered_while_over_runs_at_next_flush, .init = setup,
     .fini = teardown)
{
	attach();
	set_flag(true);
	flush(); /* the edge passes with no callback */
	cr_assert_eq(memtally_on_over_limit(count_cb, NULL), 0);
	cr_expect_eq(atomic_load(&calls), 0, "not from the registration");
	flush();
	cr_expect_eq(atomic_load(&calls), 1);
	flush();
	cr_expect_eq(atomic_load(&calls), 1);
}

/* A callback that allocates (accounts) enough to flush, and meanwhile the
 * flag falls and rises again: the new edge must not run the callback
 * inside itself, but at the next flush after it returned. */
static atomic_int depth, max_depth;

static void nesting_cb(void *arg)
{
	int d = atomic_fetch_add(&depth, 1) + 1;
	if (d > atomic_load(&max_depth))
		atomic_store(&max_depth, d);
	atomic_fetch_add(&calls, 1);
	if (atomic_load(&calls) == 1) {
		set_flag(false);
		memtally_account(2 * THRESHOLD); /* flush: sees it clear */
		set_flag(true);
		memtally_account(-2 * THRESHOLD); /* flush: sees the rise */
	}
	atomic_fetch_sub(&depth, 1);
}

Test(over_limit, callback_never_nests, .init = setup, .fini = teardown)
{
	cr_assert_eq(memtally_on_over_limit(nesting_cb, NULL), 0);
	attach();
	set_flag(true);
	flush();
	cr_expect_eq(atomic_load(&calls), 1);
	cr_expect_eq(atomic_load(&max_depth), 1, "ran inside itself");
	flush(); /* the edge seen inside the callback is run now */
	cr_expect_eq(atomic_load(&calls), 2);
	cr_expect_eq(atomic_load(&max_depth), 1);
	flush();
	cr_expect_eq(atomic_load(&calls), 2);
}

static void *flush_many(void *arg)
{
	(void)arg;
	for (int i = 0; i < 2000; i++)
		memtally_account(i & 1 ? -THRESHOLD : THRESHOLD);
	return NULL;
}

Test(over_limit, one_call_per_edge_across_threads, .init = setup,
     .fini = teardown, .timeout = 60)
{
	cr_assert_eq(memtally_on_over_limit(count_cb, NULL), 0);
	attach();
	for (int round = 1; round <= 3; round++) {
		set_flag(true);
		pthread_t t[4];
		for (int i = 0; i < 4; i++)
			pthread_create(&t[i], NULL, flush_many, NULL);
		for (int i = 0; i < 4; i++)
			pthread_join(t[i], NULL);
		cr_expect_eq(atomic_load(&calls), round, "round %d", round);
		set_flag(false);
		flush(); /* re-arm */
	}
}

/*
 * fork() and the handlers another library registered before ours (a
 * library set up before the process's first count: gRPC, a runtime):
 * prepare handlers run after ours, child and parent handlers before it.
 * What they allocate in the child must not be published into the slot
 * the child still maps (its parent's, and the lane its parent's thread
 * owns); in the parent it is counted as any allocation.
 */
#define FORK_PREP   (3 << 20)
#define FORK_PARENT (5 << 20)
#define FORK_CHILD  (7 << 20)

static void other_prepare(void)
{
	memtally_account(FORK_PREP);
}

static void other_parent(void)
{
	memtally_account(FORK_PARENT);
}

static void other_child(void)
{
	memtally_account(FORK_CHILD);
}

static int64_t slot_sum(void)
{
	uint64_t flushes;
	int absurd;
	return mtshm_slot_sum(fx.slot, 4, &flushes, &absurd);
}

Test(fork, earlier_handlers_do_not_publish_into_the_parents_slot, .init = setup,
     .fini = teardown, .timeout = 60)
{
	/* Before the library's first call, which registers its own. */
	cr_assert_eq(pthread_atfork(other_prepare, other_parent, other_child),
	             0);
	attach();
	memtally_account(2 << 20); /* past the threshold: published */
	int64_t before = slot_sum();
	cr_assert_eq(before, (2 << 20) + 1, "%lld", (long long)before);
	int pipefd[2];
	cr_assert_eq(pipe(pipefd), 0);
	pid_t pid = fork();
	cr_assert_geq(pid, 0);
	if (pid == 0) {
		/* What the child starts from: the parent's total and what
		 * was allocated in the fork's handlers, its own included. */
		int64_t got = memtally_process_bytes();
		ssize_t w = write(pipefd[1], &got, sizeof(got));
		_exit(w == sizeof(got) ? 0 : 1);
	}
	close(pipefd[1]);
	int64_t child = -1;
	cr_assert_eq(read(pipefd[0], &child, sizeof(child)),
	             (ssize_t)sizeof(child));
	close(pipefd[0]);
	int st;
	cr_assert_eq(waitpid(pid, &st, 0), pid);
	cr_assert(WIFEXITED(st) && WEXITSTATUS(st) == 0);
	cr_expect_eq(child, before + FORK_PREP + FORK_CHILD, "child: %lld",
	             (long long)child);
	/* The parent's slot: its own allocations, none of the child's. */
	cr_expect_eq(slot_sum(), before + FORK_PREP + FORK_PARENT,
	             "slot %lld, before %lld", (long long)slot_sum(),
	             (long long)before);
	cr_expect_eq(memtally_process_bytes(),
	             before + FORK_PREP + FORK_PARENT);
}
