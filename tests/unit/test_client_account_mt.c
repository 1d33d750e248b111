#define _GNU_SOURCE
/*
 * The inline API without a server (fail open): every byte accounted by many
 * threads, including threads that exit with drift below the threshold, is
 * in memtally_process_bytes() once they have exited. Runs under TSan too.
 */
#include <criterion/criterion.h>
#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <string.h>
#include <stdlib.h>

#include <stdio.h>
#include <time.h>
#include <unistd.h>

#define FX_NO_SERVER /* memtallyd runs as a child here */
#include "memtallyd_child.h"
#include "test_server_fixture.h"

#include "client_internal.h"
#include "memtally.h"
#include "memtally_query.h"

#define THREADS 8
#define ROUNDS  200000

static void setup(void)
{
	/* Nobody listens here: the library must count locally. */
	setenv("MEMTALLY_SOCKET", "/nonexistent/memtally-test.sock", 1);
}

static void *work(void *arg)
{
	uint64_t s = (uintptr_t)arg * 0x9E3779B97F4A7C15ull | 1;
	int64_t net = 0;
	for (int i = 0; i < ROUNDS; i++) {
		s ^= s << 13, s ^= s >> 7, s ^= s << 17;
		int64_t d = (int64_t)(s % 100000) - 40000;
		memtally_account(d);
		net += d;
	}
	return (void *)(intptr_t)net;
}

Test(client_account, threads_exit_flush_everything, .init = setup,
     .timeout = 60)
{
	pthread_t t[THREADS];
	int64_t want = 0;
	for (int i = 0; i < THREADS; i++)
		pthread_create(&t[i], NULL, work, (void *)(uintptr_t)(i + 1));
	for (int i = 0; i < THREADS; i++) {
		void *r;
		pthread_join(t[i], &r);
		want += (intptr_t)r;
	}
	cr_assert(!memtally_attached());
	cr_assert_eq(memtally_process_bytes(), want, "got %lld want %lld",
	             (long long)memtally_process_bytes(), (long long)want);
}

/* A destructor of a key made after the library's runs after the thread's
 * exit flush: each of its calls is published, none left in a window that
 * no exit flush comes for again. */
static pthread_key_t later_key;

static void later_dtor(void *v)
{
	(void)v;
	memtally_account(-300);
	memtally_account(-300);
	memtally_account(-300);
}

static void *account_then_later_key(void *arg)
{
	(void)arg;
	memtally_account(1000); /* the library's key is made here */
	pthread_key_create(&later_key, later_dtor);
	pthread_setspecific(later_key, (void *)1);
	return NULL;
}

Test(client_account, calls_after_the_exit_flush_are_published, .init = setup)
{
	int64_t before = memtally_process_bytes();
	pthread_t t;
	pthread_create(&t, NULL, account_then_later_key, NULL);
	pthread_join(t, NULL);
	cr_assert_eq(memtally_process_bytes() - before, 100, "got %lld",
	             (long long)(memtally_process_bytes() - before));
}

Test(client_account, small_drift_is_not_lost, .init = setup)
{
	/* Below the threshold: stays in the thread's drift, still visible. */
	memtally_account(1000);
	memtally_account(-1);
	cr_assert_eq(memtally_process_bytes(), 999);
	cr_assert_eq(memtally_flush(), MEMTALLY_ENOTATTACHED);
	cr_assert_eq(memtally_process_bytes(), 999);
	memtally_account(-999);
	cr_assert_eq(memtally_process_bytes(), 0);
}

Test(client_account, disabled_counts_nothing)
{
	setenv("MEMTALLY_DISABLE", "1", 1);
	memtally_account(1 << 20);
	memtally_account(1 << 20);
	cr_assert_eq(memtally_flush(), MEMTALLY_EDISABLED);
	cr_assert_eq(memtally_process_bytes(), 0);
}

Test(client_account, strerror_names_codes)
{
	cr_assert_str_eq(memtally_strerror(MEMTALLY_ENOTATTACHED),
	                 "not attached to a memtally server");
	cr_assert_str_eq(memtally_strerror(-ENOENT),
	                 "No such file or directory");
	cr_assert_str_eq(memtally_version(), MEMTALLY_VERSION_STRING);
}

/* ---- against a real memtallyd: lanes, overflow, exactness -------------- */

static struct mtd_child server;

static void start_server(void)
{
	static const char *const args[] = {"--log-level", "warn", "--lanes",
	                                   "4", NULL};
	cr_assert_eq(mtd_start(&server, "unit", MEMTALLYD_PATH, -1, args), 0,
	             "memtallyd did not come up");
	setenv("MEMTALLY_SOCKET", server.sock, 1);
}

static void stop_server(void)
{
	/* Not 0: a sanitizer's report in memtallyd (its log is kept). */
	int status = mtd_stop(&server, false);
	cr_assert_eq(status, 0, "memtallyd's wait status at its stop: %#x",
	             status);
}

Test(client_account, many_threads_exact_through_the_server,
     .init = start_server, .fini = stop_server, .timeout = 120)
{
	/* 16 threads on 4 lanes: some own a lane, the rest use the slot's
	 * overflow counter; all exit, so the count must be exact. */
	enum { N = 16 };
	pthread_t t[N];
	int64_t want = 0;
	memtally_account(1); /* attach from the main thread first */
	cr_assert_eq(memtally_flush(), 0, "not attached");
	want += 1;
	for (int i = 0; i < N; i++)
		pthread_create(&t[i], NULL, work, (void *)(uintptr_t)(i + 100));
	for (int i = 0; i < N; i++) {
		void *r;
		pthread_join(t[i], &r);
		want += (intptr_t)r;
	}
	cr_assert(memtally_attached());
	cr_assert_eq(memtally_process_bytes(), want);

	/* The server sees exactly that too, at its next tick. */
	memtally_query *q;
	cr_assert_eq(memtally_query_open(&q, server.sock, 5000), 0);
	uint64_t end = fx_deadline_ms(10000);
	int64_t seen = -1;
	uint32_t threads = 0;
	while (fx_ms() < end) {
		struct memtally_process *p = NULL;
		cr_assert_eq(memtally_query_process(q, (uint32_t)getpid(), &p),
		             0);
		seen = (int64_t)p->bytes;
		threads = p->threads;
		memtally_process_free(p);
		/* Figures are as of the server's latest tick. Only the main
		 * thread may still be counted (if it flushed after attach). */
		if (seen == want && threads <= 1)
			break;
		struct timespec ts = {0, 10 * 1000 * 1000};
		nanosleep(&ts, NULL);
	}
	memtally_query_close(q);
	cr_assert_eq(seen, want, "server %lld, want %lld", (long long)seen,
	             (long long)want);
	cr_assert_leq(threads, 1, "live threads %u: lanes not released",
	              threads);
}

/* ---- memtally_set_group() ---------------------------------------------- */

static const char *const group_names[] = {
    "a",
    "analytics-batch-nightly-0123456789-abcdefghijklmnopqrstuvwxyz",
    "web",
};

static atomic_int group_stop;

static void *group_writer(void *arg)
{
	unsigned i = (unsigned)(uintptr_t)arg;
	while (!atomic_load(&group_stop))
		memtally_set_group(group_names[i++ % 3]);
	return NULL;
}

Test(client_group, concurrent_set_group_is_never_torn, .init = setup,
     .timeout = 60)
{
	/* Two threads change the group while a third copies it as a
	 * registration would: each copy is one whole name, never a mix of
	 * two (the names share no suffix, so a torn copy differs from all). */
	pthread_t w[2];
	for (unsigned i = 0; i < 2; i++)
		pthread_create(&w[i], NULL, group_writer, (void *)(uintptr_t)i);
	unsigned seen[3] = {0}, copies = 0;
	for (int n = 0; n < 200000; n++) {
		char g[MTC_GROUP_MAX];
		if (!mtc_group_copy(g))
			continue;
		copies++;
		bool whole = false;
		for (int k = 0; k < 3; k++)
			if (strcmp(g, group_names[k]) == 0)
				seen[k]++, whole = true;
		cr_assert(whole || g[0] == 0, "torn group copy \"%s\"", g);
	}
	atomic_store(&group_stop, 1);
	for (int i = 0; i < 2; i++)
		pthread_join(w[i], NULL);
	cr_assert_gt(copies, 100000, "only %u copies succeeded", copies);
	cr_assert_eq(memtally_set_group(
	                 "x123456789x123456789x123456789x123456789x123456789"
	                 "x123456789x12345"),
	             -EINVAL, "a 65-byte name must be refused");
}

Test(client_group, set_group_wins_over_the_environment, .init = start_server,
     .fini = stop_server, .timeout = 60)
{
	setenv("MEMTALLY_GROUP", "from-env", 1);
	cr_assert_eq(memtally_set_group("analytics"), 0);
	memtally_account(1 << 20);
	cr_assert_eq(memtally_flush(), 0, "not attached");
	memtally_query *q;
	cr_assert_eq(memtally_query_open(&q, server.sock, 5000), 0);
	struct memtally_process *p = NULL;
	cr_assert_eq(memtally_query_process(q, (uint32_t)getpid(), &p), 0);
	cr_assert_str_eq(p->group, "analytics");
	memtally_process_free(p);
	memtally_query_close(q);
	memtally_account(-(1 << 20));
}
