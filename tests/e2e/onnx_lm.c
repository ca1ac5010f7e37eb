/* `model.name: onnx_lm` from the command line: the W3 GPT exported from
 * PyTorch (tests/parity/fixtures/onnx/gpt.onnx) trained on a token file
 * (data.source tokens), and the imported file's lineage: its SHA-256 in the
 * run's config.yaml (model.onnx_sha256), lineage.json and the checkpoint's
 * manifest. A file that changed after the config recorded its hash, a
 * model.ctx or model.vocab the file does not have, and a model that is not
 * a language model are errors naming the key, exit 2. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include "check.h"
#include "e2e.h"

#define FIX "tests/parity/fixtures/onnx/"

static void write_text(const char *path, const char *text) {
    FILE *f = fopen(path, "w");
    CHECK(f != NULL, "create %s", path);
    if (f) fputs(text, f), fclose(f);
}

/* The SHA-256 of a file by sha256sum (an independent implementation). */
static void sha256_of(const char *path, char hex[65]) {
    char cmd[600];
    snprintf(cmd, sizeof cmd, "sha256sum '%s'", path);
    FILE *p = popen(cmd, "r");
    hex[0] = 0;
    if (p) {
        if (fscanf(p, "%64s", hex) != 1) hex[0] = 0;
        pclose(p);
    }
    CHECK(strlen(hex) == 64, "sha256sum %s", path);
}

static void expect_fail(const char *what, const char *cfg, const char *want) {
    e2e_result r = e2e_runf("train %s --out %s", cfg, e2e_path("bad-run"));
    CHECK(r.rc == 2 && strstr(r.err, want), "%s: exit %d (want 2), want '%s' in: %s", what, r.rc,
          want, r.err);
    printf("%-12s -> %s", what, r.err);
    e2e_done(&r);
}

int main(void) {
#ifndef TESSEL_HAVE_ONNX
    puts("e2e onnx_lm: built without ONNX support, skipped");
    return 77;
#endif
    char dir[64];
    if (!e2e_setup("onnx-lm", dir, sizeof dir)) return check_summary("e2e onnx_lm");
    /* A token file (uint16) of a repeating pattern the model can learn. */
    FILE *f = fopen(e2e_path("tokens.bin"), "wb");
    CHECK(f != NULL, "tokens.bin");
    for (int i = 0; f && i < 4096; i++) {
        const unsigned short t = (unsigned short)((i * 7 + i / 13) % 64);
        fwrite(&t, 2, 1, f);
    }
    if (f) fclose(f);
    e2e_sh("cp " FIX "gpt.onnx %s", e2e_path("gpt.onnx"));
    char sha[65];
    sha256_of(e2e_path("gpt.onnx"), sha);
    char lm[1200]; /* data.path is read from the working directory: absolute */
    snprintf(lm, sizeof lm,
             "model: {name: onnx_lm, onnx: gpt.onnx, batch: 4}\n"
             "data: {source: tokens, path: %s, val_fraction: 0.1}\n"
             "train: {steps: 40, optimizer: adamw, lr: 0.003, seed: 1}\n"
             "ckpt: {every: 40}\n",
             e2e_path("tokens.bin"));
    write_text(e2e_path("lm.yaml"), lm);
    const char *run = e2e_path("run");
    e2e_result r = e2e_runf("train %s --out %s", e2e_path("lm.yaml"), run);
    CHECK(r.rc == 0, "train onnx_lm: exit %d: %s", r.rc, r.err);
    double first = 0, last = 0;
    const char *d = strstr(r.out, "done: ");
    CHECK(d && sscanf(d, "done: %*d steps in %*f s, loss %lf -> %lf", &first, &last) == 2,
          "a done line in: %s", r.out);
    CHECK(last < first - 0.3, "the loss falls: %.4f -> %.4f", first, last);
    printf("onnx_lm: loss %.4f -> %.4f\n", first, last);
    e2e_done(&r);
    char path[600], want[200];
    snprintf(want, sizeof want, "onnx_sha256: \"%s\"", sha);
    snprintf(path, sizeof path, "%s/config.yaml", run);
    char *text = e2e_slurp(path, NULL);
    CHECK(strstr(text, want) && strstr(text, "ctx: 16") && strstr(text, "vocab: 64"),
          "config.yaml records %s, ctx 16 and vocab 64:\n%s", want, text);
    free(text);
    snprintf(path, sizeof path, "%s/lineage.json", run);
    text = e2e_slurp(path, NULL);
    snprintf(want, sizeof want, "\"sha256\": \"%s\"", sha);
    CHECK(strstr(text, want) && strstr(text, "\"role\": \"model\"") && strstr(text, "gpt.onnx"),
          "lineage.json names the model file and its hash:\n%s", text);
    free(text);
    snprintf(path, sizeof path, "%s/step-00000040/manifest.json", run);
    text = e2e_slurp(path, NULL);
    snprintf(want, sizeof want, "\"%s\"", sha);
    CHECK(strstr(text, want) && strstr(text, "gpt.onnx"),
          "the checkpoint's manifest has the model file in its data lineage");
    free(text);

    /* The run's config pins the file: another model there is refused. */
    e2e_sh("cp " FIX "mlp.onnx %s", e2e_path("gpt.onnx"));
    snprintf(path, sizeof path, "%s/config.yaml", run);
    expect_fail("changed file", path, "changed: its SHA-256 is");
    char cwd[400], cfg[1200];
    CHECK(getcwd(cwd, sizeof cwd) != NULL, "getcwd");
    snprintf(cfg, sizeof cfg, "model: {name: onnx_lm, onnx: %s/" FIX "gpt.onnx, ctx: 8}\n", cwd);
    write_text(e2e_path("ctx.yaml"), cfg);
    expect_fail("ctx", e2e_path("ctx.yaml"), "model.ctx is 8, but the input 'x'");
    snprintf(cfg, sizeof cfg, "model: {name: onnx_lm, onnx: %s/" FIX "gpt.onnx, vocab: 50}\n", cwd);
    write_text(e2e_path("vocab.yaml"), cfg);
    expect_fail("vocab", e2e_path("vocab.yaml"), "model.vocab is 50, but the logits 'logits'");
    snprintf(cfg, sizeof cfg, "model: {name: onnx_lm, onnx: %s/" FIX "mlp.onnx}\n", cwd);
    write_text(e2e_path("mlp.yaml"), cfg);
    expect_fail("not an LM", e2e_path("mlp.yaml"), "an onnx_lm model takes token ids 'x'");
    snprintf(cfg, sizeof cfg,
             "model: {name: onnx_lm, onnx: %s/" FIX "gpt.onnx}\n"
             "data: {source: npy, x: x.npy, y: y.npy}\n",
             cwd);
    write_text(e2e_path("npy.yaml"), cfg);
    expect_fail("npy data", e2e_path("npy.yaml"), "an onnx_lm model reads token files");
    /* A dynamic sequence axis takes model.ctx; without it, an error. */
    snprintf(cfg, sizeof cfg,
             "model: {name: onnx_lm, onnx: %s/" FIX "gpt_seq.onnx, ctx: 8, batch: 3}\n"
             "train: {steps: 3}\n",
             cwd);
    write_text(e2e_path("seq.yaml"), cfg);
    r = e2e_runf("train %s --out %s", e2e_path("seq.yaml"), e2e_path("seq-run"));
    CHECK(r.rc == 0 && strstr(r.out, "done: 3 steps"), "ctx 8 on a dynamic axis: exit %d: %s", r.rc,
          r.err);
    e2e_done(&r);
    snprintf(cfg, sizeof cfg, "model: {name: onnx_lm, onnx: %s/" FIX "gpt_seq.onnx}\n", cwd);
    write_text(e2e_path("noseq.yaml"), cfg);
    expect_fail("no ctx", e2e_path("noseq.yaml"),
                "dimension 1 ('seq') is dynamic and no value was given (set model.ctx");
    e2e_cleanup(dir);
    return check_summary("e2e onnx_lm");
}
