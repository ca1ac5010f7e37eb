/* bench/attention_items.c — the bf16 attention's work items alone (attention.low, what bf16
 * plans run), on W3's packed form: q, k and v read in place from one qkv [8, 256, 3, 8, 64],
 * o and do [8, 256, 8, 64], causal; every one of the 64 heads' forward, then every head's
 * backward, on one thread. Times are the thread's CPU time (CLOCK_THREAD_CPUTIME_ID), so time
 * the thread spends waiting while other processes run is left out: on a loaded machine its
 * minima and medians move by a few percent, where wall-clock ones (bench_attention) move by
 * tens. What the other processes do to the caches still counts.
 *
 *   build/bench_attention_items [--rounds N] [--one-head]
 *
 * --one-head runs head 0's item 64 times (its rows stay in cache): the difference to the
 * default is what reading the heads' rows from memory costs. To compare with another build,
 * link this file against that build's libtessel.a (docs/benchmarks.md, "session 18"). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include "ops/attention_fused.h"

static double now_ms(void) {
    struct timespec t;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
    return (double)t.tv_sec * 1e3 + (double)t.tv_nsec * 1e-6;
}

static int cmp_d(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

int main(int argc, char **argv) {
    int rounds = 15, one_head = 0;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--rounds") && i + 1 < argc)
            rounds = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--one-head"))
            one_head = 1;
        else {
            fprintf(stderr, "usage: %s [--rounds N] [--one-head]\n", argv[0]);
            return 2;
        }
    }
    if (rounds < 1 || rounds > 1000) {
        fprintf(stderr, "--rounds: 1 to 1000\n");
        return 2;
    }
    const int64_t B = 8, H = 8, T = 256, hd = 64;
    ts_attn_geom g = {
        .B = B, .H = H, .seq = T, .hd = hd, .packed = 1, .ld_in = 3 * H * hd, .ld_out = H * hd};
    const size_t nin = (size_t)(B * T * 3 * H * hd), nout = (size_t)(B * T * H * hd);
    float *qkv = malloc(nin * sizeof(float)), *dqkv = malloc(nin * sizeof(float));
    float *o = malloc(nout * sizeof(float)), *dout = malloc(nout * sizeof(float));
    float *lse = malloc((size_t)(B * H * T) * sizeof(float));
    float *wf = malloc(ts_attn_fwd_low_slot_bytes(T, hd)),
          *wb = malloc(ts_attn_bwd_low_slot_bytes(T, hd));
    double *tf = malloc(sizeof(double) * (size_t)rounds),
           *tb = malloc(sizeof(double) * (size_t)rounds);
    if (!qkv || !dqkv || !o || !dout || !lse || !wf || !wb || !tf || !tb) {
        fprintf(stderr, "out of memory\n");
        return 1;
    }
    for (size_t i = 0; i < nin; i++) qkv[i] = (float)sin(0.37 * (double)i) * 1.5f;
    for (size_t i = 0; i < nout; i++) dout[i] = (float)cos(0.11 * (double)i) * 0.01f;
    const float scale = 1.0f / 8.0f; /* 1 / sqrt(hd) */
    for (int r = 0; r < rounds; r++) {
        double t0 = now_ms();
        for (int64_t bh = 0; bh < B * H; bh++) {
            int64_t hi, ho;
            ts_attn_head_offsets(&g, one_head ? 0 : bh, &hi, &ho);
            ts_attn_fwd_item_low(qkv + hi, qkv + hi + H * hd, qkv + hi + 2 * H * hd, o + ho,
                                 lse + (one_head ? 0 : bh) * T, &g, 0, T, scale, 1, wf);
        }
        double t1 = now_ms();
        for (int64_t bh = 0; bh < B * H; bh++) {
            int64_t hi, ho, h = one_head ? 0 : bh;
            ts_attn_head_offsets(&g, h, &hi, &ho);
            ts_attn_bwd_item_low(dout + ho, qkv + hi, qkv + hi + H * hd, qkv + hi + 2 * H * hd,
                                 o + ho, lse + h * T, dqkv + hi, dqkv + hi + H * hd,
                                 dqkv + hi + 2 * H * hd, &g, scale, 1, wb);
        }
        tf[r] = t1 - t0;
        tb[r] = now_ms() - t1;
    }
    qsort(tf, (size_t)rounds, sizeof *tf, cmp_d);
    qsort(tb, (size_t)rounds, sizeof *tb, cmp_d);
    /* causal: 10 block pairs a head, 4 of them diagonal; 2 products forward, 5 backward, each
     * 2 * 64^3 flops a whole block pair (the work if no masked entry were skipped) */
    const double pair_flop = 2.0 * 64 * 64 * 64 * 10 * (double)(B * H);
    printf("attention items, W3 packed (B 8, H 8, T 256, hd 64, causal), %s, 1 thread, %d rounds, "
           "thread CPU time\n",
           one_head ? "head 0 only (in cache)" : "all heads", rounds);
    printf("  forward   median %.3f ms  min %.3f ms  (%.1f us a head, %.0f GFLOP/s of whole "
           "blocks)\n",
           tf[rounds / 2], tf[0], tf[rounds / 2] * 1e3 / (double)(B * H),
           2 * pair_flop / (tf[rounds / 2] * 1e6));
    printf("  backward  median %.3f ms  min %.3f ms  (%.1f us a head, %.0f GFLOP/s of whole "
           "blocks)\n",
           tb[rounds / 2], tb[0], tb[rounds / 2] * 1e3 / (double)(B * H),
           5 * pair_flop / (tb[rounds / 2] * 1e6));
    free(qkv);
    free(dqkv);
    free(o);
    free(dout);
    free(lse);
    free(wf);
    free(wb);
    free(tf);
    free(tb);
    return 0;
}
