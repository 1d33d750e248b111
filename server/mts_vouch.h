/*
 * mts_vouch.h - what the kernel vouches for (vouch.c): how much of each
 * process's claim counts toward anyone but its own uid.
 */
#ifndef MTS_VOUCH_H
#define MTS_VOUCH_H

#include <stdbool.h>
#include <stdint.h>

#include "mts_vouch_types.h"

struct mts_registry;
struct mts_proc;
struct mts_table;

/* Early reads of kernel figures: at most one sweep of them this often,
 * for the processes whose claims rose by MTS_VOUCH_JUMP since their
 * figure was last read (or that have none yet). */
#define MTS_VOUCH_SWEEP_MS 100u
#define MTS_VOUCH_JUMP     (UINT64_C(1) << 20)
/* An early read costs the process at most 1/MTS_VOUCH_READ_DUTY of a
 * thread: the next one waits that many times the last one's cost. */
#define MTS_VOUCH_READ_DUTY 20u
/* A uid whose excess is at most this rests: its allowance's clock runs
 * back. Claims lag allocations by a flush at most, so an honest uid
 * with nothing untouched rests. */
#define MTS_VOUCH_REST (UINT64_C(1) << 20)

/* Should `p`'s kernel figure be read early? */
bool mts_vouch_want_read(const struct mts_proc *p);

/* Does `uid` count in full toward everyone: root, the server's own uid,
 * [trust] trusted_uids? */
bool mts_uid_trusted(const struct mts_registry *reg, uint32_t uid);

/* After a change of policy or of a process's uid: every table's and
 * process's `trusted` flag again. */
void mts_vouch_refresh(struct mts_registry *reg);
/* The flags of one process (at registration, exec, adoption). */
void mts_vouch_proc_init(const struct mts_registry *reg, struct mts_proc *p);
/* Is `p`'s user (not only its figure) untrusted: its uid, or it left a
 * trusted uid, or its slot is in reach of one that did or unreadable? An
 * exec'd image that has not registered (image_stale) is counted as the
 * kernel vouches, yet its user is what it was: a root service stays one
 * for the guard. */
bool mts_vouch_distrusted(const struct mts_registry *reg,
                          const struct mts_proc *p);

/* Tables newly tainted (mts_table_taint): every process whose slot is in
 * reach of the worker that left becomes untrusted (p->exposed). And at a
 * registration: is `p`'s slot in such a reach? */
void mts_vouch_taint_apply(struct mts_registry *reg);
void mts_vouch_exposed_check(struct mts_registry *reg, struct mts_proc *p);

/* Tables with pages memtallyd could not read (mts_tables_faults): every
 * process whose slot is on one becomes untrusted (p->slot_lost). And at a
 * registration: is `p`'s slot on one? */
void mts_vouch_lost_apply(struct mts_registry *reg);
void mts_vouch_lost_check(struct mts_registry *reg, struct mts_proc *p);

/* Start of a tick: clear the sums, hand out each untrusted uid's stale
 * excess and allowance afresh. */
void mts_vouch_begin(struct mts_registry *reg);

/* The part of `claim` (an untrusted process's, this tick) that counts
 * toward others; sets p->unvouched. Sets *want_read when the process's
 * kernel figure should be read again soon (mts_rss_want_vouch). */
uint64_t mts_vouch_proc(struct mts_registry *reg, struct mts_proc *p,
                        uint64_t claim, bool *want_read);

/* What of `p`'s claim counts toward others, as of the latest tick: all
 * of it for a trusted process; for an untrusted one the part vouched for,
 * and never less than what the kernel says it holds (a claim of 0 hides
 * nothing). */
uint64_t mts_vouch_counted(const struct mts_proc *p);

/* End of a tick: roll each untrusted uid's excess window; ask for fresh
 * kernel figures where claims ran ahead of them. */
void mts_vouch_end(struct mts_registry *reg, uint64_t now_ns);

/* What `uid`'s processes claim beyond what counts for others, as of the
 * latest tick (0 for a trusted uid or one with no process). */
uint64_t mts_vouch_unvouched_of(const struct mts_registry *reg, uint32_t uid);

/* What the kernel says a process holds. */
struct mts_kernel_mem {
	uint64_t rss;   /* resident: proportional where `pss` */
	uint64_t held;  /* anonymous + shared + swapped memory */
	uint64_t shmem; /* the shared part of `held` */
	uint64_t anon;  /* anonymous resident, each page in full (RssAnon):
	                 * what bounds the process's mapped bytes */
	bool pss;       /* proportional: a shared page counts 1/n */
	bool has_uids;  /* from status: its real, effective and saved uids */
	uint32_t uids[3];
	char name[16]; /* from status: Name (its comm, escaped), or "" */
};

/* From the text of /proc/PID/smaps_rollup: Pss, Pss_Anon + Pss_Shmem +
 * SwapPss, Anonymous. -EINVAL without Pss_Anon (Linux < 5.10). */
int mts_parse_smaps_rollup(const char *text, struct mts_kernel_mem *out);
/* From the text of /proc/PID/status: VmRSS, RssAnon + RssShmem + VmSwap,
 * RssAnon, each shared page counted in full, and the real, effective and
 * saved uids. 0 or -EINVAL. */
int mts_parse_status_mem(const char *status, struct mts_kernel_mem *out);
/* Read /proc/PID/smaps_rollup (with `smaps`), or /proc/PID/status where
 * the kernel has no proportional figures or without `smaps`. 0 or
 * -errno. */
int mts_read_kernel_mem(int pid, bool smaps, struct mts_kernel_mem *out);

#endif /* MTS_VOUCH_H */
