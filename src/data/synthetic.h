/* synthetic.h — deterministic synthetic batches for training without a
 * dataset: the data of the reference benchmarks (shared/BENCH.md), drawn
 * from a counter-based generator so batch k of a seed is always the same.
 *
 *     ts_synth_regression(seed, k, batch, window, features, out_dim, x, y);
 *     ts_synth_tokens(seed, k, batch, ctx, vocab, tokens, targets);
 */
#ifndef TS_DATA_SYNTHETIC_H
#define TS_DATA_SYNTHETIC_H

#include <stdint.h>
#include "tessel/status.h"

/* Batch `index` of the W1 regression task: x [batch, window, features]
 * standard normal; every column of y [batch, out_dim] is the mean of x over
 * the last min(8, window) rows and first min(4, features) features, plus
 * 0.1 * standard normal noise. A flat input [batch, in_dim] is the case
 * window = in_dim, features = 1. */
ts_status ts_synth_regression(uint64_t seed, int64_t index, int64_t batch, int64_t window,
                              int64_t features, int64_t out_dim, float *x, float *y);

/* Batch `index` of the W3 language-model task: a sequence of ctx + 1
 * uniform random tokens in [0, vocab) per row; tokens [batch, ctx] are its
 * first ctx entries and targets [batch, ctx] the same shifted by one. */
ts_status ts_synth_tokens(uint64_t seed, int64_t index, int64_t batch, int64_t ctx, int64_t vocab,
                          int64_t *tokens, int64_t *targets);

#endif
