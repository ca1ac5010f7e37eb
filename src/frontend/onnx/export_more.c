/* The ONNX form of the ops the GPT, the GRU / LSTM and the U-Net add to
 * those of export_ops.c: GELU (no Gelu before opset 20: torch's erf or tanh
 * formula), pow, rsqrt, max / min, where, cast, reductions, expand, concat,
 * slice, gather (embeddings), the fused attention (written out as MatMul,
 * Where over the causal mask, Softmax, MatMul: the form tessel's importer
 * fuses again), the GRU / LSTM cells (one step each, gates from Slice,
 * Sigmoid, Tanh) and transposed convolution. Each follows the dynamic batch
 * axis (ex_bax) and refuses to slice, concatenate, gather or reduce along
 * it. Sparse matmul (the GCN) and quantisation ops have no ONNX form here
 * and are refused by name. */
#include <math.h>
#include <string.h>
#include "frontend/onnx/export_internal.h"
#include "ops/op.h"

static void set_bax(ex *e, int32_t vid, int axis) {
    e->batch[vid] = (char)(axis >= 0 ? axis + 1 : 0);
}

static const ts_type *ty(const ex *e, int32_t vid) {
    return &e->g->values[vid].t;
}

static const char *fconst(ex *e, double v) {
    const float f = (float)v;
    const int64_t one = 1;
    return ex_const(e, TS_F32, 0, &one, &f);
}

static const char *node2(ex *e, const char *op, const char *a, const char *b, const char *out) {
    const char *ins[2] = {a, b};
    if (!a || (b == NULL && strcmp(op, "Sigmoid") && strcmp(op, "Tanh") && strcmp(op, "Sqrt") &&
               strcmp(op, "Erf")))
        return NULL;
    return out && ex_node(e, op, b ? 2 : 1, ins, out) ? out : NULL;
}

/* A fresh intermediate name for node output vid. */
static const char *tmp(ex *e, int32_t vid, const char *what) {
    return ex_str(e, "t%d_%s", vid, what);
}

/* x[..., lo:hi] along axis (a Slice with constant bounds). */
static const char *slice_of(ex *e, const char *x, int axis, int64_t lo, int64_t hi,
                            const char *out) {
    const int64_t a = axis;
    const char *ins[4] = {x, ex_ints(e, 1, &lo), ex_ints(e, 1, &hi), ex_ints(e, 1, &a)};
    for (int k = 0; k < 4; k++)
        if (!ins[k]) return NULL;
    return out && ex_node(e, "Slice", 4, ins, out) ? out : NULL;
}

static void gelu(ex *e, const ts_node *n) {
    const int32_t y = n->out[0];
    const char *x = ex_name(e, n->in[0]);
    const char *o = ex_out_name(e, y);
    if (n->a.unary.approx == TS_GELU_TANH) {
        /* 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))), as torch writes it */
        const char *x2 = node2(e, "Mul", x, x, tmp(e, y, "x2"));
        const char *x3 = node2(e, "Mul", x2, x, tmp(e, y, "x3"));
        const char *k3 = node2(e, "Mul", x3, fconst(e, 0.044715), tmp(e, y, "k3"));
        const char *in = node2(e, "Add", x, k3, tmp(e, y, "in"));
        const char *sc = node2(e, "Mul", in, fconst(e, sqrt(2.0 / M_PI)), tmp(e, y, "sc"));
        const char *th = node2(e, "Tanh", sc, NULL, tmp(e, y, "tanh"));
        const char *p1 = node2(e, "Add", th, fconst(e, 1), tmp(e, y, "p1"));
        const char *m = node2(e, "Mul", x, p1, tmp(e, y, "m"));
        node2(e, "Mul", m, fconst(e, 0.5), o);
        return;
    }
    /* x * (1 + erf(x / sqrt 2)) * 0.5: the pattern torch writes (and tessel
     * reads back as one gelu) */
    const char *d = node2(e, "Div", x, fconst(e, sqrt(2.0)), tmp(e, y, "div"));
    const char *er = node2(e, "Erf", d, NULL, tmp(e, y, "erf"));
    const char *p1 = node2(e, "Add", er, fconst(e, 1), tmp(e, y, "p1"));
    const char *m = node2(e, "Mul", x, p1, tmp(e, y, "m"));
    node2(e, "Mul", m, fconst(e, 0.5), o);
}

/* ONNX element type of a tessel dtype; 0 when it has none here. */
static int onnx_type(int64_t dt) {
    switch (dt) {
    case TS_F32: return ONNX__TENSOR_PROTO__DATA_TYPE__FLOAT;
    case TS_F64: return ONNX__TENSOR_PROTO__DATA_TYPE__DOUBLE;
    case TS_F16: return ONNX__TENSOR_PROTO__DATA_TYPE__FLOAT16;
    case TS_BF16: return ONNX__TENSOR_PROTO__DATA_TYPE__BFLOAT16;
    case TS_I64: return ONNX__TENSOR_PROTO__DATA_TYPE__INT64;
    case TS_I32: return ONNX__TENSOR_PROTO__DATA_TYPE__INT32;
    case TS_U8: return ONNX__TENSOR_PROTO__DATA_TYPE__UINT8;
    default: return 0;
    }
}

static void cast(ex *e, int32_t id, const ts_node *n) {
    const int to = onnx_type(n->a.cast.dtype);
    if (!to) {
        ex_refuse(e, id, "a cast to %s", ts_dtype_name((ts_dtype)n->a.cast.dtype));
        return;
    }
    const char *x = ex_name(e, n->in[0]);
    Onnx__NodeProto *o = x ? ex_node(e, "Cast", 1, &x, ex_out_name(e, n->out[0])) : NULL;
    ex_attr_i(e, o, "to", to);
}

static void where(ex *e, const ts_node *n) {
    const char *c = ex_name(e, n->in[0]);
    if (c && e->g->values[ex_resolve(e, n->in[0])].kind != TS_VK_CONST) {
        /* a u8 condition computed in the graph: ONNX wants bool */
        const char *b = tmp(e, n->out[0], "cond");
        Onnx__NodeProto *o = b ? ex_node(e, "Cast", 1, &c, b) : NULL;
        ex_attr_i(e, o, "to", ONNX__TENSOR_PROTO__DATA_TYPE__BOOL);
        c = o ? b : NULL;
    }
    const char *ins[3] = {c, ex_name(e, n->in[1]), ex_name(e, n->in[2])};
    if (ins[0] && ins[1] && ins[2]) ex_node(e, "Where", 3, ins, ex_out_name(e, n->out[0]));
}

static void reduce(ex *e, int32_t id, const ts_node *n) {
    const ts_type *x = ty(e, n->in[0]);
    const ts_reduce_attrs *r = &n->a.reduce;
    int64_t axes[TS_MAX_RANK];
    int na = 0;
    const int a = ex_bax(e, n->in[0]);
    for (int k = 0; k < x->rank; k++)
        if (r->axes >> k & 1) axes[na++] = k;
    if (a >= 0 && (r->axes >> a & 1)) {
        ex_refuse(e, id, "it reduces over the batch dimension");
        return;
    }
    const char *in = ex_name(e, n->in[0]);
    const int32_t y = n->out[0];
    const int max = n->op == TS_OP_REDUCE_MAX, scaled = !max && r->scale != 1;
    const char *name = scaled ? tmp(e, y, "sum") : ex_out_name(e, y);
    Onnx__NodeProto *o;
    if (max && e->o->opset < 18) { /* ReduceMax takes its axes as an input from opset 18 */
        o = in && name ? ex_node(e, "ReduceMax", 1, &in, name) : NULL;
        ex_attr_ints(e, o, "axes", na, axes);
    } else {
        const char *ins[2] = {in, ex_ints(e, na, axes)};
        o = ins[0] && ins[1] && name ? ex_node(e, max ? "ReduceMax" : "ReduceSum", 2, ins, name)
                                     : NULL;
    }
    ex_attr_i(e, o, "keepdims", r->keepdim ? 1 : 0);
    if (o && scaled) node2(e, "Mul", name, fconst(e, r->scale), ex_out_name(e, y));
    int removed = 0;
    for (int k = 0; k < a && !r->keepdim; k++) removed += (int)(r->axes >> k & 1);
    set_bax(e, y, a >= 0 ? a - removed : -1);
}

static void expand(ex *e, const ts_node *n) {
    const ts_type *x = ty(e, n->in[0]), *t = ty(e, n->out[0]);
    int64_t dims[TS_MAX_RANK];
    memcpy(dims, t->dims, (size_t)t->rank * sizeof *dims);
    const int a = ex_bax(e, n->in[0]), j = a >= 0 ? a + t->rank - x->rank : -1;
    if (j >= 0) dims[j] = 1; /* Expand broadcasts: 1 keeps the input's batch */
    const char *ins[2] = {ex_name(e, n->in[0]), ex_ints(e, t->rank, dims)};
    if (ins[0] && ins[1]) ex_node(e, "Expand", 2, ins, ex_out_name(e, n->out[0]));
    set_bax(e, n->out[0], j);
}

static void concat(ex *e, int32_t id, const ts_node *n) {
    const int r = ty(e, n->out[0])->rank, axis = (int)n->a.concat.axis;
    const char *ins[64];
    int a = -1;
    if (n->n_in > 64) {
        ex_refuse(e, id, "more than 64 inputs");
        return;
    }
    for (int k = 0; k < n->n_in; k++) {
        if (!(ins[k] = ex_name(e, n->in[k]))) return;
        const int ak = ex_bax(e, n->in[k]);
        if (ak >= 0) a = ak;
    }
    (void)r;
    if (a >= 0 && a == axis) {
        ex_refuse(e, id, "it concatenates along the batch dimension");
        return;
    }
    Onnx__NodeProto *o = ex_node(e, "Concat", n->n_in, ins, ex_out_name(e, n->out[0]));
    ex_attr_i(e, o, "axis", axis);
    set_bax(e, n->out[0], a);
}

static void slice(ex *e, int32_t id, const ts_node *n) {
    const ts_slice_attrs *s = &n->a.slice;
    const int a = ex_bax(e, n->in[0]);
    if (a == s->axis) {
        ex_refuse(e, id, "it slices the batch dimension");
        return;
    }
    slice_of(e, ex_name(e, n->in[0]), (int)s->axis, s->start, s->end, ex_out_name(e, n->out[0]));
    set_bax(e, n->out[0], a);
}

static void gather(ex *e, int32_t id, const ts_node *n) {
    const int axis = (int)n->a.index.axis;
    const int ad = ex_bax(e, n->in[0]), ai = ex_bax(e, n->in[1]);
    const int ri = ty(e, n->in[1])->rank;
    if (ad == axis) {
        ex_refuse(e, id, "it gathers along the batch dimension");
        return;
    }
    const char *ins[2] = {ex_name(e, n->in[0]), ex_name(e, n->in[1])};
    Onnx__NodeProto *o =
        ins[0] && ins[1] ? ex_node(e, "Gather", 2, ins, ex_out_name(e, n->out[0])) : NULL;
    ex_attr_i(e, o, "axis", axis);
    /* numpy take: data.shape[:axis] + indices.shape + data.shape[axis+1:] */
    set_bax(e, n->out[0], ai >= 0 ? axis + ai : ad < 0 ? -1 : ad < axis ? ad : ad + ri - 1);
}

/* softmax(scale q k^T [causal mask]) v, as torch's explicit attention. */
static void attention(ex *e, int32_t id, const ts_node *n) {
    const ts_type *q = ty(e, n->in[0]), *k = ty(e, n->in[1]);
    const int32_t y = n->out[0];
    if (n->a.attention.low) {
        ex_refuse(e, id, "attention with bf16 products (tessel exports the fp32 graph)");
        return;
    }
    if (q->rank != 4) {
        ex_refuse(e, id, "q of rank %d (4 expected)", q->rank);
        return;
    }
    const int64_t Tq = q->dims[2], Tk = k->dims[2];
    const int64_t perm[4] = {0, 1, 3, 2};
    const char *kn = ex_name(e, n->in[1]), *kt = tmp(e, y, "kT");
    Onnx__NodeProto *t = kn && kt ? ex_node(e, "Transpose", 1, &kn, kt) : NULL;
    ex_attr_ints(e, t, "perm", 4, perm);
    const char *s = node2(e, "MatMul", ex_name(e, n->in[0]), t ? kt : NULL, tmp(e, y, "qk"));
    s = node2(e, "Mul", s, fconst(e, n->a.attention.scale), tmp(e, y, "scores"));
    if (n->a.attention.causal && s) {
        uint8_t *mask = ex_alloc(e, (size_t)(Tq * Tk));
        for (int64_t i = 0; mask && i < Tq; i++)
            for (int64_t j = 0; j < Tk; j++) mask[i * Tk + j] = j > i;
        const int64_t md[2] = {Tq, Tk};
        const char *ins[3] = {mask ? ex_const(e, TS_U8, 2, md, mask) : NULL, fconst(e, -INFINITY),
                              s};
        const char *w = tmp(e, y, "masked");
        s = ins[0] && ins[1] && w && ex_node(e, "Where", 3, ins, w) ? w : NULL;
    }
    const char *p = tmp(e, y, "probs");
    Onnx__NodeProto *sm = s && p ? ex_node(e, "Softmax", 1, &s, p) : NULL;
    ex_attr_i(e, sm, "axis", -1);
    node2(e, "MatMul", sm ? p : NULL, ex_name(e, n->in[2]), ex_out_name(e, y));
    set_bax(e, y, ex_bax(e, n->in[0]));
}

/* One GRU / LSTM step (torch's gate order, ops/rnn.c): gi [B, T, G] (its
 * row t), gh [B, G], the state h (GRU) or c (LSTM) [B, H]. */
static void cell(ex *e, int32_t id, const ts_node *n) {
    const int lstm = n->op == TS_OP_LSTM_CELL;
    const ts_type *gh = ty(e, n->in[1]);
    const int64_t H = gh->dims[1] / (lstm ? 4 : 3), t = n->a.rnn.t;
    const int32_t y = n->out[1];
    e->alias[n->out[0]] = n->in[0]; /* gi passed on to the next step */
    const char *gi = ex_name(e, n->in[0]), *ghn = ex_name(e, n->in[1]), *st = ex_name(e, n->in[2]);
    if (!gi || !ghn || !st) return;
    const int64_t one = 1;
    const char *ti = ex_const(e, TS_I64, 0, &one, &t);
    const char *git = node2(e, "Gather", gi, ti, tmp(e, y, "gi"));
    Onnx__NodeProto *gn = e->nodes && e->n_nodes ? e->nodes[e->n_nodes - 1] : NULL;
    if (git && gn) ex_attr_i(e, gn, "axis", 1);
    const char *a[4], *b[4];
    for (int g = 0; g < (lstm ? 4 : 3); g++) {
        a[g] = slice_of(e, git, 1, g * H, (g + 1) * H, ex_str(e, "t%d_gi%d", y, g));
        b[g] = slice_of(e, ghn, 1, g * H, (g + 1) * H, ex_str(e, "t%d_gh%d", y, g));
    }
    const char *h1 = NULL;
    if (!lstm) { /* r, z, n; h' = n + z (h - n) */
        const char *r = node2(e, "Sigmoid", node2(e, "Add", a[0], b[0], tmp(e, y, "r_in")), NULL,
                              tmp(e, y, "r"));
        const char *z = node2(e, "Sigmoid", node2(e, "Add", a[1], b[1], tmp(e, y, "z_in")), NULL,
                              tmp(e, y, "z"));
        const char *rn = node2(e, "Mul", r, b[2], tmp(e, y, "rn"));
        const char *nn =
            node2(e, "Tanh", node2(e, "Add", a[2], rn, tmp(e, y, "n_in")), NULL, tmp(e, y, "n"));
        const char *d = node2(e, "Sub", st, nn, tmp(e, y, "d"));
        h1 = node2(e, "Add", nn, node2(e, "Mul", z, d, tmp(e, y, "zd")), ex_out_name(e, y));
    } else { /* i, f, g, o; c' = f c + i g, h' = o tanh(c') */
        const char *gate[4];
        for (int g = 0; g < 4; g++)
            gate[g] = node2(e, g == 2 ? "Tanh" : "Sigmoid",
                            node2(e, "Add", a[g], b[g], ex_str(e, "t%d_in%d", y, g)), NULL,
                            ex_str(e, "t%d_gate%d", y, g));
        const char *fc = node2(e, "Mul", gate[1], st, tmp(e, y, "fc"));
        const char *ig = node2(e, "Mul", gate[0], gate[2], tmp(e, y, "ig"));
        const char *c1 = node2(e, "Add", fc, ig, ex_out_name(e, n->out[2]));
        h1 = node2(e, "Mul", gate[3], node2(e, "Tanh", c1, NULL, tmp(e, y, "tc")),
                   ex_out_name(e, y));
        set_bax(e, n->out[2], ex_bax(e, n->in[2]) >= 0 ? 0 : ex_bax(e, n->in[0]));
    }
    (void)h1;
    (void)id;
    const int bx = ex_bax(e, n->in[0]) >= 0 ? 0 : ex_bax(e, n->in[2]);
    set_bax(e, y, bx);
}

static void conv_transpose(ex *e, int32_t id, const ts_node *n) {
    const ts_conv_attrs *c = &n->a.conv;
    if (c->low) {
        ex_refuse(e, id, "a bf16/fp16 convolution (tessel exports the fp32 graph)");
        return;
    }
    const ts_type *x = ty(e, n->in[0]), *w = ty(e, n->in[1]);
    const int nd = (int)c->nd;
    const char *ins[3];
    for (int k = 0; k < n->n_in && k < 3; k++)
        if (!(ins[k] = ex_name(e, n->in[k]))) return;
    int64_t perm[TS_MAX_RANK], back[TS_MAX_RANK], pads[6];
    const int r = x->rank;
    const int32_t y = n->out[0];
    const char *in0 = ins[0], *out = c->channels_last ? tmp(e, y, "cf") : ex_out_name(e, y);
    if (c->channels_last) { /* [N, spatial..., C] <-> [N, C, spatial...] */
        perm[0] = back[0] = 0, perm[1] = r - 1, back[r - 1] = 1;
        for (int j = 2; j < r; j++) perm[j] = j - 1, back[j - 1] = j;
        const char *cf = tmp(e, y, "in_cf");
        Onnx__NodeProto *t = cf ? ex_node(e, "Transpose", 1, &in0, cf) : NULL;
        ex_attr_ints(e, t, "perm", r, perm);
        ins[0] = t ? cf : NULL;
    }
    for (int j = 0; j < nd; j++) pads[j] = pads[nd + j] = c->padding[j];
    Onnx__NodeProto *o =
        ins[0] && out ? ex_node(e, "ConvTranspose", n->n_in < 3 ? n->n_in : 3, ins, out) : NULL;
    ex_attr_ints(e, o, "kernel_shape", nd, w->dims + 2);
    ex_attr_ints(e, o, "strides", nd, c->stride);
    ex_attr_ints(e, o, "pads", 2 * nd, pads);
    ex_attr_ints(e, o, "output_padding", nd, c->extra);
    ex_attr_i(e, o, "group", c->groups);
    if (c->channels_last && o) {
        Onnx__NodeProto *t = ex_node(e, "Transpose", 1, &out, ex_out_name(e, y));
        ex_attr_ints(e, t, "perm", r, back);
    }
}

int ex_more_supported(int op) {
    switch (op) {
    case TS_OP_GELU:
    case TS_OP_POW_SCALAR:
    case TS_OP_RSQRT:
    case TS_OP_MAXIMUM:
    case TS_OP_MINIMUM:
    case TS_OP_WHERE:
    case TS_OP_CAST:
    case TS_OP_REDUCE_SUM:
    case TS_OP_REDUCE_MAX:
    case TS_OP_EXPAND:
    case TS_OP_CONCAT:
    case TS_OP_SLICE:
    case TS_OP_GATHER:
    case TS_OP_ATTENTION:
    case TS_OP_GRU_CELL:
    case TS_OP_LSTM_CELL:
    case TS_OP_CONV_TRANSPOSE: return 1;
    default: return 0;
    }
}

int ex_more_emit(ex *e, int32_t id) {
    const ts_node *n = &e->g->nodes[id];
    switch (n->op) {
    case TS_OP_GELU: gelu(e, n); return 0;
    case TS_OP_POW_SCALAR:
        node2(e, "Pow", ex_name(e, n->in[0]), fconst(e, n->a.unary.exponent),
              ex_out_name(e, n->out[0]));
        return 0;
    case TS_OP_RSQRT:
        node2(e, "Div", fconst(e, 1),
              node2(e, "Sqrt", ex_name(e, n->in[0]), NULL, tmp(e, n->out[0], "sqrt")),
              ex_out_name(e, n->out[0]));
        return 0;
    case TS_OP_MAXIMUM:
    case TS_OP_MINIMUM:
        node2(e, n->op == TS_OP_MAXIMUM ? "Max" : "Min", ex_name(e, n->in[0]), ex_name(e, n->in[1]),
              ex_out_name(e, n->out[0]));
        return 0;
    case TS_OP_WHERE: where(e, n); return 0;
    case TS_OP_CAST: cast(e, id, n); return 0;
    case TS_OP_REDUCE_SUM:
    case TS_OP_REDUCE_MAX: reduce(e, id, n); return 1;
    case TS_OP_EXPAND: expand(e, n); return 1;
    case TS_OP_CONCAT: concat(e, id, n); return 1;
    case TS_OP_SLICE: slice(e, id, n); return 1;
    case TS_OP_GATHER: gather(e, id, n); return 1;
    case TS_OP_ATTENTION: attention(e, id, n); return 1;
    case TS_OP_GRU_CELL:
    case TS_OP_LSTM_CELL: cell(e, id, n); return 1;
    case TS_OP_CONV_TRANSPOSE: conv_transpose(e, id, n); return 0;
    default: ex_refuse(e, id, EX_UNSUPPORTED); return 1;
    }
}

/* A GRU / LSTM's zero state: a constant [b0, n] of zeros in a graph with
 * recurrent cells, written as ConstantOfShape(Concat(Shape(x)[0:1], [n]))
 * from the first batched graph input, so it follows the batch. */
const char *ex_batch_zeros(ex *e, int32_t vid) {
    const ts_value *v = &e->g->values[vid];
    if (!e->has_rnn || v->t.rank != 2 || v->t.dims[0] != e->b0 || v->t.dtype != TS_F32 || !v->data)
        return NULL;
    const float *f = v->data;
    for (int64_t k = 0; k < ts_type_numel(&v->t); k++)
        if (f[k] != 0) return NULL;
    const char *x = NULL;
    for (int32_t i = 0; i < e->g->n_values && !x; i++)
        if (e->g->values[i].kind == TS_VK_INPUT && e->batch[i] == 1) x = ex_name(e, i);
    if (!x) return NULL;
    const char *shape = ex_str(e, "z%d_shape", vid), *b = ex_str(e, "z%d_batch", vid);
    const char *full = ex_str(e, "z%d_dims", vid), *z = ex_str(e, "z%d", vid);
    if (!shape || !b || !full || !z || !ex_node(e, "Shape", 1, &x, shape) ||
        !slice_of(e, shape, 0, 0, 1, b))
        return NULL;
    const char *cat[2] = {b, ex_ints(e, 1, &v->t.dims[1])};
    Onnx__NodeProto *c = cat[1] ? ex_node(e, "Concat", 2, cat, full) : NULL;
    ex_attr_i(e, c, "axis", 0);
    Onnx__NodeProto *o = c ? ex_node(e, "ConstantOfShape", 1, &full, z) : NULL;
    if (!o) return NULL;
    e->batch[vid] = 1;
    return z;
}
