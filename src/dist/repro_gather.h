/* repro_gather.h — the fixed tree sum of M leaves (dist/repro_sum.h) when N ranks hold
 * consecutive runs of them and N is any count dividing M (dist.reproducible on 3, 5, 6, ...
 * processes; docs/reproducibility.md).
 *
 *     ts_repro_gather g;
 *     ts_repro_gather_init(&g, comm, N, rank, M, n); // rank holds leaves rank*M/N ...
 *     for (j = 0; j < M / N; j++) ts_repro_gather_add(&g, leaf_j);
 *     ts_repro_gather_result(&g, comm, dst);          // collective: dst = tree sum / M
 *     ts_repro_gather_free(&g);
 *
 * The binary counter's tree over leaves 0 .. M-1 is made of aligned blocks of 2^a leaves
 * (inside the blocks of M's set bits). A rank's run of leaves splits into the largest such
 * blocks that lie inside it ("pieces", at most about 2 log2 M); the rank sums each piece as a
 * balanced tree, all ranks all-gather their pieces (in chunks of 1 Mi floats, so the buffer
 * stays small), and every rank adds the pieces of all ranks in leaf order into one binary
 * counter (ts_tree_sum_add_node), which finishes the same tree. So the result is the same
 * floats for every N dividing M, N = 1 included, and the same as a ts_tree_sum fed all M
 * leaves, then divided by M. Costs beside the leaves' own sum: each rank receives every
 * other rank's pieces, (N - 1) * pieces * n floats per result.
 *
 * Where every rank holds one piece and N is a power of two, the pieces are the leaves of a
 * balanced tree over the ranks, so all M leaves are the leaves of one balanced tree. On a
 * transport whose ranks share memory (shm, M <= 64) every leaf then has a slot in a block all
 * ranks read (M * n floats in all, one per leaf: ts_repro_gather_leaf), which the caller can
 * write in place (a backward pass bound there, plan/micro.h); after one barrier every rank adds
 * the M leaves in that tree and divides by M in a single pass into dst (no copy of a leaf, no
 * pass per level, no all-reduce, no separate division). A rank writes its next leaves once every
 * rank has read these (a counter per rank in the block; no second barrier). Or each rank folds
 * only its slice into a result region of the block, and all read that
 * (ts_repro_gather_result_split: two meetings on counters in the block, dist/shm_meet.h, 1/N of
 * the reads; a scalar per leaf, such as its loss, travels with the first meeting). Elsewhere each
 * rank sums its run, and one all-reduce of the pieces (recursive doubling's pairs are the same
 * tree) finishes it, followed by the division.
 *
 * An observer (ts_repro_gather_observe) sees the result as it is written: in the one-pass
 * finish block by block while each is in the cache (the split finish: this rank's slice only),
 * elsewhere once over all of dst; a norm of the result then costs no pass over memory of its
 * own. */
#ifndef TS_DIST_REPRO_GATHER_H
#define TS_DIST_REPRO_GATHER_H

#include "dist/repro_sum.h"
#include "dist/shm_meet.h"
#include "tessel/dist.h"

/* Reads dst[off, off + len) of a result, block points at dst + off; blocks come in order and
 * cover dst once. */
typedef void (*ts_repro_observe_fn)(void *user, const float *block, size_t off, size_t len);

typedef struct ts_repro_gather {
    int N, rank, npieces, pmax, total; /* this rank's pieces, the most of any, all ranks' */
    int64_t M, k;                      /* leaves, per rank */
    ts_comm *comm;                     /* the comm `shared` came from, else NULL */
    void *shared_block;          /* [N] counters of results read, 64 bytes apart, then `shared` */
    float *shared;               /* [N][k][n] every rank's leaves, in leaf order (shm, rank tree) */
    float *result;               /* [n] after them: the split finish's result */
    double *shared_scalars;      /* [M] in the block: one scalar per leaf (the split finish) */
    double *scalars;             /* [M] this rank's copy of them after a split result */
    ts_meet meet;                /* the split finish's meetings, on counters in the block */
    uint64_t results;            /* results so far */
    uint64_t flag, flags;        /* the split finish: this rank's word, every rank's or-ed */
    int waited;                  /* the peers have read the last result's leaves */
    ts_repro_observe_fn observe; /* NULL: none */
    void *observe_user;
    size_t n;           /* floats per leaf */
    int64_t *start;     /* [total] first leaf of every piece, in leaf order */
    int *level;         /* [total] log2 of its leaf count */
    int *owner, *index; /* [total] its rank and its index there */
    float *mine;        /* [npieces][n] this rank's piece sums */
    float *xbuf;        /* [N][pmax][chunk] the all-gather's buffer */
    int64_t added;      /* leaves added since the last result */
    int cur;            /* the piece the next leaf belongs to */
    ts_tree_sum local, glob;
} ts_repro_gather;

/* N ranks, M leaves (N divides M), n floats each; this rank holds leaves rank*M/N ... With comm
 * (NULL: none yet; then the all-reduce path) it is collective over comm's N ranks: on shm it
 * allocates the block the ranks share for the one-pass finish above, 4 * (M + 1) * n bytes (and
 * 128 per rank, 8 per leaf) of rank 0's heap (the all-reduce path if that is exhausted), then
 * waits for every rank (a barrier: the counters zeroed before any rank meets on them). */
ts_status ts_repro_gather_init(ts_repro_gather *g, ts_comm *comm, int N, int rank, int64_t M,
                               size_t n);
/* Where this rank's leaf j (0 <= j < M/N) lies in the shared block, to be written in place: then
 * ts_repro_gather_add of that pointer copies nothing. NULL where there is no such block (then the
 * leaf is written elsewhere and added). Call ts_repro_gather_ready before writing leaf 0. */
float *ts_repro_gather_leaf(const ts_repro_gather *g, int64_t j);
/* Waits until every rank has read the leaves of the last result (so this rank may write its
 * next ones in place); returns at once without a shared block or when a collective after the
 * result already ordered it. Fails after the comm's timeout. */
ts_status ts_repro_gather_ready(ts_repro_gather *g);
/* The next of this rank's leaves (n floats, read only; its slot from ts_repro_gather_leaf:
 * nothing to copy). */
ts_status ts_repro_gather_add(ts_repro_gather *g, const float *leaf);
/* Collective over comm's N ranks (the comm given to init, if any), after each added its M/N
 * leaves: dst (n floats) = the sum of all M leaves in the fixed tree, divided by M. Then the sum
 * starts again. While it waits for the peers, the calling thread sleeps in short naps instead of
 * yielding (a peer sharing its core gets the core). */
ts_status ts_repro_gather_result(ts_repro_gather *g, ts_comm *comm, float *dst);
/* The split finish (shared block only): collective like ts_repro_gather_result, but each rank
 * adds the M leaves in the same tree for its own slice [lo, hi) of the n floats and divides by
 * M, writing the slice once into a result region of the block (the observer sees the slice's
 * blocks as they are written, in order); after a second meeting every rank reads the whole
 * result there (ts_repro_gather_shared_result) and none copies it. The ranks' slices must
 * cover the n floats once (ts_repro_gather_slice: an even split at cache lines). The same floats
 * as ts_repro_gather_result's, for 1/N of its reads per rank. The result stays valid until the
 * next call's first meeting, which every rank reaches only after writing its next leaves. */
ts_status ts_repro_gather_result_split(ts_repro_gather *g, ts_comm *comm, size_t lo, size_t hi);
/* The split finish carries one scalar per leaf (a micro-batch's loss) with the leaves, so the
 * caller needs no collective of its own for them: this rank's leaf j's scalar, set before the
 * result (no effect without a shared block). */
void ts_repro_gather_put_scalar(ts_repro_gather *g, int64_t j, double v);
/* After ts_repro_gather_result_split: the M leaves' scalars, in leaf order (every rank's run,
 * rank-major), this rank's copy, valid until the next result. NULL without a shared block. */
const double *ts_repro_gather_scalars(const ts_repro_gather *g);
/* The split finish also carries one word per rank on its second meeting (the session's stop
 * flag), so the ranks need no agreement of their own: this rank's, set before the result, and
 * after it the or of every rank's (ts_meet_or), valid until the next result. */
void ts_repro_gather_put_flag(ts_repro_gather *g, uint64_t flag);
uint64_t ts_repro_gather_flags(const ts_repro_gather *g);
/* What the split finish's waits cost this rank so far (dist/shm_meet.h), NULL without a shared
 * block. */
const ts_meet_stats *ts_repro_gather_waits(const ts_repro_gather *g);
/* This rank's slice of an even split of the n floats, cut at multiples of 16 (64 bytes). */
void ts_repro_gather_slice(const ts_repro_gather *g, size_t *lo, size_t *hi);
/* The split finish's result region (n floats in the shared block, for reading: every rank
 * reads it), NULL without one. */
float *ts_repro_gather_shared_result(const ts_repro_gather *g);
/* fn (NULL: none) reads every later result as it is written (above). */
void ts_repro_gather_observe(ts_repro_gather *g, ts_repro_observe_fn fn, void *user);
void ts_repro_gather_free(ts_repro_gather *g);

#endif
