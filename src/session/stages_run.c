/* stages_run.c — one pipeline stage: its plan, its step over the
 * micro-batches in the schedule's order, the messages to its neighbours
 * (session/stages.h). */
#include "session/stages.h"
#include "session/stages_internal.h"
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include "core/core.h"
#include "dist/group.h"
#include "dist/repro_sum.h"
#include "passes/partition.h"
#include "passes/partition_graph.h"
#include "plan/micro.h"
#include "plan/stages.h"
#include "tessel/ckpt.h"
#include "tessel/compile.h"
#include <errno.h>
#include <sys/stat.h>

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

/* A buffer messages are sent from: in the comm's shared memory where it
 * has some, so the peer copies a message straight out of it while this
 * stage computes (dist/shm.c); ordinary memory when that is used up (the
 * message is then copied through the mailbox as this stage calls into the
 * comm). Freed with ts_comm_free. */
static void *send_buffer(ts_stage *st, size_t bytes) {
    void *p = ts_comm_alloc(st->comm, bytes);
    return p ? p : ts_aligned_alloc(bytes, "pipeline send buffer");
}

void ts_stage_free(ts_stage *st) {
    if (!st) return;
    ts_plan_free(st->plan);
    ts_comm_close(st->group); /* after the plan, whose collectives use it */
    ts_partition_free(st->part);
    free(st->ranges), free(st->stash);
    ts_comm_free(st->comm, st->act_send), ts_comm_free(st->comm, st->grad_send);
    free(st->reqs), free(st->pending);
    for (int i = 0; i < st->n_shared; i++) ts_comm_free(st->comm, st->shared[i].bufs);
    ts_stage_sum_free(st);
    ts_tree_sum_free(&st->dpsum);
    free(st->clip_v), free(st->clip_idx);
    ts_comm_free(st->comm, st->dp_buf);
    free(st->ev);
    free(st);
}

/* Which stages read each parameter: the later holder of a parameter two
 * stages share sends to the earlier. */
static ts_status find_shared(ts_stage *st, const ts_stage_model *sm) {
    for (int p = 0; p < ts_plan_param_count(st->plan); p++) {
        const char *name = ts_plan_param_name(st->plan, p);
        if (!strcmp(name, "pipe.in")) continue;
        int stages[TS_PIPE_MAX_STAGES];
        const int n = ts_partition_param_stages(sm->g, st->part, name, stages);
        if (n < 2) continue;
        if (n > 2)
            return ts_fail(TS_ERR_UNSUPPORTED,
                           "pipeline: parameter %s is read by %d stages; a parameter may be shared "
                           "by two stages at most (fewer dist.pipeline_stages)",
                           name, n);
        if (st->n_shared == MAX_SHARED)
            return ts_fail(TS_ERR_UNSUPPORTED, "pipeline: more than %d parameters shared by stages",
                           MAX_SHARED);
        shared_param *sp = &st->shared[st->n_shared++];
        snprintf(sp->name, sizeof sp->name, "%s", name);
        for (int s = 0; s < st->S; s++)
            if (stages[s] && s != st->s) sp->peer = s;
        sp->owner = st->s < sp->peer;
        char gname[160];
        snprintf(gname, sizeof gname, "grad:%s", name);
        sp->grad = ts_plan_value_at(st->plan, gname, &sp->bytes);
        if (!sp->grad)
            return ts_fail(TS_ERR_INTERNAL, "pipeline: no gradient %s in stage %d", gname, st->s);
        sp->bufs = send_buffer(st, sp->bytes * (sp->owner ? 1 : (size_t)st->M));
        if (!sp->bufs) return ts_fail(TS_ERR_NOMEM, "pipeline: out of memory for %s", name);
    }
    return TS_OK;
}

static ts_status setup(ts_stage *st, ts_stage_model *sm) {
    ts_graph *sg = NULL;
    ts_val loss;
    ts_status s = ts_partition_stage_graph(sm->g, sm->m.loss, st->part, st->s, &sg, &loss);
    if (s != TS_OK) return s;
    ts_train_spec spec = sm->spec;
    spec.loss = loss;
    spec.clip_grad_norm = 0; /* across the stages, before the update (stages_clip.c) */
    spec.trainable = NULL, spec.n_trainable = 0;
    /* A stage before the last runs its forward and its backward apart, so
     * its plan must compute pipe.out before anything reads pipe.grad: the
     * build order does (the backward is appended after the forward), the
     * memory-aware schedule may start the backward's gradient-only nodes
     * first. The order changes no value, only the memory peak. */
    ts_compile_options opt = sm->opt;
    if (!st->last) opt.naive_schedule = 1;
    /* pipe.out is what the next stage receives: an output the plan must keep */
    opt.discard_outputs = 0;
    if (st->group) {
        /* ZeRO-1 among the stage's replicas: every replica writes the
         * replicas' sum (replicas_sum) into its whole gradients, updates
         * its block of them with optimizer state for that block only, and
         * the plan all-gathers the parameters (passes/distribute.c,
         * "Summed gradients"); the update is elementwise, so the bits are
         * those of every replica updating everything */
        opt.comm = st->group;
        opt.zero = 1;
        opt.zero_summed_grads = 1;
        opt.zero_private_params = 1;
    }
    s = ts_compile(sg, &spec, &opt, &st->plan);
    ts_graph_free(sg);
    if (s != TS_OK) return s;
    st->n_ins = ts_plan_n_ins(st->plan);
    st->gate = ts_plan_gate_ins(st->plan);
    if (st->s > 0) {
        st->in_at = ts_plan_value_at(st->plan, "pipe.in", &st->in_bytes);
        size_t b = 0;
        st->gin_at = ts_plan_value_at(st->plan, "grad:pipe.in", &b);
        if (!st->in_at || !st->gin_at || b != st->in_bytes)
            return ts_fail(TS_ERR_INTERNAL, "pipeline: stage %d lacks pipe.in or its gradient",
                           st->s);
    }
    if (!st->last) {
        size_t b = 0;
        st->out_at = ts_plan_value_at(st->plan, "pipe.out", &st->out_bytes);
        st->gout_at = ts_plan_value_at(st->plan, "pipe.grad", &b);
        st->k = ts_plan_first_reader(st->plan, "pipe.grad");
        const int w = ts_plan_last_writer(st->plan, "pipe.out");
        if (!st->out_at || !st->gout_at || b != st->out_bytes || st->k < 0 || w >= st->k)
            return ts_fail(TS_ERR_INTERNAL,
                           "pipeline: stage %d's plan does not end its forward (instruction %d "
                           "writes pipe.out) before its backward starts (instruction %d)",
                           st->s, w, st->k);
        int n = 0;
        if ((s = ts_plan_read_ranges(st->plan, st->k, st->gate, "pipe.grad", NULL, 0, &n)) != TS_OK)
            return s;
        st->ranges = malloc((size_t)(n + 1) * sizeof *st->ranges);
        if (!st->ranges) return ts_fail(TS_ERR_NOMEM, "pipeline: out of memory");
        if ((s = ts_plan_read_ranges(st->plan, st->k, st->gate, "pipe.grad", st->ranges, n, &n)) !=
            TS_OK)
            return s;
        st->n_ranges = n;
        /* the received activation is a parameter, outside those regions */
        if (st->in_at) st->ranges[st->n_ranges++] = (ts_plan_range){st->in_at, st->in_bytes};
        for (int i = 0; i < st->n_ranges; i++) st->stash_bytes += st->ranges[i].bytes;
        /* with one micro-batch nothing runs between its forward and its
         * backward: nothing to save */
        st->n_slots = st->M > 1 ? ts_part_inflight(st->kind, st->S, st->M, st->s) : 0;
        st->stash = malloc(st->stash_bytes * (size_t)st->n_slots + 1);
        st->act_send = send_buffer(st, st->out_bytes * (size_t)st->M + 1);
        if (!st->stash || !st->act_send) return ts_fail(TS_ERR_NOMEM, "pipeline: out of memory");
    }
    if (st->s > 0 && !(st->grad_send = send_buffer(st, st->in_bytes * (size_t)st->M + 1)))
        return ts_fail(TS_ERR_NOMEM, "pipeline: out of memory");
    st->t.stash_bytes = st->stash_bytes;
    if ((s = ts_plan_grad_region(st->plan, &st->grad, &st->ngrad)) != TS_OK) return s;
    if ((s = find_shared(st, sm)) != TS_OK) return s;
    if ((s = ts_stage_sum_setup(st)) != TS_OK) return s;
    if ((s = ts_stage_clip_setup(st, sm->g, sm->spec.clip_grad_norm)) != TS_OK) return s;
    st->cap_pending = 4 * st->M + 2 * MAX_SHARED + 4 + st->D;
    st->reqs = calloc((size_t)st->cap_pending, sizeof *st->reqs);
    st->pending = calloc((size_t)st->cap_pending, sizeof *st->pending);
    /* per micro-batch at most: the forward's wait, run, send copy and
     * stash; the backward's wait, restore, run, send copy and sum; per
     * shared parameter a wait, a sum and a send copy more; then the
     * step's end */
    st->cap_ev = st->M * (10 + 3 * st->n_shared) + 4 * st->n_shared + 2 * st->D + 16;
    st->ev = malloc((size_t)st->cap_ev * sizeof *st->ev);
    if (!st->reqs || !st->pending || !st->ev)
        return ts_fail(TS_ERR_NOMEM, "pipeline: out of memory");
    return TS_OK;
}

ts_status ts_stage_new(ts_config *c0, ts_comm *comm, ts_stage **out) {
    if (!c0 || !comm || !out) return ts_fail(TS_ERR_INVALID, "pipeline: NULL argument");
    const int S = c0->pipe.stages, N = ts_comm_size(comm);
    if (S < 1 || N % S)
        return ts_fail(TS_ERR_INVALID,
                       "pipeline: %d processes for dist.pipeline_stages %d: the process count "
                       "must be the stage count times the data-parallel replicas",
                       N, S);
    const int D = N / S;
    if (c0->model.batch % ((int64_t)D * c0->pipe.microbatches))
        return ts_fail(TS_ERR_INVALID,
                       "pipeline: model.batch %lld does not divide into %d replicas x %d "
                       "micro-batches (dist.microbatches)",
                       (long long)c0->model.batch, D, c0->pipe.microbatches);
    if (c0->dist.zero > 1 || c0->dist.compress)
        return ts_fail(TS_ERR_UNSUPPORTED,
                       "pipeline: dist.%s inside a stage is not built (ZeRO-1 is: dist.zero 1 "
                       "shards a stage's optimizer state over its replicas): set it to %s",
                       c0->dist.compress ? "compress" : "zero", c0->dist.compress ? "none" : "1");
    /* each replica's stages see model.batch / D rows (its share of the batch) */
    ts_config cc = *c0, *c = &cc;
    c->model.batch /= D;
    ts_stage *st = calloc(1, sizeof *st);
    if (!st) return ts_fail(TS_ERR_NOMEM, "pipeline: out of memory");
    const int rank = ts_comm_rank(comm);
    st->comm = comm;
    st->s = rank % S, st->S = S, st->M = c->pipe.microbatches;
    st->d = rank / S, st->D = D, st->base = st->d * S;
    st->last = st->s == S - 1;
    st->kind = c->pipe.schedule ? TS_PIPE_GPIPE : TS_PIPE_1F1B;
    st->loss = NAN;
    /* every rank must cut the same way: measured speeds are exchanged, and
     * every replica cuts by replica 0's */
    ts_device_speed *devs = calloc((size_t)N, sizeof *devs), mine;
    const int measure = !strcmp(c->pipe.devices, "measure");
    ts_status s = devs ? TS_OK : ts_fail(TS_ERR_NOMEM, "pipeline: out of memory");
    if (s == TS_OK && measure && (s = ts_device_measure(c->train.threads, &mine)) == TS_OK) {
        snprintf(mine.name, sizeof mine.name, "rank%d", rank);
        s = ts_allgather(comm, &mine, devs, sizeof mine * (size_t)N, TS_U8, TS_ALGO_AUTO);
    }
    if (s == TS_OK && c->dist.zero == 1 && D > 1) { /* the stage's replicas */
        int *ranks = malloc(sizeof *ranks * (size_t)D);
        if (!ranks) s = ts_fail(TS_ERR_NOMEM, "pipeline: out of memory");
        for (int r = 0; r < D && s == TS_OK; r++) ranks[r] = r * S + st->s;
        if (s == TS_OK) s = ts_comm_group(comm, D, ranks, &st->group);
        free(ranks);
    }
    ts_stage_model sm = {0};
    if (s == TS_OK) s = ts_stage_partition(c, measure ? devs : NULL, S, &sm, &st->part);
    free(devs);
    if (s == TS_OK) s = setup(st, &sm);
    ts_graph_free(sm.g);
    if (s == TS_OK && D > 1) {
        const size_t bytes = st->ngrad * sizeof(float) * (size_t)D;
        if (!(st->dp_buf = send_buffer(st, bytes + 1)))
            s = ts_fail(TS_ERR_NOMEM, "pipeline: out of memory");
        else
            s = ts_tree_sum_init(&st->dpsum, st->ngrad);
        /* the shared gradients the micro-batch tree leaves out stay zero in
         * every replica's sum (the summed one arrives after) */
        if (st->dp_buf) memset(st->dp_buf, 0, bytes);
    }
    if (s != TS_OK) {
        ts_error_prefix("pipeline stage %d (rank %d)", st->s, rank);
        ts_stage_free(st);
        return s;
    }
    *out = st;
    return TS_OK;
}

/* Waits for one receive, keeping this step's sends going; names the stage
 * it waited for when that fails. */
static ts_status recv_from(ts_stage *st, int peer, int tag, void *buf, size_t bytes,
                           const char *what, int mb) {
    const double t0 = now();
    ts_comm_req r;
    ts_status s = ts_comm_irecv(st->comm, peer, tag, buf, bytes, &r);
    if (s == TS_OK) s = ts_comm_wait_progress(st->comm, &r, 1, st->pending, st->n_pending);
    const double t1 = now();
    st->t.wait += t1 - t0;
    static const char *const waits[] = {"",           "wait act", "wait grad",
                                        "wait share", "wait sum", "wait replica"};
    ts_stage_mark(st, waits[tag], mb, t0, t1);
    if (s != TS_OK)
        ts_error_prefix("pipeline stage %d (rank %d), step %lld, micro-batch %d: waiting for %s "
                        "from stage %d (rank %d)",
                        st->s, ts_stage_rank_of(st, st->s),
                        (long long)ts_plan_step_count(st->plan) + 1, mb, what, peer % st->S, peer);
    return s;
}

static ts_status send_to(ts_stage *st, int peer, int tag, const void *buf, size_t bytes) {
    if (st->n_pending == st->cap_pending)
        return ts_fail(TS_ERR_INTERNAL, "pipeline: more than %d sends in one step",
                       st->cap_pending);
    ts_comm_req *r = &st->reqs[st->n_pending];
    ts_status s = ts_comm_isend(st->comm, peer, tag, buf, bytes, r);
    if (s != TS_OK) return s;
    st->pending[st->n_pending++] = r;
    return TS_OK;
}

/* Runs instructions [lo, hi), on the timeline as `what` of micro-batch mb. */
static ts_status run(ts_stage *st, int lo, int hi, double *acc, const char *what, int mb) {
    const double t0 = now();
    ts_status s = ts_plan_run_range(st->plan, lo, hi);
    double d = now() - t0;
    if (st->slowdown > 1) {
        const double z = (st->slowdown - 1) * d;
        struct timespec ts = {(time_t)z, (long)((z - (double)(time_t)z) * 1e9)};
        nanosleep(&ts, NULL);
        d = now() - t0;
    }
    *acc += d;
    ts_stage_mark(st, what, mb, t0, t0 + d);
    return s;
}

void ts_stage_set_slowdown(ts_stage *st, double factor) {
    if (st) st->slowdown = factor;
}

static ts_status feed(ts_stage *st, int mb, int n, const char *const *names,
                      const void *const *data) {
    for (int i = 0; i < n; i++) {
        size_t bytes = 0;
        unsigned char *at = ts_plan_value_at(st->plan, names[i], &bytes);
        if (!at) continue;
        memcpy(at, (const unsigned char *)data[i] + (size_t)(st->d * st->M + mb) * bytes, bytes);
    }
    return TS_OK;
}

/* After micro-batch mb's backward: its input's gradient to the previous
 * stage, shared parameters' shares, then into the tree. */
static ts_status after_backward(ts_stage *st, int mb) {
    ts_status s = TS_OK;
    double t0 = now();
    if (st->s > 0) {
        unsigned char *b = st->grad_send + (size_t)mb * st->in_bytes;
        memcpy(b, st->gin_at, st->in_bytes);
        if ((s = send_to(st, ts_stage_rank_of(st, st->s - 1), TAG_GRAD, b, st->in_bytes)) != TS_OK)
            return s;
    }
    for (int i = 0; i < st->n_shared && s == TS_OK; i++) {
        shared_param *sp = &st->shared[i];
        if (!sp->owner) {
            unsigned char *b = sp->bufs + (size_t)mb * sp->bytes;
            memcpy(b, sp->grad, sp->bytes);
            s = send_to(st, ts_stage_rank_of(st, sp->peer), TAG_SHARE, b, sp->bytes);
        } else {
            ts_stage_mark(st, "send", mb, t0, now());
            s = recv_from(st, ts_stage_rank_of(st, sp->peer), TAG_SHARE, sp->bufs, sp->bytes,
                          "a shared parameter's gradient", mb);
            t0 = now();
            float *g = (float *)sp->grad;
            const float *o = (const float *)sp->bufs;
            if (s == TS_OK)
                for (size_t j = 0; j < sp->bytes / sizeof(float); j++) g[j] = g[j] + o[j];
            ts_stage_mark(st, "sum", mb, t0, now());
            t0 = now();
        }
    }
    ts_stage_mark(st, "send", mb, t0, now());
    t0 = now();
    if (s == TS_OK) s = ts_stage_sum_add(st, mb);
    ts_stage_mark(st, "sum", mb, t0, now());
    return s;
}

/* Data parallelism (D replicas of every stage): each replica's sum of its
 * M micro-batches goes to the other replicas of its stage, and every
 * replica adds the D sums in replica order. With M a power of two each sum
 * is a balanced subtree of M leaves, so the result is the tree one process
 * forms over the D x M micro-batches (replica d's are d*M .. d*M+M-1):
 * bit-identical. Otherwise the D sums are added as leaves, in the same
 * fixed order on every replica (deterministic, but not one process's). */
static ts_status replicas_sum(ts_stage *st) {
    const size_t n = st->ngrad;
    float *mine = st->dp_buf + (size_t)st->d * n; /* the tree's result (ts_stage_sum_add) */
    ts_status s = TS_OK;
    for (int r = 0; r < st->D && s == TS_OK; r++)
        if (r != st->d) s = send_to(st, r * st->S + st->s, TAG_REPLICA, mine, n * sizeof(float));
    for (int r = 0; r < st->D && s == TS_OK; r++)
        if (r != st->d)
            s = recv_from(st, r * st->S + st->s, TAG_REPLICA, st->dp_buf + (size_t)r * n,
                          n * sizeof(float), "a replica's gradients", st->M - 1);
    int level = 0;
    while ((1 << level) < st->M) level++;
    const int pow2 = (1 << level) == st->M;
    for (int r = 0; r < st->D && s == TS_OK; r++)
        s = pow2 ? ts_tree_sum_add_node(&st->dpsum, st->dp_buf + (size_t)r * n, level)
                 : ts_tree_sum_add(&st->dpsum, st->dp_buf + (size_t)r * n);
    if (s == TS_OK) s = ts_tree_sum_result(&st->dpsum, st->grad, (float)(st->M * st->D));
    return s;
}

static void stash(ts_stage *st, int mb, int save) {
    if (!st->n_slots) return;
    const double t0 = now();
    unsigned char *p = st->stash + (size_t)(mb % st->n_slots) * st->stash_bytes;
    for (int i = 0; i < st->n_ranges; i++) {
        if (save)
            memcpy(p, st->ranges[i].at, st->ranges[i].bytes);
        else
            memcpy(st->ranges[i].at, p, st->ranges[i].bytes);
        p += st->ranges[i].bytes;
    }
    ts_stage_mark(st, save ? "stash" : "restore", mb, t0, now());
}

static ts_status step(ts_stage *st, int n, const char *const *names, const void *const *data) {
    const double t0 = now();
    memset(&st->t, 0, sizeof st->t);
    st->t.start = t0;
    st->t.stash_bytes = st->stash_bytes;
    st->n_ev = 0;
    const double cpu0 = ts_stage_cpu_now();
    st->cpu_last = cpu0;
    st->n_pending = 0;
    ts_pipe_op ops[2 * 1024];
    if (st->M > 1024) return ts_fail(TS_ERR_INVALID, "pipeline: more than 1024 micro-batches");
    ts_pipe_order(st->kind, st->S, st->M, st->s, ops);
    double loss = 0;
    ts_status s = TS_OK;
    const uint64_t seed = ts_plan_seed(st->plan);
    for (int o = 0; o < 2 * st->M && s == TS_OK; o++) {
        const int mb = ops[o].mb;
        /* dropout's stream of micro-batch mb, as dist.reproducible's
         * (session/repro.c): the compile seed for the first */
        ts_plan_set_seed(st->plan, seed + (uint64_t)mb * 0x9E3779B97F4A7C15ULL);
        if (!ops[o].bwd) {
            if (st->s > 0)
                s = recv_from(st, ts_stage_rank_of(st, st->s - 1), TAG_ACT, st->in_at, st->in_bytes,
                              "an activation", mb);
            if (s == TS_OK) s = feed(st, mb, n, names, data);
            if (s != TS_OK) break;
            if (st->last) { /* its forward and backward at once */
                if ((s = run(st, 0, st->gate, &st->t.forward, "FB", mb)) != TS_OK) break;
                loss += ts_plan_loss_now(st->plan);
                s = after_backward(st, mb);
                continue;
            }
            if ((s = run(st, 0, st->k, &st->t.forward, "F", mb)) != TS_OK) break;
            const double tc = now();
            unsigned char *b = st->act_send + (size_t)mb * st->out_bytes;
            memcpy(b, st->out_at, st->out_bytes);
            ts_stage_mark(st, "send", mb, tc, now());
            if ((s = send_to(st, ts_stage_rank_of(st, st->s + 1), TAG_ACT, b, st->out_bytes)) !=
                TS_OK)
                break;
            stash(st, mb, 1);
        } else if (!st->last) {
            s = recv_from(st, ts_stage_rank_of(st, st->s + 1), TAG_GRAD, st->gout_at, st->out_bytes,
                          "an activation's gradient", mb);
            if (s != TS_OK) break;
            stash(st, mb, 0);
            if ((s = run(st, st->k, st->gate, &st->t.backward, "B", mb)) != TS_OK) break;
            s = after_backward(st, mb);
        }
    }
    /* the micro-batches' sum is done (the last backward's ts_stage_sum_add) */
    if (s == TS_OK && st->D > 1) {
        const double tsum = now();
        s = replicas_sum(st);
        ts_stage_mark(st, "sum", -1, tsum, now());
    }
    /* a shared parameter's summed gradient goes back to its other holder */
    for (int i = 0; i < st->n_shared && s == TS_OK; i++) {
        shared_param *sp = &st->shared[i];
        if (sp->owner) { /* from its receive buffer, free now */
            memcpy(sp->bufs, sp->grad, sp->bytes);
            s = send_to(st, ts_stage_rank_of(st, sp->peer), TAG_SHARED_SUM, sp->bufs, sp->bytes);
        } else
            s = recv_from(st, ts_stage_rank_of(st, sp->peer), TAG_SHARED_SUM, sp->grad, sp->bytes,
                          "a shared parameter's summed gradient", st->M - 1);
    }
    ts_plan_set_seed(st->plan, seed);
    const double tn = now();
    if (s == TS_OK) st->grad_sq = ts_stage_grad_sq_now(st);
    ts_stage_mark(st, "norm", -1, tn, now());
    /* clipping: its all-reduce after this step's messages are all through;
     * so the ZeRO-1 all-gathers, which run on the group's communication
     * thread over the same transport */
    if (s == TS_OK && (st->max_norm > 0 || st->group) && st->n_pending) {
        const double tw = now();
        s = ts_comm_wait(st->comm, st->reqs, st->n_pending);
        st->t.wait += now() - tw;
        ts_stage_mark(st, "wait sends", -1, tw, now());
        st->n_pending = 0;
    }
    const double tc = now();
    if (s == TS_OK) s = ts_stage_clip(st);
    if (st->max_norm > 0) ts_stage_mark(st, "clip", -1, tc, now());
    if (s == TS_OK) s = run(st, st->gate, st->n_ins, &st->t.update, "update", -1);
    if (s == TS_OK && st->n_pending) {
        const double tw = now();
        ts_comm_req *reqs = st->reqs;
        s = ts_comm_wait(st->comm, reqs, st->n_pending);
        st->t.wait += now() - tw;
        ts_stage_mark(st, "wait sends", -1, tw, now());
        if (s != TS_OK)
            ts_error_prefix("pipeline stage %d (rank %d), step %lld: sending to its neighbours",
                            st->s, ts_stage_rank_of(st, st->s),
                            (long long)ts_plan_step_count(st->plan) + 1);
    }
    if (s != TS_OK) return s;
    ts_plan_end_step(st->plan, 1);
    st->loss = st->last ? loss / st->M : NAN;
    st->t.step = now() - t0;
    st->t.cpu = ts_stage_cpu_now() - cpu0;
    return TS_OK;
}

ts_status ts_stage_step(ts_stage *st, int n, const char *const *names, const void *const *data) {
    if (!st || (n > 0 && (!names || !data)))
        return ts_fail(TS_ERR_INVALID, "pipeline: step with NULL arguments");
    /* A stage waits for its neighbours for up to a micro-batch's time, and
     * with fewer cores than processes (or other work on them) a wait that
     * keeps yielding takes CPU time the neighbour it waits for could use:
     * its waits nap once their short spin is over (50 us each, little
     * against a micro-batch). */
    const int naps = ts_comm_wait_naps(1);
    const ts_status s = step(st, n, names, data);
    ts_comm_wait_naps(naps);
    return s;
}
