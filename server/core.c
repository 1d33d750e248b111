/*
 * core.c - the server's core above the registry: the tick, and the wiring
 * of the registry's notifications to the modules that act on its figures.
 *
 * The registry (registry.c) knows identity, slots, groups and totals and
 * nothing above them. The modules above it keep state per process or per
 * uid, and hear of changes through struct mts_registry_watch, filled here:
 *  - a process joins: vouch.c's flags, admit.c's reservations of its task;
 *  - a process leaves: limits.c, since a process over its limit is over
 *    no more;
 *  - a new uid's table: vouch.c;
 *  - who may put a worker in which group: auth.c.
 *
 * Each tick first sums the slots: accounted bytes, and the RSS read by the
 * latest sweep. Then it settles what is vouched for (vouch.c), reconciles
 * reservations (admit.c) and samples rates (rate.c, through limits.c). It
 * evaluates states against the limits with hysteresis (limits.c) and runs
 * enforcement. Last, it publishes the fleet snapshot with its limit,
 * reserved bytes and state.
 *
 * Sums saturate instead of wrapping: each sane slot is below 2^50 but
 * there may be 2^20 of them.
 */
#include "mts_core.h"

#include <errno.h>
#include <stdlib.h>

#include "mts_admit.h"
#include "mts_auth.h"
#include "mts_defs.h"
#include "mts_dispatch.h"
#include "mts_kinds.h"
#include "mts_guard.h"
#include "mts_limits.h"
#include "mts_log.h"
#include "mts_rate.h"
#include "mts_registry.h"
#include "mts_rss.h"
#include "mts_vouch.h"
#include "mtshm.h"

/* The error bound of a process is threshold x threads; threads is written
 * by the client and so untrusted: bound it to keep the product sane. */
#define THREADS_SANE_MAX (1u << 22)

static uint64_t sat_sub(uint64_t a, uint64_t b)
{
	return a > b ? a - b : 0;
}

static uint64_t sat_mul(uint64_t a, uint64_t b)
{
	uint64_t r;
	return __builtin_mul_overflow(a, b, &r) ? UINT64_MAX : r;
}

/* ---- what the registry tells the modules above it ------------------------ */

static void on_joined(struct mts_registry *reg, struct mts_proc *p)
{
	mts_vouch_exposed_check(reg, p);
	mts_vouch_lost_check(reg, p);
	mts_vouch_proc_init(reg, p);
	if (p->task[0])
		mts_resv_worker_registered(reg, p);
}

static void on_leaving(struct mts_registry *reg, const struct mts_proc *p)
{
	mts_limits_proc_gone(reg, p);
}

static void on_table(struct mts_registry *reg, struct mts_table *t)
{
	t->vouch.trusted = mts_uid_trusted(reg, t->uid);
}

static const struct mts_registry_watch core_watch = {
    .joined = on_joined,
    .leaving = on_leaving,
    .table_added = on_table,
    .is_admin = mts_peer_is_admin,
    .may_join = mts_may_join_group,
    .group_gone = mts_limits_group_gone,
};

/* The state of the modules above the registry, in one allocation; each
 * part is written by its own module only (reg->adm, lim, rss, tick,
 * req). */
struct core_parts {
	struct mts_admission adm;
	struct mts_limits_state lim;
	struct mts_rss_state rss;
	struct mts_tick_stats tick;
	struct mts_dispatch_stats req;
	struct mts_kinds kinds;
	struct mts_guard_state guard;
};

int mts_core_init(struct mts_registry *reg, uv_loop_t *loop,
                  struct mtshm_map *map, const char *label,
                  struct mts_state *state)
{
	int err = mts_registry_init(reg, loop, map, label, state, &core_watch);
	if (err < 0)
		return err;
	struct core_parts *c = calloc(1, sizeof(*c));
	if (!c) {
		mts_registry_free(reg);
		return -ENOMEM;
	}
	reg->adm = &c->adm;
	reg->lim = &c->lim;
	reg->rss = &c->rss;
	reg->tick = &c->tick;
	reg->req = &c->req;
	reg->kinds = &c->kinds;
	reg->guard = &c->guard;
	return 0;
}

void mts_core_free(struct mts_registry *reg)
{
	if (reg->adm) {
		mts_guard_release(reg, "memtallyd is stopping");
		mts_resv_free_all(reg);
		mts_kinds_free(reg);
		mts_rss_free(reg);
		/* adm is the first member: the allocation's address. */
		free((struct core_parts *)(void *)reg->adm);
		reg->adm = NULL;
		reg->lim = NULL;
		reg->rss = NULL;
		reg->tick = NULL;
		reg->req = NULL;
		reg->kinds = NULL;
		reg->guard = NULL;
	}
	mts_registry_free(reg);
}

/* ---- the tick ------------------------------------------------------------ */

/* How many entries ahead the tick asks for a slot's line and its proc's.
 * It is enough for a last-level-cache miss to overlap with the work of the
 * slots in between. Distances of 4 and 16 do the same, and no prefetch is
 * much slower (see bench/results/server.md). */
#define TICK_PREFETCH 8u

/* What the tick adds up over the processes. */
struct tick_sums {
	uint64_t bytes, error_bytes, rss, mapped, allocator_free, unvouched;
	/* Claims ran ahead of old kernel figures, or mapped figures are old
	 * enough to be bounded by one (tick_mapped): early reads wanted. */
	bool vouch_reads;
};

/* Note `n` unvouched bytes of `uid` in group `g`. */
static void group_unvouched(struct mts_group *g, uint32_t uid, uint64_t n)
{
	if (g->unvouched == 0)
		g->unvouched_uid = uid;
	else if (g->unvouched_uid != uid)
		g->unvouched_uid = MTS_UID_MIXED;
	g->unvouched = mt_sat_add(g->unvouched, n);
}

/*
 * What of `pf`, a trusted process's free bytes by its allocator's last
 * sample, its resident figure leaves room for, `hm` being its heap and
 * mapped bytes now. The client counts what a process frees as its
 * allocator's until the next sample, a second or more later. An allocator
 * that gives freed pages back at once (jemalloc's large extents, glibc's
 * mmapped chunks) would keep its process counted at its peak meanwhile,
 * though the kernel has the pages back: a busy Dask worker was counted up
 * to 166 MiB above its resident figure after a task ended. The kernel's
 * read is the referee. Free memory counts as far as the resident figure exceeds
 * the heap and mapped bytes, plus the most those grew by since the read (fresh
 * pages the read could not see, which the allocator may keep after a free). So
 * the figure never falls below what the kernel could see resident, nor below
 * the heap and mapped bytes. The peak since the read is followed at the ticks
 * that read a sample of its free memory. An untrusted process's too:
 * its resident figure is proportional (rss.c), and bounding its free
 * bytes by it only lowers its claim toward what the kernel sees, so a
 * liar gains nothing (vouch.c still counts the larger of the two toward
 * others); without it, an honest glibc worker that called malloc_trim()
 * (pages given back, glibc's own figures unmoved) kept its phantom free
 * memory until its untouched time, over its own limit meanwhile.
 */
static inline uint64_t free_resident(struct mts_proc *p, uint64_t hm,
                                     uint64_t pf)
{
	if (hm > p->rss_heap_peak)
		p->rss_heap_peak = hm;
	if (!pf)
		return 0;
	uint64_t seen = mt_sat_add(p->rss, p->rss_heap_peak - p->rss_heap);
	uint64_t room = seen > hm ? seen - hm : 0;
	return pf < room ? pf : room;
}

/* The allocator's free bytes of `p` this tick (layout 2.2), `heap` and
 * `mapped` being its heap and mapped bytes: the sample's, bounded by the
 * kernel's read (free_resident). A process that never
 * published a sample (a linked worker, or a preload with the refresh off and
 * nothing freed) costs only a read of lane 0's line, which the sum just
 * read. A sample being written is skipped: the last value stands. */
static inline uint64_t tick_free(struct mts_proc *p, struct mtshm_slot_id *s,
                                 uint64_t heap, uint64_t mapped, int *absurd)
{
	*absurd = 0;
	if (!p->has_free &&
	    mtshm_load_relaxed64(&mtshm_lane(s, 0)->free_seq) == 0)
		return 0;
	p->has_free = true;
	uint64_t f;
	if (!mtshm_free_now(s, heap, &p->free_held, &f, absurd))
		return p->allocator_free;
	if (p->rss_known)
		f = free_resident(p, heap + mapped, f);
	if (p->allocator_free != f)
		p->allocator_free = f;
	return f;
}

/*
 * A part of a process's figure below 0 is never published. It is counted
 * as 0 and, when the clamping starts, logged within the uid's log budget
 * (mts_log_uid), so a worker cannot flood the log. The heap's sum may dip
 * below 0 by its error bar (`slack`), because a thread freeing what
 * another allocated flushes first. A dip past that is a client's bug. So
 * is any negative mapped figure: it is an absolute value, and the process
 * would have unmapped more than it mapped since it started.
 */
static void tick_clamp(struct mts_proc *p, unsigned part, bool below,
                       int64_t value)
{
	if (!below) {
		if (p->clamped & part)
			p->clamped &= (uint8_t)~part;
		return;
	}
	if (p->clamped & part)
		return;
	p->clamped |= (uint8_t)part;
	mts_log_uid(p->uid, MTS_LOG_WARN, "figure below zero, clamped at 0",
	            "pid=%u uid=%u part=%s value=%lld", p->pid, p->uid,
	            part == MTS_CLAMPED_HEAP ? "heap" : "mapped",
	            (long long)value);
}

/* Lane 0's mapped figure was not sane (*absurd, mtshm_slot_mapped), or
 * was clamped at the last tick: a negative one of sane size is clamped
 * (counted as 0, and not absurd); a sane one is clamped no more. Out of
 * the tick loop's way: it never runs for a well-behaved client. */
__attribute__((noinline, cold)) static void
tick_clamp_mapped(struct mts_proc *p, struct mtshm_slot_id *s, int *absurd)
{
	if (!*absurd) {
		tick_clamp(p, MTS_CLAMPED_MAPPED, false, 0);
		return;
	}
	int64_t m = mtshm_load_relaxeds64(&mtshm_lane(s, 0)->mapped);
	if (m < 0 && m >= -MTSHM_ABSURD_BYTES) {
		*absurd = 0;
		tick_clamp(p, MTS_CLAMPED_MAPPED, true, m);
	}
}

/*
 * What of lane 0's mapped figure `raw` counts, when it changed since the
 * last tick, is young, or is above the bound of the latest kernel read
 * (mts_mapped_read in rss.c). A rise makes the figure young again and
 * lifts the bound, until a kernel read made MTS_MAPPED_YOUNG_MS after it.
 * That read is asked for here, through the early reads. This is out of
 * the tick loop's way: a process whose mapped figure stands still never
 * comes here.
 */
__attribute__((noinline)) static uint64_t tick_mapped(struct mts_proc *p,
                                                      uint64_t raw,
                                                      uint64_t now,
                                                      struct tick_sums *acc)
{
	if (raw > p->mapped_seen) {
		p->mapped_rose_ns = now;
		p->mapped_young = true;
		p->map.cap = UINT64_MAX;
	}
	if (raw != p->mapped_seen)
		p->mapped_seen = raw;
	if (raw && !p->map.ever)
		p->map.ever = true;
	if (p->mapped_young &&
	    now - p->mapped_rose_ns >= (uint64_t)MTS_MAPPED_YOUNG_MS * 1000000u)
		acc->vouch_reads = true; /* a read of it, early */
	p->mapped_capped = raw > p->map.cap;
	return p->mapped_capped ? p->map.cap : raw;
}

/* The heap's sum is below 0, or was clamped: clamped past its error bar
 * `pe` (at least the threshold), clamped no more within it. */
__attribute__((noinline, cold)) static void
tick_clamp_heap(const struct mts_registry *reg, struct mts_proc *p, int64_t sum,
                uint64_t pe)
{
	uint64_t slack = pe > reg->threshold ? pe : reg->threshold;
	tick_clamp(p, MTS_CLAMPED_HEAP, sum < 0 && (uint64_t)-sum > slack, sum);
}

/* One process's share of a tick: sum its slot, update its figures, add
 * them to its group and to `acc`. */
static inline void tick_proc(struct mts_registry *reg, struct mts_proc *p,
                             uint32_t lanes, uint64_t now,
                             struct tick_sums *acc)
{
	struct mtshm_slot_id *s = reg->slot_at[p->slot];
	uint64_t flushes;
	int absurd, mapped_absurd, free_absurd;
	int64_t sum = mtshm_slot_sum(s, lanes, &flushes, &absurd);
	uint64_t heap = sum < 0 ? 0 : (uint64_t)sum;
	/* Lane 0's line, which the sum just read. */
	uint64_t pm = mtshm_slot_mapped(s, &mapped_absurd);
	if (__builtin_expect(mapped_absurd | (p->clamped & MTS_CLAMPED_MAPPED),
	                     0))
		tick_clamp_mapped(p, s, &mapped_absurd);
	if (__builtin_expect(
	        (pm != p->mapped_seen) | p->mapped_young | p->mapped_capped, 0))
		pm = tick_mapped(p, pm, now, acc);
	uint64_t pf = tick_free(p, s, heap, pm, &free_absurd);
	absurd |= mapped_absurd | free_absurd;
	uint32_t threads = mtshm_load_relaxed32(&s->threads);
	/* Here and below: store only what changed. Most workers are idle
	 * between two ticks, and a line left clean is dropped from the
	 * cache for free instead of written back. */
	if (p->threads != threads)
		p->threads = threads;
	/* RSS comes from the kernel, not the slot: it counts even for a
	 * slot whose counters are quarantined. */
	struct mts_group *g = &reg->groups[p->group];
	g->rss = mt_sat_add(g->rss, p->rss);
	acc->rss = mt_sat_add(acc->rss, p->rss);
	if (absurd && !p->corrupt) {
		p->corrupt = true;
		mtshm_store_relaxed32(&s->flags,
		                      mtshm_load_relaxed32(&s->flags) |
		                          MTSHM_SLOT_CORRUPT);
		mts_log_uid(p->uid, MTS_LOG_WARN,
		            "slot counters corrupt, excluded", "pid=%u slot=%u",
		            p->pid, p->slot);
	}
	if (p->corrupt) {
		p->bytes = 0;
		p->unvouched = 0;
		p->error_bytes = 0;
		p->mapped = 0;
		p->allocator_free = 0;
		/* Its counters say nothing, but what the kernel says it
		 * holds still counts toward others: an untrusted worker
		 * must not hide its memory by writing one absurd figure. */
		if (p->untrusted && p->vouch.kernel) {
			g->bytes = mt_sat_add(g->bytes, p->vouch.kernel);
			acc->bytes = mt_sat_add(acc->bytes, p->vouch.kernel);
		}
		return;
	}
	/* Each part is below 2^51 here (the absurd checks): no overflow. */
	uint64_t pb = heap + pm + pf;
	if (p->mapped != pm)
		p->mapped = pm;
	if (p->bytes != pb)
		p->bytes = pb;
	/* What counts toward others: all of it, but for an untrusted uid
	 * (vouch.c). Its own limit sees the claim (limits.c), but for a
	 * process in reach of a worker that left its uid. */
	uint64_t pv = pb;
	if (p->untrusted) {
		pv = mts_vouch_proc(reg, p, pb, &acc->vouch_reads);
		if (p->unvouched) {
			/* A process that left its trusted uid lies for
			 * the uid it runs as, and so does a slot in its
			 * reach. */
			group_unvouched(
			    g, p->uid_left || p->exposed ? p->left_uid : p->uid,
			    p->unvouched);
			acc->unvouched =
			    mt_sat_add(acc->unvouched, p->unvouched);
		}
	}
	if (pb > p->peak) {
		p->peak = pb;
		mtshm_store_relaxed64(&s->peak, pb);
	}
	if (threads > THREADS_SANE_MAX)
		threads = THREADS_SANE_MAX;
	uint64_t pe = sat_mul(reg->threshold, threads);
	if (__builtin_expect(sum < 0 || (p->clamped & MTS_CLAMPED_HEAP), 0))
		tick_clamp_heap(reg, p, sum, pe);
	if (p->error_bytes != pe)
		p->error_bytes = pe;
	g->bytes = mt_sat_add(g->bytes, pv);
	g->mapped = mt_sat_add(g->mapped, pm);
	g->error_bytes = mt_sat_add(g->error_bytes, pe);
	acc->mapped = mt_sat_add(acc->mapped, pm);
	if (pf) { /* most processes: none (every jemalloc one) */
		g->allocator_free = mt_sat_add(g->allocator_free, pf);
		acc->allocator_free = mt_sat_add(acc->allocator_free, pf);
	}
	acc->bytes = mt_sat_add(acc->bytes, pv);
	acc->error_bytes = mt_sat_add(acc->error_bytes, pe);
}

/* Ticks [from, to) of dense[]; with `rate` (a constant at each call, so
 * the branch is compiled away) each process's rate is also sampled, while
 * its line is in cache. */
static inline __attribute__((always_inline)) void
tick_range(struct mts_registry *reg, uint32_t from, uint32_t to, bool rate,
           uint64_t now, struct tick_sums *acc)
{
	uint32_t lanes = reg->layout.lane_count;
	struct mtshm_slot_id *const *slot_at = reg->slot_at;
	struct mts_proc *const *by_slot = reg->by_slot;
	const uint32_t *dense = reg->dense;
	uint32_t n = reg->ndense;
	uint64_t window = rate ? mts_growth_window_ns(reg) : 0;
	struct mts_decay_cache cache = {0};

	/* dense[] is in no useful memory order, because an exit moves the
	 * last entry into its hole. So ask for the slot line and the proc
	 * TICK_PREFETCH entries ahead, and their misses overlap with this
	 * entry's work. Walking by_slot[] in slot order instead, so that the
	 * hardware prefetcher follows the slot lines, does no better. */
	for (uint32_t i = from; i < to; i++) {
		if (i + TICK_PREFETCH < n) {
			uint32_t ahead = dense[i + TICK_PREFETCH];
			mtshm_slot_prefetch(slot_at[ahead]);
			__builtin_prefetch(by_slot[ahead], 1, 3);
			if (rate)
				__builtin_prefetch(&by_slot[ahead]->rate, 1, 3);
		}
		struct mts_proc *p = by_slot[dense[i]];
		tick_proc(reg, p, lanes, now, acc);
		/* The process's limit state, while its line is in cache. A
		 * second pass over every process would cost mostly cache
		 * misses. Without a limit a process stays ok: skip, unless
		 * its way back to ok is still to be told. */
		if (p->limit || p->state != MTSHM_STATE_OK ||
		    p->told_state != MTSHM_STATE_OK)
			mts_limits_eval_proc(reg, p);
		/* What counts toward others (all of a trusted process's
		 * claim): the growth the node guard and the forecasts read is
		 * never a lie's. */
		if (rate)
			mts_rate_add(
			    &p->rate, now,
			    mts_measured(reg, mts_vouch_counted(p), p->rss),
			    window, &cache);
	}
}

void mts_core_tick(struct mts_registry *reg)
{
	struct mts_totals *t = &reg->totals;
	struct tick_sums acc = {0};
	uint64_t started = mts_now_monotonic();
	uint32_t n = reg->ndense;

	for (uint32_t i = 0; i < reg->groups_used; i++) {
		reg->groups[i].bytes = 0;
		reg->groups[i].mapped = 0;
		reg->groups[i].allocator_free = 0;
		reg->groups[i].error_bytes = 0;
		reg->groups[i].rss = 0;
		reg->groups[i].unvouched = 0;
	}
	/* A page memtallyd could not read since the last tick (fault.c):
	 * its slots count as the kernel vouches for them from this tick. */
	mts_tables_faults(reg);
	mts_vouch_lost_apply(reg);
	mts_vouch_begin(reg);
	/* Processes' rates: one slice of dense[] per tick, so each is
	 * sampled every MTS_RATE_PROC_SLICES ticks and no tick pays for all
	 * of them (an exit reorders dense[]: a process may be sampled twice
	 * in a round or skipped once, which the rate, fitted on sample
	 * times, does not mind). */
	uint32_t per = (n + MTS_RATE_PROC_SLICES - 1) / MTS_RATE_PROC_SLICES;
	uint32_t lo = t->rate_slice * per;
	uint32_t hi = lo + per;
	lo = lo < n ? lo : n;
	hi = hi < n ? hi : n;
	t->rate_slice = (t->rate_slice + 1) % MTS_RATE_PROC_SLICES;
	mts_limits_procs_begin(reg);
	tick_range(reg, 0, lo, false, started, &acc);
	tick_range(reg, lo, hi, true, started, &acc);
	tick_range(reg, hi, n, false, started, &acc);
	for (uint32_t i = 0; i < reg->groups_used; i++) {
		struct mts_group *g = &reg->groups[i];
		if (g->bytes > g->peak)
			g->peak = g->bytes;
	}
	t->bytes = acc.bytes;
	t->unvouched = acc.unvouched;
	t->allowance =
	    reg->policy.untouched_ms
	        ? sat_sub(reg->policy.untouched_total, reg->vouch.allow_left)
	        : 0;
	t->mapped = acc.mapped;
	t->allocator_free = acc.allocator_free;
	t->error_bytes = acc.error_bytes;
	t->rss = acc.rss;
	if (acc.bytes > t->peak)
		t->peak = acc.bytes;
	t->processes = reg->ndense;
	t->ticks++;

	uint64_t now = mts_now_monotonic();
	mts_vouch_end(reg, now);
	if (acc.vouch_reads)
		mts_rss_want_vouch(
		    reg);           /* the server starts it after the tick */
	mts_tables_sweep(reg, now); /* a few tables: one per uid */
	mts_resv_tick(reg, now);
	if (now - t->rate_ns >= (uint64_t)MTS_RATE_SAMPLE_MS * 1000000u)
		mts_rates_sample(reg, now);
	/* Processes were evaluated in the loop above (their events come
	 * before the fleet's and groups' of the same tick). */
	mts_limits_eval(reg, false);
	mts_enforce(reg, now);
	t->heartbeat_ns = mts_now_monotonic();
	mts_publish(reg);

	uint64_t took = sat_sub(t->heartbeat_ns, started);
	reg->tick->last_ns = took;
	reg->tick->sum_ns = mt_sat_add(reg->tick->sum_ns, took);
	reg->tick->count++;
}
