/* dnnl_matmul_ksplit.h — a transposed-A GEMM with a long K, summed in a fixed order (internal to
 * dnnl_matmul.c).
 *
 * Why: oneDNN 2.6's brgemm matmul splits the K reduction between threads ("nthr_k") when A is
 * transposed (weight gradients, dW = dY^T X), K >= 2048 and the threads outnumber the blocks of
 * N (times the batch): on 2 threads the GRU's dW_ih [768 x 32] over K = 8192 rows is summed as
 * two halves, on 1 thread in one pass, and the bits differ. The thread count that creates the
 * primitive decides, so the same plan gives other weights at another `train.threads`.
 *
 * What: on one thread that primitive sums K in blocks of TS_MM_KSPLIT_BLOCK (512) rows, each block
 * from zero in its own accumulators, added to C in block order, then applies the sum and add
 * post-ops. A ksplit reproduces exactly that order with any thread count: one batched primitive
 * computes the full blocks into partials [nblocks, M, N] (K = 512 each, so oneDNN never splits
 * them), a second the tail block, and the partials are added per element of C in block order
 * (threads over elements), then C_old (accumulate) and the post-op operands. The result is the
 * one-thread primitive's bits (tests/unit/dnnl_matmul.c), so only the GEMMs that oneDNN might
 * split at the creating thread count need it (ts_mm_ksplit_wanted), and plans created on one
 * thread are unchanged.
 *
 * Not used for bf16 on AMX (brg:avx512_core_amx_bf16), whose one-thread order is another (its
 * K blocks follow the shape): there the thread probe keeps the bits (dnnl_matmul_threads.h).
 *
 * Not covered: batched products (batch > 1; oneDNN splits them only when the batch times the N
 * blocks is below the thread count) and A and B both transposed; their bits may still depend on
 * the thread count above that point. */
#ifndef TS_DNNL_MATMUL_KSPLIT_H
#define TS_DNNL_MATMUL_KSPLIT_H

#include "backends/cpu/dnnl_matmul.h"

#define TS_MM_KSPLIT_BLOCK 512  /* oneDNN 2.6's K block for a transposed A */
#define TS_MM_KSPLIT_MIN   2048 /* the smallest K oneDNN 2.6 splits between threads */

typedef struct ts_mm_ksplit ts_mm_ksplit;

/* Whether `d`, created under `nthr` threads, may have its K split by oneDNN (see above). */
int ts_mm_ksplit_wanted(const ts_mm_desc *d, int nthr);

/* Create the block and tail products for `d` (label already set; `what` names it in errors). */
ts_status ts_mm_ksplit_create(const ts_mm_desc *d, const char *what, ts_mm_ksplit **out);
size_t ts_mm_ksplit_scratch_bytes(const ts_mm_ksplit *k);
/* "brg:avx512_core+ksplit": the implementation of the block product. */
const char *ts_mm_ksplit_impl(const ts_mm_ksplit *k);
/* C (+)= A*B (+ post-op operands), as ts_mm_run_post. */
ts_status ts_mm_ksplit_run(ts_mm_ksplit *k, const void *a, const void *b, void *c,
                           const void *const *post, void *scratch);
void ts_mm_ksplit_free(ts_mm_ksplit *k);

#endif
