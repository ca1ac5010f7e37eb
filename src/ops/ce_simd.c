/* The cross entropy's exp loops in AVX-512 intrinsics (ce_simd.h): m_exp_neg_f32 as
 * vexp_avx512.h computes it, the subtraction, product and f64 sums as loss.c's loops do them,
 * so every value keeps its bits (tests/unit/ce_simd.c). W3's fused cross entropy evaluates
 * 33.5 million of these exps a step (each logit twice: its row's sum, then its gradient). */
#include "ops/ce_simd.h"

#include "ops/vexp_avx512.h"

#if TS_VEXP_AVX512
TS_VEXP_TARGET static int64_t sumexp(double *acc, const float *x, float m, int64_t c) {
    __m512d lo = _mm512_loadu_pd(acc), hi = _mm512_loadu_pd(acc + 8);
    const __m512 mv = _mm512_set1_ps(m);
    int64_t i = 0;
    for (; i + 16 <= c; i += 16) {
        __m512 e = ts_vexp_neg(_mm512_sub_ps(_mm512_loadu_ps(x + i), mv));
        lo = _mm512_add_pd(lo, _mm512_cvtps_pd(_mm512_castps512_ps256(e)));
        hi = _mm512_add_pd(
            hi, _mm512_cvtps_pd(_mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(e), 1))));
    }
    _mm512_storeu_pd(acc, lo);
    _mm512_storeu_pd(acc + 8, hi);
    return i;
}

TS_VEXP_TARGET static int64_t scaled_exp(float *d, const float *x, float lse, float sc, int64_t n) {
    const __m512 lv = _mm512_set1_ps(lse), sv = _mm512_set1_ps(sc);
    int64_t i = 0;
    for (; i + 16 <= n; i += 16)
        _mm512_storeu_ps(d + i,
                         _mm512_mul_ps(ts_vexp_neg(_mm512_sub_ps(_mm512_loadu_ps(x + i), lv)), sv));
    return i;
}

int64_t ts_ce_sumexp_simd(double *acc, const float *x, float m, int64_t c) {
    return ts_vexp_avx512_ok() ? sumexp(acc, x, m, c) : 0;
}
int64_t ts_ce_scaled_exp_simd(float *d, const float *x, float lse, float sc, int64_t n) {
    return ts_vexp_avx512_ok() ? scaled_exp(d, x, lse, sc, n) : 0;
}
#else
int64_t ts_ce_sumexp_simd(double *acc, const float *x, float m, int64_t c) {
    (void)acc, (void)x, (void)m, (void)c;
    return 0;
}
int64_t ts_ce_scaled_exp_simd(float *d, const float *x, float lse, float sc, int64_t n) {
    (void)d, (void)x, (void)lse, (void)sc, (void)n;
    return 0;
}
#endif
