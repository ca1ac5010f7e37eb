/* bench/norm_acc.c — W3's residual layer norm backward (docs/benchmarks.md,
 * session 18): per step 12 norms of [2048, 512] f32 each add their input
 * gradient to the residual stream's gradient r. Times, alternating in one
 * process,
 *   pair   layer_norm_bwd into a temporary, then add(r, tmp) over r (the
 *          unfused plan, compile.no_fuse_norm),
 *   acc    layer_norm_bwd_acc over r (what the fusion pass builds),
 * each over 12 distinct sets of operands (dy, x, r: 144 MiB, beyond the
 * caches, as in the step), and prints per round the wall and the thread's
 * CPU milliseconds of the 12 (CPU time leaves out the time other jobs hold
 * the core), then the medians and the median of the per-round acc / pair
 * ratios. Before timing it checks that both give r, dw and db with the
 * same bits.
 *
 *   build/bench_norm_acc [--rounds N] [--threads T]
 */
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include "core/core.h"
#include "ops/norm_rows.h"
#include "ops/op.h"

enum { SETS = 12, ROWS = 2048, D = 512, MAXR = 101 };

typedef struct set {
    float *dy, *x, *r, *mean, *rstd, *dw, *db;
} set;

static float *fill(size_t n, unsigned seed, float lo, float hi) {
    float *p = aligned_alloc(64, (n * sizeof(float) + 63) / 64 * 64);
    if (!p) exit(1);
    for (size_t i = 0; i < n; i++) p[i] = lo + (hi - lo) * (float)rand_r(&seed) / (float)RAND_MAX;
    return p;
}

static double seconds(clockid_t c) {
    struct timespec t;
    clock_gettime(c, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

static ts_tensor big(float *p) {
    return (ts_tensor){TS_F32, 2, {ROWS, D}, p};
}
static ts_tensor vec(float *p, int64_t n) {
    return (ts_tensor){TS_F32, 1, {n}, p};
}

/* One norm's backward added into s->r, fused or not. */
static ts_status one(int fused, set *s, const float *w, float *tmp, void *scratch, size_t sb) {
    ts_attrs a = ts_attrs_zero(), none = ts_attrs_zero();
    a.norm.has_w = a.norm.has_b = 1;
    ts_step_ctx ctx = {1, 0, 0.0, 1};
    ts_tensor out[3] = {big(fused ? s->r : tmp), vec(s->dw, D), vec(s->db, D)};
    ts_tensor in[6] = {big(s->r),          big(s->dy),         big(s->x),
                       vec(s->mean, ROWS), vec(s->rstd, ROWS), vec((float *)w, D)};
    if (fused) {
        ts_kargs k = {&a, 6, 3, in, out, scratch, sb, &ctx, "layer_norm_bwd_acc", NULL};
        return ts_op_get(TS_OP_LAYER_NORM_BWD_ACC)->kernel(&k);
    }
    ts_kargs k = {&a, 5, 3, in + 1, out, scratch, sb, &ctx, "layer_norm_bwd", NULL};
    ts_status st = ts_op_get(TS_OP_LAYER_NORM_BWD)->kernel(&k);
    if (st != TS_OK) return st;
    ts_tensor ain[2] = {big(s->r), big(tmp)}, aout = big(s->r);
    ts_kargs ka = {&none, 2, 1, ain, &aout, NULL, 0, &ctx, "add", NULL};
    return ts_op_get(TS_OP_ADD)->kernel(&ka);
}

int main(int argc, char **argv) {
    int rounds = 15, threads = 1;
    for (int i = 1; i + 1 < argc; i += 2) {
        if (!strcmp(argv[i], "--rounds")) rounds = atoi(argv[i + 1]);
        if (!strcmp(argv[i], "--threads")) threads = atoi(argv[i + 1]);
    }
    if (rounds < 1 || rounds > MAXR || threads < 1) {
        fprintf(stderr, "usage: bench_norm_acc [--rounds 1..%d] [--threads T]\n", MAXR);
        return 2;
    }
    omp_set_num_threads(threads);
    const size_t n = (size_t)ROWS * D, sb = ts_ln_dwdb_scratch(ROWS, D);
    set s[SETS];
    for (int k = 0; k < SETS; k++)
        s[k] = (set){fill(n, 10 + k, -1, 1),
                     fill(n, 30 + k, -2, 2),
                     fill(n, 50 + k, -1, 1),
                     fill(ROWS, 70 + k, -0.1f, 0.1f),
                     fill(ROWS, 90 + k, 0.5f, 2),
                     fill(D, 1, 0, 1),
                     fill(D, 2, 0, 1)};
    float *w = fill(D, 9, 0.5f, 1.5f), *tmp = fill(n, 8, 0, 1);
    void *scratch = aligned_alloc(64, (sb + 63) / 64 * 64);
    /* the same bits: set 0 through both, from one r */
    float *r0 = malloc(n * sizeof(float)), *res[2][3];
    memcpy(r0, s[0].r, n * sizeof(float));
    for (int f = 0; f < 2; f++) {
        memcpy(s[0].r, r0, n * sizeof(float));
        if (one(f, &s[0], w, tmp, scratch, sb) != TS_OK) {
            fprintf(stderr, "bench_norm_acc: %s\n", ts_last_error());
            return 1;
        }
        float *src[3] = {s[0].r, s[0].dw, s[0].db};
        for (int j = 0; j < 3; j++) {
            size_t b = (j ? D : n) * sizeof(float);
            res[f][j] = malloc(b);
            memcpy(res[f][j], src[j], b);
        }
    }
    int same = 1;
    for (int j = 0; j < 3; j++) same &= !memcmp(res[0][j], res[1][j], (j ? D : n) * sizeof(float));
    printf("W3 residual layer norm backward, 12 x [%d, %d] f32, %d thread(s): %s bits\n", ROWS, D,
           threads, same ? "the same" : "DIFFERENT");
    double wall[2][MAXR], cpu[2][MAXR], ratio[MAXR];
    for (int r = 0; r <= rounds; r++) { /* round 0 warms up */
        for (int q = 0; q < 2; q++) {
            int f = (r + q) % 2; /* alternate which goes first */
            double w0 = seconds(CLOCK_MONOTONIC), c0 = seconds(CLOCK_PROCESS_CPUTIME_ID);
            for (int k = 0; k < SETS; k++) one(f, &s[k], w, tmp, scratch, sb);
            if (r) {
                wall[f][r - 1] = 1e3 * (seconds(CLOCK_MONOTONIC) - w0);
                cpu[f][r - 1] = 1e3 * (seconds(CLOCK_PROCESS_CPUTIME_ID) - c0);
            }
        }
        if (r) {
            ratio[r - 1] = cpu[1][r - 1] / cpu[0][r - 1];
            printf("round %2d  pair %7.2f ms wall %7.2f cpu   acc %7.2f ms wall %7.2f cpu\n", r,
                   wall[0][r - 1], cpu[0][r - 1], wall[1][r - 1], cpu[1][r - 1]);
        }
    }
    double mp = ts_median(cpu[0], rounds), ma = ts_median(cpu[1], rounds);
    double wp = ts_median(wall[0], rounds), wa = ts_median(wall[1], rounds);
    printf("medians: pair %.2f ms (wall %.2f), acc %.2f ms (wall %.2f) CPU per 12; "
           "acc / pair per round %.3f\n",
           mp, wp, ma, wa, ts_median(ratio, rounds));
    return same ? 0 : 1;
}
