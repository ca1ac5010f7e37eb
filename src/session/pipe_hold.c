/* pipe_hold.c — what a pipelined run's ranks hold (pipe_train.h): only
 * their stage, except rank 0's whole-model plan when the run needs the
 * logical weights there; a stage's values read from a checkpoint of the
 * logical model; every rank's memory for the log and the summary. */
#include <stdlib.h>
#include <string.h>
#include "core/core.h"
#include "plan/stages.h"
#include "session/pipe_train.h"

int ts_sess_pipe_whole_wanted(const session *s) {
    /* checkpoints and evaluation are rank 0's and read s->plan's values by
     * name; an after_step callback is handed s->plan */
    return s->c.ckpt.every > 0 || (s->val && s->val->n > 0) || s->test ||
           (s->o && s->o->after_step);
}

int ts_sess_pipe_holds_whole(const session *s) {
    return s->rank == 0 && ts_sess_pipe_whole_wanted(s);
}

int ts_sess_pipe_alias(const session *s) {
    return s->pipe && s->pipe->alias;
}

/* The checkpoint's tensor named name, or -1. */
static int find_tensor(const ts_ckpt *c, const char *name, ts_ckpt_tensor *t) {
    for (int i = 0; i < ts_ckpt_tensor_count(c); i++)
        if (ts_ckpt_tensor_info(c, i, t) == TS_OK && !strcmp(t->name, name)) return i;
    return -1;
}

/* One piece of a ZeRO-1 replica's optimizer state from the checkpoint's
 * logical tensor (write 0: only checked). */
typedef struct shard_read {
    session *s;
    const ts_ckpt_info *in;
    int stage, write;
    unsigned char *buf;
    size_t cap;
} shard_read;

static ts_status read_shard(void *user, const char *logical, unsigned char *at, size_t off,
                            size_t bytes) {
    shard_read *r = user;
    ts_ckpt_tensor t;
    if (find_tensor(r->s->ck, logical, &t) < 0 || !t.is_state)
        return ts_fail(TS_ERR_NOT_FOUND,
                       "%s: has no optimizer state '%s', which pipeline stage %d (rank %d) needs "
                       "for its ZeRO-1 block",
                       r->in->dir, logical, r->stage, r->s->rank);
    if (off + bytes > t.bytes)
        return ts_fail(TS_ERR_SHAPE,
                       "%s: optimizer state '%s' is %zu bytes, pipeline stage %d (rank %d) needs "
                       "bytes %zu..%zu of it",
                       r->in->dir, logical, t.bytes, r->stage, r->s->rank, off, off + bytes);
    if (!r->write) return TS_OK;
    if (t.bytes > r->cap) {
        free(r->buf);
        if (!(r->buf = malloc(t.bytes))) {
            r->cap = 0;
            return ts_fail(TS_ERR_NOMEM, "pipeline: out of memory reading %s", logical);
        }
        r->cap = t.bytes;
    }
    ts_status st = ts_ckpt_read(r->s->ck, logical, r->buf, t.bytes);
    if (st != TS_OK) {
        ts_error_prefix("pipeline stage %d (rank %d): reading %s", r->stage, r->s->rank,
                        r->in->dir);
        return st;
    }
    memcpy(at, r->buf + off, bytes);
    return TS_OK;
}

ts_status ts_sess_pipe_restore(session *s) {
    ts_plan *sp = ts_stage_plan(s->pipe->st);
    const int stage = ts_stage_index(s->pipe->st, NULL, NULL);
    ts_ckpt_info in;
    ts_status st = ts_ckpt_get_info(s->ck, &in);
    if (st != TS_OK) return st;
    if (in.seed != ts_plan_seed(sp))
        return ts_fail(TS_ERR_INVALID,
                       "%s: saved by a run with seed %llu, pipeline stage %d (rank %d) has seed "
                       "%llu: dropout masks would differ from the original run",
                       in.dir, (unsigned long long)in.seed, stage, s->rank,
                       (unsigned long long)ts_plan_seed(sp));
    /* every value is checked before the first byte is written */
    for (int pass = 0; pass < 2; pass++) {
        for (int i = 0; i < ts_plan_persistent_count(sp); i++) {
            ts_persistent pv;
            if ((st = ts_plan_persistent(sp, i, &pv)) != TS_OK) return st;
            if (!ts_sess_pipe_own_value(pv.name) || ts_sess_pipe_is_shard(pv.name)) continue;
            ts_ckpt_tensor t;
            if (find_tensor(s->ck, pv.name, &t) < 0)
                return ts_fail(TS_ERR_NOT_FOUND,
                               "%s: has no tensor '%s', which pipeline stage %d (rank %d) needs "
                               "(%s)",
                               in.dir, pv.name, stage, s->rank,
                               pv.is_state ? "optimizer state" : "parameter");
            int same = t.dtype == pv.dtype && t.rank == pv.rank && t.is_state == pv.is_state &&
                       t.bytes == pv.bytes;
            for (int d = 0; same && d < t.rank; d++) same = t.dims[d] == pv.dims[d];
            if (!same) {
                char a[128], b[128];
                ts_shape_str(a, sizeof a, t.dtype, t.rank, t.dims);
                ts_shape_str(b, sizeof b, pv.dtype, pv.rank, pv.dims);
                return ts_fail(TS_ERR_SHAPE,
                               "%s: tensor '%s' is %s %s, pipeline stage %d (rank %d) has %s %s",
                               in.dir, pv.name, t.is_state ? "state" : "param", a, stage, s->rank,
                               pv.is_state ? "state" : "param", b);
            }
            if (!pass) continue;
            size_t bytes = 0;
            unsigned char *at = ts_plan_value_at(sp, pv.name, &bytes);
            if (!at || bytes != pv.bytes)
                return ts_fail(TS_ERR_INTERNAL, "pipeline stage %d: no bytes for its value %s",
                               stage, pv.name);
            if ((st = ts_ckpt_read(s->ck, pv.name, at, bytes)) != TS_OK) {
                ts_error_prefix("pipeline stage %d (rank %d): reading %s", stage, s->rank, in.dir);
                return st;
            }
        }
    }
    /* ZeRO-1: this replica's blocks of the optimizer state, checked first */
    shard_read r = {s, &in, stage, 0, NULL, 0};
    if ((st = ts_sess_pipe_shards_each(sp, read_shard, &r)) == TS_OK) {
        r.write = 1;
        st = ts_sess_pipe_shards_each(sp, read_shard, &r);
    }
    free(r.buf);
    if (st != TS_OK) return st;
    ts_plan_set_step(sp, in.step);
    ts_plan_set_updates_applied(sp, in.updates_applied);
    return TS_OK;
}

static double arena_of(const ts_plan *p) {
    ts_plan_stats ps;
    return p && ts_plan_get_stats(p, &ps) == TS_OK ? (double)ps.arena_bytes : 0;
}

static double total(const double *m) {
    return m[0] + m[1] + m[2] + m[3];
}

/* per rank: stage arena, its buffers, whole plan, eval plan, the stage's
 * optimizer state (inside its arena), parameters */
enum { K = 6, KM = 5 /* kept in p->mem */ };

static double state_of(const ts_plan *p) {
    ts_plan_stats ps;
    return p && ts_plan_get_stats(p, &ps) == TS_OK ? (double)ps.state_bytes : 0;
}

ts_status ts_sess_pipe_memory(session *s) {
    struct ts_sess_pipe *p = s->pipe;
    const int N = s->nranks;
    double *v = calloc((size_t)N * K, sizeof *v);
    if (!v) return ts_fail(TS_ERR_NOMEM, "pipeline: out of memory");
    ts_plan *sp = ts_stage_plan(p->st);
    double *mine = v + (size_t)K * (size_t)s->rank;
    mine[0] = arena_of(sp);
    mine[1] = (double)ts_stage_buffer_bytes(p->st);
    mine[2] = p->alias ? 0 : arena_of(s->plan);
    mine[3] = arena_of(s->eval);
    mine[4] = state_of(sp);
    int d = 0;
    ts_stage_index(p->st, &d, NULL);
    mine[5] = d == 0 ? ts_stage_param_count(p->st) : 0;
    ts_status st = ts_allgather(s->o->comm, NULL, v, (size_t)K * (size_t)N, TS_F64, TS_ALGO_AUTO);
    if (st != TS_OK) {
        free(v);
        ts_error_prefix("pipeline: exchanging the ranks' memory");
        return st;
    }
    if (!(p->mem = malloc(sizeof(double) * KM * (size_t)N))) {
        free(v);
        return ts_fail(TS_ERR_NOMEM, "pipeline: out of memory");
    }
    s->model_params = 0;
    int worst = 0;
    for (int r = 0; r < N; r++) {
        memcpy(p->mem + KM * r, v + (size_t)K * (size_t)r, KM * sizeof(double));
        s->model_params += v[(size_t)K * (size_t)r + 5];
        if (total(p->mem + KM * r) > total(p->mem + KM * worst)) worst = r;
    }
    free(v);
    /* dist.max_mem_mb bounds what a process holds: its stage's arena (the
     * compile checked that alone), the buffers beside it and rank 0's
     * whole-model plans. Every rank sees every rank's need: all fail alike. */
    const double lim = s->c.dist.max_mem_mb, mib = 1024.0 * 1024.0, *m = p->mem + KM * worst;
    if (lim > 0 && total(m) > lim * mib) {
        char w[600], whole[160] = "";
        if (m[2] > 0 || m[3] > 0)
            snprintf(whole, sizeof whole,
                     ", the whole model's plans %.1f (training %.1f, evaluation %.1f: rank 0 "
                     "keeps them for ckpt.every and evaluation)",
                     (m[2] + m[3]) / mib, m[2] / mib, m[3] / mib);
        return ts_fail(TS_ERR_UNSUPPORTED,
                       "%s: dist.max_mem_mb: pipeline stage %d (rank %d) needs %.1f MiB (its "
                       "plan's arena %.1f, activations kept for the backward, messages and "
                       "gradient sums %.1f%s), more than dist.max_mem_mb = %g MiB; use more "
                       "dist.pipeline_stages or fewer dist.microbatches",
                       ts_config_key_origin(&s->c, "dist.max_mem_mb", w, sizeof w), worst % p->S,
                       worst, total(m) / mib, m[0] / mib, m[1] / mib, whole, lim);
    }
    return TS_OK;
}

json_t *ts_sess_pipe_memory_json(const session *s) {
    const struct ts_sess_pipe *p = s->pipe;
    const double mib = 1024.0 * 1024.0;
    json_t *a = json_array();
    for (int r = 0; a && p->mem && r < s->nranks; r++) {
        const double *m = p->mem + KM * r;
        json_array_append_new(
            a, json_pack("{s:i, s:i, s:f, s:f, s:f, s:f, s:f, s:f}", "rank", r, "stage", r % p->S,
                         "total_mib", (m[0] + m[1] + m[2] + m[3]) / mib, "stage_arena_mib",
                         m[0] / mib, "stage_buffers_mib", m[1] / mib, "whole_plan_mib", m[2] / mib,
                         "eval_plan_mib", m[3] / mib, "optimizer_state_mib", m[4] / mib));
    }
    return a;
}

void ts_sess_pipe_memory_log(session *s) {
    const struct ts_sess_pipe *p = s->pipe;
    const double mib = 1024.0 * 1024.0;
    char line[1024];
    size_t len = 0;
    for (int r = 0; p->mem && r < s->nranks && r < 8 && len < sizeof line - 200; r++) {
        const double *m = p->mem + KM * r;
        len += (size_t)snprintf(
            line + len, sizeof line - len,
            "%srank %d %.1f MiB (stage %d arena %.1f with optimizer state %.2f, buffers %.1f%s",
            r ? "; " : "", r, (m[0] + m[1] + m[2] + m[3]) / mib, r % p->S, m[0] / mib, m[4] / mib,
            m[1] / mib, m[2] > 0 || m[3] > 0 ? "" : ")");
        if (m[2] > 0 || m[3] > 0)
            len += (size_t)snprintf(line + len, sizeof line - len,
                                    ", whole-model plan %.1f, evaluation plan %.1f)", m[2] / mib,
                                    m[3] / mib);
    }
    ts_progress_log(&s->pr, "pipeline memory per process: %s%s", line,
                    s->nranks > 8 ? "; ..." : "");
}
