/* bench/step.c — training-step throughput of the benchmark workloads, with
 * PyTorch measured side by side in the same run.
 *
 *   build/bench_step [--workload W1|W3] [--steps N] [--threads T] [--compare-torch]
 *                    [--reference PATH/torch_bench.py]
 *
 * Prints the median step time, throughput and peak RSS of tessel, then (with
 * --compare-torch) runs the reference script for the same workload and
 * prints the ratio. Timings on a shared machine are noisy: compare ratios
 * from one run, not absolute numbers across days. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>
#include "tessel/tessel.h"

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

static int cmp_d(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static double peak_rss_mb(void) {
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    return (double)ru.ru_maxrss / 1024.0;
}

/* Box-Muller normal numbers from a simple LCG: data generation only. */
static float randn(unsigned long long *s) {
    *s = *s * 6364136223846793005ull + 1442695040888963407ull;
    double u1 = ((*s >> 11) + 1.0) / 9007199254740993.0;
    *s = *s * 6364136223846793005ull + 1442695040888963407ull;
    double u2 = (*s >> 11) / 9007199254740992.0;
    return (float)(sqrt(-2 * log(u1)) * cos(6.283185307179586 * u2));
}

typedef struct result {
    double step_ms, throughput, rss_mb, loss0, loss1;
    const char *unit;
    ts_plan_stats st;
} result;

static int run_tessel(const char *wl, int steps, int threads, result *r) {
    ts_graph *g = ts_graph_new();
    ts_model m;
    ts_train_spec spec;
    double per_step;
    int is_gpt = strcmp(wl, "W3") == 0;
    ts_status s;
    if (is_gpt) {
        ts_gpt_config c = ts_gpt_w3();
        s = ts_build_gpt(g, &c, &m);
        spec = ts_train_spec_default(m.loss);
        spec.opt = ts_adamw(3e-4, 0.9, 0.999, 1e-8, 0.1);
        per_step = (double)(c.batch * c.ctx);
        r->unit = "tokens/s";
    } else {
        ts_mlp_config c = ts_mlp_w1();
        s = ts_build_mlp(g, &c, &m);
        spec = ts_train_spec_default(m.loss);
        spec.opt = ts_adamw(1e-3, 0.9, 0.999, 1e-8, 0.01);
        per_step = (double)c.batch;
        r->unit = "samples/s";
    }
    if (s != TS_OK) {
        fprintf(stderr, "build: %s\n", ts_last_error());
        return 1;
    }
    ts_compile_options opt = ts_compile_options_default();
    opt.threads = threads;
    ts_plan *p;
    double t0 = now();
    if (ts_compile(g, &spec, &opt, &p) != TS_OK) {
        fprintf(stderr, "compile: %s\n", ts_last_error());
        return 1;
    }
    printf("tessel %s: compiled in %.2f s\n", wl, now() - t0);
    ts_plan_get_stats(p, &r->st);
    /* Inputs: 4 batches cycled, as the reference does. */
    int64_t dims[8];
    int rank;
    ts_dtype dt;
    const char *in_name = is_gpt ? "tokens" : "x", *tg_name = is_gpt ? "targets" : "y";
    ts_plan_value_info(p, in_name, &dt, &rank, dims);
    size_t nx = 1;
    for (int i = 0; i < rank; i++) nx *= (size_t)dims[i];
    ts_plan_value_info(p, tg_name, &dt, &rank, dims);
    size_t ny = 1;
    for (int i = 0; i < rank; i++) ny *= (size_t)dims[i];
    unsigned long long seed = 1234;
    void *xs[4], *ys[4];
    size_t xb = nx * (is_gpt ? 8 : 4), yb = ny * (is_gpt ? 8 : 4);
    for (int b = 0; b < 4; b++) {
        xs[b] = malloc(xb);
        ys[b] = malloc(yb);
        for (size_t i = 0; i < nx; i++) {
            if (is_gpt) ((int64_t *)xs[b])[i] = (int64_t)((seed = seed * 6364136223846793005ull + 1) >> 33) % 8192;
            else ((float *)xs[b])[i] = randn(&seed);
        }
        for (size_t i = 0; i < ny; i++) {
            if (is_gpt) ((int64_t *)ys[b])[i] = (int64_t)((seed = seed * 6364136223846793005ull + 1) >> 33) % 8192;
            else ((float *)ys[b])[i] = 0.1f * randn(&seed);
        }
    }
    int warm = 2;
    double *times = malloc(sizeof(double) * (size_t)steps);
    for (int i = 0; i < warm + steps; i++) {
        ts_plan_set_input(p, in_name, xs[i % 4], xb);
        ts_plan_set_input(p, tg_name, ys[i % 4], yb);
        double a = now();
        if (ts_plan_step(p) != TS_OK) {
            fprintf(stderr, "step: %s\n", ts_last_error());
            return 1;
        }
        double b = now();
        if (i == 0) r->loss0 = ts_plan_loss(p);
        if (i >= warm) times[i - warm] = b - a;
    }
    r->loss1 = ts_plan_loss(p);
    qsort(times, (size_t)steps, sizeof(double), cmp_d);
    r->step_ms = 1e3 * times[steps / 2];
    r->throughput = per_step / times[steps / 2];
    r->rss_mb = peak_rss_mb();
    free(times);
    for (int b = 0; b < 4; b++) free(xs[b]), free(ys[b]);
    ts_plan_free(p);
    ts_graph_free(g);
    return 0;
}

/* Run the PyTorch reference for one workload; parse its RESULT line. */
static int run_torch(const char *ref, const char *wl, int threads, result *r) {
    char cmd[2048];
    snprintf(cmd, sizeof cmd,
             "LD_LIBRARY_PATH=/usr/lib/x86_64-linux-gnu/openblas-openmp /usr/bin/python3 %s "
             "--workload %s --mode eager --threads %d --min-steps 5 --min-time 5 --budget 30 2>&1",
             ref, wl, threads);
    FILE *f = popen(cmd, "r");
    if (!f) return 1;
    char line[4096];
    int found = 0;
    while (fgets(line, sizeof line, f)) {
        char *p = strstr(line, "RESULT");
        if (!p) continue;
        char unit[32];
        double tp, ms, rss;
        char *q = strchr(p, ':');
        if (q && sscanf(q + 1, " %lf %31s median step %lf", &tp, unit, &ms) == 3) {
            char *rs = strstr(q, "peak RSS");
            if (rs && sscanf(rs, "peak RSS %lf", &rss) == 1) r->rss_mb = rss;
            r->throughput = tp;
            r->step_ms = ms;
            found = 1;
        }
    }
    int rc = pclose(f);
    return found && rc == 0 ? 0 : 1;
}

int main(int argc, char **argv) {
    const char *wl = "W1", *ref = "../shared/reference/torch_bench.py";
    int steps = 10, threads = 2, compare = 0;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--workload") && i + 1 < argc) wl = argv[++i];
        else if (!strcmp(argv[i], "--steps") && i + 1 < argc) steps = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--threads") && i + 1 < argc) threads = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--reference") && i + 1 < argc) ref = argv[++i];
        else if (!strcmp(argv[i], "--compare-torch")) compare = 1;
        else {
            fprintf(stderr, "usage: %s [--workload W1|W3] [--steps N] [--threads T] "
                            "[--compare-torch] [--reference torch_bench.py]\n", argv[0]);
            return 2;
        }
    }
    if (strcmp(wl, "W1") && strcmp(wl, "W3")) {
        fprintf(stderr, "bench_step: workload %s not available yet (W1, W3)\n", wl);
        return 2;
    }
    if (steps < 1) steps = 1;
    result t = {0}, ref_r = {0};
    if (run_tessel(wl, steps, threads, &t)) return 1;
    printf("tessel  %s: %10.1f %s  median step %8.1f ms  peak RSS %6.0f MB  loss %.4f -> %.4f\n",
           wl, t.throughput, t.unit, t.step_ms, t.rss_mb, t.loss0, t.loss1);
    printf("        arena %.1f MiB (params %.1f, grads %.1f, state %.1f, temps %.1f), naive sum "
           "%.1f MiB, %.2f GFLOP/step = %.1f GFLOP/s\n",
           t.st.arena_bytes / 1048576.0, t.st.param_bytes / 1048576.0,
           t.st.grad_bytes / 1048576.0, t.st.state_bytes / 1048576.0,
           t.st.temp_bytes / 1048576.0, t.st.naive_bytes / 1048576.0, t.st.flops_per_step * 1e-9,
           t.st.flops_per_step * 1e-9 / (t.step_ms * 1e-3));
    if (compare) {
        if (run_torch(ref, wl, threads, &ref_r)) {
            fprintf(stderr, "bench_step: the PyTorch reference failed (is python3-torch "
                            "installed and %s present?)\n", ref);
            return 1;
        }
        printf("pytorch %s: %10.1f %s  median step %8.1f ms  peak RSS %6.0f MB\n", wl,
               ref_r.throughput, t.unit, ref_r.step_ms, ref_r.rss_mb);
        printf("ratio   %s: throughput %.2fx PyTorch eager, peak RSS %.2fx\n", wl,
               t.throughput / ref_r.throughput, t.rss_mb / ref_r.rss_mb);
    }
    return 0;
}
