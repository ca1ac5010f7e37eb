/* The softmax pieces of the fused attention's bf16 items (attention_low.h), each one pass over a
 * score block that writes the packed bf16 operands of the next products itself, so no f32
 * block is stored only to be read again by a pack:
 *
 *   forward   p = exp(scale * s - m_new), the running m, l and o as attention_fused.c's
 *             fwd_block_f32, p written only as bf16 pairs of key rows (pw, for o += p v);
 *   backward  p = exp(scale * s - lse) in f32 (for ds) and as bf16 rows (for dv += p^T do);
 *             ds = scale * p * (dp - D) only as bf16 rows (dk += ds^T q) and pairs of key
 *             rows (dq += ds k).
 *
 * Scores are transposed (s[j * BS + i], key j, query i), so every row statistic runs along
 * the vector axis (16 queries a vector). Masked entries (causal, and queries past nq) are
 * exact zeros in every output; the scores there are never read (a diagonal block's masked
 * quarter is not even computed). Only key rows that a vector's queries see in part have
 * their mask computed; the rest run on the queries' own (all of a block below the diagonal).
 *
 * Numerics: the f32 block pieces' operations in the same order (maximum, exp, sums of p over
 * keys in increasing order), with exp on AVX-512 here: Cephes' range reduction and degree-5
 * polynomial as attention_fused.c's aexpf (within 2 ulp of expf; vscalefps for the power of
 * two, the same clamps at -87 and 88, NaN kept). Its last bit and the FMA contraction of
 * l * alpha + rowsum may differ from the f32 pieces, so bf16 plans' bits differ from those of
 * the separate passes (not f32 plans': they do not run this file). Where the CPU lacks
 * AVX512-BF16 each piece is the f32 piece followed by the packs, as before. */
#include <math.h>
#include <string.h>
#include "ops/attention_fused.h"
#include "ops/attention_low.h"
#include "ops/attention_low_simd.h"

#define BS TS_ATTN_BS
#define BP (BS / 2)

/* Queries [i0, i0 + 16) of key row j that are visible: i < nq, and i >= j - diag when causal
 * (diag: the query block's start minus the key block's). */
static inline uint32_t visible(int causal, int64_t j, int64_t diag, int64_t nq, int64_t i0) {
    int64_t lo = causal ? j - diag - i0 : 0, hi = nq - i0;
    lo = lo < 0 ? 0 : lo;
    hi = hi > 16 ? 16 : hi;
    if (lo >= hi) return 0;
    return (uint32_t)(((1u << hi) - 1) & ~((1u << lo) - 1));
}

/* The masked entries of a transposed block set to 0 (the generic path's ds reads them). */
static void zero_masked(float *s, int64_t nq, int64_t nk, int causal, int64_t diag) {
    for (int64_t j = 0; j < nk; j++) {
        int64_t f = causal && j > diag ? j - diag : 0;
        if (f > nq) f = nq;
        memset(s + j * BS, 0, (size_t)f * sizeof(float));
    }
}

#if TS_ATTN_BF16_SIMD

/* Cephes' exp after its clamps (vexp, vexp_nonpos). */
static inline __attribute__((always_inline)) BF16_TARGET __m512 vexp_core(__m512 x) {
    __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                    _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), x);
    r = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.12194440e-4f), r);
    __m512 p = _mm512_set1_ps(1.9875691500e-4f);
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.3981999507e-3f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(8.3334519073e-3f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(4.1665795894e-2f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.6666665459e-1f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(5.0000001201e-1f));
    p = _mm512_add_ps(_mm512_fmadd_ps(_mm512_mul_ps(p, r), r, r), _mm512_set1_ps(1.0f));
    return _mm512_scalef_ps(p, n);
}

static inline __attribute__((always_inline)) BF16_TARGET __m512 vexp(__m512 x) {
    x = _mm512_max_ps(_mm512_set1_ps(-87.0f), x); /* NaN is the second operand: kept */
    x = _mm512_min_ps(_mm512_set1_ps(88.0f), x);
    return vexp_core(x);
}

/* vexp(x) for x <= 0 or NaN, without the clamp at 88: min(88, x) is x for such an x (88 < x
 * is false), so the bits are vexp's. The forward's exponents, s - max and m_old - m_new, are
 * such values in every lane it keeps. */
static inline __attribute__((always_inline)) BF16_TARGET __m512 vexp_nonpos(__m512 x) {
    return vexp_core(_mm512_max_ps(_mm512_set1_ps(-87.0f), x));
}

/* The key rows [0, end) of a block that queries [i0, i0 + 16) can see (causal: key j is seen
 * by query i >= j - diag); the rows past it are masked for all sixteen, so their exps are not
 * computed (on a diagonal block, a third of them). */
static inline int64_t keys_seen(int causal, int64_t nk, int64_t diag, int64_t i0, int64_t w) {
    int64_t e = causal ? i0 + w + diag : nk;
    return e < 0 ? 0 : e < nk ? e : nk;
}

/* The key rows [0, end) of a block that every one of queries [i0, i0 + 16) below nq sees
 * (causal: j <= i0 + diag): their mask is the queries' own, so it is not computed per row. */
static inline int64_t keys_full(int causal, int64_t nk, int64_t diag, int64_t i0) {
    int64_t e = causal ? i0 + diag + 1 : nk;
    return e < 0 ? 0 : e < nk ? e : nk;
}

/* Two passes a vector of 16 queries: the maxima, then the exps. The maxima pass stores the
 * scaled scores back in s (scratch), so the exps load them instead of multiplying again: the
 * exps keep the FMA pipes busy, and a multiply less is about a fourteenth of their work.
 * masked: every row's mask from visible(), none on the queries' own (the unit test's
 * reference; the same bits). */
BF16_TARGET static void fwd_avx512bf16(float *s, int64_t nq, int64_t nk, float *m, float *l,
                                       float *o, int64_t hd, int64_t ldo, float scale, int causal,
                                       int64_t diag, float *tmp, uint32_t *pw, int masked) {
    float *al = tmp;
    const __m512 sc = _mm512_set1_ps(scale);
    enum { NV = BS / 16 };
    __m512 mo[NV], mxs[NV];
    /* The maxima first, of all query vectors together over the keys all of them see in full
     * (on a block below the diagonal, every key): four chains instead of one serial chain
     * of maxima a vector; each lane still takes its keys in increasing order. */
    int64_t jc = !masked && nq == BS ? keys_full(causal, nk, diag, 0) : 0;
    for (int v = 0; v < NV; v++) {
        __mmask16 in = (__mmask16)visible(0, 0, 0, nq, 16 * v);
        mxs[v] = mo[v] = _mm512_maskz_loadu_ps(in, m + 16 * v);
    }
    for (int64_t j = 0; j < jc; j++)
        for (int v = 0; v < NV; v++) {
            __m512 x = _mm512_mul_ps(_mm512_loadu_ps(s + j * BS + 16 * v), sc);
            _mm512_storeu_ps(s + j * BS + 16 * v, x);
            mxs[v] = _mm512_max_ps(x, mxs[v]); /* x > mx ? x : mx, as the f32 piece */
        }
    for (int64_t i0 = 0; i0 < nq; i0 += 16) {
        const __mmask16 in = (__mmask16)visible(0, 0, 0, nq, i0);
        __m512 mold = mo[i0 / 16], mx = mxs[i0 / 16];
        const int64_t je = keys_seen(causal, nk, diag, i0, 16);
        const int64_t jf = masked ? 0 : keys_full(causal, nk, diag, i0);
        int64_t j = jc;
        for (; j < jf; j++) {
            __m512 x = _mm512_mul_ps(_mm512_maskz_loadu_ps(in, s + j * BS + i0), sc);
            _mm512_storeu_ps(s + j * BS + i0, x);
            mx = _mm512_mask_max_ps(mx, in, x, mx); /* x > mx ? x : mx, as the f32 piece */
        }
        for (; j < je; j++) {
            __mmask16 k = (__mmask16)visible(causal, j, diag, nq, i0);
            __m512 x = _mm512_mul_ps(_mm512_maskz_loadu_ps(k, s + j * BS + i0), sc);
            _mm512_storeu_ps(s + j * BS + i0, x);
            mx = _mm512_mask_max_ps(mx, k, x, mx);
        }
        __m512 rs = _mm512_setzero_ps();
        for (j = 0; j + 1 < jf; j += 2) {
            __m512 x0 = _mm512_maskz_loadu_ps(in, s + j * BS + i0);
            __m512 x1 = _mm512_maskz_loadu_ps(in, s + (j + 1) * BS + i0);
            __m512 e0 = _mm512_maskz_mov_ps(in, vexp_nonpos(_mm512_sub_ps(x0, mx)));
            __m512 e1 = _mm512_maskz_mov_ps(in, vexp_nonpos(_mm512_sub_ps(x1, mx)));
            rs = _mm512_add_ps(_mm512_add_ps(rs, e0), e1);
            _mm512_storeu_si512(pw + j / 2 * BS + i0, ts_attn_zip_pairs(e0, e1));
        }
        for (; j < je; j += 2) {
            __mmask16 k0 = (__mmask16)visible(causal, j, diag, nq, i0);
            __mmask16 k1 = j + 1 < nk ? (__mmask16)visible(causal, j + 1, diag, nq, i0) : 0;
            __m512 x0 = _mm512_maskz_loadu_ps(k0, s + j * BS + i0);
            __m512 x1 = _mm512_maskz_loadu_ps(k1, s + (j + 1) * BS + i0);
            __m512 e0 = _mm512_maskz_mov_ps(k0, vexp_nonpos(_mm512_sub_ps(x0, mx)));
            __m512 e1 = _mm512_maskz_mov_ps(k1, vexp_nonpos(_mm512_sub_ps(x1, mx)));
            rs = _mm512_add_ps(_mm512_add_ps(rs, e0), e1);
            _mm512_storeu_si512(pw + j / 2 * BS + i0, ts_attn_zip_pairs(e0, e1));
        }
        for (; j < nk; j += 2) _mm512_storeu_si512(pw + j / 2 * BS + i0, _mm512_setzero_si512());
        __m512 alpha = vexp_nonpos(_mm512_sub_ps(mold, mx)); /* unused at first (m = -inf) */
        __m512 lv = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(in, l + i0), alpha, rs);
        _mm512_mask_storeu_ps(l + i0, in, lv);
        _mm512_mask_storeu_ps(m + i0, in, mx);
        _mm512_mask_storeu_ps(al + i0, in, alpha);
    }
    if (o)
        for (int64_t i = 0; i < nq; i++)
            for (int64_t d = 0; d < hd; d++) o[i * ldo + d] *= al[i];
}

/* The key rows of a block and the 32 queries [i0, i0 + 32): rows [0, *full) are seen by all
 * 32 (none when they pass nq), rows [*none, nk) by none of them (causal). */
static inline void rows32(int causal, int64_t nq, int64_t nk, int64_t diag, int64_t i0,
                          int64_t *full, int64_t *none) {
    int64_t f = !causal ? nk : i0 + diag + 1, z = !causal ? nk : i0 + diag + 32;
    f = i0 + 32 > nq || f < 0 ? 0 : f < nk ? f : nk;
    *full = f, *none = z < 0 ? 0 : z < nk ? z : nk;
}

/* Tiles of 32 queries, each over all key rows: the rows every query sees run without masks
 * (on a block below the diagonal, all of them), and lse stays in registers. */
BF16_TARGET static void p_avx512bf16(float *s, int64_t nq, int64_t nk, const float *lse,
                                     float scale, int causal, int64_t diag, uint32_t *prw,
                                     int masked) {
    const __m512 sc = _mm512_set1_ps(scale);
    for (int64_t i0 = 0; i0 < nq; i0 += 32) {
        int64_t jf, jz;
        rows32(causal, nq, nk, diag, i0, &jf, &jz);
        if (masked) jf = 0;
        const __m512 la = _mm512_maskz_loadu_ps((__mmask16)visible(0, 0, 0, nq, i0), lse + i0),
                     lb = _mm512_maskz_loadu_ps((__mmask16)visible(0, 0, 0, nq, i0 + 16),
                                                lse + i0 + 16);
        int64_t j = 0;
        for (; j < jf; j++) {
            float *sj = s + j * BS;
            __m512 a = vexp(_mm512_fmsub_ps(_mm512_loadu_ps(sj + i0), sc, la));
            __m512 b = vexp(_mm512_fmsub_ps(_mm512_loadu_ps(sj + i0 + 16), sc, lb));
            _mm512_storeu_ps(sj + i0, a); /* the block is BS wide: whole vectors fit */
            _mm512_storeu_ps(sj + i0 + 16, b);
            _mm512_storeu_si512(prw + j * BP + i0 / 2, (__m512i)_mm512_cvtne2ps_pbh(b, a));
        }
        for (; j < jz; j++) {
            float *sj = s + j * BS;
            __mmask16 ka = (__mmask16)visible(causal, j, diag, nq, i0);
            __mmask16 kb = (__mmask16)visible(causal, j, diag, nq, i0 + 16);
            __m512 a = _mm512_fmsub_ps(_mm512_maskz_loadu_ps(ka, sj + i0), sc,
                                       _mm512_maskz_loadu_ps(ka, lse + i0));
            __m512 b = _mm512_fmsub_ps(_mm512_maskz_loadu_ps(kb, sj + i0 + 16), sc,
                                       _mm512_maskz_loadu_ps(kb, lse + i0 + 16));
            /* a diagonal's rows past the first 16 queries leave them all masked: no exps */
            a = ka ? _mm512_maskz_mov_ps(ka, vexp(a)) : _mm512_setzero_ps();
            b = _mm512_maskz_mov_ps(kb, vexp(b));
            _mm512_storeu_ps(sj + i0, a);
            _mm512_storeu_ps(sj + i0 + 16, b);
            _mm512_storeu_si512(prw + j * BP + i0 / 2, (__m512i)_mm512_cvtne2ps_pbh(b, a));
        }
        for (; j < nk; j++) { /* all 32 masked */
            _mm512_storeu_ps(s + j * BS + i0, _mm512_setzero_ps());
            _mm512_storeu_ps(s + j * BS + i0 + 16, _mm512_setzero_ps());
            _mm512_storeu_si512(prw + j * BP + i0 / 2, _mm512_setzero_si512());
        }
    }
}

/* ds of keys j, j + 1 (r: two) and queries [i0, i0 + 32): d[r][h] for key j + r, queries
 * i0 + 16 h; masked entries 0 (not read). */
static inline __attribute__((always_inline)) BF16_TARGET void
ds_masked(__m512 d[2][2], const float *dp, const float *p, int64_t j, int64_t i0, int two,
          int64_t nq, const float *D, __m512 sc, int causal, int64_t diag) {
    for (int r = 0; r < 2; r++)
        for (int h = 0; h < 2; h++) {
            int64_t i = i0 + 16 * h, o = (j + r) * BS + i;
            __mmask16 k = r && !two ? 0 : (__mmask16)visible(causal, j + r, diag, nq, i);
            __m512 t =
                _mm512_sub_ps(_mm512_maskz_loadu_ps(k, dp + o), _mm512_maskz_loadu_ps(k, D + i));
            t = _mm512_mul_ps(_mm512_maskz_loadu_ps(k, p + o), t);
            d[r][h] = _mm512_maskz_mul_ps(k, sc, t);
        }
}

/* Tiles of 32 queries as p_avx512bf16's, over pairs of key rows; D stays in registers. */
BF16_TARGET static void ds_avx512bf16(const float *dp, const float *p, int64_t nq, int64_t nk,
                                      const float *D, float scale, int causal, int64_t diag,
                                      uint32_t *dsrw, uint32_t *dspw, int masked) {
    const __m512 sc = _mm512_set1_ps(scale);
    for (int64_t i0 = 0; i0 < nq; i0 += 32) {
        int64_t jf, jz;
        rows32(causal, nq, nk, diag, i0, &jf, &jz);
        if (masked) jf = 0, jz = nk;
        const __m512 Dv[2] = {
            _mm512_maskz_loadu_ps((__mmask16)visible(0, 0, 0, nq, i0), D + i0),
            _mm512_maskz_loadu_ps((__mmask16)visible(0, 0, 0, nq, i0 + 16), D + i0 + 16)};
        for (int64_t j = 0; j < nk; j += 2) {
            const int two = j + 1 < nk;
            __m512 d[2][2]; /* [key j, j + 1][queries i0, i0 + 16] */
            if (j + 1 < jf) /* both rows seen by all 32 */
                for (int r = 0; r < 2; r++)
                    for (int h = 0; h < 2; h++) {
                        int64_t o = (j + r) * BS + i0 + 16 * h;
                        __m512 t = _mm512_sub_ps(_mm512_loadu_ps(dp + o), Dv[h]);
                        t = _mm512_mul_ps(_mm512_loadu_ps(p + o), t);
                        d[r][h] = _mm512_mul_ps(sc, t);
                    }
            else if (j >= jz) /* both by none: zeros */
                d[0][0] = d[0][1] = d[1][0] = d[1][1] = _mm512_setzero_ps();
            else
                ds_masked(d, dp, p, j, i0, two, nq, D, sc, causal, diag);
            _mm512_storeu_si512(dsrw + j * BP + i0 / 2,
                                (__m512i)_mm512_cvtne2ps_pbh(d[0][1], d[0][0]));
            if (two)
                _mm512_storeu_si512(dsrw + (j + 1) * BP + i0 / 2,
                                    (__m512i)_mm512_cvtne2ps_pbh(d[1][1], d[1][0]));
            _mm512_storeu_si512(dspw + j / 2 * BS + i0, ts_attn_zip_pairs(d[0][0], d[1][0]));
            _mm512_storeu_si512(dspw + j / 2 * BS + i0 + 16, ts_attn_zip_pairs(d[0][1], d[1][1]));
        }
    }
}
#endif

static void fwd_softmax(float *s, int64_t nq, int64_t nk, float *m, float *l, float *o, int64_t hd,
                        int64_t ldo, float scale, int causal, int64_t diag, float *tmp,
                        uint32_t *pw, int masked) {
#if TS_ATTN_BF16_SIMD
    if (ts_attn_has_bf16()) {
        fwd_avx512bf16(s, nq, nk, m, l, o, hd, ldo, scale, causal, diag, tmp, pw, masked);
        return;
    }
#endif
    (void)masked;
    ts_attn_fwd_block_f32(s, nq, nk, m, l, o, hd, ldo, scale, causal, diag, tmp);
    ts_attn_pack_pairs(pw, BS, s, BS, nk, nq);
}

static void bwd_p(float *s, int64_t nq, int64_t nk, const float *lse, float scale, int causal,
                  int64_t diag, uint32_t *prw, int masked) {
#if TS_ATTN_BF16_SIMD
    if (ts_attn_has_bf16()) {
        p_avx512bf16(s, nq, nk, lse, scale, causal, diag, prw, masked);
        return;
    }
#endif
    (void)masked;
    ts_attn_bwd_p_f32(s, nq, nk, lse, scale, causal, diag);
    ts_attn_pack_rows(prw, BP, s, BS, nk, nq);
}

static void bwd_ds(float *dp, const float *p, int64_t nq, int64_t nk, const float *D, float scale,
                   int causal, int64_t diag, uint32_t *dsrw, uint32_t *dspw, int masked) {
#if TS_ATTN_BF16_SIMD
    if (ts_attn_has_bf16()) {
        ds_avx512bf16(dp, p, nq, nk, D, scale, causal, diag, dsrw, dspw, masked);
        return;
    }
#endif
    (void)masked;
    if (causal) zero_masked(dp, nq, nk, causal, diag);
    ts_attn_bwd_ds_f32(dp, p, nq, nk, D, scale);
    ts_attn_pack_pairs(dspw, BS, dp, BS, nk, nq);
    ts_attn_pack_rows(dsrw, BP, dp, BS, nk, nq);
}

void ts_attn_low_fwd_softmax(float *s, int64_t nq, int64_t nk, float *m, float *l, float *o,
                             int64_t hd, int64_t ldo, float scale, int causal, int64_t diag,
                             float *tmp, uint32_t *pw) {
    fwd_softmax(s, nq, nk, m, l, o, hd, ldo, scale, causal, diag, tmp, pw, 0);
}
void ts_attn_low_bwd_p(float *s, int64_t nq, int64_t nk, const float *lse, float scale, int causal,
                       int64_t diag, uint32_t *prw) {
    bwd_p(s, nq, nk, lse, scale, causal, diag, prw, 0);
}
void ts_attn_low_bwd_ds(float *dp, const float *p, int64_t nq, int64_t nk, const float *D,
                        float scale, int causal, int64_t diag, uint32_t *dsrw, uint32_t *dspw) {
    bwd_ds(dp, p, nq, nk, D, scale, causal, diag, dsrw, dspw, 0);
}

void ts_attn_low_fwd_softmax_masked(float *s, int64_t nq, int64_t nk, float *m, float *l, float *o,
                                    int64_t hd, int64_t ldo, float scale, int causal, int64_t diag,
                                    float *tmp, uint32_t *pw) {
    fwd_softmax(s, nq, nk, m, l, o, hd, ldo, scale, causal, diag, tmp, pw, 1);
}
void ts_attn_low_bwd_p_masked(float *s, int64_t nq, int64_t nk, const float *lse, float scale,
                              int causal, int64_t diag, uint32_t *prw) {
    bwd_p(s, nq, nk, lse, scale, causal, diag, prw, 1);
}
void ts_attn_low_bwd_ds_masked(float *dp, const float *p, int64_t nq, int64_t nk, const float *D,
                               float scale, int causal, int64_t diag, uint32_t *dsrw,
                               uint32_t *dspw) {
    bwd_ds(dp, p, nq, nk, D, scale, causal, diag, dsrw, dspw, 1);
}
