/* Training with checkpoints through `tessel train`, end to end ($TESSEL_BIN,
 * run from the repository root):
 *
 * - a tiny GPT with dropout, AdamW and a warm-up + cosine schedule: 20 steps
 *   in one run vs 10 steps (ckpt.every=10) then `--resume latest` to 20 in
 *   the same run directory give byte-identical final checkpoints (compared
 *   by `tessel ckpt diff` and by the exported safetensors files);
 *   `tessel audit verify` passes on the resumed run, whose audit.log holds
 *   config and resume entries and whose metrics.jsonl was appended to;
 * - an MLP on a shuffled CSV crossing an epoch: `--resume step-N` into a new
 *   run directory seeks the loader and reproduces the uninterrupted run;
 * - a flipped byte in a shard makes `--resume latest` fail with exit 2
 *   naming the file and the tensor, and leaves the run directory untouched;
 *   so does a changed config (naming both hashes); `--resume latest` needs
 *   an existing run directory, and a new run still refuses a used one. */
#include <stdarg.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>
#include "check.h"
#include "e2e.h"

static const char *bin;
static char dir[64];

static void expect_ok(const char *what, e2e_result r) {
    CHECK(r.rc == 0, "%s: exit %d\n%s%s", what, r.rc, r.out, r.err);
    e2e_done(&r);
}

/* Exit 2 with every needle in stderr. */
static void expect_fail(const char *what, e2e_result r, const char *n1, const char *n2) {
    CHECK(r.rc == 2, "%s: exit %d, expected 2\n%s", what, r.rc, r.err);
    CHECK(strstr(r.err, n1) != NULL, "%s: '%s' not in: %s", what, n1, r.err);
    if (n2) CHECK(strstr(r.err, n2) != NULL, "%s: '%s' not in: %s", what, n2, r.err);
    e2e_done(&r);
}

static void write_file(const char *name, const char *text) {
    char path[128];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    FILE *f = fopen(path, "w");
    if (f) {
        fputs(text, f);
        fclose(f);
    }
}

/* SHA-256 of every file under a run directory, sorted: its fingerprint. */
static char *snapshot(const char *run_dir) {
    char cmd[512], path[128];
    snprintf(path, sizeof path, "%s/snap", dir);
    snprintf(cmd, sizeof cmd,
             "cd '%s/%s' && find . -type f -o -type d | sort | while read f; do "
             "if [ -f \"$f\" ]; then sha256sum \"$f\"; else echo \"dir $f\"; fi; done >'%s'",
             dir, run_dir, path);
    if (system(cmd) != 0) return calloc(1, 1);
    return e2e_slurp(path, NULL);
}

/* Two safetensors files hold the same tensor bytes (the header differs in
 * its metadata: each checkpoint has its own id). */
static int same_tensors(const char *a, const char *b) {
    char pa[128], pb[128];
    snprintf(pa, sizeof pa, "%s/%s", dir, a);
    snprintf(pb, sizeof pb, "%s/%s", dir, b);
    long na = -1, nb = -2;
    char *x = e2e_slurp(pa, &na), *y = e2e_slurp(pb, &nb);
    uint64_t ha = 0, hb = 0;
    if (na >= 8) memcpy(&ha, x, 8);
    if (nb >= 8) memcpy(&hb, y, 8);
    const long da = na - 8 - (long)ha, db = nb - 8 - (long)hb;
    int same = na >= 8 && nb >= 8 && ha < (uint64_t)na && hb < (uint64_t)nb && da > 0 && da == db &&
               !memcmp(x + 8 + ha, y + 8 + hb, (size_t)da);
    free(x);
    free(y);
    return same;
}

static int count_lines(const char *text, const char *needle) {
    int n = 0;
    for (const char *p = text; (p = strstr(p, needle)); p++) n++;
    return n;
}

static void test_gpt_latest(void) {
    write_file("gpt.yaml", "model: {preset: w3, batch: 2, ctx: 16, vocab: 32, d_model: 32,\n"
                           "        n_layers: 1, n_heads: 2, dropout: 0.1}\n"
                           "train: {optimizer: adamw, lr: 3.0e-3, schedule: cosine,\n"
                           "        warmup_steps: 3, min_lr: 3.0e-4, total_steps: 20,\n"
                           "        clip_grad_norm: 1.0, steps: 20, seed: 3, threads: 1}\n"
                           "ckpt: {every: 10}\n");
    expect_ok("20 steps", e2e_runf("train %s/gpt.yaml --out %s/full", dir, dir));
    expect_ok("10 steps", e2e_runf("train %s/gpt.yaml --out %s/part --steps 10", dir, dir));
    char path[128];
    snprintf(path, sizeof path, "%s/part/metrics.jsonl", dir);
    char *before = e2e_slurp(path, NULL);

    /* A new run refuses the used directory; a resume needs one. */
    expect_fail("used run dir", e2e_runf("train %s/gpt.yaml --out %s/part", dir, dir),
                "already exists and is not empty", NULL);
    expect_fail("resume without run dir", e2e_runf("train %s/gpt.yaml --resume latest", dir),
                "--out", NULL);
    expect_fail("resume missing run dir",
                e2e_runf("train %s/gpt.yaml --resume latest --out %s/nothing", dir, dir),
                "No such file", NULL);
    /* Another learning rate is another training: refused with both hashes. */
    char *snap0 = snapshot("part");
    e2e_result r =
        e2e_runf("train %s/gpt.yaml --out %s/part --resume latest --set train.lr=1e-3", dir, dir);
    CHECK(count_lines(r.err, "sha256") >= 2 || strstr(r.err, "config sha256"),
          "mismatch names the hashes: %s", r.err);
    expect_fail("changed config", r, "config sha256", "this config's is");
    char *snap1 = snapshot("part");
    CHECK(!strcmp(snap0, snap1), "a refused resume leaves the run directory untouched");
    free(snap1);

    r = e2e_runf("train %s/gpt.yaml --out %s/part --resume latest", dir, dir);
    CHECK(r.rc == 0, "resume latest: exit %d\n%s%s", r.rc, r.out, r.err);
    CHECK(strstr(r.out, "resuming from") && strstr(r.out, "at step 10"), "resume message: %s",
          r.out);
    e2e_done(&r);
    r = e2e_runf("ckpt diff %s/full %s/part", dir, dir);
    CHECK(r.rc == 0 && strstr(r.out, "0 different"), "20 vs 10 + 10: exit %d\n%s%s", r.rc, r.out,
          r.err);
    e2e_done(&r);
    expect_ok("export full", e2e_runf("export %s/full --safetensors %s/full.st", dir, dir));
    expect_ok("export part", e2e_runf("export %s/part --safetensors %s/part.st", dir, dir));
    CHECK(same_tensors("full.st", "part.st"), "exported weights are byte-identical");
    expect_ok("audit verify", e2e_runf("audit verify %s/part", dir));

    snprintf(path, sizeof path, "%s/part/audit.log", dir);
    char *log = e2e_slurp(path, NULL);
    CHECK(count_lines(log, "\"event\":\"config\"") == 2, "two config entries");
    CHECK(count_lines(log, "\"event\":\"resume\"") == 1, "one resume entry");
    CHECK(count_lines(log, "\"event\":\"save\"") == 2, "two saves");
    free(log);
    snprintf(path, sizeof path, "%s/part/metrics.jsonl", dir);
    char *after = e2e_slurp(path, NULL);
    CHECK(!strncmp(after, before, strlen(before)) && count_lines(after, "\"type\":\"train\"") == 20,
          "metrics.jsonl appended: 20 train lines");
    free(after);
    free(before);
    snprintf(path, sizeof path, "%s/part/summary.json", dir);
    char *sum = e2e_slurp(path, NULL);
    CHECK(strstr(sum, "\"resumed_from_step\": 10") && strstr(sum, "\"steps\": 20"), "summary: %s",
          sum);
    free(sum);

    /* Tampering: one flipped byte in a parameter shard of the newest
     * checkpoint. */
    char cmd[512];
    snprintf(cmd, sizeof cmd,
             "f=$(ls %s/part/step-00000020/params-*.safetensors | head -1) && "
             "n=$(stat -c %%s \"$f\") && printf '\\377' | "
             "dd of=\"$f\" bs=1 seek=$((n - 3)) conv=notrunc status=none",
             dir);
    CHECK(system(cmd) == 0, "flip a byte");
    write_file("gpt30.yaml", "model: {preset: w3, batch: 2, ctx: 16, vocab: 32, d_model: 32,\n"
                             "        n_layers: 1, n_heads: 2, dropout: 0.1}\n"
                             "train: {optimizer: adamw, lr: 3.0e-3, schedule: cosine,\n"
                             "        warmup_steps: 3, min_lr: 3.0e-4, total_steps: 20,\n"
                             "        clip_grad_norm: 1.0, steps: 30, seed: 3, threads: 1}\n"
                             "ckpt: {every: 10}\n");
    free(snap0);
    snap0 = snapshot("part");
    r = e2e_runf("train %s/gpt30.yaml --out %s/part --resume latest", dir, dir);
    CHECK(strstr(r.err, "step-00000020/params-") && strstr(r.err, ".safetensors"),
          "names the file: %s", r.err);
    expect_fail("tampered", r, "tensor '", NULL);
    snap1 = snapshot("part");
    CHECK(!strcmp(snap0, snap1), "a tampered checkpoint leaves the run directory untouched");
    free(snap0);
    free(snap1);
}

static void test_mlp_dir(void) {
    /* 116 windows, 92 for training: 23 batches per epoch; 30 steps shuffle
     * twice, and the checkpoint at 13 is mid-epoch. */
    char path[128];
    snprintf(path, sizeof path, "%s/d.csv", dir);
    FILE *f = fopen(path, "w");
    if (!f) return;
    fputs("a,b,y\n", f);
    for (int i = 0; i < 120; i++)
        fprintf(f, "%.4f,%.4f,%.4f\n", sin(i * 0.3), cos(i * 0.7), sin(i * 0.3 + 0.5));
    fclose(f);
    char yaml[1024];
    snprintf(yaml, sizeof yaml,
             "model: {preset: w1, batch: 4, hidden: 16, n_hidden: 1}\n"
             "train: {optimizer: adamw, lr: 1.0e-2, schedule: cosine, total_steps: 30,\n"
             "        steps: 30, seed: 5, threads: 1}\n"
             "data: {source: csv, path: %s/d.csv, label: y, window: 4, val_fraction: 0.2}\n"
             "ckpt: {every: 13, keep_last: 0}\n",
             dir);
    write_file("mlp.yaml", yaml);
    expect_ok("mlp 30", e2e_runf("train %s/mlp.yaml --out %s/ma", dir, dir));
    expect_ok("mlp 13", e2e_runf("train %s/mlp.yaml --out %s/mb --steps 13", dir, dir));
    expect_ok(
        "mlp resume dir",
        e2e_runf("train %s/mlp.yaml --out %s/mc --resume %s/mb/step-00000013", dir, dir, dir));
    e2e_result r = e2e_runf("ckpt diff %s/ma %s/mc", dir, dir);
    CHECK(r.rc == 0 && strstr(r.out, "0 different"), "mlp 30 vs 13 + 17: exit %d\n%s%s", r.rc,
          r.out, r.err);
    e2e_done(&r);
    /* The DIR form refuses a used run directory like a new run. */
    expect_fail(
        "resume into used dir",
        e2e_runf("train %s/mlp.yaml --out %s/ma --resume %s/mb/step-00000013", dir, dir, dir),
        "already exists", NULL);
}

int main(void) {
    bin = e2e_setup("resume", dir, sizeof dir);
    if (!bin) return check_summary("e2e/resume");
    test_gpt_latest();
    test_mlp_dir();
    e2e_cleanup(dir);
    return check_summary("e2e/resume");
}
