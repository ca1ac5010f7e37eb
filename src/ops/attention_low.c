/* The bf16 products of the fused attention (attention_low.h): operand
 * packing and a register-blocked GEMM on packed bf16 pairs. */
#include "ops/attention_low.h"
#include <string.h>
#include "core/half.h"
#include "kern.h"
#include "ops/attention_low_simd.h"

static inline uint32_t pair(float lo, float hi) {
    return (uint32_t)ts_f32_to_bf16(lo) | (uint32_t)ts_f32_to_bf16(hi) << 16;
}

TS_CLONES static void pack_rows_generic(uint32_t *dst, int64_t ldd, const float *src, int64_t lds,
                                        int64_t n, int64_t cols) {
    const int64_t half = cols / 2;
    for (int64_t r = 0; r < n; r++) {
        const float *s = src + r * lds;
        uint32_t *d = dst + r * ldd;
        for (int64_t c = 0; c < half; c++) d[c] = pair(s[2 * c], s[2 * c + 1]);
        if (cols & 1) d[half] = pair(s[cols - 1], 0.0f);
    }
}

TS_CLONES static void pack_pairs_generic(uint32_t *dst, int64_t ldd, const float *src, int64_t lds,
                                         int64_t n, int64_t cols) {
    for (int64_t r = 0; r + 1 < n; r += 2) {
        const float *a = src + r * lds, *b = a + lds;
        uint32_t *d = dst + r / 2 * ldd;
        for (int64_t c = 0; c < cols; c++) d[c] = pair(a[c], b[c]);
    }
    if (n & 1) {
        const float *a = src + (n - 1) * lds;
        uint32_t *d = dst + n / 2 * ldd;
        for (int64_t c = 0; c < cols; c++) d[c] = pair(a[c], 0.0f);
    }
}

TS_CLONES static void pack_rows_t_generic(uint32_t *dst, int64_t ldd, const float *src, int64_t lds,
                                          int64_t n, int64_t cols) {
    const int64_t half = cols / 2;
    for (int64_t r = 0; r < n; r++) {
        const float *s = src + r * lds;
        for (int64_t c = 0; c < half; c++) dst[c * ldd + r] = pair(s[2 * c], s[2 * c + 1]);
        if (cols & 1) dst[half * ldd + r] = pair(s[cols - 1], 0.0f);
    }
}

/* bf16 sources: the bf16 halves as they are (the f32 packs' words of the values they round
 * from), a zero half after an odd row or column. */
static void pack_rows_bf16_generic(uint32_t *dst, int64_t ldd, const uint16_t *src, int64_t lds,
                                   int64_t n, int64_t cols) {
    for (int64_t r = 0; r < n; r++) {
        uint16_t *d = (uint16_t *)(dst + r * ldd);
        memcpy(d, src + r * lds, sizeof(uint16_t) * (size_t)cols);
        if (cols & 1) d[cols] = 0;
    }
}

static inline uint32_t pair16(uint16_t lo, uint16_t hi) {
    return (uint32_t)lo | (uint32_t)hi << 16;
}

TS_CLONES static void pack_pairs_bf16_generic(uint32_t *dst, int64_t ldd, const uint16_t *src,
                                              int64_t lds, int64_t n, int64_t cols) {
    for (int64_t r = 0; r < n; r += 2) {
        const uint16_t *a = src + r * lds, *b = a + lds;
        uint32_t *d = dst + r / 2 * ldd;
        if (r + 1 < n)
            for (int64_t c = 0; c < cols; c++) d[c] = pair16(a[c], b[c]);
        else
            for (int64_t c = 0; c < cols; c++) d[c] = a[c];
    }
}

static void pack_rows_t_bf16_generic(uint32_t *dst, int64_t ldd, const uint16_t *src, int64_t lds,
                                     int64_t n, int64_t cols) {
    const int64_t half = cols / 2;
    for (int64_t r = 0; r < n; r++) {
        const uint16_t *s = src + r * lds;
        for (int64_t c = 0; c < half; c++) dst[c * ldd + r] = pair16(s[2 * c], s[2 * c + 1]);
        if (cols & 1) dst[half * ldd + r] = s[cols - 1];
    }
}

/* Plain C: the pair's upper product first, then the lower one, as vdpbf16ps is specified. */
static void mm_generic(int64_t M, int64_t N, int64_t KP, const uint32_t *A, int64_t sam,
                       int64_t sak, const uint32_t *B, int64_t ldb, float *C, int64_t ldc,
                       int acc) {
    for (int64_t m = 0; m < M; m++)
        for (int64_t n = 0; n < N; n++) {
            float c = acc ? C[m * ldc + n] : 0.0f;
            for (int64_t p = 0; p < KP; p++) {
                uint32_t a = A[m * sam + p * sak], b = B[p * ldb + n];
                c += ts_bf16_to_f32((uint16_t)(a >> 16)) * ts_bf16_to_f32((uint16_t)(b >> 16));
                c += ts_bf16_to_f32((uint16_t)a) * ts_bf16_to_f32((uint16_t)b);
            }
            C[m * ldc + n] = c;
        }
}

#if TS_ATTN_BF16_SIMD

/* mr rows x nv vectors of 16 columns of C (mr * nv <= 16), kept in registers over the whole
 * reduction;
 * mk masks each vector's columns (the last may be partial). full: every mask is whole, so
 * plain loads and stores (masked stores are slow on Zen 5). */
static inline __attribute__((always_inline)) BF16_TARGET void
dp_tile(const int mr, const int nv, const int full, int64_t KP, const uint32_t *A, int64_t sam,
        int64_t sak, const uint32_t *B, int64_t ldb, float *C, int64_t ldc, int acc,
        const __mmask16 *mk) {
    __m512 c[8][4];
    for (int r = 0; r < mr; r++)
        for (int j = 0; j < nv; j++)
            c[r][j] = !acc   ? _mm512_setzero_ps()
                      : full ? _mm512_loadu_ps(C + r * ldc + 16 * j)
                             : _mm512_maskz_loadu_ps(mk[j], C + r * ldc + 16 * j);
    for (int64_t p = 0; p < KP; p++) {
        __m512i b[4];
        for (int j = 0; j < nv; j++)
            b[j] = full ? _mm512_loadu_si512(B + p * ldb + 16 * j)
                        : _mm512_maskz_loadu_epi32(mk[j], B + p * ldb + 16 * j);
        for (int r = 0; r < mr; r++) {
            __m512i a = _mm512_set1_epi32((int)A[r * sam + p * sak]);
            for (int j = 0; j < nv; j++)
                c[r][j] = _mm512_dpbf16_ps(c[r][j], (__m512bh)a, (__m512bh)b[j]);
        }
    }
    for (int r = 0; r < mr; r++)
        for (int j = 0; j < nv; j++) {
            if (full)
                _mm512_storeu_ps(C + r * ldc + 16 * j, c[r][j]);
            else
                _mm512_mask_storeu_ps(C + r * ldc + 16 * j, mk[j], c[r][j]);
        }
}

/* A mask of the first n of 16 lanes: none for n <= 0, all for n >= 16. */
static inline __mmask16 first_lanes(int64_t n) {
    return n <= 0 ? (__mmask16)0 : n >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << n) - 1);
}

/* 16 values from p (n < 16: the first n, zeros after), as RNE bf16. vcvtneps2bf16 flushes
 * denormals to zero, which vdpbf16ps does to its inputs anyway. */
static inline __attribute__((always_inline)) BF16_TARGET __m256i cvt16(const float *p, int64_t n) {
    return (__m256i)_mm512_cvtneps_pbh(_mm512_maskz_loadu_ps(first_lanes(n), p));
}

/* A row's pairs along it are the row in bf16, in order: 32 values a conversion
 * (vcvtne2ps2bf16, the same rounding as vcvtneps2bf16), then 16 at a time. */
BF16_TARGET static void pack_rows_avx512bf16(uint32_t *dst, int64_t ldd, const float *src,
                                             int64_t lds, int64_t n, int64_t cols) {
    for (int64_t r = 0; r < n; r++) {
        const float *s = src + r * lds;
        uint16_t *d = (uint16_t *)(dst + r * ldd);
        int64_t c = 0;
        for (; c + 32 <= cols; c += 32)
            _mm512_storeu_si512(d + c, (__m512i)_mm512_cvtne2ps_pbh(_mm512_loadu_ps(s + c + 16),
                                                                    _mm512_loadu_ps(s + c)));
        for (; c < cols; c += 16) {
            int64_t left = cols - c < 16 ? cols - c : 16;
            __m256i v = cvt16(s + c, left);
            if (left == 16) {
                _mm256_storeu_si256((__m256i *)(d + c), v);
            } else { /* the tail, and a zero after an odd one */
                int64_t w = (left + 1) & ~(int64_t)1;
                _mm256_mask_storeu_epi16(d + c, first_lanes(w), v);
            }
        }
    }
}

/* Word c of a row pair: row 2p's bf16 in the lower half, row 2p + 1's in the upper. Whole
 * vectors: both rows' 16 values in one conversion, interleaved by one permute. */
BF16_TARGET static void pack_pairs_avx512bf16(uint32_t *dst, int64_t ldd, const float *src,
                                              int64_t lds, int64_t n, int64_t cols) {
    for (int64_t r = 0; r < n; r += 2) {
        const float *a = src + r * lds, *b = r + 1 < n ? a + lds : NULL;
        uint32_t *d = dst + r / 2 * ldd;
        int64_t c = 0;
        if (b)
            for (; c + 16 <= cols; c += 16) {
                _mm512_storeu_si512(
                    d + c, ts_attn_zip_pairs(_mm512_loadu_ps(a + c), _mm512_loadu_ps(b + c)));
            }
        for (; c < cols; c += 16) {
            int64_t left = cols - c < 16 ? cols - c : 16;
            __m512i lo = _mm512_cvtepu16_epi32(cvt16(a + c, left));
            __m512i hi = b ? _mm512_slli_epi32(_mm512_cvtepu16_epi32(cvt16(b + c, left)), 16)
                           : _mm512_setzero_si512();
            _mm512_mask_storeu_epi32(d + c, first_lanes(left), _mm512_or_si512(lo, hi));
        }
    }
}

/* A mask of the first n of 32 lanes: none for n <= 0, all for n >= 32. */
static inline __mmask32 first_lanes32(int64_t n) {
    return n <= 0 ? (__mmask32)0 : n >= 32 ? (__mmask32)0xffffffffu : (__mmask32)((1u << n) - 1);
}

/* 16 x 16 tiles: 16 rows' 32 values as 16 words each (f32: one conversion a row, as
 * pack_rows_avx512bf16; bf16: the row's 32 halves as they are), transposed in registers (four
 * stages, each exchanging one bit of the row and word indices, vpermt2d), stored as 16 words of
 * 16 rows. Edges: masked loads (zeros past a row's end: an odd tail pairs with 0) and masked
 * stores. */
static inline __attribute__((always_inline)) BF16_TARGET void
rows_t_tiles(uint32_t *dst, int64_t ldd, const void *src, int64_t lds, int64_t n, int64_t cols,
             const int bf16) {
    const int64_t hp = (cols + 1) / 2;
    __m512i lo[4], hi[4];
    for (int st = 0, w = 8; w >= 1; st++, w /= 2) {
        int32_t l[16], h[16];
        for (int c = 0; c < 16; c++) {
            l[c] = c & w ? 16 + c - w : c;
            h[c] = c & w ? 16 + c : c + w;
        }
        lo[st] = _mm512_loadu_si512(l);
        hi[st] = _mm512_loadu_si512(h);
    }
    for (int64_t r0 = 0; r0 < n; r0 += 16) {
        const int64_t nr = n - r0 < 16 ? n - r0 : 16;
        const __mmask16 kr = first_lanes(nr);
        for (int64_t w0 = 0; w0 < hp; w0 += 16) {
            /* fc: the values left in each row from word w0 on; ka, kb: its two halves' lanes
             * (f32), kh: its lanes (bf16) */
            const int64_t nw = hp - w0 < 16 ? hp - w0 : 16, fc = cols - 2 * w0;
            const __mmask16 ka = first_lanes(fc), kb = first_lanes(fc - 16);
            const __mmask32 kh = first_lanes32(fc);
            __m512i x[16];
            _Pragma("GCC unroll 16") for (int t = 0; t < 16; t++) {
                x[t] = _mm512_setzero_si512();
                if (t < nr && bf16) {
                    const uint16_t *s = (const uint16_t *)src + (r0 + t) * lds + 2 * w0;
                    x[t] = _mm512_maskz_loadu_epi16(kh, s);
                } else if (t < nr) {
                    const float *s = (const float *)src + (r0 + t) * lds + 2 * w0;
                    x[t] = (__m512i)_mm512_cvtne2ps_pbh(_mm512_maskz_loadu_ps(kb, s + 16),
                                                        _mm512_maskz_loadu_ps(ka, s));
                }
            }
            _Pragma("GCC unroll 4") for (int st = 0, w = 8; w >= 1; st++, w /= 2)
                _Pragma("GCC unroll 16") for (int i = 0; i < 16; i++) if (!(i & w)) {
                __m512i a = x[i], b = x[i + w];
                x[i] = _mm512_permutex2var_epi32(a, lo[st], b);
                x[i + w] = _mm512_permutex2var_epi32(a, hi[st], b);
            }
            for (int k = 0; k < nw; k++) {
                uint32_t *d = dst + (w0 + k) * ldd + r0;
                if (nr == 16)
                    _mm512_storeu_si512(d, x[k]);
                else
                    _mm512_mask_storeu_epi32(d, kr, x[k]);
            }
        }
    }
}

BF16_TARGET static void pack_rows_t_avx512bf16(uint32_t *dst, int64_t ldd, const float *src,
                                               int64_t lds, int64_t n, int64_t cols) {
    rows_t_tiles(dst, ldd, src, lds, n, cols, 0);
}

BF16_TARGET static void pack_rows_t_bf16_avx512(uint32_t *dst, int64_t ldd, const uint16_t *src,
                                                int64_t lds, int64_t n, int64_t cols) {
    rows_t_tiles(dst, ldd, src, lds, n, cols, 1);
}

/* Word c of a row pair from bf16 rows: row 2p's half zero-extended, row 2p + 1's shifted up;
 * 16 words a step, the tail masked. */
BF16_TARGET static void pack_pairs_bf16_avx512(uint32_t *dst, int64_t ldd, const uint16_t *src,
                                               int64_t lds, int64_t n, int64_t cols) {
    for (int64_t r = 0; r < n; r += 2) {
        const uint16_t *a = src + r * lds, *b = r + 1 < n ? a + lds : NULL;
        uint32_t *d = dst + r / 2 * ldd;
        for (int64_t c = 0; c < cols; c += 16) {
            const int64_t left = cols - c < 16 ? cols - c : 16;
            const __mmask16 k = first_lanes(left);
            __m512i w = _mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(k, a + c));
            if (b)
                w = _mm512_or_si512(
                    w, _mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(k, b + c)),
                                         16));
            if (left == 16)
                _mm512_storeu_si512(d + c, w);
            else
                _mm512_mask_storeu_epi32(d + c, k, w);
        }
    }
}

BF16_TARGET static void mm_avx512bf16(int64_t M, int64_t N, int64_t KP, const uint32_t *A,
                                      int64_t sam, int64_t sak, const uint32_t *B, int64_t ldb,
                                      float *C, int64_t ldc, int acc) {
    for (int64_t n0 = 0; n0 < N; n0 += 64) {
        const int64_t w = N - n0 < 64 ? N - n0 : 64;
        const int nv = (int)((w + 15) / 16);
        __mmask16 mk[4];
        for (int j = 0; j < 4; j++) mk[j] = first_lanes(w - 16 * j);
        int64_t m = 0;
        /* whole vectors: 16 accumulators, enough to keep both vdpbf16ps pipes busy */
        if (w == 64)
            for (; m + 4 <= M; m += 4)
                dp_tile(4, 4, 1, KP, A + m * sam, sam, sak, B + n0, ldb, C + m * ldc + n0, ldc, acc,
                        mk);
        else if (w == 48) /* the causal diagonal's strips (attention_items_low.c) */
            for (; m + 4 <= M; m += 4)
                dp_tile(4, 3, 1, KP, A + m * sam, sam, sak, B + n0, ldb, C + m * ldc + n0, ldc, acc,
                        mk);
        else if (w == 32)
            for (; m + 8 <= M; m += 8)
                dp_tile(8, 2, 1, KP, A + m * sam, sam, sak, B + n0, ldb, C + m * ldc + n0, ldc, acc,
                        mk);
        else if (w == 16)
            for (; m + 8 <= M; m += 8)
                dp_tile(8, 1, 1, KP, A + m * sam, sam, sak, B + n0, ldb, C + m * ldc + n0, ldc, acc,
                        mk);
        for (; m < M; m++) /* the rows left over, and narrow column blocks */
            for (int j = 0; j < nv; j++)
                dp_tile(1, 1, 0, KP, A + m * sam, sam, sak, B + n0 + 16 * j, ldb,
                        C + m * ldc + n0 + 16 * j, ldc, acc, &mk[j]);
    }
}
#endif

void ts_attn_pack_rows(uint32_t *dst, int64_t ldd, const float *src, int64_t lds, int64_t n,
                       int64_t cols) {
#if TS_ATTN_BF16_SIMD
    if (ts_attn_has_bf16()) {
        pack_rows_avx512bf16(dst, ldd, src, lds, n, cols);
        return;
    }
#endif
    pack_rows_generic(dst, ldd, src, lds, n, cols);
}

void ts_attn_pack_pairs(uint32_t *dst, int64_t ldd, const float *src, int64_t lds, int64_t n,
                        int64_t cols) {
#if TS_ATTN_BF16_SIMD
    if (ts_attn_has_bf16()) {
        pack_pairs_avx512bf16(dst, ldd, src, lds, n, cols);
        return;
    }
#endif
    pack_pairs_generic(dst, ldd, src, lds, n, cols);
}

void ts_attn_pack_rows_t(uint32_t *dst, int64_t ldd, const float *src, int64_t lds, int64_t n,
                         int64_t cols) {
#if TS_ATTN_BF16_SIMD
    if (ts_attn_has_bf16()) {
        pack_rows_t_avx512bf16(dst, ldd, src, lds, n, cols);
        return;
    }
#endif
    pack_rows_t_generic(dst, ldd, src, lds, n, cols);
}

void ts_attn_mm_bf16(int64_t M, int64_t N, int64_t KP, const uint32_t *A, int64_t sam, int64_t sak,
                     const uint32_t *B, int64_t ldb, float *C, int64_t ldc, int acc) {
#if TS_ATTN_BF16_SIMD
    if (ts_attn_has_bf16()) {
        mm_avx512bf16(M, N, KP, A, sam, sak, B, ldb, C, ldc, acc);
        return;
    }
#endif
    mm_generic(M, N, KP, A, sam, sak, B, ldb, C, ldc, acc);
}

void ts_attn_pack_rows_bf16(uint32_t *dst, int64_t ldd, const uint16_t *src, int64_t lds, int64_t n,
                            int64_t cols) {
    pack_rows_bf16_generic(dst, ldd, src, lds, n, cols); /* a copy: memcpy is as fast */
}

void ts_attn_pack_pairs_bf16(uint32_t *dst, int64_t ldd, const uint16_t *src, int64_t lds,
                             int64_t n, int64_t cols) {
#if TS_ATTN_BF16_SIMD
    if (ts_attn_has_bf16()) {
        pack_pairs_bf16_avx512(dst, ldd, src, lds, n, cols);
        return;
    }
#endif
    pack_pairs_bf16_generic(dst, ldd, src, lds, n, cols);
}

void ts_attn_pack_rows_t_bf16(uint32_t *dst, int64_t ldd, const uint16_t *src, int64_t lds,
                              int64_t n, int64_t cols) {
#if TS_ATTN_BF16_SIMD
    if (ts_attn_has_bf16()) {
        pack_rows_t_bf16_avx512(dst, ldd, src, lds, n, cols);
        return;
    }
#endif
    pack_rows_t_bf16_generic(dst, ldd, src, lds, n, cols);
}
