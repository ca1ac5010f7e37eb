/* gelu_grad: a GELU's backward without its exp.
 *
 * The GELU backward (unary_bwd(d, x) with fwd_op gelu, or the bias-gradient sum that computes
 * it, reduce.bwd, precision.c's fold_bwd_sums) evaluates gelu'(x): an exp and a division per
 * element, the same exp and division the forward gelu(x) already paid for. Where the gelu is
 * the last reader of x before that backward, the gelu writes g = gelu'(x) as a second output
 * (unary.out_grad, ops/unary.c) and the backward reads g instead of x and only multiplies
 * d * g (side 2). x then dies at the gelu and g lives in its place.
 *
 * g has the gelu result's dtype. In an fp32 plan it is f32, the bits of the backward's own
 * evaluation: the same product, the same bits as without this pass, and memory neutral. In
 * a bf16 plan (the gelu's out_low) it is bf16, rounded once from that f32 value: dA * g then
 * differs from dA * gelu'(x) by g's rounding (relative 2^-9), as in PyTorch's autocast, whose
 * GELU backward runs on bf16 tensors (a bf16 result from bf16 inputs), and g takes half of
 * x's memory and is read at half the bytes.
 *
 * In an fp32 plan the gelu that qualifies is autodiff's recomputed copy (passes/autodiff.c,
 * which the backward reaches just before the unary_bwd); in a bf16 plan the precision pass
 * has removed that copy and the forward gelu qualifies. A gelu that another node reads x
 * after (besides the backward) is left alone, and so is one of a parameter or an input (or of
 * a value kept as an output): g would then live beside x.
 *
 * Runs after the precision pass (so the folded sums exist), on backends that run the op
 * table's kernels (ts_pass_ctx.low_kernels_ok): the CUDA backend has neither form. */
#include <stdlib.h>
#include "passes.h"

/* The backward attributes of node c when it is a GELU backward reading x as its saved input
 * (side 0), else NULL. */
static ts_unary_bwd_attrs *gelu_bwd_of(ts_node *c) {
    if (c->dead || c->n_in != 2 || c->in[0] == c->in[1]) return NULL;
    ts_unary_bwd_attrs *b = c->op == TS_OP_UNARY_BWD    ? &c->a.unary_bwd
                            : c->op == TS_OP_REDUCE_SUM ? &c->a.reduce.bwd /* folded */
                                                        : NULL;
    return b && b->fwd_op == TS_OP_GELU && b->side == 0 ? b : NULL;
}

/* The gelu that node ci (a GELU backward with attributes b, reading x) can take g from: a
 * live gelu of x with the same approximation that is the last node other than ci to read x,
 * before ci; -1 if none. */
static int gelu_for(const ts_graph *g, int ci, int32_t x, const ts_unary_bwd_attrs *b) {
    int last = -1;
    for (int u = 0; u < g->n_nodes; u++) {
        const ts_node *n = &g->nodes[u];
        if (u == ci || n->dead) continue;
        for (int j = 0; j < n->n_in; j++)
            if (n->in[j] == x) last = u;
    }
    if (last < 0 || last > ci) return -1;
    const ts_node *p = &g->nodes[last];
    if (p->op != TS_OP_GELU || p->n_out != 1 || p->a.unary.out_grad ||
        p->a.unary.approx != b->fwd.approx)
        return -1;
    return last;
}

ts_status ts_pass_gelu_grad(ts_graph *g, int *n_rewritten) {
    int done = 0;
    for (int ci = 0; ci < g->n_nodes; ci++) {
        ts_unary_bwd_attrs *b = gelu_bwd_of(&g->nodes[ci]);
        if (!b) continue;
        const int32_t x = g->nodes[ci].in[1];
        const ts_value *xv = &g->values[x];
        /* a parameter or input lives on anyway: g would only add memory */
        if (xv->kind != TS_VK_NODE || xv->t.dtype != TS_F32 || xv->is_output || xv->grad_of >= 0)
            continue;
        const int gi = gelu_for(g, ci, x, b);
        if (gi < 0) continue;
        /* g in the gelu result's dtype: bf16 where the precision pass made it bf16 (out_low) */
        ts_type t = xv->t;
        t.dtype = g->values[g->nodes[gi].out[0]].t.dtype;
        const int32_t v = ts_value_new(g, &t, TS_VK_NODE, NULL); /* g->values may move */
        if (v < 0) return ts_graph_status(g);
        ts_status s = ts_node_append_output(g, gi, v);
        if (s != TS_OK) return s;
        g->nodes[gi].a.unary.out_grad = 1;
        g->nodes[ci].in[1] = v;
        b->side = 2;
        done++;
    }
    if (n_rewritten) *n_rewritten = done;
    return TS_OK;
}
