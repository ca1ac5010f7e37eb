/* ONNX import against PyTorch (tests/parity/gen_onnx_fixtures.py): the
 * exported MLP and CNN (and the MLP with external data) imported with
 * ts_onnx_import, their initialisers compared with torch's parameters, the
 * forward with torch's logits (fp32 tolerance), then loss, gradients and the
 * parameters after 2 SGD steps through parity_run. Exits 77 in a build
 * without ONNX support. */
#include <stdlib.h>
#include <string.h>
#include "ckpt/safetensors.h"
#include "parity.h"
#include "tessel/onnx.h"

#define DIR "tests/parity/fixtures/onnx/"

/* Imported initial parameters and the inference forward equal torch's. */
static void forward(const char *model, const char *fixture) {
    ts_st_file *f = NULL;
    CHECK_OK(ts_st_open(fixture, &f));
    if (!f) return;
    ts_graph *g = ts_graph_new();
    ts_onnx_info info;
    ts_onnx_options o = {.batch = 4};
    CHECK_OK(ts_onnx_import(g, model, &o, &info));
    CHECK(info.n_inputs == 1 && !strcmp(info.input_names[0], "x"), "%s: input x", model);
    CHECK(info.n_outputs == 1 && !strcmp(info.output_names[0], "logits"), "%s: output logits",
          model);
    CHECK(info.opset == 17 && info.n_params == 6, "%s: opset %lld, %d params", model,
          (long long)info.opset, info.n_params);
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
    if (p && ts_st_find(f, "input.x", &t) == TS_OK &&
        ts_st_find(f, "output.logits", &ref) == TS_OK) {
        CHECK_OK(ts_plan_set_input(p, "x", t.data, t.bytes));
        CHECK_OK(ts_plan_step(p));
        float got[64];
        const float *want = ref.data;
        const size_t n = ref.bytes / 4;
        CHECK(n <= 64, "logits fit");
        CHECK_OK(ts_plan_read(p, "logits", got, ref.bytes));
        double worst = 0, mx = 1;
        for (size_t k = 0; k < n && k < 64; k++) {
            worst = fmax(worst, fabs(got[k] - want[k]));
            mx = fmax(mx, fabs(want[k]));
        }
        CHECK(worst <= 1e-5 * mx, "%s: forward max |diff| %.3g vs torch", model, worst);
        printf("%s: forward max |diff| %.3g (%zu logits)\n", model, worst, n);
    }
    ts_plan_free(p);
    ts_graph_free(g);
    ts_st_close(f);
}

/* Loss, gradients and 2 SGD steps with cross-entropy on the logits. */
static void train(const char *model, const char *fixture) {
    ts_graph *g = ts_graph_new();
    ts_onnx_info info;
    ts_onnx_options o = {.batch = 4};
    CHECK_OK(ts_onnx_import(g, model, &o, &info));
    int64_t yd[1] = {4};
    ts_val y = ts_input(g, "y", TS_I64, 1, yd);
    ts_val loss = ts_cross_entropy(g, info.outputs[0], y, -100);
    parity_run(fixture, g, loss, "x", "y", ts_sgd(0.1, 0, 0, 0, 0));
    ts_graph_free(g);
}

int main(void) {
#ifndef TESSEL_HAVE_ONNX
    puts("parity onnx: built without ONNX support, skipped");
    return 77;
#endif
    forward(DIR "mlp.onnx", DIR "mlp.safetensors");
    forward(DIR "mlp_ext.onnx", DIR "mlp.safetensors");
    forward(DIR "cnn.onnx", DIR "cnn.safetensors");
    train(DIR "mlp.onnx", DIR "mlp.safetensors");
    train(DIR "mlp_ext.onnx", DIR "mlp.safetensors");
    train(DIR "cnn.onnx", DIR "cnn.safetensors");
    return check_summary("parity onnx");
}
