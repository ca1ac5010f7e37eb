/* op.h — how an op is defined (internal).
 *
 * Every op is one ts_op_def in a file of its family (src/ops/<family>.c)
 * and one line in registry.c. A definition gives:
 *   - infer:  output dtypes and shapes from the input types and attributes;
 *             on a mismatch return ts_fail(TS_ERR_SHAPE, "...") with the
 *             reason; ts_node_add() prefixes the op name and operand shapes.
 *   - grad:   emits the backward nodes through the builder (ts_node_add or
 *             the public ts_* builders). dout[i] is the gradient flowing
 *             into output i (TS_NONE if none); set din[j] for each input j
 *             that gets a gradient (leave TS_NONE otherwise). NULL: the op
 *             is not differentiable (autodiff reports it by name).
 *   - kernel: the reference CPU kernel. Tensors are contiguous row-major;
 *             float ops support f32 and f64 (gradient checks run in f64).
 *   - scratch: bytes of temporary memory the kernel needs (planned in the
 *             arena, so a step allocates nothing). NULL means none.
 *   - cost:   floating-point operations of one execution (for reports).
 */
#ifndef TS_OP_H
#define TS_OP_H

#include "ir/ir.h"

/* The attribute index of the layout flag of the conv ops (conv.c), which
 * the oneDNN backend reads too. */
#define TS_CONV_LAYOUT 12
/* ... and of their mixed-precision flag: bf16/f16 operands, f32 accumulation
 * and output (set by the precision pass). */
#define TS_CONV_LOW 13

typedef enum ts_op_id {
    /* binary elementwise (broadcasting) */
    TS_OP_ADD,
    TS_OP_SUB,
    TS_OP_MUL,
    TS_OP_DIV,
    TS_OP_MAXIMUM,
    TS_OP_MINIMUM,
    TS_OP_MAXMIN_BWD, /* (dy, a, b) -> da or db; i[0]: 0 max 1 min, i[1]: 0 for a, 1 for b */
    TS_OP_WHERE,      /* (cond u8, a, b) */
    /* unary elementwise */
    TS_OP_NEG,
    TS_OP_EXP,
    TS_OP_LOG,
    TS_OP_SQRT,
    TS_OP_RSQRT,
    TS_OP_ABS,
    TS_OP_RELU,
    TS_OP_SIGMOID,
    TS_OP_TANH,
    TS_OP_POW_SCALAR,    /* f[0] exponent */
    TS_OP_LEAKY_RELU,    /* f[0] negative slope */
    TS_OP_AFFINE_SCALAR, /* f[0] * x + f[1] */
    TS_OP_GELU,          /* i[0] ts_gelu_approx */
    TS_OP_CAST,          /* i[0] target dtype */
    TS_OP_UNARY_BWD,     /* (dy, s) -> dx; i[0] fwd op, i[1] s: 0 x 1 y; i[2], f[]: fwd i[0], f[] */
    /* linear algebra */
    TS_OP_MATMUL, /* i[0] trans_a, i[1] trans_b, i[2] bf16/f16 operands -> f32 out */
    /* softmax family; i[0] axis (normalised) */
    TS_OP_SOFTMAX,
    TS_OP_LOG_SOFTMAX,
    TS_OP_SOFTMAX_BWD,     /* (dy, y) */
    TS_OP_LOG_SOFTMAX_BWD, /* (dy, y) */
    /* layer norm over the last axis */
    TS_OP_LAYER_NORM,     /* (x[, w][, b]) -> (y, mean, rstd); i[0] has_w, i[1] has_b, f[0] eps */
    TS_OP_LAYER_NORM_BWD, /* (dy, x, mean, rstd[, w]) -> (dx[, dw, db]); i[0] has_w, i[1] has_b */
    /* reductions; i[0] axis bitmask, i[1] keepdim, f[0] scale (mean = 1/n) */
    TS_OP_REDUCE_SUM,
    TS_OP_REDUCE_MAX,
    TS_OP_REDUCE_MAX_BWD, /* (dy, x, y) -> dx, ties share equally; same attrs */
    /* shape */
    TS_OP_RESHAPE,   /* output aliases the input's memory */
    TS_OP_PERMUTE,   /* i[0..rank-1] perm */
    TS_OP_EXPAND,    /* broadcast to the target shape; i[0] target rank, i[1..rank] target dims */
    TS_OP_CONCAT,    /* i[0] axis */
    TS_OP_SLICE,     /* i[0] axis, i[1] start, i[2] end */
    TS_OP_SLICE_BWD, /* (dy) -> zeros of the source shape with dy at the slice; i[0..2] as slice,
                        i[3] source extent */
    /* indexing */
    TS_OP_GATHER,      /* (data, idx); i[0] axis */
    TS_OP_SCATTER_ADD, /* (dy, idx) -> zeros of the data shape, += dy at idx; i[0] axis, i[1] data
                          extent */
    /* regularisation */
    TS_OP_DROPOUT, /* f[0] p, i[0] stream id, i[1] 1 in training plans */
    /* losses (scalar outputs) */
    TS_OP_BCE_LOGITS,        /* (x, y) -> mean loss */
    TS_OP_BCE_LOGITS_BWD,    /* (dl, x, y) -> dx */
    TS_OP_CROSS_ENTROPY,     /* (logits[N,C], target[N][, weight[C]]) -> (loss, lse[N]); i[0]
                                ignore_index */
    TS_OP_CROSS_ENTROPY_BWD, /* (dl, logits, target, lse[, weight]) -> dlogits */
    /* training step */
    TS_OP_CLIP_COEF,  /* (g1..gn) -> scalar min(1, max_norm / (norm + 1e-6)); f[0] max_norm */
    TS_OP_SGD_UPDATE, /* (p, g[, buf][, coef]) in place; i[0] has_buf, i[1] has_coef, i[2] nesterov;
                         f[0] momentum, f[1] dampening, f[2] wd; lr from the step context */
    TS_OP_ADAM_UPDATE, /* (p, g, m, v[, coef]) in place; i[0] decoupled (AdamW), i[1] has_coef; f:
                          beta1, beta2, eps, wd */
    /* fused attention (flash-style, no T x T matrix kept); see attention_fused.c */
    TS_OP_ATTENTION,     /* (q, k, v [B,H,T,hd]) -> (o, lse [B,H,T]); i[0] causal; f[0] scale */
    TS_OP_ATTENTION_BWD, /* (do, q, k, v, o, lse) -> (dq, dk, dv); same attrs */
    /* convolution and pooling (N-d, N = 1..3); see conv.c, pool.c */
    /* conv attrs: i[0] nd, i[1] groups, i[2+3j] stride, i[3+3j] padding, i[4+3j] dilation of
     * spatial dim j; i[11] three 21-bit fields (bwd_data: extra input size, bwd_weight: kernel,
     * transpose: output_padding) */
    TS_OP_CONV,            /* (x [N,C,...], w [O,C/g,k...][, b [O]]) -> y */
    TS_OP_CONV_BWD_DATA,   /* (dy, w) -> dx */
    TS_OP_CONV_BWD_WEIGHT, /* (dy, x) -> dw */
    TS_OP_CONV_TRANSPOSE,  /* (x, w [C,O/g,k...][, b [O]]) -> y */
    /* (the four conv ops: attribute i[TS_CONV_LAYOUT] = 1 for channels last) */
    /* pool attrs: i[0] nd, i[1] mode (0 max, 1 avg, 2 avg count_include_pad, 3 adaptive avg),
     * i[2+3j] kernel (adaptive: output size), i[3+3j] stride, i[4+3j] padding; i[11] (bwd)
     * input spatial sizes as three 21-bit fields */
    TS_OP_POOL,     /* (x) -> y */
    TS_OP_POOL_BWD, /* (dy[, x in max mode]) -> dx */
    /* batch normalisation with running statistics; see batchnorm.c */
    TS_OP_BATCH_NORM, /* (x[, w, b], running_mean, running_var) -> (y, mean [C], rstd [C]); stats
                         updated in place in training; i[0] affine, i[1] training (set by
                         ts_compile), i[2] relu fused on y; f[0] momentum, f[1] eps */
    TS_OP_BATCH_NORM_BWD, /* (dy, x, mean, rstd[, w[, b if relu]]) -> (dx[, dw, db]), training-mode
                             gradient; i[0] affine, i[1] relu */
    /* recurrent cells; see rnn.c */
    TS_OP_GRU_CELL, /* (gi [B,T,3H], gh [B,3H], h [B,H]) -> (gi passed on, h', gates r,z,n [B,3H]);
                       i[0] step t */
    TS_OP_GRU_CELL_BWD, /* ([dgi_acc,] h, gates, gh[, dh']) -> (dgi_acc + step t rows, dgh, dh);
                           i[0] t, i[1] has_acc, i[2] has_dh, i[3] T */
    TS_OP_LSTM_CELL,    /* (gi [B,T,4H], gh [B,4H], c [B,H]) -> (gi passed on, h', c', gates i,f,g,o
                           [B,4H]); i[0] step t */
    TS_OP_LSTM_CELL_BWD, /* ([dgi_acc,] c, gates, c'[, dh'][, dc']) -> (dgi_acc + step t rows,
                            dgates, dc); i[0] t, i[1] has_acc, i[2] has_dh, i[3] has_dc, i[4] T */
    /* sparse (CSR) x dense; see sparse.c */
    TS_OP_SPMM, /* (indptr i64 [R+1], indices i64 [nnz], values [nnz], dense [C,F][, transpose's
                   indptr, indices, values]) -> [R,F]; i[0] R, i[1] C */
    /* FP8 quantisation; see quant.c. i[0] FP8 dtype, i[1] channel axis (-1: per tensor) */
    TS_OP_QUANTIZE,       /* (x, scale) -> codes (f8 dtype) */
    TS_OP_DEQUANTIZE,     /* (codes, scale) -> scale's dtype */
    TS_OP_FAKE_QUANT,     /* (x, scale) -> dequantize(quantize(x)) */
    TS_OP_FAKE_QUANT_BWD, /* (dy, x, scale) -> dx, straight-through within range */
    /* monitors; see monitor.c */
    TS_OP_GRAD_STATS, /* (g) -> f64 [TS_GRAD_STATS_N]: sum of squares, sum, non-finite count, numel
                       */
    /* data-parallel collectives inserted by the distribute pass; see collective.c */
    TS_OP_ALLREDUCE_START, /* (g1..gk) -> token i64: starts the sum all-reduce of bucket i[0] in
                              place; i[1] ts_coll_algo */
    TS_OP_ALLREDUCE_WAIT, /* (token, g1..gk) -> token i64: waits for bucket i[0], then g /= ranks in
                             place */
    /* ZeRO-1 (see collective.c, optim.c shard_update) */
    TS_OP_REDUCE_SCATTER_START, /* (g1..gk) -> (token, shard [i[2]]); i[0] ticket, i[1] algo, i[3]
                                   bucket elements */
    TS_OP_REDUCE_SCATTER_WAIT,  /* (token, shard) -> token; shard /= ranks (i[5]: left a sum,
                                   its readers divide) */
    TS_OP_ALL_GATHER_START,     /* (p1..pk) -> token; in place; i[0] ticket, i[1] algo, i[3] bucket
                                   elements */
    TS_OP_ALL_GATHER_WAIT,      /* (token, p1..pk) -> token */
    TS_OP_ZERO_CLIP_COEF, /* (shard1..shardB) -> coef over all ranks' shards; f[0] max_norm, i[1]
                             algo, i[2] ranks the shards' sums are divided by */
    TS_OP_SHARD_UPDATE, /* (p1..pk, g_shard, s1[, s2][, coef]) update of elements [i[5], ...) of the
                           params' range; i[7] sgd/adam op, i[6] k, i[10] ranks the gradient sum is
                           divided by; i[8] > 0 (shared parameters,
                           fused): (p1..pk, g1..gk, s1[, s2]), the gradient the sum over i[8]
                           ranks' copies of the bucket, i[9] elements */
    TS_OP_ZERO_SYNC,    /* () -> token: a barrier of the ranks (shared parameters) */
    TS_OP_ZERO_FOUND_INF, /* (found_1..found_B) -> found_inf: the largest flag over the inputs and
                             the ranks (loss scaling under ZeRO); i[1] algo */
    /* fused ops, built by the fusion pass after autodiff; see fused.h */
    TS_OP_FUSED_ELTWISE, /* (x0.., program) -> y; i[0] instructions, i[1] inputs */
    TS_OP_MATMUL_EPI,    /* (a, b, post-op operands..) -> y; i[0..1] as matmul, i[2] n post, i[3..]
                            kinds */
    /* loss scaling; see amp.c */
    TS_OP_UNSCALE_GRADS, /* (scale, g1..gn) -> found_inf; g_i *= 1/scale in place */
    TS_OP_COUNT
} ts_op_id;

enum { TS_GRAD_STATS_N = 4 };

/* A tensor as a kernel sees it: contiguous, row-major. */
typedef struct ts_tensor {
    ts_dtype dtype;
    int rank;
    int64_t dims[TS_MAX_RANK];
    void *data;
} ts_tensor;

static inline int64_t ts_tensor_numel(const ts_tensor *t) {
    return ts_shape_numel(t->rank, t->dims);
}

/* What the runtime tells a kernel about the step being run. */
typedef struct ts_step_ctx {
    int64_t step;  /* 1-based index of this step */
    uint64_t seed; /* compile seed */
    double lr;     /* learning rate for this step (schedule applied) */
    /* 1-based count of applied updates including this one (the optimizer's
     * t: a step the update gate skips does not count). 0: not counted
     * separately, the optimizer kernels use `step`. */
    int64_t opt_step;
} ts_step_ctx;

typedef struct ts_kargs {
    const ts_attrs *a;
    int n_in, n_out;
    const ts_tensor *in;
    const ts_tensor *out;
    void *scratch; /* scratch_bytes from the op's scratch(); 64-byte aligned */
    size_t scratch_bytes;
    const ts_step_ctx *ctx;
    const char *label; /* name of the first output, for messages */
    void *backend;     /* backend state for this instruction (optimised kernels) */
} ts_kargs;

typedef ts_status (*ts_kernel_fn)(const ts_kargs *k);

enum {
    TS_OPF_ELEMENTWISE = 1 << 0, /* output[i] depends on inputs at i (after broadcast) */
    TS_OPF_SIDE_EFFECT = 1 << 1, /* writes its inputs in place (optimizer): never removed */
    TS_OPF_ALIAS = 1 << 2,       /* output 0 is input 0's memory reinterpreted (reshape) */
    TS_OPF_INPLACE = 1 << 3,     /* output 0 may share input 0's memory when sizes match */
    TS_OPF_RANDOM = 1 << 4,      /* draws random numbers: never merged or folded */
    TS_OPF_UPDATE = 1 << 5,      /* update phase (clip coefficient, optimizer): the update
                                    gate (ts_plan_set_update_gate) may skip it */
    TS_OPF_MONITOR = 1 << 6,     /* reads a gradient into a small monitor output: scheduled
                                    as soon as it is ready, always before the update phase */
    TS_OPF_INPLACE_IN1 = 1 << 7  /* output 0 may share input 1's memory when sizes match */
};

typedef struct ts_op_def {
    const char *name;
    int min_in, max_in; /* input count bounds (max_in -1: unbounded) */
    unsigned flags;
    ts_status (*infer)(const ts_graph *g, const ts_node *n, ts_type *out, int *n_out);
    ts_status (*grad)(ts_graph *g, const ts_node *n, const ts_val *dout, ts_val *din);
    ts_kernel_fn kernel;
    size_t (*scratch)(const ts_graph *g, const ts_node *n);
    double (*cost)(const ts_graph *g, const ts_node *n);
} ts_op_def;

const ts_op_def *ts_op_get(int op);
/* Op id by name, -1 if unknown. */
int ts_op_find(const char *name);

/* Helpers for definitions. */
static inline const ts_type *ts_in_type(const ts_graph *g, const ts_node *n, int i) {
    return &g->values[n->in[i]].t;
}
static inline ts_attrs ts_attrs_zero(void) {
    ts_attrs a = {{0}, {0}};
    return a;
}
/* Broadcast shapes a and b NumPy-style into out; error message on mismatch. */
ts_status ts_broadcast_shapes(const ts_type *a, const ts_type *b, ts_type *out);
/* The gradient dy of a broadcast result, summed down to the shape of value
 * `like` (returns dy itself when shapes already match). Takes a value, not
 * a type pointer: pointers into g->values move as nodes are added. */
ts_val ts_sum_to(ts_graph *g, ts_val dy, ts_val like);
/* Kernel error for a dtype it does not handle. */
ts_status ts_kernel_bad_dtype(const ts_kargs *k, const char *op, ts_dtype dt);

#endif
