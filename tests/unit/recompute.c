/* Memory savers of a training plan: recomputation of large GELU /
 * LayerNorm / attention-permute outputs in the backward, and the logits'
 * gradient written over the logits (discard_outputs). Both must leave the
 * trained parameters bit-identical and make the arena smaller. */
#include <stdlib.h>
#include <string.h>
#include "check.h"
#include "passes/passes.h"

typedef struct result {
    int n;
    float *params[64];
    size_t bytes[64];
    size_t arena;
    int n_ins;
    float loss;
} result;

/* A GPT whose MLP activation [4*128, 1024] f32 is 2 MiB: large enough to be
 * recomputed. */
static const ts_gpt_config GC = {4, 128, 64, 256, 2, 4, 0.0};

static int train(int no_recompute, int discard, result *out) {
    ts_graph *g = ts_graph_new();
    ts_model m;
    CHECK_OK(ts_build_gpt(g, &GC, &m));
    ts_train_spec spec = ts_train_spec_default(m.loss);
    spec.opt = ts_adamw(1e-3, 0.9, 0.999, 1e-8, 0.1);
    ts_compile_options opt = ts_compile_options_default();
    opt.seed = 11;
    opt.threads = 2;
    opt.no_recompute = no_recompute;
    opt.discard_outputs = discard;
    ts_plan *p;
    ts_status s = ts_compile(g, &spec, &opt, &p);
    ts_graph_free(g);
    CHECK(s == TS_OK, "compile: %s", ts_last_error());
    if (s != TS_OK) return 1;
    unsigned seed = 5;
    int64_t tok[4 * 128], tgt[4 * 128];
    for (int step = 0; step < 2; step++) {
        for (int i = 0; i < 4 * 128; i++) tok[i] = rand_r(&seed) % 64, tgt[i] = rand_r(&seed) % 64;
        CHECK_OK(ts_plan_set_input(p, "tokens", tok, sizeof tok));
        CHECK_OK(ts_plan_set_input(p, "targets", tgt, sizeof tgt));
        CHECK_OK(ts_plan_step(p));
    }
    ts_plan_read(p, "loss", &out->loss, sizeof out->loss);
    float one;
    ts_status rs = ts_plan_read(p, "logits", &one, sizeof one);
    CHECK(discard ? rs != TS_OK : rs != TS_ERR_NOT_FOUND,
          "logits %s readable with discard_outputs = %d", rs == TS_OK ? "are" : "are not", discard);
    ts_plan_stats st;
    ts_plan_get_stats(p, &st);
    out->arena = st.arena_bytes;
    out->n_ins = st.n_instructions;
    out->n = ts_plan_param_count(p);
    for (int i = 0; i < out->n && i < 64; i++) {
        const char *name = ts_plan_param_name(p, i);
        int rank;
        int64_t dims[8];
        ts_plan_value_info(p, name, NULL, &rank, dims);
        out->bytes[i] = sizeof(float);
        for (int d = 0; d < rank; d++) out->bytes[i] *= (size_t)dims[d];
        out->params[i] = malloc(out->bytes[i]);
        ts_plan_read(p, name, out->params[i], out->bytes[i]);
    }
    ts_plan_free(p);
    return 0;
}

static int same_params(const result *a, const result *b) {
    if (a->n != b->n || a->n == 0) return 0;
    for (int i = 0; i < a->n && i < 64; i++)
        if (a->bytes[i] != b->bytes[i] || memcmp(a->params[i], b->params[i], a->bytes[i])) return 0;
    return 1;
}

static void release(result *r) {
    for (int i = 0; i < r->n && i < 64; i++) free(r->params[i]);
}

/* The recomputed copies are marked on the node (ts_node.recompute) and CSE
 * keeps them apart from the forward nodes they copy. */
static void marked_copies(void) {
    ts_graph *g = ts_graph_new();
    ts_model m;
    CHECK_OK(ts_build_gpt(g, &GC, &m));
    int32_t params[64], grads[64];
    int np = 0;
    for (int i = 0; i < g->n_values && np < 64; i++)
        if (g->values[i].kind == TS_VK_PARAM) params[np++] = i;
    CHECK_OK(ts_pass_autodiff_ex(g, m.loss.id, params, np, grads, 1));
    int marked = 0, n_live = 0;
    for (int i = 0; i < g->n_nodes; i++) {
        const ts_node *n = &g->nodes[i];
        if (!n->recompute) continue;
        marked++;
        CHECK(n->op == TS_OP_GELU || n->op == TS_OP_LAYER_NORM || n->op == TS_OP_PERMUTE ||
                  n->op == TS_OP_RESHAPE,
              "node %d (op %d) marked recomputed", i, n->op);
    }
    CHECK(marked > 0, "no node marked recomputed");
    int32_t *remap = NULL;
    CHECK_OK(ts_pass_simplify(g, &remap));
    free(remap);
    for (int i = 0; i < g->n_nodes; i++) n_live += g->nodes[i].recompute && !g->nodes[i].dead;
    CHECK(n_live == marked, "CSE merged recomputed copies: %d of %d left", n_live, marked);
    ts_graph_free(g);
}

int main(void) {
    marked_copies();
    result keep = {0}, again = {0}, discard = {0};
    if (train(1, 0, &keep) || train(0, 0, &again) || train(0, 1, &discard))
        return check_summary("recompute");
    CHECK(same_params(&keep, &again), "recomputation changed the trained parameters");
    CHECK(same_params(&again, &discard), "discard_outputs changed the trained parameters");
    CHECK(keep.loss == again.loss && again.loss == discard.loss, "losses %.9g %.9g %.9g", keep.loss,
          again.loss, discard.loss);
    /* the GELU output (2 MiB) is computed again in the backward */
    CHECK(again.n_ins == keep.n_ins + 2, "%d instructions with recomputation, %d without",
          again.n_ins, keep.n_ins);
    CHECK(again.arena + ((size_t)2 << 20) <= keep.arena,
          "arena %zu bytes with recomputation vs %zu without: not 2 MiB smaller", again.arena,
          keep.arena);
    /* logits [4*128, 64] f32 = 128 KiB no longer take a region of their own */
    CHECK(discard.arena + ((size_t)128 << 10) <= again.arena,
          "arena %zu bytes with discard_outputs vs %zu: the logits' memory is not reused",
          discard.arena, again.arena);
    release(&keep);
    release(&again);
    release(&discard);
    return check_summary("recompute");
}
