/* repro_norm.h — the gradient norm dist.reproducible logs (docs/reproducibility.md): per
 * gradient tensor, its elements in chunks of TS_REPRO_NORM_CHUNK counted from the tensor's start,
 * each chunk's squares summed in double in eight lanes (element i in lane i mod 8), the chunks'
 * lanes added in chunk order, the lanes in order, then the tensors in name order. That is the
 * same bits whatever the gradient region's layout (ZeRO puts it in bucket order), the process
 * count and which process sums which chunks. It is fed the gradient region block by block, in
 * order, as a pass writes it (dist/repro_gather.h's observer), so it costs no pass over memory of
 * its own:
 *
 *     ts_repro_norm nm;
 *     ts_repro_norm_init(&nm, grads, n, region, nregion); // grads sorted by name
 *     ts_repro_norm_reset(&nm);                           // every step:
 *     ts_repro_norm_block(&nm, region + off, off, len);   // ... the blocks, in order, then
 *     double norm = ts_repro_norm_result(&nm);
 *     ts_repro_norm_free(&nm);
 *
 * Split between processes: each feeds only the blocks of its slice [lo, hi) of the region, cut
 * where no chunk is (ts_repro_norm_cut), into chunk lanes they share (ts_repro_norm_share, an
 * array of ts_repro_norm_chunks entries in shared memory); once all are done each takes the
 * result from the whole array: the bits of one process feeding every block.
 *
 * A tensor outside the region, or overlapping another, is read from its own memory when the
 * result is taken. */
#ifndef TS_SESSION_REPRO_NORM_H
#define TS_SESSION_REPRO_NORM_H

#include <stddef.h>
#include "plan/micro.h"

/* Floats per chunk: a multiple of 16 (a slice cut at a chunk starts a cache line where the tensor
 * does). */
enum { TS_REPRO_NORM_CHUNK = 4096 };

typedef struct ts_repro_norm {
    const ts_plan_fwd_state *t; /* [n] the gradients, by name (borrowed) */
    int n;
    const float *region; /* the region the blocks come from, nregion floats */
    size_t nregion;
    int nin;           /* tensors fed by the blocks */
    int *in;           /* [nin] their indices into t, by offset in the region */
    size_t *off;       /* [nin] their offsets */
    size_t *cbase;     /* [nin] the index of their first chunk in part */
    size_t nchunks;    /* the fed tensors' chunks */
    double (*part)[8]; /* [nchunks] each chunk's lanes: own, or shared */
    double (*own)[8];  /* [nchunks] */
    double open[8];    /* the lanes of the chunk being fed */
    int *fed;          /* [n] the index into in[], -1: read at the result */
    int cur;           /* the first of in[] a later block can still reach */
} ts_repro_norm;

ts_status ts_repro_norm_init(ts_repro_norm *nm, const ts_plan_fwd_state *t, int n,
                             const float *region, size_t nregion);
/* Forgets the blocks fed so far. */
void ts_repro_norm_reset(ts_repro_norm *nm);
/* region[off, off + len), at block; blocks come in order and cover the region once. */
void ts_repro_norm_block(ts_repro_norm *nm, const float *block, size_t off, size_t len);
/* The norm of what the blocks since the reset held (and of the tensors outside the region). */
double ts_repro_norm_result(ts_repro_norm *nm);
/* Reset, the whole region as one block, the result: the norm of the gradients as they are. */
double ts_repro_norm_now(ts_repro_norm *nm);
/* Entries of the chunk lanes' array (8 doubles each). */
size_t ts_repro_norm_chunks(const ts_repro_norm *nm);
/* The chunk lanes go to part (ts_repro_norm_chunks entries; NULL: back to the norm's own). */
void ts_repro_norm_share(ts_repro_norm *nm, double (*part)[8]);
/* The smallest region offset >= x where no chunk of a fed tensor is cut (a chunk's start, a
 * tensor's end, or x outside every tensor): slices cut there feed whole chunks. */
size_t ts_repro_norm_cut(const ts_repro_norm *nm, size_t x);
void ts_repro_norm_free(ts_repro_norm *nm);

#endif
