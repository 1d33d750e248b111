/*
 * refresh.c - the preloads' one thread that keeps a quiet process's
 * figures current.
 *
 * The front ends publish on the program's own calls: a process that frees
 * its heap and goes quiet keeps, for as long as it stays quiet, whatever
 * its allocator's free memory was at the last sample taken at a flush
 * (glibc), or none at all (jemalloc, whose dirty pages stay resident until
 * the process calls it again). One thread per process looks every
 * MEMTALLY_REFRESH_MS (1000 by default; 0: no thread) and samples the
 * allocator's free memory when the heap moved since the last sample
 * (jemalloc: also while it keeps dirty pages, and every 10 s; see
 * mtc_free_refresh_due), through the same turn and
 * spacing as a sample taken at a flush (free_sample.c), then lets the mapped
 * memory's bookkeeping (mmap.c) reconcile its figure with the kernel's.
 *
 * Do no harm:
 *  - Started lazily, never in a constructor: the first full flush after
 *    the process registered, or after its registration went unanswered
 *    in time (mtc_after_flush(), outside the front end's re-entrancy
 *    guard and any allocator lock), starts it. Then its rounds also
 *    register again (mtc_refresh_once). A fork child has no thread: its
 *    registration arms a new one.
 *  - It blocks every signal (the program's process-directed signals go to
 *    its own threads, as without memtally), never allocates, never holds
 *    a lock of ours a worker waits for (but for one store under the
 *    mapped bytes' lock, at a registration it makes), and takes the
 *    allocator's locks
 *    only as a sample at a flush would (same turn, same spacing, so the
 *    same bound on their cost).
 *  - It does not keep the process alive: once the program's last thread
 *    has ended (its main thread by pthread_exit, which the preloads
 *    interpose to note it: nothing is read before), it ends the process
 *    as glibc would have, exit(0), within a round.
 *  - pthread_create failing (thread limits) leaves the process as it was
 *    before: figures refreshed by its own calls only; no retry.
 */
#define _GNU_SOURCE
#include "client_internal.h"
#include "mtcommon.h"

#include <dlfcn.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

/* Enough for mallinfo2() or jemalloc's mallctl and for /proc reads into
 * small buffers; only what is touched is resident. */
#define REFRESH_STACK (256u << 10)

/* The state letter of /proc/self/<path>/stat ('R', 'S', 'Z', ...), or 0.
 * Read into the stack: this thread never allocates. */
static char task_state(const char *path)
{
	char buf[512];
	int fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return 0;
	ssize_t n = read(fd, buf, sizeof(buf) - 1);
	close(fd);
	if (n <= 0)
		return 0;
	buf[n] = 0;
	/* "pid (comm) S ...": the comm may hold spaces and parentheses. */
	const char *c = strrchr(buf, ')');
	return c && c[1] == ' ' ? c[2] : 0;
}

/* Set once the program's main thread called pthread_exit() or
 * thrd_exit(): only then can every thread of the program's be gone while
 * the process goes on (returning from main, exit() and a fatal signal
 * end it whole). Until then the rounds look for nothing. */
static int main_exited;
static void (*libc_pthread_exit)(void *);
static void (*libc_thrd_exit)(int);

static void note_exit(void)
{
	if (getpid() == (pid_t)syscall(SYS_gettid))
		__atomic_store_n(&main_exited, 1, __ATOMIC_RELAXED);
}

__attribute__((visibility("default"), noreturn)) void pthread_exit(void *ret)
{
	note_exit();
	void (*f)(void *) = libc_pthread_exit;
	if (!f)
		*(void **)&f = dlsym(RTLD_NEXT, "pthread_exit");
	f(ret);
	__builtin_unreachable();
}

__attribute__((visibility("default"), noreturn)) void thrd_exit(int res)
{
	note_exit();
	void (*f)(int) = libc_thrd_exit;
	if (!f)
		*(void **)&f = dlsym(RTLD_NEXT, "thrd_exit");
	f(res);
	__builtin_unreachable();
}

/* Is this thread the process's last one alive? Its main thread has
 * exited (the leader is a zombie until the last thread ends) and no
 * other but this one is in /proc/self/task alive. */
static bool last_alive(void)
{
	if (!__atomic_load_n(&main_exited, __ATOMIC_RELAXED) ||
	    task_state("/proc/self/stat") != 'Z')
		return false;
	int fd = open("/proc/self/task", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	if (fd < 0)
		return false;
	long self = syscall(SYS_gettid);
	bool alone = true;
	char buf[4096], path[64];
	long n;
	while (alone && (n = syscall(SYS_getdents64, fd, buf, sizeof(buf))) > 0)
		for (long off = 0; off < n;) {
			/* struct linux_dirent64: ino, off, reclen, type, name
			 */
			unsigned short reclen;
			memcpy(&reclen, buf + off + 16, sizeof(reclen));
			const char *name = buf + off + 19;
			off += reclen;
			long tid = strtol(name, NULL, 10);
			if (tid <= 0 || tid == self)
				continue;
			snprintf(path, sizeof(path), "/proc/self/task/%ld/stat",
			         tid);
			char st = task_state(path);
			if (st && st != 'Z' && st != 'X' && st != 'x') {
				alone = false;
				break;
			}
		}
	close(fd);
	return alone;
}

static void *refresh_main(void *arg)
{
	uint64_t ms = (uint64_t)(uintptr_t)arg;
	struct timespec ts = {(time_t)(ms / 1000),
	                      (long)(ms % 1000) * 1000000L};
	/* The front end's round at once, as for a busy process: the slot's
	 * first sample where only this thread samples (jemalloc), so that
	 * what the program frees before its first quiet round is counted as
	 * the allocator's until a sample says it went back. */
	mtc_front_refresh(true);
	for (;;) {
		/* EINTR cannot happen (every signal blocked); a short sleep
		 * would only refresh early. */
		nanosleep(&ts, NULL);
		/* Every thread of the program's has ended: glibc ends the
		 * process with exit(0) as the last of them does, and this
		 * thread, one more, would keep it from ever doing so (its
		 * signals blocked, not even SIGTERM could end it). */
		if (last_alive())
			exit(0);
		mtc_refresh_once();
	}
	return NULL;
}

/* libc's own pthread_create, not the jemalloc preload's wrapper: that one
 * sets the new thread up as a counted thread of the program (its activity
 * callback, a lane, one more in `threads`); this thread allocates nothing
 * and is none of the program's. Resolved once, at load, never in the
 * flush that starts the thread: dlsym takes the loader's lock, which
 * dlopen holds while a library's constructors run, and that flush runs
 * inside the program's malloc, maybe under a lock of the program's that
 * such a constructor waits for. */
static mt_thread_create_fn libc_create;

__attribute__((constructor(101))) static void refresh_resolve(void)
{
	*(void **)&libc_create = dlsym(RTLD_NEXT, "pthread_create");
	*(void **)&libc_pthread_exit = dlsym(RTLD_NEXT, "pthread_exit");
	*(void **)&libc_thrd_exit = dlsym(RTLD_NEXT, "thrd_exit");
}

void mtc_refresh_start(void)
{
	uint64_t ms;
	mt_thread_create_fn create = libc_create;
	if (!create || !mtc_refresh_claim(&ms))
		return;
	pthread_t tid;
	int err = mt_thread_detached(
	    create, refresh_main, (void *)(uintptr_t)ms, REFRESH_STACK, &tid);
	if (err) {
		mtc_debug("refresh thread not started (%d): figures follow "
		          "the program's own calls only",
		          err);
		return;
	}
	pthread_setname_np(tid, "memtally");
	mtc_debug("refresh thread started: every %llu ms",
	          (unsigned long long)ms);
}
