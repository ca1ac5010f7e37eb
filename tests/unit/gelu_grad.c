/* The gelu_grad pass (passes/gelu_grad.c): the forward gelu writes gelu'(x)
 * (unary.out_grad) and the GELU backward multiplies by it (side 2).
 *
 * - the pass on hand-built graphs: a gelu of x followed by unary_bwd(d, x)
 *   is rewritten (the gelu has two outputs, the backward reads the second
 *   with side 2; the derivative f32, or bf16 where the gelu's result is, out_low);
 *   not when another node reads x after the gelu, when the approximations differ,
 *   or when x is a graph output;
 * - bad input: out_grad on an f64 gelu, on a relu, or out_grad 2; a
 *   unary_bwd side 2 of a relu, or side 3, or a bf16 saved x (side 0), are refused
 *   by inference;
 * - the kernels with a bf16 derivative (session 19): the gelu writes bf16(its f32
 *   derivative), and unary_bwd and the folded sum (side 2) reading it give the bits they
 *   give reading its f32 widening;
 * - the compile: linear -> GELU (tanh and erf) -> linear -> cross entropy,
 *   f32 and (where this CPU has bf16 GEMMs) bf16, trained 3 SGD steps:
 *   the plan has the new form (in bf16 the folded bias-gradient sum reads
 *   the derivative, bf16), compile.no_gelu_grad keeps the old one; in f32 the loss,
 *   gradients and weights are bit-identical between the two, in bf16 (the derivative
 *   rounded to bf16) close, and bit-identical between two compiles. */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include "backends/cpu/dnnl_caps.h"
#include "check.h"
#include "core/half.h"
#include "ops/op.h"
#include "passes/passes.h"
#include "plan/plan.h"

/* ---- the pass on hand-built graphs ---------------------------------- */

/* gelu(x) (with out_low: a bf16 result) and unary_bwd(d, x) side 0, with a mul(x, x) read
 * before the gelu (after = 0), after it (1), or none (-1); bwd_approx the backward's
 * approximation; x_output marks x an output. Returns how many backward nodes the pass
 * rewrote, and checks the rewritten form. */
static int rewrite_low(int after, int64_t bwd_approx, int x_output, int low) {
    ts_graph *g = ts_graph_new();
    const int64_t dims[2] = {3, 5};
    ts_val x0 = ts_input(g, "x0", TS_F32, 2, dims), d = ts_input(g, "d", TS_F32, 2, dims);
    ts_val x = ts_neg(g, x0); /* made by a node, as a pre-activation is */
    if (after == 0) ts_mark_output(g, ts_mul(g, x, x), "m");
    ts_attrs ga = ts_attrs_zero();
    ga.unary.approx = TS_GELU_TANH, ga.unary.out_low = low;
    ts_val y = ts_node_add(g, TS_OP_GELU, 1, &x, &ga, NULL);
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
                  bw->a.unary_bwd.side == 2 &&
                  g->values[gl->out[1]].t.dtype == (low ? TS_BF16 : TS_F32),
              "rewritten: gelu with 2 outputs (%d), out_grad %d, the backward reads its second "
              "output (%s) with side 2 (%lld)",
              gl->n_out, (int)gl->a.unary.out_grad, ts_dtype_name(g->values[gl->out[1]].t.dtype),
              (long long)bw->a.unary_bwd.side);
    else
        CHECK(gl->n_out == 1 && bw->in[1] == x.id && bw->a.unary_bwd.side == 0,
              "left alone: the gelu and its backward unchanged");
    ts_graph_free(g);
    return n;
}

static int rewrite(int after, int64_t bwd_approx, int x_output) {
    return rewrite_low(after, bwd_approx, x_output, 0);
}

static void test_rewrite(void) {
    CHECK(rewrite_low(-1, TS_GELU_TANH, 0, 1) == 1, "a bf16 gelu: rewritten, a bf16 derivative");
    CHECK(rewrite_low(0, TS_GELU_TANH, 0, 1) == 1, "a bf16 gelu, x read before: rewritten");
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
    for (int side = 0; side <= 2; side += 2) { /* a bf16 saved tensor: the derivative only */
        ts_graph *g = ts_graph_new();
        ts_val d = ts_input(g, "d", TS_F32, 1, (const int64_t[]){4});
        ts_val s = ts_input(g, "s", TS_BF16, 1, (const int64_t[]){4});
        ts_attrs a = ts_attrs_zero();
        a.unary_bwd.fwd_op = TS_OP_GELU, a.unary_bwd.side = side;
        ts_val y = ts_node_add(g, TS_OP_UNARY_BWD, 2, (ts_val[]){d, s}, &a, NULL);
        if (side == 0)
            CHECK(!ts_val_ok(y), "unary_bwd side 0 reading a bf16 x refused: %s",
                  ts_graph_error(g));
        else
            CHECK(ts_val_ok(y) && g->values[y.id].t.dtype == TS_F32,
                  "unary_bwd side 2 reading a bf16 derivative: an f32 gradient (%s)",
                  ts_graph_error(g));
        ts_graph_free(g);
    }
}

/* ---- the kernels with a bf16 derivative ---------------------------------- */

enum { KR = 37, KC = 300, KN = KR * KC }; /* odd rows, columns not a multiple of 16 */

static void kernel(int op, const ts_attrs *a, ts_tensor *in, int n_in, ts_tensor *out, int n_out,
                   void *scratch, size_t sb) {
    static ts_step_ctx ctx = {1, 0, 0.0, 1};
    ts_kargs k = {a, n_in, n_out, in, out, scratch, sb, &ctx, "gelu_grad", NULL};
    CHECK_OK(ts_op_get(op)->kernel(&k));
}

static void test_bf16_kernels(int64_t approx) {
    static float x[KN], d[KN], g32[KN], gw[KN], o16[KN], ow[KN], b16[KC], bw[KC];
    static uint16_t y32[KN], y16[KN], g16[KN], l16[KN], lw[KN];
    for (int i = 0; i < KN; i++)
        x[i] = (float)(3.0 * sin(0.013 * i)), d[i] = (float)(1e-2 * cos(0.71 * i));
    x[3] = NAN, x[4] = -40.0f, x[5] = 40.0f, x[6] = -9.7f;
    ts_attrs fa = ts_attrs_zero();
    fa.unary.approx = (int32_t)approx, fa.unary.out_low = 1, fa.unary.out_grad = 1;
    ts_tensor tx = {TS_F32, 2, {KR, KC}, x};
    ts_tensor o32[2] = {{TS_BF16, 2, {KR, KC}, y32}, {TS_F32, 2, {KR, KC}, g32}};
    ts_tensor o16s[2] = {{TS_BF16, 2, {KR, KC}, y16}, {TS_BF16, 2, {KR, KC}, g16}};
    kernel(TS_OP_GELU, &fa, &tx, 1, o32, 2, NULL, 0);
    kernel(TS_OP_GELU, &fa, &tx, 1, o16s, 2, NULL, 0);
    int bad = 0;
    for (int i = 0; i < KN; i++) {
        bad += y16[i] != y32[i] || g16[i] != ts_f32_to_bf16(g32[i]);
        gw[i] = ts_bf16_to_f32(g16[i]);
    }
    const char *ap = approx == TS_GELU_TANH ? "tanh" : "erf";
    CHECK(bad == 0,
          "%s gelu, bf16 derivative: its result's bits, and bf16(the f32 derivative) "
          "(%d of %d differ)",
          ap, bad, KN);
    ts_attrs ua = ts_attrs_zero();
    ua.unary_bwd.fwd_op = TS_OP_GELU, ua.unary_bwd.side = 2;
    ua.unary_bwd.fwd.approx = (int32_t)approx;
    ts_tensor in16[2] = {{TS_F32, 2, {KR, KC}, d}, {TS_BF16, 2, {KR, KC}, g16}};
    ts_tensor inw[2] = {{TS_F32, 2, {KR, KC}, d}, {TS_F32, 2, {KR, KC}, gw}};
    ts_tensor t16 = {TS_F32, 2, {KR, KC}, o16}, tw = {TS_F32, 2, {KR, KC}, ow};
    kernel(TS_OP_UNARY_BWD, &ua, in16, 2, &t16, 1, NULL, 0);
    kernel(TS_OP_UNARY_BWD, &ua, inw, 2, &tw, 1, NULL, 0);
    CHECK(memcmp(o16, ow, sizeof o16) == 0,
          "%s unary_bwd side 2: a bf16 derivative gives the bits of its f32 widening", ap);
    ts_attrs sa = ts_attrs_zero();
    sa.reduce.axes = 1, sa.reduce.keepdim = 1, sa.reduce.scale = 1.0, sa.reduce.out_low = 1;
    sa.reduce.bwd = ua.unary_bwd;
    static double scratch[4096];
    ts_tensor s16[2] = {{TS_F32, 2, {1, KC}, b16}, {TS_BF16, 2, {KR, KC}, l16}};
    ts_tensor sw[2] = {{TS_F32, 2, {1, KC}, bw}, {TS_BF16, 2, {KR, KC}, lw}};
    kernel(TS_OP_REDUCE_SUM, &sa, in16, 2, s16, 2, scratch, sizeof scratch);
    kernel(TS_OP_REDUCE_SUM, &sa, inw, 2, sw, 2, scratch, sizeof scratch);
    CHECK(memcmp(b16, bw, sizeof b16) == 0 && memcmp(l16, lw, sizeof l16) == 0,
          "%s sum(d, g) side 2: a bf16 derivative gives the sums and bf16 copy of its f32 "
          "widening",
          ap);
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

/* The dtype of the derivative a gelu writes (out_grad), TS_DTYPE_COUNT if none. */
static ts_dtype deriv_dtype(const ts_graph *g) {
    for (int i = 0; i < g->n_nodes; i++) {
        const ts_node *n = &g->nodes[i];
        if (!n->dead && n->op == TS_OP_GELU && n->n_out == 2) return g->values[n->out[1]].t.dtype;
    }
    return TS_DTYPE_COUNT;
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
        const ts_dtype gdt = deriv_dtype(kept.graph);
        CHECK(gdt == compute, "%s %s: the derivative is %s", what, ap, ts_dtype_name(gdt));
        static float a[2 * NG], b[2 * NG], c[2 * NG];
        double la[STEPS], lb[STEPS], lc[STEPS];
        train(p, la, a);
        train(q, lb, b);
        if (compute == TS_F32) {
            CHECK(memcmp(la, lb, sizeof la) == 0 && memcmp(a, b, sizeof a) == 0,
                  "%s %s: losses, gradients and weights after %d steps bit-identical to "
                  "compile.no_gelu_grad (loss %.9g vs %.9g)",
                  what, ap, STEPS, la[STEPS - 1], lb[STEPS - 1]);
        } else { /* dA * bf16(g) vs dA * g: close, not equal */
            double md = 0, mw = 0;
            for (int i = NG; i < 2 * NG; i++) {
                md = fmax(md, fabs((double)a[i] - b[i]));
                mw = fmax(mw, fabs((double)b[i]));
            }
            CHECK(fabs(la[STEPS - 1] - lb[STEPS - 1]) < 1e-2 * fabs(lb[STEPS - 1]) &&
                      md < 1e-2 * mw,
                  "%s %s: loss %.9g vs %.9g, weights within %.3g (largest %.3g) of "
                  "compile.no_gelu_grad after %d steps",
                  what, ap, la[STEPS - 1], lb[STEPS - 1], md, mw, STEPS);
            ts_plan *r = build(compute, approx, 0, NULL);
            if (r) {
                train(r, lc, c);
                CHECK(memcmp(la, lc, sizeof la) == 0 && memcmp(a, c, sizeof a) == 0,
                      "%s %s: two compiles' losses, gradients and weights bit-identical", what, ap);
            }
            ts_plan_free(r);
        }
    }
    ts_plan_free(p);
    ts_plan_free(q);
    ts_compiled_graph_free(&kept);
    ts_compiled_graph_free(&kept_off);
}

int main(void) {
    test_rewrite();
    test_bad_input();
    test_bf16_kernels(TS_GELU_TANH);
    test_bf16_kernels(TS_GELU_ERF);
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
