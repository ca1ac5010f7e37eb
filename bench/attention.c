/* bench/attention.c — the fused attention and its backward with f32 block
 * products against bf16 ones (attention.low, what bf16 plans run), on W3's
 * attention shape by default (B 8, H 8, T 256, hd 64, causal). The two plans
 * (q, k, v -> attention -> MSE, gradients of q, k, v) alternate step by step
 * so that both see the same machine load; per round the time of the
 * attention and attention_bwd instructions is read from the profile; prints
 * the medians (and minima, the least disturbed by other processes on a
 * loaded machine), GFLOP/s and the median of the per-round ratios. --only
 * times one of the two plans (for a profiler, or to compare two builds of
 * the same plan by alternating the binaries).
 *
 *   build/bench_attention [--rounds N] [--threads T] [--t T] [--hd HD] [--only f32|bf16]
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "profile_step.h"
#include "tessel/tessel.h"

static int cmp_d(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static double median(double *v, int n) {
    qsort(v, (size_t)n, sizeof *v, cmp_d);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

/* after median (sorted) */
static double least(const double *v) {
    return v[0];
}

static ts_plan *compile(ts_dtype compute, int threads, const int64_t *d) {
    ts_graph *g = ts_graph_new();
    ts_val q = ts_param(g, "q", TS_F32, 4, d, ts_init_normal(0, 1.0));
    ts_val k = ts_param(g, "k", TS_F32, 4, d, ts_init_normal(0, 1.0));
    ts_val v = ts_param(g, "v", TS_F32, 4, d, ts_init_normal(0, 1.0));
    ts_val y = ts_input(g, "y", TS_F32, 4, d);
    ts_val o = ts_causal_attention(g, q, k, v);
    ts_train_spec spec = ts_train_spec_default(ts_mse_loss(g, o, y));
    spec.opt = ts_sgd(0.0, 0, 0, 0, 0);
    ts_compile_options opt = ts_compile_options_default();
    opt.seed = 1;
    opt.threads = threads;
    opt.profile = 1;
    opt.precision.compute = compute;
    return bench_compile(g, &spec, &opt);
}

int main(int argc, char **argv) {
    int rounds = 15, threads = 1, use[2] = {1, 1}; /* f32, bf16 */
    int64_t T = 256, hd = 64;
    for (int i = 1; i + 1 < argc; i += 2) {
        if (!strcmp(argv[i], "--rounds"))
            rounds = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--threads"))
            threads = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--t"))
            T = atoll(argv[i + 1]);
        else if (!strcmp(argv[i], "--hd"))
            hd = atoll(argv[i + 1]);
        else if (!strcmp(argv[i], "--only") && !strcmp(argv[i + 1], "f32"))
            use[1] = 0;
        else if (!strcmp(argv[i], "--only") && !strcmp(argv[i + 1], "bf16"))
            use[0] = 0;
        else {
            fprintf(stderr,
                    "usage: %s [--rounds N] [--threads T] [--t T] [--hd HD] [--only f32|bf16]\n",
                    argv[0]);
            return 2;
        }
    }
    if (rounds < 1 || rounds > 1000 || T < 1 || hd < 1) {
        fprintf(stderr, "bench_attention: rounds 1-1000, T and hd >= 1\n");
        return 2;
    }
    const int64_t d[4] = {8, 8, T, hd};
    ts_plan *p[2] = {use[0] ? compile(TS_F32, threads, d) : NULL,
                     use[1] ? compile(TS_BF16, threads, d) : NULL};
    double *t = calloc((size_t)rounds * 6, sizeof *t); /* f32 fwd, bwd, bf16 fwd, bwd, ratios */
    if (!t) return 1;
    double f, b;
    for (int i = 0; i < 2; i++)
        if (p[i]) bench_step_ops(p[i], "attention", &f, "attention_bwd", &b); /* warm-up */
    for (int r = 0; r < rounds; r++) {
        for (int i = 0; i < 2; i++)
            if (p[i])
                bench_step_ops(p[i], "attention", &t[2 * i * rounds + r], "attention_bwd",
                               &t[(2 * i + 1) * rounds + r]);
        if (!p[0] || !p[1]) continue;
        t[4 * rounds + r] = t[r] / t[2 * rounds + r];
        t[5 * rounds + r] = t[rounds + r] / t[3 * rounds + r];
    }
    /* multiply-adds over the visible (query, key) pairs: 2 per hd forward, 5 backward */
    const double pairs = 64.0 * (double)T * (double)(T + 1) / 2 * (double)hd;
    const char *name[2] = {"f32 products ", "bf16 products"};
    printf("attention B 8 H 8 T %lld hd %lld causal, %d thread(s), %d rounds (medians)\n",
           (long long)T, (long long)hd, threads, rounds);
    for (int i = 0; i < 2; i++) {
        if (!p[i]) continue;
        double mf = median(t + 2 * i * rounds, rounds),
               mb = median(t + (2 * i + 1) * rounds, rounds);
        printf("  %s  forward %8.3f ms %6.1f GFLOP/s   backward %8.3f ms %6.1f GFLOP/s   "
               "(min %.3f / %.3f ms)\n",
               name[i], 1e3 * mf, 4 * pairs / mf * 1e-9, 1e3 * mb, 10 * pairs / mb * 1e-9,
               1e3 * least(t + 2 * i * rounds), 1e3 * least(t + (2 * i + 1) * rounds));
    }
    if (p[0] && p[1])
        printf("  f32 / bf16 time: forward %.2fx, backward %.2fx (median of per-round ratios)\n",
               median(t + 4 * rounds, rounds), median(t + 5 * rounds, rounds));
    free(t);
    for (int i = 0; i < 2; i++)
        if (p[i]) ts_plan_free(p[i]);
    return 0;
}
