/*
 * memtally.h - the worker side of memtally.
 *
 * A worker process counts the heap bytes it allocates and frees; memtallyd
 * (the server beside it) sums every worker's count into fleet totals that a
 * scheduler asks before it starts more work. Two ways to count:
 *
 *  - Unmodified programs: LD_PRELOAD=libmemtally_preload.so. The preload
 *    is jemalloc 5.3 (linked in, its whole API exported), so every malloc,
 *    free, C++ new and delete of the process goes to it with nothing added;
 *    jemalloc's per-thread activity callback publishes each thread's net
 *    usable bytes every 64 KiB of its activity. Nothing to call.
 *  - A program linked to libjemalloc 5.3 and libmemtally: memtally_init()
 *    in each thread, and jemalloc counts the same way.
 *  - Code that manages its own memory (or uses another allocator): link
 *    libmemtally and call memtally_account(+n) / memtally_account(-n).
 *
 * Each thread accumulates a drift; when it reaches the flush threshold
 * (64 KiB by default, set by the server) it is written into the thread's own
 * lane of the process's slot in shared memory (a table holding only the
 * slots of the process's own uid; the server's header is read-only to it).
 * The hot path is a thread-local add and one compare; no shared write.
 *
 * Attach is lazy, at the first flush at which the process has lived
 * MEMTALLY_REGISTER_AFTER_MS (default 10) or published
 * MEMTALLY_REGISTER_MIN (default 1 MiB), or at memtally_flush() or
 * memtally_attached(): the library connects to
 * MEMTALLY_SOCKET (default /run/memtally/memtally.sock), registers, receives
 * the header and its uid's slot table as two descriptors, checks that both
 * are sealed against resizing and of the announced size, maps them, closes
 * the descriptors and publishes the process's whole count so far.
 *
 * Environment: every variable the library reads (the socket, the group,
 * the task, diagnostics, when to register, what to count, the refresh
 * thread, the preloads' allocator) is in the one list of them, memtally(1),
 * ENVIRONMENT (docs/memtally.1). A process with MEMTALLY_TASK set attaches
 * at its first flush.
 *
 * Fail open: without a server, with a bad socket path, or handed shared
 * memory of an unknown layout or not sealed, the worker runs exactly as it
 * would without memtally. The library keeps counting locally, retries with
 * back-off (100 ms doubling to 5 s, only when a flush happens) and
 * publishes the full total once attached.
 *
 * Caveats
 *  - Counted: bytes that pass through memtally_account(), or, under the
 *    preload, the usable size (jemalloc size class) of every live block of
 *    the process's jemalloc heap (glibc's chunk size under
 *    libmemtally_glibc.so). A single malloc(100 MiB) counts 112 MiB, the
 *    size class jemalloc reserved. The preloads also count the private,
 *    writable anonymous memory the program maps itself (mmap: pymalloc's
 *    arenas, GC heaps), reported apart as `mapped` and included in the
 *    process's total; memtally_process_bytes() is the heap part. Not
 *    counted: shared and file mappings, stacks, code, page tables, and,
 *    with the inline API, any mmap. For those, compare with RSS.
 *  - Accuracy: each thread holds up to `threshold` bytes unflushed, so a
 *    process total is exact to +/- threshold x live threads. Counted by
 *    jemalloc's activity callback (the preload, memtally_init()), a thread
 *    publishes after every 64 KiB it allocates and every 64 KiB it frees,
 *    and inside any single malloc or free of 64 KiB or more: it holds less
 *    than 64 KiB unpublished, whatever the threshold, and a large block is
 *    seen at once, also when its thread then goes idle. Its figure may
 *    still move by a few KiB after memtally_flush(), when jemalloc's next
 *    event falls. Without the callback (a jemalloc lacking it) the preload
 *    checks on every call and a free is seen at the thread's next
 *    allocator call (or its exit).
 *  - Threads: a thread's drift is flushed when it exits (pthread TSD
 *    destructor). Memory freed by later TSD destructors of that thread is
 *    not seen. The main thread's drift is not flushed at exit(); the server
 *    drops the process at exit anyway.
 *  - fork(): the child counts as a new process whose starting total is the
 *    parent's published total at the fork (plus the forking thread's drift);
 *    it registers at its first flush after the fork (under the preload: its
 *    first 64 KiB of activity, or memtally_flush()) at which its total is
 *    at least MEMTALLY_REGISTER_MIN or the fork at least
 *    MEMTALLY_REGISTER_AFTER_MS old. Other threads' unflushed
 *    drift (< threshold each) is not carried over.
 *  - exec(): the pid keeps one slot; the new image's registration resets it
 *    to the new image's count. An image exec'd by a registered process
 *    registers at its first flush, however young or small (it asks the
 *    server to register it only if its process is registered).
 *  - Signal handlers: memtally_account() is async-signal-safe only while no
 *    flush is due; do not account from signal handlers.
 *  - Do not combine the preload with memtally_account() calls for malloc'ed
 *    memory in the same process: the bytes would be counted twice.
 *  - Over-limit latency: the server raises the over-limit flag within a
 *    tick of the process crossing its limit, but the process only looks
 *    at the flag when one of its threads flushes (every `threshold` bytes
 *    of net allocation or free per thread, or every 64 KiB of activity
 *    under jemalloc's callback, at memtally_flush(), and on attach). A
 *    process that crosses its limit and then stops allocating learns of it
 *    (and runs its memtally_on_over_limit() callback) only at its next
 *    flush; memtally_over_limit() reads the flag directly and is current
 *    to within a server tick.
 */
#ifndef MEMTALLY_H
#define MEMTALLY_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "memtally_errors.h"
#include "memtally_version.h"

#ifdef __cplusplus
extern "C" {
#endif

#define MEMTALLY_EXTERN __attribute__((visibility("default")))

/* memtallyd's defaults too (a unit test holds the two sides together). */
#define MEMTALLY_DEFAULT_SOCKET    "/run/memtally/memtally.sock"
#define MEMTALLY_DEFAULT_THRESHOLD (64 * 1024)

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
 * Count the calling thread's malloc'd memory through jemalloc itself, at
 * no cost per call: jemalloc 5.3 runs a per-thread callback every 64 KiB
 * of allocation or deallocation and at every block of 64 KiB or more, and
 * the callback publishes the thread's net usable bytes.
 *
 * Under the preload this is done for every thread already; a program
 * linked to libjemalloc and libmemtally calls memtally_init() once in each
 * thread that allocates (in main, and at the start of each thread it
 * creates; memtally_flush() also sets up a thread it finds without it).
 * Do not also memtally_account() memory that comes from malloc then: it
 * would be counted twice.
 *
 * Returns 0; MEMTALLY_ENOHOOK when the process's jemalloc has no
 * activity callback (no jemalloc, or another version: count with
 * memtally_account() instead); MEMTALLY_EDISABLED; or -errno from
 * jemalloc's mallctl.
 */
MEMTALLY_EXTERN int memtally_init(void);

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
 * operator new/delete call that triggered the flush, after jemalloc did its
 * work (from its activity callback, or from its hooks without it), with no
 * allocator lock held.
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

/* The library's release, MEMTALLY_VERSION_STRING when it was built. */
MEMTALLY_EXTERN const char *memtally_version(void);

/* A description of -errno or any memtally error code. */
MEMTALLY_EXTERN const char *memtally_strerror(int err);

/*
 * Memory that manages itself: a growable byte buffer, a thread-confined
 * arena and a fixed-size block pool. Each obtains its memory with malloc()
 * and accounts it through memtally_account() per chunk (per growth for the
 * buffer), never per allocation, so memtally_process_bytes() moves by the
 * chunk sizes. Use them with the inline API; under the preload, malloc()
 * already counts those chunks and they would be counted twice (pass
 * MEMTALLY_NO_ACCOUNT there). None of them is thread-safe except a pool
 * created with MEMTALLY_POOL_LOCKED. All return 0 or -errno where they
 * return an int; destructors accept NULL.
 */

/* Flags for memtally_buf_init(), memtally_arena_create() and
 * memtally_pool_create(). */
#define MEMTALLY_NO_ACCOUNT    0x100u /* do not call memtally_account() */
#define MEMTALLY_BUF_GROW_1_5X 0x1u   /* grow by 1.5x instead of 2x */
#define MEMTALLY_POOL_GROW     0x1u   /* exhausted pool: add a chunk */
#define MEMTALLY_POOL_LOCKED   0x2u   /* shared pool: a mutex per call */

/*
 * A growable byte buffer (reserve / append / finish). The fields are
 * public so that a caller may write into data + len after a reserve and
 * then add to len; treat cap and flags as read-only. The buffer owns
 * `data` until memtally_buf_finish() hands it over. Growth doubles the
 * capacity (at least 64 bytes), the policy bench/buffer_growth chose;
 * the whole capacity is accounted.
 */
typedef struct memtally_buf {
	uint8_t *data; /* NULL while cap == 0 */
	size_t len;    /* bytes written */
	size_t cap;    /* bytes allocated and accounted */
	unsigned flags;
	unsigned reserved32;   /* room to grow without an ABI break: */
	uintptr_t reserved[2]; /* memtally_buf_init() zeroes them */
} memtally_buf;

/* An empty buffer; allocates nothing. `flags`: MEMTALLY_BUF_GROW_1_5X,
 * MEMTALLY_NO_ACCOUNT. */
MEMTALLY_EXTERN void memtally_buf_init(memtally_buf *b, unsigned flags);

/* Make room for `extra` more bytes. 0, or -ENOMEM (the buffer is
 * unchanged). */
MEMTALLY_EXTERN int memtally_buf_reserve(memtally_buf *b, size_t extra);

/* Copy `n` bytes from `src` (the caller keeps `src`) to the end. 0, or
 * -ENOMEM (the buffer is unchanged). */
MEMTALLY_EXTERN int memtally_buf_append(memtally_buf *b, const void *src,
                                        size_t n);

/*
 * Hand the bytes to the caller: returns a malloc()ed block of the buffer's
 * `len` bytes (shrunk to fit; a 1-byte block when empty) and stores the
 * length in *len (if len is not NULL). The buffer is left empty and
 * reusable. The caller owns the block and frees it with
 * memtally_buf_free_data(block, len), which also un-accounts it (with
 * MEMTALLY_NO_ACCOUNT, plain free()). NULL when the empty case cannot
 * allocate its byte (ENOMEM).
 */
MEMTALLY_EXTERN void *memtally_buf_finish(memtally_buf *b, size_t *len);

/* Free a block returned by memtally_buf_finish() of an accounting buffer;
 * `len` is the length it reported. NULL is ignored. */
MEMTALLY_EXTERN void memtally_buf_free_data(void *data, size_t len);

/* Free the buffer's memory and leave it empty (reusable). NULL is
 * ignored. */
MEMTALLY_EXTERN void memtally_buf_free(memtally_buf *b);

/*
 * A thread-confined arena: bump allocation from chunks of `chunk_size`
 * bytes (0: 16 KiB, which jemalloc serves from its thread cache; a larger
 * request gets a chunk of its own), 16-byte
 * aligned, not zeroed. Individual allocations are never freed; reset
 * releases them all at once.
 */
typedef struct memtally_arena memtally_arena;

/* Create an arena in *out (the caller owns it; memtally_arena_destroy()).
 * No chunk is obtained until the first allocation. `flags`:
 * MEMTALLY_NO_ACCOUNT. 0, -EINVAL (chunk_size too small, at most 48
 * bytes, or absurd), -ENOMEM; *out is NULL on error. */
MEMTALLY_EXTERN int memtally_arena_create(memtally_arena **out,
                                          size_t chunk_size, unsigned flags);

/* `size` bytes owned by the arena, valid until reset or destroy; NULL when
 * a chunk could not be obtained (ENOMEM). */
MEMTALLY_EXTERN void *memtally_arena_alloc(memtally_arena *a, size_t size);

/* Release every allocation. The first chunk is kept (still accounted) for
 * the next round; the others are freed and un-accounted. NULL is
 * ignored. */
MEMTALLY_EXTERN void memtally_arena_reset(memtally_arena *a);

/* Free every chunk, un-account them, free the arena. NULL is ignored. */
MEMTALLY_EXTERN void memtally_arena_destroy(memtally_arena *a);

/* Bytes of chunks the arena holds (and accounted, unless
 * MEMTALLY_NO_ACCOUNT). */
MEMTALLY_EXTERN size_t memtally_arena_accounted(const memtally_arena *a);

/*
 * A pool of fixed-size blocks, `blocks_per_chunk` per chunk. Blocks are
 * 16-byte aligned, not zeroed, and rounded up to a multiple of 16 bytes.
 * Thread-confined unless created with MEMTALLY_POOL_LOCKED.
 */
typedef struct memtally_pool memtally_pool;

/* Create a pool in *out with its first chunk (the caller owns the pool;
 * memtally_pool_destroy()). `flags`: MEMTALLY_POOL_GROW (when no block is
 * free, obtain another chunk rather than fail), MEMTALLY_POOL_LOCKED,
 * MEMTALLY_NO_ACCOUNT. 0, -EINVAL (a zero size or count, or too large),
 * -ENOMEM or another -errno from pthread_mutex_init(); *out is NULL on
 * error. */
MEMTALLY_EXTERN int memtally_pool_create(memtally_pool **out, size_t block_size,
                                         size_t blocks_per_chunk,
                                         unsigned flags);

/* A block owned by the caller until memtally_pool_put(); NULL when the
 * pool is exhausted and has no MEMTALLY_POOL_GROW, or growing failed. */
MEMTALLY_EXTERN void *memtally_pool_get(memtally_pool *p);

/* Give a block from memtally_pool_get() of this pool back. NULL is
 * ignored. */
MEMTALLY_EXTERN void memtally_pool_put(memtally_pool *p, void *block);

/* The block size after rounding. */
MEMTALLY_EXTERN size_t memtally_pool_block_size(const memtally_pool *p);

/* Bytes of chunks the pool holds (and accounted, unless
 * MEMTALLY_NO_ACCOUNT). */
MEMTALLY_EXTERN size_t memtally_pool_accounted(const memtally_pool *p);

/* Free every chunk (blocks still out become invalid), un-account them,
 * free the pool. NULL is ignored. */
MEMTALLY_EXTERN void memtally_pool_destroy(memtally_pool *p);

#ifdef __cplusplus
}
#endif

#endif /* MEMTALLY_H */
