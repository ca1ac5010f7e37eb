/* threads.c — how many threads each process of a run uses when train.threads is 0 (auto):
 * the cores this process may run on, shared by the processes of the run on this host that
 * may run on the same cores. See session_internal.h (ts_sess_resolve_threads) and
 * docs/config.md, "Threads". */
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <omp.h>
#include "core/core.h"
#include "tessel/util.h"
#include "session/session_internal.h"

/* The CPUs this process may run on (its affinity mask: what mpirun's or srun's binding, a
 * cpuset or taskset left it) and a hash of which ones they are. */
static int my_cpus(uint64_t *mask_hash) {
    cpu_set_t set;
    CPU_ZERO(&set);
    if (sched_getaffinity(0, sizeof set, &set) != 0) {
        long n = sysconf(_SC_NPROCESSORS_ONLN);
        *mask_hash = 0;
        return n > 0 ? (int)n : 1;
    }
    *mask_hash = ts_hash64(&set, sizeof set, 0);
    const int n = CPU_COUNT(&set);
    return n > 0 ? n : 1;
}

ts_status ts_sess_resolve_threads(session *s) {
    s->threads = 0;
    s->threads_why[0] = 0;
    const char *omp = getenv("OMP_NUM_THREADS");
    uint64_t mask = 0;
    const int cpus = my_cpus(&mask);
    if (s->c.train.threads > 0) {
        snprintf(s->threads_why, sizeof s->threads_why, "train.threads");
        s->threads_used = s->c.train.threads;
        return TS_OK;
    }
    /* The processes of this run that share this process's cores: those on its host (the
     * comm's host table: machine and network namespace, or TESSEL_HOST) with the same
     * affinity mask. Ranks bound to their own cores (mpirun --bind-to core, srun's
     * --cpus-per-task binding) share none; forked or unbound ranks share all. Every rank
     * calls this at the same point (a collective), also a rank with OMP_NUM_THREADS set:
     * the environment may differ between ranks, and one rank leaving the collective early
     * would leave the others waiting in it. */
    int sharing = 1;
    if (s->o->comm && s->nranks > 1) {
        uint64_t *all = ts_zalloc(sizeof *all * (size_t)s->nranks, "affinity masks");
        if (!all) return TS_ERR_NOMEM;
        ts_status st = ts_allgather(s->o->comm, &mask, all, sizeof *all * (size_t)s->nranks, TS_U8,
                                    TS_ALGO_AUTO);
        if (st != TS_OK) {
            free(all);
            ts_error_prefix("threads per process: exchanging the ranks' CPU affinity");
            return st;
        }
        sharing = 0;
        const int host = ts_comm_host(s->o->comm, s->rank);
        for (int r = 0; r < s->nranks; r++)
            sharing += ts_comm_host(s->o->comm, r) == host && all[r] == mask;
        free(all);
        if (sharing < 1) sharing = 1;
    }
    if (omp && *omp) { /* the user's (or the launcher's) choice: OpenMP follows it */
        snprintf(s->threads_why, sizeof s->threads_why, "OMP_NUM_THREADS=%.32s", omp);
        s->threads_used = atoi(omp) > 0 ? atoi(omp) : cpus;
        return TS_OK;
    }
    s->threads_used = cpus / sharing > 0 ? cpus / sharing : 1;
    snprintf(s->threads_why, sizeof s->threads_why, "%d core%s, %d process%s on this host", cpus,
             cpus == 1 ? "" : "s", sharing, sharing == 1 ? "" : "es");
    /* One process alone keeps OpenMP's own default (the same count); several set it. */
    if (sharing > 1) {
        s->threads = s->threads_used;
        omp_set_num_threads(s->threads); /* this thread's OpenMP outside the plans too */
    }
    return TS_OK;
}
