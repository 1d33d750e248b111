/*
 * test_server_config.c - the config file and flags: a complete good file,
 * every kind of bad value naming its file, line, section and key (or its
 * flag), checks across keys, flags overriding the file, the inih traps
 * (long lines, indented lines), the token file, and the small parsers
 * (percent, signal, HOST:PORT).
 */
#include "server.h"

#include <criterion/criterion.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "mts_log.h"

static char dir[64];
static char path[128];

static void setup(void)
{
	snprintf(dir, sizeof(dir), "/tmp/mt-cfg-test-%ld", (long)getpid());
	cr_assert_eq(mkdir(dir, 0700), 0);
	snprintf(path, sizeof(path), "%s/memtallyd.conf", dir);
}

static void teardown(void)
{
	char cmd[160];
	snprintf(cmd, sizeof(cmd), "rm -rf %s", dir);
	cr_assert_eq(system(cmd), 0);
}

TestSuite(config, .init = setup, .fini = teardown, .timeout = 10);

static void write_file(const char *p, const char *text, mode_t mode)
{
	FILE *f = fopen(p, "w");
	cr_assert_not_null(f);
	fputs(text, f);
	fclose(f);
	cr_assert_eq(chmod(p, mode), 0);
}

/* Load `text` as the file; returns the error (and message in err). */
static int load(const char *text, struct mts_settings *s, char *err, size_t cap)
{
	write_file(path, text, 0600);
	err[0] = '\0';
	return mts_settings_load(s, path, NULL, 0, err, cap);
}

Test(config, defaults_without_a_file)
{
	struct mts_settings s;
	char err[512];
	cr_assert_eq(mts_settings_load(&s, NULL, NULL, 0, err, sizeof(err)), 0);
	cr_assert_str_eq(s.cfg.socket_path, MTS_DEFAULT_SOCKET);
	cr_assert_str_eq(s.cfg.segment, MTS_DEFAULT_SEGMENT);
	cr_assert_eq(s.cfg.slots, MTS_DEFAULT_SLOTS);
	cr_assert_eq(s.cfg.tick_ms, MTS_DEFAULT_TICK_MS);
	cr_assert_eq(s.cfg.threshold, MTS_DEFAULT_THRESHOLD);
	cr_assert_eq(s.cfg.max_conns, MTS_DEFAULT_MAX_CONNS);
	cr_assert_eq(s.cfg.max_buffered, MTS_DEFAULT_MAX_BUFFERED);
	cr_assert_null(s.cfg.tcp_addr);
	cr_assert_null(s.cfg.metrics_addr);
	cr_assert_eq(s.cfg.policy, &s.policy);
	cr_assert_eq(s.policy.fleet_limit, 0);
	cr_assert_eq(s.policy.high_bp, 9000);
	cr_assert_eq(s.policy.hyst_bp, 500);
	cr_assert_eq(s.policy.measure, MTS_MEASURE_ACCOUNTED);
	cr_assert_eq(s.policy.rss_interval_ms, 1000);
	cr_assert_eq(s.policy.growth_window_ms, 10000);
	cr_assert_eq(s.policy.forecast_horizon_ms, 0, "off by default");
	cr_assert_eq(s.policy.default_ttl_s, 300);
	cr_assert_eq(s.policy.enforce_signal, 0);
	cr_assert_eq(s.log_level, MTS_LOG_INFO);
	mts_settings_free(&s);
}

Test(config, good_file_every_key)
{
	char tokfile[160];
	snprintf(tokfile, sizeof(tokfile), "%s/token", dir);
	write_file(tokfile, "0123456789abcdefXYZ\n", 0600);
	char text[4096];
	snprintf(text, sizeof(text),
	         "# a comment\n"
	         "; another\n"
	         "[server]\n"
	         "socket = /tmp/x.sock ; inline comment\n"
	         "label = /mt-test\n"
	         "slots = 128\n"
	         "lanes = 8\n"
	         "tick = 20\n"
	         "threshold = 128KiB\n"
	         "log_level = debug\n"
	         "tcp = [::1]:7411\n"
	         "tcp_allow_remote = false\n"
	         "tcp_token_file = %s\n"
	         "admin_uid = 1234\n"
	         "admin_gid = root\n"
	         "metrics = 127.0.0.1:9464\n"
	         "group = 0\n"
	         "\n"
	         "[limits]\n"
	         "   fleet = 64GiB\n" /* indented: not a continuation */
	         "high_watermark = 92.5%%\n"
	         "hysteresis = 2.5\n"
	         "process = 1.5G\n"
	         "measure = max\n"
	         "rss_interval = 250\n"
	         "growth_window = 30s\n"
	         "forecast_horizon = 2m\n"
	         "[group etl]\n"
	         "limit = 8GiB\n"
	         "high_watermark = 80\n"
	         "[group web tier]\n"
	         "limit = none\n"
	         "[admission]\n"
	         "default_ttl = 60\n"
	         "max_ttl = 3600\n"
	         "[enforce]\n"
	         "signal = SIGUSR1\n"
	         "grace = 2500\n",
	         tokfile);
	struct mts_settings s;
	char err[512];
	cr_assert_eq(load(text, &s, err, sizeof(err)), 0, "%s", err);
	cr_assert_str_eq(s.cfg.socket_path, "/tmp/x.sock");
	cr_assert_str_eq(s.cfg.segment, "/mt-test");
	cr_assert_eq(s.cfg.slots, 128);
	cr_assert_eq(s.cfg.lanes, 8);
	cr_assert_eq(s.cfg.tick_ms, 20);
	cr_assert_eq(s.cfg.threshold, 128 * 1024);
	cr_assert_eq(s.log_level, MTS_LOG_DEBUG);
	cr_assert_str_eq(s.cfg.tcp_addr, "[::1]:7411");
	cr_assert_str_eq(s.policy.tcp_token, "0123456789abcdefXYZ");
	cr_assert(s.policy.has_admin_uid);
	cr_assert_eq(s.policy.admin_uid, 1234);
	cr_assert(s.policy.has_admin_gid);
	cr_assert_eq(s.policy.admin_gid, 0);
	cr_assert_str_eq(s.cfg.metrics_addr, "127.0.0.1:9464");
	cr_assert(s.cfg.has_gid);
	cr_assert_eq(s.cfg.gid, 0);
	cr_assert_eq(s.policy.fleet_limit, UINT64_C(64) << 30);
	cr_assert_eq(s.policy.high_bp, 9250);
	cr_assert_eq(s.policy.hyst_bp, 250);
	cr_assert_eq(s.policy.process_limit, UINT64_C(3) << 29);
	cr_assert_eq(s.policy.measure, MTS_MEASURE_MAX);
	cr_assert_eq(s.policy.rss_interval_ms, 250);
	cr_assert_eq(s.policy.growth_window_ms, 30000);
	cr_assert_eq(s.policy.forecast_horizon_ms, 120000);
	cr_assert_eq(s.policy.ngroups, 2);
	const struct mts_group_policy *g = mts_policy_group(&s.policy, "etl");
	cr_assert_not_null(g);
	cr_assert_eq(g->limit, UINT64_C(8) << 30);
	cr_assert_eq(g->high_bp, 8000);
	g = mts_policy_group(&s.policy, "web tier");
	cr_assert_not_null(g);
	cr_assert_eq(g->limit, 0);
	cr_assert_eq(s.policy.default_ttl_s, 60);
	cr_assert_eq(s.policy.max_ttl_s, 3600);
	cr_assert_eq(s.policy.enforce_signal, SIGUSR1);
	cr_assert_eq(s.policy.grace_ms, 2500);

	/* A deep copy is independent of the original. */
	struct mts_policy copy;
	cr_assert_eq(mts_policy_copy(&copy, &s.policy), 0);
	mts_settings_free(&s);
	cr_assert_str_eq(copy.tcp_token, "0123456789abcdefXYZ");
	cr_assert_str_eq(copy.groups[0].name, "etl");
	mts_policy_free(&copy);
}

Test(config, the_example_file_loads)
{
	/* deploy/memtallyd.conf, found from this file's own path. */
	char example[4096];
	snprintf(example, sizeof(example), "%s", __FILE__);
	char *slash = strrchr(example, '/');
	cr_assert_not_null(slash, "__FILE__ is not a path: %s", __FILE__);
	snprintf(slash, sizeof(example) - (size_t)(slash - example),
	         "/../../deploy/memtallyd.conf");
	struct mts_settings s;
	char err[512];
	cr_assert_eq(mts_settings_load(&s, example, NULL, 0, err, sizeof(err)),
	             0, "%s", err);
	cr_assert_eq(s.policy.fleet_limit, 0);
	cr_assert_eq(s.policy.enforce_signal, 0, "enforcement off by default");
	/* The example states the defaults of the connection budget. */
	cr_assert_eq(s.cfg.max_conns, MTS_DEFAULT_MAX_CONNS);
	cr_assert_eq(s.cfg.max_buffered, MTS_DEFAULT_MAX_BUFFERED);
	/* ... and of the per-uid caps and the idle timeout. */
	cr_assert_eq(s.cfg.max_conns_per_uid,
	             MTS_DEFAULT_MAX_CONNS / MTS_DEFAULT_PER_UID_DIV);
	cr_assert_eq(s.policy.watch_per_uid, MTS_DEFAULT_WATCH_PER_UID);
	cr_assert_eq(s.policy.resv_bytes_bp, MTS_DEFAULT_RESV_BYTES_BP);
	cr_assert_eq(s.policy.resv_bytes_per_uid, 0);
	cr_assert_eq(s.cfg.idle_timeout_ms, MTS_DEFAULT_IDLE_MS);
	cr_assert_not(s.cfg.no_idle_timeout);
	cr_assert_eq(s.cfg.oom_score_adj, MTS_DEFAULT_OOM_SCORE_ADJ);
	cr_assert_not(s.cfg.oom_score_keep);
	cr_assert_eq(s.policy.max_resv_per_uid, MTS_DEFAULT_MAX_RESV_PER_UID);
	/* Hooks are off in the example; it states their default timeout. */
	for (int i = 0; i < 3; i++)
		cr_assert_null(s.hooks.cmd[i]);
	cr_assert_eq(s.hooks.timeout_ms, MTS_HOOK_DEFAULT_TIMEOUT_MS);
	mts_settings_free(&s);
}

Test(config, hooks_section)
{
	struct mts_settings s;
	char err[512];
	cr_assert_eq(load("[hooks]\n"
	                  "on_ok = scontrol update nodename=$MEMTALLY_NODE "
	                  "state=resume\n"
	                  "on_over = logger -t memtally \"$MEMTALLY_SCOPE "
	                  "over\"\n"
	                  "timeout = 1500ms\n"
	                  "node = node-17\n",
	                  &s, err, sizeof(err)),
	             0, "%s", err);
	cr_assert_str_eq(s.hooks.cmd[MTSHM_STATE_OK],
	                 "scontrol update nodename=$MEMTALLY_NODE "
	                 "state=resume");
	cr_assert_null(s.hooks.cmd[MTSHM_STATE_HIGH]);
	cr_assert_str_eq(s.hooks.cmd[MTSHM_STATE_OVER],
	                 "logger -t memtally \"$MEMTALLY_SCOPE over\"");
	cr_assert_eq(s.hooks.timeout_ms, 1500);
	cr_assert_str_eq(s.hooks.node, "node-17");
	cr_assert_eq(s.cfg.hooks, &s.hooks);
	mts_settings_free(&s);

	/* An empty command is none; without the section nothing is set and
	 * the timeout is the table's default. */
	cr_assert_eq(load("[hooks]\non_high =\n", &s, err, sizeof(err)), 0,
	             "%s", err);
	cr_assert_null(s.hooks.cmd[MTSHM_STATE_HIGH]);
	cr_assert_eq(s.hooks.timeout_ms, MTS_HOOK_DEFAULT_TIMEOUT_MS);
	cr_assert_null(s.hooks.node);
	mts_settings_free(&s);

	/* A copy is deep. */
	struct mts_hook_conf a = {.timeout_ms = 7}, b;
	a.cmd[2] = strdup("true");
	a.node = strdup("n");
	cr_assert_eq(mts_hook_conf_copy(&b, &a), 0);
	cr_assert_neq(b.cmd[2], a.cmd[2]);
	cr_assert_str_eq(b.cmd[2], "true");
	cr_assert_str_eq(b.node, "n");
	cr_assert_eq(b.timeout_ms, 7);
	mts_hook_conf_free(&a);
	mts_hook_conf_free(&b);
	cr_assert_null(b.cmd[2]);
}

struct bad {
	const char *text;
	int line;
	const char *names; /* what the message must contain */
};

static const struct bad bads[] = {
    {"[server]\nsocket =\n", 2, "[server] socket"},
    {"[server]\nsegment = a/b\n", 2, "[server] segment"},
    {"[server]\nlabel = a/b\n", 2, "[server] label"},
    {"[server]\nstate = relative/path\n", 2, "[server] state"},
    {"[server]\nslots = 0\n", 2, "[server] slots"},
    {"[server]\nslots = 99999999\n", 2, "[server] slots"},
    {"[server]\nlanes = 65\n", 2, "[server] lanes"},
    {"[server]\ntick = fast\n", 2, "[server] tick"},
    {"[server]\nthreshold = 2GiB\n", 2, "[server] threshold"},
    {"[server]\nlog_level = loud\n", 2, "[server] log_level"},
    {"[server]\ntcp = localhost\n", 2, "[server] tcp"},
    {"[server]\ntcp = 127.0.0.1:99999\n", 2, "[server] tcp"},
    {"[server]\ntcp_allow_remote = maybe\n", 2, "[server] tcp_allow_remote"},
    {"[server]\nadmin_uid = no-such-user-xyz\n", 2, "[server] admin_uid"},
    {"[server]\nadmin_gid = no-such-group-xyz\n", 2, "[server] admin_gid"},
    {"[server]\ngroup = no-such-group-xyz\n", 2, "[server] group"},
    {"[server]\nport = 1\n", 2, "[server] port: unknown key"},
    {"[server]\nmax_connections = 0\n", 2, "[server] max_connections"},
    {"[server]\nmax_connections = many\n", 2, "[server] max_connections"},
    {"[server]\nmax_buffered = 512KiB\n", 2, "[server] max_buffered"},
    {"[server]\nmax_buffered = lots\n", 2, "[server] max_buffered"},
    {"[server]\nmax_connections_per_uid = 0\n", 2,
     "[server] max_connections_per_uid"},
    {"[server]\nidle_timeout = soon\n", 2, "[server] idle_timeout"},
    {"[server]\nidle_timeout = 50ms\n", 2, "[server] idle_timeout"},
    {"[server]\nidle_timeout = 25h\n", 2, "[server] idle_timeout"},
    {"[server]\noom_score_adj = -1001\n", 2, "[server] oom_score_adj"},
    {"[server]\noom_score_adj = low\n", 2, "[server] oom_score_adj"},
    {"[admission]\nmax_reservations_per_uid = -1\n", 2,
     "[admission] max_reservations_per_uid"},
    {"[admission]\nmax_reservations_per_uid = 65537\n", 2,
     "[admission] max_reservations_per_uid"},
    {"\n[limits]\nfleet = 12 apples\n", 3, "[limits] fleet"},
    {"[limits]\nfleet = -1G\n", 2, "[limits] fleet"},
    {"[limits]\nprocess = lots\n", 2, "[limits] process"},
    {"[limits]\nhigh_watermark = 0\n", 2, "[limits] high_watermark"},
    {"[limits]\nhigh_watermark = 101\n", 2, "[limits] high_watermark"},
    {"[limits]\nhigh_watermark = 90.123\n", 2, "[limits] high_watermark"},
    {"[limits]\nhysteresis = 51\n", 2, "[limits] hysteresis"},
    {"[limits]\nmeasure = pss\n", 2, "[limits] measure"},
    {"[limits]\nrss_interval = 5\n", 2, "[limits] rss_interval"},
    {"[limits]\ngrowth_window = 500ms\n", 2, "[limits] growth_window"},
    {"[limits]\ngrowth_window = 2h\n", 2, "[limits] growth_window"},
    {"[limits]\nforecast_horizon = soon\n", 2, "[limits] forecast_horizon"},
    {"[limits]\nfleet_limt = 1G\n", 2, "[limits] fleet_limt: unknown key"},
    {"[group etl]\nlimit = 1x\n", 2, "[group etl] limit"},
    {"[group etl]\nhigh_watermark = x\n", 2, "[group etl] high_watermark"},
    {"[group etl]\nsize = 1G\n", 2, "[group etl] size: unknown key"},
    {"[group]\nlimit = 1G\n", 2, "[group] limit"},
    {"[admission]\ndefault_ttl = 0\n", 2, "[admission] default_ttl"},
    {"[admission]\nmax_ttl = forever\n", 2, "[admission] max_ttl"},
    {"[enforce]\nsignal = SIGFOO\n", 2, "[enforce] signal"},
    {"[enforce]\ngrace = -5\n", 2, "[enforce] grace"},
    {"[hooks]\ntimeout = 50ms\n", 2, "[hooks] timeout"},
    {"[hooks]\ntimeout = 2h\n", 2, "[hooks] timeout"},
    {"[hooks]\ntimeout = soon\n", 2, "[hooks] timeout"},
    {"[hooks]\nnode =\n", 2, "[hooks] node"},
    {"[hooks]\non_overr = true\n", 2, "[hooks] on_overr: unknown key"},
    {"[limitz]\nfleet = 1G\n", 2, "[limitz] fleet: unknown section"},
    {"fleet = 1G\n", 1, "a key before any [section]"},
    {"[limits]\nthis line has no equals sign\n", 2, "syntax error"},
};

Test(config, each_bad_value_names_its_key)
{
	for (size_t i = 0; i < sizeof(bads) / sizeof(bads[0]); i++) {
		struct mts_settings s;
		memset(&s, 0x5a, sizeof(s));
		char err[512], where[160];
		int r = load(bads[i].text, &s, err, sizeof(err));
		cr_assert_eq(r, -EINVAL, "case %zu accepted: %s", i,
		             bads[i].text);
		snprintf(where, sizeof(where), "%s:%d: ", path, bads[i].line);
		cr_assert(strncmp(err, where, strlen(where)) == 0,
		          "case %zu: '%s' does not start with '%s'", i, err,
		          where);
		cr_assert_not_null(strstr(err, bads[i].names),
		                   "case %zu: '%s' does not name '%s'", i, err,
		                   bads[i].names);
		cr_assert_null(strchr(err, '\n'), "one line");
		/* Nothing was written to *out. */
		unsigned char *b = (unsigned char *)&s;
		for (size_t k = 0; k < sizeof(s); k++)
			cr_assert_eq(b[k], 0x5a);
	}
}

Test(config, checks_across_keys)
{
	struct mts_settings s;
	char err[512];
	cr_assert_eq(load("[limits]\nhigh_watermark = 10\nhysteresis = 10\n",
	                  &s, err, sizeof(err)),
	             -EINVAL);
	cr_assert_not_null(strstr(err, "[limits] hysteresis: must be below "
	                               "high_watermark"),
	                   "%s", err);
	cr_assert_eq(load("[limits]\nhysteresis = 20\n[group a]\n"
	                  "high_watermark = 15\n",
	                  &s, err, sizeof(err)),
	             -EINVAL);
	cr_assert_not_null(strstr(err, "[group a] high_watermark"), "%s", err);
	cr_assert_eq(load("[admission]\ndefault_ttl = 100\nmax_ttl = 50\n", &s,
	                  err, sizeof(err)),
	             -EINVAL);
	cr_assert_not_null(strstr(err, "[admission] default_ttl"), "%s", err);
	cr_assert_eq(
	    load("[server]\ntcp_token = short\n", &s, err, sizeof(err)),
	    -EINVAL);
	cr_assert_not_null(strstr(err, "[server] tcp_token: a token must be"),
	                   "%s", err);
	cr_assert_eq(load("[server]\ntcp_token = 0123456789abcdef\n"
	                  "tcp_token_file = /etc/hostname\n",
	                  &s, err, sizeof(err)),
	             -EINVAL);
	cr_assert_not_null(strstr(err, "[server] tcp_token_file"), "%s", err);
	cr_assert_eq(
	    load("[server]\ntcp = 192.0.2.1:7411\n", &s, err, sizeof(err)),
	    -EINVAL);
	cr_assert_not_null(strstr(err, "not a loopback address"), "%s", err);
	cr_assert_eq(load("[server]\ntcp = 0.0.0.0:7411\ntcp_allow_remote = "
	                  "yes\n",
	                  &s, err, sizeof(err)),
	             0, "%s", err);
	mts_settings_free(&s);
	/* A name is not looked up by a load (a reload runs on the loop, and
	 * a resolver may take seconds): one that resolves nowhere loads, and
	 * is looked up and checked when the listener starts. */
	cr_assert_eq(load("[server]\ntcp = memtally-test.invalid:7411\n", &s,
	                  err, sizeof(err)),
	             0, "%s", err);
	cr_assert_str_eq(s.cfg.tcp_addr, "memtally-test.invalid:7411");
	cr_assert_not(s.cfg.tcp_allow_remote);
	mts_settings_free(&s);
	/* At start it is looked up (memtallyd exits 2 when that fails: not
	 * asked of a resolver here, which may be slow or absent). */
	cr_assert_eq(
	    load("[server]\ntcp = localhost:7411\n", &s, err, sizeof(err)), 0,
	    "%s", err);
	cr_assert_eq(mts_settings_resolve(&s, err, sizeof(err)), 0, "%s", err);
	mts_settings_free(&s);
}

Test(config, token_file_checks)
{
	char tok[160], text[256];
	struct mts_settings s;
	char err[512];
	snprintf(tok, sizeof(tok), "%s/token", dir);
	write_file(tok, "0123456789abcdef\n", 0644);
	snprintf(text, sizeof(text), "[server]\ntcp_token_file = %s\n", tok);
	cr_assert_eq(load(text, &s, err, sizeof(err)), -EINVAL);
	cr_assert_not_null(strstr(err, "readable by everyone"), "%s", err);
	snprintf(text, sizeof(text), "[server]\ntcp_token_file = %s/none\n",
	         dir);
	cr_assert_eq(load(text, &s, err, sizeof(err)), -EINVAL);
	cr_assert_not_null(strstr(err, "[server] tcp_token_file: cannot read"),
	                   "%s", err);
	write_file(tok, "has blank inside\n", 0600);
	snprintf(text, sizeof(text), "[server]\ntcp_token_file = %s\n", tok);
	cr_assert_eq(load(text, &s, err, sizeof(err)), -EINVAL);
	/* Whoever may write it chooses the next reload's token: admin
	 * rights. Group or other write, or another owner, is refused. */
	const mode_t bad[] = {0602, 0620, 0660, 0622};
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		write_file(tok, "0123456789abcdef\n", 0600);
		cr_assert_eq(chmod(tok, bad[i]), 0);
		cr_assert_eq(load(text, &s, err, sizeof(err)), -EINVAL,
		             "mode %o", (unsigned)bad[i]);
		cr_assert_not_null(strstr(err, "may be written by others"),
		                   "mode %o: %s", (unsigned)bad[i], err);
	}
	write_file(tok, "0123456789abcdef\n", 0640);
	cr_assert_eq(chmod(tok, 0640), 0);
	cr_assert_eq(load(text, &s, err, sizeof(err)), 0, "%s", err);
	mts_settings_free(&s);
	if (geteuid() == 0) {
		cr_assert_eq(chown(tok, 65534, 65534), 0);
		cr_assert_eq(load(text, &s, err, sizeof(err)), -EINVAL);
		cr_assert_not_null(strstr(err, "may be written by others"),
		                   "%s", err);
	}
}

/* [metrics] token_file: the same checks, its own key in the message, and
 * the token in the policy (copied with it). */
Test(config, metrics_token_file)
{
	char tok[160], text[256];
	struct mts_settings s;
	char err[512];
	snprintf(tok, sizeof(tok), "%s/mtoken", dir);
	write_file(tok, "0123456789abcdef\n", 0644);
	snprintf(text, sizeof(text), "[metrics]\ntoken_file = %s\n", tok);
	cr_assert_eq(load(text, &s, err, sizeof(err)), -EINVAL);
	cr_assert_not_null(strstr(err, "[metrics] token_file"), "%s", err);
	cr_assert_not_null(strstr(err, "readable by everyone"), "%s", err);
	write_file(tok, "short\n", 0600);
	cr_assert_eq(load(text, &s, err, sizeof(err)), -EINVAL);
	cr_assert_not_null(strstr(err, "[metrics] token_file: a token must be"),
	                   "%s", err);
	write_file(tok, "0123456789abcdef-metrics \nsecond line\n", 0600);
	cr_assert_eq(load(text, &s, err, sizeof(err)), 0, "%s", err);
	cr_assert_str_eq(s.policy.metrics_token, "0123456789abcdef-metrics");
	cr_assert_null(s.policy.tcp_token, "one token is not the other");
	struct mts_policy copy;
	cr_assert_eq(mts_policy_copy(&copy, &s.policy), 0);
	cr_assert_str_eq(copy.metrics_token, "0123456789abcdef-metrics");
	cr_assert_neq(copy.metrics_token, s.policy.metrics_token);
	mts_policy_free(&copy);
	mts_settings_free(&s);
	cr_assert_eq(load("[metrics]\n", &s, err, sizeof(err)), 0, "%s", err);
	cr_assert_null(s.policy.metrics_token);
	mts_settings_free(&s);
	/* A FIFO in its place is refused at once, not waited on. */
	snprintf(tok, sizeof(tok), "%s/mfifo", dir);
	cr_assert_eq(mkfifo(tok, 0600), 0);
	snprintf(text, sizeof(text), "[metrics]\ntoken_file = %s\n", tok);
	cr_assert_eq(load(text, &s, err, sizeof(err)), -EINVAL);
	cr_assert_not_null(strstr(err, "not a regular file"), "%s", err);
}

/* The token gives admin rights: inline, only in a file nobody else can
 * read. */
Test(config, inline_token_needs_a_private_file)
{
	struct mts_settings s;
	char err[512];
	const char *text = "[server]\ntcp_token = 0123456789abcdef\n";
	mode_t modes[] = {0644, 0640, 0604};
	for (size_t i = 0; i < 3; i++) {
		write_file(path, text, modes[i]);
		err[0] = '\0';
		cr_assert_eq(
		    mts_settings_load(&s, path, NULL, 0, err, sizeof(err)),
		    -EINVAL, "mode %o accepted", modes[i]);
		cr_assert_not_null(strstr(err, path), "%s", err);
		cr_assert_not_null(strstr(err, "tcp_token_file"), "%s", err);
		cr_assert_null(strchr(err, '\n'), "one line: %s", err);
	}
	cr_assert_eq(load(text, &s, err, sizeof(err)), 0, "%s", err);
	cr_assert_str_eq(s.policy.tcp_token, "0123456789abcdef");
	mts_settings_free(&s);
}

Test(config, long_lines_refused_not_cut)
{
	char text[512];
	struct mts_settings s;
	char err[512];
	memset(text, 0, sizeof(text));
	strcpy(text, "[server]\n# ");
	memset(text + strlen(text), 'x', 250);
	strcat(text, "\n");
	cr_assert_eq(load(text, &s, err, sizeof(err)), -EINVAL);
	cr_assert_not_null(strstr(err, ":2: line longer than"), "%s", err);
}

Test(config, section_names_inih_would_cut_are_refused)
{
	/* inih keeps 49 characters of a [section] name: a [group] of a
	 * longer name would configure another group than its workers'. */
	struct mts_settings s;
	char err[512];
	const char *at_most =
	    "[group abcdefghijklmnopqrstuvwxyzabcdefghijklmnopq]\n"
	    "limit = 1GiB\n";
	cr_assert_eq(load(at_most, &s, err, sizeof(err)), 0, "%s", err);
	mts_settings_free(&s);
	cr_assert_eq(load("[limits]\nfleet = 2GiB\n"
	                  "[group abcdefghijklmnopqrstuvwxyzabcdefghijklmnopqr]"
	                  "\nlimit = 1GiB\n",
	                  &s, err, sizeof(err)),
	             -EINVAL);
	cr_assert_not_null(strstr(err, ":3: a [section] name of at most 49"),
	                   "%s", err);
	cr_assert_eq(load("[group gpu ]\nlimit = 1GiB\n", &s, err, sizeof(err)),
	             -EINVAL);
	cr_assert_not_null(strstr(err, ":1: a [section] name with blanks"),
	                   "%s", err);
	cr_assert_eq(load("[ limits]\n", &s, err, sizeof(err)), -EINVAL);
}

Test(config, an_empty_state_is_no_restart_record)
{
	struct mts_settings s;
	char err[512];
	cr_assert_eq(load("[server]\nstate =\n", &s, err, sizeof(err)), 0, "%s",
	             err);
	cr_assert_not_null(s.cfg.state_path);
	cr_assert_str_eq(s.cfg.state_path, "");
	mts_settings_free(&s);
	cr_assert_eq(load("[server]\nstate = rel/x\n", &s, err, sizeof(err)),
	             -EINVAL);
}

Test(config, a_fifo_in_the_files_place_is_refused_not_waited_on)
{
	char fdir[] = "/tmp/mt-cfg-fifo-XXXXXX";
	cr_assert_not_null(mkdtemp(fdir));
	char fifo[64];
	snprintf(fifo, sizeof(fifo), "%s/memtallyd.conf", fdir);
	cr_assert_eq(mkfifo(fifo, 0600), 0);
	struct mts_settings s;
	char err[512];
	cr_assert_lt(mts_settings_load(&s, fifo, NULL, 0, err, sizeof(err)), 0);
	cr_assert_not_null(strstr(err, "not a regular file"), "%s", err);
	unlink(fifo);
	rmdir(fdir);
}

Test(config, a_bad_metrics_address_is_refused_at_parse)
{
	/* Not at the listener's start, after the socket is bound and the
	 * workers adopted: there it exited 1 without file or line. */
	struct mts_settings s;
	char err[512];
	cr_assert_eq(load("[server]\nmetrics = 9464\n", &s, err, sizeof(err)),
	             -EINVAL);
	cr_assert_not_null(strstr(err, ":2:"), "%s", err);
	cr_assert_not_null(strstr(err, "metrics"), "%s", err);
	cr_assert_eq(load("[server]\nmetrics = none\n", &s, err, sizeof(err)),
	             0, "%s", err);
	cr_assert_null(s.cfg.metrics_addr);
	mts_settings_free(&s);
	cr_assert_eq(
	    load("[server]\nmetrics = 127.0.0.1:9464\n", &s, err, sizeof(err)),
	    0, "%s", err);
	cr_assert_str_eq(s.cfg.metrics_addr, "127.0.0.1:9464");
	mts_settings_free(&s);
}

Test(config, a_hook_of_none_is_no_hook)
{
	/* As every other key: not /bin/sh -c none at each change. */
	struct mts_settings s;
	char err[512];
	cr_assert_eq(load("[hooks]\non_over = none\non_ok = off\n"
	                  "on_high = echo high\n",
	                  &s, err, sizeof(err)),
	             0, "%s", err);
	cr_assert_null(s.hooks.cmd[2]);
	cr_assert_null(s.hooks.cmd[0]);
	cr_assert_str_eq(s.hooks.cmd[1], "echo high");
	mts_settings_free(&s);
}

Test(config, a_key_given_twice_is_refused)
{
	/* A config tool's appended "[limits] fleet = none" would otherwise
	 * turn the limit off without a word. */
	struct mts_settings s;
	char err[512];
	cr_assert_eq(load("[limits]\nfleet = 2GiB\n[server]\ntick = 10\n"
	                  "[limits]\nFleet = none\n",
	                  &s, err, sizeof(err)),
	             -EINVAL);
	cr_assert_not_null(strstr(err, ":6: [limits] Fleet: given twice"), "%s",
	                   err);
	/* The same key in two groups, and a section given twice with other
	 * keys: fine. */
	cr_assert_eq(load("[group a]\nlimit = 1GiB\n[group b]\nlimit = 1GiB\n"
	                  "[limits]\nfleet = 2GiB\n[limits]\nprocess = 1GiB\n",
	                  &s, err, sizeof(err)),
	             0, "%s", err);
	mts_settings_free(&s);
	/* Group names are case-sensitive: two groups, not one twice. */
	cr_assert_eq(load("[group GPU]\nlimit = 8GiB\n[group gpu]\n"
	                  "limit = 2GiB\n",
	                  &s, err, sizeof(err)),
	             0, "%s", err);
	mts_settings_free(&s);
	/* The same group, written with other blanks, is the same key. */
	cr_assert_eq(load("[group gpu]\nlimit = 8GiB\n[group \t gpu]\n"
	                  "limit = 2GiB\n",
	                  &s, err, sizeof(err)),
	             -EINVAL);
	cr_assert_not_null(strstr(err, ":4: [group \t gpu] limit: given twice"),
	                   "%s", err);
	/* An alias is the same key: the last would win without a word. */
	cr_assert_eq(
	    load("[server]\nlabel = /a\nsegment = /b\n", &s, err, sizeof(err)),
	    -EINVAL);
	cr_assert_not_null(strstr(err, ":3: [server] segment: given twice"),
	                   "%s", err);
	/* A line led by a form feed is not the previous key's continuation. */
	cr_assert_eq(load("[limits]\nfleet = 2GiB\n\fprocess = 1GiB\n", &s, err,
	                  sizeof(err)),
	             0, "%s", err);
	cr_assert_eq(s.policy.process_limit, 1ull << 30);
	cr_assert_eq(s.policy.fleet_limit, 2ull << 30);
	mts_settings_free(&s);
}

Test(config, missing_file)
{
	struct mts_settings s;
	char err[512];
	cr_assert_eq(mts_settings_load(&s, "/nonexistent/memtallyd.conf", NULL,
	                               0, err, sizeof(err)),
	             -ENOENT);
	cr_assert_not_null(strstr(err, "/nonexistent/memtallyd.conf: cannot "
	                               "read"),
	                   "%s", err);
	cr_assert_eq(mts_settings_load(&s, "/tmp", NULL, 0, err, sizeof(err)),
	             -EFBIG);
}

Test(config, flags_override_the_file)
{
	struct mts_settings s;
	char err[512];
	write_file(path,
	           "[server]\nslots = 64\n[limits]\nfleet = 1G\n"
	           "high_watermark = 80\n",
	           0600);
	const struct mts_override ov[] = {
	    {"--fleet-limit", "limits", "fleet", "2GiB"},
	    {"--slots", "server", "slots", "32"},
	};
	cr_assert_eq(mts_settings_load(&s, path, ov, 2, err, sizeof(err)), 0,
	             "%s", err);
	cr_assert_eq(s.policy.fleet_limit, UINT64_C(2) << 30);
	cr_assert_eq(s.cfg.slots, 32);
	cr_assert_eq(s.policy.high_bp, 8000, "the file's, not overridden");
	mts_settings_free(&s);

	/* A bad flag names the flag. */
	const struct mts_override bad[] = {
	    {"--high-watermark", "limits", "high_watermark", "lots"},
	};
	cr_assert_eq(mts_settings_load(&s, path, bad, 1, err, sizeof(err)),
	             -EINVAL);
	cr_assert(strncmp(err, "--high-watermark: expected a percentage", 39) ==
	              0,
	          "%s", err);
	/* A flag can break a check across keys; the key is named. */
	const struct mts_override low[] = {
	    {"--high-watermark", "limits", "high_watermark", "4"},
	};
	cr_assert_eq(mts_settings_load(&s, NULL, low, 1, err, sizeof(err)),
	             -EINVAL);
	cr_assert_not_null(strstr(err, "[limits] hysteresis"), "%s", err);
}

Test(config, connection_budget_keys_and_flags)
{
	struct mts_settings s;
	char err[512];
	write_file(path,
	           "[server]\nmax_connections = 64\nmax_buffered = 8MiB\n",
	           0600);
	cr_assert_eq(mts_settings_load(&s, path, NULL, 0, err, sizeof(err)), 0,
	             "%s", err);
	cr_assert_eq(s.cfg.max_conns, 64);
	cr_assert_eq(s.cfg.max_buffered, UINT64_C(8) << 20);
	mts_settings_free(&s);
	const struct mts_override ov[] = {
	    {"--max-connections", "server", "max_connections", "10"},
	    {"--max-buffered", "server", "max_buffered", "1.5G"},
	};
	cr_assert_eq(mts_settings_load(&s, path, ov, 2, err, sizeof(err)), 0,
	             "%s", err);
	cr_assert_eq(s.cfg.max_conns, 10);
	cr_assert_eq(s.cfg.max_buffered, UINT64_C(3) << 29);
	mts_settings_free(&s);
	const struct mts_override bad[] = {
	    {"--max-buffered", "server", "max_buffered", "100KiB"},
	};
	cr_assert_eq(mts_settings_load(&s, path, bad, 1, err, sizeof(err)),
	             -EINVAL);
	cr_assert(strncmp(err, "--max-buffered: expected a size", 31) == 0,
	          "%s", err);
}

/* The server's own OOM score: -900 by default, any value the kernel takes,
 * or none to keep what it inherited. */
Test(config, oom_score_adj)
{
	struct mts_settings s;
	char err[512];
	cr_assert_eq(mts_settings_load(&s, NULL, NULL, 0, err, sizeof(err)), 0,
	             "%s", err);
	cr_assert_eq(s.cfg.oom_score_adj, -900);
	cr_assert_not(s.cfg.oom_score_keep);
	mts_settings_free(&s);
	cr_assert_eq(
	    load("[server]\noom_score_adj = -1000\n", &s, err, sizeof(err)), 0,
	    "%s", err);
	cr_assert_eq(s.cfg.oom_score_adj, -1000);
	mts_settings_free(&s);
	cr_assert_eq(
	    load("[server]\noom_score_adj = none\n", &s, err, sizeof(err)), 0,
	    "%s", err);
	cr_assert(s.cfg.oom_score_keep);
	mts_settings_free(&s);
}

Test(config, per_uid_caps_and_idle_timeout)
{
	struct mts_settings s;
	char err[512];
	/* Defaults. */
	cr_assert_eq(mts_settings_load(&s, NULL, NULL, 0, err, sizeof(err)), 0,
	             "%s", err);
	/* 0: max_connections / 8, computed by conn.c. */
	cr_assert_eq(s.cfg.max_conns_per_uid, 0);
	cr_assert_eq(s.policy.watch_per_uid, 16);
	cr_assert_eq(s.cfg.idle_timeout_ms, 60000);
	cr_assert_not(s.cfg.no_idle_timeout);
	cr_assert_eq(s.policy.max_resv_per_uid, 1024);
	mts_settings_free(&s);

	cr_assert_eq(load("[server]\nmax_connections_per_uid = 8\n"
	                  "idle_timeout = 500ms\nmax_watch_per_uid = 3\n"
	                  "[admission]\nmax_reservations_per_uid = 10\n",
	                  &s, err, sizeof(err)),
	             0, "%s", err);
	cr_assert_eq(s.cfg.max_conns_per_uid, 8);
	cr_assert_eq(s.policy.watch_per_uid, 3);
	cr_assert_eq(s.cfg.idle_timeout_ms, 500);
	cr_assert_eq(s.policy.max_resv_per_uid, 10);
	mts_settings_free(&s);

	/* Units; 0 turns the timeout off, none the reservation cap. */
	static const struct {
		const char *v;
		uint32_t ms;
	} d[] = {{"90", 90000},   {"90s", 90000}, {"2m", 120000},
	         {"1h", 3600000}, {"100ms", 100}, {"24h", 86400000}};
	for (size_t i = 0; i < sizeof(d) / sizeof(d[0]); i++) {
		char text[128];
		snprintf(text, sizeof(text), "[server]\nidle_timeout = %s\n",
		         d[i].v);
		cr_assert_eq(load(text, &s, err, sizeof(err)), 0, "%s", err);
		cr_assert_eq(s.cfg.idle_timeout_ms, d[i].ms, "%s", d[i].v);
		cr_assert_not(s.cfg.no_idle_timeout);
		mts_settings_free(&s);
	}
	cr_assert_eq(load("[server]\nidle_timeout = 0\n[admission]\n"
	                  "max_reservations_per_uid = none\n",
	                  &s, err, sizeof(err)),
	             0, "%s", err);
	cr_assert(s.cfg.no_idle_timeout);
	cr_assert_eq(s.policy.max_resv_per_uid, 0);
	/* A policy copy (what a reload installs) carries the cap. */
	s.policy.max_resv_per_uid = 7;
	struct mts_policy copy;
	cr_assert_eq(mts_policy_copy(&copy, &s.policy), 0);
	cr_assert_eq(copy.max_resv_per_uid, 7);
	mts_policy_free(&copy);
	mts_settings_free(&s);
}

Test(parse, percent)
{
	uint32_t bp;
	cr_assert_eq(mts_parse_percent("90", &bp), 0);
	cr_assert_eq(bp, 9000);
	cr_assert_eq(mts_parse_percent("92.5%", &bp), 0);
	cr_assert_eq(bp, 9250);
	cr_assert_eq(mts_parse_percent("0.05", &bp), 0);
	cr_assert_eq(bp, 5);
	cr_assert_eq(mts_parse_percent("100", &bp), 0);
	cr_assert_eq(bp, 10000);
	cr_assert_eq(mts_parse_percent("0", &bp), 0);
	cr_assert_eq(bp, 0);
	const char *bad[] = {"",    "100.01", "101", "-1",
	                     "9.",  ".5",     "5%%", "5 %",
	                     "1e2", "0.123",  "abc", "50percent"};
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++)
		cr_assert_eq(mts_parse_percent(bad[i], &bp), -EINVAL, "'%s'",
		             bad[i]);
}

Test(parse, signal)
{
	int sig;
	cr_assert_eq(mts_parse_signal("SIGTERM", &sig), 0);
	cr_assert_eq(sig, SIGTERM);
	cr_assert_eq(mts_parse_signal("term", &sig), 0);
	cr_assert_eq(sig, SIGTERM);
	cr_assert_eq(mts_parse_signal("KILL", &sig), 0);
	cr_assert_eq(sig, SIGKILL);
	cr_assert_eq(mts_parse_signal("15", &sig), 0);
	cr_assert_eq(sig, 15);
	cr_assert_eq(mts_parse_signal("", &sig), 0);
	cr_assert_eq(sig, 0, "empty is off");
	cr_assert_eq(mts_parse_signal("0", &sig), -EINVAL);
	cr_assert_eq(mts_parse_signal("SIGFOO", &sig), -EINVAL);
	cr_assert_eq(mts_parse_signal("15x", &sig), -EINVAL);
	cr_assert_eq(mts_parse_signal("999", &sig), -EINVAL);
	/* glibc's own two below SIGRTMIN are not ours to send; a real-time
	 * signal by number is. */
	cr_assert_eq(mts_parse_signal("32", &sig), -EINVAL);
	cr_assert_eq(mts_parse_signal("33", &sig), -EINVAL);
	cr_assert_eq(mts_parse_signal("64", &sig), 0);
	cr_assert_eq(sig, 64);
}

/* The listener's parser, when only the loopback flag matters. */
static int mts_parse_hostport_lo(const char *s, struct sockaddr_storage *ss,
                                 bool *lo)
{
	socklen_t len = 0;
	int err = mts_parse_hostport(s, ss, &len, lo);
	if (err == 0)
		cr_assert_eq(len, ss->ss_family == AF_INET6
		                      ? sizeof(struct sockaddr_in6)
		                      : sizeof(struct sockaddr_in));
	return err;
}

Test(parse, hostport)
{
	struct sockaddr_storage ss;
	bool lo;
	cr_assert_eq(mts_parse_hostport_lo("127.0.0.1:7411", &ss, &lo), 0);
	cr_assert(lo);
	cr_assert_eq(ss.ss_family, AF_INET);
	cr_assert_eq(mts_parse_hostport_lo("localhost:0", &ss, &lo), 0);
	cr_assert(lo);
	cr_assert_eq(mts_parse_hostport_lo("[::1]:80", &ss, &lo), 0);
	cr_assert(lo);
	cr_assert_eq(ss.ss_family, AF_INET6);
	cr_assert_eq(mts_parse_hostport_lo("127.9.9.9:1", &ss, &lo), 0);
	cr_assert(lo);
	cr_assert_eq(mts_parse_hostport_lo("0.0.0.0:1", &ss, &lo), 0);
	cr_assert_not(lo);
	cr_assert_eq(mts_parse_hostport_lo("[::]:1", &ss, &lo), 0);
	cr_assert_not(lo);
	const char *bad[] = {"",
	                     "127.0.0.1",
	                     ":80",
	                     "127.0.0.1:",
	                     "1.2.3:4",
	                     "[::1:80",
	                     "::1:80",
	                     "1.2.3.4.5:80",
	                     "127.0.0.1:65536",
	                     "127.0.0.1:-1"};
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++)
		cr_assert_eq(mts_parse_hostport_lo(bad[i], &ss, &lo), -EINVAL,
		             "'%s'", bad[i]);
}

/* Every flag sets a key the file knows, through that key's parser: a bad
 * value is refused naming the flag with the key's own message. */
Test(flags, every_flag_is_a_known_key)
{
	struct mts_settings s;
	char err[512];
	size_t nflags = 0;
	for (size_t i = 0; i < mts_nkeys; i++) {
		const struct mts_key *k = &mts_keys[i];
		if (!k->flag)
			continue;
		nflags++;
		cr_assert_eq(strncmp(k->flag, "--", 2), 0, "%s", k->flag);
		cr_assert(mts_config_key_known(k->section, k->key),
		          "%s sets [%s] %s, which the file does not know",
		          k->flag, k->section, k->key);
	}
	cr_assert_gt(nflags, 10);
	cr_assert_not(mts_config_key_known("server", "no_such_key"));
	cr_assert_not(mts_config_key_known("limits", "socket"));
	const struct mts_override bad = {"--slots", "server", "slots", "x"};
	cr_assert_eq(mts_settings_load(&s, NULL, &bad, 1, err, sizeof(err)),
	             -EINVAL);
	cr_assert_str_eq(err, "--slots: expected an integer from 1 to 1048576, "
	                      "got 'x'");
}

/* [group NAME] uids and gids (numbers or names), the per-uid caps and
 * [metrics]; a bad entry is a one-line error naming the key. */
Test(config, group_owners_caps_and_metrics)
{
	struct mts_settings s;
	char err[512];
	cr_assert_eq(load("[group etl]\nuids = 1000, root ,2000\n"
	                  "gids = 0\nlimit = 1GiB\n"
	                  "[limits]\nmax_slots_per_uid = 16\n"
	                  "max_groups_per_uid = none\n"
	                  "[admission]\nmax_reserved_bytes_per_uid = 25%\n"
	                  "[metrics]\nper_process = true\nmax_groups = 50\n",
	                  &s, err, sizeof(err)),
	             0, "%s", err);
	const struct mts_group_policy *g = mts_policy_group(&s.policy, "etl");
	cr_assert_not_null(g);
	cr_assert_eq(g->nuids, 3);
	cr_assert_eq(g->uids[0], 1000);
	cr_assert_eq(g->uids[1], 0);
	cr_assert_eq(g->uids[2], 2000);
	cr_assert_eq(g->ngids, 1);
	cr_assert_eq(g->gids[0], 0);
	cr_assert_eq(s.policy.slots_per_uid, 16);
	cr_assert_eq(s.policy.groups_per_uid, 0);
	cr_assert_eq(s.policy.resv_bytes_bp, 2500);
	cr_assert_eq(s.policy.resv_bytes_per_uid, 0);
	cr_assert(s.policy.metrics_per_process);
	cr_assert_eq(s.policy.metrics_max_groups, 50);
	/* The reload path deep-copies the lists. */
	struct mts_policy c;
	cr_assert_eq(mts_policy_copy(&c, &s.policy), 0);
	cr_assert_neq(c.groups[0].uids, g->uids);
	cr_assert_eq(c.groups[0].uids[2], 2000);
	mts_policy_free(&c);
	mts_settings_free(&s);

	/* Defaults: slots capped at a fraction, 64 groups, 1/8 of the
	 * fleet reserved per uid, no per-process series, 256 group series. */
	cr_assert_eq(mts_settings_load(&s, NULL, NULL, 0, err, sizeof(err)), 0);
	cr_assert_eq(s.policy.slots_per_uid, 0);
	cr_assert_eq(s.policy.groups_per_uid, MTS_DEFAULT_GROUPS_PER_UID);
	cr_assert_eq(s.policy.resv_bytes_per_uid, 0);
	cr_assert_eq(s.policy.resv_bytes_bp, 1250);
	mts_settings_free(&s);
	cr_assert_eq(load("[admission]\nmax_reserved_bytes_per_uid = none\n"
	                  "[server]\nmax_watch_per_uid = none\n",
	                  &s, err, sizeof(err)),
	             0, "%s", err);
	cr_assert_eq(s.policy.resv_bytes_per_uid, 0);
	cr_assert_eq(s.policy.resv_bytes_bp, 0);
	cr_assert_eq(s.policy.watch_per_uid, 0);
	cr_assert_not(s.policy.metrics_per_process);
	cr_assert_eq(s.policy.metrics_max_groups, MTS_DEFAULT_METRICS_GROUPS);
	mts_settings_free(&s);

	cr_assert_neq(load("[group etl]\nuids = 1000, no-such-user-here\n", &s,
	                   err, sizeof(err)),
	              0);
	cr_assert(strstr(err, "[group etl] uids:"), "%s", err);
	cr_assert_neq(load("[group etl]\ngids = ,\n", &s, err, sizeof(err)), 0);
	cr_assert(strstr(err, "[group etl] gids:"), "%s", err);
	cr_assert_neq(load("[group default]\nuids = 0\n", &s, err, sizeof(err)),
	              0);
	cr_assert(strstr(err, "[group default] uids:"), "%s", err);
	cr_assert_neq(
	    load("[limits]\nmax_slots_per_uid = 0\n", &s, err, sizeof(err)), 0);
	cr_assert_neq(load("[admission]\nmax_reserved_bytes_per_uid = lots\n",
	                   &s, err, sizeof(err)),
	              0);
}

Test(config, show_others)
{
	struct mts_settings s;
	char err[512];
	cr_assert_eq(mts_settings_load(&s, NULL, NULL, 0, err, sizeof(err)), 0);
	cr_assert_eq(s.policy.show_others, MTS_SHOW_COUNTS);
	mts_settings_free(&s);
	cr_assert_eq(
	    load("[server]\nshow_others = none\n", &s, err, sizeof(err)), 0,
	    "%s", err);
	cr_assert_eq(s.policy.show_others, MTS_SHOW_NONE);
	mts_settings_free(&s);
	cr_assert_eq(
	    load("[server]\nshow_others = all\n", &s, err, sizeof(err)), 0,
	    "%s", err);
	cr_assert_eq(s.policy.show_others, MTS_SHOW_ALL);
	mts_settings_free(&s);
	cr_assert_neq(
	    load("[server]\nshow_others = some\n", &s, err, sizeof(err)), 0);
	cr_assert(strstr(err, "[server] show_others:"), "%s", err);
}

/* Names: valid UTF-8 without C0/C1 controls or bidi formatting. */
Test(config, names)
{
	cr_assert(mt_name_ok("etl"));
	cr_assert(mt_name_ok("caf\xc3\xa9-\xe6\x97\xa5\xf0\x9f\x98\x80"));
	cr_assert_not(mt_name_ok("a\xc2\x9b"
	                         "31m")); /* U+009B CSI */
	cr_assert_not(mt_name_ok("a\xc2\x9d"
	                         "0;x"));       /* U+009D OSC */
	cr_assert_not(mt_name_ok("a\xc2\x80")); /* U+0080 */
	cr_assert(mt_name_ok("a\xc2\xa0"));     /* U+00A0: fine */
	cr_assert_not(mt_name_ok("\xe2\x80\xae"
	                         "evil"));         /* U+202E */
	cr_assert_not(mt_name_ok("\xe2\x80\xaa")); /* U+202A */
	cr_assert_not(mt_name_ok("\xe2\x81\xa6")); /* U+2066 */
	cr_assert_not(mt_name_ok("\xe2\x81\xa9")); /* U+2069 */
	cr_assert_not(mt_name_ok("\xe2\x80\x8e")); /* U+200E */
	cr_assert_not(mt_name_ok("\xe2\x80\x8f")); /* U+200F */
	cr_assert_not(mt_name_ok("\xd8\x9c"));     /* U+061C */
	cr_assert_not(mt_name_ok("a\xff"));        /* not UTF-8 */
	cr_assert_not(mt_name_ok("a\xc3"));        /* cut short */
	cr_assert_not(mt_name_ok("\xc0\xaf"));     /* overlong */
	cr_assert_not(mt_name_ok("\xed\xa0\x80")); /* surrogate */
	cr_assert_not(mt_name_ok("a\x1b[31m"));
	cr_assert_not(mt_name_ok("a\x7f"));
}

/* Log lines go to fd 2: to a temporary file while `capture` runs. */
struct captured {
	int saved, fd;
};

static struct captured capture_start(void)
{
	struct captured c;
	char name[] = "/tmp/mt-log-XXXXXX";
	c.fd = mkstemp(name);
	cr_assert_geq(c.fd, 0);
	unlink(name);
	c.saved = dup(2);
	dup2(c.fd, 2);
	return c;
}

/* Everything written since capture_start(), NUL-terminated (free it). */
static char *capture_end(struct captured c)
{
	dup2(c.saved, 2);
	close(c.saved);
	off_t n = lseek(c.fd, 0, SEEK_END);
	char *buf = calloc(1, (size_t)n + 1);
	cr_assert_eq(pread(c.fd, buf, (size_t)n, 0), n);
	close(c.fd);
	return buf;
}

static unsigned count_of(const char *text, const char *what)
{
	unsigned n = 0;
	for (const char *p = text; (p = strstr(p, what)); p += strlen(what))
		n++;
	return n;
}

/* The budgets count by CLOCK_MONOTONIC second: start at a fresh one, so
 * that a test's lines all fall in one second. */
static void fresh_second(void)
{
	struct timespec a, b;
	clock_gettime(CLOCK_MONOTONIC, &a);
	do
		clock_gettime(CLOCK_MONOTONIC, &b);
	while (b.tv_sec == a.tv_sec);
}

/* A peer's lines: MTS_LOG_PEER_BURST a second per uid below warn and as
 * many from warn up, then held back and summed by msg; another uid has
 * its own budget. */
Test(config, peer_log_budget)
{
	mts_log_set_level(MTS_LOG_INFO);
	fresh_second();
	struct captured c = capture_start();
	for (int i = 0; i < 1000; i++)
		mts_log_uid(65534, MTS_LOG_INFO, "admission granted", "i=%d",
		            i);
	for (int i = 0; i < 500; i++)
		mts_log_uid(65534, MTS_LOG_INFO, "reservation released", "i=%d",
		            i);
	/* The uid's notes are spent; its warnings are not. */
	for (int i = 0; i < 3; i++)
		mts_log_uid(65534, MTS_LOG_WARN, "figure below zero", NULL);
	for (int i = 0; i < 5; i++)
		mts_log_uid(4242, MTS_LOG_INFO, "admission granted", "i=%d", i);
	mts_log_flush(true);
	char *out = capture_end(c);
	cr_assert_eq(count_of(out, "msg=\"admission granted\" i="),
	             MTS_LOG_PEER_BURST + 5, "%s", out);
	cr_assert_eq(count_of(out, "msg=\"reservation released\""), 0);
	cr_assert_eq(count_of(out, "msg=\"figure below zero\""), 3);
	cr_assert_eq(count_of(out, "msg=\"similar lines suppressed\""), 1, "%s",
	             out);
	cr_assert(strstr(out, "level=warn msg=\"similar lines suppressed\" "
	                      "uid=65534 suppressed=1490 budget_per_s=10 "
	                      "lines=\"admission granted (990); reservation "
	                      "released (500)\"\n"),
	          "%s", out);
	unsigned long long by_uid, by_scope;
	mts_log_suppressed(&by_uid, &by_scope);
	cr_assert_eq(by_uid, 1490);
	cr_assert_eq(by_scope, 0);
	free(out);
}

/* A line at a level not written takes nothing from the budget, and no
 * summary claims it was held back. */
Test(config, peer_log_budget_skips_unwritten_levels)
{
	mts_log_set_level(MTS_LOG_WARN);
	fresh_second();
	struct captured c = capture_start();
	for (int i = 0; i < 100; i++)
		mts_log_uid(65534, MTS_LOG_INFO, "admission granted", NULL);
	mts_log_uid(65534, MTS_LOG_WARN, "release refused", NULL);
	mts_log_flush(true);
	char *out = capture_end(c);
	cr_assert_eq(count_of(out, "\n"), 1, "%s", out);
	cr_assert(strstr(out, "msg=\"release refused\""), "%s", out);
	unsigned long long by_uid, by_scope;
	mts_log_suppressed(&by_uid, &by_scope);
	cr_assert_eq(by_uid, 0);
	free(out);
}

/* A scope's lines: MTS_LOG_SCOPE_BURST a second, then one line that is
 * the latest held back, with how many were, at the level of the worst
 * (an `over` among them); another scope has its own budget. */
Test(config, scope_log_budget)
{
	mts_log_set_level(MTS_LOG_INFO);
	fresh_second();
	struct captured c = capture_start();
	for (int i = 0; i < 20; i++)
		mts_log_scope("fleet", i == 12 ? MTS_LOG_WARN : MTS_LOG_INFO,
		              "state changed", "scope=\"fleet\" n=%d", i);
	for (int i = 0; i < 3; i++)
		mts_log_scope("group:etl", MTS_LOG_INFO, "state changed",
		              "scope=\"group:etl\" n=%d", i);
	mts_log_flush(false); /* the second is not over: nothing yet */
	char *early = capture_end(c);
	cr_assert_eq(count_of(early, "suppressed="), 0, "%s", early);
	c = capture_start();
	mts_log_flush(true);
	char *out = capture_end(c);
	cr_assert_eq(count_of(early, "scope=\"fleet\""), MTS_LOG_SCOPE_BURST,
	             "%s", early);
	cr_assert_eq(count_of(early, "scope=\"group:etl\""), 3);
	cr_assert_eq(count_of(out, "\n"), 1, "%s", out);
	cr_assert(strstr(out, "level=warn msg=\"state changed\" "
	                      "scope=\"fleet\" n=19 suppressed=15 "
	                      "budget_per_s=5\n"),
	          "%s", out);
	unsigned long long by_uid, by_scope;
	mts_log_suppressed(&by_uid, &by_scope);
	cr_assert_eq(by_scope, 15);
	cr_assert_eq(by_uid, 0);
	free(early);
	free(out);
}

/* A new second starts a new budget, and the held-back lines of the past
 * one are reported before its first line. */
Test(config, log_budget_next_second)
{
	mts_log_set_level(MTS_LOG_INFO);
	fresh_second();
	struct captured c = capture_start();
	for (int i = 0; i < 12; i++)
		mts_log_uid(7, MTS_LOG_INFO, "worker registered", "i=%d", i);
	fresh_second();
	mts_log_uid(7, MTS_LOG_INFO, "worker registered", "i=next");
	char *out = capture_end(c);
	const char *sum = strstr(out, "uid=7 suppressed=2 ");
	const char *next = strstr(out, "i=next");
	cr_assert(sum && next && sum < next, "%s", out);
	cr_assert_eq(count_of(out, "msg=\"worker registered\""),
	             MTS_LOG_PEER_BURST + 1);
	free(out);
}

/* The table's defaults are values of their keys: each prints as text its
 * own parser takes back to the same value, so --help and the start-up
 * log show what the server runs with. */
Test(config, every_default_reads_back)
{
	struct mts_settings d, s;
	char err[512], text[256], again[256], why[256];
	cr_assert_eq(mts_settings_load(&d, NULL, NULL, 0, err, sizeof(err)), 0);
	cr_assert_eq(mts_settings_load(&s, NULL, NULL, 0, err, sizeof(err)), 0);
	size_t checked = 0;
	for (size_t i = 0; i < mts_nkeys; i++) {
		const struct mts_key *k = &mts_keys[i];
		/* A field is a bool, a 32- or a 64-bit integer, a pointer. */
		cr_assert(k->width == 0 || k->width == 1 || k->width == 4 ||
		              k->width == 8,
		          "[%s] %s: a field of %zu bytes", k->section, k->key,
		          k->width);
		if (k->opts & MTS_KEY_GROUP || k->dflt)
			continue;
		mts_key_show(k, &d, true, text, sizeof(text));
		if (strcmp(text, "none") == 0 && !(k->opts & MTS_KEY_NONE))
			continue; /* an unset string or list: nothing to read */
		cr_assert_eq(mts_key_parse(k, &s, text, why, sizeof(why)), 0,
		             "[%s] %s: default '%s' does not parse: %s",
		             k->section, k->key, text, why);
		mts_key_show(k, &s, true, again, sizeof(again));
		cr_assert_str_eq(again, text, "[%s] %s", k->section, k->key);
		checked++;
	}
	cr_assert_gt(checked, 50);
	mts_settings_free(&d);
	mts_settings_free(&s);
}

/* [server] label was called segment: the old key and flag still set it. */
Test(config, label_and_its_old_name)
{
	struct mts_settings s;
	char err[512];
	cr_assert_eq(
	    load("[server]\nsegment = /mt-old\n", &s, err, sizeof(err)), 0,
	    "%s", err);
	cr_assert_str_eq(s.cfg.segment, "/mt-old");
	mts_settings_free(&s);
	cr_assert_eq(load("[server]\nlabel = mt-new\n", &s, err, sizeof(err)),
	             0, "%s", err);
	cr_assert_str_eq(s.cfg.segment, "mt-new");
	mts_settings_free(&s);
	const struct mts_override ov = {"--segment", "server", "label", "a/b"};
	cr_assert_eq(mts_settings_load(&s, NULL, &ov, 1, err, sizeof(err)),
	             -EINVAL);
	cr_assert_str_eq(err, "--segment: expected a name like memtally (1 to "
	                      "64 bytes, no '/' but a leading one, which is "
	                      "dropped), got 'a/b'");
}

/* A reload names the keys whose value changed, apart by whether a reload
 * applies them: the restart keys are the ones it warns about. */
Test(config, reload_diff_from_the_table)
{
	struct mts_settings a, b;
	char err[512];
	const struct mts_key *keys[8];
	cr_assert_eq(load("[server]\nslots = 64\nlabel = mt-a\n"
	                  "[limits]\nfleet = 1GiB\n",
	                  &a, err, sizeof(err)),
	             0, "%s", err);
	cr_assert_eq(load("[server]\nslots = 128\nsegment = mt-b\n"
	                  "[limits]\nfleet = 1GiB\nhysteresis = 2\n"
	                  "[hooks]\non_ok = true\n",
	                  &b, err, sizeof(err)),
	             0, "%s", err);
	cr_assert_eq(mts_settings_diff(&a, &b, false, keys, 8), 2);
	cr_assert_str_eq(keys[0]->key, "label");
	cr_assert_str_eq(keys[1]->key, "slots");
	cr_assert_eq(mts_settings_diff(&a, &b, true, keys, 8), 2);
	cr_assert_str_eq(keys[0]->key, "hysteresis");
	cr_assert_str_eq(keys[1]->key, "on_ok");
	cr_assert_eq(mts_settings_diff(&a, &a, true, keys, 8), 0);
	mts_settings_free(&a);
	mts_settings_free(&b);
}
