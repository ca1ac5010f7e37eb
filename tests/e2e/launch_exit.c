/* How `tessel train --procs 2` ends when a worker dies by a signal (the
 * TESSEL_TEST_KILL_RANK/STEP knob of launch.c kills it with SIGKILL in a
 * step): exit status 1 whichever rank it was, a message naming the rank and
 * the signal (number and name), and no "done:" summary line (with its "median nan") before
 * the failure; a failed run reports how far it got instead. A run that
 * completes still prints its "done:" line. */
#include <stdlib.h>
#include <string.h>
#include "check.h"
#include "e2e.h"

static char dir[64];

static const char *small =
    "--set model.batch=16 --set model.hidden=32 --set model.window=4 --set model.features=4 "
    "--set train.threads=1 --set ckpt.every=2 --steps 8 --procs 2";

static void killed(const char *rank) {
    setenv("TESSEL_TEST_KILL_RANK", rank, 1);
    setenv("TESSEL_TEST_KILL_STEP", "5", 1);
    e2e_result r = e2e_runf("train examples/w1.yaml %s --out %s", small, e2e_path(rank));
    unsetenv("TESSEL_TEST_KILL_RANK");
    unsetenv("TESSEL_TEST_KILL_STEP");
    char named[64];
    snprintf(named, sizeof named, "rank %s killed by signal 9 (SIGKILL)", rank);
    CHECK(r.rc == 1, "rank %s killed: exit %d, expected 1\n%s%s", rank, r.rc, r.out, r.err);
    CHECK(strstr(r.err, named) != NULL, "rank %s killed: not named: %s", rank, r.err);
    CHECK(!strstr(r.out, "done:") && !strstr(r.out, "nan"),
          "rank %s killed: a summary line before the failure:\n%s", rank, r.out);
    if (rank[0] == '1') /* rank 0 saw its peer go after step 4 */
        CHECK(strstr(r.out, "failed after 4 steps") != NULL, "how far it got:\n%s", r.out);
    e2e_done(&r);
}

int main(void) {
    if (!e2e_setup("launch-exit", dir, sizeof dir)) return check_summary("e2e/launch_exit");
    killed("0");
    killed("1");
    e2e_result r = e2e_runf("train examples/w1.yaml %s --out %s", small, e2e_path("ok"));
    CHECK(r.rc == 0 && strstr(r.out, "done: 8 steps"), "a completed run: %d\n%s%s", r.rc, r.out,
          r.err);
    e2e_done(&r);
    e2e_cleanup(dir);
    return check_summary("e2e/launch_exit");
}
