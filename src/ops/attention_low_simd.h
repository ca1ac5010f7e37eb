/* attention_low_simd.h — what the AVX512-BF16 kernels of the fused attention's bf16 products
 * share (internal to attention_low.c and attention_softmax_low.c):
 *
 *     #if TS_ATTN_BF16_SIMD
 *     if (ts_attn_has_bf16()) ...                  // the CPU runs vdpbf16ps / vcvtne2ps2bf16
 *     BF16_TARGET static void f(...) { ... ts_attn_zip_pairs(a, b) ... }
 *     #endif
 */
#ifndef TS_ATTENTION_LOW_SIMD_H
#define TS_ATTENTION_LOW_SIMD_H

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define TS_ATTN_BF16_SIMD 1
#include <immintrin.h>
#define BF16_TARGET __attribute__((target("avx512f,avx512bw,avx512vl,avx512bf16")))

/* AVX512-BF16 on this CPU. */
static inline int ts_attn_has_bf16(void) {
    return __builtin_cpu_supports("avx512bf16");
}

/* 16 words: lane t holds a[t]'s bf16 (round to nearest even) in its lower half, b[t]'s in its
 * upper: two rows paired along the reduction axis, one conversion and one permute. */
static inline __attribute__((always_inline)) BF16_TARGET __m512i ts_attn_zip_pairs(__m512 a,
                                                                                   __m512 b) {
    const __m512i zip = _mm512_set_epi16(31, 15, 30, 14, 29, 13, 28, 12, 27, 11, 26, 10, 25, 9, 24,
                                         8, 23, 7, 22, 6, 21, 5, 20, 4, 19, 3, 18, 2, 17, 1, 16, 0);
    return _mm512_permutexvar_epi16(zip, (__m512i)_mm512_cvtne2ps_pbh(b, a));
}
#else
#define TS_ATTN_BF16_SIMD 0
#endif

#endif
