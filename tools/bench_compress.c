/* Gradient compression against the dense all-reduce (see
 * bench_compress.h): `tessel bench --procs N --compress topk|powersgd`;
 * uses the public API only. */
#include "bench_compress.h"
#include "bench_dist.h"
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/mman.h>

ts_bench_compress_options ts_bench_compress_options_default(void) {
    ts_bench_compress_options o;
    memset(&o, 0, sizeof o);
    o.workload = "W1";
    o.procs = 2;
    o.threads = 1;
    o.steps = 10;
    o.warmup = 2;
    o.rounds = 2;
    o.c.method = TS_COMPRESS_TOPK;
    o.c.ratio = 0.001;
    o.c.values = TS_CVAL_E4M3;
    o.c.rank = 4;
    o.c.min_elems = 65536;
    return o;
}

/* What rank 0 of a run reports (MAP_SHARED: workers end with _exit). */
typedef struct run_out {
    double step_s, loss;
    ts_compress_stats st;
    char error[1024];
} run_out;

typedef struct run_ctx {
    const ts_bench_compress_options *o;
    int gpt, compress;
    int64_t rank_batch;
    run_out *out;
} run_ctx;

static int cmp_d(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static ts_status run_worker(ts_comm *comm, const run_ctx *rc) {
    const ts_bench_compress_options *o = rc->o;
    ts_graph *g = ts_graph_new();
    if (!g) return TS_ERR_NOMEM;
    ts_model m;
    ts_train_spec spec;
    ts_status s = ts_bench_dist_workload(g, rc->gpt, rc->rank_batch, &m, &spec);
    ts_plan *p = NULL;
    void *x = NULL, *y = NULL;
    double *times = NULL;
    if (s == TS_OK) {
        ts_compile_options co = ts_compile_options_default();
        co.threads = o->threads;
        co.comm = comm;
        co.dist_algo = TS_ALGO_NATIVE;
        if (rc->compress) co.compress = o->c;
        s = ts_compile(g, &spec, &co, &p);
    }
    size_t xb = 0, yb = 0;
    if (s == TS_OK) {
        xb = (size_t)ts_numel(g, m.input) * ts_dtype_size(ts_dtype_of(g, m.input));
        yb = (size_t)ts_numel(g, m.target) * ts_dtype_size(ts_dtype_of(g, m.target));
        x = ts_alloc(xb, "bench batch");
        y = ts_alloc(yb, "bench batch");
        times = ts_alloc(sizeof(double) * (size_t)o->steps, "bench times");
        if (!x || !y || !times) s = TS_ERR_NOMEM;
    }
    const int rank = ts_comm_rank(comm);
    if (s == TS_OK) s = ts_bench_dist_batch(rc->gpt, rc->rank_batch, rank, x, y);
    const char *in = s == TS_OK ? ts_name(g, m.input) : NULL,
               *tg = s == TS_OK ? ts_name(g, m.target) : NULL;
    for (int i = 0; s == TS_OK && i < o->warmup + o->steps; i++) {
        s = ts_plan_set_input(p, in, x, xb);
        if (s == TS_OK) s = ts_plan_set_input(p, tg, y, yb);
        if (s == TS_OK) s = ts_barrier(comm); /* every rank starts each step together */
        double t0 = ts_now();
        if (s == TS_OK) s = ts_plan_step(p);
        if (s == TS_OK && i >= o->warmup) times[i - o->warmup] = ts_now() - t0;
    }
    if (s == TS_OK && rank == 0) {
        qsort(times, (size_t)o->steps, sizeof *times, cmp_d);
        rc->out->step_s = times[o->steps / 2];
        rc->out->loss = ts_plan_loss(p);
        s = ts_plan_compress_stats(p, &rc->out->st);
    }
    free(times);
    free(x);
    free(y);
    ts_plan_free(p);
    ts_graph_free(g);
    return s;
}

static int worker(ts_comm *comm, void *user) {
    const run_ctx *rc = user;
    ts_status s = run_worker(comm, rc);
    if (s != TS_OK && ts_comm_rank(comm) == 0)
        snprintf(rc->out->error, sizeof rc->out->error, "%s", ts_last_error());
    return s == TS_OK ? 0 : 1;
}

static ts_status one_run(const ts_bench_compress_options *o, int gpt, int compress,
                         int64_t rank_batch, run_out *out) {
    memset(out, 0, sizeof *out);
    run_ctx rc = {o, gpt, compress, rank_batch, out};
    ts_shm_options so;
    memset(&so, 0, sizeof so);
    so.cpus_per_rank = o->threads;
    so.timeout_s = 600;
    fflush(NULL);
    ts_status s = ts_shm_launch(o->procs, &so, worker, &rc, NULL);
    if (s != TS_OK) return s;
    if (!(out->step_s > 0)) return ts_fail(TS_ERR_INTERNAL, "bench --compress: %s", out->error);
    return TS_OK;
}

static double median_of(double *v, int n) {
    qsort(v, (size_t)n, sizeof *v, cmp_d);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

static const char *method_words(const ts_compress_options *c, char *buf, size_t n) {
    static const char *const vals[] = {"e4m3", "e5m2", "bf16", "f32"};
    if (c->method == TS_COMPRESS_POWERSGD)
        snprintf(buf, n,
                 "powersgd rank %d, %d power iteration%s a step, tensors under %lld "
                 "elements dense",
                 c->rank, c->power_iters > 1 ? c->power_iters : 1, c->power_iters > 1 ? "s" : "",
                 (long long)c->min_elems);
    else
        snprintf(buf, n, "topk ratio %g, %s values", c->ratio, vals[c->values & 3]);
    return buf;
}

ts_status ts_bench_compress_run(const ts_bench_compress_options *opts) {
    ts_bench_compress_options o = opts ? *opts : ts_bench_compress_options_default();
    FILE *out = o.out ? o.out : stdout;
    int gpt;
    if (!strcasecmp(o.workload, "W1"))
        gpt = 0;
    else if (!strcasecmp(o.workload, "W3"))
        gpt = 1;
    else
        return ts_fail(TS_ERR_INVALID, "bench --compress: workload '%s' (W1 or W3)", o.workload);
    if (o.procs < 2 || o.threads < 1 || o.steps < 1 || o.warmup < 0 || o.rounds < 1 || !o.c.method)
        return ts_fail(TS_ERR_INVALID,
                       "bench --compress: procs >= 2, threads, steps, rounds >= 1, a method");
    const int64_t batch = gpt ? ts_gpt_w3().batch : ts_mlp_w1().batch;
    if (batch % o.procs)
        return ts_fail(TS_ERR_INVALID, "bench --compress: %s's batch %lld does not divide by %d",
                       o.workload, (long long)batch, o.procs);
    run_out *sh = mmap(NULL, sizeof *sh, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    double *tn = ts_alloc(sizeof(double) * (size_t)o.rounds, "bench"),
           *tc = ts_alloc(sizeof(double) * (size_t)o.rounds, "bench");
    ts_status s =
        sh == MAP_FAILED || !tn || !tc ? ts_fail(TS_ERR_NOMEM, "bench: out of memory") : TS_OK;
    char words[128];
    fprintf(out,
            "%s gradient compression on %d processes x %d thread(s), batch %lld each (shm): none "
            "vs %s; %d rounds of %d steps\n",
            o.workload, o.procs, o.threads, (long long)(batch / o.procs),
            method_words(&o.c, words, sizeof words), o.rounds, o.steps);
    ts_compress_stats st = {0};
    double loss_n = 0, loss_c = 0;
    for (int k = 0; s == TS_OK && k < o.rounds; k++) {
        s = one_run(&o, gpt, 0, batch / o.procs, sh);
        if (s == TS_OK) tn[k] = sh->step_s, loss_n = sh->loss;
        if (s == TS_OK) s = one_run(&o, gpt, 1, batch / o.procs, sh);
        if (s == TS_OK) tc[k] = sh->step_s, loss_c = sh->loss, st = sh->st;
        if (s == TS_OK)
            fprintf(out, "  round %d: none %.2f ms/step, compressed %.2f ms/step\n", k + 1,
                    tn[k] * 1e3, tc[k] * 1e3);
    }
    if (s == TS_OK) {
        const double mn = median_of(tn, o.rounds) * 1e3, mc = median_of(tc, o.rounds) * 1e3;
        fprintf(out,
                "  none:       median step %8.2f ms; per rank and step %.0f bytes of gradients "
                "all-reduced; loss %.6g\n",
                mn, st.dense_bytes, loss_n);
        fprintf(out,
                "  compressed: median step %8.2f ms; per rank and step %.0f bytes sent, %.0f "
                "received (%lld values); loss %.6g\n",
                mc, st.sent_bytes, st.recv_bytes, (long long)st.sent_values, loss_c);
        fprintf(out, "  sent bytes: 1/%.0f of dense; step time %.2fx none's\n",
                st.dense_bytes / st.sent_bytes, mc / mn);
    }
    if (sh != MAP_FAILED) munmap(sh, sizeof *sh);
    free(tn);
    free(tc);
    return s;
}
