/* train_mlp.c — build, compile and train a small MLP with tessel's C API.
 *
 * The task: regress y = sin(3 x0) + x1 * x2 from 8 random features. The
 * program builds the network node by node, compiles the whole training step
 * (forward, backward, AdamW update) into one plan and runs it.
 *
 *     make demo            (or: build/example_train_mlp)
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include "tessel/tessel.h"

enum { BATCH = 64, IN = 8, HIDDEN = 64, STEPS = 300 };

/* nn.Linear-style layer: y = x W^T + b with PyTorch's default init. */
static ts_val linear(ts_graph *g, ts_val x, const char *name, int64_t in, int64_t out) {
    char wn[64], bn[64];
    snprintf(wn, sizeof wn, "%s.weight", name);
    snprintf(bn, sizeof bn, "%s.bias", name);
    int64_t wd[2] = {out, in}, bd[1] = {out};
    double bound = 1.0 / sqrt((double)in);
    ts_val w = ts_param(g, wn, TS_F32, 2, wd, ts_init_kaiming_uniform(sqrt(5.0)));
    ts_val b = ts_param(g, bn, TS_F32, 1, bd, ts_init_uniform(-bound, bound));
    return ts_linear(g, x, w, b);
}

/* A deterministic batch: features uniform in [-1, 1), target from them. */
static void make_batch(unsigned *seed, float *x, float *y) {
    for (int i = 0; i < BATCH; i++) {
        for (int j = 0; j < IN; j++) x[i * IN + j] = 2.0f * (float)rand_r(seed) / RAND_MAX - 1.0f;
        const float *r = x + i * IN;
        y[i] = sinf(3.0f * r[0]) + r[1] * r[2];
    }
}

int main(void) {
    /* 1. Build the graph: shapes are static, checked as each node is added. */
    ts_graph *g = ts_graph_new();
    int64_t xd[2] = {BATCH, IN}, yd[2] = {BATCH, 1}, hd[1] = {HIDDEN};
    ts_val x = ts_input(g, "x", TS_F32, 2, xd);
    ts_val y = ts_input(g, "y", TS_F32, 2, yd);
    ts_val h = ts_relu(g, linear(g, x, "fc1", IN, HIDDEN));          /* [64, 64] */
    ts_val ln_w = ts_param(g, "ln.weight", TS_F32, 1, hd, ts_init_ones());
    ts_val ln_b = ts_param(g, "ln.bias", TS_F32, 1, hd, ts_init_zeros());
    h = ts_layer_norm(g, h, ln_w, ln_b, 1e-5);
    h = ts_gelu(g, linear(g, h, "fc2", HIDDEN, HIDDEN), TS_GELU_TANH); /* [64, 64] */
    ts_val pred = linear(g, h, "head", HIDDEN, 1);                      /* [64, 1] */
    ts_val loss = ts_mse_loss(g, pred, y);                              /* scalar */
    if (ts_graph_status(g) != TS_OK) {
        fprintf(stderr, "building the model failed: %s\n", ts_graph_error(g));
        return 1;
    }

    /* 2. Compile the whole step: autodiff, AdamW, scheduling, memory plan. */
    ts_train_spec spec = ts_train_spec_default(loss);
    spec.opt = ts_adamw(3e-3, 0.9, 0.999, 1e-8, 0.01);
    spec.schedule = (ts_lr_schedule){TS_LR_COSINE, 20, STEPS, 3e-4};
    ts_compile_options opt = ts_compile_options_default();
    opt.seed = 42;
    ts_plan *plan;
    if (ts_compile(g, &spec, &opt, &plan) != TS_OK) {
        fprintf(stderr, "compile failed: %s\n", ts_last_error());
        return 1;
    }
    ts_plan_stats st;
    ts_plan_get_stats(plan, &st);
    printf("compiled: %d instructions, arena %.1f KiB (every tensor separately: %.1f KiB)\n",
           st.n_instructions, st.arena_bytes / 1024.0, st.naive_bytes / 1024.0);

    /* 3. Train: feed a batch, run one step, read the loss. */
    float xb[BATCH * IN], yb[BATCH];
    unsigned seed = 7;
    double first = 0, last = 0;
    for (int step = 1; step <= STEPS; step++) {
        make_batch(&seed, xb, yb);
        ts_plan_set_input(plan, "x", xb, sizeof xb);
        ts_plan_set_input(plan, "y", yb, sizeof yb);
        if (ts_plan_step(plan) != TS_OK) {
            fprintf(stderr, "step %d failed: %s\n", step, ts_last_error());
            return 1;
        }
        last = ts_plan_loss(plan);
        if (step == 1) first = last;
        if (step == 1 || step % 50 == 0)
            printf("step %4d  loss %.5f  lr %.2e\n", step, last, ts_plan_lr(plan));
    }
    printf("loss %.4f -> %.4f\n", first, last);

    /* 4. Read a trained parameter back by name. */
    float head_b;
    ts_plan_read(plan, "head.bias", &head_b, sizeof head_b);
    printf("head.bias = %.4f\n", head_b);
    ts_plan_free(plan);
    ts_graph_free(g);
    return last < first ? 0 : 1;
}
