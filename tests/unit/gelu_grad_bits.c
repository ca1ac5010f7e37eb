/* The tanh GELU's f32 derivative (unary_bwd, ops/unary.c) computes
 * sigmoid(2u) and sigmoid(-2u) from one exp (session 14); its bits must be
 * those of the two m_sigmoid_f32 calls it replaced, in fp32 plans too.
 * Checked here on every 251st f32 bit pattern (17 million inputs: every
 * exponent, both signs, NaN and infinities) with dy = 1 (the product is
 * exact), through the kernel on chunks of the unary_bwd kernel's size and
 * an odd tail. (All 2^32 inputs were compared once, scalar and AVX-512:
 * none differ.) */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include "check.h"
#include "ops/op.h"
#include "ops/vmath.h"

#define BETA  0.797884560802865355879 /* sqrt(2/pi) */
#define KAPPA 0.044715

/* The formula as it was: two sigmoids, each with its own exp. */
static float reference(float x) {
    x = x > 30.0f ? 30.0f : (x < -30.0f ? -30.0f : x);
    float x2 = x * x;
    float u2 = (float)(2.0 * BETA) * (x + (float)KAPPA * (x2 * x));
    float s = m_sigmoid_f32(u2), sn = m_sigmoid_f32(-u2);
    return s + 2.0f * x * s * sn * (float)BETA * (1.0f + (float)(3.0 * KAPPA) * x2);
}

enum { N = 1 << 20, STEP = 251 };

int main(void) {
    float *x = malloc(sizeof(float) * N), *dy = malloc(sizeof(float) * N);
    float *o = malloc(sizeof(float) * N);
    for (int i = 0; i < N; i++) dy[i] = 1.0f;
    ts_attrs a = ts_attrs_zero();
    a.unary_bwd.fwd_op = TS_OP_GELU, a.unary_bwd.fwd.approx = TS_GELU_TANH;
    const ts_op_def *d = ts_op_get(TS_OP_UNARY_BWD);
    ts_step_ctx ctx = {1, 0, 0.0, 1};
    long long bad = 0, n_all = 0;
    for (uint64_t u = 0; u <= 0xffffffffull;) {
        int n = 0; /* a batch of N - 3 inputs: the kernel's 4096-element chunks and a tail */
        for (; n < N - 3 && u <= 0xffffffffull; n++, u += STEP) {
            uint32_t b = (uint32_t)u;
            memcpy(&x[n], &b, sizeof b);
        }
        ts_tensor in[2] = {{TS_F32, 1, {n}, dy}, {TS_F32, 1, {n}, x}};
        ts_tensor out = {TS_F32, 1, {n}, o};
        ts_kargs k = {&a, 2, 1, in, &out, NULL, 0, &ctx, "gelu_grad", NULL};
        CHECK_OK(d->kernel(&k));
        for (int i = 0; i < n; i++) {
            float r = reference(x[i]);
            bad += memcmp(&r, &o[i], sizeof r) != 0 && !(r != r && o[i] != o[i]);
        }
        n_all += n;
    }
    CHECK(bad == 0 && n_all > 17000000, "tanh GELU derivative: %lld of %lld inputs differ", bad,
          n_all);
    free(x);
    free(dy);
    free(o);
    return check_summary("gelu_grad_bits");
}
