/* attrs.h — the attributes of a node, by op family (internal).
 *
 * A node's attributes (ts_node.a, and ts_instr.a / ts_kargs.a after
 * compile) are one ts_attrs: a union of one struct per op family, read and
 * written by name (n->a.matmul.trans_a, k->a->conv.stride[j]). Each op
 * documents below which member it uses (ops.def names it beside the op);
 * ops without attributes leave them all zero.
 *
 * Rules that keep ts_attrs a plain value that CSE (passes/simplify.c) can
 * hash and compare bytewise: every member is made of int64_t and double
 * only (no padding), and every ts_attrs starts from ts_attrs_zero() (all
 * bytes zero; a copy of another node's attributes is fine too) before its
 * fields are written by name. Unused fields stay 0.
 */
#ifndef TS_ATTRS_H
#define TS_ATTRS_H

#include <stdint.h>
#include <string.h>

/* The most dims a shape attribute holds: TS_MAX_RANK (include/tessel/graph.h;
 * ops/shape.c checks that the two agree). */
#define TS_ATTR_RANK 8

/* maxmin_bwd (dy, a, b) -> da or db (ops/binary.c): min 0 the forward was
 * maximum, 1 minimum; side 0 the gradient of a, 1 of b. */
typedef struct ts_maxmin_attrs {
    int64_t min, side;
} ts_maxmin_attrs;

/* The unary elementwise ops with parameters (ops/unary.c): gelu: approx (a
 * ts_gelu_approx), out_low 1 (set by the precision pass, f32 input) writes
 * the result rounded to bf16 instead of f32 plus a cast, out_grad 1 (set by
 * the gelu_grad pass, f32 input) adds a second output, the f32 derivative
 * gelu'(x) computed from the same exp; pow_scalar: x^exponent; leaky_relu:
 * slope, the negative slope; affine_scalar: scale * x + shift. The other
 * unary ops have none. approx and out_grad share a word so that a
 * unary_bwd's attributes still fit a fused instruction record (ops/fused.h). */
typedef struct ts_unary_attrs {
    int32_t approx, out_grad;
    double exponent, slope, scale, shift;
    int64_t out_low;
} ts_unary_attrs;

/* unary_bwd (dy, s) -> dx: the gradient of the unary op fwd_op (with its
 * attributes fwd) from s, its input x (side 0), its output y (side 1) or,
 * for gelu, the derivative itself (side 2: dx = dy * s, s the forward's
 * out_grad output). */
typedef struct ts_unary_bwd_attrs {
    int64_t fwd_op, side;
    ts_unary_attrs fwd;
} ts_unary_bwd_attrs;

/* cast: the target dtype (a ts_dtype). */
typedef struct ts_cast_attrs {
    int64_t dtype;
} ts_cast_attrs;

/* reshape, expand (ops/shape.c): the output's rank and dims[0..rank). */
typedef struct ts_shape_attrs {
    int64_t rank;
    int64_t dims[TS_ATTR_RANK];
} ts_shape_attrs;

/* permute: output dim i is input dim perm[i] (i < the input's rank);
 * out_low 1 (set by the precision pass, f32 input) writes the copy rounded
 * to bf16 instead of f32 plus a cast. */
typedef struct ts_permute_attrs {
    int64_t perm[TS_ATTR_RANK];
    int64_t out_low;
} ts_permute_attrs;

/* concat: the axis the inputs are joined along. */
typedef struct ts_concat_attrs {
    int64_t axis;
} ts_concat_attrs;

/* slice: [start, end) of axis (normalised, non-empty); slice_bwd (dy) ->
 * zeros of the source's shape with dy at the slice: the same, and extent,
 * the source's size along axis. */
typedef struct ts_slice_attrs {
    int64_t axis, start, end, extent;
} ts_slice_attrs;

/* dropout (ops/dropout.c): p, the probability of a zero; stream, the
 * graph's random stream of this dropout (its backward reuses it); training
 * 1 in training plans (the train_mode pass sets it; 0: the identity). */
typedef struct ts_dropout_attrs {
    int64_t stream, training;
    double p;
} ts_dropout_attrs;

/* cross_entropy, cross_entropy_bwd (ops/loss.c): rows whose target is
 * ignore_index add nothing. cross_entropy_bwd with row_count > 0 computes
 * only rows [row_start, row_start + row_count) of the logits gradient (the
 * chunk_ce pass, passes/chunk_ce.c); 0: every row. cross_entropy_bwd with
 * out_low 1 (set by the precision pass, f32 logits) writes the gradient
 * rounded to bf16 instead of f32 plus a cast. */
typedef struct ts_cross_entropy_attrs {
    int64_t ignore_index;
    int64_t row_start, row_count;
    int64_t out_low;
} ts_cross_entropy_attrs;

/* batch_norm, batch_norm_bwd (ops/batchnorm.c): affine (weight and bias
 * inputs), relu (a relu fused on y), channels_last (x [N, spatial..., C]).
 * batch_norm only: training (batch statistics, running ones updated; the
 * train_mode pass sets it), momentum of the running statistics, eps added
 * to the variance. masked (both): a last input, a row mask f32 [N], 1 for
 * present batch items and 0 for absent ones (padding, a missing sensor):
 * statistics and gradients cover the present items only
 * (ts_batch_norm_masked, ts_batch_norm_mask_rows). */
typedef struct ts_batch_norm_attrs {
    int64_t affine, training, relu, channels_last;
    double momentum, eps;
    int64_t masked;
} ts_batch_norm_attrs;

/* gru_cell, lstm_cell and their backward ops (ops/rnn.c): t, the step of
 * the sequence the cell runs. The backward ops: steps, the sequence's
 * length T; has_acc (the accumulated input gradient is the first input),
 * has_dh (a gradient of h'), lstm_cell_bwd: has_dc (a gradient of c'). */
typedef struct ts_rnn_attrs {
    int64_t t, steps, has_acc, has_dh, has_dc;
} ts_rnn_attrs;

/* spmm (ops/sparse.c): the sparse matrix is rows x cols. */
typedef struct ts_spmm_attrs {
    int64_t rows, cols;
} ts_spmm_attrs;

/* quantize, dequantize, fake_quant, fake_quant_bwd (ops/quant.c): format,
 * the FP8 dtype; axis, the channel axis of a per-channel scale, -1 for one
 * scale per tensor. */
typedef struct ts_quant_attrs {
    int64_t format, axis;
} ts_quant_attrs;

/* fused_eltwise (ops/fused.h): n_instr instructions of the program over
 * n_ext external inputs. */
typedef struct ts_fused_attrs {
    int64_t n_instr, n_ext;
} ts_fused_attrs;

/* matmul: y = op(a) op(b), op a transpose when trans_a / trans_b is 1.
 * low = 1 (set by the precision pass): bf16/f16 operands, f32 accumulation
 * and output. */
typedef struct ts_matmul_attrs {
    int64_t trans_a, trans_b, low;
} ts_matmul_attrs;

/* matmul_epi (built by the fusion pass, see ops/fused.h): a matmul
 * (trans_a, trans_b, low as matmul) followed by n_post post-ops, post[p] one
 * of TS_EPI_ADD. The post-ops and their operands are f32. */
#define TS_ATTR_EPI_MAX 4
enum { TS_EPI_ADD = 1 }; /* matmul_epi post[p] */
typedef struct ts_matmul_epi_attrs {
    int64_t trans_a, trans_b, n_post;
    int64_t post[TS_ATTR_EPI_MAX];
    int64_t low; /* set by the precision pass: bf16/f16 A and B, f32 accumulation */
    /* set by passes/qkv_low.c (with low, bf16 A and B): the output is the f32 result (the
     * accumulator plus the post-ops) rounded to bf16, to nearest even as the cast op */
    int64_t out_low;
} ts_matmul_epi_attrs;

/* conv, conv_bwd_data, conv_bwd_weight, conv_transpose (ops/conv.c): nd
 * spatial dims (1, 2 or 3), groups; stride, padding (both sides) and
 * dilation of spatial dim j < nd. extra[j]: conv: 0; conv_bwd_data: the
 * input size beyond the smallest input that gives dy's size (the rows a
 * strided conv never read, < stride); conv_bwd_weight: the kernel size;
 * conv_transpose: output_padding (< stride). channels_last: 0 activations
 * [N, C, spatial...]; 1 [N, spatial..., C] (weights keep torch's layout),
 * which lets oneDNN run on the arena's memory without reordering it. low
 * (set by the precision pass): 1 when the two tensor operands (conv,
 * conv_transpose: x, w; conv_bwd_data: dy, w; conv_bwd_weight: dy, x) are
 * bf16 or f16 and the op accumulates and writes f32; a bias stays f32. */
typedef struct ts_conv_attrs {
    int64_t nd, groups;
    int64_t stride[3], padding[3], dilation[3];
    int64_t extra[3];
    int64_t channels_last, low;
} ts_conv_attrs;

/* pool, pool_bwd (ops/pool.c): nd spatial dims (1, 2 or 3); mode 0 max,
 * 1 avg (padding not counted), 2 avg count_include_pad, 3 adaptive avg;
 * kernel size of spatial dim j (adaptive: the output size), stride and
 * padding on both sides (adaptive: 0); in_size: pool_bwd only, the input's
 * spatial sizes; channels_last: 1 for x [N, spatial..., C]. */
typedef struct ts_pool_attrs {
    int64_t nd, mode;
    int64_t kernel[3], stride[3], padding[3];
    int64_t in_size[3];
    int64_t channels_last;
} ts_pool_attrs;

/* layer_norm (x[, w][, b]) over the last axis: has_w, has_b say which of
 * the optional inputs are there, eps is added to the variance;
 * layer_norm_bwd and layer_norm_bwd_acc: has_w, has_b as the forward's (eps
 * unused). layer_norm
 * with out_low 1 (set by the precision pass, f32 x) writes y rounded to
 * bf16 instead of f32 plus a cast (mean and rstd stay f32). */
typedef struct ts_norm_attrs {
    int64_t has_w, has_b;
    double eps;
    int64_t out_low;
} ts_norm_attrs;

/* act_layer_norm, layer_norm_act_bwd (built by the fusion pass, see
 * ops/norm_act.c): norm as layer_norm's; act the unary op before the norm
 * (relu, gelu, ...) with its attributes fwd; side (backward only) as
 * unary_bwd's: its saved operand is act's input x (0) or output (1). */
typedef struct ts_norm_act_attrs {
    ts_norm_attrs norm;
    int64_t act, side;
    ts_unary_attrs fwd;
} ts_norm_act_attrs;

/* attention, attention_bwd (ops/attention_fused.c): causal 1 masks the
 * keys after each query; scale multiplies the scores q.k; low 1 (set by
 * the precision pass, f32 tensors only) runs the block products on bf16
 * operands with f32 accumulation, the softmax in f32. out_low 1 (the packed
 * attention_bwd with low 1 only, set by passes/attn_bwd_low.c) writes dqkv
 * rounded to bf16 and, as a second output, its column sums f32 [3 * H * hd]
 * (the qkv bias gradient; ops/attention_bwd_low.c), of rank sums_rank (0 or
 * 1: [3 * H * hd]; more: with leading 1s, the [1, 1, 3 * H * hd] of the
 * keepdim sum it replaces). */
typedef struct ts_attention_attrs {
    int64_t causal;
    double scale;
    int64_t low;
    int64_t out_low, sums_rank;
} ts_attention_attrs;

/* softmax, log_softmax and their backward ops: the axis (normalised). */
typedef struct ts_softmax_attrs {
    int64_t axis;
} ts_softmax_attrs;

/* sgd_update (p, g[, buf][, coef][, c1..c_n_low]) in place: has_buf (a
 * momentum buffer per parameter), has_coef (the clip coefficient after the
 * groups), nesterov; momentum, dampening, weight_decay. The learning rate
 * comes from the step context. n_low: the first n_low parameters each have
 * a bf16 / f16 copy (passes/weight_copies.c), the last inputs in parameter
 * order, which the update rewrites from the new f32 values. */
typedef struct ts_sgd_attrs {
    int64_t has_buf, has_coef, nesterov;
    double momentum, dampening, weight_decay;
    int64_t n_low;
} ts_sgd_attrs;

/* adam_update (p, g, m, v[, coef][, c1..c_n_low]) in place: decoupled 1
 * for AdamW, has_coef; beta1, beta2, eps, weight_decay; n_low as sgd's. */
typedef struct ts_adam_attrs {
    int64_t decoupled, has_coef;
    double beta1, beta2, eps, weight_decay;
    int64_t n_low;
} ts_adam_attrs;

/* clip_coef (g1..gn) -> min(1, max_norm / (norm + 1e-6)). until_step > 0:
 * max_norm holds through that step only, FLT_MAX after it (PowerSGD's
 * dense start clips as the uncompressed run, its compressed steps clip
 * locally: src/passes/compress.c). */
typedef struct ts_clip_attrs {
    double max_norm;
    int64_t until_step;
} ts_clip_attrs;

/* shard_update (ZeRO, ops/optim.c): the update op opt_op (sgd_update or
 * adam_update) with its attributes opt, applied to elements [offset, ...)
 * of the range of n_params parameters. divisor: the ranks the gradient sum
 * is divided by. fused_ranks > 0 (shared parameters, fused): the gradient
 * is the sum over that many ranks' copies of the bucket, fused_elems
 * elements; fused_ranks 1 (dist.reproducible, distribute.c): this rank's
 * own copy, which already holds every rank's sum, read in place. */
typedef struct ts_shard_attrs {
    union {
        ts_sgd_attrs sgd;
        ts_adam_attrs adam;
    } opt;
    int64_t offset, n_params, opt_op, fused_ranks, fused_elems, divisor;
} ts_shard_attrs;

/* The collectives the distribute pass inserts (ops/collective.c):
 * allreduce_start/wait, reduce_scatter_start/wait, all_gather_start/wait,
 * zero_clip_coef, zero_found_inf. ticket: the bucket (its comm and
 * buffers in the plan's distributed runtime); algo: the ts_coll_algo.
 * reduce_scatter_start (and its wait): shard_elems of this rank's shard
 * out of elems in the bucket; zero: the ZeRO stage (2: memplan releases
 * the bucket after its wait); keep_sum: 1 the shard keeps the ranks' sum
 * (its readers divide). all_gather_start: elems as the bucket's
 * reduce-scatter. zero_clip_coef: max_norm, and the ranks the shards' sums
 * are divided by. */
typedef struct ts_bucket_attrs {
    int64_t ticket, algo, shard_elems, elems, zero, keep_sum, ranks;
    double max_norm;
} ts_bucket_attrs;

/* Gradient compression (ops/compress.c, passes/compress.c): ticket slot
 * and algo as in ts_bucket_attrs; method (ts_compress_method); values
 * (ts_compress_values); elems of the bucket; kmax, the most values a rank
 * sends (topk) or the factor elements (powersgd); warmup steps; ranks;
 * rank r of the factors; ratio; momentum (DGC correction, 0: none); clip
 * (local clipping threshold, 0: none); scaled: 1 when the gradients are
 * loss-scaled and the start and wait nodes take the scale as their last
 * input (see src/ops/compress.c); iters, PowerSGD's power iterations a step
 * (0 and 1: one). scaled and iters share a word so that the struct still
 * fits ts_conv_attrs. */
typedef struct ts_compress_attrs {
    int64_t ticket, algo, method, values, elems, kmax, warmup, ranks, rank, min_elems;
    int32_t scaled;
    int32_t iters;
    int64_t dense;     /* steps 1..dense exchange the gradients dense */
    int64_t max_elems; /* powersgd: larger gradients go dense (0: no limit) */
    double ratio, momentum, clip;
} ts_compress_attrs;

/* reduce_sum, reduce_max, reduce_max_bwd (ops/reduce.c): axes as a bit
 * mask (bit j: axis j), keepdim, scale (the mean: 1/n; the sum: 1).
 * reduce_sum with out_low 1 (set by the precision pass, f32 input) has a
 * second output: the input rounded to bf16, as a cast would write it, made
 * in the same pass over the input as the sum. */
typedef struct ts_reduce_attrs {
    int64_t axes, keepdim;
    double scale;
    int64_t out_low;
    /* A sum of the precision pass (out_low 1, leading axes) may have a second
     * input: it then sums, and rounds into output 1, unary_bwd(dy = input 0,
     * s = input 1) with these attributes, computed a row piece at a time and
     * never stored (a bias gradient behind a GELU: fold_bwd_sums). */
    ts_unary_bwd_attrs bwd;
} ts_reduce_attrs;

/* gather (data, idx), scatter_add (dy, idx) (ops/index.c): the axis;
 * scatter_add: extent, the data's size along it. */
typedef struct ts_index_attrs {
    int64_t axis, extent;
} ts_index_attrs;

typedef struct ts_attrs {
    union {
        ts_maxmin_attrs maxmin;         /* maxmin_bwd */
        ts_unary_attrs unary;           /* gelu, pow_scalar, leaky_relu, affine_scalar */
        ts_unary_bwd_attrs unary_bwd;   /* unary_bwd */
        ts_cast_attrs cast;             /* cast */
        ts_matmul_attrs matmul;         /* matmul */
        ts_matmul_epi_attrs matmul_epi; /* matmul_epi */
        ts_norm_attrs norm;             /* layer_norm, layer_norm_bwd(_acc) */
        ts_norm_act_attrs norm_act;     /* act_layer_norm, layer_norm_act_bwd */
        ts_attention_attrs attention;   /* attention, attention_bwd */
        ts_softmax_attrs softmax;       /* softmax, log_softmax, softmax_bwd, log_softmax_bwd */
        ts_sgd_attrs sgd;               /* sgd_update */
        ts_adam_attrs adam;             /* adam_update */
        ts_clip_attrs clip;             /* clip_coef */
        ts_shard_attrs shard;           /* shard_update */
        ts_bucket_attrs bucket;         /* the collectives (allreduce_start, ..., zero_found_inf) */
        ts_compress_attrs compress;     /* compress_start/wait, psgd_start/wait */
        ts_reduce_attrs reduce;         /* reduce_sum, reduce_max, reduce_max_bwd */
        ts_index_attrs index;           /* gather, scatter_add */
        ts_shape_attrs shape;           /* reshape, expand */
        ts_permute_attrs permute;       /* permute */
        ts_concat_attrs concat;         /* concat */
        ts_slice_attrs slice;           /* slice, slice_bwd */
        ts_dropout_attrs dropout;       /* dropout */
        ts_cross_entropy_attrs cross_entropy; /* cross_entropy, cross_entropy_bwd */
        ts_batch_norm_attrs batch_norm;       /* batch_norm, batch_norm_bwd */
        ts_rnn_attrs rnn;                     /* gru_cell, gru_cell_bwd, lstm_cell, lstm_cell_bwd */
        ts_spmm_attrs spmm;                   /* spmm */
        ts_quant_attrs quant;                 /* quantize, dequantize, fake_quant, fake_quant_bwd */
        ts_fused_attrs fused;                 /* fused_eltwise */
        ts_pool_attrs pool;                   /* pool, pool_bwd */
        ts_conv_attrs conv; /* conv, conv_bwd_data, conv_bwd_weight, conv_transpose */
    };
} ts_attrs;

/* ts_attrs is in every node and instruction, as large as its largest
 * member, conv: a family that outgrows it grows them all, so that is a
 * deliberate change of these checks. */
#define TS_ATTRS_FIT(T)                                                                            \
    _Static_assert(sizeof(T) <= sizeof(ts_conv_attrs), #T " is larger than ts_conv_attrs")
TS_ATTRS_FIT(ts_unary_bwd_attrs);
TS_ATTRS_FIT(ts_matmul_epi_attrs);
TS_ATTRS_FIT(ts_norm_act_attrs);
TS_ATTRS_FIT(ts_pool_attrs);
TS_ATTRS_FIT(ts_shard_attrs);
TS_ATTRS_FIT(ts_bucket_attrs);
TS_ATTRS_FIT(ts_compress_attrs);
TS_ATTRS_FIT(ts_shape_attrs);
TS_ATTRS_FIT(ts_permute_attrs);
TS_ATTRS_FIT(ts_batch_norm_attrs);
TS_ATTRS_FIT(ts_rnn_attrs);
_Static_assert(sizeof(ts_attrs) == sizeof(ts_conv_attrs), "ts_attrs grew beyond ts_conv_attrs");

/* All-zero attributes (every byte, so that bytewise comparisons hold). */
static inline ts_attrs ts_attrs_zero(void) {
    ts_attrs a;
    memset(&a, 0, sizeof a);
    return a;
}

#endif
