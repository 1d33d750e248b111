/*
 * mtcommon.h - what the worker library, the CLI and memtallyd share, so
 * that each thing is done one way: the size syntax ("64KiB", "1.5G"), the
 * HOST:PORT syntax, the state names, saturating sums, waiting on a
 * descriptor with a deadline, and the defaults both sides assume.
 *
 * Nothing here allocates or keeps state; every function is safe on any
 * thread and inside the malloc interposer.
 */
#ifndef MTCOMMON_H
#define MTCOMMON_H

#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* Where memtallyd listens and the drift a worker flushes at, unless
 * configured otherwise. */
#define MT_DEFAULT_SOCKET    "/run/memtally/memtally.sock"
#define MT_DEFAULT_THRESHOLD (64u * 1024u)

/* a + b, or UINT64_MAX when it would wrap: byte sums that feed a limit
 * comparison must never come out small. */
static inline uint64_t mt_sat_add(uint64_t a, uint64_t b)
{
	uint64_t r;
	return __builtin_add_overflow(a, b, &r) ? UINT64_MAX : r;
}

/* A group, task or kind name: at most MT_NAME_MAX bytes of UTF-8 without
 * control or hostile code points (mt_cp_hostile). What memtallyd accepts,
 * and what the command line checks before it asks. */
#define MT_NAME_MAX 255u
bool mt_name_ok(const char *s);

/* qsort()/bsearch() comparators of uint32_t and uint64_t, ascending. */
int mt_cmp_u32(const void *a, const void *b);
int mt_cmp_u64(const void *a, const void *b);

/* "ok", "high", "over" for states 0, 1, 2 (as on the wire and in the
 * segment); "unknown" for anything else. */
const char *mt_state_name(unsigned state);

/*
 * A byte size as people write it: digits, an optional fraction (which
 * needs a unit) and a unit. K, M, G, T and Ki/KiB, ... are powers of 1024;
 * only KB, MB, GB, TB are powers of 1000; case-insensitive. No sign,
 * spaces or hex. 0, -EINVAL (not a size) or -ERANGE (past UINT64_MAX).
 */
int mt_parse_size(const char *s, uint64_t *out);

/* `bytes` for people ("1.1 GiB", "512 B") into buf; returns buf. */
const char *mt_format_size(char *buf, size_t cap, uint64_t bytes);

/*
 * Split "HOST:PORT" or "[IPV6]:PORT" into host (a NUL-terminated copy of
 * at most cap - 1 bytes, brackets removed) and port (decimal, 0..65535).
 * A bare IPv6 literal ("::1:9100") is ambiguous and refused. 0 or -EINVAL.
 */
int mt_split_hostport(const char *s, char *host, size_t cap, uint16_t *port);

/*
 * Length of the UTF-8 sequence at `s` (1..4; *cp = its code point), 0
 * when it is not valid UTF-8 (overlong, a surrogate, past U+10FFFF, cut
 * short: it stops at a NUL).
 */
size_t mt_utf8_seq(const unsigned char *s, uint32_t *cp);

/*
 * Make `s` valid UTF-8 in place: each byte that does not start a valid
 * sequence becomes '?'. For text the server built with a name in it and cut
 * to a buffer's size (snprintf cuts at a byte, maybe inside a character),
 * before it goes into a protobuf string, which a peer's decoder refuses
 * whole when it is not UTF-8.
 */
void mt_utf8_scrub(char *s);

/*
 * Code points that change how a terminal or a text view shows what
 * follows: C0 and C1 controls (U+009B is CSI, U+009D OSC), DEL, the line
 * and paragraph separators, and the bidirectional marks, embeddings,
 * overrides and isolates. A name another
 * user chose must carry none of them to a log line or a terminal.
 */
bool mt_cp_hostile(uint32_t c);

/* pthread_create's signature (the preload passes libc's own, past its
 * wrapper). */
typedef int (*mt_thread_create_fn)(pthread_t *, const pthread_attr_t *,
                                   void *(*)(void *), void *);

/*
 * Start fn(arg) on a detached thread of `stack` bytes that takes none of
 * the process's signals: all are blocked from its first instruction (it
 * inherits the mask set around its creation). `create`: NULL for
 * pthread_create. 0 or -errno; the thread in *tid when tid is not NULL.
 */
int mt_thread_detached(mt_thread_create_fn create, void *(*fn)(void *),
                       void *arg, size_t stack, pthread_t *tid);

/* CLOCK_MONOTONIC in nanoseconds. */
uint64_t mt_mono_ns(void);

/*
 * Wait until `fd` is ready for `events` (poll(2) bits) or the monotonic
 * deadline (mt_mono_ns() time; UINT64_MAX: none) passes. Errors and
 * hang-ups count as ready: the following send/recv reports them. 0,
 * -ETIMEDOUT or -errno; EINTR is retried.
 */
int mt_wait_fd(int fd, short events, uint64_t deadline_ns);

/*
 * Send all `len` bytes on a stream socket before the deadline (as for
 * mt_wait_fd), never raising SIGPIPE. 0, -ETIMEDOUT, -ECONNRESET (the
 * peer is gone) or -errno.
 */
int mt_send_all(int fd, const void *buf, size_t len, uint64_t deadline_ns);

#endif /* MTCOMMON_H */
