/*
 * rate.c - growth rate of a figure and the forecast of its limit.
 *
 * Rates are lines through samples, not averages of sample-to-sample
 * differences, so a one-tick spike never shows as a burst of rate.
 *
 * - Fleet and groups (struct mts_wrate) keep a ring of MTS_WRATE_SAMPLES.
 *   The samples of the last growth window are split into halves. Each
 *   half's slope is the Theil-Sen median of its pairwise slopes. The rate
 *   is the slope both halves show: the one nearer 0, or none if they
 *   disagree in sign. A step, or a burst of steps as workers starting
 *   together make, lies in one half and leaves the other flat. It also
 *   sits near an end of its half for all but a few samples, where the
 *   median ignores it. A figure that stepped once and holds still thus
 *   reads exactly 0 from a few samples after the step, where a
 *   least-squares line would read a rate for a whole window
 *   (tests/unit/test_server_rate.c). A steady ramp reads exactly in both
 *   halves, with or without a step in it. When the halves agree within
 *   WRATE_AGREE, the rate is the whole window's least-squares slope if it
 *   lies between the halves' slopes, else their mean. There is no rate
 *   before the samples cover WRATE_FULL of the window or fill the ring.
 *   The cost is O(64^2 / 4) per sample, every MTS_RATE_SAMPLE_MS, for
 *   1 + groups figures.
 * - Processes (struct mts_rate) are too many for a ring each, so each has
 *   an exponentially weighted fit in 64 bytes, O(1) per sample. A sample's
 *   weight is e^(-age / tau), with tau = window / TAU_PER_WINDOW. A sample
 *   one window old thus weighs under 1%, and a ramp is tracked closely
 *   after one window. The price is that an old step fades rather than
 *   leaving. A flat process can read a small residual rate for a few
 *   windows after a big change, and a step reads as growth while it fades.
 *   That is why a process's forecast is shown, never acted on.
 *
 * The weighted sums are kept relative to the latest sample (time 0, value
 * 0) and shifted when a new one comes. The doubles thus hold differences
 * over about one window, never absolute byte counts or clock readings, so
 * no precision is lost on a fleet of terabytes. The window fit works on
 * differences from its newest sample for the same reason.
 */
#include "mts_rate.h"

#include <math.h>

/* Two half-window slopes within this ratio of each other are one ramp
 * (see mts_wrate_get). */
#define WRATE_AGREE 0.8
/* The share of the window its samples must cover before it has a rate. */
#define WRATE_FULL 0.9

/* The weights' time constant, in windows. */
#define TAU_PER_WINDOW 5.0

void mts_rate_reset(struct mts_rate *r)
{
	*r = (struct mts_rate){0};
}

double mts_rate_decay(struct mts_decay_cache *c, uint64_t dt_ns,
                      uint64_t window_ns)
{
	if (c && c->dt_ns == dt_ns && c->window_ns == window_ns)
		return c->decay;
	double d = exp(-(double)dt_ns * TAU_PER_WINDOW / (double)window_ns);
	if (c) {
		c->dt_ns = dt_ns;
		c->window_ns = window_ns;
		c->decay = d;
	}
	return d;
}

void mts_rate_add(struct mts_rate *r, uint64_t now_ns, uint64_t v,
                  uint64_t window_ns, struct mts_decay_cache *cache)
{
	/* First sample, or none for a whole window (a stalled loop, a
	 * measure changed): start afresh rather than fit a line through
	 * points that old. */
	if (r->last_ns == 0 || now_ns < r->last_ns ||
	    now_ns - r->last_ns > window_ns) {
		*r = (struct mts_rate){.s0 = 1,
		                       .last_ns = now_ns,
		                       .last_v = v,
		                       .first_ns = now_ns};
		return;
	}
	uint64_t dt_ns = now_ns - r->last_ns;
	if (dt_ns == 0)
		return;
	double d = mts_rate_decay(cache, dt_ns, window_ns);
	double dt = (double)dt_ns / 1e9;
	double dv =
	    v >= r->last_v ? (double)(v - r->last_v) : -(double)(r->last_v - v);
	double s0 = r->s0 * d, st = r->st * d, sv = r->sv * d;
	double stt = r->stt * d, stv = r->stv * d;
	/* Move the origin to the new sample: every old point is dt earlier
	 * and dv lower than before. */
	r->stt = stt - 2 * dt * st + dt * dt * s0;
	r->stv = stv - dt * sv - dv * st + dt * dv * s0;
	r->st = st - dt * s0;
	r->sv = sv - dv * s0;
	r->s0 = s0 + 1; /* the new point, at (0, 0) */
	r->last_ns = now_ns;
	r->last_v = v;
}

double mts_rate_get(const struct mts_rate *r, uint64_t window_ns)
{
	/* Until the samples span tau, a line through the first few would
	 * follow whatever happened between them. */
	if (r->last_ns == 0 ||
	    (double)(r->last_ns - r->first_ns) * TAU_PER_WINDOW <
	        (double)window_ns)
		return 0;
	double den = r->s0 * r->stt - r->st * r->st;
	if (!(den > 0))
		return 0;
	return (r->s0 * r->stv - r->st * r->sv) / den;
}

double mts_forecast_s(double rate, uint64_t value, uint64_t limit)
{
	if (limit == 0 || value >= limit || !(rate > 0))
		return 0;
	double s = (double)(limit - value) / rate;
	/* A positive rate so small that the time is not a number worth
	 * showing is no forecast. */
	return s > 0 && s < 1e12 ? s : 0;
}

bool mts_forecast_gate(struct mts_forecast_gate *g, double secs,
                       uint64_t horizon_ms, uint64_t hold_ns, uint64_t now_ns)
{
	if (horizon_ms == 0) {
		*g = (struct mts_forecast_gate){0};
		return false;
	}
	double horizon = (double)horizon_ms / 1000;
	if (secs > 0 && secs <= horizon) {
		g->on = true;
		g->clear_since_ns = 0;
	} else if (g->on && secs > 0 &&
	           secs <= horizon * (1 + MTS_FORECAST_LEAVE_PCT / 100.0)) {
		g->clear_since_ns = 0; /* in the margin: stays */
	} else if (g->on) {
		/* Leave only once the forecast has stayed out of the margin
		 * (or gone) for hold_ns: a noisy rate dips out and back. */
		if (g->clear_since_ns == 0)
			g->clear_since_ns = now_ns ? now_ns : 1;
		else if (now_ns - g->clear_since_ns >= hold_ns)
			*g = (struct mts_forecast_gate){0};
	}
	return g->on;
}

/* ---- the window fit (fleet and groups) ----------------------------------- */

static uint32_t wrate_at(const struct mts_wrate *r, uint32_t back)
{
	return (r->head + MTS_WRATE_SAMPLES - 1 - back) % MTS_WRATE_SAMPLES;
}

void mts_wrate_add(struct mts_wrate *r, uint64_t now_ns, uint64_t v,
                   uint64_t window_ns)
{
	if (r->n > 0) {
		uint64_t newest = r->t[wrate_at(r, 0)];
		if (now_ns < newest)
			return;
		/* The newest sample stays where the latest figure is; it
		 * becomes a kept one once it is the spacing past the one
		 * before it. Until then the next figure moves it (so kept
		 * samples are the spacing apart and the ring spans the
		 * window, at any sampling cadence). */
		uint64_t gap = window_ns / (MTS_WRATE_SAMPLES - 1);
		if (r->n > 1 && newest - r->t[wrate_at(r, 1)] < gap) {
			uint32_t i = wrate_at(r, 0);
			r->t[i] = now_ns;
			r->v[i] = v;
			return;
		}
	}
	r->t[r->head] = now_ns;
	r->v[r->head] = v;
	r->head = (r->head + 1) % MTS_WRATE_SAMPLES;
	if (r->n < MTS_WRATE_SAMPLES)
		r->n++;
}

/* The k-th smallest of a[0..n) (k < n), reordering a: Hoare's selection,
 * O(n) on average. n is at most a window's samples. */
static double select_kth(double *a, int n, int k)
{
	int lo = 0, hi = n - 1;
	while (lo < hi) {
		double pivot = a[lo + (hi - lo) / 2];
		int i = lo, j = hi;
		while (i <= j) {
			while (a[i] < pivot)
				i++;
			while (a[j] > pivot)
				j--;
			if (i <= j) {
				double tmp = a[i];
				a[i++] = a[j];
				a[j--] = tmp;
			}
		}
		if (k <= j)
			hi = j;
		else if (k >= i)
			lo = i;
		else
			return a[k];
	}
	return a[k];
}

/* The median of a[0..n) (n >= 1), reordering a; of an even count, the
 * mean of the two middle values. */
static double median(double *a, int n)
{
	int k = n / 2;
	double hi = select_kth(a, n, k);
	if (n % 2)
		return hi;
	double lo = a[0]; /* after the selection, a[0..k) <= a[k] */
	for (int i = 1; i < k; i++)
		lo = a[i] > lo ? a[i] : lo;
	return (lo + hi) / 2;
}

/* The most pairs of samples a half window holds (the halves share the
 * middle sample of an odd count). */
#define HALF_MAX  (MTS_WRATE_SAMPLES / 2 + 1)
#define PAIRS_MAX (HALF_MAX * (HALF_MAX - 1) / 2)

/* The Theil-Sen slope of the points (x[i], y[i]), i < n <= HALF_MAX: the
 * median of the slopes of all pairs. Exact on a line, and unmoved by a
 * minority of points off it: a step near either end of the points leaves
 * most pairs on one level (slope 0), where a least-squares line tilts by
 * up to 1.5 x step / span. O(n^2): at most 528 slopes and one selection. */
static double theil_sen(const double *x, const double *y, int n)
{
	double s[PAIRS_MAX];
	int k = 0;
	for (int i = 0; i < n; i++)
		for (int j = i + 1; j < n; j++)
			if (x[j] != x[i])
				s[k++] = (y[j] - y[i]) / (x[j] - x[i]);
	return k > 0 ? median(s, k) : 0;
}

/* The least-squares slope of (x, y)[0..n): a ramp's slope with the least
 * spread, for a window with no step in it. */
static double least_squares(const double *x, const double *y, int n)
{
	double mx = 0, my = 0;
	for (int i = 0; i < n; i++) {
		mx += x[i];
		my += y[i];
	}
	mx /= n;
	my /= n;
	double sxy = 0, sxx = 0;
	for (int i = 0; i < n; i++) {
		sxy += (x[i] - mx) * (y[i] - my);
		sxx += (x[i] - mx) * (x[i] - mx);
	}
	return sxx > 0 ? sxy / sxx : 0;
}

double mts_wrate_get(const struct mts_wrate *r, uint64_t window_ns)
{
	if (r->n < 2)
		return 0;
	uint32_t ni = wrate_at(r, 0);
	uint64_t tn = r->t[ni], vn = r->v[ni];
	/* Relative to the newest sample, as for the weighted fit; oldest
	 * first. */
	double x[MTS_WRATE_SAMPLES], y[MTS_WRATE_SAMPLES];
	int k = 0;
	while ((uint32_t)k < r->n) {
		uint32_t i = wrate_at(r, (uint32_t)k);
		if (tn - r->t[i] > window_ns)
			break;
		k++;
	}
	for (int b = 0; b < k; b++) {
		uint32_t i = wrate_at(r, (uint32_t)b);
		x[k - 1 - b] = -(double)(tn - r->t[i]) / 1e9;
		y[k - 1 - b] = r->v[i] >= vn ? (double)(r->v[i] - vn)
		                             : -(double)(vn - r->v[i]);
	}
	/* Two halves of a window need a window (or as much of one as the
	 * ring holds): over a shorter history (a server just started) a
	 * step fills most of both halves and reads as growth in each. */
	if (k < 3 || (r->n < MTS_WRATE_SAMPLES &&
	              -x[0] * 1e9 < WRATE_FULL * (double)window_ns))
		return 0;
	/* Growth is what both halves of the window show: the slope nearer
	 * 0 of the two, or 0 when they disagree in sign. A step, or a burst
	 * of steps shorter than half a window, lies in or near the edge of
	 * one half and leaves the other flat. A ramp reads the same in both,
	 * with or without a step in it. When the two agree within
	 * WRATE_AGREE, the window is one ramp. Its least-squares slope then
	 * has twice the samples of a half and no median's quantisation, so
	 * it reads a real ramp closest. A step inside can pull that slope
	 * outside the two halves' slopes, and then their mean is used. The
	 * halves share the middle sample of an odd count. */
	int h = (k + 1) / 2;
	double a = theil_sen(x, y, h);
	double b = theil_sen(x + (k - h), y + (k - h), h);
	if ((a > 0 && b > 0) || (a < 0 && b < 0)) {
		double lo = fabs(a) < fabs(b) ? a : b;
		double hi = fabs(a) < fabs(b) ? b : a;
		if (fabs(lo) < fabs(hi) * WRATE_AGREE)
			return lo;
		double w = least_squares(x, y, k);
		return fabs(w) >= fabs(lo) && fabs(w) <= fabs(hi) ? w
		                                                  : (a + b) / 2;
	}
	return 0;
}
