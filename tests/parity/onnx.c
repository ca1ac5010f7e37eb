/* ONNX import against PyTorch (tests/parity/gen_onnx_fixtures.py): the
 * exported MLP and CNN (and the MLP with external data), the W3 GPT, the CNN
 * with BatchNorm, the W2 GRU and an LSTM imported with ts_onnx_import, their
 * initialisers compared with torch's parameters, the forward with torch's
 * logits (fp32 tolerance), then loss, gradients and the parameters after 2
 * SGD steps (and BatchNorm's running statistics) through parity_run. Exits
 * 77 in a build without ONNX support. */
#define _POSIX_C_SOURCE 200809L
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "ckpt/safetensors.h"
#include "parity.h"
#include "tessel/onnx.h"

#define DIR "tests/parity/fixtures/onnx/"

/* Imported initial parameters and the inference forward equal torch's. */
static void forward_seq(const char *model, const char *fixture, int64_t batch, int64_t seq,
                        int n_params) {
    ts_st_file *f = NULL;
    CHECK_OK(ts_st_open(fixture, &f));
    if (!f) return;
    ts_graph *g = ts_graph_new();
    ts_onnx_info info;
    ts_onnx_options o = {.batch = batch};
    o.dims[1] = seq;
    CHECK_OK(ts_onnx_import(g, model, &o, &info));
    CHECK(info.n_inputs == 1 && !strcmp(info.input_names[0], "x"), "%s: input x", model);
    CHECK(info.n_outputs == 1 && !strcmp(info.output_names[0], "logits"), "%s: output logits",
          model);
    CHECK(info.opset == 17 && info.n_params == n_params, "%s: opset %lld, %d params (want %d)",
          model, (long long)info.opset, info.n_params, n_params);
    ts_train_spec spec = ts_train_spec_default(TS_NONE);
    ts_plan *p = NULL;
    CHECK_OK(ts_compile(g, &spec, NULL, &p));
    ts_st_tensor t, ref;
    for (int i = 0; p && i < ts_st_count(f); i++) {
        const char *key = ts_st_name(f, i);
        if (strncmp(key, "param.", 6)) continue;
        CHECK_OK(ts_st_find(f, key, &ref));
        float *buf = malloc(ref.bytes);
        CHECK_OK(ts_plan_read(p, key + 6, buf, ref.bytes));
        CHECK(!memcmp(buf, ref.data, ref.bytes), "%s: %s differs from torch's", model, key);
        free(buf);
    }
    /* An inference plan: with BatchNorm, torch's eval-mode logits. */
    if (p && ts_st_find(f, "input.x", &t) == TS_OK &&
        (ts_st_find(f, "eval.logits", &ref) == TS_OK ||
         ts_st_find(f, "output.logits", &ref) == TS_OK)) {
        CHECK_OK(ts_plan_set_input(p, "x", t.data, t.bytes));
        CHECK_OK(ts_plan_step(p));
        const float *want = ref.data;
        const size_t n = ref.bytes / 4;
        float *got = calloc(n, sizeof *got);
        CHECK(got != NULL, "logits buffer");
        if (got) CHECK_OK(ts_plan_read(p, "logits", got, ref.bytes));
        double worst = 0, mx = 1;
        for (size_t k = 0; got && k < n; k++) {
            worst = fmax(worst, fabs(got[k] - want[k]));
            mx = fmax(mx, fabs(want[k]));
        }
        CHECK(worst <= 1e-5 * mx, "%s: forward max |diff| %.3g vs torch", model, worst);
        printf("%s: forward max |diff| %.3g (%zu logits)\n", model, worst, n);
        free(got);
    }
    ts_plan_free(p);
    ts_graph_free(g);
    ts_st_close(f);
}

enum loss { CE, BCE };

static void forward(const char *model, const char *fixture, int64_t batch, int n_params) {
    forward_seq(model, fixture, batch, 0, n_params);
}

/* Loss, gradients and 2 SGD steps: cross-entropy on logits [B, C] or
 * [B, T, C] against class ids of the logits' leading shape, or BCE with
 * logits against float targets of the logits' shape; BatchNorm's running
 * statistics after the steps too. */
static void train(const char *model, const char *fixture, int64_t batch, enum loss kind) {
    ts_graph *g = ts_graph_new();
    ts_onnx_info info;
    ts_onnx_options o = {.batch = batch};
    CHECK_OK(ts_onnx_import(g, model, &o, &info));
    ts_val out = info.outputs[0];
    int64_t yd[TS_MAX_RANK];
    const int r = ts_rank(g, out);
    for (int k = 0; k < r; k++) yd[k] = ts_dim(g, out, k);
    ts_val loss;
    if (kind == CE) {
        ts_val y = ts_input(g, "y", TS_I64, r - 1, yd);
        loss = ts_cross_entropy(g, out, y, -100);
    } else {
        loss = ts_bce_with_logits(g, out, ts_input(g, "y", TS_F32, r, yd));
    }
    parity_run_buffers(fixture, g, loss, "x", "y", ts_sgd(0.1, 0, 0, 0, 0));
    ts_graph_free(g);
}

/* The W3 GPT's attention is fused into ts_attention and its tanh GELU
 * (torch's formula) into ts_gelu: no softmax or tanh is left in the plan. */
static void gpt_fused(void) {
    ts_graph *g = ts_graph_new();
    ts_onnx_info info;
    ts_onnx_options o = {.batch = 2};
    CHECK_OK(ts_onnx_import(g, DIR "gpt.onnx", &o, &info));
    ts_train_spec spec = ts_train_spec_default(TS_NONE);
    ts_plan *p = NULL;
    CHECK_OK(ts_compile(g, &spec, NULL, &p));
    char *text = NULL;
    size_t len = 0;
    FILE *mem = open_memstream(&text, &len);
    if (p && mem) CHECK_OK(ts_plan_dump(p, TS_DUMP_PLAN, mem));
    if (mem) fclose(mem);
    CHECK(text && strstr(text, "attention") && !strstr(text, "softmax"),
          "gpt: the plan runs fused attention and no separate softmax");
    CHECK(text && strstr(text, "gelu") && !strstr(text, "tanh"),
          "gpt: the plan runs gelu (tanh form) and no separate tanh");
    CHECK(info.n_fused == 4, "gpt: 2 attention and 2 GELU patterns fused, got %d", info.n_fused);
    free(text);
    ts_plan_free(p);
    ts_graph_free(g);
}

int main(void) {
#ifndef TESSEL_HAVE_ONNX
    puts("parity onnx: built without ONNX support, skipped");
    return 77;
#endif
    forward(DIR "mlp.onnx", DIR "mlp.safetensors", 4, 6);
    forward(DIR "mlp_ext.onnx", DIR "mlp.safetensors", 4, 6);
    forward(DIR "cnn.onnx", DIR "cnn.safetensors", 4, 6);
    forward(DIR "gpt.onnx", DIR "gpt.safetensors", 2, 28);
    forward_seq(DIR "gpt_seq.onnx", DIR "gpt.safetensors", 2, 16, 28);
    forward(DIR "cnn_bn.onnx", DIR "cnn_bn.safetensors", 4, 8);
    forward(DIR "ops.onnx", DIR "ops.safetensors", 4, 6);
    forward(DIR "gru.onnx", DIR "gru.safetensors", 4, 10);
    forward(DIR "lstm.onnx", DIR "lstm.safetensors", 4, 10);
    train(DIR "mlp.onnx", DIR "mlp.safetensors", 4, CE);
    train(DIR "mlp_ext.onnx", DIR "mlp.safetensors", 4, CE);
    train(DIR "cnn.onnx", DIR "cnn.safetensors", 4, CE);
    train(DIR "gpt.onnx", DIR "gpt.safetensors", 2, CE);
    train(DIR "cnn_bn.onnx", DIR "cnn_bn.safetensors", 4, CE);
    train(DIR "ops.onnx", DIR "ops.safetensors", 4, CE);
    train(DIR "gru.onnx", DIR "gru.safetensors", 4, BCE);
    train(DIR "lstm.onnx", DIR "lstm.safetensors", 4, BCE);
    gpt_fused();
    return check_summary("parity onnx");
}
