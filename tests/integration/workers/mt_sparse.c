/*
 * mt_sparse - a single-threaded program that maps more than it touches and
 * then waits, with no flush of its own and no allocator or mapping call
 * while it waits (blocked in read(2)): what it shows meanwhile is up to
 * the preload's own bookkeeping and memtallyd.
 *
 * Commands, one per stdin line, each answered "ok" once done:
 *   "map N"        mmap N MiB private anonymous read-write, untouched
 *   "touch O N"    write MiB [O, O+N) of it (no system call)
 *   "dontneed O N" madvise(MADV_DONTNEED) MiB [O, O+N) of it
 *   "poke"         one 1 MiB malloc, written, and its free (an allocator
 *                  call that publishes)
 * usage: mt_sparse; prints "ready pid=N" first; exits at EOF.
 */
#include "mt_common.h"

#include <sys/mman.h>

int main(void)
{
	char *region = NULL;
	unsigned long o, n;
	mt_say("ready pid=%d", (int)getpid());
	const char *cmd;
	while ((cmd = mt_wait())) {
		if (sscanf(cmd, "map %lu", &n) == 1) {
			region = mmap(NULL, n * MIB, PROT_READ | PROT_WRITE,
			              MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
			if (region == MAP_FAILED)
				return 1;
		} else if (sscanf(cmd, "touch %lu %lu", &o, &n) == 2) {
			mt_touch(region + o * MIB, n * MIB);
		} else if (sscanf(cmd, "dontneed %lu %lu", &o, &n) == 2) {
			if (madvise(region + o * MIB, n * MIB, MADV_DONTNEED))
				return 1;
		} else if (strcmp(cmd, "poke") == 0) {
			char *p = malloc(MIB);
			if (!p)
				return 1;
			mt_touch(p, MIB);
			/* Escapes: the compiler keeps the pair. */
			__asm__ volatile("" : : "r"(p) : "memory");
			free(p);
		} else {
			mt_say("error %s", cmd);
			continue;
		}
		mt_say("ok");
	}
	return 0;
}
