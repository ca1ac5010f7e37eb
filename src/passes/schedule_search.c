/* schedule_search: a memory-minimising order by dynamic programming over
 * the graph's downsets (the sets of nodes a prefix of an order can have
 * run), bounded to a beam.
 *
 * What is live after a prefix depends only on WHICH nodes ran, not in
 * which order, so two prefixes with the same set are interchangeable and
 * the one with the lower peak so far dominates. The search advances one
 * node per layer: every state of the layer is extended by each of its
 * ready nodes, children of equal sets are merged (keeping the lowest peak)
 * and the best `beam` children by (peak so far, live now) survive. With a
 * beam at least as wide as the widest layer this is exact (the DP over
 * branch interleavings); with a narrower one it is a beam search that
 * still sees past one branch's "hill" as long as the state survives. Ties
 * are broken by the parent's rank and the node id, so the result is the
 * same on every run and machine.
 *
 * The accounting is memplan's (memplan.c): a root lives from its producer
 * to its last reader, scratch at its node only, outputs and gradients are
 * pinned (not temporaries), views are free, and an in-place op's output
 * takes over its dying input's storage. */
#include <stdlib.h>
#include <string.h>
#include "schedule_search.h"

typedef struct sg {
    const ts_graph *g;
    int nn, nv, allow_inplace;
    int32_t *root;
    char *temp;
    size_t *bytes;   /* per root */
    size_t *alloc;   /* per node: bytes of its temporary outputs */
    size_t *scratch; /* per node */
    uint32_t *dead0; /* per node: bit j: output j is a temporary nobody reads */
    int *in_start;   /* per node: its distinct input roots (CSR) */
    int32_t *in_root;
    int *pred_start; /* predecessors (producers of inputs, control deps), CSR */
    int32_t *pred;
    int *succ_start; /* successors, CSR */
    int32_t *succ;
    int *cons_start; /* per root: the nodes reading it or a view of it, CSR */
    int32_t *cons;
    int32_t *inplace_src; /* per node: the root its output 0 may take over, else -1 */
    char *monitor;        /* per node: a monitor (runs as soon as ready) */
} sg;

static void sg_free(sg *s) {
    free(s->root), free(s->temp), free(s->bytes), free(s->alloc), free(s->scratch);
    free(s->dead0), free(s->in_start), free(s->in_root), free(s->pred_start), free(s->pred);
    free(s->succ_start), free(s->succ), free(s->cons_start), free(s->cons);
    free(s->inplace_src), free(s->monitor);
    memset(s, 0, sizeof *s);
}

static int cmp_i32(const void *a, const void *b) {
    int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
    return (x > y) - (x < y);
}

/* Distinct sorted entries of a[0..n), in place; returns the new count. */
static int uniq(int32_t *a, int n) {
    qsort(a, (size_t)n, sizeof *a, cmp_i32);
    int k = 0;
    for (int i = 0; i < n; i++)
        if (k == 0 || a[k - 1] != a[i]) a[k++] = a[i];
    return k;
}

static ts_status sg_init(sg *s, const ts_graph *g, int allow_inplace) {
    memset(s, 0, sizeof *s);
    int nv = g->n_values, nn = g->n_nodes;
    s->g = g, s->nn = nn, s->nv = nv, s->allow_inplace = allow_inplace;
    size_t n_in = 0, n_pred = 0;
    for (int i = 0; i < nn; i++)
        n_in += (size_t)g->nodes[i].n_in, n_pred += (size_t)g->nodes[i].n_ctrl;
    n_pred += n_in;
    s->root = ts_alloc(sizeof(int32_t) * ((size_t)nv + 1), "schedule");
    s->temp = ts_zalloc((size_t)nv + 1, "schedule");
    s->bytes = ts_zalloc(sizeof(size_t) * ((size_t)nv + 1), "schedule");
    s->alloc = ts_zalloc(sizeof(size_t) * ((size_t)nn + 1), "schedule");
    s->scratch = ts_zalloc(sizeof(size_t) * ((size_t)nn + 1), "schedule");
    s->dead0 = ts_zalloc(sizeof(uint32_t) * ((size_t)nn + 1), "schedule");
    s->in_start = ts_zalloc(sizeof(int) * ((size_t)nn + 2), "schedule");
    s->in_root = ts_alloc(sizeof(int32_t) * (n_in + 1), "schedule");
    s->pred_start = ts_zalloc(sizeof(int) * ((size_t)nn + 2), "schedule");
    s->pred = ts_alloc(sizeof(int32_t) * (n_pred + 1), "schedule");
    s->succ_start = ts_zalloc(sizeof(int) * ((size_t)nn + 2), "schedule");
    s->succ = ts_alloc(sizeof(int32_t) * (n_pred + 1), "schedule");
    s->cons_start = ts_zalloc(sizeof(int) * ((size_t)nv + 2), "schedule");
    s->cons = ts_alloc(sizeof(int32_t) * (n_in + 1), "schedule");
    s->inplace_src = ts_alloc(sizeof(int32_t) * ((size_t)nn + 1), "schedule");
    s->monitor = ts_zalloc((size_t)nn + 1, "schedule");
    if (!s->root || !s->temp || !s->bytes || !s->alloc || !s->scratch || !s->dead0 ||
        !s->in_start || !s->in_root || !s->pred_start || !s->pred || !s->succ_start || !s->succ ||
        !s->cons_start || !s->cons || !s->inplace_src || !s->monitor) {
        sg_free(s);
        return TS_ERR_NOMEM;
    }
    /* roots and temporaries, as memplan decides them */
    ts_view_roots(g, s->root);
    for (int v = 0; v < nv; v++) {
        const ts_value *val = &g->values[v];
        s->bytes[v] = ts_type_bytes(&val->t);
        s->temp[v] = val->kind == TS_VK_NODE;
    }
    for (int v = 0; v < nv; v++) {
        const ts_value *val = &g->values[v];
        if (val->kind != TS_VK_NODE || val->is_output || val->grad_of >= 0) s->temp[s->root[v]] = 0;
    }
    /* distinct input roots and predecessors per node */
    size_t k = 0, kp = 0;
    for (int i = 0; i < nn; i++) {
        const ts_node *n = &g->nodes[i];
        s->in_start[i] = (int)k;
        for (int j = 0; j < n->n_in; j++) s->in_root[k + (size_t)j] = s->root[n->in[j]];
        k += (size_t)uniq(s->in_root + k, n->n_in);
        s->pred_start[i] = (int)kp;
        int np = 0;
        for (int j = 0; j < n->n_in; j++)
            if (g->values[n->in[j]].node >= 0)
                s->pred[kp + (size_t)np++] = g->values[n->in[j]].node;
        for (int j = 0; j < n->n_ctrl; j++) s->pred[kp + (size_t)np++] = n->ctrl[j];
        kp += (size_t)uniq(s->pred + kp, np);
        const ts_op_def *def = ts_op_get(n->op);
        s->scratch[i] = def->scratch ? def->scratch(g, n) : 0;
        s->monitor[i] = (def->flags & TS_OPF_MONITOR) != 0;
    }
    s->in_start[nn] = (int)k;
    s->pred_start[nn] = (int)kp;
    /* successors and consumers (CSR by counting) */
    for (size_t e = 0; e < kp; e++) s->succ_start[s->pred[e] + 1]++;
    for (size_t e = 0; e < k; e++) s->cons_start[s->in_root[e] + 1]++;
    for (int i = 0; i < nn; i++) s->succ_start[i + 1] += s->succ_start[i];
    for (int v = 0; v < nv; v++) s->cons_start[v + 1] += s->cons_start[v];
    int *fs = ts_zalloc(sizeof(int) * ((size_t)nn + 1), "schedule");
    int *fc = ts_zalloc(sizeof(int) * ((size_t)nv + 1), "schedule");
    if (!fs || !fc) {
        free(fs), free(fc), sg_free(s);
        return TS_ERR_NOMEM;
    }
    for (int i = 0; i < nn; i++) {
        for (int e = s->pred_start[i]; e < s->pred_start[i + 1]; e++) {
            int p = s->pred[e];
            s->succ[s->succ_start[p] + fs[p]++] = i;
        }
        for (int e = s->in_start[i]; e < s->in_start[i + 1]; e++) {
            int r = s->in_root[e];
            s->cons[s->cons_start[r] + fc[r]++] = i;
        }
    }
    free(fs), free(fc);
    /* outputs: allocation, never-read temporaries, in-place candidates */
    for (int i = 0; i < nn; i++) {
        const ts_node *n = &g->nodes[i];
        unsigned fl = ts_op_get(n->op)->flags;
        s->inplace_src[i] = -1;
        if (fl & TS_OPF_ALIAS) continue;
        for (int j = 0; j < n->n_out; j++) {
            int32_t o = n->out[j];
            if (!s->temp[o]) continue;
            s->alloc[i] += s->bytes[o];
            if (s->cons_start[o + 1] == s->cons_start[o]) s->dead0[i] |= 1u << (j < 31 ? j : 31);
        }
        int src = (fl & TS_OPF_INPLACE) ? 0 : (fl & TS_OPF_INPLACE_IN1) ? 1 : -1;
        if (!allow_inplace || src < 0 || n->n_out < 1 || n->n_in <= src) continue;
        int32_t r = s->root[n->in[src]], o = n->out[0];
        if (!s->temp[r] || !s->temp[o] || s->root[o] != o || s->bytes[r] != s->bytes[o]) continue;
        int clash = 0;
        for (int j = 0; j < n->n_in; j++)
            clash |= j != src && s->root[n->in[j]] == r && n->in[j] != n->in[src];
        if (!clash) s->inplace_src[i] = r;
    }
    return TS_OK;
}

static int has(const uint64_t *set, int i) {
    return (int)((set[i >> 6] >> (i & 63)) & 1);
}

/* Readers of root r not yet in set (node i excluded when >= 0). */
static int pending(const sg *s, const uint64_t *set, int32_t r, int except) {
    int c = 0;
    for (int e = s->cons_start[r]; e < s->cons_start[r + 1]; e++)
        c += s->cons[e] != except && !has(set, s->cons[e]);
    return c;
}

/* Running node i after the nodes in set: the bytes live while it runs
 * (*at, on top of cur) and the change of live bytes once it ran (*delta). */
static void step_cost(const sg *s, const uint64_t *set, int i, size_t cur, size_t *at,
                      long long *delta) {
    const ts_node *n = &s->g->nodes[i];
    size_t alloc = s->alloc[i], freed = 0;
    int32_t ip = s->inplace_src[i];
    if (ip >= 0 && pending(s, set, ip, i) == 0) {
        alloc -= s->bytes[n->out[0]]; /* the output takes over the dying input */
    } else {
        ip = -1;
    }
    for (int e = s->in_start[i]; e < s->in_start[i + 1]; e++) {
        int32_t r = s->in_root[e];
        if (r != ip && s->temp[r] && pending(s, set, r, i) == 0) freed += s->bytes[r];
    }
    for (int j = 0; j < n->n_out && s->dead0[i]; j++)
        if (s->dead0[i] & (1u << (j < 31 ? j : 31))) freed += s->bytes[n->out[j]];
    *at = cur + alloc + s->scratch[i];
    *delta = (long long)alloc - (long long)freed;
}

ts_status ts_schedule_sim(const ts_graph *g, const int32_t *order, int n, int allow_inplace,
                          size_t *peak, size_t *live_at) {
    sg s;
    ts_status st = sg_init(&s, g, allow_inplace);
    if (st != TS_OK) return st;
    uint64_t *set = ts_zalloc(sizeof(uint64_t) * ((size_t)s.nn / 64 + 1), "schedule");
    if (!set) {
        sg_free(&s);
        return TS_ERR_NOMEM;
    }
    size_t cur = 0, pk = 0, at;
    long long d;
    for (int k = 0; k < n; k++) {
        step_cost(&s, set, order[k], cur, &at, &d);
        if (at > pk) pk = at;
        if (live_at) live_at[k] = at;
        cur = (size_t)((long long)cur + d);
        set[order[k] >> 6] |= 1ull << (order[k] & 63);
    }
    *peak = pk;
    free(set);
    sg_free(&s);
    return TS_OK;
}

/* One state of a layer: which nodes ran (bitset in the layer's pool), the
 * nodes ready now (in the layer's pool), live and peak bytes. */
typedef struct state {
    size_t cur, peak;
    uint64_t hash;
    int parent, node; /* index in the previous layer, the node it added */
    int n_ready;
} state;

typedef struct child {
    size_t cur, peak;
    uint64_t hash;
    int parent, node;
} child;

static int cmp_child(const void *a, const void *b) {
    const child *x = a, *y = b;
    if (x->peak != y->peak) return x->peak < y->peak ? -1 : 1;
    if (x->cur != y->cur) return x->cur < y->cur ? -1 : 1;
    if (x->parent != y->parent) return x->parent < y->parent ? -1 : 1;
    return (x->node > y->node) - (x->node < y->node);
}

static uint64_t node_key(int i) { /* splitmix64: a fixed random key per node */
    uint64_t z = (uint64_t)i + 0x9E3779B97F4A7C15ull;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

typedef struct layer {
    state *st;
    uint64_t *sets; /* beam * words */
    int32_t *ready; /* beam * nn */
    int n;
} layer;

ts_status ts_schedule_search(const ts_graph *g, const ts_search_opts *o, int32_t **order_out,
                             size_t *peak_out) {
    sg s;
    ts_status st = sg_init(&s, g, o->allow_inplace);
    if (st != TS_OK) return st;
    const int nn = s.nn, words = nn / 64 + 1;
    int beam = o->beam > 0 ? o->beam : 1;
    /* the work bound: layers x states x ready nodes stays near o->budget */
    if (o->budget > 0)
        while (beam > 1 && (long long)beam * nn * 16 > o->budget) beam /= 2;
    size_t max_children = 0;
    layer L[2] = {{0}};
    child *ch = NULL;
    int32_t *trace = ts_alloc(sizeof(int32_t) * 2 * ((size_t)nn * (size_t)beam + 1), "schedule");
    for (int l = 0; l < 2; l++) {
        L[l].st = ts_alloc(sizeof(state) * (size_t)beam, "schedule");
        L[l].sets = ts_zalloc(sizeof(uint64_t) * (size_t)words * (size_t)beam, "schedule");
        L[l].ready = ts_alloc(sizeof(int32_t) * ((size_t)nn + 1) * (size_t)beam, "schedule");
    }
    int32_t *order = ts_alloc(sizeof(int32_t) * ((size_t)nn + 1), "schedule");
    if (!trace || !order || !L[0].st || !L[0].sets || !L[0].ready || !L[1].st || !L[1].sets ||
        !L[1].ready) {
        st = TS_ERR_NOMEM;
        goto done;
    }
    /* layer 0: the empty set */
    L[0].n = 1;
    L[0].st[0] = (state){0, 0, 0, -1, -1, 0};
    for (int i = 0; i < nn; i++)
        if (s.pred_start[i + 1] == s.pred_start[i]) L[0].ready[L[0].st[0].n_ready++] = i;
    for (int k = 0; k < nn; k++) {
        layer *a = &L[k & 1], *b = &L[(k + 1) & 1];
        size_t need = 0;
        for (int p = 0; p < a->n; p++) need += (size_t)a->st[p].n_ready;
        if (need == 0) {
            st =
                ts_fail(TS_ERR_INTERNAL, "schedule: the graph has a cycle (%d of %d nodes)", k, nn);
            goto done;
        }
        if (need > max_children) {
            child *c2 = realloc(ch, sizeof(child) * need);
            if (!c2) {
                st = ts_fail(TS_ERR_NOMEM, "schedule: out of memory (%zu search states)", need);
                goto done;
            }
            ch = c2, max_children = need;
        }
        size_t nc = 0;
        for (int p = 0; p < a->n; p++) {
            const state *ps = &a->st[p];
            const uint64_t *set = a->sets + (size_t)p * (size_t)words;
            const int32_t *rd = a->ready + (size_t)p * (size_t)nn;
            int forced = -1; /* a ready monitor runs at once */
            for (int r = 0; r < ps->n_ready && forced < 0; r++)
                if (s.monitor[rd[r]]) forced = rd[r];
            for (int r = 0; r < ps->n_ready; r++) {
                int i = rd[r];
                if (forced >= 0 && i != forced) continue;
                size_t at;
                long long d;
                step_cost(&s, set, i, ps->cur, &at, &d);
                ch[nc++] = (child){(size_t)((long long)ps->cur + d), at > ps->peak ? at : ps->peak,
                                   ps->hash ^ node_key(i), p, i};
            }
        }
        qsort(ch, nc, sizeof *ch, cmp_child);
        b->n = 0;
        for (size_t c = 0; c < nc && b->n < beam; c++) {
            uint64_t *nset = b->sets + (size_t)b->n * (size_t)words;
            memcpy(nset, a->sets + (size_t)ch[c].parent * (size_t)words,
                   sizeof(uint64_t) * (size_t)words);
            nset[ch[c].node >> 6] |= 1ull << (ch[c].node & 63);
            int dup = 0; /* the same set reached more cheaply already */
            for (int q = 0; q < b->n && !dup; q++)
                dup =
                    b->st[q].hash == ch[c].hash && !memcmp(b->sets + (size_t)q * (size_t)words,
                                                           nset, sizeof(uint64_t) * (size_t)words);
            if (dup) continue;
            state *ns = &b->st[b->n];
            *ns = (state){ch[c].cur, ch[c].peak, ch[c].hash, ch[c].parent, ch[c].node, 0};
            /* ready: the parent's minus the node, plus successors now free */
            const state *ps = &a->st[ch[c].parent];
            const int32_t *rd = a->ready + (size_t)ch[c].parent * (size_t)nn;
            int32_t *nr = b->ready + (size_t)b->n * (size_t)nn;
            for (int r = 0; r < ps->n_ready; r++)
                if (rd[r] != ch[c].node) nr[ns->n_ready++] = rd[r];
            int i = ch[c].node;
            for (int e = s.succ_start[i]; e < s.succ_start[i + 1]; e++) {
                int v = s.succ[e], ok = 1;
                for (int q = s.pred_start[v]; q < s.pred_start[v + 1] && ok; q++)
                    ok = has(nset, s.pred[q]);
                if (ok) nr[ns->n_ready++] = v;
            }
            trace[2 * ((size_t)k * (size_t)beam + (size_t)b->n)] = ch[c].parent;
            trace[2 * ((size_t)k * (size_t)beam + (size_t)b->n) + 1] = ch[c].node;
            b->n++;
        }
    }
    /* the best final state, walked back through the layers */
    {
        const layer *f = &L[nn & 1];
        int p = 0;
        *peak_out = f->st[0].peak;
        for (int k = nn - 1; k >= 0; k--) {
            order[k] = trace[2 * ((size_t)k * (size_t)beam + (size_t)p) + 1];
            p = trace[2 * ((size_t)k * (size_t)beam + (size_t)p)];
        }
    }
    *order_out = order;
    order = NULL;
done:
    for (int l = 0; l < 2; l++) free(L[l].st), free(L[l].sets), free(L[l].ready);
    free(ch), free(trace), free(order);
    sg_free(&s);
    return st;
}
