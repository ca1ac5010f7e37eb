/* Gradient checks and reference values for softmax and log_softmax. */
#include <math.h>
#include <string.h>
#include "gradcheck.h"

typedef struct axis_arg {
    int axis;
    int log;
} axis_arg;

static ts_val build_sm(ts_graph *g, const ts_val *in, void *u) {
    const axis_arg *a = u;
    return a->log ? ts_log_softmax(g, in[0], a->axis) : ts_softmax(g, in[0], a->axis);
}

/* softmax feeding log_softmax: both backward ops in one chain. */
static ts_val build_chain(ts_graph *g, const ts_val *in, void *u) {
    (void)u;
    return ts_log_softmax(g, ts_mul(g, ts_softmax(g, in[0], 1), in[1]), 0);
}

/* An inference plan over constants: the f64 value `out` into dst. */
static void forward(ts_graph *g, ts_val out, double *dst, size_t n, int threads) {
    ts_plan *p = NULL;
    ts_compile_options o = ts_compile_options_default();
    o.threads = threads;
    CHECK_OK(ts_mark_output(g, out, "out"));
    CHECK_OK(ts_compile(g, NULL, &o, &p));
    if (!p) return;
    CHECK_OK(ts_plan_step(p));
    CHECK_OK(ts_plan_read(p, "out", dst, n * sizeof(double)));
    ts_plan_free(p);
}

static void check_values(const char *what, const double *got, const double *want, int n) {
    for (int i = 0; i < n; i++) {
        if (isinf(want[i]))
            CHECK(got[i] == want[i], "%s[%d] = %g, expected %g", what, i, got[i], want[i]);
        else
            CHECK(fabs(got[i] - want[i]) <= 1e-12 * (1 + fabs(want[i])),
                  "%s[%d] = %.17g, expected %.17g", what, i, got[i], want[i]);
    }
}

static void gradchecks(void) {
    const struct {
        const char *label;
        gc_input in;
        int axis;
    } cases[] = {
        {"last axis [3,5]", GC_F(3, 5), -1},
        {"axis 0 [4,3]", GC_F(4, 3), 0},
        {"middle axis [2,3,4]", GC_F(2, 3, 4), 1},
        {"negative middle axis [2,3,4]", GC_F(2, 3, 4), -2},
        {"middle axis, inner > 64 [2,3,70]", GC_F(2, 3, 70), 1},
        {"long row (lanes + tail) [2,37]", GC_F(2, 37), 1},
        {"size-1 axis [3,1]", GC_F(3, 1), -1},
        {"size-1 axis in the middle [2,1,3]", GC_F(2, 1, 3), 1},
        {"rank 1 [6]", GC_F(6), 0},
        {"rank 0", GC_SCALAR, -1},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        for (int log = 0; log < 2; log++) {
            char label[128];
            snprintf(label, sizeof label, "%s %s", log ? "log_softmax" : "softmax", cases[i].label);
            gc_input in = cases[i].in;
            in.lo = -3, in.hi = 3;
            axis_arg a = {cases[i].axis, log};
            gc_check(label, 1, &in, build_sm, &a);
        }
    }
    gc_input ch[2] = {GC_F(3, 4), GC_F(4)};
    gc_check("softmax -> mul (broadcast) -> log_softmax", 2, ch, build_chain, NULL);
}

static void reference_values(void) {
    /* x, softmax and log_softmax along both axes from PyTorch 1.13 in f64:
     * torch.softmax(x, -1), torch.softmax(x, 0), torch.log_softmax(...). */
    static const double x[12] = {1.0, -2.0, 0.5, 3.0, 0.0, 0.25, -1.5, 2.0, -0.75, 1.25, 0.0, -3.0};
    static const double sm_last[12] = {
        0.11055375036173921,  0.0055041471275836728, 0.067054239140611469, 0.81688786337006569,
        0.10104876823206328,  0.12974918673495806,   0.022547027838421847, 0.74665501719455685,
        0.094237780582327457, 0.69632824736153509,   0.19950138305832882,  0.0099325889978084305};
    static const double sm_0[12] = {
        0.64865423705164726, 0.027564857816421005, 0.57409699296769456,  0.72973621411841516,
        0.23862655824004825, 0.26152808932898503,  0.077695579148570587, 0.26845495065244657,
        0.11271920470830456, 0.71090705285459388,  0.34820742788373482,  0.0018088352291382895};
    static const double lsm_last[12] = {
        -2.2022534476793516, -5.202253447679352,   -2.7022534476793516, -0.20225344767935172,
        -2.2921520248944489, -2.0421520248944489,  -3.7921520248944489, -0.29215202489444886,
        -2.3619341100530473, -0.36193411005304732, -1.6119341100530473, -4.6119341100530473};
    static const double lsm_0[12] = {
        -0.43285546687876886, -3.5912135850738367,  -0.55495691964199068, -0.31507216066525123,
        -1.432855466878769,   -1.3412135850738367,  -2.5549569196419908,  -1.3150721606652511,
        -2.182855466878769,   -0.34121358507383659, -1.0549569196419908,  -6.3150721606652516};
    const double *want[4] = {sm_last, sm_0, lsm_last, lsm_0};
    const char *names[4] = {"softmax(x, -1)", "softmax(x, 0)", "log_softmax(x, -1)",
                            "log_softmax(x, 0)"};
    for (int k = 0; k < 4; k++) {
        ts_graph *g = ts_graph_new();
        ts_val c = ts_constant(g, "x", TS_F64, 2, (int64_t[]){3, 4}, x);
        int axis = k % 2 ? 0 : -1;
        ts_val y = k < 2 ? ts_softmax(g, c, axis) : ts_log_softmax(g, c, axis);
        double got[12] = {0};
        forward(g, y, got, 12, 0);
        check_values(names[k], got, want[k], 12);
        ts_graph_free(g);

        /* The f32 kernels (own vectorised exp) stay within a few ulp. */
        float xf[12], gotf[12] = {0};
        for (int i = 0; i < 12; i++) xf[i] = (float)x[i];
        g = ts_graph_new();
        c = ts_constant(g, "x", TS_F32, 2, (int64_t[]){3, 4}, xf);
        y = k < 2 ? ts_softmax(g, c, axis) : ts_log_softmax(g, c, axis);
        ts_plan *p = NULL;
        CHECK_OK(ts_mark_output(g, y, "out"));
        CHECK_OK(ts_compile(g, NULL, NULL, &p));
        if (p) {
            CHECK_OK(ts_plan_step(p));
            CHECK_OK(ts_plan_read(p, "out", gotf, sizeof gotf));
            ts_plan_free(p);
        }
        for (int i = 0; i < 12; i++)
            CHECK(fabs(gotf[i] - want[k][i]) <= 5e-7 * fabs(want[k][i]),
                  "f32 %s[%d] = %.9g, expected %.9g", names[k], i, gotf[i], want[k][i]);
        ts_graph_free(g);
    }

    /* Masking: a partially masked row matches torch ([0.2689, 0, 0.7311]
     * and [-1.3133, -inf, -0.3133]); a fully masked row gives zeros and
     * -inf where torch 1.13 gives NaN (documented in src/ops/softmax.c). */
    const double inf = INFINITY;
    static const double pm_sm[4] = {0.26894142136999516, 0, 0.7310585786300049, 0};
    static const double pm_lsm[4] = {-1.3132616875182228, -INFINITY, -0.31326168751822286,
                                     -INFINITY};
    double m[8] = {0.0, -inf, 1.0, -inf, -inf, -inf, -inf, -inf};
    for (int log = 0; log < 2; log++) {
        for (int axis = 0; axis < 2; axis++) {
            /* axis 1 of [2,4], and axis 0 of its transpose [4,2] (strided path) */
            double mt[8];
            for (int i = 0; i < 2; i++)
                for (int j = 0; j < 4; j++) mt[j * 2 + i] = m[i * 4 + j];
            ts_graph *g = ts_graph_new();
            ts_val c = axis ? ts_constant(g, "m", TS_F64, 2, (int64_t[]){2, 4}, m)
                            : ts_constant(g, "m", TS_F64, 2, (int64_t[]){4, 2}, mt);
            ts_val y = log ? ts_log_softmax(g, c, axis) : ts_softmax(g, c, axis);
            double got[8] = {0}, row[2][4];
            forward(g, y, got, 8, 0);
            for (int i = 0; i < 2; i++)
                for (int j = 0; j < 4; j++) row[i][j] = axis ? got[i * 4 + j] : got[j * 2 + i];
            check_values(log ? "log_softmax masked row" : "softmax masked row", row[0],
                         log ? pm_lsm : pm_sm, 4);
            for (int j = 0; j < 4; j++)
                CHECK(log ? row[1][j] == -inf : row[1][j] == 0,
                      "fully masked row (axis %d): element %d = %g", axis, j, row[1][j]);
            ts_graph_free(g);
        }
    }
}

/* Same bits for 1 and 4 threads on a tensor large enough to go parallel. */
static void determinism(void) {
    enum { R = 64, C = 700 };
    static double x[R * C], a[R * C], b[R * C];
    for (int i = 0; i < R * C; i++) x[i] = sin(i * 0.37) * 4;
    for (int axis = 0; axis < 2; axis++) {
        double *out[2] = {a, b};
        for (int t = 0; t < 2; t++) {
            ts_graph *g = ts_graph_new();
            ts_val c = ts_constant(g, "x", TS_F64, 2, (int64_t[]){R, C}, x);
            forward(g, ts_softmax(g, c, axis), out[t], R * C, t ? 4 : 1);
            ts_graph_free(g);
        }
        CHECK(memcmp(a, b, sizeof a) == 0, "softmax axis %d differs between 1 and 4 threads", axis);
    }
}

/* f32 rows of a few elements along the last axis take the row-blocked
 * path: against f64 (1e-6), the same bits at 1 and 2 threads, a fully
 * masked row gives zeros and a NaN stays in its row. */
static void few_columns(void) {
    enum { R = 12003 }; /* R * n >= TS_PAR_MIN for n > 1: parallel */
    for (int n = 1; n <= 15; n += 7) {
        static float xf[R * 15], y[2][R * 15];
        static double xd[R * 15], yd[R * 15];
        for (int i = 0; i < R * n; i++) xd[i] = sin(i * 0.37) * 6, xf[i] = (float)xd[i];
        for (int j = 0; j < n; j++) xf[5 * n + j] = -INFINITY, xd[5 * n + j] = -INFINITY;
        xf[9 * n] = NAN;
        for (int t = 0; t < 3; t++) {
            ts_graph *g = ts_graph_new();
            int64_t d[2] = {R, n};
            ts_val c = t < 2 ? ts_constant(g, "x", TS_F32, 2, d, xf)
                             : ts_constant(g, "x", TS_F64, 2, d, xd);
            ts_val o = ts_softmax(g, c, 1);
            ts_plan *p = NULL;
            ts_compile_options co = ts_compile_options_default();
            co.threads = t == 1 ? 2 : 1;
            CHECK_OK(ts_mark_output(g, o, "out"));
            CHECK_OK(ts_compile(g, NULL, &co, &p));
            if (p) {
                CHECK_OK(ts_plan_step(p));
                CHECK_OK(ts_plan_read(p, "out", t < 2 ? (void *)y[t] : (void *)yd,
                                      (size_t)(R * n) * (t < 2 ? sizeof(float) : sizeof(double))));
                ts_plan_free(p);
            }
            ts_graph_free(g);
        }
        CHECK(!memcmp(y[0], y[1], sizeof(float) * (size_t)(R * n)),
              "softmax n=%d: 1 and 2 threads differ", n);
        int bad = 0;
        for (int i = 0; i < R * n; i++) {
            if (i / n == 9) {
                bad += !isnan(y[0][i]);
                continue;
            }
            bad += !(fabs(y[0][i] - yd[i]) <= 1e-6);
        }
        CHECK(bad == 0, "softmax n=%d: %d values off the f64 result", n, bad);
        for (int j = 0; j < n; j++)
            CHECK(y[0][5 * n + j] == 0, "masked row: y = %g", y[0][5 * n + j]);
    }
}

static void errors(void) {
    ts_graph *g = ts_graph_new();
    ts_val x = ts_input(g, "x", TS_F32, 2, (int64_t[]){2, 3});
    CHECK(!ts_val_ok(ts_softmax(g, x, 2)), "axis 2 of a rank-2 value must fail");
    CHECK(strstr(ts_graph_error(g), "softmax") && strstr(ts_graph_error(g), "f32[2,3]"),
          "message names the op and shape: %s", ts_graph_error(g));
    ts_graph_free(g);

    g = ts_graph_new();
    x = ts_input(g, "x", TS_F32, 2, (int64_t[]){2, 3});
    CHECK(!ts_val_ok(ts_log_softmax(g, x, -3)), "axis -3 of a rank-2 value must fail");
    CHECK(strstr(ts_graph_error(g), "log_softmax"), "message names the op: %s", ts_graph_error(g));
    ts_graph_free(g);

    g = ts_graph_new();
    ts_val s = ts_scalar(g, 1.0, TS_F64);
    CHECK(!ts_val_ok(ts_softmax(g, s, 1)), "axis 1 of a rank-0 value must fail");
    ts_graph_free(g);

    g = ts_graph_new();
    ts_val i = ts_input(g, "idx", TS_I64, 1, (int64_t[]){4});
    CHECK(!ts_val_ok(ts_softmax(g, i, 0)), "softmax of i64 must fail");
    CHECK(strstr(ts_graph_error(g), "softmax") && strstr(ts_graph_error(g), "i64[4]") &&
              strstr(ts_graph_error(g), "float"),
          "message names the op, shape and reason: %s", ts_graph_error(g));
    ts_graph_free(g);
}

int main(void) {
    gradchecks();
    reference_values();
    determinism();
    few_columns();
    errors();
    return check_summary("gradcheck_softmax");
}
