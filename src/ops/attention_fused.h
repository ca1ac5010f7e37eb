/* attention_fused.h — the kernels of the fused attention (internal to src/ops).
 *
 * attention_fused.c holds the flash-attention kernels (f32 and f64 block
 * products, online softmax, threaded work items); attention_items_low.c the
 * work items whose block products run on bf16 operands (attention.low),
 * built from the same f32 block pieces, declared here, so the softmax and
 * the order of every sum are the f32 kernel's. The op (ops/attention.c)
 * runs them:
 *
 *     ts_attn_fwd(k);                 // attention (q, k, v) -> (o, lse)
 *     ts_attn_bwd(k);                 // attention_bwd (do, q, k, v, o, lse) -> (dq, dk, dv)
 *     ts_attn_fwd_scratch(&q, low);   // the scratch bytes each needs, q [B, H, T, hd]
 *     ts_attn_bwd_scratch(&q, low);   //   (or the packed qkv [B, T, 3, H, hd])
 *
 * Two forms, told apart by the rank of q (input 0 forward, 1 backward). Split: q, k, v, o
 * and the gradients [B, H, T, hd], each its own tensor. Packed (the qkv projection's output
 * read in place, passes/attention_qkv.c): one qkv [B, T, 3, H, hd] holds q, k and v,
 *
 *     attention (qkv) -> (o [B, T, H, hd], lse [B, H, T])
 *     attention_bwd (do [B, T, H, hd], qkv, o, lse) -> (dqkv [B, T, 3, H, hd])
 *
 * so that no slice or head permute copies them; the kernels only read and write rows
 * further apart (ts_attn_geom), with the same sums in the same order as the split form.
 *
 * With attention.low, q, k and v (or the qkv) may be bf16 (passes/qkv_low.c: the qkv
 * projection writes bf16 where only these kernels read it); o, lse and the gradients stay
 * f32 (dqkv: bf16 with attention.out_low), and the outputs have the bits of the f32 input's.
 */
#ifndef TS_ATTENTION_FUSED_H
#define TS_ATTENTION_FUSED_H

#include <stddef.h>
#include <stdint.h>
#include "kern.h"

#define TS_ATTN_BS 64 /* queries and keys per block */

/* Where the rows of one (b, h) lie: T positions of hd elements, ld_in apart in q, k and v,
 * ld_grad in dq, dk and dv (ld_in: their inputs' layout, but for the bf16 output of
 * attention_bwd_low.c, whose items write a head's gradients into scratch), ld_out in o and
 * do (all hd in the split form). */
typedef struct ts_attn_geom {
    int64_t B, H, seq, hd; /* seq: T, the positions */
    int packed;            /* q is the rank-5 qkv */
    int in_bf16;           /* q, k and v are bf16 (the bf16 items only: passes/qkv_low.c) */
    int64_t ld_in, ld_out, ld_grad;
    /* The next item's rows to prefetch while this item runs (pf_n streams, NULL-free; 0: none):
     * stream j's row r at pf[j] + r * pf_ld[j], pf_bytes[j] bytes of it. Set per item by the
     * kernels' loops (ts_attn_prefetch_add), read by the bf16 items a part at a time. */
    int pf_n;
    const char *pf[5];
    int64_t pf_ld[5], pf_bytes[5];
} ts_attn_geom;
/* The geometry of q's type (rank 4: split, rank 5: packed qkv). */
void ts_attn_geom_of(const ts_type *q, ts_attn_geom *g);
void ts_attn_geom_of_tensor(const ts_tensor *q, ts_attn_geom *g);
/* Offsets of head bh = b * H + h: in q (and dq; k and v are H * hd and 2 * H * hd further
 * in the packed form), out in o and do. */
void ts_attn_head_offsets(const ts_attn_geom *g, int64_t bh, int64_t *in, int64_t *out);
/* Add a next-item stream to g: rows ld_bytes apart from p, row_bytes of each (at most 5). */
void ts_attn_prefetch_add(ts_attn_geom *g, const void *p, int64_t ld_bytes, int64_t row_bytes);
/* Prefetch rows [seq * part / parts, seq * (part + 1) / parts) of g's next-item streams. */
void ts_attn_prefetch_part(const ts_attn_geom *g, int64_t part, int64_t parts);

/* The kernels of attention and attention_bwd (f32 with or without attention.low, f64). */
ts_status ts_attn_fwd(const ts_kargs *k);
ts_status ts_attn_bwd(const ts_kargs *k);
size_t ts_attn_fwd_scratch(const ts_type *q, int low);
size_t ts_attn_bwd_scratch(const ts_type *q, int low);

/* ---- f32 pieces (attention_fused.c), shared with the bf16 items ----------------------- */

/* Scratch slots for `items` work items, and the threads of a call over them (work =
 * B*H*T*T*hd; one thread for a small problem). */
int64_t ts_attn_slots_for(int64_t items);
int ts_attn_threads_for(int64_t slots, int64_t work);

/* Bytes of one forward / backward scratch slot of the f32 kernel (whole 64-byte lines). */
size_t ts_attn_round64(size_t bytes);
size_t ts_attn_fwd_slot_bytes(int64_t hd, size_t es);
size_t ts_attn_bwd_slot_bytes(int64_t T, int64_t hd, size_t es);
/* Online softmax over one key block of transposed scores s (see attention_fused.c); o's
 * rows ldo apart. */
void ts_attn_fwd_block_f32(float *s, int64_t nq, int64_t nk, float *m, float *l, float *o,
                           int64_t hd, int64_t ldo, float scale, int causal, int64_t diag,
                           float *tmp);
/* o /= l and lse = m + log(l) once every key block is in. */
void ts_attn_fwd_final_f32(float *o, float *lse, const float *m, const float *l, int64_t nq,
                           int64_t hd, int64_t ldo);
/* Backward: s becomes p = exp(scale * s - lse) (0 at masked keys). */
void ts_attn_bwd_p_f32(float *s, int64_t nq, int64_t nk, const float *lse, float scale, int causal,
                       int64_t diag);
/* dp becomes ds = scale * p * (dp - D). */
void ts_attn_bwd_ds_f32(float *dp, const float *p, int64_t nq, int64_t nk, const float *D,
                        float scale);
/* D[i] = sum_d do[i][d] * o[i][d], rows ldo apart. */
void ts_attn_bwd_rowdot_f32(float *D, const float *dout, const float *o, int64_t n, int64_t hd,
                            int64_t ldo);

/* ---- bf16 products (attention_items_low.c) --------------------------------------------- */

/* The query blocks [q0, q1) of one (b, h), as the f32 item, with bf16 block products. q, k
 * and v are f32, or bf16 where g->in_bf16 (their packs then only copy the bf16 halves: the
 * same words as the f32 packs of the values those round from); everything else is f32. */
void ts_attn_fwd_item_low(const void *q, const void *k, const void *v, float *o, float *lse,
                          const ts_attn_geom *g, int64_t q0, int64_t q1, float scale, int causal,
                          float *ws);
/* One (b, h) of the backward, as the f32 item, with bf16 block products. */
void ts_attn_bwd_item_low(const float *dout, const void *q, const void *k, const void *v,
                          const float *o, const float *lse, float *dq, float *dk, float *dv,
                          const ts_attn_geom *g, float scale, int causal, float *ws);
/* ts_attn_bwd_item_low calling fin(ctx, t0, n, what) once rows [t0, t0 + n) of dq (what 0)
 * or of dk and dv (what 1) are final, in increasing t0 for each. */
typedef void ts_attn_bwd_fin_fn(void *ctx, int64_t t0, int64_t n, int what);
void ts_attn_bwd_item_low_fin(const float *dout, const void *q, const void *k, const void *v,
                              const float *o, const float *lse, float *dq, float *dk, float *dv,
                              const ts_attn_geom *g, float scale, int causal, float *ws,
                              ts_attn_bwd_fin_fn *fin, void *ctx);
/* Bytes of one slot of the bf16 items: the f32 slot and the packed operands. */
size_t ts_attn_fwd_low_slot_bytes(int64_t T, int64_t hd);
size_t ts_attn_bwd_low_slot_bytes(int64_t T, int64_t hd);

/* ---- the packed backward with a bf16 dqkv (attention_bwd_low.c; attention.out_low) -------- */

/* (do, qkv, o, lse) -> (dqkv rounded to bf16, its column sums f32 [3 * H * hd]). */
ts_status ts_attn_bwd_low_out(const ts_kargs *k);
size_t ts_attn_bwd_low_out_scratch(const ts_type *q);

#endif
