/*
 * mts_admit_types.h - what admit.c keeps in the registry's record of each
 * process (struct mts_proc): apart from mts_admit.h, whose functions walk
 * the registry, so that the registry's header can hold it without
 * including what works on the registry.
 */
#ifndef MTS_ADMIT_TYPES_H
#define MTS_ADMIT_TYPES_H

#include <stdbool.h>
#include <stdint.h>

/* Whether the worker is an admin's (auth.c), cached for the tick: valid
 * while `epoch` is the admission state's admin_epoch and the process's
 * uid and image are still `uid` and `image`. */
struct mts_admin_cache {
	uint32_t epoch; /* 0: not known */
	uint32_t uid;
	uint64_t image;
	bool admin;
};

#endif /* MTS_ADMIT_TYPES_H */
