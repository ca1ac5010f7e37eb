/* Dropout: the mask is a pure function of (seed, stream, step, element),
 * the gradient regenerates it, and inference plans pass values through.
 *
 * A finite-difference check does not apply (every step draws a new mask),
 * so the gradient is checked against its definition: dx = mask / (1 - p) * dy
 * with the mask read off the forward output. */
#include <omp.h>
#include <stdlib.h>
#include <string.h>
#include "check.h"
#include "ops/op.h"

/* ---- the kernel run by hand --------------------------------------------- */

/* Run node `id` of g on x (n elements of dt) into y at (step, seed). */
static ts_status run(const ts_graph *g, int id, ts_dtype dt, int64_t n, const void *x, void *y,
                     int64_t step, uint64_t seed) {
    const ts_node *nd = &g->nodes[id];
    ts_tensor in = {dt, 1, {n}, (void *)x}, out = {dt, 1, {n}, y};
    ts_step_ctx ctx = {step, seed, 0.1, 0};
    ts_kargs k = {&nd->a, 1, 1, &in, &out, NULL, 0, &ctx, "y", NULL};
    return ts_op_get(nd->op)->kernel(&k);
}

/* A graph with `count` dropout nodes on one f32 input [n], all active. */
static ts_graph *graph(int64_t n, double p, int count, ts_dtype dt) {
    ts_graph *g = ts_graph_new();
    int64_t d[1] = {n};
    ts_val x = ts_input(g, "x", dt, 1, d);
    for (int i = 0; i < count; i++) ts_dropout(g, x, p);
    for (int i = 0; i < g->n_nodes; i++)
        g->nodes[i].a.dropout.training = 1; /* as the train pass does */
    CHECK_OK(ts_graph_status(g));
    return g;
}

static int64_t count_kept(const float *y, int64_t n) {
    int64_t c = 0;
    for (int64_t i = 0; i < n; i++) c += y[i] != 0;
    return c;
}

static void check_mask(void) {
    enum { N = 200003 };
    const double p = 0.3;
    ts_graph *g = graph(N, p, 2, TS_F32);
    float *x = malloc(sizeof(float) * N), *y1 = malloc(sizeof(float) * N);
    float *y2 = malloc(sizeof(float) * N);
    for (int i = 0; i < N; i++) x[i] = 1.0f + (float)(i % 17) / 8.0f; /* never 0 */

    /* Same seed, step and stream: the same mask. */
    CHECK_OK(run(g, 0, TS_F32, N, x, y1, 5, 42));
    CHECK_OK(run(g, 0, TS_F32, N, x, y2, 5, 42));
    CHECK(memcmp(y1, y2, sizeof(float) * N) == 0, "same (seed, step) gave different masks");

    /* Kept values are x / (1 - p) with torch's f32 scale; the rate is 1 - p
     * (binomial sd 0.001 here, so 0.006 is 6 sd). */
    float scale = 1.0f / (float)(1.0 - p);
    int exact = 1;
    for (int i = 0; i < N; i++) exact &= y1[i] == 0 || y1[i] == x[i] * scale;
    CHECK(exact, "kept values are not x / (1 - p)");
    double rate = (double)count_kept(y1, N) / N;
    CHECK_NEAR(rate, 1 - p, 0.006);

    /* Another step, seed or stream: another mask, with the same rate. */
    int64_t same = 0;
    CHECK_OK(run(g, 0, TS_F32, N, x, y2, 6, 42));
    for (int i = 0; i < N; i++) same += (y1[i] != 0) == (y2[i] != 0);
    CHECK(same < N * 0.7, "step 6 repeats step 5's mask (%lld of %d agree)", (long long)same, N);
    CHECK_NEAR((double)count_kept(y2, N) / N, 1 - p, 0.006);
    same = 0;
    CHECK_OK(run(g, 0, TS_F32, N, x, y2, 5, 43));
    for (int i = 0; i < N; i++) same += (y1[i] != 0) == (y2[i] != 0);
    CHECK(same < N * 0.7, "seed 43 repeats seed 42's mask");
    same = 0;
    CHECK(g->nodes[0].a.dropout.stream != g->nodes[1].a.dropout.stream,
          "two dropouts share a stream id");
    CHECK_OK(run(g, 1, TS_F32, N, x, y2, 5, 42));
    for (int i = 0; i < N; i++) same += (y1[i] != 0) == (y2[i] != 0);
    CHECK(same < N * 0.7, "the second dropout node repeats the first one's mask");

    /* Any thread count, and in place, give the same bits. */
    int threads = omp_get_max_threads();
    for (int t = 1; t <= 4; t += 3) {
        omp_set_num_threads(t);
        CHECK_OK(run(g, 0, TS_F32, N, x, y2, 5, 42));
        CHECK(memcmp(y1, y2, sizeof(float) * N) == 0, "%d threads change the mask", t);
    }
    omp_set_num_threads(threads);
    memcpy(y2, x, sizeof(float) * N);
    CHECK_OK(run(g, 0, TS_F32, N, y2, y2, 5, 42));
    CHECK(memcmp(y1, y2, sizeof(float) * N) == 0, "in-place dropout differs");

    /* f64 draws the same mask as f32. */
    ts_graph *g64 = graph(N, p, 1, TS_F64);
    double *xd = malloc(sizeof(double) * N), *yd = malloc(sizeof(double) * N);
    for (int i = 0; i < N; i++) xd[i] = x[i];
    CHECK_OK(run(g64, 0, TS_F64, N, xd, yd, 5, 42));
    int agree = 1;
    for (int i = 0; i < N; i++) agree &= (yd[i] != 0) == (y1[i] != 0);
    CHECK(agree, "f64 and f32 masks differ");

    /* Inactive (inference): the identity. */
    g->nodes[0].a.dropout.training = 0;
    CHECK_OK(run(g, 0, TS_F32, N, x, y2, 5, 42));
    CHECK(memcmp(x, y2, sizeof(float) * N) == 0, "inactive dropout is not the identity");

    free(x), free(y1), free(y2), free(xd), free(yd);
    ts_graph_free(g);
    ts_graph_free(g64);
}

/* The gradient rule emits a dropout of dy with the same stream and p, so
 * the backward mask is the forward one. */
static void check_grad_rule(void) {
    enum { N = 1000 };
    const double p = 0.25;
    ts_graph *g = graph(N, p, 1, TS_F64);
    int64_t d[1] = {N};
    ts_val dy = ts_input(g, "dy", TS_F64, 1, d);
    ts_val din[1] = {TS_NONE};
    const ts_node fwd = g->nodes[0];
    CHECK_OK(ts_op_get(TS_OP_DROPOUT)->grad(g, &fwd, &dy, din));
    CHECK(ts_val_ok(din[0]), "no gradient for dropout's input");
    if (!ts_val_ok(din[0])) {
        ts_graph_free(g);
        return;
    }
    int bid = g->values[din[0].id].node;
    const ts_node *b = &g->nodes[bid];
    CHECK(b->op == TS_OP_DROPOUT && b->a.dropout.stream == fwd.a.dropout.stream &&
              b->a.dropout.p == p,
          "the gradient is not dropout with the same stream and p");
    double x[N], y[N], gy[N], gx[N];
    for (int i = 0; i < N; i++) x[i] = 0.5 + i % 7, gy[i] = (i % 11) - 5.25;
    CHECK_OK(run(g, 0, TS_F64, N, x, y, 3, 7));
    CHECK_OK(run(g, bid, TS_F64, N, gy, gx, 3, 7));
    int ok = 1;
    for (int i = 0; i < N; i++) ok &= gx[i] == (y[i] != 0 ? gy[i] * (1 / (1 - p)) : 0.0);
    CHECK(ok, "dx != mask / (1 - p) * dy");
    ts_graph_free(g);
}

static void check_builder(void) {
    int64_t d[1] = {4};
    ts_graph *g = ts_graph_new();
    ts_val x = ts_input(g, "x", TS_F32, 1, d);
    CHECK(ts_dropout(g, x, 0.0).id == x.id, "p = 0 should return the input itself");
    ts_val y = ts_dropout(g, x, 0.5);
    CHECK(ts_val_ok(y) && g->nodes[g->n_nodes - 1].a.dropout.training == 0,
          "a new dropout starts inactive");
    CHECK_OK(ts_graph_status(g));
    const double bad[3] = {1.0, -0.1, NAN};
    for (int i = 0; i < 3; i++) {
        ts_graph *e = ts_graph_new();
        ts_val xe = ts_input(e, "x", TS_F32, 1, d);
        CHECK(!ts_val_ok(ts_dropout(e, xe, bad[i])), "p = %g accepted", bad[i]);
        CHECK(strstr(ts_graph_error(e), "dropout") != NULL, "message '%s' lacks 'dropout'",
              ts_graph_error(e));
        ts_graph_free(e);
    }
    ts_graph_free(g);
}

/* ---- through a compiled plan -------------------------------------------- */

/* loss = sum(dropout(x) * r): the plan's gradient is mask / (1 - p) * r
 * with the mask of the same step's forward output, at every step. */
static void check_plan(void) {
    const double p = 0.5;
    int64_t d[2] = {6, 7};
    double x0[42], r[42], y[42], gx[42], y_prev[42];
    for (int i = 0; i < 42; i++) x0[i] = 0.25 + i * 0.125, r[i] = (i % 5) - 2.5;
    ts_graph *g = ts_graph_new();
    ts_val x = ts_param(g, "x", TS_F64, 2, d, ts_init_buffer(x0));
    ts_val rv = ts_constant(g, "r", TS_F64, 2, d, r);
    ts_val y_v = ts_dropout(g, x, p);
    CHECK_OK(ts_mark_output(g, y_v, "y"));
    ts_val loss = ts_sum(g, ts_mul(g, y_v, rv), 0, NULL, 0);
    ts_train_spec spec = ts_train_spec_default(loss);
    spec.opt.kind = TS_OPT_NONE;
    ts_compile_options opt = ts_compile_options_default();
    opt.seed = 1234;
    ts_plan *plan = NULL;
    CHECK_OK(ts_compile(g, &spec, &opt, &plan));
    if (plan) {
        for (int step = 0; step < 3; step++) {
            CHECK_OK(ts_plan_step(plan));
            CHECK_OK(ts_plan_read(plan, "y", y, sizeof y));
            CHECK_OK(ts_plan_read(plan, "grad:x", gx, sizeof gx));
            int ok = 1, kept = 0, same = 1;
            for (int i = 0; i < 42; i++) {
                int keep = y[i] != 0;
                kept += keep;
                ok &= y[i] == (keep ? x0[i] * 2 : 0) && gx[i] == (keep ? r[i] * 2 : 0);
                if (step) same &= keep == (y_prev[i] != 0);
            }
            CHECK(ok, "step %d: forward or gradient does not use one mask", step + 1);
            CHECK(kept > 8 && kept < 34, "step %d keeps %d of 42 at p = 0.5", step + 1, kept);
            if (step) CHECK(!same, "step %d repeats the previous mask", step + 1);
            memcpy(y_prev, y, sizeof y);
        }
        ts_plan_free(plan);
    }
    /* An inference plan passes x through. */
    CHECK_OK(ts_compile(g, NULL, &opt, &plan));
    if (plan) {
        CHECK_OK(ts_plan_step(plan));
        CHECK_OK(ts_plan_read(plan, "y", y, sizeof y));
        CHECK(memcmp(y, x0, sizeof y) == 0, "inference dropout is not the identity");
        ts_plan_free(plan);
    }
    ts_graph_free(g);
}

int main(void) {
    check_mask();
    check_grad_rule();
    check_builder();
    check_plan();
    return check_summary("dropout");
}
