/*
 * attach.c - the process's attachment to memtallyd: set-up from the
 * environment, registration, re-attach, and what a fork changes. Also the
 * calls that attach on demand (memtally_flush, memtally_attached), the
 * mapped bytes' store into the slot, and the front ends' dispatch.
 * What runs at every 64 KiB is publish.c's; the allocator's free memory
 * is free_sample.c's.
 *
 * Invariants:
 *  - Fail open. Nothing here aborts, prints to stdout, or blocks for more
 *    than the registration timeout; an attach is tried at most once per
 *    back-off interval, and only from a flush (never from the fast path).
 *  - Never allocates: registration packs into and unpacks from stack
 *    buffers, so it is safe inside the malloc interposer and cannot recurse
 *    into its own accounting.
 *  - Nothing is lost: bytes flushed while unattached accumulate in
 *    `mtc_proc.pending` and are moved into the slot's `overflow` once attached,
 *    so the slot always carries the process's whole total.
 *  - An attachment (the server's header, mapped read-only, and our slot,
 *    mapped read-write) is written once, then
 *    published through `mtc_w.cur` with release order and never changed, so
 *    a flushing thread needs no lock; it is never unmapped, since another
 *    thread may be storing into its lane at any moment.
 *  - Both objects arrive as descriptors with the Registered answer. They
 *    are mapped only if sealed against resizing (so no access can fault)
 *    and of the size the header announces; the layout is copied once into
 *    the attachment and never read back from shared memory. The
 *    descriptors are closed at once: the worker's descriptor table is left
 *    as it was.
 *  - Of our uid's slot table only the page(s) holding our own slot are
 *    mapped, between two inaccessible guards (mtshm_map_window): a
 *    program's write that runs off one of its own blocks faults in a guard,
 *    as it would have faulted without memtally, instead of landing in the
 *    figures of the uid's other processes. A forked child makes the
 *    windows it inherited inaccessible: they are its parent's slots.
 */
#define _GNU_SOURCE
#include "core.h"

#include <errno.h>
#include <fcntl.h>
#include <libgen.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <sched.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/mman.h>
#include <sys/single_threaded.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include "memtally.pb-c.h"
#include "memtally_query.h"
#include "mtcommon.h"
#include "mtframe.h"

#define MTC_CONNECT_TIMEOUT_MS 500
/* MEMTALLY_REGISTER_TIMEOUT_MS's ceiling: a worker never waits longer. */
#define MTC_CONNECT_TIMEOUT_MAX_MS 10000
#define MTC_BACKOFF_MIN_NS         (100 * 1000000ull)
#define MTC_BACKOFF_MAX_NS         (5000 * 1000000ull)
/* After an attempt that waited out its timeout: the back-off is at least
 * this many times the wait (within MTC_BACKOFF_MAX_NS). */
#define MTC_BACKOFF_WAITED 10u
/* Attachments a process may make in its life (each server re-creation of
 * the segment costs one); past that it counts locally. */
#define MTC_MAX_ATTACH 16
/* The ring's size: a forked child's own attachments (at most
 * MTC_MAX_ATTACH) overwrite only entries of ancestors further back than
 * the MTC_MAX_ATTACH it inherited last, the one in use at the fork among
 * them (a fork from a signal handler returns into code holding it). */
#define MTC_ATT_RING (2 * MTC_MAX_ATTACH)

static struct mtc_attachment atts[MTC_ATT_RING];

/* The window an attach has mapped and not yet counted in natts (its base
 * last, with release): a fork by another thread meanwhile fences it in
 * the child too, as it would an entry. */
static struct {
	void *base;
	size_t size;
} inflight;

static void inflight_set(const struct mtshm_map *t)
{
	if (!t) {
		/* Base first: a fork between the two stores must not see the
		 * old base with a size of 0 (a fence that fails, the window
		 * left writable in the child). */
		__atomic_store_n(&inflight.base, NULL, __ATOMIC_RELEASE);
		inflight.size = 0;
		return;
	}
	inflight.size = t->size;
	__atomic_store_n(&inflight.base, t->base, __ATOMIC_RELEASE);
}

struct mtc_process mtc_proc = {.once = PTHREAD_ONCE_INIT};

bool mtc_at_load;

/* A new epoch: threads' lanes of the old one are theirs no longer. The
 * gate follows, after the epoch a re-claim reads. */
static void epoch_bump(void)
{
	/* Counted on from the kept copy, not the epoch itself, which a fork
	 * zeroes in the child: a child's epochs differ from every one its
	 * parent's lanes were claimed under. A fork's bit
	 * (MTC_EPOCH_FORKING), raised and lowered by another thread
	 * meanwhile, is kept as it is. */
	uint64_t e = (mtc_proc.epoch_kept + 1) & ~MTC_EPOCH_FORKING;
	mtc_proc.epoch_kept = e;
	uint64_t old = __atomic_load_n(&mtc_w.epoch, __ATOMIC_RELAXED);
	while (!__atomic_compare_exchange_n(&mtc_w.epoch, &old,
	                                    (old & MTC_EPOCH_FORKING) | e, 1,
	                                    __ATOMIC_RELEASE, __ATOMIC_RELAXED))
		;
	uint64_t g = __atomic_load_n(&mtc_w.gate, __ATOMIC_RELAXED);
	while (!__atomic_compare_exchange_n(&mtc_w.gate, &g,
	                                    GATE_EPOCH(e) | (g & GATE_FLAGS), 1,
	                                    __ATOMIC_RELAXED, __ATOMIC_RELAXED))
		;
}

/* The attachment threads publish into, and its kept copy. */
static void cur_set(const struct mtc_attachment *a, int order)
{
	mtc_proc.cur_kept = (uint64_t)(uintptr_t)a;
	__atomic_store_n(&mtc_w.cur, (uint64_t)(uintptr_t)a, order);
}
/* Raised by a registration when the refresh thread should start (read
 * after each full flush: mtc_after_flush). */
uint32_t mtc_refresh_want;

int mtc_debug_on;

void mtc_debug_print(const char *fmt, ...)
{
	char buf[512];
	int n = snprintf(buf, sizeof(buf), "memtally[%d]: ", (int)getpid());
	va_list ap;
	va_start(ap, fmt);
	int m = vsnprintf(buf + n, sizeof(buf) - (size_t)n - 1, fmt, ap);
	va_end(ap);
	if (m < 0)
		return;
	size_t len = (size_t)n + ((size_t)m < sizeof(buf) - (size_t)n - 1
	                              ? (size_t)m
	                              : sizeof(buf) - (size_t)n - 2);
	buf[len++] = '\n';
	ssize_t r = write(2, buf, len);
	(void)r;
}

/*
 * In a forked child: the slot windows it inherited are its parent's slots
 * (or slots the server may since have given to another process). Make
 * them inaccessible, keeping the address range reserved: the child writes
 * only into the slot it will be given at its own registration. Only the
 * forking thread runs in the child, and its lane is dropped by the epoch
 * change, and its quiet publishes (which read the slot's flags before
 * they compare epochs) by mtc_front_force_slow(), so nothing here still
 * points into them.
 */
static void fence(void *base, size_t size, int prot)
{
	if (base)
		(void)mmap(base, size, prot,
		           MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED |
		               MAP_NORESERVE,
		           -1, 0);
}

/* `prot`: PROT_NONE in fork()'s handler; PROT_READ (zero pages) in a
 * child that ran no handler of ours, where a thread may still read its
 * lane's slot flags before it finds the gate changed (mtc_fork_seen). */
static void fence_inherited(bool mine, int prot)
{
	/* The parent's own, and those of ancestors further back that a fork
	 * without our handlers left as they were (fenced_to: a fork that ran
	 * them fenced the rest, and the fork copied that). The ring holds the
	 * last MTC_ATT_RING. */
	uint32_t n = __atomic_load_n(&mtc_proc.natts, __ATOMIC_ACQUIRE);
	uint32_t i = mtc_proc.fenced_to;
	if (n - i > MTC_ATT_RING)
		i = n - MTC_ATT_RING;
	for (; i < n; i++)
		fence(atts[i % MTC_ATT_RING].table.base,
		      atts[i % MTC_ATT_RING].table.size, prot);
	mtc_proc.fenced_to = n;
	/* The attach in flight, if any, unless it is this thread's (a fork
	 * from a signal handler): that goes on in the child, finds its pid
	 * changed since it asked, and unmaps the slot. */
	if (!mine)
		fence(__atomic_load_n(&inflight.base, __ATOMIC_ACQUIRE),
		      inflight.size, prot);
	inflight_set(NULL);
}

/*
 * The descriptors a registration holds open: its socket and the two it
 * received. A fork by another thread meanwhile hands them to the child,
 * where nothing would close them until it execs, and a prefork server
 * never does: the server would see the connection stay open, and the
 * child would hold a read-write descriptor of its uid's whole slot table.
 * Registrations are one at a time (`attaching`), so one set. Each is
 * forgotten before it is closed, so the child never closes a number since
 * reused. (A descriptor is in the process a moment before it is recorded:
 * a fork in that moment still hands it on.)
 */
static int reg_fds[3] = {-1, -1, -1};
/* The thread registering: a fork on that very thread (from a signal
 * handler) returns into the registration in the child, which closes its
 * descriptors itself. */
static pthread_t reg_thread;
/* This thread is in attach(): a fork from a signal handler on it returns
 * into that attach in the child, which must finish it before another
 * starts (the registration's buffers are static: reg_send()). */
static __thread int attach_mine MTC_TLS;

static void reg_fd_keep(int i, int fd)
{
	if (fd >= 0)
		__atomic_store_n(&reg_thread, pthread_self(), __ATOMIC_RELAXED);
	__atomic_store_n(&reg_fds[i], fd, __ATOMIC_SEQ_CST);
}

static void reg_fd_close(int i, int fd)
{
	reg_fd_keep(i, -1);
	close(fd);
}

/*
 * A descriptor of ours moved above the standard three. A daemon that
 * closed its stdio gets 0-2 for the next files it opens; a registration
 * holding one of those numbers would take the program's printf() or a
 * thread's write to stderr into the server's socket, or a file the
 * program opened meanwhile onto a number it did not expect. The new
 * number keeps close-on-exec; if there is none to be had, the old one
 * stays (it is still ours, and only for the registration's moment).
 */
static int fd_above_stdio(int fd)
{
	if (fd < 0 || fd > 2)
		return fd;
	int up = fcntl(fd, F_DUPFD_CLOEXEC, 3);
	if (up < 0)
		return fd;
	close(fd);
	return up;
}

/*
 * fork() begins (the last prepare handler of those registered after ours,
 * the first of those before): from here until our parent or child
 * handler, the forking thread publishes into `fork_pending` (publish.h),
 * and the slot's total is taken now, while this thread holds still (other
 * threads' publishes from here to the fork itself are not in the child's
 * starting total: an undercount of at most a flush each). Its quiet
 * publishes, which would write its lane directly, are off.
 */
static uint64_t fork_att; /* struct mtc_attachment *, as cur */
static int64_t fork_total;

static void on_fork_prepare(void)
{
	if (!mtc_forking) { /* not a fork inside a fork's handlers */
		const struct mtc_attachment *a = cur_att();
		mtshm_store_relaxeds64(&fork_total, a ? slot_total(a) : 0);
		mtshm_store_relaxed64(&fork_att, (uint64_t)(uintptr_t)a);
	}
	mtc_fork_begin();
	mtc_front_force_slow();
}

/* The parent goes on: what the handlers around the fork published goes
 * to its slot, or waits in `pending` for one, as publish_cold's bytes do;
 * and its mapped figure is stored, which a handler may have moved. */
static void on_fork_parent(void)
{
	if (!mtc_fork_end())
		return; /* a fork inside the handlers of another: that one's */
	mtshm_store_relaxed64(&fork_att, 0);
	int64_t p = mtshm_exchange_relaxeds64(&mtc_proc.fork_pending, 0);
	if (p) {
		__atomic_fetch_add(&mtc_proc.pending, p, __ATOMIC_SEQ_CST);
		mtc_pending_redrain();
	}
	/* The figure as the table holds it, under the table's lock: the
	 * one read here could be older than another thread's store by the
	 * time we stored it, and stand until the next change. */
	if (cur_att())
		mtc_mapped_resync();
}

/*
 * A fork's child is a new process. Its starting total is what the parent
 * had published (its slot as the fork began, plus pending), and what the
 * fork's handlers published since; it registers at its next flush. The
 * forking thread's unflushed drift travels in its thread-local state.
 * The child's copy of mtc_w is zero already (publish.h), and so are its
 * attachment, epoch, gate and `attaching`. `parent`: the parent's slot's
 * total, added to `pending` (added: in a child that ran no handler of
 * ours, other threads may be adding too); `mine`: this thread was
 * registering when it forked (from a signal handler), and goes on with
 * that registration.
 */
static void child_starts(int64_t parent, bool mine)
{
	mtshm_store_relaxed64(&fork_att, 0);
	int64_t handlers =
	    __atomic_exchange_n(&mtc_proc.fork_pending, 0, __ATOMIC_RELAXED);
	__atomic_fetch_add(&mtc_proc.pending, parent + handlers,
	                   __ATOMIC_SEQ_CST);
	cur_set(NULL, __ATOMIC_RELEASE);
	/* The parent's attachments are not the child's to count against its
	 * MTC_MAX_ATTACH: a chain of forks that never exec (subshells, a
	 * daemon forking again) would otherwise run out after 16 levels and
	 * count locally, unseen. Their entries stay (the ring overwrites
	 * only older ones), their windows reserved and their headers mapped
	 * read-only: code this very thread was in the middle of (a fork from
	 * a signal handler) still finds them as they were. */
	mtc_proc.natts_base = mtc_proc.natts;
	epoch_bump();
	mtc_fork_reset();
	/* No flags seen in the child. */
	__atomic_and_fetch(&mtc_w.gate, ~GATE_FLAGS, __ATOMIC_RELAXED);
	/* Held on for the attach this thread returns into, which lets it go
	 * at its end (mtc_maybe_attach). */
	__atomic_store_n(&mtc_w.attaching, attach_mine ? 1u : 0u,
	                 __ATOMIC_RELAXED);
	/* A registration of the over-limit callback cut short by the fork
	 * would leave the sequence odd for ever, and the pair torn: drop it. */
	if (mtc_proc.cb_seq & 1) {
		mtc_proc.cb_fn = 0;
		mtc_proc.cb_arg = 0;
		mtc_proc.cb_seq++;
	}
	/* Likewise a memtally_set_group() cut short: the child keeps no
	 * group rather than a torn one. */
	if (mtc_proc.group_seq & 1) {
		memset(mtc_proc.group_w, 0, sizeof(mtc_proc.group_w));
		mtc_proc.group_seq++;
	}
	mtc_proc.next_try_ns = 0;
	mtc_proc.backoff_ns = MTC_BACKOFF_MIN_NS;
	mtc_proc.born_ns = mt_mono_ns();
	mtc_proc.after_exec = 0; /* a fork: this process starts now */
	/* A sample cut short by the fork would hold the turn for ever. */
	mtc_proc.free_turn = 0;
	mtc_proc.free_min_ns = 0;
	mtc_proc.free_next_ns = 0;
	mtc_proc.free_last_ns = 0;
	/* The parent's refresh thread did not come along: the child's
	 * registration arms its own. */
	mtc_proc.refresh_started = 0;
	mtc_refresh_want = 0;
	mtc_proc.answer_lost = 0; /* the parent's registration, not ours */
	mtc_proc.unreached = 0;
	for (int i = 0; !mine && i < 3; i++) {
		int fd = reg_fds[i];
		reg_fds[i] = -1;
		if (fd >= 0)
			close(fd);
	}
	mtc_proc.pid = getpid();
	mtc_front_force_slow();
	__atomic_store_n(&mtc_w.seen, mtc_wipe_on ? 1u : 0u, __ATOMIC_RELEASE);
}

/* fork(), in the child (see child_starts). Only the forking thread runs
 * here. */
static void on_fork_child(void)
{
	/* Being set up: a signal handler that allocates meanwhile must not
	 * set the child up a second time (mtc_fork_seen). */
	__atomic_store_n(&mtc_w.seen, 2, __ATOMIC_RELAXED);
	const struct mtc_attachment *a =
	    (const struct mtc_attachment *)(uintptr_t)mtc_proc.cur_kept;
	int64_t parent = 0;
	/* Read again if another thread re-attached since the prepare. */
	if (a)
		parent =
		    (uint64_t)(uintptr_t)a == mtshm_load_relaxed64(&fork_att)
		        ? mtshm_load_relaxeds64(&fork_total)
		        : slot_total(a);
	/* The thread registering: a fork on that very thread (from a signal
	 * handler) returns into the registration in the child. */
	bool mine = pthread_equal(
	    __atomic_load_n(&reg_thread, __ATOMIC_RELAXED), pthread_self());
	fence_inherited(mine, PROT_NONE);
	child_starts(parent, mine);
}

/* Block every signal but the faults (which stay deliverable), keeping
 * the mask as it was in *old for pthread_sigmask(SIG_SETMASK, old). */
static void block_signals(sigset_t *old)
{
	sigset_t block;
	sigfillset(&block);
	sigdelset(&block, SIGSEGV);
	sigdelset(&block, SIGBUS);
	sigdelset(&block, SIGILL);
	sigdelset(&block, SIGFPE);
	sigdelset(&block, SIGTRAP);
	sigdelset(&block, SIGABRT);
	sigdelset(&block, SIGSYS);
	pthread_sigmask(SIG_BLOCK, &block, old);
}

/*
 * A fork that ran none of our handlers (_Fork(), a raw clone() without
 * CLONE_VM) leaves the child with its parent's state. Its zeroed mtc_w
 * keeps it from writing into its parent's slot meanwhile (a full publish
 * finds no attachment and a stale epoch, a quiet one a gate that differs),
 * and the first of its threads to want the slot, or an mmap counted, sets
 * it up here as on_fork_child would, or its first set-uid call
 * (preload.c). The parent's windows become zero pages, readable: a thread
 * of the child may still hold a lane there, and its quiet publish reads
 * that slot's flags before it compares (it then finds the gate changed).
 * Meanwhile the child's other threads are told false: they count in
 * `pending`, or leave an mmap uncounted, and neither register nor store.
 * Inside a fork's handlers (a fork that does run ours) it waits for
 * on_fork_child, which comes; and a process that never set memtally up
 * has no slot to write into.
 */
bool mtc_fork_seen(void)
{
	uint32_t seen = __atomic_load_n(&mtc_w.seen, __ATOMIC_ACQUIRE);
	if (__builtin_expect(seen == 1, 1) || !mtc_wipe_on)
		return true;
	if (mtc_forking)
		return false;
	if (!__atomic_load_n(&mtc_proc.pid, __ATOMIC_ACQUIRE)) {
		/* No attachment was ever made: nothing of the parent's to
		 * leave. mmap.c's lock may still be held by a thread the
		 * fork left behind. */
		if (seen == 0 && __atomic_compare_exchange_n(
		                     &mtc_w.seen, &seen, 2, 0, __ATOMIC_ACQUIRE,
		                     __ATOMIC_RELAXED)) {
			mtc_mapped_forget();
			__atomic_store_n(&mtc_w.seen, 1, __ATOMIC_RELEASE);
		}
		return __atomic_load_n(&mtc_w.seen, __ATOMIC_ACQUIRE) == 1;
	}
	if (seen == 2)
		return __atomic_load_n(&mtc_w.seen, __ATOMIC_ACQUIRE) == 1;
	/* As attach() runs: no signal handler may enter here again, and no
	 * cancel (close() and the debug line's write() are cancellation
	 * points) may leave `seen` at 2 for ever. Blocked before `seen`
	 * says 2: a handler on this thread in between (one that calls
	 * setuid, which waits for the set-up) would wait for this very
	 * set-up, then give up and drop its uid with the windows open. */
	sigset_t old;
	block_signals(&old);
	if (!__atomic_compare_exchange_n(&mtc_w.seen, &seen, 2, 0,
	                                 __ATOMIC_ACQUIRE, __ATOMIC_RELAXED)) {
		pthread_sigmask(SIG_SETMASK, &old, NULL);
		return __atomic_load_n(&mtc_w.seen, __ATOMIC_ACQUIRE) == 1;
	}
	int cancel;
	pthread_setcancelstate(PTHREAD_CANCEL_DISABLE, &cancel);
	const struct mtc_attachment *a =
	    (const struct mtc_attachment *)(uintptr_t)mtc_proc.cur_kept;
	/* The parent's total as its slot holds it now, not at the fork,
	 * which left no mark: what the parent took or gave back since is
	 * counted in the child too, until the child's own frees and
	 * allocations carry it away. A slot given to another process since
	 * (its generation moved: the parent exited) is not the parent's. */
	int64_t parent =
	    a && mtshm_load_acquire64(&a->slot->generation) == a->slot_gen
	        ? slot_total(a)
	        : 0;
	mtc_debug("a fork ran no handler of ours (_Fork, clone): this child "
	          "registers as itself");
	bool mine = pthread_equal(
	    __atomic_load_n(&reg_thread, __ATOMIC_RELAXED), pthread_self());
	/* The parent's windows, writable still: a child that goes on to
	 * give up its uid (preload.c's set-uid family calls here first) must
	 * not hand them to what it runs then. Zero pages, readable, not
	 * PROT_NONE: a thread's quiet publish may yet read its lane's flags
	 * there (above). */
	fence_inherited(mine, PROT_READ);
	mtc_mapped_forget(); /* mmap.c's, as its fork handler would */
	child_starts(parent, mine);
	pthread_setcancelstate(cancel, NULL);
	pthread_sigmask(SIG_SETMASK, &old, NULL);
	return true;
}

/* Writers of the group exclude one another by making the sequence odd;
 * `only_if_empty` (init's MEMTALLY_GROUP) leaves a group already set by
 * memtally_set_group() in place. */
static void group_store(const char *g, bool only_if_empty)
{
	uint64_t w[MTC_GROUP_MAX / 8] = {0};
	memcpy(w, g, strlen(g)); /* callers checked the length */
	uint32_t seq = mtc_seq_write_begin(&mtc_proc.group_seq);
	bool keep = only_if_empty && __atomic_load_n(&mtc_proc.group_w[0],
	                                             __ATOMIC_RELAXED) != 0;
	for (size_t i = 0; !keep && i < MTC_GROUP_MAX / 8; i++)
		__atomic_store_n(&mtc_proc.group_w[i], w[i], __ATOMIC_RELEASE);
	__atomic_store_n(&mtc_proc.group_seq, seq + 2, __ATOMIC_RELEASE);
}

bool mtc_group_copy(char out[MTC_GROUP_MAX])
{
	uint64_t w[MTC_GROUP_MAX / 8];
	for (int tries = 0; tries < 1000; tries++) {
		uint32_t s1 =
		    __atomic_load_n(&mtc_proc.group_seq, __ATOMIC_ACQUIRE);
		if (s1 & 1) {
			sched_yield();
			continue;
		}
		for (size_t i = 0; i < MTC_GROUP_MAX / 8; i++)
			w[i] = __atomic_load_n(&mtc_proc.group_w[i],
			                       __ATOMIC_ACQUIRE);
		if (__atomic_load_n(&mtc_proc.group_seq, __ATOMIC_RELAXED) ==
		    s1) {
			memcpy(out, w, MTC_GROUP_MAX);
			out[MTC_GROUP_MAX - 1] = 0;
			return true;
		}
	}
	return false;
}

/* The environment, but none of it in a set-uid or file-capability
 * program (AT_SECURE): there whoever runs it sets the variables, and
 * must not choose the server it trusts (MEMTALLY_SOCKET,
 * MEMTALLY_SERVER_UID), how long its malloc may wait
 * (MEMTALLY_REGISTER_TIMEOUT_MS), or the group and task its memory is
 * counted in. MEMTALLY_DISABLE alone is read: it only turns memtally
 * off. */
static const char *env(const char *name)
{
	return secure_getenv(name);
}

static void copy_env(char *dst, size_t cap, const char *name, const char *def)
{
	const char *v = env(name);
	if (!v || !*v)
		v = def;
	size_t n = strlen(v);
	if (n >= cap) {
		/* Cut on a character: cut inside one, the name is not UTF-8,
		 * memtallyd refuses the registration, and the worker is not
		 * counted at all (memtally run and admit refuse such a group
		 * or task; a program may still set one). */
		n = cap - 1;
		while (n > 0 && ((unsigned char)v[n] & 0xC0) == 0x80)
			n--;
	}
	memcpy(dst, v, n);
	dst[n] = 0;
}

/* A count of milliseconds from the environment, as strtoull reads it:
 * `def` when unset, empty or followed by anything; at most `max`. */
static uint64_t env_ms(const char *name, uint64_t def, uint64_t max)
{
	const char *d = env(name);
	if (!d || !*d)
		return def;
	char *end;
	unsigned long long v = strtoull(d, &end, 10);
	if (*end)
		return def;
	return v > max ? max : v;
}

static void init_once(void)
{
	const char *d = env("MEMTALLY_DEBUG");
	mtc_debug_on = d && d[0] == '1';
	d = getenv("MEMTALLY_DISABLE");
	mtc_proc.disabled = d && d[0] == '1';
	d = env("MEMTALLY_ALLOCATOR_FREE");
	mtc_proc.free_off = d && d[0] == '0';
	mtc_proc.refresh_ms =
	    env_ms("MEMTALLY_REFRESH_MS", MTC_REFRESH_MS, MTC_REFRESH_MAX_MS);
	d = env("MEMTALLY_REFRESH_MIN");
	uint64_t min;
	mtc_proc.refresh_min =
	    d && mt_parse_size(d, &min) == 0 ? min : MTC_REFRESH_MIN;
	d = env("MEMTALLY_REGISTER_MIN");
	if (!d || mt_parse_size(d, &min) != 0)
		min = MTC_REGISTER_MIN;
	mtc_proc.register_min = min > INT64_MAX ? INT64_MAX : (int64_t)min;
	mtc_proc.register_after_ns =
	    env_ms("MEMTALLY_REGISTER_AFTER_MS", MTC_REGISTER_AFTER_MS,
	           MTC_REGISTER_AFTER_MAX_MS) *
	    1000000u;
	/* A server known to answer slowly (one under a sanitizer, say) may
	 * be given longer than 500 ms, up to 10 s. Past the timeout the
	 * client goes on unregistered and tries again later (the server may
	 * have registered it all the same: mtc_maybe_attach). 0: the
	 * default (do_register). */
	mtc_proc.register_timeout_ns =
	    env_ms("MEMTALLY_REGISTER_TIMEOUT_MS", MTC_CONNECT_TIMEOUT_MS,
	           MTC_CONNECT_TIMEOUT_MAX_MS) *
	    1000000u;
	const char *sock = env("MEMTALLY_SOCKET");
	if (!sock || !*sock)
		sock = MT_DEFAULT_SOCKET;
	if (strlen(sock) >= sizeof(mtc_proc.sock)) {
		mtc_debug("MEMTALLY_SOCKET too long; not attaching");
		mtc_proc.disabled = 1;
	} else if (sock[0] != '/') {
		/* Relative: resolved against whatever directory the program
		 * is in when it registers (an NFS home, a FUSE mount, where
		 * the lookup can hang inside malloc). */
		mtc_debug("MEMTALLY_SOCKET is not an absolute path; not "
		          "attaching");
		mtc_proc.disabled = 1;
	} else {
		strcpy(mtc_proc.sock, sock);
	}
	const char *su = env("MEMTALLY_SERVER_UID");
	if (su && *su >= '0' && *su <= '9') {
		char *end;
		unsigned long v = strtoul(su, &end, 10);
		if (*end == '\0' && v < UINT32_MAX) {
			mtc_proc.server_uid = (uint32_t)v;
			mtc_proc.has_server_uid = 1;
		}
	}
	char group[MTC_GROUP_MAX];
	copy_env(group, sizeof(group), "MEMTALLY_GROUP", "");
	group_store(group, true);
	copy_env(mtc_proc.task, sizeof(mtc_proc.task), "MEMTALLY_TASK", "");
	/* A process started for an admitted task fulfils a reservation the
	 * scheduler waits on: it registers at its first flush, small or
	 * young as it may be. */
	if (mtc_proc.task[0])
		mtc_proc.register_after_ns = 0;
	if (getrandom(&mtc_proc.image_id, sizeof(mtc_proc.image_id),
	              GRND_NONBLOCK) != sizeof(mtc_proc.image_id))
		mtc_proc.image_id = mt_mono_ns() ^ ((uint64_t)getpid() << 40) ^
		                    (uint64_t)(uintptr_t)&mtc_proc;
	mtc_proc.backoff_ns = MTC_BACKOFF_MIN_NS;
	if (!mtc_proc.born_ns) /* not loaded at start: first used now */
		mtc_proc.born_ns = mt_mono_ns();
	mtc_proc.after_exec = -1;
	mtc_proc.pid = getpid();
	pthread_atfork(on_fork_prepare, on_fork_parent, on_fork_child);
	if (!mtc_group_copy(group))
		group[0] = 0;
	mtc_debug("init: socket=%s group=%s%s", mtc_proc.sock, group,
	          mtc_proc.disabled ? " (disabled)" : "");
}

/* A process's age counts from the library's load (the program's start,
 * for the preloads and a linked libmemtally alike), not from its first
 * use: a linked program that first accounts after a while is not young. */
__attribute__((constructor)) static void mtc_born(void)
{
	mtc_proc.born_ns = mt_mono_ns();
}

bool mtc_init(void)
{
	pthread_once(&mtc_proc.once, init_once);
	return !mtc_proc.disabled;
}

/* ---- registration --------------------------------------------------- */

/* A bump allocator over a caller's buffer, so unpacking never mallocs. */
struct arena {
	uint8_t *buf;
	size_t cap, used;
};

static void *arena_alloc(void *data, size_t size)
{
	struct arena *a = data;
	size_t off = (a->used + 15) & ~(size_t)15;
	if (off + size > a->cap)
		return NULL;
	a->used = off + size;
	return a->buf + off;
}

static void arena_free(void *data, void *p)
{
	(void)data;
	(void)p;
}

struct reg_reply {
	int fds[2]; /* header, slot table; -1 = not received */
	uint32_t slot;
	uint64_t slot_gen;
	uint64_t threshold;
};

static void reply_close(struct reg_reply *r)
{
	for (int i = 0; i < 2; i++)
		if (r->fds[i] >= 0)
			reg_fd_close(1 + i, r->fds[i]);
	r->fds[0] = r->fds[1] = -1;
}

/* recv() that also collects descriptors passed with the bytes: the first
 * two into out->fds, any more closed. */
static ssize_t recv_fds(int fd, void *buf, size_t len, struct reg_reply *out)
{
	union {
		struct cmsghdr h;
		char buf[CMSG_SPACE(4 * sizeof(int))];
	} cm;
	struct iovec iov = {.iov_base = buf, .iov_len = len};
	struct msghdr mh = {.msg_iov = &iov,
	                    .msg_iovlen = 1,
	                    .msg_control = cm.buf,
	                    .msg_controllen = sizeof(cm.buf)};
	ssize_t r = recvmsg(fd, &mh, MSG_CMSG_CLOEXEC);
	if (r < 0)
		return r;
	for (struct cmsghdr *c = CMSG_FIRSTHDR(&mh); c;
	     c = CMSG_NXTHDR(&mh, c)) {
		if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS)
			continue;
		size_t n = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
		for (size_t i = 0; i < n; i++) {
			int got;
			memcpy(&got, CMSG_DATA(c) + i * sizeof(int),
			       sizeof(int));
			got = fd_above_stdio(got);
			if (out->fds[0] < 0)
				reg_fd_keep(1, out->fds[0] = got);
			else if (out->fds[1] < 0)
				reg_fd_keep(2, out->fds[1] = got);
			else
				close(got);
		}
	}
	return r;
}

/*
 * Is the server at the other end of `fd` one we may take descriptors from?
 * Run by root, by our own uid, by the owner of the socket's directory (a
 * service user in a directory of its own), or by MEMTALLY_SERVER_UID (a
 * server in another container of the pod, as another user). Anyone else could
 * be a process that bound the path first, and the descriptors it passes are
 * closed by us when refused: the last close of a lingering TCP socket or
 * of a file on a stuck FUSE mount blocks, inside the program's malloc. In
 * a user namespace that maps neither, root and the directory's owner
 * both read as the overflow uid, and still match. The directory's owner
 * counts only where no one else may write in it: in a shared sticky
 * directory (/tmp) any user could have bound the path, and in a user
 * namespace every unmapped user reads as that owner.
 */
static bool server_trusted(int fd)
{
	struct ucred c;
	socklen_t len = sizeof(c);
	if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &c, &len) < 0)
		return false;
	if (c.uid == 0 || c.uid == geteuid() ||
	    (mtc_proc.has_server_uid && c.uid == mtc_proc.server_uid))
		return true;
	char dir[sizeof(mtc_proc.sock)];
	memcpy(dir, mtc_proc.sock, sizeof(dir));
	struct stat st; /* dirname() works in place: no allocation */
	return stat(dirname(dir), &st) == 0 && st.st_uid == c.uid &&
	       !(st.st_mode & (S_IWGRP | S_IWOTH));
}

/* SO_PASSRIGHTS (Linux 6.16): a socket that refuses SCM_RIGHTS; the
 * sender's sendmsg() fails with EPERM. Older headers lack the name: the
 * generic value, which sparc and parisc do not share (there another
 * option has it), so there only with headers that name it. */
#if !defined(SO_PASSRIGHTS) && !defined(__sparc__) && !defined(__hppa__)
#define SO_PASSRIGHTS 83
#endif

/* A connected, non-blocking socket to the server, or -errno. A Unix
 * socket connect completes or fails at once, except EAGAIN when the
 * backlog is full: the caller treats that as "try later". A server we may
 * not trust (server_trusted) is -EPERM, as if there were none. */
static int reg_connect(void)
{
	int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
	if (fd < 0)
		return -errno;
	fd = fd_above_stdio(fd);
	reg_fd_keep(0, fd);
	/* No descriptor may be queued to us before we know who the server
	 * is: an untrusted one's would be released by our close() below, and
	 * that last close may block. Where the kernel has no such option
	 * (before 6.16), a peer that accepts and sends within the instant
	 * between connect() and the check still can. */
#ifdef SO_PASSRIGHTS
	int no = 0, yes = 1;
	bool gated =
	    setsockopt(fd, SOL_SOCKET, SO_PASSRIGHTS, &no, sizeof(no)) == 0;
#endif
	struct sockaddr_un sa = {.sun_family = AF_UNIX};
	memcpy(sa.sun_path, mtc_proc.sock, strlen(mtc_proc.sock) + 1);
	if (connect(fd, (struct sockaddr *)&sa, sizeof(sa)) < 0) {
		int err = -errno;
		reg_fd_close(0, fd);
		return err;
	}
	if (!server_trusted(fd)) {
		mtc_debug("the server at %s runs as a uid we do not trust; "
		          "not registering",
		          mtc_proc.sock);
		reg_fd_close(0, fd);
		return -EPERM;
	}
#ifdef SO_PASSRIGHTS
	if (gated &&
	    setsockopt(fd, SOL_SOCKET, SO_PASSRIGHTS, &yes, sizeof(yes)) < 0) {
		int err = -errno;
		reg_fd_close(0, fd);
		return err;
	}
#endif
	return fd;
}

/* Send the Register request, naming `group`. */
static int reg_send(int fd, const char *group, bool if_registered,
                    uint64_t deadline)
{
	Memtally__V1__Register reg = MEMTALLY__V1__REGISTER__INIT;
	reg.group = (char *)group;
	reg.task = mtc_proc.task;
	reg.image_id = mtc_proc.image_id;
	reg.layout_major = MTSHM_VERSION_MAJOR;
	reg.layout_minor = MTSHM_VERSION_MINOR;
	reg.client_version = (char *)MEMTALLY_VERSION_STRING;
	reg.if_registered = if_registered;
	Memtally__V1__Request req = MEMTALLY__V1__REQUEST__INIT;
	req.id = 1;
	req.body_case = MEMTALLY__V1__REQUEST__BODY_REGISTER;
	req.register_ = &reg;
	/* Static, as the registration's other buffers: registrations are one
	 * at a time (`attaching`), and this may run on whatever stack the
	 * program gave the thread (16 KiB, a signal handler's). */
	static uint8_t buf[512];
	size_t len = mtframe_pack(&req.base, buf, sizeof(buf));
	if (!len)
		return -EMSGSIZE;
	return mt_send_all(fd, buf, len, deadline);
}

/*
 * Read one whole response frame into buf (cap bytes), collecting the
 * descriptors that come with it into *out. On success *pre is the length
 * prefix's size and *body the body's. The query library's reader cannot
 * serve here: it allocates, and this runs inside the allocator and must
 * take descriptors (SCM_RIGHTS) off the socket as it reads.
 */
static int reg_recv(int fd, uint8_t *buf, size_t cap, uint64_t deadline,
                    struct reg_reply *out, int *pre, uint64_t *body)
{
	size_t got = 0;
	for (;;) {
		*pre = mtframe_decode_len(buf, got, cap - 16, body);
		if (*pre < 0)
			return MEMTALLY_EPROTO;
		if (*pre > 0 && got >= (size_t)*pre + *body)
			return 0;
		ssize_t r = recv_fds(fd, buf + got, cap - got, out);
		if (r > 0) {
			got += (size_t)r;
		} else if (r == 0) {
			return -ECONNRESET;
		} else if (errno == EAGAIN || errno == EINTR) {
			int err = mt_wait_fd(fd, POLLIN, deadline);
			if (err)
				return err;
		} else {
			return -errno;
		}
	}
}

/* Decode the Registered answer (into a stack arena: no malloc here) and
 * keep what the worker needs of it. */
static int reg_decode(const uint8_t *body, size_t len, struct reg_reply *out)
{
	static uint8_t arena_buf[4096]; /* one at a time: reg_send() */
	struct arena ar = {arena_buf, sizeof(arena_buf), 0};
	ProtobufCAllocator alloc = {arena_alloc, arena_free, &ar};
	Memtally__V1__Response *resp =
	    memtally__v1__response__unpack(&alloc, len, body);
	if (!resp)
		return MEMTALLY_EPROTO;
	if (resp->error && resp->error->code ==
	                       MEMTALLY__V1__ERROR_CODE__ERROR_NOT_REGISTERED) {
		/* Asked with if_registered: no earlier image to replace. */
		return MEMTALLY_ENOTFOUND;
	}
	if (resp->error) {
		mtc_debug("server refused registration: %s",
		          resp->error->message ? resp->error->message : "?");
		return MEMTALLY_ESERVER;
	}
	if (resp->body_case != MEMTALLY__V1__RESPONSE__BODY_REGISTERED ||
	    out->fds[0] < 0 || out->fds[1] < 0) {
		/* A server of another layout, or one that could not pass the
		 * descriptors: run as without memtally for now. */
		return MEMTALLY_EPROTO;
	}
	out->slot = resp->registered->slot;
	out->slot_gen = resp->registered->slot_generation;
	out->threshold = resp->registered->threshold;
	return 0;
}

/* Connect, send Register, read Registered and its two descriptors.
 * Returns 0 or a negative code (MEMTALLY_ENOTFOUND: asked if_registered,
 * and the server says the process is not; never for anything else: a
 * missing socket is -ENOENT); on failure no descriptor is left open. */
static int do_register(struct reg_reply *out, bool if_registered)
{
	out->fds[0] = out->fds[1] = -1;
	char group[MTC_GROUP_MAX];
	if (!mtc_group_copy(group))
		return -EAGAIN; /* being changed right now: try later */
	/* 0: set so, or not yet seen by this thread (the calls that attach
	 * without mtc_init are gated on init's `pid`, written without order
	 * to the timeout): the default. */
	uint64_t wait = mtc_proc.register_timeout_ns
	                    ? mtc_proc.register_timeout_ns
	                    : MTC_CONNECT_TIMEOUT_MS * 1000000ull;
	uint64_t deadline = mt_mono_ns() + wait;
	int fd = reg_connect();
	if (fd < 0)
		return fd;
	static uint8_t in[2048]; /* one at a time: reg_send() */
	int pre;
	uint64_t body;
	int err = reg_send(fd, group, if_registered, deadline);
	if (!err)
		err = reg_recv(fd, in, sizeof(in), deadline, out, &pre, &body);
	if (!err)
		err = reg_decode(in + pre, (size_t)body, out);
	reg_fd_close(0, fd);
	if (err)
		reply_close(out);
	return err;
}

/* Map the header (read-only) and take its layout; map the window of our
 * uid's table that holds our slot (read-write), unless `old` already maps
 * that very slot of that very object. */
static int map_reply(struct reg_reply *rep, const struct mtc_attachment *old,
                     struct mtc_attachment *a)
{
	memset(a, 0, sizeof(*a));
	a->table.fd = -1;
	int err = mtshm_map_fd(rep->fds[0], MTSHM_SEALS_HEADER,
	                       MTSHM_HEADER_SIZE, &a->hdr_map);
	if (!err)
		err = mtshm_layout_read(a->hdr_map.base, a->hdr_map.size,
		                        &a->layout);
	if (!err && rep->slot >= a->layout.slot_count)
		err = MEMTALLY_EPROTO;
	if (err) {
		mtc_debug("cannot use the server's header: %s",
		          mtshm_strerror(err));
		mtshm_close(&a->hdr_map);
		return err;
	}
	a->hdr = a->hdr_map.hdr;
	a->slot_index = rep->slot;
	struct stat st;
	if (old && fstat(rep->fds[1], &st) == 0 &&
	    (uint64_t)st.st_dev == old->table.dev &&
	    (uint64_t)st.st_ino == old->table.ino &&
	    old->slot_index == rep->slot &&
	    old->layout.table_size == a->layout.table_size &&
	    old->layout.slot_stride == a->layout.slot_stride &&
	    old->layout.lane_count == a->layout.lane_count) {
		a->table = old->table;
		a->slot = old->slot;
		return 0;
	}
	/* A slot's bytes: its lane_count lines (identity in line 0). */
	uint64_t off = (uint64_t)rep->slot * a->layout.slot_stride;
	err = mtshm_map_window(rep->fds[1], a->layout.table_size, off,
	                       (uint64_t)a->layout.lane_count * MTSHM_LINE,
	                       MTSHM_GUARD, &a->table);
	if (err) {
		mtc_debug("cannot use the slot table: %s", mtshm_strerror(err));
		mtshm_close(&a->hdr_map);
		return err;
	}
	a->slot = (struct mtshm_slot_id *)((char *)a->table.base +
	                                   (off - a->table.off));
	return 0;
}

/* A registered process, or one whose registration went unanswered in
 * time, gets its refresh thread (refresh.c, the preloads only) at its
 * next full flush: not here, where an attach may run inside an mmap the
 * allocator makes under its own locks. */
static void refresh_arm(void)
{
	if (mtc_refresh_start && mtc_proc.refresh_ms &&
	    !mtshm_load_relaxed32(&mtc_proc.refresh_started))
		mtshm_store_relaxed32(&mtc_refresh_want, 1);
}

/* Still single-threaded and below the refresh thread's minimum (see
 * MTC_REFRESH_MIN): heap and mapped bytes together. No minimum after an
 * unanswered registration: the thread is then what registers again. */
static bool refresh_too_small(void)
{
	if (!__libc_single_threaded || !mtc_proc.refresh_min ||
	    mtshm_load_relaxed32(&mtc_proc.answer_lost))
		return false;
	int64_t b = mtc_published_bytes() +
	            (int64_t)mtshm_load_relaxed64(&mtc_proc.mapped);
	return b < 0 || (uint64_t)b < mtc_proc.refresh_min;
}

bool mtc_refresh_claim(uint64_t *period_ms)
{
	/* Not yet: the wish stays, the next full flush asks again. */
	if (refresh_too_small())
		return false;
	uint32_t one = 1;
	if (!__atomic_compare_exchange_n(&mtc_refresh_want, &one, 0, 0,
	                                 __ATOMIC_RELAXED, __ATOMIC_RELAXED))
		return false;
	uint32_t zero = 0;
	if (!__atomic_compare_exchange_n(&mtc_proc.refresh_started, &zero, 1, 0,
	                                 __ATOMIC_RELAXED, __ATOMIC_RELAXED))
		return false;
	*period_ms = mtc_proc.refresh_ms;
	return true;
}

/* The server's tick period from one look at its header: the time from
 * the header's creation (CLOCK_REALTIME) to its last tick, the heartbeat's
 * age bridging the two clocks, over its ticks. For a worker that has not
 * yet seen the ticks move (one that registered just before its server
 * stopped); a guess past a minute (the longest tick) is none. */
static void tick_period_guess(const struct mtshm_header *h, uint64_t ticks,
                              uint64_t hb)
{
	struct timespec ts;
	if (ticks < 2 || clock_gettime(CLOCK_REALTIME, &ts) != 0)
		return;
	uint64_t rt = (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
	uint64_t mono = mt_mono_ns();
	uint64_t created = h->created_ns;
	if (hb > mono || created > rt || rt - created <= mono - hb)
		return;
	uint64_t est = (rt - created - (mono - hb)) / ticks;
	if (est > 0 && est <= UINT64_C(60) * 1000000000u)
		mtshm_store_relaxed64(&mtc_proc.tick_period_ns, est);
}

/*
 * What a flush looks at, for a process that makes none: a server restarted
 * without adopting it (no capability, no record), or one that holds its
 * slot for it and asks it to register again (MTSHM_SLOT_REATTACH). Its
 * count comes back within a round, not at its 128th flush, or never while
 * it stays quiet. Only a heartbeat that has not moved since the last round
 * is judged, and not before the server's tick period is known (the
 * heartbeat's moves over the ticks', or tick_period_guess): a server with
 * a tick of seconds would be taken for gone at every round until then.
 */
static void refresh_look(const struct mtc_attachment *a)
{
	static const void *last_hdr;
	static uint64_t last_ticks, last_hb;
	uint64_t ticks = mtshm_load_relaxed64(&a->hdr->fleet.ticks);
	uint64_t hb = mtshm_load_relaxed64(&a->hdr->fleet.heartbeat_ns);
	bool same = (const void *)a->hdr == last_hdr;
	bool moved = !same || ticks != last_ticks;
	if (same && ticks > last_ticks && hb > last_hb)
		mtshm_store_relaxed64(&mtc_proc.tick_period_ns,
		                      (hb - last_hb) / (ticks - last_ticks));
	else if (!mtshm_load_relaxed64(&mtc_proc.tick_period_ns))
		tick_period_guess(a->hdr, ticks, hb);
	last_hdr = a->hdr;
	last_ticks = ticks;
	last_hb = hb;
	if (mtshm_load_relaxed32(&a->slot->flags) & MTSHM_SLOT_REATTACH) {
		/* Once a back-off: a refusal is not asked again every
		 * round. */
		if (mt_mono_ns() >=
		    mtshm_load_relaxed64(&mtc_proc.next_try_ns)) {
			mtc_debug("the server asks us to register again");
			mtc_maybe_attach(ATTACH_NOW);
		}
	} else if (!moved && mtshm_load_relaxed64(&mtc_proc.tick_period_ns)) {
		mtc_heartbeat_check(a->hdr);
	}
}

/*
 * One round of the refresh thread, whose work is for a process gone
 * quiet. A process is busy while its slot's bytes or flush count move.
 * A busy process's own calls run its allocator's decay, and its full
 * flushes sample the free memory (mtc_free_due). So the round leaves a
 * busy process's allocator alone, but for a sample its front end owes
 * it (mtc_free_refresh_due). Its cost thus does not grow with the time a
 * busy process runs (docs/ARCHITECTURE.md, "The refresh thread"). The
 * first quiet round samples, so a burst of frees is followed one period
 * after it ends. Only the refresh thread calls this.
 */
void mtc_refresh_once(void)
{
	static int64_t last_bytes;
	static uint64_t last_flushes;
	/* Not attached, its answer lost or no server reached: try again
	 * here, since a quiet process makes no flush that would (back-off
	 * permitting). */
	if ((mtshm_load_relaxed32(&mtc_proc.answer_lost) ||
	     mtshm_load_relaxed32(&mtc_proc.unreached)) &&
	    !cur_att())
		mtc_maybe_attach(ATTACH_LAZY);
	const struct mtc_attachment *a = cur_att();
	if (a) {
		refresh_look(a);
		a = cur_att();
	}
	if (a) {
		uint64_t flushes;
		int absurd;
		int64_t bytes = mtshm_slot_sum(a->slot, a->layout.lane_count,
		                               &flushes, &absurd);
		bool busy = bytes != last_bytes || flushes != last_flushes;
		last_bytes = bytes;
		last_flushes = flushes;
		mtc_front_refresh(busy);
	}
	mtc_maps_reconcile(); /* mmap.c's, or the empty default below */
}

/*
 * Register and publish the slot. Called with `attaching` held. On success
 * moves everything counted so far into the new slot. With if_registered,
 * only if the server holds this process already (see image_follows_exec).
 */
static int take_reply(struct reg_reply *rep, pid_t me);

static int attach(bool if_registered)
{
	/* A fork from a signal handler on this thread returns into this
	 * registration in the child, whose atfork handler records its new
	 * pid: the answer is then the parent's. */
	pid_t me = __atomic_load_n(&mtc_proc.pid, __ATOMIC_RELAXED);
	struct reg_reply rep;
	int err = do_register(&rep, if_registered);
	if (err)
		return err;
	/* From the answer on, no handler runs on this thread until the slot
	 * is taken or let go: one that forks between the check below and
	 * the entry's count would leave the child writing the parent's slot
	 * or a window its fork fenced. Nothing here waits (the answer is in);
	 * faults stay deliverable. */
	sigset_t old;
	block_signals(&old);
	err = take_reply(&rep, me);
	pthread_sigmask(SIG_SETMASK, &old, NULL);
	return err;
}

/* attach()'s rest: map what the answer holds and take the slot. */
static int take_reply(struct reg_reply *rep_in, pid_t me)
{
	struct reg_reply rep = *rep_in;
	int err;

	/* Mappings we make stay (threads may still write into an old
	 * table): only a failed attach unmaps what it mapped. */
	const struct mtc_attachment *old = cur_att();
	struct mtc_attachment a;
	err = map_reply(&rep, old, &a);
	reply_close(&rep);
	if (err)
		return err;
	inflight_set(&a.table);
	bool shared_table = old && a.table.base == old->table.base;
	struct mtshm_slot_id *s = a.slot;
	/* The slot's generation, which memtallyd wrote before it answered,
	 * says the slot is this registration's. Its pid is the one memtallyd
	 * sees, the host's for a worker in a container's pid namespace, not
	 * getpid(): compared, such a worker would never attach. */
	/* getpid() too: a fork that ran no handler of ours (_Fork() from a
	 * signal handler that interrupted this registration) left the pid
	 * we recorded as it was, and the answer may be read by the child. */
	if (__atomic_load_n(&mtc_proc.pid, __ATOMIC_RELAXED) != me ||
	    getpid() != me ||
	    mtshm_load_acquire64(&s->generation) != rep.slot_gen) {
		mtc_debug("slot %u is not ours", rep.slot);
		err = MEMTALLY_EPROTO;
		goto fail;
	}
	bool same_slot =
	    shared_table && s == old->slot && rep.slot_gen == old->slot_gen;
	if (same_slot && old->hdr_map.ino == a.hdr_map.ino &&
	    old->hdr_map.dev == a.hdr_map.dev) {
		/* A repeat registration: the server kept us. Nothing moves. */
		mtc_debug("re-registered: slot %u kept", rep.slot);
		inflight_set(NULL);
		mtshm_close(&a.hdr_map);
		return 0;
	}
	if (mtc_proc.natts - mtc_proc.natts_base >= MTC_MAX_ATTACH) {
		mtc_debug("too many re-attachments; counting locally");
		err = -ENOSPC;
		goto fail;
	}
	uint32_t k = mtc_proc.natts;
	struct mtc_attachment *na = &atts[k % MTC_ATT_RING];
	a.slot_gen = rep.slot_gen;
	*na = a;
	/* Written whole before counted: a fork at any moment fences only
	 * complete entries (fence_inherited). */
	__atomic_store_n(&mtc_proc.natts, k + 1, __ATOMIC_RELEASE);
	inflight_set(NULL);
	/* At most what memtallyd's config accepts ([server] threshold, 1
	 * GiB): a peer answering more could make the fronts' windows (2 x
	 * threshold) wrap. */
	if (rep.threshold)
		mtshm_store_relaxed64(&mtc_thresh,
		                      rep.threshold > MTC_THRESH_MAX
		                          ? MTC_THRESH_MAX
		                          : rep.threshold);
	if (same_slot) {
		/* A restarted server adopted our slot and hands us its new
		 * header: lanes and counts stay as they are, threads keep
		 * their lanes (same slot, same epoch). */
		cur_set(na, __ATOMIC_RELEASE);
		mtc_debug("re-registered: slot %u adopted by a new server",
		          rep.slot);
		return 0;
	}
	/* A new slot: carry the total published into the old one. */
	if (old)
		mtshm_add_relaxeds64(&mtc_proc.pending, slot_total(old));
	/* Sequentially consistent, with publish_cold's add to `pending`
	 * and its read of `cur`: either that thread sees the new slot and
	 * drains after its add, or this drain takes its add. Release and
	 * relaxed would allow neither on a weakly ordered CPU (arm64),
	 * leaving its bytes in `pending` until the next attach; on x86 the
	 * store is one xchg more per attach. */
	cur_set(na, __ATOMIC_SEQ_CST);
	/* After `cur`, with release: a thread that reads the new epoch
	 * (publish_cold, with acquire) reads the new attachment after it,
	 * never the old one. Bumped first, a thread could pair the old
	 * slot with the new epoch: claim a lane there after its total was
	 * carried, and go on publishing into it, lost (or, the slot given
	 * to another process since, into that one's figure). */
	epoch_bump();
	mtshm_add_relaxeds64(
	    &s->overflow,
	    __atomic_exchange_n(&mtc_proc.pending, 0, __ATOMIC_SEQ_CST));
	mtc_mapped_resync();
	/* The new slot has no sample of the allocator's free memory: take
	 * one at the next flush, not after the old slot's spacing. */
	mtshm_store_relaxed64(&mtc_proc.free_min_ns, 0);
	mtshm_store_relaxed64(&mtc_proc.free_next_ns, 0);
	mtshm_store_relaxed64(&mtc_proc.free_last_ns, 0);
	refresh_arm();
	mtc_debug("attached: slot %u threshold %llu", rep.slot,
	          (unsigned long long)rep.threshold);
	return 0;

fail:
	inflight_set(NULL);
	if (!shared_table)
		mtshm_close(&a.table);
	mtshm_close(&a.hdr_map);
	return err;
}

/* ---- mapped memory ---------------------------------------------------- */

void mtc_mapped_store(uint64_t total)
{
	mtshm_store_relaxed64(&mtc_proc.mapped, total);
	const struct mtc_attachment *a = cur_att();
	/* Inside fork() the slot may be the parent's (publish.h): our parent
	 * handler stores the figure, and a child's registration. */
	if (a && !mtc_forking)
		mtshm_store_relaxeds64(&mtshm_lane(a->slot, 0)->mapped,
		                       (int64_t)total);
}

/* Where mapped memory is not counted, there is nothing to resync. */
__attribute__((weak)) void mtc_mapped_resync(void)
{
}

/* Nor anything to forget at a fork. */
__attribute__((weak)) void mtc_mapped_forget(void)
{
}

/* Nor anything to reconcile. */
__attribute__((weak)) void mtc_maps_reconcile(void)
{
}

__attribute__((weak)) void mtc_maps_reconcile_now(void)
{
}

/* ---- the library's front ends (mtc_fronts) ---------------------------- */

int mtc_front_flush(void)
{
	for (const struct mtc_front *const *f = mtc_fronts; *f; f++)
		(*f)->flush();
	return 0;
}

int64_t mtc_front_drift(void)
{
	int64_t d = 0;
	for (const struct mtc_front *const *f = mtc_fronts; *f; f++)
		d += (*f)->drift();
	return d;
}

void mtc_front_force_slow(void)
{
	for (const struct mtc_front *const *f = mtc_fronts; *f; f++)
		(*f)->force_slow();
}

void mtc_front_sample(void)
{
	for (const struct mtc_front *const *f = mtc_fronts; *f; f++)
		if ((*f)->sample)
			(*f)->sample();
}

void mtc_front_refresh(bool busy)
{
	for (const struct mtc_front *const *f = mtc_fronts; *f; f++)
		if ((*f)->refresh)
			(*f)->refresh(busy);
}

void mtc_mapped_changed(void)
{
	/* Only once the process set memtally up (its first allocation did):
	 * an mmap may come from inside a program's own allocator, where
	 * setting up (which allocates) is not safe. */
	if (mtc_proc.pid && !cur_att())
		mtc_maybe_attach(ATTACH_LAZY);
	/* A process that grows by mapping rather than by malloc (pymalloc's
	 * arenas) may pass the refresh thread's minimum here. The thread is
	 * not started here: this mapping may be made by the program's own
	 * allocator under its locks, and pthread_create allocates. The
	 * calling thread's next allocator call takes the slow path instead,
	 * whose full flush starts it. */
	if (mtshm_load_relaxed32(&mtc_refresh_want) && !refresh_too_small())
		mtc_front_force_slow();
}

/*
 * Is the process worth a registration yet? Not while it is both young
 * (born less than MEMTALLY_REGISTER_AFTER_MS ago: the server's default
 * tick) and small (less than MEMTALLY_REGISTER_MIN published). The server
 * sums the slots once a tick, so a process that dies within a tick of its
 * start is in no total whether it registered or not. A registration
 * costs both sides CPU, which a build's many short processes would pay
 * for nothing (docs/ARCHITECTURE.md, "Slot protocol"). A process that is
 * still allocating registers at its first flush past either bound, with
 * everything it counted. One that goes quiet young and small is left out
 * of the figure: at most MEMTALLY_REGISTER_MIN plus its threads' drift.
 */
static bool worth_registering(uint64_t now)
{
	int64_t b = mtshm_load_relaxeds64(&mtc_proc.pending) +
	            (int64_t)mtshm_load_relaxed64(&mtc_proc.mapped);
	return now - mtc_proc.born_ns >= mtc_proc.register_after_ns ||
	       mtc_proc.register_min == 0 || b >= mtc_proc.register_min;
}

/* The process's start time, field 22 of /proc/self/stat, in clock ticks
 * since boot; 0 if it cannot be read. Reads into the stack: no malloc. */
static uint64_t proc_start_ticks(void)
{
	char buf[1024];
	int cancel;
	pthread_setcancelstate(PTHREAD_CANCEL_DISABLE, &cancel); /* as attach */
	int fd = open("/proc/self/stat", O_RDONLY | O_CLOEXEC);
	ssize_t n = fd < 0 ? -1 : read(fd, buf, sizeof(buf) - 1);
	if (fd >= 0)
		close(fd);
	pthread_setcancelstate(cancel, NULL);
	if (n <= 0)
		return 0;
	buf[n] = 0;
	char *p = strrchr(buf, ')'); /* the name may hold spaces and ')' */
	if (!p)
		return 0;
	/* Fields 3 to 21 after the name, then the start time. */
	for (int field = 2; field < 22 && *p; p++)
		if (*p == ' ')
			field++;
	uint64_t t = 0;
	for (; *p >= '0' && *p <= '9'; p++)
		t = t * 10 + (uint64_t)(*p - '0');
	return t;
}

/*
 * Might this image have replaced an older one of the same process: an
 * exec by a shell or a worker that had lived a while? That image may have
 * registered, and memtallyd shows its figure under this pid until this
 * image registers. So such an image asks at its first flush to register
 * if (and only if) the server holds its process already (mtc_maybe_attach).
 * Known once, at the first flush that would otherwise wait (a fork knows
 * at once: it starts a process): the process's age from its start time
 * in /proc/self/stat against this image's. The start time counts in
 * clock ticks (10 ms), hence the margin. It only filters: a launcher that
 * took long between its fork and this image's start (a loaded machine, a
 * sanitizer's start-up) looks the same, and the server's answer tells.
 */
static bool image_follows_exec(uint64_t now)
{
	int32_t known = __atomic_load_n(&mtc_proc.after_exec, __ATOMIC_RELAXED);
	if (known >= 0)
		return known;
	bool after = false;
	uint64_t ticks = proc_start_ticks();
	long hz = sysconf(_SC_CLK_TCK);
	struct timespec ts;
	if (ticks && hz > 0 && clock_gettime(CLOCK_BOOTTIME, &ts) == 0) {
		uint64_t boot =
		    (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
		uint64_t start = ticks * (1000000000u / (uint64_t)hz);
		uint64_t proc_age = boot > start ? boot - start : 0;
		uint64_t image_age = now - mtc_proc.born_ns;
		after = proc_age > image_age + 2 * (1000000000u / (uint64_t)hz);
	}
	__atomic_store_n(&mtc_proc.after_exec, after, __ATOMIC_RELAXED);
	return after;
}

/* Try to (re)attach if the back-off allows and nobody else is at it. */
void mtc_maybe_attach(enum attach_ask ask)
{
	/* Not at the preload's start: that would put a round trip to
	 * memtallyd into every process's start (docs/ARCHITECTURE.md, "Slot
	 * protocol"). The bytes wait in `pending` until a flush finds the
	 * process worth registering. */
	if (mtc_proc.disabled || mtc_at_load)
		return;
	/* Not from inside fork()'s handlers (publish.h): a child would
	 * register as its parent, whose pid it still has. */
	if (mtc_forking)
		return;
	/* The child of a fork that ran no handler of ours is set up first:
	 * until then it would register as its parent. */
	if (!mtc_fork_seen())
		return;
	/* Past its attachments, every path of a registration but a repeat
	 * of the current one ends refused (take_reply): do not register at
	 * all. Registering anyway cost memtallyd a round trip every back-off
	 * and showed it a registered process of 0 bytes. */
	if (mtc_proc.natts - mtc_proc.natts_base >= MTC_MAX_ATTACH) {
		static uint32_t said;
		if (!__atomic_exchange_n(&said, 1, __ATOMIC_RELAXED))
			mtc_debug("too many re-attachments; counting locally");
		return;
	}
	uint64_t now = mt_mono_ns();
	/* ATTACH_NOW passes the back-off of a refused or failed attempt
	 * (cheap: no server there), not that of one that waited out its
	 * timeout (a server stopped or stuck): a program calling
	 * memtally_flush() per request would otherwise wait that long at
	 * every call. */
	if ((ask != ATTACH_NOW || mtshm_load_relaxed32(&mtc_proc.waited)) &&
	    now < mtshm_load_relaxed64(&mtc_proc.next_try_ns))
		return;
	bool if_registered = false;
	if (ask == ATTACH_LAZY && !worth_registering(now)) {
		if (!image_follows_exec(now))
			return;
		if_registered = true;
	}
	/* Not on a signal handler's alternate stack (SIGSTKSZ is 8 KiB): a
	 * registration may need more than it has left. A later call off it
	 * registers. One system call, made only while not attached. */
	stack_t alt;
	if (sigaltstack(NULL, &alt) == 0 && (alt.ss_flags & SS_ONSTACK))
		return;
	uint32_t zero = 0;
	if (!__atomic_compare_exchange_n(&mtc_w.attaching, &zero, 1, 0,
	                                 __ATOMIC_ACQUIRE, __ATOMIC_RELAXED))
		return;
	/* connect, poll, recvmsg and close are cancellation points; malloc
	 * and free, from which this runs, are not. A pending cancel must not
	 * unwind the thread out of them: a block lost, a lock of the
	 * program's held, `attaching` left set (no registration ever again)
	 * and the socket leaked. */
	int cancel;
	pthread_setcancelstate(PTHREAD_CANCEL_DISABLE, &cancel);
	attach_mine = 1;
	int err = attach(if_registered);
	attach_mine = 0;
	pthread_setcancelstate(cancel, NULL);
	if (err == MEMTALLY_ENOTFOUND && if_registered) {
		/* No older image registered: wait for the bounds, as any
		 * young process does. Not a failure: no back-off. */
		mtc_debug("no earlier image registered; registering later");
		__atomic_store_n(&mtc_proc.after_exec, 0, __ATOMIC_RELAXED);
		mtshm_store_relaxed32(&mtc_proc.answer_lost, 0);
	} else if (err) {
		mtc_debug("attach failed: %s; retry in %llu ms",
		          memtally_strerror(err),
		          (unsigned long long)(mtc_proc.backoff_ns / 1000000u));
		/* Unanswered in time: the server may have registered us with
		 * a slot we do not know, which shows 0 bytes until we
		 * register again. A busy process does so at a flush past the
		 * back-off; a quiet one makes none, so the refresh thread
		 * tries for it. */
		if (err == -ETIMEDOUT && !cur_att()) {
			mtshm_store_relaxed32(&mtc_proc.answer_lost, 1);
			refresh_arm();
		} else if (err == MEMTALLY_ESERVER ||
		           err == MEMTALLY_ENOTFOUND) {
			/* Answered (no slot free, say), and an earlier request
			 * was read before this one: no late slot to claim. */
			mtshm_store_relaxed32(&mtc_proc.answer_lost, 0);
		}
		/* No server reached (none yet, or gone): a quiet process
		 * makes no flush that would try again, so its refresh
		 * thread does, past the back-off (a process that started
		 * or exec'd while memtallyd was down was never counted
		 * while it stayed quiet). Within the thread's minimum, as
		 * any arming. A refusal is an answer: no asking every 5 s
		 * for ever. */
		bool answered = err <= MEMTALLY_EPROTO &&
		                err >= MEMTALLY_EBADREQUEST; /* the server's */
		mtshm_store_relaxed32(&mtc_proc.unreached,
		                      !answered && err != -ETIMEDOUT);
		if (!answered && !cur_att())
			refresh_arm();
		/* From the end of the attempt, not its start: an attempt
		 * that waited out its timeout (a server stopped or stuck)
		 * would otherwise be due again at once. And after such a
		 * wait, the next one is at least MTC_BACKOFF_WAITED times as
		 * far off, so the calls that wait spend no more than about a
		 * tenth of the process's time in them. */
		uint64_t end = mt_mono_ns();
		uint64_t backoff = mtc_proc.backoff_ns;
		if (backoff > MTC_BACKOFF_MAX_NS)
			backoff = MTC_BACKOFF_MAX_NS;
		/* Past MTC_BACKOFF_MAX_NS too: a timeout of 10 s must not
		 * be waited two thirds of the time. */
		if (err == -ETIMEDOUT &&
		    backoff < MTC_BACKOFF_WAITED * (end - now))
			backoff = MTC_BACKOFF_WAITED * (end - now);
		mtshm_store_relaxed64(&mtc_proc.next_try_ns, end + backoff);
		mtshm_store_relaxed32(&mtc_proc.waited, err == -ETIMEDOUT);
		mtc_proc.backoff_ns = backoff * 2;
		if (mtc_proc.backoff_ns > MTC_BACKOFF_MAX_NS)
			mtc_proc.backoff_ns = MTC_BACKOFF_MAX_NS;
	} else {
		mtc_proc.backoff_ns = MTC_BACKOFF_MIN_NS;
		mtshm_store_relaxed32(&mtc_proc.unreached, 0);
		mtshm_store_relaxed32(&mtc_proc.waited, 0);
		mtshm_store_relaxed64(&mtc_proc.next_try_ns,
		                      now + MTC_STALE_NS);
		mtshm_store_relaxed32(&mtc_proc.answer_lost, 0);
	}
	__atomic_store_n(&mtc_w.attaching, 0, __ATOMIC_RELEASE);
}

/* ---- public API shared by both front ends ---------------------------- */

int memtally_flush(void)
{
	if (!mtc_init())
		return MEMTALLY_EDISABLED;
	/* Asked, so attached now, however young or small the process, and
	 * before the flush, which publishes into the slot. The calling
	 * thread's next call takes its slow path, and the server's
	 * threshold with it (its earlier flushes, deferred, set it up with
	 * the default one). */
	bool fresh = !cur_slot();
	if (fresh) {
		mtc_maybe_attach(ATTACH_NOW);
		if (cur_slot())
			mtc_front_force_slow();
	}
	mtc_front_flush();
	mtc_maps_reconcile_now(); /* pages given back or touched again */
	if (fresh && cur_slot())
		mtc_front_sample(); /* the new slot's first sample */
	/* Registered by this call: the refresh thread now, not at the next
	 * flush (the program's own call, outside any allocator). */
	if (mtshm_load_relaxed32(&mtc_refresh_want))
		mtc_refresh_start();
	return cur_slot() ? 0 : MEMTALLY_ENOTATTACHED;
}

int memtally_set_group(const char *group)
{
	if (!group || strlen(group) >= MTC_GROUP_MAX)
		return -EINVAL;
	/* Before init, this wins over MEMTALLY_GROUP; after, it applies at
	 * the next registration. */
	group_store(group, false);
	return 0;
}

bool memtally_attached(void)
{
	/* A process that has not flushed since its start has not tried to
	 * register yet: the question is the moment to (back-off permitting). */
	if (!cur_slot() && mtc_proc.pid) {
		mtc_maybe_attach(ATTACH_ASKED);
		if (cur_slot())
			mtc_front_force_slow(); /* as in memtally_flush() */
		/* The program's own call: the refresh thread now, for a
		 * registration made or left unanswered here. */
		if (mtshm_load_relaxed32(&mtc_refresh_want))
			mtc_refresh_start();
	}
	return cur_slot() != NULL;
}
