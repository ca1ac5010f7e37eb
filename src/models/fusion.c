/* A multi-sensor fusion model (the automotive case of docs/scheduling.md):
 * three branches over one flat example, fused into a head.
 *
 *   x [batch, in_dim] = [camera C*H*W | sequence ctx*features | tabular rest]
 *   camera:   [B, C, H, W] -> 2 x (Conv2d 3x3 pad 1 -> BatchNorm2d -> ReLU
 *             -> MaxPool2d 2), channels c1 then c2 -> mean over H, W -> [B, c2]
 *   sequence: [B, ctx, features] -> GRU(features, hidden) -> last state [B, hidden]
 *   tabular:  [B, rest] -> Linear(rest, hidden) -> ReLU -> Linear -> ReLU
 *   head:     concat [B, c2 + 2 hidden] -> Linear(., hidden) -> ReLU
 *             -> Linear(hidden, classes or out_dim)
 *   model.source_mask: an input valid u8 [B, 3] (camera, sequence, tabular);
 *             a source's input is gated to zeros where its flag is 0, the
 *             camera projected to hidden (camera.proj), and the head reads
 *             the mean of the valid sources' [B, hidden] instead of the
 *             concat: Linear(hidden, hidden) (fusion_mask.h); the camera's
 *             BatchNorms take their statistics over the rows that have
 *             a camera (ts_batch_norm_masked)
 *
 * Cross-entropy against class ids (classes >= 2) or MSE against out_dim
 * targets (classes 0, the synthetic task). Parameter names follow torch
 * modules: camera.0.weight (conv), camera.1.* (batch norm), camera.4.*,
 * camera.5.*, sequence.gru.*, tabular.0.*, tabular.2.*, head.0.*, head.2.*.
 * The branches are independent until the concat, so the order of their
 * forward and backward nodes is the scheduler's to choose. */
#include <math.h>
#include <stdio.h>
#include "models/fusion_mask.h"
#include "models/model.h"
#include "tessel/tessel.h"

static ts_val bias_param(ts_graph *g, const char *name, int64_t n, int64_t fan_in) {
    const double bound = 1.0 / sqrt((double)fan_in);
    int64_t d[1] = {n};
    return ts_param(g, name, TS_F32, 1, d, ts_init_uniform(-bound, bound));
}

static ts_val linear(ts_graph *g, ts_val x, const char *prefix, int64_t in, int64_t out) {
    char wn[64], bn[64];
    snprintf(wn, sizeof wn, "%s.weight", prefix);
    snprintf(bn, sizeof bn, "%s.bias", prefix);
    int64_t wd[2] = {out, in};
    ts_val w = ts_param(g, wn, TS_F32, 2, wd, ts_init_kaiming_uniform(sqrt(5.0)));
    return ts_linear(g, x, w, bias_param(g, bn, out, in));
}

/* Conv2d 3x3 (no bias) -> BatchNorm2d -> ReLU -> MaxPool2d 2, channels last;
 * with a row mask (model.source_mask: the rows that have a camera) the
 * BatchNorm's statistics are those rows' alone. */
static ts_val camera_block(ts_graph *g, ts_val x, int idx, int64_t cin, int64_t cout, ts_val rows) {
    char name[64];
    int64_t wd[4] = {cout, cin, 3, 3}, cd[1] = {cout}, pad[2] = {1, 1}, k[2] = {2, 2};
    snprintf(name, sizeof name, "camera.%d.weight", idx);
    ts_val w = ts_param(g, name, TS_F32, 4, wd, ts_init_kaiming_uniform(sqrt(5.0)));
    x = ts_conv_layout(g, x, w, TS_NONE, 2, NULL, pad, NULL, 1, TS_CHANNELS_LAST);
    snprintf(name, sizeof name, "camera.%d.weight", idx + 1);
    ts_val bw = ts_param(g, name, TS_F32, 1, cd, ts_init_ones());
    snprintf(name, sizeof name, "camera.%d.bias", idx + 1);
    ts_val bb = ts_param(g, name, TS_F32, 1, cd, ts_init_zeros());
    snprintf(name, sizeof name, "camera.%d", idx + 1);
    x = ts_val_ok(rows)
            ? ts_batch_norm_masked(g, x, bw, bb, name, 0.1, 1e-5, 1, TS_CHANNELS_LAST, rows)
            : ts_batch_norm_layout(g, x, bw, bb, name, 0.1, 1e-5, 1, TS_CHANNELS_LAST);
    return ts_max_pool_layout(g, x, 2, k, NULL, NULL, TS_CHANNELS_LAST);
}

/* Values [from, to) of x, source k's; gated by its flag when there is a mask. */
static ts_val source(ts_graph *g, ts_val x, ts_val valid, int k, int64_t from, int64_t to) {
    x = ts_slice(g, x, 1, from, to);
    return ts_val_ok(valid) ? ts_fusion_gate(g, x, valid, k) : x;
}

static ts_status build(const ts_config *c, const ts_config_graph *gr, ts_graph *g, ts_model *m) {
    (void)gr;
    const int64_t B = c->model.batch, C = c->model.channels, H = c->model.height,
                  W = c->model.width, T = c->model.ctx, F = c->model.features;
    const int64_t hid = c->model.hidden, c1 = c->model.c1, c2 = c->model.c2;
    const int64_t cam = C * H * W, seq = T * F, tab = c->model.in_dim - cam - seq;
    const int classify = c->model.classes >= 2;
    const int64_t outs = classify ? c->model.classes : c->model.out_dim;
    if (B <= 0 || C <= 0 || H < 4 || W < 4 || H % 4 || W % 4 || T <= 0 || F <= 0 || hid <= 0 ||
        c1 <= 0 || c2 <= 0 || tab <= 0 || outs <= 0) {
        ts_graph_fail(g, TS_ERR_INVALID,
                      "fusion: batch, channels, ctx, features, hidden, c1, c2 and the outputs "
                      "must be > 0, height and width multiples of 4, and in_dim %lld above the "
                      "camera's %lld and the sequence's %lld values",
                      (long long)c->model.in_dim, (long long)cam, (long long)seq);
        return ts_graph_status(g);
    }
    int64_t xd[2] = {B, c->model.in_dim};
    m->input = ts_input(g, "x", TS_F32, 2, xd);
    if (classify) {
        int64_t yd[1] = {B};
        m->target = ts_input(g, "y", TS_I64, 1, yd);
    } else {
        int64_t yd[2] = {B, outs};
        m->target = ts_input(g, "y", TS_F32, 2, yd);
    }
    /* model.source_mask: which sources each row has; a missing one's input
     * is gated to zeros before its branch, its representation left out of
     * the fusion (fusion_mask.h) */
    ts_val valid = TS_NONE;
    if (c->model.source_mask) {
        int64_t vd[2] = {B, TS_FUSION_SOURCES};
        valid = ts_input(g, "valid", TS_U8, 2, vd);
    }
    /* camera: torch's [B, C, H, W] into channels last */
    int64_t cd[4] = {B, C, H, W}, cl[4] = {B, H, W, C};
    int to_last[4] = {0, 2, 3, 1}, hw[2] = {1, 2};
    ts_val img = ts_reshape(g, source(g, m->input, valid, 0, 0, cam), 4, cd);
    img = C == 1 ? ts_reshape(g, img, 4, cl) : ts_permute(g, img, to_last);
    /* a missing camera's rows stay out of the BatchNorms' statistics */
    ts_val cam_rows = ts_val_ok(valid) ? ts_fusion_rows(g, valid, 0) : TS_NONE;
    img = camera_block(g, img, 0, C, c1, cam_rows);
    img = camera_block(g, img, 4, c1, c2, cam_rows);
    img = ts_mean(g, img, 2, hw, 0); /* [B, c2] */
    /* sequence: the GRU's last state */
    int64_t sd[3] = {B, T, F}, hd[2] = {B, hid};
    ts_val s = ts_reshape(g, source(g, m->input, valid, 1, cam, cam + seq), 3, sd), h_n = TS_NONE;
    ts_gru(g, s, TS_NONE, 1, hid, "sequence.gru", &h_n);
    if (ts_graph_status(g) != TS_OK) return ts_graph_status(g);
    s = ts_reshape(g, h_n, 2, hd);
    /* tabular */
    ts_val t = source(g, m->input, valid, 2, cam + seq, c->model.in_dim);
    t = ts_relu(g, linear(g, t, "tabular.0", tab, hid));
    t = ts_relu(g, linear(g, t, "tabular.2", hid, hid));
    /* head */
    ts_val f;
    if (c->model.source_mask) {
        /* the mean over the valid sources of a common width: the camera's c2
         * channels projected to hidden */
        ts_val parts[3] = {linear(g, img, "camera.proj", c2, hid), s, t};
        f = ts_fusion_mean(g, 3, parts, valid);
        f = ts_relu(g, linear(g, f, "head.0", hid, hid));
    } else {
        ts_val parts[3] = {img, s, t};
        f = ts_concat(g, 3, parts, 1);
        f = ts_relu(g, linear(g, f, "head.0", c2 + 2 * hid, hid));
    }
    m->output = linear(g, f, "head.2", hid, outs);
    ts_mark_output(g, m->output, classify ? "logits" : "pred");
    m->loss = classify ? ts_cross_entropy(g, m->output, m->target, -100)
                       : ts_mse_loss(g, m->output, m->target);
    ts_set_name(g, m->loss, "loss");
    return ts_graph_status(g);
}

/* ---- descriptor ------------------------------------------------------------ */

/* The benchmark shape: a 3 x 64 x 64 camera, 32 steps of 16 features, 64
 * tabular values; a regression onto one target. */
static void preset_fusion(ts_config *p) {
    p->model.batch = 16, p->model.channels = 3, p->model.height = 64, p->model.width = 64;
    p->model.c1 = 16, p->model.c2 = 32, p->model.ctx = 32, p->model.features = 16;
    p->model.hidden = 128, p->model.in_dim = 3 * 64 * 64 + 32 * 16 + 64;
    p->model.classes = 0, p->model.out_dim = 1;
}

static ts_status check_source(const ts_config *c) {
    char is[96];
    snprintf(is, sizeof is, "synthetic fusion data is a regression (classes 0)");
    return ts_model_check_synthetic_classes(c, is);
}

static ts_status check(ts_config *c) {
    char where[600];
    const int64_t f[3] = {c->model.channels, c->model.height, c->model.width};
    const int64_t s[2] = {c->model.ctx, c->model.features};
    const int64_t cam = ts_model_product((int64_t)1 << 40, 3, f),
                  seq = ts_model_product((int64_t)1 << 40, 2, s);
    if (c->model.height % 4 || c->model.width % 4 || c->model.height < 4 || c->model.width < 4)
        return ts_fail(TS_ERR_INVALID,
                       "%s: model.height and model.width must be multiples of 4 (two 2x2 "
                       "poolings), got %lld x %lld",
                       ts_config_key_origin(c, "model.height", where, sizeof where),
                       (long long)c->model.height, (long long)c->model.width);
    if (cam <= 0 || seq <= 0 || c->model.in_dim <= cam + seq)
        return ts_fail(TS_ERR_INVALID,
                       "%s: model.in_dim %lld must exceed the camera's channels x height x width "
                       "(%lld) plus the sequence's ctx x features (%lld): the rest is tabular",
                       ts_config_key_origin(c, "model.in_dim", where, sizeof where),
                       (long long)c->model.in_dim, (long long)cam, (long long)seq);
    return TS_OK;
}

static ts_status fit(ts_config *c, const ts_config_data_shape *d) {
    char where[600];
    if (ts_config_key_is_set(c, "model.in_dim") && c->model.in_dim != d->in_dim)
        return ts_fail(TS_ERR_INVALID,
                       "%s: model.in_dim is %lld, but the data has %lld values per example",
                       ts_config_key_origin(c, "model.in_dim", where, sizeof where),
                       (long long)c->model.in_dim, (long long)d->in_dim);
    c->model.in_dim = d->in_dim;
    if (d->classes > 0) {
        if (!ts_config_key_is_set(c, "model.classes")) c->model.classes = d->classes;
    } else {
        if (c->model.classes > 0)
            return ts_fail(TS_ERR_INVALID,
                           "%s: model.classes is %lld, but the targets are numbers, not class ids",
                           ts_config_key_origin(c, "model.classes", where, sizeof where),
                           (long long)c->model.classes);
        c->model.out_dim = d->out_dim;
    }
    return check(c);
}

static int tensors(const ts_config *c, ts_model_tensor *t) {
    const int64_t B = c->model.batch, HW[2] = {c->model.height, c->model.width};
    const int64_t hw = ts_model_product((int64_t)1 << 40, 2, HW);
    t[0] = (ts_model_tensor){"input x", 2, {B, c->model.in_dim}};
    t[1] = (ts_model_tensor){"first camera block", 3, {B, c->model.c1, hw}};
    t[2] = (ts_model_tensor){"second camera block", 3, {B, c->model.c2, hw}};
    t[3] = (ts_model_tensor){"gru states", 4, {B, c->model.ctx, c->model.hidden, 3}};
    t[4] = (ts_model_tensor){"tabular weight", 2, {c->model.hidden, c->model.in_dim}};
    return 5;
}

static const ts_model_preset presets[] = {{"fusion", preset_fusion}};

const ts_model_desc ts_model_fusion = {
    .name = "fusion",
    .about = "multi-sensor fusion: camera conv, sequence GRU and tabular MLP branches, one head",
    .keys = "batch channels height width c1 c2 ctx features hidden in_dim out_dim classes "
            "source_mask",
    .presets = presets,
    .n_presets = 1,
    .preset = "fusion",
    .input = TS_MODEL_IN_FLAT,
    .sources = 1u << TS_CFG_SYNTHETIC | 1u << TS_CFG_NPY,
    .reads = "synthetic or npy flat examples",
    .flags = TS_MODEL_REGRESSION,
    .label = "fusion",
    .unit = "samples/s",
    .check_source = check_source,
    .check = check,
    .fit = fit,
    .tensors = tensors,
    .build = build,
};
