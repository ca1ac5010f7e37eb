/* bench_gemm.c — GFLOP/s of the oneDNN matmul wrapper on tessel's workload shapes.
 *
 *     OMP_NUM_THREADS=2 bench_gemm [reps]      (default 9 timed runs per shape)
 *
 * For every shape: f32 (f32 x f32 -> f32) and bf16 (bf16 x bf16 -> f32), the
 * median GFLOP/s over `reps` runs after two warm-up runs, the time to create
 * each primitive, the oneDNN implementation, and the naive reference kernel
 * (ts_mm_ref_f32, timed on the first rows only: it is slow).
 * "cpu%" is the process CPU time over (wall time x threads) during the timed
 * runs: well below 100% means other processes took the cores and the numbers
 * are low. The load average is printed before and after for the same reason.
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
    int64_t batch, M, N, K;
    int ta, tb;
} shape;

static const shape shapes[] = {
    {"mlp1.fwd  X.W^T", 1, 256, 1024, 2048, 0, 1},  {"mlp1.dX   dY.W", 1, 256, 2048, 1024, 0, 0},
    {"mlp1.dW   dY^T.X", 1, 1024, 2048, 256, 1, 0}, {"mlp2.fwd  X.W^T", 1, 256, 1024, 1024, 0, 1},
    {"mlp2.dW   dY^T.X", 1, 1024, 1024, 256, 1, 0}, {"gpt.qkv   X.W^T", 1, 2048, 1536, 512, 0, 1},
    {"gpt.qkv.dW", 1, 1536, 512, 2048, 1, 0},       {"gpt.lm    X.W^T", 1, 2048, 8192, 512, 0, 1},
    {"gpt.lm.dX dY.W", 1, 2048, 512, 8192, 0, 0},   {"gpt.lm.dW dY^T.X", 1, 8192, 512, 2048, 1, 0},
    {"attn.qk   Q.K^T", 64, 256, 256, 64, 0, 1},    {"attn.pv   P.V", 64, 256, 64, 256, 0, 0},
    {"attn.dV   P^T.dO", 64, 256, 64, 256, 1, 0},
};

static double cpu_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static const char *isa_name(dnnl_cpu_isa_t isa) {
    switch (isa) {
    case dnnl_cpu_isa_avx512_core_amx: return "avx512_core_amx";
    case dnnl_cpu_isa_avx512_core_bf16: return "avx512_core_bf16";
    case dnnl_cpu_isa_avx512_core_vnni: return "avx512_core_vnni";
    case dnnl_cpu_isa_avx512_core: return "avx512_core";
    case dnnl_cpu_isa_avx2_vnni: return "avx2_vnni";
    case dnnl_cpu_isa_avx2: return "avx2";
    default: return "other";
    }
}

typedef struct result {
    double gflops, create_ms;
    double busy; /* process CPU time / (wall time x threads) over the timed runs */
    char impl[32];
} result;

/* Median GFLOP/s of `reps` runs of one shape in one dtype. */
static ts_status bench_one(const shape *s, ts_dtype in, int reps, result *r) {
    ts_mm_desc d = {.a_dt = in,
                    .b_dt = in,
                    .c_dt = TS_F32,
                    .batch = s->batch,
                    .M = s->M,
                    .N = s->N,
                    .K = s->K,
                    .trans_a = s->ta,
                    .trans_b = s->tb,
                    .label = s->name};
    const size_t es = ts_dtype_size(in);
    const size_t na = (size_t)(s->batch * s->M * s->K), nb = (size_t)(s->batch * s->K * s->N);
    const size_t nc = (size_t)(s->batch * s->M * s->N);
    ts_status st = TS_OK;
    ts_mm *m = NULL;
    void *scratch = NULL;
    void *a = ts_aligned_alloc(na * es, "bench A");
    void *b = ts_aligned_alloc(nb * es, "bench B");
    float *c = ts_aligned_alloc(nc * sizeof(float), "bench C");
    double *t = malloc((size_t)reps * sizeof(double));
    if (!a || !b || !c || !t) {
        st = ts_fail(TS_ERR_NOMEM, "bench %s: out of memory", s->name);
        goto done;
    }
    /* Small values (bf16 0x3c00 = 2^-7, f32 0.01): no overflow, no denormals. */
    for (size_t i = 0; i < na; i++) {
        if (es == 2)
            ((uint16_t *)a)[i] = 0x3c00;
        else
            ((float *)a)[i] = 0.01f;
    }
    for (size_t i = 0; i < nb; i++) {
        if (es == 2)
            ((uint16_t *)b)[i] = 0x3c00;
        else
            ((float *)b)[i] = 0.01f;
    }
    memset(c, 0, nc * sizeof(float));

    double t0 = ts_now();
    st = ts_mm_create(&d, &m);
    r->create_ms = (ts_now() - t0) * 1e3;
    if (st != TS_OK) goto done;
    snprintf(r->impl, sizeof r->impl, "%s", ts_mm_impl(m));
    if (ts_mm_scratch_bytes(m) > 0 && !(scratch = ts_aligned_alloc(ts_mm_scratch_bytes(m), "sp"))) {
        st = TS_ERR_NOMEM;
        goto done;
    }
    for (int i = 0; i < 2 && st == TS_OK; i++) st = ts_mm_run(m, a, b, c, scratch);
    double w0 = ts_now(), c0 = cpu_now();
    for (int i = 0; i < reps && st == TS_OK; i++) {
        t0 = ts_now();
        st = ts_mm_run(m, a, b, c, scratch);
        t[i] = ts_now() - t0;
    }
    if (st != TS_OK) goto done;
    r->busy = (cpu_now() - c0) / ((ts_now() - w0) * ts_mm_threads(m));
    r->gflops = 2.0 * (double)s->batch * (double)s->M * (double)s->N * (double)s->K /
                ts_median(t, reps) * 1e-9;
done:
    ts_mm_free(m);
    ts_aligned_free(scratch);
    ts_aligned_free(a);
    ts_aligned_free(b);
    ts_aligned_free(c);
    free(t);
    return st;
}

/* The reference kernel on the first min(M, 16) rows of the first batch. */
static ts_status bench_ref(const shape *s, double *gflops) {
    ts_mm_desc d = {.batch = 1,
                    .M = s->M < 16 ? s->M : 16,
                    .N = s->N,
                    .K = s->K,
                    .trans_a = 0,
                    .trans_b = s->tb,
                    .label = s->name};
    const size_t na = (size_t)(d.M * d.K), nb = (size_t)(d.K * d.N), nc = (size_t)(d.M * d.N);
    float *a = malloc(na * sizeof(float)), *b = malloc(nb * sizeof(float));
    float *c = malloc(nc * sizeof(float));
    ts_status st = TS_OK;
    if (!a || !b || !c) {
        st = ts_fail(TS_ERR_NOMEM, "bench ref %s: out of memory", s->name);
    } else {
        for (size_t i = 0; i < na; i++) a[i] = 0.01f;
        for (size_t i = 0; i < nb; i++) b[i] = 0.01f;
        /* trans_a only changes A's stride; time the layout actually used */
        d.trans_a = s->ta;
        double t0 = ts_now();
        st = ts_mm_ref_f32(&d, a, b, c);
        double dt = ts_now() - t0;
        *gflops = 2.0 * (double)d.M * (double)d.N * (double)d.K / dt * 1e-9;
    }
    free(a);
    free(b);
    free(c);
    return st;
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

int main(int argc, char **argv) {
    int reps = argc > 1 ? atoi(argv[1]) : 9;
    if (reps < 1) reps = 1;
    printf("bench_gemm: %d threads, oneDNN ISA %s, median of %d runs\n", omp_get_max_threads(),
           isa_name(dnnl_get_effective_cpu_isa()), reps);
    print_loadavg("before");
    /* The first primitive also pays for engine creation and one-time JIT setup. */
    double t0 = ts_now();
    ts_mm *warm = NULL;
    ts_mm_desc wd = {.a_dt = TS_F32,
                     .b_dt = TS_F32,
                     .c_dt = TS_F32,
                     .batch = 1,
                     .M = 8,
                     .N = 8,
                     .K = 8,
                     .label = "warmup"};
    if (ts_mm_create(&wd, &warm) != TS_OK) {
        fprintf(stderr, "bench_gemm: %s\n", ts_last_error());
        return 1;
    }
    printf("first primitive (engine + stream + JIT init): %.2f ms\n", (ts_now() - t0) * 1e3);
    ts_mm_free(warm);

    printf("%-18s %-16s %8s %8s %7s %7s %7s %5s  %s\n", "shape", "b x M x N x K", "f32", "bf16",
           "ref", "cr f32", "cr bf16", "cpu%", "impl f32 / bf16");
    printf("%-18s %-16s %8s %8s %7s %7s %7s\n", "", "", "GFLOP/s", "GFLOP/s", "GFLOP/s", "ms",
           "ms");
    for (size_t i = 0; i < sizeof shapes / sizeof *shapes; i++) {
        const shape *s = &shapes[i];
        result rf = {0}, rb = {0};
        double ref = 0.0;
        if (bench_one(s, TS_F32, reps, &rf) != TS_OK || bench_one(s, TS_BF16, reps, &rb) != TS_OK ||
            bench_ref(s, &ref) != TS_OK) {
            fprintf(stderr, "bench_gemm: %s\n", ts_last_error());
            return 1;
        }
        char dims[64];
        snprintf(dims, sizeof dims, "%lldx%lldx%lldx%lld", (long long)s->batch, (long long)s->M,
                 (long long)s->N, (long long)s->K);
        printf("%-18s %-16s %8.1f %8.1f %7.2f %7.2f %7.2f %5.0f  %s / %s\n", s->name, dims,
               rf.gflops, rb.gflops, ref, rf.create_ms, rb.create_ms,
               100.0 * (rf.busy < rb.busy ? rf.busy : rb.busy), rf.impl, rb.impl);
        fflush(stdout);
    }
    print_loadavg("after");
    return 0;
}
