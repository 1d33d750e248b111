/*
 * auth.c - who may change limits and release someone else's reservation.
 *
 * Queries and admission are open to anyone who can reach a socket (the
 * Unix socket is 0660, TCP is loopback unless configured otherwise).
 * SetLimit, and Release of a reservation the peer does not own, need an
 * authorised peer:
 *  - on the Unix socket, by SO_PEERCRED: root, the server's own uid, the
 *    configured admin_uid, or a member of admin_gid (primary group, or a
 *    supplementary one: SO_PEERGROUPS of the socket, else the Groups: line
 *    of /proc/PID/status);
 *  - on any transport, the configured tcp_token in the request body. Over
 *    TCP that is the only way: there are no peer credentials there.
 * The token is compared in time that does not depend on its content.
 *
 * Ownership of a reservation: the uid of the Unix peer that was granted
 * it. A reservation granted over TCP has no uid; every TCP peer is the same
 * anonymous principal, so any TCP peer may release it without a token (as
 * the owner), and a Unix peer needs authorisation to.
 */
#include "server.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#ifndef SO_PEERGROUPS
#define SO_PEERGROUPS 59
#endif

#define MAX_GROUPS 1024

const char *mts_auth_name(enum mts_auth a)
{
	switch (a) {
	case MTS_AUTH_ROOT:
		return "root";
	case MTS_AUTH_SERVER_UID:
		return "server_uid";
	case MTS_AUTH_ADMIN_UID:
		return "admin_uid";
	case MTS_AUTH_ADMIN_GID:
		return "admin_gid";
	case MTS_AUTH_TOKEN:
		return "token";
	case MTS_AUTH_OWNER:
		return "owner";
	default:
		return "none";
	}
}

bool mts_token_equal(const char *secret, const char *given)
{
	if (!secret || !secret[0] || !given)
		return false;
	size_t ls = strlen(secret), lg = strlen(given);
	/* The loop runs over the length of what the peer sent, and reads
	 * the secret at every index modulo its length: how long it takes
	 * says nothing about the secret's content. */
	unsigned char diff = ls != lg;
	for (size_t i = 0; i < lg; i++)
		diff |= (unsigned char)(secret[i % ls] ^ given[i]);
	/* Keep the compiler from cutting the loop short. */
	__asm__ volatile("" : "+r"(diff));
	return diff == 0;
}

/* Supplementary groups from the Groups: line of /proc/PID/status. */
static bool status_has_group(uint32_t pid, uint32_t gid)
{
	char path[64];
	snprintf(path, sizeof(path), "/proc/%u/status", pid);
	FILE *f = fopen(path, "re");
	if (!f)
		return false;
	char line[8192];
	bool found = false;
	while (fgets(line, sizeof(line), f)) {
		if (strncmp(line, "Groups:", 7) != 0)
			continue;
		char *p = line + 7;
		for (;;) {
			char *end;
			unsigned long v = strtoul(p, &end, 10);
			if (end == p)
				break;
			if (v == gid) {
				found = true;
				break;
			}
			p = end;
		}
		break;
	}
	fclose(f);
	return found;
}

bool mts_peer_in_group(const struct mts_peer *peer, uint32_t gid)
{
	if (!peer->has_cred)
		return false;
	if (peer->gid == gid)
		return true;
	if (peer->fd >= 0) {
		gid_t groups[MAX_GROUPS];
		socklen_t len = sizeof(groups);
		if (getsockopt(peer->fd, SOL_SOCKET, SO_PEERGROUPS, groups,
		               &len) == 0) {
			for (size_t i = 0; i < len / sizeof(gid_t); i++)
				if (groups[i] == gid)
					return true;
			return false;
		}
	}
	/* No SO_PEERGROUPS (old kernel, or no socket): the process's
	 * current groups. */
	return peer->pid && status_has_group(peer->pid, gid);
}

enum mts_auth mts_authorise(const struct mts_registry *reg,
                            const struct mts_peer *peer, const char *token)
{
	const struct mts_policy *pol = &reg->policy;
	if (peer->has_cred && !peer->tcp) {
		if (peer->uid == 0)
			return MTS_AUTH_ROOT;
		if (peer->uid == reg->server_uid)
			return MTS_AUTH_SERVER_UID;
		if (pol->has_admin_uid && peer->uid == pol->admin_uid)
			return MTS_AUTH_ADMIN_UID;
		if (pol->has_admin_gid &&
		    mts_peer_in_group(peer, pol->admin_gid))
			return MTS_AUTH_ADMIN_GID;
	}
	if (token && token[0] && mts_token_equal(pol->tcp_token, token))
		return MTS_AUTH_TOKEN;
	return MTS_AUTH_NONE;
}

enum mts_auth mts_authorise_release(const struct mts_registry *reg,
                                    const struct mts_peer *peer,
                                    const char *token, const struct mts_resv *r)
{
	if (peer->tcp && !r->has_owner)
		return MTS_AUTH_OWNER;
	if (!peer->tcp && peer->has_cred && r->has_owner && r->uid == peer->uid)
		return MTS_AUTH_OWNER;
	return mts_authorise(reg, peer, token);
}
