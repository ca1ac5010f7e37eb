/* The GELU's f32 derivative, bit for bit, on every 251st f32 bit pattern
 * (17 million inputs: every exponent, both signs, NaN and infinities),
 * through the kernels on chunks of their size and an odd tail:
 * - the tanh GELU's unary_bwd computes sigmoid(2u) from one exp and one division
 *   (session 19; two divisions before, one exp since session 14) and sigmoid(-2u) from
 *   it: its error against an f64 evaluation (in ulps of the larger of the two terms
 *   s and x s sn 2u', as the cancellation between them is the formula's own) must
 *   be at most that of the two m_sigmoid_f32 calls it replaced plus one, and NaN
 *   only where they give NaN;
 * - m_exp_neg_f32 has m_exp_f32's bits on every non-positive input of the sweep (and
 *   NaN) (all 2^31 of them were compared once in session 19: none differ);
 * - a gelu with out_grad (session 18, passes/gelu_grad.c), tanh and erf,
 *   f32 and bf16 (out_low) result, also in place (the result over x):
 *   its result has the plain gelu kernel's bits and its second output
 *   those of unary_bwd's derivative (dy = 1), and unary_bwd side 2
 *   (dy * that output) those of side 0 for any dy.
 * - the same on every ISA (session 22: vmath.h's fused multiply-adds): the exp, sigmoid and
 *   gelu (tanh) kernels, run through the library's target_clones variant for this CPU (an FMA
 *   instruction on AVX-512 or AVX2), have the bits of vmath.h inlined here, in a file built for
 *   the baseline x86-64 (fmaf: libm's correctly rounded call).
 * (All 2^32 inputs were compared once, scalar and AVX-512: none differ;
 * and once more in session 18 with STEP 1, every check above: none differ.) */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include "check.h"
#include "ops/op.h"
#include "ops/vmath.h"

#define BETA  0.797884560802865355879 /* sqrt(2/pi) */
#define KAPPA 0.044715

/* The formula as it was until session 18: two sigmoids, each with its own exp. */
static float reference(float x) {
    x = x > 30.0f ? 30.0f : (x < -30.0f ? -30.0f : x);
    float x2 = x * x;
    float u2 = (float)(2.0 * BETA) * (x + (float)KAPPA * (x2 * x));
    float s = m_sigmoid_f32(u2), sn = m_sigmoid_f32(-u2);
    return s + 2.0f * x * s * sn * (float)BETA * (1.0f + (float)(3.0 * KAPPA) * x2);
}

/* The tanh GELU as unary.c evaluates it (x s, s = sigmoid(2u) from one fused multiply-add). */
static float gelu_tanh(float x) {
    float u2 = (float)(2.0 * BETA) * fmaf((float)KAPPA * (x * x), x, x);
    return x * m_sigmoid_f32(u2);
}

/* gelu'(x) in f64, and the larger magnitude of its two terms (the scale of its error) */
static double exact(double x, double *scale) {
    x = x > 30.0 ? 30.0 : (x < -30.0 ? -30.0 : x);
    double u2 = 2.0 * BETA * (x + KAPPA * x * x * x);
    double s = 1.0 / (1.0 + exp(-u2)), sn = 1.0 / (1.0 + exp(u2));
    double t = x * s * sn * 2.0 * BETA * (1.0 + 3.0 * KAPPA * x * x);
    *scale = fmax(fabs(s), fabs(t));
    return s + t;
}

/* |a - r| in ulps of an f32 of magnitude sc (the subnormal spacing below) */
static double ulps(float a, double r, double sc) {
    int e;
    frexp(sc, &e);
    double u = ldexp(1.0, e - 24);
    return fabs((double)a - r) / (u < 0x1p-149 ? 0x1p-149 : u);
}

enum { N = 1 << 20, STEP = 251 };
static double err_old, err_new; /* the largest errors of the derivative, in ulps */

static ts_step_ctx ctx = {1, 0, 0.0, 1};

/* Run op's kernel with attributes a on n elements. */
static void run(int op, const ts_attrs *a, int n_in, const void *in0, const void *in1,
                ts_dtype out0, void *o0, void *o1, int n) {
    ts_tensor in[2] = {{TS_F32, 1, {n}, (void *)in0}, {TS_F32, 1, {n}, (void *)in1}};
    ts_tensor out[2] = {{out0, 1, {n}, o0}, {TS_F32, 1, {n}, o1}};
    ts_kargs k = {a, n_in, o1 ? 2 : 1, in, out, NULL, 0, &ctx, "gelu_grad", NULL};
    CHECK_OK(ts_op_get(op)->kernel(&k));
}

/* Bits differ (NaN equals NaN: its sign and payload follow the order the compiler gave a
 * product's operands, which IEEE 754 leaves open). */
static int differ(float a, float b) {
    return memcmp(&a, &b, sizeof a) != 0 && !(a != a && b != b);
}
static int differ_bf16(uint16_t a, uint16_t b) {
    return a != b && !((a & 0x7fffu) > 0x7f80u && (b & 0x7fffu) > 0x7f80u);
}

typedef struct bufs {
    float *x, *one, *d, *ref, *y, *g, *b0, *b2, *xc;
    uint16_t *low_ref, *low;
} bufs;

/* The checks of one batch of n inputs for one approximation; adds to bad[0..4]. */
static void batch(bufs *B, int n, int64_t approx, long long *bad) {
    ts_attrs fw = ts_attrs_zero(), bw = ts_attrs_zero();
    fw.unary.approx = (int32_t)approx;
    bw.unary_bwd.fwd_op = TS_OP_GELU, bw.unary_bwd.fwd = fw.unary;
    run(TS_OP_GELU, &fw, 1, B->x, NULL, TS_F32, B->ref, NULL, n);       /* gelu(x) */
    run(TS_OP_UNARY_BWD, &bw, 2, B->one, B->x, TS_F32, B->b0, NULL, n); /* gelu'(x) */
    if (approx == TS_GELU_TANH)
        for (int i = 0; i < n; i++) {
            const float x = B->x[i], r0 = reference(x), r1 = B->b0[i];
            if (x != x || r0 != r0) {
                bad[0] += !(x != x && r0 != r0 && r1 != r1);
                continue;
            }
            double sc, r = exact((double)x, &sc);
            err_old = fmax(err_old, ulps(r0, r, sc)), err_new = fmax(err_new, ulps(r1, r, sc));
            if (!(x > 0.0f)) bad[0] += differ(m_exp_neg_f32(x), m_exp_f32(x));
        }
    if (approx == TS_GELU_TANH) { /* the clone for this CPU against this file's baseline build */
        ts_attrs none = ts_attrs_zero();
        run(TS_OP_EXP, &none, 1, B->x, NULL, TS_F32, B->y, NULL, n);
        for (int i = 0; i < n; i++) bad[5] += differ(B->y[i], m_exp_f32(B->x[i]));
        run(TS_OP_SIGMOID, &none, 1, B->x, NULL, TS_F32, B->y, NULL, n);
        for (int i = 0; i < n; i++) bad[5] += differ(B->y[i], m_sigmoid_f32(B->x[i]));
        for (int i = 0; i < n; i++) bad[5] += differ(B->ref[i], gelu_tanh(B->x[i]));
    }
    ts_attrs fg = fw;
    fg.unary.out_grad = 1;
    run(TS_OP_GELU, &fg, 1, B->x, NULL, TS_F32, B->y, B->g, n);
    for (int i = 0; i < n; i++) bad[1] += differ(B->y[i], B->ref[i]) || differ(B->g[i], B->b0[i]);
    memcpy(B->xc, B->x, sizeof(float) * (size_t)n); /* in place: the result over x */
    run(TS_OP_GELU, &fg, 1, B->xc, NULL, TS_F32, B->xc, B->g, n);
    for (int i = 0; i < n; i++) bad[2] += differ(B->xc[i], B->ref[i]) || differ(B->g[i], B->b0[i]);
    ts_attrs fl = fw;
    fl.unary.out_low = 1;
    run(TS_OP_GELU, &fl, 1, B->x, NULL, TS_BF16, B->low_ref, NULL, n);
    fl.unary.out_grad = 1;
    run(TS_OP_GELU, &fl, 1, B->x, NULL, TS_BF16, B->low, B->g, n);
    for (int i = 0; i < n; i++)
        bad[3] += differ_bf16(B->low[i], B->low_ref[i]) || differ(B->g[i], B->b0[i]);
    run(TS_OP_UNARY_BWD, &bw, 2, B->d, B->x, TS_F32, B->b0, NULL, n); /* d gelu'(x), side 0 */
    bw.unary_bwd.side = 2;
    run(TS_OP_UNARY_BWD, &bw, 2, B->d, B->g, TS_F32, B->b2, NULL, n); /* d g, side 2 */
    for (int i = 0; i < n; i++) bad[4] += differ(B->b2[i], B->b0[i]);
}

int main(void) {
    bufs B;
    float **f[] = {&B.x, &B.one, &B.d, &B.ref, &B.y, &B.g, &B.b0, &B.b2, &B.xc};
    for (size_t i = 0; i < sizeof f / sizeof f[0]; i++) *f[i] = malloc(sizeof(float) * N);
    B.low_ref = malloc(sizeof(uint16_t) * N), B.low = malloc(sizeof(uint16_t) * N);
    for (int i = 0; i < N; i++)
        B.one[i] = 1.0f, B.d[i] = (float)(sin(0.37 * i) * pow(10.0, (double)(i % 9) - 4));
    long long bad[2][6] = {{0}}, n_all = 0;
    for (uint64_t u = 0; u <= 0xffffffffull;) {
        int n = 0; /* a batch of N - 3 inputs: the kernels' 4096-element chunks and a tail */
        for (; n < N - 3 && u <= 0xffffffffull; n++, u += STEP) {
            uint32_t b = (uint32_t)u;
            memcpy(&B.x[n], &b, sizeof b);
        }
        batch(&B, n, TS_GELU_TANH, bad[0]);
        batch(&B, n, TS_GELU_ERF, bad[1]);
        n_all += n;
    }
    CHECK(n_all > 17000000, "%lld inputs", n_all);
    CHECK(bad[0][0] == 0, "tanh GELU derivative NaN where it was, exp_neg: %lld of %lld differ",
          bad[0][0], n_all);
    printf("tanh GELU derivative, largest error: %.3f ulps (two divisions: %.3f)\n", err_new,
           err_old);
    CHECK(err_new <= err_old + 1.0,
          "tanh GELU derivative: largest error %.3f ulps of its larger term (two divisions: "
          "%.3f)",
          err_new, err_old);
    static const char *what[] = {"", "out_grad", "out_grad in place", "out_grad with out_low",
                                 "unary_bwd side 2"};
    for (int a = 0; a < 2; a++)
        for (int c = 1; c < 5; c++)
            CHECK(bad[a][c] == 0, "%s GELU, %s: %lld of %lld inputs differ", a ? "erf" : "tanh",
                  what[c], bad[a][c], n_all);
    CHECK(bad[0][5] == 0,
          "exp, sigmoid or tanh GELU: %lld of %lld inputs differ between this CPU's clone and the "
          "baseline build",
          bad[0][5], n_all);
    for (size_t i = 0; i < sizeof f / sizeof f[0]; i++) free(*f[i]);
    free(B.low_ref);
    free(B.low);
    return check_summary("gelu_grad_bits");
}
