/*
 * limits.c - limits, states with hysteresis, Watch events, enforcement.
 *
 * Three kinds of limit: the fleet's, each group's, and each process's. A
 * process's limit is the default per-process limit, or one set for its pid
 * with SetLimit. Each limit has a state, ok / high / over, moved by
 * mts_state_next():
 *
 *           value > limit                value > limit
 *     ok ------------------> over <------------------- high
 *     ok --> high at limit x watermark
 *     over --> high only below limit x (1 - hysteresis)
 *     high --> ok   only below limit x (watermark - hysteresis)
 *
 * A figure that wobbles around one line thus changes state once, not on
 * every tick. With [limits] forecast_horizon, the fleet and each group also
 * turn `high` below the watermark when their growth rate (rate.c) says the
 * limit will be crossed within the horizon. That input has its own
 * hysteresis (mts_forecast_gate), so a noisy rate does not flap.
 *
 * What is compared is per policy.measure: accounted bytes, RSS, or the
 * larger of the two. Each of fleet, group and process takes the larger on
 * its own sums. The fleet and groups add the outstanding reservations,
 * because what a grant has promised is as good as used.
 *
 * Every change of the fleet's or a group's state, and every process
 * entering or leaving `over`, is handed to reg->lim->on_event (the Watch
 * broadcast); a process's within its uid's event budget (20 a second,
 * bursts of 40), past which the change is told when the budget allows,
 * as it then stands. It is logged within a budget (mts_log.h): the scope's for
 * the fleet and groups, the uid's for a process. A process in `over` has
 * MTSHM_SLOT_OVER_LIMIT set in its slot, so the worker can see it with one
 * load. The flag is cleared when it leaves `over`. Processes can be `high`
 * too, as ProcessInfo.state reports, but only over/not-over is an event.
 *
 * Enforcement is optional (policy.enforce_signal). Once the fleet has been
 * in `over` for policy.grace_ms, the largest process that is over its own
 * limit gets the signal. "Largest" and "over" are taken on what the
 * process claims or, for an untrusted one, on what it counts toward the
 * others (enforce_figure): a worker that hides its memory is chosen
 * before an honest one of another user, and one that overstates ranks by
 * what the kernel vouches for. The signal goes through the
 * pidfd, so never to a recycled pid, and never to memtallyd itself. Then
 * the grace period starts again. That makes at most one signal per grace
 * period in all, and one per process per grace period or
 * MTS_ENFORCE_AGAIN_MIN_NS, whichever is longer (a grace of 0 would
 * otherwise signal the same process every tick until it exits). A signal
 * that fails spends no grace. If no process is over its own limit,
 * nothing is signalled. The fleet is then over because of many processes
 * within their limits, and picking one of them would be a guess.
 */
#include "mts_limits.h"

#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/pidfd.h>
#include <unistd.h>

#include "mts_defs.h"
#include "mts_log.h"
#include "mts_policy.h"
#include "mts_rate.h"
#include "mts_registry.h"
#include "mts_state.h"
#include "mts_vouch.h"
#include "mtshm.h"

/* Each uid's processes' over / back-under Watch events: a flapping figure
 * of 512 processes would otherwise send every subscriber 50,000 events a
 * second. Past the budget the change is told later, once, as it then
 * stands; the slot's flag never waits. */
#define MTS_PROC_EVENTS_PER_S 20.0
#define MTS_PROC_EVENTS_BURST 40.0
/* The same for each scope (the fleet, a group): an Admit and a Release
 * move a group across its mark at request rate, so one user could make
 * every subscriber hear thousands of changes a second. */
#define MTS_SCOPE_EVENTS_PER_S 10.0
#define MTS_SCOPE_EVENTS_BURST 20.0

/* The least time before the same process is signalled again. */
#define MTS_ENFORCE_AGAIN_MIN_NS (UINT64_C(1000) * 1000000u)

/* value >= limit x bp / 10000, compared exactly (128-bit, no rounding:
 * with a limit of 1 byte, 0 is below 95% of it). */
static bool at_least(uint64_t value, uint64_t limit, uint32_t bp)
{
	return (unsigned __int128)value * MTS_BP_ONE >=
	       (unsigned __int128)limit * bp;
}

static uint32_t state_by_value(uint32_t cur, uint64_t value, uint64_t limit,
                               uint32_t high_bp, uint32_t hyst_bp)
{
	if (limit == 0)
		return MTSHM_STATE_OK;
	if (value > limit)
		return MTSHM_STATE_OVER;
	if (cur == MTSHM_STATE_OVER &&
	    at_least(value, limit, MTS_BP_ONE - hyst_bp))
		return MTSHM_STATE_OVER;
	if (at_least(value, limit, high_bp))
		return MTSHM_STATE_HIGH;
	uint32_t low_bp = high_bp > hyst_bp ? high_bp - hyst_bp : 0;
	if (cur != MTSHM_STATE_OK && low_bp > 0 &&
	    at_least(value, limit, low_bp))
		return MTSHM_STATE_HIGH;
	return MTSHM_STATE_OK;
}

uint32_t mts_state_next(uint32_t cur, uint64_t value, uint64_t limit,
                        uint32_t high_bp, uint32_t hyst_bp, bool forecast)
{
	uint32_t s = state_by_value(cur, value, limit, high_bp, hyst_bp);
	if (s == MTSHM_STATE_OK && forecast && limit != 0)
		return MTSHM_STATE_HIGH;
	return s;
}

uint64_t mts_measured(const struct mts_registry *reg, uint64_t accounted,
                      uint64_t rss)
{
	switch (reg->policy.measure) {
	case MTS_MEASURE_RSS:
		return rss;
	case MTS_MEASURE_MAX:
		return accounted > rss ? accounted : rss;
	default:
		return accounted;
	}
}

/* Why a scope is in `next`, for the event and the log. */
static void reason_of(char *buf, size_t cap, uint32_t next, uint32_t prev,
                      bool by_forecast, double growth, double forecast_s)
{
	if (by_forecast) {
		char r[32];
		uint64_t g =
		    growth > 0 && growth < 1.8e19 ? (uint64_t)growth : 0;
		snprintf(buf, cap, "forecast: limit in %.0f s at %s/s",
		         forecast_s < 1 ? 1 : forecast_s,
		         mt_format_size(r, sizeof(r), g));
	} else if (next == MTSHM_STATE_OVER) {
		snprintf(buf, cap, "over the limit");
	} else if (next == MTSHM_STATE_HIGH) {
		snprintf(buf, cap,
		         prev == MTSHM_STATE_OVER
		             ? "back under the limit, above the "
		               "lower mark"
		             : "at the high watermark");
	} else {
		snprintf(buf, cap,
		         "below the lower mark, no forecast within "
		         "the horizon");
	}
}

/* `p`: the process whose state changed, whose uid's budget its line goes
 * in; NULL for the fleet or a group, budgeted as a scope (many uids move
 * it). */
static void emit(struct mts_registry *reg, const struct mts_proc *p,
                 const char *scope, uint32_t state, uint32_t previous,
                 uint64_t bytes, uint64_t rss, uint64_t limit,
                 uint64_t reserved, const char *reason, double growth,
                 double forecast_s, const struct mts_figures *figures)
{
	char q[MTS_LOGQ_MAX], qr[MTS_LOGQ_MAX];
	struct mts_event ev = {
	    .scope = scope,
	    .state = state,
	    .previous = previous,
	    .bytes = bytes,
	    .rss = rss,
	    .limit = limit,
	    .reserved = reserved,
	    .time_ns = mts_now_realtime(),
	    .reason = reason,
	    .growth = growth,
	    .forecast_s = forecast_s,
	    .measure = mts_measure_name(reg->policy.measure),
	    .has_uid = p != NULL,
	    .uid = p ? p->uid : 0,
	    .figures = figures,
	};
	enum mts_log_level level =
	    state == MTSHM_STATE_OVER ? MTS_LOG_WARN : MTS_LOG_INFO;
	char fields[640], eta[32] = "none"; /* 0 is no forecast, not now */
	if (forecast_s > 0)
		snprintf(eta, sizeof(eta), "%.1f", forecast_s);
	snprintf(fields, sizeof(fields),
	         "scope=%s state=%s previous=%s bytes=%llu rss=%llu "
	         "measure=%s reserved=%llu limit=%llu growth_bytes_per_s=%.0f "
	         "seconds_to_limit=%s reason=%s",
	         mts_logq(q, sizeof(q), scope), mt_state_name(state),
	         mt_state_name(previous), (unsigned long long)bytes,
	         (unsigned long long)rss, mts_measure_name(reg->policy.measure),
	         (unsigned long long)reserved, (unsigned long long)limit,
	         growth, eta, mts_logq(qr, sizeof(qr), reason));
	if (p)
		mts_log_uid(p->uid, level, "state changed", "%s", fields);
	else
		mts_log_scope(scope, level, "state changed", "%s", fields);
	if (reg->lim->on_event)
		reg->lim->on_event(reg->lim->event_ctx, &ev);
}

/* May one more event go out now, from a bucket of `burst` tokens refilled
 * at `per_s`? `ns` 0: a full bucket. */
static bool event_token(double *tokens, uint64_t *ns, uint64_t now_ns,
                        double per_s, double burst)
{
	if (*ns == 0 || now_ns < *ns) {
		*tokens = burst;
	} else {
		*tokens += (double)(now_ns - *ns) * per_s / 1e9;
		if (*tokens > burst)
			*tokens = burst;
	}
	*ns = now_ns;
	if (*tokens < 1)
		return false;
	*tokens -= 1;
	return true;
}

/* May one more event of `t`'s processes go out now? */
static bool proc_event_token(struct mts_table *t, uint64_t now_ns)
{
	return event_token(&t->ev_tokens, &t->ev_ns, now_ns,
	                   MTS_PROC_EVENTS_PER_S, MTS_PROC_EVENTS_BURST);
}

/* Is a scope's state to be told now? Yes if it is not what its last
 * event said and the scope's budget allows; past the budget, it is told
 * at a later evaluation, as it then stands. */
static bool scope_tell(struct mts_scope_told *told, uint32_t state)
{
	return told->state != state &&
	       event_token(&told->tokens, &told->ns, mts_now_monotonic(),
	                   MTS_SCOPE_EVENTS_PER_S, MTS_SCOPE_EVENTS_BURST);
}

/* The forecast gate of a scope, stepped once per evaluation. */
static bool gate_step(const struct mts_registry *reg,
                      struct mts_forecast_gate *g, double forecast_s)
{
	return mts_forecast_gate(g, forecast_s, reg->policy.forecast_horizon_ms,
	                         mts_growth_window_ns(reg),
	                         reg->totals.heartbeat_ns);
}

static void eval_fleet(struct mts_registry *reg)
{
	struct mts_totals *t = &reg->totals;
	const struct mts_policy *pol = &reg->policy;
	uint64_t value = mts_fleet_value(reg);
	double fc = mts_fleet_forecast(reg);
	bool gate = gate_step(reg, &t->fgate, fc);
	uint32_t next = mts_state_next(t->state, value, t->limit, pol->high_bp,
	                               pol->hyst_bp, gate);
	if (next != t->state) {
		uint32_t prev = t->state;
		t->state = next;
		if (next == MTSHM_STATE_OVER) {
			reg->lim->fleet_over_since_ns = mts_now_monotonic();
		} else if (prev == MTSHM_STATE_OVER) {
			reg->lim->fleet_over_since_ns = 0;
			reg->lim->enforce_idle_logged = false;
		}
	}
	if (!scope_tell(&t->told, t->state))
		return;
	/* From the state its subscribers last heard. */
	uint32_t prev = t->told.state;
	bool by_forecast = t->state == MTSHM_STATE_HIGH && gate &&
	                   state_by_value(prev, value, t->limit, pol->high_bp,
	                                  pol->hyst_bp) == MTSHM_STATE_OK;
	t->told.state = t->state;
	char why[96];
	reason_of(why, sizeof(why), t->state, prev, by_forecast, t->growth, fc);
	emit(reg, NULL, "fleet", t->state, prev, t->bytes, t->rss, t->limit,
	     t->reserved, why, t->growth, fc, &t->fig);
}

static void eval_group(struct mts_registry *reg, struct mts_group *g)
{
	const struct mts_policy *pol = &reg->policy;
	uint32_t high = g->high_bp ? g->high_bp : pol->high_bp;
	uint64_t value = mts_group_value(reg, g);
	double fc = mts_group_forecast(reg, g);
	bool gate = gate_step(reg, &g->fgate, fc);
	g->state =
	    mts_state_next(g->state, value, g->limit, high, pol->hyst_bp, gate);
	if (!scope_tell(&g->told, g->state))
		return;
	uint32_t prev = g->told.state;
	bool by_forecast = g->state == MTSHM_STATE_HIGH && gate &&
	                   state_by_value(prev, value, g->limit, high,
	                                  pol->hyst_bp) == MTSHM_STATE_OK;
	g->told.state = g->state;
	char scope[MTS_NAME_MAX + 8], why[96];
	snprintf(scope, sizeof(scope), "group:%s", g->name);
	reason_of(why, sizeof(why), g->state, prev, by_forecast, g->growth, fc);
	emit(reg, NULL, scope, g->state, prev, g->bytes, g->rss, g->limit,
	     g->reserved, why, g->growth, fc, &g->fig);
}

/* Tell Watch that `p` went over or back under (from state `from`), within
 * its uid's budget; past it, at a later evaluation (whatever its state is
 * by then). */
static void proc_tell(struct mts_registry *reg, struct mts_proc *p,
                      uint32_t from)
{
	bool is_over = p->state == MTSHM_STATE_OVER;
	bool told_over = p->told_state == MTSHM_STATE_OVER;
	if (is_over == told_over)
		return;
	if (!proc_event_token(p->table, mts_now_monotonic())) {
		reg->lim->owed = true;
		return;
	}
	/* The state it left; or, for a change told late, the one its
	 * subscribers last heard. */
	uint32_t prev =
	    (from == MTSHM_STATE_OVER) == told_over ? from : p->told_state;
	p->told_state = p->state;
	char scope[24];
	snprintf(scope, sizeof(scope), "pid:%u", p->pid);
	emit(reg, p, scope, p->state, prev, p->bytes, p->rss, p->limit, 0,
	     is_over ? "over its limit" : "back under its limit",
	     mts_proc_growth(reg, p), 0, NULL);
}

/* What a process's own limit sees: its claim, or, in reach of a worker
 * that left its uid (vouch.c), or holding an old image's claim (rss.c,
 * image_stale), what the kernel vouches for. */
static uint64_t own_claim(const struct mts_proc *p)
{
	return p->exposed || p->slot_lost || p->image_stale
	           ? mts_vouch_counted(p)
	           : p->bytes;
}

void mts_limits_eval_proc(struct mts_registry *reg, struct mts_proc *p)
{
	const struct mts_policy *pol = &reg->policy;
	uint64_t value = mts_measured(reg, own_claim(p), p->rss);
	uint32_t next = mts_state_next(p->state, value, p->limit, pol->high_bp,
	                               pol->hyst_bp, false);
	if (next == p->state) {
		/* Nothing held back last time: nothing to tell. */
		if (reg->lim->owed_seen)
			proc_tell(reg, p, p->told_state);
		return;
	}
	uint32_t prev = p->state;
	p->state = next;
	bool was_over = prev == MTSHM_STATE_OVER;
	bool is_over = next == MTSHM_STATE_OVER;
	if (was_over == is_over) {
		/* ok <-> high of a process is not an event; but one held back
		 * for the budget (over -> high, then high -> ok) is still
		 * owed, and would be lost once nothing else is owed. */
		proc_tell(reg, p, p->told_state);
		return;
	}
	/* The flags word has one writer, us; the client only reads it. The
	 * flag follows at once; only the event waits for the budget. */
	struct mtshm_slot_id *s = reg->slot_at[p->slot];
	uint32_t flags = mtshm_load_relaxed32(&s->flags);
	flags = is_over ? flags | MTSHM_SLOT_OVER_LIMIT
	                : flags & ~MTSHM_SLOT_OVER_LIMIT;
	mtshm_store_release32(&s->flags, flags);
	proc_tell(reg, p, prev);
}

void mts_limits_proc_gone(struct mts_registry *reg, const struct mts_proc *p)
{
	/* Its end is told only if its over was: outside the budget, as a
	 * uid's exits are bounded by its registrations. */
	if (p->told_state != MTSHM_STATE_OVER)
		return;
	char scope[24];
	snprintf(scope, sizeof(scope), "pid:%u", p->pid);
	emit(reg, p, scope, MTSHM_STATE_OK, MTSHM_STATE_OVER, p->bytes, p->rss,
	     p->limit, 0, "exited", 0, 0, NULL);
}

void mts_limits_procs_begin(struct mts_registry *reg)
{
	reg->lim->owed_seen = reg->lim->owed;
	reg->lim->owed = false;
}

void mts_limits_group_gone(struct mts_registry *reg, struct mts_group *g)
{
	/* With no limit left its state is ok; a change its budget held back
	 * would otherwise never be told, and a subscriber would hear the
	 * group over for ever. Outside the budget: a group goes once. */
	g->state = MTSHM_STATE_OK;
	if (g->told.state == MTSHM_STATE_OK)
		return;
	uint32_t prev = g->told.state;
	g->told.state = MTSHM_STATE_OK;
	char scope[MTS_NAME_MAX + 8];
	snprintf(scope, sizeof(scope), "group:%s", g->name);
	emit(reg, NULL, scope, MTSHM_STATE_OK, prev, g->bytes, g->rss, 0,
	     g->reserved, "no limit", 0, 0, &g->fig);
}

void mts_limits_eval(struct mts_registry *reg, bool procs)
{
	eval_fleet(reg);
	for (uint32_t i = 0; i < reg->groups_used; i++)
		if (reg->groups[i].name)
			eval_group(reg, &reg->groups[i]);
	if (procs) {
		mts_limits_procs_begin(reg);
		for (uint32_t i = 0; i < reg->ndense; i++)
			mts_limits_eval_proc(reg, reg->by_slot[reg->dense[i]]);
	}
}

/* Evaluate and publish at once: a change made by a request (SetLimit,
 * Admit, Release, reload) is visible before the next tick. */
static void eval_now(struct mts_registry *reg, bool procs)
{
	mts_limits_eval(reg, procs);
	mts_publish(reg);
}

static void proc_limit_set(struct mts_registry *reg, struct mts_proc *p,
                           uint64_t limit)
{
	if (p->limit == limit)
		return;
	p->limit = limit;
	mtshm_store_relaxed64(&reg->slot_at[p->slot]->limit, limit);
}

static void log_limit(const char *why, const char *scope, uint64_t before,
                      uint64_t after)
{
	char q[MTS_LOGQ_MAX];
	mts_log(MTS_LOG_INFO, why, "scope=%s previous=%llu limit=%llu",
	        mts_logq(q, sizeof(q), scope), (unsigned long long)before,
	        (unsigned long long)after);
}

int mts_limits_apply_policy(struct mts_registry *reg,
                            const struct mts_policy *pol)
{
	struct mts_policy copy;
	char scope[MTS_NAME_MAX + 8];
	if (mts_policy_copy(&copy, pol) < 0)
		return -ENOMEM;
	/* Create the groups first: the only step that can fail. Empty
	 * entries made before a failure are collected again below. */
	for (uint32_t i = 0; i < copy.ngroups; i++) {
		uint32_t idx;
		if (mts_group_ensure(reg, copy.groups[i].name, &idx) < 0) {
			for (uint32_t k = 0; k < reg->groups_used; k++)
				mts_group_gc(reg, k);
			mts_policy_free(&copy);
			return -ENOMEM;
		}
	}
	if (copy.measure != reg->policy.measure) {
		/* Another figure: its rate starts from nothing, not from a
		 * jump between two figures. */
		reg->totals.rate.n = 0;
		reg->totals.growth = 0;
		for (uint32_t i = 0; i < reg->groups_used; i++) {
			reg->groups[i].rate.n = 0;
			reg->groups[i].growth = 0;
		}
		for (uint32_t i = 0; i < reg->ndense; i++)
			mts_rate_reset(&reg->by_slot[reg->dense[i]]->rate);
	}
	mts_policy_free(&reg->policy);
	reg->policy = copy;
	mts_vouch_refresh(reg); /* trusted_uids may have changed */

	if (reg->totals.limit != copy.fleet_limit)
		log_limit("limit applied", "fleet", reg->totals.limit,
		          copy.fleet_limit);
	reg->totals.limit = copy.fleet_limit;
	for (uint32_t i = 0; i < reg->groups_used; i++) {
		struct mts_group *g = &reg->groups[i];
		if (!g->name)
			continue;
		const struct mts_group_policy *gp =
		    mts_policy_group(&copy, g->name);
		uint64_t limit = gp ? gp->limit : 0;
		if (g->limit != limit) {
			snprintf(scope, sizeof(scope), "group:%s", g->name);
			log_limit("limit applied", scope, g->limit, limit);
		}
		g->limit = limit;
		g->high_bp = gp ? gp->high_bp : 0;
		/* A group about to lose its entry says `ok` first. */
		eval_group(reg, g);
		mts_group_gc(reg, i);
	}
	for (uint32_t i = 0; i < reg->ndense; i++) {
		struct mts_proc *p = reg->by_slot[reg->dense[i]];
		proc_limit_set(
		    reg, p, p->limit_set ? p->limit_set : copy.process_limit);
	}
	eval_now(reg, true);
	return 0;
}

int mts_limit_set_fleet(struct mts_registry *reg, uint64_t bytes,
                        uint64_t *previous, uint64_t *now)
{
	*previous = reg->totals.limit;
	reg->totals.limit = bytes;
	*now = bytes;
	eval_now(reg, false);
	return 0;
}

int mts_limit_set_group(struct mts_registry *reg, const char *name,
                        uint64_t bytes, uint64_t *previous, uint64_t *now)
{
	uint32_t idx;
	if (!name || !name[0])
		name = "default";
	if (!mt_name_ok(name))
		return -EINVAL;
	int err = mts_group_ensure(reg, name, &idx);
	if (err < 0)
		return err;
	struct mts_group *g = &reg->groups[idx];
	*previous = g->limit;
	g->limit = bytes;
	*now = bytes;
	if (bytes == 0 && g->state != MTSHM_STATE_OK) {
		/* No limit, no state: say so before the entry may go. */
		eval_group(reg, g);
	}
	mts_group_gc(reg, idx);
	eval_now(reg, false);
	return 0;
}

int mts_limit_set_pid(struct mts_registry *reg, uint32_t pid, uint64_t bytes,
                      uint64_t *previous, uint64_t *now)
{
	struct mts_proc *p = mts_find_pid(reg, pid);
	if (!p)
		return -ENOENT;
	*previous = p->limit;
	p->limit_set = bytes;
	proc_limit_set(reg, p, bytes ? bytes : reg->policy.process_limit);
	/* In the restart record too: a limit set on a process outlives a
	 * restart of memtallyd (kill -9 included), as it does a reload. */
	struct mts_state_rec r;
	if (reg->state && mts_state_get(reg->state, p->slot, &r) == 0 &&
	    r.pid == p->pid) {
		r.limit_set = bytes;
		mts_state_put(reg->state, p->slot, &r);
	}
	*now = p->limit;
	mts_limits_eval_proc(reg, p);
	eval_now(reg, false);
	return 0;
}

/* What enforcement ranks a process by. A process's own state is on its
 * claim, which is the claimant's business; choosing whom to signal for
 * the fleet is everyone's. An untrusted process counts at what it counts
 * toward the others (mts_vouch_counted): at least what the kernel says it
 * holds, so one that understates (a zeroed slot, memory the client cannot
 * see) cannot leave another user's process to be chosen in its place; and
 * no more than the kernel vouches for, so one that overstates and shrugs
 * the signal off (SIGTERM caught) is not chosen ahead of the process
 * really over, every grace period, for ever. */
static uint64_t enforce_figure(const struct mts_registry *reg,
                               const struct mts_proc *p)
{
	return mts_measured(reg, mts_vouch_counted(p), p->rss);
}

void mts_enforce(struct mts_registry *reg, uint64_t now_ns)
{
	const struct mts_policy *pol = &reg->policy;
	if (!pol->enforce_signal || reg->totals.state != MTSHM_STATE_OVER ||
	    reg->lim->fleet_over_since_ns == 0)
		return;
	uint64_t grace = (uint64_t)pol->grace_ms * 1000000u;
	if (now_ns < reg->lim->fleet_over_since_ns ||
	    now_ns - reg->lim->fleet_over_since_ns < grace)
		return;
	/* Over on what the kernel holds, not on an allowance for memory
	 * not touched yet, nor on reservations (a promise: nothing is
	 * resident): one user's claim or Admit never gets another user's
	 * process signalled (vouch.c). With the reservations counted, a
	 * user with no process at all tipped the fleet over with an Admit
	 * of 12 MiB, and another user's worker over its own limit was
	 * killed while the node held less than the limit. */
	const struct mts_totals *t = &reg->totals;
	uint64_t touched =
	    t->bytes > t->allowance ? t->bytes - t->allowance : 0;
	uint64_t held = mts_measured(reg, touched, t->rss);
	if (t->limit && held <= t->limit) {
		/* Which: its state stays over down to the lower mark
		 * (hysteresis), where the figure itself is under the
		 * limit; or only allowances take it over. */
		bool band = mt_sat_add(mts_measured(reg, t->bytes, t->rss),
		                       t->reserved) <= t->limit;
		if (!reg->lim->enforce_idle_logged)
			mts_log_scope(
			    "enforce", MTS_LOG_WARN,
			    band ? "fleet state over past the grace period but "
			           "back under its limit (over until below "
			           "its lower mark), nothing signalled"
			         : "fleet over its limit past the grace period "
			           "only by untouched allowances or "
			           "reservations, memory no process holds, "
			           "nothing signalled",
			    "bytes=%llu allowance=%llu reserved=%llu "
			    "limit=%llu",
			    (unsigned long long)t->bytes,
			    (unsigned long long)t->allowance,
			    (unsigned long long)t->reserved,
			    (unsigned long long)t->limit);
		reg->lim->enforce_idle_logged = true;
		return;
	}

	struct mts_proc *best = NULL;
	uint64_t best_v = 0;
	uint64_t again =
	    grace > MTS_ENFORCE_AGAIN_MIN_NS ? grace : MTS_ENFORCE_AGAIN_MIN_NS;
	uint32_t self = (uint32_t)getpid();
	for (uint32_t i = 0; i < reg->ndense; i++) {
		struct mts_proc *p = reg->by_slot[reg->dense[i]];
		if (p->pid == self || p->pidfd < 0)
			continue;
		if (p->last_signal_ns && now_ns - p->last_signal_ns < again)
			continue;
		uint64_t v = enforce_figure(reg, p);
		if (p->state != MTSHM_STATE_OVER && !(p->limit && v > p->limit))
			continue;
		if (!best || v > best_v ||
		    (v == best_v && p->pid < best->pid)) {
			best = p;
			best_v = v;
		}
	}
	const char *sig = sigabbrev_np(pol->enforce_signal);
	if (!best) {
		if (!reg->lim->enforce_idle_logged)
			mts_log_scope(
			    "enforce", MTS_LOG_WARN,
			    "fleet over its limit past the grace period; no "
			    "process is over its own limit, nothing "
			    "signalled",
			    "signal=SIG%s grace_ms=%u bytes=%llu limit=%llu",
			    sig ? sig : "?", pol->grace_ms,
			    (unsigned long long)reg->totals.bytes,
			    (unsigned long long)reg->totals.limit);
		reg->lim->enforce_idle_logged = true;
		return;
	}
	char qc[MTS_LOGQ_MAX], qg[MTS_LOGQ_MAX];
	/* Not chosen again for a while either way. */
	best->last_signal_ns = now_ns;
	if (pidfd_send_signal(best->pidfd, pol->enforce_signal, NULL, 0) < 0) {
		/* Nothing was sent (it has just exited, or we may not): the
		 * grace period is not spent, the next tick chooses another. */
		mts_log(MTS_LOG_ERROR, "enforcement signal failed",
		        "pid=%u signal=SIG%s err=%s", best->pid,
		        sig ? sig : "?", strerror(errno));
		return;
	}
	/* One signal per grace period in all: let this one take effect
	 * before choosing another process. */
	reg->lim->fleet_over_since_ns = now_ns;
	reg->lim->enforcement_signals++;
	mts_log(MTS_LOG_WARN, "enforcement: signal sent",
	        "pid=%u comm=%s group=%s signal=SIG%s bytes=%llu rss=%llu "
	        "limit=%llu fleet_bytes=%llu fleet_reserved=%llu "
	        "fleet_limit=%llu grace_ms=%u",
	        best->pid, mts_logq(qc, sizeof(qc), best->comm),
	        mts_logq(qg, sizeof(qg), reg->groups[best->group].name),
	        sig ? sig : "?", (unsigned long long)best->bytes,
	        (unsigned long long)best->rss, (unsigned long long)best->limit,
	        (unsigned long long)reg->totals.bytes,
	        (unsigned long long)reg->totals.reserved,
	        (unsigned long long)reg->totals.limit, pol->grace_ms);
}

/* ---- the registry's rates ------------------------------------------------ */

uint64_t mts_growth_window_ns(const struct mts_registry *reg)
{
	uint32_t ms = reg->policy.growth_window_ms;
	return (uint64_t)(ms ? ms : MTS_DEFAULT_GROWTH_WINDOW_MS) * 1000000u;
}

uint64_t mts_fleet_value(const struct mts_registry *reg)
{
	const struct mts_totals *t = &reg->totals;
	return mt_sat_add(mts_measured(reg, t->bytes, t->rss), t->reserved);
}

uint64_t mts_group_value(const struct mts_registry *reg,
                         const struct mts_group *g)
{
	return mt_sat_add(mts_measured(reg, g->bytes, g->rss), g->reserved);
}

/* The distance is to what the state compares (reservations count as
 * used), the rate that of the measured figure alone: a grant is a step,
 * not growth. */
double mts_fleet_forecast(const struct mts_registry *reg)
{
	return mts_forecast_s(reg->totals.growth, mts_fleet_value(reg),
	                      reg->totals.limit);
}

double mts_group_forecast(const struct mts_registry *reg,
                          const struct mts_group *g)
{
	return mts_forecast_s(g->growth, mts_group_value(reg, g), g->limit);
}

double mts_proc_growth(const struct mts_registry *reg, const struct mts_proc *p)
{
	return mts_rate_get(&p->rate, mts_growth_window_ns(reg));
}

double mts_proc_forecast(const struct mts_registry *reg,
                         const struct mts_proc *p)
{
	return mts_forecast_s(mts_proc_growth(reg, p),
	                      mts_measured(reg, p->bytes, p->rss), p->limit);
}

void mts_rates_sample(struct mts_registry *reg, uint64_t now_ns)
{
	uint64_t w = mts_growth_window_ns(reg);
	struct mts_totals *t = &reg->totals;
	mts_wrate_add(&t->rate, now_ns, mts_measured(reg, t->bytes, t->rss), w);
	t->growth = mts_wrate_get(&t->rate, w);
	t->rate_ns = now_ns;
	for (uint32_t i = 0; i < reg->groups_used; i++) {
		struct mts_group *g = &reg->groups[i];
		if (!g->name)
			continue;
		mts_wrate_add(&g->rate, now_ns,
		              mts_measured(reg, g->bytes, g->rss), w);
		g->growth = mts_wrate_get(&g->rate, w);
	}
}
