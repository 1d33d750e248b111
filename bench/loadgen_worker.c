/*
 * loadgen_worker.c - a worker of the `loadgen` suite, run as an unmodified
 * program under LD_PRELOAD=libmemtally_preload.so (it never links
 * memtally; what it needs of it, memtally_flush and memtally_process_bytes,
 * it looks up with dlsym, and it runs without them).
 *
 * usage: bench_loadgen_worker [--threads T] [--live N] [--burst B]
 *                             [--sleep-us U] [--hold-kib K]
 *
 * Each of T threads keeps a live set of N blocks and, in bursts of B
 * operations separated by U microseconds of sleep, frees a random block
 * and allocates another of a random size in its place: 31 in 32 are 8 B
 * to 4 KiB (malloc, or calloc one time in three), 1 in 32 4 KiB to
 * 260 KiB (malloc, untouched: no page faults, only jemalloc's work),
 * so its drift crosses the flush threshold often and its slot keeps
 * changing. T = 0 makes an idle worker: it holds K KiB (in 4 KiB blocks)
 * and does nothing else.
 *
 * Once the threads run and the process has flushed, it prints
 * "ready pid=P attached=0|1" and reads commands on stdin:
 *   pause   every thread stops after its burst and flushes; then prints
 *           "held BYTES ops OPS" (BYTES = memtally_process_bytes(): what
 *           this process's slot holds; OPS = operations done so far)
 *   resume  the threads go on
 *   exit    (or EOF) the threads free their live sets and end (a thread
 *           flushes when it ends); prints "bye held BYTES ops OPS", exits
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static int (*mt_flush_fn)(void);
static int64_t (*mt_bytes_fn)(void);
static bool (*mt_attached_fn)(void);

static int nthreads = 4;
static unsigned live_n = 128;
static unsigned burst = 32;
static unsigned sleep_us = 100000;
static unsigned hold_kib = 64;

static atomic_bool stop_flag;
static atomic_bool pause_flag;
static atomic_uint_fast64_t ops_total;
static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t cv = PTHREAD_COND_INITIALIZER;
static int n_paused;
static int n_started;

static void flush(void)
{
	if (mt_flush_fn)
		mt_flush_fn();
}

static int64_t held(void)
{
	return mt_bytes_fn ? mt_bytes_fn() : -1;
}

static void *work(void *arg)
{
	uint64_t s = (uintptr_t)arg * 0x9E3779B97F4A7C15ull + 12345;
	void **live = calloc(live_n, sizeof(void *));
	if (!live)
		abort();
	/* Fill the live set, then churn it. */
	for (unsigned i = 0; i < live_n; i++)
		live[i] = malloc(8 + i % 512);
	flush();
	pthread_mutex_lock(&mu);
	n_started++;
	pthread_cond_broadcast(&cv);
	pthread_mutex_unlock(&mu);
	uint64_t ops = 0;
	while (!atomic_load_explicit(&stop_flag, memory_order_relaxed)) {
		for (unsigned b = 0; b < burst; b++) {
			s ^= s << 13, s ^= s >> 7, s ^= s << 17;
			unsigned i = (unsigned)(s % live_n);
			free(live[i]);
			bool small = (s >> 20) % 32 != 0;
			size_t n = small ? 8 + (s >> 32) % 4096
			                 : 4096 + (s >> 32) % (256 * 1024);
			live[i] =
			    !small || (s >> 10) % 3 ? malloc(n) : calloc(1, n);
		}
		ops += burst;
		atomic_fetch_add_explicit(&ops_total, burst,
		                          memory_order_relaxed);
		if (atomic_load_explicit(&pause_flag, memory_order_acquire)) {
			flush();
			pthread_mutex_lock(&mu);
			n_paused++;
			pthread_cond_broadcast(&cv);
			while (atomic_load(&pause_flag) &&
			       !atomic_load(&stop_flag))
				pthread_cond_wait(&cv, &mu);
			n_paused--;
			pthread_mutex_unlock(&mu);
			continue;
		}
		if (sleep_us) {
			struct timespec ts = {sleep_us / 1000000,
			                      (long)(sleep_us % 1000000) *
			                          1000};
			nanosleep(&ts, NULL);
		}
	}
	for (unsigned i = 0; i < live_n; i++)
		free(live[i]);
	free(live);
	(void)ops;
	return NULL; /* the thread's drift is flushed as it ends */
}

static void say_held(const char *prefix)
{
	flush();
	int64_t h = held();
	printf("%sheld %" PRId64 " ops %" PRIu64 "\n", prefix, h,
	       (uint64_t)atomic_load(&ops_total));
	fflush(stdout);
}

static int parse_args(int argc, char **argv)
{
	for (int i = 1; i + 1 < argc; i += 2) {
		const char *a = argv[i], *v = argv[i + 1];
		if (!strcmp(a, "--threads"))
			nthreads = atoi(v);
		else if (!strcmp(a, "--live"))
			live_n = (unsigned)atoi(v);
		else if (!strcmp(a, "--burst"))
			burst = (unsigned)atoi(v);
		else if (!strcmp(a, "--sleep-us"))
			sleep_us = (unsigned)atoi(v);
		else if (!strcmp(a, "--hold-kib"))
			hold_kib = (unsigned)atoi(v);
		else {
			fprintf(stderr, "bench_loadgen_worker: bad option %s\n",
			        a);
			return -1;
		}
	}
	if (nthreads < 0 || nthreads > 256 || live_n < 1 || burst < 1) {
		fprintf(stderr, "bench_loadgen_worker: bad arguments\n");
		return -1;
	}
	return 0;
}

/* The preload's API, if it is loaded. */
static void resolve_api(void)
{
	mt_flush_fn = (int (*)(void))dlsym(RTLD_DEFAULT, "memtally_flush");
	mt_bytes_fn =
	    (int64_t(*)(void))dlsym(RTLD_DEFAULT, "memtally_process_bytes");
	mt_attached_fn =
	    (bool (*)(void))dlsym(RTLD_DEFAULT, "memtally_attached");
}

/* With no thread: --hold-kib in 4 KiB blocks, held. */
static void **hold_blocks(unsigned *nhold)
{
	*nhold = hold_kib / 4;
	void **hold = calloc(*nhold + 1, sizeof(void *));
	for (unsigned i = 0; i < *nhold; i++) {
		hold[i] = malloc(4096);
		memset(hold[i], 1, 64);
	}
	return hold;
}

/* The churning threads, once all of them run. */
static pthread_t *start_threads(void)
{
	pthread_t *t = calloc((size_t)nthreads, sizeof(*t));
	for (int i = 0; i < nthreads; i++)
		pthread_create(&t[i], NULL, work,
		               (void *)(uintptr_t)(getpid() * 64 + i));
	pthread_mutex_lock(&mu);
	while (n_started < nthreads)
		pthread_cond_wait(&cv, &mu);
	pthread_mutex_unlock(&mu);
	return t;
}

static void stop_threads(pthread_t *t)
{
	pthread_mutex_lock(&mu);
	atomic_store(&stop_flag, true);
	pthread_cond_broadcast(&cv);
	pthread_mutex_unlock(&mu);
	for (int i = 0; i < nthreads; i++)
		pthread_join(t[i], NULL);
}

/* The driver's commands on stdin, until "exit" or its end: "pause" (the
 * threads stop between bursts; what is held is said), "resume". */
static void obey(void)
{
	static char line[256];
	while (fgets(line, sizeof(line), stdin)) {
		line[strcspn(line, "\n")] = 0;
		if (!strcmp(line, "exit"))
			break;
		if (!strcmp(line, "pause")) {
			atomic_store(&pause_flag, true);
			pthread_mutex_lock(&mu);
			while (n_paused < nthreads)
				pthread_cond_wait(&cv, &mu);
			pthread_mutex_unlock(&mu);
			say_held("");
		} else if (!strcmp(line, "resume")) {
			pthread_mutex_lock(&mu);
			atomic_store(&pause_flag, false);
			pthread_cond_broadcast(&cv);
			pthread_mutex_unlock(&mu);
		}
	}
}

int main(int argc, char **argv)
{
	if (parse_args(argc, argv))
		return 2;
	resolve_api();
	/* stdout's buffer before anything is measured. */
	static char obuf[4096];
	setvbuf(stdout, obuf, _IOLBF, sizeof(obuf));

	void **hold = NULL;
	unsigned nhold = 0;
	pthread_t *t = NULL;
	if (nthreads == 0)
		hold = hold_blocks(&nhold);
	else
		t = start_threads();
	flush();
	printf("ready pid=%d attached=%d\n", (int)getpid(),
	       mt_attached_fn && mt_attached_fn() ? 1 : 0);
	fflush(stdout);
	obey();
	stop_threads(t);
	for (unsigned i = 0; i < nhold; i++)
		free(hold[i]);
	free(hold);
	free(t);
	say_held("bye ");
	return 0;
}
