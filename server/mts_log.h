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

#include <stdbool.h>
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
 * Budgets. A line a peer can cause (a request and its answer, a worker
 * registering, exiting, exec'ing, crossing its limit, a refusal, a bad
 * frame) goes through mts_log_uid() under that peer's uid. Each uid may
 * write MTS_LOG_PEER_BURST lines a second at each level. The budget is
 * per level so that a flood of grants leaves the uid's first warning
 * visible, and debug lines about its connections leave its grants. Every
 * uid is budgeted, root and the server's own included: a scheduler
 * granting a thousand reservations a second fills a disk as surely as a
 * hostile peer. `uid` is UINT32_MAX for peers without credentials (TCP).
 * The lines held back are reported as one "similar lines suppressed" line,
 * listing them by msg with their counts, when the uid's next second
 * starts, or at the latest by mts_log_flush().
 *
 * A fleet's or group's state moves because of many uids, so its lines
 * go through mts_log_scope() under the scope's name instead: at most
 * MTS_LOG_SCOPE_BURST a second per scope. A second with lines held back
 * ends with one line: the latest of them, with suppressed=N (the lines
 * held back in that second, that one included), so the log still says
 * where the scope ended up.
 *
 * Lines only the operator causes (start, stop, reload, configuration)
 * use mts_log() and are never held back. A line at a level that is not
 * written is not counted either.
 */
#define MTS_LOG_PEER_BURST  10u
#define MTS_LOG_SCOPE_BURST 5u
/* [server] log_budget: the per-uid budget in force (the scopes' is half
 * of it, at least 1); 0 = no budget (every line written: for a debugging
 * session or a benchmark that reads every line). */
void mts_log_set_budget(unsigned per_uid);
void mts_log_uid(unsigned uid, enum mts_log_level level, const char *msg,
                 const char *fmt, ...) __attribute__((format(printf, 4, 5)));
void mts_log_scope(const char *scope, enum mts_log_level level, const char *msg,
                   const char *fmt, ...) __attribute__((format(printf, 4, 5)));

/* Report what the budgets held back in seconds now past (the server calls
 * it each tick), or everything held back when `all` (at stop). */
void mts_log_flush(bool all);

/* Lines held back since start, by uid and by scope budgets. */
void mts_log_suppressed(unsigned long long *by_uid,
                        unsigned long long *by_scope);

/* Quote `s` for a logfmt value into buf[0..cap): "..." with \", \\ and
 * control bytes escaped; truncated (still well-formed) if too long.
 * Returns buf. */
#define MTS_LOGQ_MAX 160
const char *mts_logq(char *buf, size_t cap, const char *s);

#endif /* MEMTALLY_SERVER_LOG_H */
