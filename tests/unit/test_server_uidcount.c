/*
 * test_server_uidcount.c - mts_uid_counts, the per-uid counters behind the
 * per-uid caps: many uids (the table grows), the TCP pseudo-uid beside
 * them, and counts that reach 0 leaving the table.
 */
#include "mts_uidcount.h"

#include <criterion/criterion.h>

Test(uidcount, add_sub_many)
{
	struct mts_uid_counts t = {0};
	for (uint32_t u = 0; u < 5000; u++)
		for (uint32_t k = 0; k <= u % 3; k++)
			cr_assert_eq(mts_uid_count_add(&t, u * 7919u), 0);
	cr_assert_eq(mts_uid_count_add(&t, MTS_UID_TCP), 0);
	for (uint32_t u = 0; u < 5000; u++)
		cr_assert_eq(mts_uid_count_get(&t, u * 7919u), u % 3 + 1);
	for (uint32_t u = 0; u < 5000; u += 2)
		for (uint32_t k = 0; k <= u % 3; k++)
			mts_uid_count_sub(&t, u * 7919u);
	for (uint32_t u = 0; u < 5000; u++)
		cr_assert_eq(mts_uid_count_get(&t, u * 7919u),
		             u % 2 ? u % 3 + 1 : 0, "uid %u", u * 7919u);
	cr_assert_eq(mts_uid_count_get(&t, MTS_UID_TCP), 1);
	cr_assert_eq(t.used, 2501);
	mts_uid_count_sub(&t, 12345); /* absent: nothing */
	mts_uid_counts_free(&t);
}
