/* The onnx model (src/models/onnx.c): model.onnx relative to the config
 * file and made absolute in the resolved config, the keys' checks (no file,
 * an unknown loss, a refused op, another model's key, a source other than
 * npy, data of the wrong width), and training the imported MLP and CNN of
 * tests/parity/fixtures/onnx on npy arrays, where the loss must fall. Exits
 * 77 in a build without ONNX support. */
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "check.h"
#include "testfiles.h"
#include "tessel/config.h"
#include "tessel/session.h"

static char tmp[64];

static const char *path_in(const char *name) {
    return tf_path(tmp, name);
}

static void write_text(const char *path, const char *text) {
    FILE *f = fopen(path, "w");
    CHECK(f != NULL, "write %s", path);
    if (!f) return;
    fputs(text, f);
    fclose(f);
}

/* Loads and finishes the config file `name` in tmp holding yaml. */
static ts_status load(ts_config *c, const char *name, const char *yaml, char *err, size_t n) {
    write_text(path_in(name), yaml);
    ts_config_init(c);
    ts_status s = ts_config_load_file(c, path_in(name));
    if (s == TS_OK) s = ts_config_finish(c);
    snprintf(err, n, "%s", s == TS_OK ? "" : ts_last_error());
    return s;
}

static void bad(const char *what, const char *yaml, const char *want) {
    ts_config c;
    char err[1024];
    ts_status s = load(&c, "bad.yaml", yaml, err, sizeof err);
    CHECK(s != TS_OK && strstr(err, want), "%s: '%s' should contain '%s'", what, err, want);
}

/* x [n, 12] or [n, 1, 8, 8] with 3 classes drawn from the input's signs. */
static void write_data(const char *xn, const char *yn, int n, int cnn) {
    float *x = malloc(sizeof(float) * (size_t)n * 64);
    int64_t *y = malloc(sizeof(int64_t) * (size_t)n);
    CHECK(x && y, "memory");
    if (!x || !y) return;
    const int per = cnn ? 64 : 12;
    unsigned r = 12345;
    for (int i = 0; i < n; i++) {
        double s = 0;
        for (int k = 0; k < per; k++) {
            r = r * 1103515245u + 12345u;
            x[i * per + k] = (float)(((r >> 8) & 0xffff) / 32768.0 - 1.0);
            s += k < per / 2 ? x[i * per + k] : 0;
        }
        y[i] = s > 0.5 ? 2 : s > -0.5 ? 1 : 0;
    }
    const int64_t xd[4] = {n, cnn ? 1 : 12, 8, 8}, yd[1] = {n};
    tf_write_npy_dims(path_in(xn), "<f4", cnn ? 4 : 2, xd, x, 4);
    tf_write_npy_dims(path_in(yn), "<i8", 1, yd, y, 8);
    free(x);
    free(y);
}

static void test_keys(void) {
    ts_config c;
    char err[1024], yaml[1024], want[PATH_MAX + 16];
    snprintf(yaml, sizeof yaml,
             "cp tests/parity/fixtures/onnx/mlp.onnx tests/parity/fixtures/onnx/cnn.onnx "
             "tests/parity/fixtures/onnx/unsupported_op.onnx %s",
             tmp);
    CHECK(system(yaml) == 0, "copy the fixtures");
    /* The path is relative to the config file, not to the working directory. */
    CHECK_OK(load(&c, "keys.yaml",
                  "model: {name: onnx, onnx: mlp.onnx, batch: 8}\n"
                  "data: {source: npy, x: x.npy, y: y.npy}\n",
                  err, sizeof err));
    char real[PATH_MAX];
    CHECK(realpath(path_in("mlp.onnx"), real) != NULL, "realpath");
    CHECK(!strcmp(c.model.onnx, real), "model.onnx resolved to %s, want %s", c.model.onnx, real);
    CHECK(c.model.classes == 3 && !strcmp(c.model.loss, "cross_entropy"),
          "classes %lld from the model's output, loss %s", (long long)c.model.classes,
          c.model.loss);
    char buf[4096] = "";
    FILE *f = fmemopen(buf, sizeof buf - 1, "w");
    CHECK(f != NULL, "fmemopen");
    if (f) {
        CHECK_OK(ts_config_write(&c, f));
        fclose(f);
    }
    snprintf(want, sizeof want, "  onnx: \"%s\"\n", real);
    CHECK(strstr(buf, "  name: onnx\n") && strstr(buf, want) &&
              strstr(buf, "  loss: \"cross_entropy\"\n") && !strstr(buf, "hidden") &&
              !strstr(buf, "classes"),
          "written config:\n%s", buf);
    /* It loads back from another directory: the path is absolute. */
    ts_config back;
    ts_config_init(&back);
    CHECK_OK(ts_config_load_string(&back, buf, strlen(buf), "elsewhere/t.yaml"));
    CHECK_OK(ts_config_finish(&back));
    CHECK(!strcmp(back.model.onnx, real), "loaded back: %s", back.model.onnx);

    bad("no file", "model: {name: onnx}\ndata: {source: npy, x: x.npy, y: y.npy}\n",
        "an onnx model needs model.onnx");
    bad("absent file", "model: {name: onnx, onnx: absent.onnx}\ndata: {source: npy, x: x, y: y}\n",
        "bad.yaml:1:21: cannot open the ONNX file");
    bad("loss",
        "model: {name: onnx, onnx: mlp.onnx, loss: hinge}\ndata: {source: npy, x: x, y: y}\n",
        "model.loss must be cross_entropy or mse, got 'hinge'");
    bad("refused op",
        "model: {name: onnx, onnx: unsupported_op.onnx}\ndata: {source: npy, x: x, y: y}\n",
        "node 'act' (Hardmax, opset 17): op type 'Hardmax' is not supported");
    bad("another model's key", "model: {name: onnx, onnx: mlp.onnx, hidden: 4}\n",
        "model.hidden is not a key of onnx models");
    bad("synthetic", "model: {name: onnx, onnx: mlp.onnx}\n", "an onnx model reads npy arrays");
}

static ts_status train(const char *what, const char *yaml, ts_session_result *r) {
    ts_config c;
    char err[1024];
    memset(r, 0, sizeof *r);
    ts_status s = load(&c, "train.yaml", yaml, err, sizeof err);
    if (s != TS_OK) return s;
    ts_session_options o = ts_session_options_default();
    o.progress = TS_PROGRESS_NONE;
    s = ts_session_run(&c, &o, r);
    if (s != TS_OK) printf("%s: %s\n", what, ts_last_error());
    return s;
}

static void test_train(void) {
    char yaml[1024];
    ts_session_result r;
    write_data("x.npy", "y.npy", 256, 0);
    write_data("xc.npy", "yc.npy", 128, 1);
    snprintf(yaml, sizeof yaml,
             "model: {name: onnx, onnx: mlp.onnx, batch: 16}\n"
             "data: {source: npy, x: %s, y: %s}\n"
             "train: {steps: 150, lr: 0.01, threads: 1, seed: 3}\n",
             path_in("x.npy"), path_in("y.npy"));
    ts_status s = train("mlp", yaml, &r);
    CHECK(s == TS_OK, "mlp: %s", ts_last_error());
    CHECK(s == TS_OK && r.steps == 150 && r.final_loss < 0.6 * r.first_loss,
          "mlp: the loss falls: %g -> %g", r.first_loss, r.final_loss);
    printf("mlp: loss %.4f -> %.4f, validation accuracy %.3f\n", r.first_loss, r.final_loss,
           r.val.accuracy);
    snprintf(yaml, sizeof yaml,
             "model: {name: onnx, onnx: cnn.onnx, batch: 8}\n"
             "data: {source: npy, x: %s, y: %s}\n"
             "train: {steps: 120, lr: 0.01, threads: 1, seed: 3}\n",
             path_in("xc.npy"), path_in("yc.npy"));
    s = train("cnn", yaml, &r);
    CHECK(s == TS_OK, "cnn: %s", ts_last_error());
    CHECK(s == TS_OK && r.steps == 120 && r.final_loss < 0.8 * r.first_loss,
          "cnn: the loss falls: %g -> %g", r.first_loss, r.final_loss);
    printf("cnn: loss %.4f -> %.4f\n", r.first_loss, r.final_loss);
    /* The MLP's 12 inputs fed the CNN's 8x8 examples. */
    snprintf(yaml, sizeof yaml,
             "model: {name: onnx, onnx: mlp.onnx, batch: 8}\n"
             "data: {source: npy, x: %s, y: %s}\ntrain: {steps: 1}\n",
             path_in("xc.npy"), path_in("yc.npy"));
    s = train("width", yaml, &r);
    CHECK(s == TS_ERR_SHAPE && strstr(ts_last_error(), "the data's examples have 64 values, but "
                                                       "the input of"),
          "data of the wrong width: %s", ts_last_error());
}

int main(void) {
#ifndef TESSEL_HAVE_ONNX
    puts("model_onnx: built without ONNX support, skipped");
    return 77;
#endif
    snprintf(tmp, sizeof tmp, "/tmp/tessel-onnx-XXXXXX");
    CHECK(mkdtemp(tmp) != NULL, "temporary directory");
    test_keys();
    test_train();
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmp);
    if (!check_failed && system(cmd) != 0) fprintf(stderr, "could not remove %s\n", tmp);
    return check_summary("model_onnx");
}
