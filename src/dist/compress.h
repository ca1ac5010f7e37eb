/* compress.h — the arithmetic of gradient compression (internal): top-k
 * selection, the encoding of the sent values and the payload one rank
 * sends per bucket, and PowerSGD's orthogonalisation. Pure functions on
 * host memory; the ops in src/ops/compress.c call them, tests/unit/compress.c
 * checks them.
 *
 * Top-k payload of one rank for one bucket (ts_topk_payload_bytes(k)):
 *   f32 scale | u32 k | k u32 indices (ascending) | k values (1, 2 or 4 bytes each) | 0 pad to 4
 * A value v is sent as code = enc(v / scale) and received as
 * q = dec(code) * scale, scale a power of two (fp8: the largest sent |v|
 * fits the format's range; bf16 and f32: 1), so both are exact. The sender
 * keeps v - q in its residual; q lies within a factor of 2 of v or is 0,
 * so v - q is exact (Sterbenz) and q + (v - q) == v bit for bit. */
#ifndef TS_DIST_COMPRESS_H
#define TS_DIST_COMPRESS_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

enum { TS_TOPK_HIST = 65536 }; /* u32 counters in each of the two histograms */
enum { TS_TOPK_HEADER = 8 };

/* The key top-k ranks by: the f32 bits of |x|, monotone in |x|, NaN above
 * inf. ts_topk_select and the fused start (topk_fused.c) share it, so both
 * pick the same indices. */
static inline uint32_t ts_topk_key(float x) {
    uint32_t u;
    memcpy(&u, &x, 4);
    return u & 0x7fffffffu;
}

/* Bytes of one value (ts_compress_values: e4m3, e5m2 1; bf16 2; f32 4). */
int ts_topk_value_bytes(int values);
/* The share of elements sent at step (1-based): ratio, or during the
 * warm-up (step <= warmup) a geometric fall from 0.25 to ratio. */
double ts_topk_ratio_at(double ratio, int64_t warmup, int64_t step);
/* k = ceil(share * n), in [1, n]. */
int64_t ts_topk_k(int64_t n, double share);
/* The payload of k values, a multiple of 4 bytes. */
size_t ts_topk_payload_bytes(int64_t k, int values);

/* The k indices (ascending) of the k largest |x[i]| of x[0..n), ties
 * broken by the lower index; NaN counts as largest. hist: 2 *
 * TS_TOPK_HIST u32 of scratch. Radix select on the f32 bits of |x|, so
 * O(n) and deterministic. */
void ts_topk_select(const float *x, int64_t n, int64_t k, uint32_t *hist, uint32_t *idx);

/* One bucket's error-feedback accumulation (ts_topk_accumulate_select):
 * its gradients g[0..n_seg) of len[s] elements, flat in that order over
 * res and vel (elems elements; vel NULL without momentum correction). */
typedef struct ts_topk_accum {
    const float *const *g;
    const int64_t *len;
    int n_seg;
    float *res, *vel;
    int64_t elems;
    float inv, clip_scale, momentum; /* 1 / loss scale, local clipping's factor, m */
    int64_t k_final;                 /* k after the warm-up: sizes the candidates */
} ts_topk_accum;

/* Scratch bytes of ts_topk_accumulate_select for a bucket of elems
 * elements whose k is k_final after the warm-up; the candidates it holds. */
size_t ts_topk_fused_scratch(int64_t elems, int64_t k_final);
int64_t ts_topk_fused_cap(int64_t elems, int64_t k_final);

/* res += g * inv * clip_scale (with momentum correction through vel first:
 * vel = momentum * vel + that, res += vel), then the k largest |res| into
 * idx, ascending: the indices ts_topk_select on the updated res gives, bit
 * for bit, for any k (steps of the warm-up above k_final take the full
 * select). Returns the sum of the updated res^2, the same bits for any
 * thread count. One pass over the bucket when the sampled threshold holds
 * (src/dist/topk_fused.c); *searched (may be NULL): the entries the
 * selection ran on, the candidates then, else elems. */
double ts_topk_accumulate_select(const ts_topk_accum *a, int64_t k, void *scratch, uint32_t *idx,
                                 int64_t *searched);

/* Encode acc[idx[0..k)] into payload and leave in acc what was not sent
 * (acc[i] -= q exactly). Returns the sum of q^2 (what was sent). */
double ts_topk_encode(float *acc, const uint32_t *idx, int64_t k, int values, void *payload);
/* Value j (0-based) of a payload: *index and the received q. */
void ts_topk_decode_at(const void *payload, int values, int64_t j, uint32_t *index, float *q);
/* k of a payload (its header). */
int64_t ts_topk_payload_k(const void *payload);
/* Loss scaling: the payload of a rank whose gradients were not finite
 * (an overflow; the step will be skipped): k zero values at indices
 * 0..k-1 under a NaN scale, which ts_topk_payload_skipped recognises. */
void ts_topk_encode_skipped(int64_t k, int values, void *payload);
int ts_topk_payload_skipped(const void *payload);

/* Local gradient clipping (DGC), for both methods: the factor (at most 1)
 * that brings the norm of n_seg segments' values, each multiplied by inv
 * (1 / the loss scale, or 1), down to clip / sqrt(ranks); 1 when clip is
 * not positive. The sum of squares runs in double, in segment order. */
float ts_compress_clip_scale(const float *const *seg, const int64_t *len, int n_seg, float inv,
                             double clip, int ranks);

/* PowerSGD: whether a gradient of this shape is compressed (rank >= 2,
 * at least min_elems elements and, with max_elems > 0, at most max_elems, r below both sides
 * of its matrix view [dims[0], the rest]); *n and *m: that view. */
int ts_psgd_matrix(int rank, const int64_t *dims, int64_t min_elems, int64_t max_elems, int r,
                   int64_t *n, int64_t *m);

/* PowerSGD: orthonormalise the r columns of p [n, r] (row-major) in
 * place by modified Gram-Schmidt in double; a column that vanishes
 * becomes zero. */
void ts_psgd_orthonormalise(float *p, int64_t n, int r);

#endif
