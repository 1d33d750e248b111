/*
 * config.c - memtallyd's settings: defaults, then the INI file, then the
 * command-line flags, in that order, so a flag always wins.
 *
 * The file is parsed by inih. Every section and key is known here and
 * anything else is an error: a typo ("fleet_limt") must not silently leave
 * a fleet without its limit. A value is checked where it is read and a bad
 * one produces one line naming the file, line, section and key (or the
 * flag), e.g.
 *
 *   memtallyd.conf:12: [limits] fleet: expected a size like 64GiB, or
 *   none; got '12 apples'
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

#include <arpa/inet.h>
#include <errno.h>
#include <stddef.h>
#include <fcntl.h>
#include <grp.h>
#include <ini.h>
#include <netdb.h>
#include <limits.h>
#include <netinet/in.h>
#include <pwd.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include "mts_defs.h"
#include "mts_hooks.h"
#include "mts_log.h"
#include "mts_policy.h"
#include "mts_rate.h"
#include "mts_registry.h"
#include "mtshm.h"

/* inih's line buffer (INI_MAX_LINE) less the newline and NUL. */
#define LINE_MAX_CHARS 198
/* A config file is small; refuse something that is clearly not one. */
#define FILE_MAX_BYTES (1u << 20)
/* Workers may hold up to threshold x threads unflushed (see main.c). */
#define THRESHOLD_MAX (UINT64_C(1) << 30)
#define TOKEN_MIN     16u
#define TOKEN_MAX     512u
#define RSS_MIN_MS    10u
#define RSS_MAX_MS    3600000u
#define GRACE_MAX_MS  86400000u
#define TTL_MAX_S     (365u * 86400u)
/* A uid may hold at most MTS_RESV_MAX reservations anyway. */
#define RESV_PER_UID_MAX MTS_RESV_MAX

/* ---- policy ------------------------------------------------------------ */

const char *mts_measure_name(enum mts_measure m)
{
	switch (m) {
	case MTS_MEASURE_RSS:
		return "rss";
	case MTS_MEASURE_MAX:
		return "max";
	default:
		return "accounted";
	}
}

void mts_policy_defaults(struct mts_policy *p)
{
	memset(p, 0, sizeof(*p));
	p->high_bp = MTS_DEFAULT_HIGH_BP;
	p->hyst_bp = MTS_DEFAULT_HYST_BP;
	p->measure = MTS_MEASURE_ACCOUNTED;
	p->rss_interval_ms = MTS_DEFAULT_RSS_MS;
	p->default_ttl_s = MTS_DEFAULT_TTL_S;
	p->max_ttl_s = MTS_DEFAULT_MAX_TTL_S;
	p->grace_ms = MTS_DEFAULT_GRACE_MS;
	p->max_resv_per_uid = MTS_DEFAULT_MAX_RESV_PER_UID;
	p->resv_bytes_bp = MTS_DEFAULT_RESV_BYTES_BP;
	p->watch_per_uid = MTS_DEFAULT_WATCH_PER_UID;
	p->groups_per_uid = MTS_DEFAULT_GROUPS_PER_UID;
	p->metrics_max_groups = MTS_DEFAULT_METRICS_GROUPS;
	p->growth_window_ms = MTS_DEFAULT_GROWTH_WINDOW_MS;
	p->forecast_horizon_ms = 0; /* off: only the watermark makes `high` */
	p->untouched_allowance = MTS_DEFAULT_UNTOUCHED_ALLOWANCE;
	p->untouched_total = MTS_DEFAULT_UNTOUCHED_TOTAL;
	p->untouched_ms = MTS_DEFAULT_UNTOUCHED_MS;
	p->kind_quantile_bp = MTS_DEFAULT_KIND_QUANTILE_BP;
	p->kind_margin_bp = MTS_DEFAULT_KIND_MARGIN_BP;
	p->kind_window = MTS_KIND_RUNS;
	p->kind_horizon_s = MTS_DEFAULT_KIND_HORIZON_S;
	p->kind_default_bp = MTS_DEFAULT_KIND_SIZE_BP;
	p->kind_reserve_learned = true;
	p->kind_follow_profile = true;
	p->kind_pool_gap_bp = 0;
	p->admit_queue = true;
	p->admit_queue_ms = 10000;
	p->kinds_per_uid = MTS_DEFAULT_KINDS_PER_UID;
	p->kinds_max = MTS_DEFAULT_KINDS_MAX;
	p->guard_line_bp = MTS_DEFAULT_GUARD_LINE_BP;
	p->guard_interval_ms = MTS_DEFAULT_GUARD_INTERVAL_MS;
}

void mts_policy_free(struct mts_policy *p)
{
	if (!p)
		return;
	for (uint32_t i = 0; i < p->ngroups; i++) {
		free(p->groups[i].name);
		free(p->groups[i].uids);
		free(p->groups[i].gids);
	}
	free(p->groups);
	if (p->tcp_token) {
		/* Do not leave the secret in freed memory. */
		explicit_bzero(p->tcp_token, strlen(p->tcp_token));
		free(p->tcp_token);
	}
	free(p->guard_cgroup);
	memset(p, 0, sizeof(*p));
}

/* *dst = a copy of n ids at src (NULL when n is 0). 0 or -ENOMEM. */
static int u32_dup(uint32_t **dst, const uint32_t *src, uint32_t n)
{
	*dst = NULL;
	if (!n)
		return 0;
	*dst = malloc(n * sizeof(**dst));
	if (!*dst)
		return -ENOMEM;
	memcpy(*dst, src, n * sizeof(**dst));
	return 0;
}

int mts_policy_copy(struct mts_policy *dst, const struct mts_policy *src)
{
	struct mts_policy c = *src;
	c.groups = NULL;
	c.ngroups = 0;
	c.tcp_token = NULL;
	c.guard_cgroup = NULL;
	if (src->guard_cgroup) {
		c.guard_cgroup = strdup(src->guard_cgroup);
		if (!c.guard_cgroup)
			goto fail;
	}
	if (src->tcp_token) {
		c.tcp_token = strdup(src->tcp_token);
		if (!c.tcp_token)
			goto fail;
	}
	if (src->ngroups) {
		c.groups = calloc(src->ngroups, sizeof(*c.groups));
		if (!c.groups)
			goto fail;
		for (uint32_t i = 0; i < src->ngroups; i++) {
			const struct mts_group_policy *g = &src->groups[i];
			c.groups[i] = *g;
			c.groups[i].uids = NULL;
			c.groups[i].gids = NULL;
			c.ngroups = i + 1;
			c.groups[i].name = strdup(g->name);
			if (!c.groups[i].name ||
			    u32_dup(&c.groups[i].uids, g->uids, g->nuids) < 0 ||
			    u32_dup(&c.groups[i].gids, g->gids, g->ngids) < 0)
				goto fail;
		}
	}
	*dst = c;
	return 0;
fail:
	mts_policy_free(&c);
	return -ENOMEM;
}

const struct mts_group_policy *mts_policy_group(const struct mts_policy *p,
                                                const char *name)
{
	for (uint32_t i = 0; i < p->ngroups; i++)
		if (strcmp(p->groups[i].name, name) == 0)
			return &p->groups[i];
	return NULL;
}

/* ---- value parsers ----------------------------------------------------- */

int mts_parse_percent(const char *s, uint32_t *bp)
{
	/* Digits, optionally ".d" or ".dd", optionally "%": exact in bp. */
	uint64_t whole = 0, frac = 0;
	const char *p = s;
	if (*p < '0' || *p > '9')
		return -EINVAL;
	while (*p >= '0' && *p <= '9') {
		whole = whole * 10 + (uint64_t)(*p - '0');
		if (whole > 100)
			return -EINVAL;
		p++;
	}
	if (*p == '.') {
		p++;
		int digits = 0;
		while (*p >= '0' && *p <= '9') {
			if (++digits > 2)
				return -EINVAL;
			frac = frac * 10 + (uint64_t)(*p - '0');
			p++;
		}
		if (digits == 0)
			return -EINVAL;
		if (digits == 1)
			frac *= 10;
	}
	if (*p == '%')
		p++;
	if (*p)
		return -EINVAL;
	uint64_t v = whole * 100 + frac;
	if (v > MTS_BP_ONE)
		return -EINVAL;
	*bp = (uint32_t)v;
	return 0;
}

int mts_parse_signal(const char *s, int *sig)
{
	if (!s[0]) {
		*sig = 0;
		return 0;
	}
	if (s[0] >= '0' && s[0] <= '9') {
		char *end;
		errno = 0;
		long v = strtol(s, &end, 10);
		if (errno || *end || v < 1 || v >= NSIG)
			return -EINVAL;
		*sig = (int)v;
		return 0;
	}
	const char *name = strncasecmp(s, "SIG", 3) == 0 ? s + 3 : s;
	for (int i = 1; i < SIGRTMIN; i++) {
		const char *abbrev = sigabbrev_np(i);
		if (abbrev && strcasecmp(abbrev, name) == 0) {
			*sig = i;
			return 0;
		}
	}
	return -EINVAL;
}

static bool is_loopback(const struct sockaddr_storage *ss)
{
	if (ss->ss_family == AF_INET6) {
		const struct in6_addr *a =
		    &((const struct sockaddr_in6 *)ss)->sin6_addr;
		return IN6_IS_ADDR_LOOPBACK(a) ||
		       (IN6_IS_ADDR_V4MAPPED(a) && a->s6_addr[12] == 127);
	}
	const struct sockaddr_in *a = (const struct sockaddr_in *)ss;
	return (ntohl(a->sin_addr.s_addr) >> 24) == 127;
}

int mts_parse_hostport(const char *s, struct sockaddr_storage *ss,
                       socklen_t *len, bool *loopback)
{
	char host[256];
	uint16_t port;
	if (mt_split_hostport(s, host, sizeof(host), &port) < 0)
		return -EINVAL;
	memset(ss, 0, sizeof(*ss));
	struct sockaddr_in6 *a6 = (struct sockaddr_in6 *)ss;
	struct sockaddr_in *a4 = (struct sockaddr_in *)ss;
	if (s[0] == '[') {
		/* Brackets hold an IPv6 literal and nothing else. */
		if (inet_pton(AF_INET6, host, &a6->sin6_addr) != 1)
			return -EINVAL;
		a6->sin6_family = AF_INET6;
		a6->sin6_port = htons(port);
		*len = sizeof(*a6);
	} else if (inet_pton(AF_INET,
	                     strcasecmp(host, "localhost") == 0 ? "127.0.0.1"
	                                                        : host,
	                     &a4->sin_addr) == 1) {
		a4->sin_family = AF_INET;
		a4->sin_port = htons(port);
		*len = sizeof(*a4);
	} else if (host[strspn(host, "0123456789.")] == '\0') {
		/* "1.2.3" is a mistyped address, not a name (getaddrinfo
		 * would read it as 1.2.0.3). */
		return -EINVAL;
	} else {
		struct addrinfo hints = {.ai_socktype = SOCK_STREAM}, *res;
		if (getaddrinfo(host, NULL, &hints, &res) != 0)
			return -EINVAL;
		int err = -EINVAL;
		if ((res->ai_family == AF_INET || res->ai_family == AF_INET6) &&
		    res->ai_addrlen <= sizeof(*ss)) {
			memcpy(ss, res->ai_addr, res->ai_addrlen);
			*len = res->ai_addrlen;
			if (res->ai_family == AF_INET6)
				a6->sin6_port = htons(port);
			else
				a4->sin_port = htons(port);
			err = 0;
		}
		freeaddrinfo(res);
		if (err)
			return err;
	}
	*loopback = is_loopback(ss);
	return 0;
}

/* ---- loading ------------------------------------------------------------ */

/* The state of one load. */
struct load {
	struct mts_settings s;
	/* Values kept as text until the cross-key checks. */
	char *tcp_token;
	char *tcp_token_file;
	bool tcp_allow_remote;
	bool group_set;
	/* The config file's path and mode (an inline tcp_token needs a file
	 * nobody else can read); path NULL: no file. */
	const char *path;
	mode_t mode;
	/* The first error: "[section] key: message". */
	char msg[512];
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

/* Replace an owned string. */
static int set_str(char **slot, const char *v)
{
	char *d = strdup(v);
	if (!d)
		return -ENOMEM;
	free(*slot);
	*slot = d;
	return 0;
}

static int parse_uint(const char *v, uint64_t lo, uint64_t hi, uint64_t *out)
{
	if (*v < '0' || *v > '9')
		return -EINVAL;
	char *end;
	errno = 0;
	unsigned long long x = strtoull(v, &end, 10);
	if (errno || *end || x < lo || x > hi)
		return -EINVAL;
	*out = x;
	return 0;
}

static int parse_bool(const char *v, bool *out)
{
	static const char *const yes[] = {"true", "yes", "on", "1"};
	static const char *const no[] = {"false", "no", "off", "0"};
	for (size_t i = 0; i < 4; i++) {
		if (strcasecmp(v, yes[i]) == 0) {
			*out = true;
			return 0;
		}
		if (strcasecmp(v, no[i]) == 0) {
			*out = false;
			return 0;
		}
	}
	return -EINVAL;
}

/*
 * A duration: digits with an optional unit, ms, s (the default), m or h;
 * 0 means 0 (the caller decides what that is). Into milliseconds, at most
 * `max_ms`. 0 or -EINVAL.
 */
static int parse_duration_ms(const char *v, uint64_t max_ms, uint64_t *out)
{
	if (*v < '0' || *v > '9')
		return -EINVAL;
	char *end;
	errno = 0;
	unsigned long long x = strtoull(v, &end, 10);
	if (errno)
		return -EINVAL;
	while (*end == ' ')
		end++;
	uint64_t mult;
	if (strcmp(end, "ms") == 0)
		mult = 1;
	else if (!end[0] || strcmp(end, "s") == 0)
		mult = 1000;
	else if (strcmp(end, "m") == 0 || strcmp(end, "min") == 0)
		mult = 60000;
	else if (strcmp(end, "h") == 0)
		mult = 3600000;
	else if (strcmp(end, "d") == 0)
		mult = 86400000;
	else
		return -EINVAL;
	if (x > max_ms / mult)
		return -EINVAL;
	*out = x * mult;
	return 0;
}

/* A limit: a size, or 0 / none / off / unlimited for none. */
static int parse_limit(const char *v, uint64_t *out)
{
	if (strcasecmp(v, "none") == 0 || strcasecmp(v, "off") == 0 ||
	    strcasecmp(v, "unlimited") == 0) {
		*out = 0;
		return 0;
	}
	return mt_parse_size(v, out);
}

static int lookup_uid(const char *v, uint32_t *out)
{
	uint64_t n;
	if (parse_uint(v, 0, UINT32_MAX - 1, &n) == 0) {
		*out = (uint32_t)n;
		return 0;
	}
	char buf[4096];
	struct passwd pw, *res = NULL;
	if (getpwnam_r(v, &pw, buf, sizeof(buf), &res) != 0 || !res)
		return -EINVAL;
	*out = (uint32_t)res->pw_uid;
	return 0;
}

static int lookup_gid(const char *v, uint32_t *out)
{
	uint64_t n;
	if (parse_uint(v, 0, UINT32_MAX - 1, &n) == 0) {
		*out = (uint32_t)n;
		return 0;
	}
	char buf[16384];
	struct group gr, *res = NULL;
	if (getgrnam_r(v, &gr, buf, sizeof(buf), &res) != 0 || !res)
		return -EINVAL;
	*out = (uint32_t)res->gr_gid;
	return 0;
}

#define OWNED_SOCKET  0
#define OWNED_SEGMENT 1
#define OWNED_TCP     2
#define OWNED_METRICS 3
#define OWNED_STATE   4

/* A uint32_t key that is an integer in [lo, hi]; `what` names its unit in
 * the message ("an integer", "milliseconds"). */
static int set_u32(struct load *l, const char *sec, const char *key,
                   const char *v, uint32_t lo, uint32_t hi, const char *what,
                   uint32_t *dst)
{
	uint64_t n;
	if (parse_uint(v, lo, hi, &n) < 0)
		return fail(l, sec, key, "expected %s from %u to %u, got '%s'",
		            what, lo, hi, v);
	*dst = (uint32_t)n;
	return 0;
}

/* ---- one function per key ----------------------------------------- */

static int key_server_socket(struct load *l, const char *sec, const char *key,
                             const char *v)
{
	if (!v[0] || strlen(v) >= sizeof(((struct sockaddr_un *)0)->sun_path))
		return fail(l, sec, key,
		            "expected a path of 1 to 107 bytes, got '%s'", v);
	return set_str(&l->s.owned[OWNED_SOCKET], v);
}

static int key_server_segment(struct load *l, const char *sec, const char *key,
                              const char *v)
{
	/* The label of the shared objects (memfd names, as seen in
	 * /proc/PID/maps); the leading '/' of older configs is
	 * accepted and dropped. */
	const char *name = v[0] == '/' ? v + 1 : v;
	if (!name[0] || strchr(name, '/') || strlen(name) > 64)
		return fail(l, sec, key,
		            "expected a name like memtally (1 to 64 "
		            "bytes, no '/'), got '%s'",
		            v);
	return set_str(&l->s.owned[OWNED_SEGMENT], v);
}

static int key_server_state(struct load *l, const char *sec, const char *key,
                            const char *v)
{
	if (!v[0] || v[0] != '/' || strlen(v) >= PATH_MAX)
		return fail(l, sec, key, "expected an absolute path, got '%s'",
		            v);
	return set_str(&l->s.owned[OWNED_STATE], v);
}

static int key_server_threshold(struct load *l, const char *sec,
                                const char *key, const char *v)
{
	struct mts_config *c = &l->s.cfg;
	uint64_t n;
	if (mt_parse_size(v, &n) < 0 || n == 0 || n > THRESHOLD_MAX)
		return fail(l, sec, key,
		            "expected a size from 1 byte to 1GiB, e.g. "
		            "64KiB, got '%s'",
		            v);
	c->threshold = n;
	return 0;
}

static int key_server_idle_timeout(struct load *l, const char *sec,
                                   const char *key, const char *v)
{
	struct mts_config *c = &l->s.cfg;
	uint64_t n;
	if (parse_duration_ms(v, MTS_IDLE_MAX_MS, &n) < 0 || (n > 0 && n < 100))
		return fail(l, sec, key,
		            "expected a duration from 100ms to 24h "
		            "(60, 60s, 500ms, 5m), or 0 for none; got "
		            "'%s'",
		            v);
	c->idle_timeout_ms = (uint32_t)n;
	c->no_idle_timeout = n == 0;
	return 0;
}

/* [server] max_watch_per_uid: an integer or none. */
static int key_server_watch_per_uid(struct load *l, const char *sec,
                                    const char *key, const char *v)
{
	struct mts_policy *p = &l->s.policy;
	uint64_t n = 0;
	if (strcasecmp(v, "none") == 0 || strcasecmp(v, "off") == 0 ||
	    strcasecmp(v, "unlimited") == 0) {
		p->watch_per_uid = 0;
		return 0;
	}
	if (parse_uint(v, 1, MTS_MAX_CONNS_MAX, &n) < 0)
		return fail(l, sec, key,
		            "expected an integer from 1 to %u, or none; got "
		            "'%s'",
		            MTS_MAX_CONNS_MAX, v);
	p->watch_per_uid = (uint32_t)n;
	return 0;
}

/* counts, none or all: see enum mts_show. */
static int key_server_show_others(struct load *l, const char *sec,
                                  const char *key, const char *v)
{
	struct mts_policy *p = &l->s.policy;
	if (strcasecmp(v, "counts") == 0)
		p->show_others = MTS_SHOW_COUNTS;
	else if (strcasecmp(v, "none") == 0)
		p->show_others = MTS_SHOW_NONE;
	else if (strcasecmp(v, "all") == 0)
		p->show_others = MTS_SHOW_ALL;
	else
		return fail(l, sec, key,
		            "expected counts, none or all; got '%s'", v);
	return 0;
}

/* -1000..1000 as the kernel takes it, or `none`: leave it as inherited. */
static int key_server_oom_score_adj(struct load *l, const char *sec,
                                    const char *key, const char *v)
{
	struct mts_config *c = &l->s.cfg;
	if (!strcmp(v, "none")) {
		c->oom_score_keep = true;
		return 0;
	}
	char *end;
	errno = 0;
	long n = strtol(v, &end, 10);
	if (errno || end == v || *end || n < -1000 || n > 1000)
		return fail(l, sec, key,
		            "expected an integer from -1000 to 1000, or "
		            "none; got '%s'",
		            v);
	c->oom_score_adj = (int32_t)n;
	c->oom_score_keep = false;
	return 0;
}

static int key_server_max_buffered(struct load *l, const char *sec,
                                   const char *key, const char *v)
{
	struct mts_config *c = &l->s.cfg;
	uint64_t n;
	if (mt_parse_size(v, &n) < 0 || n < MTS_MAX_BUFFERED_MIN)
		return fail(l, sec, key,
		            "expected a size of at least 1MiB, e.g. "
		            "64MiB, got '%s'",
		            v);
	c->max_buffered = n;
	return 0;
}

static int key_server_log_level(struct load *l, const char *sec,
                                const char *key, const char *v)
{
	enum mts_log_level lv;
	if (mts_log_parse_level(v, &lv) < 0)
		return fail(l, sec, key,
		            "expected debug, info, warn or error, got "
		            "'%s'",
		            v);
	l->s.log_level = (int)lv;
	return 0;
}

/* [server] log_budget: an integer 1..100000, or none. */
static int key_server_log_budget(struct load *l, const char *sec,
                                 const char *key, const char *v)
{
	if (strcasecmp(v, "none") == 0) {
		l->s.log_budget = 0;
		return 0;
	}
	char *end;
	errno = 0;
	unsigned long n = strtoul(v, &end, 10);
	if (errno || end == v || *end || v[0] == '-' || n < 1 || n > 100000)
		return fail(l, sec, key,
		            "expected lines a second from 1 to 100000, or "
		            "none; got '%s'",
		            v);
	l->s.log_budget = (unsigned)n;
	return 0;
}

static int key_server_tcp(struct load *l, const char *sec, const char *key,
                          const char *v)
{
	if (!v[0] || strcasecmp(v, "none") == 0 || strcasecmp(v, "off") == 0) {
		free(l->s.owned[OWNED_TCP]);
		l->s.owned[OWNED_TCP] = NULL;
		return 0;
	}
	struct sockaddr_storage ss;
	socklen_t len;
	bool lo;
	if (mts_parse_hostport(v, &ss, &len, &lo) < 0)
		return fail(l, sec, key,
		            "expected HOST:PORT (IPv4, [IPv6], "
		            "localhost or a name), got '%s'",
		            v);
	return set_str(&l->s.owned[OWNED_TCP], v);
}

static int key_server_tcp_allow_remote(struct load *l, const char *sec,
                                       const char *key, const char *v)
{
	if (parse_bool(v, &l->tcp_allow_remote) < 0)
		return fail(l, sec, key, "expected true or false, got '%s'", v);
	return 0;
}

static int key_server_tcp_token(struct load *l, const char *sec,
                                const char *key, const char *v)
{
	if (!v[0]) {
		free(l->tcp_token);
		l->tcp_token = NULL;
		return 0;
	}
	return set_str(&l->tcp_token, v);
}

static int key_server_tcp_token_file(struct load *l, const char *sec,
                                     const char *key, const char *v)
{
	if (!v[0]) {
		free(l->tcp_token_file);
		l->tcp_token_file = NULL;
		return 0;
	}
	return set_str(&l->tcp_token_file, v);
}

static int key_server_admin_uid(struct load *l, const char *sec,
                                const char *key, const char *v)
{
	uint32_t uid;
	if (!v[0]) {
		l->s.policy.has_admin_uid = false;
		return 0;
	}
	if (lookup_uid(v, &uid) < 0)
		return fail(l, sec, key,
		            "expected a uid or a user name, got '%s'", v);
	l->s.policy.has_admin_uid = true;
	l->s.policy.admin_uid = uid;
	return 0;
}

static int key_server_admin_gid(struct load *l, const char *sec,
                                const char *key, const char *v)
{
	uint32_t gid;
	if (!v[0]) {
		l->s.policy.has_admin_gid = false;
		return 0;
	}
	if (lookup_gid(v, &gid) < 0)
		return fail(l, sec, key,
		            "expected a gid or a group name, got '%s'", v);
	l->s.policy.has_admin_gid = true;
	l->s.policy.admin_gid = gid;
	return 0;
}

static int key_server_metrics(struct load *l, const char *sec, const char *key,
                              const char *v)
{
	/* Stored only: metrics.c parses and serves it. */
	if (!v[0]) {
		free(l->s.owned[OWNED_METRICS]);
		l->s.owned[OWNED_METRICS] = NULL;
		return 0;
	}
	return set_str(&l->s.owned[OWNED_METRICS], v);
}

static int key_server_group(struct load *l, const char *sec, const char *key,
                            const char *v)
{
	struct mts_config *c = &l->s.cfg;
	uint32_t gid;
	if (!v[0]) {
		c->has_gid = false;
		return 0;
	}
	if (lookup_gid(v, &gid) < 0)
		return fail(l, sec, key,
		            "expected a group name or gid, got '%s'", v);
	c->has_gid = true;
	c->gid = gid;
	return 0;
}

static int key_limits_fleet(struct load *l, const char *sec, const char *key,
                            const char *v)
{
	struct mts_policy *p = &l->s.policy;
	if (parse_limit(v, &p->fleet_limit) < 0)
		return fail(l, sec, key,
		            "expected a size like 64GiB, 1.5G, or none; "
		            "got '%s'",
		            v);
	return 0;
}

static int key_limits_process(struct load *l, const char *sec, const char *key,
                              const char *v)
{
	struct mts_policy *p = &l->s.policy;
	if (parse_limit(v, &p->process_limit) < 0)
		return fail(l, sec, key,
		            "expected a size like 2GiB, or none; got '%s'", v);
	return 0;
}

static int key_limits_high_watermark(struct load *l, const char *sec,
                                     const char *key, const char *v)
{
	struct mts_policy *p = &l->s.policy;
	uint32_t bp;
	if (mts_parse_percent(v, &bp) < 0 || bp == 0)
		return fail(l, sec, key,
		            "expected a percentage above 0 and at most "
		            "100, e.g. 90, got '%s'",
		            v);
	p->high_bp = bp;
	return 0;
}

static int key_limits_hysteresis(struct load *l, const char *sec,
                                 const char *key, const char *v)
{
	struct mts_policy *p = &l->s.policy;
	uint32_t bp;
	if (mts_parse_percent(v, &bp) < 0 || bp > MTS_BP_ONE / 2)
		return fail(l, sec, key,
		            "expected a percentage from 0 to 50, e.g. 5, "
		            "got '%s'",
		            v);
	p->hyst_bp = bp;
	return 0;
}

static int key_limits_measure(struct load *l, const char *sec, const char *key,
                              const char *v)
{
	struct mts_policy *p = &l->s.policy;
	if (strcasecmp(v, "accounted") == 0)
		p->measure = MTS_MEASURE_ACCOUNTED;
	else if (strcasecmp(v, "rss") == 0)
		p->measure = MTS_MEASURE_RSS;
	else if (strcasecmp(v, "max") == 0)
		p->measure = MTS_MEASURE_MAX;
	else
		return fail(l, sec, key,
		            "expected accounted, rss or max, got '%s'", v);
	return 0;
}

static int key_limits_growth_window(struct load *l, const char *sec,
                                    const char *key, const char *v)
{
	struct mts_policy *p = &l->s.policy;
	uint64_t n;
	if (parse_duration_ms(v, MTS_GROWTH_WINDOW_MAX_MS, &n) < 0 ||
	    n < MTS_GROWTH_WINDOW_MIN_MS)
		return fail(l, sec, key,
		            "expected a duration from 1s to 1h, e.g. "
		            "10s, got '%s'",
		            v);
	p->growth_window_ms = (uint32_t)n;
	return 0;
}

static int key_limits_forecast_horizon(struct load *l, const char *sec,
                                       const char *key, const char *v)
{
	struct mts_policy *p = &l->s.policy;
	uint64_t n;
	if (strcasecmp(v, "off") == 0 || strcasecmp(v, "none") == 0)
		n = 0;
	else if (parse_duration_ms(v, MTS_FORECAST_HORIZON_MAX_MS, &n) < 0)
		return fail(l, sec, key,
		            "expected a duration up to 24h, e.g. 30s, "
		            "or off; got '%s'",
		            v);
	p->forecast_horizon_ms = (uint32_t)n;
	return 0;
}

static int key_enforce_signal(struct load *l, const char *sec, const char *key,
                              const char *v)
{
	struct mts_policy *p = &l->s.policy;
	if (mts_parse_signal(v, &p->enforce_signal) < 0)
		return fail(l, sec, key,
		            "expected a signal such as SIGTERM, TERM or "
		            "15, or nothing for off; got '%s'",
		            v);
	return 0;
}

/* [limits] max_slots_per_uid, max_groups_per_uid: an integer or none. */
static int key_limits_per_uid(struct load *l, const char *sec, const char *key,
                              const char *v)
{
	struct mts_policy *p = &l->s.policy;
	bool slots = strcmp(key, "max_slots_per_uid") == 0;
	bool none = strcasecmp(v, "none") == 0 || strcasecmp(v, "off") == 0 ||
	            strcasecmp(v, "unlimited") == 0;
	uint64_t n = 0;
	if (!none && parse_uint(v, 1, MTSHM_MAX_SLOTS, &n) < 0)
		return fail(l, sec, key,
		            "expected an integer from 1 to %llu, or none; got "
		            "'%s'",
		            (unsigned long long)MTSHM_MAX_SLOTS, v);
	if (slots)
		p->slots_per_uid = none ? MTS_CAP_NONE : (uint32_t)n;
	else
		p->groups_per_uid = none ? 0 : (uint32_t)n;
	return 0;
}

/* [metrics] per_process, per_kind (true/false), max_groups (an integer). */
static int key_metrics(struct load *l, const char *sec, const char *key,
                       const char *v)
{
	struct mts_policy *p = &l->s.policy;
	if (strcmp(key, "per_process") == 0 || strcmp(key, "per_kind") == 0) {
		bool *b = key[4] == 'p' ? &p->metrics_per_process
		                        : &p->metrics_per_kind;
		if (parse_bool(v, b) < 0)
			return fail(l, sec, key,
			            "expected true or false, got '%s'", v);
		return 0;
	}
	return set_u32(l, sec, key, v, 1, 65536, "an integer",
	               &p->metrics_max_groups);
}

/* The [group NAME] entry, created on first use. */
static struct mts_group_policy *group_entry(struct load *l, const char *name)
{
	struct mts_policy *p = &l->s.policy;
	for (uint32_t i = 0; i < p->ngroups; i++)
		if (strcmp(p->groups[i].name, name) == 0)
			return &p->groups[i];
	struct mts_group_policy *g =
	    realloc(p->groups, (p->ngroups + 1) * sizeof(*g));
	if (!g)
		return NULL;
	p->groups = g;
	g = &p->groups[p->ngroups];
	memset(g, 0, sizeof(*g));
	g->name = strdup(name);
	if (!g->name)
		return NULL;
	p->ngroups++;
	return g;
}

/* "1000, alice, 2000": each a number or a name `lookup` resolves; the
 * result replaces *ids. 0, -EINVAL (a bad entry or an empty list) or
 * -ENOMEM. */
static int id_list(const char *v, int (*lookup)(const char *, uint32_t *),
                   uint32_t **ids, uint32_t *n)
{
	uint32_t *a = NULL, na = 0;
	const char *p = v;
	for (;;) {
		p += strspn(p, " \t");
		size_t len = strcspn(p, ",");
		while (len && (p[len - 1] == ' ' || p[len - 1] == '\t'))
			len--;
		char name[256];
		if (len == 0 || len >= sizeof(name))
			goto bad;
		memcpy(name, p, len);
		name[len] = '\0';
		uint32_t id;
		if (lookup(name, &id) < 0)
			goto bad;
		uint32_t *na_ = realloc(a, (na + 1) * sizeof(*a));
		if (!na_) {
			free(a);
			return -ENOMEM;
		}
		a = na_;
		a[na++] = id;
		p += strcspn(p, ",");
		if (!*p)
			break;
		p++;
	}
	free(*ids);
	*ids = a;
	*n = na;
	return 0;
bad:
	free(a);
	return -EINVAL;
}

static int group_key(struct load *l, const char *section, const char *name,
                     const char *key, const char *v)
{
	if (!name[0] || !mts_name_ok(name))
		return fail(l, section, key,
		            "a group name must be 1 to %u bytes without "
		            "control characters",
		            MTS_NAME_MAX);
	struct mts_group_policy *g = group_entry(l, name);
	if (!g)
		return -ENOMEM;
	if (strcmp(key, "limit") == 0) {
		if (parse_limit(v, &g->limit) < 0)
			return fail(
			    l, section, key,
			    "expected a size like 8GiB, or none; got '%s'", v);
	} else if (strcmp(key, "high_watermark") == 0) {
		uint32_t bp;
		if (mts_parse_percent(v, &bp) < 0 || bp == 0)
			return fail(l, section, key,
			            "expected a percentage above 0 and at most "
			            "100, e.g. 90, got '%s'",
			            v);
		g->high_bp = bp;
	} else if (strcmp(key, "uids") == 0 || strcmp(key, "gids") == 0) {
		/* "default" is where a worker refused a group goes: it must
		 * stay open to everyone. */
		if (strcmp(name, "default") == 0)
			return fail(l, section, key,
			            "the group default is open to every uid; "
			            "restrict another group");
		bool uids = key[0] == 'u';
		int err = uids ? id_list(v, lookup_uid, &g->uids, &g->nuids)
		               : id_list(v, lookup_gid, &g->gids, &g->ngids);
		if (err == -ENOMEM)
			return err;
		if (err < 0)
			return fail(
			    l, section, key,
			    "expected a comma-separated list of %s, got "
			    "'%s'",
			    uids ? "user names or uids" : "group names or gids",
			    v);
	} else {
		return fail(l, section, key, "unknown key");
	}
	return 0;
}

static int key_admission(struct load *l, const char *sec, const char *key,
                         const char *v)
{
	struct mts_policy *p = &l->s.policy;
	uint64_t n;
	if (strcmp(key, "max_reservations_per_uid") == 0) {
		if (strcasecmp(v, "none") == 0 || strcasecmp(v, "off") == 0 ||
		    strcasecmp(v, "unlimited") == 0) {
			p->max_resv_per_uid = 0;
			return 0;
		}
		if (parse_uint(v, 1, RESV_PER_UID_MAX, &n) < 0)
			return fail(
			    l, sec, key,
			    "expected an integer from 1 to %u, or none; "
			    "got '%s'",
			    RESV_PER_UID_MAX, v);
		p->max_resv_per_uid = (uint32_t)n;
		return 0;
	}
	if (strcmp(key, "queue") == 0) {
		/* off, or how long a request waits before it keeps its room. */
		if (strcasecmp(v, "off") == 0 || strcasecmp(v, "none") == 0) {
			p->admit_queue = false;
			return 0;
		}
		if (parse_duration_ms(v, UINT64_C(86400000), &n) < 0)
			return fail(l, sec, key,
			            "expected off or a duration up to 1d, e.g. "
			            "10s, got '%s'",
			            v);
		p->admit_queue = true;
		p->admit_queue_ms = (uint32_t)n;
		return 0;
	}
	if (strcmp(key, "max_reserved_bytes_per_uid") == 0) {
		/* A size, a percentage of the fleet limit, or none. */
		size_t len = strlen(v);
		uint32_t bp;
		if (len && v[len - 1] == '%' &&
		    mts_parse_percent(v, &bp) == 0 && bp > 0) {
			p->resv_bytes_bp = bp;
			p->resv_bytes_per_uid = 0;
			return 0;
		}
		uint64_t b;
		if (parse_limit(v, &b) < 0)
			return fail(
			    l, sec, key,
			    "expected a size like 8GiB, a percentage of "
			    "the fleet limit like 50%%, or none; got '%s'",
			    v);
		p->resv_bytes_per_uid = b;
		p->resv_bytes_bp = 0;
		return 0;
	}
	if (strcmp(key, "default_ttl") == 0 || strcmp(key, "max_ttl") == 0) {
		if (parse_uint(v, 1, TTL_MAX_S, &n) < 0)
			return fail(l, sec, key,
			            "expected seconds from 1 to %u, got '%s'",
			            TTL_MAX_S, v);
		if (key[0] == 'd')
			p->default_ttl_s = (uint32_t)n;
		else
			p->max_ttl_s = (uint32_t)n;
		return 0;
	}
	return fail(l, sec, key, "unknown key");
}

/*
 * [kinds] (kinds.c): quantile and margin (percentages), window (runs),
 * horizon (a duration), default_size (a size, or a percentage of the
 * fleet limit), reserve_learned and follow_profile (booleans),
 * max_kinds_per_uid (an
 * integer or none), max_kinds (an integer).
 */
static int key_kinds(struct load *l, const char *sec, const char *key,
                     const char *v)
{
	struct mts_policy *p = &l->s.policy;
	uint64_t n;
	uint32_t bp;
	/* Percentages: the quantile above 0, the margin and pool_gap from 0. */
	uint32_t *pct = strcmp(key, "quantile") == 0   ? &p->kind_quantile_bp
	                : strcmp(key, "margin") == 0   ? &p->kind_margin_bp
	                : strcmp(key, "pool_gap") == 0 ? &p->kind_pool_gap_bp
	                                               : NULL;
	if (pct) {
		bool q = pct == &p->kind_quantile_bp;
		if (mts_parse_percent(v, &bp) < 0 || (q && bp == 0))
			return fail(l, sec, key,
			            "expected a percentage %s 0 and at most "
			            "100, e.g. %s, got '%s'",
			            q ? "above" : "from", q ? "95" : "10%", v);
		*pct = bp;
		return 0;
	}
	if (strcmp(key, "window") == 0)
		return set_u32(l, sec, key, v, 1, MTS_KIND_RUNS, "runs",
		               &p->kind_window);
	if (strcmp(key, "horizon") == 0) {
		/* A year at most: the record keeps seconds in 32 bits. */
		if (parse_duration_ms(v, UINT64_C(366) * 86400000u, &n) < 0 ||
		    n < 1000)
			return fail(l, sec, key,
			            "expected a duration from 1s to 366d, "
			            "e.g. 7d, got '%s'",
			            v);
		p->kind_horizon_s = (uint32_t)(n / 1000);
		return 0;
	}
	if (strcmp(key, "default_size") == 0) {
		size_t len = strlen(v);
		if (len && v[len - 1] == '%' &&
		    mts_parse_percent(v, &bp) == 0 && bp > 0) {
			p->kind_default_bp = bp;
			p->kind_default_size = 0;
			return 0;
		}
		if (mt_parse_size(v, &n) < 0 || n == 0)
			return fail(l, sec, key,
			            "expected a size like 1GiB or a "
			            "percentage of the fleet limit like "
			            "12.5%%, got '%s'",
			            v);
		p->kind_default_size = n;
		p->kind_default_bp = 0;
		return 0;
	}
	if (strcmp(key, "reserve_learned") == 0 ||
	    strcmp(key, "follow_profile") == 0) {
		if (parse_bool(v, key[0] == 'r' ? &p->kind_reserve_learned
		                                : &p->kind_follow_profile) < 0)
			return fail(l, sec, key,
			            "expected true or false, got '%s'", v);
		return 0;
	}
	if (strcmp(key, "max_kinds_per_uid") == 0) {
		if (strcasecmp(v, "none") == 0) {
			p->kinds_per_uid = 0;
			return 0;
		}
		return set_u32(l, sec, key, v, 1, MTS_KINDS_MAX_MAX,
		               "an integer (or none)", &p->kinds_per_uid);
	}
	if (strcmp(key, "max_kinds") == 0)
		return set_u32(l, sec, key, v, 1, MTS_KINDS_MAX_MAX,
		               "an integer", &p->kinds_max);
	return fail(l, sec, key, "unknown key");
}

/*
 * [trust]: trusted_uids (a list of user names or numbers, separated by
 * commas or blanks; replaces the list), untouched_allowance (a size, per
 * uid), untouched_allowance_total (a size, all uids together),
 * untouched_time (a duration). See vouch.c.
 */
static int key_trust(struct load *l, const char *sec, const char *key,
                     const char *v)
{
	struct mts_policy *p = &l->s.policy;
	uint64_t n;
	if (strcmp(key, "untouched_allowance") == 0) {
		if (mt_parse_size(v, &n) < 0)
			return fail(
			    l, sec, key,
			    "expected a size like 256MiB, or 0; got '%s'", v);
		p->untouched_allowance = n;
		return 0;
	}
	if (strcmp(key, "untouched_allowance_total") == 0) {
		if (mt_parse_size(v, &n) < 0)
			return fail(
			    l, sec, key,
			    "expected a size like 256MiB, or 0; got '%s'", v);
		p->untouched_total = n;
		return 0;
	}
	if (strcmp(key, "untouched_time") == 0) {
		if (parse_duration_ms(v, MTS_UNTOUCHED_MAX_MS, &n) < 0)
			return fail(l, sec, key,
			            "expected a duration up to 1h, e.g. 10s, "
			            "got '%s'",
			            v);
		p->untouched_ms = (uint32_t)n;
		return 0;
	}
	/* trusted_uids */
	char buf[LINE_MAX_CHARS + 1];
	snprintf(buf, sizeof(buf), "%s", v);
	p->ntrusted = 0;
	for (char *save = NULL, *t = strtok_r(buf, ", \t", &save); t;
	     t = strtok_r(NULL, ", \t", &save)) {
		uint32_t uid;
		if (lookup_uid(t, &uid) < 0)
			return fail(l, sec, key, "no such user '%s'", t);
		if (p->ntrusted == MTS_TRUSTED_UIDS_MAX)
			return fail(l, sec, key, "at most %u users",
			            MTS_TRUSTED_UIDS_MAX);
		p->trusted_uids[p->ntrusted++] = uid;
	}
	return 0;
}

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

/*
 * [guard] (guard.c): enabled (auto, true, false), cgroup (auto, none or
 * a cgroup directory), line (90%, limit - 256MiB, or a size), interval
 * (a duration), evict_trusted (true/false). The line against the node's
 * limit is checked when the node is known (mts_guard_setup), at start
 * and at every reload.
 */
static int key_guard(struct load *l, const char *sec, const char *key,
                     const char *v)
{
	struct mts_policy *p = &l->s.policy;
	if (strcmp(key, "enabled") == 0) {
		bool b;
		if (strcasecmp(v, "auto") == 0)
			p->guard_mode = MTS_GUARD_AUTO;
		else if (parse_bool(v, &b) == 0)
			p->guard_mode = b ? MTS_GUARD_ON : MTS_GUARD_OFF;
		else
			return fail(l, sec, key,
			            "expected auto, true or false, got '%s'",
			            v);
		return 0;
	}
	if (strcmp(key, "cgroup") == 0) {
		if (strcasecmp(v, "auto") == 0 || !v[0]) {
			free(p->guard_cgroup);
			p->guard_cgroup = NULL;
			return 0;
		}
		if (strcasecmp(v, "none") != 0 &&
		    (v[0] != '/' || strlen(v) >= PATH_MAX))
			return fail(l, sec, key,
			            "expected auto, none or the absolute path "
			            "of a cgroup directory, got '%s'",
			            v);
		return set_str(&p->guard_cgroup,
		               strcasecmp(v, "none") == 0 ? "" : v);
	}
	if (strcmp(key, "line") == 0) {
		size_t len = strlen(v);
		uint32_t bp;
		uint64_t n;
		if (len && v[len - 1] == '%' &&
		    mts_parse_percent(v, &bp) == 0 && bp > 0 &&
		    bp < MTS_BP_ONE) {
			p->guard_line_bp = bp;
			p->guard_line_below = p->guard_line_bytes = 0;
		} else if (parse_below_limit(v, &n) == 0) {
			p->guard_line_below = n;
			p->guard_line_bp = 0;
			p->guard_line_bytes = 0;
		} else if (mt_parse_size(v, &n) == 0 && n > 0) {
			p->guard_line_bytes = n;
			p->guard_line_bp = p->guard_line_below = 0;
		} else {
			return fail(
			    l, sec, key,
			    "expected a percentage of the node's limit "
			    "below 100%% like 90%%, bytes below it like "
			    "limit - 256MiB, or a size like 60GiB; got "
			    "'%s'",
			    v);
		}
		return 0;
	}
	if (strcmp(key, "interval") == 0) {
		uint64_t n;
		if (parse_duration_ms(v, MTS_GUARD_INTERVAL_MAX_MS, &n) < 0 ||
		    n < MTS_GUARD_INTERVAL_MIN_MS)
			return fail(
			    l, sec, key,
			    "expected a duration from 100ms to 1h, e.g. "
			    "2s, got '%s'",
			    v);
		p->guard_interval_ms = (uint32_t)n;
		return 0;
	}
	if (parse_bool(v, &p->guard_evict_trusted) < 0)
		return fail(l, sec, key, "expected true or false, got '%s'", v);
	return 0;
}

/*
 * [hooks]: on_ok, on_high, on_over (a shell command line, run with
 * /bin/sh -c; empty = none), timeout (a duration), node (MEMTALLY_NODE).
 * A command is one line of at most LINE_MAX_CHARS with its key: a longer
 * one belongs in a script.
 */
static int key_hooks(struct load *l, const char *sec, const char *key,
                     const char *v)
{
	struct mts_hook_conf *h = &l->s.hooks;
	static const char *const on[3] = {"on_ok", "on_high", "on_over"};
	for (int i = 0; i < 3; i++) {
		if (strcmp(key, on[i]) != 0)
			continue;
		if (!v[0]) {
			free(h->cmd[i]);
			h->cmd[i] = NULL;
			return 0;
		}
		return set_str(&h->cmd[i], v);
	}
	if (strcmp(key, "timeout") == 0) {
		uint64_t n;
		if (parse_duration_ms(v, MTS_HOOK_TIMEOUT_MAX_MS, &n) < 0 ||
		    n < MTS_HOOK_TIMEOUT_MIN_MS)
			return fail(
			    l, sec, key,
			    "expected a duration from 100ms to 1h, e.g. "
			    "30s, got '%s'",
			    v);
		h->timeout_ms = (uint32_t)n;
		return 0;
	}
	if (strcmp(key, "min_interval") == 0) {
		uint64_t n;
		if (parse_duration_ms(v, MTS_HOOK_TIMEOUT_MAX_MS, &n) < 0)
			return fail(l, sec, key,
			            "expected a duration up to 1h, e.g. 1s, "
			            "or 0; got '%s'",
			            v);
		h->min_interval_ms = (uint32_t)n;
		return 0;
	}
	if (strcmp(key, "node") == 0) {
		for (const char *c = v; *c; c++)
			if ((unsigned char)*c < 0x20 || *c == 0x7f)
				return fail(l, sec, key,
				            "no control characters, got '%s'",
				            v);
		if (!v[0] || strlen(v) > 255)
			return fail(
			    l, sec, key,
			    "expected a name of 1 to 255 bytes, got '%s'", v);
		return set_str(&h->node, v);
	}
	return fail(l, sec, key, "unknown key");
}

/*
 * Every key of every fixed section, and the function that parses it: the
 * file, the flags that override keys (mts_flags) and a reload all go
 * through this table, so a key is added in one place. [group NAME]
 * sections have keys of their own (group_key).
 */
typedef int (*key_fn)(struct load *l, const char *sec, const char *key,
                      const char *v);
/* A key that is an integer in a range is data: where it goes in struct
 * mts_settings, its bounds and what the error calls it. U32() names a
 * uint32_t field: one of another size does not compile (the array of
 * size -1). */
struct u32_key {
	size_t off;
	uint32_t lo, hi;
	const char *what;
};
#define U32(field, lo, hi, what)                                               \
	{                                                                      \
		offsetof(struct mts_settings, field) +                         \
		    0 * sizeof(                                                \
		            char[sizeof(((struct mts_settings *)0)->field) ==  \
		                         sizeof(uint32_t)                      \
		                     ? 1                                       \
		                     : -1]),                                   \
		    lo, hi, what                                               \
	}
#define NO_U32                                                                 \
	{                                                                      \
		0, 0, 0, NULL                                                  \
	}
static const struct {
	const char *section, *key;
	key_fn parse; /* NULL: an integer in range, `u32` */
	struct u32_key u32;
} cfg_keys[] = {
    {"server", "socket", key_server_socket, NO_U32},
    {"server", "segment", key_server_segment, NO_U32},
    {"server", "state", key_server_state, NO_U32},
    {"server", "slots", NULL, U32(cfg.slots, 1, MTSHM_MAX_SLOTS, "an integer")},
    {"server", "lanes", NULL, U32(cfg.lanes, 1, MTSHM_MAX_LANES, "an integer")},
    {"server", "tick", NULL,
     U32(cfg.tick_ms, 1, MTS_TICK_MAX_MS, "milliseconds")},
    {"server", "threshold", key_server_threshold, NO_U32},
    {"server", "max_connections", NULL,
     U32(cfg.max_conns, 1, MTS_MAX_CONNS_MAX, "an integer")},
    {"server", "max_connections_per_uid", NULL,
     U32(cfg.max_conns_per_uid, 1, MTS_MAX_CONNS_MAX, "an integer")},
    {"server", "max_connections_unidentified", NULL,
     U32(cfg.max_conns_unidentified, 1, MTS_MAX_CONNS_MAX, "an integer")},
    {"server", "idle_timeout", key_server_idle_timeout, NO_U32},
    {"server", "oom_score_adj", key_server_oom_score_adj, NO_U32},
    {"server", "max_buffered", key_server_max_buffered, NO_U32},
    {"server", "log_level", key_server_log_level, NO_U32},
    {"server", "log_budget", key_server_log_budget, NO_U32},
    {"server", "tcp", key_server_tcp, NO_U32},
    {"server", "tcp_allow_remote", key_server_tcp_allow_remote, NO_U32},
    {"server", "tcp_token", key_server_tcp_token, NO_U32},
    {"server", "tcp_token_file", key_server_tcp_token_file, NO_U32},
    {"server", "admin_uid", key_server_admin_uid, NO_U32},
    {"server", "admin_gid", key_server_admin_gid, NO_U32},
    {"server", "metrics", key_server_metrics, NO_U32},
    {"server", "group", key_server_group, NO_U32},
    {"server", "show_others", key_server_show_others, NO_U32},
    {"server", "max_watch_per_uid", key_server_watch_per_uid, NO_U32},
    {"limits", "fleet", key_limits_fleet, NO_U32},
    {"limits", "process", key_limits_process, NO_U32},
    {"limits", "high_watermark", key_limits_high_watermark, NO_U32},
    {"limits", "hysteresis", key_limits_hysteresis, NO_U32},
    {"limits", "measure", key_limits_measure, NO_U32},
    {"limits", "rss_interval", NULL,
     U32(policy.rss_interval_ms, RSS_MIN_MS, RSS_MAX_MS, "milliseconds")},
    {"limits", "growth_window", key_limits_growth_window, NO_U32},
    {"limits", "forecast_horizon", key_limits_forecast_horizon, NO_U32},
    {"enforce", "signal", key_enforce_signal, NO_U32},
    {"enforce", "grace", NULL,
     U32(policy.grace_ms, 0, GRACE_MAX_MS, "milliseconds")},
    {"admission", "max_reservations_per_uid", key_admission, NO_U32},
    {"admission", "default_ttl", key_admission, NO_U32},
    {"admission", "max_ttl", key_admission, NO_U32},
    {"admission", "max_reserved_bytes_per_uid", key_admission, NO_U32},
    {"admission", "queue", key_admission, NO_U32},
    {"limits", "max_slots_per_uid", key_limits_per_uid, NO_U32},
    {"limits", "max_groups_per_uid", key_limits_per_uid, NO_U32},
    {"metrics", "per_process", key_metrics, NO_U32},
    {"metrics", "max_groups", key_metrics, NO_U32},
    {"metrics", "per_kind", key_metrics, NO_U32},
    {"kinds", "quantile", key_kinds, NO_U32},
    {"kinds", "margin", key_kinds, NO_U32},
    {"kinds", "window", key_kinds, NO_U32},
    {"kinds", "horizon", key_kinds, NO_U32},
    {"kinds", "default_size", key_kinds, NO_U32},
    {"kinds", "reserve_learned", key_kinds, NO_U32},
    {"kinds", "follow_profile", key_kinds, NO_U32},
    {"kinds", "pool_gap", key_kinds, NO_U32},
    {"kinds", "max_kinds_per_uid", key_kinds, NO_U32},
    {"kinds", "max_kinds", key_kinds, NO_U32},
    {"hooks", "on_ok", key_hooks, NO_U32},
    {"hooks", "on_high", key_hooks, NO_U32},
    {"hooks", "on_over", key_hooks, NO_U32},
    {"hooks", "timeout", key_hooks, NO_U32},
    {"hooks", "node", key_hooks, NO_U32},
    {"hooks", "min_interval", key_hooks, NO_U32},
    {"trust", "trusted_uids", key_trust, NO_U32},
    {"trust", "untouched_allowance", key_trust, NO_U32},
    {"trust", "untouched_allowance_total", key_trust, NO_U32},
    {"trust", "untouched_time", key_trust, NO_U32},
    {"guard", "enabled", key_guard, NO_U32},
    {"guard", "cgroup", key_guard, NO_U32},
    {"guard", "line", key_guard, NO_U32},
    {"guard", "interval", key_guard, NO_U32},
    {"guard", "evict_trusted", key_guard, NO_U32},
};

bool mts_config_key_known(const char *section, const char *key)
{
	for (size_t i = 0; i < sizeof(cfg_keys) / sizeof(cfg_keys[0]); i++)
		if (strcmp(section, cfg_keys[i].section) == 0 &&
		    strcmp(key, cfg_keys[i].key) == 0)
			return true;
	return false;
}

/* One key = value, from the file or a flag. 0, -EINVAL or -ENOMEM. */
static int apply_key(struct load *l, const char *section, const char *key,
                     const char *value)
{
	bool known_section = false;
	for (size_t i = 0; i < sizeof(cfg_keys) / sizeof(cfg_keys[0]); i++) {
		if (strcmp(section, cfg_keys[i].section) != 0)
			continue;
		known_section = true;
		if (strcmp(key, cfg_keys[i].key) != 0)
			continue;
		if (cfg_keys[i].parse)
			return cfg_keys[i].parse(l, section, key, value);
		const struct u32_key *u = &cfg_keys[i].u32;
		return set_u32(l, section, key, value, u->lo, u->hi, u->what,
		               (uint32_t *)((char *)&l->s + u->off));
	}
	if (known_section)
		return fail(l, section, key, "unknown key");
	if (strncmp(section, "group", 5) == 0 &&
	    (section[5] == ' ' || section[5] == '\t' || section[5] == '\0')) {
		const char *name = section + 5;
		while (*name == ' ' || *name == '\t')
			name++;
		return group_key(l, section, name, key, value);
	}
	if (!section[0])
		return fail(l, "", key, "a key before any [section]");
	return fail(l, section, key, "unknown section");
}

/*
 * The flags that set a key. Help texts are printf formats of the two
 * numbers beside them (unused ones are 0); continuation lines start with
 * a newline and are indented by the printer.
 */
const struct mts_flag mts_flags[] = {
    {"--socket", "PATH", "server", "socket",
     "Unix socket to listen on (default " MTS_DEFAULT_SOCKET ");\n"
     "its directory is created (0755) if missing",
     0, 0},
    {"--segment", "NAME", "server", "segment",
     "label of the shared objects, as shown in\n"
     "/proc/PID/maps (default " MTS_DEFAULT_SEGMENT ")",
     0, 0},
    {"--state", "PATH", "server", "state",
     "restart record (default SOCKET.state): what a\n"
     "restarted server needs to keep live workers",
     0, 0},
    {"--slots", "N", "server", "slots", "worker slots, 1..%llu (default %llu)",
     MTSHM_MAX_SLOTS, MTS_DEFAULT_SLOTS},
    {"--lanes", "N", "server", "lanes",
     "per-thread lanes per slot, 1..%llu (default %llu)", MTSHM_MAX_LANES,
     MTSHM_DEFAULT_LANES},
    {"--tick", "MS", "server", "tick",
     "aggregation period, 1..%llu ms (default %llu)", MTS_TICK_MAX_MS,
     MTS_DEFAULT_TICK_MS},
    {"--threshold", "SIZE", "server", "threshold",
     "worker flush threshold, 1 B..1 GiB (default 64KiB)", 0, 0},
    {"--log-level", "LEVEL", "server", "log_level",
     "debug, info, warn or error (default info)", 0, 0},
    {"--log-budget", "N", "server", "log_budget",
     "lines a second each uid may cause at each level,\n"
     "or none (default 10)",
     0, 0},
    {"--fleet-limit", "SIZE", "limits", "fleet",
     "fleet limit, or none (default none)", 0, 0},
    {"--high-watermark", "PCT", "limits", "high_watermark",
     "state turns 'high' at PCT%% of a limit (default 90)", 0, 0},
    {"--tcp", "HOST:PORT", "server", "tcp",
     "also listen on TCP (loopback unless the config says\n"
     "tcp_allow_remote = true)",
     0, 0},
    {"--metrics", "HOST:PORT", "server", "metrics",
     "Prometheus /metrics endpoint", 0, 0},
    {"--max-connections", "N", "server", "max_connections",
     "connections open at once, 1..%llu (default %llu);\n"
     "more are accepted and closed at once",
     MTS_MAX_CONNS_MAX, MTS_DEFAULT_MAX_CONNS},
    {"--max-buffered", "SIZE", "server", "max_buffered",
     "cap on the input and unwritten output held for all\n"
     "connections, at least 1MiB (default 64MiB); past it the\n"
     "largest holders stop being read, then are disconnected",
     0, 0},
};
const size_t mts_nflags = sizeof(mts_flags) / sizeof(mts_flags[0]);

static int on_ini_key(void *user, const char *section, const char *name,
                      const char *value)
{
	struct load *l = user;
	if (!name)
		return 1; /* a bare [section] line, if inih reports those */
	if (l->msg[0])
		return 0; /* keep the first error only */
	int err = apply_key(l, section, name, value);
	if (err == -ENOMEM && !l->msg[0])
		snprintf(l->msg, sizeof(l->msg), "out of memory");
	return err == 0;
}

/*
 * Read `path` and normalise it for inih: leading blanks removed from each
 * line (no continuation lines), lines longer than inih's buffer refused.
 * Returns 0 and a malloc'd text, or -errno / -EINVAL with *bad_line set.
 */
static int read_config(const char *path, char **text, int *bad_line,
                       mode_t *mode)
{
	int fd = open(path, O_RDONLY | O_CLOEXEC);
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
		while (i < len && (raw[i] == ' ' || raw[i] == '\t'))
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

/* The token from tcp_token_file: first line, trailing blanks cut. */
static int read_token_file(struct load *l, const char *path)
{
	int fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return fail(l, "server", "tcp_token_file",
		            "cannot read '%s': %s", path, strerror(errno));
	char buf[TOKEN_MAX + 2];
	ssize_t n;
	do
		n = read(fd, buf, sizeof(buf) - 1);
	while (n < 0 && errno == EINTR);
	int e = errno;
	struct stat st;
	bool world = fstat(fd, &st) == 0 && (st.st_mode & 0004);
	close(fd);
	if (n < 0)
		return fail(l, "server", "tcp_token_file",
		            "cannot read '%s': %s", path, strerror(e));
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
		return fail(l, "server", "tcp_token_file",
		            "'%s' is readable by everyone: use a token file of "
		            "mode 0600 or 0640 (chmod o-r it)",
		            path);
	}
	int err = set_str(&l->tcp_token, buf);
	explicit_bzero(buf, sizeof(buf));
	return err;
}

/* Checks across keys, once everything is read. */
static int finish(struct load *l)
{
	struct mts_policy *p = &l->s.policy;
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
	if (l->tcp_token && l->tcp_token_file)
		return fail(l, "server", "tcp_token_file",
		            "set tcp_token or tcp_token_file, not both");
	/* The token gives admin rights: a config file every local user can
	 * read must not hold it. */
	if (l->tcp_token && l->path && (l->mode & 0044))
		return fail(
		    l, "server", "tcp_token",
		    "'%s' (mode %04o) is readable by group or others "
		    "and holds the token: move it to a tcp_token_file of "
		    "mode 0600 or 0640, or chmod 0600 the config",
		    l->path, (unsigned)(l->mode & 07777));
	if (l->tcp_token_file) {
		int err = read_token_file(l, l->tcp_token_file);
		if (err < 0)
			return err;
	}
	if (l->tcp_token) {
		size_t n = strlen(l->tcp_token);
		const char *key =
		    l->tcp_token_file ? "tcp_token_file" : "tcp_token";
		if (n < TOKEN_MIN || n > TOKEN_MAX)
			return fail(
			    l, "server", key,
			    "a token must be %u to %u characters (got %zu)",
			    TOKEN_MIN, TOKEN_MAX, n);
		for (size_t i = 0; i < n; i++) {
			unsigned char c = (unsigned char)l->tcp_token[i];
			if (c <= 0x20 || c == 0x7f)
				return fail(l, "server", key,
				            "a token must not hold blanks or "
				            "control characters");
		}
		p->tcp_token = l->tcp_token;
		l->tcp_token = NULL;
	}
	const char *tcp = l->s.owned[OWNED_TCP];
	if (tcp) {
		struct sockaddr_storage ss;
		socklen_t len;
		bool lo = false;
		if (mts_parse_hostport(tcp, &ss, &len, &lo) < 0)
			return fail(l, "server", "tcp", "bad address '%s'",
			            tcp);
		if (!lo && !l->tcp_allow_remote)
			return fail(l, "server", "tcp",
			            "'%s' is not a loopback address; set "
			            "tcp_allow_remote = true to listen on it",
			            tcp);
	}
	return 0;
}

static void load_free(struct load *l)
{
	mts_settings_free(&l->s);
	if (l->tcp_token) {
		explicit_bzero(l->tcp_token, strlen(l->tcp_token));
		free(l->tcp_token);
	}
	free(l->tcp_token_file);
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
	memset(s, 0, sizeof(*s));
}

int mts_settings_load(struct mts_settings *out, const char *path,
                      const struct mts_override *ov, size_t nov, char *err,
                      size_t errlen)
{
	struct load l;
	int ret = 0;
	memset(&l, 0, sizeof(l));
	mts_policy_defaults(&l.s.policy);
	l.s.log_level = MTS_LOG_INFO;
	l.s.log_budget = MTS_LOG_PEER_BURST;
	l.s.cfg.slots = MTS_DEFAULT_SLOTS;
	l.s.cfg.lanes = MTSHM_DEFAULT_LANES;
	l.s.cfg.tick_ms = MTS_DEFAULT_TICK_MS;
	l.s.cfg.threshold = MTS_DEFAULT_THRESHOLD;
	l.s.cfg.max_conns = MTS_DEFAULT_MAX_CONNS;
	l.s.cfg.max_buffered = MTS_DEFAULT_MAX_BUFFERED;
	l.s.cfg.max_conns_unidentified = MTS_DEFAULT_MAX_CONNS_UNIDENTIFIED;
	l.s.cfg.idle_timeout_ms = MTS_DEFAULT_IDLE_MS;
	l.s.cfg.oom_score_adj = MTS_DEFAULT_OOM_SCORE_ADJ;
	l.s.hooks.min_interval_ms = MTS_HOOK_DEFAULT_MIN_INTERVAL_MS;
	if (set_str(&l.s.owned[OWNED_SOCKET], MTS_DEFAULT_SOCKET) < 0 ||
	    set_str(&l.s.owned[OWNED_SEGMENT], MTS_DEFAULT_SEGMENT) < 0) {
		ret = -ENOMEM;
		snprintf(err, errlen, "out of memory");
		goto out;
	}

	if (path) {
		char *text = NULL;
		int bad_line = 0;
		if (set_str(&l.s.config_path, path) < 0) {
			ret = -ENOMEM;
			snprintf(err, errlen, "out of memory");
			goto out;
		}
		l.path = path;
		ret = read_config(path, &text, &bad_line, &l.mode);
		if (ret == -EINVAL) {
			snprintf(err, errlen,
			         "%s:%d: line longer than %u characters or "
			         "holding a NUL byte",
			         path, bad_line, LINE_MAX_CHARS);
			goto out;
		}
		if (ret < 0) {
			snprintf(err, errlen, "%s: cannot read: %s", path,
			         ret == -EFBIG ? "not a regular file of at "
			                         "most 1 MiB"
			                       : strerror(-ret));
			goto out;
		}
		int line = ini_parse_string(text, on_ini_key, &l);
		free(text);
		if (line != 0 || l.msg[0]) {
			if (l.msg[0])
				snprintf(err, errlen, "%s:%d: %s", path, line,
				         l.msg);
			else
				snprintf(
				    err, errlen,
				    "%s:%d: syntax error (expected [section] "
				    "or key = value)",
				    path, line);
			ret = strcmp(l.msg, "out of memory") == 0 ? -ENOMEM
			                                          : -EINVAL;
			goto out;
		}
	}
	for (size_t i = 0; i < nov; i++) {
		ret = apply_key(&l, ov[i].section, ov[i].key, ov[i].value);
		if (ret < 0) {
			/* Name the flag, not the key it stands for. */
			const char *colon = strstr(l.msg, ": ");
			snprintf(err, errlen, "%s: %s", ov[i].flag,
			         colon ? colon + 2 : l.msg);
			goto out;
		}
	}
	ret = finish(&l);
	if (ret < 0) {
		snprintf(err, errlen, "%s%s%s", path ? path : "",
		         path ? ": " : "", l.msg[0] ? l.msg : "out of memory");
		goto out;
	}

	l.s.cfg.socket_path = l.s.owned[OWNED_SOCKET];
	l.s.cfg.segment = l.s.owned[OWNED_SEGMENT];
	l.s.cfg.tcp_addr = l.s.owned[OWNED_TCP];
	l.s.cfg.metrics_addr = l.s.owned[OWNED_METRICS];
	l.s.cfg.state_path = l.s.owned[OWNED_STATE];
	*out = l.s;
	/* The caller keeps *out in place; policy and hooks point into it. */
	out->cfg.policy = &out->policy;
	out->cfg.hooks = &out->hooks;
	memset(&l.s, 0, sizeof(l.s));
	ret = 0;
out:
	load_free(&l);
	return ret;
}
