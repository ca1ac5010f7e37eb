/* The tcn model (src/models/tcn.c): its keys and their checks, the
 * resolved config, and training on small CSV files of a time series, as a
 * regression and as a classifier, where the loss must drop. */
#include "check.h"
#include "tessel/config.h"
#include "tessel/session.h"
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "testfiles.h"

static char tmp[64];

static const char *path_in(const char *name) {
    return tf_path(tmp, name);
}

/* Loads and finishes yaml; returns the status, with the message in err. */
static ts_status load(ts_config *c, const char *yaml, char *err, size_t n) {
    ts_config_init(c);
    ts_status s = ts_config_load_string(c, yaml, strlen(yaml), "t.yaml");
    if (s == TS_OK) s = ts_config_finish(c);
    snprintf(err, n, "%s", s == TS_OK ? "" : ts_last_error());
    return s;
}

static void bad(const char *what, const char *yaml, const char *want) {
    ts_config c;
    char err[1024];
    ts_status s = load(&c, yaml, err, sizeof err);
    CHECK(s == TS_ERR_INVALID && strstr(err, want), "%s: '%s' should contain '%s'", what, err,
          want);
}

static void test_keys(void) {
    ts_config c;
    char err[1024];
    /* model.name tcn implies its preset, whose keys are the model's. */
    CHECK_OK(load(&c, "model: {name: tcn}\n", err, sizeof err));
    CHECK(c.model.batch == 32 && c.model.window == 16 && c.model.features == 8 &&
              c.model.c1 == 32 && c.model.c2 == 32 && c.model.classes == 0 && c.model.out_dim == 1,
          "tcn preset: batch %lld window %lld features %lld c1 %lld c2 %lld "
          "classes %lld",
          (long long)c.model.batch, (long long)c.model.window, (long long)c.model.features,
          (long long)c.model.c1, (long long)c.model.c2, (long long)c.model.classes);
    CHECK_OK(load(&c, "model: {preset: tcn, window: 6, c1: 4}\n", err, sizeof err));
    CHECK(!strcmp(ts_config_model_word(c.model.name), "tcn") && c.model.window == 6 &&
              c.model.c1 == 4,
          "preset tcn names the model");
    /* The resolved config holds the tcn's keys and no other model's. */
    char buf[4096] = "";
    FILE *f = fmemopen(buf, sizeof buf - 1, "w");
    CHECK(f != NULL, "fmemopen");
    if (f) {
        CHECK_OK(ts_config_write(&c, f));
        fclose(f);
    }
    CHECK(strstr(buf, "  name: tcn\n") && strstr(buf, "  window: 6\n") &&
              strstr(buf, "  c2: 32\n") && strstr(buf, "  out_dim: 1\n") &&
              !strstr(buf, "hidden") && !strstr(buf, "n_layers") && !strstr(buf, "preset"),
          "written config:\n%s", buf);
    ts_config back;
    CHECK_OK(load(&back, buf, err, sizeof err));
    CHECK(back.model.name == c.model.name && back.model.window == 6 && back.model.c1 == 4,
          "the written config loads back");

    bad("another model's key", "model: {name: tcn, n_layers: 2}\n",
        "t.yaml:1:20: model.n_layers is not a key of tcn models");
    bad("window 1", "model: {name: tcn, window: 1}\n", "a tcn needs model.window >= 2");
    bad("classes 1", "model: {name: tcn, classes: 1}\n",
        "a tcn needs model.classes >= 2 (a classifier) or 0 (a regression), got "
        "1");
    bad("synthetic classes", "model: {name: tcn, classes: 3}\n",
        "synthetic tcn data is a regression");
    bad("out_dim of a classifier",
        "model: {name: tcn, classes: 3, out_dim: 2}\n"
        "data: {source: csv, path: x.csv, label: y}\n",
        "model.out_dim is the width of a regression");
    bad("tokens", "model: {name: tcn}\ndata: {source: tokens, path: t.u16}\n",
        "data.source tokens cannot feed a tcn model (it reads synthetic, csv or "
        "npy sequences)");
    bad("preset of another model", "model: {name: tcn, preset: w2}\n",
        "model.preset w2 is a gru preset, but model.name is tcn");
}

/* A series of two features; `label` is, at row t + 1, a function of the
 * features up to row t, so a window ending at t predicts it (horizon 1). */
static void write_series(const char *path, int classify) {
    FILE *f = fopen(path, "w");
    CHECK(f != NULL, "write %s", path);
    if (!f) return;
    fprintf(f, "t,a,b,label\n");
    double a_prev = 0, b_prev = 0;
    for (int t = 0; t < 400; t++) {
        const double a = sin(t * 0.37) + 0.3 * sin(t * 1.3), b = cos(t * 0.21);
        if (classify)
            fprintf(f, "%d,%.5f,%.5f,%d\n", t, a, b, a_prev + 0.5 * b_prev > 0);
        else
            fprintf(f, "%d,%.5f,%.5f,%.5f\n", t, a, b, 2.0 * a_prev - b_prev);
        a_prev = a, b_prev = b;
    }
    fclose(f);
}

static void train(const char *what, const char *yaml, ts_session_result *r) {
    ts_config c;
    char err[1024];
    if (load(&c, yaml, err, sizeof err) != TS_OK) {
        CHECK(0, "%s: config: %s", what, err);
        return;
    }
    ts_session_options o = ts_session_options_default();
    o.progress = TS_PROGRESS_NONE;
    ts_status s = ts_session_run(&c, &o, r);
    CHECK(s == TS_OK, "%s: %s", what, s == TS_OK ? "" : ts_last_error());
}

static void test_train_csv(void) {
    char yaml[1024];
    ts_session_result r;

    write_series(path_in("reg.csv"), 0);
    snprintf(yaml, sizeof yaml,
             "model: {name: tcn, batch: 16, c1: 16, c2: 16}\n"
             "data: {source: csv, path: %s, label: label, features: [a, b], "
             "window: 8}\n"
             "train: {steps: 120, lr: 0.01, threads: 1, seed: 5}\n",
             path_in("reg.csv"));
    train("regression", yaml, &r);
    CHECK(r.steps == 120 && r.final_loss < 0.25 * r.first_loss,
          "regression: the loss drops to a quarter: %g -> %g", r.first_loss, r.final_loss);
    CHECK(!isnan(r.val.mse) && isnan(r.val.accuracy), "regression evaluates mse: %g", r.val.mse);

    write_series(path_in("cls.csv"), 1);
    snprintf(yaml, sizeof yaml,
             "model: {name: tcn, batch: 16, c1: 16, c2: 16, classes: 2}\n"
             "data: {source: csv, path: %s, label: label, features: [a, b], "
             "window: 8}\n"
             "train: {steps: 120, lr: 0.01, threads: 1, seed: 5}\n",
             path_in("cls.csv"));
    train("classifier", yaml, &r);
    CHECK(r.steps == 120 && r.final_loss < 0.6 * r.first_loss,
          "classifier: the loss drops: %g -> %g", r.first_loss, r.final_loss);
    CHECK(r.val.accuracy > 0.8, "classifier: validation accuracy %g", r.val.accuracy);
}

int main(void) {
    snprintf(tmp, sizeof tmp, "/tmp/tessel-tcn-XXXXXX");
    CHECK(mkdtemp(tmp) != NULL, "temporary directory");
    test_keys();
    test_train_csv();
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmp);
    if (!check_failed && system(cmd) != 0) fprintf(stderr, "could not remove %s\n", tmp);
    return check_summary("model_tcn");
}
