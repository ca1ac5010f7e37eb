/* bench/attn_bwd_low.c — one W3 attention layer's backward in bf16, the packed attention_bwd
 * writing dqkv in bf16 with the qkv bias gradient (attention.out_low, passes/attn_bwd_low.c)
 * against the f32 dqkv and the sum that reads it back (compile.no_attn_bwd_low_out). The
 * layer: x [B, T, C] -> linear (qkv, with bias) -> the packed causal attention (GPT-2's
 * slices and head permutes, passes/attention_qkv.c) -> MSE; both plans alternate step by
 * step so they see the same machine load; per round the attention_bwd and sum instructions'
 * time is read from the profile. Prints the medians and minima of attention_bwd, sum and
 * their total per plan, and the median of the per-round ratios (off / on).
 *
 *   build/bench_attn_bwd_low [--rounds N] [--threads T] [--b B] [--t T]
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "profile_step.h"
#include "attn_layer.h"
#include "tessel/tessel.h"

enum { H = BENCH_ATTN_H, HD = BENCH_ATTN_HD, D = BENCH_ATTN_D };

static ts_plan *compile(int off, int threads, int64_t B, int64_t T) {
    ts_compile_options opt = ts_compile_options_default();
    opt.threads = threads;
    opt.no_attn_bwd_low_out = off;
    return bench_attn_layer(B, T, opt);
}

int main(int argc, char **argv) {
    int rounds = 15, threads = 1, only = -1; /* --only on|off: one plan (for a profiler) */
    int64_t B = 8, T = 256;
    for (int i = 1; i + 1 < argc; i += 2) {
        if (!strcmp(argv[i], "--rounds"))
            rounds = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--threads"))
            threads = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--b"))
            B = atoll(argv[i + 1]);
        else if (!strcmp(argv[i], "--t"))
            T = atoll(argv[i + 1]);
        else if (!strcmp(argv[i], "--only"))
            only = !strcmp(argv[i + 1], "on") ? 0 : !strcmp(argv[i + 1], "off") ? 1 : 2;
        else {
            fprintf(stderr, "usage: %s [--rounds N] [--threads T] [--b B] [--t T]\n", argv[0]);
            return 2;
        }
    }
    if (only >= 0) {
        ts_plan *q = compile(only, threads, B, T);
        double a, s;
        for (int r = 0; r < rounds; r++) bench_step_ops(q, "attention_bwd", &a, "sum", &s);
        printf("%s: last round attention_bwd %.3f ms, sum %.3f ms\n", only ? "off" : "on", 1e3 * a,
               1e3 * s);
        ts_plan_free(q);
        return 0;
    }
    if (rounds < 1 || rounds > 1000 || B < 1 || T < 1 || threads < 1) {
        fprintf(stderr, "bench_attn_bwd_low: rounds 1-1000, threads, B and T >= 1\n");
        return 2;
    }
    ts_plan *p[2] = {compile(0, threads, B, T), compile(1, threads, B, T)}; /* on, off */
    float *y = calloc((size_t)(B * T * D), sizeof *y);
    double *t = calloc((size_t)rounds * 7, sizeof *t); /* on bwd, sum, off bwd, sum, totals */
    if (!y || !t) return 1;
    for (int64_t i = 0; i < B * T * D; i++) y[i] = (float)cos(0.11 * (double)i);
    for (int i = 0; i < 2; i++)
        if (ts_plan_set_input(p[i], "y", y, sizeof *y * (size_t)(B * T * D)) != TS_OK) return 1;
    double a, s;
    for (int i = 0; i < 2; i++) bench_step_ops(p[i], "attention_bwd", &a, "sum", &s); /* warm */
    for (int r = 0; r < rounds; r++) {
        for (int i = 0; i < 2; i++)
            bench_step_ops(p[i], "attention_bwd", &t[2 * i * rounds + r], "sum",
                           &t[(2 * i + 1) * rounds + r]);
        t[4 * rounds + r] = t[r] + t[rounds + r];
        t[5 * rounds + r] = t[2 * rounds + r] + t[3 * rounds + r];
        t[6 * rounds + r] = t[5 * rounds + r] / t[4 * rounds + r];
    }
    printf("attention_bwd (+ sum), bf16, B %lld H %d T %lld hd %d causal, %d thread(s), %d "
           "rounds: median (min) ms\n",
           (long long)B, H, (long long)T, HD, threads, rounds);
    const char *name[2] = {"bf16 dqkv + sums (on) ", "f32 dqkv, sum (off)   "};
    for (int i = 0; i < 2; i++) {
        double *bw = t + 2 * i * rounds, *sm = t + (2 * i + 1) * rounds,
               *tot = t + (4 + i) * rounds;
        double mb = ts_median(bw, rounds), ms = ts_median(sm, rounds), mt = ts_median(tot, rounds);
        printf("  %s attention_bwd %7.3f (%7.3f)  sum %6.3f (%6.3f)  total %7.3f (%7.3f)\n",
               name[i], 1e3 * mb, 1e3 * bw[0], 1e3 * ms, 1e3 * sm[0], 1e3 * mt, 1e3 * tot[0]);
    }
    printf("  off / on total: %.3fx (median of per-round ratios)\n",
           ts_median(t + 6 * rounds, rounds));
    free(t);
    free(y);
    for (int i = 0; i < 2; i++) ts_plan_free(p[i]);
    return 0;
}
