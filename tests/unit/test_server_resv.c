/*
 * test_server_resv.c - the structures behind reservations (admit.c): the
 * index by id, the heap by expiry and the sums kept up to date as
 * reservations come and go. Many reservations released in random order;
 * and a randomized differential test: after every Admit, Release, change
 * of a task's use and expiry, the figures must equal a recomputation from
 * scratch by the rule admit.c states (each task's use set against its
 * reservations oldest first, each taking only from the workers that may
 * count against it: its owner's and admins', or anyone's when it was made
 * over TCP; a reservation counts what is left of it; the sums saturate),
 * and the reservations left must be exactly those a model of the rules
 * predicts. Workers and admitting peers of several uids, an admin among
 * them, so that ownership is part of every step.
 */
#include "test_server_fixture.h"

static struct mts_policy pol;

static void stop(void)
{
	fx_stop();
	mts_policy_free(&pol);
}

TestSuite(resv, .fini = stop, .timeout = 120);

static void start(void)
{
	mts_policy_defaults(&pol);
	pol.fleet_limit = 0;
	pol.default_ttl_s = 1000;
	pol.max_ttl_s = 100000;
	/* Thousands of reservations of one uid: these tests are about the
	 * structures, not the per-uid cap (test_server_admit.c). */
	pol.max_resv_per_uid = 0;
	fx_start_policy(&pol);
	srv.reg.server_uid = 4242; /* the test runs as root */
}

static uint64_t sat(uint64_t a, uint64_t b)
{
	return a + b < a ? UINT64_MAX : a + b;
}

static uint64_t rnd(void)
{
	return ((uint64_t)(unsigned)rand() << 33) ^
	       ((uint64_t)(unsigned)rand() << 11) ^ (unsigned)rand();
}

/* The structures agree with each other and the figures with a brute-force
 * recomputation (the O(reservations) computation admit.c used to run on
 * every request). */
static void check(const struct mts_registry *reg)
{
	uint32_t n = reg->adm->nresv;
	cr_assert_eq(reg->totals.reservations, n);
	uint32_t in_ids = 0;
	if (reg->adm->resv_ids)
		for (uint32_t i = 0; i <= reg->adm->resv_ids_mask; i++)
			in_ids += reg->adm->resv_ids[i] != NULL;
	cr_assert_eq(in_ids, n, "index holds %u of %u", in_ids, n);
	for (uint32_t i = 0; i < n; i++) {
		const struct mts_resv *r = reg->adm->resv[i];
		cr_assert_eq(r->index, i);
		cr_assert_eq(mts_resv_find(reg, r->id), r, "%s not found",
		             r->id);
		/* Every reservation has a deadline: its TTL, or max_ttl
		 * from its grant once a worker took it over. */
		cr_assert_neq(r->heap_index, UINT32_MAX);
		uint32_t s = r->taken_over ? reg->policy.max_ttl_s : r->ttl_s;
		cr_assert_eq(r->expires_ns,
		             r->created_mono_ns + (uint64_t)s * 1000000000u);
	}
	cr_assert_eq(reg->adm->resv_nheap, n);
	for (uint32_t i = 0; i < reg->adm->resv_nheap; i++) {
		const struct mts_resv *r = reg->adm->resv_heap[i];
		cr_assert_eq(r->heap_index, i);
		if (i > 0)
			cr_assert_leq(
			    reg->adm->resv_heap[(i - 1) / 2]->expires_ns,
			    r->expires_ns, "heap order");
	}

	/* Brute force: what each reservation counts, from the figures of
	 * the latest tick: [0] admins' workers, [1] others', then owners'. */
	static uint64_t want[MTS_RESV_MAX];
	for (uint32_t i = 0; i < n; i++)
		want[i] = reg->adm->resv[i]->bytes;
	uint32_t in_tasks = 0;
	if (reg->adm->tasks)
		for (uint32_t b = 0; b <= reg->adm->tasks_mask; b++)
			for (const struct mts_task *t = reg->adm->tasks[b]; t;
			     t = t->hnext) {
				cr_assert_not_null(t->resv, "task kept empty");
				cr_assert_geq(t->nshares, 2u);
				uint64_t left[64];
				cr_assert_leq(t->nshares, 64u);
				for (uint32_t i = 0; i < t->nshares; i++)
					left[i] = t->shares[i].measured;
				for (const struct mts_resv *r = t->resv; r;
				     r = r->tnext) {
					uint64_t need = r->bytes;
					for (uint32_t i = 0; i < t->nshares;
					     i++) {
						/* Admins' ([0]) last. */
						uint32_t k =
						    (i + 1) % t->nshares;
						const struct mts_task_share
						    *sh = &t->shares[k];
						bool may = k == 0 ||
						           !r->has_owner ||
						           (k >= 2 &&
						            sh->uid == r->uid);
						if (!may)
							continue;
						uint64_t u = left[k] < need
						                 ? left[k]
						                 : need;
						left[k] -= u;
						need -= u;
					}
					want[r->index] = need;
					in_tasks++;
				}
				/* One share per owner uid, counting its
				 * reservations of the task. */
				for (uint32_t i = 2; i < t->nshares; i++) {
					uint32_t k = 0;
					for (const struct mts_resv *r = t->resv;
					     r; r = r->tnext)
						k += r->has_owner &&
						     r->uid == t->shares[i].uid;
					cr_assert_eq(k, t->shares[i].resv);
				}
				for (const struct mts_resv *r = t->resv; r;
				     r = r->tnext) {
					bool found = !r->has_owner;
					for (uint32_t i = 2; i < t->nshares;
					     i++)
						found |=
						    t->shares[i].uid == r->uid;
					cr_assert(found,
					          "owner %u has no share",
					          r->uid);
				}
			}
	/* ... and the sums, saturating. */
	static uint64_t group_want[1024];
	cr_assert_lt(reg->groups_used, 1024u);
	memset(group_want, 0, sizeof(group_want));
	uint64_t total = 0;
	uint32_t with_task = 0;
	for (uint32_t i = 0; i < n; i++) {
		const struct mts_resv *r = reg->adm->resv[i];
		with_task += r->task != NULL;
		if (r->task)
			cr_assert_eq(r->effective, want[i],
			             "%s counts %llu, not %llu", r->id,
			             (unsigned long long)r->effective,
			             (unsigned long long)want[i]);
		group_want[r->group] = sat(group_want[r->group], want[i]);
		total = sat(total, want[i]);
	}
	cr_assert_eq(in_tasks, with_task);
	cr_assert_eq(reg->totals.reserved, total, "fleet %llu, not %llu",
	             (unsigned long long)reg->totals.reserved,
	             (unsigned long long)total);
	for (uint32_t g = 0; g < reg->groups_used; g++)
		if (reg->groups[g].name)
			cr_assert_eq(
			    reg->groups[g].reserved, group_want[g],
			    "group %s: %llu, not %llu", reg->groups[g].name,
			    (unsigned long long)reg->groups[g].reserved,
			    (unsigned long long)group_want[g]);
}

Test(resv, many_released_in_random_order)
{
	start();
	enum { N = 10000 };
	static char ids[N][MTS_RESV_ID_LEN + 1];
	static uint64_t bytes[N];
	struct mts_peer peer = fx_peer(getpid(), 1000);
	uint64_t sum = 0;
	srand(7);
	for (int i = 0; i < N; i++) {
		struct mts_admit_out out;
		bytes[i] = 1 + rnd() % 100000;
		struct mts_admit_req req = {.bytes = bytes[i],
		                            .group = i % 3 ? "a" : "b"};
		cr_assert_eq(mts_admit(&srv.reg, &peer, &req, &out), 0);
		cr_assert(out.admitted);
		memcpy(ids[i], out.id, sizeof(ids[i]));
		sum += bytes[i];
	}
	cr_assert_eq(srv.reg.totals.reserved, sum);
	check(&srv.reg);
	/* Ids are unique: each finds its own reservation. */
	for (int i = 0; i < N; i++) {
		const struct mts_resv *r = mts_resv_find(&srv.reg, ids[i]);
		cr_assert_not_null(r);
		cr_assert_str_eq(r->id, ids[i]);
		cr_assert_eq(r->bytes, bytes[i]);
	}
	/* Shuffle, release all; a released id is gone, the others stay. */
	int order[N];
	for (int i = 0; i < N; i++)
		order[i] = i;
	for (int i = N - 1; i > 0; i--) {
		int j = rand() % (i + 1), t = order[i];
		order[i] = order[j];
		order[j] = t;
	}
	for (int k = 0; k < N; k++) {
		int i = order[k];
		uint64_t b = 0;
		cr_assert_eq(mts_release(&srv.reg, &peer, ids[i], NULL, &b), 0);
		cr_assert_eq(b, bytes[i]);
		sum -= b;
		cr_assert_eq(srv.reg.totals.reserved, sum);
		cr_assert_null(mts_resv_find(&srv.reg, ids[i]));
		cr_assert_eq(mts_release(&srv.reg, &peer, ids[i], NULL, &b),
		             -ENOENT);
		if (k % 997 == 0) {
			check(&srv.reg);
			for (int m = k + 1; m < N; m++)
				cr_assert_not_null(
				    mts_resv_find(&srv.reg, ids[order[m]]));
		}
	}
	check(&srv.reg);
	cr_assert_eq(srv.reg.adm->nresv, 0);
	cr_assert_eq(srv.reg.adm->resv_nheap, 0);
	cr_assert_null(mts_find_group(&srv.reg, "a"));
	cr_assert_null(mts_find_group(&srv.reg, "b"));
}

/* A server holding MTS_RESV_MAX reservations denies the next Admit as
 * any denial is answered (reservations_full, scope "server", the fleet's
 * figures, counted), not as a failure; a Release makes room again. */
Test(resv, a_full_table_denies_and_a_release_makes_room)
{
	start();
	struct mts_peer peer = fx_peer(getpid(), 1000);
	static char first[MTS_RESV_ID_LEN + 1];
	for (uint32_t i = 0; i < MTS_RESV_MAX; i++) {
		struct mts_admit_out out;
		struct mts_admit_req req = {.bytes = 4096, .group = "a"};
		cr_assert_eq(mts_admit(&srv.reg, &peer, &req, &out), 0);
		cr_assert(out.admitted, "%u: %s", i, out.why);
		if (i == 0)
			memcpy(first, out.id, sizeof(first));
	}
	cr_assert_eq(srv.reg.adm->nresv, MTS_RESV_MAX);
	uint64_t before = srv.reg.adm->stats.denials[MTS_DENY_FULL];
	Memtally__V1__Response *r = fx_admit(1000, 4096, "a", "", 0);
	cr_assert_null(r->error, "answered as an error: %s",
	               r->error ? r->error->message : "");
	cr_assert_not(r->admit_result->admitted);
	cr_assert_str_eq(r->admit_result->denied_by, "reservations_full");
	cr_assert_str_eq(r->admit_result->limit_scope, "server");
	cr_assert_eq(r->admit_result->reserved_bytes,
	             (uint64_t)MTS_RESV_MAX * 4096);
	cr_assert_eq(r->admit_result->requested_bytes, 4096);
	cr_assert(strstr(r->admit_result->reason, "65536"), "%s",
	          r->admit_result->reason);
	memtally__v1__response__free_unpacked(r, NULL);
	cr_assert_eq(srv.reg.adm->stats.denials[MTS_DENY_FULL], before + 1);
	cr_assert_eq(srv.reg.adm->nresv, MTS_RESV_MAX);
	uint64_t b = 0;
	cr_assert_eq(mts_release(&srv.reg, &peer, first, NULL, &b), 0);
	r = fx_admit(1000, 4096, "a", "", 0);
	cr_assert_null(r->error);
	cr_assert(r->admit_result->admitted, "%s", r->admit_result->reason);
	memtally__v1__response__free_unpacked(r, NULL);
}

/* The reservations' record: taken, then restored into a new server, it
 * gives back every reservation with its id, owner, group, task, kind,
 * bytes and TTL, and the same figures; an id already held, a record of
 * another boot and a damaged one restore nothing. */
Test(resv, a_record_restores_what_was_granted)
{
	start();
	struct mts_peer p1 = fx_peer(getpid(), 1000);
	struct mts_peer p2 = fx_peer(getpid(), 2000);
	struct mts_peer tcp = fx_peer(0, 0);
	tcp.has_cred = false;
	tcp.tcp = true;
	struct {
		struct mts_peer *peer;
		struct mts_admit_req req;
		char id[MTS_RESV_ID_LEN + 1];
	} g[] = {
	    {&p1,
	     {.bytes = 10 * MIB, .group = "a", .task = "t1", .kind = "k"},
	     ""},
	    {&p2, {.bytes = 20 * MIB, .group = "b", .ttl_s = 90}, ""},
	    {&tcp, {.bytes = 5 * MIB, .task = "t2"}, ""},
	};
	enum { N = sizeof(g) / sizeof(g[0]) };
	for (int i = 0; i < N; i++) {
		struct mts_admit_out out;
		cr_assert_eq(mts_admit(&srv.reg, g[i].peer, &g[i].req, &out),
		             0);
		cr_assert(out.admitted, "%d: %s", i, out.why);
		memcpy(g[i].id, out.id, sizeof(g[i].id));
	}
	cr_assert(srv.reg.adm->resv_dirty, "a grant marks the record stale");
	uint64_t reserved = srv.reg.totals.reserved;
	unsigned char *d;
	size_t len;
	cr_assert_eq(mts_resv_encode(&srv.reg, &d, &len), 0);
	fx_stop();

	start();
	uint32_t kept, dropped;
	/* Taken on the loop without its checksum: refused until sealed. */
	cr_assert_eq(mts_resv_restore(&srv.reg, d, len, false, &kept, &dropped),
	             -EINVAL);
	cr_assert_eq(kept, 0);
	mts_record_seal(d, len);
	cr_assert_eq(mts_resv_restore(&srv.reg, d, len, false, &kept, &dropped),
	             0);
	cr_assert_eq(kept, N);
	cr_assert_eq(dropped, 0);
	cr_assert_eq(srv.reg.totals.reserved, reserved);
	cr_assert_eq(srv.reg.totals.reservations, N);
	for (int i = 0; i < N; i++) {
		const struct mts_resv *r = mts_resv_find(&srv.reg, g[i].id);
		cr_assert_not_null(r, "%s not restored", g[i].id);
		cr_assert_eq(r->bytes, g[i].req.bytes);
		cr_assert_eq(r->has_owner, g[i].peer->has_cred);
		if (r->has_owner)
			cr_assert_eq(r->uid, g[i].peer->uid);
		cr_assert_str_eq(srv.reg.groups[r->group].name,
		                 g[i].req.group ? g[i].req.group : "default");
		cr_assert_str_eq(r->task ? r->task->name : "",
		                 g[i].req.task ? g[i].req.task : "");
		cr_assert_str_eq(r->kind ? r->kind->name : "",
		                 g[i].req.kind ? g[i].req.kind : "");
		cr_assert_eq(r->ttl_s, g[i].req.ttl_s ? g[i].req.ttl_s
		                                      : pol.default_ttl_s);
	}
	check(&srv.reg);
	cr_assert_eq(mts_uid_count_get(&srv.reg.adm->resv_uids, 1000), 1);
	cr_assert_eq(mts_uid_count_get(&srv.reg.adm->resv_uids, 2000), 1);
	/* Its owner may release it, as before the restart. */
	uint64_t b = 0;
	cr_assert_eq(mts_release(&srv.reg, &p2, g[1].id, NULL, &b), 0);
	cr_assert_eq(b, 20 * MIB);

	/* Again: the ids held are refused, the released one comes back. */
	cr_assert_eq(mts_resv_restore(&srv.reg, d, len, false, &kept, &dropped),
	             0);
	cr_assert_eq(kept, 1);
	cr_assert_eq(dropped, N - 1);
	cr_assert_eq(srv.reg.totals.reservations, N);

	/* Another boot's record: nothing restored, and no error. */
	fx_stop();
	start();
	d[32] ^= 0xff; /* the boot id, after magic, version, count, sizes */
	cr_assert_eq(mts_resv_restore(&srv.reg, d, len, false, &kept, &dropped),
	             0);
	cr_assert_eq(kept, 0);
	cr_assert_eq(dropped, N);
	d[32] ^= 0xff;
	/* A byte of the payload changed: refused whole. */
	d[len - 1] ^= 1;
	cr_assert_eq(mts_resv_restore(&srv.reg, d, len, false, &kept, &dropped),
	             -EINVAL);
	cr_assert_eq(srv.reg.totals.reservations, 0);
	cr_assert_eq(
	    mts_resv_restore(&srv.reg, d, len - 1, false, &kept, &dropped),
	    -EINVAL);
	free(d);
}

/* A record of the first version (no hosts: each reservation 72 bytes
 * shorter, before its names) restores as it did. */
Test(resv, a_version_1_record_still_restores)
{
	start();
	struct mts_peer p = fx_peer(getpid(), 1000);
	struct mts_admit_req req = {.bytes = 10 * MIB};
	struct mts_admit_out out;
	cr_assert_eq(mts_admit(&srv.reg, &p, &req, &out), 0);
	cr_assert(out.admitted, "%s", out.why);
	unsigned char *d;
	size_t len;
	cr_assert_eq(mts_resv_encode(&srv.reg, &d, &len), 0);
	/* Header (48 bytes), one reservation, its group "default". */
	enum { HDR = 48, HOST = 72, NAME = 7 };
	size_t rec = len - HDR - NAME;
	cr_assert_gt(rec, HOST);
	unsigned char *v1 = malloc(len - HOST);
	cr_assert_not_null(v1);
	memcpy(v1, d, HDR + rec - HOST);
	memcpy(v1 + HDR + rec - HOST, d + HDR + rec, NAME);
	uint32_t version = 1;
	uint64_t payload = rec - HOST + NAME;
	memcpy(v1 + 8, &version, sizeof(version));
	memcpy(v1 + 16, &payload, sizeof(payload));
	mts_record_seal(v1, len - HOST);
	fx_stop();
	start();
	uint32_t kept, dropped;
	cr_assert_eq(
	    mts_resv_restore(&srv.reg, v1, len - HOST, false, &kept, &dropped),
	    0);
	cr_assert_eq(kept, 1);
	const struct mts_resv *r = mts_resv_find(&srv.reg, out.id);
	cr_assert_not_null(r);
	cr_assert_eq(r->bytes, 10 * MIB);
	cr_assert_not(r->hosted);
	cr_assert_str_eq(srv.reg.groups[r->group].name, "default");
	free(v1);
	free(d);
}

/* A task's use counts against its reservations oldest first: restored,
 * they keep that order, though the table they are kept in lost it when
 * one before them ended. */
Test(resv, a_record_keeps_a_tasks_reservations_in_order)
{
	start();
	struct mts_peer p = fx_peer(getpid(), 1000);
	const char *tasks[] = {"", "t", "t"};
	char ids[3][MTS_RESV_ID_LEN + 1];
	for (int i = 0; i < 3; i++) {
		struct mts_admit_out out;
		struct mts_admit_req req = {.bytes = (uint64_t)(i + 1) * MIB,
		                            .task = tasks[i]};
		cr_assert_eq(mts_admit(&srv.reg, &p, &req, &out), 0);
		cr_assert(out.admitted);
		memcpy(ids[i], out.id, sizeof(ids[i]));
	}
	/* The first ends: the table moves the newest into its place. */
	uint64_t b;
	cr_assert_eq(mts_release(&srv.reg, &p, ids[0], NULL, &b), 0);
	cr_assert_str_eq(srv.reg.adm->resv[0]->id, ids[2]);
	unsigned char *d;
	size_t len;
	cr_assert_eq(mts_resv_encode(&srv.reg, &d, &len), 0);
	mts_record_seal(d, len);
	fx_stop();
	start();
	uint32_t kept, dropped;
	cr_assert_eq(mts_resv_restore(&srv.reg, d, len, false, &kept, &dropped),
	             0);
	cr_assert_eq(kept, 2);
	const struct mts_resv *older = mts_resv_find(&srv.reg, ids[1]);
	cr_assert_not_null(older);
	cr_assert_eq(older->task->resv, older, "the older is not first");
	cr_assert_str_eq(older->tnext->id, ids[2]);
	free(d);
}

Test(resv, expiry_in_order_of_deadline_not_of_admission)
{
	start();
	struct mts_peer peer = fx_peer(getpid(), 1000);
	uint32_t ttls[] = {50, 10, 40, 20, 30, 10};
	for (unsigned i = 0; i < 6; i++) {
		struct mts_admit_out out;
		struct mts_admit_req req = {.bytes = 1u << i, .ttl_s = ttls[i]};
		cr_assert_eq(mts_admit(&srv.reg, &peer, &req, &out), 0);
	}
	uint64_t now = mts_now_monotonic();
	mts_resv_tick(&srv.reg, now + 5000000000ull);
	cr_assert_eq(srv.reg.totals.reserved, 63);
	mts_resv_tick(&srv.reg, now + 15000000000ull);
	cr_assert_eq(srv.reg.totals.reserved, 63 - 2 - 32);
	mts_resv_tick(&srv.reg, now + 35000000000ull);
	cr_assert_eq(srv.reg.totals.reserved, 1 + 4);
	check(&srv.reg);
	mts_resv_tick(&srv.reg, now + 60000000000ull);
	cr_assert_eq(srv.reg.adm->nresv, 0);
	cr_assert_eq(srv.reg.adm->stats.expirations, 6);
	check(&srv.reg);
}

/* The model: what the test admitted and not yet seen end. */
struct model {
	char id[MTS_RESV_ID_LEN + 1];
	uint64_t bytes;
	uint64_t expires_ns;
	int task;  /* -1: none */
	int owner; /* index in owners[] */
};

/* Right after a tick: each task's shares hold exactly its live workers'
 * figures, sorted by uid (root and the server's uid are the admins). */
static void check_shares(struct mts_registry *reg)
{
	if (!reg->adm->tasks)
		return;
	for (uint32_t b = 0; b <= reg->adm->tasks_mask; b++)
		for (const struct mts_task *t = reg->adm->tasks[b]; t;
		     t = t->hnext) {
			uint64_t measured[64] = {0};
			uint32_t live[64] = {0};
			for (uint32_t i = 0; i < reg->ndense; i++) {
				const struct mts_proc *p =
				    reg->by_slot[reg->dense[i]];
				if (strcmp(p->task, t->name) != 0)
					continue;
				uint32_t k = 1;
				if (p->uid == 0 || p->uid == reg->server_uid)
					k = 0;
				else
					for (uint32_t j = 2; j < t->nshares;
					     j++)
						if (t->shares[j].uid == p->uid)
							k = j;
				measured[k] += p->bytes;
				live[k]++;
			}
			for (uint32_t k = 0; k < t->nshares; k++) {
				cr_assert_eq(t->shares[k].live, live[k],
				             "%s share %u", t->name, k);
				cr_assert_eq(t->shares[k].measured, measured[k],
				             "%s share %u", t->name, k);
			}
		}
}

Test(resv, randomized_against_brute_force)
{
	start();
	enum { STEPS = 12000, WORKERS = 5, TASKS = 5, GROUPS = 5, OWNERS = 3 };
	static struct model m[MTS_RESV_MAX];
	uint32_t nm = 0;
	static const char *groups[GROUPS] = {"", "g0", "g1", "g2", "g3"};
	static const char *tasks[TASKS] = {"T0", "T1", "T2", "T3", "T4"};
	/* Workers live throughout: T0 has one of uid 1000 and one of 1001,
	 * T1 one of 1001, T2 one of root (an admin), T3 one of 1002 (who
	 * admits nothing), T4 none. */
	static const struct {
		uint32_t uid;
		int task;
	} workers[WORKERS] = {
	    {1000, 0}, {1001, 0}, {1001, 1}, {0, 2}, {1002, 3}};
	/* Who admits: uid 1000, uid 1001, and a TCP peer (no owner). */
	struct mts_peer owners[OWNERS] = {fx_peer(getpid(), 1000),
	                                  fx_peer(getpid(), 1001),
	                                  {.fd = -1, .tcp = true}};
	/* A reservation is taken over (never expires) when a worker of its
	 * task is its owner's or an admin's, or it has no owner. */
	bool taken[TASKS][OWNERS] = {{0}};
	for (int t = 0; t < TASKS; t++)
		for (int o = 0; o < OWNERS; o++)
			for (int w = 0; w < WORKERS; w++)
				if (workers[w].task == t &&
				    (o == 2 || workers[w].uid == 0 ||
				     workers[w].uid == owners[o].uid))
					taken[t][o] = true;
	cr_assert(taken[0][0] && taken[0][1] && taken[1][1] && !taken[1][0]);
	cr_assert(taken[2][0] && taken[3][2] && !taken[3][0] && !taken[4][2]);
	uint32_t slot[WORKERS];
	for (int w = 0; w < WORKERS; w++)
		slot[w] =
		    fx_register_as(fx_spawn(), workers[w].uid,
		                   groups[1 + w % 4], tasks[workers[w].task]);
	struct mts_peer root = fx_peer(getpid(), 0);
	uint64_t clock = mts_now_monotonic();
	unsigned seed = 20261129;
	srand(seed);
	uint64_t admits = 0, releases = 0, expiries = 0;
	uint32_t most = 0;
	for (int step = 0; step < STEPS; step++) {
		unsigned op = (unsigned)rand() % 100;
		if (op < 50 || nm == 0) {
			struct mts_admit_out out;
			int t = rand() % (TASKS + 2) - 2;
			int o = rand() % OWNERS;
			uint64_t b = rand() % 50 == 0 ? UINT64_MAX / 3
			                              : 1 + rnd() % 5000;
			struct mts_admit_req req = {
			    .bytes = b,
			    .group = groups[rand() % GROUPS],
			    .task = t < 0 ? "" : tasks[t],
			    .ttl_s = 1000 + (uint32_t)(rand() % 100)};
			cr_assert_eq(
			    mts_admit(&srv.reg, &owners[o], &req, &out), 0);
			cr_assert(out.admitted);
			const struct mts_resv *r =
			    mts_resv_find(&srv.reg, out.id);
			cr_assert_not_null(r);
			memcpy(m[nm].id, out.id, sizeof(m[nm].id));
			m[nm].bytes = b;
			m[nm].expires_ns = r->expires_ns;
			m[nm].task = t;
			m[nm].owner = o;
			nm++;
			admits++;
		} else if (op < 80) {
			uint32_t i = (uint32_t)rand() % nm;
			uint64_t b = 0;
			cr_assert_eq(
			    mts_release(&srv.reg, &root, m[i].id, NULL, &b), 0);
			cr_assert_eq(b, m[i].bytes);
			m[i] = m[--nm];
			releases++;
		} else if (op < 85) {
			char id[MTS_RESV_ID_LEN + 1];
			uint64_t b;
			snprintf(id, sizeof(id), "r-%016llx",
			         (unsigned long long)rnd());
			cr_assert_eq(mts_release(&srv.reg, &root, id, NULL, &b),
			             -ENOENT);
		} else if (op < 95) {
			/* A worker's use changes; a real tick (nothing is due
			 * yet by the real clock). */
			fx_write(slot[rand() % WORKERS], rand() % 12000);
			mts_core_tick(&srv.reg);
			check_shares(&srv.reg);
		} else {
			clock += (uint64_t)(rand() % 30) * 1000000000ull;
			mts_resv_tick(&srv.reg, clock);
			for (uint32_t i = 0; i < nm;) {
				bool t = m[i].task >= 0 &&
				         taken[m[i].task][m[i].owner];
				if (!t && m[i].expires_ns <= clock) {
					m[i] = m[--nm];
					expiries++;
				} else {
					i++;
				}
			}
		}
		cr_assert_eq(srv.reg.adm->nresv, nm, "step %d (seed %u)", step,
		             seed);
		for (uint32_t i = 0; i < nm; i++)
			cr_assert_not_null(mts_resv_find(&srv.reg, m[i].id),
			                   "step %d: %s lost", step, m[i].id);
		check(&srv.reg);
		if (nm > most)
			most = nm;
	}
	cr_assert_eq(srv.reg.adm->stats.expirations, expiries);
	cr_assert_gt(most, 200, "too few outstanding at once: %u", most);
	cr_assert_gt(expiries, 100);
	cr_assert_gt(releases, 1000);
	cr_assert_gt(admits, 1000);

	/* The incremental figures equal a recomputation by admit.c too. */
	uint64_t fleet = srv.reg.totals.reserved;
	mts_resv_sums(&srv.reg);
	cr_assert_eq(srv.reg.totals.reserved, fleet);
	check(&srv.reg);
}
