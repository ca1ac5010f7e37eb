/* The precision pass (bf16/f16 autocast of matmuls) and its kernels.
 *
 * - structure: on a 2-hidden-layer MLP every forward and backward matmul
 *   reads cast operands (the forward ones keep their f32 bias epilogue,
 *   matmul_epi), each value is cast once, master weights,
 *   gradients and the optimizer stay f32, keep_fp32 opts out;
 * - kernels: oneDNN bf16 x bf16 -> f32 against the reference kernel
 *   (which widens the same bf16 operands exactly and multiplies in f32):
 *   same products, only the summation order differs, so they agree to a
 *   few f32 ulps of the row sum;
 * - numerics: one forward/backward in bf16 and f16 against f32 within
 *   the error a bf16/f16 rounding of the operands gives;
 * - convergence: a small MLP regression trained 150 steps in bf16 and f32
 *   from the same initial weights ends at losses within 5 % (see below);
 * - determinism: two bf16 runs give bit-identical weights. */
#include <stdlib.h>
#include <string.h>
#include "backends/cpu/dnnl_caps.h"
#include "check.h"
#include "frontend/config.h"
#include "plan/plan.h"

static int count_op(const ts_graph *g, int op) {
    int n = 0;
    for (int i = 0; i < g->n_nodes; i++) n += !g->nodes[i].dead && g->nodes[i].op == op;
    return n;
}

static ts_mlp_config small_mlp(void) {
    ts_mlp_config c = {0};
    c.batch = 32;
    c.in_dim = 24;
    c.hidden = 48;
    c.n_hidden = 2;
    c.out_dim = 4;
    c.layer_norm = 1;
    return c;
}

/* Deterministic regression data: y = tanh(x A) for a fixed A. */
static void make_data(float *x, float *y, const ts_mlp_config *c, int step) {
    uint64_t s = 0x243f6a8885a308d3ull ^ (uint64_t)step * 0x9e3779b97f4a7c15ull;
    for (int64_t i = 0; i < c->batch * c->in_dim; i++) {
        s ^= s << 13, s ^= s >> 7, s ^= s << 17;
        x[i] = (float)((double)(s >> 11) / 9007199254740992.0 * 2 - 1);
    }
    for (int64_t b = 0; b < c->batch; b++)
        for (int64_t o = 0; o < c->out_dim; o++) {
            double acc = 0;
            for (int64_t i = 0; i < c->in_dim; i++)
                acc += x[b * c->in_dim + i] * sin((double)(i * 7 + o * 3 + 1));
            y[b * c->out_dim + o] = (float)tanh(acc / 3);
        }
}

/* kept (may be NULL): the compiled graph, for checking what the passes did */
static ts_plan *build_keep(ts_dtype compute, const char *keep, int reference, int opt_adam,
                           ts_compiled_graph *kept) {
    ts_graph *g = ts_graph_new();
    ts_mlp_config c = small_mlp();
    ts_model m;
    ts_plan *p = NULL;
    if (ts_build_mlp(g, &c, &m) == TS_OK) {
        ts_train_spec spec = ts_train_spec_default(m.loss);
        if (opt_adam)
            spec.opt = ts_adamw(3e-3, 0.9, 0.999, 1e-8, 0.01);
        else
            spec.opt = ts_sgd(0.05, 0, 0, 0, 0);
        ts_compile_options o = ts_compile_options_default();
        o.seed = 7;
        o.reference_kernels = reference;
        o.precision.compute = compute;
        o.precision.keep_fp32 = keep;
        CHECK_OK(ts_compile_keep(g, &spec, &o, &p, kept));
    }
    ts_graph_free(g);
    return p;
}

static ts_plan *build(ts_dtype compute, const char *keep, int reference, int opt_adam) {
    return build_keep(compute, keep, reference, opt_adam, NULL);
}

static void test_structure(void) {
    ts_compiled_graph kept = {0};
    ts_plan *p = build_keep(TS_BF16, NULL, 0, 0, &kept);
    if (!p) {
        ts_compiled_graph_free(&kept);
        return;
    }
    const ts_graph *g = kept.graph;
    int mm = 0, low = 0, casts = 0, epi = 0, sum_casts = 0;
    for (int i = 0; i < g->n_nodes; i++) {
        const ts_node *n = &g->nodes[i];
        if (n->op == TS_OP_MATMUL || n->op == TS_OP_MATMUL_EPI) {
            const int64_t flag = n->op == TS_OP_MATMUL ? n->a.matmul.low : n->a.matmul_epi.low;
            mm++;
            low += flag == 1 && g->values[n->in[0]].t.dtype == TS_BF16 &&
                   g->values[n->in[1]].t.dtype == TS_BF16 && g->values[n->out[0]].t.dtype == TS_F32;
        }
        if (n->op == TS_OP_MATMUL_EPI) { /* the bias stays f32, added to the f32 accumulator */
            epi++;
            for (int j = 2; j < n->n_in; j++)
                CHECK(g->values[n->in[j]].t.dtype == TS_F32, "matmul_epi post-op operand in f32");
        }
        if (n->op == TS_OP_CAST) {
            casts++;
            CHECK(g->values[n->out[0]].t.dtype == TS_BF16, "casts go to bf16");
        }
        if (n->op == TS_OP_REDUCE_SUM && n->a.reduce.out_low) {
            sum_casts++;
            CHECK(n->n_out == 2 && g->values[n->out[1]].t.dtype == TS_BF16,
                  "a sum's cast (out_low) is its second output, bf16");
        }
    }
    /* 3 forward GEMMs, 3 weight-gradient GEMMs, 2 data-gradient GEMMs (x
     * needs none): 8, all in bf16 */
    CHECK(mm == 8 && low == 8, "%d of %d matmuls in bf16 (want 8 of 8)", low, mm);
    /* fusion runs first: the 3 forward GEMMs keep their bias epilogue in bf16 */
    CHECK(epi == 3, "%d bf16 GEMMs with a bias epilogue (want 3)", epi);
    /* operands: x, 3 weights, 2 hidden activations, 3 output gradients =
     * 9 distinct values, each cast once although 14 operand slots read them;
     * the 3 output gradients are cast by their bias-gradient sum (out_low), the
     * 3 weights by the optimizer into their bf16 copies (passes/weight_copies.c) */
    CHECK(casts == 3 && sum_casts == 3,
          "%d casts and %d sums writing a cast (want 3 and 3: one per distinct operand)", casts,
          sum_casts);
    int bad = 0, copies = 0;
    for (int v = 0; v < g->n_values; v++) {
        const ts_value *val = &g->values[v];
        const int copy = val->kind == TS_VK_STATE && !val->name && val->t.dtype == TS_BF16 &&
                         val->state_of >= 0 && g->values[val->state_of].kind == TS_VK_PARAM;
        copies += copy;
        if (!copy && (val->kind == TS_VK_PARAM || val->kind == TS_VK_STATE || val->grad_of >= 0))
            bad += val->t.dtype != TS_F32;
    }
    CHECK(bad == 0, "master weights, state and gradients stay f32 (%d are not)", bad);
    CHECK(copies == 3, "%d bf16 weight copies (want 3)", copies);
    CHECK_OK(ts_graph_verify(g));
    ts_plan_free(p);
    ts_compiled_graph_free(&kept);

    p = build_keep(TS_BF16, "softmax, matmul", 0, 0, &kept);
    if (p) CHECK(count_op(kept.graph, TS_OP_CAST) == 0, "keep_fp32: matmul leaves no cast");
    ts_plan_free(p);
    ts_compiled_graph_free(&kept);

    ts_graph *g2 = ts_graph_new();
    ts_mlp_config c = small_mlp();
    ts_model m;
    CHECK_OK(ts_build_mlp(g2, &c, &m));
    ts_train_spec spec = ts_train_spec_default(m.loss);
    ts_compile_options o = ts_compile_options_default();
    o.precision.compute = TS_BF16;
    o.precision.keep_fp32 = "matmull";
    CHECK(ts_compile(g2, &spec, &o, &p) == TS_ERR_INVALID &&
              strstr(ts_last_error(), "'matmull' is not an op name"),
          "a misspelt keep_fp32 op is named: %s", ts_last_error());
    o.precision.keep_fp32 = NULL;
    o.precision.compute = TS_I32;
    CHECK(ts_compile(g2, &spec, &o, &p) == TS_ERR_INVALID, "compute type i32 is refused");
    ts_graph_free(g2);
}

/* One step's loss and the first weight's gradient. */
static void one_step(ts_plan *p, double *loss, float *grad, size_t gbytes) {
    ts_mlp_config c = small_mlp();
    float *x = malloc(sizeof(float) * (size_t)(c.batch * c.in_dim));
    float *y = malloc(sizeof(float) * (size_t)(c.batch * c.out_dim));
    make_data(x, y, &c, 0);
    CHECK_OK(ts_plan_set_input(p, "x", x, sizeof(float) * (size_t)(c.batch * c.in_dim)));
    CHECK_OK(ts_plan_set_input(p, "y", y, sizeof(float) * (size_t)(c.batch * c.out_dim)));
    CHECK_OK(ts_plan_step(p));
    *loss = ts_plan_loss(p);
    CHECK_OK(ts_plan_read(p, "grad:net.0.weight", grad, gbytes));
    free(x);
    free(y);
}

static double rel_err(const float *a, const float *b, int n) {
    double num = 0, den = 0;
    for (int i = 0; i < n; i++) {
        num += ((double)a[i] - b[i]) * ((double)a[i] - b[i]);
        den += (double)b[i] * b[i];
    }
    return sqrt(num / (den + 1e-300));
}

static void test_numerics(void) {
    enum { NG = 48 * 24 };
    float g32[NG], gbf[NG], gref[NG], g16[NG], g16r[NG];
    double l32, lbf, lref, l16, l16r;
    /* Without bf16 GEMMs (no AVX-512) only the f16 half runs. */
    const int bf = ts_cpu_supports_dtype_gemm(TS_BF16);
    if (!bf) printf("numerics, bf16 half skipped: %s\n", ts_cpu_dtype_gemm_why(TS_BF16));
    ts_plan *p32 = build(TS_F32, NULL, 0, 0), *pbf = bf ? build(TS_BF16, NULL, 0, 0) : NULL;
    ts_plan *pref = bf ? build(TS_BF16, NULL, 1, 0) : NULL, *p16 = build(TS_F16, NULL, 0, 0);
    ts_plan *p16r = build(TS_F16, NULL, 1, 0);
    if (!p32 || (bf && (!pbf || !pref)) || !p16 || !p16r) goto out;
    one_step(p32, &l32, g32, sizeof g32);
    if (bf) one_step(pbf, &lbf, gbf, sizeof gbf);
    if (bf) one_step(pref, &lref, gref, sizeof gref);
    one_step(p16, &l16, g16, sizeof g16);
    one_step(p16r, &l16r, g16r, sizeof g16r);
    /* f16: oneDNN (or, without AVX512-FP16, the widening f32 GEMM) against
     * the reference kernel */
    CHECK(fabs(l16 - l16r) <= 1e-5 * fabs(l16r), "f16 loss: fast %.9g, reference %.9g", l16, l16r);
    CHECK(rel_err(g16, g16r, NG) < 1e-5, "f16 gradient: fast vs reference, rel err %.3g",
          rel_err(g16, g16r, NG));
    if (!bf) goto f16_vs_f32;
    /* oneDNN and the reference multiply the same bf16 values in f32: only
     * the order of the f32 sums differs (K <= 48 terms) */
    CHECK(fabs(lbf - lref) <= 1e-5 * fabs(lref), "bf16 loss: oneDNN %.9g, reference %.9g", lbf,
          lref);
    CHECK(rel_err(gbf, gref, NG) < 1e-5, "bf16 gradient: oneDNN vs reference, rel err %.3g",
          rel_err(gbf, gref, NG));
    /* bf16 keeps 8 significant bits (rel. rounding 2^-9 = 0.2 %); through
     * three layers and the backward pass a few tenths of a percent */
    CHECK(fabs(lbf - l32) <= 2e-2 * l32, "bf16 loss %.6g vs f32 %.6g", lbf, l32);
    CHECK(rel_err(gbf, g32, NG) < 3e-2, "bf16 gradient vs f32: rel err %.3g",
          rel_err(gbf, g32, NG));
    CHECK(rel_err(gbf, g32, NG) > 1e-6, "bf16 gradient differs from f32 at all (rel err %.3g)",
          rel_err(gbf, g32, NG));
f16_vs_f32:
    /* f16 keeps 11 bits: about 8x closer than bf16 */
    CHECK(fabs(l16 - l32) <= 3e-3 * l32, "f16 loss %.6g vs f32 %.6g", l16, l32);
    CHECK(rel_err(g16, g32, NG) < 4e-3, "f16 gradient vs f32: rel err %.3g", rel_err(g16, g32, NG));
out:
    ts_plan_free(p32);
    ts_plan_free(pbf);
    ts_plan_free(pref);
    ts_plan_free(p16);
    ts_plan_free(p16r);
}

static double train(ts_plan *p, int steps) {
    ts_mlp_config c = small_mlp();
    float *x = malloc(sizeof(float) * (size_t)(c.batch * c.in_dim));
    float *y = malloc(sizeof(float) * (size_t)(c.batch * c.out_dim));
    double tail = 0;
    for (int s = 0; s < steps; s++) {
        make_data(x, y, &c, s);
        ts_plan_set_input(p, "x", x, sizeof(float) * (size_t)(c.batch * c.in_dim));
        ts_plan_set_input(p, "y", y, sizeof(float) * (size_t)(c.batch * c.out_dim));
        if (ts_plan_step(p) != TS_OK) {
            CHECK(0, "step %d: %s", s, ts_last_error());
            break;
        }
        if (s >= steps - 10) tail += ts_plan_loss(p) / 10;
    }
    free(x);
    free(y);
    return tail;
}

/* Convergence: AdamW, 150 steps of fresh batches. The loss falls by
 * about 10x; averaged over the last 10 steps, bf16 ends within 5 % of
 * f32 (measured: well under 1 %; 5 % leaves room for the bf16 noise on a
 * loss this small without letting a broken cast or scale through: a run
 * with the bf16 GEMMs dropping a factor or a transpose does not converge). */
static void test_convergence(void) {
    ts_plan *p32 = build(TS_F32, NULL, 0, 1), *pbf = build(TS_BF16, NULL, 0, 1);
    ts_plan *pbf2 = build(TS_BF16, NULL, 0, 1);
    if (!p32 || !pbf || !pbf2) goto out;
    double first;
    {
        float g[48 * 24];
        ts_plan *p0 = build(TS_F32, NULL, 0, 1);
        if (!p0) goto out;
        one_step(p0, &first, g, sizeof g);
        ts_plan_free(p0);
    }
    double l32 = train(p32, 150), lbf = train(pbf, 150);
    train(pbf2, 150);
    fprintf(stderr, "convergence: first loss %.5f, last-10 mean f32 %.5f, bf16 %.5f (%.2f %%)\n",
            first, l32, lbf, 100 * (lbf - l32) / l32);
    CHECK(l32 < first / 4, "f32 run learns (%.4g -> %.4g)", first, l32);
    CHECK(fabs(lbf - l32) <= 0.05 * l32, "bf16 loss %.5g within 5 %% of f32 %.5g", lbf, l32);
    size_t nb = ts_plan_snapshot_bytes(pbf);
    void *a = malloc(nb), *b = malloc(nb);
    CHECK_OK(ts_plan_snapshot(pbf, a, nb));
    CHECK_OK(ts_plan_snapshot(pbf2, b, nb));
    CHECK(memcmp(a, b, nb) == 0, "two bf16 runs give bit-identical weights and state");
    free(a);
    free(b);
out:
    ts_plan_free(p32);
    ts_plan_free(pbf);
    ts_plan_free(pbf2);
}

/* The precision section of a config, as compile options. */
static void test_config(void) {
    static const char text[] = "model: {preset: w1}\n"
                               "precision:\n"
                               "  default: fp16\n"
                               "  keep_fp32: [matmul]\n"
                               "  growth_interval: 7\n";
    ts_config c;
    ts_config_init(&c);
    CHECK_OK(ts_config_load_string(&c, text, sizeof text - 1, "p.yaml"));
    CHECK_OK(ts_config_finish(&c));
    ts_precision_options o;
    ts_config_precision(&c, &o);
    CHECK(o.compute == TS_F16 && o.keep_fp32 && !strcmp(o.keep_fp32, "matmul") &&
              o.loss_scale == TS_SCALE_DYNAMIC && o.init_scale == 65536 && o.growth_factor == 2 &&
              o.backoff_factor == 0.5 && o.growth_interval == 7,
          "fp16 config: dynamic scaling by default (auto), keep_fp32 and interval read");
    ts_config_init(&c);
    CHECK_OK(ts_config_load_string(&c, text, sizeof text - 1, "p.yaml"));
    CHECK_OK(ts_config_set(&c, "precision.default=bf16"));
    CHECK_OK(ts_config_set(&c, "precision.loss_scale=1024"));
    CHECK_OK(ts_config_finish(&c));
    ts_config_precision(&c, &o);
    CHECK(o.compute == TS_BF16 && o.loss_scale == TS_SCALE_STATIC && o.init_scale == 1024,
          "a number is a static scale");
    ts_config_init(&c);
    CHECK_OK(ts_config_load_string(&c, text, sizeof text - 1, "p.yaml"));
    CHECK_OK(ts_config_set(&c, "precision.default=bf16"));
    ts_config_finish(&c);
    ts_config_precision(&c, &o);
    CHECK(o.loss_scale == TS_SCALE_NONE, "auto: no loss scaling for bf16");
    ts_config_init(&c);
    CHECK_OK(ts_config_load_string(&c, text, sizeof text - 1, "p.yaml"));
    CHECK_OK(ts_config_set(&c, "precision.loss_scale=lots"));
    CHECK(ts_config_finish(&c) == TS_ERR_INVALID && strstr(ts_last_error(), "'lots'"),
          "a bad loss_scale is refused: %s", ts_last_error());
    ts_config_init(&c);
    CHECK(ts_config_set(&c, "precision.backoff_factor=1") == TS_ERR_INVALID,
          "backoff_factor 1 is out of range");
}

/* A bf16 plan on a CPU whose oneDNN has no bf16 matmul (no AVX-512) is
 * refused naming the config key, the value and the missing CPU feature, both
 * from a config (exit 2 in the CLI) and from the plan API; where bf16 GEMMs
 * exist, the same config builds (and test_convergence trains in bf16). */
static void test_cpu_gate(void) {
    const int bf = ts_cpu_supports_dtype_gemm(TS_BF16);
    CHECK(ts_cpu_supports_dtype_gemm(TS_F32) == 1, "f32 GEMMs always exist");
    CHECK((strcmp(ts_cpu_dtype_gemm_why(TS_BF16), "") == 0) == bf,
          "a reason given exactly when not: '%s'", ts_cpu_dtype_gemm_why(TS_BF16));
    static const char text[] = "model: {preset: w1}\nprecision: {default: bf16}\n";
    ts_config c;
    ts_config_init(&c);
    CHECK_OK(ts_config_load_string(&c, text, sizeof text - 1, "p.yaml"));
    CHECK_OK(ts_config_finish(&c));
    ts_graph *g = NULL;
    ts_model m;
    ts_train_spec spec;
    ts_compile_options o;
    ts_status s = ts_config_build(&c, &g, &m, &spec, &o);
    if (bf) {
        CHECK(s == TS_OK, "bf16 config builds where bf16 GEMMs exist: %s", ts_last_error());
    } else {
        const char *e = ts_last_error();
        CHECK(s == TS_ERR_INVALID && strstr(e, "precision.default: bf16") &&
                  strstr(e, "needs AVX-512") && strstr(e, "this CPU has"),
              "bf16 config refused naming key, value and CPU feature: %s", e);
        /* The plan API: a bf16 matmul oneDNN cannot create here is widened to f32 (the bf16
         * operands are exact in f32; src/backends/cpu/dnnl_matmul.c), so the plan compiles. */
        ts_mlp_config mc = small_mlp();
        ts_graph *gm = ts_graph_new();
        ts_model mm;
        CHECK_OK(ts_build_mlp(gm, &mc, &mm));
        ts_train_spec sp = ts_train_spec_default(mm.loss);
        ts_compile_options co = ts_compile_options_default();
        co.precision.compute = TS_BF16;
        ts_plan *p = NULL;
        s = ts_compile(gm, &sp, &co, &p);
        e = ts_last_error();
        CHECK(s == TS_OK && p, "bf16 plan compiles with its matmuls widened to f32: %s", e);
        if (p) CHECK_OK(ts_plan_step(p));
        ts_plan_free(p);
        ts_graph_free(gm);
    }
    ts_graph_free(g);
}

int main(void) {
    test_config();
    test_cpu_gate();
    if (ts_cpu_supports_dtype_gemm(TS_BF16)) {
        test_structure();
    } else {
        printf("structure and convergence skipped: %s\n", ts_cpu_dtype_gemm_why(TS_BF16));
    }
    test_numerics();
    if (ts_cpu_supports_dtype_gemm(TS_BF16)) test_convergence();
    return check_summary("precision");
}
