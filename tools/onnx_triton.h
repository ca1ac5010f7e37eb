/* onnx_triton.h — a Triton model repository for an exported model
 * (tools/onnx_triton.c, used by `tessel export --triton`). */
#ifndef TESSEL_ONNX_TRITON_H
#define TESSEL_ONNX_TRITON_H
#include <stddef.h>
#include "tessel/onnx.h"

/* Whether the model fits Triton's dynamic batching (the batch on the first
 * axis of every input and the output, Triton types). */
ts_status triton_config_check(const ts_onnx_export_info *info);
/* Writes config.pbtxt at path (whole, then renamed). */
ts_status triton_config_write(const char *path, const char *name, const ts_onnx_export_info *info,
                              int64_t max_batch);
/* Creates dir, dir/name and dir/name/1; model_dir receives the last. */
ts_status triton_dirs(const char *dir, const char *name, char *model_dir, size_t n);

#endif
