/*
 * size.c - format byte sizes for people ("1.1 GiB"), in log lines and
 * denial reasons. Parsing is the client's memtally_parse_size()
 * (client/size.c), shared so that a size means the same everywhere.
 */
#include "server.h"

#include <stdio.h>

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
