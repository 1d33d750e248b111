/*
 * mts_log.h - logfmt lines on stderr for memtallyd.
 *
 *   ts=2026-11-29T19:00:00.123Z level=info msg="worker registered" pid=123
 *
 * A line is built in one buffer and written with one write(2), so lines
 * never interleave. Values that come from peers (group, task, comm, paths)
 * must go through mts_logq(), which quotes and escapes them, so a worker
 * cannot forge fields or lines.
 */
#ifndef MEMTALLY_SERVER_LOG_H
#define MEMTALLY_SERVER_LOG_H

#include <stddef.h>

enum mts_log_level {
	MTS_LOG_DEBUG = 0,
	MTS_LOG_INFO = 1,
	MTS_LOG_WARN = 2,
	MTS_LOG_ERROR = 3,
};

/* Lines below `level` are dropped. Default: info. */
void mts_log_set_level(enum mts_log_level level);

/* "debug", "info", "warn" (or "warning"), "error" -> 0 and *out; else
 * -EINVAL. */
int mts_log_parse_level(const char *s, enum mts_log_level *out);

/* True when a line at `level` would be written. */
int mts_log_enabled(enum mts_log_level level);

/*
 * Write one line: ts, level, msg (always quoted), then `fmt` (printf-style
 * "key=value ..." pairs, may be NULL). Numbers may go in directly; strings
 * from outside must be passed through mts_logq(). Truncated at 1 KiB.
 */
void mts_log(enum mts_log_level level, const char *msg, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/*
 * Lines a peer can cause (refused requests, bad frames, denied
 * admissions, refused workers) are budgeted per peer uid, so that one
 * peer cannot flood the journal (which then drops everyone's lines):
 * at most MTS_LOG_PEER_BURST such lines per second per uid. Call
 * mts_log_peer(uid) before such a line and write it only when it returns
 * true; the lines it held back are reported as one "similar lines
 * suppressed" line when the uid's next second starts, or at the latest
 * by mts_log_peer_flush() (the server calls it each tick). `uid` is the
 * peer's uid, UINT32_MAX for peers without credentials (TCP).
 */
#define MTS_LOG_PEER_BURST 10u
int mts_log_peer(unsigned uid);
void mts_log_peer_flush(void);

/* Quote `s` for a logfmt value into buf[0..cap): "..." with \", \\ and
 * control bytes escaped; truncated (still well-formed) if too long.
 * Returns buf. */
#define MTS_LOGQ_MAX 160
const char *mts_logq(char *buf, size_t cap, const char *s);

#endif /* MEMTALLY_SERVER_LOG_H */
