/* Gradient checks and reference values for the losses: bce_with_logits,
 * mse_loss and cross_entropy. */
#include <string.h>
#include "gradcheck.h"

static ts_val build_bce(ts_graph *g, const ts_val *in, void *u) {
    (void)u;
    return ts_bce_with_logits(g, in[0], in[1]);
}
static ts_val build_mse(ts_graph *g, const ts_val *in, void *u) {
    (void)u;
    return ts_mse_loss(g, in[0], in[1]);
}
static ts_val build_ce(ts_graph *g, const ts_val *in, void *u) {
    return ts_cross_entropy(g, in[0], in[1], *(const int64_t *)u);
}
/* The loss scaled by a differentiable scalar: dl != 1 reaches the backward ops. */
static ts_val build_ce_scaled(ts_graph *g, const ts_val *in, void *u) {
    return ts_mul(g, ts_cross_entropy(g, in[0], in[1], *(const int64_t *)u), in[2]);
}
static ts_val build_bce_scaled(ts_graph *g, const ts_val *in, void *u) {
    (void)u;
    return ts_mul(g, ts_bce_with_logits(g, in[0], in[1]), in[2]);
}

/* A fixed (non-differentiable) integer input. */
static gc_input idx_input(ts_dtype dt, int rank, const int64_t *dims, const void *data) {
    gc_input in = {dt, rank, {0}, 0, 0, 0, data};
    for (int i = 0; i < rank; i++) in.dims[i] = dims[i];
    return in;
}

static void gradchecks(void) {
    /* BCE: logits and target both differentiable (torch differentiates both). */
    gc_input b1[2] = {GC_F(3, 4), GC_F(3, 4)};
    b1[0].lo = -4, b1[0].hi = 4, b1[1].lo = 0, b1[1].hi = 1;
    gc_check("bce_with_logits [3,4]", 2, b1, build_bce, NULL);
    gc_input b0[2] = {GC_SCALAR, GC_SCALAR};
    gc_check("bce_with_logits rank 0", 2, b0, build_bce, NULL);
    gc_input b2[3] = {GC_F(2, 1, 3), GC_F(2, 1, 3), GC_SCALAR};
    b2[2].lo = 0.5, b2[2].hi = 2;
    gc_check("bce_with_logits * scalar", 3, b2, build_bce_scaled, NULL);
    /* A long input: several TS_RED_BLOCK blocks. */
    gc_input bl[2] = {GC_F(3, 3000), GC_F(3, 3000)};
    gc_options few = {.max_elems = 30};
    gc_check_opt("bce_with_logits [3,3000]", 2, bl, build_bce, NULL, &few);

    gc_input m1[2] = {GC_F(3, 4), GC_F(3, 4)};
    gc_check("mse_loss [3,4]", 2, m1, build_mse, NULL);
    gc_input m0[2] = {GC_SCALAR, GC_SCALAR};
    gc_check("mse_loss rank 0", 2, m0, build_mse, NULL);

    /* Cross-entropy: f64 logits, fixed targets. */
    static const int64_t t4[4] = {1, 0, 4, 2};
    static const int32_t t4_32[4] = {3, 3, 0, 1};
    static const int64_t t_ign[4] = {1, -100, 4, -100};
    static const int64_t t_ign2[4] = {2, 2, 0, 3};
    static const int64_t t23[6] = {0, 3, 1, 2, 3, -1};
    static const int64_t t0[1] = {2};
    static const int64_t t_one[3] = {0, 0, 0};
    static const int64_t t_long[300] = {0}; /* class 0 everywhere: block sums over 5 blocks */
    int64_t ign = -100, ign2 = 2, ign_m1 = -1;
    gc_input c1[2] = {GC_F(4, 5), idx_input(TS_I64, 1, (int64_t[]){4}, t4)};
    c1[0].lo = -3, c1[0].hi = 3;
    gc_check("cross_entropy [4,5] i64", 2, c1, build_ce, &ign);
    gc_input c2[2] = {GC_F(4, 5), idx_input(TS_I32, 1, (int64_t[]){4}, t4_32)};
    gc_check("cross_entropy [4,5] i32", 2, c2, build_ce, &ign);
    gc_input c3[2] = {GC_F(4, 5), idx_input(TS_I64, 1, (int64_t[]){4}, t_ign)};
    gc_check("cross_entropy ignore_index -100", 2, c3, build_ce, &ign);
    gc_input c4[2] = {GC_F(4, 5), idx_input(TS_I64, 1, (int64_t[]){4}, t_ign2)};
    gc_check("cross_entropy ignore_index 2 (a real class)", 2, c4, build_ce, &ign2);
    gc_input c5[2] = {GC_F(2, 3, 4), idx_input(TS_I64, 2, (int64_t[]){2, 3}, t23)};
    gc_check("cross_entropy [2,3,4] with [2,3] targets, ignore -1", 2, c5, build_ce, &ign_m1);
    gc_input c6[2] = {GC_F(5), idx_input(TS_I64, 0, NULL, t0)};
    gc_check("cross_entropy unbatched [5] with a rank-0 target", 2, c6, build_ce, &ign);
    gc_input c7[2] = {GC_F(3, 1), idx_input(TS_I64, 1, (int64_t[]){3}, t_one)};
    gc_check("cross_entropy one class [3,1]", 2, c7, build_ce, &ign);
    gc_input c8[3] = {GC_F(4, 5), idx_input(TS_I64, 1, (int64_t[]){4}, t_ign), GC_SCALAR};
    c8[2].lo = 0.5, c8[2].hi = 2;
    gc_check("cross_entropy * scalar", 3, c8, build_ce_scaled, &ign);
    gc_input c9[2] = {GC_F(300, 2), idx_input(TS_I64, 1, (int64_t[]){300}, t_long)};
    gc_check("cross_entropy [300,2]", 2, c9, build_ce, &ign);
}

/* Run g as an inference plan and read f64 `out` (n elements). */
static ts_status forward(ts_graph *g, ts_val out, double *dst, size_t n, int threads) {
    ts_plan *p = NULL;
    ts_compile_options o = ts_compile_options_default();
    o.threads = threads;
    CHECK_OK(ts_mark_output(g, out, "out"));
    CHECK_OK(ts_compile(g, NULL, &o, &p));
    if (!p) return TS_ERR_INTERNAL;
    ts_status s = ts_plan_step(p);
    if (s == TS_OK) CHECK_OK(ts_plan_read(p, "out", dst, n * sizeof(double)));
    ts_plan_free(p);
    return s;
}

static const double logits34[12] = {1.0,  -2.0, 0.5,   3.0,  0.0, 0.25,
                                    -1.5, 2.0,  -0.75, 1.25, 0.0, -3.0};

static void reference_values(void) {
    /* From PyTorch 1.13 in f64 with the logits above ([3,4]):
     *   F.cross_entropy(lg, [3, -100, 1], ignore_index=-100) = 0.28209377886619952
     *   F.cross_entropy(lg, [0, 2, 1])                       = 2.1187798608756161 */
    const struct {
        int64_t t[3];
        double want;
    } ce[] = {{{3, -100, 1}, 0.28209377886619952}, {{0, 2, 1}, 2.1187798608756161}};
    for (int k = 0; k < 2; k++) {
        ts_graph *g = ts_graph_new();
        ts_val l = ts_constant(g, "lg", TS_F64, 2, (int64_t[]){3, 4}, logits34);
        ts_val t = ts_constant(g, "t", TS_I64, 1, (int64_t[]){3}, ce[k].t);
        double got = 0;
        CHECK_OK(forward(g, ts_cross_entropy(g, l, t, -100), &got, 1, 0));
        CHECK_NEAR(got, ce[k].want, 1e-14);
        ts_graph_free(g);

        /* f32 logits (own vectorised exp): within float rounding. */
        float lf[12], gotf = 0;
        for (int i = 0; i < 12; i++) lf[i] = (float)logits34[i];
        g = ts_graph_new();
        l = ts_constant(g, "lg", TS_F32, 2, (int64_t[]){3, 4}, lf);
        t = ts_constant(g, "t", TS_I64, 1, (int64_t[]){3}, ce[k].t);
        ts_plan *p = NULL;
        CHECK_OK(ts_mark_output(g, ts_cross_entropy(g, l, t, -100), "out"));
        CHECK_OK(ts_compile(g, NULL, NULL, &p));
        if (p) {
            CHECK_OK(ts_plan_step(p));
            CHECK_OK(ts_plan_read(p, "out", &gotf, sizeof gotf));
            ts_plan_free(p);
        }
        CHECK_NEAR(gotf, ce[k].want, 5e-7 * ce[k].want);
        ts_graph_free(g);
    }

    /* F.binary_cross_entropy_with_logits(bx, by) = 11.997068977216889 and
     * F.mse_loss(bx, by) = 430.55208333333331; large |x| stays finite. */
    static const double bx[6] = {2.0, -1.0, 0.0, 30.0, -40.0, 0.5};
    static const double by[6] = {1.0, 0.0, 0.5, 0.0, 1.0, 0.25};
    for (int k = 0; k < 2; k++) {
        ts_graph *g = ts_graph_new();
        ts_val x = ts_constant(g, "bx", TS_F64, 2, (int64_t[]){2, 3}, bx);
        ts_val y = ts_constant(g, "by", TS_F64, 2, (int64_t[]){2, 3}, by);
        double got = 0;
        CHECK_OK(forward(g, k ? ts_mse_loss(g, x, y) : ts_bce_with_logits(g, x, y), &got, 1, 0));
        CHECK_NEAR(got, k ? 430.55208333333331 : 11.997068977216889, 1e-12);
        ts_graph_free(g);
    }

    /* Gradients from torch (loss.backward()):
     *   bce: [-0.019867153670352949, 0.04482357022833252, 0, 0.16666666666665109,
     *         -0.16666666666666666, 0.062076555200309101]
     *   cross_entropy with targets [3, -100, 1]: the rows below (row 1 zero). */
    static const double bce_grad[6] = {
        -0.019867153670352949, 0.04482357022833252,  0,
        0.16666666666665109,   -0.16666666666666666, 0.062076555200309101};
    static const double ce_grad[12] = {0.055276875180869614,
                                       0.0027520735637918355,
                                       0.033527119570305741,
                                       -0.091556068314967154,
                                       0,
                                       0,
                                       0,
                                       0,
                                       0.047118890291163729,
                                       -0.15183587631923245,
                                       0.099750691529164409,
                                       0.0049662944989042153};
    for (int k = 0; k < 2; k++) {
        ts_graph *g = ts_graph_new();
        ts_val loss;
        int n = k ? 12 : 6;
        if (k) {
            static const int64_t t[3] = {3, -100, 1};
            ts_val l = ts_param(g, "p", TS_F64, 2, (int64_t[]){3, 4}, ts_init_buffer(logits34));
            loss = ts_cross_entropy(g, l, ts_constant(g, "t", TS_I64, 1, (int64_t[]){3}, t), -100);
        } else {
            ts_val x = ts_param(g, "p", TS_F64, 2, (int64_t[]){2, 3}, ts_init_buffer(bx));
            loss = ts_bce_with_logits(g, x, ts_constant(g, "by", TS_F64, 2, (int64_t[]){2, 3}, by));
        }
        ts_train_spec spec = ts_train_spec_default(loss);
        spec.opt.kind = TS_OPT_NONE;
        ts_plan *p = NULL;
        double got[12] = {0};
        CHECK_OK(ts_compile(g, &spec, NULL, &p));
        if (p) {
            CHECK_OK(ts_plan_step(p));
            CHECK_OK(ts_plan_read(p, "grad:p", got, (size_t)n * sizeof(double)));
            ts_plan_free(p);
        }
        const double *want = k ? ce_grad : bce_grad;
        for (int i = 0; i < n; i++) CHECK_NEAR(got[i], want[i], 1e-14);
        ts_graph_free(g);
    }
}

/* ---- weighted cross-entropy -------------------------------------------- */

static const double ce_w[4] = {0.5, 2.0, 1.0, 3.0};

static ts_val build_wce(ts_graph *g, const ts_val *in, void *u) {
    /* The weights in the logits' dtype (the check runs f64 and f32). */
    static const float ce_wf[4] = {0.5f, 2.0f, 1.0f, 3.0f};
    ts_dtype dt = ts_dtype_of(g, in[0]);
    ts_val w =
        ts_constant(g, "w", dt, 1, (int64_t[]){4}, dt == TS_F64 ? (const void *)ce_w : ce_wf);
    return ts_cross_entropy_weighted(g, in[0], in[1], w, *(const int64_t *)u);
}
static ts_val build_wce_scaled(ts_graph *g, const ts_val *in, void *u) {
    return ts_mul(g, build_wce(g, in, u), in[2]);
}

/* torch 1.13, f64: F.cross_entropy(logits34, t, weight=[0.5, 2, 1, 3],
 * ignore_index=-100) and logits.grad after backward(). */
static void weighted(void) {
    static const struct {
        int64_t t[3];
        double loss, grad[12];
    } ref[] = {
        {{3, -100, 1},
         0.26612571262883,
         {0.06633225021704355, 0.003302488276550203, 0.040232543484366896, -0.1098672819779606, 0,
          0, 0, 0, 0.03769511223293098, -0.12146870105538597, 0.07980055322333153,
          0.003973035599123372}},
        {{0, 2, 1},
         1.6048991339543484,
         {-0.12706374994832295, 0.000786306732511953, 0.009579177020087355, 0.11669826619572367,
          0.028871076637732362, 0.037071196209988014, -0.2792722777604509, 0.21333000491273052,
          0.053850160332758544, -0.1735267157934085, 0.11400079031904503, 0.005675765141604817}},
        {{3, 3, 1},
         0.275885579728437,
         {0.041457656385652214, 0.0020640551728438768, 0.025145339677729306, -0.06866705123622537,
          0.037893288087023726, 0.04865594502560927, 0.008455135439408193, -0.09500436855204118,
          0.023559445145581864, -0.07591793815961623, 0.049875345764582205,
          0.0024831472494521076}}};
    for (int k = 0; k < 3; k++) {
        ts_graph *g = ts_graph_new();
        ts_val l = ts_param(g, "p", TS_F64, 2, (int64_t[]){3, 4}, ts_init_buffer(logits34));
        ts_val t = ts_constant(g, "t", TS_I64, 1, (int64_t[]){3}, ref[k].t);
        ts_val w = ts_constant(g, "w", TS_F64, 1, (int64_t[]){4}, ce_w);
        ts_val loss = ts_cross_entropy_weighted(g, l, t, w, -100);
        CHECK_OK(ts_mark_output(g, loss, "loss"));
        ts_train_spec spec = ts_train_spec_default(loss);
        spec.opt.kind = TS_OPT_NONE;
        ts_plan *p = NULL;
        double got[12] = {0}, gl = 0;
        CHECK_OK(ts_compile(g, &spec, NULL, &p));
        if (p) {
            CHECK_OK(ts_plan_step(p));
            CHECK_OK(ts_plan_read(p, "loss", &gl, sizeof gl));
            CHECK_OK(ts_plan_read(p, "grad:p", got, sizeof got));
            ts_plan_free(p);
        }
        CHECK_NEAR(gl, ref[k].loss, 1e-14);
        for (int i = 0; i < 12; i++) CHECK_NEAR(got[i], ref[k].grad[i], 1e-14);
        ts_graph_free(g);
    }
    /* Gradient checks: plain, ignored rows, dl != 1. */
    static const int64_t t4[4] = {1, 0, 3, 2}, t_ign[4] = {1, -100, 3, -100};
    static const int64_t ign = -100;
    gc_input a[2] = {GC_F(4, 4), idx_input(TS_I64, 1, (int64_t[]){4}, t4)};
    gc_check("cross_entropy_weighted [4,4]", 2, a, build_wce, (void *)&ign);
    a[1] = idx_input(TS_I64, 1, (int64_t[]){4}, t_ign);
    gc_check("cross_entropy_weighted ignored rows", 2, a, build_wce, (void *)&ign);
    gc_input b[3] = {GC_F(4, 4), idx_input(TS_I64, 1, (int64_t[]){4}, t4), GC_SCALAR};
    b[2].lo = 0.5, b[2].hi = 2;
    gc_check("cross_entropy_weighted * scalar", 3, b, build_wce_scaled, (void *)&ign);
    /* A weight of the wrong length is a build error naming the shape. */
    ts_graph *g = ts_graph_new();
    ts_val l = ts_input(g, "l", TS_F64, 2, (int64_t[]){3, 4});
    ts_val t = ts_input(g, "t", TS_I64, 1, (int64_t[]){3});
    ts_val w = ts_constant(g, "w", TS_F64, 1, (int64_t[]){3}, ce_w);
    CHECK(!ts_val_ok(ts_cross_entropy_weighted(g, l, t, w, -100)) &&
              strstr(ts_last_error(), "weight must be f64[4]"),
          "wrong weight length: %s", ts_last_error());
    ts_graph_free(g);
}

/* Every target ignored: torch 1.13 returns NaN (0/0) and a zero gradient. */
static void all_ignored(void) {
    static const int64_t t[3] = {-100, -100, -100};
    ts_graph *g = ts_graph_new();
    ts_val l = ts_param(g, "p", TS_F64, 2, (int64_t[]){3, 4}, ts_init_buffer(logits34));
    ts_val loss = ts_cross_entropy(g, l, ts_constant(g, "t", TS_I64, 1, (int64_t[]){3}, t), -100);
    ts_train_spec spec = ts_train_spec_default(loss);
    spec.opt.kind = TS_OPT_NONE;
    ts_plan *p = NULL;
    double grad[12];
    memset(grad, 0xff, sizeof grad);
    CHECK_OK(ts_compile(g, &spec, NULL, &p));
    if (p) {
        CHECK_OK(ts_plan_step(p));
        CHECK(isnan(ts_plan_loss(p)), "all-ignored loss = %g, expected NaN", ts_plan_loss(p));
        CHECK_OK(ts_plan_read(p, "grad:p", grad, sizeof grad));
        for (int i = 0; i < 12; i++) CHECK(grad[i] == 0, "grad[%d] = %g, expected 0", i, grad[i]);
        ts_plan_free(p);
    }
    ts_graph_free(g);
}

/* A target outside [0, C) is a run-time error naming the value and row. */
static void bad_target(void) {
    ts_graph *g = ts_graph_new();
    ts_val l = ts_constant(g, "lg", TS_F64, 2, (int64_t[]){3, 4}, logits34);
    ts_val t = ts_input(g, "labels", TS_I64, 1, (int64_t[]){3});
    ts_val loss = ts_cross_entropy(g, l, t, -100);
    ts_plan *p = NULL;
    CHECK_OK(ts_mark_output(g, loss, "ce"));
    CHECK_OK(ts_compile(g, NULL, NULL, &p));
    if (p) {
        static const int64_t bad[3] = {0, 4, 1}, neg[3] = {0, 1, -3}, good[3] = {0, -100, 3};
        CHECK_OK(ts_plan_set_input(p, "labels", bad, sizeof bad));
        CHECK(ts_plan_step(p) != TS_OK, "target 4 with 4 classes must fail");
        CHECK(strstr(ts_last_error(), "cross_entropy") && strstr(ts_last_error(), "target[1] = 4"),
              "message: %s", ts_last_error());
        CHECK_OK(ts_plan_set_input(p, "labels", neg, sizeof neg));
        CHECK(ts_plan_step(p) != TS_OK, "target -3 must fail");
        CHECK(strstr(ts_last_error(), "target[2] = -3"), "message: %s", ts_last_error());
        CHECK_OK(ts_plan_set_input(p, "labels", good, sizeof good));
        CHECK_OK(ts_plan_step(p));
        ts_plan_free(p);
    }
    ts_graph_free(g);
}

/* Loss and gradient bits do not depend on the thread count. */
static void determinism(void) {
    enum { N = 3000, C = 37, M = 100000 };
    static double lg[N * C], bx[M], by[M], grad[2][N * C];
    static int64_t tg[N];
    for (int i = 0; i < N * C; i++) lg[i] = sin(i * 0.71) * 5;
    for (int i = 0; i < N; i++) tg[i] = i % 11 == 0 ? -100 : (i * 7) % C;
    for (int i = 0; i < M; i++) bx[i] = sin(i * 0.3) * 6, by[i] = 0.5 + 0.5 * cos(i * 0.1);
    double loss[2] = {0}, bce[2] = {0};
    for (int t = 0; t < 2; t++) {
        ts_graph *g = ts_graph_new();
        ts_val l = ts_param(g, "p", TS_F64, 2, (int64_t[]){N, C}, ts_init_buffer(lg));
        ts_val ce =
            ts_cross_entropy(g, l, ts_constant(g, "t", TS_I64, 1, (int64_t[]){N}, tg), -100);
        ts_train_spec spec = ts_train_spec_default(ce);
        spec.opt.kind = TS_OPT_NONE;
        ts_compile_options o = ts_compile_options_default();
        o.threads = t ? 4 : 1;
        ts_plan *p = NULL;
        CHECK_OK(ts_compile(g, &spec, &o, &p));
        if (p) {
            CHECK_OK(ts_plan_step(p));
            loss[t] = ts_plan_loss(p);
            CHECK_OK(ts_plan_read(p, "grad:p", grad[t], sizeof grad[t]));
            ts_plan_free(p);
        }
        ts_graph_free(g);

        g = ts_graph_new();
        ts_val x = ts_constant(g, "x", TS_F64, 1, (int64_t[]){M}, bx);
        ts_val y = ts_constant(g, "y", TS_F64, 1, (int64_t[]){M}, by);
        CHECK_OK(forward(g, ts_bce_with_logits(g, x, y), &bce[t], 1, t ? 4 : 1));
        ts_graph_free(g);
    }
    CHECK(memcmp(&loss[0], &loss[1], sizeof loss[0]) == 0, "cross_entropy %.17g vs %.17g", loss[0],
          loss[1]);
    CHECK(memcmp(grad[0], grad[1], sizeof grad[0]) == 0, "cross_entropy gradient differs");
    CHECK(memcmp(&bce[0], &bce[1], sizeof bce[0]) == 0, "bce %.17g vs %.17g", bce[0], bce[1]);
}

/* Cross-entropy over rows of a few classes in f32 (the row-blocked path):
 * loss and gradient against f64 (1e-5), with ignored rows and class
 * weights, the same bits at 1 and 2 threads. */
static void few_classes(void) {
    enum { N = 9001 }; /* N * c >= TS_PAR_MIN: both thread counts run in parallel */
    for (int c = 2; c <= 15; c += 13) {
        static float lf[N * 15], gf[2][N * 15];
        static double ld[N * 15], gd[N * 15];
        static int64_t tg[N];
        float wf[15];
        double wd[15];
        for (int i = 0; i < N * c; i++) ld[i] = sin(i * 0.53) * 7, lf[i] = (float)ld[i];
        for (int i = 0; i < N; i++) tg[i] = i % 13 == 0 ? -100 : (i * 5) % c;
        for (int j = 0; j < c; j++) wd[j] = 0.5 + j, wf[j] = (float)wd[j];
        double loss[3] = {0};
        for (int t = 0; t < 3; t++) {
            const ts_dtype dt = t < 2 ? TS_F32 : TS_F64;
            ts_graph *g = ts_graph_new();
            int64_t d[2] = {N, c}, wdim[1] = {c};
            ts_val l = ts_param(g, "p", dt, 2, d, ts_init_buffer(t < 2 ? (void *)lf : (void *)ld));
            ts_val w = ts_constant(g, "w", dt, 1, wdim, t < 2 ? (void *)wf : (void *)wd);
            ts_val ce = ts_cross_entropy_weighted(
                g, l, ts_constant(g, "t", TS_I64, 1, (int64_t[]){N}, tg), w, -100);
            ts_train_spec spec = ts_train_spec_default(ce);
            spec.opt.kind = TS_OPT_NONE;
            ts_compile_options o = ts_compile_options_default();
            o.threads = t == 1 ? 2 : 1;
            ts_plan *p = NULL;
            CHECK_OK(ts_compile(g, &spec, &o, &p));
            if (p) {
                CHECK_OK(ts_plan_step(p));
                loss[t] = ts_plan_loss(p);
                CHECK_OK(ts_plan_read(p, "grad:p", t < 2 ? (void *)gf[t] : (void *)gd,
                                      (size_t)(N * c) * ts_dtype_size(dt)));
                ts_plan_free(p);
            }
            ts_graph_free(g);
        }
        CHECK(loss[0] == loss[1] && !memcmp(gf[0], gf[1], sizeof(float) * (size_t)(N * c)),
              "cross_entropy c=%d: 1 and 2 threads differ", c);
        CHECK(fabs(loss[0] - loss[2]) <= 1e-5 * fabs(loss[2]), "c=%d: loss %.9g, f64 %.9g", c,
              loss[0], loss[2]);
        double mx = 0, worst = 0;
        for (int i = 0; i < N * c; i++) {
            mx = fmax(mx, fabs(gd[i]));
            worst = fmax(worst, fabs(gf[0][i] - gd[i]));
        }
        CHECK(worst <= 1e-5 * mx, "c=%d: gradient off f64 by %.3g (max %.3g)", c, worst, mx);
        for (int j = 0; j < c; j++)
            CHECK(gf[0][j] == 0, "an ignored row's gradient is 0, got %g", gf[0][j]);
    }
}

static void errors(void) {
    ts_graph *g = ts_graph_new();
    ts_val a = ts_input(g, "a", TS_F32, 2, (int64_t[]){2, 3});
    ts_val b = ts_input(g, "b", TS_F32, 2, (int64_t[]){3, 2});
    CHECK(!ts_val_ok(ts_bce_with_logits(g, a, b)), "bce with mismatched shapes must fail");
    CHECK(strstr(ts_graph_error(g), "bce_logits(") && strstr(ts_graph_error(g), "f32[3,2]"),
          "message: %s", ts_graph_error(g));
    ts_graph_free(g);

    g = ts_graph_new();
    a = ts_input(g, "a", TS_F32, 2, (int64_t[]){2, 3});
    b = ts_input(g, "b", TS_F32, 1, (int64_t[]){3});
    CHECK(!ts_val_ok(ts_mse_loss(g, a, b)), "mse with mismatched shapes must fail");
    CHECK(strstr(ts_graph_error(g), "mse_loss(") && strstr(ts_graph_error(g), "f32[3]"),
          "message: %s", ts_graph_error(g));
    ts_graph_free(g);

    const struct {
        const char *what, *needle;
        ts_dtype tdt;
        int trank;
        int64_t tdims[2];
    } ce[] = {
        {"target with the wrong length", "i64[5]", TS_I64, 1, {5}},
        {"float target", "f32", TS_F32, 1, {4}},
        {"target of the logits' rank", "i64[4,3]", TS_I64, 2, {4, 3}},
    };
    for (size_t i = 0; i < sizeof ce / sizeof ce[0]; i++) {
        g = ts_graph_new();
        ts_val l = ts_input(g, "logits", TS_F32, 2, (int64_t[]){4, 3});
        ts_val t = ts_input(g, "t", ce[i].tdt, ce[i].trank, ce[i].tdims);
        CHECK(!ts_val_ok(ts_cross_entropy(g, l, t, -100)), "%s must fail", ce[i].what);
        CHECK(strstr(ts_graph_error(g), "cross_entropy(") &&
                  strstr(ts_graph_error(g), ce[i].needle),
              "%s: message %s", ce[i].what, ts_graph_error(g));
        ts_graph_free(g);
    }
}

int main(void) {
    weighted();
    gradchecks();
    reference_values();
    all_ignored();
    bad_target();
    determinism();
    few_classes();
    errors();
    return check_summary("gradcheck_loss");
}
