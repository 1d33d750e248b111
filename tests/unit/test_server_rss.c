/*
 * test_server_rss.c - a read of a worker's memory map that never returns
 * (server/rss.c) holds up neither the other workers' figures nor
 * memtallyd's stop. The read is made to wait by a stand-in for
 * mts_read_kernel_mem (the link wraps it), as a worker's mmap lock held
 * through a FUSE fault would make smaps_rollup wait; every other read is
 * the real one, of real child processes of an untrusted uid.
 */
#include "test_server_fixture.h"

#include <stdatomic.h>

#define OTHER_UID 2000u

static int gate[2] = {-1, -1};
static atomic_uint stall_pid;
static atomic_uint status_reads_of_stalled;

int __real_mts_read_kernel_mem(int pid, bool smaps, struct mts_kernel_mem *out);

int __wrap_mts_read_kernel_mem(int pid, bool smaps, struct mts_kernel_mem *out)
{
	if ((unsigned)pid == atomic_load(&stall_pid)) {
		if (smaps) {
			char c;
			while (read(gate[0], &c, 1) < 0 && errno == EINTR)
				;
		} else {
			atomic_fetch_add(&status_reads_of_stalled, 1);
		}
	}
	return __real_mts_read_kernel_mem(pid, smaps, out);
}

static void start(void)
{
	if (geteuid() != 0)
		cr_skip_test("needs root: the children run as another uid");
	cr_assert_eq(pipe(gate), 0);
	struct mts_policy pol;
	mts_policy_defaults(&pol);
	/* The sweeps here are the test's own. */
	pol.rss_interval_ms = 600000;
	fx_start_policy(&pol);
}

/* The tick's part (the fixture's tick is a minute). */
static bool swept(void)
{
	mts_rss_poll(&srv.reg, mts_now_monotonic());
	return !srv.reg.rss->sweep;
}

static const struct mts_proc *proc(pid_t pid)
{
	const struct mts_proc *p = mts_find_pid(&srv.reg, (uint32_t)pid);
	cr_assert_not_null(p);
	return p;
}

Test(rss, a_read_that_never_returns_holds_up_no_one_else)
{
	start();
	pid_t before = fx_spawn_as(OTHER_UID);
	pid_t stuck = fx_spawn_as(OTHER_UID);
	pid_t after = fx_spawn_as(OTHER_UID);
	fx_register_as(before, OTHER_UID, "g", "");
	fx_register_as(stuck, OTHER_UID, "g", "");
	fx_register_as(after, OTHER_UID, "g", "");
	atomic_store(&stall_pid, (unsigned)stuck);

	uint64_t t0 = fx_ms();
	mts_rss_sweep_start(&srv.reg);
	cr_assert_not_null(srv.reg.rss->sweep);
	FX_RUN_UNTIL(swept());
	uint64_t waited = fx_ms() - t0;
	/* Given up after its limit, not before. */
	cr_assert_geq(waited, 2000, "given up after %llu ms",
	              (unsigned long long)waited);
	cr_assert_eq(mts_rss_stuck_readers(), 1);
	cr_assert(proc(stuck)->vouch.read_stalled);
	/* What was read before the stuck read counts. */
	cr_assert_neq(proc(before)->vouch.kernel_ns, 0);
	cr_assert_gt(proc(before)->vouch.kernel, 0);
	cr_assert_eq(proc(after)->vouch.kernel_ns, 0);
	cr_assert_eq(proc(stuck)->vouch.kernel_ns, 0);

	/* The next sweep reads everyone, the stuck process from its status,
	 * while the first reader still waits. */
	mts_rss_sweep_start(&srv.reg);
	cr_assert_not_null(srv.reg.rss->sweep);
	FX_RUN_UNTIL(swept());
	cr_assert_gt(atomic_load(&status_reads_of_stalled), 0);
	cr_assert_gt(proc(stuck)->vouch.kernel, 0);
	cr_assert_gt(proc(after)->vouch.kernel, 0);
	cr_assert_eq(mts_rss_stuck_readers(), 1);

	/* The read returns at last: its reader ends and frees the sweep
	 * (AddressSanitizer sees the rest). */
	cr_assert_eq(write(gate[1], "x", 1), 1);
	FX_RUN_UNTIL(mts_rss_stuck_readers() == 0);
	fx_stop();
}

Test(rss, memtallyd_stops_while_a_read_is_stuck)
{
	start();
	pid_t stuck = fx_spawn_as(OTHER_UID);
	fx_register_as(stuck, OTHER_UID, "g", "");
	atomic_store(&stall_pid, (unsigned)stuck);
	mts_rss_sweep_start(&srv.reg);
	cr_assert_not_null(srv.reg.rss->sweep);
	/* Stop with the reader still in its read: the loop closes with no
	 * request left, and the reader is let go. */
	uint64_t t0 = fx_ms();
	fx_stop();
	cr_assert_lt(fx_ms() - t0, 1000);
	cr_assert_eq(mts_rss_stuck_readers(), 1);
	cr_assert_eq(write(gate[1], "x", 1), 1);
	uint64_t end = fx_deadline_ms(20000);
	while (mts_rss_stuck_readers() != 0) {
		cr_assert_lt(fx_ms(), end, "the reader never ended");
		poll(NULL, 0, 5);
	}
}
