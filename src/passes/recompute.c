/* recompute: fit a training step under compile.max_memory_mb by computing
 * some forward activations again in the backward instead of keeping them.
 *
 * A candidate is a temporary x that a forward node (one the loss depends
 * on) produces and a backward node reads, whose producer is a pure
 * single-output op (no side effect, no random numbers, no optimizer
 * state among its inputs) and whose inputs stay alive until the backward
 * anyway (persistent, or read by the backward themselves) or can be
 * computed again the same way from such values (a chain of at most three
 * producers, views included: the input's slice, reshape and permute in
 * front of a first convolution). Recomputing x adds copies of the chain —
 * the same ops and attributes on the same input values, so the same
 * kernels give the same bits — and the backward readers read the copy of
 * x instead; x then dies after its last forward reader.
 *
 * The loop: schedule (schedule.c), find the step where the most bytes are
 * live, and among the candidates alive across that step without being
 * read there take the cheapest by FLOPs per byte freed (the larger first
 * at equal cost) until their bytes cover the excess; add their copies,
 * schedule again; stop when the arena fits, or refuse with what the step
 * needs when no candidate is left or 8 rounds did not shrink the arena.
 * Every choice is ordered by (cost, size, value id): the result is the
 * same on every run. */
#include <stdlib.h>
#include <string.h>
#include "passes.h"
#include "schedule_search.h"

typedef struct cand {
    int32_t v;
    double flops, key; /* of its copies; per byte freed */
    size_t bytes;
} cand;

static int cmp_cand(const void *a, const void *b) {
    const cand *x = a, *y = b;
    if (x->key != y->key) return x->key < y->key ? -1 : 1;
    if (x->bytes != y->bytes) return x->bytes > y->bytes ? -1 : 1; /* more memory per copy */
    return (x->v > y->v) - (x->v < y->v);
}

/* What the candidates' choice needs to know about g, rebuilt after every
 * change: which nodes are forward (the loss depends on them), and which
 * storage roots the backward keeps alive anyway. */
typedef struct info {
    char *fwd;     /* per node */
    char *need;    /* per value: the loss depends on it (analyse's scratch) */
    int32_t *root; /* per value: its storage (views share their source's) */
    char *kept;    /* per root: read by a backward node (through any view) or pinned */
    char *viewed;  /* per value: an alias op (a view) reads it */
} info;

static void info_free(info *f) {
    free(f->fwd), free(f->need), free(f->root), free(f->kept), free(f->viewed);
    memset(f, 0, sizeof *f);
}

static ts_status analyse(const ts_graph *g, int32_t loss, info *f) {
    const int nv = g->n_values, nn = g->n_nodes;
    info_free(f);
    f->fwd = ts_zalloc((size_t)nn + 1, "recompute");
    f->need = ts_zalloc((size_t)nv + 1, "recompute");
    f->root = ts_alloc(sizeof(int32_t) * ((size_t)nv + 1), "recompute");
    f->kept = ts_zalloc((size_t)nv + 1, "recompute");
    f->viewed = ts_zalloc((size_t)nv + 1, "recompute");
    if (!f->fwd || !f->need || !f->root || !f->kept || !f->viewed) {
        info_free(f);
        return TS_ERR_NOMEM;
    }
    f->need[loss] = 1;
    for (int i = nn - 1; i >= 0; i--) {
        const ts_node *n = &g->nodes[i];
        int any = 0;
        for (int j = 0; j < n->n_out; j++) any |= f->need[n->out[j]];
        if (!any) continue;
        f->fwd[i] = 1;
        for (int j = 0; j < n->n_in; j++) f->need[n->in[j]] = 1;
    }
    ts_view_roots(g, f->root);
    for (int v = 0; v < nv; v++) {
        const ts_value *val = &g->values[v];
        if (val->kind != TS_VK_NODE || val->is_output || val->grad_of >= 0) f->kept[f->root[v]] = 1;
    }
    for (int i = 0; i < nn; i++) {
        const ts_node *n = &g->nodes[i];
        const int alias = (ts_op_get(n->op)->flags & TS_OPF_ALIAS) != 0;
        for (int j = 0; j < n->n_in; j++) {
            if (!f->fwd[i]) f->kept[f->root[n->in[j]]] = 1;
            if (alias) f->viewed[n->in[j]] = 1;
        }
    }
    return TS_OK;
}

/* An op whose copy computes the same bits: no side effect, no random
 * numbers, no optimizer state read (batch norm updates its running
 * statistics), one output; views only inside a chain (inner). */
static int pure(const ts_graph *g, const ts_node *n, int inner) {
    unsigned bad = TS_OPF_SIDE_EFFECT | TS_OPF_RANDOM | TS_OPF_UPDATE | TS_OPF_MONITOR;
    if (!inner) bad |= TS_OPF_ALIAS;
    if ((ts_op_get(n->op)->flags & bad) || n->n_out != 1 || n->n_ctrl || n->n_in > 16) return 0;
    for (int j = 0; j < n->n_in; j++)
        if (g->values[n->in[j]].kind == TS_VK_STATE) return 0;
    return 1;
}

/* A copy chain: x's producer and at most two below it (four when an
 * input became a copy in the same round), at most MAX_COPIES nodes. */
enum { CHAIN = 3, MAX_COPIES = 8 };

/* v is alive when the backward runs (kept), or can be computed again from
 * such values within `depth` more producers; *flops adds their cost. */
static int available(const ts_graph *g, const info *f, int32_t v, int depth, double *flops,
                     int *copies) {
    if (f->kept[f->root[v]]) return 1;
    if (depth <= 0 || ++*copies > MAX_COPIES) return 0;
    const ts_node *p = &g->nodes[g->values[v].node];
    if (!f->fwd[g->values[v].node] || !pure(g, p, 1)) return 0;
    for (int j = 0; j < p->n_in; j++)
        if (!available(g, f, p->in[j], depth - 1, flops, copies)) return 0;
    const ts_op_def *def = ts_op_get(p->op);
    *flops += def->cost ? def->cost(g, p) : 0.0;
    return 1;
}

/* v is a candidate (see the top) with copies `chain` producers deep at
 * most; *flops gets the cost of its copies. */
static int candidate(const ts_graph *g, const info *f, int32_t v, int chain, double *flops) {
    const ts_value *val = &g->values[v];
    if (val->kind != TS_VK_NODE || val->is_output || val->grad_of >= 0 || f->root[v] != v ||
        !f->kept[v] || f->viewed[v] || ts_type_bytes(&val->t) == 0)
        return 0;
    const ts_node *p = &g->nodes[val->node];
    if (!f->fwd[val->node] || !pure(g, p, 0)) return 0;
    int reads = 0; /* a backward node reads v itself (not a view) */
    for (int i = 0; i < g->n_nodes && !reads; i++)
        for (int j = 0; j < g->nodes[i].n_in && !f->fwd[i]; j++) reads |= g->nodes[i].in[j] == v;
    if (!reads) return 0;
    const ts_op_def *def = ts_op_get(p->op);
    *flops = def->cost ? def->cost(g, p) : 0.0;
    int ok = 1, copies = 1;
    for (int j = 0; j < p->n_in && ok; j++)
        ok = available(g, f, p->in[j], chain - 1, flops, &copies);
    return ok;
}

/* The candidates of g, cheapest first; returns how many. */
static int candidates(const ts_graph *g, const info *f, cand *out) {
    int k = 0;
    for (int v = 0; v < g->n_values; v++) {
        double fl;
        if (!candidate(g, f, v, CHAIN, &fl)) continue;
        size_t b = ts_type_bytes(&g->values[v].t);
        out[k++] = (cand){v, fl, fl / (double)b, b};
    }
    qsort(out, (size_t)k, sizeof *out, cmp_cand);
    return k;
}

/* The copy of value v for the backward: v itself when kept, else a new
 * node (appended; its id into added[]) computing it from copies of its
 * inputs. */
static ts_val copy_of(ts_graph *g, const info *f, int32_t v, int top, int32_t *added,
                      int *n_added) {
    if (!top && f->kept[f->root[v]]) return ts_mkval(v);
    const ts_node p = g->nodes[g->values[v].node];
    ts_val in[16];
    for (int j = 0; j < p.n_in && j < 16; j++) in[j] = copy_of(g, f, p.in[j], 0, added, n_added);
    if (p.n_in > 16 || *n_added >= MAX_COPIES) { /* candidates() keeps within both */
        ts_graph_fail(g, TS_ERR_INTERNAL, "recompute: a copy of %d inputs, %d copies", p.n_in,
                      *n_added);
        return TS_NONE;
    }
    ts_attrs a = p.a;
    ts_val y = ts_node_add(g, p.op, p.n_in, in, &a, NULL);
    if (ts_val_ok(y)) {
        g->nodes[g->n_nodes - 1].recompute = 1;
        added[(*n_added)++] = g->n_nodes - 1;
    }
    return y;
}

/* Recompute x for its backward readers (see the top). */
static ts_status recompute_value(ts_graph *g, int32_t x, const info *f) {
    const int n0 = g->n_nodes;
    int r0 = -1;
    for (int i = 0; i < n0 && r0 < 0; i++)
        for (int j = 0; j < g->nodes[i].n_in && !f->fwd[i]; j++)
            if (g->nodes[i].in[j] == x) r0 = i;
    if (r0 < 0) return ts_fail(TS_ERR_INTERNAL, "recompute: value %d has no backward reader", x);
    int32_t added[MAX_COPIES];
    int n_added = 0;
    ts_val y = copy_of(g, f, x, 1, added, &n_added);
    ts_status s = ts_graph_status(g);
    if (s != TS_OK) return s;
    for (int i = 0; i < n0; i++) /* the backward reads the copy */
        for (int j = 0; j < g->nodes[i].n_in && !f->fwd[i]; j++)
            if (g->nodes[i].in[j] == x) g->nodes[i].in[j] = y.id;
    /* The copies run in the backward: after the latest backward node x's
     * first reader reads; and before anything that writes their inputs. */
    int after = -1;
    for (int j = 0; j < g->nodes[r0].n_in; j++) {
        int q = g->values[g->nodes[r0].in[j]].node;
        if (q >= 0 && q < n0 && !f->fwd[q] && q > after) after = q;
    }
    for (int c = 0; c < n_added && s == TS_OK; c++) {
        const int nc = added[c];
        if (after >= 0) s = ts_node_add_ctrl(g, nc, after);
        for (int i = 0; i < n0 && s == TS_OK; i++) {
            if (!(ts_op_get(g->nodes[i].op)->flags & TS_OPF_SIDE_EFFECT)) continue;
            int reads = 0;
            for (int j = 0; j < g->nodes[i].n_in; j++)
                for (int q = 0; q < g->nodes[nc].n_in; q++)
                    reads |= g->nodes[i].in[j] == g->nodes[nc].in[q];
            if (reads) s = ts_node_add_ctrl(g, i, nc);
        }
    }
    if (s != TS_OK) return s;
    /* keep build order topological: the copies go right before r0 */
    int32_t *perm = ts_alloc(sizeof(int32_t) * ((size_t)g->n_nodes + 1), "recompute");
    if (!perm) return TS_ERR_NOMEM;
    int k = 0;
    for (int i = 0; i < n0; i++) {
        if (i == r0)
            for (int c = 0; c < n_added; c++) perm[k++] = added[c];
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
    info f = {0};
    cand *cs = NULL;
    size_t *live = NULL;
    size_t best = rep->arena;
    int stale = 0; /* rounds since the arena last shrank */
    while (rep->arena > limit && stale < 8) {
        free(cs), free(live);
        cs = ts_alloc(sizeof(cand) * ((size_t)g->n_values + 1), "recompute");
        live = ts_alloc(sizeof(size_t) * ((size_t)*n_order + 1), "recompute");
        if (!cs || !live || analyse(g, loss, &f) != TS_OK) {
            s = TS_ERR_NOMEM;
            break;
        }
        int nc = candidates(g, &f, cs);
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
            for (int c = 0; c < nc && got < excess; c++) {
                int32_t x = cs[c].v;
                int lf = pos[g->values[x].node], fb = *n_order;
                for (int i = 0; i < g->n_nodes; i++)
                    for (int j = 0; j < g->nodes[i].n_in; j++)
                        if (g->nodes[i].in[j] == x) {
                            if (f.fwd[i] && pos[i] > lf) lf = pos[i];
                            if (!f.fwd[i] && pos[i] < fb) fb = pos[i];
                        }
                /* pass 1: any candidate (the peak may move) */
                if (pass == 0 && !(lf < at && at < fb)) continue;
                cs[picked++] = cs[c], got += cs[c].bytes;
            }
        }
        free(pos);
        if (!picked) break;
        int applied = 0;
        for (int c = 0; c < picked && s == TS_OK; c++) {
            /* an earlier copy of this round may have made an input of this
             * one a copy: its chain may grow by two (its copies, at most
             * MAX_COPIES, are counted again) */
            double fl;
            if ((s = analyse(g, loss, &f)) != TS_OK || !candidate(g, &f, cs[c].v, CHAIN + 2, &fl))
                continue;
            if ((s = recompute_value(g, cs[c].v, &f)) == TS_OK) rr->n++, rr->flops += fl, applied++;
        }
        if (s == TS_OK && !applied) break;
        if (s != TS_OK) break;
        free(*order);
        *order = NULL;
        if ((s = ts_pass_schedule_mem(g, so, order, n_order, rep)) != TS_OK) break;
        rr->arena_after = rep->arena;
        stale = rep->arena < best ? 0 : stale + 1;
        if (rep->arena < best) best = rep->arena;
    }
    info_free(&f);
    free(cs), free(live);
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
