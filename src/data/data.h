/* data.h — datasets and loaders (internal API used by the training session).
 *
 * A dataset is n examples held in memory, each an x (features) and a y
 * (label or target) of fixed per-example shape. Loaders cut it into batches
 * in an order that depends only on (seed, epoch): reruns see the same data
 * in the same order, and a run resumed at a loader position continues
 * exactly where it stopped.
 *
 *     ts_dataset *all, *train, *val;
 *     ts_status s = ts_data_load_idx_pair("train-images-idx3-ubyte.gz",
 *                                         "train-labels-idx1-ubyte.gz", &all);
 *     s = ts_dataset_split(all, 0.1, seed, &train, &val);   // 10 % validation
 *     ts_loader *ld;
 *     s = ts_loader_new(train, 64, 1, seed, &ld);          // batch 64, shuffled
 *     float x[64 * 784]; int64_t y[64];
 *     s = ts_loader_next(ld, x, y);                        // wraps into the next epoch
 *
 * Formats: .npy arrays, IDX files (plain or gzip), CSV time series with
 * sliding windows, raw token files (uint16/uint32). Every file read is
 * recorded with its SHA-256 in the dataset's lineage list.
 */
#ifndef TS_DATA_H
#define TS_DATA_H

#include <stdint.h>
#include <stdio.h>
#include "tessel/graph.h"

/* One file that went into a dataset. */
typedef struct ts_lineage {
    char *path;
    char sha256[65]; /* lower-case hex */
    int64_t bytes;
} ts_lineage;

typedef struct ts_dataset {
    int64_t n; /* examples */
    ts_dtype x_dtype, y_dtype;
    int x_rank, y_rank; /* per example (y_rank 0: a scalar label) */
    int64_t x_dims[TS_MAX_RANK], y_dims[TS_MAX_RANK];
    void *x, *y; /* n * example bytes each, owned */
    ts_lineage *lineage;
    int n_lineage;
    /* CSV normalisation: per-feature mean/std used (NULL otherwise), so the
     * run directory can record them. */
    float *norm_mean, *norm_std;
    int64_t n_norm;
} ts_dataset;

void ts_dataset_free(ts_dataset *d);
size_t ts_dataset_x_bytes(const ts_dataset *d); /* bytes of one example's x */
size_t ts_dataset_y_bytes(const ts_dataset *d);

/* ---- readers (errors name the file and what is wrong) ------------------- */

/* A .npy file (format 1.0/2.0/3.0, C order, little-endian f4/f8/i4/i8/u1):
 * data converted to `want` (f32, i64, ...). */
typedef struct ts_array {
    ts_dtype dtype;
    int rank;
    int64_t dims[TS_MAX_RANK];
    void *data;
    ts_lineage lineage;
} ts_array;
ts_status ts_data_read_npy(const char *path, ts_dtype want, ts_array *out);
/* An IDX file (u8 images/labels), gzip or plain. */
ts_status ts_data_read_idx(const char *path, ts_dtype want, ts_array *out);
void ts_array_free(ts_array *a);

/* Images + labels of the same count: x scaled to [0, 1] f32 and flattened
 * ([n, rows*cols]), y i64 class ids. */
ts_status ts_data_load_idx_pair(const char *images, const char *labels, ts_dataset **out);
/* Two .npy files: x [n, ...] (to f32), y [n, ...] (f32, or i64 for integer
 * labels). */
ts_status ts_data_load_npy_pair(const char *x_path, const char *y_path, ts_dataset **out);

typedef struct ts_csv_options {
    const char *path;
    const char *const *features; /* column names used as features (NULL: all but label) */
    int n_features;
    const char *label;   /* column predicted */
    int64_t window;      /* rows per example */
    int64_t horizon;     /* label taken `horizon` rows after the window's last row */
    int normalise;       /* standardise features with statistics of the first train_rows */
    int64_t train_rows;  /* rows whose statistics are used (0: all) */
} ts_csv_options;
/* x [window, n_features] f32, y [1] f32. A cell that is not a number is an
 * error naming the row and column. */
ts_status ts_data_load_csv_windows(const ts_csv_options *o, ts_dataset **out);

/* A raw token file (little-endian uint16 or uint32, bits = 16 or 32): examples
 * are consecutive windows of ctx + 1 tokens; x = first ctx, y = next ctx
 * (i64). Tokens >= vocab are an error naming the offset. */
ts_status ts_data_load_tokens(const char *path, int bits, int64_t ctx, int64_t vocab,
                              ts_dataset **out);

/* ---- splits and loaders -------------------------------------------------- */

/* Deterministic split: a permutation by seed, the last val_fraction to val.
 * The parts own copies; `all` is unchanged. */
ts_status ts_dataset_split(const ts_dataset *all, double val_fraction, uint64_t seed,
                           ts_dataset **train, ts_dataset **val);

typedef struct ts_loader ts_loader;
/* Batches of `batch` examples; shuffle: a fresh permutation per epoch from
 * (seed, epoch); the last partial batch of an epoch is dropped (a plan's
 * shapes are static). Fails if the dataset has fewer than `batch` examples. */
ts_status ts_loader_new(const ts_dataset *d, int64_t batch, int shuffle, uint64_t seed,
                        ts_loader **out);
/* Copy the next batch into x and y (batch * example bytes each). */
ts_status ts_loader_next(ts_loader *l, void *x, void *y);
int64_t ts_loader_epoch(const ts_loader *l);     /* 0-based epoch of the next batch */
int64_t ts_loader_position(const ts_loader *l);  /* batches handed out so far */
int64_t ts_loader_batches_per_epoch(const ts_loader *l);
/* Jump to a position (resume): the next batch is the one a fresh loader
 * would return after `batches` calls. */
ts_status ts_loader_seek(ts_loader *l, int64_t batches);
void ts_loader_free(ts_loader *l);

/* SHA-256 of a file, hex. */
ts_status ts_sha256_file(const char *path, char hex[65], int64_t *bytes);

#endif
