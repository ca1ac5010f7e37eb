/* recompute: fit a training step under compile.max_memory_mb by computing
 * some forward activations again in the backward instead of keeping them.
 *
 * A candidate is a temporary x that a forward node (one the loss depends
 * on) produces and a backward node reads, whose producer is a pure
 * single-output op (no side effect, no random numbers, no optimizer
 * state among its inputs) and whose inputs stay alive until the backward
 * anyway (persistent, or read by the backward themselves). Recomputing x
 * adds a copy of its producer — the same op and attributes on the same
 * input values, so the same kernel gives the same bits — that the backward
 * readers read instead; x then dies after its last forward reader.
 *
 * The loop: schedule (schedule.c), find the step where the most bytes are
 * live, and among the candidates alive across that step without being
 * read there take the cheapest by FLOPs per byte freed (one per round for
 * 32 rounds, then enough to cover the excess); add its copy, schedule
 * again; stop when the arena fits, or refuse with what the step needs
 * when no candidate is left.
 * Every choice is ordered by (cost, value id): the result is the same on
 * every run. */
#include <stdlib.h>
#include <string.h>
#include "passes.h"
#include "schedule_search.h"

typedef struct cand {
    int32_t v;
    double flops, key; /* flops of its producer; flops per byte */
    size_t bytes;
} cand;

static int cmp_cand(const void *a, const void *b) {
    const cand *x = a, *y = b;
    if (x->key != y->key) return x->key < y->key ? -1 : 1;
    return (x->v > y->v) - (x->v < y->v);
}

/* fwd[i]: the loss depends on node i. */
static void forward_nodes(const ts_graph *g, int32_t loss, char *fwd, char *need) {
    memset(fwd, 0, (size_t)g->n_nodes);
    memset(need, 0, (size_t)g->n_values);
    need[loss] = 1;
    for (int i = g->n_nodes - 1; i >= 0; i--) {
        const ts_node *n = &g->nodes[i];
        int any = 0;
        for (int j = 0; j < n->n_out; j++) any |= need[n->out[j]];
        if (!any) continue;
        fwd[i] = 1;
        for (int j = 0; j < n->n_in; j++) need[n->in[j]] = 1;
    }
}

static int pure(const ts_graph *g, const ts_node *n) {
    const unsigned bad =
        TS_OPF_SIDE_EFFECT | TS_OPF_RANDOM | TS_OPF_UPDATE | TS_OPF_MONITOR | TS_OPF_ALIAS;
    if ((ts_op_get(n->op)->flags & bad) || n->n_out != 1 || n->n_ctrl) return 0;
    for (int j = 0; j < n->n_in; j++)
        if (g->values[n->in[j]].kind == TS_VK_STATE) return 0;
    return 1;
}

/* The candidates of g (see the top), cheapest first; returns how many. */
static int candidates(const ts_graph *g, const char *fwd, cand *out) {
    const int nv = g->n_values, nn = g->n_nodes;
    char *bwd_read = ts_zalloc((size_t)nv + 1, "recompute"),
         *viewed = ts_zalloc((size_t)nv + 1, "recompute");
    if (!bwd_read || !viewed) {
        free(bwd_read), free(viewed);
        return -1;
    }
    for (int i = 0; i < nn; i++) {
        const ts_node *n = &g->nodes[i];
        const int alias = (ts_op_get(n->op)->flags & TS_OPF_ALIAS) != 0;
        for (int j = 0; j < n->n_in; j++) {
            if (!fwd[i]) bwd_read[n->in[j]] = 1;
            if (alias) viewed[n->in[j]] = 1;
        }
    }
    int k = 0;
    for (int v = 0; v < nv; v++) {
        const ts_value *val = &g->values[v];
        if (val->kind != TS_VK_NODE || val->is_output || val->grad_of >= 0 || !bwd_read[v] ||
            viewed[v])
            continue;
        const ts_node *p = &g->nodes[val->node];
        if (!fwd[val->node] || !pure(g, p)) continue;
        int ok = 1;
        for (int j = 0; j < p->n_in && ok; j++) {
            const ts_value *in = &g->values[p->in[j]];
            ok = in->kind != TS_VK_NODE || in->is_output || in->grad_of >= 0 ||
                 (bwd_read[p->in[j]] && !viewed[p->in[j]]);
        }
        if (!ok) continue;
        const ts_op_def *def = ts_op_get(p->op);
        double f = def->cost ? def->cost(g, p) : 0.0;
        size_t b = ts_type_bytes(&val->t);
        if (b == 0) continue;
        out[k++] = (cand){v, f, f / (double)b, b};
    }
    free(bwd_read), free(viewed);
    qsort(out, (size_t)k, sizeof *out, cmp_cand);
    return k;
}

/* Add the copy of x's producer for x's backward readers (see the top). */
static ts_status recompute_value(ts_graph *g, int32_t x, const char *fwd) {
    const ts_node p = g->nodes[g->values[x].node];
    ts_val in[64];
    if (p.n_in > 64) return ts_fail(TS_ERR_INTERNAL, "recompute: %d inputs", p.n_in);
    for (int j = 0; j < p.n_in; j++) in[j] = ts_mkval(p.in[j]);
    int r0 = -1;
    for (int i = 0; i < g->n_nodes && r0 < 0; i++)
        for (int j = 0; j < g->nodes[i].n_in && !fwd[i]; j++)
            if (g->nodes[i].in[j] == x) r0 = i;
    if (r0 < 0) return ts_fail(TS_ERR_INTERNAL, "recompute: value %d has no backward reader", x);
    ts_attrs a = p.a;
    ts_val y = ts_node_add(g, p.op, p.n_in, in, &a, NULL);
    ts_status s = ts_graph_status(g);
    if (s != TS_OK) return s;
    const int nc = g->n_nodes - 1;
    g->nodes[nc].recompute = 1;
    for (int i = 0; i < nc; i++) /* the backward reads the copy */
        for (int j = 0; j < g->nodes[i].n_in && !fwd[i]; j++)
            if (g->nodes[i].in[j] == x) g->nodes[i].in[j] = y.id;
    /* The copy runs in the backward: after the latest backward node its
     * first reader reads; and before anything that writes its inputs. */
    int after = -1;
    for (int j = 0; j < g->nodes[r0].n_in; j++) {
        int q = g->values[g->nodes[r0].in[j]].node;
        if (q >= 0 && q < nc && !fwd[q] && q > after) after = q;
    }
    if (after >= 0 && (s = ts_node_add_ctrl(g, nc, after)) != TS_OK) return s;
    for (int i = 0; i < nc && s == TS_OK; i++) {
        if (!(ts_op_get(g->nodes[i].op)->flags & TS_OPF_SIDE_EFFECT)) continue;
        int reads = 0;
        for (int j = 0; j < g->nodes[i].n_in; j++)
            for (int q = 0; q < p.n_in; q++) reads |= g->nodes[i].in[j] == p.in[q];
        if (reads) s = ts_node_add_ctrl(g, i, nc);
    }
    if (s != TS_OK) return s;
    /* keep build order topological: the copy goes right before r0 */
    int32_t *perm = ts_alloc(sizeof(int32_t) * ((size_t)nc + 2), "recompute");
    if (!perm) return TS_ERR_NOMEM;
    int k = 0;
    for (int i = 0; i < nc; i++) {
        if (i == r0) perm[k++] = nc;
        perm[k++] = i;
    }
    s = ts_graph_permute_nodes(g, perm, k);
    free(perm);
    return s;
}

static double mib(size_t b) {
    return (double)b / 1048576.0;
}

ts_status ts_pass_recompute_fit(ts_graph *g, int32_t loss, size_t limit,
                                const ts_schedule_options *so, int32_t **order, int *n_order,
                                ts_schedule_report *rep, ts_recompute_report *rr) {
    memset(rr, 0, sizeof *rr);
    ts_status s = ts_pass_schedule_mem(g, so, order, n_order, rep);
    if (s != TS_OK) return s;
    rr->arena_before = rr->arena_after = rep->arena;
    if (limit == 0 || rep->arena <= limit) return TS_OK;
    if (loss < 0 || so->naive)
        return ts_fail(TS_ERR_INVALID,
                       "compile: the step needs %.2f MiB of arena (%.2f MiB of temporaries), "
                       "above compile.max_memory_mb %.2f%s",
                       mib(rep->arena), mib(rep->peak), mib(limit),
                       so->naive ? " (compile.naive_schedule: no recompute)" : "");
    const size_t persistent = rep->arena - rep->peak;
    if (persistent >= limit)
        return ts_fail(TS_ERR_INVALID,
                       "compile: the step needs at least %.2f MiB for parameters, gradients, "
                       "optimizer state and inputs alone (%.2f MiB of temporaries on top), above "
                       "compile.max_memory_mb %.2f; recompute only shrinks the temporaries",
                       mib(persistent), mib(rep->peak), mib(limit));
    char *fwd = NULL, *need = NULL;
    cand *cs = NULL;
    size_t *live = NULL;
    size_t best = rep->arena;
    int stale = 0; /* rounds since the arena last shrank */
    for (int round = 0; rep->arena > limit && stale < 8; round++) {
        free(fwd), free(need), free(cs), free(live);
        fwd = ts_alloc((size_t)g->n_nodes + 1, "recompute");
        need = ts_alloc((size_t)g->n_values + 1, "recompute");
        cs = ts_alloc(sizeof(cand) * ((size_t)g->n_values + 1), "recompute");
        live = ts_alloc(sizeof(size_t) * ((size_t)*n_order + 1), "recompute");
        if (!fwd || !need || !cs || !live) {
            s = TS_ERR_NOMEM;
            break;
        }
        forward_nodes(g, loss, fwd, need);
        int nc = candidates(g, fwd, cs);
        size_t pk;
        if (nc < 0 ||
            (s = ts_schedule_sim(g, *order, *n_order, so->allow_inplace, &pk, live)) != TS_OK) {
            s = nc < 0 ? TS_ERR_NOMEM : s;
            break;
        }
        int at = 0; /* the step with the most bytes live */
        for (int k = 1; k < *n_order; k++)
            if (live[k] > live[at]) at = k;
        /* positions: a candidate frees the peak step if its last forward
         * reader runs before it and its first backward reader after */
        int *pos = ts_alloc(sizeof(int) * ((size_t)g->n_nodes + 1), "recompute");
        if (!pos) {
            s = TS_ERR_NOMEM;
            break;
        }
        for (int k = 0; k < *n_order; k++) pos[(*order)[k]] = k;
        size_t excess = rep->arena - limit, got = 0;
        int picked = 0;
        for (int pass = 0; pass < 2 && !picked; pass++) {
            /* one at a time for the first rounds (the peak moves), then
             * enough to cover the excess at once */
            for (int c = 0; c < nc && !(picked && (round < 32 || got >= excess)); c++) {
                int32_t x = cs[c].v;
                int lf = pos[g->values[x].node], fb = *n_order;
                for (int i = 0; i < g->n_nodes; i++)
                    for (int j = 0; j < g->nodes[i].n_in; j++)
                        if (g->nodes[i].in[j] == x) {
                            if (fwd[i] && pos[i] > lf) lf = pos[i];
                            if (!fwd[i] && pos[i] < fb) fb = pos[i];
                        }
                /* pass 1: any candidate (the peak may move) */
                if (pass == 0 && !(lf < at && at < fb)) continue;
                cs[picked++] = cs[c], got += cs[c].bytes;
            }
        }
        free(pos);
        if (!picked) break;
        for (int c = 0; c < picked && s == TS_OK; c++) {
            forward_nodes(g, loss, fwd, need);
            s = recompute_value(g, cs[c].v, fwd);
            rr->n++, rr->flops += cs[c].flops;
        }
        if (s != TS_OK) break;
        free(*order);
        *order = NULL;
        if ((s = ts_pass_schedule_mem(g, so, order, n_order, rep)) != TS_OK) break;
        rr->arena_after = rep->arena;
        stale = rep->arena < best ? 0 : stale + 1;
        if (rep->arena < best) best = rep->arena;
    }
    free(fwd), free(need), free(cs), free(live);
    if (s == TS_OK && rep->arena > limit)
        s = ts_fail(TS_ERR_INVALID,
                    "compile: the step needs %.2f MiB of arena (%.2f MiB of parameters, "
                    "gradients, optimizer state and inputs, the rest temporaries) with %d "
                    "activations recomputed, %s, above compile.max_memory_mb %.2f",
                    mib(best), mib(rep->arena - rep->peak), rr->n,
                    stale >= 8 ? "recomputing more did not lower it"
                               : "no further one recomputable",
                    mib(limit));
    return s;
}
