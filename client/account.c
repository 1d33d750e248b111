/*
 * account.c - the slow path of memtally_account() (memtally.h).
 *
 * The fast path keeps `biased = drift + (T - 1)` in [0, 2(T - 1)] for a
 * set-up thread (T = threshold), so a flush is due once |drift| >= T: a
 * thread-local drift flushed past a threshold, the scheme DataFusion
 * Comet's allocator accounting uses. Anything outside, including a brand-new
 * thread whose state is all zero, lands here: publish the drift, re-centre the
 * window, and make sure the thread's drift is flushed when it exits.
 */
#define _GNU_SOURCE
#include "client_internal.h"

#include <errno.h>
#include <pthread.h>

__thread struct memtally__tls memtally__t MTC_TLS;

/* Per thread: lane state and the threshold the current window uses. */
static __thread struct {
	struct mtc_thread th;
	uint64_t half; /* T of the current window; 0 for a new thread */
	uint8_t key_set;
} acc MTC_TLS;

static pthread_key_t exit_key;
static pthread_once_t key_once = PTHREAD_ONCE_INIT;

static int64_t drift_now(void)
{
	if (memtally__t.span == UINT64_MAX)
		return 0; /* disabled: nothing is counted */
	return (int64_t)(memtally__t.biased - acc.half);
}

/* Thread exit: publish what is left and give the lane back. */
static void on_thread_exit(void *unused)
{
	(void)unused;
	int64_t d = drift_now();
	acc.th.busy = 1;
	if (d)
		mtc_publish(&acc.th, d);
	mtc_thread_exit(&acc.th); /* hands a due callback to another thread */
	/* Anything accounted by later destructors is published directly. */
	memtally__t.biased = 0;
	memtally__t.span = 0;
	acc.half = 0;
	acc.th.busy = 0;
}

static void make_key(void)
{
	pthread_key_create(&exit_key, on_thread_exit);
}

static void account_slow_errno(void);

/* The program's errno survives it (a registration's socket calls): free()
 * keeps errno, and a program may free in an error path before it reads
 * errno. */
void memtally__account_slow(void)
{
	int e = errno;
	account_slow_errno();
	errno = e;
}

static void account_slow_errno(void)
{
	struct memtally__tls *t = &memtally__t;
	if (acc.th.busy)
		return; /* re-entered from our own attach: keep counting */
	acc.th.busy = 1;
	uint64_t b0 = t->biased;
	int64_t drift = (int64_t)(b0 - acc.half);
	if (!acc.key_set) {
		/* This thread's first slow path. */
		if (!mtc_init()) {
			/* Disabled: never come back here. */
			t->biased = 0;
			t->span = UINT64_MAX;
			acc.half = 0;
			acc.th.busy = 0;
			return;
		}
		pthread_once(&key_once, make_key);
		acc.key_set = 1;
		pthread_setspecific(exit_key, &acc);
	}
	if (drift)
		mtc_publish(&acc.th, drift);
	/* Keep whatever was accounted re-entrantly while we published. */
	uint64_t extra = t->biased - b0;
	if (acc.th.exited) {
		/* Past the thread's exit flush (a destructor of a key made
		 * after ours): no window, every call published at once, for
		 * no exit flush comes again. What came in re-entrantly goes
		 * with the next call. */
		acc.half = 0;
		t->biased = extra;
		t->span = 0;
		acc.th.busy = 0;
		return;
	}
	uint64_t half = mtc_threshold() - 1;
	acc.half = half;
	t->biased = half + extra;
	t->span = 2 * half;
	acc.th.busy = 0;
	mtc_after_flush(&acc.th);
	mtc_front_sample();
}

static int acc_flush(void)
{
	int64_t d = drift_now();
	if (d && !acc.half) {
		memtally__account_slow(); /* sets the thread up, samples */
		return 0;
	}
	if (acc.th.busy)
		return 0;
	if (d) {
		acc.th.busy = 1;
		mtc_publish(&acc.th, d);
		memtally__t.biased -= (uint64_t)d;
		acc.th.busy = 0;
		mtc_after_flush(&acc.th);
	}
	/* memtally_flush(): the allocator's free bytes too, when due. */
	mtc_front_sample();
	return 0;
}

static int64_t acc_drift(void)
{
	return drift_now();
}

static void acc_force_slow(void)
{
	memtally__t.span = 0;
}

const struct mtc_front mta_front = {
    .flush = acc_flush,
    .drift = acc_drift,
    .force_slow = acc_force_slow,
};
