/*
 * test_server_admit.c - admission arithmetic: grants and denials with
 * their figures and top consumers, group limits, reservations counting
 * until Release, TTL or the end of their task, reconciliation with the
 * task's workers (the fleet counts the larger of reservation and use, not
 * their sum), Release authorisation, and the counters.
 */
#include "test_server_fixture.h"

#include <ctype.h>
#include <poll.h>

static struct mts_policy pol;

static void stop(void)
{
	fx_stop();
	mts_policy_free(&pol);
}

TestSuite(admit, .fini = stop, .timeout = 30);

static void start_fleet(uint64_t fleet)
{
	mts_policy_defaults(&pol);
	pol.fleet_limit = fleet;
	fx_start_policy(&pol);
}

/* Admit as uid 1000, which must be granted; returns the reservation id
 * (a static buffer). */
static const char *grant(uint64_t bytes, const char *group, const char *task,
                         uint32_t ttl)
{
	static char id[64];
	Memtally__V1__Response *r = fx_admit(1000, bytes, group, task, ttl);
	cr_assert_null(r->error);
	cr_assert(r->admit_result->admitted, "denied: %s",
	          r->admit_result->reason);
	snprintf(id, sizeof(id), "%s", r->admit_result->reservation);
	memtally__v1__response__free_unpacked(r, NULL);
	return id;
}

/* An Admit of `bytes` in `group` as `uid` is granted (the reservation is
 * kept) or, if not `want`, denied. */
static void expect_admit(uint32_t uid, uint64_t bytes, const char *group,
                         bool want)
{
	Memtally__V1__Response *r = fx_admit(uid, bytes, group, "", 0);
	cr_assert_null(r->error);
	cr_assert_eq(r->admit_result->admitted, want,
	             "uid %u, %llu bytes in \"%s\": %s", uid,
	             (unsigned long long)bytes, group,
	             want ? r->admit_result->reason : "granted");
	memtally__v1__response__free_unpacked(r, NULL);
}

static Memtally__V1__Response *release(struct mts_peer *peer, const char *id,
                                       const char *token)
{
	Memtally__V1__Request req = MEMTALLY__V1__REQUEST__INIT;
	Memtally__V1__Release rel = MEMTALLY__V1__RELEASE__INIT;
	rel.reservation = (char *)id;
	rel.token = (char *)(token ? token : "");
	req.id = 41;
	req.body_case = MEMTALLY__V1__REQUEST__BODY_RELEASE;
	req.release = &rel;
	return fx_call(peer, &req);
}

Test(admit, grant_deny_release_with_figures)
{
	start_fleet(1024 * MIB);
	const char *id = grant(600 * MIB, "", "", 0);
	cr_assert_eq(strlen(id), 18);
	cr_assert_eq(strncmp(id, "r-", 2), 0);
	for (int i = 2; i < 18; i++)
		cr_assert(isxdigit((unsigned char)id[i]) &&
		          !isupper((unsigned char)id[i]));
	char first[32];
	snprintf(first, sizeof(first), "%s", id);
	cr_assert_eq(fx_fleet().reserved, 600 * MIB, "published at once");

	Memtally__V1__Response *r = fx_admit(1000, 600 * MIB, "", "", 0);
	Memtally__V1__AdmitResult *a = r->admit_result;
	cr_assert_not(a->admitted);
	cr_assert_str_eq(a->reason, "fleet limit: 0 B measured + 600 MiB "
	                            "reserved + 600 MiB requested > 1 GiB");
	cr_assert_eq(a->fleet_bytes, 0);
	cr_assert_eq(a->reserved_bytes, 600 * MIB);
	cr_assert_eq(a->requested_bytes, 600 * MIB);
	cr_assert_eq(a->limit, 1024 * MIB);
	cr_assert_str_eq(a->limit_scope, "fleet");
	cr_assert_str_eq(a->reservation, "");
	memtally__v1__response__free_unpacked(r, NULL);
	cr_assert_eq(srv.reg.adm->stats.admissions, 1);
	cr_assert_eq(srv.reg.adm->stats.denials[MTS_DENY_FLEET_LIMIT], 1);

	/* Exactly up to the limit is within it. */
	const char *id2 = grant(424 * MIB, "", "", 0);
	char second[32];
	snprintf(second, sizeof(second), "%s", id2);
	cr_assert_str_neq(first, second);

	/* Someone else's reservation: refused; the owner's: released. */
	srv.reg.server_uid = 4242;
	struct mts_peer other = fx_peer(getpid(), 1001);
	fx_expect_error(release(&other, first, NULL),
	                MEMTALLY__V1__ERROR_CODE__ERROR_PERMISSION_DENIED);
	cr_assert_eq(srv.reg.adm->stats.auth_denials, 1);
	struct mts_peer owner = fx_peer(getpid(), 1000);
	r = release(&owner, first, NULL);
	cr_assert_null(r->error);
	cr_assert_str_eq(r->released->reservation, first);
	cr_assert_eq(r->released->bytes, 600 * MIB);
	memtally__v1__response__free_unpacked(r, NULL);
	cr_assert_eq(srv.reg.adm->stats.releases, 1);
	fx_expect_error(release(&owner, first, NULL),
	                MEMTALLY__V1__ERROR_CODE__ERROR_NOT_FOUND);
	fx_expect_error(release(&owner, "r-nonsense", NULL),
	                MEMTALLY__V1__ERROR_CODE__ERROR_NOT_FOUND);
	cr_assert_eq(fx_fleet().reserved, 424 * MIB);

	/* Room again. */
	grant(600 * MIB, "", "", 0);
}

Test(admit, denial_counts_measured_bytes_and_lists_top)
{
	start_fleet(1024 * MIB);
	pid_t kid[6];
	uint32_t slot[6];
	for (int i = 0; i < 6; i++) {
		kid[i] = fx_spawn();
		slot[i] = fx_register(kid[i], "g", "");
		fx_write(slot[i], (int64_t)(100 + 20 * i) * (int64_t)MIB);
	}
	mts_core_tick(&srv.reg); /* 100+120+...+200 = 900 MiB */
	Memtally__V1__Response *r = fx_admit(1000, 200 * MIB, "", "", 0);
	Memtally__V1__AdmitResult *a = r->admit_result;
	cr_assert_not(a->admitted);
	cr_assert_eq(a->fleet_bytes, 900 * MIB);
	cr_assert_str_eq(a->reason, "fleet limit: 900 MiB measured + 0 B "
	                            "reserved + 200 MiB requested > 1 GiB");
	cr_assert_eq(a->n_top, 5);
	for (size_t i = 0; i < 5; i++)
		cr_assert_eq(a->top[i]->pid, (uint32_t)kid[5 - i], "top[%zu]",
		             i);
	cr_assert_eq(a->top[0]->bytes, 200 * MIB);
	cr_assert_str_eq(a->measure, "accounted");
	memtally__v1__response__free_unpacked(r, NULL);
	grant(124 * MIB, "", "", 0);
}

Test(admit, group_limit)
{
	mts_policy_defaults(&pol);
	struct mts_group_policy gp = {.name = "etl", .limit = 100 * MIB};
	pol.groups = &gp;
	pol.ngroups = 1;
	fx_start_policy(&pol);
	pol.groups = NULL;
	pol.ngroups = 0;
	grant(80 * MIB, "etl", "", 0);
	Memtally__V1__Response *r = fx_admit(1000, 30 * MIB, "etl", "", 0);
	Memtally__V1__AdmitResult *a = r->admit_result;
	cr_assert_not(a->admitted);
	cr_assert_str_eq(a->limit_scope, "group:etl");
	cr_assert_str_eq(a->reason, "group limit (etl): 0 B measured + 80 MiB "
	                            "reserved + 30 MiB requested > 100 MiB");
	cr_assert_eq(a->limit, 100 * MIB);
	cr_assert_eq(a->reserved_bytes, 80 * MIB);
	memtally__v1__response__free_unpacked(r, NULL);
	cr_assert_eq(srv.reg.adm->stats.denials[MTS_DENY_GROUP_LIMIT], 1);
	/* No fleet limit and no limit on "web": a missing limit never
	 * denies. */
	grant(30 * MIB, "web", "", 0);
	grant(UINT64_C(1) << 50, "", "", 0);
	/* Reserved bytes show per group. */
	cr_assert_eq(mts_find_group(&srv.reg, "etl")->reserved, 80 * MIB);
	cr_assert_eq(mts_find_group(&srv.reg, "etl")->reservations, 1);
	cr_assert_eq(mts_find_group(&srv.reg, "web")->reserved, 30 * MIB);
}

/* The decision alone: the same answers as Admit, and nothing changes. */
Test(admit, decide_changes_nothing)
{
	mts_policy_defaults(&pol);
	struct mts_group_policy gp = {.name = "etl", .limit = 100 * MIB};
	pol.groups = &gp;
	pol.ngroups = 1;
	pol.fleet_limit = 1024 * MIB;
	pol.max_resv_per_uid = 2;
	fx_start_policy(&pol);
	pol.groups = NULL;
	pol.ngroups = 0;
	srv.reg.server_uid = 4242;
	grant(80 * MIB, "etl", "", 0);
	grant(800 * MIB, "web", "", 0);

	struct mts_registry before = srv.reg;
	struct mts_admission adm_before = *srv.reg.adm;
	struct mts_peer p1000 = fx_peer(getpid(), 1000);
	struct mts_peer p1001 = fx_peer(getpid(), 1001);
	struct mts_admit_out out;

	/* uid 1000 holds 2 = its cap: the cap decides first. */
	mts_admit_decide(&srv.reg, &p1000, "etl", 1, &out);
	cr_assert_not(out.admitted);
	cr_assert_eq(out.reason, MTS_DENY_UID_CAP);
	cr_assert_str_eq(out.scope, "uid:1000");

	/* Fleet: 880 reserved + 200 > 1024 MiB. */
	mts_admit_decide(&srv.reg, &p1001, "web", 200 * MIB, &out);
	cr_assert_not(out.admitted);
	cr_assert_eq(out.reason, MTS_DENY_FLEET_LIMIT);
	cr_assert_str_eq(out.scope, "fleet");
	cr_assert_eq(out.reserved, 880 * MIB);
	cr_assert_eq(out.requested, 200 * MIB);

	/* Group: within the fleet, over etl's 100 MiB. */
	mts_admit_decide(&srv.reg, &p1001, "etl", 30 * MIB, &out);
	cr_assert_not(out.admitted);
	cr_assert_eq(out.reason, MTS_DENY_GROUP_LIMIT);
	cr_assert_str_eq(out.scope, "group:etl");
	cr_assert_eq(out.limit, 100 * MIB);
	cr_assert_str_eq(out.why, "group limit (etl): 0 B measured + 80 MiB "
	                          "reserved + 30 MiB requested > 100 MiB");

	/* Room: admitted, with the fleet's figures. */
	mts_admit_decide(&srv.reg, &p1001, "etl", 20 * MIB, &out);
	cr_assert(out.admitted);
	cr_assert_str_eq(out.scope, "fleet");
	cr_assert_eq(out.limit, 1024 * MIB);

	/* Nothing was reserved, counted or denied by deciding. */
	cr_assert_eq(srv.reg.adm->nresv, adm_before.nresv);
	cr_assert_eq(srv.reg.totals.reserved, before.totals.reserved);
	cr_assert_eq(srv.reg.adm->stats.admissions,
	             adm_before.stats.admissions);
	for (int d = 0; d < MTS_DENY__COUNT; d++)
		cr_assert_eq(srv.reg.adm->stats.denials[d],
		             adm_before.stats.denials[d]);
	cr_assert_eq(mts_find_group(&srv.reg, "etl")->reserved, 80 * MIB);
}

Test(admit, invalid_requests)
{
	start_fleet(0);
	fx_expect_error(fx_admit(1000, 0, "", "", 0),
	                MEMTALLY__V1__ERROR_CODE__ERROR_INVALID_REQUEST);
	fx_expect_error(fx_admit(1000, 10, "a\nb", "", 0),
	                MEMTALLY__V1__ERROR_CODE__ERROR_INVALID_REQUEST);
	fx_expect_error(fx_admit(1000, 10, "", "t\x7f", 0),
	                MEMTALLY__V1__ERROR_CODE__ERROR_INVALID_REQUEST);
	cr_assert_eq(srv.reg.adm->stats.denials[MTS_DENY_INVALID], 3);
	cr_assert_eq(srv.reg.adm->nresv, 0);
}

Test(admit, ttl_default_cap_and_expiry)
{
	mts_policy_defaults(&pol);
	pol.default_ttl_s = 30;
	pol.max_ttl_s = 60;
	fx_start_policy(&pol);
	Memtally__V1__Response *r = fx_admit(1000, 10, "", "", 0);
	cr_assert_eq(r->admit_result->ttl_seconds, 30);
	memtally__v1__response__free_unpacked(r, NULL);
	r = fx_admit(1000, 20, "", "", 1000);
	cr_assert_eq(r->admit_result->ttl_seconds, 60, "capped by max_ttl");
	memtally__v1__response__free_unpacked(r, NULL);
	r = fx_admit(1000, 40, "", "", 1);
	cr_assert_eq(r->admit_result->ttl_seconds, 1);
	memtally__v1__response__free_unpacked(r, NULL);
	mts_core_tick(&srv.reg);
	cr_assert_eq(srv.reg.totals.reserved, 70);

	/* Ticks move the clock in steps: 2 s, 45 s, 90 s later. */
	uint64_t now = mts_now_monotonic();
	mts_resv_tick(&srv.reg, now + 2000000000ull);
	cr_assert_eq(srv.reg.totals.reserved, 30);
	cr_assert_eq(srv.reg.adm->stats.expirations, 1);
	mts_resv_tick(&srv.reg, now + 45000000000ull);
	cr_assert_eq(srv.reg.totals.reserved, 20);
	mts_resv_tick(&srv.reg, now + 90000000000ull);
	cr_assert_eq(srv.reg.totals.reserved, 0);
	cr_assert_eq(srv.reg.adm->stats.expirations, 3);
	cr_assert_eq(srv.reg.adm->nresv, 0);
	cr_assert_null(mts_find_group(&srv.reg, "default"),
	               "an empty group entry was kept");
}

Test(admit, a_max_ttl_lowered_by_a_reload_holds_for_reservations_held)
{
	mts_policy_defaults(&pol);
	pol.default_ttl_s = 600;
	pol.max_ttl_s = 86400;
	fx_start_policy(&pol);
	grant(10, "", "", 600);
	grant(20, "", "T", 600);
	pid_t w = fx_spawn();
	uint32_t s = fx_register_as(w, 1000, "g", "T");
	fx_write(s, 5);
	mts_core_tick(&srv.reg);
	cr_assert(srv.reg.adm->resv[1]->taken_over ||
	          srv.reg.adm->resv[0]->taken_over);
	/* Lowered to 5 s: both end 5 s after their grant, as a restart
	 * with it would have them (before, they kept 600 s and a day). */
	pol.max_ttl_s = 5;
	pol.default_ttl_s = 5;
	cr_assert_eq(mts_server_apply_policy(&srv, &pol), 0);
	uint64_t now = mts_now_monotonic();
	mts_resv_tick(&srv.reg, now + 2000000000ull);
	cr_assert_eq(srv.reg.adm->nresv, 2);
	mts_resv_tick(&srv.reg, now + 6000000000ull);
	cr_assert_eq(srv.reg.adm->nresv, 0, "%u held past the new max_ttl",
	             srv.reg.adm->nresv);
	cr_assert_eq(srv.reg.totals.reserved, 0);
	fx_kill(w);
}

Test(admit, expiry_in_a_real_tick)
{
	start_fleet(100);
	grant(100, "", "", 1);
	expect_admit(1000, 1, "", false);
	/* Its one-second TTL runs out on the clock a real tick reads. */
	uint64_t end = fx_deadline_ms(10000);
	while (srv.reg.adm->stats.expirations == 0) {
		cr_assert_lt(fx_ms(), end, "the reservation never expired");
		poll(NULL, 0, 20);
		mts_core_tick(&srv.reg);
	}
	cr_assert_eq(srv.reg.adm->stats.expirations, 1);
	cr_assert_eq(fx_fleet().reserved, 0);
	grant(100, "", "", 0);
}

Test(admit, reconciled_with_the_tasks_workers)
{
	start_fleet(1024 * MIB);
	grant(500 * MIB, "", "T", 0);
	pid_t w = fx_spawn();
	uint32_t sw = fx_register(w, "g", "T");
	fx_write(sw, 200 * MIB);
	mts_core_tick(&srv.reg);
	/* The fleet counts max(500, 200) = 500, not 700. */
	cr_assert_eq(srv.reg.totals.bytes, 200 * MIB);
	cr_assert_eq(srv.reg.totals.reserved, 300 * MIB);
	struct mtshm_fleet f = fx_fleet();
	cr_assert_eq(f.bytes + f.reserved, 500 * MIB);
	/* So 524 MiB more fit, 525 do not. */
	expect_admit(1000, 525 * MIB, "", false);

	/* The worker grows past its reservation: use counts, reserve 0. */
	fx_write(sw, 700 * MIB);
	mts_core_tick(&srv.reg);
	cr_assert_eq(srv.reg.totals.reserved, 0);
	cr_assert_eq(srv.reg.adm->nresv, 1);

	/* Taken over: the TTL no longer ends it. */
	mts_resv_tick(&srv.reg, mts_now_monotonic() + 3600000000000ull);
	cr_assert_eq(srv.reg.adm->nresv, 1);
	cr_assert_eq(srv.reg.adm->stats.expirations, 0);

	/* The task's last worker exits: the reservation ends. */
	fx_kill(w);
	mts_core_tick(&srv.reg);
	cr_assert_eq(srv.reg.adm->nresv, 0);
	cr_assert_eq(srv.reg.adm->stats.fulfilled, 1);
	cr_assert_eq(fx_fleet().reserved, 0);
}

Test(admit, task_reservations_oldest_first_and_brief_workers)
{
	start_fleet(0);
	grant(100, "", "T", 0);
	grant(50, "", "T", 0);
	grant(70, "", "U", 0);
	pid_t a = fx_spawn(), b = fx_spawn();
	uint32_t sa = fx_register(a, "g", "T");
	uint32_t sb = fx_register(b, "g", "T");
	fx_write(sa, 60);
	fx_write(sb, 60);
	mts_core_tick(&srv.reg);
	/* T's workers use 120: the older (100) is used up, the newer has
	 * 30 left; U's untouched. */
	cr_assert_eq(srv.reg.totals.reserved, 30 + 70);
	fx_kill(a);
	mts_core_tick(&srv.reg);
	cr_assert_eq(srv.reg.totals.reserved, 40 + 50 + 70);
	cr_assert_eq(srv.reg.adm->nresv, 3, "one worker of T is still alive");
	fx_kill(b);
	mts_core_tick(&srv.reg);
	cr_assert_eq(srv.reg.adm->nresv, 1);
	cr_assert_eq(srv.reg.totals.reserved, 70);

	/* A worker of U that registers and exits between two ticks still
	 * ends U's reservation. */
	pid_t c = fx_spawn();
	fx_register(c, "g", "U");
	fx_kill(c);
	mts_core_tick(&srv.reg);
	cr_assert_eq(srv.reg.adm->nresv, 0);
	cr_assert_eq(srv.reg.adm->stats.fulfilled, 3);
}

Test(admit, release_authorisation)
{
	mts_policy_defaults(&pol);
	pol.tcp_token = strdup("a-long-enough-secret");
	pol.has_admin_gid = true;
	pol.admin_gid = 777;
	fx_start_policy(&pol);
	srv.reg.server_uid = 4242;
	struct mts_peer stranger = fx_peer(getpid(), 1001);
	struct mts_peer admin = fx_peer(getpid(), 1002);
	admin.gid = 777;
	struct mts_peer root = fx_peer(getpid(), 0);
	struct mts_peer server = fx_peer(getpid(), 4242);
	struct mts_peer tcp = {.fd = -1, .tcp = true};
	const struct mts_peer *ok[] = {&admin, &root, &server};
	for (int i = 0; i < 3; i++) {
		const char *id = grant(10, "", "", 0);
		char copy[32];
		snprintf(copy, sizeof(copy), "%s", id);
		fx_expect_error(
		    release(&stranger, copy, NULL),
		    MEMTALLY__V1__ERROR_CODE__ERROR_PERMISSION_DENIED);
		fx_expect_error(
		    release(&tcp, copy, NULL),
		    MEMTALLY__V1__ERROR_CODE__ERROR_PERMISSION_DENIED);
		struct mts_peer p = *ok[i];
		Memtally__V1__Response *r = release(&p, copy, NULL);
		cr_assert_null(r->error, "peer %d refused", i);
		memtally__v1__response__free_unpacked(r, NULL);
	}
	/* The token works on any transport. */
	const char *id = grant(10, "", "", 0);
	char copy[32];
	snprintf(copy, sizeof(copy), "%s", id);
	Memtally__V1__Response *r = release(&tcp, copy, "a-long-enough-secret");
	cr_assert_null(r->error);
	memtally__v1__response__free_unpacked(r, NULL);

	/* A TCP peer of unknown uid needs the token even to Admit. */
	Memtally__V1__Request req = MEMTALLY__V1__REQUEST__INIT;
	Memtally__V1__Admit a = MEMTALLY__V1__ADMIT__INIT;
	a.bytes = 5;
	req.body_case = MEMTALLY__V1__REQUEST__BODY_ADMIT;
	req.admit = &a;
	fx_expect_error(fx_call(&tcp, &req),
	                MEMTALLY__V1__ERROR_CODE__ERROR_PERMISSION_DENIED);
	cr_assert_eq(srv.reg.adm->nresv, 0);

	/* A TCP peer the kernel named (sock_diag) owns what it reserves,
	 * like a Unix peer of that uid: another uid over either transport
	 * may not release it, the owner may, without a token. */
	struct mts_peer tcp_owner = {
	    .fd = -1, .tcp = true, .has_cred = true, .uid = 1003, .gid = ~0u};
	struct mts_peer tcp_other = tcp_owner;
	tcp_other.uid = 1001;
	r = fx_call(&tcp_owner, &req);
	cr_assert(r->admit_result->admitted);
	snprintf(copy, sizeof(copy), "%s", r->admit_result->reservation);
	memtally__v1__response__free_unpacked(r, NULL);
	fx_expect_error(release(&stranger, copy, NULL),
	                MEMTALLY__V1__ERROR_CODE__ERROR_PERMISSION_DENIED);
	fx_expect_error(release(&tcp_other, copy, NULL),
	                MEMTALLY__V1__ERROR_CODE__ERROR_PERMISSION_DENIED);
	fx_expect_error(release(&tcp, copy, NULL),
	                MEMTALLY__V1__ERROR_CODE__ERROR_PERMISSION_DENIED);
	r = release(&tcp_owner, copy, NULL);
	cr_assert_null(r->error);
	memtally__v1__response__free_unpacked(r, NULL);
	cr_assert_eq(srv.reg.adm->nresv, 0);

	/* With the token (in the envelope) an unidentified peer may Admit;
	 * what it reserves belongs to all such peers, not to a uid. */
	req.token = (char *)"a-long-enough-secret";
	r = fx_call(&tcp, &req);
	cr_assert(r->admit_result->admitted);
	snprintf(copy, sizeof(copy), "%s", r->admit_result->reservation);
	memtally__v1__response__free_unpacked(r, NULL);
	fx_expect_error(release(&tcp_other, copy, NULL),
	                MEMTALLY__V1__ERROR_CODE__ERROR_PERMISSION_DENIED);
	r = release(&tcp, copy, "a-long-enough-secret");
	cr_assert_null(r->error);
	memtally__v1__response__free_unpacked(r, NULL);
	cr_assert_eq(srv.reg.adm->nresv, 0);
}

Test(admit, many_ids_are_distinct)
{
	start_fleet(0);
	enum { N = 500 };
	static char ids[N][32];
	for (int i = 0; i < N; i++)
		snprintf(ids[i], sizeof(ids[i]), "%s", grant(1, "", "", 0));
	for (int i = 0; i < N; i++) {
		cr_assert_not_null(mts_resv_find(&srv.reg, ids[i]));
		for (int j = i + 1; j < N; j++)
			cr_assert_str_neq(ids[i], ids[j]);
	}
	cr_assert_eq(srv.reg.totals.reserved, N);
	cr_assert_eq(srv.reg.totals.reservations, N);
}

/* ---- ownership: whose workers take a task's reservations over ---------- */

Test(admit, another_uids_workers_neither_take_over_count_nor_end_it)
{
	start_fleet(1024 * MIB);
	srv.reg.server_uid = 4242; /* the test runs as root: not an admin */
	char id[32];
	snprintf(id, sizeof(id), "%s", grant(500 * MIB, "", "T", 60));
	const struct mts_resv *r = mts_resv_find(&srv.reg, id);

	/* uid 1001 names uid 1000's task: it does not take it over ... */
	pid_t w = fx_spawn();
	uint32_t sw = fx_register_as(w, 1001, "g", "T");
	cr_assert_not(r->taken_over, "taken over at registration");
	fx_write(sw, 200 * MIB);
	mts_core_tick(&srv.reg);
	cr_assert_not(r->taken_over, "taken over by another uid's worker");
	/* ... its use does not cancel the reservation out ... */
	cr_assert_eq(srv.reg.totals.bytes, 200 * MIB);
	cr_assert_eq(srv.reg.totals.reserved, 500 * MIB);
	struct mtshm_fleet f = fx_fleet();
	cr_assert_eq(f.bytes + f.reserved, 700 * MIB);
	/* ... and its exit does not end it. */
	fx_kill(w);
	mts_core_tick(&srv.reg);
	cr_assert_eq(srv.reg.adm->nresv, 1, "ended by another uid's worker");
	cr_assert_eq(srv.reg.adm->stats.fulfilled, 0);
	cr_assert_eq(srv.reg.totals.reserved, 500 * MIB);

	/* A brief worker of another uid, gone before any tick saw it, ends
	 * nothing either. */
	pid_t b = fx_spawn();
	fx_register_as(b, 1001, "g", "T");
	fx_kill(b);
	mts_core_tick(&srv.reg);
	cr_assert_eq(srv.reg.adm->nresv, 1);

	/* Its TTL still applies. */
	mts_resv_tick(&srv.reg, mts_now_monotonic() + 61000000000ull);
	cr_assert_eq(srv.reg.adm->nresv, 0);
	cr_assert_eq(srv.reg.adm->stats.expirations, 1);
}

/* A worker of another uid that descends from the process that asked is
 * the asker's command run as another user: it takes the reservation over,
 * its use counts against it, and its exit ends it. Not so under another
 * asker, nor under one that has gone. */
Test(admit, a_worker_of_another_uid_under_its_asker_is_the_owners)
{
	start_fleet(1024 * MIB);
	srv.reg.server_uid = 4242; /* the test runs as root: not an admin */
	fx_asker = getpid();
	char tid[32], id[32];
	snprintf(tid, sizeof(tid), "%s", grant(500 * MIB, "", "T", 60));
	const struct mts_resv *r = mts_resv_find(&srv.reg, tid);
	cr_assert_eq(r->asker_pid, (uint32_t)getpid());
	pid_t w = fx_spawn();
	uint32_t sw = fx_register_as(w, 1001, "g", "T");
	cr_assert(r->taken_over, "its asker's command, run as uid 1001");
	fx_write(sw, 200 * MIB);
	mts_core_tick(&srv.reg);
	cr_assert_eq(srv.reg.totals.reserved, 300 * MIB);
	/* A second uid under the same asker is not pooled with the first. */
	pid_t w2 = fx_spawn();
	fx_register_as(w2, 1002, "g", "T");
	cr_assert_eq(mts_find_pid(&srv.reg, (uint32_t)w2)->task_uid, 1002);

	/* Asked by a process the worker does not descend from (a sibling):
	 * another uid's worker, as before. */
	pid_t sibling = fx_spawn();
	fx_asker = sibling;
	snprintf(id, sizeof(id), "%s", grant(100 * MIB, "", "U", 60));
	const struct mts_resv *u = mts_resv_find(&srv.reg, id);
	fx_register_as(fx_spawn(), 1001, "g", "U");
	cr_assert_not(u->taken_over, "a stranger to its asker took it over");
	fx_kill(sibling);
	/* An asker's pid that names another process now (another start
	 * time) is not the asker. */
	fx_asker = getpid();
	snprintf(id, sizeof(id), "%s", grant(100 * MIB, "", "V", 60));
	struct mts_resv *v = mts_resv_find(&srv.reg, id);
	v->asker_start ^= 1;
	fx_register_as(fx_spawn(), 1001, "g", "V");
	cr_assert_not(v->taken_over, "taken over under another process");

	/* Released, the reservation's worker is its own uid's again: a new
	 * reservation of the task, by no process, is not its to take. */
	snprintf(id, sizeof(id), "%s", grant(100 * MIB, "", "W", 60));
	pid_t w3 = fx_spawn();
	fx_register_as(w3, 1001, "g", "W");
	cr_assert_eq(mts_find_pid(&srv.reg, (uint32_t)w3)->task_uid, 1000);
	struct mts_peer owner = fx_peer(0, 1000);
	Memtally__V1__Response *rel = release(&owner, id, NULL);
	cr_assert_null(rel->error);
	memtally__v1__response__free_unpacked(rel, NULL);
	cr_assert_eq(mts_find_pid(&srv.reg, (uint32_t)w3)->task_uid, 1001);
	fx_asker = 0;
	snprintf(id, sizeof(id), "%s", grant(100 * MIB, "", "W", 60));
	const struct mts_resv *w4 = mts_resv_find(&srv.reg, id);
	mts_core_tick(&srv.reg);
	cr_assert_not(w4->taken_over, "a leftover worker took it over");

	fx_kill(w);
	mts_core_tick(&srv.reg);
	cr_assert_null(mts_resv_find(&srv.reg, tid), "its command's exit");
	cr_assert_eq(srv.reg.adm->stats.fulfilled, 1);
}

/* An Admit of task T, 100 MiB, by the test's process, `again` or not:
 * its reservation's id. */
static const char *admit_t(bool again, pid_t asker)
{
	static char id[64];
	Memtally__V1__Request req = MEMTALLY__V1__REQUEST__INIT;
	Memtally__V1__Admit a = MEMTALLY__V1__ADMIT__INIT;
	a.bytes = 100 * MIB;
	a.group = (char *)"";
	a.task = (char *)"T";
	a.again = again;
	req.id = 23;
	req.body_case = MEMTALLY__V1__REQUEST__BODY_ADMIT;
	req.admit = &a;
	struct mts_peer peer = fx_peer(asker, 1000);
	Memtally__V1__Response *r = fx_call(&peer, &req);
	cr_assert_null(r->error);
	cr_assert(r->admit_result->admitted, "%s", r->admit_result->reason);
	snprintf(id, sizeof(id), "%s", r->admit_result->reservation);
	memtally__v1__response__free_unpacked(r, NULL);
	return id;
}

Test(admit, an_ask_again_is_answered_with_its_earlier_grant)
{
	/* A repeat of an ask that went unanswered (Admit.again) gets the
	 * grant that one got, from the same process only; without the mark a
	 * task gets another reservation, as before. */
	start_fleet(1024 * MIB);
	char first[64];
	snprintf(first, sizeof(first), "%s", admit_t(false, getpid()));
	cr_assert_str_eq(admit_t(true, getpid()), first);
	cr_assert_str_eq(admit_t(true, getpid()), first);
	cr_assert_eq(srv.reg.adm->nresv, 1);
	cr_assert_eq(srv.reg.totals.reserved, 100 * MIB);
	/* Another process's repeat is its own ask. */
	pid_t other = fx_spawn();
	cr_assert_str_neq(admit_t(true, other), first);
	cr_assert_eq(srv.reg.adm->nresv, 2);
	/* Not marked: a second reservation of the task, on purpose. */
	cr_assert_str_neq(admit_t(false, getpid()), first);
	cr_assert_eq(srv.reg.adm->nresv, 3);
	/* Taken over by a worker of the task: no longer answered again. */
	pid_t w = fx_spawn();
	fx_register_as(w, 1000, "", "T");
	mts_core_tick(&srv.reg);
	cr_assert_str_neq(admit_t(true, getpid()), first);
	cr_assert_eq(srv.reg.adm->nresv, 4);
}

Test(admit, a_switched_worker_stays_the_owners_while_one_of_its_grants_lasts)
{
	/* Two grants of one task by one asker, whose command runs as uid
	 * 1001: releasing the first leaves the second the owner's, with its
	 * worker counted against it, not ended as if its workers exited. */
	start_fleet(1024 * MIB);
	srv.reg.server_uid = 4242;
	fx_asker = getpid();
	char a[32], b[32];
	snprintf(a, sizeof(a), "%s", grant(100 * MIB, "", "T", 60));
	snprintf(b, sizeof(b), "%s", grant(100 * MIB, "", "T", 60));
	pid_t w = fx_spawn();
	uint32_t sw = fx_register_as(w, 1001, "g", "T");
	fx_write(sw, 50 * MIB);
	mts_core_tick(&srv.reg);
	cr_assert_eq(mts_find_pid(&srv.reg, (uint32_t)w)->task_uid, 1000);
	struct mts_peer owner = fx_peer(0, 1000);
	Memtally__V1__Response *rel = release(&owner, a, NULL);
	cr_assert_null(rel->error);
	memtally__v1__response__free_unpacked(rel, NULL);
	mts_core_tick(&srv.reg);
	cr_assert_eq(mts_find_pid(&srv.reg, (uint32_t)w)->task_uid, 1000,
	             "its worker left the owner's share");
	cr_assert_not_null(mts_resv_find(&srv.reg, b),
	                   "the second grant ended with its task running");
	cr_assert_eq(srv.reg.adm->stats.fulfilled, 0);
	fx_asker = 0;
}

Test(admit, the_owners_worker_takes_over_beside_another_uids)
{
	start_fleet(0);
	srv.reg.server_uid = 4242;
	char id[32];
	snprintf(id, sizeof(id), "%s", grant(500 * MIB, "", "T", 60));
	const struct mts_resv *r = mts_resv_find(&srv.reg, id);
	pid_t stranger = fx_spawn(), owner = fx_spawn();
	uint32_t ss = fx_register_as(stranger, 1001, "g", "T");
	fx_write(ss, 300 * MIB);
	mts_core_tick(&srv.reg);
	uint32_t so = fx_register_as(owner, 1000, "g", "T");
	cr_assert(r->taken_over, "the owner's worker takes it over at once");
	fx_write(so, 100 * MIB);
	mts_core_tick(&srv.reg);
	/* Only the owner's 100 MiB count against it. */
	cr_assert_eq(srv.reg.totals.reserved, 400 * MIB);
	/* The stranger's exit changes nothing; the owner's ends it. */
	fx_kill(stranger);
	mts_core_tick(&srv.reg);
	cr_assert_eq(srv.reg.totals.reserved, 400 * MIB);
	cr_assert_eq(srv.reg.adm->nresv, 1);
	fx_kill(owner);
	mts_core_tick(&srv.reg);
	cr_assert_eq(srv.reg.adm->nresv, 0);
	cr_assert_eq(srv.reg.adm->stats.fulfilled, 1);
}

Test(admit, admins_workers_take_over_anyones)
{
	mts_policy_defaults(&pol);
	pol.has_admin_uid = true;
	pol.admin_uid = 3000;
	pol.has_admin_gid = true;
	pol.admin_gid = (uint32_t)getegid(); /* the children's group */
	fx_start_policy(&pol);
	srv.reg.server_uid = 4242;
	/* Root, the server's uid, admin_uid, and a uid whose worker is in
	 * admin_gid: each takes over, counts against and ends uid 1000's
	 * reservation. */
	const uint32_t admins[] = {0, 4242, 3000, 1002};
	for (unsigned i = 0; i < 4; i++) {
		char id[32];
		snprintf(id, sizeof(id), "%s", grant(100, "", "T", 60));
		const struct mts_resv *r = mts_resv_find(&srv.reg, id);
		pid_t w = fx_spawn();
		uint32_t s = fx_register_as(w, admins[i], "g", "T");
		cr_assert(r->taken_over, "admin %u did not take over",
		          admins[i]);
		fx_write(s, 30);
		mts_core_tick(&srv.reg);
		cr_assert_eq(srv.reg.totals.reserved, 70, "admin %u",
		             admins[i]);
		fx_kill(w);
		mts_core_tick(&srv.reg);
		cr_assert_eq(srv.reg.adm->nresv, 0, "admin %u did not end it",
		             admins[i]);
	}
	cr_assert_eq(srv.reg.adm->stats.fulfilled, 4);

	/* Not in admin_gid: no admin. The flag is recomputed when the
	 * policy changes. */
	pol.admin_gid = (uint32_t)getegid() + 1000;
	cr_assert_eq(mts_server_apply_policy(&srv, &pol), 0);
	grant(100, "", "T", 60);
	pid_t w = fx_spawn();
	uint32_t s = fx_register_as(w, 1002, "g", "T");
	fx_write(s, 30);
	mts_core_tick(&srv.reg);
	cr_assert_eq(srv.reg.totals.reserved, 100);
	cr_assert_eq(srv.reg.adm->resv[0]->taken_over, false);
}

/* Admit `bytes` for task T as `uid` (its peer in group `gid`) in `group`,
 * which must be granted; its reservation. */
static const struct mts_resv *grant_gid(uint32_t uid, uint32_t gid,
                                        uint64_t bytes, const char *group)
{
	Memtally__V1__Request req = MEMTALLY__V1__REQUEST__INIT;
	Memtally__V1__Admit a = MEMTALLY__V1__ADMIT__INIT;
	a.bytes = bytes;
	a.group = (char *)group;
	a.task = "T";
	a.ttl_seconds = 60;
	req.id = 22;
	req.body_case = MEMTALLY__V1__REQUEST__BODY_ADMIT;
	req.admit = &a;
	struct mts_peer peer = fx_peer(fx_asker, uid);
	peer.gid = gid;
	Memtally__V1__Response *r = fx_call(&peer, &req);
	cr_assert_null(r->error);
	cr_assert(r->admit_result->admitted, "uid %u denied: %s", uid,
	          r->admit_result->reason);
	const struct mts_resv *v =
	    mts_resv_find(&srv.reg, r->admit_result->reservation);
	memtally__v1__response__free_unpacked(r, NULL);
	cr_assert_not_null(v);
	return v;
}

static const struct mts_resv *grant_as(uint32_t uid, uint64_t bytes,
                                       const char *group)
{
	return grant_gid(uid, uid, bytes, group);
}

Test(admit, admins_workers_count_against_admins_reservations_first)
{
	/* Anyone may name any task. nobody's reservation for root's task,
	 * made first, took root's worker's 80 MiB for itself, so root's own
	 * reservation counted in full beside them and root was denied in
	 * its own group. */
	start_fleet(0);
	srv.reg.server_uid = 4242;
	const struct mts_resv *theirs = grant_as(65534, 100 * MIB, "gb");
	const struct mts_resv *roots = grant_as(0, 100 * MIB, "ga");
	pid_t w = fx_spawn();
	uint32_t s = fx_register_as(w, 0, "ga", "T");
	fx_write(s, 80 * MIB);
	mts_core_tick(&srv.reg);
	cr_assert_eq(roots->effective, 20 * MIB);
	cr_assert_eq(theirs->effective, 100 * MIB);
	cr_assert_eq(srv.reg.totals.reserved, 120 * MIB);
	/* What root's worker uses past root's reservation is still set
	 * against the others' (an admin's worker may act on any). */
	fx_write(s, 150 * MIB);
	mts_core_tick(&srv.reg);
	cr_assert_eq(roots->effective, 0);
	cr_assert_eq(theirs->effective, 50 * MIB);
	fx_kill(w);
	mts_core_tick(&srv.reg);
}

Test(admit, a_gid_admins_workers_count_against_its_reservations_first)
{
	/* The same, with an admin by admin_gid: its uid (1002) says
	 * nothing, its asker's groups do. */
	mts_policy_defaults(&pol);
	pol.has_admin_gid = true;
	pol.admin_gid = (uint32_t)getegid(); /* the workers' group */
	fx_start_policy(&pol);
	srv.reg.server_uid = 4242;
	const struct mts_resv *theirs = grant_as(65534, 100 * MIB, "gb");
	const struct mts_resv *mine =
	    grant_gid(1002, (uint32_t)getegid(), 100 * MIB, "ga");
	pid_t w = fx_spawn();
	uint32_t s = fx_register_as(w, 1002, "ga", "T");
	fx_write(s, 80 * MIB);
	mts_core_tick(&srv.reg);
	cr_assert_eq(mine->effective, 20 * MIB);
	cr_assert_eq(theirs->effective, 100 * MIB);
	fx_kill(w);
	mts_core_tick(&srv.reg);
}

Test(admit, a_reservation_made_over_tcp_is_matched_by_any_worker)
{
	start_fleet(0);
	srv.reg.server_uid = 4242;
	struct mts_peer tcp = {.fd = -1, .tcp = true};
	struct mts_admit_req req = {.bytes = 100, .task = "T", .ttl_s = 60};
	struct mts_admit_out out;
	cr_assert_eq(mts_admit(&srv.reg, &tcp, &req, &out), 0);
	cr_assert(out.admitted);
	pid_t w = fx_spawn();
	uint32_t s = fx_register_as(w, 1001, "g", "T");
	fx_write(s, 40);
	mts_core_tick(&srv.reg);
	cr_assert(mts_resv_find(&srv.reg, out.id)->taken_over);
	cr_assert_eq(srv.reg.totals.reserved, 60);
	fx_kill(w);
	mts_core_tick(&srv.reg);
	cr_assert_eq(srv.reg.adm->nresv, 0);
}

/* ---- the per-uid reservation cap ---------------------------------------- */

Test(admit, per_uid_cap_stops_that_uid_only)
{
	mts_policy_defaults(&pol);
	cr_assert_eq(pol.max_resv_per_uid, MTS_DEFAULT_MAX_RESV_PER_UID);
	pol.max_resv_per_uid = 3;
	fx_start_policy(&pol);
	srv.reg.server_uid = 4242;
	char ids[3][32];
	for (int i = 0; i < 3; i++)
		snprintf(ids[i], sizeof(ids[i]), "%s", grant(10, "", "", 0));
	Memtally__V1__Response *r = fx_admit(1000, 10, "", "", 0);
	cr_assert_null(r->error);
	Memtally__V1__AdmitResult *a = r->admit_result;
	cr_assert_not(a->admitted);
	cr_assert_str_eq(a->limit_scope, "uid:1000");
	cr_assert(strstr(a->reason, "per-uid reservation cap") &&
	              strstr(a->reason, "max_reservations_per_uid = 3"),
	          "%s", a->reason);
	cr_assert_str_eq(a->reservation, "");
	memtally__v1__response__free_unpacked(r, NULL);
	cr_assert_eq(srv.reg.adm->stats.denials[MTS_DENY_UID_CAP], 1);
	cr_assert_str_eq(mts_denial_name(MTS_DENY_UID_CAP), "uid_reservations");
	cr_assert_eq(srv.reg.adm->nresv, 3);

	/* Another uid is not stopped; nor is an admin (exempt). */
	expect_admit(1001, 10, "", true);
	for (int i = 0; i < 5; i++) {
		expect_admit(0, 10, "", true);
	}

	/* One ends (Release; TTL and task end go the same way): room for
	 * one more. */
	struct mts_peer owner = fx_peer(getpid(), 1000);
	r = release(&owner, ids[0], NULL);
	cr_assert_null(r->error);
	memtally__v1__response__free_unpacked(r, NULL);
	grant(10, "", "", 0);
	expect_admit(1000, 10, "", false);

	/* TCP peers are one bucket. */
	struct mts_peer tcp = {.fd = -1, .tcp = true};
	struct mts_admit_req req = {.bytes = 1};
	struct mts_admit_out out;
	for (int i = 0; i < 3; i++) {
		cr_assert_eq(mts_admit(&srv.reg, &tcp, &req, &out), 0);
		cr_assert(out.admitted);
	}
	cr_assert_eq(mts_admit(&srv.reg, &tcp, &req, &out), 0);
	cr_assert_not(out.admitted);
	cr_assert_eq(out.reason, MTS_DENY_UID_CAP);
	cr_assert_str_eq(out.scope, "tcp");
	/* But a request carrying the token is trusted as an admin's (the
	 * token gives admin rights): a remote scheduler holding it is not
	 * held to one uid's share. */
	free(pol.tcp_token);
	pol.tcp_token = strdup("a-long-enough-secret");
	cr_assert_eq(mts_server_apply_policy(&srv, &pol), 0);
	Memtally__V1__Request env = MEMTALLY__V1__REQUEST__INIT;
	Memtally__V1__Admit body = MEMTALLY__V1__ADMIT__INIT;
	body.bytes = 1;
	env.body_case = MEMTALLY__V1__REQUEST__BODY_ADMIT;
	env.admit = &body;
	env.token = (char *)"a-long-enough-secret";
	r = fx_call(&tcp, &env);
	cr_assert_null(r->error);
	cr_assert(r->admit_result->admitted, "%s", r->admit_result->reason);
	memtally__v1__response__free_unpacked(r, NULL);
	/* The flag lives for that request only. */
	cr_assert_not(tcp.token_ok);

	/* Off: no cap but MTS_RESV_MAX. */
	pol.max_resv_per_uid = 0;
	cr_assert_eq(mts_server_apply_policy(&srv, &pol), 0);
	grant(10, "", "", 0);
	cr_assert_eq(mts_uid_count_get(&srv.reg.adm->resv_uids, 1000), 4);
}

/* A group whose section lists uids: an Admit naming it by another uid is
 * denied (group_not_allowed) and changes nothing; the listed uid and root
 * are granted. */
Test(admit, group_not_allowed)
{
	mts_policy_defaults(&pol);
	uint32_t uids[] = {2000};
	struct mts_group_policy gp = {.name = "etl", .uids = uids, .nuids = 1};
	pol.groups = &gp;
	pol.ngroups = 1;
	fx_start_policy(&pol);
	pol.groups = NULL;
	pol.ngroups = 0;
	Memtally__V1__Response *r = fx_admit(1000, MIB, "etl", "", 0);
	cr_assert_null(r->error);
	cr_assert_not(r->admit_result->admitted);
	cr_assert_str_eq(r->admit_result->limit_scope, "group:etl");
	cr_assert(strstr(r->admit_result->reason, "group not allowed"), "%s",
	          r->admit_result->reason);
	memtally__v1__response__free_unpacked(r, NULL);
	cr_assert_eq(srv.reg.adm->stats.denials[MTS_DENY_GROUP_NOT_ALLOWED], 1);
	cr_assert_eq(srv.reg.adm->nresv, 0);
	cr_assert_str_eq(mts_denial_name(MTS_DENY_GROUP_NOT_ALLOWED),
	                 "group_not_allowed");

	expect_admit(2000, MIB, "etl", true);
	expect_admit(0, MIB, "etl", true);
	cr_assert_eq(mts_find_group(&srv.reg, "etl")->reservations, 2);

	/* A TCP peer: denied, unless its request carries the token (admin
	 * rights: admins may join any group). */
	free(pol.tcp_token);
	pol.tcp_token = strdup("a-long-enough-secret");
	pol.groups = &gp;
	pol.ngroups = 1;
	cr_assert_eq(mts_server_apply_policy(&srv, &pol), 0);
	pol.groups = NULL;
	pol.ngroups = 0;
	struct mts_peer tcp = {.fd = -1, .tcp = true};
	Memtally__V1__Request env = MEMTALLY__V1__REQUEST__INIT;
	Memtally__V1__Admit body = MEMTALLY__V1__ADMIT__INIT;
	body.bytes = MIB;
	body.group = (char *)"etl";
	env.body_case = MEMTALLY__V1__REQUEST__BODY_ADMIT;
	env.admit = &body;
	env.token = (char *)"wrong-but-long-enough";
	r = fx_call(&tcp, &env);
	cr_assert_not_null(r->error,
	                   "a TCP peer with a wrong token joined etl");
	cr_assert(strstr(r->error->message,
	                 "the token this request carries is not it"),
	          "%s", r->error->message);
	memtally__v1__response__free_unpacked(r, NULL);
	env.token = (char *)"a-long-enough-secret";
	r = fx_call(&tcp, &env);
	cr_assert_null(r->error, "%s", r->error ? r->error->message : "");
	cr_assert(r->admit_result->admitted, "%s", r->admit_result->reason);
	memtally__v1__response__free_unpacked(r, NULL);
	cr_assert_eq(mts_find_group(&srv.reg, "etl")->reservations, 3);
}

/* Outstanding reserved bytes per uid: past the cap Admit is denied
 * (uid_reserved_bytes); another uid and root are not held back; a Release
 * gives the room back. A percentage is of the fleet limit. */
Test(admit, reserved_bytes_per_uid)
{
	mts_policy_defaults(&pol);
	pol.resv_bytes_per_uid = 100 * MIB;
	fx_start_policy(&pol);
	char id[64];
	snprintf(id, sizeof(id), "%s", grant(60 * MIB, "", "", 0));
	Memtally__V1__Response *r = fx_admit(1000, 50 * MIB, "", "", 0);
	cr_assert_not(r->admit_result->admitted);
	cr_assert_str_eq(r->admit_result->limit_scope, "uid:1000");
	cr_assert_eq(r->admit_result->limit, 100 * MIB);
	cr_assert_eq(r->admit_result->reserved_bytes, 60 * MIB);
	memtally__v1__response__free_unpacked(r, NULL);
	cr_assert_eq(srv.reg.adm->stats.denials[MTS_DENY_UID_BYTES], 1);
	expect_admit(2000, 100 * MIB, "", true);
	expect_admit(0, 500 * MIB, "", true);
	/* 40 MiB fit exactly. */
	grant(40 * MIB, "", "", 0);
	expect_admit(1000, 1, "", false);
	struct mts_peer owner = fx_peer(getpid(), 1000);
	r = release(&owner, id, NULL);
	cr_assert_null(r->error);
	memtally__v1__response__free_unpacked(r, NULL);
	grant(60 * MIB, "", "", 0);

	/* 25% of a 1 GiB fleet: 256 MiB. Of the limit in force (a
	 * SetLimit's), not the file's: with `fleet = none` in the file and
	 * 1 GiB set at run time, one uid reserved 1000 MiB of it (found in
	 * review), and the kinds' default was the no-limit one. */
	srv.reg.policy.resv_bytes_per_uid = 0;
	srv.reg.policy.resv_bytes_bp = 2500;
	srv.reg.policy.fleet_limit = 0;
	srv.reg.totals.limit = 1024 * MIB;
	r = fx_admit(3000, 257 * MIB, "", "", 0);
	cr_assert_not(r->admit_result->admitted);
	cr_assert_str_eq(r->admit_result->limit_scope, "uid:3000");
	cr_assert_eq(r->admit_result->limit, 256 * MIB);
	memtally__v1__response__free_unpacked(r, NULL);
	srv.reg.policy.kind_default_size = 0;
	srv.reg.policy.kind_default_bp = 1000;
	cr_assert_eq(mts_kind_default_size(&srv.reg), 1024 * MIB / 10);
	/* And the other way: 100 GiB set over the file's 1 GiB. */
	srv.reg.policy.fleet_limit = 1024 * MIB;
	srv.reg.totals.limit = 100 * 1024 * MIB;
	expect_admit(3000, 2048 * MIB, "", true);
	cr_assert_eq(mts_kind_default_size(&srv.reg), 10 * 1024 * MIB);
}

/* One uid brings at most max_groups_per_uid new group names into
 * existence by its Admits; names that exist, configured groups and other
 * uids are not held back. */
Test(admit, groups_per_uid)
{
	mts_policy_defaults(&pol);
	pol.groups_per_uid = 2;
	fx_start_policy(&pol);
	grant(1, "g1", "", 0);
	grant(1, "g2", "", 0);
	Memtally__V1__Response *r = fx_admit(1000, 1, "g3", "", 0);
	cr_assert_not(r->admit_result->admitted);
	cr_assert(strstr(r->admit_result->reason, "max_groups_per_uid = 2"),
	          "%s", r->admit_result->reason);
	memtally__v1__response__free_unpacked(r, NULL);
	cr_assert_null(mts_find_group(&srv.reg, "g3"));
	grant(1, "g1", "", 0);
	grant(1, "default", "", 0);
	expect_admit(2000, 1, "g3", true);
	cr_assert_eq(mts_uid_count_get(&srv.reg.groups_by_uid, 1000), 2);
	cr_assert_eq(mts_uid_count_get(&srv.reg.groups_by_uid, 2000), 1);
	/* Over loopback TCP, where sock_diag names the peer's uid, the same
	 * uid and the same cap (it passed every cap: found in review). */
	struct mts_peer tcp = {
	    .fd = -1, .tcp = true, .has_cred = true, .uid = 1000, .gid = ~0u};
	struct mts_admit_out out;
	mts_admit_decide(&srv.reg, &tcp, "g4", 1, &out);
	cr_assert_not(out.admitted, "a fourth group over TCP");
	cr_assert(strstr(out.why, "max_groups_per_uid = 2"), "%s", out.why);
	cr_assert_null(mts_find_group(&srv.reg, "g4"));
}

/* A worker naming a group it may not join is registered in default, and
 * the answer says so; one past its uid's slot cap gets no slot. */
Test(admit, worker_group_and_slot_cap)
{
	mts_policy_defaults(&pol);
	uint32_t uids[] = {2000};
	struct mts_group_policy gp = {.name = "etl", .uids = uids, .nuids = 1};
	pol.groups = &gp;
	pol.ngroups = 1;
	pol.slots_per_uid = 2;
	fx_start_policy(&pol);
	pol.groups = NULL;
	pol.ngroups = 0;
	uint32_t s = fx_register(fx_spawn(), "etl", "");
	cr_assert_eq(
	    srv.reg.by_slot[s]->group,
	    (uint32_t)(mts_find_group(&srv.reg, "default") - srv.reg.groups));
	cr_assert_null(mts_find_group(&srv.reg, "etl"), "etl has no process");
	fx_register(fx_spawn(), "", "");
	/* The third of uid 1000: the answer of a full segment. */
	Memtally__V1__Request req = MEMTALLY__V1__REQUEST__INIT;
	Memtally__V1__Register rg = MEMTALLY__V1__REGISTER__INIT;
	rg.group = "";
	rg.task = "";
	rg.image_id = 1;
	req.body_case = MEMTALLY__V1__REQUEST__BODY_REGISTER;
	req.register_ = &rg;
	struct mts_peer peer = fx_peer(fx_spawn(), 1000);
	fx_expect_error(fx_call(&peer, &req),
	                MEMTALLY__V1__ERROR_CODE__ERROR_NO_SLOTS);
	cr_assert_eq(srv.reg.totals.unregistered, 1);
	cr_assert_eq(srv.reg.ndense, 2);
	/* uid 2000 registers, in etl. */
	struct mts_peer p2 = fx_peer(fx_spawn(), 2000);
	Memtally__V1__Response *r = fx_call(&p2, &req);
	cr_assert_null(r->error);
	memtally__v1__response__free_unpacked(r, NULL);
	rg.group = "etl";
	struct mts_peer p3 = fx_peer(fx_spawn(), 2000);
	r = fx_call(&p3, &req);
	cr_assert_null(r->error);
	cr_assert_str_eq(r->registered->group, "etl");
	memtally__v1__response__free_unpacked(r, NULL);
	cr_assert_eq(mts_find_group(&srv.reg, "etl")->processes, 1);
}

/* max_ttl applies to a reservation its task's worker took over. */
Test(admit, max_ttl_after_takeover)
{
	mts_policy_defaults(&pol);
	pol.max_ttl_s = 5;
	fx_start_policy(&pol);
	grant(10 * MIB, "", "T", 1);
	fx_register(fx_spawn(), "", "T"); /* uid 1000: the owner's worker */
	struct mts_resv *r = srv.reg.adm->resv[0];
	cr_assert(r->taken_over);
	uint64_t t0 = r->created_mono_ns;
	/* Past its TTL, within max_ttl: it stays. */
	mts_resv_tick(&srv.reg, t0 + UINT64_C(2) * 1000000000u);
	cr_assert_eq(srv.reg.adm->nresv, 1);
	/* Past max_ttl, its worker alive: it ends. */
	mts_resv_tick(&srv.reg, t0 + UINT64_C(5) * 1000000000u);
	cr_assert_eq(srv.reg.adm->nresv, 0);
	cr_assert_eq(srv.reg.adm->stats.expirations, 1);
}

/* The index of kid i in a ranking by `key` (largest first, equal keys by
 * pid): what a denial's top and ListProcesses must both follow. */
static void ranked(const pid_t *kid, const uint64_t *key, size_t n,
                   size_t *order)
{
	for (size_t i = 0; i < n; i++)
		order[i] = i;
	for (size_t i = 1; i < n; i++)
		for (size_t j = i; j > 0; j--) {
			size_t a = order[j - 1], b = order[j];
			if (key[a] > key[b] ||
			    (key[a] == key[b] && kid[a] < kid[b]))
				break;
			order[j - 1] = b;
			order[j] = a;
		}
}

/* A denial's top and ListProcesses rank processes alike, largest first
 * and equal figures by pid, each by its own figure: the top by what the
 * limits compare (rss here), the list by accounted bytes. */
Test(admit, top_and_list_rank_alike)
{
	mts_policy_defaults(&pol);
	pol.fleet_limit = 1024 * MIB;
	pol.measure = MTS_MEASURE_RSS;
	fx_start_policy(&pol);
	enum { N = 7 };
	/* Ties in both figures, and the two orders disagree. */
	static const uint64_t bytes_mib[N] = {30, 50, 50, 10, 50, 70, 20};
	static const uint64_t rss_mib[N] = {90, 40, 40, 80, 40, 10, 40};
	pid_t kid[N];
	uint64_t bytes[N], rss[N];
	for (int i = 0; i < N; i++) {
		kid[i] = fx_spawn();
		uint32_t slot = fx_register(kid[i], "g", "");
		bytes[i] = bytes_mib[i] * MIB;
		rss[i] = rss_mib[i] * MIB;
		fx_write(slot, (int64_t)bytes[i]);
	}
	mts_core_tick(&srv.reg);
	for (int i = 0; i < N; i++)
		mts_find_pid(&srv.reg, (uint32_t)kid[i])->rss = rss[i];

	size_t order[N];
	ranked(kid, rss, N, order);
	Memtally__V1__Response *r = fx_admit(1000, 2048 * MIB, "", "", 0);
	Memtally__V1__AdmitResult *a = r->admit_result;
	cr_assert_not(a->admitted);
	cr_assert_eq(a->n_top, 5);
	for (size_t i = 0; i < 5; i++)
		cr_assert_eq(a->top[i]->pid, (uint32_t)kid[order[i]],
		             "top[%zu]: pid %u, want %d", i, a->top[i]->pid,
		             kid[order[i]]);
	memtally__v1__response__free_unpacked(r, NULL);

	ranked(kid, bytes, N, order);
	Memtally__V1__Request req = MEMTALLY__V1__REQUEST__INIT;
	Memtally__V1__ListProcesses lp = MEMTALLY__V1__LIST_PROCESSES__INIT;
	req.body_case = MEMTALLY__V1__REQUEST__BODY_LIST_PROCESSES;
	req.list_processes = &lp;
	struct mts_peer peer = fx_peer(getpid(), 1000);
	r = fx_call(&peer, &req);
	cr_assert_eq(r->process_list->n_processes, N);
	for (size_t i = 0; i < N; i++)
		cr_assert_eq(r->process_list->processes[i]->pid,
		             (uint32_t)kid[order[i]], "list[%zu]", i);
	memtally__v1__response__free_unpacked(r, NULL);
}
