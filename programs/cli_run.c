/*
 * cli_run.c - `memtally run [--bytes SIZE] ... -- CMD [ARGS...]`: make any
 * job runner memtally-aware with one word.
 *
 * The sequence, and why each step is shaped so:
 *
 *  1. The forwarded signals (every one whose default ends a process but
 *     KILL, STOP and the faults: INT, TERM, HUP, QUIT, USR1, USR2, ALRM,
 *     VTALRM, PROF, PWR, XCPU, XFSZ, IO, STKFLT, SYS, TRAP, the real-time
 *     ones) and SIGCHLD
 *     are blocked at once and read from a signalfd, so one poll() loop
 *     serves the wait for room, the command's life and its end, with no
 *     asynchronous handler and no race between a signal and a fork.
 *  2. With --bytes or --kind, Admit{bytes, kind, group, task, ttl} (with
 *     a kind, memtallyd reserves what the kind's recent runs used).
 *     Denied: the reason on stderr, exit 3, the command never started.
 *     With --reservation a scheduler asked already (it admits the next
 *     task that fits and moves on to others when denied, which a blocked
 *     `memtally run` cannot do): no Admit, only the Release at the end.
 *     With --wait, the denial is retried until the deadline: at once
 *     after every Watch event of the fleet or the request's group (a
 *     state change: memory freed, a limit raised), and otherwise at a
 *     slowly growing interval (0.2 s doubling to 2 s, with jitter),
 *     because room can appear without any state change (a task ends while
 *     the fleet stays `high`): the protocol has no event for "bytes went
 *     down". A signal while waiting ends the wait: 128 + N, nothing
 *     started, nothing reserved; it is looked for before every ask, since
 *     a stalled memtallyd makes each ask wait out its whole timeout.
 *  3. The command runs under the preload (LD_PRELOAD of
 *     libmemtally_preload.so, found by find_preload()) with MEMTALLY_TASK
 *     set to the reservation's task, so its workers take the reservation
 *     over as they register and count only what they have not used yet;
 *     MEMTALLY_GROUP (--group) and MEMTALLY_SOCKET (--socket) as given.
 *     It stays in our process group and session, so a terminal and job
 *     control see it as they would without us.
 *  4. Signals we receive are forwarded to the command, except those the
 *     kernel sent (si_code SI_KERNEL: a terminal's ^C, ^\, hangup), which
 *     the command, being in the same foreground process group, already
 *     got. The command has PR_SET_PDEATHSIG = SIGKILL: if we are killed
 *     with SIGKILL (which cannot be forwarded), it goes too, so nothing
 *     runs on outside its reservation; the reservation then ends with its
 *     workers or at its TTL.
 *  5. When the command ends: Release (a reservation its workers already
 *     ended is not an error), and exit with its status, 128 + N for a
 *     signal N. As a PID namespace's first process (a container's
 *     command) we reap every orphan that becomes ours meanwhile.
 *  6. While it runs, a Watch subscription listens for memtallyd's node
 *     guard evicting its task (an event for "task:TASK", written before
 *     the guard's SIGKILL, so it is in our socket by the time the
 *     command's death is). Evicted: the event's reason on stderr and
 *     exit 75 (EX_TEMPFAIL, which job runners take as "try again"), or
 *     with --retry N, admission and the command again, up to N times,
 *     its standard input rewound to where the first run began when it is
 *     a file (a pipe's bytes the first run read are gone: said).
 *     The guard may pause a growing task first (SIGSTOP) and resume it
 *     (SIGCONT); both are said on stderr, and the command goes on. A
 *     command told to stop (INT, TERM, HUP, QUIT) before its eviction is
 *     neither run again nor reported as evicted: we end as the signal
 *     would have ended it.
 *
 * Fail open: when memtallyd cannot be reached, or does not answer in
 * time, the command runs anyway, after one line on stderr saying so.
 * Nothing is ever written to stdout: it belongs to the command.
 */
#define _GNU_SOURCE

#include "cli_run.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <math.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/random.h>
#include <sys/signalfd.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "memtally.h"
#include "memtally_query.h"
#include "mtcommon.h"

#define EXIT_LOCAL  1
#define EXIT_DENIED 3

/* Retries of a denied admission without events: first after this, then
 * doubling up to the maximum; each within +-25% (jitter, so waiters do
 * not all ask at once). */
#define RETRY_FIRST_MS 200
#define RETRY_MAX_MS   2000
/* At most one Admit per this many ms however many events come. */
#define RETRY_MIN_GAP_MS 50
/* A watch lost while the command runs is opened again after this, then
 * doubling up to the maximum (a restart of memtallyd takes a second or
 * two). */
#define WATCH_REOPEN_FIRST_MS 250
#define WATCH_REOPEN_MAX_MS   4000
/* What a reopen may wait for a stalled memtallyd (one that accepts and
 * does not answer): the signals run forwards to the command wait as long
 * (SIGTERM from a job manager, with its kill coming after a grace). */
#define WATCH_REOPEN_TIMEOUT_MS 500

#define PRELOAD_NAME "libmemtally_preload.so"

/* How long a command killed by SIGKILL waits for the node guard's event
 * that would say it was evicted. */
#define EVICTION_WAIT_MS 1000
/* How long an evicted run's leftovers get to die of SIGKILL. */
#define LEFTOVER_WAIT_MS 5000
/* A rerun after an eviction waits this long for room when --wait does not
 * say: the node is coming back, and a denial now is not the job's fault. */
#define RETRY_WAIT_S 60.0

/* Every signal whose default ends a process and that a job runner may
 * send a command (timeout -s, Slurm's --signal, a UPS daemon's PWR): one
 * not forwarded would end us instead, and the command with SIGKILL
 * (PR_SET_PDEATHSIG) rather than the signal, its reservation left to its
 * TTL. */
static const int forwarded[] = {SIGINT,  SIGTERM, SIGHUP,    SIGQUIT,   SIGUSR1,
                                SIGUSR2, SIGALRM, SIGVTALRM, SIGPROF,   SIGPWR,
                                SIGXCPU, SIGXFSZ, SIGIO,     SIGSTKFLT, SIGSYS,
                                SIGTRAP}; /* and SIGRTMIN..SIGRTMAX (not
                                             constants) */

struct run {
	const struct mtcli_run_opts *o;
	const char *where; /* the server, for messages */
	const char *group; /* what Admit and the workers use, or NULL */
	char task[96];     /* "" when no task is set */
	memtally_query *q; /* admission and release; NULL: none */
	memtally_query *w; /* the watch while waiting, or NULL */
	char reservation[64];
	bool failed_open; /* the fail-open line was printed */
	bool lost;        /* memtallyd stopped answering while we waited */
	bool asked;       /* this run asked Admit once already */
	bool no_watch;    /* memtallyd refused our Watch: not asked again */
	bool watch_lost;  /* our Watch's connection ended: open it again */
	int sfd;          /* signalfd */
	sigset_t mask;    /* blocked by us: restored in the command */
	sigset_t old_mask;
	int signo;     /* a signal ended the wait, or 0 */
	double wait_s; /* how long this admission may wait for room */
	bool evicted;  /* the node guard evicted this run's task */
	int died_of;   /* the signal that ended the command, or 0 */
	/* INT, TERM, HUP or QUIT came while the command ran (forwarded, or
	 * the terminal's own): it was told to stop, so an eviction meanwhile
	 * is not run again nor reported as one to retry. */
	int told_to_stop;
	struct sigaction old_chld; /* SIGCHLD as we got it: the command's */
	struct sigaction old_pipe; /* SIGPIPE as we got it: the command's */
	char evicted_why[640];     /* its event's reason, the figures */
	char *added[4]; /* the "NAME=value" strings command_env() made */
	size_t nadded;
	/* stdin as the first run got it: where a seekable one started (else
	 * -1), or a stream (pipe, socket) the first run may have read. */
	off_t stdin_at;
	bool stdin_stream;
};

static int64_t now_ms(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* Say once, on stderr, that the command runs without memtally. */
static void fail_open(struct run *r, const char *what, int err,
                      const char *detail)
{
	char said[512];
	detail = detail ? mtcli_clean(said, sizeof(said), detail) : NULL;
	if (!r->failed_open)
		fprintf(stderr,
		        "memtally: %s %s: %s%s%s%s; running the command "
		        "without admission\n",
		        what, r->where, memtally_strerror(err),
		        detail && detail[0] ? " (" : "", detail ? detail : "",
		        detail && detail[0] ? ")" : "");
	r->failed_open = true;
}

/* A handle whose calls wait at most `timeout_ms` (the library's
 * convention: 0 its default, < 0 for ever). */
static int open_handle_within(const struct run *r, memtally_query **out,
                              int timeout_ms)
{
	const struct mtcli_run_opts *o = r->o;
	int err = o->tcp ? memtally_query_open_tcp(out, o->tcp, timeout_ms)
	                 : memtally_query_open(out, o->socket, timeout_ms);
	if (err == 0 && o->token && o->token[0])
		err = memtally_query_set_token(*out, o->token);
	if (err) {
		memtally_query_close(*out);
		*out = NULL;
	}
	return err;
}

static int open_handle(const struct run *r, memtally_query **out)
{
	return open_handle_within(r, out, r->o->timeout_ms);
}

/* Is `err` a request refused as it stands, by memtallyd (a field it does
 * not take, a token it needs) or by the query library (a token it will
 * not send to whoever listens there)? Not a server that cannot be
 * reached: the command is not run unadmitted on it (exit 2). */
static bool refused(int err)
{
	return err == MEMTALLY_EBADREQUEST || err == MEMTALLY_EPERM ||
	       err == -EACCES;
}

/* A denial, for people, on stderr. */
/* Text the server sent, copied into buf so that it cannot drive the
 * terminal: controls, bidirectional formatting and bytes that are not
 * UTF-8 become '?' (as the CLI's put_clean shows names). A peer over
 * plain TCP is not to be believed about what it prints on our stderr. */
const char *mtcli_clean(char *buf, size_t cap, const char *s)
{
	size_t o = 0;
	const unsigned char *u = (const unsigned char *)(s ? s : "");
	while (*u && o + 4 < cap) {
		uint32_t c = 0;
		size_t k = mt_utf8_seq(u, &c);
		if (k == 0 || mt_cp_hostile(c)) {
			buf[o++] = '?';
		} else {
			memcpy(buf + o, u, k);
			o += k;
		}
		u += k ? k : 1;
	}
	buf[o] = '\0';
	return buf;
}

static void print_denial(const struct memtally_admit_result *a,
                         const char *lead)
{
	char l[16], m[16], rs[16], rq[16], why[640], scope[300];
	fprintf(stderr,
	        "memtally: %s: %s\n"
	        "  limit %s%s%s, measured %s, reserved %s, requested %s\n",
	        lead,
	        a->reason[0] ? mtcli_clean(why, sizeof(why), a->reason)
	                     : "(no reason given)",
	        a->limit ? mt_format_size(l, sizeof(l), a->limit) : "none",
	        a->limit_scope[0] ? " of " : "",
	        mtcli_clean(scope, sizeof(scope), a->limit_scope),
	        mt_format_size(m, sizeof(m), a->fleet_bytes),
	        mt_format_size(rs, sizeof(rs), a->reserved_bytes),
	        mt_format_size(rq, sizeof(rq), a->requested_bytes));
	if (a->sized_by[0] && strcmp(a->sized_by, "declared") != 0)
		fprintf(stderr, "  requested as %s\n",
		        mtcli_clean(why, sizeof(why), a->sized_by));
}

/* Did memtallyd close the connection before any answer, or was it not
 * there to connect to (a restart)? Then nothing was granted. A timeout
 * is not one: the server may have granted what it did not answer. */
static bool dropped(int err)
{
	return err == -ECONNRESET || err == -EPIPE || err == -ECONNABORTED ||
	       err == -ECONNREFUSED || err == -ENOENT;
}

/*
 * One Admit. 1 granted (r->reservation set), 0 denied (*denied holds the
 * answer, the caller frees it), < 0 no answer: the caller fails open
 * (said on stderr when `say_open`).
 */
static int ask(struct run *r, struct memtally_admit_result **denied,
               bool say_open)
{
	const struct mtcli_run_opts *o = r->o;
	struct memtally_admit_req rq = {
	    .bytes = o->bytes,
	    .group = r->group,
	    .task = r->task,
	    .ttl_seconds = o->ttl_s ? o->ttl_s : MTCLI_RUN_DEFAULT_TTL_S,
	    /* Every ask after this run's first repeats it: one that went
	     * unanswered (a stalled memtallyd reads it later, with the
	     * others, in any order) may have been granted since, and that
	     * grant is the answer, not a second one. */
	    .flags = (r->asked ? MEMTALLY_ADMIT_AGAIN : 0) |
	             MEMTALLY_ADMIT_UNTIL_RELEASE,
	    .kind = o->kind,
	};
	struct memtally_admit_result *a = NULL;
	int err = memtally_query_admit(r->q, &rq, &a);
	r->asked = true;
	/* memtallyd answered that the request is not one it takes: not a
	 * server that cannot be reached, so not a reason to run unadmitted
	 * (admission() says it and exits 2). */
	if (err && !refused(err)) {
		if (say_open)
			fail_open(r, "cannot ask for admission at", err,
			          memtally_query_last_error(r->q));
		return err;
	}
	if (err)
		return err;
	if (a->admitted) {
		snprintf(r->reservation, sizeof(r->reservation), "%s",
		         a->reservation);
		memtally_admit_result_free(a);
		return 1;
	}
	*denied = a;
	return 0;
}

/* A denial no room that frees can change: a group the user may not use,
 * a kind past their kinds cap, or more asked than the limit that denied
 * it (the fleet's, a group's, the node guard's line, what one uid may
 * hold reserved), whose use by others can at best fall to nothing, as
 * the Python client's never_fits says. --wait does not wait for it. */
static bool denied_for_good(const struct memtally_admit_result *a)
{
	if (!a || !a->denied_by)
		return false;
	if (strcmp(a->denied_by, "group_not_allowed") == 0 ||
	    strcmp(a->denied_by, "kinds") == 0)
		return true;
	const char *s = a->limit_scope ? a->limit_scope : "";
	return a->limit && a->requested_bytes > a->limit &&
	       (strcmp(s, "fleet") == 0 || strncmp(s, "group:", 6) == 0 ||
	        strcmp(s, "node") == 0 || strncmp(s, "uid:", 4) == 0 ||
	        strcmp(s, "tcp") == 0);
}

/* Is `ev` about a scope whose change may make room for us? */
static bool relevant(const struct run *r, const struct memtally_event *ev)
{
	if (strcmp(ev->scope, "fleet") == 0)
		return true;
	const char *g = r->group && r->group[0] ? r->group : "default";
	return strncmp(ev->scope, "group:", 6) == 0 &&
	       strcmp(ev->scope + 6, g) == 0;
}

/* The node guard's events for our task: OVER, it evicted the command;
 * HIGH, it paused it (SIGSTOP) while the node is past its line; OK, it
 * resumed it. A pause and a resume are only said on stderr: the command
 * goes on. */
static void note_eviction(struct run *r, const struct memtally_event *ev)
{
	if (!r->task[0] || strncmp(ev->scope, "task:", 5) != 0 ||
	    strcmp(ev->scope + 5, r->task) != 0)
		return;
	char why[640];
	if (ev->state != MEMTALLY_STATE_OVER) {
		fprintf(stderr, "memtally: %s\n",
		        ev->reason && ev->reason[0]
		            ? mtcli_clean(why, sizeof(why), ev->reason)
		        : ev->state == MEMTALLY_STATE_HIGH
		            ? "paused by memtallyd"
		            : "resumed by memtallyd");
		return;
	}
	r->evicted = true;
	mtcli_clean(r->evicted_why, sizeof(r->evicted_why),
	            ev->reason && ev->reason[0] ? ev->reason
	                                        : "evicted by memtallyd");
}

/* Subscribe to Watch on a second connection; without one (an old server,
 * a refusal) the periodic retries still run. */
/* Is `err` the server's error answer (not a lost connection)? */
static bool server_answer(int err)
{
	return err == MEMTALLY_ESERVER || err == MEMTALLY_ENOTFOUND ||
	       err == MEMTALLY_EPERM || err == MEMTALLY_ENOSLOTS ||
	       err == MEMTALLY_EUNSUPPORTED || err == MEMTALLY_EBADREQUEST;
}

static void watch_open(struct run *r, bool brief)
{
	if (r->no_watch)
		return;
	int timeout = r->o->timeout_ms;
	if (brief && (timeout <= 0 || timeout > WATCH_REOPEN_TIMEOUT_MS))
		timeout = WATCH_REOPEN_TIMEOUT_MS;
	int err = open_handle_within(r, &r->w, timeout);
	if (err == 0) {
		/* Run by root (a container's jobs often are), it would see
		 * every uid's "task:NAME": another's task of our name is not
		 * ours. */
		memtally_query_watch_own(r->w, 1);
		err = memtally_query_watch_start(r->w);
		if (err) {
			memtally_query_close(r->w);
			r->w = NULL;
		}
	}
	/* Refused: asking again would be refused again. Unreachable (a
	 * run started while memtallyd restarts, failing open): its workers
	 * register once it is back, and its guard may evict them, so
	 * supervise() asks again with back-off, or the eviction would go
	 * unheard (no message, no --retry). */
	if (err && (server_answer(err) || err == -EACCES))
		r->no_watch = true;
	else if (err)
		r->watch_lost = true;
}

/* Read what the watch holds: true if an event worth a retry came. Ends
 * the watch (and frees it) when its stream ends. */
static bool watch_drain(struct run *r)
{
	bool any = false;
	for (;;) {
		struct memtally_event ev;
		int err = memtally_query_watch_next(r->w, &ev);
		if (err == 0) {
			note_eviction(r, &ev);
			any |= relevant(r, &ev);
			continue;
		}
		if (err != -EAGAIN) {
			memtally_query_close(r->w);
			r->w = NULL;
			if (server_answer(err)) {
				/* An answer, not a lost connection: asking
				 * again would be refused again. */
				r->no_watch = true;
				fprintf(
				    stderr,
				    "memtally: memtallyd at %s refused a "
				    "watch (%s): an eviction of the command "
				    "will not be told apart from its own "
				    "failure\n",
				    r->where, memtally_strerror(err));
				return any;
			}
			/* The server may have restarted: ask again now, and
			 * subscribe again with that answer. */
			r->watch_lost = true;
			any = true;
		}
		return any;
	}
}

/* The next periodic retry interval (doubling *base up to max), with
 * jitter. */
static int next_interval(int *base, int max)
{
	*base = *base * 2 > max ? max : *base * 2;
	uint32_t rnd = 0;
	if (getrandom(&rnd, sizeof(rnd), GRND_NONBLOCK) != sizeof(rnd))
		rnd = (uint32_t)getpid() * 2654435761u;
	return *base * 3 / 4 + (int)(rnd % (uint32_t)(*base / 2 + 1));
}

/* A signal (other than SIGCHLD) waiting on the signalfd: r->signo set. */
static bool signalled(struct run *r)
{
	struct pollfd p = {.fd = r->sfd, .events = POLLIN};
	struct signalfd_siginfo si;
	while (poll(&p, 1, 0) == 1 &&
	       read(r->sfd, &si, sizeof(si)) == (ssize_t)sizeof(si))
		if (si.ssi_signo != SIGCHLD) {
			r->signo = (int)si.ssi_signo;
			return true;
		}
	return false;
}

/*
 * Wait until Admit grants, the deadline passes or a signal comes.
 * Returns 1 granted, 0 still denied at the deadline (*denied: the last
 * answer), < 0 no answer (fail open), or 2 when a signal ended the wait
 * (r->signo).
 */
static int wait_for_room(struct run *r, struct memtally_admit_result **denied)
{
	int64_t start = now_ms();
	int64_t end = start + (int64_t)(r->wait_s * 1000.0 + 0.5);
	/* --poll lowers the ceiling (a fleet of short tasks, where room
	 * appears every second without a state change). */
	int max = r->o->poll_s > 0 ? (int)(r->o->poll_s * 1000.0 + 0.5)
	                           : RETRY_MAX_MS;
	int base = RETRY_FIRST_MS < max ? RETRY_FIRST_MS : max;
	int64_t next = start + base;
	int64_t last_ask = start;
	if (*denied)
		fprintf(stderr, "memtally: waiting up to %g s for room: %s\n",
		        r->wait_s,
		        mtcli_clean((char[640]){0}, 640, (*denied)->reason));
	else
		fprintf(stderr,
		        "memtally: memtallyd at %s dropped the connection "
		        "(its cap on one user's connections, or a restart); "
		        "asking again for up to %g s\n",
		        r->where, r->wait_s);
	watch_open(r, false);
	for (;;) {
		int64_t now = now_ms();
		bool retry = now >= next || now >= end;
		if (!retry) {
			int64_t until = next < end ? next : end;
			struct pollfd p[2] = {
			    {.fd = r->sfd, .events = POLLIN},
			    {.fd = r->w ? memtally_query_fd(r->w) : -1,
			     .events = POLLIN},
			};
			int n = poll(p, 2, (int)(until - now));
			if (n < 0 && errno != EINTR)
				return -errno;
			if (n > 0 && (p[0].revents & POLLIN)) {
				struct signalfd_siginfo si;
				if (read(r->sfd, &si, sizeof(si)) ==
				        (ssize_t)sizeof(si) &&
				    si.ssi_signo != SIGCHLD) {
					r->signo = (int)si.ssi_signo;
					return 2;
				}
			}
			if (n > 0 && p[1].revents && r->w && watch_drain(r)) {
				/* Ask now, but not more often than the gap
				 * however many events come. */
				int64_t soon = last_ask + RETRY_MIN_GAP_MS;
				if (soon < next)
					next = soon;
			}
			continue;
		}
		/* A signal that came meanwhile ends the wait before another
		 * ask: with memtallyd stalled, each ask takes its whole
		 * timeout and the next is due at once. */
		if (signalled(r))
			return 2;
		memtally_admit_result_free(*denied);
		*denied = NULL;
		last_ask = now_ms();
		int got = ask(r, denied, false);
		if (got > 0)
			return got;
		if (got < 0) {
			/* A server that said "no room" and then stopped
			 * answering is most likely restarting: failing open
			 * now would start every waiter on the node at once,
			 * unadmitted. Asked again (the handle reconnects)
			 * until the wait ends; only then is it missing. */
			if (last_ask >= end) {
				fail_open(r, "no answer from memtallyd at", got,
				          "while the command waited for room");
				return got;
			}
			if (!r->lost)
				fprintf(stderr,
				        "memtally: memtallyd at %s stopped "
				        "answering (%s); asking again until "
				        "the wait ends\n",
				        r->where, memtally_strerror(got));
			r->lost = true;
			/* From the end of the ask: it waited out its timeout,
			 * and the next one is not due before the interval. */
			next = now_ms() + next_interval(&base, max);
			continue;
		}
		if (r->lost)
			fprintf(stderr,
			        "memtally: memtallyd at %s answers "
			        "again\n",
			        r->where);
		r->lost = false;
		/* Answered at last (the wait began on a dropped connection)
		 * with a denial waiting cannot change: said at once. */
		if (last_ask >= end || denied_for_good(*denied))
			return 0;
		if (!r->w)
			watch_open(r, false);
		next = last_ask + next_interval(&base, max);
	}
}

/* Does buf[0..cap) name a readable file? Then make it canonical
 * ("bin/../lib" -> "lib": LD_PRELOAD is shown in ps and logs). */
static bool usable(char *buf, size_t cap, int n)
{
	if (n < 0 || (size_t)n >= cap || access(buf, R_OK) != 0)
		return false;
	char real[PATH_MAX];
	if (realpath(buf, real) && strlen(real) < cap)
		strcpy(buf, real);
	return true;
}

/*
 * The preload library: $MEMTALLY_PRELOAD_LIB when set ("" = none), else
 * the first that exists of: next to this executable, in the client/
 * folder beside its own (a build tree: programs/ and client/), the
 * library directory relative to it (an installation, moved or not), the
 * library directory it was configured for. NULL when none is found.
 */
static const char *find_preload(char *buf, size_t cap)
{
	const char *env = getenv("MEMTALLY_PRELOAD_LIB");
	if (env)
		return env;
	char exe[PATH_MAX];
	ssize_t n = readlink("/proc/self/exe", exe, sizeof(exe) - 1);
	char *slash = n > 0 ? (exe[n] = '\0', strrchr(exe, '/')) : NULL;
	if (slash) {
		*slash = '\0';
		if (usable(buf, cap,
		           snprintf(buf, cap, "%s/%s", exe, PRELOAD_NAME)) ||
		    usable(buf, cap,
		           snprintf(buf, cap, "%s/../client/%s", exe,
		                    PRELOAD_NAME)) ||
		    usable(buf, cap,
		           snprintf(buf, cap, "%s/%s/%s", exe,
		                    MEMTALLY_RUN_LIBDIR_REL, PRELOAD_NAME)))
			return buf;
	}
	if (usable(
	        buf, cap,
	        snprintf(buf, cap, "%s/%s", MEMTALLY_RUN_LIBDIR, PRELOAD_NAME)))
		return buf;
	return NULL;
}

/* Is `lib` (a path) already one of the entries of LD_PRELOAD `list`? */
static bool preload_has(const char *list, const char *lib)
{
	size_t n = strlen(lib);
	for (const char *p = list; *p;) {
		size_t len = strcspn(p, ": ");
		if (len == n && strncmp(p, lib, n) == 0)
			return true;
		p += len;
		p += strspn(p, ": ");
	}
	return false;
}

/* Set name=value in the command's environment (*envp, *n entries, a
 * malloc'd copy of ours); the new string is kept in r->added. */
static int env_set(struct run *r, char ***envp, size_t *n, const char *name,
                   const char *value)
{
	size_t nl = strlen(name);
	char *kv;
	if (r->nadded == sizeof(r->added) / sizeof(r->added[0]) ||
	    asprintf(&kv, "%s=%s", name, value) < 0)
		return -ENOMEM;
	r->added[r->nadded++] = kv;
	for (size_t i = 0; i < *n; i++) {
		if (strncmp((*envp)[i], name, nl) == 0 &&
		    (*envp)[i][nl] == '=') {
			(*envp)[i] = kv; /* the old string is environ's */
			return 0;
		}
	}
	char **e = realloc(*envp, (*n + 2) * sizeof(*e));
	if (!e)
		return -ENOMEM;
	e[(*n)++] = kv;
	e[*n] = NULL;
	*envp = e;
	return 0;
}

/*
 * The command's environment: ours, with the preload added in front of
 * LD_PRELOAD and MEMTALLY_TASK / GROUP / SOCKET set, MEMTALLY_TOKEN gone. The
 * array is malloc'd; the strings added are in r->added (free_env()).
 */
static char **command_env(struct run *r)
{
	extern char **environ;
	size_t n = 0;
	while (environ[n])
		n++;
	char **e = malloc((n + 1) * sizeof(*e));
	if (!e)
		return NULL;
	/* Without MEMTALLY_TOKEN: it gives admin rights (release or limit
	 * anyone's), and whoever set it for us did not hand them to the job
	 * we wrap, which may be anyone's code. */
	size_t k = 0;
	for (size_t i = 0; i < n; i++)
		if (strncmp(environ[i], "MEMTALLY_TOKEN=", 15) != 0)
			e[k++] = environ[i];
	e[k] = NULL;
	n = k;
	char buf[PATH_MAX];
	const char *lib = find_preload(buf, sizeof(buf));
	if (!lib)
		fprintf(stderr,
		        "memtally: %s not found next to memtally or in %s "
		        "(set MEMTALLY_PRELOAD_LIB); the command's memory is "
		        "not counted\n",
		        PRELOAD_NAME, MEMTALLY_RUN_LIBDIR);
	int err = 0;
	if (lib && lib[0]) {
		const char *old = getenv("LD_PRELOAD");
		if (!old || !old[0]) {
			err = env_set(r, &e, &n, "LD_PRELOAD", lib);
		} else if (!preload_has(old, lib)) {
			char *v;
			if (asprintf(&v, "%s:%s", lib, old) < 0) {
				err = -ENOMEM;
			} else {
				err = env_set(r, &e, &n, "LD_PRELOAD", v);
				free(v);
			}
		}
	}
	if (!err && r->task[0])
		err = env_set(r, &e, &n, "MEMTALLY_TASK", r->task);
	if (!err && r->o->group)
		err = env_set(r, &e, &n, "MEMTALLY_GROUP", r->o->group);
	/* Workers take only an absolute path (a relative one would be looked
	 * up from wherever they are when they register): a relative socket,
	 * --socket or the MEMTALLY_SOCKET we inherited, is the one under our
	 * directory now. */
	const char *sock =
	    r->o->socket_given ? r->o->socket : getenv("MEMTALLY_SOCKET");
	if (!err && sock && sock[0] && (r->o->socket_given || sock[0] != '/')) {
		char *abs = NULL, cwd[4096];
		if (sock[0] != '/' && getcwd(cwd, sizeof(cwd)) &&
		    asprintf(&abs, "%s/%s", cwd, sock) < 0)
			abs = NULL;
		err = env_set(r, &e, &n, "MEMTALLY_SOCKET", abs ? abs : sock);
		free(abs);
	}
	if (err) {
		free(e);
		return NULL;
	}
	return e;
}

static void free_env(struct run *r, char **envp)
{
	free(envp);
	for (size_t i = 0; i < r->nadded; i++)
		free(r->added[i]);
	r->nadded = 0;
}

/* In the child: restore the signal mask, die with our parent, exec. */
static _Noreturn void exec_command(struct run *r, char **envp, pid_t parent)
{
	/* Dispositions are left as we got them: a command started by a
	 * shell with SIGINT ignored (`memtally run ... &`) keeps it so. */
	sigaction(SIGCHLD, &r->old_chld, NULL);
	sigaction(SIGPIPE, &r->old_pipe, NULL);
	sigprocmask(SIG_SETMASK, &r->old_mask, NULL);
	/* If we are killed with SIGKILL, which cannot be forwarded, the
	 * command goes too. Our parent may have died before the prctl: then
	 * the signal would never come. */
	if (prctl(PR_SET_PDEATHSIG, SIGKILL) < 0 || getppid() != parent)
		_exit(128 + SIGKILL);
	execvpe(r->o->argv[0], r->o->argv, envp);
	int e = errno;
	fprintf(stderr, "memtally: cannot run '%s': %s\n", r->o->argv[0],
	        strerror(e));
	_exit(e == ENOENT ? MTCLI_RUN_EXIT_NOTFOUND : MTCLI_RUN_EXIT_NOEXEC);
}

/*
 * The command died of SIGKILL: was it the node guard? memtallyd writes
 * its event before it signals, so the event is normally in our socket
 * already; it is waited for a little (EVICTION_WAIT_MS) in case the
 * server's output was queued behind others'.
 */
static void await_eviction(struct run *r)
{
	int64_t end = now_ms() + EVICTION_WAIT_MS;
	while (r->w && !r->evicted) {
		watch_drain(r);
		int64_t left = end - now_ms();
		if (r->evicted || !r->w || left <= 0)
			break;
		struct pollfd p = {.fd = memtally_query_fd(r->w),
		                   .events = POLLIN};
		if (poll(&p, 1, (int)left) == 0)
			break;
	}
}

/* The processes whose parent we are, up to `cap`: the command's leftovers,
 * re-parented to us (a subreaper) as their parents ended. */
static size_t our_children(pid_t *out, size_t cap)
{
	DIR *d = opendir("/proc");
	if (!d)
		return 0;
	pid_t me = getpid();
	size_t n = 0;
	struct dirent *e;
	while (n < cap && (e = readdir(d))) {
		char *end;
		long pid = strtol(e->d_name, &end, 10);
		if (*end || pid <= 0)
			continue;
		char path[64], buf[512];
		snprintf(path, sizeof(path), "/proc/%ld/stat", pid);
		int fd = open(path, O_RDONLY | O_CLOEXEC);
		if (fd < 0)
			continue;
		ssize_t len = read(fd, buf, sizeof(buf) - 1);
		close(fd);
		if (len <= 0)
			continue;
		buf[len] = '\0';
		/* "pid (comm) S ppid": the comm may hold spaces and ')'. */
		const char *rp = strrchr(buf, ')');
		char state;
		int ppid;
		if (rp && sscanf(rp + 1, " %c %d", &state, &ppid) == 2 &&
		    ppid == me)
			out[n++] = (pid_t)pid;
	}
	closedir(d);
	return n;
}

/*
 * An evicted run ends whole. What its command left running (a shell's
 * background job, a daemon it started, a child that never registered)
 * would hold its memory beside the rerun, or beside the runner's requeue
 * of it, outside any reservation. We are their subreaper: they are our
 * children now, killed and reaped round after round (a killed one's own
 * children become ours in turn) until none is left, for at most
 * LEFTOVER_WAIT_MS (one in uninterruptible sleep may outlast it).
 */
static void end_leftovers(void)
{
	int64_t end = now_ms() + LEFTOVER_WAIT_MS;
	size_t killed = 0;
	for (;;) {
		pid_t kids[256];
		size_t n = our_children(kids, sizeof(kids) / sizeof(kids[0]));
		for (size_t i = 0; i < n; i++)
			if (kill(kids[i], SIGKILL) == 0)
				killed++;
		pid_t w;
		while ((w = waitpid(-1, NULL, WNOHANG)) > 0)
			;
		if (w < 0 || now_ms() >= end)
			break; /* ECHILD: nothing of the run is left */
		poll(NULL, 0, 5);
	}
	if (killed)
		fprintf(stderr, "memtally: ended what the evicted command left "
		                "running\n");
}

/* Run the command to its end, forwarding signals. Its exit status, as a
 * shell reports it. */
static int supervise(struct run *r, char **envp)
{
	/* A signal that came while we asked for room or started the watch
	 * (^C, a runner's TERM): the command is not started only to be
	 * killed, or worse, started after the user gave up on it. */
	if (signalled(r)) {
		r->died_of = r->signo;
		return 128 + r->signo;
	}
	pid_t parent = getpid();
	/* What the command leaves behind as it ends becomes ours, not
	 * init's: an eviction can then end it too (end_leftovers()). Not
	 * inherited by the command. */
	(void)prctl(PR_SET_CHILD_SUBREAPER, 1);
	fflush(NULL);
	pid_t pid = fork();
	if (pid < 0) {
		fprintf(stderr, "memtally: cannot fork: %s\n", strerror(errno));
		return EXIT_LOCAL;
	}
	if (pid == 0)
		exec_command(r, envp, parent);
	/* A watch lost while the command runs (memtallyd restarted) is
	 * opened again, so that an eviction after the restart is still
	 * told apart from the command's own death. At a time of its own
	 * (`reopen_at`): a poll's timeout starts again at each wake-up, and
	 * signals coming more often than it (SIGCHLD of orphans we reap)
	 * put a reopen off for ever. */
	int reopen_ms = WATCH_REOPEN_FIRST_MS;
	int64_t reopen_at = -1; /* when the lost watch is opened again */
	/* The command's orphans are ours (a subreaper; as a container's
	 * first process, the whole container's): reaped as they come, as a
	 * shell or an init would, or each stays a zombie. */
	for (;;) {
		int status;
		pid_t w = waitpid(-1, &status, WNOHANG);
		if (w > 0 && w != pid)
			continue;
		if (w == pid) {
			if (WIFEXITED(status)) {
				/* A worker of it evicted, the command (a
				 * shell, make) ending on that: the event,
				 * written before the kill, is in our socket. */
				if (WEXITSTATUS(status) == 128 + SIGKILL)
					await_eviction(r); /* a shell's child */
				else if (WEXITSTATUS(status) && r->w)
					watch_drain(r);
				return WEXITSTATUS(status);
			}
			if (WIFSIGNALED(status)) {
				if (WTERMSIG(status) == SIGKILL)
					await_eviction(r);
				r->died_of = WTERMSIG(status);
				return 128 + WTERMSIG(status);
			}
			continue;
		}
		if (w < 0 && errno != EINTR) {
			fprintf(stderr, "memtally: waitpid: %s\n",
			        strerror(errno));
			return EXIT_LOCAL;
		}
		struct pollfd p[2] = {
		    {.fd = r->sfd, .events = POLLIN},
		    {.fd = r->w ? memtally_query_fd(r->w) : -1,
		     .events = POLLIN},
		};
		bool reopen = !r->w && r->watch_lost && !r->no_watch;
		int64_t now = now_ms();
		if (!reopen)
			reopen_at = -1;
		else if (reopen_at < 0)
			reopen_at = now + reopen_ms;
		if (reopen && now >= reopen_at) {
			watch_open(r, true);
			if (r->w) {
				r->watch_lost = false;
				reopen_ms = WATCH_REOPEN_FIRST_MS;
			} else if (reopen_ms < WATCH_REOPEN_MAX_MS) {
				reopen_ms *= 2;
			}
			reopen_at = -1;
			continue;
		}
		int ready = poll(p, 2, reopen ? (int)(reopen_at - now) : -1);
		if (ready <= 0)
			continue; /* EINTR */
		if (p[1].revents && r->w)
			watch_drain(r);
		if (!(p[0].revents & POLLIN))
			continue;
		struct signalfd_siginfo si;
		ssize_t n = read(r->sfd, &si, sizeof(si));
		if (n != (ssize_t)sizeof(si))
			continue; /* EINTR */
		if (si.ssi_signo == SIGCHLD)
			continue;
		if (si.ssi_signo == SIGINT || si.ssi_signo == SIGTERM ||
		    si.ssi_signo == SIGHUP || si.ssi_signo == SIGQUIT)
			r->told_to_stop = (int)si.ssi_signo;
		/* The terminal signalled the whole foreground process
		 * group, the command included; but a hangup goes to the
		 * session's leader alone, which we are when a shell exec'd
		 * us as a session's command (ssh -t host 'memtally run'). */
		if (si.ssi_code == SI_KERNEL &&
		    !(si.ssi_signo == SIGHUP && getsid(0) == getpid()))
			continue;
		kill(pid, (int)si.ssi_signo);
	}
}

/* Release the reservation the command ran under, on a connection of its
 * own (see the loop in mtcli_run). */
static void release(struct run *r)
{
	if (!r->reservation[0])
		return;
	int err = r->q ? 0 : open_handle(r, &r->q);
	if (err) {
		fprintf(stderr,
		        "memtally: cannot release reservation %s: cannot reach "
		        "memtallyd at %s: %s (it ends at its TTL, or with its "
		        "workers)\n",
		        r->reservation, r->where, memtally_strerror(err));
		return;
	}
	err = memtally_query_release(r->q, r->reservation, NULL);
	/* Its workers' exit may have ended it already. */
	if (err && err != MEMTALLY_ENOTFOUND)
		fprintf(stderr,
		        "memtally: cannot release reservation %s at %s: %s%s%s "
		        "(it ends at its TTL)\n",
		        r->reservation, r->where, memtally_strerror(err),
		        memtally_query_last_error(r->q)[0] ? ": " : "",
		        memtally_query_last_error(r->q));
}

/* One the caller ignores (nohup's SIGHUP, SIGINT for a job a shell
 * started with &) stays ignored, by us and the command: blocked, it would
 * reach the signalfd and end the wait, or the run before the command
 * starts. */
static void forward(struct run *r, int sig)
{
	struct sigaction cur;
	if (sigaction(sig, NULL, &cur) == 0 && cur.sa_handler == SIG_IGN)
		return;
	sigaddset(&r->mask, sig);
}

static int block_signals(struct run *r)
{
	sigemptyset(&r->mask);
	for (size_t i = 0; i < sizeof(forwarded) / sizeof(forwarded[0]); i++)
		forward(r, forwarded[i]);
	for (int sig = SIGRTMIN; sig <= SIGRTMAX; sig++)
		forward(r, sig);
	sigaddset(&r->mask, SIGCHLD);
	if (sigprocmask(SIG_BLOCK, &r->mask, &r->old_mask) < 0)
		return -errno;
	/* Inherited ignored, SIGCHLD would reap the command for us and
	 * never reach the signalfd: ours is the default while we run, the
	 * command gets what we got. */
	struct sigaction dfl = {.sa_handler = SIG_DFL};
	if (sigaction(SIGCHLD, &dfl, &r->old_chld) < 0)
		return -errno;
	/* A stderr whose reader has gone (a closed pipe) must not end us on
	 * a line we print (fail open, paused by the guard): our death would
	 * end the command (PDEATHSIG), a pause would become a kill. The
	 * write fails with EPIPE instead; the command gets what we got. */
	struct sigaction ign = {.sa_handler = SIG_IGN};
	if (sigaction(SIGPIPE, &ign, &r->old_pipe) < 0)
		return -errno;
	r->sfd = signalfd(-1, &r->mask, SFD_CLOEXEC);
	return r->sfd < 0 ? -errno : 0;
}

/* A scheduler admitted the task already (--reservation): no Admit, one
 * connection for the eviction watch's sake and the Release at the end.
 * 1, the command runs, unless memtallyd says it holds no such reservation
 * (a stale or mistyped id: run, the command would hold memory no one set
 * aside; EXIT_DENIED) or holds it for another task (its workers would
 * never take it over, and its Release at the end would free another
 * task's room: 2). Unreachable, or a server that cannot say, the command
 * runs (fail open); its reservation ends with its workers or at its TTL. */
static int adopt(struct run *r)
{
	snprintf(r->reservation, sizeof(r->reservation), "%s",
	         r->o->reservation);
	int err = open_handle(r, &r->q);
	if (err) {
		fprintf(stderr,
		        "memtally: cannot reach memtallyd at %s: %s; running "
		        "the command, reservation %s ends at its TTL\n",
		        r->where, memtally_strerror(err), r->reservation);
		r->failed_open = true;
		return 1;
	}
	struct memtally_reservation info;
	err = memtally_query_reservation(r->q, r->reservation, &info);
	if (err == MEMTALLY_ENOTFOUND) {
		fprintf(stderr,
		        "memtally: memtallyd at %s holds no reservation %s "
		        "(released, expired or never granted); not running "
		        "the command\n",
		        r->where, r->reservation);
		r->reservation[0] = '\0';
		return EXIT_DENIED;
	}
	if (err == MEMTALLY_EPERM) {
		/* Another user's: its workers could not take it over, and
		 * would be counted beside it, twice. */
		fprintf(
		    stderr,
		    "memtally: reservation %s is not yours (memtallyd at %s "
		    "will not show it): the command's workers could not take "
		    "it over; not running the command\n",
		    r->reservation, r->where);
		r->reservation[0] = '\0';
		return 2;
	}
	if (err == 0 && info.task[0] && strcmp(info.task, r->task) != 0) {
		char want[160], have[160];
		fprintf(stderr,
		        "memtally: reservation %s was granted for task \"%s\", "
		        "not \"%s\": give --task the task it was admitted "
		        "for\n",
		        r->reservation,
		        mtcli_clean(have, sizeof(have), info.task),
		        mtcli_clean(want, sizeof(want), r->task));
		r->reservation[0] = '\0';
		return 2;
	}
	return 1;
}

/* Admission per the options: 1 run the command (granted, not asked, or
 * failing open), else the exit status to return at once. */
static int admission(struct run *r)
{
	if (!r->o->bytes && !r->o->kind)
		return 1;
	/* A retry asks again on a connection of its own. */
	memtally_query_close(r->q);
	r->q = NULL;
	int err = open_handle(r, &r->q);
	if (err) {
		fail_open(r, "cannot reach memtallyd at", err,
		          err == -ENOENT || err == -ECONNREFUSED
		              ? "is it running?"
		              : NULL);
		return 1;
	}
	struct memtally_admit_result *a = NULL;
	int got = ask(r, &a, r->wait_s <= 0);
	if (refused(got)) {
		char why[640];
		fprintf(stderr,
		        "memtally: the request to memtallyd at %s was refused: "
		        "%s; not run\n",
		        r->where,
		        mtcli_clean(why, sizeof(why),
		                    memtally_query_last_error(r->q)));
		return 2;
	}
	/* Connected, then dropped before an answer: memtallyd is there but
	 * closed us (the uid's max_connections_per_uid, taken by its other
	 * runs, or a restart). With --wait that is waited out as no room
	 * is: failing open at once would start every run past the cap
	 * unadmitted. (An error memtallyd answered is not waited on.) */
	bool waited = false;
	if (got < 0 && r->wait_s > 0) {
		if (dropped(got)) {
			got = wait_for_room(r, &a);
			waited = true;
		} else {
			fail_open(r, "cannot ask for admission at", got,
			          memtally_query_last_error(r->q));
		}
	}
	bool for_ever = got == 0 && denied_for_good(a);
	if (got == 0 && r->wait_s > 0 && !for_ever && !waited)
		got = wait_for_room(r, &a);
	if (got == 2) {
		/* ^C while waiting: we die of it below, as the command
		 * would have, so that a shell's loop stops. */
		memtally_admit_result_free(a);
		r->died_of = r->signo;
		return 128 + r->signo;
	}
	if (got < 0 && !r->failed_open) {
		/* The wait itself failed (poll): run, and say so. */
		fprintf(stderr,
		        "memtally: waiting for room failed: %s; running the "
		        "command without a reservation\n",
		        strerror(-got));
		memtally_admit_result_free(a);
		r->failed_open = true;
		return 1;
	}
	if (got != 0) /* granted, or failing open */
		return 1;
	print_denial(a, r->wait_s > 0 && !for_ever ? "no room in time, not run"
	                                           : "denied, not run");
	memtally_admit_result_free(a);
	return EXIT_DENIED;
}

int mtcli_run(const struct mtcli_run_opts *o)
{
	struct run r = {.o = o, .sfd = -1};
	r.where = o->tcp ? o->tcp : o->socket;
	r.group = o->group;
	if (!r.group) {
		const char *g = getenv("MEMTALLY_GROUP");
		r.group = g && g[0] ? g : NULL;
	}
	if (o->task) {
		snprintf(r.task, sizeof(r.task), "%s", o->task);
	} else {
		/* A name of our own: the reservation must be reconciled by
		 * this command's workers only, and the node guard evicts
		 * them together, as one task, by this name. */
		uint32_t rnd = 0;
		if (getrandom(&rnd, sizeof(rnd), GRND_NONBLOCK) != sizeof(rnd))
			rnd = (uint32_t)now_ms();
		snprintf(r.task, sizeof(r.task), "run-%d-%08" PRIx32,
		         (int)getpid(), rnd);
	}
	int err = block_signals(&r);
	if (err) {
		fprintf(stderr, "memtally: cannot set up signals: %s\n",
		        strerror(-err));
		return EXIT_LOCAL;
	}
	r.wait_s = o->wait_s;
	struct stat in;
	r.stdin_at = -1;
	if (fstat(STDIN_FILENO, &in) == 0) {
		if (S_ISREG(in.st_mode) || S_ISBLK(in.st_mode))
			r.stdin_at = lseek(STDIN_FILENO, 0, SEEK_CUR);
		r.stdin_stream = S_ISFIFO(in.st_mode) || S_ISSOCK(in.st_mode);
	}
	int rc;
	for (uint32_t run = 0;; run++) {
		rc = run == 0 && o->reservation ? adopt(&r) : admission(&r);
		memtally_query_close(r.w);
		r.w = NULL;
		/* Admission's connection is not kept while the command runs:
		 * with the watch, each run held two of its uid's
		 * max_connections_per_uid, and 64 runs of one user at once
		 * (xargs -P, srun -n) had the next ones run unadmitted and
		 * their workers unregistered. The release opens its own. */
		memtally_query_close(r.q);
		r.q = NULL;
		/* A rerun the node has no room for in time is still an
		 * evicted task: job runners requeue on 75, not on 3. */
		if (run > 0 && rc == EXIT_DENIED)
			rc = MTCLI_RUN_EXIT_EVICTED;
		if (rc != 1)
			break;
		r.died_of = 0;
		r.told_to_stop = 0;
		/* An event of our task's name heard while we waited for room
		 * was another run's (one of ours from before): this run has
		 * not started, and is not evicted. */
		r.evicted = false;
		/* Our task's events, for the node guard's: opened before the
		 * command starts, so none is missed. */
		watch_open(&r, false);
		char **envp = command_env(&r);
		if (!envp) {
			fprintf(stderr, "memtally: out of memory\n");
			rc = EXIT_LOCAL;
		} else {
			rc = supervise(&r, envp);
		}
		free_env(&r, envp);
		memtally_query_close(r.w);
		r.w = NULL;
		release(&r);
		if (r.evicted && rc == 0) {
			/* Its workers were evicted, yet the command says it
			 * did its work (a parent that never registered and
			 * did not depend on them): its word stands. */
			fprintf(stderr,
			        "memtally: %s; the command still exited 0\n",
			        r.evicted_why);
			r.evicted = false;
		}
		if (!r.evicted)
			break;
		fprintf(stderr, "memtally: %s\n", r.evicted_why);
		end_leftovers();
		if (r.told_to_stop) {
			/* A user's ^C or a runner's TERM (a job cancelled)
			 * before the eviction: not run again, and not 75,
			 * which a job runner takes as "requeue it". We end as
			 * the signal would have ended the command. */
			fprintf(stderr,
			        "memtally: not running it again: it was told "
			        "to stop (%s)\n",
			        strsignal(r.told_to_stop));
			r.died_of = r.told_to_stop;
			rc = 128 + r.told_to_stop;
			break;
		}
		rc = MTCLI_RUN_EXIT_EVICTED;
		if (run >= o->retry)
			break;
		/* The rerun reads what the first run read: a file from where
		 * it started (else the first run's reads left it at their
		 * end, and the rerun did other work, exiting 0). A pipe's
		 * bytes the first run took are gone: said, since most pipes
		 * a job runner hands a command carry nothing (srun's), and
		 * not rerunning would end every such retry. */
		if (r.stdin_at >= 0 &&
		    lseek(STDIN_FILENO, r.stdin_at, SEEK_SET) != r.stdin_at) {
			fprintf(stderr,
			        "memtally: not running it again: its standard "
			        "input is a file that cannot be rewound to "
			        "where the first run began reading\n");
			break;
		}
		fprintf(stderr, "memtally: running it again (%u of %u)%s\n",
		        run + 1, o->retry,
		        r.stdin_stream
		            ? "; its standard input is a pipe or "
		              "socket: what the first run read of it "
		              "is not read again"
		            : "");
		r.evicted = false;
		r.asked = false;
		r.reservation[0] = '\0';
		if (r.wait_s < RETRY_WAIT_S)
			r.wait_s = RETRY_WAIT_S;
	}
	memtally_query_close(r.q);
	close(r.sfd);
	/* The command died of a signal that ends a process without a core
	 * (^C): so do we, so that a shell's loop sees it as the command's
	 * death by it and stops, as it would without us. */
	if (r.died_of == SIGINT || r.died_of == SIGTERM ||
	    r.died_of == SIGHUP || r.died_of == SIGPIPE) {
		if (rc == 128 + r.died_of) {
			signal(r.died_of, SIG_DFL);
			sigset_t one;
			sigemptyset(&one);
			sigaddset(&one, r.died_of);
			sigprocmask(SIG_UNBLOCK, &one, NULL);
			raise(r.died_of);
		}
	}
	return rc;
}
