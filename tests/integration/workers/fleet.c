/*
 * fleet - one task of a simulated fleet (bench/fleet.py, the node tests):
 * it holds heap memory following a profile, touched so the kernel charges
 * it, for a given time, doing a little CPU work on the way, then exits 0.
 *   usage: mt_worker fleet PROFILE PEAK_MIB SECONDS [CPU_FRACTION]
 *   steady  the peak from the start
 *   ramp    0 to the peak over the first 40% of the time, then held
 *   spike   30% of the peak, the whole peak for 15% of the time at mid-run
 *   leak    20% of the peak growing steadily to the peak at the end
 * The level is re-aimed every 20 ms from the clock, so a slowed task keeps
 * its profile in time; CPU_FRACTION (default 0.1) of each step is spent
 * spinning. Memory is held in 1 MiB blocks, flushed after every change.
 */
#include "mt_common.h"

#include <time.h>

/* The level at fraction f of the run, in MiB. */
static double level(const char *profile, double peak, double f)
{
	if (!strcmp(profile, "ramp"))
		return f >= 0.4 ? peak : peak * f / 0.4;
	if (!strcmp(profile, "spike"))
		return f >= 0.45 && f < 0.6 ? peak : 0.3 * peak;
	if (!strcmp(profile, "leak"))
		return peak * (0.2 + 0.8 * f);
	return peak;
}

static int fleet_main(int argc, char **argv)
{
	if (argc < 4) {
		fprintf(stderr,
		        "usage: mt_worker fleet PROFILE PEAK_MIB SECONDS "
		        "[CPU_FRACTION]\n");
		return 2;
	}
	const char *profile = argv[1];
	double peak = atof(argv[2]), secs = atof(argv[3]);
	double cpu = argc > 4 ? atof(argv[4]) : 0.1;
	double t0 = mt_now_s(), step = 0.02;
	volatile unsigned long spin = 0;
	for (;;) {
		double f = (mt_now_s() - t0) / secs;
		if (f >= 1)
			break;
		mt_hold_level(level(profile, peak, f));
		double busy_end = mt_now_s() + step * cpu;
		while (mt_now_s() < busy_end)
			spin++;
		struct timespec ts = {0, (long)(step * (1 - cpu) * 1e9)};
		nanosleep(&ts, NULL);
	}
	mt_hold_level(0);
	return 0;
}

const struct mt_sub mt_fleet = {
    "fleet", "PROFILE PEAK_MIB SECONDS [CPU_FRACTION]", fleet_main};
