/*
 * mt_ramp - move a level of heap memory at a steady, known rate, driven by
 * the clock (not by how fast it runs), so a test can compare the server's
 * growth rate with the truth:
 *   "ramp R S"   for S seconds, hold start + R x t MiB (R MiB/s, may be
 *                negative), re-aimed every 5 ms; then print "ramped N"
 *                (N = MiB held)
 *   "noise A S"  for S seconds, every 100 ms hold the level plus a random
 *                -A..+A MiB; then back to the level, print "noised"
 *   "exit"       exit(0)            EOF   exit(0)
 * Memory is held in 1 MiB blocks (exactly a jemalloc size class), flushed
 * after every change so the server sees each step within a tick.
 * usage: mt_ramp [START_MIB]
 */
#include "mt_common.h"

#include <time.h>

#define MAX_MIB 8192

static void *blocks[MAX_MIB];
static size_t held;

static void nap_ms(long ms)
{
	struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};
	nanosleep(&ts, NULL);
}

static void set_level(double mib)
{
	size_t want = mib < 0 ? 0 : mib > MAX_MIB ? MAX_MIB : (size_t)mib;
	if (want == held)
		return;
	while (held < want) {
		blocks[held] = malloc(MIB);
		mt_touch(blocks[held], MIB);
		held++;
	}
	while (held > want)
		free(blocks[--held]);
	mt_flush();
}

int main(int argc, char **argv)
{
	set_level(argc > 1 ? strtod(argv[1], NULL) : 0);
	mt_flush();
	mt_say("ready pid=%d", (int)getpid());
	srand((unsigned)getpid());
	const char *cmd;
	double r, s;
	while ((cmd = mt_wait()) && strcmp(cmd, "exit") != 0) {
		double base = (double)held, t0 = mt_now_s(), t;
		if (sscanf(cmd, "ramp %lf %lf", &r, &s) == 2) {
			while ((t = mt_now_s() - t0) < s) {
				set_level(base + r * t + 0.5);
				nap_ms(5);
			}
			set_level(base + r * s + 0.5);
			mt_say("ramped %zu", held);
		} else if (sscanf(cmd, "noise %lf %lf", &r, &s) == 2) {
			while (mt_now_s() - t0 < s) {
				double u = (double)rand() / RAND_MAX * 2 - 1;
				set_level(base + u * r + 0.5);
				nap_ms(100);
			}
			set_level(base + 0.5);
			mt_say("noised");
		}
	}
	return 0;
}
