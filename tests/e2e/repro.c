/* dist.reproducible end to end (docs/reproducibility.md): `tessel train`
 * on 1, 2, 3 and 4 processes (shm), each with 1 and 2 threads, gives
 * byte-identical final checkpoints (`tessel ckpt diff`: every tensor
 * identical) and the same logged losses and gradient norms, for W1's MLP and
 * a GRU; a small GPT (W3's shape, scaled down) and the CNN with BatchNorm
 * (when Fashion-MNIST is installed) on 1, 2, 3 and 4 processes with 1 or 2
 * threads (4 runs each, to bound the test's time); all with 12 micro-batches;
 * so does W1 in fp16 with dynamic loss scaling on 1, 3 and 4 processes (with
 * skipped and applied steps); each of them also with ZeRO-1 and 2 on 2, 3
 * or 4 processes (W1 with clipping, shared and private parameters): the
 * same bits as ZeRO-0 on 1 process; W1 with 4 micro-batches on 2 and 4
 * processes (each process's run one block of the tree: on shm the ranks split its finish), also
 * in fp16 and with ZeRO-1, the gradient histograms too; without the key 1 and 2
 * processes differ (so the comparison can fail). A count that does not divide the micro-batch count
 * and ZeRO-3 are refused, the first with the allowed counts named. */
#include <dirent.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include "check.h"
#include "e2e.h"

static char dir[64];

/* The "loss" and "grad_norm" fields of every train line of metrics.jsonl. */
static char *train_numbers(const char *run) {
    char path[256];
    snprintf(path, sizeof path, "%s/%s/metrics.jsonl", dir, run);
    char *m = e2e_slurp(path, NULL);
    size_t cap = strlen(m) + 1, len = 0;
    char *out = calloc(cap, 1);
    for (const char *p = m; out && (p = strstr(p, "\"type\":\"train\"")); p++) {
        const char *l = strstr(p, "\"loss\":"), *g = strstr(p, "\"grad_norm\":");
        const char *end = strchr(p, '\n');
        if (!l || !g || (end && (l > end || g > end))) break;
        len += (size_t)snprintf(out + len, cap - len, "%.*s %.*s\n", (int)strcspn(l, ","), l,
                                (int)strcspn(g, ",}"), g);
    }
    free(m);
    return out;
}

/* Trains `run` with procs processes and threads threads. */
static int train(const char *run, const char *cfg, const char *sets, int procs, int threads) {
    e2e_result r = e2e_runf("train %s --procs %d --set train.threads=%d --set ckpt.every=1000 %s "
                            "--out %s/%s",
                            cfg, procs, threads, sets, dir, run);
    CHECK(r.rc == 0, "%s: exit %d: %s", run, r.rc, r.err);
    const int rc = r.rc;
    e2e_done(&r);
    return rc;
}

/* The gradient histograms of a run's TensorBoard events (every record naming "grads/", its
 * wall time left out: an Event's first field), concatenated; *n their bytes. NULL without any. */
static unsigned char *grad_histograms(const char *run, size_t *n) {
    char tb[256], path[600] = "";
    snprintf(tb, sizeof tb, "%s/%s/tb", dir, run);
    DIR *d = opendir(tb);
    for (struct dirent *e; d && (e = readdir(d));)
        if (!strncmp(e->d_name, "events.out.tfevents.", 20))
            snprintf(path, sizeof path, "%s/%s", tb, e->d_name);
    if (d) closedir(d);
    long slen = 0;
    unsigned char *b = path[0] ? (unsigned char *)e2e_slurp(path, &slen) : NULL;
    const size_t len = slen > 0 ? (size_t)slen : 0;
    unsigned char *out = b ? malloc(len + 1) : NULL;
    size_t o = 0;
    for (size_t off = 0; out && off + 12 <= len;) {
        uint64_t rl = 0;
        for (int i = 7; i >= 0; i--) rl = rl << 8 | b[off + (size_t)i];
        if (rl > len - off - 16) break;
        const unsigned char *r = b + off + 12;
        const size_t skip = rl > 9 && r[0] == 0x09 ? 9 : 0; /* wall_time: tag, then 8 bytes */
        if (memmem(r, rl, "grads/", 6)) memcpy(out + o, r + skip, rl - skip), o += rl - skip;
        off += 12 + rl + 4;
    }
    free(b);
    *n = o;
    if (!o) free(out), out = NULL;
    return out;
}

/* ckpt diff of two runs: 1 when every tensor is identical. */
static int identical(const char *a, const char *b, int *n_tensors) {
    e2e_result r = e2e_runf("ckpt diff %s/%s %s/%s", dir, a, dir, b);
    int same = -1, diff = -1;
    const char *p = strstr(r.out, " identical, ");
    if (p) {
        const char *q = p;
        while (q > r.out && q[-1] >= '0' && q[-1] <= '9') q--;
        same = atoi(q);
        diff = atoi(p + strlen(" identical, "));
    }
    if (n_tensors) *n_tensors = same;
    if (diff != 0 && r.rc == 0) printf("%s vs %s:\n%s\n", a, b, r.out);
    e2e_done(&r);
    return same > 0 && diff == 0;
}

/* A model on 1 process with 1 thread, and on 1, 2, 3 and 4 processes
 * with 1 and 2 threads (nruns of these 7, from the first): the same bits. */
static void same_bits(const char *tag, const char *cfg, const char *sets, int nruns) {
    char ref[64], run[64];
    snprintf(ref, sizeof ref, "%s-p1-t1", tag);
    if (train(ref, cfg, sets, 1, 1)) return;
    char *want = train_numbers(ref);
    const int procs[] = {3, 2, 4, 1, 3, 2, 4}, threads[] = {2, 1, 1, 2, 1, 2, 2};
    for (int i = 0; i < nruns && i < 7; i++) {
        snprintf(run, sizeof run, "%s-p%d-t%d", tag, procs[i], threads[i]);
        if (train(run, cfg, sets, procs[i], threads[i])) continue;
        int n = 0;
        CHECK(identical(ref, run, &n),
              "%s: %d processes, %d threads: every tensor identical to "
              "1 process (%d tensors)",
              tag, procs[i], threads[i], n);
        char *got = train_numbers(run);
        CHECK(want[0] && strcmp(want, got) == 0,
              "%s: %d processes: the same losses and gradient "
              "norms",
              tag, procs[i]);
        free(got);
    }
    free(want);
}

/* ZeRO-1 and 2 (the optimizer state sharded, each process updating its shard from the tree's
 * sums): the runs of `zs` (a dist.zero stage, a process count and a thread count each, with
 * extra settings) against the ZeRO-0 run of same_bits(tag): every tensor identical, the same
 * losses and gradient norms. */
typedef struct zero_run {
    int zero, procs, threads;
    const char *extra;
} zero_run;

static void zero_same_bits(const char *tag, const char *cfg, const char *sets, const zero_run *zs,
                           int n) {
    char ref[64], run[64], all[1024];
    snprintf(ref, sizeof ref, "%s-p1-t1", tag);
    char *want = train_numbers(ref);
    for (int i = 0; i < n; i++) {
        snprintf(run, sizeof run, "%s-z%d-p%d-t%d%s", tag, zs[i].zero, zs[i].procs, zs[i].threads,
                 zs[i].extra[0] ? "-x" : "");
        snprintf(all, sizeof all, "%s --set dist.zero=%d %s", sets, zs[i].zero, zs[i].extra);
        if (train(run, cfg, all, zs[i].procs, zs[i].threads)) continue;
        int nt = 0;
        CHECK(identical(ref, run, &nt),
              "%s: ZeRO-%d on %d processes, %d threads%s%s: every tensor identical to ZeRO-0 "
              "on 1 process (%d tensors)",
              tag, zs[i].zero, zs[i].procs, zs[i].threads, zs[i].extra[0] ? ", " : "", zs[i].extra,
              nt);
        char *got = train_numbers(run);
        CHECK(want[0] && strcmp(want, got) == 0,
              "%s: ZeRO-%d on %d processes: the same losses and gradient norms", tag, zs[i].zero,
              zs[i].procs);
        free(got);
    }
    free(want);
}

int main(void) {
    const char *bin = e2e_setup("repro", dir, sizeof dir);
    if (!bin) return check_summary("e2e/repro");
    const char *w1 = "--set model.hidden=64 --set train.steps=30 --set train.clip_grad_norm=1";
    char sets[512];
    snprintf(sets, sizeof sets,
             "%s --set dist.reproducible=true --set model.batch=48 --set dist.microbatch=4", w1);
    same_bits("w1", "examples/w1.yaml", sets, 7);
    /* clipping: the norm of the whole summed gradients, then each shard's update; the
     * parameters shared (shm) or each process's copy all-gathered */
    const zero_run zw1[] = {{1, 2, 1, ""},
                            {2, 2, 1, ""},
                            {1, 3, 1, ""},
                            {2, 3, 1, ""},
                            {1, 4, 1, ""},
                            {2, 4, 1, ""},
                            {1, 3, 1, "--set dist.share_params=false"},
                            {2, 4, 1, "--set dist.share_params=false"}};
    zero_same_bits("w1", "examples/w1.yaml", sets, zw1, 8);
    {
        /* ZeRO took effect: the optimizer state is sharded (rank 1 saves its blocks) */
        e2e_result r = e2e_runf("train examples/w1.yaml --procs 2 %s --set dist.zero=2 --set "
                                "train.steps=1 --set ckpt.every=1 --out %s/zlog",
                                sets, dir);
        const char *log = strstr(r.out, "ZeRO-2, this rank's shard") ? r.out : r.err;
        CHECK(r.rc == 0 && strstr(log, "ZeRO-2, this rank's shard") &&
                  strstr(log, "its shard updated from the sums"),
              "ZeRO-2 with dist.reproducible announced: %s%s", r.out, r.err);
        e2e_done(&r);
        CHECK(access(e2e_path("zlog/step-00000001/optim-r1-000.safetensors"), R_OK) == 0,
              "the ZeRO run's checkpoint holds rank 1's blocks of the optimizer state");
    }

    /* fp16 with dynamic loss scaling: a scale that is not a power of two,
     * skipped steps at first, then growth every 2 steps; the skip decisions
     * come from the summed gradients. */
    char fp16[700];
    snprintf(fp16, sizeof fp16,
             "%s --set precision.default=fp16 --set precision.init_scale=1e6 --set "
             "precision.growth_interval=2 --set train.steps=16",
             sets);
    same_bits("fp16", "examples/w1.yaml", fp16, 3);
    const zero_run zfp[] = {{1, 2, 1, ""}, {2, 4, 1, ""}};
    zero_same_bits("fp16", "examples/w1.yaml", fp16, zfp, 2);
    {
        char *m = e2e_slurp(e2e_path("fp16-p3-t2/metrics.jsonl"), NULL);
        CHECK(strstr(m, "\"step_skipped\":1") && strstr(m, "\"step_skipped\":0"),
              "fp16: some steps skipped, some applied");
        free(m);
    }

    /* Without the key the ranks' partial sums change the bits. */
    if (!train("w1-plain-p1", "examples/w1.yaml", w1, 1, 1) &&
        !train("w1-plain-p2", "examples/w1.yaml", w1, 2, 1))
        CHECK(!identical("w1-plain-p1", "w1-plain-p2", NULL),
              "without dist.reproducible 1 and 2 processes differ");

    /* 4 micro-batches on 2 and 4 processes: each process's run is one aligned block of the
     * tree, so on shm every rank folds its slice of the gradients into a result they share and
     * the update reads it (dist/repro_gather.h, the split finish): the same bits as one
     * process, with and without ZeRO-1, and with fp16 loss scaling (its skip decision read from
     * that result). */
    char m4[700];
    snprintf(m4, sizeof m4,
             "%s --set dist.reproducible=true --set model.batch=48 --set dist.microbatch=12 --set "
             "train.steps=10 --set observe.histogram_every=3",
             w1);
    const char *m4fp16 = "--set precision.default=fp16 --set precision.init_scale=1e6 --set "
                         "precision.growth_interval=2";
    for (int f = 0; f < 2; f++) {
        const char *tag = f ? "m4fp16" : "m4", *extra = f ? m4fp16 : "";
        char one[64], base[900];
        snprintf(one, sizeof one, "%s-p1-t1", tag);
        snprintf(base, sizeof base, "%s %s", m4, extra);
        if (train(one, "examples/w1.yaml", base, 1, 1)) continue;
        char *want = train_numbers(one);
        const int procs[] = {2, 4, 2}, zero[] = {0, 0, 1};
        for (int i = f; i < 3; i++) { /* fp16: 4 processes, and 2 with ZeRO-1 */
            char run[64], all[1000];
            snprintf(run, sizeof run, "%s-z%d-p%d-t1", tag, zero[i], procs[i]);
            snprintf(all, sizeof all, "%s --set dist.zero=%d", base, zero[i]);
            if (train(run, "examples/w1.yaml", all, procs[i], 1)) continue;
            int n = 0;
            CHECK(identical(one, run, &n),
                  "%s: 4 micro-batches, ZeRO-%d on %d processes: every tensor identical to 1 "
                  "process (%d tensors)",
                  tag, zero[i], procs[i], n);
            char *got = train_numbers(run);
            CHECK(want[0] && strcmp(want, got) == 0,
                  "%s: 4 micro-batches on %d processes: the same losses and gradient norms", tag,
                  procs[i]);
            free(got);
            /* the histograms read the gradients by name after the step, where the update read
             * them (the plan's own region is copied from the shared result first) */
            size_t hn1 = 0, hn = 0;
            unsigned char *h1 = grad_histograms(one, &hn1), *h = grad_histograms(run, &hn);
            CHECK(h1 && h && hn1 == hn && memcmp(h1, h, hn) == 0,
                  "%s: 4 micro-batches, ZeRO-%d on %d processes: the gradient histograms of 1 "
                  "process (%zu and %zu bytes)",
                  tag, zero[i], procs[i], hn1, hn);
            free(h1), free(h);
        }
        free(want);
    }

    const char *gru = "--set train.steps=8 --set train.eval_every=0 --set model.hidden=64 --set "
                      "model.batch=48 --set dist.microbatch=4 --set dist.reproducible=true";
    same_bits("gru", "examples/w2.yaml", gru, 7);
    const zero_run zgru[] = {{1, 3, 1, ""}, {2, 2, 2, ""}, {1, 4, 1, ""}};
    zero_same_bits("gru", "examples/w2.yaml", gru, zgru, 3);
    const char *gpt = "--set train.steps=6 --set model.ctx=32 --set model.d_model=32 --set "
                      "model.n_layers=1 --set model.n_heads=4 --set model.vocab=256 --set "
                      "model.batch=12 --set dist.microbatch=1 --set dist.reproducible=true";
    same_bits("gpt", "examples/w3.yaml", gpt, 4);
    const zero_run zgpt[] = {{2, 3, 1, ""}, {1, 4, 1, ""}};
    zero_same_bits("gpt", "examples/w3.yaml", gpt, zgpt, 2);
    if (access("/usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz", R_OK) == 0) {
        const char *cnn = "--set train.epochs=0 --set train.steps=6 --set train.warmup_steps=5 "
                          "--set model.c1=8 --set model.c2=8 --set data.val_fraction=0 --set "
                          "dist.reproducible=true --set model.batch=48 --set dist.microbatch=4";
        same_bits("cnn", "examples/fashion_cnn.yaml", cnn, 4);
        const zero_run zcnn[] = {{1, 2, 1, ""}, {2, 3, 2, ""}};
        zero_same_bits("cnn", "examples/fashion_cnn.yaml", cnn, zcnn, 2);
    } else
        printf("cnn skipped: Fashion-MNIST is not installed\n");

    /* Refusals name what is allowed. */
    e2e_result r = e2e_runf("train examples/w1.yaml --procs 3 %s --set model.batch=48 --set "
                            "dist.microbatch=12 --out %s/r3",
                            sets, dir);
    CHECK(r.rc != 0 && strstr(r.err, "3 processes cannot share the 4 micro-batches") &&
              strstr(r.err, "allowed: 1, 2, 4"),
          "3 processes refused with the allowed counts: %s", r.err);
    e2e_done(&r);
    r = e2e_runf("train examples/w1.yaml --procs 2 %s --set dist.zero=3 --out %s/rz", sets, dir);
    CHECK(r.rc != 0 && strstr(r.err, "dist.reproducible does not support dist.zero 3: the fixed"),
          "ZeRO-3 refused, saying why: %s", r.err);
    e2e_done(&r);
    r = e2e_runf("train examples/w1.yaml %s --set dist.microbatch=40 --out %s/rm", sets, dir);
    CHECK(r.rc != 0 && strstr(r.err, "dist.microbatch 40 does not divide model.batch 48"),
          "a micro-batch that does not divide the batch refused: %s", r.err);
    e2e_done(&r);
    e2e_cleanup(dir);
    return check_summary("e2e/repro");
}
