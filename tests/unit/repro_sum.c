/* The fixed tree sum of dist.reproducible (src/dist/repro_sum.h): a tree
 * over M leaves gives the same bits as the tree over the M/N balanced sums
 * of N consecutive leaves (N = 1, 2, 4, 8 dividing M, M not always a power
 * of two), where a plain left fold does not; and the whole chain a data-
 * parallel step runs (per round an all-reduce over N shm ranks, recursive
 * doubling beyond 2, divided by N; the rounds in the tree; divided by
 * M / N) reproduces one process's sum / M bit for bit. */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include "check.h"
#include "dist/repro_gather.h"
#include "dist/repro_sum.h"
#include "tessel/dist.h"

enum { LEN = 4099, MAXM = 16 };

/* Leaf i: values of mixed signs and magnitudes (2^-20 .. 2^20), so the
 * order of additions shows in the bits. */
static float leaf_value(int i, size_t e) {
    uint64_t x = (uint64_t)i * 0x9E3779B97F4A7C15ULL ^ (uint64_t)e * 0xC2B2AE3D27D4EB4FULL;
    x ^= x >> 29, x *= 0xBF58476D1CE4E5B9ULL, x ^= x >> 32;
    const float mant = 1.0f + (float)(x & 0xFFFFFF) / 16777216.0f;
    const int ex = (int)((x >> 24) % 41) - 20;
    return ((x >> 40) & 1 ? -mant : mant) * ldexpf(1.0f, ex);
}

static float leaves[MAXM][LEN];

static void fill(int M) {
    for (int i = 0; i < M; i++)
        for (size_t e = 0; e < LEN; e++) leaves[i][e] = leaf_value(i, e);
}

/* The tree over all M leaves, / div. */
static void tree_of(int M, float div, float *out) {
    ts_tree_sum t;
    CHECK_OK(ts_tree_sum_init(&t, LEN));
    for (int i = 0; i < M; i++) CHECK_OK(ts_tree_sum_add(&t, leaves[i]));
    CHECK_OK(ts_tree_sum_result(&t, out, div));
    ts_tree_sum_free(&t);
}

static void test_grouping(void) {
    static float ref[LEN], got[LEN], grp[LEN];
    const int Ms[] = {8, 12, 16, 6};
    for (size_t a = 0; a < sizeof Ms / sizeof Ms[0]; a++) {
        const int M = Ms[a];
        fill(M);
        tree_of(M, 1.0f, ref);
        for (int N = 2; N <= 8; N *= 2) {
            if (M % N) continue;
            ts_tree_sum outer, inner;
            CHECK_OK(ts_tree_sum_init(&outer, LEN));
            CHECK_OK(ts_tree_sum_init(&inner, LEN));
            for (int j = 0; j < M / N; j++) {
                for (int r = 0; r < N; r++) CHECK_OK(ts_tree_sum_add(&inner, leaves[j * N + r]));
                CHECK_OK(ts_tree_sum_result(&inner, grp, 1.0f));
                CHECK_OK(ts_tree_sum_add(&outer, grp));
            }
            CHECK_OK(ts_tree_sum_result(&outer, got, 1.0f));
            CHECK(memcmp(ref, got, sizeof ref) == 0, "M %d: groups of %d give the tree's bits", M,
                  N);
            ts_tree_sum_free(&outer);
            ts_tree_sum_free(&inner);
        }
        /* A left fold is another order: the test data tell them apart. */
        int differ = 0;
        for (size_t e = 0; e < LEN; e++) {
            float f = leaves[0][e];
            for (int i = 1; i < M; i++) f += leaves[i][e];
            differ += f != ref[e];
        }
        CHECK(differ > 0, "M %d: a left fold differs from the tree in %d of %d elements", M, differ,
              LEN);
    }
    /* ts_tree_sum_finish: the last leaf and the result in one pass, the same
     * floats as add + result, for every stack depth (M = 1 .. 16), with and
     * without a division, in place. */
    for (int M = 1; M <= MAXM; M++) {
        fill(M);
        tree_of(M, (float)M, ref);
        ts_tree_sum f;
        CHECK_OK(ts_tree_sum_init(&f, LEN));
        for (int i = 0; i + 1 < M; i++) CHECK_OK(ts_tree_sum_add(&f, leaves[i]));
        memcpy(got, leaves[M - 1], sizeof got);
        CHECK_OK(ts_tree_sum_finish(&f, got, got, (float)M));
        CHECK(memcmp(ref, got, sizeof ref) == 0, "finish after %d leaves, / %d: the tree's bits",
              M - 1, M);
        tree_of(M, 1.0f, ref);
        for (int i = 0; i + 1 < M; i++) CHECK_OK(ts_tree_sum_add(&f, leaves[i]));
        CHECK_OK(ts_tree_sum_finish(&f, leaves[M - 1], got, 1.0f));
        CHECK(memcmp(ref, got, sizeof ref) == 0, "finish after %d leaves: the tree's bits", M - 1);
        ts_tree_sum_free(&f);
    }
    /* The result starts a new sum, and a single leaf is itself. */
    ts_tree_sum t;
    CHECK_OK(ts_tree_sum_init(&t, LEN));
    CHECK_OK(ts_tree_sum_add(&t, leaves[3]));
    CHECK_OK(ts_tree_sum_result(&t, got, 1.0f));
    CHECK(memcmp(got, leaves[3], sizeof got) == 0, "one leaf: itself");
    CHECK(ts_tree_sum_result(&t, got, 1.0f) != TS_OK, "no leaves: refused");
    ts_tree_sum_free(&t);
}

/* The binary counter's tree written out an add at a time, element by
 * element: each leaf pushed, two subtrees of equal size on top added (the
 * lower one the left operand), the subtrees left added from the top down,
 * then the division. ts_tree_sum fuses these adds into fewer passes over
 * the vectors; each float must still come out of these same roundings. */
static void counter_tree(int M, float div, float *out) {
    for (size_t e = 0; e < LEN; e++) {
        float v[64];
        int lv[64], d = 0;
        for (int i = 0; i < M; i++) {
            v[d] = leaves[i][e], lv[d++] = 0;
            while (d > 1 && lv[d - 1] == lv[d - 2])
                v[d - 2] = v[d - 2] + v[d - 1], lv[d - 2]++, d--;
        }
        for (; d > 1; d--) v[d - 2] = v[d - 2] + v[d - 1];
        out[e] = div == 1.0f ? v[0] : v[0] / div;
    }
}

static void test_passes(void) {
    static float ref[LEN], got[LEN];
    for (int M = 1; M <= MAXM; M++) {
        fill(M);
        counter_tree(M, (float)M, ref);
        tree_of(M, (float)M, got);
        CHECK(memcmp(ref, got, sizeof ref) == 0, "add x %d + result: the counter's adds' bits", M);
        counter_tree(M, 1.0f, ref);
        tree_of(M, 1.0f, got);
        CHECK(memcmp(ref, got, sizeof ref) == 0, "add x %d + result, no division: the same", M);
    }
    /* equal subtrees by add_node merge as leaves do: in place, so two of
     * them use one buffer (ts_tree_sum_buffers counts them as leaves) */
    ts_tree_sum t;
    CHECK_OK(ts_tree_sum_init(&t, LEN));
    fill(2);
    for (int i = 0; i < 2; i++) CHECK_OK(ts_tree_sum_add_node(&t, leaves[i], 1));
    CHECK(t.buf[1] == NULL && ts_tree_sum_buffers(2) == 1, "2 nodes of one level: one buffer");
    CHECK_OK(ts_tree_sum_result(&t, got, 1.0f));
    for (size_t e = 0; e < LEN; e++) ref[e] = leaves[0][e] + leaves[1][e];
    CHECK(memcmp(ref, got, sizeof ref) == 0, "2 nodes: their sum");
    ts_tree_sum_free(&t);
}

/* ---- the data-parallel chain over shm ------------------------------------ */

typedef struct job {
    int M;
    float *out; /* MAP_SHARED: rank 0's result */
} job;

static int chain(ts_comm *c, void *user) {
    job *jb = user;
    const int N = ts_comm_size(c), r = ts_comm_rank(c), k = jb->M / N;
    float *buf = ts_comm_alloc(c, LEN * sizeof(float));
    ts_tree_sum t;
    if (!buf || ts_tree_sum_init(&t, LEN) != TS_OK) return 1;
    for (int j = 0; j < k; j++) {
        memcpy(buf, leaves[j * N + r], sizeof leaves[0]);
        if (ts_allreduce(c, buf, LEN, TS_F32, TS_RED_SUM, N > 2 ? TS_ALGO_RD : TS_ALGO_AUTO) !=
            TS_OK)
            return 2;
        for (size_t e = 0; e < LEN; e++) buf[e] /= (float)N; /* as the plan's wait */
        if (ts_tree_sum_add(&t, buf) != TS_OK) return 3;
    }
    if (ts_tree_sum_result(&t, buf, (float)k) != TS_OK) return 4;
    if (r == 0) memcpy(jb->out, buf, LEN * sizeof(float));
    ts_tree_sum_free(&t);
    ts_comm_free(c, buf);
    return 0;
}

static void test_chain(void) {
    static float ref[LEN];
    float *out =
        mmap(NULL, LEN * sizeof(float), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    CHECK(out != MAP_FAILED, "mmap");
    if (out == MAP_FAILED) return;
    const int M = 8;
    fill(M);
    tree_of(M, (float)M, ref);
    for (int N = 2; N <= 4; N *= 2) {
        memset(out, 0xff, LEN * sizeof(float));
        job jb = {M, out};
        CHECK_OK(ts_shm_launch(N, NULL, chain, &jb, NULL));
        CHECK(memcmp(out, ref, LEN * sizeof(float)) == 0,
              "%d shm ranks, all-reduce per round, then the tree: one process's bits", N);
    }
    munmap(out, LEN * sizeof(float));
}

/* ---- runs of leaves on any number of ranks (dist/repro_gather.h) ----------- */
/* Every way of finishing is compared with a ts_tree_sum fed all M leaves in order: the one-pass
 * finish on every rank, and (shared block) the split finish, each rank folding its slice, with a
 * scalar per leaf carried beside the leaves. */

typedef struct gjob {
    int M;
    int share; /* 1: the comm to ts_repro_gather_init (shm: the shared block), 0: NULL */
    size_t n;
    float *out; /* MAP_SHARED: every rank's result, [N][n] */
} gjob;

/* Leaf i of a gather job (n may exceed LEN: values repeat with another index). */
static void gleaf(int i, size_t n, float *dst) {
    for (size_t e = 0; e < n; e++) dst[e] = leaf_value(i + (int)(e / LEN) * 101, e % LEN);
}

/* The observer's view of a result: blocks in order, covering it once. */
typedef struct seen {
    float *copy;
    size_t next;
    int bad;
} seen;

static void observe(void *user, const float *block, size_t off, size_t len) {
    seen *w = user;
    if (off != w->next) w->bad = 1;
    memcpy(w->copy + off, block, len * sizeof(float));
    w->next = off + len;
}

static int gather(ts_comm *c, void *user) {
    gjob *jb = user;
    const int N = ts_comm_size(c), r = ts_comm_rank(c), k = jb->M / N;
    float *leaf = malloc(jb->n * sizeof(float));
    seen w = {malloc(jb->n * sizeof(float)), 0, 0};
    ts_repro_gather g;
    if (!w.copy) return 1;
    if (!leaf || ts_repro_gather_init(&g, jb->share ? c : NULL, N, r, jb->M, jb->n) != TS_OK)
        return 1;
    /* shm: one piece per rank on a power-of-two count goes through the shared block */
    if (N > 1 && !g.xbuf && (g.shared != NULL) != jb->share) return 4;
    ts_repro_gather_observe(&g, observe, &w);
    /* a leaf's slot in the shared block exactly where there is one */
    if ((ts_repro_gather_leaf(&g, 0) != NULL) != (g.shared != NULL)) return 7;
    /* Three results: the leaves copied in; written in place (the slot: no copy), with no
     * collective since the last result (the ranks wait for each other's reads); copied again. */
    for (int round = 0; round < 3; round++) {
        const int inplace = round == 1 && g.shared;
        if (inplace && ts_repro_gather_ready(&g) != TS_OK) return 8;
        for (int j = 0; j < k; j++) {
            float *dst = inplace ? ts_repro_gather_leaf(&g, j) : leaf;
            gleaf(r * k + j, jb->n, dst);
            if (ts_repro_gather_add(&g, dst) != TS_OK) return 2;
        }
        float *dst = jb->out + (size_t)r * jb->n;
        if (ts_repro_gather_result(&g, c, dst) != TS_OK) return 3;
        /* the result's waits napped, and the thread's setting is back */
        if (ts_comm_wait_naps(0) != 0) return 6;
        /* the observer saw the result, block by block in order */
        if (w.bad || w.next != jb->n || memcmp(w.copy, dst, jb->n * sizeof(float))) return 5;
        w.next = 0;
    }
    /* The split finish (shared block only): each rank folds its slice (an even split) into the
     * shared result, which every rank then reads whole; twice, the second with no collective since
     * the first. Copied out per rank for the caller's comparison. */
    if ((ts_repro_gather_shared_result(&g) != NULL) != (g.shared != NULL)) return 9;
    for (int round = 0; g.shared && round < 2; round++) {
        if (ts_repro_gather_ready(&g) != TS_OK) return 8;
        for (int j = 0; j < k; j++) {
            float *dst = ts_repro_gather_leaf(&g, j);
            gleaf(r * k + j, jb->n, dst);
            if (ts_repro_gather_add(&g, dst) != TS_OK) return 2;
            /* each leaf's scalar (a micro-batch's loss) travels with it */
            ts_repro_gather_put_scalar(&g, j, 1000.0 * round + r * k + j);
        }
        /* each rank's flag rides on the second meeting: round 0 rank N - 1's alone, round 1 none */
        ts_repro_gather_put_flag(&g, round == 0 && r == N - 1);
        size_t lo, hi;
        ts_repro_gather_slice(&g, &lo, &hi);
        w.next = lo;
        if (ts_repro_gather_result_split(&g, c, lo, hi) != TS_OK) return 10;
        if (ts_repro_gather_flags(&g) != (round == 0)) return 16; /* every rank sees the or */
        if (ts_comm_wait_naps(0) != 0) return 6;
        /* the observer saw this rank's slice, block by block in order */
        if (w.bad || w.next != hi) return 13;
        if (memcmp(ts_repro_gather_shared_result(&g), jb->out + (size_t)r * jb->n,
                   jb->n * sizeof(float)))
            return 11; /* not the bits of the one-pass finish above */
        /* every leaf's scalar, in leaf order, this step's */
        const double *sc = ts_repro_gather_scalars(&g);
        for (int i = 0; i < jb->M; i++)
            if (!sc || sc[i] != 1000.0 * round + i) return 14;
    }
    if (!g.shared && ts_repro_gather_result_split(&g, c, 0, jb->n) == TS_OK) return 12;
    if (!g.shared && ts_repro_gather_scalars(&g)) return 15; /* scalars travel in the block only */
    ts_repro_gather_free(&g);
    free(leaf);
    free(w.copy);
    return 0;
}

static void test_gather(void) {
    /* 1 Mi + 5 floats: two chunks of the exchange */
    const size_t big = ((size_t)1 << 20) + 5;
    const struct {
        int M, N;
        size_t n;
    } cs[] = {{12, 3, LEN},
              {9, 3, LEN},
              {10, 5, LEN},
              {6, 6, LEN},
              {12, 4, LEN},
              {7, 7, LEN},
              {8, 1, LEN},
              {12, 2, LEN},
              {6, 3, big},
              /* one piece per rank on a power-of-two count: the all-reduce path (share 0)
                 or every leaf in the shared block (share 1) */
              {2, 2, LEN},
              {4, 2, LEN},
              {8, 2, LEN},
              {4, 4, LEN},
              {8, 4, LEN},
              {16, 4, big},
              {16, 8, LEN}};
    for (size_t a = 0; a < sizeof cs / sizeof cs[0]; a++) {
        const int M = cs[a].M, N = cs[a].N;
        const size_t n = cs[a].n, bytes = (size_t)N * n * sizeof(float);
        float *ref = malloc(n * sizeof(float)), *leaf = malloc(n * sizeof(float));
        float *out = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
        CHECK(ref && leaf && out != MAP_FAILED, "memory");
        if (!ref || !leaf || out == MAP_FAILED) return;
        ts_tree_sum t;
        CHECK_OK(ts_tree_sum_init(&t, n));
        for (int i = 0; i < M; i++) {
            gleaf(i, n, leaf);
            CHECK_OK(ts_tree_sum_add(&t, leaf));
        }
        CHECK_OK(ts_tree_sum_result(&t, ref, (float)M));
        ts_tree_sum_free(&t);
        for (int share = 0; share < 2; share++) { /* the all-reduce, then the shared block */
            memset(out, 0xff, bytes);
            gjob jb = {M, share, n, out};
            CHECK_OK(ts_shm_launch(N, NULL, gather, &jb, NULL));
            for (int r = 0; r < N; r++)
                CHECK(memcmp(out + (size_t)r * n, ref, n * sizeof(float)) == 0,
                      "M %d on %d ranks (%zu floats, %s): rank %d has the one-process tree's bits",
                      M, N, n, share ? "shared" : "not shared", r);
        }
        munmap(out, bytes);
        free(ref);
        free(leaf);
    }
    /* The all-reduce path is taken exactly where every rank holds one piece and the count is
     * a power of two (no all-gather buffer); elsewhere the pieces are all-gathered. */
    const struct {
        int M, N, rank_tree;
    } paths[] = {{8, 4, 1}, {4, 2, 1}, {2, 2, 1}, {8, 1, 1}, {12, 4, 0}, {12, 3, 0}, {12, 2, 0}};
    for (size_t a = 0; a < sizeof paths / sizeof paths[0]; a++) {
        ts_repro_gather pg;
        CHECK_OK(ts_repro_gather_init(&pg, NULL, paths[a].N, 0, paths[a].M, LEN));
        CHECK((pg.xbuf == NULL) == paths[a].rank_tree, "M %d on %d ranks: %s", paths[a].M,
              paths[a].N, paths[a].rank_tree ? "one all-reduce" : "pieces all-gathered");
        ts_repro_gather_free(&pg);
    }
    /* A thread's waits yield until told to nap; the setting returns the previous one. */
    CHECK(ts_comm_wait_naps(1) == 0 && ts_comm_wait_naps(0) == 1, "ts_comm_wait_naps: off, on");
    /* Refusals: a count that does not divide M, a subtree out of the counter's order. */
    ts_repro_gather g;
    CHECK(ts_repro_gather_init(&g, NULL, 5, 0, 12, 4) != TS_OK,
          "5 ranks cannot hold runs of 12 leaves");
    ts_repro_gather_free(&g);
    ts_tree_sum t;
    static float one[LEN];
    CHECK_OK(ts_tree_sum_init(&t, LEN));
    CHECK_OK(ts_tree_sum_add_node(&t, one, 1));
    CHECK(ts_tree_sum_add_node(&t, one, 2) != TS_OK, "a larger subtree after a smaller: refused");
    ts_tree_sum_free(&t);
}

int main(void) {
    test_grouping();
    test_passes();
    test_chain();
    test_gather();
    return check_summary("unit/repro_sum");
}
