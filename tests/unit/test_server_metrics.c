/*
 * test_server_metrics.c - the /metrics exposition and its HTTP endpoint.
 *
 * The render tests build a registry the way test_server_dispatch.c does
 * (a real segment, forked children registered by pid, counters written
 * into their slots, one tick), then fill in by hand the figures the
 * limits code owns (rss, limits, states, reservations, stats), render,
 * and check exact lines: values, label escaping, one state gauge at 1 per
 * entity, the family structure, and that `promtool check metrics` (when
 * installed) has nothing to say.
 *
 * The serve tests start the endpoint on 127.0.0.1 port 0 and talk HTTP to
 * it from a client thread while the test's thread runs the loop, as
 * memtallyd does; the client's results are checked after the loop ends
 * (Criterion asserts belong on the test's thread). Every test ends by
 * checking that the loop closes with no live handle.
 */
#include "mts_metrics.h"

#include <arpa/inet.h>
#include <criterion/criterion.h>
#include <criterion/logging.h>
#include <errno.h>
#include <netinet/in.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "mts_log.h"
#include "test_server_fixture.h"

#define PROMTOOL "/usr/bin/promtool"

static void setup(void)
{
	fx_start_slots(NULL, 4);
	/* The per-process series are opted in (the tests of the bound turn
	 * them off). */
	srv.reg.policy.metrics_per_process = true;
}

TestSuite(render, .init = setup, .fini = fx_stop, .timeout = 30);
TestSuite(serve, .init = setup, .fini = fx_stop, .timeout = 60);

/* Register a new child in `group` holding `bytes` over `threads`
 * threads, and return its proc (after a tick). */
static struct mts_proc *worker(const char *group, int64_t bytes,
                               uint32_t threads)
{
	pid_t pid = fx_spawn();
	struct mts_peer peer = {
	    .fd = -1, .has_cred = true, .pid = (uint32_t)pid, .uid = 1000};
	struct mts_reg_result res;
	cr_assert_eq(mts_register(&srv.reg, &peer, group, NULL, 1, &res), 0);
	struct mtshm_slot_id *s = mts_slot(&srv.reg, res.slot);
	mtshm_store_relaxed32(&s->threads, threads);
	mtshm_store_relaxed32(&s->lanes_used, 1);
	mtshm_store_relaxeds64(&mtshm_lane(s, 0)->bytes, bytes);
	mts_core_tick(&srv.reg);
	struct mts_proc *p = mts_find_pid(&srv.reg, (uint32_t)pid);
	cr_assert_not_null(p);
	return p;
}

/* Does `text` hold `line` as a whole line? */
static bool has_line(const char *text, const char *line)
{
	size_t n = strlen(line);
	for (const char *p = text; (p = strstr(p, line)) != NULL; p++) {
		if ((p == text || p[-1] == '\n') && p[n] == '\n')
			return true;
	}
	return false;
}

#define assert_line(text, ...)                                                 \
	do {                                                                   \
		char want_[512];                                               \
		snprintf(want_, sizeof(want_), __VA_ARGS__);                   \
		cr_assert(has_line(text, want_), "missing line: %s\n%s",       \
		          want_, text);                                        \
	} while (0)

/* A process's sample: `metric`{pid,group,comm} `value`. */
#define assert_process_line(text, metric, p, group, value)                     \
	assert_line(text,                                                      \
	            metric "{pid=\"%u\",group=\"" group                        \
	                   "\",comm=\"%s\"} " #value,                          \
	            (p)->pid, (p)->comm)

/* Lines that start with `prefix`. */
static int count_prefix(const char *text, const char *prefix)
{
	int n = 0;
	size_t len = strlen(prefix);
	for (const char *p = text; *p;) {
		if (strncmp(p, prefix, len) == 0)
			n++;
		const char *nl = strchr(p, '\n');
		if (!nl)
			break;
		p = nl + 1;
	}
	return n;
}

/* Set a group's name, as a worker might have had it (the registry owns
 * and frees the name). */
static void rename_group(struct mts_proc *p, const char *name)
{
	struct mts_group *g = &srv.reg.groups[p->group];
	free(g->name);
	g->name = strdup(name);
	cr_assert_not_null(g->name);
}

/* ---- render ---------------------------------------------------------- */

Test(render, empty_fleet)
{
	char *t = fx_metrics_text();
	assert_line(t, "# TYPE memtally_build_info gauge");
	assert_line(t, "memtally_build_info{version=\"%s\"} 1", MTS_VERSION);
	assert_line(t, "memtally_fleet_accounted_bytes 0");
	assert_line(t, "memtally_processes 0");
	assert_line(t, "memtally_slots 4");
	assert_line(t, "memtally_slots_free 4");
	assert_line(t, "memtally_fleet_state{state=\"ok\"} 1");
	assert_line(t, "memtally_fleet_state{state=\"high\"} 0");
	assert_line(t, "memtally_fleet_state{state=\"over\"} 0");
	assert_line(t, "# TYPE memtally_unregistered_processes_total counter");
	assert_line(t, "memtally_unregistered_processes_total 0");
	/* No limit, no group, no process: those families are left out. */
	cr_assert_null(strstr(t, "memtally_fleet_limit_bytes"), "%s", t);
	cr_assert_null(strstr(t, "memtally_group_"), "%s", t);
	cr_assert_null(strstr(t, "memtally_process_"), "%s", t);
	/* Counters are there at 0, every denial reason too. */
	assert_line(t, "memtally_registrations_total 0");
	assert_line(t, "memtally_denials_total{reason=\"fleet_limit\"} 0");
	assert_line(t, "memtally_denials_total{reason=\"group_limit\"} 0");
	assert_line(t, "memtally_denials_total{reason=\"invalid\"} 0");
	assert_line(t, "# TYPE memtally_tick_duration_seconds summary");
	assert_line(t, "memtally_tick_duration_seconds_sum 0.000000000");
	assert_line(t, "memtally_tick_duration_seconds_count 0");
	free(t);
}

Test(render, figures)
{
	struct mts_proc *a = worker("web", 5000, 2);
	struct mts_proc *b = worker("db", 7000, 1);
	/* What the limits code fills in. */
	srv.reg.totals.rss = 1 << 20;
	srv.reg.totals.limit = 1 << 30;
	srv.reg.totals.reserved = 4096;
	srv.reg.totals.reservations = 2;
	struct mts_group *web = &srv.reg.groups[a->group];
	web->rss = 300000;
	web->limit = 8000;
	web->reserved = 100;
	web->reservations = 1;
	a->rss = 300000;
	a->limit = 4000;
	a->state = MTSHM_STATE_OVER;

	char *t = fx_metrics_text();
	assert_line(t, "memtally_fleet_accounted_bytes 12000");
	assert_line(t, "memtally_fleet_error_bytes 3000"); /* 1000 x 3 */
	assert_line(t, "memtally_fleet_peak_bytes 12000");
	assert_line(t, "memtally_fleet_rss_bytes 1048576");
	assert_line(t, "memtally_fleet_limit_bytes 1073741824");
	assert_line(t, "memtally_fleet_reserved_bytes 4096");
	assert_line(t, "memtally_reservations 2");
	assert_line(t, "memtally_processes 2");
	assert_line(t, "memtally_slots_free 2");

	assert_line(t, "memtally_group_accounted_bytes{group=\"web\"} 5000");
	assert_line(t, "memtally_group_accounted_bytes{group=\"db\"} 7000");
	assert_line(t, "memtally_group_error_bytes{group=\"web\"} 2000");
	assert_line(t, "memtally_group_rss_bytes{group=\"web\"} 300000");
	assert_line(t, "memtally_group_rss_bytes{group=\"db\"} 0");
	assert_line(t, "memtally_group_reserved_bytes{group=\"web\"} 100");
	assert_line(t, "memtally_group_reservations{group=\"web\"} 1");
	assert_line(t, "memtally_group_reservations{group=\"db\"} 0");
	assert_line(t, "memtally_group_processes{group=\"db\"} 1");
	/* Only the group with a limit has a limit sample. */
	assert_line(t, "memtally_group_limit_bytes{group=\"web\"} 8000");
	cr_assert_eq(count_prefix(t, "memtally_group_limit_bytes{"), 1);

	assert_process_line(t, "memtally_process_accounted_bytes", a, "web",
	                    5000);
	assert_process_line(t, "memtally_process_accounted_bytes", b, "db",
	                    7000);
	assert_process_line(t, "memtally_process_rss_bytes", a, "web", 300000);
	assert_process_line(t, "memtally_process_peak_bytes", b, "db", 7000);
	assert_process_line(t, "memtally_process_threads", a, "web", 2);
	assert_process_line(t, "memtally_process_limit_bytes", a, "web", 4000);
	cr_assert_eq(count_prefix(t, "memtally_process_limit_bytes{"), 1);
	assert_process_line(t, "memtally_process_over_limit", a, "web", 1);
	assert_process_line(t, "memtally_process_over_limit", b, "db", 0);
	free(t);
}

Test(render, escaping)
{
	struct mts_proc *a = worker("plain", 10, 1);
	struct mts_proc *b = worker("other", 20, 1);
	/* The registry refuses control characters in names today; the
	 * renderer must not depend on it. */
	rename_group(a, "a\"b\\c\nd");
	/* comm is any bytes a process gave prctl(PR_SET_NAME). */
	snprintf(a->comm, sizeof(a->comm), "%s", "x\xff\xc0y\\");
	/* Valid UTF-8 stays; an overlong '/', a surrogate and a truncated
	 * sequence do not. */
	snprintf(b->comm, sizeof(b->comm), "%s",
	         "gr\xc3\xbc\xc3\x9f"
	         "e\xc0\xaf|\xed\xa0\x80|\xe2\x82");

	char *t = fx_metrics_text();
	assert_line(t, "memtally_group_processes{group=\"a\\\"b\\\\c\\nd\"} 1");
	assert_line(
	    t, "memtally_group_state{group=\"a\\\"b\\\\c\\nd\",state=\"ok\"}"
	       " 1");
	assert_line(
	    t,
	    "memtally_process_threads{pid=\"%u\",group=\"a\\\"b\\\\c\\nd"
	    "\",comm=\"x\xef\xbf\xbd\xef\xbf\xbdy\\\\\"} 1",
	    a->pid);
	assert_line(
	    t,
	    "memtally_process_threads{pid=\"%u\",group=\"other\",comm=\""
	    "gr\xc3\xbc\xc3\x9f"
	    "e\xef\xbf\xbd\xef\xbf\xbd|\xef\xbf\xbd\xef\xbf\xbd"
	    "\xef\xbf\xbd|\xef\xbf\xbd\xef\xbf\xbd\"} 1",
	    b->pid);
	free(t);
}

/* For every entity, exactly one of its three state lines is 1, and it is
 * the state `want` names. `labels` is the label text before `state=`. */
static void assert_one_hot(const char *t, const char *name, const char *labels,
                           const char *want)
{
	static const char *const states[] = {"ok", "high", "over"};
	int ones = 0;
	for (int i = 0; i < 3; i++) {
		char one[512], zero[512];
		snprintf(one, sizeof(one), "%s{%sstate=\"%s\"} 1", name, labels,
		         states[i]);
		snprintf(zero, sizeof(zero), "%s{%sstate=\"%s\"} 0", name,
		         labels, states[i]);
		bool is_one = has_line(t, one), is_zero = has_line(t, zero);
		cr_assert(is_one != is_zero, "%s{%s...%s}: one of 0/1\n%s",
		          name, labels, states[i], t);
		if (is_one) {
			ones++;
			cr_assert_str_eq(states[i], want, "%s{%s}", name,
			                 labels);
		}
	}
	cr_assert_eq(ones, 1, "%s{%s}: %d states at 1", name, labels, ones);
}

Test(render, state_one_hot)
{
	struct mts_proc *a = worker("calm", 10, 1);
	struct mts_proc *b = worker("busy", 20, 1);
	struct mts_proc *c = worker("full", 30, 1);
	srv.reg.totals.state = MTSHM_STATE_HIGH;
	srv.reg.groups[a->group].state = MTSHM_STATE_OK;
	srv.reg.groups[b->group].state = MTSHM_STATE_HIGH;
	srv.reg.groups[c->group].state = MTSHM_STATE_OVER;

	char *t = fx_metrics_text();
	assert_one_hot(t, "memtally_fleet_state", "", "high");
	assert_one_hot(t, "memtally_group_state", "group=\"calm\",", "ok");
	assert_one_hot(t, "memtally_group_state", "group=\"busy\",", "high");
	assert_one_hot(t, "memtally_group_state", "group=\"full\",", "over");
	cr_assert_eq(count_prefix(t, "memtally_group_state{"), 9);
	free(t);
}

/* Lines of `t` that start with `prefix`. */
static unsigned count_prefixed(const char *t, const char *prefix)
{
	unsigned n = 0;
	size_t k = strlen(prefix);
	for (const char *l = t; l && *l; l = strchr(l, '\n'), l = l ? l + 1 : l)
		n += strncmp(l, prefix, k) == 0;
	return n;
}

/* 500 groups named by workers: at most max_groups series of their own,
 * a configured group among them whatever its size, the largest of the
 * rest, and one "_other" series holding the sum of the others; no
 * per-process series unless opted in. */
Test(render, groups_bounded_per_process_opt_in)
{
	struct mts_group_policy gp = {.name = "etl", .limit = 1 << 30};
	srv.reg.policy.groups = &gp;
	srv.reg.policy.ngroups = 1;
	srv.reg.policy.metrics_max_groups = 50;
	srv.reg.policy.metrics_per_process = false;
	struct mts_proc *w = worker("tiny", 1, 1);
	uint32_t etl;
	cr_assert_eq(mts_group_ensure(&srv.reg, "etl", &etl), 0);
	uint64_t other_sum = srv.reg.groups[w->group].bytes;
	for (unsigned i = 0; i < 500; i++) {
		char name[32];
		uint32_t gi;
		snprintf(name, sizeof(name), "g%03u", i);
		cr_assert_eq(mts_group_ensure(&srv.reg, name, &gi), 0);
		srv.reg.groups[gi].bytes = 1000 + i; /* g499 the largest */
		srv.reg.groups[gi].limit = 1;        /* keeps the entry */
		if (i < 500 - 49)
			other_sum += 1000 + i;
	}
	char *t = fx_metrics_text();
	unsigned n = count_prefixed(t, "memtally_group_accounted_bytes{");
	cr_assert_eq(n, 51, "%u group series", n); /* 50 + _other */
	cr_assert_lt(strlen(t), 64 * 1024, "%zu bytes", strlen(t));
	assert_line(t, "memtally_group_accounted_bytes{group=\"etl\"} 0");
	assert_line(t, "memtally_group_accounted_bytes{group=\"g499\"} 1499");
	assert_line(t, "memtally_group_accounted_bytes{group=\"g451\"} 1451");
	cr_assert_null(strstr(t, "group=\"g450\""));
	cr_assert_null(strstr(t, "group=\"tiny\""));
	char want[96];
	snprintf(want, sizeof(want),
	         "memtally_group_accounted_bytes{group=\"_other\"} %llu",
	         (unsigned long long)other_sum);
	assert_line(t, want);
	cr_assert_eq(count_prefixed(t, "memtally_group_state{group=\"_other\""),
	             3);
	cr_assert_eq(count_prefixed(t, "memtally_process_"), 0);
	free(t);

	srv.reg.policy.metrics_per_process = true;
	t = fx_metrics_text();
	cr_assert_eq(count_prefixed(t, "memtally_process_accounted_bytes{"), 1);
	free(t);
	srv.reg.policy.groups = NULL;
	srv.reg.policy.ngroups = 0;
}

/* "_other" stands for the groups it folds together: every figure that
 * adds up is their sum (unvouched bytes too), a state is the worst of
 * theirs, and a sum of limits is no limit: no sample. */
Test(render, other_sums_every_figure)
{
	srv.reg.policy.metrics_max_groups = 1;
	static const char *const names[] = {"a", "b", "c"};
	for (unsigned i = 0; i < 3; i++) {
		uint32_t gi;
		cr_assert_eq(mts_group_ensure(&srv.reg, names[i], &gi), 0);
		struct mts_group *g = &srv.reg.groups[gi];
		g->bytes = 1000u * (i + 1); /* c the largest: shown */
		g->mapped = 10u * (i + 1);
		g->allocator_free = 20u * (i + 1);
		g->unvouched = 30u * (i + 1);
		g->error_bytes = 40u * (i + 1);
		g->peak = 2000u * (i + 1);
		g->rss = 50u * (i + 1);
		g->reserved = 60u * (i + 1);
		g->reservations = i + 1;
		g->processes = i + 2;
		g->limit = 1u << 20; /* keeps the entry */
		g->state = i == 1 ? MTSHM_STATE_HIGH : MTSHM_STATE_OK;
		g->growth = 1.5 * (i + 1);
	}
	char *t = fx_metrics_text();
	/* a + b */
	assert_line(t, "memtally_group_accounted_bytes{group=\"_other\"} 3000");
	assert_line(t, "memtally_group_mapped_bytes{group=\"_other\"} 30");
	assert_line(t,
	            "memtally_group_allocator_free_bytes{group=\"_other\"} 60");
	assert_line(t, "memtally_group_unvouched_bytes{group=\"_other\"} 90");
	assert_line(t, "memtally_group_error_bytes{group=\"_other\"} 120");
	assert_line(t, "memtally_group_peak_bytes{group=\"_other\"} 6000");
	assert_line(t, "memtally_group_rss_bytes{group=\"_other\"} 150");
	assert_line(t, "memtally_group_reserved_bytes{group=\"_other\"} 180");
	assert_line(t, "memtally_group_reservations{group=\"_other\"} 3");
	assert_line(t, "memtally_group_processes{group=\"_other\"} 5");
	assert_line(t,
	            "memtally_group_growth_bytes_per_second{group=\"_other\"} "
	            "4.5");
	assert_line(t,
	            "memtally_group_state{group=\"_other\",state=\"high\"} 1");
	cr_assert_null(strstr(t, "memtally_group_limit_bytes{group=\"_other\""),
	               "%s", t);
	assert_line(t, "memtally_group_unvouched_bytes{group=\"c\"} 90");
	free(t);
}

Test(render, counters_and_tick)
{
	struct mts_stats *s = &srv.reg.stats;
	struct mts_admit_stats *a = &srv.reg.adm->stats;
	s->registrations = 11;
	s->reclaims = 12;
	a->admissions = 13;
	a->denials[MTS_DENY_FLEET_LIMIT] = 14;
	a->denials[MTS_DENY_GROUP_LIMIT] = 15;
	a->denials[MTS_DENY_INVALID] = 16;
	a->releases = 17;
	a->expirations = 18;
	srv.reg.lim->enforcement_signals = 19;
	srv.reg.req->events = 5; /* a Watch's first event (dispatch.c) */
	srv.net.conn_stats.watch_events = 15; /* pushed later (conn.c) */
	srv.reg.req->protocol_errors = 21;
	a->fulfilled = 22;
	srv.net.conn_stats.watch_disconnects = 23;
	srv.reload_stats.applied = 24;
	srv.reload_stats.rejected = 25;
	srv.reg.req->auth_denials = 20; /* SetLimit refused (dispatch.c) */
	a->auth_denials = 6;            /* Release refused (admit.c) */
	srv.reg.tick->last_ns = 1500000;
	srv.reg.tick->sum_ns = 2500000123ull;
	srv.reg.tick->count = 1234;
	srv.reg.totals.unregistered = 3;
	/* Log lines held back by the budgets, all in one second (they
	 * count by CLOCK_MONOTONIC second): start at a fresh one. */
	struct timespec t0, t1;
	clock_gettime(CLOCK_MONOTONIC, &t0);
	do
		clock_gettime(CLOCK_MONOTONIC, &t1);
	while (t1.tv_sec == t0.tv_sec);
	mts_log_set_level(MTS_LOG_INFO);
	for (unsigned i = 0; i < MTS_LOG_PEER_BURST + 27; i++)
		mts_log_uid(5, MTS_LOG_INFO, "admission granted", NULL);
	for (unsigned i = 0; i < MTS_LOG_SCOPE_BURST + 28; i++)
		mts_log_scope("fleet", MTS_LOG_INFO, "state changed", NULL);

	char *t = fx_metrics_text();
	assert_line(t, "# TYPE memtally_registrations_total counter");
	assert_line(t, "memtally_registrations_total 11");
	assert_line(t, "memtally_reclaims_total 12");
	assert_line(t, "memtally_admissions_total 13");
	assert_line(t, "# TYPE memtally_denials_total counter");
	assert_line(t, "memtally_denials_total{reason=\"fleet_limit\"} 14");
	assert_line(t, "memtally_denials_total{reason=\"group_limit\"} 15");
	assert_line(t, "memtally_denials_total{reason=\"invalid\"} 16");
	assert_line(t, "memtally_releases_total 17");
	assert_line(t, "memtally_reservation_expirations_total 18");
	assert_line(t, "memtally_enforcement_signals_total 19");
	assert_line(t, "memtally_watch_events_total 20");
	assert_line(t, "memtally_protocol_errors_total 21");
	assert_line(t, "# TYPE memtally_log_lines_suppressed_total counter");
	assert_line(t,
	            "memtally_log_lines_suppressed_total{budget=\"uid\"} 27");
	assert_line(t,
	            "memtally_log_lines_suppressed_total{budget=\"scope\"} 28");
	assert_line(t, "memtally_reservations_fulfilled_total 22");
	assert_line(t, "memtally_watch_disconnects_total 23");
	assert_line(t, "memtally_config_reloads_total 24");
	assert_line(t, "memtally_config_reload_failures_total 25");
	assert_line(t, "memtally_auth_denials_total 26");
	assert_line(t, "memtally_unregistered_processes_total 3");
	assert_line(t, "memtally_tick_last_duration_seconds 0.001500000");
	assert_line(t, "memtally_tick_duration_seconds_sum 2.500000123");
	assert_line(t, "memtally_tick_duration_seconds_count 1234");
	free(t);
}

/* How many lines of `text` are exactly `line`. */
static int count_lines(const char *text, const char *line)
{
	int n = 0;
	size_t len = strlen(line);
	for (const char *p = text; (p = strstr(p, line)) != NULL; p++) {
		if ((p == text || p[-1] == '\n') && p[len] == '\n')
			n++;
	}
	return n;
}

/* Every family: # HELP, then # TYPE, then its samples, all together, and
 * each family once; sample names are the family's (plus _sum and _count
 * for a summary), counters end in _total; no line is repeated. */
Test(render, structure)
{
	struct mts_proc *a = worker("web", 5000, 2);
	worker("db", 7000, 1);
	a->limit = 1;
	srv.reg.totals.limit = 10;

	char *t = fx_metrics_text();
	cr_assert(t[strlen(t) - 1] == '\n', "no final newline");
	static char names[128][128];
	int families = 0, samples = 0;
	char fam[128] = "", type[16] = "", help[128] = "", *save = NULL;
	char *copy = strdup(t);
	for (char *l = strtok_r(copy, "\n", &save); l;
	     l = strtok_r(NULL, "\n", &save)) {
		cr_assert_eq(count_lines(t, l), 1, "repeated: %s", l);
		if (strncmp(l, "# HELP ", 7) == 0) {
			cr_assert_eq(sscanf(l + 7, "%127s", help), 1);
			cr_assert(strncmp(help, "memtally_", 9) == 0, "%s", l);
			for (int i = 0; i < families; i++)
				cr_assert_str_neq(names[i], help,
				                  "family twice: %s", help);
			fam[0] = '\0';
			continue;
		}
		if (strncmp(l, "# TYPE ", 7) == 0) {
			cr_assert_eq(sscanf(l + 7, "%127s %15s", fam, type), 2);
			cr_assert_str_eq(fam, help, "TYPE without its HELP");
			cr_assert_lt(families, 128);
			snprintf(names[families++], sizeof(names[0]), "%s",
			         fam);
			continue;
		}
		cr_assert_neq(l[0], '#', "stray comment: %s", l);
		cr_assert_neq(fam[0], '\0', "sample before TYPE: %s", l);
		size_t n = strcspn(l, "{ ");
		char name[160], sum[160], cnt[160];
		snprintf(name, sizeof(name), "%.*s", (int)n, l);
		snprintf(sum, sizeof(sum), "%s_sum", fam);
		snprintf(cnt, sizeof(cnt), "%s_count", fam);
		bool ok = strcmp(name, fam) == 0;
		if (strcmp(type, "summary") == 0)
			ok = ok || !strcmp(name, sum) || !strcmp(name, cnt);
		cr_assert(ok, "sample %s in family %s", l, fam);
		if (strcmp(type, "counter") == 0)
			cr_assert(n > 6 && !strcmp(name + n - 6, "_total"),
			          "counter without _total: %s", l);
		samples++;
	}
	cr_assert_gt(families, 30);
	cr_assert_gt(samples, families);
	free(copy);
	free(t);
}

Test(render, promtool_is_happy)
{
	struct mts_proc *a = worker("web", 5000, 2);
	struct mts_proc *b = worker("weird", 7000, 1);
	rename_group(b, "q\"b\\s\nn");
	snprintf(b->comm, sizeof(b->comm), "%s", "bad\xff\xfe");
	a->limit = 4096;
	a->state = MTSHM_STATE_OVER;
	srv.reg.totals.limit = 1 << 20;
	srv.reg.groups[a->group].limit = 1 << 19;
	srv.reg.tick->count = 3;
	srv.reg.tick->sum_ns = 30000;
	char *t = fx_metrics_text();

	if (access(PROMTOOL, X_OK) != 0) {
		cr_log_warn(PROMTOOL " is not installed (Debian package "
		                     "prometheus): the lint check is skipped");
		free(t);
		return;
	}
	char in[] = "/tmp/mt-met-in-XXXXXX", out[] = "/tmp/mt-met-out-XXXXXX";
	int fin = mkstemp(in), fout = mkstemp(out);
	cr_assert(fin >= 0 && fout >= 0);
	cr_assert_eq(write(fin, t, strlen(t)), (ssize_t)strlen(t));
	close(fin);
	close(fout);
	char cmd[256];
	snprintf(cmd, sizeof(cmd), PROMTOOL " check metrics <%s >%s 2>&1", in,
	         out);
	int rc = system(cmd);
	char said[4096] = "";
	FILE *f = fopen(out, "r");
	cr_assert_not_null(f);
	size_t n = fread(said, 1, sizeof(said) - 1, f);
	said[n] = '\0';
	fclose(f);
	unlink(in);
	unlink(out);
	cr_assert(WIFEXITED(rc) && WEXITSTATUS(rc) == 0,
	          "promtool failed (%d): %s\n%s", rc, said, t);
	cr_assert_eq(n, 0, "promtool complains: %s", said);
	free(t);
}

Test(render, address_parsing)
{
	struct sockaddr_storage ss;
	socklen_t len;
	bool lo;
	char ip[INET6_ADDRSTRLEN];

	cr_assert_eq(mts_parse_hostport("127.0.0.1:9464", &ss, &len, &lo), 0);
	struct sockaddr_in *a4 = (struct sockaddr_in *)&ss;
	cr_assert_eq(ss.ss_family, AF_INET);
	cr_assert_eq(len, sizeof(*a4));
	cr_assert_eq(ntohs(a4->sin_port), 9464);
	cr_assert_str_eq(inet_ntop(AF_INET, &a4->sin_addr, ip, sizeof(ip)),
	                 "127.0.0.1");

	cr_assert_eq(mts_parse_hostport("localhost:0", &ss, &len, &lo), 0);
	cr_assert_eq(ss.ss_family, AF_INET);
	cr_assert_str_eq(inet_ntop(AF_INET, &a4->sin_addr, ip, sizeof(ip)),
	                 "127.0.0.1");
	cr_assert_eq(ntohs(a4->sin_port), 0);

	cr_assert_eq(mts_parse_hostport("0.0.0.0:65535", &ss, &len, &lo), 0);
	cr_assert_eq(ntohs(a4->sin_port), 65535);

	cr_assert_eq(mts_parse_hostport("[::1]:80", &ss, &len, &lo), 0);
	struct sockaddr_in6 *a6 = (struct sockaddr_in6 *)&ss;
	cr_assert_eq(ss.ss_family, AF_INET6);
	cr_assert_eq(len, sizeof(*a6));
	cr_assert_eq(ntohs(a6->sin6_port), 80);
	cr_assert_str_eq(inet_ntop(AF_INET6, &a6->sin6_addr, ip, sizeof(ip)),
	                 "::1");
	cr_assert_eq(mts_parse_hostport("[::]:1", &ss, &len, &lo), 0);

	static const char *const bad[] = {
	    "",
	    ":9464",
	    "127.0.0.1",
	    "127.0.0.1:",
	    "127.0.0.1:x",
	    "127.0.0.1:65536",
	    "127.0.0.1:-1",
	    "127.0.0.1: 1",
	    "::1:80",
	    "[::1]",
	    "[::1:80",
	    "::1]:80",
	    "[]:80",
	    "[zz::]:80",
	    "[127.0.0.1]:80",
	    "127.0.0.1:123456",
	};
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++)
		cr_assert_eq(mts_parse_hostport(bad[i], &ss, &len, &lo),
		             -EINVAL, "accepted \"%s\"", bad[i]);
	cr_assert_eq(mts_parse_hostport(NULL, &ss, &len, &lo), -EINVAL);
}

/* ---- serve ----------------------------------------------------------- */

struct answer {
	int status; /* 0: no answer */
	char headers[1024];
	char *body; /* malloc'd, NUL-terminated */
	size_t body_len;
};

/* One HTTP/1.0 request to 127.0.0.1:port; the server closes after it. */
static void http(uint16_t port, const char *method, const char *path,
                 struct answer *a)
{
	memset(a, 0, sizeof(*a));
	int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
	if (fd < 0)
		return;
	struct sockaddr_in sa = {.sin_family = AF_INET,
	                         .sin_port = htons(port),
	                         .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
	char req[256];
	int n = snprintf(req, sizeof(req),
	                 "%s %s HTTP/1.0\r\nHost: test\r\n"
	                 "Content-Length: 0\r\n\r\n",
	                 method, path);
	if (connect(fd, (struct sockaddr *)&sa, sizeof(sa)) < 0 ||
	    write(fd, req, (size_t)n) != n) {
		close(fd);
		return;
	}
	size_t len = 0, cap = 4096;
	char *buf = malloc(cap);
	for (;;) {
		if (len + 1 == cap)
			buf = realloc(buf, cap *= 2);
		ssize_t r = read(fd, buf + len, cap - len - 1);
		if (r <= 0)
			break;
		len += (size_t)r;
	}
	close(fd);
	buf[len] = '\0';
	char *end = strstr(buf, "\r\n\r\n");
	if (!end || sscanf(buf, "HTTP/1.%*d %d", &a->status) != 1) {
		free(buf);
		return;
	}
	snprintf(a->headers, sizeof(a->headers), "%.*s", (int)(end - buf), buf);
	a->body_len = len - (size_t)(end + 4 - buf);
	a->body = strdup(end + 4);
	free(buf);
}

/* The client thread's script and what it saw. */
static struct {
	uint16_t port;
	uv_async_t done; /* the client is finished: stop, on the loop */
	bool stop_from_loop;
	struct answer get, get2, head, notfound, post;
} cl;

static struct mts_metrics *met;

static void on_client_done(uv_async_t *h)
{
	mts_metrics_stop(met);
	met = NULL;
	uv_close((uv_handle_t *)h, NULL);
	mts_server_stop(&srv);
}

static void *client(void *arg)
{
	(void)arg;
	http(cl.port, "GET", "/metrics", &cl.get);
	http(cl.port, "GET", "/metrics", &cl.get2);
	http(cl.port, "HEAD", "/metrics", &cl.head);
	http(cl.port, "GET", "/", &cl.notfound);
	http(cl.port, "POST", "/metrics", &cl.post);
	if (cl.stop_from_loop)
		uv_async_send(&cl.done);
	return NULL;
}

static void free_answers(void)
{
	free(cl.get.body);
	free(cl.get2.body);
	free(cl.head.body);
	free(cl.notfound.body);
	free(cl.post.body);
}

static bool has_header(const struct answer *a, const char *h)
{
	return strcasestr(a->headers, h) != NULL;
}

Test(serve, get_head_404_405)
{
	struct mts_proc *p = worker("web", 5000, 2);
	/* p is freed when the loop stops the server: keep what we need. */
	uint32_t pid = p->pid;
	char comm[sizeof(p->comm)];
	memcpy(comm, p->comm, sizeof(comm));
	srv.reg.stats.registrations = 1;
	cr_assert_eq(mts_metrics_start(&met, "127.0.0.1:0", &srv.reg,
	                               &srv.net.conn_stats, &srv.reload_stats,
	                               &loop),
	             0);
	cl.port = mts_metrics_port(met);
	cr_assert_neq(cl.port, 0);
	cr_assert_eq(uv_async_init(&loop, &cl.done, on_client_done), 0);
	cl.stop_from_loop = true;
	pthread_t th;
	cr_assert_eq(pthread_create(&th, NULL, client, NULL), 0);
	/* The loop renders for the scrapes until the client says stop. */
	uv_run(&loop, UV_RUN_DEFAULT);
	pthread_join(th, NULL);

	cr_assert_eq(cl.get.status, 200, "%s", cl.get.headers);
	cr_assert(
	    has_header(&cl.get, "Content-Type: " MTS_METRICS_CONTENT_TYPE),
	    "%s", cl.get.headers);
	assert_line(cl.get.body, "memtally_registrations_total 1");
	assert_line(cl.get.body,
	            "memtally_group_accounted_bytes{group=\"web\"} 5000");
	assert_line(cl.get.body,
	            "memtally_process_threads{pid=\"%u\",group=\"web\","
	            "comm=\"%s\"} 2",
	            pid, comm);
	/* The second scrape, within MTS_METRICS_FRESH_MS, may reuse the
	 * text: the same figures either way. */
	cr_assert_eq(cl.get2.status, 200);
	cr_assert_str_eq(cl.get2.body, cl.get.body);

	cr_assert_eq(cl.head.status, 200);
	cr_assert_eq(cl.head.body_len, 0, "HEAD has a body");
	char cl_hdr[64];
	snprintf(cl_hdr, sizeof(cl_hdr), "Content-Length: %zu",
	         cl.get.body_len);
	cr_assert(has_header(&cl.head, cl_hdr), "%s", cl.head.headers);

	cr_assert_eq(cl.notfound.status, 404);
	cr_assert_eq(cl.post.status, 405);
	cr_assert(has_header(&cl.post, "Allow: GET, HEAD"), "%s",
	          cl.post.headers);
	free_answers();
}

/* A loop that does not run answers no scrape: the scrape gets a 503
 * after MTS_METRICS_WAIT_MS, never figures older than it asked for. */
Test(serve, stuck_loop_is_503)
{
	cr_assert_eq(mts_metrics_start(&met, "127.0.0.1:0", &srv.reg,
	                               &srv.net.conn_stats, &srv.reload_stats,
	                               &loop),
	             0);
	cl.port = mts_metrics_port(met);
	cl.stop_from_loop = false;
	pthread_t th;
	cr_assert_eq(pthread_create(&th, NULL, client, NULL), 0);
	pthread_join(th, NULL); /* the loop is not running meanwhile */
	cr_assert_eq(cl.get.status, 503, "%s", cl.get.headers);
	cr_assert_eq(cl.notfound.status, 404);
	mts_metrics_stop(met);
	met = NULL;
	free_answers();
}

/* Stopping while a scrape waits for the loop answers it and returns. */
static void *one_get(void *arg)
{
	http(cl.port, "GET", "/metrics", arg);
	return NULL;
}

Test(serve, stop_during_scrape)
{
	struct answer a;
	cr_assert_eq(mts_metrics_start(&met, "127.0.0.1:0", &srv.reg,
	                               &srv.net.conn_stats, &srv.reload_stats,
	                               &loop),
	             0);
	cl.port = mts_metrics_port(met);
	pthread_t th;
	cr_assert_eq(pthread_create(&th, NULL, one_get, &a), 0);
	usleep(100 * 1000); /* let it reach the wait (either way is fine) */
	mts_metrics_stop(met);
	met = NULL;
	pthread_join(th, NULL);
	cr_assert(a.status == 503 || a.status == 0, "status %d", a.status);
	free(a.body);
}

Test(serve, port_in_use)
{
	int fd = socket(AF_INET, SOCK_STREAM, 0);
	struct sockaddr_in sa = {.sin_family = AF_INET,
	                         .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
	socklen_t len = sizeof(sa);
	cr_assert_eq(bind(fd, (struct sockaddr *)&sa, sizeof(sa)), 0);
	cr_assert_eq(listen(fd, 1), 0);
	cr_assert_eq(getsockname(fd, (struct sockaddr *)&sa, &len), 0);
	char addr[64];
	snprintf(addr, sizeof(addr), "127.0.0.1:%u", ntohs(sa.sin_port));
	struct mts_metrics *m = (struct mts_metrics *)&m;
	cr_assert_eq(mts_metrics_start(&m, addr, &srv.reg, NULL, NULL, &loop),
	             -EADDRINUSE);
	cr_assert_null(m);
	close(fd);
}

Test(serve, bad_address)
{
	struct mts_metrics *m = (struct mts_metrics *)&m;
	cr_assert_eq(
	    mts_metrics_start(&m, "nonsense", &srv.reg, NULL, NULL, &loop),
	    -EINVAL);
	cr_assert_null(m);
	mts_metrics_stop(NULL);
	cr_assert_eq(mts_metrics_port(NULL), 0);
}

Test(serve, ipv6_loopback)
{
	int err =
	    mts_metrics_start(&met, "[::1]:0", &srv.reg, NULL, NULL, &loop);
	if (err == -EADDRNOTAVAIL || err == -EAFNOSUPPORT) {
		cr_skip_test("no IPv6 loopback here");
		return;
	}
	cr_assert_eq(err, 0);
	cr_assert_neq(mts_metrics_port(met), 0);
	mts_metrics_stop(met);
	met = NULL;
}
