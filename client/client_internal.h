/*
 * client_internal.h - what the front ends ask of the core that
 * libmemtally and the preloads share: publish.h (every 64 KiB),
 * free_sample.h (the allocator's free memory), and here the rest:
 * registration's bounds, the refresh thread, mapped memory, the front
 * ends' interface.
 *
 * The front ends (account.c: memtally_account(); jemalloc_fe.c: jemalloc's
 * activity callback, in the preload and for memtally_init(); mmap.c: the
 * program's own mappings, in the preload) only decide *how many* bytes a
 * thread has to publish. The core decides *where* they go: the thread's
 * own lane when the process is attached, a process-local pending counter
 * otherwise.
 */
#ifndef MEMTALLY_CLIENT_INTERNAL_H
#define MEMTALLY_CLIENT_INTERNAL_H

#include <stddef.h>
#include <stdint.h>

#include "memtally.h"
#include "mtshm.h"
#include "free_sample.h"
#include "jemalloc_fe.h"
#include "publish.h"

/* One-time process setup (environment, fork handler). Cheap after the
 * first call. Returns false when memtally is disabled for this process. */
bool mtc_init(void);

/* Set by the preload while its constructor sets the main thread up: no
 * attach is tried then; the process registers at its first flush after
 * start that finds it worth registering (or memtally_flush(),
 * memtally_attached()), so a process that never publishes again costs the
 * server nothing (attach.c, mtc_maybe_attach and worth_registering). */
extern bool mtc_at_load;

/*
 * When a process is first worth registering (attach.c, worth_registering):
 * once it has lived MEMTALLY_REGISTER_AFTER_MS (the server's default tick)
 * or published MEMTALLY_REGISTER_MIN, whichever comes first.
 */
#define MTC_REGISTER_AFTER_MS     10u
#define MTC_REGISTER_AFTER_MAX_MS 60000u
#define MTC_REGISTER_MIN          (UINT64_C(1) << 20)

/*
 * The refresh thread (refresh.c), in the preloads only: elsewhere
 * mtc_refresh_start is null and never armed.
 * A registration raises mtc_refresh_want, and so does one whose answer
 * did not come in time (the thread's rounds then register again).
 * The next full flush, outside the re-entrancy guard, calls
 * mtc_refresh_start(), which starts the thread if mtc_refresh_claim()
 * grants it (and gives the period).
 * Every period the thread runs mtc_refresh_once(): the front end's
 * mtc_front_refresh() and mtc_maps_reconcile().
 * A single-threaded process gets the thread only once its heap and
 * mapped bytes reach MEMTALLY_REFRESH_MIN (MTC_REFRESH_MIN by default),
 * or its registration went unanswered.
 * The reason: a first thread makes glibc lock every stdio call and malloc
 * arena for good (bench/results/stdio_cost.md).
 */
#define MTC_REFRESH_MS     1000u
#define MTC_REFRESH_MAX_MS 3600000u
#define MTC_REFRESH_MIN    (UINT64_C(64) << 20)
extern uint32_t mtc_refresh_want;
void mtc_refresh_start(void) __attribute__((weak, visibility("hidden")));
bool mtc_refresh_claim(uint64_t *period_ms);
void mtc_refresh_once(void);
/* The server's heartbeat stale: register again (publish.c). */
void mtc_heartbeat_check(const struct mtshm_header *h);
void mtc_front_refresh(bool busy);

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
void mtc_front_sample(void);

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

/* In the child of a fork that ran no handler of ours (mtc_fork_seen): what
 * mmap.c's own fork handler does, the table's lock freed if a thread left
 * behind held it. A no-op where mapped memory is not counted. */
void mtc_mapped_forget(void);

/*
 * Bring the process's mapped figure to the pages of its counted ranges
 * the kernel has resident. The pagemap scan (PAGEMAP_SCAN) is tried
 * first, which also leaves out pages only read; mincore serves where the
 * kernel lacks it. Pages given back behind our back leave the figure,
 * and pages given back with madvise and touched again come back.
 * Safe from any thread at any time: it skips the round rather than wait
 * for the table's lock, never allocates through malloc, never attaches.
 * Its cost grows with the counted bytes (docs/ARCHITECTURE.md).
 * A no-op where mapped memory is not counted (libmemtally).
 */
void mtc_maps_reconcile(void);

/* The same at once, whatever the last one cost, waiting for the lock if
 * need be: for memtally_flush(), which a program calls to publish now. */
void mtc_maps_reconcile_now(void);

/* Diagnostics on stderr when MEMTALLY_DEBUG=1. Never allocates. A macro,
 * so that without MEMTALLY_DEBUG its arguments are not evaluated either:
 * strerror() may load a locale's catalogue (it allocates and locks). */
extern int mtc_debug_on MTC_HIDDEN; /* MEMTALLY_DEBUG=1 */
void mtc_debug_print(const char *fmt, ...)
    __attribute__((format(printf, 1, 2)));
#define mtc_debug(...)                                                         \
	do {                                                                   \
		if (__builtin_expect(mtc_debug_on, 0))                         \
			mtc_debug_print(__VA_ARGS__);                          \
	} while (0)

#endif /* MEMTALLY_CLIENT_INTERNAL_H */
