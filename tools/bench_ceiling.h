/* bench_ceiling.h — the GEMM ceiling of a benchmark workload: oneDNN's
 * matmul (the primitive tessel's `matmul` runs) timed alone on the shapes of
 * the workload's linear layers, forward and backward, in the step's compute
 * type, so a step's GFLOP/s can be read as a share of what its GEMMs could
 * reach in the same run on the same machine:
 *
 *     ts_bench_ceiling c;
 *     if (ts_bench_gemm_ceiling("W3", TS_BF16, 2, &c) == TS_OK)
 *         printf("%.1f GFLOP/s over %d shapes\n", c.gflops, c.n_shapes);
 *
 * Shapes (nn.Linear layers, weight [out, in], M rows of activations):
 * forward X·Wᵀ, input gradient dY·W (not for a layer fed by the data),
 * weight gradient dYᵀ·X, each weighted by how often a step runs it. W1
 * and W3 only: the others' time is in convolutions, recurrences or sparse
 * products. The ceiling is the total FLOP of those GEMMs over their total
 * time (median of a few runs each, after a warm-up), through oneDNN's own C
 * API (the matmul primitive tessel's kernel creates; tools do not include
 * src/). */
#ifndef TESSEL_TOOLS_BENCH_CEILING_H
#define TESSEL_TOOLS_BENCH_CEILING_H

#include <stdio.h>
#include "tessel/tessel.h"

typedef struct ts_bench_ceiling {
    double gflops;  /* total FLOP / total time */
    double flops;   /* FLOP of one step's linear-layer GEMMs */
    double seconds; /* their time at the measured rates */
    int n_shapes;   /* distinct shapes timed */
    char impl[64];  /* oneDNN implementation of the largest shape */
} ts_bench_ceiling;

/* TS_ERR_UNSUPPORTED for a workload without a shape list or a type other
 * than f32 and bf16; `threads` as the plan runs. */
ts_status ts_bench_gemm_ceiling(const char *workload, ts_dtype dt, int threads,
                                ts_bench_ceiling *c);
/* The same, printing each shape's time and GFLOP/s to `out` (NULL: quiet). */
ts_status ts_bench_gemm_ceiling_print(const char *workload, ts_dtype dt, int threads,
                                      ts_bench_ceiling *c, FILE *out);

#endif
