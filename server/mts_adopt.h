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

#endif /* MTS_ADOPT_H */
