/*
 * publish.h - what runs at every 64 KiB of a thread's drift: the quiet
 * publish (inline, a countdown and one comparison) and, when it cannot be
 * made, the full one (publish.c), with the per-thread state both use.
 */
#ifndef MEMTALLY_PUBLISH_H
#define MEMTALLY_PUBLISH_H

#include <stdbool.h>
#include <stdint.h>

#include "mtshm.h"

#define MTC_TLS __attribute__((tls_model("initial-exec")))

/* Per-thread lane state, one per front end thread-local. All zero for a new
 * thread. */
struct mtc_thread {
	struct mtshm_lane *lane;    /* owned lane, NULL: use slot overflow */
	struct mtshm_slot_id *slot; /* slot the lane/count belongs to */
	uint64_t seen_ticks;        /* header's tick counter at the last full
	                             * flush */
	uint64_t epoch;        /* mtc_w.epoch of `slot`; stale = re-claim */
	uint64_t gate_epoch;   /* its low 32 bits, as mtc_w.gate holds them */
	uint32_t since_verify; /* flushes since the tick counter moved */
	int32_t quiet_left;    /* quiet publishes left before a full one;
	                        * 0: the next one is full */
	int32_t quiet_armed;   /* quiet_left as the last full flush set
	                        * it: armed - left were made since */
	uint8_t busy;          /* re-entrancy guard of the slow path */
	uint8_t counted;       /* counted in slot->threads */
	uint8_t exit_round;    /* TSD destructor rounds seen */
	uint8_t exited;        /* lane released at thread exit: later
	                        * bytes go to the slot's overflow */
	uint8_t over_due;      /* this thread saw the over-limit flag
	                        * rise: run the callback after the flush */
	uint8_t in_over_cb;    /* the callback is running on this thread */
	uint8_t maps_due;      /* this thread saw the server ask for a
	                        * reconcile of the mapped bytes: run it
	                        * after the flush */
	uint8_t reattach_due;  /* this thread saw the server ask the
	                        * process to register again */
};

/* Publish `delta` bytes on behalf of the calling thread. Never blocks for
 * long: may attempt an attach (bounded by a short timeout, rate-limited by
 * back-off). */
void mtc_publish(struct mtc_thread *th, int64_t delta);

/*
 * publish.c's state that fast paths read, and what a fork must not carry
 * into the child: on a page of its own that the kernel gives every child
 * of a fork zeroed (MADV_WIPEONFORK), so that a child made by a fork that
 * ran no handler of ours (_Fork(), a raw clone()) finds itself attached to
 * nothing and its threads' lanes stale, and writes nothing into its
 * parent's slot (mtc_fork_seen).
 * epoch is bumped whenever the process's slot changes (attach,
 * re-attach, fork).
 * gate holds the epoch's low 32 bits above the slot's flags as the latest
 * full flush of any thread saw them, so one comparison tests both. Flags
 * that differ from the gate's are an edge, which mtc_publish() handles.
 * cur is the attachment (struct mtc_attachment *, 0 = none); attaching
 * the try-lock of attach(); seen 1 unless a fork ran none of our handlers
 * (2: a thread of the child is setting it up); mm_seen 1 once mmap.c's
 * table and lock are the process's own (its own fork handler, which runs
 * before ours, or mtc_mapped_forget).
 */
#define MTC_HIDDEN     __attribute__((visibility("hidden")))
#define MTC_WIPED_SIZE 4096
struct mtc_wiped {
	uint64_t epoch;
	uint64_t gate;
	uint64_t cur;
	uint32_t attaching;
	uint32_t seen;
	uint32_t mm_seen; /* mmap.c's lock is sane (set by its fork handler) */
	char pad[MTC_WIPED_SIZE - 36];
};
extern struct mtc_wiped mtc_w MTC_HIDDEN;
/* The kernel does wipe it in a fork's child (set before main). */
extern bool mtc_wipe_on MTC_HIDDEN;
/* mtc_threshold(): the threshold threads use, in bytes. */
extern uint64_t mtc_thresh MTC_HIDDEN;
#define MTC_THRESH_MAX (UINT64_C(1) << 30)

/* False when the calling thread must not use the slot or register: the
 * process is the child of a fork that ran no handler of ours, and another
 * of its threads is setting it up as one (attach.c). True otherwise, once
 * that is done. */
bool mtc_fork_seen(void) MTC_HIDDEN;

/*
 * fork() in progress, from the library's prepare handler to its parent or
 * child handler (attach.c). Handlers another library registered before
 * ours run inside that stretch, and in the child before ours: what they
 * allocate must not reach the slot the child still maps, its parent's.
 * The prepare handler raises MTC_EPOCH_FORKING in mtc_w.epoch, so that
 * every full publish meanwhile takes the cold path (no instruction is
 * added to the common one), and marks the forking thread (mtc_forking,
 * a depth: a signal handler may fork inside a fork's handlers), whose
 * publishes there go to `fork_pending`: the child's starting total, or
 * the parent's slot once its handler drains them. It neither registers
 * nor samples nor stores its mapped figure meanwhile. Every other thread
 * publishes as before. Readers of mtc_w.epoch mask the bit.
 */
#define MTC_EPOCH_FORKING (UINT64_C(1) << 63)
extern __thread uint8_t mtc_forking MTC_TLS MTC_HIDDEN;
void mtc_fork_begin(void);
/* True when the outermost fork of this thread ended. */
bool mtc_fork_end(void);
/* In the child: no fork in progress. */
void mtc_fork_reset(void);

/* After an add to `pending` (sequentially consistent, as attach()'s
 * publication of `cur` and drain of `pending` are): if an attach
 * completed meanwhile, the add may have landed after its drain, so drain
 * again into the current slot (a no-op when empty or not attached). */
void mtc_pending_redrain(void);

/* Threshold threads must use now (server's once attached). */
static inline uint64_t mtc_threshold(void)
{
	return mtshm_load_relaxed64(&mtc_thresh);
}

/* Flushes of one thread without a tick of the server before it looks at
 * the server's heartbeat; also the longest run of quiet publishes. */
#define MTC_VERIFY_EVERY 128

/*
 * The lane's add, after a countdown and one comparison; false, with
 * nothing done, when the thread must call mtc_publish() instead.
 * Only a full publish into the thread's own lane arms quiet_left, so a
 * count left means the lane is owned and its slot mapped.
 * A re-attach (the epoch) or a change of the slot's flags breaks the
 * comparison with mtc_w.gate, and the full publish handles it.
 * mtc_publish() arms the count on its way out, and the slow paths
 * allocate nothing before they drop their re-entrancy guard, so no quiet
 * publish runs inside one.
 * docs/ARCHITECTURE.md, "Large blocks: a quiet publish", says why no
 * case is missed.
 */
static inline bool mtc_publish_quiet(struct mtc_thread *th, int64_t delta)
{
	if (__builtin_expect(--th->quiet_left < 0, 0)) {
		th->quiet_left = 0;
		return false;
	}
	uint64_t flags = mtshm_load_relaxed32(&th->slot->flags);
	if (__builtin_expect((flags | th->gate_epoch) !=
	                         mtshm_load_relaxed64(&mtc_w.gate),
	                     0)) {
		/* Not made: the full one counts itself. The barrier keeps
		 * the decrement above one instruction to memory. */
		__asm__("" ::: "memory");
		th->quiet_left++;
		return false;
	}
	mtshm_add_owned_s64(&th->lane->bytes, delta);
	return true;
}

/* Quiet publishes of the thread are off until its next full one. */
static inline void mtc_quiet_off(struct mtc_thread *th)
{
	th->quiet_armed -= th->quiet_left;
	th->quiet_left = 0;
}

/* The calling thread is exiting: release its lane. Call after the final
 * mtc_publish(). */
void mtc_thread_exit(struct mtc_thread *th);

/* Run the over-limit callback that mtc_publish() found due
 * (mtc_after_flush, client_internal.h, calls it). */
void mtc_run_over_limit(struct mtc_thread *th);

/* The thread is exiting: a callback it found due is left for the next
 * flush of another thread. Called by mtc_thread_exit() and after each
 * flush made at thread exit. */
void mtc_over_handoff(struct mtc_thread *th);

#endif /* MEMTALLY_PUBLISH_H */
