/* attention_qkv: the fused attention reads q, k and v straight from the qkv
 * projection's output and writes its output in the layout the output
 * projection reads, instead of through three slices, three head permutes
 * and an output permute (and, in the backward, a permute of the output
 * gradient, three permutes of dq, dk, dv and their concat).
 *
 * The pattern (GPT-2's attention, models/gpt.c, and the same graph from
 * ONNX):
 *
 *     x [B, T, 3D] --slice axis 2 at 0, D, 2D--> [B, T, D] --reshape--> [B, T, H, hd]
 *       --permute (0, 2, 1, 3)--> q, k, v [B, H, T, hd] --attention--> o [B, H, T, hd]
 *       --permute (0, 2, 1, 3)--> y [B, T, H, hd]
 *
 * becomes  qkv = reshape(x, [B, T, 3, H, hd]),  (y, lse) = attention(qkv)  in the packed
 * form of the op (ops/attention_fused.h): the same sums in the same order, so the same
 * bits, fp32 and bf16. Its gradient (ops/attention.c) is then the packed attention_bwd,
 * which reads dy [B, T, H, hd] and writes dqkv [B, T, 3, H, hd], the gradient of x as it
 * is. Anything else (another permutation, slices of different tensors or widths, an
 * attention output read other than by the one permute, its lse read) keeps the split form.
 *
 * Runs before autodiff. The output permute node itself becomes the packed attention (its
 * output keeps its value id) and the qkv reshape goes right before it; the old attention
 * and its input chain are left as they were, read by nothing, for simplify's dead-code
 * elimination (the pipeline runs this pass only with simplify). */
#include <stdlib.h>
#include <string.h>
#include "passes.h"

static const ts_node *producer(const ts_graph *g, int32_t v, int op) {
    const ts_value *x = &g->values[v];
    if (x->kind != TS_VK_NODE || x->node < 0) return NULL;
    const ts_node *n = &g->nodes[x->node];
    return n->op == op && !n->dead ? n : NULL;
}

static int is_head_perm(const ts_node *p) {
    const int64_t *pm = p->a.permute.perm;
    return pm[0] == 0 && pm[1] == 2 && pm[2] == 1 && pm[3] == 3 && !p->a.permute.out_low;
}

/* Input i of attention node a: permute(reshape(slice i of x)) with x [B, T, 3D]; returns
 * x or -1. */
static int32_t qkv_source(const ts_graph *g, const ts_node *a, int i) {
    const ts_type *q = &g->values[a->in[i]].t; /* [B, H, T, hd] */
    const ts_node *p = producer(g, a->in[i], TS_OP_PERMUTE);
    const ts_node *r = p ? producer(g, p->in[0], TS_OP_RESHAPE) : NULL;
    const ts_node *s = r ? producer(g, r->in[0], TS_OP_SLICE) : NULL;
    if (!s || !is_head_perm(p)) return -1;
    const ts_type *x = &g->values[s->in[0]].t;
    int64_t D = q->dims[1] * q->dims[3];
    if (x->rank != 3 || x->dims[0] != q->dims[0] || x->dims[1] != q->dims[2] ||
        x->dims[2] != 3 * D || s->a.slice.axis != 2 || s->a.slice.start != i * D ||
        s->a.slice.end != (i + 1) * D)
        return -1;
    return s->in[0];
}

/* Node index of the permute that alone reads attention a's output, or -1. */
static int out_permute(const ts_graph *g, const ts_node *a) {
    int last = -1;
    const ts_value *o = &g->values[a->out[0]], *lse = &g->values[a->out[1]];
    if (o->is_output || lse->is_output || ts_value_reads(g, a->out[1], &last) != 0 ||
        ts_value_reads(g, a->out[0], &last) != 1)
        return -1;
    const ts_node *p = &g->nodes[last];
    if (p->op != TS_OP_PERMUTE || !is_head_perm(p)) return -1;
    const ts_value *y = &g->values[p->out[0]];
    return y->is_output || y->grad_of >= 0 ? -1 : last;
}

/* Permute node pi (y = permute(o)) becomes (y, lse) = attention(qkv) with a's attributes:
 * y keeps its id, which its readers' views need (the schedule and the memory plan find an
 * alias's root through lower value ids). */
static ts_status make_packed(ts_graph *g, int pi, int32_t qkv, const ts_attrs *at) {
    ts_type lt = g->values[qkv].t;
    const int64_t *d = lt.dims; /* [B, T, 3, H, hd] */
    lt = (ts_type){.dtype = lt.dtype, .rank = 3, .dims = {d[0], d[3], d[1]}};
    int32_t lse = ts_value_new(g, &lt, TS_VK_NODE, NULL);
    if (lse < 0) return ts_graph_status(g);
    ts_node *n = &g->nodes[pi];
    n->op = TS_OP_ATTENTION;
    n->a = *at;
    n->in[0] = qkv;
    return ts_node_append_output(g, pi, lse); /* after y, the permute's one output */
}

ts_status ts_pass_attention_qkv(ts_graph *g, int64_t head_dim, int *n_folded) {
    int nn = g->n_nodes, folded = 0;
    /* before[i]: the reshape appended for the packed attention that node i becomes, or -1 */
    int32_t *before = ts_alloc(sizeof(int32_t) * (size_t)(nn + 1), "attention_qkv");
    if (!before) return TS_ERR_NOMEM;
    for (int i = 0; i < nn; i++) before[i] = -1;
    ts_status s = TS_OK;
    for (int i = 0; i < nn && s == TS_OK; i++) {
        const ts_node *a = &g->nodes[i];
        if (a->dead || a->op != TS_OP_ATTENTION || a->n_in != 3) continue;
        int32_t x = qkv_source(g, a, 0);
        int pi = out_permute(g, a);
        if (x < 0 || pi < 0 || qkv_source(g, a, 1) != x || qkv_source(g, a, 2) != x) continue;
        const ts_type *q = &g->values[a->in[0]].t;
        if (head_dim > 0 && q->dims[3] != head_dim) continue; /* the backend's packed form */
        int64_t dims[5] = {q->dims[0], q->dims[2], 3, q->dims[1], q->dims[3]};
        ts_attrs at = a->a;
        int first = g->n_nodes;
        ts_val qkv = ts_reshape(g, ts_mkval(x), 5, dims);
        if ((s = ts_graph_status(g)) != TS_OK) break;
        if (g->n_nodes != first + 1) {
            s = ts_fail(TS_ERR_INTERNAL, "attention_qkv: expected a reshape node, got %d nodes",
                        g->n_nodes - first);
            break;
        }
        if ((s = make_packed(g, pi, qkv.id, &at)) != TS_OK) break;
        before[pi] = first;
        folded++;
    }
    if (s == TS_OK && folded) {
        int32_t *perm = ts_alloc(sizeof(int32_t) * (size_t)(g->n_nodes + 1), "attention_qkv");
        if (!perm) {
            free(before);
            return TS_ERR_NOMEM;
        }
        int np = 0;
        for (int i = 0; i < nn; i++) {
            if (before[i] >= 0) perm[np++] = before[i];
            perm[np++] = i;
        }
        s = np == g->n_nodes
                ? ts_graph_permute_nodes(g, perm, np)
                : ts_fail(TS_ERR_INTERNAL, "attention_qkv: %d of %d nodes ordered", np, g->n_nodes);
        free(perm);
    }
    free(before);
    if (s == TS_OK && n_folded) *n_folded = folded;
    return s;
}
