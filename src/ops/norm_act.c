/* An activation and the layer norm that reads it, as one op each way; built
 * by the fusion pass (passes/fuse.c) after autodiff, f32 only, never by
 * users.
 *
 * act_layer_norm (x[, w][, b]) -> (h, y, mean, rstd): per row of D
 * elements, h = act(x) (in place on x when the plan allows: the relu of a
 * GEMM output), then y, mean, rstd = layer_norm(h) while the row is still
 * in L1. The unfused plan reads the GEMM output once for the activation and
 * again (from L2 or memory) for the norm; here each row is read once from
 * beyond L1. h stays an output: the backward reads it.
 *
 * layer_norm_act_bwd (dy, h, mean, rstd[, w], s) -> (dx[, dw][, db]): per
 * row, the layer norm's input gradient, then act's backward on it (from
 * s, act's input or output as a.norm_act.side says) while the row is in
 * L1; dw and db as layer_norm_bwd's. The unfused plan writes the norm's
 * input gradient and reads it back with s for the activation's backward.
 *
 * Bits: the same as the unfused ops. Each row runs the functions the
 * unfused kernels run (ops/norm_rows.h, ops/eltwise.h) on the same values;
 * the activation's chunk function is elementwise, so cutting its input by
 * rows instead of fixed chunks changes nothing. Rows are independent and
 * dw/db keep layer_norm_bwd's fixed block order, so the results do not
 * depend on the thread count. */
#include <math.h>
#include "eltwise.h"
#include "kern.h"
#include "norm_rows.h"

/* ---- inference --------------------------------------------------------- */

static int64_t rows_of(const ts_type *t) {
    int64_t r = 1;
    for (int i = 0; i + 1 < t->rank; i++) r *= t->dims[i];
    return r;
}

/* act's input and output are x's type f32 and it has an f32 chunk function. */
static ts_status check_act(const ts_attrs *a) {
    ts_attrs fa = ts_attrs_zero();
    fa.unary = a->norm_act.fwd;
    if (!ts_unary_chunk_f32((int)a->norm_act.act, &fa))
        return ts_fail(TS_ERR_INVALID, "act %lld is not a unary elementwise op",
                       (long long)a->norm_act.act);
    return TS_OK;
}

static ts_status check_x(const ts_type *x) {
    if (x->dtype != TS_F32)
        return ts_fail(TS_ERR_SHAPE, "x must be f32, got %s", ts_dtype_name(x->dtype));
    if (x->rank < 1) return ts_fail(TS_ERR_SHAPE, "x must have at least one axis");
    return TS_OK;
}

/* w or b: a [D] f32 vector. */
static ts_status check_vec(const ts_type *v, const ts_type *x, const char *what) {
    int64_t d = x->dims[x->rank - 1];
    if (v->dtype != TS_F32 || v->rank != 1 || v->dims[0] != d)
        return ts_fail(TS_ERR_SHAPE, "%s must be f32[%lld] (the last dim of x)", what,
                       (long long)d);
    return TS_OK;
}

static ts_status check_flags(const ts_node *n, int want_in) {
    const ts_norm_attrs *na = &n->a.norm_act.norm;
    if ((na->has_w != 0 && na->has_w != 1) || (na->has_b != 0 && na->has_b != 1))
        return ts_fail(TS_ERR_INVALID, "has_w/has_b must be 0 or 1");
    if (n->n_in != want_in)
        return ts_fail(TS_ERR_INVALID, "%d inputs do not match has_w=%d has_b=%d", n->n_in,
                       (int)na->has_w, (int)na->has_b);
    return TS_OK;
}

static ts_status infer_act_ln(const ts_graph *g, const ts_node *n, ts_type *out, int *n_out) {
    const ts_norm_attrs *na = &n->a.norm_act.norm;
    ts_status s = check_flags(n, 1 + (int)na->has_w + (int)na->has_b);
    if (s != TS_OK || (s = check_act(&n->a)) != TS_OK) return s;
    const ts_type *x = ts_in_type(g, n, 0);
    if ((s = check_x(x)) != TS_OK) return s;
    if (!(na->eps >= 0) || isinf(na->eps))
        return ts_fail(TS_ERR_INVALID, "eps must be finite and >= 0, got %g", na->eps);
    int k = 1;
    if (na->has_w && (s = check_vec(ts_in_type(g, n, k++), x, "weight")) != TS_OK) return s;
    if (na->has_b && (s = check_vec(ts_in_type(g, n, k++), x, "bias")) != TS_OK) return s;
    out[0] = *x;
    out[1] = *x;
    out[2] = (ts_type){.dtype = TS_F32, .rank = 1, .dims = {rows_of(x)}};
    out[3] = out[2];
    *n_out = 4;
    return TS_OK;
}

/* The unary_bwd attributes of the activation's backward. */
static ts_attrs bwd_attrs(const ts_attrs *a) {
    ts_attrs b = ts_attrs_zero();
    b.unary_bwd.fwd_op = a->norm_act.act;
    b.unary_bwd.side = a->norm_act.side;
    b.unary_bwd.fwd = a->norm_act.fwd;
    return b;
}

static ts_status infer_ln_act_bwd(const ts_graph *g, const ts_node *n, ts_type *out, int *n_out) {
    const ts_norm_attrs *na = &n->a.norm_act.norm;
    int has_w = na->has_w != 0;
    ts_status s = check_flags(n, 5 + has_w);
    if (s != TS_OK) return s;
    ts_attrs ba = bwd_attrs(&n->a), fwd;
    if (!ts_unary_bwd_chunk_f32(&ba, &fwd) || (n->a.norm_act.side != 0 && n->a.norm_act.side != 1))
        return ts_fail(TS_ERR_INVALID, "act %lld side %lld has no backward rule",
                       (long long)n->a.norm_act.act, (long long)n->a.norm_act.side);
    const ts_type *dy = ts_in_type(g, n, 0), *x = ts_in_type(g, n, 1);
    if ((s = check_x(x)) != TS_OK) return s;
    if (!ts_type_equal(dy, x)) return ts_fail(TS_ERR_SHAPE, "dy and h must have the same type");
    if (!ts_type_equal(ts_in_type(g, n, 4 + has_w), x))
        return ts_fail(TS_ERR_SHAPE, "s (act's saved operand) must have h's type");
    ts_type st = {.dtype = TS_F32, .rank = 1, .dims = {rows_of(x)}};
    if (!ts_type_equal(ts_in_type(g, n, 2), &st) || !ts_type_equal(ts_in_type(g, n, 3), &st))
        return ts_fail(TS_ERR_SHAPE, "mean and rstd must be f32[%lld]", (long long)st.dims[0]);
    if (has_w && (s = check_vec(ts_in_type(g, n, 4), x, "weight")) != TS_OK) return s;
    ts_type vec = {.dtype = TS_F32, .rank = 1, .dims = {x->dims[x->rank - 1]}};
    int k = 0;
    out[k++] = *x;
    if (has_w) out[k++] = vec;
    if (na->has_b) out[k++] = vec;
    *n_out = k;
    return TS_OK;
}

/* ---- kernels ----------------------------------------------------------- */

static ts_status k_act_ln(const ts_kargs *k) {
    if (k->in[0].dtype != TS_F32) return ts_kernel_bad_dtype(k, "act_layer_norm", k->in[0].dtype);
    const ts_norm_attrs *na = &k->a->norm_act.norm;
    ts_attrs fa = ts_attrs_zero();
    fa.unary = k->a->norm_act.fwd;
    ts_unary_chunk_fn act = ts_unary_chunk_f32((int)k->a->norm_act.act, &fa);
    if (!act)
        return ts_fail(TS_ERR_INTERNAL, "act_layer_norm '%s': no kernel for act %lld",
                       k->label ? k->label : "?", (long long)k->a->norm_act.act);
    int has_w = na->has_w != 0, has_b = na->has_b != 0;
    const float *x = k->in[0].data, *w = has_w ? k->in[1].data : NULL;
    const float *b = has_b ? k->in[1 + has_w].data : NULL;
    float *h = k->out[0].data, *y = k->out[1].data, *mean = k->out[2].data;
    float *rstd = k->out[3].data;
    int64_t rows = ts_rows(&k->in[0]), d = ts_inner(&k->in[0]);
    double eps = na->eps;
#pragma omp parallel for schedule(static) if (rows * d >= TS_PAR_MIN)
    for (int64_t r = 0; r < rows; r++) {
        act(h + r * d, x + r * d, d, &fa);
        ts_ln_row_f32(y + r * d, mean + r, rstd + r, h + r * d, w, b, d, eps);
    }
    return TS_OK;
}

static ts_status k_ln_act_bwd(const ts_kargs *k) {
    if (k->in[1].dtype != TS_F32)
        return ts_kernel_bad_dtype(k, "layer_norm_act_bwd", k->in[1].dtype);
    const ts_norm_attrs *na = &k->a->norm_act.norm;
    ts_attrs ba = bwd_attrs(k->a), fa;
    ts_unary_bwd_chunk_fn act_bwd = ts_unary_bwd_chunk_f32(&ba, &fa);
    if (!act_bwd)
        return ts_fail(TS_ERR_INTERNAL, "layer_norm_act_bwd '%s': no rule for act %lld",
                       k->label ? k->label : "?", (long long)k->a->norm_act.act);
    int has_w = na->has_w != 0, has_b = na->has_b != 0;
    const float *dy = k->in[0].data, *x = k->in[1].data, *mean = k->in[2].data;
    const float *rstd = k->in[3].data, *w = has_w ? k->in[4].data : NULL;
    const float *s = k->in[4 + has_w].data;
    float *dx = k->out[0].data;
    float *dw = has_w ? k->out[1].data : NULL, *db = has_b ? k->out[1 + has_w].data : NULL;
    int64_t rows = ts_rows(&k->in[1]), d = ts_inner(&k->in[1]);
#pragma omp parallel for schedule(static) if (rows * d >= TS_PAR_MIN)
    for (int64_t r = 0; r < rows; r++) {
        float *dxr = dx + r * d;
        ts_ln_dx_row_f32(dxr, dy + r * d, x + r * d, w, mean[r], rstd[r], d);
        act_bwd(dxr, dxr, s + r * d, d, &fa);
    }
    return ts_ln_dwdb_f32(dw, db, dy, x, mean, rstd, rows, d, k->scratch, k->scratch_bytes,
                          k->label ? k->label : "?");
}

static size_t scratch_ln_act_bwd(const ts_graph *g, const ts_node *n) {
    if (!n->a.norm_act.norm.has_w && !n->a.norm_act.norm.has_b) return 0;
    const ts_type *x = ts_in_type(g, n, 1);
    return ts_ln_dwdb_scratch(rows_of(x), x->dims[x->rank - 1]);
}

/* As the unfused pair counts them: the activation (or its backward) one
 * FLOP per element, layer_norm 8, layer_norm_bwd 14. */
static double cost_act_ln(const ts_graph *g, const ts_node *n) {
    return 9.0 * (double)ts_type_numel(ts_in_type(g, n, 0));
}
static double cost_ln_act_bwd(const ts_graph *g, const ts_node *n) {
    return 15.0 * (double)ts_type_numel(ts_in_type(g, n, 0));
}

const ts_op_def ts_def_act_layer_norm = {.name = "act_layer_norm",
                                         .min_in = 1,
                                         .max_in = 3,
                                         .flags = TS_OPF_INPLACE, /* h over x */
                                         .infer = infer_act_ln,
                                         .kernel = k_act_ln,
                                         .cost = cost_act_ln};

const ts_op_def ts_def_layer_norm_act_bwd = {.name = "layer_norm_act_bwd",
                                             .min_in = 5,
                                             .max_in = 6,
                                             .infer = infer_ln_act_bwd,
                                             .kernel = k_ln_act_bwd,
                                             .scratch = scratch_ln_act_bwd,
                                             .cost = cost_ln_act_bwd};
