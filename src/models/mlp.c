/* The MLP of the model zoo (benchmark W1 and general use). */
#include <math.h>
#include <stdio.h>
#include "tessel/tessel.h"

ts_mlp_config ts_mlp_w1(void) {
    ts_mlp_config c = {256, 64, 32, 0, 1024, 2, 1, 1, 0};
    return c;
}

/* nn.Linear's default initialisation: kaiming_uniform(a = sqrt 5) for the
 * weight, U(-1/sqrt(fan_in), 1/sqrt(fan_in)) for the bias. */
static ts_val linear_layer(ts_graph *g, ts_val x, const char *prefix, int64_t in, int64_t out) {
    char wn[128], bn[128];
    snprintf(wn, sizeof wn, "%s.weight", prefix);
    snprintf(bn, sizeof bn, "%s.bias", prefix);
    int64_t wd[2] = {out, in}, bd[1] = {out};
    double bound = 1.0 / sqrt((double)in);
    ts_val w = ts_param(g, wn, TS_F32, 2, wd, ts_init_kaiming_uniform(sqrt(5.0)));
    ts_val b = ts_param(g, bn, TS_F32, 1, bd, ts_init_uniform(-bound, bound));
    return ts_linear(g, x, w, b);
}

ts_status ts_build_mlp(ts_graph *g, const ts_mlp_config *c, ts_model *m) {
    if (!g || !c || !m) {
        ts_graph_fail(g, TS_ERR_INVALID, "model builder: NULL argument");
        return TS_ERR_INVALID;
    }
    int64_t in_dim = c->window > 0 ? c->window * c->features : c->in_dim;
    if (c->batch <= 0 || in_dim <= 0 || c->hidden <= 0 || c->out_dim <= 0 || c->n_hidden < 0) {
        ts_graph_fail(g, TS_ERR_INVALID,
                      "mlp: batch, input size, hidden and out_dim must be > 0 (got %lld, %lld, "
                      "%lld, %lld)",
                      (long long)c->batch, (long long)in_dim, (long long)c->hidden,
                      (long long)c->out_dim);
        return ts_graph_status(g);
    }
    ts_val x;
    if (c->window > 0) {
        int64_t xd[3] = {c->batch, c->window, c->features};
        m->input = ts_input(g, "x", TS_F32, 3, xd);
        int64_t fd[2] = {c->batch, in_dim};
        x = ts_reshape(g, m->input, 2, fd);
    } else {
        int64_t xd[2] = {c->batch, in_dim};
        x = m->input = ts_input(g, "x", TS_F32, 2, xd);
    }
    int64_t yd[2] = {c->batch, c->out_dim}, out_dim = c->classes > 0 ? c->classes : c->out_dim;
    if (c->classes > 0) m->target = ts_input(g, "y", TS_I64, 1, yd);
    else m->target = ts_input(g, "y", TS_F32, 2, yd);
    int idx = 0;
    int64_t width = in_dim;
    for (int l = 0; l < c->n_hidden; l++) {
        char name[64];
        snprintf(name, sizeof name, "net.%d", idx);
        x = ts_relu(g, linear_layer(g, x, name, width, c->hidden));
        idx += 2;
        width = c->hidden;
        if (c->layer_norm) {
            char wn[64], bn[64];
            int64_t d[1] = {c->hidden};
            snprintf(wn, sizeof wn, "net.%d.weight", idx);
            snprintf(bn, sizeof bn, "net.%d.bias", idx);
            ts_val w = ts_param(g, wn, TS_F32, 1, d, ts_init_ones());
            ts_val b = ts_param(g, bn, TS_F32, 1, d, ts_init_zeros());
            x = ts_layer_norm(g, x, w, b, 1e-5);
            idx++;
        }
    }
    char name[64];
    snprintf(name, sizeof name, "net.%d", idx);
    m->output = linear_layer(g, x, name, width, out_dim);
    ts_mark_output(g, m->output, c->classes > 0 ? "logits" : "pred");
    m->loss = c->classes > 0 ? ts_cross_entropy(g, m->output, m->target, -100)
                             : ts_mse_loss(g, m->output, m->target);
    ts_set_name(g, m->loss, "loss");
    return ts_graph_status(g);
}
