/* dnnl_matmul_threads.h — does a matmul's result depend on the run-time thread count? (internal
 * to dnnl_matmul.c)
 *
 * Why: without AVX-512, oneDNN 2.6 serves f32 matmul with its gemm:jit driver, which picks its
 * kernel ("nocopy" or packing) and whether to split the K reduction between threads from the
 * thread count it finds at each run (gemm_driver.cpp: nocopy_checker_avx2, calc_nthr_nocopy_avx).
 * Small and long-K products (e.g. 4x2048 . 2048x64) then sum in another order on 2 threads than
 * on 1, so the same plan trains other weights at another `train.threads`.
 *
 * What: when a matmul is created for T > 1 threads, ts_mm_create also creates the same product
 * for one thread and runs both once on fixed pseudo-random operands: the one-thread primitive on
 * one thread, the plan's primitive on T threads and on one. Any difference ("thread-sensitive";
 * batched gemm:jit products also differ by the creating thread count) and the plan gets the
 * one-thread primitive, which then always runs on one thread (ts_mm_run sets
 * omp_set_num_threads(1) around the call and restores it): its one-thread bits for any thread
 * count. The others are untouched, so where oneDNN is already thread-independent (AVX-512)
 * nothing changes. A probe asks oneDNN directly instead of mirroring its rules, so it also holds
 * for other ISAs and oneDNN versions. Verdicts are cached per shape, implementation and T for the
 * process (a cached verdict costs one primitive creation and no runs).
 *
 * AMX: oneDNN 2.6.3's brg:avx512_core_amx_bf16 blocks K by the thread count it is created for,
 * at any size and layout (2048 x 1536 . 1536 x 512: 593199 of 1048576 elements differ between 1
 * and 2 threads; the running thread count changes nothing). So every product whose implementation
 * names AMX is probed, however many multiply-adds (the operand limit below still holds), and a
 * sensitive one first tries a row split (dnnl_matmul_rows.h), which keeps the threads, and gets
 * the one-thread primitive only where that split is not exact either. The probes cost plan
 * creation time, once per shape and process: in bench_gemm (2 threads, load average 16 on 2
 * cores) creating gpt's bf16 products took 450-1670 ms each instead of 1-27 ms, mlp1's 110-270
 * ms instead of about 1 ms.
 *
 * Limits: products above TS_MM_PROBE_MAX_MACS multiply-adds (batch * M * N * K; not for AMX) or
 * with an operand above TS_MM_PROBE_MAX_ELEMS elements are not probed (treated as
 * thread-independent): a probe costs three runs and the operands' memory. Their bits may still
 * depend on the thread count (on an AVX2 EPYC, none of the sizes tried above the limit did; the
 * long-K weight gradients that AVX-512 brgemm splits are dnnl_matmul_ksplit.h's). Small products
 * lose little on one thread. */
#ifndef TS_DNNL_MATMUL_THREADS_H
#define TS_DNNL_MATMUL_THREADS_H

#include "backends/cpu/dnnl_matmul.h"

#define TS_MM_PROBE_MAX_MACS  (INT64_C(1) << 28)
#define TS_MM_PROBE_MAX_ELEMS (INT64_C(1) << 24)

/* Whether `m`, created for `nthr` threads, is probed: nthr > 1, not inside a parallel region,
 * and within the limits above. */
int ts_mm_probe_wanted(const ts_mm *m, int nthr);
/* The cached verdict for `m`'s shape, implementation and `nthr`: 1 sensitive, 0 not, -1 unknown. */
int ts_mm_probe_cached(const ts_mm *m, int nthr);
/* Set *sensitive to 1 when `mt` (created for `nthr` threads, not marked one-thread) gives other
 * bits on `nthr` threads, or on one, than `m1` (the same product created for one thread) on one
 * thread; else 0. Caches the verdict. Fails only when a run fails or memory runs out. */
ts_status ts_mm_probe_threads(ts_mm *mt, ts_mm *m1, int nthr, int *sensitive);

#endif
