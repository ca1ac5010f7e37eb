/* The activation + layer norm fusion (passes/fuse_norm.c, ops/norm_act.c):
 * which pairs the pass fuses and which it leaves; the fused kernels against
 * the unfused ops (compile.no_fuse_norm) bit for bit, forward and
 * gradients, with NaN and infinity in the input, on 1 and 2 threads; the
 * fused gradients against central differences in f32; an MLP trained with
 * and without the fusion ending with the same bits. */
#include <stdlib.h>
#include <string.h>
#include "check.h"
#include "ops/op.h"
#include "passes/passes.h"

enum { A_RELU, A_GELU_ERF, A_GELU_TANH, A_LEAKY, A_TANH, A_NONE };
static const char *act_name[] = {"relu", "gelu(erf)", "gelu(tanh)", "leaky_relu", "tanh"};

static ts_val act(ts_graph *g, int a, ts_val x) {
    switch (a) {
    case A_RELU: return ts_relu(g, x);
    case A_GELU_ERF: return ts_gelu(g, x, TS_GELU_ERF);
    case A_GELU_TANH: return ts_gelu(g, x, TS_GELU_TANH);
    case A_LEAKY: return ts_leaky_relu(g, x, 0.1);
    default: return ts_tanh(g, x);
    }
}

typedef struct cfg {
    int act, has_w, has_b;
    int64_t rows, k, d;
    int nan; /* put NaN, +inf and -inf into x */
} cfg;

/* out = layer_norm(act(x W^T + b)); loss = sum(out * C). */
static ts_graph *build(const cfg *c, const float *cdata, ts_val *loss_out) {
    ts_graph *g = ts_graph_new();
    int64_t xd[2] = {c->rows, c->k}, wd[2] = {c->d, c->k}, vd[1] = {c->d}, od[2] = {c->rows, c->d};
    ts_val x = ts_input(g, "x", TS_F32, 2, xd);
    ts_val w = ts_param(g, "w", TS_F32, 2, wd, ts_init_uniform(-1, 1));
    ts_val b = ts_param(g, "b", TS_F32, 1, vd, ts_init_uniform(-0.5, 0.5));
    ts_val lw = c->has_w ? ts_param(g, "ln.w", TS_F32, 1, vd, ts_init_uniform(0.5, 1.5)) : TS_NONE;
    ts_val lb = c->has_b ? ts_param(g, "ln.b", TS_F32, 1, vd, ts_init_uniform(-0.5, 0.5)) : TS_NONE;
    ts_val y = ts_layer_norm(g, act(g, c->act, ts_linear(g, x, w, b)), lw, lb, 1e-5);
    ts_mark_output(g, y, "out");
    ts_val cc = ts_constant(g, "C", TS_F32, 2, od, cdata);
    ts_val loss = ts_sum(g, ts_mul(g, y, cc), 0, NULL, 0);
    ts_mark_output(g, loss, "loss");
    *loss_out = loss;
    return g;
}

static const char *pnames[] = {"w", "b", "ln.w", "ln.b"};

typedef struct result {
    float *out, *grad[4];
    size_t out_bytes, grad_bytes[4];
    int n_fused; /* fused instructions in the plan */
} result;

static void result_free(result *r) {
    free(r->out);
    for (int i = 0; i < 4; i++) free(r->grad[i]);
}

static int present(const cfg *c, int i) {
    return i < 2 || (i == 2 && c->has_w) || (i == 3 && c->has_b);
}

/* One gradient step (no optimizer): out and the parameters' gradients. */
static result run(const cfg *c, const float *x, const float *cdata, int no_norm, int threads) {
    result r = {0};
    ts_val loss;
    ts_graph *g = build(c, cdata, &loss);
    ts_train_spec spec = ts_train_spec_default(loss);
    spec.opt.kind = TS_OPT_NONE;
    ts_compile_options o = ts_compile_options_default();
    o.threads = threads;
    o.seed = 3;
    o.no_fuse_norm = no_norm;
    ts_plan *p;
    ts_status s = ts_compile(g, &spec, &o, &p);
    CHECK(s == TS_OK, "compile: %s", ts_last_error());
    ts_graph_free(g);
    if (s != TS_OK) return r;
    CHECK_OK(ts_plan_set_input(p, "x", x, sizeof(float) * (size_t)(c->rows * c->k)));
    CHECK_OK(ts_plan_step(p));
    r.out_bytes = sizeof(float) * (size_t)(c->rows * c->d);
    r.out = malloc(r.out_bytes);
    CHECK_OK(ts_plan_read(p, "out", r.out, r.out_bytes));
    for (int i = 0; i < 4; i++) {
        if (!present(c, i)) continue;
        char gname[32];
        snprintf(gname, sizeof gname, "grad:%s", pnames[i]);
        r.grad_bytes[i] = sizeof(float) * (size_t)(i == 0 ? c->d * c->k : c->d);
        r.grad[i] = malloc(r.grad_bytes[i]);
        CHECK_OK(ts_plan_read(p, gname, r.grad[i], r.grad_bytes[i]));
    }
    char *dump = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&dump, &len);
    ts_plan_dump(p, TS_DUMP_PLAN, f);
    fclose(f);
    for (const char *q = dump; q && (q = strstr(q, "act_layer_norm ")); q++) r.n_fused++;
    for (const char *q = dump; q && (q = strstr(q, "layer_norm_act_bwd ")); q++) r.n_fused++;
    free(dump);
    ts_plan_free(p);
    return r;
}

static float *fill(size_t n, unsigned seed, float lo, float hi) {
    float *v = malloc(n * sizeof(float));
    for (size_t i = 0; i < n; i++) v[i] = lo + (hi - lo) * (float)rand_r(&seed) / (float)RAND_MAX;
    return v;
}

static void check_bits(const cfg *c) {
    char label[160];
    snprintf(label, sizeof label, "%s%s%s [%lld,%lld]x[%lld]%s", act_name[c->act],
             c->has_w ? " +w" : "", c->has_b ? " +b" : "", (long long)c->rows, (long long)c->k,
             (long long)c->d, c->nan ? " with NaN/inf" : "");
    float *x = fill((size_t)(c->rows * c->k), 11, -2, 2);
    float *cd = fill((size_t)(c->rows * c->d), 12, 0.5f, 1.5f);
    if (c->nan) {
        x[0] = NAN;
        x[c->k * (c->rows / 2) + 1] = INFINITY;
        x[c->k * (c->rows - 1)] = -INFINITY;
    }
    result ref = run(c, x, cd, 1, 2);
    CHECK(ref.n_fused == 0, "%s: no_fuse_norm left %d fused instructions", label, ref.n_fused);
    for (int t = 1; t <= 2; t++) {
        result fu = run(c, x, cd, 0, t);
        CHECK(fu.n_fused == 2, "%s: %d fused instructions, want 2", label, fu.n_fused);
        CHECK(ref.out && fu.out && !memcmp(ref.out, fu.out, ref.out_bytes),
              "%s (%d threads): out differs from the unfused ops", label, t);
        for (int i = 0; i < 4; i++)
            if (present(c, i))
                CHECK(ref.grad[i] && fu.grad[i] &&
                          !memcmp(ref.grad[i], fu.grad[i], ref.grad_bytes[i]),
                      "%s (%d threads): grad:%s differs from the unfused ops", label, t, pnames[i]);
        if (c->nan && fu.out) {
            /* the rows holding NaN or inf come out NaN, not hidden */
            int nan_rows = 0;
            for (int64_t r = 0; r < c->rows; r++) nan_rows += fu.out[r * c->d] != fu.out[r * c->d];
            CHECK(nan_rows >= 3, "%s: %d NaN rows, want >= 3", label, nan_rows);
        }
        result_free(&fu);
    }
    result_free(&ref);
    free(x);
    free(cd);
}

/* Central differences of the fused plan's loss in f32 against its gradient
 * of w (a smooth activation: no kink within h). */
static void check_fd(int a) {
    cfg c = {a, 1, 1, 6, 5, 7, 0};
    float *x = fill(30, 21, -1.5f, 1.5f), *cd = fill(42, 22, 0.5f, 1.5f);
    ts_val loss;
    ts_graph *g = build(&c, cd, &loss);
    ts_train_spec spec = ts_train_spec_default(loss);
    spec.opt.kind = TS_OPT_NONE;
    ts_compile_options o = ts_compile_options_default();
    o.seed = 3;
    ts_plan *p;
    CHECK_OK(ts_compile(g, &spec, &o, &p));
    ts_graph_free(g);
    CHECK_OK(ts_plan_set_input(p, "x", x, sizeof(float) * 30));
    CHECK_OK(ts_plan_step(p));
    float w[35], gw[35];
    CHECK_OK(ts_plan_read(p, "w", w, sizeof w));
    CHECK_OK(ts_plan_read(p, "grad:w", gw, sizeof gw));
    int bad = 0;
    const float h = 1e-2f;
    for (int e = 0; e < 35; e++) {
        float l[2], wp[35];
        for (int sgn = 0; sgn < 2; sgn++) {
            memcpy(wp, w, sizeof w);
            wp[e] += sgn ? -h : h;
            CHECK_OK(ts_plan_write_param(p, "w", wp, sizeof wp));
            CHECK_OK(ts_plan_step(p));
            CHECK_OK(ts_plan_read(p, "loss", &l[sgn], sizeof(float)));
        }
        double num = ((double)l[0] - (double)l[1]) / (2.0 * h);
        if (fabs(num - gw[e]) > 2e-2 * fmax(1.0, fabs(num))) {
            if (bad++ < 3)
                fprintf(stderr, "  %s w[%d]: fused gradient %g, central difference %g\n",
                        act_name[a], e, gw[e], num);
        }
    }
    CHECK(bad == 0, "%s: %d of 35 fused gradients off their central differences", act_name[a], bad);
    ts_plan_free(p);
    free(x);
    free(cd);
}

static int live(const ts_graph *g, int op) {
    int k = 0;
    for (int i = 0; i < g->n_nodes; i++) k += !g->nodes[i].dead && g->nodes[i].op == op;
    return k;
}

/* What the pass fuses and what it leaves. */
static void check_rules(void) {
    int64_t d[2] = {4, 8};
    ts_fuse_stats st;
    /* act -> layer_norm: one node, h kept as its output 0 */
    ts_graph *g = ts_graph_new();
    ts_val x = ts_input(g, "x", TS_F32, 2, d);
    ts_val h = ts_relu(g, x);
    ts_val y = ts_layer_norm(g, h, TS_NONE, TS_NONE, 1e-5);
    ts_mark_output(g, y, "y");
    CHECK_OK(ts_pass_fuse(g, &st));
    CHECK(st.norms == 1 && live(g, TS_OP_ACT_LAYER_NORM) == 1 && live(g, TS_OP_RELU) == 0,
          "pair: %d fused", st.norms);
    ts_graph_free(g);
    /* switched off */
    g = ts_graph_new();
    x = ts_input(g, "x", TS_F32, 2, d);
    y = ts_layer_norm(g, ts_relu(g, x), TS_NONE, TS_NONE, 1e-5);
    ts_mark_output(g, y, "y");
    ts_fuse_options fo = {.no_norm = 1};
    CHECK_OK(ts_pass_fuse_ex(g, &fo, &st));
    CHECK(st.norms == 0 && live(g, TS_OP_ACT_LAYER_NORM) == 0, "no_norm: %d fused", st.norms);
    ts_graph_free(g);
    /* h read by a node built between the act and the norm: left apart (h
     * would be produced after its reader) */
    g = ts_graph_new();
    x = ts_input(g, "x", TS_F32, 2, d);
    h = ts_relu(g, x);
    ts_val z = ts_mul(g, h, h);
    y = ts_layer_norm(g, h, TS_NONE, TS_NONE, 1e-5);
    ts_mark_output(g, y, "y");
    ts_mark_output(g, z, "z");
    CHECK_OK(ts_pass_fuse(g, &st));
    CHECK(st.norms == 0 && live(g, TS_OP_RELU) == 1, "early reader: %d fused", st.norms);
    ts_graph_free(g);
    /* f64: left alone */
    g = ts_graph_new();
    x = ts_input(g, "x", TS_F64, 2, d);
    y = ts_layer_norm(g, ts_relu(g, x), TS_NONE, TS_NONE, 1e-5);
    ts_mark_output(g, y, "y");
    CHECK_OK(ts_pass_fuse(g, &st));
    CHECK(st.norms == 0, "f64: %d fused", st.norms);
    ts_graph_free(g);
    /* a norm of a non-activation (cast, exp of a matmul...) is left; exp is
     * an activation by this rule, a matmul is not */
    g = ts_graph_new();
    x = ts_input(g, "x", TS_F32, 2, d);
    y = ts_layer_norm(g, ts_add(g, x, x), TS_NONE, TS_NONE, 1e-5);
    ts_mark_output(g, y, "y");
    CHECK_OK(ts_pass_fuse(g, &st));
    CHECK(st.norms == 0, "add -> norm: %d fused", st.norms);
    ts_graph_free(g);
}

/* W1's shape of model, small: parameters after 4 AdamW steps. */
static int train(int no_norm, int threads, float **params, size_t *bytes, int max) {
    ts_mlp_config mc = {16, 0, 0, 64, 48, 2, 1, 1, 0};
    ts_graph *g = ts_graph_new();
    ts_model m;
    CHECK_OK(ts_build_mlp(g, &mc, &m));
    ts_train_spec spec = ts_train_spec_default(m.loss);
    spec.opt = ts_adamw(1e-3, 0.9, 0.999, 1e-8, 0.01);
    ts_compile_options opt = ts_compile_options_default();
    opt.seed = 5;
    opt.threads = threads;
    opt.no_fuse_norm = no_norm;
    ts_plan *p;
    ts_status s = ts_compile(g, &spec, &opt, &p);
    ts_graph_free(g);
    CHECK(s == TS_OK, "compile: %s", ts_last_error());
    if (s != TS_OK) return 0;
    unsigned seed = 3;
    for (int step = 0; step < 4; step++) {
        float x[16 * 64], y[16];
        for (int i = 0; i < 16 * 64; i++) x[i] = (float)rand_r(&seed) / RAND_MAX - 0.5f;
        for (int i = 0; i < 16; i++) y[i] = (float)rand_r(&seed) / RAND_MAX;
        CHECK_OK(ts_plan_set_input(p, "x", x, sizeof x));
        CHECK_OK(ts_plan_set_input(p, "y", y, sizeof y));
        CHECK_OK(ts_plan_step(p));
    }
    int n = ts_plan_param_count(p);
    for (int i = 0; i < n && i < max; i++) {
        const char *name = ts_plan_param_name(p, i);
        int rank;
        int64_t dims[8];
        ts_plan_value_info(p, name, NULL, &rank, dims);
        bytes[i] = sizeof(float);
        for (int k = 0; k < rank; k++) bytes[i] *= (size_t)dims[k];
        params[i] = malloc(bytes[i]);
        ts_plan_read(p, name, params[i], bytes[i]);
    }
    ts_plan_free(p);
    return n < max ? n : max;
}

/* The operand bytes per step (ts_plan_stats) of the small MLP: per hidden
 * layer the fusion drops four [batch, hidden] f32 tensors: the norm's read
 * of h, the write and read of the norm's input gradient, the activation
 * backward's read of h. */
static void check_operand_bytes(void) {
    size_t b[2];
    for (int no_norm = 0; no_norm < 2; no_norm++) {
        ts_mlp_config mc = {16, 0, 0, 64, 48, 2, 1, 1, 0};
        ts_graph *g = ts_graph_new();
        ts_model m;
        CHECK_OK(ts_build_mlp(g, &mc, &m));
        ts_train_spec spec = ts_train_spec_default(m.loss);
        ts_compile_options opt = ts_compile_options_default();
        opt.no_fuse_norm = no_norm;
        ts_plan *p;
        CHECK_OK(ts_compile(g, &spec, &opt, &p));
        ts_graph_free(g);
        ts_plan_stats st;
        CHECK_OK(ts_plan_get_stats(p, &st));
        b[no_norm] = st.operand_bytes_per_step;
        ts_plan_free(p);
    }
    size_t want = 2 * 4 * 16 * 48 * sizeof(float);
    CHECK(b[1] > b[0] && b[1] - b[0] == want,
          "operand bytes: %zu unfused, %zu fused, want %zu less", b[1], b[0], want);
}

static void check_training(void) {
    float *pa[16], *pb[16];
    size_t ba[16], bb[16];
    int nb = train(1, 2, pb, bb, 16);
    for (int t = 1; t <= 2; t++) {
        int na = train(0, t, pa, ba, 16);
        CHECK(na == nb && na > 0, "mlp: %d vs %d parameters", na, nb);
        int same = 1;
        for (int i = 0; i < na && i < nb; i++)
            same &= ba[i] == bb[i] && !memcmp(pa[i], pb[i], ba[i]);
        CHECK(same, "mlp (%d threads): parameters after 4 steps differ with the fusion", t);
        for (int i = 0; i < na; i++) free(pa[i]);
    }
    for (int i = 0; i < nb; i++) free(pb[i]);
}

int main(void) {
    check_rules();
    for (int a = A_RELU; a < A_NONE; a++)
        for (int f = 0; f < 4; f++) {
            cfg c = {a, f & 1, f >> 1, 9, 5, 37, 0}; /* D: lanes and a tail */
            check_bits(&c);
        }
    cfg big = {A_RELU, 1, 1, 300, 16, 129, 0}; /* several threads' rows, dw blocks */
    check_bits(&big);
    big.act = A_GELU_TANH;
    check_bits(&big);
    cfg nan = {A_RELU, 1, 1, 8, 6, 40, 1};
    check_bits(&nan);
    nan.act = A_GELU_ERF;
    check_bits(&nan);
    check_fd(A_GELU_ERF);
    check_fd(A_GELU_TANH);
    check_fd(A_TANH);
    check_operand_bytes();
    check_training();
    return check_summary("fuse_norm");
}
