/* The ONNX form of each tessel op the exporter writes (docs/onnx.md,
 * "Exporting"). Every op here has the inference semantics of the node in
 * an uncompiled graph: dropout is the identity, batch norm uses the running
 * statistics. Any other op is refused by name. The batch flag of a value
 * (its first dimension is the dynamic "batch") follows each op, and an op
 * that would move or fold the batch dimension into a static shape is
 * refused rather than written with a batch size baked in. */
#include <string.h>
#include "frontend/onnx/export_internal.h"
#include "ops/op.h"

/* The name a node's output value is written under, marked defined. */
const char *ex_out_name(ex *e, int32_t vid) {
    e->defined[vid] = 1;
    return vid == e->out_id ? e->out_name : ex_str(e, "t%d", vid);
}
#define out_name ex_out_name

int ex_bax(const ex *e, int32_t vid) {
    return e->batch[ex_resolve(e, vid)] - 1;
}

const char *ex_ints(ex *e, int n, const int64_t *v) {
    const int64_t len = n;
    return ex_const(e, TS_I64, 1, &len, v);
}

static Onnx__NodeProto *simple(ex *e, const ts_node *n, const char *op) {
    const char *ins[8];
    if (n->n_in > 8) return NULL;
    for (int k = 0; k < n->n_in; k++)
        if (!(ins[k] = ex_name(e, n->in[k]))) return NULL;
    const char *o = out_name(e, n->out[0]);
    return o ? ex_node(e, op, n->n_in, ins, o) : NULL;
}

/* A channels-last activation [N, spatial..., C] as channels first for an
 * ONNX op (and back): Transpose nodes around it. */
static const char *relayout(ex *e, const char *x, int rank, int to_first, int32_t vid, int k) {
    int64_t perm[TS_MAX_RANK];
    perm[0] = 0;
    for (int j = 1; j < rank; j++)
        perm[j] = to_first ? (j == 1 ? rank - 1 : j - 1) : (j == rank - 1 ? 1 : j + 1);
    const char *name = to_first ? ex_str(e, "t%d_cf%d", vid, k) : out_name(e, vid);
    Onnx__NodeProto *o = x && name ? ex_node(e, "Transpose", 1, &x, name) : NULL;
    ex_attr_ints(e, o, "perm", rank, perm);
    return o ? name : NULL;
}

/* Writes op `op` over the node's inputs, the first (an activation) and the
 * output relaid out when channels_last. */
static Onnx__NodeProto *spatial_op(ex *e, const ts_node *n, const char *op, int channels_last) {
    if (!channels_last) return simple(e, n, op);
    const char *ins[8];
    if (n->n_in > 8) return NULL;
    for (int k = 0; k < n->n_in; k++)
        if (!(ins[k] = ex_name(e, n->in[k]))) return NULL;
    const int r = e->g->values[n->in[0]].t.rank;
    ins[0] = relayout(e, ins[0], r, 1, n->out[0], 0);
    const char *mid = ex_str(e, "t%d_cl", n->out[0]);
    Onnx__NodeProto *o = ins[0] && mid ? ex_node(e, op, n->n_in, ins, mid) : NULL;
    if (o && !relayout(e, mid, e->g->values[n->out[0]].t.rank, 0, n->out[0], 1)) return NULL;
    return o;
}

static void matmul(ex *e, int32_t id, const ts_node *n) {
    const ts_graph *g = e->g;
    const ts_type *a = &g->values[n->in[0]].t, *b = &g->values[n->in[1]].t;
    if (n->a.matmul.low) {
        ex_refuse(e, id, "a bf16/fp16 matmul (tessel exports the fp32 graph)");
        return;
    }
    /* The batch may sit on a's rows or a leading axis of either operand;
     * a contracted batch axis (or b's columns) would fix its size. */
    const int ka = ex_bax(e, n->in[0]), kb = ex_bax(e, n->in[1]);
    const int ra = a->rank, rb = b->rank, ro = e->g->values[n->out[0]].t.rank;
    const int a_rows = n->a.matmul.trans_a ? ra - 1 : ra - 2;
    const int b_cols = n->a.matmul.trans_b ? rb - 2 : rb - 1;
    if ((ka >= ra - 2 && ka != a_rows) || (kb >= rb - 2 && kb != b_cols) || (kb >= 0 && rb == 2)) {
        ex_refuse(e, id, "the batch dimension would be contracted");
        return;
    }
    if (ka >= 0) e->batch[n->out[0]] = (char)(1 + (ka == a_rows ? ro - 2 : ka + ro - ra));
    if (kb >= 0) e->batch[n->out[0]] = (char)(1 + (kb == b_cols ? ro - 1 : kb + ro - rb));
    const char *an = ex_name(e, n->in[0]), *bn = ex_name(e, n->in[1]);
    if (!an || !bn) return;
    if (a->rank == 2 && b->rank == 2) {
        /* torch's nn.Linear exports as Gemm(transB = 1) too. */
        const char *ins[2] = {an, bn};
        Onnx__NodeProto *o = ex_node(e, "Gemm", 2, ins, out_name(e, n->out[0]));
        if (n->a.matmul.trans_a) ex_attr_i(e, o, "transA", 1);
        if (n->a.matmul.trans_b) ex_attr_i(e, o, "transB", 1);
        return;
    }
    const char *ops[2] = {an, bn};
    const int tr[2] = {(int)n->a.matmul.trans_a, (int)n->a.matmul.trans_b};
    const ts_type *t[2] = {a, b};
    for (int s = 0; s < 2; s++) {
        if (!tr[s]) continue;
        int64_t perm[TS_MAX_RANK];
        for (int k = 0; k < t[s]->rank; k++) perm[k] = k;
        perm[t[s]->rank - 2] = t[s]->rank - 1, perm[t[s]->rank - 1] = t[s]->rank - 2;
        const char *tn = ex_str(e, "t%d_T%d", n->out[0], s);
        Onnx__NodeProto *o = tn ? ex_node(e, "Transpose", 1, &ops[s], tn) : NULL;
        ex_attr_ints(e, o, "perm", t[s]->rank, perm);
        ops[s] = tn;
    }
    ex_node(e, "MatMul", 2, ops, out_name(e, n->out[0]));
}

static void affine(ex *e, const ts_node *n) {
    const int64_t one = 1;
    const float scale = (float)n->a.unary.scale, shift = (float)n->a.unary.shift;
    const char *x = ex_name(e, n->in[0]);
    const char *sc = ex_const(e, TS_F32, 0, &one, &scale);
    const char *sh = ex_const(e, TS_F32, 0, &one, &shift);
    const char *mid = ex_str(e, "t%d_scaled", n->out[0]);
    if (!x || !sc || !sh || !mid) return;
    const char *m[2] = {x, sc}, *a[2] = {mid, sh};
    ex_node(e, "Mul", 2, m, mid);
    ex_node(e, "Add", 2, a, out_name(e, n->out[0]));
}

static void layer_norm(ex *e, int32_t id, const ts_node *n) {
    if (!n->a.norm.has_w) {
        ex_refuse(e, id, "a layer norm without a weight");
        return;
    }
    Onnx__NodeProto *o = simple(e, n, "LayerNormalization");
    ex_attr_i(e, o, "axis", -1);
    ex_attr_f(e, o, "epsilon", n->a.norm.eps);
}

static void spatial(ex *e, Onnx__NodeProto *o, int nd, const int64_t *kernel, const int64_t *stride,
                    const int64_t *padding) {
    int64_t pads[6];
    for (int j = 0; j < nd; j++) pads[j] = pads[nd + j] = padding[j];
    ex_attr_ints(e, o, "kernel_shape", nd, kernel);
    ex_attr_ints(e, o, "strides", nd, stride);
    ex_attr_ints(e, o, "pads", 2 * nd, pads);
}

static void conv(ex *e, int32_t id, const ts_node *n) {
    const ts_conv_attrs *c = &n->a.conv;
    if (c->low) {
        ex_refuse(e, id, "a bf16/fp16 convolution (tessel exports the fp32 graph)");
        return;
    }
    const ts_type *w = &e->g->values[n->in[1]].t;
    Onnx__NodeProto *o = spatial_op(e, n, "Conv", (int)c->channels_last);
    spatial(e, o, (int)c->nd, w->dims + 2, c->stride, c->padding);
    ex_attr_ints(e, o, "dilations", (int)c->nd, c->dilation);
    ex_attr_i(e, o, "group", c->groups);
}

static void pool(ex *e, int32_t id, const ts_node *n) {
    const ts_pool_attrs *p = &n->a.pool;
    if (p->mode == 3) {
        for (int j = 0; j < p->nd; j++)
            if (p->kernel[j] != 1) {
                ex_refuse(e, id, "adaptive average pooling to a size other than 1");
                return;
            }
        spatial_op(e, n, "GlobalAveragePool", (int)p->channels_last);
        return;
    }
    Onnx__NodeProto *o =
        spatial_op(e, n, p->mode == 0 ? "MaxPool" : "AveragePool", (int)p->channels_last);
    spatial(e, o, (int)p->nd, p->kernel, p->stride, p->padding);
    if (p->mode == 2) ex_attr_i(e, o, "count_include_pad", 1);
}

static void batch_norm(ex *e, const ts_node *n) {
    const ts_batch_norm_attrs *b = &n->a.batch_norm;
    const ts_type *x = &e->g->values[n->in[0]].t;
    const int64_t c = x->dims[b->channels_last ? x->rank - 1 : 1];
    const char *ins[5];
    int k = 0;
    ins[k++] = ex_name(e, n->in[0]);
    if (b->affine) {
        ins[k++] = ex_name(e, n->in[1]);
        ins[k++] = ex_name(e, n->in[2]);
    } else {
        /* affine=False: scale 1, bias 0 */
        float *ones = ex_alloc(e, (size_t)c * sizeof *ones), *zeros = ex_alloc(e, (size_t)c * 4);
        for (int64_t i = 0; ones && i < c; i++) ones[i] = 1;
        ins[k++] = ones ? ex_const(e, TS_F32, 1, &c, ones) : NULL;
        ins[k++] = zeros ? ex_const(e, TS_F32, 1, &c, zeros) : NULL;
    }
    ins[k++] = ex_name(e, n->in[b->affine ? 3 : 1]);
    ins[k++] = ex_name(e, n->in[b->affine ? 4 : 2]);
    if (b->channels_last) ins[0] = relayout(e, ins[0], x->rank, 1, n->out[0], 0);
    for (int i = 0; i < 5; i++)
        if (!ins[i]) return;
    /* BatchNormalization [-> Relu] in channels first [-> back to channels last] */
    const int last = b->relu ? 2 : 1;
    const char *y = ins[0];
    for (int step = 1; step <= last; step++) {
        const int final = step == last && !b->channels_last;
        const char *name = final ? out_name(e, n->out[0]) : ex_str(e, "t%d_bn%d", n->out[0], step);
        Onnx__NodeProto *o = name ? ex_node(e, step == 1 ? "BatchNormalization" : "Relu",
                                            step == 1 ? 5 : 1, step == 1 ? ins : &y, name)
                                  : NULL;
        if (step == 1) {
            ex_attr_f(e, o, "epsilon", b->eps);
            ex_attr_f(e, o, "momentum", 1 - b->momentum); /* ONNX weighs the running value */
        }
        y = name;
    }
    if (b->channels_last && y) relayout(e, y, x->rank, 0, n->out[0], 1);
}

/* A batched value keeps a dynamic batch through a reshape when the output
 * has an axis j whose leading axes hold the same elements as those before
 * the input's batch axis and whose size is a multiple of the batch: it is
 * written as -1 (a GRU's [B, T, F] -> [B * T, F] and back, [B, H] -> [1,
 * B, H]). */
static void reshape(ex *e, int32_t id, const ts_node *n) {
    const ts_type *in = &e->g->values[n->in[0]].t, *out = &e->g->values[n->out[0]].t;
    int64_t dims[TS_MAX_RANK];
    memcpy(dims, out->dims, (size_t)out->rank * sizeof *dims);
    const int a = ex_bax(e, n->in[0]);
    if (a >= 0) {
        int64_t before = 1, acc = 1;
        for (int k = 0; k < a; k++) before *= in->dims[k];
        int j = -1;
        for (int k = 0; k < out->rank && j < 0; k++) {
            if (acc == before && e->b0 > 0 && out->dims[k] % e->b0 == 0) j = k;
            acc *= out->dims[k];
        }
        if (j < 0) {
            ex_refuse(e, id,
                      "it folds the batch dimension into a static one (a dynamic batch needs "
                      "an axis of its own)");
            return;
        }
        dims[j] = -1;
        e->batch[n->out[0]] = (char)(1 + j);
    }
    const int64_t r = out->rank;
    const char *ins[2] = {ex_name(e, n->in[0]), ex_const(e, TS_I64, 1, &r, dims)};
    if (ins[0] && ins[1]) ex_node(e, "Reshape", 2, ins, out_name(e, n->out[0]));
}

static void permute(ex *e, const ts_node *n) {
    const int r = e->g->values[n->in[0]].t.rank, a = ex_bax(e, n->in[0]);
    Onnx__NodeProto *o = simple(e, n, "Transpose");
    ex_attr_ints(e, o, "perm", r, n->a.permute.perm);
    for (int k = 0; k < r && a >= 0; k++)
        if (n->a.permute.perm[k] == a) e->batch[n->out[0]] = (char)(1 + k);
}

static void softmax(ex *e, int32_t id, const ts_node *n) {
    const int r = e->g->values[n->in[0]].t.rank;
    const int axis = ts_axis((int)n->a.softmax.axis, r);
    if (axis == ex_bax(e, n->in[0])) {
        ex_refuse(e, id, "it normalises over the batch dimension");
        return;
    }
    Onnx__NodeProto *o = simple(e, n, n->op == TS_OP_SOFTMAX ? "Softmax" : "LogSoftmax");
    ex_attr_i(e, o, "axis", axis);
}

static const char *unary_name(int op) {
    switch (op) {
    case TS_OP_NEG: return "Neg";
    case TS_OP_EXP: return "Exp";
    case TS_OP_LOG: return "Log";
    case TS_OP_SQRT: return "Sqrt";
    case TS_OP_ABS: return "Abs";
    case TS_OP_RELU: return "Relu";
    case TS_OP_SIGMOID: return "Sigmoid";
    case TS_OP_TANH: return "Tanh";
    case TS_OP_ADD: return "Add";
    case TS_OP_SUB: return "Sub";
    case TS_OP_MUL: return "Mul";
    case TS_OP_DIV: return "Div";
    default: return NULL;
    }
}

int ex_supported(int op) {
    switch (op) {
    case TS_OP_DROPOUT:
    case TS_OP_MATMUL:
    case TS_OP_AFFINE_SCALAR:
    case TS_OP_LEAKY_RELU:
    case TS_OP_LAYER_NORM:
    case TS_OP_CONV:
    case TS_OP_POOL:
    case TS_OP_BATCH_NORM:
    case TS_OP_RESHAPE:
    case TS_OP_PERMUTE:
    case TS_OP_SOFTMAX:
    case TS_OP_LOG_SOFTMAX: return 1;
    default: return unary_name(op) != NULL || ex_more_supported(op);
    }
}

void ex_emit(ex *e, int32_t id) {
    const ts_node *n = &e->g->nodes[id];
    const int32_t y = n->out[0];
    const char *simple_op = unary_name(n->op);
    switch (n->op) {
    case TS_OP_DROPOUT: e->alias[y] = n->in[0]; return; /* identity in inference */
    case TS_OP_MATMUL: matmul(e, id, n); return;
    case TS_OP_AFFINE_SCALAR: affine(e, n); break;
    case TS_OP_LEAKY_RELU:
        ex_attr_f(e, simple(e, n, "LeakyRelu"), "alpha", n->a.unary.slope);
        break;
    case TS_OP_LAYER_NORM: layer_norm(e, id, n); break;
    case TS_OP_CONV: conv(e, id, n); break;
    case TS_OP_POOL: pool(e, id, n); break;
    case TS_OP_BATCH_NORM: batch_norm(e, n); break;
    case TS_OP_RESHAPE: reshape(e, id, n); return;
    case TS_OP_PERMUTE: permute(e, n); return;
    case TS_OP_SOFTMAX:
    case TS_OP_LOG_SOFTMAX: softmax(e, id, n); break;
    default:
        if (simple_op) {
            simple(e, n, simple_op);
            break;
        }
        if (!ex_more_supported(n->op)) {
            ex_refuse(e, id, EX_UNSUPPORTED);
            return;
        }
        if (ex_more_emit(e, id)) return;
        break;
    }
    /* Elementwise (broadcasting, so aligned from the right), conv, pooling,
     * norms: the output carries the batch where an input did and the size
     * agrees. */
    const ts_type *t = &e->g->values[y].t;
    for (int k = 0; k < n->n_in && t->rank > 0; k++) {
        const ts_type *a = &e->g->values[n->in[k]].t;
        const int ax = ex_bax(e, n->in[k]), j = ax + t->rank - a->rank;
        if (ax >= 0 && j >= 0 && t->dims[j] == a->dims[ax]) e->batch[y] = (char)(1 + j);
    }
}
