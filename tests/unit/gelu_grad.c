/* The gelu_grad pass (passes/gelu_grad.c): the forward gelu writes gelu'(x)
 * (unary.out_grad) and the GELU backward multiplies by it (side 2).
 *
 * - the pass on hand-built graphs: a gelu of x followed by unary_bwd(d, x)
 *   is rewritten (the gelu has two outputs, the backward reads the second
 *   with side 2); not when another node reads x after the gelu, when the
 *   approximations differ, or when x is a graph output;
 * - bad input: out_grad on an f64 gelu, on a relu, or out_grad 2; a
 *   unary_bwd side 2 of a relu, or side 3, are refused by inference;
 * - the compile: linear -> GELU (tanh and erf) -> linear -> cross entropy,
 *   f32 and (where this CPU has bf16 GEMMs) bf16, trained 3 SGD steps:
 *   the plan has the new form (in bf16 the folded bias-gradient sum reads
 *   the derivative), compile.no_gelu_grad keeps the old one, and the loss,
 *   gradients and weights are bit-identical between the two. */
#include <stdlib.h>
#include <string.h>
#include "backends/cpu/dnnl_caps.h"
#include "check.h"
#include "ops/op.h"
#include "passes/passes.h"
#include "plan/plan.h"

/* ---- the pass on hand-built graphs ---------------------------------- */

/* gelu(x) and unary_bwd(d, x) side 0, with a mul(x, x) read before the gelu (after = 0), after
 * it (1), or none (-1); bwd_approx the backward's approximation; x_output marks x an output.
 * Returns how many backward nodes the pass rewrote, and checks the rewritten form. */
static int rewrite(int after, int64_t bwd_approx, int x_output) {
    ts_graph *g = ts_graph_new();
    const int64_t dims[2] = {3, 5};
    ts_val x0 = ts_input(g, "x0", TS_F32, 2, dims), d = ts_input(g, "d", TS_F32, 2, dims);
    ts_val x = ts_neg(g, x0); /* made by a node, as a pre-activation is */
    if (after == 0) ts_mark_output(g, ts_mul(g, x, x), "m");
    ts_val y = ts_gelu(g, x, TS_GELU_TANH);
    ts_mark_output(g, y, "y");
    if (after == 1) ts_mark_output(g, ts_mul(g, x, x), "m");
    if (x_output) ts_mark_output(g, x, "x");
    ts_attrs a = ts_attrs_zero();
    a.unary_bwd.fwd_op = TS_OP_GELU, a.unary_bwd.fwd.approx = (int32_t)bwd_approx;
    ts_val dx = ts_node_add(g, TS_OP_UNARY_BWD, 2, (ts_val[]){d, x}, &a, NULL);
    ts_mark_output(g, dx, "dx");
    CHECK(ts_val_ok(dx), "build: %s", ts_graph_error(g));
    int n = -1;
    CHECK_OK(ts_pass_gelu_grad(g, &n));
    CHECK_OK(ts_graph_verify(g));
    const ts_node *gl = &g->nodes[g->values[y.id].node], *bw = &g->nodes[g->values[dx.id].node];
    if (n == 1)
        CHECK(gl->n_out == 2 && gl->a.unary.out_grad == 1 && bw->in[1] == gl->out[1] &&
                  bw->a.unary_bwd.side == 2 && g->values[gl->out[1]].t.dtype == TS_F32,
              "rewritten: gelu with 2 outputs (%d), out_grad %d, the backward reads its second "
              "output with side 2 (%lld)",
              gl->n_out, (int)gl->a.unary.out_grad, (long long)bw->a.unary_bwd.side);
    else
        CHECK(gl->n_out == 1 && bw->in[1] == x.id && bw->a.unary_bwd.side == 0,
              "left alone: the gelu and its backward unchanged");
    ts_graph_free(g);
    return n;
}

static void test_rewrite(void) {
    CHECK(rewrite(-1, TS_GELU_TANH, 0) == 1, "gelu then its backward: rewritten");
    CHECK(rewrite(0, TS_GELU_TANH, 0) == 1, "x also read before the gelu: rewritten");
    CHECK(rewrite(1, TS_GELU_TANH, 0) == 0, "x also read after the gelu: left alone");
    CHECK(rewrite(-1, TS_GELU_ERF, 0) == 0, "a backward of the other approximation: left alone");
    CHECK(rewrite(-1, TS_GELU_TANH, 1) == 0, "x a graph output: left alone");
}

/* ---- bad input --------------------------------------------------------- */

static void test_bad_input(void) {
    for (int c = 0; c < 3; c++) {
        ts_graph *g = ts_graph_new();
        ts_val x = ts_input(g, "x", c == 0 ? TS_F64 : TS_F32, 1, (const int64_t[]){4});
        ts_attrs a = ts_attrs_zero();
        a.unary.out_grad = c == 2 ? 2 : 1;
        ts_val y = ts_node_add(g, c == 1 ? TS_OP_RELU : TS_OP_GELU, 1, &x, &a, NULL);
        CHECK(!ts_val_ok(y) && strstr(ts_graph_error(g), "out_grad"), "out_grad %s refused: %s",
              c == 0   ? "on f64"
              : c == 1 ? "on a relu"
                       : "2",
              ts_graph_error(g));
        ts_graph_free(g);
    }
    for (int c = 0; c < 2; c++) {
        ts_graph *g = ts_graph_new();
        ts_val x = ts_input(g, "x", TS_F32, 1, (const int64_t[]){4});
        ts_attrs a = ts_attrs_zero();
        a.unary_bwd.fwd_op = c == 0 ? TS_OP_RELU : TS_OP_GELU;
        a.unary_bwd.side = c == 0 ? 2 : 3;
        ts_val y = ts_node_add(g, TS_OP_UNARY_BWD, 2, (ts_val[]){x, x}, &a, NULL);
        CHECK(!ts_val_ok(y), "unary_bwd side %d of %s refused: %s", c == 0 ? 2 : 3,
              c == 0 ? "relu" : "gelu", ts_graph_error(g));
        ts_graph_free(g);
    }
}

/* ---- the compile ------------------------------------------------------ */

enum { B = 2, T = 8, C = 32, H = 300, V = 40, NG = H * C + H + V * H + V, STEPS = 3 };
static const char *const PARAMS[4] = {"w1", "b1", "w2", "b2"};
static const int64_t PSIZE[4] = {H * C, H, V *H, V};

static ts_plan *build(ts_dtype compute, int64_t approx, int off, ts_compiled_graph *kept) {
    ts_graph *g = ts_graph_new();
    const int64_t dx[3] = {B, T, C}, dt[1] = {B * T};
    ts_val x = ts_input(g, "x", TS_F32, 3, dx), tg = ts_input(g, "t", TS_I64, 1, dt);
    ts_val w1 = ts_param(g, "w1", TS_F32, 2, (const int64_t[]){H, C}, ts_init_normal(0, 0.2));
    ts_val b1 = ts_param(g, "b1", TS_F32, 1, (const int64_t[]){H}, ts_init_normal(0, 0.1));
    ts_val w2 = ts_param(g, "w2", TS_F32, 2, (const int64_t[]){V, H}, ts_init_normal(0, 0.1));
    ts_val b2 = ts_param(g, "b2", TS_F32, 1, (const int64_t[]){V}, ts_init_normal(0, 0.1));
    ts_val h = ts_gelu(g, ts_linear(g, x, w1, b1), (ts_gelu_approx)approx);
    ts_val logits = ts_reshape(g, ts_linear(g, h, w2, b2), 2, (const int64_t[]){B * T, V});
    ts_val loss = ts_cross_entropy(g, logits, tg, -100);
    ts_train_spec spec = ts_train_spec_default(loss);
    spec.opt = ts_sgd(0.1, 0, 0, 0, 0);
    ts_compile_options o = ts_compile_options_default();
    o.seed = 11;
    o.precision.compute = compute;
    o.no_gelu_grad = off;
    ts_plan *p = NULL;
    CHECK_OK(ts_compile_keep(g, &spec, &o, &p, kept));
    ts_graph_free(g);
    return p;
}

/* STEPS steps: the losses into loss, the last step's gradients and then the weights into out
 * (2 NG floats). */
static void train(ts_plan *p, double *loss, float *out) {
    static float x[B * T * C];
    int64_t t[B * T];
    for (int i = 0; i < B * T * C; i++) x[i] = (float)sin(0.37 * i + 0.1) * 2.0f;
    for (int i = 0; i < B * T; i++) t[i] = (i * 13) % V;
    for (int s = 0; s < STEPS; s++) {
        CHECK_OK(ts_plan_set_input(p, "x", x, sizeof x));
        CHECK_OK(ts_plan_set_input(p, "t", t, sizeof t));
        CHECK_OK(ts_plan_step(p));
        loss[s] = ts_plan_loss(p);
    }
    float *o = out;
    for (int k = 0; k < 4; k++) {
        char name[16];
        snprintf(name, sizeof name, "grad:%s", PARAMS[k]);
        CHECK_OK(ts_plan_read(p, name, o, sizeof(float) * (size_t)PSIZE[k]));
        CHECK_OK(ts_plan_read(p, PARAMS[k], o + NG, sizeof(float) * (size_t)PSIZE[k]));
        o += PSIZE[k];
    }
}

/* gelu nodes with out_grad, and GELU backwards (unary_bwd or folded sum) reading the derivative */
static void count(const ts_graph *g, int *gelus, int *bwds) {
    *gelus = *bwds = 0;
    for (int i = 0; i < g->n_nodes; i++) {
        const ts_node *n = &g->nodes[i];
        if (n->dead) continue;
        *gelus += n->op == TS_OP_GELU && n->a.unary.out_grad == 1 && n->n_out == 2;
        const ts_unary_bwd_attrs *b = n->op == TS_OP_UNARY_BWD                    ? &n->a.unary_bwd
                                      : n->op == TS_OP_REDUCE_SUM && n->n_in == 2 ? &n->a.reduce.bwd
                                                                                  : NULL;
        if (!b || b->fwd_op != TS_OP_GELU || b->side != 2) continue;
        const ts_value *v = &g->values[n->in[1]];
        *bwds += v->node >= 0 && g->nodes[v->node].op == TS_OP_GELU && v->out_index == 1;
    }
}

static void compile_case(ts_dtype compute, int64_t approx) {
    const char *what = compute == TS_BF16 ? "bf16" : "f32";
    const char *ap = approx == TS_GELU_TANH ? "tanh" : "erf";
    ts_compiled_graph kept = {0}, kept_off = {0};
    ts_plan *p = build(compute, approx, 0, &kept), *q = build(compute, approx, 1, &kept_off);
    if (p && q) {
        int gelus, bwds, gelus0, bwds0;
        count(kept.graph, &gelus, &bwds);
        count(kept_off.graph, &gelus0, &bwds0);
        CHECK(gelus == 1 && bwds == 1,
              "%s %s: %d gelu writing the derivative, %d backward reading it (1 and 1)", what, ap,
              gelus, bwds);
        CHECK(gelus0 == 0 && bwds0 == 0, "%s %s, compile.no_gelu_grad: %d and %d (0 and 0)", what,
              ap, gelus0, bwds0);
        static float a[2 * NG], b[2 * NG];
        double la[STEPS], lb[STEPS];
        train(p, la, a);
        train(q, lb, b);
        CHECK(memcmp(la, lb, sizeof la) == 0 && memcmp(a, b, sizeof a) == 0,
              "%s %s: losses, gradients and weights after %d steps bit-identical to "
              "compile.no_gelu_grad (loss %.9g vs %.9g)",
              what, ap, STEPS, la[STEPS - 1], lb[STEPS - 1]);
    }
    ts_plan_free(p);
    ts_plan_free(q);
    ts_compiled_graph_free(&kept);
    ts_compiled_graph_free(&kept_off);
}

int main(void) {
    test_rewrite();
    test_bad_input();
    compile_case(TS_F32, TS_GELU_TANH);
    compile_case(TS_F32, TS_GELU_ERF);
    if (!ts_cpu_supports_dtype_gemm(TS_BF16)) {
        printf("skipped bf16: %s\n", ts_cpu_dtype_gemm_why(TS_BF16));
        return check_summary("gelu_grad");
    }
    compile_case(TS_BF16, TS_GELU_TANH);
    compile_case(TS_BF16, TS_GELU_ERF);
    return check_summary("gelu_grad");
}
