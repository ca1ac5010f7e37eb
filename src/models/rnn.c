/* The recurrent classifiers of the model zoo (benchmark W2): GRU and LSTM. */
#include <math.h>
#include <stdio.h>
#include "models/model.h"
#include "tessel/tessel.h"

ts_rnn_config ts_gru_w2(void) {
    ts_rnn_config c = {128, 64, 32, 256, 2, 0, 0};
    return c;
}

static ts_status build(ts_graph *g, const ts_rnn_config *c, ts_model *m, int lstm) {
    const char *kind = lstm ? "lstm" : "gru";
    if (!g || !c || !m) {
        ts_graph_fail(g, TS_ERR_INVALID, "model builder: NULL argument");
        return TS_ERR_INVALID;
    }
    if (c->batch <= 0 || c->seq_len <= 0 || c->features <= 0 || c->hidden <= 0 || c->layers <= 0 ||
        c->classes < 0 || c->classes == 1 || c->out_dim < 0 || (c->classes > 0 && c->out_dim > 0)) {
        ts_graph_fail(g, TS_ERR_INVALID,
                      "%s: batch, seq_len, features, hidden and layers must be > 0, classes 0 or "
                      ">= 2 and out_dim >= 0, not both set (got %lld, %lld, %lld, %lld, %d, "
                      "classes %lld, out_dim %lld)",
                      kind, (long long)c->batch, (long long)c->seq_len, (long long)c->features,
                      (long long)c->hidden, c->layers, (long long)c->classes,
                      (long long)c->out_dim);
        return ts_graph_status(g);
    }
    int64_t B = c->batch, H = c->hidden;
    /* Outputs of the head: one logit (binary), a logit per class, or the
     * regression targets. */
    const int64_t outs = c->classes > 0 ? c->classes : c->out_dim > 0 ? c->out_dim : 1;
    int64_t xd[3] = {B, c->seq_len, c->features}, yd[2] = {B, outs};
    m->input = ts_input(g, "x", TS_F32, 3, xd);
    if (c->classes > 0)
        m->target = ts_input(g, "y", TS_I64, 1, yd);
    else
        m->target = ts_input(g, "y", TS_F32, 2, yd);
    ts_val h_n = TS_NONE;
    if (lstm)
        ts_lstm(g, m->input, TS_NONE, TS_NONE, c->layers, H, kind, &h_n, NULL);
    else
        ts_gru(g, m->input, TS_NONE, c->layers, H, kind, &h_n);
    if (ts_graph_status(g) != TS_OK) return ts_graph_status(g);
    int64_t hd[2] = {B, H};
    ts_val last = ts_reshape(g, ts_slice(g, h_n, 0, c->layers - 1, c->layers), 2, hd);
    int64_t wd[2] = {outs, H}, bd[1] = {outs};
    double bound = 1.0 / sqrt((double)H);
    ts_val w = ts_param(g, "head.weight", TS_F32, 2, wd, ts_init_kaiming_uniform(sqrt(5.0)));
    ts_val b = ts_param(g, "head.bias", TS_F32, 1, bd, ts_init_uniform(-bound, bound));
    m->output = ts_linear(g, last, w, b);
    ts_mark_output(g, m->output, c->classes > 0 ? "logits" : "pred");
    m->loss = c->classes > 0   ? ts_cross_entropy(g, m->output, m->target, -100)
              : c->out_dim > 0 ? ts_mse_loss(g, m->output, m->target)
                               : ts_bce_with_logits(g, m->output, m->target);
    ts_set_name(g, m->loss, "loss");
    return ts_graph_status(g);
}

ts_status ts_build_gru(ts_graph *g, const ts_rnn_config *c, ts_model *m) {
    return build(g, c, m, 0);
}
ts_status ts_build_lstm(ts_graph *g, const ts_rnn_config *c, ts_model *m) {
    return build(g, c, m, 1);
}

/* ---- descriptors ----------------------------------------------------------- */

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

static void preset_w2(ts_config *p) {
    ts_rnn_config m = ts_gru_w2();
    p->model.batch = m.batch, p->model.window = m.seq_len, p->model.features = m.features;
    p->model.hidden = m.hidden, p->model.n_layers = m.layers;
    p->model.classes = 1, p->model.out_dim = 1; /* W2 is a binary classifier */
}

static ts_status rnn_check_source(const ts_config *c) {
    char is[160];
    snprintf(is, sizeof is,
             "synthetic %s data is W2's binary task (classes 1) or a regression (classes 0)",
             ts_config_model_word(c->model.name));
    return ts_model_check_synthetic_classes(c, is);
}

static ts_status rnn_check(ts_config *c) {
    char where[600], where2[600];
    const char *word = ts_config_model_word(c->model.name);
    const int classes_set = ts_config_key_is_set(c, "model.classes"),
              out_set = ts_config_key_is_set(c, "model.out_dim");
    if (c->model.window < 1)
        return ts_fail(TS_ERR_INVALID, "%s: a %s needs model.window >= 1 (the sequence length)",
                       ts_config_key_origin(c, "model.window", where, sizeof where), word);
    if (c->model.n_layers < 1)
        return ts_fail(TS_ERR_INVALID, "%s: a %s needs model.n_layers >= 1",
                       ts_config_key_origin(c, "model.n_layers", where, sizeof where), word);
    /* out_dim is the width of a regression: setting it asks for one (a
     * classifier's resolved config holds out_dim 1, which loads back). */
    if (out_set && classes_set && c->model.classes != 0 && c->model.out_dim != 1)
        return ts_fail(TS_ERR_INVALID,
                       "%s: model.out_dim is the width of a regression, but model.classes is "
                       "%lld (set at %s); set model.classes: 0",
                       ts_config_key_origin(c, "model.out_dim", where, sizeof where),
                       (long long)c->model.classes,
                       ts_config_key_origin(c, "model.classes", where2, sizeof where2));
    if (!classes_set && (out_set || c->data.source != TS_CFG_SYNTHETIC))
        c->model.classes = 0; /* from the data (ts_config_fit_data), or a regression */
    return TS_OK;
}

static int rnn_tensors(const ts_config *c, ts_model_tensor *t) {
    const int64_t B = c->model.batch, hid = c->model.hidden;
    t[0] = (ts_model_tensor){"input x", 3, {B, c->model.window, c->model.features}};
    t[1] = (ts_model_tensor){"hidden states", 4, {B, c->model.window, hid, 4}};
    t[2] = (ts_model_tensor){"weights", 3, {hid, 4, hid + c->model.features}};
    return 3;
}

static ts_status gru_build(const ts_config *c, const ts_config_graph *gr, ts_graph *g,
                           ts_model *m) {
    (void)gr;
    ts_rnn_config rc = ts_config_rnn(c);
    return ts_build_gru(g, &rc, m);
}

static ts_status lstm_build(const ts_config *c, const ts_config_graph *gr, ts_graph *g,
                            ts_model *m) {
    (void)gr;
    ts_rnn_config rc = ts_config_rnn(c);
    return ts_build_lstm(g, &rc, m);
}

static const ts_model_preset presets[] = {{"w2", preset_w2}};

#define RNN_DESC(NAME, ABOUT, PRESETS, N_PRESETS, BUILD)                                           \
    {                                                                                              \
        .name = NAME, .about = ABOUT,                                                              \
        .keys = "batch window features hidden out_dim classes n_layers", .presets = PRESETS,       \
        .n_presets = N_PRESETS, .preset = "w2", .input = TS_MODEL_IN_SEQUENCES,                    \
        .sources = 1u << TS_CFG_SYNTHETIC | 1u << TS_CFG_CSV | 1u << TS_CFG_NPY,                   \
        .reads = "synthetic, csv or npy sequences",                                                \
        .flags = TS_MODEL_REGRESSION | TS_MODEL_BINARY, .unit = "samples/s",                       \
        .check_source = rnn_check_source, .check = rnn_check, .tensors = rnn_tensors,              \
        .build = BUILD,                                                                            \
    }

const ts_model_desc ts_model_gru = RNN_DESC(
    "gru", "GRU sequence model, binary, classes or regression (W2)", presets, 1, gru_build);
/* The lstm has no preset of its own: it starts from the gru's w2. */
const ts_model_desc ts_model_lstm =
    RNN_DESC("lstm", "LSTM sequence model, as the gru", NULL, 0, lstm_build);
