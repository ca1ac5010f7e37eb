/* `tessel onnx check` on the fixtures of tests/parity/gen_onnx_fixtures.py:
 * the summary of an importable model (inline and external data), and exit 2
 * with a clear message for a truncated file, a file that is not ONNX, an
 * unsupported op (node, op type and opset named), an opset out of range, a
 * missing external data file, external data outside the model's directory
 * (by "..", and by a symlink out of it) and a bad --batch. Exits 77 in a
 * build without ONNX support. */
#include <stdio.h>
#include <string.h>
#include "check.h"
#include "e2e.h"

#define FIX "tests/parity/fixtures/onnx/"

static void expect(const char *what, const char *args, int rc, const char *m1, const char *m2) {
    e2e_result r = e2e_runf("onnx check %s", args);
    const char *text = rc ? (r.rc == 2 && strstr(r.out, "refused") ? r.out : r.err) : r.out;
    CHECK(r.rc == rc && strstr(text, m1) && (!m2 || strstr(text, m2)),
          "%s: exit %d (want %d), want '%s'%s%s in: %s%s", what, r.rc, rc, m1, m2 ? " and " : "",
          m2 ? m2 : "", r.out, r.err);
    printf("%-24s -> %s", what, text);
    e2e_done(&r);
}

int main(void) {
#ifndef TESSEL_HAVE_ONNX
    puts("e2e onnx_cli: built without ONNX support, skipped");
    return 77;
#endif
    char dir[64];
    if (!e2e_setup("onnx", dir, sizeof dir)) return check_summary("e2e onnx_cli");
    expect("mlp", FIX "mlp.onnx --batch 32", 0, "inputs: x [32, 12] f32",
           "ops: Gemm x3, Relu x1, Tanh x1");
    expect("mlp parameters", FIX "mlp.onnx", 0, "parameters: 6 (371 elements)", "logits [1, 3]");
    expect("mlp external data", FIX "mlp_ext.onnx", 0, "parameters: 6 (371 elements)", NULL);
    expect("cnn", FIX "cnn.onnx --batch 4", 0, "inputs: x [4, 1, 8, 8] f32", "Conv x2");
    expect("unsupported op", FIX "unsupported_op.onnx", 2, "1 node of 2 would be refused",
           "node 'act' (Hardmax, opset 17): op type 'Hardmax' is not supported");
    expect("lone Erf", FIX "lone_erf.onnx", 2, "node 'act' (Erf, opset 17)",
           "Erf is read only inside torch's GELU pattern");
    expect("gpt", FIX "gpt.onnx --batch 3", 0, "inputs: x [3, 16] i64",
           "outputs: logits [3, 16, 64] f32");
    expect("gpt, dynamic sequence", FIX "gpt_seq.onnx --batch 2 --seq 8", 0,
           "inputs: x [2, 8] i64", "fused: 4 patterns");
    expect("gpt, no sequence length", FIX "gpt_seq.onnx --batch 2", 2,
           "dimension 1 ('seq') is dynamic", NULL);
    expect("gru", FIX "gru.onnx --batch 5", 0, "outputs: logits [5, 1] f32", "GRU x2");
    expect("opset 12", FIX "opset12.onnx", 2, "uses opset 12; tessel reads opsets 13 to 18", NULL);
    expect("missing external data", FIX "missing_external.onnx", 2,
           "initialiser 'w': cannot open external data", "missing.data");
    expect("external data by ..", FIX "escape.onnx", 2,
           "must be a path inside the model's directory", NULL);
    /* A truncated copy of the MLP and a text file. */
    e2e_sh("head -c 700 " FIX "mlp.onnx > %s", e2e_path("truncated.onnx"));
    expect("truncated", e2e_path("truncated.onnx"), 2, "is not an ONNX model", "truncated");
    e2e_sh("echo 'model: {name: mlp}' > %s", e2e_path("config.onnx"));
    expect("not ONNX", e2e_path("config.onnx"), 2, "is not an ONNX model", NULL);
    expect("no such file", e2e_path("absent.onnx"), 2, "cannot open", "absent.onnx");
    /* The external data file a symlink to a file outside the model's directory. */
    e2e_sh("mkdir -p %s && cp " FIX "mlp_ext.onnx %s && cp " FIX "mlp_ext.data %s && ln -s %s %s",
           e2e_path("m"), e2e_path("m"), e2e_path("outside.data"), e2e_path("outside.data"),
           e2e_path("m/mlp_ext.data"));
    expect("symlink out", e2e_path("m/mlp_ext.onnx"), 2, "outside the model's directory", NULL);
    expect("bad batch", FIX "mlp.onnx --batch 0", 2, "--batch needs a positive integer", NULL);
    expect("no subcommand", "", 2, "which file?", NULL);
    e2e_cleanup(dir);
    return check_summary("e2e onnx_cli");
}
