/* Checkpoints of ZeRO-1 runs end to end (`tessel train --procs 2 --set
 * dist.zero=1 --set ckpt.every=2`): every rank saves its block of the
 * optimizer state, rank 0 the rest and the manifest. 12 steps against 6 +
 * --resume latest + 6 give byte-identical checkpoints; ZeRO-1 and ZeRO-0
 * checkpoints resume each other into the uninterrupted weights; a ZeRO
 * checkpoint continues on one process and on 4 ZeRO ranks; a flipped byte
 * in rank 1's shard is refused naming the file and tensor; and workers
 * killed with SIGKILL while saves are in flight are restarted from a
 * checkpoint that verifies, ending with the uninterrupted weights.
 * tests/unit/ckpt_zero.c checks that N -> M loads the exact state. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#include "check.h"
#include "e2e.h"

static char dir[64];

/* Small buckets (4 KB): blocks cut across parameters. No clipping, so
 * ZeRO-1 is bit-identical to ZeRO-0. */
static const char *small =
    "--set model.batch=16 --set model.hidden=32 --set model.window=4 --set model.features=4 "
    "--set train.threads=1 --set dist.algo=native --set dist.bucket_mb=0.004 "
    "--set ckpt.every=2 --set ckpt.keep_last=0 --set train.total_steps=12";

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

static void train(const char *what, const char *args, const char *out) {
    e2e_result r = e2e_runf("train examples/w1.yaml %s %s --out %s", small, args, e2e_path(out));
    CHECK(r.rc == 0, "%s: exit %d\n%s%s", what, r.rc, r.out, r.err);
    e2e_done(&r);
}

/* The latest checkpoints of two runs hold the same bytes at step 12. */
static void same_weights(const char *what, const char *a, const char *b) {
    e2e_result r = e2e_runf("ckpt diff %s %s", e2e_path(a), e2e_path(b));
    CHECK(r.rc == 0 && strstr(r.out, " 0 different") && strstr(r.out, "step-00000012 (step 12)"),
          "%s: ckpt diff exit %d\n%s%s", what, r.rc, r.out, r.err);
    e2e_done(&r);
}

static void test_resume(void) {
    train("uninterrupted, ZeRO-1", "--procs 2 --set dist.zero=1 --steps 12", "full");
    e2e_result r = e2e_runf("ckpt inspect %s", e2e_path("full"));
    CHECK(r.rc == 0 && strstr(r.out, "layout: world 2 (zero)") && strstr(r.out, "chunks: [0, ") &&
              strstr(r.out, "optim-r1-000.safetensors:zero.bucket"),
          "inspect shows the layout and chunks: %s%s", r.out, r.err);
    e2e_done(&r);
    char *m = e2e_slurp(e2e_path("full/step-00000012/manifest.json"), NULL);
    CHECK(strstr(m, "\"optim-r0-000.safetensors\"") && strstr(m, "\"optim-r1-000.safetensors\"") &&
              strstr(m, "\"name\": \"net.0.weight.exp_avg\"") &&
              !strstr(m, "zero.bucket0.exp_avg\","),
          "manifest: both ranks' files, logical tensors");
    free(m);
    struct stat st;
    CHECK(stat(e2e_path("full/step-00000012/rank-1.json"), &st) != 0,
          "the handshake files are not part of the committed checkpoint");
    r = e2e_runf("export %s --safetensors %s", e2e_path("full"), e2e_path("w.safetensors"));
    CHECK(r.rc == 0, "export: %s%s", r.out, r.err);
    e2e_done(&r);
    long n = 0;
    char *w = e2e_slurp(e2e_path("w.safetensors"), &n);
    const char *hdr = n > 8 ? w + 8 : ""; /* the JSON header, up to the first NUL of the data */
    CHECK(strstr(hdr, "\"net.0.weight\"") && !strstr(hdr, "exp_avg") && !strstr(hdr, "zero."),
          "export writes the weights only");
    free(w);

    train("6 steps", "--procs 2 --set dist.zero=1 --steps 6", "half");
    train("resumed", "--procs 2 --set dist.zero=1 --steps 12 --resume latest", "half");
    same_weights("12 vs 6 + resume + 6", "full", "half");
    r = e2e_runf("audit verify %s", e2e_path("half"));
    CHECK(r.rc == 0, "audit log: %s%s", r.out, r.err);
    e2e_done(&r);

    /* ZeRO-0 and ZeRO-1 checkpoints are interchangeable. */
    train("uninterrupted, ZeRO-0", "--procs 2 --set dist.zero=0 --steps 12", "full0");
    same_weights("ZeRO-1 vs ZeRO-0", "full", "full0");
    char from[600];
    snprintf(from, sizeof from, "--procs 2 --set dist.zero=0 --steps 12 --resume %s",
             e2e_path("full/step-00000006"));
    train("ZeRO-1 -> ZeRO-0", from, "to0");
    same_weights("saved by ZeRO-1, resumed by ZeRO-0", "full", "to0");
    snprintf(from, sizeof from, "--procs 2 --set dist.zero=1 --steps 12 --resume %s",
             e2e_path("full0/step-00000006"));
    train("ZeRO-0 -> ZeRO-1", from, "to1");
    same_weights("saved by ZeRO-0, resumed by ZeRO-1", "full", "to1");

    /* ZeRO-2 shards the gradients too, not the state differently: its
     * checkpoints are ZeRO-1's, and resuming either way gives the bits of
     * the uninterrupted run. */
    train("uninterrupted, ZeRO-2", "--procs 2 --set dist.zero=2 --steps 12", "full2");
    same_weights("ZeRO-2 vs ZeRO-1", "full", "full2");
    train("6 steps, ZeRO-2", "--procs 2 --set dist.zero=2 --steps 6", "half2");
    train("resumed, ZeRO-2", "--procs 2 --set dist.zero=2 --steps 12 --resume latest", "half2");
    same_weights("ZeRO-2: 12 vs 6 + resume + 6", "full", "half2");
    snprintf(from, sizeof from, "--procs 2 --set dist.zero=1 --steps 12 --resume %s",
             e2e_path("full2/step-00000006"));
    train("ZeRO-2 -> ZeRO-1", from, "from2");
    same_weights("saved by ZeRO-2, resumed by ZeRO-1", "full", "from2");

    /* 2 ranks -> 1 process, -> 4 ZeRO ranks: they continue. */
    snprintf(from, sizeof from, "--steps 12 --resume %s", e2e_path("full/step-00000006"));
    train("2 ZeRO ranks -> 1 process", from, "on1");
    snprintf(from, sizeof from, "--procs 4 --set dist.zero=1 --steps 12 --resume %s",
             e2e_path("full/step-00000006"));
    train("2 ZeRO ranks -> 4", from, "on4");
    r = e2e_runf("ckpt inspect %s", e2e_path("on4"));
    CHECK(r.rc == 0 && strstr(r.out, "step 12,") && strstr(r.out, "layout: world 4 (zero)"),
          "4 ranks saved step 12: %s%s", r.out, r.err);
    e2e_done(&r);
}

/* Signed: rank 0 signs the manifest, which holds every rank's file hashes. */
static void test_signed(void) {
    e2e_result r = e2e_runf("keygen --out %s", e2e_path("k"));
    CHECK(r.rc == 0, "keygen: %s", r.err);
    e2e_done(&r);
    char args[700];
    snprintf(args, sizeof args,
             "--procs 2 --set dist.zero=1 --steps 4 --set ckpt.sign_key=%s "
             "--set ckpt.verify_key=%s",
             e2e_path("k.key"), e2e_path("k.pub"));
    train("signed", args, "signed");
    r = e2e_runf("ckpt verify %s --pubkey %s", e2e_path("signed"), e2e_path("k.pub"));
    CHECK(r.rc == 0 && strstr(r.out, "signature verified"), "signed ZeRO checkpoint: %s%s", r.out,
          r.err);
    e2e_done(&r);
    snprintf(args, sizeof args,
             "--procs 2 --set dist.zero=1 --steps 6 --set ckpt.sign_key=%s "
             "--set ckpt.verify_key=%s --resume latest",
             e2e_path("k.key"), e2e_path("k.pub"));
    train("signed, resumed", args, "signed");
    r = e2e_runf("audit verify %s --pubkey %s", e2e_path("signed"), e2e_path("k.pub"));
    CHECK(r.rc == 0, "audit log of the signed run: %s%s", r.out, r.err);
    e2e_done(&r);
}

static void test_tampered(void) {
    char cmd[700];
    snprintf(cmd, sizeof cmd, "cp -r '%s' '%s'", e2e_path("full/step-00000006"),
             e2e_path("tampered"));
    CHECK(system(cmd) == 0, "copy a checkpoint");
    /* The last bytes of rank 1's file: its block of the last bucket, which
     * ends with a parameter's state (padding lies between tensors). */
    FILE *f = fopen(e2e_path("tampered/optim-r1-000.safetensors"), "r+b");
    CHECK(f != NULL, "open rank 1's shard");
    if (f) {
        fseek(f, -2, SEEK_END);
        int c = fgetc(f);
        fseek(f, -2, SEEK_END);
        fputc(c ^ 0x40, f);
        fclose(f);
    }
    e2e_result r = e2e_runf("train examples/w1.yaml %s --procs 2 --set dist.zero=1 --steps 12 "
                            "--resume %s --out %s",
                            small, e2e_path("tampered"), e2e_path("from-tampered"));
    CHECK(r.rc == 2 && strstr(r.err, "optim-r1-000.safetensors: tensor 'net.") &&
              strstr(r.err, ".exp_avg") && strstr(r.err, "fails its CRC-32C"),
          "a flipped byte: exit %d: %s", r.rc, r.err);
    e2e_done(&r);
    CHECK(access(e2e_path("from-tampered"), F_OK) != 0, "a refused resume writes nothing");
}

/* Workers killed in step 5 of the first two attempts, while the previous
 * step's save is being written in the background. */
static void test_killed(const char *rank, const char *name) {
    kill_knob(rank, "5", "2");
    e2e_result r = e2e_runf("train examples/w1.yaml %s --procs 2 --set dist.zero=1 --steps 12 "
                            "--max-restarts 3 --out %s",
                            small, e2e_path(name));
    kill_knob(NULL, NULL, NULL);
    CHECK(r.rc == 0 && strstr(r.out, "restart 1/3") && strstr(r.out, "restart 2/3") &&
              !strstr(r.out, "restart 3/3") && strstr(r.out, "killed by signal 9"),
          "rank %s killed twice: exit %d\n%s%s", rank, r.rc, r.out, r.err);
    e2e_done(&r);
    r = e2e_runf("ckpt verify %s", e2e_path(name));
    CHECK(r.rc == 0 && strstr(r.out, "step 12,"), "latest verifies: %s%s", r.out, r.err);
    e2e_done(&r);
    same_weights("killed and restarted", "full", name);
}

static double now_s(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

/* The launcher's workers: its children. */
static int workers(pid_t pid, pid_t *out, int max) {
    char path[64];
    snprintf(path, sizeof path, "/proc/%d/task/%d/children", (int)pid, (int)pid);
    FILE *f = fopen(path, "r");
    if (!f) return 0;
    int n = 0;
    long c;
    while (n < max && fscanf(f, "%ld", &c) == 1) out[n++] = (pid_t)c;
    fclose(f);
    return n;
}

/* SIGKILL one worker of a run saving every step at a random moment,
 * again and again: after each kill the run directory's LATEST verifies,
 * and the next attempt resumes from it; a run that reaches the last step
 * has the uninterrupted run's weights. */
static void test_random_kills(const char *bin) {
    const char *cfg = "--procs 2 --set dist.zero=1 --set ckpt.every=1 --set model.hidden=96 "
                      "--steps 12";
    train("uninterrupted reference", cfg, "rk-ref");
    char run[256], log[256], cmd[2048];
    snprintf(run, sizeof run, "%s", e2e_path("rk"));
    snprintf(log, sizeof log, "%s", e2e_path("rk.log"));
    unsigned seed = (unsigned)getpid();
    int kills = 0, finished = 0;
    double dur = 0.3; /* how long a whole attempt takes here (learnt from those that finish) */
    const double t_end = now_s() + 20;
    for (int attempt = 0; attempt < 40 && (kills < 6 || !finished) && now_s() < t_end; attempt++) {
        char latest[300];
        snprintf(latest, sizeof latest, "%s/LATEST", run);
        const int resume = access(latest, F_OK) == 0;
        if (!resume) {
            snprintf(cmd, sizeof cmd, "rm -rf '%s'", run);
            CHECK(system(cmd) == 0, "remove %s", run);
        }
        /* No leak check in these launchers under ASan: at exit LeakSanitizer runs a tracer as
         * the launcher's child, and a random child killed then is that tracer, which leaves the
         * launcher waiting for it forever (seen once under ASan in session 23). */
        snprintf(cmd, sizeof cmd,
                 "ASAN_OPTIONS=detect_leaks=0 exec %s train examples/w1.yaml %s %s %s --out %s "
                 ">>%s 2>&1",
                 bin, small, cfg, resume ? "--resume latest" : "", run, log);
        pid_t pid = fork();
        if (pid == 0) {
            execl("/bin/sh", "sh", "-c", cmd, (char *)NULL);
            _exit(127);
        }
        CHECK(pid > 0, "fork");
        if (pid <= 0) return;
        /* Every step saves: any moment of the attempt is in a save or
         * close to one. */
        const int last = kills >= 6; /* let one attempt run to the end */
        const double t0 = now_s(), delay = dur * (0.1 + 0.8 * (rand_r(&seed) % 1000) / 1000.0);
        struct timespec d = {(time_t)delay, (long)((delay - (double)(time_t)delay) * 1e9)};
        nanosleep(&d, NULL);
        pid_t w[8];
        int nw = last ? 0 : workers(pid, w, 8), killed = 0;
        if (nw > 0) killed = kill(w[rand_r(&seed) % (unsigned)nw], SIGKILL) == 0;
        int status = 0;
        waitpid(pid, &status, 0);
        const int ok = WIFEXITED(status) && WEXITSTATUS(status) == 0;
        kills += killed && !ok;
        if (ok && !resume) dur = 0.5 * dur + 0.5 * (now_s() - t0);
        int at_end = ok;
        if (!ok && killed && access(latest, F_OK) == 0) {
            e2e_result r = e2e_runf("ckpt verify %s", run);
            CHECK(r.rc == 0, "after kill %d: LATEST does not verify: %s%s", kills, r.out, r.err);
            /* killed after the last step's checkpoint was committed */
            at_end = strstr(r.out, "step 12,") != NULL;
            e2e_done(&r);
        }
        if (at_end) {
            /* The run reached the end before (or despite) the kill. */
            e2e_result r = e2e_runf("ckpt diff %s %s", e2e_path("rk-ref"), run);
            CHECK(r.rc == 0 && strstr(r.out, " 0 different") && strstr(r.out, "(step 12)"),
                  "after %d kills: the finished run's weights: %s%s", kills, r.out, r.err);
            e2e_done(&r);
            finished++;
            snprintf(cmd, sizeof cmd, "rm -rf '%s'", run);
            CHECK(system(cmd) == 0, "remove %s", run);
            continue;
        }
        CHECK(killed, "attempt %d failed without a kill (exit status %d); see %s", attempt, status,
              log);
        if (!killed) break;
    }
    printf("random kills: %d workers killed, %d runs finished with the reference weights\n", kills,
           finished);
    CHECK(kills >= 3 && finished >= 1, "%d kills, %d finished runs (want >= 3 and >= 1)", kills,
          finished);
}

int main(void) {
    const char *bin = e2e_setup("ckpt-zero-e2e", dir, sizeof dir);
    if (!bin) return check_summary("e2e/ckpt_zero");
    test_resume();
    test_signed();
    test_tampered();
    test_killed("1", "killed1");
    test_killed("0", "killed0");
    test_random_kills(bin);
    e2e_cleanup(dir);
    return check_summary("e2e/ckpt_zero");
}
