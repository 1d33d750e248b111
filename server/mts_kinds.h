/*
 * mts_kinds.h - kinds and their learned sizes (kinds.c): per kind and
 * uid, the peaks of its recent finished tasks, the size admission
 * reserves for its next one, and the record that keeps them across a
 * restart.
 */
#ifndef MTS_KINDS_H
#define MTS_KINDS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "mts_policy.h"
#include "mts_uidcount.h"

struct mts_registry;
struct mts_resv;

/* A run's profile: its length cut into this many equal steps. */
#define MTS_KIND_STEPS 8u
/* A profile step's unit: the run's peak is MTS_KIND_STEP_ONE. */
#define MTS_KIND_STEP_ONE 65535u

/* One finished task of a kind. Also the record file's run entry. */
struct mts_kind_run {
	uint64_t peak;    /* its workers' vouched bytes, at their largest */
	uint64_t end_s;   /* CLOCK_REALTIME seconds at its end */
	uint32_t evicted; /* 1: the node guard ended it */
	uint32_t dur_ms;  /* from its first worker to its end; 0: unknown */
	/* Its largest use in each step of its length, of its peak. */
	uint16_t steps[MTS_KIND_STEPS];
};

/*
 * What a kind's next task is expected to hold over its life: `bytes[i]`
 * in the i-th of MTS_KIND_STEPS equal steps of `mean_ms`, the runs' mean
 * length (what admission expects a task to last). Known when the kind has
 * runs with a length; then each step is the estimator's quantile of those
 * runs' step shares, scaled to the learned size, and `mean[i]` what the
 * runs held in that step on average.
 */
struct mts_kind_profile {
	bool known;
	uint32_t mean_ms;
	uint64_t bytes[MTS_KIND_STEPS];
	uint64_t mean[MTS_KIND_STEPS];
};

/*
 * A kind as one uid runs it. Kinds are kept per (name, uid): a kind name
 * is a label anyone can choose, so the runs of one uid never size the
 * reservations of another.
 */
struct mts_kind {
	struct mts_kind *hnext;
	char *name;
	uint64_t hash;        /* of name and uid */
	uint32_t uid;         /* MTS_UID_TCP: TCP peers of unknown uid */
	uint32_t outstanding; /* reservations naming it now */
	uint32_t head;        /* where the next run goes in runs[] */
	uint32_t nruns;       /* runs[] kept, <= MTS_KIND_RUNS */
	uint64_t runs_total;  /* ever recorded */
	uint64_t evictions;   /* of them, ended by the node guard */
	bool capless; /* made or run by a peer exempt from max_kinds_per_uid
	               * (an admin, a request with the token): it counts
	               * against max_kinds only */
	struct mts_kind_run runs[MTS_KIND_RUNS]; /* a ring, newest at
	                                            head - 1 */
	/* The estimate, cached until a run comes, the oldest run it used
	 * ages out, or the policy's [kinds] keys change. */
	bool est_valid;
	uint32_t est_runs;
	uint64_t est_bytes;
	uint64_t est_until_s;
	uint32_t est_key[4]; /* quantile, margin, window, horizon */
	struct mts_kind_profile est_prof;
};

/* kinds.c's state (reg->kinds). */
struct mts_kinds {
	struct mts_kind **tab; /* (name, uid) -> kind, chained */
	uint32_t mask;
	uint32_t n;
	struct mts_uid_counts per_uid; /* kinds each uid keeps against
	                                * max_kinds_per_uid (not capless) */
	bool dirty;             /* changed since the record was written */
	uint64_t saved_mono_ns; /* when it was last written */
	uint64_t runs_recorded;
	uint64_t runs_dropped; /* a kind that could not be kept (caps) */
	uint64_t evictions;
	uint64_t load_refused; /* records refused at start (0 or 1) */
	bool aside; /* the refused record is ours: moved aside at the first
	               save (mts_kinds_keep_refused) */
};

/*
 * A task of `kind` run by `uid` ended, with `run->peak` bytes at its
 * largest. `run->evicted` says the node guard ended it. The peak is the sum of
 * its workers' figures as far as they count toward others (vouch.c), so
 * that a claim the kernel does not back never sizes anything. `run` also
 * carries its length and profile; end_s is set here. The run joins the
 * kind's history, which is created when the caps allow. A run that cannot
 * be kept is counted and logged. An empty or bad `kind` is ignored. An
 * evicted run gives no profile. It counts at 1.5 times its peak, because
 * the task was still growing, if that peak is above what the kind's
 * finished runs learn (or there are none); within it, it does not count.
 */
void mts_kind_note_run(struct mts_registry *reg, const char *kind, uint32_t uid,
                       const struct mts_kind_run *run);

/*
 * The learned size of `kind`: 0 with *bytes and `why` ("212 MiB: p95 of
 * 37 runs of kind xz + 10%") when some uid has a history of it, -ENOENT
 * when none has. With no uid at hand this is the largest of its uids'
 * sizes (the cautious one); admission asks mts_kind_learned_for.
 */
int mts_kind_learned(const struct mts_registry *reg, const char *kind,
                     uint64_t *bytes, char *why, size_t whylen);

/* The learned size of `kind` as `uid` runs it: 0, or -ENOENT (no history
 * in the horizon). */
int mts_kind_learned_for(const struct mts_registry *reg, const char *kind,
                         uint32_t uid, uint64_t *bytes, char *why,
                         size_t whylen);

/* The kind (name, uid), or NULL. */
struct mts_kind *mts_kind_find(const struct mts_registry *reg, const char *kind,
                               uint32_t uid);

/* The estimate of `k` at `now_s`: 0 (*bytes, *runs), or -ENOENT when no
 * run is within the window and horizon. */
int mts_kind_estimate(const struct mts_registry *reg, struct mts_kind *k,
                      uint64_t now_s, uint64_t *bytes, uint32_t *runs);

/* The profile of `kind` as `uid` runs it (after mts_kind_learned_for
 * said 0): 0, or -ENOENT when no run of it has a length. */
int mts_kind_profile_for(const struct mts_registry *reg, const char *kind,
                         uint32_t uid, struct mts_kind_profile *out);

/* "p95 of 37 runs + 10%" for an estimate of `runs` runs. */
void mts_kind_method(const struct mts_policy *pol, uint32_t runs, char *buf,
                     size_t len);

/* What a kind with no history reserves ([kinds] default_size; a
 * percentage is of the fleet limit in force). */
uint64_t mts_kind_default_size(const struct mts_registry *reg);

/*
 * May `uid` bring a new kind into existence? 0, or -EDQUOT (it keeps
 * max_kinds_per_uid; admins exempt) or -ENOSPC (the server keeps
 * max_kinds), with the refusal in `why` and the key in `scope`.
 */
int mts_kind_may_create(const struct mts_registry *reg, uint32_t uid,
                        bool admin, char *why, size_t whylen, char *scope,
                        size_t scopelen);

/* The kind (name, uid), created if needed (mts_kind_may_create said
 * yes), with one more outstanding reservation; `capless`: asked for by a
 * peer exempt from max_kinds_per_uid. 0 or -ENOMEM. */
int mts_kind_ref(struct mts_registry *reg, const char *kind, uint32_t uid,
                 bool capless, struct mts_kind **out);
/* One reservation of `k` fewer; a kind with neither history nor
 * reservations is dropped. */
void mts_kind_unref(struct mts_registry *reg, struct mts_kind *k);

/* The node guard evicted the task of reservation `r`: its run is
 * recorded now, as evicted, with the peak reached, and not again when
 * the reservation ends. */
void mts_resv_evicted(struct mts_registry *reg, struct mts_resv *r);

/* Drop kinds whose every run is older than the horizon and that no
 * reservation names. */
void mts_kinds_age(struct mts_registry *reg, uint64_t now_s);

/* Hold the kinds to [kinds] max_kinds and max_kinds_per_uid as they are
 * now (lowered by a reload): the least recently run go, never one a
 * reservation names (see mts_kinds_load). Returns how many went. */
uint32_t mts_kinds_trim(struct mts_registry *reg);

/* Every kind, sorted by uid then name, in *out (malloc'd, the caller
 * frees it); returns how many, or -ENOMEM. */
int mts_kinds_list(const struct mts_registry *reg, struct mts_kind ***out);

/*
 * The record of learned sizes at `path`. It is written whole to a new file
 * (mode 0600) that is renamed into place, so a reader sees the old record
 * or the new one. It is loaded at start. A file that is not ours (owner,
 * links, mode, a symlink), of another format, or whose checksum or
 * contents do not hold is refused with a log line, and the server starts
 * without learned sizes. Returns 0, -ENOENT (no file), -EBADMSG (refused)
 * or -errno.
 */
int mts_kinds_save(struct mts_registry *reg, const char *path);
int mts_kinds_load(struct mts_registry *reg, const char *path);

/* mts_kinds_save() in two steps: the record's bytes (malloc'd), taken on
 * the loop, then their write, which touches nothing of the registry and
 * may run on another thread (server.c): a disk that is slow to take dirty
 * pages stalls that thread, not the server. mts_kinds_write seals the
 * record (mts_record_seal) and syncs it before its rename. */
int mts_kinds_encode(const struct mts_registry *reg, unsigned char **out,
                     size_t *len);
int mts_kinds_write(const char *path, unsigned char *d, size_t len);

/* A record's bytes as they are taken (the learned sizes', the
 * reservations'): mts_record_put appends, and remembers a failed growth
 * (the record is then not written). mts_record_fnv: FNV-1a over `n`
 * bytes, from MTS_RECORD_FNV0, the records' checksum.
 *
 * Every record starts with the same 32 bytes: magic (u64), version
 * (u32), count (u32), payload (u64: the record's last `payload` bytes),
 * checksum (u64, over the payload). The encoders leave the checksum 0;
 * mts_record_seal fills it in, where the record is written (off the
 * loop), or before a record is handed straight to its reader. */
struct mts_record_buf {
	unsigned char *d;
	size_t len, cap;
	bool failed;
};
void mts_record_put(struct mts_record_buf *w, const void *p, size_t n);
void mts_record_seal(unsigned char *d, size_t len);
#define MTS_RECORD_FNV0 UINT64_C(0xcbf29ce484222325)
uint64_t mts_record_fnv(uint64_t h, const void *p, size_t n);

/* Any record of the server's (the reservations' too), read whole: opened
 * without following a symlink or waiting on a FIFO, refused unless ours
 * (mts_file_not_ours) and at most `max` bytes. 0 with *d (malloc'd) and
 * *len; -ENOENT when there is none; otherwise -errno with *why saying
 * what was wrong. */
int mts_record_read(const char *path, size_t max, unsigned char **d,
                    size_t *len, const char **why);

/* A record of ours refused at start for what it holds, or for a read or
 * an allocation that failed (a node just out of memory), is renamed to
 * PATH.refused before the first save would overwrite it: history a later
 * server or its operator could still read is not destroyed on one
 * warning, and a restart before that save reads it again. Called before
 * each save (on the loop: a rename, once per server life). */
void mts_kinds_keep_refused(struct mts_registry *reg, const char *path);

/* Free every kind. */
void mts_kinds_free(struct mts_registry *reg);

#endif /* MTS_KINDS_H */
