/*
 * test_shm_seqlock_mt.c - mtshm_fleet_read() never returns a torn snapshot.
 *
 * A writer thread publishes fleet snapshots in which every field carries
 * the same value v (bytes == peak == ticks == ... == v, seq == 2v), through
 * the seqlock writer protocol that pairs with the reader loop documented in
 * mtshm.h:
 *
 *	s = seq; seq = s + 1 (relaxed); release fence;
 *	store the fields (relaxed);
 *	seq = s + 2 (release);
 *
 * A reader on a second, read-only mapping of the same object checks every
 * snapshot it gets for equal fields, an even seq matching them, and values
 * that never go back. The file name ends in _mt so ctest labels it
 * "threads" and the TSan build runs it.
 *
 * Time is bounded by the reader's own deadline and, for a reader that would
 * spin forever, by alarm(); both scale with MEMTALLY_TEST_TIMEOUT_MULT.
 */
#define _GNU_SOURCE
#include "mtshm.h"

#include <criterion/criterion.h>
#include <errno.h>
#include <stddef.h>
#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

TestSuite(seqlock);

static unsigned timeout_mult(void)
{
	const char *s = getenv("MEMTALLY_TEST_TIMEOUT_MULT");
	int m = s ? atoi(s) : 1;
	return m > 0 ? (unsigned)m : 1;
}

static double now_s(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

/* Create a header and a second, read-only mapping of it, as a worker
 * maps the descriptor it is handed. */
static void setup(struct mtshm_map *w, struct mtshm_map *r)
{
	struct mtshm_params p = {.slots = 1, .lanes = 1, .threshold = 1};
	cr_assert_eq(mtshm_header_create("mt-seq", &p, w), 0);
	int ro = mtshm_reopen_ro(w->fd);
	cr_assert_geq(ro, 0);
	cr_assert_eq(mtshm_map_fd(ro, MTSHM_SEALS_HEADER, 0, r), 0);
	close(ro);
	cr_assert_neq(w->base, r->base);
}

/* The data stores of one snapshot: every field = v. */
static void store_fields(struct mtshm_fleet *f, uint64_t v)
{
	mtshm_store_relaxed64(&f->bytes, v);
	mtshm_store_relaxed64(&f->limit, v);
	mtshm_store_relaxed64(&f->reserved, v);
	mtshm_store_relaxed64(&f->error_bytes, v);
	mtshm_store_relaxed64(&f->heartbeat_ns, v);
	mtshm_store_relaxed64(&f->ticks, v);
	mtshm_store_relaxed32(&f->state, (uint32_t)v);
	mtshm_store_relaxed32(&f->processes, (uint32_t)v);
	mtshm_store_relaxed32(&f->unregistered, (uint32_t)v);
	mtshm_store_relaxed64(&f->peak, v); /* last, far from bytes */
}

/* The real writer, mtshm_fleet_publish(), with every field = v. */
static void publish(struct mtshm_fleet *f, uint64_t v)
{
	struct mtshm_fleet in = {
		.bytes = v, .peak = v, .limit = v, .reserved = v,
		.error_bytes = v, .heartbeat_ns = v, .ticks = v,
		.state = (uint32_t)v, .processes = (uint32_t)v,
		.unregistered = (uint32_t)v};
	mtshm_fleet_publish((struct mtshm_header *)((char *)f -
			    offsetof(struct mtshm_header, fleet)), &in);
}

/*
 * Every field of a snapshot must come from the same publish. Returns 0, or
 * -1 with a description in why[].
 */
static int check_snapshot(const struct mtshm_fleet *o, char *why, size_t n)
{
	uint64_t v = o->bytes;
	int torn = o->peak != v || o->limit != v || o->reserved != v ||
	           o->error_bytes != v || o->heartbeat_ns != v ||
	           o->ticks != v || o->state != (uint32_t)v ||
	           o->processes != (uint32_t)v ||
	           o->unregistered != (uint32_t)v;
	if (!torn && o->seq == 2 * v)
		return 0;
	snprintf(why, n,
	         "%s snapshot: seq %llu bytes %llu peak %llu ticks %llu "
	         "state %u",
	         torn ? "torn" : "seq/value mismatch",
	         (unsigned long long)o->seq, (unsigned long long)v,
	         (unsigned long long)o->peak, (unsigned long long)o->ticks,
	         o->state);
	return -1;
}

struct writer {
	struct mtshm_fleet *f;
	int stop;
	uint64_t published;
};

static void *writer_main(void *arg)
{
	struct writer *w = arg;
	uint64_t v = 0;
	while (!__atomic_load_n(&w->stop, __ATOMIC_RELAXED))
		publish(w->f, ++v);
	__atomic_store_n(&w->published, v, __ATOMIC_RELAXED);
	return NULL;
}

Test(seqlock, reader_never_sees_a_torn_snapshot)
{
	/*
	 * Read at least READS times, and on until CHANGES distinct snapshots
	 * were seen or the deadline passed: on an idle machine both threads
	 * run at once and that takes well under a second; on a loaded one
	 * they may only alternate, and the deadline ends the test. It fails
	 * on a torn snapshot, or if the reader or the writer barely moved
	 * (READS, MIN_CHANGES), which would make it prove nothing. The
	 * deadline is long: beside other tests on a loaded 2-core machine,
	 * READS took over 20 s under TSan.
	 */
	enum { READS = 200000, CHANGES = 10000, MIN_CHANGES = 100 };
	const unsigned mult = timeout_mult();
	alarm(60 * mult);

	struct mtshm_map wm, rm;
	setup(&wm, &rm);
	struct writer w = {.f = &wm.hdr->fleet};
	pthread_t th;
	cr_assert_eq(pthread_create(&th, NULL, writer_main, &w), 0);

	/* Start reading once the writer is running. */
	while (mtshm_load_acquire64(&rm.hdr->fleet.seq) < 2)
		sched_yield();

	const double deadline = now_s() + 20.0 * mult;
	uint64_t reads = 0, changes = 0, last = 0;
	struct mtshm_fleet o;
	char why[160] = "";
	int bad = 0;
	while (!bad && (reads < READS || changes < CHANGES) &&
	       now_s() < deadline) {
		/* Check the clock only every 1024 reads, and let the writer
		 * in should the two share a core. */
		sched_yield();
		for (int i = 0; i < 1024 && !bad; i++, reads++) {
			/* -EAGAIN: the writer kept the seqlock busy for
			 * all tries; that is allowed, a torn 0 is not. */
			if (mtshm_fleet_read(rm.hdr, &o) == -EAGAIN)
				continue;
			bad = check_snapshot(&o, why, sizeof(why));
			if (!bad && o.bytes < last) {
				snprintf(why, sizeof(why),
				         "snapshot went back from %llu to %llu",
				         (unsigned long long)last,
				         (unsigned long long)o.bytes);
				bad = 1;
			}
			changes += o.bytes != last;
			last = o.bytes;
		}
	}
	/* Stop the writer before any assertion ends the test. */
	__atomic_store_n(&w.stop, 1, __ATOMIC_RELAXED);
	pthread_join(th, NULL);
	cr_assert(!bad, "after %llu reads: %s", (unsigned long long)reads, why);

	cr_log_info("%llu reads, %llu distinct snapshots, %llu published",
	            (unsigned long long)reads, (unsigned long long)changes,
	            (unsigned long long)w.published);
	/* Not vacuous: the reader ran long and raced a moving writer. */
	cr_expect_geq(reads, READS, "only %llu reads before the deadline",
	              (unsigned long long)reads);
	cr_expect_geq(changes, MIN_CHANGES,
	              "the writer barely moved: %llu snapshots by the deadline",
	              (unsigned long long)changes);
}

struct reader {
	const struct mtshm_header *h;
	struct mtshm_fleet out;
	unsigned long gave_up; /* reads that returned -EAGAIN */
};

/* Read until a consistent snapshot comes back; the bounded reader returns
 * -EAGAIN while the writer is inside, never a torn snapshot. */
static void *reader_main(void *arg)
{
	struct reader *r = arg;
	while (mtshm_fleet_read(r->h, &r->out) == -EAGAIN)
		r->gave_up++;
	return NULL;
}

Test(seqlock, reader_waits_out_a_writer_inside)
{
	alarm(30 * timeout_mult());
	struct mtshm_map wm, rm;
	setup(&wm, &rm);
	struct mtshm_fleet *f = &wm.hdr->fleet;
	publish(f, 5);

	/* A writer stopped half way: seq odd, some fields new, some old. */
	mtshm_store_relaxed64(&f->seq, 11);
	mtshm_store_release64(&f->bytes, 6);
	mtshm_store_release64(&f->ticks, 6);

	struct reader r = {.h = rm.hdr};
	pthread_t th;
	cr_assert_eq(pthread_create(&th, NULL, reader_main, &r), 0);
	/* Give the reader time to meet the odd seq; it must keep waiting.
	 * (Were it to start after the writer finished, the test would pass
	 * without proving anything, never fail wrongly.) */
	struct timespec pause = {0, 50 * 1000 * 1000};
	nanosleep(&pause, NULL);

	store_fields(f, 6);
	mtshm_store_release64(&f->seq, 12);
	pthread_join(th, NULL);
	char why[160] = "";
	cr_expect_eq(check_snapshot(&r.out, why, sizeof(why)), 0, "%s", why);
	cr_expect_eq(r.out.seq, 12);
	cr_expect_eq(r.out.bytes, 6);
}

Test(seqlock, dead_writer_is_reported_not_spun_on)
{
	alarm(30 * timeout_mult());
	struct mtshm_map wm, rm;
	setup(&wm, &rm);
	struct mtshm_fleet *f = &wm.hdr->fleet;
	publish(f, 5);
	/* The writer died inside: seq stays odd forever. */
	mtshm_store_relaxed64(&f->seq, 11);
	struct mtshm_fleet out;
	cr_assert_eq(mtshm_fleet_read(rm.hdr, &out), -EAGAIN);
	cr_assert_eq(out.seq, 11);
	/* A later complete publish is read again. */
	mtshm_store_relaxed64(&f->seq, 12);
	cr_assert_eq(mtshm_fleet_read(rm.hdr, &out), 0);
	cr_assert_eq(out.bytes, 5);
}

/*
 * Lane 0's free-bytes sample (layout 2.2): a writer stores the pairs
 * (free i, heap 2^40 - i) with mtshm_free_store(); a reader asks
 * mtshm_free_now() at heap 2^40, remembering nothing between reads. A
 * whole pair gives i - i = 0; a torn one (a new free with an old heap)
 * gives more. The reader must only ever get 0, or be told to keep its
 * last value.
 */
struct free_writer {
	struct mtshm_slot_id *s;
	int stop;
	uint64_t published;
};

static void *free_writer_main(void *arg)
{
	struct free_writer *w = arg;
	int64_t i = 0;
	while (!__atomic_load_n(&w->stop, __ATOMIC_RELAXED)) {
		i++;
		mtshm_free_store(w->s, i, (INT64_C(1) << 40) - i);
		/* A writer that never pauses can leave a reader on another
		 * core no whole sample at all; real clients store once a
		 * second. Pausing now and then keeps both kinds of read. */
		if ((i & 255) == 0)
			sched_yield();
	}
	__atomic_store_n(&w->published, (uint64_t)i, __ATOMIC_RELAXED);
	return NULL;
}

Test(seqlock, free_sample_never_torn)
{
	enum { READS = 200000, MIN_WHOLE = 100 };
	const unsigned mult = timeout_mult();
	alarm(60 * mult);
	_Alignas(128) static uint8_t line[2 * MTSHM_LINE];
	struct mtshm_slot_id *s = (struct mtshm_slot_id *)line;
	struct free_writer w = {.s = s};
	pthread_t th;
	cr_assert_eq(pthread_create(&th, NULL, free_writer_main, &w), 0);
	while (mtshm_load_acquire64(&mtshm_lane(s, 0)->free_seq) < 2)
		sched_yield();
	const double deadline = now_s() + 5.0 * mult;
	uint64_t reads = 0, whole = 0, bad = 0, out = 0;
	/* Read until both enough reads and enough whole samples, or the
	 * deadline: a busy machine may give few whole samples early. */
	while (!bad && (reads < READS || whole < MIN_WHOLE) &&
	       now_s() < deadline) {
		sched_yield();
		for (int i = 0; i < 1024; i++, reads++) {
			int absurd;
			struct mtshm_free_held h = {0};
			out = 77;
			if (!mtshm_free_now(s, UINT64_C(1) << 40, &h, &out,
			                    &absurd))
				continue;
			whole++;
			if (out != 0 || absurd) {
				bad = 1;
				break;
			}
		}
	}
	__atomic_store_n(&w.stop, 1, __ATOMIC_RELAXED);
	pthread_join(th, NULL);
	cr_assert(!bad, "torn sample after %llu reads: free now %llu",
	          (unsigned long long)reads, (unsigned long long)out);
	cr_log_info("%llu reads, %llu whole samples, %llu published",
	            (unsigned long long)reads, (unsigned long long)whole,
	            (unsigned long long)w.published);
	cr_expect_geq(whole, MIN_WHOLE, "only %llu whole samples read",
	              (unsigned long long)whole);
	cr_expect_geq(w.published, 100, "the writer barely moved");
}
