/* Learning-rate schedules: warm-up, linear and cosine decay, and the rate
 * the plan actually feeds to its optimizer step. */
#include "check.h"

int main(void) {
    ts_lr_schedule c = {TS_LR_CONSTANT, 0, 0, 0};
    CHECK_NEAR(ts_lr_at(&c, 0.1, 1), 0.1, 0);
    CHECK_NEAR(ts_lr_at(&c, 0.1, 1000000), 0.1, 0);
    ts_lr_schedule w = {TS_LR_CONSTANT, 10, 0, 0};
    CHECK_NEAR(ts_lr_at(&w, 0.1, 1), 0.01, 1e-15);
    CHECK_NEAR(ts_lr_at(&w, 0.1, 5), 0.05, 1e-15);
    CHECK_NEAR(ts_lr_at(&w, 0.1, 10), 0.1, 1e-15);
    CHECK_NEAR(ts_lr_at(&w, 0.1, 11), 0.1, 1e-15);
    ts_lr_schedule lin = {TS_LR_LINEAR, 10, 110, 0.001};
    CHECK_NEAR(ts_lr_at(&lin, 0.1, 10), 0.1, 1e-15);
    CHECK_NEAR(ts_lr_at(&lin, 0.1, 60), 0.001 + 0.099 * 0.5, 1e-12);
    CHECK_NEAR(ts_lr_at(&lin, 0.1, 110), 0.001, 1e-15);
    CHECK_NEAR(ts_lr_at(&lin, 0.1, 500), 0.001, 1e-15);
    ts_lr_schedule cosv = {TS_LR_COSINE, 0, 100, 0.0};
    CHECK_NEAR(ts_lr_at(&cosv, 0.2, 0), 0.2, 1e-12);
    CHECK_NEAR(ts_lr_at(&cosv, 0.2, 50), 0.1, 1e-12);
    CHECK_NEAR(ts_lr_at(&cosv, 0.2, 25), 0.1 * (1 + cos(M_PI * 0.25)), 1e-12);
    CHECK_NEAR(ts_lr_at(&cosv, 0.2, 100), 0.0, 1e-12);

    /* The plan uses the schedule: SGD on loss = sum(w) moves w by -lr each
     * step, so w after each step reveals the rate that step used. */
    ts_graph *g = ts_graph_new();
    int64_t d[1] = {1};
    ts_val wv = ts_param(g, "w", TS_F32, 1, d, ts_init_zeros());
    ts_val loss = ts_sum(g, wv, 0, NULL, 0);
    ts_train_spec spec = ts_train_spec_default(loss);
    spec.opt = ts_sgd(0.5, 0, 0, 0, 0);
    spec.schedule = (ts_lr_schedule){TS_LR_LINEAR, 2, 4, 0.0};
    ts_plan *p;
    CHECK_OK(ts_compile(g, &spec, NULL, &p));
    double expect = 0, rates[5] = {0.25, 0.5, 0.25, 0.0, 0.0};
    for (int s = 0; s < 5; s++) {
        CHECK_NEAR(ts_plan_lr(p), rates[s], 1e-12);
        CHECK_OK(ts_plan_step(p));
        float w;
        ts_plan_read(p, "w", &w, sizeof w);
        expect -= rates[s];
        CHECK_NEAR(w, expect, 1e-6);
    }
    ts_plan_free(p);
    ts_graph_free(g);
    return check_summary("lr schedule");
}
