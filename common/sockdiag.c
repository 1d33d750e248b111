/*
 * sockdiag.c - the uid behind a local TCP connection.
 *
 * TCP has no SO_PEERCRED. But when the peer is on this host, its end of
 * the connection is a socket here too, and the kernel records who made it
 * (sk_uid). NETLINK_SOCK_DIAG answers a query for one socket by its exact
 * 4-tuple (SOCK_DIAG_BY_FAMILY with a struct inet_diag_req_v2, not a
 * dump). The answer is a struct inet_diag_msg carrying idiag_uid. No
 * privilege is needed. The kernel answers within the sendmsg(), so the
 * query costs one netlink socket and two system calls per accepted TCP
 * connection.
 *
 * The peer's socket is the one whose source is the peer's address:port
 * and whose destination is ours. A remote peer has no such socket. We ask
 * only when the peer's address is one of this host's (mt_addr_is_local),
 * so that a socket of another network namespace or host cannot be
 * confused with one here.
 *
 * The lookup finds whatever socket holds the 4-tuple, in any state. A peer
 * that connected, sent and closed before we accepted has left a closing
 * or timewait socket, which reports uid 0. So only a live, established
 * socket with an inode names the peer (mt_sockdiag_answer), and only if
 * our own end is still established after the answer.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE /* struct tcp_info, TCP_ESTABLISHED */
#endif
#include "mt_sockdiag.h"

#include <arpa/inet.h>
#include <errno.h>
#include <ifaddrs.h>
#include <linux/inet_diag.h>
#include <linux/netlink.h>
#include <linux/sock_diag.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdio.h>
#include <string.h>
#include <sys/time.h>
#include <unistd.h>

/* An address in the form inet_diag wants: a family, up to 16 bytes, a
 * port in network order. IPv4-mapped IPv6 addresses (a dual-stack
 * listener's view of an IPv4 peer) become the IPv4 addresses they are:
 * the peer's own socket is an AF_INET one. */
struct addr {
	int family;
	uint8_t a[16];
	uint16_t port; /* network order */
};

static int addr_of(const struct sockaddr *sa, struct addr *out)
{
	memset(out, 0, sizeof(*out));
	if (sa->sa_family == AF_INET) {
		const struct sockaddr_in *s = (const struct sockaddr_in *)sa;
		out->family = AF_INET;
		memcpy(out->a, &s->sin_addr, 4);
		out->port = s->sin_port;
		return 0;
	}
	if (sa->sa_family == AF_INET6) {
		const struct sockaddr_in6 *s = (const struct sockaddr_in6 *)sa;
		out->port = s->sin6_port;
		if (IN6_IS_ADDR_V4MAPPED(&s->sin6_addr)) {
			out->family = AF_INET;
			memcpy(out->a, s->sin6_addr.s6_addr + 12, 4);
		} else {
			out->family = AF_INET6;
			memcpy(out->a, &s->sin6_addr, 16);
		}
		return 0;
	}
	return -EAFNOSUPPORT;
}

static size_t addr_len(const struct addr *a)
{
	return a->family == AF_INET ? 4 : 16;
}

static bool addr_loopback(const struct addr *a)
{
	if (a->family == AF_INET)
		return a->a[0] == 127;
	static const uint8_t lo6[16] = {[15] = 1};
	return memcmp(a->a, lo6, 16) == 0;
}

/* Is `a` an address of one of this host's interfaces? */
static bool addr_on_host(const struct addr *a)
{
	struct ifaddrs *ifs;
	if (getifaddrs(&ifs) < 0)
		return false;
	bool found = false;
	for (struct ifaddrs *i = ifs; i && !found; i = i->ifa_next) {
		struct addr x;
		if (i->ifa_addr && addr_of(i->ifa_addr, &x) == 0 &&
		    x.family == a->family &&
		    memcmp(x.a, a->a, addr_len(a)) == 0)
			found = true;
	}
	freeifaddrs(ifs);
	return found;
}

void mt_addr_format(const struct sockaddr *addr, char *buf, size_t cap)
{
	char host[INET6_ADDRSTRLEN] = "?";
	if (addr->sa_family == AF_INET6) {
		const struct sockaddr_in6 *s6 = (const void *)addr;
		inet_ntop(AF_INET6, &s6->sin6_addr, host, sizeof(host));
		snprintf(buf, cap, "[%s]:%u", host, ntohs(s6->sin6_port));
	} else if (addr->sa_family == AF_INET) {
		const struct sockaddr_in *s4 = (const void *)addr;
		inet_ntop(AF_INET, &s4->sin_addr, host, sizeof(host));
		snprintf(buf, cap, "%s:%u", host, ntohs(s4->sin_port));
	} else {
		snprintf(buf, cap, "?");
	}
}

uint32_t mt_addr_key(const struct sockaddr *addr)
{
	const uint8_t *b = NULL;
	size_t n = 0;
	if (addr->sa_family == AF_INET) {
		b = (const uint8_t *)&((const struct sockaddr_in *)addr)
		        ->sin_addr;
		n = 4;
	} else if (addr->sa_family == AF_INET6) {
		const struct in6_addr *a =
		    &((const struct sockaddr_in6 *)addr)->sin6_addr;
		bool v4 = IN6_IS_ADDR_V4MAPPED(a);
		b = a->s6_addr + (v4 ? 12 : 0);
		n = v4 ? 4 : 8;
	}
	/* FNV-1a */
	uint32_t h = 2166136261u;
	for (size_t i = 0; i < n; i++) {
		h ^= b[i];
		h *= 16777619u;
	}
	return h;
}

bool mt_addr_is_local(const struct sockaddr *peer, const struct sockaddr *local)
{
	struct addr p, l;
	if (addr_of(peer, &p) < 0)
		return false;
	if (addr_loopback(&p))
		return true;
	if (addr_of(local, &l) == 0 && l.family == p.family &&
	    memcmp(l.a, p.a, addr_len(&p)) == 0)
		return true;
	return addr_on_host(&p);
}

int mt_sockdiag_answer(const struct inet_diag_msg *m,
                       const struct sockaddr *peer,
                       const struct sockaddr *local, uint32_t *uid)
{
	struct addr p, l;
	if (addr_of(peer, &p) < 0 || addr_of(local, &l) < 0)
		return -EAFNOSUPPORT;
	/* The peer's socket is the one from its address:port to ours. An
	 * IPv4 peer's own socket may be a dual-stack AF_INET6 one (Java's
	 * default, Python's AF_INET6, `[::ffff:127.0.0.1]:PORT`): the kernel
	 * answers with its family and the IPv4-mapped forms of the same
	 * addresses, which are that socket all the same. */
	static const uint8_t mapped[12] = {0, 0, 0, 0, 0,    0,
	                                   0, 0, 0, 0, 0xff, 0xff};
	const uint8_t *src = (const uint8_t *)m->id.idiag_src;
	const uint8_t *dst = (const uint8_t *)m->id.idiag_dst;
	bool v4_on_v6 = p.family == AF_INET && m->idiag_family == AF_INET6 &&
	                memcmp(src, mapped, 12) == 0 &&
	                memcmp(dst, mapped, 12) == 0;
	if (v4_on_v6) {
		src += 12;
		dst += 12;
	}
	if ((m->idiag_family != p.family && !v4_on_v6) ||
	    l.family != p.family || m->id.idiag_sport != p.port ||
	    m->id.idiag_dport != l.port ||
	    memcmp(src, p.a, addr_len(&p)) != 0 ||
	    memcmp(dst, l.a, addr_len(&l)) != 0)
		return -ENOENT;
	/* The lookup by 4-tuple ignores idiag_states: it answers with a
	 * peer's leftover too. A timewait or request socket reports uid 0
	 * (root) and inode 0; a closed peer's orphaned socket keeps its
	 * owner's uid but has no inode and has left ESTABLISHED. None of
	 * them says who sends on the connection now. */
	if (m->idiag_state != TCP_ESTABLISHED)
		return -ENOTCONN;
	/* Established, held by no process: a connection its listener has
	 * not accepted yet (or an orphan): no one to name, for now. */
	if (m->idiag_inode == 0)
		return -EAGAIN;
	*uid = m->idiag_uid;
	return 0;
}

/* Read the answer to our one request: the socket's uid, or the kernel's
 * error (-ENOENT when no socket has that 4-tuple), or -ENOTCONN when the
 * socket found is not a live, established one. */
static int read_answer(int fd, const struct sockaddr *peer,
                       const struct sockaddr *local, uint32_t *uid)
{
	/* Aligned for struct nlmsghdr; one answer is about 100 bytes. */
	long buf[1024];
	ssize_t n;
	do
		n = recv(fd, buf, sizeof(buf), 0);
	while (n < 0 && errno == EINTR);
	if (n < 0)
		return -errno;
	size_t len = (size_t)n;
	int err = -ENOENT;
	for (struct nlmsghdr *h = (struct nlmsghdr *)buf; NLMSG_OK(h, len);
	     h = NLMSG_NEXT(h, len)) {
		if (h->nlmsg_type == NLMSG_ERROR) {
			const struct nlmsgerr *e = NLMSG_DATA(h);
			if (h->nlmsg_len < NLMSG_LENGTH(sizeof(*e)))
				return -EPROTO;
			return e->error < 0 ? e->error : err;
		}
		if (h->nlmsg_type != SOCK_DIAG_BY_FAMILY ||
		    h->nlmsg_len < NLMSG_LENGTH(sizeof(struct inet_diag_msg)))
			continue;
		err = mt_sockdiag_answer(NLMSG_DATA(h), peer, local, uid);
		if (err != -ENOENT)
			return err;
	}
	return err;
}

/* Is our end of the connection still ESTABLISHED? A peer that closed
 * has made it CLOSE_WAIT (or gone further). */
static int still_established(int fd)
{
	struct tcp_info ti;
	socklen_t len = sizeof(ti);
	if (getsockopt(fd, IPPROTO_TCP, TCP_INFO, &ti, &len) < 0)
		return -errno;
	return ti.tcpi_state == TCP_ESTABLISHED ? 0 : -ENOTCONN;
}

int mt_sockdiag_uid(int fd, const struct sockaddr *peer,
                    const struct sockaddr *local, uint32_t *uid)
{
	struct addr p, l;
	if (addr_of(peer, &p) < 0 || addr_of(local, &l) < 0)
		return -EAFNOSUPPORT;
	if (p.family != l.family)
		return -ENOENT;
	struct {
		struct nlmsghdr nlh;
		struct inet_diag_req_v2 r;
	} req;
	memset(&req, 0, sizeof(req));
	req.nlh.nlmsg_len = sizeof(req);
	req.nlh.nlmsg_type = SOCK_DIAG_BY_FAMILY;
	req.nlh.nlmsg_flags = NLM_F_REQUEST; /* one socket, not a dump */
	req.r.sdiag_family = (uint8_t)p.family;
	req.r.sdiag_protocol = IPPROTO_TCP;
	/* Ignored by the lookup of one socket: mt_sockdiag_answer()
	 * checks the state of what comes back. */
	req.r.idiag_states = 1u << TCP_ESTABLISHED;
	req.r.id.idiag_sport = p.port;
	req.r.id.idiag_dport = l.port;
	memcpy(req.r.id.idiag_src, p.a, addr_len(&p));
	memcpy(req.r.id.idiag_dst, l.a, addr_len(&l));
	req.r.id.idiag_cookie[0] = INET_DIAG_NOCOOKIE;
	req.r.id.idiag_cookie[1] = INET_DIAG_NOCOOKIE;
	/* A link-local (fe80::/10) connection is bound to its interface, and
	 * the kernel's lookup matches that too: without it no socket is
	 * found, and a peer on this host is taken for a stranger. Both ends
	 * are on the same link, so ours names the interface. */
	if (local->sa_family == AF_INET6 && p.family == AF_INET6) {
		const struct sockaddr_in6 *s6 =
		    (const struct sockaddr_in6 *)local;
		if (IN6_IS_ADDR_LINKLOCAL(&s6->sin6_addr))
			req.r.id.idiag_if = s6->sin6_scope_id;
	}

	int nl =
	    socket(AF_NETLINK, SOCK_DGRAM | SOCK_CLOEXEC, NETLINK_SOCK_DIAG);
	if (nl < 0)
		return -errno;
	/* The kernel answers during sendto(); the timeout only bounds a
	 * kernel that does not (it must never hold the loop). */
	struct timeval tv = {.tv_sec = 0, .tv_usec = 200000};
	setsockopt(nl, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
	struct sockaddr_nl kernel = {.nl_family = AF_NETLINK};
	uint32_t found = 0;
	int err = 0;
	if (sendto(nl, &req, sizeof(req), 0, (struct sockaddr *)&kernel,
	           sizeof(kernel)) < 0)
		err = -errno;
	else
		err = read_answer(nl, peer, local, &found);
	close(nl);
	/* The answer was the peer's live socket when the kernel gave it. If
	 * ours is still ESTABLISHED after it, the peer has not closed since;
	 * and while our end lives no other socket can take its 4-tuple, so
	 * the answer cannot have been about a closed-then-reused one. */
	if (err == 0)
		err = still_established(fd);
	if (err == 0)
		*uid = found;
	return err;
}
