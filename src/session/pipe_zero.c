/* pipe_zero.c — ZeRO-1 inside a pipeline stage (dist.zero 1 with
 * replicas, pipe_train.h): a replica's plan holds its block of the stage's
 * optimizer state in "zero.bucket<b>.<what>" values, which cut across
 * parameters (ts_plan_shard_layout). These turn them into pieces of the
 * logical tensors "<param>.<what>" a run without ZeRO has, and back, so
 * checkpoints and rank 0's whole-model plan keep the usual layout. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "core/core.h"
#include "plan/stages.h"
#include "session/pipe_train.h"

int ts_sess_pipe_zero(const session *s) {
    return s->pipe && s->c.dist.zero == 1 && s->pipe->D > 1;
}

int ts_sess_pipe_is_shard(const char *name) {
    return !strncmp(name, "zero.bucket", 11);
}

/* The pieces of sp's state values that belong to the model (pipe.in's
 * state left out), and the bytes of one element. */
static ts_status pieces(ts_plan *sp, ts_shard_piece **out, int *n) {
    ts_status st = ts_plan_shard_layout(sp, out, n);
    if (st != TS_OK) return st;
    int k = 0;
    for (int i = 0; i < *n; i++)
        if (ts_sess_pipe_own_value((*out)[i].param)) (*out)[k++] = (*out)[i];
    *n = k;
    return TS_OK;
}

static size_t elem_bytes(ts_plan *sp, const char *state) {
    ts_dtype dt;
    int rank = 0;
    int64_t dims[TS_MAX_RANK];
    return ts_plan_value_info(sp, state, &dt, &rank, dims) == TS_OK ? ts_dtype_size(dt) : 0;
}

ts_status ts_sess_pipe_shards_each(ts_plan *sp, ts_sess_pipe_piece_fn fn, void *user) {
    ts_shard_piece *pc = NULL;
    int n = 0;
    ts_status st = pieces(sp, &pc, &n);
    for (int i = 0; i < n && st == TS_OK; i++) {
        const size_t es = elem_bytes(sp, pc[i].state);
        size_t bytes = 0;
        unsigned char *at = ts_plan_value_at(sp, pc[i].state, &bytes);
        if (!es || !at || (size_t)(pc[i].state_off + pc[i].count) * es > bytes) {
            st = ts_fail(TS_ERR_INTERNAL,
                         "pipeline: the ZeRO state value %s has no piece %lld..%lld", pc[i].state,
                         (long long)pc[i].state_off, (long long)(pc[i].state_off + pc[i].count));
            break;
        }
        char name[512];
        snprintf(name, sizeof name, "%s.%s", pc[i].param, pc[i].what);
        st = fn(user, name, at + (size_t)pc[i].state_off * es, (size_t)pc[i].param_off * es,
                (size_t)pc[i].count * es);
    }
    free(pc);
    return st;
}
