/*
 * linked.c - libmemtally's two front ends side by side: the inline API
 * (account.c) for memory the program accounts itself, and, once the
 * program calls memtally_init(), jemalloc's own counting (jemalloc_fe.c)
 * for everything it mallocs from the libjemalloc.so.2 it is linked to.
 */
#define _GNU_SOURCE
#include "client_internal.h"

#include <dlfcn.h>

int memtally_init(void)
{
	if (!mtc_init())
		return MEMTALLY_EDISABLED;
	/* The program's jemalloc, whichever library defines it; no counting
	 * fallback here: a program without the callback accounts with
	 * memtally_account(). */
	mtj_mallctl_fn f;
	*(void **)&f = dlsym(RTLD_DEFAULT, "mallctl");
	if (!f)
		return MEMTALLY_ENOHOOK;
	int err = mtj_init(f, 0);
	return err == MEMTALLY_EDISABLED ? MEMTALLY_ENOHOOK : err;
}

const struct mtc_front *const mtc_fronts[] = {&mtj_front, &mta_front, NULL};
