/* Helpers shared by op definitions: broadcasting and dtype errors. */
#include <stdio.h>
#include "op.h"

ts_status ts_broadcast_shapes(const ts_type *a, const ts_type *b, ts_type *out) {
    int r = a->rank > b->rank ? a->rank : b->rank;
    out->rank = r;
    for (int i = 0; i < r; i++) {
        int ia = i - (r - a->rank), ib = i - (r - b->rank);
        int64_t da = ia >= 0 ? a->dims[ia] : 1, db = ib >= 0 ? b->dims[ib] : 1;
        if (da != db && da != 1 && db != 1)
            return ts_fail(TS_ERR_SHAPE, "shapes do not broadcast: axis %d is %lld vs %lld", i - r,
                           (long long)da, (long long)db);
        out->dims[i] = da == 1 ? db : da;
    }
    return TS_OK;
}

ts_val ts_sum_to(ts_graph *g, ts_val dy, ts_val like) {
    if (!ts_val_ok(dy) || !ts_val_ok(like)) return dy;
    /* Copies: pointers into g->values move when nodes are added. */
    const ts_type to_copy = ts_v(g, like)->t, *to = &to_copy;
    const ts_type t_copy = ts_v(g, dy)->t, *t = &t_copy;
    if (t->rank == to->rank) {
        int same = 1;
        for (int i = 0; i < t->rank; i++) same &= t->dims[i] == to->dims[i];
        if (same) return dy;
    }
    /* Sum over the leading axes `to` lacks and the axes where it has 1. */
    int axes[TS_MAX_RANK], n = 0, lead = t->rank - to->rank;
    for (int i = 0; i < t->rank; i++)
        if (i < lead || (to->dims[i - lead] == 1 && t->dims[i] != 1)) axes[n++] = i;
    ts_val s = n ? ts_sum(g, dy, n, axes, 1) : dy;
    return ts_reshape(g, s, to->rank, to->dims);
}

ts_status ts_kernel_bad_dtype(const ts_kargs *k, const char *op, ts_dtype dt) {
    return ts_fail(TS_ERR_UNSUPPORTED, "%s '%s': the CPU kernel does not support dtype %s", op,
                   k->label ? k->label : "?", ts_dtype_name(dt));
}
