/*
 * log.c - logfmt lines on stderr.
 *
 * Each line is formatted into a stack buffer and written with write(2) in
 * one piece, retrying a short write. Concurrent writers to the same stderr
 * (a journal, a terminal) thus never see half lines from us. Timestamps
 * are UTC with milliseconds. The level is a plain global, because the
 * server is single-threaded. mts_logq() escapes peer-supplied strings. A
 * line is cut at 1 KiB and always ends in a newline.
 *
 * The budgets (mts_log_uid, mts_log_scope) are small direct-mapped
 * tables. An entry counts its uid's or scope's lines in the current second
 * and what it held back. A uid or scope taking over an entry first reports
 * what the previous one held back. A uid's summary lists the held-back
 * lines by msg. A scope's summary repeats the latest of them, because for
 * a state that is where the scope ended. Loop thread only, like the rest
 * of the server.
 */
#include "mts_log.h"

#include <errno.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <strings.h>
#include <time.h>
#include <unistd.h>

#include "mtcommon.h"

/* [server] log_budget (mts_log_set_budget). */
static unsigned peer_burst = MTS_LOG_PEER_BURST;
static unsigned scope_burst = MTS_LOG_SCOPE_BURST;
static bool budgeted = true;

#define LINE_MAX_BYTES 1024

static enum mts_log_level min_level = MTS_LOG_INFO;

static const char *const level_names[] = {"debug", "info", "warn", "error"};

void mts_log_set_level(enum mts_log_level level)
{
	min_level = level;
}

int mts_log_enabled(enum mts_log_level level)
{
	return level >= min_level;
}

int mts_log_parse_level(const char *s, enum mts_log_level *out)
{
	for (int i = 0; i < 4; i++) {
		if (strcasecmp(s, level_names[i]) == 0) {
			*out = (enum mts_log_level)i;
			return 0;
		}
	}
	if (strcasecmp(s, "warning") == 0) {
		*out = MTS_LOG_WARN;
		return 0;
	}
	return -EINVAL;
}

const char *mts_logq(char *buf, size_t cap, const char *s)
{
	static const char hex[] = "0123456789abcdef";
	size_t n = 0;
	/* Reserve room for the closing quote and NUL. */
	if (cap < 3) {
		if (cap)
			buf[0] = '\0';
		return buf;
	}
	buf[n++] = '"';
	while (s && *s) {
		unsigned char c = (unsigned char)*s;
		char esc[4];
		size_t k = 0, used = 1;
		uint32_t cp = c;
		if (c >= 0x80) {
			/* A whole character, copied whole; a byte of no valid
			 * sequence, or a control or bidi character (C1's CSI,
			 * NEL, an override), is escaped. */
			used = mt_utf8_seq((const unsigned char *)s, &cp);
			if (used == 0 || mt_cp_hostile(cp))
				used = 1;
			else
				k = used;
		}
		if (k) {
			memcpy(esc, s, k);
		} else if (c == '"' || c == '\\') {
			esc[k++] = '\\';
			esc[k++] = (char)c;
		} else if (c < 0x20 || c >= 0x7f) {
			esc[k++] = '\\';
			esc[k++] = 'x';
			esc[k++] = hex[c >> 4];
			esc[k++] = hex[c & 15];
		} else {
			esc[k++] = (char)c;
		}
		if (n + k + 2 > cap)
			break;
		memcpy(buf + n, esc, k);
		n += k;
		s += used;
	}
	buf[n++] = '"';
	buf[n] = '\0';
	return buf;
}

/* A line cut short by a failed write (a full disk, or no memory for a
 * tmpfs page): the next write ends it first, so that the line after it
 * does not run on from the middle of this one. */
static bool cut;

/* 0: all of it written; else how it failed: 1 nothing written, 2 a part
 * (nowhere to complain to, either way). */
static int write_some(const char *p, size_t len)
{
	size_t done = 0;
	while (done < len) {
		ssize_t w = write(STDERR_FILENO, p + done, len - done);
		if (w < 0 && errno == EINTR)
			continue;
		if (w <= 0)
			return done ? 2 : 1;
		done += (size_t)w;
	}
	return 0;
}

static void write_all(const char *p, size_t len)
{
	if (cut) {
		if (write_some("\n", 1) != 0)
			return; /* this line is lost too */
		cut = false;
	}
	if (write_some(p, len) == 2)
		cut = true;
}

static void vlog(enum mts_log_level level, const char *msg, const char *fmt,
                 va_list ap)
{
	char line[LINE_MAX_BYTES];
	char qmsg[MTS_LOGQ_MAX];
	struct timespec ts;
	struct tm tm;
	clock_gettime(CLOCK_REALTIME, &ts);
	gmtime_r(&ts.tv_sec, &tm);

	int n =
	    snprintf(line, sizeof(line),
	             "ts=%04d-%02d-%02dT%02d:%02d:%02d.%03ldZ level=%s msg=%s",
	             tm.tm_year + 1900, tm.tm_mon + 1, tm.tm_mday, tm.tm_hour,
	             tm.tm_min, tm.tm_sec, ts.tv_nsec / 1000000,
	             level_names[level], mts_logq(qmsg, sizeof(qmsg), msg));
	size_t len = n < 0 ? 0 : (size_t)n;
	if (len > sizeof(line) - 2)
		len = sizeof(line) - 2;
	if (fmt && *fmt && len < sizeof(line) - 3) {
		line[len++] = ' ';
		n = vsnprintf(line + len, sizeof(line) - 1 - len, fmt, ap);
		if (n > 0)
			len += (size_t)n;
		if (len > sizeof(line) - 2)
			len = sizeof(line) - 2;
	}
	line[len++] = '\n';
	write_all(line, len);
}

void mts_log(enum mts_log_level level, const char *msg, const char *fmt, ...)
{
	if (!mts_log_enabled(level))
		return;
	va_list ap;
	va_start(ap, fmt);
	vlog(level, msg, fmt, ap);
	va_end(ap);
}

/* ---- budgets ------------------------------------------------------------- */

#define PEER_ENTRIES  64u
#define PEER_KINDS    6u
#define KIND_MAX      96u
#define SCOPE_ENTRIES 64u
#define SCOPE_KEY_MAX 272u /* "group:" and a 255-byte name */

static unsigned long long held_by_uid, held_by_scope;

/* Lines held back for a uid or scope whose entry another one took over
 * within a second in which the entry's budget was spent: reported
 * together, once a second (mts_log_flush). Reporting them at each
 * takeover would let two keys that share an entry, taking turns, write a
 * line each time, past any budget. */
static struct displaced {
	unsigned long n;
	enum mts_log_level top;
	long long second;
} peers_displaced, scopes_displaced;

static void displace(struct displaced *d, unsigned long n,
                     enum mts_log_level top, long long now)
{
	d->n += n;
	if (top > d->top)
		d->top = top;
	d->second = now;
}

static void displaced_report(struct displaced *d, const char *what)
{
	if (!d->n)
		return;
	mts_log(d->top > MTS_LOG_WARN ? d->top : MTS_LOG_WARN,
	        "similar lines suppressed", "%s=several suppressed=%lu", what,
	        d->n);
	d->n = 0;
	d->top = MTS_LOG_DEBUG;
}

static long long mono_second(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (long long)ts.tv_sec;
}

/* Lines held back under one msg, so the summary says what they were. */
struct held_kind {
	char msg[KIND_MAX];
	unsigned long n;
};

static struct peer {
	unsigned uid;
	bool used;
	/* Lines written in `second`, by level: lines of one level never
	 * crowd out another's (a flood of grants leaves the uid's warnings
	 * their room, debug lines about its connections its grants). */
	unsigned count[4];
	unsigned long held;  /* lines held back, not reported yet */
	unsigned long other; /* of them, those of a kind not in kinds[] */
	struct held_kind kinds[PEER_KINDS];
	enum mts_log_level top; /* the highest level held back */
	long long second;       /* CLOCK_MONOTONIC seconds */
} peers[PEER_ENTRIES];

static void peer_report(struct peer *e)
{
	if (!e->held)
		return;
	char what[PEER_KINDS * (KIND_MAX + 24) + 32];
	char q[sizeof(what) + 16];
	size_t n = 0;
	what[0] = '\0';
	for (unsigned k = 0; k < PEER_KINDS && e->kinds[k].n; k++) {
		int w = snprintf(what + n, sizeof(what) - n, "%s%s (%lu)",
		                 n ? "; " : "", e->kinds[k].msg, e->kinds[k].n);
		if (w > 0 && (size_t)w < sizeof(what) - n)
			n += (size_t)w;
	}
	if (e->other)
		snprintf(what + n, sizeof(what) - n, "%sother (%lu)",
		         n ? "; " : "", e->other);
	/* A warning at least: a peer flooding the log is news. */
	mts_log(e->top > MTS_LOG_WARN ? e->top : MTS_LOG_WARN,
	        "similar lines suppressed",
	        "uid=%u suppressed=%lu budget_per_s=%u lines=%s", e->uid,
	        e->held, peer_burst, mts_logq(q, sizeof(q), what));
	e->held = 0;
	e->other = 0;
	e->top = MTS_LOG_DEBUG;
	memset(e->kinds, 0, sizeof(e->kinds));
}

/* The entry of `uid`, its second brought up to `now`. Uids that share an
 * entry share its counts within a second: taking the entry over does not
 * start a fresh budget, or two uids taking turns would have none. */
static struct peer *peer_entry(unsigned uid, long long now)
{
	unsigned i =
	    (unsigned)(((unsigned long long)uid * 0x9e3779b97f4a7c15ull) >>
	               58) %
	    PEER_ENTRIES;
	struct peer *e = &peers[i];
	if (e->used && e->uid != uid && e->held) {
		if (e->second == now && e->count[MTS_LOG_WARN] >= peer_burst) {
			displace(&peers_displaced, e->held, e->top, now);
			e->held = 0;
			e->other = 0;
			e->top = MTS_LOG_DEBUG;
			memset(e->kinds, 0, sizeof(e->kinds));
		} else {
			if (e->second == now)
				e->count[MTS_LOG_WARN]++;
			peer_report(e);
		}
	}
	e->used = true;
	e->uid = uid;
	if (e->second != now) {
		peer_report(e);
		e->second = now;
		memset(e->count, 0, sizeof(e->count));
	}
	return e;
}

static void peer_hold(struct peer *e, enum mts_log_level level, const char *msg)
{
	e->held++;
	held_by_uid++;
	if (level > e->top)
		e->top = level;
	for (unsigned k = 0; k < PEER_KINDS; k++) {
		struct held_kind *h = &e->kinds[k];
		if (!h->n) {
			snprintf(h->msg, sizeof(h->msg), "%s", msg);
			h->n = 1;
			return;
		}
		if (strncmp(h->msg, msg, sizeof(h->msg) - 1) == 0) {
			h->n++;
			return;
		}
	}
	e->other++;
}

void mts_log_set_budget(unsigned per_uid)
{
	budgeted = per_uid != 0;
	peer_burst = per_uid;
	scope_burst = per_uid / 2 ? per_uid / 2 : 1;
}

void mts_log_uid(unsigned uid, enum mts_log_level level, const char *msg,
                 const char *fmt, ...)
{
	if (!mts_log_enabled(level))
		return; /* not written, so not counted either */
	if (!budgeted) {
		va_list ap;
		va_start(ap, fmt);
		vlog(level, msg, fmt, ap);
		va_end(ap);
		return;
	}
	struct peer *e = peer_entry(uid, mono_second());
	unsigned *count = &e->count[level];
	if (*count >= peer_burst) {
		peer_hold(e, level, msg ? msg : "");
		return;
	}
	++*count;
	va_list ap;
	va_start(ap, fmt);
	vlog(level, msg, fmt, ap);
	va_end(ap);
}

static struct scope {
	bool used;
	char key[SCOPE_KEY_MAX];
	unsigned count;              /* lines written in `second` */
	unsigned long held;          /* lines held back, not reported yet */
	enum mts_log_level top;      /* the highest level held back */
	char msg[KIND_MAX];          /* the latest line held back ... */
	char fields[LINE_MAX_BYTES]; /* ... and its fields */
	long long second;
} scopes[SCOPE_ENTRIES];

/* The latest line held back, with how many were: where the scope ended
 * up, at the level of the worst of them (an `over` in the middle of a
 * flap still shows as a warning). */
static void scope_report(struct scope *e)
{
	if (!e->held)
		return;
	mts_log(e->top, e->msg, "%s%ssuppressed=%lu budget_per_s=%u", e->fields,
	        e->fields[0] ? " " : "", e->held, scope_burst);
	e->held = 0;
	e->top = MTS_LOG_DEBUG;
}

static struct scope *scope_entry(const char *key, long long now)
{
	uint64_t h = 1469598103934665603u;
	for (const char *c = key; *c; c++)
		h = (h ^ (unsigned char)*c) * 1099511628211u;
	struct scope *e = &scopes[h % SCOPE_ENTRIES];
	if (e->used && e->held &&
	    strncmp(e->key, key, sizeof(e->key) - 1) != 0) {
		/* As for uids: the entry's count goes on, and its report
		 * counts in it. */
		if (e->second == now && e->count >= scope_burst) {
			displace(&scopes_displaced, e->held, e->top, now);
			e->held = 0;
			e->top = MTS_LOG_DEBUG;
		} else {
			if (e->second == now)
				e->count++;
			scope_report(e);
		}
	}
	e->used = true;
	snprintf(e->key, sizeof(e->key), "%s", key);
	if (e->second != now) {
		scope_report(e);
		e->second = now;
		e->count = 0;
	}
	return e;
}

void mts_log_scope(const char *scope, enum mts_log_level level, const char *msg,
                   const char *fmt, ...)
{
	if (!mts_log_enabled(level))
		return;
	struct scope *e = scope_entry(scope, mono_second());
	va_list ap;
	va_start(ap, fmt);
	if (!budgeted || e->count < scope_burst) {
		e->count++;
		vlog(level, msg, fmt, ap);
	} else {
		e->held++;
		held_by_scope++;
		if (level > e->top)
			e->top = level;
		snprintf(e->msg, sizeof(e->msg), "%s", msg ? msg : "");
		e->fields[0] = '\0';
		if (fmt && *fmt)
			vsnprintf(e->fields, sizeof(e->fields), fmt, ap);
	}
	va_end(ap);
}

void mts_log_flush(bool all)
{
	long long now = mono_second();
	for (unsigned i = 0; i < PEER_ENTRIES; i++)
		if (peers[i].used && (all || peers[i].second != now))
			peer_report(&peers[i]);
	for (unsigned i = 0; i < SCOPE_ENTRIES; i++)
		if (scopes[i].used && (all || scopes[i].second != now))
			scope_report(&scopes[i]);
	if (all || peers_displaced.second != now)
		displaced_report(&peers_displaced, "uid");
	if (all || scopes_displaced.second != now)
		displaced_report(&scopes_displaced, "scope");
}

void mts_log_suppressed(unsigned long long *by_uid,
                        unsigned long long *by_scope)
{
	*by_uid = held_by_uid;
	*by_scope = held_by_scope;
}
