/* A weight that reaches its bf16 GEMM through a view (passes/weight_copies.c): the parameter
 * is stored flat and reshaped to the GEMM's matrix, so the precision pass's cast reads the
 * parameter and the reshape reads the cast (or the reshape reads the parameter and the cast
 * reads the reshape). Sessions 19-20 found that with the weight copies such a plan read a
 * value before any node wrote it (AddressSanitizer in the schedule pass): the copy, a STATE
 * value made by the pass, got a higher id than the reshape that reads it.
 *
 * Checks: the plan compiles with and without the copies, trains 4 steps with the same losses
 * and final weights bit for bit (the copies change where the bf16 image comes from, not its
 * bits), and every step's loss is finite. */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include "check.h"
#include "tessel/tessel.h"

enum { B = 16, IN = 24, HID = 40, OUT = 4, STEPS = 4 };

static ts_plan *build(int copies) {
    ts_graph *g = ts_graph_new();
    const int64_t dx[2] = {B, IN}, dy[2] = {B, OUT}, flat1[1] = {IN * HID}, m1[2] = {HID, IN},
                  w2[2] = {OUT, HID};
    ts_val x = ts_input(g, "x", TS_F32, 2, dx);
    ts_val y = ts_input(g, "y", TS_F32, 2, dy);
    /* the first weight flat, viewed as [HID, IN] by a reshape the GEMM reads */
    ts_val w1 = ts_param(g, "w1", TS_F32, 1, flat1, ts_init_normal(0, 0.2));
    ts_val w1m = ts_reshape(g, w1, 2, m1);
    ts_val w2p = ts_param(g, "w2", TS_F32, 2, w2, ts_init_normal(0, 0.2));
    ts_val h = ts_relu(g, ts_matmul(g, x, w1m, 0, 1));
    ts_val loss = ts_mse_loss(g, ts_matmul(g, h, w2p, 0, 1), y);
    ts_train_spec spec = ts_train_spec_default(loss);
    spec.opt = ts_adamw(3e-3, 0.9, 0.999, 1e-8, 0.01);
    ts_compile_options o = ts_compile_options_default();
    o.seed = 5;
    o.threads = 1;
    o.precision.compute = TS_BF16;
    o.no_weight_copies = !copies;
    ts_plan *p = NULL;
    CHECK_OK(ts_compile(g, &spec, &o, &p));
    ts_graph_free(g);
    return p;
}

static void feed(ts_plan *p, int step) {
    float x[B * IN], y[B * OUT];
    uint64_t s = 0x9e3779b97f4a7c15ull * (uint64_t)(step + 1);
    for (int i = 0; i < B * IN; i++) {
        s ^= s << 13, s ^= s >> 7, s ^= s << 17;
        x[i] = (float)((double)(s >> 11) / 9007199254740992.0 * 2 - 1);
    }
    for (int i = 0; i < B * OUT; i++) y[i] = (float)sin(x[i] * 3 + x[(i * 7) % (B * IN)]);
    CHECK_OK(ts_plan_set_input(p, "x", x, sizeof x));
    CHECK_OK(ts_plan_set_input(p, "y", y, sizeof y));
}

int main(void) {
    ts_plan *with = build(1), *without = build(0);
    if (with && without) {
        for (int step = 0; step < STEPS; step++) {
            feed(with, step);
            feed(without, step);
            CHECK_OK(ts_plan_step(with));
            CHECK_OK(ts_plan_step(without));
            double a = ts_plan_loss(with), b = ts_plan_loss(without);
            CHECK(isfinite(a), "step %d: loss %g with the copies", step + 1, a);
            CHECK(memcmp(&a, &b, sizeof a) == 0, "step %d: loss %.9g with the copies, %.9g without",
                  step + 1, a, b);
        }
        float wa[IN * HID], wb[IN * HID];
        CHECK_OK(ts_plan_read(with, "w1", wa, sizeof wa));
        CHECK_OK(ts_plan_read(without, "w1", wb, sizeof wb));
        CHECK(memcmp(wa, wb, sizeof wa) == 0, "w1 after %d steps: with and without the copies",
              STEPS);
    }
    ts_plan_free(with);
    ts_plan_free(without);
    return check_summary("weight_copies_view");
}
