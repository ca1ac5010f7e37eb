/* Same graph, data and seed give bit-identical parameters: across two
 * plans, and between 1 and 2 threads. */
#include <stdlib.h>
#include <string.h>
#include "check.h"

typedef struct run_result {
    int n;
    float *params[64];
    size_t bytes[64];
} run_result;

static void free_result(run_result *r) {
    for (int i = 0; i < r->n; i++) free(r->params[i]);
}

/* Train `steps` steps with deterministic data and keep every parameter. */
static int train(ts_graph *g, ts_val loss, int is_gpt, int threads, int steps, run_result *out) {
    ts_train_spec spec = ts_train_spec_default(loss);
    spec.opt = ts_adamw(1e-3, 0.9, 0.999, 1e-8, 0.01);
    spec.clip_grad_norm = 1.0;
    ts_compile_options opt = ts_compile_options_default();
    opt.seed = 1234;
    opt.threads = threads;
    ts_plan *p;
    if (ts_compile(g, &spec, &opt, &p) != TS_OK) {
        CHECK(0, "compile: %s", ts_last_error());
        return 1;
    }
    unsigned seed = 99;
    for (int s = 0; s < steps; s++) {
        if (is_gpt) {
            int64_t tok[2 * 16], tgt[2 * 16];
            for (int i = 0; i < 32; i++) tok[i] = rand_r(&seed) % 64, tgt[i] = rand_r(&seed) % 64;
            ts_plan_set_input(p, "tokens", tok, sizeof tok);
            ts_plan_set_input(p, "targets", tgt, sizeof tgt);
        } else {
            float x[16 * 64], y[16];
            for (int i = 0; i < 16 * 64; i++) x[i] = (float)rand_r(&seed) / RAND_MAX - 0.5f;
            for (int i = 0; i < 16; i++) y[i] = (float)rand_r(&seed) / RAND_MAX;
            ts_plan_set_input(p, "x", x, sizeof x);
            ts_plan_set_input(p, "y", y, sizeof y);
        }
        if (ts_plan_step(p) != TS_OK) {
            CHECK(0, "step: %s", ts_last_error());
            ts_plan_free(p);
            return 1;
        }
    }
    out->n = ts_plan_param_count(p);
    for (int i = 0; i < out->n && i < 64; i++) {
        const char *name = ts_plan_param_name(p, i);
        int rank;
        int64_t dims[8];
        ts_plan_value_info(p, name, NULL, &rank, dims);
        size_t n = 1;
        for (int d = 0; d < rank; d++) n *= (size_t)dims[d];
        out->bytes[i] = n * sizeof(float);
        out->params[i] = malloc(out->bytes[i]);
        ts_plan_read(p, name, out->params[i], out->bytes[i]);
    }
    ts_plan_free(p);
    return 0;
}

static int identical(const run_result *a, const run_result *b) {
    if (a->n != b->n) return 0;
    for (int i = 0; i < a->n; i++)
        if (a->bytes[i] != b->bytes[i] || memcmp(a->params[i], b->params[i], a->bytes[i]))
            return 0;
    return 1;
}

static void check_model(const char *label, ts_graph *g, ts_val loss, int is_gpt) {
    run_result r1 = {0}, r2 = {0}, r3 = {0};
    train(g, loss, is_gpt, 2, 10, &r1);
    train(g, loss, is_gpt, 2, 10, &r2);
    train(g, loss, is_gpt, 1, 10, &r3);
    CHECK(r1.n > 0, "%s: no parameters", label);
    CHECK(identical(&r1, &r2), "%s: two runs differ", label);
    CHECK(identical(&r1, &r3), "%s: 1 thread and 2 threads differ", label);
    free_result(&r1);
    free_result(&r2);
    free_result(&r3);
}

int main(void) {
    ts_mlp_config mc = {16, 8, 8, 0, 64, 2, 1, 1, 0};
    ts_graph *g = ts_graph_new();
    ts_model m;
    CHECK_OK(ts_build_mlp(g, &mc, &m));
    check_model("mlp", g, m.loss, 0);
    ts_graph_free(g);

    ts_gpt_config gc = {2, 16, 64, 32, 2, 2, 0.1};
    g = ts_graph_new();
    CHECK_OK(ts_build_gpt(g, &gc, &m));
    check_model("gpt with dropout", g, m.loss, 1);
    ts_graph_free(g);
    return check_summary("determinism");
}
