/* bench_collectives_print.c — the report of `tessel bench collectives`:
 * per collective and size, tessel's shm and mpi transports beside Open
 * MPI's own collective and the copy ceiling (memcpy of that size on every
 * rank at once), with the ratios issue #26 sets targets on. */
#include <stdio.h>
#include "bench_collectives.h"

const char *const bc_op_names[NOPS] = {"all_reduce", "reduce_scatter", "all_gather"};

/* The range the targets hold for. */
#define TARGET_MIN ((size_t)64 << 10)
#define TARGET_MAX ((size_t)256 << 20)

static double algbw(size_t bytes, const point *p) {
    return p->us > 0 ? bytes / p->us * 1e-3 : 0;
}

/* nccl-tests' bus bandwidth: the bytes each rank must move per second. */
static double busbw(int op, int n, size_t bytes, const point *p) {
    double f = op == 0 ? 2.0 * (n - 1) / n : (double)(n - 1) / n;
    return algbw(bytes, p) * f;
}

static void size_str(size_t b, char *out, size_t n) {
    if (b >= (1u << 20) && b % (1u << 20) == 0)
        snprintf(out, n, "%zuM", b >> 20);
    else if (b >= 1024 && b % 1024 == 0)
        snprintf(out, n, "%zuK", b >> 10);
    else
        snprintf(out, n, "%zu", b);
}

/* The least each rank must read plus write in the collective, as a share
 * of what a memcpy of the whole message reads plus writes (2 x bytes):
 * all-reduce: its 1/n slice of all n inputs read, the result written into
 * all n outputs: read bytes, write bytes -> 1; reduce-scatter: its slice of
 * all n inputs read, its slice written: (n + 1) / 2n; all-gather: the
 * (n - 1)/n of the message the peers hold read and written: (n - 1) / n. */
static double traffic_share(int op, int n) {
    return op == 0 ? 1.0 : op == 1 ? (n + 1.0) / (2.0 * n) : (n - 1.0) / n;
}

/* The copy ceiling for the collective: the time memcpy's rate needs for
 * the collective's minimal traffic over shm's time (0: not measured). */
static double of_ceiling(int op, int n, const results *R, int k) {
    const point *c = &R->ceil[k], *s = &R->shm[op][k];
    return c->us > 0 && s->us > 0 ? c->us * traffic_share(op, n) / s->us : 0;
}

/* Before session 14 the %ceil column: shm busbw over the memcpy bandwidth,
 * which for reduce-scatter counts half the bytes it must read. */
static double bus_of_ceiling(int op, int n, const results *R, int k) {
    double c = algbw(R->bytes[k], &R->ceil[k]);
    return c > 0 ? busbw(op, n, R->bytes[k], &R->shm[op][k]) / c : 0;
}

void bc_print_table(const opts *o, const results *R) {
    int n = o->procs;
    printf("tessel bench collectives: %d ranks, f32 sum; GB/s = 1e9 bytes/s; busbw as nccl-tests\n",
           n);
    if (R->shm_ok) printf("shm: buffers in the shared segment; algorithms from %s\n", R->shm_tune);
    if (R->mpi_ok)
        printf("mpi: tessel's mpi transport under mpirun; algorithms from %s\n", R->mpi_tune);
    printf("Open MPI: its own MPI_Allreduce, MPI_Reduce_scatter_block, MPI_Allgather; ceil: "
           "memcpy GB/s of that size on every rank at once\n"
           "%%ceil = time ceil's rate needs for the collective's least traffic per rank / shm time "
           "(all-reduce: read and write the message; reduce-scatter: read it, write 1/n; "
           "all-gather: read and write the (n-1)/n peers hold); bus/c = shm busbw / ceil\n");
    if (R->sync.us > 0)
        printf("shm sync floor: a zero-byte collective (ts_barrier) takes %.2f us\n", R->sync.us);
    for (int op = 0; op < NOPS; op++) {
        if (!o->ops[op]) continue;
        printf("\n%s\n%8s | %-7s %10s %8s %8s | %-7s %10s %8s | %10s %8s | %7s | %7s %6s %6s\n",
               bc_op_names[op], "bytes", "shm", "us", "algbw", "busbw", "mpi", "us", "busbw",
               "OpenMPI us", "busbw", "shm/OMPI", "ceil", "bus/c", "%ceil");
        for (int k = 0; k < R->nsizes; k++) {
            char sz[24];
            size_str(R->bytes[k], sz, sizeof sz);
            const point *s = &R->shm[op][k], *m = &R->mpi[op][k], *r = &R->ref[op][k];
            printf("%8s | %-7s %10.2f %8.3f %8.3f | %-7s %10.2f %8.3f | %10.2f %8.3f | ", sz,
                   s->us > 0 ? s->algo : "-", s->us, algbw(R->bytes[k], s),
                   busbw(op, n, R->bytes[k], s), m->us > 0 ? m->algo : "-", m->us,
                   busbw(op, n, R->bytes[k], m), r->us, busbw(op, n, R->bytes[k], r));
            if (r->us > 0 && s->us > 0)
                printf("%7.2fx | ", r->us / s->us);
            else
                printf("%7s | ", "-");
            double c = algbw(R->bytes[k], &R->ceil[k]);
            if (c > 0 && s->us > 0)
                printf("%7.2f %5.1f%% %5.1f%%\n", c, 100 * bus_of_ceiling(op, n, R, k),
                       100 * of_ceiling(op, n, R, k));
            else
                printf("%7s %6s %6s\n", "-", "-", "-");
        }
    }
    /* The targets of issue #26, from 64 KiB to 256 MiB: shm >= 1.5x Open
     * MPI's collective and >= 70 % of the copy ceiling. */
    printf("\n");
    for (int op = 0; op < NOPS; op++) {
        if (!o->ops[op]) continue;
        double worst = 0, worst_c = 0;
        size_t at = 0, at_c = 0;
        int seen = 0, seen_c = 0;
        for (int k = 0; k < R->nsizes; k++) {
            if (R->bytes[k] < TARGET_MIN || R->bytes[k] > TARGET_MAX || R->shm[op][k].us <= 0)
                continue;
            if (R->ref[op][k].us > 0) {
                double ratio = R->ref[op][k].us / R->shm[op][k].us;
                if (!seen++ || ratio < worst) worst = ratio, at = R->bytes[k];
            }
            double f = of_ceiling(op, n, R, k);
            if (f > 0 && (!seen_c++ || f < worst_c)) worst_c = f, at_c = R->bytes[k];
        }
        char a[24], b[24];
        size_str(at, a, sizeof a);
        size_str(at_c, b, sizeof b);
        if (seen)
            printf("target %s >= 1.5x Open MPI from 64K to 256M: lowest %.2fx (at %s) -> %s\n",
                   bc_op_names[op], worst, a, worst >= 1.5 ? "met" : "NOT met");
        if (seen_c)
            printf("target %s >= 70%% of the copy ceiling from 64K to 256M: lowest %.0f%% (at %s) "
                   "-> %s\n",
                   bc_op_names[op], 100 * worst_c, b, worst_c >= 0.7 ? "met" : "NOT met");
    }
}

void bc_print_json(const opts *o, const results *R) {
    printf("{\"procs\": %d, \"dtype\": \"f32\", \"shm_tuning\": \"%s\", \"mpi_tuning\": \"%s\", "
           "\"shm_sync_us\": %.4f, \"results\": [",
           o->procs, R->shm_tune, R->mpi_tune, R->sync.us);
    int first = 1;
    for (int op = 0; op < NOPS; op++)
        for (int k = 0; k < R->nsizes; k++)
            for (int t = 0; t < 4; t++) {
                const point *p = t == 0   ? &R->shm[op][k]
                                 : t == 1 ? &R->mpi[op][k]
                                 : t == 2 ? &R->ref[op][k]
                                          : &R->ceil[k];
                if (p->us <= 0 || !o->ops[op]) continue;
                printf("%s\n  {\"op\": \"%s\", \"bytes\": %zu, \"transport\": \"%s\", \"algo\": "
                       "\"%s\", \"time_us\": %.4f, \"algbw_gbs\": %.4f, \"busbw_gbs\": %.4f",
                       first ? "" : ",", bc_op_names[op], R->bytes[k],
                       t == 0   ? "shm"
                       : t == 1 ? "mpi"
                       : t == 2 ? "openmpi"
                                : "memcpy",
                       p->algo, p->us, algbw(R->bytes[k], p), busbw(op, o->procs, R->bytes[k], p));
                if (t == 0 && R->ceil[k].us > 0)
                    printf(", \"ceil_share\": %.6g", of_ceiling(op, o->procs, R, k));
                printf("}");
                first = 0;
            }
    printf("\n]}\n");
}
