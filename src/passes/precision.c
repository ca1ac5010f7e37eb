/* The precision pass: an autocast policy applied to the training graph
 * after autodiff and the train pass, so the forward and the backward GEMMs
 * are both covered.
 *
 * Runs after fusion, so a GEMM with a bias / residual epilogue
 * (matmul_epi) is lowered like a plain one and keeps its epilogue: the
 * post-ops and their operands stay f32, applied to the f32 accumulator.
 *
 * Policy: every f32 matmul, matmul_epi and convolution (conv, conv_bwd_data,
 * conv_bwd_weight, conv_transpose) whose op is not listed in keep_fp32
 * reads its two tensor operands cast to the compute type (bf16 or f16) and
 * accumulates and writes f32 (matmul.low = 1, conv.low = 1;
 * oneDNN bf16 x bf16 -> f32); a conv's bias stays f32. In bf16 the fused
 * attention's block products round their operands to bf16 inside the
 * kernel (attention.low; its tensors and softmax stay f32; lower_attention),
 * and a GELU, layer norm, permute or cross-entropy backward whose f32 output
 * only its bf16 cast reads writes bf16 itself (out_low; fold_casts), and
 * a sum over the leading axes of a value that a bf16 cast also reads (a
 * bias gradient) writes that cast as its second output (fold_sum_casts);
 * when that value is a GELU backward's that nothing else reads, the sum
 * computes the GELU backward itself and it is never stored (fold_bwd_sums).
 * Reductions, norms, softmax, losses and the optimizer are untouched and
 * stay f32, and so do the master weights, gradients and optimizer state:
 * a weight is cast on its way into a GEMM, never stored low.
 *
 * One cast per (value, type): a weight read by the forward GEMM and by
 * the backward data GEMM, or an activation read by the forward GEMM and
 * the weight-gradient GEMM, is converted once and shared. Reshapes are
 * looked through: an operand that is a reshape (a view) of a value is read
 * as the same reshape of that value's cast, so a gradient read as [B,T,C]
 * by the data GEMM and as [B*T,C] by the weight GEMM is converted once
 * (the bits are the same: a cast is elementwise). A value that autodiff
 * recomputes for the backward pass (a layer norm, GELU or attention
 * permute feeding a weight-gradient GEMM, passes/autodiff.c) is the same
 * op on the same inputs as its forward original, so the same bits: the
 * weight-gradient GEMM reads the forward GEMM's cast of the original, kept
 * alive (at half the f32 size), and the recompute and its cast go. The cast is
 * placed right before its first reader (nodes are renumbered to keep the
 * graph in topological order), and every in-place update of the source
 * (the optimizer) is ordered after it, so the cast sees the old weights. */
#include <stdlib.h>
#include <string.h>
#include "passes.h"

/* Op names in a comma-separated list (spaces allowed). */
static int listed(const char *list, const char *name) {
    if (!list) return 0;
    size_t n = strlen(name);
    for (const char *p = list; *p;) {
        while (*p == ' ' || *p == ',') p++;
        const char *e = p;
        while (*e && *e != ',' && *e != ' ') e++;
        if ((size_t)(e - p) == n && strncmp(p, name, n) == 0) return 1;
        p = e;
    }
    return 0;
}

ts_status ts_precision_check(const ts_precision_options *o) {
    if (o->compute != TS_F32 && o->compute != TS_BF16 && o->compute != TS_F16)
        return ts_fail(TS_ERR_INVALID, "precision: compute type must be f32, bf16 or f16, got %s",
                       ts_dtype_name(o->compute));
    for (const char *p = o->keep_fp32; p && *p;) {
        while (*p == ' ' || *p == ',') p++;
        const char *e = p;
        while (*e && *e != ',' && *e != ' ') e++;
        if (e > p) {
            char name[64];
            snprintf(name, sizeof name, "%.*s", (int)(e - p), p);
            if (ts_op_find(name) < 0)
                return ts_fail(TS_ERR_INVALID, "precision.keep_fp32: '%s' is not an op name", name);
        }
        p = e;
    }
    return TS_OK;
}

/* The attribute that marks node n's op as mixed precision (operands 0 and
 * 1 low, f32 accumulation and output), or NULL for an op outside the policy. */
static int64_t *low_flag(ts_node *n) {
    switch (n->op) {
    case TS_OP_MATMUL: return &n->a.matmul.low;
    case TS_OP_MATMUL_EPI: return &n->a.matmul_epi.low; /* its post-ops stay f32 */
    case TS_OP_CONV:
    case TS_OP_CONV_BWD_DATA:
    case TS_OP_CONV_BWD_WEIGHT:
    case TS_OP_CONV_TRANSPOSE: return &n->a.conv.low;
    default: return NULL;
    }
}

/* Does node n take part in the policy? */
static int lowers(const ts_graph *g, const ts_node *n, const ts_precision_options *o) {
    const int64_t *f = low_flag((ts_node *)n);
    if (n->dead || !f || *f) return 0;
    if (listed(o->keep_fp32, ts_op_get(n->op)->name)) return 0;
    /* a fused GEMM is still a matmul to the user: keep_fp32: [matmul] keeps it */
    if (n->op == TS_OP_MATMUL_EPI && listed(o->keep_fp32, "matmul")) return 0;
    return ts_in_type(g, n, 0)->dtype == TS_F32 && ts_in_type(g, n, 1)->dtype == TS_F32;
}

int ts_precision_lowers_matmul(const ts_graph *g, const ts_precision_options *o) {
    if (!g || !o || o->compute == TS_F32) return 0;
    for (int i = 0; i < g->n_nodes; i++) {
        const ts_node *n = &g->nodes[i];
        if ((n->op == TS_OP_MATMUL || n->op == TS_OP_MATMUL_EPI) && lowers(g, n, o)) return 1;
    }
    return 0;
}

/* The value v is a view of: follow reshapes back to the value they view. */
static int32_t view_root(const ts_graph *g, int32_t v) {
    for (;;) {
        const ts_value *val = &g->values[v];
        if (val->kind != TS_VK_NODE || val->node < 0) return v;
        const ts_node *p = &g->nodes[val->node];
        if (p->dead || p->op != TS_OP_RESHAPE) return v;
        v = p->in[0];
    }
}

/* When v is an output of autodiff's recomputed copy of a forward node (the same op, inputs and
 * attributes, so the same bits), that forward node's output; else -1. */
static int32_t recomputed_from(const ts_graph *g, int32_t v) {
    const ts_value *val = &g->values[v];
    if (val->kind != TS_VK_NODE || val->node < 0) return -1;
    const ts_node *r = &g->nodes[val->node];
    if (r->dead || !r->recompute) return -1;
    for (int i = 0; i < val->node; i++) {
        const ts_node *q = &g->nodes[i];
        if (q->dead || q->recompute || q->op != r->op || q->n_in != r->n_in ||
            q->n_out != r->n_out || memcmp(q->in, r->in, sizeof *r->in * (size_t)r->n_in) ||
            memcmp(&q->a, &r->a, sizeof q->a))
            continue;
        return q->out[val->out_index];
    }
    return -1;
}

/* The pass replaced the GEMMs' reads of the values seed[0..n) (with their cast, or a view of it):
 * (seed has room for cap) mark dead every node that, as a result, nothing reads (a reshape the GEMM
 * read, a recomputed layer norm or GELU), and what only it read, recursively. Side-effect nodes and
 * outputs stay. */
static void drop_unread(ts_graph *g, int32_t *seed, int n, int cap) {
    int32_t *readers = calloc((size_t)g->n_values, sizeof *readers);
    if (!readers) return; /* they stay: correct, only slower */
    for (int i = 0; i < g->n_nodes; i++)
        if (!g->nodes[i].dead)
            for (int j = 0; j < g->nodes[i].n_in; j++) readers[g->nodes[i].in[j]]++;
    while (n > 0) { /* seed[] is the work list: each node is marked dead once */
        const ts_value *val = &g->values[seed[--n]];
        if (val->kind != TS_VK_NODE || val->node < 0) continue;
        ts_node *p = &g->nodes[val->node];
        if (p->dead || (ts_op_get(p->op)->flags & TS_OPF_SIDE_EFFECT)) continue;
        int read = 0;
        for (int k = 0; k < p->n_out; k++)
            read += readers[p->out[k]] > 0 || g->values[p->out[k]].is_output ||
                    g->values[p->out[k]].grad_of >= 0; /* ts_plan_read_grad reads those */
        if (read) continue;
        p->dead = 1;
        for (int j = 0; j < p->n_in; j++)
            if (--readers[p->in[j]] == 0 && n < cap) seed[n++] = p->in[j];
    }
    free(readers);
}

/* bf16 attention: the fused attention and its backward run their block products on bf16
 * operands with f32 accumulation (attention.low); the softmax, its statistics and every tensor
 * stay f32, so no cast is added. fp16 keeps f32 attention (unscaled scores and their
 * gradients would leave its range). keep_fp32: [attention] keeps both ops f32. */
static void lower_attention(ts_graph *g, const ts_precision_options *o) {
    if (o->compute != TS_BF16 || listed(o->keep_fp32, "attention")) return;
    for (int i = 0; i < g->n_nodes; i++) {
        ts_node *n = &g->nodes[i];
        const int q = n->op == TS_OP_ATTENTION ? 0 : n->op == TS_OP_ATTENTION_BWD ? 1 : -1;
        if (n->dead || q < 0 || listed(o->keep_fp32, ts_op_get(n->op)->name)) continue;
        if (ts_in_type(g, n, q)->dtype == TS_F32) n->a.attention.low = 1;
    }
}

/* The flag that makes producer p write its output out_index rounded to bf16 itself, for the ops
 * whose kernels have that form (the same bits as the f32 output plus the cast: each computes
 * its f32 result and rounds it as the cast op does), or NULL. */
static int64_t *out_low_flag(ts_node *p, int out_index) {
    if (out_index != 0) return NULL; /* layer_norm's mean and rstd stay f32 */
    switch (p->op) {
    case TS_OP_GELU: return &p->a.unary.out_low;
    case TS_OP_LAYER_NORM: return &p->a.norm.out_low;
    case TS_OP_PERMUTE: return &p->a.permute.out_low;
    case TS_OP_CROSS_ENTROPY_BWD: return &p->a.cross_entropy.out_low;
    default: return NULL;
    }
}

/* A bf16 cast of an f32 value that nothing else reads, made by a GELU, a layer norm (in bf16
 * plans the weight-gradient GEMM reads the forward GEMM's cast, see "Recomputes" above), a
 * permute (the attention output's) or the cross-entropy backward: the producer writes the
 * rounded result itself (out_low, the same bits) and the cast goes, one pass over the tensor
 * instead of two and half the bytes written. Returns how many casts went (marked dead). */
static int fold_casts(ts_graph *g) {
    int32_t *readers = calloc((size_t)g->n_values, sizeof *readers);
    if (!readers) return 0; /* the casts stay: correct, only slower */
    for (int i = 0; i < g->n_nodes; i++)
        if (!g->nodes[i].dead)
            for (int j = 0; j < g->nodes[i].n_in; j++) readers[g->nodes[i].in[j]]++;
    int folded = 0;
    for (int i = 0; i < g->n_nodes; i++) {
        ts_node *c = &g->nodes[i];
        if (c->dead || c->op != TS_OP_CAST || c->a.cast.dtype != TS_BF16) continue;
        const int32_t v = c->in[0], w = c->out[0];
        const ts_value *vv = &g->values[v], *wv = &g->values[w];
        if (vv->kind != TS_VK_NODE || vv->node < 0 || readers[v] != 1 || vv->is_output ||
            vv->grad_of >= 0 || wv->is_output || wv->grad_of >= 0)
            continue;
        int ordered = 0; /* a control edge names the cast (the optimizer's, of a weight) */
        for (int u = 0; u < g->n_nodes && !ordered; u++)
            for (int j = 0; j < g->nodes[u].n_ctrl; j++) ordered |= g->nodes[u].ctrl[j] == i;
        ts_node *p = &g->nodes[vv->node];
        int64_t *flag = out_low_flag(p, vv->out_index);
        if (ordered || p->dead || !flag || *flag || vv->t.dtype != TS_F32) continue;
        *flag = 1;
        g->values[v].t.dtype = TS_BF16;
        for (int u = 0; u < g->n_nodes; u++)
            for (int j = 0; j < g->nodes[u].n_in; j++)
                if (g->nodes[u].in[j] == w) g->nodes[u].in[j] = v;
        c->dead = 1;
        folded++;
    }
    free(readers);
    return folded;
}

/* Whether node s is a live sum over the leading axes of its input (a [red, inner] column
 * sum, such as a bias gradient) that does not yet write a cast of it: what fold_sum_casts
 * can give a cast to. */
static int leading_axes_sum(const ts_graph *g, const ts_node *s) {
    if (s->dead || s->op != TS_OP_REDUCE_SUM || s->n_out != 1 || s->a.reduce.out_low) return 0;
    const int64_t m = s->a.reduce.axes;
    const int rank = g->values[s->in[0]].t.rank;
    return m > 0 && m < ((int64_t)1 << rank) - 1 && (m & (m + 1)) == 0;
}

/* A sum over the leading axes of the [B, T, C] view of value v (the packed attention's
 * gradient dqkv [B, T, 3, H, hd], passes/attention_qkv.c); node index or -1. */
static int sum_of_view(const ts_graph *g, int32_t v, int before) {
    for (int u = 0; u < before; u++) {
        const ts_node *s = &g->nodes[u];
        if (s->n_in != 1 || !leading_axes_sum(g, s)) continue;
        const ts_value *r = &g->values[s->in[0]];
        if (r->kind == TS_VK_NODE && r->node >= 0 && g->nodes[r->node].op == TS_OP_RESHAPE &&
            g->nodes[r->node].in[0] == v)
            return u;
    }
    return -1;
}

/* Cast node i of v, read only through reshapes (the GEMMs' views of it), casts the view
 * that sum_of_view found instead, so fold_sum_casts can give it to that sum: the same
 * bytes, another shape. */
static int cast_the_summed_view(ts_graph *g, int i) {
    const int32_t v = g->nodes[i].in[0], w = g->nodes[i].out[0];
    const int sum = sum_of_view(g, v, i);
    if (sum < 0) return -1;
    for (int u = 0; u < g->n_nodes; u++) {
        const ts_node *r = &g->nodes[u];
        if (r->dead) continue;
        for (int j = 0; j < r->n_in; j++)
            if (r->in[j] == w && r->op != TS_OP_RESHAPE) return -1;
    }
    const int32_t view = g->nodes[sum].in[0];
    g->nodes[i].in[0] = view;
    g->values[w].t.rank = g->values[view].t.rank;
    memcpy(g->values[w].t.dims, g->values[view].t.dims, sizeof g->values[w].t.dims);
    return sum;
}

/* A bf16 cast of an f32 value that a sum over its leading axes also reads (a bias gradient,
 * which the data and weight GEMMs read in bf16): the sum writes the cast as its second output
 * (reduce.out_low) in the same pass over the value, and the cast goes: one read of the f32
 * gradient instead of two, the same bits. Only where the sum comes before the cast (its
 * readers then come after the sum) and no control edge names the cast. Returns how many casts
 * went (marked dead). */
static int fold_sum_casts(ts_graph *g) {
    int folded = 0;
    for (int i = 0; i < g->n_nodes; i++) {
        ts_node *c = &g->nodes[i];
        if (c->dead || c->op != TS_OP_CAST || c->a.cast.dtype != TS_BF16 || c->n_ctrl) continue;
        const int32_t v = c->in[0], w = c->out[0];
        const ts_value *wv = &g->values[w];
        if (g->values[v].t.dtype != TS_F32 || wv->is_output || wv->grad_of >= 0) continue;
        int sum = -1, ordered = 0;
        for (int u = 0; u < g->n_nodes && !ordered; u++) {
            const ts_node *s = &g->nodes[u];
            for (int j = 0; j < s->n_ctrl; j++) ordered |= s->ctrl[j] == i;
            if (sum < 0 && u < i && leading_axes_sum(g, s) && s->in[0] == v) sum = u;
        }
        if (!ordered && sum < 0) sum = cast_the_summed_view(g, i);
        if (ordered || sum < 0) continue;
        if (ts_node_append_output(g, sum, w) != TS_OK) break; /* the cast stays: only slower */
        g->nodes[sum].a.reduce.out_low = 1;
        c->dead = 1;
        folded++;
    }
    return folded;
}

/* A sum writing its input's cast (fold_sum_casts) whose input only it reads, made by a
 * unary_bwd (a GELU's backward) that nothing waits for: the sum reads the unary_bwd's two
 * inputs and computes the gradient itself a row piece at a time (reduce.bwd, ops/reduce.c),
 * and the unary_bwd goes, so the f32 gradient is never stored: one pass instead of two, the
 * same bits. Returns how many unary_bwd nodes went. */
static int fold_bwd_sums(ts_graph *g) {
    int32_t *readers = calloc((size_t)g->n_values, sizeof *readers);
    char *waited = calloc((size_t)g->n_nodes + 1, 1);
    if (!readers || !waited) { /* the unary_bwd nodes stay: correct, only slower */
        free(readers);
        free(waited);
        return 0;
    }
    for (int i = 0; i < g->n_nodes; i++) {
        if (g->nodes[i].dead) continue;
        for (int j = 0; j < g->nodes[i].n_in; j++) readers[g->nodes[i].in[j]]++;
        for (int j = 0; j < g->nodes[i].n_ctrl; j++) waited[g->nodes[i].ctrl[j]] = 1;
    }
    int folded = 0;
    for (int i = 0; i < g->n_nodes; i++) {
        ts_node *s = &g->nodes[i];
        if (s->dead || s->op != TS_OP_REDUCE_SUM || s->a.reduce.out_low != 1 || s->n_in != 1)
            continue;
        const int32_t v = s->in[0];
        const ts_value *vv = &g->values[v];
        if (vv->kind != TS_VK_NODE || vv->node < 0 || vv->node >= i || readers[v] != 1 ||
            vv->is_output || vv->grad_of >= 0)
            continue;
        ts_node *u = &g->nodes[vv->node];
        if (u->dead || u->op != TS_OP_UNARY_BWD || u->n_in != 2 || u->n_ctrl || waited[vv->node] ||
            !ts_type_equal(&g->values[u->in[0]].t, &vv->t) ||
            !ts_type_equal(&g->values[u->in[1]].t, &vv->t))
            continue;
        int64_t inner = 1; /* a one-column sum is summed in blocks (ops/reduce.c): other bits */
        for (int d = 0; d < vv->t.rank; d++)
            if (!(s->a.reduce.axes >> d & 1)) inner *= vv->t.dims[d];
        const int64_t m = s->a.reduce.axes;
        if (inner < 2 || (m & (m + 1)) != 0) continue;
        int32_t *in = ts_alloc(sizeof(int32_t) * 2, "precision");
        if (!in) break;
        in[0] = u->in[0], in[1] = u->in[1];
        free(s->in);
        s->in = in;
        s->n_in = 2;
        s->a.reduce.bwd = u->a.unary_bwd;
        u->dead = 1; /* v, produced by no live node now, goes with the compaction */
        folded++;
    }
    free(waited);
    free(readers);
    return folded;
}

ts_status ts_pass_precision(ts_graph *g, const ts_precision_options *o, int low_kernels,
                            int *n_cast) {
    if (n_cast) *n_cast = 0;
    ts_status s = ts_precision_check(o);
    if (s != TS_OK || o->compute == TS_F32) return s;
    if (low_kernels) lower_attention(g, o);
    const int n0 = g->n_nodes, nv0 = g->n_values;
    int todo = 0;
    for (int i = 0; i < n0; i++) todo += lowers(g, &g->nodes[i], o);
    if (!todo) return TS_OK;
    /* cast_of[v]: the cast of value v; low_of[v]: what a lowered GEMM reads for operand v (its
     * cast, or a reshape of its root's cast). Each lowered node adds at most 2 casts and 2
     * reshapes. */
    int32_t *cast_of = ts_alloc(sizeof(int32_t) * (size_t)nv0 * 2, "precision");
    int32_t *perm = ts_alloc(sizeof(int32_t) * (size_t)(n0 + 4 * todo + 1), "precision");
    if (!cast_of || !perm) {
        free(cast_of);
        free(perm);
        return TS_ERR_NOMEM;
    }
    int32_t *low_of = cast_of + nv0;
    /* the values the GEMMs read before, then drop_unread's work list */
    int32_t *seed = ts_alloc(sizeof(int32_t) * ((size_t)nv0 + 2 * (size_t)todo + 1), "precision");
    int n_seed = 0;
    if (!seed) {
        free(cast_of);
        free(perm);
        return TS_ERR_NOMEM;
    }
    for (int v = 0; v < 2 * nv0; v++) cast_of[v] = -1;
    int np = 0, casts = 0;
    ts_attrs ca = ts_attrs_zero();
    ca.cast.dtype = o->compute;
    for (int i = 0; i < n0 && s == TS_OK; i++) {
        if (!lowers(g, &g->nodes[i], o)) {
            perm[np++] = i;
            continue;
        }
        for (int j = 0; j < 2 && s == TS_OK; j++) {
            const int32_t op_v = g->nodes[i].in[j], v = view_root(g, op_v);
            seed[n_seed++] = op_v;
            if (low_of[op_v] >= 0) {
                g->nodes[i].in[j] = low_of[op_v];
                continue;
            }
            if (cast_of[v] < 0) {
                const int32_t u = recomputed_from(g, v);
                if (u >= 0 && u < nv0 && cast_of[u] >= 0) cast_of[v] = cast_of[u];
            }
            if (cast_of[v] < 0) {
                ts_val c = ts_node_add(g, TS_OP_CAST, 1, (ts_val[]){ts_mkval(v)}, &ca, NULL);
                if ((s = ts_graph_status(g)) != TS_OK) break;
                cast_of[v] = c.id;
                perm[np++] = g->n_nodes - 1;
                casts++;
                /* In-place writers of v (the optimizer update) run after the cast. */
                for (int u = 0; u < n0 && s == TS_OK; u++) {
                    const ts_node *w = &g->nodes[u];
                    if (w->dead || !(ts_op_get(w->op)->flags & TS_OPF_SIDE_EFFECT)) continue;
                    for (int q = 0; q < w->n_in; q++)
                        if (w->in[q] == v) {
                            s = ts_node_add_ctrl(g, u, g->n_nodes - 1);
                            break;
                        }
                }
            }
            if (s != TS_OK) break;
            low_of[op_v] = cast_of[v];
            if (op_v != v) { /* the operand's shape, as a view of the root's cast */
                const ts_type *t = &g->values[op_v].t;
                const int nn = g->n_nodes;
                ts_val r = ts_reshape(g, ts_mkval(cast_of[v]), t->rank, t->dims);
                if ((s = ts_graph_status(g)) != TS_OK) break;
                if (g->n_nodes > nn) perm[np++] = g->n_nodes - 1;
                low_of[op_v] = r.id;
            }
            g->nodes[i].in[j] = low_of[op_v];
        }
        *low_flag(&g->nodes[i]) = 1; /* f32 accumulation and output */
        perm[np++] = i;
    }
    if (s == TS_OK && np != g->n_nodes)
        s = ts_fail(TS_ERR_INTERNAL, "precision pass: %d of %d nodes ordered", np, g->n_nodes);
    if (s == TS_OK) s = ts_graph_permute_nodes(g, perm, np);
    if (s == TS_OK)
        drop_unread(g, seed, n_seed, nv0 + 2 * todo + 1); /* the caller compacts the graph */
    if (s == TS_OK && low_kernels) {
        casts -= fold_casts(g) + fold_sum_casts(g);
        fold_bwd_sums(g);
    }
    free(seed);
    free(cast_of);
    free(perm);
    if (s == TS_OK && n_cast) *n_cast = casts;
    return s;
}
