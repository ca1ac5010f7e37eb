/* calib.c — amax calibration (max, percentile), scales, delayed scaling,
 * and the error a set of scales gives on a tensor. */
#include "quant/calib.h"
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include "core/core.h"
#include "core/fp8.h"

ts_status ts_amax_max(const float *x, int64_t n, double *amax) {
    if (!amax || (n > 0 && !x)) return ts_fail(TS_ERR_INVALID, "amax: NULL argument");
    float m = 0.0f;
    for (int64_t i = 0; i < n; i++) {
        float a = fabsf(x[i]);
        if (a <= 3.4028234663852886e38f && a > m) m = a; /* skips NaN and inf */
    }
    *amax = m;
    return TS_OK;
}

/* k-th smallest of a[0..n) (0-based), reordering a: quickselect with a
 * median-of-three pivot (deterministic). Afterwards a[k+1..n) >= a[k]. */
static float select_kth(float *a, int64_t n, int64_t k) {
    int64_t lo = 0, hi = n - 1;
    while (lo < hi) {
        int64_t mid = lo + (hi - lo) / 2;
        float x = a[lo], y = a[mid], z = a[hi];
        float p = x < y ? (y < z ? y : (x < z ? z : x)) : (x < z ? x : (y < z ? z : y));
        int64_t i = lo, j = hi;
        while (i <= j) {
            while (a[i] < p) i++;
            while (a[j] > p) j--;
            if (i <= j) {
                float t = a[i];
                a[i++] = a[j];
                a[j--] = t;
            }
        }
        if (k <= j)
            hi = j;
        else if (k >= i)
            lo = i;
        else
            break; /* a[j+1..i) all equal p */
    }
    return a[k];
}

/* Percentile of the finite |x| over a gathered buffer (reordered). */
static double percentile_of(float *a, int64_t n, double pct) {
    if (n == 0) return 0.0;
    double h = (double)(n - 1) * pct / 100.0;
    int64_t k = (int64_t)floor(h);
    if (k >= n - 1) return select_kth(a, n, n - 1);
    double lo = select_kth(a, n, k), hi = a[k + 1];
    for (int64_t i = k + 2; i < n; i++)
        if (a[i] < hi) hi = a[i];
    return lo + (h - (double)k) * (hi - lo);
}

static ts_status check_pct(double pct) {
    if (!(pct > 0 && pct <= 100))
        return ts_fail(TS_ERR_INVALID, "percentile %g is not in (0, 100]", pct);
    return TS_OK;
}

ts_status ts_amax_percentile(const float *x, int64_t n, double pct, double *amax) {
    if (!amax || (n > 0 && !x)) return ts_fail(TS_ERR_INVALID, "amax: NULL argument");
    ts_status s = check_pct(pct);
    if (s != TS_OK) return s;
    float *a = ts_alloc((size_t)(n > 0 ? n : 1) * sizeof(float), "amax percentile");
    if (!a) return TS_ERR_NOMEM;
    int64_t m = 0;
    for (int64_t i = 0; i < n; i++) {
        float v = fabsf(x[i]);
        if (v <= 3.4028234663852886e38f) a[m++] = v;
    }
    *amax = percentile_of(a, m, pct);
    free(a);
    return TS_OK;
}

/* [outer, C, inner] around axis; fails on a bad axis. */
static ts_status split(int rank, const int64_t *dims, int axis, int64_t *outer, int64_t *c,
                       int64_t *inner, int *ax_out) {
    int ax = axis < 0 ? axis + rank : axis;
    if (ax < 0 || ax >= rank)
        return ts_fail(TS_ERR_INVALID, "channel axis %d out of range for rank %d", axis, rank);
    *outer = *inner = 1;
    for (int i = 0; i < ax; i++) *outer *= dims[i];
    for (int i = ax + 1; i < rank; i++) *inner *= dims[i];
    *c = dims[ax];
    if (ax_out) *ax_out = ax;
    return TS_OK;
}

ts_status ts_amax_channels(const float *x, int rank, const int64_t *dims, int axis,
                           ts_calib_method method, double pct, double *amax) {
    int64_t outer = 1, C = 1, inner = 1;
    ts_status s = split(rank, dims, axis, &outer, &C, &inner, NULL);
    if (s == TS_OK && method == TS_CALIB_PERCENTILE) s = check_pct(pct);
    if (s == TS_OK && method != TS_CALIB_MAX && method != TS_CALIB_PERCENTILE)
        s = ts_fail(TS_ERR_INVALID, "amax per channel: method must be max or percentile");
    if (s != TS_OK) return s;
    int64_t per = outer * inner;
    float *buf = ts_alloc((size_t)(per > 0 ? per : 1) * sizeof(float), "amax per channel");
    if (!buf) return TS_ERR_NOMEM;
    for (int64_t c = 0; c < C; c++) {
        int64_t m = 0;
        for (int64_t o = 0; o < outer; o++) {
            const float *row = x + (o * C + c) * inner;
            for (int64_t i = 0; i < inner; i++) {
                float v = fabsf(row[i]);
                if (v <= 3.4028234663852886e38f) buf[m++] = v;
            }
        }
        if (method == TS_CALIB_MAX) {
            float mx = 0.0f;
            for (int64_t i = 0; i < m; i++) mx = buf[i] > mx ? buf[i] : mx;
            amax[c] = mx;
        } else {
            amax[c] = percentile_of(buf, m, pct);
        }
    }
    free(buf);
    return TS_OK;
}

double ts_fp8_scale_for(double amax, ts_dtype fmt, double margin) {
    double mx = ts_fp8_max(fmt);
    if (!(amax > 0) || !isfinite(amax) || mx == 0) return 1.0;
    return amax * pow(2.0, margin) / mx;
}

/* ---- delayed scaling ------------------------------------------------------ */

ts_status ts_delayed_scaling_init(ts_delayed_scaling *d, ts_dtype fmt, int channels,
                                  int history_len, ts_amax_reduce reduce, double margin) {
    if (!d) return ts_fail(TS_ERR_INVALID, "delayed scaling: NULL argument");
    memset(d, 0, sizeof *d);
    if (!ts_fp8_is_format(fmt))
        return ts_fail(TS_ERR_INVALID, "delayed scaling: %s is not an FP8 format",
                       ts_dtype_name(fmt));
    if (channels < 1 || history_len < 1)
        return ts_fail(TS_ERR_INVALID,
                       "delayed scaling: channels (%d) and history length (%d) must be >= 1",
                       channels, history_len);
    if (reduce != TS_AMAX_MAX && reduce != TS_AMAX_MOST_RECENT)
        return ts_fail(TS_ERR_INVALID, "delayed scaling: reduction %d is not max or most_recent",
                       (int)reduce);
    if (!isfinite(margin))
        return ts_fail(TS_ERR_INVALID, "delayed scaling: margin %g is not finite", margin);
    d->history = ts_zalloc(sizeof(double) * (size_t)channels * (size_t)history_len, "amax history");
    d->scale = ts_alloc(sizeof(double) * (size_t)channels, "delayed scales");
    if (!d->history || !d->scale) {
        ts_delayed_scaling_free(d);
        return TS_ERR_NOMEM;
    }
    for (int c = 0; c < channels; c++) d->scale[c] = 1.0;
    d->fmt = fmt;
    d->channels = channels;
    d->history_len = history_len;
    d->reduce = reduce;
    d->margin = margin;
    return TS_OK;
}

ts_status ts_delayed_scaling_update(ts_delayed_scaling *d, const double *amax) {
    if (!d || !d->history || !amax)
        return ts_fail(TS_ERR_INVALID, "delayed scaling: not initialised or NULL amax");
    int slot = (int)(d->updates % d->history_len), C = d->channels;
    for (int c = 0; c < C; c++) d->history[(size_t)slot * (size_t)C + (size_t)c] = amax[c];
    d->updates++;
    int64_t filled = d->updates < d->history_len ? d->updates : d->history_len;
    for (int c = 0; c < C; c++) {
        double a = amax[c];
        if (d->reduce == TS_AMAX_MAX) {
            a = 0;
            for (int64_t h = 0; h < filled; h++) {
                double v = d->history[(size_t)h * (size_t)C + (size_t)c];
                a = v > a || isnan(v) ? v : a; /* a NaN or inf poisons the window */
            }
        }
        if (a > 0 && isfinite(a)) d->scale[c] = ts_fp8_scale_for(a, d->fmt, d->margin);
    }
    return TS_OK;
}

void ts_delayed_scaling_free(ts_delayed_scaling *d) {
    if (!d) return;
    free(d->history);
    free(d->scale);
    d->history = d->scale = NULL;
}

/* ---- error ----------------------------------------------------------------- */

typedef struct qacc {
    int64_t n, sat, flushed;
    double se, sx, max_abs;
} qacc;

/* Fake-quantise x[0..len) with scale s as the f32 kernel does and add the
 * error to acc. */
static void acc_run(qacc *acc, const float *x, int64_t len, double s, ts_dtype fmt) {
    float sf = (float)s;
    for (int64_t i = 0; i < len; i++) {
        float v = x[i];
        if (!isfinite(v)) continue;
        float t = v / sf;
        uint8_t c = fmt == TS_F8E4M3 ? ts_fp8_enc_e4m3(t, 1) : ts_fp8_enc_e5m2(t, 1);
        float q = (fmt == TS_F8E4M3 ? ts_fp8_dec_e4m3(c) : ts_fp8_dec_e5m2(c)) * sf;
        double e = (double)v - (double)q;
        acc->n++;
        acc->se += e * e;
        acc->sx += (double)v * (double)v;
        if (fabs(e) > acc->max_abs) acc->max_abs = fabs(e);
        /* saturated: the clamp changed the code (rounding alone would overflow) */
        uint8_t raw = fmt == TS_F8E4M3 ? ts_fp8_enc_e4m3(t, 0) : ts_fp8_enc_e5m2(t, 0);
        acc->sat += raw != c;
        acc->flushed += v != 0.0f && q == 0.0f;
    }
}

static void acc_finish(const qacc *a, ts_quant_error *e) {
    memset(e, 0, sizeof *e);
    e->n = a->n;
    if (!a->n) return;
    e->mse = a->se / (double)a->n;
    e->max_abs = a->max_abs;
    e->sqnr_db = a->se > 0 ? 10.0 * log10(a->sx / a->se) : INFINITY;
    e->frac_saturated = (double)a->sat / (double)a->n;
    e->frac_flushed = (double)a->flushed / (double)a->n;
}

/* Add the error of x (rank, dims) with scales sc (per channel along ax, or
 * one when ax < 0). */
static void acc_tensor(qacc *acc, const float *x, int64_t outer, int64_t C, int64_t inner,
                       const double *sc, ts_dtype fmt) {
    for (int64_t o = 0; o < outer; o++)
        for (int64_t c = 0; c < C; c++)
            acc_run(acc, x + (o * C + c) * inner, inner, sc[C > 1 ? c : 0], fmt);
}

static ts_status check_fmt_scales(ts_dtype fmt, const double *scale, int64_t C) {
    if (!ts_fp8_is_format(fmt))
        return ts_fail(TS_ERR_INVALID, "quantisation error: %s is not an FP8 format",
                       ts_dtype_name(fmt));
    for (int64_t c = 0; c < C; c++)
        if (!(scale[c] > 0) || !isfinite(scale[c]))
            return ts_fail(TS_ERR_INVALID,
                           "quantisation error: scale[%lld] = %g is not a "
                           "positive finite number",
                           (long long)c, scale[c]);
    return TS_OK;
}

ts_status ts_quant_error_f32(const float *x, int rank, const int64_t *dims, int per_channel_axis,
                             ts_dtype fmt, const double *scale, ts_quant_error *e) {
    if (!x || !scale || !e || (rank > 0 && !dims))
        return ts_fail(TS_ERR_INVALID, "quantisation error: NULL argument");
    int64_t outer = 1, C = 1, inner = ts_shape_numel(rank, dims);
    ts_status s = TS_OK;
    if (per_channel_axis != TS_PER_TENSOR)
        s = split(rank, dims, per_channel_axis, &outer, &C, &inner, NULL);
    if (s == TS_OK) s = check_fmt_scales(fmt, scale, C);
    if (s != TS_OK) return s;
    qacc acc = {0};
    acc_tensor(&acc, x, outer, C, inner, scale, fmt);
    acc_finish(&acc, e);
    return TS_OK;
}

/* ---- report ------------------------------------------------------------------ */

ts_quant_report_opts ts_quant_report_defaults(void) {
    ts_quant_report_opts o = {TS_F8E4M3, TS_PER_TENSOR, 99.9, 16, TS_AMAX_MAX, 0.0};
    return o;
}

const char *ts_calib_method_name(ts_calib_method m) {
    return m == TS_CALIB_MAX ? "max" : m == TS_CALIB_PERCENTILE ? "percentile" : "delayed";
}

/* amax per channel (or one) of x viewed as [outer, C, inner]. */
static ts_status amaxes(const float *x, int64_t outer, int64_t C, int64_t inner, ts_calib_method m,
                        double pct, double *out) {
    if (C == 1 && outer == 1)
        return m == TS_CALIB_MAX ? ts_amax_max(x, inner, out)
                                 : ts_amax_percentile(x, inner, pct, out);
    int64_t d[3] = {outer, C, inner};
    return ts_amax_channels(x, 3, d, 1, m, pct, out);
}

static double largest(const double *a, int64_t n) {
    double m = 0;
    for (int64_t i = 0; i < n; i++) m = a[i] > m ? a[i] : m;
    return m;
}

/* Delayed scaling over the slices of axis 0 (see calib.h). */
static ts_status report_delayed(const float *x, const int64_t *dims, int rank, int ax,
                                const ts_quant_report_opts *o, ts_quant_report_row *row, double *am,
                                double *sc) {
    int64_t T = dims[0], outer = 1, C = 1, inner = 1;
    for (int i = 1; i < rank; i++) inner *= dims[i];
    if (ax >= 1) {
        ts_status s = split(rank - 1, dims + 1, ax - 1, &outer, &C, &inner, NULL);
        if (s != TS_OK) return s;
    }
    ts_delayed_scaling d;
    ts_status s = ts_delayed_scaling_init(&d, o->fmt, (int)C, o->history_len, o->reduce, o->margin);
    if (s != TS_OK) return s;
    qacc acc = {0};
    double amax_used = 0;
    int64_t slice = outer * C * inner;
    for (int64_t t = 0; t < T && s == TS_OK; t++) {
        const float *xs = x + t * slice;
        s = amaxes(xs, outer, C, inner, TS_CALIB_MAX, 0, am);
        if (s == TS_OK && t == 0) s = ts_delayed_scaling_update(&d, am); /* prime */
        if (s != TS_OK) break;
        for (int64_t c = 0; c < C; c++) {
            sc[c] = d.scale[c];
            double a = d.scale[c] * ts_fp8_max(o->fmt) / pow(2.0, o->margin);
            amax_used = a > amax_used ? a : amax_used;
        }
        acc_tensor(&acc, xs, outer, C, inner, sc, o->fmt);
        if (t > 0) s = ts_delayed_scaling_update(&d, am);
    }
    ts_delayed_scaling_free(&d);
    if (s != TS_OK) return s;
    row->available = 1;
    row->amax = amax_used;
    acc_finish(&acc, &row->err);
    return TS_OK;
}

ts_status ts_quant_report(const float *x, int rank, const int64_t *dims,
                          const ts_quant_report_opts *o, ts_quant_report_row rows[3]) {
    if (!x || !o || !rows || (rank > 0 && !dims))
        return ts_fail(TS_ERR_INVALID, "quant report: NULL argument");
    if (!ts_fp8_is_format(o->fmt))
        return ts_fail(TS_ERR_INVALID, "quant report: %s is not an FP8 format",
                       ts_dtype_name(o->fmt));
    ts_status s = check_pct(o->pct);
    if (s != TS_OK) return s;
    int64_t outer = 1, C = 1, inner = ts_shape_numel(rank, dims);
    int ax = -1;
    if (o->axis != TS_PER_TENSOR) s = split(rank, dims, o->axis, &outer, &C, &inner, &ax);
    if (s != TS_OK) return s;
    double *am = ts_alloc(sizeof(double) * (size_t)C, "quant report"),
           *sc = ts_alloc(sizeof(double) * (size_t)C, "quant report");
    if (!am || !sc) {
        free(am);
        free(sc);
        return TS_ERR_NOMEM;
    }
    memset(rows, 0, 3 * sizeof *rows);
    for (int m = 0; m < 2 && s == TS_OK; m++) {
        rows[m].method = (ts_calib_method)m;
        s = amaxes(x, outer, C, inner, (ts_calib_method)m, o->pct, am);
        if (s != TS_OK) break;
        for (int64_t c = 0; c < C; c++) sc[c] = ts_fp8_scale_for(am[c], o->fmt, o->margin);
        qacc acc = {0};
        acc_tensor(&acc, x, outer, C, inner, sc, o->fmt);
        acc_finish(&acc, &rows[m].err);
        rows[m].amax = largest(am, C);
        rows[m].available = 1;
    }
    rows[2].method = TS_CALIB_DELAYED;
    if (s == TS_OK && rank >= 2 && ax != 0) {
        /* channels of one slice: at most C again */
        s = report_delayed(x, dims, rank, ax, o, &rows[2], am, sc);
    }
    free(am);
    free(sc);
    return s;
}
