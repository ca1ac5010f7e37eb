/* ts_plan_shard_layout: which ranges of which parameters' optimizer state
 * the sharded "zero.bucket*" state values of a ZeRO plan hold. Worked out
 * while compiling, from the graph's shard_update nodes and the arena
 * offsets memplan gave the parameters, and kept in the program, so
 * checkpoints need nothing from the distribute pass beyond what it already
 * leaves in the plan, and the plan no graph. */
#include <stdlib.h>
#include <string.h>
#include "core/core.h"
#include "plan/lower.h"

static const ts_named *named_at(const ts_program *prog, const int *named_of, int32_t v) {
    return named_of[v] >= 0 ? &prog->named[named_of[v]] : NULL;
}

/* One shard_update node: params in[0..k-1] (one after the other in the
 * arena, the bucket's flat range starting at the first), the gradient
 * shard in[k], the state values after it; the shard covers elements
 * [off, off + numel(state)) of the bucket. */
static ts_status add_pieces(ts_program *prog, const ts_node *n, const int *named_of, int *cap) {
    const int k = (int)n->a.shard.n_params;
    const int64_t off = n->a.shard.offset;
    if (k <= 0 || k >= n->n_in)
        return ts_fail(TS_ERR_INTERNAL, "shard layout: shard_update with %d parameters", k);
    const ts_named *p0 = named_at(prog, named_of, n->in[0]);
    if (!p0) return ts_fail(TS_ERR_INTERNAL, "shard layout: unnamed parameter");
    const size_t es = ts_dtype_size(p0->v.dtype);
    for (int j = k + 1; j < n->n_in; j++) {
        const ts_named *sv = named_at(prog, named_of, n->in[j]);
        if (!sv || sv->kind != TS_NAMED_STATE) continue; /* the clip coefficient */
        const char *what = strrchr(sv->name, '.');
        if (strncmp(sv->name, "zero.bucket", 11) || !what)
            return ts_fail(TS_ERR_INTERNAL, "shard layout: state '%s' is no zero.bucket value",
                           sv->name);
        const int64_t len = ts_shape_numel(sv->v.rank, sv->v.dims);
        for (int q = 0; q < k; q++) {
            const ts_named *pv = named_at(prog, named_of, n->in[q]);
            if (!pv || pv->kind != TS_NAMED_PARAM || pv->v.off < p0->v.off ||
                (pv->v.off - p0->v.off) % es != 0)
                return ts_fail(TS_ERR_INTERNAL, "shard layout: parameter %d of '%s' misplaced", q,
                               sv->name);
            const int64_t lo = (int64_t)((pv->v.off - p0->v.off) / es),
                          hi = lo + ts_shape_numel(pv->v.rank, pv->v.dims);
            const int64_t a = lo > off ? lo : off, b = hi < off + len ? hi : off + len;
            if (a >= b) continue;
            ts_status s = ts_grow((void **)&prog->shards, cap, prog->n_shards + 1,
                                  sizeof *prog->shards, "shard layout");
            if (s != TS_OK) return s;
            prog->shards[prog->n_shards++] =
                (ts_shard_piece){sv->name, pv->name, what + 1, a - off, a - lo, b - a};
        }
    }
    return TS_OK;
}

ts_status ts_lower_shard_layout(ts_program *prog, const ts_graph *g, const int *node_of,
                                const int *named_of) {
    int cap = 0;
    ts_status s = TS_OK;
    for (int i = 0; i < prog->n_ins && s == TS_OK; i++)
        if (prog->ins[i].op == TS_OP_SHARD_UPDATE)
            s = add_pieces(prog, &g->nodes[node_of[i]], named_of, &cap);
    return s;
}

ts_status ts_plan_shard_layout(const ts_plan *p, ts_shard_piece **out, int *n) {
    if (!p || !out || !n) return ts_fail(TS_ERR_INVALID, "shard layout: NULL argument");
    *out = NULL;
    *n = 0;
    const ts_program *prog = &p->prog;
    if (prog->n_shards == 0) return TS_OK;
    *out = ts_alloc(sizeof **out * (size_t)prog->n_shards, "shard layout");
    if (!*out) return TS_ERR_NOMEM;
    memcpy(*out, prog->shards, sizeof **out * (size_t)prog->n_shards);
    *n = prog->n_shards;
    return TS_OK;
}
