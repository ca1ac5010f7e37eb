/* bench_compress.h — gradient compression against the dense all-reduce:
 * `tessel bench --workload W1|W3 --procs N --compress topk|powersgd`.
 *
 *     ts_bench_compress_options o = ts_bench_compress_options_default();
 *     o.workload = "W3";
 *     o.procs = 2;
 *     o.method = TS_COMPRESS_TOPK;          // dist.compress defaults otherwise
 *     if (ts_bench_compress_run(&o) != TS_OK) puts(ts_last_error());
 *
 * Each round runs the N processes (shm, forked, pinned) uncompressed, then
 * compressed, with the same global batch; the report gives the median step
 * times and what rank 0 sent and received per step (indices, values and
 * scales counted) against the dense gradients' bytes. */
#ifndef TESSEL_TOOLS_BENCH_COMPRESS_H
#define TESSEL_TOOLS_BENCH_COMPRESS_H

#include <stdio.h>
#include "tessel/tessel.h"

typedef struct ts_bench_compress_options {
    const char *workload;  /* W1 or W3 */
    int procs;             /* >= 2 */
    int threads;           /* per process (default 1) */
    int steps, warmup;     /* timed and untimed steps per run (default 10, 2) */
    int rounds;            /* none / compressed alternations (default 2) */
    ts_compress_options c; /* method and its settings (ratio 0.001, e4m3, rank 4 by default) */
    FILE *out;             /* the report (NULL: stdout) */
} ts_bench_compress_options;

ts_bench_compress_options ts_bench_compress_options_default(void);
ts_status ts_bench_compress_run(const ts_bench_compress_options *o);

#endif
