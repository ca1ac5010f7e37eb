/* The precision pass looks through reshapes: a value read by one GEMM as
 * [B,T,C] and by another as a [B*T,C] view (the output gradient of a
 * linear layer on a 3-d input: dX = dY·W reads dY, dW = dYᵀ·X reads its
 * [B*T,N] reshape) is cast to bf16 once, and the second GEMM reads a
 * reshape of that cast.
 *
 * - structure: no cast reads a reshape, and no two casts convert views of
 *   the same value (before 2026-12-02 W3 in bf16 cast 25 such values twice);
 * - numerics: the oneDNN plan against the reference kernels (both read the
 *   same bf16 views; only the f32 summation order differs) and against f32
 *   within what bf16 rounding of the operands gives;
 * - determinism: 1 and 2 threads give the same loss and gradient bits. */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include "backends/cpu/dnnl_caps.h"
#include "check.h"
#include "plan/plan.h"

enum { B = 4, T = 6, C = 8, H = 12, O = 5, NG = H * C };

/* Follow reshapes back to the value they view. */
static int32_t root(const ts_graph *g, int32_t v) {
    while (g->values[v].kind == TS_VK_NODE && g->values[v].node >= 0 &&
           g->nodes[g->values[v].node].op == TS_OP_RESHAPE && !g->nodes[g->values[v].node].dead)
        v = g->nodes[g->values[v].node].in[0];
    return v;
}

/* x [B,T,C] -> linear(H) -> tanh -> linear(O) -> MSE against y; SGD. */
static ts_plan *build(ts_dtype compute, int reference, int threads, ts_compiled_graph *kept) {
    ts_graph *g = ts_graph_new();
    const int64_t dx[3] = {B, T, C}, dy[3] = {B, T, O}, dw1[2] = {H, C}, dw2[2] = {O, H};
    ts_val x = ts_input(g, "x", TS_F32, 3, dx), y = ts_input(g, "y", TS_F32, 3, dy);
    ts_val w1 = ts_param(g, "w1", TS_F32, 2, dw1, ts_init_normal(0, 0.3));
    ts_val w2 = ts_param(g, "w2", TS_F32, 2, dw2, ts_init_normal(0, 0.3));
    ts_val h = ts_tanh(g, ts_linear(g, x, w1, TS_NONE));
    ts_val loss = ts_mse_loss(g, ts_linear(g, h, w2, TS_NONE), y);
    ts_train_spec spec = ts_train_spec_default(loss);
    spec.opt = ts_sgd(0.1, 0, 0, 0, 0);
    ts_compile_options o = ts_compile_options_default();
    o.seed = 3;
    o.threads = threads;
    o.reference_kernels = reference;
    o.precision.compute = compute;
    ts_plan *p = NULL;
    CHECK_OK(ts_compile_keep(g, &spec, &o, &p, kept));
    ts_graph_free(g);
    return p;
}

static void step(ts_plan *p, double *loss, float *grad) {
    float x[B * T * C], y[B * T * O];
    for (int i = 0; i < B * T * C; i++) x[i] = (float)sin(0.37 * i + 0.1);
    for (int i = 0; i < B * T * O; i++) y[i] = (float)cos(0.23 * i);
    CHECK_OK(ts_plan_set_input(p, "x", x, sizeof x));
    CHECK_OK(ts_plan_set_input(p, "y", y, sizeof y));
    CHECK_OK(ts_plan_step(p));
    *loss = ts_plan_loss(p);
    CHECK_OK(ts_plan_read(p, "grad:w1", grad, sizeof(float) * NG));
}

static double rel_err(const float *a, const float *b) {
    double num = 0, den = 0;
    for (int i = 0; i < NG; i++) {
        num += ((double)a[i] - b[i]) * ((double)a[i] - b[i]);
        den += (double)b[i] * b[i];
    }
    return sqrt(num / (den + 1e-300));
}

static void test_structure(void) {
    ts_compiled_graph kept = {0};
    ts_plan *p = build(TS_BF16, 0, 1, &kept);
    if (p) {
        const ts_graph *g = kept.graph;
        int casts = 0, of_view = 0, twice = 0, views = 0;
        int32_t *seen = calloc((size_t)g->n_values, sizeof *seen);
        for (int i = 0; seen && i < g->n_nodes; i++) {
            const ts_node *n = &g->nodes[i];
            if (n->dead) continue;
            if (n->op == TS_OP_RESHAPE && g->values[n->out[0]].t.dtype == TS_BF16) views++;
            if (n->op != TS_OP_CAST) continue;
            casts++;
            int32_t r = root(g, n->in[0]);
            of_view += r != n->in[0];
            twice += seen[r]++ > 0;
        }
        free(seen);
        CHECK(of_view == 0, "%d casts read a reshape (want 0: the reshape reads the cast)",
              of_view);
        CHECK(twice == 0, "%d values cast twice through views (want 0)", twice);
        /* x, w1, tanh(x·w1ᵀ), w2, dY and the gradient into tanh: 6 values, each cast once */
        CHECK(casts == 6, "%d casts (want 6)", casts);
        /* the weight-gradient GEMMs read [B*T, .] views of the 3-d casts */
        CHECK(views >= 2, "%d bf16 reshapes (want at least 2)", views);
        CHECK_OK(ts_graph_verify(g));
    }
    ts_plan_free(p);
    ts_compiled_graph_free(&kept);
}

static void test_numerics(void) {
    float g32[NG], gbf[NG], gref[NG], g2[NG];
    double l32 = 0, lbf = 0, lref = 0, l2 = 0;
    ts_compiled_graph k[4] = {{0}};
    ts_plan *p32 = build(TS_F32, 0, 1, &k[0]), *pbf = build(TS_BF16, 0, 1, &k[1]);
    ts_plan *pref = build(TS_BF16, 1, 1, &k[2]), *p2 = build(TS_BF16, 0, 2, &k[3]);
    if (p32 && pbf && pref && p2) {
        step(p32, &l32, g32);
        step(pbf, &lbf, gbf);
        step(pref, &lref, gref);
        step(p2, &l2, g2);
        CHECK(fabs(lbf - lref) <= 1e-5 * fabs(lref), "bf16 loss: oneDNN %.9g, reference %.9g", lbf,
              lref);
        CHECK(rel_err(gbf, gref) < 1e-5, "bf16 grad: oneDNN vs reference, rel err %.3g",
              rel_err(gbf, gref));
        /* bf16 keeps 8 bits: operands rounded by at most 2^-9 relative */
        CHECK(fabs(lbf - l32) <= 2e-2 * fabs(l32), "bf16 loss %.9g vs f32 %.9g", lbf, l32);
        CHECK(rel_err(gbf, g32) < 3e-2, "bf16 grad vs f32, rel err %.3g", rel_err(gbf, g32));
        CHECK(lbf == l2 && memcmp(gbf, g2, sizeof gbf) == 0,
              "1 and 2 threads: the same loss and gradient bits");
    }
    ts_plan_free(p32);
    ts_plan_free(pbf);
    ts_plan_free(pref);
    ts_plan_free(p2);
    for (int i = 0; i < 4; i++) ts_compiled_graph_free(&k[i]);
}

int main(void) {
    if (!ts_cpu_supports_dtype_gemm(TS_BF16)) {
        printf("skipped: %s\n", ts_cpu_dtype_gemm_why(TS_BF16));
        return 77;
    }
    test_structure();
    test_numerics();
    return check_summary("precision_views");
}
