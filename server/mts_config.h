/*
 * mts_config.h - the configuration: the INI file and flags turned into
 * the server's settings and policy, and the parsers of its values
 * (config.c).
 */
#ifndef MTS_CONFIG_H
#define MTS_CONFIG_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/socket.h>

#include "mts_hooks.h"
#include "mts_policy.h"
#include "mts_values.h"

/* Connections (conn.c): the defaults and bounds of their keys. The
 * server-wide budget: at most max_connections open and max_buffered
 * bytes of input and unwritten output over all of them; per peer uid
 * (admins exempt; TCP peers of unknown uid are one bucket with a cap of
 * its own); a connection with no request for idle_timeout is closed
 * (Watch subscribers excepted), checked every quarter of it. */
#define MTS_DEFAULT_MAX_CONNS              1024u
#define MTS_MAX_CONNS_MAX                  1000000u
#define MTS_DEFAULT_MAX_BUFFERED           (UINT64_C(64) << 20)
#define MTS_MAX_BUFFERED_MIN               (UINT64_C(1) << 20)
#define MTS_DEFAULT_MAX_CONNS_UNIDENTIFIED 64u
#define MTS_DEFAULT_IDLE_MS                60000u
#define MTS_IDLE_MAX_MS                    86400000u

struct mts_config {
	const char *socket_path;
	const char *segment;    /* [server] label: of the shared objects */
	const char *state_path; /* restart record; NULL: next to the socket
	                           (SOCKET.state), none without a socket */
	uint32_t slots;
	uint32_t lanes;
	uint32_t tick_ms;
	uint64_t threshold;
	bool reset;
	/* Policy and listeners. Zero/NULL is the default for each. */
	const struct mts_policy *policy; /* NULL: mts_policy_defaults() */
	const char *tcp_addr;            /* HOST:PORT to listen on, or NULL */
	bool tcp_allow_remote;    /* tcp_addr may resolve to a remote address */
	const char *metrics_addr; /* --metrics / [server] metrics, stored */
	bool has_gid;             /* chown the socket to `gid` */
	uint32_t gid;
	/* The connection budget; 0 = the default. */
	uint32_t max_conns;
	uint64_t max_buffered;
	/* Per peer uid, 0 = the default (max_conns / MTS_DEFAULT_PER_UID_DIV);
	 * and the idle timeout (0 = the default unless no_idle_timeout). */
	uint32_t max_conns_per_uid;
	/* All TCP peers of unknown uid together; 0 = the default. */
	uint32_t max_conns_unidentified;
	uint32_t idle_timeout_ms;
	bool no_idle_timeout;
	/* What the server sets its own /proc/self/oom_score_adj to at start
	 * (only ever lowering it), unless oom_score_keep. */
	int32_t oom_score_adj;
	bool oom_score_keep;
	const struct mts_hook_conf *hooks; /* [hooks], or NULL: none */
};

/* The server's own OOM score adjustment by default: far below any worker's,
 * so that on a node out of memory the kernel never picks the server, but
 * not -1000, which would make it unkillable even when it is itself what
 * went wrong. */
#define MTS_DEFAULT_OOM_SCORE_ADJ (-900)

/* SIGHUP reloads (main.c, into struct mts_server), for /metrics. */
struct mts_reload_stats {
	uint64_t applied;  /* reloads applied */
	uint64_t rejected; /* reloads rejected (bad value): the old stays */
};

/* Everything main needs: server settings, policy, log level, reload
 * bookkeeping. Strings are owned. */
struct mts_settings {
	struct mts_config cfg; /* strings point into `owned` */
	struct mts_policy policy;
	int log_level; /* enum mts_log_level */
	/* [server] log_budget: lines a second per uid and level; 0 = none */
	unsigned log_budget;
	char *config_path;          /* NULL: no file */
	char *owned[8];             /* socket, label, tcp, metrics, state */
	struct mts_hook_conf hooks; /* [hooks] */
	/* [server] keys checked together once everything is read: the token
	 * moves into the policy, the others are only read. */
	char *tcp_token;
	char *tcp_token_file;
	bool tcp_allow_remote;
	char *metrics_token_file; /* [metrics] token_file */
};

/* One command-line value that overrides a key of the file. */
struct mts_override {
	const char *flag;    /* "--fleet-limit", for messages */
	const char *section; /* "server", "limits" */
	const char *key;
	const char *value;
};

/*
 * Build settings: defaults, then the file at `path` (NULL = none), then
 * the overrides in order. On a bad value returns -EINVAL with a one-line
 * message naming the key or flag in err (e.g. "memtallyd.conf:12: [limits]
 * fleet: expected a size like 64GiB, or none; got 'x'"); -ENOENT/-EACCES
 * when the file cannot be read (message in err); -ENOMEM. *out is
 * untouched on failure.
 */
int mts_settings_load(struct mts_settings *out, const char *path,
                      const struct mts_override *ov, size_t nov, char *err,
                      size_t errlen);
/* At start, not on the loop: resolve [server] tcp when it is a name and
 * apply the loopback rule to what it resolves to (a load checks literals
 * only). 0, or -EINVAL with a message in `err` and `s` freed. */
int mts_settings_resolve(struct mts_settings *s, char *err, size_t errlen);
void mts_settings_free(struct mts_settings *s);

extern const struct mts_key mts_keys[];
extern const size_t mts_nkeys;

/* Is [section] key one of the file's keys (outside [group NAME])? */
bool mts_config_key_known(const char *section, const char *key);
/* "worker slots: an integer from 1 to 1048576 (default 4096)", the
 * default as `defaults` (mts_settings_load of no file) holds it. */
void mts_key_describe(const struct mts_key *k,
                      const struct mts_settings *defaults, char *buf, size_t n);
/* Log every key's value, one line per section (the start-up log). */
void mts_settings_log(const struct mts_settings *s);
/*
 * The keys whose value differs between `a` and `b`, of those a reload
 * applies (`reload`) or of the others: up to `max` into `keys`. Returns
 * how many differ.
 */
size_t mts_settings_diff(const struct mts_settings *a,
                         const struct mts_settings *b, bool reload,
                         const struct mts_key **keys, size_t max);

#endif /* MTS_CONFIG_H */
