/* `tessel export CKPT --onnx FILE` on the zoo models e2e/onnx_export.c does
 * not cover: the GPT (embedding, fused attention, tanh GELU, split), the
 * GRU and LSTM (cells unrolled, a [batch * steps] reshape, zero states that
 * follow the batch), the 3D U-Net (conv_transpose, concat, channels last)
 * and the GCN (refused: sparse matmul). Each exported file is imported
 * again: its weights are the checkpoint's bit for bit and its output equals
 * tessel's own forward (an inference plan of the run's model with the
 * checkpoint loaded) at the trained batch and at another one. With
 * python3-onnx, onnx.checker (full_check) passes on each file and
 * tests/e2e/onnx_eval.py evaluates the GPT, GRU and LSTM with NumPy.
 * `--triton DIR` lays out a Triton model repository: config.pbtxt's fields
 * checked one by one. */
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

static const char *write_file(const char *name, const char *text) {
    const char *p = e2e_path(name);
    FILE *f = fopen(p, "w");
    CHECK(f != NULL, "create %s", p);
    if (f) fputs(text, f), fclose(f);
    return p;
}

/* One feed: the input's bytes, i64 token ids below vocab or f32 values. */
typedef struct feed {
    ts_dtype dt;
    int64_t per_row, vocab;
    void *x;
} feed;

static void *make_x(const feed *f, int64_t rows) {
    const size_t n = (size_t)(rows * f->per_row);
    if (f->dt == TS_I64) {
        int64_t *t = malloc(n * 8);
        for (size_t i = 0; t && i < n; i++) t[i] = (int64_t)((i * 7 + 3) % (size_t)f->vocab);
        return t;
    }
    float *x = malloc(n * 4);
    for (size_t i = 0; x && i < n; i++) x[i] = (float)sin(0.37 * (double)i + 0.1);
    return x;
}

/* Checkpoint values into plan p; returns how many fitted. */
static int load_ckpt(ts_plan *p, const char *run, int compare) {
    ts_ckpt *ck = NULL;
    CHECK_OK(ts_ckpt_open(run, NULL, NULL, &ck));
    int n = 0;
    for (int i = 0; p && ck && i < ts_ckpt_tensor_count(ck); i++) {
        ts_ckpt_tensor t;
        CHECK_OK(ts_ckpt_tensor_info(ck, i, &t));
        void *a = malloc(t.bytes), *b = malloc(t.bytes);
        CHECK_OK(ts_ckpt_read(ck, t.name, a, t.bytes));
        if (compare) {
            if (ts_plan_read(p, t.name, b, t.bytes) == TS_OK) {
                CHECK(!memcmp(a, b, t.bytes), "%s: initialiser %s differs from the checkpoint", run,
                      t.name);
                n++;
            }
        } else {
            n += ts_plan_write_param(p, t.name, a, t.bytes) == TS_OK;
        }
        free(a), free(b);
    }
    ts_ckpt_close(ck);
    return n;
}

/* tessel's forward of the run's model on x (rows = the trained batch). */
static void ref_forward(const char *run, const feed *f, const void *x, size_t xb, float *y,
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
    CHECK(load_ckpt(p, run, 0) > 0, "%s: no checkpoint value fits the model", run);
    (void)f;
    if (p) {
        CHECK_OK(ts_plan_set_input(p, ts_name(g, m.input), x, xb));
        CHECK_OK(ts_plan_step(p));
        CHECK_OK(ts_plan_read(p, ts_name(g, m.output), y, yb));
    }
    ts_plan_free(p);
    ts_graph_free(g);
}

/* The exported file imported for `rows`: fills y with its output on x. */
static void import_forward(const char *file, const char *run, int64_t rows, const void *x,
                           size_t xb, float *y, size_t yb) {
    ts_graph *g = ts_graph_new();
    ts_onnx_info info;
    ts_onnx_options o = {.batch = rows};
    CHECK_OK(ts_onnx_import(g, file, &o, &info));
    ts_train_spec inf = ts_train_spec_default(TS_NONE);
    ts_plan *p = NULL;
    CHECK_OK(ts_compile(g, &inf, NULL, &p));
    CHECK(load_ckpt(p, run, 1) > 0, "%s: no initialiser is a checkpoint value", file);
    if (p) {
        CHECK_OK(ts_plan_set_input(p, info.input_names[0], x, xb));
        CHECK_OK(ts_plan_step(p));
        CHECK_OK(ts_plan_read(p, info.output_names[0], y, yb));
    }
    ts_plan_free(p);
    ts_graph_free(g);
}

static void py_check(const char *file) {
    if (!have_onnx_py) return;
    char cmd[1024];
    snprintf(cmd, sizeof cmd,
             "/usr/bin/python3 -c \"import onnx, sys\n"
             "m = onnx.load(sys.argv[1]); onnx.checker.check_model(m, full_check=True)\n"
             "assert m.graph.input[0].type.tensor_type.shape.dim[0].dim_param == 'batch'\n"
             "print('onnx.checker: ok', sys.argv[1])\" %s",
             file);
    CHECK(system(cmd) == 0, "onnx.checker failed on %s", file);
}

/* The trained batch's x and tessel's forward as .npy beside the file;
 * onnx_eval.py evaluates the file with NumPy (python3-onnx), and with
 * TESSEL_ORT_PYTHON set (a python with onnxruntime, never needed)
 * examples/onnx/ort_run.py runs it with ONNX Runtime. */
static void evaluate(const char *file, const feed *f, int64_t batch, const void *x,
                     const float *want, size_t yn, int numpy) {
    const int64_t xd[2] = {batch, f->per_row}, yd[2] = {batch, (int64_t)yn / batch};
    char xp[800], wp[800], cmd[2600];
    snprintf(xp, sizeof xp, "%s.x.npy", file);
    snprintf(wp, sizeof wp, "%s.want.npy", file);
    tf_write_npy_dims(xp, f->dt == TS_I64 ? "<i8" : "<f4", 2, xd, x, f->dt == TS_I64 ? 8 : 4);
    tf_write_npy_dims(wp, "<f4", 2, yd, want, 4);
    if (have_onnx_py && numpy) {
        snprintf(cmd, sizeof cmd, "/usr/bin/python3 tests/e2e/onnx_eval.py %s %s %s", file, xp, wp);
        CHECK(system(cmd) == 0, "%s: the NumPy evaluation differs from tessel's forward", file);
    }
    const char *ort = getenv("TESSEL_ORT_PYTHON");
    if (ort && *ort) {
        snprintf(cmd, sizeof cmd, "%s examples/onnx/ort_run.py %s %s %s", ort, file, xp, wp);
        CHECK(system(cmd) == 0, "%s: ONNX Runtime differs from tessel's forward", file);
    }
}

/* Trains the config 2 steps, exports, round-trips at batch and at rows2
 * (fewer rows: the first rows2 of the same input). */
static void zoo(const char *what, const char *cfg, const feed *f, int64_t batch, int64_t rows2,
                int64_t out_per_row, int eval) {
    char name[64], run[600], file[700];
    snprintf(name, sizeof name, "%s.yaml", what);
    snprintf(run, sizeof run, "%s", e2e_path(what));
    snprintf(file, sizeof file, "%s.onnx", run);
    e2e_result r = e2e_runf("train %s --out %s", write_file(name, cfg), run);
    CHECK(r.rc == 0, "%s: train exit %d: %s", what, r.rc, r.err);
    e2e_done(&r);
    r = e2e_runf("export %s --onnx %s", run, file);
    CHECK(r.rc == 0 && strstr(r.out, "ONNX opset 18"), "%s: export exit %d: %s%s", what, r.rc,
          r.out, r.err);
    printf("%s", r.out);
    e2e_done(&r);
    const size_t yn = (size_t)(batch * out_per_row), esz = f->dt == TS_I64 ? 8 : 4;
    void *x = make_x(f, batch);
    float *want = calloc(yn, 4), *got = calloc(yn, 4);
    ref_forward(run, f, x, (size_t)(batch * f->per_row) * esz, want, yn * 4);
    import_forward(file, run, batch, x, (size_t)(batch * f->per_row) * esz, got, yn * 4);
    double d = 0, scale = 1;
    for (size_t i = 0; i < yn; i++)
        d = fmax(d, fabs((double)got[i] - want[i])), scale = fmax(scale, fabs((double)want[i]));
    CHECK(d <= 1e-5 * scale, "%s: imported export differs from tessel's forward by %.3g", what, d);
    printf("%s: round trip max |diff| %.3g over %zu outputs (batch %lld)\n", what, d, yn,
           (long long)batch);
    /* The batch is dynamic: rows2 rows give the first rows2 rows. */
    memset(got, 0, yn * 4);
    import_forward(file, run, rows2, x, (size_t)(rows2 * f->per_row) * esz, got,
                   (size_t)(rows2 * out_per_row) * 4);
    d = 0;
    for (size_t i = 0; i < (size_t)(rows2 * out_per_row); i++)
        d = fmax(d, fabs((double)got[i] - want[i]));
    CHECK(d <= 1e-5 * scale, "%s: at batch %lld the export differs by %.3g", what, (long long)rows2,
          d);
    printf("%s: at batch %lld max |diff| %.3g\n", what, (long long)rows2, d);
    py_check(file);
    evaluate(file, f, batch, x, want, yn, eval);
    free(x), free(want), free(got);
}

int main(void) {
#ifndef TESSEL_HAVE_ONNX
    puts("e2e onnx_export_zoo: built without ONNX support, skipped");
    return 77;
#endif
    char dir[64];
    if (!e2e_setup("onnx-zoo", dir, sizeof dir)) return check_summary("e2e onnx_export_zoo");
    have_onnx_py = system("/usr/bin/python3 -c 'import onnx' 2>/dev/null") == 0;
    if (!have_onnx_py) puts("python3-onnx not installed: checker and NumPy evaluation skipped");
    const char *train = "data: {source: synthetic}\n"
                        "train: {steps: 2, optimizer: adamw, lr: 0.01, seed: 1}\n"
                        "ckpt: {every: 2}\n";
    char cfg[1024];
    snprintf(cfg, sizeof cfg,
             "model: {name: gpt, batch: 2, ctx: 8, vocab: 32, d_model: 16, n_layers: 2, "
             "n_heads: 2, dropout: 0.1}\n%s",
             train);
    feed gpt = {TS_I64, 8, 32, NULL};
    zoo("gpt", cfg, &gpt, 2, 1, 8 * 32, 1);
    feed seq = {TS_F32, 5 * 3, 0, NULL};
    snprintf(cfg, sizeof cfg,
             "model: {name: gru, window: 5, features: 3, hidden: 4, n_layers: 2, batch: 4}\n%s",
             train);
    zoo("gru", cfg, &seq, 4, 3, 1, 1);
    snprintf(cfg, sizeof cfg,
             "model: {name: lstm, window: 5, features: 3, hidden: 4, n_layers: 2, batch: 4, "
             "classes: 0, out_dim: 2}\n%s",
             train);
    zoo("lstm", cfg, &seq, 4, 2, 2, 1);
    snprintf(cfg, sizeof cfg,
             "model: {name: unet3d, batch: 2, channels: 1, size: 8, c1: 2, c2: 4, c3: 4, "
             "classes: 2}\n%s",
             train);
    feed vol = {TS_F32, 8 * 8 * 8, 0, NULL};
    zoo("unet3d", cfg, &vol, 2, 1, 2 * 8 * 8 * 8, 0);

    /* --triton: a Triton model repository for the GPT, every field of its
     * config.pbtxt as Triton reads it (the batch left out of the dims). */
    char repo[600];
    snprintf(repo, sizeof repo, "%s", e2e_path("repo"));
    e2e_result r = e2e_runf("export %s --triton %s --max-batch 8", e2e_path("gpt"), repo);
    CHECK(r.rc == 0 && strstr(r.out, "Triton model repository"), "triton: exit %d: %s%s", r.rc,
          r.out, r.err);
    e2e_done(&r);
    char path[700];
    snprintf(path, sizeof path, "%s/gpt/config.pbtxt", repo);
    char *pb = e2e_slurp(path, NULL);
    const char *want[] = {"name: \"gpt\"\n",
                          "platform: \"onnxruntime_onnx\"\n",
                          "max_batch_size: 8\n",
                          "input [\n  {\n    name: \"tokens\"\n    data_type: TYPE_INT64\n"
                          "    dims: [ 8 ]\n  }\n]\n",
                          "output [\n  {\n    name: \"logits\"\n    data_type: TYPE_FP32\n"
                          "    dims: [ 8, 32 ]\n  }\n]\n",
                          "dynamic_batching { }\n"};
    for (size_t i = 0; i < sizeof want / sizeof want[0]; i++)
        CHECK(strstr(pb, want[i]), "config.pbtxt has '%s':\n%s", want[i], pb);
    free(pb);
    snprintf(path, sizeof path, "%s/gpt/1/model.onnx", repo);
    py_check(path);
    /* --name, and the trained batch as max_batch_size by default. */
    r = e2e_runf("export %s --triton %s --name rnn_v2", e2e_path("gru"), repo);
    CHECK(r.rc == 0, "triton gru: exit %d: %s", r.rc, r.err);
    e2e_done(&r);
    snprintf(path, sizeof path, "%s/rnn_v2/config.pbtxt", repo);
    pb = e2e_slurp(path, NULL);
    CHECK(strstr(pb, "name: \"rnn_v2\"") && strstr(pb, "max_batch_size: 4\n") &&
              strstr(pb, "dims: [ 5, 3 ]") && strstr(pb, "dims: [ 1 ]"),
          "gru's config.pbtxt:\n%s", pb);
    free(pb);
    /* --weights fp16: half initialisers read through Cast, checker-valid. */
    snprintf(path, sizeof path, "%s", e2e_path("gru16.onnx"));
    r = e2e_runf("export %s --onnx %s --weights fp16", e2e_path("gru"), path);
    CHECK(r.rc == 0 && strstr(r.out, "Cast x10"), "fp16 weights: exit %d: %s%s", r.rc, r.out,
          r.err);
    e2e_done(&r);
    py_check(path);
    r = e2e_runf("export %s --onnx %s --weights fp8", e2e_path("gru"), path);
    CHECK(r.rc == 2 && strstr(r.err, "--weights f32|fp16|bf16"), "fp8 weights: exit %d", r.rc);
    e2e_done(&r);
    r = e2e_runf("export %s --triton %s --name a/b", e2e_path("gru"), repo);
    CHECK(r.rc == 2, "a name with a slash: exit %d", r.rc);
    e2e_done(&r);

    /* The GCN: sparse matmul, refused by name with why; nothing written. */
    snprintf(cfg, sizeof cfg,
             "model: {name: gcn, nodes: 30, features: 5, hidden: 4, classes: 3}\n%s", train);
    r = e2e_runf("train %s --out %s", write_file("gcn.yaml", cfg), e2e_path("gcn"));
    CHECK(r.rc == 0, "gcn: train exit %d: %s", r.rc, r.err);
    e2e_done(&r);
    r = e2e_runf("export %s --onnx %s", e2e_path("gcn"), e2e_path("gcn.onnx"));
    CHECK(r.rc == 2 && strstr(r.err, "op 'spmm'") && strstr(r.err, "no sparse-dense matmul"),
          "gcn: exit %d: %s", r.rc, r.err);
    printf("gcn -> %s", r.err);
    e2e_done(&r);
    CHECK(access(e2e_path("gcn.onnx"), F_OK) != 0, "a refused export leaves no file");
    e2e_cleanup(dir);
    return check_summary("e2e onnx_export_zoo");
}
