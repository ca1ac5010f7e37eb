/* quant/export.h — FP8 weight export of a checkpoint (internal; used by
 * `tessel export CKPT --safetensors FILE --fp8 e4m3|e5m2`). */
#ifndef TS_QUANT_EXPORT_H
#define TS_QUANT_EXPORT_H

#include "tessel/ckpt.h"
#include "tessel/quant.h"

/* Write the checkpoint's parameters (no optimizer state) as one standard
 * safetensors file in which every floating-point parameter W becomes
 *   "W"        dtype F8_E4M3 or F8_E5M2 (fmt), W's shape: the codes
 *              q = encode(W / s), saturating, as ts_quantize in f32;
 *   "W.scale"  dtype F32, shape [] (a scalar): the dequantisation step s,
 *              so W ~ decode(q) * s; s = amax(|W|) / fmt_max (max
 *              calibration, margin 0), 1 for an all-zero tensor.
 * Other parameters are written unchanged. Metadata: format=pt,
 * tessel_step, tessel_checkpoint_id, tessel_fp8 (e4m3|e5m2) and
 * tessel_fp8_scale ("dequant": w = f8 * scale). A parameter named
 * "W.scale" next to a quantised "W" is an error (the names would clash). */
ts_status ts_quant_export_safetensors(const ts_ckpt *c, const char *path, ts_dtype fmt);

#endif
