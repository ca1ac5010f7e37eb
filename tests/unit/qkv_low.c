/* The qkv projection writing bf16 for the bf16 attention (passes/qkv_low.c, matmul_epi.out_low,
 * the bf16 packs of ops/attention_low.c):
 *
 * - the bf16 packs (rows, pairs, transposed rows) give the words of the f32 packs of the
 *   values the bf16 ones widen to, odd and even rows and columns, narrow and wide;
 * - the packed attention and attention_bwd (low; dqkv f32, and bf16 with its sums: out_low)
 *   on a bf16 qkv give the outputs and gradients of the f32 qkv holding the same values, bit
 *   for bit, causal or not, on 1 and 2 threads: W3's head size over 4 blocks, an odd head size
 *   with partial blocks, a head size of 40;
 * - matmul_epi with out_low (bf16 x bf16 + bias, rows not a multiple of 64) equals the f32
 *   matmul_epi followed by the bf16 cast, bit for bit, on oneDNN and on the reference kernels;
 *   inference refuses out_low on f32 operands;
 * - the pass: a bf16 GPT (2 layers) gets one bf16 qkv projection per layer, none with
 *   compile.no_qkv_low, keep_fp32 [attention] or in f32, nor where another op also reads the
 *   qkv; one step's loss and gradients are bit-identical to compile.no_qkv_low, with and
 *   without compile.no_attn_bwd_low_out, on 1 and 2 threads; W3 bf16 (examples/w3_bf16.yaml)
 *   gets it in each of its 6 layers. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "backends/cpu/dnnl_caps.h"
#include "check.h"
#include "core/half.h"
#include "frontend/config.h"
#include "ops/attention_low.h"
#include "ops/op.h"
#include "passes/passes.h"
#include "plan/plan.h"
#include "small_gpt.h"
#include "tessel/models.h"

/* ---- the bf16 packs --------------------------------------------------------- */

static void test_pack_shape(int rows, int cols) {
    const int hp = (cols + 1) / 2, rp = (rows + 1) / 2, ld = cols + 3; /* rows ld apart */
    const int tl = rows + 3;                                           /* rows_t's ldd > n */
    uint16_t *h = malloc(sizeof(uint16_t) * (size_t)(rows * ld));
    float *f = malloc(sizeof(float) * (size_t)(rows * ld));
    for (int i = 0; i < rows * ld; i++) {
        h[i] = ts_f32_to_bf16((float)sin(0.7 * i + 0.3) * 2.5f);
        f[i] = ts_bf16_to_f32(h[i]);
    }
    const size_t nr = (size_t)(rows * hp), np = (size_t)(rp * cols), nt = (size_t)(hp * tl);
    uint32_t *r0 = calloc(nr, 4), *r1 = calloc(nr, 4), *p0 = calloc(np, 4), *p1 = calloc(np, 4);
    uint32_t *t0 = calloc(nt, 4), *t1 = calloc(nt, 4);
    /* the bf16 outputs start as ones: every word the f32 packs write must be written */
    memset(r1, 0xff, nr * 4), memset(p1, 0xff, np * 4);
    ts_attn_pack_rows(r0, hp, f, ld, rows, cols);
    ts_attn_pack_rows_bf16(r1, hp, h, ld, rows, cols);
    ts_attn_pack_pairs(p0, cols, f, ld, rows, cols);
    ts_attn_pack_pairs_bf16(p1, cols, h, ld, rows, cols);
    ts_attn_pack_rows_t(t0, tl, f, ld, rows, cols);
    ts_attn_pack_rows_t_bf16(t1, tl, h, ld, rows, cols);
    CHECK(memcmp(r0, r1, nr * 4) == 0 && memcmp(p0, p1, np * 4) == 0 && memcmp(t0, t1, nt * 4) == 0,
          "bf16 packs %dx%d: rows %s, pairs %s, rows_t %s (the f32 packs' words)", rows, cols,
          memcmp(r0, r1, nr * 4) ? "differ" : "same", memcmp(p0, p1, np * 4) ? "differ" : "same",
          memcmp(t0, t1, nt * 4) ? "differ" : "same");
    free(h), free(f), free(r0), free(r1), free(p0), free(p1), free(t0), free(t1);
}

static void test_packs(void) {
    const int shapes[][2] = {{5, 7},   {5, 37},  {4, 64},  {3, 50},  {64, 16},
                             {64, 64}, {37, 65}, {17, 33}, {256, 64}};
    for (int i = 0; i < 9; i++) test_pack_shape(shapes[i][0], shapes[i][1]);
}

/* ---- the attention ops on a bf16 qkv ------------------------------------------ */

typedef struct shape {
    int64_t b, t, h, hd;
} shape;

/* (o, lse, dqkv f32) and (dqkv bf16 widened, sums) of the packed attention on qkv of dtype dt
 * holding the values v; causal or not; out [4]: o, lse, dqkv, dqkv_low widened, sums. */
static void attn_run(const shape *s, ts_dtype dt, int causal, int threads, const float *v,
                     float **out) {
    const int64_t D = s->h * s->hd, nq = s->b * s->t * 3 * D, no = s->b * s->t * D;
    const int64_t qd[5] = {s->b, s->t, 3, s->h, s->hd}, od[4] = {s->b, s->t, s->h, s->hd};
    ts_graph *g = ts_graph_new();
    ts_val qkv = ts_input(g, "qkv", dt, 5, qd), dout = ts_input(g, "dout", TS_F32, 4, od);
    ts_attrs at = ts_attrs_zero();
    at.attention.causal = causal, at.attention.scale = 1.0 / sqrt((double)s->hd);
    at.attention.low = 1;
    ts_val fo[2], lo[2];
    ts_node_add(g, TS_OP_ATTENTION, 1, &qkv, &at, fo);
    ts_val in[4] = {dout, qkv, fo[0], fo[1]};
    ts_val dq = ts_node_add(g, TS_OP_ATTENTION_BWD, 4, in, &at, NULL);
    at.attention.out_low = 1, at.attention.sums_rank = 1;
    ts_node_add(g, TS_OP_ATTENTION_BWD, 4, in, &at, lo);
    ts_mark_output(g, fo[0], "o");
    ts_mark_output(g, fo[1], "lse");
    ts_mark_output(g, dq, "dq");
    ts_mark_output(g, ts_cast(g, lo[0], TS_F32), "dql");
    ts_mark_output(g, lo[1], "sums");
    CHECK(ts_graph_status(g) == TS_OK, "build (%s qkv): %s", ts_dtype_name(dt), ts_graph_error(g));
    ts_compile_options o = ts_compile_options_default();
    o.threads = threads;
    ts_plan *p = NULL;
    CHECK_OK(ts_compile(g, NULL, &o, &p));
    ts_graph_free(g);
    if (!p) return;
    float *dout_v = malloc(sizeof(float) * (size_t)no);
    for (int64_t i = 0; i < no; i++) dout_v[i] = (float)cos(0.23 * (double)i) * 0.01f;
    if (dt == TS_BF16) {
        uint16_t *h = malloc(sizeof(uint16_t) * (size_t)nq);
        for (int64_t i = 0; i < nq; i++) h[i] = ts_f32_to_bf16(v[i]);
        CHECK_OK(ts_plan_set_input(p, "qkv", h, sizeof(uint16_t) * (size_t)nq));
        free(h);
    } else {
        CHECK_OK(ts_plan_set_input(p, "qkv", v, sizeof(float) * (size_t)nq));
    }
    CHECK_OK(ts_plan_set_input(p, "dout", dout_v, sizeof(float) * (size_t)no));
    CHECK_OK(ts_plan_step(p));
    const char *names[5] = {"o", "lse", "dq", "dql", "sums"};
    const int64_t n[5] = {no, s->b * s->h * s->t, nq, nq, 3 * D};
    for (int i = 0; i < 5; i++)
        CHECK_OK(ts_plan_read(p, names[i], out[i], sizeof(float) * (size_t)n[i]));
    free(dout_v);
    ts_plan_free(p);
}

static void test_attention(const shape *s) {
    const int64_t D = s->h * s->hd, nq = s->b * s->t * 3 * D, no = s->b * s->t * D;
    const int64_t n[5] = {no, s->b * s->h * s->t, nq, nq, 3 * D};
    float *v = malloc(sizeof(float) * (size_t)nq); /* bf16 values, so both inputs hold them */
    for (int64_t i = 0; i < nq; i++)
        v[i] = ts_bf16_to_f32(ts_f32_to_bf16((float)sin(0.37 * (double)i + 0.1) * 1.5f));
    float *r[3][5];
    for (int c = 0; c < 2; c++) {
        for (int k = 0; k < 3; k++)
            for (int i = 0; i < 5; i++) r[k][i] = malloc(sizeof(float) * (size_t)n[i]);
        attn_run(s, TS_F32, c, 1, v, r[0]);
        attn_run(s, TS_BF16, c, 1, v, r[1]);
        attn_run(s, TS_BF16, c, 2, v, r[2]);
        int same = 1, same2 = 1;
        for (int i = 0; i < 5; i++) {
            same &= memcmp(r[0][i], r[1][i], sizeof(float) * (size_t)n[i]) == 0;
            same2 &= memcmp(r[1][i], r[2][i], sizeof(float) * (size_t)n[i]) == 0;
        }
        CHECK(same && same2,
              "T=%lld H=%lld hd=%lld %s: bf16 qkv gives the f32 qkv's o, lse, dqkv, bf16 dqkv "
              "and sums bit for bit (%s), 1 and 2 threads the same (%s)",
              (long long)s->t, (long long)s->h, (long long)s->hd, c ? "causal" : "full",
              same ? "yes" : "no", same2 ? "yes" : "no");
        for (int k = 0; k < 3; k++)
            for (int i = 0; i < 5; i++) free(r[k][i]);
    }
    free(v);
}

/* ---- matmul_epi with out_low ---------------------------------------------------- */

/* y = a w + bias, a bf16 [B, T, K], w bf16 [K, N]: out_low, or f32 then the cast. */
static void mm_run(int out_low, int reference, int64_t B, int64_t T, int64_t K, int64_t N,
                   uint16_t *y) {
    ts_graph *g = ts_graph_new();
    const int64_t ad[3] = {B, T, K}, wd[2] = {K, N}, bd[1] = {N};
    ts_val in[3] = {ts_input(g, "a", TS_BF16, 3, ad), ts_input(g, "w", TS_BF16, 2, wd),
                    ts_input(g, "bias", TS_F32, 1, bd)};
    ts_attrs at = ts_attrs_zero();
    at.matmul_epi.n_post = 1, at.matmul_epi.post[0] = TS_EPI_ADD;
    at.matmul_epi.low = 1, at.matmul_epi.out_low = out_low;
    ts_val o = ts_node_add(g, TS_OP_MATMUL_EPI, 3, in, &at, NULL);
    ts_mark_output(g, out_low ? o : ts_cast(g, o, TS_BF16), "y");
    CHECK(ts_graph_status(g) == TS_OK, "build matmul_epi: %s", ts_graph_error(g));
    ts_compile_options opt = ts_compile_options_default();
    opt.reference_kernels = reference;
    ts_plan *p = NULL;
    CHECK_OK(ts_compile(g, NULL, &opt, &p));
    ts_graph_free(g);
    if (!p) return;
    uint16_t *a = malloc(2 * (size_t)(B * T * K)), *w = malloc(2 * (size_t)(K * N));
    float *b = malloc(4 * (size_t)N);
    for (int64_t i = 0; i < B * T * K; i++) a[i] = ts_f32_to_bf16((float)sin(0.11 * (double)i));
    for (int64_t i = 0; i < K * N; i++) w[i] = ts_f32_to_bf16((float)cos(0.07 * (double)i) * 0.2f);
    for (int64_t i = 0; i < N; i++) b[i] = (float)i * 0.01f - 0.3f;
    CHECK_OK(ts_plan_set_input(p, "a", a, 2 * (size_t)(B * T * K)));
    CHECK_OK(ts_plan_set_input(p, "w", w, 2 * (size_t)(K * N)));
    CHECK_OK(ts_plan_set_input(p, "bias", b, 4 * (size_t)N));
    CHECK_OK(ts_plan_step(p));
    CHECK_OK(ts_plan_read(p, "y", y, 2 * (size_t)(B * T * N)));
    free(a), free(w), free(b);
    ts_plan_free(p);
}

static void test_matmul_epi(void) {
    const int64_t B = 3, T = 70, K = 96, N = 200, n = B * T * N; /* 210 rows: a partial piece */
    uint16_t *y[4];
    for (int i = 0; i < 4; i++) y[i] = calloc((size_t)n, 2);
    mm_run(0, 0, B, T, K, N, y[0]); /* oneDNN f32 output, cast */
    mm_run(1, 0, B, T, K, N, y[1]); /* oneDNN bf16 output */
    mm_run(0, 1, B, T, K, N, y[2]); /* reference kernels */
    mm_run(1, 1, B, T, K, N, y[3]);
    CHECK(memcmp(y[0], y[1], 2 * (size_t)n) == 0,
          "matmul_epi out_low (oneDNN): the f32 result's bf16 cast, bit for bit");
    CHECK(memcmp(y[2], y[3], 2 * (size_t)n) == 0,
          "matmul_epi out_low (reference kernels): the f32 result's bf16 cast, bit for bit");
    for (int i = 0; i < 4; i++) free(y[i]);
    /* f32 operands: refused */
    ts_graph *g = ts_graph_new();
    const int64_t d[2] = {4, 4};
    ts_val in[3] = {ts_input(g, "a", TS_F32, 2, d), ts_input(g, "w", TS_F32, 2, d),
                    ts_input(g, "b", TS_F32, 1, d)};
    ts_attrs at = ts_attrs_zero();
    at.matmul_epi.n_post = 1, at.matmul_epi.post[0] = TS_EPI_ADD, at.matmul_epi.out_low = 1;
    ts_val o = ts_node_add(g, TS_OP_MATMUL_EPI, 3, in, &at, NULL);
    CHECK(!ts_val_ok(o) && strstr(ts_graph_error(g), "out_low"), "out_low on f32 refused: %s",
          ts_graph_error(g));
    ts_graph_free(g);
}

/* ---- the pass ------------------------------------------------------------------ */

enum { GB = SMALL_GPT_B, GT = SMALL_GPT_T, GV = SMALL_GPT_V };

static ts_plan *gpt(ts_dtype compute, int threads, int no_qkv, int no_out, const char *keep,
                    ts_compiled_graph *kept) {
    ts_compile_options o = ts_compile_options_default();
    o.seed = 5;
    o.threads = threads;
    o.precision.compute = compute;
    o.precision.keep_fp32 = keep;
    o.no_qkv_low = no_qkv;
    o.no_attn_bwd_low_out = no_out;
    return small_gpt_plan(&o, kept);
}

/* matmul_epi nodes writing bf16 in a graph */
static int rewritten(const ts_graph *g) {
    int n = 0;
    for (int i = 0; i < g->n_nodes; i++) {
        const ts_node *nd = &g->nodes[i];
        n += !nd->dead && nd->op == TS_OP_MATMUL_EPI && nd->a.matmul_epi.out_low == 1 &&
             g->values[nd->out[0]].t.dtype == TS_BF16;
    }
    return n;
}

/* One step; every parameter's gradient into out, in the kept graph's order. The loss. */
static double gpt_step(ts_plan *p, const ts_compiled_graph *k, float *out, int64_t *n_out) {
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
        at += n;
    }
    *n_out = at;
    return ts_plan_loss(p);
}

static void test_gpt(void) {
    /* [no_attn_bwd_low_out][no_qkv_low], and the new form on 2 threads */
    ts_compiled_graph k[2][2] = {{{0}}}, k2 = {0}, kk = {0}, kf = {0};
    ts_plan *p[2][2], *p2 = gpt(TS_BF16, 2, 0, 0, NULL, &k2);
    for (int a = 0; a < 2; a++)
        for (int q = 0; q < 2; q++) p[a][q] = gpt(TS_BF16, 1, q, a, NULL, &k[a][q]);
    ts_plan *keep = gpt(TS_BF16, 1, 0, 0, "attention", &kk), *f32 = gpt(TS_F32, 1, 0, 0, NULL, &kf);
    if (p[0][0] && p[0][1] && p[1][0] && p[1][1] && p2 && keep && f32) {
        CHECK(rewritten(k[0][0].graph) == 2 && rewritten(k[1][0].graph) == 2 &&
                  rewritten(k2.graph) == 2,
              "bf16 GPT: %d, %d (no_attn_bwd_low_out) qkv projections writing bf16 (2 expected)",
              rewritten(k[0][0].graph), rewritten(k[1][0].graph));
        CHECK(rewritten(k[0][1].graph) == 0 && rewritten(k[1][1].graph) == 0 &&
                  rewritten(kk.graph) == 0 && rewritten(kf.graph) == 0,
              "none with compile.no_qkv_low, keep_fp32 [attention] (%d), in f32 (%d)",
              rewritten(kk.graph), rewritten(kf.graph));
        const int64_t big = 1 << 20;
        for (int a = 0; a < 2; a++) {
            float *x = calloc((size_t)big, 4), *y = calloc((size_t)big, 4);
            int64_t nx = 0, ny = 0;
            double lx = gpt_step(p[a][0], &k[a][0], x, &nx),
                   ly = gpt_step(p[a][1], &k[a][1], y, &ny);
            CHECK(nx == ny && memcmp(&lx, &ly, sizeof lx) == 0 &&
                      memcmp(x, y, sizeof(float) * (size_t)nx) == 0,
                  "bf16 GPT%s, one step: loss %.9g vs %.9g (no_qkv_low), gradients bit-identical",
                  a ? " (no_attn_bwd_low_out)" : "", lx, ly);
            if (a == 0) {
                float *z = calloc((size_t)big, 4);
                int64_t nz = 0;
                double lz = gpt_step(p2, &k2, z, &nz);
                CHECK(nz == nx && memcmp(&lx, &lz, sizeof lx) == 0 &&
                          memcmp(x, z, sizeof(float) * (size_t)nx) == 0,
                      "bf16 GPT: 1 and 2 threads bit-identical (loss %.9g vs %.9g)", lx, lz);
                free(z);
            }
            free(x), free(y);
        }
    }
    for (int a = 0; a < 2; a++)
        for (int q = 0; q < 2; q++) ts_plan_free(p[a][q]), ts_compiled_graph_free(&k[a][q]);
    ts_plan_free(p2), ts_plan_free(keep), ts_plan_free(f32);
    ts_compiled_graph_free(&k2), ts_compiled_graph_free(&kk), ts_compiled_graph_free(&kf);
}

/* A hand-built bf16 projection + packed attention: rewritten, or not where another op also
 * reads the qkv (an output of its own, or an f32 consumer). */
static void test_other_reader(void) {
    for (int mode = 0; mode < 3; mode++) {
        ts_graph *g = ts_graph_new();
        const int64_t ad[3] = {1, 8, 16}, wd[2] = {16, 24}, bd[1] = {24};
        const int64_t qd[5] = {1, 8, 3, 2, 4};
        ts_val in[3] = {ts_input(g, "a", TS_BF16, 3, ad), ts_input(g, "w", TS_BF16, 2, wd),
                        ts_input(g, "bias", TS_F32, 1, bd)};
        ts_attrs at = ts_attrs_zero();
        at.matmul_epi.n_post = 1, at.matmul_epi.post[0] = TS_EPI_ADD, at.matmul_epi.low = 1;
        ts_val x = ts_node_add(g, TS_OP_MATMUL_EPI, 3, in, &at, NULL);
        ts_val qkv = ts_reshape(g, x, 5, qd);
        ts_attrs aa = ts_attrs_zero();
        aa.attention.causal = 1, aa.attention.scale = 0.5, aa.attention.low = 1;
        ts_val fo[2];
        ts_node_add(g, TS_OP_ATTENTION, 1, &qkv, &aa, fo);
        ts_mark_output(g, fo[0], "o");
        if (mode == 1) ts_mark_output(g, x, "x");
        if (mode == 2) ts_mark_output(g, ts_exp(g, qkv), "e");
        CHECK(ts_graph_status(g) == TS_OK, "build: %s", ts_graph_error(g));
        int n = -1;
        CHECK_OK(ts_pass_qkv_low(g, &n));
        CHECK_OK(ts_graph_verify(g));
        CHECK(n == (mode == 0) && rewritten(g) == n, "%s: %d rewritten",
              mode == 0   ? "attention the only reader"
              : mode == 1 ? "the projection also an output"
                          : "an exp also reads the qkv",
              n);
        ts_graph_free(g);
    }
}

/* examples/w3_bf16.yaml: every layer's qkv projection writes bf16. */
static void test_w3(void) {
    ts_config c;
    ts_config_init(&c);
    ts_graph *g = NULL;
    ts_model m;
    ts_train_spec spec;
    ts_compile_options o;
    ts_status s = ts_config_load_file(&c, "examples/w3_bf16.yaml");
    if (s == TS_OK) s = ts_config_finish(&c);
    if (s == TS_OK) s = ts_config_build(&c, &g, &m, &spec, &o);
    CHECK(s == TS_OK, "W3 bf16 config: %s", ts_last_error());
    if (s != TS_OK) return;
    o.threads = 1;
    ts_compiled_graph k = {0};
    ts_plan *p = NULL;
    CHECK_OK(ts_compile_keep(g, &spec, &o, &p, &k));
    if (p)
        CHECK(rewritten(k.graph) == 6, "W3 bf16: %d qkv projections write bf16 (6 expected)",
              rewritten(k.graph));
    ts_plan_free(p);
    ts_compiled_graph_free(&k);
    ts_graph_free(g);
}

int main(void) {
    test_packs();
    test_other_reader();
    if (!ts_cpu_supports_dtype_gemm(TS_BF16)) {
        printf("skipped the plans: %s\n", ts_cpu_dtype_gemm_why(TS_BF16));
        return check_summary("qkv_low");
    }
    const shape shapes[3] = {{2, 256, 2, 64}, {3, 70, 3, 5}, {2, 130, 2, 40}};
    for (int i = 0; i < 3; i++) test_attention(&shapes[i]);
    test_matmul_epi();
    test_gpt();
    test_w3();
    return check_summary("qkv_low");
}
