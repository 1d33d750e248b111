/*
 * server_core_tick.c - memtallyd's whole tick, mts_core_tick(), timed on a real
 * registry over a real header and slot table (the `server` suite).
 *
 * bench_server_tick times the summing loop alone; this times what the
 * server runs every tick period: the slot sums, per-process figures, group
 * totals, reservations, limits evaluation (fleet, groups and every
 * process), enforcement and the seqlock publish. It links
 * memtally_server_core, the library the daemon is built from.
 *
 * Setup, without sockets or worker processes: a header of --slots S slots
 * and --seg-lanes lanes (the server's default is 4; mtshm_header_create,
 * as memtallyd makes it), a registry on it (mts_core_init), a policy
 * with a fleet limit, a per-process limit and one [group] limit (so limits
 * evaluation compares, not skips), then S workers of this uid entered
 * through the restart path, mts_registry_adopt_slot(), spread over
 * --groups G groups, all in one slot table (mtshm_table_create, handed to
 * the registry with mts_table_adopt() as a restarted server takes over a
 * worker's table). mts_register() needs a live process per worker (its
 * /proc start time and a pidfd); the adoption path runs the same registry
 * code from there on: slot placement, the tick, limits and exits. Each
 * worker's "pidfd" is an eventfd: the registry only polls it for
 * readability, and writing to it makes the server see an exit through its
 * real on_pidfd -> proc_release path. With
 * --churn P, P% of the workers (random) then exit that way and as many new
 * ones are adopted into the freed slots, with heap allocations in between,
 * so the dense order, the slot order and the heap order of the per-process
 * records no longer agree (what a long-running server looks like).
 *
 * With --uid U the workers are U's: an untrusted uid (not root nor ours)
 * makes the tick vouch for each one (vouch.c).
 *
 * Each worker claims --lanes L lanes (L <= seg lanes). With --writer a
 * thread on another CPU keeps storing into every lane in use, through the
 * addresses the registry computed (mts_slot).
 *
 * Proof: with the writer stopped, one more tick must publish exactly the
 * sum of what the lanes hold, in the header's fleet snapshot.
 *
 * Prints one JSON object on stdout.
 */
#include "server.h" /* _GNU_SOURCE comes with memtally_server_core */

#include <errno.h>
#include <inttypes.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <time.h>
#include <unistd.h>

#include "mts_log.h"

#include "bench_tick.h"

#define TICKS_DEFAULT 301
#define PID_BASE      5000000u /* above any pid_max: never a real process */

static struct mtshm_map map; /* the header */
static struct mts_registry reg;
static uv_loop_t loop;
static uint32_t nslots, nlanes;

/* What a worker's client would have flushed into slot i of `t`. */
static void slot_fill(const struct mts_table *t, uint32_t i)
{
	struct mtshm_slot_id *s = mtshm_slot(&reg.layout, t->map.base, i);
	for (uint32_t k = 0; k < nlanes; k++)
		mtshm_store_relaxeds64(&mtshm_lane(s, k)->bytes,
		                       bench_lane_value(i, k));
	mtshm_store_relaxed32(&s->lanes_used, nlanes);
	mtshm_store_relaxed32(&s->threads, nlanes);
}

static uint64_t rng = 88172645463325252u;
static uint64_t xorshift(void)
{
	rng ^= rng << 13;
	rng ^= rng >> 7;
	rng ^= rng << 17;
	return rng;
}

/* This uid's slot table: the registry's, or a new one handed to it (the
 * registry frees a table with its last process). */
static uint32_t worker_uid; /* --uid, default ours */

static struct mts_table *uid_table(void)
{
	uint32_t uid = worker_uid;
	struct mts_table *t = mts_table_find(&reg, uid);
	if (t)
		return t;
	struct mtshm_map tm;
	if (mtshm_table_create("mtbench-ctick-slots", &reg.layout, &tm))
		return NULL;
	if (mts_table_adopt(&reg, uid, &tm)) {
		mtshm_close(&tm);
		return NULL;
	}
	return mts_table_find(&reg, uid);
}

static int adopt(uint32_t slot, uint32_t pid, uint32_t groups)
{
	struct mts_table *t = uid_table();
	if (!t)
		return -1;
	struct mts_adopted a = {
	    .slot = slot,
	    .pid = pid,
	    .uid = worker_uid,
	    .start_time = 1,
	    .image_id = 1,
	    .registered_ns = mts_now_realtime(),
	};
	a.pidfd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
	if (a.pidfd < 0)
		return -1;
	snprintf(a.group, sizeof(a.group), "group-%u", pid % groups);
	snprintf(a.task, sizeof(a.task), "task-%u", pid % 97);
	slot_fill(t, slot);
	/* The pid a registration would have published. */
	mtshm_store_relaxed32(&mtshm_slot(&reg.layout, t->map.base, slot)->pid,
	                      pid);
	int err = mts_registry_adopt_slot(&reg, &a, t);
	if (err < 0) {
		if (err != -EAGAIN)
			close(a.pidfd);
		mts_table_gc(&reg, t);
		return -1;
	}
	return 0;
}

/* The command line. */
struct opts {
	int cpu, writer_cpu, use_writer, ticks;
	uint32_t seg_lanes, groups, churn;
};

static int parse_args(int argc, char **argv, struct opts *o)
{
	*o = (struct opts){.cpu = -1,
	                   .writer_cpu = -1,
	                   .ticks = TICKS_DEFAULT,
	                   .seg_lanes = MTSHM_DEFAULT_LANES,
	                   .groups = 8};
	nlanes = 1;
	worker_uid = (uint32_t)getuid();
	for (int i = 1; i < argc; i++) {
		const char *v = i + 1 < argc ? argv[i + 1] : NULL;
		if (!strcmp(argv[i], "--writer"))
			o->use_writer = 1;
		else if (v && !strcmp(argv[i], "--cpu"))
			o->cpu = atoi(v), i++;
		else if (v && !strcmp(argv[i], "--writer-cpu"))
			o->writer_cpu = atoi(v), i++;
		else if (v && !strcmp(argv[i], "--slots"))
			nslots = (uint32_t)strtoul(v, NULL, 10), i++;
		else if (v && !strcmp(argv[i], "--lanes"))
			nlanes = (uint32_t)strtoul(v, NULL, 10), i++;
		else if (v && !strcmp(argv[i], "--seg-lanes"))
			o->seg_lanes = (uint32_t)strtoul(v, NULL, 10), i++;
		else if (v && !strcmp(argv[i], "--groups"))
			o->groups = (uint32_t)strtoul(v, NULL, 10), i++;
		else if (v && !strcmp(argv[i], "--churn"))
			o->churn = (uint32_t)strtoul(v, NULL, 10), i++;
		else if (v && !strcmp(argv[i], "--ticks"))
			o->ticks = atoi(v), i++;
		else if (v && !strcmp(argv[i], "--uid"))
			worker_uid = (uint32_t)strtoul(v, NULL, 10), i++;
		else {
			fprintf(stderr,
			        "usage: bench_server_core_tick --slots S "
			        "[--lanes L] [--seg-lanes N] [--groups G] "
			        "[--churn PCT] [--ticks N] [--cpu N] [--uid U] "
			        "[--writer [--writer-cpu N]]\n");
			return -1;
		}
	}
	return !nslots || !nlanes || o->seg_lanes > MTSHM_MAX_LANES ||
	               nlanes > o->seg_lanes || !o->groups || o->churn > 100 ||
	               o->ticks < 1
	           ? -1
	           : 0;
}

/* The header and a registry on it, with limits that compare but never
 * trip: the tick's steady state. */
static int make_registry(const struct opts *o)
{
	/* Anonymous objects: nothing is left behind when the process ends. */
	struct mtshm_params sp = {.slots = nslots,
	                          .lanes = o->seg_lanes,
	                          .threshold = MTS_DEFAULT_THRESHOLD};
	int rc = mtshm_header_create("mtbench-ctick", &sp, &map);
	if (rc) {
		fprintf(stderr, "mtshm_header_create: %s\n",
		        mtshm_strerror(rc));
		return -1;
	}
	if (uv_loop_init(&loop) ||
	    mts_core_init(&reg, &loop, &map, "mtbench-ctick", NULL))
		return -1;
	int64_t most = 0; /* what the lanes can hold while written */
	for (uint32_t i = 0; i < nslots; i++)
		for (uint32_t k = 0; k < nlanes; k++)
			most += bench_lane_value(i, k) + 1;
	struct mts_policy pol;
	static struct mts_group_policy gp = {.name = (char *)"group-0"};
	gp.limit = (uint64_t)most * 4;
	mts_policy_defaults(&pol);
	pol.fleet_limit = (uint64_t)most * 4;
	pol.process_limit = UINT64_C(1) << 40;
	pol.groups = &gp;
	pol.ngroups = 1;
	return mts_limits_apply_policy(&reg, &pol) ? -1 : 0;
}

/* Churn through the server's own exit path (P% of the workers, at
 * random), then refill the freed slots with heap allocations in between;
 * the allocations are kept in `noise`. */
static int churn_workers(const struct opts *o, void **noise)
{
	uint32_t next_pid = PID_BASE + nslots, gone = 0;
	for (uint32_t i = 0; i < nslots; i++) {
		if (xorshift() % 100 >= o->churn)
			continue;
		struct mts_proc *p = reg.by_slot[i];
		uint64_t one = 1;
		if (write(p->pidfd, &one, sizeof(one)) != sizeof(one))
			return -1;
		gone++;
	}
	while (reg.ndense > nslots - gone)
		uv_run(&loop, UV_RUN_NOWAIT);
	uv_run(&loop, UV_RUN_NOWAIT); /* close callbacks */
	for (uint32_t i = 0; i < nslots; i++) {
		if (reg.by_slot[i])
			continue;
		noise[i] = malloc(64 + xorshift() % 512);
		if (adopt(i, next_pid++, o->groups))
			return -1;
	}
	mts_registry_rebuild_free(&reg);
	return 0;
}

/* A worker in every slot, then --churn. */
static int add_workers(const struct opts *o, void **noise)
{
	for (uint32_t i = 0; i < nslots; i++)
		if (adopt(i, PID_BASE + i, o->groups)) {
			perror("adopt (eventfd: raise ulimit -n?)");
			return -1;
		}
	mts_registry_rebuild_free(&reg);
	if (o->churn && churn_workers(o, noise))
		return -1;
	if (reg.ndense != nslots) {
		fprintf(stderr, "registered %u of %u\n", reg.ndense, nslots);
		return -1;
	}
	return 0;
}

/* The timed ticks, then the per-process limits pass alone (idempotent:
 * no state changes here), to show which part of the tick costs what. */
static int time_ticks(const struct opts *o, uint64_t *t, uint64_t *tl)
{
	struct bench_writer w = {.slot_at = reg.slot_at,
	                         .nslots = nslots,
	                         .nlanes = nlanes,
	                         .cpu = o->writer_cpu};
	if (o->use_writer && bench_writer_start(&w))
		return -1;
	for (int r = 0; r < BENCH_TICK_WARMUP; r++)
		mts_core_tick(&reg);
	for (int r = 0; r < o->ticks; r++) {
		uint64_t t0 = bench_now_ns();
		mts_core_tick(&reg);
		t[r] = bench_now_ns() - t0;
	}
	for (int r = 0; r < o->ticks; r++) {
		mts_core_tick(&reg); /* the same cache state a tick leaves */
		uint64_t t0 = bench_now_ns();
		mts_limits_eval(&reg, true);
		tl[r] = bench_now_ns() - t0;
	}
	if (o->use_writer)
		bench_writer_stop(&w);
	return 0;
}

/* Proof: known values, one tick, the published fleet total and the
 * groups' sum. Returns what the lanes hold, or -1. */
static int64_t prove(void)
{
	int64_t want = bench_lanes_reset(reg.slot_at, nslots, nlanes);
	mts_core_tick(&reg);
	/* Workers of an untrusted --uid: the fleet counts what the kernel
	 * vouches for (nothing here: there are no such processes) and the
	 * rest is unvouched; the two add up to the lanes. */
	uint64_t unvouched = reg.totals.unvouched;
	struct mtshm_fleet f;
	if (mtshm_fleet_read(map.hdr, &f) ||
	    f.bytes + unvouched != (uint64_t)want || f.processes != nslots ||
	    f.state != MTSHM_STATE_OK) {
		fprintf(stderr,
		        "PROOF FAILED: published %" PRIu64 " bytes, %u "
		        "processes, state %u; the lanes hold %" PRId64 "\n",
		        f.bytes, f.processes, f.state, want);
		return -1;
	}
	uint64_t gsum = 0;
	for (uint32_t i = 0; i < reg.groups_used; i++)
		gsum += reg.groups[i].name ? reg.groups[i].bytes +
		                                 reg.groups[i].unvouched
		                           : 0;
	if (gsum != (uint64_t)want) {
		fprintf(stderr, "PROOF FAILED: groups sum to %" PRIu64 "\n",
		        gsum);
		return -1;
	}
	return want;
}

static void report(const struct opts *o, uint64_t *t, uint64_t *tl,
                   int64_t want)
{
	struct bench_pcts pc = bench_percentiles(t, (size_t)o->ticks);
	struct bench_pcts pl = bench_percentiles(tl, (size_t)o->ticks);
	printf("{\"mode\": \"full\", \"slots\": %u, \"lanes\": %u, "
	       "\"seg_lanes\": %u, \"groups\": %u, \"churn\": %u, "
	       "\"writer\": %s, \"ticks\": %d, \"p50_ns\": %" PRIu64
	       ", \"p99_ns\": %" PRIu64 ", \"min_ns\": %" PRIu64
	       ", \"max_ns\": %" PRIu64 ", \"limits_p50_ns\": %" PRIu64
	       ", \"limits_min_ns\": %" PRIu64 ", \"sum_checked\": %" PRId64
	       "}\n",
	       nslots, nlanes, o->seg_lanes, o->groups, o->churn,
	       o->use_writer ? "true" : "false", o->ticks, pc.p50, pc.p99,
	       pc.min, pc.max, pl.p50, pl.min, want);
}

static void tear_down(void)
{
	mts_registry_close(&reg);
	uv_run(&loop, UV_RUN_DEFAULT);
	mts_core_free(&reg);
	uv_loop_close(&loop);
	mtshm_close(&map);
}

int main(int argc, char **argv)
{
	struct opts o;
	if (parse_args(argc, argv, &o) || (o.cpu >= 0 && bench_pin_cpu(o.cpu)))
		return 2;
	mts_log_set_level(MTS_LOG_ERROR);
	void **noise = calloc(nslots, sizeof(*noise));
	uint64_t *t = calloc((size_t)o.ticks, sizeof(*t));
	uint64_t *tl = calloc((size_t)o.ticks, sizeof(*tl));
	if (!noise || !t || !tl || make_registry(&o) ||
	    add_workers(&o, noise) || time_ticks(&o, t, tl))
		return 2;
	int64_t want = prove();
	if (want < 0)
		return 3;
	report(&o, t, tl, want);
	tear_down();
	for (uint32_t i = 0; i < nslots; i++)
		free(noise[i]);
	free(noise);
	free(t);
	free(tl);
	return 0;
}
