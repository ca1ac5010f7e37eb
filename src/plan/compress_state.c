/* The plan's gradient-compression state from outside the step: this
 * step's exchanged bytes (ts_plan_compress_stats) and the gathering of
 * every rank's residual rows before a checkpoint (ts_plan_compress_gather).
 * See src/ops/compress.c for the state's layout. */
#include <string.h>
#include "core/core.h"
#include "plan/plan.h"

ts_status ts_plan_compress_stats(const ts_plan *p, ts_compress_stats *out) {
    if (!p || !out) return ts_fail(TS_ERR_INVALID, "compress_stats: NULL argument");
    *out = p->rt.dist.cstats;
    return TS_OK;
}

ts_status ts_plan_compress_gather(ts_plan *p) {
    if (!p) return ts_fail(TS_ERR_INVALID, "compress_gather: NULL argument");
    ts_comm *c = p->prog.opt.comm;
    if (!p->prog.opt.compress.method || !c || ts_comm_size(c) < 2) return TS_OK;
    const int nr = ts_comm_size(c);
    for (int i = 0; i < p->prog.n_named; i++) {
        const ts_named *nm = &p->prog.named[i];
        if (nm->kind != TS_NAMED_STATE || strncmp(nm->name, "compress.", 9)) continue;
        const char *what = strrchr(nm->name, '.');
        if (strcmp(what, ".residual") && strcmp(what, ".velocity") && strcmp(what, ".error"))
            continue; /* PowerSGD's q: the same on every rank */
        if (nm->v.rank != 2 || nm->v.dims[0] != nr || nm->v.dtype != TS_F32)
            return ts_fail(TS_ERR_INTERNAL, "compress_gather: state '%s' is not [%d, n] f32",
                           nm->name, nr);
        /* rank r's block of ranks * n elements (ts_comm_block) is row r, in place */
        ts_status s =
            ts_allgather(c, NULL, ts_plan_at(p, nm->v.off), (size_t)(nm->v.dims[0] * nm->v.dims[1]),
                         TS_F32, (ts_coll_algo)p->prog.opt.dist_algo);
        if (s != TS_OK) {
            ts_error_prefix("gathering the compression state '%s'", nm->name);
            return s;
        }
    }
    return TS_OK;
}
