/*
 * maps_reconcile - what reconciling a process's mapped figure with the
 * kernel's resident pages costs (client/mmap.c: the pagemap scan, or
 * mincore on kernels before 6.7, over the counted ranges), per GiB
 * counted. Run under the preload, with or without a
 * server:
 *   LD_PRELOAD=build/client/libmemtally_preload.so
 * build/bench/bench_maps_reconcile [GiB] It times memtally_flush() (which
 * reconciles) with nothing mapped, then with GiB GiB mapped: touched;
 * untouched; touched with every other 64 KiB given back (madvise: 8192 pieces
 * per GiB not resident); and prints the difference per call and per GiB.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <time.h>

#define GIB  (1024ul * 1024 * 1024)
#define REPS 15

static int (*flush)(void);

static double ns(void)
{
	struct timespec t;
	clock_gettime(CLOCK_MONOTONIC, &t);
	return t.tv_sec * 1e9 + t.tv_nsec;
}

/* Median of REPS calls, in microseconds, each 400 ms after the last (a
 * reconcile waits 100 times its own cost after the last), the first after
 * 2.5 s (ranges mapped lately count in full for 1-2 s). */
static double per_call(void)
{
	static double v[REPS];
	struct timespec settle = {2, 500000000}, gap = {0, 400000000};
	nanosleep(&settle, NULL);
	for (int i = 0; i < REPS; i++) {
		nanosleep(&gap, NULL);
		double t0 = ns();
		flush();
		v[i] = ns() - t0;
	}
	for (int i = 1; i < REPS; i++) /* insertion sort: small */
		for (int j = i; j > 0 && v[j - 1] > v[j]; j--) {
			double x = v[j];
			v[j] = v[j - 1];
			v[j - 1] = x;
		}
	return v[REPS / 2] / 1000;
}

int main(int argc, char **argv)
{
	size_t gib = argc > 1 ? strtoul(argv[1], NULL, 10) : 1;
	size_t len = gib * GIB;
	flush = (int (*)(void))dlsym(RTLD_DEFAULT, "memtally_flush");
	if (!flush) {
		fprintf(stderr,
		        "run under LD_PRELOAD=libmemtally_preload.so\n");
		return 2;
	}
	double base = per_call();
	char *p = mmap(NULL, len, PROT_READ | PROT_WRITE,
	               MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (p == MAP_FAILED)
		return 1;
	double untouched = per_call();
	for (size_t i = 0; i < len; i += 4096)
		p[i] = 1;
	double touched = per_call();
	for (size_t i = 0; i < len; i += 128 * 1024)
		madvise(p + i, 64 * 1024, MADV_DONTNEED);
	double holes = per_call();
	printf("memtally_flush() median of %d, %zu GiB counted\n", REPS, gib);
	printf(
	    "| case | us per call | reconcile, us per GiB |\n|---|---|---|\n");
	printf("| nothing mapped | %.1f | - |\n", base);
	printf("| untouched | %.1f | %.1f |\n", untouched,
	       (untouched - base) / gib);
	printf("| touched | %.1f | %.1f |\n", touched, (touched - base) / gib);
	printf("| every other 64 KiB given back | %.1f | %.1f |\n", holes,
	       (holes - base) / gib);
	return 0;
}
