/* passes.h — the compiler passes (internal). Each is graph -> graph,
 * pure, and testable alone. ts_compile() runs them from one table
 * (pipeline.c, pipeline.h), in this order:
 *   autodiff -> [monitor] -> train -> [monitor order] -> precision
 *   -> train_mode -> simplify -> fuse -> verify -> schedule -> [distribute]
 *   -> memplan, then the plan lowers the result
 * (loss scaling around autodiff and train with precision.loss_scale;
 * distribute only in a training plan with a comm of more than one rank).
 */
#ifndef TS_PASSES_H
#define TS_PASSES_H

#include "ops/op.h"
#include "tessel/compile.h"

/* PEFT (peft.c, peft_adapter.c, docs/peft.md): patch every matmul whose
 * weight matches o->targets with a low-rank branch (LoRA), then put a
 * bottleneck adapter after every layer whose weight matches
 * o->adapter_after; *added (owned by the caller, n_added ids) receives
 * the new parameters: A then B per patched weight, then each adapter's
 * down, down_bias, up, up_bias. No-op without targets and adapters. */
ts_status ts_pass_peft(ts_graph *g, const ts_peft_options *o, int32_t **added, int *n_added);

/* Add gradient nodes for loss w.r.t. each of params[0..n). On return
 * grads[i] is the gradient value of params[i] (marked grad_of), or -1 if
 * the parameter cannot reach the loss (a warning names it). */
ts_status ts_pass_autodiff(ts_graph *g, int32_t loss, const int32_t *params, int n, int32_t *grads);
/* Same, and with allow_recompute a matmul's gradient reads a recomputed copy
 * of a large GELU or LayerNorm output instead of the stored one (same bits,
 * less memory: see autodiff.c). The copy's node has recompute = 1. */
ts_status ts_pass_autodiff_ex(ts_graph *g, int32_t loss, const int32_t *params, int n,
                              int32_t *grads, int allow_recompute);

/* Add clipping and the optimizer update for every parameter with a
 * gradient: optimizer state values (TS_VK_STATE) and side-effect update
 * nodes ordered after every other reader of the parameter. */
ts_status ts_pass_train(ts_graph *g, const ts_train_spec *spec, const int32_t *params,
                        const int32_t *grads, int n);
/* The storage root of every value into root[0, g->n_values): a view's (an output of a
 * TS_OPF_ALIAS op) is the root of the value it views, following chains of views in any id
 * order; any other value is its own root. Passes may give a view a lower id than the value it
 * reads (weight_copies' copies are new values read by existing reshapes), so a single pass in
 * id order would read roots not yet set. */
void ts_view_roots(const ts_graph *g, int32_t *root);
/* Control edges so node u (an in-place update) runs after every node before it that reads
 * one of the values vals[0], vals[stride], ... (n of them), directly or through a view of
 * one (reshape shares memory): train.c. */
ts_status ts_order_after_readers(ts_graph *g, int u, const int32_t *vals, int n, int stride);
/* After the precision pass (weight_copies.c): each f32 parameter that the optimizer updates
 * and a bf16 / f16 cast feeds to GEMMs gets a persistent low-precision copy (an unnamed
 * STATE value) that the update rewrites with the new weights (attribute n_low), and the
 * GEMMs read the copy: the cast leaves the step. *n_copies (may be NULL): how many. */
ts_status ts_pass_weight_copies(ts_graph *g, int *n_copies);

/* Gradient monitors (docs/observability.md): a grad_stats node per float
 * gradient, output "monitor:PARAM" (marked as an output); then, after the
 * train pass, ts_pass_monitor_order makes every update-phase node run
 * after every monitor. */
ts_status ts_pass_monitor(ts_graph *g, const int32_t *params, const int32_t *grads, int n);
ts_status ts_pass_monitor_order(ts_graph *g);
/* Mixed precision (precision.c): matmuls and convs on bf16/f16 operands with f32
 * output, one shared cast per value, per the policy in `o`; with low_kernels (the
 * backend runs the op kernels' bf16 forms: attention.low and the out_low of unary, norm,
 * permute and cross_entropy) and bf16, attention's block products in bf16 too, and the
 * bf16 cast of a GELU, layer norm, permute or cross-entropy backward folded into it.
 * *n_cast (may be NULL) receives the number of casts inserted. Run after the train
 * pass. ts_precision_check validates the options alone. */
ts_status ts_precision_check(const ts_precision_options *o);
ts_status ts_pass_precision(ts_graph *g, const ts_precision_options *o, int low_kernels,
                            int *n_cast);
/* The GELU backward without its exp (gelu_grad.c): where a gelu(x) is the last reader of x
 * before a GELU backward (unary_bwd with fwd_op gelu, or a sum with reduce.bwd gelu), the gelu
 * also writes g = gelu'(x) (unary.out_grad) and the backward multiplies by g (side 2); the
 * same bits. For backends that run the op table's kernels; run after ts_pass_precision.
 * *n_rewritten (may be NULL) receives the number of backward nodes rewritten. */
ts_status ts_pass_gelu_grad(ts_graph *g, int *n_rewritten);
/* The packed attention backward with bf16 products whose dqkv only the bias-gradient sum of
 * the precision pass reads (through a view) writes dqkv in bf16 and the column sums itself
 * (attention.out_low, attn_bwd_low.c) and the sum goes (a view of the sums now). For backends
 * that run the op table's kernels; run after ts_pass_precision, then compact the graph.
 * *n_rewritten (may be NULL): how many attention_bwd nodes. */
ts_status ts_pass_attn_bwd_low(ts_graph *g, int *n_rewritten);
/* A bf16 qkv projection (a low matmul_epi) whose output only the bf16 attention reads (the
 * packed attention and attention_bwd with attention.low, through reshapes) writes it in bf16
 * (matmul_epi.out_low; qkv_low.c): the same bits for the attention, half the bytes. For
 * backends that run the op table's kernels; run after ts_pass_attn_bwd_low. Changes only
 * types and attributes. *n_rewritten (may be NULL): how many matmul_epi nodes. */
ts_status ts_pass_qkv_low(ts_graph *g, int *n_rewritten);
/* 1 when ts_pass_precision would run at least one matmul of g in o->compute (a plan can then
 * only be built where that GEMM exists: backends/cpu/dnnl_caps.h). */
int ts_precision_lowers_matmul(const ts_graph *g, const ts_precision_options *o);

/* Loss scaling (loss_scale.c), in three steps around autodiff and the
 * train pass: the scale state and the scaled loss (*scaled is what
 * autodiff differentiates, *scale the state value); one unscale_grads
 * node over the gradients (*node, -1 if none); every later reader of a
 * gradient ordered after that node. */
ts_status ts_pass_loss_scale_loss(ts_graph *g, const ts_precision_options *o, int32_t loss,
                                  int32_t *scaled, int32_t *scale);
ts_status ts_pass_loss_scale_unscale(ts_graph *g, int32_t scale, const int32_t *grads, int n,
                                     int32_t *node);
ts_status ts_pass_loss_scale_order(ts_graph *g, int32_t node);

/* The plan's mode (training 1, inference 0) into the training attribute
 * of dropout and batch-norm nodes (train_mode.c). */
ts_status ts_pass_train_mode(ts_graph *g, int training);

/* The fused attention reads q, k, v from the qkv projection's [B, T, 3D] output and writes
 * its output as [B, T, H, hd] where the graph slices and permutes them (attention_qkv.c);
 * before autodiff, leaving the old chain for simplify. head_dim > 0: only attentions of that
 * head size (the backend's packed form, ts_backend.packed_attention_hd). *n_folded (may be
 * NULL): how many. */
ts_status ts_pass_attention_qkv(ts_graph *g, int64_t head_dim, int *n_folded);

/* Dead-code elimination, common-subexpression elimination, constant
 * folding. Keeps outputs, gradients and side effects. Renumbers values:
 * *remap (size = old value count) receives old -> new ids if non-NULL. */
ts_status ts_pass_simplify(ts_graph *g, int32_t **remap);

/* Row chunks of the cross-entropy backward and of the one matmul that
 * reads it (the head's input gradient), where the logits are kept; see
 * chunk_ce.c. *n_chunked (may be NULL) gets how many were chunked. */
ts_status ts_pass_chunk_ce(ts_graph *g, int *n_chunked);

/* A cross_entropy and its cross_entropy_bwd as one cross_entropy_fused (one
 * pass over the logits), where the gradient's seed is ready before the
 * forward; see fuse_ce.c. Marks the backward dead: compact afterwards.
 * *n_fused (may be NULL) gets how many pairs were fused. */
ts_status ts_pass_fuse_ce(ts_graph *g, int *n_fused);

/* Fusion (after simplify): GEMM epilogues (bias, relu, residual add become
 * oneDNN post-ops of one matmul_epi) and trees of f32 elementwise ops (one
 * fused_eltwise each). Marks the fused nodes dead: compact afterwards. */
typedef struct ts_fuse_stats {
    int epilogues;   /* matmul_epi nodes made */
    int groups;      /* fused_eltwise nodes made */
    int concats;     /* sums of slice gradients made one concat */
    int nodes_fused; /* nodes that disappeared into them */
    int norms;       /* layer norm pairs made one op: with an activation (forward or
                        backward) or with the add of its input gradient */
} ts_fuse_stats;
ts_status ts_pass_fuse(ts_graph *g, ts_fuse_stats *stats);
/* The same with switches: no_norm keeps activations, layer norms and the
 * adds of their input gradients apart (fuse_norm.c; compile.no_fuse_norm);
 * grads_released says the parameters' gradients are temporaries that are
 * not kept after the step (ZeRO-3, whose gradient buckets live from their
 * first gradient to their reduce-scatter): a gradient that is a
 * scatter_add plus another tensor then becomes a scatter_add_to too. */
typedef struct ts_fuse_options {
    int no_norm;
    int grads_released;
} ts_fuse_options;
ts_status ts_pass_fuse_ex(ts_graph *g, const ts_fuse_options *o, ts_fuse_stats *stats);

/* Peak bytes of intermediate values alive at once if nodes run in
 * `order` (n entries). */
size_t ts_schedule_peak(const ts_graph *g, const int32_t *order, int n);
/* A topological order (node ids) chosen to lower peak live memory. Falls
 * back to build order when that is no worse. *peak and *naive_peak get the
 * two estimates. */
ts_status ts_pass_schedule(const ts_graph *g, int naive, int32_t **order, int *n_order,
                           size_t *peak, size_t *naive_peak);
/* The memory-aware schedule ts_compile runs: of build order, the greedy
 * order and the order search (schedule_search.c, docs/scheduling.md), the
 * one whose temporaries region memplan lays out smallest (ties: the
 * earlier); with naive, build order. rep gets each one's region. */
#define TS_SCHEDULE_BEAM 64
typedef struct ts_schedule_options {
    int naive;         /* keep build order */
    int allow_inplace; /* as memplan will run */
    int beam;          /* search states per layer (0: TS_SCHEDULE_BEAM) */
} ts_schedule_options;
typedef struct ts_schedule_report {
    size_t peak;          /* memplan's temporaries for the chosen order */
    size_t arena;         /* ... and its whole arena */
    size_t naive_peak;    /* ... for build order */
    size_t greedy_peak;   /* ... for the greedy order (SIZE_MAX: not tried) */
    size_t search_region; /* ... for the searched order (SIZE_MAX: not tried) */
    size_t search_peak;   /* the search's own estimate (live bytes at the worst step) */
    const char *method;   /* "build order", "greedy" or "search" */
} ts_schedule_report;
ts_status ts_pass_schedule_mem(const ts_graph *g, const ts_schedule_options *o, int32_t **order,
                               int *n_order, ts_schedule_report *rep);
/* The schedule under a memory limit (recompute.c): schedule as above; while
 * the arena exceeds limit bytes (0: no limit), recompute forward
 * activations in the backward (copies of their producers, the same bits),
 * cheapest FLOPs per byte first among those alive at the peak, and
 * schedule again. Refuses (TS_ERR_INVALID, naming what the step needs) when
 * nothing more can be recomputed. loss < 0: an inference graph (no
 * recompute). */
typedef struct ts_recompute_report {
    int n;               /* activations recomputed */
    double flops;        /* their producers' FLOPs: the work added per step */
    size_t arena_before; /* the arena without recompute */
    size_t arena_after;  /* ... with it */
} ts_recompute_report;
ts_status ts_pass_recompute_fit(ts_graph *g, int32_t loss, size_t limit,
                                const ts_schedule_options *so, int32_t **order, int *n_order,
                                ts_schedule_report *rep, ts_recompute_report *rr);

/* Data parallelism: per gradient bucket an allreduce_start node right
 * after its last gradient in `order` and an allreduce_wait node before the
 * first later reader (src/passes/distribute.c). Replaces *order (the new
 * nodes inserted) and sets *n_buckets to the number of ticket slots the
 * plan needs (0: no gradients). With zero, see distribute.c. */
typedef struct ts_dist_spec {
    size_t bucket_bytes;       /* buckets after the first */
    size_t first_bucket_bytes; /* the first bucket */
    int algo;                  /* ts_coll_algo of the collectives */
    int zero;                  /* 1: ZeRO-1 (reduce-scatter, sharded update, all-gather); 2: ZeRO-2;
                                  3: ZeRO-3 (the parameters too, zero3.c) */
    int no_prefetch;           /* ZeRO-3: gather each bucket right before its use */
    int shared_params;         /* ZeRO: the ranks update one shared copy of the parameters in
                                  place (ts_comm_shares_memory); no all-gather */
    int summed_grads;          /* ZeRO-1/2: no reduce-scatter; the gradients, which the
                                  update gate replaces by the ranks' sum (dist.reproducible),
                                  are read in place by each rank's shard update */
    int rank, size;            /* this rank of size (ZeRO: which shard) */
    int32_t *loss;             /* ZeRO compacts the graph: the loss id is remapped */
    ts_compress_options compress; /* method 0: the dense all-reduce */
    int param_order;              /* buckets and their layout by parameter, not by when the
                                     schedule finishes each gradient: plans of one model at
                                     other shapes lay out their gradients alike */
} ts_dist_spec;
ts_status ts_pass_distribute(ts_graph *g, int32_t **order, int *n_order, const ts_dist_spec *d,
                             int *n_buckets);
/* ZeRO-3 (zero3.c): one parameter bucket of the distribute pass: its k
 * parameters in memplan's order, the rank's persistent block of them
 * (shard, a state value of elems' ts_comm_block), and its shard_update. */
typedef struct ts_zero3_bucket {
    const int32_t *params;
    int k;
    int32_t shard, update;
    int64_t elems;
} ts_zero3_bucket;
/* Inserts into *order (m nodes, reallocated) per bucket an all-gather of
 * the parameters from the blocks before their first forward use and
 * another before their first backward use (after the loss), and another
 * within a phase after a long gap between readers, each reader ordered
 * after its gather's wait; with prefetch (!d->no_prefetch) the next
 * bucket's gather starts one bucket ahead. *n_gathers: how many (their
 * ticket slots are nb .. nb + *n_gathers - 1). */
ts_status ts_zero3_gathers(ts_graph *g, int32_t **order, int *m, const ts_dist_spec *d,
                           const ts_zero3_bucket *b, int nb, int *n_gathers);
/* Gradient compression (compress.c): checks and the SGD rewrite before the
 * buckets (momentum: the correction's factor, 0: none; scale: the loss
 * scale's value with loss scaling, -1: none), then bucket b's start and
 * wait nodes in place of allreduce_start/wait. */
typedef struct ts_compress_prep {
    double momentum;
    int32_t scale;
    double clip; /* topk's local clipping (dist.compress_clip, else train.clip_grad_norm) */
} ts_compress_prep;
ts_status ts_compress_prepare(ts_graph *g, const ts_dist_spec *d, ts_compress_prep *p);
ts_status ts_compress_bucket(ts_graph *g, const ts_dist_spec *d, const ts_compress_prep *p, int b,
                             const ts_val *grads, int k, int32_t *start, int32_t *wait);

/* The memory plan: one arena with fixed regions. */
typedef struct ts_memplan {
    size_t *off;           /* per value: byte offset in the arena (SIZE_MAX: none) */
    size_t *scratch_off;   /* per node: scratch offset */
    size_t *scratch_bytes; /* per node */
    char *alias_skip;      /* per node: 1 if its output is its input's memory (no kernel) */
    size_t param_off, param_bytes;
    size_t grad_off, grad_bytes;
    size_t state_off, state_bytes;
    size_t io_off, io_bytes;
    size_t temp_off, temp_bytes;
    size_t arena_bytes;
    size_t naive_bytes; /* sum of every value's size plus scratch */
    int n_inplace;
    /* ZeRO-2: gradient buckets planned inside the temporaries region */
    size_t zero_grad_bytes;  /* all buckets together (the full gradients) */
    size_t zero_grad_peak;   /* the most bucket bytes alive at once */
    size_t zero_shard_bytes; /* this rank's shards of the reduced gradients */
    /* ZeRO-3: the buckets' gathered parameters, planned inside the temporaries */
    size_t zero_param_bytes; /* all buckets together (the full parameters) */
    size_t zero_param_peak;  /* the most of them alive at once */
} ts_memplan;

ts_status ts_pass_memplan(const ts_graph *g, const int32_t *order, int n_order, int allow_inplace,
                          ts_memplan *mp);
void ts_memplan_free(ts_memplan *mp);

#endif
