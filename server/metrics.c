/*
 * metrics.c - the Prometheus endpoint: render the registry as text
 * exposition 0.0.4 and serve it at /metrics over HTTP.
 *
 * Threads. The registry belongs to the loop thread and is not locked, so
 * the HTTP side never reads it. libmicrohttpd runs on a thread of its own
 * (MHD_USE_INTERNAL_POLLING_THREAD). It is a well-kept HTTP parser, and a
 * slow or hostile scraper on its thread cannot stall the loop. The two
 * threads share only what struct mts_metrics keeps under `mu`: the latest
 * rendered text, when it was rendered, a render sequence number and the
 * `serving` flag.
 *
 * Rendering on demand. A scrape that finds the text older than
 * MTS_METRICS_FRESH_MS wakes the loop with uv_async_send(). It waits on
 * `cv`, at most MTS_METRICS_WAIT_MS, for the loop to render a new text and
 * swap it in. Then it copies the text out under `mu` and answers. So:
 *  - Staleness bound: a 200 answer holds a snapshot of the loop's state
 *    taken at most MTS_METRICS_FRESH_MS before the scrape was handled, or
 *    during it. The figures are those of the tick before that snapshot.
 *  - Cost: nothing while nobody scrapes, where a periodic render would
 *    cost its time every period for thousands of processes. At most one
 *    render runs per MTS_METRICS_FRESH_MS, however hard a client hammers.
 *  - A loop that does not answer within MTS_METRICS_WAIT_MS gets the
 *    scrape a 503, not old figures. Prometheus then records the target as
 *    down, which is the truth about a stuck server.
 * The render runs on the loop thread outside `mu`. The lock is held only
 * for a buffer swap (loop) and a memcpy (HTTP thread).
 *
 * Listening. We bind the socket ourselves and hand it to libmicrohttpd
 * (MHD_OPTION_LISTEN_SOCKET), so that mts_metrics_start() can return the
 * real -errno (EADDRINUSE, EACCES, ...) rather than a bare failure. IPv6
 * sockets are dual-stack (IPV6_V6ONLY off, as MHD_USE_DUAL_STACK does), so
 * "[::]:PORT" serves IPv4 scrapers too. Port 0 picks a free port. The
 * bound one is logged (`msg="metrics listening" addr=...`) and returned by
 * mts_metrics_port().
 *
 * HTTP. GET and HEAD of /metrics; libmicrohttpd drops the body of a HEAD
 * answer itself. Other methods get 405 with Allow, other paths 404. No
 * compression: scrapers ask for gzip but accept identity.
 *
 * Exposition. Each family has # HELP and # TYPE and all its samples
 * together; `promtool check metrics` is clean on it.
 *  - Units are bytes and seconds, and counters end in _total. States use
 *    the usual enum pattern: one gauge per state, exactly one of them 1,
 *    none when the recorded state is not one we know.
 *  - A limit of 0 means "none". Its sample is left out rather than shown
 *    as 0, so `accounted / limit` alerts see no series instead of +Inf. A
 *    family with no sample at all is left out whole.
 *  - `unregistered` counts workers refused a slot since start. It only
 *    grows, so it is the counter memtally_unregistered_processes_total.
 *  - Label values come from workers (group) and the kernel (comm, which
 *    prctl() lets a process set to any bytes). Prometheus rejects the
 *    whole scrape on an invalid label value. So backslash, double quote
 *    and newline are escaped as the format requires, and bytes that are
 *    not UTF-8 become U+FFFD.
 *  - Per-process series carry pid, group and comm. The slot count bounds
 *    their number, but every new pid is a new series. They are rendered
 *    only when [metrics] per_process is true.
 *  - Group names come from workers, so group series are bounded to
 *    [metrics] max_groups: the configured groups first, then the largest
 *    by accounted bytes. The others are summed into one series,
 *    group="_other". A worker's own group named "_other" is always summed
 *    there, so no two series share a label set.
 */
#include "mts_metrics.h"

#include <arpa/inet.h>
#include <errno.h>
#include <math.h>
#include <netdb.h>
#include <netinet/in.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <microhttpd.h>

#include "mts_admit.h"
#include "mts_config.h"
#include "mts_core.h"
#include "mts_defs.h"
#include "mts_dispatch.h"
#include "mts_fault.h"
#include "mts_figures.h"
#include "mts_kinds.h"
#include "mts_guard.h"
#include "mts_limits.h"
#include "mts_auth.h"
#include "mts_policy.h"
#include "mts_log.h"
#include "mt_sockdiag.h"
#include "mtshm.h"

#define FRESH_NS ((uint64_t)MTS_METRICS_FRESH_MS * 1000000u)

/* libmicrohttpd limits. A scraper needs one connection at a time; the
 * rest is room for a few of them beside clients that hold connections
 * open. libmicrohttpd's timeout counts idle time, so a client sending a
 * byte every few seconds would hold a connection for ever: a request's
 * headers must also be in HTTP_REQUEST_DEADLINE_S after the connection
 * opened or its previous answer went, and a client that reads an answer a
 * few bytes at a time (an answer larger than the socket's buffer, as
 * per-process series make) must have it all HTTP_ANSWER_DEADLINE_S after
 * its request (the reaper, below). A scraper gives up sooner: Prometheus'
 * scrape_timeout is 10 s by default. */
#define HTTP_CONNECTION_LIMIT 64u
/* Connections shut down and not yet closed by libmicrohttpd, above the
 * limit: room for a token's holder to come in when untokened ones hold
 * every place (on_accept). */
#define HTTP_CLOSING_ROOM       16u
#define HTTP_TABLE              (HTTP_CONNECTION_LIMIT + HTTP_CLOSING_ROOM)
#define HTTP_PER_IP_LIMIT       8u
#define HTTP_IDLE_TIMEOUT_S     5u
#define HTTP_REQUEST_DEADLINE_S 5u
#define HTTP_ANSWER_DEADLINE_S  15u
#define HTTP_REAP_MS            1000u
/* Each answer is a copy of the text, held until it is sent (up to
 * HTTP_ANSWER_DEADLINE_S). Slow readers holding every connection would
 * pin HTTP_TABLE copies: of a text of per-process series (tens of MiB),
 * gigabytes in memtallyd, which the kernel's OOM killer spares and the
 * workers pay for. Past this many bytes in flight a scrape gets 503 (one
 * answer always goes, whatever its size). */
#define HTTP_INFLIGHT_MAX (UINT64_C(64) << 20)
#define LISTEN_BACKLOG    16

/* ---- rendering ------------------------------------------------------- */

_Static_assert(MTSHM_STATE_OK == 0 && MTSHM_STATE_HIGH == 1 &&
                   MTSHM_STATE_OVER == 2,
               "mt_state_name() follows enum mtshm_state");

/* An output buffer that remembers its first error, so the renderer can
 * append without checking every call and look once at the end. */
struct out {
	struct mts_buf *b;
	int err;
};

static void put(struct out *o, const void *p, size_t n)
{
	if (o->err || n == 0)
		return;
	int err = mts_buf_reserve(o->b, n);
	if (err < 0) {
		o->err = err;
		return;
	}
	memcpy(o->b->data + o->b->len, p, n);
	o->b->len += n;
}

static void put_str(struct out *o, const char *s)
{
	put(o, s, strlen(s));
}

static void put_u64(struct out *o, uint64_t v)
{
	char d[20];
	size_t n = sizeof(d);
	do {
		d[--n] = (char)('0' + v % 10);
		v /= 10;
	} while (v);
	put(o, d + n, sizeof(d) - n);
}

/* Nanoseconds as exact decimal seconds, "0.001500000": no floating point,
 * no locale. */
static void put_seconds(struct out *o, uint64_t ns)
{
	char frac[10];
	uint64_t f = ns % 1000000000u;
	put_u64(o, ns / 1000000000u);
	frac[0] = '.';
	for (int i = 9; i >= 1; i--) {
		frac[i] = (char)('0' + f % 10);
		f /= 10;
	}
	put(o, frac, sizeof(frac));
}

/* A float sample value. memtallyd never calls setlocale(), so the C
 * locale's '.' is the decimal point the format wants. */
static void put_f64(struct out *o, double v)
{
	char d[32];
	int n = isfinite(v) ? snprintf(d, sizeof(d), "%.9g", v)
	                    : snprintf(d, sizeof(d), "NaN");
	put(o, d, (size_t)n);
}

/* Length of the well-formed UTF-8 sequence at s (NUL-terminated), or 0:
 * overlong forms, surrogates and code points past U+10FFFF are not. Reads
 * no byte past a NUL. */
static size_t utf8_len(const unsigned char *s)
{
	unsigned char c = s[0], lo = 0x80, hi = 0xbf;
	if (c < 0x80)
		return 1;
	if (c >= 0xc2 && c <= 0xdf)
		return (s[1] & 0xc0) == 0x80 ? 2 : 0;
	if (c >= 0xe0 && c <= 0xef) {
		if (c == 0xe0)
			lo = 0xa0;
		if (c == 0xed)
			hi = 0x9f;
		if (s[1] < lo || s[1] > hi)
			return 0;
		return (s[2] & 0xc0) == 0x80 ? 3 : 0;
	}
	if (c >= 0xf0 && c <= 0xf4) {
		if (c == 0xf0)
			lo = 0x90;
		if (c == 0xf4)
			hi = 0x8f;
		if (s[1] < lo || s[1] > hi)
			return 0;
		if ((s[2] & 0xc0) != 0x80 || (s[3] & 0xc0) != 0x80)
			return 0;
		return 4;
	}
	return 0;
}

/* A quoted label value: \\, \" and \n escaped, non-UTF-8 bytes as U+FFFD. */
static void put_label_value(struct out *o, const char *s)
{
	const unsigned char *p = (const unsigned char *)(s ? s : "");
	put(o, "\"", 1);
	while (*p) {
		const unsigned char *run = p;
		size_t n = 0;
		while (*p && *p != '\\' && *p != '"' && *p != '\n') {
			n = utf8_len(p);
			if (n == 0)
				break;
			p += n;
		}
		put(o, run, (size_t)(p - run));
		if (!*p)
			break;
		if (*p == '\\')
			put(o, "\\\\", 2);
		else if (*p == '"')
			put(o, "\\\"", 2);
		else if (*p == '\n')
			put(o, "\\n", 2);
		else
			put(o, "\xef\xbf\xbd", 3);
		p++;
	}
	put(o, "\"", 1);
}

static void family(struct out *o, const char *name, const char *type,
                   const char *help)
{
	put_str(o, "# HELP ");
	put_str(o, name);
	put(o, " ", 1);
	put_str(o, help);
	put_str(o, "\n# TYPE ");
	put_str(o, name);
	put(o, " ", 1);
	put_str(o, type);
	put(o, "\n", 1);
}

static void sample(struct out *o, const char *name, uint64_t v)
{
	put_str(o, name);
	put(o, " ", 1);
	put_u64(o, v);
	put(o, "\n", 1);
}

/* A gauge family of one unlabelled sample. */
static void gauge(struct out *o, const char *name, const char *help, uint64_t v)
{
	family(o, name, "gauge", help);
	sample(o, name, v);
}

static void counter(struct out *o, const char *name, const char *help,
                    uint64_t v)
{
	family(o, name, "counter", help);
	sample(o, name, v);
}

/*
 * Pre-rendered label sets, `k="v",k="v"` without braces, one per group
 * (by group index) or per process (by dense index): the same set is used
 * by several families, and escaping it once keeps a render of thousands
 * of processes cheap.
 */
struct labels {
	struct mts_buf text;
	size_t *off; /* n + 1 offsets into text; set i is [off[i], off[i+1]) */
	uint32_t n;
	/* Groups only: which sets are rendered (group i for i < n - 1,
	 * "_other" at n - 1), and the sum "_other" stands for. */
	bool *shown;
	struct mts_figures other;
};

static int labels_init(struct labels *l, uint32_t n)
{
	memset(l, 0, sizeof(*l));
	l->off = calloc((size_t)n + 1, sizeof(*l->off));
	l->n = n;
	return l->off ? 0 : -ENOMEM;
}

static void labels_free(struct labels *l)
{
	mts_buf_free(&l->text);
	free(l->off);
	free(l->shown);
	l->off = NULL;
	l->shown = NULL;
}

/* name{<set i><extra>} v */
static void sample_l(struct out *o, const char *name, const struct labels *l,
                     uint32_t i, const char *extra, uint64_t v)
{
	put_str(o, name);
	put(o, "{", 1);
	put(o, l->text.data + l->off[i], l->off[i + 1] - l->off[i]);
	if (extra)
		put_str(o, extra);
	put(o, "} ", 2);
	put_u64(o, v);
	put(o, "\n", 1);
}

/* The usual enum pattern: name{...,state="ok|high|over"}, one of them 1. */
static void state_samples(struct out *o, const char *name,
                          const struct labels *l, uint32_t i, uint32_t state)
{
	for (uint32_t s = 0; s < 3; s++) {
		const char *extra = s == 0   ? ",state=\"ok\""
		                    : s == 1 ? ",state=\"high\""
		                             : ",state=\"over\"";
		if (l) {
			sample_l(o, name, l, i, extra, state == s);
		} else {
			put_str(o, name);
			put_str(o, "{state=\"");
			put_str(o, mt_state_name(s));
			put_str(o, "\"} ");
			put_u64(o, state == s);
			put(o, "\n", 1);
		}
	}
}

static bool group_live(const struct mts_registry *reg, uint32_t i)
{
	return reg->groups[i].name != NULL;
}

/* Group series i (0 .. groups_used, the last "_other") is rendered. */
static bool group_shown(const struct labels *gl, uint32_t i)
{
	return gl->shown[i];
}

/* The figures of group series i. */
static const struct mts_figures *group_at(const struct mts_registry *reg,
                                          const struct labels *gl, uint32_t i)
{
	return i < reg->groups_used ? &reg->groups[i].fig : &gl->other;
}

struct gsize {
	uint64_t bytes;
	uint32_t i;
};

static int gsize_desc(const void *a, const void *b)
{
	const struct gsize *x = a, *y = b;
	if (x->bytes != y->bytes)
		return x->bytes < y->bytes ? 1 : -1;
	return x->i < y->i ? -1 : x->i > y->i;
}

/* Which groups get series of their own (see the top of the file), and
 * the sum of the rest. 0 or -ENOMEM. */
static int select_groups(const struct mts_registry *reg, struct labels *gl)
{
	uint32_t n = reg->groups_used;
	gl->shown = calloc((size_t)n + 1, sizeof(*gl->shown));
	struct gsize *rest = calloc(n ? n : 1, sizeof(*rest));
	if (!gl->shown || !rest) {
		free(rest);
		return -ENOMEM;
	}
	uint32_t max = reg->policy.metrics_max_groups, nshown = 0, nrest = 0;
	for (uint32_t i = 0; i < n; i++) {
		const struct mts_group *g = &reg->groups[i];
		if (!g->name)
			continue;
		if (strcmp(g->name, "_other") != 0 &&
		    mts_policy_group(&reg->policy, g->name)) {
			gl->shown[i] = true;
			nshown++;
		} else {
			rest[nrest++] = (struct gsize){g->bytes, i};
		}
	}
	qsort(rest, nrest, sizeof(*rest), gsize_desc);
	memset(&gl->other, 0, sizeof(gl->other));
	for (uint32_t k = 0; k < nrest; k++) {
		uint32_t i = rest[k].i;
		if (nshown < max &&
		    strcmp(reg->groups[i].name, "_other") != 0) {
			gl->shown[i] = true;
			nshown++;
		} else {
			mts_figures_add(&gl->other, &reg->groups[i].fig);
			gl->shown[n] = true;
		}
	}
	free(rest);
	return 0;
}

static const struct mts_proc *dense_proc(const struct mts_registry *reg,
                                         uint32_t i)
{
	return reg->by_slot[reg->dense[i]];
}

static int build_group_labels(const struct mts_registry *reg, struct labels *gl)
{
	int err = labels_init(gl, reg->groups_used + 1);
	if (err < 0 || (err = select_groups(reg, gl)) < 0)
		return err;
	struct out o = {.b = &gl->text};
	for (uint32_t i = 0; i < reg->groups_used; i++) {
		if (group_live(reg, i)) {
			put_str(&o, "group=");
			put_label_value(&o, reg->groups[i].name);
		}
		gl->off[i + 1] = gl->text.len;
	}
	put_str(&o, "group=\"_other\"");
	gl->off[reg->groups_used + 1] = gl->text.len;
	return o.err;
}

static int build_proc_labels(const struct mts_registry *reg,
                             const struct labels *gl, struct labels *pl)
{
	int err = labels_init(pl, reg->ndense);
	if (err < 0)
		return err;
	struct out o = {.b = &pl->text};
	for (uint32_t i = 0; i < reg->ndense; i++) {
		const struct mts_proc *p = dense_proc(reg, i);
		put_str(&o, "pid=\"");
		put_u64(&o, p->pid);
		put_str(&o, "\",");
		if (p->group < reg->groups_used)
			put(&o, gl->text.data + gl->off[p->group],
			    gl->off[p->group + 1] - gl->off[p->group]);
		put_str(&o, ",comm=");
		put_label_value(&o, p->comm);
		pl->off[i + 1] = pl->text.len;
	}
	return o.err;
}

/* The offset to roll back to if a family turns out to have no sample. */
static size_t mark(const struct out *o)
{
	return o->b->len;
}

static void drop_if_empty(struct out *o, size_t at, bool any)
{
	if (!any && !o->err)
		o->b->len = at;
}

/* The forecast made from the growth rate follows its family. */
static bool is_growth(const struct mts_figure *f)
{
	return f->offset == offsetof(struct mts_figures, growth);
}

static void fleet_forecast(struct out *o, const struct mts_registry *reg)
{
	/* No forecast, no sample (as for the limit): a NaN would be a value
	 * that alerts and graphs must all special-case. */
	double fc = mts_fleet_forecast(reg);
	if (fc > 0) {
		family(o, "memtally_fleet_seconds_to_limit", "gauge",
		       "Seconds until the fleet reaches its limit at its "
		       "growth rate; absent without a forecast.");
		put_str(o, "memtally_fleet_seconds_to_limit ");
		put_f64(o, fc);
		put(o, "\n", 1);
	}
}

/* One row of mts_figure_table for the fleet. */
static void fleet_figure(struct out *o, const struct mts_registry *reg,
                         const struct mts_figure *f)
{
	const struct mts_figures *t = &reg->totals.fig;
	const char *name = f->fleet_metric;
	uint64_t v = mts_figure_u64(t, f);
	switch (f->unit) {
	case MTS_FIG_STATE:
		family(o, name, "gauge", f->fleet_help);
		state_samples(o, name, NULL, 0, (uint32_t)v);
		break;
	case MTS_FIG_BYTES_PER_S:
		family(o, name, "gauge", f->fleet_help);
		put_str(o, name);
		put(o, " ", 1);
		put_f64(o, mts_figure_f64(t, f));
		put(o, "\n", 1);
		if (is_growth(f))
			fleet_forecast(o, reg);
		break;
	case MTS_FIG_BYTES:
	case MTS_FIG_COUNT:
		if (v || !(f->out & MTS_FIG_ABSENT_0))
			gauge(o, name, f->fleet_help, v);
		break;
	}
}

static void render_fleet(struct out *o, const struct mts_registry *reg)
{
	for (size_t k = 0; k < mts_figure_count; k++)
		if (mts_figure_table[k].out & MTS_FIG_METRICS)
			fleet_figure(o, reg, &mts_figure_table[k]);
	/* The fleet's own. */
	counter(o, "memtally_unregistered_processes_total",
	        "Workers refused a slot because the segment was full; they run "
	        "unaccounted.",
	        reg->totals.unregistered);
	gauge(o, "memtally_slots", "Slots in the shared segment.",
	      reg->slot_count);
	gauge(o, "memtally_slots_free", "Slots free for new workers.",
	      reg->nfree);
}

/* name{<set i>} v, v a float. */
static void sample_lf(struct out *o, const char *name, const struct labels *l,
                      uint32_t i, double v)
{
	put_str(o, name);
	put(o, "{", 1);
	put(o, l->text.data + l->off[i], l->off[i + 1] - l->off[i]);
	put(o, "} ", 2);
	put_f64(o, v);
	put(o, "\n", 1);
}

static void group_forecasts(struct out *o, const struct mts_registry *reg,
                            const struct labels *gl)
{
	size_t at = mark(o);
	bool any = false;
	family(o, "memtally_group_seconds_to_limit", "gauge",
	       "Seconds until a group reaches its limit at its growth rate; "
	       "absent for a group without a forecast.");
	for (uint32_t i = 0; i < reg->groups_used; i++) {
		if (!group_shown(gl, i))
			continue;
		double fc = mts_group_forecast(reg, &reg->groups[i]);
		if (fc > 0) {
			sample_lf(o, "memtally_group_seconds_to_limit", gl, i,
			          fc);
			any = true;
		}
	}
	drop_if_empty(o, at, any);
}

/* One row of mts_figure_table over the group series; a family with no
 * sample is left out. */
static void group_figure(struct out *o, const struct mts_registry *reg,
                         const struct labels *gl, const struct mts_figure *f)
{
	const char *name = f->group_metric;
	size_t at = mark(o);
	bool any = false;
	family(o, name, "gauge", f->group_help);
	for (uint32_t i = 0; i <= reg->groups_used; i++) {
		if (!group_shown(gl, i))
			continue;
		const struct mts_figures *g = group_at(reg, gl, i);
		uint64_t v = mts_figure_u64(g, f);
		switch (f->unit) {
		case MTS_FIG_STATE:
			state_samples(o, name, gl, i, (uint32_t)v);
			break;
		case MTS_FIG_BYTES_PER_S:
			sample_lf(o, name, gl, i, mts_figure_f64(g, f));
			break;
		case MTS_FIG_BYTES:
		case MTS_FIG_COUNT:
			if (!v && (f->out & MTS_FIG_ABSENT_0))
				continue;
			sample_l(o, name, gl, i, NULL, v);
			break;
		}
		any = true;
	}
	drop_if_empty(o, at, any);
	if (is_growth(f))
		group_forecasts(o, reg, gl);
}

/* The groups' families come in three passes over the table: bytes and
 * counts, then rates, then states. */
static int group_pass(enum mts_fig_unit u)
{
	return u == MTS_FIG_BYTES_PER_S ? 1 : u == MTS_FIG_STATE ? 2 : 0;
}

static void render_groups(struct out *o, const struct mts_registry *reg,
                          const struct labels *gl)
{
	for (int pass = 0; pass < 3; pass++) {
		for (size_t k = 0; k < mts_figure_count; k++) {
			const struct mts_figure *f = &mts_figure_table[k];
			if ((f->out & MTS_FIG_METRICS) &&
			    group_pass(f->unit) == pass)
				group_figure(o, reg, gl, f);
		}
	}
}

enum pfield {
	P_BYTES,
	P_MAPPED,
	P_AFREE,
	P_UNVOUCHED,
	P_RSS,
	P_LIMIT,
	P_PEAK,
	P_THREADS,
	P_OVER
};

static uint64_t proc_value(const struct mts_proc *p, enum pfield f)
{
	switch (f) {
	case P_BYTES:
		return p->bytes;
	case P_MAPPED:
		return p->mapped;
	case P_AFREE:
		return p->allocator_free;
	case P_UNVOUCHED:
		return p->unvouched;
	case P_RSS:
		return p->rss;
	case P_LIMIT:
		return p->limit;
	case P_PEAK:
		return p->peak;
	case P_THREADS:
		return p->threads;
	case P_OVER:
		return p->state == MTSHM_STATE_OVER;
	}
	return 0;
}

static void proc_family(struct out *o, const struct mts_registry *reg,
                        const struct labels *pl, const char *name,
                        const char *help, enum pfield f, bool skip_zero)
{
	size_t at = mark(o);
	bool any = false;
	family(o, name, "gauge", help);
	for (uint32_t i = 0; i < reg->ndense; i++) {
		uint64_t v = proc_value(dense_proc(reg, i), f);
		if (skip_zero && v == 0)
			continue;
		sample_l(o, name, pl, i, NULL, v);
		any = true;
	}
	drop_if_empty(o, at, any);
}

static void render_procs(struct out *o, const struct mts_registry *reg,
                         const struct labels *pl)
{
	proc_family(o, reg, pl, "memtally_process_accounted_bytes",
	            "Bytes a worker has allocated, as of the latest tick.",
	            P_BYTES, false);
	proc_family(o, reg, pl, "memtally_process_mapped_bytes",
	            "Part of a worker's accounted bytes: memory it mapped "
	            "itself.",
	            P_MAPPED, false);
	proc_family(o, reg, pl, "memtally_process_allocator_free_bytes",
	            "Part of a worker's accounted bytes: memory its allocator "
	            "keeps free for it.",
	            P_AFREE, false);
	proc_family(o, reg, pl, "memtally_process_unvouched_bytes",
	            "Part of a worker's accounted bytes the kernel does not "
	            "vouch for (untrusted users only); not added to its group "
	            "or the fleet.",
	            P_UNVOUCHED, false);
	proc_family(o, reg, pl, "memtally_process_rss_bytes",
	            "Resident anonymous and shared memory of a worker (RssAnon "
	            "+ RssShmem).",
	            P_RSS, false);
	proc_family(o, reg, pl, "memtally_process_limit_bytes",
	            "Per-process limit in force; absent when there is none.",
	            P_LIMIT, true);
	proc_family(o, reg, pl, "memtally_process_peak_bytes",
	            "Highest accounted bytes seen for a worker.", P_PEAK,
	            false);
	proc_family(o, reg, pl, "memtally_process_threads",
	            "Live threads of a worker, as its slot reports them.",
	            P_THREADS, false);
	proc_family(o, reg, pl, "memtally_process_over_limit",
	            "1 while a worker is over its own limit.", P_OVER, false);
}

static int kind_learned_desc(const void *a, const void *b)
{
	const struct mts_kind *x = *(const struct mts_kind *const *)a;
	const struct mts_kind *y = *(const struct mts_kind *const *)b;
	if (x->est_bytes != y->est_bytes)
		return x->est_bytes < y->est_bytes ? 1 : -1;
	return x->uid < y->uid ? -1 : x->uid > y->uid;
}

/* Kinds: totals always; per kind only with [metrics] per_kind (a kind
 * name says what a user's job is, as a task name does, and /metrics has
 * no peer to ask), and then at most max_groups series, the largest
 * learned sizes first. */
static void render_kinds(struct out *o, const struct mts_registry *reg)
{
	const struct mts_kinds *ks = reg->kinds;
	if (!ks)
		return;
	gauge(o, "memtally_kinds", "Kinds with learned sizes kept (per uid).",
	      ks->n);
	counter(o, "memtally_kind_runs_total",
	        "Finished tasks recorded against their kind.",
	        ks->runs_recorded);
	counter(o, "memtally_kind_runs_dropped_total",
	        "Finished tasks whose kind could not be kept (caps).",
	        ks->runs_dropped);
	counter(o, "memtally_kind_evictions_total",
	        "Tasks of a kind ended by the node guard.", ks->evictions);
	if (!reg->policy.metrics_per_kind)
		return;
	struct mts_kind **list;
	int n = mts_kinds_list(reg, &list);
	if (n <= 0) {
		/* None yet: no list to sort (qsort of NULL is undefined),
		 * and no family (a HELP and TYPE without a sample is one
		 * promtool flags). */
		o->err = n;
		return;
	}
	uint64_t now_s = mts_now_realtime() / 1000000000u;
	for (int i = 0; i < n; i++) {
		uint64_t b;
		uint32_t r;
		if (mts_kind_estimate(reg, list[i], now_s, &b, &r) < 0)
			list[i]->est_bytes = 0;
	}
	qsort(list, (size_t)n, sizeof(*list), kind_learned_desc);
	uint32_t shown = (uint32_t)n < reg->policy.metrics_max_groups
	                     ? (uint32_t)n
	                     : reg->policy.metrics_max_groups;
	/* The per-kind evictions and runs have names of their own: beside
	 * the unlabelled memtally_kind_evictions_total and
	 * memtally_kind_runs_total, one family of the same stem would be two
	 * families to an OpenMetrics reader (a counter's family is its name
	 * less _total). */
	static const char *const names[] = {
	    "memtally_kind_learned_bytes", "memtally_kind_learned_runs",
	    "memtally_kind_guard_evictions_total"};
	static const char *const helps[] = {
	    ("The size admission reserves for the kind's next task (0: no "
	     "history)."),
	    "Runs the learned size is taken from.",
	    "Tasks of the kind the node guard ended."};
	for (int f = 0; f < 3; f++) {
		family(o, names[f], f == 2 ? "counter" : "gauge", helps[f]);
		for (uint32_t i = 0; i < shown; i++) {
			const struct mts_kind *k = list[i];
			put_str(o, names[f]);
			put_str(o, "{kind=");
			put_label_value(o, k->name);
			put_str(o, ",uid=\"");
			put_u64(o, k->uid);
			put_str(o, "\"} ");
			put_u64(o, f == 0   ? k->est_bytes
			           : f == 1 ? k->est_runs
			                    : k->evictions);
			put(o, "\n", 1);
		}
	}
	free(list);
}

static void render_counters(struct out *o, const struct mts_registry *reg,
                            const struct mts_conn_stats *cs,
                            const struct mts_reload_stats *rs)
{
	const struct mts_stats *s = &reg->stats;
	const struct mts_admit_stats *a = &reg->adm->stats;
	const struct mts_dispatch_stats *q = reg->req;
	counter(o, "memtally_registrations_total",
	        "Successful worker registrations.", s->registrations);
	counter(o, "memtally_reclaims_total",
	        "Slots reclaimed when their worker exited.", s->reclaims);
	counter(o, "memtally_slot_page_faults_total",
	        "Slot-table pages memtallyd could not read (a hole punched "
	        "in them under strict overcommit), answered with a spare "
	        "page; their workers count as the kernel vouches for them.",
	        mts_fault_count());
	counter(o, "memtally_admissions_total", "Admit requests granted.",
	        a->admissions);
	family(o, "memtally_denials_total", "counter",
	       "Admit requests denied, by the reason that decided.");
	for (uint32_t i = 0; i < MTS_DENY__COUNT; i++) {
		put_str(o, "memtally_denials_total{reason=\"");
		put_str(o, mts_denial_name((enum mts_denial)i));
		put_str(o, "\"} ");
		put_u64(o, a->denials[i]);
		put(o, "\n", 1);
	}
	counter(o, "memtally_releases_total",
	        "Reservations ended by a Release.", a->releases);
	counter(o, "memtally_reservation_expirations_total",
	        "Reservations ended by their TTL.", a->expirations);
	counter(o, "memtally_reservations_fulfilled_total",
	        "Reservations ended because every worker of their task "
	        "exited.",
	        a->fulfilled);
	counter(o, "memtally_enforcement_signals_total",
	        "Signals sent to processes over their limit.",
	        reg->lim->enforcement_signals);
	const struct mts_guard_state *g = reg->guard;
	if (g) {
		counter(o, "memtally_guard_evictions_total",
		        "Tasks evicted by the node guard.", g->evictions);
		counter(o, "memtally_guard_pauses_total",
		        "Growing tasks the node guard paused (SIGSTOP) "
		        "instead of evicting them at once.",
		        g->pauses);
		counter(o, "memtally_guard_resumes_total",
		        "Paused tasks resumed (SIGCONT) rather than evicted.",
		        g->resumed);
		counter(o, "memtally_guard_processes_killed_total",
		        "Processes killed by the node guard's evictions, "
		        "workers and their descendants.",
		        g->signalled);
		counter(o, "memtally_guard_reads_total",
		        "Reads of the node's figure by the guard.", g->reads);
		family(o, "memtally_guard_read_seconds_total", "counter",
		       "Time the loop spent reading the node's figure.");
		put_str(o, "memtally_guard_read_seconds_total ");
		char num[32];
		snprintf(num, sizeof(num), "%.6f\n", (double)g->read_ns / 1e9);
		put_str(o, num);
		if (g->src.kind != MTS_NODE_NONE && g->known) {
			gauge(o, "memtally_node_bytes",
			      "The node's memory in use as the kernel counts "
			      "it (the guard's figure).",
			      g->node.mem_usage);
			gauge(o, "memtally_node_limit_bytes",
			      "The node's limit (its memory cgroup's, or "
			      "MemTotal).",
			      g->node.mem_limit);
			gauge(o, "memtally_node_line_bytes",
			      "The node guard's line.", g->node.mem_line);
		}
		/* Strict overcommit only: a second edge, the machine's. */
		if (g->src.kind != MTS_NODE_NONE && g->known &&
		    g->node.commit_limit) {
			gauge(o, "memtally_node_committed_bytes",
			      "The machine's commit charge (Committed_AS), "
			      "guarded under strict overcommit.",
			      g->node.committed);
			gauge(o, "memtally_node_commit_limit_bytes",
			      "CommitLimit, past which the kernel refuses "
			      "allocations.",
			      g->node.commit_limit);
			gauge(o, "memtally_node_commit_line_bytes",
			      "The node guard's line against CommitLimit.",
			      g->node.commit_line);
		}
	}
	counter(o, "memtally_watch_events_total",
	        "Events sent to Watch subscribers.",
	        q->events + (cs ? cs->watch_events : 0));
	counter(o, "memtally_watch_disconnects_total",
	        "Watch subscribers disconnected for not reading their events.",
	        cs ? cs->watch_disconnects : 0);
	counter(o, "memtally_auth_denials_total",
	        "SetLimit or Release requests refused to an unauthorised peer.",
	        q->auth_denials + a->auth_denials);
	if (rs) {
		counter(o, "memtally_config_reloads_total",
		        "Configuration reloads (SIGHUP) applied.", rs->applied);
		counter(o, "memtally_config_reload_failures_total",
		        "Configuration reloads rejected; the old configuration "
		        "stays.",
		        rs->rejected);
	}
	counter(o, "memtally_protocol_errors_total",
	        "Error responses to malformed frames.", q->protocol_errors);
	unsigned long long by_uid, by_scope;
	mts_log_suppressed(&by_uid, &by_scope);
	family(o, "memtally_log_lines_suppressed_total", "counter",
	       "Log lines held back by the per-uid and per-scope budgets "
	       "(each reported in a summary line).");
	put_str(o, "memtally_log_lines_suppressed_total{budget=\"uid\"} ");
	put_u64(o, by_uid);
	put_str(o, "\nmemtally_log_lines_suppressed_total{budget=\"scope\"} ");
	put_u64(o, by_scope);
	put(o, "\n", 1);
	if (cs) {
		gauge(o, "memtally_connections", "Open client connections.",
		      cs->open);
		gauge(o, "memtally_connections_max",
		      "Connections allowed at once (max_connections).",
		      cs->max);
		counter(
		    o, "memtally_connections_rejected_total",
		    "Connections closed at once: max_connections were open.",
		    cs->rejected);
		gauge(o, "memtally_connections_max_per_uid",
		      "Connections one uid may have open "
		      "(max_connections_per_uid).",
		      cs->max_per_uid);
		counter(o, "memtally_connections_rejected_per_uid_total",
		        "Connections closed at once: their uid had "
		        "max_connections_per_uid open.",
		        cs->rejected_uid);
		counter(
		    o, "memtally_connections_idle_closed_total",
		    "Connections closed after idle_timeout without a request.",
		    cs->idle_closed);
		counter(o, "memtally_connections_untokened_closed_total",
		        "Connections of unknown uid closed without the token: "
		        "none shown within 5 s, a request without it, or "
		        "their place taken by a newer one.",
		        cs->untokened);
		gauge(o, "memtally_connection_buffered_bytes",
		      "Input and unwritten output held for all connections.",
		      cs->buffered);
		gauge(
		    o, "memtally_connection_buffered_bytes_max",
		    "Cap on memtally_connection_buffered_bytes (max_buffered).",
		    cs->buffered_max);
		counter(o, "memtally_connection_budget_exceeded_total",
		        "Times the connections' buffered bytes passed "
		        "max_buffered.",
		        cs->pressure);
		counter(
		    o, "memtally_connections_throttled_total",
		    "Connections that stopped being read: over their share of "
		    "max_buffered.",
		    cs->throttled);
		counter(o, "memtally_connections_evicted_total",
		        "Connections disconnected: the largest holders, over "
		        "max_buffered for longer than a second.",
		        cs->evicted);
	}

	family(o, "memtally_tick_duration_seconds", "summary",
	       "Time one aggregation tick took.");
	put_str(o, "memtally_tick_duration_seconds_sum ");
	put_seconds(o, reg->tick->sum_ns);
	put(o, "\n", 1);
	sample(o, "memtally_tick_duration_seconds_count", reg->tick->count);
	family(o, "memtally_tick_last_duration_seconds", "gauge",
	       "Time the latest aggregation tick took.");
	put_str(o, "memtally_tick_last_duration_seconds ");
	put_seconds(o, reg->tick->last_ns);
	put(o, "\n", 1);
}

int mts_metrics_render(const struct mts_registry *reg,
                       const struct mts_conn_stats *cs,
                       const struct mts_reload_stats *rs, struct mts_buf *out)
{
	struct out o = {.b = out};
	struct labels gl, pl;
	int err = build_group_labels(reg, &gl);
	if (err < 0)
		goto fail_free_groups;
	memset(&pl, 0, sizeof(pl));
	err = reg->policy.metrics_per_process ? build_proc_labels(reg, &gl, &pl)
	                                      : 0;
	if (err < 0)
		goto fail_free_procs;

	family(&o, "memtally_build_info", "gauge",
	       "Always 1; the labels say which memtallyd this is.");
	put_str(&o, "memtally_build_info{version=");
	put_label_value(&o, MTS_VERSION);
	put_str(&o, "} 1\n");
	render_fleet(&o, reg);
	render_groups(&o, reg, &gl);
	if (reg->policy.metrics_per_process)
		render_procs(&o, reg, &pl);
	render_counters(&o, reg, cs, rs);
	render_kinds(&o, reg);
	err = o.err;

fail_free_procs:
	labels_free(&pl);
fail_free_groups:
	labels_free(&gl);
	return err;
}

/* ---- serving --------------------------------------------------------- */

/* Why /metrics ended or refused a connection: a family of its own,
 * counted on the HTTP thread and the loop's reaper, so appended to the
 * text the loop rendered rather than rendered with it. */
enum http_end {
	HTTP_END_NO_REQUEST, /* headers not in HTTP_REQUEST_DEADLINE_S */
	HTTP_END_NOT_READ,   /* answer not gone HTTP_ANSWER_DEADLINE_S */
	HTTP_END_MADE_ROOM,  /* untokened, closed for a new connection */
	HTTP_END_REFUSED,    /* refused at accept: address or table full */
	HTTP_END_N
};
static const char *const http_end_reason[HTTP_END_N] = {
    "no_request_in_time", "answer_not_read_in_time", "made_room",
    "refused_at_accept"};

struct mts_metrics {
	uv_async_t async; /* a scrape wants a fresh text; runs on the loop */
	const struct mts_registry *reg;
	const struct mts_conn_stats *cs;   /* NULL: no connection figures */
	const struct mts_reload_stats *rs; /* NULL: no reload figures */
	struct MHD_Daemon *mhd;
	uint16_t port;
	struct mts_buf spare; /* loop thread only: the next text goes here */

	pthread_mutex_t mu;
	pthread_cond_t cv; /* broadcast when seq moves or serving drops */
	/* Under mu: */
	struct mts_buf text;  /* the latest text */
	uint64_t rendered_ns; /* CLOCK_MONOTONIC at its render; 0: none */
	uint64_t seq;         /* renders attempted */
	int render_err;       /* of the latest attempt */
	bool serving;         /* the async handle is usable: set after start,
	                       * cleared by stop */
	uint64_t inflight;    /* bytes of answers not yet sent */

	/* The connections libmicrohttpd holds, for the reaper (loop thread)
	 * to end those whose request is late. */
	uv_timer_t reaper;
	pthread_mutex_t conns_mu;
	/* Under conns_mu: */
	struct http_conn {
		struct MHD_Connection *c; /* NULL: a free entry */
		int fd;
		uint64_t opened_ns;
		uint64_t since_ns; /* opened, headers in, or answer went */
		bool busy;         /* a request's headers are in */
		bool reaped;       /* shut down: going */
		bool tokened;      /* a request showed the token */
		uint32_t addr_key; /* mt_addr_key() of its peer */
	} conns[HTTP_TABLE];
	/* [metrics] token_file's token ("": none), under conns_mu: set by
	 * the loop at start and reload, read by the HTTP thread. */
	char token[MTS_TOKEN_MAX + 1];
	bool token_unusable; /* set too long: every request is refused */
	/* Connections ended or refused, by why (enum http_end), under
	 * conns_mu: appended to each answer (http_ends_format). */
	uint64_t ends[HTTP_END_N];
	int handles; /* uv handles open, freed at 0 */
};

/* Loop thread: render a text and publish it. */
static void on_render(uv_async_t *h)
{
	struct mts_metrics *m = h->data;
	m->spare.len = 0;
	int err = mts_metrics_render(m->reg, m->cs, m->rs, &m->spare);
	uint64_t now = mts_now_monotonic();

	pthread_mutex_lock(&m->mu);
	if (err == 0) {
		struct mts_buf t = m->text;
		m->text = m->spare;
		m->spare = t;
		m->rendered_ns = now;
	}
	m->render_err = err;
	m->seq++;
	pthread_cond_broadcast(&m->cv);
	pthread_mutex_unlock(&m->mu);
}

static void deadline_after_ms(struct timespec *ts, unsigned ms)
{
	clock_gettime(CLOCK_MONOTONIC, ts);
	ts->tv_sec += ms / 1000u;
	ts->tv_nsec += (long)(ms % 1000u) * 1000000L;
	if (ts->tv_nsec >= 1000000000L) {
		ts->tv_sec++;
		ts->tv_nsec -= 1000000000L;
	}
}

/* The family of /metrics' own ended connections, at buf[0..cap):
 * its length, or 0 if it did not fit. */
static size_t http_ends_format(const uint64_t *ends, char *buf, size_t cap)
{
	int n = snprintf(buf, cap,
	                 "# HELP memtally_metrics_connections_ended_total "
	                 "Connections to /metrics the server ended or "
	                 "refused, by why.\n"
	                 "# TYPE memtally_metrics_connections_ended_total "
	                 "counter\n");
	for (int i = 0; i < HTTP_END_N && n > 0 && (size_t)n < cap; i++)
		n += snprintf(buf + n, cap - (size_t)n,
		              "memtally_metrics_connections_ended_total"
		              "{reason=\"%s\"} %llu\n",
		              http_end_reason[i], (unsigned long long)ends[i]);
	return n > 0 && (size_t)n < cap ? (size_t)n : 0;
}

/* An answer's copy of the text, counted in mts_metrics.inflight until
 * libmicrohttpd frees it (answer_free). */
struct answer {
	struct mts_metrics *m;
	size_t len;
	char data[];
};

static void answer_free(void *cls)
{
	struct answer *a = cls;
	pthread_mutex_lock(&a->m->mu);
	a->m->inflight -= a->len;
	pthread_mutex_unlock(&a->m->mu);
	free(a);
}

/*
 * HTTP thread: a copy of a text no older than FRESH_NS, rendered on
 * demand. Returns the status to answer: 200 with *out (the caller hands
 * it to answer_free), 503 (the loop did not answer in time, we are
 * stopping, or HTTP_INFLIGHT_MAX is in flight: *busy) or 500 (out of
 * memory).
 */
static unsigned snapshot(struct mts_metrics *m, struct answer **out, bool *busy)
{
	unsigned status = MHD_HTTP_OK;
	bool timed_out = false;
	*out = NULL;
	*busy = false;
	uint64_t ends[HTTP_END_N];
	pthread_mutex_lock(&m->conns_mu);
	memcpy(ends, m->ends, sizeof(ends));
	pthread_mutex_unlock(&m->conns_mu);
	char own[1024];
	size_t own_len = http_ends_format(ends, own, sizeof(own));
	pthread_mutex_lock(&m->mu);
	uint64_t now = mts_now_monotonic();
	if (!m->serving) {
		status = MHD_HTTP_SERVICE_UNAVAILABLE;
	} else if (m->rendered_ns == 0 || now - m->rendered_ns > FRESH_NS) {
		uint64_t asked = m->seq;
		struct timespec until;
		deadline_after_ms(&until, MTS_METRICS_WAIT_MS);
		uv_async_send(&m->async);
		while (m->seq == asked && m->serving) {
			if (pthread_cond_timedwait(&m->cv, &m->mu, &until) ==
			    ETIMEDOUT)
				break;
		}
		if (m->seq == asked) {
			status = MHD_HTTP_SERVICE_UNAVAILABLE;
			timed_out = m->serving;
		} else if (m->render_err) {
			status = MHD_HTTP_INTERNAL_SERVER_ERROR;
		}
	}
	size_t len = m->text.len + own_len;
	if (status == MHD_HTTP_OK && m->inflight &&
	    m->inflight + len > HTTP_INFLIGHT_MAX) {
		status = MHD_HTTP_SERVICE_UNAVAILABLE;
		*busy = true;
	}
	if (status == MHD_HTTP_OK) {
		struct answer *a = malloc(sizeof(*a) + len);
		if (a) {
			a->m = m;
			a->len = len;
			memcpy(a->data, m->text.data, m->text.len);
			memcpy(a->data + m->text.len, own, own_len);
			m->inflight += len;
			*out = a;
		} else {
			status = MHD_HTTP_INTERNAL_SERVER_ERROR;
		}
	}
	pthread_mutex_unlock(&m->mu);
	if (timed_out)
		mts_log(MTS_LOG_WARN, "metrics scrape got no render in time",
		        "wait_ms=%u", MTS_METRICS_WAIT_MS);
	return status;
}

static enum MHD_Result reply_text(struct MHD_Connection *c, unsigned status,
                                  const char *text)
{
	struct MHD_Response *r = MHD_create_response_from_buffer(
	    strlen(text), (void *)text, MHD_RESPMEM_PERSISTENT);
	if (!r)
		return MHD_NO;
	MHD_add_response_header(r, MHD_HTTP_HEADER_CONTENT_TYPE,
	                        "text/plain; charset=utf-8");
	if (status == MHD_HTTP_METHOD_NOT_ALLOWED)
		MHD_add_response_header(r, MHD_HTTP_HEADER_ALLOW, "GET, HEAD");
	if (status == MHD_HTTP_UNAUTHORIZED) {
		/* A place is for a client that has the token: go. */
		MHD_add_response_header(r, MHD_HTTP_HEADER_WWW_AUTHENTICATE,
		                        "Bearer realm=\"memtally\"");
		MHD_add_response_header(r, MHD_HTTP_HEADER_CONNECTION, "close");
	}
	enum MHD_Result ret = MHD_queue_response(c, status, r);
	MHD_destroy_response(r);
	return ret;
}

static struct http_conn *conn_find(struct mts_metrics *m,
                                   const struct MHD_Connection *c)
{
	for (uint32_t i = 0; i < HTTP_TABLE; i++)
		if (m->conns[i].c == c)
			return &m->conns[i];
	return NULL;
}

/* HTTP thread: a connection opens or closes. libmicrohttpd says CLOSED
 * before it closes the socket, so the reaper never shuts down a number
 * since reused. */
static void on_connection(void *cls, struct MHD_Connection *c,
                          void **socket_context,
                          enum MHD_ConnectionNotificationCode toe)
{
	struct mts_metrics *m = cls;
	(void)socket_context;
	pthread_mutex_lock(&m->conns_mu);
	if (toe == MHD_CONNECTION_NOTIFY_STARTED) {
		const union MHD_ConnectionInfo *info = MHD_get_connection_info(
		    c, MHD_CONNECTION_INFO_CONNECTION_FD);
		const union MHD_ConnectionInfo *addr = MHD_get_connection_info(
		    c, MHD_CONNECTION_INFO_CLIENT_ADDRESS);
		struct http_conn *e = conn_find(m, NULL);
		if (e && info)
			*e = (struct http_conn){
			    .c = c,
			    .fd = info->connect_fd,
			    .opened_ns = mts_now_monotonic(),
			    .since_ns = mts_now_monotonic(),
			    .addr_key = addr && addr->client_addr
			                    ? mt_addr_key(addr->client_addr)
			                    : 0};
	} else {
		struct http_conn *e = conn_find(m, c);
		if (e)
			*e = (struct http_conn){0};
	}
	pthread_mutex_unlock(&m->conns_mu);
}

static void http_logf(const char *fmt, ...)
    __attribute__((format(printf, 1, 2)));

/* HTTP thread, before a connection starts: at most HTTP_PER_IP_LIMIT of
 * one address, or of one IPv6 /64 (libmicrohttpd's own per-IP limit
 * counts each IPv6 address, and a host has a /64 of them), and at most
 * HTTP_CONNECTION_LIMIT in all. With a token set, where the address or
 * the table is full, the oldest connection that has not shown it (of the
 * address, where that is full) is shut down to make room, as sshd's
 * MaxStartups does: clients that never show it cannot keep out a scraper
 * holding it, which shows it in its first request and keeps its place.
 * One thread accepts, and a connection is in the table before the next
 * accept. */
static enum MHD_Result on_accept(void *cls, const struct sockaddr *addr,
                                 socklen_t len)
{
	struct mts_metrics *m = cls;
	if (!addr || len < (socklen_t)sizeof(addr->sa_family))
		return MHD_YES;
	uint32_t key = mt_addr_key(addr);
	uint32_t here = 0, open = 0; /* not shut down: going */
	struct http_conn *oldest = NULL, *oldest_here = NULL;
	pthread_mutex_lock(&m->conns_mu);
	for (uint32_t i = 0; i < HTTP_TABLE; i++) {
		struct http_conn *e = &m->conns[i];
		if (!e->c || e->reaped)
			continue;
		bool mine = e->addr_key == key;
		open++;
		here += mine;
		if (e->tokened)
			continue;
		if (!oldest || e->opened_ns < oldest->opened_ns)
			oldest = e;
		if (mine &&
		    (!oldest_here || e->opened_ns < oldest_here->opened_ns))
			oldest_here = e;
	}
	/* With a token, a full address or table makes room by its oldest
	 * connection without it: one of the address's own where the address
	 * is full, so a client beside the scraper (its host, its NAT, its
	 * /64) cannot keep it out either. */
	bool gate = m->token[0] || m->token_unusable;
	struct http_conn *victim = here >= HTTP_PER_IP_LIMIT       ? oldest_here
	                           : open >= HTTP_CONNECTION_LIMIT ? oldest
	                                                           : NULL;
	bool ok = here < HTTP_PER_IP_LIMIT && open < HTTP_CONNECTION_LIMIT;
	if (gate && victim) {
		shutdown(victim->fd, SHUT_RDWR);
		victim->reaped = true;
		m->ends[HTTP_END_MADE_ROOM]++;
		ok = true;
	}
	if (!ok)
		m->ends[HTTP_END_REFUSED]++;
	pthread_mutex_unlock(&m->conns_mu);
	if (gate && victim)
		http_logf("the oldest connection without the token closed to "
		          "make room: %u open from its address, %u in all",
		          here, open);
	if (ok)
		return MHD_YES;
	/* Said as libmicrohttpd's own refusals were, under their budget. */
	char who[INET6_ADDRSTRLEN + 8];
	mt_addr_format(addr, who, sizeof(who));
	if (here >= HTTP_PER_IP_LIMIT)
		http_logf("connection from %s refused: %u open from its "
		          "address (an IPv6 /64 counts as one), the most one "
		          "may",
		          who, here);
	else
		http_logf("connection from %s refused: %u open, the most "
		          "there may be",
		          who, open);
	return MHD_NO;
}

/* HTTP thread: does the request on `c` carry the token (or is none set)?
 * A connection that showed it once is marked, and keeps its place. */
static bool token_shown(struct mts_metrics *m, struct MHD_Connection *c)
{
	const char *auth = MHD_lookup_connection_value(
	    c, MHD_HEADER_KIND, MHD_HTTP_HEADER_AUTHORIZATION);
	const char *given = NULL;
	if (auth && strncasecmp(auth, "Bearer ", 7) == 0) {
		given = auth + 7;
		while (*given == ' ')
			given++;
	}
	pthread_mutex_lock(&m->conns_mu);
	bool ok = !m->token_unusable &&
	          (!m->token[0] || mts_token_equal(m->token, given));
	struct http_conn *e = ok && m->token[0] ? conn_find(m, c) : NULL;
	if (e)
		e->tokened = true;
	pthread_mutex_unlock(&m->conns_mu);
	return ok;
}

/* HTTP thread: a request's headers are in (busy), or its answer went. */
static void conn_mark(struct mts_metrics *m, struct MHD_Connection *c,
                      bool busy)
{
	pthread_mutex_lock(&m->conns_mu);
	struct http_conn *e = conn_find(m, c);
	if (e) {
		e->busy = busy;
		e->since_ns = mts_now_monotonic();
	}
	pthread_mutex_unlock(&m->conns_mu);
}

static void on_completed(void *cls, struct MHD_Connection *c, void **req_cls,
                         enum MHD_RequestTerminationCode toe)
{
	(void)req_cls;
	(void)toe;
	conn_mark(cls, c, false);
}

/* Loop thread: end the connections whose request is late. shutdown(),
 * not close(): libmicrohttpd owns the descriptor, and sees the end. */
static void on_reap(uv_timer_t *t)
{
	struct mts_metrics *m = t->data;
	uint64_t late = (uint64_t)HTTP_REQUEST_DEADLINE_S * 1000000000u;
	uint64_t slow = (uint64_t)HTTP_ANSWER_DEADLINE_S * 1000000000u;
	uint32_t idle = 0, reading = 0;
	pthread_mutex_lock(&m->conns_mu);
	/* Read under the lock: the HTTP thread stamps since_ns under it,
	 * and a stamp later than `now` would make `now - since` wrap and end
	 * a connection that had just begun. */
	uint64_t now = mts_now_monotonic();
	for (uint32_t i = 0; i < HTTP_TABLE; i++) {
		struct http_conn *e = &m->conns[i];
		if (!e->c || e->reaped || e->since_ns > now ||
		    now - e->since_ns <= (e->busy ? slow : late))
			continue;
		shutdown(e->fd, SHUT_RDWR);
		e->reaped = true;
		if (e->busy)
			reading++;
		else
			idle++;
		m->ends[e->busy ? HTTP_END_NOT_READ : HTTP_END_NO_REQUEST]++;
	}
	pthread_mutex_unlock(&m->conns_mu);
	if (idle)
		mts_log(MTS_LOG_DEBUG,
		        "metrics: connections ended, no request in time",
		        "n=%u deadline_s=%u", idle, HTTP_REQUEST_DEADLINE_S);
	if (reading)
		mts_log(MTS_LOG_DEBUG,
		        "metrics: connections ended, answer not read in time",
		        "n=%u deadline_s=%u", reading, HTTP_ANSWER_DEADLINE_S);
}

static enum MHD_Result on_request(void *cls, struct MHD_Connection *c,
                                  const char *url, const char *method,
                                  const char *version, const char *upload_data,
                                  size_t *upload_data_size, void **req_cls)
{
	struct mts_metrics *m = cls;
	/* libmicrohttpd calls once when the headers are in, then with any
	 * body, then once more: answering on that last call (not the first)
	 * lets the connection be kept alive for the next scrape. */
	if (*req_cls == NULL) {
		/* m: go on; &m->token: the token was asked for and not shown.
		 */
		*req_cls = token_shown(m, c) ? (void *)m : (void *)m->token;
		conn_mark(m, c, true);
		return MHD_YES;
	}
	if (*upload_data_size != 0) {
		*upload_data_size = 0; /* we want no body: drop it */
		return MHD_YES;
	}
	if (*req_cls == (void *)m->token)
		return reply_text(c, MHD_HTTP_UNAUTHORIZED,
		                  "401 unauthorized: send the token in "
		                  "Authorization: Bearer\n");
	if (strcmp(url, "/metrics") != 0)
		return reply_text(c, MHD_HTTP_NOT_FOUND,
		                  "404 page not found: try /metrics\n");
	if (strcmp(method, MHD_HTTP_METHOD_GET) != 0 &&
	    strcmp(method, MHD_HTTP_METHOD_HEAD) != 0)
		return reply_text(c, MHD_HTTP_METHOD_NOT_ALLOWED,
		                  "405 method not allowed: GET or HEAD\n");

	struct answer *a = NULL;
	bool busy = false;
	unsigned status = snapshot(m, &a, &busy);
	if (status == MHD_HTTP_SERVICE_UNAVAILABLE)
		return reply_text(c, status,
		                  busy ? "503 too many answers not yet read; "
		                         "try again\n"
		                       : "503 memtallyd did not render its "
		                         "metrics in time\n");
	if (status != MHD_HTTP_OK)
		return reply_text(c, status, "500 out of memory\n");
	struct MHD_Response *r =
	    MHD_create_response_from_buffer_with_free_callback_cls(
	        a->len, a->data, answer_free, a);
	if (!r) {
		answer_free(a);
		return MHD_NO;
	}
	MHD_add_response_header(r, MHD_HTTP_HEADER_CONTENT_TYPE,
	                        MTS_METRICS_CONTENT_TYPE);
	enum MHD_Result ret = MHD_queue_response(c, MHD_HTTP_OK, r);
	MHD_destroy_response(r);
	return ret;
}

/* libmicrohttpd's complaints, as our log lines. A client of the port
 * causes them (a malformed request is a line), so a flood of them must
 * not fill the disk; but they come on libmicrohttpd's thread, where the
 * log's budgets, the loop's, cannot be used. So a budget of their own:
 * MHD_LOG_BURST lines a second, the count held back said with the next
 * line written. */
#define MHD_LOG_BURST 5u
static void on_mhd_log(void *cls, const char *fmt, va_list ap)
{
	static uint64_t window; /* its second << 32 | lines in it */
	static uint64_t held;
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	uint64_t sec = (uint64_t)ts.tv_sec & 0xffffffffu;
	uint64_t cur = __atomic_load_n(&window, __ATOMIC_RELAXED), next;
	do
		next = (cur >> 32) == sec ? cur + 1 : (sec << 32) | 1;
	while (!__atomic_compare_exchange_n(
	    &window, &cur, next, true, __ATOMIC_RELAXED, __ATOMIC_RELAXED));
	if ((next & 0xffffffffu) > MHD_LOG_BURST) {
		__atomic_fetch_add(&held, 1, __ATOMIC_RELAXED);
		return;
	}
	char msg[256], q[MTS_LOGQ_MAX];
	vsnprintf(msg, sizeof(msg), fmt, ap);
	size_t n = strlen(msg);
	while (n && (msg[n - 1] == '\n' || msg[n - 1] == ' '))
		msg[--n] = '\0';
	uint64_t h = __atomic_exchange_n(&held, 0, __ATOMIC_RELAXED);
	mts_log(MTS_LOG_WARN, "metrics http", "detail=%s suppressed=%llu",
	        mts_logq(q, sizeof(q), msg), (unsigned long long)h);
}

static void http_logf(const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	on_mhd_log(NULL, fmt, ap);
	va_end(ap);
}

static void metrics_free(struct mts_metrics *m)
{
	pthread_cond_destroy(&m->cv);
	pthread_mutex_destroy(&m->mu);
	pthread_mutex_destroy(&m->conns_mu);
	mts_buf_free(&m->text);
	mts_buf_free(&m->spare);
	explicit_bzero(m->token, sizeof(m->token));
	free(m);
}

static void on_handle_closed(uv_handle_t *h)
{
	struct mts_metrics *m = h->data;
	if (--m->handles == 0)
		metrics_free(m);
}

/* A socket bound to `ss` and listening, or -errno. */
static int listen_on(const struct sockaddr_storage *ss, socklen_t len)
{
	int one = 1, zero = 0;
	int fd = socket(ss->ss_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
	if (fd < 0)
		return -errno;
	/* Restarting memtallyd must not wait out TIME_WAIT. */
	setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
	if (ss->ss_family == AF_INET6 &&
	    setsockopt(fd, IPPROTO_IPV6, IPV6_V6ONLY, &zero, sizeof(zero)) < 0)
		/* Still served, over IPv6 only: an IPv4 scraper is not. */
		mts_log(MTS_LOG_WARN,
		        "/metrics: cannot listen for IPv4 on an IPv6 address",
		        "err=%s", strerror(errno));
	if (bind(fd, (const struct sockaddr *)ss, len) < 0 ||
	    listen(fd, LISTEN_BACKLOG) < 0) {
		int err = -errno;
		close(fd);
		return err;
	}
	return fd;
}

static uint16_t bound_port(int fd)
{
	struct sockaddr_storage ss;
	socklen_t len = sizeof(ss);
	if (getsockname(fd, (struct sockaddr *)&ss, &len) < 0)
		return 0;
	if (ss.ss_family == AF_INET6)
		return ntohs(((struct sockaddr_in6 *)&ss)->sin6_port);
	return ntohs(((struct sockaddr_in *)&ss)->sin_port);
}

/* Close `fd` unless libmicrohttpd already did on its failure path (it is
 * then gone, or the number names some other file by now). */
static void close_if_ours(int fd, const struct stat *was)
{
	struct stat st;
	if (fstat(fd, &st) == 0 && st.st_dev == was->st_dev &&
	    st.st_ino == was->st_ino)
		close(fd);
}

static struct MHD_Daemon *start_mhd(struct mts_metrics *m, int fd, bool v6)
{
	unsigned flags = MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_ERROR_LOG |
	                 MHD_USE_AUTO | MHD_USE_ITC;
	if (v6)
		flags |= MHD_USE_DUAL_STACK;
	/* The HTTP thread inherits our signal mask: block everything so
	 * signals keep going to the loop thread. */
	sigset_t all, old;
	sigfillset(&all);
	pthread_sigmask(SIG_SETMASK, &all, &old);
	struct MHD_Daemon *d = MHD_start_daemon(
	    flags, 0, on_accept, m, on_request, m,
	    /* First, so that every message goes through it. */
	    MHD_OPTION_EXTERNAL_LOGGER, on_mhd_log, (void *)m,
	    MHD_OPTION_LISTEN_SOCKET, (MHD_socket)fd,
	    MHD_OPTION_CONNECTION_LIMIT, (unsigned int)HTTP_TABLE,
	    MHD_OPTION_CONNECTION_TIMEOUT, (unsigned int)HTTP_IDLE_TIMEOUT_S,
	    MHD_OPTION_NOTIFY_CONNECTION, on_connection, (void *)m,
	    MHD_OPTION_NOTIFY_COMPLETED, on_completed, (void *)m,
	    MHD_OPTION_END);
	pthread_sigmask(SIG_SETMASK, &old, NULL);
	return d;
}

int mts_metrics_start(struct mts_metrics **out, const char *host_port,
                      const struct mts_registry *reg,
                      const struct mts_conn_stats *cs,
                      const struct mts_reload_stats *rs, uv_loop_t *loop)
{
	char q[MTS_LOGQ_MAX], addr[INET6_ADDRSTRLEN + 16];
	struct sockaddr_storage ss;
	socklen_t sslen;
	struct stat fd_stat;
	int err, fd;
	struct mts_metrics *m = NULL;

	*out = NULL;
	bool loopback;
	err = mts_parse_hostport(host_port, &ss, &sslen, &loopback);
	if (err < 0)
		goto fail_log;
	fd = listen_on(&ss, sslen);
	if (fd < 0) {
		err = fd;
		goto fail_log;
	}
	if (fstat(fd, &fd_stat) < 0) {
		err = -errno;
		goto fail_close_fd;
	}
	m = calloc(1, sizeof(*m));
	if (!m) {
		err = -ENOMEM;
		goto fail_close_fd;
	}
	m->reg = reg;
	m->cs = cs;
	m->rs = rs;
	m->port = bound_port(fd);
	pthread_condattr_t ca;
	pthread_condattr_init(&ca);
	pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
	pthread_cond_init(&m->cv, &ca);
	pthread_condattr_destroy(&ca);
	pthread_mutex_init(&m->mu, NULL);
	pthread_mutex_init(&m->conns_mu, NULL);

	/* Asked for from the first connection on. */
	mts_metrics_set_token(m, reg->policy.metrics_token);
	/* `serving` is still false: a scrape arriving before the async
	 * handle exists gets a 503 instead of touching it. */
	m->mhd = start_mhd(m, fd, ss.ss_family == AF_INET6);
	if (!m->mhd) {
		err = -EIO;
		goto fail_free;
	}
	err = uv_async_init(loop, &m->async, on_render);
	if (err < 0) {
		MHD_stop_daemon(m->mhd); /* closes fd */
		metrics_free(m);
		goto fail_log;
	}
	m->async.data = m;
	m->handles = 1;
	if (uv_timer_init(loop, &m->reaper) == 0) {
		m->reaper.data = m;
		m->handles++;
		uv_timer_start(&m->reaper, on_reap, HTTP_REAP_MS, HTTP_REAP_MS);
		uv_unref((uv_handle_t *)&m->reaper);
	}
	const union MHD_DaemonInfo *info =
	    MHD_get_daemon_info(m->mhd, MHD_DAEMON_INFO_BIND_PORT);
	if (info && info->port)
		m->port = info->port;

	pthread_mutex_lock(&m->mu);
	m->serving = true;
	pthread_mutex_unlock(&m->mu);

	/* The bound port, for a listen on port 0. */
	if (ss.ss_family == AF_INET6)
		((struct sockaddr_in6 *)&ss)->sin6_port = htons(m->port);
	else
		((struct sockaddr_in *)&ss)->sin_port = htons(m->port);
	mt_addr_format((struct sockaddr *)&ss, addr, sizeof(addr));
	mts_log(MTS_LOG_INFO, "metrics listening", "addr=%s", addr);
	*out = m;
	return 0;

fail_free:
	metrics_free(m);
	close_if_ours(fd, &fd_stat);
	goto fail_log;
fail_close_fd:
	close(fd);
fail_log:
	mts_log(MTS_LOG_ERROR, "cannot serve metrics", "addr=%s err=%s",
	        mts_logq(q, sizeof(q), host_port ? host_port : ""),
	        err == -EINVAL ? "bad address, want HOST:PORT"
	                       : strerror(-err));
	return err;
}

void mts_metrics_set_token(struct mts_metrics *m, const char *token)
{
	if (!m)
		return;
	size_t n = token ? strlen(token) : 0;
	pthread_mutex_lock(&m->conns_mu);
	explicit_bzero(m->token, sizeof(m->token));
	/* One too long for us closes /metrics rather than opens it. */
	m->token_unusable = n > MTS_TOKEN_MAX;
	if (!m->token_unusable)
		memcpy(m->token, token ? token : "", n);
	pthread_mutex_unlock(&m->conns_mu);
}

void mts_metrics_stop(struct mts_metrics *m)
{
	if (!m)
		return;
	pthread_mutex_lock(&m->mu);
	m->serving = false;
	pthread_cond_broadcast(&m->cv);
	pthread_mutex_unlock(&m->mu);
	/* Joins the HTTP thread (a scrape in progress answers 503 at once)
	 * and closes the listening socket. After this nothing touches the
	 * async handle or the registry from another thread. */
	MHD_stop_daemon(m->mhd);
	m->mhd = NULL;
	if (m->handles > 1)
		uv_close((uv_handle_t *)&m->reaper, on_handle_closed);
	uv_close((uv_handle_t *)&m->async, on_handle_closed);
}

uint16_t mts_metrics_port(const struct mts_metrics *m)
{
	return m ? m->port : 0;
}
