/* The model zoo's builders (cnn, gru, lstm, unet3d, gcn): each compiles
 * and trains a few Adam steps on one fixed synthetic batch with the loss
 * going down; bad configurations fail with an error naming the model. */
#include <stdlib.h>
#include <string.h>
#include "check.h"

static uint64_t rng = 88172645463325252ull;
static double uniform(void) { /* xorshift64, [0, 1) */
    rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
    return (double)(rng >> 11) / 9007199254740992.0;
}
static float normal(void) {
    double u = uniform() + 1e-12, v = uniform();
    return (float)(sqrt(-2 * log(u)) * cos(6.283185307179586 * v));
}

/* Compiles with Adam(lr), feeds x / y, runs `steps` steps; checks that the
 * last loss is below `ratio` times the first. */
static void train(const char *what, ts_graph *g, ts_model *m, const void *x, size_t xb,
                  const void *y, size_t yb, double lr, int steps, double ratio) {
    ts_train_spec spec = ts_train_spec_default(m->loss);
    spec.opt = ts_adam(lr, 0.9, 0.999, 1e-8, 0);
    ts_plan *p = NULL;
    ts_status s = ts_compile(g, &spec, NULL, &p);
    CHECK(s == TS_OK, "%s: compile: %s", what, ts_last_error());
    if (s != TS_OK) return;
    CHECK_OK(ts_plan_set_input(p, "x", x, xb));
    CHECK_OK(ts_plan_set_input(p, "y", y, yb));
    double first = 0, last = 0;
    for (int i = 0; i < steps; i++) {
        CHECK_OK(ts_plan_step(p));
        last = ts_plan_loss(p);
        if (i == 0) first = last;
    }
    CHECK(isfinite(last) && last < ratio * first, "%s: loss %.5f -> %.5f (want < %.2f x)", what,
          first, last, ratio);
    printf("%s: loss %.5f -> %.5f in %d steps\n", what, first, last, steps);
    ts_plan_free(p);
}

static void expect_error(const char *what, ts_status s, const char *needle) {
    CHECK(s != TS_OK, "%s: bad config accepted", what);
    CHECK(strstr(ts_last_error(), needle) != NULL, "%s: error '%s' lacks '%s'", what,
          ts_last_error(), needle);
}

static void test_cnn(void) {
    ts_cnn_config c = {8, 1, 8, 8, 4, 8, 3, 1};
    ts_graph *g = ts_graph_new();
    ts_model m;
    CHECK_OK(ts_build_cnn(g, &c, &m));
    CHECK(ts_find(g, "features.1.running_mean").id >= 0, "cnn: BatchNorm state named");
    float x[8 * 64];
    int64_t y[8];
    for (int b = 0; b < 8; b++) {
        y[b] = b % 3;
        for (int i = 0; i < 64; i++) x[b * 64 + i] = normal() + (float)(y[b] == i % 3);
    }
    train("cnn", g, &m, x, sizeof x, y, sizeof y, 1e-2, 15, 0.7);
    ts_graph_free(g);

    ts_cnn_config fm = ts_cnn_fashion();
    CHECK(fm.height == 28 && fm.classes == 10, "cnn preset");
    ts_cnn_config bad = c;
    bad.height = 10;
    g = ts_graph_new();
    expect_error("cnn size", ts_build_cnn(g, &bad, &m), "multiples of 4");
    ts_graph_free(g);
    bad = c;
    bad.classes = 0;
    g = ts_graph_new();
    expect_error("cnn classes", ts_build_cnn(g, &bad, &m), "cnn:");
    ts_graph_free(g);
}

static void test_rnn(int lstm) {
    ts_rnn_config c = {16, 6, 3, 8, 2, 0, 0};
    ts_graph *g = ts_graph_new();
    ts_model m;
    CHECK_OK(lstm ? ts_build_lstm(g, &c, &m) : ts_build_gru(g, &c, &m));
    CHECK(ts_find(g, lstm ? "lstm.weight_hh_l1" : "gru.weight_hh_l1").id >= 0, "rnn names");
    float x[16 * 6 * 3], y[16];
    for (int i = 0; i < 16 * 6 * 3; i++) x[i] = normal();
    for (int b = 0; b < 16; b++) y[b] = x[b * 18 + 15] + x[b * 18 + 12] > 0;
    train(lstm ? "lstm" : "gru", g, &m, x, sizeof x, y, sizeof y, 1e-2, 30, 0.8);
    ts_graph_free(g);
    ts_rnn_config bad = c;
    bad.layers = 0;
    g = ts_graph_new();
    expect_error("rnn layers", lstm ? ts_build_lstm(g, &bad, &m) : ts_build_gru(g, &bad, &m),
                 lstm ? "lstm:" : "gru:");
    ts_graph_free(g);
}

static void test_unet(void) {
    ts_unet3d_config c = {2, 1, 8, 2, 4, 8, 2};
    ts_graph *g = ts_graph_new();
    ts_model m;
    CHECK_OK(ts_build_unet3d(g, &c, &m));
    CHECK(ts_find(g, "dec1.4.running_var").id >= 0, "unet BatchNorm state named");
    float x[2 * 512];
    int64_t y[2 * 512];
    for (int b = 0; b < 2; b++)
        for (int z = 0; z < 8; z++)
            for (int r = 0; r < 8; r++)
                for (int q = 0; q < 8; q++) {
                    int i = b * 512 + z * 64 + r * 8 + q;
                    int dz = z - 3 - b, dr = r - 4, dq = q - 4;
                    y[i] = dz * dz + dr * dr + dq * dq <= 6;
                    x[i] = (float)y[i] + 0.5f * normal();
                }
    train("unet3d", g, &m, x, sizeof x, y, sizeof y, 1e-2, 10, 0.9);
    ts_graph_free(g);
    ts_unet3d_config w4 = ts_unet3d_w4();
    CHECK(w4.size == 32 && w4.c3 == 64 && w4.batch == 4, "unet preset");
    ts_unet3d_config bad = c;
    bad.size = 6;
    g = ts_graph_new();
    expect_error("unet size", ts_build_unet3d(g, &bad, &m), "multiple of 4");
    ts_graph_free(g);
    bad = c;
    bad.classes = 1;
    g = ts_graph_new();
    expect_error("unet classes", ts_build_unet3d(g, &bad, &m), "unet3d:");
    ts_graph_free(g);
}

static void test_gcn(void) {
    int64_t *src = NULL, *dst = NULL;
    int64_t ne = ts_gcn_random_edges(40, 4, 7, &src, &dst);
    CHECK(ne == 80 && src && dst, "random edges: %lld", (long long)ne);
    for (int64_t e = 0; e < ne; e++)
        CHECK(src[e] >= 0 && src[e] < 40 && dst[e] >= 0 && dst[e] < 40, "edge in range");
    ts_gcn_config c = {40, 6, 8, 3, ne, src, dst};
    ts_graph *g = ts_graph_new();
    ts_model m;
    CHECK_OK(ts_build_gcn(g, &c, &m));
    float x[40 * 6];
    int64_t y[40];
    for (int n = 0; n < 40; n++) {
        y[n] = n % 3;
        for (int f = 0; f < 6; f++) x[n * 6 + f] = normal() + (float)(f % 3 == y[n]);
    }
    train("gcn", g, &m, x, sizeof x, y, sizeof y, 1e-2, 30, 0.8);
    ts_graph_free(g);

    ts_gcn_config w5 = ts_gcn_w5();
    CHECK(w5.nodes == 20000 && w5.classes == 16, "gcn preset");
    ts_gcn_config bad = c;
    bad.src = NULL;
    g = ts_graph_new();
    expect_error("gcn no edges", ts_build_gcn(g, &bad, &m), "edge list");
    ts_graph_free(g);
    bad = c;
    src[5] = 40; /* out of range */
    g = ts_graph_new();
    expect_error("gcn bad node", ts_build_gcn(g, &bad, &m), "gcn: adjacency");
    ts_graph_free(g);
    bad.hidden = 0;
    g = ts_graph_new();
    expect_error("gcn hidden", ts_build_gcn(g, &bad, &m), "gcn:");
    ts_graph_free(g);
    free(src);
    free(dst);
}

int main(void) {
    test_cnn();
    test_rnn(0);
    test_rnn(1);
    test_unet();
    test_gcn();
    return check_summary("models");
}
