/*
 * ramp - move a level of heap memory at a steady, known rate, driven by
 * the clock (not by how fast it runs), so a test can compare the server's
 * growth rate with the truth:
 *   "ramp R S"   for S seconds, hold start + R x t MiB (R MiB/s, may be
 *                negative), re-aimed every 5 ms; then print "ramped N"
 *                (N = MiB held)
 *   "noise A S"  for S seconds, every 100 ms hold the level plus a random
 *                -A..+A MiB; then back to the level, print "noised"
 * Memory is held in 1 MiB blocks (exactly a jemalloc size class), flushed
 * after every change so the server sees each step within a tick.
 * usage: mt_worker ramp [START_MIB]
 */
#include "mt_common.h"

#include <time.h>

static size_t held; /* MiB */

static void nap_ms(long ms)
{
	struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};
	nanosleep(&ts, NULL);
}

static void cmd_ramp(const char *arg)
{
	double r, s, base = (double)held, t0 = mt_now_s(), t;
	if (sscanf(arg, "%lf %lf", &r, &s) != 2) {
		mt_say("error ramp R S");
		return;
	}
	while ((t = mt_now_s() - t0) < s) {
		held = mt_hold_level(base + r * t + 0.5);
		nap_ms(5);
	}
	held = mt_hold_level(base + r * s + 0.5);
	mt_say("ramped %zu", held);
}

static void cmd_noise(const char *arg)
{
	double a, s, base = (double)held, t0 = mt_now_s();
	if (sscanf(arg, "%lf %lf", &a, &s) != 2) {
		mt_say("error noise A S");
		return;
	}
	while (mt_now_s() - t0 < s) {
		double u = (double)rand() / RAND_MAX * 2 - 1;
		held = mt_hold_level(base + u * a + 0.5);
		nap_ms(100);
	}
	held = mt_hold_level(base + 0.5);
	mt_say("noised");
}

static int ramp_main(int argc, char **argv)
{
	held = mt_hold_level(argc > 1 ? strtod(argv[1], NULL) : 0);
	mt_flush();
	mt_ready();
	srand((unsigned)getpid());
	static const struct mt_cmd cmds[] = {
	    {"ramp", cmd_ramp}, {"noise", cmd_noise}, {NULL, NULL}};
	return mt_serve(cmds, 0);
}

const struct mt_sub mt_ramp = {"ramp", "[START_MIB]", ramp_main};
