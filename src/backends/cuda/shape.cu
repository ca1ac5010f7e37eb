/* The CUDA backend's shape kernels (declared in kernels.h): permute, the
 * copies along an axis of slice, slice_bwd and concat, and gather. Each moves
 * contiguous runs in units of up to 16 bytes with 32-bit indices where they
 * fit; the values are copied, never computed. */
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <math.h>
#include <stdint.h>

#include "backends/cuda/kernels.h"
#include "backends/cuda/launch.cuh"
#include "ops/op_ids.h"

/* ---- permute, copies along an axis -------------------------------------- */

/* In units U (below): output dims, the x stride of each; rank >= 1. */
typedef struct perm_shape {
    int rank;
    int64_t odim[CU_MAX_RANK], xstr[CU_MAX_RANK];
    int64_t n;
} perm_shape;

template <typename U, typename Idx>
__global__ void k_permute(U *y, const U *x, const perm_shape S) {
    const Idx n = (Idx)S.n, stride = (Idx)gridDim.x * blockDim.x;
    for (Idx i = (Idx)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
        Idx off = 0, rem = i;
        for (int d = S.rank - 1; d >= 0; d--) {
            const Idx dim = (Idx)S.odim[d];
            off += (rem % dim) * (Idx)S.xstr[d];
            rem /= dim;
        }
        y[i] = x[off];
    }
}

template <typename U, typename Idx>
static void launch_permute(void *y, const void *x, const perm_shape &S, cudaStream_t cs) {
    k_permute<U, Idx><<<grid_fill(S.n), THREADS, 0, cs>>>((U *)y, (const U *)x, S);
}

/* The shape is simplified first: size-1 dims dropped, and neighbouring
 * output dims that are neighbours in x too (x stride of the outer = inner's
 * stride times its size) merged into one. When the last dim then has x
 * stride 1 (the innermost dims keep their order, as GPT's [B, T, H, hd] ->
 * [B, H, T, hd]), each output row of it is a contiguous run of x: it is
 * moved in the widest unit (up to 16 bytes) that divides the run's bytes
 * and both addresses. The run is x's trailing dims, so every other x stride
 * is a multiple of the run and converts to units exactly. Otherwise (the
 * innermost dim moves) one element at a time. */
extern "C" int cu_permute(void *y, const void *x, int esize, int rank, const int64_t *xdims,
                          const int64_t *perm, cu_stream s) {
    int64_t xs[CU_MAX_RANK], st = 1;
    for (int d = rank - 1; d >= 0; d--) xs[d] = st, st *= xdims[d];
    if (st <= 0) return 0;
    perm_shape S;
    int r = 0;
    for (int d = 0; d < rank; d++) {
        const int64_t dim = xdims[perm[d]], str = xs[perm[d]];
        if (dim == 1) continue;
        if (r > 0 && S.xstr[r - 1] == str * dim) {
            S.odim[r - 1] *= dim, S.xstr[r - 1] = str;
        } else {
            S.odim[r] = dim, S.xstr[r] = str, r++;
        }
    }
    if (r == 0) S.odim[0] = 1, S.xstr[0] = 1, r = 1;
    S.rank = r;
    int unit = esize;
    if (S.xstr[r - 1] == 1) {
        const uint64_t v[3] = {(uint64_t)(uintptr_t)y, (uint64_t)(uintptr_t)x,
                               (uint64_t)(S.odim[r - 1] * esize)};
        unit = unit_of(v, 3);
        S.odim[r - 1] = S.odim[r - 1] * esize / unit;
        for (int d = 0; d < r - 1; d++) S.xstr[d] = S.xstr[d] * esize / unit;
    } else if (esize != 1 && esize != 2 && esize != 4 && esize != 8) {
        return (int)cudaErrorInvalidValue;
    }
    S.n = st * esize / unit;
    const int small = S.n <= INT32_MAX;
    UNIT_DISPATCH(launch_permute, unit, small, y, x, S, (cudaStream_t)s);
    return launched();
}

/* For b < rows: y[b * ystride + yoff + k] = x[b * xstride + xoff + k],
 * k < row (in units): copy_axis's [len, inner] block is contiguous in both
 * tensors, so each b is one run. */
template <typename U, typename Idx>
__global__ void k_copy_rows(U *y, int64_t ystride, int64_t yoff, const U *x, int64_t xstride,
                            int64_t xoff, int64_t row, int64_t rows) {
    const Idx n = (Idx)(rows * row), rl = (Idx)row, ys = (Idx)ystride, yo = (Idx)yoff,
              xst = (Idx)xstride, xo = (Idx)xoff, stride = (Idx)gridDim.x * blockDim.x;
    for (Idx i = (Idx)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
        const Idx b = i / rl, k = i - b * rl;
        y[b * ys + yo + k] = x[b * xst + xo + k];
    }
}

template <typename U, typename Idx>
static void launch_copy_rows(void *y, int64_t ystride, int64_t yoff, const void *x, int64_t xstride,
                             int64_t xoff, int64_t row, int64_t rows, cudaStream_t cs) {
    k_copy_rows<U, Idx><<<grid_fill(rows * row), THREADS, 0, cs>>>(
        (U *)y, ystride, yoff, (const U *)x, xstride, xoff, row, rows);
}

/* y[b, dst_start + j, k] = x[b, src_start + j, k] for b < outer, j < len,
 * k < inner: outer runs of len * inner elements, moved in the widest unit
 * (up to 16 bytes) dividing both addresses and every run length, stride
 * and start in bytes; 32-bit indices when both tensors are below 2^31
 * units. */
extern "C" int cu_copy_axis(void *y, int64_t dst_len, int64_t dst_start, const void *x,
                            int64_t src_len, int64_t src_start, int64_t len, int64_t outer,
                            int64_t inner, int esize, cu_stream s) {
    if (outer * len * inner <= 0) return 0;
    const int64_t rb = len * inner * esize, ysb = dst_len * inner * esize,
                  yob = dst_start * inner * esize, xsb = src_len * inner * esize,
                  xob = src_start * inner * esize;
    const uint64_t v[7] = {(uint64_t)(uintptr_t)y, (uint64_t)(uintptr_t)x, (uint64_t)rb,
                           (uint64_t)ysb,          (uint64_t)yob,          (uint64_t)xsb,
                           (uint64_t)xob};
    const int unit = unit_of(v, 7);
    const int64_t ys = ysb / unit, xs = xsb / unit;
    const int small = outer * (ys > xs ? ys : xs) <= INT32_MAX;
    UNIT_DISPATCH(launch_copy_rows, unit, small, y, ys, yob / unit, x, xs, xob / unit, rb / unit,
                  outer, (cudaStream_t)s);
    return launched();
}

extern "C" int cu_zero(void *y, size_t bytes, cu_stream s) {
    return (int)cudaMemsetAsync(y, 0, bytes, (cudaStream_t)s);
}

/* ---- gather ---------------------------------------------------------------- */

/* y [outer, nidx, inner] from x [outer, extent, inner], inner in units
 * (a unit never spans two rows: it divides the row's bytes). */
template <typename U, typename Idx>
__global__ void k_gather(U *y, const U *x, const void *idx, int idx64, int64_t nidx, int64_t outer,
                         int64_t extent, int64_t inner, int *err) {
    const Idx n = (Idx)(outer * nidx * inner), in = (Idx)inner, ni = (Idx)nidx, ex = (Idx)extent,
              stride = (Idx)gridDim.x * blockDim.x;
    for (Idx i = (Idx)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
        const Idx t = i / in, k = i - t * in, j = t % ni, b = t / ni;
        const int64_t r = index_at(idx, idx64, (int64_t)j);
        if (r < 0 || r >= extent) {
            y[i] = U{};
            *err = 1;
        } else {
            y[i] = x[(b * ex + (Idx)r) * in + k];
        }
    }
}

template <typename U, typename Idx>
static void launch_gather(void *y, const void *x, const void *idx, int idx64, int64_t nidx,
                          int64_t outer, int64_t extent, int64_t inner, int *err, cudaStream_t cs) {
    k_gather<U, Idx><<<grid_fill(outer * nidx * inner), THREADS, 0, cs>>>(
        (U *)y, (const U *)x, idx, idx64, nidx, outer, extent, inner, err);
}

/* Rows of inner elements moved in the widest unit (up to 16 bytes) dividing
 * the row's bytes and both addresses; 32-bit indices when x and y are below
 * 2^31 units. */
extern "C" int cu_gather(void *y, const void *x, const void *idx, int idx64, int64_t nidx,
                         int64_t outer, int64_t extent, int64_t inner, int esize, int *err,
                         cu_stream s) {
    if (outer * nidx * inner <= 0) return 0;
    const int64_t rowb = inner * esize;
    const uint64_t v[3] = {(uint64_t)(uintptr_t)y, (uint64_t)(uintptr_t)x, (uint64_t)rowb};
    const int unit = unit_of(v, 3);
    const int64_t in_u = rowb / unit, rows = outer * (nidx > extent ? nidx : extent);
    const int small = rows * in_u <= INT32_MAX;
    UNIT_DISPATCH(launch_gather, unit, small, y, x, idx, idx64, nidx, outer, extent, in_u, err,
                  (cudaStream_t)s);
    return launched();
}
