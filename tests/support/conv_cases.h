/* conv_cases.h — the convolution configurations the conv tests share
 * (gradient checks, mixed precision): 1-, 2- and 3-d convolutions and
 * transposed convolutions with stride, padding, dilation, groups
 * (depthwise), output_padding and sizes that leave unread tails.
 *
 *     for (int i = 0; i < n_conv_cases; i++) check(&conv_cases[i]);
 *     const conv_case *c = conv_case_named("conv2d pad 1");
 */
#ifndef TS_TEST_CONV_CASES_H
#define TS_TEST_CONV_CASES_H

#include <stdint.h>

typedef struct conv_case {
    const char *label;
    int transpose, nd, bias;
    int64_t x[5], w[5]; /* x [N, C, spatial...] (channels first), w as the op takes it */
    int64_t s[3], p[3], d[3], op[3], groups; /* stride, padding, dilation, output_padding */
} conv_case;

extern const conv_case conv_cases[];
extern const int n_conv_cases;
/* The case with this label (NULL if none). */
const conv_case *conv_case_named(const char *label);

/* n floats in [-1, 1) from a Philox stream keyed by seed, in an aligned
 * buffer (free()); NULL, with the error recorded, when out of memory. The
 * conv kernels' unit tests feed them to both sides of a comparison. */
float *conv_rand_buf(int64_t n, uint64_t seed);

#endif
