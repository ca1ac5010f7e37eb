/* Checkpoints of a PEFT run on a base (docs/peft.md), end to end: they
 * hold the trainable tensors and their optimizer state only, refer to the
 * base by its SHA-256 (manifest "base" and lineage, shown by `ckpt
 * inspect`), are a fraction of the base's size, pass `ckpt verify` and
 * `ckpt diff`, resume bit-identically, and export with --peft and --merge
 * (frozen weights read from the base). A base whose bytes changed since
 * is refused on resume and by export, naming the file; a missing one too. */
#include <stdlib.h>
#include <string.h>
#include "check.h"
#include "e2e.h"
#include "tessel/ckpt.h"

static char dir[64];

#define MODEL                                                                                      \
    "examples/w1.yaml --set model.hidden=32 --set model.window=4 --set model.features=8 --set "    \
    "model.batch=32"
#define LORA " --set 'peft.lora.targets=net\\.[036]\\.weight' --set train.lr=1e-2"

static void expect_fail(const char *what, e2e_result r, const char *n1, const char *n2) {
    CHECK(r.rc != 0, "%s: exit %d, expected a failure\n%s", what, r.rc, r.err);
    CHECK(strstr(r.err, n1) != NULL, "%s: '%s' not in: %s", what, n1, r.err);
    if (n2) CHECK(strstr(r.err, n2) != NULL, "%s: '%s' not in: %s", what, n2, r.err);
    e2e_done(&r);
}

static void ok(const char *what, e2e_result r) {
    CHECK(r.rc == 0, "%s: exit %d\n%s%s", what, r.rc, r.out, r.err);
    e2e_done(&r);
}

static uint64_t ckpt_bytes(const char *path) {
    ts_ckpt *c = NULL;
    ts_ckpt_info in = {0};
    if (ts_ckpt_open(path, NULL, NULL, &c) != TS_OK) return 0;
    ts_ckpt_get_info(c, &in);
    uint64_t b = in.bytes;
    ts_ckpt_close(c);
    return b;
}

int main(void) {
    if (!e2e_setup("peft_ckpt", dir, sizeof dir)) return check_summary("e2e/peft_ckpt");
    char base[200], other[200], sha[65] = "";
    snprintf(base, sizeof base, "%s", e2e_path("base.safetensors"));
    snprintf(other, sizeof other, "%s", e2e_path("other.safetensors"));
    ok("base run",
       e2e_runf("train " MODEL " --steps 20 --set ckpt.every=20 --out %s", e2e_path("b")));
    ok("export base", e2e_runf("export %s --safetensors %s", e2e_path("b"), base));
    ok("other base run", e2e_runf("train " MODEL " --steps 20 --set train.seed=5 --set "
                                  "ckpt.every=20 --out %s",
                                  e2e_path("b2")));
    ok("export other", e2e_runf("export %s --safetensors %s", e2e_path("b2"), other));
    CHECK_OK(ts_sha256_file(base, sha));

    /* the whole run and its first half, resumed */
    ok("whole", e2e_runf("train " MODEL LORA " --steps 40 --set ckpt.every=20 --set "
                         "peft.base=%s --out %s",
                         base, e2e_path("whole")));
    ok("half", e2e_runf("train " MODEL LORA " --steps 20 --set train.total_steps=40 --set "
                        "ckpt.every=20 --set peft.base=%s --out %s",
                        base, e2e_path("half")));
    e2e_result r = e2e_runf("ckpt inspect %s", e2e_path("half"));
    CHECK(r.rc == 0 && strstr(r.out, "peft base ") && strstr(r.out, sha) &&
              strstr(r.out, "10 frozen parameters left to it") && !strstr(r.out, "net.0.bias"),
          "inspect shows the base and no frozen tensor:\n%s%s", r.out, r.err);
    e2e_done(&r);
    ok("verify", e2e_runf("ckpt verify %s", e2e_path("half")));
    const uint64_t lb = ckpt_bytes(e2e_path("half")), bb = ckpt_bytes(e2e_path("b"));
    /* base: 2273 parameters and two AdamW moments; LoRA: 1288 and two moments */
    CHECK(lb > 0 && bb > 0 && lb == 1288 * 4 * 3 && bb == 2273 * 4 * 3,
          "checkpoint bytes: PEFT %llu, base %llu", (unsigned long long)lb, (unsigned long long)bb);

    /* a changed base: refused on resume and by export, naming it */
    e2e_sh("cp %s %s.saved && cp %s %s", base, base, other, base);
    expect_fail("resume on a changed base",
                e2e_runf("train " MODEL LORA " --steps 40 --set train.total_steps=40 --set "
                         "ckpt.every=20 --set peft.base=%s --resume latest --out %s",
                         base, e2e_path("half")),
                "refers to the base", "base.safetensors has sha256");
    expect_fail(
        "--merge on a changed base",
        e2e_runf("export %s --merge --safetensors %s", e2e_path("half"), e2e_path("m.safetensors")),
        "base.safetensors has sha256", "frozen weights");
    expect_fail("--peft on a changed base",
                e2e_runf("export %s --peft %s", e2e_path("half"), e2e_path("adapter")),
                "base.safetensors has sha256", NULL);
    e2e_sh("mv %s %s.moved", base, base);
    expect_fail(
        "--merge without the base",
        e2e_runf("export %s --merge --safetensors %s", e2e_path("half"), e2e_path("m.safetensors")),
        "cannot read", "base.safetensors");
    e2e_sh("cp %s.saved %s", base, base);

    /* the same base again: resume, diff, export */
    ok("resume", e2e_runf("train " MODEL LORA " --steps 40 --set train.total_steps=40 --set "
                          "ckpt.every=20 --set peft.base=%s --resume latest --out %s",
                          base, e2e_path("half")));
    ok("resumed run equals the whole run",
       e2e_runf("ckpt diff %s %s", e2e_path("whole"), e2e_path("half")));
    r = e2e_runf("ckpt diff %s %s", e2e_path("whole"), e2e_path("b"));
    CHECK(r.rc != 0, "diff of a PEFT checkpoint and its base tells them apart: exit %d", r.rc);
    e2e_done(&r);
    ok("--peft", e2e_runf("export %s --peft %s", e2e_path("half"), e2e_path("adapter")));
    ok("--merge",
       e2e_runf("export %s --merge --safetensors %s", e2e_path("half"), e2e_path("m.safetensors")));
    e2e_cleanup(dir);
    return check_summary("e2e/peft_ckpt");
}
