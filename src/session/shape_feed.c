/* Training on batches of more than one shape (docs/shapes.md): the plan
 * cache of the session's training plan, its builder, and the step that
 * feeds a batch of s->rows real rows to the bucket that holds it (padded:
 * x zeros, class targets -100, float targets masked). Without shape
 * buckets and with every short batch dropped, ts_sess_step is the one
 * plan's step it always was. See session_internal.h. */
#include <jansson.h>
#include <stdlib.h>
#include <string.h>
#include "core/core.h"
#include "models/fusion_mask.h"
#include "plan/plan.h"
#include "plan/plan_cache.h"
#include "session/repro.h"
#include "session/session_internal.h"
#include "session/shapes.h"

/* The options every plan of the run is compiled with (ts_sess_build's). */
static void train_options(const session *s, ts_compile_options *opt) {
    opt->comm = s->o->comm;
    if (opt->threads == 0) opt->threads = s->threads; /* auto: ts_sess_resolve_threads */
    opt->bucket_mb = s->c.dist.bucket_mb;
    opt->dist_algo = s->c.dist.algo;
    /* dist.reproducible on several ranks: the plan reduces no gradients; each rank sums its
     * run of micro-batches and repro_gather.h finishes the fixed tree across ranks once per
     * step, so dist.algo cannot change its bits (repro.h). Without ZeRO the plan is this
     * rank's alone; with ZeRO-1/2 it keeps the comm for the shards' update and all-gather. */
    if (ts_repro_local(s) && !ts_repro_zero(s)) opt->comm = NULL;
    opt->zero = s->nranks > 1 ? s->c.dist.zero : 0;
    opt->zero_summed_grads = ts_repro_zero(s); /* the shards read the tree's sums */
    opt->zero_private_params = !s->c.dist.share_params;
    opt->zero_no_prefetch = !s->c.dist.prefetch;
    if (s->nranks > 1) ts_config_compress_options(&s->c, &opt->compress);
    opt->monitors = 1;
    /* the bucket plans share the gradients, laid out alike (plan_shared.c) */
    opt->dist_param_order = s->c.shape.policy == 1 && s->nranks > 1;
    /* pipeline stages: this plan only holds the whole model's weights
     * (pipe_train.h); the stages compile, exchange and bound memory */
    if (s->c.pipe.stages > 1) opt->comm = NULL, opt->zero = 0, opt->max_mem_mb = 0;
}

ts_status ts_sess_shape_graph(session *s, ts_config *lc, ts_graph **g, ts_model *m,
                              ts_train_spec *spec, ts_compile_options *opt) {
    ts_config_graph cg = ts_zoo_graph_of(&s->graph);
    ts_status st = ts_config_build_graph(lc, s->graph.nodes ? &cg : NULL, g, m, spec, opt);
    if (st == TS_OK) train_options(s, opt);
    if (st == TS_OK && s->c.shape.policy == 1) st = ts_shape_mask_loss(*g, m, spec);
    int n_bn = 0;
    if (st == TS_OK && s->c.shape.policy == 1) st = ts_batch_norm_mask_rows(*g, "mask", &n_bn);
    /* several ranks: each weighs its loss by its share of the batch's real count */
    if (st == TS_OK && s->c.shape.policy == 1 && s->nranks > 1)
        st = ts_shape_weight_loss(*g, m, spec);
    if (st == TS_OK) s->bn_mask = n_bn > 0;
    return st;
}

static ts_status build_bucket(void *user, int64_t batch, int64_t seq, const ts_plan *share,
                              ts_plan **out) {
    session *s = user;
    ts_config lc = s->c;
    lc.model.batch = batch;
    lc.shape.build_seq = seq < lc.model.ctx ? seq : 0; /* a gpt's sequence bucket */
    ts_graph *g = NULL;
    ts_model m;
    ts_train_spec spec;
    ts_compile_options opt;
    ts_status st = ts_sess_shape_graph(s, &lc, &g, &m, &spec, &opt);
    if (st == TS_OK) st = ts_compile_shared(g, &spec, &opt, share, out);
    ts_graph_free(g);
    return st;
}

/* Which models can train padded: their rows are independent (no batch
 * statistics) and their loss masks padding. */
static ts_status check_model(const session *s) {
    const ts_config *c = &s->c;
    const ts_model_desc *d = ts_model_of(c);
    char where[600];
    const char *why = NULL;
    if (d->input == TS_MODEL_IN_VOLUMES)
        why = "its soft Dice loss is not masked yet (shape.policy exact with "
              "data.drop_last: false trains short batches on plans of their exact size)";
    else if (d->input == TS_MODEL_IN_GRAPH)
        why = "it trains on the whole graph, one shape";
    else if (s->binary)
        why = "the binary (BCE) loss is not masked yet";
    else if (!strcmp(d->name, "onnx"))
        why = "an imported model's loss is not masked yet";
    if (why)
        return ts_fail(TS_ERR_UNSUPPORTED, "%s: shape.policy bucket with a %s: %s",
                       ts_config_key_origin(c, "shape.policy", where, sizeof where),
                       ts_config_model_word(c->model.name), why);
    return TS_OK;
}

/* Rows of the one plan: model.batch, or with N ranks each rank's share
 * (bucket lists count rows per process). */
static int64_t plan_rows(const session *s) {
    return s->c.model.batch / s->nranks;
}

/* Rows of an epoch's short last batch (0: the training split divides
 * into batches, or the data is not a dataset of examples). */
static int64_t short_batch(const session *s) {
    const int64_t B = s->c.model.batch;
    return s->all && s->train && !s->graph.nodes && B > 0 ? s->train->n % B : 0;
}

/* A path that cannot train the short last batch of s's data refuses, so
 * none is dropped silently: the key (the path), why, and the two ways out. */
static ts_status refuse_short(const session *s, const char *key, const char *why) {
    char where[600];
    return ts_fail(TS_ERR_UNSUPPORTED,
                   "%s: %s with a short last batch (%lld of the %lld training examples, "
                   "model.batch %lld): %s; set data.drop_last: true to drop it each epoch%s",
                   ts_config_key_origin(&s->c, key, where, sizeof where), key,
                   (long long)short_batch(s), (long long)s->train->n, (long long)s->c.model.batch,
                   why, s->nranks > 1 ? " or shape.policy: bucket to pad it" : "");
}

/* One process under exact shapes: the paths whose steps do not go
 * through the plan cache (ts_sess_step) cannot train a short batch. */
static ts_status check_exact(const session *s) {
    if (s->c.pipe.stages > 1)
        return refuse_short(s, "dist.pipeline_stages", "the stages' plans have one size");
    if (s->c.dist.reproducible)
        return refuse_short(s, "dist.reproducible", "its micro-batches have one size");
    return TS_OK;
}

/* What data parallelism on buckets cannot do yet, naming the key. */
static ts_status check_ranks(const session *s) {
    const ts_config *c = &s->c;
    char where[600];
    const char *key = NULL, *why = NULL;
    if (c->shape.policy != 1)
        return refuse_short(s, "dist.procs",
                            "under shape.policy exact the ranks' shares of it would need "
                            "plans of different sizes");
    if (c->dist.zero)
        key = "dist.zero", why = "shape buckets with ZeRO are not supported yet (set dist.zero: 0)";
    else if (c->dist.compress)
        key = "dist.compress",
        why = "shape buckets with gradient compression are not supported yet (its error "
              "feedback is per plan; set dist.compress: none)";
    else if (c->pipe.stages > 1)
        key = "dist.pipeline_stages",
        why = "shape buckets with pipeline stages are not supported yet";
    if (!why) return TS_OK;
    return ts_fail(TS_ERR_UNSUPPORTED, "%s: %s: %s",
                   ts_config_key_origin(c, key, where, sizeof where), key, why);
}

ts_status ts_sess_shape_setup(session *s) {
    const ts_config *c = &s->c;
    const int bucket = c->shape.policy == 1;
    s->rows = c->model.batch;
    s->bucket = plan_rows(s);
    /* exact shapes: one plan, as always, unless an epoch ends in a short
     * batch to train (then its plan of its own size comes from the cache) */
    if (!bucket && (c->data.drop_last || !short_batch(s))) return TS_OK;
    char where[600];
    ts_status st = s->nranks > 1 ? check_ranks(s) : bucket ? TS_OK : check_exact(s);
    if (st != TS_OK) return st;
    if (ts_plan_loss_scale(s->plan, NULL, NULL, NULL))
        return bucket
                   ? ts_fail(TS_ERR_UNSUPPORTED,
                             "%s: shape buckets with loss scaling are not supported yet (set "
                             "precision.loss_scale: none)",
                             ts_config_key_origin(c, "precision.loss_scale", where, sizeof where))
                   : refuse_short(s, "precision.loss_scale",
                                  "loss scaling keeps its scale in one plan");
    if (bucket && (st = check_model(s)) != TS_OK) return st;
    const int64_t B = plan_rows(s);
    if ((st = ts_buckets_parse(c->shape.batch_buckets, "shape.batch_buckets",
                               ts_config_key_origin(c, "shape.batch_buckets", where, sizeof where),
                               &s->bb)) != TS_OK)
        return st;
    if (s->gpt &&
        (st = ts_buckets_parse(c->shape.seq_buckets, "shape.seq_buckets",
                               ts_config_key_origin(c, "shape.seq_buckets", where, sizeof where),
                               &s->sb)) != TS_OK)
        return st;
    const int64_t largest = bucket ? ts_buckets_largest(&s->bb, B) : B;
    if (largest < B && !c->shape.split_oversize)
        return ts_fail(TS_ERR_INVALID,
                       "%s: a batch of %lld rows (model.batch per process) is larger than every "
                       "bucket of "
                       "shape.batch_buckets '%s' (the largest is %lld): add a bucket of at least "
                       "%lld or set shape.split_oversize: true",
                       ts_config_key_origin(c, "shape.batch_buckets", where, sizeof where),
                       (long long)B, c->shape.batch_buckets, (long long)largest, (long long)B);
    s->pad_rows = (size_t)(largest > B ? largest : B);
    const size_t xr = s->xb / (size_t)B, yr = s->yb / (size_t)B;
    if (!(s->pad_x = ts_alloc(xr * s->pad_rows, "padded batch")) ||
        !(s->pad_y = ts_alloc(yr * s->pad_rows, "padded batch")) ||
        !(s->mask = ts_alloc(sizeof(float) * s->pad_rows, "padding mask")))
        return TS_ERR_NOMEM;
    const size_t limit = (size_t)(c->shape.cache_mb * 1024.0 * 1024.0);
    const int64_t T = s->gpt ? c->model.ctx : 0;
    s->seq_bucket = T;
    if ((st = ts_plan_cache_new(s->plan, B, T, limit, build_bucket, s, &s->cache)) != TS_OK)
        return st;
    if (!c->shape.precompile) return TS_OK;
    /* Every bucket a batch can meet: the rule's or the list's, or under
     * exact shapes the short last batch of an epoch. */
    int64_t all[TS_MAX_BUCKETS], seqs[TS_MAX_BUCKETS] = {T};
    int n = 0, ns = 1;
    if (bucket) {
        n = ts_buckets_all(&s->bb, largest, all, TS_MAX_BUCKETS);
        if (s->gpt) ns = ts_buckets_all(&s->sb, T, seqs, TS_MAX_BUCKETS);
    } else if (s->train && s->train->n % B) {
        all[n++] = s->train->n % B;
    }
    for (int i = 0; i < n && st == TS_OK; i++)
        for (int j = 0; j < ns && st == TS_OK; j++)
            st = ts_plan_cache_precompile(s->cache, all[i], seqs[j]);
    return st;
}

/* The longest sequence of rows [from, from + n): positions up to its last
 * target that is not the ignore index. */
static int64_t longest(const session *s, int64_t from, int64_t n) {
    const int64_t T = s->c.model.ctx, *y = (const int64_t *)s->by + from * T;
    int64_t most = 1;
    for (int64_t r = 0; r < n; r++) {
        int64_t l = T;
        while (l > most && y[r * T + l - 1] == TS_SHAPE_IGNORE) l--;
        if (l > most) most = l;
    }
    return most;
}

/* The positions of rows [from, from + n) a gpt's plan computes: the
 * sequence bucket of the longest (or, under exact shapes, that length). */
static ts_status seq_of(const session *s, int64_t from, int64_t n, int64_t *L) {
    const ts_config *c = &s->c;
    const int64_t T = c->model.ctx, need = longest(s, from, n);
    *L = c->shape.policy == 1 ? ts_buckets_pick(&s->sb, need, T) : need;
    if (!*L)
        return ts_fail(TS_ERR_INVALID,
                       "a sequence of %lld tokens (batch of %lld x %lld) is longer than every "
                       "bucket of shape.seq_buckets '%s' (the largest is %lld)",
                       (long long)need, (long long)n, (long long)need, c->shape.seq_buckets,
                       (long long)ts_buckets_largest(&s->sb, T));
    return TS_OK;
}

/* Real targets of rows [from, from + n): rows, or a gpt's tokens. */
static double real_count(const session *s, int64_t from, int64_t n) {
    if (!s->gpt) return (double)n;
    const int64_t T = s->c.model.ctx, *y = (const int64_t *)s->by + from * T;
    double real = 0;
    for (int64_t i = 0; i < n * T; i++) real += y[i] != TS_SHAPE_IGNORE;
    return real;
}

/* Rows [from, from + n) of the batch into the plan of bucket b rows and,
 * for a gpt, L positions; with several ranks its loss weighed by w. n = 0
 * (a short batch with fewer rows than ranks): row `from` is fed as if
 * real, w is 0, and the rank's gradients are exact zeros. */
static ts_status feed_rows(session *s, int64_t from, int64_t n, int64_t b, int64_t L, float w) {
    const ts_config *c = &s->c;
    const int64_t B = plan_rows(s), T = s->gpt ? c->model.ctx : 1;
    const size_t xr = s->xb / (size_t)B, yr = s->yb / (size_t)B;
    const char *x = (const char *)s->bx + (size_t)from * xr,
               *y = (const char *)s->by + (size_t)from * yr;
    const int f32 = ts_dtype_of(s->g, s->m.target) == TS_F32;
    const int64_t fed = n > 0 ? n : 1;
    ts_status st = ts_plan_cache_select(s->cache, b, s->gpt ? L : 0);
    if (st != TS_OK) return st;
    /* bytes of one row of the bucket's x and y */
    const size_t bx = xr / (size_t)T * (size_t)L, by = yr / (size_t)T * (size_t)L;
    if (b != fed || L != T) { /* padding: zero inputs, ignored or masked targets */
        for (int64_t r = 0; r < fed; r++) {
            memcpy((char *)s->pad_x + (size_t)r * bx, x + (size_t)r * xr, bx);
            memcpy((char *)s->pad_y + (size_t)r * by, y + (size_t)r * yr, by);
        }
        memset((char *)s->pad_x + (size_t)fed * bx, 0, (size_t)(b - fed) * bx);
        if (f32) {
            memset((char *)s->pad_y + (size_t)fed * by, 0, (size_t)(b - fed) * by);
        } else {
            int64_t *t = (int64_t *)((char *)s->pad_y + (size_t)fed * by);
            for (size_t i = 0; i < (size_t)(b - fed) * by / sizeof(int64_t); i++)
                t[i] = TS_SHAPE_IGNORE;
        }
        x = s->pad_x, y = s->pad_y;
    }
    st = ts_plan_set_input(s->plan, s->in_name, x, (size_t)b * bx);
    if (st == TS_OK) st = ts_plan_set_input(s->plan, s->tgt_name, y, (size_t)b * by);
    if (st == TS_OK && (f32 || s->bn_mask) && c->shape.policy == 1) {
        for (int64_t i = 0; i < b; i++) s->mask[i] = i < fed ? 1.0f : 0.0f;
        st = ts_plan_set_input(s->plan, "mask", s->mask, sizeof(float) * (size_t)b);
    }
    if (st == TS_OK && c->shape.policy == 1 && s->nranks > 1)
        st = ts_plan_set_input(s->plan, "loss_weight", &w, sizeof w);
    if (st == TS_OK && s->valid) { /* padded rows: no source (their loss is masked) */
        const size_t S = TS_FUSION_SOURCES;
        uint8_t *v = s->valid + (size_t)s->rows * S;
        memcpy(v, s->valid + (size_t)from * S, (size_t)fed * S);
        memset(v + (size_t)fed * S, 0, (size_t)(b - fed) * S);
        st = ts_plan_set_input(s->plan, "valid", v, (size_t)b * S);
    }
    /* padding share: of the positions a gpt computes, those past a real target */
    const double real = s->gpt ? real_count(s, from, n) : (double)n * (double)T;
    ts_plan_cache_note(s->cache, real, (double)b * (double)L);
    s->bucket = b;
    s->seq_bucket = L;
    return st;
}

/* model.source_mask: the flags of every row of the batch (each rank draws
 * them all, as it loads the whole batch): the sources the data has
 * (data.valid; all without it), dropped by train.source_dropout at this
 * step. */
static void source_flags(session *s) {
    const int64_t rows = s->cache ? s->rows : plan_rows(s) * s->nranks;
    ts_fusion_valid(rows, s->c.train.seed, ts_plan_step_count(s->plan), s->c.train.source_dropout,
                    s->data_valid, s->valid);
}

ts_status ts_sess_step(session *s) {
    ts_status st;
    if (s->valid) source_flags(s);
    if (!s->cache) {
        /* This rank's rows: rank r takes rows r*B/N .. (r+1)*B/N - 1. */
        st = ts_plan_set_input(s->plan, s->in_name, (const char *)s->bx + (size_t)s->rank * s->xb,
                               s->xb);
        if (st == TS_OK)
            st = ts_plan_set_input(s->plan, s->tgt_name,
                                   (const char *)s->by + (size_t)s->rank * s->yb, s->yb);
        const size_t nv = (size_t)plan_rows(s) * TS_FUSION_SOURCES;
        if (st == TS_OK && s->valid)
            st = ts_plan_set_input(s->plan, "valid", s->valid + (size_t)s->rank * nv, nv);
        if (st == TS_OK) st = ts_plan_step(s->plan);
        s->step_loss = ts_plan_loss(s->plan);
        return st;
    }
    const int64_t B = plan_rows(s), rows = s->rows, N = s->nranks;
    const int bucket = s->c.shape.policy == 1;
    const int64_t largest = (bucket ? ts_buckets_largest(&s->bb, B) : B) * N;
    /* Rows beyond the largest bucket (shape.split_oversize) run as several
     * updates at this step's learning rate; the loss is their row-weighted
     * mean.
     * With N ranks every rank holds the whole batch and derives the same
     * bucket from it, so no collective is needed to agree: rank r runs rows
     * [from + r*n/N, from + (r+1)*n/N) of a piece of n, on the bucket of
     * the largest rank's share (ceil(n/N)) and the sequence bucket of the
     * piece's longest row, with its loss weighed by its share of the
     * piece's real count (ts_shape_weight_loss). */
    const int64_t done = ts_plan_step_count(s->plan);
    double loss = 0;
    st = TS_OK;
    for (int64_t from = 0; from < rows && st == TS_OK; from += largest) {
        const int64_t n = rows - from < largest ? rows - from : largest;
        const int64_t lo = from + s->rank * n / N, hi = from + (s->rank + 1) * n / N;
        const int64_t most = (n + N - 1) / N;
        const int64_t b = bucket ? ts_buckets_pick(&s->bb, most, B) : most;
        int64_t L = s->gpt ? s->c.model.ctx : 1;
        if (s->gpt) st = seq_of(s, from, n, &L);
        const double all = N > 1 ? real_count(s, from, n) : 1, mine = real_count(s, lo, hi - lo);
        const float w = all > 0 ? (float)((double)N * mine / all) : 0.0f;
        if (from > 0) {
            const int64_t applied = ts_plan_updates_applied(s->plan);
            ts_plan_set_step(s->plan, done);
            ts_plan_set_updates_applied(s->plan, applied);
        }
        if (st == TS_OK) st = feed_rows(s, lo, hi - lo, b, L, w);
        if (st == TS_OK) st = ts_plan_step(s->plan);
        loss += ts_plan_loss(s->plan) * (double)n;
    }
    s->step_loss = loss / (double)rows;
    return st;
}

/* ---- what the cache did: metrics.jsonl, Prometheus, summary.json --------- */

enum { M_COMPILES, M_HITS, M_MISSES, M_EVICTIONS, M_PLANS, M_BYTES, M_PADDING, M_N };

ts_status ts_sess_shape_observe(session *s) {
    if (!s->cache || !s->tm_made) return TS_OK;
    static const char *const names[M_N][2] = {
        {"tessel_plan_cache_compiles", "Bucket plans compiled."},
        {"tessel_plan_cache_hits", "Steps whose bucket plan was cached."},
        {"tessel_plan_cache_misses", "Steps that compiled their bucket plan."},
        {"tessel_plan_cache_evictions", "Bucket plans evicted under shape.cache_mb."},
        {"tessel_plan_cache_plans", "Bucket plans held now."},
        {"tessel_plan_cache_bytes", "Memory of the held plans beyond the shared state."},
        {"tessel_plan_cache_padding_ratio", "Share of the fed elements that are padding."}};
    ts_status st = TS_OK;
    for (int i = 0; i < M_N && st == TS_OK && !s->shape_metric[i]; i++)
        st = ts_metrics_gauge(s->tm.reg, names[i][0], names[i][1], 0, NULL, &s->shape_metric[i]);
    if (st != TS_OK) return st;
    ts_plan_cache_stats cs;
    ts_plan_cache_get_stats(s->cache, &cs);
    const double v[M_N] = {(double)cs.compiles,
                           (double)cs.hits,
                           (double)cs.misses,
                           (double)cs.evictions,
                           (double)cs.cached,
                           (double)cs.bytes,
                           cs.real + cs.padded > 0 ? cs.padded / (cs.real + cs.padded) : 0};
    for (int i = 0; i < M_N; i++) ts_metric_set(s->shape_metric[i], v[i]);
    return TS_OK;
}

void ts_sess_shape_json(const session *s, char *buf, size_t n) {
    buf[0] = 0;
    if (!s->cache) return;
    ts_plan_cache_stats cs;
    ts_plan_cache_get_stats(s->cache, &cs);
    snprintf(
        buf, n,
        ",\"rows\":%lld,\"bucket\":%lld%s%.0lld,\"plan_cache\":{\"compiles\":%lld,\"hits\":%lld,"
        "\"misses\":%lld,\"evictions\":%lld,\"plans\":%d,\"padding\":%.6g}",
        (long long)s->rows, (long long)s->bucket, s->gpt ? ",\"seq_bucket\":" : "",
        (long long)(s->gpt ? s->seq_bucket : 0), (long long)cs.compiles, (long long)cs.hits,
        (long long)cs.misses, (long long)cs.evictions, cs.cached,
        cs.real + cs.padded > 0 ? cs.padded / (cs.real + cs.padded) : 0.0);
}

json_t *ts_sess_shape_summary(const session *s) {
    ts_plan_cache_stats cs;
    ts_plan_cache_get_stats(s->cache, &cs);
    return json_pack(
        "{s:s, s:I, s:I, s:I, s:I, s:i, s:I, s:I, s:I, s:I, s:f, s:f}", "policy",
        s->c.shape.policy == 1 ? "bucket" : "exact", "compiles", (json_int_t)cs.compiles, "hits",
        (json_int_t)cs.hits, "misses", (json_int_t)cs.misses, "evictions", (json_int_t)cs.evictions,
        "plans", cs.cached, "plans_bytes", (json_int_t)cs.bytes, "full_plan_bytes",
        (json_int_t)cs.own_bytes, "largest_plan_bytes", (json_int_t)cs.largest_bytes, "state_bytes",
        (json_int_t)cs.state_bytes, "compile_seconds", cs.compile_seconds, "padding",
        cs.real + cs.padded > 0 ? cs.padded / (cs.real + cs.padded) : 0.0);
}

void ts_sess_shape_log(session *s) {
    if (!s->cache) return;
    ts_plan_cache_stats cs;
    ts_plan_cache_get_stats(s->cache, &cs);
    ts_progress_log(&s->pr,
                    "plan cache: %lld compiles (%.2f s), %lld hits, %lld misses, %lld evictions; "
                    "%d plans of %.1f MiB beside %.1f MiB of shared state; padding %.1f %%",
                    (long long)cs.compiles, cs.compile_seconds, (long long)cs.hits,
                    (long long)cs.misses, (long long)cs.evictions, cs.cached,
                    (double)cs.bytes / (1024.0 * 1024.0),
                    (double)cs.state_bytes / (1024.0 * 1024.0),
                    cs.real + cs.padded > 0 ? 100.0 * cs.padded / (cs.real + cs.padded) : 0.0);
}
