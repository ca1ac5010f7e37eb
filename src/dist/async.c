/* async.c — non-blocking collectives: one communication thread per comm
 * runs started collectives in the order they were started.
 *
 * Order is what keeps ranks matched: every rank starts the same
 * collectives in the same order, and one thread runs them, so sequence
 * numbers line up exactly as with blocking calls. Tickets are consecutive
 * ids; a wait for id k returns once k and everything before it finished.
 * The first failure breaks the comm: it and every later ticket report it.
 */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "dist/comm.h"

typedef struct job {
    ts_coll_kind kind;
    void *buf;
    const void *send;
    void *recv;
    size_t count;
    ts_dtype dt;
    ts_reduce_op op;
    ts_coll_algo algo;
    int root;
} job;

struct ts_async {
    pthread_t thread;
    pthread_mutex_t mu;
    pthread_cond_t work, done;
    int stop;
    job *q; /* ring: job with id k sits at q[(k - 1) % cap] */
    uint64_t cap;
    uint64_t issued;   /* last id handed out */
    uint64_t finished; /* last id completed */
    uint64_t failed;   /* first failed id, 0 if none */
    ts_status fail_status;
    char fail_msg[1024];
};

static ts_status run_job(ts_comm *c, const job *j) {
    switch (j->kind) {
    case TS_COLL_ALLREDUCE:
        return ts_coll_run_allreduce(c, j->buf, j->count, j->dt, j->op, j->algo);
    case TS_COLL_REDUCE_SCATTER:
        return ts_coll_run_reduce_scatter(c, j->send, j->recv, j->count, j->dt, j->op, j->algo);
    case TS_COLL_ALLGATHER:
        return ts_coll_run_allgather(c, j->send, j->recv, j->count, j->dt, j->algo);
    case TS_COLL_BROADCAST: return ts_coll_run_broadcast(c, j->buf, j->count, j->root);
    case TS_COLL_BARRIER: return ts_coll_run_barrier(c);
    default: return c->tuned ? TS_OK : ts_tune_run(c); /* TS_COLL_KIND_COUNT: tuning */
    }
}

static void *comm_thread(void *arg) {
    ts_comm *c = arg;
    ts_async *a = c->async;
    ts_spin_may_sleep = 1;
    pthread_mutex_lock(&a->mu);
    for (;;) {
        while (!a->stop && a->finished == a->issued) pthread_cond_wait(&a->work, &a->mu);
        if (a->finished == a->issued) break; /* stop requested and nothing left */
        job j = a->q[a->finished % a->cap];
        int skip = a->failed != 0;
        pthread_mutex_unlock(&a->mu);
        ts_status s = skip ? TS_ERR_IO : run_job(c, &j);
        pthread_mutex_lock(&a->mu);
        a->finished++;
        if (s != TS_OK && !a->failed) {
            a->failed = a->finished;
            a->fail_status = s;
            snprintf(a->fail_msg, sizeof a->fail_msg, "%s", ts_last_error());
        }
        pthread_cond_broadcast(&a->done);
    }
    pthread_mutex_unlock(&a->mu);
    return NULL;
}

static ts_status ensure_thread(ts_comm *c) {
    if (c->async) return TS_OK;
    if (!c->thread_ok)
        return ts_fail(TS_ERR_UNSUPPORTED,
                       "non-blocking collectives on %s need MPI_THREAD_SERIALIZED, which this MPI "
                       "library did not grant",
                       c->ops->name);
    ts_async *a = ts_zalloc(sizeof *a, "communication thread");
    if (!a) return TS_ERR_NOMEM;
    a->cap = 64;
    a->q = ts_alloc(a->cap * sizeof *a->q, "collective queue");
    if (!a->q) {
        free(a);
        return TS_ERR_NOMEM;
    }
    pthread_mutex_init(&a->mu, NULL);
    pthread_cond_init(&a->work, NULL);
    pthread_cond_init(&a->done, NULL);
    c->async = a;
    if (pthread_create(&a->thread, NULL, comm_thread, c)) {
        c->async = NULL;
        pthread_cond_destroy(&a->work);
        pthread_cond_destroy(&a->done);
        pthread_mutex_destroy(&a->mu);
        free(a->q);
        free(a);
        return ts_fail(TS_ERR_INTERNAL, "cannot start the communication thread of rank %d",
                       c->rank);
    }
    return TS_OK;
}

/* Queue a job; the queue grows (rarely: only past 64 pending). */
static ts_status push(ts_comm *c, const job *j, uint64_t *id) {
    ts_status s = ensure_thread(c);
    if (s != TS_OK) return s;
    ts_async *a = c->async;
    pthread_mutex_lock(&a->mu);
    if (a->issued - a->finished == a->cap) {
        job *q = ts_alloc(2 * a->cap * sizeof *q, "collective queue");
        if (!q) {
            pthread_mutex_unlock(&a->mu);
            return TS_ERR_NOMEM;
        }
        for (uint64_t k = a->finished; k < a->issued; k++) q[k % (2 * a->cap)] = a->q[k % a->cap];
        free(a->q);
        a->q = q;
        a->cap *= 2;
    }
    a->q[a->issued % a->cap] = *j;
    *id = ++a->issued;
    pthread_cond_signal(&a->work);
    pthread_mutex_unlock(&a->mu);
    return TS_OK;
}

static ts_status wait_id(ts_comm *c, uint64_t id) {
    ts_async *a = c->async;
    if (!a) return ts_fail(TS_ERR_INVALID, "ts_coll_wait: no collective was started on this comm");
    pthread_mutex_lock(&a->mu);
    if (id == 0 || id > a->issued) {
        pthread_mutex_unlock(&a->mu);
        return ts_fail(TS_ERR_INVALID, "ts_coll_wait: unknown ticket %llu", (unsigned long long)id);
    }
    while (a->finished < id) pthread_cond_wait(&a->done, &a->mu);
    ts_status s = TS_OK;
    char msg[1024];
    if (a->failed && a->failed <= id) {
        s = a->fail_status;
        snprintf(msg, sizeof msg, "%s", a->fail_msg);
    }
    pthread_mutex_unlock(&a->mu);
    return s == TS_OK ? TS_OK : ts_fail(s, "%s", msg);
}

int ts_async_route(ts_comm *c, ts_coll_kind kind, void *buf, const void *send, void *recv,
                   size_t count, ts_dtype dt, ts_reduce_op op, ts_coll_algo algo, int root,
                   ts_status *s) {
    if (!c->async) return 0;
    job j = {kind, buf, send, recv, count, dt, op, algo, root};
    uint64_t id;
    *s = push(c, &j, &id);
    if (*s == TS_OK) *s = wait_id(c, id);
    return 1;
}

void ts_async_stop(ts_comm *c) {
    ts_async *a = c->async;
    if (!a) return;
    pthread_mutex_lock(&a->mu);
    a->stop = 1;
    pthread_cond_signal(&a->work);
    pthread_mutex_unlock(&a->mu);
    pthread_join(a->thread, NULL);
    pthread_cond_destroy(&a->work);
    pthread_cond_destroy(&a->done);
    pthread_mutex_destroy(&a->mu);
    free(a->q);
    free(a);
    c->async = NULL;
}

static ts_status start(ts_comm *c, const job *j, ts_coll_ticket *t) {
    if (!t) return ts_fail(TS_ERR_INVALID, "%s_start: ticket is NULL", ts_coll_kind_name(j->kind));
    t->id = 0;
    ts_status s = ts_coll_validate(c, j->kind, j->buf, j->send, j->recv, j->count, j->dt, j->op,
                                   j->algo, j->root);
    if (s != TS_OK) return s;
    return push(c, j, &t->id);
}

ts_status ts_allreduce_start(ts_comm *c, void *buf, size_t count, ts_dtype dt, ts_reduce_op op,
                             ts_coll_algo algo, ts_coll_ticket *t) {
    job j = {TS_COLL_ALLREDUCE, buf, NULL, NULL, count, dt, op, algo, 0};
    return start(c, &j, t);
}

ts_status ts_reduce_scatter_start(ts_comm *c, const void *send, void *recv, size_t count,
                                  ts_dtype dt, ts_reduce_op op, ts_coll_algo algo,
                                  ts_coll_ticket *t) {
    job j = {TS_COLL_REDUCE_SCATTER, NULL, send, recv, count, dt, op, algo, 0};
    return start(c, &j, t);
}

ts_status ts_allgather_start(ts_comm *c, const void *send, void *recv, size_t count, ts_dtype dt,
                             ts_coll_algo algo, ts_coll_ticket *t) {
    job j = {TS_COLL_ALLGATHER, NULL, send, recv, count, dt, TS_RED_SUM, algo, 0};
    return start(c, &j, t);
}

ts_status ts_coll_wait(ts_comm *c, ts_coll_ticket t) {
    if (!c) return ts_fail(TS_ERR_INVALID, "ts_coll_wait: comm is NULL");
    return wait_id(c, t.id);
}

int ts_coll_done(ts_comm *c, ts_coll_ticket t) {
    if (!c || !c->async) return 0;
    pthread_mutex_lock(&c->async->mu);
    int d = c->async->finished >= t.id;
    pthread_mutex_unlock(&c->async->mu);
    return d;
}
