/*
 * test_server_vouch.c - a claim counts for the claimant, and toward others
 * only as far as the kernel vouches for it (server/vouch.c), on a real
 * registry with real child processes of an untrusted uid.
 */
#include "test_server_fixture.h"

#include <pthread.h>
#include <sched.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
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
	/* Its growth (the node guard's rule when no task is beyond its
	 * reservation, the forecasts) is of that figure too: a claim held
	 * flat cannot hide a rise, nor a made-up rise pass for one. */
	cr_assert_neq(p->rate.last_ns, 0, "no growth sample");
	cr_assert_eq(p->rate.last_v, k + 64 * MIB, "%llu",
	             (unsigned long long)p->rate.last_v);

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

Test(vouch, an_overstating_process_does_not_shield_the_one_really_over)
{
	/* Enforcement chose the largest over its own limit by its claim: a
	 * liar claiming 2^49 (over its limit, the largest) was signalled
	 * every grace period, and, catching SIGTERM, shielded another
	 * user's process really over for ever. It ranks by what the kernel
	 * vouches for now. Found in review. */
	start(64 * MIB, 60000);
	srv.reg.policy.process_limit = GIB;
	srv.reg.policy.grace_ms = 60000;
	srv.reg.policy.enforce_signal = SIGTERM;
	pid_t liar = spawn_as(LIAR_UID);
	pid_t honest = fx_spawn();
	fx_write(register_as(liar, LIAR_UID, "shared"), (int64_t)1 << 49);
	fx_write(register_as(honest, FX_UID, "shared"), 1536 * (int64_t)MIB);
	tick_with_kernel();
	cr_assert_eq(srv.reg.totals.state, MTSHM_STATE_OVER);
	cr_assert_eq(srv.reg.lim->enforcement_signals, 0);
	/* The grace period has passed: one tick, one signal (the next one
	 * only a grace period later, whoever dies when). */
	srv.reg.lim->fleet_over_since_ns -= 61000ull * 1000000ull;
	mts_core_tick(&srv.reg);
	cr_assert_eq(srv.reg.lim->enforcement_signals, 1);
	uint64_t end = fx_deadline_ms(10000);
	int st = 0;
	pid_t got = 0;
	while ((got = waitpid(honest, &st, WNOHANG)) == 0 && fx_ms() < end)
		nanosleep(&(struct timespec){0, 5 * 1000 * 1000}, NULL);
	cr_assert_eq(got, honest, "the process over its limit not signalled");
	cr_assert(WIFSIGNALED(st) && WTERMSIG(st) == SIGTERM);
	for (int i = 0; i < nkids; i++)
		if (kids[i] == honest)
			kids[i] = kids[--nkids];
	cr_assert_eq(srv.reg.lim->enforcement_signals, 1,
	             "the liar was signalled first");
	cr_assert_eq(waitpid(liar, &st, WNOHANG), 0, "the liar was signalled");
	fx_stop();
}

Test(vouch, a_claim_past_the_vouched_does_not_empty_a_reservation)
{
	/* A task's reservation counts what its workers have not used yet.
	 * Used was the raw claim: a worker of the task claiming 1 TiB took
	 * its 200 MiB out of the totals (others admitted into that room)
	 * while the guard still shielded the task by all 200 MiB. Found in
	 * review. */
	start(64 * MIB, 60000);
	Memtally__V1__Response *r =
	    fx_admit(LIAR_UID, 200 * MIB, "", "liars-task", 0);
	cr_assert(r->admit_result->admitted, "%s", r->admit_result->reason);
	memtally__v1__response__free_unpacked(r, NULL);
	pid_t liar = spawn_as(LIAR_UID);
	uint32_t ls = fx_register_as(liar, LIAR_UID, "default", "liars-task");
	fx_write(ls, (int64_t)1 << 40);
	tick_with_kernel();
	tick_with_kernel();
	uint64_t k = kernel_of(liar);
	cr_assert_lt(k, 64 * MIB);
	/* Counted: its kernel figure and the allowance; reserved: the rest
	 * of the 200 MiB. */
	const struct mts_totals *t = &srv.reg.totals;
	cr_assert_geq(t->reserved, 200 * MIB - k - 64 * MIB,
	              "reserved %llu (kernel %llu)",
	              (unsigned long long)t->reserved, (unsigned long long)k);
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

Test(vouch, registering_again_does_not_wipe_the_kernels_figure)
{
	start(64 * MIB, 60000);
	pid_t w = fx_spawn_as_holding((long)LIAR_UID, 256 * MIB);
	uint32_t s = register_as(w, LIAR_UID, "");
	fx_write(s, 0);
	tick_with_kernel();
	cr_assert_geq(srv.reg.totals.bytes, 256 * MIB);
	/* No exec, a new image id: the process holds what it held. Its
	 * figure stays until a read of the "new image", which is due at
	 * once, claim of nothing or not. */
	fx_register_image(w, LIAR_UID, 0x5eed);
	mts_core_tick(&srv.reg);
	const struct mts_proc *p = mts_find_pid(&srv.reg, (uint32_t)w);
	cr_assert_geq(srv.reg.totals.bytes, 256 * MIB, "hidden: %llu",
	              (unsigned long long)srv.reg.totals.bytes);
	cr_assert(mts_vouch_want_read(p));
	tick_with_kernel();
	cr_assert_geq(srv.reg.totals.bytes, 256 * MIB);
	cr_assert_neq(mts_find_pid(&srv.reg, (uint32_t)w)->vouch.kernel_ns, 0);
	fx_stop();
}

/* Separate pipes: the main thread's "exit now" and the other thread's
 * "allocate now" must not be read by the wrong one. */
static int zl_exit[2], zl_go[2], zl_ready[2];

static void *zl_holder(void *arg)
{
	(void)arg;
	char c;
	if (read(zl_go[0], &c, 1) != 1)
		_exit(1);
	char *m = malloc(256 * MIB);
	if (!m)
		_exit(1);
	memset(m, 1, 256 * MIB);
	__asm__ volatile("" : : "r"(m) : "memory");
	if (write(zl_ready[1], "y", 1) != 1)
		_exit(1);
	for (;;)
		pause();
	return NULL;
}

Test(vouch, a_process_whose_main_thread_exited_is_still_read)
{
	start(64 * MIB, 60000);
	cr_assert_eq(pipe(zl_exit), 0);
	cr_assert_eq(pipe(zl_go), 0);
	cr_assert_eq(pipe(zl_ready), 0);
	pid_t parent = getpid();
	pid_t w = fork();
	if (w == 0) {
		if (setresgid(LIAR_UID, LIAR_UID, LIAR_UID) ||
		    setresuid(LIAR_UID, LIAR_UID, LIAR_UID))
			_exit(1);
		fx_die_with(parent);
		pthread_t t;
		if (pthread_create(&t, NULL, zl_holder, NULL))
			_exit(1);
		char c;
		if (read(zl_exit[0], &c, 1) != 1)
			_exit(1);
		syscall(SYS_exit, 0); /* this thread only: a zombie leader */
	}
	kids[nkids++] = w;
	fx_write(register_as(w, LIAR_UID, ""), 0);
	tick_with_kernel();
	cr_assert_lt(kernel_of(w), 64 * MIB);
	cr_assert_eq(write(zl_exit[1], "x", 1), 1); /* the main thread exits */
	char path[64], st[4096];
	snprintf(path, sizeof(path), "/proc/%d/stat", (int)w);
	FX_RUN_UNTIL(mts_read_small("/proc", path + 6, st, sizeof(st)) > 0 &&
	             strstr(st, ") Z ") != NULL);
	cr_assert_eq(write(zl_go[1], "x", 1), 1); /* the other allocates */
	char c;
	cr_assert_eq(read(zl_ready[0], &c, 1), 1);
	tick_with_kernel();
	const struct mts_proc *p = mts_find_pid(&srv.reg, (uint32_t)w);
	cr_assert_not_null(p, "dropped while it lives");
	cr_assert_geq(mts_vouch_counted(p), 256 * MIB, "counted %llu",
	              (unsigned long long)mts_vouch_counted(p));
	fx_stop();
}

Test(vouch, an_exit_takes_the_kernels_figure_out_at_once)
{
	start(64 * MIB, 60000);
	pid_t w = fx_spawn_as_holding((long)LIAR_UID, 128 * MIB);
	fx_write(register_as(w, LIAR_UID, ""), 0);
	tick_with_kernel();
	cr_assert_geq(srv.reg.totals.bytes, 128 * MIB);
	fx_kill(w); /* seen gone: no tick since */
	cr_assert_eq(srv.reg.totals.processes, 0);
	cr_assert_eq(srv.reg.totals.bytes, 0, "%llu left",
	             (unsigned long long)srv.reg.totals.bytes);
	fx_stop();
}

Test(vouch, a_corrupt_slot_still_counts_what_the_kernel_holds)
{
	/* One absurd figure quarantines a slot's counters for good; an
	 * untrusted worker must not hide its memory that way. */
	start(64 * MIB, 60000);
	pid_t w = fx_spawn_as_holding((long)LIAR_UID, 64 * MIB);
	uint32_t s = register_as(w, LIAR_UID, "");
	fx_write(s, (int64_t)MTSHM_ABSURD_BYTES + 1);
	tick_with_kernel();
	struct mts_proc *p = mts_find_pid(&srv.reg, (uint32_t)w);
	cr_assert(p->corrupt);
	cr_assert_eq(p->bytes, 0);
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
	cr_assert_eq(m.anon, 1024 * 1024, "RssAnon");
	cr_assert_not(m.pss);
	cr_assert_not(m.has_uids, "no Uid: line");
	/* The effective uid: the one a process that dropped root has. */
	const char *dropped = "Name:\tx\nUid:\t0\t65534\t65534\t65534\n"
	                      "VmRSS:\t  2048 kB\nRssAnon:\t 1024 kB\n";
	cr_assert_eq(mts_parse_status_mem(dropped, &m), 0);
	cr_assert(m.has_uids);
	cr_assert_eq(m.uids[0], 0, "real");
	cr_assert_eq(m.uids[1], 65534, "effective");
	cr_assert_eq(m.uids[2], 65534, "saved");
	cr_assert_eq(mts_parse_status_mem("Uid:\t0\tx\nVmRSS:\t1 kB\n"
	                                  "RssAnon:\t1 kB\n",
	                                  &m),
	             0);
	cr_assert_not(m.has_uids, "a malformed Uid: line is no uid");
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
	    "SwapPss:             100 kB\nLocked:                0 kB\n"
	    "Anonymous:         72000 kB\n";
	cr_assert_eq(mts_parse_smaps_rollup(sr, &m), 0);
	cr_assert_eq(m.rss, 40000 * 1024, "Pss, not Rss");
	cr_assert_eq(m.held, (36000 + 3000 + 100) * 1024);
	cr_assert_eq(m.shmem, 3000 * 1024);
	cr_assert_eq(m.anon, 72000 * 1024, "Anonymous: each page in full");
	cr_assert(m.pss);
	/* Linux < 5.10 has Pss but no Pss_Anon: refused (status is read). */
	cr_assert_eq(mts_parse_smaps_rollup("Rss: 8 kB\nPss: 4 kB\n", &m),
	             -EINVAL);
}

/* A process's mapped figure (lane 0's `mapped`), its kernel reads and the
 * tick: counted in full while young, bounded by RssAnon by a read made
 * once it is old, in full again when it rises; the reconcile flag rises
 * when the kernel disagrees and comes down once the slot published. */
static uint32_t mapped_flags(uint32_t slot)
{
	return mtshm_load_relaxed32(&mts_slot(&srv.reg, slot)->flags) &
	       MTSHM_SLOT_RECONCILE;
}

Test(vouch, mapped_bounded_by_the_kernel_once_old)
{
	fx_start();
	pid_t pid = fx_spawn();
	uint32_t slot = fx_register(pid, "maps", "");
	struct mtshm_slot_id *s = mts_slot(&srv.reg, slot);
	fx_write(slot, 0);
	mtshm_store_relaxeds64(&mtshm_lane(s, 0)->mapped, 512 * (int64_t)MIB);
	mts_core_tick(&srv.reg);
	struct mts_proc *p = mts_find_pid(&srv.reg, (uint32_t)pid);
	cr_assert_eq(p->mapped, 512 * MIB, "young: in full");
	cr_assert(p->mapped_young);

	/* A read during its youth bounds nothing and asks nothing. */
	uint64_t now = mts_now_monotonic();
	mts_mapped_read(&srv.reg, p, 100 * MIB, now);
	mts_core_tick(&srv.reg);
	cr_assert_eq(p->mapped, 512 * MIB);
	cr_assert_eq(p->bytes, 512 * MIB);
	cr_assert_eq(mapped_flags(slot), 0);

	/* Old: the tick asks for an early read, which bounds it. */
	p->mapped_rose_ns -= (uint64_t)MTS_MAPPED_YOUNG_MS * 1000000u;
	srv.reg.rss->vouch_wanted = false;
	mts_core_tick(&srv.reg);
	cr_assert(srv.reg.rss->vouch_wanted, "an early read asked for");
	cr_assert(mts_mapped_read_due(p, mts_now_monotonic()));
	mts_mapped_read(&srv.reg, p, 100 * MIB, mts_now_monotonic());
	cr_assert_not(p->mapped_young);
	mts_core_tick(&srv.reg);
	cr_assert_eq(p->mapped, 100 * MIB, "bounded by RssAnon");
	cr_assert_eq(p->bytes, 100 * MIB);
	cr_assert_eq(srv.reg.totals.mapped, 100 * MIB);
	cr_assert_eq(mapped_flags(slot), MTSHM_SLOT_RECONCILE,
	             "the client asked to reconcile");
	/* Not published since: the flag stays up. */
	mts_mapped_read(&srv.reg, p, 100 * MIB, mts_now_monotonic());
	cr_assert_eq(mapped_flags(slot), MTSHM_SLOT_RECONCILE);

	/* Its client reconciled (a full publish, the flush count moved) to
	 * 90 MiB: under the bound, counted as it is; the flag comes down. */
	mtshm_store_relaxed64(&mtshm_lane(s, 0)->flushes, 1);
	mtshm_store_relaxeds64(&mtshm_lane(s, 0)->mapped, 90 * (int64_t)MIB);
	mts_core_tick(&srv.reg);
	cr_assert_eq(p->mapped, 90 * MIB);
	mts_mapped_read(&srv.reg, p, 95 * MIB, mts_now_monotonic());
	cr_assert_eq(mapped_flags(slot), 0, "down once it published");
	mts_core_tick(&srv.reg);
	cr_assert_eq(p->mapped, 90 * MIB);

	/* It maps more: young again, in full, whatever the last read said. */
	mtshm_store_relaxeds64(&mtshm_lane(s, 0)->mapped, 300 * (int64_t)MIB);
	mts_core_tick(&srv.reg);
	cr_assert_eq(p->mapped, 300 * MIB);
	cr_assert(p->mapped_young);
	mts_mapped_read(&srv.reg, p, 95 * MIB, mts_now_monotonic());
	mts_core_tick(&srv.reg);
	cr_assert_eq(p->mapped, 300 * MIB,
	             "a read during youth bounds nothing");
	fx_stop();
}

Test(vouch, mapped_below_the_kernel_asks_a_reconcile)
{
	fx_start();
	pid_t pid = fx_spawn();
	uint32_t slot = fx_register(pid, "maps", "");
	struct mtshm_slot_id *s = mts_slot(&srv.reg, slot);
	fx_write(slot, 0);
	/* Mapped, then all given back (madvise): 0. */
	mtshm_store_relaxeds64(&mtshm_lane(s, 0)->mapped, 256 * (int64_t)MIB);
	mts_core_tick(&srv.reg);
	mtshm_store_relaxeds64(&mtshm_lane(s, 0)->mapped, 0);
	mts_core_tick(&srv.reg);
	struct mts_proc *p = mts_find_pid(&srv.reg, (uint32_t)pid);
	cr_assert_eq(p->bytes, 0);
	/* RssAnon within the slack of the claim: nothing asked. */
	mts_mapped_read(&srv.reg, p, MTS_MAPPED_SLACK, mts_now_monotonic());
	cr_assert_eq(mapped_flags(slot), 0);
	/* Written again without a call: RssAnon 128 MiB above the claim. */
	mts_mapped_read(&srv.reg, p, 128 * MIB, mts_now_monotonic());
	cr_assert_eq(mapped_flags(slot), MTSHM_SLOT_RECONCILE);
	cr_assert_eq(p->bytes, 0, "never raised by the server");
	/* A process that never mapped anything is never asked. */
	pid_t other = fx_spawn();
	uint32_t os = fx_register(other, "maps", "");
	fx_write(os, 0);
	mts_core_tick(&srv.reg);
	mts_mapped_read(&srv.reg, mts_find_pid(&srv.reg, (uint32_t)other),
	                128 * MIB, mts_now_monotonic());
	cr_assert_eq(mapped_flags(os), 0);
	fx_stop();
}

struct mapping {
	int fd;
	size_t file_len, shm_len;
};

/* Make `len` bytes at `p` resident, reading (or writing) each page. The
 * kernel does it where it can (MADV_POPULATE_*, Linux 5.14): a loop of
 * loads and stores would, under ThreadSanitizer, add shadow memory of its
 * own to the child's anonymous pages. */
static void populate(char *p, size_t len, bool write)
{
	if (madvise(p, len, write ? MADV_POPULATE_WRITE : MADV_POPULATE_READ) ==
	    0)
		return;
	volatile char sum = 0;
	for (size_t i = 0; i < len; i += 4096) {
		if (write)
			p[i] = 1;
		else
			sum = (char)(sum + p[i]);
	}
}

static void map_body(void *arg)
{
	const struct mapping *m = arg;
	if (m->file_len) {
		char *f =
		    mmap(NULL, m->file_len, PROT_READ, MAP_SHARED, m->fd, 0);
		if (f == MAP_FAILED)
			_exit(1);
		populate(f, m->file_len, false);
	}
	if (m->shm_len) {
		int fd = memfd_create("mt-test-shm", 0);
		if (fd < 0 || ftruncate(fd, (off_t)m->shm_len) < 0)
			_exit(1);
		char *s = mmap(NULL, m->shm_len, PROT_READ | PROT_WRITE,
		               MAP_SHARED, fd, 0);
		if (s == MAP_FAILED)
			_exit(1);
		populate(s, m->shm_len, true);
	}
}

/* A child of this process that maps `file_len` bytes of `fd` and reads
 * every page, and writes `shm_len` bytes of a memfd it maps; then waits
 * to be killed. */
static pid_t spawn_mapping(int fd, size_t file_len, size_t shm_len)
{
	struct mapping m = {.fd = fd, .file_len = file_len, .shm_len = shm_len};
	return fx_spawn_ready(map_body, &m);
}

Test(vouch, a_trusted_workers_resident_figure_leaves_its_file_pages_out)
{
	/* Two trusted workers, one of them mapping 32 MiB of a file (page
	 * cache: the node holds it once, whoever maps it) and writing
	 * 16 MiB of shared memory (held because it holds it). */
	struct mts_policy pol;
	mts_policy_defaults(&pol);
	pol.fleet_limit = GIB;
	pol.measure = MTS_MEASURE_RSS;
	fx_start_policy(&pol);
	char path[] = "/tmp/mt-test-file-XXXXXX";
	int fd = mkstemp(path);
	cr_assert_geq(fd, 0);
	unlink(path);
	static char block[1 << 20];
	memset(block, 7, sizeof(block));
	for (int i = 0; i < 32; i++)
		cr_assert_eq(write(fd, block, sizeof(block)),
		             (ssize_t)sizeof(block));
	pid_t plain = spawn_mapping(-1, 0, 0);
	pid_t mapping = spawn_mapping(fd, 32 * MIB, 16 * MIB);
	close(fd);
	fx_register(plain, "", "");
	fx_register(mapping, "", "");
	tick_with_kernel();
	uint64_t a = mts_find_pid(&srv.reg, (uint32_t)plain)->rss;
	uint64_t b = mts_find_pid(&srv.reg, (uint32_t)mapping)->rss;
	cr_assert_gt(a, 0);
	/* The shared memory counts, the file pages do not (VmRSS would
	 * show 48 MiB more). */
	cr_assert_geq(b, a + 15 * MIB, "plain %llu, mapping %llu",
	              (unsigned long long)a, (unsigned long long)b);
	cr_assert_lt(b, a + 24 * MIB, "plain %llu, mapping %llu",
	             (unsigned long long)a, (unsigned long long)b);
	/* And so the fleet's sum. */
	cr_assert_lt(srv.reg.totals.rss, 2 * a + 24 * MIB);
	fx_stop();
}

/* The worker: of LIAR_UID, holding 64 MiB it wrote, with a child that
 * shares them and never registers (its pid goes down `fd`). */
struct fx_family {
	pid_t parent;
	int fd;
	/* The child writes 32 MiB of its own and makes this many children
	 * that share its address space (clone CLONE_VM). */
	int vm_kids;
};

static int vm_kid(void *arg)
{
	(void)arg;
	syscall(SYS_prctl, PR_SET_PDEATHSIG, SIGKILL, 0, 0, 0);
	for (;;)
		syscall(SYS_pause);
	return 0;
}

static void vm_kids(int n)
{
	char *own = malloc(32 * MIB);
	if (!own)
		_exit(1);
	memset(own, 2, 32 * MIB);
	__asm__ volatile("" : : "r"(own) : "memory");
	for (int i = 0; i < n; i++) {
		size_t len = 64 * 1024;
		char *st = mmap(NULL, len, PROT_READ | PROT_WRITE,
		                MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
		if (st == MAP_FAILED ||
		    clone(vm_kid, st + len, CLONE_VM | SIGCHLD, NULL) < 0)
			_exit(1);
	}
}

static void family_body(void *arg)
{
	const struct fx_family *f = arg;
	struct fx_holding h = {
	    .parent = f->parent, .uid = LIAR_UID, .hold = 64 * MIB};
	fx_hold_body(&h);
	pid_t me = getpid();
	pid_t c = fork();
	if (c == 0) {
		fx_die_with(me);
		if (f->vm_kids)
			vm_kids(f->vm_kids);
		for (;;)
			pause();
	}
	if (c < 0 || write(f->fd, &c, sizeof(c)) != (ssize_t)sizeof(c))
		_exit(1);
}

Test(vouch, descendants_that_never_registered_count_with_their_parent)
{
	/* Its proportional figure was half the 64 MiB (a page shared by two
	 * counts 1/2 in each) and the child was in no total: what the two
	 * hold together counted 32 MiB. */
	start(0, 60000);
	int p[2];
	cr_assert_eq(pipe(p), 0);
	struct fx_family f = {.parent = getpid(), .fd = p[1]};
	pid_t w = fx_spawn_ready(family_body, &f);
	pid_t child;
	cr_assert_eq(read(p[0], &child, sizeof(child)), (ssize_t)sizeof(child));
	close(p[0]);
	close(p[1]);
	register_as(w, LIAR_UID, "fam");
	tick_with_kernel();
	const struct mts_proc *wp = mts_find_pid(&srv.reg, (uint32_t)w);
	/* Each holds half the 64 MiB, and its own pages besides (more
	 * under a sanitizer's runtime, which the fork copied too). */
	uint64_t fam = wp->vouch.family_held, k1 = kernel_of(w);
	cr_assert_eq(wp->vouch.family_n, 1);
	cr_assert_geq(fam, 28 * MIB, "%llu", (unsigned long long)fam);
	cr_assert_geq(k1, fam + 28 * MIB, "%llu", (unsigned long long)k1);
	cr_assert_geq(wp->rss, k1 - 8 * MIB);
	cr_assert_geq(srv.reg.totals.bytes, k1);

	/* Once the child registers it counts itself, and its parent no
	 * longer counts it: the same memory, once in all. */
	register_as(child, LIAR_UID, "fam");
	tick_with_kernel();
	wp = mts_find_pid(&srv.reg, (uint32_t)w);
	cr_assert_eq(wp->vouch.family_n, 0);
	cr_assert_eq(wp->vouch.family_held, 0);
	uint64_t kw = kernel_of(w), kc = kernel_of(child);
	cr_assert_lt(kw, k1 - fam + 8 * MIB, "%llu", (unsigned long long)kw);
	cr_assert_lt(kw + kc, k1 + 8 * MIB, "counted twice: %llu + %llu",
	             (unsigned long long)kw, (unsigned long long)kc);
	cr_assert_geq(kw + kc + 8 * MIB, k1);
	fx_stop();
}

/* Not in a sanitizer's build: there the CLONE_VM children run its
 * runtime with no thread state of their own and crash, and one dumping
 * core held the address space the test reads figures from for ever. The
 * integration tests (whose workers are never sanitized) cover it there. */
#if !defined(__SANITIZE_THREAD__) && !defined(__SANITIZE_ADDRESS__)
Test(vouch, descendants_sharing_an_address_space_count_once)
{
	/* The child holds 32 MiB of its own besides its half of the 64, and
	 * three children of its made with CLONE_VM show all of its memory
	 * as theirs: charged, they counted it four times. */
	start(0, 60000);
	int p[2];
	cr_assert_eq(pipe(p), 0);
	struct fx_family f = {.parent = getpid(), .fd = p[1], .vm_kids = 3};
	pid_t w = fx_spawn_ready(family_body, &f);
	pid_t child;
	cr_assert_eq(read(p[0], &child, sizeof(child)), (ssize_t)sizeof(child));
	close(p[0]);
	close(p[1]);
	register_as(w, LIAR_UID, "fam");
	/* Its children made (the pipe said only that it was forked). */
	for (int i = 0; i < 500; i++) {
		char path[64], buf[256] = "";
		snprintf(path, sizeof(path), "/proc/%d/task/%d/children",
		         (int)child, (int)child);
		FILE *cf = fopen(path, "r");
		if (!cf)
			break; /* no children files: the read below waits */
		size_t n = fread(buf, 1, sizeof(buf) - 1, cf);
		fclose(cf);
		buf[n] = '\0';
		int k = 0;
		for (char *t = strtok(buf, " "); t; t = strtok(NULL, " "))
			k++;
		if (k == 3)
			break;
		usleep(10000);
	}
	usleep(100000);
	tick_with_kernel();
	const struct mts_proc *wp = mts_find_pid(&srv.reg, (uint32_t)w);
	cr_assert_eq(wp->vouch.family_n, 1, "%u", wp->vouch.family_n);
	cr_assert_geq(wp->vouch.family_held, 60 * MIB, "%llu",
	              (unsigned long long)wp->vouch.family_held);
	/* Its own figure, once. */
	struct mts_kernel_mem km;
	cr_assert_eq(mts_read_kernel_mem((int)child, true, &km), 0);
	cr_assert_lt(wp->vouch.family_held, km.held + 8 * MIB,
	             "%llu of a child holding %llu",
	             (unsigned long long)wp->vouch.family_held,
	             (unsigned long long)km.held);
	fx_stop();
}
#endif
