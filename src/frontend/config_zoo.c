/* The keys of the gru/lstm, unet3d and gcn models: their checks in
 * ts_config_finish and what ts_config_fit_data takes from their data
 * (docs/models.md). Kept apart from config.c, whose key table they share. */
#include <string.h>
#include "core/core.h"
#include "frontend/config_internal.h"

/* The checks and derived values of the gru/lstm, unet3d and gcn keys. */
ts_status ts_config_finish_zoo(ts_config *c) {
    char where[600], where2[600];
    const int i_classes = ts_config_key_find("model.classes"),
              i_out = ts_config_key_find("model.out_dim");
    if (ts_config_is_rnn(c->model.name)) {
        if (c->model.window < 1)
            return ts_fail(
                TS_ERR_INVALID, "%s: a %s needs model.window >= 1 (the sequence length)",
                ts_config_origin(c, ts_config_key_find("model.window"), where, sizeof where),
                ts_config_model_word(c->model.name));
        if (c->model.n_layers < 1)
            return ts_fail(
                TS_ERR_INVALID, "%s: a %s needs model.n_layers >= 1",
                ts_config_origin(c, ts_config_key_find("model.n_layers"), where, sizeof where),
                ts_config_model_word(c->model.name));
        /* out_dim is the width of a regression: setting it asks for one (a
         * classifier's resolved config holds out_dim 1, which loads back). */
        if (c->set[i_out] && c->set[i_classes] && c->model.classes != 0 && c->model.out_dim != 1)
            return ts_fail(TS_ERR_INVALID,
                           "%s: model.out_dim is the width of a regression, but model.classes is "
                           "%lld (set at %s); set model.classes: 0",
                           ts_config_origin(c, i_out, where, sizeof where),
                           (long long)c->model.classes,
                           ts_config_origin(c, i_classes, where2, sizeof where2));
        if (!c->set[i_classes] && (c->set[i_out] || c->data.source != TS_CFG_SYNTHETIC))
            c->model.classes = 0; /* from the data (ts_config_fit_data), or a regression */
        return TS_OK;
    }
    if (c->set[i_classes] && c->model.classes < 2)
        return ts_fail(TS_ERR_INVALID, "%s: a %s needs model.classes >= 2, got %lld",
                       ts_config_origin(c, i_classes, where, sizeof where),
                       ts_config_model_word(c->model.name), (long long)c->model.classes);
    if (c->model.name == TS_CFG_UNET3D && c->model.size % 4)
        return ts_fail(TS_ERR_INVALID,
                       "%s: model.size must be a multiple of 4 (two 2x2x2 poolings), got %lld",
                       ts_config_origin(c, ts_config_key_find("model.size"), where, sizeof where),
                       (long long)c->model.size);
    return TS_OK;
}

/* ts_config_fit_data for gru/lstm, unet3d and gcn: the data decides the
 * input shape and the task unless a key the config set says otherwise. */
ts_status ts_config_fit_zoo(ts_config *c, const ts_config_data_shape *d) {
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
                           ts_config_origin(c, i_size, where, sizeof where),
                           (long long)c->model.size, (long long)d->cols);
        if (c->set[i_ch] && c->model.channels != d->rows)
            return ts_fail(TS_ERR_INVALID,
                           "%s: model.channels %lld does not match the data's %lld channels per "
                           "volume; leave it to the data",
                           ts_config_origin(c, i_ch, where, sizeof where),
                           (long long)c->model.channels, (long long)d->rows);
        c->model.size = d->cols;
        c->model.channels = d->rows;
    } else {
        /* Sequences [window, features] or node features [nodes, features]. */
        if (d->rows <= 0 || d->cols <= 0)
            return ts_fail(TS_ERR_INVALID,
                           "%s: a %s reads %s per example, but the data has %lld values per "
                           "example",
                           ts_config_origin(c, i_name, where, sizeof where), word,
                           c->model.name == TS_CFG_GCN ? "node features [nodes, features]"
                                                       : "sequences [window, features]",
                           (long long)d->in_dim);
        if (c->model.name != TS_CFG_GCN && c->set[i_window] && c->model.window != d->rows)
            return ts_fail(TS_ERR_INVALID,
                           "%s: model.window %lld does not match the data's sequences of %lld "
                           "steps (data.window for a CSV); leave it to the data",
                           ts_config_origin(c, i_window, where, sizeof where),
                           (long long)c->model.window, (long long)d->rows);
        if (c->set[i_feat] && c->model.features != d->cols)
            return ts_fail(TS_ERR_INVALID,
                           "%s: model.features %lld does not match the data's %lld features per "
                           "%s; leave it to the data",
                           ts_config_origin(c, i_feat, where, sizeof where),
                           (long long)c->model.features, (long long)d->cols,
                           c->model.name == TS_CFG_GCN ? "node" : "step");
        const int i_nodes = ts_config_key_find("model.nodes");
        if (c->model.name == TS_CFG_GCN && c->set[i_nodes] && c->model.nodes != d->rows)
            return ts_fail(TS_ERR_INVALID,
                           "%s: model.nodes %lld does not match the graph's %lld nodes; leave it "
                           "to the data",
                           ts_config_origin(c, i_nodes, where, sizeof where),
                           (long long)c->model.nodes, (long long)d->rows);
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
                           ts_config_origin(c, i_classes, where, sizeof where),
                           (long long)c->model.classes);
        if (!c->set[i_classes]) c->model.classes = d->classes < 2 ? 2 : d->classes;
        return TS_OK;
    }
    if (!ts_config_is_rnn(c->model.name))
        return ts_fail(TS_ERR_INVALID,
                       "%s: a %s is a classifier, but the targets are numbers, not class ids",
                       ts_config_origin(c, i_name, where, sizeof where), word);
    if (c->model.classes >= 2)
        return ts_fail(
            TS_ERR_INVALID, "%s: model.classes is %lld, but the targets are numbers, not class ids",
            ts_config_origin(c, i_classes, where, sizeof where), (long long)c->model.classes);
    if (c->model.classes == 1 && d->out_dim != 1)
        return ts_fail(TS_ERR_INVALID,
                       "%s: model.classes 1 (binary) needs one 0/1 target per example, the data "
                       "has %lld",
                       ts_config_origin(c, i_classes, where, sizeof where), (long long)d->out_dim);
    if (c->model.classes == 0 && c->set[i_out] && c->model.out_dim != d->out_dim)
        return ts_fail(TS_ERR_INVALID,
                       "%s: model.out_dim is %lld, but the data has %lld targets per example",
                       ts_config_origin(c, i_out, where, sizeof where), (long long)c->model.out_dim,
                       (long long)d->out_dim);
    c->model.out_dim = d->out_dim;
    return TS_OK;
}
