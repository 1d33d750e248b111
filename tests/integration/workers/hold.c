/*
 * hold - hold MIB mebibytes in 1 MiB blocks (exactly a jemalloc size
 * class) from THREADS threads, print "ready pid=P", and serve:
 *   "free"      free everything, flush, print "freed"
 *   "more N"    hold N MiB more, flush, print "ready"
 * usage: mt_worker hold MIB [THREADS]
 */
#include "mt_common.h"

#include <pthread.h>

struct job {
	size_t mib;
	void **blocks;
};

static void *hold(void *arg)
{
	struct job *j = arg;
	for (size_t i = 0; i < j->mib; i++) {
		j->blocks[i] = malloc(MIB);
		mt_touch(j->blocks[i], MIB);
	}
	mt_flush();
	return NULL;
}

static struct job *jobs;
static size_t njobs, nthreads;

static void cmd_free(const char *arg)
{
	(void)arg;
	for (size_t i = 0; i < njobs; i++)
		for (size_t k = 0; k < jobs[i].mib; k++) {
			free(jobs[i].blocks[k]);
			jobs[i].blocks[k] = NULL;
		}
	mt_flush();
	mt_say("freed");
}

static void cmd_more(const char *arg)
{
	if (njobs >= nthreads + 64)
		return;
	struct job *j = &jobs[njobs++];
	j->mib = strtoul(arg, NULL, 10);
	j->blocks = calloc(j->mib + 1, sizeof(void *));
	hold(j);
	mt_say("ready");
}

static int hold_main(int argc, char **argv)
{
	size_t mib = argc > 1 ? strtoul(argv[1], NULL, 10) : 10;
	nthreads = argc > 2 ? strtoul(argv[2], NULL, 10) : 1;
	if (nthreads < 1)
		nthreads = 1;
	jobs = calloc(nthreads + 64, sizeof(*jobs));
	njobs = nthreads;
	pthread_t *t = calloc(nthreads, sizeof(*t));
	for (size_t i = 0; i < nthreads; i++) {
		jobs[i].mib = mib / nthreads + (i < mib % nthreads);
		jobs[i].blocks = calloc(jobs[i].mib + 1, sizeof(void *));
		pthread_create(&t[i], NULL, hold, &jobs[i]);
	}
	for (size_t i = 0; i < nthreads; i++)
		pthread_join(t[i], NULL);
	mt_flush();
	mt_ready();
	static const struct mt_cmd cmds[] = {
	    {"free", cmd_free}, {"more", cmd_more}, {NULL, NULL}};
	return mt_serve(cmds, 0);
}

const struct mt_sub mt_hold = {"hold", "MIB [THREADS]", hold_main};
