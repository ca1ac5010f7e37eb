/* Attention builders. Both emit one fused `attention` node (see
 * attention_fused.c): o = softmax(scale * q k^T [+ causal mask]) v computed
 * blockwise, so no [T, T] score matrix is stored in the forward or the
 * backward; the gradient is one `attention_bwd` node giving dq, dk and dv. */
#include <math.h>
#include "ops/op.h"

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
