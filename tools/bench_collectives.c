/* tessel bench collectives: collective bandwidth of the shm and mpi
 * transports next to Open MPI's MPI_Allreduce, measured in one run.
 *
 *   tessel bench collectives [--procs N] [--transport shm|mpi|both]
 *       [--ops all_reduce,reduce_scatter,all_gather] [--min BYTES] [--max BYTES]
 *       [--algo NAME] [--time SECONDS] [--json]
 *
 * Started normally, it runs the shm part with N forked workers (buffers in
 * the shared segment, as the memory planner places gradient buckets), then
 * runs itself under `mpirun -np N` for the mpi transport and the
 * MPI_Allreduce reference, and prints one table. Started by mpirun or srun
 * itself, it measures the mpi transport and MPI_Allreduce only.
 *
 * Each point: rank 0 times three calls, picks an iteration count filling
 * --time seconds, splits it into 5-500 batches of about 200 us and
 * broadcasts that; the batches run as barrier, calls, barrier and the
 * point is rank 0's mean of the fastest batch. Bus bandwidth follows
 * nccl-tests: all-reduce moves 2(n-1)/n of the buffer per rank, reduce-scatter and all-gather
 * (n-1)/n.
 */
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#include "bench_collectives.h"
#include "dist_cli.h"
#include "tessel/dist.h"
#ifdef TESSEL_HAVE_MPI
#include <mpi.h>
#endif

/* Each point is the fastest of several batches of calls: on a shared
 * machine a batch that another process interrupted is simply discarded.
 * A batch lasts about BATCH_S (at least one call), so that one
 * interruption spoils one short batch instead of a fifth of the point:
 * with five batches of 20 ms each, a 64 KiB collective (1 us) on a loaded
 * machine measured 2-8x its undisturbed time. The same batches time the
 * shm and mpi transports, Open MPI and the memcpy ceiling. */
#define MIN_BATCHES 5
#define MAX_BATCHES 500
#define BATCH_S     200e-6

/* Splits `iters` calls of `first` seconds each into batches. */
static void plan_batches(double first, int iters, int plan[2]) {
    int per = first > 0 ? (int)(BATCH_S / first) : 1;
    if (per < 1) per = 1;
    if (per > iters / MIN_BATCHES) per = iters / MIN_BATCHES > 0 ? iters / MIN_BATCHES : 1;
    int nb = iters / per;
    plan[0] = nb < MIN_BATCHES ? MIN_BATCHES : nb > MAX_BATCHES ? MAX_BATCHES : nb;
    plan[1] = per;
}

static int usage_error(const char *fmt, const char *arg) {
    fprintf(stderr, "tessel: error: bench collectives: ");
    fprintf(stderr, fmt, arg);
    fprintf(stderr,
            "\nusage: tessel bench collectives [--procs N] [--transport shm|mpi|both]\n"
            "           [--ops all_reduce,reduce_scatter,all_gather] [--min BYTES] [--max BYTES]\n"
            "           [--algo auto|native|ring|rhd|rd|hier] [--time SECONDS] [--rounds N]\n"
            "           [--json]\n");
    return 2;
}

static int parse_bytes(const char *s, size_t *out) {
    char *end;
    double v = strtod(s, &end);
    if (end == s || v < 1) return -1;
    if (*end == 'K' || *end == 'k')
        v *= 1024, end++;
    else if (*end == 'M' || *end == 'm')
        v *= 1048576, end++;
    else if (*end == 'G' || *end == 'g')
        v *= 1073741824.0, end++;
    if (*end == 'B' || *end == 'b') end++;
    if (*end || v > 4.0 * 1073741824.0) return -1;
    *out = (size_t)v;
    return 0;
}

static int parse(int argc, char **argv, opts *o) {
    *o = (opts){.procs = 2,
                .ops = {1, 1, 1},
                .want_shm = 1,
                .rounds = 1,
                .want_mpi = 1,
                .min = 4,
                .max = 256u << 20,
                .algo = TS_ALGO_AUTO,
                .time = 0.1};
    int i = argc > 0 && !strcmp(argv[0], "collectives") ? 1 : 0;
    for (; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "--json")) {
            o->json = 1;
            continue;
        }
        static const char *const valued[] = {"--procs", "--transport", "--ops",
                                             "--min",   "--max",       "--algo",
                                             "--time",  "--rounds",    "--worker-out"};
        const char *eq = strchr(a, '=');
        char name[32];
        snprintf(name, sizeof name, "%.*s", eq ? (int)(eq - a) : (int)strlen(a), a);
        int known = 0;
        for (size_t k = 0; k < sizeof valued / sizeof valued[0]; k++)
            known |= !strcmp(name, valued[k]);
        if (!known) return usage_error("unknown option '%s'", a);
        const char *v = eq ? eq + 1 : i + 1 < argc ? argv[++i] : NULL;
        if (!v) return usage_error("missing value for %s", name);
        if (!strcmp(name, "--procs") || !strcmp(name, "--rounds")) {
            char *end;
            long n = strtol(v, &end, 10);
            if (*end || n < 1 || n > 256) return usage_error("expected 1..256, got '%s'", v);
            *(!strcmp(name, "--procs") ? &o->procs : &o->rounds) = (int)n;
        } else if (!strcmp(name, "--transport")) {
            if (!strcmp(v, "shm"))
                o->want_mpi = 0;
            else if (!strcmp(v, "mpi"))
                o->want_shm = 0;
            else if (strcmp(v, "both"))
                return usage_error("--transport: shm, mpi or both, got '%s'", v);
        } else if (!strcmp(name, "--ops")) {
            char buf[128];
            snprintf(buf, sizeof buf, "%s", v);
            memset(o->ops, 0, sizeof o->ops);
            char *save = NULL;
            for (char *t = strtok_r(buf, ",", &save); t; t = strtok_r(NULL, ",", &save)) {
                int k = -1;
                for (int j = 0; j < NOPS; j++)
                    if (!strcmp(t, bc_op_names[j])) k = j;
                if (k < 0) return usage_error("--ops: unknown collective '%s'", t);
                o->ops[k] = 1;
            }
        } else if (!strcmp(name, "--min") || !strcmp(name, "--max")) {
            if (parse_bytes(v, !strcmp(name, "--min") ? &o->min : &o->max))
                return usage_error("bad size '%s' (e.g. 4, 64K, 256M)", v);
        } else if (!strcmp(name, "--algo")) {
            int al = ts_coll_algo_parse(v);
            if (al < 0) return usage_error("--algo: unknown algorithm '%s'", v);
            o->algo = (ts_coll_algo)al;
        } else if (!strcmp(name, "--time")) {
            char *end;
            o->time = strtod(v, &end);
            if (*end || o->time <= 0 || o->time > 60)
                return usage_error("--time: 0..60 s, got '%s'", v);
        } else {
            o->worker_out = v;
        }
    }
    if (o->min > o->max) return usage_error("--min is above --max%s", "");
    return 0;
}

/* ---- measuring ------------------------------------------------------------ */

static double now_s(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

typedef struct bufs {
    float *a, *b; /* a: all-reduce buffer, reduce-scatter input, all-gather output */
    size_t max;
} bufs;

/* op SYNC_OP: the zero-byte collective, a barrier. */
#define SYNC_OP NOPS

static ts_status one(ts_comm *c, int op, const bufs *B, size_t bytes, ts_coll_algo algo) {
    size_t count = bytes / sizeof(float);
    if (op == SYNC_OP) return ts_barrier(c);
    if (op == 0) return ts_allreduce(c, B->a, count, TS_F32, TS_RED_SUM, algo);
    if (op == 1) return ts_reduce_scatter(c, B->a, B->b, count, TS_F32, TS_RED_SUM, algo);
    return ts_allgather(c, NULL, B->a, count, TS_F32, algo);
}

/* Batches filling `target` seconds, decided by rank 0 for everyone:
 * plan[0] batches of plan[1] calls. */
static ts_status iterations(ts_comm *c, double first, double target, int plan[2]) {
    int n = first > 0 ? (int)(target / first) : 1000;
    if (n < 3) n = 3;
    if (n > 20000) n = 20000;
    plan_batches(first, n, plan);
    return ts_broadcast(c, plan, 2 * sizeof *plan, 0);
}

static ts_status measure(ts_comm *c, int op, const bufs *B, size_t bytes, const opts *o, point *p) {
    ts_status s = TS_OK;
    for (int w = 0; w < 2 && s == TS_OK; w++) s = one(c, op, B, bytes, o->algo); /* warm-up */
    if (s == TS_OK) s = ts_barrier(c);
    double t0, first = 0; /* the fastest of three calls sizes the batches */
    for (int k = 0; k < 3 && s == TS_OK; k++) {
        t0 = now_s();
        s = one(c, op, B, bytes, o->algo);
        if (!k || now_s() - t0 < first) first = now_s() - t0;
    }
    int plan[2] = {1, 1};
    if (s == TS_OK) s = iterations(c, first, o->time, plan);
    int per = plan[1];
    double best = 0;
    for (int b = 0; b < plan[0] && s == TS_OK; b++) {
        s = ts_barrier(c);
        t0 = now_s();
        for (int i = 0; i < per && s == TS_OK; i++) s = one(c, op, B, bytes, o->algo);
        if (s == TS_OK) s = ts_barrier(c);
        double t = (now_s() - t0) / per;
        if (b == 0 || t < best) best = t;
    }
    if (s != TS_OK) return s;
    p->us = best * 1e6;
    if (op == SYNC_OP) {
        snprintf(p->algo, sizeof p->algo, "barrier");
        return TS_OK;
    }
    snprintf(p->algo, sizeof p->algo, "%s",
             ts_comm_algo_label(c, o->algo != TS_ALGO_AUTO
                                       ? o->algo
                                       : ts_comm_algo_for(c, (ts_coll_kind)op, bytes, TS_F32)));
    return TS_OK;
}

static ts_status alloc_bufs(ts_comm *c, size_t max, bufs *B) {
    B->max = max;
    B->a = ts_comm_alloc(c, max);
    B->b = ts_comm_alloc(c, max / (size_t)ts_comm_size(c) + 64);
    if (!B->a || !B->b) return TS_ERR_NOMEM;
    /* Written once so every page exists before timing starts. */
    for (size_t i = 0; i < max / sizeof(float); i++) B->a[i] = (float)(i % 7) * 1e-3f;
    memset(B->b, 0, max / (size_t)ts_comm_size(c) + 64);
    return TS_OK;
}

static void free_bufs(ts_comm *c, bufs *B) {
    ts_comm_free(c, B->a);
    ts_comm_free(c, B->b);
}

/* The copy ceiling at one size: every rank copies `bytes` between two
 * buffers of its own at once (the footprint and the contention a
 * collective of that size has); the fastest batch, timed on rank 0 until
 * every rank is done. What a core can move per second there. */
static ts_status ceiling_at(ts_comm *c, const opts *o, size_t bytes, unsigned char *x,
                            unsigned char *y, point *p) {
    memcpy(y, x, bytes);
    double t0, first = 0;
    for (int k = 0; k < 3; k++) {
        t0 = now_s();
        memcpy(y, x, bytes);
        __asm__ volatile("" : : "r"(y) : "memory");
        if (!k || now_s() - t0 < first) first = now_s() - t0;
    }
    int plan[2] = {1, 1};
    ts_status s = iterations(c, first, o->time, plan);
    int per = plan[1];
    double best = 0;
    for (int b = 0; b < plan[0] && s == TS_OK; b++) {
        s = ts_barrier(c);
        t0 = now_s();
        for (int i = 0; i < per; i++) {
            memcpy(y, x, bytes);
            __asm__ volatile("" : : "r"(y) : "memory"); /* every copy happens */
        }
        /* Until every rank has finished, as a collective's batch is timed:
         * a collective is as slow as its slowest rank. */
        if (s == TS_OK) s = ts_barrier(c);
        double t = (now_s() - t0) / per;
        if (b == 0 || t < best) best = t;
    }
    p->us = best * 1e6;
    snprintf(p->algo, sizeof p->algo, "memcpy");
    return s;
}

static void *page_alloc(size_t bytes) {
    void *p = NULL;
    return posix_memalign(&p, 4096, bytes) ? NULL : p;
}

/* Measures every op and size on comm c into rows[op][size], and with ceil
 * the copy ceiling of each size right before its collectives: on a loaded
 * machine a ceiling measured minutes apart from the collectives it is
 * compared with would see another load. */
static ts_status sweep(ts_comm *c, const opts *o, const results *R, point rows[NOPS][NSIZES],
                       point *ceil, point *sync, char *tune, size_t tune_n) {
    bufs B = {0};
    size_t max = R->bytes[R->nsizes - 1];
    /* Page-aligned, so the ceiling does not depend on --max: two malloc
     * blocks under glibc's mmap threshold (128 KiB) lie back to back, 16
     * bytes apart modulo 64, and a 64 KiB memcpy between them ran at 103
     * GB/s where page-aligned buffers (any larger --max) gave 141 GB/s,
     * which put the same 0.57 us reduce-scatter at 83 % or 61 % of "the"
     * ceiling (docs/distributed.md, session 18). */
    unsigned char *x = ceil ? page_alloc(max) : NULL, *y = ceil ? page_alloc(max) : NULL;
    ts_status s = alloc_bufs(c, max, &B);
    if (s == TS_OK && ceil && (!x || !y)) s = TS_ERR_NOMEM;
    if (s == TS_OK && ceil) memset(x, 1, max), memset(y, 2, max);
    if (s == TS_OK && o->algo == TS_ALGO_AUTO) s = ts_comm_tune(c);
    if (s == TS_OK) snprintf(tune, tune_n, "%s", ts_comm_tune_source(c));
    if (s == TS_OK && sync) s = measure(c, SYNC_OP, &B, 0, o, sync);
    for (int k = 0; k < R->nsizes && s == TS_OK; k++) {
        if (ceil) s = ceiling_at(c, o, R->bytes[k], x, y, &ceil[k]);
        for (int op = 0; op < NOPS && s == TS_OK; op++)
            if (o->ops[op]) s = measure(c, op, &B, R->bytes[k], o, &rows[op][k]);
    }
    free_bufs(c, &B);
    free(x);
    free(y);
    return s;
}

typedef struct shm_job {
    const opts *o;
    results *R; /* in a MAP_SHARED mapping: rank 0 writes, the launcher reads */
} shm_job;

static int shm_worker(ts_comm *c, void *user) {
    shm_job *j = user;
    ts_status s = sweep(c, j->o, j->R, j->R->tshm, j->R->tceil, &j->R->tsync, j->R->shm_tune,
                        sizeof j->R->shm_tune);
    if (s != TS_OK) {
        fprintf(stderr, "tessel: error: bench collectives: shm rank %d: %s\n", ts_comm_rank(c),
                ts_last_error());
        return 1;
    }
    if (ts_comm_rank(c) == 0) j->R->shm_ok = 1;
    return 0;
}

#ifdef TESSEL_HAVE_MPI
/* One call of Open MPI's own collective `op` on MPI_COMM_WORLD, the
 * reference: MPI_Allreduce in place, MPI_Reduce_scatter_block,
 * MPI_Allgather in place (equal blocks: `bytes` a multiple of 4 x ranks). */
static int ref_call(int op, size_t bytes, float *buf, float *out) {
    int n;
    MPI_Comm_size(MPI_COMM_WORLD, &n);
    int count = (int)(bytes / sizeof(float)), block = count / n;
    if (op == 0) return MPI_Allreduce(MPI_IN_PLACE, buf, count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
    if (op == 1)
        return MPI_Reduce_scatter_block(buf, out, block, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
    return MPI_Allgather(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, buf, block, MPI_FLOAT, MPI_COMM_WORLD);
}

static const char *const ref_names[NOPS] = {"MPI_Allreduce", "MPI_Reduce_scatter_block",
                                            "MPI_Allgather"};

static int measure_ref(int op, size_t bytes, float *buf, float *out, const opts *o, point *p) {
    int rank, n, iters = 0;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &n);
    if (op > 0 && bytes / sizeof(float) < (size_t)n) return 0; /* no whole block per rank */
    for (int w = 0; w < 2; w++)
        if (ref_call(op, bytes, buf, out) != MPI_SUCCESS) return 1;
    MPI_Barrier(MPI_COMM_WORLD);
    double t0, first = 0;
    for (int k = 0; k < 3; k++) {
        t0 = MPI_Wtime();
        if (ref_call(op, bytes, buf, out) != MPI_SUCCESS) return 1;
        if (!k || MPI_Wtime() - t0 < first) first = MPI_Wtime() - t0;
    }
    if (rank == 0) {
        iters = first > 0 ? (int)(o->time / first) : 1000;
        iters = iters < 3 ? 3 : iters > 20000 ? 20000 : iters;
    }
    int plan[2] = {1, 1};
    if (rank == 0) plan_batches(first, iters, plan);
    MPI_Bcast(plan, 2, MPI_INT, 0, MPI_COMM_WORLD);
    int per = plan[1];
    double best = 0;
    for (int b = 0; b < plan[0]; b++) {
        MPI_Barrier(MPI_COMM_WORLD);
        t0 = MPI_Wtime();
        for (int i = 0; i < per; i++)
            if (ref_call(op, bytes, buf, out) != MPI_SUCCESS) return 1;
        MPI_Barrier(MPI_COMM_WORLD);
        double t = (MPI_Wtime() - t0) / per;
        if (b == 0 || t < best) best = t;
    }
    p->us = best * 1e6;
    snprintf(p->algo, sizeof p->algo, "%.15s", ref_names[op]);
    return 0;
}
#endif

/* Keeps the fastest of the rounds: the machine is shared, and the best
 * round is the one least disturbed. */
static void merge(point *best, point *p, int n) {
    for (int i = 0; i < n; i++) {
        if (p[i].us > 0 && (best[i].us <= 0 || p[i].us < best[i].us)) best[i] = p[i];
        p[i].us = 0;
    }
}

static void merge_all(results *R) {
    merge(&R->shm[0][0], &R->tshm[0][0], NOPS * NSIZES);
    merge(&R->mpi[0][0], &R->tmpi[0][0], NOPS * NSIZES);
    merge(&R->ref[0][0], &R->tref[0][0], NOPS * NSIZES);
    merge(R->ceil, R->tceil, NSIZES);
    merge(&R->sync, &R->tsync, 1);
}

/* Under mpirun: the mpi transport, then MPI_Allreduce, `rounds` times. */
static int run_mpi_part(const opts *o, results *R, int rounds) {
    ts_comm *c;
    if (ts_comm_mpi(&c) != TS_OK) {
        fprintf(stderr, "tessel: error: bench collectives: %s\n", ts_last_error());
        return 1;
    }
    int rank = ts_comm_rank(c), rc = 0;
    for (int round = 0; round < rounds && !rc; round++) {
        if (sweep(c, o, R, R->tmpi, NULL, NULL, R->mpi_tune, sizeof R->mpi_tune) != TS_OK) {
            fprintf(stderr, "tessel: error: bench collectives: mpi rank %d: %s\n", rank,
                    ts_last_error());
            rc = 1;
        }
#ifdef TESSEL_HAVE_MPI
        if (!rc) {
            size_t max = R->bytes[R->nsizes - 1];
            float *buf = malloc(max), *out = malloc(max);
            if (!buf || !out) rc = 1;
            for (size_t i = 0; buf && i < max / sizeof(float); i++) buf[i] = 1e-3f;
            for (int op = 0; op < NOPS && !rc; op++)
                for (int k = 0; k < R->nsizes && !rc && o->ops[op]; k++)
                    rc = measure_ref(op, R->bytes[k], buf, out, o, &R->tref[op][k]);
            free(buf);
            free(out);
        }
#endif
        if (rank == 0 && o->worker_out && !rc) {
            FILE *f = fopen(o->worker_out, "w");
            if (!f) {
                rc = 1;
            } else {
                fprintf(f, "tune %s\n", R->mpi_tune);
                for (int k = 0; k < R->nsizes; k++) {
                    for (int op = 0; op < NOPS; op++)
                        if (R->tmpi[op][k].us > 0)
                            fprintf(f, "%d %zu %s %.4f\n", op, R->bytes[k], R->tmpi[op][k].algo,
                                    R->tmpi[op][k].us);
                    for (int op = 0; op < NOPS; op++)
                        if (R->tref[op][k].us > 0)
                            fprintf(f, "ref%d %zu %s %.4f\n", op, R->bytes[k], R->tref[op][k].algo,
                                    R->tref[op][k].us);
                }
                if (fclose(f)) rc = 1;
            }
        }
        merge_all(R);
    }
    R->mpi_ok = !rc;
    ts_comm_close(c);
    return rc;
}

static int find_in_path(const char *prog, char *out, size_t n) {
    const char *path = getenv("PATH");
    if (!path) return 0;
    char buf[4096];
    snprintf(buf, sizeof buf, "%s", path);
    char *save = NULL;
    for (char *d = strtok_r(buf, ":", &save); d; d = strtok_r(NULL, ":", &save)) {
        snprintf(out, n, "%s/%s", d, prog);
        if (access(out, X_OK) == 0) return 1;
    }
    return 0;
}

/* Re-runs this binary under mpirun and reads rank 0's results back. */
static int spawn_mpi_part(int argc, char **argv, const opts *o, results *R) {
    char mpirun[1024], exe[PATH_MAX], out[] = "/tmp/tessel-bench-mpi-XXXXXX";
    if (!find_in_path("mpirun", mpirun, sizeof mpirun)) {
        fprintf(stderr, "bench collectives: mpirun not found; skipping the mpi transport and "
                        "MPI_Allreduce (install openmpi-bin)\n");
        return 0;
    }
    ssize_t k = readlink("/proc/self/exe", exe, sizeof exe - 1);
    if (k <= 0) return 1;
    exe[k] = 0;
    int fd = mkstemp(out);
    if (fd < 0) return 1;
    close(fd);
    char np[16];
    snprintf(np, sizeof np, "%d", o->procs);
    const char *args[300];
    int n = 0;
    args[n++] = mpirun;
    if (geteuid() == 0) args[n++] = "--allow-run-as-root";
    args[n++] = "--oversubscribe";
    args[n++] = "-np";
    args[n++] = np;
    args[n++] = exe;
    args[n++] = "bench";
    args[n++] = "collectives";
    for (int i = argc > 0 && !strcmp(argv[0], "collectives") ? 1 : 0; i < argc && n < 290; i++)
        args[n++] = argv[i];
    args[n++] = "--worker-out";
    args[n++] = out;
    args[n] = NULL;
    fflush(stdout);
    fflush(stderr);
    pid_t pid = fork();
    if (pid == 0) {
        setenv("OMPI_ALLOW_RUN_AS_ROOT", "1", 1);
        setenv("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1", 1);
        execv(mpirun, (char *const *)args);
        _exit(127);
    }
    int st = 0;
    if (pid < 0 || waitpid(pid, &st, 0) < 0 || !WIFEXITED(st) || WEXITSTATUS(st)) {
        fprintf(stderr, "tessel: error: bench collectives: mpirun part failed (status %d)\n", st);
        unlink(out);
        return 1;
    }
    FILE *f = fopen(out, "r");
    char line[512];
    while (f && fgets(line, sizeof line, f)) {
        char what[32], algo[64];
        size_t bytes;
        double us;
        if (!strncmp(line, "tune ", 5)) {
            line[strcspn(line, "\n")] = 0;
            snprintf(R->mpi_tune, sizeof R->mpi_tune, "%.255s", line + 5);
            continue;
        }
        if (sscanf(line, "%31s %zu %63s %lf", what, &bytes, algo, &us) != 4) continue;
        for (int s = 0; s < R->nsizes; s++) {
            if (R->bytes[s] != bytes) continue;
            point *p = !strncmp(what, "ref", 3) ? &R->tref[atoi(what + 3) % NOPS][s]
                                                : &R->tmpi[atoi(what) % NOPS][s];
            p->us = us;
            snprintf(p->algo, sizeof p->algo, "%.15s", algo);
        }
    }
    if (f) fclose(f);
    unlink(out);
    R->mpi_ok = 1;
    return 0;
}

int tessel_cmd_bench_collectives(int argc, char **argv) {
    opts o;
    int rc = parse(argc, argv, &o);
    if (rc) return rc;
    int under_mpi = ts_dist_started_by_mpi();
    /* The results live in shared memory: the shm workers are forked. */
    results *R = mmap(NULL, sizeof *R, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (R == MAP_FAILED) {
        fprintf(stderr, "tessel: error: bench collectives: %s\n", strerror(errno));
        return 1;
    }
    memset(R, 0, sizeof *R);
    for (size_t b = 4; b <= o.max && R->nsizes < NSIZES; b *= 4)
        if (b >= o.min) R->bytes[R->nsizes++] = b;
    if (!R->nsizes) {
        munmap(R, sizeof *R);
        return usage_error("no size between --min and --max%s", "");
    }
    if (under_mpi) {
        /* The copy started by spawn_mpi_part measures one round per call. */
        rc = run_mpi_part(&o, R, o.worker_out ? 1 : o.rounds);
        if (!rc && !o.worker_out) {
            int rank = 0;
            if (getenv("OMPI_COMM_WORLD_RANK")) rank = atoi(getenv("OMPI_COMM_WORLD_RANK"));
            if (getenv("PMI_RANK")) rank = atoi(getenv("PMI_RANK"));
            if (rank == 0) {
                if (o.json)
                    bc_print_json(&o, R);
                else
                    bc_print_table(&o, R);
            }
        }
        munmap(R, sizeof *R);
        return rc;
    }
    /* Rounds alternate shm and mpi, so both see the same spells of load. */
    for (int round = 0; round < o.rounds && !rc; round++) {
        if (o.want_shm) {
            shm_job j = {&o, R};
            ts_shm_options so = {0};
            so.cpus_per_rank = 1; /* as mpirun binds each rank to a core */
            size_t need = R->bytes[R->nsizes - 1];
            so.heap_bytes = need + need / (size_t)o.procs + (64u << 20);
            if (so.heap_bytes < (2ull << 30)) so.heap_bytes = 0;
            if (ts_shm_launch(o.procs, &so, shm_worker, &j, NULL) != TS_OK) {
                fprintf(stderr, "tessel: error: bench collectives: %s\n", ts_last_error());
                rc = 1;
            }
        }
        if (!rc && o.want_mpi) rc = spawn_mpi_part(argc, argv, &o, R);
        merge_all(R);
    }
    if (!rc) {
        if (o.json)
            bc_print_json(&o, R);
        else
            bc_print_table(&o, R);
    }
    munmap(R, sizeof *R);
    return rc;
}
