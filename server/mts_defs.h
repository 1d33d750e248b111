/*
 * mts_defs.h - what every part of memtallyd shares: its version, the
 * defaults of its command line, the longest name it accepts, its clocks.
 */
#ifndef MTS_DEFS_H
#define MTS_DEFS_H

#include <stdint.h>
#include <time.h>

#include "mtcommon.h"

#define MTS_DEFAULT_SOCKET    MT_DEFAULT_SOCKET
#define MTS_DEFAULT_SEGMENT   "memtally"
#define MTS_DEFAULT_SLOTS     4096u
#define MTS_DEFAULT_TICK_MS   10u
#define MTS_TICK_MAX_MS       60000u
#define MTS_DEFAULT_THRESHOLD MT_DEFAULT_THRESHOLD

/* Largest group or task name a worker may register (the client keeps at
 * most 63 bytes of a group; this leaves room without being unbounded). */
#define MTS_NAME_MAX MT_NAME_MAX

/* Wall-clock ns: timestamps a user reads (registered_ns, events). */
static inline uint64_t mts_now_realtime(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_REALTIME, &ts);
	return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

/* Monotonic ns: durations and deadlines. */
static inline uint64_t mts_now_monotonic(void)
{
	return mt_mono_ns();
}

#endif /* MTS_DEFS_H */
