/* dnnl_conv_winograd.h — tessel's Winograd F(2x2x2, 3x3x3) kernel for the
 * channels-last 3^3 convolution with stride 1 and padding 1 (fp32), the
 * convolution of the 3-D U-Net (W4), forward and backward data.
 *
 * Why: W4's convolutions are oneDNN's direct kernels, already near the
 * core's fp32 FMA rate; only fewer multiplies make them faster. Winograd
 * F(2,3) in three dimensions computes a 2^3 block of outputs from a 4^3
 * block of inputs with 64 multiplies per (input, output) channel pair
 * instead of 8 * 27 = 216 (3.375x fewer), at the cost of transforms:
 *   1. weights: U[p][c][o] = (G g G^T)[p] for each of the 4^3 points p
 *      (once per call: the weights change every step);
 *   2. input: each 4^3 input patch (zeros outside the volume) becomes
 *      V[p][tile][c] = (B^T d B)[p];
 *   3. 64 products M[p] = V[p] [tiles x C] . U[p] [C x O] per block of tiles,
 *      on an AVX-512 register-tiled microkernel (broadcast V, vectors of U);
 *   4. output: the 2^3 outputs of a tile are (A^T M A), stored where they
 *      fall inside the volume.
 * The block's V and M stay in L2; threads take whole blocks.
 *
 * Backward data is the same convolution of dy with the weights transposed
 * (in <-> out channels) and flipped in space: ts_wino.flip.
 *
 * Numerics: the transforms round differently from a direct sum (about 1e-6
 * relative in fp32: tests/unit/conv_winograd.c). Determinism: every output
 * is computed by one thread, always with the same operations in the same
 * order, so the bits do not depend on the thread count.
 *
 * Used by dnnl_conv.c for eligible conv and conv_bwd_data instructions on
 * CPUs with AVX-512F unless TESSEL_CONV_WINOGRAD=0; elsewhere oneDNN runs. */
#ifndef TS_DNNL_CONV_WINOGRAD_H
#define TS_DNNL_CONV_WINOGRAD_H

#include <stddef.h>
#include <stdint.h>

/* x [N, D, H, W, C] -> y [N, D, H, W, O], both channels last. With flip = 0
 * the weights are torch's conv layout w [O, C, 3, 3, 3]; with flip = 1 they
 * are [C, O, 3, 3, 3] and used transposed and flipped (backward data of a
 * forward conv whose weights they are: then C is its output channels and O
 * its input channels). Fill N..flip, then call ts_wino_init. */
typedef struct ts_wino {
    int64_t N, D, H, W, C, O;
    int flip;
    /* set by ts_wino_init */
    int64_t Op;              /* O rounded up to 16 (U's and M's row length) */
    int64_t tD, tH, tW;      /* 2^3 tiles per dimension */
    int64_t ntiles, T, nblk; /* tiles, tiles per block (a multiple of 12), blocks */
    size_t u_bytes;          /* transformed weights */
    size_t lane_bytes;       /* one thread's V and M */
} ts_wino;

/* Derives the sizes; 0 when the shape is out of range (a size or channel
 * count below 1). */
int ts_wino_init(ts_wino *s);

/* 1 when this CPU runs the kernel (AVX-512F) and TESSEL_CONV_WINOGRAD is not
 * "0". */
int ts_wino_enabled(void);

/* Scratch bytes for a run on up to `threads` OpenMP threads (64-byte
 * aligned base). */
size_t ts_wino_scratch(const ts_wino *s, int threads);

/* y = conv(x, w) (overwritten), on the current OpenMP team of at most the
 * `threads` given to ts_wino_scratch. The caller checks ts_wino_enabled. */
void ts_wino_conv(const ts_wino *s, const float *x, const float *w, float *y, void *scratch);

#endif
