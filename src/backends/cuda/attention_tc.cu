/* Flash attention on tensor cores for bf16 plans (head size 64), forward
 * and backward, deterministic (no atomics); the f32 kernels in attention.cu
 * serve f32 plans and other head sizes.
 *
 *     o = softmax(scale q k^T [+ causal mask]) v,  q k v o [BH, T, 64] f32,
 *     lse = m + log(l) [BH, T]
 *
 * Precision: the bf16 plan's contract (docs/precision.md): q, k, v, dO are
 * rounded to bf16 as they are loaded, the products run on bf16 tensor cores
 * (WMMA 16x16x16) with f32 accumulation, the probabilities are rounded to
 * bf16 for p.v and dS to bf16 for dS.k and dS^T.q (as FlashAttention-2 and
 * the CPU's bf16 attention do); softmax statistics, lse, delta and every
 * output stay f32.
 *
 * Tiles: a block of 4 warps owns 64 rows (queries in the forward and dq,
 * keys in dk/dv), 16 per warp, and walks the other side in tiles of 64.
 * Tiles are staged in shared memory as bf16 (rows padded to 72 elements
 * against bank conflicts); a warp's scores go through shared memory (f32)
 * because the WMMA fragment's element layout is opaque: there each lane
 * owns half a row (32 columns) for the softmax arithmetic. The forward's
 * running output lives in shared memory too, so the per-row rescale is
 * plain arithmetic; dk, dv and dq accumulate in fragments across tiles.
 * dq is its own kernel (recomputing p) so every output row has one writer. */
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <math.h>
#include <mma.h>
#include <stdint.h>

#include "backends/cuda/kernels.h"

using namespace nvcuda;

#define HD   CU_ATTN_TC_HD /* head size of these kernels */
#define TILE 64            /* rows per block and columns per step */
#define LDB  (HD + 8)      /* bf16 tile row stride (elements) */
#define LDF  (TILE + 4)    /* f32 score row stride (elements) */
#define NT   128           /* threads: 4 warps */

typedef __nv_bfloat16 bf16;
typedef wmma::fragment<wmma::matrix_a, 16, 16, 16, bf16, wmma::row_major> frag_a;
typedef wmma::fragment<wmma::matrix_b, 16, 16, 16, bf16, wmma::row_major> frag_b_row;
typedef wmma::fragment<wmma::matrix_b, 16, 16, 16, bf16, wmma::col_major> frag_b_col;
typedef wmma::fragment<wmma::accumulator, 16, 16, 16, float> frag_c;

/* Where head bh's rows start: in q (and dq; k, v and dk, dv at their own bases), and in o
 * and do (cu_attn_geom: the split [B, H, T, 64] or the packed qkv [B, T, 3, H, 64]). */
__device__ static int64_t in_off(const cu_attn_geom &G, int64_t bh) {
    return bh / G.H * G.sb_in + bh % G.H * G.sh_in;
}
__device__ static int64_t out_off(const cu_attn_geom &G, int64_t bh) {
    return bh / G.H * G.sb_out + bh % G.H * G.sh_out;
}

/* Rows [r0, r0 + 64) (ld apart) of an f32 matrix into a bf16 tile; rows past t are zero. */
__device__ static void load_tile(bf16 *dst, const float *src, int64_t r0, int64_t t, int64_t ld) {
    for (int idx = threadIdx.x; idx < TILE * HD / 4; idx += NT) {
        int r = idx / (HD / 4), c = 4 * (idx % (HD / 4));
        float4 v = make_float4(0.f, 0.f, 0.f, 0.f);
        if (r0 + r < t) v = *(const float4 *)(src + (r0 + r) * ld + c);
        __nv_bfloat162 *d = (__nv_bfloat162 *)(dst + r * LDB + c);
        d[0] = __floats2bfloat162_rn(v.x, v.y);
        d[1] = __floats2bfloat162_rn(v.z, v.w);
    }
}

/* out (16 x 64, f32, stride LDF) = a (16 x 64 rows of A, stride LDB) times
 * B^T, B's 64 rows of 64 at b (stride LDB): scores of 16 rows against 64. */
__device__ static void rows_times_bt(float *out, const bf16 *a, const bf16 *b) {
    for (int n = 0; n < 4; n++) {
        frag_c acc;
        wmma::fill_fragment(acc, 0.0f);
        for (int kk = 0; kk < 4; kk++) {
            frag_a fa;
            frag_b_col fb;
            wmma::load_matrix_sync(fa, a + kk * 16, LDB);
            wmma::load_matrix_sync(fb, b + n * 16 * LDB + kk * 16, LDB);
            wmma::mma_sync(acc, fa, fb, acc);
        }
        wmma::store_matrix_sync(out + n * 16, acc, LDF, wmma::mem_row_major);
    }
}

/* acc[n] += a (16 x 64, stride LDB) times B (64 x 64 at b, stride LDB). */
__device__ static void rows_times_b(frag_c *acc, const bf16 *a, const bf16 *b) {
    for (int kk = 0; kk < 4; kk++) {
        frag_a fa;
        wmma::load_matrix_sync(fa, a + kk * 16, LDB);
        for (int n = 0; n < 4; n++) {
            frag_b_row fb;
            wmma::load_matrix_sync(fb, b + kk * 16 * LDB + n * 16, LDB);
            wmma::mma_sync(acc[n], fa, fb, acc[n]);
        }
    }
}

/* The 16 x 64 result of a warp (scaled by s) to rows [r0, r0 + 16) (ld apart) of an f32
 * matrix, through the warp's part of shared memory. */
__device__ static void store_rows(float *dst, frag_c *acc, float s, float *stage, int64_t r0,
                                  int64_t t, int64_t ld) {
    for (int n = 0; n < 4; n++) {
        for (int e = 0; e < acc[n].num_elements; e++) acc[n].x[e] *= s;
        wmma::store_matrix_sync(stage + n * 16, acc[n], LDF, wmma::mem_row_major);
    }
    __syncwarp();
    const int lane = threadIdx.x & 31;
    for (int idx = lane; idx < 16 * HD / 4; idx += 32) {
        int r = idx / (HD / 4), c = 4 * (idx % (HD / 4));
        if (r0 + r < t)
            *(float4 *)(dst + (r0 + r) * ld + c) = *(const float4 *)(stage + r * LDF + c);
    }
}

/* Shared memory of each kernel (bytes). */
#define SM_FWD  (4 * TILE * LDB * 2 + 2 * TILE * LDF * 4)
#define SM_DKDV (6 * TILE * LDB * 2 + TILE * LDF * 4 + 2 * TILE * 4)
#define SM_DQ   (5 * TILE * LDB * 2 + TILE * LDF * 4)

/* grid (query tiles, BH). */
__global__ void __launch_bounds__(NT)
    k_attn_tc_fwd(float *o, float *lse, const float *q, const float *k, const float *v,
                  const cu_attn_geom G, int causal, float scale) {
    extern __shared__ __align__(128) unsigned char sm[];
    bf16 *Qs = (bf16 *)sm, *Ks = Qs + TILE * LDB, *Vs = Ks + TILE * LDB, *Ps = Vs + TILE * LDB;
    float *Ss = (float *)(Ps + TILE * LDB), *Os = Ss + TILE * LDF;
    /* the last query tiles see the most keys (causal): they start first */
    const int64_t bh = blockIdx.y, q0 = (int64_t)(gridDim.x - 1 - blockIdx.x) * TILE;
    const int64_t t = G.t, io = in_off(G, bh), ld = G.ld_in;
    const float *qb = q + io, *kb = k + io, *vb = v + io;
    const int w = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int r = 16 * w + (lane >> 1), half = lane & 1; /* this lane: row r, columns half*32.. */
    const int64_t qg = q0 + r;

    load_tile(Qs, qb, q0, t, ld);
    for (int c = 0; c < 32; c++) Os[r * LDF + half * 32 + c] = 0.0f;
    float m = -INFINITY, l = 0.0f;
    int64_t n_tiles = (t + TILE - 1) / TILE;
    if (causal) {
        int64_t last = (q0 + TILE - 1) / TILE + 1;
        if (last < n_tiles) n_tiles = last;
    }
    for (int64_t kt = 0; kt < n_tiles; kt++) {
        const int64_t k0 = kt * TILE;
        __syncthreads(); /* every warp is done with the previous K, V */
        load_tile(Ks, kb, k0, t, ld);
        load_tile(Vs, vb, k0, t, ld);
        __syncthreads();
        rows_times_bt(Ss + 16 * w * LDF, Qs + 16 * w * LDB, Ks);
        __syncwarp();
        /* online softmax over this lane's 32 scores; the row's two lanes agree */
        float s[32], mx = -INFINITY;
        for (int c = 0; c < 32; c++) {
            int64_t kg = k0 + half * 32 + c;
            float x = Ss[r * LDF + half * 32 + c] * scale;
            if (kg >= t || (causal && kg > qg)) x = -INFINITY;
            s[c] = x;
            mx = fmaxf(mx, x);
        }
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
        const float mn = fmaxf(m, mx), mu = mn == -INFINITY ? 0.0f : mn;
        const float alpha = expf(m - mu); /* 0 while m is -inf */
        float sum = 0.0f;
        for (int c = 0; c < 32; c++) {
            float p = expf(s[c] - mu);
            sum += p;
            Ps[r * LDB + half * 32 + c] = __float2bfloat16_rn(p);
            Os[r * LDF + half * 32 + c] *= alpha;
        }
        sum += __shfl_xor_sync(0xffffffffu, sum, 1);
        l = l * alpha + sum;
        m = mn;
        __syncwarp();
        /* O_w += P_w V */
        frag_c acc[4];
        for (int n = 0; n < 4; n++)
            wmma::load_matrix_sync(acc[n], Os + 16 * w * LDF + n * 16, LDF, wmma::mem_row_major);
        rows_times_b(acc, Ps + 16 * w * LDB, Vs);
        for (int n = 0; n < 4; n++)
            wmma::store_matrix_sync(Os + 16 * w * LDF + n * 16, acc[n], LDF, wmma::mem_row_major);
        __syncwarp();
    }
    if (qg < t) {
        const float inv = 1.0f / l;
        float *orow = o + out_off(G, bh) + qg * G.ld_out + half * 32;
        for (int c = 0; c < 32; c += 4)
            *(float4 *)(orow + c) = make_float4(
                Os[r * LDF + half * 32 + c] * inv, Os[r * LDF + half * 32 + c + 1] * inv,
                Os[r * LDF + half * 32 + c + 2] * inv, Os[r * LDF + half * 32 + c + 3] * inv);
        if (!half) lse[bh * t + qg] = m + logf(l);
    }
}

/* grid (key tiles, BH): dk and dv of 64 keys, query tiles in increasing order. */
__global__ void __launch_bounds__(NT)
    k_attn_tc_dkdv(float *dk, float *dv, const float *dout, const float *q, const float *k,
                   const float *v, const float *lse, const float *delta, const cu_attn_geom G,
                   int causal, float scale) {
    extern __shared__ __align__(128) unsigned char sm[];
    bf16 *Ks = (bf16 *)sm, *Vs = Ks + TILE * LDB, *Qs = Vs + TILE * LDB, *Ds = Qs + TILE * LDB;
    bf16 *Ps = Ds + TILE * LDB, *dSs = Ps + TILE * LDB;
    float *Ss = (float *)(dSs + TILE * LDB), *Ls = Ss + TILE * LDF, *Dl = Ls + TILE;
    const int64_t bh = blockIdx.y, k0 = (int64_t)blockIdx.x * TILE;
    const int64_t t = G.t, io = in_off(G, bh), ld = G.ld_in;
    const float *qb = q + io, *db = dout + out_off(G, bh);
    const int w = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int r = 16 * w + (lane >> 1), half = lane & 1; /* key row r, query columns half*32.. */
    const int64_t kg = k0 + r;

    load_tile(Ks, k + io, k0, t, ld);
    load_tile(Vs, v + io, k0, t, ld);
    frag_c adk[4], adv[4];
    for (int n = 0; n < 4; n++)
        wmma::fill_fragment(adk[n], 0.0f), wmma::fill_fragment(adv[n], 0.0f);
    const int64_t n_tiles = (t + TILE - 1) / TILE;
    for (int64_t qt = causal ? k0 / TILE : 0; qt < n_tiles; qt++) {
        const int64_t q0 = qt * TILE;
        __syncthreads(); /* every warp is done with the previous Q, dO */
        load_tile(Qs, qb, q0, t, ld);
        load_tile(Ds, db, q0, t, G.ld_out);
        for (int i = threadIdx.x; i < TILE; i += NT) {
            int64_t row = q0 + i;
            Ls[i] = row < t ? lse[bh * t + row] : INFINITY; /* p = 0 past the end */
            Dl[i] = row < t ? delta[bh * t + row] : 0.0f;
        }
        __syncthreads();
        /* S^T_w = K_w Q^T, then p^T */
        rows_times_bt(Ss + 16 * w * LDF, Ks + 16 * w * LDB, Qs);
        __syncwarp();
        float p[32];
        for (int c = 0; c < 32; c++) {
            int col = half * 32 + c;
            int64_t qg = q0 + col;
            int ok = kg < t && qg < t && (!causal || kg <= qg);
            p[c] = ok ? expf(Ss[r * LDF + col] * scale - Ls[col]) : 0.0f;
            Ps[r * LDB + col] = __float2bfloat16_rn(p[c]);
        }
        __syncwarp();
        /* dV_w += P^T_w dO;  dP^T_w = V_w dO^T */
        rows_times_b(adv, Ps + 16 * w * LDB, Ds);
        rows_times_bt(Ss + 16 * w * LDF, Vs + 16 * w * LDB, Ds);
        __syncwarp();
        for (int c = 0; c < 32; c++) {
            int col = half * 32 + c;
            dSs[r * LDB + col] = __float2bfloat16_rn(p[c] * (Ss[r * LDF + col] - Dl[col]));
        }
        __syncwarp();
        /* dK_w += dS^T_w Q (scaled at the end) */
        rows_times_b(adk, dSs + 16 * w * LDB, Qs);
    }
    __syncwarp();
    store_rows(dv + io, adv, 1.0f, Ss + 16 * w * LDF, k0 + 16 * w, t, ld);
    __syncwarp();
    store_rows(dk + io, adk, scale, Ss + 16 * w * LDF, k0 + 16 * w, t, ld);
}

/* grid (query tiles, BH): dq of 64 queries, key tiles in increasing order. */
__global__ void __launch_bounds__(NT)
    k_attn_tc_dq(float *dq, const float *dout, const float *q, const float *k, const float *v,
                 const float *lse, const float *delta, const cu_attn_geom G, int causal,
                 float scale) {
    extern __shared__ __align__(128) unsigned char sm[];
    bf16 *Qs = (bf16 *)sm, *Ds = Qs + TILE * LDB, *Ks = Ds + TILE * LDB, *Vs = Ks + TILE * LDB;
    bf16 *dSs = Vs + TILE * LDB;
    float *Ss = (float *)(dSs + TILE * LDB);
    /* the last query tiles see the most keys (causal): they start first */
    const int64_t bh = blockIdx.y, q0 = (int64_t)(gridDim.x - 1 - blockIdx.x) * TILE;
    const int64_t t = G.t, io = in_off(G, bh), ld = G.ld_in;
    const float *kb = k + io, *vb = v + io;
    const int w = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int r = 16 * w + (lane >> 1), half = lane & 1; /* query row r, key columns half*32.. */
    const int64_t qg = q0 + r;
    const float li = qg < t ? lse[bh * t + qg] : INFINITY, di = qg < t ? delta[bh * t + qg] : 0.0f;

    load_tile(Qs, q + io, q0, t, ld);
    load_tile(Ds, dout + out_off(G, bh), q0, t, G.ld_out);
    frag_c adq[4];
    for (int n = 0; n < 4; n++) wmma::fill_fragment(adq[n], 0.0f);
    int64_t n_tiles = (t + TILE - 1) / TILE;
    if (causal) {
        int64_t last = (q0 + TILE - 1) / TILE + 1;
        if (last < n_tiles) n_tiles = last;
    }
    for (int64_t kt = 0; kt < n_tiles; kt++) {
        const int64_t k0 = kt * TILE;
        __syncthreads();
        load_tile(Ks, kb, k0, t, ld);
        load_tile(Vs, vb, k0, t, ld);
        __syncthreads();
        rows_times_bt(Ss + 16 * w * LDF, Qs + 16 * w * LDB, Ks);
        __syncwarp();
        float p[32];
        for (int c = 0; c < 32; c++) {
            int col = half * 32 + c;
            int64_t kg = k0 + col;
            int ok = qg < t && kg < t && (!causal || kg <= qg);
            p[c] = ok ? expf(Ss[r * LDF + col] * scale - li) : 0.0f;
        }
        __syncwarp();
        rows_times_bt(Ss + 16 * w * LDF, Ds + 16 * w * LDB, Vs); /* dP_w = dO_w V^T */
        __syncwarp();
        for (int c = 0; c < 32; c++) {
            int col = half * 32 + c;
            dSs[r * LDB + col] = __float2bfloat16_rn(p[c] * (Ss[r * LDF + col] - di));
        }
        __syncwarp();
        rows_times_b(adq, dSs + 16 * w * LDB, Ks); /* dQ_w += dS_w K */
    }
    __syncwarp();
    store_rows(dq + io, adq, scale, Ss + 16 * w * LDF, q0 + 16 * w, t, ld);
}

/* delta[bh * t + i] = sum(do o) over row i of head bh (both in the output layout): a warp
 * per row, two elements a lane, a fixed butterfly. */
__global__ void k_attn_tc_delta(float *delta, const float *dout, const float *o,
                                const cu_attn_geom G, int64_t rows) {
    const int lane = threadIdx.x & 31;
    for (int64_t row = (int64_t)blockIdx.x * (NT / 32) + (threadIdx.x >> 5); row < rows;
         row += (int64_t)gridDim.x * (NT / 32)) {
        const int64_t bh = row / G.t, i = row % G.t, off = out_off(G, bh) + i * G.ld_out;
        float2 a = *(const float2 *)(dout + off + 2 * lane),
               b = *(const float2 *)(o + off + 2 * lane);
        float d = a.x * b.x + a.y * b.y;
        for (int m = 16; m > 0; m >>= 1) d += __shfl_xor_sync(0xffffffffu, d, m);
        if (lane == 0) delta[row] = d;
    }
}

extern "C" int cu_attention_tc_ok(int64_t hd, const void *const *ptrs, int n) {
    if (hd != HD) return 0;
    for (int i = 0; i < n; i++)
        if ((uintptr_t)ptrs[i] % 16) return 0;
    return 1;
}

extern "C" int cu_attention_tc_setup(void) {
    cudaError_t e =
        cudaFuncSetAttribute(k_attn_tc_fwd, cudaFuncAttributeMaxDynamicSharedMemorySize, SM_FWD);
    if (e == cudaSuccess)
        e = cudaFuncSetAttribute(k_attn_tc_dkdv, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                 SM_DKDV);
    if (e == cudaSuccess)
        e = cudaFuncSetAttribute(k_attn_tc_dq, cudaFuncAttributeMaxDynamicSharedMemorySize, SM_DQ);
    return (int)e;
}

extern "C" int cu_attention_tc(float *o, float *lse, const float *q, const float *k, const float *v,
                               const cu_attn_geom *g, int causal, float scale, cu_stream s) {
    const int64_t bh = g->B * g->H, t = g->t;
    if (bh <= 0 || t <= 0) return 0;
    if (bh > 65535) return (int)cudaErrorInvalidValue;
    dim3 grid((unsigned)((t + TILE - 1) / TILE), (unsigned)bh);
    k_attn_tc_fwd<<<grid, NT, SM_FWD, (cudaStream_t)s>>>(o, lse, q, k, v, *g, causal, scale);
    return (int)cudaGetLastError();
}

extern "C" int cu_attention_bwd_tc(float *dq, float *dk, float *dv, const float *dout,
                                   const float *q, const float *k, const float *v, const float *o,
                                   const float *lse, float *delta, const cu_attn_geom *g,
                                   int causal, float scale, cu_stream s) {
    const int64_t bh = g->B * g->H, t = g->t;
    if (bh <= 0 || t <= 0) return 0;
    if (bh > 65535) return (int)cudaErrorInvalidValue;
    cudaStream_t cs = (cudaStream_t)s;
    int64_t rows = bh * t, blocks = (rows + NT / 32 - 1) / (NT / 32);
    k_attn_tc_delta<<<(unsigned)(blocks > 65535 ? 65535 : blocks), NT, 0, cs>>>(delta, dout, o, *g,
                                                                                rows);
    dim3 grid((unsigned)((t + TILE - 1) / TILE), (unsigned)bh);
    k_attn_tc_dkdv<<<grid, NT, SM_DKDV, cs>>>(dk, dv, dout, q, k, v, lse, delta, *g, causal, scale);
    k_attn_tc_dq<<<grid, NT, SM_DQ, cs>>>(dq, dout, q, k, v, lse, delta, *g, causal, scale);
    return (int)cudaGetLastError();
}
