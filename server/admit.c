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
 * outstanding reservations count now. A grant is a reservation with an id
 * ("r-" + 16 hex digits from getrandom: an id cannot be guessed to release
 * someone else's). A reservation ends by Release, by its TTL, or -- when
 * it names a task -- when the workers of that task have all exited.
 *
 * Reconciliation. Workers that register with MEMTALLY_TASK=T use memory the
 * reservations for T set aside; counting both would count that memory
 * twice. So each tick the measured bytes of T's live workers are set
 * against T's reservations, oldest first, and each reservation counts
 * only what is left of it:
 *
 *     effective = max(0, bytes - (what T's workers use, not yet set
 *                                 against older reservations of T))
 *
 * and the fleet sees max(reserved, used), not their sum. Once a worker of
 * T has registered, T's reservations are "taken over": their TTL no longer
 * applies (the TTL is for admissions whose task never starts) and they end
 * when T has no live worker left. A worker's group need not be the
 * reservation's: the fleet figure is right either way, a group's only when
 * they agree.
 *
 * Reservations (at most MTS_RESV_MAX; a scheduler holds one per task it
 * is starting, and may hold thousands) live in an unordered array, removed
 * by swapping in the last, with an index by id (a Release, and a new id's
 * uniqueness check, are one probe) and a min-heap by expiry of those whose
 * TTL applies (a tick looks only at those due). What they count is kept
 * up to date as they come and go (see resv_count), so that Admit, Release
 * and an expiry cost O(1) amortised plus O(reservations of their task),
 * not O(reservations): at 10,000 outstanding the old linear scans and
 * full recomputations made each request ~10x dearer. Tasks are in a small
 * hash table so the tick's pass over the workers is O(1) per worker.
 */
#include "server.h"

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>

#include "log.h"

static uint64_t sat_add(uint64_t a, uint64_t b)
{
	uint64_t r;
	return __builtin_add_overflow(a, b, &r) ? UINT64_MAX : r;
}

const char *mts_denial_name(enum mts_denial d)
{
	switch (d) {
	case MTS_DENY_FLEET_LIMIT:
		return "fleet_limit";
	case MTS_DENY_GROUP_LIMIT:
		return "group_limit";
	case MTS_DENY_INVALID:
		return "invalid";
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
	if (!reg->tasks)
		return NULL;
	struct mts_task *t = reg->tasks[h & reg->tasks_mask];
	while (t && (t->hash != h || strcmp(t->name, name) != 0))
		t = t->hnext;
	return t;
}

static int tasks_grow(struct mts_registry *reg)
{
	uint32_t n = reg->tasks ? (reg->tasks_mask + 1) * 2 : 64;
	struct mts_task **b = calloc(n, sizeof(*b));
	if (!b)
		return -ENOMEM;
	if (reg->tasks) {
		for (uint32_t i = 0; i <= reg->tasks_mask; i++) {
			struct mts_task *t = reg->tasks[i];
			while (t) {
				struct mts_task *next = t->hnext;
				t->hnext = b[t->hash & (n - 1)];
				b[t->hash & (n - 1)] = t;
				t = next;
			}
		}
		free(reg->tasks);
	}
	reg->tasks = b;
	reg->tasks_mask = n - 1;
	return 0;
}

static struct mts_task *task_get(struct mts_registry *reg, const char *name)
{
	uint64_t h = hash_str(name);
	struct mts_task *t = task_find(reg, name, h);
	if (t)
		return t;
	if ((!reg->tasks || reg->ntasks >= 2 * (reg->tasks_mask + 1)) &&
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
	t->hash = h;
	t->hnext = reg->tasks[h & reg->tasks_mask];
	reg->tasks[h & reg->tasks_mask] = t;
	reg->ntasks++;
	return t;
}

static void task_drop(struct mts_registry *reg, struct mts_task *t)
{
	struct mts_task **pp = &reg->tasks[t->hash & reg->tasks_mask];
	while (*pp && *pp != t)
		pp = &(*pp)->hnext;
	if (*pp)
		*pp = t->hnext;
	if (t->seen) {
		if (t->sprev)
			t->sprev->snext = t->snext;
		else
			reg->tasks_seen = t->snext;
		if (t->snext)
			t->snext->sprev = t->sprev;
	}
	reg->ntasks--;
	free(t->name);
	free(t);
}

/* ---- what reservations count ----------------------------------------------
 *
 * The sums are kept up to date as reservations come and go, not recomputed
 * over every reservation on each Admit and Release. Each reservation's
 * count is r->effective (its bytes when it has no task); the group's and
 * the fleet's exact sums (128 bits: the published figures saturate, the
 * sums must stay exact to be taken from) change by the difference when a
 * count changes. What a task's reservations count depends on the task's
 * measured bytes and their order only, so it is recomputed for that task
 * alone, when one of them comes or goes or the task's figure changes.
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
	reg->resv_sum = reg->resv_sum - r->effective + e;
	reg->totals.reserved = sat64(reg->resv_sum);
	r->effective = e;
}

/* Set what `t`'s workers use against its reservations, oldest first. */
static void task_recount(struct mts_registry *reg, struct mts_task *t)
{
	uint64_t left = t->measured;
	for (struct mts_resv *r = t->resv; r; r = r->tnext) {
		uint64_t used = left < r->bytes ? left : r->bytes;
		resv_count(reg, r, r->bytes - used);
		left -= used;
	}
	t->counted = t->measured;
}

void mts_resv_sums(struct mts_registry *reg)
{
	/* What each reservation of a task counts: its bytes less what the
	 * task's workers use, set against the oldest first. */
	if (reg->tasks) {
		for (uint32_t b = 0; b <= reg->tasks_mask; b++) {
			for (struct mts_task *t = reg->tasks[b]; t;
			     t = t->hnext) {
				uint64_t left = t->measured;
				for (struct mts_resv *r = t->resv; r;
				     r = r->tnext) {
					uint64_t used =
					    left < r->bytes ? left : r->bytes;
					r->effective = r->bytes - used;
					left -= used;
				}
				t->counted = t->measured;
			}
		}
	}
	for (uint32_t i = 0; i < reg->groups_used; i++)
		reg->groups[i].reserved_sum = 0;
	unsigned __int128 total = 0;
	for (uint32_t i = 0; i < reg->nresv; i++) {
		struct mts_resv *r = reg->resv[i];
		if (!r->task)
			r->effective = r->bytes;
		reg->groups[r->group].reserved_sum += r->effective;
		total += r->effective;
	}
	for (uint32_t i = 0; i < reg->groups_used; i++)
		reg->groups[i].reserved = sat64(reg->groups[i].reserved_sum);
	reg->resv_sum = total;
	reg->totals.reserved = sat64(total);
	reg->totals.reservations = reg->nresv;
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
	if (!id || !reg->resv_ids || strlen(id) != MTS_RESV_ID_LEN)
		return NULL;
	uint32_t m = reg->resv_ids_mask;
	for (uint32_t i = (uint32_t)hash_id(id) & m; reg->resv_ids[i];
	     i = (i + 1) & m)
		if (memcmp(reg->resv_ids[i]->id, id, MTS_RESV_ID_LEN) == 0)
			return reg->resv_ids[i];
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
	uint32_t n = reg->resv_ids ? reg->resv_ids_mask + 1 : 0;
	if ((uint64_t)(reg->nresv + 1) * 2 <= n)
		return 0;
	n = n ? n * 2 : 64;
	struct mts_resv **slots = calloc(n, sizeof(*slots));
	if (!slots)
		return -ENOMEM;
	for (uint32_t i = 0; i < reg->nresv; i++)
		ids_put(slots, n - 1, reg->resv[i]);
	free(reg->resv_ids);
	reg->resv_ids = slots;
	reg->resv_ids_mask = n - 1;
	return 0;
}

static void ids_remove(struct mts_registry *reg, const struct mts_resv *r)
{
	struct mts_resv **s = reg->resv_ids;
	uint32_t m = reg->resv_ids_mask;
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
 * A binary min-heap of the reservations whose TTL applies (not taken over),
 * so that a tick looks at the ones due and no others.
 */

static void heap_set(struct mts_registry *reg, uint32_t i, struct mts_resv *r)
{
	reg->resv_heap[i] = r;
	r->heap_index = i;
}

static void heap_fix(struct mts_registry *reg, uint32_t i)
{
	struct mts_resv **h = reg->resv_heap;
	struct mts_resv *r = h[i];
	while (i > 0 && h[(i - 1) / 2]->expires_ns > r->expires_ns) {
		heap_set(reg, i, h[(i - 1) / 2]);
		i = (i - 1) / 2;
	}
	for (;;) {
		uint32_t c = 2 * i + 1;
		if (c >= reg->resv_nheap)
			break;
		if (c + 1 < reg->resv_nheap &&
		    h[c + 1]->expires_ns < h[c]->expires_ns)
			c++;
		if (h[c]->expires_ns >= r->expires_ns)
			break;
		heap_set(reg, i, h[c]);
		i = c;
	}
	heap_set(reg, i, r);
}

/* Capacity is reg->resv_cap (mts_admit grows both). */
static void heap_add(struct mts_registry *reg, struct mts_resv *r)
{
	heap_set(reg, reg->resv_nheap++, r);
	heap_fix(reg, r->heap_index);
}

static void heap_remove(struct mts_registry *reg, struct mts_resv *r)
{
	uint32_t i = r->heap_index;
	if (i == UINT32_MAX)
		return;
	r->heap_index = UINT32_MAX;
	struct mts_resv *last = reg->resv_heap[--reg->resv_nheap];
	if (last != r) {
		heap_set(reg, i, last);
		heap_fix(reg, i);
	}
}

/* ---- reservations -------------------------------------------------------- */

static void task_seen(struct mts_registry *reg, struct mts_task *t)
{
	t->seen = true;
	t->sprev = NULL;
	t->snext = reg->tasks_seen;
	if (t->snext)
		t->snext->sprev = t;
	reg->tasks_seen = t;
	for (struct mts_resv *r = t->resv; r; r = r->tnext) {
		r->taken_over = true;
		heap_remove(reg, r);
		mts_log(MTS_LOG_INFO, "reservation taken over by its task",
		        "reservation=%s bytes=%llu", r->id,
		        (unsigned long long)r->bytes);
	}
}

void mts_resv_task_registered(struct mts_registry *reg, const char *task)
{
	struct mts_task *t = task_find(reg, task, hash_str(task));
	if (t && !t->seen)
		task_seen(reg, t);
}

/* Reservation ids are a secret of sorts: over TCP (no credentials) any
 * peer may release a reservation made over TCP, given its id, so an id
 * must not be guessable from others. They come from getrandom() -- the
 * kernel's CSPRNG, as they always did -- but 256 bytes (32 ids) per
 * call instead of one call per Admit. The pool is per thread (the server
 * has one; unit tests may run registries in several) and each 8 bytes
 * are wiped once used. memtallyd does not fork, so no two processes ever
 * hold the same pool. */
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
	/* Only if some of the task's usage was set against `r` can the
	 * newer reservations of the task count less without it. */
	bool shifts = r->task && r->effective < r->bytes;
	resv_count(reg, r, 0);
	heap_remove(reg, r);
	ids_remove(reg, r);
	if (r->task) {
		struct mts_task *t = r->task;
		struct mts_resv **pp = &t->resv;
		while (*pp && *pp != r)
			pp = &(*pp)->tnext;
		if (*pp)
			*pp = r->tnext;
		if (!t->resv)
			task_drop(reg, t);
		else if (recount && shifts)
			task_recount(reg, t);
	}
	reg->groups[r->group].reservations--;
	mts_group_gc(reg, r->group);
	uint32_t i = r->index;
	struct mts_resv *last = reg->resv[--reg->nresv];
	reg->resv[i] = last;
	last->index = i;
	reg->totals.reservations = reg->nresv;
	free(r);
}

void mts_resv_free_all(struct mts_registry *reg)
{
	for (uint32_t i = 0; i < reg->nresv; i++)
		free(reg->resv[i]);
	free(reg->resv);
	free(reg->resv_ids);
	free(reg->resv_heap);
	reg->resv = NULL;
	reg->resv_ids = NULL;
	reg->resv_heap = NULL;
	reg->nresv = reg->resv_cap = reg->resv_nheap = 0;
	reg->resv_ids_mask = 0;
	reg->resv_sum = 0;
	if (reg->tasks) {
		for (uint32_t i = 0; i <= reg->tasks_mask; i++) {
			struct mts_task *t = reg->tasks[i];
			while (t) {
				struct mts_task *next = t->hnext;
				free(t->name);
				free(t);
				t = next;
			}
		}
		free(reg->tasks);
	}
	reg->tasks = NULL;
	reg->tasks_mask = 0;
	reg->ntasks = 0;
	reg->tasks_seen = NULL;
}

/* Every worker of `t` has exited: its reservations end. */
static void task_end(struct mts_registry *reg, struct mts_task *t)
{
	for (;;) {
		struct mts_resv *r = t->resv;
		bool last = !r->tnext;
		char q[MTS_LOGQ_MAX];
		mts_log(MTS_LOG_INFO,
		        "reservation ended: its task's workers exited",
		        "reservation=%s task=%s bytes=%llu", r->id,
		        mts_logq(q, sizeof(q), t->name),
		        (unsigned long long)r->bytes);
		reg->stats.fulfilled++;
		resv_remove(reg, r, false);
		if (last)
			break; /* `t` went with it */
	}
}

void mts_resv_tick(struct mts_registry *reg, uint64_t now_ns)
{
	/* Only tasks a worker has registered with have figures: a task no
	 * worker has named yet has live = measured = 0, so the tick costs
	 * O(workers + their tasks), not O(tasks). */
	if (reg->ntasks > 0) {
		for (struct mts_task *t = reg->tasks_seen; t; t = t->snext) {
			t->live = 0;
			t->measured = 0;
		}
		for (uint32_t i = 0; i < reg->ndense; i++) {
			const struct mts_proc *p = reg->by_slot[reg->dense[i]];
			if (!p->task[0])
				continue;
			struct mts_task *t =
			    task_find(reg, p->task, hash_str(p->task));
			if (!t)
				continue;
			if (!t->seen)
				task_seen(reg, t);
			t->live++;
			t->measured = sat_add(
			    t->measured, mts_measured(reg, p->bytes, p->rss));
		}
		struct mts_task *next;
		for (struct mts_task *t = reg->tasks_seen; t; t = next) {
			next = t->snext;
			if (t->live == 0)
				task_end(reg, t);
			else if (t->measured != t->counted)
				task_recount(reg, t);
		}
	}

	/* Taken-over reservations left the heap: its top is the next due. */
	while (reg->resv_nheap > 0 && now_ns >= reg->resv_heap[0]->expires_ns) {
		struct mts_resv *r = reg->resv_heap[0];
		char q[MTS_LOGQ_MAX];
		mts_log(MTS_LOG_INFO, "reservation expired",
		        "reservation=%s bytes=%llu ttl_s=%u group=%s", r->id,
		        (unsigned long long)r->bytes, r->ttl_s,
		        mts_logq(q, sizeof(q), reg->groups[r->group].name));
		reg->stats.expirations++;
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
	         mts_format_size(a, sizeof(a), measured),
	         mts_format_size(b, sizeof(b), reserved),
	         mts_format_size(c, sizeof(c), requested),
	         mts_format_size(d, sizeof(d), limit),
	         m == MTS_MEASURE_ACCOUNTED ? "" : " (measure: ",
	         m == MTS_MEASURE_ACCOUNTED ? ""
	         : m == MTS_MEASURE_RSS     ? "rss)"
	                                    : "max of accounted and rss)");
}

int mts_admit(struct mts_registry *reg, const struct mts_peer *peer,
              const struct mts_admit_req *req, struct mts_admit_out *out)
{
	const struct mts_policy *pol = &reg->policy;
	const char *group =
	    req->group && req->group[0] ? req->group : "default";
	const char *task = req->task ? req->task : "";
	char qg[MTS_LOGQ_MAX], qt[MTS_LOGQ_MAX], qs[MTS_LOGQ_MAX];
	memset(out, 0, sizeof(*out));
	out->requested = req->bytes;

	if (req->bytes == 0 || !mts_name_ok(group) || !mts_name_ok(task)) {
		reg->stats.denials[MTS_DENY_INVALID]++;
		out->reason = MTS_DENY_INVALID;
		mts_log(MTS_LOG_INFO, "admission refused: invalid request",
		        "peer_pid=%u bytes=%llu", peer->pid,
		        (unsigned long long)req->bytes);
		return -EINVAL;
	}
	if (reg->nresv >= MTS_RESV_MAX) {
		mts_log(MTS_LOG_WARN,
		        "admission refused: too many reservations",
		        "peer_pid=%u outstanding=%u", peer->pid, reg->nresv);
		return -ENOSPC;
	}

	/* The fleet, then the group: the first limit that would be passed
	 * decides. */
	const struct mts_totals *t = &reg->totals;
	uint64_t fm = mts_measured(reg, t->bytes, t->rss);
	const struct mts_group *g = mts_find_group(reg, group);
	snprintf(out->scope, sizeof(out->scope), "fleet");
	out->measured = fm;
	out->reserved = t->reserved;
	out->limit = t->limit;
	if (t->limit &&
	    sat_add(sat_add(fm, t->reserved), req->bytes) > t->limit) {
		out->reason = MTS_DENY_FLEET_LIMIT;
		why(out, "fleet limit", pol->measure, fm, t->reserved,
		    req->bytes, t->limit);
	} else if (g && g->limit) {
		uint64_t gm = mts_measured(reg, g->bytes, g->rss);
		if (sat_add(sat_add(gm, g->reserved), req->bytes) > g->limit) {
			char what[MTS_NAME_MAX + 16];
			out->reason = MTS_DENY_GROUP_LIMIT;
			snprintf(out->scope, sizeof(out->scope), "group:%s",
			         group);
			snprintf(what, sizeof(what), "group limit (%s)", group);
			out->measured = gm;
			out->reserved = g->reserved;
			out->limit = g->limit;
			why(out, what, pol->measure, gm, g->reserved,
			    req->bytes, g->limit);
		} else {
			out->admitted = true;
		}
	} else {
		out->admitted = true;
	}

	if (!out->admitted) {
		reg->stats.denials[out->reason]++;
		mts_log(MTS_LOG_INFO, "admission denied",
		        "reason=%s scope=%s measured=%llu reserved=%llu "
		        "requested=%llu limit=%llu measure=%s group=%s task=%s "
		        "peer_pid=%u uid=%u",
		        mts_denial_name(out->reason),
		        mts_logq(qs, sizeof(qs), out->scope),
		        (unsigned long long)out->measured,
		        (unsigned long long)out->reserved,
		        (unsigned long long)req->bytes,
		        (unsigned long long)out->limit,
		        mts_measure_name(pol->measure),
		        mts_logq(qg, sizeof(qg), group),
		        mts_logq(qt, sizeof(qt), task), peer->pid, peer->uid);
		return 0;
	}

	/* Grant: a reservation. Make room first: nothing below may fail
	 * once the reservation is linked. */
	if (reg->nresv == reg->resv_cap) {
		uint32_t cap = reg->resv_cap ? reg->resv_cap * 2 : 16;
		struct mts_resv **a = realloc(reg->resv, cap * sizeof(*a));
		if (!a)
			return -ENOMEM;
		reg->resv = a;
		a = realloc(reg->resv_heap, cap * sizeof(*a));
		if (!a)
			return -ENOMEM;
		reg->resv_heap = a;
		reg->resv_cap = cap;
	}
	if (ids_reserve(reg) < 0)
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
	uint32_t gi;
	if (mts_group_ensure(reg, group, &gi) < 0) {
		free(r);
		return -ENOMEM;
	}
	if (task[0]) {
		r->task = task_get(reg, task);
		if (!r->task) {
			mts_group_gc(reg, gi);
			free(r);
			return -ENOMEM;
		}
		/* Oldest first: append. */
		struct mts_resv **pp = &r->task->resv;
		while (*pp)
			pp = &(*pp)->tnext;
		*pp = r;
		r->taken_over = r->task->seen;
	}
	uint32_t ttl = req->ttl_s ? req->ttl_s : pol->default_ttl_s;
	if (ttl > pol->max_ttl_s)
		ttl = pol->max_ttl_s;
	r->has_owner = peer->has_cred && !peer->tcp;
	r->uid = peer->uid;
	r->group = gi;
	reg->groups[gi].reservations++;
	r->bytes = req->bytes;
	r->effective = 0; /* counts nothing until counted below */
	r->ttl_s = ttl;
	r->created_ns = mts_now_realtime();
	r->expires_ns = mts_now_monotonic() + (uint64_t)ttl * 1000000000u;
	r->index = reg->nresv;
	reg->resv[reg->nresv++] = r;
	reg->totals.reservations = reg->nresv;
	ids_put(reg->resv_ids, reg->resv_ids_mask, r);
	if (!r->taken_over)
		heap_add(reg, r);
	if (r->task)
		task_recount(reg, r->task);
	else
		resv_count(reg, r, r->bytes);

	reg->stats.admissions++;
	out->ttl_s = ttl;
	memcpy(out->id, r->id, sizeof(out->id));
	mts_log(MTS_LOG_INFO, "admission granted",
	        "reservation=%s bytes=%llu group=%s task=%s ttl_s=%u "
	        "fleet_measured=%llu fleet_reserved=%llu fleet_limit=%llu "
	        "measure=%s peer_pid=%u uid=%u",
	        r->id, (unsigned long long)r->bytes,
	        mts_logq(qg, sizeof(qg), group), mts_logq(qt, sizeof(qt), task),
	        ttl, (unsigned long long)fm,
	        (unsigned long long)reg->totals.reserved,
	        (unsigned long long)reg->totals.limit,
	        mts_measure_name(pol->measure), peer->pid, peer->uid);
	/* Reserved bytes count: the fleet or the group may now be high. */
	mts_limits_eval(reg, false);
	mts_publish(reg);
	return 0;
}

/* ---- Release ------------------------------------------------------------- */

int mts_release(struct mts_registry *reg, const struct mts_peer *peer,
                const char *id, const char *token, uint64_t *bytes)
{
	char q[MTS_LOGQ_MAX];
	struct mts_resv *r = mts_resv_find(reg, id);
	if (!r) {
		mts_log(MTS_LOG_INFO, "release of an unknown reservation",
		        "reservation=%s peer_pid=%u uid=%u",
		        mts_logq(q, sizeof(q), id ? id : ""), peer->pid,
		        peer->uid);
		return -ENOENT;
	}
	enum mts_auth a = mts_authorise_release(reg, peer, token, r);
	if (a == MTS_AUTH_NONE) {
		reg->stats.auth_denials++;
		mts_log(MTS_LOG_WARN, "release refused: not authorised",
		        "reservation=%s owner_uid=%u peer_pid=%u uid=%u tcp=%d",
		        r->id, r->uid, peer->pid, peer->uid, peer->tcp);
		return -EPERM;
	}
	*bytes = r->bytes;
	mts_log(MTS_LOG_INFO, "reservation released",
	        "reservation=%s bytes=%llu by=%s peer_pid=%u uid=%u", r->id,
	        (unsigned long long)r->bytes, mts_auth_name(a), peer->pid,
	        peer->uid);
	reg->stats.releases++;
	resv_remove(reg, r, true);
	mts_limits_eval(reg, false);
	mts_publish(reg);
	return 0;
}
