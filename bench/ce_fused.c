/* bench/ce_fused.c — the cross-entropy of W3's LM head ([2048, 8192] f32
 * logits, 64 MiB) as the two ops (cross_entropy, then cross_entropy_bwd
 * reading the logits again) and as cross_entropy_fused (passes/fuse_ce.c,
 * one pass over the logits), on one thread, with the gradient in bf16 (the
 * bf16 plan's out_low) and in f32. The variants alternate round by round;
 * before each the logits are rewritten from a master copy, as the head's
 * GEMM writes them just before in a step. Prints per variant the median
 * wall time and thread CPU time (the latter leaves out the time the thread
 * waited for a core on a loaded machine) and the median of the per-round
 * fused / two-op ratios; checks that both give the same bits.
 *
 *   build/bench_ce_fused [--rounds N] [--rows N] [--classes C] [--only two|fused]
 *
 * --only runs one variant (bf16 gradient), for `perf stat -e cycles,instructions` of each.
 */
#include <math.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include "core/core.h"
#include "ops/op.h"

static double clock_s(clockid_t id) {
    struct timespec t;
    clock_gettime(id, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

typedef struct bufs {
    int64_t n, c;
    float *master, *x, *lse, *dx, loss, dl;
    int64_t *tg;
    char part[1 << 16];
} bufs;

static ts_step_ctx g_ctx = {1, 0, 0.0, 1};

/* The two ops (fused 0) or the fused op (1); the gradient in bf16 (low) or f32. */
static ts_status run(bufs *b, int fused, int low) {
    ts_attrs a = ts_attrs_zero();
    a.cross_entropy.ignore_index = -100, a.cross_entropy.out_low = low;
    ts_tensor lg = {TS_F32, 2, {b->n, b->c}, b->x}, tg = {TS_I64, 1, {b->n}, b->tg};
    ts_tensor dl = {TS_F32, 0, {0}, &b->dl}, lse = {TS_F32, 1, {b->n}, b->lse};
    ts_tensor loss = {TS_F32, 0, {0}, &b->loss},
              d = {low ? TS_BF16 : TS_F32, 2, {b->n, b->c}, b->dx};
    if (fused) {
        ts_tensor in[3] = {dl, lg, tg}, out[3] = {d, loss, lse};
        ts_kargs k = {&a, 3, 3, in, out, b->part, sizeof b->part, &g_ctx, "ce", NULL};
        return ts_op_get(TS_OP_CROSS_ENTROPY_FUSED)->kernel(&k);
    }
    ts_tensor fin[2] = {lg, tg}, fout[2] = {loss, lse};
    ts_kargs kf = {&a, 2, 2, fin, fout, b->part, sizeof b->part, &g_ctx, "ce", NULL};
    ts_status s = ts_op_get(TS_OP_CROSS_ENTROPY)->kernel(&kf);
    if (s != TS_OK) return s;
    ts_tensor bin[4] = {dl, lg, tg, lse};
    ts_kargs kb = {&a, 4, 1, bin, &d, NULL, 0, &g_ctx, "ce", NULL};
    return ts_op_get(TS_OP_CROSS_ENTROPY_BWD)->kernel(&kb);
}

int main(int argc, char **argv) {
    int rounds = 15, only = -1;
    bufs *b = calloc(1, sizeof *b);
    b->n = 2048, b->c = 8192, b->dl = 1.0f;
    for (int i = 1; i + 1 < argc; i += 2) {
        if (!strcmp(argv[i], "--rounds")) rounds = atoi(argv[i + 1]);
        if (!strcmp(argv[i], "--rows")) b->n = atoll(argv[i + 1]);
        if (!strcmp(argv[i], "--classes")) b->c = atoll(argv[i + 1]);
        if (!strcmp(argv[i], "--only")) only = !strcmp(argv[i + 1], "fused");
    }
    if (rounds < 1 || rounds > 1000 || b->n < 1 || b->c < 2 || (b->n + 63) / 64 * 32 > 1 << 16) {
        fprintf(stderr, "usage: bench_ce_fused [--rounds 1..1000] [--rows N] [--classes C]\n");
        return 2;
    }
    omp_set_num_threads(1);
    const size_t nc = (size_t)(b->n * b->c);
    b->master = malloc(nc * sizeof(float));
    b->x = malloc(nc * sizeof(float));
    b->dx = malloc(nc * sizeof(float));
    b->lse = malloc((size_t)b->n * sizeof(float));
    b->tg = malloc((size_t)b->n * sizeof(int64_t));
    void *keep = malloc(nc * sizeof(float));
    float keep_loss = 0;
    unsigned seed = 3;
    for (size_t i = 0; i < nc; i++) b->master[i] = 6.0f * ((float)rand_r(&seed) / RAND_MAX - 0.5f);
    for (int64_t r = 0; r < b->n; r++) b->tg[r] = rand_r(&seed) % b->c;
    printf("cross entropy [%lld, %lld] f32 logits, 1 thread, %d rounds\n", (long long)b->n,
           (long long)b->c, rounds);
    double *t[2][2], *ratio[2];
    for (int v = 0; v < 2; v++)
        for (int w = 0; w < 2; w++) t[v][w] = malloc(sizeof(double) * (size_t)rounds);
    ratio[0] = malloc(sizeof(double) * (size_t)rounds);
    ratio[1] = malloc(sizeof(double) * (size_t)rounds);
    int same = 1;
    if (only >= 0) {
        for (int r = 0; r < rounds; r++) {
            memcpy(b->x, b->master, nc * sizeof(float));
            if (run(b, only, 1) != TS_OK) return 1;
        }
        printf("%s: %d rounds, bf16 gradient\n", only ? "fused" : "two ops", rounds);
        return 0;
    }
    for (int low = 1; low >= 0; low--) {
        for (int r = 0; r < rounds; r++)
            for (int fused = 0; fused < 2; fused++) {
                memcpy(b->x, b->master, nc * sizeof(float)); /* as the head's GEMM writes them */
                const double w0 = clock_s(CLOCK_MONOTONIC), c0 = clock_s(CLOCK_THREAD_CPUTIME_ID);
                if (run(b, fused, low) != TS_OK) {
                    fprintf(stderr, "kernel: %s\n", ts_last_error());
                    return 1;
                }
                t[fused][0][r] = clock_s(CLOCK_MONOTONIC) - w0;
                t[fused][1][r] = clock_s(CLOCK_THREAD_CPUTIME_ID) - c0;
                const size_t db = nc * (low ? 2 : 4);
                if (!fused) {
                    memcpy(keep, b->dx, db);
                    keep_loss = b->loss;
                } else {
                    same &= !memcmp(keep, b->dx, db) && !memcmp(&keep_loss, &b->loss, 4);
                }
            }
        for (int w = 0; w < 2; w++)
            for (int r = 0; r < rounds; r++) ratio[w][r] = t[1][w][r] / t[0][w][r];
        double m[2][2], q[2];
        for (int v = 0; v < 2; v++)
            for (int w = 0; w < 2; w++) m[v][w] = ts_median(t[v][w], rounds);
        for (int w = 0; w < 2; w++) q[w] = ts_median(ratio[w], rounds);
        printf("%s gradient: two ops %.2f ms (cpu %.2f), fused %.2f ms (cpu %.2f); fused / two "
               "ops: wall %.3f, cpu %.3f (medians)\n",
               low ? "bf16" : "f32 ", 1e3 * m[0][0], 1e3 * m[0][1], 1e3 * m[1][0], 1e3 * m[1][1],
               q[0], q[1]);
    }
    printf("same bits (gradient and loss): %s\n", same ? "yes" : "NO");
    return same ? 0 : 1;
}
