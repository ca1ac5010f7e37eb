/* Reverse-mode automatic differentiation as a graph pass: walks the nodes
 * between the parameters and the loss backwards, asks each op's gradient
 * rule to emit backward nodes, and sums gradients of values used more than
 * once. */
#include <stdlib.h>
#include <string.h>
#include "passes.h"

/* The copy op used when a gradient must own its memory. */
static ts_val copy_of(ts_graph *g, ts_val v) {
    return ts_affine_scalar(g, v, 1.0, 0.0);
}

/* Recomputation: a large output of a cheap op (GELU, LayerNorm, the
 * permute of the attention output) that a
 * matmul reads is stored from the forward pass to the matmul's weight
 * gradient in the backward. Both ops' own gradients keep their input (and
 * LayerNorm's statistics) alive anyway, so the backward computes the output
 * again from them instead, just before the weight gradient: the same kernel
 * on the same values, so the same bits, and the forward output dies right
 * after the forward matmul. The copy carries a marker attribute so that
 * common-subexpression elimination does not merge it back. */
#define RECOMPUTE_MIN_BYTES ((size_t)2 << 20)

static int recomputable(const ts_graph *g, int32_t x) {
    const ts_value *v = &g->values[x];
    if (v->kind != TS_VK_NODE || v->out_index != 0 || v->is_output || v->grad_of >= 0 ||
        ts_type_bytes(&v->t) < RECOMPUTE_MIN_BYTES)
        return 0;
    const ts_node *r = &g->nodes[v->node];
    if (r->op == TS_OP_GELU || r->op == TS_OP_LAYER_NORM) return 1;
    /* the attention output in [B, T, H, hd] order: a permute (and a reshape
     * view) of the attention op's output, which its backward keeps */
    if (r->op == TS_OP_RESHAPE) return recomputable(g, r->in[0]);
    if (r->op == TS_OP_PERMUTE) {
        const ts_value *src = &g->values[r->in[0]];
        return src->kind == TS_VK_NODE && src->out_index == 0 &&
               g->nodes[src->node].op == TS_OP_ATTENTION;
    }
    return 0;
}

static ts_val recompute(ts_graph *g, int32_t x) {
    ts_node r = g->nodes[g->values[x].node];
    ts_val in[TS_MAX_OUT + 4];
    for (int j = 0; j < r.n_in && j < TS_MAX_OUT + 4; j++) in[j] = ts_mkval(r.in[j]);
    if (r.op == TS_OP_RESHAPE) in[0] = recompute(g, r.in[0]);
    ts_val outs[TS_MAX_OUT];
    ts_val y = ts_node_add(g, r.op, r.n_in, in, &r.a, outs);
    if (ts_val_ok(y)) g->nodes[g->values[y.id].node].recompute = 1;
    return y;
}

ts_status ts_pass_autodiff(ts_graph *g, int32_t loss, const int32_t *params, int n,
                           int32_t *grads) {
    return ts_pass_autodiff_ex(g, loss, params, n, grads, 0);
}

ts_status ts_pass_autodiff_ex(ts_graph *g, int32_t loss, const int32_t *params, int n,
                              int32_t *grads, int allow_recompute) {
    int nv = g->n_values, nn = g->n_nodes;
    char *dep = ts_zalloc((size_t)nv, "autodiff"), *reach = ts_zalloc((size_t)nv, "autodiff");
    ts_val *gr = ts_alloc(sizeof(ts_val) * (size_t)nv, "autodiff");
    ts_val *again = ts_alloc(sizeof(ts_val) * (size_t)nv, "autodiff");
    ts_status s = TS_OK;
    if (!dep || !reach || !gr || !again) {
        s = TS_ERR_NOMEM;
        goto done;
    }
    for (int i = 0; i < nv; i++) gr[i] = again[i] = TS_NONE;
    /* dep: depends on a differentiated parameter (forward sweep). */
    for (int i = 0; i < n; i++) dep[params[i]] = 1;
    for (int i = 0; i < nn; i++) {
        const ts_node *nd = &g->nodes[i];
        int any = 0;
        for (int j = 0; j < nd->n_in; j++) any |= dep[nd->in[j]];
        for (int j = 0; j < nd->n_out; j++)
            dep[nd->out[j]] = any && ts_dtype_is_float(g->values[nd->out[j]].t.dtype);
    }
    /* reach: the loss depends on it (backward sweep). */
    reach[loss] = 1;
    for (int i = nn - 1; i >= 0; i--) {
        const ts_node *nd = &g->nodes[i];
        int any = 0;
        for (int j = 0; j < nd->n_out; j++) any |= reach[nd->out[j]];
        if (any)
            for (int j = 0; j < nd->n_in; j++) reach[nd->in[j]] = 1;
    }
    gr[loss] = ts_scalar(g, 1.0, g->values[loss].t.dtype);
    for (int i = nn - 1; i >= 0 && g->status == TS_OK; i--) {
        ts_node nd = g->nodes[i]; /* copy: g->nodes may move while we add */
        int needed = 0, has = 0;
        for (int j = 0; j < nd.n_in; j++) needed |= dep[nd.in[j]] && reach[nd.in[j]];
        ts_val dout[TS_MAX_OUT];
        for (int j = 0; j < nd.n_out; j++) {
            dout[j] = gr[nd.out[j]];
            has |= ts_val_ok(dout[j]);
        }
        if (!needed || !has) continue;
        const ts_op_def *def = ts_op_get(nd.op);
        if (!def->grad) {
            char lb[32];
            s = ts_fail(TS_ERR_UNSUPPORTED, "autodiff: op '%s' (producing '%s') has no gradient",
                        def->name, ts_value_label(g, nd.out[0], lb, sizeof lb));
            goto done;
        }
        ts_val *din = ts_alloc(sizeof(ts_val) * (size_t)nd.n_in, "autodiff");
        if (!din) {
            s = TS_ERR_NOMEM;
            goto done;
        }
        for (int j = 0; j < nd.n_in; j++) din[j] = TS_NONE;
        int32_t *in = ts_alloc(sizeof(int32_t) * (size_t)nd.n_in, "autodiff");
        if (!in) {
            free(din);
            s = TS_ERR_NOMEM;
            goto done;
        }
        memcpy(in, nd.in, sizeof(int32_t) * (size_t)nd.n_in);
        int32_t gin[2];
        if (allow_recompute && nd.op == TS_OP_MATMUL) {
            /* the matmul's gradient reads recomputed copies of its inputs */
            for (int j = 0; j < 2; j++) {
                gin[j] = in[j];
                if (!recomputable(g, in[j])) continue;
                if (!ts_val_ok(again[in[j]])) again[in[j]] = recompute(g, in[j]);
                if (ts_val_ok(again[in[j]])) gin[j] = again[in[j]].id;
            }
            nd.in = gin;
        } else {
            nd.in = in; /* the copy must not share the input array either */
        }
        s = def->grad(g, &nd, dout, din);
        if (s == TS_OK) s = ts_graph_status(g);
        for (int j = 0; j < nd.n_in && s == TS_OK; j++) {
            int32_t x = in[j];
            if (!ts_val_ok(din[j]) || !(dep[x] && reach[x])) continue;
            gr[x] = ts_val_ok(gr[x]) ? ts_add(g, gr[x], din[j]) : din[j];
        }
        free(in);
        free(din);
        if (s != TS_OK) {
            char lb[32];
            ts_error_prefix("autodiff of %s '%s'", def->name,
                            ts_value_label(g, nd.out[0], lb, sizeof lb));
            goto done;
        }
    }
    if ((s = ts_graph_status(g)) != TS_OK) goto done;
    for (int i = 0; i < n; i++) {
        ts_val v = gr[params[i]];
        if (!ts_val_ok(v)) {
            grads[i] = -1;
            char lb[32], lb2[32];
            ts_logf(TS_LOG_WARN,
                    "parameter '%s' does not reach the loss '%s'; it is left out of the update",
                    ts_value_label(g, params[i], lb, sizeof lb),
                    ts_value_label(g, loss, lb2, sizeof lb2));
            continue;
        }
        /* A gradient lives in the gradients region, so it must be a node
         * output of its own: not a constant, not shared with another
         * parameter's gradient, not a view of something else. */
        ts_value *gv = &g->values[v.id];
        int own = gv->kind == TS_VK_NODE && gv->grad_of < 0 && !gv->is_output &&
                  !(ts_op_get(g->nodes[gv->node].op)->flags & TS_OPF_ALIAS);
        if (!own) v = copy_of(g, v);
        if ((s = ts_graph_status(g)) != TS_OK) goto done;
        g->values[v.id].grad_of = params[i];
        grads[i] = v.id;
        char name[512];
        snprintf(name, sizeof name, "grad:%s", g->values[params[i]].name);
        if ((s = ts_set_name(g, v, name)) != TS_OK) goto done;
    }
done:
    free(dep);
    free(reach);
    free(gr);
    free(again);
    return s;
}
