/*
 * auth.c - who may change limits and release someone else's reservation.
 *
 * Every peer is a uid when the kernel can say which: SO_PEERCRED on the
 * Unix socket, sock_diag for a TCP peer on this host (conn.c at accept).
 * Queries and admission are open to any identified peer that can reach a
 * socket. The Unix socket is 0660, and TCP is loopback unless configured
 * otherwise. A TCP peer whose uid is unknown needs the token on every
 * request (dispatch.c). SetLimit, and Release of a reservation the peer
 * does not own, need an authorised peer:
 *  - by uid: root, the server's own uid, the configured admin_uid, or a
 *    member of admin_gid. Group membership is checked only on the Unix
 *    socket, where there is a process to ask. It counts the primary group
 *    and the supplementary ones, from SO_PEERGROUPS of the socket, else
 *    the Groups: line of /proc/PID/status.
 *  - on any transport, the configured tcp_token in the request.
 * The token is compared in time that does not depend on its content.
 *
 * A reservation is owned by the uid of the peer that was granted it, over
 * either transport. A reservation granted to an unidentified TCP peer has
 * no uid. Those peers are one principal, since each of them showed the
 * token. So any of them may release it as the owner, and anyone else needs
 * authorisation to. The same principals decide whose workers may take a
 * task's reservation over (admit.c): the owner's uid or an admin's, and
 * any worker for a reservation without an owner.
 *
 * Admins also see every process's names. Others see another uid's
 * processes as `[server] show_others` says (dispatch.c).
 *
 * Admins, and a request carrying the token (mts_peer_trusted), are also
 * exempt from the per-uid caps on reservations and kinds (admit.c);
 * admins from those on slots and groups (registry.c) and connections
 * (conn.c). Those caps are counted by uid with mts_uid_count_add() and
 * its siblings (uidcount.c).
 * Admins may join any group. A [group NAME] with `uids` or `gids` may be
 * joined, by a worker or by an Admit naming it, only by a listed uid, a
 * member of a listed gid, or an admin.
 */
#include "mts_auth.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "mts_policy.h"
#include "mts_registry.h"

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

/* Groups of /proc/PID/status: the Groups: line (supplementary), and with
 * `effective` the Gid: line's effective gid too (the primary group, which
 * Groups: need not list). Read as a stream, number by number: the Groups:
 * line of a process in thousands of groups runs to hundreds of KiB, and
 * a line buffer cut it, once inside a number (10000909 read as 10: an
 * admin) and leaving the rest unread (an admin not seen). */
static bool status_has_group(uint32_t pid, uint32_t gid, bool effective)
{
	char path[64];
	snprintf(path, sizeof(path), "/proc/%u/status", pid);
	FILE *f = fopen(path, "re");
	if (!f)
		return false;
	enum { KEY, GID, GROUPS, OTHER } in = KEY;
	char key[16];
	size_t klen = 0;
	unsigned field = 0; /* numbers ended so far on this line */
	uint64_t v = 0;
	bool digits = false, found = false;
	int c;
	do {
		c = getc(f);
		if (in == KEY) {
			if (c == '\n' || c == EOF) {
				klen = 0;
				continue;
			}
			if (klen == sizeof(key) - 1) {
				in = OTHER;
				continue;
			}
			key[klen++] = (char)c;
			if (c != ':')
				continue;
			key[klen] = '\0';
			in = strcmp(key, "Groups:") == 0             ? GROUPS
			     : effective && strcmp(key, "Gid:") == 0 ? GID
			                                             : OTHER;
			field = 0;
			digits = false;
			continue;
		}
		if (in != OTHER && c >= '0' && c <= '9') {
			v = digits ? v * 10 + (uint64_t)(c - '0')
			           : (uint64_t)(c - '0');
			if (v > UINT32_MAX)
				v = (uint64_t)UINT32_MAX + 1; /* no gid */
			digits = true;
			continue;
		}
		if (digits) {
			/* Gid: real, effective, saved, filesystem. */
			if (v == gid && (in == GROUPS || field == 1))
				found = true;
			field++;
			digits = false;
		}
		if (c == '\n') {
			in = KEY;
			klen = 0;
		}
	} while (!found && c != EOF);
	fclose(f);
	return found;
}

bool mts_pid_in_group(uint32_t pid, uint32_t gid)
{
	return pid && status_has_group(pid, gid, true);
}

bool mts_peer_in_group(const struct mts_peer *peer, uint32_t gid)
{
	/* A TCP peer's groups are unknown: sock_diag gives the uid alone. */
	if (!peer->has_cred || peer->tcp)
		return false;
	if (peer->gid == gid)
		return true;
	if (peer->fd >= 0) {
		gid_t small[MAX_GROUPS], *groups = small;
		socklen_t len = sizeof(small);
		int r = getsockopt(peer->fd, SOL_SOCKET, SO_PEERGROUPS, groups,
		                   &len);
		if (r < 0 && errno == ERANGE) {
			/* More groups than MAX_GROUPS: len says how many.
			 * Never the pid's /proc instead: the peer may have
			 * exited and its pid be another process's now. */
			groups = malloc(len);
			if (!groups)
				return false;
			r = getsockopt(peer->fd, SOL_SOCKET, SO_PEERGROUPS,
			               groups, &len);
		}
		bool found = false;
		for (size_t i = 0; r == 0 && i < len / sizeof(gid_t); i++)
			found |= groups[i] == gid;
		int e = errno;
		if (groups != small)
			free(groups);
		if (r == 0 || e != ENOPROTOOPT)
			return found;
	}
	/* No SO_PEERGROUPS (a kernel before 4.13, or no socket): the
	 * process's current groups. */
	return peer->pid && status_has_group(peer->pid, gid, false);
}

/* Root, or the server's own uid, as such: not when root is not the
 * node's operator ([server] root_admin = false; a memtallyd running as
 * root is root then). */
static bool uid_is_root_or_server(const struct mts_registry *reg, uint32_t uid)
{
	if (uid == 0)
		return reg->policy.root_admin;
	return uid == reg->server_uid;
}

bool mts_uid_is_admin(const struct mts_registry *reg, uint32_t uid)
{
	const struct mts_policy *pol = &reg->policy;
	return uid_is_root_or_server(reg, uid) ||
	       (pol->has_admin_uid && uid == pol->admin_uid);
}

enum mts_auth mts_authorise(const struct mts_registry *reg,
                            const struct mts_peer *peer, const char *token)
{
	const struct mts_policy *pol = &reg->policy;
	if (peer->has_cred && uid_is_root_or_server(reg, peer->uid)) {
		return peer->uid == 0 ? MTS_AUTH_ROOT : MTS_AUTH_SERVER_UID;
	}
	if (peer->has_cred) {
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
                                    const char *token, bool has_owner,
                                    uint32_t owner)
{
	if (!peer->has_cred && !has_owner)
		return MTS_AUTH_OWNER;
	if (peer->has_cred && has_owner && owner == peer->uid)
		return MTS_AUTH_OWNER;
	return mts_authorise(reg, peer, token);
}

const char *mts_peer_who(const struct mts_peer *peer, char *buf, size_t cap)
{
	if (peer->tcp && peer->has_cred)
		snprintf(buf, cap, "uid=%u peer=%s", peer->uid, peer->addr);
	else if (peer->tcp)
		snprintf(buf, cap, "uid=unknown peer=%s", peer->addr);
	else if (peer->has_cred)
		snprintf(buf, cap, "peer_pid=%u uid=%u", peer->pid, peer->uid);
	else
		snprintf(buf, cap, "uid=unknown");
	return buf;
}

bool mts_peer_is_admin(const struct mts_registry *reg,
                       const struct mts_peer *peer)
{
	return peer->has_cred &&
	       mts_authorise(reg, peer, NULL) != MTS_AUTH_NONE;
}

bool mts_peer_trusted(const struct mts_registry *reg,
                      const struct mts_peer *peer)
{
	return peer->token_ok ||
	       mts_authorise(reg, peer, NULL) != MTS_AUTH_NONE;
}

bool mts_may_join_group(const struct mts_registry *reg,
                        const struct mts_peer *peer, const char *group)
{
	const struct mts_group_policy *g =
	    mts_policy_group(&reg->policy, group);
	if (!g || (g->nuids == 0 && g->ngids == 0))
		return true;
	/* The token is admin rights (a remote scheduler's), and admins may
	 * join any group. */
	if (peer->token_ok)
		return true;
	/* Only a peer the kernel vouches for can be in a list; a TCP peer
	 * (sock_diag: a uid, no process) by its uid only. */
	if (!peer->has_cred)
		return false;
	for (uint32_t i = 0; i < g->nuids; i++)
		if (g->uids[i] == peer->uid)
			return true;
	for (uint32_t i = 0; !peer->tcp && i < g->ngids; i++)
		if (mts_peer_in_group(peer, g->gids[i]))
			return true;
	return mts_peer_is_admin(reg, peer);
}
