/*
 * server_tick.c - the aggregation half of memtallyd's tick, timed over a
 * real shared-memory segment (the `server` suite's "tick cost
 * against slot count and thread lanes").
 *
 * For each slot count S (64 .. 16384) and lanes in use L: create a header
 * of S slots and one slot table for it (mtshm_header_create and
 * mtshm_table_create, the server's own code: sealed memfds, as memtallyd
 * makes them), take the layout from the header once (mtshm_layout_read),
 * mark every slot live with L lanes claimed, and start a writer thread
 * pinned to another CPU that keeps storing into every lane of every slot,
 * so the reader sums lines just written by another core (the "~3 ns per
 * slot" case). The main thread, pinned to its own CPU, times one tick =
 * the sum of all S slots, TICKS times: by default as mts_core_tick() sums now
 * (mtshm_slot_sum inlined, lane_count from the private layout, the slot
 * `--ahead N` entries on prefetched), `--variant inline` without the
 * prefetch, `--variant call` as it did before the tick was tuned (an
 * out-of-line call per slot that reads the lane count itself).
 * `--quiet` runs without the writer (lines stay in the reader's cache).
 *
 * Proof: the sum of a tick must equal the sum of the values the writer
 * stored (checked with the writer stopped), so the loop really read every
 * lane. This is a lower bound on the server's tick: group totals, limits
 * and the header publish are not in it.
 *
 * Prints one JSON object per (S, L) on stdout.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "mtshm.h"
#include "mtshm_atomic.h"

#include "bench_common.h"

#define TICKS 301

static struct mtshm_map hdr, table;
static struct mtshm_layout layout; /* private copy, as the server keeps */
static uint32_t nslots, nlanes;
static atomic_int stop;
static int writer_cpu = -1;

/* Lane k of slot i holds i * 64 + k + 1 (and, while writing, that plus a
 * round number that is undone before the proof). */
static void *writer(void *arg)
{
	(void)arg;
	if (writer_cpu >= 0)
		bench_pin_cpu(writer_cpu);
	uint64_t round = 0;
	while (!atomic_load_explicit(&stop, memory_order_relaxed)) {
		round++;
		for (uint32_t i = 0; i < nslots; i++) {
			struct mtshm_slot_id *s = mtshm_slot(&layout, table.base, i);
			for (uint32_t k = 0; k < nlanes; k++)
				mtshm_store_relaxeds64(
				    &mtshm_lane(s, k)->bytes,
				    (int64_t)(i * 64u + k + 1 + (round & 1)));
		}
	}
	return NULL;
}

/* A slot's sum behind a call, reading the lane count itself each time, as
 * the out-of-line mtshm_slot_sum() of layout 1.x did. */
__attribute__((noinline)) static int64_t
slot_sum_call(const struct mtshm_layout *l, struct mtshm_slot_id *s,
              int *absurd)
{
	uint64_t flushes;
	return mtshm_slot_sum(s, l->lane_count, &flushes, absurd);
}

/* The loop as it was before the tick was tuned: an out-of-line call per
 * slot. Kept as `--variant call`, the baseline the other variants are
 * compared with in the same run. */
static int64_t tick_call(void)
{
	int64_t total = 0;
	for (uint32_t i = 0; i < nslots; i++) {
		struct mtshm_slot_id *s = mtshm_slot(&layout, table.base, i);
		if (!mtshm_load_relaxed32(&s->pid))
			continue;
		int absurd = 0;
		int64_t b = slot_sum_call(&layout, s, &absurd);
		if (!absurd)
			total += b;
	}
	return total;
}

/* What mts_core_tick() does now: the sum inlined, lane_count read once, and the
 * line of the slot `ahead` entries later asked for early (--ahead N). */
static uint32_t ahead = 8; /* as TICK_PREFETCH in server/registry.c */
static int prefetch = 1;

static int64_t tick_inline(void)
{
	int64_t total = 0;
	uint32_t lanes = layout.lane_count;
	for (uint32_t i = 0; i < nslots; i++) {
		if (prefetch && i + ahead < nslots)
			mtshm_slot_prefetch(
			    mtshm_slot(&layout, table.base, i + ahead));
		struct mtshm_slot_id *s = mtshm_slot(&layout, table.base, i);
		if (!mtshm_load_relaxed32(&s->pid))
			continue;
		uint64_t flushes;
		int absurd;
		int64_t b = mtshm_slot_sum(s, lanes, &flushes, &absurd);
		if (!absurd)
			total += b;
	}
	return total;
}

static int64_t (*tick)(void) = tick_inline;

int main(int argc, char **argv)
{
	int cpu = -1, quiet = 0;
	const char *variant = "prefetch";
	uint32_t slots = 0, lanes = 1;
	for (int i = 1; i < argc; i++) {
		const char *v = i + 1 < argc ? argv[i + 1] : NULL;
		if (!strcmp(argv[i], "--quiet"))
			quiet = 1;
		else if (v && !strcmp(argv[i], "--ahead"))
			ahead = (uint32_t)strtoul(v, NULL, 10), i++;
		else if (v && !strcmp(argv[i], "--variant")) {
			variant = v, i++;
			if (!strcmp(v, "call"))
				tick = tick_call;
			else if (!strcmp(v, "inline"))
				prefetch = 0;
			else if (strcmp(v, "prefetch"))
				return 2;
		} else if (v && !strcmp(argv[i], "--cpu"))
			cpu = atoi(v), i++;
		else if (v && !strcmp(argv[i], "--writer-cpu"))
			writer_cpu = atoi(v), i++;
		else if (v && !strcmp(argv[i], "--slots"))
			slots = (uint32_t)strtoul(v, NULL, 10), i++;
		else if (v && !strcmp(argv[i], "--lanes"))
			lanes = (uint32_t)strtoul(v, NULL, 10), i++;
		else {
			fprintf(stderr,
			        "usage: bench_server_tick --slots S "
			        "[--lanes L] [--cpu N] [--writer-cpu N] "
			        "[--quiet] [--variant call|inline|"
			        "prefetch]\n");
			return 2;
		}
	}
	if (!slots || !lanes || lanes > MTSHM_MAX_LANES)
		return 2;
	nslots = slots, nlanes = lanes;
	if (cpu >= 0 && bench_pin_cpu(cpu))
		return 2;
	/* Anonymous objects: nothing is left behind when the process ends. */
	struct mtshm_params p = {.slots = slots, .lanes = lanes,
	                         .threshold = 65536};
	int rc = mtshm_header_create("mtbench-tick", &p, &hdr);
	if (!rc)
		rc = mtshm_layout_read(hdr.base, hdr.size, &layout);
	if (!rc)
		rc = mtshm_table_create("mtbench-tick-slots", &layout, &table);
	if (rc) {
		fprintf(stderr, "creating the header and table: %s\n",
		        mtshm_strerror(rc));
		return 2;
	}
	for (uint32_t i = 0; i < slots; i++) {
		struct mtshm_slot_id *s = mtshm_slot(&layout, table.base, i);
		mtshm_store_relaxed32(&s->pid, 100000 + i);
		mtshm_store_relaxed32(&s->lanes_used, lanes);
		for (uint32_t k = 0; k < lanes; k++)
			mtshm_store_relaxeds64(&mtshm_lane(s, k)->bytes,
			                       (int64_t)(i * 64u + k + 1));
	}
	pthread_t w;
	if (!quiet && pthread_create(&w, NULL, writer, NULL))
		return 2;
	static uint64_t t[TICKS];
	int64_t sink = 0;
	for (int r = 0; r < 20; r++) /* warm-up */
		sink += tick();
	for (int r = 0; r < TICKS; r++) {
		uint64_t t0 = bench_now_ns();
		sink += tick();
		t[r] = bench_now_ns() - t0;
	}
	if (!quiet) {
		atomic_store(&stop, 1);
		pthread_join(w, NULL);
	}
	/* Proof: restore the known values and check one tick sums them. */
	int64_t want = 0;
	for (uint32_t i = 0; i < slots; i++) {
		struct mtshm_slot_id *s = mtshm_slot(&layout, table.base, i);
		for (uint32_t k = 0; k < lanes; k++) {
			int64_t v = (int64_t)(i * 64u + k + 1);
			mtshm_store_relaxeds64(&mtshm_lane(s, k)->bytes, v);
			want += v;
		}
	}
	int64_t got = tick();
	if (got != want) {
		fprintf(stderr, "PROOF FAILED: a tick summed %" PRId64
		                ", the lanes hold %" PRId64 "\n",
		        got, want);
		return 3;
	}
	qsort(t, TICKS, sizeof(t[0]), bench_cmp_u64);
	printf("{\"variant\": \"%s\", \"slots\": %u, \"lanes\": %u, "
	       "\"writer\": %s, \"ticks\": %d, "
	       "\"p50_ns\": %" PRIu64 ", \"p99_ns\": %" PRIu64
	       ", \"min_ns\": %" PRIu64 ", \"max_ns\": %" PRIu64
	       ", \"sum_checked\": %" PRId64 ", \"sink\": %" PRId64 "}\n",
	       variant, slots, lanes, quiet ? "false" : "true", TICKS,
	       t[TICKS / 2], t[TICKS * 99 / 100], t[0], t[TICKS - 1], got,
	       sink & 1);
	mtshm_close(&table);
	mtshm_close(&hdr);
	return 0;
}
