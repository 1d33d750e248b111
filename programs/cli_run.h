/*
 * cli_run.h - `memtally run`, the part of the CLI that starts a command:
 * admission (waiting for room on request), the preload, signal
 * forwarding, release. Internal to the `memtally` tool.
 */
#ifndef MEMTALLY_CLI_RUN_H
#define MEMTALLY_CLI_RUN_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* The reservation's TTL when --ttl is not given: how long an admission
 * holds room for a command whose workers have not registered yet (a
 * reservation its workers took over ends with them instead). Long enough
 * for a job's start-up (an interpreter, imports, reading its input) before
 * its memory shows in its own processes; short enough that the
 * reservation of a `memtally run` killed with SIGKILL is gone two minutes
 * later. */
#define MTCLI_RUN_DEFAULT_TTL_S 120u

/* Exit status when the command cannot be started (as a shell's). */
#define MTCLI_RUN_EXIT_NOEXEC   126
#define MTCLI_RUN_EXIT_NOTFOUND 127
/* Exit status when memtallyd's node guard evicted the command: sysexits'
 * EX_TEMPFAIL, "try again later", which job runners can requeue on
 * (Slurm's RequeueExit, systemd's RestartForceExitStatus=). */
#define MTCLI_RUN_EXIT_EVICTED 75
/* --retry at most: a task evicted this often will be again. */
#define MTCLI_RUN_RETRY_MAX 100u

struct mtcli_run_opts {
	const char *socket; /* the server's socket (NULL with tcp) */
	bool socket_given;  /* --socket: hand it to the command too */
	const char *tcp;    /* HOST:PORT, or NULL */
	const char *token;  /* for Release over TCP, or NULL */
	int timeout_ms;     /* bounds each call to the server; 0: default */
	uint64_t bytes;     /* 0: no admission unless a kind is given */
	const char *group;  /* --group, or NULL: $MEMTALLY_GROUP */
	const char *task;   /* --task, or NULL: generated */
	const char *kind;   /* --kind, or NULL: the task's kind; admits
	                       without bytes (the kind's learned size) */
	uint32_t ttl_s;     /* 0: MTCLI_RUN_DEFAULT_TTL_S */
	double wait_s;      /* wait this long for room; 0: do not wait */
	double poll_s;      /* while waiting, ask at least this often; 0: 2 s */
	uint32_t retry;     /* rerun an evicted command up to this often */
	const char *reservation; /* admitted already as `task`: no Admit for
	                            the first run, Release at its end */
	char **argv;             /* the command, NULL-terminated, argv[0] set */
};

/*
 * Run the command per `o` and return the exit status for the tool:
 * the command's own, 128 + N when a signal N ended it, 75 when memtallyd's
 * node guard evicted it (after the reruns --retry allows), 3 when admission
 * was denied (the command never started), 128 + N when signal N came
 * while waiting for room, 126/127 when it cannot be executed, 1 on a
 * local failure (fork, out of memory). Never fails because memtallyd is
 * missing or broken: the command then runs anyway, after one line on
 * stderr.
 */
int mtcli_run(const struct mtcli_run_opts *o);

/* Text a server sent, copied into `buf` (at most `cap` bytes) so that it
 * cannot drive the terminal: controls, bidirectional formatting and bytes
 * that are not UTF-8 become '?'. Returns `buf`. */
const char *mtcli_clean(char *buf, size_t cap, const char *s);

#endif /* MEMTALLY_CLI_RUN_H */
