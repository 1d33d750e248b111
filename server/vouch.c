/*
 * vouch.c - a claim counts for the claimant, and toward anyone else only as
 * far as the kernel vouches for it.
 *
 * A worker writes its own figures into its own slot: memtallyd cannot stop
 * it from writing 2^50 there. Its own scopes (its process limit, its own
 * Admit, a group only its uid is in) take the claim as it is: a liar hurts
 * only itself. Everything shared -- the fleet's and the groups' bytes and
 * states, other users' admission, hooks, enforcement -- sees, for each
 * untrusted uid, at most
 *
 *     sum over its processes of min(claim, kernel)
 *       + min(allowance, its excess that is not stale)
 *
 * where `kernel` is a process's resident plus swapped anonymous memory
 * (/proc/PID/status RssAnon + VmSwap, read by the RSS sweep: every
 * rss_interval, and early -- every MTS_VOUCH_SWEEP_MS at most -- for the
 * processes whose claims ran ahead of it), `excess` is the sum of
 * max(0, claim - kernel) and `allowance` is [trust] untouched_allowance.
 * The allowance is there because a claim legitimately runs ahead of the
 * kernel: malloc(1 GiB) is counted at once, resident only as it is
 * touched, and a kernel figure is up to one sweep old. An excess is stale
 * once it has been present for a whole [trust] untouched_time: the
 * smallest excess seen over the last one to two windows (two buckets of
 * minimums) is no longer vouched for, so memory that stays untouched, or a
 * lie, stops counting within 2 x untouched_time, while a fresh excess above
 * that floor is vouched for up to the allowance.
 *
 * Trusted uids (root, the server's own, [trust] trusted_uids) count in
 * full: a single-tenant fleet sees no change and pays nothing -- the tick
 * tests one flag per process, in the line it reads anyway. The difference
 * between claim and vouched figure is kept per process, group and fleet
 * (`unvouched`) and shown by every query, so a liar -- or a counting bug
 * -- is visible.
 *
 * The figures are per uid, not per process: ten processes of one uid share
 * one allowance, handed out in the tick's order.
 */
#include "mts_vouch.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "mts_defs.h"
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
	return p->untrusted && p->bytes > v->kernel &&
	       (v->kernel_ns == 0 ||
	        p->bytes > v->claim_at_read + MTS_VOUCH_JUMP);
}

void mts_vouch_proc_init(const struct mts_registry *reg, struct mts_proc *p)
{
	p->untrusted = !mts_uid_trusted(reg, p->uid);
	p->unvouched = 0;
	if (!p->untrusted) {
		p->vouch.kernel = 0;
		p->vouch.kernel_ns = 0;
	}
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

/* The excess present for a whole window: no longer vouched for. */
static uint64_t stale_of(const struct mts_vouch_uid *v)
{
	return v->has_prev ? min64(v->min_prev, v->min_cur) : 0;
}

void mts_vouch_begin(struct mts_registry *reg)
{
	const struct mts_policy *pol = &reg->policy;
	for (uint32_t i = 0; i < reg->ntables; i++) {
		struct mts_vouch_uid *v = &reg->tables[i]->vouch;
		v->claimed = v->vouched = v->excess = 0;
		if (v->trusted)
			continue;
		v->stale_left = stale_of(v);
		v->allow_left =
		    pol->untouched_ms ? pol->untouched_allowance : 0;
	}
}

uint64_t mts_vouch_proc(struct mts_registry *reg, struct mts_proc *p,
                        uint64_t claim, bool *want_read)
{
	struct mts_vouch_uid *v = &p->table->vouch;
	uint64_t k = p->vouch.kernel;
	uint64_t vouched = claim;
	if (claim > k) {
		uint64_t e = claim - k;
		v->excess += e; /* each claim < 2^51: no overflow */
		/* The stale part first: it is what has stayed untouched. */
		uint64_t stale = min64(e, v->stale_left);
		v->stale_left -= stale;
		uint64_t allow = min64(e - stale, v->allow_left);
		v->allow_left -= allow;
		vouched = k + allow;
		/* A kernel figure older than the claim's rise: read it again
		 * soon, so an honest process's allowance is given back. */
		if (mts_vouch_want_read(p))
			*want_read = true;
	}
	v->claimed += claim;
	v->vouched += vouched;
	uint64_t unv = claim - vouched;
	if (p->unvouched != unv)
		p->unvouched = unv;
	return vouched;
}

void mts_vouch_end(struct mts_registry *reg, uint64_t now_ns)
{
	uint64_t window = (uint64_t)reg->policy.untouched_ms * 1000000u;
	for (uint32_t i = 0; i < reg->ntables; i++) {
		struct mts_vouch_uid *v = &reg->tables[i]->vouch;
		if (v->trusted)
			continue;
		uint64_t e = v->excess;
		if (v->bucket_ns == 0) {
			v->bucket_ns = now_ns;
			v->min_cur = e;
			continue;
		}
		v->min_cur = min64(v->min_cur, e);
		if (now_ns - v->bucket_ns >= window) {
			v->min_prev = v->min_cur;
			v->has_prev = true;
			v->min_cur = e;
			v->bucket_ns = now_ns;
		}
	}
}

uint64_t mts_vouch_unvouched_of(const struct mts_registry *reg, uint32_t uid)
{
	for (uint32_t i = 0; i < reg->ntables; i++) {
		const struct mts_table *t = reg->tables[i];
		if (t->uid == uid)
			return t->vouch.trusted
			           ? 0
			           : t->vouch.claimed - t->vouch.vouched;
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

int mts_parse_status_mem(const char *status, uint64_t *rss, uint64_t *anon)
{
	uint64_t vmrss = 0, ranon = 0, swap = 0;
	int seen = 0;
	for (const char *l = status; l && *l;) {
		if (status_kb(l, "VmRSS:", &vmrss))
			seen |= 1;
		else if (status_kb(l, "RssAnon:", &ranon))
			seen |= 2;
		else if (status_kb(l, "VmSwap:", &swap))
			seen |= 4;
		l = strchr(l, '\n');
		if (l)
			l++;
	}
	/* A kernel thread or zombie has none of them: nothing vouched. */
	if ((seen & 3) != 3)
		return -EINVAL;
	*rss = vmrss;
	*anon = ranon + swap;
	return 0;
}

int mts_read_status_mem(int pid, uint64_t *rss, uint64_t *anon)
{
	char path[32], buf[4096];
	snprintf(path, sizeof(path), "/proc/%d/status", pid);
	int fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return errno == ENOENT ? -ESRCH : -errno;
	size_t len = 0;
	for (;;) {
		ssize_t n = read(fd, buf + len, sizeof(buf) - 1 - len);
		if (n < 0 && errno == EINTR)
			continue;
		if (n <= 0)
			break;
		len += (size_t)n;
		if (len == sizeof(buf) - 1)
			break;
	}
	close(fd);
	buf[len] = '\0';
	return mts_parse_status_mem(buf, rss, anon);
}
