/*
 * rss.c - the resident set of every registered worker, read from
 * /proc/PID/status every rss_interval, not every tick.
 *
 * A worker's resident figure is the memory it holds that the node would
 * not hold without it: its anonymous and shared memory (RssAnon +
 * RssShmem), not its file pages. Those are the page cache's: a library
 * or an interpreter is resident once however many processes map it, is
 * often charged to whoever read it first (another cgroup), and is clean
 * and reclaimed before anyone is killed. VmRSS counts it in every
 * process, so a sum of VmRSS over a fleet of python3 workers counts
 * ~6 MiB per worker that the node holds once or not at all.
 *
 * Reading status is a small open/read/close, but for thousands of workers
 * that is milliseconds of blocking syscalls, which the loop must not spend
 * between two ticks. So a sweep copies (pid, start time) of every
 * registered process and reads their status files on a thread of its own.
 * The tick (mts_rss_poll) applies the results to the processes still
 * registered with the same pid and start time. Only one sweep is in
 * flight at a time. A timer that fires during one is skipped.
 *
 * A read may never return. smaps_rollup waits for the process's mmap
 * lock, and a process can hold that lock for as long as it likes: a
 * thread faulting on a page of a FUSE file its own daemon never serves,
 * with a second thread's mmap queued behind it. So the reader is a
 * detached thread, not the libuv pool's (a pool thread stuck in a read
 * would hold up every later sweep, and libuv joins its pool at exit, so
 * memtallyd could not even stop). The tick watches which entry the
 * reader is on. One that takes longer than its limit (MTS_RSS_STALL_MS,
 * more for a process whose walk is long) abandons the sweep: the entries
 * read so far are applied, the process's figures come from
 * /proc/PID/status from then on (a read that takes no lock of its), and
 * the stuck thread frees the sweep if it ever returns. A uid with
 * MTS_RSS_STUCK_PER_UID readers stuck on its processes has all of them
 * read from status; past MTS_RSS_STUCK_MAX stuck readers in all, every
 * sweep reads status only (each costs a thread).
 *
 * The sweep thread touches nothing but its own array, because the
 * registry is never read off the loop thread. If a process exits and its
 * pid is reused during the sweep, the newcomer's RSS may be read for it.
 * The start-time check drops such a result once the registry saw the
 * exit. Otherwise the next sweep corrects it.
 *
 * A newly registered process shows RSS 0 until the next sweep, at most
 * rss_interval later. Registration itself reads nothing more from /proc.
 *
 * For a process of an untrusted uid the sweep reads /proc/PID/smaps_rollup
 * instead. It gives the kernel's figure that vouch.c sets the claim
 * against: proportional anonymous, shared and swapped memory. A page
 * shared by n processes, after fork or through a shared mapping, thus
 * counts once in all. The resident figure is proportional too (Pss), so an
 * untrusted process's VmRSS is never summed. A full sweep also reads which
 * memfds the process holds (/proc/PID/fd). Memory written into a memfd
 * that nothing maps is in no one's resident set, and would otherwise be
 * invisible. Each memfd is charged once per sweep, to the first holder
 * read. memtallyd's own memfds (the header and the slot tables every
 * worker holds) are never charged. A full sweep also charges what an
 * untrusted process's descendants that never registered hold to it
 * (family_read), and reads what is below each run (mts_resv_runs: a
 * `memtally run`) and never registered, by the same rules, for its
 * reservation (admit.c, mts_resv_run_read: a static binary's kind
 * learns its size). Between two full sweeps,
 * mts_rss_sweep_vouch() reads just the processes whose claims ran ahead of
 * their figures.
 *
 * smaps_rollup walks the process's page tables, so its cost grows with
 * the resident pages (see bench/results/server.md). A full sweep therefore
 * starts no sooner than MTS_RSS_DUTY times its predecessor's duration
 * after it. A process's early reads wait MTS_VOUCH_READ_DUTY times its
 * last read's cost. The sweeps thus take at most a fraction of one
 * thread, whatever the fleet holds.
 *
 * The group and fleet RSS sums move with every change of a process's RSS
 * (mts_proc_set_rss). They always equal the sum over registered
 * processes, as the accounted bytes do.
 */
#include "mts_rss.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <linux/kcmp.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include "mts_admit.h"
#include "mts_defs.h"
#include "mtcommon.h"
#include "mts_log.h"
#include "mts_procfs.h"
#include "mts_registry.h"
#include "mts_state.h"
#include "mts_vouch.h"

/* A full sweep starts at least this many times its predecessor's
 * duration after that one started. */
#define MTS_RSS_DUTY 4u

/* A read may take this long, and MTS_RSS_STALL_PAGE_NS per resident page
 * and MTS_RSS_STALL_COST times its last read's cost more, before its
 * sweep is given up (about 50 ns per page is the walk's cost). */
#define MTS_RSS_STALL_MS 2000u
/* The same for a process whose resident size is not known yet. */
#define MTS_RSS_STALL_FIRST_MS 10000u
#define MTS_RSS_STALL_PAGE_NS  200u
#define MTS_RSS_STALL_COST     16u
/* Readers stuck in a read on one uid's processes, and in all, before
 * sweeps read that uid's, and everyone's, status only. */
#define MTS_RSS_STUCK_PER_UID 2
#define MTS_RSS_STUCK_MAX     16
/* The reader's stack: a few pages of buffers. */
#define MTS_RSS_STACK (256u * 1024u)

struct rss_entry {
	uint32_t pid;
	uint32_t uid;
	int err;
	bool kernel;       /* an untrusted process: smaps_rollup, for vouch.c */
	bool memfds;       /* and the memfds it holds (full sweeps) */
	bool smaps;        /* with `kernel`: smaps_rollup, not status */
	bool uids;         /* and its uids (in reach of a leaver: it may
	                      leave too) */
	uint64_t stall_ns; /* the read's limit (the loop's) */
	uint64_t start_time;
	uint64_t image_id; /* of the image read: an exec registers another */
	uint64_t rss;
	uint64_t anon;            /* RssAnon */
	uint64_t read_ns;         /* CLOCK_MONOTONIC before the read */
	struct mts_kernel_mem km; /* with `kernel` */
	uint64_t memfd;           /* with `memfds` */
	uint64_t cost_ns;         /* of the read, with `kernel` */
	/* With `family`: what its descendants that never registered hold
	 * (see family_read) and how many were read. */
	bool family;
	/* A run's (mts_resv_runs): only its unregistered descendants are
	 * read, for its reservation; err -ESRCH when it is gone. */
	bool run;
	bool family_cut; /* its uid's budget ran out before its walk ended */
	uint64_t family_held;
	uint64_t family_rss;
	uint64_t family_shmem; /* of family_held */
	uint32_t family_n;
};

/* memfd inodes charged in this sweep, or never to be charged. */
struct ino_set {
	struct {
		uint64_t dev, ino;
	} * e; /* ino 0 = empty */
	uint32_t cap, n;
	/* The device every memfd is on (the kernel's one internal shmem
	 * mount): that of memtallyd's own segment. */
	uint64_t memfd_dev;
};

/* Owned by the reader and the loop until both let go (`refs`). The
 * reader writes the entries and `seen`, and publishes each finished entry
 * by moving `at` on; the loop reads only entries below `at`. */
struct mts_rss_sweep {
	atomic_uint at;        /* the entry being read; n when done */
	atomic_uint progress;  /* moved by every descendant read, too */
	atomic_int refs;       /* the reader's and the loop's */
	atomic_bool abandoned; /* the loop let go before the end */
	uint32_t stuck_uid;    /* with `abandoned`: whose process it is on */
	uint64_t done_ns;      /* the reader's, before `at` reaches n */
	bool full;
	uint64_t started_ns;
	uint32_t seen_at;       /* the loop's: `at` when last seen to move, */
	uint32_t seen_progress; /* or `progress`, */
	uint64_t seen_at_ns;    /* and when */
	struct ino_set seen;
	uint32_t n;
	struct rss_entry e[];
};

/* Readers abandoned in a read that has not returned yet, process-wide
 * (`rss_stuck`, read without the lock for the common case of none), and
 * by the uid of the process each waits on. */
static atomic_int rss_stuck;
static pthread_mutex_t stuck_lock = PTHREAD_MUTEX_INITIALIZER;
static struct {
	uint32_t uid, n;
} stuck_by_uid[MTS_RSS_STUCK_MAX];

static void stuck_add(uint32_t uid, int d)
{
	pthread_mutex_lock(&stuck_lock);
	atomic_fetch_add(&rss_stuck, d);
	int free_i = -1;
	for (int i = 0; i < MTS_RSS_STUCK_MAX; i++) {
		if (stuck_by_uid[i].n && stuck_by_uid[i].uid == uid) {
			stuck_by_uid[i].n =
			    (uint32_t)((int)stuck_by_uid[i].n + d);
			free_i = -2;
			break;
		}
		if (!stuck_by_uid[i].n && free_i == -1)
			free_i = i;
	}
	if (d > 0 && free_i >= 0) { /* past the table: the total counts */
		stuck_by_uid[free_i].uid = uid;
		stuck_by_uid[free_i].n = (uint32_t)d;
	}
	pthread_mutex_unlock(&stuck_lock);
}

/* May `uid`'s processes be read through smaps_rollup? */
static bool smaps_allowed(uint32_t uid)
{
	int all = atomic_load_explicit(&rss_stuck, memory_order_relaxed);
	if (all == 0)
		return true;
	if (all >= MTS_RSS_STUCK_MAX)
		return false;
	bool ok = true;
	pthread_mutex_lock(&stuck_lock);
	for (int i = 0; i < MTS_RSS_STUCK_MAX; i++)
		if (stuck_by_uid[i].n && stuck_by_uid[i].uid == uid)
			ok = stuck_by_uid[i].n < MTS_RSS_STUCK_PER_UID;
	pthread_mutex_unlock(&stuck_lock);
	return ok;
}

static uint32_t ino_hash(uint64_t dev, uint64_t ino)
{
	uint64_t h = (ino ^ (dev << 32)) * UINT64_C(0x9e3779b97f4a7c15);
	return (uint32_t)(h >> 32);
}

/* Add (dev, ino); false if it was there. Out of memory, every inode is
 * new: a memfd is charged twice rather than hidden. */
static bool ino_add(struct ino_set *s, uint64_t dev, uint64_t ino)
{
	if (ino == 0)
		return true;
	if (2 * (s->n + 1) > s->cap) {
		uint32_t cap = s->cap ? 2 * s->cap : 64;
		struct ino_set t = {calloc(cap, sizeof(*t.e)), cap, 0,
		                    s->memfd_dev};
		if (!t.e)
			return true;
		for (uint32_t i = 0; i < s->cap; i++)
			if (s->e[i].ino)
				ino_add(&t, s->e[i].dev, s->e[i].ino);
		free(s->e);
		*s = t;
	}
	for (uint32_t i = ino_hash(dev, ino) & (s->cap - 1);;
	     i = (i + 1) & (s->cap - 1)) {
		if (s->e[i].ino == 0) {
			s->e[i].dev = dev;
			s->e[i].ino = ino;
			s->n++;
			return true;
		}
		if (s->e[i].ino == ino && s->e[i].dev == dev)
			return false;
	}
}

/* The bytes of the memfds `pid` holds that no earlier entry of this sweep
 * held. One readlink per descriptor, and a stat per memfd. */
static uint64_t memfd_bytes(struct ino_set *seen, uint32_t pid)
{
	char path[32];
	snprintf(path, sizeof(path), "/proc/%u/fd", pid);
	int dfd = open(path, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	if (dfd < 0)
		return 0;
	DIR *d = fdopendir(dfd);
	if (!d) {
		close(dfd);
		return 0;
	}
	uint64_t bytes = 0;
	static const char prefix[] = "/memfd:";
	for (struct dirent *de; (de = readdir(d));) {
		if (de->d_name[0] == '.')
			continue;
		char link[sizeof(prefix)];
		ssize_t n = readlinkat(dfd, de->d_name, link, sizeof(link));
		if (n < (ssize_t)sizeof(prefix) - 1 ||
		    memcmp(link, prefix, sizeof(prefix) - 1) != 0)
			continue;
		/* The descriptor may have been replaced since the readlink
		 * (dup2 by its owner) by a file of a filesystem that answers
		 * a stat slowly or never (FUSE, a dead NFS server): cached
		 * attributes only, so the sweep never waits on one. */
		struct statx st;
		if (statx(dfd, de->d_name, AT_STATX_DONT_SYNC,
		          STATX_INO | STATX_BLOCKS, &st) < 0)
			continue;
		uint64_t dev = makedev(st.stx_dev_major, st.stx_dev_minor);
		/* A link's text is the path as its holder's mount namespace
		 * has it, and any user can make one of their own (unshare
		 * -Urm) with a file of a disk at "/memfd:x": only the memfd
		 * device says it is one. A hugetlb memfd is not charged
		 * either: its pages come from the huge page pool, which no
		 * process's resident figure holds. */
		if (dev != seen->memfd_dev)
			continue;
		if (ino_add(seen, dev, (uint64_t)st.stx_ino))
			bytes =
			    mt_sat_add(bytes, (uint64_t)st.stx_blocks * 512u);
	}
	closedir(d);
	return bytes;
}

static uint64_t sat_sub(uint64_t a, uint64_t b)
{
	return a > b ? a - b : 0;
}

void mts_proc_set_rss(struct mts_registry *reg, struct mts_proc *p,
                      uint64_t rss)
{
	struct mts_group *g = &reg->groups[p->group];
	g->rss = mt_sat_add(sat_sub(g->rss, p->rss), rss);
	reg->totals.rss = mt_sat_add(sat_sub(reg->totals.rss, p->rss), rss);
	p->rss = rss;
	p->rss_heap = sat_sub(p->bytes, p->allocator_free);
	p->rss_heap_peak = p->rss_heap;
	p->rss_known = true;
}

/* The resident figure of a trusted process: RssAnon + RssShmem from
 * /proc/PID/status (statm's `shared` lumps file and shmem pages
 * together), and RssAnon alone in *anon. 0 or -errno. */
static int read_own(pid_t pid, struct mts_kernel_mem *km)
{
	/* status alone (no smaps_rollup), through a live thread's when the
	 * main thread has exited: vouch.c's read. */
	return mts_read_kernel_mem((int)pid, false, km);
}

/*
 * A worker's descendants that never registered: fork children making no
 * allocator call (pause(), a blocked read), a program exec'd without the
 * preload (a static binary, a Go program). They hold memory that no slot
 * claims. Worse, for an untrusted worker they share its pages, so its
 * proportional figure is 1/(n+1) of what they hold together: nobody
 * holding 400 MiB with nine such children counted 40 MiB, past its
 * allowance, and another user's honest process was signalled in its
 * place. So a full sweep charges each untrusted worker's unregistered
 * descendants' proportional figures (smaps_rollup) to it. The walk stops
 * at a registered descendant, which counts itself and its own.
 *
 * What counts toward others must never be more than the memory is, or
 * one user's descendants could take the fleet over and deny everyone:
 *  - only proportional figures: a descendant is never read through
 *    status, which counts each page it shares in full (a thousand
 *    children of a 1 GiB mapping made 130 GiB of it). A worker whose own
 *    reads fall back to status charges none.
 *  - one address space once: a child made with CLONE_VM (vfork, and
 *    posix_spawn before its exec; a clone helper) shows the whole shared
 *    memory as its own. Each descendant is compared (kcmp KCMP_VM, by a
 *    binary search in kcmp's order) with the worker, those already
 *    read, and the registered children met (a CLONE_VM|CLONE_PARENT
 *    clone of one is a child of its parent); through a live thread
 *    where the main one exited (its task has no address space: all
 *    such would compare equal); a compared process that exited since is
 *    dropped from the search, not taken for an equal. Without kcmp none
 *    is charged.
 *  - the process read is the one scanned: its start time is checked
 *    again after the read (a pid reused meanwhile is someone else's).
 *  - a memfd the worker holds and a descendant maps counts once: the
 *    memfds it holds count as the larger of their size and the shared
 *    memory it and its descendants map (the rule for the worker alone
 *    before), which cannot tell a memfd's mapping from other shared
 *    memory: what they map of another kind hides as much of an
 *    unmapped memfd, never more than it maps itself. Counted once in
 *    all rather than twice, which would let one user deny others.
 * And bounded: MTS_RSS_FAMILY_MAX descendants per uid per sweep, past
 * which the walk stops (said once per worker); no descriptor walk for
 * them (a memfd they hold is most often their parent's too); each read
 * moves the sweep's progress and its own page walk gets the stall limit,
 * and a given-up sweep stops the walk. Left: a compared process that
 * exits during the walk while a CLONE_VM sibling lives on lets that
 * sibling be read too, for that sweep.
 *
 * The parents come from one read of every /proc/PID/stat per full sweep
 * that has an untrusted worker or a run (no lock of the process's is taken):
 * the children files (/proc/PID/task/TID/children) would take a read per thread
 * of every untrusted worker, and exist only with CONFIG_PROC_CHILDREN. A
 * process whose parent exited is re-parented out of the tree (to init or a
 * subreaper): a double fork leaves.
 */
#define MTS_RSS_FAMILY_MAX 256u

struct family {
	struct fam_pp {
		uint32_t ppid, pid;
		uint64_t start_time;
		bool walked;
	} * pp; /* every process, by parent */
	uint32_t npp;
	uint32_t *reg; /* the registered pids, sorted */
	uint32_t nreg;
	uint32_t *queue; /* npp + 1 */
	/* For the entry being walked, a live thread of each address space
	 * met so far (the worker's, the charged descendants', the
	 * registered children's), in the order kcmp gives: a binary search
	 * finds whether one is new, not a kcmp with each. npp + 1. */
	uint32_t *keys;
	uint32_t nkeys;
	struct {
		uint32_t uid, n;
		bool run;
	} * budget; /* one per uid (and per uid's runs) at most: as many as
	               the entries */
	uint32_t nbudget;
};

static int cmp_pp(const void *a, const void *b)
{
	const struct fam_pp *x = a, *y = b;
	return x->ppid < y->ppid ? -1 : x->ppid > y->ppid;
}

static int cmp_u32(const void *a, const void *b)
{
	uint32_t x = *(const uint32_t *)a, y = *(const uint32_t *)b;
	return x < y ? -1 : x > y;
}

static void family_free(struct family *f)
{
	if (!f)
		return;
	free(f->pp);
	free(f->reg);
	free(f->queue);
	free(f->keys);
	free(f->budget);
	free(f);
}

/* How `a`'s address space orders against `b`'s, as kcmp(2) says: 0 the
 * same, 1 before, 2 after (3: unordered), -errno when it cannot say. */
static int vm_order(uint32_t a, uint32_t b)
{
	long r = syscall(SYS_kcmp, (pid_t)a, (pid_t)b, KCMP_VM, 0, 0);
	return r < 0 ? -errno : (int)r;
}

/* Every process's parent, and the pids of `e`. NULL when none of the
 * entries wants its family read, without kcmp, or out of memory (then no
 * family is charged: the figures are what they were without). */
static struct family *family_scan(const struct rss_entry *e, uint32_t n,
                                  atomic_uint *progress)
{
	bool want = false;
	for (uint32_t i = 0; i < n && !want; i++)
		want = e[i].family;
	uint32_t self = (uint32_t)getpid();
	if (!want || vm_order(self, self) != 0)
		return NULL;
	struct family *f = calloc(1, sizeof(*f));
	/* open() and fdopendir(), not opendir(): ThreadSanitizer sees the
	 * descriptor made by open() (not by opendir()), and took the
	 * closedir() of a number the loop's thread had used before for a
	 * race. */
	int dfd = f ? open("/proc", O_RDONLY | O_DIRECTORY | O_CLOEXEC) : -1;
	DIR *d = dfd >= 0 ? fdopendir(dfd) : NULL;
	if (!d) {
		if (dfd >= 0)
			close(dfd);
		goto fail;
	}
	f->reg = malloc((size_t)n * sizeof(*f->reg));
	f->budget = calloc(n, sizeof(*f->budget));
	if (!f->reg || !f->budget)
		goto fail;
	/* The registered processes, whose walks stop at one another: not
	 * the runs, whose trees are read for their reservations and,
	 * below an untrusted worker, are its family too (a run's reading
	 * is in no counted figure). */
	for (uint32_t i = 0; i < n; i++)
		if (!e[i].run)
			f->reg[f->nreg++] = e[i].pid;
	qsort(f->reg, f->nreg, sizeof(*f->reg), cmp_u32);
	uint32_t cap = 0;
	for (struct dirent *de; (de = readdir(d));) {
		char *end;
		unsigned long pid = strtoul(de->d_name, &end, 10);
		if (de->d_name[0] < '1' || de->d_name[0] > '9' || *end ||
		    pid > UINT32_MAX || pid == self)
			continue;
		uint32_t ppid;
		uint64_t st;
		if (mts_read_parent((pid_t)pid, &ppid, &st) < 0 || ppid == 0)
			continue;
		if (f->npp == cap) {
			cap = cap ? 2 * cap : 1024;
			struct fam_pp *pp = realloc(f->pp, cap * sizeof(*pp));
			if (!pp)
				goto fail;
			f->pp = pp;
		}
		f->pp[f->npp++] =
		    (struct fam_pp){ppid, (uint32_t)pid, st, false};
		if ((f->npp & 63) == 0)
			atomic_fetch_add_explicit(progress, 1,
			                          memory_order_release);
	}
	closedir(d);
	d = NULL;
	qsort(f->pp, f->npp, sizeof(*f->pp), cmp_pp);
	f->queue = malloc(((size_t)f->npp + 1) * sizeof(*f->queue));
	f->keys = malloc(((size_t)f->npp + 1) * sizeof(*f->keys));
	if (!f->queue || !f->keys)
		goto fail;
	return f;
fail:
	if (d)
		closedir(d);
	family_free(f);
	return NULL;
}

static bool family_registered(const struct family *f, uint32_t pid)
{
	return bsearch(&pid, f->reg, f->nreg, sizeof(pid), cmp_u32) != NULL;
}

/* The first of `ppid`'s children in f->pp (npp if none). */
static uint32_t family_children(const struct family *f, uint32_t ppid)
{
	uint32_t lo = 0, hi = f->npp;
	while (lo < hi) {
		uint32_t mid = lo + (hi - lo) / 2;
		if (f->pp[mid].ppid < ppid)
			lo = mid + 1;
		else
			hi = mid;
	}
	return lo;
}

/* The descendants `uid`'s workers (or, `run`, its runs) have had read
 * in this sweep: a budget of its own for the runs, so that a uid's
 * workers' families do not leave its runs unread. A linear search, made
 * for the entries that have descendants only. */
static uint32_t *family_budget(struct family *f, uint32_t uid, bool run)
{
	for (uint32_t i = 0; i < f->nbudget; i++)
		if (f->budget[i].uid == uid && f->budget[i].run == run)
			return &f->budget[i].n;
	f->budget[f->nbudget].uid = uid;
	f->budget[f->nbudget].run = run;
	f->budget[f->nbudget].n = 0;
	return &f->budget[f->nbudget++].n;
}

/* The task kcmp is to be given for `pid`'s address space: a live
 * thread's once its main thread has exited (whose task has none: every
 * such leader would compare equal, and none with its threads'), or 0
 * when it has none or is gone. One read of its stat. */
static uint32_t vm_key(uint32_t pid)
{
	char state;
	uint32_t ppid;
	if (mts_read_state_ppid((pid_t)pid, &state, &ppid) < 0)
		return 0;
	if (state != 'Z')
		return pid;
	pid_t t = mts_live_thread((pid_t)pid);
	return t > 0 ? (uint32_t)t : 0;
}

/* Add the address space of `key` to f->keys: true if it was not there.
 * A key that can no longer be compared (its task exited meanwhile) is
 * dropped and the search made again, or one exit would hide every
 * later descendant whose search met it; false if `key` itself cannot. */
static bool family_key_add(struct family *f, uint32_t key)
{
	if (!key || vm_order(key, key) != 0)
		return false;
	uint32_t lo = 0, hi = f->nkeys;
	while (lo < hi) {
		uint32_t mid = lo + (hi - lo) / 2;
		int o = vm_order(key, f->keys[mid]);
		if (o == 1) {
			hi = mid;
		} else if (o == 2) {
			lo = mid + 1;
		} else if (o == 0) {
			return false;
		} else {
			memmove(&f->keys[mid], &f->keys[mid + 1],
			        (f->nkeys - mid - 1) * sizeof(f->keys[0]));
			f->nkeys--;
			lo = 0;
			hi = f->nkeys;
		}
	}
	memmove(&f->keys[lo + 1], &f->keys[lo],
	        (f->nkeys - lo) * sizeof(f->keys[0]));
	f->keys[lo] = key;
	f->nkeys++;
	return true;
}

/* Read what `e`'s unregistered descendants hold, breadth first, until
 * its uid's budget is spent or the sweep is given up (`abandoned`). */
static void family_read(struct family *f, struct rss_entry *e,
                        atomic_uint *progress, const atomic_bool *abandoned)
{
	uint32_t *budget = NULL; /* looked up at its first descendant */
	uint32_t head = 0, tail = 0;
	f->nkeys = 0;
	if (!family_key_add(f, vm_key(e->pid)))
		return; /* gone, or kcmp cannot say: none charged */
	f->queue[tail++] = e->pid;
	while (head < tail) {
		uint32_t parent = f->queue[head++];
		uint32_t first = family_children(f, parent);
		/* A registered child counts itself, and so a clone of it
		 * (CLONE_VM|CLONE_PARENT: its sibling) must not count again,
		 * whichever of the two has the lower pid: their address
		 * spaces first. */
		for (uint32_t i = first; i < f->npp && f->pp[i].ppid == parent;
		     i++)
			if (!f->pp[i].walked &&
			    family_registered(f, f->pp[i].pid))
				family_key_add(f, vm_key(f->pp[i].pid));
		for (uint32_t i = first; i < f->npp && f->pp[i].ppid == parent;
		     i++) {
			/* Each process once: a pid reused during the scan
			 * could close a loop. */
			if (f->pp[i].walked)
				continue;
			f->pp[i].walked = true;
			uint32_t c = f->pp[i].pid;
			if (family_registered(f, c))
				continue;
			if (!budget)
				budget = family_budget(f, e->uid, e->run);
			if (*budget >= MTS_RSS_FAMILY_MAX ||
			    (abandoned &&
			     atomic_load_explicit(abandoned,
			                          memory_order_relaxed))) {
				e->family_cut = true;
				return;
			}
			f->queue[tail++] = c;
			(*budget)++;
			struct mts_kernel_mem km;
			uint64_t st;
			uint32_t pp;
			/* A new address space (the key added: a process
			 * read and then dropped still holds its place, so
			 * that what shares it is not read again), read,
			 * and still the process scanned. */
			bool ok = family_key_add(f, vm_key(c)) &&
			          mts_read_kernel_mem((int)c, true, &km) == 0 &&
			          km.pss &&
			          mts_read_parent((pid_t)c, &pp, &st) == 0 &&
			          st == f->pp[i].start_time;
			atomic_fetch_add_explicit(progress, 1,
			                          memory_order_release);
			if (!ok)
				continue;
			e->family_held = mt_sat_add(e->family_held, km.held);
			e->family_rss = mt_sat_add(e->family_rss, km.rss);
			e->family_shmem = mt_sat_add(e->family_shmem, km.shmem);
			e->family_n++;
		}
	}
}

/* A run's entry: whether it is still there, and what is below it. Its
 * own figure is memtally's, not its command's. */
static void run_read(struct rss_entry *e, struct family *fam,
                     atomic_uint *progress, const atomic_bool *abandoned)
{
	uint32_t pp;
	uint64_t st;
	int err = mts_read_parent((pid_t)e->pid, &pp, &st);
	if (err == -ENOENT || err == -ESRCH ||
	    (err == 0 && st != e->start_time)) {
		e->err = -ESRCH;
		return;
	}
	e->err = err;
	if (err == 0 && fam && e->family)
		family_read(fam, e, progress, abandoned);
	else
		e->family = false; /* nothing read: the last figure stands */
}

/* Read one entry: status for most; smaps_rollup (and the descriptors,
 * in a full sweep) for untrusted processes. */
static void entry_read(struct rss_entry *e, struct ino_set *seen,
                       struct family *fam, atomic_uint *progress,
                       const atomic_bool *abandoned)
{
	uint64_t t0 = mts_now_monotonic();
	e->read_ns = t0;
	if (e->run) {
		run_read(e, fam, progress, abandoned);
		e->cost_ns = mts_now_monotonic() - t0;
		return;
	}
	if (!e->kernel) {
		e->err = read_own((pid_t)e->pid, &e->km);
		e->cost_ns = mts_now_monotonic() - t0;
		e->rss = mt_sat_add(e->km.anon, e->km.shmem);
		e->anon = e->km.anon;
		return;
	}
	e->err = mts_read_kernel_mem((int)e->pid, e->smaps, &e->km);
	if (e->err == 0 && e->uids && !e->km.has_uids) {
		/* smaps_rollup has no Uid line: status's, as for a
		 * trusted process. */
		struct mts_kernel_mem st;
		if (read_own((pid_t)e->pid, &st) == 0 && st.has_uids) {
			e->km.has_uids = true;
			memcpy(e->km.uids, st.uids, sizeof(e->km.uids));
		}
	}
	if (e->err == 0 && e->memfds)
		e->memfd = memfd_bytes(seen, e->pid);
	/* The cost of its own read: an early read does not walk the
	 * family. */
	e->cost_ns = mts_now_monotonic() - t0;
	if (e->err == 0 && e->family && fam && e->smaps && e->km.pss)
		family_read(fam, e, progress, abandoned);
	else if (e->err != 0 || !fam)
		e->family = false; /* nothing read: the last figures stand */
	/* Else (its reads through status) it charges none: status counts
	 * the pages they share with it in full. */
	e->rss = e->km.rss;
	e->anon = e->km.anon;
}

void mts_mapped_read(struct mts_registry *reg, struct mts_proc *p,
                     uint64_t anon, uint64_t read_ns)
{
	if (!p->map.ever || p->corrupt)
		return;
	/* Made after the figure's youth: everything it counts was mapped
	 * before the read, and the figure has not risen since. */
	bool old = read_ns >=
	           p->mapped_rose_ns + (uint64_t)MTS_MAPPED_YOUNG_MS * 1000000u;
	if (old) {
		p->mapped_young = false;
		p->map.cap = anon;
		p->mapped_capped = p->mapped_seen > anon; /* at the next tick */
	}
	struct mtshm_slot_id *s = reg->slot_at[p->slot];
	uint32_t flags = mtshm_load_relaxed32(&s->flags);
	uint64_t flushes;
	int absurd;
	mtshm_slot_sum(s, reg->layout.lane_count, &flushes, &absurd);
	if (flags & MTSHM_SLOT_RECONCILE) {
		/* A full publish since the flag rose saw it (a publish reads
		 * the flags before it counts itself). */
		if (flushes != p->map.ask_flushes)
			mtshm_store_relaxed32(&s->flags,
			                      flags & ~MTSHM_SLOT_RECONCILE);
		return;
	}
	if ((old && p->mapped_seen > mt_sat_add(anon, MTS_MAPPED_SLACK)) ||
	    anon > mt_sat_add(p->bytes, MTS_MAPPED_SLACK)) {
		p->map.ask_flushes = flushes;
		mtshm_store_relaxed32(&s->flags, flags | MTSHM_SLOT_RECONCILE);
	}
}

/*
 * A process registered as a trusted uid that dropped it for good without
 * an exec (a daemon leaving root to serve untrusted input: real,
 * effective and saved uids all untrusted now): its slot is still in the
 * trusted uid's table, where its claims counted in full. Whoever controls
 * it now must not make memtallyd act on a trusted claim: from this read
 * on it is untrusted, its claims vouched by the kernel, until it registers
 * again (as what it is then). Its figure counts from this read of status.
 * One that keeps a trusted uid among the three (seteuid for a moment)
 * can take it back whenever it likes: nothing is gained by distrusting
 * it. A read made before the process registered again (an exec) says
 * nothing of the new image.
 */
static bool uid_left(struct mts_registry *reg, struct mts_proc *p,
                     const struct rss_entry *e)
{
	/* (One made untrusted by another's leaving is still looked at.) */
	if (p->uid_left || !mts_uid_trusted(reg, p->uid) || !e->km.has_uids ||
	    e->image_id != p->image_id)
		return false;
	for (int i = 0; i < 3; i++)
		if (mts_uid_trusted(reg, e->km.uids[i]))
			return false;
	p->uid_left = true;
	p->left_uid = e->km.uids[1];
	mts_vouch_proc_init(reg, p);
	mts_log_uid(p->uid, MTS_LOG_WARN,
	            "worker left its uid without exec: its claims count as "
	            "the kernel vouches for them",
	            "pid=%u uid=%u euid=%u", p->pid, p->uid, e->km.uids[1]);
	mts_table_taint(reg, p->table, p->left_uid);
	mts_vouch_taint_apply(reg);
	return true;
}

/* Mark `p`'s restart entry: read, changed and written back, so that
 * what others wrote there stays (the guard's pause, which a successor
 * must undo: rewritten whole, a worker paused before its exec was seen
 * stayed stopped for good after a crash). */
static void stale_record(struct mts_registry *reg, const struct mts_proc *p)
{
	struct mts_state_rec r;
	if (!reg->state)
		return;
	if (mts_state_get(reg->state, p->slot, &r) < 0 || r.pid != p->pid ||
	    r.start_time != p->start_time) {
		mts_registry_record(reg, p);
		return;
	}
	r.image_stale = 1;
	mts_state_put(reg->state, p->slot, &r);
}

/*
 * Did `p` exec an image that has not registered? An image registers at
 * its first flush (COUNTING.md), but one that never flushes (under the
 * jemalloc preload, less than 64 KiB of allocator activity: sleep, an
 * idle shell) or runs without the preload (an exec with a cleared
 * environment, a static or set-uid program) never does, and its slot
 * keeps the old image's claim, counted in full for a trusted uid: 300
 * MiB for a sleep holding 92 KiB, over its limit. The status read of the
 * sweep names its comm: when that changed, /proc/PID/stat says whether
 * arg_start moved, which only an exec does (a prctl renaming does not).
 * Then it counts as the kernel vouches for it (untrusted) until an image
 * of it registers. A reader without ptrace access sees arg_start 0 and
 * never decides so.
 */
static void exec_seen(struct mts_registry *reg, struct mts_proc *p,
                      const struct rss_entry *e)
{
	/* Compared as answers show it (a comm cut mid-character, or bytes
	 * that are not UTF-8, reads '?' there). */
	char name[sizeof(p->comm)];
	mts_comm_copy(name, sizeof(name), e->km.name);
	if (p->image_stale || !p->exec_mark || !e->km.name[0] ||
	    e->image_id != p->image_id ||
	    strncmp(name, p->comm, sizeof(e->km.name) - 1) == 0)
		return;
	uint64_t st, mark;
	if (mts_read_exec_mark((pid_t)p->pid, &st, &mark) < 0 ||
	    st != p->start_time || !mark)
		return;
	if (mark == p->exec_mark) {
		/* Renamed (prctl), not exec'd: its name as it is now, so
		 * that the next sweeps do not ask again. */
		memcpy(p->comm, name, sizeof(p->comm));
		return;
	}
	p->image_stale = true;
	stale_record(reg, p); /* a successor counts it so too */
	/* Until its first kernel read (soon: vouch.c wants one), what this
	 * read of the new image says it holds stands. */
	p->vouch.kernel = e->rss;
	mts_vouch_proc_init(reg, p);
	char qo[MTS_LOGQ_MAX], qn[MTS_LOGQ_MAX];
	mts_log_uid(
	    p->uid, MTS_LOG_INFO,
	    "worker exec'd an image that has not registered: its slot's "
	    "claim is the old image's; it counts as the kernel vouches "
	    "until one registers",
	    "pid=%u uid=%u comm=%s now=%s bytes=%llu", p->pid, p->uid,
	    mts_logq(qo, sizeof(qo), p->comm),
	    mts_logq(qn, sizeof(qn), e->km.name), (unsigned long long)p->bytes);
}

/* What a full sweep read of `p`'s unregistered descendants: kept until
 * the next full sweep (an early read does not walk them). Said when
 * they first hold something, when they hold nothing again, and the
 * first time its uid's budget left some of them out. */
static void family_apply(struct mts_registry *reg, struct mts_proc *p,
                         const struct rss_entry *e)
{
	struct mts_vouch_proc *v = &p->vouch;
	if (e->family_cut && !v->family_cut_said) {
		v->family_cut_said = true;
		mts_log_uid(
		    p->uid, MTS_LOG_WARN,
		    "a uid's workers have more unregistered descendants "
		    "than a sweep reads: those past them are not "
		    "counted",
		    "pid=%u uid=%u read=%u", p->pid, p->uid,
		    MTS_RSS_FAMILY_MAX);
	}
	bool had = v->family_held != 0;
	v->family_held = e->family_held;
	v->family_rss = e->family_rss;
	v->family_shmem = e->family_shmem;
	v->family_n = e->family_n;
	if (had == (e->family_held != 0))
		return;
	if (had) {
		mts_log_uid(p->uid, MTS_LOG_INFO,
		            "worker's unregistered descendants hold nothing "
		            "now",
		            "pid=%u uid=%u", p->pid, p->uid);
		return;
	}
	mts_log_uid(p->uid, MTS_LOG_INFO,
	            "worker's descendants that never registered hold memory: "
	            "it counts toward others with theirs",
	            "pid=%u uid=%u descendants=%u descendant_bytes=%llu",
	            p->pid, p->uid, e->family_n,
	            (unsigned long long)e->family_held);
}

/* Apply a read entry to `p` (same pid and start time). */
static void entry_apply(struct mts_registry *reg, struct mts_proc *p,
                        const struct rss_entry *e)
{
	mts_mapped_read(reg, p, e->anon, e->read_ns);
	if (!e->kernel && e->err == 0)
		exec_seen(reg, p, e);
	/* A process in reach of a leaver is read as untrusted, and may
	 * leave its uid too: then its excess is its own new uid's. */
	bool left = (!e->kernel || e->uids) && uid_left(reg, p, e);
	if ((!e->kernel && !left) || !p->untrusted) {
		mts_proc_set_rss(reg, p, e->rss);
		return;
	}
	struct mts_vouch_proc *v = &p->vouch;
	if (e->memfds)
		v->memfd = e->memfd;
	if (e->family)
		family_apply(reg, p, e);
	/* A memfd it maps, or a descendant charged to it maps, is in a
	 * shared figure already: count the larger of the two, never both. */
	uint64_t mapped = mt_sat_add(e->km.shmem, v->family_shmem);
	uint64_t unmapped = v->memfd > mapped ? v->memfd - mapped : 0;
	mts_proc_set_rss(
	    reg, p, mt_sat_add(mt_sat_add(e->km.rss, unmapped), v->family_rss));
	v->kernel =
	    mt_sat_add(mt_sat_add(e->km.held, unmapped), v->family_held);
	v->kernel_ns = mts_now_monotonic();
	v->claim_at_read = p->bytes;
	v->next_read_ns =
	    v->kernel_ns + (uint64_t)MTS_VOUCH_READ_DUTY * e->cost_ns;
	v->read_cost_ns = e->cost_ns;
}

static void entry_fill(struct rss_entry *e, const struct mts_proc *p, bool full)
{
	memset(e, 0, sizeof(*e));
	e->pid = p->pid;
	e->uid = p->uid;
	e->start_time = p->start_time;
	e->image_id = p->image_id;
	e->kernel = p->untrusted;
	e->memfds = full && p->untrusted;
	e->family = full && p->untrusted;
	e->smaps =
	    p->untrusted && !p->vouch.read_stalled && smaps_allowed(p->uid);
	e->uids = p->exposed && !p->uid_left;
	/* Its walk costs what it maps: known from its last read once there
	 * was one; before, a longer limit. */
	/* Its own resident pages: each descendant read has the limit to
	 * itself (the sweep's progress moves between them). */
	uint64_t pages = sat_sub(p->rss, p->vouch.family_rss) / 4096u;
	uint64_t ms = (uint64_t)(p->rss_known ? MTS_RSS_STALL_MS
	                                      : MTS_RSS_STALL_FIRST_MS) *
	              1000000u;
	e->stall_ns = mt_sat_add(mt_sat_add(ms, pages * MTS_RSS_STALL_PAGE_NS),
	                         p->vouch.read_cost_ns * MTS_RSS_STALL_COST);
}

/* The entry of run `k`: its descendants, read as an untrusted worker's. */
static void run_fill(struct rss_entry *e, const struct mts_run_ref *k)
{
	memset(e, 0, sizeof(*e));
	e->pid = k->pid;
	e->uid = k->uid;
	e->start_time = k->start;
	e->run = true;
	/* Its descendants' page walks, as an untrusted worker's are made:
	 * not for a uid whose reads are stuck. */
	e->family = smaps_allowed(k->uid);
	e->stall_ns = (uint64_t)MTS_RSS_STALL_MS * 1000000u;
}

/* What a sweep read of a run, to its reservation (`runs`: taken now). */
static void run_apply(struct mts_registry *reg, const struct mts_run_ref *runs,
                      uint32_t n, const struct rss_entry *e)
{
	const struct mts_run_ref *k =
	    mts_run_find(runs, n, e->pid, e->start_time);
	if (!k)
		return; /* released meanwhile */
	if (e->err == -ESRCH)
		mts_resv_run_read(reg, k->r, true, false, 0, 0);
	else if (e->err == 0 && e->family)
		mts_resv_run_read(reg, k->r, false, e->family_cut,
		                  e->family_held, e->family_n);
}

/* memtallyd's own memfds, held by every worker: never charged. */
static void seen_init(struct mts_registry *reg, struct ino_set *seen)
{
	seen->memfd_dev = reg->map->dev;
	ino_add(seen, reg->map->dev, reg->map->ino);
	for (uint32_t i = 0; i < reg->ntables; i++)
		ino_add(seen, reg->tables[i]->map.dev, reg->tables[i]->map.ino);
}

void mts_rss_sweep_sync(struct mts_registry *reg)
{
	struct ino_set seen = {0};
	seen_init(reg, &seen);
	struct rss_entry *e = calloc(reg->ndense ? reg->ndense : 1, sizeof(*e));
	if (!e) {
		free(seen.e);
		return;
	}
	for (uint32_t i = 0; i < reg->ndense; i++)
		entry_fill(&e[i], reg->by_slot[reg->dense[i]], true);
	atomic_uint progress = 0;
	struct family *fam = family_scan(e, reg->ndense, &progress);
	for (uint32_t i = 0; i < reg->ndense; i++) {
		entry_read(&e[i], &seen, fam, &progress, NULL);
		if (e[i].err == 0)
			entry_apply(reg, reg->by_slot[reg->dense[i]], &e[i]);
	}
	family_free(fam);
	free(e);
	free(seen.e);
}

static void sweep_free(struct mts_rss_sweep *sw)
{
	free(sw->seen.e);
	free(sw);
}

static void *reader(void *arg)
{
	struct mts_rss_sweep *sw = arg;
	struct family *fam =
	    sw->full ? family_scan(sw->e, sw->n, &sw->progress) : NULL;
	for (uint32_t i = 0; i < sw->n; i++) {
		entry_read(&sw->e[i], &sw->seen, fam, &sw->progress,
		           &sw->abandoned);
		if (i + 1 == sw->n)
			sw->done_ns = mts_now_monotonic();
		atomic_store_explicit(&sw->at, i + 1, memory_order_release);
		/* Given up: the next sweep reads the rest. */
		if (atomic_load_explicit(&sw->abandoned, memory_order_relaxed))
			break;
	}
	family_free(fam);
	if (atomic_fetch_sub_explicit(&sw->refs, 1, memory_order_acq_rel) ==
	    1) {
		/* The loop let go first: it gave this reader up for stuck. */
		if (atomic_load_explicit(&sw->abandoned, memory_order_relaxed))
			stuck_add(sw->stuck_uid, -1);
		sweep_free(sw);
	}
	return NULL;
}

/* The loop lets go of the sweep in flight; `stuck` if its reader is not
 * done. */
static void sweep_drop(struct mts_registry *reg, bool stuck)
{
	struct mts_rss_sweep *sw = reg->rss->sweep;
	reg->rss->sweep = NULL;
	if (stuck) {
		/* Counted before the reader can see it let go. */
		uint32_t at =
		    atomic_load_explicit(&sw->at, memory_order_acquire);
		sw->stuck_uid = at < sw->n ? sw->e[at].uid : 0;
		stuck_add(sw->stuck_uid, 1);
		atomic_store_explicit(&sw->abandoned, true,
		                      memory_order_relaxed);
	}
	if (atomic_fetch_sub_explicit(&sw->refs, 1, memory_order_acq_rel) ==
	    1) {
		if (stuck) /* it returned meanwhile */
			stuck_add(sw->stuck_uid, -1);
		sweep_free(sw);
	}
}

/* Apply the entries the reader has finished, below `upto`. */
static void sweep_apply(struct mts_registry *reg,
                        const struct mts_rss_sweep *sw, uint32_t upto)
{
	struct mts_run_ref *runs = NULL;
	uint32_t nruns = 0;
	bool runs_taken = false;
	for (uint32_t i = 0; i < upto; i++) {
		const struct rss_entry *e = &sw->e[i];
		if (e->run) {
			/* Taken once, when the first run's entry is: a run
			 * read may end its reservation, no other. */
			if (!runs_taken && reg->adm)
				runs = mts_resv_runs(reg, &nruns);
			runs_taken = true;
			run_apply(reg, runs, nruns, e);
			continue;
		}
		if (e->err < 0) {
			/* Gone (its pidfd says so), or unreadable: then no
			 * early read again before the next full sweep, or a
			 * process with no read yet would be asked for one
			 * every early sweep. */
			if ((e->err == -EACCES || e->err == -EPERM) &&
			    e->kernel && !reg->rss->refused_said) {
				/* Without ptrace access (a container's root
				 * without CAP_SYS_PTRACE) no other uid's
				 * figure is ever the kernel's: an operator
				 * must hear it once, not find it out. */
				reg->rss->refused_said = true;
				mts_log_uid(
				    e->uid, MTS_LOG_WARN,
				    "cannot read another user's memory "
				    "figures: its workers count at their "
				    "allowance only; memtallyd needs "
				    "CAP_SYS_PTRACE, or the uid in [trust] "
				    "trusted_uids",
				    "pid=%u uid=%u err=%s", e->pid, e->uid,
				    strerror(-e->err));
			}
			struct mts_proc *p = mts_find_pid(reg, e->pid);
			if (p && p->start_time == e->start_time)
				p->vouch.next_read_ns =
				    e->read_ns +
				    (uint64_t)reg->policy.rss_interval_ms *
				        1000000u;
			continue;
		}
		struct mts_proc *p = mts_find_pid(reg, e->pid);
		if (p && p->start_time == e->start_time)
			entry_apply(reg, p, e);
	}
	free(runs);
}

/* The reader has been on entry `at` past its limit: apply what it read,
 * read that process's status only from now on, and let the reader go. */
static void sweep_stalled(struct mts_registry *reg, struct mts_rss_sweep *sw,
                          uint32_t at, uint64_t now_ns)
{
	const struct rss_entry *e = &sw->e[at];
	sweep_apply(reg, sw, at);
	struct mts_proc *p = mts_find_pid(reg, e->pid);
	if (p && p->start_time == e->start_time && !p->vouch.read_stalled) {
		p->vouch.read_stalled = e->smaps;
		mts_log(
		    MTS_LOG_WARN,
		    e->smaps ? "a read of a worker's memory map did not "
		               "return; its figures come from its status "
		               "from now on"
		             : "a read of a worker's /proc did not return",
		    "pid=%u uid=%u waited_ms=%llu stuck_readers=%d", e->pid,
		    p->uid,
		    (unsigned long long)((now_ns - sw->seen_at_ns) / 1000000u),
		    atomic_load(&rss_stuck) + 1);
	}
	sweep_drop(reg, true);
}

void mts_rss_poll(struct mts_registry *reg, uint64_t now_ns)
{
	struct mts_rss_sweep *sw = reg->rss ? reg->rss->sweep : NULL;
	if (!sw)
		return;
	uint32_t at = atomic_load_explicit(&sw->at, memory_order_acquire);
	if (at == sw->n) {
		if (sw->full)
			reg->rss->full_cost_ns = sw->done_ns - sw->started_ns;
		if (!reg->closed)
			sweep_apply(reg, sw, at);
		sweep_drop(reg, false);
		return;
	}
	/* A read of a worker's descendants moves `progress`: each of them
	 * gets the entry's limit, not all of them together. */
	uint32_t progress =
	    atomic_load_explicit(&sw->progress, memory_order_acquire);
	if (at != sw->seen_at || progress != sw->seen_progress) {
		sw->seen_at = at;
		sw->seen_progress = progress;
		sw->seen_at_ns = now_ns;
	} else if (now_ns - sw->seen_at_ns > sw->e[at].stall_ns) {
		sweep_stalled(reg, sw, at, now_ns);
	}
}

int mts_rss_stuck_readers(void)
{
	return atomic_load(&rss_stuck);
}

void mts_rss_free(struct mts_registry *reg)
{
	if (reg->rss && reg->rss->sweep)
		sweep_drop(reg, true);
}

/* A sweep of every registered process, or (`early`) only of those whose
 * kernel figure vouch.c wants read before the next full sweep. */
static void sweep_start(struct mts_registry *reg, bool early)
{
	if (reg->rss->sweep || reg->closed)
		return;
	uint64_t now = mts_now_monotonic();
	struct mts_rss_state *st = reg->rss;
	if (!early && st->full_started_ns &&
	    now - st->full_started_ns < MTS_RSS_DUTY * st->full_cost_ns)
		return;
	/* A full sweep reads what each run started that never registered
	 * too: its kind learns it (admit.c). */
	uint32_t nruns = 0;
	struct mts_run_ref *runs =
	    early || !reg->adm ? NULL : mts_resv_runs(reg, &nruns);
	if (reg->ndense == 0 && nruns == 0)
		return; /* nothing to read */
	struct mts_rss_sweep *sw = malloc(
	    sizeof(*sw) + ((size_t)reg->ndense + nruns) * sizeof(sw->e[0]));
	if (!sw) {
		mts_log(MTS_LOG_WARN, "out of memory for an RSS sweep", NULL);
		free(runs);
		return;
	}
	memset(sw, 0, sizeof(*sw));
	atomic_init(&sw->at, 0);
	atomic_init(&sw->progress, 0);
	atomic_init(&sw->refs, 2);
	atomic_init(&sw->abandoned, false);
	sw->full = !early;
	sw->started_ns = now;
	sw->seen_at_ns = now;
	for (uint32_t i = 0; i < reg->ndense; i++) {
		const struct mts_proc *p = reg->by_slot[reg->dense[i]];
		if (!early ||
		    (mts_vouch_want_read(p) && now >= p->vouch.next_read_ns) ||
		    mts_mapped_read_due(p, now))
			entry_fill(&sw->e[sw->n++], p, !early);
	}
	for (uint32_t i = 0; i < nruns; i++) {
		/* A run that registered itself (a preload in memtally's own
		 * environment) has its family read as its worker's. */
		const struct mts_proc *p = mts_find_pid(reg, runs[i].pid);
		if (!p || p->start_time != runs[i].start)
			run_fill(&sw->e[sw->n++], &runs[i]);
	}
	free(runs);
	if (sw->n == 0) {
		free(sw);
		return;
	}
	if (sw->full)
		seen_init(reg, &sw->seen);
	int err = mt_thread_detached(NULL, reader, sw, MTS_RSS_STACK, NULL);
	if (err < 0) {
		/* The loop must not wait on a read: the next timer tries
		 * again. Said once per streak of failures. */
		if (!st->start_failed)
			mts_log(MTS_LOG_WARN,
			        "could not start an RSS sweep; figures keep "
			        "their last reads until one starts",
			        "err=%s", strerror(-err));
		st->start_failed = true;
		sweep_free(sw);
		return;
	}
	st->start_failed = false;
	if (sw->full)
		st->full_started_ns = now;
	st->sweep = sw;
}

void mts_rss_sweep_start(struct mts_registry *reg)
{
	sweep_start(reg, false);
}

void mts_rss_want_vouch(struct mts_registry *reg)
{
	reg->rss->vouch_wanted = true;
}

void mts_rss_sweep_vouch(struct mts_registry *reg, uint64_t now_ns)
{
	if (!reg->rss->vouch_wanted ||
	    now_ns - reg->rss->vouch_sweep_ns <
	        (uint64_t)MTS_VOUCH_SWEEP_MS * 1000000u)
		return;
	reg->rss->vouch_wanted = false;
	reg->rss->vouch_sweep_ns = now_ns;
	sweep_start(reg, true);
}
