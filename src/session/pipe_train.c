/* pipe_train.c — tessel train driving pipeline stages (pipe_train.h). */
#include "session/pipe_train.h"
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include "core/core.h"
#include "plan/plan.h"
#include "plan/stages.h"
#include "session/stages.h"
#include "tessel/pipeline.h"

enum { TAG_SYNC_BYTES = 40, TAG_SYNC_DATA = 41 };

/* The origin of a key for messages ("config.yaml:12: dist.zero"). */
static const char *origin(const session *s, const char *key, char *buf, size_t n) {
    return ts_config_key_origin(&s->c, key, buf, n);
}

ts_status ts_sess_pipe_resolve(session *s) {
    const ts_config *c = &s->c;
    const int S = c->pipe.stages, N = s->nranks, M = c->pipe.microbatches;
    char w[600];
    if (N < S || N % S)
        return ts_fail(TS_ERR_INVALID,
                       "%s: dist.pipeline_stages %d runs one process per stage (or S x D for D "
                       "data-parallel replicas of every stage), this run has %d process%s: use "
                       "--procs %d (or mpirun -np %d)",
                       origin(s, "dist.pipeline_stages", w, sizeof w), S, N, N == 1 ? "" : "es", S,
                       S);
    const int D = N / S;
    if (c->model.batch % ((int64_t)M * D))
        return ts_fail(TS_ERR_INVALID,
                       "%s: dist.microbatches: model.batch %lld does not divide into %d replica%s "
                       "x %d micro-batches "
                       "(dist.microbatches): each micro-batch is model.batch / (replicas x "
                       "dist.microbatches) rows",
                       origin(s, "dist.microbatches", w, sizeof w), (long long)c->model.batch, D,
                       D == 1 ? "" : "s", M);
    struct {
        int set;
        const char *key, *why;
    } no[] = {
        {c->dist.zero > 1, "dist.zero",
         "ZeRO-2 and ZeRO-3 inside a stage's data-parallel group are not built (ZeRO-1 is: "
         "dist.zero 1 shards a stage's optimizer state over its replicas): set dist.zero 1 or 0"},
        {c->dist.compress != 0, "dist.compress",
         "gradient compression between a stage's replicas is not built: set dist.compress none"},
        {c->optim.fused_update, "optim.fused_update",
         "the stages sum each micro-batch's gradients after its backward; a fused update frees "
         "them within it: set it to false"},
        {c->peft.targets[0] || c->peft.adapter_after[0], "peft.lora.targets",
         "PEFT's frozen base is not cut into stages yet"},
        {c->data.source == TS_CFG_GRAPH, "data.source",
         "a graph's edges are an input the stages do not feed"},
        {c->dist.reproducible && c->dist.microbatch && c->dist.microbatch * M * D != c->model.batch,
         "dist.microbatch",
         "the stages' micro-batches are model.batch / (replicas x dist.microbatches) rows; with "
         "dist.reproducible set dist.microbatch to that (or leave it unset)"},
    };
    for (size_t i = 0; i < sizeof no / sizeof no[0]; i++)
        if (no[i].set)
            return ts_fail(TS_ERR_UNSUPPORTED,
                           "%s: %s is not supported with dist.pipeline_stages %d: %s",
                           origin(s, no[i].key, w, sizeof w), no[i].key, S, no[i].why);
    s->nslices = M * D;
    return TS_OK;
}

ts_status ts_sess_pipe_setup(session *s) {
    struct ts_sess_pipe *p = ts_zalloc(sizeof *p, "pipeline");
    if (!p) return TS_ERR_NOMEM;
    s->pipe = p;
    p->S = s->c.pipe.stages, p->D = s->nranks / p->S, p->M = s->c.pipe.microbatches;
    p->bubble = p->overhead = p->grad_norm = NAN;
    ts_config c = s->c;
    if (c.train.threads == 0) c.train.threads = s->threads; /* auto: ts_sess_resolve_threads */
    ts_status st = ts_stage_new(&c, s->o->comm, &p->st);
    if (st != TS_OK) return st;
    if (!s->plan) { /* no whole-model plan on this rank: the stage's is the session's */
        s->plan = ts_stage_plan(p->st);
        p->alias = 1;
    }
    if ((st = ts_sess_pipe_memory(s)) != TS_OK) return st;
    ts_partition_predict(ts_stage_partition_of(p->st), &p->pred_step, &p->pred_bubble);
    if (ts_plan_loss_scale(ts_stage_plan(p->st), NULL, NULL, NULL)) {
        char w[600];
        return ts_fail(TS_ERR_UNSUPPORTED,
                       "%s: loss scaling is not supported with dist.pipeline_stages (the stages "
                       "would have to agree on skipping a step): set precision.loss_scale none "
                       "or precision.default fp32/bf16",
                       origin(s, "precision.loss_scale", w, sizeof w));
    }
    return TS_OK;
}

int ts_sess_pipe_own_value(const char *name) {
    return !strstr(name, "pipe.in") && strncmp(name, "pipe.", 5) != 0;
}

/* A ZeRO-1 replica's block of optimizer state from the same tensors of
 * the whole-model plan (piece by piece, ts_sess_pipe_shards_each). */
static ts_status shard_from_whole(void *user, const char *logical, unsigned char *at, size_t off,
                                  size_t bytes) {
    size_t b = 0;
    const unsigned char *from = ts_plan_value_at(user, logical, &b);
    if (!from || off + bytes > b)
        return ts_fail(
            TS_ERR_INTERNAL,
            "pipeline: the whole model's plan has no optimizer state %s (bytes %zu..%zu) "
            "for a stage's ZeRO-1 block",
            logical, off, off + bytes);
    memcpy(at, from + off, bytes);
    return TS_OK;
}

ts_status ts_sess_pipe_load(session *s) {
    /* a stage-only rank has its values already: initialised by name as
     * one process's, or read from the checkpoint (ts_sess_pipe_restore) */
    if (s->pipe->alias) return TS_OK;
    ts_plan *sp = ts_stage_plan(s->pipe->st);
    for (int i = 0; i < ts_plan_persistent_count(sp); i++) {
        ts_persistent v;
        ts_status st = ts_plan_persistent(sp, i, &v);
        if (st != TS_OK) return st;
        if (!ts_sess_pipe_own_value(v.name) || ts_sess_pipe_is_shard(v.name)) continue;
        size_t b = 0, sb = 0;
        unsigned char *to = ts_plan_value_at(sp, v.name, &sb);
        const unsigned char *from = ts_plan_value_at(s->plan, v.name, &b);
        if (!to || !from || b != sb)
            return ts_fail(TS_ERR_INTERNAL,
                           "pipeline stage %d (rank %d): its value %s (%zu bytes) has no "
                           "counterpart in the whole model's plan (%zu bytes)",
                           ts_stage_index(s->pipe->st, NULL, NULL), s->rank, v.name, sb, b);
        memcpy(to, from, b);
    }
    ts_status st = ts_sess_pipe_shards_each(sp, shard_from_whole, s->plan);
    if (st != TS_OK) return st;
    ts_plan_set_step(sp, ts_plan_step_count(s->plan));
    ts_plan_set_updates_applied(sp, ts_plan_updates_applied(s->plan));
    return TS_OK;
}

/* A stage's values as one message: per value (or piece of one) its name's
 * length, name, byte offset in the value, byte count and bytes. */
typedef struct packer {
    unsigned char *b; /* NULL: only count */
    uint64_t o;
} packer;

static ts_status put(void *user, const char *name, unsigned char *at, size_t off, size_t bytes) {
    packer *k = user;
    const uint32_t len = (uint32_t)strlen(name);
    const uint64_t o = off, nb = at ? bytes : 0;
    if (k->b) {
        unsigned char *b = k->b + k->o;
        memcpy(b, &len, 4);
        memcpy(b + 4, name, len);
        memcpy(b + 4 + len, &o, 8);
        memcpy(b + 12 + len, &nb, 8);
        if (nb) memcpy(b + 20 + len, at, nb);
    }
    k->o += 20 + len + nb;
    return TS_OK;
}

/* shards_only: a replica after the first sends only its blocks of the
 * optimizer state (ZeRO-1); its parameters are replica 0's. */
static ts_status pack(ts_plan *sp, int shards_only, unsigned char **out, uint64_t *n) {
    *out = NULL;
    for (int pass = 0; pass < 2; pass++) {
        packer k = {pass ? *out : NULL, 0};
        for (int i = 0; i < ts_plan_persistent_count(sp) && !shards_only; i++) {
            ts_persistent v;
            ts_status st = ts_plan_persistent(sp, i, &v);
            if (st != TS_OK) return st;
            if (!ts_sess_pipe_own_value(v.name) || ts_sess_pipe_is_shard(v.name)) continue;
            size_t bytes = 0;
            unsigned char *at = ts_plan_value_at(sp, v.name, &bytes);
            put(&k, v.name, at, 0, bytes);
        }
        ts_status st = ts_sess_pipe_shards_each(sp, put, &k);
        if (st != TS_OK) return st;
        *n = k.o;
        if (!pass && !(*out = malloc(k.o + 1))) return ts_fail(TS_ERR_NOMEM, "pipeline: no memory");
    }
    return TS_OK;
}

static ts_status unpack(session *s, const unsigned char *b, uint64_t n, int from) {
    for (uint64_t o = 0; o < n;) {
        uint32_t len;
        uint64_t off, nb;
        memcpy(&len, b + o, 4);
        char name[512];
        if (len >= sizeof name || o + 20 + len > n)
            return ts_fail(TS_ERR_INTERNAL, "pipeline: a bad value message from rank %d", from);
        memcpy(name, b + o + 4, len);
        name[len] = 0;
        memcpy(&off, b + o + 4 + len, 8);
        memcpy(&nb, b + o + 12 + len, 8);
        size_t bytes = 0;
        unsigned char *to = ts_plan_value_at(s->plan, name, &bytes);
        if (!to || off + nb > bytes || o + 20 + len + nb > n)
            return ts_fail(TS_ERR_INTERNAL,
                           "pipeline: rank %d's value %s (bytes %llu..%llu) has no counterpart "
                           "in the whole model's plan",
                           from, name, (unsigned long long)off, (unsigned long long)(off + nb));
        memcpy(to + off, b + o + 20 + len, nb);
        o += 20 + len + nb;
    }
    return TS_OK;
}

/* Replica 0's stages send their values to rank 0 in stage order, and with
 * ZeRO-1 the other replicas their blocks of the optimizer state, in rank
 * order; a parameter two stages hold is the same bits in both (they take
 * the same update), so the later copy overwrites it with itself. */
ts_status ts_sess_pipe_sync(session *s) {
    struct ts_sess_pipe *p = s->pipe;
    if (!ts_sess_pipe_whole_wanted(s)) return TS_OK; /* rank 0 keeps no whole-model plan */
    ts_comm *comm = s->o->comm;
    ts_plan *sp = ts_stage_plan(p->st);
    const int senders = ts_sess_pipe_zero(s) ? s->nranks : p->S;
    unsigned char *buf = NULL;
    uint64_t n = 0;
    ts_status st = TS_OK;
    if (s->rank == 0) {
        if ((st = pack(sp, 0, &buf, &n)) == TS_OK) st = unpack(s, buf, n, 0);
        for (int t = 1; t < senders && st == TS_OK; t++) {
            free(buf), buf = NULL;
            ts_comm_req r;
            if ((st = ts_comm_irecv(comm, t, TAG_SYNC_BYTES, &n, 8, &r)) == TS_OK)
                st = ts_comm_wait(comm, &r, 1);
            if (st == TS_OK && !(buf = malloc(n + 1)))
                st = ts_fail(TS_ERR_NOMEM, "pipeline: out of memory for rank %d's values", t);
            if (st == TS_OK && (st = ts_comm_irecv(comm, t, TAG_SYNC_DATA, buf, n, &r)) == TS_OK)
                st = ts_comm_wait(comm, &r, 1);
            if (st != TS_OK)
                ts_error_prefix("pipeline: collecting stage %d's weights from rank %d", t % p->S,
                                t);
            else
                st = unpack(s, buf, n, t);
        }
        if (st == TS_OK) {
            ts_plan_set_step(s->plan, ts_plan_step_count(sp));
            ts_plan_set_updates_applied(s->plan, ts_plan_updates_applied(sp));
        }
    } else if (s->rank < senders) {
        ts_comm_req r[2];
        if ((st = pack(sp, s->rank >= p->S, &buf, &n)) == TS_OK &&
            (st = ts_comm_isend(comm, 0, TAG_SYNC_BYTES, &n, 8, &r[0])) == TS_OK &&
            (st = ts_comm_isend(comm, 0, TAG_SYNC_DATA, buf, n, &r[1])) == TS_OK)
            st = ts_comm_wait(comm, r, 2);
        if (st != TS_OK)
            ts_error_prefix("pipeline stage %d (rank %d): sending its weights to rank 0",
                            s->rank % p->S, s->rank);
    }
    free(buf);
    return st;
}

ts_status ts_sess_pipe_step(session *s, double *loss) {
    struct ts_sess_pipe *p = s->pipe;
    const char *names[2] = {s->in_name, s->tgt_name};
    const void *data[2] = {s->bx, s->by};
    ts_status st = ts_stage_step(p->st, 2, names, data);
    if (st != TS_OK) return st;
    int d = 0;
    const int t = ts_stage_index(p->st, &d, NULL);
    ts_stage_times tm;
    ts_stage_last_times(p->st, &tm);
    /* per rank: its loss (last stages), its squared norm (replica 0), busy,
     * waiting and step seconds; added up in rank order, the same on every
     * rank */
    enum { K = 5 };
    const int N = s->nranks;
    double *v = malloc(sizeof(double) * K * (size_t)N);
    if (!v) return ts_fail(TS_ERR_NOMEM, "pipeline: out of memory");
    double *mine = v + K * s->rank;
    mine[0] = t == p->S - 1 ? ts_stage_loss(p->st) : 0;
    mine[1] = d == 0 ? ts_stage_grad_sq(p->st) : 0;
    mine[2] = tm.forward + tm.backward + tm.update;
    mine[3] = tm.wait;
    mine[4] = tm.step;
    st = ts_allgather(s->o->comm, NULL, v, K * (size_t)N, TS_F64, TS_ALGO_AUTO);
    if (st == TS_OK) {
        double l = 0, sq = 0, busy = 0, wait = 0, own = 0, step = 0;
        for (int r = 0; r < N; r++) {
            l += v[K * r], sq += v[K * r + 1], busy += v[K * r + 2], wait += v[K * r + 3];
            own += v[K * r + 4];
            if (v[K * r + 4] > step) step = v[K * r + 4];
        }
        *loss = l / p->D;
        p->grad_norm = sqrt(sq);
        /* The bubble: the share of the ranks' time (the slowest rank's step
         * each) spent waiting for a message or for the slowest rank; the
         * overhead: the rest outside the kernels (saving and restoring
         * activations, copies into send buffers, the gradient sums). */
        const double all = (double)N * step;
        p->bubble = all > 0 ? (wait + all - own) / all : NAN;
        p->overhead = all > 0 ? (own - busy - wait) / all : NAN;
        if (isfinite(p->bubble))
            p->bubble_sum += p->bubble, p->overhead_sum += p->overhead, p->n_bubble++;
        ts_plan_set_step(s->plan, ts_plan_step_count(ts_stage_plan(p->st)));
    } else {
        ts_error_prefix("pipeline stage %d (rank %d): exchanging the step's loss", t, s->rank);
    }
    free(v);
    return st;
}

double ts_sess_pipe_grad_norm(const session *s) {
    return s->pipe ? s->pipe->grad_norm : NAN;
}

void ts_sess_pipe_json(const session *s, char *buf, size_t n) {
    buf[0] = 0;
    if (!s->pipe) return;
    char b1[32];
    char b2[32];
    snprintf(buf, n, ",\"bubble\":%s,\"bubble_predicted\":%.6g,\"pipeline_overhead\":%s",
             num(s->pipe->bubble, b1, sizeof b1), s->pipe->pred_bubble,
             num(s->pipe->overhead, b2, sizeof b2));
}

json_t *ts_sess_pipe_summary(const session *s) {
    const struct ts_sess_pipe *p = s->pipe;
    const double n = (double)p->n_bubble;
    return json_pack("{s:i, s:i, s:i, s:s, s:o, s:o, s:f, s:f, s:o}", "stages", p->S, "replicas",
                     p->D, "microbatches", p->M, "schedule", s->c.pipe.schedule ? "gpipe" : "1f1b",
                     "bubble_mean", n > 0 ? json_real(p->bubble_sum / n) : json_null(),
                     "overhead_mean", n > 0 ? json_real(p->overhead_sum / n) : json_null(),
                     "bubble_predicted", p->pred_bubble, "step_predicted_s", p->pred_step, "memory",
                     ts_sess_pipe_memory_json(s));
}

ts_status ts_sess_pipe_alerts(session *s) {
    const char *r = s->c.alerts.rules;
    if (r[0] && strcmp(r, "none") != 0) {
        char w[600];
        return ts_fail(TS_ERR_UNSUPPORTED,
                       "%s: alerts.rules is not supported with dist.pipeline_stages %d: the "
                       "gradient monitors alerts read are not computed across stages yet",
                       origin(s, "alerts.rules", w, sizeof w), s->c.pipe.stages);
    }
    /* the runner without rules: the run's loop and files as usual */
    s->pipe->defaults_off = s->c.alerts.defaults;
    s->c.alerts.defaults = 0;
    /* a stage's plan has no monitors and runs the steps: no runner (its
     * update gate would run there) */
    if (s->pipe->alias) return TS_OK;
    return ts_sess_alerts_setup(s);
}

void ts_sess_pipe_log(session *s) {
    const struct ts_sess_pipe *p = s->pipe;
    const ts_partition *part = ts_stage_partition_of(p->st);
    char cuts[256] = "";
    size_t len = 0;
    for (int t = 0; t < p->S && len < sizeof cuts - 40; t++) {
        const ts_partition_stage *ps = ts_partition_stage_at(part, t);
        len += (size_t)snprintf(cuts + len, sizeof cuts - len, "%sops %d..%d", t ? ", " : "",
                                ps->first_op, ps->first_op + ps->n_ops - 1);
    }
    ts_progress_log(&s->pr,
                    "pipeline: %d stages x %d replica%s (%d processes, %s), %d micro-batches of "
                    "%lld rows, %s; stages %s; predicted bubble %.1f %%%s",
                    p->S, p->D, p->D == 1 ? "" : "s", s->nranks, ts_comm_transport(s->o->comm),
                    p->M, (long long)(s->c.model.batch / ((int64_t)p->M * p->D)),
                    s->c.pipe.schedule ? "gpipe" : "1f1b", cuts, 100 * p->pred_bubble,
                    p->defaults_off ? "; the default alerts are not run under stages" : "");
    ts_sess_pipe_memory_log(s);
}

ts_status ts_sess_pipe_observe(session *s, int64_t step) {
    struct ts_sess_pipe *p = s->pipe;
    if (!p) return TS_OK;
    static const char *const names[2] = {"tessel_pipeline_bubble",
                                         "tessel_pipeline_bubble_predicted"};
    static const char *const help[2] = {
        "share of the ranks' last step time spent outside their stage's kernels",
        "bubble share the cost model predicts for the schedule"};
    const double v[2] = {p->bubble, p->pred_bubble};
    ts_status st = TS_OK;
    if (s->tm_made) {
        for (int i = 0; i < 2 && st == TS_OK; i++)
            if (!p->gauge[i])
                st = ts_metrics_gauge(s->tm.reg, names[i], help[i], 0, NULL, &p->gauge[i]);
        for (int i = 0; i < 2 && st == TS_OK; i++) st = ts_metric_set(p->gauge[i], v[i]);
    }
    if (st == TS_OK && s->tb) {
        static const char *const tags[2] = {"pipeline/bubble", "pipeline/bubble_predicted"};
        st = ts_tfevents_scalars(s->tb, step, 2, tags, v);
    }
    return st;
}

void ts_sess_pipe_explain(const session *s, ts_status st) {
    char map[320] = "";
    size_t len = 0;
    const int S = s->pipe->S;
    for (int r = 0; r < s->nranks && r < 8 && len < sizeof map; r++)
        len += (size_t)snprintf(map + len, sizeof map - len, "%srank %d runs pipeline stage %d",
                                r ? ", " : "", r, r % S);
    char msg[1600];
    snprintf(msg, sizeof msg, "%s (%s%s%s)", ts_last_error(), map, s->nranks > 8 ? ", ..." : "",
             s->pipe->D > 1 ? "; its replica is rank / stages" : "");
    ts_fail(st, "%s", msg);
}

void ts_sess_pipe_free(session *s) {
    if (!s->pipe) return;
    if (s->pipe->alias) { /* the stage frees its plan */
        ts_plan_set_trace(s->plan, NULL);
        s->plan = NULL;
    }
    free(s->pipe->mem);
    ts_stage_free(s->pipe->st);
    free(s->pipe);
    s->pipe = NULL;
}
