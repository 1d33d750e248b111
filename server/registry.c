/*
 * registry.c - registered workers, their slots, groups and totals.
 *
 * The registry is the server's own record of who holds each slot: pid,
 * start time, uid, image id, generation and a pidfd. It is authoritative;
 * the identity fields in the shared slot tables are a published copy and
 * never read back. Only counters (lanes, overflow, threads) are read from
 * shared memory, at addresses computed from the registry's private copy of
 * the layout, and judged on each slot's total: a slot whose total is
 * absurd is flagged CORRUPT, reported, and left out of every total.
 *
 * Shared memory is split by uid (mtshm.h): a process's slot lives in the
 * table of its uid, which only that uid's workers can write. slot_at[]
 * holds each used slot's address in its table.
 *
 * Invariants:
 *  - Until stop: by_slot[s] != NULL  <=>  slot_at[s] != NULL  <=>  s is
 *    in dense[0..ndense)  <=>  s is not on the free stack  <=>  the
 *    restart record holds s. A proc is in the pid hash exactly while it
 *    holds a slot, and counts one in its table's `procs`. (At stop the
 *    registry lets go of every proc but leaves the restart record, for
 *    the next server.)
 *  - A proc's memory lives until its uv_poll close callback; its slot is
 *    released before that, at exit, so the slot can be reused at once.
 *  - totals, and each group's bytes/error_bytes, equal the sums over
 *    registered procs of their latest-tick figures (bytes: the vouched
 *    part, bytes - unvouched, see vouch.c): the tick recomputes
 *    them and an exit subtracts the leaving proc at once (so its bytes are
 *    gone from the published fleet total in the loop iteration that saw
 *    the exit, not at the next tick).
 *  - The tick walks dense[] and the group entries in use, never all
 *    slot_count slots: its cost follows the registered processes.
 *
 *  - A group entry lives while it has a process, a limit, a watermark of
 *    its own or a reservation (mts_group_gc() is the only place that frees
 *    one); its index is stable while it lives.
 *
 * The registry knows nothing of the modules that act on its figures:
 * the tick, vouching, admission, limits (core.c wires them). It tells
 * them through reg->watch when a process joins or leaves and when a uid
 * gets a table, and asks them who may join which group.
 */
#include "mts_registry.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/pidfd.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "mts_defs.h"
#include "mts_fault.h"
#include "mts_log.h"
#include "mts_policy.h"
#include "mts_procfs.h"
#include "mts_rate.h"
#include "mts_state.h"
#include "mts_uidcount.h"
#include "mtcommon.h"
#include "mtshm.h"

/* Linux 6.5+: a pidfd for the peer of a Unix socket, taken at connect(), so
 * it names the very process that connected even if its pid was reused
 * since. Older kernels say ENOPROTOOPT and we fall back to pidfd_open(). */
#ifndef SO_PEERPIDFD
#define SO_PEERPIDFD 77
#endif

static uint64_t sat_sub(uint64_t a, uint64_t b)
{
	return a > b ? a - b : 0;
}

/* ---- the modules above, through reg->watch ----------------------------- */

static bool peer_is_admin(const struct mts_registry *reg,
                          const struct mts_peer *peer)
{
	return reg->watch->is_admin && reg->watch->is_admin(reg, peer);
}

/* `p` registered, was adopted or began a new image. */
static void tell_joined(struct mts_registry *reg, struct mts_proc *p)
{
	if (reg->watch->joined)
		reg->watch->joined(reg, p);
}

/* ---- tables ------------------------------------------------------------ */

static uint32_t pid_bucket(const struct mts_registry *reg, uint32_t pid)
{
	/* Fibonacci hashing: consecutive pids spread over the table. */
	return (uint32_t)((pid * UINT64_C(0x9E3779B97F4A7C15)) >> 32) &
	       reg->hash_mask;
}

struct mts_proc *mts_find_pid(const struct mts_registry *reg, uint32_t pid)
{
	struct mts_proc *p = reg->hash[pid_bucket(reg, pid)];
	while (p && p->pid != pid)
		p = p->hnext;
	return p;
}

static void hash_remove(struct mts_registry *reg, struct mts_proc *p)
{
	struct mts_proc **pp = &reg->hash[pid_bucket(reg, p->pid)];
	while (*pp && *pp != p)
		pp = &(*pp)->hnext;
	if (*pp)
		*pp = p->hnext;
	p->hnext = NULL;
}

/*
 * Groups are few and looked up only at registration, admission and
 * SetLimit, so a linear scan over the entries in use is enough. An entry is
 * freed when nothing keeps it (mts_group_gc) and reused by the next new
 * group, so groups_used never exceeds the largest number of groups live at
 * once.
 */
struct mts_group *mts_find_group(const struct mts_registry *reg,
                                 const char *name)
{
	for (uint32_t i = 0; i < reg->groups_used; i++) {
		struct mts_group *g = &reg->groups[i];
		if (g->name && strcmp(g->name, name) == 0)
			return g;
	}
	return NULL;
}

int mts_group_ensure(struct mts_registry *reg, const char *name,
                     uint32_t *index)
{
	struct mts_group *g = mts_find_group(reg, name);
	if (!g) {
		uint32_t i = 0;
		while (i < reg->groups_used && reg->groups[i].name)
			i++;
		if (i == reg->groups_cap) {
			uint32_t cap =
			    reg->groups_cap ? reg->groups_cap * 2 : 16;
			struct mts_group *ng =
			    realloc(reg->groups, cap * sizeof(*ng));
			if (!ng)
				return -ENOMEM;
			memset(ng + reg->groups_cap, 0,
			       (cap - reg->groups_cap) * sizeof(*ng));
			reg->groups = ng;
			reg->groups_cap = cap;
		}
		g = &reg->groups[i];
		memset(g, 0, sizeof(*g));
		g->creator = MTS_UID_TCP;
		g->name = strdup(name);
		if (!g->name)
			return -ENOMEM;
		if (i == reg->groups_used)
			reg->groups_used++;
		/* A [group NAME] section of the policy applies at once. */
		const struct mts_group_policy *gp =
		    mts_policy_group(&reg->policy, name);
		if (gp) {
			g->limit = gp->limit;
			g->high_bp = gp->high_bp;
		}
	}
	*index = (uint32_t)(g - reg->groups);
	return 0;
}

void mts_group_gc(struct mts_registry *reg, uint32_t index)
{
	struct mts_group *g = &reg->groups[index];
	if (!g->name || g->processes > 0 || g->reservations > 0 ||
	    g->limit != 0 || g->high_bp != 0)
		return;
	if (reg->watch->group_gone)
		reg->watch->group_gone(reg, g);
	if (g->creator != MTS_UID_TCP)
		mts_uid_count_sub(&reg->groups_by_uid, g->creator);
	free(g->name);
	memset(g, 0, sizeof(*g));
	while (reg->groups_used > 0 && !reg->groups[reg->groups_used - 1].name)
		reg->groups_used--;
}

int mts_group_ensure_peer(struct mts_registry *reg, const struct mts_peer *peer,
                          const char *name, uint32_t *index)
{
	if (reg->watch->may_join && !reg->watch->may_join(reg, peer, name))
		return -EACCES;
	struct mts_group *g = mts_find_group(reg, name);
	if (g) {
		*index = (uint32_t)(g - reg->groups);
		return 0;
	}
	/* Names a uid brings into existence are what it costs the server
	 * (entries, /metrics series): counted per uid. Configured groups
	 * and "default" are the operator's; admins are trusted. */
	/* A loopback TCP peer sock_diag named is that uid, as on the Unix
	 * socket (has_cred); an unidentified one is counted nowhere, and
	 * shows the token for every request. */
	bool counted = peer->has_cred && strcmp(name, "default") != 0 &&
	               !mts_policy_group(&reg->policy, name) &&
	               !peer_is_admin(reg, peer);
	if (counted && reg->policy.groups_per_uid &&
	    mts_uid_count_get(&reg->groups_by_uid, peer->uid) >=
	        reg->policy.groups_per_uid)
		return -EDQUOT;
	int err = mts_group_ensure(reg, name, index);
	if (err < 0)
		return err;
	if (counted) {
		if (mts_uid_count_add(&reg->groups_by_uid, peer->uid) < 0) {
			mts_group_gc(reg, *index);
			return -ENOMEM;
		}
		reg->groups[*index].creator = peer->uid;
	}
	return 0;
}

uint32_t mts_slots_per_uid(const struct mts_registry *reg)
{
	uint32_t cap = reg->policy.slots_per_uid;
	if (cap == 0) {
		cap = reg->slot_count / MTS_DEFAULT_PER_UID_DIV;
		if (cap == 0)
			cap = 1;
	}
	return cap;
}

/* Index of group `name`, creating it; takes one process reference. */
static int group_ref(struct mts_registry *reg, const char *name,
                     uint32_t *index)
{
	int err = mts_group_ensure(reg, name, index);
	if (err < 0)
		return err;
	reg->groups[*index].processes++;
	return 0;
}

/* Drop one process reference; the last one may free the entry. */
static void group_unref(struct mts_registry *reg, uint32_t index)
{
	reg->groups[index].processes--;
	mts_group_gc(reg, index);
}

/* A test switch: the fallback of kernels without SO_PEERPIDFD,
 * exercised on kernels that have it. */
static void read_test_switches(struct mts_registry *reg)
{
	const char *no_ppfd = getenv("MEMTALLY_TEST_NO_PEERPIDFD");
	reg->no_peerpidfd = no_ppfd && strcmp(no_ppfd, "1") == 0;
	if (reg->no_peerpidfd)
		mts_log(MTS_LOG_WARN,
		        "test switch MEMTALLY_TEST_NO_PEERPIDFD: SO_PEERPIDFD "
		        "not used",
		        NULL);
}

int mts_registry_init(struct mts_registry *reg, uv_loop_t *loop,
                      struct mtshm_map *map, const char *label,
                      struct mts_state *state,
                      const struct mts_registry_watch *watch)
{
	static const struct mts_registry_watch none;
	memset(reg, 0, sizeof(*reg));
	reg->watch = watch ? watch : &none;
	reg->hdr_ro_fd = -1;
	read_test_switches(reg);
	reg->loop = loop;
	reg->map = map;
	reg->label = label;
	reg->state = state;
	/* The layout is read once, here, and only the copy is used. */
	int err = mtshm_layout_read(map->base, map->size, &reg->layout);
	if (err)
		return -EINVAL;
	reg->slot_count = reg->layout.slot_count;
	reg->threshold = reg->layout.threshold;
	reg->server_uid = (uint32_t)geteuid();
	reg->hdr_ro_fd = mtshm_reopen_ro(map->fd);
	if (reg->hdr_ro_fd < 0) {
		err = reg->hdr_ro_fd;
		reg->hdr_ro_fd = -1;
		return err;
	}
	mts_policy_defaults(&reg->policy);

	uint32_t buckets = 16;
	while (buckets < reg->slot_count * 2u)
		buckets <<= 1;
	reg->hash_mask = buckets - 1;
	reg->hash = calloc(buckets, sizeof(*reg->hash));
	reg->by_slot = calloc(reg->slot_count, sizeof(*reg->by_slot));
	reg->free_slots = calloc(reg->slot_count, sizeof(*reg->free_slots));
	reg->dense = calloc(reg->slot_count, sizeof(*reg->dense));
	reg->slot_at = calloc(reg->slot_count, sizeof(*reg->slot_at));
	reg->slot_gens = calloc(reg->slot_count, sizeof(*reg->slot_gens));
	if (!reg->hash || !reg->by_slot || !reg->free_slots || !reg->dense ||
	    !reg->slot_at || !reg->slot_gens) {
		mts_registry_free(reg);
		return -ENOMEM;
	}
	/* A stack popping slot 0 first keeps live slots low and dense. */
	for (uint32_t i = 0; i < reg->slot_count; i++)
		reg->free_slots[i] = reg->slot_count - 1 - i;
	reg->nfree = reg->slot_count;
	reg->totals.heartbeat_ns = mts_now_monotonic();
	mts_publish(reg);
	return 0;
}

/* A zeroed proc on its own MTS_PROC_ALIGN boundary (see struct mts_proc:
 * the tick's fields then sit in its first two lines). */
static struct mts_proc *proc_alloc(void)
{
	size_t size = (sizeof(struct mts_proc) + MTS_PROC_ALIGN - 1) &
	              ~(size_t)(MTS_PROC_ALIGN - 1);
	struct mts_proc *p = aligned_alloc(MTS_PROC_ALIGN, size);
	if (p)
		memset(p, 0, size);
	return p;
}
_Static_assert(offsetof(struct mts_proc, rate) >= MTS_PROC_ALIGN,
               "the tick's fields of a proc fit its first line");
_Static_assert(offsetof(struct mts_proc, has_free) < MTS_PROC_ALIGN,
               "has_free is read at every tick: in the first line");

static void proc_free(struct mts_proc *p)
{
	if (!p)
		return;
	free(p->task);
	free(p);
}

static void on_proc_closed(uv_handle_t *h)
{
	struct mts_proc *p = h->data;
	if (p->pidfd >= 0)
		close(p->pidfd);
	proc_free(p);
}

void mts_registry_close(struct mts_registry *reg)
{
	/* Leave the restart record (and the workers' slots) as they are: a
	 * later server may adopt the workers that are still alive. */
	reg->closed = true;
	for (uint32_t i = 0; i < reg->ndense; i++) {
		struct mts_proc *p = reg->by_slot[reg->dense[i]];
		reg->by_slot[p->slot] = NULL;
		reg->slot_at[p->slot] = NULL;
		hash_remove(reg, p);
		group_unref(reg, p->group);
		p->table->procs--;
		uv_close((uv_handle_t *)&p->poll, on_proc_closed);
	}
	reg->ndense = 0;
}

void mts_registry_free(struct mts_registry *reg)
{
	mts_policy_free(&reg->policy);
	for (uint32_t i = 0; i < reg->groups_used; i++)
		free(reg->groups[i].name);
	free(reg->groups);
	mts_uid_counts_free(&reg->groups_by_uid);
	mts_uid_counts_free(&reg->watch_uids);
	free(reg->hash);
	free(reg->by_slot);
	free(reg->free_slots);
	free(reg->held);
	free(reg->dense);
	free(reg->slot_at);
	free(reg->slot_gens);
	for (uint32_t i = 0; i < reg->ntables; i++) {
		mts_fault_unwatch(reg->tables[i]->map.base);
		mtshm_close(&reg->tables[i]->map);
		free(reg->tables[i]);
	}
	free(reg->tables);
	if (reg->hdr_ro_fd >= 0)
		close(reg->hdr_ro_fd);
	memset(reg, 0, sizeof(*reg));
	reg->hdr_ro_fd = -1;
	read_test_switches(reg);
}

/* ---- publishing -------------------------------------------------------- */

void mts_publish(struct mts_registry *reg)
{
	/* mtshm_fleet_publish() is the seqlock writer (seq odd while the
	 * fields change); we are its only caller. */
	const struct mts_totals *t = &reg->totals;
	struct mtshm_fleet f = {
	    .bytes = t->bytes,
	    .peak = t->peak,
	    .limit = t->limit,
	    .reserved = t->reserved,
	    .error_bytes = t->error_bytes,
	    .heartbeat_ns = t->heartbeat_ns,
	    .ticks = t->ticks,
	    .state = t->state,
	    .processes = t->processes,
	    .unregistered = t->unregistered,
	    .mapped = t->mapped,
	    .allocator_free = t->allocator_free,
	};
	mtshm_fleet_publish(reg->map->hdr, &f);
}

/* ---- slots ------------------------------------------------------------- */

/* ---- slot tables ------------------------------------------------------- */

void mts_table_label(const struct mts_registry *reg, uint32_t uid, char *buf,
                     size_t cap)
{
	snprintf(buf, cap, "%s-slots:%016llx:%u", reg->label,
	         (unsigned long long)reg->instance, uid);
}

struct mts_table *mts_table_find(const struct mts_registry *reg, uint32_t uid)
{
	/* Few uids register on one machine: a scan is enough. */
	for (uint32_t i = 0; i < reg->ntables; i++)
		if (reg->tables[i]->uid == uid)
			return reg->tables[i];
	return NULL;
}

static int table_insert(struct mts_registry *reg, struct mts_table *t)
{
	if (reg->ntables == reg->tables_cap) {
		uint32_t cap = reg->tables_cap ? reg->tables_cap * 2 : 4;
		struct mts_table **nt = realloc(reg->tables, cap * sizeof(*nt));
		if (!nt)
			return -ENOMEM;
		reg->tables = nt;
		reg->tables_cap = cap;
	}
	reg->tables[reg->ntables++] = t;
	return 0;
}

int mts_table_adopt(struct mts_registry *reg, uint32_t uid,
                    struct mtshm_map *map)
{
	/* One table, one uid: a memfd already a table of ours (another
	 * uid's, reached some other way) is never a second one's. */
	for (uint32_t i = 0; i < reg->ntables; i++)
		if (reg->tables[i]->map.ino == map->ino &&
		    reg->tables[i]->map.dev == map->dev)
			return -EEXIST;
	struct mts_table *t = calloc(1, sizeof(*t));
	if (!t || table_insert(reg, t) < 0) {
		free(t);
		return -ENOMEM;
	}
	t->uid = uid;
	t->map = *map;
	/* A page of it that faults is answered, not fatal (fault.c). */
	if (mts_fault_watch(map->base, map->size) < 0)
		mts_log_uid(uid, MTS_LOG_WARN,
		            "slot table not guarded against faults: too many "
		            "tables",
		            "uid=%u", uid);
	if (reg->watch->table_added)
		reg->watch->table_added(reg, t);
	return 0;
}

/* The table of `uid`, created (sealed, zeroed) if it has none. */
static int table_get(struct mts_registry *reg, uint32_t uid,
                     struct mts_table **out)
{
	struct mts_table *t = mts_table_find(reg, uid);
	if (t) {
		t->idle_since_ns = 0; /* in use again (maybe it was idle) */
		*out = t;
		return 0;
	}
	char label[96];
	mts_table_label(reg, uid, label, sizeof(label));
	struct mtshm_map map;
	int err = mtshm_table_create(label, &reg->layout, &map);
	if (err < 0)
		return err;
	if ((err = mts_table_adopt(reg, uid, &map)) < 0) {
		mtshm_close(&map);
		return err;
	}
	mts_log_uid(uid, MTS_LOG_DEBUG, "slot table created",
	            "uid=%u bytes=%llu", uid, (unsigned long long)map.size);
	*out = reg->tables[reg->ntables - 1];
	return 0;
}

/* A slot of adopted table `tb` the restart did not adopt, whose identity
 * names a live process of the table's uid: held for it (struct
 * mts_held_slot). The table's uid can write those fields, so they are
 * believed only for a process of that uid (effective, as registration
 * checks) started at the time they say, and a uid's holds count against
 * its slot cap, so they take no more slots than its workers could. */
static void hold_if_named(struct mts_registry *reg, struct mts_table *tb,
                          uint32_t i)
{
	struct mtshm_slot_id *s = mtshm_slot(&reg->layout, tb->map.base, i);
	uint32_t pid = mtshm_load_acquire32(&s->pid);
	uint32_t uid = mtshm_load_relaxed32(&s->uid);
	uint64_t start = mtshm_load_relaxed64(&s->start_time);
	uint32_t cap = mts_slots_per_uid(reg);
	/* Slot indices are the fleet's, the tables each uid's: another
	 * uid's table may name a process of its own at the same index. Each
	 * such hold is kept (the index is free again when the last ends:
	 * held_end), so no uid's claim can keep another's worker from being
	 * told to register again, and there are never more than the slots. */
	if (!pid || pid > INT32_MAX || uid != tb->uid ||
	    reg->nheld >= reg->slot_count ||
	    (cap != MTS_CAP_NONE && tb->procs + tb->held >= cap))
		return;
	for (uint32_t k = 0; k < reg->nheld; k++)
		if (reg->held[k].pid == pid)
			return; /* one slot a process */
	/* Adopted at another slot: this one is a slot it had before a
	 * re-registration, which still names it. Held, the index was lost
	 * until the worker's exit, and counted against its uid's cap. */
	const struct mts_proc *adopted = mts_find_pid(reg, pid);
	if (adopted && adopted->start_time == start)
		return;
	uint64_t st;
	uint32_t real, eff;
	if (mts_read_starttime((pid_t)pid, &st) < 0 || st != start ||
	    mts_read_uids((pid_t)pid, &real, &eff) < 0 || eff != uid)
		return;
	if (!reg->held &&
	    !(reg->held = calloc(reg->slot_count, sizeof(*reg->held))))
		return;
	reg->held[reg->nheld++] = (struct mts_held_slot){
	    .slot = i, .pid = pid, .uid = uid, .start_time = start};
	tb->held++;
	/* It would never register again on its own: the header it reads
	 * goes on ticking. */
	mtshm_store_relaxed32(&s->flags, mtshm_load_relaxed32(&s->flags) |
	                                     MTSHM_SLOT_REATTACH);
	mts_log_uid(uid, MTS_LOG_WARN,
	            "slot held for a live worker not adopted",
	            "pid=%u uid=%u slot=%u", pid, uid, i);
}

static bool slot_is_held(const struct mts_registry *reg, uint32_t slot)
{
	for (uint32_t k = 0; k < reg->nheld; k++)
		if (reg->held[k].slot == slot)
			return true;
	return false;
}

/* Hold `k` ends: its slot is free again, once no other table's hold of
 * the same index remains (pushed twice, one index would be handed to two
 * workers, and the stack would outgrow its slot_count entries). */
static void held_end(struct mts_registry *reg, uint32_t k)
{
	struct mts_held_slot h = reg->held[k];
	reg->held[k] = reg->held[--reg->nheld];
	struct mts_table *t = mts_table_find(reg, h.uid);
	if (t && t->held)
		t->held--;
	if (!reg->by_slot[h.slot] && !slot_is_held(reg, h.slot))
		reg->free_slots[reg->nfree++] = h.slot;
	mts_log_uid(h.uid, MTS_LOG_DEBUG, "slot hold ended",
	            "pid=%u uid=%u slot=%u", h.pid, h.uid, h.slot);
}

/* The held process registered again (now its client carries the slot's
 * total into its new one, on reading the answer), or a sweep: holds
 * whose process is gone, or that registered a second ago or more, end. */
static void held_registered(struct mts_registry *reg, uint32_t pid,
                            uint32_t uid, uint64_t start_time)
{
	for (uint32_t k = 0; k < reg->nheld; k++)
		if (reg->held[k].pid == pid && reg->held[k].uid == uid &&
		    reg->held[k].start_time == start_time &&
		    !reg->held[k].done_ns)
			reg->held[k].done_ns = mts_now_monotonic();
}

static void held_sweep(struct mts_registry *reg, uint64_t now_ns)
{
	if (!reg->nheld || now_ns - reg->held_check_ns < 1000000000u)
		return;
	reg->held_check_ns = now_ns;
	for (uint32_t k = reg->nheld; k-- > 0;) {
		const struct mts_held_slot *h = &reg->held[k];
		uint64_t st;
		bool gone = mts_read_starttime((pid_t)h->pid, &st) < 0 ||
		            st != h->start_time;
		if (gone || (h->done_ns && now_ns - h->done_ns >= 1000000000u))
			held_end(reg, k);
	}
}

static void table_free(struct mts_registry *reg, uint32_t i)
{
	struct mts_table *t = reg->tables[i];
	/* Its slots' memory goes with it: no hold of it means anything. */
	for (uint32_t k = reg->nheld; k-- > 0;)
		if (reg->held[k].uid == t->uid)
			held_end(reg, k);
	reg->tables[i] = reg->tables[--reg->ntables];
	mts_log_uid(t->uid, MTS_LOG_DEBUG, "slot table released", "uid=%u",
	            t->uid);
	mts_fault_unwatch(t->map.base);
	mtshm_close(&t->map);
	free(t);
}

void mts_table_gc(struct mts_registry *reg, struct mts_table *t)
{
	if (t->procs > 0 || reg->closed || t->idle_since_ns)
		return;
	t->idle_since_ns = mts_now_monotonic();
	uint32_t idle = 0, oldest = UINT32_MAX;
	for (uint32_t i = 0; i < reg->ntables; i++) {
		const struct mts_table *o = reg->tables[i];
		if (!o->idle_since_ns || o->procs > 0)
			continue;
		idle++;
		if (oldest == UINT32_MAX ||
		    o->idle_since_ns < reg->tables[oldest]->idle_since_ns)
			oldest = i;
	}
	if (idle > MTS_TABLES_IDLE_MAX)
		table_free(reg, oldest);
}

void mts_tables_sweep(struct mts_registry *reg, uint64_t now_ns)
{
	held_sweep(reg, now_ns);
	for (uint32_t i = reg->ntables; i-- > 0;) {
		const struct mts_table *t = reg->tables[i];
		/* Never one with a worker in it, whatever its mark says. */
		if (t->idle_since_ns && !t->procs &&
		    now_ns >= t->idle_since_ns &&
		    now_ns - t->idle_since_ns >=
		        (uint64_t)MTS_TABLE_IDLE_MS * 1000000u)
			table_free(reg, i);
	}
}

static uint64_t page_bytes(void)
{
	long ps = sysconf(_SC_PAGESIZE);
	return ps > 0 ? (uint64_t)ps : 4096u;
}

/* One part of a table a spare stands in for (mts_fault_scan). */
static void lost_add(void *arg, void *addr, size_t bytes)
{
	struct mts_table *t = arg;
	uintptr_t base = (uintptr_t)t->map.base;
	uint64_t page = page_bytes();
	for (size_t o = 0; o < bytes; o += page) {
		if (t->nlost == MTS_TABLE_LOST_MAX) {
			t->lost_all = true;
			return;
		}
		t->lost[t->nlost++] = (uintptr_t)addr + o - base;
	}
}

/* Does the page at table offset `off` hold part of slot `slot`? */
static bool page_in_slot(const struct mts_registry *reg, uint64_t off,
                         uint32_t slot)
{
	uint64_t lo = (uint64_t)slot * reg->layout.slot_stride;
	return off < lo + reg->layout.slot_stride && off + page_bytes() > lo;
}

bool mts_table_slot_lost(const struct mts_registry *reg,
                         const struct mts_table *t, uint32_t slot)
{
	if (!t || (!t->nlost && !t->lost_all))
		return false;
	if (t->lost_all)
		return true;
	for (uint32_t i = 0; i < t->nlost; i++)
		if (page_in_slot(reg, t->lost[i], slot))
			return true;
	return false;
}

/* Map back page `i` of t's list if the machine has its memory now (a
 * punched page is allocated again); drop it from the list. */
static int lost_mend(struct mts_table *t, uint32_t i)
{
	uint64_t off = t->lost[i];
	/* Within the table: it is sealed against growing, and may end
	 * inside its last page. */
	uint64_t len = page_bytes();
	if (len > t->map.size - off)
		len = t->map.size - off;
	if (fallocate(t->map.fd, 0, (off_t)off, (off_t)len) < 0 &&
	    errno != EOPNOTSUPP)
		return -errno;
	int err = mts_fault_restore((char *)t->map.base + off, t->map.fd, off);
	if (err < 0)
		return err;
	t->lost[i] = t->lost[--t->nlost];
	return 0;
}

static void tables_mend(struct mts_registry *reg, uint64_t now)
{
	if (now - reg->lost_try_ns < UINT64_C(1000000000))
		return;
	reg->lost_try_ns = now;
	bool any = false;
	for (uint32_t k = 0; k < reg->ntables; k++) {
		struct mts_table *t = reg->tables[k];
		for (uint32_t i = 0; i < t->nlost;)
			if (lost_mend(t, i) < 0)
				i++;
		if (t->lost_all)
			reg->faults_seen = ~mts_fault_count(); /* scan again */
		any |= t->nlost || t->lost_all;
	}
	reg->lost_any = any;
}

void mts_tables_faults(struct mts_registry *reg)
{
	uint64_t n = mts_fault_count();
	if (reg->lost_any)
		tables_mend(reg, mts_now_monotonic());
	if (n == reg->faults_seen)
		return;
	reg->faults_seen = n;
	for (uint32_t k = 0; k < reg->ntables; k++) {
		struct mts_table *t = reg->tables[k];
		uint64_t was[MTS_TABLE_LOST_MAX];
		uint32_t had = t->nlost;
		bool all = t->lost_all;
		memcpy(was, t->lost, sizeof(was));
		t->nlost = 0;
		t->lost_all = false;
		if (mts_fault_scan(t->map.base, t->map.size, lost_add, t) < 0) {
			/* The maps could not be read (it needs no memory of
			 * ours, only a descriptor): as it was, and again at
			 * the next call. */
			memcpy(t->lost, was, sizeof(was));
			t->nlost = had;
			t->lost_all = all;
			reg->faults_seen = ~n;
			continue;
		}
		t->lost_new = t->lost_new || t->nlost || t->lost_all;
		reg->lost_any |= t->nlost || t->lost_all;
		if (t->nlost > had || (t->lost_all && !all))
			mts_log_uid(t->uid, MTS_LOG_WARN,
			            "slot table page unreadable (a hole in it, "
			            "and no memory to fill it)",
			            "uid=%u pages=%u%s", t->uid, t->nlost,
			            t->lost_all ? "+" : "");
	}
}

/* Slot `slot` of `t` is handed out, or its process starts a new image:
 * its pages allocated (a shared memfd's page is charged at its first
 * touch, and under strict overcommit at the commit limit that touch is a
 * SIGBUS: in memtallyd, at slot_init's stores or a tick's loads), and
 * those a spare stood in for mapped back. 0 or -errno. */
static int slot_ready(struct mts_registry *reg, struct mts_table *t,
                      uint32_t slot)
{
	uint64_t lo = (uint64_t)slot * reg->layout.slot_stride;
	if (fallocate(t->map.fd, 0, (off_t)lo, (off_t)reg->layout.slot_stride) <
	        0 &&
	    errno != EOPNOTSUPP)
		return -errno;
	mts_tables_faults(reg); /* one since the latest tick */
	uint64_t page = page_bytes();
	uint64_t hi = lo + reg->layout.slot_stride;
	if (t->lost_all) {
		/* Which of its pages is not known: each, whatever it is. */
		for (uint64_t off = lo & ~(page - 1); off < hi; off += page) {
			int err = mts_fault_restore((char *)t->map.base + off,
			                            t->map.fd, off);
			if (err < 0)
				return err;
		}
		return 0;
	}
	for (uint32_t i = 0; i < t->nlost;) {
		if (!page_in_slot(reg, t->lost[i], slot)) {
			i++;
			continue;
		}
		int err = lost_mend(t, i); /* drops entry i */
		if (err < 0)
			return err;
	}
	return 0;
}

/* Put slot `slot` of `p` in `t`: its address, the table's count. */
static void slot_place(struct mts_registry *reg, struct mts_proc *p,
                       struct mts_table *t)
{
	p->table = t;
	t->procs++;
	t->idle_since_ns = 0; /* in use (an adoption may find it marked idle) */
	reg->slot_at[p->slot] = mtshm_slot(&reg->layout, t->map.base, p->slot);
}

/* Zero the client's counters, set identity, take a new generation, and
 * store pid last with release order so a client that sees its pid sees
 * the rest. The generation is the registry's own (slot_gens), never read
 * back from the table. */
static uint64_t slot_init(struct mts_registry *reg, struct mts_proc *p)
{
	struct mtshm_slot_id *s = reg->slot_at[p->slot];
	mtshm_store_release32(&s->pid, 0);
	for (uint32_t k = 0; k < reg->layout.lane_count; k++) {
		struct mtshm_lane *l = mtshm_lane(s, k);
		mtshm_store_relaxed32(&l->owner, 0);
		mtshm_store_relaxeds64(&l->bytes, 0);
		mtshm_store_relaxed64(&l->flushes, 0);
		mtshm_store_relaxeds64(&l->mapped, 0);
		mtshm_store_relaxed64(&l->free_seq, 0);
		mtshm_store_relaxeds64(&l->free_bytes, 0);
		mtshm_store_relaxeds64(&l->free_heap, 0);
	}
	mtshm_store_relaxeds64(&s->overflow, 0);
	mtshm_store_relaxed32(&s->threads, 0);
	mtshm_store_relaxed32(&s->lanes_used, 0);
	mtshm_store_relaxed32(&s->flags, 0);
	mtshm_store_relaxed64(&s->peak, 0);
	mtshm_store_relaxed32(&s->uid, p->uid);
	mtshm_store_relaxed64(&s->start_time, p->start_time);
	mtshm_store_relaxed64(&s->limit, p->limit);
	mtshm_store_relaxed32(&s->group, p->group);
	uint64_t gen = ++reg->slot_gens[p->slot];
	p->slot_gen = gen;
	mtshm_store_relaxed64(&s->generation, gen);
	mtshm_store_release32(&s->pid, p->pid);
	mts_registry_record(reg, p);
	return gen;
}

void mts_registry_record(const struct mts_registry *reg,
                         const struct mts_proc *p)
{
	struct mts_state_rec r;
	memset(&r, 0, sizeof(r));
	r.pid = p->pid;
	r.uid = p->uid;
	r.start_time = p->start_time;
	r.image_id = p->image_id;
	r.registered_ns = p->registered_ns;
	r.slot_gen = p->slot_gen;
	snprintf(r.group, sizeof(r.group), "%s", reg->groups[p->group].name);
	snprintf(r.task, sizeof(r.task), "%s", p->task);
	r.limit_set = p->limit_set;
	r.image_stale = p->image_stale;
	r.exec_mark = p->exec_mark;
	memcpy(r.comm, p->comm, sizeof(r.comm));
	r.comm[sizeof(r.comm) - 1] = '\0';
	r.tainted = p->table && p->table->tainted;
	r.taint_uid = r.tainted ? p->table->tainted_uid : 0;
	mts_state_put(reg->state, p->slot, &r);
}

/* What the Registered answer passes: the header and `p`'s table. */
static void result_fds(const struct mts_registry *reg, const struct mts_proc *p,
                       struct mts_reg_result *res)
{
	res->fds[0] = reg->hdr_ro_fd;
	res->fds[1] = p->table->map.fd;
}

/* Take `p`'s latest figures out of the totals (it leaves, or is reset). */
static void totals_drop(struct mts_registry *reg, struct mts_proc *p)
{
	struct mts_group *g = &reg->groups[p->group];
	/* What the tick added for it: an untrusted process's claim no lower
	 * than its kernel figure (mts_vouch_counted). Its claim alone left
	 * the rest in the totals until the next tick, a dead process's
	 * memory that another uid's Admit was judged against. (Spelled out:
	 * vouch.c depends on the registry, not the other way round.) */
	uint64_t vouched = sat_sub(p->bytes, p->unvouched);
	if (p->untrusted && p->vouch.kernel > vouched)
		vouched = p->vouch.kernel;
	g->bytes = sat_sub(g->bytes, vouched);
	g->unvouched = sat_sub(g->unvouched, p->unvouched);
	g->mapped = sat_sub(g->mapped, p->mapped);
	g->allocator_free = sat_sub(g->allocator_free, p->allocator_free);
	g->error_bytes = sat_sub(g->error_bytes, p->error_bytes);
	g->rss = sat_sub(g->rss, p->rss);
	reg->totals.bytes = sat_sub(reg->totals.bytes, vouched);
	reg->totals.unvouched = sat_sub(reg->totals.unvouched, p->unvouched);
	reg->totals.mapped = sat_sub(reg->totals.mapped, p->mapped);
	reg->totals.allocator_free =
	    sat_sub(reg->totals.allocator_free, p->allocator_free);
	reg->totals.error_bytes =
	    sat_sub(reg->totals.error_bytes, p->error_bytes);
	reg->totals.rss = sat_sub(reg->totals.rss, p->rss);
	p->bytes = 0;
	p->unvouched = 0;
	p->mapped = 0;
	p->allocator_free = 0;
	p->error_bytes = 0;
	p->rss = 0;
}

/*
 * Remove `p` from the registry: drop its bytes from the totals, free its
 * slot (pid = 0, release), close its poll handle (the close callback
 * closes the pidfd and frees p) and publish the new totals at once.
 */
static void proc_release(struct mts_registry *reg, struct mts_proc *p,
                         const char *why)
{
	char qg[MTS_LOGQ_MAX], qc[MTS_LOGQ_MAX];
	mts_log_uid(
	    p->uid, MTS_LOG_INFO, why,
	    "pid=%u slot=%u group=%s comm=%s bytes=%llu peak=%llu "
	    "lived_ms=%llu",
	    p->pid, p->slot,
	    mts_logq(qg, sizeof(qg), reg->groups[p->group].name),
	    mts_logq(qc, sizeof(qc), p->comm), (unsigned long long)p->bytes,
	    (unsigned long long)p->peak,
	    (unsigned long long)(sat_sub(mts_now_realtime(), p->registered_ns) /
	                         1000000u));

	if (reg->watch->leaving)
		reg->watch->leaving(reg, p);
	totals_drop(reg, p);
	group_unref(reg, p->group);

	struct mtshm_slot_id *s = reg->slot_at[p->slot];
	/* The over-limit flag belongs to this process, not the slot. */
	mtshm_store_relaxed32(&s->flags, 0);
	mtshm_store_release32(&s->pid, 0);
	reg->slot_at[p->slot] = NULL;
	p->table->procs--;
	mts_table_gc(reg, p->table);
	p->table = NULL;
	reg->by_slot[p->slot] = NULL;
	reg->free_slots[reg->nfree++] = p->slot;
	/* Keep dense[] dense: move its last entry into p's place. */
	uint32_t last = reg->dense[--reg->ndense];
	if (last != p->slot) {
		reg->dense[p->dense] = last;
		reg->by_slot[last]->dense = p->dense;
	}
	hash_remove(reg, p);
	reg->stats.reclaims++;

	reg->totals.processes = reg->ndense;
	mts_publish(reg);
	uv_close((uv_handle_t *)&p->poll, on_proc_closed);
}

static void on_pidfd(uv_poll_t *h, int status, int events)
{
	struct mts_proc *p = h->data;
	/* Readable means exited. An error on a pidfd is not expected; treat
	 * it the same way rather than keep a slot we can no longer watch. */
	proc_release(p->reg, p,
	             status < 0 ? "worker dropped (pidfd error)"
	                        : "worker exited");
}

/* Open a pidfd for the peer: SO_PEERPIDFD when the kernel has it (exact:
 * the very process that connected, *exact = true). A kernel without it
 * (before Linux 6.5) says ENOPROTOOPT, and we fall back to
 * pidfd_open(SO_PEERCRED pid), which names whoever has that pid now: the
 * caller must vouch for it (peer_vouch). Any other failure means the
 * peer is gone: its pid may be someone else's already, so no fallback.
 * A peer without a socket (fd -1: built by hand in unit tests) is taken
 * at its word. */
static int peer_pidfd(const struct mts_registry *reg,
                      const struct mts_peer *peer, bool *exact)
{
	*exact = false;
	if (peer->fd >= 0 && !reg->no_peerpidfd) {
		int pfd = -1;
		socklen_t len = sizeof(pfd);
		if (getsockopt(peer->fd, SOL_SOCKET, SO_PEERPIDFD, &pfd,
		               &len) == 0 &&
		    pfd >= 0) {
			*exact = true;
			return pfd;
		}
		if (errno != ENOPROTOOPT)
			return -ESRCH;
	}
	int pfd = pidfd_open((pid_t)peer->pid, 0);
	return pfd < 0 ? -errno : pfd;
}

/*
 * The fallback's pid is only a number: the process that connected may
 * have exited (after handing its socket to another) and the pid been
 * given to a process of another user, whose claims would then be
 * attributed to it. So that process is accepted only if two things hold.
 * It had started by the time the connection was accepted: start times
 * are clock ticks of CLOCK_BOOTTIME since boot, so one started in a later
 * tick cannot have connected, and one in the same tick is taken, since a
 * worker connects within its first tick. And its real uid is the peer's
 * SO_PEERCRED uid, which a process of another user never has, whenever
 * it started. The caller reads these through a pidfd that is still alive
 * afterwards, so they are the pidfd's process's. 0, -ESTALE (refused,
 * logged with `what`, the action taken), or -errno.
 */
static int peer_vouch(const struct mts_peer *peer, uint64_t start_time,
                      const char *what)
{
	if (peer->fd < 0)
		return 0;
	long hz = sysconf(_SC_CLK_TCK);
	if (hz <= 0 || hz > 1000000000L)
		return -EINVAL;
	uint64_t accept_ticks =
	    peer->accept_boot_ns / (1000000000u / (uint64_t)hz);
	uint32_t ruid;
	int err = mts_read_real_uid((pid_t)peer->pid, &ruid);
	if (err < 0)
		return err == -ENOENT ? -ESRCH : err;
	if (start_time <= accept_ticks && ruid == peer->uid)
		return 0;
	mts_log_uid(peer->uid, MTS_LOG_WARN,
	            "the peer's pid now names another process (no "
	            "SO_PEERPIDFD to tell)",
	            "%s pid=%u uid=%u process_uid=%u start_ticks=%llu "
	            "accept_ticks=%llu",
	            what, peer->pid, peer->uid, ruid,
	            (unsigned long long)start_time,
	            (unsigned long long)accept_ticks);
	return -ESTALE;
}

/* True if the process behind `pidfd` has exited. */
static bool pidfd_exited(int pidfd)
{
	struct pollfd pfd = {.fd = pidfd, .events = POLLIN};
	return poll(&pfd, 1, 0) != 0;
}

/* A process's comm is its own to set (prctl PR_SET_NAME): any bytes. It
 * goes out in answers as a protobuf string, which strict decoders (Go,
 * Java, Python's upb) refuse whole when it is not UTF-8, and to
 * terminals: each byte that is not part of a valid, harmless UTF-8
 * sequence is kept as '?'. */
/* Where an exec would move its arguments (rss.c, exec_seen): read at each
 * registration, of the image that registers. */
static void exec_mark_read(struct mts_proc *p)
{
	uint64_t st = 0, mark = 0;
	p->image_stale = false;
	p->exec_mark = mts_read_exec_mark((pid_t)p->pid, &st, &mark) == 0 &&
	                       st == p->start_time
	                   ? mark
	                   : 0;
}

void mts_comm_copy(char *dst, size_t cap, const char *src)
{
	size_t o = 0;
	for (size_t i = 0; src[i] && o + 1 < cap;) {
		uint32_t c;
		size_t k = mt_utf8_seq((const unsigned char *)src + i, &c);
		if (k == 0 || mt_cp_hostile(c) || o + k >= cap) {
			dst[o++] = '?';
			i += k ? k : 1;
			continue;
		}
		memcpy(dst + o, src + i, k);
		o += k;
		i += k;
	}
	dst[o] = 0;
}

void mts_table_taint(struct mts_registry *reg, struct mts_table *t,
                     uint32_t uid)
{
	if (t->tainted)
		return;
	t->tainted = true;
	t->taint_new = true;
	t->tainted_uid = uid;
	if (!reg->state)
		return;
	/* In each of its processes' restart entries, so that a server
	 * started after this one taints the table again, whether the leaver
	 * is still there to be seen or not. */
	for (uint32_t i = 0; i < reg->ndense; i++) {
		struct mts_proc *q = reg->by_slot[reg->dense[i]];
		if (q->table != t)
			continue;
		struct mts_state_rec r;
		if (mts_state_get(reg->state, q->slot, &r) < 0 ||
		    r.pid != q->pid) {
			mts_registry_record(reg, q);
			continue;
		}
		r.tainted = 1;
		r.taint_uid = uid;
		mts_state_put(reg->state, q->slot, &r);
	}
}

/* The exec case: the same process, a new program image. Reset its slot to
 * the new image's figures in place; the pidfd and poll stay. */
static int proc_reset(struct mts_registry *reg, struct mts_proc *p,
                      const char *group, const char *task, uint64_t image_id,
                      uint32_t uid, const char *comm)
{
	char *ntask = strdup(task);
	uint32_t ngroup;
	struct mts_table *nt = p->table;
	if (!ntask)
		return -ENOMEM;
	if (uid != p->uid) {
		/* A set-uid program: its slot moves to its new uid's table,
		 * out of reach of the uid it had. */
		int err = table_get(reg, uid, &nt);
		if (err < 0) {
			free(ntask);
			return err;
		}
	}
	if (group_ref(reg, group, &ngroup) < 0) {
		free(ntask);
		return -ENOMEM;
	}
	if (nt != p->table) {
		struct mts_table *old = p->table;
		/* Registered again as an untrusted uid, having been a trusted
		 * one: an exec drops its window on the old table, but a
		 * process that only says it exec'd keeps it. */
		if (old->vouch.trusted && !nt->vouch.trusted)
			mts_table_taint(reg, old, uid);
		mtshm_store_release32(&reg->slot_at[p->slot]->pid, 0);
		old->procs--;
		mts_table_gc(reg, old);
		slot_place(reg, p, nt);
	}
	if (reg->watch->leaving) /* the old image's over-limit ends */
		reg->watch->leaving(reg, p);
	totals_drop(reg, p);
	group_unref(reg, p->group);
	free(p->task);
	p->task = ntask;
	p->group = ngroup;
	p->uid = p->task_uid = uid;
	p->task_asker = 0;
	p->untrusted = false; /* until joined() says (vouch.c) */
	p->uid_left = false;  /* registered as what it is now */
	p->adopted = false;
	p->unvouched = 0;
	/* The new image's kernel figure comes from its first read, which
	 * an early sweep makes (no read yet). Until then the old figure
	 * stands: an image id is the client's word, and a process that
	 * registered again without an exec would otherwise wipe what the
	 * kernel saw it hold, again and again. An exec'd image is counted
	 * at its old one's figure for that one read at most. The cost of
	 * its reads, which paces them, stays too. */
	p->vouch.kernel_ns = 0;
	p->vouch.claim_at_read = 0;
	p->image_id = image_id;
	p->peak = 0;
	p->threads = 0;
	p->mapped = 0;
	p->mapped_seen = 0;
	p->mapped_young = false;
	p->mapped_capped = false;
	p->map.ever = false;
	p->allocator_free = 0;
	p->has_free = false;
	p->free_held = (struct mtshm_free_held){0};
	p->rss_known = false; /* the old image's read says nothing of it */
	p->corrupt = false;
	p->state = MTSHM_STATE_OK;      /* slot_init clears the flag */
	p->told_state = MTSHM_STATE_OK; /* `leaving` told its end */
	p->last_signal_ns = 0;
	mts_rate_reset(&p->rate); /* a new program: its own growth */
	p->limit = p->limit_set ? p->limit_set : reg->policy.process_limit;
	p->registered_ns = mts_now_realtime();
	mts_comm_copy(p->comm, sizeof(p->comm), comm);
	exec_mark_read(p);
	/* Its RSS is the new image's from the next sweep on. */
	return 0;
}

/* What a new process starts with: from a Register, or from the restart
 * record when a restarted server adopts a live worker. */
struct proc_init {
	uint32_t pid, uid, slot;
	int pidfd; /* owned by the process once proc_insert() has taken it */
	uint64_t start_time, image_id, registered_ns;
	const char *group, *task;
	const char *comm; /* from the /proc/PID/stat its start time came from */
};

/*
 * The one create-and-insert path of a process: allocate it, name it,
 * watch its pidfd and link it into its slot of `table` and the dense,
 * by-slot and pid indexes. 0 on success. On failure nothing is linked;
 * *pidfd_taken says whether the pidfd went with it (a libuv handle was
 * opened on it: its close callback closes the pidfd) or is still the
 * caller's.
 */
static int proc_insert(struct mts_registry *reg, const struct proc_init *in,
                       struct mts_table *table, struct mts_proc **out,
                       bool *pidfd_taken)
{
	*pidfd_taken = false;
	struct mts_proc *p = proc_alloc();
	if (!p)
		return -ENOMEM;
	int err = -ENOMEM;
	p->task = strdup(in->task);
	if (!p->task)
		goto fail_free_proc;
	err = group_ref(reg, in->group, &p->group);
	if (err < 0)
		goto fail_free_proc;
	p->reg = reg;
	p->pidfd = in->pidfd;
	p->pid = in->pid;
	p->uid = p->task_uid = in->uid;
	p->task_asker = 0;
	p->slot = in->slot;
	p->start_time = in->start_time;
	p->image_id = in->image_id;
	p->registered_ns = in->registered_ns;
	p->limit = reg->policy.process_limit;
	for (uint32_t k = 0; k < reg->nkept_limits; k++) {
		struct mts_kept_limit *kl = &reg->kept_limits[k];
		if (kl->pid == in->pid && kl->start_time == in->start_time) {
			p->limit = p->limit_set = kl->limit;
			*kl = reg->kept_limits[--reg->nkept_limits];
			break;
		}
	}
	mts_comm_copy(p->comm, sizeof(p->comm), in->comm);
	exec_mark_read(p);
	err = uv_poll_init(reg->loop, &p->poll, in->pidfd);
	if (err < 0)
		goto fail_unref_group;
	p->poll.data = p;
	err = uv_poll_start(&p->poll, UV_READABLE, on_pidfd);
	if (err < 0) {
		/* The handle is initialised: its close callback now owns p
		 * and the pidfd. */
		group_unref(reg, p->group);
		uv_close((uv_handle_t *)&p->poll, on_proc_closed);
		*pidfd_taken = true;
		return err;
	}
	slot_place(reg, p, table);
	p->dense = reg->ndense;
	reg->dense[reg->ndense++] = p->slot;
	reg->by_slot[p->slot] = p;
	uint32_t b = pid_bucket(reg, p->pid);
	p->hnext = reg->hash[b];
	reg->hash[b] = p;
	reg->totals.processes = reg->ndense;
	*out = p;
	return 0;

fail_unref_group:
	group_unref(reg, p->group);
fail_free_proc:
	proc_free(p);
	return err;
}

/* A worker refused for want of a free slot: its client retries, so each
 * worker is counted (and warned about) once, not each attempt. */
static void note_refused(struct mts_registry *reg, uint32_t pid,
                         uint64_t start_time, uint32_t uid, bool uid_cap)
{
	bool again = false;
	for (uint32_t i = 0; i < MTS_REFUSED_REMEMBERED; i++)
		if (reg->refused.slot[i].pid == pid &&
		    reg->refused.slot[i].start_time == start_time)
			again = true;
	if (!again) {
		uint32_t k = reg->refused.slot_next++ % MTS_REFUSED_REMEMBERED;
		reg->refused.slot[k].pid = pid;
		reg->refused.slot[k].start_time = start_time;
		reg->totals.unregistered++;
	}
	mts_log_uid(uid, again ? MTS_LOG_DEBUG : MTS_LOG_WARN,
	            uid_cap ? "uid at max_slots_per_uid, worker runs "
	                      "unregistered"
	                    : "no free slot, worker runs unregistered",
	            "pid=%u uid=%u slots=%u unregistered=%u", pid, uid,
	            reg->slot_count, reg->totals.unregistered);
}

/* What the Registered answer carries for `p`; `gen` is its slot's
 * generation. */
static void result_fill(const struct mts_registry *reg,
                        const struct mts_proc *p, uint64_t gen,
                        struct mts_reg_result *res)
{
	res->slot = p->slot;
	res->slot_generation = gen;
	res->group = reg->groups[p->group].name;
	result_fds(reg, p, res);
}

/* A registered process registers again. Same image and uid: nothing
 * changes (it may be picking up a restarted server's header). Otherwise
 * it exec'd: its slot starts afresh under the new group and task. */
static int register_known(struct mts_registry *reg, struct mts_proc *p,
                          const struct mts_peer *peer, const char *group,
                          const char *task, uint64_t image_id, const char *comm,
                          struct mts_reg_result *res)
{
	if (p->image_id == image_id && p->uid == peer->uid) {
		result_fill(reg, p, p->slot_gen, res);
		mts_log_uid(p->uid, MTS_LOG_DEBUG, "worker registered again",
		            "pid=%u slot=%u", p->pid, p->slot);
		return 0;
	}
	int err = proc_reset(reg, p, group, task, image_id, peer->uid, comm);
	if (err < 0)
		return err;
	/* Best effort: at the commit limit its page stays a spare, its
	 * client cannot attach to it and runs as without memtally until a
	 * later try (tables_mend) maps it back. */
	slot_ready(reg, p->table, p->slot);
	result_fill(reg, p, slot_init(reg, p), res);
	tell_joined(reg, p);
	char qg[MTS_LOGQ_MAX], qc[MTS_LOGQ_MAX];
	mts_log_uid(p->uid, MTS_LOG_INFO, "worker exec'd, slot reset",
	            "pid=%u slot=%u group=%s comm=%s", p->pid, p->slot,
	            mts_logq(qg, sizeof(qg), res->group),
	            mts_logq(qc, sizeof(qc), p->comm));
	/* Its old bytes left the totals: publish now, as at exit. */
	mts_publish(reg);
	return 0;
}

/* A process not registered yet: a pidfd, a free slot in its uid's table,
 * a new proc. */
static int register_new(struct mts_registry *reg, const struct mts_peer *peer,
                        int pidfd, uint64_t start_time, const char *group,
                        const char *task, uint64_t image_id, const char *comm,
                        struct mts_reg_result *res)
{
	int err;
	if (reg->nfree == 0) {
		note_refused(reg, peer->pid, start_time, peer->uid, false);
		err = -ENOSPC;
		goto fail_close_pidfd;
	}
	/* One uid cannot take every slot: past its cap a worker gets the
	 * answer of a full segment. A worker whose own old slot is held
	 * for it is not counted twice: refused, its hold (and with it its
	 * count) would never end. */
	uint32_t cap = mts_slots_per_uid(reg);
	const struct mts_table *own = mts_table_find(reg, peer->uid);
	uint32_t mine = 0;
	for (uint32_t k = 0; own && k < reg->nheld; k++)
		if (reg->held[k].pid == peer->pid &&
		    reg->held[k].uid == peer->uid &&
		    reg->held[k].start_time == start_time &&
		    !reg->held[k].done_ns)
			mine = 1;
	if (cap != MTS_CAP_NONE && own &&
	    own->procs + own->held - mine >= cap && !peer_is_admin(reg, peer)) {
		note_refused(reg, peer->pid, start_time, peer->uid, true);
		err = -ENOSPC;
		goto fail_close_pidfd;
	}
	struct mts_table *table;
	if ((err = table_get(reg, peer->uid, &table)) < 0) {
		mts_log_uid(peer->uid, MTS_LOG_WARN,
		            "cannot create a slot table", "uid=%u err=%s",
		            peer->uid, strerror(-err));
		goto fail_close_pidfd;
	}
	/* The slot's pages, allocated now, and its memory memtallyd's
	 * own again where a spare stood in for it. Refused at the commit
	 * limit instead of faulting later: the worker runs unregistered, and
	 * asks again later. */
	uint32_t slot = reg->free_slots[reg->nfree - 1];
	if ((err = slot_ready(reg, table, slot)) < 0) {
		mts_log_uid(peer->uid, MTS_LOG_WARN,
		            "cannot allocate a slot's memory; the worker runs "
		            "unregistered",
		            "uid=%u slot=%u err=%s", peer->uid, slot,
		            strerror(-err));
		mts_table_gc(reg, table);
		goto fail_close_pidfd;
	}
	struct proc_init in = {
	    .pid = peer->pid,
	    .uid = peer->uid,
	    .slot = slot,
	    .pidfd = pidfd,
	    .start_time = start_time,
	    .image_id = image_id,
	    .registered_ns = mts_now_realtime(),
	    .group = group,
	    .task = task,
	    .comm = comm,
	};
	struct mts_proc *p;
	bool taken;
	err = proc_insert(reg, &in, table, &p, &taken);
	if (err < 0) {
		mts_table_gc(reg, table);
		if (taken)
			return err;
		goto fail_close_pidfd;
	}
	reg->nfree--;
	reg->stats.registrations++;
	result_fill(reg, p, slot_init(reg, p), res);
	held_registered(reg, p->pid, p->uid, p->start_time);
	char qg[MTS_LOGQ_MAX], qc[MTS_LOGQ_MAX], qt[MTS_LOGQ_MAX];
	mts_log_uid(p->uid, MTS_LOG_INFO, "worker registered",
	            "pid=%u uid=%u slot=%u group=%s task=%s comm=%s", p->pid,
	            p->uid, p->slot, mts_logq(qg, sizeof(qg), res->group),
	            mts_logq(qt, sizeof(qt), p->task),
	            mts_logq(qc, sizeof(qc), p->comm));
	tell_joined(reg, p);
	return 0;

fail_close_pidfd:
	close(pidfd);
	return err;
}

/* A worker named a group it may not join (or one too many new groups of
 * its uid): said once per (uid, group) among the last few, and within the
 * uid's log budget. */
static void note_group_refused(struct mts_registry *reg,
                               const struct mts_peer *peer, const char *group,
                               int why)
{
	uint64_t h = 1469598103934665603u;
	for (const char *c = group; *c; c++)
		h = (h ^ (unsigned char)*c) * 1099511628211u;
	for (uint32_t i = 0; i < MTS_REFUSED_REMEMBERED; i++)
		if (reg->refused.group[i].uid == peer->uid &&
		    reg->refused.group[i].hash == h)
			return;
	uint32_t k = reg->refused.group_next++ % MTS_REFUSED_REMEMBERED;
	reg->refused.group[k].uid = peer->uid;
	reg->refused.group[k].hash = h;
	char qg[MTS_LOGQ_MAX];
	mts_log_uid(
	    peer->uid, MTS_LOG_WARN,
	    why == -EACCES
	        ? "group not allowed for this uid, worker put in default"
	        : "uid at max_groups_per_uid, worker put in default",
	    "pid=%u uid=%u group=%s", peer->pid, peer->uid,
	    mts_logq(qg, sizeof(qg), group));
}

/* The group a worker of `peer` naming `group` goes in: that one, or
 * "default" when it may not join it or its uid may not create another
 * group. The entry exists on success (a failed registration leaves it to
 * mts_group_gc). */
static int group_for_peer(struct mts_registry *reg, const struct mts_peer *peer,
                          const char **group)
{
	uint32_t gi;
	int err = mts_group_ensure_peer(reg, peer, *group, &gi);
	if (err == -EACCES || err == -EDQUOT) {
		note_group_refused(reg, peer, *group, err);
		*group = "default";
		err = mts_group_ensure(reg, *group, &gi);
	}
	return err;
}

static int register_peer(struct mts_registry *reg, const struct mts_peer *peer,
                         const char *group, const char *task, uint64_t image_id,
                         bool if_known, struct mts_reg_result *res)
{
	if (!group || !group[0])
		group = "default";
	if (!task)
		task = "";
	if (!mt_name_ok(group) || !mt_name_ok(task))
		return -EINVAL;
	if (!peer->has_cred || peer->pid == 0)
		return -EPERM;
	/* Most such asks come from a process nobody registered: answered
	 * from the table alone. */
	if (if_known && !mts_find_pid(reg, peer->pid))
		return -ENOENT;

	/* The pidfd first, then what /proc says of the pid: if the pidfd's
	 * process is still alive after that, it is what /proc described. */
	bool exact;
	int pidfd = peer_pidfd(reg, peer, &exact);
	if (pidfd < 0)
		return pidfd;
	/* Its start time and name from one read of /proc/PID/stat. */
	uint64_t start_time;
	char comm[sizeof(((struct mts_proc *)0)->comm)];
	int err =
	    mts_read_stat((pid_t)peer->pid, &start_time, comm, sizeof(comm));
	if (err == 0 && !exact)
		err =
		    peer_vouch(peer, start_time, "action=registration_refused");
	/* Its user now, not at connect: a process that changed user since
	 * (it forked a child to keep the socket, then exec'd a set-uid
	 * program) is not the peer's to register in its uid's table, where
	 * the peer's claims would have it signalled or evicted; adoption
	 * drops such a worker too (adopt.c). A connection of our own making
	 * (fd < 0: tests, adoption) has no such peer. */
	if (err == 0 && peer->fd >= 0) {
		uint32_t ruid, euid;
		err = mts_read_uids((pid_t)peer->pid, &ruid, &euid);
		if (err == 0 && euid != peer->uid) {
			mts_log_uid(peer->uid, MTS_LOG_WARN,
			            "the peer's process changed user since it "
			            "connected",
			            "action=registration_refused pid=%u uid=%u "
			            "process_euid=%u",
			            peer->pid, peer->uid, euid);
			err = -ESTALE;
		}
	}
	if (err == 0 && pidfd_exited(pidfd))
		err = -ESRCH;
	if (err < 0) {
		close(pidfd);
		return err == -ENOENT ? -ESRCH : err;
	}

	struct mts_proc *p = mts_find_pid(reg, peer->pid);
	if (p && p->start_time != start_time) {
		/* The pid was reused before we saw the old process's exit
		 * (both events landed in one loop iteration). */
		proc_release(reg, p, "slot reclaimed: pid reused");
		p = NULL;
	}
	if (if_known && !p) {
		close(pidfd);
		return -ENOENT;
	}
	if (p && p->image_id == image_id && p->uid == peer->uid) {
		close(pidfd); /* it has one */
		return register_known(reg, p, peer, group, task, image_id, comm,
		                      res);
	}
	if ((err = group_for_peer(reg, peer, &group)) < 0) {
		close(pidfd);
		return err;
	}
	if (p) {
		close(pidfd); /* it has one */
		err = register_known(reg, p, peer, group, task, image_id, comm,
		                     res);
	} else {
		err = register_new(reg, peer, pidfd, start_time, group, task,
		                   image_id, comm, res);
	}
	if (err < 0) {
		/* A group created for a worker that did not register. */
		struct mts_group *g = mts_find_group(reg, group);
		if (g)
			mts_group_gc(reg, (uint32_t)(g - reg->groups));
	}
	return err;
}

int mts_peer_start_time(const struct mts_registry *reg,
                        const struct mts_peer *peer, uint64_t *start)
{
	if (!peer->has_cred || peer->tcp || !peer->pid)
		return -ESRCH;
	bool exact;
	int pfd = peer_pidfd(reg, peer, &exact);
	if (pfd < 0)
		return pfd;
	int err = mts_read_starttime((pid_t)peer->pid, start);
	if (err == 0 && !exact)
		err = peer_vouch(peer, *start, "action=asker_not_recorded");
	/* Read while the pidfd's process lived: the start time is its. */
	if (err == 0 && pidfd_send_signal(pfd, 0, NULL, 0) < 0)
		err = -ESRCH;
	close(pfd);
	return err;
}

int mts_register(struct mts_registry *reg, const struct mts_peer *peer,
                 const char *group, const char *task, uint64_t image_id,
                 struct mts_reg_result *res)
{
	return register_peer(reg, peer, group, task, image_id, false, res);
}

int mts_register_if_known(struct mts_registry *reg, const struct mts_peer *peer,
                          const char *group, const char *task,
                          uint64_t image_id, struct mts_reg_result *res)
{
	return register_peer(reg, peer, group, task, image_id, true, res);
}

/* ---- adoption (see adopt.c) --------------------------------------------- */

int mts_registry_adopt_slot(struct mts_registry *reg,
                            const struct mts_adopted *a,
                            struct mts_table *table)
{
	const char *group = a->group[0] ? a->group : "default";
	if (a->slot >= reg->slot_count || reg->by_slot[a->slot] ||
	    mts_find_pid(reg, a->pid) || !mt_name_ok(group) ||
	    !mt_name_ok(a->task) || table->uid != a->uid)
		return -EINVAL;
	/* Exited, not yet reaped: its start time still matches, and its last
	 * figures would count (and maybe fire a hook) before its pidfd's
	 * poll says it is gone. */
	if (pidfd_exited(a->pidfd))
		return -ESRCH;
	struct proc_init in = {
	    .pid = a->pid,
	    .uid = a->uid,
	    .slot = a->slot,
	    .pidfd = a->pidfd,
	    .start_time = a->start_time,
	    .image_id = a->image_id,
	    .registered_ns =
	        a->registered_ns ? a->registered_ns : mts_now_realtime(),
	    .group = group,
	    .task = a->task,
	    .comm = a->comm,
	};
	struct mts_proc *p;
	bool taken;
	int err = proc_insert(reg, &in, table, &p, &taken);
	if (err < 0)
		return taken ? -EAGAIN : err; /* -EAGAIN: the pidfd is gone */
	/* The counters stay as the worker left them: that is the point.
	 * Identity is rewritten from our record (the table is writable by
	 * the uid's workers: what it says is not evidence). */
	p->slot_gen = a->slot_gen;
	p->adopted = true;
	/* A limit set on it (SetLimit) outlives the server, as a reload. */
	if (a->limit_set)
		p->limit = p->limit_set = a->limit_set;
	/* The image that registered, as the server before read it: an exec
	 * it saw, or one made since, is seen again (rss.c, exec_seen).
	 * Without it (a record from before), the image found now stands for
	 * the one that registered. */
	if (a->exec_mark) {
		p->exec_mark = a->exec_mark;
		if (a->registered_comm[0])
			mts_comm_copy(p->comm, sizeof(p->comm),
			              a->registered_comm);
		p->image_stale = a->image_stale;
	}
	struct mtshm_slot_id *s = reg->slot_at[p->slot];
	if (a->slot_gen > reg->slot_gens[p->slot])
		reg->slot_gens[p->slot] = a->slot_gen;
	mtshm_store_relaxed32(&s->group, p->group);
	mtshm_store_relaxed32(&s->uid, p->uid);
	mtshm_store_relaxed32(&s->flags, 0);
	mtshm_store_relaxed64(&s->limit, p->limit);
	/* Its peak so far is lost with the old server; it starts again
	 * from its current figure at the first tick. */
	tell_joined(reg, p);
	return 0;
}

/* Raise slot_gens[] to the generations adopted table `tb` holds (a value
 * past 2^62 is a worker's scribble, not the last server's). Only the
 * table's data is read: a read of a hole in a shared memfd mapping
 * allocates a page, and a scan of every slot would make a sparse table
 * dense (4 GiB a uid at the largest layout). Without SEEK_DATA nothing is
 * read: generations then start at 1, as they did. */
static void gens_from_table(struct mts_registry *reg, struct mts_table *tb)
{
	const uint64_t stride = reg->layout.slot_stride;
	const uint64_t at = offsetof(struct mtshm_slot_id, generation);
	const uint64_t size = (uint64_t)reg->slot_count * stride;
	off_t off = 0;
	while ((uint64_t)off < size) {
		off_t data = lseek(tb->map.fd, off, SEEK_DATA);
		if (data < 0)
			return; /* ENXIO: no data past `off` */
		off_t hole = lseek(tb->map.fd, data, SEEK_HOLE);
		if (hole < 0 || (uint64_t)hole > size)
			hole = (off_t)size;
		uint64_t i = (uint64_t)data <= at
		                 ? 0
		                 : ((uint64_t)data - at + stride - 1) / stride;
		for (; i < reg->slot_count &&
		       i * stride + at + sizeof(uint64_t) <= (uint64_t)hole;
		     i++) {
			uint64_t g = mtshm_load_relaxed64(
			    &mtshm_slot(&reg->layout, tb->map.base, (uint32_t)i)
			         ->generation);
			if (g < (UINT64_C(1) << 62) && g > reg->slot_gens[i])
				reg->slot_gens[i] = g;
			if (!reg->by_slot[i])
				hold_if_named(reg, tb, (uint32_t)i);
		}
		off = hole;
	}
}

void mts_registry_keep_limit(struct mts_registry *reg, uint32_t pid,
                             uint64_t start_time, uint64_t limit)
{
	if (!limit)
		return;
	if (reg->nkept_limits == MTS_KEPT_LIMITS)
		memmove(&reg->kept_limits[0], &reg->kept_limits[1],
		        (MTS_KEPT_LIMITS - 1) * sizeof(reg->kept_limits[0]));
	else
		reg->nkept_limits++;
	reg->kept_limits[reg->nkept_limits - 1] = (struct mts_kept_limit){
	    .pid = pid, .start_time = start_time, .limit = limit};
}

void mts_registry_rebuild_free(struct mts_registry *reg)
{
	/* A slot the last server gave and this one did not adopt (its
	 * record entry unwritten, or its table opened through another
	 * worker of the uid) would be handed out again from generation 1.
	 * The worker that had it, registering again, would find the same
	 * table, slot and generation, take it for an adoption and keep its
	 * lanes, which slot_init has just zeroed: its count lost. Every
	 * generation starts above what the adopted tables hold. */
	for (uint32_t t = 0; t < reg->ntables; t++)
		gens_from_table(reg, reg->tables[t]);
	reg->nfree = 0;
	for (uint32_t i = reg->slot_count; i-- > 0;)
		if (!reg->by_slot[i] && !slot_is_held(reg, i))
			reg->free_slots[reg->nfree++] = i;
}
