/* tessel/compile.h — compiling a graph into a training (or inference) plan.
 *
 * ts_compile() turns a graph into a plan: autodiff adds the backward pass,
 * the train pass adds clipping and the optimizer update, then the graph is
 * simplified, scheduled and memory-planned into one arena. The user's graph
 * is not modified (compile works on a copy).
 *
 *     ts_train_spec spec = ts_train_spec_default(loss);
 *     spec.opt = ts_adamw(1e-3, 0.9, 0.999, 1e-8, 0.01);
 *     spec.clip_grad_norm = 1.0;
 *     ts_plan *plan;
 *     if (ts_compile(g, &spec, NULL, &plan) != TS_OK) puts(ts_last_error());
 *
 * An inference-only plan: set spec.loss = TS_NONE (or pass spec = NULL) and
 * mark the values to read with ts_mark_output().
 */
#ifndef TESSEL_COMPILE_H
#define TESSEL_COMPILE_H

#include <stdint.h>
#include <stdio.h>
#include "tessel/graph.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct ts_plan ts_plan;

typedef enum ts_optimizer_kind {
    TS_OPT_NONE = 0, /* compute gradients only (readable with ts_plan_read_grad) */
    TS_OPT_SGD,
    TS_OPT_ADAM,
    TS_OPT_ADAMW
} ts_optimizer_kind;

/* Hyperparameters follow torch.optim exactly (same defaults, same update). */
typedef struct ts_optimizer {
    ts_optimizer_kind kind;
    double lr;
    double momentum, dampening; /* SGD */
    int nesterov;               /* SGD */
    double beta1, beta2, eps;   /* Adam, AdamW */
    double weight_decay;        /* SGD/Adam: L2 added to the gradient; AdamW: decoupled */
} ts_optimizer;

static inline ts_optimizer ts_sgd(double lr, double momentum, double dampening, int nesterov,
                                  double weight_decay) {
    ts_optimizer o = {TS_OPT_SGD, lr, momentum, dampening, nesterov, 0, 0, 0, weight_decay};
    return o;
}
static inline ts_optimizer ts_adam(double lr, double beta1, double beta2, double eps,
                                   double weight_decay) {
    ts_optimizer o = {TS_OPT_ADAM, lr, 0, 0, 0, beta1, beta2, eps, weight_decay};
    return o;
}
static inline ts_optimizer ts_adamw(double lr, double beta1, double beta2, double eps,
                                    double weight_decay) {
    ts_optimizer o = {TS_OPT_ADAMW, lr, 0, 0, 0, beta1, beta2, eps, weight_decay};
    return o;
}

typedef enum ts_lr_kind {
    TS_LR_CONSTANT = 0, /* lr after warm-up */
    TS_LR_LINEAR,       /* warm-up, then linear decay to min_lr at total_steps */
    TS_LR_COSINE        /* warm-up, then cosine decay to min_lr at total_steps */
} ts_lr_kind;

typedef struct ts_lr_schedule {
    ts_lr_kind kind;
    int64_t warmup_steps; /* linear ramp from lr/warmup to lr over these steps (0 = none) */
    int64_t total_steps;  /* for LINEAR and COSINE */
    double min_lr;        /* floor reached at total_steps */
} ts_lr_schedule;

/* Learning rate used at step `step` (1-based) for base rate `lr`. */
double ts_lr_at(const ts_lr_schedule *s, double lr, int64_t step);

typedef struct ts_train_spec {
    ts_val loss;             /* scalar float; TS_NONE for an inference plan */
    const ts_val *trainable; /* NULL: every parameter */
    int n_trainable;
    ts_optimizer opt;
    ts_lr_schedule schedule;
    double clip_grad_norm; /* > 0: scale gradients to this global L2 norm (torch semantics) */
    /* optim.fused_update: one update node per parameter, run as soon as its
     * gradient is complete, so gradients are temporaries of the step (not
     * readable afterwards) instead of a persistent region. Same weights bit
     * for bit. Needs clip_grad_norm 0, no loss scaling, one rank. */
    int fused_update;
} ts_train_spec;

/* loss with plain SGD lr 0.01 (no momentum), constant schedule, no clipping. */
ts_train_spec ts_train_spec_default(ts_val loss);

/* Mixed precision (docs/precision.md). compute = TS_BF16 or TS_F16 runs
 * every matmul (forward and backward) on operands cast to that type with
 * f32 accumulation and output; everything else, the master weights and
 * the optimizer stay f32. Loss scaling multiplies the loss by a scale kept
 * in the plan ("loss_scaler.scale"), unscales the gradients and skips the
 * update when any is non-finite, with torch GradScaler's rule for the
 * scale (ts_plan_step applies it). */
typedef enum ts_loss_scale_kind {
    TS_SCALE_NONE = 0,
    TS_SCALE_DYNAMIC, /* GradScaler: grows and backs off */
    TS_SCALE_STATIC   /* a fixed scale; non-finite steps are still skipped */
} ts_loss_scale_kind;

typedef struct ts_precision_options {
    ts_dtype compute;      /* TS_F32 (default: off), TS_BF16 or TS_F16 */
    const char *keep_fp32; /* comma-separated op names left in f32 ("matmul"); read during
                              ts_compile only; may be NULL */
    ts_loss_scale_kind loss_scale;
    double init_scale;       /* 0: 65536 (dynamic) */
    double growth_factor;    /* 0: 2 */
    double backoff_factor;   /* 0: 0.5 */
    int64_t growth_interval; /* 0: 2000 */
} ts_precision_options;

/* LoRA (docs/peft.md): every matmul whose weight operand is a parameter
 * whose name matches one of `targets` (comma-separated POSIX extended
 * regexes, searched anywhere in the name unless anchored) gets a low-rank
 * update, y = x W^T + s (dropout(x) A^T) B^T, with new parameters
 * NAME.lora_A [r, in] (Kaiming-uniform, a = sqrt(5)) and NAME.lora_B
 * [out, r] (zeros), s = alpha / r (alpha / sqrt(r) with use_rslora). Only
 * the LoRA parameters are trained: every other parameter is frozen (no
 * gradient, no optimizer state, no all-reduce; ts_train_spec.trainable is
 * ignored). A pattern that matches no matmul weight, r < 1 or a bad regex
 * fail ts_compile with TS_ERR_INVALID. */
typedef enum ts_peft_activation {
    TS_PEFT_GELU = 0, /* erf form, the default */
    TS_PEFT_GELU_TANH,
    TS_PEFT_RELU,
    TS_PEFT_TANH
} ts_peft_activation;

typedef struct ts_peft_options {
    const char *targets; /* NULL or "": no LoRA */
    int r;
    double alpha;
    int use_rslora;
    double dropout; /* on the LoRA branch's input, training steps only */
    /* Houlsby adapters: after every layer whose matmul weight matches one
     * of `adapter_after` (same pattern rules as targets), its output y
     * [.., d] becomes y + act(y D^T + bd) U^T + bu with NAME.adapter_down
     * D [hidden, d] (Kaiming-uniform, a = sqrt(5)), NAME.adapter_down_bias
     * [hidden], NAME.adapter_up U [d, hidden] and NAME.adapter_up_bias [d]
     * (zeros: step 0 is the base model exactly). A layer's output is its
     * matmul's, followed through a sparse aggregation (spmm) and a bias add
     * (an add with a rank-1 parameter) that are its only reader (a GCN
     * layer: A_hat x W^T + b). Trained with the LoRA parameters; a pattern
     * that names no layer fails ts_compile with TS_ERR_INVALID. */
    const char *adapter_after; /* NULL or "": no adapters */
    int adapter_hidden;        /* bottleneck width m (>= 1) */
    ts_peft_activation adapter_activation;
} ts_peft_options;

/* Gradient compression of the data-parallel exchange (docs/distributed.md,
 * "Gradient compression"; config dist.compress*). Zero: none, the dense
 * all-reduce. Needs a comm of more than one rank and no ZeRO. */
typedef enum ts_compress_method {
    TS_COMPRESS_NONE = 0,
    TS_COMPRESS_TOPK,     /* per bucket: top-k of gradient + residual, sparse all-gather */
    TS_COMPRESS_POWERSGD, /* per matrix: rank-r factors, all-reduced; small ones dense */
} ts_compress_method;

typedef enum ts_compress_values {
    TS_CVAL_E4M3 = 0,
    TS_CVAL_E5M2,
    TS_CVAL_BF16,
    TS_CVAL_F32,
} ts_compress_values;

typedef struct ts_compress_options {
    int method;           /* ts_compress_method */
    double ratio;         /* topk: share of a bucket's elements sent (0: 0.001) */
    int values;           /* topk: ts_compress_values of the sent values */
    int64_t warmup_steps; /* topk: the share falls from 0.25 to ratio over these steps */
    int momentum;         /* topk: DGC momentum correction (needs SGD with momentum) */
    double clip;          /* topk: local clipping to clip / sqrt(ranks) (0: none) */
    int rank;             /* powersgd: rank of the factors (0: 4) */
    int64_t min_elems;    /* powersgd: tensors with fewer elements go dense */
    int64_t max_elems;    /* powersgd: tensors with more elements go dense (0: no limit) */
    int64_t dense_steps;  /* steps 1..dense_steps exchange every gradient dense */
    int power_iters;      /* powersgd: power iterations a step (0: 1) */
} ts_compress_options;

typedef struct ts_compile_options {
    uint64_t seed;         /* parameter init and dropout (default 0) */
    int threads;           /* 0: all cores (OMP_NUM_THREADS if set) */
    int debug_nan;         /* check every value for NaN/Inf after it is computed */
    int no_simplify;       /* skip DCE/CSE/constant folding */
    int naive_schedule;    /* keep build order instead of the memory-aware schedule */
    int no_inplace;        /* never let an output share its input's memory */
    int reference_kernels; /* run every op on its reference kernel (no oneDNN): for checking */
    int profile;  /* time every instruction of every step (read with ts_plan_profile); off by
                     default, and then a step does not look at the clock at all */
    int monitors; /* gradient monitor nodes: statistics of every gradient, read with
                     ts_plan_monitor() (docs/observability.md) */
    /* Data parallelism (docs/distributed.md, "The distributed step"): with a
     * comm of more than one rank, each rank computes the gradients of its
     * share of the batch and the plan averages them over the ranks in
     * buckets, overlapped with the rest of the backward pass; every rank
     * then applies the same update. The comm must outlive the plan, and
     * every rank must compile the same graph with the same options. */
    struct ts_comm *comm;    /* NULL: one process */
    double bucket_mb;        /* gradient bucket size in MiB (0: 25) */
    double first_bucket_mb;  /* the first bucket, which starts earliest (0: 1) */
    int dist_algo;           /* ts_coll_algo of the gradient all-reduces (0: auto) */
    int zero;                /* 1: ZeRO-1, optimizer state sharded over the ranks; 2: ZeRO-2,
                                gradients sharded too (a bucket's full gradients live only
                                until its reduce-scatter; read them with monitors) */
    int zero_private_params; /* ZeRO where the ranks share memory (shm, one host): 0 (default)
                                keeps one copy of the parameters in the shared segment, each
                                rank updating its block in place (no all-gather); 1: a copy per
                                rank, all-gathered after the update, as across hosts */
    int zero_no_prefetch;    /* ZeRO-3: 0 (default) starts the all-gather of the next parameter
                                bucket one bucket ahead; 1 right before its use */
    int zero_summed_grads;   /* ZeRO-1/2: 1 (dist.reproducible) leaves the gradients whole and
                                unreduced in the step: the update gate writes every rank's sum
                                into them (the fixed tree), and each rank's shard update reads
                                its block of them in place; no reduce-scatter */
    double max_mem_mb;       /* > 0: ts_compile refuses (TS_ERR_UNSUPPORTED) a plan whose
                                memory per process (its arena, with shared parameters)
                                exceeds this many MiB; 0: no limit */
    int no_fuse;          /* keep every op its own kernel: no GEMM epilogues, no fused elementwise
                             groups (for checking fusion; same results, see docs/architecture.md) */
    int no_fuse_norm;     /* keep activations and the layer norms reading them separate ops
                             (for checking that fusion; same results, docs/architecture.md) */
    int no_fuse_ce;       /* keep cross_entropy and its backward two ops, each reading the
                             logits (for checking that fusion; same results) */
    int no_recompute;     /* store every activation the backward reads instead of recomputing
                             large GELU/LayerNorm outputs there (same results, more memory) */
    int no_weight_copies; /* bf16/fp16 plans: cast the weights for the GEMMs every step
                             instead of the optimizer keeping their copies (same results,
                             docs/precision.md) */
    int no_gelu_grad;     /* training plans: the GELU backward evaluates gelu'(x) itself instead
                             of the forward gelu also writing it (same results; for checking,
                             docs/precision.md "The GELU backward") */
    int no_attn_bwd_low_out; /* bf16 training plans: the packed attention backward writes dqkv
                                in f32 and a sum writes its bf16 copy and the qkv bias gradient
                                (for checking, docs/precision.md "The attention backward") */
    int no_qkv_low;          /* bf16 plans: the qkv projection writes f32 q, k and v for the
                                bf16 attention instead of bf16 (same results; for checking,
                                docs/precision.md "The qkv projection writes bf16") */
    int discard_outputs;     /* training plans: values marked as outputs (other than the loss) are
                                not kept readable after the step, so their memory can be reused
                                (e.g. the logits, overwritten by their gradient); benchmarks */
    /* Memory-aware scheduling (docs/scheduling.md): the arena's limit in MiB
     * (0: none). Above it, forward activations are recomputed in the backward
     * until the step fits, else ts_compile refuses naming what it needs. */
    double max_memory_mb;
    ts_precision_options precision; /* zero: everything in f32, no loss scaling */
    const char *backend; /* what runs the plan, by its registered name (src/backends/registry.c):
                            NULL or "cpu" (the default); an unknown name fails ts_compile with
                            TS_ERR_INVALID naming the known ones. Read during ts_compile only */
    int no_cuda_graph;   /* backend "cuda": launch every kernel each step instead of replaying
                            the step captured once as a CUDA graph (docs/cuda.md) */
    /* Print the graph in the IR's text form to dump_to right after the pass
     * named dump_after ("autodiff", "fuse", ..., "memplan": the final graph in
     * schedule order; `tessel help` lists them; an unknown name fails with
     * TS_ERR_INVALID). Both NULL: no dump. Read during ts_compile only. */
    const char *dump_after;
    FILE *dump_to;
    /* Render the dumps that need the graph (TS_DUMP_IR, TS_DUMP_MEMORY of
     * ts_plan_dump) while compiling: the plan keeps no graph, so without
     * this only TS_DUMP_PLAN can be printed later. Costs their text's
     * memory for the plan's life. */
    int keep_dumps;
    ts_peft_options peft;         /* zero: no PEFT; targets is read during ts_compile only */
    ts_compress_options compress; /* zero: no gradient compression */
    int dist_param_order; /* 1: gradient buckets by parameter (the last declared first), not by
                             when the schedule finishes them, so plans of one model at other
                             shapes (ts_compile_shared) lay out and reduce them alike */
} ts_compile_options;

ts_compile_options ts_compile_options_default(void);

/* spec and options may be NULL (inference plan; defaults). */
ts_status ts_compile(const ts_graph *g, const ts_train_spec *spec, const ts_compile_options *opt,
                     ts_plan **out);

#ifdef __cplusplus
}
#endif
#endif
