/* The weights' low-precision copies, kept by the optimizer.
 *
 * In a bf16 (or fp16) plan the precision pass casts every weight a GEMM reads, once a step,
 * before its first reader, and orders the optimizer's in-place update after the cast
 * (precision.c). The cast then reads the f32 weights the previous step's update has just
 * written: W3 had 25 such casts a step, a read of the f32 weights and a write of their bf16
 * image. This pass lets the update write that image itself, in the same pass over the new
 * weights (ops/optim.c, attribute n_low), into a persistent copy the GEMMs read instead:
 *
 *   - each cast of an f32 parameter that an sgd_update / adam_update node updates (the
 *     precision pass's, found by the control edge it gave the update) becomes an unnamed
 *     STATE value of the cast's type, read where the cast's output was read;
 *   - the update's groups with a copy move to the front (n_low of them) and their copies
 *     follow its other inputs in the same order; the update is ordered after every reader of
 *     a copy, as after every reader of a weight.
 *
 * The copy holds the bits the cast gave (the same rounding, core/half.h) as long as the
 * weights change only through the update. Whatever else writes the weights refreshes the
 * copies (plan/weight_copies.c): the plan's first values, ts_plan_write_param (a checkpoint's
 * restore, LoRA's base), and the stage plans' writes through ts_plan_value_at. The copies
 * are unnamed, so checkpoints neither hold nor expect them.
 *
 * Not for backends whose update kernels write no copies (CUDA) nor for ZeRO's shard
 * updates (pipeline.c decides); a cast it does not recognise stays, correct as before. */
#include <stdlib.h>
#include <string.h>
#include "passes.h"

/* The precision pass's cast of parameter p that update node u is ordered after (and no
 * other node is), its output read before u only, where nothing else needs it; -1 if none. */
static int weight_cast(const ts_graph *g, int u, int32_t p) {
    const ts_value *pv = &g->values[p];
    if (pv->kind != TS_VK_PARAM || pv->t.dtype != TS_F32) return -1;
    const ts_node *un = &g->nodes[u];
    for (int j = 0; j < un->n_ctrl; j++) {
        const int c = un->ctrl[j];
        const ts_node *cn = &g->nodes[c];
        if (cn->dead || cn->op != TS_OP_CAST || cn->in[0] != p ||
            (cn->a.cast.dtype != TS_BF16 && cn->a.cast.dtype != TS_F16))
            continue;
        const ts_value *w = &g->values[cn->out[0]];
        if (w->is_output || w->grad_of >= 0) return -1;
        for (int i = 0; i < g->n_nodes; i++) {
            const ts_node *r = &g->nodes[i];
            if (r->dead) continue;
            for (int q = 0; q < r->n_ctrl; q++)
                if (r->ctrl[q] == c && i != u) return -1;
            for (int q = 0; q < r->n_in && i > u; q++)
                if (r->in[q] == cn->out[0]) return -1; /* read after the update: keep it */
        }
        return c;
    }
    return -1;
}

/* Gives update node u the copies of its parameters that have a weight cast. Returns the
 * number made (0: u unchanged) or -1 on error (the status set). */
static int copy_weights(ts_graph *g, int u, ts_status *st) {
    ts_update_layout L;
    ts_node *un = &g->nodes[u];
    if (!ts_update_layout_of(un->op, &un->a, un->n_in, &L) || L.n_low != 0) return 0;
    int *cast = ts_alloc(sizeof(int) * (size_t)L.ng, "weight copies");
    int32_t *in = ts_alloc(sizeof(int32_t) * ((size_t)un->n_in + (size_t)L.ng), "weight copies");
    if (!cast || !in) {
        free(cast);
        free(in);
        *st = TS_ERR_NOMEM;
        return -1;
    }
    int n = 0;
    for (int j = 0; j < L.ng; j++) n += (cast[j] = weight_cast(g, u, un->in[j * L.gs])) >= 0;
    /* the groups with a copy first, then the others, the coefficient, the copies */
    int k = 0, m = L.ng * L.gs + L.has_coef;
    for (int pass = 0; n > 0 && pass < 2; pass++)
        for (int j = 0; j < L.ng; j++)
            if ((cast[j] >= 0) == (pass == 0)) {
                memcpy(in + k, un->in + j * L.gs, sizeof(int32_t) * (size_t)L.gs);
                k += L.gs;
            }
    if (n > 0 && L.has_coef) in[k++] = un->in[L.ng * L.gs];
    for (int j = 0; j < L.ng && n > 0; j++) {
        if (cast[j] < 0) continue;
        const int32_t w = g->nodes[cast[j]].out[0];
        const ts_type t = g->values[w].t;
        const int32_t c = ts_value_new(g, &t, TS_VK_STATE, NULL);
        if (c < 0) {
            *st = ts_graph_status(g);
            n = -1;
            break;
        }
        g->values[c].init = ts_init_zeros(); /* until the plan's first values (plan/) */
        g->values[c].state_of = g->nodes[u].in[j * L.gs];
        for (int i = 0; i < u; i++)
            for (int q = 0; q < g->nodes[i].n_in; q++)
                if (g->nodes[i].in[q] == w) g->nodes[i].in[q] = c;
        g->nodes[cast[j]].dead = 1; /* the pipeline compacts the graph */
        in[m++] = c;
    }
    if (n > 0) {
        un = &g->nodes[u];
        free(un->in);
        un->in = in;
        un->n_in = m;
        if (un->op == TS_OP_SGD_UPDATE)
            un->a.sgd.n_low = n;
        else
            un->a.adam.n_low = n;
        in = NULL;
        *st = ts_order_after_readers(g, u, un->in + L.ng * L.gs + L.has_coef, n, 1);
        if (*st != TS_OK) n = -1;
    }
    free(in);
    free(cast);
    return n;
}

ts_status ts_pass_weight_copies(ts_graph *g, int *n_copies) {
    if (n_copies) *n_copies = 0;
    ts_status s = TS_OK;
    int total = 0;
    for (int u = 0; u < g->n_nodes && s == TS_OK; u++) {
        if (g->nodes[u].dead) continue;
        const int n = copy_weights(g, u, &s);
        if (n > 0) total += n;
    }
    if (s == TS_OK && n_copies) *n_copies = total;
    return s;
}
