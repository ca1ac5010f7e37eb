/* bench/step.c — training-step throughput of the benchmark workloads, with
 * PyTorch measured side by side in the same run: the same code as
 * `tessel bench` (tools/bench_step.c, built into this program too), kept for `make bench`.
 *
 *   build/bench_step [--workload W1|W3] [--steps N] [--threads T] [--compare-torch]
 *                    [--reference PATH/torch_bench.py]
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "bench_step.h"

int main(int argc, char **argv) {
    ts_bench_options o = ts_bench_options_default();
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--workload") && i + 1 < argc)
            o.workload = argv[++i];
        else if (!strcmp(argv[i], "--steps") && i + 1 < argc)
            o.steps = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--threads") && i + 1 < argc)
            o.threads = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--reference") && i + 1 < argc)
            o.reference = argv[++i];
        else if (!strcmp(argv[i], "--compare-torch"))
            o.compare_torch = 1;
        else {
            fprintf(stderr,
                    "usage: %s [--workload W1|W3] [--steps N] [--threads T] "
                    "[--compare-torch] [--reference torch_bench.py]\n",
                    argv[0]);
            return 2;
        }
    }
    ts_bench_result r;
    if (ts_bench_run(&o, &r) != TS_OK) {
        fprintf(stderr, "bench_step: %s\n", ts_last_error());
        return 1;
    }
    return 0;
}
