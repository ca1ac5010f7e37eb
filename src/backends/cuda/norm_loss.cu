/* The CUDA backend's LayerNorm (forward and backward) and cross-entropy
 * (declared in kernels.h), with src/ops/norm.c's and src/ops/loss.c's
 * formulas; sums in double in fixed orders (no atomics: deterministic). */
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <math.h>
#include <stdint.h>

#include "backends/cuda/kernels.h"
#include "backends/cuda/launch.cuh"
#include "ops/op_ids.h"

/* ---- layer norm ------------------------------------------------------------ */

/* A row per warp (8 warps a block): the lanes stride over the row, their
 * f64 partial sums meet in a fixed butterfly, so every lane holds the same
 * total and the result does not depend on the launch shape. */
#define LN_WARPS 8

__device__ static double warp_sum_d(double v) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

static unsigned ln_blocks(int64_t rows) {
    int64_t b = (rows + LN_WARPS - 1) / LN_WARPS;
    return b > 65535 ? 65535u : (unsigned)b;
}

/* mean and variance in double, then y = (x - mean) rstd w + b. */
__global__ void k_layer_norm(float *y, float *mean, float *rstd, const float *x, const float *w,
                             const float *b, int64_t rows, int64_t d, double eps) {
    const int lane = threadIdx.x & 31;
    for (int64_t r = (int64_t)blockIdx.x * LN_WARPS + (threadIdx.x >> 5); r < rows;
         r += (int64_t)gridDim.x * LN_WARPS) {
        const float *xr = x + r * d;
        double s = 0;
        for (int64_t i = lane; i < d; i += 32) s += (double)xr[i];
        double mu = warp_sum_d(s) / (double)d;
        double v = 0;
        for (int64_t i = lane; i < d; i += 32) {
            double c = (double)xr[i] - mu;
            v += c * c;
        }
        double rs = 1.0 / sqrt(warp_sum_d(v) / (double)d + eps);
        float m = (float)mu, rf = (float)rs;
        if (lane == 0) mean[r] = m, rstd[r] = rf;
        float *yr = y + r * d;
        for (int64_t i = lane; i < d; i += 32) {
            float t = (xr[i] - m) * rf;
            if (w) t = t * w[i];
            if (b) t = t + b[i];
            yr[i] = t;
        }
    }
}

extern "C" int cu_layer_norm(float *y, float *mean, float *rstd, const float *x, const float *w,
                             const float *b, int64_t rows, int64_t d, double eps, cu_stream s) {
    if (rows <= 0) return 0;
    k_layer_norm<<<ln_blocks(rows), 32 * LN_WARPS, 0, (cudaStream_t)s>>>(y, mean, rstd, x, w, b,
                                                                         rows, d, eps);
    return launched();
}

/* dx of one row per warp: g = dy w, xh = (x - mean) rstd,
 * dx = rstd (g - mean(g) - xh mean(g xh)). dx may be dy (in place): a lane
 * writes only the elements it read, after both sums are complete. */
__global__ void k_ln_dx(float *dx, const float *dy, const float *x, const float *mean,
                        const float *rstd, const float *w, int64_t rows, int64_t d) {
    const int lane = threadIdx.x & 31;
    for (int64_t r = (int64_t)blockIdx.x * LN_WARPS + (threadIdx.x >> 5); r < rows;
         r += (int64_t)gridDim.x * LN_WARPS) {
        const float *dyr = dy + r * d, *xr = x + r * d;
        float m = mean[r], rs = rstd[r];
        double s1 = 0, s2 = 0;
        for (int64_t i = lane; i < d; i += 32) {
            float g = w ? dyr[i] * w[i] : dyr[i], xh = (xr[i] - m) * rs;
            s1 += (double)g;
            s2 += (double)(g * xh);
        }
        float mg = (float)(warp_sum_d(s1) / (double)d);
        float mgx = (float)(warp_sum_d(s2) / (double)d);
        float *dxr = dx + r * d;
        for (int64_t i = lane; i < d; i += 32) {
            float g = w ? dyr[i] * w[i] : dyr[i], xh = (xr[i] - m) * rs;
            dxr[i] = rs * (g - mg - xh * mgx);
        }
    }
}

#define LN_ROWS 32
/* Partial dw, db of row block rb (LN_ROWS rows) for column c:
 * part[rb * d + c] and part[(nrb + rb) * d + c]. */
__global__ void k_ln_dwdb_part(double *part, const float *dy, const float *x, const float *mean,
                               const float *rstd, int64_t rows, int64_t d, int64_t nrb) {
    const int64_t n = nrb * d, stride = (int64_t)gridDim.x * blockDim.x;
    for (int64_t t = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; t < n; t += stride) {
        int64_t rb = t / d, c = t % d;
        int64_t r0 = rb * LN_ROWS, r1 = r0 + LN_ROWS < rows ? r0 + LN_ROWS : rows;
        double aw = 0, ab = 0;
        for (int64_t r = r0; r < r1; r++) {
            float g = dy[r * d + c];
            aw += (double)(g * ((x[r * d + c] - mean[r]) * rstd[r]));
            ab += (double)g;
        }
        part[rb * d + c] = aw;
        part[(nrb + rb) * d + c] = ab;
    }
}

__global__ void k_ln_dwdb_sum(float *dw, float *db, const double *part, int64_t d, int64_t nrb) {
    const int64_t stride = (int64_t)gridDim.x * blockDim.x;
    for (int64_t c = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; c < d; c += stride) {
        double sw = 0, sb = 0;
        for (int64_t rb = 0; rb < nrb; rb++) {
            sw += part[rb * d + c];
            sb += part[(nrb + rb) * d + c];
        }
        if (dw) dw[c] = (float)sw;
        if (db) db[c] = (float)sb;
    }
}

extern "C" size_t cu_layer_norm_bwd_scratch(int64_t rows, int64_t d) {
    int64_t nrb = (rows + LN_ROWS - 1) / LN_ROWS;
    return (size_t)(2 * nrb * d) * sizeof(double);
}

/* dw, db are computed before dx, which may overwrite dy. */
extern "C" int cu_layer_norm_bwd(float *dx, float *dw, float *db, const float *dy, const float *x,
                                 const float *mean, const float *rstd, const float *w, int64_t rows,
                                 int64_t d, double *partial, cu_stream s) {
    if (rows <= 0) return 0;
    cudaStream_t cs = (cudaStream_t)s;
    if (dw || db) {
        int64_t nrb = (rows + LN_ROWS - 1) / LN_ROWS;
        k_ln_dwdb_part<<<grid_for(nrb * d), THREADS, 0, cs>>>(partial, dy, x, mean, rstd, rows, d,
                                                              nrb);
        k_ln_dwdb_sum<<<grid_for(d), THREADS, 0, cs>>>(dw, db, partial, d, nrb);
    }
    k_ln_dx<<<ln_blocks(rows), 32 * LN_WARPS, 0, cs>>>(dx, dy, x, mean, rstd, w, rows, d);
    return launched();
}

/* ---- cross-entropy -------------------------------------------------------- */

/* One block per row: lse = m + log(sum exp(x - m)); part[3r..3r+2] =
 * (w (lse - x_t), w, 1) for a counted row, zeros for an ignored one. */
__global__ void k_ce_rows(float *lse, const float *x, const void *tg, int tg64, const float *wt,
                          int64_t n, int64_t c, int64_t ign, double *part, int *err) {
    __shared__ double sh[THREADS];
    __shared__ float shf[THREADS];
    for (int64_t r = blockIdx.x; r < n; r += gridDim.x) {
        const float *xr = x + r * c;
        float m = -INFINITY;
        for (int64_t i = threadIdx.x; i < c; i += THREADS) m = fmaxf(m, xr[i]);
        m = cu_block_max(m, shf);
        if (m == -INFINITY) m = 0.0f;
        double s = 0;
        for (int64_t i = threadIdx.x; i < c; i += THREADS) s += (double)expf(xr[i] - m);
        double l = (double)m + log(cu_block_sum(s, sh));
        if (threadIdx.x == 0) {
            lse[r] = (float)l;
            int64_t t = index_at(tg, tg64, r);
            double a = 0, b = 0, k = 0;
            if (t != ign) {
                if (t < 0 || t >= c) {
                    *err = 1;
                } else {
                    double wv = wt ? (double)wt[t] : 1.0;
                    a = wv * (l - (double)xr[t]);
                    b = wv;
                    k = 1;
                }
            }
            part[3 * r] = a, part[3 * r + 1] = b, part[3 * r + 2] = k;
        }
    }
}

/* One block: the three sums over rows in a fixed order, then the loss
 * (NaN when every row is ignored, as torch). */
__global__ void k_ce_total(float *loss, const double *part, int64_t n) {
    __shared__ double sh[THREADS];
    double a = 0, b = 0, k = 0;
    for (int64_t r = threadIdx.x; r < n; r += THREADS)
        a += part[3 * r], b += part[3 * r + 1], k += part[3 * r + 2];
    a = cu_block_sum(a, sh);
    b = cu_block_sum(b, sh);
    k = cu_block_sum(k, sh);
    if (threadIdx.x == 0) *loss = k > 0 ? (float)(a / b) : __int_as_float(0x7fc00000);
}

extern "C" int cu_cross_entropy(float *loss, float *lse, const float *x, const void *tg, int tg64,
                                const float *wt, int64_t n, int64_t c, int64_t ign, double *part,
                                int *err, cu_stream s) {
    if (n <= 0) return 0;
    cudaStream_t cs = (cudaStream_t)s;
    k_ce_rows<<<row_blocks(n), THREADS, 0, cs>>>(lse, x, tg, tg64, wt, n, c, ign, part, err);
    k_ce_total<<<1, THREADS, 0, cs>>>(loss, part, n);
    return launched();
}

/* part[0] = the weight sum over counted rows (one block, fixed order). */
__global__ void k_ce_wsum(double *part, const void *tg, int tg64, const float *wt, int64_t n,
                          int64_t c, int64_t ign, int *err) {
    __shared__ double sh[THREADS];
    double b = 0;
    for (int64_t r = threadIdx.x; r < n; r += THREADS) {
        int64_t t = index_at(tg, tg64, r);
        if (t == ign) continue;
        if (t < 0 || t >= c) {
            *err = 1;
            continue;
        }
        b += wt ? (double)wt[t] : 1.0;
    }
    b = cu_block_sum(b, sh);
    if (threadIdx.x == 0) part[0] = b;
}

/* One block per row: dx = softmax(x) sc, minus sc at the target; dx may be
 * x (in place), so x_t is read before the row is written. */
__global__ void k_ce_bwd_rows(float *dx, const float *dl, const float *x, const float *lse,
                              const void *tg, int tg64, const float *wt, int64_t n, int64_t c,
                              int64_t ign, const double *part) {
    __shared__ float xt_sh;
    for (int64_t r = blockIdx.x; r < n; r += gridDim.x) {
        int64_t t = index_at(tg, tg64, r);
        float *dr = dx + r * c;
        const float *xr = x + r * c;
        int counted = t != ign && t >= 0 && t < c;
        if (!counted) {
            for (int64_t i = threadIdx.x; i < c; i += THREADS) dr[i] = 0.0f;
            continue; /* uniform over the block: no barrier skipped unevenly */
        }
        double wsum = part[0], sc_d = wsum != 0 ? (double)*dl / wsum : 0;
        float sc = (float)(wt ? sc_d * (double)wt[t] : sc_d), l = lse[r];
        if (threadIdx.x == 0) xt_sh = xr[t];
        __syncthreads();
        float xt = xt_sh;
        for (int64_t i = threadIdx.x; i < c; i += THREADS) dr[i] = expf(xr[i] - l) * sc;
        __syncthreads();
        if (threadIdx.x == 0) dr[t] = (expf(xt - l) - 1.0f) * sc;
        __syncthreads();
    }
}

extern "C" int cu_cross_entropy_bwd(float *dx, const float *dl, const float *x, const float *lse,
                                    const void *tg, int tg64, const float *wt, int64_t n, int64_t c,
                                    int64_t ign, double *part, int *err, cu_stream s) {
    if (n <= 0) return 0;
    cudaStream_t cs = (cudaStream_t)s;
    k_ce_wsum<<<1, THREADS, 0, cs>>>(part, tg, tg64, wt, n, c, ign, err);
    k_ce_bwd_rows<<<row_blocks(n), THREADS, 0, cs>>>(dx, dl, x, lse, tg, tg64, wt, n, c, ign, part);
    return launched();
}
