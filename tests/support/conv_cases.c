#include "conv_cases.h"
#include <string.h>
#include "core/core.h"
#include "tessel/util.h"

/* clang-format off */
const conv_case conv_cases[] = {
    {"conv1d", 0, 1, 1, {2, 3, 7}, {4, 3, 3}, {1}, {0}, {1}, {0}, 1},
    {"conv1d stride 2 pad 1", 0, 1, 1, {2, 3, 8}, {4, 3, 3}, {2}, {1}, {1}, {0}, 1},
    {"conv1d stride 3, unread tail", 0, 1, 0, {1, 2, 8}, {2, 2, 3}, {3}, {0}, {1}, {0}, 1},
    {"conv1d dilation 3", 0, 1, 1, {2, 2, 9}, {3, 2, 3}, {1}, {2}, {3}, {0}, 1},
    {"conv2d pad 1", 0, 2, 1, {2, 3, 5, 6}, {4, 3, 3, 3}, {1, 1}, {1, 1}, {1, 1}, {0}, 1},
    {"conv2d stride (2,3) odd sizes", 0, 2, 1, {1, 2, 7, 5}, {3, 2, 3, 2}, {2, 3}, {1, 0}, {1, 1},
     {0}, 1},
    {"conv2d dilation (2,1)", 0, 2, 0, {1, 2, 7, 6}, {2, 2, 3, 3}, {1, 1}, {2, 1}, {2, 1}, {0}, 1},
    {"conv2d groups 2", 0, 2, 1, {1, 4, 5, 5}, {6, 2, 3, 3}, {1, 1}, {0, 1}, {1, 1}, {0}, 2},
    {"conv2d depthwise", 0, 2, 1, {2, 3, 5, 5}, {3, 1, 3, 3}, {1, 1}, {1, 1}, {1, 1}, {0}, 3},
    {"conv2d depthwise x2", 0, 2, 0, {1, 2, 4, 5}, {4, 1, 3, 3}, {2, 1}, {1, 1}, {1, 1}, {0}, 2},
    {"conv2d size-1 dims, 1x1 kernel", 0, 2, 1, {1, 1, 1, 5}, {2, 1, 1, 1}, {1, 1}, {0, 0}, {1, 1},
     {0}, 1},
    {"conv2d 20 columns (vector lanes)", 0, 2, 1, {2, 3, 4, 20}, {4, 3, 3, 3}, {1, 1}, {1, 1},
     {1, 1}, {0}, 1},
    {"conv3d pad 1", 0, 3, 1, {1, 2, 4, 5, 4}, {3, 2, 3, 3, 3}, {1, 1, 1}, {1, 1, 1}, {1, 1, 1},
     {0}, 1},
    {"conv3d stride, dilation", 0, 3, 0, {2, 2, 5, 5, 6}, {2, 2, 2, 2, 3}, {2, 1, 2}, {1, 0, 1},
     {1, 2, 1}, {0}, 1},
    {"conv3d groups 2", 0, 3, 1, {1, 4, 3, 4, 3}, {2, 2, 2, 2, 2}, {1, 2, 1}, {1, 1, 0}, {1, 1, 1},
     {0}, 2},
    {"conv_transpose1d stride 2 output_padding 1", 1, 1, 1, {1, 2, 4}, {2, 3, 3}, {2}, {1}, {1},
     {1}, 1},
    {"conv_transpose2d stride 2 pad 1 output_padding 1", 1, 2, 1, {2, 2, 3, 3}, {2, 2, 3, 3},
     {2, 2}, {1, 1}, {1, 1}, {1, 1}, 1},
    {"conv_transpose2d groups 2", 1, 2, 0, {1, 4, 3, 2}, {4, 1, 2, 2}, {2, 1}, {0, 0}, {1, 1},
     {0, 0}, 2},
    {"conv_transpose3d 2^3 stride 2 (W4)", 1, 3, 1, {1, 4, 2, 3, 2}, {4, 2, 2, 2, 2}, {2, 2, 2},
     {0, 0, 0}, {1, 1, 1}, {0, 0, 0}, 1},
    {"conv_transpose3d stride 3 pad 1 output_padding (2,0,1)", 1, 3, 0, {1, 2, 2, 2, 3},
     {2, 2, 3, 2, 3}, {3, 1, 2}, {1, 0, 1}, {1, 1, 1}, {2, 0, 1}, 1},
};
/* clang-format on */

const int n_conv_cases = (int)(sizeof conv_cases / sizeof conv_cases[0]);

const conv_case *conv_case_named(const char *label) {
    for (int i = 0; i < n_conv_cases; i++)
        if (!strcmp(conv_cases[i].label, label)) return &conv_cases[i];
    return NULL;
}

float *conv_rand_buf(int64_t n, uint64_t seed) {
    float *p = ts_aligned_alloc((size_t)(n > 0 ? n : 1) * sizeof(float), "test buffer");
    for (int64_t i = 0; p && i < n; i++) {
        uint32_t w[4];
        ts_philox(seed, 0xc0de, (uint64_t)i, w);
        p[i] = (float)(w[0] >> 8) * (1.0f / 8388608.0f) - 1.0f;
    }
    return p;
}
