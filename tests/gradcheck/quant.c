/* The FP8 quantisation ops (src/ops/quant.c): quantize and dequantize
 * against the reference conversions of tessel/quant.h, per tensor and per
 * channel along every axis, in f32 (fast encoders) and f64 (reference
 * encoder); fake_quant's straight-through gradient against the
 * finite-difference gradient of its surrogate clamp(x, -max s, max s);
 * error cases; and a few SGD steps of a layer with fake-quantised weights. */
#include <stdlib.h>
#include <string.h>
#include "gradcheck.h"
#include "tessel/quant.h"

#define D0 3
#define D1 4
#define D2 5
#define N  (D0 * D1 * D2)

static const int64_t DIMS[3] = {D0, D1, D2};
static double XS[N];

/* A deterministic mix of magnitudes: tiny (flushing), ordinary, and large
 * enough to saturate with the scales used below. */
static void fill_x(void) {
    for (int i = 0; i < N; i++) {
        double m = pow(2.0, (double)((i * 7) % 29) - 14.0) * (1.0 + 0.37 * (i % 5));
        XS[i] = (i % 3 ? m : -m);
    }
    XS[5] = 0.0;
    XS[6] = -0.0;
}

/* Index of element i along axis (of DIMS). */
static int64_t coord(int64_t i, int axis) {
    int64_t inner = 1;
    for (int a = 2; a > axis; a--) inner *= DIMS[a];
    return (i / inner) % DIMS[axis];
}

/* Runs out = op(x, scale) in an inference plan; x and scale in dtype dt
 * (values from XS / sc), out read into dst (bytes). axis < -3: per tensor. */
typedef enum { OP_Q, OP_FAKE } opk;
static int run(opk op, ts_dtype dt, ts_dtype fmt, int axis, const double *sc, void *dst,
               size_t bytes) {
    ts_graph *g = ts_graph_new();
    int per_tensor = axis < -3;
    int64_t sdim = per_tensor ? 1 : DIMS[(axis + 3) % 3];
    float xf[N], sf[D2];
    for (int i = 0; i < N; i++) xf[i] = (float)XS[i];
    for (int i = 0; i < sdim; i++) sf[i] = (float)sc[i];
    const void *xd = dt == TS_F32 ? (const void *)xf : (const void *)XS;
    const void *sd = dt == TS_F32 ? (const void *)sf : (const void *)sc;
    ts_val x = ts_constant(g, "x", dt, 3, DIMS, xd);
    ts_val s = ts_constant(g, "s", dt, per_tensor ? 0 : 1, &sdim, sd);
    ts_val y = op == OP_Q ? ts_quantize(g, x, s, fmt, axis) : ts_fake_quant(g, x, s, fmt, axis);
    ts_plan *p = NULL;
    int ok = ts_mark_output(g, y, "y") == TS_OK && ts_compile(g, NULL, NULL, &p) == TS_OK &&
             ts_plan_step(p) == TS_OK && ts_plan_read(p, "y", dst, bytes) == TS_OK;
    if (!ok) CHECK(0, "run %s: %s", op == OP_Q ? "quantize" : "fake_quant", ts_last_error());
    ts_plan_free(p);
    ts_graph_free(g);
    return ok;
}

static void test_forward(void) {
    const ts_dtype fmts[2] = {TS_F8E4M3, TS_F8E5M2};
    /* scales: non-powers of two, so x / s rounds in the input precision */
    const double sc[D2] = {0.013, 0.3, 1.7, 0.0021, 5.5};
    const int axes[5] = {-100, 0, 1, 2, -1};
    for (int f = 0; f < 2; f++)
        for (int a = 0; a < 5; a++)
            for (int d = 0; d < 2; d++) {
                ts_dtype dt = d ? TS_F64 : TS_F32;
                uint8_t q[N];
                double y64[N];
                float y32[N];
                if (!run(OP_Q, dt, fmts[f], axes[a], sc, q, sizeof q)) continue;
                if (!run(OP_FAKE, dt, fmts[f], axes[a], sc, dt == TS_F32 ? (void *)y32 : y64,
                         dt == TS_F32 ? sizeof y32 : sizeof y64))
                    continue;
                int bad = 0;
                for (int i = 0; i < N; i++) {
                    int ci = axes[a] < -3 ? 0 : (int)coord(i, (axes[a] + 3) % 3);
                    uint8_t want;
                    double fq;
                    if (dt == TS_F32) {
                        float s = (float)sc[ci];
                        want = ts_fp8_from_f32((float)XS[i] / s, fmts[f], 1);
                        fq = (double)(ts_fp8_to_f32(want, fmts[f]) * s);
                    } else {
                        want = ts_fp8_from_f64(XS[i] / sc[ci], fmts[f], 1);
                        fq = (double)ts_fp8_to_f32(want, fmts[f]) * sc[ci];
                    }
                    double got = dt == TS_F32 ? y32[i] : y64[i];
                    if ((q[i] != want || got != fq) && bad++ < 3)
                        CHECK(0,
                              "fmt %s axis %d %s: x[%d]=%g: code 0x%02X want 0x%02X, "
                              "fake %.9g want %.9g",
                              ts_dtype_name(fmts[f]), axes[a], ts_dtype_name(dt), i, XS[i], q[i],
                              want, got, fq);
                }
                CHECK(bad == 0, "%d mismatches", bad);
            }
}

/* dequantize: every code of both formats, per tensor and per channel. */
static void test_dequantize(void) {
    const ts_dtype fmts[2] = {TS_F8E4M3, TS_F8E5M2};
    uint8_t codes[256];
    for (int c = 0; c < 256; c++) codes[c] = (uint8_t)c;
    for (int f = 0; f < 2; f++)
        for (int pc = 0; pc < 2; pc++)
            for (int d = 0; d < 2; d++) {
                ts_dtype dt = d ? TS_F64 : TS_F32;
                ts_graph *g = ts_graph_new();
                int64_t qd[2] = {16, 16}, sd = 16;
                double s64[16];
                float s32[16];
                for (int i = 0; i < 16; i++) s32[i] = (float)(s64[i] = 0.25 + 0.1 * i);
                ts_val q = ts_constant(g, "q", fmts[f], 2, qd, codes);
                ts_val s = ts_constant(g, "s", dt, pc, &sd, d ? (void *)s64 : (void *)s32);
                ts_val y = ts_dequantize(g, q, s, -1);
                double o64[256];
                float o32[256];
                ts_plan *p = NULL;
                CHECK_OK(ts_mark_output(g, y, "y"));
                CHECK_OK(ts_compile(g, NULL, NULL, &p));
                CHECK_OK(ts_plan_step(p));
                CHECK_OK(ts_plan_read(p, "y", d ? (void *)o64 : (void *)o32, d ? 2048 : 1024));
                int bad = 0;
                for (int c = 0; c < 256; c++) {
                    int ci = pc ? c % 16 : 0;
                    double v = ts_fp8_to_f32((uint8_t)c, fmts[f]);
                    double want = d ? v * s64[ci] : (double)((float)v * s32[ci]);
                    double got = d ? o64[c] : o32[c];
                    if (!(got == want || (isnan(got) && isnan(want))) && bad++ < 3)
                        CHECK(0, "dequantize %s code 0x%02X: %g, want %g", ts_dtype_name(fmts[f]),
                              c, got, want);
                }
                CHECK(bad == 0, "dequantize: %d mismatches", bad);
                ts_plan_free(p);
                ts_graph_free(g);
            }
}

/* Tensors above the parallel threshold: a per-tensor scale split into
 * chunks, runs per channel along axis 0, per-element scales along axis 1. */
static void test_large(void) {
    enum { R = 48, C = 1200 };
    static float x[R * C], sc[C];
    static uint8_t q[R * C];
    for (int i = 0; i < R * C; i++) x[i] = (float)(sin(i * 0.37) * pow(2.0, (i % 23) - 10));
    for (int c = 0; c < C; c++) sc[c] = (float)(0.001 * (1 + c % 13));
    const int axes[3] = {-100, 0, 1};
    for (int a = 0; a < 3; a++) {
        ts_graph *g = ts_graph_new();
        int64_t d[2] = {R, C}, sd = axes[a] == 0 ? R : C;
        ts_val xv = ts_constant(g, "x", TS_F32, 2, d, x);
        ts_val s = ts_constant(g, "s", TS_F32, axes[a] < -3 ? 0 : 1, &sd, sc);
        ts_val y = ts_quantize(g, xv, s, TS_F8E5M2, axes[a]);
        ts_plan *p = NULL;
        CHECK_OK(ts_mark_output(g, y, "q"));
        CHECK_OK(ts_compile(g, NULL, NULL, &p));
        CHECK_OK(ts_plan_step(p));
        CHECK_OK(ts_plan_read(p, "q", q, sizeof q));
        int bad = 0;
        for (int i = 0; i < R * C; i++) {
            float si = axes[a] < -3 ? sc[0] : axes[a] == 0 ? sc[i / C] : sc[i % C];
            uint8_t want = ts_fp8_from_f32(x[i] / si, TS_F8E5M2, 1);
            if (q[i] != want && bad++ < 3)
                CHECK(0, "large axis %d: q[%d] = 0x%02X, want 0x%02X", axes[a], i, q[i], want);
        }
        CHECK(bad == 0, "large axis %d: %d codes differ", axes[a], bad);
        ts_plan_free(p);
        ts_graph_free(g);
    }
}

/* ---- straight-through gradient ------------------------------------------ */

#define GN 40
static const double GSCALE = 0.004; /* e4m3: saturates beyond 448 * 0.004 = 1.792 */

/* the surrogate whose derivative the STE is: clamp(x, -max s, max s) */
static ts_val build_clamp(ts_graph *g, const ts_val *in, void *u) {
    (void)u;
    double m = 448.0 * GSCALE;
    ts_dtype dt = ts_dtype_of(g, in[0]);
    return ts_minimum(g, ts_maximum(g, in[0], ts_scalar(g, -m, dt)), ts_scalar(g, m, dt));
}
static ts_val build_fake(ts_graph *g, const ts_val *in, void *u) {
    (void)u;
    return ts_fake_quant(g, in[0], ts_scalar(g, GSCALE, ts_dtype_of(g, in[0])), TS_F8E4M3, 0);
}

/* d sum(f(x) * R) / dx of a builder at x, in dtype dt (R = 1 + i / GN). */
static int grad_of(gc_build_fn build, ts_dtype dt, const double *x, double *dx) {
    ts_graph *g = ts_graph_new();
    int64_t n = GN;
    double r[GN];
    float xf[GN], rf[GN], gf[GN];
    for (int i = 0; i < GN; i++) {
        r[i] = 1.0 + (double)i / GN;
        rf[i] = (float)r[i];
        xf[i] = (float)x[i];
    }
    ts_val xv = ts_param(g, "x", dt, 1, &n,
                         ts_init_buffer(dt == TS_F32 ? (const void *)xf : (const void *)x));
    ts_val y = build(g, &xv, NULL);
    ts_val rv = ts_constant(g, "R", dt, 1, &n, dt == TS_F32 ? (const void *)rf : (const void *)r);
    ts_val loss = ts_sum(g, ts_mul(g, y, rv), 0, NULL, 0);
    ts_train_spec spec = ts_train_spec_default(loss);
    spec.opt.kind = TS_OPT_NONE;
    ts_plan *p = NULL;
    int ok = ts_compile(g, &spec, NULL, &p) == TS_OK && ts_plan_step(p) == TS_OK &&
             ts_plan_read(p, "grad:x", dt == TS_F32 ? (void *)gf : (void *)dx,
                          (size_t)GN * ts_dtype_size(dt)) == TS_OK;
    CHECK(ok, "gradient run: %s", ts_last_error());
    if (ok && dt == TS_F32)
        for (int i = 0; i < GN; i++) dx[i] = gf[i];
    ts_plan_free(p);
    ts_graph_free(g);
    return ok;
}

static void test_ste(void) {
    double x[GN];
    for (int i = 0; i < GN; i++) x[i] = -3.0 + 6.0 * (i + 0.5) / GN; /* saturates outside +-1.792 */
    x[7] = NAN;                                                      /* NaN gets no gradient */
    /* the surrogate's analytic gradient is right (finite differences) */
    gc_input in = GC_F(GN);
    in.lo = -3, in.hi = 3;
    gc_check("clamp surrogate of the STE", 1, &in, build_clamp, NULL);
    double gs[GN], gf[GN], g32[GN];
    x[7] = 0.5;
    if (!grad_of(build_clamp, TS_F64, x, gs)) return;
    x[7] = NAN;
    if (!grad_of(build_fake, TS_F64, x, gf) || !grad_of(build_fake, TS_F32, x, g32)) return;
    int passed = 0, blocked = 0;
    for (int i = 0; i < GN; i++) {
        double want = i == 7 ? 0.0 : gs[i];
        CHECK(gf[i] == want, "STE f64 grad[%d] (x=%g) = %g, surrogate %g", i, x[i], gf[i], want);
        CHECK_NEAR(g32[i], want, 1e-6);
        passed += want != 0;
        blocked += want == 0;
    }
    /* both regimes are exercised */
    CHECK(passed >= 20 && blocked >= 10, "passed %d, blocked %d", passed, blocked);
}

/* per-channel STE: column c of [4, 3] saturates beyond 448 * s[c] */
static void test_ste_per_channel(void) {
    ts_graph *g = ts_graph_new();
    int64_t d[2] = {4, 3}, c = 3;
    double x[12], s[3] = {0.001, 0.01, 0.1}, r[12], dx[12];
    for (int i = 0; i < 12; i++) x[i] = (i % 2 ? -1.0 : 1.0) * (0.2 * (i / 3) + 0.1) * (i % 3 + 1);
    for (int i = 0; i < 12; i++) r[i] = 1.0 + i;
    ts_val xv = ts_param(g, "x", TS_F64, 2, d, ts_init_buffer(x));
    ts_val sv = ts_constant(g, "s", TS_F64, 1, &c, s);
    ts_val y = ts_fake_quant(g, xv, sv, TS_F8E4M3, -1);
    ts_val loss = ts_sum(g, ts_mul(g, y, ts_constant(g, "R", TS_F64, 2, d, r)), 0, NULL, 0);
    ts_train_spec spec = ts_train_spec_default(loss);
    spec.opt.kind = TS_OPT_NONE;
    ts_plan *p = NULL;
    CHECK_OK(ts_compile(g, &spec, NULL, &p));
    CHECK_OK(ts_plan_step(p));
    CHECK_OK(ts_plan_read(p, "grad:x", dx, sizeof dx));
    int zeros = 0;
    for (int i = 0; i < 12; i++) {
        double want = fabs(x[i] / s[i % 3]) <= 448.0 ? r[i] : 0.0;
        CHECK(dx[i] == want, "per-channel STE grad[%d] = %g, want %g", i, dx[i], want);
        zeros += want == 0;
    }
    CHECK(zeros > 0 && zeros < 12, "per-channel STE: %d saturated of 12", zeros);
    ts_plan_free(p);
    ts_graph_free(g);
}

/* ---- errors -------------------------------------------------------------- */

static void expect_build_error(const char *what, ts_val (*f)(ts_graph *), const char *want) {
    ts_graph *g = ts_graph_new();
    ts_val v = f(g);
    CHECK(!ts_val_ok(v) && strstr(ts_graph_error(g), want),
          "%s: expected an error mentioning '%s', got '%s'", what, want, ts_graph_error(g));
    ts_graph_free(g);
}
static const int64_t E_D[2] = {2, 3};
static ts_val e_fmt(ts_graph *g) {
    ts_val x = ts_input(g, "x", TS_F32, 2, E_D);
    return ts_quantize(g, x, ts_scalar(g, 1.0, TS_F32), TS_F16, 0);
}
static ts_val e_shape(ts_graph *g) {
    int64_t c = 2;
    ts_val x = ts_input(g, "x", TS_F32, 2, E_D);
    return ts_quantize(g, x, ts_input(g, "s", TS_F32, 1, &c), TS_F8E4M3, 1);
}
static ts_val e_dtype(ts_graph *g) {
    ts_val x = ts_input(g, "x", TS_F32, 2, E_D);
    return ts_fake_quant(g, x, ts_scalar(g, 1.0, TS_F64), TS_F8E5M2, 0);
}
static ts_val e_axis(ts_graph *g) {
    int64_t c = 3;
    ts_val x = ts_input(g, "x", TS_F32, 2, E_D);
    return ts_fake_quant(g, x, ts_input(g, "s", TS_F32, 1, &c), TS_F8E5M2, 2);
}
static ts_val e_codes(ts_graph *g) {
    ts_val x = ts_input(g, "x", TS_F32, 2, E_D);
    return ts_dequantize(g, x, ts_scalar(g, 1.0, TS_F32), 0);
}

static void test_errors(void) {
    expect_build_error("quantize to f16", e_fmt, "not f8e4m3 or f8e5m2");
    expect_build_error("scale of the wrong length", e_shape, "must be [3]");
    expect_build_error("scale dtype", e_dtype, "scale must be f32");
    expect_build_error("axis", e_axis, "out of range");
    expect_build_error("dequantize floats", e_codes, "codes must be");
    /* a zero scale is caught when the step runs */
    ts_graph *g = ts_graph_new();
    ts_val x = ts_input(g, "x", TS_F32, 2, E_D);
    ts_val s = ts_input(g, "scale", TS_F32, 0, NULL);
    ts_val y = ts_quantize(g, x, s, TS_F8E4M3, 0);
    ts_plan *p = NULL;
    CHECK_OK(ts_mark_output(g, y, "codes"));
    CHECK_OK(ts_compile(g, NULL, NULL, &p));
    float xv[6] = {1, 2, 3, 4, 5, 6}, zero = 0.0f;
    CHECK_OK(ts_plan_set_input(p, "x", xv, sizeof xv));
    CHECK_OK(ts_plan_set_input(p, "scale", &zero, 4));
    ts_status st = ts_plan_step(p);
    CHECK(st == TS_ERR_INVALID && strstr(ts_last_error(), "scale[0] = 0"), "zero scale: %s: %s",
          ts_status_name(st), ts_last_error());
    ts_plan_free(p);
    ts_graph_free(g);
    /* quantize has no gradient: training graphs use fake_quant */
    g = ts_graph_new();
    ts_val w = ts_param(g, "w", TS_F32, 2, E_D, ts_init_ones());
    ts_val sc = ts_scalar(g, 0.1, TS_F32);
    ts_val l = ts_sum(g, ts_dequantize(g, ts_quantize(g, w, sc, TS_F8E4M3, 0), sc, 0), 0, NULL, 0);
    ts_train_spec spec = ts_train_spec_default(l);
    st = ts_compile(g, &spec, NULL, &p);
    CHECK(st != TS_OK && strstr(ts_last_error(), "quantize"), "quantize in training: %s",
          ts_last_error());
    ts_graph_free(g);
}

/* A linear layer with fake-quantised weights trains (loss falls) and runs
 * the same twice (determinism). */
static double train_fq(int steps, float *w_out) {
    ts_graph *g = ts_graph_new();
    int64_t xd[2] = {8, 4}, wd[2] = {2, 4}, yd[2] = {8, 2};
    ts_val x = ts_input(g, "x", TS_F32, 2, xd), t = ts_input(g, "t", TS_F32, 2, yd);
    ts_val w = ts_param(g, "w", TS_F32, 2, wd, ts_init_uniform(-0.5, 0.5));
    ts_val wq = ts_fake_quant(g, w, ts_scalar(g, 1.0 / 256, TS_F32), TS_F8E4M3, 0);
    ts_val loss = ts_mse_loss(g, ts_linear(g, x, wq, TS_NONE), t);
    ts_train_spec spec = ts_train_spec_default(loss);
    spec.opt = ts_sgd(0.1, 0, 0, 0, 0);
    ts_plan *p = NULL;
    double first = NAN, last = NAN;
    CHECK_OK(ts_compile(g, &spec, NULL, &p));
    float xv[32], tv[16];
    for (int i = 0; i < 32; i++) xv[i] = (float)sin(i * 0.7);
    for (int i = 0; i < 16; i++)
        tv[i] = (float)(0.3 * xv[(i / 2) * 4] - 0.2 * xv[(i / 2) * 4 + 1 + i % 2]);
    for (int s = 0; p && s < steps; s++) {
        ts_plan_set_input(p, "x", xv, sizeof xv);
        ts_plan_set_input(p, "t", tv, sizeof tv);
        CHECK_OK(ts_plan_step(p));
        if (s == 0) first = ts_plan_loss(p);
        last = ts_plan_loss(p);
    }
    if (p) ts_plan_read(p, "w", w_out, 8 * sizeof(float));
    CHECK(last < 0.5 * first, "fake-quant training: loss %g -> %g", first, last);
    ts_plan_free(p);
    ts_graph_free(g);
    return last;
}

int main(void) {
    fill_x();
    test_forward();
    test_dequantize();
    test_large();
    test_ste();
    test_ste_per_channel();
    test_errors();
    float w1[8], w2[8];
    train_fq(40, w1);
    train_fq(40, w2);
    CHECK(memcmp(w1, w2, sizeof w1) == 0, "fake-quant training is not deterministic");
    return check_summary("gradcheck quant");
}
