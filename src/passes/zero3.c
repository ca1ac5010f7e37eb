/* ZeRO-3: the parameters sharded over the ranks too (dist.zero 3).
 *
 * The distribute pass (distribute.c, zero_rewrite) builds ZeRO-2's graph
 * with one change: between steps a bucket's parameters live only as the
 * rank's block of the bucket's flat range, a state value
 * "zero.bucket<b>.param" (ts_comm_block of its elements), which
 * shard_update reads and writes. This file gives the parameters back to
 * the step: per bucket an all_gather_start (attribute bucket.zero = 3,
 * inputs: the block, then the bucket's parameters) copies every rank's
 * block into the parameters, and its all_gather_wait comes before the
 * first reader. It does so twice per step:
 *
 *   forward:   gather(b) before the first use of b's parameters up to the loss
 *   backward:  gather(b) again before their first use after the loss
 *
 * The parameters themselves are no longer persistent: memplan plans each
 * bucket's parameters as one temporary (laid out as the gradients, 64-byte
 * padding between tensors), alive from the forward gather to the last
 * forward use and again from the backward gather to the last use, and
 * free in between (a hole the planner may fill with activations).
 *
 * Prefetch (the default; ts_compile_options.zero_no_prefetch turns it
 * off): the buckets are gathered in the order of their first use, and the
 * start of the next one is placed right before the wait of the current
 * one, so the gather of bucket i + 1 runs while bucket i's layer computes
 * (two buckets' parameters alive at once instead of one). */
#include <stdlib.h>
#include <string.h>
#include "passes.h"
#include "tessel/dist.h"

typedef struct phase_use {
    int first, last; /* positions in the order; first < 0: no use in this phase */
    int b;
} phase_use;

static int cmp_first(const void *a, const void *b) {
    const phase_use *x = a, *y = b;
    if (x->first != y->first) return x->first < y->first ? -1 : 1;
    return (x->b > y->b) - (x->b < y->b);
}

/* The start and wait of one gather of bucket zb (ticket slot `ticket`);
 * *start, *wait their node ids. */
static ts_status add_gather(ts_graph *g, const ts_zero3_bucket *zb, int b, int ticket,
                            const ts_dist_spec *d, const char *phase, int32_t *start,
                            int32_t *wait) {
    ts_val *args = ts_alloc(sizeof(ts_val) * (size_t)(zb->k + 1), "zero3");
    if (!args) return TS_ERR_NOMEM;
    ts_attrs a = ts_attrs_zero();
    a.bucket.ticket = ticket;
    a.bucket.algo = d->algo;
    a.bucket.elems = zb->elems;
    a.bucket.zero = 3;
    args[0] = ts_mkval(zb->shard);
    for (int i = 0; i < zb->k; i++) args[1 + i] = ts_mkval(zb->params[i]);
    char name[64];
    ts_val tok = ts_node_add(g, TS_OP_ALL_GATHER_START, zb->k + 1, args, &a, NULL);
    ts_status s = ts_graph_status(g);
    if (s == TS_OK) {
        snprintf(name, sizeof name, "bucket%d.gather_%s", b, phase);
        s = ts_set_name(g, tok, name);
    }
    if (s == TS_OK) {
        *start = g->values[tok.id].node;
        args[0] = tok;
        ts_val w = ts_node_add(g, TS_OP_ALL_GATHER_WAIT, zb->k + 1, args, &a, NULL);
        if ((s = ts_graph_status(g)) == TS_OK) {
            snprintf(name, sizeof name, "bucket%d.gathered_%s", b, phase);
            s = ts_set_name(g, w, name);
            *wait = g->values[w.id].node;
        }
    }
    free(args);
    return s;
}

ts_status ts_zero3_gathers(ts_graph *g, int32_t **order_io, int *m_io, const ts_dist_spec *d,
                           const ts_zero3_bucket *zb, int nb) {
    const int m = *m_io, nv = g->n_values;
    const int32_t *order = *order_io;
    ts_status s = TS_OK;
    int32_t *root = ts_alloc(sizeof(int32_t) * (size_t)(nv + 1), "zero3");
    int *bucket_of = ts_alloc(sizeof(int) * (size_t)(nv + 1), "zero3");
    phase_use *use = ts_alloc(sizeof(phase_use) * (size_t)(2 * nb + 1), "zero3");
    int32_t *gs = ts_alloc(sizeof(int32_t) * (size_t)(4 * nb + 1), "zero3"); /* start, wait */
    int *at = ts_alloc(sizeof(int) * (size_t)(2 * nb + 1), "zero3"); /* emit start before k */
    int32_t *out = ts_alloc(sizeof(int32_t) * (size_t)(m + 4 * nb + 1), "zero3");
    if (!root || !bucket_of || !use || !gs || !at || !out) {
        s = TS_ERR_NOMEM;
        goto done;
    }
    for (int v = 0; v < nv; v++) {
        const ts_value *val = &g->values[v];
        root[v] = v;
        if (val->kind == TS_VK_NODE && (ts_op_get(g->nodes[val->node].op)->flags & TS_OPF_ALIAS))
            root[v] = root[g->nodes[val->node].in[0]];
        bucket_of[v] = -1;
    }
    for (int b = 0; b < nb; b++)
        for (int i = 0; i < zb[b].k; i++) bucket_of[zb[b].params[i]] = b;
    /* The loss splits the step into the forward phase and the backward. */
    int lpos = -1;
    const int32_t lnode = d->loss && *d->loss >= 0 ? g->values[*d->loss].node : -1;
    for (int k = 0; k < m; k++)
        if (order[k] == lnode) lpos = k;
    if (lpos < 0) {
        s = ts_fail(TS_ERR_INTERNAL, "distribute: ZeRO-3: the loss is not in the order");
        goto done;
    }
    for (int q = 0; q < 2 * nb; q++) use[q] = (phase_use){-1, -1, q % nb};
    for (int k = 0; k < m; k++) {
        const ts_node *n = &g->nodes[order[k]];
        if (ts_op_get(n->op)->flags & TS_OPF_ALIAS) continue; /* a view reads nothing */
        for (int j = 0; j < n->n_in; j++) {
            int b = bucket_of[root[n->in[j]]];
            if (b < 0) continue;
            phase_use *u = &use[(k > lpos) * nb + b];
            if (u->first < 0) u->first = k;
            u->last = k;
        }
    }
    /* The gathers, phase by phase in the order of first use. */
    for (int ph = 0; ph < 2 && s == TS_OK; ph++) {
        phase_use *u = use + ph * nb;
        for (int b = 0; b < nb && s == TS_OK; b++) {
            gs[2 * (ph * nb + b)] = gs[2 * (ph * nb + b) + 1] = -1;
            if (u[b].first < 0) continue;
            s = add_gather(g, &zb[b], b, (ph + 1) * nb + b, d, ph ? "bwd" : "fwd",
                           &gs[2 * (ph * nb + b)], &gs[2 * (ph * nb + b) + 1]);
        }
    }
    if (s != TS_OK) goto done;
    /* Readers after their phase's wait; each update after the backward's
     * gather (which reads the block it writes). */
    for (int k = 0; k < m && s == TS_OK; k++) {
        const ts_node *n = &g->nodes[order[k]];
        if (ts_op_get(n->op)->flags & TS_OPF_ALIAS) continue;
        for (int j = 0; j < n->n_in && s == TS_OK; j++) {
            int b = bucket_of[root[n->in[j]]];
            if (b >= 0) s = ts_node_add_ctrl(g, order[k], gs[2 * ((k > lpos) * nb + b) + 1]);
        }
    }
    for (int q = 0; q < 2 * nb && s == TS_OK; q++)
        if (gs[2 * q + 1] >= 0) s = ts_node_add_ctrl(g, zb[q % nb].update, gs[2 * q + 1]);
    if (s != TS_OK) goto done;
    /* Where each start goes: before its own wait, or with prefetch before
     * the wait of the bucket gathered before it in its phase. */
    qsort(use, (size_t)nb, sizeof *use, cmp_first);
    qsort(use + nb, (size_t)nb, sizeof *use, cmp_first);
    for (int ph = 0; ph < 2; ph++) {
        const phase_use *u = use + ph * nb;
        int prev = -1;
        for (int i = 0; i < nb; i++) {
            if (u[i].first < 0) continue;
            const int q = ph * nb + u[i].b;
            at[q] = !d->no_prefetch && prev >= 0 ? use[prev].first : u[i].first;
            prev = ph * nb + i;
        }
    }
    int w = 0;
    for (int k = 0; k < m; k++) {
        for (int ph = 0; ph < 2; ph++) {
            const phase_use *u = use + ph * nb;
            /* At k: the starts of the buckets first used here (not
             * prefetched), then the prefetched next ones, then the waits;
             * the communication thread runs the gathers in start order. */
            for (int i = 0; i < nb; i++)
                if (u[i].first == k && at[ph * nb + u[i].b] == k)
                    out[w++] = gs[2 * (ph * nb + u[i].b)];
            for (int i = 0; i < nb; i++)
                if (u[i].first >= 0 && u[i].first != k && at[ph * nb + u[i].b] == k)
                    out[w++] = gs[2 * (ph * nb + u[i].b)];
            for (int i = 0; i < nb; i++)
                if (u[i].first == k) out[w++] = gs[2 * (ph * nb + u[i].b) + 1];
        }
        out[w++] = order[k];
    }
    free(*order_io);
    *order_io = out;
    *m_io = w;
    out = NULL;
done:
    free(root);
    free(bucket_of);
    free(use);
    free(gs);
    free(at);
    free(out);
    return s;
}
