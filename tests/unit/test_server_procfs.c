/*
 * test_server_procfs.c - reading a process's start time and comm from
 * /proc, including stat lines whose comm holds spaces and parentheses, and
 * the logfmt quoting that keeps such names from forging log fields.
 */
#include "mts_log.h"
#include "mts_vouch.h"
#include "server.h"

#include <criterion/criterion.h>
#include <errno.h>
#include <grp.h>
#include <stdio.h>
#include <string.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

/* Fields 3 (state) to 21, then starttime (22) = 777, then more. */
#define TAIL " S 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 777 99 100\n"

Test(procfs, plain_comm)
{
	uint64_t st = 0;
	cr_assert_eq(mts_parse_stat_starttime("42 (bash)" TAIL, &st), 0);
	cr_assert_eq(st, 777);
}

Test(procfs, comm_with_spaces_and_parens)
{
	uint64_t st = 0;
	cr_assert_eq(mts_parse_stat_starttime("42 (a b) c)" TAIL, &st), 0);
	cr_assert_eq(st, 777);
	cr_assert_eq(mts_parse_stat_starttime("42 ()) ) 1 2 3)" TAIL, &st), 0);
	cr_assert_eq(st, 777);
	cr_assert_eq(mts_parse_stat_starttime("42 (x\ny)" TAIL, &st), 0);
	cr_assert_eq(st, 777);
}

Test(procfs, malformed)
{
	uint64_t st = 5;
	cr_assert_eq(mts_parse_stat_starttime("", &st), -EINVAL);
	cr_assert_eq(mts_parse_stat_starttime("42 bash S 1", &st), -EINVAL);
	cr_assert_eq(mts_parse_stat_starttime("42 (bash) S 1 2 3", &st),
	             -EINVAL);
	cr_assert_eq(mts_parse_stat_starttime("42 (bash)S 1 2 3 4 5 6 7 8 9 "
	                                      "10 11 12 13 14 15 16 17 18 "
	                                      "777",
	                                      &st),
	             -EINVAL);
	cr_assert_eq(mts_parse_stat_starttime("42 (b) S 1 2 3 4 5 6 7 8 9 10 "
	                                      "11 12 13 14 15 16 17 18 "
	                                      "-7 1",
	                                      &st),
	             -EINVAL);
	cr_assert_eq(mts_parse_stat_starttime("42 (b) S 1 2 3 4 5 6 7 8 9 10 "
	                                      "11 12 13 14 15 16 17 18 "
	                                      "7x 1",
	                                      &st),
	             -EINVAL);
	cr_assert_eq(st, 5);
}

Test(procfs, self)
{
	/* Cross-check field 22 with a scanf of our own stat line. */
	char line[2048];
	FILE *f = fopen("/proc/self/stat", "r");
	cr_assert_not_null(f);
	cr_assert_not_null(fgets(line, sizeof(line), f));
	fclose(f);
	unsigned long long want = 0;
	cr_assert_eq(sscanf(strrchr(line, ')') + 2,
	                    "%*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %*u "
	                    "%*u %*d %*d %*d %*d %*d %*d %llu",
	                    &want),
	             1);
	uint64_t mine = 0;
	cr_assert_eq(mts_parse_stat_starttime(line, &mine), 0);
	cr_assert_eq(mine, want);

	/* A comm that would break a naive parser. */
	prctl(PR_SET_NAME, "a) b (c", 0, 0, 0);
	uint64_t st = 0;
	cr_assert_eq(mts_read_starttime(getpid(), &st), 0);
	cr_assert_gt(st, 0);
	/* The name from the stat line a registration reads, as
	 * /proc/PID/comm has it. */
	char comm[64] = "junk";
	uint64_t st2 = 0;
	cr_assert_eq(mts_read_stat(getpid(), &st2, comm, sizeof(comm)), 0);
	cr_assert_eq(st2, st);
	cr_assert_str_eq(comm, "a) b (c");
	char from_comm[64] = "";
	FILE *cf = fopen("/proc/self/comm", "r");
	cr_assert_not_null(cf);
	cr_assert_not_null(fgets(from_comm, sizeof(from_comm), cf));
	fclose(cf);
	from_comm[strcspn(from_comm, "\n")] = '\0';
	cr_assert_str_eq(comm, from_comm);

	/* arg_start (field 48): where our arguments are, as exec left
	 * them; read beside the start time. A renaming changes neither. */
	uint64_t st3 = 0, mark = 0;
	cr_assert_eq(mts_read_exec_mark(getpid(), &st3, &mark), 0);
	cr_assert_eq(st3, st);
	extern char **environ;
	if (mark) /* 0 without ptrace access to ourselves: never here */
		cr_assert_lt(mark, (uint64_t)(uintptr_t)environ[0] + 1,
		             "arg_start %llx above the environment",
		             (unsigned long long)mark);
	uint64_t field = 0;
	cr_assert_eq(mts_parse_stat_field(line, 48, &field), 0);
	cr_assert_eq(field, mark);
	cr_assert_eq(mts_parse_stat_field(line, 2, &field), -EINVAL);
	cr_assert_eq(mts_parse_stat_field("1 (x) S 1", 48, &field), -EINVAL);

	/* Our parent and start time from the same line, the comm still
	 * "a) b (c". */
	uint32_t ppid = 0;
	uint64_t st4 = 0;
	cr_assert_eq(mts_read_parent(getpid(), &ppid, &st4), 0);
	cr_assert_eq(ppid, (uint32_t)getppid());
	cr_assert_eq(st4, st);
}

Test(procfs, comm_from_stat)
{
	char c[8];
	cr_assert_eq(mts_parse_stat_comm("42 (bash)" TAIL, c, sizeof(c)), 0);
	cr_assert_str_eq(c, "bash");
	cr_assert_eq(mts_parse_stat_comm("42 (a) b (c)" TAIL, c, sizeof(c)), 0);
	cr_assert_str_eq(c, "a) b (c");
	cr_assert_eq(mts_parse_stat_comm("42 ()" TAIL, c, sizeof(c)), 0);
	cr_assert_str_eq(c, "");
	/* Cut to the buffer, never past it. */
	cr_assert_eq(mts_parse_stat_comm("42 (abcdefghij)" TAIL, c, sizeof(c)),
	             0);
	cr_assert_str_eq(c, "abcdefg");
	strcpy(c, "junk");
	cr_assert_eq(mts_parse_stat_comm("42 bash S 1", c, sizeof(c)), -EINVAL);
	cr_assert_str_eq(c, "");
	cr_assert_eq(mts_parse_stat_comm("42 )bash( S 1", c, sizeof(c)),
	             -EINVAL);
}

Test(procfs, gone)
{
	uint64_t st;
	/* pid_max is at most 2^22: this pid never exists. */
	cr_assert_lt(mts_read_starttime(1 << 23, &st), 0);
	char comm[16] = "junk";
	cr_assert_lt(mts_read_stat(1 << 23, &st, comm, sizeof(comm)), 0);
	cr_assert_str_eq(comm, "");
}

/* Does `pid` descend from `anc`, by mts_add_ancestors()? */
static bool descends(pid_t pid, pid_t anc)
{
	uint32_t set[64], n = 0;
	mts_add_ancestors((uint32_t)pid, set, &n, 64);
	for (uint32_t i = 0; i < n; i++)
		if (set[i] == (uint32_t)anc)
			return true;
	return false;
}

/* A child that forks a grandchild named to look like another parent
 * ("x) S 1 " in its comm), which says its pid once named: both live until
 * killed (the child no longer than this test, the grandchild 60 s). */
Test(procfs, ancestry)
{
	int p[2];
	cr_assert_eq(pipe(p), 0);
	pid_t child = fork();
	cr_assert_geq(child, 0);
	if (child == 0) {
		prctl(PR_SET_PDEATHSIG, SIGKILL);
		if (fork() == 0) {
			alarm(60); /* outlives its parent: not for ever */
			prctl(PR_SET_NAME, "x) S 1 1 1", 0, 0, 0);
			pid_t self = getpid();
			if (write(p[1], &self, sizeof(self)) !=
			    (ssize_t)sizeof(self))
				_exit(1);
			for (;;)
				pause();
		}
		for (;;)
			pause();
	}
	pid_t grand = 0;
	cr_assert_eq(read(p[0], &grand, sizeof(grand)), (ssize_t)sizeof(grand));
	char state = 0;
	uint32_t ppid = 0;
	cr_assert_eq(mts_read_state_ppid(grand, &state, &ppid), 0);
	cr_assert_eq(ppid, (uint32_t)child);
	cr_assert(descends(child, getpid()));
	cr_assert(descends(grand, getpid()));
	cr_assert(descends(grand, child));
	/* Not the other way, not the comm's "1", never init. */
	cr_assert_not(descends(getpid(), child));
	cr_assert_not(descends(child, grand));
	cr_assert_not(descends(getppid(), getpid()));
	cr_assert_not(descends(grand, 1));
	uint32_t set[64], n = 0;
	cr_assert_eq(mts_add_ancestors(1u << 23, set, &n, 64), -ESRCH);
	cr_assert_eq(n, 0);
	/* Shared ancestors are added once: the grandchild adds only its
	 * parent beside the child's; a full set says so. */
	cr_assert_eq(mts_add_ancestors((uint32_t)child, set, &n, 64), 0);
	uint32_t mine = n;
	cr_assert_geq(mine, 1);
	cr_assert_eq(set[0], (uint32_t)getpid());
	cr_assert_eq(mts_add_ancestors((uint32_t)grand, set, &n, 64), 0);
	cr_assert_eq(n, mine + 1);
	cr_assert_eq(set[mine], (uint32_t)child);
	n = 0;
	cr_assert_eq(mts_add_ancestors((uint32_t)grand, set, &n, 1), -ENOSPC);
	cr_assert_eq(n, 1);
	/* The child dies: the grandchild is reparented, no longer its. */
	kill(child, SIGKILL);
	waitpid(child, NULL, 0);
	for (int i = 0;
	     i < 5000 && mts_read_state_ppid(grand, &state, &ppid) == 0 &&
	     ppid == (uint32_t)child;
	     i++)
		usleep(1000);
	cr_assert_eq(mts_read_state_ppid(grand, &state, &ppid), 0,
	             "the grandchild is still there");
	cr_assert_neq(ppid, (uint32_t)child);
	cr_assert_not(descends(grand, child));
	kill(grand, SIGKILL);
	close(p[0]);
	close(p[1]);
}

Test(log, quoting)
{
	char b[MTS_LOGQ_MAX];
	cr_assert_str_eq(mts_logq(b, sizeof(b), "etl"), "\"etl\"");
	cr_assert_str_eq(mts_logq(b, sizeof(b), ""), "\"\"");
	cr_assert_str_eq(mts_logq(b, sizeof(b), NULL), "\"\"");
	cr_assert_str_eq(mts_logq(b, sizeof(b), "a \"b\" c\\"),
	                 "\"a \\\"b\\\" c\\\\\"");
	cr_assert_str_eq(mts_logq(b, sizeof(b), "x\nlevel=error"),
	                 "\"x\\x0alevel=error\"");
	/* Whole characters pass; a byte of no character, C1 controls (CSI,
	 * NEL), line separators and bidi overrides are escaped. */
	cr_assert_str_eq(mts_logq(b, sizeof(b), "caf\xc3\xa9 \xe6\x97\xa5"),
	                 "\"caf\xc3\xa9 \xe6\x97\xa5\"");
	cr_assert_str_eq(mts_logq(b, sizeof(b),
	                          "a\x9b"
	                          "31m"),
	                 "\"a\\x9b31m\"");
	cr_assert_str_eq(mts_logq(b, sizeof(b), "\xc2\x9b\xc2\x85x"),
	                 "\"\\xc2\\x9b\\xc2\\x85x\"");
	cr_assert_str_eq(mts_logq(b, sizeof(b), "\xe2\x80\xa8\xe2\x80\xae"),
	                 "\"\\xe2\\x80\\xa8\\xe2\\x80\\xae\"");
	char small[6];
	cr_assert_str_eq(mts_logq(small, sizeof(small), "abcdef"), "\"abc\"");
	/* A character that does not fit is left out whole. */
	cr_assert_str_eq(mts_logq(small, sizeof(small), "ab\xe6\x97\xa5"),
	                 "\"ab\"");
	cr_assert_str_eq(mts_logq(small, sizeof(small), "a\"bcd"), "\"a\\\"\"");
}

/* Lines written to stderr while `fn` runs, into buf. */
static size_t capture_stderr(void (*fn)(void), char *buf, size_t cap)
{
	FILE *f = tmpfile();
	cr_assert_not_null(f);
	int saved = dup(STDERR_FILENO);
	dup2(fileno(f), STDERR_FILENO);
	fn();
	dup2(saved, STDERR_FILENO);
	close(saved);
	rewind(f);
	size_t n = fread(buf, 1, cap - 1, f);
	buf[n] = '\0';
	fclose(f);
	return n;
}

static unsigned colliding[2];

static void alternate(void)
{
	mts_log_set_budget(4);
	for (int i = 0; i < 1000; i++)
		mts_log_uid(colliding[i % 2], MTS_LOG_INFO, "granted", "i=%d",
		            i);
	mts_log_flush(true);
}

Test(log, two_uids_sharing_an_entry_keep_its_budget)
{
	/* Two uids of one budget entry (the entry is the top bits of
	 * uid x 2^64/phi, mod 64), taking turns: each takeover reported the
	 * other's held lines at once, a line per call past any budget. */
	unsigned a = 1000, b = 1001;
	unsigned ea =
	    (unsigned)(((unsigned long long)a * 0x9e3779b97f4a7c15ull) >> 58) %
	    64;
	while (
	    (unsigned)(((unsigned long long)b * 0x9e3779b97f4a7c15ull) >> 58) %
	        64 !=
	    ea)
		b++;
	colliding[0] = a;
	colliding[1] = b;
	static char buf[1 << 20];
	capture_stderr(alternate, buf, sizeof(buf));
	unsigned lines = 0;
	unsigned long written = 0, suppressed = 0;
	for (char *l = buf; *l;) {
		char *nl = strchr(l, '\n');
		if (nl)
			*nl = '\0';
		lines++;
		char *sup = strstr(l, "suppressed=");
		if (sup)
			suppressed += strtoul(sup + 11, NULL, 10);
		else if (strstr(l, "msg=\"granted\""))
			written++;
		if (!nl)
			break;
		l = nl + 1;
	}
	/* The budget (4 a second, shared) and its reports: a few lines a
	 * second, whatever the calls. */
	cr_assert_lt(lines, 40, "%u lines", lines);
	cr_assert_eq(written + suppressed, 1000, "%lu written, %lu suppressed",
	             written, suppressed);
}

Test(log, levels)
{
	enum mts_log_level l;
	cr_assert_eq(mts_log_parse_level("debug", &l), 0);
	cr_assert_eq(l, MTS_LOG_DEBUG);
	cr_assert_eq(mts_log_parse_level("WARN", &l), 0);
	cr_assert_eq(l, MTS_LOG_WARN);
	cr_assert_eq(mts_log_parse_level("warning", &l), 0);
	cr_assert_eq(mts_log_parse_level("error", &l), 0);
	cr_assert_eq(l, MTS_LOG_ERROR);
	cr_assert_eq(mts_log_parse_level("loud", &l), -EINVAL);
	mts_log_set_level(MTS_LOG_ERROR);
	cr_assert(!mts_log_enabled(MTS_LOG_WARN));
	cr_assert(mts_log_enabled(MTS_LOG_ERROR));
}

Test(procfs, statm_resident_and_anonymous)
{
	/* size resident shared text lib data dt, in pages */
	const char *statm = "131072 25600 600 10 0 30000 0\n";
	uint64_t rss = 0, anon = 0;
	cr_assert_eq(mts_parse_statm_rss(statm, 4096, &rss, &anon), 0);
	cr_assert_eq(rss, UINT64_C(25600) * 4096);
	cr_assert_eq(anon, UINT64_C(25000) * 4096, "resident less shared");
	rss = 0;
	cr_assert_eq(mts_parse_statm_rss(statm, 4096, &rss, NULL), 0);
	cr_assert_eq(rss, UINT64_C(25600) * 4096);
	/* More shared than resident (a racy read): no anonymous pages. */
	cr_assert_eq(mts_parse_statm_rss("10 5 6 0 0 0 0\n", 4096, &rss, &anon),
	             0);
	cr_assert_eq(anon, 0);
	cr_assert_eq(mts_parse_statm_rss("10 5\n", 4096, &rss, &anon), -EINVAL,
	             "anon asked, no shared field");
	cr_assert_eq(mts_parse_statm_rss("10\n", 4096, &rss, NULL), -EINVAL);
	cr_assert_eq(mts_parse_statm_rss("x 5 6\n", 4096, &rss, NULL), -EINVAL);
}

Test(procfs, status_lines_past_a_huge_groups_line_are_read)
{
	/* A Groups: line of 65536 gids (setgroups; a directory service's
	 * groups) before the memory lines: read whole and cut at 4 KiB, the
	 * figures were lost and the process never vouched for. */
	FILE *f = tmpfile();
	cr_assert_not_null(f);
	fprintf(f, "Name:\tw\nUid:\t2000\t2000\t2000\t2000\nGroups:\t");
	for (int g = 0; g < 65536; g++)
		fprintf(f, "%d ", 100000 + g);
	fprintf(f, "\nVmRSS:\t   81920 kB\nRssAnon:\t   65536 kB\n"
	           "RssShmem:\t    1024 kB\nVmSwap:\t       0 kB\n");
	fflush(f);
	rewind(f);
	char buf[4096];
	ssize_t n = mts_read_short_lines(fileno(f), buf, sizeof(buf));
	fclose(f);
	cr_assert_gt(n, 0);
	cr_assert_null(strstr(buf, "Groups:"), "the long line kept");
	cr_assert_not_null(strstr(buf, "\nUid:\t2000"), "%s", buf);
	struct mts_kernel_mem km;
	cr_assert_eq(mts_parse_status_mem(buf, &km), 0, "%s", buf);
	cr_assert_eq(km.anon, 65536u << 10);
	cr_assert_eq(km.shmem, 1024u << 10);

	/* A real process in 4096 supplementary groups (needs CAP_SETGID). */
	int go[2];
	cr_assert_eq(pipe(go), 0);
	pid_t kid = fork();
	cr_assert_geq(kid, 0);
	if (kid == 0) {
		static gid_t gs[4096];
		for (int i = 0; i < 4096; i++)
			gs[i] = (gid_t)(100000 + i);
		char ok = setgroups(4096, gs) == 0 ? 'y' : 'n';
		if (write(go[1], &ok, 1) != 1)
			_exit(1);
		pause();
		_exit(0);
	}
	char ok = 0;
	cr_assert_eq(read(go[0], &ok, 1), 1);
	if (ok == 'y') {
		n = mts_read_proc_status(kid, buf, sizeof(buf));
		cr_assert_gt(n, 0);
		cr_assert_eq(mts_parse_status_mem(buf, &km), 0, "%s", buf);
		cr_assert_gt(km.anon, 0);
		uint32_t uid = 99;
		cr_assert_eq(mts_read_real_uid(kid, &uid), 0);
		cr_assert_eq(uid, getuid());
	}
	kill(kid, SIGKILL);
	waitpid(kid, NULL, 0);
	close(go[0]);
	close(go[1]);
}
