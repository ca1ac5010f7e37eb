/* bench/weight_copies.c — what the weights' bf16 copies cost and save (passes/weight_copies.c):
 * W3's 25 GEMM weights (6 layers of [512, 1536], [512, 512], [512, 2048], [2048, 512] and the
 * [512, 8192] head, 23.0 M elements) trained by AdamW in bf16 on 8 rows, so that the
 * GEMMs are small and the optimizer's update and the weights' casts are most of the step.
 * Two plans alternate step by step, one with the copies (the update rewrites them) and one
 * with compile.no_weight_copies (a cast of each weight every step); per step the time of
 * the adam_update and cast instructions is read from the profile. Prints the medians and
 * the median of the per-round ratios of update + casts.
 *
 *   build/bench_weight_copies [--rounds N] [--threads T]
 */
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

static ts_plan *compile(int copies, int threads) {
    ts_graph *g = ts_graph_new();
    const int64_t in512[2] = {8, 512}, in2048[2] = {8, 2048};
    ts_val x512 = ts_input(g, "x512", TS_F32, 2, in512);
    ts_val x2048 = ts_input(g, "x2048", TS_F32, 2, in2048);
    ts_val loss = TS_NONE;
    char name[64];
    for (int w = 0; w < 25; w++) {
        static const int64_t shapes[4][2] = {{512, 1536}, {512, 512}, {512, 2048}, {2048, 512}};
        const int64_t *s = w == 24 ? (const int64_t[]){512, 8192} : shapes[w % 4];
        snprintf(name, sizeof name, "w%d", w);
        ts_val W = ts_param(g, name, TS_F32, 2, s, ts_init_normal(0, 0.02));
        ts_val y = ts_matmul(g, s[0] == 512 ? x512 : x2048, W, 0, 0);
        snprintf(name, sizeof name, "t%d", w);
        ts_val l = ts_mse_loss(g, y, ts_input(g, name, TS_F32, 2, (const int64_t[]){8, s[1]}));
        loss = w ? ts_add(g, loss, l) : l;
    }
    ts_train_spec spec = ts_train_spec_default(loss);
    spec.opt = ts_adamw(3e-4, 0.9, 0.999, 1e-8, 0.1);
    ts_compile_options opt = ts_compile_options_default();
    opt.seed = 1;
    opt.threads = threads;
    opt.profile = 1;
    opt.precision.compute = TS_BF16;
    opt.no_weight_copies = !copies;
    return bench_compile(g, &spec, &opt);
}

int main(int argc, char **argv) {
    int rounds = 15, threads = 1;
    for (int i = 1; i + 1 < argc; i += 2) {
        if (!strcmp(argv[i], "--rounds"))
            rounds = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--threads"))
            threads = atoi(argv[i + 1]);
        else {
            fprintf(stderr, "usage: %s [--rounds N] [--threads T]\n", argv[0]);
            return 2;
        }
    }
    if (rounds < 1 || rounds > 1000 || threads < 0) {
        fprintf(stderr, "bench_weight_copies: rounds 1-1000, threads >= 0\n");
        return 2;
    }
    ts_plan *p[2] = {compile(0, threads), compile(1, threads)};
    /* casts plan update, cast; copies plan update, cast; ratio of the sums */
    double *t = calloc((size_t)rounds * 5, sizeof *t);
    if (!t) return 1;
    double u, c;
    for (int i = 0; i < 2; i++) bench_step_ops(p[i], "adam_update", &u, "cast", &c); /* warm-up */
    for (int r = 0; r < rounds; r++) {
        bench_step_ops(p[0], "adam_update", &t[r], "cast", &t[rounds + r]);
        bench_step_ops(p[1], "adam_update", &t[2 * rounds + r], "cast", &t[3 * rounds + r]);
        t[4 * rounds + r] = (t[r] + t[rounds + r]) / (t[2 * rounds + r] + t[3 * rounds + r]);
    }
    printf("W3's 25 weights (23.0 M), AdamW, bf16, %d thread(s), %d rounds (medians per step)\n",
           threads, rounds);
    const char *name[2] = {"casts (no_weight_copies)", "copies by the update     "};
    for (int i = 0; i < 2; i++)
        printf("  %s  adam_update %7.2f ms  cast %7.2f ms\n", name[i],
               1e3 * median(t + 2 * i * rounds, rounds),
               1e3 * median(t + (2 * i + 1) * rounds, rounds));
    printf("  (update + casts) casts / copies: %.2fx (median of per-round ratios)\n",
           median(t + 4 * rounds, rounds));
    free(t);
    ts_plan_free(p[0]);
    ts_plan_free(p[1]);
    return 0;
}
