/* bench/pipeline.c — pipeline stages against one process (docs/distributed.md,
 * "Pipeline stages", Benchmark): step time of S stage processes over M
 * micro-batches, each stage's measured forward + backward per micro-batch
 * against the cost model's estimate, and the bubble (idle share of stage
 * time) measured against the schedule's prediction and against the same
 * schedule simulated with the stages' measured times (the part of the
 * bubble their imbalance explains; the rest is overhead and jitter).
 *
 *   build/bench_pipeline [--config examples/w3.yaml] [--stages 2] [--microbatches 8]
 *       [--schedule 1f1b|gpipe] [--steps 3] [--threads 1] [--single]
 *       [--devices FILE] [--slow RANK:FACTOR]
 *
 * --single times one process over the whole batch instead (the baseline).
 * --slow makes one rank a device of 1/FACTOR the speed (it sleeps FACTOR-1
 * times each piece of its work); --devices gives the planner the speeds
 * (examples/devices_unequal.txt: the second device at half speed). The
 * first step is a warm-up; the median of the others is reported. The last
 * step is also shown piece by piece: each stage's time by kind (forward,
 * backward, each wait, copies, sums, update) and its timeline, where the
 * stages' micro-batches line up against each other. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include "passes/partition.h"
#include "session/stages.h"
#include "tessel/tessel.h"

enum { MAX_STEPS = 64, MAX_EVENTS = 1024 };

/* One piece of the last step's timeline (ts_stage_event, copied out of the
 * worker). */
typedef struct event {
    char what[16];
    int mb;
    double t0, t1, cpu;
} event;

typedef struct result {
    double step[MAX_STEPS];
    ts_stage_times t[MAX_STEPS];
    double est_s, est_step, est_bubble, loss;
    int n_ops, n_ev;
    event ev[MAX_EVENTS];
} result;

static const char *cfg_path = "examples/w3.yaml", *devices = NULL, *schedule = "1f1b";
static int S = 2, M = 8, steps = 3, threads = 1, single = 0, slow_rank = -1;
static double slow_factor = 1;
static result *res; /* shared with the workers */

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

static double median(const double *v, int n) {
    double w[MAX_STEPS];
    memcpy(w, v, (size_t)n * sizeof *w);
    return ts_median(w, n);
}

static ts_status load(ts_config *c, int stages) {
    ts_config_init(c);
    ts_status s = ts_config_load_file(c, cfg_path);
    char set[4][600];
    snprintf(set[0], sizeof set[0], "dist.pipeline_stages=%d", stages);
    snprintf(set[1], sizeof set[1], "dist.microbatches=%d", stages > 1 ? M : 1);
    snprintf(set[2], sizeof set[2], "dist.pipeline_schedule=%s", schedule);
    snprintf(set[3], sizeof set[3], "dist.devices=%s", devices ? devices : "measure");
    for (int i = 0; i < 4 && s == TS_OK; i++) s = ts_config_set(c, set[i]);
    c->train.threads = threads;
    if (s == TS_OK) s = ts_config_finish(c);
    return s;
}

/* A whole batch of fixed tokens (W3: the GPT's tokens and targets). */
static int64_t *tokens(const ts_config *c, int which) {
    const size_t n = (size_t)(c->model.batch * c->model.ctx);
    int64_t *t = malloc(n * sizeof *t);
    uint64_t r = 0x9e37u + (uint64_t)which;
    for (size_t i = 0; t && i < n; i++) {
        r = r * 6364136223846793005ull + 1442695040888963407ull;
        t[i] = (int64_t)((r >> 33) % (uint64_t)c->model.vocab);
    }
    return t;
}

static int worker(ts_comm *comm, void *user) {
    (void)user;
    const int rank = ts_comm_rank(comm);
    ts_config c;
    ts_stage *st = NULL;
    if (load(&c, S) != TS_OK || ts_stage_new(&c, comm, &st) != TS_OK) {
        fprintf(stderr, "rank %d: %s\n", rank, ts_last_error());
        return 2;
    }
    if (rank == slow_rank) ts_stage_set_slowdown(st, slow_factor);
    int64_t *x = tokens(&c, 0), *y = tokens(&c, 1);
    const char *names[2] = {"tokens", "targets"};
    const void *data[2] = {x, y};
    result *r = &res[rank];
    const ts_partition_stage *ps = ts_partition_stage_at(ts_stage_partition_of(st), rank);
    r->est_s = ps->compute_s;
    r->n_ops = ps->n_ops;
    ts_partition_predict(ts_stage_partition_of(st), &r->est_step, &r->est_bubble);
    for (int t = 0; t < steps; t++) {
        if (ts_stage_step(st, 2, names, data) != TS_OK) {
            fprintf(stderr, "%s\n", ts_last_error());
            return 3;
        }
        ts_stage_last_times(st, &r->t[t]);
        r->step[t] = r->t[t].step;
    }
    const ts_stage_event *ev;
    const int n_ev = ts_stage_timeline(st, &ev);
    for (int i = 0; i < n_ev && i < MAX_EVENTS; i++) {
        snprintf(r->ev[i].what, sizeof r->ev[i].what, "%s", ev[i].what);
        r->ev[i].mb = ev[i].mb, r->ev[i].t0 = ev[i].t0, r->ev[i].t1 = ev[i].t1;
        r->ev[i].cpu = ev[i].cpu;
    }
    r->n_ev = n_ev < MAX_EVENTS ? n_ev : MAX_EVENTS;
    r->loss = ts_stage_loss(st);
    if (rank == 0) ts_partition_print(ts_stage_partition_of(st), stdout);
    fflush(stdout);
    free(x), free(y);
    ts_stage_free(st);
    return 0;
}

static int run_single(void) {
    ts_config c;
    ts_graph *g = NULL;
    ts_model m;
    ts_train_spec spec;
    ts_compile_options opt;
    ts_plan *p = NULL;
    ts_status s = load(&c, 1);
    if (s == TS_OK) s = ts_session_build_model(&c, &g, &m, &spec, &opt);
    if (s == TS_OK) s = ts_compile(g, &spec, &opt, &p);
    int64_t *x = tokens(&c, 0), *y = tokens(&c, 1);
    const size_t bytes = (size_t)(c.model.batch * c.model.ctx) * sizeof(int64_t);
    double t[MAX_STEPS];
    for (int i = 0; i < steps && s == TS_OK; i++) {
        s = ts_plan_set_input(p, "tokens", x, bytes);
        if (s == TS_OK) s = ts_plan_set_input(p, "targets", y, bytes);
        const double t0 = now();
        if (s == TS_OK) s = ts_plan_step(p);
        t[i] = now() - t0;
    }
    if (s != TS_OK) {
        fprintf(stderr, "single: %s\n", ts_last_error());
        return 1;
    }
    printf("single process, %d thread%s: median step %.3f s over %d steps (first excluded), "
           "loss %.4f\n",
           threads, threads == 1 ? "" : "s", median(t + 1, steps - 1), steps - 1, ts_plan_loss(p));
    for (int i = 0; i < steps; i++) printf("  step %d: %.3f s\n", i, t[i]);
    free(x), free(y);
    ts_plan_free(p);
    ts_graph_free(g);
    return 0;
}

/* The last step's time on each stage by kind of piece (ts_stage_event's
 * `what`), wall time or the process's CPU time, and its timeline: every
 * piece with its micro-batch, start and end in ms from the earliest
 * stage's start, so the stages line up. */
static const char *const kinds[] = {"F",          "B",          "FB",       "wait act",
                                    "wait grad",  "wait share", "wait sum", "wait replica",
                                    "wait sends", "stash",      "restore",  "send",
                                    "sum",        "norm",       "clip",     "update"};
enum { NK = sizeof kinds / sizeof *kinds };

static void print_by_kind(int last_step, int cpu) {
    printf("\nlast step by piece, %s ms (other: the step less the pieces: feeding inputs, "
           "starting sends%s):\n%-5s",
           cpu ? "CPU" : "wall", cpu ? "; CPU: the step's CPU time less the pieces'" : "", "stage");
    for (int k = 0; k < NK; k++) printf(" %*s", k < 3 ? 7 : (int)strlen(kinds[k]) + 1, kinds[k]);
    printf(" %8s %8s %9s\n", "other", "step", "overhead");
    for (int s = 0; s < S; s++) {
        double sum[NK] = {0}, all = 0;
        for (int i = 0; i < res[s].n_ev; i++)
            for (int k = 0; k < NK; k++)
                if (!strcmp(res[s].ev[i].what, kinds[k])) {
                    const event *e = &res[s].ev[i];
                    sum[k] += cpu ? e->cpu : e->t1 - e->t0, all += cpu ? e->cpu : e->t1 - e->t0;
                }
        /* the per-micro-batch work outside the kernels: stash, restore,
         * send, sum, norm */
        const double over = sum[9] + sum[10] + sum[11] + sum[12] + sum[13];
        const double step = cpu ? res[s].t[last_step].cpu : res[s].t[last_step].step;
        printf("%-5d", s);
        for (int k = 0; k < NK; k++)
            printf(" %*.1f", k < 3 ? 7 : (int)strlen(kinds[k]) + 1, 1e3 * sum[k]);
        printf(" %8.1f %8.1f %9.1f\n", 1e3 * (step - all), 1e3 * step, 1e3 * over);
    }
}

static void print_timeline(int last_step) {
    double t0 = INFINITY;
    for (int s = 0; s < S; s++)
        if (res[s].t[last_step].start < t0) t0 = res[s].t[last_step].start;
    print_by_kind(last_step, 0);
    print_by_kind(last_step, 1);
    printf("\ntimeline of the last step (ms from the first stage's start; pieces under 0.5 ms "
           "left out):\n");
    for (int s = 0; s < S; s++) {
        printf("stage %d:", s);
        int col = 8;
        for (int i = 0; i < res[s].n_ev; i++) {
            const event *e = &res[s].ev[i];
            if (e->t1 - e->t0 < 5e-4) continue;
            char item[64];
            const int n = e->mb >= 0 ? snprintf(item, sizeof item, " %s%d %.0f-%.0f", e->what,
                                                e->mb, 1e3 * (e->t0 - t0), 1e3 * (e->t1 - t0))
                                     : snprintf(item, sizeof item, " %s %.0f-%.0f", e->what,
                                                1e3 * (e->t0 - t0), 1e3 * (e->t1 - t0));
            if (col + n > 100) printf("\n       "), col = 7;
            fputs(item, stdout), col += n;
        }
        printf("\n");
    }
}

int main(int argc, char **argv) {
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--single"))
            single = 1;
        else if (v && !strcmp(a, "--config"))
            cfg_path = v, i++;
        else if (v && !strcmp(a, "--stages"))
            S = atoi(v), i++;
        else if (v && !strcmp(a, "--microbatches"))
            M = atoi(v), i++;
        else if (v && !strcmp(a, "--schedule"))
            schedule = v, i++;
        else if (v && !strcmp(a, "--steps"))
            steps = atoi(v), i++;
        else if (v && !strcmp(a, "--threads"))
            threads = atoi(v), i++;
        else if (v && !strcmp(a, "--devices"))
            devices = v, i++;
        else if (v && !strcmp(a, "--slow") && sscanf(v, "%d:%lf", &slow_rank, &slow_factor) == 2)
            i++;
        else {
            fprintf(stderr,
                    "usage: %s [--config FILE] [--stages S] [--microbatches M] "
                    "[--schedule 1f1b|gpipe] [--steps N] [--threads T] [--single] "
                    "[--devices FILE] [--slow RANK:FACTOR]\n",
                    argv[0]);
            return 2;
        }
    }
    if (steps < 2 || steps > MAX_STEPS || S < 1 || S > 16) {
        fprintf(stderr, "steps 2..%d, stages 1..16\n", MAX_STEPS);
        return 2;
    }
    if (single) return run_single();
    res = mmap(NULL, sizeof(result) * (size_t)S, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS,
               -1, 0);
    if (res == MAP_FAILED) return 1;
    memset(res, 0, sizeof(result) * (size_t)S);
    if (ts_shm_launch(S, NULL, worker, NULL, NULL) != TS_OK) {
        fprintf(stderr, "%s\n", ts_last_error());
        return 1;
    }
    /* the step ends on every stage together; take the slowest rank's */
    double step[MAX_STEPS];
    for (int t = 0; t < steps; t++) {
        step[t] = 0;
        for (int s = 0; s < S; s++)
            if (res[s].step[t] > step[t]) step[t] = res[s].step[t];
    }
    const int k = steps - 1;
    const double med = median(step + 1, k);
    printf("\n%d stages, %d micro-batches, %s, %d thread%s each%s: median step %.3f s over %d "
           "steps (first excluded), loss %.4f\n",
           S, M, schedule, threads, threads == 1 ? "" : "s",
           slow_rank >= 0 ? " (one rank slowed)" : "", med, k, res[S - 1].loss);
    printf("%-5s %6s %12s %12s %12s %12s %10s\n", "stage", "ops", "est ms/mb", "meas ms/mb",
           "meas/est", "wait s", "stash MiB");
    double busy = 0, waiting = 0, own = 0;
    double fb[16], est_step = res[0].est_step, est_bubble = res[0].est_bubble;
    double mf[16], mb[16], link[16] = {0}; /* measured forward, backward per micro-batch */
    for (int s = 0; s < S; s++) {
        double f[MAX_STEPS], w[MAX_STEPS], u[MAX_STEPS];
        for (int t = 1; t < steps; t++) {
            f[t - 1] = res[s].t[t].forward + res[s].t[t].backward;
            w[t - 1] = res[s].t[t].wait;
            u[t - 1] = res[s].t[t].update;
        }
        fb[s] = median(f, k) / M;
        double fw[MAX_STEPS];
        for (int t = 1; t < steps; t++) fw[t - 1] = res[s].t[t].forward;
        mf[s] = median(fw, k) / M;
        mb[s] = fb[s] - mf[s];
        if (s == S - 1)
            mf[s] = fb[s] / 3, mb[s] = 2 * fb[s] / 3; /* one piece: split as the model */
        busy += median(f, k) + median(u, k);
        waiting += median(w, k);
        double own_t[MAX_STEPS];
        for (int t = 1; t < steps; t++) own_t[t - 1] = res[s].t[t].step;
        own += median(own_t, k);
        printf("%-5d %6d %12.2f %12.2f %12.2f %12.3f %10.1f\n", s, res[s].n_ops, res[s].est_s * 1e3,
               fb[s] * 1e3, fb[s] / res[s].est_s, median(w, k),
               (double)res[s].t[1].stash_bytes / 1048576.0);
    }
    printf("bubble: measured %.1f %% (1 - busy / (stages x step)); predicted %.1f %% from the cost "
           "model's stage times (step %.3f s)\n",
           100 * (1 - busy / (S * med)), 100 * est_bubble, est_step);
    /* as metrics.jsonl splits it (session/pipe_train.c): waiting for a
     * message or for the slowest rank, and the rest outside the kernels */
    printf("  of which waiting %.1f %% (the bubble as tessel train reports it), overhead %.1f %% "
           "(stash copies, send buffers, gradient sums, the tied embedding's exchange)\n",
           100 * (waiting + S * med - own) / (S * med), 100 * (own - busy - waiting) / (S * med));
    /* the same simulation with the stages' measured times: the bubble the
     * schedule and the measured imbalance alone explain */
    double sim_step, sim_bubble;
    if (ts_pipe_simulate(strcmp(schedule, "gpipe") ? TS_PIPE_1F1B : TS_PIPE_GPIPE, S, M, mf, mb,
                         link, &sim_step, &sim_bubble) == TS_OK)
        printf(
            "  the schedule simulated with the measured stage times: bubble %.1f %%, step %.3f s "
            "(what the stages' measured imbalance alone explains)\n",
            100 * sim_bubble, sim_step);
    for (int t = 0; t < steps; t++) printf("  step %d: %.3f s\n", t, step[t]);
    print_timeline(steps - 1);
    return 0;
}
