/*
 * test_server_size.c - mt_parse_size(): the units, the 1024-vs-1000 rule,
 * fractions, and everything a config value must not be (signs, spaces,
 * overflow, a fraction of a byte); and mt_format_size(), the way sizes
 * are written back.
 */
#include "server.h"

#include <criterion/criterion.h>
#include <errno.h>

static uint64_t ok(const char *s)
{
	uint64_t v = 12345;
	int err = mt_parse_size(s, &v);
	cr_assert_eq(err, 0, "'%s' should parse, got %d", s, err);
	return v;
}

static void bad(const char *s, int want)
{
	uint64_t v = 777;
	int err = mt_parse_size(s, &v);
	cr_assert_eq(err, want, "'%s': want %d, got %d", s, want, err);
	cr_assert_eq(v, 777, "'%s': output written on error", s);
}

#define KIB UINT64_C(1024)
#define MIB (KIB * KIB)
#define GIB (MIB * KIB)
#define TIB (GIB * KIB)

Test(size, plain_bytes)
{
	cr_assert_eq(ok("0"), 0);
	cr_assert_eq(ok("4096"), 4096);
	cr_assert_eq(ok("4096B"), 4096);
	cr_assert_eq(ok("4096b"), 4096);
	cr_assert_eq(ok("007"), 7);
	cr_assert_eq(ok("18446744073709551615"), UINT64_MAX);
}

Test(size, binary_units)
{
	cr_assert_eq(ok("64KiB"), 64 * KIB);
	cr_assert_eq(ok("64kib"), 64 * KIB);
	cr_assert_eq(ok("64Ki"), 64 * KIB);
	cr_assert_eq(ok("64K"), 64 * KIB);
	cr_assert_eq(ok("64k"), 64 * KIB);
	cr_assert_eq(ok("512MiB"), 512 * MIB);
	cr_assert_eq(ok("512M"), 512 * MIB);
	cr_assert_eq(ok("64GiB"), 64 * GIB);
	cr_assert_eq(ok("2G"), 2 * GIB);
	cr_assert_eq(ok("3T"), 3 * TIB);
	cr_assert_eq(ok("3TiB"), 3 * TIB);
}

Test(size, decimal_units)
{
	cr_assert_eq(ok("1KB"), 1000);
	cr_assert_eq(ok("1kb"), 1000);
	cr_assert_eq(ok("512MB"), 512000000);
	cr_assert_eq(ok("2GB"), 2000000000);
	cr_assert_eq(ok("1TB"), UINT64_C(1000000000000));
}

Test(size, fractions_round_down)
{
	cr_assert_eq(ok("1.5G"), 3 * GIB / 2);
	cr_assert_eq(ok("1.5GiB"), 3 * GIB / 2);
	cr_assert_eq(ok("0.5K"), 512);
	cr_assert_eq(ok("1.3K"), 1331); /* 1331.2 */
	cr_assert_eq(ok("2.25MB"), 2250000);
	/* Not 0, but under a byte: refused, never rounded to 0 (for a
	 * limit, none). */
	uint64_t v = 7;
	cr_assert_eq(mt_parse_size("0.000000000000000000001T", &v), -EDOM);
	cr_assert_eq(mt_parse_size("0.0000001K", &v), -EDOM);
	cr_assert_eq(v, 7);
	cr_assert_eq(ok("0.000T"), 0);
	/* Digits past the 18th are ignored, not an error. */
	cr_assert_eq(ok("1.0000000000000000000000001K"), 1024);
}

Test(size, malformed)
{
	bad("", -EINVAL);
	bad("K", -EINVAL);
	bad(".5K", -EINVAL);
	bad("1.", -EINVAL);
	bad("1.K", -EINVAL);
	bad("-1", -EINVAL);
	bad("+1", -EINVAL);
	bad(" 1", -EINVAL);
	bad("1 K", -EINVAL);
	bad("1K ", -EINVAL);
	bad("1KK", -EINVAL);
	bad("1Kib0", -EINVAL);
	bad("1X", -EINVAL);
	bad("0x10", -EINVAL);
	bad("1e6", -EINVAL);
	bad("1.5", -EINVAL); /* a fraction of a byte */
	bad("1.5B", -EINVAL);
	bad("1,5G", -EINVAL);
	bad(NULL, -EINVAL);
}

Test(size, overflow)
{
	bad("18446744073709551616", -ERANGE);
	bad("99999999999999999999999999999", -ERANGE);
	bad("16777216T", -ERANGE); /* 2^24 TiB = 2^64 */
	cr_assert_eq(ok("16777215T"), 16777215 * TIB);
	cr_assert_eq(ok("16777215.5T"), 16777215 * TIB + TIB / 2);
	bad("17592186044416M", -ERANGE); /* 2^44 MiB */
	bad("18446744073709551615K", -ERANGE);
	/* Overflow is still checked after a bad unit would be: a malformed
	 * value is -EINVAL, whatever its size. */
	bad("99999999999999999999999X", -EINVAL);
}

Test(size, formatting)
{
	char b[32];
	cr_assert_str_eq(mt_format_size(b, sizeof(b), 0), "0 B");
	cr_assert_str_eq(mt_format_size(b, sizeof(b), 1023), "1023 B");
	cr_assert_str_eq(mt_format_size(b, sizeof(b), 1024), "1 KiB");
	cr_assert_str_eq(mt_format_size(b, sizeof(b), 600 * MIB), "600 MiB");
	cr_assert_str_eq(mt_format_size(b, sizeof(b), 1100 * MIB), "1.1 GiB");
	cr_assert_str_eq(mt_format_size(b, sizeof(b), 1024 * MIB - 1), "1 GiB");
	cr_assert_str_eq(mt_format_size(b, sizeof(b), UINT64_MAX), "16 EiB");
}
