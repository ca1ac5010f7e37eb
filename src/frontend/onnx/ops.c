/* One ONNX node onto the builder API. Each op names the attributes it
 * understands; any other attribute, or a value tessel cannot honour, is a
 * refusal naming it (onnx_refuse), never silently ignored. Shape-only ops
 * on constants (Constant, Shape, Reshape's shape) are folded here. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "core/core.h"
#include "frontend/onnx/onnx_internal.h"

typedef const Onnx__NodeProto node;

static const Onnx__AttributeProto *attr(node *n, const char *name) {
    for (size_t i = 0; i < n->n_attribute; i++)
        if (!strcmp(n->attribute[i]->name, name)) return n->attribute[i];
    return NULL;
}
static int64_t attr_i(node *n, const char *name, int64_t dflt) {
    const Onnx__AttributeProto *a = attr(n, name);
    return a ? a->i : dflt;
}
static double attr_f(node *n, const char *name, double dflt) {
    const Onnx__AttributeProto *a = attr(n, name);
    return a ? a->f : dflt;
}
/* An ints attribute into v[max]; returns its length, 0 if absent, -1 if too long. */
static int attr_ints(node *n, const char *name, int64_t *v, int max) {
    const Onnx__AttributeProto *a = attr(n, name);
    if (!a) return 0;
    if ((int)a->n_ints > max) return -1;
    for (size_t i = 0; i < a->n_ints; i++) v[i] = a->ints[i];
    return (int)a->n_ints;
}

/* Refuses the first attribute of n not in `known` (space separated). */
static ts_status only_attrs(onnx_ctx *x, node *n, const char *known) {
    for (size_t i = 0; i < n->n_attribute; i++) {
        const char *a = n->attribute[i]->name;
        const size_t len = strlen(a);
        int found = 0;
        for (const char *p = known; *p && !found;) {
            const size_t w = strcspn(p, " ");
            found = w == len && !strncmp(p, a, len);
            p += w + (p[w] == ' ');
        }
        if (!found) return onnx_refuse(x, n, "attribute '%s' is not supported", a);
    }
    return TS_OK;
}

static ts_val in(onnx_ctx *x, node *n, size_t k) {
    return k < n->n_input && n->input[k][0] ? onnx_get(x, n->input[k]) : TS_NONE;
}
static const onnx_const *in_const(onnx_ctx *x, node *n, size_t k) {
    const onnx_value *e = k < n->n_input ? onnx_find(x, n->input[k]) : NULL;
    return e ? e->c : NULL;
}
static ts_status out(onnx_ctx *x, node *n, ts_val v) {
    if (n->n_output < 1) return onnx_refuse(x, n, "no output");
    if (!ts_val_ok(v)) return ts_graph_status(x->g) != TS_OK ? ts_graph_status(x->g) : TS_OK;
    return onnx_define(x, n->output[0], v, NULL);
}
static ts_status out_const(onnx_ctx *x, node *n, onnx_const *c) {
    if (n->n_output < 1) {
        onnx_const_free(c);
        return onnx_refuse(x, n, "no output");
    }
    return onnx_define(x, n->output[0], TS_NONE, c);
}
static onnx_const *new_i64(int rank, const int64_t *dims, int64_t count) {
    onnx_const *c = calloc(1, sizeof *c);
    if (!c) return NULL;
    c->dtype = TS_I64, c->rank = rank, c->n = count;
    for (int k = 0; k < rank; k++) c->dims[k] = dims[k];
    c->i = calloc((size_t)(count ? count : 1), sizeof(int64_t));
    if (!c->i) {
        free(c);
        return NULL;
    }
    return c;
}

static ts_status need_inputs(onnx_ctx *x, node *n, size_t lo, size_t hi) {
    if (n->n_input < lo || n->n_input > hi)
        return onnx_refuse(x, n, "has %zu inputs (expected %zu to %zu)", n->n_input, lo, hi);
    return TS_OK;
}

/* ---- ops ----------------------------------------------------------------- */

static ts_status gemm(onnx_ctx *x, node *n) {
    ts_status s;
    if ((s = only_attrs(x, n, "alpha beta transA transB")) || (s = need_inputs(x, n, 2, 3)))
        return s;
    const double alpha = attr_f(n, "alpha", 1), beta = attr_f(n, "beta", 1);
    const int ta = attr_i(n, "transA", 0) != 0, tb = attr_i(n, "transB", 0) != 0;
    ts_val a = in(x, n, 0), b = in(x, n, 1), c = in(x, n, 2);
    /* torch's nn.Linear: one fused linear op. */
    if (!ta && tb && alpha == 1 && beta == 1 && (!ts_val_ok(c) || ts_rank(x->g, c) == 1))
        return out(x, n, ts_linear(x->g, a, b, c));
    ts_val y = ts_matmul(x->g, a, b, ta, tb);
    if (alpha != 1) y = ts_affine_scalar(x->g, y, alpha, 0);
    if (ts_val_ok(c)) y = ts_add(x->g, y, beta == 1 ? c : ts_affine_scalar(x->g, c, beta, 0));
    return out(x, n, y);
}

static ts_status matmul(onnx_ctx *x, node *n) {
    ts_status s;
    if ((s = only_attrs(x, n, "")) || (s = need_inputs(x, n, 2, 2))) return s;
    int fused = 0;
    if ((s = onnx_attention(x, n, &fused)) != TS_OK || fused) return s;
    ts_val a = in(x, n, 0), b = in(x, n, 1);
    if (ts_rank(x->g, a) < 2 || ts_rank(x->g, b) < 2)
        return onnx_refuse(x, n, "a rank-1 operand is not supported");
    return out(x, n, ts_matmul(x->g, a, b, 0, 0));
}

static ts_status binary(onnx_ctx *x, node *n) {
    ts_status s;
    if ((s = only_attrs(x, n, "")) || (s = need_inputs(x, n, 2, 2))) return s;
    ts_val a = in(x, n, 0), b = in(x, n, 1);
    const char *op = n->op_type;
    ts_val y = !strcmp(op, "Add")   ? ts_add(x->g, a, b)
               : !strcmp(op, "Sub") ? ts_sub(x->g, a, b)
               : !strcmp(op, "Mul") ? ts_mul(x->g, a, b)
                                    : ts_div(x->g, a, b);
    return out(x, n, y);
}

static ts_status unary(onnx_ctx *x, node *n) {
    ts_status s;
    if ((s = only_attrs(x, n, "")) || (s = need_inputs(x, n, 1, 1))) return s;
    int fused = 0;
    if (!strcmp(n->op_type, "Tanh") && ((s = onnx_gelu_tanh(x, n, &fused)) != TS_OK || fused))
        return s;
    ts_val a = in(x, n, 0);
    const char *op = n->op_type;
    ts_val y = !strcmp(op, "Relu")      ? ts_relu(x->g, a)
               : !strcmp(op, "Sigmoid") ? ts_sigmoid(x->g, a)
               : !strcmp(op, "Tanh")    ? ts_tanh(x->g, a)
                                        : a; /* Identity */
    return out(x, n, y);
}

static ts_status softmax(onnx_ctx *x, node *n) {
    ts_status s;
    if ((s = only_attrs(x, n, "axis")) || (s = need_inputs(x, n, 1, 1))) return s;
    const int axis = (int)attr_i(n, "axis", -1);
    ts_val a = in(x, n, 0);
    return out(x, n,
               n->op_type[0] == 'L' ? ts_log_softmax(x->g, a, axis) : ts_softmax(x->g, a, axis));
}

/* Dropout: the ratio (input 1, a constant; default 0.5) applies in training
 * steps as torch's train mode; training_mode (input 2) is not read. */
static ts_status dropout(onnx_ctx *x, node *n) {
    ts_status s;
    if ((s = only_attrs(x, n, "seed")) || (s = need_inputs(x, n, 1, 3))) return s;
    double p = 0.5;
    if (n->n_input > 1 && n->input[1][0]) {
        const onnx_value *e = onnx_find(x, n->input[1]);
        const onnx_const *c = e ? e->c : NULL;
        if (!c || c->n != 1) return onnx_refuse(x, n, "the ratio must be a constant scalar");
        p = c->f ? c->f[0] : (double)c->i[0];
    }
    if (n->n_output > 1 && n->output[1][0])
        return onnx_refuse(x, n, "the mask output is not supported");
    return out(x, n, p > 0 ? ts_dropout(x->g, in(x, n, 0), p) : in(x, n, 0));
}

/* Conv and pooling: kernel, strides, symmetric pads and dilations of nd
 * spatial dims. */
typedef struct window {
    int nd;
    int64_t k[3], stride[3], pad[3], dil[3];
} window;

static ts_status window_of(onnx_ctx *x, node *n, int nd, window *w) {
    w->nd = nd;
    int64_t pads[6] = {0}, v[3];
    for (int i = 0; i < 3; i++) w->k[i] = 0, w->stride[i] = 1, w->pad[i] = 0, w->dil[i] = 1;
    const Onnx__AttributeProto *ap = attr(n, "auto_pad");
    if (ap && ap->has_s && ap->s.len && !(ap->s.len == 6 && !memcmp(ap->s.data, "NOTSET", 6)))
        return onnx_refuse(x, n, "auto_pad '%.*s' is not supported (explicit pads only)",
                           (int)ap->s.len, (const char *)ap->s.data);
    int m = attr_ints(n, "kernel_shape", v, 3);
    if (m < 0 || (m && m != nd)) return onnx_refuse(x, n, "kernel_shape must have %d values", nd);
    for (int i = 0; i < m; i++) w->k[i] = v[i];
    if ((m = attr_ints(n, "strides", v, 3)) < 0 || (m && m != nd))
        return onnx_refuse(x, n, "strides must have %d values", nd);
    for (int i = 0; i < m; i++) w->stride[i] = v[i];
    if ((m = attr_ints(n, "dilations", v, 3)) < 0 || (m && m != nd))
        return onnx_refuse(x, n, "dilations must have %d values", nd);
    for (int i = 0; i < m; i++) w->dil[i] = v[i];
    if ((m = attr_ints(n, "pads", pads, 6)) < 0 || (m && m != 2 * nd))
        return onnx_refuse(x, n, "pads must have %d values", 2 * nd);
    for (int i = 0; i < nd; i++) {
        if (pads[i] != pads[nd + i])
            return onnx_refuse(x, n,
                               "asymmetric pads (%lld before, %lld after on spatial axis %d) "
                               "are not supported",
                               (long long)pads[i], (long long)pads[nd + i], i);
        w->pad[i] = pads[i];
    }
    return TS_OK;
}

static int spatial(onnx_ctx *x, node *n) {
    const int r = ts_rank(x->g, in(x, n, 0)) - 2;
    return r >= 1 && r <= 3 ? r : -1;
}

static ts_status conv(onnx_ctx *x, node *n) {
    ts_status s;
    if ((s = only_attrs(x, n, "auto_pad dilations group kernel_shape pads strides")) ||
        (s = need_inputs(x, n, 2, 3)))
        return s;
    const int nd = spatial(x, n);
    if (nd < 0) return onnx_refuse(x, n, "input must have 1 to 3 spatial dims");
    window w;
    if ((s = window_of(x, n, nd, &w))) return s;
    return out(x, n,
               ts_conv(x->g, in(x, n, 0), in(x, n, 1), in(x, n, 2), nd, w.stride, w.pad, w.dil,
                       attr_i(n, "group", 1)));
}

static ts_status pool(onnx_ctx *x, node *n) {
    ts_status s;
    const int is_max = n->op_type[0] == 'M';
    if ((s = only_attrs(x, n,
                        is_max
                            ? "auto_pad ceil_mode dilations kernel_shape pads storage_order "
                              "strides"
                            : "auto_pad ceil_mode count_include_pad kernel_shape pads strides")) ||
        (s = need_inputs(x, n, 1, 1)))
        return s;
    if (attr_i(n, "ceil_mode", 0)) return onnx_refuse(x, n, "ceil_mode 1 is not supported");
    if (attr_i(n, "storage_order", 0)) return onnx_refuse(x, n, "storage_order 1 is not supported");
    if (n->n_output > 1) return onnx_refuse(x, n, "the Indices output is not supported");
    const int nd = spatial(x, n);
    if (nd < 0) return onnx_refuse(x, n, "input must have 1 to 3 spatial dims");
    window w;
    if ((s = window_of(x, n, nd, &w))) return s;
    for (int i = 0; i < nd; i++)
        if (w.dil[i] != 1) return onnx_refuse(x, n, "dilations other than 1 are not supported");
    ts_val a = in(x, n, 0);
    return out(x, n,
               is_max ? ts_max_pool(x->g, a, nd, w.k, w.stride, w.pad)
                      : ts_avg_pool(x->g, a, nd, w.k, w.stride, w.pad,
                                    (int)attr_i(n, "count_include_pad", 0)));
}

static ts_status global_avg_pool(onnx_ctx *x, node *n) {
    ts_status s;
    if ((s = only_attrs(x, n, "")) || (s = need_inputs(x, n, 1, 1))) return s;
    const int nd = spatial(x, n);
    if (nd < 0) return onnx_refuse(x, n, "input must have 1 to 3 spatial dims");
    int axes[3] = {2, 3, 4};
    return out(x, n, ts_mean(x->g, in(x, n, 0), nd, axes, 1));
}

static ts_status flatten(onnx_ctx *x, node *n) {
    ts_status s;
    if ((s = only_attrs(x, n, "axis")) || (s = need_inputs(x, n, 1, 1))) return s;
    ts_val a = in(x, n, 0);
    const int r = ts_rank(x->g, a);
    int axis = (int)attr_i(n, "axis", 1);
    if (axis < 0) axis += r;
    if (axis < 0 || axis > r) return onnx_refuse(x, n, "axis %d out of range for rank %d", axis, r);
    int64_t d[2] = {1, 1};
    for (int k = 0; k < r; k++) d[k >= axis] *= ts_dim(x->g, a, k);
    return out(x, n, ts_reshape(x->g, a, 2, d));
}

static ts_status reshape(onnx_ctx *x, node *n) {
    ts_status s;
    if ((s = only_attrs(x, n, "allowzero")) || (s = need_inputs(x, n, 2, 2))) return s;
    const onnx_const *c = in_const(x, n, 1);
    if (!c || !c->i || c->rank != 1 || c->n > TS_MAX_RANK)
        return onnx_refuse(x, n, "the shape must be a constant int64 vector (static shapes)");
    if (attr_i(n, "allowzero", 0)) return onnx_refuse(x, n, "allowzero 1 is not supported");
    ts_val a = in(x, n, 0);
    int64_t d[TS_MAX_RANK];
    for (int k = 0; k < c->n; k++) d[k] = c->i[k] == 0 ? ts_dim(x->g, a, k) : c->i[k];
    return out(x, n, ts_reshape(x->g, a, (int)c->n, d));
}

static ts_status transpose(onnx_ctx *x, node *n) {
    ts_status s;
    if ((s = only_attrs(x, n, "perm")) || (s = need_inputs(x, n, 1, 1))) return s;
    ts_val a = in(x, n, 0);
    const int r = ts_rank(x->g, a);
    int64_t p[TS_MAX_RANK];
    const int m = attr_ints(n, "perm", p, TS_MAX_RANK);
    if (m < 0 || (m && m != r)) return onnx_refuse(x, n, "perm must have %d values", r);
    int perm[TS_MAX_RANK];
    for (int k = 0; k < r; k++) perm[k] = m ? (int)p[k] : r - 1 - k;
    return out(x, n, ts_permute(x->g, a, perm));
}

static ts_status constant(onnx_ctx *x, node *n) {
    ts_status s;
    if ((s = only_attrs(x, n, "value value_float value_floats value_int value_ints")) ||
        (s = need_inputs(x, n, 0, 0)))
        return s;
    if (n->n_attribute != 1) return onnx_refuse(x, n, "needs exactly one value attribute");
    const Onnx__AttributeProto *a = n->attribute[0];
    onnx_const *c = calloc(1, sizeof *c);
    if (!c) return ts_fail(TS_ERR_NOMEM, "onnx: out of memory");
    if (!strcmp(a->name, "value")) {
        if (!a->t) {
            free(c);
            return onnx_refuse(x, n, "value holds no tensor");
        }
        if ((s = onnx_tensor_read(a->t, x->dir, c)) != TS_OK) {
            onnx_const_free(c);
            return s == TS_ERR_UNSUPPORTED ? onnx_refuse(x, n, "%s", ts_last_error()) : s;
        }
        return out_const(x, n, c);
    }
    const int floats = !strncmp(a->name, "value_float", 11),
              many = a->name[strlen(a->name) - 1] == 's';
    const size_t cnt = many ? (floats ? a->n_floats : a->n_ints) : 1;
    c->rank = many, c->dims[0] = (int64_t)cnt, c->n = (int64_t)cnt;
    c->dtype = floats ? TS_F32 : TS_I64;
    if (floats)
        c->f = malloc((cnt ? cnt : 1) * sizeof(float));
    else
        c->i = malloc((cnt ? cnt : 1) * sizeof(int64_t));
    if (!c->f && !c->i) {
        free(c);
        return ts_fail(TS_ERR_NOMEM, "onnx: out of memory");
    }
    for (size_t k = 0; k < cnt; k++) {
        if (floats)
            c->f[k] = many ? a->floats[k] : a->f;
        else
            c->i[k] = many ? a->ints[k] : a->i;
    }
    return out_const(x, n, c);
}

static ts_status shape(onnx_ctx *x, node *n) {
    ts_status s;
    if ((s = only_attrs(x, n, "start end")) || (s = need_inputs(x, n, 1, 1))) return s;
    ts_val a = in(x, n, 0);
    const int r = ts_rank(x->g, a);
    int64_t start = attr_i(n, "start", 0), end = attr_i(n, "end", r);
    if (start < 0) start += r;
    if (end < 0) end += r;
    start = start < 0 ? 0 : start > r ? r : start;
    end = end < start ? start : end > r ? r : end;
    const int64_t len = end - start;
    onnx_const *c = new_i64(1, &len, len);
    if (!c) return ts_fail(TS_ERR_NOMEM, "onnx: out of memory");
    for (int64_t k = 0; k < len; k++) c->i[k] = ts_dim(x->g, a, (int)(start + k));
    return out_const(x, n, c);
}

/* Pad: torch exports AvgPool2d(count_include_pad=True) as a Pad of zeros
 * before AveragePool; zero pads are the identity. Other pads are refused. */
static ts_status pad(onnx_ctx *x, node *n) {
    ts_status s;
    if ((s = only_attrs(x, n, "mode")) || (s = need_inputs(x, n, 1, 4))) return s;
    const onnx_const *c = in_const(x, n, 1);
    if (n->n_input > 1 && n->input[1][0] && (!c || !c->i))
        return onnx_refuse(x, n, "the pads must be a constant int64 vector");
    for (int64_t k = 0; c && k < c->n; k++)
        if (c->i[k] != 0) return onnx_refuse(x, n, "non-zero pads are not supported");
    return out(x, n, in(x, n, 0));
}

static ts_status leaky_relu(onnx_ctx *x, node *n) {
    ts_status s;
    if ((s = only_attrs(x, n, "alpha")) || (s = need_inputs(x, n, 1, 1))) return s;
    return out(x, n, ts_leaky_relu(x->g, in(x, n, 0), attr_f(n, "alpha", 0.01)));
}

/* torch's nn.LayerNorm (and tessel's export of it): over the last axis. */
static ts_status layer_norm(onnx_ctx *x, node *n) {
    ts_status s;
    if ((s = only_attrs(x, n, "axis epsilon stash_type")) || (s = need_inputs(x, n, 2, 3)))
        return s;
    for (size_t k = 1; k < n->n_output; k++)
        if (n->output[k][0])
            return onnx_refuse(x, n, "the Mean and InvStdDev outputs are not supported");
    ts_val a = in(x, n, 0);
    const int r = ts_rank(x->g, a);
    const int64_t axis = attr_i(n, "axis", -1);
    if (axis != -1 && axis != r - 1)
        return onnx_refuse(x, n, "axis %lld: only the last axis is normalised", (long long)axis);
    if (attr_i(n, "stash_type", 1) != 1)
        return onnx_refuse(x, n, "stash_type must be 1 (float32 statistics)");
    return out(x, n, ts_layer_norm(x->g, a, in(x, n, 1), in(x, n, 2), attr_f(n, "epsilon", 1e-5)));
}

typedef struct op_entry {
    const char *name;
    ts_status (*fn)(onnx_ctx *, node *);
} op_entry;

static const op_entry ops[] = {
    {"Gemm", gemm},
    {"MatMul", matmul},
    {"Add", binary},
    {"Sub", binary},
    {"Mul", binary},
    {"Div", binary},
    {"Relu", unary},
    {"Sigmoid", unary},
    {"Tanh", unary},
    {"Identity", unary},
    {"Softmax", softmax},
    {"LogSoftmax", softmax},
    {"Dropout", dropout},
    {"Conv", conv},
    {"MaxPool", pool},
    {"AveragePool", pool},
    {"GlobalAveragePool", global_avg_pool},
    {"Flatten", flatten},
    {"Reshape", reshape},
    {"Transpose", transpose},
    {"Constant", constant},
    {"Shape", shape},
    {"Pad", pad},
    {"LayerNormalization", layer_norm},
    {"LeakyRelu", leaky_relu},
    {"Erf", onnx_gelu_erf},
    {"GRU", onnx_op_rnn},
    {"LSTM", onnx_op_rnn},
};

ts_status onnx_import_node(onnx_ctx *x, node *n) {
    if (n->domain && n->domain[0] && strcmp(n->domain, "ai.onnx"))
        return onnx_refuse(x, n, "domain '%s' is not supported", n->domain);
    int done = 0;
    ts_status s = onnx_fold(x, n, &done);
    if (done || s != TS_OK) return s;
    for (size_t i = 0; i < sizeof ops / sizeof ops[0]; i++)
        if (!strcmp(ops[i].name, n->op_type)) return ops[i].fn(x, n);
    if ((s = onnx_op_more(x, n, &done)) != TS_OK || done) return s;
    return onnx_refuse(x, n, "op type '%s' is not supported", n->op_type);
}

/* ---- shared with the other op files (onnx_internal.h) ------------------ */

const Onnx__AttributeProto *onnx_attr(node *n, const char *name) {
    return attr(n, name);
}
int64_t onnx_attr_i(node *n, const char *name, int64_t dflt) {
    return attr_i(n, name, dflt);
}
double onnx_attr_f(node *n, const char *name, double dflt) {
    return attr_f(n, name, dflt);
}
int onnx_attr_ints(node *n, const char *name, int64_t *v, int max) {
    return attr_ints(n, name, v, max);
}
ts_status onnx_only_attrs(onnx_ctx *x, node *n, const char *known) {
    return only_attrs(x, n, known);
}
ts_status onnx_need_inputs(onnx_ctx *x, node *n, size_t lo, size_t hi) {
    return need_inputs(x, n, lo, hi);
}
ts_val onnx_in(onnx_ctx *x, node *n, size_t k) {
    return in(x, n, k);
}
ts_status onnx_out(onnx_ctx *x, node *n, ts_val v) {
    return out(x, n, v);
}
