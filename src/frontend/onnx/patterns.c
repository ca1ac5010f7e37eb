/* Patterns of a torch export that map onto one tessel op:
 *
 *   GELU (erf):  Div(x, sqrt 2) -> Erf -> Add(1) -> Mul(x) -> Mul(0.5)
 *                (or x * 0.5 first, as written by hand): ts_gelu. ONNX
 *                before opset 20 has no Gelu, and tessel has no Erf of its
 *                own, so an Erf outside this pattern is refused.
 *   GELU (tanh): Tanh(sqrt(2/pi) * (x + 0.044715 * x^3)) with the same
 *                tail (x^3 as x * x * x or Pow(x, 3)): ts_gelu(tanh); a
 *                Tanh outside it is an ordinary tanh.
 *   attention:   MatMul(Softmax(Where(causal mask, -inf, scale * q @ kT)), v)
 *                with q, kT, v of rank 4 (the W3 GPT's explicit attention):
 *                ts_attention, blockwise, no [T, T] matrix kept. Without the
 *                Where it is the non-causal form; anything else is imported
 *                op by op.
 *
 * Both look back at the nodes that made a value (onnx_producer) and, for
 * GELU, forward at the ones that read it; the nodes the GELU swallows are
 * skipped by the import loop, while the attention's score nodes, already
 * built, are left to the compiler's dead-code pass. */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include "core/core.h"
#include "frontend/onnx/onnx_internal.h"

typedef const Onnx__NodeProto node;

static node *at(const onnx_ctx *x, long i) {
    return i >= 0 ? x->gp->node[i] : NULL;
}
static int is(node *n, const char *op) {
    return n && !strcmp(n->op_type, op) && n->n_input == 2 && n->n_output >= 1;
}
/* value `name` a constant scalar within tol of want: one already known, or
 * made by a Constant node not imported yet (torch writes each Constant just
 * before the node reading it, so after the Erf for the GELU's 1 and 0.5). */
static int near(onnx_ctx *x, const char *name, double want, double tol) {
    const onnx_const *c = onnx_const_of(x, name);
    if (c) return c->n == 1 && fabs(onnx_const_at(c, 0) - want) <= tol;
    for (size_t i = x->at + 1; i < x->gp->n_node; i++) {
        node *k = x->gp->node[i];
        if (strcmp(k->op_type, "Constant") || k->n_output != 1 || strcmp(k->output[0], name))
            continue;
        const Onnx__AttributeProto *a = onnx_attr(k, "value");
        if (a && a->t) {
            onnx_const t;
            if (onnx_tensor_read(a->t, x->dir, &t) != TS_OK) return 0;
            const int ok = t.n == 1 && fabs(onnx_const_at(&t, 0) - want) <= tol;
            free(t.f);
            free(t.i);
            return ok;
        }
        a = onnx_attr(k, "value_float");
        return a && fabs(a->f - want) <= tol;
    }
    return 0;
}
/* The operand of binary node b that is not `known`; NULL if neither is. */
static const char *other(node *b, const char *known) {
    if (!strcmp(b->input[0], known)) return b->input[1];
    if (!strcmp(b->input[1], known)) return b->input[0];
    return NULL;
}
/* The only node reading value `name`, or NULL. */
static node *sole_reader(const onnx_ctx *x, const char *name, long *idx) {
    return onnx_consumers(x, name, idx) == 1 ? at(x, *idx) : NULL;
}

/* GELU's tail after its nonlinearity t (erf(x / sqrt 2) or tanh(...)):
 * Add(t, 1) then Mul by x and by 0.5 (x * (1 + t) * 0.5, or (x * 0.5) *
 * (1 + t)). Returns the value the whole GELU makes, and the nodes to skip
 * in idx[0..2] (-1 unused); NULL when the nodes do not follow it. */
static const char *gelu_tail(onnx_ctx *x, const char *t, const char *X, long *idx) {
    const double tol = 1e-5;
    idx[0] = idx[1] = idx[2] = -1;
    node *add = sole_reader(x, t, &idx[0]);
    const char *one = is(add, "Add") ? other(add, t) : NULL;
    node *m1 = one && near(x, one, 1, tol) ? sole_reader(x, add->output[0], &idx[1]) : NULL;
    const char *p = is(m1, "Mul") ? other(m1, add->output[0]) : NULL;
    if (p && !strcmp(p, X)) { /* x * (1 + t) then * 0.5 */
        node *m2 = sole_reader(x, m1->output[0], &idx[2]);
        const char *half = is(m2, "Mul") ? other(m2, m1->output[0]) : NULL;
        return half && near(x, half, 0.5, tol) ? m2->output[0] : NULL;
    }
    if (p) { /* (x * 0.5) * (1 + t) */
        node *h = at(x, onnx_producer(x, p));
        const char *xo = is(h, "Mul") ? other(h, X) : NULL;
        return xo && near(x, xo, 0.5, tol) ? m1->output[0] : NULL;
    }
    return NULL;
}

/* The whole GELU as one ts_gelu defining `result`; the tail nodes skipped
 * (the ones before it, already built, are left to dead-code removal). */
static ts_status gelu_fused(onnx_ctx *x, const char *X, const char *result, const long *idx,
                            ts_gelu_approx approx) {
    for (int k = 0; k < 3; k++)
        if (idx[k] >= 0) x->skip[idx[k]] = 1;
    ts_val y = ts_gelu(x->g, onnx_get(x, X), approx);
    x->info->n_fused++;
    if (!ts_val_ok(y)) return ts_graph_status(x->g);
    return onnx_define(x, result, y, NULL);
}

ts_status onnx_gelu_erf(onnx_ctx *x, node *n) {
    ts_status s;
    if ((s = onnx_only_attrs(x, n, "")) || (s = onnx_need_inputs(x, n, 1, 1))) return s;
    const double r2 = sqrt(2.0), tol = 1e-5;
    node *d = at(x, onnx_producer(x, n->input[0]));
    const char *X = NULL;
    if (is(d, "Div") && near(x, d->input[1], r2, tol)) X = d->input[0];
    if (is(d, "Mul") && near(x, d->input[1], 1 / r2, tol)) X = d->input[0];
    if (is(d, "Mul") && near(x, d->input[0], 1 / r2, tol)) X = d->input[1];
    long idx[3];
    const char *result = X ? gelu_tail(x, n->output[0], X, idx) : NULL;
    if (!result)
        return onnx_refuse(x, n,
                           "Erf is read only inside torch's GELU pattern (x * 0.5 * (1 + "
                           "erf(x / sqrt(2)))), not alone");
    return gelu_fused(x, X, result, idx, TS_GELU_ERF);
}

/* The operand of a Mul node by a constant near k, or NULL. */
static const char *times(onnx_ctx *x, node *m, double k, double tol) {
    if (!is(m, "Mul")) return NULL;
    if (near(x, m->input[0], k, tol)) return m->input[1];
    if (near(x, m->input[1], k, tol)) return m->input[0];
    return NULL;
}

ts_status onnx_gelu_tanh(onnx_ctx *x, node *n, int *fused) {
    *fused = 0;
    const double tol = 1e-5;
    /* tanh(sqrt(2 / pi) * (x + 0.044715 * x^3)) */
    const char *inner = times(x, at(x, onnx_producer(x, n->input[0])), sqrt(2 / M_PI), tol);
    node *add = inner ? at(x, onnx_producer(x, inner)) : NULL;
    if (!is(add, "Add")) return TS_OK;
    const char *X = NULL;
    for (int k = 0; k < 2 && !X; k++) {
        const char *cube = times(x, at(x, onnx_producer(x, add->input[k])), 0.044715, tol);
        node *c = cube ? at(x, onnx_producer(x, cube)) : NULL;
        const char *cand = add->input[1 - k];
        if (is(c, "Pow") && !strcmp(c->input[0], cand) && near(x, c->input[1], 3, 0)) X = cand;
        if (!is(c, "Mul")) continue;
        const char *sq = other(c, cand); /* x * (x * x), either order */
        node *q = sq ? at(x, onnx_producer(x, sq)) : NULL;
        if (is(q, "Mul") && !strcmp(q->input[0], cand) && !strcmp(q->input[1], cand)) X = cand;
    }
    long idx[3];
    const char *result = X ? gelu_tail(x, n->output[0], X, idx) : NULL;
    if (!result) return TS_OK;
    *fused = 1;
    return gelu_fused(x, X, result, idx, TS_GELU_TANH);
}

/* mask [..., T, T] hides exactly the keys after each query: j > i. */
static int causal_mask(const onnx_const *c, int64_t T) {
    if (!c->i || c->rank < 2 || c->dims[c->rank - 1] != T || c->dims[c->rank - 2] != T) return 0;
    for (int64_t k = 0; k < c->n; k++) {
        const int64_t i = (k / T) % T, j = k % T;
        if ((c->i[k] != 0) != (j > i)) return 0;
    }
    return 1;
}

ts_status onnx_attention(onnx_ctx *x, node *n, int *fused) {
    *fused = 0;
    node *sm = at(x, onnx_producer(x, n->input[0]));
    if (!sm || strcmp(sm->op_type, "Softmax") || sm->n_input != 1) return TS_OK;
    const char *scores = sm->input[0];
    node *w = at(x, onnx_producer(x, scores));
    const onnx_const *mask = NULL;
    if (w && !strcmp(w->op_type, "Where") && w->n_input == 3) {
        mask = onnx_const_of(x, w->input[0]);
        const onnx_const *ninf = onnx_const_of(x, w->input[1]);
        if (!mask || !ninf || ninf->n != 1 || !(onnx_const_at(ninf, 0) < -3e38)) return TS_OK;
        scores = w->input[2];
    }
    double scale = 1;
    node *m = at(x, onnx_producer(x, scores));
    if (is(m, "Mul") || is(m, "Div")) {
        const onnx_const *c0 = onnx_const_of(x, m->input[0]), *c1 = onnx_const_of(x, m->input[1]);
        const onnx_const *c = c1 ? c1 : m->op_type[0] == 'M' ? c0 : NULL;
        if (!c || c->n != 1 || (c0 && c1)) return TS_OK;
        scale = m->op_type[0] == 'D' ? 1 / onnx_const_at(c, 0) : onnx_const_at(c, 0);
        scores = c == c1 ? m->input[0] : m->input[1];
        m = at(x, onnx_producer(x, scores));
    }
    if (!is(m, "MatMul")) return TS_OK;
    ts_graph *g = x->g;
    ts_val q = onnx_get(x, m->input[0]), kt = onnx_get(x, m->input[1]),
           v = onnx_get(x, n->input[1]);
    if (!ts_val_ok(q) || !ts_val_ok(kt) || !ts_val_ok(v) || ts_rank(g, q) != 4 ||
        ts_rank(g, kt) != 4 || ts_rank(g, v) != 4)
        return TS_OK;
    const int64_t T = ts_dim(g, q, 2), hd = ts_dim(g, q, 3);
    for (int k = 0; k < 2; k++)
        if (ts_dim(g, kt, k) != ts_dim(g, q, k) || ts_dim(g, v, k) != ts_dim(g, q, k)) return TS_OK;
    if (ts_dim(g, kt, 2) != hd || ts_dim(g, kt, 3) != T || ts_dim(g, v, 2) != T ||
        ts_dim(g, v, 3) != hd || ts_dtype_of(g, q) != TS_F32)
        return TS_OK;
    if (mask && !causal_mask(mask, T)) return TS_OK;
    int axis = (int)onnx_attr_i(sm, "axis", -1);
    if (axis != -1 && axis != 3) return TS_OK;
    *fused = 1;
    x->info->n_fused++;
    ts_val y = ts_attention(g, q, ts_transpose(g, kt, 2, 3), v, mask != NULL, scale);
    if (!ts_val_ok(y)) return ts_graph_status(g);
    return onnx_define(x, n->output[0], y, NULL);
}
