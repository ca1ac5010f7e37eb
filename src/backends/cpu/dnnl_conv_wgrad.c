/* dnnl_conv_wgrad.c — per-tap backward-weights kernel for channels-last
 * convolutions (see dnnl_conv_wgrad.h). */
#include "backends/cpu/dnnl_conv_wgrad.h"

#include <math.h>
#include <omp.h>
#include <string.h>
#if defined(__x86_64__)
#include <immintrin.h>
#endif

enum { MR = 6, NR = 16 }; /* register tile: 6 output channels x 16 input channels */

static int64_t taps(const ts_wgrad_shape *s) {
    return s->k[0] * s->k[1] * s->k[2];
}

static int shape_ok(const ts_wgrad_shape *s) {
    if (s->N < 1 || s->C < 8 || s->C % 8 || s->O < 1) return 0;
    for (int j = 0; j < 3; j++)
        if (s->in[j] < 1 || s->k[j] < 1 || s->pad[j] < 0 || s->pad[j] >= s->k[j] ||
            s->out[j] != s->in[j] + 2 * s->pad[j] - s->k[j] + 1 || s->out[j] < 1)
            return 0;
    return 1;
}

int ts_conv_wgrad_usable(const ts_wgrad_shape *s) {
#if defined(__x86_64__)
    return shape_ok(s) && __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
#else
    (void)s;
    return 0;
#endif
}

size_t ts_conv_wgrad_scratch(const ts_wgrad_shape *s) {
    return (size_t)(taps(s) * s->O * s->C) * sizeof(float);
}

/* One register tile: taps index tap, output channels o0..o0+mr, input
 * channels c0..c0+8*nv. */
typedef struct tile {
    int64_t tap, o0, c0;
    int mr, nv;
} tile;

static tile tile_at(const ts_wgrad_shape *s, int64_t i) {
    int64_t nob = (s->O + MR - 1) / MR, ncb = (s->C + NR - 1) / NR;
    tile t;
    t.tap = i / (nob * ncb);
    t.o0 = (i / ncb) % nob * MR;
    t.c0 = i % ncb * NR;
    t.mr = (int)(s->O - t.o0 < MR ? s->O - t.o0 : MR);
    t.nv = s->C - t.c0 >= NR ? 2 : 1;
    return t;
}

/* Where a tap reads for output plane (n, y0): the x plane, and the column
 * range [w_lo, w_hi) of outputs whose input column is inside the volume. */
typedef struct plane_rows {
    int64_t z, t1, w_lo, w_hi, xshift; /* x column = w + xshift */
} plane_rows;

static int plane_setup(const ts_wgrad_shape *s, int64_t tap, int64_t y0, plane_rows *p) {
    int64_t t0 = tap / (s->k[1] * s->k[2]), t2 = tap % s->k[2];
    p->t1 = tap / s->k[2] % s->k[1];
    p->z = y0 + t0 - s->pad[0];
    if (p->z < 0 || p->z >= s->in[0]) return 0;
    p->xshift = t2 - s->pad[2];
    p->w_lo = p->xshift < 0 ? -p->xshift : 0;
    p->w_hi = s->in[2] - p->xshift < s->out[2] ? s->in[2] - p->xshift : s->out[2];
    return p->w_lo < p->w_hi;
}

/* The same sums in the same order with scalar fmaf: the kernel of CPUs
 * without AVX2, and the bit-exact reference of tests/unit/conv_wgrad.c. */
static void plane_scalar(const ts_wgrad_shape *s, const tile *t, int64_t n, int64_t y0,
                         const float *x, const float *dy, float *acc) {
    plane_rows p;
    if (!plane_setup(s, t->tap, y0, &p)) return;
    const int64_t C = s->C, O = s->O, nc = 8 * t->nv;
    float *a = acc + (t->tap * O + t->o0) * C + t->c0;
    for (int64_t y1 = 0; y1 < s->out[1]; y1++) {
        int64_t yy = y1 + p.t1 - s->pad[1];
        if (yy < 0 || yy >= s->in[1]) continue;
        const float *dr = dy + ((n * s->out[0] + y0) * s->out[1] + y1) * s->out[2] * O + t->o0;
        const float *xr = x + ((n * s->in[0] + p.z) * s->in[1] + yy) * s->in[2] * C + t->c0;
        for (int64_t w = p.w_lo; w < p.w_hi; w++)
            for (int i = 0; i < t->mr; i++)
                for (int64_t c = 0; c < nc; c++)
                    a[i * C + c] = fmaf(dr[w * O + i], xr[(w + p.xshift) * C + c], a[i * C + c]);
    }
}

#if defined(__x86_64__)
#define AVX2 __attribute__((target("avx2,fma")))

/* The tile's sums over one output plane, mr x nv*8 accumulators in
 * registers (mr and nv are constants in every call: see plane_avx2). */
static inline __attribute__((always_inline)) AVX2 void
plane_tile(const ts_wgrad_shape *s, const tile *t, int64_t n, int64_t y0, const float *x,
           const float *dy, float *acc, const int mr, const int nv) {
    plane_rows p;
    if (!plane_setup(s, t->tap, y0, &p)) return;
    const int64_t C = s->C, O = s->O;
    float *a = acc + (t->tap * O + t->o0) * C + t->c0;
    __m256 r[MR][2];
#pragma GCC unroll 6
    for (int i = 0; i < mr; i++)
#pragma GCC unroll 2
        for (int v = 0; v < nv; v++) r[i][v] = _mm256_loadu_ps(a + i * C + 8 * v);
    for (int64_t y1 = 0; y1 < s->out[1]; y1++) {
        int64_t yy = y1 + p.t1 - s->pad[1];
        if (yy < 0 || yy >= s->in[1]) continue;
        const float *dr =
            dy + ((n * s->out[0] + y0) * s->out[1] + y1) * s->out[2] * O + t->o0 + p.w_lo * O;
        const float *xr = x + ((n * s->in[0] + p.z) * s->in[1] + yy) * s->in[2] * C + t->c0 +
                          (p.w_lo + p.xshift) * C;
        for (int64_t w = p.w_lo; w < p.w_hi; w++, dr += O, xr += C) {
            __m256 xv[2];
#pragma GCC unroll 2
            for (int v = 0; v < nv; v++) xv[v] = _mm256_loadu_ps(xr + 8 * v);
#pragma GCC unroll 6
            for (int i = 0; i < mr; i++) {
                __m256 b = _mm256_broadcast_ss(dr + i);
#pragma GCC unroll 2
                for (int v = 0; v < nv; v++) r[i][v] = _mm256_fmadd_ps(b, xv[v], r[i][v]);
            }
        }
    }
#pragma GCC unroll 6
    for (int i = 0; i < mr; i++)
#pragma GCC unroll 2
        for (int v = 0; v < nv; v++) _mm256_storeu_ps(a + i * C + 8 * v, r[i][v]);
}

#define TILE_CASE(m)                                                                               \
    case m:                                                                                        \
        if (t->nv == 2)                                                                            \
            plane_tile(s, t, n, y0, x, dy, acc, m, 2);                                             \
        else                                                                                       \
            plane_tile(s, t, n, y0, x, dy, acc, m, 1);                                             \
        break;

static AVX2 void plane_avx2(const ts_wgrad_shape *s, const tile *t, int64_t n, int64_t y0,
                            const float *x, const float *dy, float *acc) {
    switch (t->mr) {
        TILE_CASE(1)
        TILE_CASE(2)
        TILE_CASE(3)
        TILE_CASE(4)
        TILE_CASE(5)
        TILE_CASE(6)
    default: break;
    }
}
#endif

/* Threads split the tiles (contiguous ranges); each thread passes over the
 * images and output planes in order and, per plane, over its tiles. */
static void wgrad(const ts_wgrad_shape *s, const float *x, const float *dy, float *dw, float *acc,
                  int vector) {
    const int64_t T = taps(s), O = s->O, C = s->C;
    const int64_t ntiles = T * ((O + MR - 1) / MR) * ((C + NR - 1) / NR);
    memset(acc, 0, ts_conv_wgrad_scratch(s));
#pragma omp parallel
    {
        const int64_t nth = omp_get_num_threads(), tid = omp_get_thread_num();
        const int64_t lo = ntiles * tid / nth, hi = ntiles * (tid + 1) / nth;
        for (int64_t n = 0; n < s->N; n++)
            for (int64_t y0 = 0; y0 < s->out[0]; y0++)
                for (int64_t i = lo; i < hi; i++) {
                    tile t = tile_at(s, i);
#if defined(__x86_64__)
                    if (vector) {
                        plane_avx2(s, &t, n, y0, x, dy, acc);
                        continue;
                    }
#endif
                    plane_scalar(s, &t, n, y0, x, dy, acc);
                }
#pragma omp barrier
#pragma omp for schedule(static)
        for (int64_t o = 0; o < O; o++)
            for (int64_t c = 0; c < C; c++)
                for (int64_t k = 0; k < T; k++) dw[(o * C + c) * T + k] = acc[(k * O + o) * C + c];
    }
    (void)vector;
}

void ts_conv_wgrad(const ts_wgrad_shape *s, const float *x, const float *dy, float *dw,
                   float *scratch) {
    wgrad(s, x, dy, dw, scratch, 1);
}

void ts_conv_wgrad_scalar(const ts_wgrad_shape *s, const float *x, const float *dy, float *dw,
                          float *scratch) {
    wgrad(s, x, dy, dw, scratch, 0);
}
