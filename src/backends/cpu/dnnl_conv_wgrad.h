/* dnnl_conv_wgrad.h — tessel's own backward-weights kernel for channels-last
 * convolutions (stride 1, no dilation, one group), for CPUs where oneDNN has
 * no JIT kernel for that pass.
 *
 * Why: oneDNN 2.6 on an AVX2-only CPU runs the backward-weights pass of a
 * channels-last 3^3 convolution as im2col + SGEMM (`gemm:jit`), measured at
 * 24-31 GFLOP/s against 58-82 GFLOP/s for the forward pass of the same conv
 * (docs/benchmarks.md). With channels last, every kernel tap (kd, kh, kw) is
 * a small GEMM with no im2col: dW[tap][o][c] = sum over output voxels v of
 * dy[v][o] * x[v + tap - pad][c], where for one output row both operands are
 * contiguous runs of rows ([W, O] of dy, [W, C] of x). The kernel keeps a
 * 6 x 16 tile of (o, c) in AVX2 registers and streams those rows; one
 * output plane at a time, so the plane of dy and the planes of x it reads stay
 * in L2 while every tile of the thread passes over them.
 *
 * Determinism: each (tap, o, c) is summed by one thread, always in the order
 * image, output plane, row, column, with FMA; threads split the tiles, never a
 * sum, so the bits are the same for any thread count.
 *
 * Used by dnnl_conv.c only where oneDNN picked its im2col-GEMM path and the
 * CPU has AVX2 and FMA (ts_conv_wgrad_usable); elsewhere oneDNN's kernel runs. */
#ifndef TS_DNNL_CONV_WGRAD_H
#define TS_DNNL_CONV_WGRAD_H

#include <stddef.h>
#include <stdint.h>

/* A channels-last convolution seen as 3D (a 2D one has D = 1, k[0] = 1,
 * pad[0] = 0): x [N, in[0], in[1], in[2], C], dy [N, out[0..2], O],
 * dW [O, C, k[0], k[1], k[2]] (torch's layout); out = in + 2 pad - k + 1. */
typedef struct ts_wgrad_shape {
    int64_t N, C, O;
    int64_t in[3], out[3], k[3], pad[3];
} ts_wgrad_shape;

/* 1 when the CPU runs the kernel (AVX2 and FMA) and the shape is one it
 * handles (C a multiple of 8, consistent sizes). */
int ts_conv_wgrad_usable(const ts_wgrad_shape *s);

/* Scratch bytes ts_conv_wgrad needs (the tap-major accumulators). */
size_t ts_conv_wgrad_scratch(const ts_wgrad_shape *s);

/* dw = the weight gradient of x and dy (overwritten, not accumulated), using
 * `scratch` of ts_conv_wgrad_scratch bytes (64-byte aligned). Runs on the
 * current OpenMP team size. The caller checks ts_conv_wgrad_usable first. */
void ts_conv_wgrad(const ts_wgrad_shape *s, const float *x, const float *dy, float *dw,
                   float *scratch);

/* The same sums in the same order with scalar fmaf (CPUs without AVX2, and
 * the bit-exact reference of tests/unit/conv_wgrad.c); any C % 8 == 0. */
void ts_conv_wgrad_scalar(const ts_wgrad_shape *s, const float *x, const float *dy, float *dw,
                          float *scratch);

#endif
