/*
 * test_server_vouch.c - a claim counts for the claimant, and toward others
 * only as far as the kernel vouches for it (server/vouch.c), on a real
 * registry with real child processes of an untrusted uid.
 */
#include "test_server_fixture.h"

#include <time.h>

#define LIAR_UID 2000u
#define GIB      (UINT64_C(1) << 30)

static pid_t spawn_as(uint32_t uid)
{
	return fx_spawn_as((long)uid);
}

static uint32_t register_as(pid_t pid, uint32_t uid, const char *group)
{
	return fx_register_as(pid, uid, group, "");
}

static void start(uint64_t allowance, uint32_t untouched_ms)
{
	if (geteuid() != 0)
		cr_skip_test("needs root: the children run as another uid");
	struct mts_policy pol;
	mts_policy_defaults(&pol);
	pol.fleet_limit = GIB;
	pol.untouched_allowance = allowance;
	pol.untouched_ms = untouched_ms;
	pol.grace_ms = 0;
	fx_start_policy(&pol);
}

/* Read every process's kernel figure now, then tick. */
static void tick_with_kernel(void)
{
	mts_rss_sweep_sync(&srv.reg);
	mts_core_tick(&srv.reg);
}

static uint64_t kernel_of(pid_t pid)
{
	return mts_find_pid(&srv.reg, (uint32_t)pid)->vouch.kernel;
}

Test(vouch, a_lie_counts_for_the_liar_alone)
{
	start(64 * MIB, 60000);
	pid_t liar = spawn_as(LIAR_UID);
	pid_t honest = fx_spawn();
	uint32_t ls = register_as(liar, LIAR_UID, "shared");
	uint32_t hs = register_as(honest, FX_UID, "shared");
	fx_write(ls, (int64_t)1 << 49);
	fx_write(hs, 100 * (int64_t)MIB);
	tick_with_kernel();

	const struct mts_proc *p = mts_find_pid(&srv.reg, (uint32_t)liar);
	uint64_t k = kernel_of(liar);
	cr_assert_gt(k, 0, "no kernel figure read for the liar");
	cr_assert_lt(k, 64 * MIB);
	/* Its own figure is its claim; what counts for others is its kernel
	 * figure plus the allowance. */
	cr_assert_eq(p->bytes, UINT64_C(1) << 49);
	cr_assert_eq(p->unvouched, (UINT64_C(1) << 49) - k - 64 * MIB);
	const struct mts_totals *t = &srv.reg.totals;
	cr_assert_eq(t->bytes, 100 * MIB + k + 64 * MIB);
	cr_assert_eq(t->unvouched, p->unvouched);
	cr_assert_eq(t->state, MTSHM_STATE_OK);
	cr_assert_lt(t->peak, GIB);
	const struct mts_group *g = mts_find_group(&srv.reg, "shared");
	cr_assert_eq(g->bytes, t->bytes);
	cr_assert_eq(g->unvouched, p->unvouched);
	cr_assert_eq(g->unvouched_uid, LIAR_UID);

	/* Admission: the honest uid is admitted, the liar is denied on its
	 * own claim. */
	struct mts_admit_out out;
	struct mts_peer hp = fx_peer(honest, FX_UID);
	mts_admit_decide(&srv.reg, &hp, "", 100 * MIB, &out);
	cr_assert(out.admitted, "the honest uid was denied: %s", out.why);
	struct mts_peer lp = fx_peer(liar, LIAR_UID);
	mts_admit_decide(&srv.reg, &lp, "", MIB, &out);
	cr_assert_not(out.admitted, "the liar was admitted");
	cr_assert_eq(out.reason, MTS_DENY_FLEET_LIMIT);
	fx_stop();
}

Test(vouch, processes_of_one_uid_share_one_allowance)
{
	start(64 * MIB, 60000);
	pid_t a = spawn_as(LIAR_UID), b = spawn_as(LIAR_UID);
	fx_write(register_as(a, LIAR_UID, ""), (int64_t)GIB);
	fx_write(register_as(b, LIAR_UID, ""), (int64_t)GIB);
	tick_with_kernel();
	uint64_t k = kernel_of(a) + kernel_of(b);
	cr_assert_eq(srv.reg.totals.bytes, k + 64 * MIB);
	cr_assert_eq(srv.reg.totals.unvouched, 2 * GIB - k - 64 * MIB);
	cr_assert_eq(mts_vouch_unvouched_of(&srv.reg, LIAR_UID),
	             2 * GIB - k - 64 * MIB);
	cr_assert_eq(mts_vouch_unvouched_of(&srv.reg, FX_UID), 0);
	fx_stop();
}

Test(vouch, a_claim_within_the_kernel_figure_is_all_vouched_for)
{
	start(0, 60000);
	pid_t w = spawn_as(LIAR_UID);
	uint32_t s = register_as(w, LIAR_UID, "");
	tick_with_kernel();
	uint64_t k = kernel_of(w);
	cr_assert_gt(k, 4096);
	fx_write(s, (int64_t)(k - 4096));
	mts_core_tick(&srv.reg);
	/* Below the kernel's figure: the kernel's figure counts. */
	cr_assert_eq(srv.reg.totals.bytes, k);
	cr_assert_eq(srv.reg.totals.unvouched, 0);
	cr_assert_eq(mts_find_pid(&srv.reg, (uint32_t)w)->bytes, k - 4096,
	             "its own figure is its claim");
	/* No allowance: anything beyond the kernel figure is unvouched. */
	fx_write(s, (int64_t)(k + MIB));
	mts_core_tick(&srv.reg);
	cr_assert_eq(srv.reg.totals.bytes, k);
	cr_assert_eq(srv.reg.totals.unvouched, MIB);
	fx_stop();
}

static uint64_t now_ms(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
}

Test(vouch, an_excess_that_stays_goes_stale)
{
	start(64 * MIB, 100);
	pid_t w = spawn_as(LIAR_UID);
	fx_write(register_as(w, LIAR_UID, ""), (int64_t)GIB);
	tick_with_kernel();
	uint64_t k = kernel_of(w);
	cr_assert_eq(srv.reg.totals.bytes, k + 64 * MIB, "fresh: allowed");
	/* Present for two windows of 100 ms: no longer vouched for. Poll
	 * with a deadline: a loaded machine may tick late, never early. */
	uint64_t deadline = now_ms() + 10000;
	while (srv.reg.totals.bytes != k) {
		cr_assert_lt(now_ms(), deadline, "allowance never went stale");
		usleep(10000);
		mts_core_tick(&srv.reg);
	}
	cr_assert_eq(srv.reg.totals.unvouched, GIB - k);
	fx_stop();
}

Test(vouch, a_zeroed_slot_counts_what_the_kernel_holds)
{
	start(64 * MIB, 60000);
	pid_t w = fx_spawn_as_holding((long)LIAR_UID, 64 * MIB);
	uint32_t s = register_as(w, LIAR_UID, "");
	fx_write(s, 0);
	tick_with_kernel();
	uint64_t k = kernel_of(w);
	cr_assert_geq(k, 64 * MIB, "the kernel's figure misses what it holds");
	cr_assert_eq(srv.reg.totals.bytes, k);
	fx_stop();
}

/* Tick until the fleet's bytes are `want`, within 10 s. */
static void tick_until_bytes(uint64_t want, const char *what)
{
	uint64_t deadline = now_ms() + 10000;
	while (srv.reg.totals.bytes != want) {
		cr_assert_lt(now_ms(), deadline, "%s: bytes %llu, want %llu",
		             what, (unsigned long long)srv.reg.totals.bytes,
		             (unsigned long long)want);
		usleep(5000);
		mts_core_tick(&srv.reg);
	}
}

Test(vouch, a_dip_renews_nothing)
{
	start(64 * MIB, 200);
	pid_t w = spawn_as(LIAR_UID);
	uint32_t s = register_as(w, LIAR_UID, "");
	fx_write(s, (int64_t)GIB);
	tick_with_kernel();
	uint64_t k = kernel_of(w);
	cr_assert_eq(srv.reg.totals.bytes, k + 64 * MIB, "fresh: allowed");
	tick_until_bytes(k, "spent after one window");
	/* A dip to 0 for a tick, and the claim again: still spent. */
	fx_write(s, 0);
	mts_core_tick(&srv.reg);
	fx_write(s, (int64_t)GIB);
	mts_core_tick(&srv.reg);
	cr_assert_eq(srv.reg.totals.bytes, k, "a dip renewed the allowance");
	/* A whole window without excess gives it back. */
	fx_write(s, 0);
	uint64_t until = now_ms() + 300;
	while (now_ms() < until) {
		usleep(5000);
		mts_core_tick(&srv.reg);
	}
	fx_write(s, (int64_t)GIB);
	mts_core_tick(&srv.reg);
	cr_assert_eq(srv.reg.totals.bytes, k + 64 * MIB, "rest gave nothing");
	fx_stop();
}

Test(vouch, all_uids_share_one_total_allowance)
{
	if (geteuid() != 0)
		cr_skip_test("needs root: the children run as another uid");
	struct mts_policy pol;
	mts_policy_defaults(&pol);
	pol.untouched_allowance = 64 * MIB;
	pol.untouched_total = 100 * MIB;
	fx_start_policy(&pol);
	pid_t a = spawn_as(LIAR_UID), b = spawn_as(LIAR_UID + 1);
	fx_write(register_as(a, LIAR_UID, ""), (int64_t)GIB);
	fx_write(register_as(b, LIAR_UID + 1, ""), (int64_t)GIB);
	tick_with_kernel();
	uint64_t k = kernel_of(a) + kernel_of(b);
	cr_assert_eq(srv.reg.totals.bytes, k + 100 * MIB);
	cr_assert_eq(srv.reg.totals.allowance, 100 * MIB);
	fx_stop();
}

Test(vouch, trusted_uids_count_in_full)
{
	start(0, 60000);
	pid_t w = spawn_as(LIAR_UID);
	uint32_t s = register_as(w, LIAR_UID, "");
	fx_write(s, 200 * (int64_t)MIB);
	tick_with_kernel();
	cr_assert_lt(srv.reg.totals.bytes, 200 * MIB);
	/* Trusted by a policy change (a reload): counted in full. */
	struct mts_policy pol;
	cr_assert_eq(mts_policy_copy(&pol, &srv.reg.policy), 0);
	pol.trusted_uids[pol.ntrusted++] = LIAR_UID;
	cr_assert_eq(mts_limits_apply_policy(&srv.reg, &pol), 0);
	mts_policy_free(&pol);
	mts_core_tick(&srv.reg);
	cr_assert_eq(srv.reg.totals.bytes, 200 * MIB);
	cr_assert_eq(srv.reg.totals.unvouched, 0);
	fx_stop();
}

Test(vouch, status_parser)
{
	struct mts_kernel_mem m;
	const char *st = "Name:\tx\nVmRSS:\t  2048 kB\nRssAnon:\t 1024 kB\n"
	                 "RssFile:\t1024 kB\nRssShmem:\t256 kB\n"
	                 "VmSwap:\t  512 kB\n";
	cr_assert_eq(mts_parse_status_mem(st, &m), 0);
	cr_assert_eq(m.rss, 2048 * 1024);
	cr_assert_eq(m.held, (1024 + 256 + 512) * 1024);
	cr_assert_eq(m.shmem, 256 * 1024);
	cr_assert_not(m.pss);
	/* A kernel thread has no memory lines: refused, nothing vouched. */
	cr_assert_eq(mts_parse_status_mem("Name:\tkthreadd\n", &m), -EINVAL);
	cr_assert_eq(mts_parse_status_mem("VmRSS:\t99999999999999999999 kB\n"
	                                  "RssAnon:\t1 kB\n",
	                                  &m),
	             -EINVAL);
}

Test(vouch, smaps_rollup_parser)
{
	struct mts_kernel_mem m;
	const char *sr =
	    "55d0c0000000-7ffd00000000 ---p 00000000 00:00 0  [rollup]\n"
	    "Rss:              409600 kB\nPss:               40000 kB\n"
	    "Pss_Dirty:         40000 kB\nPss_Anon:          36000 kB\n"
	    "Pss_File:           1000 kB\nPss_Shmem:          3000 kB\n"
	    "Shared_Clean:       1000 kB\nSwap:               800 kB\n"
	    "SwapPss:             100 kB\nLocked:                0 kB\n";
	cr_assert_eq(mts_parse_smaps_rollup(sr, &m), 0);
	cr_assert_eq(m.rss, 40000 * 1024, "Pss, not Rss");
	cr_assert_eq(m.held, (36000 + 3000 + 100) * 1024);
	cr_assert_eq(m.shmem, 3000 * 1024);
	cr_assert(m.pss);
	/* Linux < 5.10 has Pss but no Pss_Anon: refused (status is read). */
	cr_assert_eq(mts_parse_smaps_rollup("Rss: 8 kB\nPss: 4 kB\n", &m),
	             -EINVAL);
}
