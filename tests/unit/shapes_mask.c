/* Masking a gpt's padding (docs/shapes.md, #20 "Masking"): the gradient of
 * the loss with respect to the embedding activations (token + position
 * embedding, the input of the first block) is exactly 0 at every padding
 * position of a batch with padded rows, and changing the token ids at the
 * padding positions leaves the loss and every parameter's gradient bit for
 * bit as they were.
 *
 * The activations' gradient is read through a probe: a zero parameter
 * added to the embedding sum, so grad:probe is d loss / d activation at
 * every (row, position) and the forward pass is unchanged.
 *
 * The token source holds one document per example (a long one cut into
 * ctx-long pieces: unit/data_token_docs), so a row never holds two
 * documents and padding follows the row's one document; the gpt keeps
 * padding out with its causal attention (no real position attends to a
 * later one) and its loss's ignore index (-100 targets).
 *
 * The negative case: with the loss mask off (padding positions given real
 * targets) the same check finds a nonzero gradient at padding, so it can
 * fail. Attention without the causal flag would fail both checks too (a
 * real position would attend to the later padding, so its tokens would
 * change the loss); the graph has no switch to show that here. */
#include <stdlib.h>
#include <string.h>
#include "check.h"
#include "frontend/config.h"
#include "ir/ir.h"
#include "plan/plan.h"
#include "session/shapes.h"

enum { B = 3, T = 16, V = 32, D = 16 };

/* Real tokens per row: a full row and two padded ones. */
static const int len[B] = {T, 9, 4};

/* The gpt with a zero probe parameter [B, T, D] added to its embedding sum
 * (the node that adds wte's gather of the tokens and wpe). */
static ts_graph *gpt_with_probe(ts_train_spec *spec, ts_compile_options *o) {
    ts_config c;
    ts_graph *g = NULL;
    ts_model m;
    const char *y = "model: {name: gpt, batch: 3, ctx: 16, vocab: 32, d_model: 16, n_layers: 2, "
                    "n_heads: 2, dropout: 0}\ntrain: {optimizer: adamw, seed: 4}\n";
    ts_config_init(&c);
    CHECK_OK(ts_config_load_string(&c, y, strlen(y), "t.yaml"));
    CHECK_OK(ts_config_finish(&c));
    CHECK_OK(ts_config_build_graph(&c, NULL, &g, &m, spec, o));
    if (!g) return NULL;
    /* the gather of the tokens, then the add that consumes it */
    int32_t gathered = -1, emb = -1;
    const int n_nodes = g->n_nodes;
    for (int i = 0; i < n_nodes && gathered < 0; i++)
        for (int j = 0; j < g->nodes[i].n_in; j++)
            if (g->nodes[i].in[j] == m.input.id) gathered = g->nodes[i].out[0];
    for (int i = 0; i < n_nodes && emb < 0; i++)
        for (int j = 0; j < g->nodes[i].n_in; j++)
            if (g->nodes[i].in[j] == gathered) emb = g->nodes[i].out[0];
    CHECK(gathered >= 0 && emb >= 0, "found the embedding sum");
    if (emb < 0) return g;
    const int64_t dims[3] = {B, T, D};
    ts_val probe = ts_param(g, "probe", TS_F32, 3, dims, ts_init_zeros());
    ts_val x = ts_mkval(emb), sum = ts_add(g, x, probe);
    CHECK_OK(ts_graph_status(g));
    /* every other reader of the embedding sum reads sum instead */
    for (int i = 0; i < n_nodes; i++)
        for (int j = 0; j < g->nodes[i].n_in; j++)
            if (g->nodes[i].in[j] == emb) g->nodes[i].in[j] = sum.id;
    /* nodes are in order of definition: the probe's add moves to just
     * after the embedding sum's node, the nodes between shift one on */
    const int at = g->values[emb].node + 1, added = g->n_nodes - 1;
    ts_node moved = g->nodes[added];
    memmove(&g->nodes[at + 1], &g->nodes[at], sizeof(ts_node) * (size_t)(added - at));
    g->nodes[at] = moved;
    for (int v = 0; v < g->n_values; v++)
        if (g->values[v].kind == TS_VK_NODE && g->values[v].node >= at)
            g->values[v].node = g->values[v].node == added ? at : g->values[v].node + 1;
    for (int i = 0; i < g->n_nodes; i++)
        for (int j = 0; j < g->nodes[i].n_ctrl; j++)
            if (g->nodes[i].ctrl[j] >= at)
                g->nodes[i].ctrl[j] = g->nodes[i].ctrl[j] == added ? at : g->nodes[i].ctrl[j] + 1;
    return g;
}

static void batch(int64_t *x, int64_t *y, unsigned pad_seed, int mask_loss) {
    unsigned seed = 11;
    for (int r = 0; r < B; r++)
        for (int t = 0; t < T; t++) {
            x[r * T + t] = rand_r(&seed) % V;
            y[r * T + t] = rand_r(&seed) % V;
        }
    /* padding: its tokens from pad_seed (0: the pad id V - 1), no target */
    for (int r = 0; r < B; r++)
        for (int t = len[r]; t < T; t++) {
            x[r * T + t] = pad_seed ? rand_r(&pad_seed) % V : V - 1;
            if (mask_loss) y[r * T + t] = TS_SHAPE_IGNORE;
        }
}

/* One step of a fresh plan of g on the batch: its loss, the probe's
 * gradient and every parameter's gradient, concatenated. */
typedef struct {
    double loss;
    float probe[B * T * D];
    float *grads;
    size_t n_grads;
} result;

static void run(ts_graph *g, ts_train_spec *spec, ts_compile_options *o, unsigned pad_seed,
                int mask_loss, result *out) {
    ts_plan *p = NULL;
    memset(out, 0, sizeof *out);
    CHECK_OK(ts_compile(g, spec, o, &p));
    if (!p) return;
    int64_t x[B * T], y[B * T];
    batch(x, y, pad_seed, mask_loss);
    CHECK_OK(ts_plan_set_input(p, "tokens", x, sizeof x));
    CHECK_OK(ts_plan_set_input(p, "targets", y, sizeof y));
    CHECK_OK(ts_plan_step(p));
    out->loss = ts_plan_loss(p);
    CHECK_OK(ts_plan_read(p, "grad:probe", out->probe, sizeof out->probe));
    for (int i = 0; i < ts_plan_param_count(p); i++) {
        char name[256];
        snprintf(name, sizeof name, "grad:%s", ts_plan_param_name(p, i));
        ts_dtype dt;
        int rank;
        int64_t dims[TS_MAX_RANK];
        CHECK_OK(ts_plan_value_info(p, name, &dt, &rank, dims));
        const size_t n = (size_t)ts_shape_numel(rank, dims);
        out->grads = realloc(out->grads, sizeof(float) * (out->n_grads + n));
        CHECK_OK(ts_plan_read(p, name, out->grads + out->n_grads, sizeof(float) * n));
        out->n_grads += n;
    }
    ts_plan_free(p);
}

/* Padding positions whose activation gradient is not exactly 0, and
 * real positions whose gradient is (a live gradient has few). */
static void count(const result *r, int *pad_nonzero, int *real_zero) {
    *pad_nonzero = *real_zero = 0;
    for (int b = 0; b < B; b++)
        for (int t = 0; t < T; t++) {
            int zero = 1;
            for (int d = 0; d < D; d++) zero &= r->probe[(b * T + t) * D + d] == 0.0f;
            if (t >= len[b])
                *pad_nonzero += !zero;
            else
                *real_zero += zero;
        }
}

int main(void) {
    ts_train_spec spec;
    ts_compile_options o;
    ts_graph *g = gpt_with_probe(&spec, &o);
    if (!g) return check_summary("shapes_mask");
    static result pad_id, pad_random, unmasked;
    run(g, &spec, &o, 0, 1, &pad_id);
    run(g, &spec, &o, 77, 1, &pad_random);
    run(g, &spec, &o, 0, 0, &unmasked);
    int pad_nonzero, real_zero;
    count(&pad_id, &pad_nonzero, &real_zero);
    CHECK(pad_nonzero == 0, "%d padding positions have a nonzero activation gradient", pad_nonzero);
    CHECK(real_zero == 0, "%d real positions have a zero activation gradient", real_zero);
    count(&pad_random, &pad_nonzero, &real_zero);
    CHECK(pad_nonzero == 0, "other padding tokens: %d padding positions with a gradient",
          pad_nonzero);
    CHECK(memcmp(&pad_id.loss, &pad_random.loss, sizeof(double)) == 0,
          "padding tokens change the loss: %.17g vs %.17g", pad_id.loss, pad_random.loss);
    CHECK(pad_id.n_grads > 0 && pad_id.n_grads == pad_random.n_grads &&
              memcmp(pad_id.grads, pad_random.grads, sizeof(float) * pad_id.n_grads) == 0,
          "padding tokens change a parameter's gradient");
    CHECK(memcmp(pad_id.probe, pad_random.probe, sizeof pad_id.probe) == 0,
          "padding tokens change the activations' gradient");
    /* negative case: without the loss mask the check finds padding */
    count(&unmasked, &pad_nonzero, &real_zero);
    CHECK(pad_nonzero == B * T - (len[0] + len[1] + len[2]),
          "loss mask off: %d of %d padding positions have a gradient", pad_nonzero,
          B * T - (len[0] + len[1] + len[2]));
    printf("gpt: %d padding positions of %d, activation gradient exactly 0 at each; loss "
           "%.9g\n",
           B * T - (len[0] + len[1] + len[2]), B * T, pad_id.loss);
    free(pad_id.grads), free(pad_random.grads), free(unmasked.grads);
    ts_graph_free(g);
    return check_summary("shapes_mask");
}
