/* stages_ckpt.c — a stage's own checkpoints, RUN/stage-<s>/step-N (the
 * library path of session/stages.h; tessel train saves the logical model
 * instead, session/pipe_train.c). */
#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include "core/core.h"
#include "passes/partition.h"
#include "session/stages_internal.h"
#include "tessel/ckpt.h"

/* RUN/stage-<s>: every stage checkpoints its own plan there, in the
 * standard format (docs/checkpoints.md). */
static ts_status stage_dir(const ts_stage *st, const char *run_dir, char *out, size_t n) {
    if (!run_dir) return ts_fail(TS_ERR_INVALID, "pipeline: no run directory");
    if ((size_t)snprintf(out, n, "%s/stage-%d", run_dir, st->s) >= n)
        return ts_fail(TS_ERR_INVALID, "pipeline: run directory name too long: %s", run_dir);
    return TS_OK;
}

/* A ZeRO-1 stage's replicas each hold a block of the state: this
 * per-stage format has no place for them (tessel train saves the logical
 * model instead, gathering the blocks: pipe_train.c). */
static ts_status no_zero(const ts_stage *st, const char *what) {
    if (!st->group) return TS_OK;
    return ts_fail(TS_ERR_UNSUPPORTED,
                   "pipeline stage %d: %s of a stage with dist.zero 1 is not built (each replica "
                   "holds a block of the optimizer state): tessel train saves the logical model",
                   st->s, what);
}

ts_status ts_stage_save(ts_stage *st, const char *run_dir) {
    char dir[1024];
    ts_status s = no_zero(st, "ts_stage_save");
    if (s == TS_OK) s = stage_dir(st, run_dir, dir, sizeof dir);
    if (s != TS_OK) return s;
    if ((mkdir(run_dir, 0777) && errno != EEXIST) || (mkdir(dir, 0777) && errno != EEXIST))
        return ts_fail(TS_ERR_IO, "pipeline: cannot make %s: %s", dir, strerror(errno));
    /* the stage's ops, which a resumed stage must have too */
    const ts_partition_stage *ps = ts_partition_stage_at(st->part, st->s);
    char path[1100];
    snprintf(path, sizeof path, "%s/ops", dir);
    FILE *f = fopen(path, "w");
    if (!f || fprintf(f, "%d %d\n", ps->first_op, ps->n_ops) < 0 || fclose(f)) {
        if (f) fclose(f);
        return ts_fail(TS_ERR_IO, "pipeline: cannot write %s", path);
    }
    ts_ckpt_meta meta = {0};
    const ts_ckpt_options o = ts_ckpt_options_default();
    if ((s = ts_ckpt_save(st->plan, dir, &meta, &o)) != TS_OK)
        ts_error_prefix("pipeline stage %d (rank %d): saving into %s", st->s, st->s, dir);
    return s;
}

ts_status ts_stage_load(ts_stage *st, const char *run_dir) {
    char dir[1024];
    ts_status s = no_zero(st, "ts_stage_load");
    if (s == TS_OK) s = stage_dir(st, run_dir, dir, sizeof dir);
    if (s != TS_OK) return s;
    char path[1100];
    snprintf(path, sizeof path, "%s/ops", dir);
    FILE *f = fopen(path, "r");
    int first = -1, n = -1;
    if (!f || fscanf(f, "%d %d", &first, &n) != 2) {
        if (f) fclose(f);
        return ts_fail(TS_ERR_IO, "pipeline stage %d: %s is missing or unreadable", st->s, path);
    }
    fclose(f);
    const ts_partition_stage *ps = ts_partition_stage_at(st->part, st->s);
    if (first != ps->first_op || n != ps->n_ops)
        return ts_fail(TS_ERR_INVALID,
                       "pipeline stage %d (rank %d): the checkpoint in %s holds ops %d..%d, this "
                       "launch cut the stage at ops %d..%d (speeds measured at start differ from "
                       "run to run: give dist.devices a file to resume with the same cuts)",
                       st->s, st->s, dir, first, first + n - 1, ps->first_op,
                       ps->first_op + ps->n_ops - 1);
    if ((s = ts_ckpt_load(st->plan, dir, NULL, NULL)) != TS_OK)
        ts_error_prefix("pipeline stage %d (rank %d): resuming from %s", st->s, st->s, dir);
    return s;
}
