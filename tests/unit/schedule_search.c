/* The order search of the schedule pass (src/passes/schedule_search.c):
 * on a two-branch graph where the greedy order is worse than the best one,
 * and on random small graphs against every topological order (brute
 * force), the search with an exact-width beam finds the optimal peak; its
 * result is the same on every run; its estimate equals memplan's region on
 * a chain; the schedule pass keeps build order when nothing is better. */
#include <stdlib.h>
#include <string.h>
#include "check.h"
#include "passes/passes.h"
#include "passes/schedule_search.h"

enum { U = 256 }; /* one unit: 256 floats, 1 KiB */

static ts_val vec(ts_graph *g, const char *name, int units) {
    int64_t d[1] = {(int64_t)units * U};
    return ts_input(g, name, TS_F32, 1, d);
}

/* k copies of x joined: a value of k units. */
static ts_val grow(ts_graph *g, ts_val x, int k) {
    ts_val parts[16];
    for (int i = 0; i < k; i++) parts[i] = x;
    return ts_concat(g, k, parts, 0);
}

/* the first unit of a */
static ts_val shrink(ts_graph *g, ts_val a) {
    return ts_slice(g, a, 0, 0, U);
}

/* The best peak over every topological order (brute force). */
typedef struct brute {
    const ts_graph *g;
    int n, *npred, best_set;
    int32_t *order;
    size_t best;
    long long visited;
} brute;

static void enumerate(brute *b, int k) {
    if (k == b->n) {
        size_t pk;
        if (ts_schedule_sim(b->g, b->order, b->n, 1, &pk, NULL) == TS_OK &&
            (!b->best_set || pk < b->best))
            b->best = pk, b->best_set = 1;
        b->visited++;
        return;
    }
    for (int i = 0; i < b->n; i++) {
        if (b->npred[i] != 0) continue;
        const ts_node *nd = &b->g->nodes[i];
        b->npred[i] = -1;
        b->order[k] = i;
        for (int j = i + 1; j < b->n; j++)
            for (int q = 0; q < b->g->nodes[j].n_in; q++)
                if (b->g->values[b->g->nodes[j].in[q]].node == i) b->npred[j]--;
        enumerate(b, k + 1);
        for (int j = i + 1; j < b->n; j++)
            for (int q = 0; q < b->g->nodes[j].n_in; q++)
                if (b->g->values[b->g->nodes[j].in[q]].node == i) b->npred[j]++;
        b->npred[i] = 0;
        (void)nd;
    }
}

static size_t brute_best(const ts_graph *g) {
    brute b = {g, g->n_nodes, NULL, 0, NULL, 0, 0};
    b.npred = calloc((size_t)b.n + 1, sizeof(int));
    b.order = calloc((size_t)b.n + 1, sizeof(int32_t));
    for (int j = 0; j < b.n; j++)
        for (int q = 0; q < g->nodes[j].n_in; q++)
            if (g->values[g->nodes[j].in[q]].node >= 0) b.npred[j]++;
    enumerate(&b, 0);
    free(b.npred);
    free(b.order);
    return b.best;
}

static size_t search(const ts_graph *g, int beam, int32_t **order) {
    ts_search_opts o = {beam, 0, 1};
    size_t pk = 0;
    int32_t *ord = NULL;
    CHECK_OK(ts_schedule_search(g, &o, &ord, &pk));
    if (order)
        *order = ord;
    else
        free(ord);
    return pk;
}

/* Branch A rises to 10 units and falls to 1, branch B to 5 and falls to 1.
 * Greedy starts the cheaper branch B and then climbs A's hill on top of B's
 * residue (peak 12 units); A first peaks at 11. */
static void hill_valley(void) {
    ts_graph *g = ts_graph_new();
    ts_val x = vec(g, "x", 1);
    ts_val b = shrink(g, grow(g, x, 5)); /* built first: build order starts with B */
    ts_val a = shrink(g, grow(g, x, 10));
    CHECK_OK(ts_mark_output(g, ts_add(g, a, b), "y"));
    CHECK_OK(ts_graph_status(g));
    const size_t unit = U * sizeof(float);
    int32_t *ord = NULL;
    size_t greedy = search(g, 1, NULL), best = search(g, 64, &ord);
    CHECK(greedy == 12 * unit, "beam 1 (greedy) peak %zu, want %zu", greedy, 12 * unit);
    CHECK(best == 11 * unit, "search peak %zu, want %zu", best, 11 * unit);
    CHECK(brute_best(g) == best, "brute force %zu vs search %zu", brute_best(g), best);
    /* A's concat (node 2) runs first */
    CHECK(ord && ord[0] == 2, "search starts with node %d, want 2 (branch A)", ord ? ord[0] : -1);
    size_t sim = 0;
    CHECK_OK(ts_schedule_sim(g, ord, g->n_nodes, 1, &sim, NULL));
    CHECK(sim == best, "simulated %zu vs search %zu", sim, best);
    /* the pass: the searched order, its region equal to the estimate */
    ts_schedule_options so = {0, 1, 0};
    ts_schedule_report rep;
    int32_t *order = NULL;
    int n = 0;
    CHECK_OK(ts_pass_schedule_mem(g, &so, &order, &n, &rep));
    CHECK(rep.peak == 11 * unit && !strcmp(rep.method, "search"),
          "pass: %s with %zu bytes, want search with %zu", rep.method, rep.peak, 11 * unit);
    CHECK(rep.naive_peak == 12 * unit, "build order region %zu, want %zu", rep.naive_peak,
          12 * unit);
    so.naive = 1;
    free(order);
    CHECK_OK(ts_pass_schedule_mem(g, &so, &order, &n, &rep));
    CHECK(!strcmp(rep.method, "build order") && order[0] == 0 && order[1] == 1,
          "naive: %s, order starts %d %d", rep.method, order[0], order[1]);
    free(order);
    free(ord);
    ts_graph_free(g);
}

/* A random DAG of n nodes over two inputs: concats that grow, slices that
 * shrink, relus that may run in place; every value nobody reads is an
 * output. */
static ts_graph *random_dag(unsigned *seed, int n) {
    ts_graph *g = ts_graph_new();
    ts_val pool[32];
    int units[32], np = 0, used[32] = {0};
    pool[np] = vec(g, "x", 1), units[np++] = 1;
    pool[np] = vec(g, "z", 2), units[np++] = 2;
    for (int i = 0; i < n; i++) {
        int kind = rand_r(seed) % 3, a = rand_r(seed) % np;
        ts_val v;
        int u;
        if (kind == 0 || units[a] == 1) {
            int b = rand_r(seed) % np;
            if (units[a] + units[b] > 12) b = a;
            ts_val parts[2] = {pool[a], pool[b]};
            int k = units[a] + units[b] > 12 ? 1 : 2;
            v = ts_concat(g, k, parts, 0), u = k == 2 ? units[a] + units[b] : units[a];
            used[b] = 1;
        } else if (kind == 1) {
            v = ts_slice(g, pool[a], 0, 0, (int64_t)(units[a] / 2) * U), u = units[a] / 2;
        } else {
            v = ts_relu(g, pool[a]), u = units[a];
        }
        used[a] = 1;
        pool[np] = v, units[np++] = u;
    }
    for (int i = 2; i < np; i++) {
        if (used[i]) continue;
        char name[16];
        snprintf(name, sizeof name, "out%d", i);
        ts_mark_output(g, pool[i], name);
    }
    return g;
}

static void random_graphs(void) {
    unsigned seed = 12345;
    int better = 0;
    for (int t = 0; t < 40; t++) {
        ts_graph *g = random_dag(&seed, 6 + t % 4);
        CHECK_OK(ts_graph_status(g));
        if (ts_graph_status(g) != TS_OK) {
            ts_graph_free(g);
            continue;
        }
        size_t bf = brute_best(g);
        int32_t *o1 = NULL, *o2 = NULL;
        size_t s = search(g, 4096, &o1);
        CHECK(s == bf, "graph %d (%d nodes): search %zu, brute force %zu", t, g->n_nodes, s, bf);
        CHECK(search(g, 4096, &o2) == s && o1 && o2 &&
                  !memcmp(o1, o2, sizeof(int32_t) * (size_t)g->n_nodes),
              "graph %d: a second search chose another order", t);
        size_t greedy = search(g, 1, NULL);
        CHECK(greedy >= s, "graph %d: beam 1 %zu below the optimum %zu", t, greedy, s);
        better += greedy > s;
        free(o1);
        free(o2);
        ts_graph_free(g);
    }
    /* the random graphs must exercise the search, not only the greedy path */
    CHECK(better > 0, "no random graph where the search beats beam 1");
    printf("random graphs: search beat beam 1 on %d of 40\n", better);
}

/* A chain: one order; the estimate equals memplan's temporaries. */
static void chain(void) {
    ts_graph *g = ts_graph_new();
    ts_val x = vec(g, "x", 2);
    ts_val a = grow(g, x, 3); /* 6 units */
    ts_val b = ts_relu(g, a); /* in place over a */
    ts_val c = ts_slice(g, b, 0, 0, 2 * U);
    CHECK_OK(ts_mark_output(g, ts_exp(g, c), "y"));
    int32_t *ord = NULL;
    size_t pk = search(g, 8, &ord);
    ts_memplan mp;
    CHECK_OK(ts_pass_memplan(g, ord, g->n_nodes, 1, &mp));
    CHECK(mp.temp_bytes == pk, "chain: memplan %zu, estimate %zu", mp.temp_bytes, pk);
    CHECK(pk == 8 * U * sizeof(float), "chain: peak %zu, want 8 units", pk);
    ts_memplan_free(&mp);
    free(ord);
    ts_graph_free(g);
}

int main(void) {
    hill_valley();
    random_graphs();
    chain();
    return check_summary("schedule_search");
}
