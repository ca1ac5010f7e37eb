/* bench/memsched.c — memory-aware scheduling (docs/scheduling.md) in one
 * run: for the 3D U-Net (examples/w4.yaml) and the multi-sensor fusion
 * model (examples/fusion.yaml), three plans of the same step:
 *   build order  compile.naive_schedule (the order the graph was built in)
 *   search       the schedule pass's choice (build order, greedy, search)
 *   limit        the search plus compile.max_memory_mb set so that the
 *                temporaries are --cut (default 0.25) below build order's:
 *                recompute fills the gap
 * and prints each one's temporaries and step time against build order's,
 * the recompute's FLOPs (the estimate) beside its measured time, and
 * whether the three trained to the same bits. Steps of the three plans
 * alternate, and the medians are reported.
 *
 *   build/bench_memsched [--steps N] [--threads T] [--cut F]   (from the repository root)
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include "tessel/config.h"
#include "tessel/session.h"
#include "tessel/tessel.h"

enum { NP = 3, MAXS = 200 };

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

/* Random x, and y as class ids in [0, 2) (i64) or numbers (f32). */
static int feed(ts_plan *p, const char *name, unsigned *seed) {
    ts_dtype dt;
    int rank;
    int64_t dims[8];
    if (ts_plan_value_info(p, name, &dt, &rank, dims) != TS_OK) return 1;
    size_t n = 1;
    for (int d = 0; d < rank; d++) n *= (size_t)dims[d];
    size_t es = dt == TS_I64 ? sizeof(int64_t) : sizeof(float);
    void *buf = malloc(n * es);
    if (!buf) return 1;
    for (size_t i = 0; i < n; i++) {
        if (dt == TS_I64)
            ((int64_t *)buf)[i] = rand_r(seed) % 2;
        else
            ((float *)buf)[i] = (float)rand_r(seed) / (float)RAND_MAX - 0.5f;
    }
    ts_status s = ts_plan_set_input(p, name, buf, n * es);
    free(buf);
    return s != TS_OK;
}

/* Checksum of every parameter's bits. */
static unsigned long long param_hash(const ts_plan *p) {
    unsigned long long h = 1469598103934665603ull;
    for (int i = 0; i < ts_plan_param_count(p); i++) {
        const char *name = ts_plan_param_name(p, i);
        int rank;
        int64_t dims[8];
        ts_plan_value_info(p, name, NULL, &rank, dims);
        size_t n = 1;
        for (int d = 0; d < rank; d++) n *= (size_t)dims[d];
        float *v = malloc(n * sizeof(float));
        if (!v) return 0;
        ts_plan_read(p, name, v, n * sizeof(float));
        const unsigned char *b = (const unsigned char *)v;
        for (size_t k = 0; k < n * sizeof(float); k++) h = (h ^ b[k]) * 1099511628211ull;
        free(v);
    }
    return h;
}

static int workload(const char *path, const char *label, int steps, int threads, double cut) {
    ts_config c;
    ts_config_init(&c);
    ts_status s = ts_config_load_file(&c, path);
    if (s == TS_OK) s = ts_config_finish(&c);
    ts_graph *g = NULL;
    ts_model m;
    ts_train_spec spec;
    ts_compile_options base;
    if (s == TS_OK) s = ts_session_build_model(&c, &g, &m, &spec, &base);
    if (s != TS_OK) {
        fprintf(stderr, "%s: %s\n", path, ts_last_error());
        return 1;
    }
    base.threads = threads;
    static const char *const names[NP] = {"build order", "search", "limit"};
    ts_plan *p[NP] = {NULL, NULL, NULL};
    ts_plan_stats st[NP];
    double limit_mb = 0;
    for (int k = 0; k < NP && s == TS_OK; k++) {
        ts_compile_options o = base;
        o.naive_schedule = k == 0;
        if (k == 2) { /* the persistent part plus (1 - cut) of build order's temporaries */
            const size_t persistent = st[1].arena_bytes - st[1].temp_bytes;
            limit_mb = ((double)persistent + (1.0 - cut) * (double)st[0].temp_bytes) / 1048576.0;
            o.max_memory_mb = limit_mb;
        }
        s = ts_compile(g, &spec, &o, &p[k]);
        if (s == TS_OK) s = ts_plan_get_stats(p[k], &st[k]);
    }
    ts_graph_free(g);
    if (s != TS_OK) {
        fprintf(stderr, "%s: %s\n", label, ts_last_error());
        for (int k = 0; k < NP; k++) ts_plan_free(p[k]);
        return 1;
    }
    double t[NP][MAXS];
    unsigned seed = 17;
    int bad = 0;
    for (int i = -2; i < steps && !bad; i++) { /* two warm-up steps each */
        unsigned step_seed = seed + (unsigned)(i + 2);
        for (int k = 0; k < NP && !bad; k++) {
            unsigned sd = step_seed; /* the same batch for the three plans */
            bad |= feed(p[k], "x", &sd) || feed(p[k], "y", &sd);
            double t0 = now();
            bad |= ts_plan_step(p[k]) != TS_OK;
            if (i >= 0) t[k][i] = now() - t0;
        }
    }
    if (bad) {
        fprintf(stderr, "%s: a step failed: %s\n", label, ts_last_error());
        for (int k = 0; k < NP; k++) ts_plan_free(p[k]);
        return 1;
    }
    double med[NP];
    for (int k = 0; k < NP; k++) {
        med[k] = ts_median(t[k], steps);
    }
    unsigned long long h0 = param_hash(p[0]);
    int same = param_hash(p[1]) == h0 && param_hash(p[2]) == h0;
    printf("\n%s (%s), %d steps, %d thread%s; limit %.2f MiB (temporaries %.0f %% below build "
           "order)\n",
           label, path, steps, threads, threads == 1 ? "" : "s", limit_mb, 100.0 * cut);
    printf("  %-12s %14s %9s %11s %9s %13s %9s\n", "plan", "temporaries", "ratio", "recomputed",
           "+FLOPs", "step (median)", "ratio");
    for (int k = 0; k < NP; k++)
        printf("  %-12s %10.2f MiB %9.3f %11d %8.1f%% %10.2f ms %9.3f\n", names[k],
               (double)st[k].temp_bytes / 1048576.0,
               (double)st[k].temp_bytes / (double)st[0].temp_bytes, st[k].n_recomputed,
               100.0 * st[k].recompute_flops / st[0].flops_per_step, 1e3 * med[k], med[k] / med[0]);
    printf("  trained bits: %s\n", same ? "identical in the three plans" : "DIFFERENT");
    for (int k = 0; k < NP; k++) ts_plan_free(p[k]);
    return !same;
}

int main(int argc, char **argv) {
    int steps = 20, threads = 1;
    double cut = 0.25;
    for (int i = 1; i + 1 < argc; i++) {
        if (!strcmp(argv[i], "--steps"))
            steps = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--threads"))
            threads = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--cut"))
            cut = atof(argv[++i]);
    }
    if (steps < 1 || steps > MAXS) steps = 20;
    if (threads < 1) threads = 1;
    if (!(cut > 0 && cut < 1)) cut = 0.25;
    int rc = workload("examples/w4.yaml", "W4 3D U-Net", steps, threads, cut);
    rc |= workload("examples/fusion.yaml", "multi-sensor fusion", steps, threads, cut);
    return rc;
}
