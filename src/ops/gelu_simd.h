/* gelu_simd.h — the tanh GELU's forward with its derivative, vectorised by hand (internal to
 * unary.c):
 *
 *     int64_t done = ts_gelu_tanh_grad_simd(y, g, x, n);   // y[i] = gelu(x[i]), g[i] = gelu'(x[i])
 *     for (int64_t i = done; i < n; i++) ...                 // the rest, by the scalar code
 *
 * It computes a prefix of whole vectors (0 elements on a CPU without AVX-512) with the bits of
 * m_gelu_tanh_grad_f32, and returns its length; y may equal x. */
#ifndef TS_GELU_SIMD_H
#define TS_GELU_SIMD_H

#include <stdint.h>

/* PyTorch's tanh GELU: 0.5x(1 + tanh(u)), u = GELU_BETA (x + GELU_KAPPA x^3); the scalar code
 * (unary.c) and the vector one use these. */
#define GELU_BETA  0.797884560802865355879 /* sqrt(2/pi) */
#define GELU_KAPPA 0.044715

int64_t ts_gelu_tanh_grad_simd(float *y, float *g, const float *x, int64_t n);

#endif
