/* The recurrent classifiers of the model zoo (benchmark W2): GRU and LSTM. */
#include <math.h>
#include <stdio.h>
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
