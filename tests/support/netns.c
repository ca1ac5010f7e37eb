/* Two namespaces joined by a veth pair for the network tests (netns.h). */
#include "netns.h"

#include <dirent.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>
#include "tessel/util.h"

static char ns[2][64];
static char prefix_used[64];
/* Prepared in advance so the signal handler only forks and execs. */
static char cleanup_cmd[2048];

static int sh(const char *cmd) {
    int st = system(cmd);
    return WIFEXITED(st) ? WEXITSTATUS(st) : 128;
}

/* Kill what runs in namespace name (only a test's own processes: the
 * namespace is its own), then remove it. */
static void remove_cmd(char *buf, size_t n, size_t *k, const char *name) {
    ts_catf(buf, n, k,
            "for p in $(ip netns pids %s 2>/dev/null); do kill -9 $p 2>/dev/null; done; "
            "ip netns del %s 2>/dev/null; ",
            name, name);
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

/* Namespaces of earlier runs with this prefix that were killed before they
 * could clean up (their pid is gone). */
static void remove_stale(const char *prefix) {
    DIR *d = opendir("/run/netns");
    if (!d) return;
    struct dirent *e;
    while ((e = readdir(d))) {
        int pid;
        char tail[8], proc[64], cmd[512];
        if (strncmp(e->d_name, prefix, strlen(prefix)) ||
            sscanf(e->d_name + strlen(prefix), "%d-%7s", &pid, tail) != 2)
            continue;
        snprintf(proc, sizeof proc, "/proc/%d", pid);
        if (access(proc, F_OK) == 0) continue; /* its run is still going */
        size_t k = 0;
        cmd[0] = 0;
        remove_cmd(cmd, sizeof cmd, &k, e->d_name);
        printf("removing namespace %s left by a killed run\n", e->d_name);
        sh(cmd);
    }
    closedir(d);
}

int netns_skip(const char *test, const char *tools) {
    const char *path = getenv("PATH"); /* iproute2 lives in sbin, which PATH may lack */
    char newpath[4096];
    snprintf(newpath, sizeof newpath, "%s:/usr/sbin:/sbin", path ? path : "/usr/bin:/bin");
    setenv("PATH", newpath, 1);
    if (geteuid() != 0) {
        printf("%s: skipped: network namespaces need root (run `make test` as root)\n", test);
        return 77;
    }
    char cmd[512];
    snprintf(cmd, sizeof cmd, "for t in ip %s; do command -v $t >/dev/null 2>&1 || exit 1; done",
             tools ? tools : "");
    if (sh(cmd)) {
        printf("%s: skipped: needs ip (iproute2)%s%s\n", test, tools ? " and " : "",
               tools ? tools : "");
        return 77;
    }
    snprintf(cmd, sizeof cmd,
             "ip netns add tessel-probe-%d 2>/dev/null && ip netns del tessel-probe-%d",
             (int)getpid(), (int)getpid());
    if (sh(cmd)) {
        printf("%s: skipped: cannot create a network namespace here (needs CAP_SYS_ADMIN)\n", test);
        return 77;
    }
    return 0;
}

int netns_open(const char *prefix, const char *subnet, const char *also) {
    snprintf(prefix_used, sizeof prefix_used, "%s", prefix);
    remove_stale(prefix);
    snprintf(ns[0], sizeof ns[0], "%s%d-a", prefix, (int)getpid());
    snprintf(ns[1], sizeof ns[1], "%s%d-b", prefix, (int)getpid());
    size_t k = 0;
    cleanup_cmd[0] = 0;
    remove_cmd(cleanup_cmd, sizeof cleanup_cmd, &k, ns[0]);
    remove_cmd(cleanup_cmd, sizeof cleanup_cmd, &k, ns[1]);
    if (also) ts_catf(cleanup_cmd, sizeof cleanup_cmd, &k, "%s", also);
    signal(SIGTERM, on_signal);
    signal(SIGINT, on_signal);
    signal(SIGHUP, on_signal);
    char cmd[2048];
    snprintf(cmd, sizeof cmd,
             "ip netns add %s && ip netns add %s && "
             "ip link add veth0 netns %s type veth peer name veth0 netns %s",
             ns[0], ns[1], ns[0], ns[1]);
    if (sh(cmd)) return -1;
    for (int h = 0; h < 2; h++) {
        snprintf(cmd, sizeof cmd,
                 "ip -n %s addr add %s.%d/24 dev veth0 && ip -n %s link set veth0 up && "
                 "ip -n %s link set lo up",
                 ns[h], subnet, h + 1, ns[h], ns[h]);
        if (sh(cmd)) return -1;
    }
    return 0;
}

const char *netns_name(int host) {
    return ns[host ? 1 : 0];
}

long long netns_veth_bytes(int host, const char *dir) {
    char cmd[256];
    snprintf(cmd, sizeof cmd, "ip netns exec %s cat /sys/class/net/veth0/statistics/%s_bytes",
             netns_name(host), dir);
    FILE *p = popen(cmd, "r");
    long long v = -1;
    if (p) {
        if (fscanf(p, "%lld", &v) != 1) v = -1;
        pclose(p);
    }
    return v;
}

int netns_close(void) {
    if (!cleanup_cmd[0]) return 1;
    run_cleanup();
    int gone = 1;
    for (int h = 0; h < 2; h++) {
        char p[128];
        snprintf(p, sizeof p, "/run/netns/%s", ns[h]);
        gone &= access(p, F_OK) != 0;
    }
    return gone;
}
