/* A multi-host MPI job on one machine: two "hosts" are two network
 * namespaces joined by a veth pair (10.77.0.1 and 10.77.0.2), each running
 * two ranks. mpirun runs inside the first namespace and starts the second
 * host's daemon through an rsh agent script that enters the second
 * namespace (`ip netns exec`), so every byte between ranks crosses the
 * veth pair and nothing leaves the two namespaces. The ranks set no
 * TESSEL_HOST: their host identity comes from the network namespace (see
 * ts_comm_host), so they must find two hosts of two ranks.
 *
 * Every all-reduce algorithm (MPI's native one, ring, rhd, rd and the
 * hierarchical one across the two hosts) runs on counts that do not divide
 * by 4, on exact integers (checked against the known sum) and on floats of
 * mixed magnitudes (where the order of additions shows in the bits): every
 * rank gets the same bits, a rerun gets the same bits, and ring, rhd, rd
 * and hier give the same bits as the same algorithm over the shm transport
 * in this process with pretend hosts {0, 0, 1, 1}. reduce-scatter,
 * all-gather, broadcast and barrier run across the hosts too.
 *
 * Needs root, iproute2 and mpirun; otherwise it exits 77, which ctest
 * reports as skipped. Namespace names carry this process id, so parallel
 * runs do not clash; they are removed on every path (normal end, failure,
 * SIGTERM/SIGINT), and namespaces left by a run that was killed outright
 * (its pid gone) are removed by the next run.
 *
 * dist.reproducible across hosts (docs/reproducibility.md): `tessel train`
 * of W1 (12 micro-batches) under mpirun on the two hosts, 4 ranks (2 + 2
 * per host; runs of 3 micro-batches, two pieces of the tree each) and 3
 * ranks (2 + 1; one aligned block of 4 each), ends with the same bytes as
 * one process and as 4 shm processes (`tessel ckpt diff`). Both counts
 * finish the tree by all-gathering the ranks' pieces (src/dist/repro_gather.h:
 * the one all-reduce is for one piece per rank on a power-of-two count). */
#include <stdarg.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>
#include "check.h"
#include "rank_check.h"
#include "dist/comm.h"
#include "e2e.h"
#include "netns.h"
#include "tessel/dist.h"

#define NRANKS 4

static const ts_coll_algo algos[] = {TS_ALGO_NATIVE, TS_ALGO_RING, TS_ALGO_RHD, TS_ALGO_RD,
                                     TS_ALGO_HIER};
#define NALGO (int)(sizeof algos / sizeof algos[0])
static const size_t counts[] = {1, 3, 1001, 65537, 262147};
#define NCOUNT (int)(sizeof counts / sizeof counts[0])

/* Floats of mixed magnitudes: sums depend on the order of additions. */
static float fval(int r, size_t i) {
    uint64_t x = (uint64_t)(r + 1) * 0x9E3779B97F4A7C15ull ^ (uint64_t)i * 0xBF58476D1CE4E5B9ull;
    x ^= x >> 31;
    x *= 0x94D049BB133111EBull;
    x ^= x >> 29;
    double u = (double)(x >> 40) / 16777216.0 - 0.5;
    return (float)(u * (double)(1u << (x & 15)) / 256.0);
}

/* Small integers: exact in f32 whatever the order. */
static float ival(int r, size_t i) {
    return (float)((int)((r * 131 + (int)(i % 1009) * 7) % 17) - 8);
}

static uint64_t fnv(const void *p, size_t n) {
    const unsigned char *b = p;
    uint64_t h = 0xcbf29ce484222325ull;
    for (size_t i = 0; i < n; i++) h = (h ^ b[i]) * 0x100000001b3ull;
    return h;
}

/* ---- the worker (started by mpirun) --------------------------------------------- */

static int wrank;

/* Every rank's h; 1 when all equal. */
static int same_everywhere(ts_comm *c, uint64_t h) {
    int64_t all[NRANKS] = {0};
    all[ts_comm_rank(c)] = (int64_t)h;
    WOK(ts_allgather(c, NULL, all, NRANKS, TS_I64, TS_ALGO_RING));
    for (int q = 1; q < NRANKS; q++)
        if (all[q] != all[0]) return 0;
    return 1;
}

static void allreduces(ts_comm *c, float *b) {
    int r = ts_comm_rank(c);
    for (int a = 0; a < NALGO; a++)
        for (int k = 0; k < NCOUNT; k++) {
            size_t n = counts[k];
            for (size_t i = 0; i < n; i++) b[i] = ival(r, i);
            WOK(ts_allreduce(c, b, n, TS_F32, TS_RED_SUM, algos[a]));
            size_t bad = 0;
            for (size_t i = 0; i < n; i++) {
                float want = 0;
                for (int q = 0; q < NRANKS; q++) want += ival(q, i);
                bad += b[i] != want;
            }
            WCHECK(!bad, "%s count %zu integers: %zu wrong", ts_coll_algo_name(algos[a]), n, bad);

            uint64_t h[2];
            for (int run = 0; run < 2; run++) {
                for (size_t i = 0; i < n; i++) b[i] = fval(r, i);
                WOK(ts_allreduce(c, b, n, TS_F32, TS_RED_SUM, algos[a]));
                h[run] = fnv(b, n * sizeof *b);
            }
            WCHECK(h[0] == h[1], "%s count %zu: a rerun gives other bits",
                   ts_coll_algo_name(algos[a]), n);
            WCHECK(same_everywhere(c, h[0]), "%s count %zu: ranks got different bits",
                   ts_coll_algo_name(algos[a]), n);
            if (r == 0)
                printf("hash %s %zu %016llx\n", ts_coll_algo_name(algos[a]), n,
                       (unsigned long long)h[0]);
        }
}

static void others(ts_comm *c, float *b) {
    int r = ts_comm_rank(c);
    static const size_t few[] = {3, 1001, 65537};
    float *d = malloc((65537 / NRANKS + 1) * sizeof *d);
    for (int k = 0; k < 3 && d; k++)
        for (int nat = 0; nat < 2; nat++) {
            size_t n = few[k], off, len;
            ts_coll_algo a = nat ? TS_ALGO_NATIVE : TS_ALGO_RING;
            ts_comm_block(n, NRANKS, r, &off, &len);
            for (size_t i = 0; i < n; i++) b[i] = ival(r, i);
            WOK(ts_reduce_scatter(c, b, d, n, TS_F32, TS_RED_SUM, a));
            for (size_t i = 0; i < n; i++) b[i] = -1;
            WOK(ts_allgather(c, d, b, n, TS_F32, a));
            size_t bad = 0;
            for (size_t i = 0; i < n; i++) {
                float want = 0;
                for (int q = 0; q < NRANKS; q++) want += ival(q, i);
                bad += b[i] != want;
            }
            WCHECK(!bad, "reduce_scatter + all_gather %s count %zu: %zu wrong",
                   ts_coll_algo_name(a), n, bad);
        }
    free(d);
    for (int tree = 0; tree < 2; tree++) {
        WOK(ts_comm_set_algo(c, TS_COLL_BROADCAST, tree ? TS_ALGO_RING : TS_ALGO_NATIVE));
        WOK(ts_comm_set_algo(c, TS_COLL_BARRIER, tree ? TS_ALGO_RING : TS_ALGO_NATIVE));
        unsigned char *u = (unsigned char *)b;
        size_t bytes = 100003;
        for (size_t i = 0; i < bytes; i++) u[i] = (unsigned char)(r == 3 ? i * 5 + 1 : 0);
        WOK(ts_broadcast(c, u, bytes, 3)); /* from the second host */
        size_t bad = 0;
        for (size_t i = 0; i < bytes; i++) bad += u[i] != (unsigned char)(i * 5 + 1);
        WCHECK(!bad, "broadcast tree=%d: %zu wrong", tree, bad);
        WOK(ts_barrier(c));
    }
}

static int worker(void) {
    unsetenv("TESSEL_HOST"); /* the host must come from the namespace */
    char id[384];
    ts_dist_host_id(id, sizeof id);
    ts_comm *c;
    if (ts_comm_from_env(&c) != TS_OK) {
        fprintf(stderr, "worker: %s\n", ts_last_error());
        return 1;
    }
    wrank = ts_comm_rank(c);
    WCHECK(ts_comm_size(c) == NRANKS && !strcmp(ts_comm_transport(c), "mpi"), "%d ranks over %s",
           ts_comm_size(c), ts_comm_transport(c));
    WCHECK(strstr(id, "/net:[") != NULL, "host id '%s' names the network namespace", id);
    WCHECK(ts_comm_num_hosts(c) == 2, "%d hosts", ts_comm_num_hosts(c));
    for (int q = 0; q < ts_comm_size(c); q++)
        WCHECK(ts_comm_host(c, q) == q / 2, "rank %d on host %d", q, ts_comm_host(c, q));
    printf("rank %d: host %d (%s)\n", wrank, ts_comm_host(c, wrank), id);
    float *b = malloc(counts[NCOUNT - 1] * sizeof *b);
    if (b && check_failed == 0) {
        allreduces(c, b);
        others(c, b);
    }
    free(b);
    printf("rank %d of %d: %d checks passed, %d failed\n", wrank, ts_comm_size(c), check_passed,
           check_failed);
    fflush(stdout);
    ts_comm_close(c);
    return check_failed ? 1 : 0;
}

/* ---- the reference: the same algorithms over shm, pretend hosts ----------------- */

typedef struct ref {
    uint64_t hash[NALGO][NCOUNT];
    int ok;
} ref;

static int ref_worker(ts_comm *c, void *user) {
    ref *out = user;
    int r = ts_comm_rank(c);
    float *b = ts_comm_alloc(c, counts[NCOUNT - 1] * sizeof *b);
    if (!b) return 1;
    for (int a = 1; a < NALGO; a++) /* NATIVE is the transport's own */
        for (int k = 0; k < NCOUNT; k++) {
            for (size_t i = 0; i < counts[k]; i++) b[i] = fval(r, i);
            if (ts_allreduce(c, b, counts[k], TS_F32, TS_RED_SUM, algos[a]) != TS_OK) return 1;
            if (r == 0) out->hash[a][k] = fnv(b, counts[k] * sizeof *b);
        }
    if (r == 0) out->ok = ts_comm_num_hosts(c) == 2;
    ts_comm_free(c, b);
    return 0;
}

/* ---- the namespaces ------------------------------------------------------------ */

static char tmpdir[64] = "/tmp/tessel-netns-XXXXXX";

static int sh(const char *fmt, ...) TS_PRINTF(1, 2);
static int sh(const char *fmt, ...) {
    char cmd[4096];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(cmd, sizeof cmd, fmt, ap);
    va_end(ap);
    int st = system(cmd);
    return WIFEXITED(st) ? WEXITSTATUS(st) : 128;
}

/* Two namespaces, one veth pair between them, 10.77.0.1 and .2 (netns.h),
 * and mpirun's hostfile and rsh agent. */
static int setup(void) {
    char also[128];
    snprintf(also, sizeof also, "rm -rf %s", tmpdir);
    if (netns_open("tessel-netns-", "10.77.0", also)) return -1;
    char path[256];
    snprintf(path, sizeof path, "%s/hostfile", tmpdir);
    FILE *f = fopen(path, "w");
    if (!f) return -1;
    fprintf(f, "10.77.0.1 slots=2\n10.77.0.2 slots=2\n");
    fclose(f);
    /* mpirun calls `agent HOST COMMAND...`, as it would call ssh. */
    snprintf(path, sizeof path, "%s/agent.sh", tmpdir);
    if (!(f = fopen(path, "w"))) return -1;
    fprintf(f,
            "#!/bin/sh\n"
            "# rsh agent for the netns test: 'host' 10.77.0.N is namespace N.\n"
            "host=$1; shift\n"
            "case \"$host\" in\n"
            "  10.77.0.1) ns=%s ;;\n"
            "  10.77.0.2) ns=%s ;;\n"
            "  *) echo \"agent: unknown host $host\" >&2; exit 1 ;;\n"
            "esac\n"
            "exec ip netns exec \"$ns\" sh -c \"$*\"\n",
            netns_name(0), netns_name(1));
    fclose(f);
    return chmod(path, 0755);
}

static void run_job(const ref *rf) {
    char exe[1024], log[300];
    ssize_t k = readlink("/proc/self/exe", exe, sizeof exe - 1);
    if (k <= 0) return;
    exe[k] = 0;
    snprintf(log, sizeof log, "%s/log", tmpdir);
    long long tx0 = netns_veth_bytes(0, "tx"), rx0 = netns_veth_bytes(0, "rx");
    double t0 = ts_now();
    int rc = sh("TESSEL_COLL_CACHE=0 TESSEL_DIST_TIMEOUT=30 timeout -s KILL 50 "
                "ip netns exec %s mpirun --allow-run-as-root --hostfile %s/hostfile -np %d "
                "--mca plm_rsh_agent %s/agent.sh --mca btl tcp,self "
                "--mca btl_tcp_if_include 10.77.0.0/24 --mca oob_tcp_if_include 10.77.0.0/24 "
                "'%s' >'%s' 2>&1",
                netns_name(0), tmpdir, NRANKS, tmpdir, exe, log);
    double secs = ts_now() - t0;
    long long tx = netns_veth_bytes(0, "tx") - tx0, rx = netns_veth_bytes(0, "rx") - rx0;
    char *out = e2e_slurp(log, NULL);
    if (!out) out = strdup("");
    int ok = 0;
    for (int r = 0; r < NRANKS; r++) {
        char want[64];
        snprintf(want, sizeof want, "rank %d of %d: ", r, NRANKS);
        const char *p = strstr(out, want);
        int passed = 0, failed = -1;
        if (p && sscanf(p + strlen(want), "%d checks passed, %d failed", &passed, &failed) == 2 &&
            failed == 0 && passed > 100)
            ok++;
        if (p) check_passed += passed;
    }
    CHECK(rc == 0 && ok == NRANKS,
          "mpirun over 2 namespaces: status %d, %d of %d ranks passed:\n%s", rc, ok, NRANKS, out);
    /* Ring, rhd, rd and hier give the bits they give over shm. */
    int compared = 0;
    for (int a = 1; a < NALGO && rf->ok; a++)
        for (int c = 0; c < NCOUNT; c++) {
            char want[96];
            snprintf(want, sizeof want, "hash %s %zu %016llx\n", ts_coll_algo_name(algos[a]),
                     counts[c], (unsigned long long)rf->hash[a][c]);
            CHECK(strstr(out, want), "%s count %zu: same bits as over shm (%016llx)",
                  ts_coll_algo_name(algos[a]), counts[c], (unsigned long long)rf->hash[a][c]);
            compared++;
        }
    CHECK(rf->ok && compared == (NALGO - 1) * NCOUNT, "shm reference ran");
    /* Ring all-reduce alone moves 1.5x each 1 MiB message across the pair. */
    CHECK(tx > 1000000 && rx > 1000000, "traffic crossed the veth pair: tx %lld rx %lld bytes", tx,
          rx);
    printf("mpirun, 2 hosts (network namespaces) x 2 ranks: %d ranks passed in %.1f s; "
           "veth0 of host 1 sent %.1f MB, received %.1f MB\n",
           ok, secs, (double)tx / 1e6, (double)rx / 1e6);
    const char *h = strstr(out, "rank 0: host");
    if (h) printf("%.*s\n", (int)strcspn(h, "\n"), h);
    h = strstr(out, "rank 2: host");
    if (h) printf("%.*s\n", (int)strcspn(h, "\n"), h);
    free(out);
}

/* tessel train ... under mpirun over the two namespaces (np ranks), or on
 * shm (np 0: --procs N in SETS); 0 when it succeeded. */
static int tessel_train(const char *bin, int np, const char *cfg, const char *sets,
                        const char *out) {
    char log[300];
    snprintf(log, sizeof log, "%s/%s.log", tmpdir, out);
    int rc;
    if (np)
        rc = sh("TESSEL_DIST_TIMEOUT=60 timeout -s KILL 240 ip netns exec %s mpirun "
                "--allow-run-as-root --hostfile %s/hostfile -np %d --mca plm_rsh_agent "
                "%s/agent.sh --mca btl tcp,self --mca btl_tcp_if_include 10.77.0.0/24 --mca "
                "oob_tcp_if_include 10.77.0.0/24 '%s' train '%s' %s --out %s/%s >'%s' 2>&1",
                netns_name(0), tmpdir, np, tmpdir, bin, cfg, sets, tmpdir, out, log);
    else
        rc = sh("timeout -s KILL 240 '%s' train '%s' %s --out %s/%s >'%s' 2>&1", bin, cfg, sets,
                tmpdir, out, log);
    if (rc) {
        char *t = e2e_slurp(log, NULL);
        CHECK(0, "%s: status %d:\n%s", out, rc, t ? t : "");
        free(t);
    }
    return rc;
}

/* `tessel ckpt diff` of two runs: every tensor identical. */
static int same_tensors(const char *bin, const char *a, const char *b) {
    char cmd[800];
    snprintf(cmd, sizeof cmd, "'%s' ckpt diff %s/%s %s/%s 2>&1", bin, tmpdir, a, tmpdir, b);
    FILE *p = popen(cmd, "r");
    char line[512];
    int same = 0;
    while (p && fgets(line, sizeof line, p))
        if (strstr(line, " identical, 0 different")) same = 1;
    if (p) pclose(p);
    return same;
}

static void run_repro(void) {
    const char *bin = getenv("TESSEL_BIN");
    char cwd[512], cfg[600];
    if (!bin || access(bin, X_OK) || !getcwd(cwd, sizeof cwd)) {
        printf("reproducible runs skipped: no TESSEL_BIN\n");
        return;
    }
    snprintf(cfg, sizeof cfg, "%s/examples/w1.yaml", cwd);
    const char *sets = "--set model.hidden=64 --set model.batch=48 --set dist.microbatch=4 "
                       "--set dist.reproducible=true --set train.clip_grad_norm=1 --set "
                       "train.steps=10 --set train.threads=1 --set alerts.defaults=false --set "
                       "ckpt.every=10";
    char shm[700];
    snprintf(shm, sizeof shm, "%s --procs 4", sets);
    double t0 = ts_now();
    if (tessel_train(bin, 0, cfg, sets, "repro-p1") || tessel_train(bin, 0, cfg, shm, "repro-shm4"))
        return;
    CHECK(same_tensors(bin, "repro-p1", "repro-shm4"), "W1: 4 shm processes = 1 process");
    static const int nps[] = {4, 3};
    for (int i = 0; i < 2; i++) {
        char out[32];
        snprintf(out, sizeof out, "repro-mpi%d", nps[i]);
        if (tessel_train(bin, nps[i], cfg, sets, out)) continue;
        CHECK(same_tensors(bin, "repro-shm4", out),
              "W1 reproducible: mpirun -np %d on 2 hosts = 4 shm processes = 1 process", nps[i]);
    }
    printf("dist.reproducible over mpirun (2 hosts, 4 and 3 ranks) and shm: %.1f s\n",
           ts_now() - t0);
}

int main(void) {
    if (ts_dist_started_by_mpi()) return worker();
#if defined(__SANITIZE_ADDRESS__)
    setenv("ASAN_OPTIONS", "detect_leaks=0", 1); /* Open MPI leaks at finalize: see dist_mpi */
#endif
    int skip = netns_skip("dist_netns", "mpirun timeout");
    if (skip) return skip;
    if (!mkdtemp(tmpdir)) {
        CHECK(0, "mkdtemp: cannot create a temporary directory");
        return check_summary("dist_netns");
    }

    ref *rf = mmap(NULL, sizeof *rf, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (rf == MAP_FAILED) rf = NULL;
    if (rf) {
        memset(rf, 0, sizeof *rf);
        static const int hosts[NRANKS] = {0, 0, 1, 1};
        ts_shm_options o = {.host_ids = hosts};
        fflush(NULL);
        CHECK_OK(ts_shm_launch(NRANKS, &o, ref_worker, rf, NULL));
    }
    CHECK(rf != NULL, "mmap for the reference");
    int set = setup();
    CHECK(set == 0, "setting up namespaces %s and %s", netns_name(0), netns_name(1));
    if (set == 0 && rf) run_job(rf);
    if (set == 0) run_repro();
    int gone = netns_close();
    CHECK(gone && access(tmpdir, F_OK) != 0, "namespaces and %s removed", tmpdir);
    if (rf) munmap(rf, sizeof *rf);
    return check_summary("dist_netns");
}
