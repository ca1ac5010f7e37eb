/* attn_bwd_low: the packed attention backward writes its gradient in bf16 with the qkv bias
 * gradient, instead of a sum reading it back.
 *
 * In a bf16 plan the packed attention_bwd (attention_qkv.c, with attention.low) writes dqkv
 * [B, T, 3, H, hd] in f32, and the precision pass's sum-cast fold (precision.c,
 * fold_sum_casts / cast_the_summed_view) makes a sum over the [B, T, 3 * H * hd] view of it
 * write the qkv bias gradient (its column sums) and the bf16 copy that the qkv projection's
 * data and weight GEMMs read:
 *
 *     dqkv f32 = attention_bwd(do, qkv, o, lse)          low=1
 *     v = reshape(dqkv) [B, T, 3*H*hd]
 *     (db [1, 1, 3*H*hd], c bf16 [B, T, 3*H*hd]) = sum(v) axes: the leading ones, out_low=1
 *
 * Where the sum is the view's only reader and the view dqkv's only one, it becomes
 *
 *     (dqkv bf16, db) = attention_bwd(do, qkv, o, lse)      low=1 out_low=1 sums_rank=3
 *     v = reshape(dqkv) bf16 [B, T, 3*H*hd]                  (c's readers read v)
 *
 * (ops/attention_bwd_low.c): the f32 gradient is never stored, the kernel rounds each head's
 * gradients from its scratch. The bf16 copy has the same bits; the column sums add each
 * batch row's T positions, then the B partials, in double: they may differ from the sum's
 * row-order double in the last bit of rare columns (see there). Runs after the precision pass
 * on backends that run the op table's kernels (ts_pass_ctx.low_kernels_ok); the sum is
 * marked dead: the caller compacts the graph. The sums take the sum's output value db itself
 * (sums_rank keeps its keepdim shape), so no value or view is added: the plan's value ids
 * keep a view's source numbered before the view, as the schedule and memory plan expect. */
#include "passes.h"

/* The only live reader of value v, or -1 (none, several, or v is kept or a gradient). */
static int sole_reader(const ts_graph *g, int32_t v) {
    const ts_value *val = &g->values[v];
    if (val->is_output || val->grad_of >= 0) return -1;
    int r = -1;
    return ts_value_reads(g, v, &r) == 1 ? r : -1;
}

/* Node i has control edges, or a control edge names it (it goes: keep such a sum). */
static int waited(const ts_graph *g, int i) {
    if (g->nodes[i].n_ctrl) return 1;
    for (int u = 0; u < g->n_nodes; u++)
        for (int j = 0; j < g->nodes[u].n_ctrl; j++)
            if (g->nodes[u].ctrl[j] == i) return 1;
    return 0;
}

/* Node s is a sum with out_low (scale 1) over the leading axes of its input x, leaving
 * `inner` columns, that sum exactly `rows` rows. */
static int bias_sum(const ts_graph *g, const ts_node *s, int64_t rows, int64_t inner) {
    if (s->op != TS_OP_REDUCE_SUM || s->n_in != 1 || s->n_out != 2 || s->a.reduce.out_low != 1 ||
        s->a.reduce.scale != 1.0)
        return 0;
    const ts_type *x = &g->values[s->in[0]].t;
    const int64_t m = s->a.reduce.axes;
    if (m <= 0 || (m & (m + 1)) != 0 || m >> x->rank) return 0;
    int64_t red = 1, cols = 1;
    for (int d = 0; d < x->rank; d++) *(m >> d & 1 ? &red : &cols) *= x->dims[d];
    const ts_value *c = &g->values[s->out[1]];
    return red == rows && cols == inner && !c->is_output && c->grad_of < 0;
}

ts_status ts_pass_attn_bwd_low(ts_graph *g, int *n_rewritten) {
    int done = 0;
    for (int ai = 0; ai < g->n_nodes; ai++) {
        ts_node *a = &g->nodes[ai];
        if (a->dead || a->op != TS_OP_ATTENTION_BWD || a->n_in != 4 || a->n_out != 1 ||
            !a->a.attention.low || a->a.attention.out_low)
            continue;
        const ts_type q = g->values[a->in[1]].t; /* qkv [B, T, 3, H, hd] */
        if (q.rank != 5 || q.dtype != TS_F32) continue;
        const int32_t d = a->out[0];
        const int ri = sole_reader(g, d);
        if (ri < 0 || g->nodes[ri].op != TS_OP_RESHAPE) continue;
        const int32_t view = g->nodes[ri].out[0];
        const int si = sole_reader(g, view);
        const int64_t cols = 3 * q.dims[3] * q.dims[4];
        if (si < 0 || !bias_sum(g, &g->nodes[si], q.dims[0] * q.dims[1], cols) || waited(g, si))
            continue;
        /* db, the sums [3*H*hd] or with leading 1s (keepdim): attention_bwd's output 1 */
        const int32_t copy = g->nodes[si].out[1], db = g->nodes[si].out[0];
        const ts_type *dt = &g->values[db].t;
        int ones = dt->dtype == TS_F32 && dt->rank >= 1 && dt->dims[dt->rank - 1] == cols;
        for (int k = 0; k + 1 < dt->rank; k++) ones &= dt->dims[k] == 1;
        if (!ones) continue;
        ts_status s = ts_node_append_output(g, ai, db);
        if (s != TS_OK) return s;
        g->nodes[ai].a.attention.out_low = 1;
        g->nodes[ai].a.attention.sums_rank = dt->rank;
        g->values[d].t.dtype = TS_BF16;
        g->values[view].t.dtype = TS_BF16;
        for (int u = 0; u < g->n_nodes; u++)
            for (int j = 0; j < g->nodes[u].n_in; j++)
                if (g->nodes[u].in[j] == copy) g->nodes[u].in[j] = view;
        g->nodes[si].dead = 1; /* copy goes with it in the compaction */
        done++;
    }
    if (n_rewritten) *n_rewritten = done;
    return TS_OK;
}
