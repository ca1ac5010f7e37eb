/* Every example trains to the same bits on 1 and 2 threads: `tessel train examples/X.yaml` for
 * two steps with train.threads 1 and 2, then `tessel ckpt diff` (every tensor identical). The
 * shapes are the examples' own (W3 with one of its six layers: the same GEMMs), since which
 * kernels split a reduction between threads depends on them: the GRU of W2 differed in its
 * first layer's input weights until the long-K weight gradients ran in fixed K blocks
 * (src/backends/cpu/dnnl_matmul_ksplit.h). An example added to examples/ without a row here
 * fails the test. */
#include <dirent.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include "backends/cpu/dnnl_caps.h"
#include "check.h"
#include "e2e.h"

static char dir[64];

static const char *const fashion = "/usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz";

static const struct {
    const char *tag, *file, *sets;
    int needs_fashion;
} examples[] = {
    {"alerts", "alerts", "", 0},
    {"breast_cancer", "breast_cancer", "--set train.epochs=0", 0},
    {"fashion_cnn", "fashion_cnn", "--set train.epochs=0 --set data.val_fraction=0", 1},
    {"fashion_mnist", "fashion_mnist", "--set train.epochs=0 --set data.val_fraction=0", 1},
    /* the multi-sensor model: conv + BatchNorm, a GRU and an MLP in one step */
    {"fusion", "fusion", "", 0},
    /* the same with a validity mask and random source dropout */
    {"fusion_dropout", "fusion_dropout", "", 0},
    /* the same with the source flags read from data.valid */
    {"fusion_valid", "fusion_valid", "", 0},
    /* the pretraining run its comment gives (the fine-tuning run needs its checkpoint) */
    {"gcn_lora", "gcn_lora",
     "--set peft.lora.targets=none --set peft.adapter.after=none --set peft.base=none --set "
     "data.x=examples/data/gcn_fewshot/x_pretrain.npy --set "
     "data.node_split=examples/data/gcn_fewshot/split_pretrain.npy",
     0},
    {"lora_mlp", "lora_mlp", "", 0},
    /* 2 pipeline stages, one process each (dist.procs 2 in the file) */
    {"pipeline", "pipeline", "", 0},
    {"tiny_gpt", "tiny_gpt", "", 0},
    {"w1", "w1", "", 0},
    {"w1_dist", "w1_dist", "", 0},
    {"w2", "w2", "", 0},
    {"w2_lstm", "w2", "--set model.name=lstm", 0},
    {"w3", "w3", "--set model.n_layers=1", 0},
    {"w3_bf16", "w3_bf16", "--set model.n_layers=1", 0},
    {"w4", "w4", "", 0},
    {"w4_bf16", "w4_bf16", "", 0},
    {"w5", "w5", "", 0},
};
enum { N_EXAMPLES = sizeof examples / sizeof *examples };

static int train(const char *run, int i, int threads) {
    e2e_result r = e2e_runf("train examples/%s.yaml %s --steps 2 --set train.threads=%d --set "
                            "train.eval_every=0 --set alerts.defaults=false --set ckpt.every=2 "
                            "--out %s/%s",
                            examples[i].file, examples[i].sets, threads, dir, run);
    /* A bf16 model with matmuls is refused (exit 2, precision.default named) where oneDNN has
     * no bf16 matmul (no AVX-512): skip that example, not fail. */
    if (r.rc == 2 && !ts_cpu_supports_dtype_gemm(TS_BF16) &&
        strstr(r.err, "precision.default: bf16")) {
        printf("%s skipped: %s\n", run, ts_cpu_dtype_gemm_why(TS_BF16));
        e2e_done(&r);
        return -1;
    }
    CHECK(r.rc == 0, "%s: exit %d: %s", run, r.rc, r.err);
    const int rc = r.rc;
    e2e_done(&r);
    return rc;
}

/* Every .yaml file in examples/ has a row. */
static void check_listed(void) {
    DIR *d = opendir("examples");
    CHECK(d != NULL, "examples/ can be listed");
    if (!d) return;
    struct dirent *e;
    while ((e = readdir(d))) {
        size_t n = strlen(e->d_name);
        if (n < 6 || strcmp(e->d_name + n - 5, ".yaml")) continue;
        int found = 0;
        for (int i = 0; i < N_EXAMPLES && !found; i++)
            found =
                strlen(examples[i].file) == n - 5 && !strncmp(examples[i].file, e->d_name, n - 5);
        CHECK(found, "examples/%s has a row in tests/e2e/threads_bits.c", e->d_name);
    }
    closedir(d);
}

int main(void) {
    if (!e2e_setup("threads_bits", dir, sizeof dir)) return check_summary("e2e/threads_bits");
    check_listed();
    const int have_fashion = access(fashion, R_OK) == 0;
    for (int i = 0; i < N_EXAMPLES; i++) {
        if (examples[i].needs_fashion && !have_fashion) {
            printf("%s skipped: Fashion-MNIST is not installed\n", examples[i].tag);
            continue;
        }
        char a[80], b[80];
        snprintf(a, sizeof a, "%s-t1", examples[i].tag);
        snprintf(b, sizeof b, "%s-t2", examples[i].tag);
        if (train(a, i, 1) || train(b, i, 2)) continue;
        e2e_result r =
            e2e_runf("ckpt diff %s/%s/step-00000002 %s/%s/step-00000002", dir, a, dir, b);
        const char *p = strstr(r.out, " identical, 0 different");
        CHECK(r.rc == 0 && p, "%s: 1 and 2 threads give the same tensors:\n%s%s", examples[i].tag,
              r.out, r.err);
        e2e_done(&r);
    }
    e2e_cleanup(dir);
    return check_summary("e2e/threads_bits");
}
