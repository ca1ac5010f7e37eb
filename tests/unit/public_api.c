/* The public headers alone (tessel/tessel.h, nothing from src/) are what
 * the tessel tools build on: a config loaded with overrides, written back,
 * the configured model built as `tessel compile` builds it (a gcn reads its
 * graph first), a short session, and the helpers of tessel/util.h and
 * tessel/data.h. */
#include <stdlib.h>
#include <string.h>
#include "check.h"

static ts_status load(ts_config *c, const char *text, const char *set) {
    ts_config_init(c);
    ts_status s = ts_config_load_string(c, text, strlen(text), "test.yaml");
    if (s == TS_OK && set) s = ts_config_set(c, set);
    if (s == TS_OK) s = ts_config_finish(c);
    return s;
}

static void test_config_and_build(void) {
    ts_config c;
    CHECK_OK(load(&c, "model:\n  preset: w1\ntrain:\n  steps: 3\n", "train.lr=3e-4"));
    CHECK(c.train.lr == 3e-4 && c.train.steps == 3, "--set applied: lr %g", c.train.lr);
    char *text = NULL;
    size_t n = 0;
    FILE *f = open_memstream(&text, &n);
    CHECK_OK(ts_config_write(&c, f));
    fclose(f);
    ts_config back;
    CHECK_OK(load(&back, text, NULL));
    CHECK(back.train.lr == c.train.lr && back.model.batch == c.model.batch,
          "the written config loads back");
    free(text);
    CHECK(load(&c, "model:\n  preset: w1\ntrain:\n  lrr: 1\n", NULL) != TS_OK &&
              strstr(ts_last_error(), "test.yaml:4:3"),
          "an unknown key names file, line and column: %s", ts_last_error());

    /* an mlp: the same graph as ts_config_build */
    CHECK_OK(load(&c, "model:\n  preset: w1\n", NULL));
    ts_graph *g = NULL;
    ts_model m;
    ts_train_spec spec;
    ts_compile_options opt;
    CHECK_OK(ts_session_build_model(&c, &g, &m, &spec, &opt));
    CHECK(g && ts_numel(g, m.input) == c.model.batch * c.model.window * c.model.features,
          "the mlp's input holds a batch of windows");
    ts_graph_free(g);

    /* a gcn is built on its graph: the data is read first */
    CHECK_OK(load(&c,
                  "model:\n  name: gcn\n  preset: w5\n  hidden: 16\ndata:\n  source: graph\n"
                  "  edges: examples/data/tiny_graph/edges.csv\n"
                  "  x: examples/data/tiny_graph/x.npy\n  y: examples/data/tiny_graph/y.npy\n",
                  NULL));
    g = NULL;
    CHECK_OK(ts_session_build_model(&c, &g, &m, &spec, &opt));
    ts_plan *p = NULL;
    if (g) CHECK_OK(ts_compile(g, &spec, &opt, &p));
    ts_plan_free(p);
    ts_graph_free(g);
}

static void test_session(void) {
    ts_config c;
    CHECK_OK(load(&c, "model:\n  preset: w1\n  batch: 8\ntrain:\n  steps: 2\n", NULL));
    ts_session_options o = ts_session_options_default();
    o.progress = TS_PROGRESS_NONE;
    ts_session_result r;
    CHECK_OK(ts_session_run_dist(&c, &o, &r));
    CHECK(r.steps == 2 && !r.run_dir[0] && isfinite(r.final_loss),
          "a session without a run "
          "directory: %lld steps",
          (long long)r.steps);
}

static void test_helpers(void) {
    double a[4], b[4];
    ts_rand_normal_f64(a, 4, ts_hash64("k", 1, 0), 0.0, 1.0);
    ts_rand_normal_f64(b, 4, ts_hash64("k", 1, 0), 0.0, 1.0);
    CHECK(!memcmp(a, b, sizeof a), "the same key draws the same numbers");
    float x[2 * 4 * 3], y[2];
    CHECK_OK(ts_synth_regression(1, 0, 2, 4, 3, 1, x, y));
    void *buf0 = ts_zalloc(16, "a test buffer");
    CHECK(buf0 && !((char *)buf0)[15], "ts_zalloc");
    free(buf0);
    CHECK(ts_now() > 0, "ts_now");
    CHECK(ts_fail(TS_ERR_IO, "x %d", 1) == TS_ERR_IO && !strcmp(ts_last_error(), "x 1"), "ts_fail");
    ts_error_prefix("ctx");
    CHECK(!strcmp(ts_last_error(), "ctx: x 1"), "ts_error_prefix: %s", ts_last_error());
    char buf[8];
    size_t len = 0;
    ts_catf(buf, sizeof buf, &len, "%s", "0123456789");
    CHECK(len == 7 && !strcmp(buf, "0123456"), "ts_catf truncates quietly");
    double odd[] = {3, 1, 2}, even[] = {4, 1, 3, 2}, one[] = {5};
    CHECK(ts_median(odd, 3) == 2 && odd[0] == 1 && odd[2] == 3, "ts_median of 3 sorts them");
    CHECK(ts_median(even, 4) == 2.5, "ts_median of 4 is the mean of the middle two");
    CHECK(ts_median(one, 1) == 5 && ts_median(one, 0) == 0, "ts_median of 1 and of none");
}

int main(void) {
    test_config_and_build();
    test_session();
    test_helpers();
    return check_summary("public_api");
}
