/* fuse_ce: a cross_entropy and its cross_entropy_bwd as one
 * cross_entropy_fused, so the logits are read from memory once per step
 * instead of twice (W3: [2048, 8192] f32, 64 MiB, read by the forward's max
 * and exp passes and again by the backward). Runs after precision, which
 * gives the backward its bf16 output (cross_entropy.out_low): the fused op
 * takes the backward's attributes.
 *
 *     loss, lse = cross_entropy(logits, targets[, w])
 *     d = cross_entropy_bwd(dl, logits, targets, lse[, w])
 * becomes
 *     d, loss, lse = cross_entropy_fused(dl, logits, targets[, w])
 *
 * in the forward's slot, where the gradient's seed dl must then be ready:
 * it is a constant (1) or, with loss scaling, the scale times it, built by
 * autodiff after the forward but not reading it. The nodes dl (and the
 * backward's control dependencies) come from that sit after the forward
 * move to just before it; the pair is left alone if any of them reads the
 * forward, or if a node with side effects lies between forward and
 * backward (a state written there must not be read earlier). Only where
 * the logits are f32, every row is computed (not chunk_ce's chunks: those
 * keep the gradient from being whole) and nothing but the pair reads the
 * logits. On one core the saving is small (docs/benchmarks.md, session
 * 18): both ops are bound by their exps, not by the second read. The kernel
 * computes each row with the two ops' own functions (ops/loss.c): the same
 * bits for loss, lse and gradient. */
#include <stdlib.h>
#include <string.h>
#include "passes.h"

typedef struct pair {
    int32_t f, b; /* the cross_entropy and cross_entropy_bwd nodes */
} pair;

/* The forward node whose lse backward node b reads, if the two match. */
static int32_t forward_of(const ts_graph *g, const ts_node *b) {
    const ts_value *lse = &g->values[b->in[3]];
    if (lse->kind != TS_VK_NODE || lse->node < 0 || lse->out_index != 1) return -1;
    const ts_node *f = &g->nodes[lse->node];
    if (f->dead || f->op != TS_OP_CROSS_ENTROPY) return -1;
    if (f->in[0] != b->in[1] || f->in[1] != b->in[2] || f->n_in + 2 != b->n_in) return -1;
    if (f->n_in == 3 && f->in[2] != b->in[4]) return -1;
    if (f->a.cross_entropy.ignore_index != b->a.cross_entropy.ignore_index) return -1;
    return lse->node;
}

/* Marks in `move` the nodes after f that dl and b's control dependencies
 * come from (directly or not); 0 if f is among them or the move is not
 * safe. stack: room for every node (each is pushed once). */
static int mark_moves(const ts_graph *g, pair p, char *move, int32_t *stack) {
    const ts_node *b = &g->nodes[p.b];
    int n = 0;
#define PUSH(i)                                                                                    \
    do {                                                                                           \
        const int32_t i_ = (i);                                                                    \
        if (i_ == p.f) return 0;                                                                   \
        if (i_ > p.f && !move[i_]) move[i_] = 1, stack[n++] = i_;                                  \
    } while (0)
    const ts_value *dl = &g->values[b->in[0]];
    if (dl->kind == TS_VK_NODE && dl->node >= 0) PUSH(dl->node);
    for (int j = 0; j < b->n_ctrl; j++) PUSH(b->ctrl[j]);
    while (n > 0) {
        const int32_t i = stack[--n];
        const ts_node *m = &g->nodes[i];
        for (int j = 0; j < m->n_in; j++) {
            const ts_value *v = &g->values[m->in[j]];
            if (v->kind == TS_VK_NODE && v->node >= 0) PUSH(v->node);
        }
        for (int j = 0; j < m->n_ctrl; j++) PUSH(m->ctrl[j]);
    }
#undef PUSH
    /* no node writing a state in place (an update, a scaler's) between the two: what the
     * fused op and the moved nodes read would be read before it */
    for (int i = p.f + 1; i < p.b; i++)
        if (!g->nodes[i].dead && (ts_op_get(g->nodes[i].op)->flags & TS_OPF_SIDE_EFFECT)) return 0;
    return 1;
}

/* f becomes the fused node (its outputs kept: the loss value's id does not
 * change), b dies, and the marked nodes run before f. */
static ts_status rewrite(ts_graph *g, pair p, const char *move) {
    ts_node *f = &g->nodes[p.f], *b = &g->nodes[p.b];
    int32_t in[4] = {b->in[0], f->in[0], f->in[1], f->n_in == 3 ? f->in[2] : -1};
    const int n_in = f->n_in + 1;
    int32_t *ni = ts_alloc(sizeof(int32_t) * 4, "fuse_ce");
    int32_t *nc = ts_alloc(sizeof(int32_t) * (size_t)(f->n_ctrl + b->n_ctrl + 1), "fuse_ce");
    int32_t *perm = ts_alloc(sizeof(int32_t) * (size_t)(g->n_nodes + 1), "fuse_ce");
    if (!ni || !nc || !perm) {
        free(ni), free(nc), free(perm);
        return TS_ERR_NOMEM;
    }
    memcpy(ni, in, sizeof in);
    free(f->in);
    f->in = ni, f->n_in = n_in;
    /* b's control dependencies: before f now (marked) or already */
    int k = 0;
    for (int j = 0; j < f->n_ctrl; j++) nc[k++] = f->ctrl[j];
    for (int j = 0; j < b->n_ctrl; j++) nc[k++] = b->ctrl[j];
    free(f->ctrl);
    f->ctrl = nc, f->n_ctrl = k;
    const int32_t d = b->out[0];
    f->out[2] = f->out[1], f->out[1] = f->out[0], f->out[0] = d;
    f->n_out = 3;
    for (int o = 0; o < 3; o++) g->values[f->out[o]].node = p.f, g->values[f->out[o]].out_index = o;
    f->op = TS_OP_CROSS_ENTROPY_FUSED;
    f->a = b->a; /* ignore_index (checked equal) and the backward's out_low */
    b->dead = 1, b->n_out = 0;
    for (int i = 0; i < g->n_nodes; i++) {
        ts_node *r = &g->nodes[i];
        for (int j = 0; j < r->n_ctrl; j++)
            if (r->ctrl[j] == p.b) r->ctrl[j] = p.f;
    }
    int np = 0;
    for (int i = 0; i < p.f; i++) perm[np++] = i;
    for (int i = p.f + 1; i < g->n_nodes; i++)
        if (move[i]) perm[np++] = i;
    perm[np++] = p.f;
    for (int i = p.f + 1; i < g->n_nodes; i++)
        if (!move[i]) perm[np++] = i;
    ts_status s = ts_graph_permute_nodes(g, perm, np);
    free(perm);
    return s;
}

ts_status ts_pass_fuse_ce(ts_graph *g, int *n_fused) {
    int done = 0;
    ts_status s = TS_OK;
    int *readers = ts_alloc(sizeof(int) * (size_t)(g->n_values + 1), "fuse_ce");
    char *move = ts_alloc((size_t)g->n_nodes + 1, "fuse_ce");
    int32_t *stack = ts_alloc(sizeof(int32_t) * (size_t)(g->n_nodes + 1), "fuse_ce");
    if (!readers || !move || !stack) s = TS_ERR_NOMEM;
    for (int bi = 0; bi < g->n_nodes && s == TS_OK; bi++) {
        const ts_node *b = &g->nodes[bi];
        if (b->dead || b->op != TS_OP_CROSS_ENTROPY_BWD || b->a.cross_entropy.row_count != 0 ||
            b->a.cross_entropy.row_start != 0 || g->values[b->in[1]].t.dtype != TS_F32)
            continue;
        const pair p = {forward_of(g, b), bi};
        if (p.f < 0 || p.f > bi) continue;
        /* nothing else reads the logits: another reader (a metric) would keep them alive
         * beside a gradient that now exists from the forward on, a larger peak */
        memset(readers, 0, sizeof(int) * (size_t)g->n_values);
        for (int i = 0; i < g->n_nodes; i++)
            if (!g->nodes[i].dead)
                for (int j = 0; j < g->nodes[i].n_in; j++) readers[g->nodes[i].in[j]]++;
        if (readers[b->in[1]] != 2) continue;
        memset(move, 0, (size_t)g->n_nodes);
        if (!mark_moves(g, p, move, stack)) continue;
        if ((s = rewrite(g, p, move)) != TS_OK) break;
        done++;
        bi = -1; /* the nodes were reordered: look again from the start */
    }
    free(readers);
    free(move);
    free(stack);
    if (n_fused) *n_fused = done;
    return s;
}
