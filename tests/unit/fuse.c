/* The fusion pass and its kernels: grouping rules on small graphs, every
 * fused kernel against the unfused (reference) kernels on random inputs and
 * shapes with broadcasting, GEMM epilogues through oneDNN post-ops, and
 * training with and without fusion. */
#include <stdlib.h>
#include <string.h>
#include "check.h"
#include "ops/fused.h"
#include "ops/op.h"
#include "passes/passes.h"

static unsigned g_seed = 7;
static float frand(void) {
    return (float)rand_r(&g_seed) / (float)RAND_MAX * 4.0f - 2.0f;
}

/* ---- running a graph --------------------------------------------------------- */

enum { MAX_IN = 12 };
typedef struct feed {
    const char *name[MAX_IN];
    void *data[MAX_IN];
    size_t bytes[MAX_IN];
    int n;
} feed;

static ts_val input(ts_graph *g, feed *f, const char *name, ts_dtype dt, int rank,
                    const int64_t *dims) {
    size_t n = 1;
    for (int i = 0; i < rank; i++) n *= (size_t)dims[i];
    f->name[f->n] = name;
    f->bytes[f->n] = n * ts_dtype_size(dt);
    f->data[f->n] = malloc(f->bytes[f->n]);
    for (size_t i = 0; i < n; i++) {
        if (dt == TS_U8)
            ((unsigned char *)f->data[f->n])[i] = rand_r(&g_seed) & 1;
        else
            ((float *)f->data[f->n])[i] = frand();
    }
    f->n++;
    return ts_input(g, name, dt, rank, dims);
}

static void feed_free(feed *f) {
    for (int i = 0; i < f->n; i++) free(f->data[i]);
}

/* Output "out" of an inference plan; *n_ins gets its instruction count. */
static float *run(ts_graph *g, const feed *f, int no_fuse, int reference, int threads, size_t bytes,
                  int *n_ins) {
    ts_compile_options o = ts_compile_options_default();
    o.no_fuse = no_fuse;
    o.reference_kernels = reference;
    o.threads = threads;
    ts_plan *p;
    ts_status s = ts_compile(g, NULL, &o, &p);
    CHECK(s == TS_OK, "compile: %s", ts_last_error());
    if (s != TS_OK) return NULL;
    for (int i = 0; i < f->n; i++)
        CHECK_OK(ts_plan_set_input(p, f->name[i], f->data[i], f->bytes[i]));
    CHECK_OK(ts_plan_step(p));
    float *out = malloc(bytes);
    CHECK_OK(ts_plan_read(p, "out", out, bytes));
    ts_plan_stats st;
    ts_plan_get_stats(p, &st);
    if (n_ins) *n_ins = st.n_instructions;
    ts_plan_free(p);
    return out;
}

/* Elements equal (== : -0.0 equals +0.0; NaN equals NaN). */
static int64_t mismatches(const float *a, const float *b, int64_t n) {
    int64_t bad = 0;
    for (int64_t i = 0; i < n; i++) bad += !(a[i] == b[i] || (a[i] != a[i] && b[i] != b[i]));
    return bad;
}

/* Fused vs unfused on both thread counts: bit-identical. */
static void compare(const char *label, ts_graph *g, ts_val out, const feed *f, int expect_fewer) {
    CHECK_OK(ts_mark_output(g, out, "out"));
    size_t bytes = (size_t)ts_numel(g, out) * sizeof(float);
    int ni_ref = 0, ni_fused = 0;
    float *ref = run(g, f, 1, 0, 2, bytes, &ni_ref);
    for (int threads = 1; threads <= 2; threads++) {
        float *fu = run(g, f, 0, 0, threads, bytes, &ni_fused);
        if (ref && fu)
            CHECK(!memcmp(ref, fu, bytes),
                  "%s (%d threads): fused differs from unfused in %lld "
                  "elements",
                  label, threads, (long long)mismatches(ref, fu, (int64_t)(bytes / 4)));
        free(fu);
    }
    if (expect_fewer)
        CHECK(ni_fused < ni_ref, "%s: %d instructions fused vs %d unfused", label, ni_fused,
              ni_ref);
    free(ref);
}

/* ---- fused elementwise kernels ---------------------------------------------------- */

static ts_val unary_bwd(ts_graph *g, int fwd, int side, ts_val dy, ts_val s, int64_t approx) {
    ts_attrs a = ts_attrs_zero();
    a.unary_bwd.fwd_op = fwd;
    a.unary_bwd.side = side;
    a.unary_bwd.fwd.approx = approx;
    ts_val in[2] = {dy, s};
    return ts_node_add(g, TS_OP_UNARY_BWD, 2, in, &a, NULL);
}

static ts_val maxmin_bwd(ts_graph *g, ts_val dy, ts_val a, ts_val b, int min, int side) {
    ts_attrs at = ts_attrs_zero();
    at.maxmin.min = min;
    at.maxmin.side = side;
    ts_val in[3] = {dy, a, b};
    return ts_node_add(g, TS_OP_MAXMIN_BWD, 3, in, &at, NULL);
}

/* Every fusable op in a few trees, with bias-row, column, scalar and
 * middle-axis broadcasting, on a shape with a partial last tile. */
static void check_eltwise_ops(const int64_t *d) {
    int64_t row[1] = {d[2]}, col[3] = {d[0], d[1], 1}, mid[3] = {d[0], 1, d[2]}, one[1] = {1};
    feed f = {0};
    ts_graph *g = ts_graph_new();
    ts_val a = input(g, &f, "a", TS_F32, 3, d), b = input(g, &f, "b", TS_F32, 1, row);
    ts_val c = input(g, &f, "c", TS_F32, 3, col), e = input(g, &f, "e", TS_F32, 3, mid);
    ts_val s = input(g, &f, "s", TS_F32, 1, one), x = input(g, &f, "x", TS_F32, 3, d);
    ts_val cond = input(g, &f, "cond", TS_U8, 3, col);
    /* tree 1: arithmetic and activations */
    ts_val t = ts_add(g, ts_mul(g, a, b), c);
    t = ts_gelu(g, t, TS_GELU_TANH);
    t = ts_div(g, t, ts_affine_scalar(g, ts_abs(g, e), 1.0, 1.5));
    t = ts_maximum(g, ts_sub(g, t, s), ts_minimum(g, ts_neg(g, x), b));
    t = ts_where(g, cond, t, ts_sigmoid(g, ts_tanh(g, a)));
    t = ts_leaky_relu(g, ts_add(g, t, ts_gelu(g, x, TS_GELU_ERF)), 0.1);
    /* tree 2: exp/log/sqrt/rsqrt/pow on positive values; relu */
    ts_val pos = ts_affine_scalar(g, ts_abs(g, t), 1.0, 0.5);
    ts_val u =
        ts_add(g, ts_log(g, pos), ts_sqrt(g, ts_pow_scalar(g, ts_exp(g, ts_neg(g, pos)), 3.0)));
    u = ts_mul(g, ts_rsqrt(g, ts_pow_scalar(g, pos, 0.5)), ts_relu(g, u));
    /* tree 3: backward helpers (unary_bwd from x and y, maxmin_bwd) */
    ts_val y = ts_sigmoid(g, x);
    ts_val v = unary_bwd(g, TS_OP_SIGMOID, 1, u, y, 0);
    v = ts_add(g, v, unary_bwd(g, TS_OP_GELU, 0, ts_mul(g, u, a), x, TS_GELU_TANH));
    v = ts_add(g, v, unary_bwd(g, TS_OP_RELU, 1, ts_sub(g, u, a), ts_relu(g, a), 0));
    v = ts_add(g, v, maxmin_bwd(g, ts_neg(g, u), a, b, 0, 0));
    v = ts_add(g, v, maxmin_bwd(g, ts_neg(g, u), x, e, 1, 1));
    /* tree 4: the first input broadcasts (lower rank than the output) */
    v = ts_add(g, v, ts_relu(g, ts_add(g, s, ts_mul(g, b, ts_neg(g, a)))));
    CHECK(ts_graph_status(g) == TS_OK, "building: %s", ts_graph_error(g));
    char label[64];
    snprintf(label, sizeof label, "eltwise [%lld,%lld,%lld]", (long long)d[0], (long long)d[1],
             (long long)d[2]);
    compare(label, g, v, &f, 1);
    ts_graph_free(g);
    feed_free(&f);
}

/* ---- grouping rules (the pass alone) ------------------------------------------------ */

static int live_ops(const ts_graph *g, int op) {
    int k = 0;
    for (int i = 0; i < g->n_nodes; i++) k += !g->nodes[i].dead && g->nodes[i].op == op;
    return k;
}

static void check_grouping(void) {
    int64_t d[2] = {8, 16}, one[1] = {1};
    ts_fuse_stats st;
    /* a chain of three becomes one group */
    ts_graph *g = ts_graph_new();
    ts_val a = ts_input(g, "a", TS_F32, 2, d), b = ts_input(g, "b", TS_F32, 2, d);
    ts_val y = ts_relu(g, ts_mul(g, ts_add(g, a, b), b));
    ts_mark_output(g, y, "y");
    CHECK_OK(ts_pass_fuse(g, &st));
    CHECK(st.groups == 1 && st.nodes_fused == 3, "chain: %d groups, %d nodes", st.groups,
          st.nodes_fused);
    CHECK(live_ops(g, TS_OP_FUSED_ELTWISE) == 1 && live_ops(g, TS_OP_ADD) == 0, "chain: ops left");
    CHECK(g->values[y.id].node >= 0 && g->nodes[g->values[y.id].node].op == TS_OP_FUSED_ELTWISE,
          "chain: the output keeps its value, produced by the fused node");
    CHECK_OK(ts_graph_compact(g, NULL));
    CHECK_OK(ts_graph_verify(g));
    ts_graph_free(g);

    /* a value read twice stays materialised: two groups around it */
    g = ts_graph_new();
    a = ts_input(g, "a", TS_F32, 2, d);
    ts_val t = ts_exp(g, ts_neg(g, a));
    y = ts_add(g, ts_tanh(g, t), ts_sigmoid(g, t));
    ts_mark_output(g, y, "y");
    CHECK_OK(ts_pass_fuse(g, &st));
    CHECK(st.groups == 2 && st.nodes_fused == 5, "shared value: %d groups, %d nodes", st.groups,
          st.nodes_fused);
    CHECK(g->nodes[g->values[t.id].node].op == TS_OP_FUSED_ELTWISE, "shared value: materialised");
    ts_graph_free(g);

    /* an observable value is not swallowed; a smaller-shape producer stays outside */
    g = ts_graph_new();
    a = ts_input(g, "a", TS_F32, 2, d);
    ts_val s = ts_input(g, "s", TS_F32, 1, one);
    t = ts_relu(g, a);
    ts_mark_output(g, t, "t");
    y = ts_mul(g, ts_neg(g, t), ts_exp(g, s));
    ts_mark_output(g, y, "y");
    CHECK_OK(ts_pass_fuse(g, &st));
    CHECK(st.groups == 1 && st.nodes_fused == 2, "observable/broadcast: %d groups, %d nodes",
          st.groups, st.nodes_fused);
    CHECK(g->nodes[g->values[t.id].node].op == TS_OP_RELU, "observable value kept");
    CHECK(live_ops(g, TS_OP_EXP) == 1, "the [1]-shaped exp stays its own op");
    ts_graph_free(g);

    /* limits: 20 instructions split 16 + 4 (TS_FUSE_MAX_INSTR); a sum of 10
     * inputs splits 7 adds (8 inputs, TS_FUSE_MAX_EXT) + 2 adds */
    g = ts_graph_new();
    a = ts_input(g, "a", TS_F32, 2, d);
    y = a;
    for (int i = 0; i < 20; i++) y = ts_affine_scalar(g, y, 0.5, 1.0);
    ts_mark_output(g, y, "y");
    ts_val xs[10], sum;
    char nm[8];
    for (int i = 0; i < 10; i++) {
        snprintf(nm, sizeof nm, "x%d", i);
        xs[i] = ts_input(g, nm, TS_F32, 2, d);
    }
    sum = xs[0];
    for (int i = 1; i < 10; i++) sum = ts_add(g, sum, xs[i]);
    ts_mark_output(g, sum, "sum");
    CHECK_OK(ts_pass_fuse(g, &st));
    CHECK(st.groups == 4 && st.nodes_fused == 29, "limits: %d groups, %d nodes", st.groups,
          st.nodes_fused);
    for (int i = 0; i < g->n_nodes; i++) {
        const ts_node *n = &g->nodes[i];
        if (n->dead || n->op != TS_OP_FUSED_ELTWISE) continue;
        CHECK(n->a.fused.n_instr <= TS_FUSE_MAX_INSTR && n->a.fused.n_ext <= TS_FUSE_MAX_EXT,
              "limits: group of %lld instructions, %lld inputs", (long long)n->a.fused.n_instr,
              (long long)n->a.fused.n_ext);
    }
    CHECK_OK(ts_graph_compact(g, NULL));
    CHECK_OK(ts_graph_verify(g));
    ts_graph_free(g);

    /* f64 is left alone; a lone op is not a group */
    g = ts_graph_new();
    a = ts_input(g, "a", TS_F64, 2, d);
    y = ts_relu(g, ts_neg(g, a));
    ts_mark_output(g, y, "y");
    ts_val z = ts_relu(g, ts_input(g, "b", TS_F32, 2, d));
    ts_mark_output(g, z, "z");
    CHECK_OK(ts_pass_fuse(g, &st));
    CHECK(st.groups == 0 && st.epilogues == 0, "f64 / lone op: %d groups", st.groups);
    ts_graph_free(g);

    /* epilogue: matmul -> +bias, then a relu ends it (oneDNN's relu post-op
     * would turn NaN into 0); a second reader stops it */
    int64_t xd[2] = {8, 32}, wd[2] = {16, 32}, bd[1] = {16};
    g = ts_graph_new();
    ts_val x = ts_input(g, "x", TS_F32, 2, xd), w = ts_input(g, "w", TS_F32, 2, wd);
    ts_val bias = ts_input(g, "b", TS_F32, 1, bd), r = ts_input(g, "r", TS_F32, 2, d);
    ts_val mm = ts_matmul(g, x, w, 0, 1);
    ts_val pre = ts_add(g, mm, bias);
    y = ts_add(g, r, ts_relu(g, pre));
    ts_mark_output(g, y, "y");
    ts_val mm2 = ts_matmul(g, x, w, 0, 1);
    ts_val z2 = ts_add(g, mm2, bias);
    ts_mark_output(g, ts_mul(g, z2, mm2), "z");
    CHECK_OK(ts_pass_fuse(g, &st));
    CHECK(st.epilogues == 1, "epilogue: %d made", st.epilogues);
    const ts_node *pn = &g->nodes[g->values[pre.id].node];
    CHECK(pn->op == TS_OP_MATMUL_EPI && pn->a.matmul_epi.n_post == 1 &&
              pn->a.matmul_epi.post[0] == TS_EPI_ADD && pn->n_in == 3 && pn->in[2] == bias.id,
          "epilogue: the bias post-op only");
    CHECK(live_ops(g, TS_OP_RELU) + live_ops(g, TS_OP_FUSED_ELTWISE) >= 1,
          "the relu stays outside the GEMM");
    CHECK(live_ops(g, TS_OP_MATMUL) == 1, "a matmul read twice keeps its own output");
    CHECK_OK(ts_graph_compact(g, NULL));
    CHECK_OK(ts_graph_verify(g));
    ts_graph_free(g);
}

/* ---- sums of slice gradients -> concat ------------------------------------------------ */

static ts_val slice_bwd(ts_graph *g, ts_val dy, int axis, int64_t start, int64_t end,
                        int64_t extent) {
    ts_attrs a = ts_attrs_zero();
    a.slice.axis = axis;
    a.slice.start = start;
    a.slice.end = end;
    a.slice.extent = extent;
    return ts_node_add(g, TS_OP_SLICE_BWD, 1, &dy, &a, NULL);
}

static void check_concat(void) {
    int64_t da[3] = {4, 3, 5}, db[3] = {4, 3, 7}, dc[3] = {4, 3, 2};
    /* pieces in scrambled order that tile [0, 14): one concat, same values */
    feed f = {0};
    ts_graph *g = ts_graph_new();
    ts_val a = input(g, &f, "a", TS_F32, 3, da), b = input(g, &f, "b", TS_F32, 3, db);
    ts_val c = input(g, &f, "c", TS_F32, 3, dc);
    ts_val y = ts_add(g, slice_bwd(g, b, 2, 5, 12, 14),
                      ts_add(g, slice_bwd(g, c, 2, 12, 14, 14), slice_bwd(g, a, 2, 0, 5, 14)));
    compare("slice_bwd sum", g, y, &f, 1);
    ts_fuse_stats st;
    ts_graph *g2 = ts_graph_clone(g);
    CHECK_OK(ts_pass_fuse(g2, &st));
    CHECK(st.concats == 1 && live_ops(g2, TS_OP_CONCAT) == 1 && live_ops(g2, TS_OP_ADD) == 0,
          "slice_bwd sum: %d concats", st.concats);
    ts_graph_free(g2);
    ts_graph_free(g);
    feed_free(&f);
    /* a gap at [12, 14): stays as it is */
    g = ts_graph_new();
    a = ts_input(g, "a", TS_F32, 3, da);
    b = ts_input(g, "b", TS_F32, 3, db);
    y = ts_add(g, slice_bwd(g, a, 2, 0, 5, 14), slice_bwd(g, b, 2, 5, 12, 14));
    ts_mark_output(g, y, "y");
    CHECK_OK(ts_pass_fuse(g, &st));
    CHECK(st.concats == 0 && live_ops(g, TS_OP_SLICE_BWD) == 2, "gap: %d concats", st.concats);
    ts_graph_free(g);
}

/* ---- GEMM epilogues against the unfused kernels ----------------------------------- */

static void check_epilogue(int64_t batch, int64_t m, int64_t k, int64_t n, int relu, int resid) {
    feed f = {0};
    ts_graph *g = ts_graph_new();
    int64_t xd[3] = {batch, m, k}, wd[2] = {n, k}, bd[1] = {n}, rd[3] = {batch, m, n};
    ts_val x = input(g, &f, "x", TS_F32, 3, xd), w = input(g, &f, "w", TS_F32, 2, wd);
    ts_val b = input(g, &f, "b", TS_F32, 1, bd);
    ts_val y = ts_add(g, ts_matmul(g, x, w, 0, 1), b);
    if (relu) y = ts_relu(g, y);
    if (resid) y = ts_add(g, input(g, &f, "r", TS_F32, 3, rd), y);
    char label[96];
    snprintf(label, sizeof label, "epilogue [%lld,%lld,%lld]x[%lld,%lld]^T relu %d residual %d",
             (long long)batch, (long long)m, (long long)k, (long long)n, (long long)k, relu, resid);
    CHECK_OK(ts_mark_output(g, y, "out"));
    size_t bytes = (size_t)(batch * m * n) * sizeof(float);
    /* oneDNN with post-ops vs oneDNN plus separate ops: the same GEMM, so
     * equal (relu: -0.0 vs +0.0 compare equal) */
    float *plain = run(g, &f, 1, 0, 2, bytes, NULL), *epi = run(g, &f, 0, 0, 2, bytes, NULL);
    float *ref_plain = run(g, &f, 1, 1, 2, bytes, NULL),
          *ref_epi = run(g, &f, 0, 1, 2, bytes, NULL);
    if (plain && epi)
        CHECK(!mismatches(plain, epi, batch * m * n), "%s: oneDNN post-ops differ", label);
    if (ref_plain && ref_epi)
        CHECK(!memcmp(ref_plain, ref_epi, bytes), "%s: reference matmul_epi differs", label);
    free(plain);
    free(epi);
    free(ref_plain);
    free(ref_epi);
    ts_graph_free(g);
    feed_free(&f);
}

/* A NaN reaching a relu after a GEMM epilogue stays NaN, as unfused: the
 * relu is not a oneDNN post-op (that one is a max with 0, NaN -> 0). Also,
 * a matmul_epi with any post-op but an add (2 was the relu) is refused. */
static void check_epilogue_nan(void) {
    feed f = {0};
    ts_graph *g = ts_graph_new();
    int64_t xd[2] = {6, 16}, wd[2] = {8, 16}, bd[1] = {8};
    ts_val x = input(g, &f, "x", TS_F32, 2, xd), w = input(g, &f, "w", TS_F32, 2, wd);
    ts_val b = input(g, &f, "b", TS_F32, 1, bd);
    float *px = f.data[0];
    px[2 * 16 + 5] = __builtin_nanf("");         /* row 2 of the product is NaN */
    ((float *)f.data[2])[3] = -__builtin_inff(); /* column 3: -inf, relu gives 0 */
    CHECK_OK(ts_mark_output(g, ts_relu(g, ts_add(g, ts_matmul(g, x, w, 0, 1), b)), "out"));
    size_t bytes = 6 * 8 * sizeof(float);
    int ni_fused = 0, ni_plain = 0;
    float *plain = run(g, &f, 1, 0, 2, bytes, &ni_plain),
          *epi = run(g, &f, 0, 0, 2, bytes, &ni_fused);
    if (plain && epi) {
        CHECK(ni_fused < ni_plain, "NaN epilogue: %d instructions fused vs %d", ni_fused, ni_plain);
        CHECK(!memcmp(plain, epi, bytes), "NaN epilogue: fused differs from unfused in %lld",
              (long long)mismatches(plain, epi, 6 * 8));
        int nan_row = 1, zero_col = 1;
        for (int j = 0; j < 8; j++) nan_row &= epi[2 * 8 + j] != epi[2 * 8 + j];
        for (int i = 0; i < 6; i++) zero_col &= i == 2 || epi[i * 8 + 3] == 0.0f;
        CHECK(nan_row && zero_col, "NaN epilogue: the NaN row or the -inf column changed");
    }
    free(plain);
    free(epi);
    ts_graph_free(g);
    feed_free(&f);

    g = ts_graph_new();
    ts_val in[3] = {ts_input(g, "x", TS_F32, 2, xd), ts_input(g, "w", TS_F32, 2, wd)};
    ts_attrs a = ts_attrs_zero();
    a.matmul_epi.trans_b = 1;
    a.matmul_epi.n_post = 1;
    a.matmul_epi.post[0] = 2;
    CHECK(!ts_val_ok(ts_node_add(g, TS_OP_MATMUL_EPI, 2, in, &a, NULL)) &&
              strstr(ts_last_error(), "unknown kind 2"),
          "matmul_epi post-op 2 accepted: %s", ts_last_error());
    ts_graph_free(g);
}

/* Batched matmul (attention-shaped) with a full-shape add. */
static void check_epilogue_batched(void) {
    feed f = {0};
    ts_graph *g = ts_graph_new();
    int64_t qd[4] = {2, 3, 17, 8}, kd[4] = {2, 3, 19, 8}, od[4] = {2, 3, 17, 19};
    ts_val q = input(g, &f, "q", TS_F32, 4, qd), k = input(g, &f, "k", TS_F32, 4, kd);
    ts_val y = ts_add(g, ts_matmul(g, q, k, 0, 1), input(g, &f, "r", TS_F32, 4, od));
    compare("batched matmul + full add", g, y, &f, 1);
    ts_graph_free(g);
    feed_free(&f);
}

/* ---- training: fusion changes nothing ------------------------------------------------ */

static int train(ts_graph *g, ts_val loss, int gpt, int no_fuse, float **params, size_t *bytes,
                 int max) {
    ts_train_spec spec = ts_train_spec_default(loss);
    spec.opt = ts_adamw(1e-3, 0.9, 0.999, 1e-8, 0.01);
    ts_compile_options opt = ts_compile_options_default();
    opt.seed = 5;
    opt.threads = 2;
    opt.no_fuse = no_fuse;
    ts_plan *p;
    ts_status s = ts_compile(g, &spec, &opt, &p);
    CHECK(s == TS_OK, "compile: %s", ts_last_error());
    if (s != TS_OK) return 0;
    unsigned seed = 3;
    for (int step = 0; step < 4; step++) {
        if (gpt) {
            int64_t tok[2 * 16], tgt[2 * 16];
            for (int i = 0; i < 32; i++) tok[i] = rand_r(&seed) % 64, tgt[i] = rand_r(&seed) % 64;
            ts_plan_set_input(p, "tokens", tok, sizeof tok);
            ts_plan_set_input(p, "targets", tgt, sizeof tgt);
        } else {
            float x[16 * 64], y[16];
            for (int i = 0; i < 16 * 64; i++) x[i] = (float)rand_r(&seed) / RAND_MAX - 0.5f;
            for (int i = 0; i < 16; i++) y[i] = (float)rand_r(&seed) / RAND_MAX;
            ts_plan_set_input(p, "x", x, sizeof x);
            ts_plan_set_input(p, "y", y, sizeof y);
        }
        CHECK_OK(ts_plan_step(p));
    }
    int n = ts_plan_param_count(p);
    for (int i = 0; i < n && i < max; i++) {
        const char *name = ts_plan_param_name(p, i);
        int rank;
        int64_t dims[8];
        ts_plan_value_info(p, name, NULL, &rank, dims);
        bytes[i] = sizeof(float);
        for (int d = 0; d < rank; d++) bytes[i] *= (size_t)dims[d];
        params[i] = malloc(bytes[i]);
        ts_plan_read(p, name, params[i], bytes[i]);
    }
    ts_plan_free(p);
    return n < max ? n : max;
}

static void check_training(const char *label, ts_graph *g, ts_val loss, int gpt) {
    float *pa[64], *pb[64];
    size_t ba[64], bb[64];
    int na = train(g, loss, gpt, 0, pa, ba, 64), nb = train(g, loss, gpt, 1, pb, bb, 64);
    CHECK(na == nb && na > 0, "%s: %d vs %d parameters", label, na, nb);
    int same = 1;
    for (int i = 0; i < na && i < nb; i++) same &= ba[i] == bb[i] && !memcmp(pa[i], pb[i], ba[i]);
    CHECK(same, "%s: parameters after 4 steps differ with and without fusion", label);
    for (int i = 0; i < na; i++) free(pa[i]);
    for (int i = 0; i < nb; i++) free(pb[i]);
}

int main(void) {
    check_grouping();
    check_concat();
    int64_t small[3] = {4, 33, 70}, big[3] = {3, 37, 301};
    check_eltwise_ops(small);
    check_eltwise_ops(big); /* several threads, a partial last tile */
    check_epilogue(1, 64, 48, 40, 0, 0);
    check_epilogue(2, 33, 17, 29, 1, 0);
    check_epilogue(3, 50, 64, 96, 1, 1);
    check_epilogue(1, 40, 32, 1, 0, 1); /* N = 1, as W1's output layer */
    check_epilogue_batched();
    check_epilogue_nan();

    ts_mlp_config mc = {16, 8, 8, 0, 64, 2, 1, 1, 0};
    ts_graph *g = ts_graph_new();
    ts_model m;
    CHECK_OK(ts_build_mlp(g, &mc, &m));
    check_training("mlp", g, m.loss, 0);
    ts_graph_free(g);
    ts_gpt_config gc = {2, 16, 64, 32, 2, 2, 0.0};
    g = ts_graph_new();
    CHECK_OK(ts_build_gpt(g, &gc, &m));
    check_training("gpt", g, m.loss, 1);
    ts_graph_free(g);
    return check_summary("fuse");
}
