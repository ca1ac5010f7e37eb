/* Data-parallel training throughput (see bench_dist.h): `tessel bench
 * --procs N`; uses the public API only. */
#include "bench_dist.h"
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/mman.h>
#include "tessel/tessel.h"

enum { MAX_STEPS = 100000 };

ts_bench_dist_options ts_bench_dist_options_default(void) {
    ts_bench_dist_options o;
    memset(&o, 0, sizeof o);
    o.workload = "W1";
    o.procs = 2;
    o.threads = 1;
    o.steps = 10;
    o.warmup = 2;
    o.rounds = 2;
    return o;
}

/* What rank 0 of a run reports (MAP_SHARED: workers end with _exit). */
typedef struct run_out {
    double step_s; /* median timed step */
    double loss;
    size_t arena; /* rank 0's plan: bytes per process (with shared parameters) */
    char error[1024];
    char profile[2048]; /* rank 0's time per op kind (options.profile) */
} run_out;

typedef struct run_ctx {
    const ts_bench_dist_options *o;
    int gpt;
    int64_t rank_batch; /* rows per rank */
    int no_comm;        /* compile without the comm: no gradient exchange */
    run_out *out;
} run_ctx;

/* The op kinds that took the most time, per step. */
static void profile_text(const ts_plan *p, int steps, char *out) {
    ts_profile_entry top[12];
    const int n = ts_plan_profile(p, top, 12);
    size_t len = 0;
    for (int i = 0; i < n && i < 12; i++) {
        int w = snprintf(out + len, 2048 - len, "    %-22s %8.3f ms/step  (%d instructions)\n",
                         top[i].op, 1e3 * top[i].seconds / steps, top[i].instructions);
        if (w < 0 || (size_t)w >= 2048 - len) break;
        len += (size_t)w;
    }
}

ts_status ts_bench_dist_workload(ts_graph *g, int gpt, int64_t rank_batch, ts_model *m,
                                 ts_train_spec *spec) {
    ts_status s;
    if (gpt) {
        ts_gpt_config gc = ts_gpt_w3();
        gc.batch = rank_batch;
        s = ts_build_gpt(g, &gc, m);
        *spec = ts_train_spec_default(m->loss);
        spec->opt = ts_adamw(3e-4, 0.9, 0.999, 1e-8, 0.1);
    } else {
        ts_mlp_config mc = ts_mlp_w1();
        mc.batch = rank_batch;
        s = ts_build_mlp(g, &mc, m);
        *spec = ts_train_spec_default(m->loss);
        spec->opt = ts_adamw(1e-3, 0.9, 0.999, 1e-8, 0.01);
    }
    return s;
}

ts_status ts_bench_dist_batch(int gpt, int64_t rank_batch, int rank, void *x, void *y) {
    if (gpt) {
        const ts_gpt_config gc = ts_gpt_w3();
        return ts_synth_tokens(1234, rank, rank_batch, gc.ctx, gc.vocab, x, y);
    }
    const ts_mlp_config mc = ts_mlp_w1();
    return ts_synth_regression(1234, rank, rank_batch, mc.window, mc.features, mc.out_dim, x, y);
}

static ts_status run_worker(ts_comm *comm, const run_ctx *rc, double *median, double *loss) {
    const ts_bench_dist_options *o = rc->o;
    ts_graph *g = ts_graph_new();
    if (!g) return TS_ERR_NOMEM;
    ts_model m;
    ts_train_spec spec;
    ts_status s = ts_bench_dist_workload(g, rc->gpt, rc->rank_batch, &m, &spec);
    ts_plan *p = NULL;
    const int rank = ts_comm_rank(comm), profile = o->profile && !rc->no_comm;
    void *x = NULL, *y = NULL;
    double *times = NULL;
    if (s == TS_OK) {
        ts_compile_options co = ts_compile_options_default();
        co.threads = o->threads;
        co.comm = rc->no_comm ? NULL : comm;
        co.dist_algo = TS_ALGO_NATIVE; /* no probing inside the timed runs */
        co.zero = rc->no_comm ? 0 : o->zero;
        co.zero_private_params = o->private_params;
        co.bucket_mb = o->bucket_mb;
        co.profile = profile;
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
    if (s == TS_OK) s = ts_bench_dist_batch(rc->gpt, rc->rank_batch, rank, x, y);
    const char *in = s == TS_OK ? ts_name(g, m.input) : NULL,
               *tg = s == TS_OK ? ts_name(g, m.target) : NULL;
    for (int i = 0; s == TS_OK && i < o->warmup + o->steps; i++) {
        s = ts_plan_set_input(p, in, x, xb);
        if (s == TS_OK) s = ts_plan_set_input(p, tg, y, yb);
        /* every rank starts each timed step together */
        if (s == TS_OK) s = ts_barrier(comm);
        double t0 = ts_now();
        if (s == TS_OK) s = ts_plan_step(p);
        if (s == TS_OK && i >= o->warmup) times[i - o->warmup] = ts_now() - t0;
        if (s == TS_OK && profile && i + 1 == o->warmup) ts_plan_profile_reset(p);
    }
    if (s == TS_OK && profile && rank == 0) profile_text(p, o->steps, rc->out->profile);
    ts_plan_stats st;
    if (s == TS_OK && rank == 0 && ts_plan_get_stats(p, &st) == TS_OK)
        rc->out->arena = st.arena_bytes + st.shared_param_bytes;
    if (s == TS_OK) {
        *median = ts_median(times, o->steps);
        *loss = ts_plan_loss(p);
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
    double med = 0, loss = 0;
    ts_status s = run_worker(comm, rc, &med, &loss);
    if (ts_comm_rank(comm) == 0) {
        rc->out->step_s = s == TS_OK ? med : NAN;
        rc->out->loss = loss;
        if (s != TS_OK) snprintf(rc->out->error, sizeof rc->out->error, "%s", ts_last_error());
    }
    return s == TS_OK ? 0 : 1;
}

/* One run on n processes; the median step time of rank 0. */
static ts_status one_run(const ts_bench_dist_options *o, int gpt, int n, int64_t rank_batch,
                         int no_comm, run_out *out, double *step_s) {
    memset(out, 0, sizeof *out);
    run_ctx rc = {o, gpt, rank_batch, no_comm, out};
    ts_shm_options so;
    memset(&so, 0, sizeof so);
    so.cpus_per_rank = o->threads;
    so.timeout_s = 600;
    fflush(NULL);
    ts_status s = ts_shm_launch(n, &so, worker, &rc, NULL);
    if (s != TS_OK) return s;
    if (!(out->step_s > 0))
        return ts_fail(TS_ERR_INTERNAL, "bench: %d processes: %s", n, out->error);
    *step_s = out->step_s;
    return TS_OK;
}

/* What the N processes exchange, as configured (the shm transport shares
 * memory, so ZeRO keeps one copy of the parameters unless told not to). */
static const char *zero_words(const ts_bench_dist_options *o) {
    if (!o->zero) return "direct all-reduce";
    if (o->zero == 3)
        return "ZeRO-3: parameters gathered per bucket, reduce-scatter with early release, "
               "sharded update of the blocks";
    if (o->private_params)
        return o->zero == 2 ? "ZeRO-2: reduce-scatter with early release, sharded update, "
                              "all-gather"
                            : "ZeRO-1: reduce-scatter, sharded update, all-gather";
    return o->zero == 2 ? "ZeRO-2: reduce-scatter with early release, sharded update of the "
                          "shared parameters"
                        : "ZeRO-1: sharded update averaging the ranks' gradients in place, "
                          "shared parameters";
}

ts_status ts_bench_dist_run(const ts_bench_dist_options *opts, ts_bench_dist_result *r) {
    ts_bench_dist_options o = opts ? *opts : ts_bench_dist_options_default();
    FILE *out = o.out ? o.out : stdout;
    memset(r, 0, sizeof *r);
    int gpt;
    if (!strcasecmp(o.workload, "W1"))
        gpt = 0;
    else if (!strcasecmp(o.workload, "W3"))
        gpt = 1;
    else
        return ts_fail(TS_ERR_INVALID, "bench --procs: workload '%s' (W1 or W3)", o.workload);
    if (o.procs < 2 || o.threads < 1 || o.steps < 1 || o.steps > MAX_STEPS || o.warmup < 0 ||
        o.rounds < 1)
        return ts_fail(TS_ERR_INVALID, "bench --procs: procs >= 2, threads, steps, rounds >= 1");
    const int64_t batch = gpt ? ts_gpt_w3().batch : ts_mlp_w1().batch;
    const double per_row = gpt ? (double)ts_gpt_w3().ctx : 1.0;
    if (!o.per_rank_batch && batch % o.procs)
        return ts_fail(TS_ERR_INVALID, "bench --procs: %s's batch %lld does not divide by %d",
                       o.workload, (long long)batch, o.procs);
    const int64_t rank_batch = o.per_rank_batch ? batch : batch / o.procs;
    r->unit = gpt ? "tokens/s" : "samples/s";
    char prof[sizeof(((run_out *)0)->profile)] = "";
    run_out *sh = mmap(NULL, sizeof *sh, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    double *t1 = ts_alloc(sizeof(double) * (size_t)o.rounds, "bench"),
           *tn = ts_alloc(sizeof(double) * (size_t)o.rounds, "bench"),
           *ti = ts_alloc(sizeof(double) * (size_t)o.rounds, "bench");
    ts_status s = sh == MAP_FAILED || !t1 || !tn || !ti
                      ? ts_fail(TS_ERR_NOMEM, "bench: out of memory")
                      : TS_OK;
    fprintf(out,
            "%s data parallel: 1 process x %d thread(s), batch %lld  vs  %d processes x %d "
            "thread(s), batch %lld each (shm, %s); %d rounds of %d steps\n",
            o.workload, o.threads, (long long)batch, o.procs, o.threads, (long long)rank_batch,
            zero_words(&o), o.rounds, o.steps);
    size_t arena1 = 0, arena_n = 0;
    for (int k = 0; s == TS_OK && k < o.rounds; k++) {
        s = one_run(&o, gpt, 1, batch, 0, sh, &t1[k]);
        arena1 = sh->arena;
        if (s == TS_OK) s = one_run(&o, gpt, o.procs, rank_batch, 0, sh, &tn[k]);
        arena_n = sh->arena;
        if (s == TS_OK) memcpy(prof, sh->profile, sizeof prof);
        if (s == TS_OK) s = one_run(&o, gpt, o.procs, rank_batch, 1, sh, &ti[k]);
        if (s == TS_OK)
            fprintf(out,
                    "  round %d: 1 process %.2f ms/step, %d processes %.2f ms/step, the same "
                    "without gradient exchange %.2f ms/step\n",
                    k + 1, t1[k] * 1e3, o.procs, tn[k] * 1e3, ti[k] * 1e3);
    }
    if (s == TS_OK) {
        r->single_ms = ts_median(t1, o.rounds) * 1e3;
        r->multi_ms = ts_median(tn, o.rounds) * 1e3;
        r->single = (double)batch * per_row / (r->single_ms * 1e-3);
        r->multi = (double)(rank_batch * o.procs) * per_row / (r->multi_ms * 1e-3);
        r->ratio = r->multi / r->single;
        fprintf(out, "  1 process:   %10.0f %s (median step %.2f ms)\n", r->single, r->unit,
                r->single_ms);
        fprintf(out, "  %d processes: %10.0f %s (median step %.2f ms)\n", o.procs, r->multi,
                r->unit, r->multi_ms);
        fprintf(out, "  ratio %.2fx (target >= 1.8x for 2 processes, shared/BENCH.md)\n", r->ratio);
        fprintf(out, "  memory per process: %.1f MiB (1 process: %.1f MiB, %.2fx)\n",
                (double)arena_n / 1048576.0, (double)arena1 / 1048576.0,
                arena1 ? (double)arena_n / (double)arena1 : 0.0);
        /* What the machine gives N processes at all: the same ranks
         * computing their batches without exchanging gradients. */
        r->compute_only = (double)(rank_batch * o.procs) * per_row / ts_median(ti, o.rounds);
        fprintf(out,
                "  %d processes without gradient exchange: %.0f %s (%.2fx one process), the "
                "ceiling on this machine now; data parallel reaches %.0f %% of it\n",
                o.procs, r->compute_only, r->unit, r->compute_only / r->single,
                100.0 * r->multi / r->compute_only);
        /* Without ZeRO every process runs the whole optimizer update: say
         * what shards it (docs/distributed.md, the benchmark section). */
        if (!o.zero)
            fprintf(out,
                    "  (every process runs the whole optimizer update here; --zero 2 shards it "
                    "and the gradients, with the parameters shared by the processes)\n");
        if (o.profile)
            fprintf(out, "  rank 0 of %d processes, time per op kind (last round):\n%s", o.procs,
                    prof);
    }
    if (sh != MAP_FAILED) munmap(sh, sizeof *sh);
    free(t1);
    free(tn);
    free(ti);
    return s;
}
