/* The MLP of the model zoo (benchmark W1 and general use). */
#include <math.h>
#include <stdio.h>
#include "models/model.h"
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
    if (c->classes > 0)
        m->target = ts_input(g, "y", TS_I64, 1, yd);
    else
        m->target = ts_input(g, "y", TS_F32, 2, yd);
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

/* ---- descriptor ------------------------------------------------------------ */

ts_mlp_config ts_config_mlp(const ts_config *c) {
    ts_mlp_config m = {c->model.batch,   c->model.window,     c->model.features,
                       c->model.in_dim,  c->model.hidden,     c->model.n_hidden,
                       c->model.out_dim, c->model.layer_norm, c->model.classes};
    return m;
}

static void preset_w1(ts_config *p) {
    ts_mlp_config m = ts_mlp_w1();
    p->model.batch = m.batch, p->model.window = m.window, p->model.features = m.features;
    p->model.in_dim = m.in_dim, p->model.hidden = m.hidden, p->model.n_hidden = m.n_hidden;
    p->model.out_dim = m.out_dim, p->model.layer_norm = m.layer_norm;
}

static ts_status check_source(const ts_config *c) {
    char where[600];
    const int src = c->data.source;
    if (src == TS_CFG_SYNTHETIC && c->model.classes > 0)
        return ts_fail(TS_ERR_INVALID,
                       "%s: model.classes needs labelled data (set data.source); synthetic "
                       "mlp data is a regression task",
                       ts_config_key_origin(c, "model.classes", where, sizeof where));
    if (src == TS_CFG_GRAPH)
        return ts_fail(TS_ERR_INVALID,
                       "%s: data.source graph needs a gcn model, but model.name is mlp",
                       ts_config_key_origin(c, "data.source", where, sizeof where));
    if (src == TS_CFG_TOKENS)
        return ts_fail(TS_ERR_INVALID,
                       "%s: data.source tokens needs a gpt model, but model.name is mlp",
                       ts_config_key_origin(c, "data.source", where, sizeof where));
    return TS_OK;
}

static ts_status check(ts_config *c) {
    char where[600];
    if (c->model.window > 0) {
        int64_t f[2] = {c->model.window, c->model.features};
        int64_t in = ts_model_product((int64_t)1 << 40, 2, f);
        if (ts_config_key_is_set(c, "model.in_dim") && c->model.in_dim != in)
            return ts_fail(TS_ERR_INVALID,
                           "%s: model.in_dim %lld does not match window * features = %lld; "
                           "set model.window: 0 for a flat input",
                           ts_config_key_origin(c, "model.in_dim", where, sizeof where),
                           (long long)c->model.in_dim, (long long)in);
        c->model.in_dim = in;
    } else if (c->model.in_dim <= 0) {
        return ts_fail(TS_ERR_INVALID, "%s: model.window is 0, so set model.in_dim",
                       ts_config_key_origin(c, "model.window", where, sizeof where));
    }
    return TS_OK;
}

static ts_status fit(ts_config *c, const ts_config_data_shape *d) {
    char where[600];
    if (ts_config_key_is_set(c, "model.window") && c->model.window > 0 &&
        c->model.window * c->model.features != d->in_dim)
        return ts_fail(TS_ERR_INVALID,
                       "%s: model.window %lld x model.features %lld does not match the data's "
                       "%lld values per example; leave the input shape to the data",
                       ts_config_key_origin(c, "model.window", where, sizeof where),
                       (long long)c->model.window, (long long)c->model.features,
                       (long long)d->in_dim);
    if (ts_config_key_is_set(c, "model.in_dim") && c->model.window == 0 &&
        c->model.in_dim != d->in_dim)
        return ts_fail(TS_ERR_INVALID,
                       "%s: model.in_dim is %lld, but the data has %lld values per example",
                       ts_config_key_origin(c, "model.in_dim", where, sizeof where),
                       (long long)c->model.in_dim, (long long)d->in_dim);
    /* A flat input: the data's example layout is what x holds. */
    c->model.window = 0;
    c->model.in_dim = d->in_dim;
    const int classes_set = ts_config_key_is_set(c, "model.classes");
    const int out_set = ts_config_key_is_set(c, "model.out_dim");
    if (d->classes > 0) {
        if (classes_set && c->model.classes == 0)
            return ts_fail(TS_ERR_INVALID,
                           "%s: model.classes is 0 (regression), but the targets are class ids",
                           ts_config_key_origin(c, "model.classes", where, sizeof where));
        if (!classes_set) c->model.classes = d->classes;
    } else {
        if (c->model.classes > 0)
            return ts_fail(TS_ERR_INVALID,
                           "%s: model.classes is %lld, but the targets are numbers, not class ids",
                           ts_config_key_origin(c, "model.classes", where, sizeof where),
                           (long long)c->model.classes);
        if (out_set && c->model.out_dim != d->out_dim)
            return ts_fail(TS_ERR_INVALID,
                           "%s: model.out_dim is %lld, but the data has %lld targets per example",
                           ts_config_key_origin(c, "model.out_dim", where, sizeof where),
                           (long long)c->model.out_dim, (long long)d->out_dim);
        c->model.out_dim = d->out_dim;
    }
    return TS_OK;
}

static int tensors(const ts_config *c, ts_model_tensor *t) {
    const int64_t B = c->model.batch, in = c->model.in_dim, hid = c->model.hidden;
    t[0] = (ts_model_tensor){"input x", 2, {B, in}};
    t[1] = (ts_model_tensor){"first weight", 2, {hid, in}};
    t[2] = (ts_model_tensor){"activations", 2, {B, hid}};
    t[3] = (ts_model_tensor){"output", 2, {B, c->model.out_dim}};
    return 4;
}

static ts_status build(const ts_config *c, const ts_config_graph *gr, ts_graph *g, ts_model *m) {
    (void)gr;
    ts_mlp_config mc = ts_config_mlp(c);
    return ts_build_mlp(g, &mc, m);
}

static const ts_model_preset presets[] = {{"w1", preset_w1}};

const ts_model_desc ts_model_mlp = {
    .name = "mlp",
    .about = "multi-layer perceptron on flat inputs or flattened CSV windows (W1)",
    .keys = "batch window features in_dim hidden n_hidden out_dim layer_norm classes",
    .presets = presets,
    .n_presets = 1,
    .preset = "w1",
    .input = TS_MODEL_IN_FLAT,
    .sources = 1u << TS_CFG_SYNTHETIC | 1u << TS_CFG_IDX | 1u << TS_CFG_NPY | 1u << TS_CFG_CSV,
    .flags = TS_MODEL_REGRESSION,
    .label = "mlp",
    .label_clf = "mlp classifier",
    .unit = "samples/s",
    .check_source = check_source,
    .check = check,
    .fit = fit,
    .tensors = tensors,
    .build = build,
};
