/* ZeRO-3 from the command line (`tessel train --procs N --set
 * dist.zero=3`): the parameters sharded over the processes, gathered per
 * bucket before their use.
 *
 * - W1's MLP, small, with 4 KB buckets (blocks cut across parameters) and
 *   no clipping: ZeRO-3 on 2 and 4 processes saves the same checkpoint
 *   bytes as ZeRO-0 on as many (tessel ckpt diff: 0 different), with and
 *   without prefetch; the checkpoint holds the parameters as logical
 *   tensors of kind param made of both ranks' chunks (no params file).
 * - Resume: 6 steps + resume to 12 gives the uninterrupted run's bits; so
 *   does a worker SIGKILLed twice in step 5 (--max-restarts); a ZeRO-3
 *   checkpoint resumes under ZeRO-0 and on 4 processes, a ZeRO-1 one under
 *   ZeRO-3; export writes whole weights.
 * - dist.max_mem_mb: W3 in one process with a limit below its need is
 *   refused at compile (exit 2) with the need, the limit and the way out
 *   (dist.zero: 3); ZeRO-3 on 2 processes under the same limit trains it.
 * - Under mpirun (if on the PATH) ZeRO-3 gives the same bits; so does
 *   fp16 with dynamic loss scaling through overflowing (skipped) steps.
 * - tessel bench --zero 3 runs and reports the memory per process.
 * - Evaluation: the breast-cancer MLP with its validation split on 2
 *   processes writes the same eval records under ZeRO-3 as under ZeRO-0
 *   (every rank gives rank 0 its blocks before it evaluates).
 * - Refused, naming the keys: ZeRO-3 with dist.compress, with shape
 *   buckets, with PEFT. */
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include "check.h"
#include "e2e.h"

static const char *small =
    "--set model.batch=16 --set model.hidden=32 --set model.window=4 --set model.features=4 "
    "--set train.threads=1 --set dist.algo=native --set dist.bucket_mb=0.004 "
    "--set ckpt.every=2 --set ckpt.keep_last=0 --set train.total_steps=12";

static void train(const char *what, const char *args, const char *out) {
    e2e_result r = e2e_runf("train examples/w1.yaml %s %s --out %s", small, args, e2e_path(out));
    CHECK(r.rc == 0, "%s: exit %d\n%s%s", what, r.rc, r.out, r.err);
    e2e_done(&r);
}

static void same_weights(const char *what, const char *a, const char *b) {
    e2e_result r = e2e_runf("ckpt diff %s %s", e2e_path(a), e2e_path(b));
    CHECK(r.rc == 0 && strstr(r.out, " 0 different") && strstr(r.out, "step-00000012 (step 12)"),
          "%s: ckpt diff exit %d\n%s%s", what, r.rc, r.out, r.err);
    e2e_done(&r);
}

static void kill_knob(const char *rank, const char *step, const char *attempts) {
    if (rank) {
        setenv("TESSEL_TEST_KILL_RANK", rank, 1);
        setenv("TESSEL_TEST_KILL_STEP", step, 1);
        setenv("TESSEL_TEST_KILL_ATTEMPTS", attempts, 1);
    } else {
        unsetenv("TESSEL_TEST_KILL_RANK");
        unsetenv("TESSEL_TEST_KILL_STEP");
        unsetenv("TESSEL_TEST_KILL_ATTEMPTS");
    }
}

static void test_equal_and_resume(void) {
    train("ZeRO-0, 2 processes", "--procs 2 --set dist.zero=0 --steps 12", "z0");
    train("ZeRO-3, 2 processes", "--procs 2 --set dist.zero=3 --steps 12", "z3");
    same_weights("ZeRO-3 vs ZeRO-0 on 2", "z0", "z3");
    train("ZeRO-3, 2 processes, no prefetch",
          "--procs 2 --set dist.zero=3 --set dist.prefetch=false --steps 12", "z3np");
    same_weights("ZeRO-3 without prefetch vs ZeRO-0", "z0", "z3np");
    train("ZeRO-0, 4 processes", "--procs 4 --set dist.zero=0 --steps 12", "z0x4");
    train("ZeRO-3, 4 processes", "--procs 4 --set dist.zero=3 --steps 12", "z3x4");
    same_weights("ZeRO-3 vs ZeRO-0 on 4", "z0x4", "z3x4");

    /* The log names the sharded parameters; the manifest has them as
     * logical tensors of kind param, made of both ranks' chunks. */
    char *m = e2e_slurp(e2e_path("z3/step-00000012/manifest.json"), NULL);
    CHECK(strstr(m, "\"optim-r1-000.safetensors\"") && !strstr(m, "params-r0") &&
              strstr(m, "\"name\": \"net.0.weight\"") && strstr(m, "\"kind\": \"param\"") &&
              strstr(m, "\"name\": \"net.0.weight.exp_avg\"") &&
              !strstr(m, "\"name\": \"zero.bucket0.param\""),
          "manifest: parameters as logical tensors of every rank's blocks");
    free(m);
    e2e_result r = e2e_runf("export %s --safetensors %s", e2e_path("z3"), e2e_path("w3.st"));
    CHECK(r.rc == 0, "export: %s%s", r.out, r.err);
    e2e_done(&r);
    long n = 0;
    char *w = e2e_slurp(e2e_path("w3.st"), &n);
    const char *hdr = n > 8 ? w + 8 : ""; /* the JSON header, up to the first NUL of the data */
    CHECK(strstr(hdr, "\"net.0.weight\"") && strstr(hdr, "\"net.6.bias\"") &&
              !strstr(hdr, "exp_avg") && !strstr(hdr, "zero."),
          "export assembles the whole weights from the ranks' blocks");
    free(w);

    /* Bit-exact resume on the same N, directly and after kills. */
    train("ZeRO-3, 6 steps", "--procs 2 --set dist.zero=3 --steps 6", "half");
    train("ZeRO-3, resumed", "--procs 2 --set dist.zero=3 --steps 12 --resume latest", "half");
    same_weights("ZeRO-3: 12 vs 6 + resume + 6", "z3", "half");
    kill_knob("1", "5", "2");
    r = e2e_runf("train examples/w1.yaml %s --procs 2 --set dist.zero=3 --steps 12 "
                 "--max-restarts 3 --out %s",
                 small, e2e_path("killed"));
    kill_knob(NULL, NULL, NULL);
    CHECK(r.rc == 0 && strstr(r.out, "restart 1/3") && strstr(r.out, "restart 2/3") &&
              !strstr(r.out, "restart 3/3") && strstr(r.out, "killed by signal 9"),
          "rank 1 killed twice: exit %d\n%s%s", r.rc, r.out, r.err);
    e2e_done(&r);
    same_weights("ZeRO-3 killed and restarted", "z3", "killed");

    /* N -> M and across stages. */
    char from[600];
    snprintf(from, sizeof from, "--procs 2 --set dist.zero=0 --steps 12 --resume %s",
             e2e_path("z3/step-00000006"));
    train("ZeRO-3 -> ZeRO-0", from, "to0");
    same_weights("saved by ZeRO-3, resumed by ZeRO-0", "z0", "to0");
    train("ZeRO-1, 2 processes", "--procs 2 --set dist.zero=1 --steps 12", "z1");
    snprintf(from, sizeof from, "--procs 2 --set dist.zero=3 --steps 12 --resume %s",
             e2e_path("z1/step-00000006"));
    train("ZeRO-1 -> ZeRO-3", from, "from1");
    same_weights("saved by ZeRO-1, resumed by ZeRO-3", "z0", "from1");
    snprintf(from, sizeof from, "--procs 4 --set dist.zero=3 --steps 12 --resume %s",
             e2e_path("z3/step-00000006"));
    train("2 ZeRO-3 ranks -> 4", from, "on4");
    snprintf(from, sizeof from, "--procs 4 --set dist.zero=0 --steps 12 --resume %s",
             e2e_path("z3/step-00000006"));
    train("2 ZeRO-3 ranks -> 4 ZeRO-0 ranks", from, "on4z0");
    same_weights("2 -> 4 ranks: ZeRO-3 as ZeRO-0", "on4z0", "on4");
    snprintf(from, sizeof from, "--steps 12 --resume %s", e2e_path("z3/step-00000006"));
    train("2 ZeRO-3 ranks -> 1 process", from, "on1");
    r = e2e_runf("ckpt inspect %s", e2e_path("on1"));
    CHECK(r.rc == 0 && strstr(r.out, "step 12,"), "1 process saved step 12: %s%s", r.out, r.err);
    e2e_done(&r);
}

static void test_memory_limit(void) {
    /* W3 (GPT, 23 M parameters) needs about 763 MiB in one process. */
    e2e_result r = e2e_runf("train examples/w3.yaml --steps 1 --set dist.max_mem_mb=500 --out %s",
                            e2e_path("w3-one"));
    CHECK(r.rc == 2 && strstr(r.err, "the plan needs ") && strstr(r.err, "MiB per process") &&
              strstr(r.err, "dist.max_mem_mb = 500 MiB") && strstr(r.err, "dist.zero: 3") &&
              strstr(r.err, "pipeline stages"),
          "W3 over the limit in one process: exit %d\n%s", r.rc, r.err);
    e2e_done(&r);
    r = e2e_runf("compile examples/w3.yaml --set dist.max_mem_mb=500");
    CHECK(r.rc == 2 && strstr(r.err, "the plan needs "),
          "tessel compile over the limit: exit %d\n%s", r.rc, r.err);
    e2e_done(&r);
    r = e2e_runf("train examples/w3.yaml --procs 2 --steps 1 --set dist.zero=3 "
                 "--set dist.bucket_mb=1 --set dist.max_mem_mb=500 --out %s",
                 e2e_path("w3-z3"));
    CHECK(r.rc == 0 && strstr(r.out, "step 1/1") && strstr(r.out, "ZeRO-3, buckets of 88.7"),
          "W3 under ZeRO-3 on 2 processes fits 500 MiB: exit %d\n%s%s", r.rc, r.out, r.err);
    e2e_done(&r);
}

/* Under mpirun (no shared memory: the blocks travel by MPI_Iallgatherv
 * from their own buffer), when mpirun is on the PATH: the bits of ZeRO-3
 * over shm, which are ZeRO-0's. */
static void test_mpi(const char *bin) {
    char mpirun[600];
    if (!e2e_find_mpirun(mpirun, sizeof mpirun)) {
        printf("zero3: no mpirun on the PATH, the MPI run is left out\n");
        return;
    }
    char cmd[4096];
    snprintf(cmd, sizeof cmd,
             /* Open MPI leaks at finalize (see dist_mpi): no leak check under it */
             "ASAN_OPTIONS=detect_leaks=0 '%s' %s--oversubscribe -np 2 '%s' train examples/w1.yaml "
             "%s --set dist.zero=3 "
             "--steps 12 --out %s >%s 2>&1",
             mpirun, geteuid() == 0 ? "--allow-run-as-root " : "", bin, small, e2e_path("mpi"),
             e2e_path("mpi.log"));
    int rc = system(cmd);
    char *log = e2e_slurp(e2e_path("mpi.log"), NULL);
    CHECK(rc == 0, "ZeRO-3 under mpirun: status %d\n%s", rc, log);
    free(log);
    same_weights("ZeRO-3 under mpirun vs ZeRO-0 over shm", "z0", "mpi");
}

/* fp16 with dynamic loss scaling from a scale so high that the first 8
 * steps overflow (skipped, the scale halved): each bucket unscales and
 * flags its gradients before its reduce-scatter, as under ZeRO-1/2; the
 * same skips and weights as ZeRO-0. */
static void test_fp16(void) {
    static const char *const fp16 =
        "--steps 12 --procs 2 --set precision.default=fp16 --set precision.init_scale=33554432";
    char args[300];
    snprintf(args, sizeof args, "%s --set dist.zero=0", fp16);
    train("fp16, ZeRO-0", args, "fp16z0");
    snprintf(args, sizeof args, "%s --set dist.zero=3", fp16);
    train("fp16, ZeRO-3", args, "fp16z3");
    same_weights("fp16 with overflowing steps: ZeRO-3 vs ZeRO-0", "fp16z0", "fp16z3");
    char *m = e2e_slurp(e2e_path("fp16z3/metrics.jsonl"), NULL);
    CHECK(strstr(m, "\"step_skipped\":1") && strstr(m, "\"step_skipped\":0"),
          "fp16, ZeRO-3: steps skipped, then not");
    free(m);
}

/* The benchmark's ZeRO-3 runs: they train and report the memory. */
static void test_bench(void) {
    e2e_result r = e2e_run("bench --workload W1 --procs 2 --threads 1 --steps 1 --warmup 0 "
                           "--rounds 1 --zero 3 --bucket-mb 1");
    CHECK(r.rc == 0 && strstr(r.out, "(shm, ZeRO-3: parameters gathered per bucket") &&
              strstr(r.out, "memory per process: "),
          "bench --zero 3: exit %d: %s%s", r.rc, r.out, r.err);
    e2e_done(&r);
}

#define BC_CSV "/usr/lib/python3/dist-packages/sklearn/datasets/data/breast_cancer.csv"

/* The "eval" lines of a run's metrics.jsonl, joined. */
static char *eval_lines(const char *run) {
    char path[512];
    snprintf(path, sizeof path, "%s/metrics.jsonl", e2e_path(run));
    long n = 0;
    char *all = e2e_slurp(path, &n), *out = calloc((size_t)n + 1, 1);
    if (!all || !out) {
        free(all);
        free(out);
        return NULL;
    }
    for (char *line = strtok(all, "\n"); line; line = strtok(NULL, "\n"))
        if (strstr(line, "\"type\":\"eval\"")) strcat(strcat(out, line), "\n");
    free(all);
    return out;
}

static void test_eval(void) {
    if (access(BC_CSV, R_OK) != 0) {
        printf("zero3: %s missing (python3-sklearn), evaluation left out\n", BC_CSV);
        return;
    }
    char *ev[2] = {NULL, NULL};
    const char *runs[2] = {"bc0", "bc3"};
    for (int i = 0; i < 2; i++) {
        e2e_result r = e2e_runf("train examples/breast_cancer.yaml --procs 2 --set train.epochs=2 "
                                "--set train.threads=1 --set dist.bucket_mb=0.004 --set "
                                "data.drop_last=true --set dist.zero=%d --out %s",
                                i ? 3 : 0, e2e_path(runs[i]));
        CHECK(r.rc == 0 && strstr(r.out, "val  loss"), "eval, zero %d: exit %d\n%s%s", i ? 3 : 0,
              r.rc, r.out, r.err);
        e2e_done(&r);
        ev[i] = eval_lines(runs[i]);
    }
    CHECK(ev[0] && ev[1] && strstr(ev[0], "\"step\":14") && strstr(ev[0], "\"step\":28") &&
              !strcmp(ev[0], ev[1]),
          "eval records, zero 0:\n%s\nzero 3:\n%s", ev[0] ? ev[0] : "(none)",
          ev[1] ? ev[1] : "(none)");
    free(ev[0]);
    free(ev[1]);
}

static void refused(const char *args, const char *want) {
    e2e_result r = e2e_runf("train examples/w1.yaml %s --procs 2 --set dist.zero=3 %s --out %s",
                            small, args, e2e_path("refused"));
    CHECK(r.rc == 2 && strstr(r.err, want) && strstr(r.err, "dist.zero"),
          "ZeRO-3 with %s: exit %d, want '%s' and dist.zero in:\n%s", args, r.rc, want, r.err);
    e2e_done(&r);
}

int main(void) {
    char dir[64];
    const char *bin = e2e_setup("zero3", dir, sizeof dir);
    if (!bin) return check_summary("e2e/zero3");
    test_equal_and_resume();
    test_mpi(bin);
    test_fp16();
    test_bench();
    test_memory_limit();
    test_eval();
    refused("--set dist.compress=topk", "dist.compress");
    refused("--set shape.policy=bucket", "shape.policy");
    refused("--set peft.lora.targets=net", "peft.lora.targets");
    e2e_cleanup(dir);
    return check_summary("e2e/zero3");
}
