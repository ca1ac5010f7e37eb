/* reduce.c — element-wise reduction kernels of the collectives.
 *
 * Every kernel is element-wise: no reassociation inside a vector, so the
 * AVX-512, AVX2 and generic clones give the same bits. bf16 and f16 are
 * widened to float, combined, and rounded to nearest even. Signed integer
 * sums wrap (computed unsigned), as MPI's do in practice.
 */
#include <string.h>
#include "dist/comm.h"

#if defined(__x86_64__) && !defined(__SANITIZE_ADDRESS__)
#define RED_CLONES __attribute__((target_clones("avx512f", "avx2", "default")))
#else
#define RED_CLONES
#endif

int ts_red_dtype_ok(ts_dtype dt) {
    return dt == TS_F32 || dt == TS_F64 || dt == TS_BF16 || dt == TS_F16 || dt == TS_I32 ||
           dt == TS_I64;
}

/* ---- 16-bit float conversions -------------------------------------------- */

static inline float bf16_to_f32(uint16_t h) {
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

static inline uint16_t f32_to_bf16(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40); /* quiet NaN */
    return (uint16_t)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

static inline float f16_to_f32(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16, exp = (h >> 10) & 0x1fu, man = h & 0x3ffu, u;
    if (exp == 0x1f) {
        u = sign | 0x7f800000u | (man << 13);
    } else if (exp) {
        u = sign | ((exp + 112u) << 23) | (man << 13);
    } else if (man) { /* subnormal: normalise */
        int e = -1;
        do {
            man <<= 1;
            e++;
        } while (!(man & 0x400u));
        u = sign | ((uint32_t)(112 - e) << 23) | ((man & 0x3ffu) << 13);
    } else {
        u = sign;
    }
    float f;
    memcpy(&f, &u, 4);
    return f;
}

static inline uint16_t f32_to_f16(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    uint32_t sign = (u >> 16) & 0x8000u, a = u & 0x7fffffffu;
    if (a > 0x7f800000u) return (uint16_t)(sign | 0x7e00u | ((a >> 13) & 0x3ffu));
    if (a >= 0x477ff000u) return (uint16_t)(sign | 0x7c00u); /* rounds to inf */
    if (a < 0x38800000u) {                                   /* subnormal or zero in f16 */
        if (a < 0x33000000u) return (uint16_t)sign;
        uint32_t man = (a & 0x7fffffu) | 0x800000u;
        int shift = 126 - (int)(a >> 23); /* 14..24: f16 subnormals count 2^-24 */
        uint32_t q = man >> shift, rest = man & ((1u << shift) - 1u), half = 1u << (shift - 1);
        if (rest > half || (rest == half && (q & 1u))) q++;
        return (uint16_t)(sign | q);
    }
    uint32_t q = ((a - 0x38000000u) >> 13), rest = a & 0x1fffu;
    if (rest > 0x1000u || (rest == 0x1000u && (q & 1u))) q++;
    return (uint16_t)(sign | q);
}

/* ---- the binary operations ------------------------------------------------ */

/* max/min keep a NaN and, for equal operands (±0), the lower rank's. */
#define OP_SUM(a, b)        ((a) + (b))
#define OP_MAX(a, b)        ((a) != (a) ? (a) : (b) != (b) ? (b) : (a) >= (b) ? (a) : (b))
#define OP_MIN(a, b)        ((a) != (a) ? (a) : (b) != (b) ? (b) : (a) <= (b) ? (a) : (b))
#define OP_ISUM(T, U, a, b) ((T)((U)(a) + (U)(b)))
#define OP_IMAX(a, b)       ((a) >= (b) ? (a) : (b))
#define OP_IMIN(a, b)       ((a) <= (b) ? (a) : (b))

#define PAIR_FLOAT(NAME, T)                                                                        \
    RED_CLONES static void NAME(T *d, const T *a, const T *b, size_t n, ts_reduce_op op) {         \
        if (op == TS_RED_SUM)                                                                      \
            for (size_t i = 0; i < n; i++) d[i] = OP_SUM(a[i], b[i]);                              \
        else if (op == TS_RED_MAX)                                                                 \
            for (size_t i = 0; i < n; i++) d[i] = OP_MAX(a[i], b[i]);                              \
        else                                                                                       \
            for (size_t i = 0; i < n; i++) d[i] = OP_MIN(a[i], b[i]);                              \
    }
PAIR_FLOAT(pair_f32, float)
PAIR_FLOAT(pair_f64, double)

#define PAIR_INT(NAME, T, U)                                                                       \
    static void NAME(T *d, const T *a, const T *b, size_t n, ts_reduce_op op) {                    \
        if (op == TS_RED_SUM)                                                                      \
            for (size_t i = 0; i < n; i++) d[i] = OP_ISUM(T, U, a[i], b[i]);                       \
        else if (op == TS_RED_MAX)                                                                 \
            for (size_t i = 0; i < n; i++) d[i] = OP_IMAX(a[i], b[i]);                             \
        else                                                                                       \
            for (size_t i = 0; i < n; i++) d[i] = OP_IMIN(a[i], b[i]);                             \
    }
PAIR_INT(pair_i32, int32_t, uint32_t)
PAIR_INT(pair_i64, int64_t, uint64_t)

static inline float op_f(float a, float b, ts_reduce_op op) {
    return op == TS_RED_SUM ? OP_SUM(a, b) : op == TS_RED_MAX ? OP_MAX(a, b) : OP_MIN(a, b);
}

static void pair_half(uint16_t *d, const uint16_t *a, const uint16_t *b, size_t n, ts_reduce_op op,
                      int bf) {
    for (size_t i = 0; i < n; i++) {
        float x = bf ? bf16_to_f32(a[i]) : f16_to_f32(a[i]);
        float y = bf ? bf16_to_f32(b[i]) : f16_to_f32(b[i]);
        float r = op_f(x, y, op);
        d[i] = bf ? f32_to_bf16(r) : f32_to_f16(r);
    }
}

void ts_red_pair(void *dst, const void *a, const void *b, size_t n, ts_dtype dt, ts_reduce_op op) {
    switch (dt) {
    case TS_F32: pair_f32(dst, a, b, n, op); break;
    case TS_F64: pair_f64(dst, a, b, n, op); break;
    case TS_I32: pair_i32(dst, a, b, n, op); break;
    case TS_I64: pair_i64(dst, a, b, n, op); break;
    case TS_BF16: pair_half(dst, a, b, n, op, 1); break;
    case TS_F16: pair_half(dst, a, b, n, op, 0); break;
    default: break; /* callers check ts_red_dtype_ok first */
    }
}

/* ---- fold over many ranks ----------------------------------------------- */

/* Two ranks, in place: both buffers receive a op b in one pass. This is
 * the hot loop of a 2-rank all-reduce, so it avoids a separate copy. */
#define BOTH2(NAME, T)                                                                             \
    RED_CLONES static void NAME(T *a, T *b, size_t n, ts_reduce_op op) {                           \
        if (op == TS_RED_SUM)                                                                      \
            for (size_t i = 0; i < n; i++) a[i] = b[i] = OP_SUM(a[i], b[i]);                       \
        else if (op == TS_RED_MAX)                                                                 \
            for (size_t i = 0; i < n; i++) a[i] = b[i] = OP_MAX(a[i], b[i]);                       \
        else                                                                                       \
            for (size_t i = 0; i < n; i++) a[i] = b[i] = OP_MIN(a[i], b[i]);                       \
    }
BOTH2(both2_f32, float)
BOTH2(both2_f64, double)

static void fold_half(float *acc, const void *const *srcs, int nsrc, size_t n, ts_reduce_op op,
                      int bf) {
    const uint16_t *s0 = srcs[0];
    for (size_t i = 0; i < n; i++) acc[i] = bf ? bf16_to_f32(s0[i]) : f16_to_f32(s0[i]);
    for (int k = 1; k < nsrc; k++) {
        const uint16_t *s = srcs[k];
        for (size_t i = 0; i < n; i++)
            acc[i] = op_f(acc[i], bf ? bf16_to_f32(s[i]) : f16_to_f32(s[i]), op);
    }
}

void ts_red_fold_store(void *const *dsts, int ndst, const void *const *srcs, int nsrc, size_t n,
                       ts_dtype dt, ts_reduce_op op) {
    size_t esz = ts_dtype_size(dt);
    if (dt == TS_BF16 || dt == TS_F16) {
        /* Widened once, folded in float, rounded once. */
        _Alignas(64) float acc[TS_RED_BLOCK];
        int bf = dt == TS_BF16;
        fold_half(acc, srcs, nsrc, n, op, bf);
        uint16_t *h = dsts[0];
        for (size_t i = 0; i < n; i++) h[i] = bf ? f32_to_bf16(acc[i]) : f32_to_f16(acc[i]);
    } else if (ndst == 2 && nsrc == 2 && dsts[0] == srcs[0] && dsts[1] == srcs[1] &&
               (dt == TS_F32 || dt == TS_F64)) {
        if (dt == TS_F32)
            both2_f32(dsts[0], dsts[1], n, op);
        else
            both2_f64(dsts[0], dsts[1], n, op);
        return;
    } else {
        /* Fold straight into the first destination: d = s0 op s1, then
         * d = d op s2, ... Each step reads index i before writing it, so d
         * may be s0 itself (in-place all-reduce). */
        void *d = dsts[0];
        if (nsrc == 1) {
            if (d != srcs[0]) memcpy(d, srcs[0], n * esz);
        } else {
            ts_red_pair(d, srcs[0], srcs[1], n, dt, op);
            for (int k = 2; k < nsrc; k++) ts_red_pair(d, d, srcs[k], n, dt, op);
        }
    }
    for (int k = 1; k < ndst; k++)
        if (dsts[k] != dsts[0]) memcpy(dsts[k], dsts[0], n * esz);
}
