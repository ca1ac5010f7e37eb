/* The precision pass shares casts across views and recomputes.
 *
 * Views: a value read by one GEMM as [B,T,C] and by another as a [B*T,C]
 * view (the output gradient of a linear layer on a 3-d input: dX = dY·W
 * reads dY, dW = dYᵀ·X reads its [B*T,N] reshape) is cast to bf16 once,
 * and the second GEMM reads a reshape of that cast.
 *
 * Recomputes: autodiff recomputes a large GELU output for the weight-
 * gradient GEMM instead of keeping it (passes/autodiff.c); in bf16 that
 * GEMM reads the forward GEMM's cast of the original instead, and the
 * recompute, its cast and the views between them are gone.
 *
 * - structure: no cast reads a reshape, no two casts convert views of the
 *   same value, no recomputed node is left in bf16 (there is one in f32);
 * - numerics: the oneDNN plan against the reference kernels (both read the
 *   same bf16 views; only the f32 summation order differs) and against f32
 *   within what bf16 rounding of the operands gives; the plan sharing the
 *   forward cast gives the bits of the plan that never recomputes
 *   (compile option no_recompute);
 * - determinism: 1 and 2 threads give the same loss and gradient bits;
 * - casts folded into their producer: a GELU whose output only its bf16 cast
 *   reads writes bf16 itself (unary.out_low) and the cast is gone; the
 *   kernel gives, for every input class (NaN, infinities, signed zeros,
 *   subnormals, large and small values, 3 chunks), the bits of the f32 GELU
 *   followed by the cast. */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include "backends/cpu/dnnl_caps.h"
#include "check.h"
#include "core/half.h"
#include "ops/op.h"
#include "plan/plan.h"

/* model 0: tanh between the layers, too small to be recomputed; model 1: GELU on
 * [8, 64, 1024] (2 MiB, recomputed by autodiff). NG: the size of w1's gradient. */
enum { NG = 1024 * 32 };
typedef struct model {
    int64_t b, t, c, h, o;
    int gelu;
} model;
static const model k_models[2] = {{4, 6, 8, 12, 5, 0}, {8, 64, 32, 1024, 16, 1}};

/* Follow reshapes back to the value they view. */
static int32_t root(const ts_graph *g, int32_t v) {
    while (g->values[v].kind == TS_VK_NODE && g->values[v].node >= 0 &&
           g->nodes[g->values[v].node].op == TS_OP_RESHAPE && !g->nodes[g->values[v].node].dead)
        v = g->nodes[g->values[v].node].in[0];
    return v;
}

/* x [b,t,c] -> linear(h) -> tanh or GELU -> linear(o) -> MSE against y; SGD. */
static ts_plan *build(const model *m, ts_dtype compute, int reference, int threads,
                      int no_recompute, ts_compiled_graph *kept) {
    ts_graph *g = ts_graph_new();
    const int64_t dx[3] = {m->b, m->t, m->c}, dy[3] = {m->b, m->t, m->o};
    const int64_t dw1[2] = {m->h, m->c}, dw2[2] = {m->o, m->h};
    ts_val x = ts_input(g, "x", TS_F32, 3, dx), y = ts_input(g, "y", TS_F32, 3, dy);
    ts_val w1 = ts_param(g, "w1", TS_F32, 2, dw1, ts_init_normal(0, 0.3));
    ts_val w2 = ts_param(g, "w2", TS_F32, 2, dw2, ts_init_normal(0, 0.3));
    ts_val z = ts_linear(g, x, w1, TS_NONE);
    ts_val h = m->gelu ? ts_gelu(g, z, TS_GELU_TANH) : ts_tanh(g, z);
    ts_val loss = ts_mse_loss(g, ts_linear(g, h, w2, TS_NONE), y);
    ts_train_spec spec = ts_train_spec_default(loss);
    spec.opt = ts_sgd(0.1, 0, 0, 0, 0);
    ts_compile_options o = ts_compile_options_default();
    o.seed = 3;
    o.threads = threads;
    o.reference_kernels = reference;
    o.no_recompute = no_recompute;
    o.precision.compute = compute;
    ts_plan *p = NULL;
    CHECK_OK(ts_compile_keep(g, &spec, &o, &p, kept));
    ts_graph_free(g);
    return p;
}

static void step(const model *m, ts_plan *p, double *loss, float *grad) {
    const int64_t nx = m->b * m->t * m->c, ny = m->b * m->t * m->o;
    float *x = malloc(sizeof(float) * (size_t)nx), *y = malloc(sizeof(float) * (size_t)ny);
    for (int64_t i = 0; i < nx; i++) x[i] = (float)sin(0.37 * (double)i + 0.1);
    for (int64_t i = 0; i < ny; i++) y[i] = (float)cos(0.23 * (double)i);
    CHECK_OK(ts_plan_set_input(p, "x", x, sizeof(float) * (size_t)nx));
    CHECK_OK(ts_plan_set_input(p, "y", y, sizeof(float) * (size_t)ny));
    CHECK_OK(ts_plan_step(p));
    *loss = ts_plan_loss(p);
    memset(grad, 0, sizeof(float) * NG);
    CHECK_OK(ts_plan_read(p, "grad:w1", grad, sizeof(float) * (size_t)(m->h * m->c)));
    free(x);
    free(y);
}

static int count(const ts_graph *g, int op, int recompute) {
    int n = 0;
    for (int i = 0; i < g->n_nodes; i++)
        n += !g->nodes[i].dead && (op < 0 || g->nodes[i].op == op) &&
             (!recompute || g->nodes[i].recompute);
    return n;
}

static double rel_err(const float *a, const float *b) {
    double num = 0, den = 0;
    for (int i = 0; i < NG; i++) { /* unused tails are 0 in both */
        num += ((double)a[i] - b[i]) * ((double)a[i] - b[i]);
        den += (double)b[i] * b[i];
    }
    return sqrt(num / (den + 1e-300));
}

static void test_structure(const model *m) {
    ts_compiled_graph kept = {0}, k32 = {0};
    ts_plan *p = build(m, TS_BF16, 0, 1, 0, &kept), *p32 = build(m, TS_F32, 0, 1, 0, &k32);
    if (p && p32) {
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
        /* x, w1, the activation, w2, dY and the gradient into the activation: 6 values, each
         * cast once; a GELU activation writes bf16 itself (test_gelu_fold), the optimizer the
         * weights' bf16 copies (passes/weight_copies.c) */
        CHECK(casts == 4 - m->gelu, "%d casts (want %d)", casts, 4 - m->gelu);
        /* the weight-gradient GEMMs read [b*t, .] views of the 3-d casts */
        CHECK(views >= 2, "%d bf16 reshapes (want at least 2)", views);
        if (m->gelu) {
            CHECK(count(k32.graph, -1, 1) >= 1, "f32: autodiff recomputes the GELU");
            CHECK(count(g, -1, 1) == 0, "bf16: %d recomputed nodes left (want 0)", count(g, -1, 1));
            CHECK(count(g, TS_OP_GELU, 0) == 1, "bf16: %d GELUs (want 1)", count(g, TS_OP_GELU, 0));
        }
        CHECK_OK(ts_graph_verify(g));
    }
    ts_plan_free(p);
    ts_plan_free(p32);
    ts_compiled_graph_free(&kept);
    ts_compiled_graph_free(&k32);
}

static void test_numerics(const model *m) {
    static float g32[NG], gbf[NG], gref[NG], g2[NG], gnr[NG];
    double l32 = 0, lbf = 0, lref = 0, l2 = 0, lnr = 0;
    ts_compiled_graph k[5] = {{0}};
    ts_plan *p32 = build(m, TS_F32, 0, 1, 0, &k[0]), *pbf = build(m, TS_BF16, 0, 1, 0, &k[1]);
    ts_plan *pref = build(m, TS_BF16, 1, 1, 0, &k[2]), *p2 = build(m, TS_BF16, 0, 2, 0, &k[3]);
    ts_plan *pnr = build(m, TS_BF16, 0, 1, 1, &k[4]);
    if (p32 && pbf && pref && p2 && pnr) {
        step(m, p32, &l32, g32);
        step(m, pbf, &lbf, gbf);
        step(m, pref, &lref, gref);
        step(m, p2, &l2, g2);
        step(m, pnr, &lnr, gnr);
        CHECK(fabs(lbf - lref) <= 1e-5 * fabs(lref), "bf16 loss: oneDNN %.9g, reference %.9g", lbf,
              lref);
        CHECK(rel_err(gbf, gref) < 1e-5, "bf16 grad: oneDNN vs reference, rel err %.3g",
              rel_err(gbf, gref));
        /* bf16 keeps 8 bits: operands rounded by at most 2^-9 relative */
        CHECK(fabs(lbf - l32) <= 2e-2 * fabs(l32), "bf16 loss %.9g vs f32 %.9g", lbf, l32);
        CHECK(rel_err(gbf, g32) < 3e-2, "bf16 grad vs f32, rel err %.3g", rel_err(gbf, g32));
        CHECK(lbf == l2 && memcmp(gbf, g2, sizeof gbf) == 0,
              "1 and 2 threads: the same loss and gradient bits");
        CHECK(lbf == lnr && memcmp(gbf, gnr, sizeof gbf) == 0,
              "the shared forward cast gives the bits of a plan without recompute");
    }
    ts_plan_free(p32);
    ts_plan_free(pbf);
    ts_plan_free(pref);
    ts_plan_free(p2);
    ts_plan_free(pnr);
    for (int i = 0; i < 5; i++) ts_compiled_graph_free(&k[i]);
}

/* The folded GELU (unary.out_low) against the f32 kernel and the cast, bit for bit. */
static void test_gelu_kernel(void) {
    enum { N = 3 * 4096 + 77 };
    static float x[N], y[N];
    static uint16_t low[N];
    const float special[] = {NAN,    -NAN,    INFINITY, -INFINITY, 0.0f,    -0.0f,
                             1e-40f, -1e-40f, 1e30f,    -1e30f,    3.0e38f, 1e-20f};
    for (int i = 0; i < N; i++)
        x[i] = i < 12 ? special[i] : (float)(sin(0.7 * i) * pow(10.0, (i % 9) - 4));
    const ts_op_def *d = ts_op_get(TS_OP_GELU);
    for (int approx = 0; approx < 2; approx++) {
        ts_attrs a = ts_attrs_zero();
        a.unary.approx = approx;
        ts_step_ctx ctx = {1, 0, 0.0, 1};
        ts_tensor in = {TS_F32, 1, {N}, x}, o32 = {TS_F32, 1, {N}, y}, o16 = {TS_BF16, 1, {N}, low};
        ts_kargs k32 = {&a, 1, 1, &in, &o32, NULL, 0, &ctx, "gelu", NULL};
        CHECK_OK(d->kernel(&k32));
        a.unary.out_low = 1;
        ts_kargs k16 = {&a, 1, 1, &in, &o16, NULL, 0, &ctx, "gelu", NULL};
        CHECK_OK(d->kernel(&k16));
        int bad = 0;
        for (int i = 0; i < N; i++) bad += low[i] != ts_f32_to_bf16(y[i]);
        CHECK(bad == 0, "gelu approx %d out_low: %d of %d values differ from f32 gelu + cast",
              approx, bad, N);
    }
}

/* The GELU of model 1 writes bf16 and no cast reads a GELU. */
static void test_gelu_fold(void) {
    ts_compiled_graph kept = {0};
    ts_plan *p = build(&k_models[1], TS_BF16, 0, 1, 0, &kept);
    if (p) {
        const ts_graph *g = kept.graph;
        int gelus = 0, low = 0, cast_of_gelu = 0;
        for (int i = 0; i < g->n_nodes; i++) {
            const ts_node *n = &g->nodes[i];
            if (n->dead) continue;
            if (n->op == TS_OP_GELU) gelus++, low += n->a.unary.out_low == 1;
            if (n->op == TS_OP_CAST) {
                const ts_value *v = &g->values[n->in[0]];
                cast_of_gelu +=
                    v->kind == TS_VK_NODE && v->node >= 0 && g->nodes[v->node].op == TS_OP_GELU;
            }
        }
        CHECK(gelus == 1 && low == 1 && cast_of_gelu == 0,
              "bf16 GELU: %d gelus, %d writing bf16, %d casts of a gelu (1, 1, 0 expected)", gelus,
              low, cast_of_gelu);
    }
    ts_plan_free(p);
    ts_compiled_graph_free(&kept);
}

int main(void) {
    test_gelu_kernel();
    if (!ts_cpu_supports_dtype_gemm(TS_BF16)) {
        printf("skipped: %s\n", ts_cpu_dtype_gemm_why(TS_BF16));
        return 77;
    }
    for (int i = 0; i < 2; i++) {
        test_structure(&k_models[i]);
        test_numerics(&k_models[i]);
    }
    test_gelu_fold();
    return check_summary("precision_views");
}
