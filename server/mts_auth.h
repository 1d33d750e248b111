/*
 * mts_auth.h - who may SetLimit or end another's reservation, and the
 * per-uid counts behind the caps (auth.c).
 */
#ifndef MTS_AUTH_H
#define MTS_AUTH_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "mts_registry.h"

/* Why a peer is authorised; MTS_AUTH_NONE = it is not. */
enum mts_auth {
	MTS_AUTH_NONE = 0,
	MTS_AUTH_ROOT,
	MTS_AUTH_SERVER_UID,
	MTS_AUTH_ADMIN_UID,
	MTS_AUTH_ADMIN_GID,
	MTS_AUTH_TOKEN,
	MTS_AUTH_OWNER,
};

const char *mts_auth_name(enum mts_auth a);

/* May `peer` change limits (or release anyone's reservation)? `token` is
 * the body's token ("" or NULL = none). */
enum mts_auth mts_authorise(const struct mts_registry *reg,
                            const struct mts_peer *peer, const char *token);

/* May `peer` release a reservation owned by uid `owner` (`has_owner`
 * false: made by an unidentified TCP peer, owned by all of them): its
 * owner, or anyone mts_authorise() allows. */
enum mts_auth mts_authorise_release(const struct mts_registry *reg,
                                    const struct mts_peer *peer,
                                    const char *token, bool has_owner,
                                    uint32_t owner);

/* Is `uid` root, the server's uid or admin_uid (admin_gid needs a
 * process: mts_peer_in_group, mts_pid_in_group)? */
bool mts_uid_is_admin(const struct mts_registry *reg, uint32_t uid);

/* Is `gid` the effective or a supplementary group of process `pid`
 * (/proc/PID/status)? False when it cannot be read. */
bool mts_pid_in_group(uint32_t pid, uint32_t gid);

/* Is the peer an admin (root, the server's uid, admin_uid, admin_gid)?
 * Tokens do not count: this is about a process's uid. */
bool mts_peer_is_admin(const struct mts_registry *reg,
                       const struct mts_peer *peer);

/* Trusted with the whole server, as an admin is: an admin by uid, or a
 * peer whose request carries the tcp_token, which gives admin rights
 * anyway. Exempt from the per-uid caps on reservations and kinds. */
bool mts_peer_trusted(const struct mts_registry *reg,
                      const struct mts_peer *peer);

/* May the peer put workers or reservations in `group`: the group has no
 * uids/gids list, or lists the peer's uid or one of its groups, or the
 * peer is an admin. */
bool mts_may_join_group(const struct mts_registry *reg,
                        const struct mts_peer *peer, const char *group);

/* Who `peer` is, for a log line: "peer_pid=P uid=U" on the Unix socket,
 * "uid=U peer=ADDR:PORT" or "uid=unknown peer=ADDR:PORT" over TCP. */
#define MTS_PEER_WHO_MAX 112
const char *mts_peer_who(const struct mts_peer *peer, char *buf, size_t cap);

/* Constant-time (in the secret's content) comparison of two strings. */
bool mts_token_equal(const char *secret, const char *given);

/* Is `gid` the peer's primary group or one of its supplementary groups
 * (SO_PEERGROUPS on its socket, else /proc/PID/status)? */
bool mts_peer_in_group(const struct mts_peer *peer, uint32_t gid);

#endif /* MTS_AUTH_H */
