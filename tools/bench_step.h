/* bench_step.h — training-step benchmarks of the shared/BENCH.md workloads, with
 * the PyTorch reference measured side by side in the same run.
 *
 *     ts_bench_options o = ts_bench_options_default();
 *     o.workload = "W1";
 *     o.compare_torch = 1;                  // alternate tessel and torch_bench.py
 *     ts_bench_result r;
 *     if (ts_bench_run(&o, &r) != TS_OK) puts(ts_last_error());
 *
 * Prints (to o.out) the median step time, throughput, peak RSS and the
 * share of step time in GEMM kernels, and with compare_torch the
 * reference's figures and the ratio. Machines are shared and noisy: the
 * ratio from one run is the claim, never absolute times across days.
 */
#ifndef TESSEL_TOOLS_BENCH_H
#define TESSEL_TOOLS_BENCH_H

#include <stdio.h>
#include "tessel/tessel.h"

typedef struct ts_bench_options {
    const char *workload;  /* W1..W5 or gpt2-124m (no PyTorch reference) */
    const char *precision; /* fp32, bf16 or fp16: the matmuls' compute type (docs/precision.md);
                              the reference runs bf16 autocast for bf16 (W1: fp32) */
    int steps;             /* timed steps per round (default 10) */
    int warmup;            /* untimed steps before the first round (default 2) */
    int threads;           /* default 2, as in BENCH.md */
    int profile;           /* also print the kernels that took the most time */
    int no_fuse;           /* compile without fusion (ts_compile_options.no_fuse) */
    int fused_update;  /* optim.fused_update: each parameter updated once its gradient is done */
    int compare_torch; /* run the reference too, alternating with tessel */
    int rounds;        /* tessel/reference alternations with compare_torch (default 2) */
    const char *reference;  /* torch_bench.py (default ../shared/reference/torch_bench.py) */
    const char *python;     /* interpreter (default /usr/bin/python3, which sees Debian's torch;
                               ../shared/reference/torch2-python runs torch 2.x) */
    const char *torch_mode; /* one torch_bench.py mode (bench_torch.h; NULL: from precision) */
    int torch_best;         /* run every mode of the precision the interpreter supports and
                               compare with the fastest */
    double torch_min_time;  /* seconds the reference times per run (default 5) */
    const char *json_path;  /* append the results as one JSON line (NULL: none) */
    FILE *out;              /* the report (NULL: stdout) */
} ts_bench_options;

ts_bench_options ts_bench_options_default(void);

typedef struct ts_bench_side {
    double step_ms, throughput, rss_mb; /* median step; per second of `unit`; peak RSS */
    int steps;                          /* timed steps (tessel) or reference runs */
} ts_bench_side;

typedef struct ts_bench_result {
    const char *unit;            /* samples/s, tokens/s or epochs/s */
    ts_bench_side tessel, torch; /* torch: the fastest mode run (torch_mode) */
    int has_torch;
    const char *torch_mode; /* the mode `torch` is of */
    char torch_version[32]; /* "" unless probed (--torch-mode / --torch-best) */
    int n_modes;            /* modes run, each with its medians */
    const char *modes[5];   /* TS_TORCH_N_MODES */
    ts_bench_side mode_sides[5];
    double loss_first, loss_last;
    double gemm_share; /* share of the step's kernel time spent in GEMMs */
    double compile_s;
    double ceiling_gflops; /* W1/W3 fp32/bf16: oneDNN GEMM on their shapes (bench_ceiling.h) */
    /* with --compare-torch and 2 rounds or more: each round's own ratio, in round order (the
     * fastest mode's step of the round over tessel's median step of it; the first 64 rounds) */
    int n_round_ratios;
    double round_ratios[64];
    ts_plan_stats stats;
} ts_bench_result;

ts_status ts_bench_run(const ts_bench_options *o, ts_bench_result *r);

#endif
