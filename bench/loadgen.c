/*
 * loadgen.c - scheduler-side load on a real memtallyd (the `loadgen`
 * suite: many connections, and Admit decisions per second).
 *
 * Opens C connections to memtallyd's Unix socket and keeps every one busy
 * for --seconds: each connection has K requests in flight (--inflight,
 * default 1) and, as each answer arrives, sends the next of its mix:
 *   mix "cycle"  GetUsage, Admit, GetUsage, Release (of its own reservation)
 *   mix "admit"  Admit, Release, Admit, Release, ...
 *   mix "usage"  GetUsage only
 * Admit asks for --admit-bytes with --ttl seconds. A Release is sent only
 * for a reservation this connection was granted (when none is held, the
 * slot of the mix becomes a GetUsage in "cycle", an Admit in "admit").
 * Requests are raw frames (varint length + protobuf Request, packed with
 * protobuf-c); answers are decoded by a strict wire parser here (ids,
 * error, body, admitted, reservation), cheaper than protobuf-c's unpack so
 * that the client is not the bottleneck.
 *
 * Connections are spread over --threads threads, each with its own epoll
 * loop. Each request's latency (from the write that carried it to the
 * parse of its answer) goes into a log-linear histogram (~3% resolution)
 * per request type; requests sent before --warmup seconds are answered
 * but not counted.
 *
 * Proof: every answer must be the answer of the request at the head of
 * its connection's queue (ids in order), carry no error and the body
 * asked for; an Admit may be granted (with a reservation "r-" + 16 hex
 * digits) or denied (with a reason); a Release must release what was
 * granted. Anything else -- an error response, a closed connection, a
 * garbled frame, an answer missing after the end (--drain-ms) -- is
 * counted as an error, and any error makes the exit status 3. At the end
 * every connection releases the reservations it still holds, so a server
 * is left with none of ours.
 *
 * --hold R first takes R reservations (Admit, TTL longer than the run) on
 * a connection of its own and releases them all after the run, so that
 * the mix runs against R outstanding reservations.
 *
 * Prints one JSON object on stdout: `requests` are those timed (sent after
 * the warm-up, before the end), `answered` every answer of the run.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include "memtally.pb-c.h"
#include "mtframe.h"

#include "bench_common.h"

#define MAX_INFLIGHT 64
#define RBUF_SIZE    (256u * 1024u)
#define WBUF_SIZE    (MAX_INFLIGHT * 256u)
#define RES_LEN      18 /* "r-" + 16 hex digits */

enum rtype { T_USAGE, T_ADMIT, T_RELEASE, T__COUNT };
static const char *const type_name[T__COUNT] = {"get_usage", "admit",
                                                "release"};

enum errkind {
	E_SERVER,   /* an error response */
	E_MISMATCH, /* wrong id, wrong body, bad reservation */
	E_GARBLED,  /* a frame that does not parse */
	E_CLOSED,   /* the server closed or reset the connection */
	E_TIMEOUT,  /* answers still missing after the drain */
	E_CONNECT,  /* could not connect */
	E_NOTFOUND, /* Release of our own live reservation: not found */
	E__COUNT
};
static const char *const err_name[E__COUNT] = {
    [E_SERVER] = "server_error",       [E_MISMATCH] = "mismatch",
    [E_GARBLED] = "garbled",           [E_CLOSED] = "closed",
    [E_TIMEOUT] = "timeout",           [E_CONNECT] = "connect",
    [E_NOTFOUND] = "release_not_found"};

/* ---- histogram -------------------------------------------------------- */

/* Log-linear: values < 32 ns exact, then 32 sub-buckets per power of two. */
#define H_SUB     32
#define H_BUCKETS (H_SUB + 40 * H_SUB)

struct hist {
	uint64_t n[H_BUCKETS];
	uint64_t count;
	uint64_t max;
	uint64_t sum;
};

static unsigned h_index(uint64_t v)
{
	if (v < H_SUB)
		return (unsigned)v;
	unsigned e = 63u - (unsigned)__builtin_clzll(v); /* >= 5 */
	unsigned sub = (unsigned)(v >> (e - 5)) - H_SUB;
	unsigned idx = H_SUB + (e - 5) * H_SUB + sub;
	return idx < H_BUCKETS ? idx : H_BUCKETS - 1;
}

/* Middle of bucket idx, ns. */
static double h_value(unsigned idx)
{
	if (idx < H_SUB)
		return idx;
	unsigned e = (idx - H_SUB) / H_SUB + 5;
	unsigned sub = (idx - H_SUB) % H_SUB;
	double lo = (double)((uint64_t)(H_SUB + sub) << (e - 5));
	return lo + (double)(1ull << (e - 5)) / 2;
}

static void h_add(struct hist *h, uint64_t v)
{
	h->n[h_index(v)]++;
	h->count++;
	h->sum += v;
	if (v > h->max)
		h->max = v;
}

static void h_merge(struct hist *to, const struct hist *from)
{
	for (unsigned i = 0; i < H_BUCKETS; i++)
		to->n[i] += from->n[i];
	to->count += from->count;
	to->sum += from->sum;
	if (from->max > to->max)
		to->max = from->max;
}

static double h_pct(const struct hist *h, double q)
{
	if (!h->count)
		return 0;
	uint64_t rank = (uint64_t)(q * (double)h->count);
	if (rank >= h->count)
		rank = h->count - 1;
	uint64_t seen = 0;
	for (unsigned i = 0; i < H_BUCKETS; i++) {
		seen += h->n[i];
		if (seen > rank) {
			double v = h_value(i);
			return v > (double)h->max ? (double)h->max : v;
		}
	}
	return (double)h->max;
}

/* ---- options ---------------------------------------------------------- */

enum mix { MIX_CYCLE, MIX_ADMIT, MIX_USAGE };

static const char *opt_socket;
static int opt_conns = 16;
static int opt_threads = 1;
static int opt_inflight = 1;
static double opt_seconds = 5;
static double opt_warmup = 0.3;
static enum mix opt_mix = MIX_CYCLE;
static uint64_t opt_admit_bytes = 1u << 20;
static uint32_t opt_ttl = 60;
static const char *opt_group = "";
static int opt_drain_ms = 5000;
static int opt_hold;

/* ---- wire parsing ------------------------------------------------------ */

static int get_varint(const uint8_t **p, const uint8_t *end, uint64_t *v)
{
	uint64_t r = 0;
	for (unsigned shift = 0; shift < 70; shift += 7) {
		if (*p >= end)
			return -1;
		uint8_t b = *(*p)++;
		r |= (uint64_t)(b & 0x7f) << shift;
		if (!(b & 0x80)) {
			*v = r;
			return 0;
		}
	}
	return -1;
}

/* One field: its number, wire type, and (varint) value or (LEN) slice. */
struct field {
	uint32_t num;
	uint32_t wt;
	uint64_t v;
	const uint8_t *data;
	size_t len;
};

/* Returns 1 with a field, 0 at the end, -1 when malformed. */
static int next_field(const uint8_t **p, const uint8_t *end, struct field *f)
{
	if (*p == end)
		return 0;
	uint64_t key;
	if (get_varint(p, end, &key) || (key >> 3) == 0 ||
	    (key >> 3) > 536870911)
		return -1;
	f->num = (uint32_t)(key >> 3);
	f->wt = (uint32_t)(key & 7);
	switch (f->wt) {
	case 0:
		return get_varint(p, end, &f->v) ? -1 : 1;
	case 1:
		if (end - *p < 8)
			return -1;
		*p += 8;
		return 1;
	case 5:
		if (end - *p < 4)
			return -1;
		*p += 4;
		return 1;
	case 2:
		if (get_varint(p, end, &f->v) || f->v > (uint64_t)(end - *p))
			return -1;
		f->data = *p;
		f->len = (size_t)f->v;
		*p += f->len;
		return 1;
	default:
		return -1;
	}
}

/* Check that a sub-message is well-formed (every field parses). */
static int wellformed(const uint8_t *p, size_t len)
{
	const uint8_t *end = p + len;
	struct field f;
	int r;
	while ((r = next_field(&p, end, &f)) == 1)
		;
	return r;
}

struct answer {
	uint64_t id;
	bool has_error;
	uint64_t error_code;
	uint32_t body; /* Response field number of the body, 0 = none */
	bool admitted;
	char reservation[RES_LEN + 1];
	bool has_reason;
};

static int parse_answer(const uint8_t *p, size_t len, struct answer *a)
{
	const uint8_t *end = p + len;
	struct field f;
	int r;
	memset(a, 0, sizeof(*a));
	while ((r = next_field(&p, end, &f)) == 1) {
		if (f.num == 1 && f.wt == 0) {
			a->id = f.v;
		} else if (f.num == 2 && f.wt == 2) {
			a->has_error = true;
			const uint8_t *q = f.data, *qe = f.data + f.len;
			struct field g;
			int s;
			while ((s = next_field(&q, qe, &g)) == 1)
				if (g.num == 1 && g.wt == 0)
					a->error_code = g.v;
			if (s < 0)
				return -1;
		} else if (f.num >= 3 && f.num <= 9 && f.wt == 2) {
			if (a->body)
				return -1; /* two bodies of a oneof */
			a->body = f.num;
			const uint8_t *q = f.data, *qe = f.data + f.len;
			struct field g;
			int s;
			if (f.num != 6 && f.num != 7) {
				if (wellformed(f.data, f.len) < 0)
					return -1;
				continue;
			}
			while ((s = next_field(&q, qe, &g)) == 1) {
				if (f.num == 6 && g.num == 1 && g.wt == 0)
					a->admitted = g.v != 0;
				else if (g.num == (f.num == 6 ? 2u : 1u) &&
				         g.wt == 2) {
					if (g.len > RES_LEN)
						return -1;
					memcpy(a->reservation, g.data, g.len);
					a->reservation[g.len] = 0;
				} else if (f.num == 6 && g.num == 3 &&
				           g.wt == 2 && g.len > 0)
					a->has_reason = true;
			}
			if (s < 0)
				return -1;
		}
	}
	return r;
}

static bool valid_reservation(const char *s)
{
	if (strlen(s) != RES_LEN || s[0] != 'r' || s[1] != '-')
		return false;
	for (int i = 2; i < RES_LEN; i++)
		if (!strchr("0123456789abcdefABCDEF", s[i]))
			return false;
	return true;
}

/* ---- connections ------------------------------------------------------- */

struct pend {
	uint64_t id;
	uint64_t t0;
	uint8_t type;
	bool counted; /* sent after the warm-up and before the end */
};

struct conn {
	int fd;
	bool dead;
	bool want_out; /* EPOLLOUT registered */
	uint8_t *rbuf;
	size_t rlen;
	uint8_t wbuf[WBUF_SIZE];
	size_t woff, wlen;
	struct pend q[MAX_INFLIGHT];
	unsigned qh, qn;
	/* reservations granted and not yet released, and those with a
	 * Release in flight */
	char held[MAX_INFLIGHT][RES_LEN + 1];
	unsigned nheld;
	unsigned admits_inflight;
	uint64_t seq;
	uint64_t next_id;
};

struct worker {
	pthread_t th;
	int idx;
	int epfd;
	struct conn *conns;
	int nconns;
	struct hist h[T__COUNT];
	uint64_t granted, denied, released;
	uint64_t err[E__COUNT];
	char first_err[200];
	uint64_t sent_total, answered_total;
};

static uint64_t t_start, t_warm, t_end;
static atomic_int ready_threads;

static void fail(struct worker *w, struct conn *c, enum errkind k,
                 const char *what)
{
	w->err[k]++;
	if (!w->first_err[0])
		snprintf(w->first_err, sizeof(w->first_err), "%s: %s",
		         err_name[k], what);
	if (c && !c->dead) {
		c->dead = true;
		epoll_ctl(w->epfd, EPOLL_CTL_DEL, c->fd, NULL);
		close(c->fd);
		c->fd = -1;
	}
}

static int connect_one(void)
{
	int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
	if (fd < 0)
		return -errno;
	struct sockaddr_un sa = {.sun_family = AF_UNIX};
	snprintf(sa.sun_path, sizeof(sa.sun_path), "%s", opt_socket);
	/* A burst of hundreds of connects may overflow the listen backlog
	 * for a moment (EAGAIN on a Unix socket): retry briefly. */
	for (int tries = 0;; tries++) {
		if (connect(fd, (struct sockaddr *)&sa, sizeof(sa)) == 0)
			break;
		if (errno != EAGAIN || tries > 200) {
			int e = -errno;
			close(fd);
			return e;
		}
		struct timespec ts = {0, 5000000};
		nanosleep(&ts, NULL);
	}
	return fd;
}

/* Append one request of type t (for release: reservation r) to c->wbuf. */
static int queue_request(struct conn *c, enum rtype t, const char *r,
                         uint64_t t0, bool counted)
{
	Memtally__V1__Request rq = MEMTALLY__V1__REQUEST__INIT;
	Memtally__V1__GetUsage gu = MEMTALLY__V1__GET_USAGE__INIT;
	Memtally__V1__Admit ad = MEMTALLY__V1__ADMIT__INIT;
	Memtally__V1__Release rl = MEMTALLY__V1__RELEASE__INIT;
	rq.id = c->next_id++;
	switch (t) {
	case T_USAGE:
		rq.body_case = MEMTALLY__V1__REQUEST__BODY_GET_USAGE;
		rq.get_usage = &gu;
		break;
	case T_ADMIT:
		ad.bytes = opt_admit_bytes;
		ad.group = (char *)opt_group;
		ad.ttl_seconds = opt_ttl;
		rq.body_case = MEMTALLY__V1__REQUEST__BODY_ADMIT;
		rq.admit = &ad;
		break;
	default:
		rl.reservation = (char *)r;
		rq.body_case = MEMTALLY__V1__REQUEST__BODY_RELEASE;
		rq.release = &rl;
		break;
	}
	if (c->woff == c->wlen)
		c->woff = c->wlen = 0;
	size_t k = mtframe_pack(&rq.base, c->wbuf + c->wlen,
	                        sizeof(c->wbuf) - c->wlen);
	if (!k)
		return -1;
	c->wlen += k;
	struct pend *p = &c->q[(c->qh + c->qn) % MAX_INFLIGHT];
	p->id = rq.id;
	p->t0 = t0;
	p->type = (uint8_t)t;
	p->counted = counted;
	c->qn++;
	return 0;
}

/* Take a held reservation (not already being released) for a Release. */
static const char *take_held(struct conn *c)
{
	if (!c->nheld)
		return NULL;
	return c->held[--c->nheld];
}

static void fill(struct worker *w, struct conn *c, uint64_t now, bool running)
{
	char rel[RES_LEN + 1];
	if (!running) {
		/* Wind down: release what we hold, nothing else. */
		while (c->nheld && c->qn < MAX_INFLIGHT) {
			snprintf(rel, sizeof(rel), "%s", take_held(c));
			if (queue_request(c, T_RELEASE, rel, now, false))
				break;
		}
		return;
	}
	bool counted = now >= t_warm;
	while (c->qn < (unsigned)opt_inflight) {
		enum rtype t;
		uint64_t s = c->seq++;
		switch (opt_mix) {
		case MIX_USAGE:
			t = T_USAGE;
			break;
		case MIX_ADMIT:
			t = (s & 1) ? T_RELEASE : T_ADMIT;
			if (t == T_RELEASE && !c->nheld)
				t = T_ADMIT;
			break;
		default:
			t = (s & 3) == 1   ? T_ADMIT
			    : (s & 3) == 3 ? T_RELEASE
			                   : T_USAGE;
			if (t == T_RELEASE && !c->nheld)
				t = T_USAGE;
			break;
		}
		/* Bound what one connection holds. */
		if (t == T_ADMIT &&
		    c->nheld + c->admits_inflight >= MAX_INFLIGHT / 2)
			t = c->nheld ? T_RELEASE : T_USAGE;
		const char *r = NULL;
		if (t == T_RELEASE) {
			snprintf(rel, sizeof(rel), "%s", take_held(c));
			r = rel;
		}
		if (t == T_ADMIT)
			c->admits_inflight++;
		if (queue_request(c, t, r, now, counted)) {
			fail(w, c, E_MISMATCH, "request does not fit");
			return;
		}
	}
}

static void flush_out(struct worker *w, struct conn *c)
{
	while (c->woff < c->wlen) {
		ssize_t n = send(c->fd, c->wbuf + c->woff, c->wlen - c->woff,
		                 MSG_NOSIGNAL | MSG_DONTWAIT);
		if (n > 0) {
			c->woff += (size_t)n;
			w->sent_total++;
			continue;
		}
		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
			if (!c->want_out) {
				struct epoll_event ev = {.events =
				                             EPOLLIN | EPOLLOUT,
				                         .data.ptr = c};
				epoll_ctl(w->epfd, EPOLL_CTL_MOD, c->fd, &ev);
				c->want_out = true;
			}
			return;
		}
		fail(w, c, E_CLOSED, strerror(errno));
		return;
	}
	c->woff = c->wlen = 0;
	if (c->want_out) {
		struct epoll_event ev = {.events = EPOLLIN, .data.ptr = c};
		epoll_ctl(w->epfd, EPOLL_CTL_MOD, c->fd, &ev);
		c->want_out = false;
	}
}

static void handle_answer(struct worker *w, struct conn *c,
                          const struct answer *a, uint64_t now)
{
	if (!c->qn) {
		fail(w, c, E_MISMATCH, "an answer nobody asked for");
		return;
	}
	struct pend *p = &c->q[c->qh];
	if (a->id != p->id) {
		char m[96];
		snprintf(m, sizeof(m),
		         "answer id %" PRIu64 ", expected %" PRIu64, a->id,
		         p->id);
		fail(w, c, E_MISMATCH, m);
		return;
	}
	enum rtype t = (enum rtype)p->type;
	if (a->has_error) {
		char m[96];
		snprintf(m, sizeof(m), "%s answered error code %" PRIu64,
		         type_name[t], a->error_code);
		/* ERROR_NOT_FOUND on the Release of a reservation we were
		 * granted (and whose TTL has not run out) is lost state. */
		fail(w, c,
		     t == T_RELEASE && a->error_code == 2 ? E_NOTFOUND
		                                          : E_SERVER,
		     m);
		return;
	}
	static const uint32_t want_body[T__COUNT] = {4, 6, 7};
	if (a->body != want_body[t]) {
		fail(w, c, E_MISMATCH, "wrong body for the request");
		return;
	}
	if (t == T_ADMIT) {
		c->admits_inflight--;
		if (a->admitted) {
			if (!valid_reservation(a->reservation)) {
				fail(w, c, E_MISMATCH, "bad reservation id");
				return;
			}
			memcpy(c->held[c->nheld++], a->reservation,
			       RES_LEN + 1);
			if (p->counted)
				w->granted++;
		} else {
			if (!a->has_reason || a->reservation[0]) {
				fail(w, c, E_MISMATCH,
				     "denial without a reason");
				return;
			}
			if (p->counted)
				w->denied++;
		}
	} else if (t == T_RELEASE) {
		if (!valid_reservation(a->reservation)) {
			fail(w, c, E_MISMATCH, "Released without the id");
			return;
		}
		if (p->counted)
			w->released++;
	}
	if (p->counted && p->t0 < t_end)
		h_add(&w->h[t], now - p->t0);
	w->answered_total++;
	c->qh = (c->qh + 1) % MAX_INFLIGHT;
	c->qn--;
}

static void on_readable(struct worker *w, struct conn *c)
{
	for (;;) {
		ssize_t n = recv(c->fd, c->rbuf + c->rlen, RBUF_SIZE - c->rlen,
		                 MSG_DONTWAIT);
		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
			break;
		if (n <= 0) {
			fail(w, c, E_CLOSED,
			     n == 0 ? "server closed the connection"
			            : strerror(errno));
			return;
		}
		c->rlen += (size_t)n;
		uint64_t now = bench_now_ns();
		size_t off = 0;
		for (;;) {
			uint64_t blen;
			int k = mtframe_decode_len(c->rbuf + off, c->rlen - off,
			                           MTFRAME_DEFAULT_MAX, &blen);
			if (k < 0) {
				fail(w, c, E_GARBLED, "bad length prefix");
				return;
			}
			if (k == 0 || c->rlen - off < (size_t)k + blen)
				break;
			struct answer a;
			if (parse_answer(c->rbuf + off + (size_t)k,
			                 (size_t)blen, &a) < 0) {
				fail(w, c, E_GARBLED, "undecodable response");
				return;
			}
			handle_answer(w, c, &a, now);
			if (c->dead)
				return;
			off += (size_t)k + blen;
		}
		if (off) {
			memmove(c->rbuf, c->rbuf + off, c->rlen - off);
			c->rlen -= off;
		}
		if (c->rlen == RBUF_SIZE) {
			fail(w, c, E_GARBLED, "a response over 256 KiB");
			return;
		}
		if ((size_t)n < RBUF_SIZE / 2)
			break;
	}
	uint64_t now = bench_now_ns();
	fill(w, c, now, now < t_end);
	flush_out(w, c);
}

static void *run_worker(void *arg)
{
	struct worker *w = arg;
	struct epoll_event evs[256];
	atomic_fetch_add(&ready_threads, 1);
	while (bench_now_ns() < t_start)
		;
	uint64_t now = bench_now_ns();
	for (int i = 0; i < w->nconns; i++) {
		struct conn *c = &w->conns[i];
		if (c->dead)
			continue;
		fill(w, c, now, true);
		flush_out(w, c);
	}
	uint64_t hard_end = t_end + (uint64_t)opt_drain_ms * 1000000u;
	for (;;) {
		now = bench_now_ns();
		bool busy = false;
		for (int i = 0; i < w->nconns; i++) {
			struct conn *c = &w->conns[i];
			if (c->dead)
				continue;
			if (now >= t_end && !c->qn && c->nheld) {
				fill(w, c, now, false);
				flush_out(w, c);
			}
			if (c->qn || c->nheld)
				busy = true;
		}
		if (!busy && now >= t_end)
			break;
		if (now >= hard_end) {
			for (int i = 0; i < w->nconns; i++) {
				struct conn *c = &w->conns[i];
				if (!c->dead && (c->qn || c->nheld))
					fail(w, c, E_TIMEOUT,
					     "answers missing after the drain");
			}
			break;
		}
		int n = epoll_wait(w->epfd, evs, 256, 50);
		for (int i = 0; i < n; i++) {
			struct conn *c = evs[i].data.ptr;
			if (c->dead)
				continue;
			if (evs[i].events & EPOLLOUT)
				flush_out(w, c);
			if (!c->dead &&
			    (evs[i].events & (EPOLLIN | EPOLLHUP | EPOLLERR)))
				on_readable(w, c);
		}
	}
	return NULL;
}

/* ---- --hold: reservations outstanding for the whole run ---------------- */

/* On one blocking connection of its own, send `n` requests (Admit of
 * opt_admit_bytes with a TTL of the run's length and some, or Release of
 * ids[i]) in windows of 32 and check every answer. Admit stores the ids.
 * Returns 0 or -1 with *why set. */
static int hold_batch(int fd, bool admit, char (*ids)[RES_LEN + 1], int n,
                      const char **why)
{
	static uint8_t wb[32 * 128], rb[RBUF_SIZE];
	size_t rlen = 0;
	uint32_t ttl = (uint32_t)(opt_seconds + opt_warmup) + 120;
	for (int base = 0; base < n; base += 32) {
		int k = n - base < 32 ? n - base : 32;
		size_t wl = 0;
		for (int i = 0; i < k; i++) {
			Memtally__V1__Request rq = MEMTALLY__V1__REQUEST__INIT;
			Memtally__V1__Admit ad = MEMTALLY__V1__ADMIT__INIT;
			Memtally__V1__Release rl = MEMTALLY__V1__RELEASE__INIT;
			rq.id = (uint64_t)(base + i) + 1;
			if (admit) {
				ad.bytes = opt_admit_bytes;
				ad.group = (char *)opt_group;
				ad.ttl_seconds = ttl;
				rq.body_case =
				    MEMTALLY__V1__REQUEST__BODY_ADMIT;
				rq.admit = &ad;
			} else {
				rl.reservation = ids[base + i];
				rq.body_case =
				    MEMTALLY__V1__REQUEST__BODY_RELEASE;
				rq.release = &rl;
			}
			wl += mtframe_pack(&rq.base, wb + wl, sizeof(wb) - wl);
		}
		for (size_t off = 0; off < wl;) {
			ssize_t w = send(fd, wb + off, wl - off, MSG_NOSIGNAL);
			if (w <= 0) {
				*why = "hold: write failed";
				return -1;
			}
			off += (size_t)w;
		}
		for (int i = 0; i < k;) {
			uint64_t blen;
			int pre = mtframe_decode_len(
			    rb, rlen, MTFRAME_DEFAULT_MAX, &blen);
			if (pre < 0) {
				*why = "hold: bad length prefix";
				return -1;
			}
			if (pre == 0 || rlen < (size_t)pre + blen) {
				ssize_t r =
				    recv(fd, rb + rlen, RBUF_SIZE - rlen, 0);
				if (r <= 0) {
					*why = "hold: connection closed";
					return -1;
				}
				rlen += (size_t)r;
				continue;
			}
			struct answer a;
			if (parse_answer(rb + pre, (size_t)blen, &a) < 0 ||
			    a.id != (uint64_t)(base + i) + 1 || a.has_error ||
			    a.body != (admit ? 6u : 7u) ||
			    !valid_reservation(a.reservation) ||
			    (admit && !a.admitted)) {
				*why = admit ? "hold: an Admit was not granted"
				             : "hold: a Release failed";
				return -1;
			}
			if (admit)
				memcpy(ids[base + i], a.reservation,
				       RES_LEN + 1);
			memmove(rb, rb + (size_t)pre + blen,
			        rlen - (size_t)pre - blen);
			rlen -= (size_t)pre + blen;
			i++;
		}
	}
	return 0;
}

static void json_hist(const char *name, const struct hist *h, double secs,
                      bool comma)
{
	printf("\"%s\": {\"count\": %" PRIu64 ", \"per_second\": %.0f, "
	       "\"mean_us\": %.2f, \"p50_us\": %.2f, \"p99_us\": %.2f, "
	       "\"p999_us\": %.2f, \"max_us\": %.2f}%s",
	       name, h->count, (double)h->count / secs,
	       h->count ? (double)h->sum / (double)h->count / 1e3 : 0.0,
	       h_pct(h, 0.50) / 1e3, h_pct(h, 0.99) / 1e3,
	       h_pct(h, 0.999) / 1e3, (double)h->max / 1e3, comma ? ", " : "");
}

static void usage(void)
{
	fprintf(stderr,
	        "usage: bench_loadgen_client --socket PATH [--connections C] "
	        "[--threads N]\n"
	        "         [--inflight K] [--seconds D] [--warmup S] "
	        "[--mix cycle|admit|usage]\n"
	        "         [--admit-bytes B] [--ttl S] [--group G] "
	        "[--drain-ms MS]\n"
	        "         [--hold R]\n");
}

/* ---- the run --------------------------------------------------------- */

/* The command line into the opt_ globals. Returns 0, or -1 (usage
 * printed). */
static int parse_args(int argc, char **argv)
{
	for (int i = 1; i < argc; i++) {
		const char *a = argv[i];
		const char *v = i + 1 < argc ? argv[i + 1] : NULL;
		if (!v)
			goto bad;
		i++;
		if (!strcmp(a, "--socket"))
			opt_socket = v;
		else if (!strcmp(a, "--connections"))
			opt_conns = atoi(v);
		else if (!strcmp(a, "--threads"))
			opt_threads = atoi(v);
		else if (!strcmp(a, "--inflight"))
			opt_inflight = atoi(v);
		else if (!strcmp(a, "--seconds"))
			opt_seconds = atof(v);
		else if (!strcmp(a, "--warmup"))
			opt_warmup = atof(v);
		else if (!strcmp(a, "--admit-bytes"))
			opt_admit_bytes = strtoull(v, NULL, 10);
		else if (!strcmp(a, "--ttl"))
			opt_ttl = (uint32_t)atoi(v);
		else if (!strcmp(a, "--group"))
			opt_group = v;
		else if (!strcmp(a, "--drain-ms"))
			opt_drain_ms = atoi(v);
		else if (!strcmp(a, "--hold"))
			opt_hold = atoi(v);
		else if (!strcmp(a, "--mix") && !strcmp(v, "cycle"))
			opt_mix = MIX_CYCLE;
		else if (!strcmp(a, "--mix") && !strcmp(v, "admit"))
			opt_mix = MIX_ADMIT;
		else if (!strcmp(a, "--mix") && !strcmp(v, "usage"))
			opt_mix = MIX_USAGE;
		else
			goto bad;
	}
	if (!opt_socket || opt_conns < 1 || opt_threads < 1 ||
	    opt_inflight < 1 || opt_inflight > MAX_INFLIGHT / 2 ||
	    opt_seconds <= 0 || opt_admit_bytes == 0 || opt_hold < 0)
		goto bad;
	if (opt_threads > opt_conns)
		opt_threads = opt_conns;
	return 0;
bad:
	usage();
	return -1;
}

/* One fd per connection, plus epoll and a margin. */
static void raise_fd_limit(void)
{
	struct rlimit rl;
	if (getrlimit(RLIMIT_NOFILE, &rl) == 0 &&
	    rl.rlim_cur < (rlim_t)opt_conns + 64) {
		rl.rlim_cur = rl.rlim_max < (rlim_t)opt_conns + 64
		                  ? rl.rlim_max
		                  : (rlim_t)opt_conns + 64;
		setrlimit(RLIMIT_NOFILE, &rl);
	}
}

/* The threads and their connections (thread t has connections t, t + N,
 * t + 2N, ...), connected; a connection that fails is dead and counted,
 * the first failure's message kept in `connect_msg`. Returns 0 or -1. */
static int connect_all(struct worker *ws, struct conn *conns, char *connect_msg,
                       size_t msg_size)
{
	for (int t = 0; t < opt_threads; t++) {
		struct worker *w = &ws[t];
		w->idx = t;
		w->epfd = epoll_create1(EPOLL_CLOEXEC);
		if (w->epfd < 0)
			return -1;
		int first = opt_conns * t / opt_threads;
		int last = opt_conns * (t + 1) / opt_threads;
		w->conns = conns + first;
		w->nconns = last - first;
	}
	for (int t = 0; t < opt_threads; t++) {
		struct worker *w = &ws[t];
		for (int i = 0; i < w->nconns; i++) {
			struct conn *c = &w->conns[i];
			c->next_id = 1;
			c->rbuf = malloc(RBUF_SIZE);
			if (!c->rbuf)
				return -1;
			c->fd = connect_one();
			if (c->fd < 0) {
				if (!connect_msg[0])
					snprintf(connect_msg, msg_size,
					         "connect %s: %s", opt_socket,
					         strerror(-c->fd));
				c->dead = true;
				w->err[E_CONNECT]++;
				continue;
			}
			struct epoll_event ev = {.events = EPOLLIN,
			                         .data.ptr = c};
			epoll_ctl(w->epfd, EPOLL_CTL_ADD, c->fd, &ev);
		}
	}
	return 0;
}

/* --hold R: reservations held for the whole run, on a connection of their
 * own (so the server keeps R outstanding while the mix runs). */
struct held {
	char (*ids)[RES_LEN + 1];
	int fd;
};

static int hold_start(struct held *h)
{
	const char *err = NULL;
	h->ids = calloc((size_t)opt_hold, sizeof(*h->ids));
	h->fd = connect_one();
	if (!h->ids || h->fd < 0) {
		fprintf(stderr, "PROOF FAILED: --hold: cannot connect\n");
		return -1;
	}
	if (hold_batch(h->fd, true, h->ids, opt_hold, &err)) {
		fprintf(stderr, "PROOF FAILED: %s\n", err);
		return -1;
	}
	return 0;
}

/* Release them; a failure is an error of the run (thread 0's). */
static void hold_end(struct held *h, struct worker *w0)
{
	const char *err = NULL;
	if (hold_batch(h->fd, false, h->ids, opt_hold, &err)) {
		w0->err[E_MISMATCH]++;
		if (!w0->first_err[0])
			snprintf(w0->first_err, sizeof(w0->first_err), "%s",
			         err);
	}
	close(h->fd);
	free(h->ids);
}

/* Run the threads: warm-up, then the timed seconds. The client's CPU%
 * over the run goes to *cpu_pct. Returns 0 or -1. */
static int run_threads(struct worker *ws, double *cpu_pct)
{
	struct rusage ru0, ru1;
	getrusage(RUSAGE_SELF, &ru0);
	t_start = bench_now_ns() + 20000000u; /* 20 ms for the threads to start */
	t_warm = t_start + (uint64_t)(opt_warmup * 1e9);
	t_end = t_warm + (uint64_t)(opt_seconds * 1e9);
	for (int t = 0; t < opt_threads; t++)
		if (pthread_create(&ws[t].th, NULL, run_worker, &ws[t]))
			return -1;
	for (int t = 0; t < opt_threads; t++)
		pthread_join(ws[t].th, NULL);
	uint64_t t_done = bench_now_ns();
	getrusage(RUSAGE_SELF, &ru1);
	double cpu =
	    (double)(ru1.ru_utime.tv_sec - ru0.ru_utime.tv_sec) +
	    (double)(ru1.ru_stime.tv_sec - ru0.ru_stime.tv_sec) +
	    (double)(ru1.ru_utime.tv_usec - ru0.ru_utime.tv_usec) / 1e6 +
	    (double)(ru1.ru_stime.tv_usec - ru0.ru_stime.tv_usec) / 1e6;
	double wall = (double)(t_done - t_start) / 1e9;
	*cpu_pct = wall > 0 ? 100.0 * cpu / wall : 0.0;
	return 0;
}

/* The threads' figures added up; all[T__COUNT] is every type. */
struct totals {
	struct hist all[T__COUNT + 1];
	uint64_t granted, denied, released, errors, answered;
	uint64_t err[E__COUNT];
	const char *first_err;
};

static void add_up(const struct worker *ws, const char *connect_msg,
                   struct totals *tt)
{
	tt->first_err = connect_msg[0] ? connect_msg : "";
	for (int t = 0; t < opt_threads; t++) {
		for (int k = 0; k < T__COUNT; k++) {
			h_merge(&tt->all[k], &ws[t].h[k]);
			h_merge(&tt->all[T__COUNT], &ws[t].h[k]);
		}
		tt->granted += ws[t].granted;
		tt->denied += ws[t].denied;
		tt->released += ws[t].released;
		tt->answered += ws[t].answered_total;
		for (int k = 0; k < E__COUNT; k++) {
			tt->err[k] += ws[t].err[k];
			tt->errors += ws[t].err[k];
		}
		if (!tt->first_err[0] && ws[t].first_err[0])
			tt->first_err = ws[t].first_err;
	}
}

/* One JSON object on stdout; the proof's verdict on stderr. Returns
 * whether the run is good: no error, and requests answered. */
static bool report(const struct totals *tt, double cpu_pct)
{
	double secs = opt_seconds;
	const struct hist *all = tt->all;
	static const char *const mixes[] = {"cycle", "admit", "usage"};
	printf("{\"connections\": %d, \"threads\": %d, \"inflight\": %d, "
	       "\"mix\": \"%s\", \"seconds\": %.3f, \"warmup\": %.3f, "
	       "\"admit_bytes\": %" PRIu64 ", \"ttl\": %u, \"hold\": %d, ",
	       opt_conns, opt_threads, opt_inflight, mixes[opt_mix], secs,
	       opt_warmup, opt_admit_bytes, opt_ttl, opt_hold);
	printf("\"requests\": %" PRIu64 ", \"per_second\": %.0f, "
	       "\"answered\": %" PRIu64 ", ",
	       all[T__COUNT].count, (double)all[T__COUNT].count / secs,
	       tt->answered);
	printf("\"admits_granted\": %" PRIu64 ", \"admits_denied\": %" PRIu64
	       ", \"releases\": %" PRIu64 ", ",
	       tt->granted, tt->denied, tt->released);
	json_hist("all", &all[T__COUNT], secs, true);
	printf("\"by_type\": {");
	for (int k = 0; k < T__COUNT; k++)
		json_hist(type_name[k], &all[k], secs, k + 1 < T__COUNT);
	printf("}, \"client_cpu_pct\": %.1f, \"errors\": %" PRIu64
	       ", \"error_kinds\": {",
	       cpu_pct, tt->errors);
	for (int k = 0; k < E__COUNT; k++)
		printf("\"%s\": %" PRIu64 "%s", err_name[k], tt->err[k],
		       k + 1 < E__COUNT ? ", " : "");
	printf("}, \"first_error\": \"");
	for (const char *s = tt->first_err; *s; s++)
		if (*s != '"' && *s != '\\' && (unsigned char)*s >= 0x20)
			putchar(*s);
	bool ok = tt->errors == 0 && all[T__COUNT].count > 0;
	printf("\", \"ok\": %s}\n", ok ? "true" : "false");
	if (tt->errors)
		fprintf(stderr, "PROOF FAILED: %" PRIu64 " errors; first: %s\n",
		        tt->errors, tt->first_err);
	else if (!all[T__COUNT].count)
		fprintf(stderr, "PROOF FAILED: no request answered\n");
	return ok;
}

int main(int argc, char **argv)
{
	if (parse_args(argc, argv))
		return 2;
	raise_fd_limit();
	struct worker *ws = calloc((size_t)opt_threads, sizeof(*ws));
	struct conn *conns = calloc((size_t)opt_conns, sizeof(*conns));
	struct totals *tt = calloc(1, sizeof(*tt));
	char connect_msg[160] = "";
	if (!ws || !conns || !tt ||
	    connect_all(ws, conns, connect_msg, sizeof(connect_msg)))
		return 2;
	struct held h = {.fd = -1};
	if (opt_hold > 0 && hold_start(&h))
		return 3;
	double cpu_pct;
	if (run_threads(ws, &cpu_pct))
		return 2;
	if (opt_hold > 0)
		hold_end(&h, &ws[0]);
	add_up(ws, connect_msg, tt);
	bool ok = report(tt, cpu_pct);
	for (int i = 0; i < opt_conns; i++) {
		if (!conns[i].dead)
			close(conns[i].fd);
		free(conns[i].rbuf);
	}
	free(tt);
	free(conns);
	free(ws);
	return ok ? 0 : 3;
}
