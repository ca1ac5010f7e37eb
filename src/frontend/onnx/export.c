/* ts_onnx_export: the forward graph of one output as an ONNX ModelProto,
 * packed with protobuf-c. Every string, array and message the ModelProto
 * points at is allocated through ex_alloc and freed in one sweep, so a
 * failure anywhere leaves nothing behind. The mapping of each tessel op is
 * in export_ops.c; this file walks the graph and writes the file. */
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "core/half.h"
#include "frontend/onnx/export_internal.h"
#include "ops/op.h"
#include "tessel/tessel.h"

void *ex_alloc(ex *e, size_t n) {
    if (e->status != TS_OK) return NULL;
    if (e->n_allocs == e->cap_allocs) {
        const int cap = e->cap_allocs ? 2 * e->cap_allocs : 256;
        void **na = realloc(e->allocs, (size_t)cap * sizeof *na);
        if (!na) {
            e->status = ts_fail(TS_ERR_NOMEM, "onnx export: out of memory");
            return NULL;
        }
        e->allocs = na, e->cap_allocs = cap;
    }
    void *p = calloc(1, n ? n : 1);
    if (!p) {
        e->status = ts_fail(TS_ERR_NOMEM, "onnx export: out of memory for %zu bytes", n);
        return NULL;
    }
    e->allocs[e->n_allocs++] = p;
    return p;
}

char *ex_str(ex *e, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    const int n = vsnprintf(NULL, 0, fmt, ap);
    va_end(ap);
    char *s = n >= 0 ? ex_alloc(e, (size_t)n + 1) : NULL;
    if (!s) return NULL;
    va_start(ap, fmt);
    vsnprintf(s, (size_t)n + 1, fmt, ap);
    va_end(ap);
    return s;
}

ts_status ex_refuse(ex *e, int32_t node, const char *fmt, ...) {
    if (e->status != TS_OK) return e->status;
    char why[300], lbl[64];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(why, sizeof why, fmt, ap);
    va_end(ap);
    const ts_node *n = &e->g->nodes[node];
    e->status =
        ts_fail(TS_ERR_UNSUPPORTED, "onnx export: op '%s' (making %s): %s", ts_ir_op_name(n->op),
                ts_value_label(e->g, n->out[0], lbl, sizeof lbl), why);
    return e->status;
}

static void count_op(ts_onnx_export_info *info, const char *op) {
    /* "Op xN" entries; a name is matched whole (Relu is not LeakyRelu). */
    char key[64];
    snprintf(key, sizeof key, "%s x", op);
    for (char *p = info->ops; (p = strstr(p, key)); p++) {
        if (p != info->ops && p[-1] != ' ') continue;
        char *end;
        const long k = strtol(p + strlen(key), &end, 10);
        char rest[sizeof info->ops];
        snprintf(rest, sizeof rest, "%s", end);
        const size_t at = (size_t)(p - info->ops) + strlen(key);
        snprintf(info->ops + at, sizeof info->ops - at, "%ld%s", k + 1, rest);
        return;
    }
    const size_t used = strlen(info->ops);
    snprintf(info->ops + used, sizeof info->ops - used, "%s%s x1", used ? ", " : "", op);
}

Onnx__NodeProto *ex_node(ex *e, const char *op, int n_in, const char *const *ins, const char *out) {
    if (e->n_nodes == e->cap_nodes) {
        const size_t cap = e->cap_nodes ? 2 * e->cap_nodes : 64;
        Onnx__NodeProto **nn = e->status == TS_OK ? realloc(e->nodes, cap * sizeof *nn) : NULL;
        if (!nn) {
            if (e->status == TS_OK) e->status = ts_fail(TS_ERR_NOMEM, "onnx export: out of memory");
            return NULL;
        }
        e->nodes = nn, e->cap_nodes = cap;
    }
    Onnx__NodeProto *n = ex_alloc(e, sizeof *n);
    char **in = ex_alloc(e, (size_t)n_in * sizeof *in);
    char **o = ex_alloc(e, sizeof *o);
    Onnx__AttributeProto **at = ex_alloc(e, EX_MAX_ATTRS * sizeof *at);
    if (!n || !in || !o || !at) return NULL;
    *n = (Onnx__NodeProto)ONNX__NODE_PROTO__INIT;
    for (int k = 0; k < n_in; k++)
        if (!(in[k] = ex_str(e, "%s", ins[k]))) return NULL;
    if (!(o[0] = ex_str(e, "%s", out))) return NULL;
    n->n_input = (size_t)n_in, n->input = in;
    n->n_output = 1, n->output = o;
    n->op_type = ex_str(e, "%s", op);
    n->name = ex_str(e, "%s_%zu", op, e->n_nodes);
    n->attribute = at;
    if (!n->op_type || !n->name) return NULL;
    e->nodes[e->n_nodes++] = n;
    if (e->info) count_op(e->info, op);
    return n;
}

static Onnx__AttributeProto *new_attr(ex *e, Onnx__NodeProto *n, const char *name,
                                      Onnx__AttributeProto__AttributeType type) {
    if (!n || n->n_attribute == EX_MAX_ATTRS) return NULL;
    Onnx__AttributeProto *a = ex_alloc(e, sizeof *a);
    if (!a) return NULL;
    *a = (Onnx__AttributeProto)ONNX__ATTRIBUTE_PROTO__INIT;
    a->name = ex_str(e, "%s", name);
    a->has_type = 1, a->type = type;
    n->attribute[n->n_attribute++] = a;
    return a;
}

void ex_attr_i(ex *e, Onnx__NodeProto *n, const char *name, int64_t v) {
    Onnx__AttributeProto *a = new_attr(e, n, name, ONNX__ATTRIBUTE_PROTO__ATTRIBUTE_TYPE__INT);
    if (a) a->has_i = 1, a->i = v;
}

void ex_attr_f(ex *e, Onnx__NodeProto *n, const char *name, double v) {
    Onnx__AttributeProto *a = new_attr(e, n, name, ONNX__ATTRIBUTE_PROTO__ATTRIBUTE_TYPE__FLOAT);
    if (a) a->has_f = 1, a->f = (float)v;
}

void ex_attr_ints(ex *e, Onnx__NodeProto *n, const char *name, int count, const int64_t *v) {
    Onnx__AttributeProto *a = new_attr(e, n, name, ONNX__ATTRIBUTE_PROTO__ATTRIBUTE_TYPE__INTS);
    int64_t *d = a ? ex_alloc(e, (size_t)count * sizeof *d) : NULL;
    if (!d) return;
    memcpy(d, v, (size_t)count * sizeof *d);
    a->n_ints = (size_t)count, a->ints = d;
}

/* A TensorProto of `count` elements of dtype f32 or i64 from host bytes. */
static Onnx__TensorProto *new_tensor(ex *e, const char *name, ts_dtype dt, int rank,
                                     const int64_t *dims, const void *data) {
    Onnx__TensorProto *t = ex_alloc(e, sizeof *t);
    int64_t *d = ex_alloc(e, (size_t)rank * sizeof *d);
    const size_t bytes = (size_t)ts_shape_numel(rank, dims) * ts_dtype_size(dt);
    uint8_t *raw = ex_alloc(e, bytes);
    if (!t || !d || !raw) return NULL;
    *t = (Onnx__TensorProto)ONNX__TENSOR_PROTO__INIT;
    memcpy(d, dims, (size_t)rank * sizeof *d);
    t->n_dims = (size_t)rank, t->dims = d;
    t->has_data_type = 1;
    t->data_type = dt == TS_F32  ? ONNX__TENSOR_PROTO__DATA_TYPE__FLOAT
                   : dt == TS_U8 ? ONNX__TENSOR_PROTO__DATA_TYPE__BOOL /* where's condition */
                                 : ONNX__TENSOR_PROTO__DATA_TYPE__INT64;
    t->name = ex_str(e, "%s", name);
    if (data) memcpy(raw, data, bytes);
    t->has_raw_data = 1, t->raw_data.len = bytes, t->raw_data.data = raw;
    return t;
}

const char *ex_const(ex *e, ts_dtype dt, int rank, const int64_t *dims, const void *data) {
    const char *name = ex_str(e, "const_%d", e->n_consts++);
    Onnx__TensorProto *t = name ? new_tensor(e, "", dt, rank, dims, data) : NULL;
    Onnx__NodeProto *n = t ? ex_node(e, "Constant", 0, NULL, name) : NULL;
    Onnx__AttributeProto *a =
        new_attr(e, n, "value", ONNX__ATTRIBUTE_PROTO__ATTRIBUTE_TYPE__TENSOR);
    if (!a) return NULL;
    a->t = t;
    return name;
}

/* An initialiser for a parameter or state value, its bytes from o->weight;
 * stored as f16 / bf16 when o->weights asks (*cast then names the Cast to
 * float32 the graph reads instead). */
static ts_status add_initializer(ex *e, const ts_value *v, const char **cast) {
    *cast = NULL;
    if (v->t.dtype != TS_F32)
        return e->status = ts_fail(TS_ERR_UNSUPPORTED,
                                   "onnx export: parameter '%s' is %s; tessel exports float32 "
                                   "weights only",
                                   v->name, ts_dtype_name(v->t.dtype));
    Onnx__TensorProto *t = new_tensor(e, v->name, TS_F32, v->t.rank, v->t.dims, NULL);
    if (!t) return e->status;
    ts_status s = e->o->weight(e->o->weight_ctx, v->name, t->raw_data.data, t->raw_data.len);
    if (s != TS_OK) return e->status = s;
    const int half = e->o->weights == TS_F16 || e->o->weights == TS_BF16;
    if (half) {
        const int64_t n = ts_type_numel(&v->t);
        uint16_t *h = ex_alloc(e, (size_t)n * 2);
        if (!h) return e->status;
        const float *f = (const float *)t->raw_data.data;
        if (e->o->weights == TS_F16)
            ts_f32_to_f16_n(h, f, n);
        else
            ts_f32_to_bf16_n(h, f, n);
        t->raw_data.data = (uint8_t *)h, t->raw_data.len = (size_t)n * 2;
        t->data_type = e->o->weights == TS_F16 ? ONNX__TENSOR_PROTO__DATA_TYPE__FLOAT16
                                               : ONNX__TENSOR_PROTO__DATA_TYPE__BFLOAT16;
        const char *nm = v->name;
        *cast = ex_str(e, "%s.f32", v->name);
        Onnx__NodeProto *c = *cast ? ex_node(e, "Cast", 1, &nm, *cast) : NULL;
        ex_attr_i(e, c, "to", ONNX__TENSOR_PROTO__DATA_TYPE__FLOAT);
        if (!c) return e->status;
    }
    if (e->n_inits == e->cap_inits) {
        const size_t cap = e->cap_inits ? 2 * e->cap_inits : 32;
        Onnx__TensorProto **ni = realloc(e->inits, cap * sizeof *ni);
        if (!ni) return e->status = ts_fail(TS_ERR_NOMEM, "onnx export: out of memory");
        e->inits = ni, e->cap_inits = cap;
    }
    e->inits[e->n_inits++] = t;
    if (e->info) e->info->n_initializers++, e->info->param_elems += ts_type_numel(&v->t);
    return TS_OK;
}

static Onnx__ValueInfoProto *value_info(ex *e, const char *name, const ts_type *t, int batch) {
    Onnx__ValueInfoProto *vi = ex_alloc(e, sizeof *vi);
    Onnx__TypeProto *tp = ex_alloc(e, sizeof *tp);
    Onnx__TypeProto__Tensor *tt = ex_alloc(e, sizeof *tt);
    Onnx__TensorShapeProto *sh = ex_alloc(e, sizeof *sh);
    Onnx__TensorShapeProto__Dimension **dims = ex_alloc(e, (size_t)t->rank * sizeof *dims);
    if (!vi || !tp || !tt || !sh || !dims) return NULL;
    *vi = (Onnx__ValueInfoProto)ONNX__VALUE_INFO_PROTO__INIT;
    *tp = (Onnx__TypeProto)ONNX__TYPE_PROTO__INIT;
    *tt = (Onnx__TypeProto__Tensor)ONNX__TYPE_PROTO__TENSOR__INIT;
    *sh = (Onnx__TensorShapeProto)ONNX__TENSOR_SHAPE_PROTO__INIT;
    for (int k = 0; k < t->rank; k++) {
        Onnx__TensorShapeProto__Dimension *d = ex_alloc(e, sizeof *d);
        if (!d) return NULL;
        *d = (Onnx__TensorShapeProto__Dimension)ONNX__TENSOR_SHAPE_PROTO__DIMENSION__INIT;
        if (k == batch - 1) {
            d->value_case = ONNX__TENSOR_SHAPE_PROTO__DIMENSION__VALUE_DIM_PARAM;
            d->dim_param = ex_str(e, "batch");
        } else {
            d->value_case = ONNX__TENSOR_SHAPE_PROTO__DIMENSION__VALUE_DIM_VALUE;
            d->dim_value = t->dims[k];
        }
        dims[k] = d;
    }
    sh->n_dim = (size_t)t->rank, sh->dim = dims;
    tt->has_elem_type = 1;
    tt->elem_type = t->dtype == TS_F32 ? ONNX__TENSOR_PROTO__DATA_TYPE__FLOAT
                                       : ONNX__TENSOR_PROTO__DATA_TYPE__INT64;
    tt->shape = sh;
    tp->value_case = ONNX__TYPE_PROTO__VALUE_TENSOR_TYPE, tp->tensor_type = tt;
    vi->name = ex_str(e, "%s", name);
    vi->type = tp;
    return vi;
}

static void record_io(ts_onnx_io *io, const char *name, const ts_type *t, int batch) {
    snprintf(io->name, sizeof io->name, "%s", name);
    io->dtype = t->dtype, io->rank = t->rank, io->batch_axis = batch - 1;
    for (int k = 0; k < t->rank; k++) io->dims[k] = t->dims[k];
}

int32_t ex_resolve(const ex *e, int32_t id) {
    while (e->alias[id] >= 0) id = e->alias[id];
    return id;
}

/* The ONNX name of value `id` (after aliases); leaves get their
 * initialiser, Constant node or graph input the first time they are read. */
const char *ex_name(ex *e, int32_t id) {
    id = ex_resolve(e, id);
    const ts_value *v = &e->g->values[id];
    if (v->kind == TS_VK_NODE) {
        if (!e->defined[id]) {
            ex_refuse(e, v->node,
                      "its output %d is read by the exported graph and has no ONNX form",
                      v->out_index);
            return NULL;
        }
        return id == e->out_id ? e->out_name : ex_str(e, "t%d", id);
    }
    if (v->kind == TS_VK_CONST) {
        if (!e->leaf_name[id]) {
            if (v->t.dtype != TS_F32 && v->t.dtype != TS_I64 && v->t.dtype != TS_U8) {
                e->status = ts_fail(TS_ERR_UNSUPPORTED,
                                    "onnx export: a %s constant has no export (f32, i64 and u8 "
                                    "conditions only)",
                                    ts_dtype_name(v->t.dtype));
                return NULL;
            }
            const char *z = ex_batch_zeros(e, id);
            e->leaf_name[id] = z ? z : ex_const(e, v->t.dtype, v->t.rank, v->t.dims, v->data);
        }
        return e->leaf_name[id];
    }
    if (!v->name) {
        e->status = ts_fail(TS_ERR_UNSUPPORTED, "onnx export: an unnamed %s value",
                            v->kind == TS_VK_INPUT ? "input" : "parameter");
        return NULL;
    }
    if (!e->leaf_name[id]) {
        if (v->kind == TS_VK_INPUT) {
            if (v->t.dtype != TS_F32 && v->t.dtype != TS_I64) {
                e->status = ts_fail(TS_ERR_UNSUPPORTED, "onnx export: input '%s' is %s", v->name,
                                    ts_dtype_name(v->t.dtype));
                return NULL;
            }
            Onnx__ValueInfoProto *vi = value_info(e, v->name, &v->t, e->batch[id]);
            if (!vi || e->n_inputs == EX_MAX_INPUTS) {
                if (e->status == TS_OK)
                    e->status = ts_fail(TS_ERR_UNSUPPORTED, "onnx export: more than %d inputs",
                                        EX_MAX_INPUTS);
                return NULL;
            }
            e->inputs[e->n_inputs++] = vi;
            if (e->info && e->info->n_inputs < TS_ONNX_MAX_IO)
                record_io(&e->info->inputs[e->info->n_inputs++], v->name, &v->t, e->batch[id]);
        } else {
            const char *cast;
            if (add_initializer(e, v, &cast) != TS_OK) return NULL;
            if (cast) return e->leaf_name[id] = cast;
        }
        e->leaf_name[id] = ex_str(e, "%s", v->name);
    }
    return e->leaf_name[id];
}

/* Marks the nodes `out` depends on, in need[]. */
static void mark_needed(ex *e, int32_t out, char *need) {
    const ts_graph *g = e->g;
    const int32_t p = g->values[out].node;
    if (p < 0) return;
    need[p] = 1;
    for (int32_t i = p; i >= 0; i--) {
        if (!need[i]) continue;
        const ts_node *n = &g->nodes[i];
        for (int k = 0; k < n->n_in; k++) {
            const int32_t q = g->values[n->in[k]].node;
            if (q >= 0) need[q] = 1;
        }
    }
}

static ts_status write_model(ex *e, const char *path) {
    Onnx__ModelProto m = ONNX__MODEL_PROTO__INIT;
    Onnx__GraphProto gp = ONNX__GRAPH_PROTO__INIT;
    Onnx__OperatorSetIdProto op = ONNX__OPERATOR_SET_ID_PROTO__INIT;
    Onnx__OperatorSetIdProto *ops[1] = {&op};
    op.domain = "", op.has_version = 1, op.version = e->o->opset;
    m.has_ir_version = 1, m.ir_version = 8;
    m.n_opset_import = 1, m.opset_import = ops;
    m.producer_name = "tessel", m.producer_version = TESSEL_VERSION;
    gp.name = "tessel";
    gp.n_node = e->n_nodes, gp.node = e->nodes;
    gp.n_initializer = e->n_inits, gp.initializer = e->inits;
    gp.n_input = (size_t)e->n_inputs, gp.input = e->inputs;
    gp.n_output = 1, gp.output = &e->output;
    m.graph = &gp;
    Onnx__StringStringEntryProto meta[TS_ONNX_MAX_META], *metap[TS_ONNX_MAX_META];
    const int n_meta = e->o->n_meta < TS_ONNX_MAX_META ? e->o->n_meta : TS_ONNX_MAX_META;
    for (int i = 0; i < n_meta; i++) {
        meta[i] = (Onnx__StringStringEntryProto)ONNX__STRING_STRING_ENTRY_PROTO__INIT;
        meta[i].key = (char *)e->o->meta_key[i], meta[i].value = (char *)e->o->meta_value[i];
        metap[i] = &meta[i];
    }
    m.n_metadata_props = (size_t)n_meta, m.metadata_props = metap;
    const size_t len = onnx__model_proto__get_packed_size(&m);
    uint8_t *buf = malloc(len ? len : 1);
    if (!buf) return ts_fail(TS_ERR_NOMEM, "onnx export: out of memory for %zu bytes", len);
    onnx__model_proto__pack(&m, buf);
    char tmp[4200];
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    FILE *f = fopen(tmp, "wb");
    if (!f) {
        free(buf);
        return ts_fail(TS_ERR_IO, "onnx export: cannot create %s: %s", tmp, strerror(errno));
    }
    const int ok = fwrite(buf, 1, len, f) == len;
    free(buf);
    if (fclose(f) != 0 || !ok || rename(tmp, path) != 0) {
        const int err = errno;
        remove(tmp);
        return ts_fail(TS_ERR_IO, "onnx export: cannot write %s: %s", path, strerror(err));
    }
    return TS_OK;
}

ts_status ts_onnx_export(const ts_graph *g, ts_val output, const char *path,
                         const ts_onnx_export_options *o, ts_onnx_export_info *info) {
    if (info) memset(info, 0, sizeof *info);
    if (!g || !path || !o || !o->weight || !ts_val_ok(output) || output.id >= g->n_values)
        return ts_fail(TS_ERR_INVALID,
                       "onnx export: needs a graph, an output of it, a path and a weight reader");
    if (o->weights != TS_F32 && o->weights != TS_F16 && o->weights != TS_BF16)
        return ts_fail(TS_ERR_INVALID, "onnx export: weights as %s (f32, f16 or bf16)",
                       ts_dtype_name(o->weights));
    if (o->opset < 17 || o->opset > 18)
        return ts_fail(TS_ERR_INVALID, "onnx export: opset %lld (tessel writes 17 or 18)",
                       (long long)o->opset);
    if (g->status != TS_OK)
        return ts_fail(g->status, "onnx export: the graph has an error: %s", g->error);
    ex e = {.g = g, .o = o, .info = info, .status = TS_OK};
    const size_t nv = (size_t)g->n_values, nn = (size_t)g->n_nodes;
    e.alias = malloc(nv * sizeof *e.alias);
    e.batch = calloc(nv, 1);
    e.defined = calloc(nv, 1);
    e.leaf_name = calloc(nv, sizeof *e.leaf_name);
    char *need = calloc(nn ? nn : 1, 1);
    ts_status s = TS_OK;
    if (!e.alias || !e.batch || !e.defined || !e.leaf_name || !need) {
        s = ts_fail(TS_ERR_NOMEM, "onnx export: out of memory");
        goto done;
    }
    for (size_t i = 0; i < nv; i++) {
        e.alias[i] = -1;
        const ts_value *v = &g->values[i];
        e.batch[i] = o->dynamic_batch && v->kind == TS_VK_INPUT && v->t.rank > 0;
        if (e.batch[i] && !e.b0) e.b0 = v->t.dims[0];
    }
    mark_needed(&e, output.id, need);
    for (int32_t i = 0; i < g->n_nodes; i++)
        if (need[i] && (g->nodes[i].op == TS_OP_GRU_CELL || g->nodes[i].op == TS_OP_LSTM_CELL))
            e.has_rnn = 1;
    /* Every op without an ONNX form first, before any is written: the error
     * names the op that stands in the way (gru_cell, not a reshape near it). */
    for (int32_t i = 0; i < g->n_nodes && e.status == TS_OK; i++)
        if (need[i] && !g->nodes[i].dead && !ex_supported(g->nodes[i].op))
            ex_refuse(&e, i, "%s",
                      g->nodes[i].op == TS_OP_SPMM
                          ? "a sparse matmul (the gcn's adjacency) has no ONNX export: ONNX has "
                            "no sparse-dense matmul, and tessel does not write the adjacency as "
                            "a dense [nodes, nodes] constant"
                          : EX_UNSUPPORTED);
    e.out_id = -1; /* set once the output's producer is known (after aliases) */
    for (int32_t i = 0; i < g->n_nodes && e.status == TS_OK; i++) {
        if (!need[i] || g->nodes[i].dead) continue;
        /* The graph output keeps its name: known before its node is written. */
        if (g->nodes[i].out[0] == output.id) {
            e.out_id = output.id;
            e.out_name =
                o->output_name
                    ? ex_str(&e, "%s", o->output_name)
                    : ex_str(&e, "%s",
                             g->values[output.id].name ? g->values[output.id].name : "output");
        }
        ex_emit(&e, i);
    }
    const int32_t out = e.status == TS_OK ? ex_resolve(&e, output.id) : -1;
    if (e.status == TS_OK && out != output.id) {
        /* The output is another value under a new name (a trailing dropout,
         * or the model's input itself): an Identity gives it its name. */
        const char *src = ex_name(&e, out);
        const char *name = o->output_name              ? o->output_name
                           : g->values[output.id].name ? g->values[output.id].name
                                                       : "output";
        if (src) ex_node(&e, "Identity", 1, &src, name);
        e.out_name = ex_str(&e, "%s", name);
        e.batch[output.id] = e.batch[out];
    }
    if (e.status == TS_OK) {
        e.output = value_info(&e, e.out_name, &g->values[output.id].t, e.batch[output.id]);
        if (info) record_io(&info->output, e.out_name, &g->values[output.id].t, e.batch[output.id]);
    }
    if (e.status == TS_OK && e.n_inputs == 0)
        e.status = ts_fail(TS_ERR_UNSUPPORTED,
                           "onnx export: the output depends on no graph input (nothing to feed)");
    if (e.status == TS_OK) s = write_model(&e, path);
    if (e.status != TS_OK) s = e.status;
    if (info) info->n_nodes = (int)e.n_nodes;
done:
    for (int i = 0; i < e.n_allocs; i++) free(e.allocs[i]);
    free(e.allocs), free(e.nodes), free(e.inits);
    free(e.alias), free(e.batch), free(e.defined), free((void *)e.leaf_name), free(need);
    return s;
}
