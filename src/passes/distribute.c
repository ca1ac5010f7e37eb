/* distribute: data parallelism in the step graph. Runs on a scheduled
 * training graph when the plan has a comm of more than one rank.
 *
 * Gradients are sorted by the position in the schedule where each becomes
 * final (roughly reverse layer order) and grouped into buckets: the first
 * one small (first_bucket_bytes) so communication starts early, the rest
 * up to bucket_bytes, a new bucket at every change of dtype. Per bucket the
 * pass adds an allreduce_start node, placed in the order right after the
 * bucket's last gradient is written, and an allreduce_wait node, placed
 * right before the first later node that reads one of its gradients (the
 * clip coefficient or the optimizer update; the end of the step if none).
 * Everything scheduled between the two (the rest of the backward pass)
 * overlaps the all-reduce. Readers get a control dependency on the wait.
 *
 * The memory planner then lays out the gradients bucket by bucket (the
 * inputs of the start nodes in node order), so each bucket is one
 * contiguous range and one collective. */
#include <stdlib.h>
#include <string.h>
#include "passes.h"

typedef struct grad_ref {
    int32_t v; /* gradient value */
    int ready; /* position in the order where it is final */
    size_t bytes;
} grad_ref;

static int cmp_ready(const void *a, const void *b) {
    const grad_ref *x = a, *y = b;
    if (x->ready != y->ready) return x->ready < y->ready ? -1 : 1;
    return (x->v > y->v) - (x->v < y->v);
}

static int is_alias(const ts_graph *g, int node) {
    return (ts_op_get(g->nodes[node].op)->flags & TS_OPF_ALIAS) != 0;
}

ts_status ts_pass_distribute(ts_graph *g, int32_t **order_io, int *n_order_io,
                             const ts_dist_spec *d, int *n_buckets) {
    *n_buckets = 0;
    const int nn = g->n_nodes, nv = g->n_values, n_order = *n_order_io;
    const int32_t *order = *order_io;
    ts_status s = TS_OK;
    int *pos = ts_alloc(sizeof(int) * (size_t)(nn + 1), "distribute");
    int32_t *root = ts_alloc(sizeof(int32_t) * (size_t)(nv + 1), "distribute");
    int *bucket_of = ts_alloc(sizeof(int) * (size_t)(nv + 1), "distribute"); /* per root */
    grad_ref *gr = ts_alloc(sizeof(grad_ref) * (size_t)(nv + 1), "distribute");
    int *first = NULL, *start_at = NULL, *wait_at = NULL;
    int32_t *start_node = NULL, *wait_node = NULL, *out = NULL;
    if (!pos || !root || !bucket_of || !gr) {
        s = TS_ERR_NOMEM;
        goto done;
    }
    for (int i = 0; i < nn; i++) pos[i] = -1;
    for (int k = 0; k < n_order; k++) pos[order[k]] = k;
    for (int v = 0; v < nv; v++) {
        const ts_value *val = &g->values[v];
        root[v] = v;
        if (val->kind == TS_VK_NODE && is_alias(g, val->node))
            root[v] = root[g->nodes[val->node].in[0]];
        bucket_of[v] = -1;
    }
    /* One entry per gradient storage root. */
    int ng = 0;
    for (int v = 0; v < nv; v++) {
        const ts_value *val = &g->values[v];
        if (val->grad_of < 0 || val->kind != TS_VK_NODE || bucket_of[root[v]] == -2) continue;
        ts_dtype dt = val->t.dtype;
        if (dt != TS_F32 && dt != TS_F64) {
            char lb[32];
            s = ts_fail(TS_ERR_UNSUPPORTED,
                        "distribute: gradient '%s' is %s; data-parallel training averages f32 "
                        "and f64 gradients only",
                        ts_value_label(g, v, lb, sizeof lb), ts_dtype_name(dt));
            goto done;
        }
        bucket_of[root[v]] = -2; /* seen */
        gr[ng++] = (grad_ref){v, pos[val->node], ts_type_bytes(&val->t)};
    }
    if (ng == 0) goto done;
    qsort(gr, (size_t)ng, sizeof *gr, cmp_ready);

    /* Buckets: [first[b], first[b + 1]) of gr. */
    first = ts_alloc(sizeof(int) * (size_t)(ng + 1), "distribute");
    if (!first) {
        s = TS_ERR_NOMEM;
        goto done;
    }
    int nb = 0;
    size_t fill = 0;
    for (int i = 0; i < ng; i++) {
        size_t cap = nb <= 1 ? d->first_bucket_bytes : d->bucket_bytes;
        int dtype_change = i > 0 && g->values[gr[i].v].t.dtype != g->values[gr[i - 1].v].t.dtype;
        if (i == 0 || dtype_change || fill >= cap) {
            first[nb++] = i;
            fill = 0;
        }
        fill += gr[i].bytes;
        bucket_of[root[gr[i].v]] = nb - 1;
    }
    first[nb] = ng;

    /* Where each bucket starts (after its last gradient) and waits (before
     * the first later reader of any of its gradients; n_order: the end). */
    start_at = ts_alloc(sizeof(int) * (size_t)(nb + 1), "distribute");
    wait_at = ts_alloc(sizeof(int) * (size_t)(nb + 1), "distribute");
    start_node = ts_alloc(sizeof(int32_t) * (size_t)(nb + 1), "distribute");
    wait_node = ts_alloc(sizeof(int32_t) * (size_t)(nb + 1), "distribute");
    if (!start_at || !wait_at || !start_node || !wait_node) {
        s = TS_ERR_NOMEM;
        goto done;
    }
    for (int b = 0; b < nb; b++) {
        start_at[b] = gr[first[b + 1] - 1].ready;
        wait_at[b] = n_order;
    }
    for (int k = 0; k < n_order; k++) {
        const ts_node *n = &g->nodes[order[k]];
        if (is_alias(g, order[k])) continue; /* a view reads nothing */
        for (int j = 0; j < n->n_in; j++) {
            int b = bucket_of[root[n->in[j]]];
            if (b >= 0 && k > start_at[b] && k < wait_at[b]) wait_at[b] = k;
        }
    }

    /* The nodes. */
    for (int b = 0; b < nb && s == TS_OK; b++) {
        int k = 0;
        ts_val *args =
            ts_alloc(sizeof(ts_val) * (size_t)(first[b + 1] - first[b] + 1), "distribute");
        if (!args) {
            s = TS_ERR_NOMEM;
            break;
        }
        for (int i = first[b]; i < first[b + 1]; i++) args[1 + k++] = ts_mkval(gr[i].v);
        ts_attrs a = ts_attrs_zero();
        a.i[0] = b;
        a.i[1] = d->algo;
        char name[64];
        ts_val tok = ts_node_add(g, TS_OP_ALLREDUCE_START, k, args + 1, &a, NULL);
        if ((s = ts_graph_status(g)) == TS_OK) {
            snprintf(name, sizeof name, "bucket%d.start", b);
            s = ts_set_name(g, tok, name);
        }
        if (s == TS_OK) {
            start_node[b] = g->values[tok.id].node;
            args[0] = tok;
            ts_val w = ts_node_add(g, TS_OP_ALLREDUCE_WAIT, k + 1, args, &a, NULL);
            if ((s = ts_graph_status(g)) == TS_OK) {
                snprintf(name, sizeof name, "bucket%d.wait", b);
                s = ts_set_name(g, w, name);
                wait_node[b] = g->values[w.id].node;
            }
        }
        free(args);
    }
    if (s != TS_OK) goto done;
    /* Readers after the start depend on the wait (the graph says what the
     * order does). */
    for (int k = 0; k < n_order && s == TS_OK; k++) {
        int i = order[k];
        const ts_node *n = &g->nodes[i];
        if (is_alias(g, i)) continue;
        for (int j = 0; j < n->n_in && s == TS_OK; j++) {
            int b = bucket_of[root[n->in[j]]];
            if (b >= 0 && k > start_at[b]) s = ts_node_add_ctrl(g, i, wait_node[b]);
        }
    }
    if (s != TS_OK) goto done;

    /* The new order: waits before their position, starts after theirs. */
    out = ts_alloc(sizeof(int32_t) * (size_t)(n_order + 2 * nb + 1), "distribute");
    if (!out) {
        s = TS_ERR_NOMEM;
        goto done;
    }
    int m = 0;
    for (int k = 0; k <= n_order; k++) {
        for (int b = 0; b < nb; b++)
            if (wait_at[b] == k) out[m++] = wait_node[b];
        if (k == n_order) break;
        out[m++] = order[k];
        for (int b = 0; b < nb; b++)
            if (start_at[b] == k) out[m++] = start_node[b];
    }
    free(*order_io);
    *order_io = out;
    *n_order_io = m;
    out = NULL;
    *n_buckets = nb;
done:
    free(pos);
    free(root);
    free(bucket_of);
    free(gr);
    free(first);
    free(start_at);
    free(wait_at);
    free(start_node);
    free(wait_node);
    free(out);
    return s;
}
