/*
 * test_server_guard.c - the node guard: its [guard] keys, the check of
 * its line against the node (a fake cgroup directory stands for the
 * node), the choice rule over real registered workers, the eviction of a
 * task's process tree with its event, and admission under the line.
 */
#include "test_server_fixture.h"

#include "mts_rss.h"
#include "mts_state.h"

#include <sched.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/syscall.h>

static struct mts_policy pol;
static char dir[64];
static char proc[64];

/* The fake cgroup's files and directory go with the test, and so does
 * the fake procfs. */
static void clean_dir(void)
{
	static const char *const f[] = {"memory.max", "memory.current",
	                                "memory.stat"};
	if (proc[0]) {
		char p[128];
		snprintf(p, sizeof(p), "%s/meminfo", proc);
		unlink(p);
		snprintf(p, sizeof(p), "%s/sys/vm/overcommit_memory", proc);
		unlink(p);
		snprintf(p, sizeof(p), "%s/sys/vm", proc);
		rmdir(p);
		snprintf(p, sizeof(p), "%s/sys", proc);
		rmdir(p);
		rmdir(proc);
		proc[0] = '\0';
	}
	if (!dir[0])
		return;
	for (size_t i = 0; i < 3; i++) {
		char p[128];
		snprintf(p, sizeof(p), "%s/%s", dir, f[i]);
		unlink(p);
	}
	rmdir(dir);
}

static void stop(void)
{
	fx_stop();
	mts_policy_free(&pol);
	clean_dir();
}

TestSuite(guard, .fini = stop, .timeout = 30);

/* The tests that start no server. */
static void free_policy(void)
{
	mts_policy_free(&pol);
	clean_dir();
}

TestSuite(guard_config, .fini = free_policy, .timeout = 30);

static void put(const char *name, const char *text)
{
	char p[128];
	snprintf(p, sizeof(p), "%s/%s", dir, name);
	FILE *f = fopen(p, "w");
	cr_assert_not_null(f);
	fputs(text, f);
	fclose(f);
}

/* A directory with the files of a v2 memory cgroup: `limit` ("max" for
 * none), `current` bytes in use, `inactive` of them inactive file pages. */
static void fake_cgroup(const char *limit, uint64_t current, uint64_t inactive)
{
	if (!dir[0]) {
		snprintf(dir, sizeof(dir), "/tmp/mt-guard-%ld", (long)getpid());
		mkdir(dir, 0700);
	}
	char b[256];
	put("memory.max", limit);
	snprintf(b, sizeof(b), "%llu\n", (unsigned long long)current);
	put("memory.current", b);
	snprintf(b, sizeof(b),
	         "anon 1\nfile 2\ninactive_anon 3\n"
	         "inactive_file %llu\nactive_file 4\n",
	         (unsigned long long)inactive);
	put("memory.stat", b);
}

/* A procfs of two files: vm.overcommit_memory `mode` and a meminfo whose
 * commit figures are `limit` and `committed` MiB (of 1 GiB, 400 MiB
 * available). */
static void fake_proc(const char *mode, uint64_t limit, uint64_t committed)
{
	char p[128];
	if (!proc[0]) {
		snprintf(proc, sizeof(proc), "/tmp/mt-guard-proc-%ld",
		         (long)getpid());
		mkdir(proc, 0700);
		snprintf(p, sizeof(p), "%s/sys", proc);
		mkdir(p, 0700);
		snprintf(p, sizeof(p), "%s/sys/vm", proc);
		mkdir(p, 0700);
	}
	snprintf(p, sizeof(p), "%s/sys/vm/overcommit_memory", proc);
	FILE *f = fopen(p, "w");
	cr_assert_not_null(f);
	fputs(mode, f);
	fclose(f);
	snprintf(p, sizeof(p), "%s/meminfo", proc);
	f = fopen(p, "w");
	cr_assert_not_null(f);
	fprintf(f,
	        "MemTotal:        1048576 kB\nMemFree:          100000 kB\n"
	        "MemAvailable:     409600 kB\nCommitLimit:    %8llu kB\n"
	        "Committed_AS:   %8llu kB\nVmallocTotal:   34359738367 kB\n",
	        (unsigned long long)(limit * 1024),
	        (unsigned long long)(committed * 1024));
	fclose(f);
}

/* [guard] text loaded on the defaults; its error in err. */
static int load_guard(const char *text, struct mts_settings *s, char *err)
{
	char path[64];
	snprintf(path, sizeof(path), "/tmp/mt-guard-%ld.conf", (long)getpid());
	FILE *f = fopen(path, "w");
	cr_assert_not_null(f);
	fprintf(f, "[guard]\n%s\n", text);
	fclose(f);
	err[0] = '\0';
	int r = mts_settings_load(s, path, NULL, 0, err, 512);
	unlink(path);
	return r;
}

Test(guard_config, keys_and_their_forms)
{
	struct mts_settings s;
	char err[512];
	cr_assert_eq(load_guard("line = 85%\ninterval = 500ms\nenabled = "
	                        "true\nevict_trusted = yes\ncgroup = none\n"
	                        "pause = no",
	                        &s, err),
	             0, "%s", err);
	cr_assert(!s.policy.guard_pause);
	cr_assert_eq(s.policy.guard_line_bp, 8500);
	cr_assert_eq(s.policy.guard_interval_ms, 500);
	cr_assert_eq(s.policy.guard_mode, MTS_GUARD_ON);
	cr_assert(s.policy.guard_evict_trusted);
	cr_assert_str_eq(s.policy.guard_cgroup, "");
	mts_settings_free(&s);

	/* cgroup = none is the whole machine: auto leaves the guard off
	 * there, as it does where no cgroup limits memtallyd; true turns it
	 * on, on /proc/meminfo. */
	cr_assert_eq(load_guard("cgroup = none", &s, err), 0, "%s", err);
	cr_assert_eq(s.policy.guard_mode, MTS_GUARD_AUTO);
	struct mts_node_src src;
	struct mts_node_fig fig;
	cr_assert_eq(
	    mts_guard_setup(&s.policy, 64 * MIB, &src, &fig, err, sizeof(err)),
	    0, "%s", err);
	cr_assert_eq(src.kind, MTS_NODE_NONE);
	s.policy.guard_mode = MTS_GUARD_ON;
	cr_assert_eq(
	    mts_guard_setup(&s.policy, 64 * MIB, &src, &fig, err, sizeof(err)),
	    0, "%s", err);
	cr_assert_eq(src.kind, MTS_NODE_MEMINFO);
	mts_settings_free(&s);

	cr_assert_eq(load_guard("line = limit - 256MiB", &s, err), 0, "%s",
	             err);
	cr_assert_eq(s.policy.guard_line_below, 256 * MIB);
	cr_assert_eq(s.policy.guard_line_bp, 0);
	cr_assert_eq(mts_guard_line(&s.policy, 1024 * MIB), 768 * MIB);
	mts_settings_free(&s);

	cr_assert_eq(
	    load_guard("line = 600MiB\ncgroup = /sys/fs/cgroup/x", &s, err), 0,
	    "%s", err);
	cr_assert_eq(s.policy.guard_line_bytes, 600 * MIB);
	cr_assert_eq(mts_guard_line(&s.policy, 1024 * MIB), 600 * MIB);
	cr_assert_str_eq(s.policy.guard_cgroup, "/sys/fs/cgroup/x");
	mts_settings_free(&s);

	/* The defaults: auto, 90%, 2 s, trusted processes spared, growers
	 * paused first. */
	cr_assert_eq(load_guard("", &s, err), 0, "%s", err);
	cr_assert_eq(s.policy.guard_mode, MTS_GUARD_AUTO);
	cr_assert_eq(mts_guard_line(&s.policy, 1000), 900);
	cr_assert_eq(s.policy.guard_interval_ms, 2000);
	cr_assert(!s.policy.guard_evict_trusted);
	cr_assert(s.policy.guard_pause);
	mts_settings_free(&s);
}

Test(guard_config, bad_values_name_their_key)
{
	static const char *const bad[][2] = {
	    {"line = 100%", "[guard] line"},
	    {"line = 0", "[guard] line"},
	    {"line = limit + 5MiB", "[guard] line"},
	    {"line = limit - 0", "[guard] line"},
	    {"interval = 50ms", "[guard] interval"},
	    {"enabled = maybe", "[guard] enabled"},
	    {"cgroup = relative/path", "[guard] cgroup"},
	    {"evict_trusted = 2", "[guard] evict_trusted"},
	    {"pause = later", "[guard] pause"},
	    {"lines = 90%", "[guard] lines: unknown key"},
	};
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		struct mts_settings s;
		char err[512];
		cr_assert_eq(load_guard(bad[i][0], &s, err), -EINVAL, "%s",
		             bad[i][0]);
		cr_assert(strstr(err, bad[i][1]), "%s: %s", bad[i][0], err);
	}
}

Test(guard_config, line_checked_against_the_node)
{
	struct mts_node_src src;
	struct mts_node_fig fig;
	char err[512];
	mts_policy_defaults(&pol);
	fake_cgroup("268435456\n", 100 * MIB, 10 * MIB);
	pol.guard_cgroup = strdup(dir);

	cr_assert_eq(
	    mts_guard_setup(&pol, 64 * MIB, &src, &fig, err, sizeof(err)), 0,
	    "%s", err);
	cr_assert_eq(src.kind, MTS_NODE_CGROUP_V2);
	cr_assert_eq(fig.limit, 256 * MIB);
	/* Inactive file pages are the kernel's to reclaim: not counted. */
	cr_assert_eq(fig.usage, 90 * MIB);
	cr_assert_eq(fig.line, 256 * MIB * 9 / 10);

	/* Above the node's limit: the kernel would act first. */
	pol.guard_line_bp = 0;
	pol.guard_line_bytes = 300 * MIB;
	cr_assert_eq(
	    mts_guard_setup(&pol, 64 * MIB, &src, &fig, err, sizeof(err)),
	    -EINVAL);
	cr_assert(strstr(err, "[guard] line") && strstr(err, "above") &&
	              strstr(err, "300 MiB") && strstr(err, "256 MiB"),
	          "%s", err);

	/* Below what memtallyd needs: its resident memory and buffers. */
	pol.guard_line_bytes = 20 * MIB;
	cr_assert_eq(
	    mts_guard_setup(&pol, 64 * MIB, &src, &fig, err, sizeof(err)),
	    -EINVAL);
	cr_assert(strstr(err, "[guard] line") &&
	              strstr(err, "below what memtallyd needs") &&
	              strstr(err, "max_buffered"),
	          "%s", err);

	/* "limit - X" with X above half the limit keeps half: a line of
	 * 128 MiB, clear of what memtallyd needs. */
	pol.guard_line_bytes = 0;
	pol.guard_line_below = 250 * MIB;
	cr_assert_eq(
	    mts_guard_setup(&pol, 64 * MIB, &src, &fig, err, sizeof(err)), 0,
	    "%s", err);
	cr_assert_eq(fig.line, 128 * MIB);

	/* A cgroup with no limit guards nothing. */
	pol.guard_line_below = 0;
	pol.guard_line_bp = 9000;
	fake_cgroup("max\n", 100 * MIB, 0);
	cr_assert_eq(
	    mts_guard_setup(&pol, 64 * MIB, &src, &fig, err, sizeof(err)),
	    -EINVAL);
	cr_assert(strstr(err, "no limit"), "%s", err);

	/* Off is off, whatever the node. */
	pol.guard_mode = MTS_GUARD_OFF;
	cr_assert_eq(
	    mts_guard_setup(&pol, 64 * MIB, &src, &fig, err, sizeof(err)), 0);
	cr_assert_eq(src.kind, MTS_NODE_NONE);
}

Test(guard_config, strict_overcommit_guards_the_commit_charge)
{
	struct mts_node_fig fig;
	mts_policy_defaults(&pol);
	/* Memory: 100 of 256 MiB, the line at 230.4. */
	fake_cgroup("268435456\n", 100 * MIB, 0);
	struct mts_node_src src = {.kind = MTS_NODE_CGROUP_V2};
	snprintf(src.dir, sizeof(src.dir), "%s", dir);

	/* Heuristic overcommit: the commit charge is no edge, and is not
	 * even read. */
	fake_proc("0\n", 1000, 950);
	snprintf(src.proc, sizeof(src.proc), "%s", proc);
	cr_assert_eq(mts_node_read(&src, &fig), 0);
	mts_node_edge(&pol, &fig);
	cr_assert_eq(fig.commit_limit, 0);
	cr_assert(!fig.by_commit);
	cr_assert_eq(fig.usage, 100 * MIB);
	cr_assert_eq(fig.line, 256 * MIB * 9 / 10);

	/* Strict, with 900 of 1000 MiB committed: 0 MiB of room under the
	 * commit's line (90% as the memory's), 130 under the memory's. The
	 * guard acts on the commit. */
	fake_proc("2\n", 1000, 900);
	cr_assert_eq(mts_node_read(&src, &fig), 0);
	cr_assert_eq(fig.mem_usage, 100 * MIB);
	cr_assert_eq(fig.commit_limit, 1000 * MIB);
	cr_assert_eq(fig.committed, 900 * MIB);
	mts_node_edge(&pol, &fig);
	cr_assert(fig.by_commit);
	cr_assert_eq(fig.usage, 900 * MIB);
	cr_assert_eq(fig.limit, 1000 * MIB);
	cr_assert_eq(fig.line, 1000 * MIB * 9 / 10);
	cr_assert_eq(fig.mem_line, 256 * MIB * 9 / 10);
	cr_assert_str_eq(mts_node_edge_name(&fig), "commit");

	/* 500 committed: 400 MiB of room there, the memory nearer. */
	fake_proc("2\n", 1000, 500);
	cr_assert_eq(mts_node_read(&src, &fig), 0);
	mts_node_edge(&pol, &fig);
	cr_assert(!fig.by_commit);
	cr_assert_eq(fig.usage, 100 * MIB);
	cr_assert_eq(fig.commit_line, 900 * MIB);

	/* On MemAvailable, the same meminfo serves both edges. */
	struct mts_node_src mi = {.kind = MTS_NODE_MEMINFO};
	snprintf(mi.proc, sizeof(mi.proc), "%s", proc);
	fake_proc("2\n", 600, 580);
	cr_assert_eq(mts_node_read(&mi, &fig), 0);
	cr_assert_eq(fig.mem_limit, 1024 * MIB);
	cr_assert_eq(fig.mem_usage, 624 * MIB);
	mts_node_edge(&pol, &fig);
	cr_assert(fig.by_commit);
	cr_assert_eq(fig.usage, 580 * MIB);
	cr_assert_eq(fig.line, 540 * MIB);

	/* A line in bytes: the commit's is the fraction the memory's is of
	 * its limit (1024 - 256 MiB: 75%). */
	pol.guard_line_bp = 0;
	pol.guard_line_below = 256 * MIB;
	mts_node_edge(&pol, &fig);
	cr_assert_eq(fig.mem_line, 768 * MIB);
	cr_assert_eq(fig.commit_line, 450 * MIB);
	cr_assert(fig.by_commit);
}

Test(guard_config, a_meminfo_without_memavailable_is_a_read_error)
{
	struct mts_node_src mi = {.kind = MTS_NODE_MEMINFO};
	struct mts_node_fig fig;
	fake_proc("0\n", 1000, 500);
	snprintf(mi.proc, sizeof(mi.proc), "%s", proc);
	cr_assert_eq(mts_node_read(&mi, &fig), 0);
	cr_assert_eq(fig.usage, 624 * MIB);

	/* A /proc that leaves MemAvailable out: not a node 100% full. */
	char p[128];
	snprintf(p, sizeof(p), "%s/meminfo", proc);
	FILE *f = fopen(p, "w");
	cr_assert_not_null(f);
	fputs("MemTotal:        1048576 kB\nMemFree:          100000 kB\n", f);
	fclose(f);
	cr_assert_eq(mts_node_read(&mi, &fig), -EIO);
}

Test(guard_config, a_limit_lowered_to_a_line_below_it_keeps_a_line)
{
	/* line = limit - 256MiB, and the cgroup resized at run time. */
	mts_policy_defaults(&pol);
	pol.guard_line_bp = 0;
	pol.guard_line_below = 256 * MIB;
	struct mts_node_fig fig = {.mem_limit = 1024 * MIB,
	                           .mem_usage = 100 * MIB};
	mts_node_edge(&pol, &fig);
	cr_assert_eq(fig.line, 768 * MIB);
	/* To 200 MiB: the line would be 0, under any usage, an eviction
	 * every interval. At most half the limit stays below the line. */
	fig.mem_limit = 200 * MIB;
	mts_node_edge(&pol, &fig);
	cr_assert_eq(fig.line, 100 * MIB, "%llu", (unsigned long long)fig.line);
	/* Just above X the line would be 1 MiB; it keeps half. */
	fig.mem_limit = 257 * MIB;
	mts_node_edge(&pol, &fig);
	cr_assert_eq(fig.line, 257 * MIB - 257 * MIB / 2);
	/* Where X is less than half, X is what is kept. */
	fig.mem_limit = 513 * MIB;
	mts_node_edge(&pol, &fig);
	cr_assert_eq(fig.line, 257 * MIB);
	/* The line never falls as the limit grows. */
	uint64_t last = 0;
	for (uint64_t l = 1 * MIB; l <= 2048 * MIB; l += 3 * MIB) {
		fig.mem_limit = l;
		mts_node_edge(&pol, &fig);
		cr_assert_geq(fig.line, last, "limit %llu",
		              (unsigned long long)l);
		cr_assert_lt(fig.line, l);
		last = fig.line;
	}
}

/* A worker of `uid` with `task` using `bytes` as of the next tick. */
static pid_t task_worker(uint32_t uid, const char *task, uint64_t bytes)
{
	pid_t pid = fx_spawn();
	uint32_t slot = fx_register_as(pid, uid, "default", task);
	fx_write(slot, (int64_t)bytes);
	return pid;
}

static void reserve(uint32_t uid, const char *task, uint64_t bytes)
{
	Memtally__V1__Response *r = fx_admit(uid, bytes, "", task, 0);
	cr_assert(r->admit_result->admitted, "%s", r->admit_result->reason);
	memtally__v1__response__free_unpacked(r, NULL);
}

/* The chosen candidate's task (or pid) and the rule. */
static const struct mts_guard_cand *choose(enum mts_guard_rule *rule)
{
	static struct mts_guard_cand k;
	struct mts_guard_cand *c;
	uint32_t n;
	int i;
	mts_core_tick(&srv.reg);
	cr_assert_eq(mts_guard_candidates(&srv.reg, &c, &n, &i, rule), 0);
	if (i < 0) {
		free(c);
		return NULL;
	}
	k = c[i];
	free(c);
	return &k;
}

Test(guard, furthest_beyond_its_reservation)
{
	fx_start();
	reserve(FX_UID, "a", 100 * MIB);
	reserve(FX_UID, "b", 10 * MIB);
	task_worker(FX_UID, "a", 150 * MIB); /* 50 MiB beyond */
	task_worker(FX_UID, "b", 40 * MIB);  /* 30 beyond: smaller */
	task_worker(FX_UID, "b", 5 * MIB);   /* b's too: 35 beyond */
	task_worker(FX_UID, "c", 20 * MIB);  /* nothing reserved: 20 */
	enum mts_guard_rule rule;
	const struct mts_guard_cand *k = choose(&rule);
	cr_assert_not_null(k);
	cr_assert_str_eq(k->task, "a");
	cr_assert_eq(rule, MTS_GUARD_BEYOND);
	cr_assert_eq(k->used, 150 * MIB);
	cr_assert_eq(k->reserved, 100 * MIB);
}

Test(guard, a_task_of_two_workers_is_one_candidate)
{
	fx_start();
	reserve(FX_UID, "a", 100 * MIB);
	reserve(FX_UID, "b", 100 * MIB);
	/* Each of b's workers is within a's excess, together beyond it. */
	task_worker(FX_UID, "a", 130 * MIB);
	task_worker(FX_UID, "b", 70 * MIB);
	task_worker(FX_UID, "b", 70 * MIB);
	enum mts_guard_rule rule;
	const struct mts_guard_cand *k = choose(&rule);
	cr_assert_str_eq(k->task, "b");
	cr_assert_eq(k->workers, 2);
	cr_assert_eq(k->used, 140 * MIB);
}

Test(guard, none_beyond_the_youngest)
{
	fx_start();
	reserve(FX_UID, "old", 100 * MIB);
	reserve(FX_UID, "young", 100 * MIB);
	task_worker(FX_UID, "old", 90 * MIB);
	struct timespec ts = {0, 2 * 1000 * 1000};
	nanosleep(&ts, NULL);
	task_worker(FX_UID, "young", 10 * MIB);
	enum mts_guard_rule rule;
	const struct mts_guard_cand *k = choose(&rule);
	cr_assert_str_eq(k->task, "young");
	cr_assert_eq(rule, MTS_GUARD_YOUNGEST);
}

Test(guard, trusted_without_a_task_spared_unless_configured)
{
	fx_start();
	reserve(FX_UID, "a", 100 * MIB);
	task_worker(FX_UID, "a", 50 * MIB);
	/* FX_UID is trusted (the fixture): a service of 500 MiB. */
	pid_t svc = task_worker(FX_UID, "", 500 * MIB);
	enum mts_guard_rule rule;
	const struct mts_guard_cand *k = choose(&rule);
	cr_assert_str_eq(k->task, "a");
	cr_assert_eq(rule, MTS_GUARD_YOUNGEST);
	srv.reg.guard->evict_trusted = true;
	k = choose(&rule);
	cr_assert_eq(k->pid, (uint32_t)svc);
	cr_assert_eq(rule, MTS_GUARD_BEYOND);
}

Test(guard, tasks_run_inside_a_worker_are_its_reservation)
{
	fx_start();
	/* A trusted worker (a Dask worker, no task of its own) runs a 100
	 * MiB task inside it: it runs jobs, so it may be chosen, and its own
	 * 20 MiB and what its task was granted are its reservation. Holding
	 * 120 it is beyond by nothing, and a task 30 MiB beyond its
	 * reservation is chosen before it. */
	pid_t host = task_worker(FX_UID, "", 20 * MIB);
	mts_core_tick(&srv.reg);
	Memtally__V1__Response *r =
	    fx_admit_hosted(host, FX_UID, 100 * MIB, "parse", 0, 0);
	cr_assert(r->admit_result->in_process);
	memtally__v1__response__free_unpacked(r, NULL);
	fx_write(mts_find_pid(&srv.reg, (uint32_t)host)->slot, 120 * MIB);
	reserve(FX_UID, "b", 10 * MIB);
	task_worker(FX_UID, "b", 40 * MIB);
	enum mts_guard_rule rule;
	const struct mts_guard_cand *k = choose(&rule);
	cr_assert_str_eq(k->task, "b");
	/* Past what it was granted, the worker is the one. */
	fx_write(mts_find_pid(&srv.reg, (uint32_t)host)->slot, 160 * MIB);
	k = choose(&rule);
	cr_assert_eq(k->pid, (uint32_t)host);
	cr_assert_eq(k->reserved, 120 * MIB);
	cr_assert_eq(k->used, 160 * MIB);
	cr_assert_eq(rule, MTS_GUARD_BEYOND);
	/* Its eviction is the hosted task's, recorded against its kind. */
	mts_host_evicted(&srv.reg, (uint32_t)host);
	struct mts_kind *kd = mts_kind_find(&srv.reg, "parse", FX_UID);
	cr_assert_not_null(kd);
	cr_assert_eq(kd->evictions, 1);
}

Test(guard, another_uid_naming_a_task_is_its_own_candidate)
{
	fx_start();
	reserve(FX_UID, "etl", 200 * MIB);
	task_worker(FX_UID, "etl", 150 * MIB);
	/* Another uid's worker names the task: not the task's, and what it
	 * holds is its own excess (it reserved nothing). */
	pid_t other = task_worker(2000, "etl", 80 * MIB);
	enum mts_guard_rule rule;
	const struct mts_guard_cand *k = choose(&rule);
	cr_assert_str_eq(k->task, "etl");
	cr_assert_eq(k->uid, 2000);
	cr_assert_eq(k->pid, (uint32_t)other);
	cr_assert_eq(k->reserved, 0);
	cr_assert_eq(rule, MTS_GUARD_BEYOND);
}

/* A worker of another uid under the process that asked for the task's
 * reservation (its command switched user) is the owner's candidate, with
 * the owner's reservation. */
Test(guard, a_switched_users_worker_is_its_askers_candidate)
{
	fx_start();
	fx_asker = getpid();
	reserve(FX_UID, "etl", 200 * MIB);
	pid_t w = task_worker(2000, "etl", 150 * MIB);
	enum mts_guard_rule rule;
	const struct mts_guard_cand *k = choose(&rule);
	cr_assert_str_eq(k->task, "etl");
	cr_assert_eq(k->uid, FX_UID);
	cr_assert_eq(k->pid, (uint32_t)w);
	cr_assert_eq(k->reserved, 200 * MIB);
}

/* A tick, then the guard's check on a node of 256 MiB with 240 in use,
 * its line at 90% (230.4), at most one eviction a minute. */
static void check_a_full_node(void)
{
	mts_core_tick(&srv.reg);
	fake_cgroup("268435456\n", 240 * MIB, 0);
	struct mts_node_src src = {.kind = MTS_NODE_CGROUP_V2};
	snprintf(src.dir, sizeof(src.dir), "%s", dir);
	struct mts_node_fig fig = {0};
	srv.reg.policy.guard_interval_ms = 60000;
	mts_guard_apply(&srv.reg, &src, &fig);
	mts_guard_check(&srv.reg, mts_now_monotonic());
}

/* Slot `slot` as a client with two threads publishes it: thread `tid`'s
 * lane holds `mine`, another thread's `other`. */
static void two_lanes(uint32_t slot, uint32_t tid, int64_t mine, int64_t other)
{
	struct mtshm_slot_id *s = mts_slot(&srv.reg, slot);
	mtshm_store_relaxed32(&s->threads, 2);
	mtshm_store_relaxed32(&s->lanes_used, 2);
	mtshm_store_relaxed32(&mtshm_lane(s, 0)->owner, tid);
	mtshm_store_relaxeds64(&mtshm_lane(s, 0)->bytes, mine);
	mtshm_store_relaxed32(&mtshm_lane(s, 1)->owner, tid + 1);
	mtshm_store_relaxeds64(&mtshm_lane(s, 1)->bytes, other);
}

/* Process `a` of uid 2000 asks for one byte, run in it on thread 77: it
 * hosts a task from now on. */
static void one_byte_in_process(pid_t a)
{
	Memtally__V1__Response *r = fx_admit_hosted(a, 2000, 1, "", 77, 0);
	cr_assert(r->admit_result->admitted && r->admit_result->in_process);
	memtally__v1__response__free_unpacked(r, NULL);
}

/* Task "b" of FX_UID 30 MiB beyond its 10 MiB reservation, and a process
 * of uid 2000 that will host a task: its slot (*pid: its pid). */
static uint32_t host_beside_b(pid_t *pid)
{
	fx_start();
	reserve(FX_UID, "b", 10 * MIB);
	task_worker(FX_UID, "b", 40 * MIB);
	*pid = fx_spawn();
	return fx_register_as(*pid, 2000, "default", "");
}

Test(guard, a_hosts_own_growth_after_its_grants_is_beyond)
{
	/* Another uid's process of 20 MiB asks for one byte, to be run on
	 * its thread 77: it hosts a task now. */
	pid_t a;
	uint32_t slot = host_beside_b(&a);
	two_lanes(slot, 77, 0, 20 * MIB);
	mts_core_tick(&srv.reg);
	one_byte_in_process(a);
	enum mts_guard_rule rule;
	const struct mts_guard_cand *k = choose(&rule);
	cr_assert_str_eq(k->task, "b");
	/* Then its other thread takes 180 MiB that nobody admitted: not
	 * its reservation, so it is the one beyond, not b. */
	two_lanes(slot, 77, 0, 200 * MIB);
	k = choose(&rule);
	cr_assert_eq(k->pid, (uint32_t)a, "chose %s (pid %u)", k->task, k->pid);
	cr_assert_eq(rule, MTS_GUARD_BEYOND);
	cr_assert_eq(k->used, 200 * MIB);
	/* Untrusted: its own memory was never admitted, only the byte. */
	cr_assert_eq(k->reserved, 1);
}

Test(guard, an_untrusted_hosts_own_memory_is_not_its_reservation)
{
	/* Another uid's process holds 110 MiB, then asks for one byte in
	 * process. What it held was never admitted: counted as reserved, it
	 * shielded all of it, and b (30 MiB beyond its 10) went in its
	 * place. */
	pid_t a;
	uint32_t slot = host_beside_b(&a);
	two_lanes(slot, 77, 0, 110 * MIB);
	mts_core_tick(&srv.reg);
	one_byte_in_process(a);
	enum mts_guard_rule rule;
	const struct mts_guard_cand *k = choose(&rule);
	cr_assert_eq(k->pid, (uint32_t)a, "chose %s (pid %u)", k->task, k->pid);
	cr_assert_eq(rule, MTS_GUARD_BEYOND);
	cr_assert_eq(k->reserved, 1);
	cr_assert_eq(k->used, 110 * MIB);
}

Test(guard, a_hosts_own_memory_counts_as_of_its_latest_grant)
{
	/* A trusted host (a Dask worker of root's): its own memory at its
	 * latest grant is its reservation too. */
	fx_start();
	reserve(FX_UID, "b", 10 * MIB);
	task_worker(FX_UID, "b", 40 * MIB); /* 30 MiB beyond */
	pid_t a = fx_spawn();
	uint32_t slot = fx_register_as(a, FX_UID, "default", "");
	/* Granted while it holds 100 MiB of its own; then it gives 80
	 * back (room others may be admitted into) and is granted again. */
	two_lanes(slot, 77, 0, 100 * MIB);
	mts_core_tick(&srv.reg);
	Memtally__V1__Response *r = fx_admit_hosted(a, FX_UID, 1, "", 77, 0);
	cr_assert(r->admit_result->admitted && r->admit_result->in_process);
	memtally__v1__response__free_unpacked(r, NULL);
	enum mts_guard_rule rule;
	const struct mts_guard_cand *k = choose(&rule);
	cr_assert_str_eq(k->task, "b",
	                 "a trusted host's own memory at its "
	                 "grant is beyond by nothing");
	two_lanes(slot, 77, 0, 20 * MIB);
	mts_core_tick(&srv.reg);
	struct timespec ts = {0, 2 * 1000 * 1000};
	nanosleep(&ts, NULL); /* a later grant */
	r = fx_admit_hosted(a, FX_UID, 1, "", 77, 0);
	cr_assert(r->admit_result->admitted && r->admit_result->in_process);
	memtally__v1__response__free_unpacked(r, NULL);
	/* Taking the 80 MiB again is beyond: the first grant's 100 is
	 * not its to keep. */
	two_lanes(slot, 77, 0, 100 * MIB);
	k = choose(&rule);
	cr_assert_eq(k->pid, (uint32_t)a, "chose %s (pid %u)", k->task, k->pid);
	cr_assert_eq(k->reserved, 20 * MIB + 2);
}

Test(guard, a_uid_beyond_across_many_processes_goes_first)
{
	/* Task b of FX_UID is 30 MiB beyond its 10. Uid 2000 runs five
	 * processes without a task, 14 MiB each (one 15): none as far
	 * beyond as b, together 71. Its largest goes, not b. */
	fx_start();
	reserve(FX_UID, "b", 10 * MIB);
	task_worker(FX_UID, "b", 40 * MIB);
	pid_t big = 0;
	for (int i = 0; i < 5; i++) {
		pid_t p = task_worker(2000, "", (14 + (i == 4)) * MIB);
		if (i == 4)
			big = p;
	}
	enum mts_guard_rule rule;
	const struct mts_guard_cand *k = choose(&rule);
	cr_assert_eq(k->uid, 2000, "chose %s of uid %u", k->task, k->uid);
	cr_assert_eq(k->pid, (uint32_t)big);
	cr_assert_eq(k->uid_beyond, 71 * MIB);
	cr_assert_eq(rule, MTS_GUARD_BEYOND);
}

Test(guard, a_task_workers_hosted_runs_are_evicted_with_it)
{
	fx_start();
	/* A worker of task "job" (a Dask worker under `memtally run`) runs
	 * a 100 MiB task of kind "parse" inside it. */
	reserve(FX_UID, "job", 20 * MIB);
	pid_t host = task_worker(FX_UID, "job", 20 * MIB);
	mts_core_tick(&srv.reg);
	Memtally__V1__Response *r =
	    fx_admit_hosted(host, FX_UID, 100 * MIB, "parse", 0, 0);
	cr_assert(r->admit_result->in_process);
	memtally__v1__response__free_unpacked(r, NULL);
	fx_write(mts_find_pid(&srv.reg, (uint32_t)host)->slot, 100 * MIB);
	/* Its hosted grant is room it may hold, as the task's own is. */
	enum mts_guard_rule rule;
	const struct mts_guard_cand *k = choose(&rule);
	cr_assert_str_eq(k->task, "job");
	cr_assert_eq(k->reserved, 120 * MIB);
	cr_assert_neq(rule, MTS_GUARD_BEYOND);
	/* Past it, evicted: the hosted run is an evicted run of "parse". */
	fx_write(mts_find_pid(&srv.reg, (uint32_t)host)->slot, 240 * MIB);
	mts_core_tick(&srv.reg);
	check_a_full_node();
	cr_assert_eq(srv.reg.guard->evictions, 1);
	struct mts_kind *kd = mts_kind_find(&srv.reg, "parse", FX_UID);
	cr_assert_not_null(kd);
	cr_assert_eq(kd->evictions, 1);
}

/* A server whose tcp_token a scheduler holds. */
static void start_with_token(void)
{
	mts_policy_defaults(&pol);
	pol.tcp_token = strdup("a-long-enough-secret");
	fx_start_policy(&pol);
}

/* The scheduler grants `task` (of `kind`, or "") `bytes` over TCP: a
 * reservation without an owner, which any worker of the task counts
 * against. */
static void grant_over_tcp(const char *task, const char *kind, uint64_t bytes)
{
	Memtally__V1__Request req = MEMTALLY__V1__REQUEST__INIT;
	Memtally__V1__Admit a = MEMTALLY__V1__ADMIT__INIT;
	a.bytes = bytes;
	a.group = (char *)"";
	a.task = (char *)task;
	a.kind = (char *)kind;
	req.body_case = MEMTALLY__V1__REQUEST__BODY_ADMIT;
	req.admit = &a;
	req.token = (char *)"a-long-enough-secret";
	struct mts_peer tcp = {.fd = -1, .tcp = true};
	Memtally__V1__Response *r = fx_call(&tcp, &req);
	cr_assert(r->admit_result->admitted, "%s", r->admit_result->reason);
	memtally__v1__response__free_unpacked(r, NULL);
}

/* The guard's choice is `stranger`'s candidate of task "etl", beyond its
 * reservation, and the grant without an owner went `own` to FX_UID's
 * workers, `rest` to the stranger's. */
static void expect_etl_split(pid_t stranger, uint64_t own, uint64_t rest)
{
	enum mts_guard_rule rule;
	struct mts_guard_cand *c;
	uint32_t n;
	int i;
	mts_core_tick(&srv.reg);
	cr_assert_eq(mts_guard_candidates(&srv.reg, &c, &n, &i, &rule), 0);
	cr_assert_geq(i, 0);
	cr_assert_eq(rule, MTS_GUARD_BEYOND);
	cr_assert_str_eq(c[i].task, "etl");
	cr_assert_eq(c[i].uid, 2000);
	cr_assert_eq(c[i].pid, (uint32_t)stranger);
	for (uint32_t m = 0; m < n; m++)
		if (strcmp(c[m].task, "etl") == 0)
			cr_assert_eq(c[m].reserved,
			             c[m].uid == 2000 ? rest : own,
			             "uid %u: %llu", c[m].uid,
			             (unsigned long long)c[m].reserved);
	free(c);
}

Test(guard, a_grant_without_an_owner_goes_to_its_first_workers_not_to_each)
{
	start_with_token();
	/* A scheduler with the token, over TCP, grants task "etl" 200 MiB:
	 * a reservation without an owner, which any worker of the task
	 * counts against. */
	grant_over_tcp("etl", "", 200 * MIB);
	/* Its worker holds 150; a user naming the task later holds 190.
	 * Each is within 200 alone, 140 beyond it together. Another user's
	 * task is 30 beyond its own reservation. */
	task_worker(FX_UID, "etl", 150 * MIB);
	nanosleep(&(struct timespec){0, 2 * 1000 * 1000}, NULL);
	pid_t stranger = task_worker(2000, "etl", 190 * MIB);
	reserve(3000, "calm", 10 * MIB);
	task_worker(3000, "calm", 40 * MIB);
	/* The grant goes first to the workers that joined the task first:
	 * 150 to the scheduler's, the 50 left to the stranger, which is the
	 * furthest beyond (140), not the other user's task. */
	expect_etl_split(stranger, 150 * MIB, 50 * MIB);
	/* A smaller stranger (100) does not push the scheduler's workers,
	 * within the grant, past it: it is 50 beyond, and goes. */
	fx_write(mts_find_pid(&srv.reg, (uint32_t)stranger)->slot, 100 * MIB);
	expect_etl_split(stranger, 150 * MIB, 50 * MIB);
}

Test(guard, a_process_naming_a_task_before_its_grant_is_served_last)
{
	start_with_token();
	/* A user leaves a process running under the name a scheduler will
	 * grant ("etl", 190 MiB); then the grant, then its worker (150). */
	pid_t stranger = task_worker(2000, "etl", 190 * MIB);
	mts_core_tick(&srv.reg);
	nanosleep(&(struct timespec){0, 2 * 1000 * 1000}, NULL);
	grant_over_tcp("etl", "", 200 * MIB);
	nanosleep(&(struct timespec){0, 2 * 1000 * 1000}, NULL);
	task_worker(FX_UID, "etl", 150 * MIB);
	reserve(3000, "calm", 10 * MIB);
	task_worker(3000, "calm", 40 * MIB);
	/* The grant goes to the workers started under it: 150 to the
	 * scheduler's, 50 to the earlier process, which goes. */
	expect_etl_split(stranger, 150 * MIB, 50 * MIB);
}

Test(guard, a_strangers_eviction_marks_no_schedulers_grant)
{
	start_with_token();
	/* The scheduler's grant of "etl" over TCP, of a kind: no owner. */
	grant_over_tcp("etl", "etl", 200 * MIB);
	cr_assert_eq(srv.reg.adm->nresv, 1);
	/* Its worker first, within the grant; a user naming the task later,
	 * past what the grant leaves it: the stranger goes. */
	pid_t own = task_worker(FX_UID, "etl", 150 * MIB);
	nanosleep(&(struct timespec){0, 2 * 1000 * 1000}, NULL);
	pid_t stranger = task_worker(2000, "etl", 190 * MIB);
	check_a_full_node();
	cr_assert_eq(srv.reg.guard->evictions, 1);
	int st;
	cr_assert_eq(waitpid(stranger, &st, 0), stranger);
	cr_assert(WIFSIGNALED(st) && WTERMSIG(st) == SIGKILL);
	cr_assert_eq(waitpid(own, &st, WNOHANG), 0, "the scheduler's went");
	/* The scheduler's task runs on: its grant is not an evicted run,
	 * and its kind will learn the run's real end. */
	cr_assert_eq(srv.reg.adm->nresv, 1);
	cr_assert_not(srv.reg.adm->resv[0]->evicted,
	              "a stranger's eviction marked the scheduler's grant");
}

/* A child that forks a grandchild, both paused; the grandchild's pid. */
static pid_t spawn_family(pid_t *child)
{
	int p[2];
	cr_assert_eq(pipe(p), 0);
	pid_t pid = fx_fork();
	if (pid == 0) {
		pid_t g = fork();
		if (g == 0) {
			for (;;)
				pause();
		}
		if (write(p[1], &g, sizeof(g)) != sizeof(g))
			_exit(1);
		for (;;)
			pause();
	}
	pid_t g;
	cr_assert_eq(read(p[0], &g, sizeof(g)), (ssize_t)sizeof(g));
	close(p[0]);
	close(p[1]);
	kids[nkids++] = pid;
	*child = pid;
	return g;
}

static bool gone(pid_t pid)
{
	char path[64], buf[256];
	snprintf(path, sizeof(path), "/proc/%d/stat", (int)pid);
	FILE *f = fopen(path, "r");
	if (!f)
		return true;
	size_t n = fread(buf, 1, sizeof(buf) - 1, f);
	fclose(f);
	buf[n] = '\0';
	const char *rp = strrchr(buf, ')');
	return rp && (rp[2] == 'Z' || rp[2] == 'X');
}

Test(guard, past_the_line_the_tree_goes_and_an_event_says_so)
{
	fx_start();
	reserve(FX_UID, "leak", 10 * MIB);
	reserve(FX_UID, "calm", 100 * MIB);
	pid_t leak;
	pid_t grandchild = spawn_family(&leak);
	fx_write(fx_register_as(leak, FX_UID, "default", "leak"),
	         (int64_t)(60 * MIB));
	pid_t calm = task_worker(FX_UID, "calm", 50 * MIB);
	nevents = 0;
	check_a_full_node();

	cr_assert_eq(srv.reg.guard->evictions, 1);
	cr_assert_eq(srv.reg.guard->signalled, 2, "the worker and its child");
	int st;
	cr_assert_eq(waitpid(leak, &st, 0), leak);
	cr_assert(WIFSIGNALED(st) && WTERMSIG(st) == SIGKILL);
	uint64_t end = fx_deadline_ms(5000);
	while (!gone(grandchild) && fx_ms() < end)
		nanosleep(&(struct timespec){0, 10 * 1000 * 1000}, NULL);
	cr_assert(gone(grandchild), "the unregistered grandchild lives");
	cr_assert_eq(waitpid(calm, &st, WNOHANG), 0, "calm was touched");
	cr_assert_eq(nevents, 1);
	cr_assert_str_eq(events[0].scope, "task:leak");
	cr_assert_eq(events[0].bytes, 60 * MIB);
	cr_assert_eq(events[0].reserved, 10 * MIB);
	cr_assert_eq(events[0].limit, 256 * MIB * 9 / 10);

	/* Within the interval, past the line still: nobody else. */
	mts_guard_check(&srv.reg, mts_now_monotonic());
	cr_assert_eq(srv.reg.guard->evictions, 1);
	cr_assert_eq(waitpid(calm, &st, WNOHANG), 0);
}

/* A child with `n` children of its own, all paused; the child's pid once
 * they have all been forked. Each dies with its parent. */
/* A child of the wide tree: it shares its parent's memory (CLONE_VM), so
 * making 850 of them copies no page tables. A sanitized process's are
 * large: 850 fork()s took seconds of kernel time alone and past 30 s on a
 * loaded 2-core CI machine. It runs on a stack the sanitizers do not know
 * and on its parent's thread pointer, so it calls nothing but raw system
 * calls. */
__attribute__((no_sanitize("address", "undefined", "thread"))) static int
wide_child(void *parent)
{
	syscall(SYS_prctl, PR_SET_PDEATHSIG, SIGKILL, 0, 0, 0);
	if (syscall(SYS_getppid) != (long)(intptr_t)parent)
		syscall(SYS_exit, 1);
	for (;;)
		syscall(SYS_pause);
	return 0;
}

static pid_t spawn_wide(int n)
{
	int p[2];
	cr_assert_eq(pipe(p), 0);
	pid_t pid = fx_fork();
	if (pid == 0) {
		enum { STACK = 16 * 1024 };
		char *stacks =
		    mmap(NULL, (size_t)n * STACK, PROT_READ | PROT_WRITE,
		         MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
		if (stacks == MAP_FAILED)
			_exit(1);
		void *self = (void *)(intptr_t)getpid();
		for (int i = 0; i < n; i++)
			if (clone(wide_child, stacks + (size_t)(i + 1) * STACK,
			          CLONE_VM | SIGCHLD, self) < 0)
				_exit(1);
		if (write(p[1], "x", 1) != 1)
			_exit(1);
		for (;;)
			pause();
	}
	char c;
	cr_assert_eq(read(p[0], &c, 1), 1, "the children were not made");
	close(p[0]);
	close(p[1]);
	kids[nkids++] = pid;
	return pid;
}

Test(guard, a_wide_tree_goes_whole)
{
	fx_start();
	/* 850 children: their pids (4 digits and more) fill more than a page of
	 * one thread's children file. The guard holds a pidfd of each: room for
	 * them past a soft limit of 1024. */
	struct rlimit rl;
	cr_assert_eq(getrlimit(RLIMIT_NOFILE, &rl), 0);
	if (rl.rlim_cur < 4096 && rl.rlim_max > rl.rlim_cur) {
		rl.rlim_cur = rl.rlim_max < 4096 ? rl.rlim_max : 4096;
		cr_assert_eq(setrlimit(RLIMIT_NOFILE, &rl), 0);
	}
	reserve(FX_UID, "wide", 10 * MIB);
	pid_t wide = spawn_wide(850);
	fx_write(fx_register_as(wide, FX_UID, "default", "wide"),
	         (int64_t)(60 * MIB));
	check_a_full_node();
	cr_assert_eq(srv.reg.guard->evictions, 1);
	cr_assert_eq(srv.reg.guard->signalled, 851,
	             "the worker and its 850 children");
	int st;
	cr_assert_eq(waitpid(wide, &st, 0), wide);
	cr_assert(WIFSIGNALED(st) && WTERMSIG(st) == SIGKILL);
}

/* The guard on a fake cgroup v2 node: 500 MiB in use of which 100 is
 * inactive file pages (the node's figure: 400 MiB), line 800 MiB. */
static void guard_on_node_of_400_line_800(void)
{
	fake_cgroup("1073741824\n", 500 * MIB, 100 * MIB);
	struct mts_node_src src = {.kind = MTS_NODE_CGROUP_V2};
	snprintf(src.dir, sizeof(src.dir), "%s", dir);
	struct mts_node_fig fig;
	cr_assert_eq(mts_node_read(&src, &fig), 0);
	fig.line = 800 * MIB;
	mts_guard_apply(&srv.reg, &src, &fig);
}

Test(guard, admission_fits_under_the_line_by_the_nodes_figure)
{
	fx_start();
	mts_policy_defaults(&pol);
	guard_on_node_of_400_line_800();
	/* The line alone: no room kept for the request denied below. */
	srv.reg.policy.admit_queue = false;
	/* 400 in use + 300 requested <= 800. */
	reserve(FX_UID, "a", 300 * MIB);
	/* 400 + 300 reserved + 150 > 800: refused, by the node. */
	Memtally__V1__Response *r = fx_admit(FX_UID, 150 * MIB, "", "b", 0);
	cr_assert(!r->admit_result->admitted);
	cr_assert_str_eq(r->admit_result->limit_scope, "node");
	cr_assert_eq(r->admit_result->limit, 800 * MIB);
	cr_assert(strstr(r->admit_result->reason, "400 MiB") &&
	              strstr(r->admit_result->reason, "300 MiB reserved") &&
	              strstr(r->admit_result->reason, "[guard] line"),
	          "%s", r->admit_result->reason);
	memtally__v1__response__free_unpacked(r, NULL);
	cr_assert_eq(srv.reg.adm->stats.denials[MTS_DENY_NODE], 1);
	/* 100 more fits. */
	reserve(FX_UID, "c", 100 * MIB);
}

/* A first run of kind "big" declaring `declared`: denied, then, asked
 * again past the queue's time (100 ms), granted `room`. */
static void first_run_denied_then_sized(uint64_t declared, uint64_t room)
{
	Memtally__V1__Request req = MEMTALLY__V1__REQUEST__INIT;
	Memtally__V1__Admit a = MEMTALLY__V1__ADMIT__INIT;
	a.bytes = declared;
	a.group = (char *)"";
	a.task = (char *)"T1";
	a.kind = (char *)"big";
	req.body_case = MEMTALLY__V1__REQUEST__BODY_ADMIT;
	req.admit = &a;
	struct mts_peer peer = fx_peer(getpid(), FX_UID);
	Memtally__V1__Response *r = fx_call(&peer, &req);
	cr_assert_not(r->admit_result->admitted);
	memtally__v1__response__free_unpacked(r, NULL);
	usleep(150000);
	r = fx_call(&peer, &req);
	cr_assert(r->admit_result->admitted, "%s", r->admit_result->reason);
	cr_assert_eq(
	    r->admit_result->reserved_for_task, room, "%llu MiB",
	    (unsigned long long)(r->admit_result->reserved_for_task / MIB));
	memtally__v1__response__free_unpacked(r, NULL);
}

Test(guard, a_first_run_is_sized_to_the_room_under_the_line_too)
{
	/* A fleet limit of 1000 MiB, 100 counted outside any reservation:
	 * the fleet has 900 for a first run declared at 950. The kernel
	 * sees 400 on the node, line 800: the node has 400. Sized at 900 it
	 * would be denied by the line for ever, and the room the queue keeps
	 * for it would hold back every other request. */
	mts_policy_defaults(&pol);
	pol.fleet_limit = 1000 * MIB;
	pol.admit_queue_ms = 100;
	fx_start_policy(&pol);
	task_worker(FX_UID, "", 100 * MIB);
	mts_core_tick(&srv.reg);
	guard_on_node_of_400_line_800();

	first_run_denied_then_sized(950 * MIB, 400 * MIB);
}

Test(guard, a_first_run_is_sized_to_the_room_under_the_line_without_a_limit)
{
	/* No fleet limit: the node guard's line alone bounds a grant. The
	 * kernel sees 400 MiB on the node, line 800: a first run declared
	 * at 700 would be denied for ever; once it waited the queue's time
	 * it is sized at the 400 the node has. */
	mts_policy_defaults(&pol);
	pol.admit_queue_ms = 100;
	fx_start_policy(&pol);
	guard_on_node_of_400_line_800();

	first_run_denied_then_sized(700 * MIB, 400 * MIB);
}

/* Asks twice `ms` apart, denied both times: a waiter that has waited. */
static void wait_denied(uint32_t uid, uint64_t bytes, const char *task,
                        unsigned ms)
{
	for (int i = 0; i < 2; i++) {
		Memtally__V1__Response *r = fx_admit(uid, bytes, "", task, 0);
		cr_assert_not(r->admit_result->admitted, "%s asked twice",
		              task);
		memtally__v1__response__free_unpacked(r, NULL);
		if (!i)
			usleep(ms * 1000);
	}
}

Test(guard, a_request_no_node_could_grant_keeps_no_room)
{
	/* No fleet limit and so no per-uid share: only the line, 800 MiB,
	 * with 400 in use. */
	mts_policy_defaults(&pol);
	pol.admit_queue_ms = 100;
	fx_start_policy(&pol);
	guard_on_node_of_400_line_800();
	/* 4 GiB could never be granted here: waiting, it keeps nothing,
	 * and another uid's 10 MiB goes at once. */
	wait_denied(FX_UID + 1, 4096 * MIB, "huge", 150);
	Memtally__V1__Response *r =
	    fx_admit(FX_UID + 2, 10 * MIB, "", "small", 0);
	cr_assert(r->admit_result->admitted, "%s", r->admit_result->reason);
	memtally__v1__response__free_unpacked(r, NULL);
	/* 500 MiB could be, once the node has room: it keeps it, and the
	 * next 10 MiB waits behind it. */
	wait_denied(FX_UID + 1, 500 * MIB, "large", 150);
	r = fx_admit(FX_UID + 2, 10 * MIB, "", "small2", 0);
	cr_assert_not(r->admit_result->admitted);
	cr_assert(strstr(r->admit_result->reason,
	                 "kept for the request waiting longest"),
	          "%s", r->admit_result->reason);
	memtally__v1__response__free_unpacked(r, NULL);
}

Test(guard, a_full_queue_keeps_the_request_waiting_longest)
{
	mts_policy_defaults(&pol);
	fx_start_policy(&pol);
	guard_on_node_of_400_line_800();
	/* 64 waiters asking still, the first waiting longest and asking
	 * least often (as `memtally run --wait` backs off). */
	uint64_t now = mts_now_monotonic(), s = UINT64_C(1000000000);
	struct mts_admission *adm = srv.reg.adm;
	for (uint32_t i = 0; i < MTS_WAITERS; i++)
		adm->waiters[i] = (struct mts_waiter){
		    .who = (uint64_t)9999 << 32 | (i + 1),
		    .first_ns = now - (i ? 5 : 20) * s,
		    .last_ns = now - (i ? 2 * s : 5 * s / 2),
		    .bytes = 500 * MIB};
	adm->nwaiters = MTS_WAITERS;
	/* A newcomer denied for room: no place, and no one loses theirs. */
	Memtally__V1__Response *r = fx_admit(FX_UID, 500 * MIB, "", "new", 0);
	cr_assert_not(r->admit_result->admitted);
	memtally__v1__response__free_unpacked(r, NULL);
	cr_assert_eq(adm->nwaiters, MTS_WAITERS);
	cr_assert_eq(adm->waiters[0].who, (uint64_t)9999 << 32 | 1);
	cr_assert_eq(adm->waiters[0].first_ns, now - 20 * s);
	for (uint32_t i = 0; i < MTS_WAITERS; i++)
		cr_assert_eq(adm->waiters[i].who >> 32, 9999, "place %u", i);
	/* One that has left (silent 4 s) gives way to it. */
	adm->waiters[5].last_ns = now - 4 * s;
	r = fx_admit(FX_UID, 500 * MIB, "", "new", 0);
	memtally__v1__response__free_unpacked(r, NULL);
	cr_assert_eq(adm->waiters[5].who >> 32, FX_UID);
	cr_assert_eq(adm->waiters[0].who, (uint64_t)9999 << 32 | 1);
}

Test(guard, one_uid_holds_an_eighth_of_the_queue)
{
	/* One user asking for 64 tasks held every place of the queue, and
	 * its head, so that no other user's large request was ever kept
	 * room for. Found in review. */
	mts_policy_defaults(&pol);
	fx_start_policy(&pol);
	guard_on_node_of_400_line_800();
	struct mts_admission *adm = srv.reg.adm;
	for (int i = 0; i < 12; i++) {
		char task[16];
		snprintf(task, sizeof(task), "q%d", i);
		Memtally__V1__Response *r =
		    fx_admit(3000, 500 * MIB, "", task, 0);
		cr_assert_not(r->admit_result->admitted);
		memtally__v1__response__free_unpacked(r, NULL);
	}
	cr_assert_eq(adm->nwaiters, MTS_WAITERS_PER_UID);
	Memtally__V1__Response *r = fx_admit(3001, 500 * MIB, "", "other", 0);
	cr_assert_not(r->admit_result->admitted);
	memtally__v1__response__free_unpacked(r, NULL);
	cr_assert_eq(adm->nwaiters, MTS_WAITERS_PER_UID + 1);
	cr_assert_eq(adm->waiters[MTS_WAITERS_PER_UID].who >> 32, 3001);
	/* An admin (root) is not held to it. */
	for (int i = 0; i < 12; i++) {
		char task[16];
		snprintf(task, sizeof(task), "a%d", i);
		r = fx_admit(0, 500 * MIB, "", task, 0);
		memtally__v1__response__free_unpacked(r, NULL);
	}
	cr_assert_eq(adm->nwaiters, MTS_WAITERS_PER_UID + 1 + 12);
}

/* /proc/PID/cgroup as each kind of machine writes it. */
static int cgroup_of(const char *text, const char **base, char *path)
{
	char buf[512];
	snprintf(buf, sizeof(buf), "%s", text);
	return mts_node_cgroup_path(buf, base, path, 128);
}

Test(guard_config, own_cgroup_on_every_hierarchy)
{
	const char *base;
	char path[128];
	/* cgroup v2 only (Debian 12, systemd's unified default). */
	cr_assert_eq(cgroup_of("0::/system.slice/job.service\n", &base, path),
	             0);
	cr_assert_str_eq(base, "/sys/fs/cgroup");
	cr_assert_str_eq(path, "/system.slice/job.service");
	/* Hybrid: v1's memory controller wins over the unified line. */
	cr_assert_eq(cgroup_of("12:pids:/a\n4:cpu,memory:/job/7\n"
	                       "0::/job/7\n",
	                       &base, path),
	             0);
	cr_assert_str_eq(base, "/sys/fs/cgroup/memory");
	cr_assert_str_eq(path, "/job/7");
	cr_assert_eq(cgroup_of("0::/u\n5:memory:/v\n", &base, path), 0);
	cr_assert_str_eq(base, "/sys/fs/cgroup/memory");
	cr_assert_str_eq(path, "/v");
	/* v1 without the memory controller, and no unified line. */
	cr_assert_eq(cgroup_of("3:cpu:/a\n4:memory_x:/b\n", &base, path),
	             -ENOENT);
	cr_assert_eq(cgroup_of("", &base, path), -ENOENT);
}

/* A v1 memory cgroup at `root``rel` whose limit is `limit` bytes. */
static void fake_v1(const char *root, const char *rel, const char *limit)
{
	char p[512], cmd[600];
	snprintf(p, sizeof(p), "%s%s", root, rel);
	snprintf(cmd, sizeof(cmd), "mkdir -p '%s'", p);
	cr_assert_eq(system(cmd), 0);
	const char *files[][2] = {{"memory.limit_in_bytes", limit},
	                          {"memory.usage_in_bytes", "104857600\n"},
	                          {"memory.stat", "total_inactive_file 0\n"}};
	for (size_t i = 0; i < 3; i++) {
		char f[600];
		snprintf(f, sizeof(f), "%s/%s", p, files[i][0]);
		FILE *fp = fopen(f, "w");
		cr_assert_not_null(fp);
		fputs(files[i][1], fp);
		fclose(fp);
	}
}

Test(guard_config, a_v1_container_without_a_cgroup_namespace_finds_its_own)
{
	/* Docker or Kubernetes on cgroup v1 without a cgroup namespace:
	 * /proc/self/cgroup names the host's path, and the container's own
	 * cgroup is mounted at the hierarchy's root. */
	char root[64], text[128], want[128], cmd[96];
	snprintf(root, sizeof(root), "/tmp/mt-guard-root-%ld", (long)getpid());
	fake_v1(root, "/sys/fs/cgroup/memory", "268435456\n");
	struct mts_node_src src = {0};
	snprintf(text, sizeof(text),
	         "12:pids:/docker/abc\n5:memory:/docker/abc\n");
	cr_assert_eq(mts_node_find_cgroup(text, root, &src), 0);
	cr_assert_eq(src.kind, MTS_NODE_CGROUP_V1);
	snprintf(want, sizeof(want), "%s/sys/fs/cgroup/memory", root);
	cr_assert_str_eq(src.dir, want);
	/* Where the path is there (a namespace, or the host), its own
	 * smaller limit wins. */
	fake_v1(root, "/sys/fs/cgroup/memory/docker/abc", "134217728\n");
	snprintf(text, sizeof(text), "5:memory:/docker/abc\n");
	cr_assert_eq(mts_node_find_cgroup(text, root, &src), 0);
	snprintf(want, sizeof(want), "%s/sys/fs/cgroup/memory/docker/abc",
	         root);
	cr_assert_str_eq(src.dir, want);
	/* A nested cgroup of 1 GiB inside that 128 MiB one: the smaller
	 * limit up the tree binds (the kernel acts there), not the
	 * nearest. */
	fake_v1(root, "/sys/fs/cgroup/memory/docker/abc/inner", "1073741824\n");
	snprintf(text, sizeof(text), "5:memory:/docker/abc/inner\n");
	cr_assert_eq(mts_node_find_cgroup(text, root, &src), 0);
	cr_assert_str_eq(src.dir, want);
	/* An unlimited root (the kernel's "unlimited") is no limit. */
	snprintf(cmd, sizeof(cmd), "rm -rf '%s'", root);
	cr_assert_eq(system(cmd), 0);
	fake_v1(root, "/sys/fs/cgroup/memory", "9223372036854771712\n");
	snprintf(text, sizeof(text), "5:memory:/docker/abc\n");
	cr_assert_eq(mts_node_find_cgroup(text, root, &src), -ENOENT);
	cr_assert_eq(src.kind, MTS_NODE_NONE);
	cr_assert_eq(system(cmd), 0);
}

/* ---- pausing before evicting --------------------------------------------- */

Test(guard_config, a_pause_needs_room_for_the_floor_and_the_rise)
{
	/* 640 MiB node, line 576: the floor is a quarter of the 64 MiB gap. */
	uint64_t lim = 640 * MIB, line = 576 * MIB;
	cr_assert(mts_guard_hold_safe(600 * MIB, line, lim, 0));
	cr_assert(mts_guard_hold_safe(624 * MIB, line, lim, 0), "16 left");
	cr_assert(!mts_guard_hold_safe(625 * MIB, line, lim, 0), "15 left");
	/* 40 MiB of room: 16 + 300 ms at 80 MiB/s (24) fits, at 81 not. */
	cr_assert(mts_guard_hold_safe(600 * MIB, line, lim, 80.0 * MIB));
	cr_assert(!mts_guard_hold_safe(600 * MIB, line, lim, 81.0 * MIB));
	/* A node that falls needs only the floor. */
	cr_assert(mts_guard_hold_safe(620 * MIB, line, lim, -500.0 * MIB));
	cr_assert(!mts_guard_hold_safe(lim, line, lim, 0), "at the limit");
	cr_assert(!mts_guard_hold_safe(700 * MIB, line, lim, 0), "beyond it");
}

/* /proc/PID/stat's state letter, or 0. */
static char state_of(pid_t pid)
{
	char path[64], buf[512];
	snprintf(path, sizeof(path), "/proc/%d/stat", (int)pid);
	FILE *f = fopen(path, "r");
	if (!f)
		return 0;
	size_t n = fread(buf, 1, sizeof(buf) - 1, f);
	fclose(f);
	buf[n] = '\0';
	const char *rp = strrchr(buf, ')');
	return rp ? rp[2] : 0;
}

/* Wait (bounded) for pid's state to be, or not to be, stopped. */
static bool stopped_becomes(pid_t pid, bool stopped)
{
	uint64_t end = fx_deadline_ms(5000);
	while (((state_of(pid) == 'T') != stopped) && fx_ms() < end)
		nanosleep(&(struct timespec){0, 5 * 1000 * 1000}, NULL);
	return (state_of(pid) == 'T') == stopped;
}

#define NODE_LIMIT "671088640\n" /* 640 MiB, the line at 90%: 576 MiB */
#define MS         (UINT64_C(1000000))

/* A task "grow" within its 100 MiB reservation, rising 10 MiB/s over the
 * last 3 s, and a steady "calm"; the guard on a 640 MiB node with usage
 * `mib`, read at `now`. Returns grow's pid (*calm: calm's). */
static pid_t grower_on_node_with(uint64_t mib, uint64_t now, pid_t *calm,
                                 bool record)
{
	/* A pause needs a restart record: a memtallyd that died holding
	 * the task would leave it stopped for ever without one. */
	if (record)
		fx_start_with_record("guard");
	else
		fx_start();
	reserve(FX_UID, "grow", 100 * MIB);
	reserve(FX_UID, "calm", 100 * MIB);
	pid_t grow = fx_spawn();
	uint32_t slot = fx_register_as(grow, FX_UID, "default", "grow");
	fx_write(slot, (int64_t)(60 * MIB));
	*calm = task_worker(FX_UID, "calm", 50 * MIB);
	mts_core_tick(&srv.reg);
	struct mts_proc *p = srv.reg.by_slot[slot];
	uint64_t w = (uint64_t)srv.reg.policy.growth_window_ms * MS;
	for (uint64_t s = 0; s <= 3; s++)
		mts_rate_add(&p->rate, now - (3 - s) * 1000 * MS,
		             (30 + 10 * s) * MIB, w, NULL);
	mts_policy_defaults(&pol);
	fake_cgroup(NODE_LIMIT, mib * MIB, 0);
	struct mts_node_src src = {.kind = MTS_NODE_CGROUP_V2};
	snprintf(src.dir, sizeof(src.dir), "%s", dir);
	struct mts_node_fig fig = {0};
	mts_guard_apply(&srv.reg, &src, &fig);
	nevents = 0;
	return grow;
}

static pid_t grower_on_node(uint64_t mib, uint64_t now, pid_t *calm)
{
	return grower_on_node_with(mib, now, calm, true);
}

static void node_at(uint64_t mib)
{
	fake_cgroup(NODE_LIMIT, mib * MIB, 0);
}

/* `pid` was killed (the guard's SIGKILL), and `calm` lives. */
static void evicted_not_calm(pid_t pid, pid_t calm)
{
	int st;
	cr_assert_eq(waitpid(pid, &st, 0), pid);
	cr_assert(WIFSIGNALED(st) && WTERMSIG(st) == SIGKILL);
	cr_assert_eq(waitpid(calm, &st, WNOHANG), 0, "calm was touched");
}

Test(guard, a_grower_is_paused_then_resumed_when_the_node_comes_back)
{
	uint64_t t = mts_now_monotonic();
	pid_t calm;
	pid_t grow = grower_on_node(600, t, &calm);
	mts_guard_check(&srv.reg, t);
	cr_assert_not_null(srv.reg.guard->hold, "not paused");
	cr_assert_eq(srv.reg.guard->pauses, 1);
	cr_assert_eq(srv.reg.guard->evictions, 0);
	cr_assert(stopped_becomes(grow, true), "grow is not stopped");
	cr_assert_neq(state_of(calm), 'T', "calm was stopped");
	cr_assert_eq(nevents, 1);
	cr_assert_str_eq(events[0].scope, "task:grow");
	cr_assert_eq(events[0].state, MTSHM_STATE_HIGH);

	/* Past the line, no rise: it stays paused, nobody is evicted. */
	mts_guard_check(&srv.reg, t + 100 * MS);
	cr_assert_not_null(srv.reg.guard->hold);
	cr_assert_eq(srv.reg.guard->evictions, 0);

	/* Under the line, but by less than the floor (16 MiB): still held,
	 * or a node at the line would stop and start it at every read. */
	node_at(565);
	mts_guard_check(&srv.reg, t + 150 * MS);
	cr_assert_not_null(srv.reg.guard->hold, "resumed at the line");
	cr_assert_eq(srv.reg.guard->evictions, 0);

	/* Back under the line by the floor: it goes on. */
	node_at(560);
	mts_guard_check(&srv.reg, t + 200 * MS);
	cr_assert_null(srv.reg.guard->hold);
	cr_assert_eq(srv.reg.guard->resumed, 1);
	cr_assert(stopped_becomes(grow, false), "grow is still stopped");
	cr_assert_eq(nevents, 2);
	cr_assert_eq(events[1].state, MTSHM_STATE_OK);
	cr_assert_eq(srv.reg.guard->evictions, 0);

	/* Past the line again at once: a resume is no eviction, so the
	 * guard may act without waiting out its interval. */
	node_at(600);
	mts_guard_check(&srv.reg, t + 300 * MS);
	cr_assert_not_null(srv.reg.guard->hold, "not paused again");
	cr_assert_eq(srv.reg.guard->pauses, 2);
}

Test(guard, a_worker_without_its_record_entry_is_marked_then_paused)
{
	/* Its registration's write failed (a full /run), or its entry was
	 * lost: it was stopped unmarked, and a memtallyd killed while
	 * holding it left it stopped for good. Found in review. */
	uint64_t t = mts_now_monotonic();
	pid_t calm;
	pid_t grow = grower_on_node(600, t, &calm);
	uint32_t slot = mts_find_pid(&srv.reg, (uint32_t)grow)->slot;
	struct mts_state_rec r;
	mts_state_clear(srv.reg.state, slot);
	cr_assert_eq(mts_state_get(srv.reg.state, slot, &r), -ENOENT);
	mts_guard_check(&srv.reg, t);
	cr_assert_not_null(srv.reg.guard->hold, "not paused");
	cr_assert(stopped_becomes(grow, true), "grow is not stopped");
	cr_assert_eq(mts_state_get(srv.reg.state, slot, &r), 0,
	             "paused without an entry");
	cr_assert_eq(r.pid, (uint32_t)grow);
	cr_assert(r.held, "paused unmarked");
}

Test(guard, a_paused_task_goes_when_the_node_still_rises)
{
	uint64_t t = mts_now_monotonic();
	pid_t calm;
	pid_t grow = grower_on_node(600, t, &calm);
	mts_guard_check(&srv.reg, t);
	cr_assert_not_null(srv.reg.guard->hold);
	/* The others add 12 MiB in 100 ms (120 MiB/s): 28 MiB of room is
	 * under 16 + 36. */
	node_at(612);
	mts_guard_check(&srv.reg, t + 100 * MS);
	cr_assert_null(srv.reg.guard->hold);
	cr_assert_eq(srv.reg.guard->evictions, 1);
	evicted_not_calm(grow, calm);
	cr_assert_eq(nevents, 2);
	cr_assert_eq(events[1].state, MTSHM_STATE_OVER);
	cr_assert_str_eq(events[1].scope, "task:grow");
}

Test(guard, a_paused_task_goes_when_its_time_is_up)
{
	uint64_t t = mts_now_monotonic();
	pid_t calm;
	pid_t grow = grower_on_node(600, t, &calm);
	uint64_t interval = srv.reg.guard->interval_ms * MS;
	mts_guard_check(&srv.reg, t);
	cr_assert_not_null(srv.reg.guard->hold);
	mts_guard_check(&srv.reg, t + interval - MS);
	cr_assert_not_null(srv.reg.guard->hold, "gone before its time");
	mts_guard_check(&srv.reg, t + interval);
	cr_assert_eq(srv.reg.guard->evictions, 1);
	evicted_not_calm(grow, calm);
}

Test(guard, no_pause_without_room)
{
	/* 15 MiB of room: under the floor, evicted at once. */
	uint64_t t = mts_now_monotonic();
	pid_t calm;
	pid_t grow = grower_on_node(625, t, &calm);
	mts_guard_check(&srv.reg, t);
	cr_assert_null(srv.reg.guard->hold);
	cr_assert_eq(srv.reg.guard->pauses, 0);
	cr_assert_eq(srv.reg.guard->evictions, 1);
	evicted_not_calm(grow, calm);
	cr_assert_eq(nevents, 1);
	cr_assert_eq(events[0].state, MTSHM_STATE_OVER);
}

Test(guard, pause_off_evicts_at_once)
{
	uint64_t t = mts_now_monotonic();
	pid_t calm;
	pid_t grow = grower_on_node(600, t, &calm);
	srv.reg.guard->pause = false;
	mts_guard_check(&srv.reg, t);
	cr_assert_null(srv.reg.guard->hold);
	cr_assert_eq(srv.reg.guard->evictions, 1);
	evicted_not_calm(grow, calm);
}

Test(guard, without_a_restart_record_a_grower_is_evicted_not_paused)
{
	uint64_t t = mts_now_monotonic();
	pid_t calm;
	pid_t grow = grower_on_node_with(600, t, &calm, false);
	cr_assert(srv.reg.guard->pause, "[guard] pause is on");
	mts_guard_check(&srv.reg, t);
	cr_assert_null(srv.reg.guard->hold, "paused with no restart record");
	cr_assert_eq(srv.reg.guard->pauses, 0);
	cr_assert_eq(srv.reg.guard->evictions, 1);
	evicted_not_calm(grow, calm);
}

Test(guard, stopping_memtallyd_resumes_a_paused_task)
{
	uint64_t t = mts_now_monotonic();
	pid_t calm;
	pid_t grow = grower_on_node(600, t, &calm);
	mts_guard_check(&srv.reg, t);
	cr_assert(stopped_becomes(grow, true));
	mts_server_stop(&srv);
	cr_assert(stopped_becomes(grow, false), "left stopped by a stop");
	cr_assert_eq(srv.reg.guard->resumed, 1);
}

Test(guard, under_strict_overcommit_the_commit_charge_evicts_and_denies)
{
	fx_start();
	reserve(FX_UID, "leak", 10 * MIB);
	reserve(FX_UID, "calm", 100 * MIB);
	pid_t leak = task_worker(FX_UID, "leak", 60 * MIB);
	pid_t calm = task_worker(FX_UID, "calm", 50 * MIB);
	mts_core_tick(&srv.reg);

	/* Memory: 100 MiB in use of 256, far under its line. The commit
	 * charge: 950 of 1000 MiB, past its line (900). */
	mts_policy_defaults(&pol);
	fake_cgroup("268435456\n", 100 * MIB, 0);
	fake_proc("2\n", 1000, 950);
	struct mts_node_src src = {.kind = MTS_NODE_CGROUP_V2};
	snprintf(src.dir, sizeof(src.dir), "%s", dir);
	snprintf(src.proc, sizeof(src.proc), "%s", proc);
	struct mts_node_fig fig = {0};
	srv.reg.policy.guard_interval_ms = 60000;
	srv.reg.policy.admit_queue = false;
	mts_guard_apply(&srv.reg, &src, &fig);
	nevents = 0;
	mts_guard_check(&srv.reg, mts_now_monotonic());

	cr_assert_eq(srv.reg.guard->evictions, 1);
	evicted_not_calm(leak, calm);
	cr_assert_eq(nevents, 1);
	cr_assert_str_eq(events[0].scope, "task:leak");
	cr_assert_eq(events[0].limit, 900 * MIB, "the commit's line");

	/* 850 committed + 60 requested > 900, whatever is reserved: the
	 * memory has room, the commit charge has not. */
	fake_proc("2\n", 1000, 850);
	mts_guard_check(&srv.reg, mts_now_monotonic());
	cr_assert(srv.reg.guard->node.by_commit);
	Memtally__V1__Response *r = fx_admit(FX_UID, 60 * MIB, "", "b", 0);
	cr_assert(!r->admit_result->admitted);
	cr_assert_str_eq(r->admit_result->limit_scope, "node");
	cr_assert_eq(r->admit_result->limit, 900 * MIB);
	cr_assert(strstr(r->admit_result->reason, "Committed_AS") &&
	              strstr(r->admit_result->reason, "850 MiB"),
	          "%s", r->admit_result->reason);
	memtally__v1__response__free_unpacked(r, NULL);

	/* Back to heuristic overcommit: the memory's edge again, and the
	 * same request fits. */
	fake_proc("0\n", 1000, 850);
	mts_guard_check(&srv.reg, mts_now_monotonic());
	cr_assert(!srv.reg.guard->node.by_commit);
	reserve(FX_UID, "b", 60 * MIB);
}

Test(guard, a_pause_mark_outlives_an_exec_seen_after_it)
{
	/* The exec detection rewrote the worker's restart entry whole from
	 * the process, which has no pause mark: a worker paused before its
	 * exec was seen lost it, and after a crash the memtallyd that came
	 * next left it stopped for good. */
	fx_start_with_record("pausexec");
	int go[2];
	cr_assert_eq(pipe(go), 0);
	pid_t c = fx_fork();
	cr_assert_geq(c, 0);
	if (c == 0) {
		char x;
		close(go[1]);
		if (read(go[0], &x, 1) == 1)
			execl("/bin/sleep", "sleep", "60", (char *)NULL);
		_exit(1);
	}
	close(go[0]);
	kids[nkids++] = c;
	uint32_t slot = fx_register_as(c, FX_UID, "default", "");
	struct mts_proc *p = srv.reg.by_slot[slot];
	if (!p->exec_mark)
		cr_skip_test("arg_start reads 0 here (no ptrace access)");
	/* Paused by the guard: its mark, as guard.c writes it. */
	struct mts_state_rec r;
	cr_assert_eq(mts_state_get(srv.reg.state, slot, &r), 0);
	r.held = 1;
	cr_assert_eq(mts_state_put(srv.reg.state, slot, &r), 0);
	cr_assert_eq(write(go[1], "x", 1), 1);
	close(go[1]);
	char comm[32] = "";
	for (int i = 0; i < 500 && strcmp(comm, "sleep\n") != 0; i++) {
		char path[64];
		snprintf(path, sizeof(path), "/proc/%d/comm", (int)c);
		FILE *f = fopen(path, "r");
		if (f) {
			if (!fgets(comm, sizeof(comm), f))
				comm[0] = '\0';
			fclose(f);
		}
		usleep(10000);
	}
	cr_assert_str_eq(comm, "sleep\n", "no exec");
	mts_rss_sweep_sync(&srv.reg);
	cr_assert(p->image_stale, "the exec was not seen");
	cr_assert_eq(mts_state_get(srv.reg.state, slot, &r), 0);
	cr_assert_eq(r.image_stale, 1);
	cr_assert_eq(r.held, 1, "the pause mark was lost");
}
