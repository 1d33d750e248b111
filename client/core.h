/*
 * core.h - the process's state that attach.c, publish.c and free_sample.c
 * share: its attachment to memtallyd's segment, the bytes not yet in any
 * slot, and the turns and back-offs that keep one thread at a time on
 * each slow task. The front ends never include it: they see the core
 * through client_internal.h.
 */
#ifndef MEMTALLY_CORE_H
#define MEMTALLY_CORE_H

#include <pthread.h>
#include <sched.h>
#include <sys/types.h>
#include <sys/un.h>

#include "client_internal.h"

/* A heartbeat older than this means the server is gone or the segment was
 * replaced: re-register (which is harmless if all is well). */
#define MTC_STALE_NS (2000 * 1000000ull)

/* The server's header and our slot, in a window of our uid's slot table;
 * immutable once published. Two attachments may share a window (a server
 * restarted and kept our slot): `table` is then the same mapping. */
struct mtc_attachment {
	struct mtshm_map hdr_map;
	struct mtshm_map table; /* the window holding our slot only */
	const struct mtshm_header *hdr;
	struct mtshm_layout layout; /* private copy, validated */
	struct mtshm_slot_id *slot;
	uint32_t slot_index;
	uint64_t slot_gen;
};

/* The process's state, defined in attach.c. A fork's child resets what
 * its parent's would mislead it with (on_fork_child). */
struct mtc_process {
	/* Shared between threads: accessed with the mtshm_atomic helpers. */
	int64_t pending;      /* bytes not yet in any slot */
	int64_t fork_pending; /* published inside fork()'s handlers */
	/* mtc_w.cur and mtc_w.epoch as last set, kept where a fork does not
	 * wipe them: the child's starting total is its parent's slot's, and
	 * its epochs must differ from any its parent's lanes were claimed
	 * under (mtc_fork_seen). Written only by the one thread that holds
	 * `attaching`, or in a fork's child before it attaches. */
	uint64_t cur_kept;
	uint64_t epoch_kept;
	uint64_t next_try_ns; /* back-off: no attach before this */
	uint64_t backoff_ns;
	uint32_t waited;       /* the last attempt waited out its timeout: even
	                        * memtally_flush() keeps the back-off then */
	uint64_t born_ns;      /* this image's start, or the fork's */
	int32_t after_exec;    /* image_follows_exec(): -1 not known */
	uint32_t natts;        /* attachments made by this process and
	                        * the ancestors it forked from (atts[]
	                        * is a ring); under `attaching`, raised
	                        * after the entry is written (release) */
	uint32_t natts_base;   /* natts when this process forked off */
	uint32_t fenced_to;    /* atts[] below this are fenced here, or
	                        * this process's own (fence_inherited) */
	uint64_t mapped;       /* mapped bytes (mmap.c), absolute */
	uint32_t free_turn;    /* try-lock: one thread samples at a time */
	uint64_t free_min_ns;  /* no sample before this (its cost) */
	uint64_t free_next_ns; /* a sample after this, moved or not */
	int64_t free_heap;     /* heap bytes at the last sample */
	uint64_t free_last_ns; /* when it was stored, 0 = none in this
	                        * slot (the refresh thread's test) */
	uint32_t refresh_started; /* the refresh thread runs (refresh.c) */
	/* The server's tick period as the refresh thread saw its heartbeat
	 * move (0: not seen yet): a heartbeat is stale past three of them,
	 * at least MTC_STALE_NS (mtc_heartbeat_check), so a server run with
	 * a tick of seconds is not taken for a gone one. */
	uint64_t tick_period_ns;
	/* A registration went unanswered within the timeout, and the
	 * server may have registered us all the same: the refresh thread
	 * tries again, whatever the process's size (mtc_refresh_once). */
	uint32_t answer_lost;
	/* The last registration reached no server (none yet, or gone): the
	 * refresh thread tries again, within its minimum, for a quiet
	 * process that makes no flush. Not after a refusal (no slot free):
	 * that one stops asking until its own flushes ask again. */
	uint32_t unreached;

	/*
	 * The over-limit callback and its argument, read as one snapshot
	 * under a seqlock: a writer makes cb_seq odd, stores both with
	 * release, makes it even again. A reader (over_cb_load) loops
	 *	s1 = load_acquire(seq); if (s1 odd) retry;
	 *	fn = load_acquire(cb_fn); arg = load_acquire(cb_arg);
	 *	if (load(seq) != s1) retry;
	 * at most OVER_CB_TRIES times: it runs on the allocator path and
	 * must not wait for a preempted writer. No standalone fences, as in
	 * the segment's fleet seqlock (ThreadSanitizer does not model them):
	 * a reader that loads a new value synchronises with its release
	 * store, so its re-read of seq sees the writer's odd value.
	 */
	uint32_t cb_seq;
	uint64_t cb_fn;  /* void (*)(void *), 0 = none */
	uint64_t cb_arg; /* void * */

	/* Written once by init(), or under `attaching`. */
	pthread_once_t once;
	int disabled;
	int free_off;         /* MEMTALLY_ALLOCATOR_FREE=0: never sample */
	uint64_t refresh_ms;  /* MEMTALLY_REFRESH_MS, 0: no refresh thread */
	uint64_t refresh_min; /* MEMTALLY_REFRESH_MIN: see MTC_REFRESH_MIN */
	int64_t register_min; /* MEMTALLY_REGISTER_MIN: see worth_registering */
	uint64_t register_after_ns; /* MEMTALLY_REGISTER_AFTER_MS, in ns */
	/* MEMTALLY_REGISTER_TIMEOUT_MS, in ns: the longest a flush waits
	 * for the server's answer (0: the default, do_register). */
	uint64_t register_timeout_ns;
	uint64_t image_id;
	char sock[sizeof(((struct sockaddr_un *)0)->sun_path)];
	/* MEMTALLY_SERVER_UID: a uid the server may run as besides root,
	 * ours and the socket directory's owner's (attach.c). */
	uint32_t server_uid;
	uint8_t has_server_uid;
	/* The group the next registration carries, NUL-padded, as words
	 * under group_seq: the same seqlock as cb_seq, because
	 * memtally_set_group() may run on any thread while another thread
	 * registers (mtc_group_copy, group_store). */
	uint32_t group_seq;
	uint64_t group_w[MTC_GROUP_MAX / 8];
	char task[64];
	pid_t pid;
};
extern struct mtc_process mtc_proc MTC_HIDDEN;

/* mtc_w.gate's halves: the slot's flags below, the epoch's low 32 bits
 * above (publish.h). */
#define GATE_FLAGS    UINT64_C(0xffffffff)
#define GATE_EPOCH(e) ((uint64_t)(uint32_t)(e) << 32)

/* A seqlock's writer (cb_seq, group_seq): waits for an even sequence and
 * makes it odd, which makes writers exclusive; returns the even value.
 * Writers are rare and off the allocator path, so they spin. The writer
 * ends with a release store of the returned value + 2. */
static inline uint32_t mtc_seq_write_begin(uint32_t *seq_p)
{
	uint32_t seq;
	for (;;) {
		seq = __atomic_load_n(seq_p, __ATOMIC_RELAXED);
		if (!(seq & 1) && __atomic_compare_exchange_n(
		                      seq_p, &seq, seq + 1, 0, __ATOMIC_ACQUIRE,
		                      __ATOMIC_RELAXED))
			return seq;
		sched_yield();
	}
}

static inline const struct mtc_attachment *cur_att(void)
{
	return (const struct mtc_attachment *)(uintptr_t)mtshm_load_acquire64(
	    &mtc_w.cur);
}

static inline struct mtshm_slot_id *cur_slot(void)
{
	const struct mtc_attachment *a = cur_att();
	return a ? a->slot : NULL;
}

/* What the process has published into the slot of `a`. */
static inline int64_t slot_total(const struct mtc_attachment *a)
{
	uint64_t flushes;
	int absurd;
	return mtshm_slot_sum(a->slot, a->layout.lane_count, &flushes, &absurd);
}

/* Bytes flushed by this process (slot sum + pending), without any thread's
 * unflushed drift. */
int64_t mtc_published_bytes(void);

/* How a caller asks for an attach (mtc_maybe_attach). */
enum attach_ask {
	ATTACH_LAZY,  /* a flush: back-off and worth_registering() apply */
	ATTACH_ASKED, /* the program asked (memtally_attached): back-off only */
	ATTACH_NOW,   /* memtally_flush(), a stale server: neither */
};
void mtc_maybe_attach(enum attach_ask ask) MTC_HIDDEN;

#endif /* MEMTALLY_CORE_H */
