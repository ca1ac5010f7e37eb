/* stages.h — running a plan's step in pieces, for pipeline stages
 * (src/session/stages_run.c): the forward of several micro-batches, then
 * their backwards, then one update.
 *
 *     int k = ts_plan_first_reader(p, "pipe.grad");  // where the backward starts
 *     ts_plan_range r[64]; int nr;
 *     ts_plan_read_ranges(p, k, ts_plan_gate_ins(p), "pipe.grad", r, 64, &nr);
 *     ts_plan_run_range(p, 0, k);                     // forward of micro-batch i
 *     ... save r's bytes, run other micro-batches, put them back ...
 *     ts_plan_run_range(p, k, ts_plan_gate_ins(p));   // its backward
 *     ts_plan_run_range(p, ts_plan_gate_ins(p), ts_plan_n_ins(p));  // the update
 *     ts_plan_end_step(p, 1);
 */
#ifndef TS_PLAN_STAGES_H
#define TS_PLAN_STAGES_H

#include <stddef.h>
#include "tessel/plan.h"
#include "tessel/status.h"

int ts_plan_n_ins(const ts_plan *p);
/* The first update-phase instruction (n_ins without one). */
int ts_plan_gate_ins(const ts_plan *p);
/* The first instruction reading the named value (or a view of it), or -1. */
int ts_plan_first_reader(const ts_plan *p, const char *name);
/* The last instruction writing the named value, or -1. */
int ts_plan_last_writer(const ts_plan *p, const char *name);

/* Runs instructions [lo, hi) of the current step (the step context as
 * ts_plan_step sets it; the update gate is not asked). */
ts_status ts_plan_run_range(ts_plan *p, int lo, int hi);
/* Ends a step run in ranges: step counters (updated: the update ran) and
 * the loss. */
void ts_plan_end_step(ts_plan *p, int updated);

/* A range of the arena outside the persistent regions, as memory. */
typedef struct ts_plan_range {
    unsigned char *at;
    size_t bytes;
} ts_plan_range;

/* The input, constant and temporary bytes instructions [lo, hi) read
 * before any of them writes those bytes, merged into ranges (the named
 * value `except` left out): what must be put back before they run if
 * other work used the arena in between (bytes the range writes first,
 * such as a backward's temporaries where the forward's values lay, need
 * not be). Fills up to max; *n may exceed max. */
ts_status ts_plan_read_ranges(const ts_plan *p, int lo, int hi, const char *except,
                              ts_plan_range *out, int max, int *n);

/* The loss as the arena holds it now (NaN without one). */
double ts_plan_loss_now(const ts_plan *p);

/* The memory and size of a named value. */
unsigned char *ts_plan_value_at(ts_plan *p, const char *name, size_t *bytes);

#endif
