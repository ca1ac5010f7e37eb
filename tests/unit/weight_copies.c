/* The weights' bf16 copies the optimizer keeps (passes/weight_copies.c, the update kernels
 * in ops/optim.c, plan/weight_copies.c):
 *
 * - structure: a bf16 MLP's plan has no cast of a weight left, one unnamed bf16 STATE copy
 *   per GEMM weight, the update with n_low copies; compile.no_weight_copies keeps the casts;
 * - bits: AdamW, SGD with momentum, the fused update, 1 and 2 threads: every step's loss and
 *   the final weights equal the plan with the casts bit for bit, and after every step each
 *   copy is the rounding of its weight;
 * - writers outside the step: ts_plan_write_param rewrites the copy at once, a weight
 *   written through ts_plan_value_at before the next step, a checkpoint restored into a
 *   fresh plan resumes with the saved run's bits;
 * - bad input: an update whose copies are missing, of the wrong dtype or shape is refused. */
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include "check.h"
#include "core/half.h"
#include "ir/ir.h"
#include "ops/op.h"
#include "plan/plan.h"
#include "plan/stages.h"
#include "tessel/ckpt.h"

enum { STEPS = 4 };

typedef struct variant {
    int adam, fused, copies, threads;
} variant;

static ts_mlp_config small_mlp(void) {
    ts_mlp_config c = {0};
    c.batch = 16;
    c.in_dim = 24;
    c.hidden = 40;
    c.n_hidden = 2;
    c.out_dim = 4;
    c.layer_norm = 1;
    return c;
}

static ts_plan *build(const variant *v, ts_compiled_graph *kept) {
    ts_graph *g = ts_graph_new();
    ts_mlp_config c = small_mlp();
    ts_model m;
    ts_plan *p = NULL;
    if (ts_build_mlp(g, &c, &m) == TS_OK) {
        ts_train_spec spec = ts_train_spec_default(m.loss);
        spec.opt = v->adam ? ts_adamw(3e-3, 0.9, 0.999, 1e-8, 0.01) : ts_sgd(0.05, 0.9, 0, 0, 1e-3);
        spec.fused_update = v->fused;
        ts_compile_options o = ts_compile_options_default();
        o.seed = 11;
        o.threads = v->threads;
        o.precision.compute = TS_BF16;
        o.no_weight_copies = !v->copies;
        if (kept)
            CHECK_OK(ts_compile_keep(g, &spec, &o, &p, kept));
        else
            CHECK_OK(ts_compile(g, &spec, &o, &p));
    }
    ts_graph_free(g);
    return p;
}

static void feed(ts_plan *p, int step) {
    ts_mlp_config c = small_mlp();
    float x[16 * 24], y[16 * 4];
    uint64_t s = 0x9e3779b97f4a7c15ull * (uint64_t)(step + 1);
    for (int i = 0; i < 16 * 24; i++) {
        s ^= s << 13, s ^= s >> 7, s ^= s << 17;
        x[i] = (float)((double)(s >> 11) / 9007199254740992.0 * 2 - 1);
    }
    for (int i = 0; i < 16 * 4; i++) y[i] = (float)sin(x[i] * 3 + x[(i * 7) % (16 * 24)]);
    CHECK_OK(ts_plan_set_input(p, "x", x, sizeof(float) * (size_t)(c.batch * c.in_dim)));
    CHECK_OK(ts_plan_set_input(p, "y", y, sizeof(float) * (size_t)(c.batch * c.out_dim)));
}

/* How many copies the plan keeps, each checked to be the bf16 rounding of its weight bit
 * for bit; -1 at the first mismatch. */
static int copies_match(const ts_plan *p) {
    int n = 0;
    for (int i = 0; i < p->prog.n_ins; i++) {
        const ts_instr *in = &p->prog.ins[i];
        ts_update_layout L;
        if (!ts_update_layout_of(in->op, &in->a, in->n_in, &L)) continue;
        for (int j = 0; j < L.n_low; j++, n++) {
            const ts_operand *w = &in->in[j * L.gs], *c = &in->in[L.first_copy + j];
            const float *src = (const float *)ts_plan_at(p, w->off);
            const uint16_t *dst = (const uint16_t *)ts_plan_at(p, c->off);
            for (int64_t e = 0; e < ts_shape_numel(w->rank, w->dims); e++)
                if (dst[e] != ts_f32_to_bf16(src[e])) return -1;
        }
    }
    return n;
}

/* Every parameter's bytes, concatenated (malloc'ed; *bytes its size). */
static unsigned char *params_of(const ts_plan *p, size_t *bytes) {
    size_t n = 0;
    for (int i = 0; i < ts_plan_param_count(p); i++)
        n += ts_operand_bytes(&ts_plan_find(p, ts_plan_param_name(p, i))->v);
    unsigned char *b = malloc(n ? n : 1), *at = b;
    for (int i = 0; b && i < ts_plan_param_count(p); i++) {
        const ts_named *nm = ts_plan_find(p, ts_plan_param_name(p, i));
        CHECK_OK(ts_plan_read(p, nm->name, at, ts_operand_bytes(&nm->v)));
        at += ts_operand_bytes(&nm->v);
    }
    *bytes = n;
    return b;
}

/* Whether every node reading a copy of update node u (or a view of one) is one u waits for:
 * the update rewrites the copies in place, after the GEMMs have read them. */
static int readers_before_update(const ts_graph *g, int u) {
    ts_update_layout L;
    const ts_node *un = &g->nodes[u];
    if (!ts_update_layout_of(un->op, &un->a, un->n_in, &L) || L.n_low == 0) return 0;
    char *copy = calloc((size_t)g->n_values, 1);
    int ok = copy != NULL, readers = 0;
    for (int j = 0; ok && j < L.n_low; j++) copy[un->in[L.first_copy + j]] = 1;
    for (int i = 0; ok && i < g->n_nodes; i++) {
        const ts_node *r = &g->nodes[i];
        int reads = 0;
        for (int q = 0; q < r->n_in; q++) reads |= copy[r->in[q]];
        if (!reads || i == u) continue;
        if (r->op == TS_OP_RESHAPE) copy[r->out[0]] = 1;
        int waited = 0;
        for (int q = 0; q < un->n_ctrl; q++) waited |= un->ctrl[q] == i;
        ok = waited && i < u;
        readers++;
    }
    free(copy);
    return ok && readers > 0;
}

static void test_structure(void) {
    ts_compiled_graph kept = {0}, k0 = {0};
    const variant with = {1, 0, 1, 1}, without = {1, 0, 0, 1};
    ts_plan *p = build(&with, &kept), *p0 = build(&without, &k0);
    if (p && p0) {
        const ts_graph *g = kept.graph, *g0 = k0.graph;
        int weight_casts = 0, weight_casts0 = 0, copies = 0, n_low = 0;
        for (int i = 0; i < g->n_nodes; i++) {
            const ts_node *n = &g->nodes[i];
            weight_casts += n->op == TS_OP_CAST && g->values[n->in[0]].kind == TS_VK_PARAM;
            if (n->op == TS_OP_ADAM_UPDATE) n_low += (int)n->a.adam.n_low;
        }
        for (int i = 0; i < g0->n_nodes; i++)
            weight_casts0 +=
                g0->nodes[i].op == TS_OP_CAST && g0->values[g0->nodes[i].in[0]].kind == TS_VK_PARAM;
        for (int v = 0; v < g->n_values; v++) {
            const ts_value *val = &g->values[v];
            if (val->kind != TS_VK_STATE || val->t.dtype != TS_BF16) continue;
            copies++;
            CHECK(!val->name && val->state_of >= 0 &&
                      g->values[val->state_of].kind == TS_VK_PARAM &&
                      g->values[val->state_of].t.rank == val->t.rank,
                  "a copy is an unnamed STATE of a parameter's shape");
        }
        /* 3 GEMM weights (2 hidden layers and the output layer) */
        CHECK(weight_casts == 0 && copies == 3 && n_low == 3,
              "%d casts of weights, %d copies, n_low %d (want 0, 3, 3)", weight_casts, copies,
              n_low);
        CHECK(weight_casts0 == 3, "compile.no_weight_copies: %d casts of weights (want 3)",
              weight_casts0);
        CHECK(p->prog.n_ins == p0->prog.n_ins - 3, "%d instructions, %d with the casts",
              p->prog.n_ins, p0->prog.n_ins);
        CHECK(ts_plan_persistent_count(p) == ts_plan_persistent_count(p0),
              "the copies are not persistent values (%d vs %d)", ts_plan_persistent_count(p),
              ts_plan_persistent_count(p0));
        CHECK(copies_match(p) == 3, "the first values' copies are their weights' rounding");
    }
    ts_plan_free(p);
    ts_plan_free(p0);
    ts_compiled_graph_free(&kept);
    ts_compiled_graph_free(&k0);
    for (int fused = 0; fused < 2; fused++) { /* the update waits for the copies' readers */
        const variant v = {1, fused, 1, 1};
        p = build(&v, &kept);
        int updates = 0, ordered = 0;
        for (int u = 0; p && u < kept.graph->n_nodes; u++)
            if (kept.graph->nodes[u].op == TS_OP_ADAM_UPDATE && kept.graph->nodes[u].a.adam.n_low)
                updates++, ordered += readers_before_update(kept.graph, u);
        CHECK(updates == (fused ? 3 : 1) && ordered == updates,
              "%s: %d of %d updates with copies wait for every reader of them",
              fused ? "fused" : "one update", ordered, updates);
        ts_plan_free(p);
        ts_compiled_graph_free(&kept);
    }
}

/* The plan with copies against the one with casts: the same losses and weights. */
static void test_bits(const variant *v) {
    variant v0 = *v;
    v0.copies = 0;
    ts_plan *p = build(v, NULL), *p0 = build(&v0, NULL);
    if (!p || !p0) goto done;
    int same = 1, match = 1;
    for (int s = 0; s < STEPS; s++) {
        feed(p, s), feed(p0, s);
        CHECK_OK(ts_plan_step(p));
        CHECK_OK(ts_plan_step(p0));
        same &= ts_plan_loss(p) == ts_plan_loss(p0);
        match &= copies_match(p) == 3;
    }
    size_t n, n0;
    unsigned char *w = params_of(p, &n), *w0 = params_of(p0, &n0);
    CHECK(same && n == n0 && w && w0 && !memcmp(w, w0, n),
          "%s%s, %d threads: losses and weights equal the plan with casts",
          v->adam ? "AdamW" : "SGD momentum", v->fused ? " fused" : "", v->threads);
    CHECK(match, "after every step each copy is its weight's rounding");
    free(w);
    free(w0);
done:
    ts_plan_free(p);
    ts_plan_free(p0);
}

/* A weight written between steps: at once through ts_plan_write_param, at the next step
 * through ts_plan_value_at. Both plans then take the same step. */
static void test_writers(void) {
    const variant v = {1, 0, 1, 1}, v0 = {1, 0, 0, 1};
    ts_plan *p = build(&v, NULL), *p0 = build(&v0, NULL);
    if (!p || !p0) goto done;
    feed(p, 0), feed(p0, 0);
    CHECK_OK(ts_plan_step(p));
    CHECK_OK(ts_plan_step(p0));
    const char *name = ts_plan_param_name(p, 0);
    const ts_named *nm = ts_plan_find(p, name);
    const size_t bytes = ts_operand_bytes(&nm->v);
    float *w = malloc(bytes);
    for (size_t i = 0; w && i < bytes / sizeof(float); i++) w[i] = (float)(i % 17) * 0.01f - 0.08f;
    CHECK(nm->v.rank == 2, "the first parameter is a GEMM weight (%s)", name);
    CHECK_OK(ts_plan_write_param(p, name, w, bytes));
    CHECK_OK(ts_plan_write_param(p0, name, w, bytes));
    CHECK(copies_match(p) == 3, "ts_plan_write_param rewrote the copy");
    feed(p, 1), feed(p0, 1);
    CHECK_OK(ts_plan_step(p));
    CHECK_OK(ts_plan_step(p0));
    CHECK(ts_plan_loss(p) == ts_plan_loss(p0), "the step after write_param: %.9g vs %.9g",
          ts_plan_loss(p), ts_plan_loss(p0));
    size_t b = 0;
    float *at = (float *)ts_plan_value_at(p, name, &b);
    for (size_t i = 0; w && at && i < b / sizeof(float); i++) at[i] = w[(i + 5) % (b / 4)];
    float *at0 = (float *)ts_plan_value_at(p0, name, &b);
    for (size_t i = 0; w && at0 && i < b / sizeof(float); i++) at0[i] = w[(i + 5) % (b / 4)];
    feed(p, 2), feed(p0, 2);
    CHECK_OK(ts_plan_step(p));
    CHECK_OK(ts_plan_step(p0));
    CHECK(ts_plan_loss(p) == ts_plan_loss(p0), "the step after value_at: %.9g vs %.9g",
          ts_plan_loss(p), ts_plan_loss(p0));
    CHECK(copies_match(p) == 3, "the copies follow the weights written through value_at");
    free(w);
done:
    ts_plan_free(p);
    ts_plan_free(p0);
}

/* Saved after 2 steps, restored into a fresh plan (whose own first weights differ: another
 * seed's), 2 more steps: the run that went on without stopping, bit for bit. */
static void test_resume(void) {
    char run[128];
    snprintf(run, sizeof run, "/tmp/tessel-weight-copies-%d", (int)getpid());
    const variant v = {1, 0, 1, 1};
    ts_plan *p = build(&v, NULL);
    if (!p) return;
    for (int s = 0; s < 2; s++) {
        feed(p, s);
        CHECK_OK(ts_plan_step(p));
    }
    ts_ckpt_options o = ts_ckpt_options_default();
    CHECK_OK(ts_ckpt_save(p, run, NULL, &o));
    ts_plan *q = build(&v, NULL);
    if (q) {
        /* other weights (and so other copies) until the restore */
        const char *name = ts_plan_param_name(q, 0);
        size_t b = ts_operand_bytes(&ts_plan_find(q, name)->v);
        float *z = calloc(1, b);
        CHECK_OK(ts_plan_write_param(q, name, z, b));
        free(z);
        CHECK_OK(ts_ckpt_load(q, run, NULL, NULL));
        CHECK(copies_match(q) == 3, "the restore rewrote the copies");
        int same = 1;
        for (int s = 2; s < STEPS; s++) {
            feed(p, s), feed(q, s);
            CHECK_OK(ts_plan_step(p));
            CHECK_OK(ts_plan_step(q));
            same &= ts_plan_loss(p) == ts_plan_loss(q);
        }
        size_t n, nq;
        unsigned char *w = params_of(p, &n), *wq = params_of(q, &nq);
        CHECK(same && n == nq && w && wq && !memcmp(w, wq, n),
              "resumed from the checkpoint: the same losses and weights");
        free(w);
        free(wq);
    }
    ts_plan_free(q);
    ts_plan_free(p);
    char cmd[200];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", run);
    if (system(cmd) != 0) fprintf(stderr, "warning: could not remove %s\n", run);
}

/* adam_update(p, g, m, v, copy) with n_low 1, the copy of type t; NULL a refused node's
 * message is expected to contain. */
static void check_update(const ts_type *t, int64_t n_low, int n_copies, const char *want) {
    ts_graph *g = ts_graph_new();
    const ts_type pt = {TS_F32, 2, {4, 3}};
    int32_t in[8];
    for (int i = 0; i < 4; i++) in[i] = ts_value_new(g, &pt, i ? TS_VK_STATE : TS_VK_PARAM, NULL);
    for (int i = 0; i < n_copies; i++) in[4 + i] = ts_value_new(g, t, TS_VK_STATE, NULL);
    ts_attrs a = ts_attrs_zero();
    a.adam.beta1 = 0.9, a.adam.beta2 = 0.999, a.adam.eps = 1e-8, a.adam.n_low = n_low;
    ts_val v[8];
    for (int i = 0; i < 4 + n_copies; i++) v[i] = ts_mkval(in[i]);
    ts_node_add(g, TS_OP_ADAM_UPDATE, 4 + n_copies, v, &a, NULL);
    ts_status s = ts_graph_status(g);
    if (!want)
        CHECK(s == TS_OK, "a bf16 copy of the parameter's shape: %s", ts_last_error());
    else
        CHECK(s != TS_OK && strstr(ts_last_error(), want), "refused with '%s': %s", want,
              s == TS_OK ? "accepted" : ts_last_error());
    ts_graph_free(g);
}

static void test_bad_updates(void) {
    const ts_type ok = {TS_BF16, 2, {4, 3}}, f32 = {TS_F32, 2, {4, 3}},
                  shape = {TS_BF16, 2, {3, 4}};
    check_update(&ok, 1, 1, NULL);
    check_update(&f32, 1, 1, "low-precision copy 0");
    check_update(&shape, 1, 1, "low-precision copy 0");
    check_update(&ok, 1, 0, "and 1 copies");
    check_update(&ok, 2, 1, "and 2 copies");
    check_update(&ok, -1, 0, "and -1 copies");
}

/* The update kernel's own rounding into the copy (the vector path with streaming stores and
 * the scalar tail) against ts_f32_to_bf16 on every kind of value: SGD with lr 0 and zero
 * gradients keeps each weight's bits (p + -0), so the copy must be their rounding. */
static void test_kernel_rounding(void) {
    enum { N = 2 * 4096 + 23 };
    float *p = ts_aligned_alloc(sizeof(float) * N, "test"), *g = calloc(N, sizeof(float));
    uint16_t *c = ts_aligned_alloc(sizeof(uint16_t) * N, "test");
    if (!p || !g || !c) goto done;
    static const uint32_t special[] = {0x7fc00000u, 0xffc00001u, 0x7f800000u, 0xff800000u,
                                       0x00000001u, 0x807fffffu, 0x7f7fffffu, 0x3f808000u,
                                       0x3f818000u, 0x3f807fffu, 0x00000000u, 0x80000000u};
    uint64_t r = 0x243f6a8885a308d3ull;
    for (int i = 0; i < N; i++) {
        r ^= r << 13, r ^= r >> 7, r ^= r << 17;
        uint32_t u = (uint32_t)(r >> 32);
        if ((u & 0x7f800000u) == 0x7f800000u) u |= 0x00400000u; /* quiet NaNs only */
        if (i % 7 == 0) u = special[(i / 7) % 12];
        if (i % 11 == 0) u = (u & 0xffff0000u) | 0x8000u; /* ties */
        memcpy(&p[i], &u, sizeof u);
    }
    ts_tensor t[3] = {{TS_F32, 1, {N}, p}, {TS_F32, 1, {N}, g}, {TS_BF16, 1, {N}, c}};
    ts_attrs a = ts_attrs_zero();
    a.sgd.n_low = 1;
    ts_step_ctx ctx = {1, 0, 0.0, 1};
    ts_kargs k = {.a = &a, .n_in = 3, .in = t, .ctx = &ctx, .label = "test"};
    CHECK_OK(ts_op_get(TS_OP_SGD_UPDATE)->kernel(&k));
    int bad = 0;
    for (int i = 0; i < N; i++) bad += c[i] != ts_f32_to_bf16(p[i]);
    CHECK(bad == 0, "the update's copy rounds as ts_f32_to_bf16 (%d of %d differ)", bad, N);
done:
    ts_aligned_free(p);
    ts_aligned_free(c);
    free(g);
}

int main(void) {
    test_structure();
    for (int adam = 0; adam < 2; adam++)
        for (int fused = 0; fused < 2; fused++)
            for (int threads = 1; threads <= 2; threads++)
                test_bits(&(variant){adam, fused, 1, threads});
    test_writers();
    test_resume();
    test_bad_updates();
    test_kernel_rounding();
    return check_summary("weight_copies");
}
