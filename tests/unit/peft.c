/* The peft pass (src/passes/peft.c): LoRA adds exactly nothing at step 0,
 * its gradients agree with finite differences, everything else is frozen
 * (no gradient, no optimizer state, unchanged by steps), init follows
 * peft (A within Kaiming-uniform bounds, B zero, deterministic), and the
 * configuration errors name the key and the value. */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include "check.h"
#include "plan/plan.h"

enum { N = 4, IN = 6, HID = 5, OUT = 3 };

/* x [N, IN] -> linear(w1 [HID, IN], b1) -> tanh -> x w2 ([HID, OUT], no
 * transpose) -> "out"; loss = mean((out - y)^2). */
static ts_graph *model(ts_dtype dt, ts_val *loss) {
    ts_graph *g = ts_graph_new();
    ts_val x = ts_input(g, "x", dt, 2, (int64_t[]){N, IN});
    ts_val y = ts_input(g, "y", dt, 2, (int64_t[]){N, OUT});
    ts_val w1 = ts_param(g, "l1.weight", dt, 2, (int64_t[]){HID, IN}, ts_init_kaiming_uniform(2));
    ts_val b1 = ts_param(g, "l1.bias", dt, 1, (int64_t[]){HID}, ts_init_uniform(-0.3, 0.3));
    ts_val w2 = ts_param(g, "l2.w", dt, 2, (int64_t[]){HID, OUT}, ts_init_uniform(-0.5, 0.5));
    ts_val h = ts_tanh(g, ts_linear(g, x, w1, b1));
    ts_val out = ts_matmul(g, h, w2, 0, 0);
    ts_mark_output(g, out, "out");
    ts_val d = ts_sub(g, out, y);
    *loss = ts_mean(g, ts_mul(g, d, d), 0, NULL, 0);
    return g;
}

static void fill(void *buf, ts_dtype dt, int n, double seed) {
    for (int i = 0; i < n; i++) {
        double v = sin(seed + 1.7 * i);
        if (dt == TS_F64)
            ((double *)buf)[i] = v;
        else
            ((float *)buf)[i] = (float)v;
    }
}

static void feed(ts_plan *p, ts_dtype dt) {
    double x[N * IN], y[N * OUT];
    size_t es = ts_dtype_size(dt);
    fill(x, dt, N * IN, 0.3);
    fill(y, dt, N * OUT, 1.1);
    CHECK_OK(ts_plan_set_input(p, "x", x, N * IN * es));
    CHECK_OK(ts_plan_set_input(p, "y", y, N * OUT * es));
}

static ts_peft_options lora(const char *targets, int r, double alpha) {
    ts_peft_options o = {.targets = targets, .r = r, .alpha = alpha};
    return o;
}

/* Outputs and loss of step 1 are the base model's, bit for bit; frozen
 * parameters get no gradient, no optimizer state and do not move. */
static void test_step0_and_frozen(void) {
    ts_val loss;
    ts_graph *g = model(TS_F32, &loss);
    ts_train_spec spec = ts_train_spec_default(loss);
    spec.opt = ts_adamw(1e-2, 0.9, 0.999, 1e-8, 0.01);
    ts_compile_options o = ts_compile_options_default();
    o.seed = 7;
    ts_plan *base, *lp;
    CHECK_OK(ts_compile(g, &spec, &o, &base));
    o.peft = lora("^l1\\.weight$, l2", 4, 8);
    CHECK_OK(ts_compile(g, &spec, &o, &lp));
    if (!base || !lp) return;
    feed(base, TS_F32), feed(lp, TS_F32);
    float w1[HID * IN], w1_after[HID * IN], w2[HID * OUT], w2_after[HID * OUT];
    float ob[N * OUT], ol[N * OUT];
    CHECK_OK(ts_plan_read(lp, "l1.weight", w1, sizeof w1));
    CHECK_OK(ts_plan_read(lp, "l2.w", w2, sizeof w2));
    CHECK_OK(ts_plan_step(base));
    CHECK_OK(ts_plan_step(lp));
    CHECK_OK(ts_plan_read(base, "out", ob, sizeof ob));
    CHECK_OK(ts_plan_read(lp, "out", ol, sizeof ol));
    CHECK(!memcmp(ob, ol, sizeof ob), "step 1 output equals the base model's bit for bit");
    double lb = ts_plan_loss(base), ll = ts_plan_loss(lp);
    CHECK(!memcmp(&lb, &ll, sizeof lb), "step 1 loss %.9g equals the base model's %.9g", ll, lb);
    /* frozen: no gradient, no state, unchanged */
    CHECK(ts_plan_value_info(lp, "grad:l1.weight", NULL, NULL, NULL) != TS_OK, "no grad l1.weight");
    CHECK(ts_plan_value_info(lp, "grad:l1.bias", NULL, NULL, NULL) != TS_OK, "no grad l1.bias");
    CHECK(ts_plan_value_info(lp, "grad:l2.w", NULL, NULL, NULL) != TS_OK, "no grad l2.w");
    CHECK_OK(ts_plan_value_info(lp, "grad:l1.weight.lora_A", NULL, NULL, NULL));
    CHECK_OK(ts_plan_value_info(lp, "grad:l2.w.lora_B", NULL, NULL, NULL));
    int n_state = 0, lora_state = 0;
    for (int i = 0; i < ts_plan_persistent_count(lp); i++) {
        ts_persistent pv;
        CHECK_OK(ts_plan_persistent(lp, i, &pv));
        if (!pv.is_state) continue;
        n_state++;
        lora_state += strstr(pv.name, ".lora_") != NULL;
    }
    CHECK(n_state == 8 && lora_state == 8, "optimizer state: %d values, %d of LoRA (want 8, 8)",
          n_state, lora_state);
    ts_plan_stats sb, sl;
    CHECK_OK(ts_plan_get_stats(base, &sb));
    CHECK_OK(ts_plan_get_stats(lp, &sl));
    /* each gradient starts 64-byte aligned: base 30, 5, 15 floats -> 128 + 64
     * + 64 bytes; LoRA A1 4x6, B1 5x4, A2 4x5, B2 3x4 -> 128 + 128 + 128 + 64 */
    CHECK(sl.grad_bytes == 448 && sb.grad_bytes == 256, "gradient bytes %zu (LoRA) vs %zu (base)",
          sl.grad_bytes, sb.grad_bytes);
    for (int s = 0; s < 3; s++) CHECK_OK(ts_plan_step(lp));
    CHECK_OK(ts_plan_read(lp, "l1.weight", w1_after, sizeof w1));
    CHECK_OK(ts_plan_read(lp, "l2.w", w2_after, sizeof w2));
    CHECK(!memcmp(w1, w1_after, sizeof w1) && !memcmp(w2, w2_after, sizeof w2),
          "frozen weights unchanged after 4 steps");
    float bl[OUT * 4];
    CHECK_OK(ts_plan_read(lp, "l2.w.lora_B", bl, sizeof bl));
    int moved = 0;
    for (int i = 0; i < OUT * 4; i++) moved += bl[i] != 0;
    CHECK(moved > 0, "lora_B trained (%d of %d entries moved)", moved, OUT * 4);
    CHECK(ts_plan_loss(lp) < ll, "loss drops: %g -> %g", ll, ts_plan_loss(lp));
    ts_plan_free(base);
    ts_plan_free(lp);
    ts_graph_free(g);
}

/* A [r, in] is Kaiming-uniform with a = sqrt(5): |a| <= 1/sqrt(in); B is
 * zero; the same seed gives the same bits, another seed other bits. */
static void test_init(void) {
    ts_val loss;
    ts_graph *g = model(TS_F32, &loss);
    ts_train_spec spec = ts_train_spec_default(loss);
    ts_compile_options o = ts_compile_options_default();
    o.peft = lora("l1", 4, 8);
    ts_plan *p1, *p2, *p3;
    CHECK_OK(ts_compile(g, &spec, &o, &p1));
    CHECK_OK(ts_compile(g, &spec, &o, &p2));
    o.seed = 1;
    CHECK_OK(ts_compile(g, &spec, &o, &p3));
    float a1[4 * IN], a2[4 * IN], a3[4 * IN], b[HID * 4];
    ts_dtype dt;
    int rank;
    int64_t dims[8];
    CHECK_OK(ts_plan_value_info(p1, "l1.weight.lora_A", &dt, &rank, dims));
    CHECK(rank == 2 && dims[0] == 4 && dims[1] == IN, "A is [r, in]");
    CHECK_OK(ts_plan_value_info(p1, "l1.weight.lora_B", &dt, &rank, dims));
    CHECK(rank == 2 && dims[0] == HID && dims[1] == 4, "B is [out, r]");
    CHECK_OK(ts_plan_read(p1, "l1.weight.lora_A", a1, sizeof a1));
    CHECK_OK(ts_plan_read(p2, "l1.weight.lora_A", a2, sizeof a2));
    CHECK_OK(ts_plan_read(p3, "l1.weight.lora_A", a3, sizeof a3));
    CHECK_OK(ts_plan_read(p1, "l1.weight.lora_B", b, sizeof b));
    const double bound = 1.0 / sqrt((double)IN);
    int inside = 1, zero = 1;
    for (int i = 0; i < 4 * IN; i++) inside &= fabs(a1[i]) <= bound && a1[i] != 0;
    for (int i = 0; i < HID * 4; i++) zero &= b[i] == 0;
    CHECK(inside, "A within +-1/sqrt(in) = %g", bound);
    CHECK(zero, "B starts at zero");
    CHECK(!memcmp(a1, a2, sizeof a1), "same seed, same A");
    CHECK(memcmp(a1, a3, sizeof a1) != 0, "another seed, another A");
    ts_plan_free(p1), ts_plan_free(p2), ts_plan_free(p3);
    ts_graph_free(g);
}

/* Gradients of A and B (f64, B made non-zero) against central differences
 * of the loss, for the transposed (linear) and the plain matmul weight,
 * with alpha/r and rsLoRA scaling. */
static void gradcheck(int rslora) {
    ts_val loss;
    ts_graph *g = model(TS_F64, &loss);
    ts_train_spec spec = ts_train_spec_default(loss);
    spec.opt.kind = TS_OPT_NONE;
    ts_compile_options o = ts_compile_options_default();
    o.peft = lora("weight|l2\\.w", 2, 3);
    o.peft.use_rslora = rslora;
    ts_plan *p;
    CHECK_OK(ts_compile(g, &spec, &o, &p));
    if (!p) return;
    feed(p, TS_F64);
    const char *names[4] = {"l1.weight.lora_A", "l1.weight.lora_B", "l2.w.lora_A", "l2.w.lora_B"};
    const int sizes[4] = {2 * IN, HID * 2, 2 * HID, OUT * 2};
    double vals[4][32], grads[4][32];
    for (int t = 0; t < 4; t++) {
        fill(vals[t], TS_F64, sizes[t], 0.5 + t);
        for (int i = 0; i < sizes[t]; i++) vals[t][i] *= 0.7;
        CHECK_OK(ts_plan_write_param(p, names[t], vals[t], sizeof(double) * (size_t)sizes[t]));
    }
    CHECK_OK(ts_plan_step(p));
    char gn[64];
    for (int t = 0; t < 4; t++) {
        snprintf(gn, sizeof gn, "grad:%s", names[t]);
        CHECK_OK(ts_plan_read(p, gn, grads[t], sizeof(double) * (size_t)sizes[t]));
    }
    const double h = 1e-6;
    double worst = 0;
    for (int t = 0; t < 4; t++)
        for (int i = 0; i < sizes[t]; i++) {
            double f[2];
            for (int k = 0; k < 2; k++) {
                double save = vals[t][i];
                vals[t][i] = save + (k ? -h : h);
                CHECK_OK(
                    ts_plan_write_param(p, names[t], vals[t], sizeof(double) * (size_t)sizes[t]));
                CHECK_OK(ts_plan_step(p));
                f[k] = ts_plan_loss(p);
                vals[t][i] = save;
            }
            CHECK_OK(ts_plan_write_param(p, names[t], vals[t], sizeof(double) * (size_t)sizes[t]));
            double fd = (f[0] - f[1]) / (2 * h), err = fabs(fd - grads[t][i]) / (1e-6 + fabs(fd));
            if (err > worst) worst = err;
            CHECK(err < 1e-5, "%s[%d]: grad %.12g vs finite difference %.12g (rslora %d)", names[t],
                  i, grads[t][i], fd, rslora);
        }
    CHECK(worst < 1e-5, "worst relative error %g", worst);
    ts_plan_free(p);
    ts_graph_free(g);
}

/* The LoRA branch's scale: alpha/r vs alpha/sqrt(r), read through the
 * output's change when B is set. */
static void test_scale(void) {
    ts_val loss;
    ts_graph *g = model(TS_F64, &loss);
    double d[2];
    for (int rs = 0; rs < 2; rs++) {
        ts_compile_options o = ts_compile_options_default();
        o.peft = lora("l2", 4, 2);
        o.peft.use_rslora = rs;
        ts_plan *p, *b;
        CHECK_OK(ts_compile(g, NULL, &o, &p));
        o.peft.targets = NULL;
        CHECK_OK(ts_compile(g, NULL, &o, &b));
        if (!p || !b) return;
        feed(p, TS_F64), feed(b, TS_F64);
        double bl[OUT * 4], ol[N * OUT], ob[N * OUT];
        for (int i = 0; i < OUT * 4; i++) bl[i] = 0.25;
        CHECK_OK(ts_plan_write_param(p, "l2.w.lora_B", bl, sizeof bl));
        CHECK_OK(ts_plan_step(p));
        CHECK_OK(ts_plan_step(b));
        CHECK_OK(ts_plan_read(p, "out", ol, sizeof ol));
        CHECK_OK(ts_plan_read(b, "out", ob, sizeof ob));
        d[rs] = ol[0] - ob[0];
        ts_plan_free(p), ts_plan_free(b);
    }
    /* alpha/r = 0.5, alpha/sqrt(r) = 1 */
    CHECK(fabs(d[0]) > 1e-6 && fabs(d[1] / d[0] - 2.0) < 1e-9, "rslora doubles the branch: %g %g",
          d[0], d[1]);
    ts_graph_free(g);
}

static void test_errors(void) {
    ts_val loss;
    ts_graph *g = model(TS_F32, &loss);
    ts_train_spec spec = ts_train_spec_default(loss);
    ts_compile_options o = ts_compile_options_default();
    ts_plan *p = NULL;
    o.peft = lora("l1, attn", 4, 8);
    CHECK(ts_compile(g, &spec, &o, &p) == TS_ERR_INVALID && !p, "unmatched pattern fails");
    CHECK(strstr(ts_last_error(), "'attn' matches no matmul weight") &&
              strstr(ts_last_error(), "l1.weight, l2.w"),
          "message names the pattern and the weights: %s", ts_last_error());
    o.peft = lora("l1.bias", 4, 8); /* a parameter, but no matmul's weight */
    CHECK(ts_compile(g, &spec, &o, &p) == TS_ERR_INVALID, "a bias is not a LoRA target");
    o.peft = lora("l1(", 4, 8);
    CHECK(ts_compile(g, &spec, &o, &p) == TS_ERR_INVALID &&
              strstr(ts_last_error(), "'l1(' is not a valid regular expression"),
          "bad regex: %s", ts_last_error());
    o.peft = lora("l1", 0, 8);
    CHECK(ts_compile(g, &spec, &o, &p) == TS_ERR_INVALID && strstr(ts_last_error(), "peft.lora.r"),
          "r = 0: %s", ts_last_error());
    o.peft = lora("l1", 2, 8);
    o.peft.dropout = 1.0;
    CHECK(ts_compile(g, &spec, &o, &p) == TS_ERR_INVALID, "dropout 1 rejected");
    ts_graph_free(g);
}

/* Dropout on the LoRA branch: training steps differ from the dropout-free
 * branch once B is non-zero, and the plan stays deterministic. */
static void test_dropout(void) {
    ts_val loss;
    ts_graph *g = model(TS_F32, &loss);
    ts_train_spec spec = ts_train_spec_default(loss);
    spec.opt.kind = TS_OPT_NONE;
    float bl[OUT * 4];
    for (int i = 0; i < OUT * 4; i++) bl[i] = 0.5f;
    double l[3];
    for (int k = 0; k < 3; k++) {
        ts_compile_options o = ts_compile_options_default();
        o.peft = lora("l2", 4, 8);
        o.peft.dropout = k ? 0.5 : 0.0;
        ts_plan *p;
        CHECK_OK(ts_compile(g, &spec, &o, &p));
        if (!p) return;
        feed(p, TS_F32);
        CHECK_OK(ts_plan_write_param(p, "l2.w.lora_B", bl, sizeof bl));
        CHECK_OK(ts_plan_step(p));
        l[k] = ts_plan_loss(p);
        ts_plan_free(p);
    }
    CHECK(l[1] != l[0], "dropout changes the branch (%g vs %g)", l[1], l[0]);
    CHECK(l[1] == l[2], "dropout is deterministic (%g vs %g)", l[1], l[2]);
    ts_graph_free(g);
}

/* ts_train_spec.trainable, the API's own way of freezing: only the listed
 * parameters get a gradient and move; with PEFT the LoRA parameters
 * replace the list. */
static void test_trainable_list(void) {
    ts_val loss;
    ts_graph *g = model(TS_F32, &loss);
    ts_train_spec spec = ts_train_spec_default(loss);
    spec.opt = ts_sgd(0.1, 0, 0, 0, 0);
    ts_val only = ts_find(g, "l2.w");
    spec.trainable = &only;
    spec.n_trainable = 1;
    ts_plan *p;
    CHECK_OK(ts_compile(g, &spec, NULL, &p));
    if (!p) return;
    feed(p, TS_F32);
    float w1[HID * IN], w1b[HID * IN], w2[HID * OUT], w2b[HID * OUT];
    CHECK_OK(ts_plan_read(p, "l1.weight", w1, sizeof w1));
    CHECK_OK(ts_plan_read(p, "l2.w", w2, sizeof w2));
    CHECK_OK(ts_plan_step(p));
    CHECK_OK(ts_plan_read(p, "l1.weight", w1b, sizeof w1));
    CHECK_OK(ts_plan_read(p, "l2.w", w2b, sizeof w2));
    CHECK(!memcmp(w1, w1b, sizeof w1), "l1.weight not in the list: unchanged");
    CHECK(memcmp(w2, w2b, sizeof w2) != 0, "l2.w in the list: updated");
    CHECK(ts_plan_value_info(p, "grad:l1.weight", NULL, NULL, NULL) != TS_OK, "no grad l1.weight");
    ts_plan_free(p);
    ts_compile_options o = ts_compile_options_default();
    o.peft = lora("l1", 2, 2);
    CHECK_OK(ts_compile(g, &spec, &o, &p));
    CHECK(p && ts_plan_value_info(p, "grad:l2.w", NULL, NULL, NULL) != TS_OK &&
              ts_plan_value_info(p, "grad:l1.weight.lora_B", NULL, NULL, NULL) == TS_OK,
          "with PEFT only the LoRA parameters train");
    ts_plan_free(p);
    ts_graph_free(g);
}

int main(void) {
    test_trainable_list();
    test_step0_and_frozen();
    test_init();
    gradcheck(0);
    gradcheck(1);
    test_scale();
    test_errors();
    test_dropout();
    return check_summary("peft");
}
