/*
 * vouch.c - a claim counts for the claimant, and toward anyone else only as
 * far as the kernel vouches for it.
 *
 * A worker writes its own figures into its own slot. memtallyd cannot stop
 * it from writing 2^50 there, or 0. The worker's own scopes take the claim
 * as it is: its process limit, its own Admit, a group only its uid is in.
 * A liar hurts only itself. Everything shared sees, for each process of an
 * untrusted uid,
 *
 *     kernel + its share of the allowance, at most claim - kernel
 *
 * "Everything shared" is the fleet's and the groups' bytes and states,
 * other users' admission, and hooks. `kernel` is what the kernel says the
 * process holds: its proportional anonymous, shared and swapped memory,
 * plus the memfds it holds that no mapping shows (rss.c reads them). A
 * page shared by n processes counts 1/n in each, so pages shared after
 * fork are vouched for once. A claim below the kernel's figure counts as
 * the kernel's figure, so no worker can hide memory by zeroing its slot.
 *
 * The allowance exists because a claim legitimately runs ahead of the
 * kernel. malloc(1 GiB) is counted at once but is resident only as it is
 * touched, and a kernel figure is up to one sweep old. The allowance is
 * bounded per uid ([trust] untouched_allowance) and for all uids together
 * (untouched_allowance_total), so N accounts cannot multiply it. It runs
 * on the clock of untouched memory. Once a uid's excess has lasted
 * untouched_time, its allowance is spent. It comes back only after a whole
 * untouched_time without excess, so a claim that dips to 0 from time to
 * time renews nothing.
 *
 * Enforcement never acts on the allowance: limits.c compares the fleet's
 * figure less it. What is not resident is no reason to signal anyone.
 *
 * Trusted uids (root, the server's own, [trust] trusted_uids) count in
 * full. A single-tenant fleet sees no change and pays nothing, because the
 * tick tests one flag per process, in the line it reads anyway. What a
 * process claims beyond what counts (`unvouched`) is kept per process,
 * group and fleet and shown by every query. A liar, or a counting bug, is
 * thus visible.
 */
#include "mts_vouch.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "mts_defs.h"
#include "mts_log.h"
#include "mts_procfs.h"
#include "mts_registry.h"

static uint64_t min64(uint64_t a, uint64_t b)
{
	return a < b ? a : b;
}

bool mts_uid_trusted(const struct mts_registry *reg, uint32_t uid)
{
	if (uid == 0 || uid == reg->server_uid)
		return true;
	const struct mts_policy *pol = &reg->policy;
	for (uint32_t i = 0; i < pol->ntrusted; i++)
		if (pol->trusted_uids[i] == uid)
			return true;
	return false;
}

bool mts_vouch_want_read(const struct mts_proc *p)
{
	const struct mts_vouch_proc *v = &p->vouch;
	/* No read yet (a new process, or an image registered again): read
	 * whatever it claims, since a claim of nothing says nothing. */
	return p->untrusted && (v->kernel_ns == 0 ||
	                        (p->bytes > v->kernel &&
	                         p->bytes > v->claim_at_read + MTS_VOUCH_JUMP));
}

bool mts_vouch_distrusted(const struct mts_registry *reg,
                          const struct mts_proc *p)
{
	return p->uid_left || p->exposed || p->slot_lost ||
	       !mts_uid_trusted(reg, p->uid);
}

void mts_vouch_proc_init(const struct mts_registry *reg, struct mts_proc *p)
{
	p->untrusted = mts_vouch_distrusted(reg, p) || p->image_stale;
	p->unvouched = 0;
	if (!p->untrusted) {
		p->vouch.kernel = 0;
		p->vouch.kernel_ns = 0;
		/* Its resident figure is its own again at the next read. */
		p->vouch.family_held = 0;
		p->vouch.family_rss = 0;
		p->vouch.family_shmem = 0;
		p->vouch.family_n = 0;
	}
}

/*
 * A worker maps only the page(s) of its uid's table that hold its own
 * slot (mtshm_map_window). Among processes of one uid that is no
 * boundary anyway: each could write its own slot. A worker that leaves a
 * trusted uid without exec keeps that mapping, though, and can point it
 * at any page of the table (remap_file_pages) or grow it (mremap): the
 * table has no write seal, since memtallyd writes it too. Whoever
 * controls it now can write every slot of the table, claims counted in
 * full. So the table is tainted (mts_table_taint: at the read that sees
 * the uid left, rss.c; when the process registers again as an untrusted
 * uid, registry.c; after a restart, adopt.c), for its life: every
 * process in it is untrusted from then, or from its registration, until
 * it registers again. Its claims count as the kernel vouches for them,
 * toward others and toward its own limit (limits.c), and their excess is
 * the leaver's uid's, so the table's own uid is not denied admission for
 * it. The leaver's exit changes nothing: a child it forked may hold the
 * same mapping. A table is new (untainted, a new memfd) once its uid's
 * processes have been gone for its idle time.
 */
/* `q` has just become untrusted (its flag set): until its first kernel
 * read (soon: vouch.c wants one), what it holds by the latest resident
 * figure stands. */
static void distrust(const struct mts_registry *reg, struct mts_proc *q)
{
	if (!q->vouch.kernel_ns && q->rss_known)
		q->vouch.kernel = q->rss;
	mts_vouch_proc_init(reg, q);
}

static bool in_reach(const struct mts_proc *q)
{
	return q->table && q->table->tainted;
}

static void expose(const struct mts_registry *reg, struct mts_proc *q, bool was)
{
	q->exposed = true;
	q->left_uid = q->table->tainted_uid;
	distrust(reg, q);
	if (!was)
		mts_log_uid(q->uid, MTS_LOG_WARN,
		            "worker's slot is in reach of a worker that left "
		            "its uid: its claims count as the kernel vouches "
		            "for them",
		            "pid=%u uid=%u leaver_uid=%u", q->pid, q->uid,
		            q->left_uid);
}

void mts_vouch_taint_apply(struct mts_registry *reg)
{
	for (uint32_t k = 0; k < reg->ntables; k++) {
		struct mts_table *t = reg->tables[k];
		if (!t->taint_new)
			continue;
		t->taint_new = false;
		mts_log_uid(t->uid, MTS_LOG_WARN,
		            "a worker left this uid without exec: the uid's "
		            "workers count as the kernel vouches for them",
		            "uid=%u leaver_uid=%u", t->uid, t->tainted_uid);
		for (uint32_t i = 0; i < reg->ndense; i++) {
			struct mts_proc *q = reg->by_slot[reg->dense[i]];
			if (q->table == t && !q->uid_left && !q->exposed)
				expose(reg, q, q->untrusted);
		}
	}
}

void mts_vouch_exposed_check(struct mts_registry *reg, struct mts_proc *p)
{
	mts_vouch_taint_apply(reg);
	bool was = p->exposed; /* an exec in a tainted table: said before */
	p->exposed = false;
	if (in_reach(p))
		expose(reg, p, was);
}

void mts_vouch_refresh(struct mts_registry *reg)
{
	for (uint32_t i = 0; i < reg->ntables; i++) {
		struct mts_table *t = reg->tables[i];
		t->vouch.trusted = mts_uid_trusted(reg, t->uid);
	}
	for (uint32_t i = 0; i < reg->ndense; i++)
		mts_vouch_proc_init(reg, reg->by_slot[reg->dense[i]]);
}

void mts_vouch_begin(struct mts_registry *reg)
{
	const struct mts_policy *pol = &reg->policy;
	bool on = pol->untouched_ms != 0;
	reg->vouch.allow_left = on ? pol->untouched_total : 0;
	for (uint32_t i = 0; i < reg->ntables; i++) {
		struct mts_vouch_uid *v = &reg->tables[i]->vouch;
		v->unvouched = v->excess = 0;
		if (v->trusted)
			continue;
		v->allow_left = on && !v->spent ? pol->untouched_allowance : 0;
	}
}

uint64_t mts_vouch_proc(struct mts_registry *reg, struct mts_proc *p,
                        uint64_t claim, bool *want_read)
{
	struct mts_vouch_uid *v = &p->table->vouch;
	uint64_t k = p->vouch.kernel;
	/* Never below what the kernel says the process holds. */
	uint64_t vouched = k;
	if (claim > k) {
		uint64_t e = claim - k;
		v->excess = mt_sat_add(v->excess, e); /* many liars: no wrap */
		uint64_t allow =
		    min64(e, min64(v->allow_left, reg->vouch.allow_left));
		v->allow_left -= allow;
		reg->vouch.allow_left -= allow;
		vouched = k + allow;
	}
	/* A kernel figure older than the claim's rise, or none yet: read
	 * it again soon, so an honest process's figure follows. */
	if (mts_vouch_want_read(p))
		*want_read = true;
	uint64_t unv = claim > vouched ? claim - vouched : 0;
	v->unvouched = mt_sat_add(v->unvouched, unv);
	if (p->unvouched != unv)
		p->unvouched = unv;
	return vouched;
}

uint64_t mts_vouch_counted(const struct mts_proc *p)
{
	if (!p->untrusted)
		return p->bytes;
	uint64_t c = p->bytes > p->unvouched ? p->bytes - p->unvouched : 0;
	return c > p->vouch.kernel ? c : p->vouch.kernel;
}

void mts_vouch_end(struct mts_registry *reg, uint64_t now_ns)
{
	uint64_t window = (uint64_t)reg->policy.untouched_ms * 1000000u;
	for (uint32_t i = 0; i < reg->ntables; i++) {
		struct mts_vouch_uid *v = &reg->tables[i]->vouch;
		if (v->trusted)
			continue;
		if (v->excess > MTS_VOUCH_REST) {
			v->rest_since_ns = 0;
			if (v->run_since_ns == 0)
				v->run_since_ns = now_ns;
			if (now_ns - v->run_since_ns >= window)
				v->spent = true;
		} else {
			if (v->rest_since_ns == 0)
				v->rest_since_ns = now_ns;
			if (now_ns - v->rest_since_ns >= window) {
				v->spent = false;
				v->run_since_ns = 0;
			}
		}
	}
}

uint64_t mts_vouch_unvouched_of(const struct mts_registry *reg, uint32_t uid)
{
	for (uint32_t i = 0; i < reg->ntables; i++) {
		const struct mts_table *t = reg->tables[i];
		if (t->uid == uid)
			return t->vouch.trusted ? 0 : t->vouch.unvouched;
	}
	return 0;
}

/* "Key:   1234 kB" -> bytes; false if the line is not that key. */
static bool status_kb(const char *line, const char *key, uint64_t *out)
{
	size_t n = strlen(key);
	if (strncmp(line, key, n) != 0)
		return false;
	const char *p = line + n;
	while (*p == ' ' || *p == '\t')
		p++;
	if (*p < '0' || *p > '9')
		return false;
	uint64_t kb = 0;
	while (*p >= '0' && *p <= '9') {
		if (kb > (UINT64_MAX >> 10) / 10)
			return false;
		kb = kb * 10 + (uint64_t)(*p++ - '0');
	}
	*out = kb << 10;
	return true;
}

/* Sum the "Key: N kB" lines of `text` named in keys[]; bit i of the
 * result is set when keys[i] was seen. */
static unsigned kb_lines(const char *text, const char *const *keys,
                         unsigned nkeys, uint64_t *vals)
{
	unsigned seen = 0;
	for (const char *l = text; l && *l;) {
		for (unsigned i = 0; i < nkeys; i++)
			if (status_kb(l, keys[i], &vals[i])) {
				seen |= 1u << i;
				break;
			}
		l = strchr(l, '\n');
		if (l)
			l++;
	}
	return seen;
}

int mts_parse_smaps_rollup(const char *text, struct mts_kernel_mem *out)
{
	static const char *const keys[] = {
	    "Pss:", "Pss_Anon:", "Pss_Shmem:", "SwapPss:", "Anonymous:"};
	uint64_t v[5] = {0};
	unsigned seen = kb_lines(text, keys, 5, v);
	if ((seen & 3) != 3)
		return -EINVAL;
	out->rss = v[0];
	out->shmem = v[2];
	out->held = v[1] + v[2] + v[3];
	out->anon = v[4];
	out->pss = true;
	return 0;
}

int mts_parse_status_mem(const char *status, struct mts_kernel_mem *out)
{
	static const char *const keys[] = {
	    "VmRSS:", "RssAnon:", "RssShmem:", "VmSwap:"};
	uint64_t v[4] = {0};
	unsigned seen = kb_lines(status, keys, 4, v);
	/* A kernel thread or zombie has none of them: nothing vouched. */
	if ((seen & 3) != 3)
		return -EINVAL;
	out->rss = v[0];
	out->shmem = v[2];
	out->held = v[1] + v[2] + v[3];
	out->anon = v[1];
	out->pss = false;
	out->has_uids = mts_parse_uid_fields(status, out->uids, 3) == 0;
	/* Name: is the first line: its comm, which an exec changes. */
	out->name[0] = '\0';
	if (strncmp(status, "Name:\t", 6) == 0) {
		size_t n = strcspn(status + 6, "\n");
		n = n < sizeof(out->name) - 1 ? n : sizeof(out->name) - 1;
		memcpy(out->name, status + 6, n);
		out->name[n] = '\0';
	}
	return 0;
}

/* The process's figures as /proc/PID (tid 0) or its thread TID shows
 * them. */
static int read_mem(int pid, int tid, bool smaps, struct mts_kernel_mem *out)
{
	/* smaps_rollup walks the page tables, so its cost grows with what the
	 * process holds (see bench/results/server.md), and it waits for the
	 * process's mmap lock. status is a fallback that counts shared pages
	 * in every sharer, and takes no lock of the process's. */
	char buf[4096];
	ssize_t n = -EINVAL;
	if (smaps)
		n = tid ? mts_read_thread_file(pid, tid, "smaps_rollup", buf,
		                               sizeof(buf))
		        : mts_read_proc_file(pid, "smaps_rollup", buf,
		                             sizeof(buf));
	if (n >= 0 && mts_parse_smaps_rollup(buf, out) == 0)
		return 0;
	if (n == -ENOENT || n == -ESRCH)
		return -ESRCH;
	n = tid ? mts_read_thread_status(pid, tid, buf, sizeof(buf))
	        : mts_read_proc_status(pid, buf, sizeof(buf));
	if (n < 0)
		return n == -ENOENT ? -ESRCH : (int)n;
	return mts_parse_status_mem(buf, out);
}

int mts_read_kernel_mem(int pid, bool smaps, struct mts_kernel_mem *out)
{
	int err = read_mem(pid, 0, smaps, out);
	if (err != -ESRCH && err != -EINVAL)
		return err;
	/* Gone, or a zombie leader whose other threads live on holding
	 * the process's memory (mts_live_thread): then theirs is the
	 * figure. Without this, such a process kept its last figure for
	 * good while it grew. */
	pid_t tid = mts_live_thread(pid);
	if (tid <= 0)
		return err;
	return read_mem(pid, (int)tid, smaps, out) == 0 ? 0 : err;
}

/*
 * A page of a table memtallyd could not read (fault.c: a hole punched in
 * it, and no memory to fill it under strict overcommit) has a spare
 * standing in for it: memtallyd no longer sees what the slots on it
 * claim. Their processes count as the kernel vouches for them, toward
 * others and toward their own limits, as if their slots were zeroed,
 * until they register again on a page it can read. Their excess is
 * their own uid's: only that uid's processes map the table.
 */
static void lose(struct mts_registry *reg, struct mts_proc *q, bool was)
{
	q->slot_lost = true;
	distrust(reg, q);
	if (!was)
		mts_log_uid(q->uid, MTS_LOG_WARN,
		            "worker's slot cannot be read: it counts as the "
		            "kernel vouches for it",
		            "pid=%u uid=%u slot=%u", q->pid, q->uid, q->slot);
}

void mts_vouch_lost_apply(struct mts_registry *reg)
{
	for (uint32_t k = 0; k < reg->ntables; k++) {
		struct mts_table *t = reg->tables[k];
		if (!t->lost_new)
			continue;
		t->lost_new = false;
		for (uint32_t i = 0; i < reg->ndense; i++) {
			struct mts_proc *q = reg->by_slot[reg->dense[i]];
			if (q->table == t && !q->slot_lost &&
			    mts_table_slot_lost(reg, t, q->slot))
				lose(reg, q, false);
		}
	}
}

void mts_vouch_lost_check(struct mts_registry *reg, struct mts_proc *p)
{
	mts_tables_faults(reg);
	mts_vouch_lost_apply(reg);
	bool was = p->slot_lost; /* an exec on a lost page: said before */
	p->slot_lost = false;
	if (mts_table_slot_lost(reg, p->table, p->slot))
		lose(reg, p, was);
}
