/* `tessel quant report` and `tessel export --fp8`, end to end ($TESSEL_BIN,
 * run from the repository root): the report on a .npy file (table and
 * --json, whose numbers must equal the library's ts_quant_report) and on a
 * checkpoint's parameters; the FP8 export read back with the safetensors
 * reader, every code checked against the reference conversion; usage
 * errors exit 2. */
#include <jansson.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include "check.h"
#include "ckpt/safetensors.h"
#include "e2e.h"
#include "quant/calib.h"
#include "testfiles.h"

static char dir[64];

enum { T = 6, W = 32 };
static float X[T * W];

static void expect_usage(const char *what, e2e_result r, const char *needle) {
    CHECK(r.rc == 2, "%s: exit %d, expected 2\n%s", what, r.rc, r.err);
    CHECK(strstr(r.err, needle) != NULL, "%s: '%s' not in: %s", what, needle, r.err);
    e2e_done(&r);
}

/* The JSON report's rows equal the library's for the same options. */
static void check_json(const char *text, const ts_quant_report_opts *o) {
    json_error_t err;
    json_t *root = json_loads(text, 0, &err);
    CHECK(root != NULL, "report --json is not JSON: %s\n%s", err.text, text);
    if (!root) return;
    json_t *t = json_array_get(json_object_get(root, "tensors"), 0);
    ts_quant_report_row rows[3];
    int64_t d[2] = {T, W};
    CHECK_OK(ts_quant_report(X, 2, d, o, rows));
    for (int k = 0; k < 3; k++) {
        json_t *m = json_object_get(json_object_get(t, "methods"), ts_calib_method_name(k));
        CHECK(m && json_is_object(m), "method %s missing", ts_calib_method_name(k));
        if (!m || !json_is_object(m)) continue;
        double mse = json_real_value(json_object_get(m, "mse"));
        double sat = json_real_value(json_object_get(m, "frac_saturated"));
        double amax = json_real_value(json_object_get(m, "amax"));
        CHECK(fabs(mse - rows[k].err.mse) <= 1e-8 * rows[k].err.mse, "%s mse %g vs %g",
              ts_calib_method_name(k), mse, rows[k].err.mse);
        CHECK(fabs(sat - rows[k].err.frac_saturated) <= 1e-9, "%s saturated",
              ts_calib_method_name(k));
        CHECK(fabs(amax - rows[k].amax) <= 1e-8 * rows[k].amax, "%s amax", ts_calib_method_name(k));
    }
    json_decref(root);
}

static void test_npy(void) {
    for (int t = 0; t < T; t++)
        for (int i = 0; i < W; i++)
            X[t * W + i] = (float)(sin(1.3 * i + t) * exp(0.5 * t) + (i == 3 ? 40 : 0));
    char path[128];
    snprintf(path, sizeof path, "%s/act.npy", dir);
    tf_write_npy(path, "<f4", T, W, X, 4, 0);
    e2e_result r = e2e_runf("quant report %s", path);
    CHECK(r.rc == 0, "report: exit %d\n%s", r.rc, r.err);
    CHECK(strstr(r.out, "f32[6,32], per tensor") && strstr(r.out, "percentile") &&
              strstr(r.out, "delayed") && strstr(r.out, "sqnr_db"),
          "report table:\n%s", r.out);
    e2e_done(&r);
    ts_quant_report_opts o = ts_quant_report_defaults();
    r = e2e_runf("quant report %s --json", path);
    CHECK(r.rc == 0, "report --json: exit %d\n%s", r.rc, r.err);
    check_json(r.out, &o);
    e2e_done(&r);
    o.fmt = TS_F8E5M2;
    o.axis = 1;
    o.pct = 99;
    o.history_len = 2;
    o.reduce = TS_AMAX_MOST_RECENT;
    o.margin = 1;
    r = e2e_runf("quant report %s --format e5m2 --per-channel -1 --percentile 99 --history 2 "
                 "--reduce most_recent --margin 1 --json",
                 path);
    CHECK(r.rc == 0, "report options: exit %d\n%s", r.rc, r.err);
    check_json(r.out, &o);
    CHECK(strstr(r.out, "\"channel_axis\": 1") != NULL, "channel axis:\n%s", r.out);
    e2e_done(&r);
    expect_usage("bad format", e2e_runf("quant report %s --format e3m4", path), "e4m3 or e5m2");
    expect_usage("bad option", e2e_runf("quant report %s --frmat e5m2", path), "unknown option");
    expect_usage("bad percentile", e2e_runf("quant report %s --percentile 0", path),
                 "--percentile");
    expect_usage("missing file", e2e_runf("quant report %s/none.npy", dir), "none.npy");
    expect_usage("no subcommand", e2e_run("quant"), "usage");
}

/* A checkpoint of two parameters with known values. */
static const int64_t WD[2] = {8, 4}, BD[1] = {8};
static float Wv[32], Bv[8];
static void make_ckpt(const char *run) {
    for (int i = 0; i < 32; i++) Wv[i] = (float)(0.05 * cos(i * 0.9) * (i == 17 ? 30 : 1));
    for (int i = 0; i < 8; i++) Bv[i] = (float)(1e-3 * (i - 4));
    ts_graph *g = ts_graph_new();
    int64_t xd[2] = {2, 4};
    ts_val x = ts_input(g, "x", TS_F32, 2, xd);
    ts_val w = ts_param(g, "fc.weight", TS_F32, 2, WD, ts_init_buffer(Wv));
    ts_val b = ts_param(g, "fc.bias", TS_F32, 1, BD, ts_init_buffer(Bv));
    CHECK_OK(ts_mark_output(g, ts_linear(g, x, w, b), "y"));
    ts_plan *p = NULL;
    CHECK_OK(ts_compile(g, NULL, NULL, &p));
    ts_ckpt_options o = ts_ckpt_options_default();
    if (p) CHECK_OK(ts_ckpt_save(p, run, NULL, &o));
    ts_plan_free(p);
    ts_graph_free(g);
}

static void check_export(const char *file, ts_dtype fmt) {
    ts_st_file *f = NULL;
    CHECK_OK(ts_st_open(file, &f));
    if (!f) return;
    const char *names[2] = {"fc.weight", "fc.bias"};
    const float *orig[2] = {Wv, Bv};
    for (int k = 0; k < 2; k++) {
        ts_st_tensor t, s;
        char sname[64];
        snprintf(sname, sizeof sname, "%s.scale", names[k]);
        CHECK_OK(ts_st_find(f, names[k], &t));
        CHECK_OK(ts_st_find(f, sname, &s));
        if (ts_st_find(f, names[k], &t) != TS_OK || ts_st_find(f, sname, &s) != TS_OK) continue;
        CHECK(t.dtype == fmt && t.rank == (k ? 1 : 2) && t.dims[0] == 8, "%s: %s rank %d", names[k],
              ts_dtype_name(t.dtype), t.rank);
        CHECK(s.dtype == TS_F32 && s.rank == 0, "%s: scale %s rank %d", names[k],
              ts_dtype_name(s.dtype), s.rank);
        float sc;
        memcpy(&sc, s.data, 4);
        double amax;
        int64_t n = k ? 8 : 32;
        ts_amax_max(orig[k], n, &amax);
        CHECK(sc == (float)ts_fp8_scale_for(amax, fmt, 0), "%s: scale %g", names[k], sc);
        const uint8_t *q = t.data;
        int bad = 0;
        for (int64_t i = 0; i < n; i++) {
            uint8_t want = ts_fp8_from_f32(orig[k][i] / sc, fmt, 1);
            double back = ts_fp8_to_f32(q[i], fmt) * sc;
            /* half an ulp: 2^-4 (e4m3) or 2^-3 (e5m2) relative, or the subnormal step */
            double tol = fabs(orig[k][i]) * (fmt == TS_F8E4M3 ? 0.0625 : 0.125) +
                         ts_fp8_min_subnormal(fmt) * sc;
            if ((q[i] != want || fabs(back - orig[k][i]) > tol) && bad++ < 3)
                CHECK(0, "%s[%lld] = %g: code 0x%02X (%g), want 0x%02X", names[k], (long long)i,
                      orig[k][i], q[i], back, want);
        }
        CHECK(bad == 0, "%s: %d codes differ", names[k], bad);
    }
    const char *m = ts_st_metadata(f, "tessel_fp8");
    CHECK(m && !strcmp(m, fmt == TS_F8E4M3 ? "e4m3" : "e5m2"), "metadata tessel_fp8 = %s",
          m ? m : "(none)");
    CHECK(ts_st_count(f) == 4, "4 tensors, got %d", ts_st_count(f));
    ts_st_close(f);
    /* the header names the standard dtype strings */
    long len = 0;
    char *raw = e2e_slurp(file, &len);
    const char *want = fmt == TS_F8E4M3 ? "\"F8_E4M3\"" : "\"F8_E5M2\"";
    CHECK(len > 8 && memmem(raw + 8, (size_t)len - 8, want, strlen(want)) != NULL,
          "header lacks %s", want);
    free(raw);
}

static void test_ckpt(void) {
    char run[128], file[160];
    snprintf(run, sizeof run, "%s/run", dir);
    make_ckpt(run);
    e2e_result r = e2e_runf("quant report %s", run);
    CHECK(r.rc == 0, "ckpt report: exit %d\n%s", r.rc, r.err);
    CHECK(strstr(r.out, "fc.weight f32[8,4]") && strstr(r.out, "fc.bias f32[8]"), "tensors:\n%s",
          r.out);
    e2e_done(&r);
    r = e2e_runf("quant report %s --per-channel 0 --json", run);
    CHECK(r.rc == 0, "ckpt report --json: exit %d\n%s", r.rc, r.err);
    json_t *root = json_loads(r.out, 0, NULL);
    CHECK(root && json_array_size(json_object_get(root, "tensors")) == 2, "two tensors:\n%s",
          r.out);
    json_decref(root);
    e2e_done(&r);
    const char *fmts[2] = {"e4m3", "e5m2"};
    for (int k = 0; k < 2; k++) {
        snprintf(file, sizeof file, "%s/w-%s.safetensors", dir, fmts[k]);
        r = e2e_runf("export %s --safetensors %s --fp8 %s", run, file, fmts[k]);
        CHECK(r.rc == 0 && strstr(r.out, "FP8"), "export --fp8 %s: exit %d\n%s%s", fmts[k], r.rc,
              r.out, r.err);
        e2e_done(&r);
        check_export(file, k ? TS_F8E5M2 : TS_F8E4M3);
    }
    expect_usage("bad --fp8", e2e_runf("export %s --safetensors %s --fp8 int8", run, file),
                 "e4m3 or e5m2");
}

int main(void) {
    if (!e2e_setup("quant", dir, sizeof dir)) return check_summary("e2e/quant");
    test_npy();
    test_ckpt();
    e2e_cleanup(dir);
    return check_summary("e2e/quant");
}
