/* Checkpoints and resume: a save every ckpt.every steps and the last one,
 * ZeRO ranks' savers of their optimizer-state blocks, and loading a
 * verified checkpoint into a fresh plan. See session_internal.h and
 * docs/checkpoints.md. */
#include <string.h>
#include "core/core.h"
#include "session/pipe_train.h"
#include "session/ranks.h"
#include "session/session_internal.h"

ts_ckpt_meta ts_sess_ckpt_meta(const session *s, int64_t step) {
    ts_ckpt_meta meta = {s->ident,
                         s->ident_bytes,
                         s->lineage,
                         s->n_lineage,
                         s->loader ? ts_loader_position(s->loader) : step,
                         s->loader ? ts_loader_epoch(s->loader) : 0};
    return meta;
}

/* Begin a checkpoint of the state after `step` (written in the background
 * unless ckpt.async is off). */
ts_status ts_sess_save_checkpoint(session *s, int64_t step) {
    ts_ckpt_meta meta = ts_sess_ckpt_meta(s, step);
    /* The manifest names the data by its hashes: they must be in. */
    ts_status st = ts_sess_lineage_settle(s, 1);
    if (st == TS_OK) st = ts_ckpt_saver_begin(s->sv, s->plan, &meta);
    if (st == TS_OK && !s->c.ckpt.async) st = ts_ckpt_saver_wait(s->sv);
    if (st != TS_OK) {
        ts_error_prefix("checkpoint at step %lld", (long long)step);
        return st;
    }
    s->r->checkpoints++;
    return TS_OK;
}

/* ZeRO checkpoints: every rank saves its block of the optimizer state, and
 * rank 0 tells this launch's shards from leftovers by a number all agree
 * on (docs/checkpoints.md, "Sharded optimizer state"). Gradient
 * compression: every rank saves its residual rows the same way. */
ts_status ts_sess_shard_saver(session *s) {
    /* pipeline stages with ZeRO-1: the replicas' blocks go to rank 0's
     * whole-model plan instead (ts_sess_pipe_sync), which rank 0 saves */
    if (s->nranks < 2 || (!s->c.dist.zero && !s->c.dist.compress) || s->c.ckpt.every <= 0 ||
        s->c.pipe.stages > 1)
        return TS_OK;
    ts_status st = ts_session_ckpt_group(s->o->comm, &s->ckpt_group);
    if (st != TS_OK || s->rank == 0 || !s->o->shard_dir) return st;
    ts_ckpt_options co = ts_ckpt_options_default();
    co.rank = s->rank;
    co.world = s->nranks;
    co.group = s->ckpt_group;
    co.rank_timeout_s = s->c.dist.timeout_s;
    return ts_ckpt_saver_new(s->o->shard_dir, s->plan, &co, &s->sv);
}

/* Load the verified checkpoint into the freshly compiled plan: the config
 * must be the one it was saved with (up to the keys ts_sess_identity() leaves
 * out), then values, step count and the loader's position. Nothing is
 * written anywhere yet. */
ts_status ts_sess_resume(session *s) {
    ts_ckpt_info in;
    ts_status st = ts_ckpt_get_info(s->ck, &in);
    if (st != TS_OK) return st;
    snprintf(s->ck_dir, sizeof s->ck_dir, "%s", in.dir);
    snprintf(s->ck_id, sizeof s->ck_id, "%s", in.id);
    snprintf(s->ck_config, sizeof s->ck_config, "%s", in.config_sha256);
    if (in.config_sha256[0] && strcmp(in.config_sha256, s->ident_sha))
        return ts_fail(TS_ERR_INVALID,
                       "--resume: checkpoint %s was saved with config sha256 %s, this config's is "
                       "%s; only train.steps, train.epochs, train.log_every, train.eval_every, "
                       "train.threads, dist.max_restarts, dist.procs, dist.zero, dist.bucket_mb, "
                       "dist.share_params, dist.prefetch, dist.max_mem_mb, dist.timeout_s, output, "
                       "ckpt and observe may change on resume",
                       in.dir, in.config_sha256, s->ident_sha);
    if (in.step >= s->c.train.steps)
        return ts_fail(TS_ERR_INVALID,
                       "--resume: checkpoint %s is at step %lld and train.steps is %lld: nothing "
                       "to do (raise train.steps)",
                       in.dir, (long long)in.step, (long long)s->c.train.steps);
    /* A PEFT checkpoint holds the trainable tensors only; the frozen ones
     * came from peft.base (loaded already), which must be the same weights. */
    if (in.base_sha256[0] && strcmp(in.base_sha256, s->peft_base_sha))
        return ts_fail(TS_ERR_INVALID,
                       "--resume: checkpoint %s holds only the trainable tensors and refers to "
                       "the base %s (sha256 %s) for the %d frozen ones; %s%s%s%s",
                       in.dir, in.base_path, in.base_sha256, in.n_frozen,
                       s->peft_base_path[0] ? "peft.base " : "this run has no peft.base",
                       s->peft_base_path, s->peft_base_path[0] ? " has sha256 " : "",
                       s->peft_base_sha);
    /* a pipeline rank without the whole-model plan reads its stage's tensors */
    st = ts_sess_pipe_alias(s) ? ts_sess_pipe_restore(s) : ts_ckpt_restore(s->ck, s->plan, NULL);
    if (st != TS_OK) return st;
    /* gradient compression saved by another number of processes: the
     * residual rows were resharded (ts_ckpt_restore) */
    for (int i = 0; i < ts_ckpt_tensor_count(s->ck); i++) {
        ts_ckpt_tensor t;
        if (ts_ckpt_tensor_info(s->ck, i, &t) != TS_OK || strncmp(t.name, "compress.", 9) ||
            t.rank != 2 || t.dims[0] == s->nranks)
            continue;
        ts_progress_log(&s->pr,
                        "warning: %s holds the gradient-compression residuals of %lld processes; "
                        "each of the %d starts from their mean (not bit-exact with a run on %lld)",
                        in.dir, (long long)t.dims[0], s->nranks, (long long)t.dims[0]);
        break;
    }
    if (s->loader && (st = ts_loader_seek(s->loader, in.data_position)) != TS_OK) return st;
    s->start_step = in.step;
    s->r->resumed_step = in.step;
    return TS_OK;
}

/* The last save, also after Ctrl-C or a failed step (whose other ranks
 * may be gone: a ZeRO save stops waiting for them). */
ts_status ts_sess_last_save(session *s, ts_status st) {
    ts_session_result *r = s->r;
    if (s->sv) {
        if (st != TS_OK && s->nranks > 1) ts_ckpt_saver_cancel(s->sv);
        ts_status ws = ts_ckpt_saver_wait(s->sv);
        ts_ckpt_save_stats ss;
        if (ws != TS_OK) {
            if (st == TS_OK) {
                ts_error_prefix("saving a checkpoint");
                st = ws;
            } else {
                ts_progress_log(&s->pr, "tessel: error: saving a checkpoint: %s", ts_last_error());
            }
        } else if (r->checkpoints && ts_ckpt_saver_stats(s->sv, &ss) == TS_OK) {
            ts_progress_log(&s->pr,
                            "checkpoint %s/%s: %.1f MB, step stall %.1f ms, written in %.3f s "
                            "(%.0f MB/s)",
                            r->run_dir, ss.dir, (double)ss.bytes * 1e-6, ss.stall_s * 1e3,
                            ss.write_s, ss.throughput * 1e-6);
        }
    }
    return st;
}
