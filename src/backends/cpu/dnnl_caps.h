/* dnnl_caps.h — what reduced-precision GEMMs this CPU and its oneDNN can run.
 *
 * oneDNN 2.6 implements bf16 (and f16) matmul and convolution only on AVX-512
 * CPUs (avx512_core and up); on an AVX2-only CPU creating such a primitive
 * fails with "unimplemented". Plans and tests ask here first so that they can
 * refuse (or skip) with a message naming the missing CPU feature.
 *
 *     if (!ts_cpu_supports_dtype_gemm(TS_BF16))
 *         printf("skipped: %s\n", ts_cpu_dtype_gemm_why(TS_BF16));
 *
 * The answer comes from creating one tiny matmul primitive per dtype, once
 * per process (thread-safe), and is cached.
 */
#ifndef TS_DNNL_CAPS_H
#define TS_DNNL_CAPS_H

#include "tessel/dtype.h"

/* 1 when oneDNN can create a dt x dt -> f32 matmul on this CPU (always 1 for
 * f32; 0 for a dtype that is not f32, bf16 or f16). */
int ts_cpu_supports_dtype_gemm(ts_dtype dt);

/* Why not, e.g. "needs AVX-512 (avx512_core / avx512_bf16) for bf16 matmuls; this CPU has
 * AVX2 only"; "" when ts_cpu_supports_dtype_gemm(dt) is 1. Static storage. */
const char *ts_cpu_dtype_gemm_why(ts_dtype dt);

/* The best instruction set oneDNN uses on this CPU, e.g. "AVX2" or "AVX-512 (avx512_core_bf16)". */
const char *ts_cpu_isa_name(void);

#endif
