/*
 * guard.c - the node guard: when the node's memory nears its edge,
 * memtallyd chooses a task and evicts it before the kernel's OOM killer
 * has to choose for it.
 *
 * The node's figure and the line come from node.c.
 *
 * The line, and the choice. The line is [guard] line: a fraction of the
 * limit, bytes below it, or bytes. Past it, at most one task is evicted
 * per [guard] interval, so the node has time to come back before another
 * is chosen. The candidates are the tasks and the processes without a
 * task. A task's candidate is the workers of one task of one uid, whatever
 * their process tree. The guard chooses the candidate furthest beyond its
 * reservation by what its workers hold as vouched for (vouch.c), which is
 * what it took that nobody granted it, of the uid furthest beyond
 * together: a user that splits what it took across many processes each a
 * little beyond goes before another user's one task further beyond than
 * any of them (uid_beyond). When none is beyond, it chooses the
 * one growing fastest. That one is what pushes the node to its edge, and
 * evicting anything else only buys time until it gets there. When none
 * grows, it chooses the youngest, which has done the least work, so its
 * rerun throws away the least.
 *
 * Trust. Untrusted processes count what the kernel vouches for, so a lie
 * makes nobody bigger but the liar. A candidate is one uid's. A worker of
 * another uid naming a task is a candidate of its own, so it neither
 * makes that task look bigger nor goes with it, and it takes of a grant
 * without an owner only what the task's earlier uids left
 * (share_ownerless). A trusted
 * process without a task, such as a root service, is never chosen unless
 * [guard] evict_trusted, or unless it runs tasks inside it (Admit.in_process, a
 * Dask or Celery worker): it then runs jobs, and may hold its own memory
 * and what its tasks were granted. Only the process itself can make it a
 * host. memtallyd itself is never signalled, even if it were registered.
 *
 * The pause. A task chosen for growing fastest ([guard] pause) is first
 * stopped and held, not killed: stopping it stops the node's rise, and
 * what the others free may let it finish. It is held only while the
 * node's room holds the floor and 300 ms of the node's rise
 * (mts_guard_hold_safe), for at most the interval; then it is resumed
 * (back under the line) or evicted. Its restart-record entries are marked
 * while it is held, so that a memtallyd killed meanwhile has its
 * successor resume it.
 *
 * The eviction. A Watch event for the task (scope "task:NAME", the
 * figures in its reason) is written before any signal, so `memtally run`
 * has it by the time it sees its command die. Then every worker of the
 * candidate is stopped through its pidfd. Their descendants are found
 * (/proc/PID/task/TID/children) and stopped in turn. Each is opened as a
 * pidfd and checked to be the child of its stopped parent. Then all are
 * killed. A stopped process cannot fork a child the walk would miss, and
 * a pidfd cannot be a recycled pid.
 */
#include "mts_guard.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/pidfd.h>
#include <time.h>
#include <unistd.h>

#include "mts_admit.h"
#include "mts_defs.h"
#include "mts_limits.h"
#include "mts_log.h"
#include "mts_node.h"
#include "mts_policy.h"
#include "mts_procfs.h"
#include "mts_registry.h"
#include "mts_state.h"
#include "mts_vouch.h"

const char *mts_guard_rule_name(enum mts_guard_rule r)
{
	switch (r) {
	case MTS_GUARD_BEYOND:
		return "furthest beyond its reservation";
	case MTS_GUARD_GROWTH:
		return "none beyond its reservation: fastest growing";
	default:
		return "none beyond its reservation, none growing: youngest";
	}
}

/* ---- the candidates ------------------------------------------------------ */

/* What of `p` counts: vouched for (vouch.c), per policy.measure. */
static uint64_t proc_used(const struct mts_registry *reg,
                          const struct mts_proc *p)
{
	return mts_measured(reg, mts_vouch_counted(p), p->rss);
}

/* Workers in candidate order: by task, uid, then pid for those with no
 * task (each its own candidate). */
static int cmp_proc(const void *a, const void *b)
{
	const struct mts_proc *p = *(const struct mts_proc *const *)a;
	const struct mts_proc *q = *(const struct mts_proc *const *)b;
	int c = strcmp(p->task, q->task);
	if (c)
		return c;
	if (p->task_uid != q->task_uid)
		return p->task_uid < q->task_uid ? -1 : 1;
	if (!p->task[0] && p->pid != q->pid)
		return p->pid < q->pid ? -1 : 1;
	return 0;
}

/* Is `a` a better choice than `b` under `rule`? */
static bool better(const struct mts_guard_cand *a,
                   const struct mts_guard_cand *b, enum mts_guard_rule rule)
{
	if (rule == MTS_GUARD_BEYOND) {
		/* The uid first: one that split what it took across many
		 * processes or tasks, each a little beyond, took it all the
		 * same, and another user's task must not go in its place. */
		if (a->uid_beyond != b->uid_beyond)
			return a->uid_beyond > b->uid_beyond;
		uint64_t ea = a->used - a->reserved, eb = b->used - b->reserved;
		if (ea != eb)
			return ea > eb;
		if (a->used != b->used)
			return a->used > b->used;
	} else if (rule == MTS_GUARD_GROWTH && a->growth != b->growth) {
		return a->growth > b->growth;
	}
	if (a->first_ns != b->first_ns)
		return a->first_ns > b->first_ns; /* younger */
	return a->pid > b->pid;
}

/* May `c` be chosen under `rule`? */
static bool fits(const struct mts_guard_cand *c, enum mts_guard_rule rule)
{
	if (!c->eligible || c->used == 0)
		return false;
	if (rule == MTS_GUARD_BEYOND)
		return c->used > c->reserved;
	if (rule == MTS_GUARD_GROWTH)
		return c->growth >= MTS_GUARD_GROWTH_MIN;
	return true;
}

/* Is `a` served before `b` (of one task) from its ownerless grant? */
static bool before(const struct mts_guard_cand *a,
                   const struct mts_guard_cand *b)
{
	bool a_early = a->first_ns < a->ownerless_since;
	bool b_early = b->first_ns < b->ownerless_since;
	if (a_early != b_early)
		return b_early;
	return a->first_ns < b->first_ns;
}

/*
 * A reservation made without an owner (over TCP, with the token) counts
 * against every worker of its task, whatever its uid. Given whole to each
 * uid's candidate, it would count once per uid: a user naming the task
 * would hide what it holds behind the scheduler's grant, and another
 * user's task would go instead. Split in proportion to use, a smaller
 * stranger would push the scheduler's own workers past a grant they keep
 * within. So the task's candidates take it in the order they joined the
 * task (their oldest worker's registration; those that named it before
 * it was granted, last), each what it holds past its own reservations:
 * the workers the scheduler started first, a user naming the task only
 * what they left. Nothing of it counts twice. The grant is the first
 * served candidate's: only its eviction ends the grant's run as evicted.
 * `c` is sorted by task.
 */
static void share_ownerless(struct mts_guard_cand *c, uint32_t n)
{
	for (uint32_t i = 0; i < n;) {
		uint32_t j = i + 1;
		while (j < n && c[i].task[0] &&
		       strcmp(c[j].task, c[i].task) == 0)
			j++;
		uint64_t left = c[i].ownerless;
		/* Oldest first; a task has a candidate per uid naming it.
		 * Workers that named the task before it was granted are served
		 * last: a process left running under a name a scheduler will
		 * grant later does not take the grant from its workers. */
		for (uint64_t served = 0; left && served < j - i; served++) {
			uint32_t m = j;
			for (uint32_t k = i; k < j; k++)
				if (!c[k].shared &&
				    (m == j || before(&c[k], &c[m])))
					m = k;
			c[m].shared = true;
			uint64_t need = c[m].used > c[m].reserved
			                    ? c[m].used - c[m].reserved
			                    : 0;
			uint64_t part = need < left ? need : left;
			c[m].reserved += part;
			/* The grant is the workers' that joined first:
			 * only their eviction ends it. */
			c[m].ownerless_ours = served == 0;
			left -= part;
		}
		/* One candidate alone is the grant's, whatever it took. */
		if (j - i == 1)
			c[i].ownerless_ours = true;
		i = j;
	}
}

/* Each candidate's uid_beyond: the sum over its uid's candidates that may
 * be chosen of what each holds beyond its reservation. */
struct uid_sum {
	uint32_t uid;
	uint64_t sum;
};

static int cmp_uid_sum(const void *a, const void *b)
{
	uint32_t x = ((const struct uid_sum *)a)->uid;
	uint32_t y = ((const struct uid_sum *)b)->uid;
	return x < y ? -1 : x > y;
}

static void uid_beyond(struct mts_guard_cand *c, uint32_t n)
{
	struct uid_sum *u = malloc(n * sizeof(*u));
	if (!u) {
		/* Each candidate as its uid's only one, as before. */
		for (uint32_t i = 0; i < n; i++)
			c[i].uid_beyond = fits(&c[i], MTS_GUARD_BEYOND)
			                      ? c[i].used - c[i].reserved
			                      : 0;
		return;
	}
	for (uint32_t i = 0; i < n; i++) {
		u[i].uid = c[i].uid;
		u[i].sum = fits(&c[i], MTS_GUARD_BEYOND)
		               ? c[i].used - c[i].reserved
		               : 0;
	}
	qsort(u, n, sizeof(*u), cmp_uid_sum);
	uint32_t m = 0;
	for (uint32_t i = 0; i < n; i++) {
		if (m && u[m - 1].uid == u[i].uid)
			u[m - 1].sum = mt_sat_add(u[m - 1].sum, u[i].sum);
		else
			u[m++] = u[i];
	}
	for (uint32_t i = 0; i < n; i++) {
		struct uid_sum key = {.uid = c[i].uid};
		const struct uid_sum *f =
		    bsearch(&key, u, m, sizeof(*u), cmp_uid_sum);
		c[i].uid_beyond = f ? f->sum : 0;
	}
	free(u);
}

/* The registered workers' candidates (malloc'd, *n of them). */
static int build(const struct mts_registry *reg, struct mts_guard_cand **out,
                 uint32_t *n)
{
	*out = NULL;
	*n = 0;
	uint32_t np = reg->ndense;
	if (!np)
		return 0;
	struct mts_proc **ps = malloc(np * sizeof(*ps));
	struct mts_guard_cand *c = calloc(np, sizeof(*c));
	if (!ps || !c) {
		free(ps);
		free(c);
		return -ENOMEM;
	}
	for (uint32_t i = 0; i < np; i++)
		ps[i] = reg->by_slot[reg->dense[i]];
	qsort(ps, np, sizeof(*ps), cmp_proc);
	bool evict_trusted = reg->guard && reg->guard->evict_trusted;
	uint32_t self = (uint32_t)getpid();
	uint32_t nc = 0;
	for (uint32_t i = 0; i < np; i++) {
		const struct mts_proc *p = ps[i];
		struct mts_guard_cand *k = &c[nc];
		if (i == 0 || cmp_proc(&ps[i - 1], &ps[i]) != 0) {
			k = &c[nc++];
			k->task = p->task;
			k->uid = p->task_uid;
			k->pid = p->pid;
			k->first_ns = p->registered_ns;
			/* A process with no task of its own may run tasks
			 * inside it (Admit.in_process): its own memory (as
			 * of their grants) and what they were granted is its
			 * reservation, and it is a job runner, not a service
			 * of the node. */
			bool hosts = false;
			if (p->task[0])
				k->reserved = mts_task_reserved(
				    reg, p->task, p->task_uid, &k->ownerless,
				    &k->ownerless_since);
			else
				hosts =
				    mts_host_allowance(reg, p, &k->reserved);
			/* A trusted process without a task is a service of
			 * the node, not a job: a root service that exec'd an
			 * image that never registered (image_stale: counted
			 * as the kernel vouches) is still one. */
			k->eligible = p->task[0] || hosts ||
			              mts_vouch_distrusted(reg, p) ||
			              evict_trusted;
		} else {
			k = &c[nc - 1];
		}
		/* A task's worker may run tasks inside it too (a Dask
		 * worker started under `memtally run`): their grants are
		 * room it may hold as well. */
		if (p->task[0])
			k->reserved = mt_sat_add(k->reserved,
			                         mts_host_granted(reg, p->pid));
		k->workers++;
		k->used = mt_sat_add(k->used, proc_used(reg, p));
		k->growth += mts_proc_growth(reg, p);
		if (p->registered_ns < k->first_ns) {
			k->first_ns = p->registered_ns;
			k->pid = p->pid;
		}
		if (p->pid == self)
			k->eligible = false;
	}
	free(ps);
	share_ownerless(c, nc);
	*out = c;
	*n = nc;
	return 0;
}

/* The candidate the rules choose, or -1. */
static int choose(struct mts_guard_cand *c, uint32_t n,
                  enum mts_guard_rule *rule)
{
	int chosen = -1;
	*rule = MTS_GUARD_BEYOND;
	uid_beyond(c, n);
	for (enum mts_guard_rule r = MTS_GUARD_BEYOND; r <= MTS_GUARD_YOUNGEST;
	     r++) {
		for (uint32_t i = 0; i < n; i++)
			if (fits(&c[i], r) &&
			    (chosen < 0 || better(&c[i], &c[chosen], r)))
				chosen = (int)i;
		if (chosen >= 0) {
			*rule = r;
			break;
		}
	}
	return chosen;
}

int mts_guard_candidates(const struct mts_registry *reg,
                         struct mts_guard_cand **out, uint32_t *n, int *chosen,
                         enum mts_guard_rule *rule)
{
	*chosen = -1;
	*rule = MTS_GUARD_BEYOND;
	int err = build(reg, out, n);
	if (err == 0 && *n)
		*chosen = choose(*out, *n, rule);
	return err;
}

/* ---- processes a run started that never registered ----------------------- */

/*
 * The node's figure holds every process in it, and the candidates above
 * only those that registered. A command run by `memtally run` that drops
 * the preload (a static binary, `env -u LD_PRELOAD`, a program that
 * clears its environment) held memory the guard saw and could charge to
 * no one: its task, within its grant by what registered, was never
 * chosen, and with nothing registered beyond its reservation the guard
 * evicted the youngest task, however far within its own grant.
 *
 * So at a decision (past the line, at most once per interval), while
 * a run is live (mts_resv_runs: a local process that asked for
 * reservations of one task only, its `memtally run`), the guard reads the
 * processes in its scope: the cgroup it guards and those below it (their
 * cgroup.procs), or every process where it guards the machine's MemAvailable. A
 * process below such an asker, neither registered nor below a registered worker
 * (whose family its worker's figure holds, vouch.c), is the task's: its figure
 * adds to the task's candidate (made if none of its workers registered), and
 * the topmost of them (the asker's children) are roots of the task's tree,
 * which an eviction kills (the run kills what is left of its own after
 * that). It counts only against its own run's task: a user cannot make
 * another's task look bigger so.
 *
 * Measured as vouch.c measures an untrusted worker: its proportional
 * figure (smaps_rollup), so that the children a command forked, sharing
 * its pages, are not each counted at the whole; past
 * MTS_GUARD_STRAY_READS page walks in a decision, its status figure (each
 * shared page in full: more, never less, and only against its own task).
 *
 * Cost: nothing while no reservation has a local asker. Else a stat read
 * per process in scope (~9 us), each process's ancestry resolved once
 * (remembered along the way) against the askers sorted once, a status
 * read per process under a run (at most MTS_GUARD_TREE_MAX of them), and
 * at most MTS_GUARD_STRAY_READS page walks, on the loop, at a decision
 * only. A test's procfs tree
 * (src.proc) has no processes: none there.
 *
 * Not here: processes no run started. Taken as candidates of their own
 * (one holding 1/32 of the limit, of an untrusted uid), a review showed
 * that nobody's memory split across small processes escaped the cut
 * while a service account's process (www-data: untrusted by default) was
 * killed in its place, and that many forked children cost a page walk
 * each on the loop. They stay uncounted, as the guard's section of
 * docs/ARCHITECTURE.md says.
 */
#define MTS_GUARD_STRAY_READS 64u

/* By pid, their first member: sorted and searched with mt_cmp_u32. */
struct stray_pp {
	uint32_t pid, ppid;
	uint64_t start;
	/* Resolved: 0 not yet, 1 not a run's, else 2 + the asker's index. */
	uint32_t of;
};

struct u32_set {
	uint32_t *v;
	uint32_t n, cap;
};

static int set_add(struct u32_set *s, uint32_t x)
{
	if (s->n == s->cap) {
		uint32_t cap = s->cap ? 2 * s->cap : 256;
		uint32_t *v = realloc(s->v, (size_t)cap * sizeof(*v));
		if (!v)
			return -ENOMEM;
		s->v = v;
		s->cap = cap;
	}
	s->v[s->n++] = x;
	return 0;
}

/* The pids of a cgroup.procs under `dfd`, and of those below it (a cgroup
 * path is at most a few levels deep; MTS_GUARD_SCOPE_DEPTH bounds it). */
#define MTS_GUARD_SCOPE_DEPTH 16
static int scope_read(int dfd, struct u32_set *s, int depth)
{
	int fd = openat(dfd, "cgroup.procs", O_RDONLY | O_CLOEXEC);
	if (fd >= 0) {
		char buf[4096];
		size_t have = 0;
		for (;;) {
			ssize_t r =
			    read(fd, buf + have, sizeof(buf) - 1 - have);
			if (r < 0 && errno == EINTR)
				continue;
			if (r <= 0)
				break;
			have += (size_t)r;
			buf[have] = '\0';
			/* Whole lines only; the rest waits for more. */
			char *last = strrchr(buf, '\n');
			if (!last) {
				if (have == sizeof(buf) - 1)
					have = 0; /* no pid is this long */
				continue;
			}
			for (char *p = buf, *end; p < last; p = end + 1) {
				unsigned long v = strtoul(p, &end, 10);
				if (end == p || *end != '\n')
					break;
				if (v && v <= UINT32_MAX &&
				    set_add(s, (uint32_t)v) < 0) {
					close(fd);
					return -ENOMEM;
				}
			}
			have = (size_t)(buf + have - (last + 1));
			memmove(buf, last + 1, have);
		}
		close(fd);
	}
	if (depth >= MTS_GUARD_SCOPE_DEPTH)
		return 0;
	int dup = fcntl(dfd, F_DUPFD_CLOEXEC, 0);
	DIR *d = dup >= 0 ? fdopendir(dup) : NULL;
	if (!d) {
		if (dup >= 0)
			close(dup);
		return 0;
	}
	int err = 0;
	for (struct dirent *e; err == 0 && (e = readdir(d));) {
		if (e->d_type != DT_DIR || e->d_name[0] == '.')
			continue;
		int sub =
		    openat(dfd, e->d_name,
		           O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
		if (sub < 0)
			continue;
		err = scope_read(sub, s, depth + 1);
		close(sub);
	}
	closedir(d);
	return err;
}

/* Every process, by pid. */
static int procs_read(struct stray_pp **out, uint32_t *n)
{
	*out = NULL;
	*n = 0;
	int dfd = open("/proc", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	DIR *d = dfd >= 0 ? fdopendir(dfd) : NULL;
	if (!d) {
		int err = -errno;
		if (dfd >= 0)
			close(dfd);
		return err;
	}
	struct stray_pp *v = NULL;
	uint32_t cap = 0, k = 0;
	int err = 0;
	for (struct dirent *e; (e = readdir(d));) {
		char *end;
		unsigned long pid = strtoul(e->d_name, &end, 10);
		if (e->d_name[0] < '1' || e->d_name[0] > '9' || *end ||
		    pid > UINT32_MAX)
			continue;
		uint32_t ppid;
		uint64_t st;
		if (mts_read_parent((pid_t)pid, &ppid, &st) < 0)
			continue;
		if (k == cap) {
			cap = cap ? 2 * cap : 1024;
			struct stray_pp *w =
			    realloc(v, (size_t)cap * sizeof(*w));
			if (!w) {
				err = -ENOMEM;
				break;
			}
			v = w;
		}
		v[k++] = (struct stray_pp){(uint32_t)pid, ppid, st, 0};
	}
	closedir(d);
	if (err < 0) {
		free(v);
		return err;
	}
	qsort(v, k, sizeof(*v), mt_cmp_u32);
	*out = v;
	*n = k;
	return 0;
}

static struct stray_pp *pp_find(struct stray_pp *v, uint32_t n, uint32_t pid)
{
	struct stray_pp key = {.pid = pid};
	return bsearch(&key, v, n, sizeof(*v), mt_cmp_u32);
}

/* The index of run `pid` (started at `start`) in k[0..n), or -1. */
static int asker_index(const struct mts_run_ref *k, uint32_t n, uint32_t pid,
                       uint64_t start)
{
	const struct mts_run_ref *a = mts_run_find(k, n, pid, start);
	return a ? (int)(a - k) : -1;
}

/* Is `pid` (started at `start`) a registered worker? */
static bool registered(const struct mts_registry *reg, uint32_t pid,
                       uint64_t start)
{
	const struct mts_proc *p = mts_find_pid(reg, pid);
	return p && p->start_time == start;
}

/* Resolve whose run `p` is below (p->of), and that of each process on its
 * way up to the first one resolved or that decides: each process once. */
static void resolve(const struct mts_registry *reg, struct stray_pp *v,
                    uint32_t n, struct stray_pp *p,
                    const struct mts_run_ref *ak, uint32_t nak)
{
	struct stray_pp *chain[MTS_ANCESTRY_MAX];
	uint32_t len = 0, of = 1;
	uint32_t self = (uint32_t)getpid();
	for (struct stray_pp *a = p; a; a = pp_find(v, n, a->ppid)) {
		/* A run's own process is not its task's (its figure is
		 * memtally's), what is below it is: the run first, whatever
		 * was remembered of it. */
		int i = asker_index(ak, nak, a->pid, a->start);
		if (i >= 0) {
			if (a == p)
				p->of = 1;
			else
				of = 2 + (uint32_t)i;
			break;
		}
		if (a->of) {
			of = a->of;
			break;
		}
		/* memtallyd (and its hooks below it), a registered worker
		 * (and its family, counted with it), pid 1 and the kernel's
		 * threads are no run's, nor is anything below them. */
		if (a->pid <= 2 || a->pid == self ||
		    registered(reg, a->pid, a->start)) {
			a->of = 1;
			break;
		}
		if (len == MTS_ANCESTRY_MAX)
			break; /* deeper than an ancestry is walked: none */
		chain[len++] = a;
	}
	for (uint32_t i = 0; i < len; i++)
		chain[i]->of = of;
}

/* The proportional figure of `pid` (started at `start`); false if it is
 * gone, or a pid reused meanwhile. */
static bool stray_read(uint32_t pid, uint64_t start, uint64_t *held)
{
	struct mts_kernel_mem km;
	uint32_t pp;
	uint64_t st;
	if (mts_read_kernel_mem((int)pid, true, &km) < 0 ||
	    mts_read_parent((pid_t)pid, &pp, &st) < 0 || st != start)
		return false;
	/* No proportional figures (smaps_rollup unreadable, or a kernel
	 * without them): status's, each shared page in full. */
	*held = km.held;
	return true;
}

/* Candidate `task` of `uid` in c[0..*n), appended (reserving what the
 * task's reservations of `uid` grant) if none of its workers registered. */
static struct mts_guard_cand *task_cand(const struct mts_registry *reg,
                                        struct mts_guard_cand **c, uint32_t *n,
                                        uint32_t *cap, const struct mts_resv *r)
{
	for (uint32_t i = 0; i < *n; i++)
		if ((*c)[i].task[0] && (*c)[i].uid == r->uid &&
		    strcmp((*c)[i].task, r->task->name) == 0)
			return &(*c)[i];
	if (*n == *cap) {
		uint32_t nc = *cap ? 2 * *cap : 16;
		struct mts_guard_cand *w = realloc(*c, (size_t)nc * sizeof(*w));
		if (!w)
			return NULL;
		*c = w;
		*cap = nc;
	}
	struct mts_guard_cand *k = &(*c)[(*n)++];
	memset(k, 0, sizeof(*k));
	k->task = r->task->name;
	k->uid = r->uid;
	k->reserved = mts_task_reserved(reg, r->task->name, r->uid,
	                                &k->ownerless, &k->ownerless_since);
	k->first_ns = r->created_ns;
	k->eligible = true;
	k->pid = r->asker_pid; /* no worker: the run that asked */
	return k;
}

/* Add what runs started and never registered to their tasks' candidates
 * in c[0..*n) (whose array may move). Out of memory or unreadable: none,
 * as before. */
static void strays_add(const struct mts_registry *reg,
                       struct mts_guard_cand **c, uint32_t *n)
{
	const struct mts_guard_state *g = reg->guard;
	if (g->src.proc[0])
		return; /* a test's procfs tree */
	uint32_t nak;
	struct mts_run_ref *ak = mts_resv_runs(reg, &nak);
	struct u32_set scope = {0};
	struct stray_pp *v = NULL;
	uint32_t nv = 0;
	if (!nak)
		goto out;
	bool cgroup = g->src.kind == MTS_NODE_CGROUP_V2 ||
	              g->src.kind == MTS_NODE_CGROUP_V1;
	if (cgroup) {
		int dfd = open(g->src.dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
		if (dfd < 0)
			goto out;
		int err = scope_read(dfd, &scope, 0);
		close(dfd);
		if (err < 0 || !scope.n)
			goto out;
		qsort(scope.v, scope.n, sizeof(uint32_t), mt_cmp_u32);
	}
	if (procs_read(&v, &nv) < 0)
		goto out;
	uint32_t cap = *n, reads = 0, seen = 0;
	for (uint32_t i = 0; i < nv && seen < MTS_GUARD_TREE_MAX; i++) {
		struct stray_pp *p = &v[i];
		if (cgroup && !bsearch(&p->pid, scope.v, scope.n,
		                       sizeof(uint32_t), mt_cmp_u32))
			continue;
		if (!p->of)
			resolve(reg, v, nv, p, ak, nak);
		if (p->of < 2)
			continue;
		const struct mts_resv *r = ak[p->of - 2].r;
		seen++; /* as many as an eviction would signal, at most */
		struct mts_kernel_mem st;
		if (mts_read_kernel_mem((int)p->pid, false, &st) < 0 ||
		    st.held == 0)
			continue;
		uint64_t held = st.held;
		uint32_t pp;
		uint64_t start;
		if (reads < MTS_GUARD_STRAY_READS) {
			reads++;
			if (!stray_read(p->pid, p->start, &held))
				continue;
		} else if (mts_read_parent((pid_t)p->pid, &pp, &start) < 0 ||
		           start != p->start) {
			continue;
		}
		if (!held)
			continue;
		struct mts_guard_cand *k = task_cand(reg, c, n, &cap, r);
		if (!k)
			break;
		k->used = mt_sat_add(k->used, held);
		/* The topmost (the run's children): their descendants are
		 * walked at the eviction. */
		const struct stray_pp *up = pp_find(v, nv, p->ppid);
		if ((!up || up->of != p->of) &&
		    k->nroots < MTS_GUARD_ROOTS_MAX) {
			k->root_pid[k->nroots] = p->pid;
			k->root_start[k->nroots++] = p->start;
		}
	}
out:
	free(ak);
	free(v);
	free(scope.v);
}

/* ---- the eviction -------------------------------------------------------- */

/* Is `p` one of candidate `k`'s workers? */
static bool is_of(const struct mts_proc *p, const struct mts_guard_cand *k)
{
	return k->task[0]
	           ? strcmp(p->task, k->task) == 0 && p->task_uid == k->uid
	           : p->pid == k->pid;
}

/* A candidate's processes, each a pidfd of ours. */
struct tree {
	int fd[MTS_GUARD_TREE_MAX];
	uint32_t pid[MTS_GUARD_TREE_MAX];
	uint32_t n;
	uint32_t workers; /* pid[0..workers): the task's registered workers */
	bool cut;         /* a descendant was left out: the tree was full, or no
	                   * descriptor was left for its pidfd */
	uint32_t denied;  /* processes we may not signal (EPERM: no CAP_KILL
	                   * for another uid's), left out */
};

static bool in_tree(const struct tree *t, uint32_t pid)
{
	for (uint32_t i = 0; i < t->n; i++)
		if (t->pid[i] == pid)
			return true;
	return false;
}

/* The parent pid of `pid`, or 0. */
static uint32_t ppid_of(uint32_t pid)
{
	char state;
	uint32_t ppid;
	return mts_read_state_ppid((pid_t)pid, &state, &ppid) == 0 ? ppid : 0;
}

/* Add the children of t->pid[i], each checked to be its child once its
 * pidfd is open, and send it `sig` (SIGSTOP, or 0 for none). */
static void add_children(struct tree *t, uint32_t i, uint32_t self, int sig)
{
	/* A thread's children, up to a full tree's worth of pids (the loop
	 * thread's alone, as the guard is). */
	static char buf[MTS_GUARD_TREE_MAX * 12];
	char dir[48];
	snprintf(dir, sizeof(dir), "/proc/%u/task", t->pid[i]);
	DIR *d = opendir(dir);
	if (!d)
		return;
	struct dirent *e;
	while ((e = readdir(d))) {
		if (e->d_name[0] < '0' || e->d_name[0] > '9')
			continue;
		char tdir[320];
		snprintf(tdir, sizeof(tdir), "%s/%s", dir, e->d_name);
		ssize_t len =
		    mts_read_small(tdir, "children", buf, sizeof(buf));
		if (len < 0)
			continue;
		/* Filled: its last pid may be cut short. */
		if ((size_t)len == sizeof(buf) - 1) {
			char *sp = strrchr(buf, ' ');
			*(sp ? sp : buf) = '\0';
			t->cut = true;
		}
		for (char *s = buf, *end; *s; s = end) {
			unsigned long v = strtoul(s, &end, 10);
			if (end == s)
				break;
			uint32_t pid = (uint32_t)v;
			if (pid == self || in_tree(t, pid))
				continue;
			if (t->n == MTS_GUARD_TREE_MAX) {
				t->cut = true;
				break;
			}
			int fd = (int)pidfd_open((pid_t)pid, 0);
			if (fd < 0) {
				if (errno == EMFILE || errno == ENFILE ||
				    errno == ENOMEM)
					t->cut = true;
				continue;
			}
			/* Its parent's pid now, and the parent still alive
			 * after that read: our pidfd pins its pid, so the
			 * number is not a recycled one, and `pid` (pinned by
			 * `fd`) really is its child. A member that died is
			 * walked no further. */
			if (ppid_of(pid) != t->pid[i] ||
			    pidfd_send_signal(t->fd[i], 0, NULL, 0) < 0 ||
			    (sig && pidfd_send_signal(fd, sig, NULL, 0) < 0)) {
				if (errno == EPERM)
					t->denied++;
				close(fd);
				continue;
			}
			t->fd[t->n] = fd;
			t->pid[t->n] = pid;
			t->n++;
		}
	}
	closedir(d);
}

/* Has every process of `t` stopped (or gone)? */
static bool tree_stopped(const struct tree *t)
{
	for (uint32_t i = 0; i < t->n; i++) {
		char state;
		uint32_t ppid;
		if (pidfd_send_signal(t->fd[i], 0, NULL, 0) < 0 ||
		    mts_read_state_ppid((pid_t)t->pid[i], &state, &ppid) < 0)
			continue; /* gone */
		if (!strchr("TtZX", state))
			return false;
	}
	return true;
}

/* Stop candidate `k`'s workers and their descendants, each held by a
 * pidfd of ours in `t`. A stopped process cannot fork a child the walk
 * would miss, but SIGSTOP takes effect when the process next runs, and a
 * fork may complete between the signal and the read of its children. So
 * once the tree has stopped (or MTS_GUARD_STOP_WAIT_NS has passed: a
 * process in uninterruptible sleep stops late) it is walked again. */
#define MTS_GUARD_STOP_WAIT_NS (UINT64_C(20) * 1000000u)
static void stop_tree(struct mts_registry *reg, const struct mts_guard_cand *k,
                      struct tree *t)
{
	uint32_t self = (uint32_t)getpid();
	t->n = 0;
	t->cut = false;
	t->denied = 0;
	for (uint32_t i = 0; i < reg->ndense; i++) {
		struct mts_proc *p = reg->by_slot[reg->dense[i]];
		bool mine = is_of(p, k);
		if (!mine || p->pid == self || p->pidfd < 0)
			continue;
		if (t->n == MTS_GUARD_TREE_MAX) {
			t->cut = true; /* said after the eviction */
			break;
		}
		/* Our own copy: a held task outlives its worker's entry. */
		int fd = fcntl(p->pidfd, F_DUPFD_CLOEXEC, 0);
		if (fd < 0)
			continue;
		if (pidfd_send_signal(fd, SIGSTOP, NULL, 0) < 0) {
			/* Gone already, or not ours to signal. */
			if (errno == EPERM)
				t->denied++;
			close(fd);
			continue;
		}
		t->fd[t->n] = fd;
		t->pid[t->n] = p->pid;
		t->n++;
	}
	/* The processes of the candidate that never registered (strays,
	 * strays_add), each checked to be the process found: its start
	 * time read again once its pidfd pins the pid. */
	for (uint32_t r = 0; r < k->nroots && t->n < MTS_GUARD_TREE_MAX; r++) {
		uint32_t pid = k->root_pid[r], pp;
		uint64_t st;
		if (pid == self || in_tree(t, pid))
			continue;
		int fd = (int)pidfd_open((pid_t)pid, 0);
		if (fd < 0)
			continue;
		if (mts_read_parent((pid_t)pid, &pp, &st) < 0 ||
		    st != k->root_start[r] ||
		    pidfd_send_signal(fd, SIGSTOP, NULL, 0) < 0) {
			if (errno == EPERM)
				t->denied++;
			close(fd);
			continue;
		}
		t->fd[t->n] = fd;
		t->pid[t->n] = pid;
		t->n++;
	}
	/* The roots too: what they descend from says whose run it is. */
	t->workers = t->n;
	/* Breadth first: the list grows as it is walked. */
	for (uint32_t i = 0; i < t->n; i++)
		add_children(t, i, self, SIGSTOP);
	uint64_t until = mts_now_monotonic() + MTS_GUARD_STOP_WAIT_NS;
	while (t->n && !tree_stopped(t) && mts_now_monotonic() < until) {
		struct timespec ts = {0, 1000000};
		nanosleep(&ts, NULL);
	}
	for (uint32_t i = 0; i < t->n; i++)
		add_children(t, i, self, SIGSTOP);
}

/* Send `sig` to every process of `t`; how many took it. */
static uint32_t signal_tree(const struct tree *t, int sig)
{
	uint32_t took = 0;
	for (uint32_t i = 0; i < t->n; i++)
		if (pidfd_send_signal(t->fd[i], sig, NULL, 0) == 0)
			took++;
	return took;
}

static void close_tree(struct tree *t)
{
	for (uint32_t i = 0; i < t->n; i++)
		close(t->fd[i]);
	t->n = 0;
}

/*
 * What the eviction teaches: the task's kind ran out of room at the peak
 * its reservations followed (at least `used`, vouched figures only), and
 * its learned size rises. The only place an eviction is recorded against
 * a kind.
 */
static void guard_record_eviction(struct mts_registry *reg,
                                  const struct mts_guard_cand *k)
{
	if (!k->task[0]) {
		mts_host_evicted(reg, k->pid);
		return;
	}
	mts_task_evicted(reg, k->task, k->uid, k->ownerless_ours);
	/* And the tasks its workers ran inside them, which end with them:
	 * evicted runs, not runs that finished early. */
	for (uint32_t i = 0; i < reg->ndense; i++) {
		const struct mts_proc *p = reg->by_slot[reg->dense[i]];
		if (is_of(p, k))
			mts_host_evicted(reg, p->pid);
	}
}

/* Candidates for the decision record, furthest beyond first. */
static int cmp_beyond(const void *a, const void *b)
{
	const struct mts_guard_cand *x = a, *y = b;
	int64_t ex = (int64_t)(x->used -
	                       (x->used > x->reserved ? x->reserved : x->used));
	int64_t ey = (int64_t)(y->used -
	                       (y->used > y->reserved ? y->reserved : y->used));
	if (ex != ey)
		return ex > ey ? -1 : 1;
	return x->used > y->used ? -1 : x->used < y->used;
}

static void log_candidates(struct mts_guard_cand *c, uint32_t n)
{
	qsort(c, n, sizeof(*c), cmp_beyond);
	for (uint32_t i = 0; i < n && i < MTS_GUARD_LOG_CANDIDATES; i++) {
		char q[MTS_LOGQ_MAX];
		mts_log(MTS_LOG_WARN, "node guard: candidate",
		        "task=%s uid=%u pid=%u workers=%u unregistered=%u "
		        "reserved=%llu used=%llu uid_beyond=%llu "
		        "growth_bps=%.0f eligible=%d",
		        mts_logq(q, sizeof(q), c[i].task), c[i].uid, c[i].pid,
		        c[i].workers, c[i].nroots,
		        (unsigned long long)c[i].reserved,
		        (unsigned long long)c[i].used,
		        (unsigned long long)c[i].uid_beyond, c[i].growth,
		        c[i].eligible);
	}
	if (n > MTS_GUARD_LOG_CANDIDATES)
		mts_log(MTS_LOG_WARN, "node guard: candidates not listed",
		        "more=%u", n - MTS_GUARD_LOG_CANDIDATES);
}

/* ---- pausing before evicting --------------------------------------------- */

/* A task paused: its processes, stopped, and what it was chosen as. */
struct mts_guard_hold {
	struct tree t;
	struct mts_guard_cand k;
	char task[MTS_NAME_MAX + 1];
	enum mts_guard_rule rule;
	uint32_t candidates;
	uint64_t since_ns; /* CLOCK_MONOTONIC */
};

bool mts_guard_hold_safe(uint64_t usage, uint64_t line, uint64_t limit,
                         double rise_bps)
{
	if (usage >= limit || line >= limit)
		return false;
	double need = (double)((limit - line) / MTS_GUARD_HOLD_FLOOR_DIV);
	if (rise_bps > 0)
		need += rise_bps * MTS_GUARD_HOLD_HORIZON_MS / 1000.0;
	return (double)(limit - usage) >= need;
}

/* Remember this read, for the node's rise. */
static void seen_add(struct mts_guard_state *g, int64_t room, uint64_t now_ns)
{
	g->seen_room[g->seen_head] = room;
	g->seen_ns[g->seen_head] = now_ns;
	g->seen_head = (g->seen_head + 1) % MTS_GUARD_SEEN;
	if (g->seen_n < MTS_GUARD_SEEN)
		g->seen_n++;
}

/* How fast the node rose over the reads kept, counting only those taken
 * at or after `since_ns`; bytes per second, 0 with fewer than two. */
static double node_rise(const struct mts_guard_state *g, uint64_t since_ns)
{
	uint32_t newest = (g->seen_head + MTS_GUARD_SEEN - 1) % MTS_GUARD_SEEN;
	int oldest = -1;
	for (uint32_t j = g->seen_n; j > 1; j--) {
		uint32_t i =
		    (g->seen_head + MTS_GUARD_SEEN - j) % MTS_GUARD_SEEN;
		if (g->seen_ns[i] >= since_ns) {
			oldest = (int)i;
			break;
		}
	}
	if (oldest < 0 || g->seen_ns[newest] <= g->seen_ns[oldest])
		return 0;
	double dv = (double)g->seen_room[(uint32_t)oldest] -
	            (double)g->seen_room[newest];
	return dv * 1e9 / (double)(g->seen_ns[newest] - g->seen_ns[oldest]);
}

/* Set or clear the restart record's mark on the held task's workers, so
 * that a memtallyd killed while holding it has its successor resume it.
 * A worker whose entry is missing (its registration's write failed, or a
 * slot reused) gets one written now. Setting: false unless every worker
 * is marked, for a worker stopped unmarked would stay stopped after a
 * crash; the caller then does not pause. */
static bool mark_held(struct mts_registry *reg, const struct mts_guard_cand *k,
                      bool held)
{
	if (!reg->state)
		return !held;
	bool all = true;
	for (uint32_t i = 0; i < reg->ndense; i++) {
		struct mts_proc *p = reg->by_slot[reg->dense[i]];
		if (!is_of(p, k))
			continue;
		struct mts_state_rec r;
		if (held && (mts_state_get(reg->state, p->slot, &r) < 0 ||
		             r.pid != p->pid))
			mts_registry_record(reg, p);
		if (mts_state_get(reg->state, p->slot, &r) < 0 ||
		    r.pid != p->pid) {
			all = false;
			continue;
		}
		if (r.held == held)
			continue;
		r.held = held;
		if (mts_state_put(reg->state, p->slot, &r) < 0)
			all = false;
	}
	return all;
}

/* ---- the eviction -------------------------------------------------------- */

/* The figures of a choice, in words: "paused by the node guard: node at
 * ..." or "evicted by ...". */
static void describe(char *buf, size_t len, const char *verb,
                     const struct mts_guard_state *g,
                     const struct mts_guard_cand *k, enum mts_guard_rule rule,
                     uint32_t n)
{
	char a[32], b[32], d[32], e[32], f[32], who[48];
	bool c = g->node.by_commit;
	if (!k->task[0])
		snprintf(who, sizeof(who), "process %u", k->pid);
	snprintf(buf, len,
	         "%s by the node guard: %s at %s, past its line %s "
	         "(%s %s); %s%s used %s against %s reserved, %s of %u "
	         "candidates",
	         verb, c ? "node's commit charge" : "node",
	         mt_format_size(a, sizeof(a), g->node.usage),
	         mt_format_size(b, sizeof(b), g->node.line),
	         c ? "CommitLimit" : "limit",
	         mt_format_size(d, sizeof(d), g->node.limit),
	         k->task[0] ? "task " : who, k->task[0] ? k->task : "",
	         mt_format_size(e, sizeof(e), k->used),
	         mt_format_size(f, sizeof(f), k->reserved),
	         mts_guard_rule_name(rule), n);
	/* It quotes a task's name and may be cut inside a character: whole
	 * UTF-8 before it goes to every Watch subscriber (a decoder refuses
	 * a string that is not). Once here, not once per subscriber. */
	mt_utf8_scrub(buf);
}

/* The most processes an event's workers are said to descend from. */
#define MTS_EVENT_ANCESTORS_MAX 512u

/* A Watch event for the candidate's scope ("task:NAME" or "pid:N"):
 * OVER for an eviction, HIGH for a pause, OK for a resume, sent while
 * the processes are stopped (or before they are killed). It names what
 * the task's workers in `t` descend from, so that a subscriber is told
 * whether they are its own command's (mts_event_visible): read once here,
 * not per subscriber. A worker's walk counts only if its pidfd still
 * answers after it: its pid was not reused meanwhile. */
static void send_event(struct mts_registry *reg, const struct mts_guard_cand *k,
                       const struct tree *t, uint8_t state, uint8_t previous,
                       const char *reason)
{
	struct mts_guard_state *g = reg->guard;
	if (!reg->lim || !reg->lim->on_event)
		return;
	static uint32_t anc[MTS_EVENT_ANCESTORS_MAX];
	uint32_t na = 0;
	for (uint32_t i = 0; k->task[0] && i < t->workers; i++) {
		uint32_t before = na;
		if (pidfd_send_signal(t->fd[i], 0, NULL, 0) < 0)
			continue;
		int err = mts_add_ancestors(t->pid[i], anc, &na,
		                            MTS_EVENT_ANCESTORS_MAX);
		if (pidfd_send_signal(t->fd[i], 0, NULL, 0) < 0)
			na = before;
		if (err == -ENOSPC)
			break;
	}
	qsort(anc, na, sizeof(anc[0]), mt_cmp_u32);
	char scope[MTS_NAME_MAX + 16];
	if (k->task[0])
		snprintf(scope, sizeof(scope), "task:%s", k->task);
	else
		snprintf(scope, sizeof(scope), "pid:%u", k->pid);
	struct mts_event ev = {
	    .scope = scope,
	    .state = state,
	    .previous = previous,
	    .bytes = k->used,
	    .limit = g->node.line,
	    .reserved = k->reserved,
	    .time_ns = mts_now_realtime(),
	    .reason = reason,
	    .growth = k->growth,
	    .has_uid = true,
	    .uid = k->uid,
	    .ancestors = anc,
	    .nancestors = na,
	};
	reg->lim->on_event(reg->lim->event_ctx, &ev);
}

static const char *rule_key(enum mts_guard_rule rule)
{
	return rule == MTS_GUARD_BEYOND   ? "beyond"
	       : rule == MTS_GUARD_GROWTH ? "growth"
	                                  : "youngest";
}

/* The decision record: the node, the one chosen and why, the others. */
static void log_decision(const char *msg, const struct mts_guard_state *g,
                         const struct mts_guard_cand *k,
                         enum mts_guard_rule rule, uint32_t n,
                         const char *reason, double rise)
{
	char q[MTS_LOGQ_MAX], qr[2 * MTS_LOGQ_MAX];
	mts_log(MTS_LOG_WARN, msg,
	        "task=%s uid=%u pid=%u workers=%u unregistered=%u "
	        "reserved=%llu used=%llu "
	        "uid_beyond=%llu growth_bps=%.0f node_usage=%llu "
	        "node_line=%llu node_limit=%llu node_rise_bps=%.0f source=%s "
	        "edge=%s rule=%s candidates=%u why=%s",
	        mts_logq(q, sizeof(q), k->task), k->uid, k->pid, k->workers,
	        k->nroots, (unsigned long long)k->reserved,
	        (unsigned long long)k->used, (unsigned long long)k->uid_beyond,
	        k->growth, (unsigned long long)g->node.usage,
	        (unsigned long long)g->node.line,
	        (unsigned long long)g->node.limit, rise,
	        mts_node_kind_name(g->src.kind), mts_node_edge_name(&g->node),
	        rule_key(rule), n, mts_logq(qr, sizeof(qr), reason));
}

/* Evict `k`, whose processes `t` holds stopped (the guard's or a hold's),
 * for `reason` (describe()): its event first, so by the time `memtally run`
 * sees its command die, what killed it is in its socket; then SIGKILL; then the
 * record against its kind. */
static void kill_held(struct mts_registry *reg, const struct mts_guard_cand *k,
                      struct tree *t, const char *reason)
{
	struct mts_guard_state *g = reg->guard;
	char q[MTS_LOGQ_MAX];
	if (signal_tree(t, 0) == 0) {
		/* Its processes ended on their own meanwhile: nothing to
		 * evict, and nothing learned against its kind. Or memtallyd
		 * may not signal them (a non-root memtallyd, a container
		 * without CAP_KILL): the kernel's OOM killer will choose,
		 * which an operator must hear, not "ended". */
		close_tree(t);
		if (t->denied)
			mts_log(MTS_LOG_ERROR,
			        "node guard: may not signal the task's "
			        "processes; nothing evicted (memtallyd needs "
			        "CAP_KILL to signal another uid's)",
			        "task=%s uid=%u denied=%u",
			        mts_logq(q, sizeof(q), k->task), k->uid,
			        t->denied);
		else
			mts_log(MTS_LOG_INFO,
			        "node guard: its choice had ended",
			        "task=%s uid=%u",
			        mts_logq(q, sizeof(q), k->task), k->uid);
		return;
	}
	send_event(reg, k, t, MTSHM_STATE_OVER, MTSHM_STATE_OVER, reason);
	uint32_t killed = signal_tree(t, SIGKILL);
	close_tree(t);
	g->evictions++;
	g->signalled += killed;
	mts_log(MTS_LOG_WARN, "node guard: evicted", "task=%s uid=%u killed=%u",
	        mts_logq(q, sizeof(q), k->task), k->uid, killed);
	if (t->cut)
		mts_log(MTS_LOG_WARN,
		        "node guard: the task's process tree was larger than "
		        "it could hold; descendants past it were not signalled",
		        "task=%s uid=%u held=%u max=%u",
		        mts_logq(q, sizeof(q), k->task), k->uid, killed,
		        MTS_GUARD_TREE_MAX);
	/* At an eviction the task is at its peak: what it holds now. */
	guard_record_eviction(reg, k);
}

/* Stop `k` and hold it while the node has room: it grows no more, and
 * what the others free may let it finish. */
static void pause_task(struct mts_registry *reg, const struct mts_guard_cand *k,
                       enum mts_guard_rule rule, uint32_t n, uint64_t now_ns,
                       double rise)
{
	struct mts_guard_state *g = reg->guard;
	struct mts_guard_hold *h = calloc(1, sizeof(*h));
	if (!h)
		return;
	h->k = *k;
	snprintf(h->task, sizeof(h->task), "%s", k->task);
	h->k.task = h->task;
	h->rule = rule;
	h->candidates = n;
	h->since_ns = now_ns;
	char reason[640];
	describe(reason, sizeof(reason), "paused", g, &h->k, rule, n);
	log_decision("node guard: pausing", g, &h->k, rule, n, reason, rise);
	/* Marked before the signal: a memtallyd killed in between leaves
	 * its successor a running task to resume, never a stopped one
	 * unmarked. */
	if (!mark_held(reg, &h->k, true)) {
		char q[MTS_LOGQ_MAX];
		mts_log(MTS_LOG_WARN,
		        "node guard: cannot mark the task held in the restart "
		        "record; evicting it instead of pausing",
		        "task=%s uid=%u", mts_logq(q, sizeof(q), h->task),
		        h->k.uid);
		mark_held(reg, &h->k, false);
		free(h);
		return;
	}
	stop_tree(reg, &h->k, &h->t);
	if (h->t.n == 0) {
		mark_held(reg, &h->k, false);
		free(h);
		return;
	}
	send_event(reg, &h->k, &h->t, MTSHM_STATE_HIGH, MTSHM_STATE_OK, reason);
	g->hold = h;
	g->pauses++;
}

/* End the hold: the guard no longer holds it, nor does the restart
 * record. The caller resumes, kills or drops its processes, then frees
 * it. */
static struct mts_guard_hold *take_hold(struct mts_registry *reg)
{
	struct mts_guard_hold *h = reg->guard->hold;
	reg->guard->hold = NULL;
	mark_held(reg, &h->k, false);
	return h;
}

void mts_guard_resume_adopted(uint32_t pid, int pidfd)
{
	struct tree *t = calloc(1, sizeof(*t));
	if (!t)
		return;
	t->fd[0] = fcntl(pidfd, F_DUPFD_CLOEXEC, 0);
	t->pid[0] = pid;
	if (t->fd[0] < 0) {
		free(t);
		return;
	}
	t->n = 1;
	uint32_t self = (uint32_t)getpid();
	for (uint32_t i = 0; i < t->n; i++)
		add_children(t, i, self, 0);
	uint32_t took = signal_tree(t, SIGCONT);
	close_tree(t);
	free(t);
	mts_log(MTS_LOG_WARN,
	        "node guard: resumed a task the memtallyd before held paused",
	        "pid=%u processes=%u", pid, took);
}

void mts_guard_release(struct mts_registry *reg, const char *why)
{
	struct mts_guard_state *g = reg->guard;
	if (!g || !g->hold)
		return;
	struct mts_guard_hold *h = take_hold(reg);
	char q[MTS_LOGQ_MAX], msg[256];
	double held_s = (double)(mts_now_monotonic() - h->since_ns) / 1e9;
	snprintf(msg, sizeof(msg), "resumed by the node guard after %.1f s: %s",
	         held_s, why);
	/* Said while still stopped: the workers it names are still there. */
	send_event(reg, &h->k, &h->t, MTSHM_STATE_OK, MTSHM_STATE_HIGH, msg);
	uint32_t took = signal_tree(&h->t, SIGCONT);
	close_tree(&h->t);
	mts_log(MTS_LOG_WARN, "node guard: resumed",
	        "task=%s uid=%u processes=%u held_s=%.3f why=%s",
	        mts_logq(q, sizeof(q), h->task), h->k.uid, took, held_s, why);
	g->resumed++;
	free(h);
}

/* The step while a task is held: resume it once the node is back under
 * its line; evict it when the node rises towards its limit anyway (the
 * others grow) or the interval is up. */
static void step_hold(struct mts_registry *reg, uint64_t now_ns)
{
	struct mts_guard_state *g = reg->guard;
	struct mts_guard_hold *h = g->hold;
	/* Resumed once the node is under its line by the floor: a node
	 * hovering at the line would otherwise stop and start it at every
	 * read. Between the two, it stays as it is, for at most the
	 * interval: under the line, the interval ends in a resume. */
	uint64_t floor =
	    (g->node.limit - g->node.line) / MTS_GUARD_HOLD_FLOOR_DIV;
	uint64_t interval = (uint64_t)g->interval_ms * 1000000u;
	if (g->node.usage + floor <= g->node.line ||
	    (g->node.usage <= g->node.line &&
	     now_ns - h->since_ns >= interval)) {
		mts_guard_release(reg, "the node is back under its line");
		return;
	}
	if (g->node.usage <= g->node.line)
		return;
	/* Its processes gone (killed by someone else, or done): no hold. */
	if (signal_tree(&h->t, 0) == 0) {
		take_hold(reg);
		close_tree(&h->t);
		free(h);
		return;
	}
	double rise = node_rise(g, h->since_ns);
	bool safe = mts_guard_hold_safe(g->node.usage, g->node.line,
	                                g->node.limit, rise);
	if (safe && now_ns - h->since_ns < interval)
		return;
	take_hold(reg);
	char reason[640];
	describe(reason, sizeof(reason), "evicted", g, &h->k, h->rule,
	         h->candidates);
	log_decision(safe ? "node guard: evicting the paused task, its time "
	                    "is up"
	                  : "node guard: evicting the paused task, the node "
	                    "still rises",
	             g, &h->k, h->rule, h->candidates, reason, rise);
	g->last_eviction_ns = now_ns;
	kill_held(reg, &h->k, &h->t, reason);
	free(h);
}

static void evict(struct mts_registry *reg, uint64_t now_ns)
{
	struct mts_guard_state *g = reg->guard;
	struct mts_guard_cand *c;
	uint32_t n;
	int ci;
	enum mts_guard_rule rule;
	uint64_t last = g->last_eviction_ns;
	g->last_eviction_ns = now_ns; /* one choice per interval either way */
	if (build(reg, &c, &n) < 0)
		return;
	strays_add(reg, &c, &n);
	ci = n ? choose(c, n, &rule) : -1;
	if (ci < 0) {
		if (!g->idle_logged)
			mts_log(MTS_LOG_WARN,
			        "node past the guard's line; no task may be "
			        "evicted",
			        "edge=%s usage=%llu line=%llu limit=%llu "
			        "candidates=%u",
			        mts_node_edge_name(&g->node),
			        (unsigned long long)g->node.usage,
			        (unsigned long long)g->node.line,
			        (unsigned long long)g->node.limit, n);
		g->idle_logged = true;
		free(c);
		return;
	}
	struct mts_guard_cand k = c[ci];
	char task[MTS_NAME_MAX + 1];
	snprintf(task, sizeof(task), "%s", k.task);
	k.task = task;
	double rise = node_rise(g, 0);
	/* Pause only what grows (stopping it stops the rise) and only
	 * while the node's room holds what it may still add meanwhile: a
	 * pause frees nothing. One beyond its reservation took what nobody
	 * granted it, and goes at once. */
	/* Never a task with processes that never registered: the restart
	 * record could not mark them, and a successor would leave them
	 * stopped. */
	if (g->pause && reg->state && rule == MTS_GUARD_GROWTH && !k.nroots &&
	    mts_guard_hold_safe(g->node.usage, g->node.line, g->node.limit,
	                        rise)) {
		pause_task(reg, &k, rule, n, now_ns, rise);
		if (g->hold) {
			/* Not an eviction: once resumed, the guard may act
			 * again at the next check. */
			g->last_eviction_ns = last;
			log_candidates(c, n);
			free(c);
			return;
		}
	}
	char reason[640];
	describe(reason, sizeof(reason), "evicted", g, &k, rule, n);
	log_decision("node guard: evicting", g, &k, rule, n, reason, rise);
	log_candidates(c, n);
	free(c);
	struct tree *t = calloc(1, sizeof(*t));
	if (!t)
		return;
	stop_tree(reg, &k, t);
	kill_held(reg, &k, t, reason);
	free(t);
}

void mts_guard_check(struct mts_registry *reg, uint64_t now_ns)
{
	struct mts_guard_state *g = reg->guard;
	if (!g || g->src.kind == MTS_NODE_NONE)
		return;
	struct mts_node_fig fig;
	uint64_t t0 = mts_now_monotonic();
	int err = mts_node_read(&g->src, &fig);
	g->reads++;
	g->read_ns += mts_now_monotonic() - t0;
	if (err < 0 || fig.limit == 0) {
		if (!g->read_failed_logged)
			mts_log(MTS_LOG_ERROR,
			        "node guard cannot read the node; no eviction "
			        "and no node check at admission until it can",
			        "source=%s path=%s err=%s",
			        mts_node_kind_name(g->src.kind), g->src.dir,
			        err < 0 ? strerror(-err) : "no limit");
		g->read_failed_logged = true;
		g->known = false;
		/* Blind: nothing may stay stopped on a figure we lost. */
		mts_guard_release(reg, "the node cannot be read");
		return;
	}
	g->read_failed_logged = false;
	mts_node_edge(&reg->policy, &fig);
	if (fig.by_commit != g->node.by_commit)
		mts_log(MTS_LOG_INFO,
		        "node guard: the edge nearest its line changed",
		        "edge=%s usage=%llu line=%llu limit=%llu "
		        "mem_usage=%llu mem_line=%llu",
		        mts_node_edge_name(&fig), (unsigned long long)fig.usage,
		        (unsigned long long)fig.line,
		        (unsigned long long)fig.limit,
		        (unsigned long long)fig.mem_usage,
		        (unsigned long long)fig.mem_line);
	g->node = fig;
	g->known = true;
	seen_add(g, (int64_t)fig.line - (int64_t)fig.usage, now_ns);
	if (g->hold) {
		step_hold(reg, now_ns);
		return;
	}
	if (fig.usage <= fig.line) {
		g->idle_logged = false;
		return;
	}
	uint64_t interval = (uint64_t)g->interval_ms * 1000000u;
	if (g->last_eviction_ns && now_ns - g->last_eviction_ns < interval)
		return;
	evict(reg, now_ns);
}
