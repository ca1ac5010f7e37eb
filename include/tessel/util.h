/* tessel/util.h — small helpers for code built on the library (the tessel
 * tools use them): allocation that records its failure like every tessel
 * error, a monotonic clock, text appended to a fixed buffer, and the
 * counter-based random numbers and hash the library draws its own data
 * with, so a program's synthetic data is reproducible too.
 *
 *     double *v = ts_alloc(n * sizeof *v, "batch");   // NULL: ts_last_error() says so
 *     if (!v) return TS_ERR_NOMEM;
 *     ts_rand_normal_f64(v, n, ts_hash64(&seed, sizeof seed, 0), 0.0, 1.0);
 *     double t0 = ts_now();  ...  printf("%.3f s\n", ts_now() - t0);
 */
#ifndef TESSEL_UTIL_H
#define TESSEL_UTIL_H

#include <stddef.h>
#include <stdint.h>
#include "tessel/status.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Allocation that records TS_ERR_NOMEM with `what` on failure; free(). */
void *ts_alloc(size_t bytes, const char *what);
void *ts_zalloc(size_t bytes, const char *what);

/* Wall clock in seconds (monotonic). */
double ts_now(void);

/* The median of v[0..n-1] (the mean of the two middle values for even n;
 * 0 for n < 1). Sorts v in place: benchmarks report it over their runs. */
double ts_median(double *v, int n);

/* Append printf-style text at buf[*len] (cap bytes in all), truncating
 * quietly at the end of the buffer; *len is kept <= cap - 1. For messages
 * assembled from parts whose worst-case sum exceeds the buffer. */
void ts_catf(char *buf, size_t cap, size_t *len, const char *fmt, ...) TS_PRINTF(4, 5);

/* A 64-bit hash of n bytes (stable across builds and machines). */
uint64_t ts_hash64(const void *data, size_t n, uint64_t seed);

/* Philox4x32-10: four 32-bit random words from (key, counter). Pure
 * function of its arguments: streams are reproducible and need no state. */
void ts_philox(uint64_t key, uint64_t ctr_hi, uint64_t ctr_lo, uint32_t out[4]);
/* Fill n values from a Philox stream: uniform [lo, hi) or normal(mean, std). */
void ts_rand_uniform_f64(double *out, int64_t n, uint64_t key, double lo, double hi);
void ts_rand_normal_f64(double *out, int64_t n, uint64_t key, double mean, double std);

/* The CPU kernels' path, as a replay manifest records it ("cpu_path"):
 * oneDNN's version and the instruction set it runs, and tessel's own
 * kernel choices that change bits (the 3-D Winograd convolutions, on or off
 * with TESSEL_CONV_WINOGRAD). Another path may give other bits. */
void ts_cpu_kernel_path(char *buf, size_t n);

#ifdef __cplusplus
}
#endif
#endif
