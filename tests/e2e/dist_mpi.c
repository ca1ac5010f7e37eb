/* The mpi transport under a real mpirun: every collective and algorithm
 * (including MPI's native ones and the hierarchical path over two pretend
 * hosts) with 1 to 4 ranks, on counts that do not divide by the rank count, point-to-point and
 * non-blocking collectives, and the timeout error when one rank stalls.
 *
 * Run by ctest, this program starts itself under
 * `mpirun --oversubscribe -np N`; started by mpirun (the environment shows
 * OMPI_COMM_WORLD_SIZE), it is a worker. Without mpirun on the PATH it
 * reports the skip and passes. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>
#include "check.h"
#include "rank_check.h"
#include "e2e.h"
#include "tessel/dist.h"

/* ---- the worker ------------------------------------------------------------ */

static int wrank;

static double val(int r, size_t i, int salt) {
    return (double)((int)((r * 131 + (int)(i % 100003) * 7 + salt) % 17) - 8);
}

static double expect(int n, size_t i, int salt, ts_reduce_op op) {
    double acc = val(0, i, salt);
    for (int r = 1; r < n; r++) {
        double v = val(r, i, salt);
        acc = op == TS_RED_SUM   ? acc + v
              : op == TS_RED_MAX ? (v > acc ? v : acc)
                                 : (v < acc ? v : acc);
    }
    return acc;
}

static void allreduce_f32(ts_comm *c, ts_coll_algo a, ts_reduce_op op, size_t count, int salt) {
    int r = ts_comm_rank(c), n = ts_comm_size(c);
    float *b = malloc((count ? count : 1) * sizeof *b);
    for (size_t i = 0; i < count; i++) b[i] = (float)val(r, i, salt);
    WOK(ts_allreduce(c, b, count, TS_F32, op, a));
    size_t bad = 0;
    for (size_t i = 0; i < count; i++) bad += b[i] != expect(n, i, salt, op);
    WCHECK(!bad, "all_reduce %s %s count %zu: %zu wrong", ts_coll_algo_name(a),
           ts_reduce_op_name(op), count, bad);
    free(b);
}

static void allreduce_other(ts_comm *c, ts_coll_algo a, ts_dtype dt, size_t count, int salt) {
    int r = ts_comm_rank(c), n = ts_comm_size(c);
    size_t esz = ts_dtype_size(dt);
    char *b = malloc((count ? count : 1) * esz);
    for (size_t i = 0; i < count; i++) {
        double v = val(r, i, salt);
        if (dt == TS_F64)
            ((double *)b)[i] = v;
        else if (dt == TS_I64)
            ((int64_t *)b)[i] = (int64_t)v;
        else { /* bf16: the top half of the float */
            float f = (float)v;
            uint32_t u;
            memcpy(&u, &f, 4);
            ((uint16_t *)b)[i] = (uint16_t)(u >> 16);
        }
    }
    WOK(ts_allreduce(c, b, count, dt, TS_RED_SUM, a));
    size_t bad = 0;
    for (size_t i = 0; i < count; i++) {
        double got;
        if (dt == TS_F64)
            got = ((double *)b)[i];
        else if (dt == TS_I64)
            got = (double)((int64_t *)b)[i];
        else {
            uint32_t u = (uint32_t)((uint16_t *)b)[i] << 16;
            float f;
            memcpy(&f, &u, 4);
            got = f;
        }
        bad += got != expect(n, i, salt, TS_RED_SUM);
    }
    WCHECK(!bad, "all_reduce %s %s count %zu: %zu wrong", ts_coll_algo_name(a), ts_dtype_name(dt),
           count, bad);
    free(b);
}

static void scatter_gather(ts_comm *c, ts_coll_algo a, size_t count, int salt) {
    int r = ts_comm_rank(c), n = ts_comm_size(c);
    size_t off, len;
    ts_comm_block(count, n, r, &off, &len);
    float *s = malloc((count + 1) * 4), *d = malloc((len + 1) * 4), *g = malloc((count + 1) * 4);
    for (size_t i = 0; i < count; i++) s[i] = (float)val(r, i, salt);
    WOK(ts_reduce_scatter(c, s, d, count, TS_F32, TS_RED_SUM, a));
    size_t bad = 0;
    for (size_t i = 0; i < len; i++) bad += d[i] != expect(n, off + i, salt, TS_RED_SUM);
    WCHECK(!bad, "reduce_scatter %s count %zu: %zu wrong", ts_coll_algo_name(a), count, bad);
    /* Gather the reduced blocks back: every rank then holds the all-reduce. */
    for (int in_place = 0; in_place < 2; in_place++) {
        for (size_t i = 0; i < count; i++) g[i] = -1;
        if (in_place) memcpy(g + off, d, len * 4);
        WOK(ts_allgather(c, in_place ? NULL : d, g, count, TS_F32, a));
        bad = 0;
        for (size_t i = 0; i < count; i++) bad += g[i] != expect(n, i, salt, TS_RED_SUM);
        WCHECK(!bad, "all_gather %s count %zu in_place %d: %zu wrong", ts_coll_algo_name(a), count,
               in_place, bad);
    }
    free(s);
    free(d);
    free(g);
}

static void broadcasts(ts_comm *c) {
    int r = ts_comm_rank(c), n = ts_comm_size(c);
    for (int tree = 0; tree < 2; tree++) {
        WOK(ts_comm_set_algo(c, TS_COLL_BROADCAST, tree ? TS_ALGO_RING : TS_ALGO_AUTO));
        WOK(ts_comm_set_algo(c, TS_COLL_BARRIER, tree ? TS_ALGO_RING : TS_ALGO_AUTO));
        size_t bytes = tree ? 70001 : 13;
        unsigned char *b = malloc(bytes);
        for (size_t i = 0; i < bytes; i++) b[i] = (unsigned char)(r == n - 1 ? i * 5 + 3 : 0);
        WOK(ts_broadcast(c, b, bytes, n - 1));
        size_t bad = 0;
        for (size_t i = 0; i < bytes; i++) bad += b[i] != (unsigned char)(i * 5 + 3);
        WCHECK(!bad, "broadcast tree=%d: %zu wrong", tree, bad);
        WOK(ts_barrier(c));
        free(b);
    }
}

static void p2p_async(ts_comm *c) {
    int r = ts_comm_rank(c), n = ts_comm_size(c), right = (r + 1) % n, left = (r + n - 1) % n;
    size_t m = 300000;
    if (n > 1) { /* one rank has no peer */
        unsigned char *out = malloc(m), *in = malloc(m);
        for (size_t i = 0; i < m; i++) out[i] = (unsigned char)(r + i);
        ts_comm_req q[2];
        WOK(ts_comm_isend(c, right, 3, out, m, &q[0]));
        WOK(ts_comm_irecv(c, left, 3, in, m, &q[1]));
        WOK(ts_comm_wait(c, q, 2));
        size_t bad = 0;
        for (size_t i = 0; i < m; i++) bad += in[i] != (unsigned char)(left + i);
        WCHECK(!bad, "p2p: %zu wrong", bad);
        free(out);
        free(in);
    }

    float *g[2];
    ts_coll_ticket t[2];
    for (int k = 0; k < 2; k++) {
        g[k] = malloc(1000 * 4);
        for (int i = 0; i < 1000; i++) g[k][i] = (float)val(r, (size_t)i, 40 + k);
        WOK(ts_allreduce_start(c, g[k], 1000, TS_F32, TS_RED_SUM, TS_ALGO_NATIVE, &t[k]));
    }
    for (int k = 0; k < 2; k++) {
        WOK(ts_coll_wait(c, t[k]));
        size_t wrong = 0;
        for (int i = 0; i < 1000; i++) wrong += g[k][i] != expect(n, (size_t)i, 40 + k, TS_RED_SUM);
        WCHECK(!wrong, "non-blocking all_reduce %d: %zu wrong", k, wrong);
        free(g[k]);
    }
}

/* Non-blocking reduce-scatter then all-gather (the ZeRO pattern): every
 * count started before any is waited on. */
static void nb_shard(ts_comm *c) {
    int r = ts_comm_rank(c), n = ts_comm_size(c);
    static const size_t counts[] = {1, 3, 1001, 4097};
    enum { NC = 4 };
    for (int nat = 0; nat < 2; nat++) {
        ts_coll_algo a = nat ? TS_ALGO_NATIVE : TS_ALGO_RING;
        float *src[NC], *part[NC], *full[NC];
        ts_coll_ticket t[NC];
        for (int k = 0; k < NC; k++) {
            size_t len;
            ts_comm_block(counts[k], n, r, NULL, &len);
            src[k] = malloc(counts[k] * 4);
            part[k] = malloc((len ? len : 1) * 4);
            full[k] = malloc(counts[k] * 4);
            for (size_t i = 0; i < counts[k]; i++) src[k][i] = (float)val(r, i, 60 + k);
            WOK(ts_reduce_scatter_start(c, src[k], part[k], counts[k], TS_F32, TS_RED_SUM, a,
                                        &t[k]));
        }
        WOK(ts_coll_wait(c, t[NC - 1]));
        for (int k = 0; k < NC; k++) {
            size_t off, len, bad = 0;
            ts_comm_block(counts[k], n, r, &off, &len);
            for (size_t i = 0; i < len; i++)
                bad += part[k][i] != expect(n, off + i, 60 + k, TS_RED_SUM);
            WCHECK(!bad, "non-blocking reduce_scatter %s count %zu: %zu wrong",
                   ts_coll_algo_name(a), counts[k], bad);
            WOK(ts_allgather_start(c, part[k], full[k], counts[k], TS_F32, a, &t[k]));
        }
        for (int k = 0; k < NC; k++) {
            WOK(ts_coll_wait(c, t[k]));
            size_t bad = 0;
            for (size_t i = 0; i < counts[k]; i++)
                bad += full[k][i] != expect(n, i, 60 + k, TS_RED_SUM);
            WCHECK(!bad, "non-blocking all_gather %s count %zu: %zu wrong", ts_coll_algo_name(a),
                   counts[k], bad);
            free(src[k]);
            free(part[k]);
            free(full[k]);
        }
    }
}

static int worker(int stall) {
    /* Pretend ranks 0-1 and 2-3 run on two hosts, for the hierarchical path. */
    const char *wr = getenv("OMPI_COMM_WORLD_RANK");
    if (!wr) wr = getenv("PMIX_RANK");
    char host[32];
    snprintf(host, sizeof host, "node%d", wr ? atoi(wr) / 2 : 0);
    setenv("TESSEL_HOST", host, 1);
    ts_comm *c;
    ts_status s = ts_comm_from_env(&c);
    if (s != TS_OK) {
        fprintf(stderr, "worker: %s\n", ts_last_error());
        return 1;
    }
    wrank = ts_comm_rank(c);
    int n = ts_comm_size(c);
    WCHECK(!strcmp(ts_comm_transport(c), "mpi"), "transport %s", ts_comm_transport(c));
    if (stall) {
        /* 4 s: the ranks that wait then query each other for a quarter of
         * it (1 s), long enough to overlap on a loaded machine. */
        ts_comm_set_timeout(c, 4.0);
        float x[250] = {0};
        WOK(ts_allreduce(c, x, 250, TS_F32, TS_RED_SUM, TS_ALGO_RING));
        if (wrank == n - 1) {
            sleep(12); /* misses the next collective */
            return 0;  /* mpirun ends the job when the others fail */
        }
        s = ts_allreduce(c, x, 250, TS_F32, TS_RED_SUM, TS_ALGO_RING);
        printf("rank %d: %s\n", wrank, s == TS_OK ? "no error" : ts_last_error());
        fflush(stdout);
        /* mpirun kills the job at the first non-zero exit: stay a timeout longer, so that a
         * rank whose wait started later on a loaded machine still times out and says so
         * (one rank's exit once cut off rank 0's message); rank 2 sleeps 12 s, past this */
        if (s != TS_OK) sleep(4);
        return s == TS_OK ? 0 : 3;
    }
    WCHECK(ts_comm_num_hosts(c) == (n + 1) / 2, "hosts: %d", ts_comm_num_hosts(c));
    static const size_t counts[] = {1, 3, 1000, 4097, 300001};
    static const ts_coll_algo algos[] = {TS_ALGO_NATIVE, TS_ALGO_RING, TS_ALGO_RHD, TS_ALGO_RD,
                                         TS_ALGO_HIER};
    int salt = 0;
    for (size_t a = 0; a < sizeof algos / sizeof algos[0]; a++)
        for (size_t k = 0; k < sizeof counts / sizeof counts[0]; k++) {
            allreduce_f32(c, algos[a], TS_RED_SUM, counts[k], salt++);
            if (k == 2) {
                allreduce_f32(c, algos[a], TS_RED_MAX, counts[k], salt++);
                allreduce_f32(c, algos[a], TS_RED_MIN, counts[k], salt++);
                allreduce_other(c, algos[a], TS_F64, counts[k], salt++);
                allreduce_other(c, algos[a], TS_I64, counts[k], salt++);
                /* bf16 has no MPI type: NATIVE falls back to ring. */
                allreduce_other(c, algos[a], TS_BF16, counts[k], salt++);
            }
        }
    for (size_t k = 0; k < sizeof counts / sizeof counts[0]; k++) {
        scatter_gather(c, TS_ALGO_NATIVE, counts[k], salt++);
        scatter_gather(c, TS_ALGO_RING, counts[k], salt++);
    }
    broadcasts(c);
    p2p_async(c);
    nb_shard(c);
    /* AUTO: measures (no cache in this test), then picks per size. */
    WOK(ts_comm_tune(c));
    allreduce_f32(c, TS_ALGO_AUTO, TS_RED_SUM, 12345, salt++);
    WCHECK(!strcmp(ts_comm_tune_source(c), n == 1 ? "single rank" : "probe"), "tuned by %s",
           ts_comm_tune_source(c));
    printf("rank %d of %d: %d checks passed, %d failed\n", wrank, n, check_passed, check_failed);
    fflush(stdout);
    ts_comm_close(c);
    return check_failed ? 1 : 0;
}

/* ---- the launcher ------------------------------------------------------------ */

/* mpirun -np N this-program [--stall]; output in `out`; exit status. */
static int run(const char *mpirun, int np, int stall, char **out) {
    char exe[1024], log[64] = "/tmp/tessel-dist-mpi-XXXXXX";
    ssize_t k = readlink("/proc/self/exe", exe, sizeof exe - 1);
    int fd = mkstemp(log);
    if (k <= 0 || fd < 0) return -1;
    exe[k] = 0;
    close(fd);
    char cmd[4096];
    snprintf(cmd, sizeof cmd,
             "TESSEL_COLL_CACHE=0 TESSEL_DIST_TIMEOUT=60 '%s' %s--oversubscribe -np %d '%s'%s "
             ">'%s' 2>&1",
             mpirun, geteuid() == 0 ? "--allow-run-as-root " : "", np, exe, stall ? " --stall" : "",
             log);
    int st = system(cmd);
    *out = e2e_slurp(log, NULL);
    unlink(log);
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

int main(int argc, char **argv) {
    int stall = argc > 1 && !strcmp(argv[1], "--stall");
    if (ts_dist_started_by_mpi()) return worker(stall);
#if defined(__SANITIZE_ADDRESS__)
    /* Open MPI keeps memory in components it dlclose()s at MPI_Finalize, so
     * LeakSanitizer reports (unsymbolisable) leaks in every MPI rank. The
     * ranks run without leak checking; this launcher keeps it (its options
     * were read at start-up), and the collectives' own code is leak-checked
     * through the shm transport in unit/dist_shm. */
    setenv("ASAN_OPTIONS", "detect_leaks=0", 1);
#endif
    char mpirun[1024];
    if (!e2e_find_mpirun(mpirun, sizeof mpirun)) {
        printf("dist_mpi: skipped: mpirun not found on PATH (install openmpi-bin, see "
               "scripts/install-deps.sh)\n");
        return 77; /* reported as skipped (SKIP_RETURN_CODE) */
    }
    setenv("OMPI_ALLOW_RUN_AS_ROOT", "1", 1);
    setenv("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1", 1);
    setenv("OMPI_MCA_rmaps_base_oversubscribe", "1", 1);
    for (int np = 1; np <= 4; np++) {
        char *out = NULL;
        int rc = run(mpirun, np, 0, &out);
        int ok = 0;
        for (int r = 0; r < np; r++) {
            char want[64];
            snprintf(want, sizeof want, "rank %d of %d: ", r, np);
            const char *p = strstr(out, want);
            int passed = 0, failed = -1;
            if (p &&
                sscanf(p + strlen(want), "%d checks passed, %d failed", &passed, &failed) == 2 &&
                failed == 0 && passed > 100)
                ok++;
            if (p) check_passed += passed;
        }
        CHECK(rc == 0 && ok == np, "mpirun -np %d: status %d, %d of %d ranks passed:\n%s", np, rc,
              ok, np, out);
        free(out);
    }
    /* One rank stalls: the others time out naming it, and the job fails. Each waiting rank
     * names rank 2 among those that did not arrive; the first to time out names it alone (the
     * other still answers then), while on a loaded machine the later one may also list the
     * first, which stopped answering when its own wait ended. */
    char *out = NULL;
    int rc = run(mpirun, 3, 1, &out);
    CHECK(rc != 0, "stalled job fails (status %d)", rc);
    int alone = 0;
    for (int r = 0; r < 2; r++) {
        char want[64];
        snprintf(want, sizeof want, "rank %d: all_reduce #", r);
        const char *p = strstr(out, want);
        const char *eol = p ? strchr(p, '\n') : NULL;
        char line[1024] = "";
        if (p) snprintf(line, sizeof line, "%.*s", eol ? (int)(eol - p) : 1000, p);
        const char *list = strstr(line, "ranks that did not arrive: ");
        char ranks[64] = "";
        if (list) sscanf(list + strlen("ranks that did not arrive: "), "%63[0-9, ]", ranks);
        alone += !strcmp(ranks, "2 ");
        CHECK(p && strstr(line, "1000 bytes") && strstr(line, "timed out after") &&
                  (!strcmp(ranks, "2 ") || !strcmp(ranks, "0, 2 ") || !strcmp(ranks, "1, 2 ")),
              "rank %d names the stalled rank:\n%s", r, out);
        if (r == 0 && p) printf("stalled peer under mpirun, %s\n", line);
    }
    CHECK(alone >= 1, "the first rank to time out names rank 2 alone:\n%s", out);
    free(out);
    return check_summary("dist_mpi");
}
