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
#include <dirent.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>
#include "fed_e2e.h"

#define CSV     "/usr/lib/python3/dist-packages/sklearn/datasets/data/breast_cancer.csv"
#define NS_PREF "tessel-fednet-"

static char ns_a[64], ns_b[64], dir[256];
static char cleanup_cmd[1024]; /* prepared so the signal handler only forks and execs */

static int sh(const char *cmd) {
    int st = system(cmd);
    return WIFEXITED(st) ? WEXITSTATUS(st) : 128;
}

static void run_cleanup(void) {
    pid_t p = fork();
    if (p == 0) {
        execl("/bin/sh", "sh", "-c", cleanup_cmd, (char *)NULL);
        _exit(127);
    }
    if (p > 0)
        while (waitpid(p, NULL, 0) < 0) {
        }
}

static void on_signal(int sig) {
    run_cleanup();
    signal(sig, SIG_DFL);
    raise(sig);
}

/* Kill what runs in namespace ns (only this test's processes: the
 * namespace is its own), then remove it. */
static int remove_cmd(char *buf, size_t n, const char *ns) {
    return snprintf(buf, n,
                    "for p in $(ip netns pids %s 2>/dev/null); do kill -9 $p 2>/dev/null; done; "
                    "ip netns del %s 2>/dev/null; ",
                    ns, ns);
}

/* Namespaces of earlier runs killed before they could clean up. */
static void remove_stale(void) {
    DIR *d = opendir("/run/netns");
    if (!d) return;
    struct dirent *e;
    while ((e = readdir(d))) {
        int pid;
        char tail[8], proc[64], cmd[1024];
        if (strncmp(e->d_name, NS_PREF, strlen(NS_PREF)) ||
            sscanf(e->d_name + strlen(NS_PREF), "%d-%7s", &pid, tail) != 2)
            continue;
        snprintf(proc, sizeof proc, "/proc/%d", pid);
        if (access(proc, F_OK) == 0) continue; /* its run is still going */
        remove_cmd(cmd, sizeof cmd, e->d_name);
        printf("removing namespace %s left by a killed run\n", e->d_name);
        sh(cmd);
    }
    closedir(d);
}

static long long veth_bytes(const char *ns, const char *what) {
    char cmd[256];
    snprintf(cmd, sizeof cmd, "ip netns exec %s cat /sys/class/net/veth0/statistics/%s_bytes", ns,
             what);
    FILE *p = popen(cmd, "r");
    long long v = -1;
    if (p) {
        if (fscanf(p, "%lld", &v) != 1) v = -1;
        pclose(p);
    }
    return v;
}

static int setup(void) {
    char cmd[1024];
    snprintf(cmd, sizeof cmd,
             "ip netns add %s && ip netns add %s && ip link add veth0 netns %s type veth peer "
             "name veth0 netns %s && ip -n %s addr add 10.78.0.1/24 dev veth0 && ip -n %s addr "
             "add 10.78.0.2/24 dev veth0 && ip -n %s link set veth0 up && ip -n %s link set "
             "veth0 up && ip -n %s link set lo up && ip -n %s link set lo up",
             ns_a, ns_b, ns_a, ns_b, ns_a, ns_b, ns_a, ns_b, ns_a, ns_b);
    return sh(cmd);
}

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
    snprintf(host_a, sizeof host_a, "ip netns exec %s", ns_a);
    snprintf(host_b, sizeof host_b, "ip netns exec %s", ns_b);
    for (int i = 0; i < 3; i++)
        snprintf(sets[i], sizeof sets[i], "--set data.path=%s/s%d.csv", dir, i + 1);
    const char *prefix[5] = {host_a, host_a, host_b, host_b, host_b};
    const char *set[5] = {"", "", sets[0], sets[1], sets[2]};
    long long rx0 = veth_bytes(ns_a, "rx");
    fed_launch(bin, dir, prefix, set, 900);
    long long rx = veth_bytes(ns_a, "rx") - rx0;
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
    const char *path = getenv("PATH"); /* iproute2 lives in sbin */
    char newpath[4096];
    snprintf(newpath, sizeof newpath, "%s:/usr/sbin:/sbin", path ? path : "/usr/bin:/bin");
    setenv("PATH", newpath, 1);
    if (geteuid() != 0) {
        printf("fed_netns: skipped: network namespaces need root\n");
        return 77;
    }
    if (sh("command -v ip >/dev/null 2>&1 && command -v timeout >/dev/null 2>&1")) {
        printf("fed_netns: skipped: needs ip (iproute2) and timeout\n");
        return 77;
    }
    if (access(CSV, R_OK) != 0) {
        printf("fed_netns: skipped: %s missing (scripts/install-deps.sh installs it)\n", CSV);
        return 77;
    }
    const char *bin = e2e_setup("fed_netns", dir, sizeof dir);
    if (!bin) return check_summary("e2e/fed_netns");
    remove_stale();
    snprintf(ns_a, sizeof ns_a, NS_PREF "%d-a", (int)getpid());
    snprintf(ns_b, sizeof ns_b, NS_PREF "%d-b", (int)getpid());
    int k = remove_cmd(cleanup_cmd, sizeof cleanup_cmd, ns_a);
    remove_cmd(cleanup_cmd + k, sizeof cleanup_cmd - (size_t)k, ns_b);
    signal(SIGTERM, on_signal);
    signal(SIGINT, on_signal);
    signal(SIGHUP, on_signal);
    if (sh("ip netns add tessel-fednet-probe-$$ 2>/dev/null && ip netns del "
           "tessel-fednet-probe-$$")) {
        printf("fed_netns: skipped: cannot create a network namespace here (CAP_SYS_ADMIN)\n");
        e2e_cleanup(dir);
        return 77;
    }
    int set = setup();
    CHECK(set == 0, "setting up namespaces %s and %s", ns_a, ns_b);
    if (set == 0) run(bin);
    run_cleanup();
    char p[128];
    snprintf(p, sizeof p, "/run/netns/%s", ns_a);
    int gone = access(p, F_OK) != 0;
    snprintf(p, sizeof p, "/run/netns/%s", ns_b);
    gone &= access(p, F_OK) != 0;
    CHECK(gone, "namespaces %s and %s removed", ns_a, ns_b);
    e2e_cleanup(dir);
    return check_summary("e2e/fed_netns");
}
