/*
 * kinds.c - kinds and their learned sizes.
 *
 * A kind is what runs again and again: a Slurm job name, a Celery task
 * name, a Dask key prefix, a build step. Admission (admit.c) records the
 * peak of each finished task of a kind. It sizes the next task's
 * reservation from the recent peaks, because what people declare is
 * usually well above what they use.
 *
 * Sizes are kept per (kind, uid), not per kind. A kind name is a label
 * anyone can put in an Admit. If runs of all uids were pooled, one user's
 * tasks, or its lies, would size another user's reservations. Per uid, a
 * uid sizes only its own, and its lies can only cost itself. The peak is
 * of what counts toward others: for an untrusted process, the kernel's
 * figure plus a bounded allowance (vouch.c). A claim the kernel does not
 * back thus neither inflates nor shrinks even its own kind beyond that
 * allowance.
 *
 * The estimator is the `quantile` (p95) of the peaks of the last `window`
 * (64) runs no older than `horizon` (7 days), plus `margin` (10%). It is a
 * moving-window percentile like Autopilot's recommender (EuroSys 2020),
 * rather than Kubernetes VPA's decaying histogram. A task's runs are few,
 * tens rather than the per-second samples VPA decays. A quantile of 64
 * numbers is exact, where a histogram's buckets are 10% wide. Aging by
 * count and age forgets a kind that changed as surely as a half-life
 * does. An evicted run that had grown past what the finished runs learn
 * counts at 1.5 times its peak, because it was still growing when it was
 * ended, so its real peak is higher than the one seen. One evicted within
 * it was ended for the node's sake and does not count.
 *
 * Each kind costs its name plus a struct mts_kind of under 3 KiB, most of
 * it MTS_KIND_RUNS runs. The default max_kinds of 4096 thus holds about
 * 12 MiB. A run's end costs a store into the ring. An Admit costs a hash
 * lookup. The estimate is cached, so an Admit sorts at most 64 numbers,
 * and only when a run came since the last estimate or the oldest run it
 * used aged out.
 */
#include "mts_kinds.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <libgen.h>
#include <limits.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "mts_auth.h"
#include "mts_defs.h"
#include "mts_log.h"
#include "mts_registry.h"
#include "mts_state.h"

/* ---- the table ----------------------------------------------------------- */

static uint64_t kind_hash(const char *name, uint32_t uid)
{
	uint64_t h = UINT64_C(0xcbf29ce484222325); /* FNV-1a, then the uid */
	for (const char *s = name; *s; s++) {
		h ^= (unsigned char)*s;
		h *= UINT64_C(0x100000001b3);
	}
	h ^= (uint64_t)uid * UINT64_C(0x9e3779b97f4a7c15);
	h ^= h >> 31;
	return h;
}

struct mts_kind *mts_kind_find(const struct mts_registry *reg, const char *kind,
                               uint32_t uid)
{
	const struct mts_kinds *ks = reg->kinds;
	if (!ks || !ks->tab || !kind || !kind[0])
		return NULL;
	uint64_t h = kind_hash(kind, uid);
	struct mts_kind *k = ks->tab[h & ks->mask];
	while (k && (k->hash != h || k->uid != uid || strcmp(k->name, kind)))
		k = k->hnext;
	return k;
}

static int table_grow(struct mts_kinds *ks)
{
	uint32_t n = ks->tab ? (ks->mask + 1) * 2 : 64;
	struct mts_kind **t = calloc(n, sizeof(*t));
	if (!t)
		return -ENOMEM;
	if (ks->tab) {
		for (uint32_t i = 0; i <= ks->mask; i++) {
			struct mts_kind *k = ks->tab[i];
			while (k) {
				struct mts_kind *next = k->hnext;
				k->hnext = t[k->hash & (n - 1)];
				t[k->hash & (n - 1)] = k;
				k = next;
			}
		}
		free(ks->tab);
	}
	ks->tab = t;
	ks->mask = n - 1;
	return 0;
}

/* A new, empty kind (name, uid), counted against its uid. */
static struct mts_kind *kind_new(struct mts_kinds *ks, const char *name,
                                 uint32_t uid)
{
	if ((!ks->tab || ks->n >= 2 * (ks->mask + 1)) && table_grow(ks) < 0)
		return NULL;
	struct mts_kind *k = calloc(1, sizeof(*k));
	if (!k)
		return NULL;
	k->name = strdup(name);
	if (!k->name || mts_uid_count_add(&ks->per_uid, uid) < 0) {
		free(k->name);
		free(k);
		return NULL;
	}
	k->uid = uid;
	k->hash = kind_hash(name, uid);
	k->hnext = ks->tab[k->hash & ks->mask];
	ks->tab[k->hash & ks->mask] = k;
	ks->n++;
	return k;
}

/* `k` was made or run by a peer exempt from max_kinds_per_uid: from now
 * on it counts against max_kinds only, not against its uid. */
static void kind_set_capless(struct mts_kinds *ks, struct mts_kind *k)
{
	if (k->capless)
		return;
	k->capless = true;
	mts_uid_count_sub(&ks->per_uid, k->uid);
}

static void kind_drop(struct mts_kinds *ks, struct mts_kind *k)
{
	struct mts_kind **pp = &ks->tab[k->hash & ks->mask];
	while (*pp && *pp != k)
		pp = &(*pp)->hnext;
	if (*pp)
		*pp = k->hnext;
	if (!k->capless)
		mts_uid_count_sub(&ks->per_uid, k->uid);
	ks->n--;
	free(k->name);
	free(k);
}

void mts_kinds_free(struct mts_registry *reg)
{
	struct mts_kinds *ks = reg->kinds;
	if (!ks)
		return;
	if (ks->tab) {
		for (uint32_t i = 0; i <= ks->mask; i++) {
			struct mts_kind *k = ks->tab[i];
			while (k) {
				struct mts_kind *next = k->hnext;
				free(k->name);
				free(k);
				k = next;
			}
		}
		free(ks->tab);
	}
	mts_uid_counts_free(&ks->per_uid);
	memset(ks, 0, sizeof(*ks));
}

/* ---- caps ---------------------------------------------------------------- */

int mts_kind_may_create(const struct mts_registry *reg, uint32_t uid,
                        bool admin, char *why, size_t whylen, char *scope,
                        size_t scopelen)
{
	const struct mts_policy *pol = &reg->policy;
	const struct mts_kinds *ks = reg->kinds;
	uint32_t held = mts_uid_count_get(&ks->per_uid, uid);
	if (!admin && pol->kinds_per_uid && held >= pol->kinds_per_uid) {
		if (uid == MTS_UID_TCP) {
			snprintf(scope, scopelen, "tcp");
			snprintf(why, whylen,
			         "per-uid kinds: unidentified TCP peers keep "
			         "%u kinds, the most one uid may ([kinds] "
			         "max_kinds_per_uid = %u)",
			         held, pol->kinds_per_uid);
		} else {
			snprintf(scope, scopelen, "uid:%u", uid);
			snprintf(why, whylen,
			         "per-uid kinds: uid %u keeps %u kinds, the "
			         "most one uid may ([kinds] max_kinds_per_uid "
			         "= %u); reuse a kind or wait for old ones to "
			         "age out ([kinds] horizon)",
			         uid, held, pol->kinds_per_uid);
		}
		return -EDQUOT;
	}
	if (ks->n >= pol->kinds_max) {
		snprintf(scope, scopelen, "kinds");
		snprintf(why, whylen,
		         "server kinds: the server keeps %u kinds, the most it "
		         "may ([kinds] max_kinds = %u); no kind of another "
		         "uid is dropped to make room",
		         ks->n, pol->kinds_max);
		return -ENOSPC;
	}
	return 0;
}

int mts_kind_ref(struct mts_registry *reg, const char *kind, uint32_t uid,
                 bool capless, struct mts_kind **out)
{
	struct mts_kind *k = mts_kind_find(reg, kind, uid);
	if (!k)
		k = kind_new(reg->kinds, kind, uid);
	if (!k)
		return -ENOMEM;
	/* Run under the exemption once, it may have been made past the
	 * cap: a trim must not take it for one made within it. */
	if (capless)
		kind_set_capless(reg->kinds, k);
	k->outstanding++;
	*out = k;
	return 0;
}

void mts_kind_unref(struct mts_registry *reg, struct mts_kind *k)
{
	if (k->outstanding > 0)
		k->outstanding--;
	if (k->outstanding == 0 && k->nruns == 0)
		kind_drop(reg->kinds, k);
}

/* ---- runs ---------------------------------------------------------------- */

static void kind_add_run(struct mts_kind *k, const struct mts_kind_run *run)
{
	k->runs[k->head] = *run;
	k->head = (k->head + 1) % MTS_KIND_RUNS;
	if (k->nruns < MTS_KIND_RUNS)
		k->nruns++;
	k->runs_total++;
	if (run->evicted)
		k->evictions++;
	k->est_valid = false;
}

void mts_kind_note_run(struct mts_registry *reg, const char *kind, uint32_t uid,
                       const struct mts_kind_run *run)
{
	struct mts_kinds *ks = reg->kinds;
	if (!ks || !kind || !kind[0] || !mt_name_ok(kind))
		return;
	struct mts_kind *k = mts_kind_find(reg, kind, uid);
	if (!k) {
		char why[256] = "out of memory", scope[32], q[MTS_LOGQ_MAX];
		bool admin = uid != MTS_UID_TCP && mts_uid_is_admin(reg, uid);
		if (mts_kind_may_create(reg, uid, admin, why, sizeof(why),
		                        scope, sizeof(scope)) < 0 ||
		    !(k = kind_new(ks, kind, uid))) {
			ks->runs_dropped++;
			mts_log_uid(uid, MTS_LOG_WARN,
			            "run not recorded: its kind cannot be kept",
			            "kind=%s uid=%u peak=%llu why=\"%s\"",
			            mts_logq(q, sizeof(q), kind), uid,
			            (unsigned long long)run->peak, why);
			return;
		}
	}
	struct mts_kind_run r = *run;
	r.end_s = mts_now_realtime() / 1000000000u;
	r.evicted = run->evicted ? 1u : 0u;
	kind_add_run(k, &r);
	ks->runs_recorded++;
	if (r.evicted)
		ks->evictions++;
	ks->dirty = true;
}

/* ---- the estimate -------------------------------------------------------- */

static uint64_t add_bp(uint64_t v, uint32_t bp)
{
	unsigned __int128 r =
	    (unsigned __int128)v * (MTS_BP_ONE + bp) / MTS_BP_ONE;
	return r > UINT64_MAX ? UINT64_MAX : (uint64_t)r;
}

/* Nearest rank: the smallest of the sorted v[0..n) at or above `bp`. */
static uint64_t quantile(uint64_t *v, uint32_t n, uint32_t bp)
{
	qsort(v, n, sizeof(v[0]), mt_cmp_u64);
	uint64_t rank = ((uint64_t)bp * n + MTS_BP_ONE - 1) / MTS_BP_ONE;
	return v[(rank < 1 ? 1 : rank) - 1];
}

/*
 * The profile from the runs `use[0..n)` that have a length and were not
 * evicted (an evicted run was cut short: its length and shape are not
 * the kind's). Each step is the quantile of the runs' shares of their
 * own peak in that step, applied to the learned size; the length is
 * their mean length, over which admission lays the steps.
 */
static void estimate_profile(const struct mts_policy *pol,
                             const struct mts_kind_run *const *use, uint32_t n,
                             uint64_t bytes, struct mts_kind_profile *out)
{
	uint64_t v[MTS_KIND_RUNS];
	memset(out, 0, sizeof(*out));
	if (!n)
		return;
	uint64_t total = 0;
	for (uint32_t i = 0; i < n; i++) {
		v[i] = use[i]->dur_ms;
		total += v[i];
	}
	out->mean_ms = total / n ? (uint32_t)(total / n) : 1;
	for (uint32_t j = 0; j < MTS_KIND_STEPS; j++) {
		unsigned __int128 sum = 0;
		for (uint32_t i = 0; i < n; i++) {
			v[i] = use[i]->steps[j];
			sum += (unsigned __int128)use[i]->peak * v[i] /
			       MTS_KIND_STEP_ONE;
		}
		uint64_t share = quantile(v, n, pol->kind_quantile_bp);
		out->bytes[j] = (uint64_t)((unsigned __int128)bytes * share /
		                           MTS_KIND_STEP_ONE);
		uint64_t mean = (uint64_t)(sum / n);
		out->mean[j] = mean < out->bytes[j] ? mean : out->bytes[j];
	}
	out->known = true;
}

int mts_kind_estimate(const struct mts_registry *reg, struct mts_kind *k,
                      uint64_t now_s, uint64_t *bytes, uint32_t *runs)
{
	const struct mts_policy *pol = &reg->policy;
	uint32_t key[4] = {pol->kind_quantile_bp, pol->kind_margin_bp,
	                   pol->kind_window, pol->kind_horizon_s};
	if (!k->est_valid || now_s >= k->est_until_s ||
	    memcmp(key, k->est_key, sizeof(key)) != 0) {
		uint64_t v[MTS_KIND_RUNS], cut[MTS_KIND_RUNS];
		const struct mts_kind_run *shaped[MTS_KIND_RUNS];
		uint32_t n = 0, ns = 0, nc = 0;
		uint64_t until = UINT64_MAX;
		uint32_t window =
		    pol->kind_window ? pol->kind_window : MTS_KIND_RUNS;
		for (uint32_t i = 0; i < k->nruns && i < window; i++) {
			const struct mts_kind_run *r =
			    &k->runs[(k->head + MTS_KIND_RUNS - 1 - i) %
			             MTS_KIND_RUNS];
			uint64_t dies = r->end_s + pol->kind_horizon_s;
			if (dies <= now_s)
				continue;
			if (dies < until)
				until = dies;
			if (r->evicted) {
				cut[nc++] = r->peak;
				continue;
			}
			v[n++] = r->peak;
			if (r->dur_ms)
				shaped[ns++] = r;
		}
		/* An evicted run was cut short: its real peak is unknown
		 * but at least the one it reached. Past what the finished
		 * runs learn, it outgrew its kind and counts at 1.5 times
		 * that peak. Within it, it was ended for the node's sake,
		 * not its own, and says nothing the finished runs do not:
		 * counted, one eviction would raise a kind's size by half
		 * for its next 64 runs. */
		uint64_t finished =
		    n ? add_bp(quantile(v, n, pol->kind_quantile_bp),
		               pol->kind_margin_bp)
		      : 0;
		for (uint32_t i = 0; i < nc; i++)
			if (!n || cut[i] > finished)
				v[n++] = add_bp(cut[i], MTS_BP_ONE / 2);
		k->est_runs = n;
		k->est_bytes = 0;
		if (n)
			k->est_bytes =
			    add_bp(quantile(v, n, pol->kind_quantile_bp),
			           pol->kind_margin_bp);
		estimate_profile(pol, shaped, ns, k->est_bytes, &k->est_prof);
		k->est_until_s = until;
		memcpy(k->est_key, key, sizeof(key));
		k->est_valid = true;
	}
	if (!k->est_runs)
		return -ENOENT;
	*bytes = k->est_bytes;
	*runs = k->est_runs;
	return 0;
}

int mts_kind_profile_for(const struct mts_registry *reg, const char *kind,
                         uint32_t uid, struct mts_kind_profile *out)
{
	struct mts_kind *k = mts_kind_find(reg, kind, uid);
	uint64_t b;
	uint32_t runs;
	if (!k ||
	    mts_kind_estimate(reg, k, mts_now_realtime() / 1000000000u, &b,
	                      &runs) < 0 ||
	    !k->est_prof.known)
		return -ENOENT;
	*out = k->est_prof;
	return 0;
}

static void fmt_bp(char *buf, size_t len, uint32_t bp)
{
	if (bp % 100 == 0)
		snprintf(buf, len, "%u", bp / 100);
	else if (bp % 10 == 0)
		snprintf(buf, len, "%u.%u", bp / 100, (bp % 100) / 10);
	else
		snprintf(buf, len, "%u.%02u", bp / 100, bp % 100);
}

void mts_kind_method(const struct mts_policy *pol, uint32_t runs, char *buf,
                     size_t len)
{
	char q[16], m[16];
	fmt_bp(q, sizeof(q), pol->kind_quantile_bp);
	fmt_bp(m, sizeof(m), pol->kind_margin_bp);
	snprintf(buf, len, "p%s of %u run%s + %s%%", q, runs,
	         runs == 1 ? "" : "s", m);
}

static void learned_why(const struct mts_policy *pol, const char *kind,
                        uint64_t bytes, uint32_t runs, char *why, size_t whylen)
{
	if (!why || !whylen)
		return;
	char sz[32], method[64], q[16], m[16];
	mt_format_size(sz, sizeof(sz), bytes);
	mts_kind_method(pol, runs, method, sizeof(method));
	fmt_bp(q, sizeof(q), pol->kind_quantile_bp);
	fmt_bp(m, sizeof(m), pol->kind_margin_bp);
	snprintf(why, whylen, "%s: p%s of %u run%s of kind %.*s + %s%%", sz, q,
	         runs, runs == 1 ? "" : "s", 128, kind, m);
}

int mts_kind_learned_for(const struct mts_registry *reg, const char *kind,
                         uint32_t uid, uint64_t *bytes, char *why,
                         size_t whylen)
{
	struct mts_kind *k = mts_kind_find(reg, kind, uid);
	uint32_t runs;
	uint64_t now_s = mts_now_realtime() / 1000000000u;
	if (!k || mts_kind_estimate(reg, k, now_s, bytes, &runs) < 0)
		return -ENOENT;
	learned_why(&reg->policy, kind, *bytes, runs, why, whylen);
	return 0;
}

int mts_kind_learned(const struct mts_registry *reg, const char *kind,
                     uint64_t *bytes, char *why, size_t whylen)
{
	const struct mts_kinds *ks = reg->kinds;
	if (!ks || !ks->tab || !kind || !kind[0])
		return -ENOENT;
	uint64_t now_s = mts_now_realtime() / 1000000000u;
	uint64_t best = 0;
	uint32_t best_runs = 0;
	bool found = false;
	for (uint32_t i = 0; i <= ks->mask; i++)
		for (struct mts_kind *k = ks->tab[i]; k; k = k->hnext) {
			uint64_t b;
			uint32_t runs;
			if (strcmp(k->name, kind) != 0 ||
			    mts_kind_estimate(reg, k, now_s, &b, &runs) < 0)
				continue;
			if (!found || b > best) {
				best = b;
				best_runs = runs;
			}
			found = true;
		}
	if (!found)
		return -ENOENT;
	*bytes = best;
	learned_why(&reg->policy, kind, best, best_runs, why, whylen);
	return 0;
}

uint64_t mts_kind_default_size(const struct mts_registry *reg)
{
	const struct mts_policy *pol = &reg->policy;
	if (pol->kind_default_size)
		return pol->kind_default_size;
	if (pol->kind_default_bp && reg->totals.limit) {
		uint64_t v = (uint64_t)((unsigned __int128)reg->totals.limit *
		                        pol->kind_default_bp / MTS_BP_ONE);
		return v ? v : 1;
	}
	return MTS_DEFAULT_KIND_SIZE;
}

void mts_kinds_age(struct mts_registry *reg, uint64_t now_s)
{
	struct mts_kinds *ks = reg->kinds;
	if (!ks || !ks->tab)
		return;
	uint32_t horizon = reg->policy.kind_horizon_s;
	for (uint32_t i = 0; i <= ks->mask; i++) {
		struct mts_kind *k = ks->tab[i], *next;
		for (; k; k = next) {
			next = k->hnext;
			if (k->outstanding)
				continue;
			bool live = false;
			for (uint32_t j = 0; j < k->nruns && !live; j++)
				live = k->runs[j].end_s + horizon > now_s;
			if (!live) {
				kind_drop(ks, k);
				ks->dirty = true;
			}
		}
	}
}

static int cmp_kind(const void *a, const void *b)
{
	const struct mts_kind *x = *(const struct mts_kind *const *)a;
	const struct mts_kind *y = *(const struct mts_kind *const *)b;
	if (x->uid != y->uid)
		return x->uid < y->uid ? -1 : 1;
	return strcmp(x->name, y->name);
}

int mts_kinds_list(const struct mts_registry *reg, struct mts_kind ***out)
{
	const struct mts_kinds *ks = reg->kinds;
	*out = NULL;
	if (!ks || !ks->n)
		return 0;
	struct mts_kind **a = malloc(ks->n * sizeof(*a));
	if (!a)
		return -ENOMEM;
	uint32_t n = 0;
	for (uint32_t i = 0; i <= ks->mask; i++)
		for (struct mts_kind *k = ks->tab[i]; k; k = k->hnext)
			a[n++] = k;
	qsort(a, n, sizeof(*a), cmp_kind);
	*out = a;
	return (int)n;
}

/* ---- the record -----------------------------------------------------------
 *
 *   struct rec_hdr (magic, version, count, payload length, checksum)
 *   count times: struct rec_kind, its name (name_len bytes, no NUL),
 *                nruns struct mts_kind_run, oldest first
 *
 * Version 1 records hold KINDS_V1_RUN-byte runs without a length or a
 * profile. They are still read, as runs whose profile is unknown.
 *
 * Byte order is native, because the record never leaves the machine that
 * wrote it. The checksum (FNV-1a, 64 bits) covers the payload. A torn
 * write (power lost before the rename's data reached the disk) or an edit
 * is thus refused whole rather than read in part.
 */

#define KINDS_MAGIC   UINT64_C(0x31646e694b544d4d) /* "MMTKind1" */
#define KINDS_VERSION 2u
#define KINDS_V1_RUN  24u

struct rec_hdr {
	uint64_t magic;
	uint32_t version;
	uint32_t count;
	uint64_t payload;
	uint64_t checksum;
};

struct rec_kind {
	uint32_t uid;
	uint32_t name_len;
	uint32_t nruns;
	uint32_t flags; /* REC_*; 0 in records before the flags */
	uint64_t runs_total;
	uint64_t evictions;
};

#define REC_CAPLESS 1u /* mts_kind.capless */

/* The record is the structs' native layout: a change of either is a new
 * format (KINDS_VERSION), never a silent one. */
_Static_assert(sizeof(struct rec_hdr) == 32 &&
                   offsetof(struct rec_hdr, payload) == 16 &&
                   offsetof(struct rec_hdr, checksum) == 24,
               "the record's header, the records' common head");
_Static_assert(sizeof(struct rec_kind) == 32, "the record's kind");
_Static_assert(sizeof(struct mts_kind_run) == 24 + 2 * MTS_KIND_STEPS,
               "the record's run");

uint64_t mts_record_fnv(uint64_t h, const void *p, size_t n)
{
	const unsigned char *b = p;
	for (size_t i = 0; i < n; i++) {
		h ^= b[i];
		h *= UINT64_C(0x100000001b3);
	}
	return h;
}

void mts_record_put(struct mts_record_buf *w, const void *p, size_t n)
{
	if (w->failed || !n)
		return;
	if (w->cap - w->len < n) {
		size_t cap = w->cap ? w->cap : 4096;
		while (cap - w->len < n)
			cap *= 2;
		unsigned char *d = realloc(w->d, cap);
		if (!d) {
			w->failed = true;
			return;
		}
		w->d = d;
		w->cap = cap;
	}
	memcpy(w->d + w->len, p, n);
	w->len += n;
}

int mts_kinds_encode(const struct mts_registry *reg, unsigned char **out,
                     size_t *len)
{
	struct mts_kind **list;
	int n = mts_kinds_list(reg, &list);
	if (n < 0)
		return n;
	struct mts_record_buf w = {0};
	struct rec_hdr h = {.magic = KINDS_MAGIC, .version = KINDS_VERSION};
	mts_record_put(&w, &h, sizeof(h));
	for (int i = 0; i < n; i++) {
		const struct mts_kind *k = list[i];
		if (!k->nruns)
			continue; /* nothing learned yet */
		struct rec_kind rk = {.uid = k->uid,
		                      .name_len = (uint32_t)strlen(k->name),
		                      .nruns = k->nruns,
		                      .flags = k->capless ? REC_CAPLESS : 0,
		                      .runs_total = k->runs_total,
		                      .evictions = k->evictions};
		mts_record_put(&w, &rk, sizeof(rk));
		mts_record_put(&w, k->name, rk.name_len);
		for (uint32_t j = 0; j < k->nruns; j++)
			mts_record_put(
			    &w,
			    &k->runs[(k->head + MTS_KIND_RUNS - k->nruns + j) %
			             MTS_KIND_RUNS],
			    sizeof(struct mts_kind_run));
		h.count++;
	}
	free(list);
	if (w.failed) {
		free(w.d);
		return -ENOMEM;
	}
	h.payload = w.len - sizeof(h);
	memcpy(w.d, &h, sizeof(h)); /* sealed by mts_kinds_write */
	*out = w.d;
	*len = w.len;
	return 0;
}

void mts_record_seal(unsigned char *d, size_t len)
{
	struct rec_hdr h;
	if (len < sizeof(h))
		return;
	memcpy(&h, d, sizeof(h));
	if (h.payload > len - sizeof(h))
		return; /* not a record: left for its reader to refuse */
	h.checksum =
	    mts_record_fnv(MTS_RECORD_FNV0, d + len - h.payload, h.payload);
	memcpy(d + offsetof(struct rec_hdr, checksum), &h.checksum,
	       sizeof(h.checksum));
}

/* The directory holding `path`, synced so that the rename survives a
 * power cut. Best effort: the record is a convenience. */
static void sync_dir(const char *path)
{
	char dir[4096];
	snprintf(dir, sizeof(dir), "%s", path);
	int fd = open(dirname(dir), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	if (fd >= 0) {
		(void)fsync(fd);
		close(fd);
	}
}

void mts_kinds_keep_refused(struct mts_registry *reg, const char *path)
{
	if (!reg->kinds || !reg->kinds->aside)
		return;
	reg->kinds->aside = false;
	char q[MTS_LOGQ_MAX], qa[MTS_LOGQ_MAX], aside[PATH_MAX];
	if (snprintf(aside, sizeof(aside), "%s.refused", path) >=
	    (int)sizeof(aside))
		return;
	int err = rename(path, aside) < 0 ? -errno : 0;
	mts_log(err ? MTS_LOG_WARN : MTS_LOG_INFO,
	        err ? "cannot keep the learned sizes refused at start: the "
	              "first save replaces them"
	            : "learned sizes refused at start kept aside",
	        "path=%s kept_as=%s err=%s", mts_logq(q, sizeof(q), path),
	        mts_logq(qa, sizeof(qa), aside), err ? strerror(-err) : "none");
}

int mts_kinds_write(const char *path, unsigned char *d, size_t len)
{
	/* Here, off the loop: at 65,536 reservations the checksum is more
	 * than half of what taking their record costs. */
	mts_record_seal(d, len);
	char tmp[4096];
	if ((size_t)snprintf(tmp, sizeof(tmp), "%s.new", path) >= sizeof(tmp))
		return -ENAMETOOLONG;
	/* A file left at the temporary name (ours from a crash, or anyone's)
	 * is never written through: removed, then made afresh. */
	if (unlink(tmp) < 0 && errno != ENOENT)
		return -errno;
	int fd = open(tmp, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC,
	              0600);
	if (fd < 0)
		return -errno;
	int err = 0;
	size_t off = 0;
	while (off < len) {
		ssize_t k = write(fd, d + off, len - off);
		if (k < 0 && errno == EINTR)
			continue;
		if (k <= 0) {
			err = k < 0 ? -errno : -EIO;
			break;
		}
		off += (size_t)k;
	}
	/* On disk before the rename: else a power cut can leave the new name
	 * on an empty file, and the record (refused by its checksum) lost. */
	if (!err && fdatasync(fd) < 0)
		err = -errno;
	if (close(fd) < 0 && !err)
		err = -errno;
	if (!err && rename(tmp, path) < 0)
		err = -errno;
	if (err)
		unlink(tmp);
	else
		sync_dir(path);
	return err;
}

int mts_kinds_save(struct mts_registry *reg, const char *path)
{
	mts_kinds_keep_refused(reg, path);
	unsigned char *d;
	size_t len;
	int err = mts_kinds_encode(reg, &d, &len);
	if (err < 0)
		return err;
	err = mts_kinds_write(path, d, len);
	free(d);
	return err;
}

static int refuse(const char *path, const char *why)
{
	char q[MTS_LOGQ_MAX];
	mts_log(MTS_LOG_WARN,
	        "learned sizes refused, starting without them (the rest of "
	        "the state is kept)",
	        "path=%s why=\"%s\"", mts_logq(q, sizeof(q), path), why);
	return -EBADMSG;
}

/* Read all of `fd` (at most `max` bytes) into *out. */
static int read_all(int fd, size_t max, unsigned char **out, size_t *len)
{
	size_t cap = 4096, n = 0;
	unsigned char *d = malloc(cap);
	if (!d)
		return -ENOMEM;
	for (;;) {
		if (n == cap) {
			if (cap >= max) {
				free(d);
				return -EFBIG;
			}
			cap *= 2;
			unsigned char *e = realloc(d, cap);
			if (!e) {
				free(d);
				return -ENOMEM;
			}
			d = e;
		}
		ssize_t k = read(fd, d + n, cap - n);
		if (k < 0 && errno == EINTR)
			continue;
		if (k < 0) {
			int err = -errno;
			free(d);
			return err;
		}
		if (k == 0)
			break;
		n += (size_t)k;
	}
	*out = d;
	*len = n;
	return 0;
}

int mts_record_read(const char *path, size_t max, unsigned char **d,
                    size_t *len, const char **why)
{
	*why = NULL;
	int fd = open(path, O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
	if (fd < 0) {
		int err = -errno;
		*why = err == -ELOOP ? "a symlink" : strerror(-err);
		return err;
	}
	*why = mts_file_not_ours(fd);
	int err = *why ? -EPERM : read_all(fd, max, d, len);
	if (err < 0 && !*why)
		*why =
		    err == -EFBIG ? "larger than any record" : strerror(-err);
	close(fd);
	return err;
}

/* The end of `k`'s latest run (at head - 1, as runs are held oldest
 * first at load). */
static uint64_t last_end(const struct mts_kind *k)
{
	return k->runs[(k->head + MTS_KIND_RUNS - 1) % MTS_KIND_RUNS].end_s;
}

static int cmp_recent(const void *a, const void *b)
{
	const struct mts_kind *x = *(const struct mts_kind *const *)a;
	const struct mts_kind *y = *(const struct mts_kind *const *)b;
	if (!x->outstanding != !y->outstanding)
		return x->outstanding ? -1 : 1;
	uint64_t ex = last_end(x), ey = last_end(y);
	if (ex != ey)
		return ex > ey ? -1 : 1;
	return cmp_kind(a, b);
}

/*
 * Kinds past the caps ([kinds] max_kinds or max_kinds_per_uid lowered
 * since the record was written, or by a reload): the kinds run most
 * recently are kept up to them and the rest dropped, so that the caps hold
 * at once rather than refuse every new kind until old ones age out. A kind
 * a reservation names now is kept whatever its age (the reservation points
 * at it) and counts first. An admin's kinds count against max_kinds only,
 * as when they were made, and so do those of unidentified TCP peers (each
 * of their requests carried the token, which is exempt from the per-uid
 * caps) and those a request with the token made or ran (capless): a
 * scheduler holding it may keep more than max_kinds_per_uid under its own
 * uid. Returns how many were dropped.
 */
static bool exempt(const struct mts_registry *reg, uint32_t uid)
{
	return uid == MTS_UID_TCP || mts_uid_is_admin(reg, uid);
}

static uint32_t trim_to_caps(const struct mts_registry *reg,
                             struct mts_kinds *ks)
{
	const struct mts_policy *pol = &reg->policy;
	bool over = ks->n > pol->kinds_max;
	for (uint32_t i = 0; !over && pol->kinds_per_uid && ks->per_uid.e &&
	                     i <= ks->per_uid.mask;
	     i++) {
		const struct mts_uid_count *e = &ks->per_uid.e[i];
		over = e->count > pol->kinds_per_uid && !exempt(reg, e->uid);
	}
	if (!over)
		return 0;
	struct mts_kind **all = malloc(ks->n * sizeof(*all));
	if (!all)
		return 0;
	uint32_t n = 0;
	for (uint32_t i = 0; i <= ks->mask; i++)
		for (struct mts_kind *k = ks->tab[i]; k; k = k->hnext)
			all[n++] = k;
	qsort(all, n, sizeof(*all), cmp_recent);
	struct mts_uid_counts kept = {0};
	uint32_t nkept = 0, dropped = 0;
	for (uint32_t i = 0; i < n; i++) {
		struct mts_kind *k = all[i];
		/* A kind a reservation names stays: it points at it. */
		bool keep = k->outstanding || nkept < pol->kinds_max;
		bool capped = !k->capless && !exempt(reg, k->uid);
		if (!k->outstanding && keep && capped && pol->kinds_per_uid &&
		    mts_uid_count_get(&kept, k->uid) >= pol->kinds_per_uid)
			keep = false;
		if (keep) {
			/* Out of memory for the count: kept, uncounted. */
			if (capped)
				(void)mts_uid_count_add(&kept, k->uid);
			nkept++;
			continue;
		}
		kind_drop(ks, k);
		dropped++;
	}
	mts_uid_counts_free(&kept);
	free(all);
	return dropped;
}

uint32_t mts_kinds_trim(struct mts_registry *reg)
{
	struct mts_kinds *ks = reg->kinds;
	if (!ks)
		return 0;
	uint32_t dropped = trim_to_caps(reg, ks);
	if (dropped) {
		ks->dirty = true;
		mts_log(MTS_LOG_WARN,
		        "learned sizes past [kinds] max_kinds or "
		        "max_kinds_per_uid as reloaded: the least recently run "
		        "dropped",
		        "dropped=%u kept=%u max_kinds=%u max_kinds_per_uid=%u",
		        dropped, ks->n, reg->policy.kinds_max,
		        reg->policy.kinds_per_uid);
	}
	return dropped;
}

int mts_kinds_load(struct mts_registry *reg, const char *path)
{
	struct mts_kinds *ks = reg->kinds;
	/* O_NONBLOCK: a FIFO put in its place (a shared directory) must not
	 * hold memtallyd's start; mts_file_not_ours() refuses it. */
	int fd = open(path, O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
	if (fd < 0) {
		if (errno == ENOENT)
			return -ENOENT;
		ks->load_refused++;
		return refuse(path,
		              errno == ELOOP ? "a symlink" : strerror(errno));
	}
	const char *why = mts_file_not_ours(fd);
	bool ours = !why;
	unsigned char *d = NULL;
	size_t len = 0;
	/* A full table's record: the most kinds, each of the longest name
	 * and a full ring of runs. */
	size_t max = sizeof(struct rec_hdr) +
	             (size_t)MTS_KINDS_MAX_MAX *
	                 (sizeof(struct rec_kind) + MTS_NAME_MAX +
	                  MTS_KIND_RUNS * sizeof(struct mts_kind_run));
	if (!why && read_all(fd, max, &d, &len) < 0)
		why = "cannot read it";
	close(fd);
	struct rec_hdr h;
	if (!why && len < sizeof(h))
		why = "too short";
	if (!why) {
		memcpy(&h, d, sizeof(h));
		if (h.magic != KINDS_MAGIC)
			why = "not a record of learned sizes (magic)";
		else if (h.version != KINDS_VERSION && h.version != 1)
			why = "another version";
		else if (h.payload != len - sizeof(h))
			why = "truncated or extended";
		/* No server writes more kinds than it may keep: a count
		 * past that would have every one allocated before the caps
		 * trim them. */
		else if (h.count > MTS_KINDS_MAX_MAX)
			why = "more kinds than a server keeps";
		else if (mts_record_fnv(MTS_RECORD_FNV0, d + sizeof(h),
		                        h.payload) != h.checksum)
			why = "checksum mismatch";
	}
	/* Parse into a table of our own first: a record refused halfway
	 * leaves nothing of it behind. */
	struct mts_kinds fresh = {0};
	uint64_t now_s = mts_now_realtime() / 1000000000u;
	size_t off = sizeof(h);
	size_t run_len =
	    !why && h.version == 1 ? KINDS_V1_RUN : sizeof(struct mts_kind_run);
	for (uint32_t i = 0; !why && i < h.count; i++) {
		struct rec_kind rk;
		char name[MTS_NAME_MAX + 1];
		if (len - off < sizeof(rk)) {
			why = "a kind past the end";
			break;
		}
		memcpy(&rk, d + off, sizeof(rk));
		off += sizeof(rk);
		if (rk.name_len == 0 || rk.name_len > MTS_NAME_MAX ||
		    rk.nruns == 0 || rk.nruns > MTS_KIND_RUNS ||
		    rk.runs_total < rk.nruns || rk.evictions > rk.runs_total ||
		    len - off < rk.name_len + (size_t)rk.nruns * run_len) {
			why = "a kind out of range";
			break;
		}
		memcpy(name, d + off, rk.name_len);
		name[rk.name_len] = 0;
		off += rk.name_len;
		if (strlen(name) != rk.name_len || !mt_name_ok(name)) {
			why = "a kind's name is not a valid name";
			break;
		}
		struct mts_kinds *save = reg->kinds;
		reg->kinds = &fresh;
		bool dup = mts_kind_find(reg, name, rk.uid) != NULL;
		reg->kinds = save;
		struct mts_kind *k =
		    dup ? NULL : kind_new(&fresh, name, rk.uid);
		if (!k) {
			why = dup ? "a kind twice" : "out of memory";
			break;
		}
		for (uint32_t j = 0; j < rk.nruns; j++) {
			/* A version 1 run is the head of a run: its spare
			 * word reads as an unknown length. */
			memcpy(&k->runs[j], d + off, run_len);
			off += run_len;
		}
		k->nruns = rk.nruns;
		k->head = rk.nruns % MTS_KIND_RUNS;
		k->runs_total = rk.runs_total;
		k->evictions = rk.evictions;
		if (rk.flags & REC_CAPLESS)
			kind_set_capless(&fresh, k);
		for (uint32_t j = 0; j < k->nruns; j++) {
			if (k->runs[j].evicted > 1 ||
			    (h.version == 1 && k->runs[j].dur_ms)) {
				why = "a run out of range";
				break;
			}
			/* Written by a clock ahead of ours: it ages from now,
			 * or it would hold its kind (and a slot of its uid's
			 * cap) past the horizon. */
			if (k->runs[j].end_s > now_s)
				k->runs[j].end_s = now_s;
		}
	}
	if (!why && off != len)
		why = "bytes after the last kind";
	free(d);
	if (why) {
		struct mts_registry tmp = {.kinds = &fresh};
		mts_kinds_free(&tmp);
		ks->load_refused++;
		/* Ours, refused for what it holds or for a read or an
		 * allocation that failed (a node just out of memory): the
		 * first save moves it aside rather than overwrite it. A
		 * restart before then reads it again. */
		ks->aside = ours;
		return refuse(path, why);
	}
	uint32_t dropped = trim_to_caps(reg, &fresh);
	/* Replace what we had (nothing, at start). */
	uint64_t refused = ks->load_refused;
	mts_kinds_free(reg);
	*ks = fresh;
	ks->load_refused = refused;
	char q[MTS_LOGQ_MAX];
	mts_log(MTS_LOG_INFO, "learned sizes loaded", "path=%s kinds=%u",
	        mts_logq(q, sizeof(q), path), ks->n);
	if (dropped) {
		ks->dirty = true;
		mts_log(MTS_LOG_WARN,
		        "learned sizes past [kinds] max_kinds or "
		        "max_kinds_per_uid: the least recently run dropped",
		        "path=%s dropped=%u kept=%u max_kinds=%u "
		        "max_kinds_per_uid=%u",
		        mts_logq(q, sizeof(q), path), dropped, ks->n,
		        reg->policy.kinds_max, reg->policy.kinds_per_uid);
	}
	return 0;
}
