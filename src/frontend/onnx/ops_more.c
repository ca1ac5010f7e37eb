/* The second half of the op table (ops.c has the first): elementwise math,
 * GELU, batch norm, transposed convolution, the shape and indexing ops on
 * graph values, reductions and casts. As in ops.c, an attribute or value
 * tessel cannot honour is a refusal naming it. Nodes whose inputs are all
 * constants never get here (fold.c computes them). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "core/core.h"
#include "frontend/onnx/onnx_internal.h"
#include "ir/ir.h"
#include "ops/op.h"

typedef const Onnx__NodeProto node;

int onnx_slice_bounds(onnx_ctx *x, node *n, int rank, const int64_t *dims, int64_t *lo,
                      int64_t *step, int64_t *cnt);

#define IN(k) onnx_in(x, n, k)

static ts_status plain(onnx_ctx *x, node *n, size_t lo, size_t hi, const char *attrs) {
    ts_status s;
    if ((s = onnx_only_attrs(x, n, attrs)) || (s = onnx_need_inputs(x, n, lo, hi))) return s;
    return TS_OK;
}

static ts_status unary(onnx_ctx *x, node *n) {
    ts_status s;
    if ((s = plain(x, n, 1, 1, ""))) return s;
    const char *op = n->op_type;
    ts_val a = IN(0);
    ts_val y = !strcmp(op, "Neg")    ? ts_neg(x->g, a)
               : !strcmp(op, "Exp")  ? ts_exp(x->g, a)
               : !strcmp(op, "Log")  ? ts_log(x->g, a)
               : !strcmp(op, "Sqrt") ? ts_sqrt(x->g, a)
                                     : ts_abs(x->g, a);
    return onnx_out(x, n, y);
}

/* Pow by a constant scalar exponent (torch.pow(x, 3.0), x ** 2). */
static ts_status pow_(onnx_ctx *x, node *n) {
    ts_status s;
    if ((s = plain(x, n, 2, 2, ""))) return s;
    const onnx_const *e = onnx_const_of(x, n->input[1]);
    if (!e || e->n != 1) return onnx_refuse(x, n, "the exponent must be a constant scalar");
    return onnx_out(x, n, ts_pow_scalar(x->g, IN(0), onnx_const_at(e, 0)));
}

/* Gelu (opset 20, read at any opset as onnxruntime does). */
static ts_status gelu(onnx_ctx *x, node *n) {
    ts_status s;
    if ((s = plain(x, n, 1, 1, "approximate"))) return s;
    const Onnx__AttributeProto *a = onnx_attr(n, "approximate");
    int tanh_ = 0;
    if (a && a->has_s) {
        if (a->s.len == 4 && !memcmp(a->s.data, "tanh", 4))
            tanh_ = 1;
        else if (!(a->s.len == 4 && !memcmp(a->s.data, "none", 4)))
            return onnx_refuse(x, n, "approximate '%.*s' (none or tanh)", (int)a->s.len,
                               (const char *)a->s.data);
    }
    return onnx_out(x, n, ts_gelu(x->g, IN(0), tanh_ ? TS_GELU_TANH : TS_GELU_ERF));
}

/* BatchNormalization: scale / B are the parameters, input_mean / input_var
 * the running statistics (read as data: their initialisers' values start
 * tessel's state "<prefix>.running_mean" / "running_var", prefix from the
 * mean's name, so a torch export's "bn.running_mean" keeps its name). The
 * plan's mode picks batch or running statistics as torch's train / eval
 * modes do; torch writes momentum as 1 - its own. */
static ts_status batch_norm(onnx_ctx *x, node *n) {
    ts_status s;
    if ((s = plain(x, n, 5, 5, "epsilon momentum training_mode"))) return s;
    const onnx_const *mean = onnx_const_of(x, n->input[3]), *var = onnx_const_of(x, n->input[4]);
    const onnx_value *mv = onnx_find(x, n->input[3]), *vv = onnx_find(x, n->input[4]);
    if (!mv || !vv || !mv->c || !vv->c || !mv->c->f || !vv->c->f)
        return onnx_refuse(x, n, "the running mean and variance must be float initialisers");
    (void)mean, (void)var;
    char prefix[256];
    const char *mn = n->input[3];
    const size_t len = strlen(mn);
    const char *suf = ".running_mean";
    if (len > strlen(suf) && !strcmp(mn + len - strlen(suf), suf))
        snprintf(prefix, sizeof prefix, "%.*s", (int)(len - strlen(suf)), mn);
    else
        snprintf(prefix, sizeof prefix, "%s", n->name && n->name[0] ? n->name : mn);
    const double momentum = 1.0 - onnx_attr_f(n, "momentum", 0.9);
    ts_val y =
        ts_batch_norm(x->g, IN(0), IN(1), IN(2), prefix, momentum, onnx_attr_f(n, "epsilon", 1e-5));
    if (!ts_val_ok(y)) return onnx_out(x, n, y);
    /* The file's running statistics as the state's initial values. */
    const onnx_const *st[2] = {mv->c, vv->c};
    const char *which[2] = {"running_mean", "running_var"};
    for (int k = 0; k < 2; k++) {
        char name[300];
        snprintf(name, sizeof name, "%s.%s", prefix, which[k]);
        ts_val sv = ts_find(x->g, name);
        if (!ts_val_ok(sv) || ts_numel(x->g, sv) != st[k]->n)
            return onnx_refuse(x, n, "%s has %lld values for %lld channels", n->input[3 + k],
                               (long long)st[k]->n, (long long)ts_numel(x->g, sv));
        ts_value *v = &x->g->values[sv.id];
        v->data = ts_alloc((size_t)st[k]->n * sizeof(float), "onnx running statistics");
        if (!v->data) return ts_fail(TS_ERR_NOMEM, "onnx: out of memory");
        memcpy(v->data, st[k]->f, (size_t)st[k]->n * sizeof(float));
        v->init = ts_init_buffer(NULL);
    }
    /* The updated running statistics (training_mode outputs) are tessel's
     * state; nothing in a torch export reads them. */
    for (size_t k = 1; k < n->n_output; k++)
        if (n->output[k][0]) {
            long first;
            if (onnx_consumers(x, n->output[k], &first))
                return onnx_refuse(x, n, "output %zu (the updated statistics) is read", k);
        }
    return onnx_out(x, n, y);
}

static ts_status conv_transpose(onnx_ctx *x, node *n) {
    ts_status s;
    if ((s = plain(x, n, 2, 3,
                   "auto_pad dilations group kernel_shape output_padding pads strides")))
        return s;
    const int nd = ts_rank(x->g, IN(0)) - 2;
    if (nd < 1 || nd > 3) return onnx_refuse(x, n, "input must have 1 to 3 spatial dims");
    const Onnx__AttributeProto *ap = onnx_attr(n, "auto_pad");
    if (ap && ap->has_s && ap->s.len && !(ap->s.len == 6 && !memcmp(ap->s.data, "NOTSET", 6)))
        return onnx_refuse(x, n, "auto_pad is not supported (explicit pads only)");
    int64_t stride[3] = {1, 1, 1}, pad[6] = {0}, opad[3] = {0}, dil[3] = {1, 1, 1}, v[6];
    int m;
    if ((m = onnx_attr_ints(n, "strides", v, 3)) < 0 || (m && m != nd))
        return onnx_refuse(x, n, "strides must have %d values", nd);
    for (int i = 0; i < m; i++) stride[i] = v[i];
    if ((m = onnx_attr_ints(n, "dilations", v, 3)) < 0 || (m && m != nd))
        return onnx_refuse(x, n, "dilations must have %d values", nd);
    for (int i = 0; i < m; i++) dil[i] = v[i];
    for (int i = 0; i < nd; i++)
        if (dil[i] != 1) return onnx_refuse(x, n, "dilations other than 1 are not supported");
    if ((m = onnx_attr_ints(n, "output_padding", v, 3)) < 0 || (m && m != nd))
        return onnx_refuse(x, n, "output_padding must have %d values", nd);
    for (int i = 0; i < m; i++) opad[i] = v[i];
    if ((m = onnx_attr_ints(n, "pads", pad, 6)) < 0 || (m && m != 2 * nd))
        return onnx_refuse(x, n, "pads must have %d values", 2 * nd);
    for (int i = 0; i < nd; i++)
        if (pad[i] != pad[nd + i]) return onnx_refuse(x, n, "asymmetric pads are not supported");
    if (onnx_attr(n, "output_shape")) return onnx_refuse(x, n, "output_shape is not supported");
    return onnx_out(x, n,
                    ts_conv_transpose(x->g, IN(0), IN(1), IN(2), nd, stride, pad, opad,
                                      onnx_attr_i(n, "group", 1)));
}

/* Axes from the attribute (opset < 13) or a constant input 1, in range. */
static int axes(onnx_ctx *x, node *n, int r, int64_t *ax) {
    int m = onnx_attr_ints(n, "axes", ax, TS_MAX_RANK);
    if (n->n_input > 1 && n->input[1][0]) {
        const onnx_const *c = onnx_const_of(x, n->input[1]);
        if (!c || !c->i || c->n > TS_MAX_RANK) return -1;
        m = (int)c->n;
        for (int k = 0; k < m; k++) ax[k] = c->i[k];
    }
    for (int k = 0; k < m; k++) {
        if (ax[k] < 0) ax[k] += r;
        if (ax[k] < 0 || ax[k] >= r) return -1;
    }
    return m;
}

static ts_status squeeze(onnx_ctx *x, node *n) {
    ts_status s;
    if ((s = plain(x, n, 1, 2, "axes"))) return s;
    ts_val a = IN(0);
    const int un = n->op_type[0] == 'U', r0 = ts_rank(x->g, a);
    int64_t ax[TS_MAX_RANK], dims[TS_MAX_RANK];
    int m = onnx_attr_ints(n, "axes", ax, TS_MAX_RANK);
    const onnx_const *c = n->n_input > 1 ? onnx_const_of(x, n->input[1]) : NULL;
    if (c && c->i) m = (int)c->n;
    const int r = un ? r0 + m : r0;
    if (m < 0 || r > TS_MAX_RANK || (n->n_input > 1 && !c) || axes(x, n, r, ax) != m)
        return onnx_refuse(x, n, "the axes must be constant and in range");
    int mark[TS_MAX_RANK] = {0}, o = 0;
    for (int k = 0; k < m; k++) mark[ax[k]] = 1;
    for (int k = 0, j = 0; k < r; k++) {
        if (un) {
            dims[o++] = mark[k] ? 1 : ts_dim(x->g, a, j++);
            continue;
        }
        const int64_t d = ts_dim(x->g, a, k);
        const int drop = m ? mark[k] : d == 1;
        if (drop && d != 1)
            return onnx_refuse(x, n, "axis %d has %lld elements, not 1", k, (long long)d);
        if (!drop) dims[o++] = d;
    }
    return onnx_out(x, n, ts_reshape(x->g, a, o, dims));
}

static ts_status concat(onnx_ctx *x, node *n) {
    ts_status s;
    if ((s = onnx_only_attrs(x, n, "axis"))) return s;
    if (n->n_input < 1 || n->n_input > 64) return onnx_refuse(x, n, "1 to 64 inputs");
    ts_val v[64];
    for (size_t k = 0; k < n->n_input; k++) v[k] = IN(k);
    return onnx_out(x, n, ts_concat(x->g, (int)n->n_input, v, (int)onnx_attr_i(n, "axis", 0)));
}

static ts_status slice(onnx_ctx *x, node *n) {
    ts_status s;
    if ((s = plain(x, n, 3, 5, ""))) return s;
    ts_val a = IN(0);
    const int r = ts_rank(x->g, a);
    int64_t dims[TS_MAX_RANK], lo[TS_MAX_RANK], step[TS_MAX_RANK], cnt[TS_MAX_RANK];
    for (int k = 0; k < r; k++) dims[k] = ts_dim(x->g, a, k);
    if (onnx_slice_bounds(x, n, r, dims, lo, step, cnt))
        return onnx_refuse(x, n, "starts / ends / axes / steps must be constant and in range");
    for (int k = 0; k < r; k++) {
        if (cnt[k] == dims[k] && step[k] == 1) continue;
        if (step[k] != 1) return onnx_refuse(x, n, "steps other than 1 are not supported");
        a = ts_slice(x->g, a, k, lo[k], lo[k] + cnt[k]);
    }
    return onnx_out(x, n, a);
}

static ts_status split(onnx_ctx *x, node *n) {
    ts_status s;
    if ((s = plain(x, n, 1, 2, "axis num_outputs split"))) return s;
    ts_val a = IN(0);
    const int r = ts_rank(x->g, a);
    int axis = (int)onnx_attr_i(n, "axis", 0);
    if (axis < 0) axis += r;
    if (axis < 0 || axis >= r) return onnx_refuse(x, n, "axis out of range");
    const int k = (int)n->n_output;
    if (k < 1 || k > 64) return onnx_refuse(x, n, "1 to 64 outputs");
    int64_t sizes[64];
    const int64_t d = ts_dim(x->g, a, axis);
    int m = onnx_attr_ints(n, "split", sizes, 64);
    if (n->n_input > 1 && n->input[1][0]) {
        const onnx_const *c = onnx_const_of(x, n->input[1]);
        if (!c || !c->i || c->n > 64) return onnx_refuse(x, n, "split must be a constant");
        m = (int)c->n;
        for (int j = 0; j < m; j++) sizes[j] = c->i[j];
    }
    if (m == 0) { /* equal parts, the last smaller (opset 18) */
        const int64_t part = (d + k - 1) / k;
        for (int j = 0; j < k; j++) sizes[j] = j < k - 1 ? part : d - part * (k - 1);
        m = k;
    }
    if (m != k) return onnx_refuse(x, n, "%d split sizes for %d outputs", m, k);
    ts_val outs[64];
    if ((s = ts_split(x->g, a, axis, k, sizes, outs)) != TS_OK)
        return ts_graph_status(x->g) != TS_OK ? TS_OK : onnx_refuse(x, n, "%s", ts_last_error());
    for (int j = 0; j < k; j++)
        if ((s = onnx_define(x, n->output[j], outs[j], NULL)) != TS_OK) return s;
    return TS_OK;
}

/* Gather: an embedding lookup (a float table, integer ids) or a gather of
 * a graph value; constant indices may be negative (counted from the end). */
static ts_status gather(onnx_ctx *x, node *n) {
    ts_status s;
    if ((s = plain(x, n, 2, 2, "axis"))) return s;
    ts_val a = IN(0);
    const int r = ts_rank(x->g, a);
    int axis = (int)onnx_attr_i(n, "axis", 0);
    if (axis < 0) axis += r;
    if (axis < 0 || axis >= r) return onnx_refuse(x, n, "axis out of range");
    const onnx_const *c = onnx_const_of(x, n->input[1]);
    ts_val ix;
    if (c) {
        if (!c->i) return onnx_refuse(x, n, "the indices must be integers");
        onnx_const *t = onnx_const_new(TS_I64, c->rank, c->dims);
        if (!t) return ts_fail(TS_ERR_NOMEM, "onnx: out of memory");
        const int64_t len = ts_dim(x->g, a, axis);
        for (int64_t k = 0; k < c->n; k++) t->i[k] = c->i[k] < 0 ? c->i[k] + len : c->i[k];
        ix = ts_constant(x->g, NULL, TS_I64, t->rank, t->dims, t->i);
        onnx_const_free(t);
    } else {
        ix = IN(1);
    }
    if (axis == 0 && r == 2 && !c) return onnx_out(x, n, ts_embedding(x->g, a, ix));
    return onnx_out(x, n, ts_gather(x->g, a, ix, axis));
}

/* Expand to a constant shape: tessel's expand op (broadcast, no copy of
 * a zeros tensor; its gradient sums back). */
static ts_status expand(onnx_ctx *x, node *n) {
    ts_status s;
    if ((s = plain(x, n, 2, 2, ""))) return s;
    const onnx_const *c = onnx_const_of(x, n->input[1]);
    if (!c || !c->i || c->rank != 1 || c->n > TS_MAX_RANK)
        return onnx_refuse(x, n, "the shape must be a constant int64 vector");
    ts_val a = IN(0);
    const int ra = ts_rank(x->g, a), r = ra > (int)c->n ? ra : (int)c->n;
    ts_attrs at = ts_attrs_zero();
    at.shape.rank = r;
    for (int k = 0; k < r; k++) {
        const int ka = k - (r - ra), kc = k - (r - (int)c->n);
        const int64_t da = ka >= 0 ? ts_dim(x->g, a, ka) : 1, dc = kc >= 0 ? c->i[kc] : 1;
        at.shape.dims[k] = da == 1 ? dc : da;
    }
    return onnx_out(x, n, ts_node_add(x->g, TS_OP_EXPAND, 1, &a, &at, NULL));
}

static ts_status where(onnx_ctx *x, node *n) {
    ts_status s;
    if ((s = plain(x, n, 3, 3, ""))) return s;
    return onnx_out(x, n, ts_where(x->g, IN(0), IN(1), IN(2)));
}

static ts_status reduce(onnx_ctx *x, node *n) {
    ts_status s;
    if ((s = plain(x, n, 1, 2, "axes keepdims noop_with_empty_axes"))) return s;
    ts_val a = IN(0);
    const int r = ts_rank(x->g, a);
    int64_t ax[TS_MAX_RANK];
    const int m = axes(x, n, r, ax);
    if (m < 0) return onnx_refuse(x, n, "the axes must be constant and in range");
    if (!m && onnx_attr_i(n, "noop_with_empty_axes", 0)) return onnx_out(x, n, a);
    int iax[TS_MAX_RANK];
    for (int k = 0; k < m; k++) iax[k] = (int)ax[k];
    const int keep = onnx_attr_i(n, "keepdims", 1) != 0;
    const char *op = n->op_type + 6; /* after "Reduce" */
    ts_val y = !strcmp(op, "Mean")  ? ts_mean(x->g, a, m, iax, keep)
               : !strcmp(op, "Sum") ? ts_sum(x->g, a, m, iax, keep)
                                    : ts_max(x->g, a, m, iax, keep);
    return onnx_out(x, n, y);
}

static ts_status cast(onnx_ctx *x, node *n) {
    ts_status s;
    if ((s = plain(x, n, 1, 1, "saturate to"))) return s;
    const int64_t to = onnx_attr_i(n, "to", 0);
    ts_dtype dt;
    if (to == ONNX__TENSOR_PROTO__DATA_TYPE__FLOAT)
        dt = TS_F32;
    else if (to == ONNX__TENSOR_PROTO__DATA_TYPE__INT64)
        dt = TS_I64;
    else if (to == ONNX__TENSOR_PROTO__DATA_TYPE__INT32)
        dt = TS_I32;
    else
        return onnx_refuse(x, n,
                           "cast of a graph value to element type %lld (float32, int64 "
                           "or int32)",
                           (long long)to);
    ts_val a = IN(0);
    return onnx_out(x, n, ts_dtype_of(x->g, a) == dt ? a : ts_cast(x->g, a, dt));
}

typedef struct op_entry {
    const char *name;
    ts_status (*fn)(onnx_ctx *, node *);
} op_entry;

static const op_entry more[] = {
    {"Neg", unary},
    {"Exp", unary},
    {"Log", unary},
    {"Sqrt", unary},
    {"Abs", unary},
    {"Pow", pow_},
    {"Gelu", gelu},
    {"BatchNormalization", batch_norm},
    {"ConvTranspose", conv_transpose},
    {"Squeeze", squeeze},
    {"Unsqueeze", squeeze},
    {"Concat", concat},
    {"Slice", slice},
    {"Split", split},
    {"Gather", gather},
    {"Expand", expand},
    {"Where", where},
    {"ReduceMean", reduce},
    {"ReduceSum", reduce},
    {"ReduceMax", reduce},
    {"Cast", cast},
};

ts_status onnx_op_more(onnx_ctx *x, node *n, int *found) {
    *found = 0;
    for (size_t i = 0; i < sizeof more / sizeof more[0]; i++)
        if (!strcmp(more[i].name, n->op_type)) {
            *found = 1;
            return more[i].fn(x, n);
        }
    return TS_OK;
}
