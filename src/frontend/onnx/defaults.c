/* ts_onnx_export_defaults: the export options need no protobuf-c, so a
 * build without ONNX support (none.c) compiles this file too. */
#include <string.h>
#include "tessel/onnx.h"

ts_onnx_export_options ts_onnx_export_defaults(void) {
    ts_onnx_export_options o;
    memset(&o, 0, sizeof o);
    o.opset = 18;
    o.dynamic_batch = 1;
    return o;
}
