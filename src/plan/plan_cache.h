/* plan_cache.h — one compiled plan per shape bucket behind one plan handle
 * (shape.policy, docs/shapes.md).
 *
 *     ts_plan_cache *pc;
 *     ts_plan_cache_new(plan, 64, 0, 0, build, user, &pc);   // plan: batch 64
 *     ts_plan_cache_select(pc, 16, 0);   // plan now runs the batch-16 program,
 *     ts_plan_set_input(plan, "x", ...); // compiled on first use by build()
 *     ts_plan_step(plan);
 *     ts_plan_cache_free(pc);            // plan holds its own program again
 *
 * Every bucket's plan is compiled with ts_compile_shared on the handle's
 * state, so parameters, gradients and optimizer state exist once, and
 * selecting a bucket swaps programs (ts_plan_swap_program): the handle
 * keeps its step counters, update gate and trace, and whoever reads the
 * handle (monitors, checkpoints, the loss) sees the last step's program.
 * The handle's own program holds the state and is never evicted; others
 * are evicted least recently used when their own memory (inputs,
 * temporaries, kernels' scratch) passes the limit. */
#ifndef TS_PLAN_CACHE_H
#define TS_PLAN_CACHE_H

#include <stddef.h>
#include <stdint.h>
#include "tessel/plan.h"

/* Compiles the plan of bucket (batch, seq) with ts_compile_shared on
 * `share` (the handle). */
typedef ts_status (*ts_plan_build_fn)(void *user, int64_t batch, int64_t seq, const ts_plan *share,
                                      ts_plan **out);

typedef struct ts_plan_cache ts_plan_cache;

typedef struct ts_plan_cache_stats {
    int64_t compiles, hits, misses, evictions;
    int cached;                 /* programs held now, the handle's own included */
    size_t bytes;               /* their own memory (not the shared state) */
    size_t own_bytes;           /* of these, the handle's own program's (the full shape's) */
    size_t largest_bytes;       /* the largest program's */
    size_t state_bytes;         /* the shared parameters, gradients and state: once */
    double compile_seconds;     /* spent compiling buckets */
    double real, padded;        /* elements fed: real ones, and padding (ts_plan_cache_note) */
    int64_t cur_batch, cur_seq; /* the bucket the handle runs now */
} ts_plan_cache_stats;

/* The handle `plan` was compiled for (batch, seq); limit_bytes 0: no limit. */
ts_status ts_plan_cache_new(ts_plan *plan, int64_t batch, int64_t seq, size_t limit_bytes,
                            ts_plan_build_fn build, void *user, ts_plan_cache **out);
/* The handle runs bucket (batch, seq) from now on (a hit, or a miss that
 * compiles it). */
ts_status ts_plan_cache_select(ts_plan_cache *c, int64_t batch, int64_t seq);
/* Compiles bucket (batch, seq) now unless cached (shape.precompile); the
 * handle keeps its program. */
ts_status ts_plan_cache_precompile(ts_plan_cache *c, int64_t batch, int64_t seq);
/* A step fed `real` elements in a bucket of `total` (padding share). */
void ts_plan_cache_note(ts_plan_cache *c, double real, double total);
void ts_plan_cache_get_stats(const ts_plan_cache *c, ts_plan_cache_stats *out);
/* Gives the handle its own program back and frees the others. */
void ts_plan_cache_free(ts_plan_cache *c);

#endif
