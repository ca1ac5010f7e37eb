/* Houlsby adapters as a graph rewrite before autodiff (docs/peft.md).
 *
 * After every layer whose matmul weight matches one of the patterns of
 * peft.adapter.after, the layer's output y [.., d] becomes
 *
 *     y + act(y D^T + bd) U^T + bu
 *
 * a bottleneck d -> m -> d with a residual (Houlsby et al., 2019). D
 * [m, d] starts Kaiming-uniform (a = sqrt(5), nn.Linear's default), the
 * biases and U [d, m] start at zero, so the adapter adds exactly 0 at step
 * 0 and only U moves at first (as B in LoRA).
 *
 * A layer's output is its matmul's, followed forward through a sparse
 * aggregation (spmm, the dense operand) and a bias add (an add with a
 * rank-1 parameter) as long as that node is the value's only reader: for
 * nn.Linear it is x W^T + b, for a GCN layer A_hat (x W^T) + b, so the
 * adapter sits after the graph convolution and the adjacency stays sparse.
 *
 * As in peft.c the layer's output value keeps its id, name and output
 * mark: its producer is given a fresh output that the adapter reads, and
 * the adapter's final add writes the old id, so no reader is rewritten. */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include "peft_internal.h"

static const char *const suffixes[4] = {"adapter_down", "adapter_down_bias", "adapter_up",
                                        "adapter_up_bias"};

static int ends_with(const char *s, size_t n, const char *suffix) {
    size_t k = strlen(suffix);
    return n > k + 1 && s[n - k - 1] == '.' && !memcmp(s + n - k, suffix, k);
}

int ts_peft_param_kind(const char *name) {
    const size_t n = strlen(name);
    if (ends_with(name, n, "lora_A") || ends_with(name, n, "lora_B")) return 1;
    for (int k = 0; k < 4; k++)
        if (ends_with(name, n, suffixes[k])) return 2;
    return 0;
}

/* The single live reader of value v, or -1 (none, or several). */
static int only_reader(const ts_graph *g, int32_t v) {
    int r = -1;
    for (int i = 0; i < g->n_nodes; i++) {
        const ts_node *n = &g->nodes[i];
        if (n->dead) continue;
        for (int k = 0; k < n->n_in; k++)
            if (n->in[k] == v) {
                if (r >= 0 && r != i) return -1;
                r = i;
            }
    }
    return r;
}

/* Is node n, reading v, still part of the layer (see the top)? */
static int extends_layer(const ts_graph *g, const ts_node *n, int32_t v) {
    if (n->op == TS_OP_SPMM) return n->n_in >= 4 && n->in[3] == v && n->n_out == 1;
    if (n->op != TS_OP_ADD || n->n_in != 2 || n->n_out != 1) return 0;
    const int32_t o = n->in[0] == v ? n->in[1] : n->in[0];
    return o != v && g->values[o].kind == TS_VK_PARAM && g->values[o].t.rank == 1;
}

/* The node whose output ends the layer of matmul node i. */
static int layer_end(const ts_graph *g, int i) {
    int end = i;
    for (int guard = 0; guard < 4; guard++) {
        const int32_t v = g->nodes[end].out[0];
        const int r = only_reader(g, v);
        if (r < 0 || !extends_layer(g, &g->nodes[r], v)) break;
        end = r;
    }
    return end;
}

static ts_val activation(ts_graph *g, ts_val x, ts_peft_activation a) {
    switch (a) {
    case TS_PEFT_GELU_TANH: return ts_gelu(g, x, TS_GELU_TANH);
    case TS_PEFT_RELU: return ts_relu(g, x);
    case TS_PEFT_TANH: return ts_tanh(g, x);
    default: return ts_gelu(g, x, TS_GELU_ERF);
    }
}

/* The four parameters of weight w's adapter, for a layer output of width d. */
static ts_status make_params(ts_graph *g, int32_t w, int64_t d, int m, int32_t p[4]) {
    const int64_t dims[4][2] = {{m, d}, {m, 0}, {d, m}, {d, 0}};
    for (int k = 0; k < 4; k++) {
        char name[512];
        snprintf(name, sizeof name, "%s.%s", g->values[w].name, suffixes[k]);
        if (ts_val_ok(ts_find(g, name)))
            return ts_fail(TS_ERR_INVALID, "peft: the graph already has a value named '%s'", name);
        ts_init init = k == 0 ? ts_init_kaiming_uniform(sqrt(5.0)) : ts_init_zeros();
        ts_val v = ts_param(g, name, g->values[w].t.dtype, k % 2 ? 1 : 2, dims[k], init);
        if (!ts_val_ok(v)) return ts_graph_status(g) != TS_OK ? ts_graph_status(g) : TS_ERR_INVALID;
        p[k] = v.id;
    }
    return TS_OK;
}

/* The adapter after node `end` (its output y), with the swap of the top. */
static ts_status insert(ts_graph *g, int end, const int32_t p[4], ts_peft_activation act,
                        int32_t w) {
    const int32_t y = g->nodes[end].out[0];
    const int before = g->n_nodes;
    ts_val h = ts_add(g, ts_matmul(g, ts_mkval(y), ts_mkval(p[0]), 0, 1), ts_mkval(p[1]));
    ts_val u = ts_add(g, ts_matmul(g, activation(g, h, act), ts_mkval(p[2]), 0, 1), ts_mkval(p[3]));
    ts_val z = ts_add(g, ts_mkval(y), u);
    ts_status s = ts_graph_status(g);
    if (s != TS_OK) return s;
    if (!ts_type_equal(&g->values[z.id].t, &g->values[y].t))
        return ts_fail(TS_ERR_UNSUPPORTED, "peft: the adapter after '%s' has another shape",
                       g->values[w].name);
    const int32_t fin = g->values[z.id].node;
    const int oi = g->values[y].out_index;
    g->nodes[end].out[oi] = z.id;
    g->values[z.id].node = end;
    g->values[z.id].out_index = oi;
    g->nodes[fin].out[0] = y;
    g->values[y].node = fin;
    g->values[y].out_index = 0;
    for (int k = before; k < g->n_nodes; k++)
        for (int j = 0; j < g->nodes[k].n_in; j++)
            if (g->nodes[k].in[j] == y) g->nodes[k].in[j] = z.id;
    return TS_OK;
}

ts_status ts_pass_peft_adapters(ts_graph *g, const ts_peft_options *o, int32_t **list, int *n) {
    *list = NULL;
    *n = 0;
    if (o->adapter_hidden < 1)
        return ts_fail(TS_ERR_INVALID, "peft.adapter.hidden: %d must be >= 1", o->adapter_hidden);
    ts_peft_patterns pt;
    ts_status s = ts_peft_patterns_compile("peft.adapter.after", o->adapter_after, &pt);
    if (s != TS_OK) return s;
    const int nv0 = g->n_values, n0 = g->n_nodes;
    char *weight = ts_zalloc((size_t)nv0 + 1, "peft"); /* a matmul's weight operand */
    char *chosen = ts_zalloc((size_t)nv0 + 1, "peft");
    int32_t *at = ts_alloc(sizeof(int32_t) * ((size_t)n0 + 1), "peft"); /* end node -> weight */
    int32_t *params = ts_alloc(sizeof(int32_t) * 4 * ((size_t)nv0 + 1), "peft");
    int32_t *perm = NULL;
    if (!weight || !chosen || !at || !params) {
        s = TS_ERR_NOMEM;
        goto done;
    }
    for (int i = 0; i < n0; i++)
        if (g->nodes[i].n_in == 2 && ts_peft_is_weight_of(g, &g->nodes[i], g->nodes[i].in[1]))
            weight[g->nodes[i].in[1]] = 1;
    int n_chosen = 0;
    for (int k = 0; k < pt.n && s == TS_OK; k++) {
        int hit = 0;
        for (int v = 0; v < nv0; v++) {
            if (!weight[v] || regexec(&pt.re[k], g->values[v].name, 0, NULL, 0) != 0) continue;
            hit = 1;
            n_chosen += !chosen[v];
            chosen[v] = 1;
        }
        if (!hit) s = ts_peft_no_match(g, "peft.adapter.after", pt.text[k], "layer", weight);
    }
    if (s != TS_OK) goto done;
    /* where each chosen layer ends; one adapter per end node */
    for (int i = 0; i < n0; i++) at[i] = -1;
    for (int v = 0; v < nv0; v++) params[4 * v] = -1;
    for (int i = 0; i < n0; i++) {
        const ts_node *nd = &g->nodes[i];
        if (nd->n_in != 2 || !ts_peft_is_weight_of(g, nd, nd->in[1]) || !chosen[nd->in[1]])
            continue;
        const int e = layer_end(g, i);
        if (at[e] < 0) at[e] = nd->in[1];
    }
    *list = ts_alloc(sizeof(int32_t) * (4 * (size_t)n_chosen + 1), "peft");
    perm = ts_alloc(sizeof(int32_t) * ((size_t)n0 * 8 + 1), "peft");
    if (!*list || !perm) {
        s = TS_ERR_NOMEM;
        goto done;
    }
    int np = 0;
    for (int i = 0; i < n0 && s == TS_OK; i++) {
        perm[np++] = i;
        const int32_t w = at[i];
        if (w < 0) continue;
        const ts_type *yt = &g->values[g->nodes[i].out[0]].t;
        if (yt->rank < 1 || !ts_dtype_is_float(yt->dtype)) {
            s = ts_fail(TS_ERR_UNSUPPORTED, "peft.adapter.after: the layer of '%s' has no features",
                        g->values[w].name);
            break;
        }
        if (params[4 * w] < 0) {
            if ((s = make_params(g, w, yt->dims[yt->rank - 1], o->adapter_hidden,
                                 &params[4 * w])) != TS_OK)
                break;
            for (int k = 0; k < 4; k++) (*list)[(*n)++] = params[4 * w + k];
        }
        const int before = g->n_nodes;
        if ((s = insert(g, i, &params[4 * w], o->adapter_activation, w)) != TS_OK) break;
        for (int k = before; k < g->n_nodes; k++) perm[np++] = k;
    }
    if (s == TS_OK && np != g->n_nodes)
        s = ts_fail(TS_ERR_INTERNAL, "peft adapters: %d of %d nodes ordered", np, g->n_nodes);
    if (s == TS_OK) s = ts_graph_permute_nodes(g, perm, np);
done:
    if (s != TS_OK) {
        free(*list);
        *list = NULL;
        *n = 0;
    }
    ts_peft_patterns_free(&pt);
    free(weight);
    free(chosen);
    free(at);
    free(params);
    free(perm);
    return s;
}
