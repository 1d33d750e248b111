#define _GNU_SOURCE
/*
 * The inline API without a server (fail open): every byte accounted by many
 * threads, including threads that exit with drift below the threshold, is
 * in memtally_process_bytes() once they have exited. Runs under TSan too.
 */
#include <criterion/criterion.h>
#include <errno.h>
#include <pthread.h>
#include <stdlib.h>

#include "memtally.h"

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
	cr_assert_str_eq(memtally_strerror(-ENOENT), "No such file or directory");
	cr_assert_str_eq(memtally_version(), MEMTALLY_VERSION_STRING);
}
