/* Gradient compression converges (docs/distributed.md "Gradient
 * compression", "Convergence"): linear regression on fixed data that a
 * weight vector fits exactly (a convex problem with one optimum), trained
 * on 2 ranks with SGD and momentum, full batch. topk with error feedback
 * (momentum after the exchange) and with DGC momentum correction, f32 and
 * E4M3 values, must reach the dense run's optimum: the loss falls by 8
 * orders of magnitude and the weights agree with the dense run's. And
 * train.clip_grad_norm under topk is DGC's local clipping before the
 * accumulation (the global clip after the exchange would cut what error
 * feedback accumulated): the weights equal those of dist.compress_clip
 * at the same value bit for bit, and differ from an unclipped run. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include "check.h"
#include "tessel/tessel.h"

enum { ROWS = 64, IN = 32, NP = IN + 1, STEPS = 1500, HID = 16 };

typedef struct shared {
    float params[2][4096];
    size_t n_floats;
    double loss0, loss_end;
    char err[2][512];
} shared;
static shared *SH;

typedef struct run_cfg {
    ts_compress_options c;
    int mlp;          /* 0: linear regression; 1: a hidden layer (for the clipping case) */
    double clip_norm; /* train.clip_grad_norm */
    int steps;
} run_cfg;

/* Fixed data: x uniform in [-0.5, 0.5), y = x . w* + 0.25 (exact in double, then rounded). */
static void data(float *x, float *y) {
    unsigned seed = 99;
    double w[IN];
    for (int j = 0; j < IN; j++) w[j] = (double)rand_r(&seed) / RAND_MAX * 2.0 - 1.0;
    for (int i = 0; i < ROWS; i++) {
        double t = 0.25;
        for (int j = 0; j < IN; j++) {
            x[i * IN + j] = (float)((double)rand_r(&seed) / RAND_MAX - 0.5);
            t += (double)x[i * IN + j] * w[j];
        }
        y[i] = (float)t;
    }
}

static int worker(ts_comm *comm, void *user) {
    const run_cfg *rc = user;
    const int r = ts_comm_rank(comm), per = ROWS / 2;
    ts_mlp_config mc = {per, 0, 0, IN, HID, rc->mlp ? 1 : 0, 1, 0, 0};
    ts_graph *g = ts_graph_new();
    ts_model m;
    if (ts_build_mlp(g, &mc, &m) != TS_OK) return 1;
    ts_train_spec spec = ts_train_spec_default(m.loss);
    spec.opt = ts_sgd(0.1, 0.9, 0, 0, 0);
    spec.clip_grad_norm = rc->clip_norm;
    ts_compile_options opt = ts_compile_options_default();
    opt.seed = 3;
    opt.threads = 1;
    opt.comm = comm;
    opt.dist_algo = TS_ALGO_NATIVE;
    opt.compress = rc->c;
    ts_plan *p = NULL;
    ts_status s = ts_compile(g, &spec, &opt, &p);
    ts_graph_free(g);
    if (s != TS_OK) {
        snprintf(SH->err[r], sizeof SH->err[r], "compile: %s", ts_last_error());
        return 1;
    }
    static float x[ROWS * IN], y[ROWS];
    data(x, y);
    s = ts_plan_set_input(p, "x", x + (size_t)r * per * IN, sizeof(float) * per * IN);
    if (s == TS_OK) s = ts_plan_set_input(p, "y", y + (size_t)r * per, sizeof(float) * per);
    for (int st = 0; st < rc->steps && s == TS_OK; st++) {
        s = ts_plan_step(p);
        if (r == 0 && st == 0) SH->loss0 = ts_plan_loss(p);
    }
    if (r == 0) SH->loss_end = ts_plan_loss(p);
    if (s != TS_OK) snprintf(SH->err[r], sizeof SH->err[r], "%s", ts_last_error());
    size_t k = 0;
    for (int i = 0; i < ts_plan_param_count(p) && s == TS_OK; i++) {
        const char *name = ts_plan_param_name(p, i);
        int rank;
        int64_t dims[8];
        ts_plan_value_info(p, name, NULL, &rank, dims);
        size_t n = 1;
        for (int d = 0; d < rank; d++) n *= (size_t)dims[d];
        if (k + n > 4096) break;
        ts_plan_read(p, name, SH->params[r] + k, n * sizeof(float));
        k += n;
    }
    if (r == 0) SH->n_floats = k;
    ts_plan_free(p);
    return s == TS_OK ? 0 : 1;
}

static int launch(run_cfg *rc) {
    memset(SH, 0, sizeof *SH);
    ts_shm_options o = {0};
    o.timeout_s = 60;
    o.heap_bytes = (size_t)64 << 20;
    o.grace_s = 2;
    ts_status s = ts_shm_launch(2, &o, worker, rc, NULL);
    if (s != TS_OK)
        fprintf(stderr, "launch: %s (%s | %s)\n", ts_last_error(), SH->err[0], SH->err[1]);
    return s == TS_OK;
}

static double max_diff(const float *a, const float *b, size_t n) {
    double d = 0;
    for (size_t i = 0; i < n; i++) d = fmax(d, fabs((double)a[i] - (double)b[i]));
    return d;
}

static void check_optimum(void) {
    static float dense[4096];
    run_cfg rc = {0};
    rc.steps = STEPS;
    CHECK(launch(&rc), "dense");
    const size_t n = SH->n_floats;
    memcpy(dense, SH->params[0], sizeof(float) * n);
    CHECK(n == NP && SH->loss_end < 1e-8 * SH->loss0, "dense: %zu weights, loss %g -> %g", n,
          SH->loss0, SH->loss_end);
    const struct {
        const char *what;
        int values, momentum;
    } cases[] = {{"topk f32, error feedback", TS_CVAL_F32, 0},
                 {"topk e4m3, error feedback", TS_CVAL_E4M3, 0},
                 {"topk f32, momentum correction", TS_CVAL_F32, 1},
                 {"topk e4m3, momentum correction", TS_CVAL_E4M3, 1}};
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        rc.c.method = TS_COMPRESS_TOPK;
        rc.c.ratio = 0.1; /* 4 of the 33 elements per step */
        rc.c.values = cases[i].values;
        rc.c.momentum = cases[i].momentum;
        CHECK(launch(&rc), "%s", cases[i].what);
        const double d = max_diff(SH->params[0], dense, n);
        CHECK(SH->loss_end < 1e-8 * SH->loss0 && d < 1e-3,
              "%s: loss %g -> %g, weights differ from the dense optimum by %g", cases[i].what,
              SH->loss0, SH->loss_end, d);
        CHECK(!memcmp(SH->params[0], SH->params[1], sizeof(float) * n), "%s: ranks differ",
              cases[i].what);
    }
}

/* train.clip_grad_norm under topk: the local clipping of dist.compress_clip. */
static void check_clip(void) {
    static float local[4096];
    run_cfg rc = {0};
    rc.mlp = 1;
    rc.steps = 20;
    rc.c.method = TS_COMPRESS_TOPK;
    rc.c.ratio = 0.05;
    rc.c.momentum = 1;
    rc.c.clip = 0.05;
    CHECK(launch(&rc), "compress_clip");
    const size_t n = SH->n_floats;
    memcpy(local, SH->params[0], sizeof(float) * n);
    rc.c.clip = 0;
    rc.clip_norm = 0.05;
    CHECK(launch(&rc), "clip_grad_norm");
    CHECK(n > NP && !memcmp(local, SH->params[0], sizeof(float) * n),
          "clip_grad_norm 0.05 under topk: the weights of compress_clip 0.05 (max diff %g)",
          max_diff(local, SH->params[0], n));
    rc.clip_norm = 0;
    CHECK(launch(&rc), "no clip");
    CHECK(max_diff(local, SH->params[0], n) > 0, "the clipping changes the weights");
}

int main(void) {
    SH = mmap(NULL, sizeof *SH, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (SH == MAP_FAILED) return 1;
    check_optimum();
    check_clip();
    return check_summary("compress_converge");
}
