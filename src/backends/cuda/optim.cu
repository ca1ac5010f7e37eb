/* The CUDA backend's optimizer kernels (declared in kernels.h): Adam/AdamW,
 * SGD, gradient clipping and the GradScaler's unscale and found-inf, each
 * one launch over every parameter through a pointer table, with
 * src/ops/optim.c's and src/ops/amp.c's arithmetic. */
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <math.h>
#include <stdint.h>

#include "backends/cuda/kernels.h"
#include "backends/cuda/launch.cuh"
#include "ops/op_ids.h"

/* ---- optimizer: Adam / AdamW, clipping ------------------------------------ */

/* blockIdx.y: the group (p, g, m, v); x: a grid-stride loop over its
 * elements. The per-step constants follow torch's _single_tensor_adam as
 * src/ops/optim.c does, from the step values the host wrote before the
 * step (or the graph launch) into device memory. */
__global__ void k_adam(float *const *ptrs, const int64_t *sizes, const cu_step_vals *step,
                       const float *coef_p, int decoupled, double b1, double b2, double eps_d,
                       double wd_d) {
    const int grp = blockIdx.y;
    float *p = ptrs[4 * grp], *g = ptrs[4 * grp + 1], *m = ptrs[4 * grp + 2],
          *v = ptrs[4 * grp + 3];
    const int64_t n = sizes[grp];
    const double lr = step->lr;
    const double t = (double)(step->opt_step > 0 ? step->opt_step : step->step);
    const float coef = coef_p ? *coef_p : 1.0f, wd = (float)wd_d;
    const int use_wd = !decoupled && wd_d != 0;
    const float pscale = (float)(decoupled ? 1.0 - lr * wd_d : 1.0);
    const float fb1 = (float)b1, omb1 = (float)(1.0 - b1), fb2 = (float)b2,
                omb2 = (float)(1.0 - b2);
    const float bc2s = (float)sqrt(1.0 - pow(b2, t)), eps = (float)eps_d;
    const float neg_step = (float)(-(lr / (1.0 - pow(b1, t))));
    const int64_t stride = (int64_t)gridDim.x * blockDim.x;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
        float gr = g[i] * coef, pi = p[i];
        if (use_wd) gr = fmaf(wd, pi, gr);
        pi = pi * pscale;
        float mi = fmaf(omb1, gr, m[i] * fb1);
        float vi = fmaf(omb2 * gr, gr, v[i] * fb2);
        m[i] = mi;
        v[i] = vi;
        float denom = sqrtf(vi) / bc2s + eps;
        p[i] = pi + neg_step * mi / denom;
    }
}

extern "C" int cu_adam(float *const *ptrs, const int64_t *sizes, int n_groups, int64_t max_size,
                       const cu_step_vals *step, const float *coef, int decoupled, double beta1,
                       double beta2, double eps, double wd, cu_stream s) {
    if (n_groups <= 0 || max_size <= 0) return 0;
    unsigned gx = grid_for(max_size);
    if (gx > 1024) gx = 1024; /* the groups fill the rest of the machine */
    dim3 grid(gx, (unsigned)n_groups);
    k_adam<<<grid, THREADS, 0, (cudaStream_t)s>>>(ptrs, sizes, step, coef, decoupled, beta1, beta2,
                                                  eps, wd);
    return launched();
}

/* torch.optim.SGD (_single_tensor_sgd) as src/ops/optim.c's sgd_f32, the
 * same fmaf roundings: d = g coef; d = fma(wd, p, d); buf = first ? d :
 * fma(1 - dampening, d, buf momentum); d = nesterov ? fma(momentum, buf, d)
 * : buf; p = fma(-lr, d, p). "first" is the first applied update. */
__global__ void k_sgd(float *const *ptrs, const int64_t *sizes, int per, const cu_step_vals *step,
                      const float *coef_p, double momentum, double dampening, double wd_d,
                      int nesterov) {
    const int grp = blockIdx.y;
    float *p = ptrs[per * grp], *g = ptrs[per * grp + 1],
          *buf = per > 2 ? ptrs[per * grp + 2] : NULL;
    const int64_t n = sizes[grp];
    const float coef = coef_p ? *coef_p : 1.0f, wd = (float)wd_d, mom = (float)momentum,
                damp1 = (float)(1.0 - dampening), neg_lr = (float)(-step->lr);
    const int use_wd = wd_d != 0;
    const int first = (step->opt_step > 0 ? step->opt_step : step->step) == 1;
    const int64_t stride = (int64_t)gridDim.x * blockDim.x;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
        float d = g[i] * coef;
        if (use_wd) d = fmaf(wd, p[i], d);
        if (buf) {
            float b = first ? d : fmaf(damp1, d, buf[i] * mom);
            buf[i] = b;
            d = nesterov ? fmaf(mom, b, d) : b;
        }
        p[i] = fmaf(neg_lr, d, p[i]);
    }
}

extern "C" int cu_sgd(float *const *ptrs, const int64_t *sizes, int n_groups, int per,
                      int64_t max_size, const cu_step_vals *step, const float *coef,
                      double momentum, double dampening, double wd, int nesterov, cu_stream s) {
    if (n_groups <= 0 || max_size <= 0) return 0;
    unsigned gx = grid_for(max_size);
    if (gx > 1024) gx = 1024;
    dim3 grid(gx, (unsigned)n_groups);
    k_sgd<<<grid, THREADS, 0, (cudaStream_t)s>>>(ptrs, sizes, per, step, coef, momentum, dampening,
                                                 wd, nesterov);
    return launched();
}

/* part[grp] = sum of squares of group grp (one block per group). */
__global__ void k_sumsq(double *part, const float *const *ptrs, const int64_t *sizes) {
    __shared__ double sh[THREADS];
    const float *x = ptrs[blockIdx.x];
    double a = 0;
    for (int64_t i = threadIdx.x; i < sizes[blockIdx.x]; i += THREADS) {
        double v = (double)x[i];
        a += v * v;
    }
    a = cu_block_sum(a, sh);
    if (threadIdx.x == 0) part[blockIdx.x] = a;
}

__global__ void k_clip_total(float *coef, const double *part, int n, double max_norm) {
    if (threadIdx.x != 0 || blockIdx.x != 0) return;
    /* as src/ops/optim.c: the norm of each tensor in f32, then the total */
    double tot = 0;
    for (int i = 0; i < n; i++) {
        float norm_i = (float)sqrt(part[i]);
        tot += (double)norm_i * (double)norm_i;
    }
    float total = (float)sqrt(tot), inv = 1.0f / (total + 1e-6f), c = inv * (float)max_norm;
    *coef = c > 1.0f ? 1.0f : c; /* NaN stays NaN, as torch.clamp */
}

extern "C" int cu_clip_coef(float *coef, const float *const *ptrs, const int64_t *sizes,
                            int n_groups, double max_norm, double *part, cu_stream s) {
    cudaStream_t cs = (cudaStream_t)s;
    if (n_groups > 0) k_sumsq<<<(unsigned)n_groups, THREADS, 0, cs>>>(part, ptrs, sizes);
    k_clip_total<<<1, 1, 0, cs>>>(coef, part, n_groups, max_norm);
    return launched();
}

/* ---- GradScaler: unscale and found-inf (src/ops/amp.c) -------------------- */

/* blockIdx.y: one gradient. A non-finite element sets its group's flag to 1:
 * every writer stores the same value, so the result does not depend on
 * the order (not a floating-point atomic). */
__global__ void k_unscale(float *const *ptrs, const int64_t *sizes, const float *scale,
                          int *flags) {
    const int grp = blockIdx.y;
    float *x = ptrs[grp];
    const int64_t n = sizes[grp], stride = (int64_t)gridDim.x * blockDim.x;
    const float inv = (float)(1.0 / (double)*scale);
    int f = 0;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
        float v = x[i];
        f |= !isfinite(v);
        x[i] = inv == 1.0f ? v : v * inv;
    }
    if (f) flags[grp] = 1;
}

__global__ void k_found(float *found, const int *flags, int n) {
    if (threadIdx.x != 0 || blockIdx.x != 0) return;
    int any = 0;
    for (int i = 0; i < n; i++) any |= flags[i];
    *found = any ? 1.0f : 0.0f;
}

extern "C" int cu_unscale(float *found, float *const *ptrs, const int64_t *sizes, int n_groups,
                          int64_t max_size, const float *scale, int *flags, cu_stream s) {
    cudaStream_t cs = (cudaStream_t)s;
    cudaError_t e =
        cudaMemsetAsync(flags, 0, sizeof(int) * (size_t)(n_groups > 0 ? n_groups : 1), cs);
    if (e != cudaSuccess) return (int)e;
    if (n_groups > 0 && max_size > 0) {
        unsigned gx = grid_for(max_size);
        if (gx > 1024) gx = 1024;
        k_unscale<<<dim3(gx, (unsigned)n_groups), THREADS, 0, cs>>>(ptrs, sizes, scale, flags);
    }
    k_found<<<1, 1, 0, cs>>>(found, flags, n_groups);
    return launched();
}
