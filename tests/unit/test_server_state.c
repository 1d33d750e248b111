/*
 * test_server_state.c - the restart record's file (server/state.c): one
 * memtallyd did not make is never written, but replaced, and the server
 * starts on the new one.
 */
#include <errno.h>
#include <signal.h>
#include <string.h>
#include <time.h>
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

Test(state_file, something_in_its_place_means_no_record_not_no_server)
{
	/* A directory where the record goes (a writable directory's other
	 * user made it): memtallyd runs without a record, as when it
	 * cannot create one. */
	cr_assert_eq(mkdir(path, 0755), 0);
	struct mts_state_info info = {
	    .slots = 8, .lanes = 2, .threshold = 1000};
	struct mts_state *st = NULL;
	bool adopt = true;
	cr_assert_eq(mts_state_open(path, false, &info, &adopt, &st), 0);
	cr_assert_null(st);
	cr_assert_not(adopt);
	rmdir(path);
}

Test(state_file, a_leased_record_does_not_hold_the_start)
{
	/* A read lease on the record (held here, as anyone owning the file
	 * could): an open for writing waited for the lease break, 45 s. */
	struct mts_state_info info = {
	    .slots = 8, .lanes = 2, .threshold = 1000};
	struct mts_state *st = NULL;
	bool adopt = true;
	cr_assert_eq(mts_state_open(path, false, &info, &adopt, &st), 0);
	cr_assert_not_null(st);
	mts_state_close(st);
	signal(SIGIO, SIG_IGN);
	int lfd = open(path, O_RDONLY);
	cr_assert_geq(lfd, 0);
	if (fcntl(lfd, F_SETLEASE, F_RDLCK) < 0)
		cr_skip_test("no read lease here: %s", strerror(errno));
	struct timespec t0, t1;
	clock_gettime(CLOCK_MONOTONIC, &t0);
	st = NULL;
	cr_assert_eq(mts_state_open(path, false, &info, &adopt, &st), 0);
	clock_gettime(CLOCK_MONOTONIC, &t1);
	cr_assert_lt(t1.tv_sec - t0.tv_sec, 5, "the start waited on a lease");
	cr_assert_null(st, "a leased record was opened");
	close(lfd);
}
