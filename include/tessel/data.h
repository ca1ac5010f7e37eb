/* tessel/data.h — arrays read from files and deterministic synthetic
 * batches, for programs that feed a plan themselves (the training session
 * reads its data through data.source instead).
 *
 *     ts_array a;
 *     if (ts_data_read_npy("weights.npy", TS_F32, &a) != TS_OK) puts(ts_last_error());
 *     ... a.rank, a.dims, (float *)a.data ...
 *     ts_array_free(&a);
 *
 *     ts_synth_regression(seed, k, batch, window, features, out_dim, x, y);
 *     ts_synth_tokens(seed, k, batch, ctx, vocab, tokens, targets);
 *
 * The synthetic batches are the data of the reference benchmarks
 * (shared/BENCH.md), drawn from a counter-based generator so batch k of a
 * seed is always the same. */
#ifndef TESSEL_DATA_H
#define TESSEL_DATA_H

#include <stdint.h>
#include "tessel/graph.h"
#include "tessel/status.h"

#ifdef __cplusplus
extern "C" {
#endif

/* One file that went into a dataset. The hash covers the bytes as stored
 * (a gzip file's compressed bytes) and is computed over the very bytes the
 * reader parsed, in the same pass. */
typedef struct ts_lineage {
    char *path;      /* as given to the reader */
    char sha256[65]; /* lower-case hex */
    int64_t bytes;   /* file size */
} ts_lineage;

/* A .npy file (format 1.0/2.0/3.0, C order, little-endian f4/f8/i4/i8/u1):
 * data converted to `want` (f32, f64, i32, i64 or u8). Conversion to an
 * integer type never changes a value: a float that is not whole, or a value
 * out of range, is an error naming the element; so is a NaN or infinity
 * (docs/data.md, "Numbers"). A shape whose dimensions multiply past 2^63
 * bytes is refused before anything is allocated. Free with ts_array_free. */
typedef struct ts_array {
    ts_dtype dtype;
    int rank;
    int64_t dims[TS_MAX_RANK];
    void *data;
    ts_lineage lineage;
} ts_array;
ts_status ts_data_read_npy(const char *path, ts_dtype want, ts_array *out);
/* An IDX file (u8 elements, 1 to TS_MAX_RANK dimensions), gzip (recognised
 * by its magic bytes) or plain; values converted to `want` unscaled. */
ts_status ts_data_read_idx(const char *path, ts_dtype want, ts_array *out);
void ts_array_free(ts_array *a);

/* ---- synthetic batches ---------------------------------------------------- */

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

#ifdef __cplusplus
}
#endif
#endif
