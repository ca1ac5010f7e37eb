/* Casts folded into their producer: in bf16 plans a layer norm, a permute or
 * the cross-entropy backward whose f32 output only its bf16 cast reads
 * writes bf16 itself (norm.out_low, permute.out_low, cross_entropy.out_low)
 * and the cast goes (passes/precision.c; the GELU's fold is in
 * precision_views.c).
 *
 * - kernels, bit for bit against the f32 kernel followed by the cast's
 *   rounding (ts_f32_to_bf16): layer norm with and without weight and bias,
 *   rows longer than the kernel's stack piece, NaN / infinities / huge and
 *   tiny values; permute on each path of the strided copy (one element, a
 *   contiguous run, rows, transposed tiles); the cross-entropy backward on
 *   many classes (several pieces) and few (the f32 kernel's class-by-class
 *   path), ignored rows, class weights, i32 and i64 targets, a row chunk
 *   (chunk_ce); mean and rstd of the layer norm stay the f32 kernel's;
 * - bad input: out_low on an f64 layer norm, permute or cross-entropy
 *   backward is refused by inference;
 * - the pass: a small model (layer norm -> linear -> permute -> linear ->
 *   cross entropy) compiled in bf16 has the three flags set (the permute's
 *   gradient, read by the backward GEMMs only, writes bf16 too) and no cast
 *   reading them, its loss and gradients are within bf16 rounding of f32
 *   (relative L2 below 2e-2) and bit-identical on 1 and 2 threads. */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include "backends/cpu/dnnl_caps.h"
#include "check.h"
#include "core/half.h"
#include "ops/op.h"
#include "plan/plan.h"

static ts_step_ctx k_ctx = {1, 0, 0.0, 1};

/* Values over every class the rounding treats apart, deterministic. */
static float value(int64_t i) {
    static const float special[] = {NAN, -NAN, INFINITY, -INFINITY, 0.0f, -0.0f, 1e-40f, 3.0e38f};
    if (i % 97 < 8 && i < 4000) return special[i % 97];
    return (float)(sin(0.7 * (double)i) * pow(10.0, (double)(i % 7) - 3));
}

/* A NaN equals a NaN here: its sign and payload follow the order the compiler gave a sum's or
 * a product's operands (IEEE 754 leaves it open), and the two kernels are compiled apart (a row
 * holding NaN and an infinity gives NaN in one and -NaN in the other since session 25). */
static int is_nan16(uint16_t h) {
    return (h & 0x7fffu) > 0x7f80u;
}
static int differ(const uint16_t *low, const float *f32, int64_t n) {
    int bad = 0;
    for (int64_t i = 0; i < n; i++) {
        const uint16_t a = low[i], b = ts_f32_to_bf16(f32[i]);
        bad += a != b && !(is_nan16(a) && is_nan16(b));
    }
    return bad;
}
static int differ_f32(const float *a, const float *b, int64_t n) {
    int bad = 0;
    for (int64_t i = 0; i < n; i++)
        bad += memcmp(&a[i], &b[i], sizeof a[i]) != 0 && !(a[i] != a[i] && b[i] != b[i]);
    return bad;
}

static void test_layer_norm(void) {
    enum { R = 5, D = 1300 }; /* D: two full stack pieces of 512 and a tail */
    static float x[R * D], w[D], b[D], y[R * D], m32[R], r32[R], m16[R], r16[R];
    static uint16_t low[R * D];
    for (int i = 0; i < R * D; i++) x[i] = value(i) + (float)(i / D); /* row 0 has NaN, inf */
    for (int i = 0; i < R * D; i += D + 1) x[i + 3] = (float)(i % 5) * 1e4f;
    for (int i = 0; i < D; i++) w[i] = 1.0f + 0.01f * (float)(i % 13), b[i] = 0.1f * (float)(i % 7);
    const ts_op_def *d = ts_op_get(TS_OP_LAYER_NORM);
    for (int hw = 0; hw < 2; hw++)
        for (int hb = 0; hb < 2; hb++) {
            ts_attrs a = ts_attrs_zero();
            a.norm.has_w = hw, a.norm.has_b = hb, a.norm.eps = 1e-5;
            ts_tensor in[3] = {{TS_F32, 2, {R, D}, x}};
            int n = 1;
            if (hw) in[n++] = (ts_tensor){TS_F32, 1, {D}, w};
            if (hb) in[n++] = (ts_tensor){TS_F32, 1, {D}, b};
            ts_tensor o32[3] = {
                {TS_F32, 2, {R, D}, y}, {TS_F32, 1, {R}, m32}, {TS_F32, 1, {R}, r32}};
            ts_tensor o16[3] = {
                {TS_BF16, 2, {R, D}, low}, {TS_F32, 1, {R}, m16}, {TS_F32, 1, {R}, r16}};
            ts_kargs k32 = {&a, n, 3, in, o32, NULL, 0, &k_ctx, "ln", NULL};
            CHECK_OK(d->kernel(&k32));
            a.norm.out_low = 1;
            ts_kargs k16 = {&a, n, 3, in, o16, NULL, 0, &k_ctx, "ln", NULL};
            CHECK_OK(d->kernel(&k16));
            int bad = differ(low, y, R * D);
            CHECK(bad == 0, "layer_norm w %d b %d out_low: %d of %d values differ from f32 + cast",
                  hw, hb, bad, R * D);
            CHECK(differ_f32(m32, m16, R) == 0 && differ_f32(r32, r16, R) == 0,
                  "layer_norm out_low: mean and rstd are the f32 kernel's");
        }
}

/* permute of a [2,3,5,40] f32 tensor (and a [1,1] one) by perm, f32 + cast against out_low. */
static void permute_case(const int64_t *dims, int rank, const int64_t *perm, const char *what) {
    enum { N = 2 * 3 * 5 * 40 };
    static float x[N], y[N];
    static uint16_t low[N];
    int64_t n = 1;
    ts_tensor in = {TS_F32, rank, {0}, x}, o32 = {TS_F32, rank, {0}, y},
              o16 = {TS_BF16, rank, {0}, low};
    for (int i = 0; i < rank; i++) {
        in.dims[i] = dims[i];
        o32.dims[i] = o16.dims[i] = dims[perm[i]];
        n *= dims[i];
    }
    for (int64_t i = 0; i < n; i++) x[i] = value(i * 3);
    ts_attrs a = ts_attrs_zero();
    memcpy(a.permute.perm, perm, sizeof(int64_t) * (size_t)rank);
    const ts_op_def *d = ts_op_get(TS_OP_PERMUTE);
    ts_kargs k32 = {&a, 1, 1, &in, &o32, NULL, 0, &k_ctx, "permute", NULL};
    CHECK_OK(d->kernel(&k32));
    a.permute.out_low = 1;
    ts_kargs k16 = {&a, 1, 1, &in, &o16, NULL, 0, &k_ctx, "permute", NULL};
    CHECK_OK(d->kernel(&k16));
    int bad = differ(low, y, n);
    CHECK(bad == 0, "permute %s out_low: %d of %lld values differ from f32 + cast", what, bad,
          (long long)n);
}

static void test_permute(void) {
    const int64_t dims[4] = {2, 3, 5, 40}, one[2] = {1, 1};
    permute_case(dims, 4, (const int64_t[]){0, 1, 2, 3}, "identity (one run)");
    permute_case(dims, 4, (const int64_t[]){0, 2, 1, 3}, "[0,2,1,3] (rows)");
    permute_case(dims, 4, (const int64_t[]){3, 1, 2, 0}, "[3,1,2,0] (tiles)");
    permute_case(dims, 4, (const int64_t[]){0, 3, 2, 1}, "[0,3,2,1] (tiles)");
    permute_case(one, 2, (const int64_t[]){1, 0}, "[1,1] (one element)");
}

/* cross_entropy_bwd over rows [r0, r0 + nr) (nr 0: all) of [R, c] logits. */
static void ce_case(int64_t c, int weighted, int is64, int64_t r0, int64_t nr) {
    enum { R = 9, CMAX = 2500 };
    static float x[R * CMAX], lse[R], wt[CMAX], y[R * CMAX];
    static uint16_t low[R * CMAX];
    int64_t t64[R];
    int32_t t32[R];
    const int64_t ign = -100;
    for (int64_t i = 0; i < R * c; i++) x[i] = (float)(3.0 * sin(0.37 * (double)i));
    for (int64_t r = 0; r < R; r++) {
        double mx = -INFINITY, s = 0;
        for (int64_t i = 0; i < c; i++) mx = fmax(mx, x[r * c + i]);
        for (int64_t i = 0; i < c; i++) s += exp(x[r * c + i] - mx);
        lse[r] = (float)(mx + log(s));
        t64[r] = r == 4 ? ign : (r * 7919) % c;
        t32[r] = (int32_t)t64[r];
    }
    for (int64_t i = 0; i < c; i++) wt[i] = 0.5f + 0.1f * (float)(i % 9);
    float dl = 0.75f;
    const int64_t rows = nr ? nr : R;
    ts_tensor in[5] = {{TS_F32, 0, {0}, &dl},
                       {TS_F32, 2, {R, c}, x},
                       {is64 ? TS_I64 : TS_I32, 1, {R}, is64 ? (void *)t64 : (void *)t32},
                       {TS_F32, 1, {R}, lse},
                       {TS_F32, 1, {c}, wt}};
    ts_tensor o32 = {TS_F32, 2, {rows, c}, y}, o16 = {TS_BF16, 2, {rows, c}, low};
    ts_attrs a = ts_attrs_zero();
    a.cross_entropy.ignore_index = ign;
    a.cross_entropy.row_start = r0, a.cross_entropy.row_count = nr;
    const ts_op_def *d = ts_op_get(TS_OP_CROSS_ENTROPY_BWD);
    ts_kargs k32 = {&a, 4 + weighted, 1, in, &o32, NULL, 0, &k_ctx, "ce", NULL};
    CHECK_OK(d->kernel(&k32));
    a.cross_entropy.out_low = 1;
    ts_kargs k16 = {&a, 4 + weighted, 1, in, &o16, NULL, 0, &k_ctx, "ce", NULL};
    CHECK_OK(d->kernel(&k16));
    int bad = differ(low, y, rows * c);
    CHECK(bad == 0,
          "cross_entropy_bwd c %lld weighted %d i64 %d rows %lld+%lld out_low: %d of %lld values "
          "differ from f32 + cast",
          (long long)c, weighted, is64, (long long)r0, (long long)nr, bad, (long long)(rows * c));
}

static void test_cross_entropy(void) {
    ce_case(2500, 0, 1, 0, 0); /* three pieces of 1024 and a tail */
    ce_case(2500, 1, 0, 0, 0);
    ce_case(5, 0, 1, 0, 0); /* few classes: the f32 kernel goes class by class */
    ce_case(5, 1, 1, 0, 0);
    ce_case(1030, 1, 1, 3, 4); /* a chunk of rows, the ignored row 4 inside it */
}

/* out_low on f64 is refused when the node is added. */
static void test_bad_input(void) {
    ts_graph *g = ts_graph_new();
    const int64_t d2[2] = {3, 4}, d1[1] = {3};
    ts_val x = ts_input(g, "x", TS_F64, 2, d2);
    ts_attrs a = ts_attrs_zero();
    a.norm.out_low = 1;
    CHECK(!ts_val_ok(ts_node_add(g, TS_OP_LAYER_NORM, 1, &x, &a, NULL)),
          "layer_norm out_low on f64 is refused");
    CHECK(strstr(ts_last_error(), "out_low") != NULL, "the layer norm's message names out_low: %s",
          ts_last_error());
    ts_graph_free(g);
    g = ts_graph_new();
    x = ts_input(g, "x", TS_F64, 2, d2);
    a = ts_attrs_zero();
    a.permute.perm[0] = 1, a.permute.out_low = 1;
    CHECK(!ts_val_ok(ts_node_add(g, TS_OP_PERMUTE, 1, &x, &a, NULL)),
          "permute out_low on f64 is refused");
    ts_graph_free(g);
    g = ts_graph_new();
    x = ts_input(g, "x", TS_F64, 2, d2);
    ts_val t = ts_input(g, "t", TS_I64, 1, d1), dl = ts_input(g, "dl", TS_F64, 0, NULL);
    ts_val lse = ts_input(g, "lse", TS_F64, 1, d1);
    a = ts_attrs_zero();
    a.cross_entropy.ignore_index = -100, a.cross_entropy.out_low = 1;
    CHECK(
        !ts_val_ok(ts_node_add(g, TS_OP_CROSS_ENTROPY_BWD, 4, (ts_val[]){dl, x, t, lse}, &a, NULL)),
        "cross_entropy_bwd out_low on f64 is refused");
    ts_graph_free(g);
}

/* x [B,T,C] -> layer_norm -> linear(H) -> [B,T,2,H/2] -> permute [B,2,T,H/2] -> linear(V)
 * -> cross entropy; AdamW-free SGD. */
enum { B = 2, T = 8, C = 32, H = 64, V = 40 };
static ts_plan *build(ts_dtype compute, int threads, ts_compiled_graph *kept) {
    ts_graph *g = ts_graph_new();
    const int64_t dx[3] = {B, T, C}, dt[1] = {B * 2 * T}, dc[1] = {C};
    const int64_t dw1[2] = {H, C}, dw2[2] = {V, H / 2};
    ts_val x = ts_input(g, "x", TS_F32, 3, dx), tg = ts_input(g, "t", TS_I64, 1, dt);
    ts_val lw = ts_param(g, "ln.w", TS_F32, 1, dc, ts_init_normal(1, 0.1));
    ts_val lb = ts_param(g, "ln.b", TS_F32, 1, dc, ts_init_normal(0, 0.1));
    ts_val w1 = ts_param(g, "w1", TS_F32, 2, dw1, ts_init_normal(0, 0.3));
    ts_val w2 = ts_param(g, "w2", TS_F32, 2, dw2, ts_init_normal(0, 0.3));
    ts_val h = ts_linear(g, ts_layer_norm(g, x, lw, lb, 1e-5), w1, TS_NONE);
    h = ts_reshape(g, h, 4, (const int64_t[]){B, T, 2, H / 2});
    h = ts_permute(g, h, (const int[]){0, 2, 1, 3});
    ts_val logits = ts_reshape(g, ts_linear(g, h, w2, TS_NONE), 2, (const int64_t[]){B * 2 * T, V});
    ts_val loss = ts_cross_entropy(g, logits, tg, -100);
    ts_train_spec spec = ts_train_spec_default(loss);
    spec.opt = ts_sgd(0.1, 0, 0, 0, 0);
    ts_compile_options o = ts_compile_options_default();
    o.seed = 5;
    o.threads = threads;
    o.precision.compute = compute;
    ts_plan *p = NULL;
    CHECK_OK(ts_compile_keep(g, &spec, &o, &p, kept));
    ts_graph_free(g);
    return p;
}

static double run(ts_plan *p, float *grad) {
    static float x[B * T * C];
    int64_t t[B * 2 * T];
    for (int i = 0; i < B * T * C; i++) x[i] = (float)sin(0.37 * i + 0.1) * 2.0f;
    for (int i = 0; i < B * 2 * T; i++) t[i] = (i * 13) % V;
    CHECK_OK(ts_plan_set_input(p, "x", x, sizeof x));
    CHECK_OK(ts_plan_set_input(p, "t", t, sizeof t));
    CHECK_OK(ts_plan_step(p));
    CHECK_OK(ts_plan_read(p, "grad:w1", grad, sizeof(float) * H * C));
    CHECK_OK(ts_plan_read(p, "grad:ln.w", grad + H * C, sizeof(float) * C));
    return ts_plan_loss(p);
}

static int producer_op(const ts_graph *g, int32_t v) {
    const ts_value *val = &g->values[v];
    return val->kind == TS_VK_NODE && val->node >= 0 ? g->nodes[val->node].op : -1;
}

static void test_pass(void) {
    ts_compiled_graph kept = {0}, k2 = {0};
    ts_plan *p = build(TS_BF16, 1, &kept), *p2 = build(TS_BF16, 2, &k2),
            *p32 = build(TS_F32, 1, NULL);
    if (p && p2 && p32) {
        const ts_graph *g = kept.graph;
        int ln = 0, perm = 0, ce = 0, stale = 0;
        for (int i = 0; i < g->n_nodes; i++) {
            const ts_node *n = &g->nodes[i];
            if (n->dead) continue;
            ln += n->op == TS_OP_LAYER_NORM && n->a.norm.out_low == 1;
            perm += n->op == TS_OP_PERMUTE && n->a.permute.out_low == 1;
            /* the backward is fused with the forward after the fold (passes/fuse_ce.c) and
             * keeps its out_low */
            const int ce_op =
                n->op == TS_OP_CROSS_ENTROPY_BWD || n->op == TS_OP_CROSS_ENTROPY_FUSED;
            ce += ce_op && n->a.cross_entropy.out_low == 1;
            if (n->op == TS_OP_CAST) {
                int op = producer_op(g, n->in[0]);
                stale += op == TS_OP_LAYER_NORM || op == TS_OP_PERMUTE ||
                         op == TS_OP_CROSS_ENTROPY_BWD || op == TS_OP_CROSS_ENTROPY_FUSED;
            }
        }
        CHECK(ln == 1 && perm == 2 && ce == 1 && stale == 0,
              "bf16: %d layer norms, %d permutes (the forward's and its gradient's), %d "
              "cross-entropy backwards writing bf16 (1, 2, 1 expected), %d casts of them (0 "
              "expected)",
              ln, perm, ce, stale);
        static float gb[H * C + C], g2[H * C + C], g32[H * C + C];
        double lb = run(p, gb), l2 = run(p2, g2), l32 = run(p32, g32);
        double num = 0, den = 0;
        for (int i = 0; i < H * C + C; i++)
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
    ts_compiled_graph_free(&k2);
}

int main(void) {
    test_layer_norm();
    test_permute();
    test_cross_entropy();
    test_bad_input();
    if (!ts_cpu_supports_dtype_gemm(TS_BF16)) {
        printf("skipped: %s\n", ts_cpu_dtype_gemm_why(TS_BF16));
        return check_summary("precision_fold");
    }
    test_pass();
    return check_summary("precision_fold");
}
