/*
 * setid.c - the set-uid family, in both preloads.
 *
 * A child forked without our handlers (_Fork(), a raw clone()) keeps its
 * parent's slot windows, writable, until it sets itself up at its first
 * allocation. One that gives up its uid before then (a launcher that
 * drops to run untrusted code) would hand them to that code: the claims
 * of every worker whose slot shares the table. So each of these sets the
 * child up first, which fences them (mtc_fork_seen; at once everywhere
 * else). While another thread of the child is setting it up, it waits
 * for that, a bounded while. A raw set-uid system call is not seen.
 */
#define _GNU_SOURCE
#include "client_internal.h"

#include <dlfcn.h>
#include <errno.h>
#include <sched.h>
#include <unistd.h>

#define SETID_EXPORT __attribute__((visibility("default")))

static void setid_changing(void)
{
	for (int i = 0; !mtc_fork_seen() && i < 1000; i++)
		sched_yield();
}

#define SETID_WRAP(name, params, args)                                         \
	SETID_EXPORT int name params                                           \
	{                                                                      \
		static int(*real) params;                                      \
		int(*f) params = __atomic_load_n(&real, __ATOMIC_RELAXED);     \
		if (!f) {                                                      \
			*(void **)&f = dlsym(RTLD_NEXT, #name);                \
			if (!f) {                                              \
				errno = ENOSYS;                                \
				return -1;                                     \
			}                                                      \
			__atomic_store_n(&real, f, __ATOMIC_RELAXED);          \
		}                                                              \
		setid_changing();                                              \
		return f args;                                                 \
	}

SETID_WRAP(setuid, (uid_t u), (u))
SETID_WRAP(seteuid, (uid_t u), (u))
SETID_WRAP(setreuid, (uid_t r, uid_t e), (r, e))
SETID_WRAP(setresuid, (uid_t r, uid_t e, uid_t s), (r, e, s))
