/* fuse_norm: an activation and the layer norm that reads it become one op
 * each way (ops/norm_act.c), and a layer norm's input gradient added to
 * another gradient becomes one op (ops/norm.c), part of the fusion pass
 * (fuse.c):
 *
 *   h = act(x); y, mean, rstd = layer_norm(h[, w][, b])
 *     -> h, y, mean, rstd = act_layer_norm(x[, w][, b])       (the norm's slot)
 *   dh[, dw][, db] = layer_norm_bwd(dy, h, mean, rstd[, w]); dx = unary_bwd(dh, s)
 *     -> dx[, dw][, db] = layer_norm_act_bwd(dy, h, mean, rstd[, w], s)  (the norm's slot)
 *   dh[, dw][, db] = layer_norm_bwd(dy, h, mean, rstd[, w]); r2 = add(r, dh)  (or add(dh, r))
 *     -> r2[, dw][, db] = layer_norm_bwd_acc(r, dy, h, mean, rstd[, w])     (the norm's slot)
 *
 * act is any unary op with an f32 chunk function (relu, gelu, ...); all f32.
 * h stays an output of the forward (the backward reads it); dh must be read
 * by the unary_bwd (or the add, whose operands and sum have dh's type) alone
 * and not be observable; an activation's backward takes dh first, the
 * rest go to the add. A fused node takes one of its members' slots in the
 * node order, so the order stays topological only when nothing that reads
 * the moved values (or waits for the moved node) sits between the two: such
 * pairs are left alone. The results are the same
 * bits (see norm_act.c; the add's sum r + dh is formed in f32 as the add
 * forms it). */
#include <stdlib.h>
#include <string.h>
#include "passes/fuse_norm.h"

typedef struct nctx {
    ts_graph *g;
    int *uses;           /* per value: live nodes reading it */
    int32_t *first_read; /* per value: the first live node reading it, or INT32_MAX */
    int32_t *first_wait; /* per node: the first live node with a control dependency on it */
    int32_t *root_of;
} nctx;

static void scan(nctx *c) {
    ts_graph *g = c->g;
    for (int v = 0; v < g->n_values; v++) c->uses[v] = 0, c->first_read[v] = INT32_MAX;
    for (int i = 0; i < g->n_nodes; i++) c->first_wait[i] = INT32_MAX;
    for (int i = 0; i < g->n_nodes; i++) {
        const ts_node *n = &g->nodes[i];
        if (n->dead) continue;
        for (int j = 0; j < n->n_in; j++) {
            int dup = 0;
            for (int q = 0; q < j; q++) dup |= n->in[q] == n->in[j];
            if (dup) continue;
            c->uses[n->in[j]]++;
            if (i < c->first_read[n->in[j]]) c->first_read[n->in[j]] = i;
        }
        for (int j = 0; j < n->n_ctrl; j++)
            if (i < c->first_wait[n->ctrl[j]]) c->first_wait[n->ctrl[j]] = i;
    }
}

static int f32_of(const ts_graph *g, int32_t v) {
    return g->values[v].t.dtype == TS_F32;
}

/* Node m dies into node root (its control dependencies join root's). */
static ts_status absorb(nctx *c, int32_t m, int32_t root) {
    ts_node *dm = &c->g->nodes[m], *r = &c->g->nodes[root];
    dm->dead = 1;
    c->root_of[m] = root;
    if (!dm->n_ctrl) return TS_OK;
    int32_t *nc = realloc(r->ctrl, sizeof(int32_t) * (size_t)(r->n_ctrl + dm->n_ctrl));
    if (!nc) return ts_fail(TS_ERR_NOMEM, "fuse: out of memory");
    memcpy(nc + r->n_ctrl, dm->ctrl, sizeof(int32_t) * (size_t)dm->n_ctrl);
    r->ctrl = nc;
    r->n_ctrl += dm->n_ctrl;
    return TS_OK;
}

/* The activation a unary node applies, as an f32 chunk function exists for. */
static int act_ok(const ts_node *a) {
    return a->n_in == 1 && a->n_out == 1 && ts_unary_chunk_f32(a->op, &a->a) != NULL;
}

/* The node that alone reads layer_norm_bwd node bi's input gradient dh (f32, not observable),
 * live and not yet fused; -1 if there is none. */
static int32_t sole_reader_of_dh(const nctx *c, int32_t bi) {
    const ts_graph *g = c->g;
    const int32_t dh = g->nodes[bi].out[0];
    const ts_value *dv = &g->values[dh];
    if (c->uses[dh] != 1 || dv->is_output || dv->grad_of >= 0 || !f32_of(g, dh)) return -1;
    const int32_t ri = c->first_read[dh];
    return g->nodes[ri].dead || c->root_of[ri] >= 0 ? -1 : ri;
}

/* Whether node ri's work may move to node bi's earlier slot: its other operand v is ready
 * there and ri waits for nothing after it. */
static int movable_to(const ts_graph *g, int32_t ri, int32_t v, int32_t bi) {
    if (g->values[v].kind == TS_VK_NODE && g->values[v].node >= bi) return 0;
    const ts_node *r = &g->nodes[ri];
    for (int j = 0; j < r->n_ctrl; j++)
        if (r->ctrl[j] >= bi) return 0;
    return 1;
}

/* Node b's inputs with v inserted at position at. */
static ts_status insert_input(ts_node *b, int at, int32_t v) {
    int32_t *ni = ts_alloc(sizeof(int32_t) * (size_t)(b->n_in + 1), "fuse");
    if (!ni) return TS_ERR_NOMEM;
    memcpy(ni, b->in, sizeof(int32_t) * (size_t)at);
    ni[at] = v;
    memcpy(ni + at + 1, b->in + at, sizeof(int32_t) * (size_t)(b->n_in - at));
    free(b->in);
    b->in = ni;
    b->n_in++;
    return TS_OK;
}

/* Value v (the absorbed reader's result) becomes node bi's output 0. */
static void take_output0(ts_graph *g, int32_t bi, int32_t v) {
    g->nodes[bi].out[0] = v;
    g->values[v].node = bi;
    g->values[v].out_index = 0;
}

/* layer_norm node li whose input is an activation's output. */
static ts_status fuse_forward(nctx *c, int32_t li, int *fused) {
    ts_graph *g = c->g;
    ts_node *l = &g->nodes[li];
    const int32_t h = l->in[0];
    if (g->values[h].kind != TS_VK_NODE || !f32_of(g, h) || !f32_of(g, l->out[0])) return TS_OK;
    const int32_t ai = g->values[h].node;
    const ts_node *a = &g->nodes[ai];
    if (a->dead || c->root_of[ai] >= 0 || !act_ok(a) || !f32_of(g, a->in[0])) return TS_OK;
    /* h moves to li's slot: nothing before li may read it or wait for ai */
    if (c->first_read[h] < li || c->first_wait[ai] < li) return TS_OK;
    for (int j = 1; j < l->n_in; j++)
        if (!f32_of(g, l->in[j])) return TS_OK;
    ts_attrs at = ts_attrs_zero();
    at.norm_act.norm = l->a.norm;
    at.norm_act.act = a->op;
    at.norm_act.fwd = a->a.unary;
    l->in[0] = a->in[0];
    l->op = TS_OP_ACT_LAYER_NORM;
    l->a = at;
    for (int k = l->n_out; k > 0; k--) {
        l->out[k] = l->out[k - 1];
        g->values[l->out[k]].out_index = k;
    }
    l->n_out++;
    take_output0(g, li, h);
    *fused += 1;
    return absorb(c, ai, li);
}

/* layer_norm_bwd node bi whose input gradient only an activation's
 * backward reads. */
static ts_status fuse_backward(nctx *c, int32_t bi, int *fused) {
    ts_graph *g = c->g;
    ts_node *b = &g->nodes[bi];
    const int32_t dh = b->out[0];
    const ts_value *dv = &g->values[dh];
    const int32_t ui = sole_reader_of_dh(c, bi);
    if (ui < 0) return TS_OK;
    const ts_node *u = &g->nodes[ui];
    if (u->op != TS_OP_UNARY_BWD || u->n_in != 2 || u->in[0] != dh || u->in[1] == dh ||
        !f32_of(g, u->out[0]) || !ts_type_equal(&g->values[u->out[0]].t, &dv->t))
        return TS_OK;
    ts_attrs fa;
    if (!ts_unary_bwd_chunk_f32(&u->a, &fa)) return TS_OK;
    /* u's work moves to bi's slot */
    const int32_t s = u->in[1];
    if (!movable_to(g, ui, s, bi) || !ts_type_equal(&g->values[s].t, &dv->t)) return TS_OK;
    ts_status st = insert_input(b, b->n_in, s);
    if (st != TS_OK) return st;
    ts_attrs at = ts_attrs_zero();
    at.norm_act.norm = b->a.norm;
    at.norm_act.act = u->a.unary_bwd.fwd_op;
    at.norm_act.side = u->a.unary_bwd.side;
    at.norm_act.fwd = u->a.unary_bwd.fwd;
    b->op = TS_OP_LAYER_NORM_ACT_BWD;
    b->a = at;
    take_output0(g, bi, u->out[0]);
    *fused += 1;
    return absorb(c, ui, bi);
}

/* layer_norm_bwd node bi whose input gradient only an add of another
 * gradient of its type reads (a pre-norm transformer's residual stream:
 * each block's norm adds its input gradient to the stream's). The add's
 * output becomes bi's output 0, written over r where the plan allows. */
static ts_status fuse_accumulate(nctx *c, int32_t bi, int *fused) {
    ts_graph *g = c->g;
    ts_node *b = &g->nodes[bi];
    const int32_t dh = b->out[0];
    const ts_value *dv = &g->values[dh];
    const int32_t ai = sole_reader_of_dh(c, bi);
    if (ai < 0) return TS_OK;
    const ts_node *a = &g->nodes[ai];
    if (a->op != TS_OP_ADD || a->n_in != 2 || (a->in[0] == dh) == (a->in[1] == dh)) return TS_OK;
    /* no broadcast: r, dh and the sum of one type */
    const int32_t r = a->in[0] == dh ? a->in[1] : a->in[0];
    if (!ts_type_equal(&g->values[r].t, &dv->t) || !ts_type_equal(&g->values[a->out[0]].t, &dv->t))
        return TS_OK;
    /* nor one of the norm's operands: written over in place, dy and x would
     * change under the dw/db partials, which read them after dx */
    for (int j = 0; j < b->n_in; j++)
        if (b->in[j] == r) return TS_OK;
    /* the add's work moves to bi's slot */
    if (!movable_to(g, ai, r, bi)) return TS_OK;
    ts_status st = insert_input(b, 0, r);
    if (st != TS_OK) return st;
    b->op = TS_OP_LAYER_NORM_BWD_ACC;
    take_output0(g, bi, a->out[0]);
    *fused += 1;
    return absorb(c, ai, bi);
}

ts_status ts_fuse_norm(ts_graph *g, int32_t *root_of, int *pairs) {
    nctx c = {.g = g, .root_of = root_of};
    ts_status s = TS_OK;
    c.uses = ts_alloc(sizeof(int) * (size_t)(g->n_values + 1), "fuse");
    c.first_read = ts_alloc(sizeof(int32_t) * (size_t)(g->n_values + 1), "fuse");
    c.first_wait = ts_alloc(sizeof(int32_t) * (size_t)(g->n_nodes + 1), "fuse");
    *pairs = 0;
    if (!c.uses || !c.first_read || !c.first_wait) {
        s = TS_ERR_NOMEM;
        goto done;
    }
    scan(&c);
    /* Forward pairs first, then the scan again: a fused forward moved h. */
    for (int i = 0; i < g->n_nodes && s == TS_OK; i++)
        if (!g->nodes[i].dead && g->nodes[i].op == TS_OP_LAYER_NORM) s = fuse_forward(&c, i, pairs);
    if (s == TS_OK) scan(&c);
    for (int i = 0; i < g->n_nodes && s == TS_OK; i++)
        if (!g->nodes[i].dead && g->nodes[i].op == TS_OP_LAYER_NORM_BWD)
            s = fuse_backward(&c, i, pairs);
    /* the norms whose input gradient no activation's backward took */
    if (s == TS_OK) scan(&c);
    for (int i = 0; i < g->n_nodes && s == TS_OK; i++)
        if (!g->nodes[i].dead && g->nodes[i].op == TS_OP_LAYER_NORM_BWD)
            s = fuse_accumulate(&c, i, pairs);
done:
    free(c.uses);
    free(c.first_read);
    free(c.first_wait);
    return s;
}
