/* bench_collectives.h — the results of `tessel bench collectives`
 * (tools/bench_collectives.c measures them, bench_collectives_print.c
 * prints them). Internal to the two. */
#ifndef TS_TOOLS_BENCH_COLLECTIVES_H
#define TS_TOOLS_BENCH_COLLECTIVES_H

#include <stddef.h>
#include "tessel/dist.h"

#define NOPS   3
#define NSIZES 24
extern const char *const bc_op_names[NOPS]; /* all_reduce, reduce_scatter, all_gather */

typedef struct point {
    double us;     /* mean time per call, 0 if not measured */
    char algo[16]; /* what ran */
} point;

typedef struct results {
    int nsizes;
    size_t bytes[NSIZES];
    /* best over rounds; ref: Open MPI's own collective; ceil: memcpy */
    point shm[NOPS][NSIZES], mpi[NOPS][NSIZES], ref[NOPS][NSIZES], ceil[NSIZES];
    point tshm[NOPS][NSIZES], tmpi[NOPS][NSIZES], tref[NOPS][NSIZES],
        tceil[NSIZES]; /* this round */
    /* shm's zero-byte collective (ts_barrier): what the ranks'
     * synchronisation alone costs, the floor under every small collective */
    point sync, tsync;
    int shm_ok, mpi_ok;
    char shm_tune[256], mpi_tune[256];
} results;

typedef struct opts {
    int procs, ops[NOPS], json, want_shm, want_mpi, rounds;
    size_t min, max;
    ts_coll_algo algo;
    double time;
    const char *worker_out; /* set in the copy run under mpirun */
} opts;

/* The table (with the ratios to Open MPI and to the copy ceiling, and
 * the targets of issue #26), or JSON. */
void bc_print_table(const opts *o, const results *R);
void bc_print_json(const opts *o, const results *R);

#endif
