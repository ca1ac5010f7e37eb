/* bench_dist.h — data-parallel training throughput: N worker processes
 * (shm, forked) against one process, W1 and W3 of shared/BENCH.md,
 * measured side by side in one run.
 *
 *     ts_bench_dist_options o = ts_bench_dist_options_default();
 *     o.workload = "W1";
 *     o.procs = 2;                      // against 1 process, same threads each
 *     ts_bench_dist_result r;
 *     if (ts_bench_dist_run(&o, &r) != TS_OK) puts(ts_last_error());
 *
 * Every round runs the single process, then the N processes, each in
 * freshly forked workers (so both sides start alike), each worker pinned
 * to its own `threads` CPUs; figures are medians of the timed steps, and
 * the ratio uses the median over rounds of each side. By default the
 * global batch is the workload's (each rank trains on batch / N rows, the
 * same update as one process); per_rank_batch keeps the workload's batch
 * on every rank instead (N times the samples per step). Each round also
 * runs the N ranks without exchanging gradients: what the machine gives N
 * processes at all, the ceiling of the data-parallel figure. With profile,
 * rank 0 of the N-process runs times every instruction and the report
 * ends with its time per op kind (last round). */
#ifndef TESSEL_TOOLS_BENCH_DIST_H
#define TESSEL_TOOLS_BENCH_DIST_H

#include <stdio.h>
#include "tessel/tessel.h"

typedef struct ts_bench_dist_options {
    const char *workload; /* W1 or W3 */
    int procs;            /* data-parallel processes (>= 2) */
    int threads;          /* per process (default 1) */
    int steps, warmup;    /* timed and untimed steps per run (default 10, 2) */
    int rounds;           /* single / N-process alternations (default 2) */
    int per_rank_batch;   /* 1: the workload's batch on every rank */
    int zero;             /* ZeRO stage of the N-process runs: 1 optimizer, 2 gradients too,
                             3 parameters too */
    double bucket_mb;     /* gradient (ZeRO-3: and parameter) bucket size in MiB (0: 25) */
    int private_params;   /* ZeRO: a copy of the parameters per process, all-gathered (default:
                             one shared copy; ts_compile_options.zero_private_params) */
    int profile;          /* print where rank 0 of the N processes spent its steps (per op) */
    FILE *out;            /* the report (NULL: stdout) */
} ts_bench_dist_options;

ts_bench_dist_options ts_bench_dist_options_default(void);

typedef struct ts_bench_dist_result {
    const char *unit;           /* samples/s or tokens/s */
    double single, multi;       /* throughput, median over rounds */
    double single_ms, multi_ms; /* median step time */
    double ratio;               /* multi / single */
    double compute_only;        /* the N ranks without gradient exchange */
} ts_bench_dist_result;

ts_status ts_bench_dist_run(const ts_bench_dist_options *o, ts_bench_dist_result *r);

/* The workload one rank trains: W1 (gpt 0) or W3 (gpt 1) at rank_batch
 * rows, with BENCH.md's AdamW settings; into g, m and spec. Shared by the
 * data-parallel and the compression benchmarks. */
ts_status ts_bench_dist_workload(ts_graph *g, int gpt, int64_t rank_batch, ts_model *m,
                                 ts_train_spec *spec);
/* Rank `rank`'s synthetic batch of that workload (the same on every run). */
ts_status ts_bench_dist_batch(int gpt, int64_t rank_batch, int rank, void *x, void *y);

#endif
