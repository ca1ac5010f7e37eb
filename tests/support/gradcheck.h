/* gradcheck.h — finite-difference gradient checks for ops.
 *
 * Describe the op's inputs, give a function that builds the op from them,
 * and gc_check() does the rest:
 *   1. builds the graph in f64: differentiable inputs become parameters
 *      (random values in [lo, hi) unless data is given), others constants;
 *   2. loss = sum(out * R) for a fixed random R, compiled with
 *      TS_OPT_NONE so the plan computes gradients only;
 *   3. compares every analytic gradient element (up to max_elems per input,
 *      spread evenly) with the central difference (f(x+h) - f(x-h)) / 2h,
 *      h = 1e-6, requiring |a - n| <= tol * max(1, |n|);
 *   4. builds the same graph in f32 and checks its forward output against
 *      the f64 one (relative 1e-4), so f32 kernels are covered too.
 * Prints each mismatch; returns the number of failed comparisons and adds
 * to the check.h counters.
 *
 *     static ts_val build(ts_graph *g, const ts_val *in, void *u) {
 *         return ts_mul(g, in[0], in[1]);
 *     }
 *     gc_input in[2] = {GC_F(2, 3), GC_F(3)};       // broadcasting [2,3] * [3]
 *     gc_check("mul broadcast", 2, in, build, NULL);
 */
#ifndef TS_TEST_GRADCHECK_H
#define TS_TEST_GRADCHECK_H

#include "check.h"

typedef struct gc_input {
    ts_dtype dtype; /* TS_F64 for float inputs (converted to f32 for step 4) */
    int rank;
    int64_t dims[TS_MAX_RANK];
    int differentiable; /* 1: a parameter whose gradient is checked */
    double lo, hi;      /* random range (default -1, 1 when both 0) */
    const void *data;   /* fixed values in dtype (indices, masks); NULL: random */
} gc_input;

typedef ts_val (*gc_build_fn)(ts_graph *g, const ts_val *in, void *user);

typedef struct gc_options {
    double tol;     /* default 1e-6 */
    int max_elems;  /* per input; default 200 */
    int no_f32;     /* skip step 4 */
    double f32_tol; /* default 1e-4 */
} gc_options;

/* A differentiable f64 input of the given dims (rank from the count). */
#define GC_F(...)                                                                                  \
    ((gc_input){                                                                                   \
        TS_F64, sizeof((int64_t[]){__VA_ARGS__}) / sizeof(int64_t), {__VA_ARGS__}, 1, 0, 0, NULL})
/* A rank-0 differentiable input. */
#define GC_SCALAR ((gc_input){TS_F64, 0, {0}, 1, 0, 0, NULL})

/* v [N, C, s...] permuted to channels last [N, s..., C] (last = 1) or back
 * (last = 0), v of rank r: for checking the channels-last ops against
 * channels-first numbers. */
ts_val gc_to_layout(ts_graph *g, ts_val v, int r, int last);

int gc_check(const char *label, int n_in, const gc_input *in, gc_build_fn build, void *user);
int gc_check_opt(const char *label, int n_in, const gc_input *in, gc_build_fn build, void *user,
                 const gc_options *opt);

#endif
