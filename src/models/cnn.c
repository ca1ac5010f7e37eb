/* The small image classifier of the model zoo (Fashion-MNIST).
 *
 * The convolution blocks run channels last (see ts_layout in graph.h), so
 * oneDNN convolves the arena's memory without reordering it; x, the
 * features fed to the classifier and every parameter keep torch's layout. */
#include <math.h>
#include <stdio.h>
#include "models/model.h"
#include "tessel/tessel.h"

ts_cnn_config ts_cnn_fashion(void) {
    ts_cnn_config c = {64, 1, 28, 28, 32, 64, 10, 0};
    return c;
}

/* Conv2d 3x3 pad 1 without bias (kaiming_uniform(sqrt 5) as torch), then
 * BatchNorm2d (weight 1, bias 0, running stats), ReLU, MaxPool2d 2. */
static ts_val block(ts_graph *g, ts_val x, int conv_idx, int64_t cin, int64_t cout) {
    char name[64];
    int64_t wd[4] = {cout, cin, 3, 3}, cd[1] = {cout}, pad[2] = {1, 1}, k[2] = {2, 2};
    snprintf(name, sizeof name, "features.%d.weight", conv_idx);
    ts_val w = ts_param(g, name, TS_F32, 4, wd, ts_init_kaiming_uniform(sqrt(5.0)));
    x = ts_conv_layout(g, x, w, TS_NONE, 2, NULL, pad, NULL, 1, TS_CHANNELS_LAST);
    snprintf(name, sizeof name, "features.%d.weight", conv_idx + 1);
    ts_val bw = ts_param(g, name, TS_F32, 1, cd, ts_init_ones());
    snprintf(name, sizeof name, "features.%d.bias", conv_idx + 1);
    ts_val bb = ts_param(g, name, TS_F32, 1, cd, ts_init_zeros());
    snprintf(name, sizeof name, "features.%d", conv_idx + 1);
    x = ts_batch_norm_layout(g, x, bw, bb, name, 0.1, 1e-5, 1, TS_CHANNELS_LAST);
    return ts_max_pool_layout(g, x, 2, k, NULL, NULL, TS_CHANNELS_LAST);
}

ts_status ts_build_cnn(ts_graph *g, const ts_cnn_config *c, ts_model *m) {
    if (!g || !c || !m) {
        ts_graph_fail(g, TS_ERR_INVALID, "model builder: NULL argument");
        return TS_ERR_INVALID;
    }
    if (c->batch <= 0 || c->channels <= 0 || c->c1 <= 0 || c->c2 <= 0 || c->classes <= 0 ||
        c->height <= 0 || c->width <= 0) {
        ts_graph_fail(g, TS_ERR_INVALID,
                      "cnn: batch, channels, height, width, c1, c2 and classes must be > 0 (got "
                      "%lld, %lld, %lld, %lld, %lld, %lld, %lld)",
                      (long long)c->batch, (long long)c->channels, (long long)c->height,
                      (long long)c->width, (long long)c->c1, (long long)c->c2,
                      (long long)c->classes);
        return ts_graph_status(g);
    }
    if (c->height % 4 || c->width % 4) {
        ts_graph_fail(g, TS_ERR_INVALID,
                      "cnn: height and width must be multiples of 4 (two 2x2 poolings), got "
                      "%lld x %lld",
                      (long long)c->height, (long long)c->width);
        return ts_graph_status(g);
    }
    int64_t B = c->batch, H = c->height, W = c->width;
    int64_t xd[4] = {B, c->channels, H, W};
    ts_val x;
    if (c->flat_input) {
        int64_t fd[2] = {B, c->channels * H * W};
        m->input = ts_input(g, "x", TS_F32, 2, fd);
        x = ts_reshape(g, m->input, 4, xd);
    } else {
        x = m->input = ts_input(g, "x", TS_F32, 4, xd);
    }
    int64_t yd[1] = {B};
    m->target = ts_input(g, "y", TS_I64, 1, yd);
    int to_last[4] = {0, 2, 3, 1}, to_first[4] = {0, 3, 1, 2};
    int64_t xl[4] = {B, H, W, c->channels};
    /* One channel is the same memory in either layout. */
    x = c->channels == 1 ? ts_reshape(g, x, 4, xl) : ts_permute(g, x, to_last);
    x = block(g, x, 0, c->channels, c->c1);
    x = block(g, x, 4, c->c1, c->c2);
    int64_t flat = c->c2 * (H / 4) * (W / 4);
    int64_t fd[2] = {B, flat}, wd[2] = {c->classes, flat}, bd[1] = {c->classes};
    /* torch flattens [B, C, H, W]: the classifier's weight keeps its layout. */
    x = ts_reshape(g, ts_permute(g, x, to_first), 2, fd);
    double bound = 1.0 / sqrt((double)flat);
    ts_val w = ts_param(g, "classifier.weight", TS_F32, 2, wd, ts_init_kaiming_uniform(sqrt(5.0)));
    ts_val b = ts_param(g, "classifier.bias", TS_F32, 1, bd, ts_init_uniform(-bound, bound));
    m->output = ts_linear(g, x, w, b);
    ts_mark_output(g, m->output, "logits");
    m->loss = ts_cross_entropy(g, m->output, m->target, -100);
    ts_set_name(g, m->loss, "loss");
    return ts_graph_status(g);
}

/* ---- descriptor ------------------------------------------------------------ */

ts_cnn_config ts_config_cnn(const ts_config *c) {
    ts_cnn_config m = {c->model.batch, c->model.channels, c->model.height,  c->model.width,
                       c->model.c1,    c->model.c2,       c->model.classes, 1};
    return m;
}

static void preset_fashion(ts_config *p) {
    ts_cnn_config m = ts_cnn_fashion();
    p->model.batch = m.batch, p->model.channels = m.channels, p->model.height = m.height;
    p->model.width = m.width, p->model.c1 = m.c1, p->model.c2 = m.c2;
}

static ts_status check_source(const ts_config *c) {
    char where[600];
    switch ((ts_cfg_source)c->data.source) {
    case TS_CFG_SYNTHETIC:
        return ts_fail(TS_ERR_INVALID,
                       "%s: a cnn needs labelled images: set data.source (idx or npy)",
                       ts_config_key_origin(c, "model.name", where, sizeof where));
    case TS_CFG_GRAPH:
        return ts_fail(TS_ERR_INVALID,
                       "%s: data.source graph needs a gcn model, but model.name is cnn",
                       ts_config_key_origin(c, "data.source", where, sizeof where));
    case TS_CFG_TOKENS:
        return ts_fail(TS_ERR_INVALID,
                       "%s: data.source tokens needs a gpt model, but model.name is cnn",
                       ts_config_key_origin(c, "data.source", where, sizeof where));
    case TS_CFG_CSV:
        return ts_fail(TS_ERR_INVALID,
                       "%s: data.source csv has numeric targets, but a cnn is a classifier; use "
                       "idx or npy",
                       ts_config_key_origin(c, "data.source", where, sizeof where));
    default: return TS_OK;
    }
}

static ts_status check(ts_config *c) {
    char where[600];
    if (c->model.height % 4 || c->model.width % 4)
        return ts_fail(TS_ERR_INVALID,
                       "%s: model.height and model.width must be multiples of 4 (two 2x2 "
                       "poolings), got %lld x %lld",
                       ts_config_key_origin(c, "model.height", where, sizeof where),
                       (long long)c->model.height, (long long)c->model.width);
    return TS_OK;
}

static ts_status fit(ts_config *c, const ts_config_data_shape *d) {
    char where[600];
    const int64_t f[3] = {c->model.channels, c->model.height, c->model.width};
    if (ts_model_product((int64_t)1 << 40, 3, f) != d->in_dim)
        return ts_fail(TS_ERR_INVALID,
                       "%s: model.channels %lld x height %lld x width %lld does not match the "
                       "data's %lld values per example",
                       ts_config_key_origin(c, "model.channels", where, sizeof where),
                       (long long)f[0], (long long)f[1], (long long)f[2], (long long)d->in_dim);
    if (d->classes <= 0)
        return ts_fail(TS_ERR_INVALID,
                       "%s: a cnn is a classifier, but the targets are numbers, not class ids",
                       ts_config_key_origin(c, "model.name", where, sizeof where));
    if (!ts_config_key_is_set(c, "model.classes")) c->model.classes = d->classes;
    return TS_OK;
}

static int tensors(const ts_config *c, ts_model_tensor *t) {
    const int64_t B = c->model.batch, HW[2] = {c->model.height, c->model.width};
    const int64_t hw = ts_model_product((int64_t)1 << 40, 2, HW);
    t[0] = (ts_model_tensor){"input x", 3, {B, c->model.channels, hw}};
    t[1] = (ts_model_tensor){"first block", 3, {B, c->model.c1, hw}};
    t[2] = (ts_model_tensor){"second block", 3, {B, c->model.c2, hw}};
    t[3] = (ts_model_tensor){
        "classifier weight", 3, {c->model.classes > 0 ? c->model.classes : 1, c->model.c2, hw}};
    return 4;
}

static ts_status build(const ts_config *c, const ts_config_graph *gr, ts_graph *g, ts_model *m) {
    (void)gr;
    ts_cnn_config cc = ts_config_cnn(c);
    return ts_build_cnn(g, &cc, m);
}

static const ts_model_preset presets[] = {{"fashion", preset_fashion}};

const ts_model_desc ts_model_cnn = {
    .name = "cnn",
    .about = "small image classifier, two conv blocks and a linear head (Fashion-MNIST)",
    .keys = "batch classes channels height width c1 c2",
    .presets = presets,
    .n_presets = 1,
    .preset = "fashion",
    .input = TS_MODEL_IN_IMAGES,
    .sources = 1u << TS_CFG_IDX | 1u << TS_CFG_NPY,
    .label = "cnn classifier",
    .unit = "samples/s",
    .check_source = check_source,
    .check = check,
    .fit = fit,
    .tensors = tensors,
    .build = build,
};
