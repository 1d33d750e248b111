/*
 * client_internal.h - what libmemtally and the preload share: attach,
 * registration and the per-thread lane of the process's slot.
 *
 * The front ends (account.c: memtally_account(); jemalloc_fe.c: jemalloc's
 * activity callback, in the preload and for memtally_init(); mmap.c: the
 * program's own mappings, in the preload) only decide *how many* bytes a
 * thread has to publish. This
 * core decides *where* they go: the thread's own lane when the process is
 * attached, a process-local pending counter otherwise.
 */
#ifndef MEMTALLY_CLIENT_INTERNAL_H
#define MEMTALLY_CLIENT_INTERNAL_H

#include <stddef.h>
#include <stdint.h>

#include "memtally.h"
#include "mtshm.h"

#define MTC_TLS __attribute__((tls_model("initial-exec")))

/* Per-thread lane state, one per front end thread-local. All zero for a new
 * thread. */
struct mtc_thread {
	struct mtshm_lane *lane; /* owned lane, NULL: use slot overflow */
	struct mtshm_slot_id *slot; /* slot the lane/count belongs to */
	uint64_t seen_ticks;     /* header's tick counter at the last full
				  * flush */
	uint64_t epoch;          /* mtc epoch of `slot`; stale = re-claim */
	uint64_t gate_epoch;     /* its low 32 bits, as mtc_gate holds them */
	uint32_t since_verify;   /* flushes since the tick counter moved */
	int32_t quiet_left;      /* quiet publishes left before a full one;
				  * 0: the next one is full */
	int32_t quiet_armed;     /* quiet_left as the last full flush set
				  * it: armed - left were made since */
	uint8_t busy;            /* re-entrancy guard of the slow path */
	uint8_t counted;         /* counted in slot->threads */
	uint8_t exit_round;      /* TSD destructor rounds seen */
	uint8_t exited;          /* lane released at thread exit: later
				  * bytes go to the slot's overflow */
	uint8_t over_due;        /* this thread saw the over-limit flag
				  * rise: run the callback after the flush */
	uint8_t in_over_cb;      /* the callback is running on this thread */
	uint8_t maps_due;        /* this thread saw the server ask for a
	                          * reconcile of the mapped bytes: run it
	                          * after the flush */
};

/* One-time process setup (environment, fork handler). Cheap after the
 * first call. Returns false when memtally is disabled for this process. */
bool mtc_init(void);

/* Set by the preload while its constructor sets the main thread up: no
 * attach is tried then; the process registers at its first flush after
 * start that finds it worth registering (or memtally_flush(),
 * memtally_attached()), so a process that never publishes again costs the
 * server nothing (attach.c, maybe_attach and worth_registering). */
extern bool mtc_at_load;

/* Publish `delta` bytes on behalf of the calling thread. Never blocks for
 * long: may attempt an attach (bounded by a short timeout, rate-limited by
 * back-off). */
void mtc_publish(struct mtc_thread *th, int64_t delta);

/* attach.c's state that fast paths read: the epoch (bumped whenever the
 * process's slot changes: attach, re-attach, fork), the threshold, and
 * the gate: the epoch's low 32 bits above the slot's flags as the latest
 * full flush of any thread saw them (a change of the flags from those is
 * an edge: mtc_publish() acts on it), so that one comparison tests both. */
#define MTC_HIDDEN __attribute__((visibility("hidden")))
extern uint64_t mtc_epoch MTC_HIDDEN;
extern uint64_t mtc_thresh MTC_HIDDEN;
extern uint64_t mtc_gate MTC_HIDDEN;

/* Threshold threads must use now (server's once attached). */
static inline uint64_t mtc_threshold(void)
{
	return mtshm_load_relaxed64(&mtc_thresh);
}

/* Flushes of one thread without a tick of the server before it looks at
 * the server's heartbeat; also the longest run of quiet publishes. */
#define MTC_VERIFY_EVERY 128

/*
 * A publish with no look at the server's heartbeat: the lane's add, after
 * a countdown and one comparison. False, and nothing done, when the
 * thread must go through mtc_publish() instead.
 *  - quiet_left counts the publishes left before the heartbeat is due a
 *    look (MTC_VERIFY_EVERY in all, quiet or full). Only a full publish
 *    into the thread's own lane arms it, so a non-zero count also means
 *    "set up, lane owned, slot mapped".
 *  - The slot's flags with the thread's epoch must equal mtc_gate. The
 *    lane is the thread's while the epoch is the one it claimed it in (a
 *    slot left behind by a re-attach stays mapped, so its flags can be
 *    read). The server changes the over-limit flag only in a tick, so the first
 *    publish after that tick goes full and handles the edge. A callback
 *    registered or handed over while the flag is up clears it from
 *    mtc_gate, so the next publish of any thread goes full too.
 * A server that stopped ticking is still noticed after MTC_VERIFY_EVERY
 * publishes. The lane's `flushes` count gets the quiet ones at the next
 * full one. Nothing is armed while a front end's re-entrancy guard is up:
 * mtc_publish() arms on its way out, and the slow paths allocate nothing
 * between that and dropping the guard.
 */
static inline bool mtc_publish_quiet(struct mtc_thread *th, int64_t delta)
{
	if (__builtin_expect(--th->quiet_left < 0, 0)) {
		th->quiet_left = 0;
		return false;
	}
	uint64_t flags = mtshm_load_relaxed32(&th->slot->flags);
	if (__builtin_expect((flags | th->gate_epoch) !=
	                         mtshm_load_relaxed64(&mtc_gate),
	                     0)) {
		/* Not made: the full one counts itself. Read back, so that
		 * the decrement above stays one instruction to memory. */
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

/*
 * When a process is first worth registering (attach.c, worth_registering):
 * once it has lived MEMTALLY_REGISTER_AFTER_MS (the server's default tick)
 * or published MEMTALLY_REGISTER_MIN, whichever comes first.
 */
#define MTC_REGISTER_AFTER_MS     10u
#define MTC_REGISTER_AFTER_MAX_MS 60000u
#define MTC_REGISTER_MIN          (UINT64_C(1) << 20)

/*
 * The refresh thread (refresh.c, in the preloads only: elsewhere
 * mtc_refresh_start is null and never armed). A registration raises
 * mtc_refresh_want; the next full flush, outside the re-entrancy guard,
 * calls mtc_refresh_start(), which starts the process's one thread if
 * mtc_refresh_claim() gives it the right to (and the period). The thread
 * runs mtc_refresh_once() every period: the front end's
 * mtc_front_refresh() (a sample of the allocator's free memory when
 * mtc_free_refresh_due() says one is owed) and mtc_maps_reconcile().
 * Its first thing, before the first period, is the front end's round as
 * for a busy process: under jemalloc, whose samples only this thread
 * takes, the slot's first sample.
 *
 * A process that is still single-threaded gets its thread only once its
 * figure (heap and mapped bytes) reaches MEMTALLY_REFRESH_MIN
 * (MTC_REFRESH_MIN by default). Its first thread switches glibc for good
 * to locking every stdio call and every malloc arena (the cost of a getc
 * loop: bench/RESULTS.md, stdio_cost). That price is worth paying
 * only for a figure that matters. Below it, the figure follows the
 * program's own calls only.
 */
#define MTC_REFRESH_MS     1000u
#define MTC_REFRESH_MAX_MS 3600000u
#define MTC_REFRESH_MIN    (UINT64_C(64) << 20)
extern uint32_t mtc_refresh_want;
void mtc_refresh_start(void) __attribute__((weak, visibility("hidden")));
bool mtc_refresh_claim(uint64_t *period_ms);
void mtc_refresh_once(void);
void mtc_front_refresh(bool busy);

/* Run the over-limit callback that mtc_publish() found due. */
void mtc_run_over_limit(struct mtc_thread *th);

/* The thread is exiting: a callback it found due is left for the next
 * flush of another thread. Called by mtc_thread_exit() and after each
 * flush made at thread exit. */
void mtc_over_handoff(struct mtc_thread *th);

void mtc_maps_reconcile(void); /* mmap.c, below */

/*
 * Call at the end of a front end's slow path, once the flush is complete
 * and its re-entrancy guard (`busy`) is released: runs the over-limit
 * callback if the flush saw the flag rise, and the reconcile of the
 * mapped bytes if it saw the server ask for one (MTSHM_SLOT_RECONCILE:
 * the way a process without the refresh thread, a single-threaded one,
 * has its mappings reconciled). A byte test each otherwise.
 */
static inline void mtc_after_flush(struct mtc_thread *th)
{
	if (__builtin_expect(th->over_due, 0))
		mtc_run_over_limit(th);
	if (__builtin_expect(th->maps_due, 0)) {
		th->maps_due = 0;
		mtc_maps_reconcile();
	}
	if (__builtin_expect(mtshm_load_relaxed32(&mtc_refresh_want), 0))
		mtc_refresh_start();
}

/* Bytes flushed by this process (slot sum + pending), without any thread's
 * unflushed drift. */
int64_t mtc_published_bytes(void);

/*
 * A front end as the core sees it: what it asks of the calling thread's
 * counters.
 *   flush       publish the thread's drift now (memtally_flush)
 *   drift       its drift not yet published (memtally_process_bytes)
 *   force_slow  send the thread's next call through the slow path (fork)
 *   sample      after a flush: the allocator's free memory, when a sample
 *               is due (NULL: this front end's allocator is not sampled)
 *   refresh     the refresh thread's round (refresh.c; NULL: nothing);
 *               `busy`: the program published since the last round
 * Each library lists its front ends once, in flush order, in mtc_fronts
 * (linked.c, preload.c, glibc.c); the core asks them all through the
 * mtc_front_*() functions (attach.c). Never on a malloc/free path.
 */
struct mtc_front {
	int (*flush)(void);
	int64_t (*drift)(void);
	void (*force_slow)(void);
	void (*sample)(void);
	void (*refresh)(bool busy);
};
extern const struct mtc_front *const mtc_fronts[]; /* NULL-terminated */
extern const struct mtc_front mta_front; /* account.c: the inline API */
extern const struct mtc_front mtj_front; /* jemalloc_fe.c */

int mtc_front_flush(void);
int64_t mtc_front_drift(void);
void mtc_front_force_slow(void);

/* Longest group name + 1, as the server accepts it. */
#define MTC_GROUP_MAX 64

/* A consistent copy of the group the next registration carries (set by
 * MEMTALLY_GROUP or memtally_set_group(), possibly concurrently). False
 * only if writers kept it busy through every retry. */
bool mtc_group_copy(char out[MTC_GROUP_MAX]);

/*
 * Mapped memory (mmap.c, in the preloads): the process's counted mapped
 * bytes changed to `total`. Stores it for the process and into the
 * current slot; called by mmap.c under its table's lock, so the stores
 * come in the order of the changes. Never blocks.
 */
void mtc_mapped_store(uint64_t total);

/* After a change stored by mtc_mapped_store(), outside the table's lock:
 * an unattached process tries to attach (back-off permitting). */
void mtc_mapped_changed(void);

/* Store the current total into the current slot (under the table's
 * lock). Called by attach() once a new slot is published. A no-op where
 * mapped memory is not counted (libmemtally). */
void mtc_mapped_resync(void);

/*
 * Bring the process's mapped figure to the pages of its counted ranges
 * the kernel has resident (the pagemap scan, PAGEMAP_SCAN, where the
 * kernel has it, which also leaves out pages only read; mincore
 * otherwise), so that pages given back behind our back leave it and
 * pages given back with madvise and touched again come back. Safe from any thread at any time: skips the round rather than
 * wait for the table's lock, never allocates through malloc, never
 * attaches. Cost ~proportional to the counted bytes (docs/ARCHITECTURE.md).
 * A no-op where mapped memory is not counted (libmemtally).
 */
void mtc_maps_reconcile(void);

/* The same at once, whatever the last one cost, waiting for the lock if
 * need be: for memtally_flush(), which a program calls to publish now. */
void mtc_maps_reconcile_now(void);

/*
 * The allocator's free memory (layout 2.2): what it keeps of what the
 * program freed, resident but not given back. The glibc front end samples
 * it (mtc_front_sample(), after a flush: account.c calls it) every
 * MTC_FREE_INTERVAL_NS, and sooner when the heap moved by MTC_FREE_MOVED
 * or an eighth (looked at every MTC_FREE_CHECK_NS at most; attach.c says
 * why); the jemalloc front end at memtally_flush(), without `interval`:
 * only when the heap moved so, and never the slot's first sample (the
 * refresh thread's: a process that has none is counted at its heap).
 * mtc_free_due() says whether a sample is due and, when it returns
 * true, gives the calling thread the turn and fills `fs`;
 * mtc_free_publish() gives the turn back after storing `held` (the bytes
 * the allocator holds from the system for the heap, in use or free) less
 * the slot's heap bytes into lane 0.
 */
#define MTC_FREE_INTERVAL_NS  (100u * 1000000u)
#define MTC_FREE_CHECK_NS     (10u * 1000000u)
#define MTC_FREE_SPACE_MAX_NS (UINT64_C(2) * 1000000000u)
#define MTC_FREE_MOVED        (INT64_C(4) << 20)
struct mtc_free_sample {
	uint64_t cpu_ns;     /* the thread's CPU time when it began */
	int64_t heap_before; /* the slot's heap bytes then */
};
void mtc_front_sample(void);
bool mtc_free_due(struct mtc_free_sample *fs, bool interval);
bool mtc_free_refresh_due(struct mtc_free_sample *fs, uint64_t stale_ns,
                          bool busy);
void mtc_free_publish(const struct mtc_free_sample *fs, uint64_t held);

/*
 * The jemalloc front end (jemalloc_fe.c). `mallctl` is jemalloc's (linked
 * into the preload, or found in the process by a linked worker).
 * mtj_init() chooses the mode once per process and sets up the calling
 * thread; `allow_counting` lets it fall back to counting on every call
 * (jemalloc's hooks) when the activity callback is unavailable.
 * mtj_thread_start() sets up the calling thread. Both return 0 or a
 * negative code (MEMTALLY_EDISABLED: not counting).
 */
typedef int (*mtj_mallctl_fn)(const char *, void *, size_t *, void *,
			      size_t);
enum mtj_mode { MTJ_OFF, MTJ_CALLBACK, MTJ_COUNTING };
int mtj_init(mtj_mallctl_fn mallctl, int allow_counting);
/* A front end that knows where its jemalloc keeps the calling thread's
 * state (the preload, jemalloc_tsd_probe.c) reaches it without mallctl:
 * `counters` points at the thread's cumulative allocated and deallocated
 * counters, `set_callback` sets its activity callback thunk; each returns
 * 0 or -errno. Given before mtj_init(). */
struct mtj_direct {
	int (*counters)(const uint64_t **alloc, const uint64_t **dealloc);
	int (*set_callback)(const void *thunk, size_t len);
};
void mtj_use_direct(const struct mtj_direct *d);
int mtj_thread_start(void);
int mtj_mode(void);

/* Diagnostics on stderr when MEMTALLY_DEBUG=1. Never allocates. */
void mtc_debug(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

#endif /* MEMTALLY_CLIENT_INTERNAL_H */
