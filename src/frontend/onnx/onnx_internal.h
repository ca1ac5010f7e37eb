/* onnx_internal.h — the ONNX importer's shared state (src/frontend/onnx):
 * load.c reads the file and tensor payloads, import.c walks the graph, ops.c
 * maps each node onto the public builder API (tessel/graph.h). */
#ifndef TS_FRONTEND_ONNX_INTERNAL_H
#define TS_FRONTEND_ONNX_INTERNAL_H

#include <stdint.h>
#include "onnx.pb-c.h"
#include "tessel/onnx.h"
#include "tessel/status.h"

/* A tensor known at import time: an integer initialiser, a Constant, a
 * Shape. Exactly one of f / i is set (f32 or i64 elements). */
typedef struct onnx_const {
    ts_dtype dtype; /* TS_F32 or TS_I64 */
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
} onnx_value;

typedef struct onnx_ctx {
    ts_graph *g;
    ts_onnx_info *info;
    const ts_onnx_options *opts;
    int64_t opset;
    char dir[4096]; /* the model's directory, resolved (external data lives there) */
    onnx_value *vals;
    int n_vals, cap_vals;
} onnx_ctx;

/* load.c */
/* Reads and unpacks the file; checks the opset (13..18) into *opset. */
ts_status onnx_load(const char *path, Onnx__ModelProto **out, int64_t *opset, char *dir,
                    size_t dir_size);
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

/* ops.c: imports one node, defining its outputs; TS_ERR_UNSUPPORTED after
 * onnx_refuse, other errors are the graph's or allocation's. */
ts_status onnx_import_node(onnx_ctx *x, const Onnx__NodeProto *n);

#endif
