/* The CUDA backend's elementwise, shape, reduction, normalisation, loss and
 * optimizer kernels (declared in kernels.h; attention in attention.cu, the
 * scatter-add in scatter.cu).
 *
 * Written to be obviously correct first: grid-stride loops, one block per
 * row or per output for reductions, reductions in double in a fixed tree
 * order (no atomics), shapes spelled out beside each kernel. The
 * memory-bound kernels (elementwise, cast, permute, copies, gather) have
 * fast paths chosen at launch (32-bit indices, no per-dim index walk,
 * 16-byte loads); each element still gets the same operations in the same
 * order on every path.
 * The math of each op mirrors the CPU reference kernel in src/ops (same
 * formulas and constants); results agree within f32 rounding, not bit for
 * bit (different exp/log implementations and summation orders). */
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <math.h>
#include <stdint.h>

#include <atomic>

#include "backends/cuda/block_reduce.cuh"
#include "backends/cuda/kernels.h"
#include "ops/op_ids.h"

#define THREADS CU_BLOCK

/* Blocks for a grid-stride loop over n elements. */
static unsigned grid_for(int64_t n) {
    int64_t b = (n + THREADS - 1) / THREADS;
    if (b < 1) b = 1;
    if (b > 65535) b = 65535;
    return (unsigned)b;
}

/* Blocks for one block per row (grid-stride beyond 65535 rows). */
static unsigned row_blocks(int64_t rows) {
    return rows > 65535 ? 65535u : (unsigned)rows;
}

static int launched(void) {
    return (int)cudaGetLastError();
}

/* Blocks for the grid-stride loops of the memory-bound kernels (elementwise,
 * cast, copies): 16 blocks of THREADS per SM (two waves at the 8 resident
 * blocks an SM holds at most; the loop covers the rest), fewer when n is
 * small. The SM count is asked once (132 on an H200). */
static unsigned grid_fill(int64_t n) {
    static std::atomic<int> sms{0};
    int m = sms.load(std::memory_order_relaxed);
    if (m <= 0) {
        int dev = 0;
        if (cudaGetDevice(&dev) != cudaSuccess ||
            cudaDeviceGetAttribute(&m, cudaDevAttrMultiProcessorCount, dev) != cudaSuccess ||
            m <= 0) {
            (void)cudaGetLastError(); /* not this launch's error: only a launch shape */
            m = 132;
        }
        sms.store(m, std::memory_order_relaxed);
    }
    int64_t b = (n + THREADS - 1) / THREADS, cap = (int64_t)m * 16;
    if (b > cap) b = cap;
    if (b < 1) b = 1;
    return (unsigned)b;
}

/* The widest unit of 16, 8, 4, 2 or 1 bytes that divides every value of v
 * (addresses and byte counts): the copy kernels move whole units. */
static int unit_of(const uint64_t *v, int nv) {
    uint64_t g = 0;
    for (int i = 0; i < nv; i++) g |= v[i];
    int u = 16;
    while (u > 1 && (g & (uint64_t)(u - 1))) u >>= 1;
    return u;
}

/* Calls F<U, Idx>(...) for the unit of u bytes (uint4 for 16, uint2 for 8,
 * else the unsigned integer of that size) and Idx uint32_t when small (every
 * index and offset below 2^31: cheap 32-bit division), else uint64_t. */
#define UNIT_CALL(F, Idx, u, ...)                                                                  \
    switch (u) {                                                                                   \
    case 16: F<uint4, Idx>(__VA_ARGS__); break;                                                    \
    case 8: F<uint2, Idx>(__VA_ARGS__); break;                                                     \
    case 4: F<uint32_t, Idx>(__VA_ARGS__); break;                                                  \
    case 2: F<uint16_t, Idx>(__VA_ARGS__); break;                                                  \
    default: F<uint8_t, Idx>(__VA_ARGS__);                                                         \
    }
#define UNIT_DISPATCH(F, u, small, ...)                                                            \
    do {                                                                                           \
        if (small) {                                                                               \
            UNIT_CALL(F, uint32_t, u, __VA_ARGS__)                                                 \
        } else {                                                                                   \
            UNIT_CALL(F, uint64_t, u, __VA_ARGS__)                                                 \
        }                                                                                          \
    } while (0)

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

__device__ static int64_t index_at(const void *idx, int idx64, int64_t j) {
    return idx64 ? ((const int64_t *)idx)[j] : (int64_t)((const int32_t *)idx)[j];
}

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
