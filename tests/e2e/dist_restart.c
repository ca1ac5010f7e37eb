/* `tessel train --procs 2 --max-restarts K` end to end: a worker killed
 * once mid-run (the TESSEL_TEST_KILL_RANK/STEP knob of launch.c) is
 * restarted from the latest checkpoint and the run ends with the weights of
 * an uninterrupted run; a kill before the first checkpoint restarts from
 * the start in a new run directory; K = 0 fails; a setup error is not
 * retried; and what cannot restart (no checkpoints, one process) is
 * refused (ZeRO restarts: tests/e2e/ckpt_zero.c). */
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include "check.h"
#include "e2e.h"

static char dir[64];

static const char *small =
    "--set model.batch=16 --set model.hidden=32 --set model.window=4 --set model.features=4 "
    "--set train.threads=1 --set dist.algo=native --set ckpt.every=2 --steps 8 --procs 2";

static void kill_knob(const char *rank, const char *step) {
    if (rank) {
        setenv("TESSEL_TEST_KILL_RANK", rank, 1);
        setenv("TESSEL_TEST_KILL_STEP", step, 1);
    } else {
        unsetenv("TESSEL_TEST_KILL_RANK");
        unsetenv("TESSEL_TEST_KILL_STEP");
    }
}

/* The final checkpoints of two runs hold the same bytes. */
static void same_weights(const char *what, const char *a, const char *b) {
    e2e_result r = e2e_runf("ckpt diff %s %s", e2e_path(a), e2e_path(b));
    CHECK(r.rc == 0 && strstr(r.out, " 0 different") && strstr(r.out, "step-00000008 (step 8)"),
          "%s: ckpt diff exit %d\n%s%s", what, r.rc, r.out, r.err);
    e2e_done(&r);
}

static void test_restart(void) {
    e2e_result r = e2e_runf("train examples/w1.yaml %s --out %s", small, e2e_path("full"));
    CHECK(r.rc == 0, "uninterrupted: exit %d: %s", r.rc, r.err);
    e2e_done(&r);

    /* Rank 1 dies in step 5; step 4's checkpoint is the latest. */
    kill_knob("1", "5");
    r = e2e_runf("train examples/w1.yaml %s --max-restarts 2 --out %s", small, e2e_path("killed"));
    kill_knob(NULL, NULL);
    CHECK(r.rc == 0, "killed once, restarted: exit %d\n%s%s", r.rc, r.out, r.err);
    CHECK(strstr(r.out, "restart 1/2 from step-00000004 after rank 1 killed by signal 9"),
          "the restart line: %s", r.out);
    CHECK(strstr(r.out, "resuming from") && !strstr(r.out, "restart 2/2"),
          "one restart, resumed: %s", r.out);
    CHECK(strstr(r.out, "done: 8 steps"), "the restarted attempt finishes: %s", r.out);
    e2e_done(&r);
    same_weights("killed at step 5", "full", "killed");
    char *sum = e2e_slurp(e2e_path("killed/summary.json"), NULL);
    CHECK(strstr(sum, "\"status\": \"completed\""), "summary: %s", sum);
    free(sum);
    char *log = e2e_slurp(e2e_path("killed/audit.log"), NULL);
    CHECK(strstr(log, "\"event\":\"restart\"") && strstr(log, "\"checkpoint\":\"step-00000004\"") &&
              strstr(log, "\"failure\":\"killed by signal 9\""),
          "a restart entry in the audit log: %s", log);
    free(log);
    r = e2e_runf("audit verify %s", e2e_path("killed"));
    CHECK(r.rc == 0, "the audit log with the restart entry verifies: %s%s", r.out, r.err);
    e2e_done(&r);

    /* Rank 0 dies in step 1, before any checkpoint: from the start, in a
     * new run directory; the failed attempt's is kept beside it. */
    kill_knob("0", "1");
    r = e2e_runf("train examples/w1.yaml %s --max-restarts 1 --out %s", small, e2e_path("early"));
    kill_knob(NULL, NULL);
    CHECK(r.rc == 0, "killed before a checkpoint: exit %d\n%s%s", r.rc, r.out, r.err);
    CHECK(strstr(r.out, "restart 1/1 from the start after rank 0 killed by signal 9"),
          "the restart line: %s", r.out);
    CHECK(access(e2e_path("early.attempt-1"), F_OK) == 0, "the failed attempt's directory is kept");
    e2e_done(&r);
    same_weights("killed at step 1", "full", "early");

    /* A crash in every attempt: K restarts, then the run gives up. */
    kill_knob("1", "1");
    setenv("TESSEL_TEST_KILL_ATTEMPTS", "9", 1);
    r = e2e_runf("train examples/w1.yaml %s --max-restarts 1 --out %s", small, e2e_path("always"));
    unsetenv("TESSEL_TEST_KILL_ATTEMPTS");
    kill_knob(NULL, NULL);
    CHECK(r.rc == 1 &&
              strstr(r.out, "restart 1/1 from the start after rank 1 killed by signal 9") &&
              !strstr(r.out, "restart 2/") &&
              strstr(r.err, "gave up after 1 restart (--max-restarts 1); the last attempt:") &&
              strstr(r.err, "rank 1 killed by signal 9"),
          "exhausted: exit %d\n%s%s", r.rc, r.out, r.err);
    e2e_done(&r);

    /* K = 0: the failure ends the run. */
    kill_knob("1", "5");
    r = e2e_runf("train examples/w1.yaml %s --max-restarts 0 --out %s", small, e2e_path("k0"));
    kill_knob(NULL, NULL);
    CHECK(r.rc != 0 && strstr(r.err, "rank 1 killed by signal 9") && !strstr(r.out, "restart 1/"),
          "--max-restarts 0: exit %d\n%s%s", r.rc, r.out, r.err);
    e2e_done(&r);
}

static void test_refusals(void) {
    /* A setup failure would repeat: not restarted, nothing counted twice. */
    e2e_result r = e2e_runf("train examples/w1.yaml %s --max-restarts 3 --resume %s --out %s",
                            small, e2e_path("nothing"), e2e_path("bad"));
    CHECK(r.rc != 0 &&
              strstr(r.err,
                     "not restarted (0 of --max-restarts 3 used): attempt 1 failed in setup") &&
              !strstr(r.out, "restart 1/"),
          "setup error: exit %d\n%s%s", r.rc, r.out, r.err);
    e2e_done(&r);
    r = e2e_runf("train examples/w1.yaml %s --set ckpt.every=0 --max-restarts 1 --out %s", small,
                 e2e_path("nockpt"));
    CHECK(r.rc == 2 && strstr(r.err, "set ckpt.every"), "no checkpoints: exit %d: %s", r.rc, r.err);
    e2e_done(&r);
    r = e2e_runf("train examples/w1.yaml %s --procs 1 --max-restarts 1 --out %s", small,
                 e2e_path("one"));
    CHECK(r.rc == 2 && strstr(r.err, "this run has one process"), "one process: exit %d: %s", r.rc,
          r.err);
    e2e_done(&r);
    CHECK(access(e2e_path("nockpt"), F_OK) != 0 && access(e2e_path("one"), F_OK) != 0,
          "a refused run writes nothing");
}

int main(void) {
    if (!e2e_setup("dist-restart", dir, sizeof dir)) return check_summary("e2e/dist_restart");
    test_restart();
    test_refusals();
    e2e_cleanup(dir);
    return check_summary("e2e/dist_restart");
}
