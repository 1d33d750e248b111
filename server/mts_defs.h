/*
 * mts_defs.h - the constants every part of memtallyd shares: its version,
 * the defaults of its command line and the longest name it accepts.
 */
#ifndef MTS_DEFS_H
#define MTS_DEFS_H

#include "memtally_query.h"
#include "mtcommon.h"

#define MTS_VERSION MEMTALLY_VERSION_STRING

#define MTS_DEFAULT_SOCKET    MT_DEFAULT_SOCKET
#define MTS_DEFAULT_SEGMENT   "memtally"
#define MTS_DEFAULT_SLOTS     4096u
#define MTS_DEFAULT_TICK_MS   10u
#define MTS_TICK_MAX_MS       60000u
#define MTS_DEFAULT_THRESHOLD MT_DEFAULT_THRESHOLD

/* Largest group or task name a worker may register (the client keeps at
 * most 63 bytes of a group; this leaves room without being unbounded). */
#define MTS_NAME_MAX 255u

#endif /* MTS_DEFS_H */
