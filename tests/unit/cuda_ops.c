/* The CUDA backend's kernels against the CPU reference kernels (docs/cuda.md):
 * small graphs, one family of ops each (elementwise and fused chains with
 * broadcasting, GEMMs with bias epilogues, bf16 GEMMs, fp16 GEMMs with the
 * GradScaler's unscale and update gate, reductions, shape
 * ops, embedding and its scatter-add backward with repeated indices,
 * LayerNorm, cross-entropy, causal attention, AdamW with clipping,
 * convolutions, batch norm, pooling and a small CNN), run
 * forward and backward on deterministic pseudo-random inputs on both
 * backends; outputs, gradients and updated parameters must agree within a
 * tolerance per dtype.
 *
 * Exits 77 (skipped) where no GPU can run the plan. TESSEL_CUDA_TEST_BACKEND
 * names the backend under test instead of "cuda": with "cpu" (ctest
 * unit/cuda_ops_harness) the harness itself runs on any machine, every
 * comparison then being exact. */
#include <stdlib.h>
#include <string.h>
#include "check.h"

#define MAXN 8
typedef struct tcase {
    const char *name;
    ts_graph *g;
    ts_val loss;           /* TS_NONE: an inference plan */
    const char *in[MAXN];  /* inputs to fill */
    const char *cmp[MAXN]; /* values compared after the steps */
    int64_t idx_hi;        /* integer inputs lie in [0, idx_hi) */
    int one_step;          /* compare after one step (the first step's gradients) */
    double tol;            /* relative, plus tol * 1e-2 absolute */
    ts_dtype compute;      /* TS_F32, or TS_BF16 for mixed precision */
    double clip;           /* clip_grad_norm */
} tcase;

static const char *dev_backend;
static int skipped;

static uint32_t mix(uint32_t x) {
    x ^= x >> 16;
    x *= 0x7feb352du;
    x ^= x >> 15;
    x *= 0x846ca68bu;
    return x ^ (x >> 16);
}

static void fill(ts_plan *p, const char *name, int64_t hi, uint32_t salt) {
    ts_dtype dt;
    int rank;
    int64_t dims[8], n = 1;
    CHECK_OK(ts_plan_value_info(p, name, &dt, &rank, dims));
    for (int d = 0; d < rank; d++) n *= dims[d];
    size_t es = ts_dtype_size(dt);
    unsigned char *buf = calloc((size_t)n, es);
    CHECK(buf != NULL, "malloc");
    if (!buf) return;
    for (int64_t i = 0; i < n; i++) {
        uint32_t r = mix((uint32_t)i * 2654435761u + salt);
        if (dt == TS_F32)
            ((float *)buf)[i] = (float)((double)(r % 20001) / 10000.0 - 1.0) * 1.5f;
        else if (dt == TS_I64)
            ((int64_t *)buf)[i] = (int64_t)(r % (uint32_t)hi);
        else if (dt == TS_I32)
            ((int32_t *)buf)[i] = (int32_t)(r % (uint32_t)hi);
        else if (dt == TS_U8)
            buf[i] = (unsigned char)(r & 1);
    }
    CHECK_OK(ts_plan_set_input(p, name, buf, (size_t)n * es));
    free(buf);
}

static float *read_all(ts_plan *p, const char *name, int64_t *n_out) {
    ts_dtype dt;
    int rank;
    int64_t dims[8], n = 1;
    if (ts_plan_value_info(p, name, &dt, &rank, dims) != TS_OK || dt != TS_F32) {
        CHECK(0, "'%s' is not an f32 value of the plan: %s", name, ts_last_error());
        return NULL;
    }
    for (int d = 0; d < rank; d++) n *= dims[d];
    float *x = malloc(sizeof(float) * (size_t)(n ? n : 1));
    CHECK(x != NULL, "malloc");
    if (x) CHECK_OK(ts_plan_read(p, name, x, sizeof(float) * (size_t)n));
    *n_out = n;
    return x;
}

static ts_status compile_on(const tcase *c, const char *backend, ts_plan **p) {
    ts_compile_options o = ts_compile_options_default();
    o.backend = backend;
    o.seed = 7;
    o.precision.compute = c->compute;
    if (c->loss.id < 0 || !ts_val_ok(c->loss)) return ts_compile(c->g, NULL, &o, p);
    ts_train_spec spec = ts_train_spec_default(c->loss);
    spec.opt = ts_adamw(1e-2, 0.9, 0.999, 1e-8, 0.01);
    spec.clip_grad_norm = c->clip;
    return ts_compile(c->g, &spec, &o, p);
}

/* Two steps on each backend (the second sees the first's update), then the
 * compared values. */
static void run_case(tcase *c) {
    if (ts_graph_status(c->g) != TS_OK) {
        CHECK(0, "%s: building the graph: %s", c->name, ts_graph_error(c->g));
        return;
    }
    ts_plan *ref = NULL, *dev = NULL;
    CHECK_OK(compile_on(c, "cpu", &ref));
    ts_status s = compile_on(c, dev_backend, &dev);
    if (s != TS_OK) {
        const char *e = ts_last_error();
        if (strstr(e, "no GPU/driver") || strstr(e, "libtessel_cuda.so")) {
            skipped = 1;
            ts_plan_free(ref);
            return;
        }
        CHECK(0, "%s: compiling for %s: %s", c->name, dev_backend, e);
        ts_plan_free(ref);
        return;
    }
    for (int step = 0; step < (c->one_step ? 1 : 2) && ref && dev; step++) {
        for (int j = 0; j < MAXN && c->in[j]; j++) {
            fill(ref, c->in[j], c->idx_hi, (uint32_t)(j * 977 + step * 31));
            fill(dev, c->in[j], c->idx_hi, (uint32_t)(j * 977 + step * 31));
        }
        CHECK_OK(ts_plan_step(ref));
        CHECK_OK(ts_plan_step(dev));
    }
    for (int j = 0; j < MAXN && c->cmp[j] && ref && dev; j++) {
        int64_t n = 0, m = 0, bad = 0, first = -1;
        float *a = read_all(ref, c->cmp[j], &n), *b = read_all(dev, c->cmp[j], &m);
        double worst = 0, d2 = 0, n2 = 0;
        for (int64_t i = 0; a && b && i < n && n == m; i++) {
            double d = fabs((double)a[i] - (double)b[i]);
            double lim = c->tol * fabs((double)a[i]) + c->tol * 1e-2;
            if (!(d <= lim)) {
                if (first < 0) first = i;
                bad++;
            }
            if (d > worst) worst = d;
            d2 += d * d, n2 += (double)a[i] * a[i];
        }
        if (c->compute != TS_F32) {
            /* Two correct bf16 (fp16) plans round in different places (the
             * CPU's bf16 kernels keep some intermediates the GPU rounds), and
             * Adam's first step turns a near-zero gradient's rounding into a
             * step of either sign: compared as a whole, relative L2. */
            double rel = n2 > 0 ? sqrt(d2 / n2) : sqrt(d2);
            CHECK(a && b && n == m && rel <= c->tol,
                  "%s: '%s' relative L2 distance %.3g above %.3g (%lld of %lld elements beyond "
                  "the elementwise limit, largest difference %.3g)",
                  c->name, c->cmp[j], rel, c->tol, (long long)bad, (long long)n, worst);
            if (bad)
                printf("%s: '%s' relative L2 %.3g; %lld of %lld elements beyond %.0e relative\n",
                       c->name, c->cmp[j], rel, (long long)bad, (long long)n, c->tol);
            free(a);
            free(b);
            continue;
        }
        CHECK(a && b && n == m && bad == 0,
              "%s: '%s' differs at %lld of %lld elements (first %lld: cpu %.9g, %s %.9g), "
              "largest difference %.3g",
              c->name, c->cmp[j], (long long)bad, (long long)n, (long long)first,
              a && first >= 0 ? a[first] : 0.0, dev_backend, b && first >= 0 ? b[first] : 0.0,
              worst);
        free(a);
        free(b);
    }
    ts_plan_free(ref);
    ts_plan_free(dev);
}

static ts_val param(ts_graph *g, const char *name, int rank, const int64_t *dims) {
    return ts_param(g, name, TS_F32, rank, dims, ts_init_uniform(-0.5, 0.5));
}

/* loss = sum(y * r), r an input of y's shape: every element of y gets its
 * own gradient. */
static ts_val weighted_sum(ts_graph *g, ts_val y, int rank, const int64_t *dims) {
    ts_val r = ts_input(g, "r", TS_F32, rank, dims);
    return ts_sum(g, ts_mul(g, y, r), 0, NULL, 0);
}

static void case_eltwise(void) {
    tcase c = {.name = "elementwise", .tol = 1e-5, .compute = TS_F32};
    ts_graph *g = c.g = ts_graph_new();
    int64_t d0[] = {4, 1, 5}, d1[] = {3, 5}, dc[] = {4, 3, 5};
    ts_val x0 = ts_input(g, "x0", TS_F32, 3, d0), x1 = ts_input(g, "x1", TS_F32, 2, d1);
    ts_val cond = ts_input(g, "cond", TS_U8, 3, dc);
    ts_val a =
        ts_add(g, ts_gelu(g, x0, TS_GELU_TANH), ts_mul(g, ts_sigmoid(g, x1), ts_tanh(g, x0)));
    ts_val b = ts_div(g, ts_sub(g, ts_gelu(g, x1, TS_GELU_ERF), ts_relu(g, x0)),
                      ts_affine_scalar(g, ts_abs(g, x0), 1.0, 1.5));
    ts_val e = ts_maximum(g, ts_exp(g, x1), ts_leaky_relu(g, x0, 0.1));
    ts_val f = ts_minimum(g, ts_pow_scalar(g, ts_sqrt(g, ts_abs(g, x1)), 3.0),
                          ts_log(g, ts_affine_scalar(g, ts_abs(g, x0), 1.0, 0.5)));
    ts_val y = ts_where(g, cond, ts_add(g, a, b), ts_sub(g, e, ts_neg(g, f)));
    ts_mark_output(g, ts_rsqrt(g, ts_affine_scalar(g, ts_abs(g, y), 1.0, 1.0)), "y");
    c.loss = TS_NONE;
    c.in[0] = "x0", c.in[1] = "x1", c.in[2] = "cond";
    c.cmp[0] = "y";
    run_case(&c);
    ts_graph_free(g);
}

/* An MLP layer: matmul_epi with a bias, relu, LayerNorm, gelu; its
 * backward (matmuls, bias sums, unary_bwd, fused chains, layer_norm_bwd)
 * and two AdamW updates with clipping. */
static void case_mlp(ts_dtype compute, double tol, const char *name) {
    tcase c = {.name = name, .tol = tol, .compute = compute, .clip = 0.5};
    ts_graph *g = c.g = ts_graph_new();
    int64_t xd[] = {2, 6, 16}, wd[] = {24, 16}, bd[] = {24}, w2d[] = {8, 24}, yd[] = {2, 6, 8};
    ts_val x = ts_input(g, "x", TS_F32, 3, xd);
    ts_val w = param(g, "w", 2, wd), b = param(g, "b", 1, bd), w2 = param(g, "w2", 2, w2d);
    ts_val lw = ts_param(g, "ln.weight", TS_F32, 1, bd, ts_init_ones());
    ts_val lb = ts_param(g, "ln.bias", TS_F32, 1, bd, ts_init_zeros());
    ts_val h = ts_layer_norm(g, ts_relu(g, ts_linear(g, x, w, b)), lw, lb, 1e-5);
    ts_val y = ts_linear(g, ts_gelu(g, h, TS_GELU_TANH), w2, TS_NONE);
    c.loss = weighted_sum(g, y, 3, yd);
    c.in[0] = "x", c.in[1] = "r";
    c.cmp[0] = "grad:w", c.cmp[1] = "grad:b", c.cmp[2] = "grad:w2", c.cmp[3] = "grad:ln.weight";
    c.cmp[4] = "grad:ln.bias", c.cmp[5] = "w", c.cmp[6] = "w2";
    run_case(&c);
    ts_graph_free(g);
}

/* Batched matmul with transposes and both broadcast forms, reductions. */
static void case_matmul_reduce(void) {
    tcase c = {.name = "matmul and reductions", .tol = 1e-4, .compute = TS_F32};
    ts_graph *g = c.g = ts_graph_new();
    int64_t ad[] = {3, 7, 5}, bd[] = {3, 6, 7}, wd[] = {4, 5};
    ts_val a = ts_input(g, "a", TS_F32, 3, ad), bt = ts_input(g, "bt", TS_F32, 3, bd);
    ts_val w = param(g, "w", 2, wd);
    ts_val m1 = ts_matmul(g, a, bt, 1, 1); /* [3,5,7]^T-ish: a^T [3,5,7] x bt^T [3,7,6] */
    ts_val m2 = ts_matmul(g, a, w, 0, 1);  /* [3,7,5] x [5,4] -> [3,7,4] */
    int ax02[] = {0, 2}, ax1[] = {1};
    ts_mark_output(g, ts_sum(g, m1, 2, ax02, 1), "s1");
    ts_mark_output(g, ts_mean(g, m2, 1, ax1, 0), "s2");
    int64_t sd[] = {3, 7, 4};
    c.loss = weighted_sum(g, m2, 3, sd);
    c.in[0] = "a", c.in[1] = "bt", c.in[2] = "r";
    c.cmp[0] = "s1", c.cmp[1] = "s2", c.cmp[2] = "grad:w";
    run_case(&c);
    ts_graph_free(g);
}

/* Embedding (gather) with repeated tokens: its scatter-add backward sums
 * several rows per index; permute, slice and concat around it. */
static void case_embedding_shapes(void) {
    tcase c = {.name = "embedding and shapes", .tol = 1e-5, .compute = TS_F32, .idx_hi = 5};
    ts_graph *g = c.g = ts_graph_new();
    int64_t td[] = {11, 6}, id[] = {3, 8}, od[] = {3, 6, 8};
    ts_val table = param(g, "table", 2, td);
    ts_val tok = ts_input(g, "tok", TS_I64, 2, id);
    ts_val e = ts_embedding(g, table, tok); /* [3, 8, 6] */
    int perm[] = {0, 2, 1};
    ts_val p = ts_permute(g, e, perm); /* [3, 6, 8] */
    ts_val s0 = ts_slice(g, p, 2, 0, 3), s1 = ts_slice(g, p, 2, 3, 8);
    ts_val parts[] = {ts_tanh(g, s1), s0};
    ts_val y = ts_concat(g, 2, parts, 2); /* [3, 6, 8] */
    c.loss = weighted_sum(g, y, 3, od);
    c.in[0] = "tok", c.in[1] = "r";
    c.cmp[0] = "grad:table", c.cmp[1] = "table";
    run_case(&c);
    ts_graph_free(g);
}

/* Cross-entropy over a linear layer's logits, forward and backward. */
static void case_cross_entropy(void) {
    tcase c = {.name = "cross-entropy", .tol = 1e-4, .compute = TS_F32, .idx_hi = 9};
    ts_graph *g = c.g = ts_graph_new();
    int64_t xd[] = {12, 10}, wd[] = {9, 10}, td[] = {12};
    ts_val x = ts_input(g, "x", TS_F32, 2, xd), w = param(g, "w", 2, wd);
    ts_val t = ts_input(g, "t", TS_I64, 1, td);
    c.loss = ts_cross_entropy(g, ts_linear(g, x, w, TS_NONE), t, -100);
    c.in[0] = "x", c.in[1] = "t";
    c.cmp[0] = "grad:w", c.cmp[1] = "w";
    run_case(&c);
    ts_graph_free(g);
}

/* Causal attention over projected q, k, v [2, 3, 16, 8]. */
static void case_attention(void) {
    tcase c = {.name = "attention", .tol = 1e-4, .compute = TS_F32};
    ts_graph *g = c.g = ts_graph_new();
    int64_t qd[] = {2, 3, 16, 8}, wd[] = {8, 8};
    ts_val x = ts_input(g, "x", TS_F32, 4, qd);
    ts_val q = ts_matmul(g, x, param(g, "wq", 2, wd), 0, 1);
    ts_val k = ts_matmul(g, x, param(g, "wk", 2, wd), 0, 1);
    ts_val v = ts_matmul(g, x, param(g, "wv", 2, wd), 0, 1);
    ts_val o = ts_causal_attention(g, q, k, v);
    c.loss = weighted_sum(g, o, 4, qd);
    c.in[0] = "x", c.in[1] = "r";
    c.cmp[0] = "grad:wq", c.cmp[1] = "grad:wk", c.cmp[2] = "grad:wv";
    run_case(&c);
    ts_graph_free(g);
}

/* Attention in bf16 plans, head size 64 (the GPU's tensor-core kernels,
 * attention_tc.cu), T = 100 (one full tile of 64 and a ragged one),
 * causal and not: gradients of the projections as a whole (relative L2). */
static void case_attention_bf16(int causal) {
    tcase c = {.name = causal ? "attention bf16 causal" : "attention bf16",
               .tol = 2e-2,
               .compute = TS_BF16};
    ts_graph *g = c.g = ts_graph_new();
    int64_t qd[] = {2, 3, 100, 64}, wd[] = {64, 64};
    ts_val x = ts_input(g, "x", TS_F32, 4, qd);
    ts_val q = ts_matmul(g, x, param(g, "wq", 2, wd), 0, 1);
    ts_val k = ts_matmul(g, x, param(g, "wk", 2, wd), 0, 1);
    ts_val v = ts_matmul(g, x, param(g, "wv", 2, wd), 0, 1);
    ts_val o = ts_attention(g, q, k, v, causal, 0.125);
    ts_mark_output(g, o, "o");
    c.loss = weighted_sum(g, o, 4, qd);
    c.in[0] = "x", c.in[1] = "r";
    c.cmp[0] = "o", c.cmp[1] = "grad:wq", c.cmp[2] = "grad:wk", c.cmp[3] = "grad:wv";
    run_case(&c);
    ts_graph_free(g);
}

/* A one-layer GPT (d 128, 2 heads of 64, T 100) in a bf16 plan: on the GPU the attention
 * reads the qkv projection in place (passes/attention_qkv.c, the packed form of the
 * tensor-core kernels); the first step's gradients as a whole against the CPU's. (After a
 * second step at lr 1e-2, AdamW's steps of near-zero gradients, which the two bf16 plans
 * round differently, put the gradients 2.5-4 % apart in L2 on an H200.) */
static void case_gpt_packed(void) {
    tcase c = {.name = "gpt bf16 packed attention",
               .tol = 2e-2,
               .compute = TS_BF16,
               .idx_hi = 50,
               .one_step = 1};
    ts_graph *g = c.g = ts_graph_new();
    ts_gpt_config gc = {2, 100, 50, 128, 1, 2, 0.0};
    ts_model m;
    if (ts_build_gpt(g, &gc, &m) != TS_OK) {
        CHECK(0, "building the gpt: %s", ts_graph_error(g));
        ts_graph_free(g);
        return;
    }
    c.loss = m.loss;
    c.in[0] = "tokens", c.in[1] = "targets";
    c.cmp[0] = "grad:blocks.0.attn.c_attn.weight", c.cmp[1] = "grad:blocks.0.attn.c_proj.weight";
    c.cmp[2] = "grad:blocks.0.fc.weight", c.cmp[3] = "grad:blocks.0.ln_1.weight";
    run_case(&c);
    ts_graph_free(g);
}

/* Two convolutions (conv.c on cuDNN): 3x3 stride 1 padding 1 with a bias,
 * then 3x3 stride 2 padding 1 (9 -> 5, so conv_bwd_data's dx is one larger
 * than the smallest input: conv.c's extra[]); channels last, or channels
 * first with 2 groups and a dilated second conv. x is scaled by a
 * parameter so conv_bwd_data runs for both. */
static void case_conv(int cl) {
    tcase c = {.name = cl ? "conv channels last" : "conv channels first, groups, dilation",
               .tol = 1e-4,
               .compute = TS_F32};
    ts_graph *g = c.g = ts_graph_new();
    const ts_layout lay = cl ? TS_CHANNELS_LAST : TS_CHANNELS_FIRST;
    const int64_t G = cl ? 1 : 2;
    int64_t xd_cl[] = {2, 9, 9, 4}, xd_cf[] = {2, 4, 9, 9}, sd[] = {4};
    int64_t w1d[] = {6, 4 / G, 3, 3}, b1d[] = {6}, w2d[] = {4, 6 / G, 3, 3};
    int64_t yd_cl[] = {2, 5, 5, 4}, yd_cf[] = {2, 4, 4, 4};
    ts_val x = ts_input(g, "x", TS_F32, 4, cl ? xd_cl : xd_cf);
    ts_val sc = param(g, "scale", 1, sd);
    int64_t bshape[] = {4, 1, 1};
    ts_val xs = ts_mul(g, x, cl ? sc : ts_reshape(g, sc, 3, bshape));
    ts_val w1 = param(g, "w1", 4, w1d), b1 = param(g, "b1", 1, b1d), w2 = param(g, "w2", 4, w2d);
    int64_t one[] = {1, 1}, two[] = {2, 2}, pad[] = {1, 1};
    ts_val h = ts_conv_layout(g, xs, w1, b1, 2, one, pad, NULL, G, lay);
    /* channels first: dilation 2 with padding 1 and stride 2 on 9: (9 + 2 - 5) / 2 + 1 = 4 */
    ts_val y = ts_conv_layout(g, ts_tanh(g, h), w2, TS_NONE, 2, two, pad, cl ? NULL : two, G, lay);
    c.loss = weighted_sum(g, y, 4, cl ? yd_cl : yd_cf);
    c.in[0] = "x", c.in[1] = "r";
    c.cmp[0] = "grad:w1", c.cmp[1] = "grad:b1", c.cmp[2] = "grad:w2", c.cmp[3] = "grad:scale";
    c.cmp[4] = "w1", c.cmp[5] = "w2";
    run_case(&c);
    ts_graph_free(g);
}

/* Batch norm in training mode (batch statistics, running statistics'
 * update): channels first without ReLU, channels last with the fused ReLU;
 * more than one reduction chunk per channel (6 x 40 x 40 = 9600 values). */
static void case_batch_norm(int cl) {
    /* grad:scale sums x times batch norm's input gradient over 9600 values a channel, terms
     * that cancel (that gradient has zero mean per channel): on an H200 the channels-first
     * sums came out 1.8e-4 apart (0.224722 CPU, 0.224681 GPU), hence 5e-4 here. */
    tcase c = {.name = cl ? "batch norm + relu channels last" : "batch norm channels first",
               .tol = 5e-4,
               .compute = TS_F32};
    ts_graph *g = c.g = ts_graph_new();
    int64_t xd_cl[] = {6, 40, 40, 3}, xd_cf[] = {6, 3, 40, 40}, cd[] = {3};
    ts_val x = ts_input(g, "x", TS_F32, 4, cl ? xd_cl : xd_cf);
    ts_val sc = param(g, "scale", 1, cd);
    int64_t bshape[] = {3, 1, 1};
    ts_val xs = ts_mul(g, x, cl ? sc : ts_reshape(g, sc, 3, bshape));
    ts_val bw = param(g, "bn.weight", 1, cd), bb = param(g, "bn.bias", 1, cd);
    ts_val y = ts_batch_norm_layout(g, xs, bw, bb, "bn", 0.1, 1e-5, cl,
                                    cl ? TS_CHANNELS_LAST : TS_CHANNELS_FIRST);
    c.loss = weighted_sum(g, y, 4, cl ? xd_cl : xd_cf);
    c.in[0] = "x", c.in[1] = "r";
    c.cmp[0] = "grad:bn.weight", c.cmp[1] = "grad:bn.bias", c.cmp[2] = "grad:scale";
    c.cmp[3] = "bn.running_mean", c.cmp[4] = "bn.running_var", c.cmp[5] = "bn.weight";
    run_case(&c);
    ts_graph_free(g);
}

/* Max pooling with overlapping windows and padding (kernel 3, stride 2,
 * padding 1) after a ReLU, so windows hold ties at 0 (the first maximum
 * takes the gradient); channels last, or channels first with average
 * pooling counting the padding. */
static void case_pool(int cl) {
    tcase c = {.name = cl ? "max pool channels last" : "avg pool channels first",
               .tol = 1e-4,
               .compute = TS_F32};
    ts_graph *g = c.g = ts_graph_new();
    int64_t xd_cl[] = {2, 9, 8, 3}, xd_cf[] = {2, 3, 9, 8}, cd[] = {3};
    int64_t yd_cl[] = {2, 5, 4, 3}, yd_cf[] = {2, 3, 5, 4};
    ts_val x = ts_input(g, "x", TS_F32, 4, cl ? xd_cl : xd_cf);
    ts_val sc = param(g, "scale", 1, cd);
    int64_t bshape[] = {3, 1, 1};
    ts_val xs = ts_relu(g, ts_mul(g, x, cl ? sc : ts_reshape(g, sc, 3, bshape)));
    int64_t k[] = {3, 3}, st[] = {2, 2}, pad[] = {1, 1};
    ts_val y = cl ? ts_max_pool_layout(g, xs, 2, k, st, pad, TS_CHANNELS_LAST)
                  : ts_avg_pool_layout(g, xs, 2, k, st, pad, 1, TS_CHANNELS_FIRST);
    c.loss = weighted_sum(g, y, 4, cl ? yd_cl : yd_cf);
    c.in[0] = "x", c.in[1] = "r";
    c.cmp[0] = "grad:scale", c.cmp[1] = "scale";
    run_case(&c);
    ts_graph_free(g);
}

/* The CNN's block (src/models/cnn.c): conv 3x3 (no bias) -> batch norm with
 * the fused ReLU -> max pool 2 -> linear -> cross-entropy, channels last,
 * two of them; AdamW on every parameter. */
static void case_cnn_stack(void) {
    tcase c = {.name = "conv-bn-relu-pool-linear", .tol = 1e-4, .compute = TS_F32, .idx_hi = 5};
    ts_graph *g = c.g = ts_graph_new();
    int64_t xd[] = {4, 12, 12, 2}, w1d[] = {8, 2, 3, 3}, c1[] = {8}, w2d[] = {6, 8, 3, 3};
    int64_t c2[] = {6}, fd[] = {4, 3 * 3 * 6}, ld[] = {5, 3 * 3 * 6}, td[] = {4};
    ts_val x = ts_input(g, "x", TS_F32, 4, xd);
    ts_val t = ts_input(g, "t", TS_I64, 1, td);
    int64_t one[] = {1, 1}, pad[] = {1, 1}, k2[] = {2, 2};
    ts_val h = ts_conv_layout(g, x, param(g, "conv1.weight", 4, w1d), TS_NONE, 2, one, pad, NULL, 1,
                              TS_CHANNELS_LAST);
    h = ts_batch_norm_layout(g, h, param(g, "bn1.weight", 1, c1), param(g, "bn1.bias", 1, c1),
                             "bn1", 0.1, 1e-5, 1, TS_CHANNELS_LAST);
    h = ts_max_pool_layout(g, h, 2, k2, NULL, NULL, TS_CHANNELS_LAST); /* [4, 6, 6, 8] */
    h = ts_conv_layout(g, h, param(g, "conv2.weight", 4, w2d), TS_NONE, 2, one, pad, NULL, 1,
                       TS_CHANNELS_LAST);
    h = ts_batch_norm_layout(g, h, param(g, "bn2.weight", 1, c2), param(g, "bn2.bias", 1, c2),
                             "bn2", 0.1, 1e-5, 1, TS_CHANNELS_LAST);
    h = ts_max_pool_layout(g, h, 2, k2, NULL, NULL, TS_CHANNELS_LAST); /* [4, 3, 3, 6] */
    ts_val logits = ts_linear(g, ts_reshape(g, h, 2, fd), param(g, "fc.weight", 2, ld), TS_NONE);
    c.loss = ts_cross_entropy(g, logits, t, -100);
    c.in[0] = "x", c.in[1] = "t";
    c.cmp[0] = "grad:conv1.weight", c.cmp[1] = "grad:conv2.weight", c.cmp[2] = "grad:bn1.weight";
    c.cmp[3] = "grad:bn2.bias", c.cmp[4] = "grad:fc.weight", c.cmp[5] = "conv1.weight";
    c.cmp[6] = "bn1.running_var", c.cmp[7] = "bn2.running_mean";
    run_case(&c);
    ts_graph_free(g);
}

int main(void) {
    dev_backend = getenv("TESSEL_CUDA_TEST_BACKEND");
    if (!dev_backend || !*dev_backend) dev_backend = "cuda";
    case_eltwise();
    if (skipped) {
        printf("cuda ops: skipped (no GPU here: %s)\n", ts_last_error());
        return 77;
    }
    case_mlp(TS_F32, 1e-4, "mlp f32");
    case_mlp(TS_BF16, 2e-2, "mlp bf16");
    case_mlp(TS_F16, 1e-2, "mlp fp16, dynamic loss scaling");
    case_matmul_reduce();
    case_embedding_shapes();
    case_cross_entropy();
    case_attention();
    case_attention_bf16(1);
    case_attention_bf16(0);
    case_gpt_packed();
    case_conv(1);
    case_conv(0);
    case_batch_norm(0);
    case_batch_norm(1);
    case_pool(1);
    case_pool(0);
    case_cnn_stack();
    return check_summary("cuda ops");
}
