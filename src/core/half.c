/* Array conversions between f32 and bf16 / f16 (see half.h). */
#include "half.h"

#define TS_HALF_PAR_MIN 65536

void ts_f32_to_bf16_n(uint16_t *dst, const float *src, int64_t n) {
#pragma omp parallel for simd schedule(static) if (n >= TS_HALF_PAR_MIN)
    for (int64_t i = 0; i < n; i++) dst[i] = ts_f32_to_bf16(src[i]);
}

void ts_bf16_to_f32_n(float *dst, const uint16_t *src, int64_t n) {
#pragma omp parallel for simd schedule(static) if (n >= TS_HALF_PAR_MIN)
    for (int64_t i = 0; i < n; i++) dst[i] = ts_bf16_to_f32(src[i]);
}

void ts_f32_to_f16_n(uint16_t *dst, const float *src, int64_t n) {
#pragma omp parallel for simd schedule(static) if (n >= TS_HALF_PAR_MIN)
    for (int64_t i = 0; i < n; i++) dst[i] = ts_f32_to_f16(src[i]);
}

void ts_f16_to_f32_n(float *dst, const uint16_t *src, int64_t n) {
#pragma omp parallel for simd schedule(static) if (n >= TS_HALF_PAR_MIN)
    for (int64_t i = 0; i < n; i++) dst[i] = ts_f16_to_f32(src[i]);
}
