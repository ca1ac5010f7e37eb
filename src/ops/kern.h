/* kern.h — helpers for writing reference CPU kernels (internal).
 *
 * Kernels are written once as a macro body over an element type T and
 * instantiated for float and double (f64 serves the gradient checks).
 * Loops that matter are compiled twice with TS_CLONES: an AVX-512 version
 * picked at load time on CPUs that have it, and a generic one elsewhere.
 * Parallel loops split work by output element, never by reduction order,
 * so results do not depend on the thread count.
 */
#ifndef TS_KERN_H
#define TS_KERN_H

#include <math.h>
#include <string.h>
#include "op.h"

#if defined(__x86_64__) && !defined(__SANITIZE_ADDRESS__) && !defined(__clang__)
/* x86-64-v3 (AVX2 with FMA) rather than "avx2" alone: vmath.h's fmaf calls then compile to FMA
 * instructions there too, not to calls into libm (avx512f implies FMA). */
#define TS_CLONES __attribute__((target_clones("avx512f", "arch=x86-64-v3", "default")))
#elif defined(__x86_64__) && !defined(__SANITIZE_ADDRESS__) /* clang: GCC's arch names only */
#define TS_CLONES __attribute__((target_clones("avx512f", "avx2", "default")))
#else
#define TS_CLONES
#endif

/* Below this many elements a loop stays on one thread. */
#define TS_PAR_MIN 16384

/* Element strides of x for each axis of out (0 where x broadcasts). x's
 * shape must broadcast to out's. */
static inline void ts_bcast_strides(const ts_tensor *x, const ts_tensor *out, int64_t *str) {
    int lead = out->rank - x->rank;
    int64_t s = 1;
    for (int i = out->rank - 1; i >= 0; i--) {
        int xi = i - lead;
        if (xi < 0 || x->dims[xi] == 1) {
            str[i] = 0;
        } else {
            str[i] = s;
        }
        if (xi >= 0) s *= x->dims[xi];
    }
}

/* Offset of row `row` (index over all axes but the last) given strides. */
static inline int64_t ts_row_offset(int64_t row, int rank, const int64_t *dims,
                                    const int64_t *str) {
    int64_t off = 0;
    for (int i = rank - 2; i >= 0; i--) {
        int64_t d = dims[i];
        off += (row % d) * str[i];
        row /= d;
    }
    return off;
}

static inline int64_t ts_rows(const ts_tensor *t) {
    int64_t r = 1;
    for (int i = 0; i + 1 < t->rank; i++) r *= t->dims[i];
    return r;
}
static inline int64_t ts_inner(const ts_tensor *t) {
    return t->rank ? t->dims[t->rank - 1] : 1;
}

/* Split [0, n) into fixed-size blocks (independent of thread count), for
 * reductions that must be deterministic: partial sums per block, then the
 * blocks summed in order. */
#define TS_RED_BLOCK 4096
static inline int64_t ts_red_blocks(int64_t n) {
    return (n + TS_RED_BLOCK - 1) / TS_RED_BLOCK;
}

/* Row reductions keep TS_LANES interleaved partial sums (so the loop
 * vectorises) and combine them pairwise in a fixed order. */
#define TS_LANES 16
static inline double ts_lanes_sum(const double *a) {
    double s[TS_LANES / 2];
    for (int j = 0; j < TS_LANES / 2; j++) s[j] = a[j] + a[j + TS_LANES / 2];
    for (int w = TS_LANES / 4; w >= 1; w /= 2)
        for (int j = 0; j < w; j++) s[j] += s[j + w];
    return s[0];
}

/* The largest of x[0, n) as the loop `m = x[i] > m ? x[i] : m` from -inf finds it (a NaN is
 * never taken; a row of NaN or -inf gives -inf), written with GCC's vector extensions: GCC 12
 * compiles that loop over an array of TS_LANES maxima as sixteen scalar chains (perf put a
 * fifth of W3's cross entropy there, but that pass mostly waits on the logits' first read from
 * memory: the vector form measured no faster in the op). Four vectors of maxima, so no compare
 * waits on the one before; the order does not change the value: a maximum is exact, and of equal
 * values only the sign of a zero can differ, which no caller sees (x - m and m + log s are the same
 * for m = +0 and -0). Always inlined, so each TS_CLONES caller gets its target's vectors. */
#define TS_DEF_ROW_MAX(T, SFX)                                                                     \
    static inline __attribute__((always_inline)) T ts_row_max_##SFX(const T *x, int64_t n) {       \
        typedef T vec __attribute__((vector_size(TS_LANES * sizeof(T))));                          \
        vec v[4];                                                                                  \
        for (int a = 0; a < 4; a++) v[a] = (vec){0} - (T)INFINITY;                                 \
        int64_t i = 0;                                                                             \
        for (; i + 4 * TS_LANES <= n; i += 4 * TS_LANES)                                           \
            for (int a = 0; a < 4; a++) {                                                          \
                vec y;                                                                             \
                memcpy(&y, x + i + a * TS_LANES, sizeof y);                                        \
                __typeof__(y > y) k = y > v[a];                                                    \
                v[a] = (vec)(((__typeof__(k))y & k) | ((__typeof__(k))v[a] & ~k));                 \
            }                                                                                      \
        T m = (T)-INFINITY;                                                                        \
        for (; i < n; i++) m = x[i] > m ? x[i] : m;                                                \
        for (int a = 0; a < 4; a++)                                                                \
            for (int j = 0; j < TS_LANES; j++) m = v[a][j] > m ? v[a][j] : m;                      \
        return m;                                                                                  \
    }
TS_DEF_ROW_MAX(float, f32)
TS_DEF_ROW_MAX(double, f64)

/* The body of a kernel entry point that runs the f32 or f64 instantiation
 * by dtype `dt` (anything else is reported as unsupported). */
#define TS_FLOAT_DISPATCH(k, dt, opname, f32, f64)                                                 \
    switch (dt) {                                                                                  \
    case TS_F32: return f32(k);                                                                    \
    case TS_F64: return f64(k);                                                                    \
    default: return ts_kernel_bad_dtype(k, opname, dt);                                            \
    }

#endif
