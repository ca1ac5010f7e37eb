/* memplan: every tensor of the step gets a fixed offset in one arena.
 *
 * Layout: [params | grads | optimizer state | inputs, constants, outputs |
 * intermediates]. Gradients are in the data-parallel buckets' order when
 * the plan has buckets (distribute.c), else in the parameters' order. The first four regions are
 * contiguous and persistent (the optimizer walks params, grads and state as flat arrays). The
 * intermediates region is planned from liveness: each storage root lives
 * from the step its producer runs to the last step reading it or any view
 * of it; roots are placed largest first at the lowest offset that does not
 * collide with a root alive at the same time (greedy by size). Views
 * (reshape) share their source's storage, and an elementwise op may write
 * over its input when that input dies at the op. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include "passes.h"

/* Pieces of a ZeRO-3 bucket's parameters: zero3.c gathers a bucket at
 * most 3 times per phase; more gathers than this extend the last piece. */
enum { MAX_PIECES = 8 };

typedef struct interval {
    int32_t id; /* value id (root), -(node+1) for scratch, or with bucket: its start node */
    int start, end;
    size_t bytes, off;
    int bucket; /* ZeRO-2: 1 if this is a gradient bucket (id its start node); ZeRO-3: 2 if
                   the parameters of a bucket (id its first gather's start node) */
    int np;     /* ZeRO-3: > 0: alive only in the pieces lo[p]..hi[p], one per gather (free
                   between a gather's last reader and the next gather) */
    int lo[MAX_PIECES], hi[MAX_PIECES];
} interval;

static int cmp_size_desc(const void *a, const void *b) {
    const interval *x = a, *y = b;
    if (x->bytes != y->bytes) return x->bytes < y->bytes ? 1 : -1;
    if (x->start != y->start) return x->start < y->start ? -1 : 1;
    if (x->bucket != y->bucket) return x->bucket > y->bucket ? -1 : 1; /* ids of other kinds */
    return x->id < y->id ? -1 : x->id > y->id;
}

static int cmp_off(const void *a, const void *b) {
    const interval *x = *(interval *const *)a, *y = *(interval *const *)b;
    return x->off < y->off ? -1 : x->off > y->off;
}

/* Whether two intervals are alive at a common position (an interval with
 * pieces is alive only in them). */
static int pieces(const interval *x, int lo[MAX_PIECES], int hi[MAX_PIECES]) {
    if (!x->np) {
        lo[0] = x->start, hi[0] = x->end;
        return 1;
    }
    memcpy(lo, x->lo, sizeof(int) * (size_t)x->np);
    memcpy(hi, x->hi, sizeof(int) * (size_t)x->np);
    return x->np;
}

static int overlap(const interval *x, const interval *y) {
    if (!(x->start <= y->end && y->start <= x->end)) return 0;
    if (!x->np && !y->np) return 1;
    int xl[MAX_PIECES], xh[MAX_PIECES], yl[MAX_PIECES], yh[MAX_PIECES];
    const int nx = pieces(x, xl, xh), ny = pieces(y, yl, yh);
    for (int i = 0; i < nx; i++)
        for (int j = 0; j < ny; j++)
            if (xl[i] <= yh[j] && yl[j] <= xh[i]) return 1;
    return 0;
}

/* Greedy-by-size placement; returns the region size. */
static ts_status place(interval *iv, int n, size_t *total) {
    qsort(iv, (size_t)n, sizeof *iv, cmp_size_desc);
    interval **live = ts_alloc(sizeof(interval *) * (size_t)(n + 1), "memplan");
    if (!live) return TS_ERR_NOMEM;
    size_t top = 0;
    for (int i = 0; i < n; i++) {
        int k = 0;
        for (int j = 0; j < i; j++)
            if (overlap(&iv[j], &iv[i])) live[k++] = &iv[j];
        qsort(live, (size_t)k, sizeof *live, cmp_off);
        size_t off = 0;
        for (int j = 0; j < k; j++) {
            if (live[j]->off >= off + iv[i].bytes) break;
            size_t e = TS_ALIGN_UP(live[j]->off + live[j]->bytes, TS_ALIGN);
            if (e > off) off = e;
        }
        iv[i].off = off;
        if (off + iv[i].bytes > top) top = off + iv[i].bytes;
    }
    free(live);
    *total = TS_ALIGN_UP(top, TS_ALIGN);
    return TS_OK;
}

void ts_memplan_free(ts_memplan *mp) {
    free(mp->off);
    free(mp->scratch_off);
    free(mp->scratch_bytes);
    free(mp->alias_skip);
    memset(mp, 0, sizeof *mp);
}

/* ZeRO-2: a reduce_scatter_start whose bucket memplan plans as one
 * temporary (distribute.c sets a.bucket.zero = 2). */
static int released_bucket(const ts_node *n) {
    return n->op == TS_OP_REDUCE_SCATTER_START && n->a.bucket.zero >= 2;
}

/* ZeRO-3: an all_gather_start of a bucket's parameters from the rank's
 * block (zero3.c): inputs (block, p1..pk). */
static int zero3_gather(const ts_node *n) {
    return n->op == TS_OP_ALL_GATHER_START && n->a.bucket.zero == 3;
}

/* ZeRO-3: the parameters of the bucket whose first gather is node i as one
 * interval (bucket 2), laid out as its gradients (goff), alive in one piece
 * per gather of the bucket's block: from the gather's start to the last
 * reader before the next gather. */
static interval params_interval(const ts_graph *g, int i, const int32_t *root, const int *pos,
                                const int32_t *order, int n_order, const int *pbucket,
                                size_t *goff) {
    const ts_node *n = &g->nodes[i];
    interval iv = {.id = i, .start = pos[i], .end = pos[i], .bucket = 2};
    size_t cur = 0;
    for (int j = 1; j < n->n_in; j++) {
        int32_t r = root[n->in[j]];
        if (goff[r] != SIZE_MAX) continue;
        goff[r] = cur;
        iv.bytes = cur + ts_type_bytes(&g->values[r].t);
        cur = TS_ALIGN_UP(iv.bytes, TS_ALIGN);
    }
    for (int k = pos[i]; k < n_order; k++) {
        const ts_node *w = &g->nodes[order[k]];
        if (w->op == TS_OP_ALL_GATHER_START && w->a.bucket.zero == 3 && w->in[0] == n->in[0] &&
            iv.np < MAX_PIECES) {
            iv.lo[iv.np] = iv.hi[iv.np] = k;
            iv.np++;
        }
        for (int j = 0; j < w->n_in; j++) {
            if (pbucket[root[w->in[j]]] != i) continue;
            iv.end = k;
            iv.hi[iv.np - 1] = k;
        }
    }
    if (iv.np == 1) iv.np = 0;
    return iv;
}

/* ZeRO with shared parameters, fused: a shard_update that reads the
 * bucket's gradients of every rank (distribute.c) has the bucket's k
 * parameters, then its k gradients, as inputs; returns k (0: another
 * node). */
static int fused_bucket(const ts_node *n) {
    return n->op == TS_OP_SHARD_UPDATE && n->a.shard.fused_ranks > 0 ? (int)n->a.shard.n_params : 0;
}

/* The bucket of start node i as one interval: its gradients at their
 * persistent-layout offsets from the bucket's base (goff), alive from the
 * first gradient's producer to the bucket's reduce_scatter_wait (or a
 * later reader). */
static interval bucket_interval(const ts_graph *g, int i, const int32_t *root, const int *pos,
                                const int *last, const int32_t *order, int n_order, size_t *goff) {
    const ts_node *n = &g->nodes[i];
    interval iv = {.id = i, .start = pos[i], .end = pos[i], .bucket = 1};
    size_t cur = 0;
    for (int j = 0; j < n->n_in; j++) {
        int32_t r = root[n->in[j]];
        if (goff[r] != SIZE_MAX) continue; /* the same tensor twice */
        goff[r] = cur;
        iv.bytes = cur + ts_type_bytes(&g->values[r].t);
        cur = TS_ALIGN_UP(iv.bytes, TS_ALIGN);
        int st = pos[g->values[r].node];
        if (st < iv.start) iv.start = st;
        if (last[r] > iv.end) iv.end = last[r];
    }
    for (int k = 0; k < n_order; k++) {
        const ts_node *w = &g->nodes[order[k]];
        if (w->op == TS_OP_REDUCE_SCATTER_WAIT && g->values[w->in[0]].node == i && k > iv.end)
            iv.end = k;
    }
    return iv;
}

static int observable(const ts_value *v) {
    return v->is_output || v->grad_of >= 0;
}

ts_status ts_pass_memplan(const ts_graph *g, const int32_t *order, int n_order, int allow_inplace,
                          ts_memplan *mp) {
    int nv = g->n_values, nn = g->n_nodes;
    memset(mp, 0, sizeof *mp);
    ts_status s = TS_OK;
    int32_t *root = ts_alloc(sizeof(int32_t) * (size_t)(nv + 1), "memplan");
    int *pos = ts_alloc(sizeof(int) * (size_t)(nn + 1), "memplan");
    int *last = ts_alloc(sizeof(int) * (size_t)(nv + 1), "memplan");
    char *pinned = ts_zalloc((size_t)nv + 1, "memplan");
    size_t *goff = ts_alloc(sizeof(size_t) * (size_t)(nv + 1), "memplan"); /* ZeRO-2 */
    int *pbucket = ts_alloc(sizeof(int) * (size_t)(nv + 1), "memplan");    /* ZeRO-3 */
    interval *iv = ts_alloc(sizeof(interval) * (size_t)(nv + nn + 1), "memplan");
    mp->off = ts_alloc(sizeof(size_t) * (size_t)(nv + 1), "memplan");
    mp->scratch_off = ts_zalloc(sizeof(size_t) * (size_t)(nn + 1), "memplan");
    mp->scratch_bytes = ts_zalloc(sizeof(size_t) * (size_t)(nn + 1), "memplan");
    mp->alias_skip = ts_zalloc((size_t)nn + 1, "memplan");
    if (!root || !pos || !last || !pinned || !goff || !pbucket || !iv || !mp->off ||
        !mp->scratch_off || !mp->scratch_bytes || !mp->alias_skip) {
        s = TS_ERR_NOMEM;
        goto done;
    }
    for (int i = 0; i < nn; i++) pos[i] = -1;
    for (int k = 0; k < n_order; k++) pos[order[k]] = k;
    ts_view_roots(g, root);
    for (int v = 0; v < nv; v++) {
        const ts_value *val = &g->values[v];
        if (val->kind == TS_VK_NODE && (ts_op_get(g->nodes[val->node].op)->flags & TS_OPF_ALIAS))
            mp->alias_skip[val->node] = 1;
        mp->naive_bytes += ts_type_bytes(&val->t);
        mp->off[v] = goff[v] = SIZE_MAX;
    }
    /* Pinned roots: everything persistent or observable. */
    for (int v = 0; v < nv; v++) {
        const ts_value *val = &g->values[v];
        if (val->kind != TS_VK_NODE || observable(val)) pinned[root[v]] = 1;
    }
    /* Last use of each root, over every view of it. */
    for (int v = 0; v < nv; v++) {
        const ts_value *val = &g->values[v];
        last[v] = val->kind == TS_VK_NODE ? pos[val->node] : -1;
    }
    for (int k = 0; k < n_order; k++) {
        const ts_node *n = &g->nodes[order[k]];
        for (int j = 0; j < n->n_in; j++)
            if (last[root[n->in[j]]] < k) last[root[n->in[j]]] = k;
    }
    /* In-place: output 0 takes input 0's (or, for TS_OPF_INPLACE_IN1, input
     * 1's) storage when that input dies here. */
    for (int k = 0; allow_inplace && k < n_order; k++) {
        int i = order[k];
        const ts_node *n = &g->nodes[i];
        unsigned fl = ts_op_get(n->op)->flags;
        int src = (fl & TS_OPF_INPLACE) ? 0 : (fl & TS_OPF_INPLACE_IN1) ? 1 : -1;
        if (src < 0 || n->n_out < 1 || n->n_in <= src) continue;
        int32_t r = root[n->in[src]], o = n->out[0];
        if (pinned[r] || pinned[o] || last[r] != k || root[o] != o) continue;
        if (ts_type_bytes(&g->values[r].t) != ts_type_bytes(&g->values[o].t)) continue;
        int clash = 0;
        for (int j = 0; j < n->n_in; j++)
            clash |= j != src && root[n->in[j]] == r && n->in[j] != n->in[src];
        if (clash) continue;
        /* o's views now point at r; r lives as long as o did. */
        for (int v = 0; v < nv; v++)
            if (root[v] == o) root[v] = r;
        last[r] = last[o] > k ? last[o] : k;
        mp->n_inplace++;
    }

    /* ZeRO-3: the parameters gathered per bucket (pbucket: the bucket's
     * first gather node, -1 for other values) are temporaries. */
    for (int v = 0; v < nv; v++) pbucket[v] = -1;
    int n_z3 = 0;
    for (int k = 0; k < n_order; k++) {
        const ts_node *n = &g->nodes[order[k]];
        if (!zero3_gather(n) || pbucket[root[n->in[1]]] >= 0) continue;
        for (int j = 1; j < n->n_in; j++) pbucket[root[n->in[j]]] = order[k];
        n_z3++;
    }

    /* Persistent regions, in value order (params in declaration order). */
    size_t cur = 0;
    mp->param_off = cur;
    /* ZeRO: parameters in their gradients' bucket order (the inputs of the
     * reduce_scatter_start nodes), so a bucket's parameter range mirrors
     * its gradient range element for element. */
    for (int i = 0; i < nn; i++) {
        const ts_node *n = &g->nodes[i];
        int k = fused_bucket(n);
        if (n->op != TS_OP_REDUCE_SCATTER_START && !k) continue;
        for (int j = 0; j < (k ? k : n->n_in); j++) {
            int32_t p = k ? n->in[j] : g->values[n->in[j]].grad_of;
            if (p >= 0 && mp->off[p] == SIZE_MAX && pbucket[p] < 0) {
                mp->off[p] = cur;
                cur = TS_ALIGN_UP(cur + ts_type_bytes(&g->values[p].t), TS_ALIGN);
            }
        }
    }
    for (int v = 0; v < nv; v++)
        if (g->values[v].kind == TS_VK_PARAM && mp->off[v] == SIZE_MAX && pbucket[v] < 0) {
            mp->off[v] = cur;
            cur = TS_ALIGN_UP(cur + ts_type_bytes(&g->values[v].t), TS_ALIGN);
        }
    mp->param_bytes = cur - mp->param_off;
    mp->grad_off = cur;
    /* ZeRO-2 buckets go to the temporaries (below): their gradients'
     * offsets inside the bucket now, the bucket's base later. */
    int n_rel = 0;
    for (int i = 0; i < nn; i++)
        if (released_bucket(&g->nodes[i])) {
            iv[n_rel++] = bucket_interval(g, i, root, pos, last, order, n_order, goff);
            mp->zero_grad_bytes += TS_ALIGN_UP(iv[n_rel - 1].bytes, TS_ALIGN);
            mp->zero_shard_bytes += ts_type_bytes(&g->values[g->nodes[i].out[1]].t);
        }
    /* ZeRO-3: each bucket's parameters, after the gradient buckets. */
    const int z3_lo = n_rel;
    for (int k = 0; k < n_order && n_z3 > 0; k++) {
        const int i = order[k];
        if (!zero3_gather(&g->nodes[i]) || pbucket[root[g->nodes[i].in[1]]] != i) continue;
        iv[n_rel++] = params_interval(g, i, root, pos, order, n_order, pbucket, goff);
        mp->zero_param_bytes += TS_ALIGN_UP(iv[n_rel - 1].bytes, TS_ALIGN);
    }
    /* Gradients of data-parallel buckets first, bucket by bucket (the
     * inputs of the allreduce_start nodes, which the distribute pass adds
     * in bucket order), so each bucket is one contiguous range. */
    for (int i = 0; i < nn; i++) {
        const ts_node *n = &g->nodes[i];
        const int k = fused_bucket(n);
        if (n->op != TS_OP_ALLREDUCE_START && n->op != TS_OP_REDUCE_SCATTER_START && !k) continue;
        if (released_bucket(n)) continue;
        for (int j = k; j < (k ? 2 * k : n->n_in); j++)
            if (mp->off[root[n->in[j]]] == SIZE_MAX) {
                mp->off[root[n->in[j]]] = cur;
                cur = TS_ALIGN_UP(cur + ts_type_bytes(&g->values[n->in[j]].t), TS_ALIGN);
            }
    }
    for (int p = 0; p < nv; p++) {
        if (g->values[p].kind != TS_VK_PARAM) continue;
        for (int v = 0; v < nv; v++)
            if (g->values[v].grad_of == p) {
                if (mp->off[root[v]] != SIZE_MAX || goff[root[v]] != SIZE_MAX) break;
                mp->off[root[v]] = cur;
                cur = TS_ALIGN_UP(cur + ts_type_bytes(&g->values[v].t), TS_ALIGN);
                break;
            }
    }
    mp->grad_bytes = cur - mp->grad_off;
    mp->state_off = cur;
    for (int v = 0; v < nv; v++)
        if (g->values[v].kind == TS_VK_STATE) {
            mp->off[v] = cur;
            cur = TS_ALIGN_UP(cur + ts_type_bytes(&g->values[v].t), TS_ALIGN);
        }
    mp->state_bytes = cur - mp->state_off;
    mp->io_off = cur;
    for (int v = 0; v < nv; v++) {
        const ts_value *val = &g->values[v];
        int32_t r = root[v];
        if (!pinned[r] || mp->off[r] != SIZE_MAX || goff[r] != SIZE_MAX) continue;
        if (val->kind == TS_VK_INPUT || val->kind == TS_VK_CONST || val->kind == TS_VK_NODE) {
            mp->off[r] = cur;
            cur = TS_ALIGN_UP(cur + ts_type_bytes(&g->values[r].t), TS_ALIGN);
        }
    }
    mp->io_bytes = cur - mp->io_off;

    /* Intermediates and scratch: liveness intervals (after the ZeRO-2
     * buckets, iv[0, n_rel)). */
    int ni = n_rel;
    for (int a = 0; a < z3_lo; a++) { /* most bucket bytes alive at once */
        size_t at = 0;
        for (int b = 0; b < z3_lo; b++)
            if (iv[b].start <= iv[a].start && iv[a].start <= iv[b].end) at += iv[b].bytes;
        if (at > mp->zero_grad_peak) mp->zero_grad_peak = at;
    }
    for (int a = z3_lo; a < n_rel; a++) { /* ZeRO-3: most gathered parameter bytes at once */
        int lo[MAX_PIECES], hi[MAX_PIECES];
        const int np = pieces(&iv[a], lo, hi);
        for (int e = 0; e < np; e++) { /* the sum only grows at the start of a piece */
            const interval pt = {.start = lo[e], .end = lo[e]};
            size_t at = 0;
            for (int b = z3_lo; b < n_rel; b++) at += overlap(&iv[b], &pt) ? iv[b].bytes : 0;
            if (at > mp->zero_param_peak) mp->zero_param_peak = at;
        }
    }
    for (int v = 0; v < nv; v++) {
        if (root[v] != v || pinned[v] || g->values[v].kind != TS_VK_NODE) continue;
        int st = pos[g->values[v].node];
        iv[ni++] = (interval){.id = v,
                              .start = st,
                              .end = last[v] > st ? last[v] : st,
                              .bytes = ts_type_bytes(&g->values[v].t)};
    }
    for (int i = 0; i < nn; i++) {
        const ts_op_def *def = ts_op_get(g->nodes[i].op);
        size_t sb = def->scratch ? def->scratch(g, &g->nodes[i]) : 0;
        mp->scratch_bytes[i] = sb;
        mp->naive_bytes += sb;
        if (sb) iv[ni++] = (interval){.id = -(i + 1), .start = pos[i], .end = pos[i], .bytes = sb};
    }
    size_t temp_total = 0;
    if ((s = place(iv, ni, &temp_total)) != TS_OK) goto done;
    mp->temp_off = cur;
    mp->temp_bytes = temp_total;
    for (int i = 0; i < ni; i++) {
        if (iv[i].bucket) {
            const ts_node *n = &g->nodes[iv[i].id];
            for (int j = iv[i].bucket == 2; j < n->n_in; j++) /* ZeRO-3: not the block */
                mp->off[root[n->in[j]]] = cur + iv[i].off + goff[root[n->in[j]]];
        } else if (iv[i].id >= 0)
            mp->off[iv[i].id] = cur + iv[i].off;
        else
            mp->scratch_off[-iv[i].id - 1] = cur + iv[i].off;
    }
    mp->arena_bytes = cur + temp_total;
    for (int v = 0; v < nv; v++) {
        mp->off[v] = mp->off[root[v]];
        if (mp->off[v] == SIZE_MAX) {
            char lb[32];
            s = ts_fail(TS_ERR_INTERNAL, "memplan: value '%s' got no memory",
                        ts_value_label(g, v, lb, sizeof lb));
            goto done;
        }
    }
done:
    free(root);
    free(pos);
    free(last);
    free(pinned);
    free(goff);
    free(pbucket);
    free(iv);
    if (s != TS_OK) ts_memplan_free(mp);
    return s;
}
