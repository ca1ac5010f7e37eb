/* The plan's gradient-compression state from outside the step: this
 * step's exchanged bytes (ts_plan_compress_stats) and the gathering of
 * which state values are one rank's row of a checkpointed [ranks, n]
 * tensor (ts_plan_compress_row).
 * See src/ops/compress.c for the state's layout. */
#include <string.h>
#include "core/core.h"
#include "plan/plan.h"

ts_status ts_plan_compress_stats(const ts_plan *p, ts_compress_stats *out) {
    if (!p || !out) return ts_fail(TS_ERR_INVALID, "compress_stats: NULL argument");
    *out = p->rt.dist.cstats;
    return TS_OK;
}

int ts_plan_compress_row(const ts_plan *p, const char *name, int *rank, int *world) {
    if (!p || !name) return 0;
    ts_comm *c = p->prog.opt.comm;
    if (!p->prog.opt.compress.method || !c || ts_comm_size(c) < 2 || strncmp(name, "compress.", 9))
        return 0;
    const char *what = strrchr(name, '.');
    if (strcmp(what, ".residual") && strcmp(what, ".velocity") && strcmp(what, ".error"))
        return 0; /* PowerSGD's q: the same on every rank */
    const ts_named *nm = ts_plan_find(p, name);
    if (!nm || nm->kind != TS_NAMED_STATE || nm->v.rank != 1 || nm->v.dtype != TS_F32) return 0;
    if (rank) *rank = ts_comm_rank(c);
    if (world) *world = ts_comm_size(c);
    return 1;
}
