/*
 * What client and server share (common/): the state names, the HOST:PORT
 * syntax, saturating sums, waiting on a descriptor and the defaults the
 * public header repeats.
 */
#define _GNU_SOURCE
#include <criterion/criterion.h>
#include <errno.h>
#include <poll.h>
#include <stdint.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "memtally.h"
#include "mtcommon.h"

Test(common, state_names)
{
	cr_assert_str_eq(mt_state_name(0), "ok");
	cr_assert_str_eq(mt_state_name(1), "high");
	cr_assert_str_eq(mt_state_name(2), "over");
	cr_assert_str_eq(mt_state_name(3), "unknown");
	cr_assert_str_eq(mt_state_name(UINT32_MAX), "unknown");
}

Test(common, sat_add)
{
	cr_assert_eq(mt_sat_add(1, 2), 3);
	cr_assert_eq(mt_sat_add(UINT64_MAX - 1, 1), UINT64_MAX);
	cr_assert_eq(mt_sat_add(UINT64_MAX - 1, 2), UINT64_MAX);
	cr_assert_eq(mt_sat_add(UINT64_MAX, UINT64_MAX), UINT64_MAX);
}

Test(common, hostport_accepts)
{
	static const struct {
		const char *in, *host;
		uint16_t port;
	} ok[] = {
	    {"127.0.0.1:7411", "127.0.0.1", 7411},
	    {"localhost:0", "localhost", 0},
	    {"[::1]:80", "::1", 80},
	    {"[::]:65535", "::", 65535},
	    {"node-7.example:9464", "node-7.example", 9464},
	};
	for (size_t i = 0; i < sizeof(ok) / sizeof(ok[0]); i++) {
		char host[64] = "unchanged";
		uint16_t port = 1;
		cr_assert_eq(
		    mt_split_hostport(ok[i].in, host, sizeof(host), &port), 0,
		    "refused \"%s\"", ok[i].in);
		cr_assert_str_eq(host, ok[i].host);
		cr_assert_eq(port, ok[i].port, "%s", ok[i].in);
	}
}

Test(common, hostport_refuses)
{
	static const char *const bad[] = {
	    "",         ":9464",     "127.0.0.1", "127.0.0.1:", "h:x",
	    "h:65536",  "h:-1",      "h: 1",      "h:+1",       "h:0x10",
	    "h:123456", "::1:80",    "[::1]",     "[::1:80",    "::1]:80",
	    "[]:80",    "[::1]x:80",
	};
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		char host[64];
		uint16_t port;
		cr_assert_eq(
		    mt_split_hostport(bad[i], host, sizeof(host), &port),
		    -EINVAL, "accepted \"%s\"", bad[i]);
	}
	char small[4];
	uint16_t port;
	cr_assert_eq(mt_split_hostport("abcd:1", small, sizeof(small), &port),
	             -EINVAL, "a host longer than the buffer");
	cr_assert_eq(mt_split_hostport("abc:1", small, sizeof(small), &port),
	             0);
	cr_assert_eq(mt_split_hostport(NULL, small, sizeof(small), &port),
	             -EINVAL);
}

Test(common, wait_fd_times_out_and_sees_readiness)
{
	int p[2];
	cr_assert_eq(pipe(p), 0);
	uint64_t t0 = mt_mono_ns();
	cr_assert_eq(mt_wait_fd(p[0], POLLIN, t0 + 50 * 1000000ull),
	             -ETIMEDOUT);
	cr_assert_geq(mt_mono_ns() - t0, 50 * 1000000ull,
	              "returned before the deadline");
	cr_assert_eq(mt_wait_fd(p[0], POLLIN, t0), -ETIMEDOUT, "past");
	cr_assert_eq(write(p[1], "x", 1), 1);
	cr_assert_eq(mt_wait_fd(p[0], POLLIN, UINT64_MAX), 0);
	close(p[1]);
	close(p[0]);
}

Test(common, sizes_round_trip)
{
	uint64_t v;
	char buf[32];
	cr_assert_eq(mt_parse_size("1.5GiB", &v), 0);
	cr_assert_eq(v, 3ull << 29);
	cr_assert_str_eq(mt_format_size(buf, sizeof(buf), v), "1.5 GiB");
	cr_assert_eq(mt_parse_size("1.5", &v), -EINVAL);
	cr_assert_eq(mt_parse_size("16EiB", &v), -EINVAL, "no E unit");
}

Test(common, public_defaults_match)
{
	cr_assert_str_eq(MEMTALLY_DEFAULT_SOCKET, MT_DEFAULT_SOCKET);
	cr_assert_eq(MEMTALLY_DEFAULT_THRESHOLD, MT_DEFAULT_THRESHOLD);
}

Test(common, send_all_delivers_times_out_and_sees_a_closed_peer)
{
	int sv[2];
	cr_assert_eq(socketpair(AF_UNIX, SOCK_STREAM, 0, sv), 0);
	cr_assert_eq(mt_send_all(sv[0], "hello", 5, UINT64_MAX), 0);
	char got[8] = {0};
	cr_assert_eq(read(sv[1], got, sizeof(got)), 5);
	cr_assert_str_eq(got, "hello");

	/* Nobody reads: the socket fills and the deadline ends the wait. */
	static char big[1 << 20];
	uint64_t t0 = mt_mono_ns();
	cr_assert_eq(mt_send_all(sv[0], big, sizeof(big), t0 + 50000000ull),
	             -ETIMEDOUT);

	/* The peer is gone: no SIGPIPE, an error. */
	close(sv[1]);
	cr_assert_eq(mt_send_all(sv[0], "x", 1, UINT64_MAX), -ECONNRESET);
	close(sv[0]);
}

Test(common, utf8_and_hostile_code_points)
{
	uint32_t c;
	cr_assert_eq(mt_utf8_seq((const unsigned char *)"a", &c), 1);
	cr_assert_eq(c, 'a');
	/* U+00E9 (2 bytes), U+202E RLO (3), U+1F600 (4). */
	cr_assert_eq(mt_utf8_seq((const unsigned char *)"\xc3\xa9", &c), 2);
	cr_assert_eq(c, 0xe9);
	cr_assert_eq(mt_utf8_seq((const unsigned char *)"\xe2\x80\xae", &c), 3);
	cr_assert_eq(c, 0x202e);
	cr_assert_eq(mt_utf8_seq((const unsigned char *)"\xf0\x9f\x98\x80", &c),
	             4);
	cr_assert_eq(c, 0x1f600);
	/* Overlong '/', a surrogate, a lone continuation, cut short. */
	cr_assert_eq(mt_utf8_seq((const unsigned char *)"\xc0\xaf", &c), 0);
	cr_assert_eq(mt_utf8_seq((const unsigned char *)"\xed\xa0\x80", &c), 0);
	cr_assert_eq(mt_utf8_seq((const unsigned char *)"\x80", &c), 0);
	cr_assert_eq(mt_utf8_seq((const unsigned char *)"\xe2\x80", &c), 0);
	/* C0, DEL, C1 (CSI), the bidi controls; not ordinary letters. */
	cr_assert(mt_cp_hostile(0x1b));
	cr_assert(mt_cp_hostile(0x7f));
	cr_assert(mt_cp_hostile(0x9b));
	cr_assert(mt_cp_hostile(0x202e));
	cr_assert(mt_cp_hostile(0x2066));
	cr_assert(mt_cp_hostile(0x061c));
	cr_assert_not(mt_cp_hostile('a'));
	cr_assert_not(mt_cp_hostile(0xe9));
	cr_assert_not(mt_cp_hostile(0x1f600));
}

Test(common, utf8_scrub_marks_each_byte_outside_a_sequence)
{
	char cut[] = "kind \xe3\x83\x87\xe3\x83 has";
	mt_utf8_scrub(cut);
	cr_assert_str_eq(cut, "kind \xe3\x83\x87?? has");
	char bad[] = "\xc0\xaf \xed\xa0\x80 \xf5\x80 ok \xf0\x9f\x98\x80";
	mt_utf8_scrub(bad);
	cr_assert_str_eq(bad, "?? ??? ?? ok \xf0\x9f\x98\x80");
	char whole[] = "caf\xc3\xa9";
	mt_utf8_scrub(whole);
	cr_assert_str_eq(whole, "caf\xc3\xa9");
}
