/* tessel/onnx.h — importing an ONNX model (a PyTorch torch.onnx.export) into
 * a graph, to train it like any other (docs/onnx.md).
 *
 *     ts_graph *g = ts_graph_new();
 *     ts_onnx_info info;
 *     ts_onnx_options o = {.batch = 32};            // a dynamic first dim's value
 *     if (ts_onnx_import(g, "mlp.onnx", &o, &info) != TS_OK) puts(ts_last_error());
 *     ts_val y = ts_input(g, "y", TS_I64, 1, (int64_t[]){32});
 *     ts_val loss = ts_cross_entropy(g, info.outputs[0], y, -100);
 *
 * Initialisers of a float type become parameters under their ONNX names
 * (kept, so checkpoints and fixtures line up with the PyTorch state dict);
 * integer initialisers and Constant / Shape results are folded at import.
 * Graph inputs become ts_input values under their ONNX names. Opsets 13 to
 * 18 of the default domain are read. External data (a .onnx beside a .data
 * file) is read from the model's directory only.
 *
 * ts_onnx_import stops at nothing: it walks every node and records each one
 * it cannot import in info.refused (node name, op type, opset and why), then
 * fails naming the first if there were any. `tessel onnx check` prints them.
 * Built without protobuf-c / libonnx-dev, it fails with TS_ERR_UNSUPPORTED.
 */
#ifndef TESSEL_ONNX_H
#define TESSEL_ONNX_H

#include <stddef.h>
#include <stdint.h>
#include "tessel/graph.h"

#ifdef __cplusplus
extern "C" {
#endif

#define TS_ONNX_MAX_IO      8  /* graph inputs and outputs kept in ts_onnx_info */
#define TS_ONNX_MAX_REFUSED 32 /* refusals kept (n_refused counts them all) */

typedef struct ts_onnx_options {
    /* The value of a symbolic (dim_param) or missing first dimension of a
     * graph input; 0: such a dimension is an error naming it. */
    int64_t batch;
    /* dims[k] > 0: the value of a dynamic dimension at axis k of a graph
     * input (a language model's sequence axis: dims[1] = model.ctx); a
     * dynamic axis k >= 1 without one is an error naming it. */
    int64_t dims[TS_MAX_RANK];
    /* Not NULL: the SHA-256 (64 hex digits) the file must have; another is
     * a TS_ERR_IO error saying the file changed. */
    const char *expect_sha256;
} ts_onnx_options;

typedef struct ts_onnx_info {
    int64_t opset, ir_version;
    int n_inputs, n_outputs;
    char input_names[TS_ONNX_MAX_IO][128], output_names[TS_ONNX_MAX_IO][128];
    ts_val inputs[TS_ONNX_MAX_IO], outputs[TS_ONNX_MAX_IO];
    int n_params;        /* float initialisers made parameters */
    int64_t param_elems; /* their elements */
    int n_nodes;
    char ops[512]; /* "Conv x2, Relu x3, ..." in first-seen order */
    int n_refused;
    char refused[TS_ONNX_MAX_REFUSED][256];
    char sha256[65]; /* of the model file's bytes as read (not its external data) */
    int n_fused;     /* attention and GELU patterns imported as one op */
} ts_onnx_info;

/* Read the ONNX file at `path` into g (see above). opts may be NULL (no
 * value for dynamic dimensions). info is filled as far as the import got
 * (always zeroed first). Errors: TS_ERR_IO (unreadable file or external
 * data), TS_ERR_FORMAT (not an ONNX model), TS_ERR_UNSUPPORTED (opset,
 * op or attribute), TS_ERR_INVALID (a dynamic dimension without a value),
 * or the graph's own. */
ts_status ts_onnx_import(ts_graph *g, const char *path, const ts_onnx_options *opts,
                         ts_onnx_info *info);

/* ---- export ---------------------------------------------------------------
 *
 * The forward graph that computes `output` (the nodes it depends on, never a
 * loss or backward node) written as an ONNX ModelProto (docs/onnx.md,
 * "Exporting"): parameters and persistent state (batch-norm running
 * statistics) become float initialisers under their tessel names, with the
 * bytes `weight` reads (from a checkpoint: ts_ckpt_read); constants become
 * Constant nodes; inputs keep their names and, with dynamic_batch, declare
 * their first dimension as dim_param "batch". An op without an ONNX form
 * here fails with TS_ERR_UNSUPPORTED naming it; nothing is written then.
 *
 *     ts_onnx_export_options o = ts_onnx_export_defaults();
 *     o.weight = read_fn, o.weight_ctx = ckpt;
 *     if (ts_onnx_export(g, m.output, "model.onnx", &o, NULL) != TS_OK) ...
 */
typedef ts_status (*ts_onnx_weight_fn)(void *ctx, const char *name, void *dst, size_t bytes);

#define TS_ONNX_MAX_META 8

typedef struct ts_onnx_export_options {
    int64_t opset;     /* default-domain opset written (17 or 18; default 18) */
    int dynamic_batch; /* 1 (default): inputs' first dimension is "batch" */
    /* TS_F32 (0, the default), TS_F16 or TS_BF16: the initialisers' type;
     * half ones are read through a Cast to float32 (half the file, the
     * weights rounded to nearest even). */
    ts_dtype weights;
    ts_onnx_weight_fn weight;
    void *weight_ctx;
    const char *output_name; /* NULL: the output value's own name */
    /* metadata_props entries (lineage: the checkpoint it came from) */
    int n_meta;
    const char *meta_key[TS_ONNX_MAX_META], *meta_value[TS_ONNX_MAX_META];
} ts_onnx_export_options;

ts_onnx_export_options ts_onnx_export_defaults(void);

/* A graph input or output as written: batch_axis is the axis declared
 * dynamic ("batch"), -1 for none. */
typedef struct ts_onnx_io {
    char name[128];
    ts_dtype dtype;
    int rank, batch_axis;
    int64_t dims[TS_MAX_RANK];
} ts_onnx_io;

typedef struct ts_onnx_export_info {
    int n_nodes, n_initializers;
    int64_t param_elems; /* elements of the initialisers */
    char ops[512];       /* "Gemm x3, Relu x2, ..." in first-written order */
    int n_inputs;        /* the graph inputs (a Triton config lists them) */
    ts_onnx_io inputs[TS_ONNX_MAX_IO], output;
} ts_onnx_export_info;

/* Write the ONNX file (replacing `path` only once it is complete). info
 * may be NULL. Built without ONNX support: TS_ERR_UNSUPPORTED. */
ts_status ts_onnx_export(const ts_graph *g, ts_val output, const char *path,
                         const ts_onnx_export_options *o, ts_onnx_export_info *info);

#ifdef __cplusplus
}
#endif
#endif
