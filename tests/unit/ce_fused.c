/* cross_entropy_fused (ops/loss.c) and the fuse_ce pass (passes/fuse_ce.c):
 * the cross-entropy forward and backward in one pass over the logits.
 *
 * - the kernel, bit for bit against cross_entropy followed by
 *   cross_entropy_bwd: loss, lse and the gradient, f32 and bf16 (out_low)
 *   gradients, many classes (W3's 8192, 2500: not a multiple of the lanes)
 *   and few (the class-by-class form), ignored rows, class weights, i32 and
 *   i64 targets, more rows than one block, the gradient written over the
 *   logits (in place), 1 and 2 threads; every row ignored gives NaN as the
 *   forward does;
 * - bad input: f64 logits, a row range, out_low 2 refused by inference; an
 *   out-of-range target is reported with its row;
 * - the pass: a small head (h -> logits -> cross entropy) compiles to one
 *   cross_entropy_fused and trains to the same bits as with
 *   compile.no_fuse_ce, also with a static loss scale (the seed, scale
 *   times 1, is built after the forward and moves before it) and in bf16;
 *   logits read by another node, or a seed that reads the loss, leave the
 *   two ops alone. */
#include <math.h>
#include <omp.h>
#include <stdlib.h>
#include <string.h>
#include "check.h"
#include "ops/op.h"
#include "passes/passes.h"
#include "plan/plan.h"

static ts_step_ctx k_ctx = {1, 0, 0.0, 1};

typedef struct ce_case {
    int64_t rows, c;
    int weighted, is64, low, inplace, all_ignored;
} ce_case;

static void kernel_case(ce_case q) {
    const int64_t n = q.rows, c = q.c, ign = -100;
    float *x = malloc(sizeof(float) * (size_t)(n * c)),
          *x2 = malloc(sizeof(float) * (size_t)(n * c));
    float *d_ref = malloc(sizeof(float) * (size_t)(n * c)),
          *d_f = malloc(sizeof(float) * (size_t)(n * c));
    float *lse_ref = malloc(sizeof(float) * (size_t)n), *lse_f = malloc(sizeof(float) * (size_t)n);
    float *wt = malloc(sizeof(float) * (size_t)c);
    int64_t *t64 = malloc(sizeof(int64_t) * (size_t)n);
    int32_t *t32 = malloc(sizeof(int32_t) * (size_t)n);
    char part_ref[4096], part_f[4096];
    for (int64_t i = 0; i < n * c; i++)
        x[i] = (float)(4.0 * sin(0.37 * (double)i) + 0.5 * cos(0.011 * (double)i));
    x[3] = 80.0f, x[c + 1] = -90.0f; /* large logits: exp clamps */
    for (int64_t r = 0; r < n; r++) {
        t64[r] = q.all_ignored || r % 11 == 4 ? ign : (r * 7919) % c;
        t32[r] = (int32_t)t64[r];
    }
    for (int64_t i = 0; i < c; i++) wt[i] = 0.5f + 0.1f * (float)(i % 9);
    float dl = 0.75f, loss_ref = 0, loss_f = 0;
    ts_tensor tg = {q.is64 ? TS_I64 : TS_I32, 1, {n}, q.is64 ? (void *)t64 : (void *)t32};
    ts_tensor lg = {TS_F32, 2, {n, c}, x}, w = {TS_F32, 1, {c}, wt}, dlt = {TS_F32, 0, {0}, &dl};
    ts_attrs a = ts_attrs_zero();
    a.cross_entropy.ignore_index = ign, a.cross_entropy.out_low = q.low;
    /* the two ops */
    ts_tensor fin[3] = {lg, tg, w};
    ts_tensor fout[2] = {{TS_F32, 0, {0}, &loss_ref}, {TS_F32, 1, {n}, lse_ref}};
    ts_kargs kf = {&a, 2 + q.weighted, 2, fin, fout, part_ref, sizeof part_ref, &k_ctx, "ce", NULL};
    CHECK_OK(ts_op_get(TS_OP_CROSS_ENTROPY)->kernel(&kf));
    ts_tensor bin[5] = {dlt, lg, tg, fout[1], w};
    ts_tensor bout = {q.low ? TS_BF16 : TS_F32, 2, {n, c}, d_ref};
    ts_kargs kb = {&a, 4 + q.weighted, 1, bin, &bout, NULL, 0, &k_ctx, "ce", NULL};
    CHECK_OK(ts_op_get(TS_OP_CROSS_ENTROPY_BWD)->kernel(&kb));
    /* the fused op, on a copy of the logits that it may overwrite */
    memcpy(x2, x, sizeof(float) * (size_t)(n * c));
    ts_tensor in[4] = {dlt, {TS_F32, 2, {n, c}, x2}, tg, w};
    ts_tensor out[3] = {{q.low ? TS_BF16 : TS_F32, 2, {n, c}, q.inplace ? x2 : d_f},
                        {TS_F32, 0, {0}, &loss_f},
                        {TS_F32, 1, {n}, lse_f}};
    ts_kargs k = {&a, 3 + q.weighted, 3, in, out, part_f, sizeof part_f, &k_ctx, "ce", NULL};
    CHECK_OK(ts_op_get(TS_OP_CROSS_ENTROPY_FUSED)->kernel(&k));
    const float *d = q.inplace ? x2 : d_f;
    const size_t db = (size_t)(n * c) * (q.low ? 2 : 4);
    char what[128];
    snprintf(what, sizeof what, "rows %lld c %lld weighted %d i64 %d low %d inplace %d threads %d",
             (long long)n, (long long)c, q.weighted, q.is64, q.low, q.inplace,
             omp_get_max_threads());
    CHECK(!memcmp(&loss_f, &loss_ref, sizeof loss_f), "%s: loss %.9g, two ops %.9g", what,
          (double)loss_f, (double)loss_ref);
    CHECK(!q.all_ignored || isnan(loss_f), "%s: every row ignored gives NaN, got %g", what,
          (double)loss_f);
    CHECK(!memcmp(lse_f, lse_ref, sizeof(float) * (size_t)n), "%s: lse differs", what);
    CHECK(!memcmp(d, d_ref, db), "%s: gradient differs from cross_entropy_bwd's", what);
    free(x), free(x2), free(d_ref), free(d_f), free(lse_ref), free(lse_f), free(wt), free(t64),
        free(t32);
}

static void test_kernel(void) {
    for (int th = 1; th <= 2; th++) {
        omp_set_num_threads(th);
        for (int low = 0; low < 2; low++) {
            kernel_case((ce_case){130, 8192, 0, 1, low, 0, 0}); /* W3's rows, 3 blocks */
            kernel_case((ce_case){70, 2500, 1, 0, low, 0, 0});
            kernel_case((ce_case){130, 5, 0, 1, low, 0, 0}); /* few classes */
            kernel_case((ce_case){70, 5, 1, 0, low, 0, 0});
            kernel_case((ce_case){9, 3, 1, 1, low, 0, 1});
        }
        kernel_case((ce_case){130, 2500, 1, 1, 0, 1, 0}); /* in place over the logits */
        kernel_case((ce_case){130, 7, 0, 0, 0, 1, 0});
    }
    omp_set_num_threads(1);
}

static void test_bad_input(void) {
    const int64_t d2[2] = {3, 4}, d1[1] = {3};
    for (int bad = 0; bad < 3; bad++) {
        ts_graph *g = ts_graph_new();
        ts_val x = ts_input(g, "x", bad == 0 ? TS_F64 : TS_F32, 2, d2);
        ts_val t = ts_input(g, "t", TS_I64, 1, d1);
        ts_val dl = ts_input(g, "dl", bad == 0 ? TS_F64 : TS_F32, 0, NULL);
        ts_attrs a = ts_attrs_zero();
        a.cross_entropy.ignore_index = -100;
        if (bad == 1) a.cross_entropy.row_count = 2;
        if (bad == 2) a.cross_entropy.out_low = 2;
        ts_val v = ts_node_add(g, TS_OP_CROSS_ENTROPY_FUSED, 3, (ts_val[]){dl, x, t}, &a, NULL);
        const char *want[3] = {"f32", "row", "out_low"};
        CHECK(!ts_val_ok(v) && strstr(ts_last_error(), want[bad]), "case %d refused, naming %s: %s",
              bad, want[bad], ts_last_error());
        ts_graph_free(g);
    }
    /* a target out of range: the row and the value in the message */
    float x[12] = {0}, dl = 1, loss, lse[3], d[12];
    int64_t t[3] = {1, 4, 0};
    char part[256];
    ts_tensor in[3] = {{TS_F32, 0, {0}, &dl}, {TS_F32, 2, {3, 4}, x}, {TS_I64, 1, {3}, t}};
    ts_tensor out[3] = {{TS_F32, 2, {3, 4}, d}, {TS_F32, 0, {0}, &loss}, {TS_F32, 1, {3}, lse}};
    ts_attrs a = ts_attrs_zero();
    a.cross_entropy.ignore_index = -100;
    ts_kargs k = {&a, 3, 3, in, out, part, sizeof part, &k_ctx, "loss", NULL};
    ts_status s = ts_op_get(TS_OP_CROSS_ENTROPY_FUSED)->kernel(&k);
    CHECK(s == TS_ERR_INVALID && strstr(ts_last_error(), "target[1] = 4"),
          "a bad target is reported: %s", ts_last_error());
}

/* h [n, d] (trained) -> logits = h W^T [n, v] -> cross entropy; `extra`: a second reader of
 * the logits (their mean, added to the loss with weight 0.001). */
typedef struct head {
    ts_graph *g;
    ts_val h, loss;
    int64_t n, v, d;
    int64_t *tg;
} head;

static void head_build(head *m, int64_t n, int64_t v, int64_t d, int extra) {
    memset(m, 0, sizeof *m);
    m->n = n, m->v = v, m->d = d;
    m->g = ts_graph_new();
    const int64_t dh[2] = {n, d}, dw[2] = {v, d}, dt[1] = {n};
    m->h = ts_param(m->g, "h", TS_F32, 2, dh, ts_init_normal(0, 1));
    ts_val w = ts_param(m->g, "w", TS_F32, 2, dw, ts_init_normal(0, 0.05));
    ts_val t = ts_input(m->g, "targets", TS_I64, 1, dt);
    ts_val logits = ts_matmul(m->g, m->h, w, 0, 1);
    m->loss = ts_cross_entropy(m->g, logits, t, -100);
    if (extra)
        m->loss = ts_add(m->g, m->loss,
                         ts_affine_scalar(m->g, ts_mean(m->g, logits, 0, NULL, 0), 0.001, 0.0));
    m->tg = malloc(sizeof(int64_t) * (size_t)n);
    for (int64_t i = 0; i < n; i++) m->tg[i] = i % 9 == 2 ? -100 : (i * 31) % v;
}

typedef struct result {
    float *h;
    double loss;
    int fused, bwd;
} result;

static result train(head *m, int no_fuse_ce, ts_dtype compute, ts_loss_scale_kind scale) {
    result r = {0};
    ts_train_spec spec = ts_train_spec_default(m->loss);
    spec.opt = ts_sgd(0.5, 0, 0, 0, 0);
    ts_compile_options o = ts_compile_options_default();
    o.no_fuse_ce = no_fuse_ce;
    o.threads = 2;
    o.precision.compute = compute;
    o.precision.loss_scale = scale;
    o.precision.init_scale = 1024;
    ts_plan *p = NULL;
    ts_compiled_graph k;
    ts_status s = ts_compile_keep(m->g, &spec, &o, &p, &k);
    CHECK(s == TS_OK, "compile: %s", ts_last_error());
    if (s != TS_OK) return r;
    for (int i = 0; i < k.n_order; i++) {
        const int op = k.graph->nodes[k.order[i]].op;
        r.fused += op == TS_OP_CROSS_ENTROPY_FUSED;
        r.bwd += op == TS_OP_CROSS_ENTROPY_BWD;
    }
    ts_compiled_graph_free(&k);
    for (int step = 0; step < 2; step++) {
        CHECK_OK(ts_plan_set_input(p, "targets", m->tg, sizeof(int64_t) * (size_t)m->n));
        CHECK_OK(ts_plan_step(p));
    }
    const size_t hb = sizeof(float) * (size_t)(m->n * m->d);
    r.h = malloc(hb);
    CHECK_OK(ts_plan_read(p, "h", r.h, hb));
    r.loss = ts_plan_loss(p);
    ts_plan_free(p);
    return r;
}

static void compare(const char *label, head *m, ts_dtype compute, ts_loss_scale_kind scale,
                    int want_fused) {
    result a = train(m, 1, compute, scale), b = train(m, 0, compute, scale);
    const size_t hb = sizeof(float) * (size_t)(m->n * m->d);
    CHECK(a.h && b.h && !memcmp(a.h, b.h, hb), "%s: trained h differs with the fused op", label);
    CHECK(!memcmp(&a.loss, &b.loss, sizeof a.loss), "%s: loss %.9g fused vs %.9g", label, b.loss,
          a.loss);
    CHECK(a.fused == 0 && a.bwd == 1, "%s: compile.no_fuse_ce keeps the two ops (%d fused)", label,
          a.fused);
    CHECK(b.fused == want_fused && b.bwd == 1 - want_fused, "%s: %d fused, %d backward (want %d)",
          label, b.fused, b.bwd, want_fused);
    free(a.h);
    free(b.h);
}

/* The pass alone: a seed computed from the loss cannot be ready before the forward. */
static void test_seed_reads_loss(void) {
    ts_graph *g = ts_graph_new();
    const int64_t d2[2] = {4, 6}, d1[1] = {4};
    ts_val x = ts_input(g, "x", TS_F32, 2, d2), t = ts_input(g, "t", TS_I64, 1, d1);
    ts_val loss = ts_cross_entropy(g, x, t, -100);
    const ts_node *f = &g->nodes[g->values[loss.id].node];
    ts_val lse = ts_mkval(f->out[1]);
    ts_val dl = ts_affine_scalar(g, loss, 0.0, 1.0);
    ts_attrs a = ts_attrs_zero();
    a.cross_entropy.ignore_index = -100;
    ts_val d = ts_node_add(g, TS_OP_CROSS_ENTROPY_BWD, 4, (ts_val[]){dl, x, t, lse}, &a, NULL);
    CHECK_OK(ts_mark_output(g, d, "d"));
    int n = -1;
    CHECK_OK(ts_pass_fuse_ce(g, &n));
    CHECK(n == 0, "a seed reading the loss: %d fused", n);
    /* the same with a constant seed fuses, and the graph stays valid */
    ts_graph_free(g);
    g = ts_graph_new();
    x = ts_input(g, "x", TS_F32, 2, d2), t = ts_input(g, "t", TS_I64, 1, d1);
    loss = ts_cross_entropy(g, x, t, -100);
    lse = ts_mkval(g->nodes[g->values[loss.id].node].out[1]);
    dl = ts_input(g, "dl", TS_F32, 0, NULL);
    d = ts_node_add(g, TS_OP_CROSS_ENTROPY_BWD, 4, (ts_val[]){dl, x, t, lse}, &a, NULL);
    CHECK_OK(ts_mark_output(g, d, "d"));
    CHECK_OK(ts_pass_fuse_ce(g, &n));
    CHECK(n == 1, "a seed given as an input: %d fused", n);
    const ts_value *dv = &g->values[d.id];
    CHECK(dv->node == g->values[loss.id].node && dv->out_index == 0 &&
              g->nodes[dv->node].op == TS_OP_CROSS_ENTROPY_FUSED,
          "the gradient is the fused node's output 0");
    CHECK_OK(ts_graph_verify(g));
    ts_graph_free(g);
}

int main(void) {
    test_kernel();
    test_bad_input();
    test_seed_reads_loss();
    head m;
    head_build(&m, 200, 700, 24, 0);
    compare("head f32", &m, TS_F32, TS_SCALE_NONE, 1);
    compare("head f32, static loss scale", &m, TS_F32, TS_SCALE_STATIC, 1);
    compare("head bf16", &m, TS_BF16, TS_SCALE_NONE, 1);
    free(m.tg);
    ts_graph_free(m.g);
    head_build(&m, 200, 700, 24, 1);
    compare("logits read by another node", &m, TS_F32, TS_SCALE_NONE, 0);
    free(m.tg);
    ts_graph_free(m.g);
    return check_summary("ce_fused");
}
