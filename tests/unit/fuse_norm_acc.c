/* layer_norm_bwd_acc (ops/norm.c) and the fusion that builds it from
 * add(r, layer_norm_bwd(...)) (passes/fuse_norm.c):
 * - the kernel against layer_norm_bwd's kernel followed by the add's, bit
 *   for bit, f32 and f64, written over acc and to a buffer of its own, with
 *   NaN and infinity in x and in acc, on 1, 2, 3 and 5 threads (both
 *   schedules of layer_norm_bwd);
 * - which adds the pass takes and which it leaves;
 * - a two-block pre-norm residual network compiled with and without the
 *   fusion (compile.no_fuse_norm): the same gradients and, after AdamW
 *   steps, the same weights, with the residual gradient written in place. */
#include <omp.h>
#include <stdlib.h>
#include <string.h>
#include "check.h"
#include "ops/norm_rows.h"
#include "ops/op.h"
#include "passes/passes.h"

/* ---- the kernel ------------------------------------------------------------- */

typedef struct kcfg {
    int64_t rows, d;
    int has_w, has_b, f64, nan;
} kcfg;

static void fill(void *p, int f64, size_t n, unsigned seed, double lo, double hi) {
    for (size_t i = 0; i < n; i++) {
        double v = lo + (hi - lo) * (double)rand_r(&seed) / (double)RAND_MAX;
        if (f64)
            ((double *)p)[i] = v;
        else
            ((float *)p)[i] = (float)v;
    }
}

static void put(void *p, int f64, size_t i, double v) {
    if (f64)
        ((double *)p)[i] = v;
    else
        ((float *)p)[i] = (float)v;
}

/* Equal bits, or both NaN (which NaN an IEEE add returns for two NaNs
 * depends on the operand order a compiler picks). */
static int64_t differing(const void *a, const void *b, int f64, int64_t n) {
    int64_t bad = 0;
    for (int64_t i = 0; i < n; i++) {
        double x = f64 ? ((const double *)a)[i] : ((const float *)a)[i];
        double y = f64 ? ((const double *)b)[i] : ((const float *)b)[i];
        size_t es = f64 ? 8 : 4;
        bad += memcmp((const char *)a + i * es, (const char *)b + i * es, es) != 0 &&
               !(x != x && y != y);
    }
    return bad;
}

static void check_kernel(const kcfg *c, int threads) {
    const int64_t n = c->rows * c->d, d = c->d;
    const size_t es = c->f64 ? 8 : 4;
    const ts_dtype dt = c->f64 ? TS_F64 : TS_F32;
    void *dy = malloc(n * es), *x = malloc(n * es), *acc = malloc(n * es);
    void *mean = malloc(c->rows * es), *rstd = malloc(c->rows * es), *w = malloc(d * es);
    void *tmp = malloc(n * es), *ref = malloc(n * es), *sep = malloc(n * es),
         *inpl = malloc(n * es);
    void *dwb[3][2];
    for (int v = 0; v < 3; v++)
        for (int j = 0; j < 2; j++) dwb[v][j] = malloc(d * es);
    fill(dy, c->f64, n, 1, -1, 1);
    fill(x, c->f64, n, 2, -2, 2);
    fill(acc, c->f64, n, 3, -1, 1);
    fill(w, c->f64, d, 4, 0.5, 1.5);
    fill(mean, c->f64, c->rows, 5, -0.1, 0.1);
    fill(rstd, c->f64, c->rows, 6, 0.5, 2);
    if (c->nan) {
        put(x, c->f64, 1, NAN);
        put(x, c->f64, d * (c->rows / 2), INFINITY);
        put(acc, c->f64, n - 1, NAN);
        put(acc, c->f64, d + 2, -INFINITY);
    }
    size_t sb = ts_ln_dwdb_scratch(c->rows, d);
    void *scratch = aligned_alloc(64, (sb + 63) / 64 * 64 + 64);
    ts_attrs a = ts_attrs_zero();
    a.norm.has_w = c->has_w, a.norm.has_b = c->has_b;
    ts_step_ctx ctx = {1, 0, 0.0, 1};
    ts_tensor big = {dt, 2, {c->rows, d}, NULL}, st = {dt, 1, {c->rows}, NULL};
    ts_tensor vec = {dt, 1, {d}, NULL};
#define T(base, p) (ts_tensor){base.dtype, base.rank, {base.dims[0], base.dims[1]}, p}
    omp_set_num_threads(threads);
    /* reference: layer_norm_bwd into tmp, then add(acc, tmp) */
    ts_tensor in[6] = {T(big, dy), T(big, x), T(st, mean), T(st, rstd), T(vec, w)};
    ts_tensor out[3] = {T(big, tmp)};
    int no = 1;
    if (c->has_w) out[no++] = T(vec, dwb[0][0]);
    if (c->has_b) out[no++] = T(vec, dwb[0][1]);
    ts_kargs k = {&a, 4 + c->has_w, no, in, out, scratch, sb, &ctx, "ln", NULL};
    CHECK_OK(ts_op_get(TS_OP_LAYER_NORM_BWD)->kernel(&k));
    ts_attrs none = ts_attrs_zero();
    ts_tensor ain[2] = {T(big, acc), T(big, tmp)}, aout = T(big, ref);
    ts_kargs ka = {&none, 2, 1, ain, &aout, NULL, 0, &ctx, "add", NULL};
    CHECK_OK(ts_op_get(TS_OP_ADD)->kernel(&ka));
    /* fused: to a buffer of its own (v 1) and over a copy of acc (v 2) */
    memcpy(inpl, acc, n * es);
    for (int v = 1; v <= 2; v++) {
        void *o = v == 1 ? sep : inpl;
        ts_tensor fin[6] = {T(big, v == 1 ? acc : inpl),
                            T(big, dy),
                            T(big, x),
                            T(st, mean),
                            T(st, rstd),
                            T(vec, w)};
        ts_tensor fout[3] = {T(big, o)};
        no = 1;
        if (c->has_w) fout[no++] = T(vec, dwb[v][0]);
        if (c->has_b) fout[no++] = T(vec, dwb[v][1]);
        ts_kargs kf = {&a, 5 + c->has_w, no, fin, fout, scratch, sb, &ctx, "ln_acc", NULL};
        CHECK_OK(ts_op_get(TS_OP_LAYER_NORM_BWD_ACC)->kernel(&kf));
        const char *how = v == 1 ? "own buffer" : "in place";
        int64_t bad = differing(ref, o, c->f64, n);
        CHECK(bad == 0, "[%lld,%lld] w%d b%d %s%s %d threads, %s: %lld of dx differ from add",
              (long long)c->rows, (long long)d, c->has_w, c->has_b, c->f64 ? "f64" : "f32",
              c->nan ? " NaN/inf" : "", threads, how, (long long)bad);
        for (int j = 0; j < 2; j++)
            if (j ? c->has_b : c->has_w)
                CHECK(!memcmp(dwb[0][j], dwb[v][j], d * es),
                      "[%lld,%lld] %d threads %s: %s differs", (long long)c->rows, (long long)d,
                      threads, how, j ? "db" : "dw");
    }
#undef T
    free(dy), free(x), free(acc), free(mean), free(rstd), free(w), free(tmp), free(ref);
    free(sep), free(inpl), free(scratch);
    for (int v = 0; v < 3; v++)
        for (int j = 0; j < 2; j++) free(dwb[v][j]);
}

/* ---- the rule ------------------------------------------------------------------ */

static int live(const ts_graph *g, int op) {
    int k = 0;
    for (int i = 0; i < g->n_nodes; i++) k += !g->nodes[i].dead && g->nodes[i].op == op;
    return k;
}

static ts_val ln_bwd(ts_graph *g, ts_val dy, ts_val x, ts_val w, ts_val *outs) {
    int64_t rows = ts_v(g, x)->t.dims[0];
    ts_dtype dt = ts_v(g, x)->t.dtype;
    ts_val mean = ts_input(g, "mean", dt, 1, &rows), rstd = ts_input(g, "rstd", dt, 1, &rows);
    ts_attrs a = ts_attrs_zero();
    a.norm.has_w = 1, a.norm.has_b = 1;
    ts_val in[5] = {dy, x, mean, rstd, w};
    return ts_node_add(g, TS_OP_LAYER_NORM_BWD, 5, in, &a, outs);
}

enum {
    R_PLAIN,
    R_SWAPPED,
    R_BROADCAST,
    R_READ_TWICE,
    R_OBSERVED,
    R_F64,
    R_LATE,
    R_OFF,
    R_ACT,
    R_SELF
};

/* r2 = add(r, dh) in the variant's form; returns how many fused. */
static int rule(int variant) {
    ts_graph *g = ts_graph_new();
    const ts_dtype dt = variant == R_F64 ? TS_F64 : TS_F32;
    int64_t d[2] = {4, 8}, vd = 8;
    ts_val x = ts_input(g, "x", dt, 2, d), dy = ts_input(g, "dy", dt, 2, d);
    ts_val w = ts_input(g, "w", dt, 1, &vd);
    ts_val r = variant == R_BROADCAST ? ts_input(g, "r", dt, 1, &vd) : ts_input(g, "r", dt, 2, d);
    ts_val outs[3];
    ts_val dh = ln_bwd(g, dy, x, w, outs);
    ts_mark_output(g, outs[1], "dw");
    ts_mark_output(g, outs[2], "db");
    if (variant == R_LATE) r = ts_exp(g, r); /* built after the norm */
    if (variant == R_SELF) r = dy;           /* add(dy, dh): dy would be written over */
    if (variant == R_ACT) {                  /* layer_norm_act_bwd takes dh, the add stays */
        ts_attrs ua = ts_attrs_zero();
        ua.unary_bwd.fwd_op = TS_OP_RELU;
        ts_val uin[2] = {dh, x};
        dh = ts_node_add(g, TS_OP_UNARY_BWD, 2, uin, &ua, NULL);
    }
    ts_val r2 = variant == R_SWAPPED ? ts_add(g, dh, r) : ts_add(g, r, dh);
    ts_mark_output(g, r2, "r2");
    if (variant == R_READ_TWICE) ts_mark_output(g, ts_mul(g, dh, x), "z");
    if (variant == R_OBSERVED) ts_mark_output(g, dh, "dh");
    ts_fuse_stats st;
    ts_fuse_options fo = {.no_norm = variant == R_OFF};
    CHECK_OK(ts_pass_fuse_ex(g, &fo, &st));
    int n = live(g, TS_OP_LAYER_NORM_BWD_ACC);
    if (variant == R_ACT)
        CHECK(live(g, TS_OP_LAYER_NORM_ACT_BWD) == 1 && live(g, TS_OP_ADD) == 1,
              "layer_norm_act_bwd then the add");
    if (n) {
        /* the add's sum is the fused node's output 0 and r its input 0 */
        const ts_node *f = NULL;
        for (int i = 0; i < g->n_nodes; i++)
            if (!g->nodes[i].dead && g->nodes[i].op == TS_OP_LAYER_NORM_BWD_ACC) f = &g->nodes[i];
        CHECK(f->out[0] == r2.id && f->in[0] == r.id && f->n_in == 6 && live(g, TS_OP_ADD) == 0,
              "variant %d: the fused node's operands", variant);
    }
    ts_graph_free(g);
    return n;
}

/* ---- a pre-norm residual network ---------------------------------------------------- */

enum { ROWS = 40, D = 24, BLOCKS = 2 };

/* h = x; per block h = h + linear(layer_norm(h)); loss = sum(tanh(h) * C) */
static ts_graph *build(ts_val *loss) {
    ts_graph *g = ts_graph_new();
    int64_t xd[2] = {ROWS, D}, wd[2] = {D, D}, vd = D;
    ts_val h = ts_param(g, "x", TS_F32, 2, xd, ts_init_uniform(-1, 1));
    for (int b = 0; b < BLOCKS; b++) {
        char n[4][32];
        snprintf(n[0], 32, "b%d.ln.w", b), snprintf(n[1], 32, "b%d.ln.b", b);
        snprintf(n[2], 32, "b%d.w", b), snprintf(n[3], 32, "b%d.bias", b);
        ts_val lw = ts_param(g, n[0], TS_F32, 1, &vd, ts_init_uniform(0.5, 1.5));
        ts_val lb = ts_param(g, n[1], TS_F32, 1, &vd, ts_init_uniform(-0.5, 0.5));
        ts_val w = ts_param(g, n[2], TS_F32, 2, wd, ts_init_uniform(-0.3, 0.3));
        ts_val bias = ts_param(g, n[3], TS_F32, 1, &vd, ts_init_uniform(-0.1, 0.1));
        h = ts_add(g, h, ts_linear(g, ts_layer_norm(g, h, lw, lb, 1e-5), w, bias));
    }
    float cd[ROWS * D];
    fill(cd, 0, ROWS * D, 9, 0.5, 1.5);
    ts_val cc = ts_constant(g, "C", TS_F32, 2, xd, cd);
    *loss = ts_sum(g, ts_mul(g, ts_tanh(g, h), cc), 0, NULL, 0);
    ts_mark_output(g, *loss, "loss");
    return g;
}

/* Fused instructions in the plan, and how many of them write over acc. */
static void count_fused(ts_plan *p, int *n, int *in_place) {
    char *dump = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&dump, &len);
    ts_plan_dump(p, TS_DUMP_PLAN, f);
    fclose(f);
    *n = *in_place = 0;
    for (const char *q = dump; q && (q = strstr(q, "layer_norm_bwd_acc ")); q++) {
        const char *o = strchr(q, '@'), *i = strstr(q, "<- @");
        if (!o || !i) continue;
        ++*n;
        *in_place += strtoll(o + 1, NULL, 10) == strtoll(i + 4, NULL, 10);
    }
    free(dump);
}

/* Parameters (or, with steps 0, their gradients after one pass), in order. */
static int run_net(int no_norm, int threads, int steps, float **out, size_t *bytes, int max) {
    ts_val loss;
    ts_graph *g = build(&loss);
    ts_train_spec spec = ts_train_spec_default(loss);
    spec.opt = steps ? ts_adamw(1e-2, 0.9, 0.999, 1e-8, 0.01) : spec.opt;
    if (!steps) spec.opt.kind = TS_OPT_NONE;
    ts_compile_options o = ts_compile_options_default();
    o.seed = 7;
    o.threads = threads;
    o.no_fuse_norm = no_norm;
    ts_plan *p;
    ts_status s = ts_compile(g, &spec, &o, &p);
    ts_graph_free(g);
    CHECK(s == TS_OK, "compile: %s", ts_last_error());
    if (s != TS_OK) return 0;
    int nf, ip;
    count_fused(p, &nf, &ip);
    CHECK(no_norm ? nf == 0 : nf == BLOCKS && ip == BLOCKS - 1,
          "no_fuse_norm=%d: %d layer_norm_bwd_acc, %d in place", no_norm, nf, ip);
    for (int i = 0; i < (steps ? steps : 1); i++) CHECK_OK(ts_plan_step(p));
    int n = ts_plan_param_count(p);
    for (int i = 0; i < n && i < max; i++) {
        char name[64];
        snprintf(name, sizeof name, "%s%s", steps ? "" : "grad:", ts_plan_param_name(p, i));
        int rank;
        int64_t dims[8];
        CHECK_OK(ts_plan_value_info(p, name, NULL, &rank, dims));
        bytes[i] = sizeof(float);
        for (int k = 0; k < rank; k++) bytes[i] *= (size_t)dims[k];
        out[i] = malloc(bytes[i]);
        CHECK_OK(ts_plan_read(p, name, out[i], bytes[i]));
    }
    ts_plan_free(p);
    return n < max ? n : max;
}

static void check_net(int steps) {
    enum { MAX = 16 };
    float *ref[MAX], *fu[MAX];
    size_t rb[MAX], fb[MAX];
    int nr = run_net(1, 2, steps, ref, rb, MAX);
    for (int t = 1; t <= 2; t++) {
        int nf = run_net(0, t, steps, fu, fb, MAX);
        int same = nf == nr && nr == 1 + 4 * BLOCKS;
        for (int i = 0; i < nf && i < nr; i++)
            same &= rb[i] == fb[i] && !memcmp(ref[i], fu[i], rb[i]);
        CHECK(same, "%s (%d threads) differ with the fusion",
              steps ? "weights after AdamW steps" : "gradients", t);
        for (int i = 0; i < nf; i++) free(fu[i]);
    }
    for (int i = 0; i < nr; i++) free(ref[i]);
}

int main(void) {
    /* rows: one block of 128 or several (layer_norm_bwd's two schedules), d with a tail */
    const kcfg ks[] = {{9, 37, 1, 1, 0, 0},    {300, 129, 1, 1, 0, 0}, {300, 129, 1, 0, 0, 1},
                       {300, 129, 0, 1, 1, 0}, {130, 40, 0, 0, 0, 1},  {300, 129, 1, 1, 1, 1}};
    const int th[] = {1, 2, 3, 5};
    for (size_t i = 0; i < sizeof ks / sizeof ks[0]; i++)
        for (int t = 0; t < 4; t++) check_kernel(&ks[i], th[t]);
    CHECK(rule(R_PLAIN) == 1, "add(r, dh): not fused");
    CHECK(rule(R_SWAPPED) == 1, "add(dh, r): not fused");
    CHECK(rule(R_BROADCAST) == 0, "a broadcast add: fused");
    CHECK(rule(R_READ_TWICE) == 0, "dh read twice: fused");
    CHECK(rule(R_OBSERVED) == 0, "dh an output: fused");
    CHECK(rule(R_F64) == 0, "f64: fused");
    CHECK(rule(R_LATE) == 0, "r computed after the norm: fused");
    CHECK(rule(R_OFF) == 0, "no_norm: fused");
    CHECK(rule(R_ACT) == 0, "the activation's backward in between: fused");
    CHECK(rule(R_SELF) == 0, "add(dy, dh) of the norm's own dy: fused");
    check_net(0);
    check_net(3);
    return check_summary("fuse_norm_acc");
}
