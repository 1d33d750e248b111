/*
 * mts_hooks.h - memtallyd's state hooks (hooks.c): a shell command run for
 * every change of the fleet's or a group's state, so that a cluster
 * scheduler's own mechanism (draining a Slurm node, pausing a queue)
 * hears what this node's memtallyd decided. Internal to server/.
 */
#ifndef MEMTALLY_SERVER_HOOKS_H
#define MEMTALLY_SERVER_HOOKS_H

#include <stdint.h>

#include <uv.h>

/* [hooks] timeout: a hook still running after it is killed (its whole
 * process group, SIGKILL). */
#define MTS_HOOK_DEFAULT_TIMEOUT_MS 30000u
#define MTS_HOOK_TIMEOUT_MIN_MS     100u
#define MTS_HOOK_TIMEOUT_MAX_MS     3600000u
/* [hooks] min_interval: a scope's hooks start at least this far apart,
 * so a figure flapping around a mark cannot drain and resume a node many
 * times a second (the latest state still wins: see hooks.c). Off by
 * default: with it, an over and back within the interval runs no hook at
 * all, which a setup that must see every crossing would not want; the
 * example configuration turns it on. */
#define MTS_HOOK_DEFAULT_MIN_INTERVAL_MS 0u
/* [hooks] retry: a hook that failed (exit status not 0, a signal, its
 * timeout, or not started) runs again this long after, while its scope's
 * state holds, the wait doubling with each failure up to
 * MTS_HOOK_RETRY_MAX_MS (or retry, if longer). A drain or a resume that
 * met slurmctld down would otherwise wait for the next change, which may
 * never come. 0 = never again (the next change tries). */
#define MTS_HOOK_DEFAULT_RETRY_MS 10000u
#define MTS_HOOK_RETRY_MAX_MS     300000u
/* Hooks running at once over all scopes; more wait for one to end. */
#define MTS_HOOKS_MAX_RUNNING 16u
/* What is kept of a hook's stderr for the log. */
#define MTS_HOOK_STDERR_MAX 512u

/* The [hooks] section. Strings are owned (malloc); NULL = not set. */
struct mts_hook_conf {
	char *cmd[3];        /* on_ok, on_high, on_over: by enum mtshm_state */
	uint32_t timeout_ms; /* 0 = MTS_HOOK_DEFAULT_TIMEOUT_MS */
	uint32_t min_interval_ms; /* 0 = none */
	uint32_t retry_ms;        /* 0 = never */
	char *node;               /* MEMTALLY_NODE; NULL = the host name */
};

/* Deep copy into *dst (overwritten, not freed). 0 or -ENOMEM. */
int mts_hook_conf_copy(struct mts_hook_conf *dst,
                       const struct mts_hook_conf *src);
/* Free the strings; the struct is zeroed. Accepts NULL. */
void mts_hook_conf_free(struct mts_hook_conf *c);

struct mts_hooks;
struct mts_event;

/*
 * The hooks of one server on `loop`, configured per `conf` (copied; NULL:
 * none). `socket` (copied; may be NULL) is handed to hooks as
 * MEMTALLY_SOCKET, so a `memtally` they run asks this server. 0, -ENOMEM.
 */
int mts_hooks_new(struct mts_hooks **out, uv_loop_t *loop,
                  const struct mts_hook_conf *conf, const char *socket);

/* A reload: the new commands, timeout and node apply to the hooks
 * started from now on; running ones keep theirs. `conf` is taken over
 * (a copy the caller made, mts_hook_conf_copy, before it changed
 * anything else) and zeroed: nothing can fail here, so a reload is
 * applied whole or not at all. */
void mts_hooks_configure(struct mts_hooks *h, struct mts_hook_conf *conf);

/* A state change (the registry's event sink calls it): fleet and group
 * scopes run their hook, processes' changes are ignored. Never blocks:
 * at most a vfork. Accepts h NULL. */
void mts_hooks_event(struct mts_hooks *h, const struct mts_event *ev);

struct mts_figures;

/*
 * The server has started: run the fleet's hook once for its `state` and
 * figures `fig` (limits comparing `measure`, mts_measure_name()) now, with
 * MEMTALLY_PREVIOUS=unknown, so a consumer that missed a change while memtallyd
 * was down (a node left drained) catches up. Nothing when a fleet hook already
 * ran or waits (an event during the start) or no hook is configured. Accepts h
 * NULL.
 */
void mts_hooks_start(struct mts_hooks *h, uint32_t state,
                     const struct mts_figures *fig, const char *measure);

/* Stop: kill the hooks still running (their process groups, SIGKILL, each
 * logged), close every handle; the object is freed once their close
 * callbacks have run (the loop must run on). Accepts NULL. */
void mts_hooks_stop(struct mts_hooks *h);

#endif /* MEMTALLY_SERVER_HOOKS_H */
