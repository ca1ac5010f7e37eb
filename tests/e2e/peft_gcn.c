/* Few-shot GCN fine-tuning with LoRA and adapters through `tessel train`
 * (examples/gcn_lora.yaml, docs/peft.md), end to end:
 *
 * - the base GCN is pretrained on x_pretrain (200 labelled nodes);
 * - the fine-tuning run (x_finetune, ten labelled nodes; LoRA r=2 on both
 *   graph convolutions' weights, an adapter after the first) starts at the
 *   frozen base's loss, prints the trainable share (234 of 429) and ends
 *   with a test accuracy on the 200 held-out nodes well above the frozen
 *   base's (the same run with lr 0): the metric is the accuracy of the
 *   test split, printed at the end of the run;
 * - its checkpoint holds the adapter tensors; `tessel export --peft` and
 *   `--merge` refuse it naming an adapter tensor (peft has no such type);
 * - an adapter after a layer that does not exist, or a bad bottleneck
 *   width, exits 2 naming the key and the value. */
#include <stdlib.h>
#include <string.h>
#include "check.h"
#include "e2e.h"

static char dir[64];

#define FT "examples/gcn_lora.yaml"
#define PRE                                                                                        \
    FT " --set peft.lora.targets=none --set peft.adapter.after=none --set peft.base=none "         \
       "--set data.x=examples/data/gcn_fewshot/x_pretrain.npy "                                    \
       "--set data.node_split=examples/data/gcn_fewshot/split_pretrain.npy"

static void expect_fail(const char *what, e2e_result r, const char *n1, const char *n2) {
    CHECK(r.rc == 2, "%s: exit %d, expected 2\n%s", what, r.rc, r.err);
    CHECK(strstr(r.err, n1) != NULL, "%s: '%s' not in: %s", what, n1, r.err);
    if (n2) CHECK(strstr(r.err, n2) != NULL, "%s: '%s' not in: %s", what, n2, r.err);
    e2e_done(&r);
}

/* The accuracy of the final "test" eval line, or -1. */
static double test_accuracy(const char *out) {
    const char *p = strstr(out, " test loss ");
    double loss = -1, acc = -1;
    if (p && sscanf(p, " test loss %lf accuracy %lf", &loss, &acc) == 2) return acc;
    return -1;
}

static double first_loss(const char *out) {
    const char *p = strstr(out, "done: ");
    p = p ? strstr(p, "loss ") : NULL;
    double l = -1;
    if (p) sscanf(p, "loss %lf", &l);
    return l;
}

static void test_fewshot(void) {
    e2e_result r = e2e_runf("train " PRE " --set ckpt.every=200 --out %s", e2e_path("base"));
    CHECK(r.rc == 0, "pretraining: exit %d\n%s", r.rc, r.err);
    const double pre_acc = test_accuracy(r.out);
    CHECK(pre_acc >= 85, "the base learns its own task: test accuracy %.2f %%", pre_acc);
    e2e_done(&r);

    r = e2e_runf("train " FT " --set train.lr=0 --set peft.base=%s", e2e_path("base"));
    CHECK(r.rc == 0, "frozen base: exit %d\n%s", r.rc, r.err);
    const double frozen = test_accuracy(r.out), frozen_loss = first_loss(r.out);
    e2e_done(&r);

    r = e2e_runf("train " FT " --set peft.base=%s --set ckpt.every=200 --out %s", e2e_path("base"),
                 e2e_path("ft"));
    CHECK(r.rc == 0, "fine-tuning: exit %d\n%s", r.rc, r.err);
    const double tuned = test_accuracy(r.out), tuned_loss = first_loss(r.out);
    /* base 8*16 + 16 + 16*3 + 3 = 195; LoRA 2*8 + 16*2 + 2*16 + 3*2 = 86;
     * adapter 4*16 + 4 + 16*4 + 16 = 148 */
    CHECK(strstr(r.out, "peft: trainable 234 of 429 parameters (54.55 %)") != NULL,
          "trainable share printed: %s", r.out);
    e2e_done(&r);
    CHECK(tuned_loss == frozen_loss && frozen_loss > 0,
          "step 1 of the fine-tuning is the frozen base's: %.9g vs %.9g", tuned_loss, frozen_loss);
    CHECK(frozen >= 0 && tuned >= frozen + 30 && tuned >= 75,
          "held-out test accuracy: fine-tuned %.2f %% vs frozen base %.2f %%", tuned, frozen);
    printf("gcn few-shot: test accuracy %.2f %% fine-tuned, %.2f %% frozen base\n", tuned, frozen);
    char *sum = e2e_slurp(e2e_path("ft/summary.json"), NULL);
    CHECK(sum && strstr(sum, "\"trainable\": 234") && strstr(sum, "\"total\": 429"),
          "summary.json: %s", sum ? sum : "(none)");
    free(sum);

    expect_fail("export --peft with adapters",
                e2e_runf("export %s --peft %s", e2e_path("ft"), e2e_path("adapter")),
                "lin1.weight.adapter_", "no Houlsby adapter type");
    expect_fail("export --merge with adapters",
                e2e_runf("export %s --merge --safetensors %s", e2e_path("ft"),
                         e2e_path("merged.safetensors")),
                "cannot be folded", NULL);
}

static void test_config_errors(void) {
    expect_fail(
        "adapter after a missing layer",
        e2e_run("compile " FT " --set peft.base=none --set 'peft.adapter.after=lin1, conv3'"),
        "peft.adapter.after: 'conv3' matches no layer", "lin1.weight, lin2.weight");
    expect_fail("hidden 0",
                e2e_run("compile " FT " --set peft.base=none --set peft.adapter.hidden=0"),
                "peft.adapter.hidden", NULL);
    expect_fail("unknown activation",
                e2e_run("compile " FT " --set peft.base=none --set peft.adapter.activation=swish"),
                "peft.adapter.activation", "swish");
}

int main(void) {
    if (!e2e_setup("peft_gcn", dir, sizeof dir)) return check_summary("e2e/peft_gcn");
    test_fewshot();
    test_config_errors();
    e2e_cleanup(dir);
    return check_summary("e2e/peft_gcn");
}
