/* chunk_ce: the cross-entropy backward and the input gradient of the
 * matmul that reads it, in row chunks, so the logits gradient is never
 * whole. Runs after simplify (the graph is final) and before fuse.
 *
 * A language model's head ends in logits [N, V] (W3: 2048 x 8192, 64 MiB);
 * the backward's first large value is their gradient, of the same size.
 * When the logits die at the cross-entropy backward, memplan lets it write
 * over them. When they are kept (an output read after the step, which is
 * what `tessel train` does), both are alive at once: in a LoRA run of W3
 * that is the peak of the step. Where the gradient's only reader is one
 * matmul dX = dlogits W (the head's weight is frozen, so no dW = dlogits^T x
 * reads it too), the pass replaces
 *
 *     d = cross_entropy_bwd(dl, logits, targets, lse)        [N, V]
 *     dx = matmul(d, W)                                       [N, D]
 *
 * by, for chunks of R rows (R x V about CHUNK_BYTES),
 *
 *     d_c = cross_entropy_bwd(dl, logits, targets, lse; rows c)   [R, V]
 *     dx_c = matmul(d_c, W)                                       [R, D]
 *     dx = reshape(concat(dx_0, dx_1, ...))
 *
 * which the scheduler runs chunk by chunk, reusing one R x V buffer. Each
 * row of d is computed by the same code from the same values (same bits);
 * each dx_c row is the same dot products over V, and the matmul kernels
 * reduce over K in an order that does not depend on M, so dx is the same
 * bits too (tests/unit/chunk_ce.c checks it against the unchunked plan on
 * W3's shape). With a trainable head (dW reads d as well) nothing changes:
 * dW summed over chunks would change the order of its sums. */
#include <stdlib.h>
#include <string.h>
#include "passes.h"

/* Bytes of one chunk of the logits gradient. */
enum { CHUNK_BYTES = 4 << 20, CHUNK_ALIGN = 64 };

typedef struct cctx {
    ts_graph *g;
    int *uses;       /* live nodes reading each value */
    int32_t *reader; /* the last live node reading it */
} cctx;

static int observable(const ts_value *v) {
    return v->is_output || v->grad_of >= 0;
}

/* Is v, or the value v is a view of, kept after the step? */
static int kept(const ts_graph *g, int32_t v) {
    for (;;) {
        const ts_value *val = &g->values[v];
        if (observable(val)) return 1;
        if (val->kind != TS_VK_NODE) return 0;
        const ts_node *p = &g->nodes[val->node];
        if (!(ts_op_get(p->op)->flags & TS_OPF_ALIAS)) return 0;
        v = p->in[0];
    }
}

/* (Re)counts the readers of every value; the arrays grow with the graph. */
static ts_status count_uses(cctx *c) {
    const ts_graph *g = c->g;
    free(c->uses);
    free(c->reader);
    c->uses = ts_alloc(sizeof(int) * (size_t)(g->n_values + 1), "chunk_ce");
    c->reader = ts_alloc(sizeof(int32_t) * (size_t)(g->n_values + 1), "chunk_ce");
    if (!c->uses || !c->reader) return TS_ERR_NOMEM;
    memset(c->uses, 0, sizeof(int) * (size_t)g->n_values);
    for (int i = 0; i < g->n_nodes; i++) {
        const ts_node *n = &g->nodes[i];
        if (n->dead) continue;
        for (int j = 0; j < n->n_in; j++) {
            c->uses[n->in[j]]++;
            c->reader[n->in[j]] = i;
        }
    }
    return TS_OK;
}

/* The matmul dX = d W reading cross_entropy_bwd node ci's output, through
 * reshape views read only once; -1 if the gradient has any other reader. */
static int32_t head_matmul(const cctx *c, int32_t ci, int32_t *views, int *n_views) {
    const ts_graph *g = c->g;
    int32_t v = g->nodes[ci].out[0];
    *n_views = 0;
    for (;;) {
        if (c->uses[v] != 1 || observable(&g->values[v])) return -1;
        const int32_t r = c->reader[v];
        const ts_node *rn = &g->nodes[r];
        if (rn->op == TS_OP_RESHAPE && *n_views < 8) {
            views[(*n_views)++] = r;
            v = rn->out[0];
            continue;
        }
        if (rn->op != TS_OP_MATMUL || rn->n_in != 2 || rn->in[0] != v || rn->in[1] == v ||
            rn->a.matmul.trans_a || ts_rank(g, ts_mkval(rn->in[1])) != 2)
            return -1;
        return r;
    }
}

/* Rows per chunk: a multiple of CHUNK_ALIGN with about CHUNK_BYTES. */
static int64_t chunk_rows(const ts_type *lg) {
    const int64_t row = lg->dims[1] * (int64_t)ts_dtype_size(lg->dtype);
    int64_t r = (int64_t)CHUNK_BYTES / (row > 0 ? row : 1);
    r = r / CHUNK_ALIGN * CHUNK_ALIGN;
    return r < CHUNK_ALIGN ? CHUNK_ALIGN : r;
}

/* Rewrites one (cross_entropy_bwd ci, matmul mi) pair; the new nodes are
 * appended (the caller orders them before mi). Returns the final reshape's
 * node through *last. */
static ts_status rewrite(cctx *c, int32_t ci, int32_t mi, int64_t rows, int32_t *last) {
    ts_graph *g = c->g;
    const ts_node cn = g->nodes[ci];
    const int64_t n = g->values[cn.in[1]].t.dims[0];
    const int k = (int)((n + rows - 1) / rows);
    ts_val *parts = ts_alloc(sizeof(ts_val) * (size_t)k, "chunk_ce");
    if (!parts) return TS_ERR_NOMEM;
    const int32_t w = g->nodes[mi].in[1];
    const ts_attrs ma = g->nodes[mi].a;
    ts_val in[5];
    for (int j = 0; j < cn.n_in; j++) in[j] = ts_mkval(cn.in[j]);
    for (int q = 0; q < k; q++) {
        ts_attrs a = cn.a;
        a.cross_entropy.row_start = q * rows;
        a.cross_entropy.row_count = (q + 1) * rows < n ? rows : n - q * rows;
        ts_val d = ts_node_add(g, TS_OP_CROSS_ENTROPY_BWD, cn.n_in, in, &a, NULL);
        ts_val mm[2] = {d, ts_mkval(w)};
        parts[q] = ts_node_add(g, TS_OP_MATMUL, 2, mm, &ma, NULL);
    }
    const ts_type ot = g->values[g->nodes[mi].out[0]].t;
    ts_val dx = ts_reshape(g, ts_concat(g, k, parts, 0), ot.rank, ot.dims);
    free(parts);
    ts_status s = ts_graph_status(g);
    if (s != TS_OK) return s;
    *last = g->values[dx.id].node;
    /* every reader of the old dX, and every control edge on the old pair,
     * now goes to the new one, and so do its name and marks (dX may be a
     * parameter's gradient) */
    const int32_t old = g->nodes[mi].out[0];
    ts_value *ov = &g->values[old], *nv = &g->values[dx.id];
    free(nv->name);
    nv->name = ov->name, nv->is_output = ov->is_output, nv->grad_of = ov->grad_of;
    ov->name = NULL, ov->is_output = 0, ov->grad_of = -1;
    for (int i = 0; i < g->n_nodes; i++) {
        ts_node *r = &g->nodes[i];
        if (r->dead || i == *last) continue;
        for (int j = 0; j < r->n_in; j++)
            if (r->in[j] == old) r->in[j] = dx.id;
        for (int j = 0; j < r->n_ctrl; j++)
            if (r->ctrl[j] == mi || r->ctrl[j] == ci) r->ctrl[j] = *last;
    }
    return TS_OK;
}

ts_status ts_pass_chunk_ce(ts_graph *g, int *n_chunked) {
    const int n0 = g->n_nodes;
    cctx c = {g, NULL, NULL};
    /* per old node: the first new node to run before it, and how many */
    int32_t *first = ts_alloc(sizeof(int32_t) * (size_t)(n0 + 1), "chunk_ce");
    int32_t *count = ts_zalloc(sizeof(int32_t) * (size_t)(n0 + 1), "chunk_ce");
    int32_t *perm = NULL;
    ts_status s = first && count ? TS_OK : TS_ERR_NOMEM;
    int done = 0;
    if (s == TS_OK) s = count_uses(&c);
    for (int ci = 0; ci < n0 && s == TS_OK; ci++) {
        const ts_node *cn = &g->nodes[ci];
        if (cn->dead || cn->op != TS_OP_CROSS_ENTROPY_BWD || cn->a.cross_entropy.row_count > 0)
            continue;
        /* only where the logits are kept: otherwise the gradient takes their
         * memory (TS_OPF_INPLACE_IN1) and chunks would only add to it */
        const ts_value *lg = &g->values[cn->in[1]];
        if (!kept(g, cn->in[1]) || lg->t.rank != 2) continue;
        int32_t views[8];
        int nv = 0;
        const int32_t mi = head_matmul(&c, ci, views, &nv);
        const int64_t rows = chunk_rows(&lg->t);
        if (mi < 0 || mi >= n0 || lg->t.dims[0] <= rows) continue;
        const int before = g->n_nodes;
        int32_t last = -1;
        if ((s = rewrite(&c, ci, mi, rows, &last)) != TS_OK) break;
        first[mi] = before;
        count[mi] = g->n_nodes - before;
        g->nodes[ci].dead = 1;
        g->nodes[mi].dead = 1;
        for (int j = 0; j < nv; j++) g->nodes[views[j]].dead = 1;
        done++;
        s = count_uses(&c);
    }
    if (s == TS_OK && done) {
        /* the new nodes run where the matmul they replace ran */
        perm = ts_alloc(sizeof(int32_t) * (size_t)(g->n_nodes + 1), "chunk_ce");
        if (!perm) s = TS_ERR_NOMEM;
        int np = 0;
        for (int i = 0; i < n0 && s == TS_OK; i++) {
            for (int q = 0; q < count[i]; q++) perm[np++] = first[i] + q;
            perm[np++] = i;
        }
        if (s == TS_OK) s = ts_graph_permute_nodes(g, perm, np);
    }
    if (n_chunked) *n_chunked = done;
    free(c.uses);
    free(c.reader);
    free(first);
    free(count);
    free(perm);
    return s;
}
