/* tessel/dist.h — communication between training processes.
 *
 * A ts_comm connects `size` processes (ranks). It carries point-to-point
 * messages and the collectives data-parallel training needs: all-reduce,
 * reduce-scatter, all-gather, broadcast and barrier. Three transports sit
 * behind the same interface:
 *
 *   shm   one host: ts_shm_launch forks N workers that share one memory
 *         segment; buffers from ts_comm_alloc live inside it, and the
 *         collectives read peers' buffers in place.
 *   mpi   started by mpirun or srun (ts_comm_from_env picks it).
 *   self  one process; every collective is a copy or nothing.
 *
 * Start N workers on this host:
 *
 *     static int work(ts_comm *c, void *user) {
 *         float *g = ts_comm_alloc(c, n * sizeof(float));
 *         ...
 *         if (ts_allreduce(c, g, n, TS_F32, TS_RED_SUM, TS_ALGO_AUTO) != TS_OK) {
 *             fprintf(stderr, "rank %d: %s\n", ts_comm_rank(c), ts_last_error());
 *             return 1;
 *         }
 *         return 0;
 *     }
 *     ts_shm_launch(4, NULL, work, NULL, NULL);
 *
 * Under mpirun: ts_comm_from_env(&c), the same calls, ts_comm_close(c).
 *
 * Every collective is collective: all ranks call the same collectives in
 * the same order with the same counts, dtype, op and algorithm. Each call
 * gets the next sequence number. A call that does not complete within the
 * timeout (default 30 min, TESSEL_DIST_TIMEOUT=seconds, ts_comm_set_timeout)
 * or whose peer died fails with TS_ERR_IO and a message naming the
 * collective, its sequence number, its size and the ranks that did not
 * arrive, e.g.
 *
 *     all_reduce #17 (4096 bytes, f32 sum, ring) on rank 0 of 4 (shm): timed
 *     out after 1800.0 s; ranks that did not arrive: 2 (rank 2 last entered #16)
 *
 * After such a failure the comm is broken: later calls fail at once.
 *
 * Results are deterministic: every element is reduced in an order fixed by
 * the algorithm and the number of ranks, and every rank receives the same
 * bits. The algorithm per message size is measured once (ts_comm_tune, or
 * the first AUTO collective) and cached under $XDG_CACHE_HOME/tessel, so
 * reruns use the same algorithms; pin one with ts_comm_set_algo or
 * TESSEL_COLL_ALGO=ring (or allreduce=ring,allgather=native) to make
 * results independent of the cache. See docs/distributed.md.
 */
#ifndef TESSEL_DIST_H
#define TESSEL_DIST_H

#include <signal.h>
#include <stddef.h>
#include <stdint.h>
#include "tessel/dtype.h"
#include "tessel/status.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct ts_comm ts_comm;

typedef enum ts_reduce_op { TS_RED_SUM = 0, TS_RED_MAX, TS_RED_MIN, TS_RED_COUNT } ts_reduce_op;

typedef enum ts_coll_kind {
    TS_COLL_ALLREDUCE = 0,
    TS_COLL_REDUCE_SCATTER,
    TS_COLL_ALLGATHER,
    TS_COLL_BROADCAST,
    TS_COLL_BARRIER,
    TS_COLL_KIND_COUNT
} ts_coll_kind;

/* How a collective moves data. NATIVE is the transport's own: for shm,
 * every rank reduces its slice straight from its peers' buffers in the
 * shared segment; for mpi, MPI-3 non-blocking collectives. RING, RHD
 * (recursive halving then doubling), RD (recursive doubling, for small
 * messages) and HIER (within each host, across hosts, within each host)
 * are built on point-to-point messages and work over every transport. */
typedef enum ts_coll_algo {
    TS_ALGO_AUTO = 0,
    TS_ALGO_NATIVE,
    TS_ALGO_RING,
    TS_ALGO_RHD,
    TS_ALGO_RD,
    TS_ALGO_HIER,
    TS_ALGO_COUNT
} ts_coll_algo;

/* "auto", "native", "ring", "rhd", "rd", "hier"; parse returns -1 if unknown. */
const char *ts_coll_algo_name(ts_coll_algo a);
int ts_coll_algo_parse(const char *name);
/* "all_reduce", "reduce_scatter", "all_gather", "broadcast", "barrier". */
const char *ts_coll_kind_name(ts_coll_kind k);
const char *ts_reduce_op_name(ts_reduce_op op);

/* ---- creating a comm --------------------------------------------------- */

/* 1 when the environment shows a start by mpirun or srun
 * (OMPI_COMM_WORLD_SIZE, PMI_SIZE, PMIX_RANK or SLURM_PROCID). */
int ts_dist_started_by_mpi(void);
/* The mpi transport when started by mpirun/srun, else a one-rank comm. */
ts_status ts_comm_from_env(ts_comm **out);
/* The mpi transport (TS_ERR_UNSUPPORTED in a build without MPI). The first
 * mpi comm initialises MPI and closing it finalises MPI. */
ts_status ts_comm_mpi(ts_comm **out);
ts_status ts_comm_self(ts_comm **out);
/* Closes a comm made by the functions above (the shm launcher closes its
 * own). NULL is ignored. */
void ts_comm_close(ts_comm *c);

typedef struct ts_shm_options {
    double timeout_s;    /* per collective; 0: TESSEL_DIST_TIMEOUT or 1800 */
    size_t heap_bytes;   /* per rank, for ts_comm_alloc; 0: TESSEL_SHM_HEAP or 2 GiB
                            (address space only: pages count once written) */
    const int *host_ids; /* nprocs entries: pretend rank r runs on host
                            host_ids[r] (tests of the hierarchical path);
                            NULL: the real host (see ts_comm_host) */
    double grace_s;      /* after one worker fails, how long the others get to
                            report before they are killed; 0: 10 s */
    int cpus_per_rank;   /* > 0: pin worker r to the r-th group of this many
                            CPUs of the launcher's affinity mask (wrapping);
                            0: no pinning */
    const volatile sig_atomic_t *forward_stop; /* when *forward_stop becomes non-zero (say, a
                            signal handler of the launcher set it), every
                            running worker gets SIGUSR2, once; NULL: never */
} ts_shm_options;

/* A worker's body: its return value is its exit status (0 = success). */
typedef int (*ts_worker_fn)(ts_comm *comm, void *user);

/* Forks `nprocs` workers sharing one memory segment, runs fn in each with a
 * shm comm (rank 0..nprocs-1), and waits for all of them. Output buffered
 * in stdio is flushed first; the workers end with _exit, so only what fn
 * writes to files or shared memory (e.g. a MAP_SHARED mapping made before
 * the call) outlives them. When a worker fails (non-zero status, signal),
 * the others see it at their next collective and report; those still
 * running after opt->grace_s are killed. Returns TS_OK when every worker
 * returned 0, else TS_ERR_IO with a summary naming each failed rank and the
 * first worker's error message. exit_codes (nprocs entries, may be NULL)
 * receives each exit status, or 128 + signal number. Must be called from a
 * single-threaded process (it forks). */
ts_status ts_shm_launch(int nprocs, const ts_shm_options *opt, ts_worker_fn fn, void *user,
                        int *exit_codes);

/* ---- queries and settings ---------------------------------------------- */

int ts_comm_rank(const ts_comm *c);
int ts_comm_size(const ts_comm *c);
/* "shm", "mpi" or "self". */
const char *ts_comm_transport(const ts_comm *c);
/* Hosts are numbered 0.. in order of their lowest rank. Ranks share a host
 * when they run on the same machine (host name) in the same network
 * namespace; TESSEL_HOST=NAME overrides both (the same NAME: one host). */
int ts_comm_num_hosts(const ts_comm *c);
int ts_comm_host(const ts_comm *c, int rank);
/* Collectives this rank has entered so far. */
uint64_t ts_comm_seq(const ts_comm *c);
void ts_comm_set_timeout(ts_comm *c, double seconds);
double ts_comm_timeout(const ts_comm *c);
/* How the calling thread's collectives wait for a late peer once a short spin is over: on (1),
 * 50 us naps, leaving the core to a peer that shares it; off (0, a thread's default), yielding,
 * which answers sooner when every rank has a core. Returns the previous setting (to restore). */
int ts_comm_wait_naps(int on);
/* Forces the algorithm of one kind of collective (AUTO: back to measured
 * choice). Must be set the same way on every rank. An algorithm a kind
 * does not have falls back to RING; for broadcast and barrier, RING means
 * the point-to-point binomial tree and dissemination barrier. */
ts_status ts_comm_set_algo(ts_comm *c, ts_coll_kind kind, ts_coll_algo algo);
/* Collective: measures the algorithms (or loads the cached measurement)
 * now instead of at the first AUTO collective. */
ts_status ts_comm_tune(ts_comm *c);
/* The algorithm a collective of this kind, size and dtype would use (after
 * tuning; before it, the untuned default). Not collective. */
ts_coll_algo ts_comm_algo_for(const ts_comm *c, ts_coll_kind kind, size_t bytes, ts_dtype dt);
/* A report's name for an algorithm on this comm: NATIVE shows as "direct"
 * on shm and "mpi" on mpi. */
const char *ts_comm_algo_label(const ts_comm *c, ts_coll_algo a);
/* Where the tuning came from: "cache FILE", "probe (saved to FILE)",
 * "forced" or "default". */
const char *ts_comm_tune_source(const ts_comm *c);

/* ---- shared buffers ---------------------------------------------------- */

/* 64-byte aligned memory for collective buffers. On shm it lies in the
 * shared segment, so peers read it in place (no copy in or out); elsewhere
 * it is ordinary memory. NULL (with ts_last_error) when exhausted. */
void *ts_comm_alloc(ts_comm *c, size_t bytes);
void ts_comm_free(ts_comm *c, void *p);
/* 1 when [p, p + bytes) lies inside memory the peers can read directly. */
int ts_comm_is_shared(const ts_comm *c, const void *p, size_t bytes);
/* 1 when every rank reaches every rank's ts_comm_alloc memory at the same
 * address (shm: one segment mapped before the workers were forked), so one
 * buffer can serve all ranks and a rank may read a peer's buffer at the
 * peer's pointer. 0 for mpi and self. */
int ts_comm_shares_memory(const ts_comm *c);
/* One buffer of `bytes` (64-byte aligned) that every rank reads and writes
 * at the same address; collective, every rank gets the same *out.
 * TS_ERR_UNSUPPORTED where the ranks share no memory (ts_comm_shares_memory
 * 0). The ranks order their accesses themselves (barriers). Every rank
 * calls ts_comm_release_shared when done; it does not wait for the others,
 * and the memory goes back to the transport once the last rank released
 * it. */
ts_status ts_comm_alloc_shared(ts_comm *c, size_t bytes, void **out);
void ts_comm_release_shared(ts_comm *c, void *p);

/* ---- collectives ------------------------------------------------------- */

/* Rank `rank`'s part of `count` elements split over `size` ranks: the first
 * count % size ranks get one element more. reduce_scatter and all_gather
 * use this split. */
void ts_comm_block(size_t count, int size, int rank, size_t *offset, size_t *len);

/* buf (count elements on every rank) becomes the element-wise reduction
 * over all ranks. Supports f32, f64, bf16, f16, i32, i64. */
ts_status ts_allreduce(ts_comm *c, void *buf, size_t count, ts_dtype dt, ts_reduce_op op,
                       ts_coll_algo algo);
/* send holds count elements; recv receives this rank's block (see
 * ts_comm_block) of their reduction over all ranks. When it returns on a
 * rank, no peer reads that rank's send any more (shm's direct algorithm
 * reads peers' buffers in place and ends with every rank past its reads;
 * the others copy send out before they complete), so the caller may
 * overwrite it at once: ZeRO-2 reuses a gradient bucket's memory this way. */
ts_status ts_reduce_scatter(ts_comm *c, const void *send, void *recv, size_t count, ts_dtype dt,
                            ts_reduce_op op, ts_coll_algo algo);
/* send holds this rank's block of a count-element array; recv receives
 * every rank's block. send == NULL: the block is already in place in recv. */
ts_status ts_allgather(ts_comm *c, const void *send, void *recv, size_t count, ts_dtype dt,
                       ts_coll_algo algo);
/* bytes of root's buf are copied to every rank's buf. */
ts_status ts_broadcast(ts_comm *c, void *buf, size_t bytes, int root);
ts_status ts_barrier(ts_comm *c);

/* ---- non-blocking collectives ------------------------------------------ */

/* The same collectives, started now and carried out in order by one
 * communication thread of the comm, so a caller overlaps them with compute
 * and waits only where it needs a result. Buffers must stay untouched until
 * the wait. While started collectives are pending, the blocking calls above
 * queue behind them. */
typedef struct ts_coll_ticket {
    uint64_t id;
} ts_coll_ticket;

ts_status ts_allreduce_start(ts_comm *c, void *buf, size_t count, ts_dtype dt, ts_reduce_op op,
                             ts_coll_algo algo, ts_coll_ticket *t);
ts_status ts_reduce_scatter_start(ts_comm *c, const void *send, void *recv, size_t count,
                                  ts_dtype dt, ts_reduce_op op, ts_coll_algo algo,
                                  ts_coll_ticket *t);
ts_status ts_allgather_start(ts_comm *c, const void *send, void *recv, size_t count, ts_dtype dt,
                             ts_coll_algo algo, ts_coll_ticket *t);
/* Waits for the collective and every one started before it. */
ts_status ts_coll_wait(ts_comm *c, ts_coll_ticket t);
/* 1 when it finished (successfully or not); never blocks. */
int ts_coll_done(ts_comm *c, ts_coll_ticket t);

/* ---- tracing ------------------------------------------------------------ */

/* One finished collective, for timelines (e.g. a Chrome trace of compute
 * and communication per rank). Times are CLOCK_MONOTONIC seconds. */
typedef struct ts_comm_span {
    ts_coll_kind kind;
    uint64_t seq;
    size_t bytes;
    const char *algo; /* as ts_comm_algo_label */
    double start, end;
    int ok; /* 0 when it failed */
} ts_comm_span;

typedef void (*ts_comm_trace_fn)(const ts_comm_span *span, void *user);

/* Calls fn after every collective of this rank, on the thread that ran it
 * (the communication thread for started ones). NULL turns it off. */
void ts_comm_set_trace(ts_comm *c, ts_comm_trace_fn fn, void *user);

/* ---- point to point ---------------------------------------------------- */

/* Messages between two ranks arrive in the order they were sent, and each
 * receive must match the next message from that peer in size and tag
 * (0..29999). Do not mix with pending non-blocking collectives. */
typedef struct ts_comm_req {
    _Alignas(8) unsigned char opaque[128];
} ts_comm_req;

ts_status ts_comm_isend(ts_comm *c, int peer, int tag, const void *buf, size_t bytes,
                        ts_comm_req *req);
ts_status ts_comm_irecv(ts_comm *c, int peer, int tag, void *buf, size_t bytes, ts_comm_req *req);
/* Waits (up to the timeout) for every request of reqs[0..n). */
ts_status ts_comm_wait(ts_comm *c, ts_comm_req *reqs, int n);
/* The same, also moving on others[0..n_others) (sends still in flight,
 * which on shm advance only while their rank calls into the comm) without
 * waiting for them: a rank blocked on a receive keeps its own sends going,
 * so two ranks sending to each other cannot block each other. */
ts_status ts_comm_wait_progress(ts_comm *c, ts_comm_req *reqs, int n, ts_comm_req *const *others,
                                int n_others);

#ifdef __cplusplus
}
#endif
#endif
