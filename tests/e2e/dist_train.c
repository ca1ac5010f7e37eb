/* `tessel train --procs N` end to end: 2 processes train a small W1-like
 * MLP to the losses of one process (the logged loss is the mean over
 * ranks), rank 0 alone writes the run directory, a batch that does not
 * divide is refused, and a worker killed mid-run makes the launcher exit
 * non-zero quickly with a summary naming the rank and the signal. */
#include <math.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#include "check.h"
#include "e2e.h"

static const char *bin;
static char dir[64];

static const char *small =
    "--set model.batch=16 --set model.hidden=32 --set model.window=4 --set model.features=4 "
    "--set train.threads=1 --set dist.algo=native";

/* The "loss" values of the train lines of a metrics.jsonl. */
static int losses(const char *path, double *out, int max) {
    char *m = e2e_slurp(path, NULL);
    int n = 0;
    for (char *p = m; (p = strstr(p, "{\"type\":\"train\"")); p++) {
        const char *l = strstr(p, "\"loss\":");
        if (l && n < max && sscanf(l, "\"loss\":%lf", &out[n]) == 1) n++;
    }
    free(m);
    return n;
}

/* The 6 train losses of run `run` equal ref[0..n_ref) bit for bit. */
static void same_losses(const char *run, const double *ref, int n_ref, const char *what) {
    char path[256];
    snprintf(path, sizeof path, "%s/metrics.jsonl", run);
    double z[16];
    int nz = losses(e2e_path(path), z, 16);
    CHECK(nz == 6, "%s: 6 train lines, got %d", what, nz);
    for (int i = 0; i < nz && i < n_ref; i++)
        CHECK(z[i] == ref[i], "%s, step %d: loss %.9g, reference %.9g", what, i + 1, z[i], ref[i]);
}

/* The "KEY":number fields of the train lines of a metrics.jsonl. */
static int train_field(const char *path, const char *key, double *out, int max) {
    char *m = e2e_slurp(path, NULL), pat[64];
    snprintf(pat, sizeof pat, "\"%s\":", key);
    int n = 0;
    for (char *p = m; (p = strstr(p, "{\"type\":\"train\"")); p++) {
        const char *l = strstr(p, pat), *end = strchr(p, '\n');
        if (l && (!end || l < end) && n < max && sscanf(l + strlen(pat), "%lf", &out[n]) == 1) n++;
    }
    free(m);
    return n;
}

/* fp16 with dynamic loss scaling on 2 processes: the gradient monitors
 * (and so the logged grad_norm and the alerts that watch it) see the
 * averaged, unscaled gradients, as one process sees its own: they wait for
 * the unscale instead of reading a rank's scaled gradients before the
 * all-reduce (which made grad_norm 65536 times too large and paused the
 * run on the old fixed-threshold default alert). The default alerts stay
 * on: steps the loss scaler skips no longer feed them (issue 16), and the
 * comparison catches such a bug. */
static void test_fp16(void) {
    e2e_result r1 = e2e_runf("train examples/w1.yaml %s --steps 4 --set precision.default=fp16 "
                             "--out %s",
                             small, e2e_path("fp16-one"));
    e2e_result r2 = e2e_runf("train examples/w1.yaml %s --steps 4 --procs 2 --set "
                             "precision.default=fp16 --out %s",
                             small, e2e_path("fp16-two"));
    CHECK(r1.rc == 0 && r2.rc == 0, "fp16, 1 and 2 processes: exit %d and %d: %s %s", r1.rc, r2.rc,
          r1.err, r2.err);
    double g1[8], g2[8], l1[8], l2[8];
    int n1 = train_field(e2e_path("fp16-one/metrics.jsonl"), "grad_norm", g1, 8);
    int n2 = train_field(e2e_path("fp16-two/metrics.jsonl"), "grad_norm", g2, 8);
    int m1 = losses(e2e_path("fp16-one/metrics.jsonl"), l1, 8);
    int m2 = losses(e2e_path("fp16-two/metrics.jsonl"), l2, 8);
    CHECK(n1 == 4 && n2 == 4 && m1 == 4 && m2 == 4, "4 train lines each: %d %d %d %d", n1, n2, m1,
          m2);
    for (int i = 0; i < n1 && i < n2 && i < m1 && i < m2; i++) {
        CHECK(fabs(g2[i] - g1[i]) <= 1e-3 * g1[i],
              "fp16 step %d: grad_norm %.9g on 2 processes, %.9g on 1", i + 1, g2[i], g1[i]);
        CHECK(fabs(l2[i] - l1[i]) <= 1e-4 * l1[i], "fp16 step %d: loss %.9g on 2, %.9g on 1", i + 1,
              l2[i], l1[i]);
    }
    e2e_done(&r1);
    e2e_done(&r2);
}

/* fp16 with dynamic loss scaling under ZeRO: each rank unscales its own
 * gradients before they are reduced and the ranks agree on skipping. From
 * a scale so high that the first steps overflow (skipped, the scale halved
 * each time) until it recovers, ZeRO-1 and ZeRO-2, with the parameters
 * shared or not, give ZeRO-0's losses, scales and skips bit for bit. */
static void test_zero_fp16(void) {
    static const char *const set[] = {"dist.zero=0", "dist.zero=1", "dist.zero=2",
                                      "dist.zero=1 --set dist.share_params=false",
                                      "dist.zero=2 --set dist.share_params=false"};
    enum { STEPS = 10 };
    double ref[3][STEPS];
    for (int k = 0; k < 5; k++) {
        char run[32];
        snprintf(run, sizeof run, "zfp16-%d", k);
        e2e_result r = e2e_runf("train examples/w1.yaml %s --steps %d --procs 2 --set "
                                "precision.default=fp16 --set precision.init_scale=33554432 --set "
                                "%s --out %s",
                                small, STEPS, set[k], e2e_path(run));
        CHECK(r.rc == 0, "fp16, %s: exit %d: %s", set[k], r.rc, r.err);
        e2e_done(&r);
        char path[64];
        snprintf(path, sizeof path, "%s/metrics.jsonl", run);
        double v[3][STEPS];
        static const char *const key[] = {"loss", "loss_scale", "step_skipped"};
        int n[3], skipped = 0, recovered = 0;
        for (int f = 0; f < 3; f++) n[f] = train_field(e2e_path(path), key[f], v[f], STEPS);
        CHECK(n[0] == STEPS && n[1] == STEPS && n[2] == STEPS, "%s: %d train lines", set[k], n[0]);
        if (n[0] != STEPS || n[1] != STEPS || n[2] != STEPS) continue;
        for (int i = 0; i < STEPS; i++) {
            skipped += v[2][i] == 1, recovered += i > 0 && v[2][i] == 0 && v[2][i - 1] == 1;
            for (int f = 0; f < 3; f++) {
                if (k == 0) ref[f][i] = v[f][i];
                CHECK(v[f][i] == ref[f][i], "fp16, %s, step %d: %s %.9g, zero 0 %.9g", set[k],
                      i + 1, key[f], v[f][i], ref[f][i]);
            }
        }
        CHECK(skipped >= 2 && recovered == 1, "%s: %d skipped steps, then %d recoveries", set[k],
              skipped, recovered);
    }
    /* 3 ranks: the shards' sums are divided by 3, not a power of two. */
    double l3[2][STEPS];
    int n3[2];
    for (int z = 0; z < 2; z++) {
        char run[32], path[64];
        snprintf(run, sizeof run, "zfp16-3r-%d", z);
        e2e_result r =
            e2e_runf("train examples/w1.yaml %s --set model.batch=12 --steps %d --procs 3 "
                     "--set precision.default=fp16 --set precision.init_scale=524288 "
                     "--set dist.zero=%d --out %s",
                     small, STEPS, 2 * z, e2e_path(run));
        CHECK(r.rc == 0, "fp16, 3 ranks, zero %d: exit %d: %s", 2 * z, r.rc, r.err);
        e2e_done(&r);
        snprintf(path, sizeof path, "%s/metrics.jsonl", run);
        n3[z] = losses(e2e_path(path), l3[z], STEPS);
    }
    CHECK(n3[0] == n3[1] && n3[0] >= 3, "3 ranks: %d and %d finite losses", n3[0], n3[1]);
    for (int i = 0; i < n3[0] && i < n3[1]; i++)
        CHECK(l3[1][i] == l3[0][i], "fp16, 3 ranks, loss %d: zero 2 %.9g, zero 0 %.9g", i + 1,
              l3[1][i], l3[0][i]);
}

static void test_two_procs(void) {
    e2e_result r1 =
        e2e_runf("train examples/w1.yaml %s --steps 6 --out %s", small, e2e_path("one"));
    CHECK(r1.rc == 0, "1 process: exit %d: %s", r1.rc, r1.err);
    e2e_result r2 =
        e2e_runf("train examples/w1.yaml %s --steps 6 --procs 2 --out %s", small, e2e_path("two"));
    CHECK(r2.rc == 0, "--procs 2: exit %d: %s", r2.rc, r2.err);
    CHECK(strstr(r2.out, "data parallel: 2 processes (shm), batch 8 per process"),
          "the header names the processes: %s", r2.out);
    /* Rank 0 alone prints: one "done" line. */
    const char *d = strstr(r2.out, "done: 6 steps");
    CHECK(d && !strstr(d + 1, "done: 6 steps"), "one summary line: %s", r2.out);
    double a[16], b[16];
    int na = losses(e2e_path("one/metrics.jsonl"), a, 16);
    int nb = losses(e2e_path("two/metrics.jsonl"), b, 16);
    CHECK(na == 6 && nb == 6, "6 train lines each (rank 0 alone writes), got %d and %d", na, nb);
    /* The mean of the ranks' losses over 8 rows each is the loss over 16
     * rows up to rounding; later steps also carry the weights' rounding
     * differences (see tests/unit/dist_step.c). */
    for (int i = 0; i < na && i < nb; i++)
        CHECK(fabs(a[i] - b[i]) <= 1e-5 * fabs(a[i]) + 1e-7, "step %d: loss %.9g vs %.9g", i + 1,
              a[i], b[i]);
    char *sum = e2e_slurp(e2e_path("two/summary.json"), NULL);
    CHECK(strstr(sum, "\"status\": \"completed\""), "summary: %s", sum);
    free(sum);
    e2e_done(&r1);
    e2e_done(&r2);

    /* skip_step agreed by every rank: a NaN in rank 0's rows of batch 2
     * makes rank 0's loss non-finite (the default rule skips the update);
     * rank 1's own loss is finite, but its averaged gradient holds rank 0's
     * NaNs, so a rank that applied it would poison the losses after it. */
    e2e_result rs = e2e_runf("train examples/w1.yaml %s --steps 4 --procs 2 --set debug.inject=nan "
                             "--set debug.inject_step=2 --out %s",
                             small, e2e_path("skip"));
    CHECK(rs.rc == 0, "--procs 2 with a NaN batch: exit %d: %s", rs.rc, rs.err);
    CHECK(strstr(rs.out, "-> skip_step"), "the skip is reported: %s", rs.out);
    double ls[16];
    int ns = losses(e2e_path("skip/metrics.jsonl"), ls, 16);
    CHECK(ns == 3 && isfinite(ls[1]) && isfinite(ls[2]),
          "steps 3 and 4 train on finite weights (%d finite losses)", ns);
    e2e_done(&rs);

    /* ZeRO-1: the same update bit for bit (no clipping in w1.yaml). */
    e2e_result rz =
        e2e_runf("train examples/w1.yaml %s --steps 6 --procs 2 --set dist.zero=1 --out %s", small,
                 e2e_path("zero"));
    CHECK(rz.rc == 0, "--procs 2, dist.zero 1: exit %d: %s", rz.rc, rz.err);
    CHECK(strstr(rz.out, "per process: arena") && strstr(rz.out, "ZeRO-1, this rank's shard"),
          "the per-process memory is reported: %s", rz.out);
    same_losses("zero", b, nb, "zero 1 against zero 0");
    CHECK(strstr(rz.out, "shared by the 2 processes: parameters"),
          "one copy of the parameters for both processes is reported: %s", rz.out);
    e2e_done(&rz);
    /* A copy of the parameters per process (all-gathered): the same update. */
    rz = e2e_runf("train examples/w1.yaml %s --steps 6 --procs 2 --set dist.zero=1 --set "
                  "dist.share_params=false --out %s",
                  small, e2e_path("zero-private"));
    CHECK(rz.rc == 0 && !strstr(rz.out, "shared by the"),
          "--procs 2, dist.zero 1, dist.share_params false: exit %d: %s%s", rz.rc, rz.out, rz.err);
    same_losses("zero-private", b, nb, "zero 1, private parameters, against zero 0");
    e2e_done(&rz);
    /* ZeRO-2 with small buckets (about 2 KiB, many of them): gradients
     * released after their reduce-scatter, the same update bit for bit;
     * the first step's TensorBoard histograms skip the released gradients. */
    rz = e2e_runf("train examples/w1.yaml %s --steps 6 --procs 2 --set dist.zero=2 --set "
                  "dist.bucket_mb=0.002 --out %s",
                  small, e2e_path("zero2"));
    CHECK(rz.rc == 0, "--procs 2, dist.zero 2: exit %d: %s", rz.rc, rz.err);
    CHECK(strstr(rz.out, "gradients 0.0: ZeRO-2, buckets of") &&
              strstr(rz.out, "ZeRO-2, this rank's shard"),
          "the per-process memory marks ZeRO-2: %s", rz.out);
    same_losses("zero2", b, nb, "zero 2 against zero 0");
    e2e_done(&rz);
    /* (ZeRO-3 is tests/e2e/zero3.c's; a stage beyond it is refused) */
    rz = e2e_runf("train examples/w1.yaml %s --steps 2 --procs 2 --set dist.zero=4", small);
    CHECK(rz.rc == 2 && strstr(rz.err, "dist.zero"), "dist.zero 4 is refused: exit %d: %s", rz.rc,
          rz.err);
    e2e_done(&rz);

    rz = e2e_runf(
        "train examples/w1.yaml %s --steps 2 --procs 2 --set dist.zero=1 --set ckpt.every=1 "
        "--out %s",
        small, e2e_path("zero-ckpt"));
    CHECK(rz.rc == 0, "zero with checkpoints: exit %d: %s", rz.rc, rz.err);
    e2e_done(&rz);
    /* (tests/e2e/ckpt_zero.c tests these checkpoints; here: they verify) */
    rz = e2e_runf("ckpt inspect %s", e2e_path("zero-ckpt"));
    CHECK(rz.rc == 0 && strstr(rz.out, "world 2 (zero)"), "zero checkpoint: exit %d: %s%s", rz.rc,
          rz.out, rz.err);
    e2e_done(&rz);

    /* A skipped step under ZeRO-1 and ZeRO-2: the shard update counts
     * applied updates (Adam's t) as the full update does, so the losses
     * after the skip still match ZeRO 0 bit for bit. */
    {
        double l0[16], l1[16];
        e2e_result a0 = e2e_runf("train examples/w1.yaml %s --steps 5 --procs 2 --set "
                                 "debug.inject=nan --set debug.inject_step=2 --out %s",
                                 small, e2e_path("skip0"));
        e2e_result a1 = e2e_runf("train examples/w1.yaml %s --steps 5 --procs 2 --set dist.zero=1 "
                                 "--set debug.inject=nan --set debug.inject_step=2 --out %s",
                                 small, e2e_path("skip1"));
        e2e_result a2 = e2e_runf("train examples/w1.yaml %s --steps 5 --procs 2 --set dist.zero=2 "
                                 "--set debug.inject=nan --set debug.inject_step=2 --out %s",
                                 small, e2e_path("skip2"));
        CHECK(a0.rc == 0 && a1.rc == 0, "skip runs: exit %d and %d: %s %s", a0.rc, a1.rc, a0.err,
              a1.err);
        int n0 = losses(e2e_path("skip0/metrics.jsonl"), l0, 16);
        int n1 = losses(e2e_path("skip1/metrics.jsonl"), l1, 16);
        CHECK(n0 == 4 && n1 == 4, "4 finite losses each (step 2 skipped), got %d and %d", n0, n1);
        for (int i = 0; i < n0 && i < n1; i++)
            CHECK(l0[i] == l1[i], "after a skip, zero 1 vs zero 0, loss %d: %.9g vs %.9g", i, l1[i],
                  l0[i]);
        e2e_done(&a0);
        e2e_done(&a1);
        double l2[16];
        int n2 = losses(e2e_path("skip2/metrics.jsonl"), l2, 16);
        CHECK(a2.rc == 0 && n2 == 4, "skip under zero 2: exit %d, %d finite losses: %s", a2.rc, n2,
              a2.err);
        for (int i = 0; i < n2 && i < n1; i++)
            CHECK(l2[i] == l1[i], "after a skip, zero 2 vs zero 1, loss %d: %.9g vs %.9g", i, l2[i],
                  l1[i]);
        e2e_done(&a2);
    }

    /* The example config: 2 processes from dist.procs. */
    rz =
        e2e_runf("train examples/w1_dist.yaml --steps 2 --set model.hidden=32 --set model.window=4 "
                 "--set model.features=4 --out %s",
                 e2e_path("example"));
    CHECK(rz.rc == 0 && strstr(rz.out, "data parallel: 2 processes (shm), batch 128 per process"),
          "examples/w1_dist.yaml: exit %d: %s%s", rz.rc, rz.out, rz.err);
    e2e_done(&rz);

    e2e_result r3 = e2e_runf("train examples/w1.yaml %s --steps 2 --procs 3", small);
    CHECK(r3.rc == 2 && strstr(r3.err, "model.batch 16 does not divide by 3 processes"),
          "batch 16 on 3 processes: exit %d: %s", r3.rc, r3.err);
    e2e_done(&r3);
}

/* --trace: one Chrome trace with both ranks' kernels and collectives. */
static void test_trace(void) {
    const char *trace = e2e_path("trace.json");
    e2e_result r =
        e2e_runf("train examples/w1.yaml %s --steps 3 --procs 2 --set dist.bucket_mb=0.001 "
                 "--trace %s",
                 small, trace);
    CHECK(r.rc == 0, "--trace: exit %d: %s", r.rc, r.err);
    CHECK(strstr(r.out, "trace: "), "the trace is reported: %s", r.out);
    char *t = e2e_slurp(trace, NULL);
    CHECK(!strncmp(t, "{\"traceEvents\":[", 15), "Chrome trace JSON: %.80s", t);
    CHECK(strstr(t, "\"args\":{\"name\":\"rank 0\"}") &&
              strstr(t, "\"args\":{\"name\":\"rank 1\"}"),
          "both ranks in the merged file");
    CHECK(strstr(t, "\"name\":\"all_reduce\",\"cat\":\"comm\"") &&
              strstr(t, "\"name\":\"allreduce_start\",\"cat\":\"compute\"") &&
              strstr(t, "\"name\":\"matmul\",\"cat\":\"compute\""),
          "compute and comm spans");
    CHECK(access(e2e_path("trace.rank0.json"), F_OK) != 0 &&
              access(e2e_path("trace.rank1.json"), F_OK) != 0,
          "the per-rank files are merged and removed");
    free(t);
    e2e_done(&r);
}

/* The same training under mpirun (the mpi transport, rank 0 writes): the
 * losses of --procs 2. Skipped without mpirun on the PATH. Open MPI's
 * components leak at finalize, so a sanitizer build checks no leaks here. */
static void test_mpirun(void) {
    const char *path = getenv("PATH");
    char mpirun[512] = "";
    for (const char *p = path ? path : ""; *p && !mpirun[0];) {
        const char *e = strchr(p, ':');
        int n = e ? (int)(e - p) : (int)strlen(p);
        char c[512];
        snprintf(c, sizeof c, "%.*s/mpirun", n, p);
        if (access(c, X_OK) == 0) snprintf(mpirun, sizeof mpirun, "%s", c);
        p += n + (e != NULL);
    }
    if (!mpirun[0]) {
        printf("skipped the mpirun run: mpirun not found on PATH\n");
        return;
    }
    char cmd[2048];
    snprintf(cmd, sizeof cmd,
             "TESSEL_COLL_CACHE=0 ASAN_OPTIONS=detect_leaks=0 '%s' %s--oversubscribe -np 2 '%s' "
             "train examples/w1.yaml %s "
             "--steps 6 --out %s > %s 2>&1",
             mpirun, geteuid() == 0 ? "--allow-run-as-root " : "", bin, small, e2e_path("mpi"),
             e2e_path("mpi.log"));
    int rc = system(cmd);
    char *log = e2e_slurp(e2e_path("mpi.log"), NULL);
    CHECK(rc == 0, "mpirun -np 2 tessel train: status %d:\n%s", rc, log);
    CHECK(strstr(log, "data parallel: 2 processes (mpi), batch 8 per process"), "mpi: %s", log);
    free(log);
    double a[16], b[16];
    int na = losses(e2e_path("two/metrics.jsonl"), a, 16);
    int nb = losses(e2e_path("mpi/metrics.jsonl"), b, 16);
    CHECK(nb == 6, "mpi: rank 0 alone wrote 6 train lines, got %d", nb);
    /* 2 ranks: every all-reduce algorithm adds a + b, the same sum */
    for (int i = 0; i < na && i < nb; i++)
        CHECK(fabs(a[i] - b[i]) <= 1e-6 * fabs(a[i]), "step %d: shm %.9g, mpi %.9g", i + 1, a[i],
              b[i]);
    /* ZeRO-2 over MPI (MPI_Ireduce_scatter releases a bucket only once it
     * completed): the same losses as the all-reduce over MPI. */
    snprintf(cmd, sizeof cmd,
             "TESSEL_COLL_CACHE=0 ASAN_OPTIONS=detect_leaks=0 '%s' %s--oversubscribe -np 2 '%s' "
             "train examples/w1.yaml %s --steps 6 --set dist.zero=2 --set dist.bucket_mb=0.002 "
             "--out %s > %s 2>&1",
             mpirun, geteuid() == 0 ? "--allow-run-as-root " : "", bin, small, e2e_path("mpi-z2"),
             e2e_path("mpi-z2.log"));
    rc = system(cmd);
    log = e2e_slurp(e2e_path("mpi-z2.log"), NULL);
    CHECK(rc == 0 && strstr(log, "ZeRO-2"), "mpirun, dist.zero 2: status %d:\n%s", rc, log);
    free(log);
    same_losses("mpi-z2", b, nb, "mpi, zero 2 against mpi zero 0");
}

/* tessel bench --procs: runs W1 on 1 and 2 processes and reports the
 * ratio (the figures themselves depend on the machine). */
static void test_bench(void) {
    e2e_result r = e2e_run("bench --workload W1 --procs 2 --threads 1 --steps 2 --warmup 0 "
                           "--rounds 1");
    CHECK(r.rc == 0, "bench --procs 2: exit %d: %s", r.rc, r.err);
    CHECK(strstr(r.out, "W1 data parallel: 1 process x 1 thread(s), batch 256  vs  2 processes x "
                        "1 thread(s), batch 128 each") &&
              strstr(r.out, "samples/s") && strstr(r.out, "ratio ") &&
              strstr(r.out, "without gradient exchange") && strstr(r.out, "--zero 2 shards it"),
          "bench report: %s", r.out);
    e2e_done(&r);
    /* --zero takes a stage (alone: 1); the parameters are shared unless
     * --private-params; --profile adds rank 0's time per op kind. */
    r = e2e_run("bench --workload W1 --procs 2 --threads 1 --steps 1 --warmup 0 --rounds 1 --zero "
                "2 --profile");
    CHECK(r.rc == 0 &&
              strstr(r.out, "(shm, ZeRO-2: reduce-scatter with early release, sharded update of "
                            "the shared parameters)") &&
              strstr(r.out, "rank 0 of 2 processes, time per op kind") &&
              strstr(r.out, "shard_update") && strstr(r.out, "zero_sync") &&
              !strstr(r.out, "all_gather"),
          "bench --zero 2 --profile: exit %d: %s%s", r.rc, r.out, r.err);
    e2e_done(&r);
    r = e2e_run("bench --workload W1 --procs 2 --threads 1 --steps 1 --warmup 0 --rounds 1 --zero "
                "--private-params --profile");
    CHECK(r.rc == 0 && strstr(r.out, "(shm, ZeRO-1: reduce-scatter, sharded update, all-gather)") &&
              strstr(r.out, "all_gather") && !strstr(r.out, "zero_sync"),
          "bench --zero --private-params: exit %d: %s%s", r.rc, r.out, r.err);
    e2e_done(&r);
    r = e2e_run("bench --workload W1 --procs 2 --zero 4"); /* (--zero 3: tests/e2e/zero3.c) */
    CHECK(r.rc == 2 && strstr(r.err, "--zero: expected 0, 1, 2 or 3, got '4'"),
          "bench --zero 4: exit %d: %s", r.rc, r.err);
    e2e_done(&r);
    r = e2e_run("bench --workload W2 --procs 2");
    CHECK(r.rc == 2 && strstr(r.err, "W1 or W3"), "W2 refused: exit %d: %s", r.rc, r.err);
    e2e_done(&r);
}

/* The worker processes of the launcher `pid` (its children; a /proc file
 * reports size 0, so it is read with stdio). */
static int children(pid_t pid, pid_t *out, int max) {
    char path[64];
    snprintf(path, sizeof path, "/proc/%d/task/%d/children", (int)pid, (int)pid);
    FILE *f = fopen(path, "r");
    int n = 0, v;
    while (f && n < max && fscanf(f, "%d", &v) == 1) out[n++] = (pid_t)v;
    if (f) fclose(f);
    return n;
}

/* SIGTERM sent to the launcher alone (a scheduler's kill, not a terminal's
 * Ctrl-C that reaches the whole process group): the launcher passes the
 * stop on to its workers, which end after the current step, agreed. */
static void test_sigterm_launcher(void) {
    char out[256], metrics[300];
    snprintf(out, sizeof out, "%s", e2e_path("term"));
    snprintf(metrics, sizeof metrics, "%s/metrics.jsonl", out);
    fflush(stdout);
    pid_t pid = fork();
    if (pid == 0) {
        setpgid(0, 0);
        if (!freopen("/dev/null", "w", stdout) || !freopen("/dev/null", "w", stderr)) _exit(126);
        execl(bin, bin, "train", "examples/w1.yaml", "--steps", "100000000", "--procs", "2",
              "--set", "model.batch=8", "--set", "model.hidden=8", "--set", "model.window=2",
              "--set", "model.features=2", "--set", "train.threads=1", "--set", "train.log_every=1",
              "--out", out, (char *)NULL);
        _exit(127);
    }
    struct timespec pause = {0, 20 * 1000 * 1000};
    int started = 0;
    for (int i = 0; i < 1000 && !started; i++) {
        char *m = e2e_slurp(metrics, NULL);
        started = strstr(m, "\"step\":3,") != NULL;
        free(m);
        if (!started) nanosleep(&pause, NULL);
    }
    CHECK(started, "the run started");
    kill(pid, SIGTERM);
    int st = 0, done = 0;
    for (int i = 0; i < 1000 && !done; i++) {
        done = waitpid(pid, &st, WNOHANG) == pid;
        if (!done) nanosleep(&pause, NULL);
    }
    if (!done) {
        kill(-pid, SIGKILL);
        waitpid(pid, &st, 0);
    }
    CHECK(done && WIFEXITED(st) && WEXITSTATUS(st) == 130,
          "SIGTERM to the launcher stops the run (exit 130), status %d", st);
    char *sum = e2e_slurp(e2e_path("term/summary.json"), NULL);
    CHECK(strstr(sum, "\"status\": \"interrupted\""), "summary: %s", sum);
    free(sum);
}

/* A stop that reaches one worker alone (SIGUSR2, the launcher's forwarded stop, to rank 1
 * only): the ranks agree on it, so both end after the same step and the run is interrupted,
 * not failed (a rank that stopped alone would leave the other waiting for it). With `extra`
 * "dist.reproducible=true" the stop flag rides on the reproducible finish's last meeting
 * (repro.h) instead of the session's agreement. */
static void test_stop_one_worker(const char *name, const char *extra) {
    char out[256], metrics[300];
    snprintf(out, sizeof out, "%s", e2e_path(name));
    snprintf(metrics, sizeof metrics, "%s/metrics.jsonl", out);
    fflush(stdout);
    pid_t pid = fork();
    if (pid == 0) {
        setpgid(0, 0);
        if (!freopen("/dev/null", "w", stdout) || !freopen("/dev/null", "w", stderr)) _exit(126);
        execl(bin, bin, "train", "examples/w1.yaml", "--steps", "100000000", "--procs", "2",
              "--set", "model.batch=8", "--set", "model.hidden=8", "--set", "model.window=2",
              "--set", "model.features=2", "--set", "train.threads=1", "--set", "train.log_every=1",
              "--set", "dist.timeout_s=20", "--set", extra, "--out", out, (char *)NULL);
        _exit(127);
    }
    struct timespec pause = {0, 20 * 1000 * 1000};
    pid_t kids[4];
    int nk = 0;
    for (int i = 0; i < 1000; i++) {
        char *m = e2e_slurp(metrics, NULL);
        int started = strstr(m, "\"step\":3,") != NULL;
        free(m);
        nk = children(pid, kids, 4);
        if (started && nk == 2) break;
        nanosleep(&pause, NULL);
    }
    CHECK(nk == 2, "%s: the launcher has %d workers", name, nk);
    if (nk == 2) kill(kids[1], SIGUSR2);
    int st = 0, done = 0;
    for (int i = 0; i < 1000 && !done; i++) {
        done = waitpid(pid, &st, WNOHANG) == pid;
        if (!done) nanosleep(&pause, NULL);
    }
    if (!done) {
        kill(-pid, SIGKILL);
        waitpid(pid, &st, 0);
    }
    CHECK(done && WIFEXITED(st) && WEXITSTATUS(st) == 130,
          "%s: a stop seen by rank 1 alone stops the run (exit 130), status %d", name, st);
    char path[300];
    snprintf(path, sizeof path, "%s/summary.json", out);
    char *sum = e2e_slurp(path, NULL);
    CHECK(strstr(sum, "\"status\": \"interrupted\""), "%s: summary: %s", name, sum);
    free(sum);
}

static void test_killed_worker(void) {
    char out[256], metrics[300], errf[300];
    snprintf(out, sizeof out, "%s", e2e_path("killed"));
    snprintf(metrics, sizeof metrics, "%s/metrics.jsonl", out);
    snprintf(errf, sizeof errf, "%s", e2e_path("killed.err"));
    fflush(stdout);
    pid_t pid = fork();
    if (pid == 0) {
        if (!freopen("/dev/null", "w", stdout) || !freopen(errf, "w", stderr)) _exit(126);
        execl(bin, bin, "train", "examples/w1.yaml", "--steps", "100000000", "--procs", "2",
              "--set", "model.batch=8", "--set", "model.hidden=8", "--set", "model.window=2",
              "--set", "model.features=2", "--set", "train.threads=1", "--set", "dist.timeout_s=5",
              "--set", "train.log_every=1", "--out", out, (char *)NULL);
        _exit(127);
    }
    /* Wait until training runs (at most 20 s), then kill one worker. */
    struct timespec pause = {0, 20 * 1000 * 1000};
    pid_t kids[4];
    int nk = 0;
    for (int i = 0; i < 1000; i++) {
        char *m = e2e_slurp(metrics, NULL);
        int started = strstr(m, "\"step\":3,") != NULL;
        free(m);
        nk = children(pid, kids, 4);
        if (started && nk == 2) break;
        nanosleep(&pause, NULL);
    }
    CHECK(nk == 2, "the launcher has %d workers", nk);
    if (nk < 2) {
        kill(pid, SIGKILL);
        waitpid(pid, NULL, 0);
        return;
    }
    double t;
    struct timespec a, b;
    clock_gettime(CLOCK_MONOTONIC, &a);
    kill(kids[1], SIGKILL);
    int st = 0;
    waitpid(pid, &st, 0);
    clock_gettime(CLOCK_MONOTONIC, &b);
    t = (double)(b.tv_sec - a.tv_sec) + 1e-9 * (double)(b.tv_nsec - a.tv_nsec);
    CHECK(WIFEXITED(st) && WEXITSTATUS(st) != 0, "the launcher exits non-zero, status %d", st);
    /* Peers notice a dead worker at once (the launcher publishes it),
     * not at the 5 s timeout. */
    CHECK(t < 4.5, "the launcher took %.2f s to end", t);
    char *err = e2e_slurp(errf, NULL);
    CHECK(strstr(err, "killed by signal 9") && strstr(err, "tessel train --procs 2"),
          "summary names the killed rank: %s", err);
    CHECK(strstr(err, "all_reduce #") && strstr(err, "did not arrive"),
          "the surviving rank's report: %s", err);
    printf("killed worker: launcher ended in %.2f s:\n%s", t, err);
    free(err);
    char *sum = e2e_slurp(e2e_path("killed/summary.json"), NULL);
    CHECK(strstr(sum, "\"status\": \"failed\""), "rank 0 wrote a failed summary: %s", sum);
    free(sum);
}

int main(void) {
    bin = e2e_setup("dist-train", dir, sizeof dir);
    if (!bin) return check_summary("e2e/dist_train");
    test_two_procs();
    test_fp16();
    test_zero_fp16();
    test_trace();
    test_mpirun();
    test_bench();
    test_killed_worker();
    test_stop_one_worker("stop1", "dist.reproducible=false");
    test_stop_one_worker("stop1r", "dist.reproducible=true");
    test_sigterm_launcher();
    e2e_cleanup(dir);
    return check_summary("e2e/dist_train");
}
