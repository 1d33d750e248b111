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
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "bench_tick.h"

#define TICKS 301

static struct mtshm_map hdr, table;
static struct mtshm_layout layout; /* private copy, as the server keeps */
static uint32_t nslots, nlanes;
static struct mtshm_slot_id **slot_at; /* slot i of the table, for the writer */

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

/* The command line. */
struct opts {
	int cpu, writer_cpu, quiet;
	const char *variant;
};

static int parse_args(int argc, char **argv, struct opts *o)
{
	*o = (struct opts){.cpu = -1, .writer_cpu = -1, .variant = "prefetch"};
	nlanes = 1;
	for (int i = 1; i < argc; i++) {
		const char *v = i + 1 < argc ? argv[i + 1] : NULL;
		if (!strcmp(argv[i], "--quiet"))
			o->quiet = 1;
		else if (v && !strcmp(argv[i], "--ahead"))
			ahead = (uint32_t)strtoul(v, NULL, 10), i++;
		else if (v && !strcmp(argv[i], "--variant")) {
			o->variant = v, i++;
			if (!strcmp(v, "call"))
				tick = tick_call;
			else if (!strcmp(v, "inline"))
				prefetch = 0;
			else if (strcmp(v, "prefetch"))
				return -1;
		} else if (v && !strcmp(argv[i], "--cpu"))
			o->cpu = atoi(v), i++;
		else if (v && !strcmp(argv[i], "--writer-cpu"))
			o->writer_cpu = atoi(v), i++;
		else if (v && !strcmp(argv[i], "--slots"))
			nslots = (uint32_t)strtoul(v, NULL, 10), i++;
		else if (v && !strcmp(argv[i], "--lanes"))
			nlanes = (uint32_t)strtoul(v, NULL, 10), i++;
		else {
			fprintf(stderr,
			        "usage: bench_server_tick --slots S "
			        "[--lanes L] [--cpu N] [--writer-cpu N] "
			        "[--quiet] [--variant call|inline|"
			        "prefetch]\n");
			return -1;
		}
	}
	return !nslots || !nlanes || nlanes > MTSHM_MAX_LANES ? -1 : 0;
}

/* A header of nslots slots and one slot table for it, the server's own
 * code; every slot live with nlanes lanes claimed and known values. */
static int make_segment(void)
{
	/* Anonymous objects: nothing is left behind when the process ends. */
	struct mtshm_params p = {
	    .slots = nslots, .lanes = nlanes, .threshold = 65536};
	int rc = mtshm_header_create("mtbench-tick", &p, &hdr);
	if (!rc)
		rc = mtshm_layout_read(hdr.base, hdr.size, &layout);
	if (!rc)
		rc = mtshm_table_create("mtbench-tick-slots", &layout, &table);
	if (!rc && !(slot_at = calloc(nslots, sizeof(*slot_at))))
		rc = -ENOMEM;
	if (rc) {
		fprintf(stderr, "creating the header and table: %s\n",
		        mtshm_strerror(rc));
		return -1;
	}
	for (uint32_t i = 0; i < nslots; i++) {
		struct mtshm_slot_id *s = mtshm_slot(&layout, table.base, i);
		slot_at[i] = s;
		mtshm_store_relaxed32(&s->pid, 100000 + i);
		mtshm_store_relaxed32(&s->lanes_used, nlanes);
	}
	bench_lanes_reset(slot_at, nslots, nlanes);
	return 0;
}

/* TICKS timed ticks (after a warm-up), the writer running unless
 * --quiet; what they summed goes to *sink. */
static int time_ticks(const struct opts *o, uint64_t *t, int64_t *sink)
{
	struct bench_writer w = {.slot_at = slot_at,
	                         .nslots = nslots,
	                         .nlanes = nlanes,
	                         .cpu = o->writer_cpu};
	if (!o->quiet && bench_writer_start(&w))
		return -1;
	*sink = 0;
	for (int r = 0; r < BENCH_TICK_WARMUP; r++)
		*sink += tick();
	for (int r = 0; r < TICKS; r++) {
		uint64_t t0 = bench_now_ns();
		*sink += tick();
		t[r] = bench_now_ns() - t0;
	}
	if (!o->quiet)
		bench_writer_stop(&w);
	return 0;
}

int main(int argc, char **argv)
{
	struct opts o;
	if (parse_args(argc, argv, &o) ||
	    (o.cpu >= 0 && bench_pin_cpu(o.cpu)) || make_segment())
		return 2;
	static uint64_t t[TICKS];
	int64_t sink;
	if (time_ticks(&o, t, &sink))
		return 2;
	/* Proof: restore the known values and check one tick sums them. */
	int64_t want = bench_lanes_reset(slot_at, nslots, nlanes);
	int64_t got = tick();
	if (got != want) {
		fprintf(stderr, "PROOF FAILED: a tick summed %" PRId64
		                ", the lanes hold %" PRId64 "\n",
		        got, want);
		return 3;
	}
	struct bench_pcts pc = bench_percentiles(t, TICKS);
	printf("{\"variant\": \"%s\", \"slots\": %u, \"lanes\": %u, "
	       "\"writer\": %s, \"ticks\": %d, "
	       "\"p50_ns\": %" PRIu64 ", \"p99_ns\": %" PRIu64
	       ", \"min_ns\": %" PRIu64 ", \"max_ns\": %" PRIu64
	       ", \"sum_checked\": %" PRId64 ", \"sink\": %" PRId64 "}\n",
	       o.variant, nslots, nlanes, o.quiet ? "false" : "true", TICKS,
	       pc.p50, pc.p99, pc.min, pc.max, got, sink & 1);
	mtshm_close(&table);
	mtshm_close(&hdr);
	free(slot_at);
	return 0;
}
