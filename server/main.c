/*
 * main.c - memtallyd: command line, config file, signals, the loop.
 *
 * Settings come from defaults, then the --config file, then the flags
 * (config.c): each flag is the override of one key, so a flag always wins,
 * at start and at every reload.
 *
 * Exit status: 0 after a clean stop (SIGTERM/SIGINT), 1 when the server
 * cannot start (socket taken by a live server, restart record locked by
 * a live server, no
 * permission), 2 for a bad flag or config value (one line on stderr naming
 * it), or a socket or state file in a directory others could change. A
 * second SIGTERM/SIGINT during shutdown gets the default action: the
 * signal handles are closed by then, on purpose, so a stuck stop can still
 * be interrupted.
 *
 * SIGHUP re-reads the config file (and re-applies the flags over it). A
 * bad value is logged, naming the key, and the running config is kept
 * whole; a good one applies at once the keys config.c's table marks
 * MTS_KEY_RELOAD (limits, watermarks, groups, admission, enforcement,
 * admin uid/gid, the TCP token, [hooks] for the hooks started after it,
 * the log level, ...) and names them in the "config reloaded" line. The
 * others (socket, label, slots, tcp, max_connections, ...) are reported
 * if changed, and keep their old values until the next start.
 *
 * Open files: every registered worker holds a pidfd here and every
 * connection a socket, so the soft RLIMIT_NOFILE (often 1024) is raised at
 * start, up to the hard limit, to slots + max_connections + a margin
 * (raise_nofile). A hard limit below that is logged as a warning naming
 * the numbers, and the server starts anyway: it serves as many as fit, and
 * an accept or pidfd_open over the limit fails (EMFILE) and is logged.
 *
 * Under systemd (NOTIFY_SOCKET set), readiness is reported with
 * sd_notify: READY=1 once the listener and segment are up, RELOADING=1 and
 * READY=1 around a reload, STOPPING=1 at stop. Without NOTIFY_SOCKET these
 * are no-ops.
 */
#include <errno.h>
#include <getopt.h>
#include <limits.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/un.h>
#include <systemd/sd-daemon.h>
#include <unistd.h>

#include "mts_config.h"
#include "mts_conn.h"
#include "mts_defs.h"
#include "mts_hooks.h"
#include "mts_log.h"
#include "mts_policy.h"
#include "mts_registry.h"
#include "server.h"

#define EXIT_USAGE 2

/* One option of --help: the flag and its argument in a 20-column field,
 * then the text, wrapped at 78 columns and indented to the same column. */
static void usage_option(FILE *f, const char *flag, const char *arg,
                         const char *text)
{
	char head[64];
	snprintf(head, sizeof(head), "%s%s%s", flag, arg ? " " : "",
	         arg ? arg : "");
	/* A long head pushes the first line's text right, as it reads best. */
	int col = fprintf(f, "  %-19s%s", head, strlen(head) >= 19 ? " " : "");
	for (const char *p = text; *p; p += strspn(p, " ")) {
		size_t w = strcspn(p, " ");
		if (col > 22 && col + 1 + (int)w > 78)
			col = fprintf(f, "\n%21s", "") - 1;
		col += fprintf(f, " %.*s", (int)w, p);
		p += w;
	}
	fputc('\n', f);
}

/* The flags that set a key, then every key of the file: both from the
 * table (mts_keys), with their defaults. */
static void usage(FILE *f)
{
	struct mts_settings d;
	char text[512], err[256];
	if (mts_settings_load(&d, NULL, NULL, 0, err, sizeof(err)) < 0) {
		fprintf(stderr, "memtallyd: %s\n", err);
		exit(1);
	}
	fprintf(f, "Usage: memtallyd [OPTIONS]\n"
	           "Memory accounting server for a fleet of worker processes.\n"
	           "\n");
	usage_option(f, "--config", "FILE",
	             "INI config file (see deploy/memtallyd.conf); flags "
	             "override its keys; SIGHUP reloads it");
	for (size_t i = 0; i < mts_nkeys; i++) {
		const struct mts_key *k = &mts_keys[i];
		if (!k->flag)
			continue;
		mts_key_describe(k, &d, text, sizeof(text));
		usage_option(f, k->flag,
		             k->arg                       ? k->arg
		             : k->type == MTS_KEY_SIZE    ? "SIZE"
		             : k->type == MTS_KEY_PERCENT ? "PCT"
		                                          : "N",
		             text);
	}
	usage_option(f, "--reset", NULL,
	             "start afresh instead of adopting the workers of the "
	             "previous server (by default live workers keep their "
	             "slots and counts)");
	usage_option(f, "--help", NULL, "this text");
	usage_option(f, "--version", NULL, "print the version");
	fprintf(f,
	        "\n"
	        "Each value flag sets a key of the config file and is parsed "
	        "as that key\n"
	        "is. SIZE is bytes with an optional unit: K, M, G, T "
	        "and KiB, MiB,\n"
	        "GiB, TiB are powers of 1024; KB, MB, GB, TB are powers of "
	        "1000 (64KiB,\n"
	        "1.5G, 512MB). A duration is a number with ms, s, m, h or d. "
	        "Logs are logfmt\n"
	        "lines on stderr. SIGTERM or SIGINT stop the server and "
	        "leave the restart\n"
	        "record for the next one. SIGHUP reloads the config file "
	        "and applies the\n"
	        "keys marked (reload); the others wait for the next start.\n"
	        "\n"
	        "Config file keys:\n");
	for (size_t i = 0; i < mts_nkeys; i++) {
		const struct mts_key *k = &mts_keys[i];
		char head[64];
		snprintf(head, sizeof(head), "[%s%s] %s", k->section,
		         k->opts & MTS_KEY_GROUP ? " NAME" : "", k->key);
		mts_key_describe(k, &d, text, sizeof(text));
		if (k->opts & MTS_KEY_RELOAD)
			strncat(text, " (reload)",
			        sizeof(text) - strlen(text) - 1);
		usage_option(f, head, NULL, text);
	}
	mts_settings_free(&d);
}

/* getopt values: a flag of mts_keys is OPT_FLAG + the key's index. */
enum {
	OPT_CONFIG = 256,
	OPT_RESET,
	OPT_VERSION,
	OPT_FLAG = 512,
};

/* getopt's table: the keys' flags and their aliases, then the flags main
 * handles itself. Static storage, so no exit path (--help, a bad flag)
 * leaves it allocated. */
#define MAX_OPTIONS 64
static struct option options[MAX_OPTIONS];
static char option_flags[MAX_OPTIONS][48]; /* "--" and the name */

static void build_options(void)
{
	size_t n = 0;
	for (size_t i = 0; i < mts_nkeys; i++) {
		const struct mts_key *k = &mts_keys[i];
		for (int a = 0; k->flag && a < 2; a++) {
			const char *name = a ? k->alias : k->flag + 2;
			if (!name)
				continue;
			if (n + 5 > MAX_OPTIONS) {
				fprintf(stderr, "memtallyd: too many flags for "
				                "MAX_OPTIONS\n");
				exit(1);
			}
			snprintf(option_flags[n], sizeof(option_flags[n]),
			         "--%s", name);
			options[n++] = (struct option){name, required_argument,
			                               NULL, OPT_FLAG + (int)i};
		}
	}
	options[n++] =
	    (struct option){"config", required_argument, NULL, OPT_CONFIG};
	options[n++] = (struct option){"reset", no_argument, NULL, OPT_RESET};
	options[n++] = (struct option){"help", no_argument, NULL, 'h'};
	options[n++] =
	    (struct option){"version", no_argument, NULL, OPT_VERSION};
	options[n] = (struct option){NULL, 0, NULL, 0};
}

/* The command line: --config, --reset, and the overrides. */
struct cmdline {
	const char *config;
	bool reset;
	struct mts_override *ov;
	size_t nov;
};

static void parse_args(int argc, char **argv, struct cmdline *cl)
{
	memset(cl, 0, sizeof(*cl));
	cl->ov = calloc((size_t)argc + 1, sizeof(*cl->ov));
	if (!cl->ov) {
		fprintf(stderr, "memtallyd: out of memory\n");
		exit(1);
	}
	build_options();
	opterr = 0; /* our own one-line messages */
	for (;;) {
		int li = -1;
		int opt = getopt_long(argc, argv, ":h", options, &li);
		if (opt == -1)
			break;
		switch (opt) {
		case OPT_CONFIG:
			cl->config = optarg;
			continue;
		case OPT_RESET:
			cl->reset = true;
			continue;
		case 'h':
			usage(stdout);
			exit(0);
		case OPT_VERSION:
			printf("memtallyd %s\n", MTS_VERSION);
			exit(0);
		case ':':
			fprintf(stderr, "memtallyd: %s: missing value\n",
			        argv[optind - 1]);
			exit(EXIT_USAGE);
		case '?':
			fprintf(stderr,
			        "memtallyd: unknown option '%s' (see --help)\n",
			        argv[optind - 1]);
			exit(EXIT_USAGE);
		default:
			break;
		}
		if (opt >= OPT_FLAG && (size_t)(opt - OPT_FLAG) < mts_nkeys) {
			const struct mts_key *k = &mts_keys[opt - OPT_FLAG];
			/* Messages name the flag as given (an alias too). */
			cl->ov[cl->nov++] = (struct mts_override){
			    .flag = li >= 0 ? option_flags[li] : k->flag,
			    .section = k->section,
			    .key = k->key,
			    .value = optarg,
			};
		}
	}
	if (optind < argc) {
		fprintf(stderr, "memtallyd: unexpected argument '%s'\n",
		        argv[optind]);
		exit(EXIT_USAGE);
	}
}

struct signals {
	uv_signal_t term;
	uv_signal_t intr;
	uv_signal_t hup;
	struct mts_server *srv;
	const struct cmdline *cl;
	const struct mts_settings *boot; /* what the server started with */
	struct mts_settings *last;       /* what the last reload applied */
};

static void on_signal(uv_signal_t *h, int signum)
{
	struct signals *s = h->data;
	sd_notify(0, "STOPPING=1");
	mts_log(MTS_LOG_INFO, "shutting down", "signal=%s",
	        signum == SIGTERM ? "SIGTERM" : "SIGINT");
	mts_server_stop(s->srv);
	uv_close((uv_handle_t *)&s->term, NULL);
	uv_close((uv_handle_t *)&s->intr, NULL);
	uv_close((uv_handle_t *)&s->hup, NULL);
}

/* Keys read only at start: say which changed and were not applied. */
static void report_restart_keys(const struct mts_settings *was,
                                const struct mts_settings *now)
{
	const struct mts_key *changed[64];
	size_t n = mts_settings_diff(was, now, false, changed, 64);
	for (size_t i = 0; i < n && i < 64; i++)
		mts_log(MTS_LOG_WARN,
		        "config key changed; it takes effect at the next "
		        "start, not on reload",
		        "section=%s key=%s", changed[i]->section,
		        changed[i]->key);
}

/* How many of on_ok, on_high, on_over are set. */
static int hook_count(const struct mts_hook_conf *h)
{
	return !!h->cmd[0] + !!h->cmd[1] + !!h->cmd[2];
}

static void on_hup(uv_signal_t *h, int signum)
{
	struct signals *s = h->data;
	struct mts_registry *reg = &s->srv->reg;
	/* The whole error, quoted: a rejected reload's reason is the one
	 * line an operator gets (at start it goes to stderr whole). A
	 * field's usual MTS_LOGQ_MAX cut the guard's figures off. */
	char err[768], q[800];
	if (!s->cl->config) {
		mts_log(MTS_LOG_INFO,
		        "SIGHUP: no --config file, nothing to "
		        "reload",
		        NULL);
		return;
	}
	sd_notifyf(0, "RELOADING=1\nMONOTONIC_USEC=%llu",
	           (unsigned long long)(mts_now_monotonic() / 1000u));
	struct mts_settings next;
	int r = mts_settings_load(&next, s->cl->config, s->cl->ov, s->cl->nov,
	                          err, sizeof(err));
	if (r < 0) {
		s->srv->reload_stats.rejected++;
		mts_log(MTS_LOG_ERROR,
		        "config reload rejected; the running "
		        "config is kept",
		        "error=%s", mts_logq(q, sizeof(q), err));
		sd_notify(0, "READY=1");
		return;
	}
	report_restart_keys(s->boot, &next);
	struct mts_node_src src;
	struct mts_node_fig fig;
	if (mts_guard_setup(&next.policy, s->srv->cfg.max_buffered, &src, &fig,
	                    err, sizeof(err)) < 0) {
		s->srv->reload_stats.rejected++;
		mts_log(MTS_LOG_ERROR,
		        "config reload rejected; the running "
		        "config is kept",
		        "error=%s", mts_logq(q, sizeof(q), err));
		mts_settings_free(&next);
		sd_notify(0, "READY=1");
		return;
	}
	/* The only steps that can fail (out of memory) come first, the
	 * policy's all-or-nothing: a reload is applied whole or not at all,
	 * as its log line says. */
	struct mts_hook_conf hooks;
	r = mts_hook_conf_copy(&hooks, &next.hooks) < 0 ? -ENOMEM : 0;
	if (r == 0) {
		r = mts_server_apply_policy(s->srv, &next.policy);
		if (r < 0)
			mts_hook_conf_free(&hooks);
	}
	if (r == 0) {
		mts_server_apply_guard(s->srv, &src, &fig);
		mts_server_apply_hooks(s->srv, &hooks);
	}
	if (r < 0) {
		s->srv->reload_stats.rejected++;
		mts_log(MTS_LOG_ERROR,
		        "config reload failed; the running "
		        "config is kept",
		        "error=%s", strerror(-r));
	} else {
		s->srv->reload_stats.applied++;
		mts_log_set_level((enum mts_log_level)next.log_level);
		mts_log_set_budget(next.log_budget);
		/* What changed since the last reload (or the start). */
		const struct mts_key *changed[64];
		char list[512] = "", q2[MTS_LOGQ_MAX];
		size_t n = mts_settings_diff(s->last, &next, true, changed, 64);
		for (size_t i = 0, o = 0; i < n && i < 64 && o < sizeof(list);
		     i++)
			o += (size_t)snprintf(
			    list + o, sizeof(list) - o, "%s%s.%s", i ? "," : "",
			    changed[i]->section, changed[i]->key);
		mts_log(MTS_LOG_INFO, "config reloaded",
		        "path=%s changed=%s groups=%u hooks=%d",
		        mts_logq(q, sizeof(q), s->cl->config),
		        mts_logq(q2, sizeof(q2), list), reg->policy.ngroups,
		        hook_count(&next.hooks));
		mts_settings_free(s->last);
		*s->last = next;
		next = (struct mts_settings){0};
	}
	mts_settings_free(&next);
	sd_notify(0, "READY=1");
}

/*
 * Make room for one pidfd per slot, one socket per connection and
 * MTS_NOFILE_MARGIN more (server.h): raise the soft RLIMIT_NOFILE to that,
 * never past the hard limit (raising that needs privileges a unit may not
 * grant; systemd's LimitNOFILE= sets both). Logs what it did, and a
 * warning when the hard limit is too low.
 */
static void raise_nofile(const struct mts_config *cfg)
{
	rlim_t need = (rlim_t)cfg->slots + cfg->max_conns + MTS_NOFILE_MARGIN;
	struct rlimit rl;
	if (getrlimit(RLIMIT_NOFILE, &rl) < 0) {
		mts_log(MTS_LOG_WARN, "cannot read the open-files limit",
		        "err=%s", strerror(errno));
		return;
	}
	rlim_t was = rl.rlim_cur;
	if (rl.rlim_cur != RLIM_INFINITY && rl.rlim_cur < need) {
		rlim_t want = need;
		if (rl.rlim_max != RLIM_INFINITY && rl.rlim_max < want)
			want = rl.rlim_max;
		if (want > rl.rlim_cur) {
			struct rlimit next = {.rlim_cur = want,
			                      .rlim_max = rl.rlim_max};
			if (setrlimit(RLIMIT_NOFILE, &next) == 0)
				rl.rlim_cur = want;
		}
	}
	unsigned long long soft = rl.rlim_cur == RLIM_INFINITY
	                              ? ULLONG_MAX
	                              : (unsigned long long)rl.rlim_cur;
	unsigned long long hard = rl.rlim_max == RLIM_INFINITY
	                              ? ULLONG_MAX
	                              : (unsigned long long)rl.rlim_max;
	if (rl.rlim_cur != RLIM_INFINITY && rl.rlim_cur < need) {
		mts_log(
		    MTS_LOG_WARN,
		    "open-files limit too low for slots + max_connections; "
		    "workers or connections past it will be refused. Raise "
		    "the hard limit (LimitNOFILE= in the unit, ulimit -Hn) "
		    "or lower slots / max_connections",
		    "nofile_soft=%llu nofile_hard=%llu needed=%llu slots=%u "
		    "max_connections=%u margin=%u",
		    soft, hard, (unsigned long long)need, cfg->slots,
		    cfg->max_conns, MTS_NOFILE_MARGIN);
		return;
	}
	mts_log(rl.rlim_cur != was ? MTS_LOG_INFO : MTS_LOG_DEBUG,
	        rl.rlim_cur != was ? "open-files limit raised"
	                           : "open-files limit is enough",
	        "nofile_soft=%llu nofile_was=%llu nofile_hard=%llu "
	        "needed=%llu",
	        soft,
	        was == RLIM_INFINITY ? ULLONG_MAX : (unsigned long long)was,
	        hard, (unsigned long long)need);
}

/*
 * On a node out of memory the kernel's OOM killer must never choose the
 * server: every worker's accounting and every scheduler's admission go
 * with it. So it lowers its own oom_score_adj at start to [server]
 * oom_score_adj (never raising it: a unit's OOMScoreAdjust= or an operator
 * may have set it lower already). Lowering it needs CAP_SYS_RESOURCE; an
 * unprivileged server logs that it could not and serves anyway.
 */
static void lower_oom_score(const struct mts_config *cfg)
{
	if (cfg->oom_score_keep)
		return;
	FILE *f = fopen("/proc/self/oom_score_adj", "r+");
	int was = 0;
	if (!f || fscanf(f, "%d", &was) != 1) {
		mts_log(MTS_LOG_INFO, "cannot read oom_score_adj", "err=%s",
		        strerror(errno ? errno : EIO));
		if (f)
			fclose(f);
		return;
	}
	if (was <= cfg->oom_score_adj) {
		fclose(f);
		mts_log(MTS_LOG_DEBUG, "oom_score_adj already low enough",
		        "oom_score_adj=%d wanted=%d", was, cfg->oom_score_adj);
		return;
	}
	rewind(f);
	errno = 0;
	int ok = fprintf(f, "%d\n", cfg->oom_score_adj) > 0;
	ok = fclose(f) == 0 && ok;
	if (!ok)
		mts_log(MTS_LOG_INFO,
		        "cannot lower oom_score_adj (needs CAP_SYS_RESOURCE); "
		        "the unit's OOMScoreAdjust= can",
		        "oom_score_adj=%d wanted=%d err=%s", was,
		        cfg->oom_score_adj, strerror(errno ? errno : EIO));
	else
		mts_log(MTS_LOG_INFO, "oom_score_adj lowered",
		        "oom_score_adj=%d was=%d", cfg->oom_score_adj, was);
}

int main(int argc, char **argv)
{
	struct cmdline cl;
	struct mts_settings settings;
	char q1[MTS_LOGQ_MAX], q2[MTS_LOGQ_MAX], q3[MTS_LOGQ_MAX];
	char msg[768];
	parse_args(argc, argv, &cl);
	if (mts_settings_load(&settings, cl.config, cl.ov, cl.nov, msg,
	                      sizeof(msg)) < 0 ||
	    mts_settings_resolve(&settings, msg, sizeof(msg)) < 0) {
		fprintf(stderr, "memtallyd: %s\n", msg);
		free(cl.ov);
		return EXIT_USAGE;
	}
	settings.cfg.reset = cl.reset;
	mts_log_set_level((enum mts_log_level)settings.log_level);
	mts_log_set_budget(settings.log_budget);
	const struct mts_config cfg = settings.cfg;
	/* A peer that hangs up mid-write must not kill the server. */
	signal(SIGPIPE, SIG_IGN);

	const struct mts_policy *pol = &settings.policy;
	mts_log(MTS_LOG_INFO, "memtallyd starting",
	        "version=%s pid=%d config=%s", MTS_VERSION, (int)getpid(),
	        mts_logq(q3, sizeof(q3), cl.config ? cl.config : ""));
	mts_settings_log(&settings);
	/* What a reload is compared with: the same load again. */
	struct mts_settings last;
	if (mts_settings_load(&last, cl.config, cl.ov, cl.nov, msg,
	                      sizeof(msg)) < 0) {
		fprintf(stderr, "memtallyd: %s\n", msg);
		mts_settings_free(&settings);
		free(cl.ov);
		return EXIT_USAGE;
	}
	raise_nofile(&cfg);
	lower_oom_score(&cfg);
	/* The guard's line against the node it guards: a line the node
	 * cannot have is a configuration error, as a bad value is. */
	struct mts_node_src guard_src;
	struct mts_node_fig guard_fig;
	if (mts_guard_setup(pol, cfg.max_buffered, &guard_src, &guard_fig, msg,
	                    sizeof(msg)) < 0) {
		fprintf(stderr, "memtallyd: %s\n", msg);
		mts_settings_free(&settings);
		free(cl.ov);
		return EXIT_USAGE;
	}

	/* Where the socket and the restart record go must not let anyone
	 * else swap what is there (mts_dir_check): a configuration error. */
	const char *dirs_of[2] = {
	    cfg.socket_path,
	    cfg.state_path && cfg.state_path[0] ? cfg.state_path : NULL};
	for (int i = 0; i < 2; i++) {
		if (dirs_of[i] &&
		    mts_dir_check(dirs_of[i], msg, sizeof(msg)) < 0) {
			fprintf(stderr, "memtallyd: unsafe %s location: %s\n",
			        i == 0 ? "socket" : "state file", msg);
			mts_settings_free(&settings);
			mts_settings_free(&last);
			free(cl.ov);
			return EXIT_USAGE;
		}
	}
	int err = mts_socket_prepare(cfg.socket_path);
	if (err < 0) {
		const char *why =
		    err == -EADDRINUSE ? "another server is listening on the "
		                         "socket"
		    : err == -EEXIST   ? "socket path exists and is not a "
		                         "socket"
		                       : strerror(-err);
		mts_log(MTS_LOG_ERROR, "cannot use socket", "path=%s err=%s",
		        mts_logq(q1, sizeof(q1), cfg.socket_path),
		        mts_logq(q2, sizeof(q2), why));
		mts_settings_free(&settings);
		mts_settings_free(&last);
		free(cl.ov);
		return 1;
	}

	uv_loop_t loop;
	err = uv_loop_init(&loop);
	if (err < 0) {
		mts_log(MTS_LOG_ERROR, "cannot start the event loop", "err=%s",
		        uv_err_name(err));
		mts_settings_free(&settings);
		mts_settings_free(&last);
		free(cl.ov);
		return 1;
	}
	/* The socket appears inside mts_server_init(), before the signal
	 * watchers below exist: a SIGHUP or SIGTERM sent as soon as it is
	 * there (a reload right after start) would meet the default action
	 * and kill the server. Held back until the watchers take them. */
	sigset_t held, old_mask;
	sigemptyset(&held);
	sigaddset(&held, SIGTERM);
	sigaddset(&held, SIGINT);
	sigaddset(&held, SIGHUP);
	pthread_sigmask(SIG_BLOCK, &held, &old_mask);
	struct mts_server srv;
	err = mts_server_init(&srv, &loop, &cfg);
	if (err < 0) {
		pthread_sigmask(SIG_SETMASK, &old_mask, NULL);
		uv_run(&loop, UV_RUN_DEFAULT); /* finish closing handles */
		mts_server_free(&srv);
		uv_loop_close(&loop);
		mts_settings_free(&settings);
		mts_settings_free(&last);
		free(cl.ov);
		return 1;
	}

	mts_server_apply_guard(&srv, &guard_src, &guard_fig);
	struct signals sig = {
	    .srv = &srv, .cl = &cl, .boot = &settings, .last = &last};
	uv_signal_init(&loop, &sig.term);
	uv_signal_init(&loop, &sig.intr);
	uv_signal_init(&loop, &sig.hup);
	sig.term.data = sig.intr.data = sig.hup.data = &sig;
	uv_signal_start(&sig.term, on_signal, SIGTERM);
	uv_signal_start(&sig.intr, on_signal, SIGINT);
	uv_signal_start(&sig.hup, on_hup, SIGHUP);
	pthread_sigmask(SIG_SETMASK, &old_mask, NULL);

	mts_log(MTS_LOG_INFO, "listening", "socket=%s segment=%s",
	        mts_logq(q1, sizeof(q1), cfg.socket_path),
	        mts_logq(q2, sizeof(q2), cfg.segment));
	/* Listener and segment are up: a systemd unit may start its
	 * dependents now. */
	sd_notifyf(0, "READY=1\nSTATUS=serving %s\nMAINPID=%d", cfg.socket_path,
	           (int)getpid());
	uv_run(&loop, UV_RUN_DEFAULT);

	uint64_t registrations = srv.reg.stats.registrations;
	uint64_t exits = srv.reg.stats.reclaims;
	mts_server_free(&srv);
	err = uv_loop_close(&loop);
	if (err < 0)
		mts_log(MTS_LOG_ERROR, "handles left open at exit", "err=%s",
		        uv_err_name(err));
	/* What the budgets held back in the last second, before the end. */
	mts_log_flush(true);
	mts_log(MTS_LOG_INFO, "stopped", "registrations=%llu exits=%llu",
	        (unsigned long long)registrations, (unsigned long long)exits);
	mts_settings_free(&settings);
	mts_settings_free(&last);
	free(cl.ov);
	return err < 0 ? 1 : 0;
}
