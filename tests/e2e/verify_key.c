/* e2e: which key a resume checks a checkpoint's signature against (docs/checkpoints.md):
 * ckpt.verify_key's file; by default, with ckpt.sign_key set, the public half of the run's
 * own signing key, so a checkpoint signed by another key is refused; `none` for checksums
 * only. Also: a signing key that others may read is refused before the run directory is
 * written. */
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include "check.h"
#include "e2e.h"

static char dir[64];

#define CFG "examples/w1.yaml --set model.hidden=32 --set model.batch=8 --set train.steps=4"

int main(void) {
    if (!e2e_setup("verify_key", dir, sizeof dir)) return check_summary("e2e/verify_key");

    e2e_result r = e2e_runf("keygen --out %s/a", dir);
    CHECK(r.rc == 0, "keygen a: %s", r.err);
    e2e_done(&r);
    r = e2e_runf("keygen --out %s/b", dir);
    CHECK(r.rc == 0, "keygen b: %s", r.err);
    e2e_done(&r);

    /* A run signed with key a, two steps, a checkpoint at step 2. */
    r = e2e_runf("train " CFG " --steps 2 --set train.total_steps=4 --set ckpt.every=2 "
                 "--set ckpt.sign_key=%s/a.key --out %s/run",
                 dir, dir);
    CHECK(r.rc == 0, "signed run: %s", r.err);
    e2e_done(&r);

    /* Resumed with sign_key b and no verify_key: checked against b's public half, refused. */
    r = e2e_runf("train " CFG " --set ckpt.sign_key=%s/b.key --resume %s/run/step-00000002 "
                 "--out %s/other",
                 dir, dir, dir);
    CHECK(r.rc != 0, "a checkpoint signed by key a resumed under key b without verify_key");
    CHECK(strstr(r.err, "signed by key") != NULL, "the refusal names the key: %s", r.err);
    e2e_done(&r);
    struct stat st;
    CHECK(stat(e2e_path("other/config.yaml"), &st) != 0, "the refused run wrote config.yaml");

    /* The same under its own key a: verified, resumes. */
    r = e2e_runf("train " CFG " --set ckpt.sign_key=%s/a.key --resume %s/run/step-00000002 "
                 "--out %s/own",
                 dir, dir, dir);
    CHECK(r.rc == 0, "resume under the run's own key: %s", r.err);
    e2e_done(&r);

    /* verify_key none: checksums only, so key b may resume it. */
    r = e2e_runf("train " CFG " --set ckpt.sign_key=%s/b.key --set ckpt.verify_key=none "
                 "--resume %s/run/step-00000002 --out %s/none",
                 dir, dir, dir);
    CHECK(r.rc == 0, "verify_key none: %s", r.err);
    e2e_done(&r);

    /* A signing key others can read is refused before anything is written. */
    CHECK(chmod(e2e_path("b.key"), 0644) == 0, "chmod");
    r = e2e_runf("train " CFG " --set ckpt.sign_key=%s/b.key --out %s/loose", dir, dir);
    CHECK(r.rc == 2, "a 0644 signing key: rc %d (want 2): %s", r.rc, r.err);
    CHECK(strstr(r.err, "ckpt.sign_key") != NULL, "the error names the key: %s", r.err);
    e2e_done(&r);
    CHECK(stat(e2e_path("loose/config.yaml"), &st) != 0, "the refused run wrote config.yaml");

    e2e_cleanup(dir);
    return check_summary("e2e/verify_key");
}
