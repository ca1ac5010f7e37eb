/* plan/micro.h's ts_plan_bind_grads and ts_plan_hold_monitors (dist.reproducible writes each
 * round's gradients into a region of its own, and runs the monitors in the last round only):
 * a backward pass bound to another region writes there exactly the gradients it writes into
 * the plan's own, and leaves the own region alone; bound back, it writes the own region again;
 * held monitors keep the values of the last step that ran them; an update bound to another
 * region (ts_plan_bind_update_grads) reads the gradients there. */
#include <stdlib.h>
#include <string.h>
#include "check.h"
#include "plan/micro.h"
#include "plan/plan.h"
#include "plan/stages.h"

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

/* Every parameter's bytes, concatenated, in a new array of *bytes. */
static unsigned char *params(ts_plan *p, size_t *bytes) {
    size_t total = 0, b = 0;
    for (int i = 0; i < ts_plan_param_count(p); i++)
        if (ts_plan_value_at(p, ts_plan_param_name(p, i), &b)) total += b;
    unsigned char *v = malloc(total ? total : 1);
    size_t o = 0;
    for (int i = 0; v && i < ts_plan_param_count(p); i++) {
        const unsigned char *at = ts_plan_value_at(p, ts_plan_param_name(p, i), &b);
        if (at) memcpy(v + o, at, b), o += b;
    }
    *bytes = total;
    return v;
}

/* ts_plan_bind_update_grads: two plans of one graph and seed take a step on one batch; the
 * second's backward pass and update both bound to another region give the first's parameters
 * while its own region (filled with 7s, which an update reading it would apply) stays as it
 * was. Bound to the own region's 7s instead, the parameters differ: the test can fail. */
static void test_bind_update(ts_graph *g, const ts_train_spec *spec,
                             const ts_compile_options *opt) {
    ts_plan *p1 = NULL, *p2 = NULL, *p3 = NULL;
    CHECK_OK(ts_compile(g, spec, opt, &p1));
    CHECK_OK(ts_compile(g, spec, opt, &p2));
    CHECK_OK(ts_compile(g, spec, opt, &p3));
    if (!p1 || !p2 || !p3) return;
    float *own2 = NULL, *own3 = NULL;
    size_t n = 0, n3 = 0;
    CHECK_OK(ts_plan_grad_region(p2, &own2, &n));
    CHECK_OK(ts_plan_grad_region(p3, &own3, &n3));
    float *other = calloc(n, sizeof(float)), *other3 = calloc(n, sizeof(float));
    CHECK(other && other3 && n == n3, "memory");
    if (!other || !other3 || n != n3) return;
    for (size_t i = 0; i < n; i++) own2[i] = own3[i] = 7.0f;
    CHECK_OK(ts_plan_bind_grads(p2, own2, other));
    CHECK_OK(ts_plan_bind_update_grads(p2, own2, other));
    /* p3: the backward pass bound away, the update still reading the own region's 7s */
    CHECK_OK(ts_plan_bind_grads(p3, own3, other3));
    feed(p1, 5);
    feed(p2, 5);
    feed(p3, 5);
    size_t b1, b2, b3;
    unsigned char *w1 = params(p1, &b1), *w2 = params(p2, &b2), *w3 = params(p3, &b3);
    CHECK(w1 && w2 && w3 && b1 == b2 && b1 == b3, "parameters read");
    if (w1 && w2 && w3 && b1 == b2 && b1 == b3) {
        CHECK(memcmp(w1, w2, b1) == 0, "update bound: the parameters of the unbound plan");
        CHECK(memcmp(w1, w3, b1) != 0, "update not bound: it applied the own region's 7s");
    }
    int own_kept = 1;
    for (size_t i = 0; i < n; i++) own_kept &= own2[i] == 7.0f;
    CHECK(own_kept, "update bound: the plan's own region left as it was");
    CHECK(ts_plan_bind_update_grads(p2, NULL, other) != TS_OK, "update: a NULL region refused");
    CHECK(ts_plan_bind_update_grads(NULL, own2, other) != TS_OK, "update: a NULL plan refused");
    free(w1), free(w2), free(w3);
    free(other), free(other3);
    ts_plan_free(p1), ts_plan_free(p2), ts_plan_free(p3);
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
    test_bind_update(g, &spec, &opt);
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
    CHECK(fwd && ts_plan_bind_update_grads(fwd, own, other) != TS_OK,
          "update: a plan without gradients refused");
    ts_plan_free(fwd);

    free(mon1), free(mon1b), free(held), free(mon2);
    free(ref), free(other), free(mark);
    ts_plan_free(p);
    ts_graph_free(g);
    return check_summary("unit/micro_bind");
}
