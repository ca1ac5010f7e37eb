/* bench_gemm_threads.c — what thread-count determinism costs the bf16 GEMMs it changes.
 *
 *     OMP_NUM_THREADS=2 bench_gemm_threads [reps]   (default 9 timed runs of each, interleaved)
 *
 * For shapes whose bits oneDNN 2.6 makes depend on the thread count (on AMX: gpt's dX, the GRU's
 * dW_ih; see src/backends/cpu/dnnl_matmul_rows.h), bf16 x bf16 -> f32 GFLOP/s of:
 *   onednn   the plain oneDNN primitive created for T threads (fast, but its bits follow T),
 *   tessel   ts_mm created under T threads (what plans use: plain where exact, else "+rows" or
 *            "+1thr"; its implementation is printed),
 *   1thr     ts_mm created under one thread (the one-thread fallback's speed).
 * The three run in turn, rep by rep, so load changes hit them alike; medians, their ratios to
 * onednn, and "cpu%" (process CPU time over wall time x T over all runs: well below 100% means
 * other processes took the cores). The load average is printed before and after.
 */
#include <dnnl.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include "backends/cpu/dnnl_matmul.h"
#include "core/core.h"

typedef struct shape {
    const char *name;
    int64_t M, N, K;
    int ta, tb;
} shape;

static const shape shapes[] = {
    {"gpt.qkv.dX dY.W", 2048, 512, 1536, 0, 0},   {"gru.dWih dY^T.X", 768, 32, 8192, 1, 0},
    {"gpt.qkv.fwd X.W^T", 2048, 1536, 512, 0, 1}, {"gpt.lm.dX dY.W", 2048, 512, 8192, 0, 0},
    {"gpt.lm.dW dY^T.X", 8192, 512, 2048, 1, 0},
};

static double cpu_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static void print_loadavg(const char *when) {
    char buf[128] = "?";
    FILE *f = fopen("/proc/loadavg", "r");
    if (f) {
        if (!fgets(buf, sizeof buf, f)) buf[0] = 0;
        fclose(f);
    }
    buf[strcspn(buf, "\n")] = 0;
    printf("load average %s: %s\n", when, buf);
}

/* The plain oneDNN primitive (created for the current thread count), without tessel's checks. */
typedef struct raw {
    dnnl_engine_t eng;
    dnnl_stream_t str;
    dnnl_primitive_t prim;
    dnnl_memory_t a, b, c;
} raw;

static void md2(dnnl_memory_desc_t *md, int64_t r, int64_t c, int trans) {
    dnnl_dims_t d = {r, c}, s = {trans ? 1 : c, trans ? r : 1};
    dnnl_memory_desc_init_by_strides(md, 2, d, dnnl_bf16, s);
}

static int raw_create(raw *x, const shape *s) {
    memset(x, 0, sizeof *x);
    dnnl_memory_desc_t a, b, c;
    md2(&a, s->M, s->K, s->ta);
    md2(&b, s->K, s->N, s->tb);
    dnnl_dims_t dc = {s->M, s->N}, sc = {s->N, 1};
    dnnl_memory_desc_init_by_strides(&c, 2, dc, dnnl_f32, sc);
    dnnl_matmul_desc_t op;
    dnnl_primitive_desc_t pd = NULL;
    if (dnnl_engine_create(&x->eng, dnnl_cpu, 0) || dnnl_stream_create(&x->str, x->eng, 0) ||
        dnnl_matmul_desc_init(&op, &a, &b, NULL, &c) ||
        dnnl_primitive_desc_create(&pd, &op, NULL, x->eng, NULL) ||
        dnnl_primitive_create(&x->prim, pd) ||
        dnnl_memory_create(&x->a, &a, x->eng, DNNL_MEMORY_NONE) ||
        dnnl_memory_create(&x->b, &b, x->eng, DNNL_MEMORY_NONE) ||
        dnnl_memory_create(&x->c, &c, x->eng, DNNL_MEMORY_NONE)) {
        if (pd) dnnl_primitive_desc_destroy(pd);
        return 0;
    }
    dnnl_primitive_desc_destroy(pd);
    return 1;
}

static int raw_run(raw *x, void *a, void *b, void *c) {
    dnnl_memory_set_data_handle(x->a, a);
    dnnl_memory_set_data_handle(x->b, b);
    dnnl_memory_set_data_handle(x->c, c);
    dnnl_exec_arg_t args[3] = {
        {DNNL_ARG_SRC, x->a}, {DNNL_ARG_WEIGHTS, x->b}, {DNNL_ARG_DST, x->c}};
    return dnnl_primitive_execute(x->prim, x->str, 3, args) == dnnl_success &&
           dnnl_stream_wait(x->str) == dnnl_success;
}

static void raw_free(raw *x) {
    if (x->a) dnnl_memory_destroy(x->a);
    if (x->b) dnnl_memory_destroy(x->b);
    if (x->c) dnnl_memory_destroy(x->c);
    if (x->prim) dnnl_primitive_destroy(x->prim);
    if (x->str) dnnl_stream_destroy(x->str);
    if (x->eng) dnnl_engine_destroy(x->eng);
}

static ts_mm *create_under(const ts_mm_desc *d, int nthr) {
    const int prev = omp_get_max_threads();
    omp_set_num_threads(nthr);
    ts_mm *m = NULL;
    if (ts_mm_create(d, &m) != TS_OK) fprintf(stderr, "bench_gemm_threads: %s\n", ts_last_error());
    omp_set_num_threads(prev);
    return m;
}

static int bench_shape(const shape *s, int nthr, int reps) {
    ts_mm_desc d = {.a_dt = TS_BF16,
                    .b_dt = TS_BF16,
                    .c_dt = TS_F32,
                    .batch = 1,
                    .M = s->M,
                    .N = s->N,
                    .K = s->K,
                    .trans_a = s->ta,
                    .trans_b = s->tb,
                    .label = s->name};
    const size_t na = (size_t)(s->M * s->K), nb = (size_t)(s->K * s->N), nc = (size_t)(s->M * s->N);
    uint16_t *a = ts_aligned_alloc(na * 2, "A"), *b = ts_aligned_alloc(nb * 2, "B");
    float *c = ts_aligned_alloc(nc * 4, "C");
    double *t = malloc(3 * (size_t)reps * sizeof(double));
    raw x;
    int ok = a && b && c && t && raw_create(&x, s);
    ts_mm *mt = ok ? create_under(&d, nthr) : NULL, *m1 = ok ? create_under(&d, 1) : NULL;
    size_t sb = mt && m1 ? ts_mm_scratch_bytes(mt) : 0;
    if (m1 && ts_mm_scratch_bytes(m1) > sb) sb = ts_mm_scratch_bytes(m1);
    void *scratch = sb ? ts_aligned_alloc(sb, "scratch") : NULL;
    ok = ok && mt && m1 && (!sb || scratch);
    if (ok) {
        /* small values (bf16 2^-7): no overflow, no denormals */
        for (size_t i = 0; i < na; i++) a[i] = 0x3c00;
        for (size_t i = 0; i < nb; i++) b[i] = 0x3c00;
        for (int w = 0; w < 2 && ok; w++) /* warm-up */
            ok = raw_run(&x, a, b, c) && ts_mm_run(mt, a, b, c, scratch) == TS_OK &&
                 ts_mm_run(m1, a, b, c, scratch) == TS_OK;
    }
    double w0 = ts_now(), c0 = cpu_now();
    for (int r = 0; r < reps && ok; r++) {
        double t0 = ts_now();
        ok = raw_run(&x, a, b, c);
        double t1 = ts_now();
        ok = ok && ts_mm_run(mt, a, b, c, scratch) == TS_OK;
        double t2 = ts_now();
        ok = ok && ts_mm_run(m1, a, b, c, scratch) == TS_OK;
        t[r] = t1 - t0;
        t[reps + r] = t2 - t1;
        t[2 * reps + r] = ts_now() - t2;
    }
    if (ok) {
        const double busy = (cpu_now() - c0) / ((ts_now() - w0) * nthr);
        double g[3];
        for (int k = 0; k < 3; k++) {
            g[k] = 2.0 * (double)s->M * (double)s->N * (double)s->K /
                   ts_median(t + k * reps, reps) * 1e-9;
        }
        printf("%-18s %5lldx%5lldx%5lld %8.1f %8.1f %8.1f %6.2f %6.2f %5.0f  %s\n", s->name,
               (long long)s->M, (long long)s->N, (long long)s->K, g[0], g[1], g[2], g[1] / g[0],
               g[2] / g[0], 100.0 * busy, ts_mm_impl(mt));
        fflush(stdout);
    } else {
        fprintf(stderr, "bench_gemm_threads: %s failed\n", s->name);
    }
    if (a && b && c && t) raw_free(&x);
    ts_mm_free(mt);
    ts_mm_free(m1);
    ts_aligned_free(scratch);
    ts_aligned_free(a);
    ts_aligned_free(b);
    ts_aligned_free(c);
    free(t);
    return ok;
}

int main(int argc, char **argv) {
    int reps = argc > 1 ? atoi(argv[1]) : 9;
    if (reps < 1) reps = 1;
    const int nthr = omp_get_max_threads();
    printf("bench_gemm_threads: bf16 x bf16 -> f32, %d threads, median of %d runs each\n", nthr,
           reps);
    print_loadavg("before");
    printf("%-18s %17s %8s %8s %8s %6s %6s %5s  %s\n", "shape", "M x N x K", "onednn", "tessel",
           "1thr", "tes/od", "1t/od", "cpu%", "tessel impl");
    for (size_t i = 0; i < sizeof shapes / sizeof *shapes; i++)
        if (!bench_shape(&shapes[i], nthr, reps)) return 1;
    print_loadavg("after");
    return 0;
}
