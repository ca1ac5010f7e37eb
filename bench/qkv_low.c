/* bench/qkv_low.c — one W3 attention layer in bf16, its qkv projection writing bf16 for the
 * bf16 attention (matmul_epi.out_low, passes/qkv_low.c) against writing f32
 * (compile.no_qkv_low). The layer: x [B, T, C] -> linear (qkv, with bias: a matmul_epi) ->
 * the packed causal attention (passes/attention_qkv.c) -> MSE, trained; both plans alternate
 * step by step so they see the same machine load; per round the qkv GEMM (matmul_epi), the
 * attention and the attention_bwd instructions' times are read from the profile, and the
 * step's CPU time is taken from the calling thread's clock (with 1 thread every kernel runs
 * on it: unlike the profile's wall clock, it does not count the time other processes hold
 * the core, which on a loaded machine is most of the noise). Prints the medians and minima of
 * each, of the three ops' total and of the step's CPU time per plan, the medians of the
 * per-round ratios (off / on) and both plans' arenas.
 *
 *   build/bench_qkv_low [--rounds N] [--threads T] [--b B] [--t T]
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include "attn_layer.h"
#include "tessel/tessel.h"

enum {
    H = BENCH_ATTN_H,
    HD = BENCH_ATTN_HD,
    D = BENCH_ATTN_D,
    NOPS = 3,
    NCOL = NOPS + 2
}; /* the ops, total, step cpu */
static const char *const COL[NCOL] = {"matmul_epi", "attention", "attention_bwd", "total",
                                      "step cpu"};

static double thread_cpu(void) {
    struct timespec t;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

static ts_plan *compile(int off, int threads, int64_t B, int64_t T) {
    ts_compile_options opt = ts_compile_options_default();
    opt.threads = threads;
    opt.no_qkv_low = off;
    return bench_attn_layer(B, T, opt);
}

/* One step; the seconds of each column into t[k * stride]. */
static void step(ts_plan *p, double *t, int stride) {
    ts_plan_profile_reset(p);
    const double c0 = thread_cpu();
    if (ts_plan_step(p) != TS_OK) {
        fprintf(stderr, "step: %s\n", ts_last_error());
        exit(1);
    }
    t[(NOPS + 1) * stride] = thread_cpu() - c0;
    ts_profile_entry e[64];
    const int n = ts_plan_profile(p, e, 64);
    t[NOPS * stride] = 0;
    for (int k = 0; k < NOPS; k++) {
        t[k * stride] = 0;
        for (int i = 0; i < n && i < 64; i++)
            if (strcmp(e[i].op, COL[k]) == 0) t[k * stride] = e[i].seconds;
        t[NOPS * stride] += t[k * stride];
    }
}

int main(int argc, char **argv) {
    int rounds = 15, threads = 1;
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
        else {
            fprintf(stderr, "usage: %s [--rounds N] [--threads T] [--b B] [--t T]\n", argv[0]);
            return 2;
        }
    }
    if (rounds < 1 || rounds > 1000 || B < 1 || T < 1 || threads < 1) {
        fprintf(stderr, "bench_qkv_low: rounds 1-1000, threads, B and T >= 1\n");
        return 2;
    }
    ts_plan *p[2] = {compile(0, threads, B, T), compile(1, threads, B, T)}; /* on, off */
    float *y = calloc((size_t)(B * T * D), sizeof *y);
    /* [plan][column][round], then the per-round ratios of the totals and step cpu */
    const int per = NCOL * rounds;
    double *t = calloc((size_t)(2 * per + 2 * rounds), sizeof *t), w[NCOL];
    if (!y || !t) return 1;
    for (int64_t i = 0; i < B * T * D; i++) y[i] = (float)cos(0.11 * (double)i);
    for (int i = 0; i < 2; i++) {
        if (ts_plan_set_input(p[i], "y", y, sizeof *y * (size_t)(B * T * D)) != TS_OK) return 1;
        step(p[i], w, 1); /* warm */
    }
    for (int r = 0; r < rounds; r++) {
        for (int i = 0; i < 2; i++) step(p[i], t + i * per + r, rounds);
        for (int k = 0; k < 2; k++) /* total, step cpu */
            t[2 * per + k * rounds + r] =
                t[per + (NOPS + k) * rounds + r] / t[(NOPS + k) * rounds + r];
    }
    printf("qkv GEMM, attention, attention_bwd, bf16, B %lld H %d T %lld hd %d causal, %d "
           "thread(s), %d rounds: median (min) ms\n",
           (long long)B, H, (long long)T, HD, threads, rounds);
    const char *name[2] = {"bf16 qkv (on) ", "f32 qkv (off) "};
    for (int i = 0; i < 2; i++) {
        printf("  %s", name[i]);
        for (int k = 0; k < NCOL; k++) {
            double *v = t + i * per + k * rounds, m = ts_median(v, rounds);
            printf(" %s %7.3f (%7.3f)", COL[k], 1e3 * m, 1e3 * v[0]);
        }
        ts_plan_stats ms;
        if (ts_plan_get_stats(p[i], &ms) == TS_OK)
            printf("  arena %.2f MiB", (double)ms.arena_bytes / 1048576.0);
        printf("\n");
    }
    printf("  off / on: total %.3fx, step cpu %.3fx (medians of per-round ratios)\n",
           ts_median(t + 2 * per, rounds), ts_median(t + 2 * per + rounds, rounds));
    free(t);
    free(y);
    for (int i = 0; i < 2; i++) ts_plan_free(p[i]);
    return 0;
}
