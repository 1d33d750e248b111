/*
 * A stand-in for <criterion/criterion.h>, used only by ThreadSanitizer
 * builds: Criterion 2.4 aborts at start under TSan ("Could not initialize
 * inheritable arena", Snaipe/Criterion#274), so under TSan every unit test
 * compiles against this header instead. It implements the part of
 * Criterion's API the tests use, with Criterion's semantics: every test in
 * its own process, suite and test init/fini, a timeout, assertions that end
 * the test, expectations that mark it failed and go on.
 */
#ifndef MEMTALLY_MINI_CRITERION_H
#define MEMTALLY_MINI_CRITERION_H

#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

struct mc_opts {
	void (*init)(void);
	void (*fini)(void);
	double timeout;
	int disabled;
	const char *description;
};

struct mc_test {
	const char *suite, *name;
	void (*fn)(void);
	struct mc_opts o;
	struct mc_test *next;
};

struct mc_suite {
	const char *name;
	struct mc_opts o;
	struct mc_suite *next;
};

static struct mc_test *mc_tests;
static struct mc_suite *mc_suites;
static int mc_expect_failed;
/* The running test's fini functions, run also when an assertion fails (as
 * Criterion does), so a test's helpers never outlive it. */
static void (*mc_fini_test)(void);
static void (*mc_fini_suite)(void);

#define TestSuite(s, ...)                                                    \
	static struct mc_suite mc_suite_##s = {#s, {.disabled = 0, __VA_ARGS__}, \
					       NULL};                        \
	__attribute__((constructor)) static void mc_sreg_##s(void)           \
	{                                                                    \
		mc_suite_##s.next = mc_suites;                               \
		mc_suites = &mc_suite_##s;                                   \
	}

#define Test(s, n, ...)                                                      \
	static void mc_fn_##s##_##n(void);                                   \
	static struct mc_test mc_t_##s##_##n = {                             \
		#s, #n, mc_fn_##s##_##n, {.disabled = 0, __VA_ARGS__}, NULL}; \
	__attribute__((constructor)) static void mc_reg_##s##_##n(void)      \
	{                                                                    \
		mc_t_##s##_##n.next = mc_tests;                              \
		mc_tests = &mc_t_##s##_##n;                                  \
	}                                                                    \
	static void mc_fn_##s##_##n(void)

__attribute__((format(printf, 5, 6))) static void
mc_report(int fatal, const char *file, int line, const char *expr,
	  const char *fmt, ...)
{
	/* fmt is ":" followed by the caller's format, if any. */
	fprintf(stderr, "%s:%d: assertion failed: %s", file, line, expr);
	va_list ap;
	va_start(ap, fmt);
	vfprintf(stderr, fmt, ap);
	va_end(ap);
	fputc('\n', stderr);
	if (fatal) {
		if (mc_fini_test)
			mc_fini_test();
		if (mc_fini_suite)
			mc_fini_suite();
		fflush(NULL);
		_exit(1);
	}
	mc_expect_failed = 1;
}

#define mc_check(fatal, cond, expr, ...)                                     \
	do {                                                                 \
		if (!(cond))                                                 \
			mc_report(fatal, __FILE__, __LINE__, expr,           \
				  ": " __VA_ARGS__);                         \
	} while (0)

#define cr_assert(c, ...)        mc_check(1, (c), #c, __VA_ARGS__)
#define cr_expect(c, ...)        mc_check(0, (c), #c, __VA_ARGS__)
#define cr_assert_eq(a, b, ...)  mc_check(1, (a) == (b), #a " == " #b, __VA_ARGS__)
#define cr_expect_eq(a, b, ...)  mc_check(0, (a) == (b), #a " == " #b, __VA_ARGS__)
#define cr_assert_neq(a, b, ...) mc_check(1, (a) != (b), #a " != " #b, __VA_ARGS__)
#define cr_expect_neq(a, b, ...) mc_check(0, (a) != (b), #a " != " #b, __VA_ARGS__)
#define cr_assert_lt(a, b, ...)  mc_check(1, (a) < (b), #a " < " #b, __VA_ARGS__)
#define cr_assert_leq(a, b, ...) mc_check(1, (a) <= (b), #a " <= " #b, __VA_ARGS__)
#define cr_assert_gt(a, b, ...)  mc_check(1, (a) > (b), #a " > " #b, __VA_ARGS__)
#define cr_assert_geq(a, b, ...) mc_check(1, (a) >= (b), #a " >= " #b, __VA_ARGS__)
#define cr_expect_geq(a, b, ...) mc_check(0, (a) >= (b), #a " >= " #b, __VA_ARGS__)
#define cr_expect_leq(a, b, ...) mc_check(0, (a) <= (b), #a " <= " #b, __VA_ARGS__)
#define cr_assert_null(p, ...)   mc_check(1, (p) == NULL, #p " == NULL", __VA_ARGS__)
#define cr_assert_not_null(p, ...) mc_check(1, (p) != NULL, #p " != NULL", __VA_ARGS__)
#define cr_assert_str_eq(a, b, ...)                                          \
	mc_check(1, strcmp((a), (b)) == 0, #a " == " #b, __VA_ARGS__)
#define cr_assert_not(c, ...)    mc_check(1, !(c), "!(" #c ")", __VA_ARGS__)
#define cr_expect_not(c, ...)    mc_check(0, !(c), "!(" #c ")", __VA_ARGS__)
#define cr_expect_lt(a, b, ...)  mc_check(0, (a) < (b), #a " < " #b, __VA_ARGS__)
#define cr_expect_gt(a, b, ...)  mc_check(0, (a) > (b), #a " > " #b, __VA_ARGS__)
#define cr_expect_null(p, ...)   mc_check(0, (p) == NULL, #p " == NULL", __VA_ARGS__)
#define cr_expect_not_null(p, ...)                                           \
	mc_check(0, (p) != NULL, #p " != NULL", __VA_ARGS__)
#define cr_expect_str_eq(a, b, ...)                                          \
	mc_check(0, strcmp((a), (b)) == 0, #a " == " #b, __VA_ARGS__)
#define cr_assert_str_neq(a, b, ...)                                         \
	mc_check(1, strcmp((a), (b)) != 0, #a " != " #b, __VA_ARGS__)
#define cr_expect_str_neq(a, b, ...)                                         \
	mc_check(0, strcmp((a), (b)) != 0, #a " != " #b, __VA_ARGS__)
#define cr_assert_arr_eq(a, b, n, ...)                                       \
	mc_check(1, memcmp((a), (b), (n)) == 0, #a " == " #b, __VA_ARGS__)
#define cr_expect_arr_eq(a, b, n, ...)                                       \
	mc_check(0, memcmp((a), (b), (n)) == 0, #a " == " #b, __VA_ARGS__)
#define cr_assert_fail(...)      mc_check(1, 0, "fail", __VA_ARGS__)
#define cr_expect_fail(...)      mc_check(0, 0, "fail", __VA_ARGS__)
/* A skipped test: its process exits MC_SKIP, and the binary 77 (ctest's
 * skip) when none failed. exit, not _exit: TSan's report of a race before
 * the skip still makes the status 66, a failure. */
#define MC_SKIP 77
#define cr_skip_test(...)                                                    \
	do {                                                                 \
		fprintf(stderr, "skipped: " __VA_ARGS__);                    \
		fputc('\n', stderr);                                         \
		if (mc_fini_test)                                            \
			mc_fini_test();                                      \
		if (mc_fini_suite)                                           \
			mc_fini_suite();                                     \
		fflush(NULL);                                                \
		exit(MC_SKIP);                                               \
	} while (0)
#define cr_log_info(...) (fprintf(stderr, __VA_ARGS__), fputc('\n', stderr))
#define cr_log_warn(...) cr_log_info(__VA_ARGS__)

static const struct mc_opts *mc_suite_opts(const char *name)
{
	for (struct mc_suite *s = mc_suites; s; s = s->next)
		if (strcmp(s->name, name) == 0)
			return &s->o;
	return NULL;
}

int main(void)
{
	const char *m = getenv("MEMTALLY_TEST_TIMEOUT_MULT");
	double mult = m ? atof(m) : 1;
	int passed = 0, failed = 0, skipped = 0;
	for (struct mc_test *t = mc_tests; t; t = t->next) {
		if (t->o.disabled)
			continue;
		const struct mc_opts *so = mc_suite_opts(t->suite);
		fflush(NULL);
		pid_t pid = fork();
		if (pid == 0) {
			double to = t->o.timeout ? t->o.timeout
						 : (so && so->timeout ? so->timeout
								      : 60);
			alarm((unsigned)(to * (mult > 0 ? mult : 1)) + 1);
			mc_fini_test = t->o.fini;
			mc_fini_suite = so ? so->fini : NULL;
			if (so && so->init)
				so->init();
			if (t->o.init)
				t->o.init();
			t->fn();
			if (t->o.fini)
				t->o.fini();
			if (so && so->fini)
				so->fini();
			fflush(NULL);
			exit(mc_expect_failed);
		}
		int st = 0;
		waitpid(pid, &st, 0);
		int ok = WIFEXITED(st) && WEXITSTATUS(st) == 0;
		int skip = WIFEXITED(st) && WEXITSTATUS(st) == MC_SKIP;
		fprintf(stderr, "[%s] %s::%s%s\n",
			ok ? "PASS" : skip ? "SKIP" : "FAIL", t->suite, t->name,
			WIFSIGNALED(st) ? " (crashed or timed out)" : "");
		ok ? passed++ : skip ? skipped++ : failed++;
	}
	printf("%d passed, %d failed, %d skipped\n", passed, failed,
	       skipped);
	return failed ? 1 : skipped ? MC_SKIP : 0;
}

#endif
