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
#include "tessel/dist.h"

static const ts_named *named_at(const ts_program *prog, const int *named_of, int32_t v) {
    return named_of[v] >= 0 ? &prog->named[named_of[v]] : NULL;
}

/* The pieces of one sharded state value sv, which holds elements
 * [off, off + numel(sv)) of the flat range of params[0..k-1] (one after
 * the other in the arena, the range starting at the first). what: the
 * logical tensor is "<param>.<what>" (what points into sv's name), or
 * with whole, the parameter itself (ZeRO-3's block of the parameters;
 * what is "", the end of the name). */
static ts_status state_pieces(ts_program *prog, const int *named_of, const int32_t *params, int k,
                              int64_t off, const ts_named *sv, int whole, int *cap) {
    const ts_named *p0 = named_at(prog, named_of, params[0]);
    if (!p0) return ts_fail(TS_ERR_INTERNAL, "shard layout: unnamed parameter");
    const size_t es = ts_dtype_size(p0->v.dtype);
    const char *what = whole ? sv->name + strlen(sv->name) : strrchr(sv->name, '.');
    if (strncmp(sv->name, "zero.bucket", 11) || !what)
        return ts_fail(TS_ERR_INTERNAL, "shard layout: state '%s' is no zero.bucket value",
                       sv->name);
    if (!whole) what++;
    const int64_t len = ts_shape_numel(sv->v.rank, sv->v.dims);
    for (int q = 0; q < k; q++) {
        const ts_named *pv = named_at(prog, named_of, params[q]);
        if (!pv || pv->kind != TS_NAMED_PARAM || pv->v.off < p0->v.off ||
            (pv->v.off - p0->v.off) % es != 0)
            return ts_fail(TS_ERR_INTERNAL, "shard layout: parameter %d of '%s' misplaced", q,
                           sv->name);
        const int64_t lo = (int64_t)((pv->v.off - p0->v.off) / es),
                      hi = lo + ts_shape_numel(pv->v.rank, pv->v.dims);
        const int64_t a = lo > off ? lo : off, b = hi < off + len ? hi : off + len;
        if (a >= b) continue;
        ts_status s = ts_grow((void **)&prog->shards, cap, prog->n_shards + 1, sizeof *prog->shards,
                              "shard layout");
        if (s != TS_OK) return s;
        prog->shards[prog->n_shards++] =
            (ts_shard_piece){sv->name, pv->name, what, a - off, a - lo, b - a};
    }
    return TS_OK;
}

/* ZeRO-3: the all_gather_start of the bucket whose block is value blk:
 * inputs (block, p1..pk) (passes/zero3.c). */
static const ts_node *zero3_gather_of(const ts_program *prog, const ts_graph *g, const int *node_of,
                                      int32_t blk) {
    for (int i = 0; i < prog->n_ins; i++) {
        const ts_node *n = &g->nodes[node_of[i]];
        if (n->op == TS_OP_ALL_GATHER_START && n->a.bucket.zero == 3 && n->in[0] == blk) return n;
    }
    return NULL;
}

/* One shard_update node: params in[0..k-1] (one after the other in the
 * arena, the bucket's flat range starting at the first), the gradient
 * shard in[k], the state values after it; the shard covers elements
 * [off, off + numel(state)) of the bucket. ZeRO-3: in[0] is the rank's
 * block of the parameters (a state value, updated in place at offset 0);
 * the parameters and the block's place in the bucket come from the
 * bucket's gather. */
static ts_status add_pieces(ts_program *prog, const ts_graph *g, const int *node_of,
                            const ts_node *n, const int *named_of, int *cap) {
    int k = (int)n->a.shard.n_params;
    int64_t off = n->a.shard.offset;
    if (k <= 0 || k >= n->n_in)
        return ts_fail(TS_ERR_INTERNAL, "shard layout: shard_update with %d parameters", k);
    const int32_t *params = n->in;
    const ts_named *blk = named_at(prog, named_of, n->in[0]);
    ts_status s = TS_OK;
    if (blk && blk->kind == TS_NAMED_STATE) { /* ZeRO-3 */
        const ts_node *ga = zero3_gather_of(prog, g, node_of, n->in[0]);
        if (!ga) return ts_fail(TS_ERR_INTERNAL, "shard layout: '%s' is never gathered", blk->name);
        size_t bo, bl;
        ts_comm_block((size_t)ga->a.bucket.elems, ts_comm_size(prog->opt.comm),
                      ts_comm_rank(prog->opt.comm), &bo, &bl);
        params = ga->in + 1;
        k = ga->n_in - 1;
        off = (int64_t)bo;
        if ((s = state_pieces(prog, named_of, params, k, off, blk, 1, cap)) != TS_OK) return s;
    }
    for (int j = (int)n->a.shard.n_params + 1; j < n->n_in && s == TS_OK; j++) {
        const ts_named *sv = named_at(prog, named_of, n->in[j]);
        if (!sv || sv->kind != TS_NAMED_STATE) continue; /* the clip coefficient */
        s = state_pieces(prog, named_of, params, k, off, sv, 0, cap);
    }
    return s;
}

ts_status ts_lower_shard_layout(ts_program *prog, const ts_graph *g, const int *node_of,
                                const int *named_of) {
    int cap = 0;
    ts_status s = TS_OK;
    for (int i = 0; i < prog->n_ins && s == TS_OK; i++)
        if (prog->ins[i].op == TS_OP_SHARD_UPDATE)
            s = add_pieces(prog, g, node_of, &g->nodes[node_of[i]], named_of, &cap);
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
