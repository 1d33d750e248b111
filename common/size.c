/*
 * size.c - byte sizes as people write them ("64KiB", "1.5G", "512MB",
 * "4096") and as they read them ("1.1 GiB").
 *
 * The one size parser of the project: memtallyd's config and flags, the
 * CLI and the public memtally_parse_size() use it, so a size means the
 * same in the server's config and in `memtally limit set`: K, M, G, T and their
 * IEC forms Ki/KiB, ... are powers of 1024, because "64K" of memory means
 * that; only the explicit KB, MB, GB, TB are powers of 1000. Units are
 * case-insensitive. A fraction needs a unit (a fractional byte count is a
 * typo) and the result is rounded down, but never to 0 from a size that
 * is not 0 ("0.0000001K" is -EDOM: for a limit, 0 means none, and a
 * typo must not remove one). No sign, spaces or hex: something
 * that looks odd is refused, not guessed. The arithmetic is exact in 128
 * bits, and a value past UINT64_MAX is -ERANGE, never a wrapped one.
 */
#include <errno.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <strings.h>

#include "mtcommon.h"

#include <stdio.h>

#define KI UINT64_C(1024)
#define MI (KI << 10)
#define GI (KI << 20)
#define TI (KI << 30)
#define KD UINT64_C(1000)
#define MD (KD * 1000)
#define GD (MD * 1000)
#define TD (GD * 1000)

static const struct {
	const char *name;
	uint64_t mult;
} size_units[] = {
    {"", 1},     {"b", 1},   {"k", KI},   {"ki", KI}, {"kib", KI}, {"kb", KD},
    {"m", MI},   {"mi", MI}, {"mib", MI}, {"mb", MD}, {"g", GI},   {"gi", GI},
    {"gib", GI}, {"gb", GD}, {"t", TI},   {"ti", TI}, {"tib", TI}, {"tb", TD},
};

/* Fraction digits past this are checked but ignored: 10^-18 of a TiB is
 * far below a byte, and 10^18 still fits the 128-bit products below. */
#define SIZE_FRAC_DIGITS 18

int mt_parse_size(const char *s, uint64_t *out)
{
	if (!s || !out)
		return -EINVAL;
	unsigned __int128 whole = 0;
	bool too_big = false, nonzero = false;
	const char *p = s;
	for (; *p >= '0' && *p <= '9'; p++) {
		nonzero |= *p != '0';
		whole = whole * 10 + (unsigned)(*p - '0');
		if (whole > UINT64_MAX) {
			too_big = true;
			whole = (unsigned __int128)UINT64_MAX + 1;
		}
	}
	if (p == s)
		return -EINVAL; /* "", ".5", "K", "-1", " 1" */
	unsigned __int128 frac = 0, scale = 1;
	bool has_frac = *p == '.';
	if (has_frac) {
		const char *f = ++p;
		for (; *p >= '0' && *p <= '9'; p++) {
			nonzero |= *p != '0';
			if (p - f < SIZE_FRAC_DIGITS) {
				frac = frac * 10 + (unsigned)(*p - '0');
				scale *= 10;
			}
		}
		if (p == f)
			return -EINVAL; /* "1." */
	}
	uint64_t mult = 0;
	for (size_t i = 0; i < sizeof(size_units) / sizeof(size_units[0]); i++)
		if (strcasecmp(p, size_units[i].name) == 0) {
			mult = size_units[i].mult;
			break;
		}
	if (mult == 0 || (has_frac && mult == 1))
		return -EINVAL;
	if (too_big)
		return -ERANGE;
	/* whole <= 2^64 and mult <= 2^40: no 128-bit overflow. */
	unsigned __int128 v = whole * mult + frac * mult / scale;
	if (v > UINT64_MAX)
		return -ERANGE;
	if (v == 0 && nonzero)
		return -EDOM;
	*out = (uint64_t)v;
	return 0;
}

/* Tenths of the largest IEC unit that keeps the number >= 1. */
const char *mt_format_size(char *buf, size_t cap, uint64_t bytes)
{
	static const char *const iec[] = {"KiB", "MiB", "GiB",
	                                  "TiB", "PiB", "EiB"};
	if (bytes < 1024) {
		snprintf(buf, cap, "%llu B", (unsigned long long)bytes);
		return buf;
	}
	int u = 0;
	uint64_t div = 1024;
	while (u < 5 && bytes / div >= 1024) {
		div *= 1024;
		u++;
	}
	/* Tenths, rounded half up, in integers: exact for any uint64_t. */
	unsigned __int128 tenths =
	    ((unsigned __int128)bytes * 10 + div / 2) / div;
	if (tenths >= 10240 && u < 5) {
		/* 1023.96 MiB rounds to 1024.0: say 1 GiB instead. */
		div *= 1024;
		u++;
		tenths = ((unsigned __int128)bytes * 10 + div / 2) / div;
	}
	unsigned long long whole = (unsigned long long)(tenths / 10);
	unsigned frac = (unsigned)(tenths % 10);
	if (frac)
		snprintf(buf, cap, "%llu.%u %s", whole, frac, iec[u]);
	else
		snprintf(buf, cap, "%llu %s", whole, iec[u]);
	return buf;
}
