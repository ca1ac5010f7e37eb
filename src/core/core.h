/* core.h — internal utilities shared by every layer: errors, logging,
 * allocation, shapes, hashing and the counter-based RNG. The part code
 * outside the library uses too (errors, allocation, clock, RNG, hashing)
 * is public: tessel/status.h and tessel/util.h. */
#ifndef TS_CORE_H
#define TS_CORE_H

#include <stddef.h>
#include <stdint.h>
#include "tessel/dtype.h"
#include "tessel/log.h"
#include "tessel/status.h"
#include "tessel/util.h"

#define TS_ALIGN          64
#define TS_ALIGN_UP(x, a) (((x) + ((a)-1)) & ~((size_t)(a)-1))

void ts_logf(ts_log_level lv, const char *fmt, ...) TS_PRINTF(2, 3);

void *ts_realloc(void *p, size_t bytes, const char *what);
/* 64-byte aligned; release with ts_aligned_free. */
void *ts_aligned_alloc(size_t bytes, const char *what);
void ts_aligned_free(void *p);
char *ts_strdup(const char *s);
/* Grow *arr (element size `esz`) so it holds at least `need` elements. */
ts_status ts_grow(void **arr, int *cap, int need, size_t esz, const char *what);

/* "f32[2,3,4]" into buf; returns buf. */
char *ts_shape_str(char *buf, size_t n, ts_dtype dt, int rank, const int64_t *dims);
int64_t ts_shape_numel(int rank, const int64_t *dims);
/* The element count with every multiplication checked: TS_ERR_SHAPE naming
 * the dimension on a negative size or a product past INT64_MAX. For sizes
 * derived from data (class counts, vocabularies, node counts). */
ts_status ts_shape_numel_checked(int rank, const int64_t *dims, int64_t *out);

uint64_t ts_hash_str(const char *s);

/* tessel's per-user cache folder, where measurements are kept between runs:
 * $XDG_CACHE_HOME/tessel, else $HOME/.cache/tessel, written to dir. 0 (no
 * cache) when the environment variable `off_env` is "0" or neither is set. */
int ts_cache_dir(const char *off_env, char *dir, size_t n);

/* Seconds since this process started (from /proc/self/stat, in clock
 * ticks: 10 ms on Linux), the exec and loading of libraries included; NaN
 * where it cannot be read. */
double ts_process_age(void);

/* Values [first, first + n) of the streams ts_rand_uniform_f64 and
 * ts_rand_normal_f64 fill from 0 (`first` a multiple of 4: one Philox
 * counter gives four values), so a long stream can be drawn in pieces, on
 * several threads, to the same bits. */
void ts_rand_uniform_f64_at(double *out, int64_t first, int64_t n, uint64_t key, double lo,
                            double hi);
void ts_rand_normal_f64_at(double *out, int64_t first, int64_t n, uint64_t key, double mean,
                           double std);

/* Uniform in [0, 1) from one random word (24-bit resolution, like float). */
static inline double ts_u01(uint32_t r) {
    return (double)(r >> 8) * (1.0 / 16777216.0);
}

#endif
