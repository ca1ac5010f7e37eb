/* tessel/dtype.h — element types.
 *
 * Floating types carry values; integer types carry indices and labels; u8
 * carries boolean masks (0 or 1). f64 exists for gradient checks and
 * reference computations; training runs in f32 (bf16/f16/f8 with the
 * precision pass).
 */
#ifndef TESSEL_DTYPE_H
#define TESSEL_DTYPE_H

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef enum ts_dtype {
    TS_F32 = 0,
    TS_F64,
    TS_F16,
    TS_BF16,
    TS_F8E4M3,
    TS_F8E5M2,
    TS_I32,
    TS_I64,
    TS_U8,
    TS_DTYPE_COUNT
} ts_dtype;

/* Bytes per element. */
size_t ts_dtype_size(ts_dtype t);
/* Lower-case name: "f32", "i64", ... */
const char *ts_dtype_name(ts_dtype t);
/* Parse a name produced by ts_dtype_name; returns -1 if unknown. */
int ts_dtype_parse(const char *name);
/* 1 for floating types (f32, f64, f16, bf16, f8*), else 0. */
int ts_dtype_is_float(ts_dtype t);

#ifdef __cplusplus
}
#endif
#endif
