/* half.h — f32 <-> bf16 / f16 conversions (internal).
 *
 * Scalar, portable, branch-light inline functions so that kernels can
 * convert inside their own loops (they vectorise under `omp simd`):
 *
 *     uint16_t h = ts_f32_to_bf16(x);      // round to nearest, ties to even
 *     float y = ts_bf16_to_f32(h);         // exact
 *     uint16_t e = ts_f32_to_f16(x);       // RNE; overflow -> inf, tiny -> subnormal/0
 *     float z = ts_f16_to_f32(e);          // exact
 *
 * NaN stays NaN (quieted, sign kept); infinities stay infinities. Every
 * function is checked over all 65536 half bit patterns and every rounding
 * boundary between them in tests/unit/half.c. The bulk helpers convert
 * arrays (used by the mixed-precision reference kernels).
 */
#ifndef TS_HALF_H
#define TS_HALF_H

#include <stdint.h>
#include <string.h>

static inline uint32_t ts_half_f32_bits(float f) {
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return u;
}
static inline float ts_half_f32_from_bits(uint32_t u) {
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

static inline float ts_bf16_to_f32(uint16_t h) {
    return ts_half_f32_from_bits((uint32_t)h << 16);
}

static inline uint16_t ts_f32_to_bf16(float f) {
    uint32_t u = ts_half_f32_bits(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40); /* quiet NaN */
    u += 0x7fffu + ((u >> 16) & 1u); /* RNE; carries into the exponent (max -> inf) */
    return (uint16_t)(u >> 16);
}

static inline float ts_f16_to_f32(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16, e = (h >> 10) & 0x1fu, m = h & 0x3ffu;
    if (e == 0x1f) return ts_half_f32_from_bits(sign | 0x7f800000u | (m << 13)); /* inf / NaN */
    if (e == 0) {                                    /* zero / subnormal: m * 2^-24, exact */
        float v = (float)m * 5.9604644775390625e-8f; /* 2^-24 */
        return sign ? -v : v;
    }
    return ts_half_f32_from_bits(sign | ((e + 112u) << 23) | (m << 13));
}

static inline uint16_t ts_f32_to_f16(float f) {
    uint32_t u = ts_half_f32_bits(f), sign = (u >> 16) & 0x8000u, a = u & 0x7fffffffu;
    if (a > 0x7f800000u) return (uint16_t)(sign | 0x7e00u | ((a >> 13) & 0x3ffu)); /* NaN */
    if (a >= 0x477ff000u) return (uint16_t)(sign | 0x7c00u); /* rounds to >= 65520: inf */
    if (a < 0x38800000u) {                                   /* below 2^-14: subnormal f16 */
        /* adding 0.5 makes the FPU round a to a multiple of 2^-24 (the f16
         * subnormal step, ties to even); the low bits then count steps */
        float v = ts_half_f32_from_bits(a) + 0.5f;
        return (uint16_t)(sign | (ts_half_f32_bits(v) - 0x3f000000u));
    }
    uint32_t r = a + 0x0fffu + ((a >> 13) & 1u); /* round the mantissa to 10 bits */
    return (uint16_t)(sign | ((r - 0x38000000u) >> 13));
}

/* Array conversions, parallel over large n. */
void ts_f32_to_bf16_n(uint16_t *dst, const float *src, int64_t n);
void ts_bf16_to_f32_n(float *dst, const uint16_t *src, int64_t n);
void ts_f32_to_f16_n(uint16_t *dst, const float *src, int64_t n);
void ts_f16_to_f32_n(float *dst, const uint16_t *src, int64_t n);
/* ts_f32_to_bf16_n's bits, written with streaming (non-temporal) stores where the CPU has
 * AVX-512, on the calling thread: for an output nothing reads until it has left the caches
 * anyway (a bf16 weight copy, a GELU derivative kept for the backward pass). */
void ts_f32_to_bf16_stream_n(uint16_t *dst, const float *src, int64_t n);

#endif
