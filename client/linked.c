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
	 * memtally_account(), as before. */
	mtj_mallctl_fn f;
	*(void **)&f = dlsym(RTLD_DEFAULT, "mallctl");
	if (!f)
		return MEMTALLY_ENOHOOK;
	int err = mtj_init(f, 0);
	return err == MEMTALLY_EDISABLED ? MEMTALLY_ENOHOOK : err;
}

int mtc_front_flush(void)
{
	/* A thread that never called memtally_init() is set up here, once
	 * the process has chosen the callback. */
	if (mtj_mode() == MTJ_CALLBACK)
		mtj_thread_start();
	mtj_front_flush();
	return mta_front_flush();
}

int64_t mtc_front_drift(void)
{
	return mta_front_drift() + mtj_front_drift();
}

void mtc_front_force_slow(void)
{
	mta_front_force_slow();
	mtj_front_force_slow();
}
