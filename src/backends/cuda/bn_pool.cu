/* bn_pool.cu — batch_norm, batch_norm_bwd, pool and pool_bwd for the CUDA
 * backend (f32), mirroring src/ops/batchnorm.c and src/ops/pool.c: the
 * same formulas, eps, momentum, biased variance to normalise and unbiased
 * variance for the running statistic, the fused ReLU and its recomputed
 * mask, the pooling windows and max pooling's tie rule (first maximum in
 * row-major window order, a NaN wins).
 *
 * Both layouts: channels first x [N, C, S] (S the spatial elements) and
 * channels last x [N*S, C]. A channel's m = N*S values are numbered j =
 * n*S + s in both.
 *
 * Determinism: batch norm's per-channel sums run over fixed chunks of
 * BN_CHUNK values (one block each, a fixed tree in the block), then the
 * chunks are merged in chunk order by one thread per channel (Chan et
 * al.'s update for the statistics, as the CPU). The pooling backward
 * gathers: each input element is owned by one thread, which adds the
 * shares of the outputs whose window holds it in increasing output order.
 * No atomics, so a step's bits depend on the shapes alone. The chunking
 * differs from the CPU's blocks, so results agree with the CPU's within
 * f32 rounding, not bit for bit. */
#include <cuda_runtime.h>
#include <math.h>
#include <stdint.h>
#include "backends/cuda/block_reduce.cuh"
#include "backends/cuda/kernels.h"

#define THREADS  CU_BLOCK
#define BN_CHUNK 4096 /* values of one channel per reduction block */

static unsigned grid_for(int64_t n) {
    int64_t b = (n + THREADS - 1) / THREADS;
    if (b < 1) b = 1;
    if (b > 65535) b = 65535;
    return (unsigned)b;
}

static int launched(void) {
    return (int)cudaGetLastError();
}

/* ---- batch norm ------------------------------------------------------- */

/* The address of value j of channel c. */
__device__ static inline int64_t bn_at(int64_t j, int64_t c, int64_t C, int64_t S, int cl) {
    return cl ? j * C + c : (j / S * C + c) * S + j % S;
}

/* The channel of element e of x. */
__device__ static inline int64_t bn_chan(int64_t e, int64_t C, int64_t S, int cl) {
    return cl ? e % C : e / S % C;
}

static int64_t bn_chunks(int64_t m) {
    return (m + BN_CHUNK - 1) / BN_CHUNK;
}

extern "C" size_t cu_batch_norm_scratch(int64_t n, int64_t c, int64_t s) {
    return (size_t)(2 * bn_chunks(n * s) * c) * sizeof(double) + (size_t)(5 * c) * sizeof(float);
}

/* y = x * al + be as one fma, in the forward and in the backward's ReLU
 * mask alike, so both agree on which outputs were positive. */
__device__ static inline float bn_lin(float x, float al, float be) {
    return fmaf(x, al, be);
}

/* al = rstd * w, be = b - mean * al (batchnorm.c's bn_coef, in double, then rounded). */
__device__ static inline void bn_coef(float rstd, float mean, const float *w, const float *b,
                                      int64_t c, float *al, float *be) {
    double a = (double)rstd * (w ? (double)w[c] : 1.0);
    *al = (float)a;
    *be = (float)((b ? (double)b[c] : 0.0) - (double)mean * a);
}

/* part[2 (c nq + q) + 0, 1] = mean and sum of squared deviations of chunk q of channel c. */
__global__ void k_bn_stats(double *part, const float *x, int64_t C, int64_t S, int64_t m,
                           int64_t nq, int cl) {
    __shared__ double sh[THREADS];
    const int64_t q = blockIdx.x, c = blockIdx.y;
    const int64_t j0 = q * BN_CHUNK, j1 = j0 + BN_CHUNK < m ? j0 + BN_CHUNK : m;
    double s = 0;
    for (int64_t j = j0 + threadIdx.x; j < j1; j += THREADS) s += (double)x[bn_at(j, c, C, S, cl)];
    const double mean = cu_block_sum(s, sh) / (double)(j1 - j0);
    double v = 0;
    for (int64_t j = j0 + threadIdx.x; j < j1; j += THREADS) {
        double d = (double)x[bn_at(j, c, C, S, cl)] - mean;
        v += d * d;
    }
    v = cu_block_sum(v, sh);
    if (threadIdx.x == 0) {
        part[2 * (c * nq + q)] = mean;
        part[2 * (c * nq + q) + 1] = v;
    }
}

/* Per channel: the batch statistics (training) or the running ones, the
 * running statistics' update, and the affine coefficients al, be. */
__global__ void k_bn_final(float *mean_o, float *rstd_o, float *rm, float *rv, float *coef,
                           const double *part, const float *w, const float *b, int64_t C, int64_t m,
                           int64_t nq, int training, double mom, double eps) {
    const int64_t c = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= C) return;
    if (training) {
        double cnt = 0, mean = 0, m2 = 0;
        for (int64_t q = 0; q < nq; q++) { /* Chan et al.'s update, chunks in order */
            double nb = (double)(m - q * BN_CHUNK < BN_CHUNK ? m - q * BN_CHUNK : BN_CHUNK);
            double bm = part[2 * (c * nq + q)], bm2 = part[2 * (c * nq + q) + 1];
            double tot = cnt + nb, delta = bm - mean;
            mean += delta * (nb / tot);
            m2 += bm2 + delta * delta * (cnt * nb / tot);
            cnt = tot;
        }
        double v = m2 / (double)m;
        mean_o[c] = (float)mean;
        rstd_o[c] = (float)(1.0 / sqrt(v + eps));
        double nrm = mom * mean + (1.0 - mom) * (double)rm[c];
        double nrv = mom * (v * (double)m / (double)(m - 1)) + (1.0 - mom) * (double)rv[c];
        rm[c] = (float)nrm;
        rv[c] = (float)nrv;
    } else {
        mean_o[c] = rm[c];
        rstd_o[c] = (float)(1.0 / sqrt((double)rv[c] + eps));
    }
    bn_coef(rstd_o[c], mean_o[c], w, b, c, &coef[c], &coef[C + c]);
}

__global__ void k_bn_apply(float *y, const float *x, const float *coef, int64_t n, int64_t C,
                           int64_t S, int cl, int relu) {
    const int64_t stride = (int64_t)gridDim.x * blockDim.x;
    for (int64_t e = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; e < n; e += stride) {
        int64_t c = bn_chan(e, C, S, cl);
        float v = bn_lin(x[e], coef[c], coef[C + c]);
        y[e] = relu && v < 0.0f ? 0.0f : v; /* keeps NaN, as torch.relu */
    }
}

extern "C" int cu_batch_norm(float *y, float *mean_o, float *rstd_o, float *rm, float *rv,
                             const float *x, const float *w, const float *b, int64_t n, int64_t c,
                             int64_t s, int cl, int training, int relu, double momentum, double eps,
                             void *scratch, cu_stream st) {
    cudaStream_t cs = (cudaStream_t)st;
    const int64_t m = n * s, nq = bn_chunks(m);
    double *part = (double *)scratch;
    float *coef = (float *)(part + 2 * nq * c);
    if (training)
        k_bn_stats<<<dim3((unsigned)nq, (unsigned)c), THREADS, 0, cs>>>(part, x, c, s, m, nq, cl);
    k_bn_final<<<(unsigned)((c + 127) / 128), 128, 0, cs>>>(mean_o, rstd_o, rm, rv, coef, part, w,
                                                            b, c, m, nq, training, momentum, eps);
    k_bn_apply<<<grid_for(m * c), THREADS, 0, cs>>>(y, x, coef, m * c, c, s, cl, relu);
    return launched();
}

/* part[2 (c nq + q) + 0, 1] = sums of g and g (x - mean) over chunk q of channel c. */
__global__ void k_bn_dsum(double *part, const float *dy, const float *x, const float *mean,
                          const float *rstd, const float *w, const float *b, int64_t C, int64_t S,
                          int64_t m, int64_t nq, int cl, int relu) {
    __shared__ double sh[THREADS];
    const int64_t q = blockIdx.x, c = blockIdx.y;
    const int64_t j0 = q * BN_CHUNK, j1 = j0 + BN_CHUNK < m ? j0 + BN_CHUNK : m;
    float al, be, mu = mean[c];
    bn_coef(rstd[c], mu, w, b, c, &al, &be);
    double s1 = 0, s2 = 0;
    for (int64_t j = j0 + threadIdx.x; j < j1; j += THREADS) {
        int64_t e = bn_at(j, c, C, S, cl);
        float xv = x[e], g = relu && !(bn_lin(xv, al, be) > 0.0f) ? 0.0f : dy[e];
        s1 += (double)g;
        s2 += (double)(g * (xv - mu));
    }
    s1 = cu_block_sum(s1, sh);
    s2 = cu_block_sum(s2, sh);
    if (threadIdx.x == 0) {
        part[2 * (c * nq + q)] = s1;
        part[2 * (c * nq + q) + 1] = s2;
    }
}

/* Per channel: dw, db and dx's coefficients (coef: al, be, kk, mdy, scale). */
__global__ void k_bn_dfinal(float *dw, float *db, float *coef, const double *part,
                            const float *mean, const float *rstd, const float *w, const float *b,
                            int64_t C, int64_t m, int64_t nq) {
    const int64_t c = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= C) return;
    double s1 = 0, s2 = 0;
    for (int64_t q = 0; q < nq; q++) {
        s1 += part[2 * (c * nq + q)];
        s2 += part[2 * (c * nq + q) + 1];
    }
    double r = (double)rstd[c];
    if (dw) dw[c] = (float)(s2 * r);
    if (db) db[c] = (float)s1;
    bn_coef(rstd[c], mean[c], w, b, c, &coef[c], &coef[C + c]);
    coef[2 * C + c] = (float)(s2 * r * r / (double)m);
    coef[3 * C + c] = (float)(s1 / (double)m);
    coef[4 * C + c] = (float)(r * (w ? (double)w[c] : 1.0));
}

/* dx = (g - (x - mean) kk - mdy) scale, g = dy (with the ReLU: 0 where the output was not > 0). */
__global__ void k_bn_dx(float *dx, const float *dy, const float *x, const float *mean,
                        const float *coef, int64_t n, int64_t C, int64_t S, int cl, int relu) {
    const int64_t stride = (int64_t)gridDim.x * blockDim.x;
    for (int64_t e = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; e < n; e += stride) {
        int64_t c = bn_chan(e, C, S, cl);
        float xv = x[e];
        float g = relu && bn_lin(xv, coef[c], coef[C + c]) <= 0.0f ? 0.0f : dy[e];
        dx[e] = (g - (xv - mean[c]) * coef[2 * C + c] - coef[3 * C + c]) * coef[4 * C + c];
    }
}

extern "C" int cu_batch_norm_bwd(float *dx, float *dw, float *db, const float *dy, const float *x,
                                 const float *mean, const float *rstd, const float *w,
                                 const float *b, int64_t n, int64_t c, int64_t s, int cl, int relu,
                                 void *scratch, cu_stream st) {
    cudaStream_t cs = (cudaStream_t)st;
    const int64_t m = n * s, nq = bn_chunks(m);
    double *part = (double *)scratch;
    float *coef = (float *)(part + 2 * nq * c);
    k_bn_dsum<<<dim3((unsigned)nq, (unsigned)c), THREADS, 0, cs>>>(part, dy, x, mean, rstd, w, b, c,
                                                                   s, m, nq, cl, relu);
    k_bn_dfinal<<<(unsigned)((c + 127) / 128), 128, 0, cs>>>(dw, db, coef, part, mean, rstd, w, b,
                                                             c, m, nq);
    k_bn_dx<<<grid_for(m * c), THREADS, 0, cs>>>(dx, dy, x, mean, coef, m * c, c, s, cl, relu);
    return launched();
}

/* ---- pooling ----------------------------------------------------------- */

enum { P_MAX = 0, P_AVG = 1, P_AVG_PAD = 2, P_ADAPTIVE = 3 };

/* pool.c's window(): input elements [lo, hi) of output o along slot t and
 * the count the average divides by. */
__device__ static void p_window(const cu_pool_geo &q, int t, int64_t o, int64_t *lo, int64_t *hi,
                                int64_t *cnt) {
    int64_t in = q.in[t];
    if (q.mode == P_ADAPTIVE) {
        int64_t out = q.out[t];
        *lo = o * in / out;
        *hi = ((o + 1) * in + out - 1) / out;
        *cnt = *hi - *lo;
        return;
    }
    int64_t a = o * q.s[t] - q.p[t], b = a + q.k[t];
    int64_t bp = b < in + q.p[t] ? b : in + q.p[t];
    *lo = a > 0 ? a : 0;
    *hi = b < in ? b : in;
    *cnt = q.mode == P_AVG_PAD ? bp - a : *hi - *lo;
}

/* The element (n, c, d, h, w) of a [N, C, sz...] (or channels last [N, sz..., C]) tensor. */
__device__ static inline int64_t p_at(const cu_pool_geo &q, const int64_t *sz, int64_t n, int64_t c,
                                      int64_t d, int64_t h, int64_t w) {
    if (q.cl) return (((n * sz[0] + d) * sz[1] + h) * sz[2] + w) * q.C + c;
    return (((n * q.C + c) * sz[0] + d) * sz[1] + h) * sz[2] + w;
}

/* Splits element e of a tensor of spatial sizes sz into (n, c, d, h, w). */
__device__ static inline void p_split(const cu_pool_geo &q, const int64_t *sz, int64_t e,
                                      int64_t *n, int64_t *c, int64_t *i) {
    if (q.cl) {
        *c = e % q.C;
        e /= q.C;
    }
    i[2] = e % sz[2];
    e /= sz[2];
    i[1] = e % sz[1];
    e /= sz[1];
    i[0] = e % sz[0];
    e /= sz[0];
    if (!q.cl) {
        *c = e % q.C;
        e /= q.C;
    }
    *n = e;
}

__global__ void k_pool(float *y, const float *x, const cu_pool_geo q, int64_t total) {
    const int64_t stride = (int64_t)gridDim.x * blockDim.x;
    for (int64_t e = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; e < total; e += stride) {
        int64_t n, c, o[3], lo[3], hi[3], cnt[3];
        p_split(q, q.out, e, &n, &c, o);
        for (int t = 0; t < 3; t++) p_window(q, t, o[t], &lo[t], &hi[t], &cnt[t]);
        const int is_max = q.mode == P_MAX;
        float acc = is_max ? -INFINITY : 0.0f;
        for (int64_t d = lo[0]; d < hi[0]; d++)
            for (int64_t h = lo[1]; h < hi[1]; h++)
                for (int64_t w = lo[2]; w < hi[2]; w++) {
                    float v = x[p_at(q, q.in, n, c, d, h, w)];
                    if (is_max)
                        acc = v > acc || v != v ? v : acc;
                    else
                        acc += v;
                }
        y[e] = is_max ? acc : acc / (float)(cnt[0] * cnt[1] * cnt[2]);
    }
}

/* The outputs along slot t whose window may hold input i: [*a, *b). */
__device__ static void p_candidates(const cu_pool_geo &q, int t, int64_t i, int64_t *a,
                                    int64_t *b) {
    int64_t out = q.out[t], in = q.in[t];
    if (q.mode == P_ADAPTIVE) {
        *a = i * out / in - 1;
        *b = (i + 1) * out / in + 2;
    } else {
        int64_t f = i + q.p[t] - q.k[t] + 1; /* o s >= f */
        *a = f <= 0 ? 0 : (f + q.s[t] - 1) / q.s[t];
        *b = (i + q.p[t]) / q.s[t] + 1;
    }
    if (*a < 0) *a = 0;
    if (*b > out) *b = out;
}

/* dx[e]: the shares of every output whose window holds e, in output order
 * (pool.c adds them in the same order); max pooling finds each window's
 * first maximum again. */
__global__ void k_pool_bwd(float *dx, const float *dy, const float *x, const cu_pool_geo q,
                           int64_t total) {
    const int64_t stride = (int64_t)gridDim.x * blockDim.x;
    for (int64_t e = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; e < total; e += stride) {
        int64_t n, c, i[3], a[3], b[3];
        p_split(q, q.in, e, &n, &c, i);
        for (int t = 0; t < 3; t++) p_candidates(q, t, i[t], &a[t], &b[t]);
        float acc = 0.0f;
        int64_t o[3], lo[3], hi[3], cnt[3];
        for (o[0] = a[0]; o[0] < b[0]; o[0]++) {
            p_window(q, 0, o[0], &lo[0], &hi[0], &cnt[0]);
            if (i[0] < lo[0] || i[0] >= hi[0]) continue;
            for (o[1] = a[1]; o[1] < b[1]; o[1]++) {
                p_window(q, 1, o[1], &lo[1], &hi[1], &cnt[1]);
                if (i[1] < lo[1] || i[1] >= hi[1]) continue;
                for (o[2] = a[2]; o[2] < b[2]; o[2]++) {
                    p_window(q, 2, o[2], &lo[2], &hi[2], &cnt[2]);
                    if (i[2] < lo[2] || i[2] >= hi[2]) continue;
                    float g = dy[p_at(q, q.out, n, c, o[0], o[1], o[2])];
                    if (q.mode != P_MAX) {
                        acc += g / (float)(cnt[0] * cnt[1] * cnt[2]);
                        continue;
                    }
                    /* the window's first maximum (a NaN wins); all -inf: its first element */
                    float best = -INFINITY;
                    int64_t at[3] = {lo[0], lo[1], lo[2]};
                    for (int64_t d = lo[0]; d < hi[0]; d++)
                        for (int64_t h = lo[1]; h < hi[1]; h++)
                            for (int64_t w = lo[2]; w < hi[2]; w++) {
                                float v = x[p_at(q, q.in, n, c, d, h, w)];
                                if (v > best || v != v) {
                                    best = v;
                                    at[0] = d, at[1] = h, at[2] = w;
                                }
                            }
                    if (at[0] == i[0] && at[1] == i[1] && at[2] == i[2]) acc += g;
                }
            }
        }
        dx[e] = acc;
    }
}

extern "C" int cu_pool(float *y, const float *x, const cu_pool_geo *q, cu_stream s) {
    int64_t total = q->N * q->C * q->out[0] * q->out[1] * q->out[2];
    if (total > 0) k_pool<<<grid_for(total), THREADS, 0, (cudaStream_t)s>>>(y, x, *q, total);
    return launched();
}

extern "C" int cu_pool_bwd(float *dx, const float *dy, const float *x, const cu_pool_geo *q,
                           cu_stream s) {
    int64_t total = q->N * q->C * q->in[0] * q->in[1] * q->in[2];
    if (total > 0)
        k_pool_bwd<<<grid_for(total), THREADS, 0, (cudaStream_t)s>>>(dx, dy, x, *q, total);
    return launched();
}
