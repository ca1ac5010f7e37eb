/* Unary elementwise ops: neg, exp, log, sqrt, rsqrt, abs, relu, sigmoid,
 * tanh, pow_scalar, leaky_relu, affine_scalar, gelu, cast, and unary_bwd,
 * the one backward op that serves all of them.
 *
 * Every differentiable op (except neg and affine, whose gradients are a neg
 * and an affine of dy) differentiates into a single unary_bwd node reading
 * dy and ONE saved tensor: the output y where the derivative is cheap in y
 * (relu, sigmoid, tanh, exp, sqrt, rsqrt), else the input x. Keeping only
 * one of them alive is what lets the forward op run in place.
 *
 * f32 kernels avoid libm calls that GCC cannot vectorise (expf, logf,
 * tanhf, erff are scalar calls without -ffast-math): exp and log below are
 * branch-free Cephes polynomials (about 1 ulp) that vectorise under
 * `omp simd`, and sigmoid, tanh and both GELUs are built on them in forms
 * that neither overflow nor cancel. f64 kernels (gradient checks) use libm.
 */
/* GCC only if-converts (and so vectorises) a loop whose float operations
 * it may execute speculatively; under the default -ftrapping-math a float
 * op that a select guards (log's subnormal path, GCC's own rewrites of
 * selects) keeps the whole loop scalar. No code here reads floating-point
 * exception flags, so results are unchanged. */
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC optimize("no-trapping-math")
#endif

#include <math.h>
#include <stdint.h>
#include <string.h>
#include "eltwise.h"
#include "core/half.h"
#include "kern.h"
#include "ops/gelu_simd.h"
#include "vmath.h"

/* Standard normal CDF Phi(x) = erfc(-x/sqrt2)/2 and, if pdf != NULL, the
 * density phi(x). erfc(z) = t exp(-z^2 + P(t)), t = 1/(1 + z/2), is
 * Numerical Recipes' erfcc (relative error < 1.2e-7 for all z), so the
 * negative tail keeps relative accuracy where 1 + erf(.) would cancel.
 * exp(-x^2/2) is split as exp(-xh^2/2) exp(-(x-xh)(x+xh)/2) with xh = x
 * truncated to 12 bits, so the large part of the exponent is exact. |x| is
 * clamped at 16, beyond which Phi is exactly 0 or 1 in f32. */
static inline float m_ncdf_f32(float x, float *pdf) {
    x = x > 16.0f ? 16.0f : x;
    x = x < -16.0f ? -16.0f : x;
    float ax = fabsf(x);
    float t = 1.0f / (1.0f + 0.353553390593273762f * ax); /* z/2 = |x| / (2 sqrt2) */
    float p =
        -1.26551223f +
        t * (1.00002368f +
             t * (0.37409196f +
                  t * (0.09678418f +
                       t * (-0.18628806f +
                            t * (0.27886807f + t * (-1.13520398f +
                                                    t * (1.48851587f + t * (-0.82215223f +
                                                                            t * 0.17087277f))))))));
    float xh = f32_from_bits(f32_bits(ax) & 0xfffff000u);
    float rest = -0.5f * ((ax - xh) * (ax + xh));
    float eh = m_exp_f32(-0.5f * (xh * xh));
    float half_erfc = 0.5f * t * eh * m_exp_f32(rest + p);
    if (pdf) *pdf = 0.398942280401432678f * eh * m_exp_f32(rest);
    return x < 0.0f ? half_erfc : 1.0f - half_erfc;
}

/* ---- constants of PyTorch's GELU ------------------------------------- */

#define SQRT1_2      0.707106781186547524401
#define INV_SQRT_2PI 0.398942280401432677940
/* GELU_BETA and GELU_KAPPA: gelu_simd.h */

/* tanh GELU: 0.5x(1 + tanh(u)) = x sigmoid(2u), u = sqrt(2/pi)(x + k x^3).
 * x^3 overflowing to inf only saturates the sigmoid (no NaN). */
static inline float m_gelu_tanh_f32(float x) {
    float u2 = (float)(2.0 * GELU_BETA) * fmaf((float)GELU_KAPPA * (x * x), x, x);
    return x * m_sigmoid_f32(u2);
}
static inline double m_gelu_tanh_f64(double x) {
    double u2 = 2.0 * GELU_BETA * (x + GELU_KAPPA * (x * x * x));
    return x * m_sigmoid_f64(u2);
}

/* d/dx of the tanh GELU: PyTorch's 0.5(1 + th) + 0.5x(1 - th^2) u'
 * with 1 + th = 2 s and 1 - th^2 = 4 s (1 - s), s = sigmoid(2u), and
 * 2u' = 2 beta (1 + 3 k x^2): s + x s sn (2 beta + 6 beta k x^2), where sn = 1 - s =
 * sigmoid(-2u) comes from SIG2 without cancellation. Beyond |x| = 30 the derivative is
 * exactly 0 or 1 even in f64, so x is clamped there to keep x^3 finite (inf * 0 would be NaN).
 * With y != NULL also the GELU itself, *y = x s (gelu out_grad): the same
 * bits as m_gelu_tanh_f32, whose s comes from the unclamped x. Within
 * |x| <= 30 the two u2 are the same; beyond it both |u2| exceed 1900, so
 * exp(-|u2|) is 0 for both and s is exactly 1 or 0 with u2's sign, which
 * clamping keeps (and NaN stays NaN). tests/unit/gelu_grad_bits.c checks
 * it on a dense sweep of all f32 patterns, and the derivative's error against f64. */
#define DEF_GELU_TANH_GRAD(name, T, SIG2, FMA)                                                     \
    static inline T name(T x, T *y) {                                                              \
        const T x0 = x;                                                                            \
        /* as two selects, not nested: GCC then if-converts them to min / max */                   \
        x = (T)30 < x ? (T)30 : x;                                                                 \
        x = (T)-30 > x ? (T)-30 : x;                                                               \
        T x2 = x * x;                                                                              \
        T u2 = (T)(2.0 * GELU_BETA) * FMA((T)GELU_KAPPA * x2, x, x);                               \
        T s, sn;                                                                                   \
        SIG2(u2, &s, &sn);                                                                         \
        if (y) *y = x0 * s;                                                                        \
        return FMA(x * (s * sn), FMA((T)(6.0 * GELU_BETA * GELU_KAPPA), x2, (T)(2.0 * GELU_BETA)), \
                   s);                                                                             \
    }
/* sigmoid(u) with m_sigmoid_f32's bits (the forward GELU's), and sigmoid(-u) = 1 - sigmoid(u)
 * without a second division: e s (= e / (1 + e), one more rounding) where s >= 0.5 (u >= 0),
 * else 1 - s, which is > 0.5, so the subtraction loses nothing: within an ulp or so of the
 * quotient either way (at s = 0.5 both are). The second choice tests s, not u: on u's sign
 * GCC duplicates the division into both arms of the first choice (two divisions again). NaN
 * gives NaN for both. */
static inline void m_sigmoid_pair_f32(float u, float *s, float *sn) {
    float e = m_exp_neg_f32(-fabsf(u));
    float si = (u >= 0.0f ? 1.0f : e) / (1.0f + e);
    *s = si;
    *sn = si >= 0.5f ? e * si : 1.0f - si;
}
static inline void m_sigmoid_pair_f64(double u, double *s, double *sn) {
    *s = m_sigmoid_f64(u);
    *sn = m_sigmoid_f64(-u);
}
DEF_GELU_TANH_GRAD(m_gelu_tanh_grad_f32, float, m_sigmoid_pair_f32, fmaf)
DEF_GELU_TANH_GRAD(m_gelu_tanh_grad_f64, double, m_sigmoid_pair_f64, fma)

/* d/dx of the erf GELU, Phi(x) + x phi(x) (x phi(x) is 0 beyond the clamp), and with y != NULL
 * the GELU x Phi(x) itself: m_ncdf_f32 returns the same Phi whether or not it also yields phi,
 * so *y has the forward kernel's bits. */
static inline float m_gelu_erf_grad_f32(float x, float *y) {
    float pdf, cdf = m_ncdf_f32(x, &pdf);
    float xc = x > 16.0f ? 16.0f : (x < -16.0f ? -16.0f : x);
    if (y) *y = x * cdf;
    return cdf + xc * pdf;
}

/* ---- inference --------------------------------------------------------- */

static ts_status need_float(ts_dtype dt) {
    if (!ts_dtype_is_float(dt))
        return ts_fail(TS_ERR_SHAPE, "needs a floating-point input, got %s (cast it first)",
                       ts_dtype_name(dt));
    return TS_OK;
}

static ts_status check_attrs(int op, const ts_attrs *a) {
    switch (op) {
    case TS_OP_POW_SCALAR:
        if (!isfinite(a->unary.exponent))
            return ts_fail(TS_ERR_INVALID, "exponent %g is not finite", a->unary.exponent);
        break;
    case TS_OP_LEAKY_RELU:
        if (!isfinite(a->unary.slope))
            return ts_fail(TS_ERR_INVALID, "negative slope %g is not finite", a->unary.slope);
        break;
    case TS_OP_AFFINE_SCALAR:
        if (!isfinite(a->unary.scale) || !isfinite(a->unary.shift))
            return ts_fail(TS_ERR_INVALID, "scale %g and shift %g must be finite", a->unary.scale,
                           a->unary.shift);
        break;
    case TS_OP_GELU:
        if (a->unary.approx != TS_GELU_ERF && a->unary.approx != TS_GELU_TANH)
            return ts_fail(TS_ERR_INVALID, "approximation %lld is neither erf (0) nor tanh (1)",
                           (long long)a->unary.approx);
        break;
    default: break;
    }
    return TS_OK;
}

static ts_status infer_unary(const ts_graph *g, const ts_node *n, ts_type *out, int *n_out) {
    const ts_type *x = ts_in_type(g, n, 0);
    ts_status s = need_float(x->dtype);
    if (s == TS_OK) s = check_attrs(n->op, &n->a);
    if (s != TS_OK) return s;
    if (n->a.unary.out_low &&
        (n->op != TS_OP_GELU || x->dtype != TS_F32 || n->a.unary.out_low != 1))
        return ts_fail(TS_ERR_INVALID, "out_low (a bf16 result) is 1 on a gelu of f32 only");
    if (n->a.unary.out_grad &&
        (n->op != TS_OP_GELU || x->dtype != TS_F32 || n->a.unary.out_grad != 1))
        return ts_fail(TS_ERR_INVALID,
                       "out_grad (a second output, the derivative) is 1 on a gelu of f32 only");
    *out = *x;
    if (n->a.unary.out_low) out->dtype = TS_BF16;
    *n_out = 1;
    /* the derivative in the result's dtype: bf16 in a bf16 plan, as autocast's GELU backward
     * runs on bf16 tensors (passes/gelu_grad.c) */
    if (n->a.unary.out_grad) out[1] = out[0], *n_out = 2;
    return TS_OK;
}

/* dtypes the cast kernel converts between */
static int cast_dtype_ok(int64_t dt) {
    return dt == TS_F32 || dt == TS_F64 || dt == TS_F16 || dt == TS_BF16 || dt == TS_I32 ||
           dt == TS_I64 || dt == TS_U8;
}

static ts_status infer_cast(const ts_graph *g, const ts_node *n, ts_type *out, int *n_out) {
    const ts_type *x = ts_in_type(g, n, 0);
    int64_t to = n->a.cast.dtype;
    if (to < 0 || to >= TS_DTYPE_COUNT)
        return ts_fail(TS_ERR_INVALID, "target dtype %lld is not a dtype", (long long)to);
    if (!cast_dtype_ok(x->dtype) || !cast_dtype_ok(to))
        return ts_fail(TS_ERR_UNSUPPORTED,
                       "cannot convert %s to %s (cast supports f32, f64, f16, bf16, i32, i64, u8)",
                       ts_dtype_name(x->dtype), ts_dtype_name((ts_dtype)to));
    *out = *x;
    out->dtype = (ts_dtype)to;
    *n_out = 1;
    return TS_OK;
}

/* Which saved tensor unary_bwd can differentiate from: bit 0 set if x
 * (s = input), bit 1 if y (s = output), bit 2 if the derivative itself
 * (s = gelu's out_grad output). Ops whose derivative is cheap in y
 * also accept x (recomputing y), for passes that trade memory for compute. */
static int bwd_sides(int64_t op) {
    switch (op) {
    case TS_OP_EXP:
    case TS_OP_SQRT:
    case TS_OP_RSQRT:
    case TS_OP_RELU:
    case TS_OP_SIGMOID:
    case TS_OP_TANH: return 3;
    case TS_OP_LOG:
    case TS_OP_ABS:
    case TS_OP_POW_SCALAR:
    case TS_OP_LEAKY_RELU: return 1;
    case TS_OP_GELU: return 5;
    default: return 0;
    }
}

/* The forward op's attributes as stored in a unary_bwd node. */
static ts_attrs fwd_attrs(const ts_attrs *a) {
    ts_attrs f = ts_attrs_zero();
    f.unary = a->unary_bwd.fwd;
    return f;
}

static ts_status infer_unary_bwd(const ts_graph *g, const ts_node *n, ts_type *out, int *n_out) {
    const ts_type *dy = ts_in_type(g, n, 0), *s = ts_in_type(g, n, 1);
    int64_t op = n->a.unary_bwd.fwd_op, side = n->a.unary_bwd.side;
    int sides = bwd_sides(op);
    if (!sides)
        return ts_fail(TS_ERR_INVALID, "forward op %lld has no unary_bwd rule", (long long)op);
    if (side < 0 || side > 2)
        return ts_fail(TS_ERR_INVALID,
                       "saved-tensor selector %lld is neither x (0), y (1) nor the derivative (2)",
                       (long long)side);
    if (!(sides & (1 << side)))
        return ts_fail(TS_ERR_INVALID, "%s's gradient cannot be computed from its %s",
                       ts_op_get((int)op)->name, side == 1 ? "output" : "derivative");
    ts_status st = need_float(dy->dtype);
    if (st != TS_OK) return st;
    /* side 2 may read a bf16 derivative (a bf16 plan's gelu out_grad) with an f32 gradient */
    ts_type sw = *s;
    if (side == 2 && dy->dtype == TS_F32 && s->dtype == TS_BF16) sw.dtype = TS_F32;
    if (!ts_type_equal(dy, &sw))
        return ts_fail(TS_ERR_SHAPE, "gradient and saved tensor differ in dtype or shape");
    ts_attrs fa = fwd_attrs(&n->a);
    if ((st = check_attrs((int)op, &fa)) != TS_OK) return st;
    *out = *dy;
    *n_out = 1;
    return TS_OK;
}

/* ---- gradients --------------------------------------------------------- */

static ts_val unary_bwd(ts_graph *g, const ts_node *n, ts_val dy, int side) {
    ts_attrs a = ts_attrs_zero();
    a.unary_bwd.fwd_op = n->op;
    a.unary_bwd.side = side;
    a.unary_bwd.fwd = n->a.unary;
    ts_val in[2] = {dy, ts_mkval(side ? n->out[0] : n->in[0])};
    return ts_node_add(g, TS_OP_UNARY_BWD, 2, in, &a, NULL);
}

static ts_status grad_from_y(ts_graph *g, const ts_node *n, const ts_val *dy, ts_val *din) {
    if (ts_val_ok(dy[0])) din[0] = unary_bwd(g, n, dy[0], 1);
    return ts_graph_status(g);
}

static ts_status grad_from_x(ts_graph *g, const ts_node *n, const ts_val *dy, ts_val *din) {
    if (ts_val_ok(dy[0])) din[0] = unary_bwd(g, n, dy[0], 0);
    return ts_graph_status(g);
}

static ts_status grad_neg(ts_graph *g, const ts_node *n, const ts_val *dy, ts_val *din) {
    (void)n;
    if (ts_val_ok(dy[0])) din[0] = ts_neg(g, dy[0]);
    return ts_graph_status(g);
}

static ts_status grad_affine(ts_graph *g, const ts_node *n, const ts_val *dy, ts_val *din) {
    if (!ts_val_ok(dy[0])) return ts_graph_status(g);
    double s = n->a.unary.scale;
    din[0] = s == 1.0 ? dy[0] : ts_affine_scalar(g, dy[0], s, 0.0);
    return ts_graph_status(g);
}

/* Only a float->float cast passes a gradient (cast back to the input's
 * dtype); an integer result carries none, as in PyTorch. */
static ts_status grad_cast(ts_graph *g, const ts_node *n, const ts_val *dy, ts_val *din) {
    ts_dtype from = ts_in_type(g, n, 0)->dtype;
    if (ts_val_ok(dy[0]) && ts_dtype_is_float(from) && ts_dtype_is_float((ts_dtype)n->a.cast.dtype))
        din[0] = ts_cast(g, dy[0], from);
    return ts_graph_status(g);
}

/* ---- forward kernels --------------------------------------------------- */

/* One chunk of an elementwise op: o[i] = f(x[i]). o may equal x (in place):
 * `omp simd` asserts there is no other overlap, which lets GCC vectorise
 * without a runtime alias check that in-place calls would fail. */
typedef void (*fwd_fn)(void *o, const void *x, int64_t n, const ts_attrs *a);

#define DEF_FWD(name, T, expr)                                                                     \
    TS_CLONES static void name(void *o_, const void *x_, int64_t n, const ts_attrs *a) {           \
        T *o = o_;                                                                                 \
        const T *xs = x_;                                                                          \
        const T slope = (T)a->unary.slope, scale = (T)a->unary.scale, shift = (T)a->unary.shift;   \
        (void)slope;                                                                               \
        (void)scale;                                                                               \
        (void)shift;                                                                               \
        _Pragma("omp simd") for (int64_t i = 0; i < n; i++) {                                      \
            const T x = xs[i];                                                                     \
            o[i] = (expr);                                                                         \
        }                                                                                          \
    }

#define DEF_FWD2(op, e32, e64)                                                                     \
    DEF_FWD(op##_f32, float, e32)                                                                  \
    DEF_FWD(op##_f64, double, e64)

DEF_FWD2(neg, -x, -x)
DEF_FWD2(exp, m_exp_f32(x), exp(x))
DEF_FWD2(log, m_log_f32(x), log(x))
DEF_FWD2(sqrt, sqrtf(x), sqrt(x))
DEF_FWD2(rsqrt, 1.0f / sqrtf(x), 1.0 / sqrt(x))
DEF_FWD2(abs, fabsf(x), fabs(x))
/* x < 0 ? 0 : x keeps NaN, as torch.relu does */
DEF_FWD2(relu, x < 0.0f ? 0.0f : x, x < 0.0 ? 0.0 : x)
DEF_FWD2(sigmoid, m_sigmoid_f32(x), m_sigmoid_f64(x))
DEF_FWD2(tanh, m_tanh_f32(x), tanh(x))
DEF_FWD2(leaky, x > 0.0f ? x : x * slope, x > 0.0 ? x : x * slope)
DEF_FWD2(affine, x *scale + shift, x *scale + shift)
DEF_FWD2(gelu_erf, x *m_ncdf_f32(x, NULL), 0.5 * x * erfc(-x * SQRT1_2))
DEF_FWD2(gelu_tanh, m_gelu_tanh_f32(x), m_gelu_tanh_f64(x))

/* x^e with PyTorch's special cases (exact products, sqrt, reciprocals)
 * picked once per call; BODY consumes p = x^e for element i. */
#define POW_CASE(T, PEXPR, BODY)                                                                   \
    _Pragma("omp simd") for (int64_t i = 0; i < n; i++) {                                          \
        const T x = xs[i];                                                                         \
        const T p = (PEXPR);                                                                       \
        BODY;                                                                                      \
    }
#define POW_DISPATCH(T, SQRT, POW, ex, BODY)                                                       \
    if (ex == 0) {                                                                                 \
        POW_CASE(T, ((void)x, (T)1), BODY)                                                         \
    } else if (ex == 1) {                                                                          \
        POW_CASE(T, x, BODY)                                                                       \
    } else if (ex == 2) {                                                                          \
        POW_CASE(T, x *x, BODY)                                                                    \
    } else if (ex == 3) {                                                                          \
        POW_CASE(T, x *x *x, BODY)                                                                 \
    } else if (ex == 0.5) {                                                                        \
        POW_CASE(T, SQRT(x), BODY)                                                                 \
    } else if (ex == -0.5) {                                                                       \
        POW_CASE(T, (T)1 / SQRT(x), BODY)                                                          \
    } else if (ex == -1) {                                                                         \
        POW_CASE(T, (T)1 / x, BODY)                                                                \
    } else if (ex == -2) {                                                                         \
        POW_CASE(T, (T)1 / (x * x), BODY)                                                          \
    } else {                                                                                       \
        const T et_ = (T)ex;                                                                       \
        POW_CASE(T, POW(x, et_), BODY)                                                             \
    }

#define DEF_POW_FWD(name, T, SQRT, POW)                                                            \
    TS_CLONES static void name(void *o_, const void *x_, int64_t n, const ts_attrs *a) {           \
        T *o = o_;                                                                                 \
        const T *xs = x_;                                                                          \
        const double e = a->unary.exponent;                                                        \
        POW_DISPATCH(T, SQRT, POW, e, o[i] = p)                                                    \
    }
DEF_POW_FWD(pow_f32, float, sqrtf, powf)
DEF_POW_FWD(pow_f64, double, sqrt, pow)

/* Run a chunked elementwise kernel; chunks are independent, so the result
 * does not depend on the thread count. */
#define CHUNK 4096

/* f32 -> bf16 (unary.out_low): each chunk computed in f32 on the stack, then rounded. */
static ts_status run_fwd_low(const ts_kargs *k, fwd_fn f32, const char *op) {
    const ts_tensor *x = &k->in[0], *o = &k->out[0];
    if (x->dtype != TS_F32 || o->dtype != TS_BF16) return ts_kernel_bad_dtype(k, op, o->dtype);
    int64_t n = ts_tensor_numel(o), nch = (n + CHUNK - 1) / CHUNK;
    uint16_t *po = o->data;
    const float *px = x->data;
    const ts_attrs *a = k->a;
#pragma omp parallel for schedule(static) if (n >= TS_PAR_MIN)
    for (int64_t c = 0; c < nch; c++) {
        float buf[CHUNK];
        int64_t s = c * CHUNK, len = n - s < CHUNK ? n - s : CHUNK;
        f32(buf, px + s, len, a);
        ts_f32_to_bf16_n(po + s, buf, len); /* one chunk: below its threading size */
    }
    return TS_OK;
}

/* One chunk of a gelu with out_grad: y[i] = gelu(x[i]) and g[i] = gelu'(x[i]) from one
 * evaluation (one exp for tanh; Phi and phi share theirs for erf). y may equal x (in place). */
typedef void (*fwd_grad_fn)(float *y, float *g, const float *x, int64_t n);

#define DEF_FWD_GRAD(name, GRAD)                                                                   \
    TS_CLONES static void name(float *y, float *g, const float *xs, int64_t n) {                   \
        _Pragma("omp simd") for (int64_t i = 0; i < n; i++) {                                      \
            float yi;                                                                              \
            g[i] = GRAD(xs[i], &yi);                                                               \
            y[i] = yi;                                                                             \
        }                                                                                          \
    }
DEF_FWD_GRAD(gelu_tanh_grad_scalar_f32, m_gelu_tanh_grad_f32)
DEF_FWD_GRAD(gelu_erf_grad_f32, m_gelu_erf_grad_f32)

/* The tanh one by hand-written AVX-512 where the CPU has it (gelu_simd.c: the same bits, about
 * a fifth less time than GCC's vectorisation of the scalar code), the tail by the scalar code. */
static void gelu_tanh_grad_f32(float *y, float *g, const float *xs, int64_t n) {
    int64_t done = ts_gelu_tanh_grad_simd(y, g, xs, n);
    if (done < n) gelu_tanh_grad_scalar_f32(y + done, g + done, xs + done, n - done);
}

/* gelu with out_grad: output 0 the GELU (f32, or bf16 with out_low), output 1 the derivative
 * (f32 or bf16: inference gives it output 0's dtype; the kernel takes either, for
 * bench/gelu_grad.c). A chunk goes by pieces of LOW_PIECE, which stay in L1: each bf16 output
 * is computed in f32 on the stack and rounded as run_fwd_low does, an f32 one written in
 * place. */
#define LOW_PIECE 512
static ts_status run_fwd_grad(const ts_kargs *k, fwd_grad_fn f, const char *op) {
    const ts_tensor *x = &k->in[0], *o = &k->out[0];
    const int low = k->a->unary.out_low != 0, glow = k->n_out >= 2 && k->out[1].dtype == TS_BF16;
    if (k->n_out < 2 || x->dtype != TS_F32 || (k->out[1].dtype != TS_F32 && !glow) ||
        o->dtype != (low ? TS_BF16 : TS_F32))
        return ts_kernel_bad_dtype(k, op, k->n_out < 2 ? o->dtype : k->out[1].dtype);
    int64_t n = ts_tensor_numel(o), nch = (n + CHUNK - 1) / CHUNK;
    const float *px = x->data;
#pragma omp parallel for schedule(static) if (n >= TS_PAR_MIN)
    for (int64_t c = 0; c < nch; c++) {
        float yb[LOW_PIECE], gb[LOW_PIECE];
        int64_t e = n - c * CHUNK < CHUNK ? n : (c + 1) * CHUNK;
        for (int64_t s = c * CHUNK; s < e; s += LOW_PIECE) {
            int64_t len = e - s < LOW_PIECE ? e - s : LOW_PIECE;
            float *py = low ? yb : (float *)o->data + s;
            float *pg = glow ? gb : (float *)k->out[1].data + s;
            f(py, pg, px + s, len);
            /* one piece each: below the conversions' threading size */
            if (low) ts_f32_to_bf16_n((uint16_t *)o->data + s, yb, len);
            /* the derivative waits for the backward pass: streamed, past the caches */
            if (glow) ts_f32_to_bf16_stream_n((uint16_t *)k->out[1].data + s, gb, len);
        }
    }
    return TS_OK;
}

static ts_status run_fwd(const ts_kargs *k, fwd_fn f32, fwd_fn f64, const char *op) {
    const ts_tensor *x = &k->in[0], *o = &k->out[0];
    if (k->a->unary.out_low) return run_fwd_low(k, f32, op);
    fwd_fn f = o->dtype == TS_F32 ? f32 : o->dtype == TS_F64 ? f64 : NULL;
    if (!f) return ts_kernel_bad_dtype(k, op, o->dtype);
    size_t es = ts_dtype_size(o->dtype);
    int64_t n = ts_tensor_numel(o), nch = (n + CHUNK - 1) / CHUNK;
    char *po = o->data;
    const char *px = x->data;
    const ts_attrs *a = k->a;
#pragma omp parallel for schedule(static) if (n >= TS_PAR_MIN)
    for (int64_t c = 0; c < nch; c++) {
        int64_t s = c * CHUNK, len = n - s < CHUNK ? n - s : CHUNK;
        f(po + s * (int64_t)es, px + s * (int64_t)es, len, a);
    }
    return TS_OK;
}

#define FWD_KERNEL(op, nm)                                                                         \
    static ts_status k_##op(const ts_kargs *k) {                                                   \
        return run_fwd(k, op##_f32, op##_f64, nm);                                                 \
    }
FWD_KERNEL(neg, "neg")
FWD_KERNEL(exp, "exp")
FWD_KERNEL(log, "log")
FWD_KERNEL(sqrt, "sqrt")
FWD_KERNEL(rsqrt, "rsqrt")
FWD_KERNEL(abs, "abs")
FWD_KERNEL(relu, "relu")
FWD_KERNEL(sigmoid, "sigmoid")
FWD_KERNEL(tanh, "tanh")
FWD_KERNEL(pow, "pow_scalar")
FWD_KERNEL(leaky, "leaky_relu")
FWD_KERNEL(affine, "affine_scalar")

static ts_status k_gelu(const ts_kargs *k) {
    const int tanh_ = k->a->unary.approx == TS_GELU_TANH;
    if (k->a->unary.out_grad)
        return run_fwd_grad(k, tanh_ ? gelu_tanh_grad_f32 : gelu_erf_grad_f32, "gelu");
    if (tanh_) return run_fwd(k, gelu_tanh_f32, gelu_tanh_f64, "gelu");
    return run_fwd(k, gelu_erf_f32, gelu_erf_f64, "gelu");
}

/* ---- backward kernels -------------------------------------------------- */

/* o[i] = f(dy[i], s[i]); o may equal dy (in place). */
typedef void (*bwd_fn)(void *o, const void *dy, const void *s, int64_t n, const ts_attrs *a);

#define DEF_BWD(name, T, expr)                                                                     \
    TS_CLONES static void name(void *o_, const void *d_, const void *s_, int64_t n,                \
                               const ts_attrs *a) {                                                \
        T *o = o_;                                                                                 \
        const T *ds = d_, *ss = s_;                                                                \
        const T slope = (T)a->unary.slope;                                                         \
        (void)slope;                                                                               \
        _Pragma("omp simd") for (int64_t i = 0; i < n; i++) {                                      \
            const T d = ds[i], s = ss[i];                                                          \
            o[i] = (expr);                                                                         \
        }                                                                                          \
    }

#define DEF_BWD2(op, e32, e64)                                                                     \
    DEF_BWD(op##_f32, float, e32)                                                                  \
    DEF_BWD(op##_f64, double, e64)

/* Expressions follow PyTorch's derivatives.yaml / backward kernels; s is y
 * for the *_y variants and x for the others. */
DEF_BWD2(exp_y, d *s, d *s)
DEF_BWD2(exp_x, d *m_exp_f32(s), d *exp(s))
DEF_BWD2(log_x, d / s, d / s)
DEF_BWD2(sqrt_y, d / (s + s), d / (s + s))
DEF_BWD2(sqrt_x, d / (2.0f * sqrtf(s)), d / (2.0 * sqrt(s)))
DEF_BWD2(rsqrt_y, -0.5f * d * (s * s * s), -0.5 * d * (s * s * s))
DEF_BWD2(rsqrt_x, -0.5f * d * (1.0f / (s * sqrtf(s))), -0.5 * d * (1.0 / (s * sqrt(s))))
/* grad * sgn(x): 0 at x == 0 */
DEF_BWD2(abs_x, d *(float)((s > 0.0f) - (s < 0.0f)), d *(double)((s > 0.0) - (s < 0.0)))
/* threshold_backward: y <= 0 ? 0 : grad (also right for s = x) */
DEF_BWD2(relu_ys, s <= 0.0f ? 0.0f : d, s <= 0.0 ? 0.0 : d)
DEF_BWD2(sigmoid_y, d *(1.0f - s) * s, d *(1.0 - s) * s)
DEF_BWD2(sigmoid_x, d *m_sigmoid_f32(-s) * m_sigmoid_f32(s),
         d *m_sigmoid_f64(-s) * m_sigmoid_f64(s))
DEF_BWD2(tanh_y, d *(1.0f - s * s), d *(1.0 - s * s))
DEF_BWD2(tanh_x, d *(1.0f - m_tanh_f32(s) * m_tanh_f32(s)), d *(1.0 - tanh(s) * tanh(s)))
/* leaky_relu_backward: x > 0 ? grad : grad * slope */
DEF_BWD2(leaky_x, s > 0.0f ? d : d * slope, s > 0.0 ? d : d * slope)

static inline double m_gelu_erf_grad_f64(double x) {
    double xc = x > 40.0 ? 40.0 : (x < -40.0 ? -40.0 : x); /* x * pdf is 0 beyond */
    return 0.5 * erfc(-x * SQRT1_2) + xc * (INV_SQRT_2PI * exp(-0.5 * xc * xc));
}
DEF_BWD2(gelu_erf_x, d *m_gelu_erf_grad_f32(s, NULL), d *m_gelu_erf_grad_f64(s))
DEF_BWD2(gelu_tanh_x, d *m_gelu_tanh_grad_f32(s, NULL), d *m_gelu_tanh_grad_f64(s, NULL))
/* s is the derivative itself (gelu's out_grad output): the same product as the *_x forms */
DEF_BWD2(deriv, d *s, d *s)

/* pow backward: exponent 0 gives zeros; else grad * (e * x^(e-1)). */
#define DEF_POW_BWD(name, T, SQRT, POW)                                                            \
    TS_CLONES static void name(void *o_, const void *d_, const void *s_, int64_t n,                \
                               const ts_attrs *a) {                                                \
        T *o = o_;                                                                                 \
        const T *ds = d_, *xs = s_;                                                                \
        const double e = a->unary.exponent, em1 = e - 1.0;                                         \
        const T et = (T)e;                                                                         \
        if (e == 0) {                                                                              \
            for (int64_t i = 0; i < n; i++) o[i] = 0;                                              \
            return;                                                                                \
        }                                                                                          \
        POW_DISPATCH(T, SQRT, POW, em1, o[i] = ds[i] * (et * p))                                   \
    }
DEF_POW_BWD(pow_x_f32, float, sqrtf, powf)
DEF_POW_BWD(pow_x_f64, double, sqrt, pow)

/* The chunk functions of unary_bwd with attributes a; 0 if there is no rule. */
static int pick_bwd(const ts_attrs *a, bwd_fn *pf32, bwd_fn *pf64) {
    int64_t op = a->unary_bwd.fwd_op, side = a->unary_bwd.side;
    bwd_fn f32 = NULL, f64 = NULL;
#define PICK(fn)                                                                                   \
    do {                                                                                           \
        f32 = fn##_f32;                                                                            \
        f64 = fn##_f64;                                                                            \
    } while (0)
    switch (op) {
    case TS_OP_EXP:
        if (side)
            PICK(exp_y);
        else
            PICK(exp_x);
        break;
    case TS_OP_LOG: PICK(log_x); break;
    case TS_OP_SQRT:
        if (side)
            PICK(sqrt_y);
        else
            PICK(sqrt_x);
        break;
    case TS_OP_RSQRT:
        if (side)
            PICK(rsqrt_y);
        else
            PICK(rsqrt_x);
        break;
    case TS_OP_ABS: PICK(abs_x); break;
    case TS_OP_RELU: PICK(relu_ys); break;
    case TS_OP_SIGMOID:
        if (side)
            PICK(sigmoid_y);
        else
            PICK(sigmoid_x);
        break;
    case TS_OP_TANH:
        if (side)
            PICK(tanh_y);
        else
            PICK(tanh_x);
        break;
    case TS_OP_POW_SCALAR: PICK(pow_x); break;
    case TS_OP_LEAKY_RELU: PICK(leaky_x); break;
    case TS_OP_GELU:
        if (side == 2)
            PICK(deriv);
        else if (a->unary_bwd.fwd.approx == TS_GELU_TANH)
            PICK(gelu_tanh_x);
        else
            PICK(gelu_erf_x);
        break;
    default: return 0;
    }
#undef PICK
    *pf32 = f32;
    *pf64 = f64;
    return 1;
}

static ts_status k_unary_bwd(const ts_kargs *k) {
    bwd_fn f32 = NULL, f64 = NULL;
    if (!pick_bwd(k->a, &f32, &f64))
        return ts_fail(TS_ERR_INTERNAL, "unary_bwd '%s': no rule for forward op %lld",
                       k->label ? k->label : "?", (long long)k->a->unary_bwd.fwd_op);
    const ts_tensor *d = &k->in[0], *s = &k->in[1], *o = &k->out[0];
    bwd_fn f = o->dtype == TS_F32 ? f32 : o->dtype == TS_F64 ? f64 : NULL;
    if (!f) return ts_kernel_bad_dtype(k, "unary_bwd", o->dtype);
    /* a bf16 derivative (side 2, inference checks): each chunk widened on the stack */
    const int low_s = s->dtype == TS_BF16;
    if (low_s && (o->dtype != TS_F32 || k->a->unary_bwd.side != 2))
        return ts_kernel_bad_dtype(k, "unary_bwd", s->dtype);
    /* the attributes as the forward op saw them */
    ts_attrs fa = fwd_attrs(k->a);
    size_t es = ts_dtype_size(o->dtype);
    int64_t n = ts_tensor_numel(o), nch = (n + CHUNK - 1) / CHUNK;
    char *po = o->data;
    const char *pd = d->data, *ps = s->data;
#pragma omp parallel for schedule(static) if (n >= TS_PAR_MIN)
    for (int64_t c = 0; c < nch; c++) {
        float sbuf[CHUNK];
        int64_t st = c * CHUNK, len = n - st < CHUNK ? n - st : CHUNK;
        int64_t off = st * (int64_t)es;
        const void *sc = ps + off;
        if (low_s) ts_bf16_to_f32_n(sbuf, (const uint16_t *)ps + st, len), sc = sbuf;
        f(po + off, pd + off, sc, len, &fa);
    }
    return TS_OK;
}

/* ---- chunk functions for fused kernels (eltwise.h) ---------------------- */

ts_unary_chunk_fn ts_unary_chunk_f32(int op, const ts_attrs *a) {
    switch (op) {
    case TS_OP_NEG: return neg_f32;
    case TS_OP_EXP: return exp_f32;
    case TS_OP_LOG: return log_f32;
    case TS_OP_SQRT: return sqrt_f32;
    case TS_OP_RSQRT: return rsqrt_f32;
    case TS_OP_ABS: return abs_f32;
    case TS_OP_RELU: return relu_f32;
    case TS_OP_SIGMOID: return sigmoid_f32;
    case TS_OP_TANH: return tanh_f32;
    case TS_OP_POW_SCALAR: return pow_f32;
    case TS_OP_LEAKY_RELU: return leaky_f32;
    case TS_OP_AFFINE_SCALAR: return affine_f32;
    case TS_OP_GELU: return a->unary.approx == TS_GELU_TANH ? gelu_tanh_f32 : gelu_erf_f32;
    default: return NULL;
    }
}

ts_unary_bwd_chunk_fn ts_unary_bwd_chunk_f32(const ts_attrs *a, ts_attrs *fwd) {
    bwd_fn f32 = NULL, f64 = NULL;
    if (!pick_bwd(a, &f32, &f64)) return NULL;
    *fwd = fwd_attrs(a);
    return f32;
}

/* ---- cast -------------------------------------------------------------- */

/* f16 and bf16 go through f32 with round-to-nearest-even (core/half.h). */

/* float -> integer truncates toward zero and saturates (NaN gives 0), so
 * out-of-range values are defined; in range this equals PyTorch. u8 takes
 * the low byte of the i64 result (-1.0 -> 255, as PyTorch). */
static inline int64_t f_to_i64(double v) {
    if (v != v) return 0;
    if (v >= 9223372036854775807.0) return INT64_MAX;
    if (v <= -9223372036854775808.0) return INT64_MIN;
    return (int64_t)v;
}
static inline int32_t f_to_i32(double v) {
    if (v != v) return 0;
    if (v >= 2147483647.0) return INT32_MAX;
    if (v <= -2147483648.0) return INT32_MIN;
    return (int32_t)v;
}

/* Every element goes through one of three carriers: double for floats
 * (exact for f32, f16, bf16), int64 for integers. */
static inline double load_f(const void *p, ts_dtype dt, int64_t i) {
    switch (dt) {
    case TS_F32: return ((const float *)p)[i];
    case TS_F64: return ((const double *)p)[i];
    case TS_F16: return ts_f16_to_f32(((const uint16_t *)p)[i]);
    case TS_BF16: return ts_bf16_to_f32(((const uint16_t *)p)[i]);
    case TS_I32: return ((const int32_t *)p)[i];
    case TS_I64: return (double)((const int64_t *)p)[i];
    default: return ((const uint8_t *)p)[i];
    }
}
static inline int64_t load_i(const void *p, ts_dtype dt, int64_t i) {
    switch (dt) {
    case TS_I32: return ((const int32_t *)p)[i];
    case TS_I64: return ((const int64_t *)p)[i];
    case TS_U8: return ((const uint8_t *)p)[i];
    default: return f_to_i64(load_f(p, dt, i));
    }
}

/* Same-size pairs may run in place: `omp simd` as in the unary kernels. */
#define CAST_LOOP(TO, TI, EXPR)                                                                    \
    {                                                                                              \
        TO *o = po;                                                                                \
        const TI *x = px;                                                                          \
        _Pragma("omp simd") for (int64_t i = 0; i < n; i++) o[i] = (EXPR);                         \
        return;                                                                                    \
    }

TS_CLONES static void cast_chunk(void *po, const void *px, ts_dtype from, ts_dtype to, int64_t n) {
    /* hot pairs as straight, vectorisable loops */
    if (from == TS_F32 && to == TS_F64) CAST_LOOP(double, float, (double)x[i]);
    if (from == TS_F64 && to == TS_F32) CAST_LOOP(float, double, (float)x[i]);
    if (from == TS_I32 && to == TS_F32) CAST_LOOP(float, int32_t, (float)x[i]);
    if (from == TS_I64 && to == TS_F32) CAST_LOOP(float, int64_t, (float)x[i]);
    if (from == TS_U8 && to == TS_F32) CAST_LOOP(float, uint8_t, (float)x[i]);
    if (from == TS_F32 && to == TS_BF16) CAST_LOOP(uint16_t, float, ts_f32_to_bf16(x[i]));
    if (from == TS_BF16 && to == TS_F32) CAST_LOOP(float, uint16_t, ts_bf16_to_f32(x[i]));
    if (from == TS_F32 && to == TS_F16) CAST_LOOP(uint16_t, float, ts_f32_to_f16(x[i]));
    if (from == TS_F16 && to == TS_F32) CAST_LOOP(float, uint16_t, ts_f16_to_f32(x[i]));
    for (int64_t i = 0; i < n; i++) {
        switch (to) {
        case TS_F32: ((float *)po)[i] = (float)load_f(px, from, i); break;
        case TS_F64: ((double *)po)[i] = load_f(px, from, i); break;
        /* f64 -> f32 -> f16 would round twice; rare enough to accept (the
         * precision pass converts from f32) */
        case TS_F16: ((uint16_t *)po)[i] = ts_f32_to_f16((float)load_f(px, from, i)); break;
        case TS_BF16: ((uint16_t *)po)[i] = ts_f32_to_bf16((float)load_f(px, from, i)); break;
        case TS_I32:
            ((int32_t *)po)[i] = ts_dtype_is_float(from) ? f_to_i32(load_f(px, from, i))
                                                         : (int32_t)load_i(px, from, i);
            break;
        case TS_I64: ((int64_t *)po)[i] = load_i(px, from, i); break;
        default: ((uint8_t *)po)[i] = (uint8_t)load_i(px, from, i); break;
        }
    }
}

static ts_status k_cast(const ts_kargs *k) {
    const ts_tensor *x = &k->in[0], *o = &k->out[0];
    if (!cast_dtype_ok(x->dtype) || !cast_dtype_ok(o->dtype))
        return ts_kernel_bad_dtype(k, "cast", cast_dtype_ok(x->dtype) ? o->dtype : x->dtype);
    size_t ei = ts_dtype_size(x->dtype), eo = ts_dtype_size(o->dtype);
    int64_t n = ts_tensor_numel(o), nch = (n + CHUNK - 1) / CHUNK;
    if (x->dtype == o->dtype) {
        if (o->data != x->data && n) memcpy(o->data, x->data, (size_t)n * eo);
        return TS_OK;
    }
#pragma omp parallel for schedule(static) if (n >= TS_PAR_MIN)
    for (int64_t c = 0; c < nch; c++) {
        int64_t s = c * CHUNK, len = n - s < CHUNK ? n - s : CHUNK;
        cast_chunk((char *)o->data + s * (int64_t)eo, (const char *)x->data + s * (int64_t)ei,
                   x->dtype, o->dtype, len);
    }
    return TS_OK;
}

/* ---- definitions ------------------------------------------------------- */

static double cost_elementwise(const ts_graph *g, const ts_node *n) {
    return (double)ts_type_numel(&g->values[n->out[0]].t);
}

#define UN_DEF(id, nm, gr, kern)                                                                   \
    const ts_op_def ts_def_##id = {.name = nm,                                                     \
                                   .min_in = 1,                                                    \
                                   .max_in = 1,                                                    \
                                   .flags = TS_OPF_ELEMENTWISE | TS_OPF_INPLACE,                   \
                                   .infer = infer_unary,                                           \
                                   .grad = gr,                                                     \
                                   .kernel = kern,                                                 \
                                   .cost = cost_elementwise};

UN_DEF(neg, "neg", grad_neg, k_neg)
UN_DEF(exp, "exp", grad_from_y, k_exp)
UN_DEF(log, "log", grad_from_x, k_log)
UN_DEF(sqrt, "sqrt", grad_from_y, k_sqrt)
UN_DEF(rsqrt, "rsqrt", grad_from_y, k_rsqrt)
UN_DEF(abs, "abs", grad_from_x, k_abs)
UN_DEF(relu, "relu", grad_from_y, k_relu)
UN_DEF(sigmoid, "sigmoid", grad_from_y, k_sigmoid)
UN_DEF(tanh, "tanh", grad_from_y, k_tanh)
UN_DEF(pow_scalar, "pow_scalar", grad_from_x, k_pow)
UN_DEF(leaky_relu, "leaky_relu", grad_from_x, k_leaky)
UN_DEF(affine_scalar, "affine_scalar", grad_affine, k_affine)
UN_DEF(gelu, "gelu", grad_from_x, k_gelu)

/* In place only when element sizes match (f32 <-> i32, f64 <-> i64): each
 * element is read before the same bytes are written. */
const ts_op_def ts_def_cast = {.name = "cast",
                               .min_in = 1,
                               .max_in = 1,
                               .flags = TS_OPF_ELEMENTWISE | TS_OPF_INPLACE,
                               .infer = infer_cast,
                               .grad = grad_cast,
                               .kernel = k_cast,
                               .cost = cost_elementwise};

const ts_op_def ts_def_unary_bwd = {.name = "unary_bwd",
                                    .min_in = 2,
                                    .max_in = 2,
                                    .flags = TS_OPF_ELEMENTWISE | TS_OPF_INPLACE,
                                    .infer = infer_unary_bwd,
                                    .kernel = k_unary_bwd,
                                    .cost = cost_elementwise};

/* ---- builders ---------------------------------------------------------- */

static ts_val un(ts_graph *g, int op, ts_val a, const ts_attrs *attrs) {
    return ts_node_add(g, op, 1, &a, attrs, NULL);
}

ts_val ts_neg(ts_graph *g, ts_val a) {
    return un(g, TS_OP_NEG, a, NULL);
}
ts_val ts_exp(ts_graph *g, ts_val a) {
    return un(g, TS_OP_EXP, a, NULL);
}
ts_val ts_log(ts_graph *g, ts_val a) {
    return un(g, TS_OP_LOG, a, NULL);
}
ts_val ts_sqrt(ts_graph *g, ts_val a) {
    return un(g, TS_OP_SQRT, a, NULL);
}
ts_val ts_rsqrt(ts_graph *g, ts_val a) {
    return un(g, TS_OP_RSQRT, a, NULL);
}
ts_val ts_abs(ts_graph *g, ts_val a) {
    return un(g, TS_OP_ABS, a, NULL);
}
ts_val ts_relu(ts_graph *g, ts_val a) {
    return un(g, TS_OP_RELU, a, NULL);
}
ts_val ts_sigmoid(ts_graph *g, ts_val a) {
    return un(g, TS_OP_SIGMOID, a, NULL);
}
ts_val ts_tanh(ts_graph *g, ts_val a) {
    return un(g, TS_OP_TANH, a, NULL);
}

ts_val ts_pow_scalar(ts_graph *g, ts_val a, double exponent) {
    ts_attrs at = ts_attrs_zero();
    at.unary.exponent = exponent;
    return un(g, TS_OP_POW_SCALAR, a, &at);
}

ts_val ts_leaky_relu(ts_graph *g, ts_val a, double negative_slope) {
    ts_attrs at = ts_attrs_zero();
    at.unary.slope = negative_slope;
    return un(g, TS_OP_LEAKY_RELU, a, &at);
}

ts_val ts_affine_scalar(ts_graph *g, ts_val a, double s, double t) {
    ts_attrs at = ts_attrs_zero();
    at.unary.scale = s;
    at.unary.shift = t;
    return un(g, TS_OP_AFFINE_SCALAR, a, &at);
}

ts_val ts_gelu(ts_graph *g, ts_val a, ts_gelu_approx approx) {
    ts_attrs at = ts_attrs_zero();
    at.unary.approx = approx;
    return un(g, TS_OP_GELU, a, &at);
}

/* A cast to the value's own dtype is the value itself (as Tensor.to). */
ts_val ts_cast(ts_graph *g, ts_val a, ts_dtype to) {
    if (g && ts_val_ok(a) && a.id < g->n_values && g->values[a.id].t.dtype == to) return a;
    ts_attrs at = ts_attrs_zero();
    at.cast.dtype = to;
    return un(g, TS_OP_CAST, a, &at);
}
