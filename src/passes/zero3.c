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
 * and once more within a phase where the bucket's readers are more than a
 * quarter of the phase apart (at most MAX_STRETCHES gathers per phase): a
 * tied embedding is read by the token lookup and by the LM head, and its
 * bucket may hold a parameter read at the very end of the backward (the
 * first layer norm), so one gather per phase would keep it through the
 * whole step.
 *
 * The parameters themselves are no longer persistent: memplan plans each
 * bucket's parameters as one temporary (laid out as the gradients, 64-byte
 * padding between tensors), alive from each gather to the last reader
 * before the next one, and free in between (holes the planner may fill
 * with activations).
 *
 * Prefetch (the default; ts_compile_options.zero_no_prefetch turns it
 * off): the buckets are gathered in the order of their first use, and the
 * start of the next one is placed right before the wait of the current
 * one, so the gather of bucket i + 1 runs while bucket i's layer computes
 * (two buckets' parameters alive at once instead of one). Each gather has
 * its own ticket slot, after the reduce-scatters' nb. */
#include <stdlib.h>
#include <string.h>
#include "passes.h"
#include "tessel/dist.h"

/* A stretch: readers of one bucket's parameters in one phase that no long
 * gap separates; each stretch gets its own gather. */
typedef struct stretch {
    int first, last; /* positions in the order of its first and last reader */
    int b, ph, nth;  /* bucket, phase (0 forward, 1 backward), its number in the phase */
    int at;          /* its start goes right before position at */
    int32_t start, wait;
} stretch;

/* The most stretches of one bucket in one phase: past it the last one
 * takes the rest of the readers. */
enum { MAX_STRETCHES = 3 };

static int cmp_first(const void *a, const void *b) {
    const stretch *x = a, *y = b;
    if (x->ph != y->ph) return x->ph < y->ph ? -1 : 1;
    if (x->first != y->first) return x->first < y->first ? -1 : 1;
    return (x->b > y->b) - (x->b < y->b);
}

/* The start and wait of one gather of bucket zb (ticket slot `ticket`);
 * *start, *wait their node ids. */
static ts_status add_gather(ts_graph *g, const ts_zero3_bucket *zb, const stretch *st, int ticket,
                            const ts_dist_spec *d, int32_t *start, int32_t *wait) {
    ts_val *args = ts_alloc(sizeof(ts_val) * (size_t)(zb->k + 1), "zero3");
    if (!args) return TS_ERR_NOMEM;
    ts_attrs a = ts_attrs_zero();
    a.bucket.ticket = ticket;
    a.bucket.algo = d->algo;
    a.bucket.elems = zb->elems;
    a.bucket.zero = 3;
    args[0] = ts_mkval(zb->shard);
    for (int i = 0; i < zb->k; i++) args[1 + i] = ts_mkval(zb->params[i]);
    char name[64], nth[16] = "";
    if (st->nth > 0) snprintf(nth, sizeof nth, ".%d", st->nth + 1);
    const char *phase = st->ph ? "bwd" : "fwd";
    ts_val tok = ts_node_add(g, TS_OP_ALL_GATHER_START, zb->k + 1, args, &a, NULL);
    ts_status s = ts_graph_status(g);
    if (s == TS_OK) {
        snprintf(name, sizeof name, "bucket%d.gather_%s%s", st->b, phase, nth);
        s = ts_set_name(g, tok, name);
    }
    if (s == TS_OK) {
        *start = g->values[tok.id].node;
        args[0] = tok;
        ts_val w = ts_node_add(g, TS_OP_ALL_GATHER_WAIT, zb->k + 1, args, &a, NULL);
        if ((s = ts_graph_status(g)) == TS_OK) {
            snprintf(name, sizeof name, "bucket%d.gathered_%s%s", st->b, phase, nth);
            s = ts_set_name(g, w, name);
            *wait = g->values[w.id].node;
        }
    }
    free(args);
    return s;
}

ts_status ts_zero3_gathers(ts_graph *g, int32_t **order_io, int *m_io, const ts_dist_spec *d,
                           const ts_zero3_bucket *zb, int nb, int *n_gathers) {
    const int m = *m_io, nv = g->n_values;
    const int32_t *order = *order_io;
    const int max_st = 2 * MAX_STRETCHES * nb + 1;
    ts_status s = TS_OK;
    int32_t *root = ts_alloc(sizeof(int32_t) * (size_t)(nv + 1), "zero3");
    int *bucket_of = ts_alloc(sizeof(int) * (size_t)(nv + 1), "zero3");
    stretch *st = ts_alloc(sizeof(stretch) * (size_t)max_st, "zero3");
    int *cur = ts_alloc(sizeof(int) * (size_t)(2 * nb + 1), "zero3"); /* open stretch per (ph, b) */
    int32_t *out = NULL;
    int n_st = 0;
    if (!root || !bucket_of || !st || !cur) {
        s = TS_ERR_NOMEM;
        goto done;
    }
    ts_view_roots(g, root);
    for (int v = 0; v < nv; v++) bucket_of[v] = -1;
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
    /* A bucket read again more than a quarter of its phase after its
     * previous reader (a tied embedding: the token lookup at the start of
     * the forward and the LM head at its end) is gathered again for the
     * later readers instead of being held through the gap: one more
     * gather of its bytes for that much less memory in between. */
    const int gap[2] = {(lpos + 1) / 4 > 1 ? (lpos + 1) / 4 : 1,
                        (m - lpos - 1) / 4 > 1 ? (m - lpos - 1) / 4 : 1};
    for (int q = 0; q < 2 * nb; q++) cur[q] = -1;
    for (int k = 0; k < m; k++) {
        const ts_node *n = &g->nodes[order[k]];
        if (ts_op_get(n->op)->flags & TS_OPF_ALIAS) continue; /* a view reads nothing */
        const int ph = k > lpos;
        for (int j = 0; j < n->n_in; j++) {
            int b = bucket_of[root[n->in[j]]];
            if (b < 0) continue;
            int *c = &cur[ph * nb + b];
            if (*c < 0 || (k - st[*c].last > gap[ph] && st[*c].nth + 1 < MAX_STRETCHES)) {
                st[n_st] = (stretch){k, k, b, ph, *c < 0 ? 0 : st[*c].nth + 1, k, -1, -1};
                *c = n_st++;
            }
            st[*c].last = k;
        }
    }
    /* The gathers (ticket slots after the reduce-scatters'), phase by
     * phase in the order of first use. */
    qsort(st, (size_t)n_st, sizeof *st, cmp_first);
    for (int i = 0; i < n_st && s == TS_OK; i++)
        s = add_gather(g, &zb[st[i].b], &st[i], nb + i, d, &st[i].start, &st[i].wait);
    if (s != TS_OK) goto done;
    /* Readers after their stretch's wait; each update after every gather
     * of its bucket (they read the block it writes). */
    for (int k = 0; k < m && s == TS_OK; k++) {
        const ts_node *n = &g->nodes[order[k]];
        if (ts_op_get(n->op)->flags & TS_OPF_ALIAS) continue;
        for (int j = 0; j < n->n_in && s == TS_OK; j++) {
            int b = bucket_of[root[n->in[j]]];
            if (b < 0) continue;
            int w = -1; /* the latest stretch of b in this phase starting at or before k */
            for (int i = 0; i < n_st; i++)
                if (st[i].b == b && st[i].ph == (k > lpos) && st[i].first <= k) w = i;
            s = ts_node_add_ctrl(g, order[k], st[w].wait);
        }
    }
    for (int i = 0; i < n_st && s == TS_OK; i++)
        s = ts_node_add_ctrl(g, zb[st[i].b].update, st[i].wait);
    if (s != TS_OK) goto done;
    /* Where each start goes: before its own wait, or with prefetch before
     * the wait of the stretch gathered before it in its phase -- unless
     * that is still inside the bucket's previous stretch, whose readers
     * must not see their memory rewritten. */
    for (int i = 0; i < n_st; i++) {
        if (d->no_prefetch || i == 0 || st[i - 1].ph != st[i].ph) continue;
        int prev_last = -1;
        for (int q = 0; q < i; q++)
            if (st[q].b == st[i].b && st[q].ph == st[i].ph) prev_last = st[q].last;
        if (st[i - 1].first > prev_last) st[i].at = st[i - 1].first;
    }
    if (!(out = ts_alloc(sizeof(int32_t) * (size_t)(m + 2 * n_st + 1), "zero3"))) {
        s = TS_ERR_NOMEM;
        goto done;
    }
    int w = 0;
    for (int k = 0; k < m; k++) {
        /* At k: the starts of the stretches first read here (not
         * prefetched), then the prefetched next ones, then the waits; the
         * communication thread runs the gathers in start order. */
        for (int i = 0; i < n_st; i++)
            if (st[i].first == k && st[i].at == k) out[w++] = st[i].start;
        for (int i = 0; i < n_st; i++)
            if (st[i].first != k && st[i].at == k) out[w++] = st[i].start;
        for (int i = 0; i < n_st; i++)
            if (st[i].first == k) out[w++] = st[i].wait;
        out[w++] = order[k];
    }
    free(*order_io);
    *order_io = out;
    *m_io = w;
    *n_gathers = n_st;
    out = NULL;
done:
    free(root);
    free(bucket_of);
    free(st);
    free(cur);
    free(out);
    return s;
}
