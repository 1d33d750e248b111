/*
 * figures.c - the table of the figures the fleet and each group share
 * (mts_figures.h): what /metrics, GetUsage and the hooks' environment
 * show of each. A row is all a renderer knows of a figure; a new figure
 * shows up in each of them with its row alone.
 *
 * Names, HELP texts, field numbers and variables are interfaces: dashboards,
 * alerts, clients and hooks depend on them, so a row may be added, never
 * renamed or renumbered.
 */
#include "mts_figures.h"

#include "mtcommon.h"
#include "mtshm.h"

#define OFF(m) offsetof(struct mts_figures, m)
#define ALL    (MTS_FIG_METRICS | MTS_FIG_PROTO | MTS_FIG_SUMS)

/* clang-format off */
const struct mts_figure mts_figure_table[] = {
    {"bytes", OFF(bytes), MTS_FIG_BYTES, ALL | MTS_FIG_HOOKS,
     "memtally_fleet_accounted_bytes",
     "Bytes the fleet's workers have allocated, as of the latest tick.",
     "memtally_group_accounted_bytes",
     "Bytes a group's workers have allocated, as of the latest tick.",
     1, 2, "MEMTALLY_BYTES"},
    {"mapped", OFF(mapped), MTS_FIG_BYTES, ALL,
     "memtally_fleet_mapped_bytes",
     "Part of the accounted bytes: anonymous memory the workers mapped "
     "themselves.",
     "memtally_group_mapped_bytes",
     "Part of a group's accounted bytes: memory its workers mapped "
     "themselves.",
     25, 14, NULL},
    {"allocator_free", OFF(allocator_free), MTS_FIG_BYTES, ALL,
     "memtally_fleet_allocator_free_bytes",
     "Part of the accounted bytes: memory the workers' allocators keep "
     "free for them (glibc's freed chunks).",
     "memtally_group_allocator_free_bytes",
     "Part of a group's accounted bytes: memory its workers' allocators "
     "keep free for them.",
     26, 15, NULL},
    {"unvouched", OFF(unvouched), MTS_FIG_BYTES, ALL,
     "memtally_fleet_unvouched_bytes",
     "Bytes claimed by workers of untrusted users beyond what the kernel "
     "vouches for; left out of the accounted bytes.",
     "memtally_group_unvouched_bytes",
     "Bytes a group's workers of untrusted users claim beyond what the "
     "kernel vouches for; left out of its accounted bytes.",
     27, 16, NULL},
    {"error_bytes", OFF(error_bytes), MTS_FIG_BYTES, ALL,
     "memtally_fleet_error_bytes",
     "Error bar of the accounted bytes: threshold times live threads.",
     "memtally_group_error_bytes",
     "Error bar of a group's accounted bytes.",
     10, 8, NULL},
    {"peak", OFF(peak), MTS_FIG_BYTES, ALL,
     "memtally_fleet_peak_bytes",
     "Highest fleet accounted bytes seen since the server started.",
     "memtally_group_peak_bytes",
     "Highest accounted bytes seen for a group.",
     2, 3, NULL},
    {"rss", OFF(rss), MTS_FIG_BYTES, ALL | MTS_FIG_HOOKS,
     "memtally_fleet_rss_bytes",
     "Resident set of the registered processes, from /proc.",
     "memtally_group_rss_bytes",
     "Resident set of a group's processes, from /proc.",
     16, 9, "MEMTALLY_RSS"},
    {"reserved", OFF(reserved), MTS_FIG_BYTES, ALL | MTS_FIG_HOOKS,
     "memtally_fleet_reserved_bytes",
     "Bytes held by outstanding admission reservations.",
     "memtally_group_reserved_bytes",
     "Bytes held by a group's outstanding reservations.",
     4, 7, "MEMTALLY_RESERVED"},
    {"reservations", OFF(reservations), MTS_FIG_COUNT, ALL,
     "memtally_reservations",
     "Outstanding admission reservations.",
     "memtally_group_reservations",
     "Outstanding reservations naming a group.",
     18, 10, NULL},
    {"limit", OFF(limit), MTS_FIG_BYTES,
     MTS_FIG_METRICS | MTS_FIG_PROTO | MTS_FIG_HOOKS | MTS_FIG_ABSENT_0,
     "memtally_fleet_limit_bytes",
     "Fleet limit; absent when there is none.",
     "memtally_group_limit_bytes",
     "Group limit; absent for a group without one.",
     3, 4, "MEMTALLY_LIMIT"},
    {"state", OFF(state), MTS_FIG_STATE, ALL,
     "memtally_fleet_state",
     "Fleet state against its limit: 1 for the current state.",
     "memtally_group_state",
     "Group state against its limit: 1 for the current state.",
     5, 5, NULL},
    {"growth", OFF(growth), MTS_FIG_BYTES_PER_S, ALL,
     "memtally_fleet_growth_bytes_per_second",
     "Growth rate of the fleet's measured bytes over the growth window; "
     "negative when shrinking.",
     "memtally_group_growth_bytes_per_second",
     "Growth rate of a group's measured bytes over the growth window.",
     21, 12, NULL},
    {"processes", OFF(processes), MTS_FIG_COUNT, ALL,
     "memtally_processes",
     "Registered worker processes.",
     "memtally_group_processes",
     "Registered processes in a group.",
     6, 6, NULL},
};
/* clang-format on */

const size_t mts_figure_count =
    sizeof(mts_figure_table) / sizeof(mts_figure_table[0]);

static const void *at(const struct mts_figures *v, const struct mts_figure *f)
{
	return (const char *)v + f->offset;
}

uint64_t mts_figure_u64(const struct mts_figures *v, const struct mts_figure *f)
{
	switch (f->unit) {
	case MTS_FIG_BYTES:
		return *(const uint64_t *)at(v, f);
	case MTS_FIG_COUNT:
	case MTS_FIG_STATE:
		return *(const uint32_t *)at(v, f);
	case MTS_FIG_BYTES_PER_S: {
		double d = *(const double *)at(v, f);
		return d > 0 ? (uint64_t)d : 0;
	}
	}
	return 0;
}

double mts_figure_f64(const struct mts_figures *v, const struct mts_figure *f)
{
	return f->unit == MTS_FIG_BYTES_PER_S ? *(const double *)at(v, f)
	                                      : (double)mts_figure_u64(v, f);
}

void mts_figures_add(struct mts_figures *sum, const struct mts_figures *g)
{
	for (size_t i = 0; i < mts_figure_count; i++) {
		const struct mts_figure *f = &mts_figure_table[i];
		if (!(f->out & MTS_FIG_SUMS))
			continue;
		void *s = (char *)sum + f->offset;
		const void *v = at(g, f);
		switch (f->unit) {
		case MTS_FIG_BYTES:
			*(uint64_t *)s =
			    mt_sat_add(*(uint64_t *)s, *(const uint64_t *)v);
			break;
		case MTS_FIG_COUNT:
			*(uint32_t *)s += *(const uint32_t *)v;
			break;
		case MTS_FIG_STATE: {
			/* The worst of them. */
			uint32_t st = *(const uint32_t *)v;
			if (st > *(uint32_t *)s && st <= MTSHM_STATE_OVER)
				*(uint32_t *)s = st;
			break;
		}
		case MTS_FIG_BYTES_PER_S:
			*(double *)s += *(const double *)v;
			break;
		}
	}
}
