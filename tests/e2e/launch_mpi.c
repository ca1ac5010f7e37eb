/* `tessel launch --max-restarts K -- mpirun ... tessel train ...` end to
 * end: a rank SIGKILLed mid-run (the TESSEL_TEST_KILL_RANK/STEP knob, which
 * the MPI path arms from TESSEL_LAUNCH_ATTEMPT) makes mpirun fail; launch
 * names the rank and host from mpirun's report, runs the command again
 * with --resume latest, and the run ends with the weights of an
 * uninterrupted mpirun run (tessel ckpt diff). A crash in every attempt
 * gives up after K; a refused config (exit 2) is not retried; a command
 * without --out cannot be restarted; tessel train --max-restarts under
 * mpirun points to tessel launch. Needs mpirun (else exit 77, skipped). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include "check.h"
#include "e2e.h"

static char dir[64], mpirun[600];
static const char *bin;

static const char *small =
    "--set model.batch=16 --set model.hidden=32 --set model.window=4 --set model.features=4 "
    "--set train.threads=1 --set dist.algo=native --set ckpt.every=2 --steps 8";

/* "mpirun [--allow-run-as-root] --oversubscribe -np 2 BIN train w1 SMALL" */
static const char *job(void) {
    static char j[2048];
    snprintf(j, sizeof j, "'%s' %s--oversubscribe -np 2 '%s' train examples/w1.yaml %s", mpirun,
             geteuid() == 0 ? "--allow-run-as-root " : "", bin, small);
    return j;
}

static void test_restart(void) {
    char cmd[4096];
    snprintf(cmd, sizeof cmd, "%s --out %s >%s 2>&1", job(), e2e_path("full"),
             e2e_path("full.log"));
    int rc = system(cmd);
    char *log = e2e_slurp(e2e_path("full.log"), NULL);
    CHECK(rc == 0, "uninterrupted mpirun: status %d\n%s", rc, log);
    free(log);

    /* Rank 1 dies in step 5 of the first attempt; step 4's checkpoint. */
    setenv("TESSEL_TEST_KILL_RANK", "1", 1);
    setenv("TESSEL_TEST_KILL_STEP", "5", 1);
    e2e_result r = e2e_runf("launch --max-restarts 2 -- %s --out %s", job(), e2e_path("killed"));
    CHECK(r.rc == 0, "killed once, relaunched: exit %d\n%s%s", r.rc, r.out, r.err);
    CHECK(strstr(r.err, "mpirun noticed that process rank 1"), "mpirun's report passes: %s", r.err);
    CHECK(strstr(r.out, "restart 1/2 from step-00000004 after rank 1 on host ") &&
              strstr(r.out, " killed by signal 9"),
          "the restart line names rank, host and signal: %s", r.out);
    CHECK(strstr(r.out, "resuming from") && strstr(r.out, "at step 4") &&
              strstr(r.out, "done: 8 steps") && !strstr(r.out, "restart 2/2"),
          "one restart, resumed at step 4, finished: %s", r.out);
    e2e_done(&r);
    r = e2e_runf("ckpt diff %s %s", e2e_path("full"), e2e_path("killed"));
    CHECK(r.rc == 0 && strstr(r.out, " 0 different") && strstr(r.out, "step-00000008 (step 8)"),
          "relaunched run: the weights of the uninterrupted one: %s%s", r.out, r.err);
    e2e_done(&r);
    char *audit = e2e_slurp(e2e_path("killed/audit.log"), NULL);
    CHECK(strstr(audit, "\"event\":\"restart\"") && strstr(audit, "\"rank\":1"),
          "a restart entry in the audit log: %s", audit);
    free(audit);

    /* A crash in step 1 of every attempt: one restart (from the start: no
     * checkpoint yet), then it gives up. */
    setenv("TESSEL_TEST_KILL_STEP", "1", 1);
    setenv("TESSEL_TEST_KILL_ATTEMPTS", "9", 1);
    r = e2e_runf("launch --max-restarts 1 -- %s --out %s", job(), e2e_path("always"));
    unsetenv("TESSEL_TEST_KILL_ATTEMPTS");
    CHECK(r.rc == 1 && strstr(r.out, "restart 1/1 from the start after rank 1 on host ") &&
              strstr(r.err, "gave up after 1 restart (--max-restarts 1); the last attempt failed: "
                            "rank 1 on host "),
          "exhausted: exit %d\n%s%s", r.rc, r.out, r.err);
    e2e_done(&r);
    unsetenv("TESSEL_TEST_KILL_RANK");
    unsetenv("TESSEL_TEST_KILL_STEP");
}

static void test_refusals(void) {
    /* A config the run refuses: exit 2 from every rank, not retried. */
    e2e_result r = e2e_runf("launch --max-restarts 3 -- %s --set model.batch=15 --out %s", job(),
                            e2e_path("bad"));
    CHECK(r.rc == 2 && strstr(r.err, "not restarted") && !strstr(r.out, "restart 1/"),
          "a refused config: exit %d\n%s%s", r.rc, r.out, r.err);
    e2e_done(&r);
    r = e2e_runf("launch --max-restarts 1 -- %s", job());
    CHECK(r.rc == 2 && strstr(r.err, "names no run directory"), "no --out: exit %d: %s", r.rc,
          r.err);
    e2e_done(&r);
    r = e2e_runf("launch --max-restarts 1");
    CHECK(r.rc == 2 && strstr(r.err, "no command after '--'"), "no command: exit %d: %s", r.rc,
          r.err);
    e2e_done(&r);
    char cmd[4096];
    snprintf(cmd, sizeof cmd, "%s --max-restarts 1 --out %s >%s 2>&1", job(), e2e_path("inner"),
             e2e_path("inner.log"));
    int rc = system(cmd);
    char *log = e2e_slurp(e2e_path("inner.log"), NULL);
    CHECK(rc != 0 && strstr(log, "tessel launch --max-restarts 1 -- mpirun"),
          "train --max-restarts under mpirun points to tessel launch: %s", log);
    free(log);
}

int main(void) {
    if (!e2e_find_mpirun(mpirun, sizeof mpirun)) {
        printf("launch_mpi: skipped: mpirun (openmpi-bin) not on PATH\n");
        return 77;
    }
    if (!(bin = e2e_setup("launch-mpi", dir, sizeof dir))) return check_summary("e2e/launch_mpi");
    setenv("TESSEL_COLL_CACHE", "0", 1);
    setenv("ASAN_OPTIONS", "detect_leaks=0", 1);
    test_restart();
    test_refusals();
    e2e_cleanup(dir);
    return check_summary("e2e/launch_mpi");
}
