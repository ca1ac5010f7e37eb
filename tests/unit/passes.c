/* The compiler passes on their own: simplify (DCE, CSE, folding), the
 * schedule, and a memory plan verified against liveness. */
#include <stdlib.h>
#include <string.h>
#include "check.h"
#include "plan/plan.h"

static int count_op(const ts_graph *g, int op) {
    int n = 0;
    for (int i = 0; i < g->n_nodes; i++) n += !g->nodes[i].dead && g->nodes[i].op == op;
    return n;
}

static void test_simplify(void) {
    ts_graph *g = ts_graph_new();
    int64_t d[2] = {4, 8};
    ts_val x = ts_input(g, "x", TS_F32, 2, d);
    ts_val a = ts_exp(g, x), b = ts_exp(g, x); /* CSE: one exp */
    ts_val unused = ts_tanh(g, x);             /* DCE */
    (void)unused;
    ts_val c = ts_add(g, ts_scalar(g, 2, TS_F32), ts_scalar(g, 3, TS_F32)); /* folds to 5 */
    ts_val y = ts_mul(g, ts_add(g, a, b), c);
    ts_mark_output(g, y, "y");
    CHECK(count_op(g, TS_OP_EXP) == 2 && count_op(g, TS_OP_TANH) == 1, "graph as built");
    ts_graph *s = ts_graph_clone(g);
    CHECK_OK(ts_pass_simplify(s, NULL));
    CHECK(count_op(s, TS_OP_EXP) == 1, "CSE merged the two exps (%d left)", count_op(s, TS_OP_EXP));
    CHECK(count_op(s, TS_OP_TANH) == 0, "DCE removed the unused tanh");
    CHECK(count_op(s, TS_OP_ADD) == 1, "folding removed the constant add (%d adds)",
          count_op(s, TS_OP_ADD));
    CHECK_OK(ts_graph_verify(s));
    ts_graph_free(s);
    /* The simplified plan computes the same as the plain one. */
    ts_compile_options o = ts_compile_options_default();
    ts_plan *p1, *p2;
    CHECK_OK(ts_compile(g, NULL, &o, &p1));
    o.no_simplify = 1;
    CHECK_OK(ts_compile(g, NULL, &o, &p2));
    float xb[32], y1[32], y2[32];
    for (int i = 0; i < 32; i++) xb[i] = (float)i / 32;
    ts_plan_set_input(p1, "x", xb, sizeof xb);
    ts_plan_set_input(p2, "x", xb, sizeof xb);
    CHECK_OK(ts_plan_step(p1));
    CHECK_OK(ts_plan_step(p2));
    ts_plan_read(p1, "y", y1, sizeof y1);
    ts_plan_read(p2, "y", y2, sizeof y2);
    CHECK(memcmp(y1, y2, sizeof y1) == 0, "simplified and plain plans agree");
    CHECK_NEAR(y1[3], 10 * exp(3.0 / 32), 1e-5);
    ts_plan_free(p1);
    ts_plan_free(p2);
    ts_graph_free(g);
}

/* Every pair of values alive at the same time occupies disjoint bytes,
 * except a view and its source, and an in-place output and its input. */
static int verify_memory(const ts_compiled_graph *p) {
    const ts_graph *g = p->graph;
    int nv = g->n_values, bad = 0;
    int *pos = malloc(sizeof(int) * (size_t)g->n_nodes);
    int *def = malloc(sizeof(int) * (size_t)nv), *last = malloc(sizeof(int) * (size_t)nv);
    int32_t *src = malloc(sizeof(int32_t) * (size_t)nv);
    for (int k = 0; k < p->n_order; k++) pos[p->order[k]] = k;
    for (int v = 0; v < nv; v++) {
        const ts_value *val = &g->values[v];
        int persistent = val->kind != TS_VK_NODE;
        def[v] = persistent ? -1 : pos[val->node];
        last[v] = persistent ? p->n_order : def[v];
        src[v] = v;
        if (!persistent && (ts_op_get(g->nodes[val->node].op)->flags & TS_OPF_ALIAS))
            src[v] = src[g->nodes[val->node].in[0]];
        if (val->is_output || val->grad_of >= 0) last[v] = p->n_order;
    }
    for (int k = 0; k < p->n_order; k++) {
        const ts_node *n = &g->nodes[p->order[k]];
        for (int j = 0; j < n->n_in; j++)
            if (last[n->in[j]] < k) last[n->in[j]] = k;
    }
    for (int v = 0; v < nv; v++) /* a view keeps its source alive */
        if (last[v] > last[src[v]]) last[src[v]] = last[v];
    for (int a = 0; a < nv; a++) {
        if (src[a] != a) continue;
        size_t ao = p->mp.off[a], ab = ts_type_bytes(&g->values[a].t);
        for (int b = a + 1; b < nv; b++) {
            if (src[b] != b) continue;
            size_t bo = p->mp.off[b], bb = ts_type_bytes(&g->values[b].t);
            if (ao + ab <= bo || bo + bb <= ao || !ab || !bb) continue;
            if (def[a] > last[b] || def[b] > last[a]) continue;
            /* In place: b's producer is where a dies and writes over it (or vice versa). */
            int ok = 0;
            for (int r = 0; r < 2 && !ok; r++) {
                int x = r ? b : a, y = r ? a : b;
                const ts_value *yv = &g->values[y];
                if (yv->kind != TS_VK_NODE) continue;
                const ts_node *n = &g->nodes[yv->node];
                ok = (ts_op_get(n->op)->flags & TS_OPF_INPLACE) && n->out[0] == y &&
                     src[n->in[0]] == x && last[x] == def[y] && ao == bo;
            }
            if (!ok) {
                char l1[32], l2[32];
                if (bad < 5)
                    fprintf(stderr, "overlap: %s [%d,%d] @%zu+%zu and %s [%d,%d] @%zu+%zu\n",
                            ts_value_label(g, a, l1, sizeof l1), def[a], last[a], ao, ab,
                            ts_value_label(g, b, l2, sizeof l2), def[b], last[b], bo, bb);
                bad++;
            }
        }
    }
    free(pos);
    free(def);
    free(last);
    free(src);
    return bad;
}

static void test_memplan(const char *label, ts_graph *g, ts_val loss) {
    ts_train_spec spec = ts_train_spec_default(loss);
    spec.opt = ts_adamw(1e-3, 0.9, 0.999, 1e-8, 0.01);
    ts_plan *p;
    ts_compiled_graph kept; /* the final graph, schedule and memory plan */
    CHECK_OK(ts_compile_keep(g, &spec, NULL, &p, &kept));
    if (!p) {
        ts_compiled_graph_free(&kept);
        return;
    }
    ts_plan_stats st;
    ts_plan_get_stats(p, &st);
    CHECK(verify_memory(&kept) == 0, "%s: the memory plan has overlapping live tensors", label);
    CHECK(st.arena_bytes < st.naive_bytes, "%s: arena %zu not below naive %zu", label,
          st.arena_bytes, st.naive_bytes);
    CHECK(st.peak_live_bytes <= st.naive_peak_bytes, "%s: schedule peak %zu above naive %zu", label,
          st.peak_live_bytes, st.naive_peak_bytes);
    CHECK(st.n_inplace > 0, "%s: no in-place reuse found", label);
    /* Params, grads and optimizer state are three contiguous regions. */
    const ts_arena_layout *l = &p->prog.layout;
    CHECK(l->grad_off == l->param_off + l->param_bytes &&
              l->state_off == l->grad_off + l->grad_bytes,
          "%s: persistent regions are not contiguous", label);
    CHECK(l->state_bytes == 2 * l->param_bytes, "%s: AdamW state is 2x params", label);
    printf(
        "%s: arena %zu bytes, naive %zu (%.2fx), peak live %zu vs build order %zu, %d in place\n",
        label, st.arena_bytes, st.naive_bytes, (double)st.naive_bytes / (double)st.arena_bytes,
        st.peak_live_bytes, st.naive_peak_bytes, st.n_inplace);
    ts_plan_free(p);
    ts_compiled_graph_free(&kept);
}

int main(void) {
    test_simplify();
    ts_mlp_config mc = {32, 8, 8, 0, 64, 2, 1, 1, 0};
    ts_graph *g = ts_graph_new();
    ts_model m;
    CHECK_OK(ts_build_mlp(g, &mc, &m));
    test_memplan("mlp", g, m.loss);
    ts_graph_free(g);
    ts_gpt_config gc = {2, 16, 64, 32, 2, 2, 0.0};
    g = ts_graph_new();
    CHECK_OK(ts_build_gpt(g, &gc, &m));
    test_memplan("gpt", g, m.loss);
    ts_graph_free(g);
    return check_summary("passes");
}
