/* FP8 calibration (src/quant/calib.c): amax by max and percentile (against
 * a sort), per channel, scales, delayed scaling's history, the error
 * measures and the per-method report. */
#include <stdlib.h>
#include <string.h>
#include "check.h"
#include "quant/calib.h"
#include "tessel/quant.h"

static uint32_t rng = 12345;
static double urand(void) {
    rng = rng * 1664525u + 1013904223u;
    return (double)(rng >> 8) / 16777216.0;
}

static int cmp_d(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* numpy.percentile(|x|, pct) over finite values, by sorting. */
static double np_percentile(const float *x, int64_t n, double pct) {
    double *a = malloc(sizeof(double) * (size_t)(n + 1));
    int64_t m = 0;
    for (int64_t i = 0; i < n; i++)
        if (isfinite(x[i])) a[m++] = fabs((double)x[i]);
    double r = 0;
    if (m) {
        qsort(a, (size_t)m, sizeof(double), cmp_d);
        double h = (double)(m - 1) * pct / 100.0;
        int64_t k = (int64_t)floor(h);
        r = k + 1 < m ? a[k] + (h - (double)k) * (a[k + 1] - a[k]) : a[m - 1];
    }
    free(a);
    return r;
}

static void test_amax(void) {
    float x[] = {1.0f, -7.5f, NAN, INFINITY, -INFINITY, 3.0f, 0.0f};
    double a = -1;
    CHECK_OK(ts_amax_max(x, 7, &a));
    CHECK(a == 7.5, "amax max skips NaN/inf: %g", a);
    CHECK_OK(ts_amax_percentile(x, 7, 100, &a));
    CHECK(a == 7.5, "percentile 100 = max: %g", a);
    CHECK_OK(ts_amax_percentile(x, 7, 50, &a));
    CHECK(a == 2.0, "median of {0,1,3,7.5}: halfway between 1 and 3: %g", a);
    CHECK_OK(ts_amax_max(x, 0, &a));
    CHECK(a == 0, "empty amax");
    CHECK(ts_amax_percentile(x, 7, 0, &a) == TS_ERR_INVALID, "pct 0 refused");
    CHECK(ts_amax_percentile(x, 7, 100.5, &a) == TS_ERR_INVALID, "pct > 100 refused");
    /* against sorting, with ties and various sizes */
    static float big[5003];
    const int64_t sizes[] = {1, 2, 3, 17, 1000, 5003};
    const double pcts[] = {0.1, 25, 50, 90, 99, 99.9, 99.99, 100};
    for (size_t s = 0; s < 6; s++) {
        int64_t n = sizes[s];
        for (int64_t i = 0; i < n; i++) {
            double u = urand();
            big[i] = (float)((u - 0.5) * exp(8 * urand()));
            if (i % 7 == 3) big[i] = big[i / 2]; /* duplicates */
        }
        for (size_t p = 0; p < 8; p++) {
            CHECK_OK(ts_amax_percentile(big, n, pcts[p], &a));
            double want = np_percentile(big, n, pcts[p]);
            CHECK(fabs(a - want) <= 1e-12 * want, "percentile %g of %lld: %.17g, want %.17g",
                  pcts[p], (long long)n, a, want);
        }
    }
}

static void test_channels(void) {
    int64_t d[3] = {3, 4, 5};
    float x[60];
    for (int i = 0; i < 60; i++) x[i] = (float)((urand() - 0.5) * (1 + i % 9));
    for (int ax = 0; ax < 3; ax++)
        for (int m = 0; m < 2; m++) {
            double am[5];
            CHECK_OK(ts_amax_channels(x, 3, d, ax - 3 * (m == 1), (ts_calib_method)m, 90, am));
            int64_t inner = 1;
            for (int k = 2; k > ax; k--) inner *= d[k];
            for (int64_t c = 0; c < d[ax]; c++) {
                float sel[60];
                int64_t n = 0;
                for (int i = 0; i < 60; i++)
                    if ((i / inner) % d[ax] == c) sel[n++] = x[i];
                double want;
                if (m == 0)
                    ts_amax_max(sel, n, &want);
                else
                    want = np_percentile(sel, n, 90);
                CHECK(fabs(am[c] - want) <= 1e-12 * want, "axis %d %s channel %lld: %g, want %g",
                      ax, m ? "percentile" : "max", (long long)c, am[c], want);
            }
        }
    double am[5];
    CHECK(ts_amax_channels(x, 3, d, 3, TS_CALIB_MAX, 0, am) == TS_ERR_INVALID, "bad axis");
    CHECK(ts_amax_channels(x, 3, d, 0, TS_CALIB_DELAYED, 0, am) == TS_ERR_INVALID, "bad method");
}

static void test_scales(void) {
    CHECK(ts_fp8_scale_for(448, TS_F8E4M3, 0) == 1.0, "e4m3 amax 448 -> 1");
    CHECK(ts_fp8_scale_for(448, TS_F8E4M3, 1) == 2.0, "margin 1 doubles the step");
    CHECK(ts_fp8_scale_for(57344, TS_F8E5M2, 0) == 1.0, "e5m2");
    CHECK(ts_fp8_scale_for(0, TS_F8E4M3, 0) == 1.0, "amax 0 -> 1");
    CHECK(ts_fp8_scale_for(INFINITY, TS_F8E4M3, 0) == 1.0, "amax inf -> 1");
    CHECK_NEAR(ts_fp8_scale_for(3.5, TS_F8E4M3, 0), 3.5 / 448, 1e-18);
}

static void test_delayed(void) {
    const double seq[8] = {1, 4, 2, 0.5, 0.25, 0, NAN, 8};
    for (int r = 0; r < 2; r++) {
        ts_delayed_scaling d;
        CHECK_OK(ts_delayed_scaling_init(&d, TS_F8E4M3, 2, 3, (ts_amax_reduce)r, 0));
        CHECK(d.scale[0] == 1.0 && d.scale[1] == 1.0, "initial scale 1");
        double prev = 1.0;
        for (int t = 0; t < 8; t++) {
            double am[2] = {seq[t], 2 * seq[t]};
            CHECK_OK(ts_delayed_scaling_update(&d, am));
            double want;
            if (r == TS_AMAX_MOST_RECENT) {
                want = seq[t] > 0 ? seq[t] / 448 : prev; /* 0 and NaN keep the scale */
            } else {
                double m = 0;
                int nan = 0;
                for (int h = t - 2 < 0 ? 0 : t - 2; h <= t; h++) {
                    nan |= isnan(seq[h]);
                    m = seq[h] > m ? seq[h] : m;
                }
                want = nan || m == 0 ? prev : m / 448;
            }
            CHECK(d.scale[0] == want, "reduce %d step %d: scale %.17g, want %.17g", r, t,
                  d.scale[0], want);
            CHECK(d.scale[1] == 2 * d.scale[0], "channel 1 (twice the amax) step %d: %g", t,
                  d.scale[1]);
            prev = d.scale[0];
        }
        ts_delayed_scaling_free(&d);
    }
    ts_delayed_scaling d;
    CHECK(ts_delayed_scaling_init(&d, TS_F32, 1, 4, TS_AMAX_MAX, 0) == TS_ERR_INVALID, "f32");
    CHECK(ts_delayed_scaling_init(&d, TS_F8E5M2, 1, 0, TS_AMAX_MAX, 0) == TS_ERR_INVALID, "len 0");
}

/* errors against a direct computation with the reference conversions */
static void test_error(void) {
    enum { N = 400 };
    float x[N];
    for (int i = 0; i < N; i++) x[i] = (float)((urand() - 0.5) * pow(2.0, 20 * urand() - 12));
    x[0] = 1e-12f; /* flushes */
    x[1] = 900.0f; /* saturates at scale 1 */
    x[2] = NAN;    /* skipped */
    const double scales[3] = {1.0, 0.01, 3e-4};
    for (int f = 0; f < 2; f++)
        for (int k = 0; k < 3; k++) {
            ts_dtype fmt = f ? TS_F8E5M2 : TS_F8E4M3;
            ts_quant_error e;
            int64_t n = N;
            CHECK_OK(ts_quant_error_f32(x, 1, &n, TS_PER_TENSOR, fmt, &scales[k], &e));
            double se = 0, sx = 0, mx = 0;
            int64_t cnt = 0, sat = 0, fl = 0;
            float s = (float)scales[k];
            for (int i = 0; i < N; i++) {
                if (!isfinite(x[i])) continue;
                float t = x[i] / s;
                float q = ts_fp8_to_f32(ts_fp8_from_f64(t, fmt, 1), fmt) * s;
                double err = (double)x[i] - q;
                se += err * err;
                sx += (double)x[i] * x[i];
                mx = fabs(err) > mx ? fabs(err) : mx;
                sat += ts_fp8_from_f64(t, fmt, 0) != ts_fp8_from_f64(t, fmt, 1);
                fl += x[i] != 0 && q == 0;
                cnt++;
            }
            CHECK(e.n == cnt, "n %lld vs %lld", (long long)e.n, (long long)cnt);
            CHECK_NEAR(e.mse, se / cnt, 1e-12 * se / cnt);
            CHECK(e.max_abs == mx, "max abs %g vs %g", e.max_abs, mx);
            CHECK_NEAR(e.sqnr_db, 10 * log10(sx / se), 1e-9);
            CHECK(e.frac_saturated == (double)sat / cnt, "saturated %g", e.frac_saturated);
            CHECK(e.frac_flushed == (double)fl / cnt, "flushed %g", e.frac_flushed);
            if (k == 0 && f == 0)
                CHECK(sat > 0 && fl > 0, "both saturation and flushing exercised");
        }
    /* exactly representable values: no error at all */
    float ex[256];
    int m = 0;
    for (int c = 0; c < 256; c++) {
        float v = ts_fp8_to_f32((uint8_t)c, TS_F8E4M3);
        if (isfinite(v)) ex[m++] = v * 0.5f;
    }
    ts_quant_error e;
    int64_t n = m;
    double half = 0.5;
    CHECK_OK(ts_quant_error_f32(ex, 1, &n, TS_PER_TENSOR, TS_F8E4M3, &half, &e));
    CHECK(e.mse == 0 && isinf(e.sqnr_db) && e.frac_saturated == 0, "exact codes: mse %g", e.mse);
    double zero = 0;
    CHECK(ts_quant_error_f32(ex, 1, &n, TS_PER_TENSOR, TS_F8E4M3, &zero, &e) == TS_ERR_INVALID,
          "zero scale refused");
}

static void test_report(void) {
    /* 8 steps of [16] values whose magnitude doubles every step: the
     * delayed scale lags one step behind and saturates, max does not */
    enum { T = 8, W = 16 };
    float x[T * W];
    for (int t = 0; t < T; t++)
        for (int i = 0; i < W; i++)
            x[t * W + i] = (float)((i % 2 ? -1 : 1) * (0.1 + 0.9 * i / W) * pow(2.0, t));
    int64_t d[2] = {T, W};
    ts_quant_report_opts o = ts_quant_report_defaults();
    o.history_len = 4;
    o.pct = 90;
    ts_quant_report_row rows[3];
    CHECK_OK(ts_quant_report(x, 2, d, &o, rows));
    CHECK(rows[0].available && rows[1].available && rows[2].available, "all rows");
    double amax;
    ts_amax_max(x, T * W, &amax);
    CHECK(rows[0].amax == amax, "max row amax %g", rows[0].amax);
    ts_quant_error e;
    double s = ts_fp8_scale_for(amax, TS_F8E4M3, 0);
    ts_quant_error_f32(x, 2, d, TS_PER_TENSOR, TS_F8E4M3, &s, &e);
    CHECK(memcmp(&e, &rows[0].err, sizeof e) == 0, "max row = ts_quant_error_f32");
    CHECK(rows[0].err.frac_saturated == 0, "max never saturates");
    CHECK(rows[1].amax < amax && rows[1].err.frac_saturated > 0, "percentile clips the top");
    /* delayed: slice t uses the max of slices t-4..t-1 (slice 0 its own),
     * so from slice 1 on the top values saturate */
    double se = 0;
    int64_t sat = 0;
    for (int t = 0; t < T; t++) {
        double a = 0, am;
        for (int h = t - 4 < 0 ? 0 : t - 4; h <= (t ? t - 1 : 0); h++) {
            ts_amax_max(x + h * W, W, &am);
            a = am > a ? am : a;
        }
        double st = ts_fp8_scale_for(a, TS_F8E4M3, 0);
        int64_t w = W;
        ts_quant_error_f32(x + t * W, 1, &w, TS_PER_TENSOR, TS_F8E4M3, &st, &e);
        se += e.mse * W;
        sat += (int64_t)llround(e.frac_saturated * W);
    }
    CHECK_NEAR(rows[2].err.mse, se / (T * W), 1e-12 * se / (T * W));
    CHECK(rows[2].err.frac_saturated == (double)sat / (T * W) && sat > 0, "delayed saturated %g",
          rows[2].err.frac_saturated);
    /* per channel along axis 1: each column its own scale */
    o.axis = 1;
    CHECK_OK(ts_quant_report(x, 2, d, &o, rows));
    CHECK(rows[2].available, "delayed per channel along axis 1");
    double am[W], sc[W];
    CHECK_OK(ts_amax_channels(x, 2, d, 1, TS_CALIB_MAX, 0, am));
    for (int c = 0; c < W; c++) sc[c] = ts_fp8_scale_for(am[c], TS_F8E4M3, 0);
    CHECK_OK(ts_quant_error_f32(x, 2, d, 1, TS_F8E4M3, sc, &e));
    CHECK(memcmp(&e, &rows[0].err, sizeof e) == 0, "per-channel max row = ts_quant_error_f32");
    /* delayed does not apply on rank 1 or with channels along time */
    o.axis = 0;
    CHECK_OK(ts_quant_report(x, 2, d, &o, rows));
    CHECK(!rows[2].available && rows[0].available, "axis 0: no delayed row");
    o.axis = TS_PER_TENSOR;
    int64_t n = T * W;
    CHECK_OK(ts_quant_report(x, 1, &n, &o, rows));
    CHECK(!rows[2].available, "rank 1: no delayed row");
    o.pct = 0;
    CHECK(ts_quant_report(x, 1, &n, &o, rows) == TS_ERR_INVALID, "pct 0 refused");
}

int main(void) {
    test_amax();
    test_channels();
    test_scales();
    test_delayed();
    test_error();
    test_report();
    return check_summary("quant calib");
}
