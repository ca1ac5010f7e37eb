/* The pass pipeline as data: one row per pass (see pipeline.h). A pass's
 * run function adapts the context to the pass's own signature; the
 * predicates say when it runs. The order is ts_compile's. */
#include <stdlib.h>
#include <string.h>
#include "pipeline.h"
#include "tessel/dist.h"

static int always(const ts_pass_ctx *c) {
    (void)c;
    return 1;
}
static int training(const ts_pass_ctx *c) {
    return c->training;
}
static int with_loss_scale(const ts_pass_ctx *c) {
    return c->training && c->opt->precision.loss_scale != TS_SCALE_NONE;
}
static int with_discard(const ts_pass_ctx *c) {
    return c->training && c->opt->discard_outputs;
}
static int with_unscale(const ts_pass_ctx *c) {
    return c->training && c->scale >= 0;
}
static int with_monitors(const ts_pass_ctx *c) {
    return c->training && c->opt->monitors;
}
/* Every update after every monitor, so the update gate sees all of them;
 * a fused update runs inside the backward pass instead (train.c), and its
 * plan asks no gate (lower.c). */
static int with_monitor_order(const ts_pass_ctx *c) {
    return with_monitors(c) && !(c->spec && c->spec->fused_update);
}
static int with_simplify(const ts_pass_ctx *c) {
    return !c->opt->no_simplify;
}
static int with_fuse(const ts_pass_ctx *c) {
    return !c->opt->no_fuse;
}
static int with_ranks(const ts_pass_ctx *c) {
    return c->training && c->opt->comm && ts_comm_size(c->opt->comm) > 1;
}

static int with_peft(const ts_pass_ctx *c) {
    return (c->opt->peft.targets && c->opt->peft.targets[0]) ||
           (c->opt->peft.adapter_after && c->opt->peft.adapter_after[0]);
}

/* LoRA: only the new parameters are trained; every other one is frozen
 * (no gradient, optimizer state or all-reduce follows for it). */
static ts_status run_peft(ts_pass_ctx *c) {
    int32_t *lora;
    int n;
    ts_status s = ts_pass_peft(c->g, &c->opt->peft, &lora, &n);
    if (s != TS_OK || !c->training) {
        free(lora);
        return s;
    }
    free(c->frozen);
    c->frozen = ts_alloc(sizeof(int32_t) * (2 * (size_t)n + 1), "compile");
    if (!c->frozen) {
        free(lora);
        return TS_ERR_NOMEM;
    }
    memcpy(c->frozen, lora, sizeof(int32_t) * (size_t)n);
    free(lora);
    c->params = c->frozen;
    c->grads = c->frozen + n;
    c->n_params = n;
    return TS_OK;
}
/* The old chain it leaves is removed by simplify's dead-code elimination; only where the
 * backend runs the packed form (host backends: any; CUDA: bf16 plans, head size 64). */
static int with_attention_qkv(const ts_pass_ctx *c) {
    return with_simplify(c) && c->packed_attention_hd >= 0;
}
static ts_status run_attention_qkv(ts_pass_ctx *c) {
    return ts_pass_attention_qkv(c->g, c->packed_attention_hd, NULL);
}
static ts_status run_loss_scale(ts_pass_ctx *c) {
    return ts_pass_loss_scale_loss(c->g, &c->opt->precision, c->loss, &c->diff, &c->scale);
}
static ts_status run_autodiff(ts_pass_ctx *c) {
    return ts_pass_autodiff_ex(c->g, c->diff, c->params, c->n_params, c->grads,
                               !c->opt->no_recompute);
}
/* Values marked as outputs other than the loss stop being kept readable. */
static ts_status run_discard(ts_pass_ctx *c) {
    for (int v = 0; v < c->g->n_values; v++)
        if (v != c->loss) c->g->values[v].is_output = 0;
    return TS_OK;
}
static ts_status run_unscale(ts_pass_ctx *c) {
    return ts_pass_loss_scale_unscale(c->g, c->scale, c->grads, c->n_params, &c->unscale);
}
/* after the unscale node: monitors see the true gradients (monitor_order
 * puts them after it) */
static ts_status run_monitor(ts_pass_ctx *c) {
    return ts_pass_monitor(c->g, c->params, c->grads, c->n_params);
}
/* optim.fused_update (train.c) with what needs every gradient before the
 * first update: loss scaling (one unscale over all gradients decides
 * whether any update runs) and data parallelism (the buckets' all-reduce
 * waits; a fused update after each wait is not built yet). */
static ts_status check_fused(const ts_pass_ctx *c) {
    if (!c->spec->fused_update) return TS_OK;
    if (c->opt->precision.loss_scale != TS_SCALE_NONE)
        return ts_fail(TS_ERR_UNSUPPORTED,
                       "optim.fused_update cannot be used with precision.loss_scale: a loss "
                       "scaler skips the whole update when any gradient is non-finite, which is "
                       "known only after the last gradient");
    if (c->opt->comm && ts_comm_size(c->opt->comm) > 1)
        return ts_fail(TS_ERR_UNSUPPORTED,
                       "optim.fused_update is not supported with data parallelism (%d ranks): "
                       "the update would have to follow each bucket's all-reduce; set "
                       "optim.fused_update false",
                       ts_comm_size(c->opt->comm));
    return TS_OK;
}
static ts_status run_train(ts_pass_ctx *c) {
    ts_status s = check_fused(c);
    return s == TS_OK ? ts_pass_train(c->g, c->spec, c->params, c->grads, c->n_params) : s;
}
static ts_status run_monitor_order(ts_pass_ctx *c) {
    return ts_pass_monitor_order(c->g);
}
static ts_status run_loss_scale_order(ts_pass_ctx *c) {
    return ts_pass_loss_scale_order(c->g, c->unscale);
}
/* Drops the dead nodes and renumbers the values, the loss among them. */
static ts_status compact(ts_pass_ctx *c) {
    int32_t *map = ts_alloc(sizeof(int32_t) * (size_t)(c->g->n_values + 1), "compile");
    if (!map) return TS_ERR_NOMEM;
    ts_status s = ts_graph_compact(c->g, map);
    if (s == TS_OK && c->loss >= 0) c->loss = map[c->loss];
    free(map);
    return s;
}
/* The pass may leave recomputed nodes dead (their cast is shared with the forward one). */
static ts_status run_precision(ts_pass_ctx *c) {
    ts_status s = ts_pass_precision(c->g, &c->opt->precision, c->low_kernels_ok, NULL);
    int dead = 0;
    for (int i = 0; s == TS_OK && i < c->g->n_nodes; i++) dead += c->g->nodes[i].dead;
    return s != TS_OK || !dead ? s : compact(c);
}
/* The GELU backward reads the derivative the forward gelu wrote (gelu_grad.c): host backends
 * only (the CUDA backend has no gelu out_grad nor unary_bwd side 2), and not under
 * compile.no_fuse (every op as autodiff wrote it) or compile.no_gelu_grad. */
static int with_gelu_grad(const ts_pass_ctx *c) {
    return c->training && c->low_kernels_ok && with_fuse(c) && !c->opt->no_gelu_grad;
}
static ts_status run_gelu_grad(ts_pass_ctx *c) {
    return ts_pass_gelu_grad(c->g, NULL);
}
/* The packed attention backward writes its bf16 gradient and the qkv bias gradient itself
 * (attn_bwd_low.c): bf16 training plans on host backends (the CUDA backend has no
 * attention.low), not under compile.no_attn_bwd_low_out. */
static int with_attn_bwd_low(const ts_pass_ctx *c) {
    return c->training && c->low_kernels_ok && c->opt->precision.compute == TS_BF16 &&
           !c->opt->no_attn_bwd_low_out;
}
static ts_status run_attn_bwd_low(ts_pass_ctx *c) {
    int n = 0;
    ts_status s = ts_pass_attn_bwd_low(c->g, &n);
    return s == TS_OK && n ? compact(c) : s;
}
/* The qkv projection writes bf16 where only the bf16 attention reads it (qkv_low.c): bf16 plans
 * on host backends (the CUDA backend has no attention.low), not under compile.no_qkv_low. */
static int with_qkv_low(const ts_pass_ctx *c) {
    return c->low_kernels_ok && c->opt->precision.compute == TS_BF16 && !c->opt->no_qkv_low;
}
static ts_status run_qkv_low(ts_pass_ctx *c) {
    return ts_pass_qkv_low(c->g, NULL);
}
/* The optimizer writes the weights' bf16 / f16 copies (weight_copies.c) where its kernels
 * do (host backends) and it is the plain update (not ZeRO's shard updates, distribute.c). */
static int with_weight_copies(const ts_pass_ctx *c) {
    return c->training && c->low_kernels_ok && c->opt->precision.compute != TS_F32 &&
           !c->opt->no_weight_copies && !(with_ranks(c) && c->opt->zero > 0);
}
static ts_status run_weight_copies(ts_pass_ctx *c) {
    ts_status s = ts_pass_weight_copies(c->g, NULL);
    return s == TS_OK ? compact(c) : s;
}
static ts_status run_train_mode(ts_pass_ctx *c) {
    return ts_pass_train_mode(c->g, c->training);
}
static ts_status run_simplify(ts_pass_ctx *c) {
    int32_t *remap = NULL;
    ts_status s = ts_pass_simplify(c->g, &remap);
    if (s == TS_OK && c->loss >= 0) c->loss = remap[c->loss];
    free(remap);
    return s;
}
/* chunk_ce marks the chunked pair dead; fuse's compaction removes them. */
static int with_chunk_ce(const ts_pass_ctx *c) {
    /* only where the backend's matmul keeps a row's bits in chunks (not oneDNN on AVX2) */
    return c->training && !c->opt->no_fuse && c->row_chunks_exact;
}
static ts_status run_chunk_ce(ts_pass_ctx *c) {
    return ts_pass_chunk_ce(c->g, NULL);
}
/* Fusion marks the fused nodes dead; compacting renumbers the values. */
static ts_status run_fuse(ts_pass_ctx *c) {
    /* a backend without the fused layer norm kernels (CUDA today) keeps them
     * apart; ZeRO-3's gradients are step temporaries (memplan.c, the buckets) */
    ts_fuse_options fo = {.no_norm = c->opt->no_fuse_norm || !c->fused_norm_ok,
                          .grads_released = with_ranks(c) && c->opt->zero == 3};
    ts_status s = ts_pass_fuse_ex(c->g, &fo, &c->fuse);
    return s == TS_OK ? compact(c) : s;
}
/* After precision (the backward's out_low); a backend without the fused op (CUDA today)
 * keeps the two. */
static int with_fuse_ce(const ts_pass_ctx *c) {
    return c->training && with_fuse(c) && !c->opt->no_fuse_ce && c->fused_ce_ok;
}
static ts_status run_fuse_ce(ts_pass_ctx *c) {
    int n = 0;
    ts_status s = ts_pass_fuse_ce(c->g, &n);
    return s == TS_OK && n ? compact(c) : s;
}
static ts_status run_verify(ts_pass_ctx *c) {
    return ts_graph_verify(c->g);
}
static ts_status run_schedule(ts_pass_ctx *c) {
    ts_schedule_options so = {c->opt->naive_schedule, !c->opt->no_inplace, 0};
    ts_schedule_report rep;
    const double mb = c->opt->max_memory_mb;
    if (!(mb >= 0 && mb <= 1e9))
        return ts_fail(TS_ERR_INVALID, "compile: max_memory_mb %g (MiB, 0 for none, up to 1e9)",
                       mb);
    const size_t limit = (size_t)(mb * 1048576.0);
    ts_status s = ts_pass_recompute_fit(c->g, c->training ? c->loss : -1, limit, &so, &c->order,
                                        &c->n_order, &rep, &c->recompute);
    c->peak_live = rep.peak, c->naive_peak = rep.naive_peak, c->sched_method = rep.method;
    return s;
}
static ts_status run_distribute(ts_pass_ctx *c) {
    const ts_compile_options *o = c->opt;
    ts_dist_spec d;
    double mb = o->bucket_mb > 0 ? o->bucket_mb : 25.0;
    double first_mb = o->first_bucket_mb > 0 ? o->first_bucket_mb : 1.0;
    if (first_mb > mb) first_mb = mb; /* the first bucket is the small one */
    d.bucket_bytes = (size_t)(mb * 1048576.0);
    d.first_bucket_bytes = (size_t)(first_mb * 1048576.0);
    d.algo = o->dist_algo;
    d.zero = o->zero;
    c->zero_shared =
        d.zero > 0 && d.zero < 3 && !o->zero_private_params && ts_comm_shares_memory(o->comm);
    d.no_prefetch = o->zero_no_prefetch;
    d.shared_params = c->zero_shared;
    d.summed_grads = o->zero_summed_grads && d.zero > 0 && d.zero < 3;
    d.rank = ts_comm_rank(o->comm);
    d.size = ts_comm_size(o->comm);
    d.loss = &c->loss;
    d.compress = o->compress;
    d.param_order = o->dist_param_order;
    if (d.zero < 0 || d.zero > 3)
        return ts_fail(TS_ERR_UNSUPPORTED, "compile: ZeRO stage %d (0 to 3 are supported)", d.zero);
    if (d.algo < 0 || d.algo >= TS_ALGO_COUNT)
        return ts_fail(TS_ERR_INVALID, "compile: dist_algo %d is not a ts_coll_algo", d.algo);
    return ts_pass_distribute(c->g, &c->order, &c->n_order, &d, &c->n_buckets);
}
static ts_status run_memplan(ts_pass_ctx *c) {
    ts_status s = ts_pass_memplan(c->g, c->order, c->n_order, !c->opt->no_inplace, &c->mp);
    /* the schedule pass fitted the arena; the distribute pass may have grown it */
    const double mb = c->opt->max_memory_mb;
    if (s == TS_OK && mb > 0 && (double)c->mp.arena_bytes > mb * 1048576.0)
        s = ts_fail(TS_ERR_INVALID,
                    "compile: the step needs %.2f MiB of arena after the distribute pass, above "
                    "compile.max_memory_mb %.2f",
                    (double)c->mp.arena_bytes / 1048576.0, mb);
    return s;
}

static const ts_pass_def PASSES[] = {
    {"peft", with_peft, run_peft},
    {"attention_qkv", with_attention_qkv, run_attention_qkv},
    {"loss_scale", with_loss_scale, run_loss_scale},
    {"autodiff", training, run_autodiff},
    {"discard_outputs", with_discard, run_discard},
    {"unscale", with_unscale, run_unscale},
    {"monitor", with_monitors, run_monitor},
    {"train", training, run_train},
    {"monitor_order", with_monitor_order, run_monitor_order},
    {"loss_scale_order", training, run_loss_scale_order},
    {"train_mode", always, run_train_mode},
    {"simplify", with_simplify, run_simplify},
    {"chunk_ce", with_chunk_ce, run_chunk_ce},
    {"fuse", with_fuse, run_fuse},
    /* after fuse: matmul_epi GEMMs are lowered with their f32 epilogue */
    {"precision", always, run_precision},
    /* after precision: the GELU backward it folded into the bias-gradient sum is rewritten too */
    {"gelu_grad", with_gelu_grad, run_gelu_grad},
    /* after precision: its bias-gradient sum of the packed attention's gradient goes */
    {"attn_bwd_low", with_attn_bwd_low, run_attn_bwd_low},
    /* after attn_bwd_low: the attention backward's final form reads the qkv */
    {"qkv_low", with_qkv_low, run_qkv_low},
    {"fuse_ce", with_fuse_ce, run_fuse_ce},
    {"weight_copies", with_weight_copies, run_weight_copies},
    {"verify", always, run_verify},
    {"schedule", always, run_schedule},
    {"distribute", with_ranks, run_distribute},
    {"memplan", always, run_memplan},
};

enum { N_PASSES = (int)(sizeof PASSES / sizeof PASSES[0]) };

int ts_pass_count(void) {
    return N_PASSES;
}

const ts_pass_def *ts_pass_at(int i) {
    return i >= 0 && i < N_PASSES ? &PASSES[i] : NULL;
}

int ts_pass_find(const char *name) {
    for (int i = 0; name && i < N_PASSES; i++)
        if (!strcmp(PASSES[i].name, name)) return i;
    return -1;
}

const char *ts_pass_names(char *buf, size_t n) {
    size_t k = 0;
    if (n) buf[0] = 0;
    for (int i = 0; i < N_PASSES && k < n; i++)
        k += (size_t)snprintf(buf + k, n - k, "%s%s", i ? ", " : "", PASSES[i].name);
    return buf;
}

void ts_pass_ctx_init(ts_pass_ctx *c, ts_graph *g, const ts_train_spec *spec,
                      const ts_compile_options *opt, const int32_t *params, int32_t *grads,
                      int n_params, int32_t loss) {
    memset(c, 0, sizeof *c);
    c->g = g;
    c->spec = spec;
    c->opt = opt;
    c->training = loss >= 0;
    c->params = params;
    c->grads = grads;
    c->n_params = n_params;
    c->loss = c->diff = loss;
    c->scale = c->unscale = -1;
    c->row_chunks_exact = c->fused_norm_ok = c->fused_ce_ok = 1;
}

ts_status ts_pipeline_run(ts_pass_ctx *c) {
    const int dump = c->opt->dump_to ? ts_pass_find(c->opt->dump_after) : -1;
    for (int i = 0; i < N_PASSES; i++) {
        const ts_pass_def *d = &PASSES[i];
        if (d->enabled(c)) {
            ts_status s = d->run(c);
            if (s != TS_OK) return s;
        }
        if (i == dump) ts_graph_print(c->g, c->order, c->opt->dump_to);
    }
    return TS_OK;
}

void ts_pass_ctx_free(ts_pass_ctx *c) {
    free(c->order);
    c->order = NULL;
    free(c->frozen);
    c->frozen = NULL;
    ts_memplan_free(&c->mp);
}
