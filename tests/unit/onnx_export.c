/* ts_onnx_export on graphs built here: ops the zoo models do not cover
 * (affine_scalar, softmax, log_softmax, leaky_relu, permute, a trailing
 * dropout that leaves the output an Identity) exported, imported again at
 * the same and at another batch size and run against the original graph's
 * inference plan with the same weights; and the refusals, each with
 * nothing written: a reshape folding the batch dimension, an op without
 * an ONNX form (spmm), a failing weight reader, a bad opset, no reader.
 * Half weights (f16, bf16): the initialisers stored rounded, read back
 * through Cast, imported as those rounded values exactly.
 * Exits 77 in a build without ONNX support. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include "check.h"
#include "tessel/onnx.h"
#include "tessel/tessel.h"

/* one file per process: two builds' suites may run this test at the same time */
static char path_buf[64];
#define PATH path_buf

/* Weights: element i of a tensor is sin(i + strlen(name)); "missing" fails. */
static ts_status weight(void *ctx, const char *name, void *dst, size_t bytes) {
    (void)ctx;
    if (!strcmp(name, "missing")) return ts_fail(TS_ERR_NOT_FOUND, "no tensor 'missing'");
    float *f = dst;
    for (size_t i = 0; i < bytes / 4; i++) f[i] = (float)sin((double)(i + strlen(name)));
    return TS_OK;
}

/* The model: x [B, 2, 3] -> permute [B, 3, 2] -> leaky_relu -> log_softmax
 * over the last axis -> reshape [B, 6] -> linear(w [5, 6], b) -> 2 y + 1 ->
 * softmax -> dropout: "probs" [B, 5]. */
static ts_val build(ts_graph *g, int64_t batch) {
    int64_t xd[3] = {batch, 2, 3}, wd[2] = {5, 6}, bd[1] = {5}, rd[2] = {batch, 6};
    ts_val x = ts_input(g, "x", TS_F32, 3, xd);
    ts_val w = ts_param(g, "w", TS_F32, 2, wd, ts_init_zeros());
    ts_val b = ts_param(g, "b", TS_F32, 1, bd, ts_init_zeros());
    ts_val h = ts_log_softmax(g, ts_leaky_relu(g, ts_permute(g, x, (int[]){0, 2, 1}), 0.1), -1);
    h = ts_linear(g, ts_reshape(g, h, 2, rd), w, b);
    ts_val y = ts_dropout(g, ts_softmax(g, ts_affine_scalar(g, h, 2, 1), 1), 0.5);
    ts_mark_output(g, y, "probs");
    return y;
}

/* The graph's inference plan on x, weights from weight(). */
static void run(ts_graph *g, const char *in, const char *out, const float *x, size_t xb, float *y,
                size_t yb) {
    ts_train_spec inf = ts_train_spec_default(TS_NONE);
    ts_plan *p = NULL;
    CHECK_OK(ts_compile(g, &inf, NULL, &p));
    for (int i = 0; p && i < ts_plan_param_count(p); i++) {
        const char *name = ts_plan_param_name(p, i);
        float buf[64];
        const size_t bytes = !strcmp(name, "w") ? 30 * 4 : 5 * 4;
        weight(NULL, name, buf, bytes);
        CHECK_OK(ts_plan_write_param(p, name, buf, bytes));
    }
    if (p) {
        CHECK_OK(ts_plan_set_input(p, in, x, xb));
        CHECK_OK(ts_plan_step(p));
        CHECK_OK(ts_plan_read(p, out, y, yb));
    }
    ts_plan_free(p);
}

static void round_trip(void) {
    ts_graph *g = ts_graph_new();
    ts_val y = build(g, 4);
    ts_onnx_export_options o = ts_onnx_export_defaults();
    o.weight = weight;
    ts_onnx_export_info info;
    CHECK_OK(ts_onnx_export(g, y, PATH, &o, &info));
    CHECK(info.n_initializers == 2 && info.param_elems == 35, "%d initialisers, %lld elements",
          info.n_initializers, (long long)info.param_elems);
    CHECK(strstr(info.ops, "Transpose x1") && strstr(info.ops, "LeakyRelu x1") &&
              strstr(info.ops, "LogSoftmax x1") && strstr(info.ops, "Softmax x1") &&
              strstr(info.ops, "Gemm x1") && strstr(info.ops, "Identity x1") &&
              !strstr(info.ops, "Dropout"),
          "ops: %s", info.ops);
    float x[24], want[20], got[20];
    for (int i = 0; i < 24; i++) x[i] = (float)cos(0.7 * i);
    run(g, "x", "probs", x, sizeof x, want, sizeof want);
    for (int64_t batch = 4; batch >= 1; batch -= 3) {
        ts_graph *h = ts_graph_new();
        ts_onnx_info in;
        ts_onnx_options io = {.batch = batch};
        CHECK_OK(ts_onnx_import(h, PATH, &io, &in));
        CHECK(in.n_outputs == 1 && !strcmp(in.output_names[0], "probs"), "output probs");
        memset(got, 0, sizeof got);
        run(h, "x", "probs", x, (size_t)batch * 6 * 4, got, (size_t)batch * 5 * 4);
        double worst = 0;
        for (int i = 0; i < batch * 5; i++) worst = fmax(worst, fabs(got[i] - want[i]));
        CHECK(worst <= 1e-6, "batch %lld: max |diff| %.3g", (long long)batch, worst);
        printf("round trip at batch %lld: max |diff| %.3g\n", (long long)batch, worst);
        ts_graph_free(h);
    }
    ts_graph_free(g);
    remove(PATH);
}

/* Weights stored as f16 / bf16: the file's initialisers are half, the
 * import reads each as float32 equal to weight() rounded to nearest even,
 * and the output stays within half precision of the float32 graph's. */
static void half_weights(ts_dtype wt) {
    ts_graph *g = ts_graph_new();
    ts_val y = build(g, 4);
    ts_onnx_export_options o = ts_onnx_export_defaults();
    o.weight = weight;
    o.weights = wt;
    ts_onnx_export_info info;
    CHECK_OK(ts_onnx_export(g, y, PATH, &o, &info));
    CHECK(strstr(info.ops, "Cast x2"), "%s: a Cast per initialiser: %s", ts_dtype_name(wt),
          info.ops);
    float x[24], want[20], got[20];
    for (int i = 0; i < 24; i++) x[i] = (float)cos(0.7 * i);
    run(g, "x", "probs", x, sizeof x, want, sizeof want);
    ts_graph *h = ts_graph_new();
    ts_onnx_info in;
    ts_onnx_options io = {.batch = 4};
    CHECK_OK(ts_onnx_import(h, PATH, &io, &in));
    ts_train_spec inf = ts_train_spec_default(TS_NONE);
    ts_plan *p = NULL;
    CHECK_OK(ts_compile(h, &inf, NULL, &p));
    float full[30], read[30];
    weight(NULL, "w", full, sizeof full);
    if (p) CHECK_OK(ts_plan_read(p, "w", read, sizeof read));
    int exact = 1;
    for (int i = 0; i < 30; i++) {
        /* round to nearest even at 10 (f16) or 7 (bf16) mantissa bits */
        const int bits = wt == TS_F16 ? 10 : 7;
        int e;
        const double m = frexp(full[i], &e), q = ldexp(1, bits + 1);
        const double r = ldexp(nearbyint(m * q) / q, e);
        exact &= read[i] == (float)r;
    }
    CHECK(exact, "%s: the imported weights are the rounded ones", ts_dtype_name(wt));
    if (p) {
        CHECK_OK(ts_plan_set_input(p, "x", x, sizeof x));
        CHECK_OK(ts_plan_step(p));
        CHECK_OK(ts_plan_read(p, "probs", got, sizeof got));
    }
    double worst = 0;
    for (int i = 0; i < 20; i++) worst = fmax(worst, fabs(got[i] - want[i]));
    CHECK(worst <= (wt == TS_F16 ? 2e-3 : 2e-2), "%s weights: max |diff| %.3g", ts_dtype_name(wt),
          worst);
    printf("%s weights: round trip max |diff| %.3g\n", ts_dtype_name(wt), worst);
    ts_plan_free(p);
    ts_graph_free(h);
    ts_graph_free(g);
    remove(PATH);
}

static void refused(ts_graph *g, ts_val y, const ts_onnx_export_options *o, ts_status want,
                    const char *msg) {
    remove(PATH);
    ts_status s = ts_onnx_export(g, y, PATH, o, NULL);
    CHECK(s == want && strstr(ts_last_error(), msg), "status %d, '%s'; want %d, '%s'", s,
          ts_last_error(), want, msg);
    CHECK(access(PATH, F_OK) != 0, "a refused export leaves no file (%s)", msg);
    char tmp[sizeof path_buf + 8];
    snprintf(tmp, sizeof tmp, "%s.tmp", PATH);
    CHECK(access(tmp, F_OK) != 0, "a refused export leaves no temporary file (%s)", msg);
}

static void refusals(void) {
    ts_onnx_export_options o = ts_onnx_export_defaults();
    o.weight = weight;
    ts_graph *g = ts_graph_new();
    int64_t xd[2] = {4, 6}, fd[1] = {24}, md[1] = {6};
    ts_val x = ts_input(g, "x", TS_F32, 2, xd);
    /* [4, 6] -> [3, 8]: no axis of the output carries the batch. */
    int64_t od[2] = {3, 8};
    ts_val flat = ts_reshape(g, ts_relu(g, x), 2, od);
    refused(g, flat, &o, TS_ERR_UNSUPPORTED, "folds the batch dimension into a static one");
    /* A sparse matmul (the gcn): named, with why. */
    int64_t ip[3] = {0, 1, 2}, ix[2] = {1, 0}, pd[1] = {3}, nd[1] = {2};
    float vals[2] = {1, 1};
    ts_val sp =
        ts_spmm(g, ts_constant(g, NULL, TS_I64, 1, pd, ip), ts_constant(g, NULL, TS_I64, 1, nd, ix),
                ts_constant(g, NULL, TS_F32, 1, nd, vals), ts_transpose(g, x, 0, 1), 2, 6);
    (void)fd;
    refused(g, sp, &o, TS_ERR_UNSUPPORTED, "op 'spmm'");
    refused(g, sp, &o, TS_ERR_UNSUPPORTED, "no sparse-dense matmul");
    ts_val m = ts_param(g, "missing", TS_F32, 1, md, ts_init_zeros());
    refused(g, ts_add(g, x, m), &o, TS_ERR_NOT_FOUND, "no tensor 'missing'");
    ts_onnx_export_options bad = o;
    bad.opset = 16;
    refused(g, ts_relu(g, x), &bad, TS_ERR_INVALID, "opset 16");
    bad = o;
    bad.weights = TS_I64;
    refused(g, ts_relu(g, x), &bad, TS_ERR_INVALID, "weights as i64");
    bad = o;
    bad.weight = NULL;
    refused(g, ts_relu(g, x), &bad, TS_ERR_INVALID, "weight reader");
    ts_graph_free(g);
}

int main(void) {
    snprintf(path_buf, sizeof path_buf, "/tmp/tessel-unit-onnx-export-%d.onnx", (int)getpid());
#ifndef TESSEL_HAVE_ONNX
    puts("unit onnx_export: built without ONNX support, skipped");
    return 77;
#endif
    round_trip();
    half_weights(TS_F16);
    half_weights(TS_BF16);
    refusals();
    return check_summary("unit onnx_export");
}
