/* schedule: choose the order nodes run in. A greedy list scheduler picks,
 * among the nodes whose inputs are ready, the one that adds the fewest live
 * bytes (outputs allocated minus inputs freed), ties broken by build order
 * so the result is deterministic. ts_pass_schedule keeps the better of this
 * order and the build order by estimated peak; ts_pass_schedule_mem (the
 * pass ts_compile runs) also tries the search of schedule_search.c and
 * keeps whichever order memplan lays out in the smallest region. */
#include <stdlib.h>
#include <string.h>
#include "passes.h"
#include "schedule_search.h"

typedef struct sched_ctx {
    const ts_graph *g;
    int32_t *root;  /* storage root of each value (views share their source) */
    char *temp;     /* root is an intermediate the planner may free */
    size_t *bytes;  /* bytes of each root */
    int *remaining; /* consumers of each root not yet scheduled */
    int32_t *succ;  /* successor lists (CSR) */
    int *succ_start;
    int *npred; /* unscheduled predecessors per node */
} sched_ctx;

static int is_alias_node(const ts_graph *g, int node) {
    return (ts_op_get(g->nodes[node].op)->flags & TS_OPF_ALIAS) != 0;
}

static size_t node_scratch(const ts_graph *g, int i) {
    const ts_op_def *def = ts_op_get(g->nodes[i].op);
    return def->scratch ? def->scratch(g, &g->nodes[i]) : 0;
}

/* Distinct storage roots read by node i, written into r (returns count). */
static int input_roots(const sched_ctx *c, int i, int32_t *r) {
    const ts_node *n = &c->g->nodes[i];
    int k = 0;
    for (int j = 0; j < n->n_in; j++) {
        int32_t x = c->root[n->in[j]], dup = 0;
        for (int q = 0; q < k; q++) dup |= r[q] == x;
        if (!dup) r[k++] = x;
    }
    return k;
}

static ts_status sched_init(sched_ctx *c, const ts_graph *g) {
    memset(c, 0, sizeof *c);
    c->g = g;
    int nv = g->n_values, nn = g->n_nodes;
    c->root = ts_alloc(sizeof(int32_t) * (size_t)(nv + 1), "schedule");
    c->temp = ts_zalloc((size_t)nv + 1, "schedule");
    c->bytes = ts_zalloc(sizeof(size_t) * (size_t)(nv + 1), "schedule");
    c->remaining = ts_zalloc(sizeof(int) * (size_t)(nv + 1), "schedule");
    c->npred = ts_zalloc(sizeof(int) * (size_t)(nn + 1), "schedule");
    c->succ_start = ts_zalloc(sizeof(int) * (size_t)(nn + 2), "schedule");
    if (!c->root || !c->temp || !c->bytes || !c->remaining || !c->npred || !c->succ_start)
        return TS_ERR_NOMEM;
    ts_view_roots(g, c->root);
    for (int v = 0; v < nv; v++) c->bytes[v] = ts_type_bytes(&g->values[v].t);
    for (int v = 0; v < nv; v++) {
        const ts_value *val = &g->values[c->root[v]];
        if (c->root[v] == v)
            c->temp[v] = val->kind == TS_VK_NODE && !val->is_output && val->grad_of < 0;
        if (g->values[v].is_output || g->values[v].grad_of >= 0) c->temp[c->root[v]] = 0;
    }
    /* Edges: producer of each input, and control dependencies. */
    int *cnt = c->succ_start;
    int32_t rbuf[64];
    for (int i = 0; i < nn; i++) {
        const ts_node *n = &g->nodes[i];
        for (int j = 0; j < n->n_in; j++) {
            int p = g->values[n->in[j]].node;
            if (p >= 0) cnt[p + 1]++, c->npred[i]++;
        }
        for (int j = 0; j < n->n_ctrl; j++) cnt[n->ctrl[j] + 1]++, c->npred[i]++;
        int k = n->n_in <= 64 ? input_roots(c, i, rbuf) : 0;
        for (int q = 0; q < k; q++) c->remaining[rbuf[q]]++;
        if (n->n_in > 64)
            for (int j = 0; j < n->n_in; j++) c->remaining[c->root[n->in[j]]]++;
    }
    for (int i = 0; i < nn; i++) cnt[i + 1] += cnt[i];
    c->succ = ts_alloc(sizeof(int32_t) * (size_t)(cnt[nn] + 1), "schedule");
    int *fill = ts_zalloc(sizeof(int) * (size_t)(nn + 1), "schedule");
    if (!c->succ || !fill) {
        free(fill);
        return TS_ERR_NOMEM;
    }
    for (int i = 0; i < nn; i++) {
        const ts_node *n = &g->nodes[i];
        for (int j = 0; j < n->n_in; j++) {
            int p = g->values[n->in[j]].node;
            if (p >= 0) c->succ[cnt[p] + fill[p]++] = i;
        }
        for (int j = 0; j < n->n_ctrl; j++) {
            int p = n->ctrl[j];
            c->succ[cnt[p] + fill[p]++] = i;
        }
    }
    free(fill);
    return TS_OK;
}

static void sched_free(sched_ctx *c) {
    free(c->root);
    free(c->temp);
    free(c->bytes);
    free(c->remaining);
    free(c->npred);
    free(c->succ_start);
    free(c->succ);
}

static size_t alloc_bytes(const sched_ctx *c, int i) {
    const ts_node *n = &c->g->nodes[i];
    size_t a = 0;
    if (is_alias_node(c->g, i)) return 0;
    for (int j = 0; j < n->n_out; j++)
        if (c->temp[n->out[j]]) a += c->bytes[n->out[j]];
    return a;
}

static size_t freed_bytes(const sched_ctx *c, int i) {
    int32_t r[64];
    const ts_node *n = &c->g->nodes[i];
    if (n->n_in > 64) return 0;
    int k = input_roots(c, i, r);
    size_t f = 0;
    for (int q = 0; q < k; q++)
        if (c->temp[r[q]] && c->remaining[r[q]] == 1) f += c->bytes[r[q]];
    return f;
}

static void consume(sched_ctx *c, int i) {
    int32_t r[64];
    const ts_node *n = &c->g->nodes[i];
    if (n->n_in > 64) {
        for (int j = 0; j < n->n_in; j++) c->remaining[c->root[n->in[j]]]--;
        return;
    }
    int k = input_roots(c, i, r);
    for (int q = 0; q < k; q++) c->remaining[r[q]]--;
}

/* Simulate `order`, returning the peak of live intermediate bytes. */
static size_t simulate(sched_ctx *c, const int32_t *order, int n) {
    size_t cur = 0, peak = 0;
    for (int k = 0; k < n; k++) {
        int i = order[k];
        size_t a = alloc_bytes(c, i), f = freed_bytes(c, i), s = node_scratch(c->g, i);
        if (cur + a + s > peak) peak = cur + a + s;
        cur += a;
        cur -= f;
        consume(c, i);
    }
    return peak;
}

size_t ts_schedule_peak(const ts_graph *g, const int32_t *order, int n) {
    sched_ctx c;
    size_t peak = 0;
    if (sched_init(&c, g) == TS_OK) peak = simulate(&c, order, n);
    sched_free(&c);
    return peak;
}

ts_status ts_pass_schedule(const ts_graph *g, int naive, int32_t **order_out, int *n_order,
                           size_t *peak_out, size_t *naive_peak_out) {
    int nn = g->n_nodes;
    int32_t *naive_order = ts_alloc(sizeof(int32_t) * (size_t)(nn + 1), "schedule");
    int32_t *order = ts_alloc(sizeof(int32_t) * (size_t)(nn + 1), "schedule");
    int32_t *ready = ts_alloc(sizeof(int32_t) * (size_t)(nn + 1), "schedule");
    if (!naive_order || !order || !ready) {
        free(naive_order);
        free(order);
        free(ready);
        return TS_ERR_NOMEM;
    }
    for (int i = 0; i < nn; i++) naive_order[i] = i;
    size_t naive_peak = ts_schedule_peak(g, naive_order, nn), peak = naive_peak;
    sched_ctx c;
    ts_status s = sched_init(&c, g);
    if (s == TS_OK && !naive) {
        int nr = 0, done = 0;
        for (int i = 0; i < nn; i++)
            if (c.npred[i] == 0) ready[nr++] = i;
        while (nr > 0) {
            int best = -1;
            long long best_score = 0;
            for (int r = 0; r < nr; r++) {
                int i = ready[r];
                /* A monitor runs as soon as it is ready: right after the
                 * gradient it reads, while that is still in cache. */
                if (ts_op_get(c.g->nodes[i].op)->flags & TS_OPF_MONITOR) {
                    best = r;
                    break;
                }
                long long score = (long long)alloc_bytes(&c, i) - (long long)freed_bytes(&c, i);
                if (best < 0 || score < best_score || (score == best_score && i < ready[best])) {
                    best = r;
                    best_score = score;
                }
            }
            int i = ready[best];
            ready[best] = ready[--nr];
            order[done++] = i;
            consume(&c, i);
            for (int e = c.succ_start[i]; e < c.succ_start[i + 1]; e++)
                if (--c.npred[c.succ[e]] == 0) ready[nr++] = c.succ[e];
        }
        if (done != nn) {
            s = ts_fail(TS_ERR_INTERNAL, "schedule: the graph has a cycle (%d of %d nodes)", done,
                        nn);
        } else {
            peak = ts_schedule_peak(g, order, nn);
        }
    }
    sched_free(&c);
    free(ready);
    if (s != TS_OK) {
        free(naive_order);
        free(order);
        return s;
    }
    if (naive || peak >= naive_peak) {
        free(order);
        order = naive_order;
        peak = naive_peak;
    } else {
        free(naive_order);
    }
    *order_out = order;
    *n_order = nn;
    if (peak_out) *peak_out = peak;
    if (naive_peak_out) *naive_peak_out = naive_peak;
    return TS_OK;
}

/* The temporaries region memplan makes for `order`. */
static ts_status region(const ts_graph *g, const int32_t *order, int n, int allow_inplace,
                        size_t *bytes, size_t *arena) {
    ts_memplan mp;
    ts_status s = ts_pass_memplan(g, order, n, allow_inplace, &mp);
    if (s == TS_OK) *bytes = mp.temp_bytes, *arena = mp.arena_bytes;
    ts_memplan_free(&mp);
    return s;
}

ts_status ts_pass_schedule_mem(const ts_graph *g, const ts_schedule_options *o, int32_t **order_out,
                               int *n_order, ts_schedule_report *rep) {
    const int nn = g->n_nodes;
    int32_t *cand[3] = {NULL, NULL, NULL}; /* build order, greedy, search */
    size_t bytes[3] = {SIZE_MAX, SIZE_MAX, SIZE_MAX}, arena[3] = {0, 0, 0};
    int n = 0;
    memset(rep, 0, sizeof *rep);
    ts_status s = ts_pass_schedule(g, 1, &cand[0], &n, NULL, NULL);
    if (s == TS_OK) s = region(g, cand[0], nn, o->allow_inplace, &bytes[0], &arena[0]);
    if (s == TS_OK && !o->naive) {
        size_t est;
        ts_search_opts so = {o->beam > 0 ? o->beam : TS_SCHEDULE_BEAM, 0, o->allow_inplace};
        so.budget = (long long)1 << 31;
        s = ts_pass_schedule(g, 0, &cand[1], &n, NULL, NULL);
        if (s == TS_OK) s = region(g, cand[1], nn, o->allow_inplace, &bytes[1], &arena[1]);
        if (s == TS_OK) s = ts_schedule_search(g, &so, &cand[2], &est);
        if (s == TS_OK) s = region(g, cand[2], nn, o->allow_inplace, &bytes[2], &arena[2]);
        if (s == TS_OK) rep->search_peak = est;
    }
    int best = 0; /* ties keep the earlier candidate: build order first */
    for (int k = 1; k < 3 && s == TS_OK; k++)
        if (cand[k] && bytes[k] < bytes[best]) best = k;
    if (s == TS_OK) {
        static const char *const names[3] = {"build order", "greedy", "search"};
        *order_out = cand[best];
        cand[best] = NULL;
        *n_order = nn;
        rep->peak = bytes[best];
        rep->arena = arena[best];
        rep->naive_peak = bytes[0];
        rep->greedy_peak = bytes[1];
        rep->search_region = bytes[2];
        rep->method = names[best];
    }
    for (int k = 0; k < 3; k++) free(cand[k]);
    return s;
}
