/* vmath.h — f32 exp, log, sigmoid and tanh in forms the compiler vectorises (a call to
 * libm's expf/logf cannot be), shared by every kernel that needs them.
 * Both are within 1 ulp over the normal range; -fno-trapping-math (set for
 * the whole library) lets the selects if-convert. No FMA contraction in ISO
 * C mode: the fused multiply-adds are the explicit fmaf calls, one rounding
 * each wherever they run (an FMA instruction in the AVX-512 and x86-64-v3
 * variants of TS_CLONES, libm's correctly rounded fmaf in the generic one), so
 * every target_clones variant returns the same bits. */
#ifndef TS_VMATH_H
#define TS_VMATH_H

#include <math.h>
#include <stdint.h>
#include <string.h>

static inline uint32_t f32_bits(float f) {
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return u;
}
static inline float f32_from_bits(uint32_t u) {
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

/* exp(x): x = n ln2 + r with |r| <= ln2/2, exp(r) by Cephes' expf
 * polynomial, then the scale 2^n applied as two halves so that results in
 * the subnormal range and the overflow to inf are rounded once, correctly.
 * n comes from the bits of x*log2(e) + 1.5*2^23 (round to nearest without a
 * float->int conversion, which would be undefined for NaN). */
/* The part both exps share: x (clamped to [-104, 88.8] by the caller) = n ln2 + r with n
 * from the magic-number rounding, and p = e^r by the degree-6 polynomial; returns p, *n. */
static inline float m_exp_core_f32(float x, uint32_t *n) {
    const float magic = 12582912.0f; /* 1.5 * 2^23 */
    float t = fmaf(x, 1.44269504088896341f, magic);
    float r = t - magic;
    *n = f32_bits(t) - f32_bits(magic);
    x = fmaf(r, -0.693359375f, x); /* ln2 split in two: r * hi is exact */
    x = fmaf(r, 2.12194440e-4f, x);
    float z = x * x;
    float p = fmaf(fmaf(fmaf(fmaf(fmaf(1.9875691500e-4f, x, 1.3981999507e-3f), x, 8.3334519073e-3f),
                             x, 4.1665795894e-2f),
                        x, 1.6666665459e-1f),
                   x, 5.0000001201e-1f);
    return p * z + x + 1.0f; /* not fused: 0.95 ulp at most over [-103, 88.7], 1.007 fused */
}

static inline float m_exp_f32(float x) {
    x = x > 88.8f ? 88.8f : x;     /* exp(88.8) overflows to inf below */
    x = x < -104.0f ? -104.0f : x; /* exp(-104) rounds to 0 below */
    uint32_t n;
    float p = m_exp_core_f32(x, &n);
    int32_t ni = (int32_t)n, n1 = ni >> 1, n2 = ni - n1;
    float s1 = f32_from_bits((uint32_t)(n1 + 127) << 23);
    float s2 = f32_from_bits((uint32_t)(n2 + 127) << 23);
    return p * s1 * s2;
}

/* exp(x) for x <= 0 (or NaN): m_exp_f32's bits, cheaper. No upper clamp (x <= 0 never
 * meets it), and the scale 2^n (n in [-150, 0]) applied as 2^(n + 64), a normal power that
 * p times exactly, then 2^-64, which rounds once, as the two halves do: the same result.
 * (tests/unit/gelu_grad_bits.c compares the two on every non-positive f32.) */
static inline float m_exp_neg_f32(float x) {
    x = -104.0f > x ? -104.0f : x; /* exp(-104) rounds to 0 below; NaN stays */
    uint32_t n;
    float p = m_exp_core_f32(x, &n);
    return p * f32_from_bits((n + 127u + 64u) << 23) * 5.42101086242752217e-20f; /* 2^-64 */
}

/* log(x): x = m 2^e with m in [sqrt(1/2), sqrt(2)), log(m) by Cephes' logf
 * polynomial; subnormals are rescaled, and 0, negatives, inf and NaN are
 * patched at the end so the main path stays branch-free. */
static inline float m_log_f32(float x) {
    /* x = t 2^s with t = 1.f for a normal x (exponent field E, s = E - 127)
     * and t = 0.f for a subnormal one (s = -126), f the 23 fraction bits;
     * both t are exact. */
    uint32_t bx = f32_bits(x);
    int sub = x < 1.17549435e-38f; /* subnormal (or <= 0, patched below) */
    float t = (f32_from_bits((bx & 0x007fffffu) | 0x3f800000u) - 1.0f) + (sub ? 0.0f : 1.0f);
    int32_t sc = sub ? -126 : (int32_t)((bx >> 23) & 0xffu) - 127;
    uint32_t b = f32_bits(t);
    int32_t e = (int32_t)((b >> 23) & 0xffu) - 126 + sc;
    float m = f32_from_bits((b & 0x007fffffu) | 0x3f000000u); /* [0.5, 1) */
    int lo = m < 0.707106781186547524f;
    e -= lo;
    m = m + (lo ? m : 0.0f) - 1.0f; /* 2m - 1 or m - 1, both exact */
    float z = m * m;
    float y = ((((((((7.0376836292e-2f * m - 1.1514610310e-1f) * m + 1.1676998740e-1f) * m -
                    1.2420140846e-1f) *
                       m +
                   1.4249322787e-1f) *
                      m -
                  1.6668057665e-1f) *
                     m +
                 2.0000714765e-1f) *
                    m -
                2.4999993993e-1f) *
                   m +
               3.3333331174e-1f) *
              m * z;
    float fe = (float)e;
    y += -2.12194440e-4f * fe;
    y += -0.5f * z;
    float r = m + y + 0.693359375f * fe;
    r = x == INFINITY ? x : r;
    r = x == 0.0f ? -INFINITY : r;
    r = (x < 0.0f) ? NAN : r;
    return x != x ? x : r;
}

/* sigmoid(x) = 1 / (1 + e^-x), evaluated with e = exp(-|x|) <= 1 so that
 * it never overflows and the negative side keeps full relative accuracy. */
static inline float m_sigmoid_f32(float x) {
    float e = m_exp_neg_f32(-fabsf(x));
    return (x >= 0.0f ? 1.0f : e) / (1.0f + e);
}
static inline double m_sigmoid_f64(double x) {
    double e = exp(-fabs(x));
    return (x >= 0.0 ? 1.0 : e) / (1.0 + e);
}

/* tanh: Cephes' odd polynomial below 0.625 (where 1 - 2/(e^2x + 1) would
 * cancel), that formula above it (e^2x = inf gives exactly +-1). */
static inline float m_tanh_f32(float x) {
    float ax = fabsf(x), z = x * x;
    float small = ((((-5.70498872745e-3f * z + 2.06390887954e-2f) * z - 5.37397155531e-2f) * z +
                    1.33314422036e-1f) *
                       z -
                   3.33332819422e-1f) *
                      z * x +
                  x;
    float e = m_exp_f32(ax + ax);
    float big = copysignf(1.0f - 2.0f / (e + 1.0f), x);
    return ax < 0.625f ? small : big;
}

static inline double m_tanh_f64(double x) {
    return tanh(x);
}

#endif
