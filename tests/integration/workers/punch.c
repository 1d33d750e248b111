/*
 * punch - a worker that punches a hole in its own slot, and a process that
 * takes the machine's whole commit charge, so that under strict overcommit
 * (vm.overcommit_memory = 2) memtallyd's next read of that slot cannot be
 * given a page: a SIGBUS in memtallyd, unless it answers it.
 *
 *   mt_worker punch [SECONDS]
 *                        registers, finds its slot's window in
 *                        /proc/self/maps, prints "ready window=ADDR+LEN";
 *                        at SIGUSR1, madvise(MADV_REMOVE) of the window,
 *                        then, SECONDS (0) later (when the commit charge
 *                        is free again, so that the harness reading it
 *                        can allocate), "punched errno=E"; exits when
 *                        stdin closes.
 *   mt_worker commit PID takes commit charge (private writable mappings,
 *                        never touched) until the kernel refuses a page,
 *                        prints "full committed=MIB", sends PID SIGUSR1,
 *                        keeps taking whatever is freed for SECONDS (2),
 *                        and exits.
 *
 * Neither allocates once it has started: what it prints goes through
 * stdio's static buffers, and the commit is taken with mmap.
 */
#include "mt_common.h"

#include <errno.h>
#include <signal.h>
#include <sys/mman.h>

static int find_window(uintptr_t *addr, size_t *len)
{
	FILE *f = fopen("/proc/self/maps", "re");
	if (!f)
		return -1;
	static char line[512];
	int found = -1;
	while (fgets(line, sizeof(line), f)) {
		unsigned long lo, hi;
		char perms[8];
		if (sscanf(line, "%lx-%lx %7s", &lo, &hi, perms) != 3)
			continue;
		if (strcmp(perms, "rw-s") == 0 && strstr(line, "-slots:")) {
			*addr = lo;
			*len = hi - lo;
			found = 0;
			break;
		}
	}
	fclose(f);
	return found;
}

static int punch_main(int argc, char **argv)
{
	double later = argc > 1 ? strtod(argv[1], NULL) : 0;
	sigset_t usr1;
	sigemptyset(&usr1);
	sigaddset(&usr1, SIGUSR1);
	sigprocmask(SIG_BLOCK, &usr1, NULL);
	for (int i = 0; i < 4; i++) {
		void *p = malloc(96 * 1024);
		mt_touch(p, 96 * 1024);
		free(p);
	}
	mt_flush(); /* registered, its window mapped */
	uintptr_t addr;
	size_t len;
	if (find_window(&addr, &len) < 0) {
		mt_say("error no slot window in /proc/self/maps");
		return 1;
	}
	mt_say("ready window=%#lx+%zu", (unsigned long)addr, len);
	int sig;
	if (sigwait(&usr1, &sig) != 0)
		return 1;
	int e = madvise((void *)addr, len, MADV_REMOVE) < 0 ? errno : 0;
	double end = mt_now_s() + later;
	while (mt_now_s() < end) {
		struct timespec ts = {0, 10000000};
		nanosleep(&ts, NULL);
	}
	mt_say("punched errno=%d", e);
	mt_wait();
	return 0;
}

static size_t take(size_t chunk)
{
	size_t got = 0;
	for (;;) {
		void *m = mmap(NULL, chunk, PROT_READ | PROT_WRITE,
		               MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
		if (m == MAP_FAILED)
			return got;
		got += chunk;
	}
}

static int commit_main(int argc, char **argv)
{
	if (argc < 2)
		return 2;
	pid_t victim = (pid_t)strtol(argv[1], NULL, 10);
	double secs = argc > 2 ? strtod(argv[2], NULL) : 2;
	size_t got = 0;
	for (size_t chunk = (size_t)256 * MIB; chunk >= 4096; chunk /= 4)
		got += take(chunk);
	mt_say("full committed=%zu", got / MIB);
	kill(victim, SIGUSR1);
	double end = mt_now_s() + secs;
	while (mt_now_s() < end) {
		take(4096); /* whatever another process freed */
		struct timespec ts = {0, 1000000};
		nanosleep(&ts, NULL);
	}
	return 0;
}

const struct mt_sub mt_punch = {"punch", "[SECONDS]", punch_main};
const struct mt_sub mt_commit = {"commit", "PID [SECONDS]", commit_main};
