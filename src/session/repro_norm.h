/* repro_norm.h — the gradient norm dist.reproducible logs (docs/reproducibility.md): per
 * gradient tensor, its squares summed in double in eight lanes (element i in lane i mod 8,
 * counted from the tensor's start), the lanes added in order, then the tensors in name order.
 * That is the same bits whatever the gradient region's layout (ZeRO puts it in bucket order)
 * and the process count. It is fed the gradient region block by block, in order, as the step's
 * last pass writes it (dist/repro_gather.h's observer), so it costs no pass over memory of its
 * own:
 *
 *     ts_repro_norm nm;
 *     ts_repro_norm_init(&nm, grads, n, region, nregion); // grads sorted by name
 *     ts_repro_norm_reset(&nm);                           // every step:
 *     ts_repro_norm_block(&nm, region + off, off, len);   // ... the blocks, in order, then
 *     double norm = ts_repro_norm_result(&nm);
 *     ts_repro_norm_free(&nm);
 *
 * A tensor outside the region, or overlapping another, is read from its own memory when the
 * result is taken. */
#ifndef TS_SESSION_REPRO_NORM_H
#define TS_SESSION_REPRO_NORM_H

#include <stddef.h>
#include "plan/micro.h"

typedef struct ts_repro_norm {
    const ts_plan_fwd_state *t; /* [n] the gradients, by name (borrowed) */
    int n;
    const float *region; /* the region the blocks come from, nregion floats */
    size_t nregion;
    int nin;          /* tensors fed by the blocks */
    int *in;          /* [nin] their indices into t, by offset in the region */
    size_t *off;      /* [nin] their offsets */
    double (*acc)[8]; /* [n] each tensor's lanes */
    char *fed;        /* [n] 1: fed by the blocks, else read at the result */
    int cur;          /* the first of in[] a later block can still reach */
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
void ts_repro_norm_free(ts_repro_norm *nm);

#endif
