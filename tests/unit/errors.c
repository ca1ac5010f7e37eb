/* Bad input gives a clear message naming the value, never a crash. */
#include <string.h>
#include "check.h"

static char warnings[4096];
static void capture(ts_log_level lv, const char *msg, void *user) {
    (void)user;
    if (lv >= TS_LOG_WARN) {
        strncat(warnings, msg, sizeof warnings - strlen(warnings) - 2);
        strcat(warnings, "\n");
    }
}

#define HAS(s, sub) (strstr((s), (sub)) != NULL)

int main(void) {
    int64_t d23[2] = {2, 3}, d3[1] = {3}, d4[1] = {4};
    /* Builder errors are sticky and name the op and operand shapes. */
    ts_graph *g = ts_graph_new();
    ts_val x = ts_input(g, "x", TS_F32, 2, d23);
    ts_val w = ts_param(g, "w", TS_F32, 1, d4, ts_init_zeros());
    ts_val y = ts_mul(g, x, w);
    CHECK(!ts_val_ok(y), "mul [2,3] x [4] must fail");
    CHECK(ts_graph_status(g) == TS_ERR_SHAPE, "shape error status");
    CHECK(HAS(ts_graph_error(g), "mul") && HAS(ts_graph_error(g), "x=f32[2,3]") &&
              HAS(ts_graph_error(g), "w=f32[4]"),
          "message: %s", ts_graph_error(g));
    ts_val z = ts_relu(g, y); /* sticky: quiet TS_NONE */
    CHECK(!ts_val_ok(z), "later calls return TS_NONE");
    ts_plan *p = NULL;
    CHECK(ts_compile(g, NULL, NULL, &p) == TS_ERR_SHAPE && !p, "compile refuses a failed graph");
    CHECK(HAS(ts_last_error(), "mul"), "compile repeats the first error: %s", ts_last_error());
    ts_graph_free(g);

    /* Bad attributes. */
    g = ts_graph_new();
    x = ts_input(g, "x", TS_F32, 2, d23);
    int bad_axis[1] = {5};
    CHECK(!ts_val_ok(ts_sum(g, x, 1, bad_axis, 0)), "sum over axis 5 of rank 2");
    CHECK(HAS(ts_graph_error(g), "axis 5"), "message: %s", ts_graph_error(g));
    ts_graph_free(g);
    g = ts_graph_new();
    x = ts_input(g, "x", TS_F32, 2, d23);
    int64_t r[2] = {4, 2};
    CHECK(!ts_val_ok(ts_reshape(g, x, 2, r)), "reshape 6 elements into 8");
    CHECK(HAS(ts_graph_error(g), "reshape"), "message: %s", ts_graph_error(g));
    ts_graph_free(g);
    g = ts_graph_new();
    CHECK(!ts_val_ok(ts_input(g, "x", TS_F32, 1, (int64_t[]){0})), "zero-size dimension");
    CHECK(!ts_val_ok(ts_input(g, NULL, TS_F32, 1, d3)), "unnamed input");
    ts_graph_free(g);
    g = ts_graph_new();
    ts_input(g, "x", TS_F32, 1, d3);
    CHECK(!ts_val_ok(ts_input(g, "x", TS_F32, 1, d3)), "duplicate name");
    CHECK(HAS(ts_graph_error(g), "'x'"), "message: %s", ts_graph_error(g));
    ts_graph_free(g);

    /* A non-scalar loss. */
    g = ts_graph_new();
    x = ts_input(g, "x", TS_F32, 2, d23);
    w = ts_param(g, "w", TS_F32, 1, d3, ts_init_ones());
    y = ts_mul(g, x, w);
    ts_set_name(g, y, "scores");
    ts_train_spec spec = ts_train_spec_default(y);
    CHECK(ts_compile(g, &spec, NULL, &p) == TS_ERR_SHAPE, "non-scalar loss");
    CHECK(HAS(ts_last_error(), "scores") && HAS(ts_last_error(), "f32[2,3]"), "message: %s",
          ts_last_error());

    /* A parameter that cannot reach the loss: a warning naming it. */
    ts_val unused = ts_param(g, "orphan", TS_F32, 1, d3, ts_init_ones());
    (void)unused;
    ts_val loss = ts_sum(g, y, 0, NULL, 0);
    spec = ts_train_spec_default(loss);
    ts_set_log_callback(capture, NULL);
    CHECK_OK(ts_compile(g, &spec, NULL, &p));
    ts_set_log_callback(NULL, NULL);
    CHECK(HAS(warnings, "orphan") && HAS(warnings, "does not reach the loss"), "warning: %s",
          warnings);
    /* Wrong sizes and names at run time. */
    float buf[6] = {0};
    CHECK(ts_plan_set_input(p, "x", buf, 5 * sizeof(float)) == TS_ERR_INVALID, "short input");
    CHECK(HAS(ts_last_error(), "'x'") && HAS(ts_last_error(), "24"), "message: %s",
          ts_last_error());
    CHECK(ts_plan_set_input(p, "nope", buf, sizeof buf) == TS_ERR_NOT_FOUND, "unknown input");
    CHECK(ts_plan_read(p, "grad:orphan", buf, 12) == TS_ERR_NOT_FOUND, "no grad for orphan");
    CHECK(ts_plan_write_param(p, "x", buf, sizeof buf) == TS_ERR_INVALID, "x is not a param");
    ts_plan_free(p);
    ts_graph_free(g);

    /* A NaN produced in a step, reported by the first value holding it. */
    g = ts_graph_new();
    x = ts_input(g, "x", TS_F32, 1, d3);
    w = ts_param(g, "w", TS_F32, 1, d3, ts_init_ones());
    ts_val lg = ts_log(g, ts_mul(g, x, w));
    ts_set_name(g, lg, "log_xw");
    loss = ts_sum(g, ts_mul(g, lg, lg), 0, NULL, 0);
    spec = ts_train_spec_default(loss);
    ts_compile_options opt = ts_compile_options_default();
    opt.debug_nan = 1;
    CHECK_OK(ts_compile(g, &spec, &opt, &p));
    float xv[3] = {1, -2, 3};
    ts_plan_set_input(p, "x", xv, sizeof xv);
    CHECK(ts_plan_step(p) == TS_ERR_NUMERIC, "NaN detected");
    CHECK(HAS(ts_last_error(), "log_xw") && HAS(ts_last_error(), "element 1"), "message: %s",
          ts_last_error());
    float wv[3];
    ts_plan_read(p, "w", wv, sizeof wv);
    CHECK(wv[0] == 1 && wv[1] == 1 && wv[2] == 1, "the failed step did not update weights");
    CHECK(ts_plan_step_count(p) == 0, "a failed step is not counted");
    ts_plan_free(p);
    ts_graph_free(g);
    CHECK(ts_compile(NULL, NULL, NULL, &p) == TS_ERR_INVALID, "NULL graph");
    return check_summary("errors");
}
