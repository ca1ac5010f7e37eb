/* dnnl_matmul.h — (batched) GEMM on the CPU through the oneDNN matmul primitive.
 *
 * The primitive is created once, when a plan is built, and then run many times
 * on different buffers. A run allocates no buffers of its own: the temporary
 * space oneDNN needs ("scratchpad") comes from the caller, typically its arena.
 *
 *     ts_mm_desc d = {.a_dt = TS_F32, .b_dt = TS_F32, .c_dt = TS_F32,
 *                     .batch = 1, .M = 256, .N = 1024, .K = 2048,
 *                     .trans_b = 1, .label = "fc1"};
 *     ts_mm *mm;
 *     if (ts_mm_create(&d, &mm) != TS_OK) return ...;   // ts_last_error() says why
 *     void *scratch = arena_alloc(ts_mm_scratch_bytes(mm));  // may be 0 bytes
 *     for (...)
 *         ts_mm_run(mm, a, b, c, scratch);              // C = A * B^T
 *     ts_mm_free(mm);
 *
 * Layouts (all row-major, densely packed, no copies are made for transposes):
 *   A: [batch, M, K], or [batch, K, M] with trans_a;  [M, K] / [K, M] with a_broadcast
 *   B: [batch, K, N], or [batch, N, K] with trans_b;  [K, N] / [N, K] with b_broadcast
 *   C: [batch, M, N]
 * `accumulate` computes C += A*B (C is read), otherwise C = A*B.
 *
 * Types: f32 x f32 -> f32, and bf16 x bf16 -> f32 or bf16 (accumulation in f32).
 * f32 runs in strict f32 (no implicit down-conversion, whatever the environment).
 *
 * Threads: oneDNN (OpenMP build) fixes a primitive's thread count, and with it
 * its blocking and scratchpad size, when the primitive is created: ts_mm_create
 * uses omp_get_max_threads() of the calling thread (ts_mm_threads()). A run uses
 * min(that count, the caller's omp_get_max_threads()) threads, and one thread
 * inside an OpenMP parallel region (nested parallelism off, the default). So build plans under the
 * thread count they will run with: a ts_mm created under 1 thread always runs on 1. Determinism
 * (oneDNN 2.6.3, avx512_core / avx512_core_bf16 kernels, measured by
 * tests/unit/dnnl_matmul.c): each element of C is reduced over K in a fixed order that depends
 * on K only, so results are bit-identical for any thread count at creation or at run time, and
 * run to run. oneDNN does split K between threads for a transposed A with K >= 2048 when the
 * threads outnumber the blocks of N; ts_mm_create then runs the product in K blocks summed in
 * its one-thread order instead (dnnl_matmul_ksplit.h; impl "...+ksplit"), batch 1 only. AMX
 * (bf16 on Intel Xeon with amx_bf16, brg:avx512_core_amx_bf16) is another story: there the
 * creating thread count picks how K is blocked, for any layout (gpt's dX 2048 x 1536 . 1536 x 512
 * differs between 1 and 2 threads), so ts_mm_create probes every AMX product whatever its size
 * (dnnl_matmul_threads.h) and replaces a thread-sensitive one by one-thread products over row
 * blocks run in parallel where that gives the one-thread bits (dnnl_matmul_rows.h; impl
 * "...+rows"), else by the one-thread primitive ("...+1thr"). On a CPU without AVX512-BF16, oneDNN
 * serves bf16 x bf16 with its gemm:jit driver, which does split K by thread count; there
 * ts_mm_create builds an f32 primitive instead and a run widens A and B (and a bf16/f16 C) into its
 * scratch (exact: bf16/f16 products are exact in f32); ts_mm_impl() then ends in "+f32" (also where
 * oneDNN has no bf16 kernel at all: AVX2). Without AVX-512, f32 goes to oneDNN's gemm:jit driver,
 * whose kernel and K split follow the thread count; ts_mm_create probes every product created for
 * more than one thread against the same product created for one, and one that differs runs the
 * one-thread primitive on one thread (dnnl_matmul_threads.h; impl "...+1thr"). The K blocks above
 * are used only where oneDNN uses brgemm (AVX-512 and up), whose one-thread order they reproduce.
 * An LM head's large bf16 GEMMs (W3's logits, dX and dW on brgemm without AMX, created for one
 * thread) run with B packed
 * into oneDNN's layout once per run and in blocks of rows, or with their add post-ops after the
 * product (dnnl_matmul_head.h; impl "...+packb+rows512", "...+postadd"): same bits, faster.
 *
 * Scratch is only used during a run: any number of ts_mm may share one buffer
 * of the largest ts_mm_scratch_bytes as long as they do not run concurrently.
 * Concurrency: ts_mm_create/ts_mm_free may be called from any thread. Runs are
 * not: a ts_mm holds the buffer pointers of its current run, and all runs share
 * one oneDNN stream, so call ts_mm_run from one thread at a time (it
 * parallelizes internally).
 */
#ifndef TS_DNNL_MATMUL_H
#define TS_DNNL_MATMUL_H

#include <stddef.h>
#include <stdint.h>
#include "tessel/dtype.h"
#include "tessel/status.h"

typedef struct ts_mm_desc {
    ts_dtype a_dt, b_dt, c_dt; /* f32,f32,f32 or bf16,bf16,{f32,bf16} */
    int64_t batch;             /* >= 1 */
    int64_t M, N, K;           /* >= 1 */
    int trans_a, trans_b;      /* A stored [K, M], B stored [N, K] */
    int b_broadcast;           /* B has no batch dim: shared by every batch */
    int a_broadcast;           /* A has no batch dim: shared by every batch (not with b's) */
    int accumulate;            /* C += A*B instead of C = A*B */
    /* Post-ops on C, in order (not with accumulate; f32 C, or a bf16 / f16 C with one
     * TS_MM_POST_BIAS: the f32 accumulator plus the bias, rounded once to nearest even):
     * TS_MM_POST_BIAS adds a row [N] to every row, TS_MM_POST_ADD adds a tensor of C's shape.
     * Their operands are passed to ts_mm_run_post in the order of the adds. */
    int n_post;
    int post[4];
    const char *label; /* names the op in error messages (copied); may be NULL */
} ts_mm_desc;

typedef struct ts_mm ts_mm;

/* Create the oneDNN primitive for `d` using omp_get_max_threads() threads.
 * Fails with TS_ERR_SHAPE / TS_ERR_UNSUPPORTED on a bad descriptor and with
 * the oneDNN status name in the message when oneDNN refuses it. */
ts_status ts_mm_create(const ts_mm_desc *d, ts_mm **out);

/* Bytes of scratch memory ts_mm_run needs (0 if none); any alignment works,
 * 64-byte alignment is best. */
size_t ts_mm_scratch_bytes(const ts_mm *m);

/* Run C = A*B (or C += A*B). `scratch` may be NULL when ts_mm_scratch_bytes
 * is 0. The buffers must not overlap C. Allocates nothing. */
ts_status ts_mm_run(ts_mm *m, const void *a, const void *b, void *c, void *scratch);

/* ts_mm_run with the operands of the descriptor's add post-ops (post[k] for
 * the k-th add, in order). */
ts_status ts_mm_run_post(ts_mm *m, const void *a, const void *b, void *c, const void *const *post,
                         void *scratch);

enum { TS_MM_POST_BIAS = 1, TS_MM_POST_ADD = 2 };

void ts_mm_free(ts_mm *m);

/* Internal (dnnl_matmul_rows.c): give `m` a oneDNN stream of its own, so that it may run at the
 * same time as other ts_mm (each with its own scratch) from another thread. */
ts_status ts_mm_own_stream(ts_mm *m);

/* Whether computing a product in chunks of rows (M) gives every row its bits of the whole product
 * (passes/chunk_ce.c relies on it): yes where oneDNN 2.6 serves f32 with brgemm (AVX-512 and up),
 * whose K order depends on K only; no on AVX2, where gemm:jit picks its kernel from M too (W3's
 * head, 2048 x 8192 . 8192 x 512, in chunks of 128 to 512 rows changes most elements; 1024 not). */
int ts_mm_row_chunks_exact(void);

/* The oneDNN implementation chosen, e.g. "brg:avx512_core" or "gemm:jit". */
const char *ts_mm_impl(const ts_mm *m);
/* The thread count the primitive was created for (and always runs with). */
int ts_mm_threads(const ts_mm *m);
/* The descriptor (with label pointing to the ts_mm's own copy). */
const ts_mm_desc *ts_mm_get_desc(const ts_mm *m);

/* Reference kernels: naive loops, OpenMP over rows of C, results independent
 * of the thread count. Same layouts and flags as ts_mm_run (the dtypes in `d`
 * are ignored). ts_mm_ref_f32 accumulates each dot product in double, in
 * increasing k, then rounds once (so it is also a good f32 oracle). */
ts_status ts_mm_ref_f32(const ts_mm_desc *d, const float *a, const float *b, float *c);
ts_status ts_mm_ref_f64(const ts_mm_desc *d, const double *a, const double *b, double *c);

#endif
