/* The model keys checked against each other and against the data: the
 * per-model parts of ts_config_finish (cfg_finish_model, cfg_check_sizes)
 * and of ts_config_fit_data (cfg_fit_model); docs/models.md. */
#include "frontend/model_checks.h"

#include <string.h>
#include "core/core.h"
#include "frontend/check.h"
#include "frontend/config_models.h"

/* The checks and derived values of the gru/lstm, unet3d and gcn keys. */
static ts_status finish_zoo(ts_config *c) {
    char where[600], where2[600];
    const int i_classes = ts_config_key_find("model.classes"),
              i_out = ts_config_key_find("model.out_dim");
    if (cfg_is_rnn(c->model.name)) {
        if (c->model.window < 1)
            return ts_fail(TS_ERR_INVALID, "%s: a %s needs model.window >= 1 (the sequence length)",
                           cfg_origin(c, ts_config_key_find("model.window"), where, sizeof where),
                           ts_config_model_word(c->model.name));
        if (c->model.n_layers < 1)
            return ts_fail(TS_ERR_INVALID, "%s: a %s needs model.n_layers >= 1",
                           cfg_origin(c, ts_config_key_find("model.n_layers"), where, sizeof where),
                           ts_config_model_word(c->model.name));
        /* out_dim is the width of a regression: setting it asks for one (a
         * classifier's resolved config holds out_dim 1, which loads back). */
        if (c->set[i_out] && c->set[i_classes] && c->model.classes != 0 && c->model.out_dim != 1)
            return ts_fail(TS_ERR_INVALID,
                           "%s: model.out_dim is the width of a regression, but model.classes is "
                           "%lld (set at %s); set model.classes: 0",
                           cfg_origin(c, i_out, where, sizeof where), (long long)c->model.classes,
                           cfg_origin(c, i_classes, where2, sizeof where2));
        if (!c->set[i_classes] && (c->set[i_out] || c->data.source != TS_CFG_SYNTHETIC))
            c->model.classes = 0; /* from the data (ts_config_fit_data), or a regression */
        return TS_OK;
    }
    if (c->set[i_classes] && c->model.classes < 2)
        return ts_fail(TS_ERR_INVALID, "%s: a %s needs model.classes >= 2, got %lld",
                       cfg_origin(c, i_classes, where, sizeof where),
                       ts_config_model_word(c->model.name), (long long)c->model.classes);
    if (c->model.name == TS_CFG_UNET3D && c->model.size % 4)
        return ts_fail(TS_ERR_INVALID,
                       "%s: model.size must be a multiple of 4 (two 2x2x2 poolings), got %lld",
                       cfg_origin(c, ts_config_key_find("model.size"), where, sizeof where),
                       (long long)c->model.size);
    return TS_OK;
}

/* ts_config_fit_data for gru/lstm, unet3d and gcn: the data decides the
 * input shape and the task unless a key the config set says otherwise. */
static ts_status fit_zoo(ts_config *c, const ts_config_data_shape *d) {
    char where[600];
    const int i_window = ts_config_key_find("model.window"),
              i_feat = ts_config_key_find("model.features"),
              i_out = ts_config_key_find("model.out_dim"),
              i_classes = ts_config_key_find("model.classes"),
              i_name = ts_config_key_find("model.name");
    const char *word = ts_config_model_word(c->model.name);
    if (c->model.name == TS_CFG_UNET3D) {
        /* Volumes [channels, size^3]: rows channels, cols size. */
        const int i_ch = ts_config_key_find("model.channels"),
                  i_size = ts_config_key_find("model.size");
        if (c->set[i_size] && c->model.size != d->cols)
            return ts_fail(TS_ERR_INVALID,
                           "%s: model.size %lld does not match the data's volumes of %lld^3; "
                           "leave it to the data",
                           cfg_origin(c, i_size, where, sizeof where), (long long)c->model.size,
                           (long long)d->cols);
        if (c->set[i_ch] && c->model.channels != d->rows)
            return ts_fail(TS_ERR_INVALID,
                           "%s: model.channels %lld does not match the data's %lld channels per "
                           "volume; leave it to the data",
                           cfg_origin(c, i_ch, where, sizeof where), (long long)c->model.channels,
                           (long long)d->rows);
        c->model.size = d->cols;
        c->model.channels = d->rows;
    } else {
        /* Sequences [window, features] or node features [nodes, features]. */
        if (d->rows <= 0 || d->cols <= 0)
            return ts_fail(TS_ERR_INVALID,
                           "%s: a %s reads %s per example, but the data has %lld values per "
                           "example",
                           cfg_origin(c, i_name, where, sizeof where), word,
                           c->model.name == TS_CFG_GCN ? "node features [nodes, features]"
                                                       : "sequences [window, features]",
                           (long long)d->in_dim);
        if (c->model.name != TS_CFG_GCN && c->set[i_window] && c->model.window != d->rows)
            return ts_fail(TS_ERR_INVALID,
                           "%s: model.window %lld does not match the data's sequences of %lld "
                           "steps (data.window for a CSV); leave it to the data",
                           cfg_origin(c, i_window, where, sizeof where), (long long)c->model.window,
                           (long long)d->rows);
        if (c->set[i_feat] && c->model.features != d->cols)
            return ts_fail(TS_ERR_INVALID,
                           "%s: model.features %lld does not match the data's %lld features per "
                           "%s; leave it to the data",
                           cfg_origin(c, i_feat, where, sizeof where), (long long)c->model.features,
                           (long long)d->cols, c->model.name == TS_CFG_GCN ? "node" : "step");
        const int i_nodes = ts_config_key_find("model.nodes");
        if (c->model.name == TS_CFG_GCN && c->set[i_nodes] && c->model.nodes != d->rows)
            return ts_fail(TS_ERR_INVALID,
                           "%s: model.nodes %lld does not match the graph's %lld nodes; leave it "
                           "to the data",
                           cfg_origin(c, i_nodes, where, sizeof where), (long long)c->model.nodes,
                           (long long)d->rows);
        if (c->model.name == TS_CFG_GCN)
            c->model.nodes = d->rows;
        else
            c->model.window = d->rows;
        c->model.features = d->cols;
    }
    if (d->classes > 0) {
        if (c->set[i_classes] && c->model.classes < 2)
            return ts_fail(TS_ERR_INVALID,
                           "%s: model.classes is %lld, but the targets are class ids (a "
                           "cross-entropy needs model.classes >= 2)",
                           cfg_origin(c, i_classes, where, sizeof where),
                           (long long)c->model.classes);
        if (!c->set[i_classes]) c->model.classes = d->classes < 2 ? 2 : d->classes;
        return TS_OK;
    }
    if (!cfg_is_rnn(c->model.name))
        return ts_fail(TS_ERR_INVALID,
                       "%s: a %s is a classifier, but the targets are numbers, not class ids",
                       cfg_origin(c, i_name, where, sizeof where), word);
    if (c->model.classes >= 2)
        return ts_fail(TS_ERR_INVALID,
                       "%s: model.classes is %lld, but the targets are numbers, not class ids",
                       cfg_origin(c, i_classes, where, sizeof where), (long long)c->model.classes);
    if (c->model.classes == 1 && d->out_dim != 1)
        return ts_fail(TS_ERR_INVALID,
                       "%s: model.classes 1 (binary) needs one 0/1 target per example, the data "
                       "has %lld",
                       cfg_origin(c, i_classes, where, sizeof where), (long long)d->out_dim);
    if (c->model.classes == 0 && c->set[i_out] && c->model.out_dim != d->out_dim)
        return ts_fail(TS_ERR_INVALID,
                       "%s: model.out_dim is %lld, but the data has %lld targets per example",
                       cfg_origin(c, i_out, where, sizeof where), (long long)c->model.out_dim,
                       (long long)d->out_dim);
    c->model.out_dim = d->out_dim;
    return TS_OK;
}

ts_status cfg_check_sizes(const ts_config *c) {
    /* Far beyond any machine, but keeps shape arithmetic inside int64. */
    const int64_t limit = (int64_t)1 << 40;
    const ts_cfg_model_name kind = (ts_cfg_model_name)c->model.name;
    int64_t B = c->model.batch, D = c->model.d_model, T = c->model.ctx, V = c->model.vocab;
    int64_t H = c->model.n_heads, in = c->model.in_dim, hid = c->model.hidden;
    const int64_t HW[2] = {c->model.height, c->model.width};
    const int64_t hw = cfg_product(limit, 2, HW);
    const int64_t S3[3] = {c->model.size, c->model.size, c->model.size};
    const int64_t vol = cfg_product(limit, 3, S3);
    struct {
        int kind;
        const char *what;
        int n;
        int64_t f[4];
    } t[] = {
        {TS_CFG_MLP, "input x", 2, {B, in}},
        {TS_CFG_MLP, "first weight", 2, {hid, in}},
        {TS_CFG_MLP, "activations", 2, {B, hid}},
        {TS_CFG_MLP, "output", 2, {B, c->model.out_dim}},
        {TS_CFG_GPT, "logits", 3, {B, T, V}},
        {TS_CFG_GPT, "attention scores", 4, {B, H, T, T}},
        {TS_CFG_GPT, "MLP activations", 4, {B, T, D, 4}},
        {TS_CFG_GPT, "token embedding", 2, {V, D}},
        {TS_CFG_CNN, "input x", 3, {B, c->model.channels, hw}},
        {TS_CFG_CNN, "first block", 3, {B, c->model.c1, hw}},
        {TS_CFG_CNN, "second block", 3, {B, c->model.c2, hw}},
        {TS_CFG_CNN,
         "classifier weight",
         3,
         {c->model.classes > 0 ? c->model.classes : 1, c->model.c2, hw}},
        {TS_CFG_GRU, "input x", 3, {B, c->model.window, c->model.features}},
        {TS_CFG_GRU, "hidden states", 4, {B, c->model.window, hid, 4}},
        {TS_CFG_GRU, "weights", 3, {hid, 4, hid + c->model.features}},
        {TS_CFG_UNET3D, "input x", 3, {B, c->model.channels, vol}},
        {TS_CFG_UNET3D,
         "first level",
         3,
         {B, c->model.c1 > c->model.c2 ? c->model.c1 : c->model.c2, vol}},
        {TS_CFG_UNET3D, "logits", 3, {B, c->model.classes, vol}},
        {TS_CFG_UNET3D, "bottom weights", 3, {c->model.c3, c->model.c3, 27}},
        {TS_CFG_GCN, "first weight", 2, {hid, c->model.features}},
    };
    for (int i = 0; i < (int)(sizeof t / sizeof t[0]); i++) {
        if (t[i].kind != (int)kind && !(t[i].kind == TS_CFG_GRU && kind == TS_CFG_LSTM)) continue;
        if (cfg_product(limit, t[i].n, t[i].f) < 0)
            return ts_fail(TS_ERR_INVALID, "%s: model too large: its %s would exceed 2^40 elements",
                           c->file[0] ? c->file : "config", t[i].what);
    }
    return TS_OK;
}

/* The checks and derived values of the model keys in ts_config_finish. */
ts_status cfg_finish_model(ts_config *c) {
    char where[600];
    const int i_in = ts_config_key_find("model.in_dim"),
              i_heads = ts_config_key_find("model.n_heads");
    if (c->model.name == TS_CFG_MLP) {
        if (c->model.window > 0) {
            int64_t f[2] = {c->model.window, c->model.features};
            int64_t in = cfg_product((int64_t)1 << 40, 2, f);
            if (c->set[i_in] && c->model.in_dim != in)
                return ts_fail(TS_ERR_INVALID,
                               "%s: model.in_dim %lld does not match window * features = %lld; "
                               "set model.window: 0 for a flat input",
                               cfg_origin(c, i_in, where, sizeof where), (long long)c->model.in_dim,
                               (long long)in);
            c->model.in_dim = in;
        } else if (c->model.in_dim <= 0) {
            return ts_fail(TS_ERR_INVALID, "%s: model.window is 0, so set model.in_dim",
                           cfg_origin(c, ts_config_key_find("model.window"), where, sizeof where));
        }
    } else if (c->model.name == TS_CFG_CNN) {
        if (c->model.height % 4 || c->model.width % 4)
            return ts_fail(TS_ERR_INVALID,
                           "%s: model.height and model.width must be multiples of 4 (two 2x2 "
                           "poolings), got %lld x %lld",
                           cfg_origin(c, ts_config_key_find("model.height"), where, sizeof where),
                           (long long)c->model.height, (long long)c->model.width);
    } else if (cfg_is_rnn(c->model.name) || c->model.name == TS_CFG_UNET3D ||
               c->model.name == TS_CFG_GCN) {
        return finish_zoo(c);
    } else if (c->model.d_model % c->model.n_heads) {
        return ts_fail(TS_ERR_INVALID,
                       "%s: model.d_model %lld is not divisible by model.n_heads %d",
                       cfg_origin(c, i_heads, where, sizeof where), (long long)c->model.d_model,
                       c->model.n_heads);
    }
    return TS_OK;
}

/* What ts_config_fit_data takes from the data for the model. */
ts_status cfg_fit_model(ts_config *c, const ts_config_data_shape *d) {
    char where[600];
    const int i_window = ts_config_key_find("model.window"),
              i_in = ts_config_key_find("model.in_dim"),
              i_out = ts_config_key_find("model.out_dim"),
              i_classes = ts_config_key_find("model.classes");
    if (c->model.name == TS_CFG_MLP) {
        if (c->set[i_window] && c->model.window > 0 &&
            c->model.window * c->model.features != d->in_dim)
            return ts_fail(TS_ERR_INVALID,
                           "%s: model.window %lld x model.features %lld does not match the data's "
                           "%lld values per example; leave the input shape to the data",
                           cfg_origin(c, i_window, where, sizeof where), (long long)c->model.window,
                           (long long)c->model.features, (long long)d->in_dim);
        if (c->set[i_in] && c->model.window == 0 && c->model.in_dim != d->in_dim)
            return ts_fail(TS_ERR_INVALID,
                           "%s: model.in_dim is %lld, but the data has %lld values per example",
                           cfg_origin(c, i_in, where, sizeof where), (long long)c->model.in_dim,
                           (long long)d->in_dim);
        /* A flat input: the data's example layout is what x holds. */
        c->model.window = 0;
        c->model.in_dim = d->in_dim;
        if (d->classes > 0) {
            if (c->set[i_classes] && c->model.classes == 0)
                return ts_fail(TS_ERR_INVALID,
                               "%s: model.classes is 0 (regression), but the targets are class "
                               "ids",
                               cfg_origin(c, i_classes, where, sizeof where));
            if (!c->set[i_classes]) c->model.classes = d->classes;
        } else {
            if (c->model.classes > 0)
                return ts_fail(TS_ERR_INVALID,
                               "%s: model.classes is %lld, but the targets are numbers, not class "
                               "ids",
                               cfg_origin(c, i_classes, where, sizeof where),
                               (long long)c->model.classes);
            if (c->set[i_out] && c->model.out_dim != d->out_dim)
                return ts_fail(TS_ERR_INVALID,
                               "%s: model.out_dim is %lld, but the data has %lld targets per "
                               "example",
                               cfg_origin(c, i_out, where, sizeof where),
                               (long long)c->model.out_dim, (long long)d->out_dim);
            c->model.out_dim = d->out_dim;
        }
    } else if (c->model.name == TS_CFG_CNN) {
        const int64_t f[3] = {c->model.channels, c->model.height, c->model.width};
        if (cfg_product((int64_t)1 << 40, 3, f) != d->in_dim)
            return ts_fail(TS_ERR_INVALID,
                           "%s: model.channels %lld x height %lld x width %lld does not match the "
                           "data's %lld values per example",
                           cfg_origin(c, ts_config_key_find("model.channels"), where, sizeof where),
                           (long long)f[0], (long long)f[1], (long long)f[2], (long long)d->in_dim);
        if (d->classes <= 0)
            return ts_fail(TS_ERR_INVALID,
                           "%s: a cnn is a classifier, but the targets are numbers, not class ids",
                           cfg_origin(c, ts_config_key_find("model.name"), where, sizeof where));
        if (!c->set[i_classes]) c->model.classes = d->classes;
    }
    if (cfg_is_rnn(c->model.name) || c->model.name == TS_CFG_UNET3D || c->model.name == TS_CFG_GCN)
        return fit_zoo(c, d);
    return TS_OK;
}
