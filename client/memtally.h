/*
 * memtally.h - the worker side of memtally.
 *
 * A worker process counts the heap bytes it allocates and frees; memtallyd
 * (the server beside it) sums every worker's count into fleet totals that a
 * scheduler asks before it starts more work. Two ways to count:
 *
 *  - Unmodified programs: LD_PRELOAD=libmemtally_preload.so. Every malloc,
 *    free, C++ new and delete goes to the process's libjemalloc, and the
 *    preload learns sizes from jemalloc's own per-thread counters
 *    (thread.allocatedp / thread.deallocatedp). Nothing to call.
 *  - Code that manages its own memory (or uses another allocator): link
 *    libmemtally and call memtally_account(+n) / memtally_account(-n).
 *
 * Each thread accumulates a drift; when it reaches the flush threshold
 * (64 KiB by default, set by the server) it is written into the thread's own
 * lane of the process's slot in a shared-memory segment. The hot path is a
 * thread-local add and one compare; no shared write.
 *
 * Attach is lazy, on the first flush: the library connects to
 * MEMTALLY_SOCKET (default /run/memtally/memtally.sock), registers, maps the
 * segment and publishes the process's whole count so far.
 *
 * Environment:
 *   MEMTALLY_SOCKET  server socket path
 *   MEMTALLY_GROUP   group (job, tenant) this process belongs to
 *   MEMTALLY_TASK    admission reservation this process fulfils
 *   MEMTALLY_DEBUG   1: diagnostics on stderr (never anything on stdout)
 *   MEMTALLY_DISABLE 1: count nothing, never connect
 *
 * Fail open: without a server, with a bad socket path or a segment of an
 * unknown layout, the worker runs exactly as it would without memtally. The
 * library keeps counting locally, retries with back-off (100 ms doubling to
 * 5 s, only when a flush happens) and publishes the full total once attached.
 *
 * Caveats
 *  - Counted: bytes that pass through memtally_account(), or, under the
 *    preload, the usable size (jemalloc size class) of every live block of
 *    the process's jemalloc heap. A single malloc(100 MiB) counts 112 MiB,
 *    the size class jemalloc reserved. Not counted: mmap() made by the
 *    program itself, memory of other allocators (Python's pymalloc arenas,
 *    glibc malloc reached by name), stacks, code, page tables. For those,
 *    compare with RSS.
 *  - Accuracy: each thread holds up to `threshold` bytes unflushed, so a
 *    process total is exact to +/- threshold x live threads. Under the
 *    preload a free is seen at the thread's next allocator call (or its
 *    exit), so a thread that frees a large block and goes idle shows it
 *    until then; allocations at or over the threshold are seen at once.
 *  - Threads: a thread's drift is flushed when it exits (pthread TSD
 *    destructor). Memory freed by later TSD destructors of that thread is
 *    not seen. The main thread's drift is not flushed at exit(); the server
 *    drops the process at exit anyway.
 *  - fork(): the child counts as a new process whose starting total is the
 *    parent's published total at the fork (plus the forking thread's drift);
 *    it registers at its first flush after the fork. Other threads' unflushed
 *    drift (< threshold each) is not carried over.
 *  - exec(): the pid keeps one slot; the new image's registration resets it
 *    to the new image's count.
 *  - Signal handlers: memtally_account() is async-signal-safe only while no
 *    flush is due; do not account from signal handlers.
 *  - Do not combine the preload with memtally_account() calls for malloc'ed
 *    memory in the same process: the bytes would be counted twice.
 *  - Over-limit latency: the server raises the over-limit flag within a
 *    tick of the process crossing its limit, but the process only looks
 *    at the flag when one of its threads flushes (every `threshold` bytes
 *    of net allocation or free per thread, at memtally_flush(), and on
 *    attach). A process that crosses its limit and then stops allocating
 *    learns of it (and runs its memtally_on_over_limit() callback) only at
 *    its next flush; memtally_over_limit() reads the flag directly and is
 *    current to within a server tick.
 */
#ifndef MEMTALLY_H
#define MEMTALLY_H

#include <stdbool.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define MEMTALLY_EXTERN __attribute__((visibility("default")))

#define MEMTALLY_VERSION_MAJOR 0
#define MEMTALLY_VERSION_MINOR 1
#define MEMTALLY_VERSION_PATCH 0
#define MEMTALLY_VERSION_STRING "0.1.0"

#define MEMTALLY_DEFAULT_SOCKET    "/run/memtally/memtally.sock"
#define MEMTALLY_DEFAULT_THRESHOLD (64 * 1024)

/* Our own error codes sit in a reserved range below -errno's; shm and frame
 * codes (-3001.., -3101..) are named by memtally_strerror() too. */
#define MEMTALLY_ENOTATTACHED (-4001) /* no server reached (yet) */
#define MEMTALLY_EDISABLED    (-4002) /* MEMTALLY_DISABLE=1 */
#define MEMTALLY_EPROTO       (-4003) /* the server answered nonsense */
#define MEMTALLY_ESERVER      (-4004) /* the server answered an error */

/*
 * Hot-path state of one thread. `biased` is the thread's drift plus
 * threshold - 1, so it stays within [0, span] while no flush is due
 * (|drift| < threshold); a new
 * thread has both fields zero, so its first non-zero call takes the slow
 * path, which sets the thread up. One add, one compare, one branch.
 */
struct memtally__tls {
	uint64_t biased;
	uint64_t span;
};

MEMTALLY_EXTERN extern __thread struct memtally__tls memtally__t
	__attribute__((tls_model("initial-exec")));

MEMTALLY_EXTERN void memtally__account_slow(void);

/*
 * Count `delta` bytes (positive: allocated, negative: freed) for the
 * calling thread. Cheap enough to call on every allocation.
 */
static inline void memtally_account(int64_t delta)
{
	struct memtally__tls *t = &memtally__t;
	uint64_t b = t->biased + (uint64_t)delta;
	t->biased = b;
	if (__builtin_expect(b > t->span, 0))
		memtally__account_slow();
}

/*
 * Publish the calling thread's drift now (and, if due, try to attach).
 * Returns 0 when the process is attached, MEMTALLY_ENOTATTACHED when the
 * bytes were kept locally, MEMTALLY_EDISABLED.
 */
MEMTALLY_EXTERN int memtally_flush(void);

/*
 * The process's total as this library knows it: everything flushed by
 * every thread plus the calling thread's drift. A few loads, no syscall.
 */
MEMTALLY_EXTERN int64_t memtally_process_bytes(void);

/*
 * Name the group of this process (overrides MEMTALLY_GROUP). Takes effect
 * at the next registration: call it before the first allocation you want
 * counted in the group, or it applies after the next re-attach. `group` is
 * copied; at most 63 bytes are kept. Returns 0 or -EINVAL.
 */
MEMTALLY_EXTERN int memtally_set_group(const char *group);

/* True when the server has flagged this process over its own limit. */
MEMTALLY_EXTERN bool memtally_over_limit(void);

/*
 * Register `cb` to run, with `arg`, when the server flags this process
 * over its own limit: on each rising edge of the flag, so once per
 * episode; the flag must clear (the process went back below the limit's
 * lower mark) before it can run again. If the flag is already up when a
 * callback is registered, it runs at the next flush. NULL removes the
 * callback. One callback per process; a new one replaces the old.
 * Returns 0.
 *
 * When and where it runs: in whichever thread flushes first after the
 * flag rose (see "Over-limit latency" in the Caveats above), once that
 * flush is complete. Under the preload that is inside the malloc, free or
 * operator new/delete call that triggered the flush, before or after
 * jemalloc did its work but never inside it, so no allocator lock is held.
 * With memtally_account() it is inside memtally_account() or
 * memtally_flush().
 *
 * What it may do: allocate and free (those calls are counted but do not
 * run the callback again while it runs), call memtally_*() functions, and
 * do a bounded amount of work, such as setting a flag or writing to a pipe
 * or eventfd so that another thread spills. It runs in the middle of an
 * arbitrary allocation of the program, which may hold its own locks (or
 * libc's, e.g. stdio's) around that allocation: it must not take a lock
 * the program may hold while allocating, must not block for long, and
 * must not longjmp or throw out of the call. It never runs in a signal
 * handler; a rise seen by the final flush of an exiting thread is left
 * for the next flush of another thread.
 */
MEMTALLY_EXTERN int memtally_on_over_limit(void (*cb)(void *arg), void *arg);

/* True once the process is registered with a server. */
MEMTALLY_EXTERN bool memtally_attached(void);

/* "0.1.0" */
MEMTALLY_EXTERN const char *memtally_version(void);

/* A description of -errno or any memtally error code. */
MEMTALLY_EXTERN const char *memtally_strerror(int err);

#ifdef __cplusplus
}
#endif

#endif /* MEMTALLY_H */
