/* bench_fp8 — FP8 conversion throughput: the reference encoder
 * (ts_fp8_from_f32, one element at a time) against the branch-free batch
 * encoder (ts_fp8_encode_f32), and the quantize / fake_quant ops in a plan.
 * Prints the median of 7 runs of each, measured side by side.
 *
 *     build/bench_fp8 [N]        (default N = 4194304 elements)
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "core/core.h"
#include "tessel/quant.h"
#include "tessel/tessel.h"

enum { REPS = 7 };

static int cmp(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static ts_plan *op_plan(int fake, int64_t n) {
    ts_graph *g = ts_graph_new();
    ts_val x = ts_input(g, "x", TS_F32, 1, &n);
    ts_val s = ts_scalar(g, 0.01, TS_F32);
    ts_val y = fake ? ts_fake_quant(g, x, s, TS_F8E4M3, 0) : ts_quantize(g, x, s, TS_F8E4M3, 0);
    ts_plan *p = NULL;
    if (ts_mark_output(g, y, "y") != TS_OK || ts_compile(g, NULL, NULL, &p) != TS_OK)
        fprintf(stderr, "bench_fp8: %s\n", ts_last_error());
    ts_graph_free(g);
    return p;
}

int main(int argc, char **argv) {
    int64_t n = argc > 1 ? atoll(argv[1]) : 4194304;
    float *x = malloc((size_t)n * 4);
    uint8_t *q = malloc((size_t)n), *r = malloc((size_t)n);
    if (!x || !q || !r) return 1;
    for (int64_t i = 0; i < n; i++) x[i] = (float)(sin(0.001 * (double)i) * 500.0);
    ts_plan *pq = op_plan(0, n), *pf = op_plan(1, n);
    if (!pq || !pf) return 1;
    ts_plan_set_input(pq, "x", x, (size_t)n * 4);
    ts_plan_set_input(pf, "x", x, (size_t)n * 4);
    double t[4][REPS];
    for (int k = 0; k < REPS; k++) {
        double t0 = ts_now();
        for (int64_t i = 0; i < n; i++) r[i] = ts_fp8_from_f32(x[i], TS_F8E4M3, 1);
        double t1 = ts_now();
        ts_fp8_encode_f32(q, x, n, TS_F8E4M3, 1);
        double t2 = ts_now();
        ts_plan_step(pq);
        double t3 = ts_now();
        ts_plan_step(pf);
        double t4 = ts_now();
        t[0][k] = t1 - t0, t[1][k] = t2 - t1, t[2][k] = t3 - t2, t[3][k] = t4 - t3;
    }
    if (memcmp(q, r, (size_t)n)) {
        fprintf(stderr, "bench_fp8: batch and reference encoders differ\n");
        return 1;
    }
    const char *names[4] = {"reference ts_fp8_from_f32 (1 thread)",
                            "batch ts_fp8_encode_f32 (1 thread)", "quantize op (plan)",
                            "fake_quant op (plan)"};
    double med[4];
    for (int j = 0; j < 4; j++) {
        qsort(t[j], REPS, sizeof(double), cmp);
        med[j] = t[j][REPS / 2];
        printf("%-40s %8.2f ms  %8.1f Melem/s\n", names[j], 1e3 * med[j], n / med[j] / 1e6);
    }
    printf("batch / reference speed-up: %.1fx (f32 -> e4m3, %lld elements, median of %d)\n",
           med[0] / med[1], (long long)n, REPS);
    ts_plan_free(pq);
    ts_plan_free(pf);
    free(x);
    free(q);
    free(r);
    return 0;
}
