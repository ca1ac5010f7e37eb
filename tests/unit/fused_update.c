/* optim.fused_update (train.c) and the scatter_add_to fusion (fuse.c,
 * ops/index.c) that keeps a tied embedding's gradient in one buffer:
 *   - scatter_add_to against scatter_add + add (no fusion), in place and
 *     not, with repeated and untouched rows, -0.0 and NaN in the base;
 *   - against the GEMM epilogue it replaced (matmul_epi with the scatter as
 *     a residual post-op) on W3's and GPT-2 124M's head shapes: same bits;
 *   - training: fused and unfused updates give the same parameters and
 *     optimizer state bit for bit (SGD with momentum, Adam, AdamW; an MLP and
 *     a GPT with a tied head; 1 and 2 threads), with no gradient region,
 *     a smaller arena and updates inside the backward pass;
 *   - what it refuses (clipping, loss scaling), naming the keys, and that
 *     gradients are not readable afterwards while the monitors' norm is. */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include "check.h"
#include "ops/fused.h"
#include "ops/op.h"
#include "plan/plan.h"

static unsigned g_seed = 11;
static float frand(void) {
    return (float)rand_r(&g_seed) / (float)RAND_MAX * 2.0f - 1.0f;
}

/* ---- scatter_add_to ---------------------------------------------------------- */

/* Output "out" of an inference plan with inputs base/a/b (float) and idx. */
static float *run_plan(ts_graph *g, int no_fuse, int threads, const float *const *in,
                       const char *const *names, const size_t *bytes, int n_in, const int64_t *idx,
                       size_t idx_bytes, size_t out_bytes, int *n_ins) {
    ts_compile_options o = ts_compile_options_default();
    o.no_fuse = no_fuse;
    o.threads = threads;
    ts_plan *p;
    ts_status s = ts_compile(g, NULL, &o, &p);
    CHECK(s == TS_OK, "compile: %s", ts_last_error());
    if (s != TS_OK) return NULL;
    for (int i = 0; i < n_in; i++) CHECK_OK(ts_plan_set_input(p, names[i], in[i], bytes[i]));
    CHECK_OK(ts_plan_set_input(p, "idx", idx, idx_bytes));
    CHECK_OK(ts_plan_step(p));
    float *out = malloc(out_bytes);
    CHECK_OK(ts_plan_read(p, "out", out, out_bytes));
    ts_plan_stats st;
    ts_plan_get_stats(p, &st);
    if (n_ins) *n_ins = st.n_instructions;
    ts_plan_free(p);
    return out;
}

static ts_val scatter(ts_graph *g, ts_val dy, ts_val idx, int64_t extent) {
    ts_attrs a = ts_attrs_zero();
    a.index.axis = 0;
    a.index.extent = extent;
    ts_val in[2] = {dy, idx};
    return ts_node_add(g, TS_OP_SCATTER_ADD, 2, in, &a, NULL);
}

/* base [E, D] (an input: not in place; or a matmul's output, in place),
 * dy [N, D], idx [N] with repeats, rows never touched, -0.0 and NaN. */
static void check_scatter_to(int64_t E, int64_t D, int64_t N, int in_place) {
    char label[96];
    snprintf(label, sizeof label, "scatter_add_to E %lld D %lld N %lld%s", (long long)E,
             (long long)D, (long long)N, in_place ? " in place" : "");
    const int64_t K = 5, db[2] = {E, D}, dd[2] = {N, D}, di[1] = {N}, da[2] = {E, K},
                  dw[2] = {K, D};
    float *base = malloc(sizeof(float) * (size_t)(E * D)), *dy = malloc(sizeof(float) * N * D);
    float *a = malloc(sizeof(float) * (size_t)(E * K)), *w = malloc(sizeof(float) * K * D);
    int64_t *idx = malloc(sizeof(int64_t) * (size_t)N);
    for (int64_t i = 0; i < E * D; i++) base[i] = frand();
    for (int64_t i = 0; i < N * D; i++) dy[i] = frand();
    for (int64_t i = 0; i < E * K; i++) a[i] = frand();
    for (int64_t i = 0; i < K * D; i++) w[i] = frand();
    for (int64_t j = 0; j < N; j++) idx[j] = (rand_r(&g_seed) % (E / 2)) * 2; /* odd rows: none */
    base[1 * D] = -0.0f;                                                      /* untouched */
    base[idx[0] * D + 1] = NAN;
    dy[0] = -0.0f;
    const char *names[3] = {"base", "dy", in_place ? "w" : NULL};
    const float *in[3] = {in_place ? a : base, dy, w};
    size_t bytes[3] = {sizeof(float) * (size_t)(in_place ? E * K : E * D),
                       sizeof(float) * (size_t)(N * D), sizeof(float) * (size_t)(K * D)};
    ts_graph *g = ts_graph_new();
    ts_val bv = ts_input(g, "base", TS_F32, 2, in_place ? da : db);
    ts_val dv = ts_input(g, "dy", TS_F32, 2, dd), iv = ts_input(g, "idx", TS_I64, 1, di);
    if (in_place) bv = ts_matmul(g, bv, ts_input(g, "w", TS_F32, 2, dw), 0, 0);
    ts_val sum = ts_add(g, bv, scatter(g, dv, iv, E));
    /* the fusion wants a sum that is not kept (an output is pinned): neg
     * is exact, so both plans still compare bit for bit */
    CHECK_OK(ts_mark_output(g, ts_neg(g, sum), "out"));
    const size_t ob = sizeof(float) * (size_t)(E * D);
    int ni_ref = 0, ni = 0;
    float *ref = run_plan(g, 1, 2, in, names, bytes, in_place ? 3 : 2, idx, sizeof(int64_t) * N, ob,
                          &ni_ref);
    for (int threads = 1; threads <= 2; threads++) {
        float *fu = run_plan(g, 0, threads, in, names, bytes, in_place ? 3 : 2, idx,
                             sizeof(int64_t) * N, ob, &ni);
        CHECK(ref && fu && !memcmp(ref, fu, ob), "%s (%d threads): differs from scatter_add + add",
              label, threads);
        CHECK(ni < ni_ref, "%s: %d instructions fused vs %d", label, ni, ni_ref);
        if (fu && !in_place) {
            CHECK(signbit(fu[1 * D]), "%s: an untouched -0.0 row summed to -0.0 (want +0.0)",
                  label);
            CHECK(isnan(fu[idx[0] * D + 1]), "%s: NaN in the base lost", label);
        }
        free(fu);
    }
    free(ref);
    ts_graph_free(g);
    free(base), free(dy), free(a), free(w), free(idx);
}

/* The head of a tied LM: dW = dlogits^T x (+ the embedding's scatter) as the
 * GEMM epilogue built before (matmul_epi with the scatter as residual) and
 * as the plain GEMM plus scatter_add_to built now: same bits on the real
 * shapes (BT tokens, vocabulary V, width D). */
static void check_head_shape(int64_t BT, int64_t V, int64_t D) {
    const int64_t dl[2] = {BT, V}, dx[2] = {BT, D}, di[1] = {BT};
    float *lg = malloc(sizeof(float) * (size_t)(BT * V)), *x = malloc(sizeof(float) * BT * D);
    float *dy = malloc(sizeof(float) * (size_t)(BT * D));
    int64_t *idx = malloc(sizeof(int64_t) * (size_t)BT);
    for (int64_t i = 0; i < BT * V; i++) lg[i] = frand() * 1e-3f;
    for (int64_t i = 0; i < BT * D; i++) x[i] = frand(), dy[i] = frand() * 1e-2f;
    for (int64_t j = 0; j < BT; j++) idx[j] = rand_r(&g_seed) % (V / 8);
    const char *names[3] = {"g", "x", "dy"};
    const float *in[3] = {lg, x, dy};
    size_t bytes[3] = {sizeof(float) * (size_t)(BT * V), sizeof(float) * (size_t)(BT * D),
                       sizeof(float) * (size_t)(BT * D)};
    float *out[2] = {NULL, NULL};
    for (int k = 0; k < 2; k++) {
        ts_graph *g = ts_graph_new();
        ts_val gv = ts_input(g, "g", TS_F32, 2, dl), xv = ts_input(g, "x", TS_F32, 2, dx);
        ts_val dv = ts_input(g, "dy", TS_F32, 2, dx), iv = ts_input(g, "idx", TS_I64, 1, di);
        ts_val s = scatter(g, dv, iv, V), r;
        if (k == 0) { /* the epilogue, as fuse.c made it before scatter_add_to */
            ts_attrs a = ts_attrs_zero();
            a.matmul_epi.trans_a = 1;
            a.matmul_epi.n_post = 1;
            a.matmul_epi.post[0] = TS_EPI_ADD;
            ts_val mi[3] = {gv, xv, s};
            r = ts_node_add(g, TS_OP_MATMUL_EPI, 3, mi, &a, NULL);
        } else {
            r = ts_add(g, ts_matmul(g, gv, xv, 1, 0), s);
        }
        CHECK_OK(ts_mark_output(g, ts_neg(g, r), "out"));
        out[k] = run_plan(g, k == 0, 2, in, names, bytes, 3, idx, sizeof(int64_t) * BT,
                          sizeof(float) * (size_t)(V * D), NULL);
        ts_graph_free(g);
    }
    CHECK(out[0] && out[1] && !memcmp(out[0], out[1], sizeof(float) * (size_t)(V * D)),
          "head [%lld, %lld]^T x [%lld, %lld]: scatter_add_to differs from the epilogue",
          (long long)BT, (long long)V, (long long)BT, (long long)D);
    free(out[0]), free(out[1]);
    free(lg), free(x), free(dy), free(idx);
}

/* ---- training ------------------------------------------------------------------ */

typedef struct run {
    float *buf[96];
    size_t bytes[96];
    int n;
    ts_plan_stats st;
    double grad_norm;
} run;

static void run_free(run *r) {
    for (int i = 0; i < r->n; i++) free(r->buf[i]);
}

static void read_value(ts_plan *p, const char *name, run *r) {
    int rank;
    int64_t dims[8];
    if (r->n >= 96 || ts_plan_value_info(p, name, NULL, &rank, dims) != TS_OK) return;
    size_t b = sizeof(float);
    for (int d = 0; d < rank; d++) b *= (size_t)dims[d];
    r->bytes[r->n] = b;
    r->buf[r->n] = malloc(b);
    CHECK_OK(ts_plan_read(p, name, r->buf[r->n], b));
    r->n++;
}

/* Four steps; every parameter and state tensor afterwards. */
static void train(ts_graph *g, const ts_model *m, int gpt, const ts_optimizer *o, int fused,
                  int threads, run *r) {
    memset(r, 0, sizeof *r);
    ts_train_spec spec = ts_train_spec_default(m->loss);
    spec.opt = *o;
    spec.fused_update = fused;
    ts_compile_options opt = ts_compile_options_default();
    opt.seed = 5;
    opt.threads = threads;
    opt.monitors = 1;
    ts_plan *p;
    ts_status s = ts_compile(g, &spec, &opt, &p);
    CHECK(s == TS_OK, "compile (fused %d): %s", fused, ts_last_error());
    if (s != TS_OK) return;
    unsigned seed = 3;
    for (int step = 0; step < 4; step++) {
        if (gpt) {
            int64_t tok[2 * 16], tgt[2 * 16];
            for (int i = 0; i < 32; i++) tok[i] = rand_r(&seed) % 64, tgt[i] = rand_r(&seed) % 64;
            tok[1] = tok[0]; /* a repeated token */
            CHECK_OK(ts_plan_set_input(p, "tokens", tok, sizeof tok));
            CHECK_OK(ts_plan_set_input(p, "targets", tgt, sizeof tgt));
        } else {
            float x[16 * 64], y[16];
            for (int i = 0; i < 16 * 64; i++) x[i] = (float)rand_r(&seed) / RAND_MAX - 0.5f;
            for (int i = 0; i < 16; i++) y[i] = (float)rand_r(&seed) / RAND_MAX;
            CHECK_OK(ts_plan_set_input(p, "x", x, sizeof x));
            CHECK_OK(ts_plan_set_input(p, "y", y, sizeof y));
        }
        CHECK_OK(ts_plan_step(p));
    }
    CHECK_OK(ts_plan_grad_norm(p, &r->grad_norm));
    for (int i = 0; i < ts_plan_persistent_count(p); i++) {
        ts_persistent pv;
        if (ts_plan_persistent(p, i, &pv) == TS_OK) read_value(p, pv.name, r);
    }
    ts_plan_get_stats(p, &r->st);
    if (fused) {
        /* the gradients are temporaries now: not readable after the step */
        const char *first = ts_plan_param_name(p, 0);
        char name[300];
        snprintf(name, sizeof name, "grad:%s", first);
        float one;
        CHECK(ts_plan_read(p, name, &one, sizeof one) != TS_OK, "fused: gradient %s still readable",
              name);
    }
    ts_plan_free(p);
}

static void compare_training(const char *label, ts_graph *g, const ts_model *m, int gpt,
                             const ts_optimizer *o) {
    for (int threads = 1; threads <= 2; threads++) {
        run a, b;
        train(g, m, gpt, o, 0, threads, &a);
        train(g, m, gpt, o, 1, threads, &b);
        int same = a.n == b.n && a.n > 0;
        for (int i = 0; same && i < a.n; i++)
            same = a.bytes[i] == b.bytes[i] && !memcmp(a.buf[i], b.buf[i], a.bytes[i]);
        CHECK(same,
              "%s (%d threads): parameters or state differ after 4 fused updates (%d vs %d "
              "tensors)",
              label, threads, a.n, b.n);
        CHECK(a.grad_norm == b.grad_norm, "%s: gradient norm %.9g fused vs %.9g", label,
              b.grad_norm, a.grad_norm);
        CHECK(b.st.grad_bytes == 0 && a.st.grad_bytes > 0, "%s: gradient region %zu fused, %zu",
              label, b.st.grad_bytes, a.st.grad_bytes);
        CHECK(b.st.arena_bytes < a.st.arena_bytes, "%s: arena %zu fused vs %zu", label,
              b.st.arena_bytes, a.st.arena_bytes);
        run_free(&a);
        run_free(&b);
    }
}

/* The updates run inside the backward pass: some update comes before the
 * last GEMM of the schedule (the unfused plan has them all after it). */
static void check_interleaved(ts_graph *g, const ts_model *m) {
    for (int fused = 0; fused < 2; fused++) {
        ts_train_spec spec = ts_train_spec_default(m->loss);
        spec.opt = ts_adamw(1e-3, 0.9, 0.999, 1e-8, 0.01);
        spec.fused_update = fused;
        ts_compile_options opt = ts_compile_options_default();
        opt.monitors = 1;
        ts_plan *p = NULL;
        ts_compiled_graph k;
        CHECK_OK(ts_compile_keep(g, &spec, &opt, &p, &k));
        int first_upd = -1, last_mm = -1, n_upd = 0;
        for (int i = 0; k.graph && i < k.n_order; i++) {
            int op = k.graph->nodes[k.order[i]].op;
            if (ts_op_get(op)->flags & TS_OPF_UPDATE) {
                n_upd++;
                if (first_upd < 0) first_upd = i;
            }
            if (op == TS_OP_MATMUL || op == TS_OP_MATMUL_EPI) last_mm = i;
        }
        if (fused)
            CHECK(first_upd >= 0 && first_upd < last_mm && n_upd == ts_plan_param_count(p),
                  "fused: first update at %d, last GEMM at %d, %d updates for %d parameters",
                  first_upd, last_mm, n_upd, ts_plan_param_count(p));
        else
            CHECK(first_upd > last_mm && n_upd == 1, "unfused: first update at %d, last GEMM %d",
                  first_upd, last_mm);
        ts_compiled_graph_free(&k);
        ts_plan_free(p);
    }
}

static void expect_refused(ts_graph *g, const ts_model *m, int clip, int scale, const char *want) {
    ts_train_spec spec = ts_train_spec_default(m->loss);
    spec.opt = ts_adamw(1e-3, 0.9, 0.999, 1e-8, 0.01);
    spec.fused_update = 1;
    spec.clip_grad_norm = clip ? 1.0 : 0.0;
    ts_compile_options opt = ts_compile_options_default();
    if (scale) {
        opt.precision.compute = TS_BF16;
        opt.precision.loss_scale = TS_SCALE_DYNAMIC;
    }
    ts_plan *p = NULL;
    ts_status s = ts_compile(g, &spec, &opt, &p);
    CHECK(s != TS_OK && strstr(ts_last_error(), "optim.fused_update") &&
              strstr(ts_last_error(), want),
          "fused update with %s: %s", want, s == TS_OK ? "accepted" : ts_last_error());
    ts_plan_free(p);
}

int main(void) {
    check_scatter_to(40, 24, 30, 0);
    check_scatter_to(40, 24, 30, 1);
    check_scatter_to(1000, 70, 300, 1); /* several column blocks and row blocks */
    check_head_shape(2048, 8192, 512);  /* W3: batch 8 x ctx 256, vocabulary 8192, d 512 */
    check_head_shape(256, 50257, 768);  /* GPT-2 124M at batch 4 x ctx 64 */

    ts_mlp_config mc = {16, 8, 8, 0, 64, 2, 1, 1, 0};
    ts_graph *g = ts_graph_new();
    ts_model m;
    CHECK_OK(ts_build_mlp(g, &mc, &m));
    ts_optimizer sgd = ts_sgd(0.05, 0.9, 0, 1, 1e-4), adam = ts_adam(1e-3, 0.9, 0.999, 1e-8, 0.01);
    compare_training("mlp sgd nesterov", g, &m, 0, &sgd);
    compare_training("mlp adam", g, &m, 0, &adam);
    expect_refused(g, &m, 1, 0, "train.clip_grad_norm");
    expect_refused(g, &m, 0, 1, "precision.loss_scale");
    ts_graph_free(g);

    ts_gpt_config gc = {2, 16, 64, 32, 2, 2, 0.0};
    g = ts_graph_new();
    CHECK_OK(ts_build_gpt(g, &gc, &m));
    ts_optimizer adamw = ts_adamw(1e-3, 0.9, 0.999, 1e-8, 0.1);
    compare_training("gpt adamw (tied head)", g, &m, 1, &adamw);
    check_interleaved(g, &m);
    ts_graph_free(g);
    return check_summary("fused_update");
}
