/* Rollback is detected (end to end through `tessel`): a step-N directory
 * renamed to a newer name, an old checkpoint copied in under the newest
 * name, LATEST pointed at an older checkpoint than the newest save the
 * audit log records, and audit-log entries cut from the end past a save
 * are refused by `ckpt verify`, `export`, `audit verify` and resume, each
 * with a message naming what is out of place. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "check.h"
#include "e2e.h"

static char dir[64];

static const char *small =
    "--set model.batch=16 --set model.hidden=32 --set model.window=4 --set model.features=4 "
    "--set train.threads=1 --set ckpt.every=2 --set ckpt.keep_last=0 --set train.total_steps=12 "
    "--set observe.tensorboard=false";

static void fresh(const char *run) {
    e2e_sh("rm -rf '%s/%s'", dir, run);
    e2e_result r = e2e_runf("train examples/w1.yaml %s --steps 6 --out %s/%s", small, dir, run);
    CHECK(r.rc == 0, "%s: exit %d\n%s", run, r.rc, r.err);
    e2e_done(&r);
}

static void refused(const char *what, e2e_result r, const char *needle) {
    CHECK(r.rc != 0, "%s: exit 0, expected a refusal\n%s", what, r.out);
    CHECK(strstr(r.err, needle) != NULL, "%s: '%s' not in: %s", what, needle, r.err);
    e2e_done(&r);
}

static void all_refuse(const char *run, const char *needle) {
    char what[64];
    snprintf(what, sizeof what, "%s: ckpt verify", run);
    refused(what, e2e_runf("ckpt verify %s/%s", dir, run), needle);
    snprintf(what, sizeof what, "%s: export", run);
    refused(what, e2e_runf("export %s/%s --safetensors %s/%s.st", dir, run, dir, run), needle);
    snprintf(what, sizeof what, "%s: audit verify", run);
    refused(what, e2e_runf("audit verify %s/%s", dir, run), needle);
    snprintf(what, sizeof what, "%s: resume", run);
    refused(what,
            e2e_runf("train examples/w1.yaml %s --steps 8 --resume latest --out %s/%s", small, dir,
                     run),
            needle);
}

int main(void) {
    if (!e2e_setup("rollback", dir, sizeof dir)) return check_summary("e2e/rollback");

    fresh("ok");
    e2e_result r = e2e_runf("audit verify %s/ok", dir);
    CHECK(r.rc == 0, "audit verify of an untouched run: %s", r.err);
    e2e_done(&r);

    /* step-4 renamed to the newest name. */
    fresh("renamed");
    e2e_sh("cd '%s/renamed' && rm -rf step-00000006 && mv step-00000004 step-00000006", dir);
    all_refuse("renamed", "was saved as 'step-00000004'");

    /* An old checkpoint copied in under the newest name. */
    fresh("copied");
    e2e_sh("cd '%s/copied' && rm -rf step-00000006 && cp -r step-00000002 step-00000006", dir);
    all_refuse("copied", "was saved as 'step-00000002'");

    /* LATEST pointed back at an older checkpoint. */
    fresh("latest");
    e2e_sh("echo step-00000004 >'%s/latest/LATEST'", dir);
    all_refuse("latest", "LATEST was pointed at an older checkpoint");

    /* The log cut from the end past the save of step-4. */
    fresh("cut");
    e2e_sh(
        "cd '%s/cut' && n=$(grep -n '\"dir\":\"step-00000004\"' audit.log | grep save | head -1 | "
        "cut -d: -f1) && head -n $((n - 1)) audit.log >a && mv a audit.log",
        dir);
    r = e2e_runf("audit verify %s/cut", dir);
    CHECK(r.rc != 0 && strstr(r.err, "removed"), "cut log: exit %d: %s", r.rc, r.err);
    e2e_done(&r);

    e2e_cleanup(dir);
    return check_summary("e2e/rollback");
}
