/* plan/micro.h's ts_plan_bind_grads and ts_plan_hold_monitors (dist.reproducible writes each
 * round's gradients into a region of its own, and runs the monitors in the last round only):
 * a backward pass bound to another region writes there exactly the gradients it writes into
 * the plan's own, and leaves the own region alone; bound back, it writes the own region again;
 * held monitors keep the values of the last step that ran them. */
#include <stdlib.h>
#include <string.h>
#include "check.h"
#include "plan/micro.h"
#include "plan/plan.h"

enum { B = 8, IN = 24, OUT = 3 };

/* The update gate: always skip, so the parameters (and every step's gradients for one batch)
 * stay the same. */
static ts_status skip_gate(ts_plan *p, void *user, ts_gate_decision *out) {
    (void)p, (void)user;
    *out = TS_GATE_SKIP;
    return TS_OK;
}

static void feed(ts_plan *p, unsigned seed) {
    float x[B * IN], y[B * OUT];
    for (int i = 0; i < B * IN; i++) x[i] = (float)rand_r(&seed) / RAND_MAX - 0.5f;
    for (int i = 0; i < B * OUT; i++) y[i] = (float)rand_r(&seed) / RAND_MAX;
    CHECK_OK(ts_plan_set_input(p, "x", x, sizeof x));
    CHECK_OK(ts_plan_set_input(p, "y", y, sizeof y));
    CHECK_OK(ts_plan_step(p));
}

/* Every monitor's sum of squares, in a new array. */
static double *monitors(ts_plan *p) {
    const int n = ts_plan_monitor_count(p);
    double *v = malloc(sizeof(double) * (size_t)(n ? n : 1));
    for (int i = 0; v && i < n; i++) {
        ts_grad_monitor m;
        CHECK_OK(ts_plan_monitor(p, i, &m));
        v[i] = m.sumsq;
    }
    return v;
}

int main(void) {
    ts_mlp_config mc = {B, 0, 0, IN, 16, 2, OUT, 1, 0};
    ts_graph *g = ts_graph_new();
    ts_model m;
    CHECK_OK(ts_build_mlp(g, &mc, &m));
    ts_train_spec spec = ts_train_spec_default(m.loss);
    spec.opt = ts_adamw(1e-2, 0.9, 0.999, 1e-8, 0.01);
    ts_compile_options opt = ts_compile_options_default();
    opt.seed = 3;
    opt.monitors = 1;
    ts_plan *p = NULL;
    CHECK_OK(ts_compile(g, &spec, &opt, &p));
    if (!p) return check_summary("unit/micro_bind");
    ts_plan_set_update_gate(p, skip_gate, NULL);
    float *own = NULL;
    size_t n = 0;
    CHECK_OK(ts_plan_grad_region(p, &own, &n));
    const size_t bytes = n * sizeof(float);
    float *ref = malloc(bytes), *other = calloc(n, sizeof(float)), *mark = malloc(bytes);
    CHECK(ref && other && mark, "memory");
    if (!ref || !other || !mark) return check_summary("unit/micro_bind");
    const int nm = ts_plan_monitor_count(p);
    CHECK(nm > 0, "the plan has gradient monitors");

    feed(p, 1);
    memcpy(ref, own, bytes);
    double *mon1 = monitors(p);

    /* Bound to `other`: the same gradients there, the own region untouched. */
    for (size_t i = 0; i < n; i++) own[i] = mark[i] = 7.0f;
    CHECK_OK(ts_plan_bind_grads(p, own, other));
    feed(p, 1);
    CHECK(memcmp(other, ref, bytes) == 0, "bound: the gradients written into the other region");
    CHECK(memcmp(own, mark, bytes) == 0, "bound: the plan's own region left as it was");
    double *mon1b = monitors(p);
    CHECK(memcmp(mon1, mon1b, sizeof(double) * (size_t)nm) == 0,
          "bound: the monitors read the gradients where they are written");

    /* Held monitors keep batch 1's values through a step on batch 2. */
    CHECK_OK(ts_plan_hold_monitors(p, 1));
    CHECK_OK(ts_plan_hold_monitors(p, 1)); /* twice: still the kernels of before to restore */
    feed(p, 2);
    double *held = monitors(p);
    CHECK(memcmp(mon1, held, sizeof(double) * (size_t)nm) == 0, "held: the monitors kept");
    CHECK(memcmp(other, ref, bytes) != 0, "batch 2's gradients differ from batch 1's");
    CHECK_OK(ts_plan_hold_monitors(p, 0));
    feed(p, 2);
    double *mon2 = monitors(p);
    CHECK(memcmp(mon1, mon2, sizeof(double) * (size_t)nm) != 0, "released: the monitors run");

    /* Bound back: the own region is written again (its padding, never written, zeroed as the
     * plan keeps it), `other` left with batch 2's. */
    memcpy(mark, other, bytes);
    memset(own, 0, bytes);
    CHECK_OK(ts_plan_bind_grads(p, other, own));
    feed(p, 1);
    CHECK(memcmp(own, ref, bytes) == 0, "bound back: the own region has the gradients");
    CHECK(memcmp(other, mark, bytes) == 0, "bound back: the other region left alone");

    /* Bad input. */
    CHECK(ts_plan_bind_grads(p, NULL, other) != TS_OK, "a NULL region: refused");
    CHECK(ts_plan_bind_grads(NULL, own, other) != TS_OK, "a NULL plan: refused");
    CHECK(ts_plan_hold_monitors(NULL, 1) != TS_OK, "hold: a NULL plan refused");
    ts_plan *fwd = NULL;
    CHECK_OK(ts_compile(g, NULL, NULL, &fwd));
    CHECK(fwd && ts_plan_bind_grads(fwd, own, other) != TS_OK,
          "a plan without gradients: nothing to bind, refused");
    ts_plan_free(fwd);

    free(mon1), free(mon1b), free(held), free(mon2);
    free(ref), free(other), free(mark);
    ts_plan_free(p);
    ts_graph_free(g);
    return check_summary("unit/micro_bind");
}
