/* The graph convolutional network of the model zoo (benchmark W5). */
#include <stdio.h>
#include <stdlib.h>
#include "models/model.h"
#include "tessel/tessel.h"

ts_gcn_config ts_gcn_w5(void) {
    ts_gcn_config c = {20000, 128, 64, 16, 0, NULL, NULL};
    return c;
}

int64_t ts_gcn_random_edges(int64_t nodes, int64_t avg_degree, uint64_t seed, int64_t **src,
                            int64_t **dst) {
    if (!src || !dst || nodes <= 0 || avg_degree < 0) return -1;
    int64_t m = nodes * avg_degree / 2;
    *src = malloc((size_t)(m > 0 ? m : 1) * sizeof **src);
    *dst = malloc((size_t)(m > 0 ? m : 1) * sizeof **dst);
    if (!*src || !*dst) {
        free(*src), free(*dst);
        *src = *dst = NULL;
        return -1;
    }
    uint64_t s = seed * 0x9E3779B97F4A7C15ull + 0x2545F4914F6CDD1Dull;
    for (int64_t e = 0; e < 2 * m; e++) { /* splitmix64 */
        uint64_t z = (s += 0x9E3779B97F4A7C15ull);
        z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
        z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
        z ^= z >> 31;
        int64_t v = (int64_t)(z % (uint64_t)nodes);
        if (e < m)
            (*src)[e] = v;
        else
            (*dst)[e - m] = v;
    }
    return m;
}

ts_status ts_build_gcn(ts_graph *g, const ts_gcn_config *c, ts_model *m) {
    if (!g || !c || !m) {
        ts_graph_fail(g, TS_ERR_INVALID, "model builder: NULL argument");
        return TS_ERR_INVALID;
    }
    if (c->nodes <= 0 || c->in_features <= 0 || c->hidden <= 0 || c->classes <= 0) {
        ts_graph_fail(g, TS_ERR_INVALID,
                      "gcn: nodes, in_features, hidden and classes must be > 0 (got %lld, %lld, "
                      "%lld, %lld)",
                      (long long)c->nodes, (long long)c->in_features, (long long)c->hidden,
                      (long long)c->classes);
        return ts_graph_status(g);
    }
    if (c->n_edges < 0 || (c->n_edges > 0 && (!c->src || !c->dst))) {
        ts_graph_fail(g, TS_ERR_INVALID,
                      "gcn: the edge list needs n_edges >= 0 and src/dst arrays (got n_edges "
                      "%lld, src %s, dst %s)",
                      (long long)c->n_edges, c->src ? "set" : "NULL", c->dst ? "set" : "NULL");
        return ts_graph_status(g);
    }
    ts_csr adj;
    if (ts_gcn_norm_adjacency(c->nodes, c->n_edges, c->src, c->dst, &adj) != TS_OK) {
        ts_graph_fail(g, TS_ERR_INVALID, "gcn: adjacency: %s", ts_last_error());
        return ts_graph_status(g);
    }
    int64_t N = c->nodes;
    int64_t xd[2] = {N, c->in_features}, yd[1] = {N};
    m->input = ts_input(g, "x", TS_F32, 2, xd);
    m->target = ts_input(g, "y", TS_I64, 1, yd);
    int64_t w1d[2] = {c->hidden, c->in_features}, b1d[1] = {c->hidden};
    int64_t w2d[2] = {c->classes, c->hidden}, b2d[1] = {c->classes};
    ts_val w1 = ts_param(g, "lin1.weight", TS_F32, 2, w1d, ts_init_xavier_uniform(1.0));
    ts_val b1 = ts_param(g, "b1", TS_F32, 1, b1d, ts_init_zeros());
    ts_val w2 = ts_param(g, "lin2.weight", TS_F32, 2, w2d, ts_init_xavier_uniform(1.0));
    ts_val b2 = ts_param(g, "b2", TS_F32, 1, b2d, ts_init_zeros());
    ts_val h = ts_spmm_csr(g, &adj, ts_matmul(g, m->input, w1, 0, 1));
    h = ts_relu(g, ts_add(g, h, b1));
    m->output = ts_add(g, ts_spmm_csr(g, &adj, ts_matmul(g, h, w2, 0, 1)), b2);
    ts_csr_free(&adj);
    ts_mark_output(g, m->output, "logits");
    m->loss = ts_cross_entropy(g, m->output, m->target, -100);
    ts_set_name(g, m->loss, "loss");
    return ts_graph_status(g);
}

/* ---- descriptor ------------------------------------------------------------ */

static void preset_w5(ts_config *p) {
    /* nodes and features come from the graph; batch 1: the whole graph */
    ts_gcn_config m = ts_gcn_w5();
    p->model.batch = 1, p->model.features = m.in_features, p->model.hidden = m.hidden;
    p->model.classes = m.classes, p->model.nodes = m.nodes;
}

static ts_status check(ts_config *c) {
    char where[600];
    if (ts_config_key_is_set(c, "model.classes") && c->model.classes < 2)
        return ts_fail(TS_ERR_INVALID, "%s: a gcn needs model.classes >= 2, got %lld",
                       ts_config_key_origin(c, "model.classes", where, sizeof where),
                       (long long)c->model.classes);
    return TS_OK;
}

static int tensors(const ts_config *c, ts_model_tensor *t) {
    t[0] = (ts_model_tensor){"first weight", 2, {c->model.hidden, c->model.features}};
    return 1;
}

static ts_status build(const ts_config *c, const ts_config_graph *gr, ts_graph *g, ts_model *m) {
    ts_gcn_config nc = {gr->nodes,   c->model.features, c->model.hidden, c->model.classes,
                        gr->n_edges, gr->src,           gr->dst};
    return ts_build_gcn(g, &nc, m);
}

static const ts_model_preset presets[] = {{"w5", preset_w5}};

const ts_model_desc ts_model_gcn = {
    .name = "gcn",
    .about = "two-layer graph convolutional network, full batch over a graph (W5)",
    .keys = "features hidden classes nodes",
    .presets = presets,
    .n_presets = 1,
    .preset = "w5",
    .input = TS_MODEL_IN_GRAPH,
    .sources = 1u << TS_CFG_SYNTHETIC | 1u << TS_CFG_GRAPH,
    .reads = "a synthetic graph or a graph file",
    .unit = "epochs/s", /* a step is the whole graph */
    .check = check,
    .tensors = tensors,
    .build = build,
};
