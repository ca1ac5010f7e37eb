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

/* Batch `index` of the W2 sequence task: x [batch, window, features]
 * standard normal; y [batch] is 1 when feature 0 summed over the last
 * min(16, window) steps is positive, else 0 (f32). */
ts_status ts_synth_binary_sequences(uint64_t seed, int64_t index, int64_t batch, int64_t window,
                                    int64_t features, float *x, float *y);

/* Batch `index` of the W4 segmentation task: per volume a ball with its
 * centre in [size/4, 3 size/4)^3 and radius (4 + 6 U(0,1)) * size / 32;
 * with classes > 2 the ball holds classes - 1 concentric shells, the label
 * of a voxel the number of shells around it (radii r * k / (classes - 1)),
 * so y [batch, size^3] i64 has every class at a known place.
 * x [batch, channels, size^3] = y / (classes - 1) + 0.5 N(0, 1), the same
 * volume in every channel. */
ts_status ts_synth_volumes(uint64_t seed, int64_t index, int64_t batch, int64_t channels,
                           int64_t size, int64_t classes, float *x, int64_t *y);

/* The nodes of the W5 task: labels y [nodes] uniform in [0, classes) and
 * features x [nodes, features] = N(0, 1) + 0.5 centroid[label], with
 * centroids N(0, 1) [classes, features] (the edges: ts_gcn_random_edges). */
ts_status ts_synth_graph_nodes(uint64_t seed, int64_t nodes, int64_t features, int64_t classes,
                               float *x, int64_t *y);

#endif
