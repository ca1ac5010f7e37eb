/* bench/norm_fuse.c — W1's training step with and without the activation +
 * layer norm fusion (passes/fuse_norm.c; compile.no_fuse_norm), fp32 and
 * bf16: the operand bytes per step of each plan (each instruction's
 * distinct inputs and outputs, ts_plan_stats.operand_bytes_per_step) and
 * the step time, the two plans alternated step by step so that both see
 * the same machine load; prints the median of each and the median of the
 * per-pair ratios. Also checks that both plans end with the same weights.
 *
 *   build/bench_norm_fuse [--steps N] [--threads T] [--precision fp32|bf16|both]
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include "tessel/tessel.h"

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

static ts_plan *compile_w1(int no_norm, int threads, ts_dtype compute, size_t *bytes, int *n_ins) {
    ts_mlp_config mc = ts_mlp_w1();
    ts_graph *g = ts_graph_new();
    ts_model m;
    if (ts_build_mlp(g, &mc, &m) != TS_OK) {
        fprintf(stderr, "build: %s\n", ts_last_error());
        exit(1);
    }
    ts_train_spec spec = ts_train_spec_default(m.loss);
    spec.opt = ts_adamw(1e-3, 0.9, 0.999, 1e-8, 0.01);
    ts_compile_options o = ts_compile_options_default();
    o.seed = 1;
    o.threads = threads;
    o.no_fuse_norm = no_norm;
    o.precision.compute = compute;
    ts_plan *p;
    ts_status s = ts_compile(g, &spec, &o, &p);
    ts_graph_free(g);
    if (s != TS_OK) return NULL; /* bf16 without AVX512-BF16/AMX: oneDNN has no GEMM */
    ts_plan_stats st;
    ts_plan_get_stats(p, &st);
    *bytes = st.operand_bytes_per_step;
    *n_ins = st.n_instructions;
    return p;
}

static void feed(ts_plan *p, int step, float *x, float *y, size_t nx, size_t ny) {
    unsigned s = (unsigned)step * 7919u + 1u;
    for (size_t i = 0; i < nx; i++) x[i] = (float)rand_r(&s) / (float)RAND_MAX - 0.5f;
    for (size_t i = 0; i < ny; i++) y[i] = (float)rand_r(&s) / (float)RAND_MAX;
    ts_plan_set_input(p, "x", x, nx * sizeof *x);
    ts_plan_set_input(p, "y", y, ny * sizeof *y);
}

static int same_weights(ts_plan *a, ts_plan *b) {
    int n = ts_plan_param_count(a), same = n == ts_plan_param_count(b);
    for (int i = 0; i < n && same; i++) {
        const char *name = ts_plan_param_name(a, i);
        int rank;
        int64_t dims[8];
        ts_plan_value_info(a, name, NULL, &rank, dims);
        size_t bytes = sizeof(float);
        for (int d = 0; d < rank; d++) bytes *= (size_t)dims[d];
        float *pa = malloc(bytes), *pb = malloc(bytes);
        same = ts_plan_read(a, name, pa, bytes) == TS_OK &&
               ts_plan_read(b, name, pb, bytes) == TS_OK && !memcmp(pa, pb, bytes);
        free(pa);
        free(pb);
    }
    return same;
}

static void run(int steps, int threads, ts_dtype compute, const char *label) {
    size_t bytes[2];
    int n_ins[2];
    ts_plan *p[2] = {compile_w1(0, threads, compute, &bytes[0], &n_ins[0]), NULL};
    if (!p[0] || !(p[1] = compile_w1(1, threads, compute, &bytes[1], &n_ins[1]))) {
        printf("W1 %s: not measured, the plan does not compile here: %s\n", label, ts_last_error());
        ts_plan_free(p[0]);
        return;
    }
    ts_mlp_config mc = ts_mlp_w1();
    size_t nx = (size_t)(mc.batch * mc.window * mc.features), ny = (size_t)(mc.batch * mc.out_dim);
    float *x = malloc(nx * sizeof *x), *y = malloc(ny * sizeof *y);
    double *t[2] = {malloc(sizeof(double) * (size_t)steps), malloc(sizeof(double) * (size_t)steps)};
    double *ratio = malloc(sizeof(double) * (size_t)steps);
    for (int s = -2; s < steps; s++) { /* two warm-up steps each */
        for (int k = 0; k < 2; k++) {
            /* alternate which plan goes first, so neither always follows the other */
            int w = (s & 1) ? 1 - k : k;
            feed(p[w], s + 2, x, y, nx, ny);
            double t0 = now();
            if (ts_plan_step(p[w]) != TS_OK) {
                fprintf(stderr, "step: %s\n", ts_last_error());
                exit(1);
            }
            if (s >= 0) t[w][s] = now() - t0;
        }
        if (s >= 0) ratio[s] = t[1][s] / t[0][s];
    }
    int same = same_weights(p[0], p[1]);
    double mr = ts_median(ratio, steps), m0 = ts_median(t[0], steps), m1 = ts_median(t[1], steps);
    printf("W1 %s, %d thread%s, %d steps alternated:\n", label, threads, threads > 1 ? "s" : "",
           steps);
    printf("  fused:   %2d instructions, operand bytes per step %8.2f MiB, median step %.2f ms\n",
           n_ins[0], (double)bytes[0] / 1048576.0, m0 * 1e3);
    printf("  unfused: %2d instructions, operand bytes per step %8.2f MiB, median step %.2f ms\n",
           n_ins[1], (double)bytes[1] / 1048576.0, m1 * 1e3);
    printf("  saved %.2f MiB per step (%.1f %%); unfused / fused step time: median ratio %.3f; "
           "weights after %d steps: %s\n",
           (double)(bytes[1] - bytes[0]) / 1048576.0,
           100.0 * (double)(bytes[1] - bytes[0]) / (double)bytes[1], mr, steps + 2,
           same ? "identical" : "DIFFERENT");
    free(x);
    free(y);
    free(t[0]);
    free(t[1]);
    free(ratio);
    ts_plan_free(p[0]);
    ts_plan_free(p[1]);
    if (!same) exit(3);
}

int main(int argc, char **argv) {
    int steps = 20, threads = 1;
    const char *prec = "both";
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--steps") && i + 1 < argc)
            steps = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--threads") && i + 1 < argc)
            threads = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--precision") && i + 1 < argc)
            prec = argv[++i];
        else {
            fprintf(stderr, "usage: %s [--steps N] [--threads T] [--precision fp32|bf16|both]\n",
                    argv[0]);
            return 2;
        }
    }
    if (steps < 1 || threads < 1) {
        fprintf(stderr, "--steps and --threads must be >= 1\n");
        return 2;
    }
    if (strcmp(prec, "bf16")) run(steps, threads, TS_F32, "fp32");
    if (strcmp(prec, "fp32")) run(steps, threads, TS_BF16, "bf16");
    return 0;
}
