/* bench_gemm_head.c — an LM head's GEMMs and a layer's forward products with and without
 * tessel's plan for them.
 *
 *     OMP_NUM_THREADS=1 bench_gemm_head [reps]   (default 30 timed runs of each, alternated)
 *
 * W3's tied head (bf16, 2048 tokens, vocabulary 8192, d 512): logits = x W^T, dX = dlogits W and
 * dW = dlogits^T x + dE (the embedding's gradient as an add post-op); a W3 layer's forward
 * products with their bias: qkv, fc, and fc2 with its residual add. Each is created twice
 * through ts_mm_create: "plain" with the head plan off (ts_mm_head_enable(0): one oneDNN
 * primitive) and "head" with it on (src/backends/cpu/dnnl_matmul_head.h: a packed B in row blocks,
 * the add after the product; what tessel runs on one thread). The two run in turn, rep by rep, so
 * load changes hit them alike. Per run: process CPU time (on one thread, the time the product had
 * the core: robust to other processes on a shared machine) and wall time; min and median of each,
 * and the outputs compared bit for bit. The load average is printed before and after.
 */
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include "backends/cpu/dnnl_matmul.h"
#include "backends/cpu/dnnl_matmul_head.h"
#include "core/core.h"
#include "core/half.h"

enum { MAX_REPS = 200 };

typedef struct shape {
    const char *name;
    int64_t M, N, K;
    int ta, tb, bias, add;
} shape;

static const shape shapes[] = {
    {"logits x.W^T", 2048, 8192, 512, 0, 1, 0, 0},
    {"dX dlogits.W", 2048, 512, 8192, 0, 0, 0, 0},
    {"dW dlogits^T.x+dE", 8192, 512, 2048, 1, 0, 0, 1},
    {"qkv x.W^T+b", 2048, 1536, 512, 0, 1, 1, 0},
    {"fc x.W^T+b", 2048, 2048, 512, 0, 1, 1, 0},
    {"fc2 x.W^T+b+r", 2048, 512, 2048, 0, 1, 1, 1},
};

static double cpu_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static void *operand(int64_t n, size_t es, uint64_t seed) {
    void *p = ts_aligned_alloc((size_t)n * es, "bench operand");
    if (!p) return NULL;
    for (int64_t i = 0; i < n; i++) {
        uint32_t w[4];
        ts_philox(seed, 7, (uint64_t)i, w);
        float v = (float)(w[0] >> 8) * (1.0f / 8388608.0f) - 1.0f;
        if (es == 2)
            ((uint16_t *)p)[i] = ts_f32_to_bf16(v);
        else
            ((float *)p)[i] = v;
    }
    return p;
}

static void load_avg(const char *when) {
    double l[3];
    if (getloadavg(l, 3) == 3) printf("load average %s: %.2f %.2f %.2f\n", when, l[0], l[1], l[2]);
}

static int bench(const shape *s, int reps) {
    ts_mm_desc d = {.a_dt = TS_BF16,
                    .b_dt = TS_BF16,
                    .c_dt = TS_F32,
                    .batch = 1,
                    .M = s->M,
                    .N = s->N,
                    .K = s->K,
                    .trans_a = s->ta,
                    .trans_b = s->tb,
                    .n_post = s->bias + s->add,
                    .post = {s->bias ? TS_MM_POST_BIAS : TS_MM_POST_ADD, TS_MM_POST_ADD},
                    .label = s->name};
    ts_mm *mm[2] = {NULL, NULL};
    void *scratch[2] = {NULL, NULL};
    float *c[2] = {NULL, NULL};
    void *a = operand(s->M * s->K, 2, 1), *b = operand(s->K * s->N, 2, 2);
    float *p = s->add ? operand(s->M * s->N, 4, 3) : NULL;
    float *bv = s->bias ? operand(s->N, 4, 4) : NULL;
    const void *post[2] = {s->bias ? (const void *)bv : p, p};
    int ok = a && b && (p || !s->add) && (bv || !s->bias);
    for (int v = 0; v < 2 && ok; v++) {
        ts_mm_head_enable(v);
        ok = ts_mm_create(&d, &mm[v]) == TS_OK;
        ts_mm_head_enable(1);
        size_t sb = ok ? ts_mm_scratch_bytes(mm[v]) : 0;
        if (ok && sb) ok = (scratch[v] = ts_aligned_alloc(sb, "bench scratch")) != NULL;
        if (ok) ok = (c[v] = ts_aligned_alloc((size_t)(s->M * s->N) * 4, "bench C")) != NULL;
    }
    if (!ok) fprintf(stderr, "%s: %s\n", s->name, ts_last_error());
    double cpu[2][MAX_REPS], wall[2][MAX_REPS];
    for (int r = -1; r < reps && ok; r++) /* r = -1: warm-up (JIT, page faults) */
        for (int v = 0; v < 2 && ok; v++) {
            const double w0 = ts_now(), c0 = cpu_now();
            ok = ts_mm_run_post(mm[v], a, b, c[v], d.n_post ? post : NULL, scratch[v]) == TS_OK;
            if (r >= 0) cpu[v][r] = cpu_now() - c0, wall[v][r] = ts_now() - w0;
        }
    if (ok) {
        const double gflop = 2.0 * (double)(s->M * s->N * s->K) * 1e-9;
        const int same = memcmp(c[0], c[1], (size_t)(s->M * s->N) * 4) == 0;
        double med[2];
        for (int v = 0; v < 2; v++) {
            double cmin = cpu[v][0];
            for (int r = 1; r < reps; r++) cmin = cpu[v][r] < cmin ? cpu[v][r] : cmin;
            med[v] = ts_median(cpu[v], reps);
            double wmin = wall[v][0];
            for (int r = 1; r < reps; r++) wmin = wall[v][r] < wmin ? wall[v][r] : wmin;
            printf("%-18s %-5s cpu min %6.2f ms med %6.2f ms (%5.1f GFLOP/s)  wall min %6.2f "
                   "med %6.2f ms  %s\n",
                   s->name, v ? "head" : "plain", cmin * 1e3, med[v] * 1e3, gflop / cmin,
                   wmin * 1e3, ts_median(wall[v], reps) * 1e3, ts_mm_impl(mm[v]));
        }
        printf("%-18s head - plain: cpu median %+.2f ms; bits %s\n", s->name,
               (med[1] - med[0]) * 1e3, same ? "identical" : "DIFFER");
        ok = same;
    }
    for (int v = 0; v < 2; v++) {
        ts_mm_free(mm[v]);
        ts_aligned_free(scratch[v]);
        ts_aligned_free(c[v]);
    }
    ts_aligned_free(a);
    ts_aligned_free(b);
    ts_aligned_free(p);
    ts_aligned_free(bv);
    return ok;
}

int main(int argc, char **argv) {
    int reps = argc > 1 ? atoi(argv[1]) : 30;
    if (reps < 1 || reps > MAX_REPS) reps = 30;
    printf("bench_gemm_head: %d threads, %d reps each, alternated\n", omp_get_max_threads(), reps);
    load_avg("before");
    int ok = 1;
    for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++) ok &= bench(&shapes[i], reps);
    load_avg("after");
    return ok ? 0 : 1;
}
