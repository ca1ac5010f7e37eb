/* Model dispatch: the switches on model.name that turn a finished config
 * into a model's builder config and graph (ts_config_build), and the
 * family's key flag and name. Checks of the model keys are model_checks.c's. */
#include "frontend/config_models.h"

#include <string.h>
#include "core/core.h"
#include "frontend/keys.h"

/* The key flag and the name of each model family, by model.name. */
int cfg_model_flag(int name) {
    static const int flags[] = {TS_CFG_FOR_MLP, TS_CFG_FOR_GPT,    TS_CFG_FOR_CNN, TS_CFG_FOR_RNN,
                                TS_CFG_FOR_RNN, TS_CFG_FOR_UNET3D, TS_CFG_FOR_GCN};
    return name >= 0 && name <= TS_CFG_GCN ? flags[name] : 0;
}
const char *ts_config_model_word(int name) {
    static const char *const words[] = {"mlp", "gpt", "cnn", "gru", "lstm", "unet3d", "gcn"};
    return name >= 0 && name <= TS_CFG_GCN ? words[name] : "?";
}
int cfg_is_rnn(int name) {
    return name == TS_CFG_GRU || name == TS_CFG_LSTM;
}

ts_mlp_config ts_config_mlp(const ts_config *c) {
    ts_mlp_config m = {c->model.batch,   c->model.window,     c->model.features,
                       c->model.in_dim,  c->model.hidden,     c->model.n_hidden,
                       c->model.out_dim, c->model.layer_norm, c->model.classes};
    return m;
}

ts_gpt_config ts_config_gpt(const ts_config *c) {
    ts_gpt_config g = {c->model.batch,    c->model.ctx,     c->model.vocab,  c->model.d_model,
                       c->model.n_layers, c->model.n_heads, c->model.dropout};
    return g;
}

ts_cnn_config ts_config_cnn(const ts_config *c) {
    ts_cnn_config m = {c->model.batch, c->model.channels, c->model.height,  c->model.width,
                       c->model.c1,    c->model.c2,       c->model.classes, 1};
    return m;
}

ts_rnn_config ts_config_rnn(const ts_config *c) {
    /* model.classes 1 (binary) is the builder's classes 0 and out_dim 0. */
    ts_rnn_config r = {c->model.batch,
                       c->model.window,
                       c->model.features,
                       c->model.hidden,
                       c->model.n_layers,
                       c->model.classes >= 2 ? c->model.classes : 0,
                       c->model.classes == 0 ? c->model.out_dim : 0};
    return r;
}

ts_unet3d_config ts_config_unet3d(const ts_config *c) {
    ts_unet3d_config u = {c->model.batch, c->model.channels, c->model.size,   c->model.c1,
                          c->model.c2,    c->model.c3,       c->model.classes};
    return u;
}

ts_status ts_config_build(const ts_config *c, ts_graph **g, ts_model *m, ts_train_spec *spec,
                          ts_compile_options *opt) {
    return ts_config_build_graph(c, NULL, g, m, spec, opt);
}

ts_status ts_config_build_graph(const ts_config *c, const ts_config_graph *graph, ts_graph **g,
                                ts_model *m, ts_train_spec *spec, ts_compile_options *opt) {
    if (!c || !g || !m || !spec || !opt) return ts_fail(TS_ERR_INVALID, "config: NULL argument");
    if (!c->finished) return ts_fail(TS_ERR_INVALID, "config: call ts_config_finish first");
    *g = NULL;
    if (c->model.name == TS_CFG_GCN && !graph)
        return ts_fail(TS_ERR_INVALID,
                       "config: a gcn is built on its graph: load the data (data.source graph) "
                       "and pass it to ts_config_build_graph");
    ts_graph *gr = ts_graph_new();
    if (!gr) return ts_fail(TS_ERR_NOMEM, "config: out of memory for the graph");
    ts_status s;
    if (cfg_is_rnn(c->model.name)) {
        ts_rnn_config rc = ts_config_rnn(c);
        s = c->model.name == TS_CFG_GRU ? ts_build_gru(gr, &rc, m) : ts_build_lstm(gr, &rc, m);
    } else if (c->model.name == TS_CFG_UNET3D) {
        ts_unet3d_config uc = ts_config_unet3d(c);
        s = ts_build_unet3d(gr, &uc, m);
    } else if (c->model.name == TS_CFG_GCN) {
        ts_gcn_config nc = {graph->nodes,   c->model.features, c->model.hidden, c->model.classes,
                            graph->n_edges, graph->src,        graph->dst};
        s = ts_build_gcn(gr, &nc, m);
    } else if (c->model.name == TS_CFG_MLP) {
        ts_mlp_config mc = ts_config_mlp(c);
        s = ts_build_mlp(gr, &mc, m);
    } else if (c->model.name == TS_CFG_CNN) {
        ts_cnn_config cc = ts_config_cnn(c);
        s = ts_build_cnn(gr, &cc, m);
    } else {
        ts_gpt_config gc = ts_config_gpt(c);
        s = ts_build_gpt(gr, &gc, m);
    }
    if (s != TS_OK) {
        ts_fail(s, "%s", ts_graph_error(gr));
        ts_error_prefix("building the %s model", ts_config_model_word(c->model.name));
        ts_graph_free(gr);
        return s;
    }
    const double lr = c->train.lr, wd = c->train.weight_decay;
    *spec = ts_train_spec_default(m->loss);
    switch ((ts_cfg_optimizer)c->train.optimizer) {
    case TS_CFG_SGD:
        spec->opt = ts_sgd(lr, c->train.momentum, c->train.dampening, c->train.nesterov, wd);
        break;
    case TS_CFG_ADAM:
        spec->opt = ts_adam(lr, c->train.beta1, c->train.beta2, c->train.eps, wd);
        break;
    case TS_CFG_ADAMW:
        spec->opt = ts_adamw(lr, c->train.beta1, c->train.beta2, c->train.eps, wd);
        break;
    }
    static const ts_lr_kind kinds[] = {TS_LR_CONSTANT, TS_LR_LINEAR, TS_LR_COSINE};
    spec->schedule = (ts_lr_schedule){kinds[c->train.schedule], c->train.warmup_steps,
                                      c->train.total_steps, c->train.min_lr};
    spec->clip_grad_norm = c->train.clip_grad_norm;
    *opt = ts_compile_options_default();
    opt->seed = c->train.seed;
    opt->threads = c->train.threads;
    opt->debug_nan = c->compile.debug_nan;
    opt->no_simplify = c->compile.no_simplify;
    opt->naive_schedule = c->compile.naive_schedule;
    opt->no_inplace = c->compile.no_inplace;
    opt->no_fuse = c->compile.no_fuse;
    opt->no_recompute = c->compile.no_recompute;
    opt->discard_outputs = c->compile.discard_outputs;
    ts_config_precision(c, &opt->precision); /* checked by ts_config_finish */
    *g = gr;
    return TS_OK;
}
