/*
 * config.c - memtallyd's settings: defaults, then the INI file, then the
 * command-line flags, in that order, so a flag always wins.
 *
 * Every key is one row of one table (mts_keys, below): section, name,
 * type, field, bounds, default, flag, whether a reload applies it, one
 * line of help. Parsing (values.c, one parser per type), the defaults,
 * --help, the start-up log and the reload diff all read the table, so a
 * key is added as a row (and its entry in docs/memtallyd.8). A key whose
 * value no type describes has parse and show functions (MTS_KEY_FN).
 *
 * The file is parsed by inih. Every section and key is known here and
 * anything else is an error: a typo ("fleet_limt") must not silently leave
 * a fleet without its limit. A bad value produces one line naming the
 * file, line, section and key (or the flag), e.g.
 *
 *   memtallyd.conf:12: [limits] fleet: expected a size like 64GiB, 1.5G,
 *   or none; got '12 apples'
 *
 * Checks that involve two keys (hysteresis below the watermark, default
 * TTL within the maximum, ...) run once everything is read and name the
 * key that has to change.
 *
 * Loading is all-or-nothing: the result is built in a scratch struct and
 * copied out only when every value is good, so a SIGHUP with a bad file
 * keeps the old settings entirely (main.c logs the message).
 *
 * Two traps of inih are closed before it sees the text: a line longer than
 * its buffer (200 bytes) would be cut silently, so such a line is refused;
 * and an indented line would be taken as the continuation of the previous
 * value, so leading blanks are removed from every line first.
 */
#include "mts_config.h"

#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <ini.h>
#include <limits.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include "mtcommon.h"
#include "mts_defs.h"
#include "mts_hooks.h"
#include "mts_log.h"
#include "mts_policy.h"
#include "mts_rate.h"
#include "mtshm.h"

/* inih's line buffer (INI_MAX_LINE) less the newline and NUL. */
#define LINE_MAX_CHARS 198
/* inih's section buffer (INI_MAX_SECTION, 50) less the NUL: a longer
 * [section] name is cut there without a word, so a [group NAME] of a long
 * name would configure another group than its workers name. */
#define SECTION_MAX_CHARS 49
/* A config file is small; refuse something that is clearly not one. */
#define FILE_MAX_BYTES (1u << 20)
#define TOKEN_MIN      16u
#define TOKEN_MAX      MTS_TOKEN_MAX
#define DAY_MS         UINT64_C(86400000)

/* "limit - 256MiB" (blanks optional): bytes below the node's limit. */
static int parse_below_limit(const char *v, uint64_t *out)
{
	if (strncasecmp(v, "limit", 5) != 0)
		return -EINVAL;
	v += 5;
	v += strspn(v, " \t");
	if (*v != '-')
		return -EINVAL;
	v++;
	v += strspn(v, " \t");
	return mt_parse_size(v, out) < 0 || *out == 0 ? -EINVAL : 0;
}

/* ---- what no type says -------------------------------------------------- */

/* A key's own message, after "[section] key: ". Returns -EINVAL. */
static int bad(char *why, size_t n, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

static int bad(char *why, size_t n, const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(why, n, fmt, ap);
	va_end(ap);
	return -EINVAL;
}

/* The label of the shared objects (memfd names, as seen in
 * /proc/PID/maps); the leading '/' of older configs is accepted. */
static bool label_ok(const char *v)
{
	const char *name = v[0] == '/' ? v + 1 : v;
	return name[0] && !strchr(name, '/') && strlen(name) <= 64;
}

static bool abs_path_ok(const char *v)
{
	return v[0] == '/' && strlen(v) < PATH_MAX;
}

/* HOST:PORT as written, not resolved: a name is looked up where it is
 * used, at start, not on the loop at every reload. */
static bool hostport_syntax_ok(const char *v)
{
	char host[256];
	uint16_t port;
	return mt_split_hostport(v, host, sizeof(host), &port) == 0 && host[0];
}

/* [server] state: an absolute path, or empty for no restart record (NULL
 * would be the default, SOCKET.state). */
static bool state_ok(const char *v)
{
	return !v[0] || abs_path_ok(v);
}

/* [trust] trusted_uids: names or numbers separated by commas or blanks;
 * the list replaces the one before. */
static int parse_trusted(void *base, const char *v, char *why, size_t n)
{
	struct mts_policy *p = &((struct mts_settings *)base)->policy;
	char buf[LINE_MAX_CHARS + 1];
	snprintf(buf, sizeof(buf), "%s", v);
	p->ntrusted = 0;
	for (char *save = NULL, *t = strtok_r(buf, ", \t", &save); t;
	     t = strtok_r(NULL, ", \t", &save)) {
		uint32_t uid;
		if (mts_lookup_uid(t, &uid) < 0)
			return bad(why, n, "no such user '%s'", t);
		if (p->ntrusted == MTS_TRUSTED_UIDS_MAX)
			return bad(why, n, "at most %u users",
			           MTS_TRUSTED_UIDS_MAX);
		p->trusted_uids[p->ntrusted++] = uid;
	}
	return 0;
}

static void show_trusted(const void *base, char *buf, size_t n)
{
	const struct mts_policy *p =
	    &((const struct mts_settings *)base)->policy;
	size_t o = (size_t)snprintf(buf, n, "%s", p->ntrusted ? "" : "none");
	for (uint32_t i = 0; i < p->ntrusted && o < n; i++)
		o += (size_t)snprintf(buf + o, n - o, "%s%u", i ? "," : "",
		                      p->trusted_uids[i]);
}

/* [guard] cgroup: auto (NULL: memtallyd's own), none ("": /proc/meminfo)
 * or a cgroup directory. */
static int parse_cgroup(void *base, const char *v, char *why, size_t n)
{
	struct mts_policy *p = &((struct mts_settings *)base)->policy;
	if (strcasecmp(v, "auto") == 0 || !v[0]) {
		free(p->guard_cgroup);
		p->guard_cgroup = NULL;
		return 0;
	}
	if (strcasecmp(v, "none") != 0 && !abs_path_ok(v))
		return bad(why, n,
		           "expected auto, none or the absolute path of a "
		           "cgroup directory, got '%s'",
		           v);
	return mts_str_set(&p->guard_cgroup,
	                   strcasecmp(v, "none") == 0 ? "" : v);
}

static void show_cgroup(const void *base, char *buf, size_t n)
{
	const char *c =
	    ((const struct mts_settings *)base)->policy.guard_cgroup;
	snprintf(buf, n, "%s", !c ? "auto" : !c[0] ? "none" : c);
}

/* [guard] line: 90% (of the node's limit), limit - 256MiB, or 60GiB. */
static int parse_line(void *base, const char *v, char *why, size_t n)
{
	struct mts_policy *p = &((struct mts_settings *)base)->policy;
	size_t len = strlen(v);
	uint32_t bp = 0;
	uint64_t below = 0, bytes = 0;
	if (len && v[len - 1] == '%') {
		if (mts_parse_percent(v, &bp) < 0 || bp >= MTS_BP_ONE)
			bp = 0;
	} else if (parse_below_limit(v, &below) < 0) {
		below = 0;
		if (mt_parse_size(v, &bytes) < 0)
			bytes = 0;
	}
	if (!bp && !below && !bytes)
		return bad(why, n,
		           "expected a percentage of the node's limit below "
		           "100%% like 90%%, bytes below it like limit - "
		           "256MiB, or a size like 60GiB; got '%s'",
		           v);
	p->guard_line_bp = bp;
	p->guard_line_below = below;
	p->guard_line_bytes = bytes;
	return 0;
}

static void show_line(const void *base, char *buf, size_t n)
{
	const struct mts_policy *p =
	    &((const struct mts_settings *)base)->policy;
	char b[32];
	if (p->guard_line_bp)
		mts_fmt_pct(p->guard_line_bp, buf, n);
	else if (!p->guard_line_below)
		mts_fmt_size(p->guard_line_bytes, buf, n);
	else {
		mts_fmt_size(p->guard_line_below, b, sizeof(b));
		snprintf(buf, n, "limit - %s", b);
	}
}

/* ---- the table ---------------------------------------------------------- */

#define OWNED_SOCKET  0
#define OWNED_LABEL   1
#define OWNED_TCP     2
#define OWNED_METRICS 3
#define OWNED_STATE   4

/* A field of struct mts_settings, of its policy or config, of a group. */
#define S(f)                                                                   \
	.off = offsetof(struct mts_settings, f),                               \
	.width = sizeof(((struct mts_settings *)0)->f)
#define P(f)  S(policy.f)
#define C(f)  S(cfg.f)
#define S2(f) .off2 = offsetof(struct mts_settings, f)
#define GRP(f)                                                                 \
	.off = offsetof(struct mts_group_policy, f),                           \
	.width = sizeof(((struct mts_group_policy *)0)->f)

#define COUNT    MTS_KEY_COUNT
#define SIZE     MTS_KEY_SIZE
#define SIZE_PCT MTS_KEY_SIZE_PCT
#define PERCENT  MTS_KEY_PERCENT
#define DURATION MTS_KEY_DURATION
#define BOOL     MTS_KEY_BOOL
#define ENUM     MTS_KEY_ENUM
#define STRING   MTS_KEY_STRING
#define R        MTS_KEY_RELOAD
#define NONE     MTS_KEY_NONE
#define EMPTY    MTS_KEY_EMPTY
#define GROUP    (MTS_KEY_GROUP | MTS_KEY_RELOAD)

static const char *const log_levels[] = {"debug", "info", "warn|warning",
                                         "error", NULL};
static const char *const measures[] = {"accounted", "rss", "max", NULL};
static const char *const shows[] = {"counts", "none", "all", NULL};
static const char *const guard_modes[] = {"auto", "true|yes|on|1",
                                          "false|no|off|0", NULL};

const struct mts_key mts_keys[] = {
    /* [server] */
    {"server", "socket", STRING, 0, S(owned[OWNED_SOCKET]),
     .sdef = MTS_DEFAULT_SOCKET, .lo = 1,
     .hi = sizeof(((struct sockaddr_un *)0)->sun_path) - 1,
     .expect = "a path of 1 to 107 bytes", .flag = "--socket", .arg = "PATH",
     .help = "Unix socket to listen on; its directory is created if missing"},
    {"server", "label", STRING, 0, S(owned[OWNED_LABEL]),
     .sdef = MTS_DEFAULT_SEGMENT, .ok = label_ok, .alias = "segment",
     .expect = "a name like memtally (1 to 64 bytes, no '/' but a "
               "leading one, which is dropped)",
     .flag = "--label", .arg = "NAME",
     .help = "label of the shared objects, as /proc/PID/maps shows them"},
    {"server", "state", STRING, 0, S(owned[OWNED_STATE]), .ok = state_ok,
     .expect = "an absolute path, or empty for no restart record",
     .flag = "--state", .arg = "PATH", .dflt = "SOCKET.state",
     .help = "restart record: what a restarted server needs to keep workers"},
    {"server", "slots", COUNT, 0, C(slots), .lo = 1, .hi = MTSHM_MAX_SLOTS,
     .def = MTS_DEFAULT_SLOTS, .flag = "--slots", .help = "worker slots"},
    {"server", "lanes", COUNT, 0, C(lanes), .lo = 1, .hi = MTSHM_MAX_LANES,
     .def = MTSHM_DEFAULT_LANES, .flag = "--lanes",
     .help = "per-thread lanes per slot"},
    {"server", "tick", COUNT, 0, C(tick_ms), .lo = 1, .hi = MTS_TICK_MAX_MS,
     .def = MTS_DEFAULT_TICK_MS, .expect = "milliseconds", .flag = "--tick",
     .arg = "MS", .help = "aggregation period"},
    {"server", "threshold", SIZE, 0, C(threshold), .lo = 1, .hi = 1u << 30,
     .def = MTS_DEFAULT_THRESHOLD, .flag = "--threshold",
     .expect = "a size from 1 byte to 1GiB, e.g. 64KiB",
     .help = "worker flush threshold"},
    {"server", "log_level", ENUM, R, S(log_level), .names = log_levels,
     .def = MTS_LOG_INFO, .flag = "--log-level", .arg = "LEVEL",
     .help = "the least level logged"},
    {"server", "log_budget", COUNT, R | NONE, S(log_budget), .lo = 1,
     .hi = 100000, .def = MTS_LOG_PEER_BURST, .expect = "lines a second",
     .flag = "--log-budget",
     .help = "what each uid may cause to be logged at each level"},
    {"server", "tcp", STRING, EMPTY | NONE, S(owned[OWNED_TCP]),
     .ok = mts_hostport_ok, .flag = "--tcp", .arg = "HOST:PORT",
     .expect = "HOST:PORT (IPv4, [IPv6], localhost or a name)",
     .help = "also listen on TCP (loopback unless tcp_allow_remote)"},
    {"server", "tcp_allow_remote", BOOL, 0, S(tcp_allow_remote),
     .help = "tcp may listen on an address that is not loopback"},
    {"server", "tcp_token", STRING, R | EMPTY | MTS_KEY_SECRET, P(tcp_token),
     .help = "the token: admin rights, and the way in for unknown TCP peers"},
    {"server", "tcp_token_file", STRING, R | EMPTY, S(tcp_token_file),
     .help = "a file of mode 0600 or 0640 whose first line is the token"},
    {"server", "root_admin", BOOL, R, P(root_admin), .def = 1,
     .help = "root has admin rights (false: only admin_uid, admin_gid "
             "or the token)"},
    {"server", "admin_uid", MTS_KEY_UID, R, P(admin_uid),
     S2(policy.has_admin_uid), .help = "a uid with admin rights"},
    {"server", "admin_gid", MTS_KEY_GID, R, P(admin_gid),
     S2(policy.has_admin_gid), .help = "a gid whose members have admin rights"},
    {"server", "metrics", STRING, EMPTY | NONE, S(owned[OWNED_METRICS]),
     .ok = hostport_syntax_ok,
     .expect = "HOST:PORT (IPv4, [IPv6], localhost or a name), or none",
     .flag = "--metrics", .arg = "HOST:PORT",
     .help = "serve Prometheus /metrics on this address"},
    {"server", "group", MTS_KEY_GID, 0, C(gid), S2(cfg.has_gid),
     .dflt = "the server's", .help = "group that owns the socket, mode 0660"},
    {"server", "show_others", ENUM, R, P(show_others), .names = shows,
     .help = "what a user who is not an admin sees of others' processes"},
    {"server", "max_connections", COUNT, 0, C(max_conns), .lo = 1,
     .hi = MTS_MAX_CONNS_MAX, .def = MTS_DEFAULT_MAX_CONNS,
     .flag = "--max-connections",
     .help = "connections open at once; more are accepted and closed"},
    {"server", "max_connections_per_uid", COUNT, 0, C(max_conns_per_uid),
     .lo = 1, .hi = MTS_MAX_CONNS_MAX, .dflt = "max_connections/8",
     .help = "connections one peer uid may have open"},
    {"server", "max_connections_unidentified", COUNT, 0,
     C(max_conns_unidentified), .lo = 1, .hi = MTS_MAX_CONNS_MAX,
     .def = MTS_DEFAULT_MAX_CONNS_UNIDENTIFIED,
     .help = "connections of all TCP peers of unknown uid together"},
    {"server", "max_watch_per_uid", COUNT, R | NONE, P(watch_per_uid), .lo = 1,
     .hi = MTS_MAX_CONNS_MAX, .def = MTS_DEFAULT_WATCH_PER_UID,
     .help = "Watch subscriptions one uid may hold open"},
    {"server", "idle_timeout", DURATION, MTS_KEY_ZERO, C(idle_timeout_ms),
     .lo = 100, .hi = MTS_IDLE_MAX_MS, .def = MTS_DEFAULT_IDLE_MS,
     .expect = "a duration from 100ms to 24h (60, 60s, 500ms, 5m), or 0 "
               "for none",
     .help = "a connection without a request this long is closed"},
    {"server", "oom_score_adj", MTS_KEY_INT, NONE, C(oom_score_adj),
     S2(cfg.oom_score_keep), .lo = (uint64_t)INT64_C(-1000), .hi = 1000,
     .def = MTS_DEFAULT_OOM_SCORE_ADJ,
     .help = "the server's own OOM score adjustment, only ever lowered"},
    {"server", "max_buffered", SIZE, 0, C(max_buffered),
     .lo = MTS_MAX_BUFFERED_MIN, .def = MTS_DEFAULT_MAX_BUFFERED,
     .expect = "a size of at least 1MiB, e.g. 64MiB", .flag = "--max-buffered",
     .help = "cap on the bytes held for all connections together"},
    /* [limits] */
    {"limits", "fleet", SIZE, R | NONE, P(fleet_limit),
     .expect = "a size like 64GiB, 1.5G, or none", .flag = "--fleet-limit",
     .help = "the fleet limit"},
    {"limits", "high_watermark", PERCENT, R, P(high_bp), .lo = 1,
     .hi = MTS_BP_ONE, .def = MTS_DEFAULT_HIGH_BP, .flag = "--high-watermark",
     .arg = "PCT", .help = "a state turns high at this share of its limit"},
    {"limits", "hysteresis", PERCENT, R, P(hyst_bp), .hi = MTS_BP_ONE / 2,
     .def = MTS_DEFAULT_HYST_BP,
     .help = "how far below a mark a state goes before it leaves it"},
    {"limits", "process", SIZE, R | NONE, P(process_limit),
     .expect = "a size like 2GiB, or none",
     .help = "the default per-process limit"},
    {"limits", "measure", ENUM, R, P(measure), .names = measures,
     .help = "what limits compare"},
    {"limits", "rss_interval", COUNT, R, P(rss_interval_ms), .lo = 10,
     .hi = 3600000, .def = MTS_DEFAULT_RSS_MS, .expect = "milliseconds",
     .help = "how often every worker's RSS is read"},
    {"limits", "growth_window", DURATION, R, P(growth_window_ms),
     .lo = MTS_GROWTH_WINDOW_MIN_MS, .hi = MTS_GROWTH_WINDOW_MAX_MS,
     .def = MTS_DEFAULT_GROWTH_WINDOW_MS,
     .expect = "a duration from 1s to 1h, e.g. 10s",
     .help = "the window growth rates are fitted over"},
    {"limits", "forecast_horizon", DURATION, R | NONE, P(forecast_horizon_ms),
     .hi = MTS_FORECAST_HORIZON_MAX_MS,
     .expect = "a duration up to 24h, e.g. 30s, or off",
     .help = "high as soon as the limit is forecast within this"},
    {"limits", "max_slots_per_uid", COUNT, R | NONE, P(slots_per_uid), .lo = 1,
     .hi = MTSHM_MAX_SLOTS, .none = MTS_CAP_NONE, .dflt = "slots/8",
     .help = "slots one uid may hold"},
    {"limits", "max_groups_per_uid", COUNT, R | NONE, P(groups_per_uid),
     .lo = 1, .hi = MTSHM_MAX_SLOTS, .def = MTS_DEFAULT_GROUPS_PER_UID,
     .help = "group names one uid may bring into existence"},
    /* [group NAME] */
    {"group", "limit", SIZE, GROUP | NONE, GRP(limit),
     .expect = "a size like 8GiB, or none", .help = "the group's limit"},
    {"group", "high_watermark", PERCENT, GROUP, GRP(high_bp), .lo = 1,
     .hi = MTS_BP_ONE, .dflt = "the fleet's",
     .help = "the group's own watermark"},
    {"group", "uids", MTS_KEY_UIDS, GROUP, GRP(uids),
     .off2 = offsetof(struct mts_group_policy, nuids), .dflt = "anyone",
     .help = "who may join: user names or uids"},
    {"group", "gids", MTS_KEY_GIDS, GROUP, GRP(gids),
     .off2 = offsetof(struct mts_group_policy, ngids), .dflt = "anyone",
     .help = "who may join: group names or gids"},
    /* [admission] */
    {"admission", "default_ttl", COUNT, R, P(default_ttl_s), .lo = 1,
     .hi = 365u * 86400u, .def = MTS_DEFAULT_TTL_S, .expect = "seconds",
     .help = "TTL of a reservation when Admit gives none"},
    {"admission", "max_ttl", COUNT, R, P(max_ttl_s), .lo = 1,
     .hi = 365u * 86400u, .def = MTS_DEFAULT_MAX_TTL_S, .expect = "seconds",
     .help = "the longest TTL granted"},
    {"admission", "queue", DURATION, R | NONE, P(admit_queue_ms),
     S2(policy.admit_queue), .hi = DAY_MS, .def = 10000,
     .expect = "off or a duration up to 1d, e.g. 10s",
     .help = "a request denied for room that waited this long keeps it"},
    {"admission", "max_reservations_per_uid", COUNT, R | NONE,
     P(max_resv_per_uid), .lo = 1, .hi = MTS_RESV_MAX,
     .def = MTS_DEFAULT_MAX_RESV_PER_UID,
     .help = "outstanding reservations one uid may hold"},
    {"admission", "max_reserved_bytes_per_uid", SIZE_PCT, R | NONE,
     P(resv_bytes_per_uid), S2(policy.resv_bytes_bp),
     .def = MTS_DEFAULT_RESV_BYTES_BP,
     .expect = "a size like 8GiB, a percentage of the fleet limit like 50%, "
               "or none",
     .help = "outstanding reserved bytes one uid may hold"},
    /* [kinds] */
    {"kinds", "quantile", PERCENT, R, P(kind_quantile_bp), .lo = 1,
     .hi = MTS_BP_ONE, .def = MTS_DEFAULT_KIND_QUANTILE_BP,
     .help = "the quantile of recent runs' peaks a learned size takes"},
    {"kinds", "margin", PERCENT, R, P(kind_margin_bp), .hi = MTS_BP_ONE,
     .def = MTS_DEFAULT_KIND_MARGIN_BP, .help = "added to that quantile"},
    {"kinds", "window", COUNT, R, P(kind_window), .lo = 1, .hi = MTS_KIND_RUNS,
     .def = MTS_KIND_RUNS, .expect = "runs",
     .help = "the recent runs a learned size looks at"},
    {"kinds", "horizon", DURATION, R | MTS_KEY_SECS, P(kind_horizon_s), .lo = 1,
     .hi = 366u * 86400u, .def = MTS_DEFAULT_KIND_HORIZON_S,
     .expect = "a duration from 1s to 366d, e.g. 7d",
     .help = "runs older than this are forgotten"},
    {"kinds", "default_size", SIZE_PCT, R, P(kind_default_size),
     S2(policy.kind_default_bp), .def = MTS_DEFAULT_KIND_SIZE_BP,
     .expect = "a size like 1GiB or a percentage of the fleet limit like "
               "12.5%",
     .help = "what a kind with no history gets"},
    {"kinds", "reserve_learned", BOOL, R, P(kind_reserve_learned), .def = 1,
     .help = "once a size is learned a declaration is only a ceiling"},
    {"kinds", "follow_profile", BOOL, R, P(kind_follow_profile), .def = 1,
     .help = "a learned reservation follows the kind's profile"},
    {"kinds", "pool_gap", PERCENT, R, P(kind_pool_gap_bp), .hi = MTS_BP_ONE,
     .help = "of the pooled gap between reservations and use, kept"},
    {"kinds", "host_gap", PERCENT, R, P(kind_host_gap_bp), .hi = MTS_BP_ONE,
     .def = MTS_BP_ONE,
     .help = "the same for tasks run inside a shared host process"},
    {"kinds", "max_kinds_per_uid", COUNT, R | NONE, P(kinds_per_uid), .lo = 1,
     .hi = MTS_KINDS_MAX_MAX, .def = MTS_DEFAULT_KINDS_PER_UID,
     .help = "kinds one uid may bring into existence"},
    {"kinds", "max_kinds", COUNT, R, P(kinds_max), .lo = 1,
     .hi = MTS_KINDS_MAX_MAX, .def = MTS_DEFAULT_KINDS_MAX,
     .help = "kinds the server keeps"},
    /* [enforce] */
    {"enforce", "signal", MTS_KEY_SIGNAL, R | NONE, P(enforce_signal),
     .expect = "a signal such as SIGTERM, TERM or 15, or nothing for off",
     .help = "what the largest process over its limit gets, fleet over"},
    {"enforce", "grace", COUNT, R, P(grace_ms), .hi = DAY_MS,
     .def = MTS_DEFAULT_GRACE_MS, .expect = "milliseconds",
     .help = "how long the fleet is over before a signal, and between two"},
    /* [hooks] */
    {"hooks", "on_ok", STRING, R | EMPTY | NONE, S(hooks.cmd[0]),
     .help = "shell command run when the fleet or a group becomes ok"},
    {"hooks", "on_high", STRING, R | EMPTY | NONE, S(hooks.cmd[1]),
     .help = "shell command run when the fleet or a group becomes high"},
    {"hooks", "on_over", STRING, R | EMPTY | NONE, S(hooks.cmd[2]),
     .help = "shell command run when the fleet or a group becomes over"},
    {"hooks", "timeout", DURATION, R, S(hooks.timeout_ms),
     .lo = MTS_HOOK_TIMEOUT_MIN_MS, .hi = MTS_HOOK_TIMEOUT_MAX_MS,
     .def = MTS_HOOK_DEFAULT_TIMEOUT_MS,
     .expect = "a duration from 100ms to 1h, e.g. 30s",
     .help = "a hook still running this long is killed"},
    {"hooks", "node", STRING, R, S(hooks.node), .ok = mts_no_controls, .lo = 1,
     .hi = 255, .expect = "a name of 1 to 255 bytes without control characters",
     .dflt = "the host name", .help = "MEMTALLY_NODE in a hook's environment"},
    {"hooks", "min_interval", DURATION, R, S(hooks.min_interval_ms),
     .hi = MTS_HOOK_TIMEOUT_MAX_MS, .def = MTS_HOOK_DEFAULT_MIN_INTERVAL_MS,
     .expect = "a duration up to 1h, e.g. 1s, or 0",
     .help = "a scope's hooks start at least this far apart"},
    {"hooks", "retry", DURATION, R, S(hooks.retry_ms),
     .hi = MTS_HOOK_TIMEOUT_MAX_MS, .def = MTS_HOOK_DEFAULT_RETRY_MS,
     .expect = "a duration up to 1h, e.g. 10s, or 0 for never",
     .help = "a failed hook runs again this long after, while its state "
             "holds (doubling, to 5 min)"},
    /* [trust] */
    {"trust", "trusted_uids", MTS_KEY_FN, R, .parse = parse_trusted,
     .show = show_trusted,
     .help = "users whose claims count in full toward everyone"},
    {"trust", "untouched_allowance", SIZE, R, P(untouched_allowance),
     .def = MTS_DEFAULT_UNTOUCHED_ALLOWANCE,
     .expect = "a size like 256MiB, or 0",
     .help = "how far an untrusted uid's claims may run ahead of the kernel"},
    {"trust", "untouched_allowance_total", SIZE, R, P(untouched_total),
     .def = MTS_DEFAULT_UNTOUCHED_TOTAL, .expect = "a size like 256MiB, or 0",
     .help = "all untrusted uids' allowances together"},
    {"trust", "untouched_time", DURATION, R, P(untouched_ms),
     .hi = MTS_UNTOUCHED_MAX_MS, .def = MTS_DEFAULT_UNTOUCHED_MS,
     .expect = "a duration up to 1h, e.g. 10s",
     .help = "an excess lasting this long spends the allowance"},
    /* [guard] */
    {"guard", "enabled", ENUM, R, P(guard_mode), .names = guard_modes,
     .help = "the node guard; auto: where the node has a limit"},
    {"guard", "cgroup", MTS_KEY_FN, R, .parse = parse_cgroup,
     .show = show_cgroup, .help = "where the node's figure comes from"},
    {"guard", "line", MTS_KEY_FN, R, P(guard_line_bp),
     .def = MTS_DEFAULT_GUARD_LINE_BP, .parse = parse_line, .show = show_line,
     .help = "the node's line: of its limit, below it, or bytes"},
    {"guard", "interval", DURATION, R, P(guard_interval_ms),
     .lo = MTS_GUARD_INTERVAL_MIN_MS, .hi = MTS_GUARD_INTERVAL_MAX_MS,
     .def = MTS_DEFAULT_GUARD_INTERVAL_MS,
     .expect = "a duration from 100ms to 1h, e.g. 2s",
     .help = "at most one eviction per this"},
    {"guard", "evict_trusted", BOOL, R, P(guard_evict_trusted),
     .help = "trusted processes without a task may be evicted"},
    {"guard", "pause", BOOL, R, P(guard_pause), .def = 1,
     .help = "stop a growing task while the node has room, before evicting"},
    /* [metrics] */
    {"metrics", "per_process", BOOL, R, P(metrics_per_process),
     .help = "per-process series on /metrics"},
    {"metrics", "max_groups", COUNT, R, P(metrics_max_groups), .lo = 1,
     .hi = 65536, .def = MTS_DEFAULT_METRICS_GROUPS,
     .help = "group series on /metrics; the others are summed"},
    {"metrics", "per_kind", BOOL, R, P(metrics_per_kind),
     .help = "per-kind series on /metrics"},
    {"metrics", "token_file", STRING, R | EMPTY, S(metrics_token_file),
     .help = "a file of mode 0600 or 0640 whose first line is the token "
             "a scrape must send (Authorization: Bearer)"}};
const size_t mts_nkeys = sizeof(mts_keys) / sizeof(mts_keys[0]);

/* ---- one engine for every key ------------------------------------------- */

/* Every key's default, from the table. 0 or -ENOMEM. */
static int apply_defaults(struct mts_settings *s)
{
	memset(s, 0, sizeof(*s));
	for (size_t i = 0; i < mts_nkeys; i++)
		if (!(mts_keys[i].opts & MTS_KEY_GROUP) &&
		    mts_key_default(&mts_keys[i], s) < 0)
			return -ENOMEM;
	return 0;
}

void mts_policy_defaults(struct mts_policy *p)
{
	struct mts_settings s;
	/* The policy's keys hold no default string, so nothing to fail. */
	apply_defaults(&s);
	*p = s.policy;
	s.policy = (struct mts_policy){0};
	mts_settings_free(&s);
}

static const struct mts_key *find_key(const char *section, const char *key,
                                      bool *known_section)
{
	for (size_t i = 0; i < mts_nkeys; i++) {
		const struct mts_key *k = &mts_keys[i];
		if (strcmp(section, k->section) != 0)
			continue;
		*known_section = true;
		if (strcmp(key, k->key) == 0 ||
		    (k->alias && strcmp(key, k->alias) == 0))
			return k;
	}
	return NULL;
}

bool mts_config_key_known(const char *section, const char *key)
{
	bool known = false;
	return strcmp(section, "group") != 0 && find_key(section, key, &known);
}

void mts_key_describe(const struct mts_key *k, const struct mts_settings *d,
                      char *buf, size_t n)
{
	char e[160], v[160];
	mts_key_expect(k, e, sizeof(e));
	if (k->dflt || k->opts & MTS_KEY_GROUP)
		snprintf(v, sizeof(v), "%s", k->dflt ? k->dflt : "none");
	else
		mts_key_show(k, d, false, v, sizeof(v));
	snprintf(buf, n, "%s%s%s (default %s)", k->help, e[0] ? ": " : "", e,
	         v);
}

/* One logfmt value: bare when it can be, else quoted. */
static void log_value(char *out, size_t n, const char *v)
{
	if (v[0] && !v[strcspn(v, " \t\"=\\")])
		snprintf(out, n, "%s", v);
	else
		mts_logq(out, n, v);
}

/* One "config" line per section (and per [group NAME]), split where a
 * line would pass the log's limit. */
static void log_section(const char *section, const void *base, bool group)
{
	char line[800], q[MTS_LOGQ_MAX], v[MTS_LOGQ_MAX];
	size_t o = 0;
	for (size_t i = 0; i < mts_nkeys; i++) {
		const struct mts_key *k = &mts_keys[i];
		if (!!(k->opts & MTS_KEY_GROUP) != group ||
		    (!group && strcmp(k->section, section) != 0))
			continue;
		mts_key_show(k, base, false, v, sizeof(v));
		/* Unset, a key whose default is derived (SOCKET.state,
		 * max_connections/8) reads as its rule, not as a raw 0 or
		 * none the key itself would refuse. */
		if (k->dflt &&
		    (strcmp(v, "0") == 0 ||
		     (strcmp(v, "none") == 0 && !(k->opts & MTS_KEY_NONE))))
			snprintf(v, sizeof(v), "default (%s)", k->dflt);
		log_value(q, sizeof(q), v);
		if (o && o + strlen(k->key) + strlen(q) + 2 >= sizeof(line)) {
			mts_log(MTS_LOG_INFO, "config", "section=%s%s",
			        mts_logq(v, sizeof(v), section), line);
			o = 0;
		}
		o += (size_t)snprintf(line + o, sizeof(line) - o, " %s=%s",
		                      k->key, q);
	}
	if (o)
		mts_log(MTS_LOG_INFO, "config", "section=%s%s",
		        mts_logq(v, sizeof(v), section), line);
}

void mts_settings_log(const struct mts_settings *s)
{
	for (size_t i = 0; i < mts_nkeys; i++)
		if (!(mts_keys[i].opts & MTS_KEY_GROUP) &&
		    (i == 0 ||
		     strcmp(mts_keys[i].section, mts_keys[i - 1].section) != 0))
			log_section(mts_keys[i].section, s, false);
	for (uint32_t g = 0; g < s->policy.ngroups; g++) {
		char sec[MTS_NAME_MAX + 8];
		snprintf(sec, sizeof(sec), "group %s",
		         s->policy.groups[g].name);
		log_section(sec, &s->policy.groups[g], true);
	}
}

size_t mts_settings_diff(const struct mts_settings *a,
                         const struct mts_settings *b, bool reload,
                         const struct mts_key **keys, size_t max)
{
	size_t n = 0;
	for (size_t i = 0; i < mts_nkeys; i++) {
		const struct mts_key *k = &mts_keys[i];
		char va[512], vb[512];
		if (k->opts & MTS_KEY_GROUP ||
		    !(k->opts & MTS_KEY_RELOAD) != !reload)
			continue;
		mts_key_show(k, a, true, va, sizeof(va));
		mts_key_show(k, b, true, vb, sizeof(vb));
		if (strcmp(va, vb) != 0 && n++ < max)
			keys[n - 1] = k;
	}
	return n;
}

/* ---- loading ------------------------------------------------------------ */

/* The state of one load. */
struct load {
	struct mts_settings s;
	/* The config file's path and mode (an inline tcp_token needs a file
	 * nobody else can read); path NULL: no file. */
	const char *path;
	mode_t mode;
	/* The first error: "[section] key: message". */
	char msg[512];
	/* The file's (section, key) pairs so far, "section\nkey": a key given
	 * twice is an error, not the last one silently winning. */
	char **seen;
	size_t nseen, capseen;
};

static int fail(struct load *l, const char *section, const char *key,
                const char *fmt, ...) __attribute__((format(printf, 4, 5)));

static int fail(struct load *l, const char *section, const char *key,
                const char *fmt, ...)
{
	if (l->msg[0])
		return -EINVAL; /* keep the first */
	int n = snprintf(l->msg, sizeof(l->msg), "[%s] %s: ", section, key);
	if (n < 0 || (size_t)n >= sizeof(l->msg))
		return -EINVAL;
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(l->msg + n, sizeof(l->msg) - (size_t)n, fmt, ap);
	va_end(ap);
	return -EINVAL;
}

/* One key = value, from the file or a flag. 0, -EINVAL or -ENOMEM. */
static int apply_key(struct load *l, const char *section, const char *key,
                     const char *value)
{
	bool known_section = false, group = false;
	void *base = &l->s;
	const struct mts_key *k = find_key(section, key, &known_section);
	if (strncmp(section, "group", 5) == 0 &&
	    (section[5] == ' ' || section[5] == '\t' || section[5] == '\0')) {
		const char *name = section + 5 + strspn(section + 5, " \t");
		if (!name[0] || !mt_name_ok(name))
			return fail(
			    l, section, key,
			    "a group name must be 1 to %u bytes without "
			    "control characters",
			    MTS_NAME_MAX);
		k = find_key("group", key, &group);
		if (!k)
			return fail(l, section, key, "unknown key");
		/* "default" is where a worker refused a group goes: it must
		 * stay open to everyone. */
		if (strcmp(name, "default") == 0 &&
		    (k->type == MTS_KEY_UIDS || k->type == MTS_KEY_GIDS))
			return fail(l, section, key,
			            "the group default is open to every uid; "
			            "restrict another group");
		base = mts_policy_group_add(&l->s.policy, name);
		if (!base)
			return -ENOMEM;
	}
	if (!k && known_section)
		return fail(l, section, key, "unknown key");
	if (!k && !section[0])
		return fail(l, "", key, "a key before any [section]");
	if (!k)
		return fail(l, section, key, "unknown section");
	char why[400] = "";
	int err = mts_key_parse(k, base, value, why, sizeof(why));
	if (err == -EINVAL)
		return fail(l, section, key, "%s", why);
	return err;
}

/* `name` of [section] once more in the file: 0, -EINVAL (a second time:
 * a config tool's appended line would otherwise win without a word) or
 * -ENOMEM. */
static int note_key(struct load *l, const char *section, const char *name)
{
	/* A key by its own name (an alias is the same key: [server] label
	 * and segment), in any case; a section as written: group names are
	 * case-sensitive, [group GPU] is not [group gpu]. */
	bool known = false;
	bool grp = strncmp(section, "group", 5) == 0 &&
	           (section[5] == ' ' || section[5] == '\t');
	const struct mts_key *key =
	    find_key(grp ? "group" : section, name, &known);
	/* A group by its name, as apply_key takes it: [group  gpu] is
	 * [group gpu]. */
	const char *sec =
	    grp ? section + 5 + strspn(section + 5, " \t") : section;
	char *k;
	if (asprintf(&k, "%s%s\n%s", grp ? "group " : "", sec,
	             key ? key->key : name) < 0)
		return -ENOMEM;
	for (char *c = strchr(k, '\n'); *c; c++)
		*c = (char)tolower((unsigned char)*c);
	for (size_t i = 0; i < l->nseen; i++)
		if (strcmp(l->seen[i], k) == 0) {
			free(k);
			return fail(l, section, name,
			            "given twice in the file (each key once "
			            "per section)");
		}
	if (l->nseen == l->capseen) {
		size_t cap = l->capseen ? 2 * l->capseen : 32;
		char **a = realloc(l->seen, cap * sizeof(*a));
		if (!a) {
			free(k);
			return -ENOMEM;
		}
		l->seen = a;
		l->capseen = cap;
	}
	l->seen[l->nseen++] = k;
	return 0;
}

static int on_ini_key(void *user, const char *section, const char *name,
                      const char *value)
{
	struct load *l = user;
	if (!name)
		return 1; /* a bare [section] line, if inih reports those */
	if (l->msg[0])
		return 0; /* keep the first error only */
	int err = note_key(l, section, name);
	if (err == 0)
		err = apply_key(l, section, name, value);
	if (err == -ENOMEM && !l->msg[0])
		snprintf(l->msg, sizeof(l->msg), "out of memory");
	return err == 0;
}

/* A [section] line that inih would read as another section than it says:
 * a name longer than its buffer (-ENAMETOOLONG), or blanks at the name's
 * ends (-EBADMSG: "[group gpu ]" would be a group "gpu "). 0 otherwise,
 * and for any other line. */
static int section_check(const char *l, size_t n)
{
	if (n == 0 || l[0] != '[')
		return 0;
	const char *end = memchr(l, ']', n);
	if (!end)
		return 0; /* inih's syntax error, with its line */
	size_t len = (size_t)(end - l) - 1;
	if (len > SECTION_MAX_CHARS)
		return -ENAMETOOLONG;
	if (len &&
	    (l[1] == ' ' || l[1] == '\t' || end[-1] == ' ' || end[-1] == '\t'))
		return -EBADMSG;
	return 0;
}

/*
 * Read `path` and normalise it for inih: leading blanks removed from each
 * line (no continuation lines), lines longer than inih's buffer refused.
 * Returns 0 and a malloc'd text, or -errno / -EINVAL with *bad_line set.
 */
static int read_config(const char *path, char **text, int *bad_line,
                       mode_t *mode)
{
	/* O_NONBLOCK: a FIFO put in its place must not hold a start or a
	 * reload (the loop, the guard with it); only a regular file is
	 * read. */
	int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK);
	if (fd < 0)
		return -errno;
	struct stat st;
	if (fstat(fd, &st) < 0) {
		int e = errno;
		close(fd);
		return -e;
	}
	if (!S_ISREG(st.st_mode) || st.st_size > (off_t)FILE_MAX_BYTES) {
		close(fd);
		return -EFBIG;
	}
	*mode = st.st_mode;
	size_t cap = (size_t)st.st_size + 1;
	char *raw = malloc(cap);
	char *out = malloc(cap + 1);
	if (!raw || !out) {
		close(fd);
		free(raw);
		free(out);
		return -ENOMEM;
	}
	size_t len = 0;
	while (len + 1 < cap) {
		ssize_t n = read(fd, raw + len, cap - 1 - len);
		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0) {
			int e = errno;
			close(fd);
			free(raw);
			free(out);
			return -e;
		}
		if (n == 0)
			break;
		len += (size_t)n;
	}
	close(fd);

	size_t o = 0;
	int line = 1;
	for (size_t i = 0; i < len;) {
		/* Every blank: inih takes a line starting with one (\r, \f,
		 * \v too) as the previous key's continuation. */
		while (i < len &&
		       (raw[i] == ' ' || raw[i] == '\t' || raw[i] == '\r' ||
		        raw[i] == '\f' || raw[i] == '\v'))
			i++;
		size_t start = i;
		while (i < len && raw[i] != '\n')
			i++;
		if (i - start > LINE_MAX_CHARS ||
		    memchr(raw + start, 0, i - start)) {
			free(raw);
			free(out);
			*bad_line = line;
			return -EINVAL;
		}
		int bad = section_check(raw + start, i - start);
		if (bad) {
			free(raw);
			free(out);
			*bad_line = line;
			return bad;
		}
		memcpy(out + o, raw + start, i - start);
		o += i - start;
		if (i < len) {
			out[o++] = '\n';
			i++;
		}
		line++;
	}
	out[o] = '\0';
	free(raw);
	*text = out;
	return 0;
}

/* The token from a token file ([section] key = path) into *dst: first
 * line, trailing blanks cut. */
static int read_token_file(struct load *l, const char *section, const char *key,
                           const char *path, char **dst)
{
	/* O_NONBLOCK: a FIFO put in its place must not hold a start or a
	 * reload; only a regular file is read. */
	int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK);
	if (fd < 0)
		return fail(l, section, key, "cannot read '%s': %s", path,
		            strerror(errno));
	struct stat rs;
	if (fstat(fd, &rs) < 0 || !S_ISREG(rs.st_mode)) {
		close(fd);
		return fail(l, section, key, "'%s' is not a regular file",
		            path);
	}
	char buf[TOKEN_MAX + 2];
	ssize_t n;
	do
		n = read(fd, buf, sizeof(buf) - 1);
	while (n < 0 && errno == EINTR);
	int e = errno;
	struct stat st;
	bool statted = fstat(fd, &st) == 0;
	bool world = statted && (st.st_mode & 0004);
	/* Whoever can write it, or owns it, chooses the token at the next
	 * reload: it grants admin rights. */
	bool writable = !statted || (st.st_mode & 0022) ||
	                (st.st_uid != 0 && st.st_uid != geteuid());
	close(fd);
	if (n < 0)
		return fail(l, section, key, "cannot read '%s': %s", path,
		            strerror(e));
	buf[n] = '\0';
	char *nl = strchr(buf, '\n');
	if (nl)
		*nl = '\0';
	size_t len = strlen(buf);
	while (len > 0 && (buf[len - 1] == ' ' || buf[len - 1] == '\t' ||
	                   buf[len - 1] == '\r'))
		buf[--len] = '\0';
	if (world) {
		explicit_bzero(buf, sizeof(buf));
		return fail(l, section, key,
		            "'%s' is readable by everyone: use a token file of "
		            "mode 0600 or 0640 (chmod o-r it)",
		            path);
	}
	if (writable) {
		explicit_bzero(buf, sizeof(buf));
		return fail(l, section, key,
		            "'%s' may be written by others (group or other "
		            "write, or not owned by root or memtallyd's uid): "
		            "use a token file of mode 0600 or 0640 of root's",
		            path);
	}
	int err = mts_str_set(dst, buf);
	explicit_bzero(buf, sizeof(buf));
	return err;
}

/* A token's length and characters: it goes in a header or a request. */
static int check_token(struct load *l, const char *section, const char *key,
                       const char *tok)
{
	size_t n = strlen(tok);
	if (n < TOKEN_MIN || n > TOKEN_MAX)
		return fail(l, section, key,
		            "a token must be %u to %u characters (got %zu)",
		            TOKEN_MIN, TOKEN_MAX, n);
	for (size_t i = 0; i < n; i++) {
		unsigned char ch = (unsigned char)tok[i];
		if (ch <= 0x20 || ch == 0x7f)
			return fail(l, section, key,
			            "a token must not hold blanks or control "
			            "characters");
	}
	return 0;
}

/* Checks across keys, once everything is read. */
static int finish(struct load *l)
{
	struct mts_policy *p = &l->s.policy;
	struct mts_config *c = &l->s.cfg;
	char a[16], b[16];
	if (p->hyst_bp >= p->high_bp) {
		snprintf(a, sizeof(a), "%u.%02u", p->hyst_bp / 100,
		         p->hyst_bp % 100);
		snprintf(b, sizeof(b), "%u.%02u", p->high_bp / 100,
		         p->high_bp % 100);
		return fail(l, "limits", "hysteresis",
		            "must be below high_watermark (%s%% >= %s%%)", a,
		            b);
	}
	for (uint32_t i = 0; i < p->ngroups; i++) {
		const struct mts_group_policy *g = &p->groups[i];
		if (g->high_bp && p->hyst_bp >= g->high_bp) {
			char sec[MTS_NAME_MAX + 8];
			snprintf(sec, sizeof(sec), "group %s", g->name);
			return fail(l, sec, "high_watermark",
			            "must be above [limits] hysteresis");
		}
	}
	if (p->default_ttl_s > p->max_ttl_s)
		return fail(l, "admission", "default_ttl",
		            "%u s is above max_ttl (%u s)", p->default_ttl_s,
		            p->max_ttl_s);
	const char *token_file = l->s.tcp_token_file;
	c->no_idle_timeout = c->idle_timeout_ms == 0;
	if (p->tcp_token && token_file)
		return fail(l, "server", "tcp_token_file",
		            "set tcp_token or tcp_token_file, not both");
	/* The token gives admin rights: a config file every local user can
	 * read must not hold it. */
	if (p->tcp_token && l->path && (l->mode & 0044))
		return fail(
		    l, "server", "tcp_token",
		    "'%s' (mode %04o) is readable by group or others "
		    "and holds the token: move it to a tcp_token_file of "
		    "mode 0600 or 0640, or chmod 0600 the config",
		    l->path, (unsigned)(l->mode & 07777));
	if (token_file) {
		int err = read_token_file(l, "server", "tcp_token_file",
		                          token_file, &p->tcp_token);
		if (err < 0)
			return err;
	}
	if (p->tcp_token) {
		int err = check_token(
		    l, "server", token_file ? "tcp_token_file" : "tcp_token",
		    p->tcp_token);
		if (err < 0)
			return err;
	}
	if (l->s.metrics_token_file && l->s.metrics_token_file[0]) {
		int err =
		    read_token_file(l, "metrics", "token_file",
		                    l->s.metrics_token_file, &p->metrics_token);
		if (err == 0)
			err = check_token(l, "metrics", "token_file",
			                  p->metrics_token);
		if (err < 0)
			return err;
	}
	const char *tcp = l->s.owned[OWNED_TCP];
	if (tcp) {
		/* Not resolved here, on the loop at a reload: a name is looked
		 * up and checked where it is used, at start (mts_listen_tcp).
		 */
		struct sockaddr_storage ss;
		socklen_t len;
		bool lo = false;
		int r = mts_parse_hostport_literal(tcp, &ss, &len, &lo);
		if (r < 0)
			return fail(l, "server", "tcp", "bad address '%s'",
			            tcp);
		if (r == 0 && !lo && !l->s.tcp_allow_remote)
			return fail(l, "server", "tcp",
			            "'%s' is not a loopback address; set "
			            "tcp_allow_remote = true to listen on it",
			            tcp);
	}
	return 0;
}

int mts_settings_resolve(struct mts_settings *s, char *err, size_t errlen)
{
	const char *tcp = s->cfg.tcp_addr;
	if (!tcp)
		return 0;
	struct sockaddr_storage ss;
	socklen_t len;
	bool lo = false;
	if (mts_parse_hostport(tcp, &ss, &len, &lo) < 0) {
		snprintf(err, errlen, "[server] tcp: cannot resolve '%s'", tcp);
		mts_settings_free(s);
		return -EINVAL;
	}
	if (!lo && !s->tcp_allow_remote) {
		snprintf(
		    err, errlen,
		    "[server] tcp: '%s' resolves to an address that is not "
		    "loopback; set tcp_allow_remote = true to listen on it",
		    tcp);
		mts_settings_free(s);
		return -EINVAL;
	}
	return 0;
}

void mts_settings_free(struct mts_settings *s)
{
	if (!s)
		return;
	mts_policy_free(&s->policy);
	mts_hook_conf_free(&s->hooks);
	for (size_t i = 0; i < sizeof(s->owned) / sizeof(s->owned[0]); i++)
		free(s->owned[i]);
	free(s->config_path);
	free(s->tcp_token_file);
	free(s->metrics_token_file);
	memset(s, 0, sizeof(*s));
}

/* The file at `path` into l, with its message in err. */
static int load_file(struct load *l, const char *path, char *err, size_t errlen)
{
	char *text = NULL;
	int bad_line = 0;
	if (mts_str_set(&l->s.config_path, path) < 0)
		return -ENOMEM;
	l->path = path;
	int ret = read_config(path, &text, &bad_line, &l->mode);
	if (ret == -EINVAL) {
		snprintf(err, errlen,
		         "%s:%d: line longer than %u characters or holding a "
		         "NUL byte",
		         path, bad_line, LINE_MAX_CHARS);
		return ret;
	}
	if (ret == -ENAMETOOLONG || ret == -EBADMSG) {
		snprintf(err, errlen,
		         ret == -ENAMETOOLONG
		             ? "%s:%d: a [section] name of at most %u "
		               "characters (a longer group name: set it with "
		               "MEMTALLY_GROUP only)"
		             : "%s:%d: a [section] name with blanks at its "
		               "ends",
		         path, bad_line, SECTION_MAX_CHARS);
		return -EINVAL;
	}
	if (ret < 0) {
		snprintf(err, errlen, "%s: cannot read: %s", path,
		         ret == -EFBIG ? "not a regular file of at most 1 MiB"
		                       : strerror(-ret));
		return ret;
	}
	int line = ini_parse_string(text, on_ini_key, l);
	free(text);
	for (size_t i = 0; i < l->nseen; i++)
		free(l->seen[i]);
	free(l->seen);
	l->seen = NULL;
	l->nseen = l->capseen = 0;
	if (line == 0 && !l->msg[0])
		return 0;
	if (l->msg[0])
		snprintf(err, errlen, "%s:%d: %s", path, line, l->msg);
	else
		snprintf(err, errlen,
		         "%s:%d: syntax error (expected [section] or key = "
		         "value)",
		         path, line);
	return strcmp(l->msg, "out of memory") == 0 ? -ENOMEM : -EINVAL;
}

int mts_settings_load(struct mts_settings *out, const char *path,
                      const struct mts_override *ov, size_t nov, char *err,
                      size_t errlen)
{
	struct load l;
	memset(&l, 0, sizeof(l));
	int ret = apply_defaults(&l.s);
	if (ret == 0 && path)
		ret = load_file(&l, path, err, errlen);
	for (size_t i = 0; ret == 0 && i < nov; i++) {
		ret = apply_key(&l, ov[i].section, ov[i].key, ov[i].value);
		if (ret == -EINVAL) {
			/* Name the flag, not the key it stands for. */
			const char *colon = strstr(l.msg, ": ");
			snprintf(err, errlen, "%s: %s", ov[i].flag,
			         colon ? colon + 2 : l.msg);
		}
	}
	if (ret == 0) {
		ret = finish(&l);
		if (ret < 0)
			snprintf(err, errlen, "%s%s%s", path ? path : "",
			         path ? ": " : "",
			         l.msg[0] ? l.msg : "out of memory");
	}
	if (ret == -ENOMEM)
		snprintf(err, errlen, "out of memory");
	if (ret == 0) {
		l.s.cfg.socket_path = l.s.owned[OWNED_SOCKET];
		l.s.cfg.segment = l.s.owned[OWNED_LABEL];
		l.s.cfg.tcp_addr = l.s.owned[OWNED_TCP];
		l.s.cfg.tcp_allow_remote = l.s.tcp_allow_remote;
		l.s.cfg.metrics_addr = l.s.owned[OWNED_METRICS];
		l.s.cfg.state_path = l.s.owned[OWNED_STATE];
		*out = l.s;
		/* The caller keeps *out in place; policy and hooks point into
		 * it. */
		out->cfg.policy = &out->policy;
		out->cfg.hooks = &out->hooks;
		memset(&l.s, 0, sizeof(l.s));
	}
	mts_settings_free(&l.s);
	return ret;
}
