/*
 * uidcount.c - counts per uid (mts_uidcount.h).
 */
#include "mts_uidcount.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

/*
 * Open addressing with linear probing, at most half full, removal by
 * shifting back (no tombstones), as for reservation ids (admit.c). Uids
 * are few (one entry per uid with a reservation or a connection), so the
 * table stays small; a uid's count is one probe on the hot paths (Admit,
 * accept, close).
 */

static uint32_t uid_home(uint32_t uid, uint32_t mask)
{
	return (uint32_t)(((uint64_t)uid * UINT64_C(0x9e3779b97f4a7c15)) >>
	                  32) &
	       mask;
}

static struct mts_uid_count *uid_find(const struct mts_uid_counts *t,
                                      uint32_t uid)
{
	if (!t->e)
		return NULL;
	for (uint32_t i = uid_home(uid, t->mask); t->e[i].count;
	     i = (i + 1) & t->mask)
		if (t->e[i].uid == uid)
			return &t->e[i];
	return NULL;
}

uint64_t *mts_uid_count_bytes(struct mts_uid_counts *t, uint32_t uid)
{
	struct mts_uid_count *c = uid_find(t, uid);
	return c ? &c->bytes : NULL;
}

uint64_t mts_uid_bytes_get(const struct mts_uid_counts *t, uint32_t uid)
{
	const struct mts_uid_count *c = uid_find(t, uid);
	return c ? c->bytes : 0;
}

uint32_t mts_uid_count_get(const struct mts_uid_counts *t, uint32_t uid)
{
	const struct mts_uid_count *c = uid_find(t, uid);
	return c ? c->count : 0;
}

static void uid_put(struct mts_uid_count *e, uint32_t mask,
                    struct mts_uid_count c)
{
	uint32_t i = uid_home(c.uid, mask);
	while (e[i].count)
		i = (i + 1) & mask;
	e[i] = c;
}

int mts_uid_count_add(struct mts_uid_counts *t, uint32_t uid)
{
	struct mts_uid_count *c = uid_find(t, uid);
	if (c) {
		if (c->count < UINT32_MAX)
			c->count++;
		return 0;
	}
	uint32_t n = t->e ? t->mask + 1 : 0;
	if ((uint64_t)(t->used + 1) * 2 > n) {
		uint32_t m = n ? n * 2 : 16;
		struct mts_uid_count *e = calloc(m, sizeof(*e));
		if (!e)
			return -ENOMEM;
		for (uint32_t i = 0; i < n; i++)
			if (t->e[i].count)
				uid_put(e, m - 1, t->e[i]);
		free(t->e);
		t->e = e;
		t->mask = m - 1;
	}
	uid_put(t->e, t->mask, (struct mts_uid_count){.uid = uid, .count = 1});
	t->used++;
	return 0;
}

void mts_uid_count_sub(struct mts_uid_counts *t, uint32_t uid)
{
	struct mts_uid_count *c = uid_find(t, uid);
	if (!c || --c->count > 0)
		return;
	/* Free the entry; move back every later one of the run that may
	 * not sit after the hole. */
	struct mts_uid_count *e = t->e;
	uint32_t m = t->mask;
	uint32_t i = (uint32_t)(c - e);
	for (uint32_t j = (i + 1) & m; e[j].count; j = (j + 1) & m) {
		uint32_t home = uid_home(e[j].uid, m);
		if (((j - home) & m) >= ((j - i) & m)) {
			e[i] = e[j];
			i = j;
		}
	}
	e[i].count = 0;
	e[i].bytes = 0;
	t->used--;
}

void mts_uid_counts_free(struct mts_uid_counts *t)
{
	free(t->e);
	memset(t, 0, sizeof(*t));
}
