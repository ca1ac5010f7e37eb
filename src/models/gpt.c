/* The GPT decoder of the model zoo (benchmark W3, GPT-2 presets). */
#include <math.h>
#include <stdio.h>
#include "models/model.h"
#include "tessel/tessel.h"

ts_gpt_config ts_gpt_w3(void) {
    ts_gpt_config c = {8, 256, 8192, 512, 6, 8, 0.0};
    return c;
}

ts_gpt_config ts_gpt2_124m(void) {
    ts_gpt_config c = {1, 1024, 50257, 768, 12, 12, 0.0};
    return c;
}

static ts_val param(ts_graph *g, const char *prefix, const char *what, int rank,
                    const int64_t *dims, ts_init init) {
    char name[320];
    snprintf(name, sizeof name, "%s.%s", prefix, what);
    return ts_param(g, name, TS_F32, rank, dims, init);
}

static ts_val layer_norm(ts_graph *g, ts_val x, const char *prefix, int64_t d) {
    int64_t dd[1] = {d};
    ts_val w = param(g, prefix, "weight", 1, dd, ts_init_ones());
    ts_val b = param(g, prefix, "bias", 1, dd, ts_init_zeros());
    return ts_layer_norm(g, x, w, b, 1e-5);
}

/* Linear with GPT-2 initialisation: N(0, std) weight, zero bias. */
static ts_val linear(ts_graph *g, ts_val x, const char *prefix, int64_t in, int64_t out,
                     double std) {
    int64_t wd[2] = {out, in}, bd[1] = {out};
    ts_val w = param(g, prefix, "weight", 2, wd, ts_init_normal(0, std));
    ts_val b = param(g, prefix, "bias", 1, bd, ts_init_zeros());
    return ts_linear(g, x, w, b);
}

static ts_val dropout(ts_graph *g, ts_val x, double p) {
    return p > 0 ? ts_dropout(g, x, p) : x;
}

static ts_val attention(ts_graph *g, ts_val x, const ts_gpt_config *c, const char *prefix,
                        double proj_std) {
    int64_t B = c->batch, T = c->ctx, D = c->d_model, H = c->n_heads, hd = D / H;
    char name[256];
    snprintf(name, sizeof name, "%s.c_attn", prefix);
    ts_val qkv = linear(g, x, name, D, 3 * D, 0.02); /* [B, T, 3D] */
    ts_val parts[3];
    int64_t sizes[3] = {D, D, D};
    ts_split(g, qkv, 2, 3, sizes, parts); /* each [B, T, D] */
    int64_t hdims[4] = {B, T, H, hd};
    int perm[4] = {0, 2, 1, 3};
    ts_val q = ts_permute(g, ts_reshape(g, parts[0], 4, hdims), perm); /* [B, H, T, hd] */
    ts_val k = ts_permute(g, ts_reshape(g, parts[1], 4, hdims), perm);
    ts_val v = ts_permute(g, ts_reshape(g, parts[2], 4, hdims), perm);
    ts_val y = ts_causal_attention(g, q, k, v); /* [B, H, T, hd] */
    y = ts_permute(g, y, perm);                 /* [B, T, H, hd] */
    int64_t ydims[3] = {B, T, D};
    y = ts_reshape(g, y, 3, ydims);
    snprintf(name, sizeof name, "%s.c_proj", prefix);
    return linear(g, y, name, D, D, proj_std);
}

/* P: rows of the position embedding wpe (>= ctx); a plan of a shorter
 * sequence bucket (shape.seq_buckets) reads the first ctx rows of the
 * whole table, so every bucket's plan shares one. */
static ts_status build_gpt(ts_graph *g, const ts_gpt_config *c, int64_t P, ts_model *m) {
    if (!g || !c || !m) {
        ts_graph_fail(g, TS_ERR_INVALID, "model builder: NULL argument");
        return TS_ERR_INVALID;
    }
    if (c->batch <= 0 || c->ctx <= 0 || c->vocab <= 0 || c->d_model <= 0 || c->n_layers < 0 ||
        c->n_heads <= 0 || c->d_model % c->n_heads != 0) {
        ts_graph_fail(g, TS_ERR_INVALID,
                      "gpt: need positive sizes and d_model divisible by n_heads (d_model %lld, "
                      "n_heads %d)",
                      (long long)c->d_model, c->n_heads);
        return ts_graph_status(g);
    }
    int64_t B = c->batch, T = c->ctx, V = c->vocab, D = c->d_model;
    double proj_std = 0.02 / sqrt(2.0 * c->n_layers);
    int64_t td[2] = {B, T};
    m->input = ts_input(g, "tokens", TS_I64, 2, td);
    m->target = ts_input(g, "targets", TS_I64, 2, td);
    if (P < T) P = T;
    int64_t ed[2] = {V, D}, pd[2] = {P, D};
    ts_val wte = ts_param(g, "wte.weight", TS_F32, 2, ed, ts_init_normal(0, 0.02));
    ts_val wpe = ts_param(g, "wpe.weight", TS_F32, 2, pd, ts_init_normal(0, 0.02));
    if (P > T) wpe = ts_slice(g, wpe, 0, 0, T);
    ts_val x = ts_add(g, ts_embedding(g, wte, m->input), wpe); /* [B, T, D] */
    x = dropout(g, x, c->dropout);
    for (int l = 0; l < c->n_layers; l++) {
        char pre[32], name[96];
        snprintf(pre, sizeof pre, "blocks.%d", l);
        snprintf(name, sizeof name, "%s.ln_1", pre);
        ts_val h = layer_norm(g, x, name, D);
        snprintf(name, sizeof name, "%s.attn", pre);
        x = ts_add(g, x, dropout(g, attention(g, h, c, name, proj_std), c->dropout));
        snprintf(name, sizeof name, "%s.ln_2", pre);
        h = layer_norm(g, x, name, D);
        snprintf(name, sizeof name, "%s.fc", pre);
        h = ts_gelu(g, linear(g, h, name, D, 4 * D, 0.02), TS_GELU_TANH);
        snprintf(name, sizeof name, "%s.c_proj", pre);
        h = linear(g, h, name, 4 * D, D, proj_std);
        x = ts_add(g, x, dropout(g, h, c->dropout));
    }
    x = layer_norm(g, x, "ln_f", D);
    m->output = ts_matmul(g, x, wte, 0, 1); /* [B, T, V], head tied to wte */
    ts_mark_output(g, m->output, "logits");
    m->loss = ts_cross_entropy(g, m->output, m->target, -100);
    ts_set_name(g, m->loss, "loss");
    return ts_graph_status(g);
}

ts_status ts_build_gpt(ts_graph *g, const ts_gpt_config *c, ts_model *m) {
    return build_gpt(g, c, c ? c->ctx : 0, m);
}

/* ---- descriptor ------------------------------------------------------------ */

ts_gpt_config ts_config_gpt(const ts_config *c) {
    ts_gpt_config g = {c->model.batch,    c->model.ctx,     c->model.vocab,  c->model.d_model,
                       c->model.n_layers, c->model.n_heads, c->model.dropout};
    return g;
}

static void fill(ts_config *p, ts_gpt_config g) {
    p->model.batch = g.batch, p->model.ctx = g.ctx, p->model.vocab = g.vocab;
    p->model.d_model = g.d_model, p->model.n_layers = g.n_layers;
    p->model.n_heads = g.n_heads, p->model.dropout = g.dropout;
}
static void preset_w3(ts_config *p) {
    fill(p, ts_gpt_w3());
}
static void preset_124m(ts_config *p) {
    fill(p, ts_gpt2_124m());
}

static ts_status check_source(const ts_config *c) {
    static const char *const names[] = {"synthetic", "idx", "npy", "csv", "tokens", "graph"};
    char where[600];
    const int src = c->data.source;
    if (src == TS_CFG_GRAPH)
        return ts_fail(TS_ERR_INVALID,
                       "%s: data.source graph needs a gcn model, but model.name is gpt",
                       ts_config_key_origin(c, "data.source", where, sizeof where));
    if (src != TS_CFG_SYNTHETIC && src != TS_CFG_TOKENS)
        return ts_fail(TS_ERR_INVALID,
                       "%s: data.source %s needs an mlp or cnn model, but model.name is gpt",
                       ts_config_key_origin(c, "data.source", where, sizeof where), names[src]);
    return TS_OK;
}

static ts_status check(ts_config *c) {
    char where[600];
    if (c->model.d_model % c->model.n_heads)
        return ts_fail(TS_ERR_INVALID,
                       "%s: model.d_model %lld is not divisible by model.n_heads %d",
                       ts_config_key_origin(c, "model.n_heads", where, sizeof where),
                       (long long)c->model.d_model, c->model.n_heads);
    return TS_OK;
}

static ts_status fit(ts_config *c, const ts_config_data_shape *d) {
    (void)c, (void)d; /* the token file is cut to model.ctx and checked against model.vocab */
    return TS_OK;
}

static int tensors(const ts_config *c, ts_model_tensor *t) {
    const int64_t B = c->model.batch, D = c->model.d_model, T = c->model.ctx, V = c->model.vocab;
    const int64_t H = c->model.n_heads;
    t[0] = (ts_model_tensor){"logits", 3, {B, T, V}};
    t[1] = (ts_model_tensor){"attention scores", 4, {B, H, T, T}};
    t[2] = (ts_model_tensor){"MLP activations", 4, {B, T, D, 4}};
    t[3] = (ts_model_tensor){"token embedding", 2, {V, D}};
    return 4;
}

static ts_status build(const ts_config *c, const ts_config_graph *gr, ts_graph *g, ts_model *m) {
    (void)gr;
    ts_gpt_config gc = ts_config_gpt(c);
    /* a sequence bucket's plan: shape.build_seq positions of model.ctx */
    if (c->shape.build_seq > 0 && c->shape.build_seq < c->model.ctx) gc.ctx = c->shape.build_seq;
    return build_gpt(g, &gc, c->model.ctx, m);
}

static const ts_model_preset presets[] = {{"w3", preset_w3}, {"gpt2-124m", preset_124m}};

const ts_model_desc ts_model_gpt = {
    .name = "gpt",
    .about = "GPT-2 style decoder on token files (W3, GPT-2 124M)",
    .keys = "batch ctx vocab d_model n_layers n_heads dropout",
    .presets = presets,
    .n_presets = 2,
    .preset = "w3",
    .input = TS_MODEL_IN_TOKENS,
    .sources = 1u << TS_CFG_SYNTHETIC | 1u << TS_CFG_TOKENS,
    .flags = TS_MODEL_LM,
    .label = "gpt",
    .unit = "tokens/s",
    .check_source = check_source,
    .check = check,
    .fit = fit,
    .tensors = tensors,
    .build = build,
};
