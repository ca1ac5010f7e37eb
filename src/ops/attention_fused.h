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
 *     ts_attn_bwd_scratch(&q, low);
 */
#ifndef TS_ATTENTION_FUSED_H
#define TS_ATTENTION_FUSED_H

#include <stddef.h>
#include <stdint.h>
#include "kern.h"

#define TS_ATTN_BS 64 /* queries and keys per block */

/* The kernels of attention and attention_bwd (f32 with or without attention.low, f64). */
ts_status ts_attn_fwd(const ts_kargs *k);
ts_status ts_attn_bwd(const ts_kargs *k);
size_t ts_attn_fwd_scratch(const ts_type *q, int low);
size_t ts_attn_bwd_scratch(const ts_type *q, int low);

/* ---- f32 pieces (attention_fused.c), shared with the bf16 items ----------------------- */

/* Bytes of one forward / backward scratch slot of the f32 kernel (whole 64-byte lines). */
size_t ts_attn_round64(size_t bytes);
size_t ts_attn_fwd_slot_bytes(int64_t hd, size_t es);
size_t ts_attn_bwd_slot_bytes(int64_t T, int64_t hd, size_t es);
/* dst[d * BS + i] = src[i * hd + d] for i < n. */
void ts_attn_transpose_f32(float *dst, const float *src, int64_t n, int64_t hd);
/* Online softmax over one key block of transposed scores s (see attention_fused.c). */
void ts_attn_fwd_block_f32(float *s, int64_t nq, int64_t nk, float *m, float *l, float *o,
                           int64_t hd, float scale, int causal, int64_t diag, float *tmp);
/* o /= l and lse = m + log(l) once every key block is in. */
void ts_attn_fwd_final_f32(float *o, float *lse, const float *m, const float *l, int64_t nq,
                           int64_t hd);
/* Backward: s becomes p = exp(scale * s - lse) (0 at masked keys). */
void ts_attn_bwd_p_f32(float *s, int64_t nq, int64_t nk, const float *lse, float scale, int causal,
                       int64_t diag);
/* dp becomes ds = scale * p * (dp - D). */
void ts_attn_bwd_ds_f32(float *dp, const float *p, int64_t nq, int64_t nk, const float *D,
                        float scale);
/* D[i] = sum_d do[i][d] * o[i][d]. */
void ts_attn_bwd_rowdot_f32(float *D, const float *dout, const float *o, int64_t n, int64_t hd);

/* ---- bf16 products (attention_items_low.c) --------------------------------------------- */

/* One query block [q0, q0 + nq) of one (b, h), as the f32 item, with bf16 block products. */
void ts_attn_fwd_item_low(const float *q, const float *k, const float *v, float *o, float *lse,
                          int64_t T_, int64_t hd, int64_t q0, float scale, int causal, float *ws);
/* One (b, h) of the backward, as the f32 item, with bf16 block products. */
void ts_attn_bwd_item_low(const float *dout, const float *q, const float *k, const float *v,
                          const float *o, const float *lse, float *dq, float *dk, float *dv,
                          int64_t T_, int64_t hd, float scale, int causal, float *ws);
/* Bytes of one slot of the bf16 items: the f32 slot and the packed operands. */
size_t ts_attn_fwd_low_slot_bytes(int64_t hd);
size_t ts_attn_bwd_low_slot_bytes(int64_t T, int64_t hd);

#endif
