/*
 * values.c - what a configuration value is: the parser and the printer of
 * each type of key (struct mts_key, mts_values.h), and the small parsers
 * they and other modules share (percentages, signals, HOST:PORT, ids).
 *
 * A type's parser takes the text of the file or of a flag and sets the
 * key's fields; on a bad value it writes "expected <what>, got '<text>'",
 * where <what> is the same text --help shows. Its printer is what --help
 * shows as the default, what the start-up log shows, and what the reload
 * diff compares. config.c holds the table of keys; this file knows none.
 */
#include "mts_values.h"

#include <arpa/inet.h>
#include <errno.h>
#include <grp.h>
#include <netdb.h>
#include <netinet/in.h>
#include <pwd.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "mtcommon.h"
#include "mts_policy.h"

bool mts_no_controls(const char *v)
{
	for (const char *c = v; *c; c++)
		if ((unsigned char)*c < 0x20 || *c == 0x7f)
			return false;
	return true;
}

bool mts_is_none(const char *v)
{
	return strcasecmp(v, "none") == 0 || strcasecmp(v, "off") == 0 ||
	       strcasecmp(v, "unlimited") == 0;
}

/*
 * A duration: digits with an optional unit, ms, s (the default), m, h or
 * d; 0 means 0 (the key decides what that is). Into milliseconds, at most
 * `max_ms`. 0 or -EINVAL.
 */
int mts_parse_duration_ms(const char *v, uint64_t max_ms, uint64_t *out)
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
	static const struct {
		const char *unit;
		uint64_t ms;
	} units[] = {{"ms", 1},      {"", 1000},     {"s", 1000},
	             {"m", 60000},   {"min", 60000}, {"h", 3600000},
	             {"d", 86400000}};
	for (size_t i = 0; i < sizeof(units) / sizeof(units[0]); i++) {
		if (strcmp(end, units[i].unit) != 0)
			continue;
		if (x > max_ms / units[i].ms)
			return -EINVAL;
		*out = x * units[i].ms;
		return 0;
	}
	return -EINVAL;
}

/* Replace an owned string. */
int mts_str_set(char **slot, const char *v)
{
	char *d = strdup(v);
	if (!d)
		return -ENOMEM;
	free(*slot);
	*slot = d;
	return 0;
}

/* The field of `width` bytes at `off` in `base`: a bool, a 32- or a 64-bit
 * integer (the table's rows say which, from sizeof). */
static void put(void *base, size_t off, size_t width, uint64_t v)
{
	char *p = (char *)base + off;
	if (width == 1)
		*(bool *)p = v != 0;
	else if (width == 4)
		*(uint32_t *)p = (uint32_t)v;
	else
		*(uint64_t *)p = v;
}

static uint64_t get(const void *base, size_t off, size_t width)
{
	const char *p = (const char *)base + off;
	if (width == 1)
		return *(const bool *)p;
	if (width == 4)
		return *(const uint32_t *)p;
	return *(const uint64_t *)p;
}

/* "64MiB" when bytes are a whole number of a binary unit, else bytes. */
void mts_fmt_size(uint64_t b, char *buf, size_t n)
{
	static const char *const units[] = {"", "KiB", "MiB", "GiB", "TiB"};
	int u = 0;
	while (u < 4 && b && b % 1024 == 0) {
		b /= 1024;
		u++;
	}
	snprintf(buf, n, "%llu%s", (unsigned long long)b, units[u]);
}

/* "10s", "500ms", "7d": the largest unit that is exact. */
void mts_fmt_duration(uint64_t ms, char *buf, size_t n)
{
	static const struct {
		const char *unit;
		uint64_t ms;
	} units[] = {
	    {"d", 86400000}, {"h", 3600000}, {"m", 60000}, {"s", 1000}};
	for (size_t i = 0; ms && i < 4; i++)
		if (ms % units[i].ms == 0) {
			snprintf(buf, n, "%llu%s",
			         (unsigned long long)(ms / units[i].ms),
			         units[i].unit);
			return;
		}
	snprintf(buf, n, "%llu%s", (unsigned long long)ms, ms ? "ms" : "");
}

/* Basis points as "90%", "12.5%", "92.25%". */
void mts_fmt_pct(uint64_t bp, char *buf, size_t n)
{
	if (bp % 100 == 0)
		snprintf(buf, n, "%llu%%", (unsigned long long)(bp / 100));
	else if (bp % 10 == 0)
		snprintf(buf, n, "%llu.%llu%%", (unsigned long long)(bp / 100),
		         (unsigned long long)(bp % 100 / 10));
	else
		snprintf(buf, n, "%llu.%02llu%%",
		         (unsigned long long)(bp / 100),
		         (unsigned long long)(bp % 100));
}

int mts_parse_uint(const char *v, uint64_t lo, uint64_t hi, uint64_t *out)
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

int mts_parse_bool(const char *v, bool *out)
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

/* The largest buffer a passwd or group entry is looked up with. */
#define NSS_BUF_MAX (UINT64_C(4) << 20)

/* The id of user (or `group`) `name`. An entry larger than the buffer
 * (ERANGE) is tried again in one twice as large, up to NSS_BUF_MAX: a
 * directory service's group of thousands of members is a name that
 * exists. 0, -EINVAL (no such name) or -ENOMEM. */
static int nss_id(const char *name, bool group, uint32_t *out)
{
	int err = ERANGE;
	bool found = false;
	for (size_t cap = 16384; err == ERANGE && cap <= NSS_BUF_MAX;
	     cap *= 2) {
		char *buf = malloc(cap);
		if (!buf)
			return -ENOMEM;
		if (group) {
			struct group gr, *res = NULL;
			err = getgrnam_r(name, &gr, buf, cap, &res);
			if (!err && res) {
				*out = (uint32_t)res->gr_gid;
				found = true;
			}
		} else {
			struct passwd pw, *res = NULL;
			err = getpwnam_r(name, &pw, buf, cap, &res);
			if (!err && res) {
				*out = (uint32_t)res->pw_uid;
				found = true;
			}
		}
		free(buf);
	}
	return found ? 0 : -EINVAL;
}

int mts_lookup_uid(const char *v, uint32_t *out)
{
	uint64_t n;
	if (mts_parse_uint(v, 0, UINT32_MAX - 1, &n) == 0) {
		*out = (uint32_t)n;
		return 0;
	}
	return nss_id(v, false, out);
}

int mts_lookup_gid(const char *v, uint32_t *out)
{
	uint64_t n;
	if (mts_parse_uint(v, 0, UINT32_MAX - 1, &n) == 0) {
		*out = (uint32_t)n;
		return 0;
	}
	return nss_id(v, true, out);
}

/* "1000, alice, 2000": each a number or a name `lookup` resolves; the
 * result replaces *ids. 0, -EINVAL (a bad entry or an empty list) or
 * -ENOMEM. */
int mts_parse_ids(const char *v, int (*lookup)(const char *, uint32_t *),
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
		/* Not glibc's own two below SIGRTMIN (its threads' and
		 * cancellation's): signalled, they would be taken as that. */
		if (errno || *end || v < 1 || v >= NSIG ||
		    (v >= 32 && v < SIGRTMIN))
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

static int parse_hostport(const char *s, struct sockaddr_storage *ss,
                          socklen_t *len, bool *loopback, bool resolve)
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
	} else if (!resolve) {
		return 1;
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

int mts_parse_hostport(const char *s, struct sockaddr_storage *ss,
                       socklen_t *len, bool *loopback)
{
	return parse_hostport(s, ss, len, loopback, true);
}

int mts_parse_hostport_literal(const char *s, struct sockaddr_storage *ss,
                               socklen_t *len, bool *loopback)
{
	return parse_hostport(s, ss, len, loopback, false);
}

/* What a good value of `k` looks like, for messages and --help. */
void mts_key_expect(const struct mts_key *k, char *buf, size_t n)
{
	char a[24], b[24];
	size_t o = 0;
	switch (k->type) {
	case MTS_KEY_COUNT:
		snprintf(buf, n, "%s from %llu to %llu%s",
		         k->expect ? k->expect : "an integer",
		         (unsigned long long)k->lo, (unsigned long long)k->hi,
		         k->opts & MTS_KEY_NONE ? ", or none" : "");
		return;
	case MTS_KEY_INT:
		snprintf(buf, n, "an integer from %lld to %lld%s",
		         (long long)k->lo, (long long)k->hi,
		         k->opts & MTS_KEY_NONE ? ", or none" : "");
		return;
	case MTS_KEY_PERCENT:
		mts_fmt_pct(k->hi, a, sizeof(a));
		mts_fmt_pct((uint64_t)k->def, b, sizeof(b));
		a[strlen(a) - 1] = b[strlen(b) - 1] = '\0';
		snprintf(buf, n, "a percentage %s %s%s%s",
		         k->lo ? "above 0 and at most" : "from 0 to", a,
		         k->def ? ", e.g. " : "", k->def ? b : "");
		return;
	case MTS_KEY_BOOL:
		snprintf(buf, n, "true or false");
		return;
	case MTS_KEY_ENUM:
		for (size_t i = 0; k->names[i] && o < n; i++)
			o += (size_t)snprintf(buf + o, n - o, "%s%.*s",
			                      !i                ? ""
			                      : k->names[i + 1] ? ", "
			                                        : " or ",
			                      (int)strcspn(k->names[i], "|"),
			                      k->names[i]);
		return;
	case MTS_KEY_UID:
		snprintf(buf, n, "a uid or a user name");
		return;
	case MTS_KEY_GID:
		snprintf(buf, n, "a gid or a group name");
		return;
	case MTS_KEY_UIDS:
	case MTS_KEY_GIDS:
		snprintf(buf, n, "a comma-separated list of %s",
		         k->type == MTS_KEY_UIDS ? "user names or uids"
		                                 : "group names or gids");
		return;
	default:
		snprintf(buf, n, "%s", k->expect ? k->expect : "");
	}
}

/* Parse `v` into the fields of `k` in `base`. 0, -EINVAL (the message, after
 * "[section] key: ", in why) or -ENOMEM. */
int mts_key_parse(const struct mts_key *k, void *base, const char *v, char *why,
                  size_t n)
{
	uint64_t x = 0;
	uint32_t bp;
	bool none = (k->opts & MTS_KEY_NONE) && mts_is_none(v);
	bool bad = false;
	size_t len = strlen(v);
	switch (k->type) {
	case MTS_KEY_COUNT:
		x = k->none;
		bad = !none && mts_parse_uint(v, k->lo, k->hi, &x) < 0;
		break;
	case MTS_KEY_INT: {
		char *end;
		errno = 0;
		long long i = strtoll(v, &end, 10);
		bad = !none && (errno || end == v || *end ||
		                i < (int64_t)k->lo || i > (int64_t)k->hi);
		if (!bad)
			put(base, k->off2, 1, none);
		if (none)
			return 0;
		x = (uint64_t)i;
		break;
	}
	case MTS_KEY_SIZE:
		bad = !none && (mt_parse_size(v, &x) < 0 || x < k->lo ||
		                (k->hi && x > k->hi));
		break;
	case MTS_KEY_SIZE_PCT:
		bp = 0;
		if (!(len && v[len - 1] == '%' &&
		      mts_parse_percent(v, &bp) == 0 && bp > 0)) {
			bp = 0; /* a size, or none */
			bad = !none && (mt_parse_size(v, &x) < 0 ||
			                (!x && !(k->opts & MTS_KEY_NONE)));
		}
		if (!bad)
			put(base, k->off2, 4, bp);
		break;
	case MTS_KEY_PERCENT:
		bad = mts_parse_percent(v, &bp) < 0 || bp < k->lo || bp > k->hi;
		x = bp;
		break;
	case MTS_KEY_DURATION: {
		uint64_t unit = k->opts & MTS_KEY_SECS ? 1000 : 1;
		if (none && k->off2) {
			put(base, k->off2, 1, false);
			return 0; /* off: the duration stays for later */
		}
		bad =
		    !none &&
		    (mts_parse_duration_ms(v, k->hi * unit, &x) < 0 ||
		     (x < k->lo * unit && !(x == 0 && k->opts & MTS_KEY_ZERO)));
		x /= unit;
		if (!bad && k->off2)
			put(base, k->off2, 1, true);
		break;
	}
	case MTS_KEY_BOOL: {
		bool b = false;
		bad = mts_parse_bool(v, &b) < 0;
		x = b;
		break;
	}
	case MTS_KEY_ENUM:
		bad = true;
		for (size_t i = 0; bad && k->names[i]; i++)
			for (const char *p = k->names[i]; bad && *p;) {
				size_t w = strcspn(p, "|");
				bad = !(w == len && strncasecmp(p, v, w) == 0);
				x = i;
				p += w + (p[w] == '|');
			}
		break;
	case MTS_KEY_STRING: {
		char **slot = (char **)((char *)base + k->off);
		if ((!v[0] && k->opts & MTS_KEY_EMPTY) || none) {
			free(*slot);
			*slot = NULL;
			return 0;
		}
		if ((!k->ok || k->ok(v)) && len >= k->lo &&
		    (!k->hi || len <= k->hi))
			return mts_str_set(slot, v);
		bad = true;
		break;
	}
	case MTS_KEY_UID:
	case MTS_KEY_GID: {
		uint32_t id = 0;
		if (v[0])
			bad = (k->type == MTS_KEY_UID
			           ? mts_lookup_uid(v, &id)
			           : mts_lookup_gid(v, &id)) < 0;
		if (!bad)
			put(base, k->off2, 1, v[0] != '\0');
		x = id;
		break;
	}
	case MTS_KEY_UIDS:
	case MTS_KEY_GIDS: {
		int err = mts_parse_ids(
		    v,
		    k->type == MTS_KEY_UIDS ? mts_lookup_uid : mts_lookup_gid,
		    (uint32_t **)((char *)base + k->off),
		    (uint32_t *)((char *)base + k->off2));
		if (err != -EINVAL)
			return err;
		bad = true;
		break;
	}
	case MTS_KEY_SIGNAL: {
		int sig = 0;
		bad = !none && mts_parse_signal(v, &sig) < 0;
		x = (uint64_t)sig;
		break;
	}
	case MTS_KEY_FN:
		return k->parse(base, v, why, n);
	}
	if (bad) {
		char e[160];
		mts_key_expect(k, e, sizeof(e));
		snprintf(why, n, "expected %s%s got '%s'", e,
		         strstr(e, ", or ") ? ";" : ",", v);
		return -EINVAL;
	}
	put(base, k->off, k->width, x);
	return 0;
}

/* The value of `k` in `base` as --help, the log and the diff print it. */
void mts_key_show(const struct mts_key *k, const void *base, bool reveal,
                  char *buf, size_t n)
{
	uint64_t x = k->width ? get(base, k->off, k->width) : 0;
	bool none = k->opts & MTS_KEY_NONE && x == k->none;
	switch (k->type) {
	case MTS_KEY_COUNT:
		if (none)
			snprintf(buf, n, "none");
		else
			snprintf(buf, n, "%llu", (unsigned long long)x);
		return;
	case MTS_KEY_INT:
		if (get(base, k->off2, 1))
			snprintf(buf, n, "none");
		else
			snprintf(buf, n, "%d", (int)(int32_t)x);
		return;
	case MTS_KEY_SIZE_PCT:
		if (get(base, k->off2, 4)) {
			mts_fmt_pct(get(base, k->off2, 4), buf, n);
			return;
		}
		/* fall through */
	case MTS_KEY_SIZE:
		if (none)
			snprintf(buf, n, "none");
		else
			mts_fmt_size(x, buf, n);
		return;
	case MTS_KEY_PERCENT:
		mts_fmt_pct(x, buf, n);
		return;
	case MTS_KEY_DURATION:
		if ((k->off2 && !get(base, k->off2, 1)) || (none && !x))
			snprintf(buf, n, "off");
		else
			mts_fmt_duration(k->opts & MTS_KEY_SECS ? x * 1000 : x,
			                 buf, n);
		return;
	case MTS_KEY_BOOL:
		snprintf(buf, n, "%s", x ? "true" : "false");
		return;
	case MTS_KEY_ENUM:
		snprintf(buf, n, "%.*s", (int)strcspn(k->names[x], "|"),
		         k->names[x]);
		return;
	case MTS_KEY_STRING: {
		const char *str = *(char *const *)((const char *)base + k->off);
		if (str && k->opts & MTS_KEY_SECRET && !reveal)
			str = "set";
		snprintf(buf, n, "%s", str ? str : "none");
		return;
	}
	case MTS_KEY_UID:
	case MTS_KEY_GID:
		if (get(base, k->off2, 1))
			snprintf(buf, n, "%llu", (unsigned long long)x);
		else
			snprintf(buf, n, "none");
		return;
	case MTS_KEY_UIDS:
	case MTS_KEY_GIDS: {
		const uint32_t *ids =
		    *(uint32_t *const *)((const char *)base + k->off);
		uint32_t nids = (uint32_t)get(base, k->off2, 4);
		size_t o = (size_t)snprintf(buf, n, "%s", nids ? "" : "none");
		for (uint32_t i = 0; i < nids && o < n; i++)
			o += (size_t)snprintf(buf + o, n - o, "%s%u",
			                      i ? "," : "", ids[i]);
		return;
	}
	case MTS_KEY_SIGNAL:
		if (x && sigabbrev_np((int)x))
			snprintf(buf, n, "SIG%s", sigabbrev_np((int)x));
		else if (x) /* a real-time signal: no name of its own */
			snprintf(buf, n, "SIGRTMIN+%d", (int)x - SIGRTMIN);
		else
			snprintf(buf, n, "off");
		return;
	case MTS_KEY_FN:
		k->show(base, buf, n);
		return;
	}
}

int mts_key_default(const struct mts_key *k, void *base)
{
	if (!k->width)
		return 0; /* MTS_KEY_FN without a field: none */
	if (k->type == MTS_KEY_STRING)
		return k->sdef ? mts_str_set((char **)((char *)base + k->off),
		                             k->sdef)
		               : 0;
	if (k->type == MTS_KEY_SIZE_PCT)
		put(base, k->off2, 4, (uint64_t)k->def);
	else
		put(base, k->off, k->width, (uint64_t)k->def);
	if (k->type == MTS_KEY_DURATION && k->off2)
		put(base, k->off2, 1, true);
	return 0;
}

bool mts_hostport_ok(const char *v)
{
	struct sockaddr_storage ss;
	socklen_t len;
	bool lo;
	return mts_parse_hostport_literal(v, &ss, &len, &lo) >= 0;
}
