/*
 * jemalloc_fe.h - the jemalloc front end as the preload and a linked
 * worker set it up (jemalloc_fe.c).
 */
#ifndef MEMTALLY_JEMALLOC_FE_H
#define MEMTALLY_JEMALLOC_FE_H

#include <stddef.h>
#include <stdint.h>

/*
 * The jemalloc front end (jemalloc_fe.c). `mallctl` is jemalloc's (linked
 * into the preload, or found in the process by a linked worker).
 * mtj_init() chooses the mode once per process and sets up the calling
 * thread; `allow_counting` lets it fall back to counting on every call
 * (jemalloc's hooks) when the activity callback is unavailable.
 * mtj_thread_start() sets up the calling thread. Both return 0 or a
 * negative code (MEMTALLY_EDISABLED: not counting).
 */
typedef int (*mtj_mallctl_fn)(const char *, void *, size_t *, void *, size_t);
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

#endif /* MEMTALLY_JEMALLOC_FE_H */
