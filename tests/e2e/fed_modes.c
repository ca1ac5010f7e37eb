/* tessel fed with fed.secure: none and FedProx on loopback (docs/federated.md):
 * an aggregator, a key holder and 3 clients, each a process, train the
 * breast cancer MLP on 3 shards for 2 rounds of plain FedAvg. Checks:
 *   - each round's global model equals, bit for bit, a FedAvg of the
 *     clients' local models computed here the way the roles define it;
 *   - a second run with fed.prox_mu=0 gives bit-identical global models
 *     (FedProx with mu = 0 is FedAvg; also: the clients joining in another
 *     order changes nothing);
 *   - fed.prox_mu=20 keeps every client's local model of round 1 closer to
 *     the global model it started from than mu = 0 did;
 *   - each role's metrics.prom: bytes up and down per client, clients,
 *     dropped, and the phases that role measures; its rounds.jsonl: one
 *     line per round with those phases. */
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include "check.h"
#include "e2e.h"
#include "tessel/tessel.h"

#define CSV    "/usr/lib/python3/dist-packages/sklearn/datasets/data/breast_cancer.csv"
#define ROUNDS 2

static const char *bin;
static char dir[256];
static int port;

static void write_config(void) {
    FILE *f = fopen(e2e_path("fed.yaml"), "w");
    if (!f) return;
    fprintf(f,
            "model: {name: mlp, window: 0, in_dim: 30, hidden: 32, n_hidden: 2, layer_norm: "
            "false, classes: 2, batch: 32}\n"
            "data: {source: csv, path: %s/s1.csv, header: false, label: \"30\", window: 1, "
            "horizon: 0, normalise: true, val_fraction: 0.2}\n"
            "train: {optimizer: adamw, lr: 3.0e-3, steps: 10, metrics: accuracy, seed: 0, "
            "threads: 1}\n"
            "fed:\n  secure: none\n  rounds: %d\n  local_steps: 10\n  min_clients: 3\n"
            "  max_clients: 3\n  timeout_s: 120\n  join_s: 10\n  tls: {ca: %s/ca/ca.pem}\n",
            dir, ROUNDS, dir);
    fclose(f);
}

static void sh_script(const char *text) {
    FILE *f = fopen(e2e_path("run.sh"), "w");
    CHECK(f != NULL, "cannot write run.sh");
    if (!f) return;
    fputs(text, f);
    fclose(f);
    e2e_sh("sh %s", e2e_path("run.sh"));
}

/* The five processes of run `tag` (directories agg-TAG, kh-TAG, siteN-TAG),
 * on a port of their own; every one must exit 0. */
static void launch(const char *tag, const char *extra) {
    char cmd[8192];
    int p = port++, k = 0;
    const char *roles[] = {"agg", "kh", "site1", "site2", "site3"};
    k += snprintf(cmd + k, sizeof cmd - (size_t)k, "cd %s\n", dir);
    for (int i = 0; i < 5; i++) {
        const char *verb = i == 0 ? "serve" : i == 1 ? "keyholder" : "join";
        const char *cert = i == 0 ? "aggregator" : i == 1 ? "keyholder" : roles[i];
        char data[600] = "";
        if (i >= 2) snprintf(data, sizeof data, "--set data.path=%s/s%d.csv", dir, i - 1);
        k += snprintf(cmd + k, sizeof cmd - (size_t)k,
                      "{ %s fed %s fed.yaml %s %s --set fed.port=%d --set "
                      "fed.tls.cert=ca/%s.pem --set fed.tls.key=ca/%s.key --out %s-%s "
                      ">%s-%s.log 2>&1; echo $? >%s-%s.rc; } &\n",
                      bin, verb, extra, data, p, cert, cert, roles[i], tag, roles[i], tag, roles[i],
                      tag);
        if (i == 0) /* the others start once the aggregator listens (at most 120 s) */
            k += snprintf(cmd + k, sizeof cmd - (size_t)k,
                          "i=0; until grep -qs 'listening on' agg-%s.log || [ $i -ge 1200 ]; do "
                          "sleep 0.1; i=$((i+1)); done\n",
                          tag);
    }
    snprintf(cmd + k, sizeof cmd - (size_t)k, "wait\n");
    sh_script(cmd);
    for (int i = 0; i < 5; i++) {
        char rc[512], log[512];
        snprintf(rc, sizeof rc, "%s/%s-%s.rc", dir, roles[i], tag);
        snprintf(log, sizeof log, "%s/%s-%s.log", dir, roles[i], tag);
        char *r = e2e_slurp(rc, NULL), *l = e2e_slurp(log, NULL);
        CHECK(r[0] && atoi(r) == 0, "%s-%s exited %s: %s", roles[i], tag, r, l);
        free(r);
        free(l);
    }
}

/* Every parameter tensor of checkpoint `path` (dir-relative), concatenated;
 * *n gets the count. */
static float *params(const char *path, int64_t *n) {
    char full[600];
    snprintf(full, sizeof full, "%s/%s", dir, path);
    ts_ckpt *ck = NULL;
    *n = 0;
    CHECK_OK(ts_ckpt_open(full, NULL, NULL, &ck));
    if (!ck) return calloc(1, 4);
    size_t total = 0;
    ts_ckpt_tensor ti;
    for (int t = 0; t < ts_ckpt_tensor_count(ck); t++)
        if (ts_ckpt_tensor_info(ck, t, &ti) == TS_OK && !ti.is_state) total += ti.bytes;
    float *v = malloc(total ? total : 4);
    size_t off = 0;
    for (int t = 0; t < ts_ckpt_tensor_count(ck); t++) {
        if (ts_ckpt_tensor_info(ck, t, &ti) != TS_OK || ti.is_state) continue;
        CHECK_OK(ts_ckpt_read(ck, ti.name, (char *)v + off, ti.bytes));
        off += ti.bytes;
    }
    ts_ckpt_close(ck);
    *n = (int64_t)(total / 4);
    return v;
}

/* Round r's global model of run `tag` against FedAvg of the local models:
 * sum = Σ wᵢ·(localᵢ − global) in double, clients in name order, wᵢ = rowsᵢ / Σ
 * rows; global' = (float)(global + sum / Σwᵢ). Must match bit for bit. */
static void check_fedavg(const char *tag, int r, const double *rows) {
    char p[128];
    int64_t n, m;
    snprintf(p, sizeof p, "kh-%s/step-%08d", tag, r - 1);
    float *g0 = params(p, &n);
    snprintf(p, sizeof p, "kh-%s/step-%08d", tag, r);
    float *g1 = params(p, &m);
    float *l[3];
    double total = rows[0] + rows[1] + rows[2];
    for (int i = 0; i < 3; i++) {
        int64_t k;
        snprintf(p, sizeof p, "site%d-%s/round-%03d", i + 1, tag, r);
        l[i] = params(p, &k);
        CHECK(k == n, "%s: site%d has %lld parameters, the global model %lld", p, i + 1,
              (long long)k, (long long)n);
    }
    int64_t differ = 0;
    for (int64_t j = 0; j < n && m == n; j++) {
        double sum = 0;
        for (int i = 0; i < 3; i++) sum += rows[i] / total * (double)(l[i][j] - g0[j]);
        float want = (float)((double)g0[j] + sum / 1.0);
        differ += memcmp(&want, &g1[j], 4) != 0;
    }
    CHECK(n > 1000 && m == n && differ == 0,
          "%s round %d: %lld of %lld values differ from FedAvg of the local models", tag, r,
          (long long)differ, (long long)n);
    free(g0);
    free(g1);
    for (int i = 0; i < 3; i++) free(l[i]);
}

static int same_file_bits(const char *a, const char *b) {
    int64_t n, m;
    float *x = params(a, &n), *y = params(b, &m);
    int same = n == m && n > 0 && !memcmp(x, y, (size_t)n * 4);
    free(x);
    free(y);
    return same;
}

/* ||local − global|| of site i's round-1 model in run `tag`. */
static double drift(const char *tag, int i) {
    char p[128];
    int64_t n, k;
    snprintf(p, sizeof p, "kh-%s/step-%08d", tag, 0);
    float *g = params(p, &n);
    snprintf(p, sizeof p, "site%d-%s/round-001", i, tag);
    float *l = params(p, &k);
    double d = 0;
    for (int64_t j = 0; j < n && k == n; j++) d += ((double)l[j] - g[j]) * ((double)l[j] - g[j]);
    free(g);
    free(l);
    return sqrt(d);
}

static void check_prom(const char *file, const char *const *want, int n) {
    char *t = e2e_slurp(e2e_path(file), NULL);
    for (int i = 0; i < n; i++)
        CHECK(strstr(t, want[i]) != NULL, "%s lacks %s:\n%s", file, want[i], t);
    free(t);
}

int main(void) {
    CHECK(access(CSV, R_OK) == 0, "%s missing (scripts/install-deps.sh installs it)", CSV);
    if (!(bin = e2e_setup("fed_modes", dir, sizeof dir))) return check_summary("e2e/fed_modes");
    static char abs_bin[4096]; /* the roles run in dir */
    if (realpath(bin, abs_bin)) bin = abs_bin;
    e2e_sh("scripts/fed-test-ca.sh %s/ca aggregator keyholder site1 site2 site3 >/dev/null", dir);
    e2e_sh("tail -n +2 %s | awk -v d=%s 'NR%%3==1{print > d\"/s1.csv\"} NR%%3==2{print > "
           "d\"/s2.csv\"} NR%%3==0{print > d\"/s3.csv\"}'",
           CSV, dir);
    port = 20000 + (int)((getpid() * 7) % 20000);
    write_config();

    launch("a", "");
    const double rows[3] = {152, 152, 151}; /* 190, 190, 189 rows less 20 % */
    for (int r = 1; r <= ROUNDS; r++) check_fedavg("a", r, rows);

    /* Prometheus, per role: the aggregator's bytes per client (2 rounds of
     * 4 bytes per parameter up; the round message, 8 bytes more, down) */
    int64_t n;
    free(params("kh-a/step-00000000", &n));
    char up[160], down[160];
    snprintf(up, sizeof up, "tessel_fed_bytes_up_total{role=\"aggregator\",client=\"site2\"} %lld",
             (long long)(ROUNDS * 4 * n));
    snprintf(down, sizeof down,
             "tessel_fed_bytes_down_total{role=\"aggregator\",client=\"site2\"} %lld",
             (long long)(ROUNDS * (4 * n + 8)));
    const char *agg[] = {up,
                         down,
                         "tessel_fed_rounds_total{role=\"aggregator\"} 2",
                         "tessel_fed_clients{role=\"aggregator\"} 3",
                         "tessel_fed_dropped_total{role=\"aggregator\"} 0",
                         "tessel_fed_seconds{role=\"aggregator\",phase=\"aggregate\"}",
                         "tessel_fed_seconds{role=\"aggregator\",phase=\"broadcast\"}",
                         "tessel_fed_seconds{role=\"aggregator\",phase=\"updates\"}",
                         "tessel_fed_seconds{role=\"aggregator\",phase=\"keyholder\"}"};
    check_prom("agg-a/metrics.prom", agg, 9);
    const char *kh[] = {"tessel_fed_round{role=\"keyholder\"} 2",
                        "tessel_fed_seconds{role=\"keyholder\",phase=\"decrypt\"}"};
    check_prom("kh-a/metrics.prom", kh, 2);
    const char *site[] = {"tessel_fed_round{role=\"client\"} 2",
                          "tessel_fed_seconds{role=\"client\",phase=\"train\"}",
                          "tessel_fed_seconds{role=\"client\",phase=\"encrypt\"}",
                          "tessel_fed_seconds{role=\"client\",phase=\"upload\"}",
                          "tessel_fed_bytes_up_total{role=\"client\",client=\"self\"}"};
    check_prom("site3-a/metrics.prom", site, 5);
    /* every round in rounds.jsonl, with the phases each role measures */
    const char *agg_rounds[] = {
        "{\"role\": \"aggregator\", \"round\": 1, \"broadcast_s\": ",
        "{\"role\": \"aggregator\", \"round\": 2, \"broadcast_s\": ", "\"keyholder_s\": "};
    check_prom("agg-a/rounds.jsonl", agg_rounds, 3);
    const char *kh_rounds[] = {"{\"role\": \"keyholder\", \"round\": 1, \"decrypt_s\": ",
                               "{\"role\": \"keyholder\", \"round\": 2, \"decrypt_s\": "};
    check_prom("kh-a/rounds.jsonl", kh_rounds, 2);
    const char *site_rounds[] = {
        "{\"role\": \"client\", \"round\": 1, \"train_s\": ",
        "{\"role\": \"client\", \"round\": 2, \"train_s\": ", "\"upload_s\": "};
    check_prom("site1-a/rounds.jsonl", site_rounds, 3);

    /* FedProx with mu = 0 is FedAvg, bit for bit */
    launch("b", "--set fed.prox_mu=0");
    for (int r = 0; r <= ROUNDS; r++) {
        char a[64], b[64];
        snprintf(a, sizeof a, "kh-a/step-%08d", r);
        snprintf(b, sizeof b, "kh-b/step-%08d", r);
        CHECK(same_file_bits(a, b), "round %d: fed.prox_mu=0 differs from FedAvg", r);
    }
    /* mu > 0 pulls each client's local model toward the global model */
    launch("c", "--set fed.prox_mu=20");
    for (int i = 1; i <= 3; i++) {
        double d0 = drift("a", i), d1 = drift("c", i);
        CHECK(d1 < 0.8 * d0, "site%d: drift from the global model %g with mu=20, %g with mu=0", i,
              d1, d0);
        printf("e2e/fed_modes: site%d moved %.4g from the global model with mu=0, %.4g with "
               "mu=20\n",
               i, d0, d1);
    }
    check_fedavg("c", 1, rows);
    e2e_cleanup(dir);
    return check_summary("e2e/fed_modes");
}
