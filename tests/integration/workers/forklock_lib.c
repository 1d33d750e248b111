/*
 * libmt_forklock - a library with an allocator of its own that maps and
 * unmaps under its own lock, and takes that lock around fork() (its
 * pthread_atfork handlers, registered by its constructor, which runs
 * before an LD_PRELOAD's: its prepare handler runs after memtally's, its
 * child handler, which maps memory, before memtally's).
 */
#define _GNU_SOURCE
#include <pthread.h>
#include <stddef.h>
#include <sys/mman.h>

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;

static void take(void)
{
	pthread_mutex_lock(&lock);
}

static void give(void)
{
	pthread_mutex_unlock(&lock);
}

/* In the child: its lock given back, then memory mapped and unmapped,
 * before the preload's own child handler has run. */
static void child(void)
{
	give();
	void *p = mmap(NULL, 1 << 16, PROT_READ | PROT_WRITE,
	               MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (p != MAP_FAILED)
		munmap(p, 1 << 16);
}

__attribute__((constructor)) static void forklock_init(void)
{
	pthread_atfork(take, give, child);
}

__attribute__((visibility("default"))) void *forklock_alloc(size_t n)
{
	take();
	void *p = mmap(NULL, n, PROT_READ | PROT_WRITE,
	               MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	give();
	return p == MAP_FAILED ? NULL : p;
}

__attribute__((visibility("default"))) void forklock_free(void *p, size_t n)
{
	take();
	munmap(p, n);
	give();
}
