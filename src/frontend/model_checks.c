/* The model keys checked against each other and against the data: the
 * per-model parts of ts_config_finish (cfg_finish_model, cfg_check_sizes)
 * and of ts_config_fit_data (cfg_fit_model), through the model's
 * descriptor, and the generic fit of the sequence, volume and graph
 * models to their data; docs/models.md. */
#include "frontend/model_checks.h"

#include <string.h>
#include "core/core.h"
#include "frontend/check.h"
#include "frontend/config_models.h"

/* ts_config_fit_data for the sequence, volume and graph models (gru, lstm,
 * unet3d, gcn, ...): the data decides the input shape and the task unless a
 * key the config set says otherwise. */
static ts_status fit_zoo(ts_config *c, const ts_model_desc *md, const ts_config_data_shape *d) {
    char where[600];
    const int i_window = ts_config_key_find("model.window"),
              i_feat = ts_config_key_find("model.features"),
              i_out = ts_config_key_find("model.out_dim"),
              i_classes = ts_config_key_find("model.classes"),
              i_name = ts_config_key_find("model.name");
    const char *word = md->name;
    const int graph = md->input == TS_MODEL_IN_GRAPH;
    if (md->input == TS_MODEL_IN_VOLUMES) {
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
                           graph ? "node features [nodes, features]"
                                 : "sequences [window, features]",
                           (long long)d->in_dim);
        if (!graph && c->set[i_window] && c->model.window != d->rows)
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
                           (long long)d->cols, graph ? "node" : "step");
        const int i_nodes = ts_config_key_find("model.nodes");
        if (graph && c->set[i_nodes] && c->model.nodes != d->rows)
            return ts_fail(TS_ERR_INVALID,
                           "%s: model.nodes %lld does not match the graph's %lld nodes; leave it "
                           "to the data",
                           cfg_origin(c, i_nodes, where, sizeof where), (long long)c->model.nodes,
                           (long long)d->rows);
        if (graph)
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
    if (!(md->flags & TS_MODEL_REGRESSION))
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
    const ts_model_desc *d = ts_model_of(c);
    ts_model_tensor t[TS_MODEL_MAX_TENSORS];
    const int n = d && d->tensors ? d->tensors(c, t) : 0;
    for (int i = 0; i < n; i++)
        if (ts_model_product(limit, t[i].n, t[i].f) < 0)
            return ts_fail(TS_ERR_INVALID, "%s: model too large: its %s would exceed 2^40 elements",
                           c->file[0] ? c->file : "config", t[i].what);
    return TS_OK;
}

/* The checks and derived values of the model keys in ts_config_finish. */
ts_status cfg_finish_model(ts_config *c) {
    const ts_model_desc *d = ts_model_of(c);
    return d && d->check ? d->check(c) : TS_OK;
}

/* What ts_config_fit_data takes from the data for the model. */
ts_status cfg_fit_model(ts_config *c, const ts_config_data_shape *d) {
    const ts_model_desc *md = ts_model_of(c);
    if (!md) return TS_OK;
    if (md->fit) return md->fit(c, d);
    if (md->input == TS_MODEL_IN_SEQUENCES || md->input == TS_MODEL_IN_VOLUMES ||
        md->input == TS_MODEL_IN_GRAPH)
        return fit_zoo(c, md, d);
    return TS_OK;
}
