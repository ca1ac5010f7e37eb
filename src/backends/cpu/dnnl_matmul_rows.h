/* dnnl_matmul_rows.h — a GEMM as one-thread products over blocks of rows of C, run in parallel
 * (internal to dnnl_matmul.c).
 *
 * Why: on AMX (Intel Xeon, oneDNN 2.6.3, brg:avx512_core_amx_bf16) the bf16 brgemm matmul picks
 * its blocking of K from the thread count it is created for: gpt's dX = dY W, 2048 x 1536 .
 * 1536 x 512, created for 2 threads sums K in another order than created for 1 (593199 of
 * 1048576 elements differ; the running thread count changes nothing). The thread probe
 * (dnnl_matmul_threads.h) catches such products, but its fallback, the one-thread primitive,
 * gives up the second thread.
 *
 * What: `nthr` products created for one thread, block t computing rows [M*t/nthr, M*(t+1)/nthr)
 * of C from the same rows of A (row-major A: a pointer offset, no copy) and all of B, run as an
 * OpenMP loop over the blocks (one oneDNN stream each; each block's scratch is its own slice of
 * the caller's). A block's bits do not depend on how many threads run the loop (one block is one
 * one-thread product), so they equal the one-thread whole product exactly when a one-thread
 * product's rows do not depend on how many rows it gets. That holds for some shapes only (2048 x
 * 512 . K 1536 in halves: yes; 256 x 1024 . K 2048 in halves: no, oneDNN blocks K by M too), so
 * ts_mm_create uses a row split only where the thread probe found the plain primitive
 * thread-sensitive and then found the row split equal to the one-thread product on its operands;
 * elsewhere the one-thread primitive remains. impl: "<block impl>+rows".
 *
 * Why this design (evaluated on the AMX Xeon, 2 threads): (1) the one-thread primitive alone is
 * exact but gives up the second thread; (2) extending dnnl_matmul_ksplit.h to AMX would mean
 * mirroring oneDNN's AMX K blocking, which follows M and N as well as K and the thread count
 * (its 512-row K blocks gave other bits than AMX's one-thread order: dW 384 x 448 over K 2560,
 * 127203 of 172032 elements), so it would break on other shapes and releases; (3) the row split
 * asks oneDNN, like the probe, and keeps the threads. bench/gemm_threads.c measures it (2
 * threads, GFLOP/s relative to the plain thread-sensitive 2-thread primitive, two runs of 7
 * interleaved reps, load average 10 on 2 cores, the process got 45-50% of them): gpt's dX, row
 * split 0.97 and 0.98, one-thread primitive 0.61 and 0.57; the GRU's dW_ih (N = 32, A gathered)
 * row split 0.65 and 0.70, one-thread 0.44 and 0.93 (noisy: a product tessel leaves plain
 * measured 0.94 and 1.31 of the same oneDNN primitive there).
 *
 * Covered: batch 1, at least one row per block; any B layout, accumulate, bias and add post-ops
 * (an add operand's rows are offset like C's). A transposed A (stored [K, M], weight gradients)
 * has its block's columns gathered into the block's scratch first (K x rows elements, small
 * next to the block's K x rows x N multiply-adds): oneDNN 2.6 serves a strided A with gemm:jit
 * only. Used for AMX products only (finish_create in dnnl_matmul.c). */
#ifndef TS_DNNL_MATMUL_ROWS_H
#define TS_DNNL_MATMUL_ROWS_H

#include "backends/cpu/dnnl_matmul.h"

#define TS_MM_ROWS_MAX_BLOCKS 64

typedef struct ts_mm_rows ts_mm_rows;

/* Whether `d` can be split into `nthr` row blocks (see Covered above). */
int ts_mm_rows_wanted(const ts_mm_desc *d, int nthr);
/* Create the `nthr` one-thread block products for `d` (`what` names it in errors). */
ts_status ts_mm_rows_create(const ts_mm_desc *d, int nthr, const char *what, ts_mm_rows **out);
size_t ts_mm_rows_scratch_bytes(const ts_mm_rows *r);
/* "brg:avx512_core_amx_bf16+rows": the implementation of the first block. */
const char *ts_mm_rows_impl(const ts_mm_rows *r);
/* C (+)= A*B (+ post-op operands), as ts_mm_run_post: blocks in parallel on up to `nthr` threads
 * (the caller's omp_get_max_threads() at most; one inside a parallel region). */
ts_status ts_mm_rows_run(ts_mm_rows *r, const void *a, const void *b, void *c,
                         const void *const *post, void *scratch);
void ts_mm_rows_free(ts_mm_rows *r);

#endif
