/* onnx_internal.h — the ONNX importer's shared state (src/frontend/onnx):
 * load.c reads the file and tensor payloads, import.c walks the graph, ops.c
 * maps each node onto the public builder API (tessel/graph.h). */
#ifndef TS_FRONTEND_ONNX_INTERNAL_H
#define TS_FRONTEND_ONNX_INTERNAL_H

#include <stdint.h>
#include "onnx.pb-c.h"
#include "tessel/onnx.h"
#include "tessel/status.h"

/* A tensor known at import time: an initialiser, a Constant, a Shape or a
 * value folded from them (fold.c). Exactly one of f / i is set: f32
 * elements, or i64 elements for TS_I64 and TS_U8 (ONNX bool, 0 / 1). */
typedef struct onnx_const {
    ts_dtype dtype; /* TS_F32, TS_I64 or TS_U8 */
    int rank;
    int64_t dims[TS_MAX_RANK];
    int64_t n;
    float *f;
    int64_t *i;
} onnx_const;

/* One named ONNX value: a graph value (v), a constant (c, materialised as a
 * ts_constant the first time an op needs it as a tensor) or neither when
 * the node that makes it was refused. */
typedef struct onnx_value {
    char *name;
    ts_val v;
    onnx_const *c;
    /* A float initialiser: made a parameter under its name the first time an
     * op reads it as a tensor (onnx_get), so one only ever read as data (a
     * BatchNormalization's running statistics) is never a parameter. */
    int param;
} onnx_value;

typedef struct onnx_ctx {
    ts_graph *g;
    ts_onnx_info *info;
    const ts_onnx_options *opts;
    int64_t opset;
    char dir[4096]; /* the model's directory, resolved (external data lives there) */
    onnx_value *vals;
    int n_vals, cap_vals;
    const Onnx__GraphProto *gp; /* for the patterns that look at other nodes */
    size_t at;                  /* the index of the node being imported */
    unsigned char *skip;        /* [gp->n_node]: nodes a pattern already imported */
} onnx_ctx;

/* load.c */
/* Reads and unpacks the file; checks the opset (13..18) into *opset and
 * the SHA-256 of its bytes into sha (against expect when not NULL). */
ts_status onnx_load(const char *path, Onnx__ModelProto **out, int64_t *opset, char *dir,
                    size_t dir_size, char sha[65], const char *expect);
/* A tensor's payload as f32 or i64 host data (raw, typed fields or external
 * data under dir). Other element types: TS_ERR_UNSUPPORTED. */
ts_status onnx_tensor_read(const Onnx__TensorProto *t, const char *dir, onnx_const *out);
void onnx_const_free(onnx_const *c);

/* import.c */
onnx_value *onnx_find(onnx_ctx *x, const char *name);
ts_status onnx_define(onnx_ctx *x, const char *name, ts_val v, onnx_const *c);
/* The value as a graph value (materialising a constant); TS_NONE if absent. */
ts_val onnx_get(onnx_ctx *x, const char *name);
/* Record a refusal of node n ("node 'N' (Op, opset K): why"); returns
 * TS_ERR_UNSUPPORTED. */
ts_status onnx_refuse(onnx_ctx *x, const Onnx__NodeProto *n, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* The value's constant, NULL for a graph value or a parameter. */
const onnx_const *onnx_const_of(onnx_ctx *x, const char *name);
/* A new constant of dtype / dims with zeroed elements; NULL when out of memory. */
onnx_const *onnx_const_new(ts_dtype dt, int rank, const int64_t *dims);
/* Element k of c as a double. */
double onnx_const_at(const onnx_const *c, int64_t k);
/* The index of the node making value `name` (before x->at), -1 if none;
 * the number of nodes after x->at reading it, and the first in *first. */
long onnx_producer(const onnx_ctx *x, const char *name);
int onnx_consumers(const onnx_ctx *x, const char *name, long *first);

/* fold.c: a node whose inputs are all constants, computed at import (the
 * shape arithmetic of a torch export). *done is 0 when the op is not one
 * folded here (it is then imported as a graph op). */
ts_status onnx_fold(onnx_ctx *x, const Onnx__NodeProto *n, int *done);

/* ops.c: imports one node, defining its outputs; TS_ERR_UNSUPPORTED after
 * onnx_refuse, other errors are the graph's or allocation's. */
ts_status onnx_import_node(onnx_ctx *x, const Onnx__NodeProto *n);

/* Shared by the op files (ops.c): attributes and I/O of a node. */
const Onnx__AttributeProto *onnx_attr(const Onnx__NodeProto *n, const char *name);
int64_t onnx_attr_i(const Onnx__NodeProto *n, const char *name, int64_t dflt);
double onnx_attr_f(const Onnx__NodeProto *n, const char *name, double dflt);
int onnx_attr_ints(const Onnx__NodeProto *n, const char *name, int64_t *v, int max);
ts_status onnx_only_attrs(onnx_ctx *x, const Onnx__NodeProto *n, const char *known);
ts_status onnx_need_inputs(onnx_ctx *x, const Onnx__NodeProto *n, size_t lo, size_t hi);
ts_val onnx_in(onnx_ctx *x, const Onnx__NodeProto *n, size_t k);
ts_status onnx_out(onnx_ctx *x, const Onnx__NodeProto *n, ts_val v);

/* ops_more.c, rnn.c, patterns.c: the op table's later entries. */
ts_status onnx_op_more(onnx_ctx *x, const Onnx__NodeProto *n, int *found);
ts_status onnx_op_rnn(onnx_ctx *x, const Onnx__NodeProto *n); /* GRU, LSTM */
/* Erf inside torch's erf GELU: the whole pattern as one ts_gelu. */
ts_status onnx_gelu_erf(onnx_ctx *x, const Onnx__NodeProto *n);
/* Tanh inside torch's tanh GELU: the whole pattern as one ts_gelu; *fused
 * 0 when n is an ordinary tanh. */
ts_status onnx_gelu_tanh(onnx_ctx *x, const Onnx__NodeProto *n, int *fused);
/* MatMul(Softmax(Where(mask, -inf, scale * q k^T)), v) as ts_attention;
 * *fused 0 when n is not the end of that pattern. */
ts_status onnx_attention(onnx_ctx *x, const Onnx__NodeProto *n, int *fused);

#endif
