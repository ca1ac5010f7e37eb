/* mpi.c — the MPI transport, used when mpirun or srun started tessel.
 *
 * Point-to-point messages are MPI_Isend/MPI_Irecv on a duplicate of
 * MPI_COMM_WORLD; native collectives are MPI-3 non-blocking ones
 * (MPI_Iallreduce, MPI_Ireduce_scatter, MPI_Iallgatherv, MPI_Ibcast,
 * MPI_Ibarrier). Every request is polled with MPI_Test against the
 * collective's deadline, so a stuck peer gives an error instead of a hang;
 * errors come back as codes (MPI_ERRORS_RETURN), never as an abort.
 *
 * MPI cannot tell whether a peer is alive, so after a timeout each rank
 * asks every peer, on a second duplicate communicator, which collective it
 * has entered. Ranks waiting anywhere in tessel answer while they poll;
 * ranks that do not answer within a short grace period, or answer with an
 * older sequence number, are the ones that did not arrive.
 */
#include "dist/comm.h"

#ifdef TESSEL_HAVE_MPI
#include <limits.h>
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define TAG_QUERY  1
#define TAG_ANSWER 2

_Static_assert(sizeof(MPI_Request) <= sizeof(((ts_req *)0)->native), "MPI_Request too large");

typedef struct mpi_comm {
    ts_comm base;
    MPI_Comm comm, diag;
    int we_init;
    int *counts, *displs; /* per rank, for the v-collectives */
    uint64_t entered;     /* last collective entered */
    uint64_t query;       /* what this rank asks about */
    uint64_t *answers;    /* per peer: what it answered */
    uint64_t *replies;    /* per peer: what this rank told it */
    MPI_Request *qreq, *areq;
    unsigned polls;
} mpi_comm;

static inline mpi_comm *M(ts_comm *c) {
    return (mpi_comm *)c;
}

static ts_status mpi_error(ts_comm *c, const char *call, int rc) {
    char text[MPI_MAX_ERROR_STRING];
    int len = 0;
    if (MPI_Error_string(rc, text, &len) != MPI_SUCCESS) len = 0;
    text[len < MPI_MAX_ERROR_STRING ? len : MPI_MAX_ERROR_STRING - 1] = 0;
    return ts_coll_fail(c, "%s failed: %s", call, len ? text : "unknown MPI error");
}

/* Answer peers that ask which collective this rank is in. */
static void serve(mpi_comm *m) {
    for (;;) {
        int flag = 0;
        MPI_Status st;
        if (MPI_Iprobe(MPI_ANY_SOURCE, TAG_QUERY, m->diag, &flag, &st) != MPI_SUCCESS || !flag)
            return;
        int src = st.MPI_SOURCE;
        uint64_t q;
        if (MPI_Recv(&q, 1, MPI_UINT64_T, src, TAG_QUERY, m->diag, MPI_STATUS_IGNORE) !=
            MPI_SUCCESS)
            return;
        m->replies[src] = m->entered;
        MPI_Request r;
        if (MPI_Isend(&m->replies[src], 1, MPI_UINT64_T, src, TAG_ANSWER, m->diag, &r) ==
            MPI_SUCCESS)
            MPI_Request_free(&r);
    }
}

static void mpi_enter(ts_comm *c, uint64_t seq, ts_coll_kind kind, size_t bytes) {
    (void)kind;
    (void)bytes;
    M(c)->entered = seq;
}

static void mpi_absent(ts_comm *c, uint64_t seq, ts_absent *a) {
    mpi_comm *m = M(c);
    int n = c->size;
    a->n = 0;
    a->note[0] = 0;
    m->query = seq;
    for (int p = 0; p < n; p++) {
        m->qreq[p] = m->areq[p] = MPI_REQUEST_NULL;
        if (p == c->rank) continue;
        m->answers[p] = 0;
        MPI_Isend(&m->query, 1, MPI_UINT64_T, p, TAG_QUERY, m->diag, &m->qreq[p]);
        MPI_Irecv(&m->answers[p], 1, MPI_UINT64_T, p, TAG_ANSWER, m->diag, &m->areq[p]);
    }
    double grace = c->timeout / 4;
    if (grace < 0.2) grace = 0.2;
    if (grace > 3.0) grace = 3.0;
    double until = ts_now() + grace;
    int pending = n - 1;
    unsigned spins = 0;
    while (pending > 0 && ts_now() < until) {
        pending = 0;
        for (int p = 0; p < n; p++) {
            if (m->areq[p] == MPI_REQUEST_NULL) continue;
            int flag = 0;
            if (MPI_Test(&m->areq[p], &flag, MPI_STATUS_IGNORE) != MPI_SUCCESS) flag = 0;
            if (!flag) pending++;
        }
        serve(m);
        ts_spin(&spins);
    }
    size_t k = 0;
    for (int p = 0; p < n; p++) {
        if (p == c->rank) continue;
        int answered = m->areq[p] == MPI_REQUEST_NULL;
        if (!answered) {
            MPI_Cancel(&m->areq[p]);
            MPI_Request_free(&m->areq[p]);
        }
        if (m->qreq[p] != MPI_REQUEST_NULL) MPI_Request_free(&m->qreq[p]);
        if (answered && m->answers[p] >= seq) continue;
        a->ranks[a->n++] = p;
        char one[96];
        if (answered)
            snprintf(one, sizeof one, "rank %d last entered #%llu", p,
                     (unsigned long long)m->answers[p]);
        else
            snprintf(one, sizeof one, "rank %d did not answer", p);
        if (k < sizeof a->note)
            k += (size_t)snprintf(a->note + k, sizeof a->note - k, "%s%s", k ? "; " : "", one);
    }
}

/* ---- point to point ------------------------------------------------------------- */

static MPI_Request *req_of(ts_req *r) {
    return (MPI_Request *)(void *)r->native;
}

static ts_status mpi_isend(ts_comm *c, ts_req *r) {
    if (r->bytes > INT_MAX)
        return ts_coll_fail(c, "a %zu-byte message to rank %d exceeds MPI's int count", r->bytes,
                            r->peer);
    int rc = MPI_Isend(r->buf, (int)r->bytes, MPI_BYTE, r->peer, r->tag, M(c)->comm, req_of(r));
    return rc == MPI_SUCCESS ? TS_OK : mpi_error(c, "MPI_Isend", rc);
}

static ts_status mpi_irecv(ts_comm *c, ts_req *r) {
    if (r->bytes > INT_MAX)
        return ts_coll_fail(c, "a %zu-byte message from rank %d exceeds MPI's int count", r->bytes,
                            r->peer);
    int rc = MPI_Irecv(r->buf, (int)r->bytes, MPI_BYTE, r->peer, r->tag, M(c)->comm, req_of(r));
    return rc == MPI_SUCCESS ? TS_OK : mpi_error(c, "MPI_Irecv", rc);
}

static ts_status mpi_test(ts_comm *c, ts_req *r) {
    mpi_comm *m = M(c);
    if (r->done) return TS_OK;
    int flag = 0;
    MPI_Status st;
    int rc = MPI_Test(req_of(r), &flag, &st);
    if (rc != MPI_SUCCESS) return mpi_error(c, r->kind == TS_REQ_SEND ? "send" : "receive", rc);
    if (flag) {
        r->done = 1;
        if (r->kind == TS_REQ_RECV) {
            int got = 0;
            MPI_Get_count(&st, MPI_BYTE, &got);
            if ((size_t)got != r->bytes)
                return ts_coll_fail(c, "rank %d sent %d bytes where this rank expects %zu", r->peer,
                                    got, r->bytes);
        }
    }
    if ((++m->polls & 63) == 0) serve(m);
    return TS_OK;
}

/* ---- native collectives -------------------------------------------------------------- */

static ts_status poll(ts_comm *c, MPI_Request *req, const char *call) {
    mpi_comm *m = M(c);
    unsigned spins = 0;
    for (;;) {
        int flag = 0;
        int rc = MPI_Test(req, &flag, MPI_STATUS_IGNORE);
        if (rc != MPI_SUCCESS) return mpi_error(c, call, rc);
        if (flag) return TS_OK;
        if ((++m->polls & 63) == 0) serve(m);
        if (ts_spin(&spins)) {
            ts_status s = ts_wait_check(c, -1, NULL, NULL);
            if (s != TS_OK) return s;
        }
    }
}

static MPI_Datatype mpi_type(ts_dtype dt) {
    switch (dt) {
    case TS_F32: return MPI_FLOAT;
    case TS_F64: return MPI_DOUBLE;
    case TS_I32: return MPI_INT32_T;
    case TS_I64: return MPI_INT64_T;
    default: return MPI_DATATYPE_NULL;
    }
}

static MPI_Op mpi_op(ts_reduce_op op) {
    return op == TS_RED_MAX ? MPI_MAX : op == TS_RED_MIN ? MPI_MIN : MPI_SUM;
}

static int mpi_native_ok(const ts_comm *c, ts_coll_kind kind, ts_dtype dt, ts_reduce_op op) {
    (void)c;
    (void)op;
    if (kind == TS_COLL_ALLREDUCE || kind == TS_COLL_REDUCE_SCATTER)
        return mpi_type(dt) != MPI_DATATYPE_NULL;
    return 1;
}

static ts_status too_big(ts_comm *c, size_t count) {
    return ts_coll_fail(c, "%zu elements exceed MPI's int count; use the ring algorithm", count);
}

static ts_status mpi_allreduce(ts_comm *c, void *buf, size_t count, ts_dtype dt, ts_reduce_op op) {
    if (count > INT_MAX) return too_big(c, count);
    MPI_Request req;
    int rc =
        MPI_Iallreduce(MPI_IN_PLACE, buf, (int)count, mpi_type(dt), mpi_op(op), M(c)->comm, &req);
    if (rc != MPI_SUCCESS) return mpi_error(c, "MPI_Iallreduce", rc);
    return poll(c, &req, "MPI_Iallreduce");
}

static ts_status mpi_reduce_scatter(ts_comm *c, const void *send, void *recv, size_t count,
                                    ts_dtype dt, ts_reduce_op op) {
    mpi_comm *m = M(c);
    if (count > INT_MAX) return too_big(c, count);
    for (int q = 0; q < c->size; q++) {
        size_t len;
        ts_comm_block(count, c->size, q, NULL, &len);
        m->counts[q] = (int)len;
    }
    MPI_Request req;
    int rc = MPI_Ireduce_scatter(send, recv, m->counts, mpi_type(dt), mpi_op(op), m->comm, &req);
    if (rc != MPI_SUCCESS) return mpi_error(c, "MPI_Ireduce_scatter", rc);
    return poll(c, &req, "MPI_Ireduce_scatter");
}

static ts_status mpi_allgather(ts_comm *c, const void *send, void *recv, size_t count,
                               ts_dtype dt) {
    mpi_comm *m = M(c);
    size_t esz = ts_dtype_size(dt);
    if (count * esz > INT_MAX) return too_big(c, count);
    for (int q = 0; q < c->size; q++) {
        size_t off, len;
        ts_comm_block(count, c->size, q, &off, &len);
        m->counts[q] = (int)(len * esz);
        m->displs[q] = (int)(off * esz);
    }
    const char *mine = (const char *)recv + m->displs[c->rank];
    const void *sb = !send || send == mine ? MPI_IN_PLACE : send;
    MPI_Request req;
    int rc = MPI_Iallgatherv(sb, m->counts[c->rank], MPI_BYTE, recv, m->counts, m->displs, MPI_BYTE,
                             m->comm, &req);
    if (rc != MPI_SUCCESS) return mpi_error(c, "MPI_Iallgatherv", rc);
    return poll(c, &req, "MPI_Iallgatherv");
}

static ts_status mpi_broadcast(ts_comm *c, void *buf, size_t bytes, int root) {
    if (bytes > INT_MAX) return too_big(c, bytes);
    MPI_Request req;
    int rc = MPI_Ibcast(buf, (int)bytes, MPI_BYTE, root, M(c)->comm, &req);
    if (rc != MPI_SUCCESS) return mpi_error(c, "MPI_Ibcast", rc);
    return poll(c, &req, "MPI_Ibcast");
}

static ts_status mpi_barrier(ts_comm *c) {
    MPI_Request req;
    int rc = MPI_Ibarrier(M(c)->comm, &req);
    if (rc != MPI_SUCCESS) return mpi_error(c, "MPI_Ibarrier", rc);
    return poll(c, &req, "MPI_Ibarrier");
}

static void mpi_destroy(ts_comm *c) {
    mpi_comm *m = M(c);
    /* After a failure, peers may never match what is pending: freeing the
     * communicators or finalising could wait for them forever. */
    if (!c->broken) {
        if (m->diag != MPI_COMM_NULL) MPI_Comm_free(&m->diag);
        if (m->comm != MPI_COMM_NULL) MPI_Comm_free(&m->comm);
        if (m->we_init) MPI_Finalize();
    }
    free(m->counts);
    free(m->displs);
    free(m->answers);
    free(m->replies);
    free(m->qreq);
    free(m->areq);
    free(m);
}

static const ts_comm_ops mpi_ops = {
    .name = "mpi",
    .native_name = "mpi",
    .isend = mpi_isend,
    .irecv = mpi_irecv,
    .test = mpi_test,
    .enter = mpi_enter,
    .absent = mpi_absent,
    .allreduce = mpi_allreduce,
    .reduce_scatter = mpi_reduce_scatter,
    .allgather = mpi_allgather,
    .broadcast = mpi_broadcast,
    .barrier = mpi_barrier,
    .native_ok = mpi_native_ok,
    .destroy = mpi_destroy,
};

ts_status ts_mpi_create(ts_comm **out) {
    int inited = 0, finalized = 0, provided = MPI_THREAD_SINGLE;
    MPI_Initialized(&inited);
    MPI_Finalized(&finalized);
    if (finalized)
        return ts_fail(TS_ERR_UNSUPPORTED,
                       "mpi: MPI was already finalised in this process (MPI starts once; keep one "
                       "mpi comm for the whole run)");
    mpi_comm *m = ts_zalloc(sizeof *m, "mpi comm");
    if (!m) return TS_ERR_NOMEM;
    m->comm = m->diag = MPI_COMM_NULL;
    m->base.ops = &mpi_ops;
    if (!inited) {
        if (MPI_Init_thread(NULL, NULL, MPI_THREAD_SERIALIZED, &provided) != MPI_SUCCESS) {
            free(m);
            return ts_fail(TS_ERR_IO, "mpi: MPI_Init_thread failed");
        }
        m->we_init = 1;
    } else {
        MPI_Query_thread(&provided);
    }
    m->base.thread_ok = provided >= MPI_THREAD_SERIALIZED;
    ts_status s = TS_OK;
    if (MPI_Comm_dup(MPI_COMM_WORLD, &m->comm) != MPI_SUCCESS ||
        MPI_Comm_dup(MPI_COMM_WORLD, &m->diag) != MPI_SUCCESS)
        s = ts_fail(TS_ERR_IO, "mpi: MPI_Comm_dup failed");
    if (s == TS_OK) {
        MPI_Comm_set_errhandler(m->comm, MPI_ERRORS_RETURN);
        MPI_Comm_set_errhandler(m->diag, MPI_ERRORS_RETURN);
        MPI_Comm_rank(m->comm, &m->base.rank);
        MPI_Comm_size(m->comm, &m->base.size);
        size_t n = (size_t)m->base.size;
        m->counts = ts_zalloc(n * sizeof *m->counts, "mpi counts");
        m->displs = ts_zalloc(n * sizeof *m->displs, "mpi displacements");
        m->answers = ts_zalloc(n * sizeof *m->answers, "mpi diagnosis");
        m->replies = ts_zalloc(n * sizeof *m->replies, "mpi diagnosis");
        m->qreq = ts_zalloc(n * sizeof *m->qreq, "mpi diagnosis");
        m->areq = ts_zalloc(n * sizeof *m->areq, "mpi diagnosis");
        if (!m->counts || !m->displs || !m->answers || !m->replies || !m->qreq || !m->areq)
            s = TS_ERR_NOMEM;
    }
    if (s == TS_OK) s = ts_comm_init_common(&m->base, ts_dist_host_hash());
    if (s != TS_OK) {
        ts_error_prefix("mpi");
        ts_comm_close(&m->base);
        return s;
    }
    *out = &m->base;
    return TS_OK;
}

#else

ts_status ts_mpi_create(ts_comm **out) {
    (void)out;
    return ts_fail(TS_ERR_UNSUPPORTED,
                   "mpi: this tessel was built without MPI (install libopenmpi-dev, see "
                   "scripts/install-deps.sh, and rebuild)");
}

#endif
