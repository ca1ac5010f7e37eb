/* The GEMM ceiling of a workload (bench_ceiling.h). */
#include "bench_ceiling.h"

#include <omp.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include "backends/cpu/dnnl_matmul.h"

enum { REPS = 5 };

typedef struct linear {
    int64_t in, out, count; /* count: layers of this shape */
    int needs_dx;
} linear;

static int cmp_d(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* Median seconds of one GEMM of shape d; its implementation into impl. */
static ts_status time_gemm(const ts_mm_desc *d, double *sec, char *impl, size_t n) {
    ts_mm *mm = NULL;
    ts_status s = ts_mm_create(d, &mm);
    if (s != TS_OK) return s;
    const size_t es = ts_dtype_size(d->a_dt);
    const size_t na = (size_t)(d->M * d->K), nb = (size_t)(d->K * d->N), nc = (size_t)(d->M * d->N);
    size_t sb = ts_mm_scratch_bytes(mm);
    /* Operands of moderate values (bf16 0x3c00.. / f32 small): the time does
     * not depend on them, but denormals or NaNs could. */
    unsigned char *a = malloc(na * es), *b = malloc(nb * es);
    float *c = malloc(nc * sizeof *c);
    void *scratch = sb ? malloc(sb) : NULL;
    if (!a || !b || !c || (sb && !scratch))
        s = ts_fail(TS_ERR_NOMEM, "bench: GEMM ceiling buffers");
    if (s == TS_OK) {
        for (size_t i = 0; i < na * es; i++) a[i] = es == 2 ? (i & 1 ? 0x3c : (unsigned char)i) : 0;
        for (size_t i = 0; i < nb * es; i++) b[i] = es == 2 ? (i & 1 ? 0x3c : (unsigned char)i) : 0;
        if (es == 4) {
            for (size_t i = 0; i < na; i++) ((float *)a)[i] = (float)(i % 7) * 0.125f;
            for (size_t i = 0; i < nb; i++) ((float *)b)[i] = (float)(i % 5) * 0.25f;
        }
        double t[REPS];
        s = ts_mm_run(mm, a, b, c, scratch); /* warm-up: JIT, page faults, caches */
        for (int r = 0; s == TS_OK && r < REPS; r++) {
            double t0 = ts_now();
            s = ts_mm_run(mm, a, b, c, scratch);
            t[r] = ts_now() - t0;
        }
        if (s == TS_OK) {
            qsort(t, REPS, sizeof *t, cmp_d);
            *sec = t[REPS / 2];
            snprintf(impl, n, "%s", ts_mm_impl(mm));
        }
    }
    free(a), free(b), free(c), free(scratch);
    ts_mm_free(mm);
    return s;
}

ts_status ts_bench_gemm_ceiling(const char *wl, ts_dtype dt, int threads, ts_bench_ceiling *c) {
    return ts_bench_gemm_ceiling_print(wl, dt, threads, c, NULL);
}

ts_status ts_bench_gemm_ceiling_print(const char *wl, ts_dtype dt, int threads, ts_bench_ceiling *c,
                                      FILE *out) {
    memset(c, 0, sizeof *c);
    if (dt != TS_F32 && dt != TS_BF16)
        return ts_fail(TS_ERR_UNSUPPORTED, "bench: no GEMM ceiling for %s", ts_dtype_name(dt));
    linear l[8];
    int nl = 0;
    int64_t M;
    if (!strcasecmp(wl, "W1")) {
        const ts_mlp_config m = ts_mlp_w1();
        const int64_t in = m.in_dim ? m.in_dim : m.window * m.features;
        M = m.batch;
        l[nl++] = (linear){in, m.hidden, 1, 0}; /* fed by the data: no dX */
        if (m.n_hidden > 1) l[nl++] = (linear){m.hidden, m.hidden, m.n_hidden - 1, 1};
        l[nl++] = (linear){m.hidden, m.out_dim, 1, 1};
    } else if (!strcasecmp(wl, "W3")) {
        const ts_gpt_config g = ts_gpt_w3();
        const int64_t d = g.d_model;
        M = g.batch * g.ctx;
        l[nl++] = (linear){d, 3 * d, g.n_layers, 1}; /* attention qkv */
        l[nl++] = (linear){d, d, g.n_layers, 1};     /* attention output */
        l[nl++] = (linear){d, 4 * d, g.n_layers, 1}; /* MLP up */
        l[nl++] = (linear){4 * d, d, g.n_layers, 1}; /* MLP down */
        l[nl++] = (linear){d, g.vocab, 1, 1};        /* LM head (tied) */
    } else
        return ts_fail(TS_ERR_UNSUPPORTED, "bench: no GEMM shape list for %s", wl);
    const int saved = omp_get_max_threads();
    omp_set_num_threads(threads);
    ts_status s = TS_OK;
    double best_flops = 0;
    for (int i = 0; i < nl && s == TS_OK; i++)
        for (int k = 0; k < 3 && s == TS_OK; k++) { /* forward, dX, dW */
            if (k == 1 && !l[i].needs_dx) continue;
            ts_mm_desc d = {
                .a_dt = dt, .b_dt = dt, .c_dt = TS_F32, .batch = 1, .label = "GEMM ceiling"};
            if (k == 0) d.M = M, d.N = l[i].out, d.K = l[i].in, d.trans_b = 1;
            if (k == 1) d.M = M, d.N = l[i].in, d.K = l[i].out;
            if (k == 2) d.M = l[i].out, d.N = l[i].in, d.K = M, d.trans_a = 1;
            double sec = 0, f = 2.0 * (double)(d.M * d.N * d.K);
            char impl[64];
            s = time_gemm(&d, &sec, impl, sizeof impl);
            if (s != TS_OK) break;
            c->flops += f * (double)l[i].count;
            c->seconds += sec * (double)l[i].count;
            c->n_shapes++;
            if (out)
                fprintf(
                    out,
                    "         %-3s M %5lld N %5lld K %5lld%s x%lld: %8.3f ms %7.1f GFLOP/s (%s)\n",
                    k == 0   ? "fwd"
                    : k == 1 ? "dX"
                             : "dW",
                    (long long)d.M, (long long)d.N, (long long)d.K,
                    d.trans_a   ? " A^T"
                    : d.trans_b ? " B^T"
                                : "",
                    (long long)l[i].count, 1e3 * sec, f / sec * 1e-9, impl);
            if (f > best_flops) best_flops = f, snprintf(c->impl, sizeof c->impl, "%s", impl);
        }
    omp_set_num_threads(saved);
    if (s == TS_OK) c->gflops = c->seconds > 0 ? c->flops / c->seconds * 1e-9 : 0;
    return s;
}
