/* core.h — internal utilities shared by every layer: errors, logging,
 * allocation, shapes, hashing and the counter-based RNG. */
#ifndef TS_CORE_H
#define TS_CORE_H

#include <stddef.h>
#include <stdint.h>
#include "tessel/dtype.h"
#include "tessel/log.h"
#include "tessel/status.h"

#if defined(__GNUC__)
#define TS_PRINTF(a, b) __attribute__((format(printf, a, b)))
#else
#define TS_PRINTF(a, b)
#endif

#define TS_ALIGN          64
#define TS_ALIGN_UP(x, a) (((x) + ((a)-1)) & ~((size_t)(a)-1))

/* Record a failure message for this thread and return `s`, so callers write
 * `return ts_fail(TS_ERR_SHAPE, "matmul: ...")`. */
ts_status ts_fail(ts_status s, const char *fmt, ...) TS_PRINTF(2, 3);
/* Prefix the current message with "prefix: " (adds context on the way up). */
void ts_error_prefix(const char *fmt, ...) TS_PRINTF(1, 2);

void ts_logf(ts_log_level lv, const char *fmt, ...) TS_PRINTF(2, 3);

/* Allocation that records TS_ERR_NOMEM with `what` on failure. */
void *ts_alloc(size_t bytes, const char *what);
void *ts_zalloc(size_t bytes, const char *what);
void *ts_realloc(void *p, size_t bytes, const char *what);
/* 64-byte aligned; release with ts_aligned_free. */
void *ts_aligned_alloc(size_t bytes, const char *what);
void ts_aligned_free(void *p);
char *ts_strdup(const char *s);
/* Grow *arr (element size `esz`) so it holds at least `need` elements. */
ts_status ts_grow(void **arr, int *cap, int need, size_t esz, const char *what);

/* Append printf-style text at buf[*len] (cap bytes in all), truncating
 * quietly at the end of the buffer; *len is kept <= cap - 1. For messages
 * assembled from parts whose worst-case sum exceeds the buffer. */
void ts_catf(char *buf, size_t cap, size_t *len, const char *fmt, ...) TS_PRINTF(4, 5);

/* "f32[2,3,4]" into buf; returns buf. */
char *ts_shape_str(char *buf, size_t n, ts_dtype dt, int rank, const int64_t *dims);
int64_t ts_shape_numel(int rank, const int64_t *dims);
/* The element count with every multiplication checked: TS_ERR_SHAPE naming
 * the dimension on a negative size or a product past INT64_MAX. For sizes
 * derived from data (class counts, vocabularies, node counts). */
ts_status ts_shape_numel_checked(int rank, const int64_t *dims, int64_t *out);

uint64_t ts_hash64(const void *data, size_t n, uint64_t seed);
uint64_t ts_hash_str(const char *s);

/* Philox4x32-10: four 32-bit random words from (key, counter). Pure
 * function of its arguments: streams are reproducible and need no state. */
void ts_philox(uint64_t key, uint64_t ctr_hi, uint64_t ctr_lo, uint32_t out[4]);
/* Uniform in [0, 1) from one random word (24-bit resolution, like float). */
static inline double ts_u01(uint32_t r) {
    return (double)(r >> 8) * (1.0 / 16777216.0);
}
/* Fill n values from a Philox stream: uniform [lo, hi) or normal(mean, std). */
void ts_rand_uniform_f64(double *out, int64_t n, uint64_t key, double lo, double hi);
void ts_rand_normal_f64(double *out, int64_t n, uint64_t key, double mean, double std);

/* Wall clock in seconds (monotonic). */
double ts_now(void);

#endif
