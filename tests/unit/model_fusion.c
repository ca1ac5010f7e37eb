/* The fusion model (src/models/fusion.c): its preset and key checks; a
 * small one trains (the loss drops), its three branches scheduled by the
 * search no worse than build order; under compile.max_memory_mb it
 * recomputes activations, fits, and trains to the same bits as without a
 * limit and as build order. */
#include <stdlib.h>
#include <string.h>
#include "check.h"
#include "models/model.h"
#include "tessel/config.h"

static ts_status load(ts_config *c, const char *yaml, char *err, size_t n) {
    ts_config_init(c);
    ts_status s = ts_config_load_string(c, yaml, strlen(yaml), "t.yaml");
    if (s == TS_OK) s = ts_config_finish(c);
    snprintf(err, n, "%s", s == TS_OK ? "" : ts_last_error());
    return s;
}

static void bad(const char *what, const char *yaml, const char *want) {
    ts_config c;
    char err[1024];
    ts_status s = load(&c, yaml, err, sizeof err);
    CHECK(s == TS_ERR_INVALID && strstr(err, want), "%s: '%s' should contain '%s'", what, err,
          want);
}

static void test_keys(void) {
    ts_config c;
    char err[1024];
    CHECK_OK(load(&c, "model: {name: fusion}\n", err, sizeof err));
    CHECK(c.model.batch == 16 && c.model.channels == 3 && c.model.height == 64 &&
              c.model.ctx == 32 && c.model.features == 16 && c.model.hidden == 128 &&
              c.model.in_dim == 3 * 64 * 64 + 32 * 16 + 64 && c.model.out_dim == 1,
          "fusion preset: batch %lld channels %lld ctx %lld in_dim %lld", (long long)c.model.batch,
          (long long)c.model.channels, (long long)c.model.ctx, (long long)c.model.in_dim);
    bad("another model's key", "model: {name: fusion, window: 4}\n",
        "model.window is not a key of fusion models");
    bad("no tabular values", "model: {name: fusion, in_dim: 12800}\n",
        "must exceed the camera's channels x height x width (12288) plus the sequence's ctx x "
        "features (512)");
    bad("height", "model: {name: fusion, height: 30}\n", "multiples of 4");
    bad("synthetic classes", "model: {name: fusion, classes: 3}\n",
        "synthetic fusion data is a regression");
}

enum { B = 4, MAXP = 64 };
static const char *SMALL = "model: {name: fusion, batch: 4, channels: 2, height: 8, width: 8, "
                           "c1: 4, c2: 8, ctx: 5, features: 3, hidden: 8, in_dim: 150}\n";

typedef struct run {
    float loss0, loss;
    int n;
    float *params[MAXP];
    size_t bytes[MAXP];
    ts_plan_stats st;
} run;

static ts_status compile(double limit_mb, int naive, ts_plan **p) {
    ts_config c;
    char err[1024];
    ts_status s = load(&c, SMALL, err, sizeof err);
    if (s != TS_OK) return s;
    ts_graph *g = ts_graph_new();
    ts_model m;
    s = ts_model_of(&c)->build(&c, NULL, g, &m);
    if (s == TS_OK) {
        ts_train_spec spec = ts_train_spec_default(m.loss);
        spec.opt = ts_adam(3e-3, 0.9, 0.999, 1e-8, 0.0);
        ts_compile_options o = ts_compile_options_default();
        o.seed = 5;
        o.threads = 2;
        o.max_memory_mb = limit_mb;
        o.naive_schedule = naive;
        s = ts_compile(g, &spec, &o, p);
    }
    ts_graph_free(g);
    return s;
}

static int train(double limit_mb, int naive, int steps, run *out) {
    memset(out, 0, sizeof *out);
    ts_plan *p = NULL;
    ts_status s = compile(limit_mb, naive, &p);
    CHECK(s == TS_OK, "compile (limit %.3f MiB, naive %d): %s", limit_mb, naive, ts_last_error());
    if (s != TS_OK) return 1;
    float x[B * 150], y[B];
    unsigned seed = 21;
    for (int k = 0; k < B * 150; k++) x[k] = (float)rand_r(&seed) / (float)RAND_MAX - 0.5f;
    for (int b = 0; b < B; b++) { /* a target each branch sees part of */
        y[b] = 0;
        for (int k = 0; k < 150; k += 7) y[b] += x[b * 150 + k];
    }
    for (int step = 0; step < steps; step++) {
        CHECK_OK(ts_plan_set_input(p, "x", x, sizeof x));
        CHECK_OK(ts_plan_set_input(p, "y", y, sizeof y));
        CHECK_OK(ts_plan_step(p));
        ts_plan_read(p, "loss", step ? &out->loss : &out->loss0, sizeof(float));
    }
    ts_plan_get_stats(p, &out->st);
    out->n = ts_plan_param_count(p);
    for (int i = 0; i < out->n && i < MAXP; i++) {
        const char *name = ts_plan_param_name(p, i);
        int rank;
        int64_t dims[8];
        ts_plan_value_info(p, name, NULL, &rank, dims);
        out->bytes[i] = sizeof(float);
        for (int d = 0; d < rank; d++) out->bytes[i] *= (size_t)dims[d];
        out->params[i] = malloc(out->bytes[i]);
        ts_plan_read(p, name, out->params[i], out->bytes[i]);
    }
    ts_plan_free(p);
    return 0;
}

static int same(const run *a, const run *b) {
    if (a->n != b->n || a->n == 0 || a->loss != b->loss) return 0;
    for (int i = 0; i < a->n && i < MAXP; i++)
        if (a->bytes[i] != b->bytes[i] || memcmp(a->params[i], b->params[i], a->bytes[i])) return 0;
    return 1;
}

static void release(run *r) {
    for (int i = 0; i < r->n && i < MAXP; i++) free(r->params[i]);
}

static void test_training(void) {
    run free_run, naive, limited;
    if (train(0, 0, 30, &free_run) || train(0, 1, 30, &naive)) return;
    CHECK(free_run.loss < 0.5f * free_run.loss0, "loss %.5f -> %.5f: did not drop by half",
          free_run.loss0, free_run.loss);
    CHECK(free_run.st.peak_live_bytes <= free_run.st.naive_peak_bytes &&
              free_run.st.peak_live_bytes == free_run.st.temp_bytes,
          "schedule %zu, build order %zu, temporaries %zu", free_run.st.peak_live_bytes,
          free_run.st.naive_peak_bytes, free_run.st.temp_bytes);
    CHECK(same(&free_run, &naive), "build order trains to other bits than the searched order");
    const double limit = 0.9 * (double)free_run.st.arena_bytes / 1048576.0;
    if (train(limit, 0, 30, &limited)) return;
    CHECK(limited.st.n_recomputed > 0 && (double)limited.st.arena_bytes <= limit * 1048576.0,
          "limit %.3f MiB: arena %zu with %d recomputed", limit, limited.st.arena_bytes,
          limited.st.n_recomputed);
    CHECK(same(&free_run, &limited), "recompute changed the trained bits");
    release(&free_run);
    release(&naive);
    release(&limited);
}

int main(void) {
    test_keys();
    test_training();
    return check_summary("model_fusion");
}
