/* Convolution (N-d, N = 1..3 spatial dims, PyTorch layout) and its backward
 * ops, plus the transposed convolution.
 *
 * Layout: x [N, C, (D,) (H,) W], weight [O, C/groups, k...] as torch's
 * Conv1d/2d/3d; the transposed convolution takes weight [C, O/groups, k...]
 * as torch's ConvTranspose. Attributes: a.conv (core/attrs.h), shared by
 * all four ops.
 *
 * conv (x, w[, b]) -> y; conv_bwd_data (dy, w) -> dx; conv_bwd_weight
 * (dy, x) -> dw; conv_transpose (x, w[, b]) -> y, which is conv_bwd_data
 * with the roles of the channel axes read from the transposed weight (and
 * shares its kernel). Gradients: conv -> conv_bwd_data, conv_bwd_weight and
 * a sum of dy for the bias; conv_transpose -> conv (dx) and
 * conv_bwd_weight with x and dy swapped (dw); the two backward ops are
 * bilinear, so their own gradients are convs too (double backward).
 *
 * Reference kernels work on a 3-d geometry (a 1-d or 2-d problem is padded
 * with size-1 leading spatial dims). Each parallel task owns whole output
 * rows and sums its terms in a fixed order, so results do not depend on
 * the thread count. The CPU backend replaces f32 instances with oneDNN
 * primitives (src/backends/cpu/dnnl_conv.c). */
#include <string.h>
#include "core/half.h"
#include "kern.h"

/* Largest stride, padding, dilation, kernel size and output_padding
 * (2^21 - 1: the bound of the 21-bit fields these once were packed in). */
#define FIELD_MAX ((INT64_C(1) << 21) - 1)

/* Problem size of one convolution, in its forward orientation: "in" is the
 * space of x (C channels), "out" the space of y (O channels). Spatial dims
 * are right-aligned in 3 slots; unused leading slots have size 1. */
typedef struct cgeo {
    int nd;
    int64_t N, C, O, G, Cg, Og;
    int64_t in[3], out[3], k[3], s[3], p[3], d[3];
} cgeo;

static void geo_attrs(cgeo *q, const ts_attrs *a) {
    q->nd = (int)a->conv.nd;
    q->G = a->conv.groups;
    for (int j = 0; j < 3; j++) {
        q->in[j] = q->out[j] = q->k[j] = q->s[j] = q->d[j] = 1;
        q->p[j] = 0;
    }
    for (int j = 0; j < q->nd; j++) {
        int t = 3 - q->nd + j;
        q->s[t] = a->conv.stride[j];
        q->p[t] = a->conv.padding[j];
        q->d[t] = a->conv.dilation[j];
    }
}

/* x dims [N, C, in...], w dims [O, C/g, k...], y dims [N, O, out...]
 * (channels last: x [N, in..., C], y [N, out..., O]). */
static void geo_dims(cgeo *q, const int64_t *xd, const int64_t *wd, const int64_t *yd, int cl) {
    const int ch = cl ? q->nd + 1 : 1, sp = cl ? 1 : 2;
    q->N = xd[0];
    q->C = xd[ch];
    q->O = yd[ch];
    q->Cg = q->C / q->G;
    q->Og = q->O / q->G;
    for (int j = 0; j < q->nd; j++) {
        int t = 3 - q->nd + j;
        q->in[t] = xd[sp + j];
        q->out[t] = yd[sp + j];
        q->k[t] = wd[2 + j];
    }
}

/* The channel axis and the first spatial axis of an activation. */
static int chan_axis(const ts_attrs *a) {
    return a->conv.channels_last ? (int)a->conv.nd + 1 : 1;
}
static int sp_axis(const ts_attrs *a) {
    return a->conv.channels_last ? 1 : 2;
}

/* An activation type [N, C, spatial...] or [N, spatial..., C]. */
static ts_type act_type(const ts_attrs *a, ts_dtype dt, int64_t n, int64_t c,
                        const int64_t *spatial) {
    int nd = (int)a->conv.nd;
    ts_type t = {.dtype = dt, .rank = nd + 2};
    t.dims[0] = n;
    t.dims[chan_axis(a)] = c;
    for (int j = 0; j < nd; j++) t.dims[sp_axis(a) + j] = spatial[j];
    return t;
}

/* Output extent of a convolution over `in`; < 1 when the kernel does not fit. */
static int64_t conv_out(int64_t in, int64_t k, int64_t s, int64_t p, int64_t d) {
    int64_t span = in + 2 * p - d * (k - 1) - 1;
    return span < 0 ? 0 : span / s + 1;
}

/* Smallest input extent that a convolution maps onto `out`. */
static int64_t conv_min_in(int64_t out, int64_t k, int64_t s, int64_t p, int64_t d) {
    return (out - 1) * s - 2 * p + d * (k - 1) + 1;
}

/* ---- inference --------------------------------------------------------- */

/* nd, groups, stride, padding, dilation. */
static ts_status check_attrs(const ts_node *n) {
    const ts_conv_attrs *c = &n->a.conv;
    if (c->nd < 1 || c->nd > 3)
        return ts_fail(TS_ERR_INVALID, "spatial rank must be 1, 2 or 3, got %lld",
                       (long long)c->nd);
    if (c->groups < 1)
        return ts_fail(TS_ERR_INVALID, "groups must be >= 1, got %lld", (long long)c->groups);
    if (c->channels_last != 0 && c->channels_last != 1)
        return ts_fail(TS_ERR_INVALID, "layout flag must be 0 or 1, got %lld",
                       (long long)c->channels_last);
    for (int j = 0; j < c->nd; j++) {
        int64_t s = c->stride[j], p = c->padding[j], d = c->dilation[j];
        if (s < 1 || s > FIELD_MAX || p < 0 || p > FIELD_MAX || d < 1 || d > FIELD_MAX)
            return ts_fail(TS_ERR_INVALID,
                           "spatial dim %d: stride %lld, padding %lld, dilation %lld (need "
                           "stride >= 1, padding >= 0, dilation >= 1)",
                           j, (long long)s, (long long)p, (long long)d);
    }
    return TS_OK;
}

static int is_low(ts_dtype dt) {
    return dt == TS_BF16 || dt == TS_F16;
}

/* The mixed-precision flag against the operands' dtype `dt`; *out_dt is
 * the output dtype (f32 with the flag, else dt). */
static ts_status check_low(const ts_node *n, ts_dtype dt, ts_dtype *out_dt) {
    int64_t f = n->a.conv.low;
    if (f != 0 && f != 1)
        return ts_fail(TS_ERR_INVALID, "mixed-precision flag (low) must be 0 or 1, got %lld",
                       (long long)f);
    if (f && !is_low(dt))
        return ts_fail(TS_ERR_SHAPE,
                       "mixed-precision flag (low: f32 accumulation and output) needs bf16 or "
                       "f16 operands, got %s",
                       ts_dtype_name(dt));
    if (!f && is_low(dt))
        return ts_fail(TS_ERR_SHAPE,
                       "%s operands need the mixed-precision flag (low: f32 accumulation and "
                       "output, set by the precision pass); a %s convolution is not supported",
                       ts_dtype_name(dt), ts_dtype_name(dt));
    *out_dt = f ? TS_F32 : dt;
    return TS_OK;
}

/* A float tensor [N, C, spatial...] (channels last [N, spatial..., C]) of
 * rank nd + 2 with C divisible by groups. */
static ts_status check_act(const ts_type *t, const ts_attrs *a, const char *what) {
    int nd = (int)a->conv.nd;
    int64_t groups = a->conv.groups;
    if (!ts_dtype_is_float(t->dtype))
        return ts_fail(TS_ERR_SHAPE, "%s must be a float type, got %s", what,
                       ts_dtype_name(t->dtype));
    if (t->rank != nd + 2)
        return ts_fail(TS_ERR_SHAPE,
                       "%s must have rank %d (%s with %d spatial dims) for a %d-d op, got rank %d",
                       what, nd + 2,
                       a->conv.channels_last ? "[N, spatial..., C]" : "[N, C, spatial...]", nd, nd,
                       t->rank);
    for (int j = 0; j < t->rank; j++)
        if (t->dims[j] < 1) return ts_fail(TS_ERR_SHAPE, "%s has an empty axis %d", what, j);
    if (t->dims[chan_axis(a)] % groups)
        return ts_fail(TS_ERR_SHAPE, "%s channels (%lld) are not divisible by groups (%lld)", what,
                       (long long)t->dims[chan_axis(a)], (long long)groups);
    return TS_OK;
}

static ts_status check_weight(const ts_type *w, const ts_type *x, int nd, const char *layout) {
    if (w->dtype != x->dtype)
        return ts_fail(TS_ERR_SHAPE, "weight dtype %s differs from %s", ts_dtype_name(w->dtype),
                       ts_dtype_name(x->dtype));
    if (w->rank != nd + 2)
        return ts_fail(TS_ERR_SHAPE, "weight must be %s of rank %d for a %d-d op, got rank %d",
                       layout, nd + 2, nd, w->rank);
    for (int j = 0; j < w->rank; j++)
        if (w->dims[j] < 1 || (j >= 2 && w->dims[j] > FIELD_MAX))
            return ts_fail(TS_ERR_SHAPE, "weight axis %d has size %lld", j, (long long)w->dims[j]);
    return TS_OK;
}

static ts_status check_bias(const ts_graph *g, const ts_node *n, int64_t O, ts_dtype dt) {
    if (n->n_in < 3) return TS_OK;
    const ts_type *b = ts_in_type(g, n, 2);
    if (b->dtype != dt || b->rank != 1 || b->dims[0] != O)
        return ts_fail(TS_ERR_SHAPE, "bias must be %s[%lld] (one per output channel)",
                       ts_dtype_name(dt), (long long)O);
    return TS_OK;
}

/* Output spatial dims of a forward conv; error if the kernel does not fit. */
static ts_status fwd_spatial(const ts_node *n, const int64_t *in, const int64_t *k, int64_t *out) {
    const ts_conv_attrs *c = &n->a.conv;
    for (int j = 0; j < c->nd; j++) {
        int64_t s = c->stride[j], p = c->padding[j], d = c->dilation[j];
        out[j] = conv_out(in[j], k[j], s, p, d);
        if (out[j] < 1)
            return ts_fail(TS_ERR_SHAPE,
                           "spatial dim %d: kernel %lld (dilation %lld, effective %lld) is larger "
                           "than the padded input %lld + 2*%lld",
                           j, (long long)k[j], (long long)d, (long long)(d * (k[j] - 1) + 1),
                           (long long)in[j], (long long)p);
    }
    return TS_OK;
}

static ts_status infer_conv(const ts_graph *g, const ts_node *n, ts_type *out, int *n_out) {
    ts_status s = check_attrs(n);
    if (s != TS_OK) return s;
    const ts_attrs *a = &n->a;
    int nd = (int)a->conv.nd, ca = chan_axis(a);
    int64_t G = a->conv.groups;
    const ts_type *x = ts_in_type(g, n, 0), *w = ts_in_type(g, n, 1);
    if ((s = check_act(x, a, "x")) != TS_OK) return s;
    if ((s = check_weight(w, x, nd, "[O, C/groups, k...]")) != TS_OK) return s;
    ts_dtype odt;
    if ((s = check_low(n, x->dtype, &odt)) != TS_OK) return s;
    if (w->dims[0] % G)
        return ts_fail(TS_ERR_SHAPE, "output channels (%lld) are not divisible by groups (%lld)",
                       (long long)w->dims[0], (long long)G);
    if (w->dims[1] * G != x->dims[ca])
        return ts_fail(TS_ERR_SHAPE,
                       "weight has %lld input channels per group, x has %lld channels in %lld "
                       "groups",
                       (long long)w->dims[1], (long long)x->dims[ca], (long long)G);
    if ((s = check_bias(g, n, w->dims[0], odt)) != TS_OK) return s;
    int64_t o[3];
    if ((s = fwd_spatial(n, x->dims + sp_axis(a), w->dims + 2, o)) != TS_OK) return s;
    *out = act_type(a, odt, x->dims[0], w->dims[0], o);
    *n_out = 1;
    return TS_OK;
}

/* Input spatial dims of the conv whose output is `out` (conv_bwd_data and
 * conv_transpose): the smallest one plus extra[j]. */
static ts_status bwd_spatial(const ts_node *n, const int64_t *out, const int64_t *k, int64_t *in,
                             const char *extra_name) {
    const ts_conv_attrs *c = &n->a.conv;
    for (int j = 0; j < c->nd; j++) {
        int64_t s = c->stride[j], p = c->padding[j], d = c->dilation[j];
        int64_t e = c->extra[j];
        if (e >= s)
            return ts_fail(TS_ERR_INVALID,
                           "spatial dim %d: %s %lld must be smaller than the stride %lld", j,
                           extra_name, (long long)e, (long long)s);
        in[j] = conv_min_in(out[j], k[j], s, p, d) + e;
        if (in[j] < 1)
            return ts_fail(TS_ERR_SHAPE,
                           "spatial dim %d: output size %lld is not positive (input %lld, "
                           "kernel %lld, stride %lld, padding %lld, dilation %lld)",
                           j, (long long)in[j], (long long)out[j], (long long)k[j], (long long)s,
                           (long long)p, (long long)d);
    }
    return TS_OK;
}

/* (dy [N, O, out...], w [O, C/g, k...]) -> dx [N, C, in...] */
static ts_status infer_conv_bwd_data(const ts_graph *g, const ts_node *n, ts_type *out,
                                     int *n_out) {
    ts_status s = check_attrs(n);
    if (s != TS_OK) return s;
    const ts_attrs *a = &n->a;
    int nd = (int)a->conv.nd, ca = chan_axis(a);
    int64_t G = a->conv.groups;
    const ts_type *dy = ts_in_type(g, n, 0), *w = ts_in_type(g, n, 1);
    if ((s = check_act(dy, a, "dy")) != TS_OK) return s;
    if ((s = check_weight(w, dy, nd, "[O, C/groups, k...]")) != TS_OK) return s;
    ts_dtype odt;
    if ((s = check_low(n, dy->dtype, &odt)) != TS_OK) return s;
    if (w->dims[0] != dy->dims[ca])
        return ts_fail(TS_ERR_SHAPE, "weight has %lld output channels, dy has %lld",
                       (long long)w->dims[0], (long long)dy->dims[ca]);
    int64_t in[3];
    if ((s = bwd_spatial(n, dy->dims + sp_axis(a), w->dims + 2, in, "extra input size")) != TS_OK)
        return s;
    *out = act_type(a, odt, dy->dims[0], w->dims[1] * G, in);
    *n_out = 1;
    return TS_OK;
}

/* (dy [N, O, out...], x [N, C, in...]) -> dw [O, C/g, k...], k from extra[]. */
static ts_status infer_conv_bwd_weight(const ts_graph *g, const ts_node *n, ts_type *out,
                                       int *n_out) {
    ts_status s = check_attrs(n);
    if (s != TS_OK) return s;
    const ts_attrs *a = &n->a;
    int nd = (int)a->conv.nd, ca = chan_axis(a), sa = sp_axis(a);
    int64_t G = a->conv.groups;
    const ts_type *dy = ts_in_type(g, n, 0), *x = ts_in_type(g, n, 1);
    if ((s = check_act(dy, a, "dy")) != TS_OK) return s;
    if ((s = check_act(x, a, "x")) != TS_OK) return s;
    if (dy->dtype != x->dtype || dy->dims[0] != x->dims[0])
        return ts_fail(TS_ERR_SHAPE, "dy and x must have the same dtype and batch size");
    ts_dtype odt;
    if ((s = check_low(n, x->dtype, &odt)) != TS_OK) return s;
    int64_t k[3] = {1, 1, 1}, o[3] = {1, 1, 1};
    for (int j = 0; j < nd; j++)
        if ((k[j] = a->conv.extra[j]) < 1)
            return ts_fail(TS_ERR_INVALID, "kernel size of spatial dim %d must be >= 1", j);
    if ((s = fwd_spatial(n, x->dims + sa, k, o)) != TS_OK) return s;
    for (int j = 0; j < nd; j++)
        if (o[j] != dy->dims[sa + j])
            return ts_fail(
                TS_ERR_SHAPE, "spatial dim %d: x of size %lld gives an output of %lld, dy has %lld",
                j, (long long)x->dims[sa + j], (long long)o[j], (long long)dy->dims[sa + j]);
    *out = (ts_type){.dtype = odt, .rank = nd + 2, .dims = {dy->dims[ca], x->dims[ca] / G}};
    for (int j = 0; j < nd; j++) out->dims[2 + j] = k[j];
    *n_out = 1;
    return TS_OK;
}

/* (x [N, C, in...], w [C, O/g, k...][, b [O]]) -> y [N, O, out...] */
static ts_status infer_conv_transpose(const ts_graph *g, const ts_node *n, ts_type *out,
                                      int *n_out) {
    ts_status s = check_attrs(n);
    if (s != TS_OK) return s;
    const ts_attrs *a = &n->a;
    int nd = (int)a->conv.nd, ca = chan_axis(a);
    int64_t G = a->conv.groups;
    const ts_type *x = ts_in_type(g, n, 0), *w = ts_in_type(g, n, 1);
    if ((s = check_act(x, a, "x")) != TS_OK) return s;
    if ((s = check_weight(w, x, nd, "[C, O/groups, k...]")) != TS_OK) return s;
    ts_dtype odt;
    if ((s = check_low(n, x->dtype, &odt)) != TS_OK) return s;
    if (w->dims[0] != x->dims[ca])
        return ts_fail(TS_ERR_SHAPE, "weight has %lld input channels (axis 0), x has %lld",
                       (long long)w->dims[0], (long long)x->dims[ca]);
    int64_t O = w->dims[1] * G;
    if ((s = check_bias(g, n, O, odt)) != TS_OK) return s;
    int64_t o[3];
    if ((s = bwd_spatial(n, x->dims + sp_axis(a), w->dims + 2, o, "output_padding")) != TS_OK)
        return s;
    *out = act_type(a, odt, x->dims[0], O, o);
    *n_out = 1;
    return TS_OK;
}

/* ---- gradients --------------------------------------------------------- */

/* A mixed-precision conv is created by the precision pass after autodiff. */
static ts_status no_low_grad(const ts_node *n) {
    return ts_fail(TS_ERR_UNSUPPORTED,
                   "%s: a mixed-precision convolution (f32 output, low) has no gradient: the "
                   "precision pass creates it after autodiff",
                   ts_op_get(n->op)->name);
}

/* A conv node with at's geometry and extra[] (NULL: zeros). */
static ts_val add_conv_node(ts_graph *g, int op, ts_val a, ts_val b, const ts_attrs *at,
                            const int64_t *extra) {
    ts_attrs t = *at;
    for (int j = 0; j < 3; j++) t.conv.extra[j] = extra ? extra[j] : 0;
    ts_val in[2] = {a, b};
    return ts_node_add(g, op, 2, in, &t, NULL);
}

/* e[j] = extra input size of x over the smallest input giving y's size. */
static const int64_t *extra_in(const ts_graph *g, const ts_attrs *a, ts_val x, ts_val w, ts_val y,
                               int64_t *e) {
    const ts_conv_attrs *c = &a->conv;
    const int sa = sp_axis(a);
    for (int j = 0; j < 3; j++) e[j] = 0;
    for (int j = 0; j < c->nd; j++) {
        int64_t mn = conv_min_in(ts_dim(g, y, sa + j), ts_dim(g, w, 2 + j), c->stride[j],
                                 c->padding[j], c->dilation[j]);
        e[j] = ts_dim(g, x, sa + j) - mn;
    }
    return e;
}

/* k[j] = the kernel size of spatial dim j. */
static const int64_t *kernel_of(const ts_graph *g, ts_val w, int nd, int64_t *k) {
    for (int j = 0; j < 3; j++) k[j] = j < nd ? ts_dim(g, w, 2 + j) : 0;
    return k;
}

/* Sum over every axis but the channel axis 1: the gradient of a bias. As
 * [N, O, S]: first over S, then over N, two reductions of the contiguous
 * kinds that ts_sum's kernel runs in parallel blocks (one sum over axes
 * {0, 2} takes its element-by-element path, ~20x slower on W4's shapes). */
static ts_val bias_grad(ts_graph *g, ts_val dy, const ts_attrs *a) {
    if (a->conv.channels_last) { /* as [N, spatial, O]: over the rows of each image, then over N */
        int64_t d[3] = {ts_dim(g, dy, 0), -1, ts_dim(g, dy, chan_axis(a))};
        int ax1 = 1, ax0 = 0;
        ts_val per_image = ts_sum(g, ts_reshape(g, dy, 3, d), 1, &ax1, 0);
        return ts_sum(g, per_image, 1, &ax0, 0);
    }
    int64_t d[3] = {ts_dim(g, dy, 0), ts_dim(g, dy, 1), -1};
    int ax2 = 2, ax0 = 0;
    ts_val per_image = ts_sum(g, ts_reshape(g, dy, 3, d), 1, &ax2, 0);
    return ts_sum(g, per_image, 1, &ax0, 0);
}

static ts_status grad_conv(ts_graph *g, const ts_node *n, const ts_val *dyv, ts_val *din) {
    if (n->a.conv.low) return no_low_grad(n);
    ts_val dy = dyv[0], x = ts_mkval(n->in[0]), w = ts_mkval(n->in[1]);
    if (!ts_val_ok(dy)) return TS_OK;
    ts_attrs a = n->a; /* n points into g->nodes, which moves as nodes are added */
    int nd = (int)a.conv.nd, has_b = n->n_in > 2;
    int64_t e[3], k[3];
    din[0] = add_conv_node(g, TS_OP_CONV_BWD_DATA, dy, w, &a,
                           extra_in(g, &a, x, w, ts_mkval(n->out[0]), e));
    din[1] = add_conv_node(g, TS_OP_CONV_BWD_WEIGHT, dy, x, &a, kernel_of(g, w, nd, k));
    if (has_b) din[2] = bias_grad(g, dy, &a);
    return ts_graph_status(g);
}

static ts_status grad_conv_transpose(ts_graph *g, const ts_node *n, const ts_val *dyv,
                                     ts_val *din) {
    if (n->a.conv.low) return no_low_grad(n);
    ts_val dy = dyv[0], x = ts_mkval(n->in[0]), w = ts_mkval(n->in[1]);
    if (!ts_val_ok(dy)) return TS_OK;
    ts_attrs a = n->a;
    int nd = (int)a.conv.nd, has_b = n->n_in > 2;
    int64_t k[3];
    /* y = conv_bwd_data(x, w): x plays dy of a conv from y's space. */
    din[0] = add_conv_node(g, TS_OP_CONV, dy, w, &a, NULL);
    din[1] = add_conv_node(g, TS_OP_CONV_BWD_WEIGHT, x, dy, &a, kernel_of(g, w, nd, k));
    if (has_b) din[2] = bias_grad(g, dy, &a);
    return ts_graph_status(g);
}

/* dx = A(dy, w) is linear in each of dy and w: d(dy) = conv(ddx, w),
 * d(w) = conv_bwd_weight(dy, ddx). */
static ts_status grad_conv_bwd_data(ts_graph *g, const ts_node *n, const ts_val *dxv, ts_val *din) {
    if (n->a.conv.low) return no_low_grad(n);
    ts_val ddx = dxv[0], dy = ts_mkval(n->in[0]), w = ts_mkval(n->in[1]);
    if (!ts_val_ok(ddx)) return TS_OK;
    ts_attrs a = n->a;
    int64_t k[3];
    din[0] = add_conv_node(g, TS_OP_CONV, ddx, w, &a, NULL);
    din[1] =
        add_conv_node(g, TS_OP_CONV_BWD_WEIGHT, dy, ddx, &a, kernel_of(g, w, (int)a.conv.nd, k));
    return ts_graph_status(g);
}

/* dw = B(dy, x): d(dy) = conv(x, ddw), d(x) = conv_bwd_data(dy, ddw). */
static ts_status grad_conv_bwd_weight(ts_graph *g, const ts_node *n, const ts_val *dwv,
                                      ts_val *din) {
    if (n->a.conv.low) return no_low_grad(n);
    ts_val ddw = dwv[0], dy = ts_mkval(n->in[0]), x = ts_mkval(n->in[1]);
    if (!ts_val_ok(ddw)) return TS_OK;
    ts_attrs a = n->a;
    int64_t e[3];
    din[0] = add_conv_node(g, TS_OP_CONV, x, ddw, &a, NULL);
    din[1] = add_conv_node(g, TS_OP_CONV_BWD_DATA, dy, ddw, &a, extra_in(g, &a, x, ddw, dy, e));
    return ts_graph_status(g);
}

/* ---- reference kernels -------------------------------------------------- */

/* The range [lo, hi) of output positions o with 0 <= o*s + off < in. */
static void out_range(int64_t off, int64_t s, int64_t in, int64_t out, int64_t *lo, int64_t *hi) {
    int64_t l = off >= 0 ? 0 : (-off + s - 1) / s;
    int64_t h = in - 1 - off < 0 ? 0 : (in - 1 - off) / s + 1;
    *lo = l;
    *hi = h < out ? h : out;
}

#define LANES 8
/* The operand load of the f32/f64 kernels; the mixed-precision instances
 * widen bf16/f16 operands with ts_bf16_to_f32 / ts_f16_to_f32 instead (exact). */
#define LD_ID(v) (v)

#define DEF_CONV(T, TI, LD, SFX)                                                                   \
    /* y row += w * x row over one kernel row (kw taps). */                                        \
    TS_CLONES static void fwd_taps_##SFX(T *yr, const TI *xr, const TI *wr, const cgeo *q) {       \
        int64_t sw = q->s[2];                                                                      \
        for (int64_t kw = 0; kw < q->k[2]; kw++) {                                                 \
            int64_t off = kw * q->d[2] - q->p[2], lo, hi;                                          \
            out_range(off, sw, q->in[2], q->out[2], &lo, &hi);                                     \
            T wv = LD(wr[kw]);                                                                     \
            if (sw == 1)                                                                           \
                for (int64_t o = lo; o < hi; o++) yr[o] += wv * LD(xr[o + off]);                   \
            else                                                                                   \
                for (int64_t o = lo; o < hi; o++) yr[o] += wv * LD(xr[o * sw + off]);              \
        }                                                                                          \
    }                                                                                              \
    /* y[n, o, od, oh, :] for task t over (n, o, od, oh). */                                       \
    static void fwd_row_##SFX(T *y, const TI *x, const TI *w, const T *b, const cgeo *q,           \
                              int64_t t) {                                                         \
        int64_t oh = t % q->out[1], od = t / q->out[1] % q->out[0];                                \
        int64_t o = t / (q->out[1] * q->out[0]) % q->O, n = t / (q->out[1] * q->out[0] * q->O);    \
        T *yr = y + t * q->out[2];                                                                 \
        T bv = b ? b[o] : (T)0;                                                                    \
        for (int64_t i = 0; i < q->out[2]; i++) yr[i] = bv;                                        \
        int64_t c0 = o / q->Og * q->Cg;                                                            \
        for (int64_t c = 0; c < q->Cg; c++)                                                        \
            for (int64_t kd = 0; kd < q->k[0]; kd++) {                                             \
                int64_t id = od * q->s[0] - q->p[0] + kd * q->d[0];                                \
                if (id < 0 || id >= q->in[0]) continue;                                            \
                for (int64_t kh = 0; kh < q->k[1]; kh++) {                                         \
                    int64_t ih = oh * q->s[1] - q->p[1] + kh * q->d[1];                            \
                    if (ih < 0 || ih >= q->in[1]) continue;                                        \
                    const TI *xr =                                                                 \
                        x + (((n * q->C + c0 + c) * q->in[0] + id) * q->in[1] + ih) * q->in[2];    \
                    const TI *wr =                                                                 \
                        w + (((o * q->Cg + c) * q->k[0] + kd) * q->k[1] + kh) * q->k[2];           \
                    fwd_taps_##SFX(yr, xr, wr, q);                                                 \
                }                                                                                  \
            }                                                                                      \
    }                                                                                              \
    static void conv_fwd_##SFX(T *y, const TI *x, const TI *w, const T *b, const cgeo *q) {        \
        int64_t rows = q->N * q->O * q->out[0] * q->out[1];                                        \
        double work = (double)rows * (double)q->out[2] * (double)(q->Cg * q->k[0] * q->k[1]);      \
        _Pragma("omp parallel for schedule(static) if (work >= TS_PAR_MIN)") for (int64_t t = 0;   \
                                                                                  t < rows; t++)   \
            fwd_row_##SFX(y, x, w, b, q, t);                                                       \
    }                                                                                              \
    /* dx row += w * dy row over one kernel row (the adjoint of fwd_taps). */                      \
    TS_CLONES static void bwd_taps_##SFX(T *xr, const TI *yr, const TI *wr, const cgeo *q) {       \
        int64_t sw = q->s[2];                                                                      \
        for (int64_t kw = 0; kw < q->k[2]; kw++) {                                                 \
            int64_t off = kw * q->d[2] - q->p[2], lo, hi;                                          \
            out_range(off, sw, q->in[2], q->out[2], &lo, &hi);                                     \
            T wv = LD(wr[kw]);                                                                     \
            if (sw == 1)                                                                           \
                for (int64_t o = lo; o < hi; o++) xr[o + off] += wv * LD(yr[o]);                   \
            else                                                                                   \
                for (int64_t o = lo; o < hi; o++) xr[o * sw + off] += wv * LD(yr[o]);              \
        }                                                                                          \
    }                                                                                              \
    /* dx[n, c, id, ih, :] for task t over (n, c, id, ih); b: initial value per channel. */        \
    static void bwd_data_row_##SFX(T *dx, const TI *dy, const TI *w, const T *b, const cgeo *q,    \
                                   int64_t t) {                                                    \
        int64_t ih = t % q->in[1], id = t / q->in[1] % q->in[0];                                   \
        int64_t c = t / (q->in[1] * q->in[0]) % q->C, n = t / (q->in[1] * q->in[0] * q->C);        \
        T *xr = dx + t * q->in[2];                                                                 \
        T bv = b ? b[c] : (T)0;                                                                    \
        for (int64_t i = 0; i < q->in[2]; i++) xr[i] = bv;                                         \
        int64_t grp = c / q->Cg, cl = c % q->Cg;                                                   \
        for (int64_t o = grp * q->Og; o < (grp + 1) * q->Og; o++)                                  \
            for (int64_t kd = 0; kd < q->k[0]; kd++) {                                             \
                int64_t td = id + q->p[0] - kd * q->d[0];                                          \
                if (td < 0 || td % q->s[0] || td / q->s[0] >= q->out[0]) continue;                 \
                for (int64_t kh = 0; kh < q->k[1]; kh++) {                                         \
                    int64_t th = ih + q->p[1] - kh * q->d[1];                                      \
                    if (th < 0 || th % q->s[1] || th / q->s[1] >= q->out[1]) continue;             \
                    const TI *yr = dy + (((n * q->O + o) * q->out[0] + td / q->s[0]) * q->out[1] + \
                                         th / q->s[1]) *                                           \
                                            q->out[2];                                             \
                    const TI *wr =                                                                 \
                        w + (((o * q->Cg + cl) * q->k[0] + kd) * q->k[1] + kh) * q->k[2];          \
                    bwd_taps_##SFX(xr, yr, wr, q);                                                 \
                }                                                                                  \
            }                                                                                      \
    }                                                                                              \
    static void conv_bwd_data_##SFX(T *dx, const TI *dy, const TI *w, const T *b, const cgeo *q) { \
        int64_t rows = q->N * q->C * q->in[0] * q->in[1];                                          \
        double work = (double)rows * (double)q->in[2] * (double)(q->Og * q->k[0] * q->k[1]);       \
        _Pragma("omp parallel for schedule(static) if (work >= TS_PAR_MIN)") for (int64_t t = 0;   \
                                                                                  t < rows; t++)   \
            bwd_data_row_##SFX(dx, dy, w, b, q, t);                                                \
    }                                                                                              \
    /* sum over o of dy[o] * x[o*s + off], in LANES interleaved partial sums. */                   \
    TS_CLONES static double dot_row_##SFX(const TI *yr, const TI *xr, int64_t lo, int64_t hi,      \
                                          int64_t s, int64_t off) {                                \
        T l[LANES] = {0};                                                                          \
        int64_t o = lo;                                                                            \
        if (s == 1)                                                                                \
            for (; o + LANES <= hi; o += LANES)                                                    \
                for (int j = 0; j < LANES; j++) l[j] += LD(yr[o + j]) * LD(xr[o + j + off]);       \
        for (; o < hi; o++) l[0] += LD(yr[o]) * LD(xr[o * s + off]);                               \
        return (double)(((l[0] + l[1]) + (l[2] + l[3])) + ((l[4] + l[5]) + (l[6] + l[7])));        \
    }                                                                                              \
    /* dw[o, c, kd, kh, kw] for task t: every (n, od, oh) row, in order. */                        \
    static void bwd_weight_one_##SFX(T *dw, const TI *dy, const TI *x, const cgeo *q, int64_t t) { \
        int64_t kw = t % q->k[2], kh = t / q->k[2] % q->k[1];                                      \
        int64_t kd = t / (q->k[2] * q->k[1]) % q->k[0];                                            \
        int64_t c = t / (q->k[2] * q->k[1] * q->k[0]) % q->Cg;                                     \
        int64_t o = t / (q->k[2] * q->k[1] * q->k[0] * q->Cg);                                     \
        int64_t cin = o / q->Og * q->Cg + c, off = kw * q->d[2] - q->p[2], lo, hi;                 \
        out_range(off, q->s[2], q->in[2], q->out[2], &lo, &hi);                                    \
        double acc = 0;                                                                            \
        for (int64_t n = 0; n < q->N; n++)                                                         \
            for (int64_t od = 0; od < q->out[0]; od++) {                                           \
                int64_t id = od * q->s[0] - q->p[0] + kd * q->d[0];                                \
                if (id < 0 || id >= q->in[0]) continue;                                            \
                for (int64_t oh = 0; oh < q->out[1]; oh++) {                                       \
                    int64_t ih = oh * q->s[1] - q->p[1] + kh * q->d[1];                            \
                    if (ih < 0 || ih >= q->in[1]) continue;                                        \
                    const TI *yr =                                                                 \
                        dy + (((n * q->O + o) * q->out[0] + od) * q->out[1] + oh) * q->out[2];     \
                    const TI *xr =                                                                 \
                        x + (((n * q->C + cin) * q->in[0] + id) * q->in[1] + ih) * q->in[2];       \
                    acc += dot_row_##SFX(yr, xr, lo, hi, q->s[2], off);                            \
                }                                                                                  \
            }                                                                                      \
        dw[t] = (T)acc;                                                                            \
    }                                                                                              \
    static void conv_bwd_weight_##SFX(T *dw, const TI *dy, const TI *x, const cgeo *q) {           \
        int64_t nw = q->O * q->Cg * q->k[0] * q->k[1] * q->k[2];                                   \
        double work = (double)nw * (double)(q->N * q->out[0] * q->out[1] * q->out[2]);             \
        _Pragma("omp parallel for schedule(dynamic, 1) if (work >= TS_PAR_MIN)") for (int64_t t =  \
                                                                                          0;       \
                                                                                      t < nw; t++) \
            bwd_weight_one_##SFX(dw, dy, x, q, t);                                                 \
    }

DEF_CONV(float, float, LD_ID, f32)
DEF_CONV(double, double, LD_ID, f64)
DEF_CONV(float, uint16_t, ts_bf16_to_f32, bf16)
DEF_CONV(float, uint16_t, ts_f16_to_f32, f16)

/* Channels-last reference kernels: plain loops, one output element at a
 * time with its terms in a fixed order (the CPU backend runs f32 on
 * oneDNN; these serve f64, checks and reference_kernels). Element (n, d,
 * h, w, c) of a [N, D, H, W, C] tensor with spatial sizes sz. */
static inline int64_t cl_at(const int64_t *sz, int64_t C, int64_t n, int64_t d, int64_t h,
                            int64_t w) {
    return (((n * sz[0] + d) * sz[1] + h) * sz[2] + w) * C;
}

#define DEF_CONV_CL(T, TI, LD, SFX)                                                                \
    /* y[n, od, oh, :, :] for task t over (n, od, oh). */                                          \
    static void fwd_cl_row_##SFX(T *y, const TI *x, const TI *w, const T *b, const cgeo *q,        \
                                 int64_t t) {                                                      \
        int64_t oh = t % q->out[1], od = t / q->out[1] % q->out[0],                                \
                n = t / (q->out[1] * q->out[0]);                                                   \
        for (int64_t ow = 0; ow < q->out[2]; ow++) {                                               \
            T *yv = y + cl_at(q->out, q->O, n, od, oh, ow);                                        \
            for (int64_t o = 0; o < q->O; o++) {                                                   \
                T acc = b ? b[o] : (T)0;                                                           \
                int64_t c0 = o / q->Og * q->Cg;                                                    \
                for (int64_t c = 0; c < q->Cg; c++)                                                \
                    for (int64_t kd = 0; kd < q->k[0]; kd++) {                                     \
                        int64_t id = od * q->s[0] - q->p[0] + kd * q->d[0];                        \
                        if (id < 0 || id >= q->in[0]) continue;                                    \
                        for (int64_t kh = 0; kh < q->k[1]; kh++) {                                 \
                            int64_t ih = oh * q->s[1] - q->p[1] + kh * q->d[1];                    \
                            if (ih < 0 || ih >= q->in[1]) continue;                                \
                            for (int64_t kw = 0; kw < q->k[2]; kw++) {                             \
                                int64_t iw = ow * q->s[2] - q->p[2] + kw * q->d[2];                \
                                if (iw < 0 || iw >= q->in[2]) continue;                            \
                                acc += LD(w[(((o * q->Cg + c) * q->k[0] + kd) * q->k[1] + kh) *    \
                                                q->k[2] +                                          \
                                            kw]) *                                                 \
                                       LD(x[cl_at(q->in, q->C, n, id, ih, iw) + c0 + c]);          \
                            }                                                                      \
                        }                                                                          \
                    }                                                                              \
                yv[o] = acc;                                                                       \
            }                                                                                      \
        }                                                                                          \
    }                                                                                              \
    static void conv_fwd_cl_##SFX(T *y, const TI *x, const TI *w, const T *b, const cgeo *q) {     \
        int64_t rows = q->N * q->out[0] * q->out[1];                                               \
        double work = (double)rows * (double)(q->out[2] * q->O * q->Cg * q->k[0] * q->k[1]);       \
        _Pragma("omp parallel for schedule(static) if (work >= TS_PAR_MIN)") for (int64_t t = 0;   \
                                                                                  t < rows; t++)   \
            fwd_cl_row_##SFX(y, x, w, b, q, t);                                                    \
    }                                                                                              \
    /* dx[n, id, ih, :, :] for task t over (n, id, ih); b: initial value per channel. */           \
    static void bwd_data_cl_row_##SFX(T *dx, const TI *dy, const TI *w, const T *b, const cgeo *q, \
                                      int64_t t) {                                                 \
        int64_t ih = t % q->in[1], id = t / q->in[1] % q->in[0], n = t / (q->in[1] * q->in[0]);    \
        for (int64_t iw = 0; iw < q->in[2]; iw++) {                                                \
            T *xv = dx + cl_at(q->in, q->C, n, id, ih, iw);                                        \
            for (int64_t c = 0; c < q->C; c++) {                                                   \
                T acc = b ? b[c] : (T)0;                                                           \
                int64_t grp = c / q->Cg, cg = c % q->Cg;                                           \
                for (int64_t o = grp * q->Og; o < (grp + 1) * q->Og; o++)                          \
                    for (int64_t kd = 0; kd < q->k[0]; kd++) {                                     \
                        int64_t td = id + q->p[0] - kd * q->d[0];                                  \
                        if (td < 0 || td % q->s[0] || td / q->s[0] >= q->out[0]) continue;         \
                        for (int64_t kh = 0; kh < q->k[1]; kh++) {                                 \
                            int64_t th = ih + q->p[1] - kh * q->d[1];                              \
                            if (th < 0 || th % q->s[1] || th / q->s[1] >= q->out[1]) continue;     \
                            for (int64_t kw = 0; kw < q->k[2]; kw++) {                             \
                                int64_t tw = iw + q->p[2] - kw * q->d[2];                          \
                                if (tw < 0 || tw % q->s[2] || tw / q->s[2] >= q->out[2]) continue; \
                                acc += LD(w[(((o * q->Cg + cg) * q->k[0] + kd) * q->k[1] + kh) *   \
                                                q->k[2] +                                          \
                                            kw]) *                                                 \
                                       LD(dy[cl_at(q->out, q->O, n, td / q->s[0], th / q->s[1],    \
                                                   tw / q->s[2]) +                                 \
                                             o]);                                                  \
                            }                                                                      \
                        }                                                                          \
                    }                                                                              \
                xv[c] = acc;                                                                       \
            }                                                                                      \
        }                                                                                          \
    }                                                                                              \
    static void conv_bwd_data_cl_##SFX(T *dx, const TI *dy, const TI *w, const T *b,               \
                                       const cgeo *q) {                                            \
        int64_t rows = q->N * q->in[0] * q->in[1];                                                 \
        double work = (double)rows * (double)(q->in[2] * q->C * q->Og * q->k[0] * q->k[1]);        \
        _Pragma("omp parallel for schedule(static) if (work >= TS_PAR_MIN)") for (int64_t t = 0;   \
                                                                                  t < rows; t++)   \
            bwd_data_cl_row_##SFX(dx, dy, w, b, q, t);                                             \
    }                                                                                              \
    /* dw[o, c, kd, kh, kw] for task t: every output position, in order. */                        \
    static void bwd_weight_cl_one_##SFX(T *dw, const TI *dy, const TI *x, const cgeo *q,           \
                                        int64_t t) {                                               \
        int64_t kw = t % q->k[2], kh = t / q->k[2] % q->k[1];                                      \
        int64_t kd = t / (q->k[2] * q->k[1]) % q->k[0];                                            \
        int64_t c = t / (q->k[2] * q->k[1] * q->k[0]) % q->Cg;                                     \
        int64_t o = t / (q->k[2] * q->k[1] * q->k[0] * q->Cg);                                     \
        int64_t cin = o / q->Og * q->Cg + c;                                                       \
        double acc = 0;                                                                            \
        for (int64_t n = 0; n < q->N; n++)                                                         \
            for (int64_t od = 0; od < q->out[0]; od++) {                                           \
                int64_t id = od * q->s[0] - q->p[0] + kd * q->d[0];                                \
                if (id < 0 || id >= q->in[0]) continue;                                            \
                for (int64_t oh = 0; oh < q->out[1]; oh++) {                                       \
                    int64_t ih = oh * q->s[1] - q->p[1] + kh * q->d[1];                            \
                    if (ih < 0 || ih >= q->in[1]) continue;                                        \
                    for (int64_t ow = 0; ow < q->out[2]; ow++) {                                   \
                        int64_t iw = ow * q->s[2] - q->p[2] + kw * q->d[2];                        \
                        if (iw < 0 || iw >= q->in[2]) continue;                                    \
                        acc += (double)LD(dy[cl_at(q->out, q->O, n, od, oh, ow) + o]) *            \
                               (double)LD(x[cl_at(q->in, q->C, n, id, ih, iw) + cin]);             \
                    }                                                                              \
                }                                                                                  \
            }                                                                                      \
        dw[t] = (T)acc;                                                                            \
    }                                                                                              \
    static void conv_bwd_weight_cl_##SFX(T *dw, const TI *dy, const TI *x, const cgeo *q) {        \
        int64_t nw = q->O * q->Cg * q->k[0] * q->k[1] * q->k[2];                                   \
        double work = (double)nw * (double)(q->N * q->out[0] * q->out[1] * q->out[2]);             \
        _Pragma("omp parallel for schedule(dynamic, 1) if (work >= TS_PAR_MIN)") for (int64_t t =  \
                                                                                          0;       \
                                                                                      t < nw; t++) \
            bwd_weight_cl_one_##SFX(dw, dy, x, q, t);                                              \
    }

DEF_CONV_CL(float, float, LD_ID, f32)
DEF_CONV_CL(double, double, LD_ID, f64)
DEF_CONV_CL(float, uint16_t, ts_bf16_to_f32, bf16)
DEF_CONV_CL(float, uint16_t, ts_f16_to_f32, f16)

/* The kernels of a mixed-precision node, chosen by the operands' dtype:
 * the same loops as f32's with each operand widened (exactly) where it is
 * read, so the result is bit for bit the f32 kernel's on the operands
 * rounded to bf16/f16. Fails for operand dtypes without one. */
static ts_status low_kernel(const ts_kargs *k, ts_dtype dt, const char *what) {
    if (k->out[0].dtype == TS_F32 && is_low(dt)) return TS_OK;
    return ts_kernel_bad_dtype(k, what, dt);
}

static ts_status k_conv(const ts_kargs *k) {
    const ts_tensor *x = &k->in[0], *w = &k->in[1], *y = &k->out[0];
    const void *b = k->n_in > 2 ? k->in[2].data : NULL;
    cgeo q;
    geo_attrs(&q, k->a);
    const int cl = k->a->conv.channels_last != 0;
    geo_dims(&q, x->dims, w->dims, y->dims, cl);
    if (k->a->conv.low) {
        ts_status s = low_kernel(k, x->dtype, "conv (mixed precision)");
        if (s != TS_OK) return s;
        if (x->dtype == TS_BF16)
            (cl ? conv_fwd_cl_bf16 : conv_fwd_bf16)(y->data, x->data, w->data, b, &q);
        else
            (cl ? conv_fwd_cl_f16 : conv_fwd_f16)(y->data, x->data, w->data, b, &q);
        return TS_OK;
    }
    switch (y->dtype) {
    case TS_F32:
        (cl ? conv_fwd_cl_f32 : conv_fwd_f32)(y->data, x->data, w->data, b, &q);
        return TS_OK;
    case TS_F64:
        (cl ? conv_fwd_cl_f64 : conv_fwd_f64)(y->data, x->data, w->data, b, &q);
        return TS_OK;
    default: return ts_kernel_bad_dtype(k, "conv", y->dtype);
    }
}

/* conv_bwd_data (dy, w) -> dx, and conv_transpose (x, w[, b]) -> y: the
 * same computation with the transposed op's bias as the initial value. */
static ts_status k_conv_bwd_data(const ts_kargs *k) {
    const ts_tensor *dy = &k->in[0], *w = &k->in[1], *dx = &k->out[0];
    const void *b = k->n_in > 2 ? k->in[2].data : NULL;
    cgeo q;
    geo_attrs(&q, k->a);
    const int cl = k->a->conv.channels_last != 0;
    geo_dims(&q, dx->dims, w->dims, dy->dims, cl);
    if (k->a->conv.low) {
        ts_status s = low_kernel(k, dy->dtype, "conv_bwd_data (mixed precision)");
        if (s != TS_OK) return s;
        if (dy->dtype == TS_BF16)
            (cl ? conv_bwd_data_cl_bf16 : conv_bwd_data_bf16)(dx->data, dy->data, w->data, b, &q);
        else
            (cl ? conv_bwd_data_cl_f16 : conv_bwd_data_f16)(dx->data, dy->data, w->data, b, &q);
        return TS_OK;
    }
    switch (dx->dtype) {
    case TS_F32:
        (cl ? conv_bwd_data_cl_f32 : conv_bwd_data_f32)(dx->data, dy->data, w->data, b, &q);
        return TS_OK;
    case TS_F64:
        (cl ? conv_bwd_data_cl_f64 : conv_bwd_data_f64)(dx->data, dy->data, w->data, b, &q);
        return TS_OK;
    default: return ts_kernel_bad_dtype(k, ts_op_get(TS_OP_CONV_BWD_DATA)->name, dx->dtype);
    }
}

static ts_status k_conv_bwd_weight(const ts_kargs *k) {
    const ts_tensor *dy = &k->in[0], *x = &k->in[1], *dw = &k->out[0];
    cgeo q;
    geo_attrs(&q, k->a);
    const int cl = k->a->conv.channels_last != 0;
    geo_dims(&q, x->dims, dw->dims, dy->dims, cl);
    if (k->a->conv.low) {
        ts_status s = low_kernel(k, x->dtype, "conv_bwd_weight (mixed precision)");
        if (s != TS_OK) return s;
        if (x->dtype == TS_BF16)
            (cl ? conv_bwd_weight_cl_bf16 : conv_bwd_weight_bf16)(dw->data, dy->data, x->data, &q);
        else
            (cl ? conv_bwd_weight_cl_f16 : conv_bwd_weight_f16)(dw->data, dy->data, x->data, &q);
        return TS_OK;
    }
    switch (dw->dtype) {
    case TS_F32:
        (cl ? conv_bwd_weight_cl_f32 : conv_bwd_weight_f32)(dw->data, dy->data, x->data, &q);
        return TS_OK;
    case TS_F64:
        (cl ? conv_bwd_weight_cl_f64 : conv_bwd_weight_f64)(dw->data, dy->data, x->data, &q);
        return TS_OK;
    default: return ts_kernel_bad_dtype(k, "conv_bwd_weight", dw->dtype);
    }
}

/* 2 flops per multiply-add: every output of the forward conv takes
 * C/groups * prod(k) of them, and each backward op does the same count. */
static double conv_macs(const ts_type *act_out, const ts_type *w) {
    double kv = 1;
    for (int j = 2; j < w->rank; j++) kv *= (double)w->dims[j];
    return (double)ts_type_numel(act_out) * (double)w->dims[1] * kv;
}

static double cost_conv(const ts_graph *g, const ts_node *n) {
    return 2 * conv_macs(&g->values[n->out[0]].t, ts_in_type(g, n, 1));
}
/* The forward conv's output is dy (bwd ops) or x (transpose). */
static double cost_conv_bwd_data(const ts_graph *g, const ts_node *n) {
    return 2 * conv_macs(ts_in_type(g, n, 0), ts_in_type(g, n, 1));
}
static double cost_conv_bwd_weight(const ts_graph *g, const ts_node *n) {
    return 2 * conv_macs(ts_in_type(g, n, 0), &g->values[n->out[0]].t);
}

const ts_op_def ts_def_conv = {.name = "conv",
                               .min_in = 2,
                               .max_in = 3,
                               .infer = infer_conv,
                               .grad = grad_conv,
                               .kernel = k_conv,
                               .cost = cost_conv};

const ts_op_def ts_def_conv_bwd_data = {.name = "conv_bwd_data",
                                        .min_in = 2,
                                        .max_in = 2,
                                        .infer = infer_conv_bwd_data,
                                        .grad = grad_conv_bwd_data,
                                        .kernel = k_conv_bwd_data,
                                        .cost = cost_conv_bwd_data};

const ts_op_def ts_def_conv_bwd_weight = {.name = "conv_bwd_weight",
                                          .min_in = 2,
                                          .max_in = 2,
                                          .infer = infer_conv_bwd_weight,
                                          .grad = grad_conv_bwd_weight,
                                          .kernel = k_conv_bwd_weight,
                                          .cost = cost_conv_bwd_weight};

const ts_op_def ts_def_conv_transpose = {.name = "conv_transpose",
                                         .min_in = 2,
                                         .max_in = 3,
                                         .infer = infer_conv_transpose,
                                         .grad = grad_conv_transpose,
                                         .kernel = k_conv_bwd_data,
                                         .cost = cost_conv_bwd_data};

/* ---- builders ----------------------------------------------------------- */

/* Set nd and the per-dim triples; NULL arrays take torch's defaults.
 * Values that do not fit the attributes fail here with the builder's name. */
static int pack_conv(ts_graph *g, const char *fn, ts_attrs *at, int nd, const int64_t *stride,
                     const int64_t *padding, const int64_t *dilation, int64_t groups) {
    if (nd < 1 || nd > 3) {
        ts_graph_fail(g, TS_ERR_INVALID, "%s: spatial rank must be 1, 2 or 3, got %d", fn, nd);
        return 0;
    }
    *at = ts_attrs_zero();
    at->conv.nd = nd;
    at->conv.groups = groups;
    for (int j = 0; j < nd; j++) {
        at->conv.stride[j] = stride ? stride[j] : 1;
        at->conv.padding[j] = padding ? padding[j] : 0;
        at->conv.dilation[j] = dilation ? dilation[j] : 1;
    }
    return 1;
}

ts_val ts_conv(ts_graph *g, ts_val x, ts_val w, ts_val b, int nd, const int64_t *stride,
               const int64_t *padding, const int64_t *dilation, int64_t groups) {
    return ts_conv_layout(g, x, w, b, nd, stride, padding, dilation, groups, TS_CHANNELS_FIRST);
}

ts_val ts_conv_layout(ts_graph *g, ts_val x, ts_val w, ts_val b, int nd, const int64_t *stride,
                      const int64_t *padding, const int64_t *dilation, int64_t groups,
                      ts_layout layout) {
    /* TS_NONE for b means "no bias": with a sticky error pending we return
     * before it could be mistaken for that. */
    if (!g || g->status != TS_OK || !ts_val_ok(x) || !ts_val_ok(w)) return TS_NONE;
    ts_attrs at;
    if (!pack_conv(g, "conv", &at, nd, stride, padding, dilation, groups)) return TS_NONE;
    at.conv.channels_last = layout == TS_CHANNELS_LAST;
    ts_val in[3] = {x, w, b};
    return ts_node_add(g, TS_OP_CONV, ts_val_ok(b) ? 3 : 2, in, &at, NULL);
}

ts_val ts_conv_transpose(ts_graph *g, ts_val x, ts_val w, ts_val b, int nd, const int64_t *stride,
                         const int64_t *padding, const int64_t *output_padding, int64_t groups) {
    return ts_conv_transpose_layout(g, x, w, b, nd, stride, padding, output_padding, groups,
                                    TS_CHANNELS_FIRST);
}

ts_val ts_conv_transpose_layout(ts_graph *g, ts_val x, ts_val w, ts_val b, int nd,
                                const int64_t *stride, const int64_t *padding,
                                const int64_t *output_padding, int64_t groups, ts_layout layout) {
    if (!g || g->status != TS_OK || !ts_val_ok(x) || !ts_val_ok(w)) return TS_NONE;
    ts_attrs at;
    if (!pack_conv(g, "conv_transpose", &at, nd, stride, padding, NULL, groups)) return TS_NONE;
    at.conv.channels_last = layout == TS_CHANNELS_LAST;
    for (int j = 0; output_padding && j < nd; j++) {
        if (output_padding[j] < 0 || output_padding[j] > FIELD_MAX)
            return ts_graph_fail(g, TS_ERR_INVALID,
                                 "conv_transpose: output_padding[%d] = %lld is out of range", j,
                                 (long long)output_padding[j]);
        at.conv.extra[j] = output_padding[j];
    }
    ts_val in[3] = {x, w, b};
    return ts_node_add(g, TS_OP_CONV_TRANSPOSE, ts_val_ok(b) ? 3 : 2, in, &at, NULL);
}
