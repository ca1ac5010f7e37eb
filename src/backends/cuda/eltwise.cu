/* The CUDA backend's elementwise programs (every unary and binary op, fused
 * chains, expand, unary_bwd, where, maxmin_bwd) and casts (declared in
 * kernels.h). The math of each op mirrors the CPU reference kernel in
 * src/ops/unary.c and binary.c (same formulas and constants); results agree
 * within f32 rounding, not bit for bit (other exp/log implementations).
 * Fast paths are chosen at launch (no per-dim index walk for full, row and
 * scalar inputs, float4 when aligned, 32-bit indices); every element gets
 * the same operations in the same order on every path. */
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <math.h>
#include <stdint.h>

#include "backends/cuda/kernels.h"
#include "backends/cuda/launch.cuh"
#include "ops/op_ids.h"

/* ---- elementwise math (src/ops/unary.c, binary.c) ---------------------- */

#define GELU_BETA  0.797884560802865355879f /* sqrt(2/pi) */
#define GELU_KAPPA 0.044715f

__device__ static float d_sigmoid(float x) {
    /* no overflow on either side */
    if (x >= 0.0f) return 1.0f / (1.0f + expf(-x));
    float e = expf(x);
    return e / (1.0f + e);
}

/* Phi(x) and phi(x), clamped at |x| = 16 as the CPU's m_ncdf_f32. */
__device__ static float d_ncdf(float x, float *pdf) {
    x = fminf(fmaxf(x, -16.0f), 16.0f);
    if (pdf) *pdf = 0.398942280401432678f * expf(-0.5f * x * x);
    return 0.5f * erfcf(-x * 0.70710678118654752f);
}

__device__ static float d_pow(float x, float e) {
    if (e == 0.0f) return 1.0f;
    if (e == 1.0f) return x;
    if (e == 2.0f) return x * x;
    if (e == 3.0f) return x * x * x;
    if (e == 0.5f) return sqrtf(x);
    if (e == -0.5f) return 1.0f / sqrtf(x);
    if (e == -1.0f) return 1.0f / x;
    if (e == -2.0f) return 1.0f / (x * x);
    return powf(x, e);
}

__device__ static float d_unary(const cu_ew_instr &I, float x) {
    switch (I.op) {
    case TS_OP_NEG: return -x;
    case TS_OP_EXP: return expf(x);
    case TS_OP_LOG: return logf(x);
    case TS_OP_SQRT: return sqrtf(x);
    case TS_OP_RSQRT: return 1.0f / sqrtf(x);
    case TS_OP_ABS: return fabsf(x);
    case TS_OP_RELU: return x < 0.0f ? 0.0f : x; /* keeps NaN, as torch.relu */
    case TS_OP_SIGMOID: return d_sigmoid(x);
    case TS_OP_TANH: return tanhf(x);
    case TS_OP_POW_SCALAR: return d_pow(x, I.exponent);
    case TS_OP_LEAKY_RELU: return x > 0.0f ? x : x * I.slope;
    case TS_OP_AFFINE_SCALAR: return x * I.scale + I.shift;
    case TS_OP_GELU:
        if (I.approx == 1) /* tanh: x sigmoid(2u), u = sqrt(2/pi)(x + k x^3) */
            return x * d_sigmoid(2.0f * GELU_BETA * (x + GELU_KAPPA * (x * x * x)));
        return x * d_ncdf(x, NULL);
    default: return x; /* -1: copy (expand) */
    }
}

/* unary_bwd: d the incoming gradient, s the forward's x (side 0) or y (1). */
__device__ static float d_unary_bwd(const cu_ew_instr &I, float d, float s) {
    switch (I.fwd_op) {
    case TS_OP_EXP: return I.side ? d * s : d * expf(s);
    case TS_OP_LOG: return d / s;
    case TS_OP_SQRT: return I.side ? d / (s + s) : d / (2.0f * sqrtf(s));
    case TS_OP_RSQRT: return I.side ? -0.5f * d * (s * s * s) : -0.5f * d * (1.0f / (s * sqrtf(s)));
    case TS_OP_ABS: return d * (float)((s > 0.0f) - (s < 0.0f));
    case TS_OP_RELU: return s <= 0.0f ? 0.0f : d;
    case TS_OP_SIGMOID: return I.side ? d * (1.0f - s) * s : d * d_sigmoid(-s) * d_sigmoid(s);
    case TS_OP_TANH: {
        float t = I.side ? s : tanhf(s);
        return d * (1.0f - t * t);
    }
    case TS_OP_POW_SCALAR:
        if (I.exponent == 0.0f) return 0.0f;
        return d * (I.exponent * d_pow(s, I.exponent - 1.0f));
    case TS_OP_LEAKY_RELU: return s > 0.0f ? d : d * I.slope;
    case TS_OP_GELU:
        if (I.approx == 1) {
            float x2 = s * s, u2 = 2.0f * GELU_BETA * (s + GELU_KAPPA * (x2 * s));
            float sg = d_sigmoid(u2), sn = d_sigmoid(-u2);
            return d * (sg + 2.0f * s * sg * sn * GELU_BETA * (1.0f + 3.0f * GELU_KAPPA * x2));
        } else {
            float pdf, cdf = d_ncdf(s, &pdf);
            float xc = fminf(fmaxf(s, -16.0f), 16.0f);
            return d * (cdf + xc * pdf);
        }
    default: return __int_as_float(0x7fc00000); /* never: prepare checks the op */
    }
}

__device__ static float d_binary(int op, float x, float y) {
    switch (op) {
    case TS_OP_ADD: return x + y;
    case TS_OP_SUB: return x - y;
    case TS_OP_MUL: return x * y;
    case TS_OP_DIV: return x / y;
    case TS_OP_MAXIMUM: return (x > y || x != x) ? x : y; /* NaN propagates */
    case TS_OP_MINIMUM: return (x < y || x != x) ? x : y;
    default: return __int_as_float(0x7fc00000);
    }
}

/* Runs the program on one element whose inputs are r[0..n_ext-1]; returns
 * the last instruction's result. Every path below calls this per element,
 * so each element gets the same operations in the same order. */
__device__ __forceinline__ static float ew_run(const cu_ew_prog &P, float *r) {
    for (int t = 0; t < P.n_instr; t++) {
        const cu_ew_instr &I = P.ins[t];
        float a = r[I.src[0]], v;
        if (I.op == TS_OP_UNARY_BWD) {
            v = d_unary_bwd(I, a, r[I.src[1]]);
        } else if (I.op == TS_OP_WHERE) {
            v = a != 0.0f ? r[I.src[1]] : r[I.src[2]];
        } else if (I.op == TS_OP_MAXMIN_BWD) {
            /* (dy, a, b): the share of a (side 0) or b (side 1); ties halve */
            float x = r[I.src[1]], y = r[I.src[2]];
            float p = I.side ? y : x, q = I.side ? x : y;
            int wins = I.min_ ? p < q : p > q;
            v = wins ? a : (x == y ? a * 0.5f : 0.0f);
        } else if (I.op >= TS_OP_ADD && I.op <= TS_OP_MINIMUM) {
            v = d_binary(I.op, a, r[I.src[1]]);
        } else {
            v = d_unary(I, a);
        }
        r[P.n_ext + t] = v;
    }
    return r[P.n_ext + P.n_instr - 1];
}

template <typename Idx>
__device__ __forceinline__ static float ew_load(const cu_ew_input &in, Idx off) {
    return in.u8 ? (float)((const unsigned char *)in.p)[off] : ((const float *)in.p)[off];
}

/* How an input is addressed, decided on the host per launch (ew_plan):
 * EW_FULL at the element's index i; EW_SCALAR at 0; EW_ROW at i % cols (the
 * input is the output's trailing dims, contiguous, broadcast over the
 * leading ones: a bias [C] over [B, T, C]); EW_GENERAL by the per-dim
 * stride walk. */
enum { EW_FULL = 0, EW_SCALAR = 1, EW_ROW = 2, EW_GENERAL = 3 };
typedef struct ew_fast {
    int kind[CU_EW_MAX_EXT];
    int64_t cols[CU_EW_MAX_EXT]; /* EW_ROW */
} ew_fast;

template <typename Idx>
__device__ __forceinline__ static Idx ew_off(const ew_fast &F, int j, Idx i) {
    return F.kind[j] == EW_FULL ? i : F.kind[j] == EW_ROW ? i % (Idx)F.cols[j] : (Idx)0;
}

/* General path (some input broadcast in the middle, e.g. [B, 1, C] over
 * [B, T, C]): one element per iteration, its inputs found by walking the
 * output dims. Idx uint32_t when n < 2^31 (every offset is then below
 * 2^31 too), else int64_t. */
template <typename Idx> __global__ void k_eltwise(const __grid_constant__ cu_ew_prog P) {
    const Idx n = (Idx)P.n, stride = (Idx)gridDim.x * blockDim.x;
    for (Idx i = (Idx)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
        float r[CU_EW_MAX_EXT + CU_EW_MAX_INSTR];
        Idx off[CU_EW_MAX_EXT];
        for (int j = 0; j < P.n_ext; j++) off[j] = P.in[j].full ? i : (Idx)0;
        Idx rem = i;
        for (int d = P.rank - 1; d >= 0; d--) {
            Idx dim = (Idx)P.dims[d], c = rem % dim;
            rem /= dim;
            for (int j = 0; j < P.n_ext; j++)
                if (!P.in[j].full) off[j] += c * (Idx)P.in[j].stride[d];
        }
        for (int j = 0; j < P.n_ext; j++) r[j] = ew_load(P.in[j], off[j]);
        P.out[i] = ew_run(P, r);
    }
}

/* Every input full, a scalar or a row (no EW_GENERAL): no per-dim walk;
 * one element per iteration (when the float4 path's alignment or length
 * conditions fail). */
template <typename Idx>
__global__ void k_eltwise_simple(const __grid_constant__ cu_ew_prog P,
                                 const __grid_constant__ ew_fast F) {
    const Idx n = (Idx)P.n, stride = (Idx)gridDim.x * blockDim.x;
    for (Idx i = (Idx)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
        float r[CU_EW_MAX_EXT + CU_EW_MAX_INSTR];
        for (int j = 0; j < P.n_ext; j++) r[j] = ew_load(P.in[j], ew_off(F, j, i));
        P.out[i] = ew_run(P, r);
    }
}

/* As k_eltwise_simple, four elements i..i+3 (i a multiple of 4) per
 * iteration with float4 loads and store. Applies when n < 2^31, n % 4 == 0,
 * out and every f32 full/row input are 16-byte aligned and every row's
 * cols % 4 == 0 (so the four elements of a row input are contiguous and
 * aligned too); u8 inputs are read a byte at a time. */
__global__ void k_eltwise_vec4(const __grid_constant__ cu_ew_prog P,
                               const __grid_constant__ ew_fast F) {
    const uint32_t n4 = (uint32_t)(P.n / 4), stride = gridDim.x * blockDim.x;
    for (uint32_t q = blockIdx.x * blockDim.x + threadIdx.x; q < n4; q += stride) {
        const uint32_t i = 4 * q;
        float v[CU_EW_MAX_EXT][4];
        for (int j = 0; j < P.n_ext; j++) {
            const cu_ew_input &in = P.in[j];
            const uint32_t o = ew_off(F, j, i);
            if (in.u8) {
                const unsigned char *b = (const unsigned char *)in.p + o;
                const int s = F.kind[j] != EW_SCALAR; /* a scalar repeats b[0] */
                for (int k = 0; k < 4; k++) v[j][k] = (float)b[k * s];
            } else if (F.kind[j] == EW_SCALAR) {
                const float s = ((const float *)in.p)[0];
                for (int k = 0; k < 4; k++) v[j][k] = s;
            } else {
                const float4 f = *(const float4 *)((const float *)in.p + o);
                v[j][0] = f.x, v[j][1] = f.y, v[j][2] = f.z, v[j][3] = f.w;
            }
        }
        float res[4];
#pragma unroll 1
        for (int k = 0; k < 4; k++) {
            float r[CU_EW_MAX_EXT + CU_EW_MAX_INSTR];
            for (int j = 0; j < P.n_ext; j++) r[j] = v[j][k];
            res[k] = ew_run(P, r);
        }
        *(float4 *)(P.out + i) = make_float4(res[0], res[1], res[2], res[3]);
    }
}

/* Each input's kind; returns 1 when none is EW_GENERAL. An input that is not
 * full is a row when its nonzero strides are those of a contiguous block of
 * the output's trailing dims (then its offset sum c_d stride_d is exactly
 * i % cols), a scalar when that block is empty; size-1 dims never move the
 * offset and are skipped. */
static int ew_plan(const cu_ew_prog *p, ew_fast *f) {
    int simple = 1;
    for (int j = 0; j < p->n_ext; j++) {
        const cu_ew_input *in = &p->in[j];
        f->cols[j] = 1;
        if (in->full) {
            f->kind[j] = EW_FULL;
            continue;
        }
        int64_t run = 1;
        int d = p->rank - 1;
        for (; d >= 0 && (p->dims[d] == 1 || in->stride[d] == run); d--) run *= p->dims[d];
        for (; d >= 0 && (p->dims[d] == 1 || in->stride[d] == 0); d--) {
        }
        f->kind[j] = d >= 0 ? EW_GENERAL : run == 1 ? EW_SCALAR : EW_ROW;
        f->cols[j] = run;
        simple &= d < 0;
    }
    return simple;
}

/* Whether the float4 path applies (its conditions above). */
static int ew_vec4_ok(const cu_ew_prog *p, const ew_fast *f) {
    if (p->n % 4 != 0 || p->n > INT32_MAX || (uintptr_t)p->out % 16 != 0) return 0;
    for (int j = 0; j < p->n_ext; j++) {
        if (f->kind[j] == EW_ROW && f->cols[j] % 4 != 0) return 0;
        if (!p->in[j].u8 && f->kind[j] != EW_SCALAR && (uintptr_t)p->in[j].p % 16 != 0) return 0;
    }
    return 1;
}

extern "C" int cu_eltwise(const cu_ew_prog *p, cu_stream s) {
    if (p->n <= 0) return 0;
    cudaStream_t cs = (cudaStream_t)s;
    const int small = p->n <= INT32_MAX;
    ew_fast f;
    if (!ew_plan(p, &f)) {
        if (small)
            k_eltwise<uint32_t><<<grid_fill(p->n), THREADS, 0, cs>>>(*p);
        else
            k_eltwise<int64_t><<<grid_fill(p->n), THREADS, 0, cs>>>(*p);
    } else if (ew_vec4_ok(p, &f)) {
        k_eltwise_vec4<<<grid_fill(p->n / 4), THREADS, 0, cs>>>(*p, f);
    } else if (small) {
        k_eltwise_simple<uint32_t><<<grid_fill(p->n), THREADS, 0, cs>>>(*p, f);
    } else {
        k_eltwise_simple<int64_t><<<grid_fill(p->n), THREADS, 0, cs>>>(*p, f);
    }
    return launched();
}

/* ---- cast ---------------------------------------------------------------- */

/* x -> f32 -> y as before: widening to f32 is exact, narrowing rounds to
 * nearest even. */
__device__ __forceinline__ static float to_f32(float v) {
    return v;
}
__device__ __forceinline__ static float to_f32(__nv_bfloat16 v) {
    return __bfloat162float(v);
}
__device__ __forceinline__ static float to_f32(__half v) {
    return __half2float(v);
}
template <typename T> __device__ __forceinline__ static T from_f32(float v);
template <> __device__ __forceinline__ float from_f32<float>(float v) {
    return v;
}
template <> __device__ __forceinline__ __nv_bfloat16 from_f32<__nv_bfloat16>(float v) {
    return __float2bfloat16_rn(v);
}
template <> __device__ __forceinline__ __half from_f32<__half>(float v) {
    return __float2half_rn(v);
}

/* W elements moved as one aligned load / store. */
template <typename T, int W> struct alignas(W * sizeof(T)) pack { T v[W]; };

/* W elements per iteration (W = 4 when both pointers are aligned to 4
 * elements, else 1); the n % W tail elements by the first threads of
 * block 0. */
template <typename S, typename D, int W> __global__ void k_cast(D *y, const S *x, int64_t n) {
    const int64_t nw = n / W, stride = (int64_t)gridDim.x * blockDim.x;
    for (int64_t q = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; q < nw; q += stride) {
        const pack<S, W> a = ((const pack<S, W> *)x)[q];
        pack<D, W> b;
#pragma unroll
        for (int k = 0; k < W; k++) b.v[k] = from_f32<D>(to_f32(a.v[k]));
        ((pack<D, W> *)y)[q] = b;
    }
    if (blockIdx.x == 0 && (int64_t)threadIdx.x < n - nw * W) {
        const int64_t i = nw * W + threadIdx.x;
        y[i] = from_f32<D>(to_f32(x[i]));
    }
}

template <typename S, typename D>
static void launch_cast(void *y, const void *x, int64_t n, cudaStream_t cs) {
    if ((uintptr_t)x % (4 * sizeof(S)) == 0 && (uintptr_t)y % (4 * sizeof(D)) == 0)
        k_cast<S, D, 4><<<grid_fill((n + 3) / 4), THREADS, 0, cs>>>((D *)y, (const S *)x, n);
    else
        k_cast<S, D, 1><<<grid_fill(n), THREADS, 0, cs>>>((D *)y, (const S *)x, n);
}

template <typename S>
static void cast_from(void *y, int yk, const void *x, int64_t n, cudaStream_t cs) {
    if (yk == CU_BF16)
        launch_cast<S, __nv_bfloat16>(y, x, n, cs);
    else if (yk == CU_F16)
        launch_cast<S, __half>(y, x, n, cs);
    else
        launch_cast<S, float>(y, x, n, cs);
}

extern "C" int cu_cast(void *y, int yk, const void *x, int xk, int64_t n, cu_stream s) {
    if (n <= 0) return 0;
    cudaStream_t cs = (cudaStream_t)s;
    if (xk == CU_BF16)
        cast_from<__nv_bfloat16>(y, yk, x, n, cs);
    else if (xk == CU_F16)
        cast_from<__half>(y, yk, x, n, cs);
    else
        cast_from<float>(y, yk, x, n, cs);
    return launched();
}
