/* The packed attention (passes/attention_qkv.c, ops/attention_fused.h): GPT-2's attention
 * on a qkv [B, T, 3 * H * hd] (slices, head permutes, output permuted back) compiled
 *
 * - with the pass: the plan has one packed attention and attention_bwd (rank-5 qkv) and no
 *   slice, permute or concat left;
 * - without it (compile.no_simplify, which the pass needs): the split form, as before;
 *
 * and the two give the same loss and gradient bits, f32 and bf16 (attention.low), on 1 and
 * 2 threads, for W3's head size over 4 blocks and for partial blocks with an odd head
 * size. Another arrangement (k and v taken from each other's slices) keeps the split form. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "check.h"
#include "plan/plan.h"

typedef struct shape {
    int64_t b, t, h, hd;
} shape;

static ts_plan *build(const shape *s, ts_dtype compute, int threads, int no_simplify, int swap_kv,
                      ts_compiled_graph *kept) {
    ts_graph *g = ts_graph_new();
    const int64_t D = s->h * s->hd, xd[3] = {s->b, s->t, 3 * D}, yd[3] = {s->b, s->t, D};
    const int64_t hdims[4] = {s->b, s->t, s->h, s->hd}, sizes[3] = {D, D, D};
    const int perm[4] = {0, 2, 1, 3};
    ts_val x = ts_param(g, "x", TS_F32, 3, xd, ts_init_normal(0, 1.0));
    ts_val y = ts_input(g, "y", TS_F32, 3, yd);
    ts_val parts[3], h[3];
    ts_split(g, x, 2, 3, sizes, parts);
    for (int i = 0; i < 3; i++) h[i] = ts_permute(g, ts_reshape(g, parts[i], 4, hdims), perm);
    ts_val o = ts_causal_attention(g, h[0], h[swap_kv ? 2 : 1], h[swap_kv ? 1 : 2]);
    o = ts_reshape(g, ts_permute(g, o, perm), 3, yd);
    ts_train_spec spec = ts_train_spec_default(ts_mse_loss(g, o, y));
    spec.opt = ts_sgd(0.0, 0, 0, 0, 0);
    ts_compile_options opt = ts_compile_options_default();
    opt.seed = 3;
    opt.threads = threads;
    opt.no_simplify = no_simplify;
    opt.precision.compute = compute;
    ts_plan *p = NULL;
    CHECK_OK(ts_compile_keep(g, &spec, &opt, &p, kept));
    ts_graph_free(g);
    return p;
}

/* One step: the loss, and grad:x into gx. */
static double step(const shape *s, ts_plan *p, float *gx) {
    const int64_t n = s->b * s->t * s->h * s->hd;
    float *y = malloc(sizeof(float) * (size_t)n);
    for (int64_t i = 0; i < n; i++) y[i] = (float)cos(0.11 * (double)i);
    CHECK_OK(ts_plan_set_input(p, "y", y, sizeof(float) * (size_t)n));
    CHECK_OK(ts_plan_step(p));
    CHECK_OK(ts_plan_read(p, "grad:x", gx, sizeof(float) * 3 * (size_t)n));
    free(y);
    return ts_plan_loss(p);
}

/* Live nodes of op in the kept graph; *packed: how many attention nodes read a rank-5 q. */
static int count(const ts_compiled_graph *k, int op, int *packed) {
    int n = 0;
    for (int i = 0; i < k->graph->n_nodes; i++) {
        const ts_node *nd = &k->graph->nodes[i];
        if (nd->dead || nd->op != op) continue;
        n++;
        if (packed && (op == TS_OP_ATTENTION || op == TS_OP_ATTENTION_BWD))
            *packed += k->graph->values[nd->in[op == TS_OP_ATTENTION ? 0 : 1]].t.rank == 5;
    }
    return n;
}

static void test_shape(const shape *s, ts_dtype compute) {
    const char *pr = compute == TS_BF16 ? "bf16" : "f32";
    const int64_t n3 = 3 * s->b * s->t * s->h * s->hd;
    float *gs = malloc(sizeof(float) * (size_t)n3), *gp = malloc(sizeof(float) * (size_t)n3);
    for (int threads = 1; threads <= 2; threads++) {
        ts_compiled_graph ks = {0}, kp = {0};
        ts_plan *split = build(s, compute, threads, 1, 0, &ks);
        ts_plan *packed = build(s, compute, threads, 0, 0, &kp);
        if (!split || !packed) {
            ts_plan_free(split), ts_plan_free(packed);
            ts_compiled_graph_free(&ks), ts_compiled_graph_free(&kp);
            continue;
        }
        int np = 0, ns = 0;
        int na = count(&kp, TS_OP_ATTENTION, &np) + count(&kp, TS_OP_ATTENTION_BWD, &np);
        int left = count(&kp, TS_OP_PERMUTE, NULL) + count(&kp, TS_OP_SLICE, NULL) +
                   count(&kp, TS_OP_CONCAT, NULL);
        CHECK(na == 2 && np == 2 && left == 0,
              "%s T=%lld H=%lld hd=%lld: %d attention ops, %d packed (2, 2 expected), %d "
              "slices, permutes and concats left (0 expected)",
              pr, (long long)s->t, (long long)s->h, (long long)s->hd, na, np, left);
        count(&ks, TS_OP_ATTENTION, &ns);
        CHECK(ns == 0 && count(&ks, TS_OP_PERMUTE, NULL) > 0,
              "%s: without simplify the split form stays", pr);
        double ls = step(s, split, gs), lp = step(s, packed, gp);
        int64_t bad = 0;
        for (int64_t i = 0; i < n3; i++) bad += memcmp(&gs[i], &gp[i], sizeof(float)) != 0;
        CHECK(memcmp(&ls, &lp, sizeof ls) == 0 && bad == 0,
              "%s T=%lld H=%lld hd=%lld, %d threads: packed loss %.9g vs split %.9g, %lld of "
              "%lld gradient values differ (the same bits expected)",
              pr, (long long)s->t, (long long)s->h, (long long)s->hd, threads, lp, ls,
              (long long)bad, (long long)n3);
        ts_plan_free(split);
        ts_plan_free(packed);
        ts_compiled_graph_free(&ks);
        ts_compiled_graph_free(&kp);
    }
    free(gs);
    free(gp);
}

static void test_other_arrangement(void) {
    const shape s = {1, 20, 2, 4};
    ts_compiled_graph k = {0};
    ts_plan *p = build(&s, TS_F32, 1, 0, 1, &k);
    if (p) {
        int np = 0;
        count(&k, TS_OP_ATTENTION, &np);
        CHECK(np == 0 && count(&k, TS_OP_PERMUTE, NULL) > 0,
              "k and v from each other's slices: %d packed (0 expected)", np);
    }
    ts_plan_free(p);
    ts_compiled_graph_free(&k);
}

int main(void) {
    /* W3's head size over 4 key blocks (2 threads share the heads); partial blocks, an odd
     * head size and 3 heads */
    const shape shapes[2] = {{2, 256, 2, 64}, {2, 70, 3, 5}};
    for (int i = 0; i < 2; i++) {
        test_shape(&shapes[i], TS_F32);
        test_shape(&shapes[i], TS_BF16);
    }
    test_other_arrangement();
    return check_summary("attention_qkv");
}
