/* The update gate (ts_plan_set_update_gate): a plan whose gate skips step
 * 2 of 3 leaves parameters and optimizer state bit-exactly as after step 1
 * during step 2, and ends bit-identical to a plan that simply ran batches 1
 * and 3 (Adam's t and SGD's momentum "first step" advance only on applied
 * updates). A checkpoint taken after the skipped step resumes bit-exactly.
 * A failing gate fails the step. */
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include "check.h"
#include "core/core.h" /* ts_fail, for the failing gate */
#include "tessel/ckpt.h"

enum { B = 8, IN = 12, OUT = 2 };

typedef struct batch {
    float x[B * IN], y[B * OUT];
} batch;

static void make_batch(batch *b, unsigned seed) {
    for (int i = 0; i < B * IN; i++) b->x[i] = (float)rand_r(&seed) / RAND_MAX - 0.5f;
    for (int i = 0; i < B * OUT; i++) b->y[i] = (float)rand_r(&seed) / RAND_MAX;
}

static ts_plan *make_plan(ts_graph *g, ts_val loss, int adam) {
    ts_train_spec spec = ts_train_spec_default(loss);
    spec.opt = adam ? ts_adamw(1e-2, 0.9, 0.999, 1e-8, 0.01) : ts_sgd(0.05, 0.9, 0, 0, 0);
    spec.clip_grad_norm = adam ? 1.0 : 0; /* with and without the clip node */
    ts_compile_options opt = ts_compile_options_default();
    opt.seed = 77;
    opt.threads = 1;
    ts_plan *p = NULL;
    CHECK_OK(ts_compile(g, &spec, &opt, &p));
    return p;
}

static int step_with(ts_plan *p, const batch *b) {
    CHECK_OK(ts_plan_set_input(p, "x", b->x, sizeof b->x));
    CHECK_OK(ts_plan_set_input(p, "y", b->y, sizeof b->y));
    ts_status s = ts_plan_step(p);
    CHECK(s == TS_OK, "step: %s", ts_last_error());
    return s == TS_OK;
}

static unsigned char *snap(const ts_plan *p) {
    size_t n = ts_plan_snapshot_bytes(p);
    unsigned char *buf = malloc(n);
    CHECK_OK(ts_plan_snapshot(p, buf, n));
    return buf;
}

/* Skips the steps listed in `skip` (1-based, 0-terminated) and records
 * what the plan holds when the gate is asked. */
typedef struct gate_state {
    const int *skip;
    int calls;
    int64_t seen_step;
    double seen_norm;
    int fail;
} gate_state;

static ts_status gate(ts_plan *p, void *user, ts_gate_decision *out) {
    gate_state *g = user;
    g->calls++;
    g->seen_step = ts_plan_step_count(p) + 1; /* the step being run */
    if (g->fail)
        return ts_fail(TS_ERR_NUMERIC, "test gate refuses step %lld", (long long)g->seen_step);
    /* Gradients are complete here: their norm is readable. */
    CHECK_OK(ts_plan_grad_norm(p, &g->seen_norm));
    *out = TS_GATE_APPLY;
    for (const int *s = g->skip; *s; s++)
        if (*s == g->seen_step) *out = TS_GATE_SKIP;
    return TS_OK;
}

static void check_optimizer(ts_graph *g, ts_val loss, int adam, const char *run_dir) {
    const char *what = adam ? "adamw+clip" : "sgd+momentum";
    batch b[3];
    for (int i = 0; i < 3; i++) make_batch(&b[i], 100u + (unsigned)i);
    size_t n = 0;

    /* A: batches 1, 2, 3 with step 2 skipped. */
    ts_plan *a = make_plan(g, loss, adam);
    if (!a) return;
    n = ts_plan_snapshot_bytes(a);
    const int skip[] = {2, 0};
    gate_state gs = {skip, 0, 0, 0, 0};
    ts_plan_set_update_gate(a, gate, &gs);
    step_with(a, &b[0]);
    unsigned char *after1 = snap(a);
    CHECK(!ts_plan_last_step_skipped(a), "%s: step 1 was not skipped", what);
    step_with(a, &b[1]);
    unsigned char *after2 = snap(a);
    CHECK(ts_plan_last_step_skipped(a), "%s: step 2 reported as skipped", what);
    CHECK(memcmp(after1, after2, n) == 0, "%s: skipped step 2 changed params or state", what);
    CHECK(gs.seen_norm > 0 && isfinite(gs.seen_norm), "%s: gradients readable in the gate (%g)",
          what, gs.seen_norm);
    CHECK(ts_plan_step_count(a) == 2 && ts_plan_updates_applied(a) == 1,
          "%s: after a skip: %lld steps, %lld updates", what, (long long)ts_plan_step_count(a),
          (long long)ts_plan_updates_applied(a));
    /* A checkpoint after the skipped step carries the applied count. */
    if (adam) CHECK_OK(ts_ckpt_save(a, run_dir, NULL, NULL));
    step_with(a, &b[2]);
    CHECK(gs.calls == 3 && gs.seen_step == 3, "%s: gate called %d times (last step %lld)", what,
          gs.calls, (long long)gs.seen_step);
    CHECK(ts_plan_updates_applied(a) == 2, "%s: 2 updates applied, got %lld", what,
          (long long)ts_plan_updates_applied(a));
    unsigned char *fa = snap(a);

    /* B: batches 1 and 3, no gate. */
    ts_plan *bp = make_plan(g, loss, adam);
    step_with(bp, &b[0]);
    step_with(bp, &b[2]);
    unsigned char *fb = snap(bp);
    CHECK(memcmp(fa, fb, n) == 0, "%s: skip-2-of-3 differs from running batches 1 and 3", what);
    CHECK(memcmp(fa, after1, n) != 0, "%s: step 3 changed nothing", what);

    /* C: a plan that skips nothing through a gate ends elsewhere (the test
     * can tell a skip from an apply). */
    ts_plan *c = make_plan(g, loss, adam);
    const int none[] = {0};
    gate_state gc = {none, 0, 0, 0, 0};
    ts_plan_set_update_gate(c, gate, &gc);
    for (int i = 0; i < 3; i++) step_with(c, &b[i]);
    unsigned char *fc = snap(c);
    CHECK(memcmp(fc, fa, n) != 0 && ts_plan_updates_applied(c) == 3,
          "%s: applying every step differs from skipping one", what);

    if (adam) {
        /* D: resume from the checkpoint taken after the skipped step. */
        ts_plan *d = make_plan(g, loss, adam);
        ts_ckpt *ck = NULL;
        CHECK_OK(ts_ckpt_open(run_dir, NULL, NULL, &ck));
        ts_ckpt_info info;
        if (ck) {
            CHECK_OK(ts_ckpt_get_info(ck, &info));
            CHECK(info.step == 2 && info.updates_applied == 1,
                  "checkpoint: step %lld, updates_applied %lld", (long long)info.step,
                  (long long)info.updates_applied);
            CHECK_OK(ts_ckpt_restore(ck, d, NULL));
            ts_ckpt_close(ck);
        }
        CHECK(ts_plan_updates_applied(d) == 1, "restored applied count %lld",
              (long long)ts_plan_updates_applied(d));
        step_with(d, &b[2]);
        unsigned char *fd = snap(d);
        CHECK(memcmp(fd, fa, n) == 0, "resume after a skipped step is not bit-exact");
        free(fd);
        ts_plan_free(d);

        /* A failing gate fails the step and names the gate. */
        gs.fail = 1;
        ts_status s = ts_plan_step(a);
        CHECK(s == TS_ERR_NUMERIC && strstr(ts_last_error(), "update gate") &&
                  strstr(ts_last_error(), "refuses step 4"),
              "failing gate: %s: %s", ts_status_name(s), ts_last_error());
        CHECK(ts_plan_step_count(a) == 3, "a failed step is not counted");
    }
    free(after1);
    free(after2);
    free(fa);
    free(fb);
    free(fc);
    ts_plan_free(a);
    ts_plan_free(bp);
    ts_plan_free(c);
}

int main(void) {
    char run_dir[] = "/tmp/tessel_gate_XXXXXX";
    CHECK(mkdtemp(run_dir) != NULL, "mkdtemp");
    ts_mlp_config mc = {B, 0, 0, IN, 16, 2, OUT, 1, 0};
    ts_graph *g = ts_graph_new();
    ts_model m;
    CHECK_OK(ts_build_mlp(g, &mc, &m));
    check_optimizer(g, m.loss, 1, run_dir);
    check_optimizer(g, m.loss, 0, run_dir);
    ts_graph_free(g);
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", run_dir);
    CHECK(system(cmd) == 0, "cleanup");
    return check_summary("update_gate");
}
