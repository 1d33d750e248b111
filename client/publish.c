/*
 * publish.c - what runs at every 64 KiB of a thread's drift once the
 * quiet publish (publish.h) cannot be made: the drift into the thread's
 * lane of the process's slot, the lanes' claim and release, the look at
 * the server's heartbeat, and the over-limit flag's edge and callback.
 *
 * Invariants:
 *  - Liveness costs nothing on the flush path while the server ticks: a
 *    full flush compares the header's tick counter with the one the
 *    thread saw last (a shared line the server writes once a tick), and
 *    only when it has not moved for MTC_VERIFY_EVERY flushes (quiet ones
 *    included: a full flush arms at most the rest of them) reads the clock
 *    to decide whether the server is gone or its segment replaced.
 *  - The over-limit callback runs only from mtc_after_flush(), after the
 *    front end finished its flush and dropped its re-entrancy guard. The
 *    flush itself only notes a rising edge of the slot's flag (one relaxed
 *    load of the slot's flags, one of `mtc_w.gate`, which quiet publishes
 *    compare too): it neither blocks nor calls out.
 */
#define _GNU_SOURCE
#include "core.h"

#include <sched.h>
#include <stdint.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "mtcommon.h"

/* Read by the front ends' fast paths (client_internal.h): the epoch,
 * bumped whenever the slot changes, and the gate, the epoch's low half
 * above the slot's flags as the latest full flush saw them (edge
 * detection, after_store), on the page a fork's child gets zeroed
 * (publish.h); the threshold threads use, in bytes. */
_Alignas(MTC_WIPED_SIZE) struct mtc_wiped mtc_w;
_Static_assert(sizeof(mtc_w) == MTC_WIPED_SIZE, "one page, ours alone");
uint64_t mtc_thresh = MT_DEFAULT_THRESHOLD;
/* The page is wiped in a fork's child (set once, before main). */
bool mtc_wipe_on;

/*
 * Before any fork, and before the program's own constructors run (the
 * library's run first): ask the kernel to zero mtc_w in every child. The
 * page is in the anonymous part of .bss (page-aligned, past the file's
 * data), where MADV_WIPEONFORK applies. Where it does not (before Linux
 * 4.14, pages larger than 4 KiB), a fork that runs no handler of ours
 * goes unseen, as it always did.
 */
__attribute__((constructor(101))) static void wipe_on_fork(void)
{
	if ((long)MTC_WIPED_SIZE % sysconf(_SC_PAGESIZE) == 0 &&
	    madvise(&mtc_w, sizeof(mtc_w), MADV_WIPEONFORK) == 0) {
		__atomic_store_n(&mtc_w.seen, 1, __ATOMIC_RELEASE);
		__atomic_store_n(&mtc_w.mm_seen, 1, __ATOMIC_RELEASE);
		mtc_wipe_on = true;
	}
}
__thread uint8_t mtc_forking MTC_TLS;

void mtc_fork_begin(void)
{
	if (mtc_forking++ == 0)
		__atomic_fetch_or(&mtc_w.epoch, MTC_EPOCH_FORKING,
		                  __ATOMIC_SEQ_CST);
}

bool mtc_fork_end(void)
{
	if (!mtc_forking || --mtc_forking)
		return false;
	__atomic_fetch_and(&mtc_w.epoch, ~MTC_EPOCH_FORKING, __ATOMIC_SEQ_CST);
	return true;
}

void mtc_fork_reset(void)
{
	mtc_forking = 0;
	__atomic_fetch_and(&mtc_w.epoch, ~MTC_EPOCH_FORKING, __ATOMIC_SEQ_CST);
}

/* The epoch lanes are claimed in, without the fork bit. */
static inline uint64_t epoch_now(void)
{
	return mtshm_load_relaxed64(&mtc_w.epoch) & ~MTC_EPOCH_FORKING;
}

void mtc_pending_redrain(void)
{
	const struct mtc_attachment *a =
	    (const struct mtc_attachment *)(uintptr_t)__atomic_load_n(
	        &mtc_w.cur, __ATOMIC_SEQ_CST);
	if (a) {
		int64_t p = mtshm_exchange_relaxeds64(&mtc_proc.pending, 0);
		if (p)
			mtshm_add_relaxeds64(&a->slot->overflow, p);
	}
}

/* ---- lanes ----------------------------------------------------------- */

static void claim(struct mtc_thread *th, const struct mtc_attachment *a,
                  uint64_t epoch)
{
	struct mtshm_slot_id *s = a->slot;
	uint32_t tid = (uint32_t)syscall(SYS_gettid);
	uint32_t lanes = a->layout.lane_count;
	th->lane = NULL;
	for (uint32_t k = 0; k < lanes; k++) {
		struct mtshm_lane *l = mtshm_lane(s, k);
		if (mtshm_load_relaxed32(&l->owner) == 0 &&
		    mtshm_cas_acquire32(&l->owner, 0, tid)) {
			mtshm_max_relaxed32(&s->lanes_used, k + 1);
			th->lane = l;
			break;
		}
	}
	mtshm_add_relaxed32(&s->threads, 1);
	th->counted = 1;
	th->slot = s;
	th->epoch = epoch;
	th->gate_epoch = GATE_EPOCH(epoch);
}

/* Its lane goes back, and its count, only in the slot we are attached to
 * now: an old slot is abandoned (the server may have given it to another
 * process since), and the parent's, in a forked child, is not ours. Not
 * by the epoch: a thread can claim a lane in a new slot under the epoch
 * before it (take_reply stores the slot, then moves the epoch), and that
 * lane would never be given back. */
static void release(struct mtc_thread *th)
{
	if (th->slot && th->slot == cur_slot()) {
		if (th->counted)
			mtshm_add_relaxed32(&th->slot->threads, -1);
		if (th->lane) {
			/* Its quiet flushes since the last full one. */
			struct mtshm_lane *l = th->lane;
			mtshm_store_relaxed64(
			    &l->flushes,
			    mtshm_load_relaxed64(&l->flushes) +
			        (uint32_t)(th->quiet_armed - th->quiet_left));
			mtshm_store_release32(&l->owner, 0);
		}
	}
	th->quiet_left = th->quiet_armed = 0;
	th->lane = NULL;
	th->slot = NULL;
	th->counted = 0;
}

/* Is the server still ticking the segment our slot lives in? Also from
 * the refresh thread's rounds (mtc_refresh_once): a quiet worker makes no
 * flush that would look, and a restarted server that could not adopt it
 * would count nothing of it until it did. */
void mtc_heartbeat_check(const struct mtshm_header *h)
{
	uint64_t hb = mtshm_load_relaxed64(&h->fleet.heartbeat_ns);
	uint64_t now = mt_mono_ns();
	uint64_t period = mtshm_load_relaxed64(&mtc_proc.tick_period_ns);
	uint64_t stale = MTC_STALE_NS;
	if (period < UINT64_MAX / 3 && 3 * period > stale)
		stale = 3 * period;
	/* Subtracted, not added: a heartbeat near 2^64 (a server's
	 * garbage) would wrap hb + MTC_STALE_NS and look stale for ever. */
	if (hb <= now && now - hb > stale &&
	    now >= mtshm_load_relaxed64(&mtc_proc.next_try_ns)) {
		mtc_debug("server heartbeat stale; re-registering");
		mtc_maybe_attach(ATTACH_NOW);
	}
}

/* ---- the over-limit callback ----------------------------------------- */

#define OVER_CB_TRIES 64

/* The slot's flags changed since a full flush last saw them (the low
 * half of `g`, mtc_w.gate as read). Each change is made by the one thread
 * whose CAS wins; on a rise of the over-limit flag that thread owes the
 * callback; a fall re-arms. */
static __attribute__((noinline)) void flags_edge(struct mtc_thread *th,
                                                 uint64_t g, uint32_t flags)
{
	while ((uint32_t)g != flags) {
		uint32_t seen = (uint32_t)g;
		if (__atomic_compare_exchange_n(
		        &mtc_w.gate, &g, (g & ~GATE_FLAGS) | flags, 0,
		        __ATOMIC_ACQUIRE, __ATOMIC_RELAXED)) {
			if ((flags & ~seen) & MTSHM_SLOT_OVER_LIMIT)
				th->over_due = 1;
			if ((flags & ~seen) & MTSHM_SLOT_RECONCILE)
				th->maps_due = 1;
			if ((flags & ~seen) & MTSHM_SLOT_REATTACH)
				th->reattach_due = 1;
			return;
		}
	}
}

/* Forget that the over-limit flag was seen up: the next publish (of any
 * thread, quiet or not) that finds it up is a rise. */
static void over_rearm(void)
{
	__atomic_fetch_and(&mtc_w.gate, ~(uint64_t)MTSHM_SLOT_OVER_LIMIT,
	                   __ATOMIC_RELAXED);
}

/* Snapshot the callback pair; false if a writer kept it busy throughout
 * (see the reader loop at `cb_seq`). */
static bool over_cb_load(uint64_t *fn, uint64_t *arg)
{
	for (int i = 0; i < OVER_CB_TRIES; i++) {
		uint32_t s1 =
		    __atomic_load_n(&mtc_proc.cb_seq, __ATOMIC_ACQUIRE);
		if (s1 & 1)
			continue;
		*fn = __atomic_load_n(&mtc_proc.cb_fn, __ATOMIC_ACQUIRE);
		*arg = __atomic_load_n(&mtc_proc.cb_arg, __ATOMIC_ACQUIRE);
		if (__atomic_load_n(&mtc_proc.cb_seq, __ATOMIC_RELAXED) == s1)
			return true;
	}
	return false;
}

void mtc_run_over_limit(struct mtc_thread *th)
{
	/* Nested in the callback (it allocated and a flush saw a new rise)
	 * or in a flush: leave it due for a later flush. */
	if (th->in_over_cb || th->busy)
		return;
	uint64_t fn, arg;
	if (!over_cb_load(&fn, &arg))
		return; /* a registration in progress: at the next flush */
	th->over_due = 0;
	if (!fn)
		return;
	th->in_over_cb = 1;
	((void (*)(void *))(uintptr_t)fn)((void *)(uintptr_t)arg);
	th->in_over_cb = 0;
}

void mtc_over_handoff(struct mtc_thread *th)
{
	if (!th->over_due)
		return;
	th->over_due = 0;
	/* Re-arm: the next flush (of any thread) that sees the flag still
	 * up owes the callback. */
	over_rearm();
}

int memtally_on_over_limit(void (*cb)(void *arg), void *arg)
{
	uint32_t seq = mtc_seq_write_begin(&mtc_proc.cb_seq);
	/* Release: a reader that sees a new value sees the odd sequence. */
	__atomic_store_n(&mtc_proc.cb_fn, (uint64_t)(uintptr_t)cb,
	                 __ATOMIC_RELEASE);
	__atomic_store_n(&mtc_proc.cb_arg, (uint64_t)(uintptr_t)arg,
	                 __ATOMIC_RELEASE);
	__atomic_store_n(&mtc_proc.cb_seq, seq + 2, __ATOMIC_RELEASE);
	/* A flag already up runs the new callback at the next flush. */
	over_rearm();
	return 0;
}

/* ---- publishing -------------------------------------------------------- */

/* After a lane or overflow store: the server's verdicts, read through the
 * current attachment (a restarted server that kept our slot publishes its
 * ticks in a new header, which threads must follow without re-claiming).
 * `l`: the thread's own lane, which it stored into (NULL: the overflow).
 * Counts this flush and the quiet ones since the last full one, and arms
 * the next run of quiet ones (client_internal.h, mtc_publish_quiet). */
static inline void after_store(struct mtc_thread *th,
                               const struct mtc_attachment *a,
                               struct mtshm_lane *l)
{
	/* The server's verdict as of its latest tick: a change from what the
	 * previous full flush (of any thread) saw is an edge. */
	uint32_t flags = mtshm_load_relaxed32(&a->slot->flags);
	uint64_t g = __atomic_load_n(&mtc_w.gate, __ATOMIC_RELAXED);
	if (__builtin_expect(flags != (uint32_t)g, 0)) {
		flags_edge(th, g, flags);
		/* A restarted server holds our slot for us but could not
		 * adopt it: register again now, carrying its total into
		 * the new slot, as at a stale heartbeat. */
		if (th->reattach_due) {
			th->reattach_due = 0;
			mtc_debug("the server asks us to register again");
			mtc_maybe_attach(ATTACH_NOW);
		}
	}
	uint32_t n = 1 + (uint32_t)(th->quiet_armed - th->quiet_left);
	if (l)
		mtshm_store_relaxed64(&l->flushes,
		                      mtshm_load_relaxed64(&l->flushes) + n);
	uint64_t ticks = mtshm_load_relaxed64(&a->hdr->fleet.ticks);
	if (ticks != th->seen_ticks) {
		th->seen_ticks = ticks;
		th->since_verify = 0;
	} else if (__builtin_expect((th->since_verify += n) >= MTC_VERIFY_EVERY,
	                            0)) {
		th->since_verify = 0;
		mtc_heartbeat_check(a->hdr);
	}
	int32_t left =
	    l ? (int32_t)(MTC_VERIFY_EVERY - 1 - th->since_verify) : 0;
	th->quiet_left = th->quiet_armed = left;
}

/* Everything but a set-up thread publishing into its own lane: not
 * attached (pending), an exited thread, a first flush or one after a
 * re-attach (claim a lane), no lane free (overflow). Kept out of line so
 * that the common case below needs few registers
 * (bench/results/alloc_overhead.md). */
__attribute__((noinline, cold)) static void publish_cold(struct mtc_thread *th,
                                                         int64_t delta)
{
	if (__builtin_expect(mtc_forking, 0)) {
		/* Inside fork() (publish.h): neither the slot nor an attach. */
		mtc_quiet_off(th);
		mtshm_add_relaxeds64(&mtc_proc.fork_pending, delta);
		return;
	}
	/* The epoch, then the attachment afresh: one read before the epoch
	 * may be older than it (take_reply stores `cur`, then bumps the
	 * epoch with release). */
	uint64_t epoch =
	    mtshm_load_acquire64(&mtc_w.epoch) & ~MTC_EPOCH_FORKING;
	const struct mtc_attachment *a = cur_att();
	struct mtshm_slot_id *s = a ? a->slot : NULL;
	if (!s) {
		mtc_quiet_off(th);
		/* Sequentially consistent, as attach()'s publication of `cur`
		 * and drain of `pending` are: see there. */
		__atomic_fetch_add(&mtc_proc.pending, delta, __ATOMIC_SEQ_CST);
		mtc_maybe_attach(ATTACH_LAZY);
		mtc_pending_redrain();
		return;
	}
	if (th->exited) {
		mtshm_add_relaxeds64(&s->overflow, delta);
		return;
	}
	if (th->epoch != epoch || th->slot != s) {
		release(th);
		claim(th, a, epoch);
	}
	struct mtshm_lane *l = th->lane;
	if (l)
		mtshm_add_owned_s64(&l->bytes, delta);
	else
		mtshm_add_relaxeds64(&s->overflow, delta);
	after_store(th, a, l);
}

void mtc_publish(struct mtc_thread *th, int64_t delta)
{
	const struct mtc_attachment *a = cur_att();
	struct mtshm_lane *l = th->lane;
	/* A lane is owned only while its thread has not exited (release()
	 * clears it), so lane + same slot + same epoch is the whole test. */
	if (__builtin_expect(!a || !l || th->slot != a->slot ||
	                         th->epoch !=
	                             mtshm_load_relaxed64(&mtc_w.epoch),
	                     0)) {
		publish_cold(th, delta);
		return;
	}
	/* Only this thread writes its lane: no atomic RMW. */
	mtshm_add_owned_s64(&l->bytes, delta);
	after_store(th, a, l);
}

void mtc_thread_exit(struct mtc_thread *th)
{
	release(th);
	mtc_over_handoff(th);
	th->exited = 1;
}

int64_t mtc_published_bytes(void)
{
	int64_t total = mtshm_load_relaxeds64(&mtc_proc.pending);
	const struct mtc_attachment *a = cur_att();
	if (a)
		total += slot_total(a);
	return total;
}

int64_t memtally_process_bytes(void)
{
	return mtc_published_bytes() + mtc_front_drift();
}

bool memtally_over_limit(void)
{
	struct mtshm_slot_id *s = cur_slot();
	return s && (mtshm_load_relaxed32(&s->flags) & MTSHM_SLOT_OVER_LIMIT);
}
