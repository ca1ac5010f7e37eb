#include <string.h>
#include "core.h"

static const struct {
    const char *name;
    size_t size;
    int is_float;
} dtypes[TS_DTYPE_COUNT] = {
    [TS_F32] = {"f32", 4, 1},    [TS_F64] = {"f64", 8, 1},       [TS_F16] = {"f16", 2, 1},
    [TS_BF16] = {"bf16", 2, 1},  [TS_F8E4M3] = {"f8e4m3", 1, 1}, [TS_F8E5M2] = {"f8e5m2", 1, 1},
    [TS_I32] = {"i32", 4, 0},    [TS_I64] = {"i64", 8, 0},       [TS_U8] = {"u8", 1, 0},
};

size_t ts_dtype_size(ts_dtype t) { return (unsigned)t < TS_DTYPE_COUNT ? dtypes[t].size : 0; }
const char *ts_dtype_name(ts_dtype t) { return (unsigned)t < TS_DTYPE_COUNT ? dtypes[t].name : "?"; }
int ts_dtype_is_float(ts_dtype t) { return (unsigned)t < TS_DTYPE_COUNT && dtypes[t].is_float; }

int ts_dtype_parse(const char *name) {
    for (int i = 0; i < TS_DTYPE_COUNT; i++)
        if (strcmp(name, dtypes[i].name) == 0) return i;
    return -1;
}
