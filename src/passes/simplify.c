/* simplify: constant folding, common-subexpression elimination and
 * dead-code elimination, then compaction of the graph. */
#include <stdlib.h>
#include <string.h>
#include "passes.h"

/* Values a user can observe: they must survive every rewrite as they are. */
static int observable(const ts_value *v) {
    return v->is_output || v->grad_of >= 0;
}

/* Fold nodes whose inputs are all constants by running the reference
 * kernel once at compile time. Limited to modest sizes so a compile does
 * not balloon the constant region. */
#define FOLD_MAX_BYTES (1 << 20)

static ts_status fold_constants(ts_graph *g) {
    for (int i = 0; i < g->n_nodes; i++) {
        ts_node *n = &g->nodes[i];
        const ts_op_def *def = ts_op_get(n->op);
        if (n->dead || n->n_out != 1 || (def->flags & (TS_OPF_RANDOM | TS_OPF_SIDE_EFFECT)))
            continue;
        int all_const = 1;
        for (int j = 0; j < n->n_in; j++) all_const &= g->values[n->in[j]].kind == TS_VK_CONST;
        ts_value *ov = &g->values[n->out[0]];
        if (!all_const || observable(ov) || ts_type_bytes(&ov->t) > FOLD_MAX_BYTES) continue;
        ts_tensor in[16], out;
        if (n->n_in > 16) continue;
        for (int j = 0; j < n->n_in; j++) {
            const ts_value *iv = &g->values[n->in[j]];
            in[j].dtype = iv->t.dtype;
            in[j].rank = iv->t.rank;
            memcpy(in[j].dims, iv->t.dims, sizeof in[j].dims);
            in[j].data = iv->data;
        }
        out.dtype = ov->t.dtype;
        out.rank = ov->t.rank;
        memcpy(out.dims, ov->t.dims, sizeof out.dims);
        size_t sb = def->scratch ? def->scratch(g, n) : 0;
        out.data = ts_aligned_alloc(ts_type_bytes(&ov->t), "constant folding");
        void *scratch = sb ? ts_aligned_alloc(sb, "constant folding") : NULL;
        if (!out.data || (sb && !scratch)) {
            ts_aligned_free(out.data);
            ts_aligned_free(scratch);
            return TS_ERR_NOMEM;
        }
        ts_step_ctx ctx = {1, 0, 0, 1};
        ts_kargs k = {&n->a, n->n_in, 1, in, &out, scratch, sb, &ctx, "constant", NULL};
        ts_status s = def->kernel(&k);
        ts_aligned_free(scratch);
        if (s != TS_OK) {
            /* Not foldable (e.g. an index error the step would also report):
             * leave the node to fail at run time with its real name. */
            ts_aligned_free(out.data);
            continue;
        }
        void *data = ts_alloc(ts_type_bytes(&ov->t), "constant");
        if (!data) {
            ts_aligned_free(out.data);
            return TS_ERR_NOMEM;
        }
        memcpy(data, out.data, ts_type_bytes(&ov->t));
        ts_aligned_free(out.data);
        ov->kind = TS_VK_CONST;
        ov->node = -1;
        ov->data = data;
        n->dead = 1;
    }
    return TS_OK;
}

/* Replace every use of value `from` by `to` in nodes after `start`. */
static void replace_uses(ts_graph *g, int start, int32_t from, int32_t to) {
    for (int i = start; i < g->n_nodes; i++) {
        ts_node *n = &g->nodes[i];
        for (int j = 0; j < n->n_in; j++)
            if (n->in[j] == from) n->in[j] = to;
    }
}

static uint64_t node_hash(const ts_node *n) {
    uint64_t h = ts_hash64(&n->op, sizeof n->op, 0);
    h = ts_hash64(n->in, sizeof(int32_t) * (size_t)n->n_in, h);
    if (n->recompute) h = ts_hash64(&n->recompute, sizeof n->recompute, h);
    return ts_hash64(&n->a, sizeof n->a, h);
}

static int same_node(const ts_node *a, const ts_node *b) {
    if (a->op != b->op || a->n_in != b->n_in || a->recompute != b->recompute ||
        memcmp(&a->a, &b->a, sizeof a->a))
        return 0;
    return memcmp(a->in, b->in, sizeof(int32_t) * (size_t)a->n_in) == 0;
}

/* Constants with identical type and bytes become one value. */
static void merge_constants(ts_graph *g) {
    for (int i = 0; i < g->n_values; i++) {
        ts_value *a = &g->values[i];
        if (a->kind != TS_VK_CONST || observable(a) || ts_type_bytes(&a->t) > 64) continue;
        for (int j = i + 1; j < g->n_values; j++) {
            ts_value *b = &g->values[j];
            if (b->kind != TS_VK_CONST || observable(b) || !ts_type_equal(&a->t, &b->t) ||
                memcmp(a->data, b->data, ts_type_bytes(&a->t)))
                continue;
            replace_uses(g, 0, j, i);
        }
    }
}

static ts_status cse(ts_graph *g) {
    int cap = 1;
    while (cap < 2 * g->n_nodes) cap *= 2;
    int32_t *table = ts_alloc(sizeof(int32_t) * (size_t)cap, "cse");
    if (!table) return TS_ERR_NOMEM;
    for (int i = 0; i < cap; i++) table[i] = -1;
    for (int i = 0; i < g->n_nodes; i++) {
        ts_node *n = &g->nodes[i];
        const ts_op_def *def = ts_op_get(n->op);
        if (n->dead || n->n_out == 0 || (def->flags & (TS_OPF_RANDOM | TS_OPF_SIDE_EFFECT)))
            continue;
        int obs = 0;
        for (int j = 0; j < n->n_out; j++) obs |= observable(&g->values[n->out[j]]);
        if (obs) continue;
        uint64_t h = node_hash(n);
        int slot = (int)(h & (uint64_t)(cap - 1));
        while (table[slot] >= 0 && !same_node(&g->nodes[table[slot]], n))
            slot = (slot + 1) & (cap - 1);
        if (table[slot] < 0) {
            table[slot] = i;
            continue;
        }
        const ts_node *keep = &g->nodes[table[slot]];
        for (int j = 0; j < n->n_out; j++) replace_uses(g, i + 1, n->out[j], keep->out[j]);
        n->dead = 1;
    }
    free(table);
    return TS_OK;
}

static ts_status dce(ts_graph *g) {
    char *live = ts_zalloc((size_t)g->n_values + 1, "dce");
    if (!live) return TS_ERR_NOMEM;
    for (int i = 0; i < g->n_values; i++) live[i] = observable(&g->values[i]);
    for (int i = g->n_nodes - 1; i >= 0; i--) {
        ts_node *n = &g->nodes[i];
        if (n->dead) continue;
        int keep = (ts_op_get(n->op)->flags & TS_OPF_SIDE_EFFECT) != 0;
        for (int j = 0; j < n->n_out; j++) keep |= live[n->out[j]];
        if (!keep) {
            n->dead = 1;
            continue;
        }
        for (int j = 0; j < n->n_in; j++) live[n->in[j]] = 1;
    }
    free(live);
    return TS_OK;
}

ts_status ts_pass_simplify(ts_graph *g, int32_t **remap) {
    ts_status s;
    if ((s = fold_constants(g)) != TS_OK) return s;
    merge_constants(g);
    if ((s = cse(g)) != TS_OK) return s;
    if ((s = dce(g)) != TS_OK) return s;
    int32_t *map = ts_alloc(sizeof(int32_t) * (size_t)(g->n_values + 1), "simplify");
    if (!map) return TS_ERR_NOMEM;
    if ((s = ts_graph_compact(g, map)) != TS_OK) {
        free(map);
        return s;
    }
    if (remap)
        *remap = map;
    else
        free(map);
    return TS_OK;
}
