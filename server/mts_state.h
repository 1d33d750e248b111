/*
 * mts_state.h - the restart record: a private file of the server's uid
 * from which a restarted memtallyd adopts the workers of the one before
 * (state.c).
 */
#ifndef MTS_STATE_H
#define MTS_STATE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/*
 * What a restarted memtallyd needs to adopt the workers of the one before.
 * It is a file only the server can write: owned by its uid, mode 0600,
 * one link, opened without following symlinks. It holds the geometry, the
 * instance id and one fixed-size record per slot (pid, uid, start time,
 * image id, generation, group, task). Records are written with pwrite()
 * as workers register, and the file is never mapped. A truncated or
 * damaged file thus reads as fewer records, and cannot fault. An flock()
 * held for the server's life tells a second server that this one is
 * alive.
 */
struct mts_state;

struct mts_state_rec {
	uint32_t pid;           /*   0 0 = free */
	uint32_t uid;           /*   4 */
	uint64_t start_time;    /*   8 /proc/PID/stat starttime */
	uint64_t image_id;      /*  16 */
	uint64_t registered_ns; /*  24 CLOCK_REALTIME */
	uint64_t slot_gen;      /*  32 */
	uint64_t check;         /*  40 rec_check(pid, slot) */
	/* Whole names (MT_NAME_MAX, 255 bytes, and the NUL): a name cut
	 * here would adopt the worker into another group or task, or, cut
	 * inside a UTF-8 sequence, not at all. */
	char group[256]; /*  48 */
	char task[256];  /* 304 */
	uint8_t held;    /* 560 stopped by the node guard */
	/* Its table is tainted (mts_table.tainted), by a worker now of
	 * taint_uid: the next server taints it again. 0 in a record of a
	 * server from before. */
	uint8_t tainted; /* 561 */
	/* It exec'd an image that has not registered (rss.c, exec_seen):
	 * its slot's claim is the old image's. */
	uint8_t image_stale; /* 562 */
	uint8_t spare0;      /* 563 */
	uint32_t taint_uid;  /* 564 */
	uint64_t limit_set;  /* 568 SetLimit{pid}; 0: the default */
	/* Of the image that registered: where its arguments are
	 * (/proc/PID/stat arg_start: only an exec moves it; 0 unknown, as in
	 * a record of a server from before) and its name as answers show it,
	 * so that a successor sees an exec made before it started. */
	uint64_t exec_mark; /* 576 */
	char comm[64];      /* 584 */
	uint8_t spare[376]; /* 648 */
};
/* Four to a page: a record is never split across two. */
#define MTS_STATE_REC_SIZE 1024u
_Static_assert(sizeof(struct mts_state_rec) == MTS_STATE_REC_SIZE, "rec");
_Static_assert(offsetof(struct mts_state_rec, taint_uid) == 564 &&
                   offsetof(struct mts_state_rec, limit_set) == 568 &&
                   offsetof(struct mts_state_rec, exec_mark) == 576 &&
                   offsetof(struct mts_state_rec, comm) == 584,
               "a record's layout is on disk");

/* Geometry and identity a state file records (and a restart adopts). */
struct mts_state_info {
	uint32_t slots;
	uint32_t lanes;
	uint64_t threshold;
	uint64_t instance;
};

/*
 * Open (or create) the state file at `path` and lock it. When it exists,
 * is ours and valid, and `reset` is false, *adopt is set and *info gets
 * what it records. Otherwise it is (re)initialised from *info. A file we
 * do not own, or with other links or the wrong mode, is never written.
 * It is unlinked and replaced. When that fails, the server runs without a
 * restart record: *out is NULL and a warning is logged. Returns 0, -EBUSY
 * (a live server holds the lock) or -errno.
 */
int mts_state_open(const char *path, bool reset, struct mts_state_info *info,
                   bool *adopt, struct mts_state **out);
/* Start an open record afresh from *info (a new instance id unless it
 * has one), as `reset` does at open: for a caller that read the valid
 * record it replaces first. 0 or -errno (the record is then unusable). */
int mts_state_reset(struct mts_state *st, struct mts_state_info *info);
/* mts_state_put writes `r` as slot `slot`'s entry, and mts_state_clear
 * frees that entry. The caller zeroes `r`, then fills the pid, uid, start
 * time, image, registration time, slot generation, group and task; the
 * check is ours. 0 or -errno: errors are logged once and otherwise
 * ignored by registration, because the record is a convenience for the
 * next server, never a reason to refuse a worker (the guard's pause,
 * which the next server must undo, needs its marks written). An entry is
 * written when a worker registers and not cleared when it exits, which saves a
 * pwrite per worker. A restarted server drops entries whose pid is gone or has
 * another start time, and a reused slot's entry is overwritten. */
int mts_state_put(struct mts_state *st, uint32_t slot, struct mts_state_rec *r);
void mts_state_clear(struct mts_state *st, uint32_t slot);
/* Read record `slot` into *rec. Returns 0, or -ENOENT for a free or
 * unreadable entry. */
int mts_state_get(struct mts_state *st, uint32_t slot,
                  struct mts_state_rec *rec);
/* Close and unlock (the file stays for the next server). NULL is fine. */
void mts_state_close(struct mts_state *st);

/* Why the file open at `fd` cannot be one memtallyd wrote (not a regular
 * file, another owner, other links, writable by others), or NULL: the
 * restart record's and the learned sizes' check. */
const char *mts_file_not_ours(int fd);

#endif /* MTS_STATE_H */
