/* Softmax and log-softmax along any axis, and their backward ops.
 *
 * The input is viewed as [outer, n, inner] with n the normalised axis. When
 * the axis is the last one (inner == 1) each row is contiguous and handled
 * by one row function; otherwise a task covers up to CW adjacent inner
 * positions of one outer index and walks the axis with stride `inner`, so
 * the inner loops stay contiguous and vectorisable.
 *
 * Numerics: the maximum is subtracted before exp; sums accumulate in double
 * in LN interleaved partial sums combined in a fixed order, so results are
 * identical for every thread count and every target_clones variant.
 *
 * Fully masked rows (every element -inf): torch 1.13 returns NaN there. We
 * return a softmax of zeros (so attention over a fully padded row adds
 * nothing instead of poisoning the step with NaN) and a log-softmax of
 * -inf; the backward formulas then give dx = 0 for softmax and dx = dy for
 * log-softmax (the same value torch gives for -inf entries of a partially
 * masked row). NaN inputs and +inf still give NaN, as in torch. */
#include <math.h>
#include <string.h>
#include "kern.h"
#include "vmath.h"

#define LN TS_LANES /* interleaved partial sums of a row reduction */
#define CW 64       /* inner positions per task for a non-last axis */

/* ---- inference --------------------------------------------------------- */

static ts_status check_axis(const ts_node *n, const ts_type *t) {
    int64_t ax = n->a.softmax.axis;
    int r = t->rank ? t->rank : 1; /* rank 0: axis 0 is the element itself */
    if (ax < 0 || ax >= r)
        return ts_fail(TS_ERR_INVALID, "axis %lld out of range for rank %d", (long long)ax,
                       t->rank);
    return TS_OK;
}

static ts_status infer_softmax(const ts_graph *g, const ts_node *n, ts_type *out, int *n_out) {
    const ts_type *x = ts_in_type(g, n, 0);
    if (!ts_dtype_is_float(x->dtype))
        return ts_fail(TS_ERR_SHAPE, "needs a float dtype, got %s", ts_dtype_name(x->dtype));
    ts_status s = check_axis(n, x);
    if (s != TS_OK) return s;
    *out = *x;
    *n_out = 1;
    return TS_OK;
}

static ts_status infer_softmax_bwd(const ts_graph *g, const ts_node *n, ts_type *out, int *n_out) {
    const ts_type *dy = ts_in_type(g, n, 0), *y = ts_in_type(g, n, 1);
    if (!ts_type_equal(dy, y)) return ts_fail(TS_ERR_SHAPE, "dy and y must have the same type");
    return infer_softmax(g, &(ts_node){.in = n->in + 1, .n_in = 1, .a = n->a}, out, n_out);
}

/* ---- gradients --------------------------------------------------------- */

static ts_status grad_softmax(ts_graph *g, const ts_node *n, const ts_val *dy, ts_val *din) {
    if (!ts_val_ok(dy[0])) return TS_OK;
    ts_val in[2] = {dy[0], ts_mkval(n->out[0])};
    int op = n->op == TS_OP_SOFTMAX ? TS_OP_SOFTMAX_BWD : TS_OP_LOG_SOFTMAX_BWD;
    din[0] = ts_node_add(g, op, 2, in, &n->a, NULL);
    return ts_graph_status(g);
}

/* ---- kernels ----------------------------------------------------------- */

/* Row functions: out, a, b (b unused by the forward ops), n elements along
 * the axis; column functions add the stride `inner` and the width w <= CW.
 * The max ignores NaN; a NaN still reaches every output through exp. */
#define DEF_SOFTMAX(T, SFX, EXP, LOG)                                                              \
    TS_CLONES static T rowmax_##SFX(const T *x, int64_t n) {                                       \
        T m = ts_row_max_##SFX(x, n);                                                              \
        return m == (T)-INFINITY ? (T)0 : m; /* fully masked: exp(-inf - 0) = 0 */                 \
    }                                                                                              \
    TS_CLONES static void sm_row_##SFX(void *o_, const void *x_, const void *u, int64_t n,         \
                                       int64_t inner, int64_t w) {                                 \
        (void)u, (void)inner, (void)w;                                                             \
        T *y = o_;                                                                                 \
        const T *x = x_;                                                                           \
        if (n < LN) { /* a few elements: the same sums without the lanes (all 0) */                \
            T m = (T)-INFINITY;                                                                    \
            for (int64_t i = 0; i < n; i++) m = x[i] > m ? x[i] : m;                               \
            if (m == (T)-INFINITY) m = 0;                                                          \
            double s = 0;                                                                          \
            for (int64_t i = 0; i < n; i++) {                                                      \
                y[i] = EXP(x[i] - m);                                                              \
                s += y[i];                                                                         \
            }                                                                                      \
            T inv = (T)(s == 0 ? 0 : 1 / s);                                                       \
            for (int64_t i = 0; i < n; i++) y[i] *= inv;                                           \
            return;                                                                                \
        }                                                                                          \
        T m = rowmax_##SFX(x, n);                                                                  \
        double acc[LN] = {0}, s = 0;                                                               \
        int64_t i = 0;                                                                             \
        for (; i + LN <= n; i += LN)                                                               \
            for (int j = 0; j < LN; j++) {                                                         \
                T e = EXP(x[i + j] - m);                                                           \
                y[i + j] = e;                                                                      \
                acc[j] += e;                                                                       \
            }                                                                                      \
        for (; i < n; i++) {                                                                       \
            y[i] = EXP(x[i] - m);                                                                  \
            s += y[i];                                                                             \
        }                                                                                          \
        s += ts_lanes_sum(acc);                                                                    \
        T inv = (T)(s == 0 ? 0 : 1 / s); /* s == 0 only for a fully masked row */                  \
        for (i = 0; i < n; i++) y[i] *= inv;                                                       \
    }                                                                                              \
    TS_CLONES static void lsm_row_##SFX(void *o_, const void *x_, const void *u, int64_t n,        \
                                        int64_t inner, int64_t w) {                                \
        (void)u, (void)inner, (void)w;                                                             \
        T *y = o_;                                                                                 \
        const T *x = x_;                                                                           \
        T m = rowmax_##SFX(x, n);                                                                  \
        double acc[LN] = {0}, s = 0;                                                               \
        int64_t i = 0;                                                                             \
        for (; i + LN <= n; i += LN)                                                               \
            for (int j = 0; j < LN; j++) acc[j] += EXP(x[i + j] - m);                              \
        for (; i < n; i++) s += EXP(x[i] - m);                                                     \
        s += ts_lanes_sum(acc);                                                                    \
        T ls = (T)(s == 0 ? 0 : log(s)); /* fully masked: y = -inf */                              \
        for (i = 0; i < n; i++) y[i] = (x[i] - m) - ls;                                            \
    }                                                                                              \
    TS_CLONES static void sm_bwd_row_##SFX(void *o_, const void *dy_, const void *y_, int64_t n,   \
                                           int64_t inner, int64_t w) {                             \
        (void)inner, (void)w;                                                                      \
        T *dx = o_;                                                                                \
        const T *dy = dy_, *y = y_;                                                                \
        double acc[LN] = {0}, s = 0;                                                               \
        int64_t i = 0;                                                                             \
        for (; i + LN <= n; i += LN)                                                               \
            for (int j = 0; j < LN; j++) acc[j] += (double)(dy[i + j] * y[i + j]);                 \
        for (; i < n; i++) s += (double)(dy[i] * y[i]);                                            \
        T st = (T)(s + ts_lanes_sum(acc));                                                         \
        for (i = 0; i < n; i++) dx[i] = y[i] * (dy[i] - st);                                       \
    }                                                                                              \
    TS_CLONES static void lsm_bwd_row_##SFX(void *o_, const void *dy_, const void *y_, int64_t n,  \
                                            int64_t inner, int64_t w) {                            \
        (void)inner, (void)w;                                                                      \
        T *dx = o_;                                                                                \
        const T *dy = dy_, *y = y_;                                                                \
        double acc[LN] = {0}, s = 0;                                                               \
        int64_t i = 0;                                                                             \
        for (; i + LN <= n; i += LN)                                                               \
            for (int j = 0; j < LN; j++) acc[j] += (double)dy[i + j];                              \
        for (; i < n; i++) s += (double)dy[i];                                                     \
        T st = (T)(s + ts_lanes_sum(acc));                                                         \
        for (i = 0; i < n; i++) dx[i] = dy[i] - EXP(y[i]) * st;                                    \
    }                                                                                              \
    /* Column variants: x points at (outer, 0, c0), element (j, c) at j * inner + c. */            \
    TS_CLONES static void colmax_##SFX(T *m, const T *x, int64_t n, int64_t inner, int64_t w) {    \
        for (int64_t c = 0; c < w; c++) m[c] = (T)-INFINITY;                                       \
        for (int64_t j = 0; j < n; j++) {                                                          \
            const T *r = x + j * inner;                                                            \
            for (int64_t c = 0; c < w; c++) m[c] = r[c] > m[c] ? r[c] : m[c];                      \
        }                                                                                          \
        for (int64_t c = 0; c < w; c++) m[c] = m[c] == (T)-INFINITY ? (T)0 : m[c];                 \
    }                                                                                              \
    TS_CLONES static void sm_col_##SFX(void *o_, const void *x_, const void *u, int64_t n,         \
                                       int64_t inner, int64_t w) {                                 \
        (void)u;                                                                                   \
        T *y = o_, m[CW], inv[CW];                                                                 \
        const T *x = x_;                                                                           \
        double s[CW] = {0};                                                                        \
        colmax_##SFX(m, x, n, inner, w);                                                           \
        for (int64_t j = 0; j < n; j++) {                                                          \
            const T *r = x + j * inner;                                                            \
            T *yr = y + j * inner;                                                                 \
            for (int64_t c = 0; c < w; c++) {                                                      \
                T e = EXP(r[c] - m[c]);                                                            \
                yr[c] = e;                                                                         \
                s[c] += e;                                                                         \
            }                                                                                      \
        }                                                                                          \
        for (int64_t c = 0; c < w; c++) inv[c] = (T)(s[c] == 0 ? 0 : 1 / s[c]);                    \
        for (int64_t j = 0; j < n; j++) {                                                          \
            T *yr = y + j * inner;                                                                 \
            for (int64_t c = 0; c < w; c++) yr[c] *= inv[c];                                       \
        }                                                                                          \
    }                                                                                              \
    TS_CLONES static void lsm_col_##SFX(void *o_, const void *x_, const void *u, int64_t n,        \
                                        int64_t inner, int64_t w) {                                \
        (void)u;                                                                                   \
        T *y = o_, m[CW], ls[CW];                                                                  \
        const T *x = x_;                                                                           \
        double s[CW] = {0};                                                                        \
        colmax_##SFX(m, x, n, inner, w);                                                           \
        for (int64_t j = 0; j < n; j++) {                                                          \
            const T *r = x + j * inner;                                                            \
            for (int64_t c = 0; c < w; c++) s[c] += EXP(r[c] - m[c]);                              \
        }                                                                                          \
        for (int64_t c = 0; c < w; c++) ls[c] = (T)(s[c] == 0 ? 0 : log(s[c]));                    \
        for (int64_t j = 0; j < n; j++) {                                                          \
            const T *r = x + j * inner;                                                            \
            T *yr = y + j * inner;                                                                 \
            for (int64_t c = 0; c < w; c++) yr[c] = (r[c] - m[c]) - ls[c];                         \
        }                                                                                          \
    }                                                                                              \
    TS_CLONES static void sm_bwd_col_##SFX(void *o_, const void *dy_, const void *y_, int64_t n,   \
                                           int64_t inner, int64_t w) {                             \
        T *dx = o_, st[CW];                                                                        \
        const T *dy = dy_, *y = y_;                                                                \
        double s[CW] = {0};                                                                        \
        for (int64_t j = 0; j < n; j++)                                                            \
            for (int64_t c = 0; c < w; c++)                                                        \
                s[c] += (double)(dy[j * inner + c] * y[j * inner + c]);                            \
        for (int64_t c = 0; c < w; c++) st[c] = (T)s[c];                                           \
        for (int64_t j = 0; j < n; j++)                                                            \
            for (int64_t c = 0; c < w; c++) {                                                      \
                int64_t e = j * inner + c;                                                         \
                dx[e] = y[e] * (dy[e] - st[c]);                                                    \
            }                                                                                      \
    }                                                                                              \
    TS_CLONES static void lsm_bwd_col_##SFX(void *o_, const void *dy_, const void *y_, int64_t n,  \
                                            int64_t inner, int64_t w) {                            \
        T *dx = o_, st[CW];                                                                        \
        const T *dy = dy_, *y = y_;                                                                \
        double s[CW] = {0};                                                                        \
        for (int64_t j = 0; j < n; j++)                                                            \
            for (int64_t c = 0; c < w; c++) s[c] += (double)dy[j * inner + c];                     \
        for (int64_t c = 0; c < w; c++) st[c] = (T)s[c];                                           \
        for (int64_t j = 0; j < n; j++)                                                            \
            for (int64_t c = 0; c < w; c++) {                                                      \
                int64_t e = j * inner + c;                                                         \
                dx[e] = dy[e] - EXP(y[e]) * st[c];                                                 \
            }                                                                                      \
    }

DEF_SOFTMAX(float, f32, m_exp_f32, logf)
DEF_SOFTMAX(double, f64, exp, log)

typedef void (*axis_fn)(void *o, const void *a, const void *b, int64_t n, int64_t inner, int64_t w);

/* fns: {row f32, row f64, col f32, col f64}. in[0] (and in[1] for the
 * backward ops) have the output's shape. */
static ts_status run_axis(const ts_kargs *k, const char *op, const axis_fn fns[4]) {
    const ts_tensor *o = &k->out[0];
    int f64 = o->dtype == TS_F64;
    if (o->dtype != TS_F32 && !f64) return ts_kernel_bad_dtype(k, op, o->dtype);
    int axis = (int)k->a->softmax.axis;
    int64_t outer = 1, n = 1, inner = 1;
    for (int i = 0; i < o->rank; i++) {
        if (i < axis)
            outer *= o->dims[i];
        else if (i == axis)
            n = o->dims[i];
        else
            inner *= o->dims[i];
    }
    int64_t es = (int64_t)ts_dtype_size(o->dtype), total = outer * n * inner;
    char *po = o->data;
    const char *pa = k->in[0].data, *pb = k->n_in > 1 ? k->in[1].data : NULL;
    if (inner == 1) {
        axis_fn f = fns[f64];
#pragma omp parallel for schedule(static) if (total >= TS_PAR_MIN)
        for (int64_t r = 0; r < outer; r++) {
            int64_t off = r * n * es;
            f(po + off, pa + off, pb ? pb + off : NULL, n, 1, 1);
        }
    } else {
        axis_fn f = fns[2 + f64];
        int64_t nch = (inner + CW - 1) / CW;
#pragma omp parallel for schedule(static) if (total >= TS_PAR_MIN)
        for (int64_t t = 0; t < outer * nch; t++) {
            int64_t oi = t / nch, c0 = (t % nch) * CW;
            int64_t w = inner - c0 < CW ? inner - c0 : CW;
            int64_t off = (oi * n * inner + c0) * es;
            f(po + off, pa + off, pb ? pb + off : NULL, n, inner, w);
        }
    }
    return TS_OK;
}

/* Softmax over the last axis of f32 rows of a few elements (n < LN, e.g.
 * the per-voxel class scores of a segmentation: millions of rows of 2):
 * SM_ROWS rows at a time, element by element across the rows so each pass
 * fills the vector lanes. The same sums in the same order as sm_row's
 * few-elements path, so the same bits. y may be x. */
#define SM_ROWS 64
TS_CLONES static void sm_rows_f32(float *y, const float *x, int64_t nr, int64_t n) {
    float m[SM_ROWS], inv[SM_ROWS];
    double s[SM_ROWS];
    for (int64_t r = 0; r < nr; r++) m[r] = -INFINITY, s[r] = 0;
    for (int64_t i = 0; i < n; i++)
        for (int64_t r = 0; r < nr; r++) m[r] = x[r * n + i] > m[r] ? x[r * n + i] : m[r];
    for (int64_t r = 0; r < nr; r++) m[r] = m[r] == -INFINITY ? 0.0f : m[r];
    for (int64_t i = 0; i < n; i++)
        for (int64_t r = 0; r < nr; r++) {
            float e = m_exp_f32(x[r * n + i] - m[r]);
            y[r * n + i] = e;
            s[r] += e;
        }
    for (int64_t r = 0; r < nr; r++) inv[r] = (float)(s[r] == 0 ? 0 : 1 / s[r]);
    for (int64_t i = 0; i < n; i++)
        for (int64_t r = 0; r < nr; r++) y[r * n + i] *= inv[r];
}

static ts_status k_softmax(const ts_kargs *k) {
    static const axis_fn f[4] = {sm_row_f32, sm_row_f64, sm_col_f32, sm_col_f64};
    const ts_tensor *o = &k->out[0];
    const int64_t n = o->rank ? o->dims[o->rank - 1] : 1;
    if (o->dtype == TS_F32 && o->rank && k->a->softmax.axis == o->rank - 1 && n < LN) {
        const int64_t rows = ts_tensor_numel(o) / n, nb = (rows + SM_ROWS - 1) / SM_ROWS;
        float *y = o->data;
        const float *x = k->in[0].data;
#pragma omp parallel for schedule(static) if (rows * n >= TS_PAR_MIN)
        for (int64_t b = 0; b < nb; b++) {
            int64_t r0 = b * SM_ROWS, nr = rows - r0 < SM_ROWS ? rows - r0 : SM_ROWS;
            sm_rows_f32(y + r0 * n, x + r0 * n, nr, n);
        }
        return TS_OK;
    }
    return run_axis(k, "softmax", f);
}
static ts_status k_log_softmax(const ts_kargs *k) {
    static const axis_fn f[4] = {lsm_row_f32, lsm_row_f64, lsm_col_f32, lsm_col_f64};
    return run_axis(k, "log_softmax", f);
}
static ts_status k_softmax_bwd(const ts_kargs *k) {
    static const axis_fn f[4] = {sm_bwd_row_f32, sm_bwd_row_f64, sm_bwd_col_f32, sm_bwd_col_f64};
    return run_axis(k, "softmax_bwd", f);
}
static ts_status k_log_softmax_bwd(const ts_kargs *k) {
    static const axis_fn f[4] = {lsm_bwd_row_f32, lsm_bwd_row_f64, lsm_bwd_col_f32,
                                 lsm_bwd_col_f64};
    return run_axis(k, "log_softmax_bwd", f);
}

/* max, subtract, exp, sum, scale: about five operations per element. */
static double cost_softmax(const ts_graph *g, const ts_node *n) {
    return 5.0 * (double)ts_type_numel(&g->values[n->out[0]].t);
}

/* Every op here may write its output over input 0: each output element is
 * written only after everything it depends on in input 0 has been read
 * (the reductions read the whole row/column first, the final pass reads and
 * writes the same element). */
const ts_op_def ts_def_softmax = {.name = "softmax",
                                  .min_in = 1,
                                  .max_in = 1,
                                  .flags = TS_OPF_INPLACE,
                                  .infer = infer_softmax,
                                  .grad = grad_softmax,
                                  .kernel = k_softmax,
                                  .cost = cost_softmax};

const ts_op_def ts_def_log_softmax = {.name = "log_softmax",
                                      .min_in = 1,
                                      .max_in = 1,
                                      .flags = TS_OPF_INPLACE,
                                      .infer = infer_softmax,
                                      .grad = grad_softmax,
                                      .kernel = k_log_softmax,
                                      .cost = cost_softmax};

const ts_op_def ts_def_softmax_bwd = {.name = "softmax_bwd",
                                      .min_in = 2,
                                      .max_in = 2,
                                      .flags = TS_OPF_INPLACE,
                                      .infer = infer_softmax_bwd,
                                      .kernel = k_softmax_bwd,
                                      .cost = cost_softmax};

const ts_op_def ts_def_log_softmax_bwd = {.name = "log_softmax_bwd",
                                          .min_in = 2,
                                          .max_in = 2,
                                          .flags = TS_OPF_INPLACE,
                                          .infer = infer_softmax_bwd,
                                          .kernel = k_log_softmax_bwd,
                                          .cost = cost_softmax};

/* ---- builders ---------------------------------------------------------- */

static ts_val softmax_op(ts_graph *g, int op, const char *what, ts_val a, int axis) {
    if (!g || g->status != TS_OK || !ts_val_ok(a)) return TS_NONE;
    int rank = ts_rank(g, a);
    /* A rank-0 tensor accepts axis 0 or -1, as in torch. */
    int ax = rank == 0 ? ((axis == 0 || axis == -1) ? 0 : -1) : ts_axis(axis, rank);
    if (ax < 0) {
        char tb[128];
        return ts_graph_fail(g, TS_ERR_INVALID, "%s(%s): axis %d out of range for rank %d", what,
                             ts_type_str(tb, sizeof tb, &ts_v(g, a)->t), axis, rank);
    }
    ts_attrs at = ts_attrs_zero();
    at.softmax.axis = ax;
    return ts_node_add(g, op, 1, &a, &at, NULL);
}

ts_val ts_softmax(ts_graph *g, ts_val a, int axis) {
    return softmax_op(g, TS_OP_SOFTMAX, "softmax", a, axis);
}
ts_val ts_log_softmax(ts_graph *g, ts_val a, int axis) {
    return softmax_op(g, TS_OP_LOG_SOFTMAX, "log_softmax", a, axis);
}
