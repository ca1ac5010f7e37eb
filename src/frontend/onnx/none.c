/* ts_onnx_import and ts_onnx_export in a build without protobuf-c or Debian's onnx.proto
 * (CMakeLists.txt compiles this file instead of the importer): every call
 * says what to install. */
#include <string.h>
#include "core/core.h"
#include "tessel/onnx.h"

ts_status ts_onnx_import(ts_graph *g, const char *path, const ts_onnx_options *opts,
                         ts_onnx_info *info) {
    (void)g, (void)opts;
    if (info) memset(info, 0, sizeof *info);
    return ts_fail(TS_ERR_UNSUPPORTED,
                   "onnx: cannot read %s: tessel was built without ONNX support (install "
                   "protobuf-c-compiler, libprotobuf-c-dev and libonnx-dev with "
                   "scripts/install-deps.sh, then rebuild)",
                   path ? path : "?");
}

ts_status ts_onnx_export(const ts_graph *g, ts_val output, const char *path,
                         const ts_onnx_export_options *o, ts_onnx_export_info *info) {
    (void)g, (void)output, (void)o;
    if (info) memset(info, 0, sizeof *info);
    return ts_fail(TS_ERR_UNSUPPORTED,
                   "onnx: cannot write %s: tessel was built without ONNX support (install "
                   "protobuf-c-compiler, libprotobuf-c-dev and libonnx-dev with "
                   "scripts/install-deps.sh, then rebuild)",
                   path ? path : "?");
}
