/* dnnl_conv_winograd.c — Winograd F(2x2x2, 3x3x3) for channels-last 3^3
 * convolutions, stride 1, padding 1 (see dnnl_conv_winograd.h).
 *
 * The 1-D matrices (Lavin and Gray, "Fast Algorithms for Convolutional
 * Neural Networks", 2016), applied along each of the three axes in turn:
 *   B^T = [1 0 -1 0; 0 1 1 0; 0 -1 1 0; 0 1 0 -1]   (input, 4 -> 4)
 *   G   = [1 0 0; 1/2 1/2 1/2; 1/2 -1/2 1/2; 0 0 1] (weights, 3 -> 4)
 *   A^T = [1 1 1 0; 0 1 -1 -1]                       (output, 4 -> 2) */
#include "backends/cpu/dnnl_conv_winograd.h"

#include <omp.h>
#include <stdlib.h>
#include <string.h>
#if defined(__x86_64__)
#include <immintrin.h>
#endif

enum { P = 64, ROWS = 12 }; /* 4^3 points; T is a multiple of ROWS */

/* A block's V and M together within this many bytes: half of a Zen 5 or
 * recent Intel core's L2, leaving room for U's slices and the volumes.
 * 128 and 192 KiB timed no faster on W4's shapes (docs/benchmarks.md). */
#define BLOCK_BUDGET (512u * 1024u)

static size_t align64(size_t n) {
    return (n + 63) & ~(size_t)63;
}

int ts_wino_init(ts_wino *s) {
    if (s->N < 1 || s->D < 1 || s->H < 1 || s->W < 1 || s->C < 1 || s->O < 1) return 0;
    s->Op = (s->O + 15) / 16 * 16;
    s->tD = (s->D + 1) / 2, s->tH = (s->H + 1) / 2, s->tW = (s->W + 1) / 2;
    s->ntiles = s->N * s->tD * s->tH * s->tW;
    const size_t row = (size_t)P * sizeof(float) * (size_t)(s->C + s->Op);
    int64_t T = (int64_t)(BLOCK_BUDGET / row) / ROWS * ROWS;
    if (T < ROWS) T = ROWS;
    if (T > 8 * ROWS) T = 8 * ROWS;
    /* no block far larger than the tiles there are */
    int64_t need = (s->ntiles + ROWS - 1) / ROWS * ROWS;
    s->T = T < need ? T : need;
    s->nblk = (s->ntiles + s->T - 1) / s->T;
    s->u_bytes = align64((size_t)(P * s->C * s->Op) * sizeof(float));
    /* V and M; the weight transform's Op x 64 values first use the lane */
    s->lane_bytes = align64((size_t)(P * s->T * s->C) * sizeof(float)) +
                    align64((size_t)(P * s->T * s->Op) * sizeof(float));
    if (s->lane_bytes < (size_t)(P * s->Op) * sizeof(float))
        s->lane_bytes = align64((size_t)(P * s->Op) * sizeof(float));
    return 1;
}

int ts_wino_enabled(void) {
#if defined(__x86_64__)
    const char *e = getenv("TESSEL_CONV_WINOGRAD");
    if (e && !strcmp(e, "0")) return 0;
    return __builtin_cpu_supports("avx512f");
#else
    return 0;
#endif
}

size_t ts_wino_scratch(const ts_wino *s, int threads) {
    return s->u_bytes + s->lane_bytes * (size_t)(threads > 0 ? threads : 1);
}

/* u[p] = (G g G^T)[p] of one 3^3 kernel g. */
static void weight_transform(const float *g, float *u) {
    float a[3][3][4], b[3][4][4];
    for (int i = 0; i < 3; i++) /* along x */
        for (int j = 0; j < 3; j++) {
            const float *r = g + i * 9 + j * 3;
            a[i][j][0] = r[0];
            a[i][j][1] = 0.5f * (r[0] + r[1] + r[2]);
            a[i][j][2] = 0.5f * (r[0] - r[1] + r[2]);
            a[i][j][3] = r[2];
        }
    for (int i = 0; i < 3; i++) /* along y */
        for (int k = 0; k < 4; k++) {
            b[i][0][k] = a[i][0][k];
            b[i][1][k] = 0.5f * (a[i][0][k] + a[i][1][k] + a[i][2][k]);
            b[i][2][k] = 0.5f * (a[i][0][k] - a[i][1][k] + a[i][2][k]);
            b[i][3][k] = a[i][2][k];
        }
    for (int p = 0; p < 16; p++) { /* along z */
        const int j = p / 4, k = p % 4;
        u[p] = b[0][j][k];
        u[16 + p] = 0.5f * (b[0][j][k] + b[1][j][k] + b[2][j][k]);
        u[32 + p] = 0.5f * (b[0][j][k] - b[1][j][k] + b[2][j][k]);
        u[48 + p] = b[2][j][k];
    }
}

/* U[p][c][o] for this conv's kernel of (o, c); zero in the padding columns
 * O..Op. Each input channel c by one thread: its Op x 64 values in `tmp`
 * first, then written as 64 contiguous rows. */
static void weights(const ts_wino *s, const float *w, float *U, char *lanes) {
    const int64_t C = s->C, O = s->O, Op = s->Op;
#pragma omp parallel
    {
        float *tmp = (float *)(lanes + s->lane_bytes * (size_t)omp_get_thread_num());
#pragma omp for schedule(static)
        for (int64_t c = 0; c < C; c++) {
            for (int64_t o = 0; o < O; o++) {
                float g[27];
                for (int k = 0; k < 27; k++)
                    g[k] = s->flip ? w[(c * O + o) * 27 + 26 - k] : w[(o * C + c) * 27 + k];
                weight_transform(g, tmp + o * P);
            }
            for (int p = 0; p < P; p++) {
                float *row = U + (p * C + c) * Op;
                for (int64_t o = 0; o < O; o++) row[o] = tmp[o * P + p];
                for (int64_t o = O; o < Op; o++) row[o] = 0.0f;
            }
        }
    }
}

#if defined(__x86_64__)
#define AVX512 __attribute__((target("avx512f")))

/* Where tile t starts: image n, and the input corner (z, y, x) of its 4^3
 * patch (one before its first output in each axis). */
typedef struct tile_pos {
    int64_t n, z, y, x;
} tile_pos;

static tile_pos tile_at(const ts_wino *s, int64_t t) {
    tile_pos q;
    q.x = t % s->tW * 2 - 1;
    t /= s->tW;
    q.y = t % s->tH * 2 - 1;
    t /= s->tH;
    q.z = t % s->tD * 2 - 1;
    q.n = t / s->tD;
    return q;
}

static __mmask16 tail_mask(int64_t left) {
    return left >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << left) - 1);
}

/* Loads and stores of 16 channels, masked only for a tail: masked stores
 * are slow on AMD's Zen 4/5 (measured here: the 16-channel W4 conv took
 * 1.3x longer with them everywhere). */
static inline __attribute__((always_inline)) AVX512 void store16(float *p, __mmask16 m, __m512 v) {
    if (m == (__mmask16)0xFFFF)
        _mm512_storeu_ps(p, v);
    else
        _mm512_mask_storeu_ps(p, m, v);
}

static inline __attribute__((always_inline)) AVX512 __m512 load16(const float *p, __mmask16 m) {
    return m == (__mmask16)0xFFFF ? _mm512_loadu_ps(p) : _mm512_maskz_loadu_ps(m, p);
}

/* B^T along one axis: four vectors `stride` apart, in place. */
static inline __attribute__((always_inline)) AVX512 void bt4(__m512 *d, int stride) {
    __m512 d0 = d[0], d1 = d[stride], d2 = d[2 * stride], d3 = d[3 * stride];
    d[0] = _mm512_sub_ps(d0, d2);
    d[stride] = _mm512_add_ps(d1, d2);
    d[2 * stride] = _mm512_sub_ps(d2, d1);
    d[3 * stride] = _mm512_sub_ps(d1, d3);
}

/* The z and y transforms of one input column: x column q->x + e of tile
 * q's patch, channels c0.. (mask m), into col[z * 4 + y]. */
static inline __attribute__((always_inline)) AVX512 void column(const ts_wino *s, const float *x,
                                                                const tile_pos *q, int e,
                                                                int64_t c0, __mmask16 m,
                                                                __m512 *col) {
    const int64_t xx = q->x + e;
    for (int a = 0; a < 4; a++)
        for (int b = 0; b < 4; b++) {
            const int64_t z = q->z + a, y = q->y + b;
            col[a * 4 + b] =
                xx >= 0 && xx < s->W && z >= 0 && z < s->D && y >= 0 && y < s->H
                    ? load16(x + (((q->n * s->D + z) * s->H + y) * s->W + xx) * s->C + c0, m)
                    : _mm512_setzero_ps();
        }
    for (int b = 0; b < 4; b++) bt4(col + b, 4);     /* along z */
    for (int a = 0; a < 4; a++) bt4(col + 4 * a, 1); /* along y */
}

/* V[p][i][c] for the block's tiles t0..t0+T (zeros past the last tile).
 * Neighbouring tiles along x share two input columns: a ring of four
 * transformed columns (slot = column index mod 4) keeps them, so a tile
 * that follows its left neighbour in the block transforms two columns, not
 * four. */
static AVX512 void input_transform(const ts_wino *s, const float *x, int64_t t0, float *V) {
    const int64_t C = s->C, T = s->T;
    for (int64_t c0 = 0; c0 < C; c0 += 16) {
        const __mmask16 m = tail_mask(C - c0);
        __m512 ring[4][16];
        for (int64_t i = 0; i < T; i++) {
            float *v = V + i * C + c0;
            if (t0 + i >= s->ntiles) {
                for (int p = 0; p < P; p++) store16(v + p * T * C, m, _mm512_setzero_ps());
                continue;
            }
            const tile_pos q = tile_at(s, t0 + i);
            const int first = i == 0 || q.x < 1; /* no left neighbour in the ring */
            for (int e = first ? 0 : 2; e < 4; e++)
                column(s, x, &q, e, c0, m, ring[(q.x + 1 + e) & 3]);
            for (int r = 0; r < 16; r++) { /* along x */
                __m512 d[4];
                for (int e = 0; e < 4; e++) d[e] = ring[(q.x + 1 + e) & 3][r];
                bt4(d, 1);
                for (int e = 0; e < 4; e++) store16(v + (r * 4 + e) * T * C, m, d[e]);
            }
        }
    }
}

/* A^T along one axis: (m0 + m1 + m2, m1 - m2 - m3). */
static inline __attribute__((always_inline)) AVX512 void at4(const __m512 *m, int stride,
                                                             __m512 *o0, __m512 *o1) {
    __m512 m1 = m[stride], m2 = m[2 * stride];
    *o0 = _mm512_add_ps(_mm512_add_ps(m[0], m1), m2);
    *o1 = _mm512_sub_ps(_mm512_sub_ps(m1, m2), m[3 * stride]);
}

/* y's 2^3 outputs of the block's tiles from M[p][i][o]. */
static AVX512 void output_transform(const ts_wino *s, const float *M, int64_t t0, float *y) {
    const int64_t O = s->O, Op = s->Op, T = s->T;
    for (int64_t i = 0; i < T && t0 + i < s->ntiles; i++) {
        const tile_pos q = tile_at(s, t0 + i);
        const int64_t z = q.z + 1, yy = q.y + 1, xx = q.x + 1; /* first output */
        for (int64_t o0 = 0; o0 < O; o0 += 16) {
            const __mmask16 m = tail_mask(O - o0);
            __m512 v[P], a[32], b[16], r[8];
            for (int p = 0; p < P; p++) v[p] = _mm512_loadu_ps(M + (p * T + i) * Op + o0);
            for (int k = 0; k < 16; k++) at4(v + 4 * k, 1, &a[2 * k], &a[2 * k + 1]); /* x */
            for (int k = 0; k < 8; k++) /* y: a[z][y][x2] -> b[z][y2][x2] */
                at4(a + k / 2 * 8 + k % 2, 2, &b[k / 2 * 4 + k % 2], &b[k / 2 * 4 + 2 + k % 2]);
            for (int k = 0; k < 4; k++) at4(b + k, 4, &r[k], &r[4 + k]); /* z */
            for (int e = 0; e < 8; e++) {
                const int64_t oz = z + e / 4, oy = yy + e / 2 % 2, ox = xx + e % 2;
                if (oz < s->D && oy < s->H && ox < s->W)
                    store16(y + (((q.n * s->D + oz) * s->H + oy) * s->W + ox) * O + o0, m, r[e]);
            }
        }
    }
}

/* Cm[rm x 16nv] = A[rm x C] . B[C x 16nv]; A's rows C apart, B's and Cm's
 * Op apart. Each output summed over c in order with FMA. */
static inline __attribute__((always_inline)) AVX512 void micro(int64_t C, int64_t Op,
                                                               const float *A, const float *B,
                                                               float *Cm, const int rm,
                                                               const int nv) {
    __m512 acc[ROWS][4];
    for (int r = 0; r < rm; r++)
        for (int v = 0; v < nv; v++) acc[r][v] = _mm512_setzero_ps();
    for (int64_t c = 0; c < C; c++) {
        __m512 b[4];
        for (int v = 0; v < nv; v++) b[v] = _mm512_loadu_ps(B + c * Op + 16 * v);
        for (int r = 0; r < rm; r++) {
            const __m512 av = _mm512_set1_ps(A[r * C + c]);
            for (int v = 0; v < nv; v++) acc[r][v] = _mm512_fmadd_ps(av, b[v], acc[r][v]);
        }
    }
    for (int r = 0; r < rm; r++)
        for (int v = 0; v < nv; v++) _mm512_storeu_ps(Cm + r * Op + 16 * v, acc[r][v]);
}

/* M[p] = V[p] . U[p] for the 64 points of one block. */
static AVX512 void products(const ts_wino *s, const float *V, const float *U, float *M) {
    const int64_t C = s->C, Op = s->Op, T = s->T;
    for (int p = 0; p < P; p++) {
        const float *Vp = V + p * T * C, *Up = U + p * C * Op;
        float *Mp = M + p * T * Op;
        int64_t o0 = 0;
        for (; Op - o0 >= 64; o0 += 64)
            for (int64_t r = 0; r < T; r += ROWS / 2) {
                micro(C, Op, Vp + r * C, Up + o0, Mp + r * Op + o0, ROWS / 2, 4);
            }
        for (; Op - o0 >= 32; o0 += 32)
            for (int64_t r = 0; r < T; r += ROWS) {
                micro(C, Op, Vp + r * C, Up + o0, Mp + r * Op + o0, ROWS, 2);
            }
        for (; o0 < Op; o0 += 16)
            for (int64_t r = 0; r < T; r += ROWS) {
                micro(C, Op, Vp + r * C, Up + o0, Mp + r * Op + o0, ROWS, 1);
            }
    }
}

void ts_wino_conv(const ts_wino *s, const float *x, const float *w, float *y, void *scratch) {
    float *U = scratch;
    weights(s, w, U, (char *)scratch + s->u_bytes);
    const size_t vbytes = align64((size_t)(P * s->T * s->C) * sizeof(float));
#pragma omp parallel for schedule(static)
    for (int64_t blk = 0; blk < s->nblk; blk++) {
        char *lane = (char *)scratch + s->u_bytes + s->lane_bytes * (size_t)omp_get_thread_num();
        float *V = (float *)lane, *M = (float *)(lane + vbytes);
        input_transform(s, x, blk * s->T, V);
        products(s, V, U, M);
        output_transform(s, M, blk * s->T, y);
    }
}
#else
void ts_wino_conv(const ts_wino *s, const float *x, const float *w, float *y, void *scratch) {
    (void)s, (void)x, (void)w, (void)y, (void)scratch; /* ts_wino_enabled() is 0 */
}
#endif
