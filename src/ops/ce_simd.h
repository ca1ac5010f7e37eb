/* ce_simd.h — the exp loops of the f32 cross entropy, vectorised by hand (internal to loss.c):
 * the bits of loss.c's loops with m_exp_neg_f32, on whole vectors of 16, where the CPU has
 * AVX-512 (vexp_avx512.h); each returns how many leading elements it did (0 elsewhere), and
 * the caller does the rest as before.
 *
 *     int64_t i = ts_ce_sumexp_simd(acc, x, m, c);       // acc[j] += exp(x[i + j] - m), j < 16
 *     int64_t i = ts_ce_scaled_exp_simd(d, x, lse, sc, n); // d[i] = exp(x[i] - lse) * sc
 */
#ifndef TS_CE_SIMD_H
#define TS_CE_SIMD_H

#include <stdint.h>

/* For i in steps of 16 while i + 16 <= c: acc[j] += (double)exp(x[i + j] - m), j < 16 (the
 * interleaved f64 partial sums of lse_row, TS_LANES = 16). Returns the i it stopped at. */
int64_t ts_ce_sumexp_simd(double *acc, const float *x, float m, int64_t c);

/* d[i] = exp(x[i] - lse) * sc for i below the returned count (a multiple of 16, <= n). */
int64_t ts_ce_scaled_exp_simd(float *d, const float *x, float lse, float sc, int64_t n);

#endif
