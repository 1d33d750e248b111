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
 * as memtallyd makes it), a registry on it (mts_registry_init), a policy
 * with a fleet limit, a per-process limit and one [group] limit (so limits
 * evaluation compares, not skips), then S workers of this uid entered
 * through the restart path, mts_registry_adopt_slot(), spread over
 * --groups G groups, all in one slot table (mtshm_table_create, handed to
 * the registry with mts_table_adopt() as a restarted server takes over a
 * worker's table). mts_register() needs a live process per worker (its
 * /proc start time and a pidfd); the adoption path runs the same registry
 * code from there on: slot placement, the tick, limits and exits. Each worker's "pidfd" is an eventfd: the
 * registry only polls it for readability, and writing to it makes the
 * server see an exit through its real on_pidfd -> proc_release path. With
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
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <time.h>
#include <unistd.h>

#include "mts_log.h"

#include "bench_common.h"

#define TICKS_DEFAULT 301
#define PID_BASE      5000000u /* above any pid_max: never a real process */

static struct mtshm_map map; /* the header */
static struct mts_registry reg;
static uint32_t nslots, nlanes;
static atomic_int stop;
static int writer_cpu = -1;

/* Lane k of slot i holds i * 64 + k + 1 (+ 0 or 1 while writing). */
static int64_t lane_value(uint32_t i, uint32_t k)
{
	return (int64_t)(i * 64u + k + 1);
}

static void *writer(void *arg)
{
	(void)arg;
	if (writer_cpu >= 0)
		bench_pin_cpu(writer_cpu);
	uint64_t round = 0;
	while (!atomic_load_explicit(&stop, memory_order_relaxed)) {
		round++;
		for (uint32_t i = 0; i < nslots; i++) {
			struct mtshm_slot_id *s = mts_slot(&reg, i);
			for (uint32_t k = 0; k < nlanes; k++)
				mtshm_store_relaxeds64(
				    &mtshm_lane(s, k)->bytes,
				    lane_value(i, k) + (int64_t)(round & 1));
		}
	}
	return NULL;
}

/* What a worker's client would have flushed into slot i of `t`. */
static void slot_fill(const struct mts_table *t, uint32_t i)
{
	struct mtshm_slot_id *s = mtshm_slot(&reg.layout, t->map.base, i);
	for (uint32_t k = 0; k < nlanes; k++)
		mtshm_store_relaxeds64(&mtshm_lane(s, k)->bytes,
		                       lane_value(i, k));
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

int main(int argc, char **argv)
{
	int cpu = -1, use_writer = 0, ticks = TICKS_DEFAULT;
	uint32_t slots = 0, lanes = 1, seg_lanes = MTSHM_DEFAULT_LANES;
	uint32_t groups = 8, churn = 0;
	worker_uid = (uint32_t)getuid();
	for (int i = 1; i < argc; i++) {
		const char *v = i + 1 < argc ? argv[i + 1] : NULL;
		if (!strcmp(argv[i], "--writer"))
			use_writer = 1;
		else if (v && !strcmp(argv[i], "--cpu"))
			cpu = atoi(v), i++;
		else if (v && !strcmp(argv[i], "--writer-cpu"))
			writer_cpu = atoi(v), i++;
		else if (v && !strcmp(argv[i], "--slots"))
			slots = (uint32_t)strtoul(v, NULL, 10), i++;
		else if (v && !strcmp(argv[i], "--lanes"))
			lanes = (uint32_t)strtoul(v, NULL, 10), i++;
		else if (v && !strcmp(argv[i], "--seg-lanes"))
			seg_lanes = (uint32_t)strtoul(v, NULL, 10), i++;
		else if (v && !strcmp(argv[i], "--groups"))
			groups = (uint32_t)strtoul(v, NULL, 10), i++;
		else if (v && !strcmp(argv[i], "--churn"))
			churn = (uint32_t)strtoul(v, NULL, 10), i++;
		else if (v && !strcmp(argv[i], "--ticks"))
			ticks = atoi(v), i++;
		else if (v && !strcmp(argv[i], "--uid"))
			worker_uid = (uint32_t)strtoul(v, NULL, 10), i++;
		else {
			fprintf(stderr,
			        "usage: bench_server_core_tick --slots S "
			        "[--lanes L] [--seg-lanes N] [--groups G] "
			        "[--churn PCT] [--ticks N] [--cpu N] [--uid U] "
			        "[--writer [--writer-cpu N]]\n");
			return 2;
		}
	}
	if (!slots || !lanes || seg_lanes > MTSHM_MAX_LANES ||
	    lanes > seg_lanes || !groups || churn > 100 || ticks < 1)
		return 2;
	nslots = slots, nlanes = lanes;
	if (cpu >= 0 && bench_pin_cpu(cpu))
		return 2;
	mts_log_set_level(MTS_LOG_ERROR);

	/* Anonymous objects: nothing is left behind when the process ends. */
	struct mtshm_params sp = {.slots = slots,
	                          .lanes = seg_lanes,
	                          .threshold = MTS_DEFAULT_THRESHOLD};
	int rc = mtshm_header_create("mtbench-ctick", &sp, &map);
	if (rc) {
		fprintf(stderr, "mtshm_header_create: %s\n",
		        mtshm_strerror(rc));
		return 2;
	}

	uv_loop_t loop;
	if (uv_loop_init(&loop) ||
	    mts_core_init(&reg, &loop, &map, "mtbench-ctick", NULL))
		return 2;
	/* Limits that compare but never trip: the tick's steady state. */
	int64_t want = 0;
	for (uint32_t i = 0; i < slots; i++)
		for (uint32_t k = 0; k < lanes; k++)
			want += lane_value(i, k) + 1;
	struct mts_policy pol;
	struct mts_group_policy gp = {.name = (char *)"group-0",
	                              .limit = (uint64_t)want * 4};
	mts_policy_defaults(&pol);
	pol.fleet_limit = (uint64_t)want * 4;
	pol.process_limit = UINT64_C(1) << 40;
	pol.groups = &gp;
	pol.ngroups = 1;
	if (mts_limits_apply_policy(&reg, &pol))
		return 2;

	for (uint32_t i = 0; i < slots; i++)
		if (adopt(i, PID_BASE + i, groups)) {
			perror("adopt (eventfd: raise ulimit -n?)");
			return 2;
		}
	mts_registry_rebuild_free(&reg);

	/* Churn through the server's own exit path, then refill. */
	void **noise = calloc(slots, sizeof(*noise));
	uint32_t next_pid = PID_BASE + slots, gone = 0;
	if (churn) {
		for (uint32_t i = 0; i < slots; i++) {
			if (xorshift() % 100 >= churn)
				continue;
			struct mts_proc *p = reg.by_slot[i];
			uint64_t one = 1;
			if (write(p->pidfd, &one, sizeof(one)) != sizeof(one))
				return 2;
			gone++;
		}
		while (reg.ndense > slots - gone)
			uv_run(&loop, UV_RUN_NOWAIT);
		uv_run(&loop, UV_RUN_NOWAIT); /* close callbacks */
		for (uint32_t i = 0; i < slots; i++) {
			if (reg.by_slot[i])
				continue;
			noise[i] = malloc(64 + xorshift() % 512);
			if (adopt(i, next_pid++, groups))
				return 2;
		}
		mts_registry_rebuild_free(&reg);
	}
	if (reg.ndense != slots) {
		fprintf(stderr, "registered %u of %u\n", reg.ndense, slots);
		return 2;
	}

	pthread_t w;
	if (use_writer && pthread_create(&w, NULL, writer, NULL))
		return 2;
	uint64_t *t = calloc((size_t)ticks, sizeof(*t));
	for (int r = 0; r < 20; r++) /* warm-up */
		mts_core_tick(&reg);
	for (int r = 0; r < ticks; r++) {
		uint64_t t0 = bench_now_ns();
		mts_core_tick(&reg);
		t[r] = bench_now_ns() - t0;
	}
	/* The per-process limits pass alone (idempotent: no state changes
	 * here), to show which part of the tick costs what. */
	uint64_t *tl = calloc((size_t)ticks, sizeof(*tl));
	for (int r = 0; r < ticks; r++) {
		mts_core_tick(&reg); /* the same cache state a tick leaves */
		uint64_t t0 = bench_now_ns();
		mts_limits_eval(&reg, true);
		tl[r] = bench_now_ns() - t0;
	}
	if (use_writer) {
		atomic_store(&stop, 1);
		pthread_join(w, NULL);
	}

	/* Proof: known values, one tick, the published fleet total. */
	want = 0;
	for (uint32_t i = 0; i < slots; i++) {
		struct mtshm_slot_id *s = mts_slot(&reg, i);
		for (uint32_t k = 0; k < lanes; k++) {
			mtshm_store_relaxeds64(&mtshm_lane(s, k)->bytes,
			                       lane_value(i, k));
			want += lane_value(i, k);
		}
	}
	mts_core_tick(&reg);
	/* Workers of an untrusted --uid: the fleet counts what the kernel
	 * vouches for (nothing here: there are no such processes) and the
	 * rest is unvouched; the two add up to the lanes. */
	uint64_t unvouched = reg.totals.unvouched;
	struct mtshm_fleet f;
	if (mtshm_fleet_read(map.hdr, &f) ||
	    f.bytes + unvouched != (uint64_t)want ||
	    f.processes != slots || f.state != MTSHM_STATE_OK) {
		fprintf(stderr,
		        "PROOF FAILED: published %" PRIu64 " bytes, %u "
		        "processes, state %u; the lanes hold %" PRId64 "\n",
		        f.bytes, f.processes, f.state, want);
		return 3;
	}
	uint64_t gsum = 0;
	for (uint32_t i = 0; i < reg.groups_used; i++)
		gsum += reg.groups[i].name ? reg.groups[i].bytes +
		                                 reg.groups[i].unvouched
		                           : 0;
	if (gsum != (uint64_t)want) {
		fprintf(stderr, "PROOF FAILED: groups sum to %" PRIu64 "\n",
		        gsum);
		return 3;
	}

	qsort(t, (size_t)ticks, sizeof(t[0]), bench_cmp_u64);
	qsort(tl, (size_t)ticks, sizeof(tl[0]), bench_cmp_u64);
	printf("{\"mode\": \"full\", \"slots\": %u, \"lanes\": %u, "
	       "\"seg_lanes\": %u, \"groups\": %u, \"churn\": %u, "
	       "\"writer\": %s, \"ticks\": %d, \"p50_ns\": %" PRIu64
	       ", \"p99_ns\": %" PRIu64 ", \"min_ns\": %" PRIu64
	       ", \"max_ns\": %" PRIu64 ", \"limits_p50_ns\": %" PRIu64
	       ", \"limits_min_ns\": %" PRIu64 ", \"sum_checked\": %" PRId64
	       "}\n",
	       slots, lanes, seg_lanes, groups, churn,
	       use_writer ? "true" : "false", ticks, t[ticks / 2],
	       t[(size_t)ticks * 99 / 100], t[0], t[ticks - 1], tl[ticks / 2],
	       tl[0], want);

	mts_registry_close(&reg);
	uv_run(&loop, UV_RUN_DEFAULT);
	mts_core_free(&reg);
	uv_loop_close(&loop);
	mtshm_close(&map);
	for (uint32_t i = 0; i < slots; i++)
		free(noise[i]);
	free(noise);
	free(t);
	free(tl);
	return 0;
}
