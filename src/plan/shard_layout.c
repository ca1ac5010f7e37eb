/* ts_plan_shard_layout: which ranges of which parameters' optimizer state
 * the sharded "zero.bucket*" state values of a ZeRO plan hold. Derived
 * from the compiled plan alone (the shard_update instructions and the
 * arena offsets memplan gave the parameters), so checkpoints need nothing
 * from the distribute pass beyond what it already leaves in the plan. */
#include <stdlib.h>
#include <string.h>
#include "core/core.h"
#include "plan/plan.h"

static const ts_named *named_of(const ts_plan *p, int32_t value) {
    for (int i = 0; i < p->n_named; i++)
        if (p->named[i].value == value) return &p->named[i];
    return NULL;
}

/* One shard_update instruction: params in[0..k-1] (one after the other in
 * the arena, the bucket's flat range starting at the first), the gradient
 * shard in[k], the state values after it; the shard covers elements
 * [off, off + numel(state)) of the bucket. */
static ts_status add_pieces(const ts_plan *p, const ts_node *n, ts_shard_piece **out, int *np,
                            int *cap) {
    const int k = (int)n->a.shard.n_params;
    const int64_t off = n->a.shard.offset;
    if (k <= 0 || k >= n->n_in)
        return ts_fail(TS_ERR_INTERNAL, "shard layout: shard_update with %d parameters", k);
    const ts_named *p0 = named_of(p, n->in[0]);
    if (!p0) return ts_fail(TS_ERR_INTERNAL, "shard layout: unnamed parameter");
    const size_t es = ts_dtype_size(p0->t.dtype);
    for (int j = k + 1; j < n->n_in; j++) {
        const ts_named *sv = named_of(p, n->in[j]);
        if (!sv || sv->kind != TS_VK_STATE) continue; /* the clip coefficient */
        const char *what = strrchr(sv->name, '.');
        if (strncmp(sv->name, "zero.bucket", 11) || !what)
            return ts_fail(TS_ERR_INTERNAL, "shard layout: state '%s' is no zero.bucket value",
                           sv->name);
        const int64_t len = ts_type_numel(&sv->t);
        for (int q = 0; q < k; q++) {
            const ts_named *pv = named_of(p, n->in[q]);
            if (!pv || pv->kind != TS_VK_PARAM || pv->off < p0->off ||
                (pv->off - p0->off) % es != 0)
                return ts_fail(TS_ERR_INTERNAL, "shard layout: parameter %d of '%s' misplaced", q,
                               sv->name);
            const int64_t lo = (int64_t)((pv->off - p0->off) / es), hi = lo + ts_type_numel(&pv->t);
            const int64_t a = lo > off ? lo : off, b = hi < off + len ? hi : off + len;
            if (a >= b) continue;
            ts_status s = ts_grow((void **)out, cap, *np + 1, sizeof **out, "shard layout");
            if (s != TS_OK) return s;
            (*out)[(*np)++] =
                (ts_shard_piece){sv->name, pv->name, what + 1, a - off, a - lo, b - a};
        }
    }
    return TS_OK;
}

ts_status ts_plan_shard_layout(const ts_plan *p, ts_shard_piece **out, int *n) {
    if (!p || !out || !n) return ts_fail(TS_ERR_INVALID, "shard layout: NULL argument");
    *out = NULL;
    *n = 0;
    int cap = 0;
    ts_status s = TS_OK;
    for (int i = 0; i < p->n_ins && s == TS_OK; i++)
        if (p->ins[i].op == TS_OP_SHARD_UPDATE && p->ins[i].node >= 0)
            s = add_pieces(p, &p->graph->nodes[p->ins[i].node], out, n, &cap);
    if (s != TS_OK) {
        free(*out);
        *out = NULL;
        *n = 0;
    }
    return s;
}
