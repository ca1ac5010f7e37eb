/* bench_cuda.h — `tessel bench --backend cuda`: training steps of W1, W3 or
 * GPT-2 124M on the GPU, with the figures of issue #17 (docs/cuda.md).
 *
 *     ts_bench_cuda_options o = ts_bench_cuda_options_default();
 *     o.workload = "gpt2-124m";
 *     o.precision = "bf16";
 *     if (ts_bench_cuda_run(&o) != TS_OK) puts(ts_last_error());
 *
 * Runs `steps` timed steps twice, the step replayed as one CUDA graph and
 * launched kernel by kernel (compile.no_cuda_graph), and prints for each:
 * the median step time, throughput, the host's launch cost per step and
 * the step-to-step jitter (standard deviation of the step times), then the
 * kernels per step and the GPU's memory, utilisation and power (NVML).
 * With profile, three more steps run with every instruction timed by CUDA
 * events (no graph) and the time per op kind is printed, slowest first. */
#ifndef TESSEL_TOOLS_BENCH_CUDA_H
#define TESSEL_TOOLS_BENCH_CUDA_H
#include <stdio.h>
#include "tessel/tessel.h"

typedef struct ts_bench_cuda_options {
    const char *workload;  /* W1, W3 or gpt2-124m (batch 16, context 1024) */
    const char *precision; /* fp32 or bf16 (matmuls on bf16 operands, f32 accumulation) */
    int steps;             /* timed steps per mode (default 100) */
    int warmup;            /* untimed steps first (default 5; the first captures the graph) */
    const char *json_path; /* append one JSON line of the figures (NULL: none) */
    FILE *out;             /* the report (NULL: stdout) */
    int profile;           /* then 3 more steps with every instruction timed: time per op */
} ts_bench_cuda_options;

ts_bench_cuda_options ts_bench_cuda_options_default(void);
ts_status ts_bench_cuda_run(const ts_bench_cuda_options *o);

#endif
