/*
 * glibc - a multi-threaded worker for the glibc front end: THREADS
 * threads allocate and free blocks of 16 B .. 256 KiB (log-uniform, so
 * most are small) through malloc, calloc, realloc and posix_memalign, in
 * STEPS steps whose held total rises and then falls. After each step every
 * thread flushes its drift and waits at a barrier; the main thread prints
 *   "point K inuse=N"
 * where N is glibc's own in-use figure, mallinfo2()'s uordblks + hblkhd,
 * and waits for a line on stdin before the next step. First it prints
 *   "ready pid=P allocator=A usable100=U"
 * with what memtally_preload_allocator() says (if loaded) and glibc's
 * malloc_usable_size(malloc(100)) (104 for glibc; jemalloc says 112).
 * usage: mt_worker glibc THREADS STEPS
 */
#include "mt_common.h"

#include <malloc.h>
#include <pthread.h>

#define MAX_HELD 4096

static size_t nthreads, nsteps;
static pthread_barrier_t step_done, step_go;

static size_t pick(unsigned *seed)
{
	/* log-uniform in [16, 256 KiB] */
	unsigned shift = 4 + (unsigned)rand_r(seed) % 15;
	size_t base = (size_t)1 << shift;
	return base + (size_t)rand_r(seed) % base;
}

static void *run(void *arg)
{
	unsigned seed = (unsigned)(uintptr_t)arg * 7919u + 1;
	void **held = calloc(MAX_HELD, sizeof(void *));
	size_t n = 0;
	for (size_t step = 0; step < nsteps; step++) {
		/* Up for the first half of the run, down for the second. */
		size_t target = step < nsteps / 2
		                    ? (step + 1) * MAX_HELD / nsteps
		                    : (nsteps - step - 1) * MAX_HELD / nsteps;
		for (int churn = 0; churn < 2000; churn++) {
			size_t i = (size_t)rand_r(&seed) % MAX_HELD;
			if (held[i]) {
				free(held[i]);
				held[i] = NULL;
				n--;
			}
			if (n >= target)
				continue;
			size_t sz = pick(&seed);
			void *p = NULL;
			switch (rand_r(&seed) % 4) {
			case 0:
				p = malloc(sz);
				break;
			case 1:
				p = calloc(1, sz);
				break;
			case 2:
				p = realloc(malloc(sz / 2 + 1), sz);
				break;
			default:
				if (posix_memalign(&p, 64, sz))
					p = NULL;
			}
			if (p) {
				mt_touch(p, sz);
				held[i] = p;
				n++;
			}
		}
		mt_flush();
		pthread_barrier_wait(&step_done);
		pthread_barrier_wait(&step_go);
	}
	for (size_t i = 0; i < MAX_HELD; i++)
		free(held[i]);
	free(held);
	return NULL;
}

static int glibc_main(int argc, char **argv)
{
	nthreads = argc > 1 ? strtoul(argv[1], NULL, 10) : 4;
	nsteps = argc > 2 ? strtoul(argv[2], NULL, 10) : 10;
	if (nthreads < 1 || nthreads > 64)
		nthreads = 4;
	const char *(*which)(void) = (const char *(*)(void))dlsym(
	    RTLD_DEFAULT, "memtally_preload_allocator");
	void *probe = malloc(100);
	mt_say("ready pid=%d allocator=%s usable100=%zu", (int)getpid(),
	       which ? which() : "none", malloc_usable_size(probe));
	free(probe);
	pthread_barrier_init(&step_done, NULL, (unsigned)nthreads + 1);
	pthread_barrier_init(&step_go, NULL, (unsigned)nthreads + 1);
	pthread_t t[64];
	for (size_t k = 0; k < nthreads; k++)
		pthread_create(&t[k], NULL, run, (void *)(uintptr_t)k);
	for (size_t step = 0; step < nsteps; step++) {
		pthread_barrier_wait(&step_done);
		mt_flush();
		struct mallinfo2 mi = mallinfo2();
		mt_say("point %zu inuse=%zu", step, mi.uordblks + mi.hblkhd);
		mt_wait();
		pthread_barrier_wait(&step_go);
	}
	for (size_t k = 0; k < nthreads; k++)
		pthread_join(t[k], NULL);
	mt_say("done");
	mt_wait();
	return 0;
}

const struct mt_sub mt_glibc = {"glibc", "THREADS STEPS", glibc_main};
