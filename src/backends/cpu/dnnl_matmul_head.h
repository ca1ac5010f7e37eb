/* dnnl_matmul_head.h — how ts_mm_create runs large one-thread bf16 GEMMs: a language model
 * head's three, the layers' input gradients and their products with a residual add
 * (internal to dnnl_matmul.c).
 *
 * Why: W3's tied head (vocabulary 8192, d 512, 2048 tokens) ran below the layers' GEMMs on one
 * Zen 5 thread (oneDNN 2.6.3, brg:avx512_core_bf16; bench_ceiling: fwd 492, dX 461, dW 468
 * GFLOP/s, the layers 484-516). Measured alone (a standalone probe, CPU time, 20-30 alternated
 * reps; then bench/gemm_head.c: 5.8 and 6.6 ms in two runs, docs/benchmarks.md), three changes win
 * back about 6 ms of the head's ~107 ms a step:
 *
 *   - fwd, logits = x W^T (M 2048, N 8192, K 512, B stored [N, K]) and dX = dlogits W (M 2048,
 *     N 512, K 8192): oneDNN repacks a plain B into its blocked layout inside the product, as
 *     it goes (not measured apart). Packing B once per run into oneDNN's own layout (a reorder into
 * the scratch, ~1 ms for 4 Mi elements) and then running the product with that packed B in blocks
 * of 512 rows (pointer offsets into A and C) took fwd 33.8 -> 31.7 ms and dX 35.1 -> 31.7 ms,
 *     reorder included in neither (it costs ~1 ms each).
 *   - dW = dlogits^T x (M 8192, N 512, K 2048, A stored [K, M]) with the embedding's gradient as a
 *     full-size add post-op: oneDNN's binary post-op costs ~2.5 ms on this shape, the product
 *     without it followed by one pass C += P ~1.2 ms less (39.4 -> 38.2 and 37.8 -> 36.6 ms).
 *
 * Session 22 carried two of them to the layers' GEMMs (a standalone probe alternating the plain
 * and the planned product, 21 reps each, medians, the host's noise a few percent):
 *
 *   - the input gradients dX = dY W of W3's fc, c_proj and qkv (B 1 Mi, 1 Mi, 768 Ki elements,
 *     not transposed) with a packed B in 512-row blocks: 0.974, 0.981, 0.986 of the plain
 *     product's time (9.50 -> 9.26 ms for fc's); the attention projection's (256 Ki) 0.996, so
 *     it stays plain; the forward products (B transposed) measured 0.99-1.09 then, the oneDNN
 *     reorder into the packed layout costing 0.2-1.0 ms of it;
 *   - the forward products with a residual add (fc2: M 2048, N 512, K 2048; the attention
 *     projection, K 512) as the product with its bias, then C += residual in one pass: 0.972
 *     and 0.910 (10.10 -> 9.82 ms, 2.68 -> 2.44 ms). Running the product in row blocks and
 *     adding each block while it is in cache measured the same as one pass after the whole.
 *
 * Session 26 packs a transposed B with tessel's own loops where the primitive chose the layout
 * they write (dnnl_matmul_pack.h: 0.04-0.34 ms for W3's weights, against the reorder's 0.21-1.1),
 * and with that the forward products with a bias (qkv with its bf16 C, fc, fc2's product before its
 * residual) take a packed B too: 0.967-0.983 of the plain product alone; in W3's bf16 step the
 * forward products' sum 158.9 -> 154.6 ms (four alternated 4-step traces; docs/benchmarks.md).
 *
 * Bits: none change. A row block is the same rows of the same product (brgemm on AVX-512 sums
 * each element over K in an order that depends on K only: dnnl_matmul.h), a packed B holds the
 * same values, and C = AB + P rounds once either way; with a bias, oneDNN rounds the product plus
 * the bias and then that plus the add: the same two roundings as the product with its bias
 * followed by the pass (tests/unit/dnnl_matmul_head.c compares each path with the plain
 * primitive bit for bit on W3's shapes, on 1 and 2 threads).
 *
 * Scope: bf16 x bf16 -> f32 (or -> bf16 with one bias), batch 1, where oneDNN serves bf16 with
 * brgemm without AMX (the thresholds below are the measured shapes' neighbourhood; products with
 * a B under 512 Ki elements, such as the attention projection's, stay plain primitives, and the
 * weight gradients take no packed B). On AMX or another ISA nothing changes.
 *
 * One thread only (products created for one): on 2 threads of the same (shared, load average
 * 12) machine the plan measured slower, process CPU time +4 to +18 ms a product, wall time
 * too; each row block and the reorder is a parallel region of its own, and a loaded machine
 * makes every region's barrier wait for a descheduled thread. Not measurable there with
 * confidence, so plans for more threads keep the plain primitives (issue #25's open target is
 * the one-thread step). */
#ifndef TS_DNNL_MATMUL_HEAD_H
#define TS_DNNL_MATMUL_HEAD_H

#include <dnnl.h>
#include "backends/cpu/dnnl_matmul.h"

#define TS_MM_PACK_FWD_MIN_ELEMS   (INT64_C(1) << 19) /* a transposed B (X W^T) packed: 512 Ki */
#define TS_MM_PACK_DX_MIN_ELEMS    (INT64_C(1) << 19) /* a plain B (dX = dY W) packed: 512 Ki */
#define TS_MM_POST_AFTER_MIN_ELEMS (INT64_C(1) << 20) /* C with adds applied after: 1 Mi */
#define TS_MM_HEAD_MIN_ROWS        1024               /* rows that reuse a packed B enough */
#define TS_MM_HEAD_ROW_BLOCK       512                /* rows of A and C per run of the product */

typedef struct ts_mm_head_plan {
    int pack_b;         /* reorder B into oneDNN's layout once per run */
    int64_t row_blocks; /* run the product on M / row_blocks rows at a time (1: whole) */
    int post_after;     /* run with the bias only, then the adds in one pass */
} ts_mm_head_plan;

/* The plan for `d` created for `nthr` threads (all zero / 1 block: a plain primitive). The caller
 * checks the ISA. */
ts_mm_head_plan ts_mm_head_plan_for(const ts_mm_desc *d, int nthr);

/* For tests and benches: 0 makes ts_mm_head_plan_for plan nothing (the plain primitives, for
 * an A/B comparison), 1 (the default) restores it. Not thread-safe: set it between creations. */
void ts_mm_head_enable(int on);

/* C[e] += post[0][e] + post[1][e] ..., in that order, for C's M x N f32 elements (every post-op
 * of `d` a full-size add), threaded over elements. */
void ts_mm_head_add_posts(const ts_mm_desc *d, float *c, const void *const *post);

/* A packed B: tessel's packer (dnnl_matmul_pack.h) for a transposed B where the primitive chose
 * the layout it writes, else a oneDNN reorder from the caller's layout into the primitive's. */
typedef struct ts_mm_packed_b {
    int own;                  /* set: ts_mm_pack_bt, no reorder */
    int64_t K, N, Kp, Np;     /* its sizes (B [K, N] stored [N, K], padded to Kp x Np) */
    dnnl_primitive_t reorder; /* NULL (and own 0): no packed B */
    dnnl_memory_t plain, rs;  /* the caller's B; the reorder's scratchpad, or NULL */
    size_t packed_bytes;      /* the packed B, 64-byte rounded */
    size_t rs_bytes;          /* the reorder's scratchpad */
} ts_mm_packed_b;

/* Fill `p` (zeroed) for the primitive `pd` created with B "any", the caller's B described by
 * `md_b` (stored [N, K] when trans_b); *packed gets the packed B's memory (no buffer; the caller
 * owns it). On failure *call names the oneDNN call (p may be partly filled: ts_mm_packed_b_free
 * it). */
dnnl_status_t ts_mm_packed_b_create(ts_mm_packed_b *p, const_dnnl_primitive_desc_t pd,
                                    const dnnl_memory_desc_t *md_b, int trans_b, dnnl_engine_t eng,
                                    dnnl_memory_t *packed, const char **call);
/* Pack the caller's `b` into `dst` (64-byte aligned, packed_bytes + rs_bytes), the buffer of
 * `packed`, on `stream`. */
dnnl_status_t ts_mm_packed_b_run(ts_mm_packed_b *p, dnnl_memory_t packed, const void *b, char *dst,
                                 dnnl_stream_t stream);
void ts_mm_packed_b_free(ts_mm_packed_b *p);

#endif
