/* PowerSGD's products (src/ops/psgd_products.h) against the plain loops they replaced, bit for
 * bit: P = M Q (with and without the error feedback's M += g on the way), Q = M^T P and g = P Q^T
 * with M -= g, on matrices whose sides are and are not multiples of the kernels' blocks (8 rows, 32
 * columns, 64-row chunks, 256- and 512-column pieces), at ranks 1 to 16, with values spanning many
 * magnitudes and signed zeros, on 1 and 2 threads. The residual sum, a metric summed in lanes, is
 * checked to a relative 1e-12 only. */
#include <math.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "check.h"
#include "core/core.h"
#include "ops/psgd_products.h"

/* The plain loops: each output's sum in double over its terms in order, as psgd.c had them. */
static void ref_mq(const float *a, const float *b, float *c, int64_t n, int64_t m, int r) {
    for (int64_t i = 0; i < n; i++) {
        double acc[64] = {0};
        for (int64_t l = 0; l < m; l++)
            for (int j = 0; j < r; j++) acc[j] += (double)a[i * m + l] * (double)b[l * r + j];
        for (int j = 0; j < r; j++) c[i * r + j] = (float)acc[j];
    }
}
static void ref_mtp(const float *a, const float *b, float *c, int64_t n, int64_t m, int r) {
    for (int64_t l = 0; l < m; l++)
        for (int j = 0; j < r; j++) {
            double acc = 0;
            for (int64_t i = 0; i < n; i++) acc += (double)a[i * m + l] * (double)b[i * r + j];
            c[l * r + j] = (float)acc;
        }
}
static double ref_approx(const float *P, const float *Q, float *g, float *M, int64_t n, int64_t m,
                         int r) {
    double res = 0;
    for (int64_t x = 0; x < n; x++)
        for (int64_t y = 0; y < m; y++) {
            double v = 0;
            for (int j = 0; j < r; j++) v += (double)P[x * r + j] * (double)Q[y * r + j];
            g[x * m + y] = (float)v;
            M[x * m + y] -= (float)v;
            res += (double)M[x * m + y] * (double)M[x * m + y];
        }
    return res;
}

/* Values from 1e-6 to 1e3 of both signs, with some exact zeros (and negative zeros). */
static void fill(float *p, int64_t n, uint64_t seed) {
    for (int64_t i = 0; i < n; i++) {
        uint32_t w[4];
        ts_philox(seed, 3, (uint64_t)i, w);
        float mag = powf(10.0f, (float)(w[0] % 10000) * 9e-4f - 6.0f);
        float v = (w[1] & 1) ? -mag : mag;
        if (w[2] % 17 == 0) v = (w[3] & 1) ? -0.0f : 0.0f;
        p[i] = v;
    }
}

static int same_bits(const float *a, const float *b, int64_t n) {
    return memcmp(a, b, sizeof(float) * (size_t)n) == 0;
}

static void check_shape(int64_t n, int64_t m, int r, int threads) {
    float *M = malloc(sizeof(float) * (size_t)(n * m)),
          *M2 = malloc(sizeof(float) * (size_t)(n * m));
    float *Q = malloc(sizeof(float) * (size_t)(m * r)),
          *qt = malloc(sizeof(float) * (size_t)(m * r));
    float *P = malloc(sizeof(float) * (size_t)(n * r)),
          *P2 = malloc(sizeof(float) * (size_t)(n * r));
    float *Q2 = malloc(sizeof(float) * (size_t)(m * r)),
          *Q3 = malloc(sizeof(float) * (size_t)(m * r));
    float *g = malloc(sizeof(float) * (size_t)(n * m)),
          *g2 = malloc(sizeof(float) * (size_t)(n * m));
    float *at = malloc(ts_psgd_mq_scratch_bytes(m));
    fill(M, n * m, (uint64_t)(n * 131 + m * 7 + r));
    fill(Q, m * r, (uint64_t)(r + 99));
    memcpy(M2, M, sizeof(float) * (size_t)(n * m));
    omp_set_num_threads(threads);

    ref_mq(M, Q, P, n, m, r);
    ts_psgd_mq(M, NULL, 1.0f, 1.0f, Q, P2, at, n, m, r);
    CHECK(same_bits(P, P2, n * r), "P = M Q, [%lld, %lld] rank %d, %d threads", (long long)n,
          (long long)m, r, threads);

    /* the error feedback on the way: M += g / 1024 * 0.75 (unscaled, clipped), then P = M Q */
    float *G = malloc(sizeof(float) * (size_t)(n * m)),
          *Mf = malloc(sizeof(float) * (size_t)(n * m));
    float *Mf2 = malloc(sizeof(float) * (size_t)(n * m));
    fill(G, n * m, (uint64_t)(n + m + r + 5));
    memcpy(Mf, M, sizeof(float) * (size_t)(n * m));
    memcpy(Mf2, M, sizeof(float) * (size_t)(n * m));
    for (int64_t e = 0; e < n * m; e++) Mf[e] += ts_psgd_unscale_clip(G[e], 1.0f / 1024, 0.75f);
    ref_mq(Mf, Q, P, n, m, r);
    ts_psgd_mq(Mf2, G, 1.0f / 1024, 0.75f, Q, P2, at, n, m, r);
    CHECK(same_bits(Mf, Mf2, n * m) && same_bits(P, P2, n * r),
          "M += g, P = M Q, [%lld, %lld] rank %d, %d threads", (long long)n, (long long)m, r,
          threads);
    free(G), free(Mf), free(Mf2);
    ref_mq(M, Q, P, n, m, r);

    ref_mtp(M, P, Q2, n, m, r);
    ts_psgd_mtp(M, P, Q3, n, m, r);
    CHECK(same_bits(Q2, Q3, m * r), "Q = M^T P, [%lld, %lld] rank %d, %d threads", (long long)n,
          (long long)m, r, threads);

    for (int64_t y = 0; y < m; y++)
        for (int j = 0; j < r; j++) qt[j * m + y] = Q2[y * r + j];
    double want = ref_approx(P, Q2, g, M, n, m, r);
    double got = ts_psgd_approx(P, qt, g2, M2, n, m, r);
    CHECK(same_bits(g, g2, n * m) && same_bits(M, M2, n * m),
          "g = P Q^T, M -= g, [%lld, %lld] rank %d, %d threads", (long long)n, (long long)m, r,
          threads);
    CHECK(fabs(got - want) <= 1e-12 * fabs(want), "residual %.17g against %.17g", got, want);
    free(M), free(M2), free(Q), free(qt), free(P), free(P2), free(Q2), free(Q3), free(g), free(g2);
    free(at);
}

int main(void) {
    /* n: under, at and over the 8-row blocks; m: under and over 32, 256 and 16384 / n */
    const int64_t shapes[][2] = {{5, 3},     {8, 32},    {13, 45},   {64, 300},
                                 {129, 513}, {512, 128}, {200, 1000}};
    const int ranks[] = {1, 2, 4, 7, 16};
    for (int t = 1; t <= 2; t++)
        for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++)
            for (size_t k = 0; k < sizeof ranks / sizeof ranks[0]; k++)
                if (ranks[k] < shapes[s][0] && ranks[k] < shapes[s][1])
                    check_shape(shapes[s][0], shapes[s][1], ranks[k], t);
    return check_summary("unit/psgd_products");
}
