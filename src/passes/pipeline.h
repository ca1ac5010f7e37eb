/* pipeline.h — the compiler's passes as one table (pipeline.c).
 *
 * Every pass is a row: its name, the predicate that enables it for this
 * compile, and its run function, all on one context. ts_compile fills a
 * ts_pass_ctx and calls
 *
 *     ts_pass_ctx c;
 *     ts_pass_ctx_init(&c, graph, spec, &opt, params, grads, n_params, loss);
 *     ts_status s = ts_pipeline_run(&c);
 *     ... c.order, c.mp, c.loss, c.fuse, c.n_buckets ...
 *     ts_pass_ctx_free(&c);
 *
 * With opt.dump_after naming a pass, the graph is printed (ts_graph_print,
 * the IR's text form) to opt.dump_to right after that pass's position in
 * the table, whether or not it was enabled. */
#ifndef TS_PIPELINE_H
#define TS_PIPELINE_H

#include <stdio.h>
#include "passes/passes.h"

typedef struct ts_pass_ctx {
    /* inputs */
    ts_graph *g;
    const ts_train_spec *spec;     /* NULL in an inference compile */
    const ts_compile_options *opt; /* the options (precision, comm, switches) */
    int training;                  /* a loss was given */
    const int32_t *params;         /* the trainable parameters (training) */
    int n_params;
    /* the backend computes a matmul's rows in chunks with the whole product's
     * bits (ts_backend.row_chunks_exact; ts_pass_ctx_init: 1) */
    int row_chunks_exact;
    /* the backend runs act_layer_norm, its backward and layer_norm_bwd_acc
     * (ts_pass_ctx_init: 1) */
    int fused_norm_ok;
    /* the backend runs cross_entropy_fused (ts_pass_ctx_init: 1) */
    int fused_ce_ok;
    /* the backend runs the op kernels' bf16 forms, attention.low and the out_low of unary,
     * norm, permute and cross_entropy (host backends: the op table's kernels) */
    int low_kernels_ok;
    /* attention_qkv's packed attention: -1 the backend has none, 0 any head size, > 0 only
     * that head size (ts_backend.packed_attention_hd; ts_pass_ctx_init: 0) */
    int64_t packed_attention_hd;
    /* state carried between passes, and the outputs */
    int32_t loss;    /* the loss value id (-1: inference), remapped as passes renumber */
    int32_t *grads;  /* per parameter: its gradient (autodiff) */
    int32_t diff;    /* what autodiff differentiates: the loss or the scaled loss */
    int32_t scale;   /* the loss scale state value, -1 without loss scaling */
    int32_t unscale; /* the unscale_grads node, -1 if none */
    ts_fuse_stats fuse;
    int32_t *order; /* the schedule (node ids; owned) */
    int n_order;
    size_t peak_live, naive_peak;
    /* recompute under compile.max_memory_mb; the order the schedule kept */
    ts_recompute_report recompute;
    const char *sched_method;
    int n_buckets;   /* gradient buckets of the distribute pass */
    int zero_shared; /* ZeRO with parameters shared by the ranks */
    ts_memplan mp;   /* the memory plan (owned) */
    int32_t *frozen; /* with PEFT: params and grads replaced by the LoRA parameters' (owned) */
} ts_pass_ctx;

typedef struct ts_pass_def {
    const char *name;
    int (*enabled)(const ts_pass_ctx *c);
    ts_status (*run)(ts_pass_ctx *c);
} ts_pass_def;

/* The table, in the order passes run. */
int ts_pass_count(void);
const ts_pass_def *ts_pass_at(int i);
/* Index of the pass named name, or -1. */
int ts_pass_find(const char *name);
/* The names, comma-separated, into buf (for help and errors). */
const char *ts_pass_names(char *buf, size_t n);

/* grads: n_params slots the caller owns (training). */
void ts_pass_ctx_init(ts_pass_ctx *c, ts_graph *g, const ts_train_spec *spec,
                      const ts_compile_options *opt, const int32_t *params, int32_t *grads,
                      int n_params, int32_t loss);
/* Run every enabled pass in order (and the dump the options ask for). */
ts_status ts_pipeline_run(ts_pass_ctx *c);
/* Free what the passes made (order, memory plan) unless taken. */
void ts_pass_ctx_free(ts_pass_ctx *c);

#endif
