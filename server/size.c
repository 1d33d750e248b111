/*
 * size.c - parse human byte sizes ("64KiB", "1.5G", "512MB", "4096"), and
 * format them back for people ("1.1 GiB").
 *
 * The convention (documented in --help): K, M, G, T and their IEC forms
 * Ki/KiB, Mi/MiB, ... are powers of 1024, because that is what people mean
 * by "64K" of memory; only the explicit KB, MB, GB, TB are powers of 1000.
 * Units are case-insensitive. The number is digits with an optional
 * fraction; a fraction needs a unit (a fractional byte count is a typo).
 * The result is rounded down. Arithmetic is exact (128-bit), and anything
 * past UINT64_MAX is -ERANGE rather than a silently wrapped value. No sign,
 * no spaces, no hex: a config value that looks odd is refused, not guessed.
 */
#include "server.h"

#include <errno.h>
#include <stdio.h>
#include <strings.h>

struct unit {
	const char *name;
	uint64_t mult;
};

#define KI (UINT64_C(1) << 10)
#define KD UINT64_C(1000)

static const struct unit units[] = {
    {"", 1},
    {"b", 1},
    {"k", KI},
    {"ki", KI},
    {"kib", KI},
    {"kb", KD},
    {"m", KI *KI},
    {"mi", KI *KI},
    {"mib", KI *KI},
    {"mb", KD *KD},
    {"g", KI *KI *KI},
    {"gi", KI *KI *KI},
    {"gib", KI *KI *KI},
    {"gb", KD *KD *KD},
    {"t", KI *KI *KI *KI},
    {"ti", KI *KI *KI *KI},
    {"tib", KI *KI *KI *KI},
    {"tb", KD *KD *KD *KD},
};

/* Fraction digits beyond this are checked but ignored: 10^-18 of a TiB is
 * far below one byte. */
#define FRAC_DIGITS_MAX 18

int mt_parse_size(const char *s, uint64_t *out)
{
	if (!s || !out)
		return -EINVAL;
	const char *p = s;
	unsigned __int128 whole = 0;
	bool overflow = false;
	int ndig = 0;
	for (; *p >= '0' && *p <= '9'; p++, ndig++) {
		whole = whole * 10 + (unsigned)(*p - '0');
		if (whole > UINT64_MAX) {
			overflow = true;
			whole = (unsigned __int128)UINT64_MAX +
			        1; /* stay bounded */
		}
	}
	unsigned __int128 frac = 0, frac_div = 1;
	bool has_frac = false;
	if (*p == '.') {
		has_frac = true;
		p++;
		int fdig = 0;
		for (; *p >= '0' && *p <= '9'; p++, fdig++) {
			if (fdig < FRAC_DIGITS_MAX) {
				frac = frac * 10 + (unsigned)(*p - '0');
				frac_div *= 10;
			}
		}
		if (fdig == 0)
			return -EINVAL; /* "1." */
	}
	if (ndig == 0)
		return -EINVAL; /* "", ".5", "K", "-1" */

	const struct unit *u = NULL;
	for (size_t i = 0; i < sizeof(units) / sizeof(units[0]); i++) {
		if (strcasecmp(p, units[i].name) == 0) {
			u = &units[i];
			break;
		}
	}
	if (!u || (has_frac && u->mult == 1))
		return -EINVAL;
	if (overflow)
		return -ERANGE;

	/* whole < 2^64 and mult <= 2^40, so neither product overflows 128
	 * bits; frac < 10^18 < 2^60. */
	unsigned __int128 v = whole * u->mult + frac * u->mult / frac_div;
	if (v > UINT64_MAX)
		return -ERANGE;
	*out = (uint64_t)v;
	return 0;
}

const char *mts_format_size(char *buf, size_t cap, uint64_t bytes)
{
	static const char *const iec[] = {"KiB", "MiB", "GiB", "TiB", "PiB",
	                                  "EiB"};
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
