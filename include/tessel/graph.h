/* tessel/graph.h — building a model as a graph.
 *
 * A graph holds values (typed tensors with static shapes) and the nodes that
 * produce them. Build it with the functions below; each returns a handle to
 * the new value and infers its dtype and shape on the spot:
 *
 *     ts_graph *g = ts_graph_new();
 *     int64_t xd[] = {64, 784}, wd[] = {10, 784}, bd[] = {10};
 *     ts_val x = ts_input(g, "x", TS_F32, 2, xd);
 *     ts_val y = ts_input(g, "y", TS_I64, 1, xd);               // labels [64]
 *     ts_val w = ts_param(g, "fc.weight", TS_F32, 2, wd, ts_init_kaiming_uniform(sqrt(5)));
 *     ts_val b = ts_param(g, "fc.bias", TS_F32, 1, bd, ts_init_uniform(-0.0357, 0.0357));
 *     ts_val logits = ts_linear(g, x, w, b);                     // [64, 10]
 *     ts_val loss = ts_cross_entropy(g, logits, y, -100);        // scalar
 *     if (ts_graph_status(g) != TS_OK) puts(ts_graph_error(g));
 *
 * Errors are sticky: the first failing builder call records a message naming
 * the op and its operand shapes, returns TS_NONE, and every later call that
 * receives TS_NONE returns TS_NONE quietly. Check ts_graph_status() once at
 * the end (ts_compile() checks it too).
 *
 * Conventions: dimensions are listed outermost first (row-major, as in NumPy
 * and PyTorch); negative axes count from the end; binary elementwise ops
 * broadcast NumPy-style; reductions take a list of axes (none = all).
 */
#ifndef TESSEL_GRAPH_H
#define TESSEL_GRAPH_H

#include <stdint.h>
#include "tessel/dtype.h"
#include "tessel/status.h"

#ifdef __cplusplus
extern "C" {
#endif

#define TS_MAX_RANK 8

typedef struct ts_graph ts_graph;

/* A handle to a value of a graph. id < 0 means "no value". */
typedef struct ts_val {
    int32_t id;
} ts_val;

#define TS_NONE ((ts_val){-1})
static inline int ts_val_ok(ts_val v) {
    return v.id >= 0;
}

/* ---- parameter initialisers ------------------------------------------- */

typedef enum ts_init_kind {
    TS_INIT_ZEROS,
    TS_INIT_ONES,
    TS_INIT_CONSTANT,        /* a = value */
    TS_INIT_NORMAL,          /* a = mean, b = std */
    TS_INIT_UNIFORM,         /* a = low, b = high */
    TS_INIT_KAIMING_UNIFORM, /* a = negative slope (torch's `a`); fan_in mode, leaky_relu gain */
    TS_INIT_KAIMING_NORMAL,  /* a = negative slope */
    TS_INIT_XAVIER_UNIFORM,  /* a = gain */
    TS_INIT_XAVIER_NORMAL,   /* a = gain */
    TS_INIT_BUFFER           /* data = host values in the parameter's dtype (copied) */
} ts_init_kind;

typedef struct ts_init {
    ts_init_kind kind;
    double a, b;
    const void *data;
} ts_init;

/* Fan-in and fan-out follow PyTorch: for dims [out, in, k...],
 * fan_in = in * prod(k), fan_out = out * prod(k). Random initialisers draw
 * from a counter-based generator keyed by the compile seed and the
 * parameter's name, so values do not depend on build order or threads. */
static inline ts_init ts_init_zeros(void) {
    return (ts_init){TS_INIT_ZEROS, 0, 0, 0};
}
static inline ts_init ts_init_ones(void) {
    return (ts_init){TS_INIT_ONES, 0, 0, 0};
}
static inline ts_init ts_init_constant(double v) {
    return (ts_init){TS_INIT_CONSTANT, v, 0, 0};
}
static inline ts_init ts_init_normal(double mean, double std) {
    return (ts_init){TS_INIT_NORMAL, mean, std, 0};
}
static inline ts_init ts_init_uniform(double lo, double hi) {
    return (ts_init){TS_INIT_UNIFORM, lo, hi, 0};
}
static inline ts_init ts_init_kaiming_uniform(double a) {
    return (ts_init){TS_INIT_KAIMING_UNIFORM, a, 0, 0};
}
static inline ts_init ts_init_kaiming_normal(double a) {
    return (ts_init){TS_INIT_KAIMING_NORMAL, a, 0, 0};
}
static inline ts_init ts_init_xavier_uniform(double gain) {
    return (ts_init){TS_INIT_XAVIER_UNIFORM, gain, 0, 0};
}
static inline ts_init ts_init_xavier_normal(double gain) {
    return (ts_init){TS_INIT_XAVIER_NORMAL, gain, 0, 0};
}
static inline ts_init ts_init_buffer(const void *data) {
    return (ts_init){TS_INIT_BUFFER, 0, 0, data};
}

/* ---- graph lifetime and queries -------------------------------------- */

ts_graph *ts_graph_new(void);
void ts_graph_free(ts_graph *g);
/* The first builder error (TS_OK if none) and its message. */
ts_status ts_graph_status(const ts_graph *g);
const char *ts_graph_error(const ts_graph *g);

/* Record an error in the graph (first one wins; also ts_last_error()).
 * For builders of composite layers; returns TS_NONE for convenience. */
ts_val ts_graph_fail(ts_graph *g, ts_status s, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 3, 4)))
#endif
    ;

int ts_rank(const ts_graph *g, ts_val v);
ts_dtype ts_dtype_of(const ts_graph *g, ts_val v);
/* Size of one axis (negative counts from the end); -1 for a bad value/axis. */
int64_t ts_dim(const ts_graph *g, ts_val v, int axis);
int64_t ts_numel(const ts_graph *g, ts_val v);
const char *ts_name(const ts_graph *g, ts_val v);
/* Give a value a name (used in dumps, error messages and ts_plan_read). */
ts_status ts_set_name(ts_graph *g, ts_val v, const char *name);
/* Keep v readable after each step under `name` (e.g. logits, accuracy). */
ts_status ts_mark_output(ts_graph *g, ts_val v, const char *name);
/* Find a value by name; TS_NONE if absent. */
ts_val ts_find(const ts_graph *g, const char *name);

/* ---- leaves ------------------------------------------------------------ */

/* Data fed each step with ts_plan_set_input(). */
ts_val ts_input(ts_graph *g, const char *name, ts_dtype dt, int rank, const int64_t *dims);
/* A trainable tensor, initialised when the plan is created. */
ts_val ts_param(ts_graph *g, const char *name, ts_dtype dt, int rank, const int64_t *dims,
                ts_init init);
/* A constant tensor; data (in dtype dt, row-major) is copied. name may be NULL. */
ts_val ts_constant(ts_graph *g, const char *name, ts_dtype dt, int rank, const int64_t *dims,
                   const void *data);
/* A rank-0 constant. */
ts_val ts_scalar(ts_graph *g, double value, ts_dtype dt);

/* ---- elementwise ------------------------------------------------------- */

ts_val ts_add(ts_graph *g, ts_val a, ts_val b);
ts_val ts_sub(ts_graph *g, ts_val a, ts_val b);
ts_val ts_mul(ts_graph *g, ts_val a, ts_val b);
ts_val ts_div(ts_graph *g, ts_val a, ts_val b);
ts_val ts_maximum(ts_graph *g, ts_val a, ts_val b);
ts_val ts_minimum(ts_graph *g, ts_val a, ts_val b);
ts_val ts_neg(ts_graph *g, ts_val a);
ts_val ts_exp(ts_graph *g, ts_val a);
ts_val ts_log(ts_graph *g, ts_val a);
ts_val ts_sqrt(ts_graph *g, ts_val a);
ts_val ts_rsqrt(ts_graph *g, ts_val a);
ts_val ts_abs(ts_graph *g, ts_val a);
ts_val ts_relu(ts_graph *g, ts_val a);
ts_val ts_sigmoid(ts_graph *g, ts_val a);
ts_val ts_tanh(ts_graph *g, ts_val a);
ts_val ts_pow_scalar(ts_graph *g, ts_val a, double exponent);
ts_val ts_leaky_relu(ts_graph *g, ts_val a, double negative_slope);
/* a * s + t, elementwise, with scalars s and t. */
ts_val ts_affine_scalar(ts_graph *g, ts_val a, double s, double t);
typedef enum ts_gelu_approx { TS_GELU_ERF = 0, TS_GELU_TANH = 1 } ts_gelu_approx;
ts_val ts_gelu(ts_graph *g, ts_val a, ts_gelu_approx approx);
/* Convert dtype (float<->int truncates toward zero). */
ts_val ts_cast(ts_graph *g, ts_val a, ts_dtype to);
/* cond (u8, 0/1) ? a : b, all three broadcast together. */
ts_val ts_where(ts_graph *g, ts_val cond, ts_val a, ts_val b);

/* ---- linear algebra --------------------------------------------------- */

/* a [..., M, K] @ b [..., K, N] -> [..., M, N]; trans_a / trans_b read a or
 * b as its last two axes swapped. Batch axes broadcast; a rank-1 operand is
 * not promoted (use ts_reshape). */
ts_val ts_matmul(ts_graph *g, ts_val a, ts_val b, int trans_a, int trans_b);
/* x [..., in] @ w[out, in]^T + b[out] -> [..., out] (PyTorch nn.Linear). b may be TS_NONE. */
ts_val ts_linear(ts_graph *g, ts_val x, ts_val w, ts_val b);

/* ---- normalisation and softmax ---------------------------------------- */

ts_val ts_softmax(ts_graph *g, ts_val a, int axis);
ts_val ts_log_softmax(ts_graph *g, ts_val a, int axis);
/* Normalise over the last axis; weight and bias [D] may be TS_NONE. */
ts_val ts_layer_norm(ts_graph *g, ts_val x, ts_val weight, ts_val bias, double eps);

/* ---- reductions (naxes == 0 reduces over every axis) ------------------ */

ts_val ts_sum(ts_graph *g, ts_val a, int naxes, const int *axes, int keepdim);
ts_val ts_mean(ts_graph *g, ts_val a, int naxes, const int *axes, int keepdim);
ts_val ts_max(ts_graph *g, ts_val a, int naxes, const int *axes, int keepdim);
/* Mean over the valid sources: x [B, S, ...] (S sources per row, e.g. one
 * representation per sensor branch), valid u8 [B, S] (1: the source is
 * valid) -> [B, ...], the mean of row b's valid sources, 0 for a row with
 * none. An invalid source is never read into the result (a NaN there does
 * not spread into it) and gets an exact zero gradient (upstream, NaN * 0
 * is still NaN: sensor masks, docs/shapes.md). */
ts_val ts_masked_mean(ts_graph *g, ts_val x, ts_val valid);

/* ---- shape ------------------------------------------------------------ */

/* New dims with the same element count; one entry may be -1 (inferred). */
ts_val ts_reshape(ts_graph *g, ts_val a, int rank, const int64_t *dims);
ts_val ts_transpose(ts_graph *g, ts_val a, int axis0, int axis1);
/* out.dims[i] = a.dims[perm[i]] */
ts_val ts_permute(ts_graph *g, ts_val a, const int *perm);
ts_val ts_concat(ts_graph *g, int n, const ts_val *vals, int axis);
/* Elements [start, end) along axis (negative indices count from the end). */
ts_val ts_slice(ts_graph *g, ts_val a, int axis, int64_t start, int64_t end);
/* Split along axis into n pieces of the given sizes (summing to the axis). */
ts_status ts_split(ts_graph *g, ts_val a, int axis, int n, const int64_t *sizes, ts_val *outs);

/* ---- indexing --------------------------------------------------------- */

/* NumPy take: out = data.shape[:axis] + indices.shape + data.shape[axis+1:].
 * indices are i32 or i64; an index out of range is a run-time error naming
 * the value. The gradient scatter-adds into data. */
ts_val ts_gather(ts_graph *g, ts_val data, ts_val indices, int axis);
/* table [V, D], indices [...] -> [..., D] */
ts_val ts_embedding(ts_graph *g, ts_val table, ts_val indices);

/* ---- regularisation --------------------------------------------------- */

/* Inverted dropout with probability p during training steps; identity in
 * inference plans. The mask comes from a counter-based generator keyed by
 * (seed, this node, step), so it is reproducible and independent of threads. */
ts_val ts_dropout(ts_graph *g, ts_val a, double p);

/* ---- losses (all return a scalar, mean over elements) ----------------- */

ts_val ts_mse_loss(ts_graph *g, ts_val pred, ts_val target);
ts_val ts_bce_with_logits(ts_graph *g, ts_val logits, ts_val target);
/* logits [N, C] (or [..., C]), target [N] (or [...]) of class indices (i32 /
 * i64). Targets equal to ignore_index do not count (mean over the rest). */
ts_val ts_cross_entropy(ts_graph *g, ts_val logits, ts_val target, int64_t ignore_index);
/* The same with class weights [C] (torch's weight=): row i counts w[y_i]
 * and the mean is sum_i w[y_i] l_i / sum_i w[y_i] over the rows not
 * ignored. The weights get no gradient (make them a constant). */
ts_val ts_cross_entropy_weighted(ts_graph *g, ts_val logits, ts_val target, ts_val weight,
                                 int64_t ignore_index);

/* ---- attention -------------------------------------------------------- */

/* softmax(q k^T / sqrt(hd) + causal mask) v for q, k, v [B, H, T, hd]. */
ts_val ts_causal_attention(ts_graph *g, ts_val q, ts_val k, ts_val v);

/* ---- convolution and pooling ------------------------------------------ */

/* N-d convolution, nd = 1, 2 or 3 spatial dims, as torch's Conv1d/2d/3d:
 * x [N, C, (D,) (H,) W], w [O, C/groups, k...], b [O] or TS_NONE ->
 * y [N, O, out...] with out = floor((in + 2*padding - dilation*(k-1) - 1) /
 * stride) + 1. stride, padding and dilation hold nd values each; NULL means
 * all 1, all 0 and all 1. groups = C = O is a depthwise convolution. */
ts_val ts_conv(ts_graph *g, ts_val x, ts_val w, ts_val b, int nd, const int64_t *stride,
               const int64_t *padding, const int64_t *dilation, int64_t groups);
/* Where the channel axis of an activation sits. Channels first is torch's
 * layout and every builder's default; channels last ([N, (D,) (H,) W, C])
 * is what the CPU's convolution kernels read and write natively, so a
 * network built in it (conv, pooling and batch norm through the *_layout
 * builders below, concat on the last axis) runs without converting
 * between layouts around every convolution. Weights keep torch's layout
 * either way. */
typedef enum ts_layout { TS_CHANNELS_FIRST = 0, TS_CHANNELS_LAST = 1 } ts_layout;
/* ts_conv with x [N, in..., C] -> y [N, out..., O] when layout is
 * TS_CHANNELS_LAST. */
ts_val ts_conv_layout(ts_graph *g, ts_val x, ts_val w, ts_val b, int nd, const int64_t *stride,
                      const int64_t *padding, const int64_t *dilation, int64_t groups,
                      ts_layout layout);
/* Transposed convolution (torch's ConvTranspose, dilation 1): x [N, C, in...],
 * w [C, O/groups, k...], b [O] or TS_NONE -> y [N, O, out...] with
 * out = (in - 1)*stride - 2*padding + k + output_padding; output_padding
 * (NULL: 0) must be smaller than the stride. */
ts_val ts_conv_transpose(ts_graph *g, ts_val x, ts_val w, ts_val b, int nd, const int64_t *stride,
                         const int64_t *padding, const int64_t *output_padding, int64_t groups);
ts_val ts_conv_transpose_layout(ts_graph *g, ts_val x, ts_val w, ts_val b, int nd,
                                const int64_t *stride, const int64_t *padding,
                                const int64_t *output_padding, int64_t groups, ts_layout layout);
/* Pooling over the nd trailing dims of x [N, C, ...] (floor mode as torch).
 * stride NULL means stride = kernel, padding NULL means 0; padding may be
 * at most half the kernel. Max pooling passes the gradient to the first
 * maximum of each window (a NaN counts as the maximum). */
ts_val ts_max_pool(ts_graph *g, ts_val x, int nd, const int64_t *kernel, const int64_t *stride,
                   const int64_t *padding);
ts_val ts_max_pool_layout(ts_graph *g, ts_val x, int nd, const int64_t *kernel,
                          const int64_t *stride, const int64_t *padding, ts_layout layout);
/* Average over each window; count_include_pad counts padded positions in
 * the divisor (torch's default is 1). */
ts_val ts_avg_pool(ts_graph *g, ts_val x, int nd, const int64_t *kernel, const int64_t *stride,
                   const int64_t *padding, int count_include_pad);
ts_val ts_avg_pool_layout(ts_graph *g, ts_val x, int nd, const int64_t *kernel,
                          const int64_t *stride, const int64_t *padding, int count_include_pad,
                          ts_layout layout);
/* Average into output_size[j] windows per spatial dim; window o spans
 * [floor(o*in/out), ceil((o+1)*in/out)) as torch's AdaptiveAvgPool. */
ts_val ts_adaptive_avg_pool(ts_graph *g, ts_val x, int nd, const int64_t *output_size);

/* ---- fused attention ---------------------------------------------------- */

/* softmax(scale * q k^T [+ causal mask]) v for q, k, v [B, H, T, hd] of one
 * float dtype, as one fused op: blockwise (flash-attention style), so no
 * [T, T] matrix is stored; causal hides key j from query i when j > i.
 * ts_causal_attention(g, q, k, v) is ts_attention(g, q, k, v, 1, 1/sqrt(hd)). */
ts_val ts_attention(ts_graph *g, ts_val q, ts_val k, ts_val v, int causal, double scale);

/* ---- batch normalisation ---------------------------------------------- */

/* BatchNorm1d/2d/3d over x [N, C], [N, C, L], [N, C, H, W] or [N, C, D, H, W]
 * with PyTorch semantics. Creates the persistent state values
 * "<name_prefix>.running_mean" (zeros) and "<name_prefix>.running_var"
 * (ones), [C] each, readable and writable by name on a plan. Training plans
 * (compiled with a loss) normalise with the batch statistics (biased
 * variance) and update the running statistics in place every step:
 * running = (1 - momentum) * running + momentum * batch (the unbiased
 * variance for running_var). Inference plans normalise with the running
 * statistics. weight and bias [C] are both given or both TS_NONE
 * (affine=False). PyTorch's defaults: momentum 0.1, eps 1e-5. */
ts_val ts_batch_norm(ts_graph *g, ts_val x, ts_val weight, ts_val bias, const char *name_prefix,
                     double momentum, double eps);
/* relu(ts_batch_norm(...)) as one node: the ReLU is applied as y is
 * written, and its backward mask is recomputed from x inside the batch
 * norm backward, which saves two full passes over the activation each way
 * (Conv -> BatchNorm -> ReLU blocks of the cnn and unet3d models). */
ts_val ts_batch_norm_relu(ts_graph *g, ts_val x, ts_val weight, ts_val bias,
                          const char *name_prefix, double momentum, double eps);
/* Either of the two with x [N, ..., C] for TS_CHANNELS_LAST; relu 0 or 1. */
ts_val ts_batch_norm_layout(ts_graph *g, ts_val x, ts_val weight, ts_val bias,
                            const char *name_prefix, double momentum, double eps, int relu,
                            ts_layout layout);
/* ts_batch_norm_layout whose training statistics cover only the batch
 * items that row_mask (f32 [N], 1 present, 0 absent, in any order) marks
 * present: the batch mean and variance, the running statistics it updates
 * and the sums of its backward take the present items only, in their
 * order, so a present item's output does not depend on how many items are
 * absent, where they are or what they hold (bit for bit: the reduction
 * runs over a batch of just the present items). Every item is normalised
 * with those statistics; an absent item's output is not meant to be used:
 * its dy is never read and it gets dx = 0. With no item present the step
 * normalises with the running statistics and leaves them unchanged (all
 * gradients 0). A mask value other than 0 or 1 fails the step. Inference
 * plans ignore the mask. The sensor masks of docs/shapes.md. */
ts_val ts_batch_norm_masked(ts_graph *g, ts_val x, ts_val weight, ts_val bias,
                            const char *name_prefix, double momentum, double eps, int relu,
                            ts_layout layout, ts_val row_mask);
/* Every batch_norm node of g built so far without a row mask of its own
 * becomes ts_batch_norm_masked with the input `mask_name`, f32 [N], 1 for
 * the real items and 0 for padding (shape buckets, docs/shapes.md). It is
 * made at the first such node if g has no value of that name (a graph
 * without batch_norm gets none). With the padding after the real items the
 * result is bit for bit a batch of just the real items. Nodes that already
 * read a mask (a sensor mask, whose 0s include the padding) keep theirs.
 * n_masked (may be NULL): how many nodes now read `mask_name`. */
ts_status ts_batch_norm_mask_rows(ts_graph *g, const char *mask_name, int *n_masked);

/* ---- recurrent layers -------------------------------------------------- */

/* One GRU step with PyTorch's gate order (r, z, n): gi = x W_ih^T + b_ih and
 * gh = h W_hh^T + b_hh, both [B, 3H], h [B, H] -> h' [B, H] with
 * n = tanh(gi_n + r * gh_n), h' = (1 - z) * n + z * h. */
ts_val ts_gru_cell(ts_graph *g, ts_val gi, ts_val gh, ts_val h);
/* One LSTM step (gates i, f, g, o): gi, gh [B, 4H], c [B, H] -> h' [B, H];
 * *c_out (if not NULL) receives c' = f * c + i * g; h' = o * tanh(c'). */
ts_val ts_lstm_cell(ts_graph *g, ts_val gi, ts_val gh, ts_val c, ts_val *c_out);

/* Multi-layer GRU / LSTM over x [B, T, F] (batch_first) unrolled over the
 * static T, as torch.nn.GRU / nn.LSTM(F, hidden, layers, batch_first=True).
 * Returns the last layer's outputs [B, T, hidden]. Parameters are created
 * as "<name_prefix>.weight_ih_l<k>" [G, in], "weight_hh_l<k>" [G, hidden],
 * "bias_ih_l<k>" and "bias_hh_l<k>" [G] (G = 3 or 4 * hidden), initialised
 * U(-1/sqrt(hidden), 1/sqrt(hidden)) like torch. h0 / c0 [layers, B, hidden]
 * may be TS_NONE (zeros); *h_n_out / *c_n_out (if not NULL) receive the
 * final states [layers, B, hidden]. The input projection of all steps is
 * one matmul per layer; only the hidden projection runs per step. */
ts_val ts_gru(ts_graph *g, ts_val x, ts_val h0, int layers, int64_t hidden, const char *name_prefix,
              ts_val *h_n_out);
ts_val ts_lstm(ts_graph *g, ts_val x, ts_val h0, ts_val c0, int layers, int64_t hidden,
               const char *name_prefix, ts_val *h_n_out, ts_val *c_n_out);

/* ---- sparse ------------------------------------------------------------ */

/* CSR matrix (rows x cols) @ dense [cols, F] -> [rows, F]. indptr i64
 * [rows + 1], indices i64 [nnz] and values [nnz] (dense's dtype) must be
 * constants: the structure is checked here and its transpose is built once
 * for the gradient, which flows to dense only. See tessel/sparse.h for a
 * CSR helper and the GCN adjacency. */
ts_val ts_spmm(ts_graph *g, ts_val indptr, ts_val indices, ts_val values, ts_val dense,
               int64_t rows, int64_t cols);

/* ---- FP8 quantisation (docs/fp8.md, tessel/quant.h) --------------------- */

/* scale is the dequantisation step: rank 0 for the whole tensor, or [C]
 * with one value per index of `axis` (per channel; axis is ignored for a
 * rank-0 scale). Its dtype is the float side's (f32 or f64); every scale
 * must be positive and finite (checked each step). Conversion rounds to
 * nearest even and saturates at +-fmt_max. */
/* x (f32/f64) -> FP8 codes of dtype fmt (TS_F8E4M3 or TS_F8E5M2), one
 * byte each: q = encode(x / scale). Not differentiable (use ts_fake_quant
 * in training graphs). */
ts_val ts_quantize(ts_graph *g, ts_val x, ts_val scale, ts_dtype fmt, int axis);
/* FP8 codes -> decode(q) * scale, in scale's dtype. */
ts_val ts_dequantize(ts_graph *g, ts_val q, ts_val scale, int axis);
/* ts_dequantize(ts_quantize(x)) in one op, x's dtype in and out. Its
 * gradient is the straight-through estimator: dy where |x / scale| <=
 * fmt_max, 0 where x saturates; the scale gets none. */
ts_val ts_fake_quant(ts_graph *g, ts_val x, ts_val scale, ts_dtype fmt, int axis);

#ifdef __cplusplus
}
#endif
#endif
