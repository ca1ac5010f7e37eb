/* FP8 quantisation ops: quantize (float -> FP8 codes), dequantize (codes ->
 * float), fake_quant (quantise and dequantise in one, for training graphs)
 * and fake_quant_bwd, its straight-through gradient.
 *
 * A scale s is the dequantisation step (x ~ decode(q) s, q = encode(x / s),
 * see tessel/quant.h): one rank-0 value for the whole tensor, or a vector
 * with one value per index of an axis (per channel). The tensor is viewed
 * as [outer, C, inner] around that axis, so each (outer, c) is a
 * contiguous run with one scale (inner > 1) or each row holds all C scales
 * in turn (inner == 1, the last axis); both loops vectorise.
 *
 * Encoding saturates (finite values and infinities beyond max become
 * +-max, NaN becomes the NaN code). f32 kernels divide and round in f32
 * with the branch-free encoders of core/fp8.h; f64 kernels (gradient
 * checks) divide in f64 and use the reference encoder ts_fp8_from_f64.
 *
 * Gradient: the straight-through estimator, as in QAT and FP8 training
 * recipes: dx = dy where |x / s| <= fmt_max (x within range, rounding
 * treated as the identity), 0 where the value saturates (its output no
 * longer depends on x) and where x is NaN. That is the exact derivative of
 * clamp(x, -fmt_max s, fmt_max s), which the gradient check uses. The scale
 * gets no gradient: it comes from calibration, not from training.
 */
#include <math.h>
#include <string.h>
#include "core/fp8.h"
#include "kern.h"

/* attrs a.quant: format, the FP8 dtype (quantize, fake_quant,
 * fake_quant_bwd); axis, the channel axis, -1 for a per-tensor scale. */

static ts_status check_fmt(int64_t fmt) {
    if (fmt != TS_F8E4M3 && fmt != TS_F8E5M2)
        return ts_fail(TS_ERR_INVALID, "format %lld is not f8e4m3 or f8e5m2", (long long)fmt);
    return TS_OK;
}

/* scale fits x: its dtype is `want` (f32 or f64); rank 0 with axis -1, or
 * [dims[axis]] with a valid axis. */
static ts_status check_scale(const ts_type *x, const ts_type *s, int64_t axis, ts_dtype want) {
    if (want != TS_F32 && want != TS_F64)
        return ts_fail(TS_ERR_SHAPE, "the float side must be f32 or f64, got %s",
                       ts_dtype_name(want));
    if (s->dtype != want)
        return ts_fail(TS_ERR_SHAPE, "scale must be %s, got %s", ts_dtype_name(want),
                       ts_dtype_name(s->dtype));
    if (axis == -1) {
        if (s->rank != 0)
            return ts_fail(TS_ERR_SHAPE, "a per-tensor scale must be rank 0, got rank %d", s->rank);
        return TS_OK;
    }
    if (axis < 0 || axis >= x->rank)
        return ts_fail(TS_ERR_INVALID, "channel axis %lld out of range for rank %d",
                       (long long)axis, x->rank);
    if (s->rank != 1 || s->dims[0] != x->dims[axis])
        return ts_fail(TS_ERR_SHAPE, "a per-channel scale along axis %lld must be [%lld]",
                       (long long)axis, (long long)x->dims[axis]);
    return TS_OK;
}

static ts_status infer_quantize(const ts_graph *g, const ts_node *n, ts_type *out, int *n_out) {
    const ts_type *x = ts_in_type(g, n, 0), *s = ts_in_type(g, n, 1);
    ts_status st = check_fmt(n->a.quant.format);
    if (st == TS_OK) st = check_scale(x, s, n->a.quant.axis, x->dtype);
    if (st != TS_OK) return st;
    *out = *x;
    out->dtype = (ts_dtype)n->a.quant.format;
    *n_out = 1;
    return TS_OK;
}

static ts_status infer_dequantize(const ts_graph *g, const ts_node *n, ts_type *out, int *n_out) {
    const ts_type *q = ts_in_type(g, n, 0), *s = ts_in_type(g, n, 1);
    if (!ts_fp8_is_format(q->dtype))
        return ts_fail(TS_ERR_SHAPE, "codes must be f8e4m3 or f8e5m2, got %s",
                       ts_dtype_name(q->dtype));
    ts_status st = check_scale(q, s, n->a.quant.axis, s->dtype);
    if (st != TS_OK) return st;
    *out = *q;
    out->dtype = s->dtype;
    *n_out = 1;
    return TS_OK;
}

static ts_status infer_fake_quant(const ts_graph *g, const ts_node *n, ts_type *out, int *n_out) {
    const ts_type *x = ts_in_type(g, n, 0), *s = ts_in_type(g, n, n->n_in - 1);
    ts_status st = check_fmt(n->a.quant.format);
    if (st == TS_OK) st = check_scale(x, s, n->a.quant.axis, x->dtype);
    if (st == TS_OK && n->n_in == 3 && !ts_type_equal(x, ts_in_type(g, n, 1)))
        st = ts_fail(TS_ERR_SHAPE, "gradient and input differ in dtype or shape");
    if (st != TS_OK) return st;
    *out = *x;
    *n_out = 1;
    return TS_OK;
}

static ts_status grad_fake_quant(ts_graph *g, const ts_node *n, const ts_val *dy, ts_val *din) {
    if (!ts_val_ok(dy[0])) return ts_graph_status(g);
    ts_val in[3] = {dy[0], ts_mkval(n->in[0]), ts_mkval(n->in[1])};
    din[0] = ts_node_add(g, TS_OP_FAKE_QUANT_BWD, 3, in, &n->a, NULL);
    return ts_graph_status(g);
}

/* ---- kernels ------------------------------------------------------------ */

/* The [outer, C, inner] view of t around axis (-1: C = 1). */
typedef struct qview {
    int64_t outer, c, inner;
} qview;

static qview view(const ts_tensor *t, int64_t axis) {
    qview v = {1, 1, ts_tensor_numel(t)};
    if (axis < 0) return v;
    v.c = t->dims[axis];
    v.outer = 1;
    for (int i = 0; i < axis; i++) v.outer *= t->dims[i];
    v.inner = 1;
    for (int i = (int)axis + 1; i < t->rank; i++) v.inner *= t->dims[i];
    return v;
}

/* Every scale must be a positive finite number: a zero or NaN scale would
 * silently turn the whole tensor into +-max or NaN. */
static ts_status check_scales(const ts_kargs *k, const char *op, const ts_tensor *s) {
    int64_t n = ts_tensor_numel(s);
    for (int64_t i = 0; i < n; i++) {
        double v = s->dtype == TS_F32 ? ((const float *)s->data)[i] : ((const double *)s->data)[i];
        if (!(v > 0) || !isfinite(v))
            return ts_fail(TS_ERR_INVALID,
                           "%s '%s': scale[%lld] = %g is not a positive finite "
                           "number",
                           op, k->label ? k->label : "?", (long long)i, v);
    }
    return TS_OK;
}

/* Elements per parallel chunk of a run (a per-tensor scale is one run). */
#define QCHUNK 16384

/* Runs BODY(i, s) for every element i with its scale s (type T), in the
 * two vectorisable loop shapes described at the top; long runs are split
 * into chunks so a per-tensor scale still spreads over the threads. */
/* clang-format off */
#define FOR_SCALED(v, T, sc, BODY)                                                                 \
    do {                                                                                           \
        if ((v).inner > 1 || (v).c == 1) {                                                         \
            int64_t len_ = (v).inner, nch_ = (len_ + QCHUNK - 1) / QCHUNK;                         \
            int64_t n_ = (v).outer * (v).c * nch_, all_ = (v).outer * (v).c * len_;                \
            _Pragma("omp parallel for schedule(static) if (all_ >= TS_PAR_MIN)")                   \
            for (int64_t k_ = 0; k_ < n_; k_++) {                                                  \
                const int64_t r_ = k_ / nch_, b_ = r_ * len_ + (k_ % nch_) * QCHUNK;               \
                const int64_t e_ = b_ + QCHUNK < (r_ + 1) * len_ ? b_ + QCHUNK : (r_ + 1) * len_;  \
                const T s = (sc)[r_ % (v).c];                                                      \
                _Pragma("omp simd") for (int64_t i = b_; i < e_; i++) {                            \
                    BODY;                                                                          \
                }                                                                                  \
            }                                                                                      \
        } else {                                                                                   \
            int64_t rows_ = (v).outer, len_ = (v).c, all_ = rows_ * len_;                          \
            _Pragma("omp parallel for schedule(static) if (all_ >= TS_PAR_MIN)")                   \
            for (int64_t r_ = 0; r_ < rows_; r_++) {                                               \
                _Pragma("omp simd") for (int64_t j_ = 0; j_ < len_; j_++) {                        \
                    const int64_t i = r_ * len_ + j_;                                              \
                    const T s = (sc)[j_];                                                          \
                    BODY;                                                                          \
                }                                                                                  \
            }                                                                                      \
        }                                                                                          \
    } while (0)
/* clang-format on */

/* One function per (dtype, format) so the encoder inlines into the loop. */
#define DEF_QUANT_F32(name, ENC)                                                                   \
    TS_CLONES static void name(uint8_t *q, const float *x, const float *sc, qview v) {             \
        FOR_SCALED(v, float, sc, q[i] = ENC(x[i] / s, 1));                                         \
    }
DEF_QUANT_F32(quant_e4m3_f32, ts_fp8_enc_e4m3)
DEF_QUANT_F32(quant_e5m2_f32, ts_fp8_enc_e5m2)

static void quant_f64(uint8_t *q, const double *x, const double *sc, qview v, ts_dtype fmt) {
    FOR_SCALED(v, double, sc, q[i] = ts_fp8_from_f64(x[i] / s, fmt, 1));
}

static ts_status k_quantize(const ts_kargs *k) {
    const ts_tensor *x = &k->in[0], *s = &k->in[1];
    ts_dtype fmt = (ts_dtype)k->a->quant.format;
    ts_status st = check_scales(k, "quantize", s);
    if (st != TS_OK) return st;
    qview v = view(x, k->a->quant.axis);
    uint8_t *q = k->out[0].data;
    if (x->dtype == TS_F32)
        (fmt == TS_F8E4M3 ? quant_e4m3_f32 : quant_e5m2_f32)(q, x->data, s->data, v);
    else if (x->dtype == TS_F64)
        quant_f64(q, x->data, s->data, v, fmt);
    else
        return ts_kernel_bad_dtype(k, "quantize", x->dtype);
    return TS_OK;
}

/* Decoding is a lookup in the 256 exact code values. */
#define DEF_DEQUANT(name, T)                                                                       \
    TS_CLONES static void name(T *o, const uint8_t *q, const T *sc, qview v, const T *tab) {       \
        FOR_SCALED(v, T, sc, o[i] = tab[q[i]] * s);                                                \
    }
DEF_DEQUANT(dequant_f32, float)
DEF_DEQUANT(dequant_f64, double)

static ts_status k_dequantize(const ts_kargs *k) {
    const ts_tensor *q = &k->in[0], *s = &k->in[1];
    ts_status st = check_scales(k, "dequantize", s);
    if (st != TS_OK) return st;
    qview v = view(q, k->a->quant.axis);
    float t32[256];
    double t64[256];
    for (int c = 0; c < 256; c++) t64[c] = t32[c] = ts_fp8_to_f32((uint8_t)c, q->dtype);
    if (s->dtype == TS_F32)
        dequant_f32(k->out[0].data, q->data, s->data, v, t32);
    else if (s->dtype == TS_F64)
        dequant_f64(k->out[0].data, q->data, s->data, v, t64);
    else
        return ts_kernel_bad_dtype(k, "dequantize", s->dtype);
    return TS_OK;
}

/* y = decode(encode(x / s)) s; y may be x (in place). */
#define DEF_FAKE_F32(name, ENC, DEC)                                                               \
    TS_CLONES static void name(float *y, const float *x, const float *sc, qview v) {               \
        FOR_SCALED(v, float, sc, y[i] = DEC(ENC(x[i] / s, 1)) * s);                                \
    }
DEF_FAKE_F32(fake_e4m3_f32, ts_fp8_enc_e4m3, ts_fp8_dec_e4m3)
DEF_FAKE_F32(fake_e5m2_f32, ts_fp8_enc_e5m2, ts_fp8_dec_e5m2)

static void fake_f64(double *y, const double *x, const double *sc, qview v, ts_dtype fmt) {
    FOR_SCALED(v, double, sc,
               y[i] = (double)ts_fp8_to_f32(ts_fp8_from_f64(x[i] / s, fmt, 1), fmt) * s);
}

static ts_status k_fake_quant(const ts_kargs *k) {
    const ts_tensor *x = &k->in[0], *s = &k->in[1];
    ts_dtype fmt = (ts_dtype)k->a->quant.format;
    ts_status st = check_scales(k, "fake_quant", s);
    if (st != TS_OK) return st;
    qview v = view(x, k->a->quant.axis);
    if (x->dtype == TS_F32)
        (fmt == TS_F8E4M3 ? fake_e4m3_f32 : fake_e5m2_f32)(k->out[0].data, x->data, s->data, v);
    else if (x->dtype == TS_F64)
        fake_f64(k->out[0].data, x->data, s->data, v, fmt);
    else
        return ts_kernel_bad_dtype(k, "fake_quant", x->dtype);
    return TS_OK;
}

/* dx = |x / s| <= max ? dy : 0 (NaN x compares false); dx may be dy. */
#define DEF_STE(name, T, ABS)                                                                      \
    TS_CLONES static void name(T *dx, const T *dy, const T *x, const T *sc, qview v, T mx) {       \
        FOR_SCALED(v, T, sc, dx[i] = ABS(x[i] / s) <= mx ? dy[i] : (T)0);                          \
    }
DEF_STE(ste_f32, float, fabsf)
DEF_STE(ste_f64, double, fabs)

static ts_status k_fake_quant_bwd(const ts_kargs *k) {
    const ts_tensor *dy = &k->in[0], *x = &k->in[1], *s = &k->in[2];
    ts_status st = check_scales(k, "fake_quant_bwd", s);
    if (st != TS_OK) return st;
    qview v = view(x, k->a->quant.axis);
    double mx = ts_fp8_max((ts_dtype)k->a->quant.format);
    if (x->dtype == TS_F32)
        ste_f32(k->out[0].data, dy->data, x->data, s->data, v, (float)mx);
    else if (x->dtype == TS_F64)
        ste_f64(k->out[0].data, dy->data, x->data, s->data, v, mx);
    else
        return ts_kernel_bad_dtype(k, "fake_quant_bwd", x->dtype);
    return TS_OK;
}

static double cost_elementwise(const ts_graph *g, const ts_node *n) {
    return (double)ts_type_numel(&g->values[n->out[0]].t);
}

/* Not TS_OPF_ELEMENTWISE: a per-channel scale does not broadcast
 * NumPy-style. */
const ts_op_def ts_def_quantize = {.name = "quantize",
                                   .min_in = 2,
                                   .max_in = 2,
                                   .infer = infer_quantize,
                                   .kernel = k_quantize,
                                   .cost = cost_elementwise};
const ts_op_def ts_def_dequantize = {.name = "dequantize",
                                     .min_in = 2,
                                     .max_in = 2,
                                     .infer = infer_dequantize,
                                     .kernel = k_dequantize,
                                     .cost = cost_elementwise};
const ts_op_def ts_def_fake_quant = {.name = "fake_quant",
                                     .min_in = 2,
                                     .max_in = 2,
                                     .flags = TS_OPF_INPLACE,
                                     .infer = infer_fake_quant,
                                     .grad = grad_fake_quant,
                                     .kernel = k_fake_quant,
                                     .cost = cost_elementwise};
const ts_op_def ts_def_fake_quant_bwd = {.name = "fake_quant_bwd",
                                         .min_in = 3,
                                         .max_in = 3,
                                         .flags = TS_OPF_INPLACE,
                                         .infer = infer_fake_quant,
                                         .kernel = k_fake_quant_bwd,
                                         .cost = cost_elementwise};

/* ---- builders ------------------------------------------------------------ */

static ts_val quant_node(ts_graph *g, int op, ts_val x, ts_val scale, int64_t fmt, int axis) {
    if (!g || g->status != TS_OK || !ts_val_ok(x) || !ts_val_ok(scale)) return TS_NONE;
    ts_attrs at = ts_attrs_zero();
    at.quant.format = fmt;
    at.quant.axis = -1;
    if (ts_rank(g, scale) != 0) {
        int r = ts_rank(g, x), ax = ts_axis(axis, r);
        if (ax < 0)
            return ts_graph_fail(g, TS_ERR_INVALID, "%s: channel axis %d out of range for rank %d",
                                 ts_op_get(op)->name, axis, r);
        at.quant.axis = ax;
    }
    ts_val in[2] = {x, scale};
    return ts_node_add(g, op, 2, in, &at, NULL);
}

ts_val ts_quantize(ts_graph *g, ts_val x, ts_val scale, ts_dtype fmt, int axis) {
    return quant_node(g, TS_OP_QUANTIZE, x, scale, fmt, axis);
}
ts_val ts_dequantize(ts_graph *g, ts_val q, ts_val scale, int axis) {
    return quant_node(g, TS_OP_DEQUANTIZE, q, scale, 0, axis);
}
ts_val ts_fake_quant(ts_graph *g, ts_val x, ts_val scale, ts_dtype fmt, int axis) {
    return quant_node(g, TS_OP_FAKE_QUANT, x, scale, fmt, axis);
}
