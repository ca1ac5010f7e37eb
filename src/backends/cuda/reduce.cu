/* The CUDA backend's reductions (declared in kernels.h): reduce_sum, the
 * column sums of bias gradients, and the gradient monitors' statistics, all
 * in double in an order fixed by the shapes (no atomics: deterministic). */
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <math.h>
#include <stdint.h>

#include "backends/cuda/kernels.h"
#include "backends/cuda/launch.cuh"
#include "ops/op_ids.h"

/* ---- reduce_sum ---------------------------------------------------------- */

typedef struct red_shape {
    int nk, nr;                                   /* kept and reduced axes */
    int64_t kdim[CU_MAX_RANK], kstr[CU_MAX_RANK]; /* sizes and x strides */
    int64_t rdim[CU_MAX_RANK], rstr[CU_MAX_RANK];
    int64_t nout, nred;
} red_shape;

/* One block per output element o (grid-stride over outputs); its threads
 * stride over the nred reduced elements, then one fixed tree. */
__global__ void k_reduce_sum(float *y, const float *x, const red_shape S, double scale) {
    __shared__ double sh[THREADS];
    for (int64_t o = blockIdx.x; o < S.nout; o += gridDim.x) {
        int64_t base = 0, rem = o;
        for (int d = S.nk - 1; d >= 0; d--) {
            base += (rem % S.kdim[d]) * S.kstr[d];
            rem /= S.kdim[d];
        }
        double acc = 0;
        for (int64_t r = threadIdx.x; r < S.nred; r += THREADS) {
            int64_t off = base, rr = r;
            for (int d = S.nr - 1; d >= 0; d--) {
                off += (rr % S.rdim[d]) * S.rstr[d];
                rr /= S.rdim[d];
            }
            acc += (double)x[off];
        }
        double t = cu_block_sum(acc, sh);
        if (threadIdx.x == 0) y[o] = (float)(t * scale);
    }
}

extern "C" int cu_reduce_sum(float *y, const float *x, int rank, const int64_t *dims, int64_t axes,
                             double scale, cu_stream s) {
    red_shape S;
    S.nk = S.nr = 0;
    S.nout = S.nred = 1;
    int64_t str = 1, kstr[CU_MAX_RANK], kdim[CU_MAX_RANK], rstr[CU_MAX_RANK], rdim[CU_MAX_RANK];
    int nk = 0, nr = 0;
    /* collected from the last axis back, then reversed into row-major order */
    for (int d = rank - 1; d >= 0; d--) {
        if (axes >> d & 1) {
            rdim[nr] = dims[d], rstr[nr++] = str;
            S.nred *= dims[d];
        } else {
            kdim[nk] = dims[d], kstr[nk++] = str;
            S.nout *= dims[d];
        }
        str *= dims[d];
    }
    for (int j = 0; j < nk; j++) S.kdim[j] = kdim[nk - 1 - j], S.kstr[j] = kstr[nk - 1 - j];
    for (int j = 0; j < nr; j++) S.rdim[j] = rdim[nr - 1 - j], S.rstr[j] = rstr[nr - 1 - j];
    S.nk = nk, S.nr = nr;
    if (S.nout <= 0) return 0;
    k_reduce_sum<<<row_blocks(S.nout), THREADS, 0, (cudaStream_t)s>>>(y, x, S, scale);
    return launched();
}

#define COL_ROWS 64
/* part[rb * cols + c] = the sum of column c over rows [rb * COL_ROWS, ...):
 * neighbouring threads read neighbouring columns (coalesced). */
__global__ void k_col_part(double *part, const float *x, int64_t rows, int64_t cols, int64_t nrb) {
    const int64_t n = nrb * cols, stride = (int64_t)gridDim.x * blockDim.x;
    for (int64_t t = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; t < n; t += stride) {
        int64_t rb = t / cols, c = t % cols;
        int64_t r0 = rb * COL_ROWS, r1 = r0 + COL_ROWS < rows ? r0 + COL_ROWS : rows;
        double a = 0;
        for (int64_t r = r0; r < r1; r++) a += (double)x[r * cols + c];
        part[t] = a;
    }
}

__global__ void k_col_total(float *y, const double *part, int64_t cols, int64_t nrb, double scale) {
    const int64_t stride = (int64_t)gridDim.x * blockDim.x;
    for (int64_t c = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; c < cols; c += stride) {
        double a = 0;
        for (int64_t rb = 0; rb < nrb; rb++) a += part[rb * cols + c];
        y[c] = (float)(a * scale);
    }
}

extern "C" size_t cu_col_sum_scratch(int64_t rows, int64_t cols) {
    return (size_t)(((rows + COL_ROWS - 1) / COL_ROWS) * cols) * sizeof(double);
}

extern "C" int cu_col_sum(float *y, const float *x, int64_t rows, int64_t cols, double scale,
                          double *part, cu_stream s) {
    if (cols <= 0) return 0;
    cudaStream_t cs = (cudaStream_t)s;
    int64_t nrb = (rows + COL_ROWS - 1) / COL_ROWS;
    if (nrb > 0) k_col_part<<<grid_for(nrb * cols), THREADS, 0, cs>>>(part, x, rows, cols, nrb);
    k_col_total<<<grid_for(cols), THREADS, 0, cs>>>(y, part, cols, nrb, scale);
    return launched();
}

/* ---- gradient monitor ------------------------------------------------------ */

/* Block b sums the fixed chunk [b * chunk, (b + 1) * chunk) of x. */
__global__ void k_stats_part(double *part, const float *x, int64_t n, int64_t chunk) {
    __shared__ double sh[THREADS];
    const int64_t lo = (int64_t)blockIdx.x * chunk, hi = lo + chunk < n ? lo + chunk : n;
    double sq = 0, sm = 0, bad = 0;
    for (int64_t i = lo + threadIdx.x; i < hi; i += THREADS) {
        double v = (double)x[i];
        sq += v * v;
        sm += v;
        bad += isfinite(x[i]) ? 0.0 : 1.0;
    }
    sq = cu_block_sum(sq, sh);
    sm = cu_block_sum(sm, sh);
    bad = cu_block_sum(bad, sh);
    if (threadIdx.x == 0)
        part[3 * blockIdx.x] = sq, part[3 * blockIdx.x + 1] = sm, part[3 * blockIdx.x + 2] = bad;
}

__global__ void k_stats_total(double *out, const double *part, int nb, int64_t n) {
    if (threadIdx.x != 0 || blockIdx.x != 0) return;
    double sq = 0, sm = 0, bad = 0;
    for (int b = 0; b < nb; b++) sq += part[3 * b], sm += part[3 * b + 1], bad += part[3 * b + 2];
    out[0] = sq, out[1] = sm, out[2] = bad, out[3] = (double)n;
}

extern "C" int cu_grad_stats(double *out, const float *x, int64_t n, double *part, cu_stream s) {
    cudaStream_t cs = (cudaStream_t)s;
    int64_t chunk = (n + CU_STATS_BLOCKS - 1) / CU_STATS_BLOCKS;
    if (chunk < THREADS) chunk = THREADS;
    int nb = n > 0 ? (int)((n + chunk - 1) / chunk) : 0;
    if (nb > 0) k_stats_part<<<(unsigned)nb, THREADS, 0, cs>>>(part, x, n, chunk);
    k_stats_total<<<1, 1, 0, cs>>>(out, part, nb, n);
    return launched();
}
