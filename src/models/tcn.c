/* A small temporal convolutional network (tcn) for windows of a time
 * series (CSV windows, npy sequences): the window's time axis is the
 * convolution's, its features the channels.
 *
 *   x [batch, window, features] -> [batch, features, window]
 *   conv1: Conv1d(features, c1, 3, padding 1) -> ReLU -> MaxPool1d(2)
 *   conv2: Conv1d(c1, c2, 3, padding 1) -> ReLU -> mean over time
 *   head:  Linear(c2, classes) and cross-entropy against class ids y [batch]
 *          (classes >= 2), or Linear(c2, out_dim) and MSE against
 *          y [batch, out_dim] (classes 0, a regression)
 *
 * Parameters as torch's nn.Conv1d / nn.Linear name and initialise them:
 * conv1.weight [c1, features, 3], conv1.bias, conv2.weight, conv2.bias,
 * head.weight, head.bias. The whole model is this file and its line in
 * registry.c (docs/models.md). */
#include "models/model.h"
#include "tessel/tessel.h"
#include <math.h>
#include <stdio.h>

/* torch's default init of a layer with fan_in inputs: kaiming_uniform(a =
 * sqrt 5) for the weight, U(-1/sqrt(fan_in), 1/sqrt(fan_in)) for the bias. */
static ts_val bias(ts_graph *g, const char *name, int64_t n, int64_t fan_in) {
    const double bound = 1.0 / sqrt((double)fan_in);
    int64_t d[1] = {n};
    return ts_param(g, name, TS_F32, 1, d, ts_init_uniform(-bound, bound));
}

static ts_val conv(ts_graph *g, ts_val x, const char *prefix, int64_t cin, int64_t cout) {
    char wn[64], bn[64];
    snprintf(wn, sizeof wn, "%s.weight", prefix);
    snprintf(bn, sizeof bn, "%s.bias", prefix);
    int64_t wd[3] = {cout, cin, 3}, pad[1] = {1};
    ts_val w = ts_param(g, wn, TS_F32, 3, wd, ts_init_kaiming_uniform(sqrt(5.0)));
    return ts_relu(g, ts_conv(g, x, w, bias(g, bn, cout, cin * 3), 1, NULL, pad, NULL, 1));
}

static ts_status build(const ts_config *c, const ts_config_graph *gr, ts_graph *g, ts_model *m) {
    (void)gr;
    const int64_t B = c->model.batch, T = c->model.window, F = c->model.features;
    const int64_t C1 = c->model.c1, C2 = c->model.c2;
    const int classify = c->model.classes >= 2;
    const int64_t out = classify ? c->model.classes : c->model.out_dim;
    if (B <= 0 || T < 2 || F <= 0 || C1 <= 0 || C2 <= 0 || out <= 0) {
        ts_graph_fail(g, TS_ERR_INVALID,
                      "tcn: batch, features, c1, c2 and the outputs must be > 0 "
                      "and window >= 2 "
                      "(got %lld, %lld, %lld, %lld, %lld, window %lld)",
                      (long long)B, (long long)F, (long long)C1, (long long)C2, (long long)out,
                      (long long)T);
        return ts_graph_status(g);
    }
    int64_t xd[3] = {B, T, F};
    m->input = ts_input(g, "x", TS_F32, 3, xd);
    int to_channels[3] = {0, 2, 1}, time_axis[1] = {2};
    ts_val x = ts_permute(g, m->input, to_channels); /* [B, F, T] */
    int64_t k[1] = {2};
    x = ts_max_pool(g, conv(g, x, "conv1", F, C1), 1, k, NULL, NULL); /* [B, C1, T / 2] */
    x = ts_mean(g, conv(g, x, "conv2", C1, C2), 1, time_axis, 0);     /* [B, C2] */
    int64_t wd[2] = {out, C2};
    ts_val w = ts_param(g, "head.weight", TS_F32, 2, wd, ts_init_kaiming_uniform(sqrt(5.0)));
    m->output = ts_linear(g, x, w, bias(g, "head.bias", out, C2));
    if (classify) {
        int64_t yd[1] = {B};
        m->target = ts_input(g, "y", TS_I64, 1, yd);
        ts_mark_output(g, m->output, "logits");
        m->loss = ts_cross_entropy(g, m->output, m->target, -100);
    } else {
        int64_t yd[2] = {B, out};
        m->target = ts_input(g, "y", TS_F32, 2, yd);
        ts_mark_output(g, m->output, "pred");
        m->loss = ts_mse_loss(g, m->output, m->target);
    }
    ts_set_name(g, m->loss, "loss");
    return ts_graph_status(g);
}

/* ---- descriptor ------------------------------------------------------------
 */

/* The default shape: windows of 16 steps of 8 features, 32 channels. */
static void preset_tcn(ts_config *p) {
    p->model.batch = 32, p->model.window = 16, p->model.features = 8;
    p->model.c1 = 32, p->model.c2 = 32, p->model.classes = 0, p->model.out_dim = 1;
}

static ts_status check_source(const ts_config *c) {
    return ts_model_check_synthetic_classes(c, "synthetic tcn data is a regression (classes 0)");
}

static ts_status check(ts_config *c) {
    char where[600], where2[600];
    const int classes_set = ts_config_key_is_set(c, "model.classes"),
              out_set = ts_config_key_is_set(c, "model.out_dim");
    if (c->model.window < 2)
        return ts_fail(TS_ERR_INVALID,
                       "%s: a tcn needs model.window >= 2 (it pools pairs of steps), got %lld",
                       ts_config_key_origin(c, "model.window", where, sizeof where),
                       (long long)c->model.window);
    if (c->model.classes == 1)
        return ts_fail(TS_ERR_INVALID,
                       "%s: a tcn needs model.classes >= 2 (a classifier) or 0 (a "
                       "regression), "
                       "got 1",
                       ts_config_key_origin(c, "model.classes", where, sizeof where));
    if (out_set && classes_set && c->model.classes != 0 && c->model.out_dim != 1)
        return ts_fail(TS_ERR_INVALID,
                       "%s: model.out_dim is the width of a regression, but model.classes is "
                       "%lld (set at %s); set model.classes: 0",
                       ts_config_key_origin(c, "model.out_dim", where, sizeof where),
                       (long long)c->model.classes,
                       ts_config_key_origin(c, "model.classes", where2, sizeof where2));
    return TS_OK;
}

static int tensors(const ts_config *c, ts_model_tensor *t) {
    const int64_t B = c->model.batch, T = c->model.window;
    const int64_t C = c->model.c1 > c->model.c2 ? c->model.c1 : c->model.c2;
    t[0] = (ts_model_tensor){"input x", 3, {B, T, c->model.features}};
    t[1] = (ts_model_tensor){"activations", 3, {B, C, T}};
    t[2] = (ts_model_tensor){"first weight", 3, {c->model.c1, c->model.features, 3}};
    t[3] = (ts_model_tensor){"second weight", 3, {c->model.c2, c->model.c1, 3}};
    return 4;
}

static const ts_model_preset presets[] = {{"tcn", preset_tcn}};

const ts_model_desc ts_model_tcn = {
    .name = "tcn",
    .about = "temporal CNN over time-series windows: Conv1d blocks and a "
             "linear head",
    .keys = "batch window features c1 c2 classes out_dim",
    .presets = presets,
    .n_presets = 1,
    .preset = "tcn",
    .input = TS_MODEL_IN_SEQUENCES,
    .sources = 1u << TS_CFG_SYNTHETIC | 1u << TS_CFG_CSV | 1u << TS_CFG_NPY,
    .reads = "synthetic, csv or npy sequences",
    .flags = TS_MODEL_REGRESSION,
    .unit = "samples/s",
    .check_source = check_source,
    .check = check,
    .tensors = tensors,
    .build = build,
};
