/*
 * test_common_sockdiag.c - which sock_diag answers name a TCP peer: only
 * the peer's own live socket (exact 4-tuple, ESTABLISHED, an inode), never
 * the timewait or closing socket a peer leaves behind when it closes
 * before we accept (a timewait socket reports uid 0); and, on real
 * loopback sockets, a live peer is its uid while one that has closed is
 * nobody.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE /* accept4, struct tcp_info */
#endif
#include "mt_sockdiag.h"

#include <arpa/inet.h>
#include <criterion/criterion.h>
#include <errno.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <linux/inet_diag.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define PEER_PORT 40000
#define OUR_PORT  7777

static struct sockaddr_in v4(const char *ip, uint16_t port)
{
	struct sockaddr_in s = {.sin_family = AF_INET, .sin_port = htons(port)};
	inet_pton(AF_INET, ip, &s.sin_addr);
	return s;
}

static struct sockaddr_in6 v6(const char *ip, uint16_t port)
{
	struct sockaddr_in6 s = {.sin6_family = AF_INET6,
	                         .sin6_port = htons(port)};
	inet_pton(AF_INET6, ip, &s.sin6_addr);
	return s;
}

/* What the kernel answers for the peer's live socket 127.0.0.1:PEER_PORT
 * -> 127.0.0.2:OUR_PORT of uid 1000. */
static struct inet_diag_msg live_v4(void)
{
	struct inet_diag_msg m;
	memset(&m, 0, sizeof(m));
	m.idiag_family = AF_INET;
	m.idiag_state = TCP_ESTABLISHED;
	m.id.idiag_sport = htons(PEER_PORT);
	m.id.idiag_dport = htons(OUR_PORT);
	inet_pton(AF_INET, "127.0.0.1", m.id.idiag_src);
	inet_pton(AF_INET, "127.0.0.2", m.id.idiag_dst);
	m.idiag_uid = 1000;
	m.idiag_inode = 123456;
	return m;
}

static int answer(const struct inet_diag_msg *m, uint32_t *uid)
{
	struct sockaddr_in p = v4("127.0.0.1", PEER_PORT);
	struct sockaddr_in l = v4("127.0.0.2", OUR_PORT);
	return mt_sockdiag_answer(m, (struct sockaddr *)&p,
	                          (struct sockaddr *)&l, uid);
}

Test(sockdiag, live_peer_is_its_uid)
{
	struct inet_diag_msg m = live_v4();
	uint32_t uid = 7;
	cr_assert_eq(answer(&m, &uid), 0);
	cr_assert_eq(uid, 1000);
}

Test(sockdiag, timewait_leftover_is_not_root)
{
	/* What a peer that closed before the accept leaves: uid 0, no inode. */
	struct inet_diag_msg m = live_v4();
	m.idiag_state = TCP_TIME_WAIT;
	m.idiag_uid = 0;
	m.idiag_inode = 0;
	uint32_t uid = 7;
	cr_assert_eq(answer(&m, &uid), -ENOTCONN);
	m.idiag_state = TCP_FIN_WAIT2; /* a timewait socket's substate */
	cr_assert_eq(answer(&m, &uid), -ENOTCONN);
	cr_assert_eq(uid, 7);
}

Test(sockdiag, closing_or_orphaned_peer_is_nobody)
{
	uint32_t uid = 7;
	static const int closing[] = {
	    TCP_FIN_WAIT1, TCP_FIN_WAIT2,  TCP_CLOSING,  TCP_LAST_ACK,
	    TCP_CLOSE,     TCP_CLOSE_WAIT, TCP_SYN_RECV, TCP_SYN_SENT};
	for (size_t i = 0; i < sizeof(closing) / sizeof(closing[0]); i++) {
		struct inet_diag_msg m = live_v4();
		m.idiag_state = (uint8_t)closing[i];
		cr_assert_eq(answer(&m, &uid), -ENOTCONN, "state %d",
		             closing[i]);
	}
	/* ESTABLISHED but no inode: no process holds it (not accepted yet,
	 * or orphaned), so its uid says nothing of the sender, for now. */
	struct inet_diag_msg m = live_v4();
	m.idiag_inode = 0;
	cr_assert_eq(answer(&m, &uid), -EAGAIN);
	cr_assert_eq(uid, 7);
}

Test(sockdiag, another_tuple_is_another_socket)
{
	uint32_t uid = 7;
	struct inet_diag_msg m = live_v4();
	m.id.idiag_sport = htons(PEER_PORT + 1);
	cr_assert_eq(answer(&m, &uid), -ENOENT);
	m = live_v4();
	m.id.idiag_dport = htons(OUR_PORT + 1);
	cr_assert_eq(answer(&m, &uid), -ENOENT);
	m = live_v4();
	inet_pton(AF_INET, "127.0.0.3", m.id.idiag_src);
	cr_assert_eq(answer(&m, &uid), -ENOENT);
	m = live_v4();
	inet_pton(AF_INET, "127.0.0.3", m.id.idiag_dst);
	cr_assert_eq(answer(&m, &uid), -ENOENT);
	m = live_v4();
	m.idiag_family = AF_INET6;
	cr_assert_eq(answer(&m, &uid), -ENOENT);
	cr_assert_eq(uid, 7);
}

Test(sockdiag, mapped_and_v6_addresses)
{
	/* A dual-stack listener sees an IPv4 peer as ::ffff:a.b.c.d; the
	 * peer's socket is an AF_INET one. */
	struct sockaddr_in6 p = v6("::ffff:127.0.0.1", PEER_PORT);
	struct sockaddr_in6 l = v6("::ffff:127.0.0.2", OUR_PORT);
	struct inet_diag_msg m = live_v4();
	uint32_t uid = 7;
	cr_assert_eq(mt_sockdiag_answer(&m, (struct sockaddr *)&p,
	                                (struct sockaddr *)&l, &uid),
	             0);
	cr_assert_eq(uid, 1000);

	p = v6("::1", PEER_PORT);
	l = v6("::1", OUR_PORT);
	memset(m.id.idiag_src, 0, sizeof(m.id.idiag_src));
	memset(m.id.idiag_dst, 0, sizeof(m.id.idiag_dst));
	m.idiag_family = AF_INET6;
	inet_pton(AF_INET6, "::1", m.id.idiag_src);
	inet_pton(AF_INET6, "::1", m.id.idiag_dst);
	m.idiag_uid = 1001;
	cr_assert_eq(mt_sockdiag_answer(&m, (struct sockaddr *)&p,
	                                (struct sockaddr *)&l, &uid),
	             0);
	cr_assert_eq(uid, 1001);
	m.idiag_state = TCP_TIME_WAIT;
	cr_assert_eq(mt_sockdiag_answer(&m, (struct sockaddr *)&p,
	                                (struct sockaddr *)&l, &uid),
	             -ENOTCONN);
}

Test(sockdiag, an_ipv4_peer_on_a_dual_stack_socket_is_its_uid)
{
	/* The peer connected to 127.0.0.2 from an AF_INET6 socket
	 * ([::ffff:127.0.0.2]:PORT, Java's default): the kernel answers
	 * with that socket, its family and the mapped addresses. It was
	 * refused, and the peer, root included, taken for a stranger. */
	struct inet_diag_msg m = live_v4();
	m.idiag_family = AF_INET6;
	memset(m.id.idiag_src, 0, sizeof(m.id.idiag_src));
	memset(m.id.idiag_dst, 0, sizeof(m.id.idiag_dst));
	inet_pton(AF_INET6, "::ffff:127.0.0.1", m.id.idiag_src);
	inet_pton(AF_INET6, "::ffff:127.0.0.2", m.id.idiag_dst);
	uint32_t uid = 7;
	cr_assert_eq(answer(&m, &uid), 0);
	cr_assert_eq(uid, 1000);
	/* Mapped, but another address: another socket. */
	inet_pton(AF_INET6, "::ffff:127.0.0.3", m.id.idiag_src);
	uid = 7;
	cr_assert_eq(answer(&m, &uid), -ENOENT);
	/* Not mapped: an IPv6 socket is not the IPv4 peer's. */
	inet_pton(AF_INET6, "::1", m.id.idiag_src);
	inet_pton(AF_INET6, "::1", m.id.idiag_dst);
	cr_assert_eq(answer(&m, &uid), -ENOENT);
	cr_assert_eq(uid, 7);
}

/* ---- real loopback sockets ---------------------------------------------- */

struct pair {
	int lst, cli, srv;
	struct sockaddr_in peer, local;
};

static void connect_pair(struct pair *x)
{
	struct sockaddr_in a = v4("127.0.0.1", 0);
	socklen_t len = sizeof(a);
	x->lst = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
	cr_assert_geq(x->lst, 0);
	cr_assert_eq(bind(x->lst, (struct sockaddr *)&a, sizeof(a)), 0);
	cr_assert_eq(listen(x->lst, 4), 0);
	cr_assert_eq(getsockname(x->lst, (struct sockaddr *)&a, &len), 0);
	x->cli = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
	cr_assert_eq(connect(x->cli, (struct sockaddr *)&a, sizeof(a)), 0);
	x->srv = accept4(x->lst, NULL, NULL, SOCK_CLOEXEC);
	cr_assert_geq(x->srv, 0);
	len = sizeof(x->peer);
	cr_assert_eq(getpeername(x->srv, (struct sockaddr *)&x->peer, &len), 0);
	len = sizeof(x->local);
	cr_assert_eq(getsockname(x->srv, (struct sockaddr *)&x->local, &len),
	             0);
}

static int lookup(struct pair *x, uint32_t *uid)
{
	return mt_sockdiag_uid(x->srv, (struct sockaddr *)&x->peer,
	                       (struct sockaddr *)&x->local, uid);
}

static int tcp_state(int fd)
{
	struct tcp_info ti;
	socklen_t len = sizeof(ti);
	cr_assert_eq(getsockopt(fd, IPPROTO_TCP, TCP_INFO, &ti, &len), 0);
	return ti.tcpi_state;
}

Test(sockdiag, loopback_peer_live_then_closed)
{
	struct pair x;
	connect_pair(&x);
	uint32_t uid = 7;
	int err = lookup(&x, &uid);
	if (err == -EPROTONOSUPPORT || err == -ENOENT)
		cr_skip_test("no sock_diag for TCP here (%s)", strerror(-err));
	cr_assert_eq(err, 0, "live peer: %s", strerror(-err));
	cr_assert_eq(uid, geteuid());

	/* The peer closes: its socket is a closing or timewait one (uid 0
	 * once timewait), ours CLOSE_WAIT. Neither may name it. */
	close(x.cli);
	struct timespec end, now;
	clock_gettime(CLOCK_MONOTONIC, &end);
	end.tv_sec += 10;
	while (tcp_state(x.srv) == TCP_ESTABLISHED) {
		clock_gettime(CLOCK_MONOTONIC, &now);
		cr_assert_lt(now.tv_sec * 1000000000L + now.tv_nsec,
		             end.tv_sec * 1000000000L + end.tv_nsec,
		             "our end never saw the peer's FIN");
		poll(NULL, 0, 5);
	}
	uid = 7;
	err = lookup(&x, &uid);
	cr_assert(err == -ENOTCONN || err == -ENOENT, "closed peer: %d", err);
	cr_assert_eq(uid, 7);
	close(x.srv);
	close(x.lst);
}

/* A link-local IPv6 address of this host's, with its interface, or false
 * when it has none (no IPv6, or none configured). */
static bool link_local(struct sockaddr_in6 *out)
{
	struct ifaddrs *ifs;
	if (getifaddrs(&ifs) < 0)
		return false;
	bool found = false;
	for (struct ifaddrs *i = ifs; i && !found; i = i->ifa_next) {
		if (!i->ifa_addr || i->ifa_addr->sa_family != AF_INET6 ||
		    !(i->ifa_flags & IFF_UP))
			continue;
		const struct sockaddr_in6 *s6 =
		    (const struct sockaddr_in6 *)i->ifa_addr;
		if (IN6_IS_ADDR_LINKLOCAL(&s6->sin6_addr)) {
			*out = *s6;
			found = true;
		}
	}
	freeifaddrs(ifs);
	return found;
}

Test(sockdiag, a_link_local_peer_on_this_host_is_its_uid)
{
	/* A connection to fe80::...%eth0 is bound to eth0, and the kernel
	 * finds its sockets only with that interface in the query: without
	 * it a local peer was "not found" and taken for a stranger. */
	struct sockaddr_in6 a;
	if (!link_local(&a))
		cr_skip_test("no link-local IPv6 address on this host");
	a.sin6_port = 0;
	socklen_t len = sizeof(a);
	int lst = socket(AF_INET6, SOCK_STREAM | SOCK_CLOEXEC, 0);
	cr_assert_geq(lst, 0);
	if (bind(lst, (struct sockaddr *)&a, sizeof(a)) < 0)
		cr_skip_test("cannot bind the link-local address (%s): "
		             "tentative or IPv6 off",
		             strerror(errno));
	cr_assert_eq(listen(lst, 4), 0);
	cr_assert_eq(getsockname(lst, (struct sockaddr *)&a, &len), 0);
	int cli = socket(AF_INET6, SOCK_STREAM | SOCK_CLOEXEC, 0);
	cr_assert_eq(connect(cli, (struct sockaddr *)&a, sizeof(a)), 0);
	int srv = accept4(lst, NULL, NULL, SOCK_CLOEXEC);
	cr_assert_geq(srv, 0);
	struct sockaddr_in6 peer, local;
	len = sizeof(peer);
	cr_assert_eq(getpeername(srv, (struct sockaddr *)&peer, &len), 0);
	len = sizeof(local);
	cr_assert_eq(getsockname(srv, (struct sockaddr *)&local, &len), 0);
	cr_assert(mt_addr_is_local((struct sockaddr *)&peer,
	                           (struct sockaddr *)&local));
	uint32_t uid = 7;
	int err = mt_sockdiag_uid(srv, (struct sockaddr *)&peer,
	                          (struct sockaddr *)&local, &uid);
	if (err == -EPROTONOSUPPORT)
		cr_skip_test("no sock_diag for TCP here");
	cr_assert_eq(err, 0, "link-local peer: %s", strerror(-err));
	cr_assert_eq(uid, geteuid());
	close(cli);
	close(srv);
	close(lst);
}
