/* attention_low.h — the bf16 products of the fused attention (internal).
 *
 * With attention.low = 1 (the precision pass sets it in bf16 plans) the
 * attention kernels (attention_items_low.c) keep their f32 tensors, f32 softmax
 * and f32 accumulators, and run every block product (q k^T and p v forward;
 * q k^T, p^T do, v do^T, ds k and ds^T q backward) on operands rounded to
 * bf16 (round to nearest even, as the cast op). The operands are packed as
 * 32-bit words holding two bf16 values adjacent along the reduction axis
 * (the lower half the even index), which is what AVX512-BF16's vdpbf16ps
 * multiplies pairwise into f32 lanes:
 *
 *     ts_attn_pack_rows(kw, hdp, k, hd, nk, hd);      // kw[j][d/2]: pairs along a row
 *     ts_attn_pack_pairs(vw, hd, v, hd, nk, hd);      // vw[j/2][d]: pairs of rows
 *     ts_attn_pack_rows_t(qw, BS, q, hd, nq, hd);     // qw[d/2][i]: rows' pairs, transposed
 *     ts_attn_mm_bf16(M, N, KP, A, sam, sak, B, ldb, C, ldc, acc);
 *
 * An odd reduction length is padded with a zero bf16, so the packed length
 * is (n + 1) / 2 words. */
#ifndef TS_ATTENTION_LOW_H
#define TS_ATTENTION_LOW_H

#include <stdint.h>

/* dst[r * ldd + c / 2] for r < n rows, c < cols: src[r * lds + c] paired along the row. */
void ts_attn_pack_rows(uint32_t *dst, int64_t ldd, const float *src, int64_t lds, int64_t n,
                       int64_t cols);

/* dst[(r / 2) * ldd + c] for r < n rows, c < cols: rows 2p and 2p + 1 of src paired. */
void ts_attn_pack_pairs(uint32_t *dst, int64_t ldd, const float *src, int64_t lds, int64_t n,
                        int64_t cols);

/* dst[(c / 2) * ldd + r] for r < n rows, c < cols: src[r * lds + c] paired along the row, as
 * ts_attn_pack_rows, with the words transposed (a block's q^T or do^T pairs for the products
 * of scores, read from its rows without an f32 transpose: half the bytes moved). */
void ts_attn_pack_rows_t(uint32_t *dst, int64_t ldd, const float *src, int64_t lds, int64_t n,
                         int64_t cols);

/* The same three packs of bf16 values (q, k and v from a qkv projection that writes bf16,
 * passes/qkv_low.c): the words the f32 packs make of the f32 values these round from, with
 * no conversion (rows: a copy; pairs: two rows' halves interleaved; rows_t: the row words
 * transposed). */
void ts_attn_pack_rows_bf16(uint32_t *dst, int64_t ldd, const uint16_t *src, int64_t lds, int64_t n,
                            int64_t cols);
void ts_attn_pack_pairs_bf16(uint32_t *dst, int64_t ldd, const uint16_t *src, int64_t lds,
                             int64_t n, int64_t cols);
void ts_attn_pack_rows_t_bf16(uint32_t *dst, int64_t ldd, const uint16_t *src, int64_t lds,
                              int64_t n, int64_t cols);

/* C[m * ldc + n] = (acc ? C[m * ldc + n] : 0) + sum over p < KP of the two products of
 * the pair A[m * sam + p * sak] with the pair B[p * ldb + n], for m < M, n < N, in
 * increasing p, accumulated in f32: vdpbf16ps on CPUs with AVX512-BF16, else the same
 * products in plain C (the same up to the last bits and denormals, which vdpbf16ps flushes). */
void ts_attn_mm_bf16(int64_t M, int64_t N, int64_t KP, const uint32_t *A, int64_t sam, int64_t sak,
                     const uint32_t *B, int64_t ldb, float *C, int64_t ldc, int acc);

/* The softmax pieces of the bf16 items (attention_softmax_low.c): attention_fused.h's f32
 * block pieces on a transposed score block s [nk][BS] (key j, query i), each writing the
 * packed operands of the products that follow it; masked entries are exact zeros. */
/* Forward: the online softmax of fwd_block_f32 (m, l, o rescaled; tmp: BS floats); p only as
 * pw[j/2][i] (BS words a row); s is scratch (the generic path leaves p in it). */
void ts_attn_low_fwd_softmax(float *s, int64_t nq, int64_t nk, float *m, float *l, float *o,
                             int64_t hd, int64_t ldo, float scale, int causal, int64_t diag,
                             float *tmp, uint32_t *pw);
/* Backward: s becomes p = exp(scale * s - lse), also written as rows prw[j][i/2] (BS/2). */
void ts_attn_low_bwd_p(float *s, int64_t nq, int64_t nk, const float *lse, float scale, int causal,
                       int64_t diag, uint32_t *prw);
/* Backward: ds = scale * p * (dp - D) as rows dsrw[j][i/2] (BS/2 words a row) and pairs
 * dspw[j/2][i] (BS); dp's masked entries are not read (the generic path zeroes them). */
void ts_attn_low_bwd_ds(float *dp, const float *p, int64_t nq, int64_t nk, const float *D,
                        float scale, int causal, int64_t diag, uint32_t *dsrw, uint32_t *dspw);
/* The three with every key row's mask computed, none of the maskless rows (those every query
 * of a vector sees; on a block below the diagonal, all): the unit test's reference, which the
 * pieces match bit for bit. */
void ts_attn_low_fwd_softmax_masked(float *s, int64_t nq, int64_t nk, float *m, float *l, float *o,
                                    int64_t hd, int64_t ldo, float scale, int causal, int64_t diag,
                                    float *tmp, uint32_t *pw);
void ts_attn_low_bwd_p_masked(float *s, int64_t nq, int64_t nk, const float *lse, float scale,
                              int causal, int64_t diag, uint32_t *prw);
void ts_attn_low_bwd_ds_masked(float *dp, const float *p, int64_t nq, int64_t nk, const float *D,
                               float scale, int causal, int64_t diag, uint32_t *dsrw,
                               uint32_t *dspw);

#endif
