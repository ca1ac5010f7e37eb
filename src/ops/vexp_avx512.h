/* vexp_avx512.h — vmath.h's m_exp_neg_f32 on 16 lanes in AVX-512 intrinsics, with its bits
 * (internal to the hand-vectorised kernels: gelu_simd.c, ce_simd.c):
 *
 *     #if TS_VEXP_AVX512
 *     TS_VEXP_TARGET static void f(...) { __m512 e = ts_vexp_neg(x); ... }   // x <= 0 or NaN
 *     #endif
 *
 * The same operations in the same order as the scalar code, but for the scale 2^n: one
 * vscalefps (p times 2^n, rounded once) where the scalar code multiplies by 2^(n + 64), exactly,
 * and then by 2^-64, rounding once: the same result. GCC's vectorisation of the scalar code makes
 * that step integer adds, a shift and two products, and the clamp a compare and a blend; here it
 * is one max. tests/unit/gelu_grad_bits.c and tests/unit/ce_simd.c compare the bits. */
#ifndef TS_VEXP_AVX512_H
#define TS_VEXP_AVX512_H

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define TS_VEXP_AVX512 1
#include <immintrin.h>

#define TS_VEXP_TARGET __attribute__((target("avx512f")))

/* exp(x) for x <= 0 or NaN: m_exp_neg_f32's bits. */
static inline __attribute__((always_inline)) TS_VEXP_TARGET __m512 ts_vexp_neg(__m512 x) {
    const __m512 magic = _mm512_set1_ps(12582912.0f); /* 1.5 * 2^23 */
    x = _mm512_max_ps(_mm512_set1_ps(-104.0f), x);    /* -104 > x ? -104 : x (NaN stays) */
    __m512 t = _mm512_fmadd_ps(x, _mm512_set1_ps(1.44269504088896341f), magic);
    __m512 n = _mm512_sub_ps(t, magic); /* the integer n, exactly */
    x = _mm512_fmadd_ps(n, _mm512_set1_ps(-0.693359375f), x);
    x = _mm512_fmadd_ps(n, _mm512_set1_ps(2.12194440e-4f), x);
    __m512 z = _mm512_mul_ps(x, x);
    __m512 p =
        _mm512_fmadd_ps(_mm512_set1_ps(1.9875691500e-4f), x, _mm512_set1_ps(1.3981999507e-3f));
    p = _mm512_fmadd_ps(p, x, _mm512_set1_ps(8.3334519073e-3f));
    p = _mm512_fmadd_ps(p, x, _mm512_set1_ps(4.1665795894e-2f));
    p = _mm512_fmadd_ps(p, x, _mm512_set1_ps(1.6666665459e-1f));
    p = _mm512_fmadd_ps(p, x, _mm512_set1_ps(5.0000001201e-1f));
    p = _mm512_add_ps(_mm512_add_ps(_mm512_mul_ps(p, z), x), _mm512_set1_ps(1.0f));
    return _mm512_scalef_ps(p, n);
}

/* The CPU runs these kernels. */
static inline int ts_vexp_avx512_ok(void) {
    return __builtin_cpu_supports("avx512f");
}
#else
#define TS_VEXP_AVX512 0
#endif

#endif
