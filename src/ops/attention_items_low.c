/* The fused attention's work items with bf16 block products (attention.low,
 * set by the precision pass in bf16 plans; f32 tensors, but for q, k and v, which
 * may be bf16: passes/qkv_low.c): the blocks,
 * order and f32 online softmax of the f32 items (attention_fused.c, whose
 * block pieces these call), but every block product rounds its operands to
 * bf16, packs them as pairs along the reduction axis and accumulates in f32
 * on AVX512-BF16's vdpbf16ps (attention_low.h, attention_low.c). */
#include <math.h>
#include "ops/attention_fused.h"
#include "ops/attention_low.h"

#define BS TS_ATTN_BS

/* The packed bf16 operands of a low slot, in 32-bit words after its f32 part. Forward: q^T
 * pairs [hd/2][BS], k rows [T][hd/2] and v pairs [T/2][hd] of the whole head, p pairs
 * [BS/2][BS]. Backward: q^T and do^T pairs [hd/2][BS], q and do pairs [BS/2][hd], k pairs
 * [T/2][hd], k and v rows [T][hd/2] of the whole head, p and ds rows [BS][BS/2], ds pairs
 * [BS/2][BS]. k and v are packed once per head (an item is a whole head): a key block's
 * operands then are read and rounded once, not once per query block that sees it. */
static size_t low_words(int64_t T, int64_t hd, int fwd) {
    int64_t hp = (hd + 1) / 2, BP = BS / 2, TP = (T + 1) / 2;
    return (size_t)(fwd ? hp * BS + T * hp + TP * hd + BP * BS
                        : 2 * hp * BS + 2 * BP * hd + TP * hd + 2 * T * hp + 2 * BS * BP + BP * BS);
}
/* The f32 part of a slot is the f32 kernel's without its transposed blocks (hd 0): q^T and
 * do^T are packed from the rows directly (ts_attn_pack_rows_t). */
size_t ts_attn_fwd_low_slot_bytes(int64_t T, int64_t hd) {
    return ts_attn_fwd_slot_bytes(0, sizeof(float)) +
           ts_attn_round64(low_words(T, hd, 1) * sizeof(uint32_t));
}
size_t ts_attn_bwd_low_slot_bytes(int64_t T, int64_t hd) {
    return ts_attn_bwd_slot_bytes(T, 0, sizeof(float)) +
           ts_attn_round64(low_words(T, hd, 0) * sizeof(uint32_t));
}

/* A whole block on the causal diagonal (query block = key block): the products take it in
 * strips of QS keys or queries, each against the queries or keys it sees: 10 of the block's
 * 16 QS x QS squares (those on or below the diagonal) instead of all 16. The terms skipped
 * are the masked entries' exact zeros (p and ds are 0 there), so every output keeps its bits
 * (up to the sign of an output that is exactly zero). */
#define QS 16
static int diag_full(int causal, int64_t q0, int64_t k0, int64_t nq, int64_t nk) {
    return causal && q0 == k0 && nq == BS && nk == BS;
}

/* s^T = k q^T for one block pair (rows of kw hp words apart; qw [hp][BS]); on a full diagonal
 * block keys [t, t + QS) against queries [t, BS) only (the other entries are masked, and left
 * as they were). */
static void scores_t(float *s, int64_t nq, int64_t nk, int64_t hp, const uint32_t *kw,
                     const uint32_t *qw, int diag) {
    if (!diag) {
        ts_attn_mm_bf16(nk, nq, hp, kw, hp, 1, qw, BS, s, BS, 0);
        return;
    }
    for (int64_t t = 0; t < BS; t += QS)
        ts_attn_mm_bf16(QS, BS - t, hp, kw + t * hp, hp, 1, qw + t, BS, s + t * BS + t, BS, 0);
}

/* C [nq rows][hd] (+)= a^T b over key pairs: a [nk/2][BS] pairs of key rows (of p or ds, one
 * column per query), b [nk/2][hd] (v or k pairs). Diagonal: queries [s, s + QS) see keys
 * [0, s + QS). */
static void by_keys(float *c, int64_t ldc, int64_t nq, int64_t nk, int64_t hd, const uint32_t *a,
                    const uint32_t *b, int acc, int diag) {
    if (!diag) {
        ts_attn_mm_bf16(nq, hd, (nk + 1) / 2, a, 1, BS, b, hd, c, ldc, acc);
        return;
    }
    for (int64_t s = 0; s < BS; s += QS)
        ts_attn_mm_bf16(QS, hd, (s + QS) / 2, a + s, 1, BS, b, hd, c + s * ldc, ldc, acc);
}

/* C [nk rows][hd] (+)= a b over query pairs: a [nk][BS/2] rows (of p or ds, pairs along the
 * queries), b [nq/2][hd] (do or q pairs). Diagonal: keys [s, s + QS) are seen by queries
 * [s, BS). */
static void by_queries(float *c, int64_t ldc, int64_t nq, int64_t nk, int64_t hd, const uint32_t *a,
                       const uint32_t *b, int acc, int diag) {
    const int64_t BP = BS / 2;
    if (!diag) {
        ts_attn_mm_bf16(nk, hd, (nq + 1) / 2, a, BP, 1, b, hd, c, ldc, acc);
        return;
    }
    for (int64_t s = 0; s < BS; s += QS)
        ts_attn_mm_bf16(QS, hd, (BS - s) / 2, a + s * BP + s / 2, BP, 1, b + s / 2 * hd, hd,
                        c + s * ldc, ldc, acc);
}

/* q, k and v: their row r, and the three packs of n rows of hd values (f32, or bf16 where
 * g->in_bf16: the bf16 packs, the same words without a conversion). */
static const void *in_row(const ts_attn_geom *g, const void *p, int64_t r) {
    return (const char *)p + (size_t)(r * g->ld_in) * (g->in_bf16 ? 2 : 4);
}
static void rows_in(const ts_attn_geom *g, uint32_t *dst, int64_t ldd, const void *src, int64_t n) {
    if (g->in_bf16)
        ts_attn_pack_rows_bf16(dst, ldd, src, g->ld_in, n, g->hd);
    else
        ts_attn_pack_rows(dst, ldd, src, g->ld_in, n, g->hd);
}
static void pairs_in(const ts_attn_geom *g, uint32_t *dst, int64_t ldd, const void *src,
                     int64_t n) {
    if (g->in_bf16)
        ts_attn_pack_pairs_bf16(dst, ldd, src, g->ld_in, n, g->hd);
    else
        ts_attn_pack_pairs(dst, ldd, src, g->ld_in, n, g->hd);
}
static void rows_t_in(const ts_attn_geom *g, uint32_t *dst, int64_t ldd, const void *src,
                      int64_t n) {
    if (g->in_bf16)
        ts_attn_pack_rows_t_bf16(dst, ldd, src, g->ld_in, n, g->hd);
    else
        ts_attn_pack_rows_t(dst, ldd, src, g->ld_in, n, g->hd);
}

/* fwd_item_f32 with bf16 products: the same blocks, online softmax and f32 output. */
void ts_attn_fwd_item_low(const void *q, const void *k, const void *v, float *o, float *lse,
                          const ts_attn_geom *g, int64_t q0, int64_t q1, float scale, int causal,
                          float *ws) {
    const int64_t hd = g->hd, lo = g->ld_out, hp = (hd + 1) / 2;
    const int64_t nkeys = causal ? q1 : g->seq; /* the keys these query blocks see */
    float *s = ws, *m = s + BS * BS, *l = m + BS, *tmp = l + BS;
    uint32_t *qw = (uint32_t *)((char *)ws + ts_attn_fwd_slot_bytes(0, sizeof(float)));
    uint32_t *kw = qw + hp * BS, *vw = kw + g->seq * hp, *pw = vw + (g->seq + 1) / 2 * hd;
    rows_in(g, kw, hp, k, nkeys);  /* kw[j][d/2] */
    pairs_in(g, vw, hd, v, nkeys); /* vw[j/2][d] */
    /* the key blocks this item runs: the next item's rows are prefetched in as many parts, one
     * before each block's products (W3 bf16: attention 15.2 -> 14.1 ms a step, bench/step_ab.sh;
     * all of them at the item's start measured no gain: more than the core keeps in flight) */
    int64_t steps = 0, step = 0;
    for (int64_t a = q0; a < q1; a += BS)
        steps += ((causal ? (a + BS < q1 ? a + BS : q1) : g->seq) + BS - 1) / BS;
    for (; q0 < q1; q0 += BS) {
        int64_t nq = q1 - q0 < BS ? q1 - q0 : BS, kend = causal ? q0 + nq : g->seq;
        float *ob = o + q0 * lo;
        for (int64_t i = 0; i < nq; i++) m[i] = -INFINITY, l[i] = 0;
        rows_t_in(g, qw, BS, in_row(g, q, q0), nq); /* qw[d/2][i] */
        for (int64_t k0 = 0; k0 < kend; k0 += BS) {
            int64_t nk = kend - k0 < BS ? kend - k0 : BS;
            int diag = diag_full(causal, q0, k0, nq, nk);
            if (g->pf_n) ts_attn_prefetch_part(g, step++, steps);
            scores_t(s, nq, nk, hp, kw + k0 * hp, qw, diag);
            ts_attn_low_fwd_softmax(s, nq, nk, m, l, k0 ? ob : NULL, hd, lo, scale, causal, q0 - k0,
                                    tmp, pw);                                /* p as pw[j/2][i] */
            by_keys(ob, lo, nq, nk, hd, pw, vw + k0 / 2 * hd, k0 > 0, diag); /* o += p v */
        }
        ts_attn_fwd_final_f32(ob, lse + q0, m, l, nq, hd, lo);
    }
}

/* bwd_item_f32 with bf16 products: the same blocks and order, p, ds and D in f32. */
void ts_attn_bwd_item_low(const float *dout, const void *q, const void *k, const void *v,
                          const float *o, const float *lse, float *dq, float *dk, float *dv,
                          const ts_attn_geom *g, float scale, int causal, float *ws) {
    ts_attn_bwd_item_low_fin(dout, q, k, v, o, lse, dq, dk, dv, g, scale, causal, ws, NULL, NULL);
}

/* The same, calling fin as rows of the gradients become final: dq rows of a query block
 * after its last key block, dk and dv rows of a key block after the last query block (which
 * sees every key block), each in increasing position. */
void ts_attn_bwd_item_low_fin(const float *dout, const void *q, const void *k, const void *v,
                              const float *o, const float *lse, float *dq, float *dk, float *dv,
                              const ts_attn_geom *g, float scale, int causal, float *ws,
                              ts_attn_bwd_fin_fn *fin, void *ctx) {
    /* lg: the gradients' rows (their inputs' layout, or the bf16 output's scratch) */
    const int64_t T_ = g->seq, hd = g->hd, lo = g->ld_out, lg = g->ld_grad;
    const int64_t hp = (hd + 1) / 2, BP = BS / 2;
    float *p = ws, *ds = p + BS * BS, *D = ds + BS * BS;
    uint32_t *qw = (uint32_t *)((char *)ws + ts_attn_bwd_slot_bytes(T_, 0, sizeof(float)));
    uint32_t *dow = qw + hp * BS, *qpw = dow + hp * BS, *dopw = qpw + BP * hd;
    uint32_t *kpw = dopw + BP * hd, *kw = kpw + (T_ + 1) / 2 * hd, *vw = kw + T_ * hp;
    uint32_t *prw = vw + T_ * hp, *dsrw = prw + BS * BP, *dspw = dsrw + BS * BP;
    ts_attn_bwd_rowdot_f32(D, dout, o, T_, hd, lo);
    rows_in(g, kw, hp, k, T_);   /* k:  [j][d/2] */
    rows_in(g, vw, hp, v, T_);   /* v:  [j][d/2] */
    pairs_in(g, kpw, hd, k, T_); /* k:  [j/2][d] */
    int64_t steps = 0, step = 0; /* the key blocks: the prefetch's parts, as in the forward */
    for (int64_t a = 0; a < T_; a += BS)
        steps += ((causal ? (a + BS < T_ ? a + BS : T_) : T_) + BS - 1) / BS;
    for (int64_t q0 = 0; q0 < T_; q0 += BS) {
        int64_t nq = T_ - q0 < BS ? T_ - q0 : BS, kend = causal ? q0 + nq : T_;
        const void *qb = in_row(g, q, q0);
        const float *dob = dout + q0 * lo;
        float *dqb = dq + q0 * lg;
        rows_t_in(g, qw, BS, qb, nq);                  /* q^T:  [d/2][i] */
        ts_attn_pack_rows_t(dow, BS, dob, lo, nq, hd); /* do^T: [d/2][i] */
        pairs_in(g, qpw, hd, qb, nq);                  /* q:    [i/2][d] */
        ts_attn_pack_pairs(dopw, hd, dob, lo, nq, hd);
        for (int64_t k0 = 0; k0 < kend; k0 += BS) {
            int64_t nk = kend - k0 < BS ? kend - k0 : BS;
            float *dkb = dk + k0 * lg, *dvb = dv + k0 * lg;
            int diag = diag_full(causal, q0, k0, nq, nk);
            if (g->pf_n) ts_attn_prefetch_part(g, step++, steps);
            scores_t(p, nq, nk, hp, kw + k0 * hp, qw, diag);
            ts_attn_low_bwd_p(p, nq, nk, lse + q0, scale, causal, q0 - k0, prw);
            int first_q = q0 == (causal ? k0 : 0);
            by_queries(dvb, lg, nq, nk, hd, prw, dopw, !first_q, diag); /* dv += p^T do */
            scores_t(ds, nq, nk, hp, vw + k0 * hp, dow, diag);          /* dp^T = v do^T */
            ts_attn_low_bwd_ds(ds, p, nq, nk, D + q0, scale, causal, q0 - k0, dsrw, dspw);
            by_keys(dqb, lg, nq, nk, hd, dspw, kpw + k0 / 2 * hd, k0 > 0, diag); /* dq += ds k */
            by_queries(dkb, lg, nq, nk, hd, dsrw, qpw, !first_q, diag);          /* dk += ds^T q */
            if (fin && q0 + nq == T_) fin(ctx, k0, nk, 1);
        }
        if (fin) fin(ctx, q0, nq, 0);
    }
}
