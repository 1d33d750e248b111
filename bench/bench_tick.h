/*
 * bench_tick.h - what the two tick benchmarks share: server_tick.c times
 * the summing loop alone, server_core_tick.c the server's whole tick, both
 * over slots whose lanes hold known values while a writer thread on another
 * CPU keeps storing into them (so a tick sums lines just written by another
 * core, as the server's does).
 */
#ifndef MEMTALLY_BENCH_TICK_H
#define MEMTALLY_BENCH_TICK_H

#include <pthread.h>
#include <stdatomic.h>

#include "mtshm.h"
#include "mtshm_atomic.h"

#include "bench_common.h"

/* Ticks run before the timed ones. */
#define BENCH_TICK_WARMUP 20

/* Lane k of slot i holds i * 64 + k + 1 (+ 0 or 1 while the writer runs):
 * a tick's sum is known once the writer stops. */
static inline int64_t bench_lane_value(uint32_t i, uint32_t k)
{
	return (int64_t)(i * 64u + k + 1);
}

/* The writer: `slot_at[i]` is slot i, `nlanes` lanes of each are stored
 * into, from CPU `cpu` (if >= 0). */
struct bench_writer {
	struct mtshm_slot_id *const *slot_at;
	uint32_t nslots, nlanes;
	int cpu;
	atomic_int stop;
	pthread_t tid;
};

static void *bench_writer_main(void *arg)
{
	struct bench_writer *w = arg;
	if (w->cpu >= 0)
		bench_pin_cpu(w->cpu);
	uint64_t round = 0;
	while (!atomic_load_explicit(&w->stop, memory_order_relaxed)) {
		round++;
		for (uint32_t i = 0; i < w->nslots; i++) {
			struct mtshm_slot_id *s = w->slot_at[i];
			for (uint32_t k = 0; k < w->nlanes; k++)
				mtshm_store_relaxeds64(
				    &mtshm_lane(s, k)->bytes,
				    bench_lane_value(i, k) +
				        (int64_t)(round & 1));
		}
	}
	return NULL;
}

static inline int bench_writer_start(struct bench_writer *w)
{
	atomic_store(&w->stop, 0);
	return pthread_create(&w->tid, NULL, bench_writer_main, w) ? -1 : 0;
}

static inline void bench_writer_stop(struct bench_writer *w)
{
	atomic_store(&w->stop, 1);
	pthread_join(w->tid, NULL);
}

/* Store the known values back into every lane in use (the writer
 * stopped); returns their sum, what one tick must find. */
static inline int64_t bench_lanes_reset(struct mtshm_slot_id *const *slot_at,
                                        uint32_t nslots, uint32_t nlanes)
{
	int64_t want = 0;
	for (uint32_t i = 0; i < nslots; i++)
		for (uint32_t k = 0; k < nlanes; k++) {
			int64_t v = bench_lane_value(i, k);
			struct mtshm_lane *l = mtshm_lane(slot_at[i], k);
			mtshm_store_relaxeds64(&l->bytes, v);
			want += v;
		}
	return want;
}

#endif /* MEMTALLY_BENCH_TICK_H */
