/*
 * mts_values.h - what a configuration value is (values.c): the types of
 * keys, the row that describes one key (config.c's table is made of
 * them), each type's parser and printer, and the small parsers other
 * modules share.
 */
#ifndef MTS_VALUES_H
#define MTS_VALUES_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/socket.h>

/* What a key's value is. Each type has one parser, one message, one way
 * to print it (--help, the log, the reload diff). */
enum mts_key_type {
	MTS_KEY_COUNT,    /* an integer in [lo, hi] ("none": `none`) */
	MTS_KEY_INT,      /* a signed integer; "none" sets the bool at off2 */
	MTS_KEY_SIZE,     /* bytes ("64KiB", "1.5G"; none: 0) */
	MTS_KEY_SIZE_PCT, /* bytes, or a percentage (of the fleet limit) kept
	                     in the uint32_t at off2; def is the percentage */
	MTS_KEY_PERCENT,  /* basis points; "92.5", "90%" */
	MTS_KEY_DURATION, /* ms ("500ms", "10s", "5m"); off2: a bool, false
	                     after "off" */
	MTS_KEY_BOOL,
	MTS_KEY_ENUM,   /* index of the name in `names` */
	MTS_KEY_STRING, /* an owned char *, checked by `ok`, of lo to hi bytes
	                   (hi 0: any) */
	MTS_KEY_UID,    /* a uid or user name; the bool at off2 says set */
	MTS_KEY_GID,    /* a gid or group name; likewise */
	MTS_KEY_UIDS,   /* uids or user names: an owned uint32_t array, its
	                   count (uint32_t) at off2 */
	MTS_KEY_GIDS,   /* likewise of gids or group names */
	MTS_KEY_SIGNAL, /* a signal number, 0 = off */
	MTS_KEY_FN,     /* what no type says: `parse` and `show` */
};

#define MTS_KEY_RELOAD 0x01u /* a reload applies it, else the next start */
#define MTS_KEY_NONE   0x02u /* none, off, unlimited are a value: `none` */
#define MTS_KEY_EMPTY  0x04u /* an empty string is none (NULL) */
#define MTS_KEY_ZERO   0x08u /* 0 is good though below lo */
#define MTS_KEY_SECS   0x10u /* a duration kept in seconds */
#define MTS_KEY_SECRET 0x20u /* logged as set or none, never its value */
#define MTS_KEY_GROUP  0x40u /* of [group NAME]: off is in the group */

/*
 * One configuration key: config.c's table, mts_keys, has one of these
 * for every key, and the file, the flags, the defaults, --help, the
 * start-up log and the reload diff all come from it. Fields are offsets
 * in struct mts_settings (in struct mts_group_policy for MTS_KEY_GROUP);
 * bounds and the default are in the field's unit (bytes, ms, basis
 * points, seconds with MTS_KEY_SECS).
 */
struct mts_key {
	const char *section, *key;
	enum mts_key_type type;
	unsigned opts; /* MTS_KEY_* */
	size_t off, width, off2;
	uint64_t lo, hi;
	int64_t def;
	uint64_t none;      /* what "none" stores (MTS_KEY_NONE) */
	const char *sdef;   /* a string's default */
	const char *flag;   /* "--slots", or NULL */
	const char *arg;    /* the flag's value in --help, "N" */
	const char *help;   /* one line */
	const char *dflt;   /* the default in words, where no value says it */
	const char *expect; /* "a size like 64GiB, or none", for messages */
	const char *alias;  /* an older name, still taken (and its flag) */
	const char *const *names; /* MTS_KEY_ENUM: "warn|warning" */
	bool (*ok)(const char *v);
	int (*parse)(void *base, const char *v, char *why, size_t n);
	void (*show)(const void *base, char *buf, size_t n);
};
/* Parse `v` into the fields of `k` at `base`. 0, -EINVAL with the
 * message ("expected a size like 64GiB, or none; got 'x'") in why, or
 * -ENOMEM. */
int mts_key_parse(const struct mts_key *k, void *base, const char *v, char *why,
                  size_t n);
/* Print the value of `k` at `base` ("64MiB", "90%", "10s", "none"); a
 * secret prints as "set" unless `reveal`. */
void mts_key_show(const struct mts_key *k, const void *base, bool reveal,
                  char *buf, size_t n);
/* What a good value of `k` looks like: "an integer from 1 to 64". */
void mts_key_expect(const struct mts_key *k, char *buf, size_t n);
/* Set the fields of `k` at `base` to its default. 0 or -ENOMEM. */
int mts_key_default(const struct mts_key *k, void *base);

/* No control characters in v. */
bool mts_no_controls(const char *v);
/* none, off or unlimited. */
bool mts_is_none(const char *v);
/* Replace the owned string *slot by a copy of v. 0 or -ENOMEM. */
int mts_str_set(char **slot, const char *v);
/* Digits only, in [lo, hi]. 0 or -EINVAL. */
int mts_parse_uint(const char *v, uint64_t lo, uint64_t hi, uint64_t *out);
/* true, yes, on, 1; false, no, off, 0 (any case). 0 or -EINVAL. */
int mts_parse_bool(const char *v, bool *out);
/* A duration: digits with ms, s (the default), m, h or d, into ms, at
 * most max_ms. 0 or -EINVAL. */
int mts_parse_duration_ms(const char *v, uint64_t max_ms, uint64_t *out);
/* A uid or user name; a gid or group name. 0 or -EINVAL. */
int mts_lookup_uid(const char *v, uint32_t *out);
int mts_lookup_gid(const char *v, uint32_t *out);
/* "1000, alice, 2000": each a number or a name `lookup` resolves; the
 * result replaces *ids. 0, -EINVAL (a bad entry or an empty list) or
 * -ENOMEM. */
int mts_parse_ids(const char *v, int (*lookup)(const char *, uint32_t *),
                  uint32_t **ids, uint32_t *n);
/* Bytes as "64MiB" (a whole number of a binary unit) or a number; ms as
 * "10s", "500ms", "7d"; basis points as "90%", "12.5%". */
void mts_fmt_size(uint64_t b, char *buf, size_t n);
void mts_fmt_duration(uint64_t ms, char *buf, size_t n);
void mts_fmt_pct(uint64_t bp, char *buf, size_t n);

/* Parse "90", "92.5", "90%" (0 to 100, two decimals at most) into basis
 * points. 0 or -EINVAL. */
int mts_parse_percent(const char *s, uint32_t *bp);
/* "SIGTERM", "TERM", "term", "15"; "" -> 0 (off). 0 or -EINVAL. */
int mts_parse_signal(const char *s, int *sig);
/*
 * A listening address, HOST:PORT (the one syntax, mt_split_hostport()),
 * into *ss and *len. HOST is an IPv4 literal, an IPv6 literal in brackets
 * ("[::1]", "[::]"), "localhost" (always 127.0.0.1, so the address does
 * not depend on resolver order) or a name getaddrinfo() resolves (its
 * first address). PORT 0 lets the kernel choose. *loopback says whether
 * the address is a loopback one. 0 or -EINVAL (malformed, or a name that
 * does not resolve). Used for --tcp and --metrics alike.
 */
int mts_parse_hostport(const char *s, struct sockaddr_storage *ss,
                       socklen_t *len, bool *loopback);
/* The same without a lookup: 1 (and nothing in *ss) when HOST is a name,
 * which may take the resolver seconds. For checks made on the loop (a
 * reload). */
int mts_parse_hostport_literal(const char *s, struct sockaddr_storage *ss,
                               socklen_t *len, bool *loopback);
/* Is v such an address? */
bool mts_hostport_ok(const char *v);

#endif /* MTS_VALUES_H */
