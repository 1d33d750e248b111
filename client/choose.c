/*
 * choose.c - MEMTALLY_ALLOCATOR=glibc|jemalloc with either preload.
 *
 * The front end is a library (libmemtally_preload.so: jemalloc;
 * libmemtally_glibc.so: glibc's malloc), and which malloc a process uses
 * is settled when the dynamic linker loads it. A worker started with one
 * library and MEMTALLY_ALLOCATOR naming the other is switched before any
 * of its own code runs: this constructor puts the other library in the
 * preloaded one's place in LD_PRELOAD and executes the same program again
 * (/proc/self/exe, the same argv from /proc/self/cmdline, the same
 * environment otherwise). Its children inherit the new LD_PRELOAD, so a
 * process tree pays the extra exec once, at its root; a tool that starts
 * workers (memtally run) sets the right library itself and pays nothing.
 *
 * Without MEMTALLY_ALLOCATOR, a CPython interpreter under the jemalloc
 * preload is switched to the glibc front end (is_python(), below), and
 * its children inherit that too: a process's LD_PRELOAD always names the
 * front end it runs on, so a child python needs no exec of its own and
 * what ps and /proc/PID/environ show is what runs.
 *
 * The other way round, a program linked to jemalloc (Debian's redis-server
 * is) that inherits the glibc front end from such a python is switched to
 * the jemalloc preload: under the glibc front end its malloc would be
 * glibc's while its malloc_usable_size, mallctl and operator new stay
 * libjemalloc's, and jemalloc asked the size of a glibc block crashes it.
 * The jemalloc preload serves the whole of jemalloc's API from one heap.
 *
 * Fail open: an unknown value, a secure-execution process (set-uid),
 * a library not found beside this one, a preload not named in
 * LD_PRELOAD, no /proc, or a failed exec leave the process running as it
 * is, counted by the front end it has. MEMTALLY_ALLOCATOR_SWITCHED marks
 * the switched process so that nothing can loop.
 */
#define _GNU_SOURCE
#include "client_internal.h"

#include <dlfcn.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/auxv.h>
#include <sys/prctl.h>
#include <unistd.h>

#ifndef MTC_FRONT_ALLOCATOR
#error "MTC_FRONT_ALLOCATOR: the allocator of this front end"
#endif

/* The marker's value is the process's name before the exec: executing
 * /proc/self/exe renames it "exe", and ps, top, the OOM killer's log and
 * memtally's own ps would show that instead of the program. */
#define SWITCHED "MEMTALLY_ALLOCATOR_SWITCHED="

extern char **environ;

/* The whole of /proc/self/cmdline, or NULL. */
static char *read_cmdline(size_t *len)
{
	int fd = open("/proc/self/cmdline", O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return NULL;
	size_t cap = 4096, n = 0;
	char *buf = malloc(cap);
	while (buf) {
		ssize_t r = read(fd, buf + n, cap - n - 1);
		if (r <= 0)
			break;
		n += (size_t)r;
		if (n + 1 == cap) {
			char *b = realloc(buf, cap * 2);
			if (!b) {
				free(buf);
				buf = NULL;
			} else {
				buf = b;
				cap *= 2;
			}
		}
	}
	close(fd);
	if (buf && n == 0) {
		free(buf);
		buf = NULL;
	}
	if (buf)
		buf[n] = 0;
	*len = n;
	return buf;
}

/* LD_PRELOAD with the token naming this library -- its path `self`, or
 * its file name `base` when it was found by the library search -- replaced
 * by `other`, or NULL if no token (separated by ':' or ' ') names it. */
static char *swap_preload(const char *lp, const char *self, const char *base,
                          const char *other)
{
	size_t ls = strlen(self), lb = strlen(base);
	for (const char *p = lp; *p;) {
		size_t n = strcspn(p, ": ");
		if ((n == ls && memcmp(p, self, n) == 0) ||
		    (n == lb && memcmp(p, base, n) == 0)) {
			size_t before = (size_t)(p - lp);
			size_t total = strlen("LD_PRELOAD=") + strlen(lp) - n +
			               strlen(other) + 1;
			char *out = malloc(total);
			if (!out)
				return NULL;
			strcpy(out, "LD_PRELOAD=");
			strncat(out, lp, before);
			strcat(out, other);
			strcat(out, p + n);
			return out;
		}
		p += n;
		if (*p)
			p++;
	}
	return NULL;
}

/*
 * Is this process a CPython interpreter (python, python3, python3.11)?
 * Under jemalloc CPython runs slower (docs/ARCHITECTURE.md, "Front ends:
 * jemalloc's preload and glibc's"): jemalloc purges and copies growing
 * blocks where glibc keeps and mremaps them. The glibc front end counts
 * it as exactly, at plain python3's speed. So without MEMTALLY_ALLOCATOR,
 * an interpreter started under the jemalloc preload keeps glibc's malloc,
 * which is also what it has without memtally.
 */
static bool is_python(void)
{
	char exe[4096];
	ssize_t n = readlink("/proc/self/exe", exe, sizeof(exe) - 1);
	if (n <= 0)
		return false;
	exe[n] = 0;
	const char *base = strrchr(exe, '/');
	base = base ? base + 1 : exe;
	if (strncmp(base, "python", 6) != 0)
		return false;
	for (const char *c = base + 6; *c; c++)
		if ((*c < '0' || *c > '9') && *c != '.')
			return false;
	return true;
}

__attribute__((constructor(103))) static void mtc_choose(void)
{
	const char *switched = getenv("MEMTALLY_ALLOCATOR_SWITCHED");
	if (switched) {
		/* This image is the switched one. The marker is for this exec
		 * only, or every descendant would ignore its own
		 * MEMTALLY_ALLOCATOR. LD_PRELOAD stays as the exec set it:
		 * naming this library, for this process and its children.
		 * The process is still single-threaded here. */
		if (*switched)
			prctl(PR_SET_NAME, (unsigned long)switched, 0, 0, 0);
		unsetenv("MEMTALLY_ALLOCATOR_SWITCHED");
		return;
	}
	/* Switched off: the process runs as it was started. */
	const char *disabled = getenv("MEMTALLY_DISABLE");
	if (disabled && disabled[0] == '1')
		return;
	const char *want = getenv("MEMTALLY_ALLOCATOR");
	if ((!want || !*want) && strcmp(MTC_FRONT_ALLOCATOR, "jemalloc") == 0 &&
	    is_python())
		want = "glibc";
	/* The glibc front end exports no mallctl: another library does. */
	if ((!want || !*want) && strcmp(MTC_FRONT_ALLOCATOR, "glibc") == 0 &&
	    dlsym(RTLD_DEFAULT, "mallctl"))
		want = "jemalloc";
	if (!want || !*want || strcmp(want, MTC_FRONT_ALLOCATOR) == 0)
		return;
	const char *other_name;
	if (strcmp(want, "glibc") == 0)
		other_name = "libmemtally_glibc.so";
	else if (strcmp(want, "jemalloc") == 0)
		other_name = "libmemtally_preload.so";
	else
		return; /* unknown: MEMTALLY_DEBUG says so at init */
	Dl_info di;
	const char *lp = getenv("LD_PRELOAD");
	if (getauxval(AT_SECURE) || !lp ||
	    !dladdr((void *)(uintptr_t)mtc_choose, &di) || !di.dli_fname)
		return;
	const char *slash = strrchr(di.dli_fname, '/');
	size_t dir = slash ? (size_t)(slash - di.dli_fname) + 1 : 0;
	char *other = malloc(dir + strlen(other_name) + 1);
	if (!other)
		return;
	memcpy(other, di.dli_fname, dir);
	strcpy(other + dir, other_name);
	char *preload = NULL, *cmd = NULL;
	char marker[sizeof(SWITCHED) + 16] = SWITCHED;
	char **argv = NULL, **envp = NULL;
	size_t len = 0;
	if (access(other, R_OK) != 0) {
		mtc_init(); /* MEMTALLY_DEBUG */
		mtc_debug("MEMTALLY_ALLOCATOR=%s: no %s; staying on %s", want,
		          other, MTC_FRONT_ALLOCATOR);
		goto out_free;
	}
	if (!(preload =
	          swap_preload(lp, di.dli_fname, di.dli_fname + dir, other)) ||
	    !(cmd = read_cmdline(&len)))
		goto out_free;
	size_t argc = 0, envc = 0;
	for (size_t i = 0; i < len; i++)
		argc += cmd[i] == 0;
	if (cmd[len - 1] != 0)
		argc++;
	while (environ[envc])
		envc++;
	argv = calloc(argc + 1, sizeof(char *));
	envp = calloc(envc + 3, sizeof(char *));
	if (!argv || !envp)
		goto out_free;
	for (size_t i = 0, k = 0; i < len && k < argc; k++) {
		argv[k] = cmd + i;
		i += strlen(cmd + i) + 1;
	}
	size_t e = 0;
	for (size_t i = 0; i < envc; i++)
		if (strncmp(environ[i], "LD_PRELOAD=", 11) != 0)
			envp[e++] = environ[i];
	envp[e++] = preload;
	/* The name: at most 15 bytes and a NUL (TASK_COMM_LEN). */
	if (prctl(PR_GET_NAME, (unsigned long)(marker + sizeof(SWITCHED) - 1),
	          0, 0, 0) != 0)
		marker[sizeof(SWITCHED) - 1] = 0;
	envp[e++] = marker;
	mtc_init(); /* MEMTALLY_DEBUG */
	mtc_debug("MEMTALLY_ALLOCATOR=%s: running again under %s", want, other);
	execve("/proc/self/exe", argv, envp);
	mtc_debug("MEMTALLY_ALLOCATOR=%s: exec failed; staying on %s", want,
	          MTC_FRONT_ALLOCATOR);
out_free:
	free(argv);
	free(envp);
	free(cmd);
	free(preload);
	free(other);
}
