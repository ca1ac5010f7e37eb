/* bench/fuse.c — the measurement behind the fused-kernel design decision
 * (docs/design-decisions.md): for typical elementwise groups of the
 * workloads, time
 *   unfused      one kernel per op (compile option no_fuse),
 *   interpreter  the fused_eltwise tile interpreter (what tessel runs),
 *   hand-fused   one hand-written C loop per group (what C generated per
 *                group and compiled by cc would be at best),
 * on W3's MLP activation shape [2048, 2048] f32 with 2 threads.
 *
 *   build/bench_fuse [--reps N] [--threads T]
 */
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "core/core.h"
#include "ops/kern.h"
#include "ops/vmath.h"
#include "tessel/tessel.h"

enum { ROWS = 2048, COLS = 2048 };

/* The tanh GELU exactly as unary.c computes it. */
static inline float gelu_tanh(float x) {
    float u2 = (float)(2.0 * 0.797884560802865355879) * (x + 0.044715f * (x * x * x));
    return x * m_sigmoid_f32(u2);
}

/* group 1: z = gelu(a + bias) + r (MLP forward, residual) */
TS_CLONES static void hand_g1(float *z, const float *a, const float *bias, const float *r) {
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < ROWS; i++)
        for (int64_t j = 0; j < COLS; j++)
            z[i * COLS + j] = gelu_tanh(a[i * COLS + j] + bias[j]) + r[i * COLS + j];
}

/* group 2: z = relu(a * s + b) (cheap, bandwidth-bound) */
TS_CLONES static void hand_g2(float *z, const float *a, const float *s, const float *b) {
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < ROWS; i++)
        for (int64_t j = 0; j < COLS; j++) {
            float v = a[i * COLS + j] * s[j] + b[i * COLS + j];
            z[i * COLS + j] = v < 0.0f ? 0.0f : v;
        }
}

static ts_graph *group_graph(int which) {
    ts_graph *g = ts_graph_new();
    int64_t d[2] = {ROWS, COLS}, row[1] = {COLS};
    ts_val a = ts_input(g, "a", TS_F32, 2, d), v = ts_input(g, "v", TS_F32, 1, row);
    ts_val r = ts_input(g, "r", TS_F32, 2, d), z;
    if (which == 1)
        z = ts_add(g, ts_gelu(g, ts_add(g, a, v), TS_GELU_TANH), r);
    else
        z = ts_relu(g, ts_add(g, ts_mul(g, a, v), r));
    ts_mark_output(g, z, "z");
    return g;
}

static double time_plan(ts_plan *p, int reps) {
    double *t = malloc(sizeof(double) * (size_t)reps);
    ts_plan_step(p);
    for (int i = 0; i < reps; i++) {
        double t0 = omp_get_wtime();
        ts_plan_step(p);
        t[i] = omp_get_wtime() - t0;
    }
    double m = ts_median(t, reps);
    free(t);
    return m;
}

int main(int argc, char **argv) {
    int reps = 30, threads = 2;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--reps") && i + 1 < argc)
            reps = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--threads") && i + 1 < argc)
            threads = atoi(argv[++i]);
        else {
            fprintf(stderr, "usage: %s [--reps N] [--threads T]\n", argv[0]);
            return 2;
        }
    }
    if (reps < 1) reps = 1;
    omp_set_num_threads(threads);
    size_t n = (size_t)ROWS * COLS;
    float *a = ts_aligned_alloc(n * 4, "bench"), *r = ts_aligned_alloc(n * 4, "bench");
    float *z = ts_aligned_alloc(n * 4, "bench"), *v = ts_aligned_alloc(COLS * 4, "bench");
    for (size_t i = 0; i < n; i++) a[i] = (float)((i * 7919) % 1000) / 250.0f - 2.0f;
    for (size_t i = 0; i < n; i++) r[i] = (float)((i * 104729) % 1000) / 500.0f - 1.0f;
    for (size_t i = 0; i < COLS; i++) v[i] = (float)(i % 13) / 13.0f - 0.5f;
    printf("elementwise group on f32[%d,%d], %d threads, median of %d runs (ms)\n", ROWS, COLS,
           threads, reps);
    printf("%-36s %10s %12s %11s %13s\n", "group", "unfused", "interpreter", "hand-fused",
           "interp/hand");
    for (int which = 1; which <= 2; which++) {
        ts_graph *g = group_graph(which);
        double ms[2];
        for (int fuse = 0; fuse < 2; fuse++) {
            ts_compile_options o = ts_compile_options_default();
            o.threads = threads;
            o.no_fuse = !fuse;
            ts_plan *p;
            if (ts_compile(g, NULL, &o, &p) != TS_OK) {
                fprintf(stderr, "bench_fuse: %s\n", ts_last_error());
                return 1;
            }
            ts_plan_set_input(p, "a", a, n * 4);
            ts_plan_set_input(p, "r", r, n * 4);
            ts_plan_set_input(p, "v", v, COLS * 4);
            ms[fuse] = 1e3 * time_plan(p, reps);
            ts_plan_free(p);
        }
        double *t = malloc(sizeof(double) * (size_t)reps);
        for (int i = 0; i <= reps; i++) {
            double t0 = omp_get_wtime();
            if (which == 1)
                hand_g1(z, a, v, r);
            else
                hand_g2(z, a, v, r);
            if (i) t[i - 1] = omp_get_wtime() - t0;
        }
        double hand = 1e3 * ts_median(t, reps);
        free(t);
        printf("%-36s %10.3f %12.3f %11.3f %12.2fx\n",
               which == 1 ? "gelu_tanh(a + bias) + r  (3 ops)" : "relu(a * v + r)  (3 ops)", ms[0],
               ms[1], hand, ms[1] / hand);
        ts_graph_free(g);
    }
    ts_aligned_free(a);
    ts_aligned_free(r);
    ts_aligned_free(z);
    ts_aligned_free(v);
    return 0;
}
