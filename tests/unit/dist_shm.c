/* The shm transport through its launcher, 1 to 4 ranks: every collective
 * and algorithm on counts that do not divide by the rank count, buffers in
 * and outside the shared segment, bit-identical results across runs and
 * ranks, point-to-point messages, non-blocking collectives, the tuning
 * cache, the hierarchical path on pretend hosts, memory shared by all
 * ranks (ts_comm_alloc_shared), messages a receiver takes from the
 * sender's shared buffer while the sender computes, and the errors for a
 * killed peer, a stalled peer and mismatched calls.
 *
 * Workers are forked processes: they record their checks in a MAP_SHARED
 * block that the parent adds to its own counts. */
#include <signal.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>
#include "check.h"
#include "tessel/dist.h"

#define MAXR 4

typedef struct shared {
    _Atomic int checks, fails;
    uint64_t hash[2][TS_ALGO_COUNT][MAXR];
    char msg[MAXR][1024];
    char tune[MAXR][512];
    int hosts[MAXR];
    _Atomic int direct_got; /* work_p2p_direct: the receiver has both messages */
} shared;

static shared *SH;

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}
static int run_id;

#define WCHECK(c, rank, ...)                                                                       \
    do {                                                                                           \
        if (c) {                                                                                   \
            atomic_fetch_add(&SH->checks, 1);                                                      \
        } else {                                                                                   \
            atomic_fetch_add(&SH->fails, 1);                                                       \
            fprintf(stderr, "FAIL rank %d %s:%d: ", rank, __FILE__, __LINE__);                     \
            fprintf(stderr, __VA_ARGS__);                                                          \
            fprintf(stderr, "\n");                                                                 \
        }                                                                                          \
    } while (0)

#define WOK(expr, rank)                                                                            \
    do {                                                                                           \
        ts_status w_s_ = (expr);                                                                   \
        WCHECK(w_s_ == TS_OK, rank, "%s -> %s: %s", #expr, ts_status_name(w_s_), ts_last_error()); \
    } while (0)

static void collect(void) {
    check_passed += atomic_exchange(&SH->checks, 0);
    int f = atomic_exchange(&SH->fails, 0);
    check_failed += f;
}

/* Small integers: exact in f32, f64, bf16 and i32 whatever the order. */
static double val(int r, size_t i, int salt) {
    return (double)((int)((r * 131 + (int)(i % 100003) * 7 + salt) % 17) - 8);
}

static void put(void *b, ts_dtype dt, size_t i, double v) {
    switch (dt) {
    case TS_F32: ((float *)b)[i] = (float)v; break;
    case TS_F64: ((double *)b)[i] = v; break;
    case TS_I32: ((int32_t *)b)[i] = (int32_t)v; break;
    default: { /* bf16: the top half of the float */
        float f = (float)v;
        uint32_t u;
        memcpy(&u, &f, 4);
        ((uint16_t *)b)[i] = (uint16_t)(u >> 16);
    }
    }
}

static double get(const void *b, ts_dtype dt, size_t i) {
    switch (dt) {
    case TS_F32: return ((const float *)b)[i];
    case TS_F64: return ((const double *)b)[i];
    case TS_I32: return ((const int32_t *)b)[i];
    default: {
        uint32_t u = (uint32_t)((const uint16_t *)b)[i] << 16;
        float f;
        memcpy(&f, &u, 4);
        return f;
    }
    }
}

static double expect(int n, size_t i, int salt, ts_reduce_op op) {
    double acc = val(0, i, salt);
    for (int r = 1; r < n; r++) {
        double v = val(r, i, salt);
        acc = op == TS_RED_SUM   ? acc + v
              : op == TS_RED_MAX ? (v > acc ? v : acc)
                                 : (v < acc ? v : acc);
    }
    return acc;
}

/* ---- every collective --------------------------------------------------- */

static void *buffer(ts_comm *c, size_t bytes, int shared_mem) {
    return shared_mem ? ts_comm_alloc(c, bytes) : malloc(bytes ? bytes : 1);
}

static void release(ts_comm *c, void *p, int shared_mem) {
    if (shared_mem)
        ts_comm_free(c, p);
    else
        free(p);
}

static void check_allreduce(ts_comm *c, ts_coll_algo algo, ts_dtype dt, ts_reduce_op op,
                            size_t count, int shm, int salt) {
    int r = ts_comm_rank(c), n = ts_comm_size(c);
    size_t esz = ts_dtype_size(dt);
    char *b = buffer(c, count * esz, shm);
    if (!b) {
        WCHECK(0, r, "alloc %zu", count * esz);
        return;
    }
    for (size_t i = 0; i < count; i++) put(b, dt, i, val(r, i, salt));
    WOK(ts_allreduce(c, b, count, dt, op, algo), r);
    size_t bad = 0, first = 0;
    for (size_t i = 0; i < count; i++)
        if (get(b, dt, i) != expect(n, i, salt, op) && !bad++) first = i;
    WCHECK(!bad, r,
           "all_reduce %s %s %s n=%d count=%zu shm=%d: %zu wrong, first [%zu] = %g want %g",
           ts_coll_algo_name(algo), ts_dtype_name(dt), ts_reduce_op_name(op), n, count, shm, bad,
           first, get(b, dt, first), expect(n, first, salt, op));
    release(c, b, shm);
}

static void check_reduce_scatter(ts_comm *c, ts_coll_algo algo, size_t count, int shm, int salt) {
    int r = ts_comm_rank(c), n = ts_comm_size(c);
    size_t off, len;
    ts_comm_block(count, n, r, &off, &len);
    float *s = buffer(c, count * 4, shm), *d = malloc((len ? len : 1) * 4);
    if (!s || !d) {
        WCHECK(0, r, "alloc");
        release(c, s, shm);
        free(d);
        return;
    }
    for (size_t i = 0; i < count; i++) s[i] = (float)val(r, i, salt);
    WOK(ts_reduce_scatter(c, s, d, count, TS_F32, TS_RED_SUM, algo), r);
    size_t bad = 0;
    for (size_t i = 0; i < len; i++) bad += d[i] != expect(n, off + i, salt, TS_RED_SUM);
    WCHECK(!bad, r, "reduce_scatter %s n=%d count=%zu shm=%d: %zu wrong", ts_coll_algo_name(algo),
           n, count, shm, bad);
    release(c, s, shm);
    free(d);
}

static void check_allgather(ts_comm *c, ts_coll_algo algo, size_t count, int shm, int in_place,
                            int salt) {
    int r = ts_comm_rank(c), n = ts_comm_size(c);
    size_t off, len;
    ts_comm_block(count, n, r, &off, &len);
    double *d = buffer(c, count * 8, shm), *s = malloc((len ? len : 1) * 8);
    if (!s || !d) {
        WCHECK(0, r, "alloc");
        release(c, d, shm);
        free(s);
        return;
    }
    for (size_t i = 0; i < count; i++) d[i] = -99;
    for (size_t i = 0; i < len; i++) (in_place ? d + off : s)[i] = val(r, off + i, salt);
    WOK(ts_allgather(c, in_place ? NULL : s, d, count, TS_F64, algo), r);
    size_t bad = 0;
    for (int q = 0; q < n; q++) {
        size_t qo, ql;
        ts_comm_block(count, n, q, &qo, &ql);
        for (size_t i = qo; i < qo + ql; i++) bad += d[i] != val(q, i, salt);
    }
    WCHECK(!bad, r, "all_gather %s n=%d count=%zu shm=%d in_place=%d: %zu wrong",
           ts_coll_algo_name(algo), n, count, shm, in_place, bad);
    release(c, d, shm);
    free(s);
}

static void check_broadcast(ts_comm *c, size_t bytes, int shm, int root) {
    int r = ts_comm_rank(c);
    unsigned char *b = buffer(c, bytes, shm);
    if (!b) {
        WCHECK(0, r, "alloc");
        return;
    }
    for (size_t i = 0; i < bytes; i++) b[i] = (unsigned char)(r == root ? i * 13 + 1 : 0);
    WOK(ts_broadcast(c, b, bytes, root), r);
    size_t bad = 0;
    for (size_t i = 0; i < bytes; i++) bad += b[i] != (unsigned char)(i * 13 + 1);
    WCHECK(!bad, r, "broadcast %zu bytes from %d shm=%d: %zu wrong", bytes, root, shm, bad);
    release(c, b, shm);
}

static int work_all(ts_comm *c, void *user) {
    (void)user;
    int r = ts_comm_rank(c), n = ts_comm_size(c), salt = 0;
    static const size_t counts[] = {1, 3, 1000, 4097};
    static const ts_coll_algo ar[] = {TS_ALGO_NATIVE, TS_ALGO_RING, TS_ALGO_RHD, TS_ALGO_RD,
                                      TS_ALGO_HIER};
    static const ts_dtype dts[] = {TS_F64, TS_BF16, TS_I32};
    for (size_t a = 0; a < sizeof ar / sizeof ar[0]; a++)
        for (size_t k = 0; k < sizeof counts / sizeof counts[0]; k++) {
            int shm = (int)(k + a) % 2;
            for (int op = 0; op < TS_RED_COUNT; op++)
                check_allreduce(c, ar[a], TS_F32, (ts_reduce_op)op, counts[k], shm, salt++);
            for (size_t d = 0; d < sizeof dts / sizeof dts[0]; d++)
                check_allreduce(c, ar[a], dts[d], TS_RED_SUM, counts[k], !shm, salt++);
        }
    /* Larger than the 4 MiB staging area: private buffers go in pieces. */
    size_t big = (5u << 20) / 4 + 77;
    check_allreduce(c, TS_ALGO_NATIVE, TS_F32, TS_RED_SUM, big, 0, salt++);
    check_allreduce(c, TS_ALGO_NATIVE, TS_F32, TS_RED_SUM, big, 1, salt++);
    check_allreduce(c, TS_ALGO_RING, TS_F32, TS_RED_SUM, big, 1, salt++);
    check_allreduce(c, TS_ALGO_RHD, TS_F32, TS_RED_SUM, big, 0, salt++);
    static const ts_coll_algo rs[] = {TS_ALGO_NATIVE, TS_ALGO_RING};
    for (int a = 0; a < 2; a++) {
        for (size_t k = 0; k < sizeof counts / sizeof counts[0]; k++) {
            check_reduce_scatter(c, rs[a], counts[k], (int)k % 2, salt++);
            check_allgather(c, rs[a], counts[k], (int)k % 2, 0, salt++);
            check_allgather(c, rs[a], counts[k], (int)(k + 1) % 2, 1, salt++);
        }
        check_reduce_scatter(c, rs[a], big, a, salt++);
        check_allgather(c, rs[a], big / 2, 1 - a, a, salt++);
    }
    for (int tree = 0; tree < 2; tree++) {
        WOK(ts_comm_set_algo(c, TS_COLL_BROADCAST, tree ? TS_ALGO_RING : TS_ALGO_AUTO), r);
        WOK(ts_comm_set_algo(c, TS_COLL_BARRIER, tree ? TS_ALGO_RING : TS_ALGO_AUTO), r);
        check_broadcast(c, 5, tree, n - 1);
        check_broadcast(c, 100000, !tree, 0);
        check_broadcast(c, 5u << 20, 0, n / 2);
        WOK(ts_barrier(c), r);
    }
    /* Zero elements are legal everywhere. */
    WOK(ts_allreduce(c, NULL, 0, TS_F32, TS_RED_SUM, TS_ALGO_AUTO), r);
    WCHECK(ts_comm_seq(c) > 100, r, "sequence numbers advance: %llu",
           (unsigned long long)ts_comm_seq(c));
    return 0;
}

static void test_collectives(void) {
    for (int n = 1; n <= 4; n++) {
        int codes[MAXR];
        ts_status s = ts_shm_launch(n, NULL, work_all, NULL, codes);
        CHECK(s == TS_OK, "%d ranks: %s", n, ts_last_error());
        collect();
    }
}

/* ---- determinism -------------------------------------------------------- */

static uint64_t mix(uint64_t x) {
    x ^= x >> 31;
    x *= 0x7fb5d329728ea185ULL;
    x ^= x >> 27;
    x *= 0x81dadef4bc2dd44dULL;
    return x ^ (x >> 33);
}

/* Arbitrary floats of mixed magnitude: the sum depends on the order. */
static float rnd(int r, size_t i) {
    uint64_t h = mix(((uint64_t)r << 40) ^ i ^ 0x5eed);
    float m = (float)(h & 0xffffff) / 16777216.0f - 0.5f;
    return m * (float)(1u << ((h >> 24) % 20));
}

static uint64_t hash_bytes(const void *p, size_t n) {
    const unsigned char *b = p;
    uint64_t h = 1469598103934665603ULL;
    for (size_t i = 0; i < n; i++) h = (h ^ b[i]) * 1099511628211ULL;
    return h;
}

static int work_det(ts_comm *c, void *user) {
    (void)user;
    int r = ts_comm_rank(c), n = ts_comm_size(c);
    size_t count = 100003;
    float *b = ts_comm_alloc(c, count * 4), *ref = malloc(count * 4);
    if (!b || !ref) return 1;
    /* The direct algorithm is the left fold in rank order. */
    for (size_t i = 0; i < count; i++) {
        float acc = rnd(0, i);
        for (int q = 1; q < n; q++) acc += rnd(q, i);
        ref[i] = acc;
    }
    for (int a = TS_ALGO_NATIVE; a < TS_ALGO_COUNT; a++) {
        for (size_t i = 0; i < count; i++) b[i] = rnd(r, i);
        WOK(ts_allreduce(c, b, count, TS_F32, TS_RED_SUM, (ts_coll_algo)a), r);
        SH->hash[run_id][a][r] = hash_bytes(b, count * 4);
        if (a == TS_ALGO_NATIVE)
            WCHECK(!memcmp(b, ref, count * 4), r, "direct all-reduce is the rank-order fold");
    }
    /* Small all-reduces take the one-barrier path: the same fold. */
    float small[37];
    for (int i = 0; i < 37; i++) small[i] = rnd(r, (size_t)i);
    WOK(ts_allreduce(c, small, 37, TS_F32, TS_RED_SUM, TS_ALGO_NATIVE), r);
    WCHECK(!memcmp(small, ref, sizeof small), r, "small direct all-reduce is the rank-order fold");
    ts_comm_free(c, b);
    free(ref);
    return 0;
}

static void test_determinism(void) {
    int n = 3;
    for (run_id = 0; run_id < 2; run_id++) {
        CHECK(ts_shm_launch(n, NULL, work_det, NULL, NULL) == TS_OK, "%s", ts_last_error());
        collect();
    }
    for (int a = TS_ALGO_NATIVE; a < TS_ALGO_COUNT; a++) {
        int same_ranks = 1, same_runs = 1;
        for (int r = 0; r < n; r++) {
            same_ranks &= SH->hash[0][a][r] == SH->hash[0][a][0];
            same_runs &= SH->hash[1][a][r] == SH->hash[0][a][r];
        }
        CHECK(same_ranks, "%s: every rank has the same bits", ts_coll_algo_name((ts_coll_algo)a));
        CHECK(same_runs, "%s: two runs give the same bits", ts_coll_algo_name((ts_coll_algo)a));
    }
}

/* ---- point to point and non-blocking collectives ---------------------------- */

typedef struct spans {
    _Atomic int n, bad;
    uint64_t last_seq;
} spans;

static void on_span(const ts_comm_span *sp, void *user) {
    spans *t = user;
    if (sp->end < sp->start || !sp->ok || sp->seq <= t->last_seq || !sp->algo[0]) t->bad++;
    t->last_seq = sp->seq;
    t->n++;
}

static int work_p2p(ts_comm *c, void *user) {
    (void)user;
    int r = ts_comm_rank(c), n = ts_comm_size(c);
    spans tr = {0};
    ts_comm_set_trace(c, on_span, &tr);
    static const size_t sizes[] = {0, 100, 3u << 20};
    for (size_t k = 0; k < 3; k++) {
        size_t m = sizes[k];
        unsigned char *out = malloc(m + 1), *in = malloc(m + 1);
        for (size_t i = 0; i < m; i++) out[i] = (unsigned char)(r * 31 + i);
        ts_comm_req req[2];
        int right = (r + 1) % n, left = (r + n - 1) % n;
        WOK(ts_comm_isend(c, right, 7, out, m, &req[0]), r);
        WOK(ts_comm_irecv(c, left, 7, in, m, &req[1]), r);
        WOK(ts_comm_wait(c, req, 2), r);
        size_t bad = 0;
        for (size_t i = 0; i < m; i++) bad += in[i] != (unsigned char)(left * 31 + i);
        WCHECK(!bad, r, "p2p %zu bytes from %d: %zu wrong", m, left, bad);
        free(out);
        free(in);
    }
    ts_comm_req q;
    WCHECK(ts_comm_isend(c, r, 1, &q, 1, &q) == TS_ERR_INVALID, r, "send to self rejected");
    WCHECK(ts_comm_isend(c, (r + 1) % n, 40000, &q, 1, &q) == TS_ERR_INVALID, r, "tag range");

    /* Three all-reduces in flight, then a blocking one queued behind them. */
    float *g[3];
    ts_coll_ticket t[3];
    for (int k = 0; k < 3; k++) {
        g[k] = ts_comm_alloc(c, 5000 * 4);
        for (int i = 0; i < 5000; i++) g[k][i] = (float)val(r, (size_t)i, k);
        WOK(ts_allreduce_start(c, g[k], 5000, TS_F32, TS_RED_SUM, TS_ALGO_AUTO, &t[k]), r);
    }
    float h = (float)r;
    WOK(ts_allreduce(c, &h, 1, TS_F32, TS_RED_MAX, TS_ALGO_RING), r);
    WCHECK(h == (float)(n - 1), r, "blocking after non-blocking: %g", h);
    for (int k = 2; k >= 0; k--) {
        WOK(ts_coll_wait(c, t[k]), r);
        WCHECK(ts_coll_done(c, t[k]), r, "done after wait");
        size_t bad = 0;
        for (int i = 0; i < 5000; i++) bad += g[k][i] != expect(n, (size_t)i, k, TS_RED_SUM);
        WCHECK(!bad, r, "non-blocking all-reduce %d: %zu wrong", k, bad);
        ts_comm_free(c, g[k]);
    }
    ts_coll_ticket bogus = {999};
    WCHECK(ts_coll_wait(c, bogus) == TS_ERR_INVALID, r, "unknown ticket");
    /* 4 all-reduces and the broadcast of the first AUTO call's tuning. */
    WCHECK(tr.n == 5 && !tr.bad, r, "trace: %d spans (5 expected), %d bad", (int)tr.n, (int)tr.bad);
    ts_comm_set_trace(c, NULL, NULL);
    return 0;
}

/* A message longer than the mailbox from ts_comm_alloc memory arrives
 * while its sender does not call into the comm (it computes, in a
 * pipeline), and one queued behind it from ordinary memory too; the sends
 * finish once the receiver has them. Through the mailbox alone the
 * receiver would get 512 KiB of the first and wait for the sender. */
static int work_p2p_direct(ts_comm *c, void *user) {
    (void)user;
    const int r = ts_comm_rank(c);
    const size_t big = 3u << 20, small = 100000;
    unsigned char *a = r == 0 ? ts_comm_alloc(c, big) : malloc(big), *b = malloc(small);
    if (!a || !b) return 1;
    ts_comm_req q[2];
    if (r == 0) {
        for (size_t i = 0; i < big; i++) a[i] = (unsigned char)(i * 7 + 1);
        for (size_t i = 0; i < small; i++) b[i] = (unsigned char)(i * 5 + 3);
        WCHECK(ts_comm_is_shared(c, a, big), r, "the send buffer lies in the segment");
        WOK(ts_comm_isend(c, 1, 5, a, big, &q[0]), r);
        WOK(ts_comm_isend(c, 1, 6, b, small, &q[1]), r);
        const double t0 = now();
        while (!atomic_load(&SH->direct_got) && now() - t0 < 20) {
            struct timespec ts = {0, 1000000};
            nanosleep(&ts, NULL); /* not calling into the comm */
        }
        WCHECK(atomic_load(&SH->direct_got), r,
               "the receiver got the messages while the sender stayed out of the comm (%.1f s)",
               now() - t0);
        WOK(ts_comm_wait(c, q, 2), r);
        ts_comm_free(c, a);
    } else {
        WOK(ts_comm_irecv(c, 0, 5, a, big, &q[0]), r);
        WOK(ts_comm_irecv(c, 0, 6, b, small, &q[1]), r);
        WOK(ts_comm_wait(c, q, 2), r);
        size_t bad = 0;
        for (size_t i = 0; i < big; i++) bad += a[i] != (unsigned char)(i * 7 + 1);
        for (size_t i = 0; i < small; i++) bad += b[i] != (unsigned char)(i * 5 + 3);
        WCHECK(!bad, r, "%zu bytes received wrong", bad);
        atomic_store(&SH->direct_got, 1);
        free(a);
    }
    free(b);
    return 0;
}

static void test_p2p_async(void) {
    for (int n = 2; n <= 3; n++) {
        CHECK(ts_shm_launch(n, NULL, work_p2p, NULL, NULL) == TS_OK, "%s", ts_last_error());
        collect();
    }
    atomic_store(&SH->direct_got, 0);
    CHECK(ts_shm_launch(2, NULL, work_p2p_direct, NULL, NULL) == TS_OK, "%s", ts_last_error());
    collect();
}

/* Non-blocking reduce-scatter then all-gather (the ZeRO pattern), every
 * count started before any is waited on; waiting for the last one waits
 * for all. */
static int work_nb_shard(ts_comm *c, void *user) {
    (void)user;
    int r = ts_comm_rank(c), n = ts_comm_size(c);
    static const size_t counts[] = {1, 3, 1001, 4097};
    enum { NC = 4 };
    for (int nat = 0; nat < 2; nat++) {
        ts_coll_algo a = nat ? TS_ALGO_NATIVE : TS_ALGO_RING;
        float *src[NC], *part[NC], *full[NC];
        ts_coll_ticket t[NC];
        for (int k = 0; k < NC; k++) {
            size_t len;
            ts_comm_block(counts[k], n, r, NULL, &len);
            src[k] = ts_comm_alloc(c, counts[k] * 4);
            part[k] = ts_comm_alloc(c, (len ? len : 1) * 4);
            full[k] = malloc(counts[k] * 4); /* private: staged by the transport */
            for (size_t i = 0; i < counts[k]; i++) src[k][i] = (float)val(r, i, 50 + k);
            WOK(ts_reduce_scatter_start(c, src[k], part[k], counts[k], TS_F32, TS_RED_SUM, a,
                                        &t[k]),
                r);
        }
        WOK(ts_coll_wait(c, t[NC - 1]), r);
        for (int k = 0; k < NC; k++) {
            WCHECK(ts_coll_done(c, t[k]), r, "reduce_scatter %d done with the last", k);
            size_t off, len, bad = 0;
            ts_comm_block(counts[k], n, r, &off, &len);
            for (size_t i = 0; i < len; i++)
                bad += part[k][i] != expect(n, off + i, 50 + k, TS_RED_SUM);
            WCHECK(!bad, r, "non-blocking reduce_scatter %s n=%d count=%zu: %zu wrong",
                   ts_coll_algo_name(a), n, counts[k], bad);
            WOK(ts_allgather_start(c, part[k], full[k], counts[k], TS_F32, a, &t[k]), r);
        }
        for (int k = 0; k < NC; k++) {
            WOK(ts_coll_wait(c, t[k]), r);
            size_t bad = 0;
            for (size_t i = 0; i < counts[k]; i++)
                bad += full[k][i] != expect(n, i, 50 + k, TS_RED_SUM);
            WCHECK(!bad, r, "non-blocking all_gather %s n=%d count=%zu: %zu wrong",
                   ts_coll_algo_name(a), n, counts[k], bad);
            ts_comm_free(c, src[k]);
            ts_comm_free(c, part[k]);
            free(full[k]);
        }
    }
    return 0;
}

static void test_nb_shard(void) {
    for (int n = 1; n <= 4; n++) {
        CHECK(ts_shm_launch(n, NULL, work_nb_shard, NULL, NULL) == TS_OK, "%d ranks: %s", n,
              ts_last_error());
        collect();
    }
}

/* ---- tuning, hosts, heap ---------------------------------------------------- */

static int work_tune(ts_comm *c, void *user) {
    (void)user;
    int r = ts_comm_rank(c);
    float x[10];
    for (int i = 0; i < 10; i++) x[i] = 1;
    WOK(ts_allreduce(c, x, 10, TS_F32, TS_RED_SUM, TS_ALGO_AUTO), r);
    WCHECK(x[3] == (float)ts_comm_size(c), r, "auto all-reduce");
    snprintf(SH->tune[r], sizeof SH->tune[r], "%s", ts_comm_tune_source(c));
    ts_coll_algo a = ts_comm_algo_for(c, TS_COLL_ALLREDUCE, 1 << 20, TS_F32);
    WCHECK(a > TS_ALGO_AUTO && a < TS_ALGO_COUNT, r, "algo_for: %d", (int)a);
    WCHECK(ts_comm_algo_for(c, TS_COLL_ALLREDUCE, 64, TS_BF16) != TS_ALGO_AUTO, r, "bf16 algo");
    return 0;
}

static void test_tune_cache(void) {
    char dir[] = "/tmp/tessel-dist-XXXXXX";
    CHECK(mkdtemp(dir) != NULL, "mkdtemp");
    setenv("XDG_CACHE_HOME", dir, 1);
    for (int k = 0; k < 2; k++) {
        CHECK(ts_shm_launch(2, NULL, work_tune, NULL, NULL) == TS_OK, "%s", ts_last_error());
        collect();
        const char *want = k == 0 ? "probe (saved to " : "cache ";
        CHECK(!strncmp(SH->tune[0], want, strlen(want)), "run %d: tuning from '%s'", k,
              SH->tune[0]);
    }
    char path[256];
    snprintf(path, sizeof path, "%s/tessel/coll-shm-2r-1h.txt", dir);
    struct stat st;
    CHECK(stat(path, &st) == 0 && st.st_size > 0, "cache file %s", path);
    unlink(path);
    snprintf(path, sizeof path, "%s/tessel", dir);
    rmdir(path);
    rmdir(dir);
    unsetenv("XDG_CACHE_HOME");
}

static int work_hosts(ts_comm *c, void *user) {
    (void)user;
    int r = ts_comm_rank(c);
    SH->hosts[r] = ts_comm_num_hosts(c) * 10 + ts_comm_host(c, r);
    check_allreduce(c, TS_ALGO_HIER, TS_F32, TS_RED_SUM, 4097, 1, 1);
    check_allreduce(c, TS_ALGO_HIER, TS_F64, TS_RED_MAX, 100000, 0, 2);
    /* The heap: blocks come back and coalesce; foreign memory is not shared. */
    void *a = ts_comm_alloc(c, 3 << 20), *b = ts_comm_alloc(c, 100);
    WCHECK(a && b && ts_comm_is_shared(c, a, 3 << 20) && ts_comm_is_shared(c, b, 100), r,
           "heap blocks are shared");
    int local;
    WCHECK(!ts_comm_is_shared(c, &local, sizeof local), r, "stack is not shared");
    ts_comm_free(c, a);
    void *a2 = ts_comm_alloc(c, 2 << 20);
    WCHECK(a2 == a, r, "freed block reused");
    ts_comm_free(c, a2);
    ts_comm_free(c, b);
    WCHECK(ts_comm_alloc(c, (size_t)1 << 40) == NULL, r, "heap exhaustion reported");
    return 0;
}

static void test_hosts_heap(void) {
    int ids[4] = {5, 5, 9, 9};
    ts_shm_options o = {0};
    o.host_ids = ids;
    o.heap_bytes = 64u << 20;
    CHECK(ts_shm_launch(4, &o, work_hosts, NULL, NULL) == TS_OK, "%s", ts_last_error());
    collect();
    CHECK(SH->hosts[0] == 20 && SH->hosts[1] == 20 && SH->hosts[2] == 21 && SH->hosts[3] == 21,
          "host table %d %d %d %d", SH->hosts[0], SH->hosts[1], SH->hosts[2], SH->hosts[3]);
}

/* ts_comm_alloc_shared: one pointer on every rank, memory every rank
 * reads and writes, back to rank 0's heap once the last rank released it
 * (whichever rank that is), NOMEM on every rank when rank 0 runs out. */
static int work_shared_mem(ts_comm *c, void *user) {
    (void)user;
    const int r = ts_comm_rank(c), n = ts_comm_size(c);
    enum { INTS = 100003 };
    WCHECK(ts_comm_shares_memory(c), r, "shm shares memory");
    void *a = NULL, *b = NULL, *d = NULL, *big = (void *)1;
    WOK(ts_comm_alloc_shared(c, sizeof(int) * INTS, &a), r);
    if (!a) return 1;
    int64_t ptrs[MAXR];
    ptrs[r] = (int64_t)(intptr_t)a;
    WOK(ts_allgather(c, NULL, ptrs, (size_t)n, TS_I64, TS_ALGO_NATIVE), r);
    for (int q = 0; q < n; q++) WCHECK(ptrs[q] == ptrs[0], r, "rank %d's pointer differs", q);
    WCHECK(ts_comm_is_shared(c, a, sizeof(int) * INTS), r, "in the segment");
    int *x = a;
    size_t off, len;
    ts_comm_block(INTS, n, r, &off, &len);
    for (size_t i = off; i < off + len; i++) x[i] = r * 1000003 + (int)i;
    WOK(ts_barrier(c), r);
    int bad = 0;
    for (int q = 0; q < n; q++) {
        ts_comm_block(INTS, n, q, &off, &len);
        for (size_t i = off; i < off + len; i++) bad += x[i] != q * 1000003 + (int)i;
    }
    WCHECK(bad == 0, r, "%d elements written by peers read wrong", bad);
    WOK(ts_barrier(c), r);
    /* rank 0 releases first: the block waits for the others */
    if (r == 0) ts_comm_release_shared(c, a);
    WOK(ts_barrier(c), r);
    if (r != 0) ts_comm_release_shared(c, a);
    WOK(ts_barrier(c), r);
    WOK(ts_comm_alloc_shared(c, sizeof(int) * INTS, &b), r);
    WCHECK(b == a, r, "released block reused (%p, was %p)", b, a);
    /* rank 0 releases last: freed at once */
    if (r != 0) ts_comm_release_shared(c, b);
    WOK(ts_barrier(c), r);
    if (r == 0) ts_comm_release_shared(c, b);
    WOK(ts_comm_alloc_shared(c, sizeof(int) * INTS, &d), r);
    WCHECK(d == a, r, "released block reused again");
    ts_comm_release_shared(c, d);
    ts_status s = ts_comm_alloc_shared(c, (size_t)1 << 40, &big);
    WCHECK(s == TS_ERR_NOMEM && big == NULL && strstr(ts_last_error(), r ? "rank 0" : "heap"), r,
           "exhaustion: %s: %s", ts_status_name(s), ts_last_error());
    return 0;
}

static void test_shared_mem(void) {
    for (int n = 1; n <= MAXR; n++) {
        ts_shm_options o = {0};
        o.heap_bytes = 16u << 20;
        CHECK(ts_shm_launch(n, &o, work_shared_mem, NULL, NULL) == TS_OK, "%d ranks: %s", n,
              ts_last_error());
        collect();
    }
    /* one process without a segment: nothing to share */
    ts_comm *self = NULL;
    CHECK(ts_comm_self(&self) == TS_OK, "%s", ts_last_error());
    void *p = (void *)1;
    CHECK(!ts_comm_shares_memory(self), "self shares no memory");
    CHECK(ts_comm_alloc_shared(self, 64, &p) == TS_ERR_UNSUPPORTED && p == NULL &&
              strstr(ts_last_error(), "self"),
          "self: %s", ts_last_error());
    ts_comm_close(self);
}

/* ---- failures ------------------------------------------------------------------ */

static int work_killed(ts_comm *c, void *user) {
    (void)user;
    int r = ts_comm_rank(c);
    float x[1000] = {0};
    if (ts_allreduce(c, x, 1000, TS_F32, TS_RED_SUM, TS_ALGO_NATIVE) != TS_OK) return 3;
    if (r == 2) raise(SIGKILL);
    ts_status s = ts_allreduce(c, x, 1000, TS_F32, TS_RED_SUM, TS_ALGO_NATIVE);
    snprintf(SH->msg[r], sizeof SH->msg[r], "%s", s == TS_OK ? "ok" : ts_last_error());
    /* The comm stays broken. */
    if (s != TS_OK && ts_barrier(c) == TS_OK) return 4;
    return s == TS_OK ? 0 : 1;
}

static int work_stalled(ts_comm *c, void *user) {
    (void)user;
    int r = ts_comm_rank(c);
    double x[300] = {0};
    if (ts_allreduce(c, x, 300, TS_F64, TS_RED_SUM, TS_ALGO_RING) != TS_OK) return 3;
    if (r == 1) {
        /* Miss the next collective until both others have given up on it
         * (at most 10 s): exiting earlier would turn the timeout into a
         * "peer exited" report, whatever the machine's speed. */
        for (int i = 0; i < 1000 && !(SH->msg[0][0] && SH->msg[2][0]); i++) usleep(10 * 1000);
        return 0;
    }
    ts_status s = ts_allreduce(c, x, 300, TS_F64, TS_RED_SUM, TS_ALGO_RING);
    snprintf(SH->msg[r], sizeof SH->msg[r], "%s", s == TS_OK ? "ok" : ts_last_error());
    return s == TS_OK ? 0 : 1;
}

static int work_mismatch(ts_comm *c, void *user) {
    (void)user;
    int r = ts_comm_rank(c);
    float x[64] = {0};
    ts_status s = r == 0 ? ts_allreduce(c, x, 64, TS_F32, TS_RED_SUM, TS_ALGO_RING)
                         : ts_allgather(c, NULL, x, 64, TS_F32, TS_ALGO_RING);
    snprintf(SH->msg[r], sizeof SH->msg[r], "%s", s == TS_OK ? "ok" : ts_last_error());
    return s == TS_OK ? 0 : 1;
}

static void test_failures(void) {
    ts_shm_options o = {0};
    o.grace_s = 3;
    /* A dead peer must be noticed long before the timeout: a generous
     * timeout keeps the check meaningful on a loaded machine. */
    o.timeout_s = 5;
    int codes[MAXR];
    memset(SH->msg, 0, sizeof SH->msg);
    double t0 = now();
    ts_status s = ts_shm_launch(3, &o, work_killed, NULL, codes);
    double took = now() - t0;
    CHECK(s == TS_ERR_IO, "killed peer: launcher fails (%s)", ts_status_name(s));
    CHECK(strstr(ts_last_error(), "rank 2 killed by signal 9") != NULL, "summary: %s",
          ts_last_error());
    CHECK(codes[2] == 128 + SIGKILL && codes[0] == 1 && codes[1] == 1, "codes %d %d %d", codes[0],
          codes[1], codes[2]);
    CHECK(took < 4.5, "a dead peer is noticed before the timeout (%.2f s)", took);
    for (int r = 0; r < 2; r++) {
        /* The other survivor may or may not have entered the collective
         * when the death is seen: both lists are right, rank 2 is in each. */
        const char *m = SH->msg[r], *who = strstr(m, "ranks that did not arrive:");
        CHECK(strstr(m, "all_reduce #") && strstr(m, "4000 bytes") && who &&
                  (!strncmp(who + 26, " 2", 2) || !strncmp(who + 26, " 0, 2", 5) ||
                   !strncmp(who + 26, " 1, 2", 5)) &&
                  strstr(m, "killed by signal 9"),
              "rank %d: %s", r, m);
    }
    o.timeout_s = 0.5;
    /* rank 1 waits until ranks 0 and 2 have both given up; a starved rank 2
     * (ASan on a loaded machine) may take seconds to time out, and must not
     * be killed by the launcher meanwhile */
    o.grace_s = 20;
    printf("killed peer, rank 0 says: %s\n", SH->msg[0]);

    memset(SH->msg, 0, sizeof SH->msg);
    s = ts_shm_launch(3, &o, work_stalled, NULL, codes);
    CHECK(s == TS_ERR_IO && codes[1] == 0 && codes[0] == 1 && codes[2] == 1,
          "stalled peer: %s, codes %d %d %d", ts_status_name(s), codes[0], codes[1], codes[2]);
    for (int r = 0; r < 3; r += 2) {
        const char *m = SH->msg[r];
        /* Rank 0 and 2 time out together; one may see the other give up
         * first, but both name rank 1 as the one that did not arrive. */
        CHECK(strstr(m, "all_reduce #") && strstr(m, "2400 bytes") &&
                  (strstr(m, "timed out after") || strstr(m, "exited with status 1")) &&
                  strstr(m, "ranks that did not arrive: 1 (rank 1 last entered #"),
              "rank %d: %s", r, m);
    }
    printf("stalled peer, rank 0 says: %s\n", SH->msg[0]);

    memset(SH->msg, 0, sizeof SH->msg);
    s = ts_shm_launch(2, &o, work_mismatch, NULL, codes);
    CHECK(s == TS_ERR_IO, "mismatched collectives fail");
    CHECK(strstr(SH->msg[0], "all_gather") || strstr(SH->msg[1], "all_reduce"),
          "mismatch named: %s | %s", SH->msg[0], SH->msg[1]);
    printf("mismatch, rank 0 says: %s\n", SH->msg[0]);
}

static int work_bad_args(ts_comm *c, void *user) {
    (void)user;
    int r = ts_comm_rank(c);
    unsigned char u[8] = {0};
    WCHECK(ts_allreduce(c, u, 8, TS_U8, TS_RED_SUM, TS_ALGO_AUTO) == TS_ERR_UNSUPPORTED, r, "u8");
    WCHECK(ts_allreduce(c, NULL, 8, TS_F32, TS_RED_SUM, TS_ALGO_AUTO) == TS_ERR_INVALID, r, "null");
    WCHECK(ts_broadcast(c, u, 8, 5) == TS_ERR_INVALID, r, "root");
    return 0;
}

static void test_bad_args(void) {
    CHECK(ts_shm_launch(0, NULL, work_bad_args, NULL, NULL) == TS_ERR_INVALID, "0 workers");
    CHECK(ts_shm_launch(2, NULL, NULL, NULL, NULL) == TS_ERR_INVALID, "no function");
    CHECK(ts_shm_launch(2, NULL, work_bad_args, NULL, NULL) == TS_OK, "%s", ts_last_error());
    collect();
    ts_comm *self;
    CHECK_OK(ts_comm_self(&self));
    float x = 2;
    CHECK_OK(ts_allreduce(self, &x, 1, TS_F32, TS_RED_SUM, TS_ALGO_AUTO));
    CHECK(x == 2 && ts_comm_size(self) == 1 && !strcmp(ts_comm_transport(self), "self"), "self");
    ts_comm_close(self);
}

int main(void) {
    SH = mmap(NULL, sizeof *SH, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (SH == MAP_FAILED) return 1;
    /* Only test_tune_cache measures algorithms and touches a cache. */
    setenv("TESSEL_COLL_CACHE", "0", 1);
    setenv("TESSEL_COLL_PROBE", "0", 1);
    test_bad_args();
    test_collectives();
    test_determinism();
    test_p2p_async();
    test_nb_shard();
    test_hosts_heap();
    test_shared_mem();
    test_failures();
    unsetenv("TESSEL_COLL_CACHE");
    unsetenv("TESSEL_COLL_PROBE");
    test_tune_cache();
    munmap(SH, sizeof *SH);
    return check_summary("dist_shm");
}
