/*
 * test_server_limits.c - limits and states: the hysteresis state machine
 * (a figure oscillating around any of its lines changes state exactly
 * once), fleet, group and process states as the tick computes them, the
 * header snapshot and slot flags, events, SetLimit with its authorisation,
 * policy reloads, RSS, and enforcement by signal.
 *
 * Workers are real forked children; counters are written straight into
 * their slots, as their client library would.
 */
#include "test_server_fixture.h"

#define OK   MTSHM_STATE_OK
#define HIGH MTSHM_STATE_HIGH
#define OVER MTSHM_STATE_OVER

/* limit 1000, high at 80%, hysteresis 5%: lines at 800, 1000 (over when
 * above), leave over below 950, leave high below 750. */
#define L 1000u
#define W 8000u
#define H 500u

Test(state, lines)
{
	cr_assert_eq(mts_state_next(OK, 799, L, W, H, false), OK);
	cr_assert_eq(mts_state_next(OK, 800, L, W, H, false), HIGH);
	cr_assert_eq(mts_state_next(OK, 1000, L, W, H, false), HIGH);
	cr_assert_eq(mts_state_next(OK, 1001, L, W, H, false), OVER);
	cr_assert_eq(mts_state_next(HIGH, 1000, L, W, H, false), HIGH);
	cr_assert_eq(mts_state_next(HIGH, 1001, L, W, H, false), OVER);
	cr_assert_eq(mts_state_next(OVER, 950, L, W, H, false), OVER);
	cr_assert_eq(mts_state_next(OVER, 949, L, W, H, false), HIGH);
	cr_assert_eq(mts_state_next(HIGH, 750, L, W, H, false), HIGH);
	cr_assert_eq(mts_state_next(HIGH, 749, L, W, H, false), OK);
	/* Both lower marks passed at once: straight to ok. */
	cr_assert_eq(mts_state_next(OVER, 0, L, W, H, false), OK);
	cr_assert_eq(mts_state_next(OVER, 749, L, W, H, false), OK);
	/* No limit: always ok. */
	cr_assert_eq(mts_state_next(OVER, UINT64_MAX, 0, W, H, false), OK);
	/* No hysteresis: the lines themselves. */
	cr_assert_eq(mts_state_next(OVER, 999, L, W, 0, false), HIGH);
	cr_assert_eq(mts_state_next(HIGH, 799, L, W, 0, false), OK);
	/* Tiny limits: 0 is below 95% of 1 byte. */
	cr_assert_eq(mts_state_next(OVER, 0, 1, W, H, false), OK);
	/* Exact on large limits (128-bit products). */
	uint64_t big = UINT64_C(4000000000000000000);
	cr_assert_eq(mts_state_next(OK, big / 10 * 8, big, W, H, false), HIGH);
	cr_assert_eq(mts_state_next(OK, big / 10 * 8 - 1, big, W, H, false),
	             OK);
}

/* Run `n` steps alternating a and b from state `s`; count changes. */
static int transitions(uint32_t s, uint64_t a, uint64_t b, int n, uint32_t *end)
{
	int changes = 0;
	for (int i = 0; i < n; i++) {
		uint32_t next =
		    mts_state_next(s, i % 2 ? b : a, L, W, H, false);
		changes += next != s;
		s = next;
	}
	*end = s;
	return changes;
}

Test(state, oscillation_changes_once)
{
	uint32_t end;
	/* Around the watermark, from ok. */
	cr_assert_eq(transitions(OK, 790, 810, 1000, &end), 1);
	cr_assert_eq(end, HIGH);
	/* Around the limit, from high. */
	cr_assert_eq(transitions(HIGH, 990, 1010, 1000, &end), 1);
	cr_assert_eq(end, OVER);
	/* Around the limit, from ok: ok -> high -> over, then no more. */
	cr_assert_eq(transitions(OK, 1010, 990, 1000, &end), 1);
	cr_assert_eq(end, OVER);
	/* Around the mark that leaves over. */
	cr_assert_eq(transitions(OVER, 955, 945, 1000, &end), 1);
	cr_assert_eq(end, HIGH);
	/* Around the mark that leaves high. */
	cr_assert_eq(transitions(HIGH, 755, 745, 1000, &end), 1);
	cr_assert_eq(end, OK);
	/* Without hysteresis the same wobble flaps: the reason it exists. */
	uint32_t s = HIGH;
	int flaps = 0;
	for (int i = 0; i < 100; i++) {
		uint32_t next =
		    mts_state_next(s, i % 2 ? 990 : 1010, L, W, 0, false);
		flaps += next != s;
		s = next;
	}
	cr_assert_eq(flaps, 100);
}

/* ---- the registry ------------------------------------------------------ */

static struct mts_policy pol;

static void policy_fleet(uint64_t fleet, uint32_t high_bp)
{
	mts_policy_defaults(&pol);
	pol.fleet_limit = fleet;
	pol.high_bp = high_bp;
}

static void stop(void)
{
	fx_stop();
	mts_policy_free(&pol);
}

TestSuite(limits, .fini = stop, .timeout = 30);

static int count_events(const char *scope)
{
	int n = 0;
	for (int i = 0; i < nevents; i++)
		n += strcmp(events[i].scope, scope) == 0;
	return n;
}

Test(limits, fleet_states_header_and_events)
{
	policy_fleet(10000, 8000); /* high at 8000, over above 10000 */
	fx_start_policy(&pol);
	struct mtshm_fleet f = fx_fleet();
	cr_assert_eq(f.limit, 10000, "limit published at start");
	cr_assert_eq(f.state, OK);

	pid_t a = fx_spawn();
	uint32_t sa = fx_register(a, "g", "");
	fx_write(sa, 8500);
	mts_core_tick(&srv.reg);
	f = fx_fleet();
	cr_assert_eq(f.state, HIGH);
	cr_assert_eq(f.bytes, 8500);
	cr_assert_eq(nevents, 1);
	cr_assert_str_eq(events[0].scope, "fleet");
	cr_assert_eq(events[0].previous, OK);
	cr_assert_eq(events[0].state, HIGH);
	cr_assert_eq(events[0].bytes, 8500);
	cr_assert_eq(events[0].limit, 10000);

	fx_write(sa, 11000);
	mts_core_tick(&srv.reg);
	cr_assert_eq(fx_fleet().state, OVER);
	cr_assert_eq(nevents, 2);
	cr_assert_eq(events[1].state, OVER);
	cr_assert_eq(events[1].previous, HIGH);

	/* Wobble around the limit for many ticks: no event. */
	for (int i = 0; i < 200; i++) {
		fx_write(sa, i % 2 ? 9900 : 10100);
		mts_core_tick(&srv.reg);
	}
	cr_assert_eq(nevents, 2, "flapping around the limit");
	cr_assert_eq(fx_fleet().state, OVER);

	/* The worker dies: back to ok, in one event. */
	fx_kill(a);
	mts_core_tick(&srv.reg);
	cr_assert_eq(fx_fleet().state, OK);
	cr_assert_eq(nevents, 3);
	cr_assert_eq(events[2].previous, OVER);
	cr_assert_eq(events[2].state, OK);

	/* Usage says the same. */
	Memtally__V1__Request req = MEMTALLY__V1__REQUEST__INIT;
	Memtally__V1__GetUsage q = MEMTALLY__V1__GET_USAGE__INIT;
	req.body_case = MEMTALLY__V1__REQUEST__BODY_GET_USAGE;
	req.get_usage = &q;
	struct mts_peer peer = fx_peer(getpid(), 1000);
	Memtally__V1__Response *r = fx_call(&peer, &req);
	cr_assert_eq(r->usage->fleet_limit, 10000);
	cr_assert_eq(r->usage->state, MEMTALLY__V1__STATE__STATE_OK);
	cr_assert_eq(r->usage->high_watermark_bytes, 8000);
	cr_assert_str_eq(r->usage->measure, "accounted");
	memtally__v1__response__free_unpacked(r, NULL);
}

Test(limits, reservations_count_towards_state)
{
	policy_fleet(10000, 8000);
	fx_start_policy(&pol);
	Memtally__V1__Response *r = fx_admit(1000, 9000, "", "", 0);
	cr_assert(r->admit_result->admitted);
	memtally__v1__response__free_unpacked(r, NULL);
	/* Before any tick: the grant itself moved the state. */
	struct mtshm_fleet f = fx_fleet();
	cr_assert_eq(f.reserved, 9000);
	cr_assert_eq(f.state, HIGH);
	cr_assert_eq(count_events("fleet"), 1);
}

Test(limits, group_state_with_own_watermark)
{
	policy_fleet(0, 9000);
	struct mts_group_policy gp = {
	    .name = "etl", .limit = 1000, .high_bp = 5000};
	pol.groups = &gp;
	pol.ngroups = 1;
	fx_start_policy(&pol);
	pol.groups = NULL; /* not ours to free */
	pol.ngroups = 0;

	/* A configured group exists with no process. */
	struct mts_group *g = mts_find_group(&srv.reg, "etl");
	cr_assert_not_null(g);
	cr_assert_eq(g->limit, 1000);

	pid_t a = fx_spawn(), b = fx_spawn();
	uint32_t sa = fx_register(a, "etl", "");
	uint32_t sb = fx_register(b, "web", "");
	fx_write(sa, 600); /* 60%: high at the group's own 50% */
	fx_write(sb, 5000);
	mts_core_tick(&srv.reg);
	g = mts_find_group(&srv.reg, "etl");
	cr_assert_eq(g->state, HIGH);
	cr_assert_eq(g->error_bytes, 1000, "threshold x 1 thread");
	cr_assert_eq(count_events("group:etl"), 1);
	cr_assert_eq(count_events("group:web"), 0, "no limit, no state");
	cr_assert_eq(count_events("fleet"), 0);

	fx_write(sa, 1200);
	mts_core_tick(&srv.reg);
	cr_assert_eq(mts_find_group(&srv.reg, "etl")->state, OVER);
	cr_assert_eq(count_events("group:etl"), 2);

	Memtally__V1__Request req = MEMTALLY__V1__REQUEST__INIT;
	Memtally__V1__GetUsage q = MEMTALLY__V1__GET_USAGE__INIT;
	q.scope_case = MEMTALLY__V1__GET_USAGE__SCOPE_GROUP;
	q.group = "etl";
	req.body_case = MEMTALLY__V1__REQUEST__BODY_GET_USAGE;
	req.get_usage = &q;
	struct mts_peer peer = fx_peer(getpid(), 1000);
	Memtally__V1__Response *r = fx_call(&peer, &req);
	cr_assert_eq(r->usage->group->limit, 1000);
	cr_assert_eq(r->usage->group->state, MEMTALLY__V1__STATE__STATE_OVER);
	cr_assert_eq(r->usage->group->high_watermark_bytes, 500);
	cr_assert_eq(r->usage->group->error_bytes, 1000);
	memtally__v1__response__free_unpacked(r, NULL);

	/* The last process leaves; the group stays (it has a limit). */
	fx_kill(a);
	mts_core_tick(&srv.reg);
	g = mts_find_group(&srv.reg, "etl");
	cr_assert_not_null(g);
	cr_assert_eq(g->state, OK);
	cr_assert_eq(g->processes, 0);
}

/* A server with no fleet limit, high at 90%, a process limit of 1000
 * bytes, and one process of group "g" in it: its slot (*pid: its pid). */
static uint32_t one_limited_process(pid_t *pid)
{
	policy_fleet(0, 9000);
	pol.process_limit = 1000;
	fx_start_policy(&pol);
	*pid = fx_spawn();
	return fx_register(*pid, "g", "");
}

Test(limits, process_over_its_limit_flags_slot)
{
	pid_t a;
	uint32_t sa = one_limited_process(&a);
	struct mtshm_slot_id *s = mts_slot(&srv.reg, sa);
	cr_assert_eq(s->limit, 1000, "limit published in the slot");
	fx_write(sa, 950); /* high: not an event for a process */
	mts_core_tick(&srv.reg);
	cr_assert_eq(nevents, 0);
	cr_assert_eq(s->flags & MTSHM_SLOT_OVER_LIMIT, 0);

	fx_write(sa, 1500);
	mts_core_tick(&srv.reg);
	cr_assert(s->flags & MTSHM_SLOT_OVER_LIMIT);
	cr_assert_eq(nevents, 1);
	char scope[32];
	snprintf(scope, sizeof(scope), "pid:%d", (int)a);
	cr_assert_str_eq(events[0].scope, scope);
	cr_assert_eq(events[0].state, OVER);

	Memtally__V1__Request req = MEMTALLY__V1__REQUEST__INIT;
	Memtally__V1__GetUsage q = MEMTALLY__V1__GET_USAGE__INIT;
	q.scope_case = MEMTALLY__V1__GET_USAGE__SCOPE_PID;
	q.pid = (uint32_t)a;
	req.body_case = MEMTALLY__V1__REQUEST__BODY_GET_USAGE;
	req.get_usage = &q;
	struct mts_peer peer = fx_peer(getpid(), 1000);
	Memtally__V1__Response *r = fx_call(&peer, &req);
	cr_assert(r->usage->process->over_limit);
	cr_assert_eq(r->usage->process->limit, 1000);
	cr_assert_eq(r->usage->process->state, MEMTALLY__V1__STATE__STATE_OVER);
	memtally__v1__response__free_unpacked(r, NULL);

	/* Still above limit x 95%: stays over. */
	fx_write(sa, 960);
	mts_core_tick(&srv.reg);
	cr_assert(s->flags & MTSHM_SLOT_OVER_LIMIT);
	fx_write(sa, 900);
	mts_core_tick(&srv.reg);
	cr_assert_eq(s->flags & MTSHM_SLOT_OVER_LIMIT, 0, "flag cleared");
	cr_assert_eq(nevents, 2);
	cr_assert_eq(events[1].previous, OVER);
	cr_assert_eq(events[1].state, HIGH);
}

/* Tick every 10 ms until the latest event tells `scope` over (within
 * 2 s), then `settle` ticks more: it is not told again. */
static void told_over_once(const char *scope, int settle)
{
	uint64_t end = mts_now_monotonic() + 2000000000u;
	while (strcmp(events[nevents - 1].scope, scope) != 0 ||
	       events[nevents - 1].state != OVER) {
		cr_assert_lt(mts_now_monotonic(), end, "over never told");
		usleep(10000);
		mts_core_tick(&srv.reg);
	}
	int told = nevents;
	for (int i = 0; i < settle; i++) {
		usleep(10000);
		mts_core_tick(&srv.reg);
	}
	cr_assert_eq(nevents, told, "told again");
}

Test(limits, a_flapping_process_sends_events_within_its_uids_budget)
{
	/* Over and back every tick, 300 times: the slot's flag follows each
	 * change, the Watch events stay within the uid's budget (a burst of
	 * 40, 20 a second), and the state it ends in is told once the budget
	 * allows. */
	pid_t a;
	uint32_t sa = one_limited_process(&a);
	struct mtshm_slot_id *s = mts_slot(&srv.reg, sa);
	char scope[32];
	snprintf(scope, sizeof(scope), "pid:%d", (int)a);
	uint64_t t0 = mts_now_monotonic();
	for (int i = 0; i < 150; i++) {
		fx_write(sa, 1500);
		mts_core_tick(&srv.reg);
		cr_assert(s->flags & MTSHM_SLOT_OVER_LIMIT);
		fx_write(sa, 0);
		mts_core_tick(&srv.reg);
		cr_assert_eq(s->flags & MTSHM_SLOT_OVER_LIMIT, 0);
	}
	double took = (double)(mts_now_monotonic() - t0) / 1e9;
	int n = count_events(scope);
	cr_assert_geq(n, 40, "%d events", n);
	cr_assert_leq(n, 40 + (int)(20 * took) + 1, "%d events in %.2f s", n,
	              took);
	/* It stays over: told within a token's time (50 ms), once. */
	fx_write(sa, 1500);
	mts_core_tick(&srv.reg);
	told_over_once(scope, 20);
	/* Alternate events: never two overs in a row. */
	int last = -1;
	for (int i = 0; i < nevents; i++) {
		if (strcmp(events[i].scope, scope) != 0)
			continue;
		cr_assert_neq((int)events[i].state, last, "event %d", i);
		last = (int)events[i].state == OVER ? OVER : -2;
	}
}

Test(limits, a_way_back_held_for_the_budget_is_told_after_a_quiet_change)
{
	/* Told over; its budget spent, its way back to high is held back
	 * (owed), then it goes from high to ok, which is no event of its
	 * own. That tick must still tell the change owed, or once nothing
	 * else is owed subscribers see it over until it exits. Found in
	 * review. */
	pid_t a;
	uint32_t sa = one_limited_process(&a);
	char scope[32];
	snprintf(scope, sizeof(scope), "pid:%d", (int)a);
	fx_write(sa, 1500);
	mts_core_tick(&srv.reg);
	cr_assert_eq(count_events(scope), 1);
	cr_assert_eq(events[nevents - 1].state, OVER);
	struct mts_proc *p = mts_find_pid(&srv.reg, (uint32_t)a);
	p->table->ev_tokens = 0; /* its uid's budget spent */
	p->table->ev_ns = mts_now_monotonic();
	fx_write(sa, 920); /* high: under its limit, over 90% of it */
	mts_core_tick(&srv.reg);
	cr_assert_eq(p->state, MTSHM_STATE_HIGH);
	cr_assert_eq(count_events(scope), 1, "told with no budget");
	fx_write(sa, 0);
	mts_core_tick(&srv.reg);
	cr_assert_eq(p->state, MTSHM_STATE_OK);
	/* The budget refills (a token in 50 ms): it is told, once. */
	uint64_t end = mts_now_monotonic() + 2000000000u;
	while (count_events(scope) < 2) {
		cr_assert_lt(mts_now_monotonic(), end,
		             "the way back never told");
		usleep(10000);
		mts_core_tick(&srv.reg);
	}
	cr_assert_eq(events[nevents - 1].state, OK);
	cr_assert_eq(events[nevents - 1].previous, OVER);
	for (int i = 0; i < 20; i++) {
		usleep(10000);
		mts_core_tick(&srv.reg);
	}
	cr_assert_eq(count_events(scope), 2, "told again");
}

Test(limits, a_flapping_group_sends_events_within_its_budget)
{
	/* A group's limit flipped under its figure 300 times by requests
	 * (as an Admit and a Release each move it): Watch hears at most a
	 * burst of 20 and 10 a second, the state it ends in is told once,
	 * and the group's own state follows every flip. */
	policy_fleet(0, 9000);
	fx_start_policy(&pol);
	pid_t a = fx_spawn();
	uint32_t sa = fx_register(a, "g", "");
	fx_write(sa, 1000);
	mts_core_tick(&srv.reg);
	nevents = 0;
	uint64_t prev, now;
	uint64_t t0 = mts_now_monotonic();
	for (int i = 0; i < 300; i++) {
		cr_assert_eq(mts_limit_set_group(&srv.reg, "g", i % 2 ? 0 : 500,
		                                 &prev, &now),
		             0);
		cr_assert_eq(mts_find_group(&srv.reg, "g")->state,
		             i % 2 ? OK : OVER);
	}
	double took = (double)(mts_now_monotonic() - t0) / 1e9;
	int n = count_events("group:g");
	cr_assert_geq(n, 20, "%d events", n);
	cr_assert_leq(n, 20 + (int)(10 * took) + 1, "%d events in %.2f s", n,
	              took);
	/* It ends over: told within a token's time (100 ms), once. */
	cr_assert_eq(mts_limit_set_group(&srv.reg, "g", 500, &prev, &now), 0);
	told_over_once("group:g", 30);
	/* Each event starts from the state the one before it said. */
	int last = OK;
	for (int i = 0; i < nevents; i++) {
		if (strcmp(events[i].scope, "group:g") != 0)
			continue;
		cr_assert_eq((int)events[i].previous, last, "event %d", i);
		cr_assert_neq((int)events[i].state, last, "event %d", i);
		last = (int)events[i].state;
	}
}

Test(limits, a_group_that_goes_says_ok_whatever_its_budget)
{
	/* A group told over, whose way back to ok its spent budget holds
	 * back, loses its entry (its member gone, its limit removed):
	 * subscribers hear it ok, not over for ever. */
	policy_fleet(0, 9000);
	fx_start_policy(&pol);
	pid_t a = fx_spawn();
	uint32_t sa = fx_register(a, "g", "");
	fx_write(sa, 1000);
	mts_core_tick(&srv.reg);
	uint64_t prev, now;
	cr_assert_eq(mts_limit_set_group(&srv.reg, "g", 500, &prev, &now), 0);
	cr_assert_eq(events[nevents - 1].state, OVER);
	struct mts_group *g = mts_find_group(&srv.reg, "g");
	g->told.tokens = 0; /* its budget spent */
	g->told.ns = mts_now_monotonic();
	fx_kill(a);
	mts_core_tick(&srv.reg);
	cr_assert_eq(g->state, OK);
	cr_assert_eq(g->told.state, OVER, "told at once: no budget spent");
	int before = nevents;
	cr_assert_eq(mts_limit_set_group(&srv.reg, "g", 0, &prev, &now), 0);
	cr_assert_null(mts_find_group(&srv.reg, "g"), "the entry stays");
	cr_assert_eq(nevents, before + 1);
	cr_assert_str_eq(events[nevents - 1].scope, "group:g");
	cr_assert_eq(events[nevents - 1].state, OK);
	cr_assert_eq(events[nevents - 1].previous, OVER);
}

Test(limits, set_limit_needs_authorisation)
{
	policy_fleet(0, 9000);
	pol.process_limit = 5000;
	fx_start_policy(&pol);
	pid_t a = fx_spawn();
	uint32_t sa = fx_register(a, "g", "");
	fx_write(sa, 3000);
	mts_core_tick(&srv.reg);

	/* Tests run as root: the server's uid is 0; uid 1000 is nobody
	 * special. */
	srv.reg.server_uid = 4242;
	struct mts_peer user = fx_peer(getpid(), 1000);
	fx_expect_error(fx_set_limit(&user,
	                             MEMTALLY__V1__SET_LIMIT__SCOPE_FLEET, NULL,
	                             0, 2000, NULL),
	                MEMTALLY__V1__ERROR_CODE__ERROR_PERMISSION_DENIED);
	cr_assert_eq(srv.reg.req->auth_denials, 1);
	cr_assert_eq(srv.reg.totals.limit, 0, "unchanged");

	/* The server's own uid may. */
	struct mts_peer self = fx_peer(getpid(), 4242);
	Memtally__V1__Response *r = fx_set_limit(
	    &self, MEMTALLY__V1__SET_LIMIT__SCOPE_FLEET, NULL, 0, 2000, NULL);
	cr_assert_null(r->error);
	cr_assert_eq(r->limit_set->bytes, 2000);
	cr_assert_eq(r->limit_set->previous, 0);
	memtally__v1__response__free_unpacked(r, NULL);
	/* Applied at once: state, header and event, with no tick. */
	struct mtshm_fleet f = fx_fleet();
	cr_assert_eq(f.limit, 2000);
	cr_assert_eq(f.state, OVER);
	cr_assert_eq(count_events("fleet"), 1);

	/* So may root and a configured admin uid. */
	srv.reg.policy.has_admin_uid = true;
	srv.reg.policy.admin_uid = 1000;
	r = fx_set_limit(&user, MEMTALLY__V1__SET_LIMIT__SCOPE_FLEET, NULL, 0,
	                 0, NULL);
	cr_assert_null(r->error);
	cr_assert_eq(r->limit_set->previous, 2000);
	memtally__v1__response__free_unpacked(r, NULL);
	cr_assert_eq(fx_fleet().state, OK);
	cr_assert_eq(count_events("fleet"), 2);

	struct mts_peer root = fx_peer(getpid(), 0);
	r = fx_set_limit(&root, MEMTALLY__V1__SET_LIMIT__SCOPE_GROUP, "g", 0,
	                 2500, NULL);
	cr_assert_null(r->error);
	memtally__v1__response__free_unpacked(r, NULL);
	cr_assert_eq(mts_find_group(&srv.reg, "g")->state, OVER);

	/* A pid: its own limit, then 0 falls back to the default. */
	r = fx_set_limit(&root, MEMTALLY__V1__SET_LIMIT__SCOPE_PID, NULL,
	                 (uint32_t)a, 1000, NULL);
	cr_assert_null(r->error);
	cr_assert_eq(r->limit_set->previous, 5000);
	cr_assert_eq(r->limit_set->bytes, 1000);
	memtally__v1__response__free_unpacked(r, NULL);
	cr_assert(mts_slot(&srv.reg, sa)->flags & MTSHM_SLOT_OVER_LIMIT);
	cr_assert_eq(mts_slot(&srv.reg, sa)->limit, 1000);
	r = fx_set_limit(&root, MEMTALLY__V1__SET_LIMIT__SCOPE_PID, NULL,
	                 (uint32_t)a, 0, NULL);
	cr_assert_eq(r->limit_set->bytes, 5000);
	memtally__v1__response__free_unpacked(r, NULL);
	cr_assert_eq(mts_slot(&srv.reg, sa)->flags & MTSHM_SLOT_OVER_LIMIT, 0);

	fx_expect_error(fx_set_limit(&root, MEMTALLY__V1__SET_LIMIT__SCOPE_PID,
	                             NULL, 1, 10, NULL),
	                MEMTALLY__V1__ERROR_CODE__ERROR_NOT_FOUND);
	fx_expect_error(fx_set_limit(&root,
	                             MEMTALLY__V1__SET_LIMIT__SCOPE_GROUP,
	                             "bad\x01name", 0, 10, NULL),
	                MEMTALLY__V1__ERROR_CODE__ERROR_INVALID_REQUEST);
}

Test(limits, set_limit_over_tcp_needs_token)
{
	policy_fleet(0, 9000);
	pol.tcp_token = strdup("0123456789abcdef-token");
	fx_start_policy(&pol);
	struct mts_peer tcp = {.fd = -1, .tcp = true};
	fx_expect_error(fx_set_limit(&tcp, MEMTALLY__V1__SET_LIMIT__SCOPE_FLEET,
	                             NULL, 0, 10, NULL),
	                MEMTALLY__V1__ERROR_CODE__ERROR_PERMISSION_DENIED);
	fx_expect_error(fx_set_limit(&tcp, MEMTALLY__V1__SET_LIMIT__SCOPE_FLEET,
	                             NULL, 0, 10, "0123456789abcdef-tokem"),
	                MEMTALLY__V1__ERROR_CODE__ERROR_PERMISSION_DENIED);
	Memtally__V1__Response *r =
	    fx_set_limit(&tcp, MEMTALLY__V1__SET_LIMIT__SCOPE_FLEET, NULL, 0,
	                 10, "0123456789abcdef-token");
	cr_assert_null(r->error);
	memtally__v1__response__free_unpacked(r, NULL);
	cr_assert_eq(srv.reg.totals.limit, 10);
}

Test(limits, policy_reload_applies_at_once)
{
	policy_fleet(10000, 9000);
	fx_start_policy(&pol);
	pid_t a = fx_spawn();
	uint32_t sa = fx_register(a, "etl", "");
	fx_write(sa, 6000);
	mts_core_tick(&srv.reg);
	cr_assert_eq(fx_fleet().state, OK);
	/* A runtime group limit, replaced by the reload. */
	uint64_t prev, now;
	cr_assert_eq(mts_limit_set_group(&srv.reg, "web", 77, &prev, &now), 0);
	cr_assert_not_null(mts_find_group(&srv.reg, "web"));

	struct mts_policy next;
	mts_policy_defaults(&next);
	next.fleet_limit = 5000;
	next.high_bp = 5000;
	next.process_limit = 4000;
	struct mts_group_policy gp = {.name = "etl", .limit = 7000};
	next.groups = &gp;
	next.ngroups = 1;
	cr_assert_eq(mts_server_apply_policy(&srv, &next), 0);
	/* The registry made its own copy. */
	cr_assert_neq(srv.reg.policy.groups, next.groups);
	struct mtshm_fleet f = fx_fleet();
	cr_assert_eq(f.limit, 5000);
	cr_assert_eq(f.state, OVER);
	cr_assert_eq(mts_find_group(&srv.reg, "etl")->limit, 7000);
	/* 6000 of 7000, high at the fleet's 50%: high. */
	cr_assert_eq(mts_find_group(&srv.reg, "etl")->state, HIGH);
	cr_assert_null(mts_find_group(&srv.reg, "web"),
	               "runtime group limit not replaced");
	struct mts_proc *p = mts_find_pid(&srv.reg, (uint32_t)a);
	cr_assert_eq(p->limit, 4000);
	cr_assert_eq(mts_slot(&srv.reg, sa)->limit, 4000);
	cr_assert(mts_slot(&srv.reg, sa)->flags & MTSHM_SLOT_OVER_LIMIT);
}

Test(limits, watch_answers_current_fleet_state)
{
	policy_fleet(100, 9000);
	fx_start_policy(&pol);
	Memtally__V1__Response *r = fx_admit(1000, 95, "", "", 0);
	memtally__v1__response__free_unpacked(r, NULL);
	Memtally__V1__Request req = MEMTALLY__V1__REQUEST__INIT;
	Memtally__V1__Watch w = MEMTALLY__V1__WATCH__INIT;
	req.id = 77;
	req.body_case = MEMTALLY__V1__REQUEST__BODY_WATCH;
	req.watch = &w;
	struct mts_peer peer = fx_peer(getpid(), 1000);
	r = fx_call(&peer, &req);
	cr_assert_eq(r->id, 77);
	cr_assert_str_eq(r->event->scope, "fleet");
	cr_assert_eq(r->event->state, MEMTALLY__V1__STATE__STATE_HIGH);
	cr_assert_eq(r->event->previous, MEMTALLY__V1__STATE__STATE_HIGH);
	cr_assert_eq(r->event->limit, 100);
	cr_assert_eq(r->event->reserved_bytes, 95);
	cr_assert_gt(r->event->time_ns, 0);
	memtally__v1__response__free_unpacked(r, NULL);
	cr_assert(peer.watching);
	cr_assert_eq(peer.watch_id, 77);
	cr_assert_eq(srv.reg.req->events, 1);
}

/* Watch(own): a guard's event for another uid's task of the same name
 * does not reach an admin's (root's) job runner, nor anyone's where every
 * uid's task events are shown; without it, both see it. */
/* What the event's workers descend from: the watching peer's process
 * (this one) where they are its command's. */
static uint32_t ev_anc[1];

static bool watch_sees(uint32_t uid, bool own, uint32_t ev_uid)
{
	Memtally__V1__Request req = MEMTALLY__V1__REQUEST__INIT;
	Memtally__V1__Watch w = MEMTALLY__V1__WATCH__INIT;
	w.own = own;
	req.id = 78;
	req.body_case = MEMTALLY__V1__REQUEST__BODY_WATCH;
	req.watch = &w;
	struct mts_peer peer = fx_peer(getpid(), uid);
	Memtally__V1__Response *r = fx_call(&peer, &req);
	memtally__v1__response__free_unpacked(r, NULL);
	cr_assert(peer.watching);
	struct mts_event ev = {.scope = "task:same",
	                       .state = MTSHM_STATE_OVER,
	                       .has_uid = true,
	                       .uid = ev_uid,
	                       .ancestors = ev_anc,
	                       .nancestors = 1};
	return mts_event_visible(&srv.reg, &peer, &ev);
}

Test(limits, a_watch_of_its_own_sees_no_other_uids_task)
{
	policy_fleet(0, 9000);
	pol.show_others = MTS_SHOW_ALL;
	fx_start_policy(&pol);
	cr_assert(watch_sees(0, false, 1000), "root sees every uid's");
	cr_assert_not(watch_sees(0, true, 1000), "root, own: not uid 1000's");
	cr_assert(watch_sees(0, true, 0), "root, own: its own");
	cr_assert(watch_sees(2000, false, 1000), "show_others = all");
	cr_assert_not(watch_sees(2000, true, 1000), "own: not uid 1000's");
	cr_assert(watch_sees(1000, true, 1000), "own: its own");
	/* Events of no uid (the fleet, groups) still come. */
	struct mts_peer peer = fx_peer(getpid(), 2000);
	peer.watching = peer.watch_own = true;
	struct mts_event fleet = {.scope = "fleet", .state = MTSHM_STATE_OK};
	cr_assert(mts_event_visible(&srv.reg, &peer, &fleet));
	/* A peer of no uid (TCP, an admin by the token) holds the tasks
	 * reserved without an owner: none yet, so not uid 1000's "same". */
	struct mts_peer tcp = fx_peer(getpid(), 0);
	tcp.has_cred = false;
	tcp.watching = tcp.watch_own = tcp.watch_admin = true;
	struct mts_event other = {.scope = "task:same",
	                          .state = MTSHM_STATE_OVER,
	                          .has_uid = true,
	                          .uid = 1000};
	cr_assert_not(mts_event_visible(&srv.reg, &tcp, &other));
	tcp.watch_own = false;
	cr_assert(mts_event_visible(&srv.reg, &tcp, &other), "admin: all");
	tcp.watch_own = true;

	/* Workers of uid 1000 that descend from the watching process (its
	 * command switched user) are its own, whoever it is, where it may
	 * see uid 1000's events at all; workers that merely took the name
	 * are not, even while it holds a reservation of that task. */
	ev_anc[0] = (uint32_t)getpid();
	cr_assert(watch_sees(0, true, 1000), "root's command run as uid 1000");
	cr_assert(watch_sees(2000, true, 1000), "show_others = all");
	Memtally__V1__Response *r = fx_admit(0, 1000, "", "same", 0);
	cr_assert(r->admit_result->admitted);
	memtally__v1__response__free_unpacked(r, NULL);
	ev_anc[0] = (uint32_t)getppid();
	cr_assert_not(watch_sees(0, true, 1000), "not root's command");
	ev_anc[0] = (uint32_t)getpid();
	/* Where other uids' task events are not shown, not even its own
	 * command's (a non-admin cannot switch user without root's help). */
	srv.reg.policy.show_others = MTS_SHOW_COUNTS;
	cr_assert_not(watch_sees(2000, true, 1000), "counts: not uid 1000's");
	cr_assert(watch_sees(0, true, 1000), "root, counts: its command's");
	srv.reg.policy.show_others = MTS_SHOW_ALL;
	/* A TCP peer known by its address (sock_diag) has a uid but no
	 * process to ask: root's, holding a reservation of "same" that uid
	 * 1000 holds none of, sees uid 1000's task of that name. */
	struct mts_peer local = fx_peer(0, 0);
	local.tcp = true;
	local.watching = local.watch_own = local.watch_admin = true;
	other.ancestors = ev_anc;
	other.nancestors = 1;
	ev_anc[0] = (uint32_t)getppid();
	cr_assert(mts_event_visible(&srv.reg, &local, &other),
	          "local TCP: root's reservation of it");
	local.uid = 2000;
	cr_assert_not(mts_event_visible(&srv.reg, &local, &other),
	              "local TCP: uid 2000 holds none");
	local.uid = 0;
	r = fx_admit(1000, 1000, "", "same", 0);
	cr_assert(r->admit_result->admitted);
	memtally__v1__response__free_unpacked(r, NULL);
	cr_assert_not(mts_event_visible(&srv.reg, &local, &other),
	              "local TCP: uid 1000 holds one of its own");
}

Test(limits, rss_is_read_summed_and_measurable)
{
	policy_fleet(0, 9000);
	fx_start_policy(&pol);
	pid_t a = fx_spawn(), b = fx_spawn();
	fx_register(a, "g", "");
	fx_register(b, "g", "");
	/* Nothing until a sweep, which reads on a thread of its own. */
	struct mts_proc *pa = mts_find_pid(&srv.reg, (uint32_t)a);
	cr_assert_eq(pa->rss, 0);
	mts_rss_sweep_start(&srv.reg);
	cr_assert_not_null(srv.reg.rss->sweep);
	/* Applied by the tick's poll (the rss timer starts the next). */
	FX_RUN_UNTIL(
	    (mts_rss_poll(&srv.reg, mts_now_monotonic()), !srv.reg.rss->sweep));
	pa = mts_find_pid(&srv.reg, (uint32_t)a);
	struct mts_proc *pb = mts_find_pid(&srv.reg, (uint32_t)b);
	cr_assert_gt(pa->rss, 0);
	mts_core_tick(&srv.reg);
	cr_assert_eq(srv.reg.totals.rss, pa->rss + pb->rss);
	cr_assert_eq(mts_find_group(&srv.reg, "g")->rss, pa->rss + pb->rss);

	/* measure = rss: a 1-byte limit is passed by any resident set. */
	uint64_t prev, now;
	srv.reg.policy.measure = MTS_MEASURE_RSS;
	cr_assert_eq(mts_limit_set_fleet(&srv.reg, 1, &prev, &now), 0);
	cr_assert_eq(fx_fleet().state, OVER);
	/* accounted bytes are 0: under accounted it is ok again. */
	srv.reg.policy.measure = MTS_MEASURE_ACCOUNTED;
	cr_assert_eq(mts_limit_set_fleet(&srv.reg, 1, &prev, &now), 0);
	cr_assert_eq(fx_fleet().state, OK);
	srv.reg.policy.measure = MTS_MEASURE_MAX;
	cr_assert_eq(mts_measured(&srv.reg, 5, 9), 9);
	cr_assert_eq(mts_measured(&srv.reg, 9, 5), 9);

	/* An exit takes its RSS out of the sums at once. */
	fx_kill(a);
	cr_assert_eq(srv.reg.totals.rss, pb->rss);
}

/* Lane 0's free sample: the allocator held `heap` + `free` then. */
static void free_sample(uint32_t slot, uint64_t seq, uint64_t free,
                        uint64_t heap)
{
	struct mtshm_lane *l = mtshm_lane(mts_slot(&srv.reg, slot), 0);
	l->free_bytes = (int64_t)free;
	l->free_heap = (int64_t)heap;
	mtshm_store_relaxed64(&l->free_seq, seq);
}

/* A tick, then `p`'s free part and figure. */
static void tick_expect(const struct mts_proc *p, uint64_t free, uint64_t bytes)
{
	mts_core_tick(&srv.reg);
	cr_assert_eq(p->allocator_free, free, "free %llu MiB",
	             (unsigned long long)(p->allocator_free / MIB));
	cr_assert_eq(p->bytes, bytes, "figure %llu MiB",
	             (unsigned long long)(p->bytes / MIB));
}

/* A worker's allocator free memory, counted from its last sample, counts
 * only as far as the kernel's resident figure leaves room for it, an
 * untrusted one's too (a glibc worker's malloc_trim gives pages back that
 * glibc's own figures still hold). */
Test(limits, allocator_free_counts_as_far_as_it_is_resident)
{
	policy_fleet(0, 9000);
	fx_start_policy(&pol);
	pid_t a = fx_spawn(), b = fx_spawn_as(2000);
	uint32_t sa = fx_register(a, "g", "");
	uint32_t sb = fx_register_as(b, 2000, "g", "");
	struct mts_proc *pa = mts_find_pid(&srv.reg, (uint32_t)a);
	struct mts_proc *pb = mts_find_pid(&srv.reg, (uint32_t)b);
	cr_assert_not(pa->untrusted);
	cr_assert(pb->untrusted);
	/* Both held 300 MiB at their sample, and freed 200 since. */
	uint32_t slots[] = {sa, sb};
	for (int i = 0; i < 2; i++) {
		free_sample(slots[i], 2, 0, 300 * MIB);
		fx_write(slots[i], (int64_t)(100 * MIB));
	}
	mts_core_tick(&srv.reg);
	/* No resident figure yet: the sample stands. */
	cr_assert_eq(pa->bytes, 300 * MIB);
	cr_assert_eq(pa->allocator_free, 200 * MIB);
	/* The kernel says 150 MiB are resident: 50 of the 200 are. */
	mts_proc_set_rss(&srv.reg, pa, 150 * MIB);
	mts_proc_set_rss(&srv.reg, pb, 150 * MIB);
	tick_expect(pa, 50 * MIB, 150 * MIB);
	cr_assert_eq(fx_fleet().allocator_free, 50 * MIB + pb->allocator_free);
	cr_assert_eq(pb->bytes, 150 * MIB, "an untrusted worker's free part is "
	                                   "bounded by the kernel's read too");
	/* The heap grows by 80 MiB before the next read: fresh pages the read
	 * could not see are not taken from the free memory's room. */
	fx_write(sa, (int64_t)(180 * MIB));
	tick_expect(pa, 50 * MIB, 230 * MIB);
	/* The next read finds the allocator kept them all. */
	mts_proc_set_rss(&srv.reg, pa, 310 * MIB);
	tick_expect(pa, 120 * MIB, 300 * MIB);
	/* It grows to 400 MiB and frees all of it before the next read: the
	 * allocator may keep every page the read did not see. */
	fx_write(sa, (int64_t)(400 * MIB));
	tick_expect(pa, 0, 400 * MIB);
	fx_write(sa, 0);
	tick_expect(pa, 400 * MIB, 400 * MIB);
	/* A read after the free finds 20 MiB resident: what it says. */
	mts_proc_set_rss(&srv.reg, pa, 20 * MIB);
	tick_expect(pa, 20 * MIB, 20 * MIB);
}

Test(limits, enforcement_signals_largest_over_its_own_limit)
{
	policy_fleet(3000, 9000);
	pol.process_limit = 1000;
	pol.enforce_signal = SIGTERM;
	pol.grace_ms = 60000;
	fx_start_policy(&pol);
	pid_t a = fx_spawn(), b = fx_spawn(), c = fx_spawn();
	uint32_t sa = fx_register(a, "g", "");
	uint32_t sb = fx_register(b, "g", "");
	uint32_t sc = fx_register(c, "g", "");
	fx_write(sa, 1200); /* over its own limit */
	fx_write(sb, 1500); /* over its own limit, the largest */
	fx_write(sc, 900);  /* within */
	mts_core_tick(&srv.reg);
	cr_assert_eq(srv.reg.totals.state, OVER);
	/* Within the grace period: nothing. */
	cr_assert_eq(srv.reg.lim->enforcement_signals, 0);
	/* The grace period has passed. */
	srv.reg.lim->fleet_over_since_ns -= 61000ull * 1000000ull;
	mts_core_tick(&srv.reg);
	cr_assert_eq(srv.reg.lim->enforcement_signals, 1);
	int st;
	cr_assert_eq(waitpid(b, &st, 0), b);
	cr_assert(WIFSIGNALED(st) && WTERMSIG(st) == SIGTERM);
	for (int i = 0; i < nkids; i++)
		if (kids[i] == b)
			kids[i] = kids[--nkids];
	/* The grace period started again: no second signal yet, even
	 * though a is over its own limit too. */
	mts_core_tick(&srv.reg);
	cr_assert_eq(srv.reg.lim->enforcement_signals, 1);
	cr_assert_eq(kill(a, 0), 0);
}

Test(limits, enforcement_leaves_processes_within_their_limits)
{
	policy_fleet(1000, 9000);
	pol.process_limit = 5000;
	pol.enforce_signal = SIGTERM;
	pol.grace_ms = 0;
	fx_start_policy(&pol);
	pid_t a = fx_spawn(), b = fx_spawn();
	fx_write(fx_register(a, "g", ""), 900);
	fx_write(fx_register(b, "g", ""), 900);
	for (int i = 0; i < 5; i++)
		mts_core_tick(&srv.reg);
	cr_assert_eq(srv.reg.totals.state, OVER);
	cr_assert_eq(srv.reg.lim->enforcement_signals, 0);
	cr_assert_eq(kill(a, 0), 0);
	cr_assert_eq(kill(b, 0), 0);
}

Test(limits, enforcement_off_by_default)
{
	policy_fleet(1000, 9000);
	pol.process_limit = 100;
	pol.grace_ms = 0;
	fx_start_policy(&pol);
	pid_t a = fx_spawn();
	fx_write(fx_register(a, "g", ""), 5000);
	for (int i = 0; i < 5; i++)
		mts_core_tick(&srv.reg);
	cr_assert_eq(srv.reg.totals.state, OVER);
	cr_assert_eq(srv.reg.lim->enforcement_signals, 0);
	cr_assert_eq(kill(a, 0), 0);
}

Test(limits, tick_stats)
{
	policy_fleet(0, 9000);
	fx_start_policy(&pol);
	mts_core_tick(&srv.reg);
	mts_core_tick(&srv.reg);
	cr_assert_eq(srv.reg.tick->count, 2);
	cr_assert_geq(srv.reg.tick->sum_ns, srv.reg.tick->last_ns);
	pid_t a = fx_spawn();
	fx_register(a, "g", "");
	cr_assert_eq(srv.reg.stats.registrations, 1);
	fx_kill(a);
	cr_assert_eq(srv.reg.stats.reclaims, 1);
}

Test(limits, process_leaving_while_over_is_an_event)
{
	policy_fleet(0, 9000);
	pol.process_limit = 1000;
	fx_start_policy(&pol);
	pid_t a = fx_spawn(), b = fx_spawn();
	fx_write(fx_register(a, "g", ""), 5000);
	fx_write(fx_register(b, "g", ""), 10);
	mts_core_tick(&srv.reg);
	cr_assert_eq(nevents, 1);
	fx_kill(b); /* within its limit: nothing to say */
	cr_assert_eq(nevents, 1);
	fx_kill(a);
	cr_assert_eq(nevents, 2);
	char scope[32];
	snprintf(scope, sizeof(scope), "pid:%d", (int)a);
	cr_assert_str_eq(events[1].scope, scope);
	cr_assert_eq(events[1].previous, OVER);
	cr_assert_eq(events[1].state, OK);
}
