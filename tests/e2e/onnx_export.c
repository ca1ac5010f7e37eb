/* `tessel export CKPT --onnx FILE` (tools/onnx_export.c, src/frontend/onnx/
 * export*.c) on runs trained here: a zoo MLP (reshape, layer norm), an
 * imported ONNX MLP and a channels-last CNN (conv, batch norm, pooling).
 * Round trip: each exported file imported again with ts_onnx_import gives
 * the trained weights bit for bit and the outputs of tessel's own forward
 * (an inference plan of the run's model with the checkpoint's values)
 * within fp32 tolerance, at the trained batch size and at another one (the
 * batch is dynamic). When Debian's python3-onnx is installed, onnx.checker
 * (full_check) passes on every exported file, the lineage entries match
 * the checkpoint's manifest, and each file evaluated with NumPy from the
 * ONNX specification (onnx_eval.py) gives tessel's forward. A LoRA run's
 * adapters, outside the forward graph, make the export fail. Refusals: a run without its
 * config.yaml; usage. The GPT, GRU, LSTM, U-Net and the refused GCN are in
 * e2e/onnx_export_zoo.c. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include "check.h"
#include "e2e.h"
#include "tessel/onnx.h"
#include "tessel/tessel.h"
#include "testfiles.h"

static int have_onnx_py;

/* Writes text to DIR/name and returns the path. */
static const char *write_file(const char *name, const char *text) {
    const char *p = e2e_path(name);
    FILE *f = fopen(p, "w");
    CHECK(f != NULL, "create %s", p);
    if (f) fputs(text, f), fclose(f);
    return p;
}

static void train(const char *cfg, const char *run) {
    e2e_result r = e2e_runf("train %s --out %s", cfg, run);
    CHECK(r.rc == 0, "train %s: exit %d: %s", cfg, r.rc, r.err);
    e2e_done(&r);
}

/* The run's model forward on x: the inference plan of RUN/config.yaml's
 * model with every value of the checkpoint written in; fills y. */
static void ref_forward(const char *run, const char *out, const float *x, size_t xb, float *y,
                        size_t yb) {
    char path[600];
    snprintf(path, sizeof path, "%s/config.yaml", run);
    ts_config c;
    ts_config_init(&c);
    CHECK_OK(ts_config_load_file(&c, path));
    CHECK_OK(ts_config_finish(&c));
    ts_graph *g = NULL;
    ts_model m;
    ts_train_spec spec;
    ts_compile_options opt;
    CHECK_OK(ts_session_build_model(&c, &g, &m, &spec, &opt));
    ts_train_spec inf = ts_train_spec_default(TS_NONE);
    ts_plan *p = NULL;
    if (g) CHECK_OK(ts_compile(g, &inf, NULL, &p));
    ts_ckpt *ck = NULL;
    CHECK_OK(ts_ckpt_open(run, NULL, NULL, &ck));
    int written = 0;
    for (int i = 0; p && ck && i < ts_ckpt_tensor_count(ck); i++) {
        ts_ckpt_tensor t;
        CHECK_OK(ts_ckpt_tensor_info(ck, i, &t));
        void *buf = malloc(t.bytes);
        CHECK_OK(ts_ckpt_read(ck, t.name, buf, t.bytes));
        written += ts_plan_write_param(p, t.name, buf, t.bytes) == TS_OK;
        free(buf);
    }
    CHECK(written > 0, "%s: no checkpoint value fits the model", run);
    if (p) {
        CHECK_OK(ts_plan_set_input(p, "x", x, xb));
        CHECK_OK(ts_plan_step(p));
        CHECK_OK(ts_plan_read(p, out, y, yb));
    }
    ts_ckpt_close(ck);
    ts_plan_free(p);
    ts_graph_free(g);
}

/* The exported file imported at `batch`: its weights are the checkpoint's
 * bit for bit; fills y with its output on x. */
static void import_forward(const char *file, const char *run, int64_t batch, const float *x,
                           size_t xb, float *y, size_t yb) {
    ts_graph *g = ts_graph_new();
    ts_onnx_info info;
    ts_onnx_options o = {.batch = batch};
    CHECK_OK(ts_onnx_import(g, file, &o, &info));
    ts_train_spec inf = ts_train_spec_default(TS_NONE);
    ts_plan *p = NULL;
    CHECK_OK(ts_compile(g, &inf, NULL, &p));
    ts_ckpt *ck = NULL;
    CHECK_OK(ts_ckpt_open(run, NULL, NULL, &ck));
    for (int i = 0; p && ck && i < ts_plan_param_count(p); i++) {
        const char *name = ts_plan_param_name(p, i);
        ts_dtype dt;
        int rank;
        int64_t dims[8];
        CHECK_OK(ts_plan_value_info(p, name, &dt, &rank, dims));
        size_t bytes = 4;
        for (int k = 0; k < rank; k++) bytes *= (size_t)dims[k];
        float *a = malloc(bytes), *b = malloc(bytes);
        CHECK_OK(ts_plan_read(p, name, a, bytes));
        CHECK_OK(ts_ckpt_read(ck, name, b, bytes));
        CHECK(!memcmp(a, b, bytes), "%s: initialiser %s differs from the checkpoint", file, name);
        free(a), free(b);
    }
    if (p) {
        CHECK_OK(ts_plan_set_input(p, info.input_names[0], x, xb));
        CHECK_OK(ts_plan_step(p));
        CHECK_OK(ts_plan_read(p, info.output_names[0], y, yb));
    }
    ts_ckpt_close(ck);
    ts_plan_free(p);
    ts_graph_free(g);
}

static double max_diff(const float *a, const float *b, size_t n, double *scale) {
    double worst = 0;
    *scale = 1;
    for (size_t i = 0; i < n; i++) {
        worst = fmax(worst, fabs((double)a[i] - b[i]));
        *scale = fmax(*scale, fabs((double)b[i]));
    }
    return worst;
}

/* onnx.checker (full_check) and the lineage entries, with python3-onnx. */
static void py_check(const char *file, int opset) {
    if (!have_onnx_py) return;
    char cmd[2048];
    snprintf(cmd, sizeof cmd,
             "/usr/bin/python3 -c \"import onnx, hashlib, os, sys\n"
             "m = onnx.load(sys.argv[1]); onnx.checker.check_model(m, full_check=True)\n"
             "p = {e.key: e.value for e in m.metadata_props}\n"
             "h = hashlib.sha256(open(os.path.join(p['tessel.checkpoint'], 'manifest.json'), "
             "'rb').read()).hexdigest()\n"
             "assert p['tessel.manifest_sha256'] == h, 'manifest hash'\n"
             "assert m.opset_import[0].version == int(sys.argv[2]), 'opset'\n"
             "assert all(i.type.tensor_type.shape.dim[0].dim_param == 'batch' for i in "
             "m.graph.input), 'dynamic batch'\n"
             "print('onnx.checker: ok', sys.argv[1])\" %s %d",
             file, opset);
    CHECK(system(cmd) == 0, "onnx.checker or lineage failed on %s", file);
}

/* tests/e2e/onnx_eval.py: the file evaluated with NumPy from the ONNX
 * specification equals tessel's forward (with python3-onnx). x has shape
 * dims (the trained batch first); the output has out_n values. */
static void numpy_eval(const char *file, const char *run, const char *out, int rank,
                       const int64_t *dims, size_t out_n) {
    if (!have_onnx_py) return;
    size_t xn = 1;
    for (int k = 0; k < rank; k++) xn *= (size_t)dims[k];
    float *x = malloc(xn * 4), *want = calloc(out_n, 4);
    for (size_t i = 0; i < xn; i++) x[i] = (float)cos(0.23 * (double)i + 0.3);
    ref_forward(run, out, x, xn * 4, want, out_n * 4);
    const int64_t od[2] = {dims[0], (int64_t)out_n / dims[0]};
    tf_write_npy_dims(e2e_path("eval_x.npy"), "<f4", rank, dims, x, 4);
    tf_write_npy_dims(e2e_path("eval_want.npy"), "<f4", 2, od, want, 4);
    char cmd[1024];
    snprintf(cmd, sizeof cmd, "/usr/bin/python3 tests/e2e/onnx_eval.py %s %s %s", file,
             e2e_path("eval_x.npy"), e2e_path("eval_want.npy"));
    CHECK(system(cmd) == 0, "%s: the NumPy evaluation differs from tessel's forward", file);
    /* With TESSEL_ORT_PYTHON (a python with onnxruntime; never needed),
     * ONNX Runtime on the same input (examples/onnx/ort_run.py). */
    const char *ort = getenv("TESSEL_ORT_PYTHON");
    if (ort && *ort) {
        char run_ort[1200];
        snprintf(run_ort, sizeof run_ort, "%s examples/onnx/ort_run.py %s %s %s", ort, file,
                 e2e_path("eval_x.npy"), e2e_path("eval_want.npy"));
        CHECK(system(run_ort) == 0, "%s: ONNX Runtime differs from tessel's forward", file);
    }
    free(x), free(want);
}

/* Exports RUN, round-trips it at the trained batch and at batch 3. */
static void round_trip(const char *what, const char *run, const char *file, const char *out,
                       int64_t batch, int64_t in_per_row, int64_t out_per_row) {
    e2e_result r = e2e_runf("export %s --onnx %s", run, file);
    CHECK(r.rc == 0 && strstr(r.out, "ONNX opset 18") && strstr(r.out, "manifest sha256"),
          "%s: export exit %d: %s%s", what, r.rc, r.out, r.err);
    printf("%s", r.out);
    e2e_done(&r);
    const size_t xn = (size_t)(batch * in_per_row), yn = (size_t)(batch * out_per_row);
    float *x = malloc(xn * 4), *want = malloc(yn * 4), *got = calloc(yn, 4);
    for (size_t i = 0; i < xn; i++) x[i] = (float)sin(0.37 * (double)i + 0.1);
    ref_forward(run, out, x, xn * 4, want, yn * 4);
    import_forward(file, run, batch, x, xn * 4, got, yn * 4);
    double scale, d = max_diff(got, want, yn, &scale);
    CHECK(d <= 1e-5 * scale, "%s: imported export differs from tessel's forward by %.3g", what, d);
    printf("%s: round trip max |diff| %.3g over %zu outputs (batch %lld)\n", what, d, yn,
           (long long)batch);
    /* The batch is dynamic: 3 rows give the first 3 rows of the output. */
    memset(got, 0, yn * 4);
    import_forward(file, run, 3, x, (size_t)(3 * in_per_row) * 4, got,
                   (size_t)(3 * out_per_row) * 4);
    d = max_diff(got, want, (size_t)(3 * out_per_row), &scale);
    CHECK(d <= 1e-5 * scale, "%s: at batch 3 the export differs by %.3g", what, d);
    free(x), free(want), free(got);
    py_check(file, 18);
}

int main(void) {
#ifndef TESSEL_HAVE_ONNX
    puts("e2e onnx_export: built without ONNX support, skipped");
    return 77;
#endif
    char dir[64];
    if (!e2e_setup("onnxexp", dir, sizeof dir)) return check_summary("e2e onnx_export");
    have_onnx_py = system("/usr/bin/python3 -c 'import onnx' >/dev/null 2>&1") == 0;
    if (!have_onnx_py)
        puts("python3-onnx is not installed: onnx.checker is not run on the exported files "
             "(apt-get install python3-onnx)");

    /* A zoo MLP: x [8, 4, 3] flattened inside, two hidden layers with
     * LayerNorm, a regression head pred [8, 2]. */
    char cfg[8192];
    snprintf(cfg, sizeof cfg,
             "model: {name: mlp, window: 4, features: 3, hidden: 16, n_hidden: 2, layer_norm: "
             "true, out_dim: 2, batch: 8}\n"
             "data: {source: synthetic}\n"
             "train: {steps: 10, optimizer: adam, lr: 0.01, seed: 1}\n"
             "ckpt: {every: 10}\n");
    train(write_file("mlp.yaml", cfg), e2e_path("run-mlp"));
    round_trip("zoo mlp", e2e_path("run-mlp"), e2e_path("mlp.onnx"), "pred", 8, 12, 2);
    numpy_eval(e2e_path("mlp.onnx"), e2e_path("run-mlp"), "pred", 3, (const int64_t[]){8, 4, 3},
               16);

    /* An imported ONNX model (the parity MLP), trained and exported back. */
    char abs_model[4096];
    CHECK(realpath("examples/onnx/mlp.onnx", abs_model) != NULL, "examples/onnx/mlp.onnx");
    float xs[64 * 12];
    int64_t ys[64];
    for (int i = 0; i < 64 * 12; i++) xs[i] = (float)cos(0.11 * i);
    for (int i = 0; i < 64; i++) ys[i] = i % 3;
    tf_write_npy(e2e_path("x.npy"), "<f4", 64, 12, xs, 4, 0);
    tf_write_npy(e2e_path("y.npy"), "<i8", 64, 0, ys, 8, 0);
    snprintf(cfg, sizeof cfg,
             "model: {name: onnx, onnx: %s, batch: 16, loss: cross_entropy}\n"
             "data: {source: npy, x: %s, y: %s}\n"
             "train: {steps: 10, optimizer: sgd, lr: 0.05, seed: 1}\n"
             "ckpt: {every: 10}\n",
             abs_model, e2e_path("x.npy"), e2e_path("y.npy"));
    train(write_file("onnx.yaml", cfg), e2e_path("run-onnx"));
    round_trip("imported mlp", e2e_path("run-onnx"), e2e_path("onnx-mlp.onnx"), "logits", 16, 12,
               3);
    numpy_eval(e2e_path("onnx-mlp.onnx"), e2e_path("run-onnx"), "logits", 2,
               (const int64_t[]){16, 12}, 48);

    /* The CNN (built channels last): exported with Transposes around each
     * conv, batch norm and pooling; checked by onnx.checker and the NumPy
     * evaluation. The importer reads no BatchNormalization yet, so there
     * is no round trip through it here. */
    float img[32 * 64];
    for (int i = 0; i < 32 * 64; i++) img[i] = (float)sin(0.05 * i);
    const int64_t idims[4] = {32, 1, 8, 8};
    tf_write_npy_dims(e2e_path("cx.npy"), "<f4", 4, idims, img, 4);
    tf_write_npy(e2e_path("cy.npy"), "<i8", 32, 0, ys, 8, 0);
    snprintf(cfg, sizeof cfg,
             "model: {name: cnn, channels: 1, height: 8, width: 8, c1: 4, c2: 6, classes: 3, "
             "batch: 4}\n"
             "data: {source: npy, x: %s, y: %s}\n"
             "train: {steps: 10, optimizer: sgd, lr: 0.05, seed: 1}\n"
             "ckpt: {every: 10}\n",
             e2e_path("cx.npy"), e2e_path("cy.npy"));
    train(write_file("cnn.yaml", cfg), e2e_path("run-cnn"));
    e2e_result r = e2e_runf("export %s --onnx %s", e2e_path("run-cnn"), e2e_path("cnn.onnx"));
    CHECK(r.rc == 0 && strstr(r.out, "Conv x2") && strstr(r.out, "BatchNormalization x2") &&
              strstr(r.out, "MaxPool x2"),
          "cnn: export exit %d: %s%s", r.rc, r.out, r.err);
    printf("%s", r.out);
    e2e_done(&r);
    py_check(e2e_path("cnn.onnx"), 18);
    numpy_eval(e2e_path("cnn.onnx"), e2e_path("run-cnn"), "logits", 4,
               (const int64_t[]){4, 1, 8, 8}, 12);
    /* ... and imported again: BatchNormalization starts from the file's
     * (the checkpoint's) running statistics, so the inference forward is
     * tessel's, at the trained batch and at batch 3. */
    {
        float x[4 * 64], want[12], got[12];
        for (int i = 0; i < 4 * 64; i++) x[i] = (float)sin(0.37 * i + 0.1);
        ref_forward(e2e_path("run-cnn"), "logits", x, sizeof x, want, sizeof want);
        for (int64_t rows = 4; rows >= 3; rows--) {
            memset(got, 0, sizeof got);
            import_forward(e2e_path("cnn.onnx"), e2e_path("run-cnn"), rows, x,
                           (size_t)rows * 64 * 4, got, (size_t)rows * 3 * 4);
            double scale, d = max_diff(got, want, (size_t)rows * 3, &scale);
            CHECK(d <= 1e-5 * scale, "cnn: the imported export differs by %.3g at batch %lld", d,
                  (long long)rows);
            printf("cnn: round trip max |diff| %.3g (batch %lld)\n", d, (long long)rows);
        }
    }
    /* --opset 17 */
    r = e2e_runf("export %s --onnx %s --opset 17", e2e_path("run-mlp"), e2e_path("mlp17.onnx"));
    CHECK(r.rc == 0 && strstr(r.out, "ONNX opset 17"), "opset 17: exit %d: %s%s", r.rc, r.out,
          r.err);
    e2e_done(&r);
    py_check(e2e_path("mlp17.onnx"), 17);

    /* LoRA adapters are not in the model descriptor's forward graph: an
     * export without them would be a different model. */
    snprintf(cfg, sizeof cfg,
             "model: {name: mlp, window: 0, in_dim: 6, hidden: 8, n_hidden: 1, out_dim: 1, "
             "batch: 4}\n"
             "data: {source: synthetic}\n"
             "train: {steps: 2, optimizer: sgd, lr: 0.05, seed: 1}\n"
             "peft: {lora: {targets: ['net\\.0\\.weight'], r: 2, alpha: 4}}\n"
             "ckpt: {every: 2}\n");
    train(write_file("lora.yaml", cfg), e2e_path("run-lora"));
    r = e2e_runf("export %s --onnx %s", e2e_path("run-lora"), e2e_path("lora.onnx"));
    CHECK(r.rc == 2 && strstr(r.err, "'net.0.weight.lora_A'") && strstr(r.err, "nothing written"),
          "lora: exit %d: %s", r.rc, r.err);
    e2e_done(&r);
    CHECK(access(e2e_path("lora.onnx"), F_OK) != 0, "a refused LoRA export leaves no file");

    /* The run's config is needed to rebuild the model. */
    e2e_sh("mv %s %s", e2e_path("run-lora/config.yaml"), e2e_path("lora-config.yaml"));
    r = e2e_runf("export %s --onnx %s", e2e_path("run-lora"), e2e_path("lora.onnx"));
    CHECK(r.rc == 2 && strstr(r.err, "config.yaml"), "no config: exit %d: %s", r.rc, r.err);
    e2e_done(&r);
    r = e2e_runf("export %s --onnx", e2e_path("run-mlp"));
    CHECK(r.rc == 2 && strstr(r.err, "--onnx needs a value"), "usage: exit %d: %s", r.rc, r.err);
    e2e_done(&r);
    r = e2e_runf("export %s --onnx %s --opset 16", e2e_path("run-mlp"), e2e_path("x.onnx"));
    CHECK(r.rc == 2 && strstr(r.err, "--opset 17|18"), "opset 16: exit %d: %s", r.rc, r.err);
    e2e_done(&r);
    e2e_cleanup(dir);
    return check_summary("e2e onnx_export");
}
