/* Gradient checks and reference values for layer_norm. */
#include <string.h>
#include "gradcheck.h"

/* in[0] x, then weight and/or bias as flagged. */
typedef struct ln_arg {
    int has_w, has_b;
    double eps;
} ln_arg;

static ts_val build_ln(ts_graph *g, const ts_val *in, void *u) {
    const ln_arg *a = u;
    ts_val w = a->has_w ? in[1] : TS_NONE;
    ts_val b = a->has_b ? in[1 + a->has_w] : TS_NONE;
    return ts_layer_norm(g, in[0], w, b, a->eps);
}

/* layer_norm applied twice with the same weight: dw accumulates from two
 * backward ops. */
static ts_val build_twice(ts_graph *g, const ts_val *in, void *u) {
    (void)u;
    ts_val y = ts_layer_norm(g, in[0], in[1], in[2], 1e-5);
    return ts_layer_norm(g, ts_mul(g, y, y), in[1], TS_NONE, 1e-5);
}

static void gradchecks(void) {
    const struct {
        const char *label;
        gc_input x;
    } shapes[] = {
        {"[4,8]", GC_F(4, 8)},
        {"rank 1 [5]", GC_F(5)},
        {"rank 3 [2,3,6]", GC_F(2, 3, 6)},
        {"lanes + tail [3,40]", GC_F(3, 40)},
        {"several row blocks [300,3]", GC_F(300, 3)},
        {"several column chunks [2,300]", GC_F(2, 300)},
        {"size-1 rows [1,1,7]", GC_F(1, 1, 7)},
    };
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
        for (int f = 0; f < 4; f++) {
            ln_arg a = {f & 1, f >> 1 & 1, 1e-5};
            int64_t d = shapes[s].x.dims[shapes[s].x.rank - 1];
            gc_input in[3] = {shapes[s].x, GC_F(d), GC_F(d)};
            in[0].lo = -2, in[0].hi = 2;
            char label[128];
            snprintf(label, sizeof label, "layer_norm %s%s%s", shapes[s].label,
                     a.has_w ? " +weight" : "", a.has_b ? " +bias" : "");
            gc_check(label, 1 + a.has_w + a.has_b, in, build_ln, &a);
        }
    }
    /* D = 1: x - mean is 0, y = b and dx = 0 whatever x is; a large eps
     * keeps the finite differences well-conditioned. */
    ln_arg a = {1, 1, 0.5};
    gc_input one[3] = {GC_F(3, 1), GC_F(1), GC_F(1)};
    gc_check("layer_norm D=1 +weight +bias", 3, one, build_ln, &a);
    gc_input tw[3] = {GC_F(3, 5), GC_F(5), GC_F(5)};
    gc_check("layer_norm twice, shared weight", 3, tw, build_twice, NULL);
}

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

static void reference_values(void) {
    /* From PyTorch 1.13:
     *   F.layer_norm(x, (5,), w, b, 1e-5) and F.layer_norm(x, (5,), None, None, 1e-3)
     * in f64, and the first again with x, w, b in f32 (compared at 2e-6). */
    static const double x[10] = {1.0, -2.0, 0.5, 3.0, 0.25, 10.0, 10.5, 9.0, 11.0, 10.25};
    static const double w[5] = {0.5, -1.0, 2.0, 1.5, 0.75}, b[5] = {0.1, 0.2, -0.3, 0.0, 1.0};
    static const double want_wb[10] = {
        0.24062472534260154, 1.7937468872161508,    -0.36249987793004518, 2.2968705139291585,
        0.85937527465739838, -0.013065469389082679, -0.32763885714904833, -3.7673410612651854,
        1.922112979614393,   1.1130654693890811};
    static const double want_plain[10] = {
        0.28119508444739222,  -1.5934388118685558,  -0.031243898271932469, 1.530951015324691,
        -0.18746338963159481, -0.22587697572631349, 0.52704627669472925,   -1.731723480568399,
        1.279969529115772,    0.15058465048420788};
    static const float want_f32[10] = {
        0.24062472581863403f, 1.7937469482421875f,    -0.3624998927116394f,  2.2968707084655762f,
        0.8593752384185791f,  -0.013065002858638763f, -0.32763975858688354f, -3.7673389911651611f,
        1.9221142530441284f,  1.1130661964416504f};
    for (int k = 0; k < 2; k++) {
        ts_graph *g = ts_graph_new();
        ts_val cx = ts_constant(g, "x", TS_F64, 2, (int64_t[]){2, 5}, x);
        ts_val y = k == 0 ? ts_layer_norm(g, cx, ts_constant(g, "w", TS_F64, 1, (int64_t[]){5}, w),
                                          ts_constant(g, "b", TS_F64, 1, (int64_t[]){5}, b), 1e-5)
                          : ts_layer_norm(g, cx, TS_NONE, TS_NONE, 1e-3);
        double got[10] = {0};
        forward(g, y, got, 10, 0);
        const double *want = k == 0 ? want_wb : want_plain;
        for (int i = 0; i < 10; i++) CHECK_NEAR(got[i], want[i], 1e-12 * (1 + fabs(want[i])));
        ts_graph_free(g);
    }
    float xf[10], wf[5], bf[5], got[10] = {0};
    for (int i = 0; i < 10; i++) xf[i] = (float)x[i];
    for (int i = 0; i < 5; i++) wf[i] = (float)w[i], bf[i] = (float)b[i];
    ts_graph *g = ts_graph_new();
    ts_val y = ts_layer_norm(g, ts_constant(g, "x", TS_F32, 2, (int64_t[]){2, 5}, xf),
                             ts_constant(g, "w", TS_F32, 1, (int64_t[]){5}, wf),
                             ts_constant(g, "b", TS_F32, 1, (int64_t[]){5}, bf), 1e-5);
    ts_plan *p = NULL;
    CHECK_OK(ts_mark_output(g, y, "out"));
    CHECK_OK(ts_compile(g, NULL, NULL, &p));
    if (p) {
        CHECK_OK(ts_plan_step(p));
        CHECK_OK(ts_plan_read(p, "out", got, sizeof got));
        ts_plan_free(p);
    }
    for (int i = 0; i < 10; i++) CHECK_NEAR(got[i], want_f32[i], 2e-6 * (1 + fabs(want_f32[i])));
    ts_graph_free(g);
}

/* Gradients of w and b (row-block partials) and x: same bits for 1 and 4 threads. */
static void determinism(void) {
    enum { R = 700, D = 300 };
    static double x[R * D], rr[R * D], gw[2][D], gb[2][D], gx[2][R * D];
    static double w[D], b[D];
    for (int i = 0; i < R * D; i++) x[i] = sin(i * 0.11) * 3 + cos(i * 0.007), rr[i] = cos(i * 0.3);
    for (int i = 0; i < D; i++) w[i] = 1 + 0.01 * i, b[i] = 0.1 * sin(i);
    for (int t = 0; t < 2; t++) {
        ts_graph *g = ts_graph_new();
        int64_t xd[2] = {R, D}, vd[1] = {D};
        ts_val vx = ts_param(g, "x", TS_F64, 2, xd, ts_init_buffer(x));
        ts_val vw = ts_param(g, "w", TS_F64, 1, vd, ts_init_buffer(w));
        ts_val vb = ts_param(g, "b", TS_F64, 1, vd, ts_init_buffer(b));
        ts_val y = ts_layer_norm(g, vx, vw, vb, 1e-5);
        ts_val loss = ts_sum(g, ts_mul(g, y, ts_constant(g, "r", TS_F64, 2, xd, rr)), 0, NULL, 0);
        ts_train_spec spec = ts_train_spec_default(loss);
        spec.opt.kind = TS_OPT_NONE;
        ts_compile_options o = ts_compile_options_default();
        o.threads = t ? 4 : 1;
        ts_plan *p = NULL;
        CHECK_OK(ts_compile(g, &spec, &o, &p));
        if (p) {
            CHECK_OK(ts_plan_step(p));
            CHECK_OK(ts_plan_read(p, "grad:w", gw[t], sizeof gw[t]));
            CHECK_OK(ts_plan_read(p, "grad:b", gb[t], sizeof gb[t]));
            CHECK_OK(ts_plan_read(p, "grad:x", gx[t], sizeof gx[t]));
            ts_plan_free(p);
        }
        ts_graph_free(g);
    }
    CHECK(memcmp(gw[0], gw[1], sizeof gw[0]) == 0, "dw differs between 1 and 4 threads");
    CHECK(memcmp(gb[0], gb[1], sizeof gb[0]) == 0, "db differs between 1 and 4 threads");
    CHECK(memcmp(gx[0], gx[1], sizeof gx[0]) == 0, "dx differs between 1 and 4 threads");
    /* db is the column sum of r: a plain check that the blocks add up. */
    double worst = 0;
    for (int c = 0; c < D; c++) {
        double s = 0;
        for (int r = 0; r < R; r++) s += rr[r * D + c];
        worst = fmax(worst, fabs(s - gb[0][c]));
    }
    CHECK(worst < 1e-9, "db deviates from the column sums by %g", worst);
}

static void errors(void) {
    struct {
        const char *what, *needle;
        ts_dtype xdt, wdt;
        int64_t wlen;
        double eps;
        int rank0;
    } cases[] = {
        {"weight of the wrong length", "f32[3]", TS_F32, TS_F32, 3, 1e-5, 0},
        {"weight of the wrong dtype", "f64", TS_F32, TS_F64, 4, 1e-5, 0},
        {"integer x", "i32", TS_I32, TS_I32, 4, 1e-5, 0},
        {"negative eps", "eps", TS_F32, TS_F32, 4, -1.0, 0},
        {"rank-0 x", "axis", TS_F32, TS_F32, 4, 1e-5, 1},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        ts_graph *g = ts_graph_new();
        ts_val x = ts_input(g, "x", cases[i].xdt, cases[i].rank0 ? 0 : 2, (int64_t[]){2, 4});
        ts_val w = ts_input(g, "w", cases[i].wdt, 1, (int64_t[]){cases[i].wlen});
        CHECK(!ts_val_ok(ts_layer_norm(g, x, w, TS_NONE, cases[i].eps)), "%s must fail",
              cases[i].what);
        const char *e = ts_graph_error(g);
        CHECK(strstr(e, "layer_norm(") && strstr(e, cases[i].needle), "%s: message %s",
              cases[i].what, e);
        ts_graph_free(g);
    }
    /* A bias of the wrong shape ([4] expected, [2,4] given). */
    ts_graph *g = ts_graph_new();
    ts_val x = ts_input(g, "x", TS_F32, 2, (int64_t[]){2, 4});
    ts_val b = ts_input(g, "b", TS_F32, 2, (int64_t[]){2, 4});
    CHECK(!ts_val_ok(ts_layer_norm(g, x, TS_NONE, b, 1e-5)), "a [2,4] bias must fail");
    CHECK(strstr(ts_graph_error(g), "bias") && strstr(ts_graph_error(g), "f32[2,4]"), "message: %s",
          ts_graph_error(g));
    ts_graph_free(g);
}

int main(void) {
    gradchecks();
    reference_values();
    determinism();
    errors();
    return check_summary("gradcheck_norm");
}
