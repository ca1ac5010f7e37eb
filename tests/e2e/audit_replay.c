/* `tessel audit replay` end to end (docs/reproducibility.md, "Replay"): a
 * signed 4-process dist.reproducible run replayed from its middle
 * checkpoint with 1 and with 2 processes reproduces its last checkpoint
 * bit for bit (exit 0, verdict identical, a signed report, a "replay"
 * entry in an audit log that still verifies); a changed config key and a
 * changed data file are refused, naming the key and the file; and a run
 * without dist.reproducible replayed on another process count names the
 * first tensor that differs (exit 3). */
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include "check.h"
#include "e2e.h"

static char dir[64];

static void replay_same(const char *run, int procs) {
    e2e_result r = e2e_runf("audit replay %s/%s --from 4 --procs %d", dir, run, procs);
    CHECK(r.rc == 0, "replay with %d processes: exit %d: %s", procs, r.rc, r.err);
    CHECK(strstr(r.out, "\"verdict\": \"identical\"") && strstr(r.out, "\"processes\": 4") &&
              strstr(r.out, "\"micro_batches\": 4") && strstr(r.out, "\"same_build\": true"),
          "replay with %d processes: the report: %s", procs, r.out);
    CHECK(strstr(r.out, "\"algorithm\": \"ed25519\"") && strstr(r.out, "\"value\": \""),
          "the report is signed: %s", r.out);
    CHECK(strstr(r.err, "IDENTICAL: 30 tensors of step 8"), "stderr: %s", r.err);
    e2e_done(&r);
}

int main(void) {
    const char *bin = e2e_setup("audit_replay", dir, sizeof dir);
    if (!bin) return check_summary("e2e/audit_replay");
    e2e_sh("'%s' keygen --out %s/k >/dev/null", bin, dir);
    const char *w1 = "examples/w1.yaml --steps 8 --set model.hidden=64 --set model.batch=64 "
                     "--set ckpt.every=4";
    e2e_result r = e2e_runf("train %s --procs 4 --set dist.reproducible=true --set "
                            "ckpt.sign_key=%s/k.key --out %s/run",
                            w1, dir, dir);
    CHECK(r.rc == 0, "4-process run: exit %d: %s", r.rc, r.err);
    e2e_done(&r);
    replay_same("run", 1);
    replay_same("run", 2);
    /* The kernel path records tessel's Winograd convolutions: turned off
     * (W1 has none, so the bits stay), the path differs on a CPU that has
     * them. */
    setenv("TESSEL_CONV_WINOGRAD", "0", 1);
    r = e2e_runf("audit replay %s/run --from 4 --procs 1", dir);
    unsetenv("TESSEL_CONV_WINOGRAD");
    const int wino = __builtin_cpu_supports("avx512f");
    CHECK(r.rc == 0 && strstr(r.out, "conv winograd off") &&
              strstr(r.out, wino ? "\"same_cpu_path\": false" : "\"same_cpu_path\": true"),
          "replay with TESSEL_CONV_WINOGRAD=0: exit %d: %s", r.rc, r.out);
    e2e_done(&r);
    r = e2e_runf("audit verify %s/run --pubkey %s/k.pub", dir, dir);
    CHECK(r.rc == 0 && strstr(r.out, "OK"), "the log with its replay entries verifies: %s %s",
          r.out, r.err);
    e2e_done(&r);
    char *log = e2e_slurp(e2e_path("run/audit.log"), NULL);
    int n = 0;
    for (const char *p = log; (p = strstr(p, "\"event\":\"replay\"")); p++) n++;
    CHECK(n == 3, "three replay entries in audit.log (%d)", n);
    free(log);

    /* A changed config key is named. */
    e2e_sh("sed -i 's/^  lr: 0.001$/  lr: 0.002/' %s/run/config.yaml", dir);
    r = e2e_runf("audit replay %s/run --from 4", dir);
    CHECK(r.rc == 2 && strstr(r.err, "train.lr is 0.002, the run recorded 0.001"),
          "changed config: exit %d: %s", r.rc, r.err);
    e2e_done(&r);

    /* A changed data file is named. */
    e2e_sh("cp /usr/lib/python3/dist-packages/sklearn/datasets/data/breast_cancer.csv %s/bc.csv "
           "2>/dev/null || printf 'a,b,y\\n' > %s/bc.csv",
           dir, dir);
    if (access("/usr/lib/python3/dist-packages/sklearn/datasets/data/breast_cancer.csv", R_OK) ==
        0) {
        r = e2e_runf("train examples/breast_cancer.yaml --steps 4 --set train.epochs=0 --set "
                     "ckpt.every=2 --set "
                     "data.path=%s/bc.csv --set dist.reproducible=true --set data.drop_last=true "
                     "--out %s/csv", /* dist.reproducible trains no short batch */
                     dir, dir);
        CHECK(r.rc == 0, "csv run: exit %d: %s", r.rc, r.err);
        e2e_done(&r);
        r = e2e_runf("audit replay %s/csv --from 2", dir);
        CHECK(r.rc == 0 && strstr(r.out, "bc.csv"), "csv replay (data hashed): %s %s", r.out,
              r.err);
        e2e_done(&r);
        e2e_sh("sed -i '5s/^./9/' %s/bc.csv", dir);
        r = e2e_runf("audit replay %s/csv --from 2", dir);
        CHECK(r.rc == 2 && strstr(r.err, "bc.csv: SHA-256") && strstr(r.err, "the data changed"),
              "changed data file: exit %d: %s", r.rc, r.err);
        e2e_done(&r);
    } else {
        printf("data tamper check skipped: the breast cancer CSV is not installed\n");
    }

    /* Without dist.reproducible another process count changes the bits. */
    r = e2e_runf("train %s --procs 2 --out %s/plain", w1, dir);
    CHECK(r.rc == 0, "plain run: exit %d: %s", r.rc, r.err);
    e2e_done(&r);
    r = e2e_runf("audit replay %s/plain --from 4 --procs 1", dir);
    CHECK(r.rc == 3 && strstr(r.err, "DIFFERENT: the first tensor that differs is ") &&
              strstr(r.out, "\"first_difference\"") && strstr(r.out, "\"max_abs_diff\""),
          "plain run on 1 process: exit %d: %s", r.rc, r.err);
    e2e_done(&r);
    e2e_cleanup(dir);
    return check_summary("e2e/audit_replay");
}
