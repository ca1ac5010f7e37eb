/* A bias-gradient sum writing the gradient's bf16 cast (reduce.out_low,
 * passes/precision.c fold_sum_casts): the sum and the cast in one pass.
 *
 * - kernel, bit for bit against the sum kernel without out_low and the
 *   cast's rounding (ts_f32_to_bf16), on 1 and 2 threads: the column-sum
 *   path (leading axes reduced; an inner extent with several 256-column
 *   blocks and a tail; an outer kept axis too), NaN / infinities / huge and
 *   tiny values, a mean's scale; the other patterns (trailing axes, a middle
 *   axis) that sum, then round; nothing written past either output;
 * - the sum computing a GELU backward itself (reduce.bwd, a second input):
 *   bit for bit against unary_bwd's kernel, the sum and the cast (tanh and
 *   erf GELU, one and two reduced axes, several column pieces);
 * - bad input: out_low on an f64 sum, on a max, or out_low 2, and a second
 *   input with a trailing axis, another shape or no out_low are refused by
 *   inference;
 * - the pass: linear -> GELU -> linear -> cross entropy compiled in bf16
 *   has the first layer's output gradient computed, cast and summed by its
 *   bias-gradient sum (no unary_bwd, no cast of a value a sum reads), its loss and
 *   gradients within bf16 rounding of f32 (relative L2 below 2e-2) and
 *   bit-identical on 1 and 2 threads. */
#include <math.h>
#include <omp.h>
#include <stdlib.h>
#include <string.h>
#include "backends/cpu/dnnl_caps.h"
#include "check.h"
#include "core/half.h"
#include "ops/op.h"
#include "plan/plan.h"

enum { GUARD = 300 };

/* Values over every class the rounding treats apart, deterministic. */
static float value(int64_t i) {
    static const float special[] = {NAN, -NAN, INFINITY, -INFINITY, 0.0f, -0.0f, 1e-40f, 3.0e38f};
    if (i % 97 < 8 && i < 4000) return special[i % 97];
    return (float)(sin(0.7 * (double)i) * pow(10.0, (double)(i % 7) - 3));
}

/* x of dims (rank 3) summed over the axes in mask, with and without out_low. */
static void kernel_case(const int64_t *dims, int64_t mask, double scale, const char *what) {
    const int64_t n = dims[0] * dims[1] * dims[2];
    int64_t no = 1;
    int64_t od[3];
    for (int i = 0; i < 3; i++) od[i] = (mask >> i & 1) ? 1 : dims[i], no *= od[i];
    float *x = malloc(sizeof(float) * (size_t)n), *ref = malloc(sizeof(float) * (size_t)no);
    float *sum = malloc(sizeof(float) * (size_t)(no + GUARD));
    uint16_t *low = malloc(sizeof(uint16_t) * (size_t)(n + GUARD));
    for (int64_t i = 0; i < n; i++) x[i] = value(i * 5 + 1);
    ts_graph *g = ts_graph_new();
    ts_val xv = ts_input(g, "x", TS_F32, 3, dims);
    ts_attrs a = ts_attrs_zero();
    a.reduce.axes = mask, a.reduce.keepdim = 1, a.reduce.scale = scale;
    ts_val s = ts_node_add(g, TS_OP_REDUCE_SUM, 1, &xv, &a, NULL);
    CHECK(ts_val_ok(s), "build %s: %s", what, ts_graph_error(g));
    const ts_node *node = &g->nodes[g->values[s.id].node];
    const ts_op_def *def = ts_op_get(TS_OP_REDUCE_SUM);
    size_t sb = def->scratch(g, node);
    void *scratch = ts_aligned_alloc(sb, "test");
    ts_step_ctx ctx = {1, 0, 0.0, 1};
    ts_tensor in = {TS_F32, 3, {dims[0], dims[1], dims[2]}, x};
    ts_tensor o32 = {TS_F32, 3, {od[0], od[1], od[2]}, ref};
    ts_kargs k32 = {&a, 1, 1, &in, &o32, scratch, sb, &ctx, "sum", NULL};
    CHECK_OK(def->kernel(&k32));
    a.reduce.out_low = 1;
    for (int threads = 1; threads <= 2; threads++) {
        omp_set_num_threads(threads);
        for (int64_t i = 0; i < no + GUARD; i++) sum[i] = -7.0f;
        for (int64_t i = 0; i < n + GUARD; i++) low[i] = 0x1234;
        ts_tensor outs[2] = {{TS_F32, 3, {od[0], od[1], od[2]}, sum},
                             {TS_BF16, 3, {dims[0], dims[1], dims[2]}, low}};
        ts_kargs k = {&a, 1, 2, &in, outs, scratch, sb, &ctx, "sum", NULL};
        CHECK_OK(def->kernel(&k));
        int bad_sum = memcmp(sum, ref, sizeof(float) * (size_t)no) != 0, bad_low = 0, past = 0;
        for (int64_t i = 0; i < n; i++) bad_low += low[i] != ts_f32_to_bf16(x[i]);
        for (int64_t i = 0; i < GUARD; i++) past += sum[no + i] != -7.0f || low[n + i] != 0x1234;
        CHECK(!bad_sum && !bad_low && !past,
              "sum %s out_low, %d threads: sums %s, %d of %lld bf16 values differ from the "
              "cast, %d written past the outputs",
              what, threads, bad_sum ? "differ" : "the same bits", bad_low, (long long)n, past);
    }
    omp_set_num_threads(1);
    ts_aligned_free(scratch);
    ts_graph_free(g);
    free(x);
    free(ref);
    free(sum);
    free(low);
}

/* The sum with a second input (reduce.bwd, a GELU's backward): against unary_bwd's kernel, then
 * the sum without out_low and the cast's rounding, bit for bit, on 1 and 2 threads. */
static void bwd_case(const int64_t *dims, int64_t mask, int64_t approx, const char *what) {
    const int64_t n = dims[0] * dims[1] * dims[2];
    int64_t no = 1, od[3];
    for (int i = 0; i < 3; i++) od[i] = (mask >> i & 1) ? 1 : dims[i], no *= od[i];
    float *dy = malloc(sizeof(float) * (size_t)n), *x = malloc(sizeof(float) * (size_t)n);
    float *dx = malloc(sizeof(float) * (size_t)n), *ref = malloc(sizeof(float) * (size_t)no);
    float *sum = malloc(sizeof(float) * (size_t)no);
    uint16_t *low = malloc(sizeof(uint16_t) * (size_t)n);
    for (int64_t i = 0; i < n; i++) dy[i] = value(i * 3 + 2), x[i] = (float)(4.0 * sin(0.1 * i));
    ts_attrs ub = ts_attrs_zero();
    ub.unary_bwd.fwd_op = TS_OP_GELU, ub.unary_bwd.fwd.approx = approx;
    ts_step_ctx ctx = {1, 0, 0.0, 1};
    ts_tensor uin[2] = {{TS_F32, 3, {dims[0], dims[1], dims[2]}, dy},
                        {TS_F32, 3, {dims[0], dims[1], dims[2]}, x}};
    ts_tensor uo = {TS_F32, 3, {dims[0], dims[1], dims[2]}, dx};
    ts_kargs ku = {&ub, 2, 1, uin, &uo, NULL, 0, &ctx, "unary_bwd", NULL};
    CHECK_OK(ts_op_get(TS_OP_UNARY_BWD)->kernel(&ku));
    ts_graph *g = ts_graph_new();
    ts_val xv = ts_input(g, "x", TS_F32, 3, dims);
    ts_attrs a = ts_attrs_zero();
    a.reduce.axes = mask, a.reduce.keepdim = 1, a.reduce.scale = 1.0;
    ts_val sv = ts_node_add(g, TS_OP_REDUCE_SUM, 1, &xv, &a, NULL);
    const ts_op_def *def = ts_op_get(TS_OP_REDUCE_SUM);
    size_t sb = def->scratch(g, &g->nodes[g->values[sv.id].node]);
    void *scratch = ts_aligned_alloc(sb, "test");
    ts_tensor o32 = {TS_F32, 3, {od[0], od[1], od[2]}, ref};
    ts_kargs k32 = {&a, 1, 1, &uo, &o32, scratch, sb, &ctx, "sum", NULL};
    CHECK_OK(def->kernel(&k32));
    a.reduce.out_low = 1, a.reduce.bwd = ub.unary_bwd;
    for (int threads = 1; threads <= 2; threads++) {
        omp_set_num_threads(threads);
        ts_tensor outs[2] = {{TS_F32, 3, {od[0], od[1], od[2]}, sum},
                             {TS_BF16, 3, {dims[0], dims[1], dims[2]}, low}};
        ts_kargs k = {&a, 2, 2, uin, outs, scratch, sb, &ctx, "sum", NULL};
        CHECK_OK(def->kernel(&k));
        int bad_sum = memcmp(sum, ref, sizeof(float) * (size_t)no) != 0, bad_low = 0;
        for (int64_t i = 0; i < n; i++) bad_low += low[i] != ts_f32_to_bf16(dx[i]);
        CHECK(!bad_sum && !bad_low,
              "sum of a GELU backward %s, %d threads: sums %s, %d of %lld bf16 values differ from "
              "unary_bwd + cast",
              what, threads, bad_sum ? "differ" : "the same bits", bad_low, (long long)n);
    }
    omp_set_num_threads(1);
    ts_aligned_free(scratch);
    ts_graph_free(g);
    free(dy), free(x), free(dx), free(ref), free(sum), free(low);
}

static void test_kernel(void) {
    bwd_case((const int64_t[]){3, 17, 2100}, 3, TS_GELU_TANH, "tanh, [3,17,2100] axes {0,1}");
    bwd_case((const int64_t[]){2, 5, 700}, 1, TS_GELU_ERF, "erf, [2,5,700] axis 0");
    kernel_case((const int64_t[]){3, 17, 700}, 3, 1.0, "[3,17,700] axes {0,1} (bias gradient)");
    kernel_case((const int64_t[]){2, 9, 300}, 1, 1.0, "[2,9,300] axis 0 (an outer kept axis)");
    kernel_case((const int64_t[]){5, 4, 256}, 3, 0.05, "[5,4,256] axes {0,1}, mean");
    kernel_case((const int64_t[]){4, 6, 33}, 6, 1.0, "[4,6,33] axes {1,2} (rows)");
    kernel_case((const int64_t[]){4, 6, 33}, 2, 1.0, "[4,6,33] axis 1 (middle)");
    kernel_case((const int64_t[]){4, 6, 33}, 5, 1.0, "[4,6,33] axes {0,2} (generic)");
}

static void test_bad_input(void) {
    const int64_t d2[2] = {3, 4};
    for (int c = 0; c < 3; c++) {
        ts_graph *g = ts_graph_new();
        ts_val x = ts_input(g, "x", c == 0 ? TS_F64 : TS_F32, 2, d2);
        ts_attrs a = ts_attrs_zero();
        a.reduce.axes = 1, a.reduce.scale = 1.0, a.reduce.out_low = c == 2 ? 2 : 1;
        const int op = c == 1 ? TS_OP_REDUCE_MAX : TS_OP_REDUCE_SUM;
        CHECK(!ts_val_ok(ts_node_add(g, op, 1, &x, &a, NULL)), "out_low %s is refused",
              c == 0   ? "on an f64 sum"
              : c == 1 ? "on a max"
                       : "2");
        CHECK(strstr(ts_last_error(), "out_low") != NULL, "the message names out_low: %s",
              ts_last_error());
        ts_graph_free(g);
    }
}

/* x [B,T,C] -> linear(H, bias) -> gelu -> linear(V, bias) -> cross entropy: the two bias
 * gradients sum over {B, T}, and the first layer's output gradient is cast for both GEMMs. */
enum { B = 2, T = 8, C = 32, H = 300, V = 40, NG = H * C + H + V * H + V };
/* A sum with a second input: trailing axes, shapes that differ, no out_low are refused. */
static void test_bad_bwd(void) {
    const int64_t d2[2] = {3, 4}, d3[2] = {3, 5};
    for (int c = 0; c < 3; c++) {
        ts_graph *g = ts_graph_new();
        ts_val in[2] = {ts_input(g, "dy", TS_F32, 2, d2),
                        ts_input(g, "x", TS_F32, 2, c == 1 ? d3 : d2)};
        ts_attrs a = ts_attrs_zero();
        a.reduce.axes = c == 0 ? 2 : 1, a.reduce.scale = 1.0, a.reduce.out_low = c != 2;
        a.reduce.bwd.fwd_op = TS_OP_GELU;
        CHECK(!ts_val_ok(ts_node_add(g, TS_OP_REDUCE_SUM, 2, in, &a, NULL)),
              "a sum with a second input and %s is refused",
              c == 0   ? "a trailing axis"
              : c == 1 ? "another shape"
                       : "no out_low");
        ts_graph_free(g);
    }
}

static ts_plan *build(ts_dtype compute, int threads, ts_compiled_graph *kept) {
    ts_graph *g = ts_graph_new();
    const int64_t dx[3] = {B, T, C}, dt[1] = {B * T};
    ts_val x = ts_input(g, "x", TS_F32, 3, dx), tg = ts_input(g, "t", TS_I64, 1, dt);
    ts_val w1 = ts_param(g, "w1", TS_F32, 2, (const int64_t[]){H, C}, ts_init_normal(0, 0.2));
    ts_val b1 = ts_param(g, "b1", TS_F32, 1, (const int64_t[]){H}, ts_init_normal(0, 0.1));
    ts_val w2 = ts_param(g, "w2", TS_F32, 2, (const int64_t[]){V, H}, ts_init_normal(0, 0.1));
    ts_val b2 = ts_param(g, "b2", TS_F32, 1, (const int64_t[]){V}, ts_init_normal(0, 0.1));
    ts_val h = ts_gelu(g, ts_linear(g, x, w1, b1), TS_GELU_TANH);
    ts_val logits = ts_reshape(g, ts_linear(g, h, w2, b2), 2, (const int64_t[]){B * T, V});
    ts_val loss = ts_cross_entropy(g, logits, tg, -100);
    ts_train_spec spec = ts_train_spec_default(loss);
    spec.opt = ts_sgd(0.1, 0, 0, 0, 0);
    ts_compile_options o = ts_compile_options_default();
    o.seed = 11;
    o.threads = threads;
    o.precision.compute = compute;
    ts_plan *p = NULL;
    CHECK_OK(ts_compile_keep(g, &spec, &o, &p, kept));
    ts_graph_free(g);
    return p;
}

/* One step: the loss, and the four gradients into grad (NG floats). */
static double run(ts_plan *p, float *grad) {
    static float x[B * T * C];
    int64_t t[B * T];
    for (int i = 0; i < B * T * C; i++) x[i] = (float)sin(0.37 * i + 0.1) * 2.0f;
    for (int i = 0; i < B * T; i++) t[i] = (i * 13) % V;
    CHECK_OK(ts_plan_set_input(p, "x", x, sizeof x));
    CHECK_OK(ts_plan_set_input(p, "t", t, sizeof t));
    CHECK_OK(ts_plan_step(p));
    CHECK_OK(ts_plan_read(p, "grad:w1", grad, sizeof(float) * H * C));
    CHECK_OK(ts_plan_read(p, "grad:b1", grad + H * C, sizeof(float) * H));
    CHECK_OK(ts_plan_read(p, "grad:w2", grad + H * C + H, sizeof(float) * V * H));
    CHECK_OK(ts_plan_read(p, "grad:b2", grad + H * C + H + V * H, sizeof(float) * V));
    return ts_plan_loss(p);
}

static void test_pass(void) {
    ts_compiled_graph kept = {0};
    ts_plan *p = build(TS_BF16, 1, &kept), *p2 = build(TS_BF16, 2, NULL),
            *p32 = build(TS_F32, 1, NULL);
    if (p && p2 && p32) {
        const ts_graph *g = kept.graph;
        int folded = 0, stale = 0, bwd = 0, unary_bwd = 0;
        for (int i = 0; i < g->n_nodes; i++) {
            const ts_node *n = &g->nodes[i];
            if (n->dead) continue;
            folded += n->op == TS_OP_REDUCE_SUM && n->a.reduce.out_low == 1 && n->n_out == 2;
            bwd +=
                n->op == TS_OP_REDUCE_SUM && n->n_in == 2 && n->a.reduce.bwd.fwd_op == TS_OP_GELU;
            unary_bwd += n->op == TS_OP_UNARY_BWD;
            if (n->op != TS_OP_CAST) continue;
            for (int u = 0; u < g->n_nodes; u++) /* a sum reading what this cast reads */
                stale += !g->nodes[u].dead && g->nodes[u].op == TS_OP_REDUCE_SUM &&
                         g->nodes[u].in[0] == n->in[0];
        }
        CHECK(bwd == 1 && unary_bwd == 0,
              "bf16: %d sums computing the GELU backward (1 expected), %d unary_bwd left (0)", bwd,
              unary_bwd);
        CHECK(folded == 1 && stale == 0,
              "bf16: %d bias-gradient sums writing the cast (1 expected: the first layer's), %d "
              "casts of a value a "
              "sum reads (0 expected)",
              folded, stale);
        static float gb[NG], g2[NG], g32[NG];
        double lb = run(p, gb), l2 = run(p2, g2), l32 = run(p32, g32);
        double num = 0, den = 0;
        for (int i = 0; i < NG; i++)
            num += ((double)gb[i] - g32[i]) * ((double)gb[i] - g32[i]),
                den += (double)g32[i] * g32[i];
        double err = sqrt(num / (den + 1e-300));
        CHECK(fabs(lb - l32) < 2e-2 * fabs(l32) && err < 2e-2,
              "bf16 against f32: loss %.6f vs %.6f, gradient relative L2 %.2e (< 2e-2)", lb, l32,
              err);
        CHECK(lb == l2 && memcmp(gb, g2, sizeof gb) == 0,
              "1 and 2 threads: the same loss and gradient bits");
    }
    ts_plan_free(p);
    ts_plan_free(p2);
    ts_plan_free(p32);
    ts_compiled_graph_free(&kept);
}

int main(void) {
    test_kernel();
    test_bad_input();
    test_bad_bwd();
    if (!ts_cpu_supports_dtype_gemm(TS_BF16)) {
        printf("skipped: %s\n", ts_cpu_dtype_gemm_why(TS_BF16));
        return check_summary("precision_sum_cast");
    }
    test_pass();
    return check_summary("precision_sum_cast");
}
