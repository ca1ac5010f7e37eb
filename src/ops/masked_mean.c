/* The mean over sources that are valid (ts_masked_mean, graph.h): a
 * composite of where, sum, cast, maximum and div. An invalid source's
 * values are never read into the result (where selects 0 in their place,
 * so a NaN from a failed sensor does not spread) and its gradient is an
 * exact 0 (where's backward routes dy only to the selected operand). */
#include "kern.h"

ts_val ts_masked_mean(ts_graph *g, ts_val x, ts_val valid) {
    if (!g || g->status != TS_OK || !ts_val_ok(x) || !ts_val_ok(valid)) return TS_NONE;
    if (x.id >= g->n_values || valid.id >= g->n_values)
        return ts_graph_fail(g, TS_ERR_INVALID, "masked_mean: x or valid is not of this graph");
    const ts_type xt = ts_v(g, x)->t, vt = ts_v(g, valid)->t;
    if (!ts_dtype_is_float(xt.dtype) || xt.rank < 2)
        return ts_graph_fail(g, TS_ERR_SHAPE,
                             "masked_mean: x must be float [B, S, ...] (rank >= 2), got %s rank %d",
                             ts_dtype_name(xt.dtype), xt.rank);
    if (vt.dtype != TS_U8 || vt.rank != 2 || vt.dims[0] != xt.dims[0] || vt.dims[1] != xt.dims[1])
        return ts_graph_fail(g, TS_ERR_SHAPE,
                             "masked_mean: valid must be u8 [%lld, %lld] (one flag per row and "
                             "source of x), got %s rank %d",
                             (long long)xt.dims[0], (long long)xt.dims[1], ts_dtype_name(vt.dtype),
                             vt.rank);
    /* valid as [B, S, 1, ...] to broadcast over each source's values */
    int64_t ed[TS_MAX_RANK], cd[TS_MAX_RANK];
    for (int i = 0; i < xt.rank; i++) ed[i] = i < 2 ? xt.dims[i] : 1;
    cd[0] = xt.dims[0];
    for (int i = 1; i < xt.rank - 1; i++) cd[i] = 1;
    const int ax1[1] = {1};
    ts_val v = ts_reshape(g, valid, xt.rank, ed);
    ts_val kept = ts_where(g, v, x, ts_scalar(g, 0.0, xt.dtype));
    ts_val num = ts_sum(g, kept, 1, ax1, 0); /* [B, ...] */
    /* a row without a valid source divides 0 by 1: a zero representation */
    ts_val cnt = ts_sum(g, ts_cast(g, valid, xt.dtype), 1, ax1, 0); /* [B] */
    ts_val den = ts_maximum(g, cnt, ts_scalar(g, 1.0, xt.dtype));
    return ts_div(g, num, xt.rank > 2 ? ts_reshape(g, den, xt.rank - 1, cd) : den);
}
