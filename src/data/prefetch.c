/* A loader's background prefetch: one thread assembles the next batches
 * into a ring of `depth` buffers while the caller's step runs.
 *
 * Order is unchanged: the thread is the only one filling, and it fills
 * positions pos, pos + 1, ... in turn with the same ts_loader_fill the
 * synchronous path uses, so the batches handed out (and every weight
 * trained from them) are those of a loader without prefetch. The caller
 * waits only when the batch it asks for is not ready yet; that wait is
 * summed (ts_loader_wait_seconds), which is what tells whether a step ever
 * waited for its data. */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include "data/data_internal.h"

struct ts_prefetch {
    ts_loader *l;
    int depth;
    size_t xb, yb; /* one batch's bytes */
    uint8_t *buf;  /* depth slots of xb + yb bytes */
    pthread_t thread;
    pthread_mutex_t mu;
    pthread_cond_t changed;
    int64_t first;  /* position of the oldest filled slot (the next taken) */
    int filled;     /* slots filled and not yet taken */
    int stop;       /* set by the caller: the thread returns */
    ts_status err;  /* a fill that failed: handed to the caller in order */
    char msg[1024]; /* its message (the error text is per thread) */
};

static uint8_t *slot(ts_prefetch *p, int64_t pos) {
    return p->buf + (size_t)(pos % p->depth) * (p->xb + p->yb);
}

static void *run(void *arg) {
    ts_prefetch *p = arg;
    pthread_mutex_lock(&p->mu);
    for (;;) {
        while (!p->stop && p->err == TS_OK && p->filled == p->depth)
            pthread_cond_wait(&p->changed, &p->mu);
        if (p->stop || p->err != TS_OK) break;
        const int64_t pos = p->first + p->filled;
        uint8_t *s = slot(p, pos);
        pthread_mutex_unlock(&p->mu);
        /* The slot is the thread's until `filled` counts it. */
        const ts_status st = ts_loader_fill(p->l, pos, s, s + p->xb);
        pthread_mutex_lock(&p->mu);
        if (st != TS_OK) {
            p->err = st;
            snprintf(p->msg, sizeof p->msg, "%s", ts_last_error());
        } else {
            p->filled++;
        }
        pthread_cond_broadcast(&p->changed);
    }
    pthread_mutex_unlock(&p->mu);
    return NULL;
}

ts_status ts_prefetch_start(ts_loader *l, int depth, size_t xb, size_t yb, int64_t pos,
                            ts_prefetch **out) {
    *out = NULL;
    ts_prefetch *p = ts_zalloc(sizeof *p, "prefetch");
    if (!p) return TS_ERR_NOMEM;
    p->l = l, p->depth = depth, p->xb = xb, p->yb = yb, p->first = pos;
    if (!(p->buf = ts_alloc((size_t)depth * (xb + yb), "prefetch buffers"))) {
        free(p);
        return TS_ERR_NOMEM;
    }
    int rc = pthread_mutex_init(&p->mu, NULL);
    if (rc == 0 && (rc = pthread_cond_init(&p->changed, NULL)) != 0) pthread_mutex_destroy(&p->mu);
    if (rc == 0 && (rc = pthread_create(&p->thread, NULL, run, p)) != 0) {
        pthread_cond_destroy(&p->changed);
        pthread_mutex_destroy(&p->mu);
    }
    if (rc != 0) {
        free(p->buf);
        free(p);
        return ts_fail(TS_ERR_INTERNAL, "loader prefetch: cannot start its thread: %s",
                       strerror(rc));
    }
    *out = p;
    return TS_OK;
}

ts_status ts_prefetch_take(ts_prefetch *p, int64_t pos, void *x, void *y, double *waited) {
    const double t0 = ts_now();
    pthread_mutex_lock(&p->mu);
    while (p->filled == 0 && p->err == TS_OK) pthread_cond_wait(&p->changed, &p->mu);
    *waited += ts_now() - t0;
    ts_status st = TS_OK;
    if (p->filled == 0) {
        st = ts_fail(p->err, "%s", p->msg);
    } else if (p->first != pos) {
        st = ts_fail(TS_ERR_INTERNAL, "loader prefetch: batch %lld is ready, %lld was asked for",
                     (long long)p->first, (long long)pos);
    } else {
        const uint8_t *s = slot(p, pos);
        memcpy(x, s, p->xb);
        memcpy(y, s + p->xb, p->yb);
        p->first++, p->filled--;
        pthread_cond_broadcast(&p->changed);
    }
    pthread_mutex_unlock(&p->mu);
    return st;
}

void ts_prefetch_stop(ts_prefetch *p) {
    if (!p) return;
    pthread_mutex_lock(&p->mu);
    p->stop = 1;
    pthread_cond_broadcast(&p->changed);
    pthread_mutex_unlock(&p->mu);
    pthread_join(p->thread, NULL);
    pthread_cond_destroy(&p->changed);
    pthread_mutex_destroy(&p->mu);
    free(p->buf);
    free(p);
}
