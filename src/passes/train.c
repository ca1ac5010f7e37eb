/* The train pass: the optimizer update as nodes of the step graph.
 * Gradient clipping by global norm (one CLIP_COEF node over every
 * gradient), optimizer state as persistent STATE values, and one in-place
 * update node for all parameters (groups of (p, g, state...) in parameter
 * order, then the clip coefficient; the kernel walks them in one parallel
 * loop), ordered after every other reader of any parameter so the forward
 * and backward passes see the old weights. With spec->fused_update
 * (optim.fused_update) one update node per parameter instead, each ordered
 * after its own parameter's readers only, and the gradients become
 * temporaries (add_fused). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "passes.h"

static int32_t new_state(ts_graph *g, int32_t param, const char *suffix) {
    char name[512];
    snprintf(name, sizeof name, "%s.%s", g->values[param].name, suffix);
    ts_type t = g->values[param].t;
    int32_t id = ts_value_new(g, &t, TS_VK_STATE, name);
    if (id >= 0) {
        g->values[id].init = ts_init_zeros();
        g->values[id].state_of = param;
    }
    return id;
}

static ts_status check_opt(const ts_train_spec *spec) {
    const ts_optimizer *o = &spec->opt;
    if (!(o->lr >= 0)) return ts_fail(TS_ERR_INVALID, "optimizer: invalid learning rate %g", o->lr);
    if (!(o->weight_decay >= 0))
        return ts_fail(TS_ERR_INVALID, "optimizer: invalid weight decay %g", o->weight_decay);
    if (o->kind == TS_OPT_SGD) {
        if (!(o->momentum >= 0))
            return ts_fail(TS_ERR_INVALID, "sgd: invalid momentum %g", o->momentum);
        if (o->nesterov && (o->momentum <= 0 || o->dampening != 0))
            return ts_fail(TS_ERR_INVALID, "sgd: nesterov needs momentum > 0 and dampening 0");
    }
    if (o->kind == TS_OPT_ADAM || o->kind == TS_OPT_ADAMW) {
        if (!(o->beta1 >= 0 && o->beta1 < 1) || !(o->beta2 >= 0 && o->beta2 < 1))
            return ts_fail(TS_ERR_INVALID, "adam: betas must be in [0, 1), got (%g, %g)", o->beta1,
                           o->beta2);
        if (!(o->eps >= 0)) return ts_fail(TS_ERR_INVALID, "adam: invalid eps %g", o->eps);
    }
    if (!(spec->clip_grad_norm >= 0))
        return ts_fail(TS_ERR_INVALID, "clip_grad_norm must be >= 0, got %g", spec->clip_grad_norm);
    /* Clipping by the global norm needs every gradient before the first
     * update: the opposite of updating each parameter when its gradient is
     * complete. */
    if (spec->fused_update && spec->clip_grad_norm > 0)
        return ts_fail(TS_ERR_UNSUPPORTED,
                       "optim.fused_update updates each parameter as soon as its gradient is "
                       "complete, before the global norm that train.clip_grad_norm (%g) scales by "
                       "is known; set one of them off",
                       spec->clip_grad_norm);
    return TS_OK;
}

void ts_view_roots(const ts_graph *g, int32_t *root) {
    for (int v = 0; v < g->n_values; v++) {
        int32_t r = v;
        /* at most n_values steps: a verified graph has no cycle of views */
        for (int k = 0; k < g->n_values; k++) {
            const ts_value *val = &g->values[r];
            if (val->kind != TS_VK_NODE ||
                !(ts_op_get(g->nodes[val->node].op)->flags & TS_OPF_ALIAS))
                break;
            r = g->nodes[val->node].in[0];
        }
        root[v] = r;
    }
}

/* Nodes are in topological order, so one forward sweep propagates the
 * views. */
ts_status ts_order_after_readers(ts_graph *g, int u, const int32_t *vals, int n, int stride) {
    char *view = ts_zalloc((size_t)g->n_values, "train");
    if (!view) return TS_ERR_NOMEM;
    for (int j = 0; j < n; j++) view[vals[j * stride]] = 1;
    ts_status s = TS_OK;
    for (int j = 0; j < u && s == TS_OK; j++) {
        const ts_node *r = &g->nodes[j];
        int reads = 0;
        for (int q = 0; q < r->n_in; q++) reads |= view[r->in[q]];
        if (!reads) continue;
        if (ts_op_get(r->op)->flags & TS_OPF_ALIAS) view[r->out[0]] = 1;
        s = ts_node_add_ctrl(g, u, j);
    }
    free(view);
    return s;
}

/* One update node for every parameter (k inputs: ng groups, then the
 * clip coefficient if any). */
static ts_status add_update(ts_graph *g, int op, const ts_attrs *a, const ts_val *in, int k, int ng,
                            int gs) {
    const int u = g->n_nodes;
    ts_node_add(g, op, k, in, a, NULL);
    ts_status s = ts_graph_status(g);
    /* after every reader of a parameter: the first input of each group */
    return s == TS_OK ? ts_order_after_readers(g, u, g->nodes[u].in, ng, gs) : s;
}

/* optim.fused_update: one update node per parameter, each ordered after
 * the readers of its own parameter only, so the scheduler can run it as
 * soon as its gradient is complete. The gradients stop being marked as
 * such (grad_of -1): nothing reads them after the step, so memplan puts
 * them among the temporaries, where a gradient's bytes are free again
 * once its update has run. The kernels are elementwise, so updating the
 * parameters one node at a time gives the same bits as one node over all
 * of them. */
static ts_status add_fused(ts_graph *g, int op, const ts_attrs *a, const ts_val *in, int ng,
                           int gs) {
    ts_status s = TS_OK;
    for (int j = 0; j < ng && s == TS_OK; j++) {
        const int32_t grad = in[j * gs + 1].id;
        s = add_update(g, op, a, in + j * gs, gs, 1, gs);
        if (s == TS_OK) g->values[grad].grad_of = -1;
    }
    return s;
}

ts_status ts_pass_train(ts_graph *g, const ts_train_spec *spec, const int32_t *params,
                        const int32_t *grads, int n) {
    ts_status s = check_opt(spec);
    if (s != TS_OK || spec->opt.kind == TS_OPT_NONE) return s;
    int ng = 0;
    for (int i = 0; i < n; i++) ng += grads[i] >= 0;
    if (ng == 0) return TS_OK;

    ts_val coef = TS_NONE;
    if (spec->clip_grad_norm > 0) {
        ts_val *gv = ts_alloc(sizeof(ts_val) * (size_t)ng, "train");
        if (!gv) return TS_ERR_NOMEM;
        for (int i = 0, k = 0; i < n; i++)
            if (grads[i] >= 0) gv[k++] = ts_mkval(grads[i]);
        ts_attrs a = ts_attrs_zero();
        a.clip.max_norm = spec->clip_grad_norm;
        coef = ts_node_add(g, TS_OP_CLIP_COEF, ng, gv, &a, NULL);
        free(gv);
        if ((s = ts_graph_status(g)) != TS_OK) return s;
        ts_set_name(g, coef, "clip_coef");
    }
    const ts_optimizer *o = &spec->opt;
    const int gs = o->kind == TS_OPT_SGD ? 2 + (o->momentum != 0) : 4;
    ts_val *in = ts_alloc(sizeof(ts_val) * (size_t)(ng * gs + 1), "train");
    if (!in) return TS_ERR_NOMEM;
    int k = 0;
    ts_attrs a = ts_attrs_zero();
    int op;
    if (o->kind == TS_OPT_SGD) {
        op = TS_OP_SGD_UPDATE;
        a.sgd.has_buf = o->momentum != 0;
        a.sgd.nesterov = o->nesterov != 0;
        a.sgd.momentum = o->momentum;
        a.sgd.dampening = o->dampening;
        a.sgd.weight_decay = o->weight_decay;
    } else {
        op = TS_OP_ADAM_UPDATE;
        a.adam.decoupled = o->kind == TS_OPT_ADAMW;
        a.adam.beta1 = o->beta1;
        a.adam.beta2 = o->beta2;
        a.adam.eps = o->eps;
        a.adam.weight_decay = o->weight_decay;
    }
    for (int i = 0; i < n && s == TS_OK; i++) {
        if (grads[i] < 0) continue;
        int32_t p = params[i];
        in[k++] = ts_mkval(p);
        in[k++] = ts_mkval(grads[i]);
        if (o->kind == TS_OPT_SGD) {
            if (o->momentum != 0) {
                int32_t buf = new_state(g, p, "momentum");
                if (buf < 0) s = ts_graph_status(g);
                in[k++] = ts_mkval(buf);
            }
        } else {
            int32_t m = new_state(g, p, "exp_avg"), v = new_state(g, p, "exp_avg_sq");
            if (m < 0 || v < 0) s = ts_graph_status(g);
            in[k++] = ts_mkval(m);
            in[k++] = ts_mkval(v);
        }
    }
    if (s == TS_OK && ts_val_ok(coef)) {
        in[k++] = coef;
        if (op == TS_OP_SGD_UPDATE)
            a.sgd.has_coef = 1;
        else
            a.adam.has_coef = 1;
    }
    if (s == TS_OK && spec->fused_update)
        s = add_fused(g, op, &a, in, ng, gs);
    else if (s == TS_OK)
        s = add_update(g, op, &a, in, k, ng, gs);
    free(in);
    return s;
}
