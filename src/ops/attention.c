/* Causal self-attention as a composite of existing ops:
 *
 *     softmax(where(mask, (q @ k^T) / sqrt(hd), -inf)) @ v
 *
 * with mask a constant lower-triangular [T, T] u8 tensor broadcast over the
 * batch and head axes. Building it from ops gives it gradients, f32/f64
 * kernels and planning for free; the -inf entries become exact zeros after
 * the softmax, and where() routes no gradient to them. */
#include <math.h>
#include <stdlib.h>
#include "ops/op.h"

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
    ts_dtype dt = tq->dtype;
    int64_t T = tq->dims[2], hd = tq->dims[3];

    unsigned char *m = ts_alloc((size_t)(T * T), "causal mask");
    if (!m) {
        ts_graph_set_error(g, TS_ERR_NOMEM);
        return TS_NONE;
    }
    for (int64_t i = 0; i < T; i++)
        for (int64_t j = 0; j < T; j++) m[i * T + j] = j <= i; /* query i sees keys 0..i */
    int64_t md[2] = {T, T};
    ts_val mask = ts_constant(g, NULL, TS_U8, 2, md, m);
    free(m);

    ts_val s = ts_matmul(g, q, k, 0, 1);                     /* [B, H, T, T] */
    s = ts_affine_scalar(g, s, 1.0 / sqrt((double)hd), 0.0); /* scaled scores */
    s = ts_where(g, mask, s, ts_scalar(g, -INFINITY, dt));   /* hide the future */
    ts_val p = ts_softmax(g, s, -1);                         /* over the keys */
    return ts_matmul(g, p, v, 0, 0);                         /* [B, H, T, hd] */
}
