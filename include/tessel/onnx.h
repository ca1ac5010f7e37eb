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

#include <stdint.h>
#include "tessel/graph.h"

#ifdef __cplusplus
extern "C" {
#endif

#define TS_ONNX_MAX_IO      8  /* graph inputs and outputs kept in ts_onnx_info */
#define TS_ONNX_MAX_REFUSED 32 /* refusals kept (n_refused counts them all) */

typedef struct ts_onnx_options {
    /* The value of every symbolic (dim_param) or missing dimension of a
     * graph input; 0: such a dimension is an error naming it. */
    int64_t batch;
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
} ts_onnx_info;

/* Read the ONNX file at `path` into g (see above). opts may be NULL (no
 * value for dynamic dimensions). info is filled as far as the import got
 * (always zeroed first). Errors: TS_ERR_IO (unreadable file or external
 * data), TS_ERR_FORMAT (not an ONNX model), TS_ERR_UNSUPPORTED (opset,
 * op or attribute), TS_ERR_INVALID (a dynamic dimension without a value),
 * or the graph's own. */
ts_status ts_onnx_import(ts_graph *g, const char *path, const ts_onnx_options *opts,
                         ts_onnx_info *info);

#ifdef __cplusplus
}
#endif
#endif
