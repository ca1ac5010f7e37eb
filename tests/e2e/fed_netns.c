/* Federated training across two "hosts" (docs/federated.md, issue #21): two
 * network namespaces joined by a veth pair, 10.78.0.1 and 10.78.0.2. The
 * aggregator and the key holder run in the first, the three sites in the
 * second, so every update and global model crosses the veth pair over TLS
 * (fed.addr is the first host's address; the aggregator listens there, and
 * nothing listens on loopback). Three shards of the breast cancer CSV,
 * 2 rounds under Paillier. Checks: every role exits 0, each round's global
 * model equals a plaintext FedAvg of the sites' local models within the
 * fixed-point bound, and the first host's veth received at least the three
 * sites' encrypted updates of both rounds.
 *
 * Needs root and iproute2; otherwise it exits 77 (ctest: skipped).
 * Namespace names carry this process id; they are removed on every path
 * (normal end, failure, SIGTERM/SIGINT/SIGHUP), and those of a run killed
 * outright (its pid gone) by the next run. */
#include <unistd.h>
#include "fed_e2e.h"
#include "netns.h"

#define CSV "/usr/lib/python3/dist-packages/sklearn/datasets/data/breast_cancer.csv"

static char dir[256];

static void run(const char *bin) {
    e2e_sh("scripts/fed-test-ca.sh %s/ca aggregator keyholder site1 site2 site3 >/dev/null", dir);
    e2e_sh("tail -n +2 %s | awk -v d=%s 'NR%%3==1{print > d\"/s1.csv\"} NR%%3==2{print > "
           "d\"/s2.csv\"} NR%%3==0{print > d\"/s3.csv\"}'",
           CSV, dir);
    e2e_sh("mkdir -p %s/kh && %s keygen --out %s/sign >/dev/null", dir, bin, dir);
    FILE *f = fopen(e2e_path("fed.yaml"), "w");
    CHECK(f != NULL, "cannot write fed.yaml");
    if (!f) return;
    fprintf(f,
            "model: {name: mlp, window: 0, in_dim: 30, hidden: 32, n_hidden: 2, layer_norm: "
            "false, classes: 2, batch: 32}\n"
            "data: {source: csv, path: %s/s1.csv, header: false, label: \"30\", window: 1, "
            "horizon: 0, normalise: true, val_fraction: 0.2}\n"
            "train: {optimizer: adamw, lr: 3.0e-3, steps: 10, metrics: accuracy, seed: 0, "
            "threads: 1}\n"
            "ckpt: {sign_key: %s/sign.key}\n"
            "fed:\n  rounds: 2\n  local_steps: 10\n  min_clients: 3\n  max_clients: 3\n"
            "  key_bits: 1024\n  timeout_s: 300\n  join_s: 120\n  addr: 10.78.0.1\n"
            "  port: 21021\n  key: %s/kh/paillier.key\n  tls: {ca: %s/ca/ca.pem}\n",
            dir, dir, dir, dir);
    fclose(f);
    char host_a[128], host_b[128], sets[3][600];
    snprintf(host_a, sizeof host_a, "ip netns exec %s", netns_name(0));
    snprintf(host_b, sizeof host_b, "ip netns exec %s", netns_name(1));
    for (int i = 0; i < 3; i++)
        snprintf(sets[i], sizeof sets[i], "--set data.path=%s/s%d.csv", dir, i + 1);
    const char *prefix[5] = {host_a, host_a, host_b, host_b, host_b};
    const char *set[5] = {"", "", sets[0], sets[1], sets[2]};
    long long rx0 = netns_veth_bytes(0, "rx");
    fed_launch(bin, dir, prefix, set, 900);
    long long rx = netns_veth_bytes(0, "rx") - rx0;
    /* the updates: 3 sites · 2 rounds · ciphertexts of 256 bytes (1024-bit
     * key) for 2 178 parameters in 44-slot plaintexts (50 each) */
    long long want = 3LL * 2 * 50 * 256;
    CHECK(rx0 >= 0 && rx >= want, "host 1 received %lld bytes over the veth pair, want >= %lld", rx,
          want);
    printf("e2e/fed_netns: host 1 received %.1f KB over the veth pair\n", (double)rx / 1e3);
    const double rows[3] = {152, 152, 151}; /* 190, 190, 189 rows less 20 % */
    printf("e2e/fed_netns: ");
    fed_check_fedavg(dir, 2, rows, 1048576);
    char *log = e2e_slurp(e2e_path("aggregator.log"), NULL);
    CHECK(strstr(log, "10.78.0.1:21021") != NULL, "aggregator not on host 1's address: %s", log);
    free(log);
}

int main(void) {
    int skip = netns_skip("fed_netns", "timeout");
    if (skip) return skip;
    if (access(CSV, R_OK) != 0) {
        printf("fed_netns: skipped: %s missing (scripts/install-deps.sh installs it)\n", CSV);
        return 77;
    }
    const char *bin = e2e_setup("fed_netns", dir, sizeof dir);
    if (!bin) return check_summary("e2e/fed_netns");
    int set = netns_open("tessel-fednet-", "10.78.0", NULL);
    CHECK(set == 0, "setting up namespaces %s and %s", netns_name(0), netns_name(1));
    if (set == 0) run(bin);
    CHECK(netns_close(), "namespaces %s and %s removed", netns_name(0), netns_name(1));
    e2e_cleanup(dir);
    return check_summary("e2e/fed_netns");
}
