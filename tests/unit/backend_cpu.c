/* The CPU backend's optimised kernels (oneDNN GEMM) against the reference
 * kernels on whole models: same loss and gradients within rounding. */
#include <stdlib.h>
#include <string.h>
#include "check.h"

static void compare(const char *label, ts_graph *g, ts_val loss, int is_gpt) {
    ts_plan *p[2];
    for (int r = 0; r < 2; r++) {
        ts_train_spec spec = ts_train_spec_default(loss);
        spec.opt = ts_adamw(1e-3, 0.9, 0.999, 1e-8, 0.01);
        ts_compile_options o = ts_compile_options_default();
        o.reference_kernels = r;
        o.seed = 5;
        CHECK_OK(ts_compile(g, &spec, &o, &p[r]));
    }
    unsigned seed = 3;
    int64_t tok[4 * 32];
    float x[16 * 64], y[16];
    for (int i = 0; i < 4 * 32; i++) tok[i] = rand_r(&seed) % 96;
    for (int i = 0; i < 16 * 64; i++) x[i] = (float)rand_r(&seed) / RAND_MAX - 0.5f;
    for (int i = 0; i < 16; i++) y[i] = (float)rand_r(&seed) / RAND_MAX;
    for (int step = 0; step < 3; step++)
        for (int r = 0; r < 2; r++) {
            if (is_gpt) {
                ts_plan_set_input(p[r], "tokens", tok, sizeof tok);
                ts_plan_set_input(p[r], "targets", tok, sizeof tok);
            } else {
                ts_plan_set_input(p[r], "x", x, sizeof x);
                ts_plan_set_input(p[r], "y", y, sizeof y);
            }
            CHECK_OK(ts_plan_step(p[r]));
        }
    double l0 = ts_plan_loss(p[0]), l1 = ts_plan_loss(p[1]);
    CHECK(fabs(l0 - l1) <= 1e-5 * fabs(l1), "%s: loss %.9g (oneDNN) vs %.9g (reference)", label,
          l0, l1);
    for (int i = 0; i < ts_plan_param_count(p[0]); i++) {
        char gname[300];
        snprintf(gname, sizeof gname, "grad:%s", ts_plan_param_name(p[0], i));
        int rank;
        int64_t dims[8];
        if (ts_plan_value_info(p[0], gname, NULL, &rank, dims) != TS_OK) continue;
        size_t n = 1;
        for (int k = 0; k < rank; k++) n *= (size_t)dims[k];
        float *a = malloc(n * 4), *b = malloc(n * 4);
        ts_plan_read(p[0], gname, a, n * 4);
        ts_plan_read(p[1], gname, b, n * 4);
        double mx = 0, worst = 0;
        for (size_t k = 0; k < n; k++) {
            mx = fmax(mx, fabs(b[k]));
            worst = fmax(worst, fabs(a[k] - b[k]));
        }
        CHECK(worst <= 1e-4 * mx + 1e-12, "%s: %s differs by %.3g (max %.3g)", label, gname,
              worst, mx);
        free(a);
        free(b);
    }
    ts_plan_free(p[0]);
    ts_plan_free(p[1]);
}

int main(void) {
    ts_mlp_config mc = {16, 8, 8, 0, 64, 2, 1, 1, 0};
    ts_graph *g = ts_graph_new();
    ts_model m;
    CHECK_OK(ts_build_mlp(g, &mc, &m));
    compare("mlp", g, m.loss, 0);
    ts_graph_free(g);
    ts_gpt_config gc = {4, 32, 96, 64, 2, 4, 0.0};
    g = ts_graph_new();
    CHECK_OK(ts_build_gpt(g, &gc, &m));
    compare("gpt", g, m.loss, 1);
    ts_graph_free(g);
    return check_summary("backend cpu");
}
