/*
 * admit.c - admission: Admit, reservations, Release, and their
 * reconciliation with the workers of a task.
 *
 * An Admit{bytes, group, task, ttl} is granted only if, for the fleet and
 * for the group (each only when it has a limit),
 *
 *     measured + reserved + bytes <= limit
 *
 * where `measured` is per policy.measure and `reserved` is what the
 * outstanding reservations count at that moment. A grant is a reservation
 * with an id: "r-" and 16 hex digits from getrandom, so nobody can guess
 * an id to release someone else's. A reservation ends by Release, by its
 * TTL, or, when it names a task, when the workers of that task have all
 * exited.
 *
 * Reconciliation. Workers that register with MEMTALLY_TASK=T use memory the
 * reservations for T set aside, and counting both would count that memory
 * twice. So each tick the measured bytes of T's live workers (what they
 * count toward the others: an untrusted claim as far as vouched) are set
 * against T's reservations, oldest first. Each reservation counts only
 * what is left of it:
 *
 *     effective = max(0, bytes - (what T's workers use, not yet set
 *                                 against older reservations of T))
 *
 * The fleet thus sees max(reserved, used), not their sum. Once a worker of
 * T has registered, T's reservations are "taken over". Their TTL, which is
 * for admissions whose task never starts, stops applying. They end when T
 * has no live worker left, or max_ttl after they were granted, whichever
 * comes first. A worker's group need not be the reservation's. The fleet
 * figure is right either way, a group's only when they agree. "A worker
 * of T" means one that may act on the reservation: its owner's or an
 * admin's (see "ownership" below).
 *
 * One uid may hold at most policy.max_resv_per_uid reservations, counted
 * in reg->adm->resv_uids. Past it Admit is denied (MTS_DENY_UID_CAP), so
 * one peer cannot take MTS_RESV_MAX for itself. Admins are exempt.
 *
 * A scheduler holds one reservation per task it is starting, and may hold
 * thousands, up to MTS_RESV_MAX. They live in an unordered array, removed
 * by swapping in the last. An index by id makes a Release, and a new id's
 * uniqueness check, one probe. A min-heap by expiry holds those whose TTL
 * applies, so a tick looks only at those due. What they count is kept up
 * to date as they come and go (see resv_count). Admit, Release and an
 * expiry thus cost O(1) amortised plus O(reservations of their task), not
 * O(reservations), which would make every request dearer as reservations
 * pile up. Tasks are in a small hash table, so the tick's pass over the
 * workers is O(1) per worker.
 */
#include "mts_admit.h"

#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>

#include "mts_auth.h"
#include "mts_defs.h"
#include "mts_kinds.h"
#include "mts_node.h"
#include "mts_limits.h"
#include "mts_log.h"
#include "mts_policy.h"
#include "mts_procfs.h"
#include "mts_registry.h"
#include "mts_vouch.h"

/* struct mts_task_share entries of a task (see "ownership" below). */
#define SHARE_ADMINS 0u
#define SHARE_OTHERS 1u
#define SHARE_OWNERS 2u /* first owner's entry */

const char *mts_denial_name(enum mts_denial d)
{
	switch (d) {
	case MTS_DENY_FLEET_LIMIT:
		return "fleet_limit";
	case MTS_DENY_GROUP_LIMIT:
		return "group_limit";
	case MTS_DENY_INVALID:
		return "invalid";
	case MTS_DENY_UID_CAP:
		return "uid_reservations";
	case MTS_DENY_GROUP_NOT_ALLOWED:
		return "group_not_allowed";
	case MTS_DENY_UID_BYTES:
		return "uid_reserved_bytes";
	case MTS_DENY_KIND_CAP:
		return "kinds";
	case MTS_DENY_NODE:
		return "node_line";
	case MTS_DENY_HOST_LIMIT:
		return "host_limit";
	case MTS_DENY_FULL:
		return "reservations_full";
	default:
		return "unknown";
	}
}

/* ---- tasks ----------------------------------------------------------------
 */

static uint64_t hash_str(const char *s)
{
	uint64_t h = UINT64_C(0xcbf29ce484222325); /* FNV-1a */
	for (; *s; s++) {
		h ^= (unsigned char)*s;
		h *= UINT64_C(0x100000001b3);
	}
	return h;
}

static struct mts_task *task_find(const struct mts_registry *reg,
                                  const char *name, uint64_t h)
{
	if (!reg->adm->tasks)
		return NULL;
	struct mts_task *t = reg->adm->tasks[h & reg->adm->tasks_mask];
	while (t && (t->hash != h || strcmp(t->name, name) != 0))
		t = t->hnext;
	return t;
}

static int tasks_grow(struct mts_registry *reg)
{
	uint32_t n = reg->adm->tasks ? (reg->adm->tasks_mask + 1) * 2 : 64;
	struct mts_task **b = calloc(n, sizeof(*b));
	if (!b)
		return -ENOMEM;
	if (reg->adm->tasks) {
		for (uint32_t i = 0; i <= reg->adm->tasks_mask; i++) {
			struct mts_task *t = reg->adm->tasks[i];
			while (t) {
				struct mts_task *next = t->hnext;
				t->hnext = b[t->hash & (n - 1)];
				b[t->hash & (n - 1)] = t;
				t = next;
			}
		}
		free(reg->adm->tasks);
	}
	reg->adm->tasks = b;
	reg->adm->tasks_mask = n - 1;
	return 0;
}

static struct mts_task *task_get(struct mts_registry *reg, const char *name)
{
	uint64_t h = hash_str(name);
	struct mts_task *t = task_find(reg, name, h);
	if (t)
		return t;
	if ((!reg->adm->tasks ||
	     reg->adm->ntasks >= 2 * (reg->adm->tasks_mask + 1)) &&
	    tasks_grow(reg) < 0)
		return NULL;
	t = calloc(1, sizeof(*t));
	if (!t)
		return NULL;
	t->name = strdup(name);
	if (!t->name) {
		free(t);
		return NULL;
	}
	t->shares = calloc(4, sizeof(*t->shares));
	if (!t->shares) {
		free(t->name);
		free(t);
		return NULL;
	}
	t->shares_cap = 4;
	t->nshares = SHARE_OWNERS;
	t->hash = h;
	t->hnext = reg->adm->tasks[h & reg->adm->tasks_mask];
	reg->adm->tasks[h & reg->adm->tasks_mask] = t;
	reg->adm->ntasks++;
	return t;
}

static void task_drop(struct mts_registry *reg, struct mts_task *t)
{
	struct mts_task **pp = &reg->adm->tasks[t->hash & reg->adm->tasks_mask];
	while (*pp && *pp != t)
		pp = &(*pp)->hnext;
	if (*pp)
		*pp = t->hnext;
	if (t->seen) {
		if (t->sprev)
			t->sprev->snext = t->snext;
		else
			reg->adm->tasks_seen = t->snext;
		if (t->snext)
			t->snext->sprev = t->sprev;
	}
	reg->adm->ntasks--;
	free(t->shares);
	free(t->name);
	free(t);
}

uint64_t mts_task_reserved(const struct mts_registry *reg, const char *task,
                           uint32_t uid, uint64_t *ownerless, uint64_t *since)
{
	*ownerless = 0;
	*since = 0;
	if (!task[0] || reg->adm->ntasks == 0)
		return 0;
	const struct mts_task *t = task_find(reg, task, hash_str(task));
	uint64_t sum = 0;
	for (const struct mts_resv *r = t ? t->resv : NULL; r; r = r->tnext) {
		if (!r->has_owner) {
			/* Oldest first: the first is the earliest. */
			if (!*ownerless)
				*since = r->created_ns;
			*ownerless = mt_sat_add(*ownerless, r->bytes);
		} else if (r->uid == uid)
			sum = mt_sat_add(sum, r->bytes);
	}
	return sum;
}

bool mts_task_owned_by(const struct mts_registry *reg, const char *task,
                       bool has_owner, uint32_t uid)
{
	if (!task[0] || reg->adm->ntasks == 0)
		return false;
	const struct mts_task *t = task_find(reg, task, hash_str(task));
	for (const struct mts_resv *r = t ? t->resv : NULL; r; r = r->tnext)
		if (has_owner ? r->has_owner && r->uid == uid : !r->has_owner)
			return true;
	return false;
}

void mts_task_evicted(struct mts_registry *reg, const char *task, uint32_t uid,
                      bool ownerless)
{
	if (!task[0] || reg->adm->ntasks == 0)
		return;
	struct mts_task *t = task_find(reg, task, hash_str(task));
	for (struct mts_resv *r = t ? t->resv : NULL; r; r = r->tnext)
		if ((r->has_owner ? r->uid == uid : ownerless) && r->kind &&
		    !r->evicted)
			mts_resv_evicted(reg, r);
}

/* A hosted reservation's task still runs inside `pid`. */
static bool hosted_by(const struct mts_resv *r, uint32_t pid)
{
	return r->hosted && !r->taken_over && !r->host_unbound &&
	       r->host_pid == pid;
}

/* How many hosted tasks run inside `pid` now (at least 1). */
static uint32_t hosted_count(const struct mts_registry *reg, uint32_t pid)
{
	uint32_t n = 0;
	for (uint32_t i = 0; reg->adm->nhosted && i < reg->adm->nresv; i++)
		n += hosted_by(reg->adm->resv[i], pid);
	return n ? n : 1;
}

/* The hosted reservations of `pid` on thread `tid` (0: no thread, the
 * whole process's growth): more than one where a pool runs several tasks
 * at once on one thread (gevent's and eventlet's green threads), each of
 * which can only be counted as an equal share of what that thread, or
 * the process, grew by. */
static uint32_t hosted_on(const struct mts_registry *reg, uint32_t pid,
                          uint32_t tid)
{
	uint32_t n = 0;
	for (uint32_t i = 0; i < reg->adm->nresv; i++) {
		const struct mts_resv *q = reg->adm->resv[i];
		n += hosted_by(q, pid) && q->host_tid == tid;
	}
	return n ? n : 1;
}

static uint64_t host_own(const struct mts_registry *reg,
                         const struct mts_proc *p);

bool mts_host_allowance(const struct mts_registry *reg,
                        const struct mts_proc *p, uint64_t *allowance)
{
	uint64_t granted = 0, base = 0, latest = 0;
	bool hosts = false;
	for (uint32_t i = 0; reg->adm->nhosted && i < reg->adm->nresv; i++) {
		const struct mts_resv *r = reg->adm->resv[i];
		if (hosted_by(r, p->pid)) {
			granted = mt_sat_add(granted, r->bytes);
			/* The latest grant's: an earlier one's base may be
			 * room the host gave up since and others were
			 * admitted into. */
			if (!hosts || r->created_ns >= latest) {
				latest = r->created_ns;
				base = r->host_own_base;
			}
			hosts = true;
		}
	}
	/* Not its own memory now: a process could hold any amount, ask
	 * for one byte in process and have it all counted as reserved, so
	 * that another uid's task went in its place. Nor, for an untrusted
	 * host, what it held at a grant: that was never admitted (only the
	 * grant was, and nothing of it counts in the uid's reserved bytes),
	 * so a process of any size that asked for one byte took the same
	 * shield. An untrusted host's own memory is unreserved, as any
	 * process's without a task; a worker run under `memtally run
	 * --bytes` has its own reservation for it. */
	uint64_t own = p->untrusted ? 0 : host_own(reg, p);
	*allowance = hosts ? mt_sat_add(own < base ? own : base, granted) : 0;
	return hosts;
}

uint64_t mts_host_granted(const struct mts_registry *reg, uint32_t pid)
{
	uint64_t granted = 0;
	for (uint32_t i = 0; reg->adm->nhosted && i < reg->adm->nresv; i++) {
		const struct mts_resv *r = reg->adm->resv[i];
		if (hosted_by(r, pid))
			granted = mt_sat_add(granted, r->bytes);
	}
	return granted;
}

void mts_host_evicted(struct mts_registry *reg, uint32_t pid)
{
	for (uint32_t i = 0; reg->adm->nhosted && i < reg->adm->nresv; i++) {
		struct mts_resv *r = reg->adm->resv[i];
		if (hosted_by(r, pid) && r->kind && !r->evicted)
			mts_resv_evicted(reg, r);
	}
}

/* ---- ownership -----------------------------------------------------------
 *
 * A task's reservations belong to their owners. Only the workers of the
 * owner's uid, or of an admin (auth.c), take a reservation over, count
 * against it and end it when they are gone. Anyone can name any task.
 * Without ownership, a worker of another user started with the same
 * MEMTALLY_TASK could take over a reservation, which lifts its TTL. It
 * could cancel it out with its own use, and end it by exiting. A
 * reservation made over TCP has no owner, so every worker of the task
 * matches it.
 *
 * Each tick sorts the task's workers into shares (struct mts_task_share):
 * admins', one per owner uid of the task's reservations, and everyone
 * else's, which counts only against ownerless reservations.
 */

static struct mts_task_share *share_find(struct mts_task *t, uint32_t uid)
{
	for (uint32_t i = SHARE_OWNERS; i < t->nshares; i++)
		if (t->shares[i].uid == uid)
			return &t->shares[i];
	return NULL;
}

/* Take up to `want` of what is left of share `s`; returns what it took. */
static uint64_t share_take(struct mts_task_share *s, uint64_t want)
{
	uint64_t used = s->left < want ? s->left : want;
	s->left -= used;
	return used;
}

/* `t` gets a reservation owned by `uid`. 0 or -ENOMEM. */
static int share_ref(struct mts_task *t, uint32_t uid)
{
	struct mts_task_share *o = share_find(t, uid);
	if (o) {
		o->resv++;
		return 0;
	}
	if (t->nshares == t->shares_cap) {
		uint32_t cap = t->shares_cap * 2;
		struct mts_task_share *a = realloc(t->shares, cap * sizeof(*a));
		if (!a)
			return -ENOMEM;
		t->shares = a;
		t->shares_cap = cap;
	}
	/* Its workers were counted as others' until now; the next tick
	 * sorts them into this entry. */
	t->shares[t->nshares++] =
	    (struct mts_task_share){.uid = uid, .resv = 1};
	return 0;
}

/* `t` lost a reservation owned by `uid`. Returns true when that was the
 * owner's last: its workers' figures move to the others' share. */
static bool share_unref(struct mts_task *t, uint32_t uid)
{
	struct mts_task_share *o = share_find(t, uid);
	if (!o || --o->resv > 0)
		return false;
	struct mts_task_share *others = &t->shares[SHARE_OTHERS];
	others->live += o->live;
	others->measured = mt_sat_add(others->measured, o->measured);
	others->vouched = mt_sat_add(others->vouched, o->vouched);
	*o = t->shares[--t->nshares];
	return true;
}

/* Admins as of the policy in force: when it changes, every worker's cached
 * flag is recomputed. */
static void admin_epoch_check(struct mts_registry *reg)
{
	const struct mts_policy *pol = &reg->policy;
	uint32_t now[5] = {reg->server_uid, pol->has_admin_uid,
	                   pol->has_admin_uid ? pol->admin_uid : 0,
	                   pol->has_admin_gid,
	                   pol->has_admin_gid ? pol->admin_gid : 0};
	if (reg->adm->admin_epoch == 0 ||
	    memcmp(now, reg->adm->admin_seen, sizeof(now)) != 0) {
		memcpy(reg->adm->admin_seen, now, sizeof(now));
		if (++reg->adm->admin_epoch == 0)
			reg->adm->admin_epoch = 1;
	}
}

/* Is `p` an admin's worker? admin_gid needs /proc/PID/status, read once
 * per worker (and again after an exec or a policy change), not each tick. */
static bool worker_admin(struct mts_registry *reg, struct mts_proc *p)
{
	if (mts_uid_is_admin(reg, p->uid))
		return true;
	if (!reg->policy.has_admin_gid)
		return false;
	struct mts_admin_cache *c = &p->admin;
	if (c->epoch != reg->adm->admin_epoch || c->uid != p->uid ||
	    c->image != p->image_id) {
		c->admin = mts_pid_in_group(p->pid, reg->policy.admin_gid);
		c->epoch = reg->adm->admin_epoch;
		c->uid = p->uid;
		c->image = p->image_id;
	}
	return c->admin;
}

/* The share of `t` that worker `p` counts in. */
static struct mts_task_share *share_of(struct mts_registry *reg,
                                       struct mts_task *t, struct mts_proc *p)
{
	if (worker_admin(reg, p))
		return &t->shares[SHARE_ADMINS];
	struct mts_task_share *o = share_find(t, p->task_uid);
	return o ? o : &t->shares[SHARE_OTHERS];
}

/* Has `r` a live worker that may take it over, as of the latest tick? */
static bool resv_matched_live(struct mts_task *t, const struct mts_resv *r)
{
	if (t->shares[SHARE_ADMINS].live)
		return true;
	if (!r->has_owner)
		return t->live > 0;
	const struct mts_task_share *o = share_find(t, r->uid);
	return o && o->live;
}

/* Has `r`'s task started: a worker of its task took it over, or it runs
 * inside its asker (hosted) from the grant on? */
static bool running(const struct mts_resv *r)
{
	return r->taken_over || r->hosted || r->tree_run;
}

/* What a hosted task uses now and the reservation no longer needs to set
 * aside; 0 once workers of its own took it over (their figures count). */
static uint64_t hosted_use(const struct mts_resv *r)
{
	return r->hosted && !r->taken_over ? r->use : 0;
}

/* ---- what reservations count ----------------------------------------------
 *
 * The sums are kept up to date as reservations come and go, not recomputed
 * over every reservation on each Admit and Release. Each reservation's
 * count is r->effective, which is its bytes when it has no task. When a
 * count changes, the group's and the fleet's sums change by the
 * difference. Those sums are exact 128-bit integers: the published
 * figures saturate, but a sum must stay exact to be taken from. What a
 * task's reservations count depends only on the task's measured bytes and
 * their order. So it is recomputed for that task alone, when one of them
 * comes or goes or the task's figure changes.
 */

static uint64_t sat64(unsigned __int128 v)
{
	return v > UINT64_MAX ? UINT64_MAX : (uint64_t)v;
}

/* Make `r` count `e` bytes now. */
static void resv_count(struct mts_registry *reg, struct mts_resv *r, uint64_t e)
{
	if (r->effective == e)
		return;
	struct mts_group *g = &reg->groups[r->group];
	g->reserved_sum = g->reserved_sum - r->effective + e;
	g->reserved = sat64(g->reserved_sum);
	reg->adm->resv_sum = reg->adm->resv_sum - r->effective + e;
	reg->totals.reserved = sat64(reg->adm->resv_sum);
	r->effective = e;
}

/* Is `r` an admin's own (root's, an admin_uid's)? Its task's admin
 * workers count against it before anyone else's reservation. */
static bool resv_admins(struct mts_registry *reg, const struct mts_resv *r)
{
	return r->has_owner &&
	       (r->admin_asked || mts_uid_is_admin(reg, r->uid));
}

/*
 * Set what `t`'s workers use against its reservations, oldest first. Each
 * reservation takes only from the shares of the workers that may count
 * against it: its owner's (share_find), then admins'. One made over TCP
 * has no owner and takes from every worker of the task: others', owners',
 * then admins' last, which leaves the most for the owned ones. Calls
 * set(r, e) with what each reservation counts.
 *
 * Admins' own reservations go first, whatever their age: anyone may name
 * any task, and nobody's older reservation for root's task took root's
 * workers' use for itself, so that root's own reservation counted in full
 * beside them and root was denied in its own group.
 */
typedef void resv_set_fn(struct mts_registry *, struct mts_resv *, uint64_t);

/* Set against `r` what is left of the use of the workers that may count
 * against it. */
static void resv_alloc(struct mts_registry *reg, struct mts_task *t,
                       struct mts_resv *r, resv_set_fn *set)
{
	uint64_t want = r->want;
	uint64_t h = hosted_use(r);
	want -= h < want ? h : want;
	if (r->has_owner) {
		struct mts_task_share *o = share_find(t, r->uid);
		if (o)
			want -= share_take(o, want);
	} else {
		want -= share_take(&t->shares[SHARE_OTHERS], want);
		for (uint32_t i = SHARE_OWNERS; i < t->nshares; i++)
			want -= share_take(&t->shares[i], want);
	}
	want -= share_take(&t->shares[SHARE_ADMINS], want);
	set(reg, r, want);
}

static void task_alloc(struct mts_registry *reg, struct mts_task *t,
                       resv_set_fn *set)
{
	for (uint32_t i = 0; i < t->nshares; i++)
		t->shares[i].left = t->shares[i].measured;
	for (struct mts_resv *r = t->resv; r; r = r->tnext)
		if (resv_admins(reg, r))
			resv_alloc(reg, t, r, set);
	for (struct mts_resv *r = t->resv; r; r = r->tnext)
		if (!resv_admins(reg, r))
			resv_alloc(reg, t, r, set);
}

static void set_counted(struct mts_registry *reg, struct mts_resv *r,
                        uint64_t e)
{
	resv_count(reg, r, e);
}

static void set_effective(struct mts_registry *reg, struct mts_resv *r,
                          uint64_t e)
{
	(void)reg;
	r->effective = e;
}

static void task_recount(struct mts_registry *reg, struct mts_task *t)
{
	task_alloc(reg, t, set_counted);
	for (uint32_t i = 0; i < t->nshares; i++) {
		t->shares[i].counted = t->shares[i].measured;
		t->shares[i].was_live = t->shares[i].live > 0;
	}
	t->counted = t->measured;
}

void mts_resv_sums(struct mts_registry *reg)
{
	/* What each reservation of a task counts: its bytes less what the
	 * task's workers it matches use, set against the oldest first. */
	if (reg->adm->tasks) {
		for (uint32_t b = 0; b <= reg->adm->tasks_mask; b++)
			for (struct mts_task *t = reg->adm->tasks[b]; t;
			     t = t->hnext)
				task_alloc(reg, t, set_effective);
	}
	for (uint32_t i = 0; i < reg->groups_used; i++)
		reg->groups[i].reserved_sum = 0;
	unsigned __int128 total = 0;
	for (uint32_t i = 0; i < reg->adm->nresv; i++) {
		struct mts_resv *r = reg->adm->resv[i];
		if (!r->task) {
			uint64_t h = hosted_use(r);
			r->effective = r->want - (h < r->want ? h : r->want);
		}
		reg->groups[r->group].reserved_sum += r->effective;
		total += r->effective;
	}
	for (uint32_t i = 0; i < reg->groups_used; i++)
		reg->groups[i].reserved = sat64(reg->groups[i].reserved_sum);
	reg->adm->resv_sum = total;
	reg->totals.reserved = sat64(total);
	reg->totals.reservations = reg->adm->nresv;
}

/* ---- reservations by id ---------------------------------------------------
 *
 * Open addressing with linear probing, at most half full; removal shifts
 * the entries after the hole back (no tombstones, so lookups never slow
 * down with churn). Ids are random, so their hash spreads them; a Release
 * naming an id that does not exist costs one probe sequence.
 */

static uint64_t hash_id(const char *id)
{
	uint64_t h = UINT64_C(0xcbf29ce484222325); /* FNV-1a, then mixed */
	for (unsigned i = 0; i < MTS_RESV_ID_LEN; i++) {
		h ^= (unsigned char)id[i];
		h *= UINT64_C(0x100000001b3);
	}
	h ^= h >> 29;
	h *= UINT64_C(0xbf58476d1ce4e5b9);
	return h ^ (h >> 32);
}

struct mts_resv *mts_resv_find(const struct mts_registry *reg, const char *id)
{
	if (!id || !reg->adm->resv_ids || strlen(id) != MTS_RESV_ID_LEN)
		return NULL;
	uint32_t m = reg->adm->resv_ids_mask;
	for (uint32_t i = (uint32_t)hash_id(id) & m; reg->adm->resv_ids[i];
	     i = (i + 1) & m)
		if (memcmp(reg->adm->resv_ids[i]->id, id, MTS_RESV_ID_LEN) == 0)
			return reg->adm->resv_ids[i];
	return NULL;
}

static void ids_put(struct mts_resv **slots, uint32_t m, struct mts_resv *r)
{
	uint32_t i = (uint32_t)hash_id(r->id) & m;
	while (slots[i])
		i = (i + 1) & m;
	slots[i] = r;
}

/* Room for one more id, keeping the table at most half full. */
static int ids_reserve(struct mts_registry *reg)
{
	uint32_t n = reg->adm->resv_ids ? reg->adm->resv_ids_mask + 1 : 0;
	if ((uint64_t)(reg->adm->nresv + 1) * 2 <= n)
		return 0;
	n = n ? n * 2 : 64;
	struct mts_resv **slots = calloc(n, sizeof(*slots));
	if (!slots)
		return -ENOMEM;
	for (uint32_t i = 0; i < reg->adm->nresv; i++)
		ids_put(slots, n - 1, reg->adm->resv[i]);
	free(reg->adm->resv_ids);
	reg->adm->resv_ids = slots;
	reg->adm->resv_ids_mask = n - 1;
	return 0;
}

static void ids_remove(struct mts_registry *reg, const struct mts_resv *r)
{
	struct mts_resv **s = reg->adm->resv_ids;
	uint32_t m = reg->adm->resv_ids_mask;
	uint32_t i = (uint32_t)hash_id(r->id) & m;
	while (s[i] && s[i] != r)
		i = (i + 1) & m;
	if (!s[i])
		return;
	/* Move back every later entry of the run that may not sit after the
	 * hole: one whose home slot is not cyclically in (hole, its slot]. */
	for (uint32_t j = (i + 1) & m; s[j]; j = (j + 1) & m) {
		uint32_t home = (uint32_t)hash_id(s[j]->id) & m;
		if (((j - home) & m) >= ((j - i) & m)) {
			s[i] = s[j];
			i = j;
		}
	}
	s[i] = NULL;
}

/* ---- reservations by expiry -----------------------------------------------
 *
 * A binary min-heap of every reservation by its deadline (its TTL, or
 * max_ttl once taken over: resv_deadline), so that a tick looks at the ones
 * due and no others.
 */

static void heap_set(struct mts_registry *reg, uint32_t i, struct mts_resv *r)
{
	reg->adm->resv_heap[i] = r;
	r->heap_index = i;
}

static void heap_fix(struct mts_registry *reg, uint32_t i)
{
	struct mts_resv **h = reg->adm->resv_heap;
	struct mts_resv *r = h[i];
	while (i > 0 && h[(i - 1) / 2]->expires_ns > r->expires_ns) {
		heap_set(reg, i, h[(i - 1) / 2]);
		i = (i - 1) / 2;
	}
	for (;;) {
		uint32_t c = 2 * i + 1;
		if (c >= reg->adm->resv_nheap)
			break;
		if (c + 1 < reg->adm->resv_nheap &&
		    h[c + 1]->expires_ns < h[c]->expires_ns)
			c++;
		if (h[c]->expires_ns >= r->expires_ns)
			break;
		heap_set(reg, i, h[c]);
		i = c;
	}
	heap_set(reg, i, r);
}

/* Capacity is reg->adm->resv_cap (mts_admit grows both). */
static void heap_add(struct mts_registry *reg, struct mts_resv *r)
{
	heap_set(reg, reg->adm->resv_nheap++, r);
	heap_fix(reg, r->heap_index);
}

static void heap_remove(struct mts_registry *reg, struct mts_resv *r)
{
	uint32_t i = r->heap_index;
	if (i == UINT32_MAX)
		return;
	r->heap_index = UINT32_MAX;
	struct mts_resv *last = reg->adm->resv_heap[--reg->adm->resv_nheap];
	if (last != r) {
		heap_set(reg, i, last);
		heap_fix(reg, i);
	}
}

/* ---- reservations -------------------------------------------------------- */

/* A worker of `t` was seen: `t` has figures from now on (the tick keeps
 * them for the tasks in reg->adm->tasks_seen only). */
static void task_seen(struct mts_registry *reg, struct mts_task *t)
{
	t->seen = true;
	t->dirty = true;
	t->sprev = NULL;
	t->snext = reg->adm->tasks_seen;
	if (t->snext)
		t->snext->sprev = t;
	reg->adm->tasks_seen = t;
}

/* When `r` ends at the latest: its TTL until a worker takes it over,
 * then max_ttl from its creation (a task's workers keep it alive, but not
 * for ever: a worker that names a task and stays small would otherwise
 * hold the task's reserved bytes as long as it lives). */
static uint64_t resv_deadline(const struct mts_registry *reg,
                              const struct mts_resv *r)
{
	uint32_t s = r->taken_over || r->hosted || r->tree_run
	                 ? reg->policy.max_ttl_s
	                 : r->ttl_s;
	return r->created_mono_ns + (uint64_t)s * 1000000000u;
}

void mts_resv_policy_changed(struct mts_registry *reg)
{
	uint32_t max = reg->policy.max_ttl_s;
	for (uint32_t i = 0; i < reg->adm->nresv; i++) {
		struct mts_resv *r = reg->adm->resv[i];
		if (r->ttl_s > max)
			r->ttl_s = max;
		uint64_t end = resv_deadline(reg, r);
		if (end != r->expires_ns) {
			r->expires_ns = end;
			if (r->heap_index != UINT32_MAX)
				heap_fix(reg, r->heap_index);
		}
	}
}

/* Whose reservation `r` is, for the per-uid cap and its log lines: its owner's
 * uid, or MTS_UID_TCP for every reservation made over TCP. */
static uint32_t resv_key(const struct mts_resv *r)
{
	return r->has_owner ? r->uid : MTS_UID_TCP;
}

/* ---- a run's profile -------------------------------------------------------
 *
 * While its task runs, a reservation that names a kind keeps the largest
 * use seen at a tick in each of MTS_RESV_SLOTS slots of the run's life.
 * When the slots are full, neighbours merge and a slot covers twice the
 * time. That costs 256 bytes a reservation and a store a tick, and a run
 * of any length is seen at 1/16 to 1/32 of its length. At its end the
 * slots become the run's MTS_KIND_STEPS steps (kinds.c).
 */

static void run_start(struct mts_resv *r)
{
	r->started_mono_ns = mts_now_monotonic();
	r->last_seen_ns = 0;
	r->slot_ms = MTS_RESV_SLOT_MS;
	memset(r->slots, 0, sizeof(r->slots));
}

static uint64_t run_age_ms(const struct mts_resv *r, uint64_t now_ns)
{
	return now_ns > r->started_mono_ns
	           ? (now_ns - r->started_mono_ns) / 1000000u
	           : 0;
}

static void run_sample(struct mts_resv *r, uint64_t now_ns, uint64_t v)
{
	uint64_t age = run_age_ms(r, now_ns);
	while (age / r->slot_ms >= MTS_RESV_SLOTS) {
		for (uint32_t i = 0; i < MTS_RESV_SLOTS / 2; i++)
			r->slots[i] = r->slots[2 * i] > r->slots[2 * i + 1]
			                  ? r->slots[2 * i]
			                  : r->slots[2 * i + 1];
		memset(&r->slots[MTS_RESV_SLOTS / 2], 0, sizeof(r->slots) / 2);
		r->slot_ms *= 2;
	}
	uint64_t *s = &r->slots[age / r->slot_ms];
	if (v > *s)
		*s = v;
	if (v)
		r->last_seen_ns = now_ns;
}

/* The run of `r`, ended now, as its kind keeps it: its peak, and its
 * length and steps when its workers came and a peak was seen. Its length
 * runs to the last tick that saw it hold memory, through that tick's
 * millisecond, not to now: an end noticed late (a loaded loop, a release
 * that comes after the workers left) would add an empty last step and
 * length the kind's runs do not have, and admission would then expect
 * its tasks to hold nothing at their end (a leak's peak). */
static void run_of(const struct mts_resv *r, bool evicted,
                   struct mts_kind_run *out)
{
	memset(out, 0, sizeof(*out));
	out->peak = r->peak;
	out->evicted = evicted ? 1u : 0u;
	if (!running(r) || !r->peak || !r->last_seen_ns)
		return;
	uint64_t dur = run_age_ms(r, r->last_seen_ns) + 1;
	out->dur_ms = dur > UINT32_MAX ? UINT32_MAX : (uint32_t)dur;
	for (uint32_t j = 0; j < MTS_KIND_STEPS; j++) {
		uint64_t from = dur * j / MTS_KIND_STEPS;
		uint64_t to = dur * (j + 1) / MTS_KIND_STEPS;
		uint64_t m = 0;
		for (uint64_t s = from / r->slot_ms;
		     s < MTS_RESV_SLOTS &&
		     s * r->slot_ms < (to > from ? to : from + 1);
		     s++)
			if (r->slots[s] > m)
				m = r->slots[s];
		uint64_t share = (uint64_t)((unsigned __int128)m *
		                            MTS_KIND_STEP_ONE / r->peak);
		out->steps[j] =
		    (uint16_t)(share > MTS_KIND_STEP_ONE ? MTS_KIND_STEP_ONE
		                                         : share);
	}
}

/* What `r` sets aside at `now_ns`: what its kind's runs held on average
 * at the task's age, the runs' mean length cut into the profile's steps.
 * The pool's margin is admission's (project_need). A task past that
 * length holds its last step, or what it uses if more (the reservation
 * counts what its workers use beyond what it sets aside): half of a
 * kind's runs last longer than their mean, and one that does is at its
 * end, not starting over. */
static uint64_t run_want(const struct mts_resv *r, uint64_t now_ns)
{
	if (!r->profiled)
		return r->bytes;
	if (!running(r))
		return r->prof.mean[0];
	uint64_t step =
	    run_age_ms(r, now_ns) * MTS_KIND_STEPS / r->prof.mean_ms;
	return r->prof.mean[step < MTS_KIND_STEPS ? step : MTS_KIND_STEPS - 1];
}

/* `r`'s task began (a worker took it over, or its command held memory):
 * max_ttl from its grant replaces its TTL in the expiry heap. */
static void resv_rearm(struct mts_registry *reg, struct mts_resv *r)
{
	r->expires_ns = resv_deadline(reg, r);
	if (r->heap_index != UINT32_MAX)
		heap_fix(reg, r->heap_index);
	else
		heap_add(reg, r);
}

static void take_over(struct mts_registry *reg, struct mts_resv *r)
{
	r->taken_over = true;
	reg->adm->resv_dirty = true; /* its record changes */
	if (!r->tree_run) /* else its run began with its command's memory */
		run_start(r);
	resv_rearm(reg, r);
	mts_log_uid(resv_key(r), MTS_LOG_INFO,
	            "reservation taken over by its task",
	            "reservation=%s bytes=%llu owner_uid=%u", r->id,
	            (unsigned long long)r->bytes, r->uid);
}

/*
 * A worker of a uid that owns none of `t`'s reservations, descending from
 * the process that asked for one of them, is that asker's command run as
 * another user (runuser, setpriv, gosu): while that reservation lasts it
 * counts in the owner's share, takes over and keeps alive the owner's
 * reservation, and is the owner's candidate to the node guard. Another
 * uid's worker that merely names the task does not descend from the asker
 * and stays apart. The asker is known by its start time too (a pid reused
 * since is not it), and a reservation takes the first such uid only (an
 * asker that runs several users' commands does not pool them). The
 * worker's parents are read once, and only where a reservation has an
 * asker.
 */
static void switched_user(struct mts_task *t, struct mts_proc *p)
{
	bool asked = false;
	for (const struct mts_resv *r = t->resv; r; r = r->tnext) {
		if (r->has_owner && r->uid == p->uid)
			return;
		asked |= r->asker_pid && !r->hosted;
	}
	if (!asked)
		return;
	uint32_t set[MTS_ANCESTRY_MAX], n = 0;
	mts_add_ancestors(p->pid, set, &n, MTS_ANCESTRY_MAX);
	for (struct mts_resv *r = t->resv; r; r = r->tnext) {
		if (!r->has_owner || !r->asker_pid || r->hosted ||
		    (r->has_switched && r->switched_uid != p->uid))
			continue;
		bool under = false;
		for (uint32_t i = 0; i < n && !under; i++)
			under = set[i] == r->asker_pid;
		uint64_t start;
		if (!under ||
		    mts_read_starttime((pid_t)r->asker_pid, &start) < 0 ||
		    start != r->asker_start)
			continue;
		r->has_switched = true;
		r->switched_uid = p->uid;
		p->task_uid = r->uid;
		p->task_asker = r->asker_pid;
		char q[MTS_LOGQ_MAX];
		mts_log_uid(p->uid, MTS_LOG_INFO,
		            "worker of another uid runs a reservation's "
		            "command: counted as its owner's",
		            "pid=%u uid=%u task=%s owner_uid=%u asker_pid=%u",
		            p->pid, p->uid, mts_logq(q, sizeof(q), t->name),
		            r->uid, r->asker_pid);
		return;
	}
}

/* `r` ends: the workers it made its owner's are their own uid's again. */
static void switched_end(struct mts_registry *reg, const struct mts_resv *r)
{
	if (!r->has_switched || !r->task)
		return;
	/* Another reservation of the task from the same owner and asker
	 * keeps them the owner's: it takes the switched uid over. */
	for (struct mts_resv *o = r->task->resv; o; o = o->tnext)
		if (o != r && o->has_owner && o->uid == r->uid && !o->hosted &&
		    o->asker_pid == r->asker_pid &&
		    o->asker_start == r->asker_start &&
		    (!o->has_switched || o->switched_uid == r->switched_uid)) {
			o->has_switched = true;
			o->switched_uid = r->switched_uid;
			return;
		}
	for (uint32_t i = 0; i < reg->ndense; i++) {
		struct mts_proc *p = reg->by_slot[reg->dense[i]];
		if (p->task_asker == r->asker_pid && p->task_uid == r->uid &&
		    p->uid == r->switched_uid &&
		    strcmp(p->task, r->task->name) == 0) {
			p->task_uid = p->uid;
			p->task_asker = 0;
		}
	}
}

void mts_resv_worker_registered(struct mts_registry *reg, struct mts_proc *p)
{
	if (!p->task[0] || reg->adm->ntasks == 0)
		return;
	struct mts_task *t = task_find(reg, p->task, hash_str(p->task));
	if (!t)
		return;
	if (!t->seen)
		task_seen(reg, t);
	t->dirty = true;
	/* At once rather than at the next tick: a worker that exits before
	 * then must still end what it took over. */
	admin_epoch_check(reg);
	bool admin = worker_admin(reg, p);
	p->task_uid = p->uid;
	p->task_asker = 0;
	if (!admin)
		switched_user(t, p);
	uint32_t foreign = 0, foreign_uid = 0;
	for (struct mts_resv *r = t->resv; r; r = r->tnext) {
		bool mine = admin || !r->has_owner || r->uid == p->task_uid;
		if (!mine) {
			foreign++;
			foreign_uid = r->uid;
		} else if (!r->taken_over) {
			take_over(reg, r);
		}
	}
	/* Another uid's worker naming the task is accounted as a worker,
	 * but neither keeps the reservation alive nor ends it. */
	if (foreign) {
		char q[MTS_LOGQ_MAX];
		mts_log_uid(
		    p->uid, MTS_LOG_WARN,
		    "worker names a task reserved by another uid; its "
		    "reservations are left alone",
		    "pid=%u uid=%u task=%s reservations=%u owner_uid=%u",
		    p->pid, p->uid, mts_logq(q, sizeof(q), t->name), foreign,
		    foreign_uid);
	}
}

/* Reservation ids are a secret of sorts. Over TCP, without credentials,
 * any peer may release a reservation made over TCP given its id, so an id
 * must not be guessable from others. Ids come from getrandom(), the
 * kernel's CSPRNG, 256 bytes (32 ids) per call rather than one call per
 * Admit. The pool is per thread, because unit tests may run registries in
 * several threads; the server has one. Each 8 bytes are wiped once used.
 * memtallyd does not fork, so no two processes ever hold the same pool. */
static _Thread_local struct {
	uint8_t b[256];
	unsigned off;
} id_pool = {.off = sizeof(id_pool.b)};

static int random_u64(uint64_t *v)
{
	if (id_pool.off + sizeof(*v) > sizeof(id_pool.b)) {
		size_t got = 0;
		while (got < sizeof(id_pool.b)) {
			ssize_t n = getrandom(id_pool.b + got,
			                      sizeof(id_pool.b) - got, 0);
			if (n < 0 && errno == EINTR)
				continue;
			if (n <= 0)
				return n < 0 ? -errno : -EIO;
			got += (size_t)n;
		}
		id_pool.off = 0;
	}
	memcpy(v, id_pool.b + id_pool.off, sizeof(*v));
	memset(id_pool.b + id_pool.off, 0, sizeof(*v));
	id_pool.off += sizeof(*v);
	return 0;
}

static int new_id(const struct mts_registry *reg, char *id)
{
	for (int tries = 0; tries < 8; tries++) {
		uint64_t v = 0;
		int err = random_u64(&v);
		if (err < 0)
			return err;
		snprintf(id, MTS_RESV_ID_LEN + 1, "r-%016" PRIx64, v);
		if (!mts_resv_find(reg, id))
			return 0;
	}
	return -EIO;
}

/* Unlink and free `r`, taking its count out of the sums. `recount`: the
 * task's other reservations stay, so what its workers use is set against
 * them again. */
static void resv_remove(struct mts_registry *reg, struct mts_resv *r,
                        bool recount)
{
	/* Only if some of the task's usage was set against `r` (or its
	 * owner's workers now count as others') can the newer reservations
	 * of the task count less without it. */
	bool shifts = r->task && r->effective < r->want;
	reg->adm->resv_dirty = true;
	switched_end(reg, r);
	resv_count(reg, r, 0);
	if (r->profiled)
		reg->adm->nprofiled--;
	if (r->hosted)
		reg->adm->nhosted--;
	heap_remove(reg, r);
	ids_remove(reg, r);
	if (r->kind) {
		/* A task that ran (a worker took the reservation over) is a
		 * run of its kind, however it ended; one whose workers never
		 * came taught nothing. */
		if (running(r) && !r->evicted && r->peak) {
			struct mts_kind_run run;
			run_of(r, false, &run);
			mts_kind_note_run(reg, r->kind->name, r->kind->uid,
			                  &run);
		}
		if (r->task)
			r->task->kinded--;
		mts_kind_unref(reg, r->kind);
		r->kind = NULL;
	}
	if (r->task) {
		struct mts_task *t = r->task;
		struct mts_resv **pp = &t->resv;
		while (*pp && *pp != r)
			pp = &(*pp)->tnext;
		if (*pp)
			*pp = r->tnext;
		if (r->has_owner && share_unref(t, r->uid))
			shifts = true;
		if (!t->resv)
			task_drop(reg, t);
		else if (recount && shifts)
			task_recount(reg, t);
	}
	uint64_t *held = mts_uid_count_bytes(&reg->adm->resv_uids, resv_key(r));
	if (held)
		*held = *held > r->bytes ? *held - r->bytes : 0;
	mts_uid_count_sub(&reg->adm->resv_uids, resv_key(r));
	reg->groups[r->group].reservations--;
	mts_group_gc(reg, r->group);
	uint32_t i = r->index;
	struct mts_resv *last = reg->adm->resv[--reg->adm->nresv];
	reg->adm->resv[i] = last;
	last->index = i;
	reg->totals.reservations = reg->adm->nresv;
	free(r);
}

void mts_resv_free_all(struct mts_registry *reg)
{
	for (uint32_t i = 0; i < reg->adm->nresv; i++)
		free(reg->adm->resv[i]);
	free(reg->adm->resv);
	free(reg->adm->resv_ids);
	free(reg->adm->resv_heap);
	reg->adm->resv = NULL;
	reg->adm->resv_ids = NULL;
	reg->adm->resv_heap = NULL;
	reg->adm->nresv = reg->adm->resv_cap = reg->adm->resv_nheap = 0;
	reg->adm->resv_ids_mask = 0;
	reg->adm->resv_sum = 0;
	if (reg->adm->tasks) {
		for (uint32_t i = 0; i <= reg->adm->tasks_mask; i++) {
			struct mts_task *t = reg->adm->tasks[i];
			while (t) {
				struct mts_task *next = t->hnext;
				free(t->shares);
				free(t->name);
				free(t);
				t = next;
			}
		}
		free(reg->adm->tasks);
	}
	reg->adm->tasks = NULL;
	reg->adm->tasks_mask = 0;
	reg->adm->ntasks = 0;
	reg->adm->tasks_seen = NULL;
	mts_uid_counts_free(&reg->adm->resv_uids);
}

/* What the workers that may act on `r` count toward others now: its
 * owner's and admins' (every worker's, for one made over TCP without an
 * owner). A worker of another uid naming the task is not the task's: its
 * memory, true or claimed, never sizes the owner's kind. */
static uint64_t resv_vouched(struct mts_task *t, const struct mts_resv *r)
{
	uint64_t v = t->shares[SHARE_ADMINS].vouched;
	if (!r->has_owner) {
		for (uint32_t i = SHARE_OTHERS; i < t->nshares; i++)
			v = mt_sat_add(v, t->shares[i].vouched);
		return v;
	}
	const struct mts_task_share *o = share_find(t, r->uid);
	return o ? mt_sat_add(v, o->vouched) : v;
}

/* The task's peak so far, for each of its reservations that names a
 * kind: sampled at every tick, so a peak shorter than a tick may be
 * missed (a tick is 10 ms by default). */
static void task_peaks(struct mts_task *t, uint64_t now_ns)
{
	for (struct mts_resv *r = t->resv; r; r = r->tnext) {
		/* A hosted task's use is its asker's growth (hosted_tick);
		 * with no worker registered, a run's is its command's, read
		 * by the resident sweep (mts_resv_run_read). */
		if (!r->kind || (r->hosted && !r->taken_over) ||
		    (r->tree_run && !resv_matched_live(t, r)))
			continue;
		uint64_t v = resv_vouched(t, r);
		r->use = v;
		if (v > r->peak)
			r->peak = v;
		if (!r->taken_over && !r->tree_run)
			continue;
		run_sample(r, now_ns, v);
		uint64_t w = run_want(r, now_ns);
		if (w != r->want) {
			r->want = w;
			t->dirty = true;
		}
	}
}

/* Wait for worker `pid` (started at `start_time`) of `t`, within the
 * bound. */
static void await_add(struct mts_task *t, uint32_t pid, uint64_t start_time)
{
	if (t->nawait >= MTS_TASK_AWAIT_MAX)
		return;
	t->await[t->nawait].pid = pid;
	t->await[t->nawait].start_time = start_time;
	t->nawait++;
}

void mts_task_awaited(struct mts_registry *reg, const char *task, uint32_t pid,
                      uint64_t start_time)
{
	struct mts_task *t =
	    task && task[0] ? task_find(reg, task, hash_str(task)) : NULL;
	if (t)
		await_add(t, pid, start_time);
}

void mts_task_awaited_held(struct mts_registry *reg, uint32_t uid, uint32_t pid,
                           uint64_t start_time)
{
	for (uint32_t i = 0; i < reg->adm->nresv; i++) {
		struct mts_resv *r = reg->adm->resv[i];
		/* Its uid's own (or those whose command switched to it):
		 * a held slot's identity is the uid's to write, so a user
		 * naming any process of its own there holds up only its own
		 * reservations, never a scheduler's without an owner. */
		if (r->task && r->taken_over && r->restored_unseen &&
		    r->has_owner && (r->uid == uid || r->switched_uid == uid))
			await_add(r->task, pid, start_time);
	}
}

/* Is the run that asked for `r` (Admit.until_release) still there? Its
 * /proc entry is read once a second at most; gone stays gone. */
static bool asker_alive(struct mts_resv *r, uint64_t now_ns)
{
	if (r->asker_gone)
		return false;
	if (now_ns < r->asker_check_ns)
		return true;
	r->asker_check_ns = now_ns + 1000000000u;
	uint64_t st;
	if (mts_read_starttime((pid_t)r->asker_pid, &st) == 0 &&
	    st == r->asker_start)
		return true;
	r->asker_gone = true;
	return false;
}

/* Has a reservation of `t` that outlives its workers while its run lives
 * lost its run since the last look? (The task settles again.) */
static bool runs_gone(struct mts_task *t, uint64_t now_ns)
{
	bool gone = false;
	for (struct mts_resv *r = t->resv; r; r = r->tnext)
		if (r->until_release && r->taken_over && !r->asker_gone &&
		    !resv_matched_live(t, r) && !asker_alive(r, now_ns))
			gone = true;
	return gone;
}

/* Drop the awaited workers that registered again or are gone, once a
 * second; true when one was dropped (the task settles again). */
static bool await_prune(struct mts_registry *reg, struct mts_task *t,
                        uint64_t now_ns)
{
	if (now_ns - t->await_check_ns < 1000000000u)
		return false;
	t->await_check_ns = now_ns;
	bool dropped = false;
	for (uint32_t i = t->nawait; i-- > 0;) {
		uint32_t pid = t->await[i].pid;
		const struct mts_proc *p = mts_find_pid(reg, pid);
		uint64_t st;
		bool back = p && p->start_time == t->await[i].start_time;
		bool gone = mts_read_starttime((pid_t)pid, &st) < 0 ||
		            st != t->await[i].start_time;
		if (back || gone) {
			t->await[i] = t->await[--t->nawait];
			dropped = true;
		}
	}
	return dropped;
}

/* Has anything that decides what `t`'s reservations count, or whether
 * they are taken over or end, changed since its last recount? */
static bool task_changed(const struct mts_task *t)
{
	if (t->dirty)
		return true;
	for (uint32_t i = 0; i < t->nshares; i++) {
		const struct mts_task_share *sh = &t->shares[i];
		if (sh->measured != sh->counted ||
		    (sh->live > 0) != sh->was_live)
			return true;
	}
	return false;
}

/* After a tick's figures: take over the reservations of `t` that have a
 * live worker of theirs, end the taken-over ones that have none left,
 * recount the rest. */
static void task_settle(struct mts_registry *reg, struct mts_task *t)
{
	struct mts_resv *next;
	for (struct mts_resv *r = t->resv; r; r = next) {
		next = r->tnext;
		bool live = resv_matched_live(t, r);
		if (live)
			r->restored_unseen = false;
		if (live && !r->taken_over) {
			take_over(reg, r);
		} else if (!live && r->taken_over &&
		           !(r->restored_unseen && t->nawait) &&
		           !(r->until_release &&
		             asker_alive(r, mts_now_monotonic()))) {
			bool last = t->resv == r && !r->tnext;
			char q[MTS_LOGQ_MAX];
			mts_log_uid(
			    resv_key(r), MTS_LOG_INFO,
			    "reservation ended: its task's workers exited",
			    "reservation=%s task=%s bytes=%llu owner_uid=%u",
			    r->id, mts_logq(q, sizeof(q), t->name),
			    (unsigned long long)r->bytes, r->uid);
			reg->adm->stats.fulfilled++;
			if (r->restored_unseen)
				r->peak = 0; /* when, and at what, unknown */
			resv_remove(reg, r, false);
			if (last)
				return; /* `t` went with it */
		}
	}
	t->dirty = false;
	task_recount(reg, t);
}

/* ---- tasks run inside their asker ------------------------------------------
 *
 * A Dask or Celery worker runs most tasks as functions in its own process,
 * so no worker of the task's own ever registers. Such a task is admitted
 * with Admit.in_process: the asking process is its host, and what the
 * host grows by from the grant on is the task's use, which its
 * reservation stops counting (the host's figure counts it) and which its
 * kind learns from. A host runs several tasks at once on its threads:
 * with Admit.thread, a task's use is what that thread's lane grew by
 * (the lane is the thread's running total of what it allocated less what
 * it freed). A trusted host's lane counts as its slot's total does, which
 * is the sum of its lanes. An untrusted host's lane is a claim, so it
 * counts no more than the host's vouched growth: it can only make the
 * task smaller than the kernel allows, and kinds are per uid, so a liar
 * shrinks only its own kinds. The host's growth is taken from its lowest
 * figure since the task began, so that what the host's other tasks free
 * meanwhile is not taken out of this one's. Memory a runtime maps for itself
 * (pymalloc's arenas) is counted per process, not per thread, so with a thread
 * it is left out of the task's use; a host running one task at a time gives no
 * thread and has it all. What the host held before the task, and tasks that
 * ended before it began, are not the task's. When the host exits the task went
 * with it: its reservation ends at once.
 */

/* The host's figure as others may count it (vouch.c: an untrusted
 * process's claims only as far as the kernel vouches). */
static uint64_t host_vouched(const struct mts_registry *reg,
                             const struct mts_proc *p)
{
	return mts_measured(reg, mts_vouch_counted(p), p->rss);
}

/* The running total of thread `tid`'s lane in `p`'s slot; false when no
 * lane is the thread's: it has not published yet (it claims a lane at its
 * first flush), or every lane was taken and it publishes into the slot's
 * shared overflow. */
static bool host_lane(const struct mts_registry *reg, const struct mts_proc *p,
                      uint32_t tid, int64_t *bytes)
{
	struct mtshm_slot_id *s = mts_slot(reg, p->slot);
	if (!s)
		return false;
	uint32_t n = mtshm_load_relaxed32(&s->lanes_used);
	if (n > reg->layout.lane_count)
		n = reg->layout.lane_count;
	for (uint32_t k = 0; k < n; k++) {
		struct mtshm_lane *l = mtshm_lane(s, k);
		if (mtshm_load_relaxed32(&l->owner) == tid) {
			*bytes = mtshm_load_relaxeds64(&l->bytes);
			return true;
		}
	}
	return false;
}

/* The asking process as a host of tasks: a registered worker of the
 * peer's own uid on the Unix socket (a TCP peer has no pid, and a peer
 * cannot name another process), or NULL. */
static struct mts_proc *host_of(const struct mts_registry *reg,
                                const struct mts_peer *peer)
{
	if (!peer->has_cred || peer->tcp || !peer->pid)
		return NULL;
	struct mts_proc *p = mts_find_pid(reg, peer->pid);
	return p && p->uid == peer->uid ? p : NULL;
}

/* Make `r` a task run inside the asking process, if it can host. */
static bool hosted_start(struct mts_registry *reg, struct mts_resv *r,
                         const struct mts_peer *peer, uint32_t tid)
{
	struct mts_proc *p = host_of(reg, peer);
	if (!p)
		return false;
	r->host_own_base = host_own(reg, p);
	r->hosted = true;
	r->host_pid = p->pid;
	r->host_gen = p->slot_gen;
	r->host_start = p->start_time;
	r->host_slot = p->slot;
	r->host_tid = tid;
	r->host_base = host_vouched(reg, p);
	r->host_low = r->host_base;
	r->lane_known = tid && host_lane(reg, p, tid, &r->lane_base);
	reg->adm->nhosted++;
	if (!r->taken_over)
		run_start(r);
	r->expires_ns = resv_deadline(reg, r);
	heap_fix(reg, r->heap_index);
	return true;
}

/* A restored reservation's host, found again: known by its slot from
 * here on. Adopted in the slot the record names, its lanes went on, and
 * so do the recorded bases; registered afresh, its thread's lane is
 * taken as it is when next seen, less the use the record held
 * (hosted_tick). Its process figure went on either way: a
 * worker registering again carries its whole count. */
static void host_found(struct mts_resv *r, const struct mts_proc *p)
{
	if (!(p->adopted && p->slot == r->host_slot &&
	      p->slot_gen == r->host_gen)) {
		r->lane_known = false;
		r->lane_carry = r->use;
	}
	r->host_gen = p->slot_gen;
	r->host_slot = p->slot;
	r->host_unbound = false;
	r->host_settling = true;
}

/* Whether a found host's figures are read: until then its vouched figure
 * is 0 (no kernel read yet for an untrusted one, no resident figure when
 * that is what is measured), and taking its growth from that would make
 * all it holds the task's. */
static bool host_settled(const struct mts_registry *reg, struct mts_resv *r,
                         const struct mts_proc *p)
{
	if ((p->untrusted && !p->vouch.kernel_ns) ||
	    (reg->policy.measure != MTS_MEASURE_ACCOUNTED && !p->rss_known))
		return false;
	r->host_settling = false;
	return true;
}

/* A task's thread in host `p` has no lane: an equal share of the host's
 * growth stands for its use. While the thread has not flushed yet that is
 * a moment's; with every lane of the slot taken it lasts, and the tasks
 * on that worker teach their kinds each other's sizes. The operator can
 * mend it ([server] lanes), so it is said, once per process. */
static void lanes_short(const struct mts_registry *reg, struct mts_proc *p)
{
	if (p->lanes_short)
		return;
	struct mtshm_slot_id *s = mts_slot(reg, p->slot);
	if (!s || mtshm_load_relaxed32(&s->lanes_used) < reg->layout.lane_count)
		return;
	p->lanes_short = true;
	mts_log_uid(p->uid, MTS_LOG_WARN,
	            "worker runs tasks on more threads than its slot has "
	            "lanes; tasks on a thread without one are counted as "
	            "equal shares of its growth",
	            "pid=%u uid=%u lanes=%u tasks=%u hint=\"raise [server] "
	            "lanes to the worker's threads plus about six\"",
	            p->pid, p->uid, reg->layout.lane_count,
	            hosted_count(reg, p->pid));
}

/* A restored host not registered again: is it alive, the same process?
 * Its /proc entry is read once a second at most. */
static bool host_alive(struct mts_resv *r, uint64_t now_ns)
{
	if (now_ns < r->host_check_ns)
		return true;
	r->host_check_ns = now_ns + 1000000000u;
	uint64_t st;
	return mts_read_starttime((pid_t)r->host_pid, &st) == 0 &&
	       st == r->host_start;
}

/* Each tick: every hosted task's use from its host's growth, what its
 * reservation sets aside and counts, its peak and its run's shape; a
 * reservation whose host exited ends. */
static void hosted_tick(struct mts_registry *reg, uint64_t now_ns)
{
	for (uint32_t i = reg->adm->nresv; i-- > 0;) {
		if (i >= reg->adm->nresv)
			continue;
		struct mts_resv *r = reg->adm->resv[i];
		if (!r->hosted || r->taken_over)
			continue;
		struct mts_proc *p = mts_find_pid(reg, r->host_pid);
		if (r->host_unbound) {
			if (p && p->start_time == r->host_start &&
			    p->uid == r->uid)
				host_found(r, p);
			else if (!p && host_alive(r, now_ns))
				continue; /* not registered again yet */
		}
		if (!p || r->host_unbound || p->slot_gen != r->host_gen) {
			/* Ended while no server watched: when, and at what,
			 * is not known, so its kind learns nothing of it. */
			if (r->host_unbound)
				r->peak = 0;
			mts_log_uid(resv_key(r), MTS_LOG_INFO,
			            "reservation ended: the process running "
			            "its task exited",
			            "reservation=%s pid=%u bytes=%llu "
			            "owner_uid=%u",
			            r->id, r->host_pid,
			            (unsigned long long)r->bytes, r->uid);
			reg->adm->stats.fulfilled++;
			resv_remove(reg, r, true);
			continue;
		}
		if (r->host_settling && !host_settled(reg, r, p))
			continue; /* its figures unread: its use as recorded */
		uint64_t v = host_vouched(reg, p);
		/* Growth from the host's lowest point since the task began:
		 * what other tasks in it freed meanwhile is not taken out of
		 * this one's. */
		if (v < r->host_low)
			r->host_low = v;
		uint64_t use = v - r->host_low;
		bool shared = true;
		int64_t l;
		if (r->host_tid && !r->lane_known &&
		    host_lane(reg, p, r->host_tid, &l)) {
			/* Its first flush since the task began claimed a
			 * lane: at most that flush is missed. Restored, its
			 * use goes on from what the record held. (The lane
			 * is the worker's to write: unsigned, no overflow.) */
			r->lane_known = true;
			r->lane_base = (int64_t)((uint64_t)l - r->lane_carry);
		} else if (r->lane_known &&
		           host_lane(reg, p, r->host_tid, &l)) {
			uint64_t grew =
			    l > r->lane_base
			        ? (uint64_t)l - (uint64_t)r->lane_base
			        : 0;
			/* A trusted host's lane is as good as its slot's
			 * total, which is the sum of its lanes. An untrusted
			 * one's is a claim: no more than the kernel vouches
			 * the host grew. */
			if (!p->untrusted || grew < use)
				use = grew;
		} else if (r->host_tid) {
			/* No lane of the thread's (every lane taken, or the
			 * thread gave its up): an equal share. */
			use /= hosted_count(reg, r->host_pid);
			lanes_short(reg, p);
			shared = false;
		}
		/* Its thread's (or the process's) growth, shared with the
		 * tasks running on the same one. */
		if (shared && reg->adm->nhosted > 1)
			use /= hosted_on(reg, r->host_pid, r->host_tid);
		r->use = use;
		if (use > r->peak)
			r->peak = use;
		run_sample(r, now_ns, use);
		r->want = run_want(r, now_ns);
		if (r->task) {
			task_recount(reg, r->task);
		} else {
			uint64_t h = hosted_use(r);
			resv_count(reg, r,
			           r->want - (h < r->want ? h : r->want));
		}
	}
}

void mts_resv_tick(struct mts_registry *reg, uint64_t now_ns)
{
	/* Only tasks a worker has registered with have figures: a task no
	 * worker has named yet has live = measured = 0, so the tick costs
	 * O(workers + their tasks), not O(tasks). */
	if (reg->adm->ntasks > 0) {
		admin_epoch_check(reg);
		for (struct mts_task *t = reg->adm->tasks_seen; t;
		     t = t->snext) {
			t->live = 0;
			t->measured = 0;
			for (uint32_t i = 0; i < t->nshares; i++) {
				t->shares[i].live = 0;
				t->shares[i].measured = 0;
				t->shares[i].vouched = 0;
			}
		}
		for (uint32_t i = 0; i < reg->ndense; i++) {
			struct mts_proc *p = reg->by_slot[reg->dense[i]];
			if (!p->task[0])
				continue;
			struct mts_task *t =
			    task_find(reg, p->task, hash_str(p->task));
			if (!t)
				continue;
			if (!t->seen)
				task_seen(reg, t);
			/* What it counts toward the others (vouch.c), as
			 * the guard and the hosts count it: a claim past
			 * what the kernel vouches for would empty its task's
			 * reservations in the totals (others admitted into
			 * that room) while the guard still shields the task
			 * by all of it; and a claim below the kernel's
			 * figure does not shrink even its own kind. */
			uint64_t m =
			    mts_measured(reg, mts_vouch_counted(p), p->rss);
			struct mts_task_share *sh = share_of(reg, t, p);
			sh->live++;
			sh->measured = mt_sat_add(sh->measured, m);
			if (t->kinded)
				sh->vouched = mt_sat_add(sh->vouched, m);
			t->live++;
			t->measured = mt_sat_add(t->measured, m);
		}
		struct mts_task *next;
		for (struct mts_task *t = reg->adm->tasks_seen; t; t = next) {
			next = t->snext;
			if (t->kinded)
				task_peaks(t, now_ns);
			if (t->nawait && await_prune(reg, t, now_ns))
				t->dirty = true;
			if (runs_gone(t, now_ns))
				t->dirty = true;
			if (task_changed(t))
				task_settle(reg, t);
		}
	}
	if (reg->adm->nhosted)
		hosted_tick(reg, now_ns);

	/* Every reservation is in the heap, by its deadline (resv_deadline):
	 * its top is the next due. */
	while (reg->adm->resv_nheap > 0 &&
	       now_ns >= reg->adm->resv_heap[0]->expires_ns) {
		struct mts_resv *r = reg->adm->resv_heap[0];
		char q[MTS_LOGQ_MAX];
		mts_log_uid(resv_key(r), MTS_LOG_INFO,
		            r->taken_over
		                ? "reservation expired: max_ttl passed "
		                  "while its task runs"
		                : "reservation expired",
		            "reservation=%s bytes=%llu ttl_s=%u max_ttl_s=%u "
		            "group=%s",
		            r->id, (unsigned long long)r->bytes, r->ttl_s,
		            reg->policy.max_ttl_s,
		            mts_logq(q, sizeof(q), reg->groups[r->group].name));
		reg->adm->stats.expirations++;
		resv_remove(reg, r, true);
	}
}

/* ---- Admit --------------------------------------------------------------- */

static void why(struct mts_admit_out *out, const char *what, enum mts_measure m,
                uint64_t measured, uint64_t reserved, uint64_t requested,
                uint64_t limit)
{
	char a[32], b[32], c[32], d[32];
	snprintf(out->why, sizeof(out->why),
	         "%s: %s measured + %s reserved + %s requested > %s%s%s", what,
	         mt_format_size(a, sizeof(a), measured),
	         mt_format_size(b, sizeof(b), reserved),
	         mt_format_size(c, sizeof(c), requested),
	         mt_format_size(d, sizeof(d), limit),
	         m == MTS_MEASURE_ACCOUNTED ? "" : " (measure: ",
	         m == MTS_MEASURE_ACCOUNTED ? ""
	         : m == MTS_MEASURE_RSS     ? "rss)"
	                                    : "max of accounted and rss)");
}

/* The uid a reservation is counted against, and whether it has an owner
 * (every peer whose uid is known, over either transport; unidentified TCP
 * peers share one count). */
static uint32_t peer_key(const struct mts_peer *peer, bool *owned)
{
	*owned = peer->has_cred;
	return *owned ? peer->uid : MTS_UID_TCP;
}

/* A group the peer may not join ([group NAME] uids/gids), or a new group
 * past its uid's max_groups_per_uid: denied, the reservation would put
 * bytes in a group that is not the peer's. */
static bool deny_group(const struct mts_registry *reg,
                       const struct mts_peer *peer, const char *group,
                       struct mts_admit_out *out)
{
	const struct mts_policy *pol = &reg->policy;
	bool allowed = mts_may_join_group(reg, peer, group);
	bool over = false;
	uint32_t held = 0;
	if (allowed && pol->groups_per_uid && peer->has_cred &&
	    !mts_find_group(reg, group) && strcmp(group, "default") != 0 &&
	    !mts_policy_group(pol, group) && !mts_peer_is_admin(reg, peer)) {
		held = mts_uid_count_get(&reg->groups_by_uid, peer->uid);
		over = held >= pol->groups_per_uid;
	}
	if (allowed && !over)
		return false;
	out->reason = MTS_DENY_GROUP_NOT_ALLOWED;
	snprintf(out->scope, sizeof(out->scope), "group:%s", group);
	if (!allowed)
		snprintf(out->why, sizeof(out->why),
		         "group not allowed: %s may not use group %.*s (its "
		         "[group] section lists the uids and gids that may)",
		         peer->tcp || !peer->has_cred ? "a TCP peer"
		                                      : "this uid",
		         (int)MTS_NAME_MAX, group);
	else
		snprintf(out->why, sizeof(out->why),
		         "group not allowed: uid %u has brought %u groups into "
		         "existence, the most one uid may ([limits] "
		         "max_groups_per_uid = %u)",
		         peer->uid, held, pol->groups_per_uid);
	return true;
}

/* The per-uid cap on outstanding reserved bytes in force, 0 = none. A
 * percentage is of the fleet limit in force (a SetLimit's), not the
 * config file's: with `fleet = none` in the file and a limit set at run
 * time, one uid could otherwise reserve the whole fleet. */
static uint64_t uid_bytes_cap(const struct mts_registry *reg)
{
	const struct mts_policy *pol = &reg->policy;
	if (pol->resv_bytes_per_uid)
		return pol->resv_bytes_per_uid;
	if (pol->resv_bytes_bp && reg->totals.limit)
		return (uint64_t)((unsigned __int128)reg->totals.limit *
		                  pol->resv_bytes_bp / MTS_BP_ONE);
	return 0;
}

/* One uid's outstanding reserved bytes plus this request past the cap
 * ([admission] max_reserved_bytes_per_uid; admins exempt): denied, so
 * that one uid cannot reserve the whole fleet. */
static bool deny_uid_bytes(const struct mts_registry *reg,
                           const struct mts_peer *peer, uint64_t bytes,
                           struct mts_admit_out *out)
{
	uint64_t cap = uid_bytes_cap(reg);
	if (!cap)
		return false;
	bool owned;
	uint32_t key = peer_key(peer, &owned);
	uint64_t held = mts_uid_bytes_get(&reg->adm->resv_uids, key);
	if (mt_sat_add(held, bytes) <= cap || mts_peer_trusted(reg, peer))
		return false;
	char a[32], b[32], c[32];
	out->reason = MTS_DENY_UID_BYTES;
	if (owned)
		snprintf(out->scope, sizeof(out->scope), "uid:%u", key);
	else
		snprintf(out->scope, sizeof(out->scope), "tcp");
	out->reserved = held;
	out->limit = cap;
	snprintf(out->why, sizeof(out->why),
	         "per-uid reserved bytes: %s reserved + %s requested > %s, "
	         "the most one uid may hold ([admission] "
	         "max_reserved_bytes_per_uid)",
	         mt_format_size(a, sizeof(a), held),
	         mt_format_size(b, sizeof(b), bytes),
	         mt_format_size(c, sizeof(c), cap));
	return true;
}

/* ---- admission over time ---------------------------------------------------
 *
 * A reservation that follows its kind's profile counts its current step.
 * Admission must also see what it will grow into. The time ahead is cut
 * into MTS_PROJECT_STEPS equal intervals, and each profile is taken at its
 * largest within an interval. A task is expected to last its runs' mean
 * length: the means of the steps are what the runs held on average, and
 * on average they ended then (the quantile length, p95 + 10%, would keep
 * every running task in the projection a third longer than the runs
 * last). The time ahead is the new task's expected length. For a request
 * held whole from the start, it lasts until the last profiled task is
 * expected to end. A task past its expected length holds its last step
 * (or what it uses) and is never expected to end. The cost is intervals
 * times profiled reservations, at an Admit only.
 */
#define MTS_PROJECT_STEPS 32u

/* The largest of `steps` (a profile of `dur_ms`) that [from_ms, to_ms)
 * touches; *ended when the interval starts past the profile's length. */
static uint64_t step_max(const uint64_t *steps, uint32_t dur_ms,
                         uint64_t from_ms, uint64_t to_ms, bool *ended)
{
	uint64_t lo = from_ms * MTS_KIND_STEPS / dur_ms;
	uint64_t hi = (to_ms - 1) * MTS_KIND_STEPS / dur_ms;
	*ended = lo >= MTS_KIND_STEPS;
	if (hi >= MTS_KIND_STEPS)
		hi = MTS_KIND_STEPS - 1;
	uint64_t m = 0;
	for (uint64_t j = lo; j <= hi; j++)
		if (steps[j] > m)
			m = steps[j];
	return m;
}

/* What `r` counts now: its hold, or what its task's workers use when that
 * is more and the task has no other reservation to share it with. */
static uint64_t held_now(const struct mts_resv *r)
{
	bool alone = r->task && r->task->resv == r && !r->tnext;
	return alone && r->use > r->want ? r->use : r->want;
}

/* Is `r` in the projection of group `gi` (UINT32_MAX: all) and, with
 * `host` not 0, one of the tasks run inside process `host`? */
static bool projected(const struct mts_resv *r, uint32_t gi, uint32_t host,
                      uint64_t now_ns)
{
	return r->profiled && (gi == UINT32_MAX || r->group == gi) &&
	       (!host || hosted_by(r, host)) &&
	       (!running(r) || run_age_ms(r, now_ns) < r->prof.mean_ms);
}

/*
 * What a request of `bytes` (following `prof`, or NULL) needs beyond the
 * counted figures, for the reservations of group `gi` (UINT32_MAX: all)
 * and, with `host` not 0, only those of the tasks run inside `host`.
 * Tasks are pooled. In an interval, each profiled task is expected to
 * hold its runs' mean, and may hold up to its quantile step. The pool is
 * given the sum of the means plus the root of the sum of the squared
 * gaps, not the sum of the gaps. One task alone thus gets its quantile,
 * and n alike get n means plus sqrt(n) gaps, because their runs do not
 * all reach their high quantile at once. What that leaves out is the node
 * guard's to handle.
 */
static uint64_t project_need(const struct mts_registry *reg, uint32_t gi,
                             uint32_t host, uint64_t bytes,
                             const struct mts_kind_profile *prof,
                             bool in_process, const struct mts_waiter *also)
{
	if (!reg->adm->nprofiled && !prof && !also)
		return bytes;
	if (!reg->adm->nprofiled && !prof && !also->profiled)
		return mt_sat_add(bytes, also->bytes);
	uint64_t now = mts_now_monotonic();
	uint64_t h = prof ? prof->mean_ms : 0;
	if (!prof && also && also->profiled && also->prof.mean_ms > h)
		h = also->prof.mean_ms;
	for (uint32_t i = 0; !prof && i < reg->adm->nresv; i++) {
		const struct mts_resv *r = reg->adm->resv[i];
		if (!projected(r, gi, host, now))
			continue;
		uint64_t age = running(r) ? run_age_ms(r, now) : 0;
		if (r->prof.mean_ms - age > h)
			h = r->prof.mean_ms - age;
	}
	if (!h)
		return mt_sat_add(bytes, also ? also->bytes : 0);
	/* Against one worker's own limit, the whole gap (100%) whatever
	 * `host_gap` the fleet's admission runs on: past that limit Dask
	 * ends the worker with every task in it, and no guard of ours
	 * stands between (the node guard's line is below a worker's limit
	 * only when the worker has the node's). One task alone then needs
	 * its quantile, so a request above all a worker can give is never
	 * admitted there, as the plugin's NeverAdmitted takes it. */
	uint32_t host_gap = host ? MTS_BP_ONE : reg->policy.kind_host_gap_bp;
	double need = 0;
	for (uint32_t k = 0; k < MTS_PROJECT_STEPS; k++) {
		uint64_t lo = h * k / MTS_PROJECT_STEPS;
		uint64_t hi = h * (k + 1) / MTS_PROJECT_STEPS;
		if (hi <= lo)
			hi = lo + 1;
		bool ended;
		/* The squared gaps of tasks with a process of their own, and
		 * of tasks run inside a shared host (var[1]). */
		double sum = (double)bytes, var[2] = {0, 0};
		if (prof) {
			double hi_q = (double)step_max(
			    prof->bytes, prof->mean_ms, lo, hi, &ended);
			sum = (double)step_max(prof->mean, prof->mean_ms, lo,
			                       hi, &ended);
			var[in_process] = (hi_q - sum) * (hi_q - sum);
		}
		if (also && !also->profiled) {
			sum += (double)also->bytes;
		} else if (also) {
			/* The request waiting longest, as if granted now. */
			double q = (double)step_max(also->prof.bytes,
			                            also->prof.mean_ms, lo, hi,
			                            &ended);
			double mu = (double)step_max(also->prof.mean,
			                             also->prof.mean_ms, lo, hi,
			                             &ended);
			if (!ended) {
				sum += mu;
				var[also->in_process] += (q - mu) * (q - mu);
			}
		}
		for (uint32_t i = 0; i < reg->adm->nresv; i++) {
			const struct mts_resv *r = reg->adm->resv[i];
			if (!projected(r, gi, host, now))
				continue;
			uint64_t age = running(r) ? run_age_ms(r, now) : 0;
			double q =
			    (double)step_max(r->prof.bytes, r->prof.mean_ms,
			                     age + lo, age + hi, &ended);
			double mu =
			    (double)step_max(r->prof.mean, r->prof.mean_ms,
			                     age + lo, age + hi, &ended);
			/* A task above its kind's mean now is expected to
			 * stay at least where it is. */
			double held = (double)held_now(r);
			sum -= held;
			if (!ended) {
				mu = mu > held ? mu : held;
				q = q > mu ? q : mu;
				sum += mu;
				var[r->hosted && !r->taken_over] +=
				    (q - mu) * (q - mu);
			}
		}
		double tot =
		    sum +
		    sqrt(var[0]) * reg->policy.kind_pool_gap_bp / MTS_BP_ONE +
		    sqrt(var[1]) * host_gap / MTS_BP_ONE;
		if (k == 0 || tot > need)
			need = tot;
	}
	return need <= 0 ? 0 : need >= 0x1p64 ? UINT64_MAX : (uint64_t)need;
}

/* The most any one request can be granted on an empty node: the fleet
 * limit, or the node guard's line if lower; 0: neither bounds it. */
static uint64_t bare_limit(const struct mts_registry *reg)
{
	uint64_t most = reg->totals.limit;
	const struct mts_node_fig *nf = mts_guard_figure(reg, NULL);
	if (nf && nf->line && (!most || nf->line < most))
		most = nf->line;
	return most;
}

/* ---- the queue -------------------------------------------------------------
 *
 * `memtally run --wait` asks again until granted. Without a queue, room
 * that frees goes to whichever request asks first. A large request can
 * then wait while small ones keep taking the room it needs. So a request
 * that has waited `[admission] queue` keeps its room, the one waiting
 * longest first. A younger request is granted only if it fits beside it
 * too. Room is not kept at once: holding room for every denied request
 * idles the fleet behind the largest, a convoy (see
 * bench/results/fleet.md for both effects). Only a request that asks
 * again keeps a place. A waiter silent for MTS_WAIT_ACTIVE_NS has left.
 * None keeps its place for more than MTS_WAIT_HOLD_NS past its wait. Then
 * it goes to the back; and one above what an empty node could grant keeps
 * none: a request that can never fit cannot hold the fleet. A non-admin uid's
 * request is at most its reserved-bytes share (max_reserved_bytes_per_uid),
 * which bounds what one uid's place can keep from the others.
 */
#define MTS_WAIT_ACTIVE_NS (UINT64_C(3) * 1000000000u)
#define MTS_WAIT_HOLD_NS   (UINT64_C(30) * 1000000000u)

/* A waiter's identity: its uid whole in the high half, so no task name of
 * one uid can ever stand for another uid's waiter; its task name hashed in
 * the low half (a collision there is between one uid's own tasks). 0: no
 * task, no place. */
static uint64_t waiter_key(uint32_t uid, const char *task)
{
	if (!task[0])
		return 0;
	uint64_t h = hash_str(task);
	uint32_t low = (uint32_t)(h ^ (h >> 32));
	return (uint64_t)uid << 32 | (low ? low : 1);
}

static struct mts_waiter *waiter_find(const struct mts_registry *reg,
                                      uint64_t who)
{
	for (uint32_t i = 0; who && i < reg->adm->nwaiters; i++)
		if (reg->adm->waiters[i].who == who)
			return &reg->adm->waiters[i];
	return NULL;
}

/* The request waiting longest that is not `who`, came before it and has
 * waited at least `after_ns`, or NULL. */
static const struct mts_waiter *waiter_head(const struct mts_registry *reg,
                                            uint64_t who, uint64_t now,
                                            uint64_t after_ns)
{
	const struct mts_waiter *self = waiter_find(reg, who), *head = NULL;
	uint64_t most = bare_limit(reg);
	for (uint32_t i = 0; i < reg->adm->nwaiters; i++) {
		const struct mts_waiter *w = &reg->adm->waiters[i];
		if (w == self || now - w->last_ns > MTS_WAIT_ACTIVE_NS ||
		    now - w->first_ns < after_ns)
			continue;
		/* A request no emptied node could grant keeps nothing: it
		 * would hold every other request back for ever. */
		if (most && w->bytes > most)
			continue;
		if (!head || w->first_ns < head->first_ns)
			head = w;
	}
	return head && (!self || head->first_ns < self->first_ns) ? head : NULL;
}

static void waiter_remove(struct mts_registry *reg, uint64_t who)
{
	struct mts_waiter *w = waiter_find(reg, who);
	if (w)
		*w = reg->adm->waiters[--reg->adm->nwaiters];
}

/* `who` was denied for room (`bytes`, following `prof` or NULL): it joins
 * the queue, or keeps its place (for at most MTS_WAIT_HOLD_NS). A uid
 * that is not an admin holds MTS_WAITERS_PER_UID places at most; past
 * them it waits without one. */
static void waiter_note(struct mts_registry *reg, uint64_t who, uint64_t bytes,
                        const struct mts_kind_profile *prof, bool in_process,
                        bool admin)
{
	if (!who)
		return;
	uint64_t now = mts_now_monotonic();
	struct mts_waiter *w = waiter_find(reg, who);
	if (!w && !admin) {
		uint32_t held = 0;
		for (uint32_t i = 0; i < reg->adm->nwaiters; i++)
			held += reg->adm->waiters[i].who >> 32 == who >> 32 &&
			        now - reg->adm->waiters[i].last_ns <=
			            MTS_WAIT_ACTIVE_NS;
		if (held >= MTS_WAITERS_PER_UID)
			return;
	}
	if (!w) {
		if (reg->adm->nwaiters < MTS_WAITERS) {
			w = &reg->adm->waiters[reg->adm->nwaiters++];
		} else {
			/* Full: one that has left gives way. With all asking
			 * still, the newcomer waits without a place: the one
			 * silent longest is the one waiting longest, since
			 * `memtally run --wait` asks less often as it waits,
			 * and the queue is there for it. */
			w = NULL;
			for (uint32_t i = 0; i < MTS_WAITERS; i++)
				if (now - reg->adm->waiters[i].last_ns >
				        MTS_WAIT_ACTIVE_NS &&
				    (!w ||
				     reg->adm->waiters[i].last_ns < w->last_ns))
					w = &reg->adm->waiters[i];
			if (!w)
				return;
		}
		*w = (struct mts_waiter){.who = who, .first_ns = now};
	}
	uint64_t hold =
	    (uint64_t)reg->policy.admit_queue_ms * 1000000u + MTS_WAIT_HOLD_NS;
	if (now - w->last_ns > MTS_WAIT_ACTIVE_NS || now - w->first_ns > hold)
		w->first_ns = now; /* it had left, or held its place enough */
	w->last_ns = now;
	w->bytes = bytes;
	w->profiled = prof != NULL;
	w->in_process = in_process;
	if (prof)
		w->prof = *prof;
}

/* The words a denial adds for the room kept for the queue's head. */
static void why_kept(struct mts_admit_out *out, const struct mts_waiter *w,
                     uint64_t now)
{
	if (!w)
		return;
	char a[32];
	size_t n = strlen(out->why);
	snprintf(out->why + n, sizeof(out->why) - n,
	         "; %s more kept for the request waiting longest (%.1f s)",
	         mt_format_size(a, sizeof(a), out->kept),
	         (now - w->first_ns) / 1e9);
}

/* The words a denial adds when the profiles changed what was needed. */
static void why_projected(struct mts_admit_out *out, uint64_t bytes,
                          uint64_t need)
{
	if (need == bytes)
		return;
	char a[32];
	size_t n = strlen(out->why);
	snprintf(out->why + n, sizeof(out->why) - n,
	         "; requested is at its largest over the task's life beside "
	         "what the running tasks' profiles grow into (%s as one "
	         "figure)",
	         mt_format_size(a, sizeof(a), bytes));
}

void mts_admit_decide(const struct mts_registry *reg,
                      const struct mts_peer *peer, const char *group,
                      uint64_t bytes, struct mts_admit_out *out)
{
	mts_admit_decide_profile(reg, peer, group, bytes, NULL, false, 0, out);
}

void mts_admit_decide_profile(const struct mts_registry *reg,
                              const struct mts_peer *peer, const char *group,
                              uint64_t bytes,
                              const struct mts_kind_profile *prof,
                              bool in_process, uint64_t who,
                              struct mts_admit_out *out)
{
	const struct mts_policy *pol = &reg->policy;
	const struct mts_totals *t = &reg->totals;
	memset(out, 0, sizeof(*out));
	out->requested = bytes;
	/* The fleet's figure counts other uids as far as the kernel vouches
	 * for them; the asking uid's own claims count in full (vouch.c). */
	uint64_t own =
	    peer->has_cred ? mts_vouch_unvouched_of(reg, peer->uid) : 0;
	uint64_t fm = mts_measured(reg, mt_sat_add(t->bytes, own), t->rss);
	snprintf(out->scope, sizeof(out->scope), "fleet");
	out->measured = fm;
	out->reserved = t->reserved;
	/* The forecast without the request, as the figures are. */
	out->growth = t->growth;
	out->forecast_s = mts_fleet_forecast(reg);

	/* One uid holding max_reservations_per_uid cannot add more, so it
	 * cannot use up MTS_RESV_MAX (or the server's memory) for everyone
	 * else. Admins are trusted with the whole server: exempt. */
	bool owned;
	uint32_t key = peer_key(peer, &owned);
	uint32_t held = mts_uid_count_get(&reg->adm->resv_uids, key);
	if (pol->max_resv_per_uid && held >= pol->max_resv_per_uid &&
	    !mts_peer_trusted(reg, peer)) {
		char whom[32];
		out->reason = MTS_DENY_UID_CAP;
		if (owned) {
			snprintf(out->scope, sizeof(out->scope), "uid:%u", key);
			snprintf(whom, sizeof(whom), "uid %u", key);
		} else {
			snprintf(out->scope, sizeof(out->scope), "tcp");
			snprintf(whom, sizeof(whom), "unidentified TCP peers");
		}
		snprintf(out->why, sizeof(out->why),
		         "per-uid reservation cap: %s holds %u outstanding "
		         "reservations, the most one uid may hold "
		         "([admission] max_reservations_per_uid = %u); release "
		         "some or wait for them to end",
		         whom, held, pol->max_resv_per_uid);
		return;
	}

	if (deny_group(reg, peer, group, out) ||
	    deny_uid_bytes(reg, peer, bytes, out))
		return;

	/* The fleet, then the group: the first limit that would be passed
	 * decides. */
	out->limit = t->limit;
	const struct mts_group *g = mts_find_group(reg, group);
	uint64_t need =
	    project_need(reg, UINT32_MAX, 0, bytes, prof, in_process, NULL);
	out->need = need;
	uint64_t now = mts_now_monotonic();
	const struct mts_waiter *head =
	    pol->admit_queue
	        ? waiter_head(reg, who, now,
	                      (uint64_t)pol->admit_queue_ms * 1000000u)
	        : NULL;
	uint64_t with = head ? project_need(reg, UINT32_MAX, 0, bytes, prof,
	                                    in_process, head)
	                     : need;
	uint64_t kept = with > need ? with - need : 0;
	out->kept = kept;
	if (t->limit && mt_sat_add(mt_sat_add(fm, t->reserved),
	                           mt_sat_add(need, kept)) > t->limit) {
		out->reason = MTS_DENY_FLEET_LIMIT;
		why(out, "fleet limit", pol->measure, fm, t->reserved, need,
		    t->limit);
		why_projected(out, bytes, need);
		if (mt_sat_add(mt_sat_add(fm, t->reserved), need) <= t->limit)
			why_kept(out, head, now);
		return;
	}
	if (g && g->limit) {
		/* Likewise a group: its unvouched bytes count when they are
		 * the asking uid's alone. */
		uint64_t gb = g->bytes;
		if (peer->has_cred && g->unvouched &&
		    g->unvouched_uid == peer->uid)
			gb = mt_sat_add(gb, g->unvouched);
		uint64_t gm = mts_measured(reg, gb, g->rss);
		uint64_t gneed = project_need(reg, (uint32_t)(g - reg->groups),
		                              0, bytes, prof, in_process, NULL);
		if (mt_sat_add(mt_sat_add(gm, g->reserved), gneed) > g->limit) {
			char what[MTS_NAME_MAX + 16];
			out->reason = MTS_DENY_GROUP_LIMIT;
			snprintf(out->scope, sizeof(out->scope), "group:%s",
			         group);
			snprintf(what, sizeof(what), "group limit (%s)", group);
			out->measured = gm;
			out->reserved = g->reserved;
			out->limit = g->limit;
			out->growth = g->growth;
			out->forecast_s = mts_group_forecast(reg, g);
			why(out, what, pol->measure, gm, g->reserved, gneed,
			    g->limit);
			why_projected(out, bytes, gneed);
			return;
		}
	}
	/* Whatever the counted figures say, no grant into memory the node
	 * does not have: page cache that stays, processes nobody counts
	 * and a worker that understates are in the kernel's figure. What
	 * is reserved and not used yet is not in it: added. */
	const struct mts_node_fig *nf = mts_guard_figure(reg, NULL);
	uint64_t node = nf ? nf->usage : 0, line = nf ? nf->line : 0;
	bool commit = nf && nf->by_commit;
	if (nf && mt_sat_add(mt_sat_add(node, t->reserved),
	                     mt_sat_add(need, kept)) > line) {
		char a[32], b[32], c[32], d[32];
		out->reason = MTS_DENY_NODE;
		snprintf(out->scope, sizeof(out->scope), "node");
		out->measured = node;
		out->reserved = t->reserved;
		out->limit = line;
		snprintf(out->why, sizeof(out->why),
		         "node guard's line: %s %s + %s reserved + %s "
		         "requested > %s ([guard] line%s)",
		         mt_format_size(a, sizeof(a), node),
		         commit ? "committed on the node (Committed_AS, "
		                  "overcommit strict)"
		                : "in use on the node (the kernel's figure)",
		         mt_format_size(b, sizeof(b), t->reserved),
		         mt_format_size(c, sizeof(c), need),
		         mt_format_size(d, sizeof(d), line),
		         commit ? " of CommitLimit" : "");
		why_projected(out, bytes, need);
		if (mt_sat_add(mt_sat_add(node, t->reserved), need) <= line)
			why_kept(out, head, now);
		return;
	}
	out->admitted = true;
}

static void log_denial(const struct mts_registry *reg,
                       const struct mts_peer *peer, const char *group,
                       const char *task, const struct mts_admit_out *out)
{
	char qg[MTS_LOGQ_MAX], qt[MTS_LOGQ_MAX], qs[MTS_LOGQ_MAX];
	char who[MTS_PEER_WHO_MAX];
	/* A uid at its cap is a misbehaving client, not a full fleet. */
	bool cap = out->reason == MTS_DENY_UID_CAP ||
	           out->reason == MTS_DENY_KIND_CAP ||
	           out->reason == MTS_DENY_FULL;
	mts_log_uid(
	    mts_peer_log_uid(peer), cap ? MTS_LOG_WARN : MTS_LOG_INFO,
	    out->reason == MTS_DENY_UID_CAP
	        ? "admission denied: per-uid reservation cap"
	    : out->reason == MTS_DENY_KIND_CAP
	        ? "admission denied: too many kinds"
	    : out->reason == MTS_DENY_FULL
	        ? "admission denied: reservations full"
	        : "admission denied",
	    "reason=%s scope=%s measured=%llu reserved=%llu "
	    "requested=%llu need=%llu kept=%llu limit=%llu measure=%s "
	    "group=%s task=%s %s",
	    mts_denial_name(out->reason), mts_logq(qs, sizeof(qs), out->scope),
	    (unsigned long long)out->measured,
	    (unsigned long long)out->reserved,
	    (unsigned long long)out->requested, (unsigned long long)out->need,
	    (unsigned long long)out->kept, (unsigned long long)out->limit,
	    mts_measure_name(reg->policy.measure),
	    mts_logq(qg, sizeof(qg), group), mts_logq(qt, sizeof(qt), task),
	    mts_peer_who(peer, who, sizeof(who)));
}

/* Room for one more reservation in the arrays and the id index, so that
 * nothing fails once a reservation is linked. 0 or -ENOMEM. */
static int resv_make_room(struct mts_registry *reg)
{
	if (reg->adm->nresv == reg->adm->resv_cap) {
		uint32_t cap = reg->adm->resv_cap ? reg->adm->resv_cap * 2 : 16;
		struct mts_resv **a = realloc(reg->adm->resv, cap * sizeof(*a));
		if (!a)
			return -ENOMEM;
		reg->adm->resv = a;
		a = realloc(reg->adm->resv_heap, cap * sizeof(*a));
		if (!a)
			return -ENOMEM;
		reg->adm->resv_heap = a;
		reg->adm->resv_cap = cap;
	}
	return ids_reserve(reg) < 0 ? -ENOMEM : 0;
}

/* `r` joins its task's reservations (oldest first), and is taken over at
 * once if a worker of the task already runs (latest tick; the next tick
 * looks again either way). -ENOMEM: nothing changed. */
static int resv_join_task(struct mts_registry *reg, struct mts_resv *r,
                          const char *task, bool owned)
{
	r->task = task_get(reg, task);
	if (!r->task || (owned && share_ref(r->task, r->uid) < 0)) {
		if (r->task && !r->task->resv)
			task_drop(reg, r->task);
		r->task = NULL;
		return -ENOMEM;
	}
	struct mts_resv **pp = &r->task->resv;
	while (*pp)
		pp = &(*pp)->tnext;
	*pp = r;
	r->taken_over = r->task->seen && resv_matched_live(r->task, r);
	if (r->taken_over)
		run_start(r);
	r->task->dirty = true;
	return 0;
}

/* Make `r` (of group gi) live for `ttl` seconds: indexed, in the expiry
 * heap unless a worker took it over, and counted. Cannot fail. */
static void resv_link(struct mts_registry *reg, struct mts_resv *r, uint32_t gi,
                      uint64_t bytes, uint32_t ttl)
{
	r->group = gi;
	reg->groups[gi].reservations++;
	r->bytes = bytes;
	r->want = r->profiled ? r->prof.mean[0] : bytes;
	if (r->profiled)
		reg->adm->nprofiled++;
	r->effective = 0; /* counts nothing until counted below */
	r->ttl_s = ttl;
	r->created_ns = mts_now_realtime();
	r->created_mono_ns = mts_now_monotonic();
	r->expires_ns = resv_deadline(reg, r);
	r->index = reg->adm->nresv;
	reg->adm->resv[reg->adm->nresv++] = r;
	reg->adm->resv_dirty = true;
	reg->totals.reservations = reg->adm->nresv;
	ids_put(reg->adm->resv_ids, reg->adm->resv_ids_mask, r);
	heap_add(reg, r);
	if (r->task)
		task_recount(reg, r->task);
	else
		resv_count(reg, r, r->want);
}

/* Link `r`, of group gi (ensured by the caller, its owner and profile
 * set), into the registry, for a grant and a restore alike: `key`'s
 * per-uid count and bytes, its task, then resv_link. -ENOMEM leaves
 * nothing of it linked and collects gi if nothing else holds it. */
static int resv_attach(struct mts_registry *reg, struct mts_resv *r,
                       uint32_t gi, uint32_t key, uint64_t bytes,
                       const char *task, uint32_t ttl)
{
	if (mts_uid_count_add(&reg->adm->resv_uids, key) < 0) {
		mts_group_gc(reg, gi);
		return -ENOMEM;
	}
	uint64_t *held = mts_uid_count_bytes(&reg->adm->resv_uids, key);
	*held = mt_sat_add(*held, bytes);
	if (task[0] && resv_join_task(reg, r, task, r->has_owner) < 0) {
		held = mts_uid_count_bytes(&reg->adm->resv_uids, key);
		*held = *held > bytes ? *held - bytes : 0;
		mts_uid_count_sub(&reg->adm->resv_uids, key);
		mts_group_gc(reg, gi);
		return -ENOMEM;
	}
	if (r->task && r->kind)
		r->task->kinded++;
	resv_link(reg, r, gi, bytes, ttl);
	return 0;
}

/* Link a granted reservation of `bytes` into the registry (index, heap,
 * task, group, kind, per-uid count) and count it. Nothing is changed
 * when it fails (-ENOMEM). */
static int resv_grant(struct mts_registry *reg, const struct mts_peer *peer,
                      const char *group, const char *task, const char *kind,
                      uint64_t bytes, const struct mts_kind_profile *prof,
                      const struct mts_admit_req *req,
                      struct mts_admit_out *out)
{
	const struct mts_policy *pol = &reg->policy;
	char qg[MTS_LOGQ_MAX], qt[MTS_LOGQ_MAX], qk[MTS_LOGQ_MAX];
	char qs[MTS_LOGQ_MAX], who[MTS_PEER_WHO_MAX];
	bool owned;
	uint32_t key = peer_key(peer, &owned);
	if (resv_make_room(reg) < 0)
		return -ENOMEM;
	struct mts_resv *r = calloc(1, sizeof(*r));
	if (!r)
		return -ENOMEM;
	r->heap_index = UINT32_MAX;
	int err = new_id(reg, r->id);
	if (err < 0) {
		free(r);
		return err;
	}
	/* mts_admit checked the kind caps: only -ENOMEM can fail here. */
	if (kind[0] && mts_kind_ref(reg, kind, key, mts_peer_trusted(reg, peer),
	                            &r->kind) < 0) {
		free(r);
		return -ENOMEM;
	}
	uint32_t gi;
	/* mts_admit_decide checked the group's access and the uid's group
	 * cap: only -ENOMEM can fail here. */
	if (mts_group_ensure_peer(reg, peer, group, &gi) < 0)
		goto fail_kind;
	r->has_owner = owned;
	r->uid = peer->uid;
	/* An admin by admin_gid is one by its peer's groups, which a uid
	 * alone does not say (resv_admins). */
	r->admin_asked = owned && peer->has_cred && reg->policy.has_admin_gid &&
	                 mts_peer_in_group(peer, reg->policy.admin_gid);
	if (owned && !req->in_process &&
	    mts_peer_start_time(reg, peer, &r->asker_start) == 0)
		r->asker_pid = peer->pid;
	r->until_release = req->until_release && r->asker_pid && task[0];
	r->declared = req->bytes;
	if (prof) {
		r->profiled = true;
		r->prof = *prof;
	}
	uint32_t ttl = req->ttl_s ? req->ttl_s : pol->default_ttl_s;
	if (ttl > pol->max_ttl_s)
		ttl = pol->max_ttl_s;
	if (resv_attach(reg, r, gi, key, bytes, task, ttl) < 0)
		goto fail_kind;
	out->hosted =
	    req->in_process && hosted_start(reg, r, peer, req->thread);

	reg->adm->stats.admissions++;
	out->ttl_s = ttl;
	memcpy(out->id, r->id, sizeof(out->id));
	mts_log_uid(
	    mts_peer_log_uid(peer), MTS_LOG_INFO, "admission granted",
	    "reservation=%s bytes=%llu declared=%llu kind=%s "
	    "sized_by=%s group=%s task=%s ttl_s=%u in_process=%s "
	    "fleet_measured=%llu fleet_reserved=%llu fleet_limit=%llu "
	    "measure=%s %s",
	    r->id, (unsigned long long)r->bytes,
	    (unsigned long long)r->declared, mts_logq(qk, sizeof(qk), kind),
	    mts_logq(qs, sizeof(qs), out->sized_by),
	    mts_logq(qg, sizeof(qg), group), mts_logq(qt, sizeof(qt), task),
	    ttl, out->hosted ? "yes" : "no", (unsigned long long)out->measured,
	    (unsigned long long)reg->totals.reserved,
	    (unsigned long long)reg->totals.limit,
	    mts_measure_name(pol->measure),
	    mts_peer_who(peer, who, sizeof(who)));
	/* Reserved bytes count: the fleet or the group may now be high. */
	mts_limits_eval(reg, false);
	mts_publish(reg);
	return 0;

fail_kind:
	if (r->kind)
		mts_kind_unref(reg, r->kind);
	free(r);
	return -ENOMEM;
}

/* Add to `why` how the reservation follows the kind's profile. */
static void profile_why(const struct mts_kind_profile *p, char *why,
                        size_t whylen)
{
	uint64_t most = 0;
	for (uint32_t j = 0; j < MTS_KIND_STEPS; j++)
		if (p->bytes[j] > most)
			most = p->bytes[j];
	char a[32], b[32];
	size_t n = strlen(why);
	snprintf(why + n, whylen - n,
	         "; following its profile over %.1f s: %s at the start, %s "
	         "at most",
	         p->mean_ms / 1000.0, mt_format_size(a, sizeof(a), p->bytes[0]),
	         mt_format_size(b, sizeof(b), most));
}

/*
 * The most the fleet limit can ever grant while what runs outside any
 * reservation stays: the limit less the measured figure not used by
 * reserved tasks (their workers', and hosted tasks' growth), and no more
 * than the node guard's line less the kernel's figure for the same. 0:
 * neither a fleet limit nor a guard's line (or no room at all).
 * A kind's first run declared above it would wait for ever, however
 * little it really needs, and its kind would never learn: once it has
 * waited the queue's time it is sized at this instead (a declaration is a
 * ceiling, not a measurement), and the node guard stands behind what it
 * then uses up to its declaration.
 */
static uint64_t first_run_room(const struct mts_registry *reg)
{
	const struct mts_totals *t = &reg->totals;
	const struct mts_node_fig *nf = mts_guard_figure(reg, NULL);
	if (!t->limit && !(nf && nf->line))
		return 0;
	uint64_t inside = 0;
	for (const struct mts_task *k = reg->adm->tasks_seen; k; k = k->snext)
		if (k->resv)
			inside = mt_sat_add(inside, k->measured);
	for (uint32_t i = 0; reg->adm->nhosted && i < reg->adm->nresv; i++)
		inside = mt_sat_add(inside, hosted_use(reg->adm->resv[i]));
	uint64_t fm = mts_measured(reg, t->bytes, t->rss);
	uint64_t outside = fm > inside ? fm - inside : 0;
	uint64_t room = !t->limit            ? UINT64_MAX
	                : t->limit > outside ? t->limit - outside
	                                     : 0;
	/* Likewise under the node guard's line by the kernel's figure, which
	 * admission checks too: sized above that room, the request would be
	 * denied there for ever, and the room the queue keeps for it would
	 * hold every other request back. */
	if (nf && nf->line) {
		uint64_t nout = nf->usage > inside ? nf->usage - inside : 0;
		uint64_t nroom = nf->line > nout ? nf->line - nout : 0;
		if (nroom < room)
			room = nroom;
	}
	return room;
}

/* `bytes` reserved instead of the learned size `why` tells: "SIZE: WHAT
 * (learned WHY TAIL)". Returns `bytes`. */
static uint64_t learned_not_used(char *why, size_t whylen, uint64_t bytes,
                                 const char *what, const char *tail)
{
	char a[32], b[320];
	snprintf(b, sizeof(b), "%s", why);
	snprintf(why, whylen, "%s: %s (learned %.200s%s)",
	         mt_format_size(a, sizeof(a), bytes), what, b, tail);
	return bytes;
}

/* The most one request of a uid (`admin`: exempt from the per-uid caps)
 * can ever be granted: beside what runs outside reservations now
 * (first_run_room), else under the bare limits; 0: no bound. */
static uint64_t grantable(const struct mts_registry *reg, bool admin)
{
	uint64_t most = first_run_room(reg);
	if (!most)
		most = bare_limit(reg);
	uint64_t cap = admin ? 0 : uid_bytes_cap(reg);
	if (cap && (!most || cap < most))
		most = cap;
	return most;
}

/* Has `who` waited, asking again, the queue's time ([admission] queue)? */
static bool waited(const struct mts_registry *reg, uint64_t who)
{
	const struct mts_waiter *w = waiter_find(reg, who);
	uint64_t now = mts_now_monotonic();
	return reg->policy.admit_queue && w &&
	       now - w->last_ns <= MTS_WAIT_ACTIVE_NS &&
	       now - w->first_ns >=
	           (uint64_t)reg->policy.admit_queue_ms * 1000000u;
}

/*
 * What a request of `kind` (maybe "") declaring `declared` bytes (maybe
 * 0) reserves, and why, for the peer's uid `key`: the kind's learned size
 * when it has one (unless [kinds] reserve_learned is off and bytes were
 * declared), else the declaration, else [kinds] default_size.
 */
static uint64_t size_request(const struct mts_registry *reg, uint32_t key,
                             bool admin, uint64_t who, const char *kind,
                             uint64_t declared, char *why, size_t whylen,
                             bool *learned_used)
{
	const struct mts_policy *pol = &reg->policy;
	char a[32];
	*learned_used = false;
	if (!kind[0]) {
		snprintf(why, whylen, "declared");
		return declared;
	}
	uint64_t learned;
	bool known =
	    mts_kind_learned_for(reg, kind, key, &learned, why, whylen) == 0;
	if (known && (!declared || pol->kind_reserve_learned)) {
		/* A size learned above all that is ever granted (an eviction
		 * counted at 1.5 times its peak, a fleet limit lowered since)
		 * would be denied for ever, and no new run could bring it
		 * down: it is reserved at that most instead, held whole. */
		uint64_t most = grantable(reg, admin);
		if (most && learned > most)
			return learned_not_used(
			    why, whylen, most,
			    "all this fleet ever grants one request", "");
		*learned_used = true;
		return learned;
	}
	if (known)
		return learned_not_used(
		    why, whylen, declared, "declared",
		    " not used: [kinds] reserve_learned = false");
	if (declared) {
		uint64_t room = first_run_room(reg);
		/* Declared above the fleet limit (or with none, the line)
		 * it can never be admitted, and is told so. */
		uint64_t top =
		    reg->totals.limit ? reg->totals.limit : bare_limit(reg);
		if (room && declared > room && declared <= top &&
		    waited(reg, who)) {
			char d[32];
			mt_format_size(d, sizeof(d), declared);
			snprintf(
			    why, whylen,
			    "%s: all this node can give beside what runs "
			    "outside reservations (declared %s; kind %.*s "
			    "has no history and its first run waited %.0f s: "
			    "run, to learn it)",
			    mt_format_size(a, sizeof(a), room), d, 128, kind,
			    pol->admit_queue_ms / 1000.0);
			return room;
		}
		snprintf(why, whylen, "%s: declared; kind %.*s has no history",
		         mt_format_size(a, sizeof(a), declared), 128, kind);
		return declared;
	}
	uint64_t d = mts_kind_default_size(reg);
	/* Bounded as a learned size is: a default above all one request is
	 * ever granted (a uid's max_reserved_bytes_per_uid below it) would
	 * be denied for ever, and the kind would never run to learn. */
	uint64_t most = grantable(reg, admin);
	if (most && d > most) {
		snprintf(why, whylen,
		         "%s: kind %.*s has no history ([kinds] default_size, "
		         "cut to all this fleet ever grants one request)",
		         mt_format_size(a, sizeof(a), most), 128, kind);
		return most;
	}
	snprintf(why, whylen,
	         "%s: kind %.*s has no history ([kinds] default_size)",
	         mt_format_size(a, sizeof(a), d), 128, kind);
	return d;
}

/* What host `p` holds of its own, beside the tasks it runs. */
static uint64_t host_own(const struct mts_registry *reg,
                         const struct mts_proc *p)
{
	uint64_t own = host_vouched(reg, p);
	for (uint32_t i = 0; reg->adm->nhosted && i < reg->adm->nresv; i++) {
		const struct mts_resv *r = reg->adm->resv[i];
		if (hosted_by(r, p->pid))
			own = own > r->use ? own - r->use : 0;
	}
	return own;
}

/* All host `p` can ever give a task under its own limit `host_limit`:
 * that limit less its own memory. */
static uint64_t host_room(const struct mts_registry *reg,
                          const struct mts_proc *p, uint64_t host_limit)
{
	uint64_t own = host_own(reg, p);
	return host_limit > own ? host_limit - own : 0;
}

/*
 * A task run inside a worker that has a memory limit of its own (Dask's
 * memory_limit, past which Dask ends the worker and every task in it;
 * memtallyd does not know it): denied unless the worker's figure, what
 * its running tasks are set aside and what the request needs beside them
 * fit under Admit.host_limit. The worker's tasks are projected as the
 * fleet's are (project_need over that worker's alone: their means plus
 * the root of their squared gaps, whole), not summed at their full
 * grants: summed so, a worker of 16 threads was held to a few tasks the
 * fleet had room for. That is a bet that its tasks do not all reach
 * their high quantile at once; where the worker's limit is below the
 * node guard's line (Dask's default share of the node), nothing of ours
 * backs it. The asker limits only itself. The answer's limit is
 * all the worker can ever give a task, its limit less its own memory: a
 * request above it can never run there.
 */
static void deny_host(const struct mts_registry *reg,
                      const struct mts_peer *peer,
                      const struct mts_admit_req *req, uint64_t bytes,
                      const struct mts_kind_profile *prof,
                      struct mts_admit_out *out)
{
	if (!req->in_process || !req->host_limit)
		return;
	const struct mts_proc *p = host_of(reg, peer);
	if (!p)
		return;
	uint64_t held = host_vouched(reg, p), pend = 0;
	for (uint32_t i = 0; reg->adm->nhosted && i < reg->adm->nresv; i++) {
		const struct mts_resv *r = reg->adm->resv[i];
		if (hosted_by(r, p->pid))
			pend = mt_sat_add(pend, r->effective);
	}
	uint64_t need =
	    project_need(reg, UINT32_MAX, p->pid, bytes, prof, true, NULL);
	if (mt_sat_add(mt_sat_add(held, pend), need) <= req->host_limit)
		return;
	uint64_t room = host_room(reg, p, req->host_limit);
	char a[32], b[32], c[32], d[32], e[32];
	out->admitted = false;
	out->reason = MTS_DENY_HOST_LIMIT;
	snprintf(out->scope, sizeof(out->scope), "host");
	out->measured = held;
	out->reserved = pend;
	out->need = need;
	out->limit = room;
	snprintf(out->why, sizeof(out->why),
	         "host limit: %s held by the worker + %s reserved for its "
	         "running tasks + %s requested > %s (its own limit; at most "
	         "%s beside its own memory)",
	         mt_format_size(a, sizeof(a), held),
	         mt_format_size(b, sizeof(b), pend),
	         mt_format_size(c, sizeof(c), need),
	         mt_format_size(d, sizeof(d), req->host_limit),
	         mt_format_size(e, sizeof(e), room));
	why_projected(out, bytes, need);
}

/*
 * A first run (its kind has no history) declared above all its worker may
 * ever hold for it (Admit.host_limit less the worker's own memory)
 * could never run there, and its kind never learn: it is sized at that
 * instead, as a first run beside the fleet's other processes is
 * (first_run_room).
 */
static uint64_t first_run_in_host(const struct mts_registry *reg,
                                  const struct mts_peer *peer,
                                  const struct mts_admit_req *req,
                                  uint64_t bytes, char *why, size_t whylen)
{
	if (!req->in_process || !req->host_limit)
		return bytes;
	const struct mts_proc *p = host_of(reg, peer);
	if (!p)
		return bytes;
	uint64_t room = host_room(reg, p, req->host_limit);
	if (!room || bytes <= room)
		return bytes;
	char a[32];
	size_t n = strlen(why);
	snprintf(why + n, whylen - n,
	         "; a first run: %s, all its worker may hold beside its own",
	         mt_format_size(a, sizeof(a), room));
	return room;
}

/*
 * An Admit that says it repeats an unanswered one of its task
 * (Admit.again): that one's grant, if memtallyd made it, to this very
 * process, and no worker of the task took it over. A stalled memtallyd
 * reads every ask it missed once it goes on (`memtally run --wait` asks
 * again after each timeout) and granted each: the room set aside two and
 * three times, all but one grant lost to its asker until the TTL. A task
 * may hold several reservations on purpose (Admits without `again`).
 */
static const struct mts_resv *granted_before(const struct mts_registry *reg,
                                             const struct mts_peer *peer,
                                             const char *task,
                                             const struct mts_admit_req *req)
{
	if (!req->again || !task[0] || req->in_process || !peer->has_cred)
		return NULL;
	const struct mts_task *t = task_find(reg, task, hash_str(task));
	for (const struct mts_resv *r = t ? t->resv : NULL; r; r = r->tnext) {
		uint64_t start;
		/* The start time (a pidfd and a /proc read) only for a
		 * candidate: most repeats find no grant. */
		if (r->has_owner && r->uid == peer->uid &&
		    r->asker_pid == peer->pid && !r->taken_over && !r->hosted &&
		    !r->evicted &&
		    mts_peer_start_time(reg, peer, &start) == 0 &&
		    r->asker_start == start)
			return r;
	}
	return NULL;
}

static void answer_again(const struct mts_registry *reg,
                         const struct mts_peer *peer, const char *task,
                         const struct mts_resv *r, struct mts_admit_out *out)
{
	const struct mts_totals *t = &reg->totals;
	char qt[MTS_LOGQ_MAX], who[MTS_PEER_WHO_MAX];
	memset(out, 0, sizeof(*out));
	out->admitted = true;
	memcpy(out->id, r->id, sizeof(out->id));
	out->ttl_s = r->ttl_s;
	out->requested = out->reserve = r->bytes;
	out->declared = r->declared;
	out->measured = mts_measured(reg, t->bytes, t->rss);
	out->reserved = t->reserved;
	out->limit = t->limit;
	snprintf(out->scope, sizeof(out->scope), "fleet");
	snprintf(out->sized_by, sizeof(out->sized_by),
	         "granted before: the answer to an earlier Admit of the task "
	         "that went unanswered");
	mts_log_uid(mts_peer_log_uid(peer), MTS_LOG_INFO,
	            "admission granted again: an unanswered Admit of the task "
	            "was granted",
	            "reservation=%s bytes=%llu task=%s %s", r->id,
	            (unsigned long long)r->bytes,
	            mts_logq(qt, sizeof(qt), task),
	            mts_peer_who(peer, who, sizeof(who)));
}

int mts_admit(struct mts_registry *reg, const struct mts_peer *peer,
              const struct mts_admit_req *req, struct mts_admit_out *out)
{
	const char *group =
	    req->group && req->group[0] ? req->group : "default";
	const char *task = req->task ? req->task : "";
	const char *kind = req->kind ? req->kind : "";
	if ((req->bytes == 0 && !kind[0]) || !mt_name_ok(group) ||
	    !mt_name_ok(task) || !mt_name_ok(kind)) {
		memset(out, 0, sizeof(*out));
		out->requested = req->bytes;
		reg->adm->stats.denials[MTS_DENY_INVALID]++;
		out->reason = MTS_DENY_INVALID;
		mts_log_uid(mts_peer_log_uid(peer), MTS_LOG_INFO,
		            "admission refused: invalid request",
		            "peer_pid=%u bytes=%llu", peer->pid,
		            (unsigned long long)req->bytes);
		return -EINVAL;
	}
	const struct mts_resv *prev = granted_before(reg, peer, task, req);
	if (prev) {
		answer_again(reg, peer, task, prev, out);
		return 0;
	}
	/* The server's table is full (only admins, exempt from the per-uid
	 * cap, or very many uids can fill it): a denial like the others, for
	 * room comes back as reservations end, not a failure of the server.
	 * The figures are the fleet's, as a fleet-limit denial gives them. */
	if (reg->adm->nresv >= MTS_RESV_MAX) {
		const struct mts_totals *t = &reg->totals;
		uint64_t own =
		    peer->has_cred ? mts_vouch_unvouched_of(reg, peer->uid) : 0;
		memset(out, 0, sizeof(*out));
		out->reason = MTS_DENY_FULL;
		out->requested = req->bytes;
		out->declared = req->bytes;
		out->measured =
		    mts_measured(reg, mt_sat_add(t->bytes, own), t->rss);
		out->reserved = t->reserved;
		out->limit = t->limit;
		snprintf(out->scope, sizeof(out->scope), "server");
		snprintf(out->why, sizeof(out->why),
		         "reservations full: %u are outstanding, the most this "
		         "server keeps; wait for some to end or release them",
		         reg->adm->nresv);
		reg->adm->stats.denials[MTS_DENY_FULL]++;
		log_denial(reg, peer, group, task, out);
		return 0;
	}
	bool owned;
	uint32_t key = peer_key(peer, &owned);
	char sized_by[sizeof(out->sized_by)];
	bool learned;
	bool admin = mts_peer_trusted(reg, peer);
	uint64_t bytes =
	    size_request(reg, key, admin, waiter_key(key, task), kind,
	                 req->bytes, sized_by, sizeof(sized_by), &learned);
	if (!learned && kind[0] && req->bytes && bytes > 0)
		bytes = first_run_in_host(reg, peer, req, bytes, sized_by,
		                          sizeof(sized_by));
	/* A learned size with a task to follow also follows the kind's
	 * profile: it sets aside what the task is expected to hold at its
	 * age, and admission sees what it will grow into. */
	struct mts_kind_profile prof;
	bool profiled = learned && task[0] && reg->policy.kind_follow_profile &&
	                mts_kind_profile_for(reg, kind, key, &prof) == 0;
	if (profiled)
		profile_why(&prof, sized_by, sizeof(sized_by));
	/* A new kind past its uid's cap or the server's: refused, never
	 * another uid's kind dropped for it. */
	char why[sizeof(out->why)], scope[sizeof(out->scope)];
	bool kind_refused =
	    kind[0] && !mts_kind_find(reg, kind, key) &&
	    mts_kind_may_create(reg, key, admin, why, sizeof(why), scope,
	                        sizeof(scope)) < 0;
	if (kind_refused) {
		memset(out, 0, sizeof(*out));
		out->reason = MTS_DENY_KIND_CAP;
		memcpy(out->why, why, sizeof(why));
		memcpy(out->scope, scope, sizeof(scope));
	} else {
		mts_admit_decide_profile(
		    reg, peer, group, bytes, profiled ? &prof : NULL,
		    req->in_process, waiter_key(key, task), out);
		if (out->admitted)
			deny_host(reg, peer, req, bytes,
			          profiled ? &prof : NULL, out);
	}
	out->requested = bytes;
	out->reserve = bytes;
	out->declared = req->bytes;
	memcpy(out->sized_by, sized_by, sizeof(sized_by));
	if (!out->admitted) {
		reg->adm->stats.denials[out->reason]++;
		/* Only a request room can free waits in the queue: one
		 * larger than its own group's limit (the fleet's check,
		 * made first, denied it while the fleet was tight) would
		 * hold the fleet's last room for a grant that never comes,
		 * and one denied for anything but room gives its place up. */
		const struct mts_group *g = mts_find_group(reg, group);
		bool room = out->reason == MTS_DENY_FLEET_LIMIT ||
		            out->reason == MTS_DENY_NODE;
		if (room && !(g && g->limit && bytes > g->limit))
			waiter_note(reg, waiter_key(key, task), bytes,
			            profiled ? &prof : NULL, req->in_process,
			            admin);
		else
			waiter_remove(reg, waiter_key(key, task));
		log_denial(reg, peer, group, task, out);
		return 0;
	}
	waiter_remove(reg, waiter_key(key, task));
	return resv_grant(reg, peer, group, task, kind, bytes,
	                  profiled ? &prof : NULL, req, out);
}

/* ---- runs: what a `memtally run` started ----------------------------------
 */

static int cmp_run(const void *a, const void *b)
{
	const struct mts_run_ref *x = a, *y = b;
	if (x->pid != y->pid)
		return x->pid < y->pid ? -1 : 1;
	if (x->start != y->start)
		return x->start < y->start ? -1 : 1;
	/* The oldest reservation first: the one a run's tree counts in. */
	return x->r->created_mono_ns < y->r->created_mono_ns   ? -1
	       : x->r->created_mono_ns > y->r->created_mono_ns ? 1
	                                                       : 0;
}

struct mts_run_ref *mts_resv_runs(const struct mts_registry *reg, uint32_t *n)
{
	const struct mts_admission *adm = reg->adm;
	*n = 0;
	struct mts_run_ref *v =
	    adm && adm->nresv ? malloc((size_t)adm->nresv * sizeof(*v)) : NULL;
	if (!v)
		return NULL;
	uint32_t m = 0;
	for (uint32_t i = 0; i < adm->nresv; i++) {
		struct mts_resv *r = adm->resv[i];
		/* One asked for over TCP has no asker here. */
		if (r->has_owner && r->asker_pid)
			v[m++] = (struct mts_run_ref){
			    r->asker_pid, r->asker_start, r->uid, r};
	}
	qsort(v, m, sizeof(*v), cmp_run);
	/* One entry per asker, and none for an asker of two tasks, nor of
	 * a task run inside it (its growth is that task's: a Dask or
	 * Celery worker) or without a task. */
	uint32_t out = 0;
	for (uint32_t i = 0; i < m;) {
		const struct mts_resv *r = v[i].r;
		bool one = r->task && !r->hosted;
		uint32_t j = i + 1;
		for (;
		     j < m && v[j].pid == v[i].pid && v[j].start == v[i].start;
		     j++)
			one = one && v[j].r->task == r->task &&
			      !v[j].r->hosted && v[j].uid == v[i].uid;
		if (one)
			v[out++] = v[i];
		i = j;
	}
	*n = out;
	if (!out) {
		free(v);
		return NULL;
	}
	return v;
}

const struct mts_run_ref *mts_run_find(const struct mts_run_ref *runs,
                                       uint32_t n, uint32_t pid, uint64_t start)
{
	struct mts_run_ref key = {.pid = pid};
	const struct mts_run_ref *a =
	    runs ? bsearch(&key, runs, n, sizeof(*runs), mt_cmp_u32) : NULL;
	if (!a)
		return NULL;
	/* bsearch found one of those of `pid`: a reused pid's older run may
	 * stand beside it, each once. */
	while (a > runs && a[-1].pid == pid)
		a--;
	for (; a < runs + n && a->pid == pid; a++)
		if (a->start == start)
			return a;
	return NULL;
}

void mts_resv_run_read(struct mts_registry *reg, struct mts_resv *r, bool gone,
                       bool cut, uint64_t held, uint32_t nproc)
{
	char q[MTS_LOGQ_MAX];
	if (gone) {
		/* Killed (SIGKILL cannot be forwarded; its command went
		 * with it, PR_SET_PDEATHSIG) before its release. One whose
		 * command never held memory is a scheduler's grant, perhaps,
		 * that a worker takes over later: its TTL ends it. */
		if (!r->tree_run || r->taken_over)
			return;
		mts_log_uid(resv_key(r), MTS_LOG_INFO,
		            "reservation ended: the run that asked for it is "
		            "gone",
		            "reservation=%s task=%s asker_pid=%u bytes=%llu "
		            "owner_uid=%u",
		            r->id, mts_logq(q, sizeof(q), r->task->name),
		            r->asker_pid, (unsigned long long)r->bytes, r->uid);
		reg->adm->stats.fulfilled++;
		resv_remove(reg, r, true);
		return;
	}
	/* Only while none of its task's workers is registered: a young
	 * worker read before it registered would count twice until the
	 * next sweep (its kind's peak with it), and a command that
	 * registers is counted by its workers. */
	bool workers = resv_matched_live(r->task, r);
	if (workers) {
		held = 0;
		nproc = 0;
	} else if (cut && !r->tree_cut) {
		/* More processes than a sweep reads (MTS_RSS_FAMILY_MAX a
		 * uid): what was read is less than it holds, and a kind
		 * sized on it would be too small. Its run teaches nothing. */
		r->tree_cut = true;
		r->peak = 0;
		mts_log_uid(resv_key(r), MTS_LOG_WARN,
		            "a run's command has more processes than a sweep "
		            "reads: its run teaches its kind nothing",
		            "reservation=%s task=%s asker_pid=%u read=%u "
		            "owner_uid=%u",
		            r->id, mts_logq(q, sizeof(q), r->task->name),
		            r->asker_pid, nproc, r->uid);
	}
	if (held && !r->tree_run) {
		/* Running now, as a worker's taking it over makes it: its
		 * kind learns from it and it lives while its command does. */
		r->tree_run = true;
		reg->adm->resv_dirty = true;
		if (!r->taken_over)
			run_start(r);
		resv_rearm(reg, r);
		mts_log_uid(resv_key(r), MTS_LOG_INFO,
		            "a run's command holds memory no worker of it "
		            "registered for: counted with its reservation",
		            "reservation=%s task=%s asker_pid=%u processes=%u "
		            "bytes=%llu owner_uid=%u",
		            r->id, mts_logq(q, sizeof(q), r->task->name),
		            r->asker_pid, nproc, (unsigned long long)held,
		            r->uid);
	}
	/* A task with no worker registered has no tick of its own
	 * (task_peaks): its use, peak and run are the sweep's. */
	if (!r->kind || workers || !r->tree_run || r->tree_cut)
		return;
	uint64_t now = mts_now_monotonic();
	r->use = held;
	if (held > r->peak)
		r->peak = held;
	run_sample(r, now, held);
	uint64_t w = run_want(r, now);
	if (w != r->want) {
		r->want = w;
		task_recount(reg, r->task);
	}
}

/* ---- the node guard's side ------------------------------------------------
 */

void mts_resv_evicted(struct mts_registry *reg, struct mts_resv *r)
{
	if (r->evicted)
		return;
	r->evicted = true;
	/* As at a release: a task that never ran, or held nothing yet,
	 * teaches its kind nothing (a hosted task granted a moment before
	 * its host was evicted would teach it a size of 0). */
	if (r->kind && running(r) && r->peak) {
		struct mts_kind_run run;
		run_of(r, true, &run);
		mts_kind_note_run(reg, r->kind->name, r->kind->uid, &run);
	}
}

/* ---- Release ------------------------------------------------------------- */

int mts_release(struct mts_registry *reg, const struct mts_peer *peer,
                const char *id, const char *token, uint64_t *bytes)
{
	char q[MTS_LOGQ_MAX], who[MTS_PEER_WHO_MAX];
	struct mts_resv *r = mts_resv_find(reg, id);
	if (!r) {
		mts_log_uid(mts_peer_log_uid(peer), MTS_LOG_INFO,
		            "release of an unknown reservation",
		            "reservation=%s %s",
		            mts_logq(q, sizeof(q), id ? id : ""),
		            mts_peer_who(peer, who, sizeof(who)));
		return -ENOENT;
	}
	enum mts_auth a =
	    mts_authorise_release(reg, peer, token, r->has_owner, r->uid);
	if (a == MTS_AUTH_NONE) {
		reg->adm->stats.auth_denials++;
		mts_log_uid(mts_peer_log_uid(peer), MTS_LOG_WARN,
		            "release refused: not authorised",
		            "reservation=%s owner_uid=%u %s", r->id, r->uid,
		            mts_peer_who(peer, who, sizeof(who)));
		return -EPERM;
	}
	*bytes = r->bytes;
	mts_log_uid(mts_peer_log_uid(peer), MTS_LOG_INFO,
	            "reservation released",
	            "reservation=%s bytes=%llu by=%s %s", r->id,
	            (unsigned long long)r->bytes, mts_auth_name(a),
	            mts_peer_who(peer, who, sizeof(who)));
	reg->adm->stats.releases++;
	resv_remove(reg, r, true);
	mts_limits_eval(reg, false);
	mts_publish(reg);
	return 0;
}

/* ---- the reservations' record ----------------------------------------------
 *
 * A restarted memtallyd keeps the reservations of the one before: their
 * grants were promises to schedulers (which hold the ids, and Release
 * them) and to the tasks running on them. The record is a private file
 * (the server's uid, 0600, written to a temporary name and renamed, as the
 * learned sizes' record), rewritten by the server a moment after a
 * reservation comes or goes and every few seconds while any is held (for
 * their peaks). Layout: struct resv_hdr, then per reservation struct
 * resv_rec and its group, task and kind names. The checksum (FNV-1a)
 * covers the payload; the kernel's boot id ties the monotonic times in it
 * to this boot. Version 2 adds what a task run inside its asker
 * (Admit.in_process) is measured against: its host's pid, start time and
 * thread, and the host's figures at and since its start. Version 1
 * records (no such reservation in them) are read as they are.
 */
#define RESV_MAGIC   UINT64_C(0x317673655254544d) /* "MTTResv1" */
#define RESV_VERSION 2u
/* In resv_rec.taken_over: its run's command held memory (tree_run). A
 * server before it reads the byte as taken over, which ends the
 * reservation with its asker, as this one does. */
#define RESV_TREE_RUN 2u
/* And: Admit.until_release (until_release). Read as taken over before. */
#define RESV_UNTIL_RELEASE 4u

struct resv_hdr {
	uint64_t magic;
	uint32_t version;
	uint32_t count;
	uint64_t payload;
	uint64_t checksum;
	unsigned char boot[16];
};

struct resv_rec {
	char id[24];
	uint32_t uid;
	uint32_t asker_pid;
	uint64_t asker_start;
	uint8_t has_owner;
	uint8_t profiled;
	uint8_t evicted;
	uint8_t taken_over; /* bit 0 taken_over; RESV_TREE_RUN: tree_run;
	                       RESV_UNTIL_RELEASE: until_release */
	uint32_t ttl_s;
	uint64_t bytes;
	uint64_t declared;
	uint64_t peak;
	uint64_t created_ns;
	uint64_t created_mono_ns;
	uint64_t started_mono_ns;
	uint64_t last_seen_ns;
	uint32_t slot_ms;
	uint32_t kind_uid;
	uint32_t group_len;
	uint32_t task_len;
	uint32_t kind_len;
	uint32_t prof_mean_ms;
	uint64_t prof_bytes[MTS_KIND_STEPS];
	uint64_t prof_mean[MTS_KIND_STEPS];
	uint64_t slots[MTS_RESV_SLOTS];
	/* Version 2 on: run inside its asker, the host (0: not hosted). */
	uint32_t host_pid;
	uint32_t host_tid;
	uint64_t host_start;
	uint64_t host_gen;
	uint32_t host_slot;
	uint32_t lane_known;
	int64_t lane_base;
	uint64_t host_base;
	uint64_t host_low;
	uint64_t host_own_base;
	uint64_t host_use;
};
/* A version 1 record's reservation: all before the host. */
#define RESV_V1_REC offsetof(struct resv_rec, host_pid)
/* The record is the structs' native layout: a change is a new version. */
_Static_assert(sizeof(struct resv_hdr) == 48, "the record's header");
/* mts_record_seal's common head: payload and checksum where every
 * record of the server's has them. */
_Static_assert(offsetof(struct resv_hdr, payload) == 16 &&
                   offsetof(struct resv_hdr, checksum) == 24,
               "the records' common head");
_Static_assert(sizeof(struct resv_rec) ==
                   200 + 16 * MTS_KIND_STEPS + 8 * MTS_RESV_SLOTS,
               "the record's reservation");
_Static_assert(RESV_V1_REC == 128 + 16 * MTS_KIND_STEPS + 8 * MTS_RESV_SLOTS,
               "a version 1 record's reservation");

/* The kernel's id of this boot (/proc/sys/kernel/random/boot_id, 32 hex
 * digits), read once; all zero where it cannot be read, which no record
 * is restored under. */
static const unsigned char *boot_id(void)
{
	static unsigned char id[16];
	static bool read_once;
	if (read_once)
		return id;
	read_once = true;
	FILE *f = fopen("/proc/sys/kernel/random/boot_id", "re");
	char text[64];
	size_t k = 0;
	if (f && fgets(text, sizeof(text), f))
		for (const char *c = text; *c && k < 32; c++) {
			int v = *c >= '0' && *c <= '9'   ? *c - '0'
			        : *c >= 'a' && *c <= 'f' ? *c - 'a' + 10
			                                 : -1;
			if (v < 0)
				continue;
			id[k / 2] = (unsigned char)(id[k / 2] << 4 | v);
			k++;
		}
	if (f)
		fclose(f);
	if (k != 32)
		memset(id, 0, sizeof(id));
	return id;
}

/* Granted first, first; the id breaks a tie. */
static int resv_older(const void *a, const void *b)
{
	const struct mts_resv *x = *(const struct mts_resv *const *)a;
	const struct mts_resv *y = *(const struct mts_resv *const *)b;
	if (x->created_mono_ns != y->created_mono_ns)
		return x->created_mono_ns < y->created_mono_ns ? -1 : 1;
	return strcmp(x->id, y->id);
}

int mts_resv_encode(const struct mts_registry *reg, unsigned char **out,
                    size_t *len)
{
	/* In the order they were granted: a task's use counts against its
	 * reservations oldest first, and they are restored in record order.
	 * (resv[] loses that order as reservations end.) */
	const struct mts_resv **by_age = NULL;
	uint32_t n = reg->adm->nresv;
	if (n && !(by_age = malloc(n * sizeof(*by_age))))
		return -ENOMEM;
	for (uint32_t i = 0; i < n; i++)
		by_age[i] = reg->adm->resv[i];
	if (n)
		qsort(by_age, n, sizeof(*by_age), resv_older);
	/* Sized once: growing a buffer of tens of MB by doubling copies it
	 * again and again, on the loop. */
	struct mts_record_buf w = {0};
	size_t want = sizeof(struct resv_hdr) +
	              (size_t)n * (sizeof(struct resv_rec) + 64);
	if ((w.d = malloc(want)))
		w.cap = want;
	struct resv_hdr h = {.magic = RESV_MAGIC, .version = RESV_VERSION};
	memcpy(h.boot, boot_id(), sizeof(h.boot));
	mts_record_put(&w, &h, sizeof(h));
	for (uint32_t i = 0; i < n; i++) {
		const struct mts_resv *r = by_age[i];
		const char *group = reg->groups[r->group].name;
		const char *task = r->task ? r->task->name : "";
		const char *kind = r->kind ? r->kind->name : "";
		struct resv_rec rr = {
		    .uid = r->uid,
		    .asker_pid = r->asker_pid,
		    .asker_start = r->asker_start,
		    .has_owner = r->has_owner,
		    .profiled = r->profiled,
		    .evicted = r->evicted,
		    .taken_over =
		        (uint8_t)((r->taken_over ? 1u : 0u) |
		                  (r->tree_run ? RESV_TREE_RUN : 0u) |
		                  (r->until_release ? RESV_UNTIL_RELEASE : 0u)),
		    .ttl_s = r->ttl_s,
		    .bytes = r->bytes,
		    .declared = r->declared,
		    .peak = r->peak,
		    .created_ns = r->created_ns,
		    .created_mono_ns = r->created_mono_ns,
		    .started_mono_ns = running(r) ? r->started_mono_ns : 0,
		    .last_seen_ns = r->last_seen_ns,
		    .slot_ms = r->slot_ms,
		    .kind_uid = r->kind ? r->kind->uid : 0,
		    .group_len = (uint32_t)strlen(group),
		    .task_len = (uint32_t)strlen(task),
		    .kind_len = (uint32_t)strlen(kind),
		    .prof_mean_ms = r->profiled ? r->prof.mean_ms : 0,
		};
		if (r->hosted) {
			rr.host_pid = r->host_pid;
			rr.host_tid = r->host_tid;
			rr.host_start = r->host_start;
			rr.host_gen = r->host_gen;
			rr.host_slot = r->host_slot;
			rr.lane_known = r->lane_known;
			rr.lane_base = r->lane_base;
			rr.host_base = r->host_base;
			rr.host_low = r->host_low;
			rr.host_own_base = r->host_own_base;
			rr.host_use = r->use;
		}
		memcpy(rr.id, r->id, sizeof(r->id));
		if (r->profiled) {
			memcpy(rr.prof_bytes, r->prof.bytes,
			       sizeof(rr.prof_bytes));
			memcpy(rr.prof_mean, r->prof.mean,
			       sizeof(rr.prof_mean));
		}
		memcpy(rr.slots, r->slots, sizeof(rr.slots));
		mts_record_put(&w, &rr, sizeof(rr));
		mts_record_put(&w, group, rr.group_len);
		mts_record_put(&w, task, rr.task_len);
		mts_record_put(&w, kind, rr.kind_len);
		h.count++;
	}
	free(by_age);
	if (w.failed) {
		free(w.d);
		return -ENOMEM;
	}
	h.payload = w.len - sizeof(h);
	memcpy(w.d, &h, sizeof(h)); /* sealed where it is written */
	*out = w.d;
	*len = w.len;
	return 0;
}

/* "r-" and 16 lowercase hex digits, as new_id makes them. */
static bool resv_id_ok(const char *id)
{
	if (strlen(id) != MTS_RESV_ID_LEN || id[0] != 'r' || id[1] != '-')
		return false;
	for (size_t i = 2; i < MTS_RESV_ID_LEN; i++)
		if (!((id[i] >= '0' && id[i] <= '9') ||
		      (id[i] >= 'a' && id[i] <= 'f')))
			return false;
	return true;
}

/* One record's reservation, linked as resv_grant links a grant, with its
 * own id, times and run, and taken over if it was (`workers_back`: its
 * task is looked at by the first tick, and ends there if none of its
 * workers was adopted). 0, or -EINVAL (refused: a name or figure out of
 * range, past max_ttl, the server full), -EEXIST (its id is taken),
 * -ENOMEM. The group's access is not checked again: the grant passed it,
 * with the asker's credentials, which the record does not hold. */
static int resv_restore_one(struct mts_registry *reg, const struct resv_rec *rr,
                            const char *group, const char *task,
                            const char *kind, uint64_t now, bool workers_back)
{
	const struct mts_policy *pol = &reg->policy;
	uint32_t key = rr->has_owner ? rr->uid : MTS_UID_TCP;
	if (!resv_id_ok(rr->id) || !rr->bytes || !mt_name_ok(group) ||
	    !mt_name_ok(task) || !mt_name_ok(kind) || !group[0] ||
	    rr->created_mono_ns > now || (kind[0] && rr->kind_uid != key) ||
	    (rr->profiled && !rr->prof_mean_ms) ||
	    (rr->host_pid && !rr->has_owner) || reg->adm->nresv >= MTS_RESV_MAX)
		return -EINVAL;
	if (mts_resv_find(reg, rr->id))
		return -EEXIST;
	uint32_t ttl = rr->ttl_s > pol->max_ttl_s ? pol->max_ttl_s : rr->ttl_s;
	/* Past even the longest a task's workers keep it: ended meanwhile. */
	if (now - rr->created_mono_ns >= (uint64_t)pol->max_ttl_s * 1000000000u)
		return -EINVAL;
	if (resv_make_room(reg) < 0)
		return -ENOMEM;
	struct mts_resv *r = calloc(1, sizeof(*r));
	if (!r)
		return -ENOMEM;
	r->heap_index = UINT32_MAX;
	memcpy(r->id, rr->id, sizeof(r->id));
	/* Its kind existed, within the caps, when it was granted: counted
	 * as then, exempt from nothing it was not exempt from. */
	if (kind[0] && mts_kind_ref(reg, kind, key, false, &r->kind) < 0)
		goto fail;
	/* A group its owner brought into existence counts against the
	 * owner's max_groups_per_uid, as mts_group_ensure_peer counts it. */
	bool made = !mts_find_group(reg, group);
	uint32_t gi;
	if (mts_group_ensure(reg, group, &gi) < 0)
		goto fail;
	if (made && rr->has_owner && strcmp(group, "default") != 0 &&
	    !mts_policy_group(pol, group)) {
		if (mts_uid_count_add(&reg->groups_by_uid, rr->uid) < 0) {
			mts_group_gc(reg, gi);
			goto fail;
		}
		reg->groups[gi].creator = rr->uid;
	}
	r->has_owner = rr->has_owner;
	r->uid = rr->uid;
	r->asker_pid = rr->asker_pid;
	r->asker_start = rr->asker_start;
	r->declared = rr->declared;
	if (rr->profiled) {
		r->profiled = true;
		r->prof.known = true;
		r->prof.mean_ms = rr->prof_mean_ms;
		memcpy(r->prof.bytes, rr->prof_bytes, sizeof(r->prof.bytes));
		memcpy(r->prof.mean, rr->prof_mean, sizeof(r->prof.mean));
	}
	if (resv_attach(reg, r, gi, key, rr->bytes, task, ttl) < 0)
		goto fail;
	/* Its own times, not the restart's: its TTL counts from its grant. */
	r->created_ns = rr->created_ns;
	r->created_mono_ns = rr->created_mono_ns;
	r->peak = rr->peak;
	r->evicted = rr->evicted;
	/* Run inside its asker: the host is found again among the adopted
	 * workers by its pid and start time at the first tick, or the
	 * reservation ends there (hosted_tick, host_found). */
	if (rr->host_pid) {
		r->hosted = true;
		r->host_unbound = true;
		r->host_pid = rr->host_pid;
		r->host_tid = rr->host_tid;
		r->host_start = rr->host_start;
		r->host_gen = rr->host_gen;
		r->host_slot = rr->host_slot;
		r->lane_known = rr->lane_known != 0;
		r->lane_base = rr->lane_base;
		r->host_base = rr->host_base;
		r->host_low = rr->host_low;
		r->host_own_base = rr->host_own_base;
		r->use = rr->host_use;
		reg->adm->nhosted++;
	}
	/* Taken over: max_ttl from its grant. A reservation without a task
	 * was never taken over. */
	bool took = (rr->taken_over & 1u) && r->task && !r->taken_over;
	if (took)
		r->taken_over = true;
	/* Its command's memory is read again by the next full sweep; its
	 * asker gone by then, it ends (mts_resv_run_read). */
	if ((rr->taken_over & RESV_TREE_RUN) && r->task && r->asker_pid)
		r->tree_run = true;
	if ((rr->taken_over & RESV_UNTIL_RELEASE) && r->task && r->asker_pid)
		r->until_release = true;
	/* Its run goes on from where the record left it (not started again
	 * when its workers are adopted). */
	if (took || r->hosted || r->tree_run) {
		if (rr->started_mono_ns && rr->started_mono_ns <= now &&
		    rr->slot_ms >= MTS_RESV_SLOT_MS) {
			r->started_mono_ns = rr->started_mono_ns;
			r->last_seen_ns = rr->last_seen_ns;
			r->slot_ms = rr->slot_ms;
			memcpy(r->slots, rr->slots, sizeof(r->slots));
		} else {
			run_start(r);
		}
	}
	if (took) {
		r->restored_unseen = true;
		/* No workers adopted (no restart record of them: removed,
		 * of another version): they register afresh, or are gone.
		 * Judged by its asker meanwhile (`memtally run`, alive
		 * while its command runs): before, it was never judged and
		 * held its bytes until max_ttl, a day by default. */
		bool judge = workers_back;
		if (!workers_back && r->asker_pid) {
			judge = true;
			await_add(r->task, r->asker_pid, r->asker_start);
		}
		if (judge && !r->task->seen)
			task_seen(reg, r->task);
		r->task->dirty = true;
	}
	r->expires_ns = resv_deadline(reg, r);
	if (r->heap_index != UINT32_MAX)
		heap_fix(reg, r->heap_index);
	return 0;

fail:
	if (r->kind)
		mts_kind_unref(reg, r->kind);
	free(r);
	return -ENOMEM;
}

/* What was restored counts from now, whatever came after it. */
static int resv_restored(struct mts_registry *reg, uint32_t kept, int err)
{
	if (kept) {
		mts_limits_eval(reg, false);
		mts_publish(reg);
	}
	return err;
}

int mts_resv_restore(struct mts_registry *reg, const unsigned char *d,
                     size_t len, bool workers_back, uint32_t *kept,
                     uint32_t *dropped)
{
	*kept = *dropped = 0;
	struct resv_hdr h;
	if (len < sizeof(h))
		return -EINVAL;
	memcpy(&h, d, sizeof(h));
	if (h.magic != RESV_MAGIC || h.version < 1 ||
	    h.version > RESV_VERSION || h.payload != len - sizeof(h) ||
	    h.checksum !=
	        mts_record_fnv(MTS_RECORD_FNV0, d + sizeof(h), h.payload))
		return -EINVAL;
	static const unsigned char none[16];
	if (memcmp(h.boot, boot_id(), sizeof(h.boot)) != 0 ||
	    memcmp(h.boot, none, sizeof(none)) == 0) {
		/* Another boot's: its tasks are gone, its times meaningless. */
		*dropped = h.count;
		return 0;
	}
	uint64_t now = mts_now_monotonic();
	size_t off = sizeof(h);
	for (uint32_t i = 0; i < h.count; i++) {
		struct resv_rec rr = {0};
		size_t rlen = h.version == 1 ? RESV_V1_REC : sizeof(rr);
		if (len - off < rlen)
			return resv_restored(reg, *kept, -EINVAL);
		memcpy(&rr, d + off, rlen);
		off += rlen;
		char names[3][MTS_NAME_MAX + 1];
		const uint32_t lens[3] = {rr.group_len, rr.task_len,
		                          rr.kind_len};
		for (int k = 0; k < 3; k++) {
			if (lens[k] > MTS_NAME_MAX || len - off < lens[k])
				return resv_restored(reg, *kept, -EINVAL);
			memcpy(names[k], d + off, lens[k]);
			names[k][lens[k]] = 0;
			off += lens[k];
		}
		rr.id[sizeof(rr.id) - 1] = 0;
		int err = resv_restore_one(reg, &rr, names[0], names[1],
		                           names[2], now, workers_back);
		if (err == -ENOMEM)
			return resv_restored(reg, *kept, err);
		if (err < 0)
			(*dropped)++;
		else
			(*kept)++;
	}
	return resv_restored(reg, *kept, off == len ? 0 : -EINVAL);
}
