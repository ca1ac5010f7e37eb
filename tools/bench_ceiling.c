/* The GEMM ceiling of a workload (bench_ceiling.h), on oneDNN directly. */
#include "bench_ceiling.h"

#include <omp.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <dnnl.h>

enum { REPS = 5 };

typedef struct linear {
    int64_t in, out, count; /* count: layers of this shape */
    int needs_dx;
} linear;

/* One GEMM shape: C[M,N] (f32) = op(A) op(B), A/B of type dt, transposes by strides. */
typedef struct gemm_desc {
    ts_dtype dt;
    int64_t M, N, K;
    int trans_a, trans_b;
} gemm_desc;

/* Median seconds of one oneDNN matmul of shape d (its public C API: the
 * primitive tessel's matmul kernel creates); its implementation into impl. */
static ts_status time_gemm(const gemm_desc *d, double *sec, char *impl, size_t n) {
    const dnnl_data_type_t t = d->dt == TS_BF16 ? dnnl_bf16 : dnnl_f32;
    dnnl_engine_t eng = NULL;
    dnnl_stream_t str = NULL;
    dnnl_primitive_desc_t pd = NULL;
    dnnl_primitive_t prim = NULL;
    dnnl_memory_t ma = NULL, mb = NULL, mc = NULL;
    dnnl_memory_desc_t da, db, dc;
    dnnl_matmul_desc_t op;
    const dnnl_dims_t sa = {d->M, d->K}, sb = {d->K, d->N}, sc = {d->M, d->N};
    const dnnl_dims_t ta = {d->trans_a ? 1 : d->K, d->trans_a ? d->M : 1};
    const dnnl_dims_t tb = {d->trans_b ? 1 : d->N, d->trans_b ? d->K : 1};
    const dnnl_dims_t tc = {d->N, 1};
    ts_status s = TS_OK;
    if (dnnl_engine_create(&eng, dnnl_cpu, 0) || dnnl_stream_create(&str, eng, 0) ||
        dnnl_memory_desc_init_by_strides(&da, 2, sa, t, ta) ||
        dnnl_memory_desc_init_by_strides(&db, 2, sb, t, tb) ||
        dnnl_memory_desc_init_by_strides(&dc, 2, sc, dnnl_f32, tc) ||
        dnnl_matmul_desc_init(&op, &da, &db, NULL, &dc) ||
        dnnl_primitive_desc_create(&pd, &op, NULL, eng, NULL) || dnnl_primitive_create(&prim, pd) ||
        dnnl_memory_create(&ma, &da, eng, DNNL_MEMORY_ALLOCATE) ||
        dnnl_memory_create(&mb, &db, eng, DNNL_MEMORY_ALLOCATE) ||
        dnnl_memory_create(&mc, &dc, eng, DNNL_MEMORY_ALLOCATE))
        s = ts_fail(TS_ERR_UNSUPPORTED, "bench: oneDNN refused the %lldx%lldx%lld GEMM",
                    (long long)d->M, (long long)d->N, (long long)d->K);
    if (s == TS_OK) {
        /* Moderate operand values: the time does not depend on them, but
         * denormals or NaNs could (bf16 0x3c.. is about 0.01). */
        void *pa = NULL, *pb = NULL;
        dnnl_memory_get_data_handle(ma, &pa);
        dnnl_memory_get_data_handle(mb, &pb);
        const size_t es = d->dt == TS_BF16 ? 2 : 4, na = (size_t)(d->M * d->K) * es,
                     nb = (size_t)(d->K * d->N) * es;
        for (size_t i = 0; i < na; i++) ((unsigned char *)pa)[i] = i % es == es - 1 ? 0x3c : 0;
        for (size_t i = 0; i < nb; i++) ((unsigned char *)pb)[i] = i % es == es - 1 ? 0x3c : 0;
        dnnl_exec_arg_t args[3] = {{DNNL_ARG_SRC, ma}, {DNNL_ARG_WEIGHTS, mb}, {DNNL_ARG_DST, mc}};
        double tm[REPS];
        for (int r = -1; r < REPS && s == TS_OK; r++) { /* r = -1: warm-up (JIT, page faults) */
            double t0 = ts_now();
            if (dnnl_primitive_execute(prim, str, 3, args) || dnnl_stream_wait(str))
                s = ts_fail(TS_ERR_INTERNAL, "bench: the ceiling GEMM failed");
            if (r >= 0) tm[r] = ts_now() - t0;
        }
        if (s == TS_OK) {
            *sec = ts_median(tm, REPS);
            const char *name = NULL;
            dnnl_primitive_desc_query(pd, dnnl_query_impl_info_str, 0, &name);
            snprintf(impl, n, "%s", name ? name : "?");
        }
    }
    dnnl_memory_destroy(ma), dnnl_memory_destroy(mb), dnnl_memory_destroy(mc);
    dnnl_primitive_destroy(prim), dnnl_primitive_desc_destroy(pd);
    dnnl_stream_destroy(str), dnnl_engine_destroy(eng);
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
            gemm_desc d = {.dt = dt};
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
