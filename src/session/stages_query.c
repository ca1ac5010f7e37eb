/* stages_query.c — what a pipeline stage tells about itself after a step:
 * its loss, times and timeline, the memory beside its plan, its share of
 * the parameters and of the gradient norm (session/stages.h). */
#include <math.h>
#include <string.h>
#include "dist/repro_sum.h"
#include "plan/stages.h"
#include "session/stages.h"
#include "session/stages_internal.h"

double ts_stage_loss(const ts_stage *st) {
    return st ? st->loss : NAN;
}
ts_plan *ts_stage_plan(ts_stage *st) {
    return st ? st->plan : NULL;
}
const ts_partition *ts_stage_partition_of(const ts_stage *st) {
    return st ? st->part : NULL;
}
void ts_stage_last_times(const ts_stage *st, ts_stage_times *t) {
    *t = st->t;
}
int ts_stage_timeline(const ts_stage *st, const ts_stage_event **events) {
    *events = st ? st->ev : NULL;
    return st ? st->n_ev : 0;
}
size_t ts_stage_buffer_bytes(const ts_stage *st) {
    if (!st) return 0;
    const size_t M = (size_t)st->M;
    size_t b = st->stash_bytes * (size_t)st->n_slots;
    if (st->act_send) b += st->out_bytes * M;
    if (st->grad_send) b += st->in_bytes * M;
    for (int i = 0; i < st->n_shared; i++) b += st->shared[i].bytes * (st->shared[i].owner ? 1 : M);
    const size_t g = st->ngrad * sizeof(float);
    /* the micro-batch tree, over the pieces it sums (stages_sum.c) */
    if (st->M > 1) b += (size_t)ts_tree_sum_buffers(st->M) * st->nsum * sizeof(float);
    if (st->D > 1) b += (size_t)ts_tree_sum_buffers(st->D) * g;
    if (st->D > 1) b += (size_t)st->D * st->ngrad * sizeof(float); /* dp_buf */
    return b;
}
double ts_stage_param_count(const ts_stage *st) {
    double n = 0;
    for (int p = 0; st && p < ts_plan_param_count(st->plan); p++) {
        const char *name = ts_plan_param_name(st->plan, p);
        if (!strncmp(name, "pipe.", 5)) continue;
        int skip = 0;
        for (int i = 0; i < st->n_shared; i++)
            if (!st->shared[i].owner && !strcmp(st->shared[i].name, name)) skip = 1;
        int rank = 0;
        int64_t dims[TS_MAX_RANK];
        if (skip || ts_plan_value_info(st->plan, name, NULL, &rank, dims) != TS_OK) continue;
        double e = 1;
        for (int d = 0; d < rank; d++) e *= (double)dims[d];
        n += e;
    }
    return n;
}
double ts_stage_grad_sq(const ts_stage *st) {
    return st ? st->grad_sq : NAN;
}
int ts_stage_index(const ts_stage *st, int *replica, int *replicas) {
    if (replica) *replica = st->d;
    if (replicas) *replicas = st->D;
    return st->s;
}
