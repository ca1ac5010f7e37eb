/* Fused scaled dot-product attention on the GPU, forward and backward,
 * flash-style: no T x T matrix is stored (the same contract as
 * src/ops/attention_fused.c):
 *
 *     o = softmax(scale q k^T [+ causal mask]) v,  q k v o [BH, T, hd],
 *     lse = m + log(l) [BH, T]
 *     backward: p = exp(scale q k^T - lse), D = rowsum(do o),
 *               dq_i = scale sum_j p_ij (do_i.v_j - D_i) k_j
 *               dk_j = scale sum_i p_ij (do_i.v_j - D_i) q_i,  dv_j = sum_i p_ij do_i
 *
 * One warp per row: a query row (forward, dq) or a key row (dk, dv); each
 * lane holds hd / 32 elements of the row, the dot products are reduced to
 * lane 0 in a fixed order and broadcast, and the row's sums run over the
 * keys (or queries) in increasing order. Every output row is written by one
 * warp, so there are no atomics and the result is deterministic. Simple
 * rather than fast: no shared-memory tiling and no tensor cores (see
 * docs/cuda.md). */
#include <cuda_runtime.h>
#include <math.h>
#include <stdint.h>

#include "backends/cuda/kernels.h"

#define WARPS  4 /* warps (rows) per block */
#define MAX_PL 8 /* hd <= 32 * MAX_PL */

/* The sum over the warp of v, the same value in every lane. */
__device__ static float warp_dot(float v) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_down_sync(0xffffffffu, v, o);
    return __shfl_sync(0xffffffffu, v, 0);
}

/* Load row r (hd elements) into per-lane registers: element lane + 32 c. */
__device__ static void load_row(float *dst, const float *row, int64_t hd, int lane) {
    for (int c = 0; c < MAX_PL; c++) {
        int64_t e = lane + 32 * c;
        dst[c] = e < hd ? row[e] : 0.0f;
    }
}

__device__ static float dot_row(const float *reg, const float *row, int64_t hd, int lane) {
    float s = 0.0f;
    for (int c = 0; c < MAX_PL; c++) {
        int64_t e = lane + 32 * c;
        if (e < hd) s += reg[c] * row[e];
    }
    return warp_dot(s);
}

__global__ void k_attn_fwd(float *o, float *lse, const float *q, const float *k, const float *v,
                           int64_t bh, int64_t t, int64_t hd, int causal, float scale) {
    const int lane = threadIdx.x & 31;
    const int64_t rows = bh * t, wstride = (int64_t)gridDim.x * WARPS;
    for (int64_t row = (int64_t)blockIdx.x * WARPS + (threadIdx.x >> 5); row < rows;
         row += wstride) {
        const int64_t b = row / t, i = row % t;
        const float *kb = k + b * t * hd, *vb = v + b * t * hd;
        float qr[MAX_PL], acc[MAX_PL];
        load_row(qr, q + row * hd, hd, lane);
        for (int c = 0; c < MAX_PL; c++) acc[c] = 0.0f;
        float m = -INFINITY, l = 0.0f;
        const int64_t jend = causal ? i + 1 : t;
        for (int64_t j = 0; j < jend; j++) {
            float sc = dot_row(qr, kb + j * hd, hd, lane) * scale;
            float mn = fmaxf(m, sc);
            float corr = expf(m - mn), p = expf(sc - mn);
            l = l * corr + p;
            for (int c = 0; c < MAX_PL; c++) {
                int64_t e = lane + 32 * c;
                acc[c] = acc[c] * corr + (e < hd ? p * vb[j * hd + e] : 0.0f);
            }
            m = mn;
        }
        float inv = 1.0f / l;
        for (int c = 0; c < MAX_PL; c++) {
            int64_t e = lane + 32 * c;
            if (e < hd) o[row * hd + e] = acc[c] * inv;
        }
        if (lane == 0) lse[row] = m + logf(l);
    }
}

extern "C" int cu_attention(float *o, float *lse, const float *q, const float *k, const float *v,
                            int64_t bh, int64_t t, int64_t hd, int causal, float scale,
                            cu_stream s) {
    int64_t rows = bh * t;
    if (rows <= 0) return 0;
    if (hd > 32 * MAX_PL) return (int)cudaErrorInvalidValue;
    int64_t blocks = (rows + WARPS - 1) / WARPS;
    if (blocks > 65535) blocks = 65535;
    k_attn_fwd<<<(unsigned)blocks, 32 * WARPS, 0, (cudaStream_t)s>>>(o, lse, q, k, v, bh, t, hd,
                                                                     causal, scale);
    return (int)cudaGetLastError();
}

/* delta[row] = sum(do o) over the row. */
__global__ void k_attn_delta(float *delta, const float *dout, const float *o, int64_t rows,
                             int64_t hd) {
    const int lane = threadIdx.x & 31;
    const int64_t wstride = (int64_t)gridDim.x * WARPS;
    for (int64_t row = (int64_t)blockIdx.x * WARPS + (threadIdx.x >> 5); row < rows;
         row += wstride) {
        float reg[MAX_PL];
        load_row(reg, dout + row * hd, hd, lane);
        float d = dot_row(reg, o + row * hd, hd, lane);
        if (lane == 0) delta[row] = d;
    }
}

/* dq of one query row per warp, keys in increasing order. */
__global__ void k_attn_dq(float *dq, const float *dout, const float *q, const float *k,
                          const float *v, const float *lse, const float *delta, int64_t bh,
                          int64_t t, int64_t hd, int causal, float scale) {
    const int lane = threadIdx.x & 31;
    const int64_t rows = bh * t, wstride = (int64_t)gridDim.x * WARPS;
    for (int64_t row = (int64_t)blockIdx.x * WARPS + (threadIdx.x >> 5); row < rows;
         row += wstride) {
        const int64_t b = row / t, i = row % t;
        const float *kb = k + b * t * hd, *vb = v + b * t * hd;
        float qr[MAX_PL], dor[MAX_PL], acc[MAX_PL];
        load_row(qr, q + row * hd, hd, lane);
        load_row(dor, dout + row * hd, hd, lane);
        for (int c = 0; c < MAX_PL; c++) acc[c] = 0.0f;
        const float li = lse[row], di = delta[row];
        const int64_t jend = causal ? i + 1 : t;
        for (int64_t j = 0; j < jend; j++) {
            float p = expf(dot_row(qr, kb + j * hd, hd, lane) * scale - li);
            float ds = scale * p * (dot_row(dor, vb + j * hd, hd, lane) - di);
            for (int c = 0; c < MAX_PL; c++) {
                int64_t e = lane + 32 * c;
                if (e < hd) acc[c] += ds * kb[j * hd + e];
            }
        }
        for (int c = 0; c < MAX_PL; c++) {
            int64_t e = lane + 32 * c;
            if (e < hd) dq[row * hd + e] = acc[c];
        }
    }
}

/* dk and dv of one key row per warp, queries in increasing order. */
__global__ void k_attn_dkdv(float *dk, float *dv, const float *dout, const float *q, const float *k,
                            const float *v, const float *lse, const float *delta, int64_t bh,
                            int64_t t, int64_t hd, int causal, float scale) {
    const int lane = threadIdx.x & 31;
    const int64_t rows = bh * t, wstride = (int64_t)gridDim.x * WARPS;
    for (int64_t row = (int64_t)blockIdx.x * WARPS + (threadIdx.x >> 5); row < rows;
         row += wstride) {
        const int64_t b = row / t, j = row % t;
        const float *qb = q + b * t * hd, *db = dout + b * t * hd;
        const float *lb = lse + b * t, *deb = delta + b * t;
        float kr[MAX_PL], vr[MAX_PL], ak[MAX_PL], av[MAX_PL];
        load_row(kr, k + row * hd, hd, lane);
        load_row(vr, v + row * hd, hd, lane);
        for (int c = 0; c < MAX_PL; c++) ak[c] = av[c] = 0.0f;
        for (int64_t i = causal ? j : 0; i < t; i++) {
            float p = expf(dot_row(kr, qb + i * hd, hd, lane) * scale - lb[i]);
            float ds = scale * p * (dot_row(vr, db + i * hd, hd, lane) - deb[i]);
            for (int c = 0; c < MAX_PL; c++) {
                int64_t e = lane + 32 * c;
                if (e < hd) {
                    ak[c] += ds * qb[i * hd + e];
                    av[c] += p * db[i * hd + e];
                }
            }
        }
        for (int c = 0; c < MAX_PL; c++) {
            int64_t e = lane + 32 * c;
            if (e < hd) dk[row * hd + e] = ak[c], dv[row * hd + e] = av[c];
        }
    }
}

extern "C" int cu_attention_bwd(float *dq, float *dk, float *dv, const float *dout, const float *q,
                                const float *k, const float *v, const float *o, const float *lse,
                                float *delta, int64_t bh, int64_t t, int64_t hd, int causal,
                                float scale, cu_stream s) {
    int64_t rows = bh * t;
    if (rows <= 0) return 0;
    if (hd > 32 * MAX_PL) return (int)cudaErrorInvalidValue;
    int64_t blocks = (rows + WARPS - 1) / WARPS;
    if (blocks > 65535) blocks = 65535;
    cudaStream_t cs = (cudaStream_t)s;
    k_attn_delta<<<(unsigned)blocks, 32 * WARPS, 0, cs>>>(delta, dout, o, rows, hd);
    k_attn_dq<<<(unsigned)blocks, 32 * WARPS, 0, cs>>>(dq, dout, q, k, v, lse, delta, bh, t, hd,
                                                       causal, scale);
    k_attn_dkdv<<<(unsigned)blocks, 32 * WARPS, 0, cs>>>(dk, dv, dout, q, k, v, lse, delta, bh, t,
                                                         hd, causal, scale);
    return (int)cudaGetLastError();
}
