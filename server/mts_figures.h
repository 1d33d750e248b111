/*
 * mts_figures.h - the figures the fleet and each group share (bytes,
 * rss, limit, state, ...), and the one table that says how each is shown
 * (figures.c): its /metrics families, its GetUsage fields, its variable
 * in the hooks' environment. metrics.c, dispatch.c and hooks.c render
 * every figure from the table, so a new one is a member here, a row
 * there, a field in memtally.proto and the code that computes it.
 */
#ifndef MTS_FIGURES_H
#define MTS_FIGURES_H

#include <stddef.h>
#include <stdint.h>

/*
 * The members of struct mts_figures, spelled once. struct mts_group and
 * struct mts_totals embed them as an anonymous union of the named struct
 * and an unnamed one with these same members (MTS_FIGURES_EMBED): the
 * code that computes a figure writes g->bytes, what renders it reads
 * &g->fig. The units are those of the table (enum mts_fig_unit).
 */
#define MTS_FIGURES_MEMBERS                                                    \
	/* Latest tick: heap + mapped + allocator_free; of untrusted uids      \
	 * only what the kernel vouches for (vouch.c). */                      \
	uint64_t bytes;                                                        \
	uint64_t mapped;         /* part of bytes */                           \
	uint64_t allocator_free; /* part of bytes */                           \
	uint64_t unvouched;      /* claimed beyond bytes (vouch.c) */          \
	uint64_t error_bytes;    /* threshold x live threads */                \
	uint64_t peak;                                                         \
	/* Filled by the limits code (limits.c, admit.c). */                   \
	uint64_t rss;                                                          \
	uint64_t reserved; /* outstanding admission reservations (bytes) */    \
	uint64_t limit;    /* 0 = none */                                      \
	uint32_t reservations; /* outstanding reservations (count) */          \
	uint32_t state;        /* enum mtshm_state */                          \
	uint32_t processes;                                                    \
	/* rate.c: the measured figure's rate (bytes per second), as of the    \
	 * latest sample. */                                                   \
	double growth;

struct mts_figures {
	MTS_FIGURES_MEMBERS
};

/* Inside struct mts_group and struct mts_totals: see above. */
#define MTS_FIGURES_EMBED                                                      \
	union {                                                                \
		struct mts_figures fig;                                        \
		struct {                                                       \
			MTS_FIGURES_MEMBERS                                    \
		};                                                             \
	}

/* A figure's unit, which also says how it is stored. */
enum mts_fig_unit {
	MTS_FIG_BYTES, /* uint64_t */
	MTS_FIG_COUNT, /* uint32_t */
	MTS_FIG_STATE, /* uint32_t, enum mtshm_state: one gauge per state */
	MTS_FIG_BYTES_PER_S, /* double */
};

/* Where a figure goes, and how. */
#define MTS_FIG_METRICS  0x1u /* /metrics, fleet and group families */
#define MTS_FIG_PROTO    0x2u /* GetUsage: Usage and GroupUsage */
#define MTS_FIG_HOOKS    0x4u /* the hooks' environment */
#define MTS_FIG_ABSENT_0 0x8u /* /metrics: no sample while 0 (a limit) */
/* Summed over the groups /metrics folds into "_other" (a state takes the
 * worst of theirs); left at 0 there otherwise (a sum of limits would
 * compare to nothing). */
#define MTS_FIG_SUMS 0x10u

struct mts_figure {
	const char *name; /* the member, for logs and tests */
	size_t offset;    /* in struct mts_figures */
	enum mts_fig_unit unit;
	unsigned out; /* MTS_FIG_* */
	/* /metrics: the families, fleet's and group's (series labelled
	 * group=...), and their HELP texts. */
	const char *fleet_metric, *fleet_help;
	const char *group_metric, *group_help;
	/* GetUsage: the field numbers in Usage and in GroupUsage (0: not
	 * there). */
	unsigned usage_field, group_field;
	const char *env; /* hooks: the variable's name */
};

/* The table, in the order /metrics renders the fleet's families (the
 * groups': bytes and counts, then rates, then states). */
extern const struct mts_figure mts_figure_table[];
extern const size_t mts_figure_count;

/* Figure `f` of `v` as an integer (a rate: truncated) or as a double. */
uint64_t mts_figure_u64(const struct mts_figures *v,
                        const struct mts_figure *f);
double mts_figure_f64(const struct mts_figures *v, const struct mts_figure *f);

/* Add `g`'s figures to `sum` per MTS_FIG_SUMS (saturating). */
void mts_figures_add(struct mts_figures *sum, const struct mts_figures *g);

#endif /* MTS_FIGURES_H */
