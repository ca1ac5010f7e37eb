/* Gradient compression with loss scaling (docs/distributed.md, "Gradient
 * compression", "Loss scaling"), on 2 ranks of the shm transport:
 *
 *   - a power-of-two loss scale changes no bit: topk (E4M3, ratio 0.01)
 *     and PowerSGD with a static scale of 1024 give the unscaled runs'
 *     weights and residuals bit for bit, and topk at ratio 1 with f32
 *     values the dense all-reduce's with the same scale;
 *   - an overflow on one rank only (its input at one step is infinite): every
 *     rank skips that step, the weights stay, the overflowing rank's
 *     residual (PowerSGD: error) stays, the other rank keeps what it sent
 *     (its residual equals the no-overflow run's everywhere but at the
 *     sent indices, where it holds more), and the next step trains on;
 *   - f16 matmuls with the dynamic scale: the first steps overflow and are
 *     skipped on both ranks alike, the ranks stay bit-identical and the
 *     loss falls. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include "check.h"
#include "tessel/tessel.h"

enum { B = 16, WIN = 8, FEAT = 8, IN = WIN * FEAT, HID = 64, MAX_FLOATS = 40000, MAX_STEPS = 40 };

typedef struct shared {
    float params[2][MAX_FLOATS];
    float before[2][MAX_FLOATS]; /* the weights before the overflow step */
    float state_before[2][2 * MAX_FLOATS], state_after[2][2 * MAX_FLOATS];
    int64_t state_n; /* elements of the state's rows */
    size_t n_floats;
    int skipped[2][MAX_STEPS];
    double loss[2][MAX_STEPS];
    char err[2][512];
} shared;
static shared *SH;

typedef struct run_cfg {
    ts_compress_options c;
    double scale;      /* static loss scale; 0: none */
    int f16;           /* f16 matmuls with the dynamic scale */
    int steps;         /* steps to run */
    int probe_step;    /* the weights and state are read around this step; -1: none */
    int overflow;      /* rank 1's input is infinite at probe_step */
    const char *state; /* the compression state read around probe_step */
} run_cfg;

static void batch(int step, float *x, float *y) {
    unsigned seed = 2000u + (unsigned)step;
    for (int i = 0; i < B * IN; i++) x[i] = (float)rand_r(&seed) / (float)RAND_MAX - 0.5f;
    for (int i = 0; i < B; i++) y[i] = (float)rand_r(&seed) / (float)RAND_MAX * 300.0f;
}

static size_t read_params(ts_plan *p, float *out) {
    size_t k = 0;
    for (int i = 0; i < ts_plan_param_count(p); i++) {
        const char *name = ts_plan_param_name(p, i);
        int rank;
        int64_t dims[8];
        ts_plan_value_info(p, name, NULL, &rank, dims);
        size_t m = 1;
        for (int d = 0; d < rank; d++) m *= (size_t)dims[d];
        if (k + m > MAX_FLOATS) break;
        ts_plan_read(p, name, out + k, m * sizeof(float));
        k += m;
    }
    return k;
}

/* This rank's state value `name` (its own row: [n]) into out. */
static ts_status read_row(ts_plan *p, const char *name, int r, float *out) {
    (void)r;
    int rank;
    int64_t dims[8];
    ts_status s = ts_plan_value_info(p, name, NULL, &rank, dims);
    if (s != TS_OK) return s;
    if (rank != 1 || dims[0] > MAX_FLOATS)
        return ts_fail(TS_ERR_INVALID, "%s is not [<= %d]", name, MAX_FLOATS);
    if ((s = ts_plan_read(p, name, out, sizeof(float) * (size_t)dims[0])) != TS_OK) return s;
    SH->state_n = dims[0];
    return TS_OK;
}

static int worker(ts_comm *comm, void *user) {
    const run_cfg *rc = user;
    const int r = ts_comm_rank(comm), per = B / 2;
    ts_mlp_config mc = {per, WIN, FEAT, 0, HID, 2, 1, 1, 0};
    ts_graph *g = ts_graph_new();
    ts_model m;
    if (ts_build_mlp(g, &mc, &m) != TS_OK) return 1;
    ts_train_spec spec = ts_train_spec_default(m.loss);
    spec.opt = rc->f16 ? ts_sgd(1e-5, 0, 0, 0, 0) : ts_adamw(1e-3, 0.9, 0.999, 1e-8, 0.01);
    ts_compile_options opt = ts_compile_options_default();
    opt.seed = 7;
    opt.threads = 1;
    opt.comm = comm;
    opt.bucket_mb = 16.0 / 1024;
    opt.first_bucket_mb = 4.0 / 1024;
    opt.dist_algo = TS_ALGO_NATIVE;
    opt.compress = rc->c;
    if (rc->f16) {
        opt.precision.compute = TS_F16;
        opt.precision.loss_scale = TS_SCALE_DYNAMIC;
    } else if (rc->scale > 0) {
        opt.precision.loss_scale = TS_SCALE_STATIC;
        opt.precision.init_scale = rc->scale;
    }
    ts_plan *p = NULL;
    ts_status s = ts_compile(g, &spec, &opt, &p);
    ts_graph_free(g);
    if (s != TS_OK) {
        snprintf(SH->err[r], sizeof SH->err[r], "compile: %s", ts_last_error());
        return 1;
    }
    static float x[B * IN], y[B];
    for (int st = 0; st < rc->steps && s == TS_OK; st++) {
        batch(rc->f16 ? 0 : st, x, y); /* f16: one batch, which the loss must fit */
        if (st == rc->probe_step && rc->overflow && r == 1)
            for (int i = 0; i < per * IN; i++) x[(size_t)per * IN + i] = INFINITY;
        if (st == rc->probe_step) {
            read_params(p, SH->before[r]);
            if (rc->state) s = read_row(p, rc->state, r, SH->state_before[r]);
        }
        if (s == TS_OK)
            s = ts_plan_set_input(p, "x", x + (size_t)r * per * IN, sizeof(float) * per * IN);
        if (s == TS_OK) s = ts_plan_set_input(p, "y", y + (size_t)r * per, sizeof(float) * per);
        if (s == TS_OK) s = ts_plan_step(p);
        if (s == TS_OK && st == rc->probe_step && rc->state)
            s = read_row(p, rc->state, r, SH->state_after[r]);
        if (s == TS_OK && st < MAX_STEPS) {
            SH->skipped[r][st] = ts_plan_last_step_skipped(p);
            SH->loss[r][st] = ts_plan_loss(p);
        }
    }
    if (s != TS_OK) snprintf(SH->err[r], sizeof SH->err[r], "%s", ts_last_error());
    size_t k = read_params(p, SH->params[r]);
    if (r == 0) SH->n_floats = k;
    ts_plan_free(p);
    return s == TS_OK ? 0 : 1;
}

static int launch(run_cfg *rc) {
    memset(SH, 0, sizeof *SH);
    ts_shm_options o = {0};
    o.timeout_s = 30;
    o.heap_bytes = (size_t)64 << 20;
    o.grace_s = 2;
    ts_status s = ts_shm_launch(2, &o, worker, rc, NULL);
    if (s != TS_OK)
        fprintf(stderr, "launch: %s (%s | %s)\n", ts_last_error(), SH->err[0], SH->err[1]);
    return s == TS_OK;
}

static int same_params(const float *a, const float *b) {
    return !memcmp(a, b, sizeof(float) * SH->n_floats);
}

static int all_finite(const float *a, size_t n) {
    for (size_t i = 0; i < n; i++)
        if (!isfinite(a[i])) return 0;
    return 1;
}

/* A power-of-two scale is exact: the same weights and state as unscaled. */
static void check_exact(ts_compress_options c, const char *what, const char *state) {
    static float ref[MAX_FLOATS], ref_state[2 * MAX_FLOATS];
    run_cfg rc = {c, 0, 0, 4, 3, 0, state};
    CHECK(launch(&rc), "%s unscaled", what);
    memcpy(ref, SH->params[0], sizeof ref);
    memcpy(ref_state, SH->state_after[1], sizeof ref_state);
    const size_t nf = SH->n_floats;
    rc.scale = 1024;
    CHECK(launch(&rc), "%s scaled", what);
    CHECK(SH->n_floats == nf && nf > 0, "%s: %zu parameters", what, nf);
    CHECK(same_params(SH->params[0], ref), "%s: scale 1024 gives the unscaled weights bit for bit",
          what);
    CHECK(same_params(SH->params[0], SH->params[1]), "%s scaled: ranks bit-identical", what);
    CHECK(!memcmp(SH->state_after[1], ref_state, sizeof(float) * (size_t)SH->state_n),
          "%s: scale 1024 gives the unscaled %s bit for bit", what, state);
    CHECK(!SH->skipped[0][3] && !SH->skipped[1][3], "%s: no step skipped", what);
}

/* An overflow on rank 1 alone at step 2 of 4. */
static void check_overflow(ts_compress_options c, const char *what, const char *state) {
    static float normal_row0[2 * MAX_FLOATS];
    run_cfg rc = {c, 1024, 0, 3, 2, 0, state};
    CHECK(launch(&rc), "%s without overflow", what);
    memcpy(normal_row0, SH->state_after[0], sizeof normal_row0);
    rc.steps = 4;
    rc.overflow = 1;
    CHECK(launch(&rc), "%s with an overflow on rank 1", what);
    const size_t nf = SH->n_floats;
    const int64_t n = SH->state_n;
    CHECK(SH->skipped[0][2] && SH->skipped[1][2], "%s: both ranks skip the overflow step (%d %d)",
          what, SH->skipped[0][2], SH->skipped[1][2]);
    CHECK(!SH->skipped[0][3] && !SH->skipped[1][3], "%s: the next step is not skipped", what);
    CHECK(!SH->skipped[0][1] && !SH->skipped[1][1], "%s: the step before is not skipped", what);
    CHECK(!memcmp(SH->state_before[1], SH->state_after[1], sizeof(float) * (size_t)n),
          "%s: the overflowing rank's %s is left as it was", what, state);
    CHECK(all_finite(SH->state_after[0], (size_t)n), "%s: rank 0's %s stays finite", what, state);
    CHECK(same_params(SH->params[0], SH->params[1]) && all_finite(SH->params[0], nf),
          "%s: ranks bit-identical and finite after the step that follows", what);
    CHECK(!same_params(SH->params[0], SH->before[0]), "%s: the step after the skip trains", what);
    int64_t differ = 0, larger = 0;
    for (int64_t i = 0; i < n; i++) {
        const float a = SH->state_after[0][i], b = normal_row0[i];
        if (memcmp(&a, &b, 4)) {
            differ++;
            larger += fabsf(a) > fabsf(b);
        }
    }
    if (c.method == TS_COMPRESS_TOPK) {
        /* kept (acc) against sent (acc - q) at the sent indices only */
        const int64_t k = (int64_t)ceil(c.ratio * (double)n);
        CHECK(differ > 0 && differ <= k && larger == differ,
              "%s: rank 0 keeps what it sent: %lld of %lld elements differ from the sending run "
              "(at most k = %lld), %lld of them larger",
              what, (long long)differ, (long long)n, (long long)k, (long long)larger);
    } else {
        /* the error keeps M = e + g instead of M - P Q^T */
        CHECK(differ > n / 2, "%s: rank 0's error keeps M: %lld of %lld differ", what,
              (long long)differ, (long long)n);
    }
}

/* The weights of the skipped step: read by a 2-step run with the
 * overflow at its last step, whose weights are those before it. */
static void check_overflow_weights(ts_compress_options c, const char *what) {
    run_cfg rc = {c, 1024, 0, 3, 2, 1, NULL};
    CHECK(launch(&rc), "%s: overflow at the last step", what);
    CHECK(same_params(SH->params[0], SH->before[0]) && same_params(SH->params[1], SH->before[1]),
          "%s: the skipped step leaves the weights on both ranks", what);
}

static void check_f16(ts_compress_options c, const char *what) {
    run_cfg rc = {c, 0, 1, 30, -1, 0, NULL};
    CHECK(launch(&rc), "%s f16", what);
    int agree = 1, n_skipped = 0, first_ok = -1;
    for (int s = 0; s < 30; s++) {
        agree &= SH->skipped[0][s] == SH->skipped[1][s];
        n_skipped += SH->skipped[0][s];
        if (!SH->skipped[0][s] && first_ok < 0) first_ok = s;
    }
    CHECK(agree, "%s f16: the ranks skip the same steps", what);
    CHECK(first_ok >= 1,
          "%s f16: the first steps overflow at 65536 and are skipped (first clean "
          "step %d, %d skipped)",
          what, first_ok, n_skipped);
    CHECK(same_params(SH->params[0], SH->params[1]) && all_finite(SH->params[0], SH->n_floats),
          "%s f16: ranks bit-identical and finite", what);
    const double l0 = SH->loss[0][first_ok] + SH->loss[1][first_ok],
                 l1 = SH->loss[0][29] + SH->loss[1][29];
    CHECK(l1 < l0, "%s f16: the loss falls after the backoff (%.4g -> %.4g)", what, l0, l1);
}

int main(void) {
    SH = mmap(NULL, sizeof *SH, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (SH == MAP_FAILED) return 1;
    ts_compress_options topk = {0}, psgd = {0}, full = {0};
    topk.method = TS_COMPRESS_TOPK;
    topk.ratio = 0.01;
    topk.values = TS_CVAL_E4M3;
    psgd.method = TS_COMPRESS_POWERSGD;
    psgd.rank = 2;
    psgd.min_elems = 0;
    full.method = TS_COMPRESS_TOPK;
    full.ratio = 1;
    full.values = TS_CVAL_F32;
    check_exact(topk, "topk", "compress.bucket0.residual");
    check_exact(psgd, "powersgd", "compress.bucket0.error");
    /* ratio 1 with f32 values and the dense all-reduce under the same scale */
    static float dense[MAX_FLOATS];
    ts_compress_options none = {0};
    run_cfg rc = {none, 1024, 0, 4, -1, 0, NULL};
    CHECK(launch(&rc), "dense scaled");
    memcpy(dense, SH->params[0], sizeof dense);
    rc.c = full;
    CHECK(launch(&rc), "topk ratio 1 scaled");
    CHECK(same_params(SH->params[0], dense), "topk ratio 1, f32 values, scale 1024: the dense "
                                             "all-reduce's weights bit for bit");
    check_overflow(topk, "topk", "compress.bucket0.residual");
    check_overflow(psgd, "powersgd", "compress.bucket0.error");
    check_overflow_weights(topk, "topk");
    check_overflow_weights(psgd, "powersgd");
    check_f16(topk, "topk");
    check_f16(psgd, "powersgd");
    return check_summary("compress_scale");
}
