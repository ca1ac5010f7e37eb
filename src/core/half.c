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
