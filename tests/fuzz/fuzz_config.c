/*
 * fuzz_config.c - libFuzzer target: memtallyd's config file parser
 * (mts_settings_load: inih, then every [section] key = value, then the
 * cross-checks of finish()).
 *
 * The input is the file's text, written to a memfd and read back through
 * /proc/self/fd/N, so read_config() takes its real path (fstat, size cap,
 * NUL and long-line checks). Properties beyond "no crash, no leak": the
 * result is 0 or a negative errno; on failure the message is one
 * non-empty line; on success the settings are freed cleanly.
 */
#include "server.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

static int fd = -1;
static char path[64];

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	if (fd < 0) {
		fd = memfd_create("fuzz_config", MFD_CLOEXEC);
		if (fd < 0)
			abort();
		snprintf(path, sizeof(path), "/proc/self/fd/%d", fd);
	}
	if (ftruncate(fd, 0) != 0 || pwrite(fd, data, size, 0) != (ssize_t)size)
		abort();

	struct mts_settings s;
	char err[512] = "";
	int r = mts_settings_load(&s, path, NULL, 0, err, sizeof(err));
	if (r > 0)
		abort();
	if (r < 0) {
		if (err[0] == '\0' || strchr(err, '\n'))
			abort();
	} else {
		mts_settings_free(&s);
	}
	return 0;
}
