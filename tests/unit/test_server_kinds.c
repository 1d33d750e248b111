/*
 * test_server_kinds.c - kinds and learned sizes: the estimator (quantile
 * of the recent peaks plus the margin, the window, the horizon, evicted
 * runs), admission on learned sizes (no history, a declaration as a
 * ceiling, reserve_learned off), a task's peak recorded at its end from
 * its workers, kinds kept per uid, the caps and their refusal, name
 * checks, the record: a round trip, and corrupt or foreign records
 * refused whole; and profiles: a run's shape recorded, the kind's learned
 * from its runs, and admission that follows it over time.
 */
#include "test_server_fixture.h"

/* A run of `peak` bytes with no length (no profile). */
static void note_run(struct mts_registry *reg, const char *kind, uint32_t uid,
                     uint64_t peak, bool evicted)
{
	struct mts_kind_run run = {.peak = peak, .evicted = evicted};
	mts_kind_note_run(reg, kind, uid, &run);
}

#include <fcntl.h>
#include <sys/stat.h>

#include "mts_metrics.h"

static struct mts_policy pol;

static void stop(void)
{
	fx_stop();
	mts_policy_free(&pol);
}

TestSuite(kinds, .fini = stop, .timeout = 30);

static void start_fleet(uint64_t fleet)
{
	mts_policy_defaults(&pol);
	pol.fleet_limit = fleet;
	fx_start_policy(&pol);
}

/* An Admit of `task` of `kind` asked by `peer` (`until_release`: as
 * `memtally run` asks). */
static Memtally__V1__Response *admit_by(struct mts_peer *peer, uint64_t bytes,
                                        const char *kind, const char *task,
                                        bool until_release)
{
	Memtally__V1__Request req = MEMTALLY__V1__REQUEST__INIT;
	Memtally__V1__Admit a = MEMTALLY__V1__ADMIT__INIT;
	a.bytes = bytes;
	a.group = (char *)"";
	a.task = (char *)(task ? task : "");
	a.kind = (char *)kind;
	a.until_release = until_release;
	req.id = 51;
	req.body_case = MEMTALLY__V1__REQUEST__BODY_ADMIT;
	req.admit = &a;
	return fx_call(peer, &req);
}

static Memtally__V1__Response *admit_kind(uint32_t uid, uint64_t bytes,
                                          const char *kind, const char *task)
{
	struct mts_peer peer = fx_peer(getpid(), uid);
	return admit_by(&peer, bytes, kind, task, false);
}

/* The reservation an Admit of `kind` by `uid` makes, which must be
 * granted; its `sized_by` copied to `why`. */
static uint64_t reserved_for(uint32_t uid, uint64_t bytes, const char *kind,
                             char *why, size_t len)
{
	Memtally__V1__Response *r = admit_kind(uid, bytes, kind, NULL);
	cr_assert_null(r->error, "%s", r->error ? r->error->message : "");
	cr_assert(r->admit_result->admitted, "denied: %s",
	          r->admit_result->reason);
	uint64_t v = r->admit_result->reserved_for_task;
	cr_assert_eq(v, r->admit_result->requested_bytes);
	if (why)
		snprintf(why, len, "%s", r->admit_result->sized_by);
	memtally__v1__response__free_unpacked(r, NULL);
	return v;
}

static uint64_t plus10(uint64_t v)
{
	return v + v / 10;
}

static struct mts_resv *resv_of_task(const char *task);

Test(kinds, p95_of_the_recent_peaks_plus_the_margin)
{
	start_fleet(0);
	uint64_t b;
	char why[256];
	cr_assert_eq(mts_kind_learned(&srv.reg, "xz", &b, why, sizeof(why)),
	             -ENOENT);
	/* 20 runs of 1..20 MiB, in a shuffled order: the nearest rank of
	 * p95 of 20 is the 19th smallest. */
	for (int i = 0; i < 20; i++)
		note_run(&srv.reg, "xz", 1000,
		         (uint64_t)((i * 7) % 20 + 1) * MIB, false);
	cr_assert_eq(
	    mts_kind_learned_for(&srv.reg, "xz", 1000, &b, why, sizeof(why)),
	    0);
	cr_assert_eq(b, plus10(19 * MIB), "learned %llu",
	             (unsigned long long)b);
	cr_assert_str_eq(why, "20.9 MiB: p95 of 20 runs of kind xz + 10%");

	/* The quantile and margin are the policy's, read at each look. */
	srv.reg.policy.kind_quantile_bp = 5000;
	srv.reg.policy.kind_margin_bp = 0;
	cr_assert_eq(mts_kind_learned_for(&srv.reg, "xz", 1000, &b, NULL, 0),
	             0);
	cr_assert_eq(b, 10 * MIB);
}

Test(kinds, window_horizon_and_evicted_runs)
{
	start_fleet(0);
	uint64_t b;
	/* 64 runs of 100 MiB, then 64 of 10 MiB: only the last 64 count. */
	for (int i = 0; i < 64; i++)
		note_run(&srv.reg, "k", 1000, 100 * MIB, false);
	cr_assert_eq(mts_kind_learned_for(&srv.reg, "k", 1000, &b, NULL, 0), 0);
	cr_assert_eq(b, plus10(100 * MIB));
	for (int i = 0; i < 64; i++)
		note_run(&srv.reg, "k", 1000, 10 * MIB, false);
	cr_assert_eq(mts_kind_learned_for(&srv.reg, "k", 1000, &b, NULL, 0), 0);
	cr_assert_eq(b, plus10(10 * MIB));
	struct mts_kind *k = mts_kind_find(&srv.reg, "k", 1000);
	cr_assert_eq(k->runs_total, 128);
	cr_assert_eq(k->nruns, MTS_KIND_RUNS);

	/* A window of 4 runs. */
	srv.reg.policy.kind_window = 4;
	note_run(&srv.reg, "k", 1000, 50 * MIB, false);
	cr_assert_eq(mts_kind_learned_for(&srv.reg, "k", 1000, &b, NULL, 0), 0);
	cr_assert_eq(b, plus10(50 * MIB));

	/* An evicted run counts at 1.5 times its peak. */
	note_run(&srv.reg, "k", 1000, 60 * MIB, true);
	cr_assert_eq(mts_kind_learned_for(&srv.reg, "k", 1000, &b, NULL, 0), 0);
	cr_assert_eq(b, plus10(90 * MIB));
	cr_assert_eq(k->evictions, 1);

	/* Runs older than the horizon are forgotten, and so is a kind all of
	 * whose runs are. */
	uint64_t now_s = mts_now_realtime() / 1000000000u;
	for (uint32_t i = 0; i < k->nruns; i++)
		k->runs[i].end_s = now_s - srv.reg.policy.kind_horizon_s - 1;
	k->est_valid = false;
	cr_assert_eq(mts_kind_learned_for(&srv.reg, "k", 1000, &b, NULL, 0),
	             -ENOENT);
	mts_kinds_age(&srv.reg, now_s);
	cr_assert_null(mts_kind_find(&srv.reg, "k", 1000));
	cr_assert_eq(srv.reg.kinds->n, 0);
}

Test(kinds, a_run_evicted_within_its_size_does_not_raise_it)
{
	start_fleet(0);
	uint64_t b;
	/* An evicted run counts at 1.5 times its peak only past what the
	 * finished runs learn: a run evicted within it was ended for the node's
	 * sake and does not count, or one eviction would raise the size by
	 * half. */
	for (int i = 0; i < 3; i++)
		note_run(&srv.reg, "j", 1000, 100 * MIB, false);
	note_run(&srv.reg, "j", 1000, 105 * MIB, true);
	cr_assert_eq(mts_kind_learned_for(&srv.reg, "j", 1000, &b, NULL, 0), 0);
	cr_assert_eq(b, plus10(100 * MIB));
	cr_assert_eq(mts_kind_find(&srv.reg, "j", 1000)->evictions, 1);
	note_run(&srv.reg, "j", 1000, 111 * MIB, true);
	cr_assert_eq(mts_kind_learned_for(&srv.reg, "j", 1000, &b, NULL, 0), 0);
	cr_assert_eq(b, plus10(111 * MIB + 111 * MIB / 2));
	/* With no finished run, every evicted run counts. */
	note_run(&srv.reg, "e", 1000, 20 * MIB, true);
	cr_assert_eq(mts_kind_learned_for(&srv.reg, "e", 1000, &b, NULL, 0), 0);
	cr_assert_eq(b, plus10(30 * MIB));
}

Test(kinds, a_size_learned_past_all_ever_granted_is_reserved_at_that)
{
	mts_policy_defaults(&pol);
	pol.fleet_limit = 400 * MIB;
	pol.resv_bytes_per_uid = 100 * MIB;
	fx_start_policy(&pol);
	char why[320];
	/* One run evicted at 300 MiB, no finished run: it counts at 1.5
	 * times, 495 MiB with the margin, above the 400 MiB fleet limit. */
	note_run(&srv.reg, "big", 1000, 300 * MIB, true);
	uint64_t b;
	cr_assert_eq(mts_kind_learned_for(&srv.reg, "big", 1000, &b, NULL, 0),
	             0);
	cr_assert_eq(b, plus10(450 * MIB));
	/* Reserved at that size, it would be denied on an empty fleet for
	 * ever, and no run could bring it down: it is reserved at all a
	 * request of this uid is ever granted, held whole: its share of
	 * reserved bytes. */
	uint64_t most = 100 * MIB;
	uint64_t got = reserved_for(1000, 0, "big", why, sizeof(why));
	cr_assert_eq(got, most, "%llu, not %llu: %s", (unsigned long long)got,
	             (unsigned long long)most, why);
	cr_assert(strstr(why, "all this fleet ever grants one request "
	                      "(learned 495 MiB"),
	          "%s", why);
	mts_resv_free_all(&srv.reg);
	mts_resv_sums(&srv.reg);
	/* Root is not held to the per-uid share: the fleet limit. */
	note_run(&srv.reg, "big", 0, 300 * MIB, true);
	cr_assert_eq(reserved_for(0, 0, "big", NULL, 0), 400 * MIB);
}

Test(kinds, a_default_size_past_a_uids_share_is_cut_to_it)
{
	/* default_size is 12.5% of the fleet, 128 MiB; the uid's share of
	 * reserved bytes 64 MiB. Sized at 128 MiB, a kind with no history
	 * was denied for ever and never ran to learn. */
	mts_policy_defaults(&pol);
	pol.fleet_limit = 1024 * MIB;
	pol.resv_bytes_per_uid = 64 * MIB;
	fx_start_policy(&pol);
	char why[320];
	cr_assert_eq(reserved_for(1000, 0, "fresh", why, sizeof(why)), 64 * MIB,
	             "%s", why);
	cr_assert(strstr(why, "cut to all this fleet ever grants one request"),
	          "%s", why);
	/* Root has no share: the default as it is. */
	cr_assert_eq(reserved_for(0, 0, "fresh", NULL, 0), 128 * MIB);
}

Test(kinds, a_task_evicted_before_it_ran_teaches_nothing)
{
	start_fleet(400 * MIB);
	/* Granted, no worker of it yet (a task granted a moment before its
	 * host or its task was evicted): evicted, it is counted as no run,
	 * so its kind learns no size of 0. */
	Memtally__V1__Response *r = admit_kind(1000, 50 * MIB, "fresh", "F1");
	cr_assert(r->admit_result->admitted, "%s", r->admit_result->reason);
	memtally__v1__response__free_unpacked(r, NULL);
	mts_resv_evicted(&srv.reg, resv_of_task("F1"));
	uint64_t b;
	cr_assert_lt(mts_kind_learned_for(&srv.reg, "fresh", 1000, &b, NULL, 0),
	             0, "learned %llu from a task that never ran",
	             (unsigned long long)b);
	cr_assert_eq(mts_kind_find(&srv.reg, "fresh", 1000)->runs_total, 0);
}

Test(kinds, admission_reserves_the_learned_size)
{
	start_fleet(1024 * MIB);
	char why[320];
	/* No history: the default, 12.5% of the fleet limit. */
	cr_assert_eq(reserved_for(1000, 0, "build", why, sizeof(why)),
	             128 * MIB);
	cr_assert_str_eq(
	    why, "128 MiB: kind build has no history ([kinds] default_size)");
	/* No history, a declaration: the declaration. */
	cr_assert_eq(reserved_for(1000, 300 * MIB, "build", why, sizeof(why)),
	             300 * MIB);
	/* Learned: what it is reserved, declared or not. */
	for (int i = 0; i < 10; i++)
		note_run(&srv.reg, "build", 1000, 40 * MIB, false);
	cr_assert_eq(reserved_for(1000, 0, "build", why, sizeof(why)),
	             plus10(40 * MIB));
	cr_assert_str_eq(why, "44 MiB: p95 of 10 runs of kind build + 10%");
	cr_assert_eq(reserved_for(1000, 300 * MIB, "build", NULL, 0),
	             plus10(40 * MIB));
	/* The reservation keeps the declaration beside the size. */
	bool seen = false;
	for (uint32_t i = 0; i < srv.reg.adm->nresv; i++) {
		const struct mts_resv *r = srv.reg.adm->resv[i];
		if (r->declared == 300 * MIB && r->bytes == plus10(40 * MIB))
			seen = true;
	}
	cr_assert(seen, "no reservation of 44 MiB declared 300 MiB");
	/* reserve_learned off: a declaration is reserved as declared. */
	srv.reg.policy.kind_reserve_learned = false;
	cr_assert_eq(reserved_for(1000, 300 * MIB, "build", why, sizeof(why)),
	             300 * MIB);
	cr_assert(strstr(why, "reserve_learned"), "%s", why);
	/* Without a kind nothing changes: bytes 0 is invalid. */
	fx_expect_error(fx_admit(1000, 0, "", "", 0),
	                MEMTALLY__V1__ERROR_CODE__ERROR_INVALID_REQUEST);
}

Test(kinds, a_tasks_peak_is_recorded_at_its_end)
{
	start_fleet(1024 * MIB);
	Memtally__V1__Response *r = admit_kind(1000, 0, "etl", "T1");
	cr_assert(r->admit_result->admitted);
	memtally__v1__response__free_unpacked(r, NULL);
	pid_t a = fx_spawn(), b = fx_spawn();
	uint32_t sa = fx_register(a, "", "T1");
	uint32_t sb = fx_register(b, "", "T1");
	/* The tree's peak is the largest sum at a tick: 30 + 20, not the
	 * sum of each worker's own peak (30 + 45). */
	fx_write(sa, 30 * MIB);
	fx_write(sb, 20 * MIB);
	mts_core_tick(&srv.reg);
	fx_write(sa, 1 * MIB);
	fx_write(sb, 45 * MIB);
	mts_core_tick(&srv.reg);
	cr_assert_eq(mts_kind_find(&srv.reg, "etl", 1000)->nruns, 0);
	fx_kill(a);
	fx_kill(b);
	mts_core_tick(&srv.reg);
	cr_assert_eq(srv.reg.adm->nresv, 0);
	struct mts_kind *k = mts_kind_find(&srv.reg, "etl", 1000);
	cr_assert_not_null(k);
	cr_assert_eq(k->nruns, 1);
	cr_assert_eq(k->runs[0].peak, 50 * MIB);
	cr_assert_eq(k->outstanding, 0);

	/* A reservation that expires with no worker teaches nothing. */
	r = admit_kind(1000, 0, "etl", "T2");
	memtally__v1__response__free_unpacked(r, NULL);
	mts_resv_tick(&srv.reg, mts_now_monotonic() + 3600000000000ull);
	cr_assert_eq(srv.reg.adm->nresv, 0);
	cr_assert_eq(k->nruns, 1);
}

/* A restored reservation that a worker had taken over, whose task's
 * workers died while no server ran, ends at the first tick and teaches
 * its kind nothing: when it ended, and at what, is unknown. One whose
 * worker is there is a run as any other. */
Test(kinds, a_run_ended_while_no_server_watched_teaches_nothing)
{
	start_fleet(1024 * MIB);
	Memtally__V1__Response *r = admit_kind(1000, 0, "etl", "T1");
	cr_assert(r->admit_result->admitted);
	memtally__v1__response__free_unpacked(r, NULL);
	uint32_t sa = fx_register(fx_spawn(), "", "T1");
	fx_write(sa, 30 * MIB);
	mts_core_tick(&srv.reg);
	cr_assert(srv.reg.adm->resv[0]->taken_over);
	unsigned char *d;
	size_t len;
	cr_assert_eq(mts_resv_encode(&srv.reg, &d, &len), 0);
	mts_record_seal(d, len);
	fx_stop(); /* its worker with it */
	mts_policy_free(&pol);

	start_fleet(1024 * MIB);
	uint32_t kept, dropped;
	cr_assert_eq(mts_resv_restore(&srv.reg, d, len, true, &kept, &dropped),
	             0);
	cr_assert_eq(kept, 1);
	mts_core_tick(&srv.reg);
	cr_assert_eq(srv.reg.adm->nresv, 0);
	struct mts_kind *k = mts_kind_find(&srv.reg, "etl", 1000);
	cr_assert(!k || !k->nruns, "a run that ended unseen was learned");
	fx_stop();
	mts_policy_free(&pol);

	start_fleet(1024 * MIB);
	cr_assert_eq(mts_resv_restore(&srv.reg, d, len, true, &kept, &dropped),
	             0);
	pid_t b = fx_spawn();
	uint32_t sb = fx_register(b, "", "T1");
	fx_write(sb, 40 * MIB);
	mts_core_tick(&srv.reg);
	cr_assert_eq(srv.reg.adm->nresv, 1);
	fx_kill(b);
	mts_core_tick(&srv.reg);
	cr_assert_eq(srv.reg.adm->nresv, 0);
	k = mts_kind_find(&srv.reg, "etl", 1000);
	cr_assert_not_null(k);
	cr_assert_eq(k->nruns, 1);
	cr_assert_eq(k->runs[0].peak, 40 * MIB);
	free(d);
}

Test(kinds, a_claim_below_the_kernels_figure_does_not_shrink_its_kind)
{
	/* An untrusted worker claims 1 MiB while the kernel sees it hold
	 * 64: its kind learns 64, as the guard and the fleet count it. */
	start_fleet(1024 * MIB);
	Memtally__V1__Response *r = admit_kind(2000, 10 * MIB, "low", "T");
	cr_assert(r->admit_result->admitted);
	memtally__v1__response__free_unpacked(r, NULL);
	pid_t w = fx_spawn();
	fx_write(fx_register_as(w, 2000, "", "T"), 1 * MIB);
	struct mts_proc *p = mts_find_pid(&srv.reg, (uint32_t)w);
	cr_assert(p && p->untrusted);
	for (int i = 0; i < 3; i++) {
		p->vouch.kernel = 64 * MIB; /* what a sweep reads */
		p->vouch.kernel_ns = mts_now_monotonic();
		mts_core_tick(&srv.reg);
	}
	fx_kill(w);
	mts_core_tick(&srv.reg);
	struct mts_kind *k = mts_kind_find(&srv.reg, "low", 2000);
	cr_assert_not_null(k);
	cr_assert_eq(k->nruns, 1);
	cr_assert_eq(k->runs[0].peak, 64 * MIB, "%llu",
	             (unsigned long long)k->runs[0].peak);
}

Test(kinds, kept_per_uid)
{
	start_fleet(1024 * MIB);
	for (int i = 0; i < 5; i++) {
		note_run(&srv.reg, "xz", 1000, 10 * MIB, false);
		/* Another uid runs "xz" huge: it sizes its own, not ours. */
		note_run(&srv.reg, "xz", 1001, UINT64_C(1) << 49, false);
	}
	cr_assert_eq(reserved_for(1000, 0, "xz", NULL, 0), plus10(10 * MIB));
	uint64_t b;
	cr_assert_eq(mts_kind_learned_for(&srv.reg, "xz", 1001, &b, NULL, 0),
	             0);
	cr_assert_eq(b, plus10(UINT64_C(1) << 49));
	/* Without a uid, the cautious (largest) one. */
	cr_assert_eq(mts_kind_learned(&srv.reg, "xz", &b, NULL, 0), 0);
	cr_assert_eq(b, plus10(UINT64_C(1) << 49));
}

Test(kinds, caps_refuse_new_kinds_and_drop_nobodys)
{
	start_fleet(1024 * MIB);
	srv.reg.policy.kinds_per_uid = 2;
	srv.reg.policy.kinds_max = 3;
	reserved_for(1001, MIB, "a", NULL, 0);
	reserved_for(1001, MIB, "b", NULL, 0);
	Memtally__V1__Response *r = admit_kind(1001, MIB, "c", NULL);
	cr_assert_null(r->error);
	cr_assert_not(r->admit_result->admitted);
	cr_assert_str_eq(r->admit_result->limit_scope, "uid:1001");
	cr_assert(strstr(r->admit_result->reason, "max_kinds_per_uid = 2"),
	          "%s", r->admit_result->reason);
	memtally__v1__response__free_unpacked(r, NULL);
	cr_assert_eq(srv.reg.adm->stats.denials[MTS_DENY_KIND_CAP], 1);
	/* Its existing kinds still admit. */
	reserved_for(1001, MIB, "a", NULL, 0);
	/* The server's cap: one more kind, of another uid, then none. */
	reserved_for(1002, MIB, "a", NULL, 0);
	r = admit_kind(1003, MIB, "z", NULL);
	cr_assert_not(r->admit_result->admitted);
	cr_assert_str_eq(r->admit_result->limit_scope, "kinds");
	memtally__v1__response__free_unpacked(r, NULL);
	/* Nobody's kind was dropped to make room. */
	cr_assert_not_null(mts_kind_find(&srv.reg, "a", 1001));
	cr_assert_not_null(mts_kind_find(&srv.reg, "b", 1001));
	cr_assert_not_null(mts_kind_find(&srv.reg, "a", 1002));
	cr_assert_eq(srv.reg.kinds->n, 3);
	/* A run of a kind that cannot be kept is counted, not kept. */
	note_run(&srv.reg, "zz", 1003, MIB, false);
	cr_assert_null(mts_kind_find(&srv.reg, "zz", 1003));
	cr_assert_eq(srv.reg.kinds->runs_dropped, 1);
}

Test(kinds, names_checked_like_groups)
{
	start_fleet(1024 * MIB);
	char longname[MTS_NAME_MAX + 2];
	memset(longname, 'k', sizeof(longname) - 1);
	longname[sizeof(longname) - 1] = 0;
	const char *bad[] = {"a\nb", "a\x1b[31m",
	                     "\xe2\x80\xae"
	                     "evil",
	                     "\xff\xfe", longname};
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++)
		fx_expect_error(
		    admit_kind(1000, MIB, bad[i], NULL),
		    MEMTALLY__V1__ERROR_CODE__ERROR_INVALID_REQUEST);
	note_run(&srv.reg, "a\nb", 1000, MIB, false);
	cr_assert_eq(srv.reg.kinds->n, 0);
	/* UTF-8 that is not hostile is a name. */
	reserved_for(1000, MIB, "größe-ß", NULL, 0);
}

static char path[256];

static void fill(void)
{
	for (int i = 0; i < 70; i++)
		note_run(&srv.reg, "xz", 1000, (uint64_t)(i + 1) * MIB,
		         i % 9 == 0);
	note_run(&srv.reg, "gcc", 1001, 7 * MIB, false);
	snprintf(path, sizeof(path), "/tmp/mt-kinds-%d.kinds", (int)getpid());
	unlink(path);
	cr_assert_eq(mts_kinds_save(&srv.reg, path), 0);
}

Test(kinds, record_round_trip)
{
	start_fleet(0);
	fill();
	uint64_t xz, gcc, b;
	cr_assert_eq(mts_kind_learned_for(&srv.reg, "xz", 1000, &xz, NULL, 0),
	             0);
	cr_assert_eq(mts_kind_learned_for(&srv.reg, "gcc", 1001, &gcc, NULL, 0),
	             0);
	struct stat st;
	cr_assert_eq(stat(path, &st), 0);
	cr_assert_eq(st.st_mode & 0777, 0600);
	mts_kinds_free(&srv.reg);
	cr_assert_eq(mts_kind_learned(&srv.reg, "xz", &b, NULL, 0), -ENOENT);
	cr_assert_eq(mts_kinds_load(&srv.reg, path), 0);
	cr_assert_eq(mts_kind_learned_for(&srv.reg, "xz", 1000, &b, NULL, 0),
	             0);
	cr_assert_eq(b, xz);
	cr_assert_eq(mts_kind_learned_for(&srv.reg, "gcc", 1001, &b, NULL, 0),
	             0);
	cr_assert_eq(b, gcc);
	struct mts_kind *k = mts_kind_find(&srv.reg, "xz", 1000);
	cr_assert_eq(k->runs_total, 70);
	cr_assert_eq(k->evictions, 8);
	/* The newest run comes back newest. */
	cr_assert_eq(
	    k->runs[(k->head + MTS_KIND_RUNS - 1) % MTS_KIND_RUNS].peak,
	    70 * MIB);
	/* And a run after the load goes after it. */
	note_run(&srv.reg, "xz", 1000, 3 * MIB, false);
	cr_assert_eq(
	    k->runs[(k->head + MTS_KIND_RUNS - 1) % MTS_KIND_RUNS].peak,
	    3 * MIB);
	unlink(path);
}

Test(kinds, a_run_recorded_ahead_of_the_clock_ages_from_now)
{
	start_fleet(0);
	note_run(&srv.reg, "ahead", 1000, 5 * MIB, false);
	uint64_t now_s = mts_now_realtime() / 1000000000u;
	/* Written by a memtallyd whose clock ran a year ahead. */
	mts_kind_find(&srv.reg, "ahead", 1000)->runs[0].end_s =
	    now_s + 365 * 86400;
	snprintf(path, sizeof(path), "/tmp/mt-kinds-%d.kinds", (int)getpid());
	unlink(path);
	cr_assert_eq(mts_kinds_save(&srv.reg, path), 0);
	mts_kinds_free(&srv.reg);
	cr_assert_eq(mts_kinds_load(&srv.reg, path), 0);
	uint64_t end = mts_kind_find(&srv.reg, "ahead", 1000)->runs[0].end_s;
	cr_assert(end >= now_s && end <= now_s + 60,
	          "ends %llu s after now: would outlive the horizon",
	          (unsigned long long)(end - now_s));
	unlink(path);
}

Test(kinds, a_record_past_lowered_caps_keeps_the_latest)
{
	start_fleet(0);
	uint64_t now_s = mts_now_realtime() / 1000000000u;
	/* uid 0 is an admin, exempt from the per-uid cap; 1000 is not. */
	const struct {
		const char *name;
		uint32_t uid;
		uint64_t ago;
	} run[] = {{"x", 0, 10},
	           {"y", 0, 20},
	           {"z", 0, 30},
	           {"a", 1000, 60},
	           {"b", 1000, 5},
	           {"c", 1000, 15},
	           /* Unidentified TCP peers', each made with the token:
	            * exempt as an admin's. */
	           {"t1", MTS_UID_TCP, 1},
	           {"t2", MTS_UID_TCP, 2},
	           {"t3", MTS_UID_TCP, 3}};
	for (int i = 0; i < 9; i++) {
		note_run(&srv.reg, run[i].name, run[i].uid, MIB, false);
		mts_kind_find(&srv.reg, run[i].name, run[i].uid)
		    ->runs[0]
		    .end_s = now_s - run[i].ago;
	}
	snprintf(path, sizeof(path), "/tmp/mt-kinds-%d.kinds", (int)getpid());
	unlink(path);
	cr_assert_eq(mts_kinds_save(&srv.reg, path), 0);
	mts_kinds_free(&srv.reg);
	/* Restarted with smaller caps. */
	srv.reg.policy.kinds_per_uid = 2;
	srv.reg.policy.kinds_max = 7;
	cr_assert_eq(mts_kinds_load(&srv.reg, path), 0);
	cr_assert_eq(srv.reg.kinds->n, 7);
	cr_assert(srv.reg.kinds->dirty, "the trimmed record is written back");
	/* Newest first: t1, t2, t3 (all three), b, x, c, y; then z (past
	 * max_kinds) and a (past uid 1000's two). */
	cr_assert_eq(mts_uid_count_get(&srv.reg.kinds->per_uid, MTS_UID_TCP),
	             3);
	cr_assert_not_null(mts_kind_find(&srv.reg, "b", 1000));
	cr_assert_not_null(mts_kind_find(&srv.reg, "c", 1000));
	cr_assert_not_null(mts_kind_find(&srv.reg, "x", 0));
	cr_assert_not_null(mts_kind_find(&srv.reg, "y", 0));
	cr_assert_null(mts_kind_find(&srv.reg, "z", 0));
	cr_assert_null(mts_kind_find(&srv.reg, "a", 1000));
	cr_assert_eq(mts_uid_count_get(&srv.reg.kinds->per_uid, 1000), 2);
	/* Under caps that hold it, nothing goes. */
	mts_kinds_free(&srv.reg);
	srv.reg.policy.kinds_per_uid = 3;
	srv.reg.policy.kinds_max = 9;
	cr_assert_eq(mts_kinds_load(&srv.reg, path), 0);
	cr_assert_eq(srv.reg.kinds->n, 9);
	cr_assert(!srv.reg.kinds->dirty);
	unlink(path);
}

Test(kinds, a_reload_lowering_the_caps_trims_but_never_a_named_kind)
{
	start_fleet(0);
	uint64_t now_s = mts_now_realtime() / 1000000000u;
	/* uid 1000's kinds, newest first: b, c, a, d. */
	const struct {
		const char *name;
		uint64_t ago;
	} run[] = {{"a", 30}, {"b", 5}, {"c", 15}, {"d", 60}};
	for (int i = 0; i < 4; i++) {
		note_run(&srv.reg, run[i].name, 1000, MIB, false);
		mts_kind_find(&srv.reg, run[i].name, 1000)->runs[0].end_s =
		    now_s - run[i].ago;
	}
	/* The oldest, d, is named by a reservation now. */
	Memtally__V1__Response *r = admit_kind(1000, 0, "d", "Td");
	cr_assert(r->admit_result->admitted, "%s", r->admit_result->reason);
	memtally__v1__response__free_unpacked(r, NULL);
	srv.reg.kinds->dirty = false;

	/* Reloaded with two kinds per uid: d stays (its reservation points
	 * at it) and takes one place, b the other; c and a go. */
	mts_policy_defaults(&pol);
	pol.kinds_per_uid = 2;
	cr_assert_eq(mts_server_apply_policy(&srv, &pol), 0);
	cr_assert_eq(srv.reg.kinds->n, 2);
	cr_assert_not_null(mts_kind_find(&srv.reg, "d", 1000));
	cr_assert_not_null(mts_kind_find(&srv.reg, "b", 1000));
	cr_assert_null(mts_kind_find(&srv.reg, "c", 1000));
	cr_assert_null(mts_kind_find(&srv.reg, "a", 1000));
	cr_assert_eq(mts_uid_count_get(&srv.reg.kinds->per_uid, 1000), 2);
	cr_assert(srv.reg.kinds->dirty, "the trimmed record is written");
	/* The cap holds at once: a new kind is refused. */
	r = admit_kind(1000, MIB, "e", "Te");
	cr_assert_not(r->admit_result->admitted);
	memtally__v1__response__free_unpacked(r, NULL);
	/* d's reservation ends as any other and its run is learned. */
	struct mts_peer root = fx_peer(getpid(), 0);
	uint64_t freed;
	char id[MTS_RESV_ID_LEN + 1];
	memcpy(id, resv_of_task("Td")->id, sizeof(id));
	cr_assert_eq(mts_release(&srv.reg, &root, id, "", &freed), 0);
	cr_assert_not_null(mts_kind_find(&srv.reg, "d", 1000));

	/* Even a cap below what reservations name keeps them all. */
	r = admit_kind(1000, 0, "b", "Tb");
	cr_assert(r->admit_result->admitted, "%s", r->admit_result->reason);
	memtally__v1__response__free_unpacked(r, NULL);
	r = admit_kind(1000, 0, "d", "Td2");
	cr_assert(r->admit_result->admitted, "%s", r->admit_result->reason);
	memtally__v1__response__free_unpacked(r, NULL);
	pol.kinds_per_uid = 1;
	cr_assert_eq(mts_server_apply_policy(&srv, &pol), 0);
	cr_assert_eq(srv.reg.kinds->n, 2);
}

Test(kinds, a_reload_taking_admin_uid_away_trims_that_uids_kinds)
{
	/* uid 1000 is admin_uid, so max_kinds_per_uid does not hold for it:
	 * four kinds of its own, unmarked (run before it was made admin), stay
	 * under a cap of 2. */
	mts_policy_defaults(&pol);
	pol.has_admin_uid = true;
	pol.admin_uid = 1000;
	pol.kinds_per_uid = 2;
	fx_start_policy(&pol);
	uint64_t now_s = mts_now_realtime() / 1000000000u;
	const char *names[] = {"a", "b", "c", "d"}; /* newest last */
	for (int i = 0; i < 4; i++) {
		note_run(&srv.reg, names[i], 1000, MIB, false);
		mts_kind_find(&srv.reg, names[i], 1000)->runs[0].end_s =
		    now_s - 40 + (uint64_t)i * 10;
	}
	/* A reload that keeps it admin trims nothing. */
	cr_assert_eq(mts_server_apply_policy(&srv, &pol), 0);
	cr_assert_eq(srv.reg.kinds->n, 4);
	/* One that takes the right away holds the cap at once: the two most
	 * recently run stay. */
	pol.has_admin_uid = false;
	cr_assert_eq(mts_server_apply_policy(&srv, &pol), 0);
	cr_assert_eq(srv.reg.kinds->n, 2);
	cr_assert_not_null(mts_kind_find(&srv.reg, "d", 1000));
	cr_assert_not_null(mts_kind_find(&srv.reg, "c", 1000));
	cr_assert_null(mts_kind_find(&srv.reg, "b", 1000));
	cr_assert_eq(mts_uid_count_get(&srv.reg.kinds->per_uid, 1000), 2);
}

Test(kinds, those_a_request_with_the_token_made_past_the_cap_are_kept)
{
	/* A scheduler running as uid 1000 and holding the token may keep
	 * more kinds than max_kinds_per_uid: neither a restart nor a reload
	 * lowering the cap takes them for kinds made past it. */
	mts_policy_defaults(&pol);
	pol.kinds_per_uid = 2;
	pol.tcp_token = strdup("kinds-token-0123456789");
	fx_start_policy(&pol);
	struct mts_peer root = fx_peer(getpid(), 0);
	for (int i = 0; i < 3; i++) {
		char kind[8], task[8];
		snprintf(kind, sizeof(kind), "t%d", i);
		snprintf(task, sizeof(task), "T%d", i);
		Memtally__V1__Request req = MEMTALLY__V1__REQUEST__INIT;
		Memtally__V1__Admit a = MEMTALLY__V1__ADMIT__INIT;
		a.bytes = MIB;
		a.group = (char *)"";
		a.task = task;
		a.kind = kind;
		req.token = (char *)"kinds-token-0123456789";
		req.body_case = MEMTALLY__V1__REQUEST__BODY_ADMIT;
		req.admit = &a;
		struct mts_peer peer = fx_peer(getpid(), 1000);
		Memtally__V1__Response *r = fx_call(&peer, &req);
		cr_assert(r->admit_result->admitted, "%s: %s", kind,
		          r->admit_result->reason);
		memtally__v1__response__free_unpacked(r, NULL);
		note_run(&srv.reg, kind, 1000, MIB, false);
		uint64_t freed;
		char id[MTS_RESV_ID_LEN + 1];
		memcpy(id, resv_of_task(task)->id, sizeof(id));
		cr_assert_eq(mts_release(&srv.reg, &root, id, "", &freed), 0);
	}
	/* The three made with the token do not count against the uid: it
	 * makes its two without it. */
	cr_assert_eq(mts_uid_count_get(&srv.reg.kinds->per_uid, 1000), 0);
	note_run(&srv.reg, "n0", 1000, MIB, false);
	note_run(&srv.reg, "n1", 1000, MIB, false);
	cr_assert(mts_kind_find(&srv.reg, "t0", 1000)->capless);
	cr_assert_not(mts_kind_find(&srv.reg, "n0", 1000)->capless);
	cr_assert_eq(srv.reg.kinds->n, 5);
	/* Then it is at its cap. */
	cr_assert_eq(mts_uid_count_get(&srv.reg.kinds->per_uid, 1000), 2);
	Memtally__V1__Response *r = admit_kind(1000, MIB, "n2", "Tn2");
	cr_assert_not(r->admit_result->admitted);
	memtally__v1__response__free_unpacked(r, NULL);

	/* Restarted under the same caps: all five. */
	snprintf(path, sizeof(path), "/tmp/mt-kinds-%d.kinds", (int)getpid());
	unlink(path);
	cr_assert_eq(mts_kinds_save(&srv.reg, path), 0);
	mts_kinds_free(&srv.reg);
	cr_assert_eq(mts_kinds_load(&srv.reg, path), 0);
	unlink(path);
	cr_assert_eq(srv.reg.kinds->n, 5);
	cr_assert(mts_kind_find(&srv.reg, "t2", 1000)->capless);

	/* A reload lowering the cap to one: the three made with the token
	 * and one of the others. */
	struct mts_policy next;
	mts_policy_defaults(&next);
	next.kinds_per_uid = 1;
	cr_assert_eq(mts_server_apply_policy(&srv, &next), 0);
	cr_assert_eq(srv.reg.kinds->n, 4);
	for (int i = 0; i < 3; i++) {
		char kind[8];
		snprintf(kind, sizeof(kind), "t%d", i);
		cr_assert_not_null(mts_kind_find(&srv.reg, kind, 1000), "%s",
		                   kind);
	}
	mts_policy_free(&next);
}

/* Write byte `v` at `off` of the record. */
static void poke(off_t off, uint8_t v)
{
	int fd = open(path, O_WRONLY);
	cr_assert_geq(fd, 0);
	cr_assert_eq(pwrite(fd, &v, 1, off), 1);
	close(fd);
}

Test(kinds, corrupt_or_foreign_records_refused_whole)
{
	start_fleet(0);
	fill();
	mts_kinds_free(&srv.reg);
	uint64_t b;
	/* A flipped byte in a run: the checksum. The record stays for a
	 * restart to read again, and the first save moves it aside rather
	 * than overwrite it. */
	char aside[300];
	snprintf(aside, sizeof(aside), "%s.refused", path);
	unlink(aside);
	poke(200, 0x5a);
	struct stat st0, st;
	cr_assert_eq(stat(path, &st0), 0);
	cr_assert_eq(mts_kinds_load(&srv.reg, path), -EBADMSG);
	cr_assert_eq(srv.reg.kinds->n, 0);
	cr_assert_eq(mts_kind_learned(&srv.reg, "gcc", &b, NULL, 0), -ENOENT);
	cr_assert_eq(stat(path, &st), 0, "the refused record moved at load");
	cr_assert_eq(st.st_ino, st0.st_ino);
	note_run(&srv.reg, "zstd", 1000, 9 * MIB, false);
	cr_assert_eq(mts_kinds_save(&srv.reg, path), 0);
	cr_assert_eq(stat(aside, &st), 0, "the refused record not kept");
	cr_assert_eq(st.st_ino, st0.st_ino, "another file kept");
	/* Once: the next save replaces the new record, as always. */
	cr_assert_eq(mts_kinds_save(&srv.reg, path), 0);
	cr_assert_eq(stat(aside, &st), 0);
	cr_assert_eq(st.st_ino, st0.st_ino, "the kept record replaced");
	mts_kinds_free(&srv.reg);
	/* Another magic. */
	fill();
	mts_kinds_free(&srv.reg);
	poke(0, 'X');
	cr_assert_eq(mts_kinds_load(&srv.reg, path), -EBADMSG);
	cr_assert_eq(srv.reg.kinds->n, 0);
	/* Truncated. */
	fill();
	mts_kinds_free(&srv.reg);
	cr_assert_eq(truncate(path, 100), 0);
	cr_assert_eq(mts_kinds_load(&srv.reg, path), -EBADMSG);
	/* Writable by others: not ours to believe, nor to keep. */
	fill();
	mts_kinds_free(&srv.reg);
	cr_assert_eq(chmod(path, 0666), 0);
	cr_assert_eq(mts_kinds_load(&srv.reg, path), -EBADMSG);
	cr_assert_eq(access(path, F_OK), 0, "a file not ours moved");
	/* Another user's. */
	cr_assert_eq(chmod(path, 0600), 0);
	cr_assert_eq(chown(path, 65534, 65534), 0);
	cr_assert_eq(mts_kinds_load(&srv.reg, path), -EBADMSG);
	/* A symlink to a good record. */
	fill();
	mts_kinds_free(&srv.reg);
	char link[300];
	snprintf(link, sizeof(link), "%s.link", path);
	unlink(link);
	cr_assert_eq(symlink(path, link), 0);
	cr_assert_eq(mts_kinds_load(&srv.reg, link), -EBADMSG);
	cr_assert_eq(srv.reg.kinds->n, 0);
	cr_assert_eq(srv.reg.kinds->load_refused, 1);
	/* The good record itself still loads. */
	cr_assert_eq(mts_kinds_load(&srv.reg, path), 0);
	cr_assert_eq(srv.reg.kinds->n, 2);
	unlink(link);
	unlink(path);
	cr_assert_eq(mts_kinds_load(&srv.reg, path), -ENOENT);
	/* A FIFO in its place (a shared directory): refused at once, not
	 * waited on for a writer. */
	cr_assert_eq(mkfifo(path, 0600), 0);
	cr_assert_eq(mts_kinds_load(&srv.reg, path), -EBADMSG);
	unlink(path);
	unlink(aside);
}

static char *render(void)
{
	struct mts_buf b = {0};
	cr_assert_eq(mts_metrics_render(&srv.reg, NULL, NULL, &b), 0);
	cr_assert_eq(mts_buf_reserve(&b, 1), 0);
	b.data[b.len] = '\0';
	return (char *)b.data;
}

Test(kinds, metrics_bounded_and_per_kind_only_when_asked)
{
	start_fleet(0);
	/* No kind yet: no per-kind family at all, not one without samples. */
	srv.reg.policy.metrics_per_kind = true;
	char *t0 = render();
	cr_assert(strstr(t0, "\nmemtally_kinds 0\n"), "%s", t0);
	cr_assert_null(strstr(t0, "memtally_kind_learned_bytes"), "%s", t0);
	cr_assert_null(strstr(t0, "memtally_kind_guard_evictions"), "%s", t0);
	free(t0);
	srv.reg.policy.metrics_per_kind = false;
	for (int i = 0; i < 5; i++) {
		note_run(&srv.reg, "small", 1000, 10 * MIB, false);
		note_run(&srv.reg, "big", 1001, 100 * MIB, i == 0);
	}
	char *t = render();
	cr_assert(strstr(t, "\nmemtally_kinds 2\n"), "%s", t);
	cr_assert(strstr(t, "\nmemtally_kind_runs_total 10\n"));
	cr_assert(strstr(t, "\nmemtally_kind_evictions_total 1\n"));
	cr_assert_null(strstr(t, "kind=\""), "per-kind series by default");
	free(t);
	srv.reg.policy.metrics_per_kind = true;
	srv.reg.policy.metrics_max_groups = 1;
	t = render();
	/* One series per family: the largest learned size. */
	char want[128];
	snprintf(want, sizeof(want),
	         "\nmemtally_kind_learned_bytes{kind=\"big\",uid=\"1001\"} "
	         "%llu\n",
	         (unsigned long long)plus10(100 * MIB));
	cr_assert(strstr(t, want), "%s", t);
	cr_assert_null(strstr(t, "kind=\"small\""), "%s", t);
	/* Not the family of memtally_kind_runs_total (an OpenMetrics
	 * reader would read one family twice). */
	cr_assert(strstr(t, "\n# TYPE memtally_kind_learned_runs gauge\n"
	                    "memtally_kind_learned_runs{kind=\"big\","),
	          "%s", t);
	cr_assert_null(strstr(t, "# TYPE memtally_kind_runs gauge"), "%s", t);
	snprintf(want, sizeof(want),
	         "\n# TYPE memtally_kind_guard_evictions_total counter\n"
	         "memtally_kind_guard_evictions_total{kind=\"big\","
	         "uid=\"1001\"} 1\n");
	cr_assert(strstr(t, want), "%s", t);
	free(t);
}

/* ---- profiles --------------------------------------------------------------
 */

/* A run of `peak` bytes over `dur_ms` that leaks: its step j holds
 * (j + 1) / 8 of its peak. */
static void note_leak(const char *kind, uint64_t peak, uint32_t dur_ms,
                      bool evicted)
{
	struct mts_kind_run run = {
	    .peak = peak, .dur_ms = dur_ms, .evicted = evicted};
	for (uint32_t j = 0; j < MTS_KIND_STEPS; j++)
		run.steps[j] =
		    (uint16_t)(MTS_KIND_STEP_ONE * (j + 1) / MTS_KIND_STEPS);
	mts_kind_note_run(&srv.reg, kind, 1000, &run);
}

Test(kinds, the_profile_is_the_quantile_of_the_runs_shapes)
{
	start_fleet(1024 * MIB);
	for (int i = 0; i < 10; i++)
		note_leak("leak", 80 * MIB, 1000, false);
	/* Runs without a length (an older record's) size it, but give it
	 * no shape. */
	note_run(&srv.reg, "leak", 1000, 80 * MIB, false);
	struct mts_kind_profile p;
	cr_assert_eq(mts_kind_profile_for(&srv.reg, "leak", 1000, &p), 0);
	cr_assert_eq(p.mean_ms, 1000, "length: the mean, got %u", p.mean_ms);
	cr_assert_eq(p.bytes[7], 88 * MIB);
	uint64_t want0 = 88 * MIB * (MTS_KIND_STEP_ONE / 8) / MTS_KIND_STEP_ONE;
	cr_assert_eq(p.bytes[0], want0);
	for (uint32_t j = 1; j < MTS_KIND_STEPS; j++)
		cr_assert_gt(p.bytes[j], p.bytes[j - 1]);
	/* The mean: what the runs held, no margin. */
	cr_assert_eq(p.mean[7], 80 * MIB);
	cr_assert_eq(p.mean[0],
	             80 * MIB * (MTS_KIND_STEP_ONE / 8) / MTS_KIND_STEP_ONE);
	/* An evicted run raises the size (x 1.5) but not the shape or the
	 * length: it was cut short. The quantile is p95 of 12 runs. */
	note_leak("leak", 200 * MIB, 100, true);
	cr_assert_eq(mts_kind_profile_for(&srv.reg, "leak", 1000, &p), 0);
	cr_assert_eq(p.mean_ms, 1000);
	cr_assert_eq(p.bytes[7], 330 * MIB);
	cr_assert_eq(p.mean[7], 80 * MIB);
	/* No run with a length: no profile. */
	note_run(&srv.reg, "flat", 1000, 80 * MIB, false);
	cr_assert_eq(mts_kind_profile_for(&srv.reg, "flat", 1000, &p), -ENOENT);
	/* The record keeps lengths and shapes. */
	snprintf(path, sizeof(path), "/tmp/mt-kinds-%d.kinds", (int)getpid());
	cr_assert_eq(mts_kinds_save(&srv.reg, path), 0);
	mts_kinds_free(&srv.reg);
	cr_assert_eq(mts_kinds_load(&srv.reg, path), 0);
	struct mts_kind_profile q;
	cr_assert_eq(mts_kind_profile_for(&srv.reg, "leak", 1000, &q), 0);
	cr_assert_eq(memcmp(&p, &q, sizeof(p)), 0);
	unlink(path);
}

static uint64_t fnv1a(uint64_t h, const void *p, size_t n)
{
	for (size_t i = 0; i < n; i++) {
		h ^= ((const unsigned char *)p)[i];
		h *= UINT64_C(0x100000001b3);
	}
	return h;
}

Test(kinds, a_version_1_record_still_loads)
{
	/* The record before profiles: runs of 24 bytes. An upgrade keeps
	 * the learned sizes; the runs have no length. */
	start_fleet(0);
	struct {
		uint64_t magic;
		uint32_t version, count;
		uint64_t payload, checksum;
	} h = {UINT64_C(0x31646e694b544d4d), 1, 1, 0, 0};
	struct {
		uint32_t uid, name_len, nruns, spare;
		uint64_t runs_total, evictions;
	} k = {1000, 2, 2, 0, 2, 0};
	uint64_t runs[2][3] = {{40 * MIB, 1700000000, 0},
	                       {50 * MIB, 1700000001, 0}};
	uint64_t now = mts_now_realtime() / 1000000000u;
	runs[0][1] = runs[1][1] = now;
	unsigned char payload[sizeof(k) + 2 + sizeof(runs)];
	memcpy(payload, &k, sizeof(k));
	memcpy(payload + sizeof(k), "xz", 2);
	memcpy(payload + sizeof(k) + 2, runs, sizeof(runs));
	h.payload = sizeof(payload);
	h.checksum =
	    fnv1a(UINT64_C(0xcbf29ce484222325), payload, sizeof(payload));
	snprintf(path, sizeof(path), "/tmp/mt-kinds-%d.kinds", (int)getpid());
	unlink(path);
	int fd = open(path, O_WRONLY | O_CREAT | O_EXCL, 0600);
	cr_assert_geq(fd, 0);
	cr_assert_eq(write(fd, &h, sizeof(h)), (ssize_t)sizeof(h));
	cr_assert_eq(write(fd, payload, sizeof(payload)),
	             (ssize_t)sizeof(payload));
	close(fd);
	cr_assert_eq(mts_kinds_load(&srv.reg, path), 0);
	uint64_t b;
	cr_assert_eq(mts_kind_learned_for(&srv.reg, "xz", 1000, &b, NULL, 0),
	             0);
	cr_assert_eq(b, plus10(50 * MIB));
	struct mts_kind_profile p;
	cr_assert_eq(mts_kind_profile_for(&srv.reg, "xz", 1000, &p), -ENOENT);
	/* A version 3 is another format: refused. */
	h.version = 3;
	fd = open(path, O_WRONLY);
	cr_assert_eq(write(fd, &h, sizeof(h)), (ssize_t)sizeof(h));
	close(fd);
	cr_assert_eq(mts_kinds_load(&srv.reg, path), -EBADMSG);
	unlink(path);
}

static struct mts_resv *resv_of_task(const char *task)
{
	for (uint32_t i = 0; i < srv.reg.adm->nresv; i++) {
		struct mts_resv *r = srv.reg.adm->resv[i];
		if (r->task && strcmp(r->task->name, task) == 0)
			return r;
	}
	return NULL;
}

/* Tick until the task of `r` is `ms` old. */
static void age_to(struct mts_resv *r, uint64_t ms)
{
	while ((mts_now_monotonic() - r->started_mono_ns) / 1000000u < ms) {
		usleep(20000);
		mts_core_tick(&srv.reg);
	}
	mts_core_tick(&srv.reg);
}

/* A granted Admit of `kind` for `task` that follows its kind's profile
 * over `length` ("2.0 s"); its reservation. */
static struct mts_resv *admit_following(const char *kind, const char *task,
                                        const char *length)
{
	Memtally__V1__Response *r = admit_kind(1000, 0, kind, task);
	cr_assert(r->admit_result->admitted, "%s", r->admit_result->reason);
	char want[64];
	snprintf(want, sizeof(want), "following its profile over %s", length);
	cr_assert(strstr(r->admit_result->sized_by, want), "%s",
	          r->admit_result->sized_by);
	memtally__v1__response__free_unpacked(r, NULL);
	struct mts_resv *resv = resv_of_task(task);
	cr_assert_not_null(resv);
	return resv;
}

/* An Admit of `task` of `kind` by uid 1000, which must be granted, then
 * its release (by root). */
static void admitted_then_released(const char *kind, const char *task)
{
	Memtally__V1__Response *r = admit_kind(1000, 0, kind, task);
	cr_assert(r->admit_result->admitted, "%s: %s", task,
	          r->admit_result->reason);
	memtally__v1__response__free_unpacked(r, NULL);
	struct mts_peer root = fx_peer(getpid(), 0);
	uint64_t freed;
	char id[MTS_RESV_ID_LEN + 1];
	memcpy(id, resv_of_task(task)->id, sizeof(id));
	cr_assert_eq(mts_release(&srv.reg, &root, id, "", &freed), 0);
}

/* A worker of `task` holding 10 MiB, seen by a tick. */
static pid_t start_worker(const char *task)
{
	pid_t pid = fx_spawn();
	fx_write(fx_register(pid, "", task), 10 * MIB);
	mts_core_tick(&srv.reg);
	return pid;
}

Test(kinds, admission_follows_the_profile_over_time)
{
	/* A kind that leaks to 100 MiB over 2 s: learned 110 MiB,
	 * expected to last 2 s (its runs' mean length). A fleet of 200 MiB
	 * holds one at its peak, not two, with the whole pooled gap kept. */
	start_fleet(200 * MIB);
	srv.reg.policy.kind_pool_gap_bp = MTS_BP_ONE;
	srv.reg.policy.admit_queue = false; /* its own test, below */
	for (int i = 0; i < 10; i++)
		note_leak("leak", 100 * MIB, 2000, false);
	struct mts_resv *t1 = admit_following("leak", "T1", "2.0 s");
	Memtally__V1__Response *r;
	cr_assert_not_null(t1);
	/* It sets aside what its kind's runs held in their first step, not
	 * its size. */
	cr_assert_eq(srv.reg.totals.reserved, t1->prof.mean[0]);
	cr_assert_lt(srv.reg.totals.reserved, 20 * MIB);

	/* A second one at once would reach its peak with the first (two
	 * means of 100 MiB and sqrt(2) gaps of 10): denied, though they fit
	 * now. */
	r = admit_kind(1000, 0, "leak", "T2");
	cr_assert_not(r->admit_result->admitted);
	cr_assert(strstr(r->admit_result->reason, "profiles grow into"), "%s",
	          r->admit_result->reason);
	memtally__v1__response__free_unpacked(r, NULL);
	/* So is one held whole from the start that fits now but not beside
	 * the first at its peak (12.5 + 120 < 200 < 110 + 120). */
	r = fx_admit(1000, 120 * MIB, "", "", 0);
	cr_assert_not(r->admit_result->admitted);
	memtally__v1__response__free_unpacked(r, NULL);
	/* On the means alone (pool_gap 0%, the default) two fit: 2 x 100. */
	srv.reg.policy.kind_pool_gap_bp = 0;
	admitted_then_released("leak", "T9");
	srv.reg.policy.kind_pool_gap_bp = MTS_BP_ONE;

	pid_t a = start_worker("T1");
	cr_assert(t1->taken_over);
	/* Past 60% of its length, the first is expected to end before the
	 * second passes 45% of its size: granted. */
	age_to(t1, 1260);
	/* Step 5 is 1250-1500 ms of its 2 s; a loaded machine may tick
	 * later, into a later step, which is as much past 60%. */
	uint64_t aged = (mts_now_monotonic() - t1->started_mono_ns) / 1000000u;
	unsigned last = (unsigned)(aged / (2000 / MTS_KIND_STEPS));
	if (last > MTS_KIND_STEPS - 1)
		last = MTS_KIND_STEPS - 1;
	bool stepped = false;
	for (unsigned k = 5; k <= last; k++)
		stepped |= t1->want == t1->prof.mean[k];
	cr_assert(stepped, "want %llu at %llu ms", (unsigned long long)t1->want,
	          (unsigned long long)aged);
	r = admit_kind(1000, 0, "leak", "T2");
	cr_assert(r->admit_result->admitted, "%s", r->admit_result->reason);
	memtally__v1__response__free_unpacked(r, NULL);
	/* The first, past its length, holds its last step, not its whole
	 * size: it is at its end. */
	age_to(t1, 2300);
	cr_assert_eq(t1->want, t1->prof.mean[MTS_KIND_STEPS - 1]);
	cr_assert_lt(t1->want, t1->bytes);
	/* Its end is noticed 400 ms after the last tick that saw it (a
	 * loaded loop): the run ends at that tick, not at the notice. */
	usleep(400000);
	uint64_t noticed =
	    (mts_now_monotonic() - t1->started_mono_ns) / 1000000u;
	fx_kill(a);
	mts_core_tick(&srv.reg);
	/* Its run has a length and a shape, its peak in its last step. */
	struct mts_kind *k = mts_kind_find(&srv.reg, "leak", 1000);
	const struct mts_kind_run *run =
	    &k->runs[(k->head + MTS_KIND_RUNS - 1) % MTS_KIND_RUNS];
	cr_assert_geq(run->dur_ms, 2300);
	cr_assert_leq(run->dur_ms + 300, noticed, "%u ms, noticed at %llu",
	              run->dur_ms, (unsigned long long)noticed);
	cr_assert_eq(run->peak, 10 * MIB);
	cr_assert_eq(run->steps[MTS_KIND_STEPS - 1], MTS_KIND_STEP_ONE);

	/* Beside T2 (pending, to grow to its mean of 100 MiB), on the means
	 * alone a third fits following its profile (100 + 100 <= 200) ... */
	srv.reg.policy.kind_pool_gap_bp = 0;
	admitted_then_released("leak", "T3");
	/* ... but not held whole from the start (follow_profile off: 110
	 * beside T2's 100). */
	srv.reg.policy.kind_follow_profile = false;
	r = admit_kind(1000, 0, "leak", "T3");
	cr_assert_not(r->admit_result->admitted);
	memtally__v1__response__free_unpacked(r, NULL);
}

/* A run of `peak` bytes over `dur_ms` that holds a tenth of its peak
 * until its last step, which holds the whole. */
static void note_late(const char *kind, uint64_t peak, uint32_t dur_ms)
{
	struct mts_kind_run run = {.peak = peak, .dur_ms = dur_ms};
	for (uint32_t j = 0; j < MTS_KIND_STEPS; j++)
		run.steps[j] = (uint16_t)(j == MTS_KIND_STEPS - 1
		                              ? MTS_KIND_STEP_ONE
		                              : MTS_KIND_STEP_ONE / 10);
	mts_kind_note_run(&srv.reg, kind, 1000, &run);
}

Test(kinds, a_task_is_expected_to_last_its_runs_mean_length)
{
	/* A kind that leaks to 100 MiB, half its runs in 1 s, half in 3 s:
	 * expected to last 2 s (the quantile length is 3.3 s). */
	start_fleet(150 * MIB);
	srv.reg.policy.admit_queue = false;
	for (int i = 0; i < 5; i++) {
		note_leak("leak", 100 * MIB, 1000, false);
		note_leak("leak", 100 * MIB, 3000, false);
	}
	/* One whose whole peak comes in its last step, after 2 s. */
	for (int i = 0; i < 10; i++)
		note_late("late", 100 * MIB, 2000);
	struct mts_resv *t1 = admit_following("leak", "T1", "2.0 s");
	Memtally__V1__Response *r;
	pid_t a = start_worker("T1");
	cr_assert(t1->taken_over);
	/* Halfway through its expected length it holds its runs' mean of
	 * the middle (5/8 of 100 MiB), not of 30% of the way. */
	age_to(t1, 1000);
	cr_assert_eq(t1->want, t1->prof.mean[4]);
	/* The late one peaks 2 s from now, when the first is expected to
	 * have ended (laid over 3.3 s, it would still run at its peak
	 * then: 100 + 100 > 150). Granted. */
	r = admit_kind(1000, 0, "late", "T2");
	cr_assert(r->admit_result->admitted, "%s", r->admit_result->reason);
	memtally__v1__response__free_unpacked(r, NULL);
	fx_kill(a);
	mts_core_tick(&srv.reg);
}

/* ---- the queue -------------------------------------------------------------
 */

Test(kinds, a_request_past_its_groups_limit_keeps_no_room)
{
	/* Group g may hold 10 MiB. A request of 120 MiB in it, denied by the
	 * fleet's check (made first) while the fleet was tight, waited in
	 * the queue and, once it led, kept 120 MiB from everyone: a grant
	 * that can never come, since its group's limit denies it whenever
	 * the fleet has room. */
	mts_policy_defaults(&pol);
	pol.fleet_limit = 1000 * MIB;
	struct mts_group_policy gp = {.name = "g", .limit = 10 * MIB};
	pol.groups = &gp;
	pol.ngroups = 1;
	fx_start_policy(&pol);
	pol.groups = NULL;
	pol.ngroups = 0;
	srv.reg.policy.admit_queue_ms = 0;
	Memtally__V1__Response *r = fx_admit(1000, 900 * MIB, "", "fill", 0);
	cr_assert(r->admit_result->admitted, "%s", r->admit_result->reason);
	memtally__v1__response__free_unpacked(r, NULL);
	r = fx_admit(1001, 120 * MIB, "g", "never", 0);
	cr_assert_not(r->admit_result->admitted);
	memtally__v1__response__free_unpacked(r, NULL);
	cr_assert_eq(srv.reg.adm->nwaiters, 0, "it waits in the queue");
	/* Another user's 50 MiB fits beside the filler: granted. */
	r = fx_admit(1002, 50 * MIB, "", "honest", 0);
	cr_assert(r->admit_result->admitted, "%s", r->admit_result->reason);
	memtally__v1__response__free_unpacked(r, NULL);
}

Test(kinds, the_request_waiting_longest_keeps_its_room)
{
	start_fleet(1000 * MIB);
	/* Not before it has waited [admission] queue (10 s by default). */
	cr_assert_eq(srv.reg.policy.admit_queue_ms, 10000);
	Memtally__V1__Response *r0 = fx_admit(1000, 700 * MIB, "", "h0", 0);
	memtally__v1__response__free_unpacked(r0, NULL);
	r0 = fx_admit(1000, 400 * MIB, "", "b0", 0);
	cr_assert_not(r0->admit_result->admitted);
	memtally__v1__response__free_unpacked(r0, NULL);
	r0 = fx_admit(1001, 200 * MIB, "", "s0", 0);
	cr_assert(r0->admit_result->admitted, "%s", r0->admit_result->reason);
	memtally__v1__response__free_unpacked(r0, NULL);
	mts_resv_free_all(&srv.reg);
	srv.reg.adm->nwaiters = 0;
	mts_resv_sums(&srv.reg);
	srv.reg.policy.admit_queue_ms = 0;
	Memtally__V1__Response *r = fx_admit(1000, 700 * MIB, "", "hold", 0);
	cr_assert(r->admit_result->admitted, "%s", r->admit_result->reason);
	memtally__v1__response__free_unpacked(r, NULL);
	/* A large request waits (700 + 400 > 1000) ... */
	r = fx_admit(1000, 400 * MIB, "", "big", 0);
	cr_assert_not(r->admit_result->admitted);
	memtally__v1__response__free_unpacked(r, NULL);
	/* ... so a younger small one that fits alone (700 + 200) but not
	 * beside it is denied, and says why. */
	r = fx_admit(1001, 200 * MIB, "", "small", 0);
	cr_assert_not(r->admit_result->admitted);
	cr_assert(strstr(r->admit_result->reason,
	                 "400 MiB more kept for the request waiting longest"),
	          "%s", r->admit_result->reason);
	memtally__v1__response__free_unpacked(r, NULL);
	/* The oldest itself is not held back by the younger one. */
	struct mts_resv *h = resv_of_task("hold");
	struct mts_peer root = fx_peer(getpid(), 0);
	uint64_t bytes;
	char id[MTS_RESV_ID_LEN + 1];
	memcpy(id, h->id, sizeof(id));
	cr_assert_eq(mts_release(&srv.reg, &root, id, "", &bytes), 0);
	r = fx_admit(1000, 400 * MIB, "", "big", 0);
	cr_assert(r->admit_result->admitted, "%s", r->admit_result->reason);
	memtally__v1__response__free_unpacked(r, NULL);
	/* Granted, it left the queue: the small one now fits. */
	r = fx_admit(1001, 200 * MIB, "", "small", 0);
	cr_assert(r->admit_result->admitted, "%s", r->admit_result->reason);
	memtally__v1__response__free_unpacked(r, NULL);
	cr_assert_eq(srv.reg.adm->nwaiters, 0);

	/* Queue off: nothing is kept. */
	r = fx_admit(1000, 900 * MIB, "", "never", 0);
	cr_assert_not(r->admit_result->admitted);
	memtally__v1__response__free_unpacked(r, NULL);
	r = fx_admit(1001, 100 * MIB, "", "s2", 0);
	cr_assert_not(r->admit_result->admitted);
	memtally__v1__response__free_unpacked(r, NULL);
	srv.reg.policy.admit_queue = false;
	r = fx_admit(1001, 100 * MIB, "", "s2", 0);
	cr_assert(r->admit_result->admitted, "%s", r->admit_result->reason);
	memtally__v1__response__free_unpacked(r, NULL);
}

static void release_as(pid_t pid, const char *id)
{
	Memtally__V1__Request req = MEMTALLY__V1__REQUEST__INIT;
	Memtally__V1__Release rel = MEMTALLY__V1__RELEASE__INIT;
	rel.reservation = (char *)id;
	req.id = 62;
	req.body_case = MEMTALLY__V1__REQUEST__BODY_RELEASE;
	req.release = &rel;
	struct mts_peer peer = fx_peer(pid, 1000);
	Memtally__V1__Response *r = fx_call(&peer, &req);
	cr_assert_null(r->error, "%s", r->error ? r->error->message : "");
	memtally__v1__response__free_unpacked(r, NULL);
}

/* Lane `k` of `slot` is thread `tid`'s, holding `bytes`. */
static void lane_write(uint32_t slot, uint32_t k, uint32_t tid, int64_t bytes)
{
	struct mtshm_slot_id *s = mts_slot(&srv.reg, slot);
	if (mtshm_load_relaxed32(&s->lanes_used) < k + 1)
		mtshm_store_relaxed32(&s->lanes_used, k + 1);
	mtshm_store_relaxed32(&mtshm_lane(s, k)->owner, tid);
	mtshm_store_relaxeds64(&mtshm_lane(s, k)->bytes, bytes);
}

/* A registered worker of FX_UID that holds `bytes` (lane 0), counted: a
 * host for tasks run inside it. */
/* An Admit by `pid` (of `uid`) of a 100 MiB task of `kind` run inside it
 * on thread `thread`, granted as a hosted task. */
static void admitted_hosted(pid_t pid, uint32_t uid, const char *kind,
                            uint32_t thread)
{
	Memtally__V1__Response *r =
	    fx_admit_hosted(pid, uid, 100 * MIB, kind, thread, 0);
	cr_assert(r->admit_result->in_process);
	memtally__v1__response__free_unpacked(r, NULL);
}

static pid_t host_holding(uint64_t bytes, uint32_t *slot)
{
	pid_t h = fx_spawn();
	*slot = fx_register(h, "", "");
	fx_write(*slot, (int64_t)bytes);
	mts_core_tick(&srv.reg);
	return h;
}

Test(kinds, a_task_run_inside_its_asker_is_what_the_asker_grew_by)
{
	start_fleet(1024 * MIB);
	uint32_t slot;
	/* The worker's own, before the task. */
	pid_t h = host_holding(50 * MIB, &slot);

	Memtally__V1__Response *r =
	    fx_admit_hosted(h, 1000, 100 * MIB, "parse", 0, 0);
	cr_assert(r->admit_result->admitted, "%s", r->admit_result->reason);
	cr_assert(r->admit_result->in_process);
	char id[MTS_RESV_ID_LEN + 1];
	snprintf(id, sizeof(id), "%s", r->admit_result->reservation);
	memtally__v1__response__free_unpacked(r, NULL);
	cr_assert_eq(srv.reg.totals.reserved, 100 * MIB);

	/* What the worker grows by is the task's: the reservation no longer
	 * sets it aside, for the worker's figure counts it. */
	fx_write(slot, 80 * MIB);
	mts_core_tick(&srv.reg);
	cr_assert_eq(srv.reg.totals.reserved, 70 * MIB);
	fx_write(slot, 60 * MIB);
	usleep(30000);
	mts_core_tick(&srv.reg);
	cr_assert_eq(srv.reg.totals.reserved, 90 * MIB);
	release_as(h, id);
	cr_assert_eq(srv.reg.totals.reserved, 0);
	struct mts_kind *k = mts_kind_find(&srv.reg, "parse", 1000);
	cr_assert_not_null(k);
	cr_assert_eq(k->nruns, 1);
	cr_assert_eq(k->runs[0].peak, 30 * MIB, "peak %llu",
	             (unsigned long long)k->runs[0].peak);
	/* Its length, from the grant: it has a profile to learn from. */
	cr_assert_geq(k->runs[0].dur_ms, 30);
}

/* An Admit of task `task` of kind "leak" run inside `pid`, following the
 * kind's profile (a task name is needed for that), within `host_limit`
 * (0: none). */
static bool admit_hosted_leak_within(pid_t pid, const char *task,
                                     uint64_t host_limit, char *reason,
                                     size_t len)
{
	Memtally__V1__Request req = MEMTALLY__V1__REQUEST__INIT;
	Memtally__V1__Admit a = MEMTALLY__V1__ADMIT__INIT;
	a.group = (char *)"";
	a.task = (char *)task;
	a.kind = (char *)"leak";
	a.in_process = true;
	a.host_limit = host_limit;
	req.id = 62;
	req.body_case = MEMTALLY__V1__REQUEST__BODY_ADMIT;
	req.admit = &a;
	struct mts_peer peer = fx_peer(pid, 1000);
	Memtally__V1__Response *r = fx_call(&peer, &req);
	cr_assert_null(r->error, "%s", r->error ? r->error->message : "");
	bool ok = r->admit_result->admitted;
	cr_assert(!ok || r->admit_result->in_process);
	snprintf(reason, len, "%s", r->admit_result->reason);
	memtally__v1__response__free_unpacked(r, NULL);
	return ok;
}

static bool admit_hosted_leak(pid_t pid, const char *task, char *reason,
                              size_t len)
{
	return admit_hosted_leak_within(pid, task, 0, reason, len);
}

/* Tasks run inside a shared host are pooled with host_gap (100% by
 * default), others with pool_gap (0%): the node guard can only end the
 * whole host, every task in it. */
Test(kinds, tasks_inside_a_host_keep_their_pooled_gap)
{
	/* Leaks to 100 MiB over 2 s: mean 100 MiB, quantile 110 at the end.
	 * The host holds 10 MiB. Two alike on their means: 210 MiB; one
	 * hosted beside a plain one: 220; two hosted: 224.1. */
	start_fleet(222 * MIB);
	srv.reg.policy.admit_queue = false;
	for (int i = 0; i < 10; i++)
		note_leak("leak", 100 * MIB, 2000, false);
	uint32_t slot;
	pid_t h = host_holding(10 * MIB, &slot);
	char why[512];
	cr_assert(admit_hosted_leak(h, "H1", why, sizeof(why)), "%s", why);
	cr_assert(resv_of_task("H1")->profiled);
	/* A second hosted task would peak with the first beyond the limit. */
	cr_assert_not(admit_hosted_leak(h, "H2", why, sizeof(why)));
	cr_assert(strstr(why, "profiles grow into"), "%s", why);
	/* A task with a process of its own keeps no gap of its own. */
	admitted_then_released("leak", "P1");
	/* host_gap 0%: hosted tasks are admitted on their means too. */
	srv.reg.policy.kind_host_gap_bp = 0;
	cr_assert(admit_hosted_leak(h, "H2", why, sizeof(why)), "%s", why);
}

Test(kinds, a_hosted_task_on_a_thread_is_what_its_thread_grew_by)
{
	start_fleet(1024 * MIB);
	pid_t h = fx_spawn();
	uint32_t slot = fx_register_as(h, 1000, "", "");
	lane_write(slot, 0, 100, 50 * MIB);
	lane_write(slot, 1, 4242, 8 * MIB);
	mts_core_tick(&srv.reg);
	admitted_hosted(h, 1000, "parse", 4242);

	/* Another thread's task grows the worker by 30 MiB, this one's by
	 * 20: the reservation sets aside 100 - 20. */
	lane_write(slot, 0, 100, 80 * MIB);
	lane_write(slot, 1, 4242, 28 * MIB);
	mts_core_tick(&srv.reg);
	cr_assert_eq(srv.reg.totals.reserved, 80 * MIB);

	/* The other thread's task frees 60 MiB while this one grows by 50:
	 * the worker shrank, but this task holds 70 MiB. A trusted worker's
	 * lane counts as its slot's total does. */
	lane_write(slot, 0, 100, 20 * MIB);
	lane_write(slot, 1, 4242, 78 * MIB);
	mts_core_tick(&srv.reg);
	cr_assert_eq(srv.reg.totals.reserved, 30 * MIB);

	/* The worker exits: the task went with it, so does its reservation,
	 * and its kind keeps the run. */
	fx_kill(h);
	mts_core_tick(&srv.reg);
	cr_assert_eq(srv.reg.adm->nresv, 0);
	struct mts_kind *k = mts_kind_find(&srv.reg, "parse", 1000);
	cr_assert_not_null(k);
	cr_assert_eq(k->nruns, 1);
	cr_assert_eq(k->runs[0].peak, 70 * MIB);
}

/* A restarted server keeps a task run inside its asker: the record holds
 * the host's pid, start time, uid and thread. The host, alive but not yet
 * registered with the new server, keeps the reservation; registered
 * (afresh, as a worker the restarted server did not adopt: its count
 * whole in its thread's lane), the task's use goes on from where the
 * record left it. A host that died while no server ran, one that is
 * another process at the recorded pid (another start time), and one of
 * another uid end the reservation at the next tick, teaching its kind
 * nothing. */
static void host_outlives_server(pid_t h)
{
	for (int i = 0; i < nkids; i++)
		if (kids[i] == h)
			kids[i] = kids[--nkids];
	fx_stop();
	mts_policy_free(&pol);
	start_fleet(1024 * MIB);
	kids[nkids++] = h;
}

static void restore_one(unsigned char *d, size_t len)
{
	uint32_t kept, dropped;
	cr_assert_eq(mts_resv_restore(&srv.reg, d, len, true, &kept, &dropped),
	             0);
	cr_assert_eq(kept, 1, "kept %u, dropped %u", kept, dropped);
}

/* The record `d` with the host's start time moved by `shift`, restored
 * into a new server where `h` registers as `uid`: ended at the first
 * tick, `h` not taken for the host. */
static void not_the_host(pid_t h, unsigned char *d, size_t len, uint64_t shift,
                         uint32_t uid, const char *why)
{
	unsigned char *e = malloc(len);
	cr_assert_not_null(e);
	memcpy(e, d, len);
	uint64_t start;
	memcpy(&start, e + 48 + 520, sizeof(start)); /* the host's start */
	start += shift;
	memcpy(e + 48 + 520, &start, sizeof(start));
	mts_record_seal(e, len);
	host_outlives_server(h);
	restore_one(e, len);
	fx_register_as(h, uid, "", "");
	mts_core_tick(&srv.reg);
	cr_assert_eq(srv.reg.adm->nresv, 0, "%s", why);
	free(e);
}

Test(kinds, a_hosted_task_survives_a_restart_of_the_server)
{
	start_fleet(1024 * MIB);
	pid_t h = fx_spawn();
	uint32_t slot = fx_register_as(h, 1000, "", "");
	lane_write(slot, 1, 4242, 8 * MIB);
	mts_core_tick(&srv.reg);
	Memtally__V1__Response *r =
	    fx_admit_hosted(h, 1000, 100 * MIB, "parse", 4242, 0);
	cr_assert(r->admit_result->in_process);
	char id[MTS_RESV_ID_LEN + 1];
	snprintf(id, sizeof(id), "%s", r->admit_result->reservation);
	memtally__v1__response__free_unpacked(r, NULL);
	lane_write(slot, 1, 4242, 28 * MIB);
	mts_core_tick(&srv.reg);
	cr_assert_eq(srv.reg.totals.reserved, 80 * MIB);
	unsigned char *d;
	size_t len;
	cr_assert_eq(mts_resv_encode(&srv.reg, &d, &len), 0);
	mts_record_seal(d, len);

	host_outlives_server(h);
	restore_one(d, len);
	const struct mts_resv *rv = mts_resv_find(&srv.reg, id);
	cr_assert_not_null(rv, "the hosted reservation was not restored");
	cr_assert(rv->hosted && rv->host_unbound);
	cr_assert_eq(rv->host_pid, (uint32_t)h);
	cr_assert_eq(srv.reg.adm->nhosted, 1);
	/* Alive, not registered yet: kept. */
	mts_core_tick(&srv.reg);
	cr_assert_eq(srv.reg.adm->nresv, 1, "ended while its host lives");
	cr_assert(rv->host_unbound);
	slot = fx_register_as(h, 1000, "", "");
	lane_write(slot, 0, 4242, 28 * MIB);
	mts_core_tick(&srv.reg);
	cr_assert_not(rv->host_unbound, "the host was not found again");
	cr_assert_eq(srv.reg.totals.reserved, 80 * MIB, "reserved %llu",
	             (unsigned long long)srv.reg.totals.reserved);
	lane_write(slot, 0, 4242, 78 * MIB);
	mts_core_tick(&srv.reg);
	cr_assert_eq(srv.reg.totals.reserved, 30 * MIB, "reserved %llu",
	             (unsigned long long)srv.reg.totals.reserved);

	/* Another process at the recorded pid (another start time), and
	 * the host registered as another uid: not the host. */
	not_the_host(h, d, len, 1, 1000, "another process taken as host");
	not_the_host(h, d, len, 0, 2000, "a host of another uid");

	/* Its host gone while no server ran: ended at the first tick. */
	fx_kill(h);
	fx_stop();
	mts_policy_free(&pol);
	start_fleet(1024 * MIB);
	restore_one(d, len);
	mts_core_tick(&srv.reg);
	cr_assert_eq(srv.reg.adm->nresv, 0);
	cr_assert_eq(srv.reg.adm->nhosted, 0);
	cr_assert_eq(srv.reg.totals.reserved, 0);
	struct mts_kind *k = mts_kind_find(&srv.reg, "parse", 1000);
	cr_assert(!k || !k->nruns, "a run ended unseen was learned");
	free(d);
}

Test(kinds, an_untrusted_hosts_thread_counts_no_more_than_the_kernel_vouches)
{
	/* An untrusted worker (no allowance for claims ahead of the kernel)
	 * whose thread claims 90 MiB it does not hold: the kernel saw the
	 * worker grow by nothing, so neither did the task. */
	mts_policy_defaults(&pol);
	pol.fleet_limit = 1024 * MIB;
	pol.untouched_allowance = 0;
	fx_start_policy(&pol);
	pid_t h = fx_spawn();
	uint32_t slot = fx_register_as(h, 1001, "", "");
	lane_write(slot, 0, 4242, 0);
	mts_core_tick(&srv.reg);
	admitted_hosted(h, 1001, "parse", 4242);
	lane_write(slot, 0, 4242, 90 * MIB);
	mts_core_tick(&srv.reg);
	struct mts_proc *p = mts_find_pid(&srv.reg, (uint32_t)h);
	cr_assert(p && p->untrusted);
	cr_assert_eq(srv.reg.adm->resv[0]->use, 0, "%llu",
	             (unsigned long long)srv.reg.adm->resv[0]->use);
}

Test(kinds, a_host_that_shrank_counts_its_growth_from_its_lowest_figure)
{
	/* A task with no thread has all of its host's growth. Another task
	 * frees 40 MiB of the host's 58, then this one grows it by 30: the
	 * task holds 30, not 30 - 40. */
	start_fleet(1024 * MIB);
	uint32_t slot;
	pid_t h = host_holding(58 * MIB, &slot);
	admitted_hosted(h, FX_UID, "parse", 0);
	fx_write(slot, 18 * MIB);
	mts_core_tick(&srv.reg);
	cr_assert_eq(srv.reg.totals.reserved, 100 * MIB);
	fx_write(slot, 48 * MIB);
	mts_core_tick(&srv.reg);
	cr_assert_eq(srv.reg.totals.reserved, 70 * MIB);
}

Test(kinds, hosted_tasks_on_one_thread_share_what_it_grew_by)
{
	/* A pool of green threads (gevent, eventlet) runs two tasks at once
	 * on the worker's one thread: each is counted half of what that
	 * thread grew by, not all of it (its kind would learn twice its
	 * size). A task on a thread of its own is not. Two tasks with no
	 * thread (the whole process) share the process's growth. */
	start_fleet(1024 * MIB);
	pid_t h = fx_spawn();
	uint32_t slot = fx_register_as(h, 1000, "", "");
	lane_write(slot, 0, 100, 10 * MIB);
	lane_write(slot, 1, 4242, 8 * MIB);
	mts_core_tick(&srv.reg);
	admitted_hosted(h, 1000, "a", 100);
	admitted_hosted(h, 1000, "b", 100);
	admitted_hosted(h, 1000, "c", 4242);
	lane_write(slot, 0, 100, 70 * MIB);  /* +60: 30 each */
	lane_write(slot, 1, 4242, 28 * MIB); /* +20: c's alone */
	mts_core_tick(&srv.reg);
	uint64_t use[3] = {0};
	for (uint32_t i = 0; i < srv.reg.adm->nresv; i++) {
		const struct mts_resv *r = srv.reg.adm->resv[i];
		use[r->host_tid == 4242 ? 2 : use[0] ? 1 : 0] = r->use;
	}
	cr_assert_eq(use[0], 30 * MIB, "%llu", (unsigned long long)use[0]);
	cr_assert_eq(use[1], 30 * MIB, "%llu", (unsigned long long)use[1]);
	cr_assert_eq(use[2], 20 * MIB, "%llu", (unsigned long long)use[2]);
	cr_assert_eq(srv.reg.totals.reserved, (70 + 70 + 80) * MIB);

	uint32_t slot2;
	pid_t h2 = host_holding(10 * MIB, &slot2);
	admitted_hosted(h2, FX_UID, "d", 0);
	admitted_hosted(h2, FX_UID, "e", 0);
	fx_write(slot2, 50 * MIB); /* +40: 20 each */
	mts_core_tick(&srv.reg);
	cr_assert_eq(srv.reg.totals.reserved, (70 + 70 + 80 + 80 + 80) * MIB);
}

Test(kinds, a_hosted_task_whose_thread_has_no_lane_gets_an_equal_share)
{
	/* Every lane is taken by other threads: the tasks' threads publish
	 * into the slot's overflow, and each of the two tasks is counted
	 * half of what the worker grew by, not all of it. */
	start_fleet(1024 * MIB);
	pid_t h = fx_spawn();
	uint32_t slot = fx_register_as(h, 1000, "", "");
	uint32_t lanes = srv.reg.layout.lane_count;
	for (uint32_t k = 0; k < lanes; k++)
		lane_write(slot, k, 100 + k, k ? 0 : 50 * MIB);
	mts_core_tick(&srv.reg);
	for (uint32_t t = 0; t < 2; t++) {
		admitted_hosted(h, 1000, t ? "b" : "a", 7000 + t);
	}
	struct mtshm_slot_id *s = mts_slot(&srv.reg, slot);
	mtshm_store_relaxeds64(&s->overflow, 60 * MIB);
	/* Said once, with what to raise, since it lasts: */
	const char *log = fx_tick_logged();
	cr_assert_eq(srv.reg.totals.reserved, 2 * (100 - 30) * MIB);
	char want[96];
	snprintf(want, sizeof(want), "pid=%d uid=1000 lanes=%u tasks=2", h,
	         lanes);
	cr_assert(strstr(log, "more threads than its slot has lanes"), "%s",
	          log);
	cr_assert(strstr(log, want), "%s", log);
	cr_assert(strstr(log, "raise [server] lanes"), "%s", log);
	log = fx_tick_logged();
	cr_assert_null(strstr(log, "lanes"), "%s", log);
}

Test(kinds, a_hosted_task_whose_thread_has_not_flushed_yet_is_not_a_lane_short)
{
	/* A lane free, the task's thread not in one yet (it has not
	 * flushed): an equal share for the moment, and nothing said. */
	start_fleet(1024 * MIB);
	pid_t h = fx_spawn();
	uint32_t slot = fx_register_as(h, 1000, "", "");
	lane_write(slot, 0, 100, 50 * MIB);
	mts_core_tick(&srv.reg);
	admitted_hosted(h, 1000, "a", 7000);
	const char *log = fx_tick_logged();
	cr_assert_null(strstr(log, "lanes"), "%s", log);
	cr_assert_not(mts_find_pid(&srv.reg, (uint32_t)h)->lanes_short);
}

Test(kinds, only_the_asker_itself_hosts_a_task)
{
	start_fleet(1024 * MIB);
	pid_t h = fx_spawn();
	fx_register_as(h, 1000, "", "");
	/* The test process is not registered: it cannot host, and so
	 * cannot make another process's growth its task's. */
	Memtally__V1__Response *r =
	    fx_admit_hosted(getpid(), 1000, 10 * MIB, "parse", 0, 0);
	cr_assert(r->admit_result->admitted);
	cr_assert_not(r->admit_result->in_process);
	memtally__v1__response__free_unpacked(r, NULL);
	/* Nor can another uid's peer with the worker's pid. */
	r = fx_admit_hosted(h, 1001, 10 * MIB, "", 0, 0);
	cr_assert(r->admit_result->admitted);
	cr_assert_not(r->admit_result->in_process);
	memtally__v1__response__free_unpacked(r, NULL);
}

Test(kinds, a_first_run_declared_above_the_room_it_can_ever_have_runs_on_it)
{
	/* 100 MiB fleet; a worker outside any reservation holds 40 MiB (a
	 * cluster's own processes). A kind with no history declared at 80
	 * MiB would never fit beside it. Denied at first, as a declaration
	 * that does not fit now always was; once it has waited the queue's
	 * time it is sized at the 60 MiB it can have, to run once and
	 * learn. */
	start_fleet(100 * MIB);
	srv.reg.policy.admit_queue_ms = 100;
	pid_t w = fx_spawn();
	uint32_t slot = fx_register(w, "", "");
	fx_write(slot, 40 * MIB);
	mts_core_tick(&srv.reg);
	Memtally__V1__Response *r = admit_kind(1000, 80 * MIB, "big", "T1");
	cr_assert_not(r->admit_result->admitted);
	cr_assert_eq(r->admit_result->requested_bytes, 80 * MIB);
	memtally__v1__response__free_unpacked(r, NULL);
	usleep(150000);
	r = admit_kind(1000, 80 * MIB, "big", "T1");
	cr_assert(r->admit_result->admitted, "%s", r->admit_result->reason);
	cr_assert_eq(r->admit_result->reserved_for_task, 60 * MIB);
	cr_assert(strstr(r->admit_result->sized_by, "to learn it"), "%s",
	          r->admit_result->sized_by);
	memtally__v1__response__free_unpacked(r, NULL);
	cr_assert_eq(srv.reg.totals.reserved, 60 * MIB);

	/* Declared above the fleet limit: never admissible, however long
	 * it waits (no room makes it fit its declaration). */
	for (int i = 0; i < 2; i++) {
		r = admit_kind(1000, 120 * MIB, "huge", "T2");
		cr_assert_not(r->admit_result->admitted);
		cr_assert_eq(r->admit_result->requested_bytes, 120 * MIB);
		memtally__v1__response__free_unpacked(r, NULL);
		usleep(150000);
	}
}

Test(kinds, a_first_run_declared_within_the_room_reserves_its_declaration)
{
	start_fleet(100 * MIB);
	pid_t w = fx_spawn();
	uint32_t slot = fx_register(w, "", "");
	fx_write(slot, 40 * MIB);
	mts_core_tick(&srv.reg);
	char why[320];
	cr_assert_eq(reserved_for(1000, 50 * MIB, "mid", why, sizeof(why)),
	             50 * MIB);
	cr_assert(strstr(why, "declared; kind mid has no history"), "%s", why);
}

Test(kinds, a_hosted_task_stays_within_its_workers_own_limit)
{
	/* A worker of 50 MiB runs a task granted 100 MiB that has used 20
	 * so far (the worker holds 70): it may still use 80. Its own limit
	 * is 220 MiB (Dask's memory_limit): a 60 MiB task fits (70 + 80 +
	 * 60), a further 30 MiB does not (70 + 140 + 30), whatever room the
	 * fleet has. */
	start_fleet(1024 * MIB);
	uint32_t slot;
	pid_t h = host_holding(50 * MIB, &slot);
	Memtally__V1__Response *r =
	    fx_admit_hosted(h, 1000, 100 * MIB, "a", 0, 220 * MIB);
	cr_assert(r->admit_result->admitted, "%s", r->admit_result->reason);
	memtally__v1__response__free_unpacked(r, NULL);
	fx_write(slot, 70 * MIB);
	mts_core_tick(&srv.reg);
	r = fx_admit_hosted(h, 1000, 60 * MIB, "b", 0, 220 * MIB);
	cr_assert(r->admit_result->admitted, "%s", r->admit_result->reason);
	memtally__v1__response__free_unpacked(r, NULL);
	r = fx_admit_hosted(h, 1000, 30 * MIB, "c", 0, 220 * MIB);
	cr_assert_not(r->admit_result->admitted);
	cr_assert_str_eq(r->admit_result->limit_scope, "host");
	/* All it can ever give a task: 220 less its own 50. */
	cr_assert_eq(r->admit_result->limit, 170 * MIB);
	cr_assert(strstr(r->admit_result->reason, "host limit"), "%s",
	          r->admit_result->reason);
	memtally__v1__response__free_unpacked(r, NULL);
	/* Without a limit of its own, the fleet decides. */
	r = fx_admit_hosted(h, 1000, 30 * MIB, "c", 0, 0);
	cr_assert(r->admit_result->admitted);
	memtally__v1__response__free_unpacked(r, NULL);
}

Test(kinds, a_workers_own_limit_pools_its_tasks_as_the_fleet_does)
{
	/* Leaks to 100 MiB over 2 s (mean 100 MiB at the end, quantile
	 * 110). A worker holding 10 MiB, its own limit 335 MiB, runs two
	 * and is asked for a third. At their full grants the three would
	 * be 10 + 2 x 110 + 110 = 340 MiB: denied. Pooled as the fleet
	 * pools them (three means plus sqrt(3) gaps): 10 + 300 + 17.3 =
	 * 327.3 MiB, admitted. Another worker's two tasks are not its:
	 * counted with them it would be denied. A fourth needs 10 + 400 +
	 * 20 = 430 MiB: denied at 335, and at 420 too, since against a
	 * worker's own limit the gap stays whole whatever `host_gap` the
	 * fleet runs on (at 0 it would be 410); the fleet admits it. */
	start_fleet(1024 * MIB);
	srv.reg.policy.admit_queue = false;
	for (int i = 0; i < 10; i++)
		note_leak("leak", 100 * MIB, 2000, false);
	uint32_t slot, slot2;
	pid_t other = host_holding(10 * MIB, &slot2);
	char why[512];
	cr_assert(admit_hosted_leak(other, "G1", why, sizeof(why)), "%s", why);
	cr_assert(admit_hosted_leak(other, "G2", why, sizeof(why)), "%s", why);
	pid_t h = host_holding(10 * MIB, &slot);
	const char *task[] = {"H1", "H2", "H3"};
	for (int i = 0; i < 3; i++)
		cr_assert(admit_hosted_leak_within(h, task[i], 335 * MIB, why,
		                                   sizeof(why)),
		          "%s: %s", task[i], why);
	cr_assert_not(
	    admit_hosted_leak_within(h, "H4", 335 * MIB, why, sizeof(why)));
	cr_assert(strstr(why, "host limit"), "%s", why);
	cr_assert(strstr(why, "profiles grow into"), "%s", why);
	srv.reg.policy.kind_host_gap_bp = 0;
	cr_assert_not(
	    admit_hosted_leak_within(h, "H4", 420 * MIB, why, sizeof(why)));
	cr_assert(strstr(why, "host limit"), "%s", why);
	cr_assert(admit_hosted_leak(h, "H4", why, sizeof(why)), "%s", why);
}

Test(kinds, a_first_run_above_what_its_worker_may_hold_is_sized_to_fit)
{
	/* A Dask worker of 60 MiB whose own limit is 200 MiB: a first run
	 * declared at 300 MiB could never run in it (a kind without a
	 * history keeps its declaration), so it is sized at the 140 MiB
	 * the worker may hold beside its own, to run and learn. */
	start_fleet(1024 * MIB);
	uint32_t slot;
	pid_t h = host_holding(60 * MIB, &slot);
	Memtally__V1__Response *r =
	    fx_admit_hosted(h, 1000, 300 * MIB, "x", 0, 200 * MIB);
	cr_assert(r->admit_result->admitted, "%s", r->admit_result->reason);
	cr_assert_eq(r->admit_result->reserved_for_task, 140 * MIB);
	cr_assert(strstr(r->admit_result->sized_by, "a first run"), "%s",
	          r->admit_result->sized_by);
	memtally__v1__response__free_unpacked(r, NULL);
}

Test(kinds, kinds_age_out_while_a_write_of_the_record_is_stuck)
{
	/* A state directory on a stalled disk: the record's write sits on
	 * the thread pool. A kind whose runs all aged out must still go, or
	 * it holds a place under its uid's cap (and the server's) until the
	 * disk answers. */
	char spath[64], kpath[80];
	snprintf(spath, sizeof(spath), "/tmp/mt-kinds-stuck-%d.state",
	         (int)getpid());
	snprintf(kpath, sizeof(kpath), "%s.kinds", spath);
	unlink(spath);
	unlink(kpath);
	mts_policy_defaults(&pol);
	struct mts_config cfg = fx_config("kinds-stuck", 8);
	cfg.policy = &pol;
	cfg.state_path = spath;
	cfg.tick_ms = 10;
	fx_start_config(&cfg);
	cr_assert(srv.kinds.path[0], "no record of learned sizes");
	note_run(&srv.reg, "k", 1000, 10 * MIB, false);
	struct mts_kind *k = mts_kind_find(&srv.reg, "k", 1000);
	cr_assert_not_null(k);
	uint64_t now_s = mts_now_realtime() / 1000000000u;
	for (uint32_t i = 0; i < k->nruns; i++)
		k->runs[i].end_s = now_s - srv.reg.policy.kind_horizon_s - 1;
	k->est_valid = false;
	static char stuck;
	srv.kinds.inflight = (struct mts_rec_write *)(void *)&stuck;
	FX_RUN_UNTIL(!mts_kind_find(&srv.reg, "k", 1000));
	cr_assert_eq(srv.reg.kinds->n, 0);
	/* The disk answers: the record without it is written. */
	srv.kinds.inflight = NULL;
	FX_RUN_UNTIL(!srv.reg.kinds->dirty && !srv.kinds.inflight);
	unlink(spath);
	unlink(kpath);
}

/* Every byte of `s` in a whole UTF-8 sequence. */
static bool utf8_whole(const char *s)
{
	uint32_t c;
	for (size_t k; *s; s += k)
		if ((k = mt_utf8_seq((const unsigned char *)s, &c)) == 0)
			return false;
	return true;
}

Test(kinds, an_answer_quoting_a_long_kind_is_whole_utf8)
{
	/* 135 bytes of three-byte characters, a valid name: the answer's
	 * texts quote it cut to 128 bytes, inside a character. A proto3
	 * string that is not UTF-8 makes a peer's decoder refuse the whole
	 * answer, the grant with it. */
	start_fleet(0);
	char kind[256] = "";
	for (int i = 0; i < 9; i++)
		strcat(kind, "\xe3\x83\x87\xe3\x83\xbc\xe3\x82\xbf"
		             "\xe5\x87\xa6\xe7\x90\x86");
	cr_assert_eq(strlen(kind), 135);
	cr_assert(mt_name_ok(kind));
	char why[320];
	reserved_for(1000, 10 * MIB, kind, why, sizeof(why));
	cr_assert(utf8_whole(why), "not UTF-8: %s", why);
	cr_assert(strstr(why, "declared"), "%s", why);
	for (int i = 0; i < 5; i++)
		note_run(&srv.reg, kind, 1000, 8 * MIB, false);
	reserved_for(1000, 10 * MIB, kind, why, sizeof(why));
	cr_assert(utf8_whole(why), "not UTF-8: %s", why);
	cr_assert(strstr(why, "p95 of 5 runs"), "%s", why);
}

/* Granted `bytes` for `task` of `kind`, asked by this process as `uid`. */
static void grant(uint32_t uid, uint64_t bytes, const char *kind,
                  const char *task)
{
	Memtally__V1__Response *r = admit_kind(uid, bytes, kind, task);
	cr_assert_null(r->error, "%s", r->error ? r->error->message : "");
	cr_assert(r->admit_result->admitted, "denied: %s",
	          r->admit_result->reason);
	memtally__v1__response__free_unpacked(r, NULL);
}

Test(kinds, a_run_is_a_process_that_asked_for_one_task)
{
	start_fleet(0);
	grant(1000, 10 * MIB, "k", "t1");
	grant(1000, 20 * MIB, "k", "t1");
	uint32_t n;
	struct mts_run_ref *runs = mts_resv_runs(&srv.reg, &n);
	cr_assert_eq(n, 1);
	cr_assert_eq(runs[0].pid, (uint32_t)getpid());
	/* Its tree counts in the oldest of its reservations, once. */
	cr_assert_eq(runs[0].r->bytes, 10 * MIB);
	cr_assert_eq(mts_run_find(runs, n, (uint32_t)getpid(), runs[0].start),
	             &runs[0]);
	cr_assert_null(
	    mts_run_find(runs, n, (uint32_t)getpid(), runs[0].start + 1));
	free(runs);
	/* Asking for a second task, it is a scheduler: what it starts could
	 * be either task's, so it is no run. */
	grant(1000, 10 * MIB, "k", "t2");
	runs = mts_resv_runs(&srv.reg, &n);
	cr_assert_eq(n, 0);
	cr_assert_null(runs);
}

Test(kinds, a_runs_command_that_never_registers_teaches_its_kind)
{
	start_fleet(0);
	/* Asked by a process of its own (the run), so that the other
	 * user's worker below is not below it (its command's). */
	struct mts_peer run = fx_peer(fx_spawn(), 1000);
	Memtally__V1__Response *resp =
	    admit_by(&run, 10 * MIB, "static", "t", false);
	cr_assert(resp->admit_result->admitted);
	memtally__v1__response__free_unpacked(resp, NULL);
	struct mts_resv *r = resv_of_task("t");
	cr_assert(!r->tree_run && !r->taken_over);
	uint64_t ttl_end = r->expires_ns;
	/* Gone before its command held anything: a scheduler's grant a
	 * worker may take over later; its TTL ends it, not this. */
	mts_resv_run_read(&srv.reg, r, true, false, 0, 0);
	cr_assert_eq(resv_of_task("t"), r);
	/* Another user's worker naming the task is not the run's: it
	 * neither hides the command's memory nor stands in for it. */
	fx_write(fx_register_as(fx_spawn(), 2000, "", "t"), 1 * MIB);
	mts_core_tick(&srv.reg);

	mts_resv_run_read(&srv.reg, r, false, false, 30 * MIB, 2);
	cr_assert(r->tree_run);
	cr_assert_eq(r->use, 30 * MIB);
	/* Running: max_ttl from its grant, as a task's workers keep it. */
	cr_assert_gt(r->expires_ns, ttl_end);
	mts_resv_run_read(&srv.reg, r, false, false, 50 * MIB, 2);
	mts_resv_run_read(&srv.reg, r, false, false, 5 * MIB, 1);
	cr_assert_eq(r->peak, 50 * MIB);
	/* Not in the counted figures: the node's figure holds it. */
	cr_assert_eq(srv.reg.totals.reserved, 10 * MIB);

	/* Killed without its release: it ends, and its kind learns. */
	mts_resv_run_read(&srv.reg, r, true, false, 0, 0);
	cr_assert_null(resv_of_task("t"));
	uint64_t b;
	cr_assert_eq(
	    mts_kind_learned_for(&srv.reg, "static", 1000, &b, NULL, 0), 0);
	cr_assert_eq(b, plus10(50 * MIB), "learned %llu",
	             (unsigned long long)b);
}

Test(kinds, a_run_until_its_release_outlives_its_steps)
{
	start_fleet(1024 * MIB);
	struct mts_peer peer = fx_peer(getpid(), FX_UID);
	Memtally__V1__Response *resp =
	    admit_by(&peer, 20 * MIB, "steps", "steps", true);
	cr_assert(resp->admit_result->admitted, "%s",
	          resp->admit_result->reason);
	memtally__v1__response__free_unpacked(resp, NULL);

	/* The first step: its worker takes the reservation over, exits. */
	pid_t w = fx_spawn();
	fx_write(fx_register(w, "", "steps"), 30 * MIB);
	mts_core_tick(&srv.reg);
	struct mts_resv *r = resv_of_task("steps");
	cr_assert(r->taken_over && r->until_release);
	fx_kill(w);
	mts_core_tick(&srv.reg);
	cr_assert_eq(resv_of_task("steps"), r,
	             "it ended with its command's first step");
	/* The second, larger: the same run. */
	w = fx_spawn();
	fx_write(fx_register(w, "", "steps"), 60 * MIB);
	mts_core_tick(&srv.reg);
	fx_kill(w);
	mts_core_tick(&srv.reg);
	cr_assert_eq(resv_of_task("steps"), r);
	cr_assert_geq(r->peak, 60 * MIB);

	/* Kept across a restart. */
	unsigned char *d;
	size_t len;
	cr_assert_eq(mts_resv_encode(&srv.reg, &d, &len), 0);
	mts_record_seal(d, len);
	fx_stop();
	mts_policy_free(&pol);
	start_fleet(1024 * MIB);
	uint32_t kept, dropped;
	cr_assert_eq(mts_resv_restore(&srv.reg, d, len, false, &kept, &dropped),
	             0);
	free(d);
	cr_assert_eq(kept, 1);
	r = resv_of_task("steps");
	cr_assert(r && r->until_release && r->taken_over);
	mts_core_tick(&srv.reg);
	cr_assert_eq(resv_of_task("steps"), r, "ended while its run lives");

	/* Its run's release ends it, and its kind learns the larger step. */
	struct mts_peer root = fx_peer(getpid(), 0);
	uint64_t freed;
	char id[MTS_RESV_ID_LEN + 1];
	memcpy(id, r->id, sizeof(id));
	cr_assert_eq(mts_release(&srv.reg, &root, id, "", &freed), 0);
	uint64_t b;
	cr_assert_eq(
	    mts_kind_learned_for(&srv.reg, "steps", FX_UID, &b, NULL, 0), 0);
	cr_assert_geq(b, plus10(60 * MIB), "learned %llu",
	              (unsigned long long)b);
}

Test(kinds, a_run_read_only_in_part_teaches_nothing)
{
	start_fleet(0);
	grant(1000, 10 * MIB, "many", "t");
	struct mts_resv *r = resv_of_task("t");
	mts_resv_run_read(&srv.reg, r, false, false, 20 * MIB, 3);
	cr_assert_eq(r->peak, 20 * MIB);
	/* Its uid's budget ran out before the walk's end: what was read
	 * is less than it holds. */
	mts_resv_run_read(&srv.reg, r, false, true, 30 * MIB, 256);
	mts_resv_run_read(&srv.reg, r, false, false, 40 * MIB, 3);
	cr_assert(r->tree_run && r->tree_cut);
	cr_assert_eq(r->peak, 0);
	mts_resv_run_read(&srv.reg, r, true, false, 0, 0);
	cr_assert_null(resv_of_task("t"));
	cr_assert_null(mts_kind_find(&srv.reg, "many", 1000));
}
