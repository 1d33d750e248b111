/*
 * fuzz_size.c - libFuzzer target: the size parser (mt_parse_size, used for
 * every size a flag, the config file or the CLI gives) and the other
 * one-value parsers of config.c (percent, signal, HOST:PORT).
 *
 * The input is the text (a NUL is added). Properties beyond "no crash":
 * the parser returns 0, -EINVAL, -ERANGE or -EDOM only; on 0 a size
 * printed as plain decimal bytes parses back to the same value, and a
 * percent is at most 100% (10000 basis points).
 */
#include "server.h"

#include <errno.h>
#include <inttypes.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	char *s = malloc(size + 1);
	if (!s)
		abort();
	memcpy(s, data, size);
	s[size] = '\0';

	uint64_t v = 0;
	int r = mt_parse_size(s, &v);
	if (r != 0 && r != -EINVAL && r != -ERANGE && r != -EDOM)
		abort();
	if (r == 0) {
		char back[32];
		snprintf(back, sizeof(back), "%" PRIu64, v);
		uint64_t again = 0;
		if (mt_parse_size(back, &again) != 0 || again != v)
			abort();
		char human[32];
		mt_format_size(human, sizeof(human), v);
		if (!memchr(human, '\0', sizeof(human)))
			abort();
	}

	uint32_t bp = 0;
	if (mts_parse_percent(s, &bp) == 0 && bp > 10000)
		abort();
	int sig = 0;
	(void)mts_parse_signal(s, &sig);
	struct sockaddr_storage ss;
	socklen_t len;
	bool loopback = false;
	(void)mts_parse_hostport(s, &ss, &len, &loopback);
	free(s);
	return 0;
}
