/* dist.reproducible: micro-batched steps summed in a fixed tree. See
 * repro.h and docs/reproducibility.md. */
#include "session/repro.h"
#include <math.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include "core/core.h"
#include "dist/repro_gather.h"
#include "dist/repro_sum.h"
#include "frontend/config.h"
#include "plan/micro.h"
#include "plan/stages.h"
#include "session/repro_norm.h"
#include "tessel/ckpt.h"
#include "tessel/dist.h"
#include "tessel/tessel.h"
#include "tessel/util.h"
#include <jansson.h>

enum { MAX_FWD_STATES = 256 };

struct ts_repro {
    int64_t m, M, k; /* rows per micro-batch, micro-batches per batch, per rank */
    int N, rank;
    int local;  /* ranks hold runs of micro-batches; the plan has no all-reduce (repro.h) */
    int scaled; /* fp16 loss scaling: the skip decision is made on the summed gradients */
    ts_comm *comm;
    volatile sig_atomic_t *stop; /* the session's stop flag (NULL: none), carried by the finish */
    float *grad;                 /* the plan's gradient region */
    size_t ngrad;
    float *bound;  /* where the backward pass writes the gradients now: grad, or a leaf's slot */
    int inplace;   /* each round's backward pass writes into its leaf's slot (no copy) */
    int split;     /* ... and the ranks finish the tree a slice each, into a shared result */
    float *sum;    /* where the batch's summed gradients are after the step: grad, or that result */
    size_t lo, hi; /* split: this rank's slice of the gradients */
    void *parts;   /* split: the norm's chunk lanes, shared */
    ts_tree_sum gsum, ssum;     /* gradients (per round), forward state (per round) */
    ts_repro_gather ggat, sgat; /* the same, local: this rank's run of micro-batches */
    ts_plan_fwd_state *st;      /* state the forward pass writes (BatchNorm) */
    int nst;
    ts_plan_fwd_state *gt; /* the gradients, by name: the norm's order in every plan */
    int ngt;
    ts_repro_norm norm; /* the logged norm of gt, fed as the tree's last pass writes them */
    double gnorm;       /* ... its value after the step, when gnorm_ok */
    int gnorm_ok;
    size_t nstate;         /* floats of all of them */
    float *s0, *leaf;      /* the state before the step; one round's, summed */
    double *loss, *losses; /* this rank's k losses; all M (rank-major) */
    int64_t j;             /* the round the gate is asked in */
    uint64_t seed;
    ts_update_gate_fn next_fn;
    void *next_user;
};

int ts_repro_zero(const session *s) {
    return s->c.dist.reproducible && s->nranks > 1 && (s->c.dist.zero == 1 || s->c.dist.zero == 2);
}

int ts_repro_local(const session *s) {
    /* Every process count: each rank runs its run of consecutive micro-batches on a plan
     * without an all-reduce, and the tree is finished once per step (repro_gather.h: one
     * all-reduce where the runs are the tree's aligned blocks, else an all-gather of pieces).
     * An all-reduce per round (the plan's) moved the gradients k times per step instead of
     * once; with loss scaling it would also add scaled gradients, which rounds otherwise for
     * a scale that is not a power of two; with ZeRO-1/2 the shard updates read the sums. */
    return s->c.dist.reproducible && s->nranks > 1;
}

ts_status ts_repro_resolve(session *s) {
    const ts_config *c = &s->c;
    s->nslices = s->nranks;
    if (!c->dist.reproducible) return TS_OK;
    const int64_t B = c->model.batch, N = s->nranks;
    int64_t m = c->dist.microbatch;
    if (m == 0) m = B % 4 == 0 ? B / 4 : B % 2 == 0 ? B / 2 : B;
    if (m > B || B % m)
        return ts_fail(TS_ERR_INVALID,
                       "dist.microbatch %lld does not divide model.batch %lld: every batch is cut "
                       "into micro-batches of dist.microbatch rows",
                       (long long)m, (long long)B);
    const int64_t M = B / m;
    if (M % N) {
        char allowed[256] = "";
        size_t len = 0;
        for (int64_t n = 1; n <= M && len < sizeof allowed - 24; n++)
            if (M % n == 0)
                len += (size_t)snprintf(allowed + len, sizeof allowed - len, "%s%lld",
                                        n > 1 ? ", " : "", (long long)n);
        return ts_fail(TS_ERR_INVALID,
                       "dist.reproducible: %lld processes cannot share the %lld micro-batches of "
                       "%lld rows (model.batch %lld, dist.microbatch): the process count must "
                       "divide the micro-batch count; allowed: %s",
                       (long long)N, (long long)M, (long long)m, (long long)B, allowed);
    }
    if (N > 1 && c->dist.zero == 3)
        return ts_fail(TS_ERR_UNSUPPORTED,
                       "dist.reproducible does not support dist.zero 3: the fixed tree needs "
                       "each micro-batch's whole gradient, and ZeRO-3 keeps only a shard of "
                       "the gradients and parameters. Set dist.zero 1 or 2 (the optimizer "
                       "state sharded; the gradients stay whole) or 0");
    if (N > 1 && c->dist.compress)
        return ts_fail(TS_ERR_UNSUPPORTED,
                       "dist.reproducible does not support dist.compress (its top-k and PowerSGD "
                       "sums depend on the process count): set dist.compress none");
    if (c->optim.fused_update)
        return ts_fail(TS_ERR_UNSUPPORTED,
                       "dist.reproducible sums the micro-batches' gradients after their steps; "
                       "optim.fused_update applies (and frees) each gradient within the step: "
                       "set optim.fused_update false");
    if (c->shape.policy == 1)
        return ts_fail(TS_ERR_UNSUPPORTED,
                       "dist.reproducible does not support shape.policy bucket yet (padded "
                       "micro-batches): set shape.policy exact");
    s->nslices = (int)M;
    return TS_OK;
}

static void state_copy(struct ts_repro *r, float *dst, int to_plan) {
    size_t o = 0;
    for (int i = 0; i < r->nst; i++) {
        if (to_plan)
            memcpy(r->st[i].data, dst + o, r->st[i].n * sizeof(float));
        else
            memcpy(dst + o, r->st[i].data, r->st[i].n * sizeof(float));
        o += r->st[i].n;
    }
}

/* The update gate, asked after every round's backward pass: the round's
 * gradients and forward state go into the trees; the update is skipped
 * until the last round, which writes the batch's gradients and state into
 * the plan and asks the gate behind this one. */
/* With loss scaling, the batch's skip decision: a non-finite value in the
 * summed (unscaled) gradients, the same floats on every process count. A
 * leaf's inf or NaN survives the tree, and so does a sum that overflows. */
static void found_inf(ts_plan *p, const struct ts_repro *r) {
    if (!r->scaled) return;
    int found = 0;
    for (size_t i = 0; i < r->ngrad; i++) found |= !isfinite(r->sum[i]);
    ts_plan_set_found_inf(p, found);
}

/* The gate of a local plan: the round's gradients and state are this rank's
 * micro-batch's, summed in its pieces of the tree; the last round finishes
 * the tree with the other ranks' pieces. */
static ts_status gate_local(ts_plan *p, struct ts_repro *r, ts_gate_decision *out) {
    ts_status st = ts_repro_gather_add(&r->ggat, r->bound);
    /* the round's loss travels with its leaf (the split finish's first meeting; the loss is in
     * the plan until the step ends, which reads it from the same place) */
    if (r->split) ts_repro_gather_put_scalar(&r->ggat, r->j, ts_plan_loss_now(p));
    if (st == TS_OK && r->nstate) {
        state_copy(r, r->leaf, 0);
        if ((st = ts_repro_gather_add(&r->sgat, r->leaf)) == TS_OK) state_copy(r, r->s0, 1);
    }
    if (st != TS_OK) return st;
    if (r->j < r->k - 1) {
        *out = TS_GATE_SKIP;
        return TS_OK;
    }
    /* split: every rank folds its slice, feeding the norm's shared chunk lanes on the way; the
     * update reads the shared result (bound at setup) */
    ts_repro_norm_reset(&r->norm);
    if (r->split) ts_repro_gather_put_flag(&r->ggat, r->stop && *r->stop);
    st = r->split ? ts_repro_gather_result_split(&r->ggat, r->comm, r->lo, r->hi)
                  : ts_repro_gather_result(&r->ggat, r->comm, r->grad);
    if (st != TS_OK) return st;
    r->gnorm = ts_repro_norm_result(&r->norm);
    r->gnorm_ok = 1;
    if (r->nstate) {
        if ((st = ts_repro_gather_result(&r->sgat, r->comm, r->leaf)) != TS_OK) return st;
        state_copy(r, r->leaf, 1);
    }
    found_inf(p, r);
    *out = TS_GATE_APPLY;
    return r->next_fn ? r->next_fn(p, r->next_user, out) : TS_OK;
}

/* One process (more: gate_local): the tree over its M rounds. */
static ts_status gate(ts_plan *p, void *user, ts_gate_decision *out) {
    struct ts_repro *r = user;
    if (r->local) return gate_local(p, r, out);
    ts_status st = TS_OK;
    const int last = r->j == r->k - 1;
    /* the last round's leaf goes in with the tree's result (ts_tree_sum_finish: one pass) */
    if (r->k > 1)
        st = last ? ts_tree_sum_finish(&r->gsum, r->grad, r->grad, (float)r->k)
                  : ts_tree_sum_add(&r->gsum, r->grad);
    if (st != TS_OK) return st;
    if (r->nstate) {
        state_copy(r, r->leaf, 0);
        st = last ? ts_tree_sum_finish(&r->ssum, r->leaf, r->leaf, (float)r->M)
                  : ts_tree_sum_add(&r->ssum, r->leaf);
        if (st != TS_OK) return st;
        state_copy(r, last ? r->leaf : r->s0, 1); /* the next round starts from the step's */
    }
    if (!last) {
        *out = TS_GATE_SKIP;
        return TS_OK;
    }
    found_inf(p, r);
    *out = TS_GATE_APPLY;
    return r->next_fn ? r->next_fn(p, r->next_user, out) : TS_OK;
}

static void norm_block(void *user, const float *block, size_t off, size_t len) {
    ts_repro_norm_block(user, block, off, len);
}

static int by_name(const void *a, const void *b) {
    return strcmp(((const ts_plan_fwd_state *)a)->name, ((const ts_plan_fwd_state *)b)->name);
}

/* The gradients sorted by name, each once: ZeRO lays them out in bucket order, without it in
 * parameter order, and the logged norm must not depend on which. */
static ts_status grad_tensors(struct ts_repro *r, ts_plan *p) {
    const int n = ts_plan_grads(p, NULL, 0);
    if (n <= 0) return ts_fail(TS_ERR_INVALID, "dist.reproducible: the plan has no f32 gradients");
    if (!(r->gt = ts_alloc(sizeof *r->gt * (size_t)n, "gradient list"))) return TS_ERR_NOMEM;
    ts_plan_grads(p, r->gt, n);
    int k = 0;
    for (int i = 0; i < n; i++) {
        int seen = 0;
        for (int j = 0; j < k && !seen; j++) seen = r->gt[j].data == r->gt[i].data;
        if (!seen) r->gt[k++] = r->gt[i];
    }
    qsort(r->gt, (size_t)k, sizeof *r->gt, by_name);
    r->ngt = k;
    return TS_OK;
}

ts_status ts_repro_setup(session *s) {
    if (!s->c.dist.reproducible) return TS_OK;
    struct ts_repro *r = ts_zalloc(sizeof *r, "reproducible step");
    if (!r) return TS_ERR_NOMEM;
    s->rp = r;
    r->N = s->nranks;
    r->rank = s->rank;
    r->local = ts_repro_local(s);
    r->scaled = ts_plan_loss_scale(s->plan, NULL, NULL, NULL);
    r->comm = s->o->comm;
    r->stop = s->o->stop;
    r->M = s->nslices;
    r->m = s->c.model.batch / r->M;
    r->k = r->M / r->N;
    r->seed = ts_plan_seed(s->plan);
    ts_status st = ts_plan_grad_region(s->plan, &r->grad, &r->ngrad);
    if (st != TS_OK) return st;
    const int nst = ts_plan_fwd_states(s->plan, NULL, 0);
    if (nst < 0) return TS_ERR_UNSUPPORTED; /* the message is set */
    if (nst > MAX_FWD_STATES)
        return ts_fail(TS_ERR_UNSUPPORTED,
                       "dist.reproducible: %d state values written by the "
                       "forward pass (at most %d)",
                       nst, MAX_FWD_STATES);
    if (nst && !(r->st = ts_alloc(sizeof *r->st * (size_t)nst, "forward state list")))
        return TS_ERR_NOMEM;
    r->nst = ts_plan_fwd_states(s->plan, r->st, nst);
    if ((st = grad_tensors(r, s->plan)) != TS_OK ||
        (st = ts_repro_norm_init(&r->norm, r->gt, r->ngt, r->grad, r->ngrad)) != TS_OK)
        return st;
    for (int i = 0; i < r->nst; i++) r->nstate += r->st[i].n;
    if (r->nstate && (!(r->s0 = ts_alloc(r->nstate * sizeof(float), "forward state")) ||
                      !(r->leaf = ts_alloc(r->nstate * sizeof(float), "forward state"))))
        return TS_ERR_NOMEM;
    if (!(r->loss = ts_alloc(sizeof(double) * (size_t)r->k, "micro-batch losses")) ||
        !(r->losses = ts_alloc(sizeof(double) * (size_t)r->M, "micro-batch losses")))
        return TS_ERR_NOMEM;
    if ((st = ts_tree_sum_init(&r->gsum, r->ngrad)) != TS_OK ||
        (st = ts_tree_sum_init(&r->ssum, r->nstate)) != TS_OK)
        return st;
    if (r->local &&
        ((st = ts_repro_gather_init(&r->ggat, r->comm, r->N, r->rank, r->M, r->ngrad)) != TS_OK ||
         (st = ts_repro_gather_init(&r->sgat, r->comm, r->N, r->rank, r->M, r->nstate)) != TS_OK))
        return st;
    /* the norm read from the gradients as the tree's result is written (one pass fewer) */
    if (r->local) ts_repro_gather_observe(&r->ggat, norm_block, &r->norm);
    /* Each round's backward pass writes its leaf's slot in the block the ranks share: no copy
     * out of the plan's region before the next round overwrites it, and the tree's finish is
     * one pass over all the leaves (repro_gather.h). With ZeRO too: its plan's collectives and
     * shard updates come after the gate, reading the plan's own region. The binding is checked
     * here, once. */
    r->bound = r->grad;
    r->inplace = r->local && ts_repro_gather_leaf(&r->ggat, 0) &&
                 ts_plan_bind_grads(s->plan, r->grad, r->grad) == TS_OK;
    /* The tree's finish split between the ranks (each adds the leaves of its slice of the
     * gradients, once, into a result all of them read): the update phase is bound to that result
     * for good, where it only reads the gradients (plan/micro.h); else each rank adds all leaves
     * into its own region. */
    float *res = ts_repro_gather_shared_result(&r->ggat);
    r->sum = r->grad;
    if (r->inplace && res) {
        /* the norm's chunk lanes, which each rank writes for the chunks of its slice (collective:
         * every rank gets here, or none) */
        st = ts_comm_alloc_shared(r->comm, (ts_repro_norm_chunks(&r->norm) + 1) * sizeof(double[8]),
                                  &r->parts);
        if (st == TS_ERR_NOMEM) r->parts = NULL, st = TS_OK;
        if (st != TS_OK) return st;
    }
    r->split = r->parts && ts_plan_bind_update_grads(s->plan, r->grad, res) == TS_OK;
    if (r->split) {
        r->sum = res;
        ts_repro_norm_share(&r->norm, r->parts);
        /* this rank's slice, cut where the norm's chunks allow: the neighbours cut at the same
         * offsets, so the slices cover the gradients once */
        ts_repro_gather_slice(&r->ggat, &r->lo, &r->hi);
        if (r->rank > 0) r->lo = ts_repro_norm_cut(&r->norm, r->lo);
        if (r->rank + 1 < r->N) r->hi = ts_repro_norm_cut(&r->norm, r->hi);
    }
    /* In front of the alerts' gate (or none), which is asked once per
     * batch, after the last round, with the batch's gradients in place. */
    ts_plan_get_update_gate(s->plan, &r->next_fn, &r->next_user);
    ts_plan_set_update_gate(s->plan, gate, r);
    return TS_OK;
}

/* The dropout stream of micro-batch i: the compile seed for the first (so
 * one micro-batch per batch is the plain step), mixed with i after. */
static uint64_t seed_of(uint64_t seed, int64_t i) {
    return seed + (uint64_t)i * 0x9E3779B97F4A7C15ULL;
}

/* The backward pass writes the gradients at `to` from now on (plan/micro.h). */
static ts_status bind(ts_plan *p, struct ts_repro *r, float *to) {
    if (r->bound == to) return TS_OK;
    ts_status st = ts_plan_bind_grads(p, r->bound, to);
    if (st == TS_OK) r->bound = to;
    return st;
}

ts_status ts_repro_step(session *s, double *loss, int *stop) {
    struct ts_repro *r = s->rp;
    *stop = -1;
    ts_plan *p = s->plan;
    const int64_t done = ts_plan_step_count(p), applied = ts_plan_updates_applied(p);
    ts_status st = TS_OK;
    if (r->nstate) state_copy(r, r->s0, 0);
    r->gnorm_ok = 0;
    /* The step waits for the other ranks at its end (the tree's finish, the alerts' agreement,
     * the losses' all-gather where they do not travel with the leaves) with nothing else to do:
     * naps, so a rank sharing the core runs meanwhile (the split finish's meetings nap anyway). */
    const int naps = ts_comm_wait_naps(1);
    if (r->inplace) st = ts_repro_gather_ready(&r->ggat);
    for (int64_t j = 0; j < r->k && st == TS_OK; j++) {
        /* this rank's micro-batch of round j: the j-th of its run */
        const int64_t i = r->rank * r->k + j;
        st = ts_plan_set_input(p, s->in_name, (const char *)s->bx + (size_t)i * s->xb, s->xb);
        if (st == TS_OK)
            st = ts_plan_set_input(p, s->tgt_name, (const char *)s->by + (size_t)i * s->yb, s->yb);
        if (st == TS_OK && r->inplace) st = bind(p, r, ts_repro_gather_leaf(&r->ggat, j));
        /* the alerts read the monitors of the last round only: the others skip them */
        if (st == TS_OK) st = ts_plan_hold_monitors(p, j < r->k - 1);
        if (st != TS_OK) break;
        /* A round is not a step: the step count, the learning rate and the
         * optimizer's t stay those of the batch. */
        ts_plan_set_step(p, done);
        ts_plan_set_updates_applied(p, applied);
        ts_plan_set_seed(p, seed_of(r->seed, i));
        ts_plan_scaler_hold(p, j < r->k - 1); /* the scale changes after the batch only */
        r->j = j;
        st = ts_plan_step(p);
        r->loss[j] = ts_plan_loss(p);
    }
    const ts_status back = bind(p, r, r->grad);
    if (st == TS_OK) st = back;
    ts_plan_hold_monitors(p, 0);
    ts_plan_set_seed(p, r->seed);
    ts_plan_scaler_hold(p, 0);
    /* every micro-batch's loss: with the leaves on the split path (no meeting of its own), else
     * all-gathered */
    if (st == TS_OK && r->split)
        memcpy(r->losses, ts_repro_gather_scalars(&r->ggat), sizeof(double) * (size_t)r->M);
    else if (st == TS_OK && r->N > 1)
        st = ts_allgather(r->comm, r->loss, r->losses, (size_t)r->M, TS_F64, TS_ALGO_AUTO);
    ts_comm_wait_naps(naps);
    if (st != TS_OK) return st;
    if (r->N == 1) {
        memcpy(r->losses, r->loss, sizeof(double) * (size_t)r->k);
    }
    if (r->split) *stop = ts_repro_gather_flags(&r->ggat) != 0;
    /* In micro-batch order: the ranks' runs, rank-major, are it. */
    double sum = 0;
    for (int64_t i = 0; i < r->M; i++) sum += r->losses[i];
    *loss = sum / (double)r->M;
    return TS_OK;
}

ts_status ts_repro_grad_norm(struct ts_repro *r, double *norm) {
    if (!r || !norm) return ts_fail(TS_ERR_INVALID, "grad_norm: NULL argument");
    /* Taken as the step's last pass wrote the gradients (the update only reads them), else a
     * pass of its own (one process; a step that failed) */
    if (!r->gnorm_ok && r->split)
        return ts_fail(TS_ERR_INVALID, "grad_norm: the step did not finish its gradients");
    *norm = r->gnorm_ok ? r->gnorm : ts_repro_norm_now(&r->norm);
    return TS_OK;
}

void ts_repro_waits(const struct ts_repro *r, char *buf, size_t n) {
    const ts_meet_stats *own = r && r->split ? ts_repro_gather_waits(&r->ggat) : NULL;
    if (n) buf[0] = 0;
    if (!own) return;
    size_t len = 0;
    ts_catf(buf, n, &len, "dist.reproducible: 2 meetings a step, waited at");
    for (int q = 0; q < r->N; q++) {
        ts_meet_stats w;
        ts_meet_peer_stats(&r->ggat.meet, q, &w);
        if (q == r->rank) w = *own;
        ts_catf(buf, n, &len, "%s rank %d %llu of %llu (%.1f ms, %llu naps)", q ? "," : "", q,
                (unsigned long long)w.late, (unsigned long long)w.meets, 1e3 * w.wait_s,
                (unsigned long long)w.naps);
    }
}

void ts_repro_sync_grads(struct ts_repro *r) {
    if (r && r->split) memcpy(r->grad, r->sum, r->ngrad * sizeof(float));
}

void ts_repro_free(struct ts_repro *r) {
    if (!r) return;
    ts_tree_sum_free(&r->gsum);
    ts_tree_sum_free(&r->ssum);
    if (r->parts) ts_comm_release_shared(r->comm, r->parts);
    ts_repro_gather_free(&r->ggat);
    ts_repro_gather_free(&r->sgat);
    free(r->st);
    ts_repro_norm_free(&r->norm);
    free(r->gt);
    free(r->s0);
    free(r->leaf);
    free(r->loss);
    free(r->losses);
    free(r);
}

ts_status ts_repro_manifest(session *s) {
    char build[65] = "", cpu[160];
    ts_cpu_kernel_path(cpu, sizeof cpu);
    /* The build: the binary running this process (a library linked into
     * another program: that program). */
    if (ts_sha256_file("/proc/self/exe", build) != TS_OK) snprintf(build, sizeof build, "unknown");
    const int64_t B = s->c.model.batch;
    json_t *o = json_pack("{s:s, s:s, s:s, s:s%, s:b, s:I, s:I, s:I, s:i}", "tessel_version",
                          TESSEL_VERSION, "build_sha256", build, "cpu_path", cpu, "config",
                          s->ident, s->ident_bytes, "reproducible", s->c.dist.reproducible, "batch",
                          (json_int_t)B, "micro_batches", (json_int_t)s->nslices, "microbatch_rows",
                          (json_int_t)(B / s->nslices), "processes", s->nranks);
    s->replay_json = o ? json_dumps(o, JSON_COMPACT | JSON_SORT_KEYS) : NULL;
    json_decref(o);
    return s->replay_json ? TS_OK
                          : ts_fail(TS_ERR_NOMEM, "out of memory for the manifest's replay");
}
