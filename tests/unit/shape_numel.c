/* ts_shape_numel_checked: overflow-checked element counts for sizes
 * derived from data (a label of 2^62 as a class count must not wrap). */
#include <stdint.h>
#include <string.h>
#include "check.h"
#include "core/core.h"

int main(void) {
    int64_t n = -1;
    int64_t a[3] = {2, 3, 4};
    CHECK_OK(ts_shape_numel_checked(3, a, &n));
    CHECK(n == 24, "2x3x4 = %lld", (long long)n);
    CHECK_OK(ts_shape_numel_checked(0, a, &n));
    CHECK(n == 1, "scalar");
    int64_t big[2] = {(int64_t)1 << 62, 148};
    CHECK(ts_shape_numel_checked(2, big, &n) == TS_ERR_SHAPE && n == 0, "2^62 x 148 overflows");
    CHECK(strstr(ts_last_error(), "overflow") && strstr(ts_last_error(), "148"), "named: %s",
          ts_last_error());
    int64_t maxed[2] = {INT64_MAX, 2};
    CHECK(ts_shape_numel_checked(2, maxed, &n) == TS_ERR_SHAPE, "INT64_MAX x 2 overflows");
    int64_t neg[2] = {4, -1};
    CHECK(ts_shape_numel_checked(2, neg, &n) == TS_ERR_SHAPE, "negative refused");
    int64_t edge[2] = {INT64_MAX, 1};
    CHECK_OK(ts_shape_numel_checked(2, edge, &n));
    CHECK(n == INT64_MAX, "INT64_MAX x 1");
    return check_summary("unit/shape_numel");
}
