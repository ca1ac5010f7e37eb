/* comm.h — the ts_comm transport interface (internal to src/dist).
 *
 * A transport fills a ts_comm_ops table: point-to-point messages (isend,
 * irecv, test) that every algorithm in collectives.c builds on, and
 * optionally native collectives. A transport embeds `ts_comm` as the first
 * member of its own struct. Adding a transport (nccl) is one file with one
 * table and a constructor.
 */
#ifndef TS_DIST_COMM_H
#define TS_DIST_COMM_H

#include <stdatomic.h>
#include <stdint.h>
#include "core/core.h"
#include "tessel/dist.h"

/* User tags are 0..TS_TAG_USER_MAX; collectives use tags above it. */
#define TS_TAG_USER_MAX 29999
#define TS_TAG_COLL     30000

/* Message sizes are classed for the algorithm table by these probes. */
#define TS_TUNE_CLASSES 4

enum { TS_REQ_SEND = 1, TS_REQ_RECV = 2 };

/* A point-to-point request. The public ts_comm_req is storage for one. */
typedef struct ts_req {
    int kind, peer, tag, done;
    void *buf;
    size_t bytes, moved;
    uint64_t seq;  /* collective the message belongs to (0 outside one) */
    uint32_t coll; /* its ts_coll_kind + 1, for mismatch reports */
    struct ts_req *next;
    _Alignas(8) unsigned char native[32]; /* transport handle (MPI_Request) */
} ts_req;

_Static_assert(sizeof(ts_req) <= sizeof(ts_comm_req), "ts_comm_req too small");

/* What a transport knows about a peer that stopped: which ranks have not
 * entered collective `seq`, with a short note for each (e.g. "killed by
 * signal 9"). */
typedef struct ts_absent {
    int n;
    int *ranks;     /* caller-provided, size entries */
    char note[512]; /* "rank 2: killed by signal 9; ..." */
} ts_absent;

typedef struct ts_comm_ops {
    const char *name;
    const char *native_name; /* how reports call TS_ALGO_NATIVE: "direct", "mpi" */
    /* Start a send or receive described by r (kind, peer, tag, buf, bytes,
     * seq, coll already set). A send may complete at once. */
    ts_status (*isend)(ts_comm *c, ts_req *r);
    ts_status (*irecv)(ts_comm *c, ts_req *r);
    /* Make progress without blocking; sets r->done when r finished. */
    ts_status (*test)(ts_comm *c, ts_req *r);
    /* Called on entering collective seq, so peers can tell who arrived. */
    void (*enter)(ts_comm *c, uint64_t seq, ts_coll_kind kind, size_t bytes);
    /* Non-blocking check made while waiting on `peer` (-1: any): returns a
     * description ("rank 2 killed by signal 9") when a rank we wait on can
     * no longer deliver, else NULL. */
    const char *(*peer_gone)(ts_comm *c, int peer);
    /* After a failure: fills `a` with the ranks that have not entered seq. */
    void (*absent)(ts_comm *c, uint64_t seq, ts_absent *a);
    /* Optional native collectives (NULL: none). They return
     * TS_ERR_UNSUPPORTED for a dtype or op they cannot handle, which the
     * caller treats as "use another algorithm". */
    ts_status (*allreduce)(ts_comm *c, void *buf, size_t count, ts_dtype dt, ts_reduce_op op);
    ts_status (*reduce_scatter)(ts_comm *c, const void *send, void *recv, size_t count, ts_dtype dt,
                                ts_reduce_op op);
    ts_status (*allgather)(ts_comm *c, const void *send, void *recv, size_t count, ts_dtype dt);
    ts_status (*broadcast)(ts_comm *c, void *buf, size_t bytes, int root);
    ts_status (*barrier)(ts_comm *c);
    /* Shared buffers (NULL: ordinary aligned memory). */
    void *(*alloc)(ts_comm *c, size_t bytes);
    int (*free)(ts_comm *c, void *p); /* 0 when p was not the transport's */
    int (*is_shared)(const ts_comm *c, const void *p, size_t bytes);
    int shares_memory; /* see ts_comm_shares_memory */
    /* Does the native collective handle this dtype/op? */
    int (*native_ok)(const ts_comm *c, ts_coll_kind kind, ts_dtype dt, ts_reduce_op op);
    void (*destroy)(ts_comm *c);
} ts_comm_ops;

typedef struct ts_async ts_async;

struct ts_comm {
    const ts_comm_ops *ops;
    int rank, size;
    int no_close; /* owned by the shm launcher: ts_comm_close ignores it */
    double timeout;
    uint64_t seq; /* collectives entered */

    /* The collective in progress, for failure messages. */
    const char *cur_op; /* NULL outside a collective */
    uint64_t cur_seq;
    size_t cur_bytes;
    ts_dtype cur_dt;
    ts_reduce_op cur_red;
    int cur_has_red;
    const char *cur_algo;
    double cur_start, deadline; /* 0 until a wait or a trace reads the clock */

    /* After a failed collective every later call fails with this. */
    int broken;
    char broken_msg[1024];

    int *host; /* host index of each rank */
    int nhosts;

    /* Algorithm choice. */
    ts_coll_algo forced[TS_COLL_KIND_COUNT];
    int tuned, tuning; /* tuned: 0 not yet, 1 table, 2 defaults */
    uint8_t table[TS_COLL_KIND_COUNT][TS_TUNE_CLASSES];
    char tune_source[512];

    /* Scratch for algorithms, grown on demand and kept: after the first
     * collective of the largest size no call allocates. */
    void *scratch;
    size_t scratch_bytes;
    int *absent_ranks;
    int *members;  /* 2 * size ints for the hierarchical groups */
    int thread_ok; /* collectives may run on a communication thread */

    /* ts_comm_alloc_shared blocks this rank (0) allocated whose peers may
     * still use them; freed once their count of users reaches 0. */
    void **shared_pending;
    int n_shared_pending, cap_shared_pending;

    ts_async *async;
    ts_comm_trace_fn trace;
    void *trace_user;
    ts_coll_kind cur_kind;
};

/* ---- comm.c ------------------------------------------------------------ */

/* Common set-up after a transport filled ops, rank, size: timeout from the
 * environment, forced algorithms from TESSEL_COLL_ALGO, host table from
 * `host_hash` (this rank's; exchanged with the peers). */
ts_status ts_comm_init_common(ts_comm *c, uint64_t host_hash);
/* What makes this rank's host: TESSEL_HOST when set, else the machine's
 * name and network namespace ("node7/net:[4026531840]"). */
void ts_dist_host_id(char *buf, size_t n);
/* Hash of ts_dist_host_id: ranks with equal hashes share a host. */
uint64_t ts_dist_host_hash(void);
/* The default timeout: TESSEL_DIST_TIMEOUT seconds or 1800. */
double ts_dist_default_timeout(void);

/* Marks the start and end of a collective (sequence number, deadline). */
void ts_coll_enter(ts_comm *c, ts_coll_kind kind, size_t bytes, ts_dtype dt, int has_red,
                   ts_reduce_op red);
void ts_coll_leave(ts_comm *c, ts_status s);
/* The failure of the current collective: builds "all_reduce #17 (4096
 * bytes, f32 sum, ring) on rank 0: WHY; ranks that did not arrive: ...",
 * marks the comm broken, returns TS_ERR_IO. */
ts_status ts_coll_fail(ts_comm *c, const char *why_fmt, ...) TS_PRINTF(2, 3);

/* Internal p2p with a collective's tag and sequence number. */
ts_status ts_p2p_start(ts_comm *c, ts_req *r, int kind, int peer, int tag, void *buf, size_t bytes);
/* Waits for reqs[0..n) until the current deadline; a dead peer or the
 * deadline gives ts_coll_fail. */
ts_status ts_p2p_waitall(ts_comm *c, ts_req *const *reqs, int n);

/* One spin-wait hint to the core (x86 `pause`: the spinning hardware thread
 * yields issue slots to its sibling), nothing elsewhere. */
static inline void ts_cpu_pause(void) {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#endif
}

/* The spin-then-yield loop of every wait: call once per unsuccessful
 * check; returns non-zero every ~256 calls, when the caller should look at
 * the deadline and dead peers. */
int ts_spin(unsigned *spins);
/* Set on a communication thread (async.c): its long waits sleep 50 us per
 * round instead of yielding, leaving the core to the step's own thread. */
extern _Thread_local int ts_spin_may_sleep;
/* Checks deadline and dead peers while waiting on `peer` (-1: all);
 * TS_OK to keep waiting, else the failure (after `recheck` returned 0
 * once more, so data delivered just before a peer exited is not lost). */
ts_status ts_wait_check(ts_comm *c, int peer, int (*recheck)(void *), void *arg);

/* Scratch of at least `bytes` (kept in the comm). */
void *ts_comm_scratch(ts_comm *c, size_t bytes);

/* ---- collectives.c ----------------------------------------------------- */

/* Run one collective synchronously (the async thread calls these too). */
ts_status ts_coll_run_allreduce(ts_comm *c, void *buf, size_t count, ts_dtype dt, ts_reduce_op op,
                                ts_coll_algo algo);
ts_status ts_coll_run_reduce_scatter(ts_comm *c, const void *send, void *recv, size_t count,
                                     ts_dtype dt, ts_reduce_op op, ts_coll_algo algo);
ts_status ts_coll_run_allgather(ts_comm *c, const void *send, void *recv, size_t count, ts_dtype dt,
                                ts_coll_algo algo);
ts_status ts_coll_run_broadcast(ts_comm *c, void *buf, size_t bytes, int root);
ts_status ts_coll_run_barrier(ts_comm *c);

ts_status ts_coll_validate(const ts_comm *c, ts_coll_kind kind, const void *buf, const void *send,
                           void *recv, size_t count, ts_dtype dt, ts_reduce_op op,
                           ts_coll_algo algo, int root);

/* ---- reduce.c ---------------------------------------------------------- */

/* 1 when reductions support dt. */
int ts_red_dtype_ok(ts_dtype dt);
/* dst[i] = a[i] op b[i] for n elements (dst may alias a or b). a is the
 * operand from the lower-ranked side, so NaN payloads and signed zeros come
 * out the same wherever the pair is combined. */
void ts_red_pair(void *dst, const void *a, const void *b, size_t n, ts_dtype dt, ts_reduce_op op);
/* The left fold over srcs[0..nsrc) of n elements, accumulated in acc
 * (float for bf16/f16, the dtype itself otherwise), then stored to every
 * dsts[0..ndst) in dt. n must be at most TS_RED_BLOCK. */
#define TS_RED_BLOCK 2048
void ts_red_fold_store(void *const *dsts, int ndst, const void *const *srcs, int nsrc, size_t n,
                       ts_dtype dt, ts_reduce_op op);
/* dst[i] = the same left fold over srcs[0..nsrc) for any n, written with
 * non-temporal stores and fenced (reduce_stream.c): for outputs past the
 * LLC. 0 when dt/op/CPU is not covered (f32 and f64 sums on AVX-512):
 * then nothing was written. */
int ts_red_fold_stream(void *dst, const void *const *srcs, int nsrc, size_t n, ts_dtype dt,
                       ts_reduce_op op);
/* The size from which to stream: the LLC's (32 MiB when unknown). */
size_t ts_red_stream_threshold(void);

/* ---- tune.c ------------------------------------------------------------ */

/* The algorithm for a collective: the forced one, else from the measured
 * table (tuning first when needed, which is collective), adjusted to what
 * the comm supports for dt/op. */
ts_status ts_coll_choose(ts_comm *c, ts_coll_kind kind, size_t bytes, ts_dtype dt, ts_reduce_op op,
                         ts_coll_algo asked, ts_coll_algo *out);
ts_coll_algo ts_coll_usable(const ts_comm *c, ts_coll_kind kind, ts_dtype dt, ts_reduce_op op,
                            ts_coll_algo a);
int ts_tune_class(size_t bytes);
ts_status ts_tune_run(ts_comm *c);
ts_status ts_tune_parse_env(ts_comm *c);

/* ---- async.c ----------------------------------------------------------- */

void ts_async_stop(ts_comm *c);
/* When the comm has a communication thread with queued work, blocking
 * collectives go through it so they stay in order: returns 1 and sets *s. */
int ts_async_route(ts_comm *c, ts_coll_kind kind, void *buf, const void *send, void *recv,
                   size_t count, ts_dtype dt, ts_reduce_op op, ts_coll_algo algo, int root,
                   ts_status *s);

/* ---- transports -------------------------------------------------------- */

ts_status ts_mpi_create(ts_comm **out);
ts_status ts_self_create(ts_comm **out);

#endif
