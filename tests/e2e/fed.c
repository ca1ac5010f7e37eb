/* tessel fed serve|keyholder|join on loopback (docs/federated.md): an
 * aggregator, a key holder and 3 clients, each a process, train the breast
 * cancer MLP on 3 shards of the CSV for 3 rounds with Paillier aggregation
 * over TLS. Checks: every role exits 0; the key holder saved a signed
 * checkpoint per round, logged each round's participants, bytes and hashes
 * to its audit log (verified by tessel audit verify) and metrics; the
 * clients' loss at the start of round 3 is below round 1's (the global model
 * learned); the aggregator ran with no key file, and nothing it wrote or
 * logged holds a client's update in the clear. Bad input: a key file others
 * can read, a client whose certificate another CA signed, a client told
 * another key holder name (fed.keyholder_name) refusing the relayed key. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include "check.h"
#include "e2e.h"
#include "fed_e2e.h"
#include "tessel/tessel.h"

#define CSV "/usr/lib/python3/dist-packages/sklearn/datasets/data/breast_cancer.csv"

static const char *bin;
static char dir[256];

static void write_config(int port, int rounds, double join_s, double timeout_s) {
    FILE *f = fopen(e2e_path("fed.yaml"), "w");
    if (!f) return;
    fprintf(
        f,
        "model: {name: mlp, window: 0, in_dim: 30, hidden: 32, n_hidden: 2, layer_norm: false, "
        "classes: 2, "
        "batch: 32}\n"
        "data: {source: csv, path: %s/s1.csv, header: false, label: \"30\", window: 1, horizon: 0, "
        "normalise: "
        "true, val_fraction: 0.2}\n"
        "train: {optimizer: adamw, lr: 3.0e-3, steps: 10, metrics: accuracy, seed: 0, threads: 1}\n"
        "ckpt: {sign_key: %s/sign.key}\n"
        "fed:\n  rounds: %d\n  local_steps: 10\n  min_clients: 2\n  max_clients: 3\n  key_bits: "
        "1024\n"
        "  timeout_s: %g\n  join_s: %g\n  port: %d\n  key: %s/kh/paillier.key\n  tls: {ca: "
        "%s/ca/ca.pem}\n",
        dir, dir, rounds, timeout_s, join_s, port, dir, dir);
    fclose(f);
}

/* "--set fed.tls.cert=... --set fed.tls.key=..." for a role's certificate in CA dir `ca`. */
static const char *tls_args(const char *ca, const char *name) {
    static char buf[4][1024];
    static int k;
    char *b = buf[k++ % 4];
    snprintf(b, 1024, "--set fed.tls.cert=%s/%s/%s.pem --set fed.tls.key=%s/%s/%s.key", dir, ca,
             name, dir, ca, name);
    return b;
}

static double first_loss(const char *summary) {
    char *s = e2e_slurp(summary, NULL);
    const char *p = strstr(s, "\"first_loss\":");
    double v = p ? atof(p + 13) : NAN;
    free(s);
    return v;
}

/* Privacy: no 16-byte window (4 floats) of any site's round-1 update in the
 * clear (its local model less the global model, from their checkpoints)
 * appears in any file the aggregator wrote or in its log. */
static void check_aggregator_stores_no_update(void) {
    char path[600];
    snprintf(path, sizeof path, "%s/kh/step-%08d", dir, 0);
    ts_ckpt *g = NULL, *l = NULL;
    CHECK_OK(ts_ckpt_open(path, NULL, NULL, &g));
    char *files[16];
    long lens[16];
    int nf = 0;
    e2e_sh("cd %s && find agg -type f > agg.files && echo agg.log >> agg.files", dir);
    char *list = e2e_slurp(e2e_path("agg.files"), NULL);
    for (char *t = strtok(list, "\n"); t && nf < 16; t = strtok(NULL, "\n")) {
        snprintf(path, sizeof path, "%s/%s", dir, t);
        files[nf] = e2e_slurp(path, &lens[nf]);
        nf++;
    }
    free(list);
    int windows = 0, found = 0;
    for (int i = 1; g && i <= 3; i++) {
        snprintf(path, sizeof path, "%s/site%d/round-001", dir, i);
        CHECK_OK(ts_ckpt_open(path, NULL, NULL, &l));
        ts_ckpt_tensor ti;
        for (int t = 0; l && t < ts_ckpt_tensor_count(g); t++) {
            if (ts_ckpt_tensor_info(g, t, &ti) != TS_OK || ti.is_state) continue;
            float *a = malloc(ti.bytes), *b = malloc(ti.bytes);
            CHECK_OK(ts_ckpt_read(g, ti.name, a, ti.bytes));
            CHECK_OK(ts_ckpt_read(l, ti.name, b, ti.bytes));
            for (size_t j = 0; j < ti.bytes / 4; j++) b[j] -= a[j];
            for (size_t j = 0; j + 4 <= ti.bytes / 4; j += 8, windows++)
                for (int f = 0; f < nf; f++)
                    for (long o = 0; o + 16 <= lens[f]; o++)
                        if (!memcmp(files[f] + o, b + j, 16)) {
                            found++;
                            break;
                        }
            free(a);
            free(b);
        }
        ts_ckpt_close(l);
    }
    ts_ckpt_close(g);
    CHECK(nf >= 3 && windows > 500 && found == 0,
          "the aggregator's %d files hold %d of %d windows of the sites' updates", nf, found,
          windows);
    for (int f = 0; f < nf; f++) free(files[f]);
}

static int count(const char *text, const char *what) {
    int n = 0;
    for (const char *p = text; (p = strstr(p, what)); p++) n++;
    return n;
}

/* The five processes, each leaving its exit status in NAME<suffix>.rc; the
 * key holder always works in DIR/kh, the others in NAME<suffix>. Checks
 * that every one exited 0. */
static void launch(const char *sfx, const char *extra) {
    char cmd[8192];
    int k = snprintf(
        cmd, sizeof cmd,
        "cd %s && { %s fed serve fed.yaml %s %s --set fed.key=%s/none/absent.key --out agg%s "
        ">agg%s.log 2>&1; echo $? >agg%s.rc; } & i=0; until grep -qs 'listening on' "
        "%s/agg%s.log || [ $i -ge 1200 ]; do sleep 0.1; i=$((i+1)); done; ",
        dir, bin, extra, tls_args("ca", "aggregator"), dir, sfx, sfx, sfx, dir, sfx);
    k += snprintf(cmd + k, sizeof cmd - (size_t)k,
                  "cd %s && { %s fed keyholder fed.yaml %s %s --out kh >kh%s.log 2>&1; echo $? "
                  ">kh%s.rc; } & ",
                  dir, bin, extra, tls_args("ca", "keyholder"), sfx, sfx);
    for (int i = 1; i <= 3; i++) {
        char site[16];
        snprintf(site, sizeof site, "site%d", i);
        k += snprintf(
            cmd + k, sizeof cmd - (size_t)k,
            "cd %s && { %s fed join fed.yaml %s %s --set data.path=%s/s%d.csv --out %s%s >%s%s.log "
            "2>&1; echo $? >%s%s.rc; } & ",
            dir, bin, extra, tls_args("ca", site), dir, i, site, sfx, site, sfx, site, sfx);
    }
    snprintf(cmd + k, sizeof cmd - (size_t)k, "wait\n");
    fed_sh_script(dir, cmd);
    const char *roles[] = {"agg", "kh", "site1", "site2", "site3"};
    for (int i = 0; i < 5; i++) {
        char rc[512], log[512];
        snprintf(rc, sizeof rc, "%s/%s%s.rc", dir, roles[i], sfx);
        snprintf(log, sizeof log, "%s/%s%s.log", dir, roles[i], sfx);
        char *r = e2e_slurp(rc, NULL), *l = e2e_slurp(log, NULL);
        CHECK(atoi(r) == 0 && r[0], "%s%s exited %s: %s", roles[i], sfx, r, l);
        free(r);
        free(l);
    }
}

int main(void) {
    CHECK(access(CSV, R_OK) == 0, "%s missing (scripts/install-deps.sh installs it)", CSV);
    if (!(bin = e2e_setup("fed", dir, sizeof dir))) return check_summary("e2e/fed");
    e2e_sh("scripts/fed-test-ca.sh %s/ca aggregator keyholder site1 site2 site3 >/dev/null && "
           "scripts/fed-test-ca.sh %s/other site3 >/dev/null",
           dir, dir);
    e2e_sh("tail -n +2 %s | awk -v d=%s 'NR%%3==1{print > d\"/s1.csv\"} NR%%3==2{print > "
           "d\"/s2.csv\"} "
           "NR%%3==0{print > d\"/s3.csv\"}'",
           CSV, dir);
    e2e_sh("mkdir -p %s/kh && %s keygen --out %s/sign >/dev/null", dir, bin, dir);
    int port = 20000 + (int)(getpid() % 20000);
    write_config(port, 3, 10, 120);

    launch("", "");
    /* the key holder: a signed checkpoint per round, the rounds in its audit log and metrics */
    for (int r = 0; r <= 3; r++) {
        char p[512];
        snprintf(p, sizeof p, "%s/kh/step-%08d/manifest.json", dir, r);
        CHECK(access(p, R_OK) == 0, "no checkpoint of round %d", r);
    }
    char *audit = e2e_slurp(e2e_path("kh/audit.log"), NULL),
         *km = e2e_slurp(e2e_path("kh/metrics.jsonl"), NULL),
         *am = e2e_slurp(e2e_path("agg/metrics.jsonl"), NULL);
    CHECK(count(audit, "\"fed_round\"") == 3 && count(audit, "\"sha256\"") >= 9,
          "audit log: %.400s", audit);
    CHECK(count(km, "\"clients\": 3") == 3, "key holder metrics: %s", km);
    CHECK(count(am, "\"round\"") == 3 && count(am, "\"dropped\": 0") == 3, "aggregator metrics: %s",
          am);
    e2e_result v = e2e_runf("audit verify %s/kh --pubkey %s/sign.pub", dir, dir);
    CHECK(v.rc == 0, "audit verify: %s %s", v.out, v.err);
    e2e_done(&v);
    /* the aggregator never needed a key: its fed.key did not exist */
    CHECK(access(e2e_path("none"), F_OK) != 0, "the aggregator made a key directory");
    /* the global model learned: each client's first loss in round 3 is below round 1's */
    for (int i = 1; i <= 3; i++) {
        char a[512], b[512];
        snprintf(a, sizeof a, "%s/site%d/round-001/summary.json", dir, i);
        snprintf(b, sizeof b, "%s/site%d/round-003/summary.json", dir, i);
        double l1 = first_loss(a), l3 = first_loss(b);
        CHECK(l3 < l1, "site%d: loss at the start of round 3 %g, round 1 %g", i, l3, l1);
    }
    free(audit);
    free(km);
    free(am);
    /* training rows per shard: 190, 190 and 189 lines, 20 % held out */
    const double rows[3] = {152, 152, 151};
    fed_check_fedavg(dir, 3, rows, 1048576);
    check_aggregator_stores_no_update();

    /* every role restarted: the key holder resumes from its last global model (round 3) */
    write_config(port + 2, 1, 10, 120);
    launch("-b", "");
    char *khlog = e2e_slurp(e2e_path("kh-b.log"), NULL);
    audit = e2e_slurp(e2e_path("kh/audit.log"), NULL);
    CHECK(strstr(khlog, "step-00000003 (round 3)"), "key holder did not resume: %s", khlog);
    CHECK(access(e2e_path("kh/step-00000004/manifest.json"), R_OK) == 0,
          "no checkpoint of round 4");
    CHECK(count(audit, "\"fed_round\"") == 4 && strstr(audit, "\"round\":4"),
          "audit after resume: %.300s", audit);
    free(khlog);
    free(audit);

    /* one more round with masking instead of Paillier (no key at all), from round 4 */
    launch("-m", "--set fed.secure=masking");
    audit = e2e_slurp(e2e_path("kh/audit.log"), NULL);
    CHECK(access(e2e_path("kh/step-00000005/manifest.json"), R_OK) == 0,
          "no checkpoint of the masking round");
    CHECK(count(audit, "\"fed_round\"") == 5 && strstr(audit, "\"round\":5"),
          "audit after masking: %.300s", audit);
    free(audit);

    /* a private key file others can read: refused before connecting, naming the mode */
    e2e_sh("chmod 644 %s/kh/paillier.key", dir);
    e2e_result r = e2e_runf("fed keyholder %s/fed.yaml %s --out %s/kh2", dir,
                            tls_args("ca", "keyholder"), dir);
    CHECK(r.rc == 2 && strstr(r.err, "0644") && strstr(r.err, "paillier.key"), "open key: rc %d %s",
          r.rc, r.err);
    e2e_done(&r);

    /* a client whose certificate another CA signed is refused by the aggregator */
    write_config(port + 1, 1, 2, 4);
    char cmd[2048];
    snprintf(cmd, sizeof cmd,
             "cd %s && { %s fed serve fed.yaml %s --out agg2 >agg2.log 2>&1; echo $? >agg2.rc; } & "
             "i=0; until grep -qs 'listening on' %s/agg2.log || [ $i -ge 1200 ]; do sleep 0.1; "
             "i=$((i+1)); done; "
             "cd %s && { %s fed join fed.yaml %s --out rogue >rogue.log 2>&1; echo $? >rogue.rc; } "
             "& wait",
             dir, bin, tls_args("ca", "aggregator"), dir, dir, bin, tls_args("other", "site3"));
    fed_sh_script(dir, cmd);
    char *arc = e2e_slurp(e2e_path("agg2.rc"), NULL), *alog = e2e_slurp(e2e_path("agg2.log"), NULL),
         *rrc = e2e_slurp(e2e_path("rogue.rc"), NULL);
    CHECK(atoi(rrc) != 0, "the client of another CA took part");
    CHECK(atoi(arc) != 0 && strstr(alog, "certificate is not accepted"), "aggregator: rc %s %s",
          arc, alog);
    free(arc);
    free(alog);
    free(rrc);

    /* a client told another key holder name (fed.keyholder_name) refuses the
     * public key the aggregator relays: it is signed by 'keyholder' */
    write_config(port + 3, 1, 2, 4);
    snprintf(cmd, sizeof cmd,
             "cd %s && { %s fed serve fed.yaml %s --out agg3 >agg3.log 2>&1; echo $? >agg3.rc; } & "
             "i=0; until grep -qs 'listening on' %s/agg3.log || [ $i -ge 1200 ]; do sleep 0.1; "
             "i=$((i+1)); done; "
             "cd %s && { %s fed keyholder fed.yaml %s --set fed.key=%s/kh3.key --out kh3 "
             ">kh3.log 2>&1; echo $? >kh3.rc; } & "
             "cd %s && { %s fed join fed.yaml %s --set fed.keyholder_name=site1 "
             "--set data.path=%s/s1.csv --out wrongkh >wrongkh.log 2>&1; echo $? >wrongkh.rc; } "
             "& wait",
             dir, bin, tls_args("ca", "aggregator"), dir, dir, bin, tls_args("ca", "keyholder"),
             dir, dir, bin, tls_args("ca", "site1"), dir);
    fed_sh_script(dir, cmd);
    char *wrc = e2e_slurp(e2e_path("wrongkh.rc"), NULL),
         *wlog = e2e_slurp(e2e_path("wrongkh.log"), NULL);
    CHECK(atoi(wrc) != 0 && strstr(wlog, "signed by 'keyholder', not by 'site1'"),
          "a client expecting key holder site1: rc %s %s", wrc, wlog);
    free(wrc);
    free(wlog);
    e2e_cleanup(dir);
    return check_summary("e2e/fed");
}
