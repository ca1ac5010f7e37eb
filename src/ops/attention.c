/* The attention ops: builders, inference, gradient, scratch and cost. Both
 * builders emit one fused `attention` node: o = softmax(scale * q k^T
 * [+ causal mask]) v computed blockwise (the kernels: attention_fused.c), so
 * no [T, T] score matrix is stored in the forward or the backward; the
 * gradient is one `attention_bwd` node giving dq, dk and dv. The packed form
 * (one qkv [B, T, 3, H, hd] input, o [B, T, H, hd], gradient dqkv; see
 * attention_fused.h) is made by passes/attention_qkv.c, not by a builder. */
#include <math.h>
#include "ops/attention_fused.h"
#include "ops/op.h"

/* ---- inference --------------------------------------------------------- */

static ts_status check_attrs(const ts_node *n) {
    if (n->a.attention.causal != 0 && n->a.attention.causal != 1)
        return ts_fail(TS_ERR_INVALID, "causal must be 0 or 1, got %lld",
                       (long long)n->a.attention.causal);
    if (n->a.attention.low != 0 && n->a.attention.low != 1)
        return ts_fail(TS_ERR_INVALID, "low must be 0 or 1, got %lld",
                       (long long)n->a.attention.low);
    if (n->a.attention.out_low != 0 && n->a.attention.out_low != 1)
        return ts_fail(TS_ERR_INVALID, "out_low must be 0 or 1, got %lld",
                       (long long)n->a.attention.out_low);
    if (n->a.attention.sums_rank < 0 || n->a.attention.sums_rank > TS_MAX_RANK)
        return ts_fail(TS_ERR_INVALID, "sums_rank must be in [0, %d], got %lld", TS_MAX_RANK,
                       (long long)n->a.attention.sums_rank);
    if (!isfinite(n->a.attention.scale))
        return ts_fail(TS_ERR_INVALID, "scale must be finite, got %g", n->a.attention.scale);
    return TS_OK;
}

/* q (input 0) is a float [B, H, T, hd] with T, hd >= 1, or in the packed form the qkv
 * [B, T, 3, H, hd]; inputs [first, last] must have q's type. */
static ts_status check_like_q(const ts_graph *g, const ts_node *n, const ts_type *q, int first,
                              int last, const char *const *names) {
    if (!ts_dtype_is_float(q->dtype) || (q->rank != 4 && q->rank != 5))
        return ts_fail(TS_ERR_SHAPE,
                       "q must be a float tensor [B, H, T, hd] (or the qkv [B, T, 3, H, hd])");
    if (q->rank == 5 && q->dims[2] != 3)
        return ts_fail(TS_ERR_SHAPE, "qkv [B, T, 3, H, hd] must have 3 at axis 2, got %lld",
                       (long long)q->dims[2]);
    ts_attn_geom ge;
    ts_attn_geom_of(q, &ge);
    if (ge.seq < 1 || ge.hd < 1) return ts_fail(TS_ERR_SHAPE, "T and hd must be at least 1");
    if (n->a.attention.low && q->dtype != TS_F32 && q->dtype != TS_BF16)
        return ts_fail(TS_ERR_SHAPE, "low (bf16 products) needs f32 or bf16 q, k and v, got %s",
                       ts_dtype_name(q->dtype));
    if (!n->a.attention.low && q->dtype == TS_BF16)
        return ts_fail(TS_ERR_SHAPE, "bf16 q, k and v need low 1 (the bf16 products)");
    for (int i = first; i <= last; i++)
        if (!ts_type_equal(ts_in_type(g, n, i), q))
            return ts_fail(TS_ERR_SHAPE, "%s must have q's dtype and shape", names[i]);
    return TS_OK;
}

/* The dtype of o, lse and the gradients: q's, but f32 with low (whose q, k and v may be bf16:
 * passes/qkv_low.c). */
static ts_dtype out_dtype(const ts_node *n, const ts_type *q) {
    return n->a.attention.low ? TS_F32 : q->dtype;
}

/* o: [B, H, T, hd] (split), [B, T, H, hd] (packed); lse [B, H, T]. */
static ts_type o_type(const ts_node *n, const ts_type *q) {
    ts_attn_geom ge;
    ts_attn_geom_of(q, &ge);
    ts_type t = *q;
    if (ge.packed) t = (ts_type){.rank = 4, .dims = {ge.B, ge.seq, ge.H, ge.hd}};
    t.dtype = out_dtype(n, q);
    return t;
}
static ts_type lse_type(const ts_node *n, const ts_type *q) {
    ts_attn_geom ge;
    ts_attn_geom_of(q, &ge);
    return (ts_type){.dtype = out_dtype(n, q), .rank = 3, .dims = {ge.B, ge.H, ge.seq}};
}

/* (q, k, v) or (qkv) -> (o, lse) */
static ts_status infer_attn(const ts_graph *g, const ts_node *n, ts_type *out, int *n_out) {
    static const char *const names[] = {"q", "k", "v"};
    const ts_type *q = ts_in_type(g, n, 0);
    ts_status s = check_attrs(n);
    if (s == TS_OK && (q->rank == 5) != (n->n_in == 1))
        s = ts_fail(TS_ERR_SHAPE, "attention takes q, k, v [B, H, T, hd] or one qkv "
                                  "[B, T, 3, H, hd]");
    if (s == TS_OK) s = check_like_q(g, n, q, 1, n->n_in - 1, names);
    if (s == TS_OK && n->a.attention.out_low)
        s = ts_fail(TS_ERR_INVALID, "out_low is for the packed attention_bwd only");
    if (s != TS_OK) return s;
    out[0] = o_type(n, q);
    out[1] = lse_type(n, q);
    *n_out = 2;
    return TS_OK;
}

/* (do, q, k, v, o, lse) -> (dq, dk, dv), or packed (do, qkv, o, lse) -> (dqkv) */
static ts_status infer_attn_bwd(const ts_graph *g, const ts_node *n, ts_type *out, int *n_out) {
    static const char *const names[] = {"do", "q", "k", "v", "o"};
    const ts_type *q = ts_in_type(g, n, 1);
    int packed = q->rank == 5;
    ts_status s = check_attrs(n);
    if (s == TS_OK && n->n_in != (packed ? 4 : 6))
        s = ts_fail(TS_ERR_SHAPE, "attention_bwd takes (do, q, k, v, o, lse) or "
                                  "(do, qkv [B, T, 3, H, hd], o, lse)");
    if (s == TS_OK) s = check_like_q(g, n, q, 2, packed ? 1 : 3, names);
    ts_type ot = o_type(n, q), lt = lse_type(n, q);
    if (s == TS_OK && (!ts_type_equal(ts_in_type(g, n, 0), &ot) ||
                       !ts_type_equal(ts_in_type(g, n, packed ? 2 : 4), &ot)))
        s = ts_fail(TS_ERR_SHAPE, "do and o must be the forward output's dtype and shape");
    if (s == TS_OK && !ts_type_equal(ts_in_type(g, n, packed ? 3 : 5), &lt))
        s = ts_fail(TS_ERR_SHAPE, "lse must be %s[%lld, %lld, %lld]", ts_dtype_name(lt.dtype),
                    (long long)lt.dims[0], (long long)lt.dims[1], (long long)lt.dims[2]);
    if (s == TS_OK && n->a.attention.out_low && (!packed || !n->a.attention.low))
        s = ts_fail(TS_ERR_INVALID, "out_low (a bf16 dqkv and its column sums) needs the packed "
                                    "form and low 1");
    if (s != TS_OK) return s;
    out[0] = out[1] = out[2] = *q;
    out[0].dtype = out[1].dtype = out[2].dtype = out_dtype(n, q);
    *n_out = packed ? 1 : 3;
    if (n->a.attention.out_low) { /* dqkv in bf16, and its sums over B and T (f32) */
        ts_attn_geom ge;
        ts_attn_geom_of(q, &ge);
        out[0].dtype = TS_BF16;
        const int r = n->a.attention.sums_rank > 1 ? (int)n->a.attention.sums_rank : 1;
        out[1] = (ts_type){.dtype = TS_F32, .rank = r};
        for (int i = 0; i < r; i++) out[1].dims[i] = i < r - 1 ? 1 : 3 * ge.H * ge.hd;
        *n_out = 2;
    }
    return TS_OK;
}

/* ---- gradient ---------------------------------------------------------- */

static ts_status grad_attn(ts_graph *g, const ts_node *n, const ts_val *dy, ts_val *din) {
    /* lse exists for the backward op only; the builders never hand it out. */
    if (ts_val_ok(dy[1])) {
        ts_graph_fail(g, TS_ERR_UNSUPPORTED,
                      "attention: gradients through the lse output are not supported");
        return ts_graph_status(g);
    }
    if (!ts_val_ok(dy[0])) return TS_OK;
    /* (do, q, k, v, o, lse), or packed (do, qkv, o, lse) */
    int n_in = n->n_in, k = 0;
    ts_val in[6];
    in[k++] = dy[0];
    for (int i = 0; i < n_in; i++) in[k++] = ts_mkval(n->in[i]);
    in[k++] = ts_mkval(n->out[0]);
    in[k++] = ts_mkval(n->out[1]);
    ts_attrs at = n->a; /* copy: n points into g->nodes, which moves */
    ts_val outs[TS_MAX_OUT];
    if (!ts_val_ok(ts_node_add(g, TS_OP_ATTENTION_BWD, k, in, &at, outs)))
        return ts_graph_status(g);
    for (int i = 0; i < n_in; i++) din[i] = outs[i];
    return ts_graph_status(g);
}

/* ---- kernels, scratch and cost ------------------------------------------ */

static size_t scratch_attn(const ts_graph *g, const ts_node *n) {
    return ts_attn_fwd_scratch(ts_in_type(g, n, 0), n->a.attention.low != 0);
}

static size_t scratch_attn_bwd(const ts_graph *g, const ts_node *n) {
    if (n->a.attention.out_low) return ts_attn_bwd_low_out_scratch(ts_in_type(g, n, 1));
    return ts_attn_bwd_scratch(ts_in_type(g, n, 1), n->a.attention.low != 0);
}

/* Multiply-adds over the (query, key) pairs that are visible: 2 products
 * of hd in the forward, 5 in the backward (scores recomputed). */
static double pairs_hd(const ts_graph *g, const ts_node *n, int q_in) {
    ts_attn_geom ge;
    ts_attn_geom_of(ts_in_type(g, n, q_in), &ge);
    double T = (double)ge.seq;
    double pairs = n->a.attention.causal ? T * (T + 1) / 2 : T * T;
    return (double)(ge.B * ge.H) * pairs * (double)ge.hd;
}
static double cost_attn(const ts_graph *g, const ts_node *n) {
    return 4.0 * pairs_hd(g, n, 0);
}
static double cost_attn_bwd(const ts_graph *g, const ts_node *n) {
    return 10.0 * pairs_hd(g, n, 1);
}

const ts_op_def ts_def_attention = {.name = "attention",
                                    .min_in = 1,
                                    .max_in = 3,
                                    .infer = infer_attn,
                                    .grad = grad_attn,
                                    .kernel = ts_attn_fwd,
                                    .scratch = scratch_attn,
                                    .cost = cost_attn};

const ts_op_def ts_def_attention_bwd = {.name = "attention_bwd",
                                        .min_in = 4,
                                        .max_in = 6,
                                        .infer = infer_attn_bwd,
                                        .kernel = ts_attn_bwd,
                                        .scratch = scratch_attn_bwd,
                                        .cost = cost_attn_bwd};

/* ---- builders ----------------------------------------------------------- */

ts_val ts_attention(ts_graph *g, ts_val q, ts_val k, ts_val v, int causal, double scale) {
    if (!g || g->status != TS_OK || !ts_val_ok(q) || !ts_val_ok(k) || !ts_val_ok(v)) return TS_NONE;
    ts_attrs at = ts_attrs_zero();
    at.attention.causal = causal;
    at.attention.scale = scale;
    ts_val in[3] = {q, k, v};
    return ts_node_add(g, TS_OP_ATTENTION, 3, in, &at, NULL);
}

ts_val ts_causal_attention(ts_graph *g, ts_val q, ts_val k, ts_val v) {
    if (!g || g->status != TS_OK || !ts_val_ok(q) || !ts_val_ok(k) || !ts_val_ok(v)) return TS_NONE;
    const ts_type *tq = &ts_v(g, q)->t, *tk = &ts_v(g, k)->t, *tv = &ts_v(g, v)->t;
    if (tq->rank != 4 || !ts_type_equal(tq, tk) || !ts_type_equal(tq, tv) ||
        !ts_dtype_is_float(tq->dtype)) {
        char a[128], b[128], c[128];
        return ts_graph_fail(g, TS_ERR_SHAPE,
                             "causal_attention: q, k and v must be float tensors of the same "
                             "shape [B, H, T, hd] and dtype; got q=%s, k=%s, v=%s",
                             ts_type_str(a, sizeof a, tq), ts_type_str(b, sizeof b, tk),
                             ts_type_str(c, sizeof c, tv));
    }
    return ts_attention(g, q, k, v, 1, 1.0 / sqrt((double)tq->dims[3]));
}
