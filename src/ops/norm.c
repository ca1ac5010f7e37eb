/* Layer normalisation over the last axis and its backward op.
 *
 * Forward, per row of D elements: mean and variance (biased, as torch) are
 * accumulated in double in two passes (sum, then sum of squared
 * deviations), which is at least as accurate as torch's float Welford and
 * agrees with it to ~1e-7 relative; rstd = 1 / sqrt(var + eps). mean and
 * rstd are kept as extra outputs [rows] in the input dtype for the
 * backward op, which then needs no second pass over the statistics.
 *
 * Backward: dx is row-parallel. dw and db sum over rows: rows are cut into
 * fixed blocks of LN_ROWS, each (block, column chunk) task writes double
 * partials to scratch, and the partials are added in block order per
 * column, so the result does not depend on the thread count. With blocks
 * enough for the threads, a block's dx rows and then its partials are one
 * task, so the block's dy and x are read from memory once, not twice.
 *
 * layer_norm_bwd_acc, built by the fusion pass (passes/fuse_norm.c) from
 * add(acc, layer_norm_bwd(...)), is the same op with each row of dx added
 * to acc's row as it is formed, written over acc where the plan allows. */
#include <math.h>
#include <omp.h>
#include <string.h>
#include "core/half.h"
#include "kern.h"
#include "norm_rows.h"

#define LN      TS_LANES /* interleaved partial sums of a row reduction */
#define LN_ROWS 128      /* rows per block of the dw/db reduction */
#define LN_COLS 256      /* columns per task of the dw/db reduction */

/* ---- inference --------------------------------------------------------- */

static int64_t rows_of(const ts_type *t) {
    int64_t r = 1;
    for (int i = 0; i + 1 < t->rank; i++) r *= t->dims[i];
    return r;
}

/* w or b: a [D] vector of x's dtype. */
static ts_status check_vec(const ts_type *v, const ts_type *x, const char *what) {
    int64_t d = x->dims[x->rank - 1];
    if (v->dtype != x->dtype)
        return ts_fail(TS_ERR_SHAPE, "%s must be %s like x, got %s", what, ts_dtype_name(x->dtype),
                       ts_dtype_name(v->dtype));
    if (v->rank != 1 || v->dims[0] != d)
        return ts_fail(TS_ERR_SHAPE, "%s must be [%lld] (the last dim of x)", what, (long long)d);
    return TS_OK;
}

/* has_w/has_b are 0 or 1 and the input count matches them. */
static ts_status check_flags(const ts_node *n, int want_in) {
    if ((n->a.norm.has_w != 0 && n->a.norm.has_w != 1) ||
        (n->a.norm.has_b != 0 && n->a.norm.has_b != 1))
        return ts_fail(TS_ERR_INVALID, "has_w/has_b must be 0 or 1");
    if (n->n_in != want_in)
        return ts_fail(TS_ERR_INVALID, "%d inputs do not match has_w=%d has_b=%d", n->n_in,
                       (int)n->a.norm.has_w, (int)n->a.norm.has_b);
    return TS_OK;
}

static ts_status infer_ln(const ts_graph *g, const ts_node *n, ts_type *out, int *n_out) {
    ts_status s = check_flags(n, 1 + (int)n->a.norm.has_w + (int)n->a.norm.has_b);
    if (s != TS_OK) return s;
    const ts_type *x = ts_in_type(g, n, 0);
    if (!ts_dtype_is_float(x->dtype))
        return ts_fail(TS_ERR_SHAPE, "x must be a float type, got %s", ts_dtype_name(x->dtype));
    if (x->rank < 1) return ts_fail(TS_ERR_SHAPE, "x must have at least one axis");
    double eps = n->a.norm.eps;
    if (!(eps >= 0) || isinf(eps))
        return ts_fail(TS_ERR_INVALID, "eps must be finite and >= 0, got %g", eps);
    int k = 1;
    if (n->a.norm.has_w && (s = check_vec(ts_in_type(g, n, k++), x, "weight")) != TS_OK) return s;
    if (n->a.norm.has_b && (s = check_vec(ts_in_type(g, n, k++), x, "bias")) != TS_OK) return s;
    if (n->a.norm.out_low && (n->a.norm.out_low != 1 || x->dtype != TS_F32))
        return ts_fail(TS_ERR_INVALID, "out_low (a bf16 y) is 1 on a layer_norm of f32 only");
    out[0] = *x;
    if (n->a.norm.out_low) out[0].dtype = TS_BF16;
    out[1] = (ts_type){.dtype = x->dtype, .rank = 1, .dims = {rows_of(x)}};
    out[2] = out[1];
    *n_out = 3;
    return TS_OK;
}

/* layer_norm_bwd's inputs from a0 on (a0 = 1: layer_norm_bwd_acc, acc first). */
static ts_status infer_bwd_from(const ts_graph *g, const ts_node *n, int a0, ts_type *out,
                                int *n_out) {
    ts_status s = check_flags(n, a0 + 4 + (int)n->a.norm.has_w);
    if (s != TS_OK) return s;
    const ts_type *dy = ts_in_type(g, n, a0), *x = ts_in_type(g, n, a0 + 1);
    if (!ts_dtype_is_float(x->dtype))
        return ts_fail(TS_ERR_SHAPE, "x must be a float type, got %s", ts_dtype_name(x->dtype));
    if (x->rank < 1) return ts_fail(TS_ERR_SHAPE, "x must have at least one axis");
    if (!ts_type_equal(dy, x)) return ts_fail(TS_ERR_SHAPE, "dy and x must have the same type");
    ts_type st = {.dtype = x->dtype, .rank = 1, .dims = {rows_of(x)}};
    if (!ts_type_equal(ts_in_type(g, n, a0 + 2), &st) ||
        !ts_type_equal(ts_in_type(g, n, a0 + 3), &st))
        return ts_fail(TS_ERR_SHAPE, "mean and rstd must be %s[%lld]", ts_dtype_name(x->dtype),
                       (long long)st.dims[0]);
    if (n->a.norm.has_w && (s = check_vec(ts_in_type(g, n, a0 + 4), x, "weight")) != TS_OK)
        return s;
    if (a0 && !ts_type_equal(ts_in_type(g, n, 0), x))
        return ts_fail(TS_ERR_SHAPE, "acc must have x's type");
    ts_type vec = {.dtype = x->dtype, .rank = 1, .dims = {x->dims[x->rank - 1]}};
    int k = 0;
    out[k++] = *x;
    if (n->a.norm.has_w) out[k++] = vec;
    if (n->a.norm.has_b) out[k++] = vec;
    *n_out = k;
    return TS_OK;
}

static ts_status infer_ln_bwd(const ts_graph *g, const ts_node *n, ts_type *out, int *n_out) {
    return infer_bwd_from(g, n, 0, out, n_out);
}
static ts_status infer_ln_bwd_acc(const ts_graph *g, const ts_node *n, ts_type *out, int *n_out) {
    return infer_bwd_from(g, n, 1, out, n_out);
}

/* ---- gradient ---------------------------------------------------------- */

static ts_status grad_ln(ts_graph *g, const ts_node *n, const ts_val *dy, ts_val *din) {
    /* mean and rstd exist for the backward op only; ts_layer_norm never
     * hands them out, so no gradient can flow into them. */
    if (ts_val_ok(dy[1]) || ts_val_ok(dy[2])) {
        ts_graph_fail(g, TS_ERR_UNSUPPORTED,
                      "layer_norm: gradients through the mean/rstd outputs are not supported");
        return ts_graph_status(g);
    }
    if (!ts_val_ok(dy[0])) return TS_OK;
    int has_w = n->a.norm.has_w != 0, has_b = n->a.norm.has_b != 0;
    ts_val in[5] = {dy[0], ts_mkval(n->in[0]), ts_mkval(n->out[1]), ts_mkval(n->out[2])};
    if (has_w) in[4] = ts_mkval(n->in[1]);
    ts_attrs at = ts_attrs_zero();
    at.norm.has_w = has_w;
    at.norm.has_b = has_b;
    ts_val outs[TS_MAX_OUT];
    if (!ts_val_ok(ts_node_add(g, TS_OP_LAYER_NORM_BWD, 4 + has_w, in, &at, outs)))
        return ts_graph_status(g);
    int k = 0;
    din[0] = outs[k++];
    if (has_w) din[1] = outs[k++];
    if (has_b) din[1 + has_w] = outs[k++];
    return ts_graph_status(g);
}

/* ---- kernels ----------------------------------------------------------- */

#define DEF_LN(T, SFX)                                                                             \
    /* mean and rstd of one row, accumulated in double. */                                         \
    static inline void ln_stats_##SFX(T *m_o, T *r_o, const T *x, int64_t d, double eps) {         \
        double acc[LN] = {0}, s = 0;                                                               \
        int64_t i = 0;                                                                             \
        for (; i + LN <= d; i += LN)                                                               \
            for (int j = 0; j < LN; j++) acc[j] += (double)x[i + j];                               \
        for (; i < d; i++) s += (double)x[i];                                                      \
        double mean = (s + ts_lanes_sum(acc)) / (double)d;                                         \
        for (int j = 0; j < LN; j++) acc[j] = 0;                                                   \
        s = 0;                                                                                     \
        for (i = 0; i + LN <= d; i += LN)                                                          \
            for (int j = 0; j < LN; j++) {                                                         \
                double c = (double)x[i + j] - mean;                                                \
                acc[j] += c * c;                                                                   \
            }                                                                                      \
        for (; i < d; i++) {                                                                       \
            double c = (double)x[i] - mean;                                                        \
            s += c * c;                                                                            \
        }                                                                                          \
        double rstd = 1.0 / sqrt((s + ts_lanes_sum(acc)) / (double)d + eps);                       \
        *m_o = (T)mean;                                                                            \
        *r_o = (T)rstd;                                                                            \
    }                                                                                              \
    /* y[0..n) of a row (or a piece of one) from its statistics; w, b may be NULL. */              \
    static inline void ln_out_##SFX(T *y, const T *x, const T *w, const T *b, T m, T r,            \
                                    int64_t n) {                                                   \
        if (w && b)                                                                                \
            for (int64_t i = 0; i < n; i++) y[i] = (x[i] - m) * r * w[i] + b[i];                   \
        else if (w)                                                                                \
            for (int64_t i = 0; i < n; i++) y[i] = (x[i] - m) * r * w[i];                          \
        else if (b)                                                                                \
            for (int64_t i = 0; i < n; i++) y[i] = (x[i] - m) * r + b[i];                          \
        else                                                                                       \
            for (int64_t i = 0; i < n; i++) y[i] = (x[i] - m) * r;                                 \
    }                                                                                              \
    /* One row: y, mean, rstd from x (w, b may be NULL). */                                        \
    TS_CLONES static void ln_row_##SFX(T *y, T *mean_o, T *rstd_o, const T *x, const T *w,         \
                                       const T *b, int64_t d, double eps) {                        \
        T m, r;                                                                                    \
        ln_stats_##SFX(&m, &r, x, d, eps);                                                         \
        *mean_o = m;                                                                               \
        *rstd_o = r;                                                                               \
        ln_out_##SFX(y, x, w, b, m, r, d);                                                         \
    }                                                                                              \
    static ts_status ln_##SFX(const ts_kargs *k) {                                                 \
        const ts_tensor *xt = &k->in[0];                                                           \
        int has_w = k->a->norm.has_w != 0, has_b = k->a->norm.has_b != 0;                          \
        const T *x = xt->data, *w = has_w ? k->in[1].data : NULL;                                  \
        const T *b = has_b ? k->in[1 + has_w].data : NULL;                                         \
        T *y = k->out[0].data, *mean = k->out[1].data, *rstd = k->out[2].data;                     \
        int64_t rows = ts_rows(xt), d = ts_inner(xt);                                              \
        double eps = k->a->norm.eps;                                                               \
        _Pragma(                                                                                   \
            "omp parallel for schedule(static) if (rows * d >= TS_PAR_MIN)") for (int64_t r = 0;   \
                                                                                  r < rows; r++)   \
            ln_row_##SFX(y + r * d, mean + r, rstd + r, x + r * d, w, b, d, eps);                  \
        return TS_OK;                                                                              \
    }                                                                                              \
    /* dx of one row: g = dy * w, xh = (x - mean) * rstd,                                          \
     * dx = rstd * (g - mean(g) - xh * mean(g * xh)). With acc (NULL for none; may be dx           \
     * itself: in place), acc + that: the row of acc is copied into dx first and the sum           \
     * formed there, the bits of add(acc, dx) (IEEE a + b == b + a). */                            \
    TS_CLONES static void ln_dx_row_##SFX(T *dx, const T *acc, const T *dy, const T *x,            \
                                          const T *w, T m, T r, int64_t d) {                       \
        double a1[LN] = {0}, a2[LN] = {0}, s1 = 0, s2 = 0;                                         \
        int64_t i = 0;                                                                             \
        if (acc && acc != dx) memcpy(dx, acc, sizeof(T) * (size_t)d);                              \
        for (; i + LN <= d; i += LN)                                                               \
            for (int j = 0; j < LN; j++) {                                                         \
                T gv = w ? dy[i + j] * w[i + j] : dy[i + j];                                       \
                T xh = (x[i + j] - m) * r;                                                         \
                a1[j] += (double)gv;                                                               \
                a2[j] += (double)(gv * xh);                                                        \
            }                                                                                      \
        for (; i < d; i++) {                                                                       \
            T gv = w ? dy[i] * w[i] : dy[i];                                                       \
            T xh = (x[i] - m) * r;                                                                 \
            s1 += (double)gv;                                                                      \
            s2 += (double)(gv * xh);                                                               \
        }                                                                                          \
        T mg = (T)((s1 + ts_lanes_sum(a1)) / (double)d),                                           \
          mgx = (T)((s2 + ts_lanes_sum(a2)) / (double)d);                                          \
        for (i = 0; i < d; i++) {                                                                  \
            T gv = w ? dy[i] * w[i] : dy[i];                                                       \
            T xh = (x[i] - m) * r;                                                                 \
            T v = r * (gv - mg - xh * mgx);                                                        \
            dx[i] = acc ? dx[i] + v : v;                                                           \
        }                                                                                          \
    }                                                                                              \
    /* Partial dw (dy * xh) and db (dy) of rows [r0, r1) for columns [c0, c0 + len). */            \
    TS_CLONES static void ln_dwdb_##SFX(double *pw, double *pb, const T *dy, const T *x,           \
                                        const T *mean, const T *rstd, int64_t r0, int64_t r1,      \
                                        int64_t c0, int64_t len, int64_t d) {                      \
        double aw[LN_COLS], ab[LN_COLS];                                                           \
        for (int64_t c = 0; c < len; c++) aw[c] = ab[c] = 0;                                       \
        for (int64_t r = r0; r < r1; r++) {                                                        \
            const T *dyr = dy + r * d + c0, *xr = x + r * d + c0;                                  \
            T m = mean[r], rs = rstd[r];                                                           \
            for (int64_t c = 0; c < len; c++) {                                                    \
                aw[c] += (double)(dyr[c] * ((xr[c] - m) * rs));                                    \
                ab[c] += (double)dyr[c];                                                           \
            }                                                                                      \
        }                                                                                          \
        if (pw)                                                                                    \
            for (int64_t c = 0; c < len; c++) pw[c] = aw[c];                                       \
        if (pb)                                                                                    \
            for (int64_t c = 0; c < len; c++) pb[c] = ab[c];                                       \
    }                                                                                              \
    /* dx of rows [r0, r1), then the block's partials of dw and db for all its columns, while      \
     * the block's dy and x are still in cache (one pass over them instead of two). */             \
    static void ln_block_##SFX(T *dx, double *pw, double *pb, const T *acc, const T *dy,           \
                               const T *x, const T *w, const T *mean, const T *rstd, int64_t r0,   \
                               int64_t r1, int64_t d) {                                            \
        for (int64_t r = r0; r < r1; r++)                                                          \
            ln_dx_row_##SFX(dx + r * d, acc ? acc + r * d : NULL, dy + r * d, x + r * d, w,        \
                            mean[r], rstd[r], d);                                                  \
        for (int64_t c0 = 0; c0 < d; c0 += LN_COLS)                                                \
            ln_dwdb_##SFX(pw ? pw + c0 : NULL, pb ? pb + c0 : NULL, dy, x, mean, rstd, r0, r1, c0, \
                          d - c0 < LN_COLS ? d - c0 : LN_COLS, d);                                 \
    }                                                                                              \
    /* dw and db (either may be NULL) of all rows, through the partials in scratch; with dx,       \
     * also dx (of w, plus acc where not NULL), a block of rows at a time (ln_block: the same      \
     * partials, the same bits). */                                                                \
    static ts_status ln_dwdb_all_##SFX(T *dw, T *db, const T *dy, const T *x, const T *mean,       \
                                       const T *rstd, int64_t rows, int64_t d, void *scratch,      \
                                       size_t scratch_bytes, const char *label, T *dx, const T *w, \
                                       const T *acc) {                                             \
        if (!dw && !db) return TS_OK;                                                              \
        int64_t nrb = (rows + LN_ROWS - 1) / LN_ROWS, ncb = (d + LN_COLS - 1) / LN_COLS;           \
        size_t need = (size_t)(nrb * d * 2) * sizeof(double);                                      \
        if (need > scratch_bytes)                                                                  \
            return ts_fail(TS_ERR_INTERNAL, "layer_norm_bwd '%s': scratch too small", label);      \
        double *pw = scratch, *pb = pw + nrb * d;                                                  \
        if (dx) {                                                                                  \
            _Pragma(                                                                               \
                "omp parallel for schedule(static) if (rows * d >= TS_PAR_MIN)") for (int64_t rb = \
                                                                                          0;       \
                                                                                      rb < nrb;    \
                                                                                      rb++) {      \
                int64_t r0 = rb * LN_ROWS, r1 = r0 + LN_ROWS < rows ? r0 + LN_ROWS : rows;         \
                ln_block_##SFX(dx, dw ? pw + rb *d : NULL, db ? pb + rb *d : NULL, acc, dy, x, w,  \
                               mean, rstd, r0, r1, d);                                             \
            }                                                                                      \
        } else {                                                                                   \
            _Pragma(                                                                               \
                "omp parallel for schedule(static) if (rows * d >= TS_PAR_MIN)") for (int64_t t =  \
                                                                                          0;       \
                                                                                      t <          \
                                                                                      nrb * ncb;   \
                                                                                      t++) {       \
                int64_t rb = t / ncb, c0 = (t % ncb) * LN_COLS;                                    \
                int64_t r0 = rb * LN_ROWS, r1 = r0 + LN_ROWS < rows ? r0 + LN_ROWS : rows;         \
                int64_t len = d - c0 < LN_COLS ? d - c0 : LN_COLS;                                 \
                ln_dwdb_##SFX(dw ? pw + rb *d + c0 : NULL, db ? pb + rb *d + c0 : NULL, dy, x,     \
                              mean, rstd, r0, r1, c0, len, d);                                     \
            }                                                                                      \
        }                                                                                          \
        _Pragma("omp parallel for schedule(static) if (nrb * d >= TS_PAR_MIN)") for (int64_t c =   \
                                                                                         0;        \
                                                                                     c < d; c++) { \
            double sw = 0, sb = 0;                                                                 \
            if (dw)                                                                                \
                for (int64_t rb = 0; rb < nrb; rb++) sw += pw[rb * d + c];                         \
            if (db)                                                                                \
                for (int64_t rb = 0; rb < nrb; rb++) sb += pb[rb * d + c];                         \
            if (dw) dw[c] = (T)sw;                                                                 \
            if (db) db[c] = (T)sb;                                                                 \
        }                                                                                          \
        return TS_OK;                                                                              \
    }                                                                                              \
    /* layer_norm_bwd (a0 = 0) and layer_norm_bwd_acc (a0 = 1: acc is input 0, the others one      \
     * later). */                                                                                  \
    static ts_status ln_bwd_##SFX(const ts_kargs *k, int a0) {                                     \
        const ts_tensor *xt = &k->in[a0 + 1];                                                      \
        int has_w = k->a->norm.has_w != 0, has_b = k->a->norm.has_b != 0;                          \
        const T *dy = k->in[a0].data, *x = xt->data, *mean = k->in[a0 + 2].data;                   \
        const T *rstd = k->in[a0 + 3].data, *w = has_w ? k->in[a0 + 4].data : NULL;                \
        const T *acc = a0 ? k->in[0].data : NULL;                                                  \
        T *dx = k->out[0].data;                                                                    \
        T *dw = has_w ? k->out[1].data : NULL, *db = has_b ? k->out[1 + has_w].data : NULL;        \
        int64_t rows = ts_rows(xt), d = ts_inner(xt);                                              \
        /* dx inside the dw/db blocks when there are blocks enough for the threads */              \
        if ((dw || db) && (rows + LN_ROWS - 1) / LN_ROWS >= omp_get_max_threads())                 \
            return ln_dwdb_all_##SFX(dw, db, dy, x, mean, rstd, rows, d, k->scratch,               \
                                     k->scratch_bytes, k->label, dx, w, acc);                      \
        _Pragma(                                                                                   \
            "omp parallel for schedule(static) if (rows * d >= TS_PAR_MIN)") for (int64_t r = 0;   \
                                                                                  r < rows; r++)   \
            ln_dx_row_##SFX(dx + r * d, acc ? acc + r * d : NULL, dy + r * d, x + r * d, w,        \
                            mean[r], rstd[r], d);                                                  \
        return ln_dwdb_all_##SFX(dw, db, dy, x, mean, rstd, rows, d, k->scratch, k->scratch_bytes, \
                                 k->label, NULL, NULL, NULL);                                      \
    }                                                                                              \
    static ts_status ln_bwd_plain_##SFX(const ts_kargs *k) {                                       \
        return ln_bwd_##SFX(k, 0);                                                                 \
    }                                                                                              \
    static ts_status ln_bwd_acc_##SFX(const ts_kargs *k) {                                         \
        return ln_bwd_##SFX(k, 1);                                                                 \
    }

DEF_LN(float, f32)
DEF_LN(double, f64)

/* layer_norm writing bf16 (norm.out_low): each row's statistics and its y
 * as ln_row_f32 computes them, in pieces of LN_LOW on the stack, then
 * rounded to nearest even: the bits of the f32 kernel plus a cast. */
#define LN_LOW 512
TS_CLONES static void ln_row_low(uint16_t *y, float *mean_o, float *rstd_o, const float *x,
                                 const float *w, const float *b, int64_t d, double eps) {
    float m, r, buf[LN_LOW];
    ln_stats_f32(&m, &r, x, d, eps);
    *mean_o = m;
    *rstd_o = r;
    for (int64_t c0 = 0; c0 < d; c0 += LN_LOW) {
        const int64_t len = d - c0 < LN_LOW ? d - c0 : LN_LOW;
        ln_out_f32(buf, x + c0, w ? w + c0 : NULL, b ? b + c0 : NULL, m, r, len);
        ts_f32_to_bf16_n(y + c0, buf, len); /* core/half.c: 64 bytes wide, the same rounding */
    }
}

static ts_status ln_low(const ts_kargs *k) {
    const ts_tensor *xt = &k->in[0];
    if (xt->dtype != TS_F32 || k->out[0].dtype != TS_BF16)
        return ts_kernel_bad_dtype(k, "layer_norm", k->out[0].dtype);
    int has_w = k->a->norm.has_w != 0, has_b = k->a->norm.has_b != 0;
    const float *x = xt->data, *w = has_w ? k->in[1].data : NULL;
    const float *b = has_b ? k->in[1 + has_w].data : NULL;
    uint16_t *y = k->out[0].data;
    float *mean = k->out[1].data, *rstd = k->out[2].data;
    int64_t rows = ts_rows(xt), d = ts_inner(xt);
    double eps = k->a->norm.eps;
#pragma omp parallel for schedule(static) if (rows * d >= TS_PAR_MIN)
    for (int64_t r = 0; r < rows; r++)
        ln_row_low(y + r * d, mean + r, rstd + r, x + r * d, w, b, d, eps);
    return TS_OK;
}

/* The f32 pieces, for the fused activation + layer norm ops (norm_act.c):
 * the very functions layer_norm and layer_norm_bwd run, so the fused ops
 * give the same bits. */
void ts_ln_row_f32(float *y, float *mean, float *rstd, const float *x, const float *w,
                   const float *b, int64_t d, double eps) {
    ln_row_f32(y, mean, rstd, x, w, b, d, eps);
}
void ts_ln_dx_row_f32(float *dx, const float *dy, const float *x, const float *w, float mean,
                      float rstd, int64_t d) {
    ln_dx_row_f32(dx, NULL, dy, x, w, mean, rstd, d);
}
ts_status ts_ln_dwdb_f32(float *dw, float *db, const float *dy, const float *x, const float *mean,
                         const float *rstd, int64_t rows, int64_t d, void *scratch,
                         size_t scratch_bytes, const char *label) {
    return ln_dwdb_all_f32(dw, db, dy, x, mean, rstd, rows, d, scratch, scratch_bytes, label, NULL,
                           NULL, NULL);
}
size_t ts_ln_dwdb_scratch(int64_t rows, int64_t d) {
    return (size_t)(((rows + LN_ROWS - 1) / LN_ROWS) * d * 2) * sizeof(double);
}

static ts_status k_ln(const ts_kargs *k) {
    if (k->a->norm.out_low) return ln_low(k);
    TS_FLOAT_DISPATCH(k, k->in[0].dtype, "layer_norm", ln_f32, ln_f64);
}

static ts_status k_ln_bwd(const ts_kargs *k) {
    TS_FLOAT_DISPATCH(k, k->in[1].dtype, "layer_norm_bwd", ln_bwd_plain_f32, ln_bwd_plain_f64);
}
static ts_status k_ln_bwd_acc(const ts_kargs *k) {
    TS_FLOAT_DISPATCH(k, k->in[2].dtype, "layer_norm_bwd_acc", ln_bwd_acc_f32, ln_bwd_acc_f64);
}

/* Partials of dw and db: one row of D doubles each per block of LN_ROWS rows. */
static size_t scratch_ln_bwd(const ts_graph *g, const ts_node *n) {
    if (!n->a.norm.has_w && !n->a.norm.has_b) return 0;
    const ts_type *x = ts_in_type(g, n, n->op == TS_OP_LAYER_NORM_BWD_ACC ? 2 : 1);
    return ts_ln_dwdb_scratch(rows_of(x), x->dims[x->rank - 1]);
}

static double cost_ln(const ts_graph *g, const ts_node *n) {
    return 8.0 * (double)ts_type_numel(ts_in_type(g, n, 0));
}
static double cost_ln_bwd(const ts_graph *g, const ts_node *n) {
    return 14.0 * (double)ts_type_numel(ts_in_type(g, n, 0));
}
/* layer_norm_bwd's and the add's */
static double cost_ln_bwd_acc(const ts_graph *g, const ts_node *n) {
    return 15.0 * (double)ts_type_numel(ts_in_type(g, n, 0));
}

const ts_op_def ts_def_layer_norm = {.name = "layer_norm",
                                     .min_in = 1,
                                     .max_in = 3,
                                     .infer = infer_ln,
                                     .grad = grad_ln,
                                     .kernel = k_ln,
                                     .cost = cost_ln};

const ts_op_def ts_def_layer_norm_bwd = {.name = "layer_norm_bwd",
                                         .min_in = 4,
                                         .max_in = 5,
                                         .infer = infer_ln_bwd,
                                         .kernel = k_ln_bwd,
                                         .scratch = scratch_ln_bwd,
                                         .cost = cost_ln_bwd};

/* layer_norm_bwd_acc (acc, dy, x, mean, rstd[, w]) -> (acc + dx[, dw][, db]): layer_norm_bwd
 * with its input gradient added to acc (dx written over acc where the plan allows), as the
 * fusion pass builds it from add(acc, layer_norm_bwd(...)) (passes/fuse_norm.c): the residual
 * stream's gradient of a pre-norm transformer, without the temporary dx and the add's pass. */
const ts_op_def ts_def_layer_norm_bwd_acc = {.name = "layer_norm_bwd_acc",
                                             .min_in = 5,
                                             .max_in = 6,
                                             .flags = TS_OPF_INPLACE, /* acc + dx over acc */
                                             .infer = infer_ln_bwd_acc,
                                             .kernel = k_ln_bwd_acc,
                                             .scratch = scratch_ln_bwd,
                                             .cost = cost_ln_bwd_acc};

/* ---- builder ----------------------------------------------------------- */

ts_val ts_layer_norm(ts_graph *g, ts_val x, ts_val weight, ts_val bias, double eps) {
    /* TS_NONE for weight/bias means "absent": with a sticky error pending
     * we return before it could be mistaken for that. */
    if (!g || g->status != TS_OK || !ts_val_ok(x)) return TS_NONE;
    ts_val in[3] = {x};
    int n = 1;
    ts_attrs at = ts_attrs_zero();
    at.norm.has_w = ts_val_ok(weight);
    at.norm.has_b = ts_val_ok(bias);
    at.norm.eps = eps;
    if (ts_val_ok(weight)) in[n++] = weight;
    if (ts_val_ok(bias)) in[n++] = bias;
    return ts_node_add(g, TS_OP_LAYER_NORM, n, in, &at, NULL);
}
