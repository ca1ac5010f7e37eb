/* tfevents.h — a TensorBoard event file writer (scalars and histograms).
 *
 *     ts_tfevents *w;
 *     ts_tfevents_open("runs/first/tb", NULL, &w);  // events.out.tfevents.<time>.<host>
 *     ts_tfevents_scalar(w, step, "train/loss", loss);
 *     ts_tfevents_histogram(w, step, "grad/fc1.weight", grad, n);
 *     ts_tfevents_close(w);                          // flushes
 *
 * File format: a sequence of TFRecords, each
 *     uint64 length | uint32 masked_crc32c(length) | data | uint32 masked_crc32c(data)
 * (little endian; mask(c) = ((c >> 15) | (c << 17)) + 0xa282ead8), whose
 * data is a serialized tensorflow.Event protobuf: wall_time (1, double),
 * step (2, int64), file_version (3, "brain.Event:2", first record only) or
 * summary (5) holding Summary.Value {tag (1), simple_value (2, float) |
 * histo (5, HistogramProto)}. The messages are encoded here by hand, so no
 * protobuf library is needed.
 *
 * Flushing: records are buffered and written out after `max_pending`
 * records or when the oldest buffered one is `flush_seconds` old (checked
 * at each write), on ts_tfevents_flush and on close. A crash loses at most
 * that much; TensorBoard reads a partial last record as "not yet written".
 *
 * Thread safety: every function may be called from several threads; a
 * mutex serialises the records. */
#ifndef TS_OBS_TFEVENTS_H
#define TS_OBS_TFEVENTS_H

#include <stddef.h>
#include <stdint.h>
#include "tessel/status.h"

typedef struct ts_tfevents ts_tfevents;

typedef struct ts_tfevents_options {
    const char *suffix;   /* appended to the file name, e.g. ".rank1" (NULL: none) */
    int max_pending;      /* flush after this many records (1: after every record) */
    double flush_seconds; /* flush once the oldest unflushed record is this old */
} ts_tfevents_options;

/* suffix NULL, max_pending 64, flush_seconds 5. */
ts_tfevents_options ts_tfevents_options_default(void);

/* Create `dir` (and missing parents) and a new event file in it, writing
 * the file_version record. Refuses to overwrite an existing file: two
 * writers started in the same second on one host need distinct suffixes
 * (or, better for TensorBoard, distinct directories: one run each). */
ts_status ts_tfevents_open(const char *dir, const ts_tfevents_options *o, ts_tfevents **out);

/* Path of the event file. */
const char *ts_tfevents_path(const ts_tfevents *w);

/* One Event with one scalar (stored as float, as TensorBoard expects). */
ts_status ts_tfevents_scalar(ts_tfevents *w, int64_t step, const char *tag, double value);
/* One Event holding n scalars (cheaper than n events for a step's values). */
ts_status ts_tfevents_scalars(ts_tfevents *w, int64_t step, int n, const char *const *tags,
                              const double *values);

/* One Event with a histogram of n values, bucketed on TensorFlow's default
 * limits (±1e-12 growing by 1.1 to ±1e20, and 0), runs of empty buckets
 * merged. Non-finite values are left out of the histogram (the loss and
 * gradient monitors report them); *n_nonfinite (may be NULL) counts them. */
ts_status ts_tfevents_histogram(ts_tfevents *w, int64_t step, const char *tag, const float *values,
                                int64_t n, int64_t *n_nonfinite);
ts_status ts_tfevents_histogram_f64(ts_tfevents *w, int64_t step, const char *tag,
                                    const double *values, int64_t n, int64_t *n_nonfinite);

/* Write buffered records to the file now. */
ts_status ts_tfevents_flush(ts_tfevents *w);

/* Flush, close and free (NULL is ignored). Returns the flush's status: the
 * writer is freed either way. */
ts_status ts_tfevents_close(ts_tfevents *w);

/* The default histogram limits, ascending (for readers and tests): sets
 * *limits (may be NULL) and returns their number, 0 when out of memory. */
int ts_tfevents_default_limits(const double **limits);

/* The bucket a finite float lands in: the index of the first default limit
 * greater than it (TensorFlow's upper_bound; bucket i holds
 * [limit[i-1], limit[i])), found as ts_tfevents_histogram does. -1 for inf
 * and NaN. Exposed for tests. */
int ts_tfevents_bucket_f32(float v);

/* The masked CRC32C TFRecord stores for `data` (exposed for readers and
 * tests). */
uint32_t ts_tfrecord_masked_crc(const void *data, size_t n);

#endif
