/*
 * log.c - logfmt lines on stderr.
 *
 * Each line is formatted into a stack buffer and written with write(2) in
 * one piece (a short write is retried), so concurrent writers to the same
 * stderr (a journal, a terminal) never see half lines from us. Timestamps
 * are UTC with milliseconds. The level is a plain global: the server is
 * single-threaded. Peer-supplied strings are escaped by mts_logq(); a
 * line is cut at 1 KiB and always ends in a newline.
 *
 * The per-uid budget (mts_log_peer) is a small direct-mapped table: a
 * uid's entry counts its lines in the current second; a uid taking over
 * an entry first reports what the previous one had suppressed. Loop
 * thread only, like the rest of the server.
 */
#include "mts_log.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <strings.h>
#include <time.h>
#include <unistd.h>

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
	for (; s && *s; s++) {
		unsigned char c = (unsigned char)*s;
		char esc[4];
		size_t k = 0;
		if (c == '"' || c == '\\') {
			esc[k++] = '\\';
			esc[k++] = (char)c;
		} else if (c < 0x20 || c == 0x7f) {
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
	}
	buf[n++] = '"';
	buf[n] = '\0';
	return buf;
}

#define PEER_ENTRIES 64u

static struct {
	unsigned uid;
	int used;
	unsigned count;           /* lines written in `second` */
	unsigned long suppressed; /* lines held back, not reported yet */
	long long second;         /* CLOCK_MONOTONIC seconds */
} peers[PEER_ENTRIES];

static long long mono_second(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (long long)ts.tv_sec;
}

static void peer_report(unsigned i)
{
	if (!peers[i].suppressed)
		return;
	mts_log(MTS_LOG_WARN, "similar lines suppressed",
	        "uid=%u suppressed=%lu budget_per_s=%u", peers[i].uid,
	        peers[i].suppressed, MTS_LOG_PEER_BURST);
	peers[i].suppressed = 0;
}

int mts_log_peer(unsigned uid)
{
	unsigned i =
	    (unsigned)(((unsigned long long)uid * 0x9e3779b97f4a7c15ull) >>
	               58) %
	    PEER_ENTRIES;
	long long now = mono_second();
	if (!peers[i].used || peers[i].uid != uid) {
		if (peers[i].used)
			peer_report(i);
		peers[i].used = 1;
		peers[i].uid = uid;
		peers[i].count = 0;
		peers[i].suppressed = 0;
		peers[i].second = now;
	}
	if (peers[i].second != now) {
		peer_report(i);
		peers[i].second = now;
		peers[i].count = 0;
	}
	if (peers[i].count < MTS_LOG_PEER_BURST) {
		peers[i].count++;
		return 1;
	}
	peers[i].suppressed++;
	return 0;
}

void mts_log_peer_flush(void)
{
	long long now = mono_second();
	for (unsigned i = 0; i < PEER_ENTRIES; i++)
		if (peers[i].used && peers[i].suppressed &&
		    peers[i].second != now)
			peer_report(i);
}

static void write_all(const char *p, size_t len)
{
	while (len > 0) {
		ssize_t w = write(STDERR_FILENO, p, len);
		if (w < 0 && errno == EINTR)
			continue;
		if (w <= 0)
			return; /* nowhere to complain to */
		p += w;
		len -= (size_t)w;
	}
}

void mts_log(enum mts_log_level level, const char *msg, const char *fmt, ...)
{
	if (!mts_log_enabled(level))
		return;
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
		va_list ap;
		va_start(ap, fmt);
		n = vsnprintf(line + len, sizeof(line) - 1 - len, fmt, ap);
		va_end(ap);
		if (n > 0)
			len += (size_t)n;
		if (len > sizeof(line) - 2)
			len = sizeof(line) - 2;
	}
	line[len++] = '\n';
	write_all(line, len);
}
