/* Houlsby adapters of the peft pass (src/passes/peft_adapter.c): step 0
 * is the base model bit for bit (up-projection and biases zero), the
 * adapter computes y + act(y D^T + bd) U^T + bu after the whole layer
 * (bias add, spmm included), its gradients agree with finite
 * differences, everything else is frozen, and a pattern that names no
 * layer fails naming it. */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include "check.h"
#include "plan/plan.h"
#include "tessel/sparse.h"

enum { N = 4, IN = 6, HID = 5, OUT = 3, M = 2 };

/* x [N, IN] -> linear(w1 [HID, IN], b1) -> spmm(ring adjacency) -> tanh
 * -> x w2 ([HID, OUT], no transpose) -> "out"; loss = mean((out - y)^2). */
static ts_graph *model(ts_dtype dt, ts_val *loss) {
    ts_graph *g = ts_graph_new();
    ts_val x = ts_input(g, "x", dt, 2, (int64_t[]){N, IN});
    ts_val y = ts_input(g, "y", dt, 2, (int64_t[]){N, OUT});
    ts_val w1 = ts_param(g, "l1.weight", dt, 2, (int64_t[]){HID, IN}, ts_init_kaiming_uniform(2));
    ts_val b1 = ts_param(g, "l1.bias", dt, 1, (int64_t[]){HID}, ts_init_uniform(-0.3, 0.3));
    ts_val w2 = ts_param(g, "l2.w", dt, 2, (int64_t[]){HID, OUT}, ts_init_uniform(-0.5, 0.5));
    int64_t src[N], dst[N];
    for (int i = 0; i < N; i++) src[i] = i, dst[i] = (i + 1) % N;
    ts_csr adj;
    CHECK_OK(ts_gcn_norm_adjacency(N, N, src, dst, &adj));
    ts_val h = ts_tanh(g, ts_spmm_csr(g, &adj, ts_linear(g, x, w1, b1)));
    ts_csr_free(&adj);
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

static ts_peft_options adapters(const char *after, int hidden, ts_peft_activation act) {
    ts_peft_options o = {NULL, 8, 8, 0, 0.0, after, hidden, act};
    return o;
}

/* Step 1 is the base model's bit for bit; frozen parameters get no
 * gradient and do not move; the up-projection trains; LoRA on the same
 * layer trains alongside. */
static void test_step0_and_frozen(void) {
    ts_val loss;
    ts_graph *g = model(TS_F32, &loss);
    ts_train_spec spec = ts_train_spec_default(loss);
    spec.opt = ts_adamw(1e-2, 0.9, 0.999, 1e-8, 0.01);
    ts_compile_options o = ts_compile_options_default();
    o.seed = 3;
    ts_plan *base, *ap;
    CHECK_OK(ts_compile(g, &spec, &o, &base));
    o.peft = adapters("l1, ^l2\\.w$", M, TS_PEFT_GELU);
    o.peft.targets = "l1";
    o.peft.r = 2;
    CHECK_OK(ts_compile(g, &spec, &o, &ap));
    if (!base || !ap) return;
    feed(base, TS_F32), feed(ap, TS_F32);
    float ob[N * OUT], oa[N * OUT], w1[HID * IN], w1b[HID * IN];
    CHECK_OK(ts_plan_read(ap, "l1.weight", w1, sizeof w1));
    CHECK_OK(ts_plan_step(base));
    CHECK_OK(ts_plan_step(ap));
    CHECK_OK(ts_plan_read(base, "out", ob, sizeof ob));
    CHECK_OK(ts_plan_read(ap, "out", oa, sizeof oa));
    CHECK(!memcmp(ob, oa, sizeof ob), "step 1 output equals the base model's bit for bit");
    double lb = ts_plan_loss(base), la = ts_plan_loss(ap);
    CHECK(!memcmp(&lb, &la, sizeof lb), "step 1 loss %.9g equals the base's %.9g", la, lb);
    const char *frozen[3] = {"l1.weight", "l1.bias", "l2.w"};
    char gn[128];
    for (int i = 0; i < 3; i++) {
        snprintf(gn, sizeof gn, "grad:%s", frozen[i]);
        CHECK(ts_plan_value_info(ap, gn, NULL, NULL, NULL) != TS_OK, "no %s", gn);
    }
    const char *trained[] = {"l1.weight.adapter_down", "l1.weight.adapter_down_bias",
                             "l1.weight.adapter_up",   "l1.weight.adapter_up_bias",
                             "l2.w.adapter_up",        "l1.weight.lora_B"};
    for (int i = 0; i < 6; i++) {
        snprintf(gn, sizeof gn, "grad:%s", trained[i]);
        CHECK_OK(ts_plan_value_info(ap, gn, NULL, NULL, NULL));
    }
    int n_state = 0;
    for (int i = 0; i < ts_plan_persistent_count(ap); i++) {
        ts_persistent pv;
        CHECK_OK(ts_plan_persistent(ap, i, &pv));
        if (!pv.is_state) continue;
        n_state++;
        CHECK(strstr(pv.name, ".adapter_") || strstr(pv.name, ".lora_"), "state of %s", pv.name);
    }
    /* AdamW: two moments for each of 8 adapter and 2 LoRA tensors */
    CHECK(n_state == 20, "optimizer state: %d values (want 20)", n_state);
    for (int s = 0; s < 3; s++) CHECK_OK(ts_plan_step(ap));
    CHECK_OK(ts_plan_read(ap, "l1.weight", w1b, sizeof w1b));
    CHECK(!memcmp(w1, w1b, sizeof w1), "frozen l1.weight unchanged after 4 steps");
    float up[HID * M];
    CHECK_OK(ts_plan_read(ap, "l1.weight.adapter_up", up, sizeof up));
    int moved = 0;
    for (int i = 0; i < HID * M; i++) moved += up[i] != 0;
    CHECK(moved > 0, "adapter_up trained (%d of %d entries moved)", moved, HID * M);
    CHECK(ts_plan_loss(ap) < la, "loss drops: %g -> %g", la, ts_plan_loss(ap));
    ts_plan_free(base);
    ts_plan_free(ap);
    ts_graph_free(g);
}

/* Down-projection Kaiming-uniform (|D| <= 1/sqrt(d)), the rest zero. */
static void test_init(void) {
    ts_val loss;
    ts_graph *g = model(TS_F32, &loss);
    ts_compile_options o = ts_compile_options_default();
    o.peft = adapters("l1", M, TS_PEFT_GELU);
    ts_plan *p;
    CHECK_OK(ts_compile(g, NULL, &o, &p));
    if (!p) return;
    float d[M * HID], db[M], u[HID * M], ub[HID];
    int rank;
    int64_t dims[8];
    CHECK_OK(ts_plan_value_info(p, "l1.weight.adapter_down", NULL, &rank, dims));
    CHECK(rank == 2 && dims[0] == M && dims[1] == HID, "down is [m, d]");
    CHECK_OK(ts_plan_value_info(p, "l1.weight.adapter_up", NULL, &rank, dims));
    CHECK(rank == 2 && dims[0] == HID && dims[1] == M, "up is [d, m]");
    CHECK_OK(ts_plan_read(p, "l1.weight.adapter_down", d, sizeof d));
    CHECK_OK(ts_plan_read(p, "l1.weight.adapter_down_bias", db, sizeof db));
    CHECK_OK(ts_plan_read(p, "l1.weight.adapter_up", u, sizeof u));
    CHECK_OK(ts_plan_read(p, "l1.weight.adapter_up_bias", ub, sizeof ub));
    int inside = 1, zero = 1;
    for (int i = 0; i < M * HID; i++) inside &= fabsf(d[i]) <= 1 / sqrtf(HID) && d[i] != 0;
    for (int i = 0; i < HID * M; i++) zero &= u[i] == 0;
    for (int i = 0; i < M; i++) zero &= db[i] == 0;
    for (int i = 0; i < HID; i++) zero &= ub[i] == 0;
    CHECK(inside, "down within +-1/sqrt(d)");
    CHECK(zero, "up and both biases start at zero");
    ts_plan_free(p);
    ts_graph_free(g);
}

static double act(double v, ts_peft_activation a) {
    switch (a) {
    case TS_PEFT_RELU: return v > 0 ? v : 0;
    case TS_PEFT_TANH: return tanh(v);
    default: return 0.5 * v * (1 + erf(v / sqrt(2.0)));
    }
}

/* The adapter after l2 (a plain matmul, the output "out") computes
 * y + act(y D^T + bd) U^T + bu from the base output y. */
static void test_forward(ts_peft_activation a) {
    ts_val loss;
    ts_graph *g = model(TS_F64, &loss);
    ts_compile_options o = ts_compile_options_default();
    ts_plan *b, *p;
    CHECK_OK(ts_compile(g, NULL, &o, &b));
    o.peft = adapters("l2", M, a);
    CHECK_OK(ts_compile(g, NULL, &o, &p));
    if (!b || !p) return;
    feed(b, TS_F64), feed(p, TS_F64);
    double d[M * OUT], db[M], u[OUT * M], ub[OUT], y[N * OUT], z[N * OUT];
    fill(d, TS_F64, M * OUT, 0.1), fill(db, TS_F64, M, 0.7);
    fill(u, TS_F64, OUT * M, 0.9), fill(ub, TS_F64, OUT, 2.3);
    CHECK_OK(ts_plan_write_param(p, "l2.w.adapter_down", d, sizeof d));
    CHECK_OK(ts_plan_write_param(p, "l2.w.adapter_down_bias", db, sizeof db));
    CHECK_OK(ts_plan_write_param(p, "l2.w.adapter_up", u, sizeof u));
    CHECK_OK(ts_plan_write_param(p, "l2.w.adapter_up_bias", ub, sizeof ub));
    CHECK_OK(ts_plan_step(b));
    CHECK_OK(ts_plan_step(p));
    CHECK_OK(ts_plan_read(b, "out", y, sizeof y));
    CHECK_OK(ts_plan_read(p, "out", z, sizeof z));
    double worst = 0;
    for (int n = 0; n < N; n++)
        for (int j = 0; j < OUT; j++) {
            double want = y[n * OUT + j] + ub[j];
            for (int k = 0; k < M; k++) {
                double h = db[k];
                for (int i = 0; i < OUT; i++) h += y[n * OUT + i] * d[k * OUT + i];
                want += act(h, a) * u[j * M + k];
            }
            worst = fmax(worst, fabs(want - z[n * OUT + j]));
        }
    CHECK(worst < 1e-12, "adapter output (activation %d) within %g of the formula", (int)a, worst);
    ts_plan_free(b), ts_plan_free(p);
    ts_graph_free(g);
}

/* Gradients of the four adapter tensors after the GCN-like layer l1 (f64,
 * up made non-zero) against central differences of the loss. */
static void gradcheck(void) {
    ts_val loss;
    ts_graph *g = model(TS_F64, &loss);
    ts_train_spec spec = ts_train_spec_default(loss);
    spec.opt.kind = TS_OPT_NONE;
    ts_compile_options o = ts_compile_options_default();
    o.peft = adapters("l1", M, TS_PEFT_GELU);
    ts_plan *p;
    CHECK_OK(ts_compile(g, &spec, &o, &p));
    if (!p) return;
    feed(p, TS_F64);
    const char *names[4] = {"l1.weight.adapter_down", "l1.weight.adapter_down_bias",
                            "l1.weight.adapter_up", "l1.weight.adapter_up_bias"};
    const int sizes[4] = {M * HID, M, HID * M, HID};
    double vals[4][32], grads[4][32];
    for (int t = 0; t < 4; t++) {
        fill(vals[t], TS_F64, sizes[t], 0.5 + t);
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
            worst = fmax(worst, err);
        }
    CHECK(worst < 1e-5, "adapter gradients vs finite differences: worst relative error %g", worst);
    ts_plan_free(p);
    ts_graph_free(g);
}

static void test_errors(void) {
    ts_val loss;
    ts_graph *g = model(TS_F32, &loss);
    ts_train_spec spec = ts_train_spec_default(loss);
    ts_compile_options o = ts_compile_options_default();
    ts_plan *p = NULL;
    o.peft = adapters("l1, attn", M, TS_PEFT_GELU);
    CHECK(ts_compile(g, &spec, &o, &p) == TS_ERR_INVALID && !p, "an unknown layer fails");
    CHECK(strstr(ts_last_error(), "peft.adapter.after: 'attn' matches no layer") &&
              strstr(ts_last_error(), "l1.weight, l2.w"),
          "message names the pattern and the layers: %s", ts_last_error());
    o.peft = adapters("l1(", M, TS_PEFT_GELU);
    CHECK(ts_compile(g, &spec, &o, &p) == TS_ERR_INVALID &&
              strstr(ts_last_error(), "peft.adapter.after: 'l1(' is not a valid"),
          "bad regex: %s", ts_last_error());
    o.peft = adapters("l1", 0, TS_PEFT_GELU);
    CHECK(ts_compile(g, &spec, &o, &p) == TS_ERR_INVALID &&
              strstr(ts_last_error(), "peft.adapter.hidden"),
          "hidden 0: %s", ts_last_error());
    ts_graph_free(g);
}

int main(void) {
    test_step0_and_frozen();
    test_init();
    test_forward(TS_PEFT_GELU);
    test_forward(TS_PEFT_TANH);
    test_forward(TS_PEFT_RELU);
    gradcheck();
    test_errors();
    return check_summary("peft_adapter");
}
