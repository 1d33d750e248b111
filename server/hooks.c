/*
 * hooks.c - state hooks: `[hooks] on_ok`, `on_high`, `on_over`. Each is a
 * shell command line, run with `/bin/sh -c` when the fleet or a group
 * enters that state, with the figures in its environment:
 *
 *   MEMTALLY_SCOPE     "fleet", or the group's name
 *   MEMTALLY_KIND      "fleet" or "group" (a group may be named "fleet")
 *   MEMTALLY_STATE     ok, high, over: the state the hook is run for
 *   MEMTALLY_PREVIOUS  the state the scope's previous hook was run for,
 *                      ok when none was; what a consumer last heard;
 *                      unknown for the fleet's hook at memtallyd's start
 *   MEMTALLY_BYTES, MEMTALLY_RSS, MEMTALLY_RESERVED, MEMTALLY_LIMIT
 *                      bytes, as of the event that led to it (limit 0 is
 *                      none); the figures whose row in figures.c names a
 *                      variable
 *   MEMTALLY_MEASURE, MEMTALLY_REASON, MEMTALLY_NODE ([hooks] node, or the
 *   host name), MEMTALLY_SOCKET (this server's, for `memtally` in a hook)
 *
 * Invariants, and why:
 *  - Never on the loop's time. A hook is a child process started with
 *    posix_spawn. That is a vfork, so the loop is held only until the exec
 *    (see start_process). The child's exit (its pidfd), stderr and
 *    deadline are libuv handles, and nothing waits for it. Queries are
 *    answered while a hook runs as at any other time.
 *  - One per scope at a time, latest state wins. A scope's states can
 *    change faster than a hook runs: drain takes a second, and the fleet
 *    flaps around a mark. A change while the scope's hook runs is only
 *    remembered. When the hook ends, the hook of the scope's latest state
 *    runs if that state is not the one last reported. So a scope's hooks
 *    run one after the other, and the last one always has the scope's
 *    current state. ok -> high -> over -> high seen during one slow hook
 *    for high runs nothing more. ok -> over -> ok during one for over
 *    runs on_ok.
 *  - A state without a command counts as reported. With on_over and on_ok
 *    alone (drain / resume), ok -> high -> over shows PREVIOUS=high.
 *  - Bounded in time. Each hook runs in its own session and process group
 *    (POSIX_SPAWN_SETSID). `[hooks] timeout` after its start the whole
 *    group is killed with SIGKILL, a `sleep` it started included, and that
 *    is logged. A hook is over when its shell has exited and its stderr is
 *    closed, or at the deadline. A background process that keeps stderr
 *    open is killed with the group then.
 *  - At most one start per `[hooks] min_interval` per scope. A scope whose
 *    next hook would start sooner waits. Its latest state still wins, so a
 *    figure flapping every few milliseconds costs one hook per interval,
 *    not one per flap. The scope is remembered until its interval has
 *    passed, so it cannot start afresh by being forgotten. One timer
 *    serves every waiting scope.
 *  - A failed hook is run again. A hook that exits with a status other
 *    than 0, is killed, times out or cannot start is retried `[hooks]
 *    retry` later, the wait doubling to MTS_HOOK_RETRY_MAX_MS, for as long
 *    as its scope's state holds, with the environment it had (PREVIOUS
 *    included). A change of state ends the retries: the new state's hook
 *    runs as usual, told PREVIOUS = the failed state (a consumer may have
 *    heard it half). Level-triggered consumers (a drain, a resume) need
 *    this: a resume that met slurmctld down would leave the node drained
 *    until the fleet next went over.
 *  - The fleet's state is run once at start (mts_hooks_start), PREVIOUS
 *    unknown: a change missed while memtallyd was down is caught up.
 *  - Bounded in number: MTS_HOOKS_MAX_RUNNING at once in all. The others
 *    wait their turn in order. A scope is tracked only while it has a hook
 *    running or waiting or is not `ok`. The table thus holds the scopes
 *    that matter, never every group a worker ever named.
 *  - Logged: the start (info), and the end with exit status or signal,
 *    duration and the first MTS_HOOK_STDERR_MAX bytes of stderr (info when
 *    it exited 0, warn otherwise). A timeout is a warning. stdout goes to
 *    /dev/null.
 *  - The server's own state never leaks into a hook. Every descriptor of
 *    memtallyd is close-on-exec, and NOTIFY_SOCKET (systemd's readiness
 *    socket) is removed from the hook's environment.
 */
#include "mts_hooks.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <signal.h>
#include <spawn.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/pidfd.h>
#include <sys/wait.h>
#include <unistd.h>

#include "mts_figures.h"
#include "mts_log.h"
#include "mts_policy.h"
#include "mts_registry.h"
#include "mtshm.h"

struct hook_run;

/* A fleet or group scope with hooks to run or a state not `ok`. */
struct hook_scope {
	struct hook_scope *next;
	char *name; /* "fleet" or the group's name */
	bool group;
	uint32_t reported; /* the state the last hook was for */
	/* The latest event of the scope, not yet acted on when `pending`. */
	bool pending;
	uint32_t state;
	struct mts_figures fig;
	char reason[96];
	char measure[16];       /* the event's: "accounted", "rss" or "max" */
	struct hook_run *run;   /* running, or NULL */
	bool queued;            /* waiting for a free place */
	bool started;           /* a hook was started: last_start_ms is set */
	uint64_t last_start_ms; /* uv_now() of its latest hook's start */
	/* The hook of `reported` failed: run again at retry_at_ms, told
	 * PREVIOUS = failed_previous, while the state is still `reported`. */
	bool failed;
	uint32_t failed_previous;
	uint32_t fails; /* failures in a row of that state's hook */
	uint64_t retry_at_ms;
};

struct hook_run {
	struct mts_hooks *h;
	struct hook_scope *scope; /* NULL once the scope is gone (stop) */
	uv_poll_t exit;   /* on the pidfd: readable when the shell exits */
	uv_pipe_t err;    /* its stderr */
	uv_timer_t timer; /* the deadline */
	int open_handles; /* closed ones are counted down; 0: free */
	int pidfd;        /* closed with the last handle */
	int pid;
	uint32_t state, previous;
	uint64_t start_ms;
	bool exited, eof, timed_out, reading;
	bool killed; /* its group was sent SIGKILL at the deadline */
	uint64_t spawn_us;
	int64_t exit_status;
	int term_signal;
	char errbuf[MTS_HOOK_STDERR_MAX];
	size_t errlen;
	bool truncated;
	char drain[256]; /* stderr past errbuf is read into this, dropped */
};

struct mts_hooks {
	uv_loop_t *loop;
	struct mts_hook_conf conf;
	char node[256];
	char *socket;
	bool enabled; /* any command configured */
	struct hook_scope *scopes;
	uint32_t running;
	uint32_t live_runs; /* runs not yet freed (their handles closing) */
	bool stopping;
	/* mts_hooks_start ran: before it (a restart's adoption and first
	 * evaluation), what a consumer last heard is not known, and a
	 * scope's first hook says PREVIOUS=unknown, not ok (told ok, the
	 * Slurm hook left a node its predecessor drained, drained). */
	bool started_up;
	/* Wakes scopes held back by min_interval (see the top). Closed at
	 * stop; the hooks are freed once it and every run are closed. */
	uv_timer_t interval;
	bool interval_closed;
};

int mts_hook_conf_copy(struct mts_hook_conf *dst,
                       const struct mts_hook_conf *src)
{
	struct mts_hook_conf c = {.timeout_ms = src->timeout_ms,
	                          .min_interval_ms = src->min_interval_ms,
	                          .retry_ms = src->retry_ms};
	for (int i = 0; i < 3; i++)
		if (src->cmd[i] && !(c.cmd[i] = strdup(src->cmd[i])))
			goto fail;
	if (src->node && !(c.node = strdup(src->node)))
		goto fail;
	*dst = c;
	return 0;
fail:
	mts_hook_conf_free(&c);
	return -ENOMEM;
}

void mts_hook_conf_free(struct mts_hook_conf *c)
{
	if (!c)
		return;
	for (int i = 0; i < 3; i++)
		free(c->cmd[i]);
	free(c->node);
	memset(c, 0, sizeof(*c));
}

static void set_conf(struct mts_hooks *h, struct mts_hook_conf *conf)
{
	mts_hook_conf_free(&h->conf);
	h->conf = *conf;
	if (!h->conf.timeout_ms)
		h->conf.timeout_ms = MTS_HOOK_DEFAULT_TIMEOUT_MS;
	h->enabled = conf->cmd[0] || conf->cmd[1] || conf->cmd[2];
	if (h->conf.node) {
		snprintf(h->node, sizeof(h->node), "%s", h->conf.node);
	} else if (gethostname(h->node, sizeof(h->node)) < 0) {
		snprintf(h->node, sizeof(h->node), "localhost");
	}
	h->node[sizeof(h->node) - 1] = '\0';
}

int mts_hooks_new(struct mts_hooks **out, uv_loop_t *loop,
                  const struct mts_hook_conf *conf, const char *socket)
{
	struct mts_hooks *h = calloc(1, sizeof(*h));
	if (!h)
		return -ENOMEM;
	h->loop = loop;
	struct mts_hook_conf c = {0};
	if ((conf && mts_hook_conf_copy(&c, conf) < 0) ||
	    (socket && !(h->socket = strdup(socket)))) {
		mts_hook_conf_free(&c);
		free(h);
		return -ENOMEM;
	}
	set_conf(h, &c);
	uv_timer_init(loop, &h->interval);
	h->interval.data = h;
	*out = h;
	return 0;
}

static void scope_gc(struct mts_hooks *h, struct hook_scope *s);

void mts_hooks_configure(struct mts_hooks *h, struct mts_hook_conf *conf)
{
	set_conf(h, conf);
	*conf = (struct mts_hook_conf){0};
	if (!h->conf.retry_ms)
		for (struct hook_scope *s = h->scopes; s; s = s->next)
			s->failed = false; /* a retry waiting is dropped */
	if (h->enabled)
		return;
	/* This configuration has no hooks: forget the scopes (a running
	 * hook's is dropped when it ends), so that hooks configured again
	 * later start from the next change. */
	for (struct hook_scope *s = h->scopes, *next; s; s = next) {
		next = s->next;
		s->pending = s->queued = s->failed = false;
		s->reported = MTSHM_STATE_OK;
		scope_gc(h, s);
	}
}

static void free_hooks(struct mts_hooks *h)
{
	while (h->scopes) {
		struct hook_scope *s = h->scopes;
		h->scopes = s->next;
		free(s->name);
		free(s);
	}
	mts_hook_conf_free(&h->conf);
	free(h->socket);
	free(h);
}

/* ---- scopes ----------------------------------------------------------- */

/* Linear: the list holds only scopes that are not `ok` or have a hook
 * running or waiting, a handful in practice (see the top). */
static struct hook_scope *scope_find(struct mts_hooks *h, const char *name,
                                     bool group)
{
	for (struct hook_scope *s = h->scopes; s; s = s->next)
		if (s->group == group && strcmp(s->name, name) == 0)
			return s;
	return NULL;
}

static struct hook_scope *scope_add(struct mts_hooks *h, const char *name,
                                    bool group)
{
	struct hook_scope *s = calloc(1, sizeof(*s));
	if (!s || !(s->name = strdup(name))) {
		free(s);
		return NULL;
	}
	s->group = group;
	s->reported = MTSHM_STATE_OK;
	/* At the tail: queued scopes start in the order they came. */
	struct hook_scope **p = &h->scopes;
	while (*p)
		p = &(*p)->next;
	*p = s;
	return s;
}

/* Milliseconds before scope `s` may start its next hook; 0 = now. */
static uint64_t interval_left(const struct mts_hooks *h,
                              const struct hook_scope *s)
{
	uint64_t min = h->conf.min_interval_ms;
	if (!min || !s->started)
		return 0;
	uint64_t since = uv_now(h->loop) - s->last_start_ms;
	return since >= min ? 0 : min - since;
}

/* The budget a scope's hook lines go in (mts_log_scope): with no
 * min_interval, a flapping scope starts one hook after another. */
static const char *log_key(char *buf, size_t cap, const struct hook_scope *s)
{
	snprintf(buf, cap, "hooks:%s%s", s && s->group ? "group:" : "",
	         s ? s->name : "");
	return buf;
}

/* Is the scope's next hook a retry of its failed one? */
static bool retrying(const struct hook_scope *s)
{
	return s->failed && s->state == s->reported;
}

/* Milliseconds before scope `s` may start its next hook: its interval,
 * and a retry's wait. 0 = now. */
static uint64_t wait_left(const struct mts_hooks *h, const struct hook_scope *s)
{
	uint64_t left = interval_left(h, s);
	if (retrying(s)) {
		uint64_t now = uv_now(h->loop);
		if (s->retry_at_ms > now && s->retry_at_ms - now > left)
			left = s->retry_at_ms - now;
	}
	return left;
}

/* The hook for `state`, told PREVIOUS = `previous`, failed (`how` says
 * how): run it again later while the state holds, if [hooks] retry. */
static void failed(struct mts_hooks *h, struct hook_scope *s, uint32_t state,
                   uint32_t previous, const char *how)
{
	/* With no hooks left (a reload), the scope is only waiting to be
	 * forgotten: its `reported` was reset for that, left as it is. */
	if (!h->conf.retry_ms || h->stopping || !h->enabled) {
		s->failed = false;
		return;
	}
	s->fails = s->failed ? s->fails + 1 : 1;
	s->failed = true;
	s->failed_previous = previous;
	uint64_t wait = h->conf.retry_ms;
	uint64_t cap =
	    wait > MTS_HOOK_RETRY_MAX_MS ? wait : MTS_HOOK_RETRY_MAX_MS;
	for (uint32_t i = 1; i < s->fails && wait < cap; i++)
		wait *= 2;
	if (wait > cap)
		wait = cap;
	s->retry_at_ms = uv_now(h->loop) + wait;
	s->pending = true; /* the latest state decides in maybe_start */
	char q[MTS_LOGQ_MAX], key[320];
	mts_log_scope(log_key(key, sizeof(key), s), MTS_LOG_WARN,
	              "hook failed: run again while the state holds",
	              "scope=%s state=%s %s failures=%u retry_in_ms=%llu",
	              mts_logq(q, sizeof(q), s->name), mt_state_name(state),
	              how, s->fails, (unsigned long long)wait);
}

static void on_interval(uv_timer_t *t);

/* Wake in `ms` (or sooner, if the timer is already due sooner). */
static void interval_arm(struct mts_hooks *h, uint64_t ms)
{
	if (h->stopping)
		return;
	uint64_t due = uv_now(h->loop) + ms;
	if (uv_is_active((uv_handle_t *)&h->interval) &&
	    uv_timer_get_due_in(&h->interval) + uv_now(h->loop) <= due)
		return;
	uv_timer_start(&h->interval, on_interval, ms, 0);
}

/* Drop a scope with nothing left to do and nothing to remember. */
static void scope_gc(struct mts_hooks *h, struct hook_scope *s)
{
	if (s->run || s->queued || s->pending || s->reported != MTSHM_STATE_OK)
		return;
	if (!h->stopping && interval_left(h, s) > 0)
		return; /* the interval timer collects it */
	for (struct hook_scope **p = &h->scopes; *p; p = &(*p)->next) {
		if (*p == s) {
			*p = s->next;
			break;
		}
	}
	free(s->name);
	free(s);
}

/* ---- running one ------------------------------------------------------ */

static void maybe_start(struct mts_hooks *h, struct hook_scope *s);
static void start_queued(struct mts_hooks *h);

static void on_run_closed(uv_handle_t *handle)
{
	struct hook_run *r = handle->data;
	if (--r->open_handles > 0)
		return;
	struct mts_hooks *h = r->h;
	if (r->pidfd >= 0)
		close(r->pidfd);
	free(r);
	if (--h->live_runs == 0 && h->stopping && h->interval_closed)
		free_hooks(h);
}

static void on_interval_closed(uv_handle_t *handle)
{
	struct mts_hooks *h = handle->data;
	h->interval_closed = true;
	if (h->live_runs == 0)
		free_hooks(h);
}

static void close_run(struct hook_run *r)
{
	/* Reap the shell only now, after any kill of its group: until then
	 * the zombie keeps its pid -- the group's id -- from being reused,
	 * so kill_group() can never reach a stranger's group. */
	if (r->exited) {
		siginfo_t si = {0};
		(void)waitid(P_PIDFD, (id_t)r->pidfd, &si, WEXITED | WNOHANG);
	}
	uv_close((uv_handle_t *)&r->exit, on_run_closed);
	uv_close((uv_handle_t *)&r->err, on_run_closed);
	uv_close((uv_handle_t *)&r->timer, on_run_closed);
}

/* The hook is over: log it, free its place, run what waits. */
static void finish(struct hook_run *r)
{
	struct mts_hooks *h = r->h;
	char qs[MTS_LOGQ_MAX], qe[MTS_HOOK_STDERR_MAX * 2 + 8], how[48];
	uint64_t ms = uv_now(h->loop) - r->start_ms;
	/* One line: newlines of stderr are escaped by mts_logq. */
	r->errbuf[r->errlen < sizeof(r->errbuf) ? r->errlen
	                                        : sizeof(r->errbuf) - 1] = '\0';
	if (r->term_signal)
		snprintf(how, sizeof(how), "signal=%s",
		         sigabbrev_np(r->term_signal)
		             ? sigabbrev_np(r->term_signal)
		             : "?");
	else
		snprintf(how, sizeof(how), "exit_status=%" PRId64,
		         r->exit_status);
	bool ok = !r->term_signal && r->exit_status == 0 && !r->timed_out;
	char key[320];
	mts_log_scope(
	    log_key(key, sizeof(key), r->scope),
	    ok ? MTS_LOG_INFO : MTS_LOG_WARN, "hook finished",
	    "scope=%s state=%s previous=%s pid=%d %s duration_ms=%llu "
	    "timed_out=%d stderr=%s%s",
	    mts_logq(qs, sizeof(qs), r->scope ? r->scope->name : "(stopped)"),
	    mt_state_name(r->state), mt_state_name(r->previous), r->pid, how,
	    (unsigned long long)ms, r->timed_out,
	    mts_logq(qe, sizeof(qe), r->errbuf),
	    r->truncated ? " stderr_truncated=1" : "");
	close_run(r);
	h->running--;
	struct hook_scope *s = r->scope;
	if (s) {
		s->run = NULL;
		if (ok)
			s->failed = false;
		else
			failed(h, s, r->state, r->previous, how);
		if (!h->stopping)
			maybe_start(h, s);
	}
	if (!h->stopping)
		start_queued(h);
}

static void maybe_finish(struct hook_run *r)
{
	if (r->exited && (r->eof || r->timed_out))
		finish(r);
}

static void kill_group(struct hook_run *r)
{
	/* The hook leads its own session and process group (setsid): the
	 * shell and whatever it started, unless they moved out on purpose.
	 * The shell is reaped only in close_run(), after this: its zombie
	 * keeps the group's id from being reused, so this cannot hit a
	 * stranger even when every member has left the group; the shell
	 * itself, which may have left its group, through its pidfd. */
	kill(-r->pid, SIGKILL);
	if (!r->exited)
		pidfd_send_signal(r->pidfd, SIGKILL, NULL, 0);
}

/* The pidfd is readable: the shell exited. Take its status but leave the
 * zombie (WNOWAIT) until close_run(): see kill_group(). It is our child
 * and only we wait for it (libuv's own reaping is for uv_spawn, unused). */
static void on_exited(uv_poll_t *p, int status, int events)
{
	struct hook_run *r = p->data;
	(void)status;
	(void)events;
	siginfo_t si = {0};
	if (waitid(P_PIDFD, (id_t)r->pidfd, &si, WEXITED | WNOHANG | WNOWAIT) <
	        0 ||
	    si.si_pid == 0)
		return; /* not yet (a spurious wake-up) */
	uv_poll_stop(p);
	r->exited = true;
	if (si.si_code == CLD_EXITED)
		r->exit_status = si.si_status;
	else
		r->term_signal = si.si_status;
	maybe_finish(r);
}

/* How long a hook killed at its deadline has to die. One in
 * uninterruptible sleep (scontrol on a dead NFS mount) does not die of
 * SIGKILL until its call returns: past this its run is given up, so that
 * its scope's later states and its place among the running hooks are not
 * held for ever. Its zombie, if it ever exits, stays until memtallyd
 * does. */
#define MTS_HOOK_KILL_GRACE_MS 5000u

static void on_deadline(uv_timer_t *t)
{
	struct hook_run *r = t->data;
	char q[MTS_LOGQ_MAX], key[320];
	if (r->killed) {
		mts_log_scope(
		    log_key(key, sizeof(key), r->scope), MTS_LOG_ERROR,
		    "hook did not die of SIGKILL; given up",
		    "scope=%s state=%s pid=%d grace_ms=%u",
		    mts_logq(q, sizeof(q),
		             r->scope ? r->scope->name : "(stopped)"),
		    mt_state_name(r->state), r->pid, MTS_HOOK_KILL_GRACE_MS);
		r->term_signal = SIGKILL;
		finish(r);
		return;
	}
	r->timed_out = true;
	if (r->exited) {
		/* The shell is gone but something of the group still holds
		 * its stderr: kill what is left and be done. */
		kill_group(r);
		finish(r);
		return;
	}
	mts_log_scope(
	    log_key(key, sizeof(key), r->scope), MTS_LOG_WARN,
	    "hook timed out, killing its process group",
	    "scope=%s state=%s pid=%d timeout_ms=%u",
	    mts_logq(q, sizeof(q), r->scope ? r->scope->name : "(stopped)"),
	    mt_state_name(r->state), r->pid, r->h->conf.timeout_ms);
	kill_group(r);
	/* on_exited follows at once and finishes it; if not, the grace. */
	r->killed = true;
	uv_timer_start(&r->timer, on_deadline, MTS_HOOK_KILL_GRACE_MS, 0);
}

static void on_alloc(uv_handle_t *handle, size_t hint, uv_buf_t *buf)
{
	struct hook_run *r = handle->data;
	(void)hint;
	if (r->errlen + 1 < sizeof(r->errbuf))
		*buf =
		    uv_buf_init(r->errbuf + r->errlen,
		                (unsigned)(sizeof(r->errbuf) - 1 - r->errlen));
	else
		*buf = uv_buf_init(r->drain, sizeof(r->drain));
}

static void on_read(uv_stream_t *stream, ssize_t n, const uv_buf_t *buf)
{
	struct hook_run *r = stream->data;
	if (n > 0) {
		if (buf->base == r->drain)
			r->truncated = true;
		else
			r->errlen += (size_t)n;
		return;
	}
	if (n < 0) { /* UV_EOF, or an error: nothing more will come */
		uv_read_stop(stream);
		r->reading = false;
		r->eof = true;
		maybe_finish(r);
	}
}

/* One environment entry "NAME=value" appended at *pos of buf; its start is
 * stored in env[(*n)++]. */
static void env_add(char **env, size_t *n, char *buf, size_t cap, size_t *pos,
                    const char *name, const char *fmt, ...)
    __attribute__((format(printf, 7, 8)));

static void env_add(char **env, size_t *n, char *buf, size_t cap, size_t *pos,
                    const char *name, const char *fmt, ...)
{
	if (*pos >= cap)
		return;
	char *start = buf + *pos;
	int k = snprintf(start, cap - *pos, "%s=", name);
	if (k < 0 || (size_t)k >= cap - *pos)
		return;
	va_list ap;
	va_start(ap, fmt);
	int v = vsnprintf(start + k, cap - *pos - (size_t)k, fmt, ap);
	va_end(ap);
	if (v < 0 || (size_t)(k + v) >= cap - *pos)
		return;
	*pos += (size_t)(k + v) + 1;
	env[(*n)++] = start;
}

/* Names we set, and NOTIFY_SOCKET: not inherited from the server. */
static bool env_ours(const char *kv)
{
	return strncmp(kv, "MEMTALLY_", 9) == 0 ||
	       strncmp(kv, "NOTIFY_SOCKET=", 14) == 0;
}

/* Our variables besides the figures'. */
#define OUR_VARS 8

/* A hook is an ordinary process: it does not keep the oom_score_adj that
 * shields memtallyd (lowered at start, or the unit's OOMScoreAdjust). An
 * on_over hook runs when memory is short; a runaway one must not be the
 * last the kernel would kill. Raising a score needs no privilege. Done
 * as soon as posix_spawn returns: the hook's first instructions may still
 * run shielded. */
static void unprotect(pid_t pid)
{
	char path[48];
	snprintf(path, sizeof(path), "/proc/%d/oom_score_adj", (int)pid);
	int fd = open(path, O_WRONLY | O_CLOEXEC);
	if (fd < 0)
		return;
	if (write(fd, "0", 1) < 0) {
		/* It has exited already, or a policy forbids it: it
		 * runs as it is. */
	}
	close(fd);
}

/*
 * Start `/bin/sh -c cmd` for run `r` in its own session. Its stdin and
 * stdout are /dev/null and its stderr a pipe. Every signal is at its
 * default and none is blocked, because memtallyd ignores SIGPIPE and a
 * hook must not inherit that. posix_spawn holds the loop only until the
 * exec, since glibc implements it with clone(CLONE_VFORK) and copies no
 * page tables. fork, as uv_spawn does, would copy memtallyd's page tables
 * first. The polled pidfd then tells the exit. Returns 0 with the handles
 * open and counted in the hooks, or -errno with nothing left open.
 */
static int start_process(struct hook_run *r, const char *cmd, char **env)
{
	struct mts_hooks *h = r->h;
	int pfd[2];
	if (pipe2(pfd, O_CLOEXEC) < 0)
		return -errno;
	posix_spawn_file_actions_t fa;
	posix_spawnattr_t at;
	sigset_t all, none;
	sigfillset(&all);
	sigemptyset(&none);
	int err = posix_spawn_file_actions_init(&fa);
	if (err)
		goto fail_close_pipe;
	err = posix_spawnattr_init(&at);
	if (err)
		goto fail_destroy_fa;
	if ((err = posix_spawn_file_actions_addopen(&fa, 0, "/dev/null",
	                                            O_RDONLY, 0)) ||
	    (err = posix_spawn_file_actions_addopen(&fa, 1, "/dev/null",
	                                            O_WRONLY, 0)) ||
	    (err = posix_spawn_file_actions_adddup2(&fa, pfd[1], 2)) ||
	    (err = posix_spawnattr_setflags(&at, POSIX_SPAWN_SETSID |
	                                             POSIX_SPAWN_SETSIGDEF |
	                                             POSIX_SPAWN_SETSIGMASK)) ||
	    (err = posix_spawnattr_setsigdefault(&at, &all)) ||
	    (err = posix_spawnattr_setsigmask(&at, &none)))
		goto fail_destroy_attr;
	char *args[] = {"sh", "-c", (char *)cmd, NULL};
	pid_t pid;
	uint64_t t0 = uv_hrtime();
	err = posix_spawn(&pid, "/bin/sh", &fa, &at, args, env);
	r->spawn_us = (uv_hrtime() - t0) / 1000;
	if (err)
		goto fail_destroy_attr;
	posix_spawnattr_destroy(&at);
	posix_spawn_file_actions_destroy(&fa);
	close(pfd[1]);
	unprotect(pid);
	r->pid = (int)pid;
	r->pidfd = pidfd_open(pid, 0);
	if (r->pidfd < 0) {
		/* Cannot watch it: do not leave it running unwatched. */
		err = errno;
		kill(pid, SIGKILL);
		waitpid(pid, NULL, 0);
		close(pfd[0]);
		return -err;
	}
	uv_poll_init(h->loop, &r->exit, r->pidfd);
	uv_pipe_init(h->loop, &r->err, 0);
	uv_timer_init(h->loop, &r->timer);
	r->exit.data = r->err.data = r->timer.data = r;
	r->open_handles = 3;
	h->live_runs++;
	if (uv_pipe_open(&r->err, pfd[0]) < 0)
		close(pfd[0]); /* no stderr then: only the exit counts */
	r->reading =
	    uv_is_readable((uv_stream_t *)&r->err) &&
	    uv_read_start((uv_stream_t *)&r->err, on_alloc, on_read) == 0;
	r->eof = !r->reading;
	uv_poll_start(&r->exit, UV_READABLE, on_exited);
	uv_timer_start(&r->timer, on_deadline, h->conf.timeout_ms, 0);
	return 0;

fail_destroy_attr:
	posix_spawnattr_destroy(&at);
fail_destroy_fa:
	posix_spawn_file_actions_destroy(&fa);
fail_close_pipe:
	close(pfd[0]);
	close(pfd[1]);
	return -err;
}

static int spawn(struct mts_hooks *h, struct hook_scope *s, const char *cmd,
                 uint32_t previous)
{
	extern char **environ;
	char q[MTS_LOGQ_MAX], qc[MTS_LOGQ_MAX];
	struct hook_run *r = calloc(1, sizeof(*r));
	if (!r)
		return -ENOMEM;
	size_t n = 0, inherited = 0;
	while (environ[inherited])
		inherited++;
	char **env =
	    calloc(inherited + OUR_VARS + mts_figure_count + 1, sizeof(*env));
	char *buf = malloc(4096);
	if (!env || !buf) {
		free(env);
		free(buf);
		free(r);
		return -ENOMEM;
	}
	for (size_t i = 0; i < inherited; i++)
		if (!env_ours(environ[i]))
			env[n++] = environ[i];
	size_t pos = 0, cap = 4096;
	env_add(env, &n, buf, cap, &pos, "MEMTALLY_SCOPE", "%s", s->name);
	env_add(env, &n, buf, cap, &pos, "MEMTALLY_KIND", "%s",
	        s->group ? "group" : "fleet");
	env_add(env, &n, buf, cap, &pos, "MEMTALLY_STATE", "%s",
	        mt_state_name(s->state));
	env_add(env, &n, buf, cap, &pos, "MEMTALLY_PREVIOUS", "%s",
	        mt_state_name(previous));
	for (size_t k = 0; k < mts_figure_count; k++) {
		const struct mts_figure *f = &mts_figure_table[k];
		if (!(f->out & MTS_FIG_HOOKS))
			continue;
		if (f->unit == MTS_FIG_BYTES_PER_S)
			env_add(env, &n, buf, cap, &pos, f->env, "%.0f",
			        mts_figure_f64(&s->fig, f));
		else
			env_add(env, &n, buf, cap, &pos, f->env, "%" PRIu64,
			        mts_figure_u64(&s->fig, f));
	}
	env_add(env, &n, buf, cap, &pos, "MEMTALLY_MEASURE", "%s", s->measure);
	env_add(env, &n, buf, cap, &pos, "MEMTALLY_REASON", "%s", s->reason);
	env_add(env, &n, buf, cap, &pos, "MEMTALLY_NODE", "%s", h->node);
	if (h->socket)
		env_add(env, &n, buf, cap, &pos, "MEMTALLY_SOCKET", "%s",
		        h->socket);
	env[n] = NULL;

	r->h = h;
	r->scope = s;
	r->state = s->state;
	r->previous = previous;
	r->pidfd = -1;
	r->start_ms = uv_now(h->loop);
	int err = start_process(r, cmd, env);
	free(env);
	free(buf);
	if (err < 0) {
		mts_log(MTS_LOG_ERROR, "hook could not be started",
		        "scope=%s state=%s err=%s",
		        mts_logq(q, sizeof(q), s->name),
		        mt_state_name(s->state), strerror(-err));
		free(r);
		return err;
	}
	s->run = r;
	h->running++;
	/* spawn_us: what the start cost the loop. */
	char key[320];
	mts_log_scope(
	    log_key(key, sizeof(key), s), MTS_LOG_INFO, "hook started",
	    "scope=%s state=%s previous=%s pid=%d spawn_us=%llu "
	    "command=%s",
	    mts_logq(q, sizeof(q), s->name), mt_state_name(s->state),
	    mt_state_name(previous), r->pid, (unsigned long long)r->spawn_us,
	    mts_logq(qc, sizeof(qc), cmd));
	return 0;
}

/* Act on the scope's latest state if it is not what was last reported,
 * or if its hook failed and is due again. */
static void maybe_start(struct mts_hooks *h, struct hook_scope *s)
{
	if (s->run || !s->pending) {
		scope_gc(h, s);
		return;
	}
	if (s->state == s->reported && !s->failed) {
		s->pending = false; /* back where the last hook left it */
		scope_gc(h, s);
		return;
	}
	const char *cmd = s->state < 3 ? h->conf.cmd[s->state] : NULL;
	if (!cmd || !cmd[0]) {
		/* Nothing to run for this state: reported all the same. */
		s->reported = s->state;
		s->pending = s->failed = false;
		scope_gc(h, s);
		return;
	}
	uint64_t wait = wait_left(h, s);
	if (wait > 0) {
		interval_arm(h, wait); /* pending stays set */
		return;
	}
	if (h->running >= MTS_HOOKS_MAX_RUNNING) {
		s->queued = true;
		return;
	}
	/* A retry is told what the failed run was told. Any other run is
	 * a new state's first: no failures of its own yet. */
	uint32_t previous = s->reported;
	if (retrying(s)) {
		previous = s->failed_previous;
	} else {
		s->failed = false;
		s->fails = 0;
	}
	s->queued = false;
	s->pending = false;
	s->started = true;
	s->last_start_ms = uv_now(h->loop);
	if (spawn(h, s, cmd, previous) == 0) {
		s->reported = s->state;
		return;
	}
	/* Not started (logged): a failure, run again after [hooks] retry
	 * (never in a loop); without retry, the next change tries again. */
	s->reported = s->state;
	failed(h, s, s->state, previous, "not_started=1");
	if (s->failed)
		interval_arm(h, wait_left(h, s));
	else
		s->pending = false;
	scope_gc(h, s);
}

/* Scopes whose interval has passed: start their hook if one is due,
 * forget them if nothing is left; re-arm for the others. */
static void on_interval(uv_timer_t *t)
{
	struct mts_hooks *h = t->data;
	uint64_t next = 0;
	for (struct hook_scope *s = h->scopes, *n; s; s = n) {
		n = s->next; /* s may be freed */
		uint64_t left = wait_left(h, s);
		if (left > 0) {
			if (!next || left < next)
				next = left;
			continue;
		}
		if (!s->run && !s->queued)
			maybe_start(h, s); /* runs, or collects, it */
	}
	if (next)
		interval_arm(h, next);
}

static void start_queued(struct mts_hooks *h)
{
	struct hook_scope *s = h->scopes;
	while (s && h->running < MTS_HOOKS_MAX_RUNNING) {
		struct hook_scope *next = s->next; /* s may be freed */
		if (s->queued) {
			s->queued = false;
			maybe_start(h, s);
		}
		s = next;
	}
}

void mts_hooks_event(struct mts_hooks *h, const struct mts_event *ev)
{
	if (!h || h->stopping || !h->enabled)
		return;
	bool group;
	const char *name;
	if (strcmp(ev->scope, "fleet") == 0) {
		group = false;
		name = "fleet";
	} else if (strncmp(ev->scope, "group:", 6) == 0) {
		group = true;
		name = ev->scope + 6;
	} else {
		return; /* a process's: not a hook's business */
	}
	struct hook_scope *s = scope_find(h, name, group);
	if (!s) {
		if (ev->state == MTSHM_STATE_OK)
			return; /* untracked means ok, reported */
		s = scope_add(h, name, group);
		if (!s) {
			mts_log(MTS_LOG_ERROR, "hook skipped: out of memory",
			        NULL);
			return;
		}
		if (!h->started_up)
			s->reported = UINT32_MAX; /* "unknown" */
	}
	s->pending = true;
	s->state = ev->state;
	s->fig = ev->figures ? *ev->figures : (struct mts_figures){0};
	snprintf(s->reason, sizeof(s->reason), "%s",
	         ev->reason ? ev->reason : "");
	snprintf(s->measure, sizeof(s->measure), "%s",
	         ev->measure ? ev->measure : "accounted");
	maybe_start(h, s);
}

void mts_hooks_start(struct mts_hooks *h, uint32_t state,
                     const struct mts_figures *fig, const char *measure)
{
	if (!h)
		return;
	h->started_up = true;
	if (h->stopping || !h->enabled)
		return;
	struct hook_scope *s = scope_find(h, "fleet", false);
	if (s && (s->run || s->pending || s->started))
		return; /* an event of the start ran it, or will */
	if (!s && !(s = scope_add(h, "fleet", false))) {
		mts_log(MTS_LOG_ERROR, "hook skipped: out of memory", NULL);
		return;
	}
	s->reported = UINT32_MAX; /* "unknown": what a consumer last heard */
	s->pending = true;
	s->state = state;
	s->fig = *fig;
	snprintf(s->reason, sizeof(s->reason), "%s",
	         "memtallyd started: the fleet's state as it is");
	snprintf(s->measure, sizeof(s->measure), "%s", measure);
	maybe_start(h, s);
}

void mts_hooks_stop(struct mts_hooks *h)
{
	if (!h || h->stopping)
		return;
	h->stopping = true;
	char q[MTS_LOGQ_MAX];
	for (struct hook_scope *s = h->scopes; s; s = s->next) {
		struct hook_run *r = s->run;
		if (!r)
			continue;
		mts_log(MTS_LOG_WARN, "hook still running at stop, killed",
		        "scope=%s state=%s pid=%d",
		        mts_logq(q, sizeof(q), s->name),
		        mt_state_name(r->state), r->pid);
		kill_group(r);
		r->scope = NULL;
		s->run = NULL;
		uv_read_stop((uv_stream_t *)&r->err);
		close_run(r);
		h->running--;
	}
	uv_close((uv_handle_t *)&h->interval, on_interval_closed);
}
