/*
 * test_server_state.c - the restart record's file (server/state.c): one
 * memtallyd did not make is never written, but replaced, and the server
 * starts on the new one.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include <criterion/criterion.h>

#include "mts_log.h"
#include "mts_state.h"

static char dir[64], path[96];

static void setup(void)
{
	mts_log_set_level(MTS_LOG_ERROR); /* keep test output quiet */
	snprintf(dir, sizeof(dir), "/tmp/mt-state-XXXXXX");
	cr_assert_not_null(mkdtemp(dir));
	snprintf(path, sizeof(path), "%s/s.state", dir);
}

static void teardown(void)
{
	unlink(path);
	rmdir(dir);
}

TestSuite(state_file, .init = setup, .fini = teardown);

Test(state_file, a_foreign_file_is_replaced_and_the_server_starts)
{
	/* Writable by others: not ours to write, whatever it holds. */
	int fd = open(path, O_CREAT | O_WRONLY, 0600);
	cr_assert_geq(fd, 0);
	cr_assert_eq(write(fd, "not a record", 12), 12);
	close(fd);
	cr_assert_eq(chmod(path, 0666), 0);
	struct mts_state_info info = {
	    .slots = 8, .lanes = 2, .threshold = 1000};
	struct mts_state *st = NULL;
	bool adopt = true;
	/* What the server's start leaves in errno before it (its directory
	 * made already, say) must not decide the outcome. */
	errno = EEXIST;
	cr_assert_eq(mts_state_open(path, false, &info, &adopt, &st), 0);
	cr_assert_not_null(st, "no record: the server runs without one");
	cr_assert_not(adopt, "a foreign file adopted");
	struct stat sb;
	cr_assert_eq(stat(path, &sb), 0);
	cr_assert_eq(sb.st_mode & 0777, 0600, "the new record is %o",
	             sb.st_mode & 0777);
	mts_state_close(st);
}
