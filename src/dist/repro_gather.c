/* The fixed tree sum over leaves held in runs by any number of ranks. See repro_gather.h. */
#include "dist/repro_gather.h"
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include "core/core.h"
#include "dist/shm_meet.h"
#include "tessel/util.h"

enum { CHUNK = 1 << 20 }; /* floats of each piece per all-gather */

/* The pieces of leaves [lo, hi) out of M: the largest aligned blocks of 2^a leaves inside the
 * range and inside one block of M's set bits (largest first: each starts at a multiple of its
 * size). Writes at most cap of them; returns how many there are. */
static int pieces_of(int64_t M, int64_t lo, int64_t hi, int64_t *start, int *level, int cap) {
    int n = 0;
    int64_t s = 0;
    for (int b = 62; b >= 0; b--) {
        if (!((M >> b) & 1)) continue;
        const int64_t e = s + ((int64_t)1 << b);
        int64_t a = lo > s ? lo : s;
        const int64_t z = hi < e ? hi : e;
        while (a < z) {
            int l = b;
            while (l > 0 && ((a & (((int64_t)1 << l) - 1)) || a + ((int64_t)1 << l) > z)) l--;
            if (n < cap) start[n] = a, level[n] = l;
            n++;
            a += (int64_t)1 << l;
        }
        s = e;
    }
    return n;
}

/* Every rank holds one piece and N is a power of two (so is each piece's k = M / N leaves): the
 * pieces are the leaves of a balanced tree over the ranks, whose pairs are recursive doubling's
 * (r and r xor 1, then r xor 2, ...; for 2 ranks every algorithm adds the one pair). One
 * all-reduce of n floats then finishes the tree, instead of an all-gather of N * n and the sum
 * of all pieces on every rank. */
static int rank_tree(const ts_repro_gather *g) {
    return g->total == g->N && (g->N & (g->N - 1)) == 0;
}

/* The shared block holds every rank's leaves, added in one balanced tree (at most this many). */
enum { MAX_SHARED_LEAVES = 64 };

/* Bytes of the shared block's header: one counter per rank, each on a cache line of its own. */
enum { DONE_STRIDE = 64 };

/* The shared block: [N] results-read counters (DONE_STRIDE apart), the split finish's meeting
 * counters (dist/shm_meet.h), the M leaves' scalars (padded to a cache line), the M leaves, the
 * split finish's result. */
static size_t scalars_at(int N) {
    return (size_t)N * DONE_STRIDE + ts_meet_bytes(N);
}
static size_t leaves_at(int N, int64_t M) {
    return scalars_at(N) + ((size_t)M * sizeof(double) + 63) / 64 * 64;
}

/* Where piece p of this rank goes (the all-reduce path). */
static float *piece_dst(const ts_repro_gather *g, int p) {
    return g->mine + (size_t)p * g->n;
}

/* Leaf j of this rank's run in the shared block: leaf rank * k + j of the tree. */
static float *leaf_slot(const ts_repro_gather *g, int64_t j) {
    return g->shared + ((size_t)g->rank * (size_t)g->k + (size_t)j) * g->n;
}

static _Atomic uint64_t *done_of(const ts_repro_gather *g, int r) {
    return (_Atomic uint64_t *)((unsigned char *)g->shared_block + (size_t)r * DONE_STRIDE);
}

/* The shared block (repro_gather.h), collective: NULL where the transport shares no memory,
 * the leaves are too many for one fold or rank 0's heap cannot hold them (then the all-reduce
 * path; every rank learns the same). Each rank zeroes its own leaves (padding a backward pass
 * writing into them leaves as it is) and its counter. */
static ts_status share_leaves(ts_repro_gather *g, ts_comm *comm) {
    if (!comm || g->N < 2 || g->M > MAX_SHARED_LEAVES || g->n == 0 || !ts_comm_shares_memory(comm))
        return TS_OK;
    void *p = NULL;
    const size_t head = leaves_at(g->N, g->M);
    /* the M leaves, then the split finish's result */
    ts_status s = ts_comm_alloc_shared(comm, head + ((size_t)g->M + 1) * g->n * sizeof(float), &p);
    if (s == TS_ERR_NOMEM) return TS_OK;
    if (s != TS_OK) return s;
    if (!(g->scalars = ts_zalloc((size_t)g->M * sizeof(double), "leaves' scalars"))) {
        ts_comm_release_shared(comm, p);
        return TS_ERR_NOMEM;
    }
    unsigned char *b = p;
    g->shared_block = p;
    g->shared = (float *)(b + head);
    g->result = g->shared + (size_t)g->M * g->n;
    g->shared_scalars = (double *)(b + scalars_at(g->N));
    g->comm = comm;
    memset(leaf_slot(g, 0), 0, (size_t)g->k * g->n * sizeof(float));
    atomic_store(done_of(g, g->rank), 0);
    ts_meet_init(&g->meet, comm, b + (size_t)g->N * DONE_STRIDE, g->N, g->rank);
    /* every rank's counters zeroed before any rank meets on them (the block may be memory a
     * freed block's counters used) */
    return ts_barrier(comm);
}

/* Before this rank writes the first leaf of a step into the shared block: every peer has read
 * the previous step's leaves (it counts its results in its counter once its fold is done). A
 * collective between the two steps (repro.c: the losses' all-gather) makes this free; without
 * one the rank naps here. */
static ts_status wait_readers(ts_repro_gather *g) {
    if (g->waited || g->results == 0) return TS_OK;
    const struct timespec nap = {0, 50000};
    const double t0 = ts_now(), limit = ts_comm_timeout(g->comm);
    for (int q = 0; q < g->N; q++)
        while (atomic_load_explicit(done_of(g, q), memory_order_acquire) < g->results) {
            if (ts_now() - t0 > limit)
                return ts_fail(TS_ERR_IO,
                               "repro_gather: rank %d timed out after %.1f s waiting for rank %d "
                               "to read the previous step's leaves",
                               g->rank, ts_now() - t0, q);
            nanosleep(&nap, NULL);
        }
    g->waited = 1;
    return TS_OK;
}

ts_status ts_repro_gather_init(ts_repro_gather *g, ts_comm *comm, int N, int rank, int64_t M,
                               size_t n) {
    if (!g) return ts_fail(TS_ERR_INVALID, "repro_gather: NULL argument");
    memset(g, 0, sizeof *g);
    if (N < 1 || rank < 0 || rank >= N || M < 1 || M % N)
        return ts_fail(TS_ERR_INVALID, "repro_gather: %d ranks cannot hold runs of %lld leaves", N,
                       (long long)M);
    g->N = N, g->rank = rank, g->M = M, g->k = M / N, g->n = n;
    for (int r = 0; r < N; r++) {
        const int c = pieces_of(M, r * g->k, (r + 1) * g->k, NULL, NULL, 0);
        g->total += c;
        if (c > g->pmax) g->pmax = c;
        if (r == rank) g->npieces = c;
    }
    const size_t T = (size_t)g->total;
    if (!(g->start = ts_alloc(T * sizeof *g->start, "tree pieces")) ||
        !(g->level = ts_alloc(T * sizeof *g->level, "tree pieces")) ||
        !(g->owner = ts_alloc(T * sizeof *g->owner, "tree pieces")) ||
        !(g->index = ts_alloc(T * sizeof *g->index, "tree pieces")))
        return TS_ERR_NOMEM;
    int t = 0;
    for (int r = 0; r < N; r++) {
        const int c =
            pieces_of(M, r * g->k, (r + 1) * g->k, g->start + t, g->level + t, g->total - t);
        for (int i = 0; i < c; i++) g->owner[t + i] = r, g->index[t + i] = i;
        t += c;
    }
    const size_t chunk = n < CHUNK ? n : CHUNK;
    if (rank_tree(g)) {
        ts_status s = share_leaves(g, comm);
        if (s == TS_OK && !g->shared &&
            !(g->mine = ts_alloc((n ? n : 1) * sizeof(float), "tree pieces")))
            s = TS_ERR_NOMEM;
        return s == TS_OK ? ts_tree_sum_init(&g->local, n) : s; /* no all-gather: xbuf, glob */
    }
    if (!(g->mine = ts_alloc((size_t)g->npieces * (n ? n : 1) * sizeof(float), "tree pieces")))
        return TS_ERR_NOMEM;
    if (!(g->xbuf = ts_alloc((size_t)N * (size_t)g->pmax * (chunk ? chunk : 1) * sizeof(float),
                             "tree pieces' exchange")))
        return TS_ERR_NOMEM;
    ts_status s = ts_tree_sum_init(&g->local, n);
    if (s == TS_OK) s = ts_tree_sum_init(&g->glob, chunk);
    return s;
}

/* The first piece of this rank in the global list. */
static int first_mine(const ts_repro_gather *g) {
    int t = 0;
    while (t < g->total && g->owner[t] != g->rank) t++;
    return t;
}

float *ts_repro_gather_leaf(const ts_repro_gather *g, int64_t j) {
    return g && g->shared && j >= 0 && j < g->k ? leaf_slot(g, j) : NULL;
}

ts_status ts_repro_gather_add(ts_repro_gather *g, const float *leaf) {
    if (!g || !leaf) return ts_fail(TS_ERR_INVALID, "repro_gather_add: NULL argument");
    if (g->shared) {
        /* the leaf goes into its slot of the shared block, unless it was written there */
        if (g->added >= g->k)
            return ts_fail(TS_ERR_INVALID, "repro_gather_add: more than the rank's %lld leaves",
                           (long long)g->k);
        float *slot = leaf_slot(g, g->added);
        if (leaf != slot) {
            ts_status s = wait_readers(g);
            if (s != TS_OK) return s;
            memcpy(slot, leaf, g->n * sizeof(float));
        }
        g->added++;
        return TS_OK;
    }
    if (g->cur >= g->npieces)
        return ts_fail(TS_ERR_INVALID, "repro_gather_add: more than the rank's %lld leaves",
                       (long long)g->k);
    const int t = first_mine(g) + g->cur;
    ts_status s;
    /* The leaf completes a piece (a balanced tree of 2^level leaves): its sum, in one pass. */
    if (g->local.leaves + 1 == (int64_t)1 << g->level[t]) {
        s = ts_tree_sum_finish(&g->local, leaf, piece_dst(g, g->cur), 1.0f);
        g->cur++;
    } else {
        s = ts_tree_sum_add(&g->local, leaf);
    }
    if (s == TS_OK) g->added++;
    return s;
}

ts_status ts_repro_gather_ready(ts_repro_gather *g) {
    if (!g) return ts_fail(TS_ERR_INVALID, "repro_gather_ready: NULL argument");
    return g->shared ? wait_readers(g) : TS_OK;
}

/* The division by M of the rank tree, as a product: there M = N * k with N and k (a piece's
 * leaves) powers of two, and for M a power of two x / M and x * (1 / M) are both the correctly
 * rounded value of the same real number, so the same float for every x (a multiplication is
 * cheaper than a division in the vector units). */
static float rank_tree_reciprocal(const ts_repro_gather *g) {
    return 1.0f / (float)g->M;
}

/* dst[lo, hi) = the M leaves of the shared block (every rank's run, in leaf order) added in
 * the balanced tree over them, divided by M. M = N * k with both powers of two, so this is the
 * binary counter's tree: each rank's run summed as a balanced tree, then the runs in the tree of
 * the ranks (recursive doubling's pairs: r and r xor 1, then r xor 2, ...). One pass that does
 * the last leaf's add, the ranks' add and the division. */
static void fold_block(const ts_repro_gather *g, float *restrict dst, size_t lo, size_t hi) {
    const size_t n = g->n, L = (size_t)g->M;
    const float inv = rank_tree_reciprocal(g);
    const float *restrict a = g->shared, *restrict b = a + n;
    if (L == 2) {
        for (size_t i = lo; i < hi; i++) dst[i] = (a[i] + b[i]) * inv;
    } else if (L == 4) {
        const float *restrict c = a + 2 * n, *restrict d = a + 3 * n;
        for (size_t i = lo; i < hi; i++) dst[i] = ((a[i] + b[i]) + (c[i] + d[i])) * inv;
    } else {
        for (size_t i = lo; i < hi; i++) {
            float v[MAX_SHARED_LEAVES];
            for (size_t q = 0; q < L; q++) v[q] = a[q * n + i];
            for (size_t d = 1; d < L; d *= 2)
                for (size_t q = 0; q + d < L; q += 2 * d) v[q] = v[q] + v[q + d];
            dst[i] = v[0] * inv;
        }
    }
}

/* Floats per block of the one-pass finish: the block's result stays in the L1 cache for the
 * observer (repro_gather.h) to read. */
enum { FOLD_BLOCK = 2048 };

/* dst[from, to) = the tree's result from the shared block, reading the leaves in place, block by
 * block, each block handed to the observer while it is in the cache. */
static void fold_range(const ts_repro_gather *g, float *restrict dst, size_t from, size_t to) {
    for (size_t lo = from; lo < to; lo += FOLD_BLOCK) {
        const size_t hi = to - lo < FOLD_BLOCK ? to : lo + FOLD_BLOCK;
        fold_block(g, dst, lo, hi);
        if (g->observe) g->observe(g->observe_user, dst + lo, lo, hi - lo);
    }
}

/* This rank has read the shared leaves of one more result: it says so to
 * the ranks that wait before writing theirs again (wait_readers), and the
 * next step adds its leaves from the first. `waited`: whether this rank may
 * write its own leaves next without that wait (a barrier already ordered
 * every reader's reads before the next write). */
static void result_read(ts_repro_gather *g, int waited) {
    g->results++;
    atomic_store_explicit(done_of(g, g->rank), g->results, memory_order_release);
    g->waited = waited;
    g->added = 0;
    g->cur = 0;
}

static ts_status rank_tree_result(ts_repro_gather *g, ts_comm *comm, float *dst) {
    ts_status s = TS_OK;
    if (g->shared) {
        /* Past the barrier every leaf is written. A rank writes its leaves again only once every
         * rank has counted this result as read (wait_readers): no second barrier. */
        if ((s = ts_barrier(comm)) == TS_OK) fold_range(g, dst, 0, g->n);
        result_read(g, 0);
        return s;
    }
    if (g->N > 1)
        s = ts_allreduce(comm, g->mine, g->n, TS_F32, TS_RED_SUM,
                         g->N > 2 ? TS_ALGO_RD : TS_ALGO_AUTO);
    /* the quotients of ts_tree_sum_result's division, so the floats of the all-gather's path;
     * the status tested outside the loop, which then vectorises (it ran one divss per float: 6 %
     * of W1's reproducible step on 2 processes) */
    const float inv = rank_tree_reciprocal(g);
    const float *mine = g->mine;
    if (s == TS_OK)
        for (size_t i = 0; i < g->n; i++) dst[i] = mine[i] * inv;
    g->added = 0;
    g->cur = 0;
    return s;
}

void ts_repro_gather_slice(const ts_repro_gather *g, size_t *lo, size_t *hi) {
    const size_t n = g->n, N = (size_t)g->N, r = (size_t)g->rank;
    *lo = r == 0 ? 0 : n * r / N / 16 * 16;
    *hi = r + 1 == N ? n : n * (r + 1) / N / 16 * 16;
}

float *ts_repro_gather_shared_result(const ts_repro_gather *g) {
    return g ? g->result : NULL;
}

ts_status ts_repro_gather_result_split(ts_repro_gather *g, ts_comm *comm, size_t lo, size_t hi) {
    if (!g || !g->result)
        return ts_fail(TS_ERR_INVALID, "repro_gather_result_split: no shared block");
    if (comm != g->comm)
        return ts_fail(TS_ERR_INVALID,
                       "repro_gather_result_split: not the comm the pieces are shared on");
    if (g->added != g->k)
        return ts_fail(TS_ERR_INVALID,
                       "repro_gather_result_split: %lld of the rank's %lld leaves added",
                       (long long)g->added, (long long)g->k);
    if (lo > hi || hi > g->n)
        return ts_fail(TS_ERR_INVALID, "repro_gather_result_split: slice [%zu, %zu) of %zu floats",
                       lo, hi, g->n);
    /* Two meetings on the block's counters (dist/shm_meet.h: a short spin, then naps). Past the
     * first every leaf and scalar is written; past the second every slice of the result. A rank
     * writes its leaves and scalars again only after the second, and the result only after the
     * next step's first, which every rank reaches after its reads of these: no counters to wait
     * for, and the scalars are copied out between the two; each rank's flag rides on the second. */
    ts_meet_arrive(&g->meet);
    ts_status s = ts_meet_wait(&g->meet);
    if (s == TS_OK) {
        memcpy(g->scalars, g->shared_scalars, (size_t)g->M * sizeof(double));
        fold_range(g, g->result, lo, hi);
        ts_meet_arrive_with(&g->meet, g->flag);
        s = ts_meet_wait(&g->meet);
        if (s == TS_OK) g->flags = ts_meet_or(&g->meet);
    }
    if (s != TS_OK) ts_error_prefix("dist.reproducible: the gradients' finish");
    result_read(g, 1);
    return s;
}

void ts_repro_gather_put_scalar(ts_repro_gather *g, int64_t j, double v) {
    if (g && g->shared_scalars && j >= 0 && j < g->k)
        g->shared_scalars[(size_t)g->rank * (size_t)g->k + (size_t)j] = v;
}

void ts_repro_gather_put_flag(ts_repro_gather *g, uint64_t flag) {
    if (g) g->flag = flag;
}

uint64_t ts_repro_gather_flags(const ts_repro_gather *g) {
    return g ? g->flags : 0;
}

const double *ts_repro_gather_scalars(const ts_repro_gather *g) {
    return g ? g->scalars : NULL;
}

const ts_meet_stats *ts_repro_gather_waits(const ts_repro_gather *g) {
    return g && g->shared ? &g->meet.st : NULL;
}

static ts_status gather_result(ts_repro_gather *g, ts_comm *comm, float *dst);

ts_status ts_repro_gather_result(ts_repro_gather *g, ts_comm *comm, float *dst) {
    if (!g || !dst) return ts_fail(TS_ERR_INVALID, "repro_gather_result: NULL argument");
    if (g->shared && comm != g->comm)
        return ts_fail(TS_ERR_INVALID,
                       "repro_gather_result: not the comm the pieces are shared on");
    /* The step's own thread waits here for the slowest rank with nothing else to do: after the
     * short spin it naps (as the communication thread does) instead of yielding, which on a
     * machine with fewer cores than runnable threads kept it running against the peer it waits
     * for (W1 on 2 processes, dist.reproducible: most of the step's extra time). */
    const int naps = ts_comm_wait_naps(1), shared = g->shared != NULL;
    ts_status s = gather_result(g, comm, dst);
    ts_comm_wait_naps(naps);
    /* the shared block's finish handed its blocks to the observer as it wrote them */
    if (s == TS_OK && !shared && g->observe && g->n) g->observe(g->observe_user, dst, 0, g->n);
    return s;
}

static ts_status gather_result(ts_repro_gather *g, ts_comm *comm, float *dst) {
    if (g->added != g->k)
        return ts_fail(TS_ERR_INVALID, "repro_gather_result: %lld of the rank's %lld leaves added",
                       (long long)g->added, (long long)g->k);
    if (g->N > 1 && (!comm || ts_comm_size(comm) != g->N))
        return ts_fail(TS_ERR_INVALID, "repro_gather_result: needs a comm of %d ranks", g->N);
    if (rank_tree(g)) return rank_tree_result(g, comm, dst);
    ts_status s = TS_OK;
    for (size_t off = 0; off < g->n && s == TS_OK; off += CHUNK) {
        const size_t len = g->n - off < CHUNK ? g->n - off : CHUNK;
        const size_t slot = (size_t)g->pmax * len; /* one rank's block of the all-gather */
        float *blk = g->xbuf + (size_t)g->rank * slot;
        for (int p = 0; p < g->npieces; p++)
            memcpy(blk + (size_t)p * len, g->mine + (size_t)p * g->n + off, len * sizeof(float));
        if (g->N > 1)
            s = ts_allgather(comm, NULL, g->xbuf, (size_t)g->N * slot, TS_F32, TS_ALGO_AUTO);
        g->glob.n = len; /* its buffers hold CHUNK floats; the last chunk is shorter */
        for (int t = 0; t < g->total && s == TS_OK; t++)
            s = ts_tree_sum_add_node(
                &g->glob, g->xbuf + (size_t)g->owner[t] * slot + (size_t)g->index[t] * len,
                g->level[t]);
        if (s == TS_OK) s = ts_tree_sum_result(&g->glob, dst + off, (float)g->M);
    }
    g->added = 0;
    g->cur = 0;
    return s;
}

void ts_repro_gather_observe(ts_repro_gather *g, ts_repro_observe_fn fn, void *user) {
    if (!g) return;
    g->observe = fn;
    g->observe_user = user;
}

void ts_repro_gather_free(ts_repro_gather *g) {
    if (!g) return;
    if (g->shared_block) ts_comm_release_shared(g->comm, g->shared_block);
    free(g->start);
    free(g->level);
    free(g->owner);
    free(g->index);
    free(g->mine);
    free(g->xbuf);
    free(g->scalars);
    ts_tree_sum_free(&g->local);
    ts_tree_sum_free(&g->glob);
    memset(g, 0, sizeof *g);
}
