/* The sum kernel over the leading axis of a wide matrix ([R, C] -> [1, C],
 * C > 256: the column-block path) writes exactly its C outputs. It once
 * wrote up to 768 values past the output (each 256-column block summed
 * every column from its start), silently corrupting whatever the memory
 * plan placed next (a LayerNorm's saved statistics in bf16 W1). */
#include <stdlib.h>
#include <string.h>
#include "check.h"
#include "ops/op.h"

static void check_shape(int64_t R, int64_t C) {
    const int64_t pad = 1024;
    float *x = malloc(sizeof(float) * (size_t)(R * C)),
          *o = malloc(sizeof(float) * (size_t)(C + pad));
    double *scratch = malloc(sizeof(double) * (size_t)(R * C + C + 64));
    for (int64_t i = 0; i < R * C; i++) x[i] = (float)((i * 7) % 13) - 6.0f;
    for (int64_t j = 0; j < C + pad; j++) o[j] = -12345.0f;
    ts_attrs a = ts_attrs_zero();
    a.reduce.axes = 1; /* axis 0 */
    a.reduce.keepdim = 1;
    a.reduce.scale = 1.0;
    ts_tensor in = {TS_F32, 2, {R, C}, x}, out = {TS_F32, 2, {1, C}, o};
    ts_step_ctx ctx = {1, 0, 0, 1};
    ts_kargs k = {&a,   1,     1,   &in, &out, scratch, sizeof(double) * (size_t)(R * C + C + 64),
                  &ctx, "sum", NULL};
    CHECK_OK(ts_op_get(TS_OP_REDUCE_SUM)->kernel(&k));
    int bad = 0, past = 0;
    for (int64_t j = 0; j < C; j++) {
        double s = 0;
        for (int64_t r = 0; r < R; r++) s += x[r * C + j];
        bad += o[j] != (float)s;
    }
    for (int64_t j = C; j < C + pad; j++) past += o[j] != -12345.0f;
    CHECK(bad == 0, "[%lld, %lld] summed over rows: %d wrong columns", (long long)R, (long long)C,
          bad);
    CHECK(past == 0, "[%lld, %lld]: %d values written past the output", (long long)R, (long long)C,
          past);
    free(x);
    free(o);
    free(scratch);
}

int main(void) {
    check_shape(256, 1024);
    check_shape(3, 1000);
    check_shape(5, 257);
    check_shape(4, 256);
    check_shape(2, 100);
    return check_summary("sum_bounds");
}
