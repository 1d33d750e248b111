/*
 * mts_adopt.h - adoption after a restart: live workers of the restart
 * record and their slot tables taken over as they are (adopt.c, on the
 * registry's adoption entry points, mts_registry.h).
 */
#ifndef MTS_ADOPT_H
#define MTS_ADOPT_H

#include <stdint.h>

#include "mts_registry.h"

/*
 * Rebuild the registry from the restart record: each recorded worker whose
 * pid is alive with the recorded start time is adopted with a fresh pidfd,
 * its slot table reopened from the worker's own mapping; the others are
 * freed. Counts both. Call right after mts_registry_init().
 */
int mts_adopt(struct mts_registry *reg, uint32_t *kept, uint32_t *dropped);

/*
 * A record about to be started afresh (--reset) still names the tasks the
 * node guard of the memtallyd before held stopped: each that is alive with
 * its recorded start time is resumed (SIGCONT, its tree), since no
 * successor would otherwise ever resume it. Nothing else is read from it.
 */
void mts_adopt_resume_held(struct mts_state *st, uint32_t slots);

#endif /* MTS_ADOPT_H */
