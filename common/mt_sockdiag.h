/*
 * mt_sockdiag.h - the uid behind a local TCP connection, from the kernel
 * (NETLINK_SOCK_DIAG, inet_diag), so that a loopback TCP peer is a uid
 * like a Unix-socket peer (sockdiag.c).
 */
#ifndef MT_SOCKDIAG_H
#define MT_SOCKDIAG_H

#include <stdbool.h>
#include <stdint.h>
#include <sys/socket.h>

/* Could a socket with address `peer` live on this host: loopback, the
 * same address as our end `local`, or an address of one of its
 * interfaces? */
bool mt_addr_is_local(const struct sockaddr *peer,
                      const struct sockaddr *local);

/* The key a remote peer's connections are counted under, one host's
 * share: a hash of its IPv4 address, or of an IPv6 one's /64 (a host
 * there has the whole prefix to pick addresses from; an IPv4-mapped one
 * is its IPv4). */
uint32_t mt_addr_key(const struct sockaddr *addr);

/* "ADDR:PORT" ("[ADDR]:PORT" for IPv6) of an AF_INET or AF_INET6 address
 * into buf[0..cap), for the logs; "?" for any other. */
void mt_addr_format(const struct sockaddr *addr, char *buf, size_t cap);

struct inet_diag_msg;

/*
 * The uid owning the peer's end of the established TCP connection from
 * `peer` to `local`, our end, whose socket is `fd`. That is the socket
 * whose source is `peer` and destination `local`, looked up by its exact
 * 4-tuple. Returns 0 and sets *uid, or a negative errno with *uid
 * untouched:
 *  -ENOENT: no such socket here, because the peer is remote or gone;
 *  -ENOTCONN: the peer has closed, so what answered is a leftover, or our
 *   end is not established any more;
 *  -EAGAIN: the peer's end is established but no process holds it yet
 *   (its listener has not accepted it);
 *  -EAFNOSUPPORT, or another -errno when sock_diag is missing.
 */
int mt_sockdiag_uid(int fd, const struct sockaddr *peer,
                    const struct sockaddr *local, uint32_t *uid);

/*
 * Does the kernel's answer `m` name the peer's live end of the connection
 * from `peer` to `local`? Its 4-tuple must be exactly that one, its state
 * TCP_ESTABLISHED and its inode non-zero (a socket a process holds, not a
 * timewait or request socket, which report uid 0, nor a closed peer's
 * orphan). 0 and *uid = its idiag_uid, or -ENOENT (another socket),
 * -ENOTCONN (not live), -EAGAIN (held by no process: not accepted yet),
 * -EAFNOSUPPORT.
 */
int mt_sockdiag_answer(const struct inet_diag_msg *m,
                       const struct sockaddr *peer,
                       const struct sockaddr *local, uint32_t *uid);

#endif /* MT_SOCKDIAG_H */
