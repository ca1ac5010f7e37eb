/* Attention with bf16 products (attention.low, ops/attention_low.h), which
 * the precision pass sets in bf16 plans:
 *
 * - the packing is exact: each word holds the RNE bf16 of its two values,
 *   a zero for an odd tail; the transposed row packing (q^T, do^T) is the row
 *   packing transposed, on whole 16 x 16 tiles and edges;
 * - ts_attn_mm_bf16 against the same products summed in double: every
 *   product of two bf16 values is exact in f32, so the kernel may differ
 *   only by f32 summation, at most 2·K·2⁻²⁴·Σ|products| per element (the
 *   AVX512-BF16 path where the CPU has it, else the plain C one);
 * - the pass: a bf16 plan's attention and attention_bwd get low = 1, an f32
 *   plan's and one with keep_fp32: [attention] do not;
 * - numerics: output (loss) and the gradients of q, k and v of a bf16 plan
 *   against the f32 plan on the same inputs, relative L2 error below 2e-2
 *   (bf16 keeps 8 bits: each operand is rounded by at most 2⁻⁹ relative;
 *   measured: loss 6e-5, gradients 7e-3 at most), for causal and
 *   non-causal attention, partial 64-row
 *   blocks and an odd head size (padded pairs);
 * - the softmax pieces that write packed operands (ts_attn_low_*) against the
 *   f32 block pieces followed by the packs, on full, partial, diagonal and
 *   fully visible blocks, with NaN in every entry they must not read: f32
 *   outputs within 4 ulp, bf16 halves within 1 unit, masked entries 0; and against their
 *   all-masks form (every key row's mask computed) bit for bit, on random scores;
 * - determinism: 1 and 2 threads give the same loss and gradient bits. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "check.h"
#include "core/half.h"
#include "ops/attention_fused.h"
#include "ops/attention_low.h"
#include "plan/plan.h"

static float bf(float x) {
    return ts_bf16_to_f32(ts_f32_to_bf16(x));
}

/* rows x cols values packed both ways: narrow (the 16-wide tails), and wide enough for the
 * whole-vector paths (32 values a conversion along a row, 16 pairs of rows), odd and even. */
static void test_pack_shape(int rows, int cols) {
    const int hp = (cols + 1) / 2, rp = (rows + 1) / 2;
    float *src = malloc(sizeof(float) * (size_t)(rows * cols));
    uint32_t *rw = malloc(sizeof(uint32_t) * (size_t)(rows * hp)),
             *pw = malloc(sizeof(uint32_t) * (size_t)(rp * cols));
    for (int i = 0; i < rows * cols; i++) src[i] = (float)sin(1.3 * i + 0.2) * 3.0f;
    ts_attn_pack_rows(rw, hp, src, cols, rows, cols);
    ts_attn_pack_pairs(pw, cols, src, cols, rows, cols);
    /* the transposed form, rows 3 words wider than the rows packed (ldd > n) */
    uint32_t *tw = calloc((size_t)(hp * (rows + 3)), sizeof(uint32_t));
    ts_attn_pack_rows_t(tw, rows + 3, src, cols, rows, cols);
    int bad = 0;
    for (int r = 0; r < rows; r++)
        for (int c = 0; c < hp; c++) bad += tw[c * (rows + 3) + r] != rw[r * hp + c];
    for (int c = 0; c < hp; c++)
        for (int r = rows; r < rows + 3; r++) bad += tw[c * (rows + 3) + r] != 0; /* not written */
    CHECK(bad == 0, "pack_rows_t %dx%d: %d words differ from pack_rows transposed", rows, cols,
          bad);
    free(tw);
    bad = 0;
    for (int r = 0; r < rows; r++)
        for (int c = 0; c < cols; c++) {
            uint32_t w = rw[r * hp + c / 2], u = pw[r / 2 * cols + c];
            bad += (uint16_t)(w >> (c & 1 ? 16 : 0)) != ts_f32_to_bf16(src[r * cols + c]);
            bad += (uint16_t)(u >> (r & 1 ? 16 : 0)) != ts_f32_to_bf16(src[r * cols + c]);
        }
    if (cols & 1)
        for (int r = 0; r < rows; r++) bad += rw[r * hp + hp - 1] >> 16 != 0; /* odd column tail */
    if (rows & 1)
        for (int c = 0; c < cols; c++) bad += pw[(rp - 1) * cols + c] >> 16 != 0; /* odd row tail */
    CHECK(bad == 0, "pack_rows / pack_pairs %dx%d: %d words wrong", rows, cols, bad);
    free(src);
    free(rw);
    free(pw);
}

static void test_pack(void) {
    const int shapes[][2] = {{5, 7}, {5, 37}, {4, 64}, {3, 50}, {64, 16}, {64, 64}, {37, 65}};
    for (int i = 0; i < 7; i++) test_pack_shape(shapes[i][0], shapes[i][1]);
}

/* M x N (row stride ldc >= N) of K reduction values: every tile shape of the kernel is some
 * N's (64-wide 4 x 4 tiles, 48-wide 4 x 3 and 16-wide 8 x 1 for the diagonal's strips,
 * 32-wide 8 x 2, single-vector rows for what is left). */
static void test_mm_shape(int M, int N, int K) {
    const int KP = (K + 1) / 2;
    float *a = malloc(sizeof(float) * (size_t)(M * K)),
          *b = malloc(sizeof(float) * (size_t)(K * N));
    float *c = malloc(sizeof(float) * (size_t)(M * N));
    uint32_t *aw = malloc(sizeof(uint32_t) * (size_t)(M * KP)),
             *bw = malloc(sizeof(uint32_t) * (size_t)(KP * N));
    for (int i = 0; i < M * K; i++) a[i] = (float)sin(0.7 * i) * 2.0f;
    for (int i = 0; i < K * N; i++) b[i] = (float)cos(0.3 * i + 1.0);
    ts_attn_pack_rows(aw, KP, a, K, M, K);
    ts_attn_pack_pairs(bw, N, b, N, K, N);
    double worst = 0;
    for (int acc = 0; acc < 2; acc++) {
        for (int i = 0; i < M * N; i++) c[i] = acc ? 0.5f : 0.0f;
        ts_attn_mm_bf16(M, N, KP, aw, KP, 1, bw, N, c, N, acc);
        for (int m = 0; m < M; m++)
            for (int n = 0; n < N; n++) {
                double s = acc ? 0.5 : 0, mag = fabs(s);
                for (int k = 0; k < K; k++) {
                    double p = (double)bf(a[m * K + k]) * bf(b[k * N + n]);
                    s += p, mag += fabs(p);
                }
                double bound = 2.0 * (K + 1) * ldexp(1, -24) * mag;
                double r = fabs(c[m * N + n] - s) / (bound + 1e-300);
                worst = r > worst ? r : worst;
            }
    }
    CHECK(worst <= 1.0,
          "mm_bf16 %dx%dx%d against exact bf16 products: %.3g of the f32 summation bound", M, N, K,
          worst);
    free(a);
    free(b);
    free(c);
    free(aw);
    free(bw);
}

static void test_mm(void) {
    const int shapes[][3] = {{70, 67, 37}, {19, 48, 64}, {17, 16, 64}, {21, 32, 30}, {16, 112, 16}};
    for (int i = 0; i < 5; i++) test_mm_shape(shapes[i][0], shapes[i][1], shapes[i][2]);
}

enum { BS = TS_ATTN_BS, BP = TS_ATTN_BS / 2 };

/* Count of f32 values further apart than 4 ulp (relative 2^-21; equal NaNs and zeros agree). */
static int far_f32(const float *a, const float *b, int n) {
    int bad = 0;
    for (int i = 0; i < n; i++)
        if (!(a[i] == b[i] || (isnan(a[i]) && isnan(b[i])) ||
              fabsf(a[i] - b[i]) <= ldexpf(fabsf(b[i]), -21)))
            bad++;
    return bad;
}

/* Count of bf16 halves of words more than one unit apart (+0 and -0 agree: a masked ds is
 * scale * 0 * (0 - D) in the f32 piece, an exact +0 in the packing one). */
static int far_words(const uint32_t *a, const uint32_t *b) {
    int bad = 0;
    for (int h = 0; h < 32; h += 16) {
        uint32_t x = (a[0] >> h) & 0xffff, y = (b[0] >> h) & 0xffff;
        int d = (int)x - (int)y;
        bad += (d > 1 || d < -1) && (x | y) != 0x8000;
    }
    return bad;
}

/* One block pair: nq queries, nk keys, diag = query block start - key block start. */
static void test_softmax_case(int64_t nq, int64_t nk, int causal, int64_t diag) {
    static float s0[BS * BS], s1[BS * BS], s2[BS * BS], dp0[BS * BS], dp1[BS * BS];
    static uint32_t w1[BS * BS], w2[BS * BS], x1[BS * BS], x2[BS * BS];
    float m1[BS], l1[BS], m2[BS], l2[BS], tmp[3 * BS], lse[BS], D[BS];
    static float o1[BS * 8], o2[BS * 8];
    const float scale = 0.125f, nan = NAN;
    for (int64_t j = 0; j < BS; j++)
        for (int64_t i = 0; i < BS; i++) {
            int vis = j < nk && i < nq && (!causal || i >= j - diag);
            s0[j * BS + i] = vis ? (float)(4 * sin(0.37 * (double)(j * BS + i))) : nan;
            dp0[j * BS + i] = vis ? (float)cos(0.23 * (double)(j * BS + i)) : nan;
        }
    for (int i = 0; i < BS; i++) {
        m1[i] = m2[i] = (float)(i % 5) - 1.0f, l1[i] = l2[i] = 1.0f + (float)(i % 3);
        lse[i] = 2.0f + 0.01f * (float)i, D[i] = 0.1f * (float)(i % 7);
    }
    for (int i = 0; i < BS * 8; i++) o1[i] = o2[i] = (float)sin(0.1 * i);
    int bad = 0;
    /* forward: m, l, o (8 columns) and p as pairs of key rows */
    memcpy(s1, s0, sizeof s0), memcpy(s2, s0, sizeof s0);
    ts_attn_low_fwd_softmax(s1, nq, nk, m1, l1, o1, 8, 8, scale, causal, diag, tmp, w1);
    ts_attn_fwd_block_f32(s2, nq, nk, m2, l2, o2, 8, 8, scale, causal, diag, tmp);
    ts_attn_pack_pairs(w2, BS, s2, BS, nk, nq);
    bad += far_f32(m1, m2, (int)nq) + far_f32(l1, l2, (int)nq) + far_f32(o1, o2, (int)nq * 8);
    for (int64_t j = 0; j < (nk + 1) / 2; j++)
        for (int64_t i = 0; i < nq; i++) bad += far_words(w1 + j * BS + i, w2 + j * BS + i);
    CHECK(bad == 0, "fwd softmax nq %lld nk %lld causal %d diag %lld: %d values apart",
          (long long)nq, (long long)nk, causal, (long long)diag, bad);
    /* backward: p in f32 and as rows, then ds as rows and pairs */
    bad = 0;
    memcpy(s1, s0, sizeof s0), memcpy(s2, s0, sizeof s0);
    ts_attn_low_bwd_p(s1, nq, nk, lse, scale, causal, diag, w1);
    ts_attn_bwd_p_f32(s2, nq, nk, lse, scale, causal, diag);
    ts_attn_pack_rows(w2, BP, s2, BS, nk, nq);
    for (int64_t j = 0; j < nk; j++) {
        bad += far_f32(s1 + j * BS, s2 + j * BS, (int)nq);
        for (int64_t i = 0; i < (nq + 1) / 2; i++)
            bad += far_words(w1 + j * BP + i, w2 + j * BP + i);
    }
    memcpy(dp1, dp0, sizeof dp0);
    ts_attn_low_bwd_ds(dp1, s2, nq, nk, D, scale, causal, diag, w1, x1);
    for (int64_t j = 0; j < nk; j++) /* the reference reads every entry: masked ones 0 */
        for (int64_t i = 0; i < nq; i++)
            if (isnan(dp0[j * BS + i])) dp0[j * BS + i] = 0;
    ts_attn_bwd_ds_f32(dp0, s2, nq, nk, D, scale);
    ts_attn_pack_rows(w2, BP, dp0, BS, nk, nq);
    ts_attn_pack_pairs(x2, BS, dp0, BS, nk, nq);
    for (int64_t j = 0; j < nk; j++)
        for (int64_t i = 0; i < (nq + 1) / 2; i++)
            bad += far_words(w1 + j * BP + i, w2 + j * BP + i);
    for (int64_t j = 0; j < (nk + 1) / 2; j++)
        for (int64_t i = 0; i < nq; i++) bad += far_words(x1 + j * BS + i, x2 + j * BS + i);
    CHECK(bad == 0, "bwd p / ds nq %lld nk %lld causal %d diag %lld: %d values apart",
          (long long)nq, (long long)nk, causal, (long long)diag, bad);
}

static void test_softmax_pieces(void) {
    test_softmax_case(64, 64, 1, 0);  /* a diagonal block */
    test_softmax_case(64, 64, 1, 64); /* below the diagonal: all visible */
    test_softmax_case(50, 50, 1, 0);  /* the diagonal of a partial last block */
    test_softmax_case(37, 64, 0, 0);  /* no mask, partial queries */
    test_softmax_case(64, 33, 0, 0);  /* an odd number of keys */
    test_softmax_case(9, 64, 1, 64);  /* fewer queries than a vector */
}

/* The pieces against their all-masks form (ts_attn_low_*_masked: every key row's mask
 * computed, none of the rows every query sees run without one) on random scores with ties,
 * -inf and NaN among the visible entries and NaN in every masked one: the same bits in every
 * output word, for blocks below, on and above the diagonal, partial ones and unaligned
 * diagonals (a key row's queries split inside a vector). */
static uint32_t rnd_state = 12345;
static float rnd(void) {
    rnd_state = rnd_state * 1664525u + 1013904223u;
    return (float)(rnd_state >> 8) / (float)(1u << 24);
}

static void test_masked_case(int64_t nq, int64_t nk, int causal, int64_t diag, int first) {
    enum { NO = BS * 8 };
    static float s0[BS * BS], s[2][BS * BS], dp[2][BS * BS], o[2][NO];
    static uint32_t w[2][BS * BS], x[2][BS * BS];
    float m[2][BS], l[2][BS], tmp[2][3 * BS], lse[BS], D[BS];
    const float scale = 0.125f;
    for (int64_t j = 0; j < BS; j++)
        for (int64_t i = 0; i < BS; i++) {
            int vis = j < nk && i < nq && (!causal || i >= j - diag);
            float r = rnd(), v = 16 * rnd() - 8;
            v = r < 0.05f ? 1.5f : r < 0.06f ? -INFINITY : r < 0.061f ? NAN : v; /* ties, -inf */
            s0[j * BS + i] = vis ? v : NAN;
            dp[0][j * BS + i] = dp[1][j * BS + i] = vis ? 2 * rnd() - 1 : NAN;
        }
    for (int i = 0; i < BS; i++) {
        m[0][i] = m[1][i] = first ? -INFINITY : 4 * rnd() - 2;
        l[0][i] = l[1][i] = first ? 0 : 1 + 3 * rnd();
        lse[i] = 1 + 2 * rnd(), D[i] = rnd() - 0.5f;
    }
    for (int i = 0; i < NO; i++) o[0][i] = o[1][i] = rnd() - 0.5f;
    for (int k = 0; k < 2; k++) {
        memcpy(s[k], s0, sizeof s0);
        memset(w[k], 0xab, sizeof w[k]);
        memset(tmp[k], 0, sizeof tmp[k]);
    }
    ts_attn_low_fwd_softmax(s[0], nq, nk, m[0], l[0], first ? NULL : o[0], 8, 8, scale, causal,
                            diag, tmp[0], w[0]);
    ts_attn_low_fwd_softmax_masked(s[1], nq, nk, m[1], l[1], first ? NULL : o[1], 8, 8, scale,
                                   causal, diag, tmp[1], w[1]);
    CHECK(!memcmp(m[0], m[1], sizeof m[0]) && !memcmp(l[0], l[1], sizeof l[0]) &&
              !memcmp(o[0], o[1], sizeof o[0]) && !memcmp(w[0], w[1], sizeof w[0]),
          "fwd softmax vs masked nq %lld nk %lld causal %d diag %lld: bits differ", (long long)nq,
          (long long)nk, causal, (long long)diag);
    for (int k = 0; k < 2; k++) {
        memcpy(s[k], s0, sizeof s0);
        memset(w[k], 0xab, sizeof w[k]);
        memset(x[k], 0xab, sizeof x[k]);
    }
    ts_attn_low_bwd_p(s[0], nq, nk, lse, scale, causal, diag, w[0]);
    ts_attn_low_bwd_p_masked(s[1], nq, nk, lse, scale, causal, diag, w[1]);
    CHECK(!memcmp(s[0], s[1], sizeof s[0]) && !memcmp(w[0], w[1], sizeof w[0]),
          "bwd p vs masked nq %lld nk %lld causal %d diag %lld: bits differ", (long long)nq,
          (long long)nk, causal, (long long)diag);
    memset(w[0], 0xab, sizeof w[0]), memset(w[1], 0xab, sizeof w[1]);
    ts_attn_low_bwd_ds(dp[0], s[0], nq, nk, D, scale, causal, diag, w[0], x[0]);
    ts_attn_low_bwd_ds_masked(dp[1], s[0], nq, nk, D, scale, causal, diag, w[1], x[1]);
    CHECK(!memcmp(w[0], w[1], sizeof w[0]) && !memcmp(x[0], x[1], sizeof x[0]),
          "bwd ds vs masked nq %lld nk %lld causal %d diag %lld: bits differ", (long long)nq,
          (long long)nk, causal, (long long)diag);
}

static void test_masked_same_bits(void) {
    static const int64_t cases[][4] = {
        /* nq, nk, causal, diag */
        {64, 64, 1, 64}, {64, 64, 1, 0},  {64, 64, 1, 128}, {64, 64, 0, 0},  {50, 50, 1, 0},
        {37, 64, 0, 0},  {64, 33, 0, 0},  {9, 64, 1, 64},   {64, 64, 1, 16}, {64, 64, 1, 31},
        {64, 63, 1, 5},  {64, 64, 1, -8}, {48, 64, 1, 1},   {64, 17, 1, 40}, {1, 1, 1, 0}};
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++)
        for (int first = 0; first < 2; first++)
            test_masked_case(cases[c][0], cases[c][1], (int)cases[c][2], cases[c][3], first);
}

typedef struct shape {
    int64_t b, h, t, hd;
    int causal;
} shape;

/* q, k, v parameters -> attention -> MSE against y; SGD with lr 0 (gradients only). */
static ts_plan *build(const shape *s, ts_dtype compute, const char *keep, int threads,
                      ts_compiled_graph *kept) {
    ts_graph *g = ts_graph_new();
    const int64_t d[4] = {s->b, s->h, s->t, s->hd};
    ts_val q = ts_param(g, "q", TS_F32, 4, d, ts_init_normal(0, 1.0));
    ts_val k = ts_param(g, "k", TS_F32, 4, d, ts_init_normal(0, 1.0));
    ts_val v = ts_param(g, "v", TS_F32, 4, d, ts_init_normal(0, 1.0));
    ts_val y = ts_input(g, "y", TS_F32, 4, d);
    ts_val o = ts_attention(g, q, k, v, s->causal, 1.0 / sqrt((double)s->hd));
    ts_train_spec spec = ts_train_spec_default(ts_mse_loss(g, o, y));
    spec.opt = ts_sgd(0.0, 0, 0, 0, 0);
    ts_compile_options opt = ts_compile_options_default();
    opt.seed = 5;
    opt.threads = threads;
    opt.precision.compute = compute;
    opt.precision.keep_fp32 = keep;
    ts_plan *p = NULL;
    CHECK_OK(ts_compile_keep(g, &spec, &opt, &p, kept));
    ts_graph_free(g);
    return p;
}

/* One step; grads: q, k, v gradients one after the other. */
static double step(const shape *s, ts_plan *p, float *grads) {
    const int64_t n = s->b * s->h * s->t * s->hd;
    float *y = malloc(sizeof(float) * (size_t)n);
    for (int64_t i = 0; i < n; i++) y[i] = (float)cos(0.11 * (double)i);
    CHECK_OK(ts_plan_set_input(p, "y", y, sizeof(float) * (size_t)n));
    CHECK_OK(ts_plan_step(p));
    const char *names[3] = {"grad:q", "grad:k", "grad:v"};
    for (int i = 0; i < 3; i++)
        CHECK_OK(ts_plan_read(p, names[i], grads + i * n, sizeof(float) * (size_t)n));
    free(y);
    return ts_plan_loss(p);
}

static double rel_err(const float *a, const float *b, int64_t n) {
    double num = 0, den = 0;
    for (int64_t i = 0; i < n; i++) {
        num += ((double)a[i] - b[i]) * ((double)a[i] - b[i]);
        den += (double)b[i] * b[i];
    }
    return sqrt(num / (den + 1e-300));
}

/* Attention nodes of the kept graph, and how many have low = 1. */
static void count_low(const ts_compiled_graph *k, int *n, int *low) {
    *n = *low = 0;
    for (int i = 0; i < k->graph->n_nodes; i++) {
        const ts_node *nd = &k->graph->nodes[i];
        if (nd->dead || (nd->op != TS_OP_ATTENTION && nd->op != TS_OP_ATTENTION_BWD)) continue;
        (*n)++;
        *low += nd->a.attention.low == 1;
    }
}

static void test_plans(const shape *s) {
    const int64_t n = s->b * s->h * s->t * s->hd;
    float *g32 = malloc(sizeof(float) * 3 * (size_t)n),
          *gbf = malloc(sizeof(float) * 3 * (size_t)n);
    float *g2 = malloc(sizeof(float) * 3 * (size_t)n);
    ts_compiled_graph k[4] = {{0}};
    ts_plan *p32 = build(s, TS_F32, NULL, 1, &k[0]), *pbf = build(s, TS_BF16, NULL, 1, &k[1]);
    ts_plan *p2 = build(s, TS_BF16, NULL, 2, &k[2]),
            *pkeep = build(s, TS_BF16, "attention", 1, &k[3]);
    if (p32 && pbf && p2 && pkeep) {
        int na, nl;
        count_low(&k[0], &na, &nl);
        CHECK(na == 2 && nl == 0, "f32: %d attention ops, %d low (2, 0 expected)", na, nl);
        count_low(&k[1], &na, &nl);
        CHECK(na == 2 && nl == 2, "bf16: %d attention ops, %d low (2, 2 expected)", na, nl);
        count_low(&k[3], &na, &nl);
        CHECK(na == 2 && nl == 0, "keep_fp32 attention: %d low (0 expected)", nl);
        double l32 = step(s, p32, g32), lbf = step(s, pbf, gbf), l2 = step(s, p2, g2);
        const char *what[3] = {"dq", "dk", "dv"};
        double worst = 0;
        CHECK(fabs(lbf - l32) <= 2e-2 * fabs(l32), "T=%lld hd=%lld: bf16 loss %.9g vs f32 %.9g",
              (long long)s->t, (long long)s->hd, lbf, l32);
        CHECK(lbf != l32, "T=%lld hd=%lld: the bf16 loss is f32's bit for bit: low had no effect",
              (long long)s->t, (long long)s->hd);
        for (int i = 0; i < 3; i++) {
            double e = rel_err(gbf + i * n, g32 + i * n, n);
            CHECK(e < 2e-2, "T=%lld hd=%lld causal %d: %s bf16 vs f32, rel err %.3g",
                  (long long)s->t, (long long)s->hd, s->causal, what[i], e);
            worst = e > worst ? e : worst;
        }
        printf("T=%lld hd=%lld causal %d: loss rel err %.2g, gradients up to %.2g\n",
               (long long)s->t, (long long)s->hd, s->causal, fabs(lbf - l32) / fabs(l32), worst);
        CHECK(lbf == l2 && memcmp(gbf, g2, sizeof(float) * 3 * (size_t)n) == 0,
              "T=%lld hd=%lld: 1 and 2 threads give the same loss and gradient bits",
              (long long)s->t, (long long)s->hd);
    }
    ts_plan_free(p32);
    ts_plan_free(pbf);
    ts_plan_free(p2);
    ts_plan_free(pkeep);
    for (int i = 0; i < 4; i++) ts_compiled_graph_free(&k[i]);
    free(g32);
    free(gbf);
    free(g2);
}

int main(void) {
    test_pack();
    test_mm();
    test_softmax_pieces();
    test_masked_same_bits();
    /* W3's head size on 4 key blocks (large enough to run on 2 threads; its forward items are
     * whole heads on 1 thread, query blocks on 2), partial blocks with an odd head size, no
     * mask, and 8 heads of an odd length (whole-head items on 2 threads too). */
    const shape shapes[4] = {
        {1, 4, 256, 64, 1}, {2, 1, 130, 5, 1}, {1, 2, 70, 12, 0}, {2, 4, 129, 32, 1}};
    for (int i = 0; i < 4; i++) test_plans(&shapes[i]);
    return check_summary("attention_low");
}
