/*
 * mt_worker - the integration tests' and benchmarks' worker: one program,
 * a subcommand per behaviour (its file says what it does and answers):
 *   mt_worker SUBCOMMAND [ARGS...]
 * Run without arguments, it lists them.
 *
 * The subcommands driven over stdin share one loop (mt_serve), one line a
 * command, which answers these besides their own (a subcommand's own
 * command of the same name wins):
 *   "exit"         exit(0)            EOF   exit(0)
 *   "flush"        memtally_flush(): "ok flushed"
 *   "malloc N T"   malloc N MiB in 16 MiB blocks over T threads (default
 *                  1), touch, flush: "ok allocated"
 *   "free"         free those blocks, flush: "ok freed"
 *   "touch O N"    touch MiB [O, O+N) of the region the subcommand mapped:
 *                  "ok touched"
 *   anything else  "error unknown CMD"
 *
 * The C++ workers (mt_cxx, mt_quiet_cxx) stay programs of their own: their
 * subject is a C++ runtime, and linking libstdc++ here would put its
 * start-up allocations into every C worker's figures.
 */
#include "mt_common.h"

#include <pthread.h>

extern const struct mt_sub mt_cancel, mt_chain, mt_churn, mt_commit,
    mt_disguise, mt_errno, mt_exec, mt_family, mt_fleet, mt_fork, mt_forkreg,
    mt_frag, mt_glibc, mt_hold, mt_idle, mt_kin, mt_lastthread, mt_level,
    mt_map, mt_nostdio, mt_punch, mt_quiet, mt_ramp, mt_share, mt_sigmap,
    mt_stacks, mt_sparse, mt_thrd, mt_unseen, mt_wild, mt_young;

static const struct mt_sub *const subs[] = {
    &mt_cancel,  &mt_chain,   &mt_churn,      &mt_commit, &mt_disguise,
    &mt_errno,   &mt_exec,    &mt_punch,      &mt_family, &mt_fleet,
    &mt_fork,    &mt_forkreg, &mt_frag,       &mt_glibc,  &mt_hold,
    &mt_idle,    &mt_kin,     &mt_lastthread, &mt_level,  &mt_map,
    &mt_nostdio, &mt_quiet,   &mt_ramp,       &mt_share,  &mt_sigmap,
    &mt_sparse,  &mt_stacks,  &mt_thrd,       &mt_unseen, &mt_wild,
    &mt_young,
};

/* argv[0] of this program, for mt_exec_self. */
static char *prog;

char *mt_region;
size_t mt_region_len;

/*
 * stdio's buffers are static: stdio would otherwise malloc them at the
 * first printf/fgets, i.e. after the worker's last flush, and jemalloc's
 * activity callback may publish that little drift whenever the thread's
 * next 64 KiB event falls, so an idle worker's figure could still move by
 * a few KiB after "ready". With these, an idle worker allocates nothing.
 */
__attribute__((constructor)) static void mt_static_stdio(void)
{
	static char in[4096], out[4096];
	setvbuf(stdin, in, _IOFBF, sizeof(in));
	setvbuf(stdout, out, _IOFBF, sizeof(out));
}

void mt_flush(void)
{
	int (*f)(void) = (int (*)(void))dlsym(RTLD_DEFAULT, "memtally_flush");
	if (f)
		f();
}

void mt_ready(void)
{
	mt_say("ready pid=%d", (int)getpid());
}

const char *mt_wait(void)
{
	static char line[256];
	if (!fgets(line, sizeof(line), stdin))
		return NULL;
	line[strcspn(line, "\n")] = 0;
	return line;
}

double mt_now_s(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

void mt_touch(void *p, size_t n)
{
	for (size_t i = 0; i < n; i += 4096)
		((volatile char *)p)[i] = 1;
}

#define MAX_MIB 8192

static void *level_blocks[MAX_MIB];
static size_t level_held;

size_t mt_hold_level(double mib)
{
	size_t want = mib < 0 ? 0 : mib > MAX_MIB ? MAX_MIB : (size_t)mib;
	if (want == level_held)
		return level_held;
	while (level_held < want) {
		void *p = malloc(MIB);
		if (!p)
			exit(12);
		mt_touch(p, MIB);
		level_blocks[level_held++] = p;
	}
	while (level_held > want) {
		free(level_blocks[--level_held]);
		level_blocks[level_held] = NULL;
	}
	mt_flush();
	return level_held;
}

void mt_exec_self(char *const args[])
{
	char *argv[16] = {prog};
	for (size_t i = 0; args[i] && i + 2 < 16; i++)
		argv[i + 1] = args[i];
	execv("/proc/self/exe", argv);
	perror("execv");
}

/* "malloc" and "free": blocks of 16 MiB, taken and freed by threads. */
#define BLOCK      (16u * MIB)
#define MAX_BLOCKS 1024

static void *blocks[MAX_BLOCKS];
static size_t nblocks;

struct job {
	size_t from, to;
};

static void *alloc_some(void *arg)
{
	struct job *j = arg;
	for (size_t i = j->from; i < j->to; i++) {
		blocks[i] = malloc(BLOCK);
		if (blocks[i])
			mt_touch(blocks[i], BLOCK);
	}
	mt_flush();
	return NULL;
}

static void *free_some(void *arg)
{
	struct job *j = arg;
	for (size_t i = j->from; i < j->to; i++) {
		free(blocks[i]);
		blocks[i] = NULL;
	}
	mt_flush();
	return NULL;
}

static void on_threads(void *(*fn)(void *), size_t n, size_t threads)
{
	pthread_t t[16];
	struct job j[16];
	if (threads < 1 || threads > 16)
		threads = 1;
	for (size_t k = 0; k < threads; k++) {
		j[k].from = n * k / threads;
		j[k].to = n * (k + 1) / threads;
		pthread_create(&t[k], NULL, fn, &j[k]);
	}
	for (size_t k = 0; k < threads; k++)
		pthread_join(t[k], NULL);
}

static void cmd_flush(const char *arg)
{
	(void)arg;
	mt_flush();
	mt_say("ok flushed");
}

static void cmd_malloc(const char *arg)
{
	unsigned long n, t = 1;
	if (sscanf(arg, "%lu %lu", &n, &t) < 1) {
		mt_say("error malloc N T");
		return;
	}
	nblocks = n * MIB / BLOCK;
	if (nblocks > MAX_BLOCKS)
		nblocks = MAX_BLOCKS;
	on_threads(alloc_some, nblocks, t);
	mt_flush();
	mt_say("ok allocated");
}

static void cmd_free(const char *arg)
{
	(void)arg;
	on_threads(free_some, nblocks, 2);
	mt_flush();
	mt_say("ok freed");
}

static void cmd_touch(const char *arg)
{
	unsigned long o, n;
	if (sscanf(arg, "%lu %lu", &o, &n) != 2) {
		mt_say("error touch O N");
		return;
	}
	mt_touch(mt_region + o * MIB, n * MIB);
	mt_say("ok touched");
}

static const struct mt_cmd common[] = {
    {"flush", cmd_flush}, {"malloc", cmd_malloc}, {"free", cmd_free},
    {"touch", cmd_touch}, {NULL, NULL},
};

/* The entry of `cmds` named `word` (`len` bytes long), or NULL. */
static const struct mt_cmd *find(const struct mt_cmd *cmds, const char *word,
                                 size_t len)
{
	for (; cmds && cmds->name; cmds++)
		if (strlen(cmds->name) == len &&
		    !strncmp(cmds->name, word, len))
			return cmds;
	return NULL;
}

int mt_serve(const struct mt_cmd *cmds, unsigned flags)
{
	const char *line;
	while ((line = mt_wait()) && strcmp(line, "exit") != 0) {
		if (flags & MT_FLUSH_FIRST)
			mt_flush();
		size_t len = strcspn(line, " ");
		const char *arg = line[len] ? line + len + 1 : line + len;
		const struct mt_cmd *c = find(cmds, line, len);
		if (!c)
			c = find(common, line, len);
		if (c)
			c->run(arg);
		else
			mt_say("error unknown %s", line);
	}
	return 0;
}

static int usage(void)
{
	fprintf(stderr, "usage: mt_worker SUBCOMMAND [ARGS...]\n");
	for (size_t i = 0; i < sizeof(subs) / sizeof(subs[0]); i++)
		fprintf(stderr, "  %s%s%s\n", subs[i]->name,
		        *subs[i]->usage ? " " : "", subs[i]->usage);
	return 2;
}

int main(int argc, char **argv)
{
	prog = argv[0];
	if (argc < 2)
		return usage();
	for (size_t i = 0; i < sizeof(subs) / sizeof(subs[0]); i++)
		if (strcmp(argv[1], subs[i]->name) == 0)
			return subs[i]->main(argc - 1, argv + 1);
	return usage();
}
