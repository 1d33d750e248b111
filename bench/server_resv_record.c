/*
 * server_resv_record.c - what memtallyd's record of its reservations
 * costs (the `server` suite): mts_resv_encode, which the server runs on
 * its loop a moment after a reservation comes or goes and every few
 * seconds while any is held, and mts_resv_restore, which a restarted
 * server runs before it serves.
 *
 * Setup, without sockets: a registry of the daemon's own code
 * (mts_core_init on a real header, as server_core_tick.c), no limits, no
 * per-uid cap on reservations, then --resv N reservations granted through
 * mts_admit() by peers of 8 uids, each with its own task name and one of
 * 4 kinds of its uid (a scheduler's Admits: task, kind, bytes).
 *
 * Timed: mts_resv_encode --takes times (the median and the extremes), on
 * the loop in the server; mts_record_seal (the checksum), on the thread
 * pool where the record is written; and one mts_resv_restore of the last
 * record into a second registry.
 * The server takes the record no sooner than 100 times its last cost
 * after the one before (server.c, save_resv), so `loop_share` is the
 * most of the loop's time the record can take at this size: the median
 * cost over the larger of that gap and the 5 s refresh.
 *
 * Proof: the record's count is N, and the second registry holds N
 * reservations of the same total after the restore.
 *
 * Prints one JSON object on stdout.
 */
#include "server.h" /* _GNU_SOURCE comes with memtally_server_core */

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "mts_log.h"

#define UIDS  8u
#define KINDS 4u

static uint64_t now_ns(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

static int cmp_u64(const void *a, const void *b)
{
	uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
	return x < y ? -1 : x > y;
}

struct bench_reg {
	struct mtshm_map map;
	struct mts_registry reg;
	uv_loop_t loop;
};

static int reg_open(struct bench_reg *b, const char *label)
{
	struct mtshm_params sp = {
	    .slots = 64, .lanes = 4, .threshold = MTS_DEFAULT_THRESHOLD};
	int rc = mtshm_header_create(label, &sp, &b->map);
	if (rc) {
		fprintf(stderr, "mtshm_header_create: %s\n",
		        mtshm_strerror(rc));
		return -1;
	}
	if (uv_loop_init(&b->loop) ||
	    mts_core_init(&b->reg, &b->loop, &b->map, label, NULL))
		return -1;
	struct mts_policy pol;
	mts_policy_defaults(&pol);
	pol.fleet_limit = 0;
	pol.max_resv_per_uid = 0;
	pol.default_ttl_s = 3600;
	rc = mts_limits_apply_policy(&b->reg, &pol);
	mts_policy_free(&pol);
	return rc ? -1 : 0;
}

static void reg_close(struct bench_reg *b)
{
	mts_registry_close(&b->reg);
	uv_run(&b->loop, UV_RUN_DEFAULT);
	mts_core_free(&b->reg);
	uv_loop_close(&b->loop);
	mtshm_close(&b->map);
}

static int grant(struct bench_reg *b, uint32_t n)
{
	for (uint32_t i = 0; i < n; i++) {
		struct mts_peer peer = {.fd = -1,
		                        .has_cred = true,
		                        .pid = (uint32_t)getpid(),
		                        .uid = 1000 + i % UIDS,
		                        .gid = 1000 + i % UIDS};
		char task[48], kind[16];
		snprintf(task, sizeof(task), "job-%06" PRIu32 "-attempt-1", i);
		snprintf(kind, sizeof(kind), "step%02" PRIu32,
		         i / UIDS % KINDS);
		struct mts_admit_req req = {.bytes = (64u + i % 192u) << 20,
		                            .task = task,
		                            .kind = kind};
		struct mts_admit_out out;
		int rc = mts_admit(&b->reg, &peer, &req, &out);
		if (rc < 0 || !out.admitted) {
			fprintf(stderr, "admit %" PRIu32 ": %s\n", i,
			        rc < 0 ? strerror(-rc) : out.why);
			return -1;
		}
	}
	return 0;
}

int main(int argc, char **argv)
{
	uint32_t n = 65536, takes = 21;
	for (int i = 1; i < argc; i++) {
		if (!strcmp(argv[i], "--resv") && i + 1 < argc)
			n = (uint32_t)strtoul(argv[++i], NULL, 10);
		else if (!strcmp(argv[i], "--takes") && i + 1 < argc)
			takes = (uint32_t)strtoul(argv[++i], NULL, 10);
		else {
			fprintf(stderr,
			        "usage: %s [--resv N (<= %u)] [--takes T]\n",
			        argv[0], MTS_RESV_MAX);
			return 2;
		}
	}
	if (!n || n > MTS_RESV_MAX || !takes) {
		fprintf(stderr, "--resv 1..%u, --takes >= 1\n", MTS_RESV_MAX);
		return 2;
	}
	mts_log_set_level(MTS_LOG_ERROR);
	struct bench_reg a, b;
	if (reg_open(&a, "mtbench-resv-a") || grant(&a, n))
		return 1;
	uint64_t *t = calloc(takes, sizeof(*t));
	unsigned char *d = NULL;
	size_t len = 0;
	if (!t)
		return 1;
	for (uint32_t k = 0; k < takes; k++) {
		free(d);
		uint64_t t0 = now_ns();
		if (mts_resv_encode(&a.reg, &d, &len) < 0) {
			fprintf(stderr, "mts_resv_encode failed\n");
			return 1;
		}
		t[k] = now_ns() - t0;
	}
	qsort(t, takes, sizeof(*t), cmp_u64);
	/* The seal runs where the record is written, on the thread pool. */
	uint64_t t0 = now_ns();
	mts_record_seal(d, len);
	uint64_t seal = now_ns() - t0;
	uint32_t count;
	memcpy(&count, d + 12, sizeof(count)); /* after magic, version */
	if (count != n) {
		fprintf(stderr, "the record holds %u of %u\n", count, n);
		return 1;
	}

	if (reg_open(&b, "mtbench-resv-b"))
		return 1;
	uint32_t kept, dropped;
	t0 = now_ns();
	int rc = mts_resv_restore(&b.reg, d, len, false, &kept, &dropped);
	uint64_t restore = now_ns() - t0;
	if (rc < 0 || kept != n || dropped || b.reg.totals.reservations != n ||
	    b.reg.totals.reserved != a.reg.totals.reserved) {
		fprintf(stderr,
		        "restore: %d, kept %u, dropped %u, %" PRIu64
		        " reservations of %" PRIu64
		        " bytes (want %u of %" PRIu64 ")\n",
		        rc, kept, dropped, (uint64_t)b.reg.totals.reservations,
		        (uint64_t)b.reg.totals.reserved, n,
		        (uint64_t)a.reg.totals.reserved);
		return 1;
	}
	double med_ms = (double)t[takes / 2] / 1e6;
	/* save_resv: no sooner than 100 times the last cost (whole ms), and
	 * while reservations are held, every MTS_RESV_REFRESH_MS. */
	double gap_ms = (double)((t[takes / 2] / 1000000u) * 100u);
	if (gap_ms < MTS_RESV_REFRESH_MS)
		gap_ms = MTS_RESV_REFRESH_MS;
	printf("{\"reservations\": %" PRIu32 ", \"record_bytes\": %zu, "
	       "\"encode_ms_median\": %.3f, \"encode_ms_min\": %.3f, "
	       "\"encode_ms_max\": %.3f, \"takes\": %" PRIu32 ", "
	       "\"seal_ms\": %.3f, \"restore_ms\": %.3f, "
	       "\"loop_share\": %.5f}\n",
	       n, len, med_ms, (double)t[0] / 1e6, (double)t[takes - 1] / 1e6,
	       takes, (double)seal / 1e6, (double)restore / 1e6,
	       med_ms / gap_ms);
	free(d);
	free(t);
	reg_close(&b);
	reg_close(&a);
	return 0;
}
