/* The gru/lstm, unet3d and gcn models in the config: presets w2, w4, w5
 * give the BENCH.md shapes, the resolved config writes and loads back,
 * ts_config_build builds each model with the inputs the data needs (a gcn
 * only with its graph), ts_config_fit_data takes the shapes from the data,
 * and the synthetic W2/W4 data is deterministic and labelled as
 * documented. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "check.h"
#include "data/synthetic.h"
#include "frontend/config.h"
#include "session/zoo_data.h"

static ts_status load(ts_config *c, const char *text) {
    ts_config_init(c);
    ts_status s = ts_config_load_string(c, text, strlen(text), "t.yaml");
    if (s == TS_OK) s = ts_config_finish(c);
    return s;
}

static void test_presets(void) {
    ts_config c;
    CHECK_OK(load(&c, "model: {preset: w2}\n"));
    ts_rnn_config r = ts_config_rnn(&c), w2 = ts_gru_w2();
    CHECK(c.model.name == TS_CFG_GRU && c.model.classes == 1, "w2 is a binary gru");
    CHECK(r.batch == w2.batch && r.seq_len == w2.seq_len && r.features == w2.features &&
              r.hidden == w2.hidden && r.layers == w2.layers && r.classes == 0 && r.out_dim == 0,
          "w2 gives W2's shape and binary head");
    CHECK_OK(load(&c, "model: {name: lstm}\n"));
    r = ts_config_rnn(&c);
    CHECK(c.model.preset == TS_CFG_W2 && r.hidden == 256 && r.seq_len == 64, "lstm starts from w2");
    CHECK_OK(load(&c, "model: {preset: w4}\n"));
    ts_unet3d_config u = ts_config_unet3d(&c), w4 = ts_unet3d_w4();
    CHECK(c.model.name == TS_CFG_UNET3D && !memcmp(&u, &w4, sizeof u), "w4 is W4's unet3d");
    CHECK_OK(load(&c, "model: {preset: w5}\ndata: {source: graph, edges: e, x: x, y: y}\n"));
    ts_gcn_config w5 = ts_gcn_w5();
    CHECK(c.model.name == TS_CFG_GCN && c.model.features == w5.in_features &&
              c.model.hidden == w5.hidden && c.model.classes == w5.classes &&
              c.model.nodes == w5.nodes && c.model.batch == 1,
          "w5 is W5's gcn");
    /* A regression gru: out_dim asks for it. */
    CHECK_OK(load(&c, "model: {name: gru, out_dim: 3}\n"));
    r = ts_config_rnn(&c);
    CHECK(c.model.classes == 0 && r.out_dim == 3 && r.classes == 0, "gru regression");
}

static void test_roundtrip(void) {
    const char *texts[] = {
        "model: {name: lstm, hidden: 12, n_layers: 3, window: 5}\ntrain: {optimizer: adam}\n",
        "model: {preset: w4, size: 16, c3: 24, classes: 3}\n",
        "model: {name: gcn, hidden: 9}\ndata: {source: graph, edges: e.csv, x: x.npy, y: y.npy, "
        "test_fraction: 0.25}\n",
        "model: {name: gru, classes: 4}\ndata: {source: csv, path: s.csv, label: c, window: 7}\n",
    };
    for (int i = 0; i < 4; i++) {
        ts_config a, b;
        CHECK_OK(load(&a, texts[i]));
        char *text = NULL;
        size_t len = 0;
        FILE *f = open_memstream(&text, &len);
        CHECK(f != NULL, "open_memstream");
        if (!f) return;
        CHECK_OK(ts_config_write(&a, f));
        fclose(f);
        CHECK_OK(load(&b, text));
        CHECK(!memcmp(&a.model, &b.model, sizeof a.model) &&
                  !memcmp(&a.data, &b.data, sizeof a.data),
              "config %d reads back the same:\n%s", i, text);
        free(text);
    }
}

static void test_build(void) {
    ts_config c;
    ts_graph *g = NULL;
    ts_model m;
    ts_train_spec spec;
    ts_compile_options opt;
    CHECK_OK(load(&c, "model: {name: gru, batch: 3, window: 5, features: 2, hidden: 4}\n"));
    CHECK_OK(ts_config_build(&c, &g, &m, &spec, &opt));
    CHECK(g && ts_dtype_of(g, m.target) == TS_F32 && ts_dim(g, m.target, 1) == 1 &&
              ts_dim(g, m.input, 1) == 5 && ts_dim(g, m.input, 2) == 2,
          "binary gru: x [3, 5, 2], y [3, 1] f32");
    ts_graph_free(g);
    CHECK_OK(load(&c, "model: {name: lstm, batch: 3, classes: 4, hidden: 4}\n"
                      "data: {source: npy, x: x.npy, y: y.npy}\n"));
    CHECK_OK(ts_config_build(&c, &g, &m, &spec, &opt));
    CHECK(g && ts_dtype_of(g, m.target) == TS_I64 && ts_dim(g, m.output, 1) == 4,
          "lstm classifier: logits [3, 4], y i64");
    ts_graph_free(g);
    CHECK_OK(load(&c, "model: {name: unet3d, batch: 1, size: 8, c1: 2, c2: 2, c3: 2}\n"));
    CHECK_OK(ts_config_build(&c, &g, &m, &spec, &opt));
    CHECK(g && ts_dim(g, m.input, 4) == 8 && ts_dim(g, m.output, 1) == 2, "unet3d x [1,1,8,8,8]");
    ts_graph_free(g);
    CHECK_OK(load(&c, "model: {name: gcn, features: 3, hidden: 4, classes: 2}\n"
                      "data: {source: graph, edges: e, x: x, y: y}\n"));
    g = NULL;
    CHECK(ts_config_build(&c, &g, &m, &spec, &opt) == TS_ERR_INVALID && !g &&
              strstr(ts_last_error(), "ts_config_build_graph"),
          "a gcn needs its graph: %s", ts_last_error());
    const int64_t src[2] = {0, 1}, dst[2] = {1, 2};
    ts_config_graph gr = {5, 2, src, dst};
    CHECK_OK(ts_config_build_graph(&c, &gr, &g, &m, &spec, &opt));
    CHECK(g && ts_dim(g, m.input, 0) == 5 && ts_dim(g, m.input, 1) == 3 &&
              ts_dim(g, m.output, 1) == 2,
          "gcn x [5, 3], logits [5, 2]");
    ts_graph_free(g);
}

static void test_fit(void) {
    ts_config c;
    CHECK_OK(load(&c, "model: {name: gru, batch: 2}\ndata: {source: csv, path: p, label: y}\n"));
    ts_config_data_shape d = {24, 1, 0, 5, 6, 4};
    CHECK_OK(ts_config_fit_data(&c, &d));
    CHECK(c.model.window == 6 && c.model.features == 4 && c.model.classes == 0 &&
              c.model.out_dim == 1,
          "gru regression from the data: window 6, features 4");
    CHECK_OK(load(&c, "model: {name: gru, window: 5}\ndata: {source: csv, path: p, label: y}\n"));
    CHECK(ts_config_fit_data(&c, &d) == TS_ERR_INVALID && strstr(ts_last_error(), "t.yaml:1:") &&
              strstr(ts_last_error(), "model.window 5 does not match the data's sequences of 6"),
          "window against the data: %s", ts_last_error());
    CHECK_OK(load(&c, "model: {name: unet3d, batch: 1}\ndata: {source: npy, x: x, y: y}\n"));
    ts_config_data_shape v = {2 * 16 * 16 * 16, 0, 3, 4, 2, 16};
    CHECK_OK(ts_config_fit_data(&c, &v));
    CHECK(c.model.size == 16 && c.model.channels == 2 && c.model.classes == 3,
          "unet3d size, channels and classes from the volumes");
    CHECK(load(&c, "model: {name: gcn, classes: 1}\ndata: {source: graph, edges: e, x: x, y: "
                   "y}\n") == TS_ERR_INVALID &&
              strstr(ts_last_error(), "t.yaml:1:"),
          "gcn classes 1: %s", ts_last_error());
    CHECK(strstr(ts_last_error(), "a gcn needs model.classes >= 2, got 1"), "%s", ts_last_error());
}

static void test_synthetic(void) {
    enum { B = 3, S = 16, V = S * S * S, C = 3 };
    static float x[B * V], x2[B * V];
    static int64_t y[B * V], y2[B * V];
    CHECK_OK(ts_synth_volumes(7, 2, B, 1, S, C, x, y));
    CHECK_OK(ts_synth_volumes(7, 2, B, 1, S, C, x2, y2));
    CHECK(!memcmp(x, x2, sizeof x) && !memcmp(y, y2, sizeof y), "same seed and index: same batch");
    CHECK_OK(ts_synth_volumes(7, 3, B, 1, S, C, x2, y2));
    CHECK(memcmp(y, y2, sizeof y), "another index: other volumes");
    /* Every class occurs, the shells nest (class 2 inside class 1's
     * radius), and x carries the label: its mean rises with the class. */
    double sum[C] = {0};
    int64_t count[C] = {0};
    for (int i = 0; i < B * V; i++) sum[y[i]] += x[i], count[y[i]]++;
    for (int k = 0; k < C; k++) CHECK(count[k] > 0, "class %d occurs", k);
    CHECK(count[2] < count[1] && count[1] < count[0], "inner shells are smaller");
    CHECK(sum[0] / count[0] < sum[1] / count[1] && sum[1] / count[1] < sum[2] / count[2],
          "x rises with the class");
    CHECK_NEAR(sum[2] / (double)count[2], 1.0, 0.2);

    enum { N = 64, T = 20, F = 3 };
    static float sx[N * T * F], sy[N];
    CHECK_OK(ts_synth_binary_sequences(5, 0, N, T, F, sx, sy));
    int ones = 0;
    for (int b = 0; b < N; b++) {
        float s = 0;
        for (int t = T - 16; t < T; t++) s += sx[(b * T + t) * F];
        CHECK(sy[b] == (s > 0 ? 1.0f : 0.0f), "sequence %d: label is the sign of the sum", b);
        ones += sy[b] == 1.0f;
    }
    CHECK(ones > 10 && ones < N - 10, "both labels occur (%d of %d ones)", ones, N);
    CHECK(ts_synth_volumes(1, 0, 1, 1, 8, 1, x, y) == TS_ERR_INVALID, "one class is refused");
}

/* The evaluation's soft Dice and BCE against values worked by hand. */
static void test_eval_terms(void) {
    enum { N = 8 };
    float logits[N * 2];
    int64_t labels[N];
    for (int i = 0; i < N; i++) {
        labels[i] = i % 2;
        logits[2 * i] = logits[2 * i + 1] = 0.3f; /* p = 1/2 for both classes */
    }
    ts_zoo_dice d = {0, NULL};
    CHECK_OK(ts_zoo_dice_reset(&d, 2));
    ts_zoo_dice_add(&d, logits, labels, N);
    /* I_c = 2, P_c = 4, T_c = 4: 1 - (4 + 1e-5) / (8 + 1e-5) */
    CHECK_NEAR(ts_zoo_dice_loss(&d), 1 - (4 + 1e-5) / (8 + 1e-5), 1e-12);
    for (int i = 0; i < N; i++) logits[2 * i + labels[i]] = 40.0f; /* sure and right */
    CHECK_OK(ts_zoo_dice_reset(&d, 2));
    ts_zoo_dice_add(&d, logits, labels, N);
    CHECK_NEAR(ts_zoo_dice_loss(&d), 0.0, 1e-9);
    ts_zoo_dice_free(&d);

    const float z[3] = {0.0f, 2.0f, -1.0f}, y[3] = {1.0f, 0.0f, 0.0f};
    double loss = 0;
    int64_t correct = 0;
    ts_metric_acc none = {0};
    CHECK_OK(ts_zoo_binary_add(z, y, 3, &loss, &correct, &none));
    CHECK_NEAR(loss, log(2.0) + (2.0 + log1p(exp(-2.0))) + log1p(exp(-1.0)), 1e-9);
    CHECK(correct == 1, "only z = -1 against 0 is right (z = 0 is not > 0): %lld",
          (long long)correct);
}

int main(void) {
    test_eval_terms();
    test_presets();
    test_roundtrip();
    test_build();
    test_fit();
    test_synthetic();
    return check_summary("unit/zoo_config");
}
