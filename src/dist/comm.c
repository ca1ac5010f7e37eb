/* comm.c — what every transport shares: the public queries and settings,
 * point-to-point requests and their waits, failure messages, the host
 * table, and the one-rank "self" transport. */
#include <sched.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include "dist/comm.h"

static const char *algo_names[TS_ALGO_COUNT] = {"auto", "native", "ring", "rhd", "rd", "hier"};
static const char *kind_names[TS_COLL_KIND_COUNT] = {"all_reduce", "reduce_scatter", "all_gather",
                                                     "broadcast", "barrier"};
static const char *red_names[TS_RED_COUNT] = {"sum", "max", "min"};

const char *ts_coll_algo_name(ts_coll_algo a) {
    return (unsigned)a < TS_ALGO_COUNT ? algo_names[a] : "?";
}

int ts_coll_algo_parse(const char *name) {
    for (int i = 0; i < TS_ALGO_COUNT; i++)
        if (name && !strcmp(name, algo_names[i])) return i;
    return -1;
}

const char *ts_coll_kind_name(ts_coll_kind k) {
    return (unsigned)k < TS_COLL_KIND_COUNT ? kind_names[k] : "?";
}

const char *ts_reduce_op_name(ts_reduce_op op) {
    return (unsigned)op < TS_RED_COUNT ? red_names[op] : "?";
}

int ts_dist_started_by_mpi(void) {
    static const char *vars[] = {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_RANK", "SLURM_PROCID"};
    for (size_t i = 0; i < sizeof vars / sizeof vars[0]; i++)
        if (getenv(vars[i])) return 1;
    return 0;
}

double ts_dist_default_timeout(void) {
    const char *e = getenv("TESSEL_DIST_TIMEOUT");
    if (e && *e) {
        char *end;
        double v = strtod(e, &end);
        if (end != e && v > 0) return v;
        ts_logf(TS_LOG_WARN, "TESSEL_DIST_TIMEOUT='%s' is not a positive number; using 1800", e);
    }
    return 1800.0;
}

/* A rank's host is its machine name plus its network namespace. Ranks in
 * one namespace reach each other over loopback and share the machine;
 * ranks in different namespaces (containers, pods, the netns multi-host
 * test) talk over a network even when the kernel and the name are shared,
 * so the hierarchical algorithms treat them as different hosts. The name
 * keeps the initial namespaces of different machines (the same inode
 * number everywhere) apart. */
void ts_dist_host_id(char *buf, size_t n) {
    const char *e = getenv("TESSEL_HOST");
    if (!buf || n == 0) return;
    if (e && *e) {
        snprintf(buf, n, "%s", e);
        return;
    }
    char name[256], ns[64];
    if (gethostname(name, sizeof name - 1)) snprintf(name, sizeof name, "localhost");
    name[sizeof name - 1] = 0;
    ssize_t k = readlink("/proc/self/ns/net", ns, sizeof ns - 1);
    ns[k > 0 ? k : 0] = 0;
    snprintf(buf, n, "%s%s%s", name, k > 0 ? "/" : "", ns);
}

uint64_t ts_dist_host_hash(void) {
    char id[384];
    ts_dist_host_id(id, sizeof id);
    return ts_hash_str(id);
}

/* ---- waiting ------------------------------------------------------------- */

_Thread_local int ts_spin_may_sleep;

int ts_spin(unsigned *spins) {
    unsigned s = ++*spins;
    /* Spinning keeps latency in the microseconds when every rank has a
     * core; yielding lets oversubscribed ranks (4 ranks on 2 cores) reach
     * the point the spinner waits for. On the communication thread a long
     * wait sleeps: a waiter that only yields stays runnable and takes its
     * fair share of the CPU from the thread it shares a core with (waiting
     * for a slower peer, it would halve the backward pass it overlaps). */
    if (s < 2048) {
        ts_cpu_pause();
    } else if (s < 2048 + 1024 || !ts_spin_may_sleep) {
        sched_yield();
    } else {
        struct timespec ts = {0, 50 * 1000};
        nanosleep(&ts, NULL);
    }
    return (s & 255) == 0;
}

int ts_comm_wait_naps(int on) {
    const int was = ts_spin_may_sleep;
    ts_spin_may_sleep = on != 0;
    return was;
}

ts_status ts_wait_check(ts_comm *c, int peer, int (*recheck)(void *), void *arg) {
    if (c->deadline == 0) { /* the first check of this collective's waits */
        if (c->cur_start == 0) c->cur_start = ts_now();
        c->deadline = c->cur_start + c->timeout;
    }
    const char *gone = c->ops->peer_gone ? c->ops->peer_gone(c, peer) : NULL;
    if (gone) {
        char why[256];
        snprintf(why, sizeof why, "%s", gone);
        /* The peer may have delivered everything we wait for just before
         * it ended: look once more before calling it a failure. */
        if (recheck && recheck(arg)) return TS_OK;
        return ts_coll_fail(c, "%s", why);
    }
    if (ts_now() > c->deadline) {
        if (recheck && recheck(arg)) return TS_OK;
        return ts_coll_fail(c, "timed out after %.1f s", ts_now() - c->cur_start);
    }
    return TS_OK;
}

/* ---- the current collective and its failure -------------------------- */

void ts_coll_enter(ts_comm *c, ts_coll_kind kind, size_t bytes, ts_dtype dt, int has_red,
                   ts_reduce_op red) {
    c->seq++;
    c->cur_op = ts_coll_kind_name(kind);
    c->cur_kind = kind;
    c->cur_seq = c->seq;
    c->cur_bytes = bytes;
    c->cur_dt = dt;
    c->cur_has_red = has_red;
    c->cur_red = red;
    c->cur_algo = NULL;
    /* The clock is read only where it is needed: for a trace span here,
     * for the timeout at the first check of a wait (ts_wait_check). A
     * clock read costs 50-70 ns in a VM, a tenth of a 64 KiB collective. */
    c->cur_start = c->trace ? ts_now() : 0;
    c->deadline = 0;
    if (c->ops->enter) c->ops->enter(c, c->seq, kind, bytes);
}

void ts_coll_leave(ts_comm *c, ts_status s) {
    if (c->trace && c->cur_op) {
        ts_comm_span sp = {c->cur_kind,  c->cur_seq, c->cur_bytes, c->cur_algo ? c->cur_algo : "",
                           c->cur_start, ts_now(),   s == TS_OK};
        c->trace(&sp, c->trace_user);
    }
    c->cur_op = NULL;
}

void ts_comm_set_trace(ts_comm *c, ts_comm_trace_fn fn, void *user) {
    if (!c) return;
    c->trace = fn;
    c->trace_user = user;
}

ts_status ts_coll_fail(ts_comm *c, const char *why_fmt, ...) {
    char why[512], msg[1024];
    va_list ap;
    va_start(ap, why_fmt);
    vsnprintf(why, sizeof why, why_fmt, ap);
    va_end(ap);
    if (!c->cur_op) {
        snprintf(msg, sizeof msg, "point-to-point on rank %d of %d (%s): %s", c->rank, c->size,
                 c->ops->name, why);
    } else {
        ts_absent a = {0, c->absent_ranks, ""};
        if (c->ops->absent && a.ranks) c->ops->absent(c, c->cur_seq, &a);
        char who[400];
        size_t k = 0;
        who[0] = 0;
        if (a.n == 0) {
            ts_catf(who, sizeof who, &k,
                    "every rank arrived (do all ranks call the same collectives?)");
        } else {
            ts_catf(who, sizeof who, &k, "ranks that did not arrive:");
            for (int i = 0; i < a.n; i++)
                ts_catf(who, sizeof who, &k, "%s %d", i ? "," : "", a.ranks[i]);
            if (a.note[0]) ts_catf(who, sizeof who, &k, " (%s)", a.note);
        }
        char what[96] = "";
        if (c->cur_has_red)
            snprintf(what, sizeof what, ", %s %s", ts_dtype_name(c->cur_dt),
                     ts_reduce_op_name(c->cur_red));
        size_t m = 0;
        msg[0] = 0;
        ts_catf(msg, sizeof msg, &m, "%s #%llu (%zu bytes%s%s%s) on rank %d of %d (%s): %s; %s",
                c->cur_op, (unsigned long long)c->cur_seq, c->cur_bytes, what,
                c->cur_algo ? ", " : "", c->cur_algo ? c->cur_algo : "", c->rank, c->size,
                c->ops->name, why, who);
    }
    c->broken = 1;
    snprintf(c->broken_msg, sizeof c->broken_msg, "%s", msg);
    return ts_fail(TS_ERR_IO, "%s", msg);
}

/* ---- point to point --------------------------------------------------- */

ts_status ts_p2p_start(ts_comm *c, ts_req *r, int kind, int peer, int tag, void *buf,
                       size_t bytes) {
    memset(r, 0, sizeof *r);
    r->kind = kind;
    r->peer = peer;
    r->tag = tag;
    r->buf = buf;
    r->bytes = bytes;
    r->seq = c->cur_op ? c->cur_seq : 0;
    return kind == TS_REQ_SEND ? c->ops->isend(c, r) : c->ops->irecv(c, r);
}

typedef struct wait_ctx {
    ts_comm *c;
    ts_req *const *reqs;
    int n;
    ts_status err;
    ts_req *const *others; /* also moved on, not waited for (ts_comm_wait_progress) */
    int n_others;
} wait_ctx;

/* One pass of progress over the pending requests; 1 when all are done. */
static int wait_pass(void *arg) {
    wait_ctx *w = arg;
    int all = 1;
    for (int i = 0; i < w->n; i++) {
        ts_req *r = w->reqs[i];
        if (r->done) continue;
        ts_status s = w->c->ops->test(w->c, r);
        if (s != TS_OK) {
            w->err = s;
            return 1;
        }
        if (!r->done) all = 0;
    }
    for (int i = 0; i < w->n_others; i++) {
        ts_req *r = w->others[i];
        if (r->done) continue;
        ts_status s = w->c->ops->test(w->c, r);
        if (s != TS_OK) {
            w->err = s;
            return 1;
        }
    }
    return all;
}

static ts_status waitall(ts_comm *c, ts_req *const *reqs, int n, ts_req *const *others,
                         int n_others) {
    wait_ctx w = {c, reqs, n, TS_OK, others, n_others};
    unsigned spins = 0;
    while (!wait_pass(&w)) {
        if (ts_spin(&spins)) {
            int peer = -1;
            for (int i = 0; i < n && peer < 0; i++)
                if (!reqs[i]->done) peer = reqs[i]->peer;
            ts_status s = ts_wait_check(c, peer, wait_pass, &w);
            if (s != TS_OK) return s;
        }
    }
    return w.err;
}

ts_status ts_p2p_waitall(ts_comm *c, ts_req *const *reqs, int n) {
    return waitall(c, reqs, n, NULL, 0);
}

static ts_status check_usable(const ts_comm *c, const char *what) {
    if (!c) return ts_fail(TS_ERR_INVALID, "%s: comm is NULL", what);
    if (c->broken)
        return ts_fail(TS_ERR_IO, "%s: comm unusable after an earlier failure: %s", what,
                       c->broken_msg);
    return TS_OK;
}

static ts_status p2p_check(ts_comm *c, const char *what, int peer, int tag, const void *buf,
                           size_t bytes, ts_comm_req *req) {
    ts_status s = check_usable(c, what);
    if (s != TS_OK) return s;
    if (!req) return ts_fail(TS_ERR_INVALID, "%s: request is NULL", what);
    if (peer < 0 || peer >= c->size || peer == c->rank)
        return ts_fail(TS_ERR_INVALID, "%s: peer %d invalid on rank %d of %d", what, peer, c->rank,
                       c->size);
    if (tag < 0 || tag > TS_TAG_USER_MAX)
        return ts_fail(TS_ERR_INVALID, "%s: tag %d outside 0..%d", what, tag, TS_TAG_USER_MAX);
    if (!buf && bytes) return ts_fail(TS_ERR_INVALID, "%s: buffer is NULL", what);
    return TS_OK;
}

ts_status ts_comm_isend(ts_comm *c, int peer, int tag, const void *buf, size_t bytes,
                        ts_comm_req *req) {
    ts_status s = p2p_check(c, "ts_comm_isend", peer, tag, buf, bytes, req);
    if (s != TS_OK) return s;
    return ts_p2p_start(c, (ts_req *)req, TS_REQ_SEND, peer, tag, (void *)buf, bytes);
}

ts_status ts_comm_irecv(ts_comm *c, int peer, int tag, void *buf, size_t bytes, ts_comm_req *req) {
    ts_status s = p2p_check(c, "ts_comm_irecv", peer, tag, buf, bytes, req);
    if (s != TS_OK) return s;
    return ts_p2p_start(c, (ts_req *)req, TS_REQ_RECV, peer, tag, buf, bytes);
}

ts_status ts_comm_wait_progress(ts_comm *c, ts_comm_req *reqs, int n, ts_comm_req *const *others,
                                int n_others) {
    ts_status s = check_usable(c, "ts_comm_wait");
    if (s != TS_OK) return s;
    if (n < 0 || (n > 0 && !reqs) || n_others < 0 || (n_others > 0 && !others))
        return ts_fail(TS_ERR_INVALID, "ts_comm_wait: bad request list");
    ts_req *one[16], *one_o[16];
    ts_req **list = one, **olist = one_o;
    if (n > 16 && !(list = ts_alloc((size_t)n * sizeof *list, "ts_comm_wait"))) return TS_ERR_NOMEM;
    if (n_others > 16 &&
        !(olist = ts_alloc((size_t)n_others * sizeof *olist, "ts_comm_wait_progress"))) {
        if (list != one) free(list);
        return TS_ERR_NOMEM;
    }
    for (int i = 0; i < n; i++) list[i] = (ts_req *)&reqs[i];
    for (int i = 0; i < n_others; i++) olist[i] = (ts_req *)others[i];
    c->cur_op = NULL;
    c->cur_start = ts_now();
    c->deadline = c->cur_start + c->timeout;
    s = waitall(c, list, n, olist, n_others);
    if (list != one) free(list);
    if (olist != one_o) free(olist);
    return s;
}

ts_status ts_comm_wait(ts_comm *c, ts_comm_req *reqs, int n) {
    return ts_comm_wait_progress(c, reqs, n, NULL, 0);
}

/* ---- queries and settings --------------------------------------------- */

int ts_comm_rank(const ts_comm *c) {
    return c ? c->rank : 0;
}
int ts_comm_size(const ts_comm *c) {
    return c ? c->size : 1;
}
const char *ts_comm_transport(const ts_comm *c) {
    return c ? c->ops->name : "none";
}
int ts_comm_num_hosts(const ts_comm *c) {
    return c ? c->nhosts : 1;
}
int ts_comm_host(const ts_comm *c, int rank) {
    return c && c->host && rank >= 0 && rank < c->size ? c->host[rank] : 0;
}
uint64_t ts_comm_seq(const ts_comm *c) {
    return c ? c->seq : 0;
}
void ts_comm_set_timeout(ts_comm *c, double seconds) {
    if (c && seconds > 0) c->timeout = seconds;
}
double ts_comm_timeout(const ts_comm *c) {
    return c ? c->timeout : 0;
}

void ts_comm_block(size_t count, int size, int rank, size_t *offset, size_t *len) {
    size_t n = size > 0 ? (size_t)size : 1, r = rank > 0 ? (size_t)rank : 0;
    size_t base = count / n, rem = count % n;
    if (offset) *offset = r * base + (r < rem ? r : rem);
    if (len) *len = base + (r < rem ? 1 : 0);
}

void *ts_comm_scratch(ts_comm *c, size_t bytes) {
    if (bytes <= c->scratch_bytes) return c->scratch;
    size_t want = TS_ALIGN_UP(bytes, 4096);
    void *p = ts_aligned_alloc(want, "collective scratch");
    if (!p) return NULL;
    ts_aligned_free(c->scratch);
    c->scratch = p;
    c->scratch_bytes = want;
    return p;
}

void *ts_comm_alloc(ts_comm *c, size_t bytes) {
    if (!c) {
        ts_fail(TS_ERR_INVALID, "ts_comm_alloc: comm is NULL");
        return NULL;
    }
    if (c->ops->alloc) return c->ops->alloc(c, bytes);
    return ts_aligned_alloc(bytes ? bytes : 1, "ts_comm_alloc");
}

void ts_comm_free(ts_comm *c, void *p) {
    if (!p) return;
    if (c && c->ops->free && c->ops->free(c, p)) return;
    ts_aligned_free(p);
}

int ts_comm_is_shared(const ts_comm *c, const void *p, size_t bytes) {
    return c && c->ops->is_shared ? c->ops->is_shared(c, p, bytes) : 0;
}

int ts_comm_shares_memory(const ts_comm *c) {
    return c && c->ops->shares_memory;
}

/* A shared block: one cache line of header (how many ranks still use it)
 * in front of the caller's bytes, allocated by rank 0 from its memory. */
typedef struct shared_hdr {
    _Alignas(64) _Atomic int users;
} shared_hdr;

/* Rank 0: frees the pending blocks no rank uses any more. */
static void reclaim_shared(ts_comm *c) {
    int m = 0;
    for (int i = 0; i < c->n_shared_pending; i++) {
        shared_hdr *h = c->shared_pending[i];
        if (atomic_load_explicit(&h->users, memory_order_acquire) == 0)
            ts_comm_free(c, h);
        else
            c->shared_pending[m++] = h;
    }
    c->n_shared_pending = m;
}

ts_status ts_comm_alloc_shared(ts_comm *c, size_t bytes, void **out) {
    if (!out) return ts_fail(TS_ERR_INVALID, "ts_comm_alloc_shared: out is NULL");
    *out = NULL;
    if (!c) return ts_fail(TS_ERR_INVALID, "ts_comm_alloc_shared: comm is NULL");
    if (!ts_comm_shares_memory(c))
        return ts_fail(TS_ERR_UNSUPPORTED,
                       "ts_comm_alloc_shared: the %s transport's ranks share no memory",
                       c->ops->name);
    shared_hdr *h = NULL;
    uint64_t addr = 0;
    if (c->rank == 0) {
        reclaim_shared(c);
        h = ts_comm_alloc(c, sizeof *h + bytes);
        if (h) {
            atomic_init(&h->users, c->size);
            addr = (uint64_t)(uintptr_t)h;
        }
    }
    /* addr 0 tells the peers that rank 0 ran out */
    ts_status s = ts_broadcast(c, &addr, sizeof addr, 0);
    if (s == TS_OK && addr == 0)
        s = c->rank == 0
                ? TS_ERR_NOMEM /* ts_comm_alloc said why */
                : ts_fail(TS_ERR_NOMEM, "ts_comm_alloc_shared: rank 0 could not allocate %zu bytes",
                          bytes);
    if (s != TS_OK) {
        if (h) ts_comm_free(c, h);
        return s;
    }
    *out = (unsigned char *)(uintptr_t)addr + sizeof(shared_hdr);
    return TS_OK;
}

void ts_comm_release_shared(ts_comm *c, void *p) {
    if (!c || !p) return;
    shared_hdr *h = (shared_hdr *)((unsigned char *)p - sizeof(shared_hdr));
    int left = atomic_fetch_sub_explicit(&h->users, 1, memory_order_acq_rel) - 1;
    if (c->rank != 0) return;
    if (left == 0) {
        ts_comm_free(c, h);
    } else if (ts_grow((void **)&c->shared_pending, &c->cap_shared_pending, c->n_shared_pending + 1,
                       sizeof *c->shared_pending, "shared blocks") == TS_OK) {
        c->shared_pending[c->n_shared_pending++] = h;
    } /* else: kept until the comm closes */
    reclaim_shared(c);
}

/* ---- set-up and tear-down ----------------------------------------------- */

ts_status ts_comm_init_common(ts_comm *c, uint64_t host_hash) {
    if (c->timeout <= 0) c->timeout = ts_dist_default_timeout();
    c->host = ts_zalloc((size_t)c->size * sizeof *c->host, "comm host table");
    c->absent_ranks = ts_zalloc((size_t)c->size * sizeof *c->absent_ranks, "comm rank list");
    c->members = ts_zalloc(2 * (size_t)c->size * sizeof *c->members, "comm groups");
    uint64_t *hashes = ts_zalloc((size_t)c->size * sizeof *hashes, "comm host exchange");
    if (!c->host || !c->absent_ranks || !c->members || !hashes) {
        free(hashes);
        return TS_ERR_NOMEM;
    }
    ts_status s = ts_tune_parse_env(c);
    if (s != TS_OK) {
        free(hashes);
        return s;
    }
    /* Every rank learns every rank's host, for the hierarchical
     * algorithms: an all-gather of one hash per rank. */
    hashes[c->rank] = host_hash;
    if (c->size > 1)
        s = ts_coll_run_allgather(c, NULL, hashes, (size_t)c->size, TS_I64, TS_ALGO_RING);
    if (s == TS_OK) {
        c->nhosts = 0;
        for (int r = 0; r < c->size; r++) {
            int h = -1;
            for (int q = 0; q < r && h < 0; q++)
                if (hashes[q] == hashes[r]) h = c->host[q];
            c->host[r] = h >= 0 ? h : c->nhosts++;
        }
    } else {
        ts_error_prefix("exchanging host names");
    }
    free(hashes);
    return s;
}

void ts_comm_close(ts_comm *c) {
    if (!c || c->no_close) return;
    ts_async_stop(c);
    free(c->shared_pending); /* the transport's memory goes with it */
    c->shared_pending = NULL;
    ts_aligned_free(c->scratch);
    free(c->host);
    free(c->absent_ranks);
    free(c->members);
    c->members = NULL;
    c->scratch = NULL;
    c->host = NULL;
    c->absent_ranks = NULL;
    c->ops->destroy(c);
}

ts_status ts_comm_from_env(ts_comm **out) {
    if (!out) return ts_fail(TS_ERR_INVALID, "ts_comm_from_env: out is NULL");
    *out = NULL;
    return ts_dist_started_by_mpi() ? ts_mpi_create(out) : ts_self_create(out);
}

ts_status ts_comm_mpi(ts_comm **out) {
    if (!out) return ts_fail(TS_ERR_INVALID, "ts_comm_mpi: out is NULL");
    *out = NULL;
    return ts_mpi_create(out);
}

ts_status ts_comm_self(ts_comm **out) {
    if (!out) return ts_fail(TS_ERR_INVALID, "ts_comm_self: out is NULL");
    *out = NULL;
    return ts_self_create(out);
}

/* ---- the one-rank transport --------------------------------------------- */

static ts_status self_p2p(ts_comm *c, ts_req *r) {
    (void)r;
    return ts_fail(TS_ERR_INVALID, "self comm (1 rank %d) has no peers", c->rank);
}
static ts_status self_test(ts_comm *c, ts_req *r) {
    (void)c;
    r->done = 1;
    return TS_OK;
}
static void self_destroy(ts_comm *c) {
    free(c);
}

static const ts_comm_ops self_ops = {.name = "self",
                                     .isend = self_p2p,
                                     .irecv = self_p2p,
                                     .test = self_test,
                                     .destroy = self_destroy};

ts_status ts_self_create(ts_comm **out) {
    ts_comm *c = ts_zalloc(sizeof *c, "self comm");
    if (!c) return TS_ERR_NOMEM;
    c->ops = &self_ops;
    c->rank = 0;
    c->size = 1;
    ts_status s = ts_comm_init_common(c, ts_dist_host_hash());
    if (s != TS_OK) {
        ts_comm_close(c);
        return s;
    }
    *out = c;
    return TS_OK;
}
