/* The attn_bwd_low pass (passes/attn_bwd_low.c) and the packed attention_bwd with out_low
 * (ops/attention_bwd_low.c): dqkv written in bf16 with its column sums, instead of f32 and a
 * sum with out_low reading it back.
 *
 * - hand-built graphs (packed attention, its backward, the [B, T, 3 * H * hd] view, the
 *   keepdim sum with out_low, a reader of the bf16 copy): rewritten (no sum left, the
 *   backward has the two outputs); left alone when the view is also an output or the sum
 *   has scale 0.5 (a mean); the rewritten graph, run as an inference plan on 1 and 2
 *   threads, gives the bf16 copy bit-identical to the sum's and the column sums within 1 ulp
 *   (and bit-identical between the thread counts): W3's head size over 4 blocks, an odd head
 *   size with partial blocks, a head size of 40 (a 16-lane tail);
 * - bad input: out_low on the split form or without low is refused by inference;
 * - a bf16 GPT (2 layers, 4 heads) compiled for training: one rewritten attention_bwd per
 *   layer; none with compile.no_attn_bwd_low_out, with keep_fp32 [attention], or in f32;
 *   one step's loss and gradients bit-identical to compile.no_attn_bwd_low_out but for the
 *   qkv biases' (within 1 ulp), and bit-identical on 1 and 2 threads. */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include "backends/cpu/dnnl_caps.h"
#include "check.h"
#include "ops/op.h"
#include "passes/passes.h"
#include "plan/plan.h"
#include "small_gpt.h"
#include "tessel/models.h"

/* |a - b| in units in the last place (f32 bit patterns of one sign), or a large number */
static int64_t ulps(float a, float b) {
    int32_t x, y;
    memcpy(&x, &a, 4), memcpy(&y, &b, 4);
    if ((x < 0) != (y < 0)) return a == b ? 0 : 1 << 30;
    return llabs((long long)x - (long long)y);
}

typedef struct shape {
    int64_t b, t, h, hd;
} shape;

/* ---- hand-built graphs ---------------------------------------------------- */

/* mode 0: the pattern; 1: the view also an output; 2: a mean (scale 0.5) */
static ts_graph *pattern(const shape *s, int mode) {
    ts_graph *g = ts_graph_new();
    const int64_t D = s->h * s->hd, qd[5] = {s->b, s->t, 3, s->h, s->hd};
    const int64_t od[4] = {s->b, s->t, s->h, s->hd}, vd[3] = {s->b, s->t, 3 * D};
    ts_val qkv = ts_input(g, "qkv", TS_F32, 5, qd), dout = ts_input(g, "dout", TS_F32, 4, od);
    ts_attrs at = ts_attrs_zero();
    at.attention.causal = 1, at.attention.scale = 1.0 / sqrt((double)s->hd);
    at.attention.low = 1;
    ts_val fo[2], dq;
    ts_node_add(g, TS_OP_ATTENTION, 1, &qkv, &at, fo);
    dq = ts_node_add(g, TS_OP_ATTENTION_BWD, 4, (ts_val[]){dout, qkv, fo[0], fo[1]}, &at, NULL);
    ts_val v = ts_reshape(g, dq, 3, vd);
    ts_attrs sa = ts_attrs_zero();
    sa.reduce.axes = 3, sa.reduce.keepdim = 1, sa.reduce.scale = mode == 2 ? 0.5 : 1.0;
    sa.reduce.out_low = 1;
    ts_val so[2];
    ts_node_add(g, TS_OP_REDUCE_SUM, 1, &v, &sa, so);
    ts_mark_output(g, so[0], "db");
    ts_mark_output(g, ts_cast(g, so[1], TS_F32), "c");
    if (mode == 1) ts_mark_output(g, v, "v");
    CHECK(ts_graph_status(g) == TS_OK, "build: %s", ts_graph_error(g));
    return g;
}

/* An inference plan of g on `threads`: the outputs c [B, T, 3D] and db [3D] */
static void run(const ts_graph *g, const shape *s, int threads, float *c, float *db) {
    const int64_t D = s->h * s->hd, nq = s->b * s->t * 3 * D, no = s->b * s->t * D;
    ts_compile_options o = ts_compile_options_default();
    o.threads = threads;
    ts_plan *p = NULL;
    CHECK_OK(ts_compile(g, NULL, &o, &p));
    if (!p) return;
    float *qkv = malloc(sizeof(float) * (size_t)nq), *dout = malloc(sizeof(float) * (size_t)no);
    for (int64_t i = 0; i < nq; i++) qkv[i] = (float)sin(0.37 * (double)i + 0.1) * 1.5f;
    for (int64_t i = 0; i < no; i++) dout[i] = (float)cos(0.23 * (double)i) * 0.01f;
    CHECK_OK(ts_plan_set_input(p, "qkv", qkv, sizeof(float) * (size_t)nq));
    CHECK_OK(ts_plan_set_input(p, "dout", dout, sizeof(float) * (size_t)no));
    CHECK_OK(ts_plan_step(p));
    CHECK_OK(ts_plan_read(p, "c", c, sizeof(float) * (size_t)nq));
    CHECK_OK(ts_plan_read(p, "db", db, sizeof(float) * 3 * (size_t)D));
    free(qkv);
    free(dout);
    ts_plan_free(p);
}

static int live(const ts_graph *g, int op) {
    int n = 0;
    for (int i = 0; i < g->n_nodes; i++) n += !g->nodes[i].dead && g->nodes[i].op == op;
    return n;
}

static void test_pattern(const shape *s) {
    const int64_t D = s->h * s->hd, nq = s->b * s->t * 3 * D;
    for (int mode = 1; mode <= 2; mode++) {
        ts_graph *g = pattern(s, mode);
        int n = -1;
        CHECK_OK(ts_pass_attn_bwd_low(g, &n));
        CHECK(n == 0 && live(g, TS_OP_REDUCE_SUM) == 1, "%s: left alone (%d rewritten)",
              mode == 1 ? "the view also an output" : "a mean", n);
        ts_graph_free(g);
    }
    ts_graph *ref = pattern(s, 0), *g = pattern(s, 0);
    int n = -1;
    CHECK_OK(ts_pass_attn_bwd_low(g, &n));
    CHECK_OK(ts_graph_compact(g, NULL));
    CHECK_OK(ts_graph_verify(g));
    const ts_node *a = NULL;
    for (int i = 0; i < g->n_nodes; i++)
        if (g->nodes[i].op == TS_OP_ATTENTION_BWD) a = &g->nodes[i];
    CHECK(n == 1 && live(g, TS_OP_REDUCE_SUM) == 0 && a && a->n_out == 2 &&
              a->a.attention.out_low == 1 && g->values[a->out[0]].t.dtype == TS_BF16 &&
              g->values[a->out[1]].t.rank == 3,
          "T=%lld H=%lld hd=%lld: rewritten (%d), no sum left, attention_bwd writes bf16 dqkv and "
          "the [1, 1, 3D] sums",
          (long long)s->t, (long long)s->h, (long long)s->hd, n);
    float *c0 = malloc(sizeof(float) * (size_t)nq), *c1 = malloc(sizeof(float) * (size_t)nq);
    float *c2 = malloc(sizeof(float) * (size_t)nq);
    float *d0 = malloc(sizeof(float) * 3 * (size_t)D), *d1 = malloc(sizeof(float) * 3 * (size_t)D);
    float *d2 = malloc(sizeof(float) * 3 * (size_t)D);
    run(ref, s, 1, c0, d0);
    run(g, s, 1, c1, d1);
    run(g, s, 2, c2, d2);
    int64_t bad = 0, off = 0, far = 0;
    for (int64_t i = 0; i < nq; i++) bad += memcmp(&c0[i], &c1[i], 4) != 0;
    for (int64_t i = 0; i < 3 * D; i++)
        off += ulps(d0[i], d1[i]) != 0, far += ulps(d0[i], d1[i]) > 1;
    CHECK(bad == 0 && far == 0,
          "T=%lld H=%lld hd=%lld: the bf16 copy bit-identical (%lld of %lld differ), the column "
          "sums within 1 ulp (%lld of %lld differ by 1 ulp, %lld by more)",
          (long long)s->t, (long long)s->h, (long long)s->hd, (long long)bad, (long long)nq,
          (long long)off, (long long)(3 * D), (long long)far);
    printf("T=%lld H=%lld hd=%lld: %lld of %lld column sums 1 ulp from the sum's\n",
           (long long)s->t, (long long)s->h, (long long)s->hd, (long long)off, (long long)(3 * D));
    CHECK(memcmp(c1, c2, sizeof(float) * (size_t)nq) == 0 &&
              memcmp(d1, d2, sizeof(float) * 3 * (size_t)D) == 0,
          "T=%lld hd=%lld: 1 and 2 threads bit-identical", (long long)s->t, (long long)s->hd);
    free(c0), free(c1), free(c2), free(d0), free(d1), free(d2);
    ts_graph_free(ref);
    ts_graph_free(g);
}

static void test_bad_input(void) {
    for (int c = 0; c < 2; c++) {
        ts_graph *g = ts_graph_new();
        const int64_t qd[5] = {1, 4, 3, 1, 2}, sd[4] = {1, 1, 4, 2}, od[4] = {1, 4, 1, 2};
        ts_attrs at = ts_attrs_zero();
        at.attention.scale = 1, at.attention.out_low = 1, at.attention.low = c == 0;
        ts_val y;
        if (c == 0) { /* split form */
            ts_val q = ts_input(g, "q", TS_F32, 4, sd), l = ts_input(g, "l", TS_F32, 3, sd);
            y = ts_node_add(g, TS_OP_ATTENTION_BWD, 6, (ts_val[]){q, q, q, q, q, l}, &at, NULL);
        } else { /* packed, without low */
            ts_val q = ts_input(g, "q", TS_F32, 5, qd), o = ts_input(g, "o", TS_F32, 4, od);
            ts_val l = ts_input(g, "l", TS_F32, 3, (const int64_t[]){1, 1, 4});
            y = ts_node_add(g, TS_OP_ATTENTION_BWD, 4, (ts_val[]){o, q, o, l}, &at, NULL);
        }
        CHECK(!ts_val_ok(y) && strstr(ts_graph_error(g), "out_low"), "out_low %s refused: %s",
              c == 0 ? "on the split form" : "without low", ts_graph_error(g));
        ts_graph_free(g);
    }
}

/* ---- a bf16 GPT ----------------------------------------------------------- */

enum { GB = SMALL_GPT_B, GT = SMALL_GPT_T, GV = SMALL_GPT_V };

static ts_plan *gpt(ts_dtype compute, int threads, int off, const char *keep,
                    ts_compiled_graph *kept) {
    ts_compile_options o = ts_compile_options_default();
    o.seed = 5;
    o.threads = threads;
    o.precision.compute = compute;
    o.precision.keep_fp32 = keep;
    o.no_attn_bwd_low_out = off;
    return small_gpt_plan(&o, kept);
}

/* rewritten attention_bwd nodes in the kept graph */
static int rewritten(const ts_compiled_graph *k) {
    int n = 0;
    for (int i = 0; i < k->graph->n_nodes; i++) {
        const ts_node *nd = &k->graph->nodes[i];
        n += !nd->dead && nd->op == TS_OP_ATTENTION_BWD && nd->a.attention.out_low == 1;
    }
    return n;
}

/* One step; every parameter's gradient into out (the parameters in the kept graph's order);
 * *is_bias marks the qkv biases' elements. Returns the loss. */
static double gpt_step(ts_plan *p, const ts_compiled_graph *k, float *out, char *is_bias) {
    int64_t tok[GB * GT], tgt[GB * GT];
    for (int i = 0; i < GB * GT; i++) tok[i] = (i * 7 + 3) % GV, tgt[i] = (i * 13 + 1) % GV;
    CHECK_OK(ts_plan_set_input(p, "tokens", tok, sizeof tok));
    CHECK_OK(ts_plan_set_input(p, "targets", tgt, sizeof tgt));
    CHECK_OK(ts_plan_step(p));
    int64_t at = 0;
    for (int v = 0; v < k->graph->n_values; v++) {
        const ts_value *val = &k->graph->values[v];
        if (val->kind != TS_VK_PARAM || !val->name) continue;
        char name[256];
        snprintf(name, sizeof name, "grad:%s", val->name);
        const int64_t n = ts_type_numel(&val->t);
        CHECK_OK(ts_plan_read(p, name, out + at, sizeof(float) * (size_t)n));
        if (is_bias) memset(is_bias + at, strstr(val->name, "c_attn.bias") != NULL, (size_t)n);
        at += n;
    }
    return ts_plan_loss(p);
}

static void test_gpt(void) {
    ts_compiled_graph k1 = {0}, k0 = {0}, k2 = {0}, kk = {0}, kf = {0};
    ts_plan *on = gpt(TS_BF16, 1, 0, NULL, &k1), *off = gpt(TS_BF16, 1, 1, NULL, &k0);
    ts_plan *on2 = gpt(TS_BF16, 2, 0, NULL, &k2), *keep = gpt(TS_BF16, 1, 0, "attention", &kk);
    ts_plan *f32 = gpt(TS_F32, 1, 0, NULL, &kf);
    if (on && off && on2 && keep && f32) {
        CHECK(rewritten(&k1) == 2 && rewritten(&k2) == 2,
              "bf16 GPT: %d attention_bwd writing bf16 dqkv and the sums (2 expected)",
              rewritten(&k1));
        CHECK(rewritten(&k0) == 0 && rewritten(&kk) == 0 && rewritten(&kf) == 0,
              "none with compile.no_attn_bwd_low_out (%d), keep_fp32 [attention] (%d), in f32 "
              "(%d)",
              rewritten(&k0), rewritten(&kk), rewritten(&kf));
        const int64_t big = 1 << 20;
        float *a = calloc((size_t)big, 4), *b = calloc((size_t)big, 4), *c = calloc((size_t)big, 4);
        char *bias = calloc((size_t)big, 1);
        double la = gpt_step(on, &k1, a, bias), lb = gpt_step(off, &k0, b, NULL);
        double lc = gpt_step(on2, &k2, c, NULL);
        int64_t n = 0, bad = 0, nb = 0, one = 0;
        for (int v = 0; v < k1.graph->n_values; v++)
            if (k1.graph->values[v].kind == TS_VK_PARAM) n += ts_type_numel(&k1.graph->values[v].t);
        for (int64_t i = 0; i < n; i++) {
            const int64_t u = ulps(a[i], b[i]);
            if (bias[i]) {
                nb++, one += u == 1, bad += u > 1;
            } else {
                bad += u != 0;
            }
        }
        CHECK(memcmp(&la, &lb, sizeof la) == 0 && bad == 0,
              "bf16 GPT, one step: loss %.9g vs %.9g (no_attn_bwd_low_out), %lld gradient values "
              "off (0 expected); of the %lld qkv bias values %lld differ by 1 ulp",
              la, lb, (long long)bad, (long long)nb, (long long)one);
        printf("bf16 GPT: %lld of %lld qkv bias gradient values 1 ulp from the sum's\n",
               (long long)one, (long long)nb);
        CHECK(memcmp(&la, &lc, sizeof la) == 0 && memcmp(a, c, sizeof(float) * (size_t)n) == 0,
              "bf16 GPT: 1 and 2 threads bit-identical (loss %.9g vs %.9g)", la, lc);
        free(a), free(b), free(c), free(bias);
    }
    ts_plan_free(on), ts_plan_free(off), ts_plan_free(on2), ts_plan_free(keep), ts_plan_free(f32);
    ts_compiled_graph_free(&k1), ts_compiled_graph_free(&k0), ts_compiled_graph_free(&k2);
    ts_compiled_graph_free(&kk), ts_compiled_graph_free(&kf);
}

int main(void) {
    const shape shapes[3] = {{2, 256, 2, 64}, {3, 70, 3, 5}, {2, 130, 2, 40}};
    for (int i = 0; i < 3; i++) test_pattern(&shapes[i]);
    test_bad_input();
    if (!ts_cpu_supports_dtype_gemm(TS_BF16)) {
        printf("skipped the bf16 GPT: %s\n", ts_cpu_dtype_gemm_why(TS_BF16));
        return check_summary("attn_bwd_low");
    }
    test_gpt();
    return check_summary("attn_bwd_low");
}
