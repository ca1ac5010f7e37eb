/* Binary elementwise ops with NumPy broadcasting: add, sub, mul, div,
 * maximum, minimum (+ their backward helper) and where. */
#include <string.h>
#include "eltwise.h"
#include "kern.h"

/* ---- inference --------------------------------------------------------- */

static ts_status infer_binary(const ts_graph *g, const ts_node *n, ts_type *out, int *n_out) {
    const ts_type *a = ts_in_type(g, n, 0), *b = ts_in_type(g, n, 1);
    if (a->dtype != b->dtype)
        return ts_fail(TS_ERR_SHAPE, "dtypes differ (%s vs %s)", ts_dtype_name(a->dtype),
                       ts_dtype_name(b->dtype));
    out->dtype = a->dtype;
    *n_out = 1;
    return ts_broadcast_shapes(a, b, out);
}

static ts_status infer_where(const ts_graph *g, const ts_node *n, ts_type *out, int *n_out) {
    const ts_type *c = ts_in_type(g, n, 0), *a = ts_in_type(g, n, 1), *b = ts_in_type(g, n, 2);
    if (c->dtype != TS_U8)
        return ts_fail(TS_ERR_SHAPE, "condition must be u8, got %s", ts_dtype_name(c->dtype));
    if (a->dtype != b->dtype)
        return ts_fail(TS_ERR_SHAPE, "dtypes differ (%s vs %s)", ts_dtype_name(a->dtype),
                       ts_dtype_name(b->dtype));
    ts_type ab;
    ts_status s = ts_broadcast_shapes(a, b, &ab);
    if (s != TS_OK) return s;
    if ((s = ts_broadcast_shapes(c, &ab, out)) != TS_OK) return s;
    out->dtype = a->dtype;
    *n_out = 1;
    return TS_OK;
}

static ts_status infer_maxmin_bwd(const ts_graph *g, const ts_node *n, ts_type *out, int *n_out) {
    ts_status s = infer_binary(g, &(ts_node){.in = n->in + 1, .n_in = 2}, out, n_out);
    if (s != TS_OK) return s;
    if (!ts_type_equal(out, ts_in_type(g, n, 0)))
        return ts_fail(TS_ERR_SHAPE, "gradient shape does not match the broadcast shape");
    return TS_OK;
}

/* ---- gradients --------------------------------------------------------- */

static ts_status grad_add(ts_graph *g, const ts_node *n, const ts_val *dy, ts_val *din) {
    din[0] = ts_sum_to(g, dy[0], ts_mkval(n->in[0]));
    din[1] = ts_sum_to(g, dy[0], ts_mkval(n->in[1]));
    return ts_graph_status(g);
}

static ts_status grad_sub(ts_graph *g, const ts_node *n, const ts_val *dy, ts_val *din) {
    din[0] = ts_sum_to(g, dy[0], ts_mkval(n->in[0]));
    din[1] = ts_sum_to(g, ts_neg(g, dy[0]), ts_mkval(n->in[1]));
    return ts_graph_status(g);
}

static ts_status grad_mul(ts_graph *g, const ts_node *n, const ts_val *dy, ts_val *din) {
    ts_val a = ts_mkval(n->in[0]), b = ts_mkval(n->in[1]);
    din[0] = ts_sum_to(g, ts_mul(g, dy[0], b), ts_mkval(n->in[0]));
    din[1] = ts_sum_to(g, ts_mul(g, dy[0], a), ts_mkval(n->in[1]));
    return ts_graph_status(g);
}

static ts_status grad_div(ts_graph *g, const ts_node *n, const ts_val *dy, ts_val *din) {
    /* d(a/b)/da = 1/b; d(a/b)/db = -(a/b)/b */
    ts_val b = ts_mkval(n->in[1]), y = ts_mkval(n->out[0]);
    ts_val da = ts_div(g, dy[0], b);
    din[0] = ts_sum_to(g, da, ts_mkval(n->in[0]));
    din[1] = ts_sum_to(g, ts_neg(g, ts_mul(g, da, y)), ts_mkval(n->in[1]));
    return ts_graph_status(g);
}

static ts_status grad_maxmin(ts_graph *g, const ts_node *n, const ts_val *dy, ts_val *din) {
    ts_val in[3] = {dy[0], ts_mkval(n->in[0]), ts_mkval(n->in[1])};
    for (int side = 0; side < 2; side++) {
        ts_attrs a = ts_attrs_zero();
        a.maxmin.min = n->op == TS_OP_MINIMUM;
        a.maxmin.side = side;
        ts_val d = ts_node_add(g, TS_OP_MAXMIN_BWD, 3, in, &a, NULL);
        din[side] = ts_sum_to(g, d, ts_mkval(n->in[side]));
    }
    return ts_graph_status(g);
}

static ts_status grad_where(ts_graph *g, const ts_node *n, const ts_val *dy, ts_val *din) {
    ts_val c = ts_mkval(n->in[0]);
    ts_val zero = ts_scalar(g, 0, ts_dtype_of(g, dy[0]));
    din[1] = ts_sum_to(g, ts_where(g, c, dy[0], zero), ts_mkval(n->in[1]));
    din[2] = ts_sum_to(g, ts_where(g, c, zero, dy[0]), ts_mkval(n->in[2]));
    return ts_graph_status(g);
}

/* ---- kernels ----------------------------------------------------------- */

/* One output row: o[i] = f(a[i*sa], b[i*sb]) with sa, sb in {0, 1}. */
typedef void (*row2_fn)(void *o, const void *a, const void *b, int64_t n, int64_t sa, int64_t sb);
/* One output row of a ternary op. */
typedef void (*row3_fn)(void *o, const void *c, const void *a, const void *b, int64_t n, int64_t sc,
                        int64_t sa, int64_t sb);

#define DEF_ROW2(name, T, expr)                                                                    \
    TS_CLONES static void name(void *o_, const void *a_, const void *b_, int64_t n, int64_t sa,    \
                               int64_t sb) {                                                       \
        T *o = o_;                                                                                 \
        const T *a = a_, *b = b_;                                                                  \
        if (sa && sb) {                                                                            \
            for (int64_t i = 0; i < n; i++) {                                                      \
                T x = a[i], y = b[i];                                                              \
                o[i] = (expr);                                                                     \
            }                                                                                      \
        } else if (sa) {                                                                           \
            T y = b[0];                                                                            \
            for (int64_t i = 0; i < n; i++) {                                                      \
                T x = a[i];                                                                        \
                o[i] = (expr);                                                                     \
            }                                                                                      \
        } else if (sb) {                                                                           \
            T x = a[0];                                                                            \
            for (int64_t i = 0; i < n; i++) {                                                      \
                T y = b[i];                                                                        \
                o[i] = (expr);                                                                     \
            }                                                                                      \
        } else {                                                                                   \
            T x = a[0], y = b[0];                                                                  \
            for (int64_t i = 0; i < n; i++) o[i] = (expr);                                         \
        }                                                                                          \
    }

#define DEF_BIN(op, expr)                                                                          \
    DEF_ROW2(op##_f32, float, expr)                                                                \
    DEF_ROW2(op##_f64, double, expr)

DEF_BIN(add, x + y)
DEF_BIN(sub, x - y)
DEF_BIN(mul, x *y)
DEF_BIN(div, x / y)
DEF_BIN(max, (x > y || x != x) ? x : y) /* NaN propagates, as in torch */
DEF_BIN(min, (x < y || x != x) ? x : y)

/* Run a binary row function over a broadcast output. */
static ts_status run2(const ts_kargs *k, row2_fn f32, row2_fn f64) {
    const ts_tensor *a = &k->in[0], *b = &k->in[1], *o = &k->out[0];
    row2_fn f = o->dtype == TS_F32 ? f32 : o->dtype == TS_F64 ? f64 : NULL;
    if (!f) return ts_kernel_bad_dtype(k, "binary op", o->dtype);
    size_t es = ts_dtype_size(o->dtype);
    int64_t n = ts_tensor_numel(o), na = ts_tensor_numel(a), nb = ts_tensor_numel(b);
    char *po = o->data;
    const char *pa = a->data, *pb = b->data;
    if ((na == n || na == 1) && (nb == n || nb == 1)) {
        /* Flat: chunks of the whole tensor. */
        int64_t chunk = 4096, nch = (n + chunk - 1) / chunk;
        int64_t sa = na == n, sb = nb == n;
#pragma omp parallel for schedule(static) if (n >= TS_PAR_MIN)
        for (int64_t c = 0; c < nch; c++) {
            int64_t s = c * chunk, len = n - s < chunk ? n - s : chunk;
            f(po + s * es, pa + s * sa * es, pb + s * sb * es, len, sa, sb);
        }
        return TS_OK;
    }
    int64_t stra[TS_MAX_RANK], strb[TS_MAX_RANK];
    ts_bcast_strides(a, o, stra);
    ts_bcast_strides(b, o, strb);
    int64_t rows = ts_rows(o), inner = ts_inner(o), last = o->rank - 1;
#pragma omp parallel for schedule(static) if (n >= TS_PAR_MIN)
    for (int64_t r = 0; r < rows; r++) {
        int64_t oa = ts_row_offset(r, o->rank, o->dims, stra);
        int64_t ob = ts_row_offset(r, o->rank, o->dims, strb);
        f(po + r * inner * es, pa + oa * es, pb + ob * es, inner, stra[last], strb[last]);
    }
    return TS_OK;
}

/* Run a ternary row function (first input u8 condition or a gradient). */
static ts_status run3(const ts_kargs *k, row3_fn f32, row3_fn f64) {
    const ts_tensor *o = &k->out[0];
    row3_fn f = o->dtype == TS_F32 ? f32 : o->dtype == TS_F64 ? f64 : NULL;
    if (!f) return ts_kernel_bad_dtype(k, "ternary op", o->dtype);
    int64_t str[3][TS_MAX_RANK];
    size_t es[3];
    for (int i = 0; i < 3; i++) {
        ts_bcast_strides(&k->in[i], o, str[i]);
        es[i] = ts_dtype_size(k->in[i].dtype);
    }
    size_t eo = ts_dtype_size(o->dtype);
    int64_t rows = ts_rows(o), inner = ts_inner(o), last = o->rank - 1, n = ts_tensor_numel(o);
    char *po = o->data;
#pragma omp parallel for schedule(static) if (n >= TS_PAR_MIN)
    for (int64_t r = 0; r < rows; r++) {
        const char *p[3];
        for (int i = 0; i < 3; i++)
            p[i] = (const char *)k->in[i].data +
                   ts_row_offset(r, o->rank, o->dims, str[i]) * (int64_t)es[i];
        f(po + r * inner * eo, p[0], p[1], p[2], inner, last >= 0 ? str[0][last] : 0,
          last >= 0 ? str[1][last] : 0, last >= 0 ? str[2][last] : 0);
    }
    return TS_OK;
}

#define DEF_ROW3(name, T, CT, expr)                                                                \
    TS_CLONES static void name(void *o_, const void *c_, const void *a_, const void *b_,           \
                               int64_t n, int64_t sc, int64_t sa, int64_t sb) {                    \
        T *o = o_;                                                                                 \
        const CT *c = c_;                                                                          \
        const T *a = a_, *b = b_;                                                                  \
        for (int64_t i = 0; i < n; i++) {                                                          \
            CT z = c[i * sc];                                                                      \
            T x = a[i * sa], y = b[i * sb];                                                        \
            o[i] = (expr);                                                                         \
        }                                                                                          \
    }

DEF_ROW3(where_f32, float, unsigned char, z ? x : y)
DEF_ROW3(where_f64, double, unsigned char, z ? x : y)
/* maximum/minimum backward (torch semantics): the gradient goes to the
 * larger (smaller) operand and is split in half on ties. */
DEF_ROW3(max_a_f32, float, float, x > y ? z : (x == y ? z * 0.5f : 0.0f))
DEF_ROW3(max_a_f64, double, double, x > y ? z : (x == y ? z * 0.5 : 0.0))
DEF_ROW3(max_b_f32, float, float, y > x ? z : (x == y ? z * 0.5f : 0.0f))
DEF_ROW3(max_b_f64, double, double, y > x ? z : (x == y ? z * 0.5 : 0.0))
DEF_ROW3(min_a_f32, float, float, x < y ? z : (x == y ? z * 0.5f : 0.0f))
DEF_ROW3(min_a_f64, double, double, x < y ? z : (x == y ? z * 0.5 : 0.0))
DEF_ROW3(min_b_f32, float, float, y < x ? z : (x == y ? z * 0.5f : 0.0f))
DEF_ROW3(min_b_f64, double, double, y < x ? z : (x == y ? z * 0.5 : 0.0))

static ts_status k_add(const ts_kargs *k) {
    return run2(k, add_f32, add_f64);
}
static ts_status k_sub(const ts_kargs *k) {
    return run2(k, sub_f32, sub_f64);
}
static ts_status k_mul(const ts_kargs *k) {
    return run2(k, mul_f32, mul_f64);
}
static ts_status k_div(const ts_kargs *k) {
    return run2(k, div_f32, div_f64);
}
static ts_status k_max(const ts_kargs *k) {
    return run2(k, max_f32, max_f64);
}
static ts_status k_min(const ts_kargs *k) {
    return run2(k, min_f32, min_f64);
}
static ts_status k_where(const ts_kargs *k) {
    return run3(k, where_f32, where_f64);
}
static ts_status k_maxmin_bwd(const ts_kargs *k) {
    static const row3_fn f32[2][2] = {{max_a_f32, max_b_f32}, {min_a_f32, min_b_f32}};
    static const row3_fn f64[2][2] = {{max_a_f64, max_b_f64}, {min_a_f64, min_b_f64}};
    int m = k->a->maxmin.min != 0, s = k->a->maxmin.side != 0;
    return run3(k, f32[m][s], f64[m][s]);
}

/* ---- chunk functions for fused kernels (eltwise.h) ---------------------- */

ts_binary_row_fn ts_binary_row_f32(int op) {
    switch (op) {
    case TS_OP_ADD: return add_f32;
    case TS_OP_SUB: return sub_f32;
    case TS_OP_MUL: return mul_f32;
    case TS_OP_DIV: return div_f32;
    case TS_OP_MAXIMUM: return max_f32;
    case TS_OP_MINIMUM: return min_f32;
    default: return NULL;
    }
}

ts_ternary_row_fn ts_ternary_row_f32(int op, const ts_attrs *a) {
    static const row3_fn mm[2][2] = {{max_a_f32, max_b_f32}, {min_a_f32, min_b_f32}};
    if (op == TS_OP_WHERE) return where_f32;
    if (op == TS_OP_MAXMIN_BWD) return mm[a->maxmin.min != 0][a->maxmin.side != 0];
    return NULL;
}

static double cost_elementwise(const ts_graph *g, const ts_node *n) {
    return (double)ts_type_numel(&g->values[n->out[0]].t);
}

#define BIN_DEF(id, nm, gr, kern)                                                                  \
    const ts_op_def ts_def_##id = {.name = nm,                                                     \
                                   .min_in = 2,                                                    \
                                   .max_in = 2,                                                    \
                                   .flags = TS_OPF_ELEMENTWISE | TS_OPF_INPLACE,                   \
                                   .infer = infer_binary,                                          \
                                   .grad = gr,                                                     \
                                   .kernel = kern,                                                 \
                                   .cost = cost_elementwise};

BIN_DEF(add, "add", grad_add, k_add)
BIN_DEF(sub, "sub", grad_sub, k_sub)
BIN_DEF(mul, "mul", grad_mul, k_mul)
BIN_DEF(div, "div", grad_div, k_div)
BIN_DEF(maximum, "maximum", grad_maxmin, k_max)
BIN_DEF(minimum, "minimum", grad_maxmin, k_min)

const ts_op_def ts_def_maxmin_bwd = {.name = "maxmin_bwd",
                                     .min_in = 3,
                                     .max_in = 3,
                                     .flags = TS_OPF_ELEMENTWISE,
                                     .infer = infer_maxmin_bwd,
                                     .kernel = k_maxmin_bwd,
                                     .cost = cost_elementwise};

const ts_op_def ts_def_where = {.name = "where",
                                .min_in = 3,
                                .max_in = 3,
                                .flags = TS_OPF_ELEMENTWISE,
                                .infer = infer_where,
                                .grad = grad_where,
                                .kernel = k_where,
                                .cost = cost_elementwise};

/* ---- builders ---------------------------------------------------------- */

static ts_val bin(ts_graph *g, int op, ts_val a, ts_val b) {
    ts_val in[2] = {a, b};
    return ts_node_add(g, op, 2, in, NULL, NULL);
}

ts_val ts_add(ts_graph *g, ts_val a, ts_val b) {
    return bin(g, TS_OP_ADD, a, b);
}
ts_val ts_sub(ts_graph *g, ts_val a, ts_val b) {
    return bin(g, TS_OP_SUB, a, b);
}
ts_val ts_mul(ts_graph *g, ts_val a, ts_val b) {
    return bin(g, TS_OP_MUL, a, b);
}
ts_val ts_div(ts_graph *g, ts_val a, ts_val b) {
    return bin(g, TS_OP_DIV, a, b);
}
ts_val ts_maximum(ts_graph *g, ts_val a, ts_val b) {
    return bin(g, TS_OP_MAXIMUM, a, b);
}
ts_val ts_minimum(ts_graph *g, ts_val a, ts_val b) {
    return bin(g, TS_OP_MINIMUM, a, b);
}

ts_val ts_where(ts_graph *g, ts_val cond, ts_val a, ts_val b) {
    ts_val in[3] = {cond, a, b};
    return ts_node_add(g, TS_OP_WHERE, 3, in, NULL, NULL);
}
