/* export_internal.h — the ONNX exporter's state (src/frontend/onnx):
 * export.c walks the graph and writes the ModelProto, export_ops.c writes
 * the ONNX nodes of each tessel op. */
#ifndef TS_FRONTEND_ONNX_EXPORT_INTERNAL_H
#define TS_FRONTEND_ONNX_EXPORT_INTERNAL_H

#include "core/core.h"
#include "ir/ir.h"
#include "onnx.pb-c.h"
#include "tessel/onnx.h"

enum { EX_MAX_ATTRS = 8, EX_MAX_INPUTS = 8 };

typedef struct ex {
    const ts_graph *g;
    const ts_onnx_export_options *o;
    ts_onnx_export_info *info;
    ts_status status; /* the first failure; every helper does nothing after it */
    void **allocs;    /* everything the ModelProto points at */
    int n_allocs, cap_allocs;
    Onnx__NodeProto **nodes;
    size_t n_nodes, cap_nodes;
    Onnx__TensorProto **inits;
    size_t n_inits, cap_inits;
    Onnx__ValueInfoProto *inputs[EX_MAX_INPUTS], *output;
    int n_inputs, n_consts;
    int32_t *alias;         /* value -> the value it stands for (dropout's input), -1 */
    char *batch;            /* value -> 1 + the axis that carries the dynamic batch, 0 none */
    int64_t b0;             /* the batch size the graph was built for (its inputs' first dim) */
    int has_rnn;            /* the graph has gru / lstm cells (zero states sized by the batch) */
    char *defined;          /* node value -> written under its ONNX name */
    const char **leaf_name; /* input/param/const value -> its ONNX name once written */
    int32_t out_id;         /* the graph output's value */
    const char *out_name;
} ex;

void *ex_alloc(ex *e, size_t n);
char *ex_str(ex *e, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* Fails the export naming node `node`'s op and value; returns the status. */
ts_status ex_refuse(ex *e, int32_t node, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
/* Appends an ONNX node with one output; NULL after a failure. */
Onnx__NodeProto *ex_node(ex *e, const char *op, int n_in, const char *const *ins, const char *out);
void ex_attr_i(ex *e, Onnx__NodeProto *n, const char *name, int64_t v);
void ex_attr_f(ex *e, Onnx__NodeProto *n, const char *name, double v);
void ex_attr_ints(ex *e, Onnx__NodeProto *n, const char *name, int count, const int64_t *v);
/* A Constant node holding the tensor; returns its output's name. */
const char *ex_const(ex *e, ts_dtype dt, int rank, const int64_t *dims, const void *data);
int32_t ex_resolve(const ex *e, int32_t id);
/* The ONNX name of a value read by a node being written (NULL on failure). */
const char *ex_name(ex *e, int32_t id);

/* export_ops.c: whether op has an ONNX form here; writes graph node `node`
 * (or aliases its output). */
#define EX_UNSUPPORTED                                                                             \
    "no ONNX export yet (tessel exports matmul, add, sub, mul, div, maximum, minimum, where, "     \
    "neg, "                                                                                        \
    "exp, log, sqrt, rsqrt, abs, relu, leaky_relu, sigmoid, tanh, gelu, pow_scalar, "              \
    "affine_scalar, cast, softmax, log_softmax, layer_norm, reduce_sum, reduce_max, conv, "        \
    "conv_transpose, pool, batch_norm, attention, gru_cell, lstm_cell, reshape, permute, expand, " \
    "concat, slice, gather, dropout)"
int ex_supported(int op);
void ex_emit(ex *e, int32_t node);

/* The axis of value vid that carries the dynamic batch, -1 if none. */
int ex_bax(const ex *e, int32_t vid);
/* The name node output vid is written under, marked defined. */
const char *ex_out_name(ex *e, int32_t vid);
/* An int64 vector constant. */
const char *ex_ints(ex *e, int n, const int64_t *v);

/* export_more.c: the ops added for the GPT, GRU / LSTM and U-Net. */
int ex_more_supported(int op);
/* Writes node id; returns 1 when it set the output's batch axis itself. */
int ex_more_emit(ex *e, int32_t id);
/* The zero state of a GRU / LSTM (a constant [batch, n] of zeros) as a
 * ConstantOfShape of the batch read from a graph input; NULL when the
 * constant is not one. */
const char *ex_batch_zeros(ex *e, int32_t vid);

#endif
