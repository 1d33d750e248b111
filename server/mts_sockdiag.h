/*
 * mts_sockdiag.h - the uid behind a local TCP connection, from the kernel
 * (NETLINK_SOCK_DIAG, inet_diag), so that a loopback TCP peer is a uid
 * like a Unix-socket peer (sockdiag.c).
 */
#ifndef MTS_SOCKDIAG_H
#define MTS_SOCKDIAG_H

#include <stdbool.h>
#include <stdint.h>
#include <sys/socket.h>

/* Could a socket with address `peer` live on this host: loopback, the
 * same address as our end `local`, or an address of one of its
 * interfaces? */
bool mts_addr_is_local(const struct sockaddr *peer,
                       const struct sockaddr *local);

/*
 * The uid owning the peer's end of the established TCP connection from
 * `peer` to `local` (our end): the socket whose source is `peer` and
 * destination `local`, looked up by its exact 4-tuple. 0 and *uid, or
 * -ENOENT (no such socket here: the peer is remote, or gone), -EAFNOSUPPORT,
 * or another -errno (no sock_diag).
 */
int mts_sockdiag_uid(const struct sockaddr *peer, const struct sockaddr *local,
                     uint32_t *uid);

#endif /* MTS_SOCKDIAG_H */
