/*
 * util.c - state names, HOST:PORT, the monotonic clock and waiting on a
 * descriptor: the small things client and server must do the same way.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include "mtcommon.h"

#include <errno.h>
#include <poll.h>
#include <signal.h>
#include <stdbool.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>

const char *mt_state_name(unsigned state)
{
	static const char *const names[] = {"ok", "high", "over"};
	return state < sizeof(names) / sizeof(names[0]) ? names[state]
	                                                : "unknown";
}

int mt_split_hostport(const char *s, char *host, size_t cap, uint16_t *port)
{
	if (!s || !host || !cap || !port)
		return -EINVAL;
	const char *colon = strrchr(s, ':');
	if (!colon || colon == s)
		return -EINVAL;
	const char *h = s;
	size_t hlen = (size_t)(colon - s);
	bool v6 = s[0] == '[';
	if (v6) {
		if (hlen < 3 || s[hlen - 1] != ']')
			return -EINVAL;
		h++;
		hlen -= 2;
	}
	if (hlen >= cap || (!v6 && memchr(h, ':', hlen)))
		return -EINVAL; /* too long, or an IPv6 literal without [] */
	/* Decimal digits only: no sign, space or hex in a port. */
	const char *p = colon + 1;
	if (!*p || strlen(p) > 5)
		return -EINVAL;
	unsigned v = 0;
	for (; *p; p++) {
		if (*p < '0' || *p > '9')
			return -EINVAL;
		v = v * 10 + (unsigned)(*p - '0');
	}
	if (v > 65535)
		return -EINVAL;
	memcpy(host, h, hlen);
	host[hlen] = '\0';
	*port = (uint16_t)v;
	return 0;
}

size_t mt_utf8_seq(const unsigned char *s, uint32_t *cp)
{
	if (s[0] < 0x80) {
		*cp = s[0];
		return 1;
	}
	size_t n = s[0] >= 0xf0 ? 4 : s[0] >= 0xe0 ? 3 : s[0] >= 0xc0 ? 2 : 0;
	if (n == 0 || s[0] > 0xf4)
		return 0;
	uint32_t c = s[0] & (0x7fu >> n);
	for (size_t i = 1; i < n; i++) {
		if ((s[i] & 0xc0) != 0x80)
			return 0; /* also stops at the NUL */
		c = (c << 6) | (s[i] & 0x3fu);
	}
	static const uint32_t min[5] = {0, 0, 0x80, 0x800, 0x10000};
	if (c < min[n] || c > 0x10ffff || (c >= 0xd800 && c <= 0xdfff))
		return 0;
	*cp = c;
	return n;
}

void mt_utf8_scrub(char *s)
{
	unsigned char *u = (unsigned char *)s;
	while (*u) {
		uint32_t c;
		size_t k = mt_utf8_seq(u, &c);
		if (k == 0) {
			*u++ = '?';
			continue;
		}
		u += k;
	}
}

bool mt_cp_hostile(uint32_t c)
{
	return c < 0x20 || (c >= 0x7f && c <= 0x9f) || c == 0x061c ||
	       c == 0x200e || c == 0x200f || c == 0x2028 || c == 0x2029 ||
	       (c >= 0x202a && c <= 0x202e) || (c >= 0x2066 && c <= 0x2069);
}

bool mt_name_ok(const char *s)
{
	size_t n = 0;
	while (s[n]) {
		uint32_t c;
		size_t k = mt_utf8_seq((const unsigned char *)s + n, &c);
		if (k == 0 || mt_cp_hostile(c))
			return false;
		n += k;
	}
	return n <= MT_NAME_MAX;
}

int mt_cmp_u32(const void *a, const void *b)
{
	uint32_t x = *(const uint32_t *)a, y = *(const uint32_t *)b;
	return (x > y) - (x < y);
}

int mt_cmp_u64(const void *a, const void *b)
{
	uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
	return (x > y) - (x < y);
}

uint64_t mt_mono_ns(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

int mt_send_all(int fd, const void *buf, size_t len, uint64_t deadline_ns)
{
	const uint8_t *p = buf;
	size_t off = 0;
	while (off < len) {
		ssize_t n =
		    send(fd, p + off, len - off, MSG_NOSIGNAL | MSG_DONTWAIT);
		if (n >= 0) {
			off += (size_t)n;
			continue;
		}
		if (errno == EINTR)
			continue;
		if (errno != EAGAIN && errno != EWOULDBLOCK)
			return errno == EPIPE ? -ECONNRESET : -errno;
		int err = mt_wait_fd(fd, POLLOUT, deadline_ns);
		if (err)
			return err;
	}
	return 0;
}

int mt_thread_detached(mt_thread_create_fn create, void *(*fn)(void *),
                       void *arg, size_t stack, pthread_t *tid)
{
	pthread_attr_t attr;
	int err = pthread_attr_init(&attr);
	if (err)
		return -err;
	pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
	pthread_attr_setstacksize(&attr, stack);
	sigset_t all, old;
	sigfillset(&all);
	pthread_sigmask(SIG_SETMASK, &all, &old);
	pthread_t t;
	err = (create ? create : pthread_create)(&t, &attr, fn, arg);
	pthread_sigmask(SIG_SETMASK, &old, NULL);
	pthread_attr_destroy(&attr);
	if (!err && tid)
		*tid = t;
	return -err;
}

int mt_wait_fd(int fd, short events, uint64_t deadline_ns)
{
	for (;;) {
		int ms = -1;
		if (deadline_ns != UINT64_MAX) {
			uint64_t now = mt_mono_ns();
			if (now >= deadline_ns)
				return -ETIMEDOUT;
			/* Round up: never wake just before the deadline. */
			uint64_t d = deadline_ns - now;
			uint64_t left = d / 1000000u + (d % 1000000u != 0);
			ms = left > 1000000u ? 1000000 : (int)left;
		}
		struct pollfd p = {.fd = fd, .events = events};
		int n = poll(&p, 1, ms);
		if (n > 0)
			return 0;
		if (n < 0 && errno != EINTR)
			return -errno;
	}
}
