/* Array conversions between f32 and bf16 / f16 (see half.h).
 *
 * Each conversion runs in chunks through a function compiled for AVX-512,
 * AVX2 and the baseline (target_clones, as ops/kern.h's TS_CLONES; core
 * does not include ops): compiled once for the baseline, the f32 -> bf16
 * rounding ran 4 lanes wide, and bf16 plans round every GEMM operand and
 * the outputs of the kernels writing bf16 (a GELU's, a layer norm's)
 * through it. The same scalar rounding in every variant: the same bits. An x86-64-v4 variant
 * too (AVX-512 with BW, on every AVX-512 CPU since Skylake-SP): GCC vectorises loops that
 * store or load 16-bit elements 64 bytes wide only with BW, 32 bytes wide with AVX-512F
 * alone (W3 bf16's GELU result and derivative: 0.23 -> 0.09 ns an element for both). */
#include "half.h"

#if defined(__x86_64__) && !defined(__SANITIZE_ADDRESS__) && !defined(__clang__)
#define HALF_CLONES __attribute__((target_clones("arch=x86-64-v4", "avx512f", "avx2", "default")))
#elif defined(__x86_64__) && !defined(__SANITIZE_ADDRESS__) /* clang: GCC's arch names only */
#define HALF_CLONES __attribute__((target_clones("avx512f", "avx2", "default")))
#else
#define HALF_CLONES
#endif

#define TS_HALF_PAR_MIN 65536 /* below: one thread */
#define HALF_CHUNK      16384 /* elements per parallel work item */

#define DEF_CONVERT(NAME, TD, TS, CONV)                                                            \
    HALF_CLONES static void NAME##_run(TD *dst, const TS *src, int64_t n) {                        \
        _Pragma("omp simd") for (int64_t i = 0; i < n; i++) dst[i] = CONV(src[i]);                 \
    }                                                                                              \
    void NAME(TD *dst, const TS *src, int64_t n) {                                                 \
        if (n < TS_HALF_PAR_MIN) {                                                                 \
            NAME##_run(dst, src, n);                                                               \
            return;                                                                                \
        }                                                                                          \
        const int64_t nch = (n + HALF_CHUNK - 1) / HALF_CHUNK;                                     \
        _Pragma("omp parallel for schedule(static)") for (int64_t c = 0; c < nch; c++) {           \
            const int64_t s = c * HALF_CHUNK;                                                      \
            NAME##_run(dst + s, src + s, n - s < HALF_CHUNK ? n - s : HALF_CHUNK);                 \
        }                                                                                          \
    }

DEF_CONVERT(ts_f32_to_bf16_n, uint16_t, float, ts_f32_to_bf16)
DEF_CONVERT(ts_bf16_to_f32_n, float, uint16_t, ts_bf16_to_f32)
DEF_CONVERT(ts_f32_to_f16_n, uint16_t, float, ts_f32_to_f16)
DEF_CONVERT(ts_f16_to_f32_n, float, uint16_t, ts_f16_to_f32)

/* The same rounding as ts_f32_to_bf16, 16 lanes at a time, written with streaming stores: their
 * lines are not fetched first (the read-for-ownership of a plain store) and do not displace what
 * the caches hold. From dst + i 32-byte aligned on; the rest through the plain conversion. */
#if defined(__x86_64__)
#include <immintrin.h>
__attribute__((target("avx512f"))) static int64_t bf16_stream(uint16_t *d, const float *p,
                                                              int64_t n) {
    int64_t i = 0;
    for (; i < n && (uintptr_t)(d + i) % 32; i++) d[i] = ts_f32_to_bf16(p[i]);
    const __m512i absm = _mm512_set1_epi32(0x7fffffff), inf = _mm512_set1_epi32(0x7f800000);
    const __m512i bias = _mm512_set1_epi32(0x7fff), one = _mm512_set1_epi32(1),
                  quiet = _mm512_set1_epi32(0x40);
    for (; i + 16 <= n; i += 16) {
        const __m512i u = _mm512_castps_si512(_mm512_loadu_ps(p + i));
        const __m512i hi = _mm512_srli_epi32(u, 16);
        const __mmask16 nan = _mm512_cmpgt_epu32_mask(_mm512_and_si512(u, absm), inf);
        const __m512i r = _mm512_srli_epi32(
            _mm512_add_epi32(u, _mm512_add_epi32(bias, _mm512_and_si512(hi, one))), 16);
        const __m512i v = _mm512_mask_blend_epi32(nan, r, _mm512_or_si512(hi, quiet));
        _mm256_stream_si256((__m256i *)(d + i), _mm512_cvtepi32_epi16(v));
    }
    _mm_sfence(); /* the streamed lines reach memory before any later store is seen */
    return i;
}
#endif

void ts_f32_to_bf16_stream_n(uint16_t *dst, const float *src, int64_t n) {
    int64_t done = 0;
#if defined(__x86_64__)
    if (__builtin_cpu_supports("avx512f")) done = bf16_stream(dst, src, n);
#endif
    ts_f32_to_bf16_n(dst + done, src + done, n - done);
}
