/* A federated run survives the kill of any role mid-round (docs/federated.md,
 * "Resuming"). Five processes (aggregator, key holder, 3 clients) run 3
 * rounds of Paillier FedAvg on breast-cancer shards; as soon as the key
 * holder has committed round 1 (round 2 under way) one role gets SIGKILL:
 *   - a client: the round completes with the other two, and so does the run
 *     (3 rounds committed; the rounds after the kill without the killed
 *     client: 2 and 3, or 3 alone where the client had already sent its
 *     round-2 update when the kill landed, which a loaded machine allows);
 *   - the aggregator, or the key holder: every other role ends (none hangs)
 *     with an error that names the killed role (clients too: the
 *     aggregator's DONE carries why the run ended);
 *     all five restarted on the same key-holder directory continue from the
 *     last committed global model and commit the remaining rounds, with a
 *     signed, verifiable audit chain across both runs. */
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include "check.h"
#include "e2e.h"
#include "tessel/tessel.h"

#define CSV    "/usr/lib/python3/dist-packages/sklearn/datasets/data/breast_cancer.csv"
#define ROUNDS 3

static const char *bin;
static char dir[256];
static int port;
static const char *roles[] = {"agg", "kh", "site1", "site2", "site3"};

static void write_config(void) {
    FILE *f = fopen(e2e_path("fed.yaml"), "w");
    if (!f) return;
    fprintf(f,
            "model: {name: mlp, window: 0, in_dim: 30, hidden: 32, n_hidden: 2, layer_norm: "
            "false, classes: 2, batch: 32}\n"
            "data: {source: csv, path: %s/s1.csv, header: false, label: \"30\", window: 1, "
            "horizon: 0, normalise: true, val_fraction: 0.2}\n"
            "train: {optimizer: adamw, lr: 3.0e-3, steps: 10, seed: 0, threads: 1}\n"
            "ckpt: {sign_key: %s/sign.key}\n"
            "fed:\n  rounds: %d\n  local_steps: 10\n  min_clients: 2\n  max_clients: 3\n"
            "  key_bits: 1024\n  timeout_s: 20\n  join_s: 10\n  tls: {ca: %s/ca/ca.pem}\n",
            dir, dir, ROUNDS, dir);
    fclose(f);
}

/* Starts the five roles of run `tag` (key holder in kh-KH, the others in
 * NAME-TAG) for `rounds` rounds; kill_role >= 0: SIGKILL that role once
 * kh-KH/LATEST names round 1's checkpoint (committed; the key holder has
 * already sent round 2's global model). Returns the exit statuses in rc. */
static void launch(const char *tag, const char *kh, int rounds, int kill_role, int rc[5]) {
    static char cmd[16384];
    int p = port++, k = 0;
    k += snprintf(cmd + k, sizeof cmd - (size_t)k, "cd %s\n", dir);
    for (int i = 0; i < 5; i++) {
        const char *verb = i == 0 ? "serve" : i == 1 ? "keyholder" : "join";
        const char *cert = i == 0 ? "aggregator" : i == 1 ? "keyholder" : roles[i];
        char data[600] = "", out[64];
        if (i >= 2) snprintf(data, sizeof data, "--set data.path=%s/s%d.csv", dir, i - 1);
        snprintf(out, sizeof out, "%s-%s", roles[i], i == 1 ? kh : tag);
        k += snprintf(cmd + k, sizeof cmd - (size_t)k,
                      "%s fed %s fed.yaml %s --set fed.rounds=%d --set fed.port=%d "
                      "--set fed.key=%s/kh.key --set fed.tls.cert=ca/%s.pem "
                      "--set fed.tls.key=ca/%s.key --out %s >%s-%s.log 2>&1 &\n"
                      "p%d=$!\n%s",
                      bin, verb, data, rounds, p, i == 1 ? dir : "absent", cert, cert, out,
                      roles[i], tag, i, "");
        if (i == 0) /* the others start once the aggregator listens (at most 120 s) */
            k += snprintf(cmd + k, sizeof cmd - (size_t)k,
                          "i=0; until grep -qs 'listening on' agg-%s.log || [ $i -ge 1200 ]; do "
                          "sleep 0.1; i=$((i+1)); done\n",
                          tag);
    }
    if (kill_role >= 0)
        k += snprintf(cmd + k, sizeof cmd - (size_t)k,
                      "( i=0; while ! grep -qs step-00000001 kh-%s/LATEST && [ $i -lt 1200 ]; "
                      "do sleep 0.05; i=$((i+1)); done; kill -9 $p%d ) &\n",
                      kh, kill_role);
    for (int i = 0; i < 5; i++)
        k += snprintf(cmd + k, sizeof cmd - (size_t)k, "wait $p%d; echo $? >%s-%s.rc\n", i,
                      roles[i], tag);
    snprintf(cmd + k, sizeof cmd - (size_t)k, "wait\n");
    FILE *f = fopen(e2e_path("run.sh"), "w");
    CHECK(f != NULL, "run.sh");
    if (!f) return;
    fputs(cmd, f);
    fclose(f);
    e2e_sh("sh %s", e2e_path("run.sh"));
    for (int i = 0; i < 5; i++) {
        char path[512];
        snprintf(path, sizeof path, "%s/%s-%s.rc", dir, roles[i], tag);
        char *r = e2e_slurp(path, NULL);
        rc[i] = r[0] ? atoi(r) : -1;
        free(r);
    }
}

static char *log_of(const char *role, const char *tag) {
    char path[512];
    snprintf(path, sizeof path, "%s/%s-%s.log", dir, role, tag);
    return e2e_slurp(path, NULL);
}

/* The step of the key holder's last committed global model. */
static int64_t committed(const char *kh) {
    char path[512];
    snprintf(path, sizeof path, "%s/kh-%s", dir, kh);
    ts_ckpt *ck = NULL;
    ts_ckpt_info info = {0};
    if (ts_ckpt_open(path, NULL, NULL, &ck) != TS_OK) return -1;
    if (ts_ckpt_get_info(ck, &info) != TS_OK) info.step = -1;
    ts_ckpt_close(ck);
    return info.step;
}

static int count(const char *text, const char *what) {
    int n = 0;
    for (const char *p = text; (p = strstr(p, what)); p++) n++;
    return n;
}

/* Kill role `victim` (0 aggregator, 1 key holder) mid-round 2, then resume. */
static void kill_server_role(int victim) {
    static const char *const cert_of[2] = {"aggregator", "keyholder"}; /* names in messages */
    const char *tag = victim == 0 ? "ka" : "kk";
    int rc[5];
    launch(tag, tag, ROUNDS, victim, rc);
    CHECK(rc[victim] == 137, "%s: the killed %s exited %d", tag, roles[victim], rc[victim]);
    for (int i = 0; i < 5; i++) { /* the others noticed and ended (none hangs) */
        char *l = log_of(roles[i], tag);
        CHECK(rc[i] >= 0, "%s: %s did not end: %s", tag, roles[i], l);
        /* every other role fails, naming the role that was killed (a
         * client whose aggregator lost the key holder learns it from the
         * aggregator's DONE, which carries the aggregator's error) */
        CHECK(i == victim || (rc[i] != 0 && strstr(l, cert_of[victim])),
              "%s: %s exited %d after the kill of the %s: %s", tag, roles[i], rc[i],
              cert_of[victim], l);
        free(l);
    }
    int64_t c = committed(tag);
    CHECK(c >= 1 && c < ROUNDS, "%s: %lld rounds committed before the kill", tag, (long long)c);
    if (c < 1 || c >= ROUNDS) return;
    char again[16];
    snprintf(again, sizeof again, "%s-r", tag);
    launch(again, tag, ROUNDS - (int)c, -1, rc);
    for (int i = 0; i < 5; i++) {
        char *l = log_of(roles[i], again);
        CHECK(rc[i] == 0, "%s: %s exited %d: %s", again, roles[i], rc[i], l);
        free(l);
    }
    char *kl = log_of("kh", again), want[64];
    snprintf(want, sizeof want, "(round %lld)", (long long)c);
    CHECK(strstr(kl, "resumes from") && strstr(kl, want), "%s: key holder did not resume: %s",
          again, kl);
    free(kl);
    CHECK(committed(tag) == ROUNDS, "%s: %lld rounds committed after resuming", tag,
          (long long)committed(tag));
    char path[512];
    snprintf(path, sizeof path, "%s/kh-%s/audit.log", dir, tag);
    char *audit = e2e_slurp(path, NULL);
    for (int r = 1; r <= ROUNDS; r++) { /* every committed round has its entry */
        char e[32];
        snprintf(e, sizeof e, "\"round\":%d,", r);
        CHECK(strstr(audit, e) != NULL, "%s: no fed_round entry of round %d: %.300s", tag, r,
              audit);
    }
    free(audit);
    e2e_result v = e2e_runf("audit verify %s/kh-%s --pubkey %s/sign.pub", dir, tag, dir);
    CHECK(v.rc == 0, "%s: audit verify: %s %s", tag, v.out, v.err);
    e2e_done(&v);
    printf("e2e/fed_resume: %s killed in round %lld, the run resumed from round %lld and "
           "committed round %d\n",
           roles[victim], (long long)c + 1, (long long)c, ROUNDS);
}

int main(void) {
    CHECK(access(CSV, R_OK) == 0, "%s missing (scripts/install-deps.sh installs it)", CSV);
    if (!(bin = e2e_setup("fed_resume", dir, sizeof dir))) return check_summary("e2e/fed_resume");
    static char abs_bin[PATH_MAX]; /* the roles run in dir */
    if (realpath(bin, abs_bin)) bin = abs_bin;
    e2e_sh("scripts/fed-test-ca.sh %s/ca aggregator keyholder site1 site2 site3 >/dev/null", dir);
    e2e_sh("tail -n +2 %s | awk -v d=%s 'NR%%3==1{print > d\"/s1.csv\"} NR%%3==2{print > "
           "d\"/s2.csv\"} NR%%3==0{print > d\"/s3.csv\"}'",
           CSV, dir);
    e2e_sh("%s keygen --out %s/sign >/dev/null", bin, dir);
    port = 20000 + (int)((getpid() * 13) % 20000);
    write_config();

    /* a client killed mid-round 2: the rounds it did not send complete without it */
    int rc[5];
    launch("kc", "kc", ROUNDS, 3, rc);
    CHECK(rc[3] == 137, "the killed client exited %d", rc[3]);
    for (int i = 0; i < 5; i++) {
        char *l = log_of(roles[i], "kc");
        CHECK(i == 3 || rc[i] == 0, "kc: %s exited %d: %s", roles[i], rc[i], l);
        free(l);
    }
    CHECK(committed("kc") == ROUNDS, "kc: %lld rounds committed", (long long)committed("kc"));
    /* round 1 had all three clients; round 2 too if the client's update was in before the kill
     * (the kill waits for round 1's commit, polling every 0.05 s); every later round two, and
     * one round records the drop */
    char *m = e2e_slurp(e2e_path("agg-kc/metrics.jsonl"), NULL);
    const int with3 = count(m, "\"clients\": 3");
    CHECK(with3 >= 1 && with3 <= ROUNDS - 1 && count(m, "\"clients\": 2") == ROUNDS - with3 &&
              count(m, "\"dropped\": 1") == 1,
          "kc: aggregator metrics after the kill: %s", m);
    free(m);

    kill_server_role(0);
    kill_server_role(1);
    e2e_cleanup(dir);
    return check_summary("e2e/fed_resume");
}
