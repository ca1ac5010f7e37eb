#include "parity.h"
#include <stdlib.h>
#include <string.h>
#include "ckpt/safetensors.h"

/* The largest max|diff| / tolerance of the compare() calls of one run. */
static double worst_ratio, step_ratio;
static char worst_what[512], step_what[512];

static int compare(const char *what, const float *got, const float *ref, int64_t n, double tol) {
    double worst = 0;
    int64_t at = 0;
    for (int64_t i = 0; i < n; i++) {
        double d = fabs((double)got[i] - (double)ref[i]);
        if (!(d <= worst)) worst = d, at = i;
    }
    CHECK(worst <= tol, "%s: max |diff| %.3g at %lld (got %.8g, ref %.8g), tolerance %.3g", what,
          worst, (long long)at, got[at], ref[at], tol);
    if (tol > 0 && worst / tol > worst_ratio) {
        worst_ratio = worst / tol;
        snprintf(worst_what, sizeof worst_what, "%s (max |diff| %.3g)", what, worst);
    }
    return worst <= tol ? 0 : 1;
}

static int check_buffers(const char *fixture, ts_st_file *f, ts_plan *p) {
    int fails = 0, n = 0;
    for (int i = 0; i < ts_st_count(f); i++) {
        const char *key = ts_st_name(f, i);
        if (strncmp(key, "buffer.", 7) != 0) continue;
        ts_st_tensor t;
        if (ts_st_find(f, key, &t) != TS_OK) continue;
        int64_t cnt = (int64_t)(t.bytes / 4);
        float *buf = malloc(t.bytes);
        ts_status s = ts_plan_read(p, key + 7, buf, t.bytes);
        CHECK(s == TS_OK, "read %s: %s", key + 7, ts_last_error());
        if (s == TS_OK) {
            double mx = 0;
            for (int64_t e = 0; e < cnt; e++) mx = fmax(mx, fabs(((const float *)t.data)[e]));
            fails += compare(key, buf, t.data, cnt, 1e-5 * fmax(mx, 1.0));
        } else {
            fails++;
        }
        free(buf);
        n++;
    }
    printf("%s: %d BatchNorm running statistics after 2 steps compared\n", fixture, n);
    return fails;
}

static int run_core(const char *fixture, const ts_graph *g, ts_val loss, const char *input_name,
                    const char *target_name, ts_optimizer opt, int buffers);

int parity_run(const char *fixture, const ts_graph *g, ts_val loss, const char *input_name,
               const char *target_name, ts_optimizer opt) {
    return run_core(fixture, g, loss, input_name, target_name, opt, 0);
}

int parity_run_buffers(const char *fixture, const ts_graph *g, ts_val loss,
                       const char *input_name, const char *target_name, ts_optimizer opt) {
    return run_core(fixture, g, loss, input_name, target_name, opt, 1);
}

static int run_core(const char *fixture, const ts_graph *g, ts_val loss, const char *input_name,
                    const char *target_name, ts_optimizer opt, int buffers) {
    ts_st_file *f = NULL;
    int fails = 0;
    worst_ratio = step_ratio = 0;
    worst_what[0] = step_what[0] = 0;
    if (ts_st_open(fixture, &f) != TS_OK) {
        CHECK(0, "cannot open fixture: %s", ts_last_error());
        return 1;
    }
    ts_train_spec spec = ts_train_spec_default(loss);
    spec.opt = opt;
    ts_plan *p = NULL;
    ts_status s = ts_compile(g, &spec, NULL, &p);
    CHECK(s == TS_OK, "compile: %s", ts_last_error());
    if (s != TS_OK) {
        ts_st_close(f);
        return 1;
    }
    int np = ts_plan_param_count(p);
    int n_fixture_params = 0;
    for (int i = 0; i < ts_st_count(f); i++)
        n_fixture_params += strncmp(ts_st_name(f, i), "param.", 6) == 0;
    CHECK(np == n_fixture_params, "model has %d parameters, fixture %d", np, n_fixture_params);
    char key[300];
    ts_st_tensor t;
    for (int i = 0; i < np; i++) {
        const char *name = ts_plan_param_name(p, i);
        snprintf(key, sizeof key, "param.%s", name);
        if (ts_st_find(f, key, &t) != TS_OK) {
            CHECK(0, "fixture lacks %s", key);
            fails++;
            continue;
        }
        s = ts_plan_write_param(p, name, t.data, t.bytes);
        CHECK(s == TS_OK, "load %s: %s", name, ts_last_error());
    }
    if (ts_st_find(f, "input.x", &t) == TS_OK) CHECK_OK(ts_plan_set_input(p, input_name, t.data, t.bytes));
    if (ts_st_find(f, "target.y", &t) == TS_OK) CHECK_OK(ts_plan_set_input(p, target_name, t.data, t.bytes));
    CHECK_OK(ts_plan_step(p));
    ts_st_find(f, "loss", &t);
    double ref_loss = *(const float *)t.data, got = ts_plan_loss(p);
    CHECK(fabs(got - ref_loss) <= 1e-5 * fabs(ref_loss), "loss %.9g vs torch %.9g", got, ref_loss);
    fails += !(fabs(got - ref_loss) <= 1e-5 * fabs(ref_loss));
    printf("%s: loss %.8f (torch %.8f)\n", fixture, got, ref_loss);
    for (int i = 0; i < np; i++) {
        const char *name = ts_plan_param_name(p, i);
        snprintf(key, sizeof key, "grad.%s", name);
        if (ts_st_find(f, key, &t) != TS_OK) continue;
        int64_t n = (int64_t)(t.bytes / 4);
        float *gbuf = malloc(t.bytes);
        snprintf(key, sizeof key, "grad:%s", name);
        CHECK_OK(ts_plan_read(p, key, gbuf, t.bytes));
        double mx = 0;
        for (int64_t e = 0; e < n; e++) mx = fmax(mx, fabs(((const float *)t.data)[e]));
        fails += compare(key, gbuf, t.data, n, 1e-4 * mx);
        free(gbuf);
    }
    CHECK_OK(ts_plan_step(p));
    /* Adam divides each gradient by its own magnitude, so where the
     * reference gradient is below the gradient tolerance (pure rounding
     * noise, e.g. the key bias of attention, whose exact gradient is 0) the
     * direction of the update is not determined by either side. Those
     * elements are held to the size of two updates (2 lr) instead of
     * lr * 1e-3, and counted. */
    int64_t noise = 0, total = 0;
    for (int i = 0; i < np; i++) {
        const char *name = ts_plan_param_name(p, i);
        ts_st_tensor gref;
        snprintf(key, sizeof key, "grad.%s", name);
        if (ts_st_find(f, key, &gref) != TS_OK) continue;
        snprintf(key, sizeof key, "step2.%s", name);
        if (ts_st_find(f, key, &t) != TS_OK) continue;
        int64_t n = (int64_t)(t.bytes / 4);
        float *buf = malloc(t.bytes);
        CHECK_OK(ts_plan_read(p, name, buf, t.bytes));
        const float *gr = gref.data, *ref = t.data;
        double gmax = 0;
        for (int64_t e = 0; e < n; e++) gmax = fmax(gmax, fabs(gr[e]));
        double worst = 0, worst_noise = 0;
        for (int64_t e = 0; e < n; e++) {
            double d = fabs((double)buf[e] - (double)ref[e]);
            if (fabs(gr[e]) <= 1e-4 * gmax) {
                noise++;
                worst_noise = fmax(worst_noise, d);
            } else {
                worst = fmax(worst, d);
            }
        }
        total += n;
        if (worst / (opt.lr * 1e-3) > step_ratio) {
            step_ratio = worst / (opt.lr * 1e-3);
            snprintf(step_what, sizeof step_what, "%s (max |diff| %.3g)", key, worst);
        }
        CHECK(worst <= opt.lr * 1e-3, "%s: max |diff| %.3g > lr*1e-3 = %.3g", key, worst,
              opt.lr * 1e-3);
        CHECK(worst_noise <= 2 * opt.lr, "%s: noise-gradient elements differ by %.3g > 2 lr",
              key, worst_noise);
        fails += !(worst <= opt.lr * 1e-3) + !(worst_noise <= 2 * opt.lr);
        free(buf);
    }
    printf("%s: step-2 parameters: %lld elements within lr*1e-3, %lld with noise-level "
           "gradients within 2*lr\n",
           fixture, (long long)(total - noise), (long long)noise);
    if (buffers) fails += check_buffers(fixture, f, p);
    printf("%s: closest to tolerance: gradients/buffers %s at %.3g of it; step 2 %s at %.3g\n",
           fixture, worst_what, worst_ratio, step_what, step_ratio);
    ts_plan_free(p);
    ts_st_close(f);
    return fails;
}
