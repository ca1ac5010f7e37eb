/* stages_sum.c — a pipeline stage's gradients summed over its micro-batches
 * in dist.reproducible's fixed tree (dist/repro_sum.h), so the weights are
 * one process's bits (session/stages.h).
 *
 * Two things keep this to the passes the tree needs. The last micro-batch's
 * gradients go in with the tree's result (ts_tree_sum_finish: its merges,
 * the fold of the subtrees left and the division by M in one pass over the
 * gradients, instead of an add, a merge per level and a result). And the
 * later holder of a parameter two stages share sums nothing for it: it
 * sends each micro-batch's share to the earlier holder, which adds it to
 * its own and sums the tree, and receives the summed gradient back after
 * the last micro-batch (stages_run.c), which overwrites whatever it would
 * have summed (W3: the tied embedding's 16 MiB, a third of the last
 * stage's gradients). */
#include <stdlib.h>
#include <string.h>
#include "session/stages_internal.h"

static int by_at(const void *a, const void *b) {
    const shared_param *x = *(shared_param *const *)a, *y = *(shared_param *const *)b;
    return x->grad < y->grad ? -1 : x->grad > y->grad;
}

ts_status ts_stage_sum_setup(ts_stage *st) {
    /* the later holder's shared gradients, in the region's order */
    shared_param *skip[MAX_SHARED];
    int n_skip = 0;
    for (int i = 0; i < st->n_shared; i++)
        if (!st->shared[i].owner) skip[n_skip++] = &st->shared[i];
    qsort(skip, (size_t)n_skip, sizeof *skip, by_at);
    size_t at = 0;
    st->n_pieces = 0, st->nsum = 0;
    for (int i = 0; i <= n_skip; i++) {
        const size_t end = i < n_skip ? (size_t)((float *)skip[i]->grad - st->grad) : st->ngrad;
        if (end < at || end > st->ngrad)
            return ts_fail(TS_ERR_INTERNAL,
                           "pipeline: stage %d's gradient of %s lies outside its gradient region",
                           st->s, skip[i]->name);
        if (end > at) {
            grad_piece *p = &st->pieces[st->n_pieces++];
            p->off = at, p->n = end - at;
            ts_status s = ts_tree_sum_init(&p->t, p->n);
            if (s != TS_OK) return s;
            st->nsum += p->n;
        }
        if (i < n_skip) at = end + skip[i]->bytes / sizeof(float);
    }
    return TS_OK;
}

ts_status ts_stage_sum_add(ts_stage *st, int mb) {
    const int last = mb == st->M - 1;
    if (st->M == 1 && st->D == 1) return TS_OK; /* the gradients are the sum */
    /* the replicas' sum takes each replica's sum whole (replicas_sum) */
    float *dst = st->D > 1 ? st->dp_buf + (size_t)st->d * st->ngrad : st->grad;
    const float div = st->D > 1 ? 1.0f : (float)st->M;
    ts_status s = TS_OK;
    for (int i = 0; i < st->n_pieces && s == TS_OK; i++) {
        grad_piece *p = &st->pieces[i];
        s = last ? ts_tree_sum_finish(&p->t, st->grad + p->off, dst + p->off, div)
                 : ts_tree_sum_add(&p->t, st->grad + p->off);
    }
    return s;
}

void ts_stage_sum_free(ts_stage *st) {
    for (int i = 0; i < st->n_pieces; i++) ts_tree_sum_free(&st->pieces[i].t);
    st->n_pieces = 0;
}
