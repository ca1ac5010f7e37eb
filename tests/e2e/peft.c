/* LoRA fine-tuning through `tessel train` and `tessel compile`, end to end
 * ($TESSEL_BIN, run from the repository root; docs/peft.md):
 *
 * - a small MLP is trained from scratch with a checkpoint; a second run
 *   with peft.lora.targets and peft.base on that checkpoint starts at the
 *   base model's loss on the same batch, lowers it, prints the trainable
 *   share and writes it to summary.json; its final checkpoint holds the
 *   LoRA tensors and their optimizer state only and refers to the base by
 *   its SHA-256; its merged export keeps every unpatched frozen tensor
 *   bit-identical to the base's;
 * - a PEFT run resumed from its checkpoint ends bit-identical to the whole run;
 * - the same base as a safetensors file (tessel export) gives the same run;
 * - `tessel compile --dump memory` shows the gradients and optimizer state
 *   shrink;
 * - config errors exit 2 naming the key and value: a target that matches
 *   nothing (listing the weights), a bad regex, r < 1, a base of another
 *   shape (listing the mis-shaped tensors), a base that does not exist. */
#include <stdlib.h>
#include <string.h>
#include "check.h"
#include "e2e.h"
#include "ckpt/safetensors.h"
#include "tessel/ckpt.h"

static char dir[64];

#define MODEL                                                                                      \
    "examples/w1.yaml --set model.hidden=32 --set model.window=4 --set model.features=8 --set "    \
    "model.batch=32"
#define LORA " --set 'peft.lora.targets=net\\.[036]\\.weight' --set train.lr=1e-2"

static void expect_fail(const char *what, e2e_result r, const char *n1, const char *n2) {
    CHECK(r.rc == 2, "%s: exit %d, expected 2\n%s", what, r.rc, r.err);
    CHECK(strstr(r.err, n1) != NULL, "%s: '%s' not in: %s", what, n1, r.err);
    if (n2) CHECK(strstr(r.err, n2) != NULL, "%s: '%s' not in: %s", what, n2, r.err);
    e2e_done(&r);
}

/* "loss A -> B" of the done line. */
static int losses(const char *out, double *first, double *last) {
    const char *p = strstr(out, "done: ");
    p = p ? strstr(p, "loss ") : NULL;
    return p && sscanf(p, "loss %lf -> %lf", first, last) == 2;
}

/* The first-step loss printed by the step-1 line. */
static double step1_loss(const char *out) {
    const char *p = strstr(out, "step 1/");
    double l = -1;
    if (p) p = strstr(p, "loss ");
    if (p) sscanf(p, "loss %lf", &l);
    return l;
}

static const char *const BASE[] = {"net.0.weight", "net.0.bias", "net.2.weight", "net.2.bias",
                                   "net.3.weight", "net.3.bias", "net.5.weight", "net.5.bias",
                                   "net.6.weight", "net.6.bias"};
enum { N_BASE = 10 };

/* Checkpoint b of a PEFT run on base a holds the LoRA tensors and their
 * optimizer state only, and refers to a by the SHA-256 of its manifest
 * (docs/peft.md); its merged export keeps every tensor LoRA does not
 * patch bit-identical to a's: the frozen weights never moved. */
static void same_base(const char *a_path, const char *b_path) {
    ts_ckpt *a = NULL, *b = NULL;
    CHECK_OK(ts_ckpt_open(a_path, NULL, NULL, &a));
    CHECK_OK(ts_ckpt_open(b_path, NULL, NULL, &b));
    if (!a || !b) goto out;
    ts_ckpt_info ia, ib;
    CHECK_OK(ts_ckpt_get_info(a, &ia));
    CHECK_OK(ts_ckpt_get_info(b, &ib));
    char manifest[600], sha[65] = "";
    snprintf(manifest, sizeof manifest, "%s/manifest.json", ia.dir);
    CHECK_OK(ts_sha256_file(manifest, sha));
    CHECK(!strcmp(ib.base_path, ia.dir) && !strcmp(ib.base_sha256, sha) && ib.n_frozen == N_BASE,
          "the checkpoint refers to its base: '%s' sha256 %s, %d frozen (want '%s' %s %d)",
          ib.base_path, ib.base_sha256, ib.n_frozen, ia.dir, sha, N_BASE);
    int lineage = 0;
    for (int i = 0; i < ib.n_data_files; i++)
        lineage += !strcmp(ib.data_files[i].path, ia.dir) && !strcmp(ib.data_files[i].sha256, sha);
    CHECK(lineage == 1, "the base is in the manifest's lineage");
    int lora = 0, other = 0;
    for (int k = 0; k < ts_ckpt_tensor_count(b); k++) {
        ts_ckpt_tensor t;
        if (ts_ckpt_tensor_info(b, k, &t) != TS_OK) continue;
        lora += strstr(t.name, ".lora_") != NULL && !t.is_state;
        other += !strstr(t.name, ".lora_");
    }
    CHECK(lora == 6, "6 LoRA tensors in the fine-tuned checkpoint, got %d", lora);
    CHECK(other == 0, "no frozen tensor and no state of one in it, got %d", other);
    char merged[300];
    snprintf(merged, sizeof merged, "%s.merged.safetensors", b_path);
    e2e_result r = e2e_runf("export %s --merge --safetensors %s", b_path, merged);
    CHECK(r.rc == 0, "merge: exit %d\n%s", r.rc, r.err);
    e2e_done(&r);
    ts_st_file *m = NULL;
    CHECK_OK(ts_st_open(merged, &m));
    for (int i = 0; i < N_BASE && m; i++) {
        if (strstr(BASE[i], "weight") && strstr("net.0.weight net.3.weight net.6.weight", BASE[i]))
            continue; /* patched: W + s B A */
        ts_st_tensor t;
        char *x = NULL;
        CHECK_OK(ts_st_find(m, BASE[i], &t));
        if (t.bytes && (x = malloc(t.bytes))) {
            CHECK_OK(ts_ckpt_read(a, BASE[i], x, t.bytes));
            CHECK(!memcmp(x, t.data, t.bytes), "frozen %s equals the base bit for bit", BASE[i]);
        }
        free(x);
    }
    ts_st_close(m);
out:
    ts_ckpt_close(a);
    ts_ckpt_close(b);
}

static void test_finetune(void) {
    e2e_result r =
        e2e_runf("train " MODEL " --steps 20 --set ckpt.every=20 --out %s", e2e_path("base"));
    CHECK(r.rc == 0, "base run: exit %d\n%s", r.rc, r.err);
    e2e_done(&r);
    /* the base model's loss on the fine-tuning run's first batch */
    r = e2e_runf("train " MODEL " --steps 1 --set train.lr=0 --set peft.base=%s", e2e_path("base"));
    CHECK(r.rc == 0, "base on step 1: exit %d\n%s", r.rc, r.err);
    const double base_loss = step1_loss(r.out);
    e2e_done(&r);

    r = e2e_runf("train " MODEL LORA " --steps 60 --set ckpt.every=60 --set peft.base=%s --out %s",
                 e2e_path("base"), e2e_path("lora"));
    CHECK(r.rc == 0, "LoRA run: exit %d\n%s", r.rc, r.err);
    double first = 0, last = 0;
    CHECK(losses(r.out, &first, &last), "done line in: %s", r.out);
    CHECK(first == base_loss && base_loss > 0, "step 1 is the base model's: %.9g vs %.9g", first,
          base_loss);
    CHECK(last < 0.2 * first, "the loss drops: %g -> %g", first, last);
    /* 3561 parameters; LoRA r=8: A 8x32 + B 32x8, twice, + A 8x32 + B 1x8 */
    CHECK(strstr(r.out, "peft: trainable 1288 of 3561 parameters (36.17 %)") != NULL,
          "trainable share printed: %s", r.out);
    e2e_done(&r);
    char *sum = e2e_slurp(e2e_path("lora/summary.json"), NULL);
    CHECK(strstr(sum, "\"trainable\": 1288") && strstr(sum, "\"total\": 3561") &&
              strstr(sum, "\"trainable_percent\": 36.169"),
          "summary.json: %s", sum);
    free(sum);
    char a[256], b[256];
    snprintf(a, sizeof a, "%s", e2e_path("base"));
    snprintf(b, sizeof b, "%s", e2e_path("lora"));
    same_base(a, b);

    /* a PEFT run resumed from its checkpoint ends where the whole run ends */
    r = e2e_runf("train " MODEL LORA " --steps 30 --set train.total_steps=60 --set ckpt.every=30 "
                 "--set peft.base=%s --out %s",
                 e2e_path("base"), e2e_path("half"));
    CHECK(r.rc == 0, "first half: exit %d\n%s", r.rc, r.err);
    e2e_done(&r);
    r = e2e_runf("train " MODEL LORA " --set train.total_steps=60 --set ckpt.every=30 "
                 "--set peft.base=%s --steps 60 --resume latest --out %s",
                 e2e_path("base"), e2e_path("half"));
    CHECK(r.rc == 0, "resume: exit %d\n%s", r.rc, r.err);
    e2e_done(&r);
    r = e2e_runf("ckpt diff %s %s", e2e_path("lora"), e2e_path("half"));
    CHECK(r.rc == 0, "resumed PEFT run equals the whole run: exit %d\n%s%s", r.rc, r.out, r.err);
    e2e_done(&r);

    /* the base as a safetensors file: the same run */
    r = e2e_runf("export %s --safetensors %s", e2e_path("base"), e2e_path("base.safetensors"));
    CHECK(r.rc == 0, "export: exit %d\n%s", r.rc, r.err);
    e2e_done(&r);
    r = e2e_runf("train " MODEL LORA " --steps 60 --set peft.base=%s",
                 e2e_path("base.safetensors"));
    double f2 = 0, l2 = 0;
    CHECK(r.rc == 0 && losses(r.out, &f2, &l2), "safetensors base: exit %d\n%s", r.rc, r.err);
    CHECK(f2 == first && l2 == last, "same losses from the safetensors base: %g %g vs %g %g", f2,
          l2, first, last);
    e2e_done(&r);

    /* a base of another shape; one that is not there */
    expect_fail("mis-shaped base",
                e2e_runf("train " MODEL LORA " --set model.hidden=16 --steps 2 --set peft.base=%s",
                         e2e_path("base")),
                "does not fit the model",
                "'net.0.weight' is f32[32, 32] in the base, f32[16, 32] in the model");
    expect_fail("missing tensors",
                e2e_runf("train " MODEL LORA " --set model.n_hidden=3 --steps 2 --set peft.base=%s",
                         e2e_path("base")),
                "does not fit the model", "'net.9.weight' f32[1, 32] missing");
    expect_fail("no base",
                e2e_runf("train " MODEL LORA " --steps 2 --set peft.base=%s", e2e_path("nothing")),
                "peft.base: cannot read", NULL);
}

/* --dump memory: frozen weights have no gradients and no optimizer state. */
static size_t region(const char *out, const char *name) {
    const char *p = strstr(out, name);
    unsigned long long v = 0;
    if (p) sscanf(p + strlen(name), " %llu", &v);
    return (size_t)v;
}

static void test_memory(void) {
    e2e_result full = e2e_run("compile examples/w1.yaml --dump memory");
    e2e_result lora =
        e2e_run("compile examples/w1.yaml --dump memory --set 'peft.lora.targets=weight'");
    CHECK(full.rc == 0 && lora.rc == 0, "compile: %s%s", full.err, lora.err);
    const size_t gf = region(full.out, "  grads"), gl = region(lora.out, "  grads");
    const size_t sf = region(full.out, "  opt state"), sl = region(lora.out, "  opt state");
    const size_t af = region(full.out, "arena"), al = region(lora.out, "arena");
    CHECK(gf > 0 && gl > 0 && gl * 20 < gf, "gradients %zu -> %zu bytes", gf, gl);
    CHECK(sf > 0 && sl > 0 && sl * 20 < sf, "optimizer state %zu -> %zu bytes", sf, sl);
    CHECK(al < af / 2, "arena %zu -> %zu bytes", af, al);
    e2e_done(&full);
    e2e_done(&lora);
}

static void test_config_errors(void) {
    expect_fail("unmatched target",
                e2e_run("compile " MODEL " --set 'peft.lora.targets=net, attn'"),
                "peft.lora.targets: 'attn' matches no matmul weight",
                "net.0.weight, net.3.weight, net.6.weight");
    expect_fail("bad regex", e2e_run("compile " MODEL " --set 'peft.lora.targets=net(' "),
                "peft.lora.targets: 'net(' is not a valid regular expression", NULL);
    expect_fail("r = 0",
                e2e_run("compile " MODEL " --set peft.lora.targets=net --set peft.lora.r=0"),
                "peft.lora.r", "'0'");
}

int main(void) {
    if (!e2e_setup("peft", dir, sizeof dir)) return check_summary("e2e/peft");
    test_finetune();
    test_memory();
    test_config_errors();
    e2e_cleanup(dir);
    return check_summary("e2e/peft");
}
