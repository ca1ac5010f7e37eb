/* Rollback is detected (end to end through `tessel`): a step-N directory
 * renamed to a newer name, an old checkpoint copied in under the newest
 * name, LATEST pointed at an older checkpoint than the newest save the
 * audit log records, and audit-log entries cut from the end past a save
 * are refused by `ckpt verify`, `export`, `audit verify` and resume, each
 * with a message naming what is out of place; the truncation forms of a
 * signed run's log are in test_truncation. */
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

/* A signed run of 6 steps into `run` (key DIR/k.key). */
static void fresh_signed(const char *run) {
    e2e_sh("rm -rf '%s/%s'", dir, run);
    e2e_result r = e2e_runf("train examples/w1.yaml %s --set ckpt.sign_key=%s/k.key --steps 6 "
                            "--out %s/%s",
                            small, dir, dir, run);
    CHECK(r.rc == 0, "%s: exit %d\n%s", run, r.rc, r.err);
    e2e_done(&r);
}

/* Audit-log truncation of a signed run (docs/checkpoints.md, "What the
 * audit log proves"): every committed checkpoint has a "commit" entry
 * logged before its rename, so cutting the newest save's entries with
 * their signed head is refused while the checkpoint exists; cutting only
 * its "save" entry and the head (the state a kill between the commit and
 * the entry leaves) verifies with a warning and resumes; an entry
 * appended with a valid chain is shown as the unsigned tail, and a run
 * that resumes over it records that in the entry its heads sign. */
static void test_truncation(void) {
    e2e_result r = e2e_runf("keygen --out %s/k", dir);
    CHECK(r.rc == 0, "keygen: %s", r.err);
    e2e_done(&r);

    /* From step-6's commit entry to the end: refused everywhere. */
    fresh_signed("cut-newest");
    e2e_sh("cd '%s/cut-newest' && n=$(grep -n '\"event\":\"commit\"' audit.log | grep "
           "step-00000006 | cut -d: -f1) && head -n $((n - 1)) audit.log >a && mv a audit.log",
           dir);
    all_refuse("cut-newest", "records neither its commit nor its save");

    /* Only step-6's save entry and what follows: a kill's state. */
    fresh_signed("cut-save");
    e2e_sh("cd '%s/cut-save' && n=$(grep -n '\"event\":\"save\"' audit.log | grep "
           "step-00000006 | cut -d: -f1) && head -n $((n - 1)) audit.log >a && mv a audit.log",
           dir);
    r = e2e_runf("audit verify %s/cut-save --pubkey %s/k.pub", dir, dir);
    CHECK(r.rc == 0 && strstr(r.out, "warning: the newest checkpoint step-00000006 is logged") &&
              strstr(r.out, "unsigned tail: "),
          "cut after the commit: exit %d\n%s%s", r.rc, r.out, r.err);
    e2e_done(&r);
    r = e2e_runf("train examples/w1.yaml %s --set ckpt.sign_key=%s/k.key --steps 8 --resume "
                 "latest --out %s/cut-save",
                 small, dir, dir);
    CHECK(r.rc == 0 && strstr(r.out, "resuming from") && strstr(r.out, "step 6"),
          "resume of the kill's state: exit %d\n%s%s", r.rc, r.out, r.err);
    e2e_done(&r);
    r = e2e_runf("audit verify %s/cut-save --pubkey %s/k.pub", dir, dir);
    CHECK(r.rc == 0 && !strstr(r.out, "warning") && !strstr(r.out, "unsigned tail"),
          "after the resume, signed to the end: exit %d\n%s%s", r.rc, r.out, r.err);
    /* ... and the log says what the resumed run signed over. */
    CHECK(strstr(r.out, "note: runs that signed this log opened it over entries nobody had "
                        "signed") &&
              strstr(r.out, "(1 entries)"),
          "the commit entry the resume signed over is recorded:\n%s", r.out);
    e2e_done(&r);

    /* An entry appended with a valid chain: not silent. */
    fresh_signed("appended");
    e2e_sh("cd '%s/appended' && h=$(tail -n 1 audit.log | tr -d '\\n' | sha256sum | cut -c1-64) "
           "&& n=$(wc -l <audit.log) && printf '{\"event\":\"forged\",\"prev\":\"%%s\","
           "\"seq\":%%d,\"time\":\"x\"}\\n' \"$h\" \"$n\" >>audit.log",
           dir);
    r = e2e_runf("audit verify %s/appended --pubkey %s/k.pub", dir, dir);
    CHECK(r.rc == 0 && strstr(r.out, "unsigned tail: ") && strstr(r.out, "(forged)"),
          "appended entry: exit %d\n%s%s", r.rc, r.out, r.err);
    e2e_done(&r);
    /* A resume does not launder it: its run says so and records it. */
    r = e2e_runf("train examples/w1.yaml %s --set ckpt.sign_key=%s/k.key --steps 8 --resume "
                 "latest --out %s/appended",
                 small, dir, dir);
    CHECK(r.rc == 0 && strstr(r.out, "ends in 1 entries no signed head covers"),
          "resume over the appended entry: exit %d\n%s%s", r.rc, r.out, r.err);
    e2e_done(&r);
    r = e2e_runf("audit verify %s/appended --pubkey %s/k.pub", dir, dir);
    CHECK(r.rc == 0 && strstr(r.out, "(1 entries)") && !strstr(r.out, "unsigned tail"),
          "the signed-over entry is recorded: exit %d\n%s%s", r.rc, r.out, r.err);
    e2e_done(&r);
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

    test_truncation();
    e2e_cleanup(dir);
    return check_summary("e2e/rollback");
}
