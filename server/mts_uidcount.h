/*
 * mts_uidcount.h - counts (and bytes) kept per uid: processes' groups
 * per creator (registry.c), reservations per owner (admit.c),
 * connections per peer uid (conn.c). uidcount.c.
 */
#ifndef MTS_UIDCOUNT_H
#define MTS_UIDCOUNT_H

#include <stdint.h>

/* A count per uid (open addressing): reservations per owner (admit.c),
 * connections per peer uid (conn.c). MTS_UID_TCP stands for every peer
 * whose uid is unknown (a TCP peer not on this host, or not found by
 * sock_diag): one bucket. */
#define MTS_UID_TCP UINT32_MAX
/* mts_group.unvouched_uid when more than one uid has unvouched bytes. */
#define MTS_UID_MIXED (UINT32_MAX - 1)
struct mts_uid_count {
	uint32_t uid;
	uint32_t count; /* 0: free entry */
	uint64_t bytes; /* reservations: the uid's outstanding bytes */
};
struct mts_uid_counts {
	struct mts_uid_count *e;
	uint32_t mask; /* entries - 1; e == NULL: empty */
	uint32_t used;
};

/* The bytes kept beside `uid`'s count (reserved bytes, admit.c): a
 * pointer valid until the table changes, NULL when the uid has no
 * entry; the entry's bytes are 0 when it is created. */
uint64_t *mts_uid_count_bytes(struct mts_uid_counts *t, uint32_t uid);
uint64_t mts_uid_bytes_get(const struct mts_uid_counts *t, uint32_t uid);

/* The count of `uid`, 0 when it has none. */
uint32_t mts_uid_count_get(const struct mts_uid_counts *t, uint32_t uid);
/* Count one more for `uid`. 0 or -ENOMEM (nothing counted). */
int mts_uid_count_add(struct mts_uid_counts *t, uint32_t uid);
/* Count one less (a uid at 0 leaves the table). */
void mts_uid_count_sub(struct mts_uid_counts *t, uint32_t uid);
void mts_uid_counts_free(struct mts_uid_counts *t);

#endif /* MTS_UIDCOUNT_H */
