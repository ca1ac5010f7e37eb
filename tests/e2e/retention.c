/* Retention during a run (ckpt.keep_last, ckpt.keep_every), end to end:
 * after every save, not only the first, the checkpoints that are neither
 * among the newest K, a multiple of M, nor LATEST's are removed. (The
 * saver lists its run directory through a descriptor it keeps open: a
 * listing that did not start at the beginning saw nothing after the first
 * save, and every checkpoint stayed.) */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "check.h"
#include "e2e.h"

static char dir[64];

static const char *small =
    "--set model.batch=16 --set model.hidden=32 --set model.window=4 --set model.features=4 "
    "--set train.threads=1 --set ckpt.every=2 --set observe.tensorboard=false --steps 10";

/* The step directories of run `name`, space-separated. */
static char *steps_of(const char *name) {
    char cmd[256];
    snprintf(cmd, sizeof cmd, "cd '%s/%s' && ls -d step-* | tr '\\n' ' ' >'%s/%s.ls'", dir, name,
             dir, name);
    CHECK(system(cmd) == 0, "%s", cmd);
    char path[160];
    snprintf(path, sizeof path, "%s/%s.ls", dir, name);
    return e2e_slurp(path, NULL);
}

static void run(const char *name, const char *keep, const char *want) {
    e2e_result r = e2e_runf("train examples/w1.yaml %s %s --out %s/%s", small, keep, dir, name);
    CHECK(r.rc == 0, "%s: exit %d\n%s", name, r.rc, r.err);
    e2e_done(&r);
    char *got = steps_of(name);
    CHECK(!strcmp(got, want), "%s (%s): kept '%s', expected '%s'", name, keep, got, want);
    free(got);
}

int main(void) {
    if (!e2e_setup("retention", dir, sizeof dir)) return check_summary("e2e/retention");
    run("last1", "--set ckpt.keep_last=1", "step-00000010 ");
    run("last2every4", "--set ckpt.keep_last=2 --set ckpt.keep_every=4",
        "step-00000004 step-00000008 step-00000010 ");
    run("all", "--set ckpt.keep_last=0",
        "step-00000002 step-00000004 step-00000006 step-00000008 step-00000010 ");
    e2e_cleanup(dir);
    return check_summary("e2e/retention");
}
