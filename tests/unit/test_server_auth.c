/*
 * test_server_auth.c - authorisation decisions: root, the server's uid,
 * admin uid, admin gid (primary group, supplementary groups by
 * SO_PEERGROUPS on a real socket and by /proc/PID/status), the TCP token
 * (constant-time comparison), and who may release a reservation.
 *
 * No loop or segment is needed: mts_authorise() reads only the policy and
 * the server's uid from the registry. Tests that change this process's
 * groups rely on running as root (they skip otherwise) and on each test
 * being its own process.
 */
#include "server.h"

#include <criterion/criterion.h>
#include <grp.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

static struct mts_registry reg;

static void setup(void)
{
	memset(&reg, 0, sizeof(reg));
	mts_policy_defaults(&reg.policy);
	reg.server_uid = 4242;
}

static void teardown(void)
{
	mts_policy_free(&reg.policy);
}

TestSuite(auth, .init = setup, .fini = teardown, .timeout = 10);

static struct mts_peer unix_peer(uint32_t uid, uint32_t gid)
{
	return (struct mts_peer){
	    .fd = -1, .has_cred = true, .pid = 0, .uid = uid, .gid = gid};
}

Test(auth, token_comparison)
{
	cr_assert(mts_token_equal("0123456789abcdef", "0123456789abcdef"));
	cr_assert_not(mts_token_equal("0123456789abcdef", "0123456789abcdeF"));
	cr_assert_not(mts_token_equal("0123456789abcdef", "0123456789abcde"));
	cr_assert_not(mts_token_equal("0123456789abcdef", "0123456789abcdef0"));
	cr_assert_not(mts_token_equal("0123456789abcdef", ""));
	/* A repetition of the secret is not the secret. */
	cr_assert_not(mts_token_equal("abcd", "abcdabcd"));
	/* No token configured: nothing matches, not even "". */
	cr_assert_not(mts_token_equal(NULL, ""));
	cr_assert_not(mts_token_equal("", ""));
	cr_assert_not(mts_token_equal("x", NULL));
}

Test(auth, unix_peers)
{
	struct mts_peer p = unix_peer(0, 0);
	cr_assert_eq(mts_authorise(&reg, &p, NULL), MTS_AUTH_ROOT);
	p = unix_peer(4242, 100);
	cr_assert_eq(mts_authorise(&reg, &p, NULL), MTS_AUTH_SERVER_UID);
	p = unix_peer(1000, 1000);
	cr_assert_eq(mts_authorise(&reg, &p, NULL), MTS_AUTH_NONE);
	reg.policy.has_admin_uid = true;
	reg.policy.admin_uid = 1000;
	cr_assert_eq(mts_authorise(&reg, &p, NULL), MTS_AUTH_ADMIN_UID);
	p = unix_peer(1001, 555);
	cr_assert_eq(mts_authorise(&reg, &p, NULL), MTS_AUTH_NONE);
	reg.policy.has_admin_gid = true;
	reg.policy.admin_gid = 555;
	cr_assert_eq(mts_authorise(&reg, &p, NULL), MTS_AUTH_ADMIN_GID);
	/* uid 0 of a peer without credentials is nobody. */
	struct mts_peer anon = {.fd = -1};
	cr_assert_eq(mts_authorise(&reg, &anon, NULL), MTS_AUTH_NONE);
	cr_assert_str_eq(mts_auth_name(MTS_AUTH_ADMIN_GID), "admin_gid");
}

Test(auth, root_without_admin_rights)
{
	/* [server] root_admin = false: a DaemonSet's socket reaches pods
	 * that run as root, and root in one of them must not set the
	 * fleet's limit or release everyone's reservations. Root is then
	 * an admin only as admin_uid, or with the token. */
	reg.policy.root_admin = false;
	struct mts_peer p = unix_peer(0, 0);
	cr_assert_eq(mts_authorise(&reg, &p, NULL), MTS_AUTH_NONE);
	cr_assert_not(mts_uid_is_admin(&reg, 0));
	cr_assert_not(mts_peer_is_admin(&reg, &p));
	/* A memtallyd running as root: its own uid is root, no admin. */
	reg.server_uid = 0;
	cr_assert_eq(mts_authorise(&reg, &p, NULL), MTS_AUTH_NONE);
	/* Another uid of the server's stays its own. */
	reg.server_uid = 4242;
	p = unix_peer(4242, 100);
	cr_assert_eq(mts_authorise(&reg, &p, NULL), MTS_AUTH_SERVER_UID);
	/* The token still works. */
	reg.policy.tcp_token = strdup("0123456789abcdef0123");
	p = unix_peer(0, 0);
	cr_assert_eq(mts_authorise(&reg, &p, "0123456789abcdef0123"),
	             MTS_AUTH_TOKEN);
	/* Named as admin_uid, root is one again. */
	reg.policy.has_admin_uid = true;
	reg.policy.admin_uid = 0;
	cr_assert_eq(mts_authorise(&reg, &p, NULL), MTS_AUTH_ADMIN_UID);
	cr_assert(mts_uid_is_admin(&reg, 0));
	/* The default: root is. */
	struct mts_policy d;
	mts_policy_defaults(&d);
	cr_assert(d.root_admin);
	mts_policy_free(&d);
}

Test(auth, tcp_needs_the_token)
{
	struct mts_peer tcp = {.fd = -1, .tcp = true};
	cr_assert_eq(mts_authorise(&reg, &tcp, "anything-at-all-123"),
	             MTS_AUTH_NONE, "no token configured");
	reg.policy.tcp_token = strdup("s3cret-s3cret-s3cret");
	cr_assert_eq(mts_authorise(&reg, &tcp, NULL), MTS_AUTH_NONE);
	cr_assert_eq(mts_authorise(&reg, &tcp, ""), MTS_AUTH_NONE);
	cr_assert_eq(mts_authorise(&reg, &tcp, "s3cret-s3cret-s3creT"),
	             MTS_AUTH_NONE);
	cr_assert_eq(mts_authorise(&reg, &tcp, "s3cret-s3cret-s3cret"),
	             MTS_AUTH_TOKEN);
	/* A TCP peer the kernel tied to a uid (sock_diag) is that uid:
	 * root is root, admin_uid is admin; its groups are not known, so
	 * admin_gid never matches over TCP. */
	tcp.has_cred = true;
	tcp.uid = 0;
	cr_assert_eq(mts_authorise(&reg, &tcp, NULL), MTS_AUTH_ROOT);
	tcp.uid = 1000;
	tcp.gid = 555;
	reg.policy.has_admin_gid = true;
	reg.policy.admin_gid = 555;
	cr_assert_eq(mts_authorise(&reg, &tcp, NULL), MTS_AUTH_NONE);
	reg.policy.has_admin_gid = false;
	reg.policy.has_admin_uid = true;
	reg.policy.admin_uid = 1000;
	cr_assert_eq(mts_authorise(&reg, &tcp, NULL), MTS_AUTH_ADMIN_UID);
	reg.policy.has_admin_uid = false;
	/* The token also authorises a Unix peer. */
	struct mts_peer p = unix_peer(1000, 1000);
	cr_assert_eq(mts_authorise(&reg, &p, "s3cret-s3cret-s3cret"),
	             MTS_AUTH_TOKEN);
}

Test(auth, release_by_owner)
{
	struct mts_resv r = {.has_owner = true, .uid = 1000};
	struct mts_peer owner = unix_peer(1000, 1000);
	struct mts_peer other = unix_peer(1001, 1001);
	struct mts_peer root = unix_peer(0, 0);
	struct mts_peer tcp = {.fd = -1, .tcp = true};
	cr_assert_eq(
	    mts_authorise_release(&reg, &owner, NULL, r.has_owner, r.uid),
	    MTS_AUTH_OWNER);
	cr_assert_eq(
	    mts_authorise_release(&reg, &other, NULL, r.has_owner, r.uid),
	    MTS_AUTH_NONE);
	cr_assert_eq(
	    mts_authorise_release(&reg, &root, NULL, r.has_owner, r.uid),
	    MTS_AUTH_ROOT);
	cr_assert_eq(
	    mts_authorise_release(&reg, &tcp, NULL, r.has_owner, r.uid),
	    MTS_AUTH_NONE);
	struct mts_resv by_tcp = {.has_owner = false};
	cr_assert_eq(mts_authorise_release(&reg, &tcp, NULL, by_tcp.has_owner,
	                                   by_tcp.uid),
	             MTS_AUTH_OWNER);
	cr_assert_eq(mts_authorise_release(&reg, &other, NULL, by_tcp.has_owner,
	                                   by_tcp.uid),
	             MTS_AUTH_NONE);
	/* Over loopback TCP the kernel names the uid: the owner's own TCP
	 * connection owns it, another uid's does not. */
	struct mts_peer tcp_owner = {
	    .fd = -1, .tcp = true, .has_cred = true, .uid = 1000};
	struct mts_peer tcp_other = tcp_owner;
	tcp_other.uid = 1001;
	cr_assert_eq(
	    mts_authorise_release(&reg, &tcp_owner, NULL, r.has_owner, r.uid),
	    MTS_AUTH_OWNER);
	cr_assert_eq(
	    mts_authorise_release(&reg, &tcp_other, NULL, r.has_owner, r.uid),
	    MTS_AUTH_NONE);
	cr_assert_eq(mts_authorise_release(&reg, &tcp_owner, NULL,
	                                   by_tcp.has_owner, by_tcp.uid),
	             MTS_AUTH_NONE);
}

/* Make this process's supplementary groups {gid}; false if not root. */
static bool set_groups(gid_t gid)
{
	if (geteuid() != 0)
		return false;
	gid_t g[1] = {gid};
	return setgroups(1, g) == 0;
}

Test(auth, admin_gid_as_supplementary_group_by_proc_status)
{
	if (!set_groups(6543))
		cr_skip_test("needs root to set supplementary groups");
	reg.policy.has_admin_gid = true;
	reg.policy.admin_gid = 6543;
	/* No socket: the Groups: line of /proc/PID/status decides. */
	struct mts_peer p = unix_peer(1000, 1000);
	p.pid = (uint32_t)getpid();
	cr_assert(mts_peer_in_group(&p, 6543));
	cr_assert_not(mts_peer_in_group(&p, 6544));
	cr_assert_eq(mts_authorise(&reg, &p, NULL), MTS_AUTH_ADMIN_GID);
}

Test(auth, admin_gid_among_thousands_of_groups_by_proc_status)
{
	/* 1200 supplementary groups: a Groups: line of 10 KiB. Read whole
	 * and number by number: 10000909 is not 10, and the last is seen. */
	if (geteuid() != 0)
		cr_skip_test("needs root to set supplementary groups");
	static gid_t many[1200];
	for (int i = 0; i < 1200; i++)
		many[i] = 10000000 + (gid_t)i;
	cr_assert_eq(setgroups(1200, many), 0);
	cr_assert_not(mts_pid_in_group((uint32_t)getpid(), 10));
	cr_assert_not(mts_pid_in_group((uint32_t)getpid(), 1000090));
	cr_assert(mts_pid_in_group((uint32_t)getpid(), 10001199), "the last");
	cr_assert(mts_pid_in_group((uint32_t)getpid(), 10000000), "the first");
	cr_assert(mts_pid_in_group((uint32_t)getpid(), getegid()), "Gid:");
	cr_assert(set_groups(1));
}

Test(auth, admin_gid_by_so_peergroups)
{
	if (!set_groups(7654))
		cr_skip_test("needs root to set supplementary groups");
	int sv[2];
	cr_assert_eq(socketpair(AF_UNIX, SOCK_STREAM, 0, sv), 0);
	/* The peer's groups were taken at socketpair(): change ours after,
	 * so /proc/self/status would say otherwise. */
	cr_assert(set_groups(1));
	struct mts_peer p = unix_peer(1000, 1000);
	p.fd = sv[0];
	p.pid = (uint32_t)getpid();
	cr_assert(mts_peer_in_group(&p, 7654));
	cr_assert_not(mts_peer_in_group(&p, 1));
	close(sv[0]);
	close(sv[1]);
}

Test(auth, admin_gid_among_thousands_of_groups_by_so_peergroups)
{
	/* 2000 supplementary groups, more than the first getsockopt holds
	 * (ERANGE): the answer is still the socket's, never the pid's
	 * /proc (its pid may be another process's by then), here made to
	 * say otherwise. */
	if (geteuid() != 0)
		cr_skip_test("needs root to set supplementary groups");
	static gid_t many[2000];
	for (int i = 0; i < 2000; i++)
		many[i] = 100000 + (gid_t)i;
	cr_assert_eq(setgroups(2000, many), 0);
	int sv[2];
	cr_assert_eq(socketpair(AF_UNIX, SOCK_STREAM, 0, sv), 0);
	cr_assert(set_groups(1));
	struct mts_peer p = unix_peer(1000, 1000);
	p.fd = sv[0];
	p.pid = (uint32_t)getpid();
	cr_assert(mts_peer_in_group(&p, 101999), "the last of 2000");
	cr_assert_not(mts_peer_in_group(&p, 1), "this process's group now");
	close(sv[0]);
	close(sv[1]);
}
