#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include "core.h"

char *ts_shape_str(char *buf, size_t n, ts_dtype dt, int rank, const int64_t *dims) {
    size_t k = (size_t)snprintf(buf, n, "%s[", ts_dtype_name(dt));
    for (int i = 0; i < rank && k < n; i++)
        k += (size_t)snprintf(buf + k, n - k, i ? ",%lld" : "%lld", (long long)dims[i]);
    if (k < n) snprintf(buf + k, n - k, "]");
    return buf;
}

int64_t ts_shape_numel(int rank, const int64_t *dims) {
    int64_t n = 1;
    for (int i = 0; i < rank; i++) n *= dims[i];
    return n;
}

ts_status ts_shape_numel_checked(int rank, const int64_t *dims, int64_t *out) {
    *out = 0;
    if (rank < 0) return ts_fail(TS_ERR_SHAPE, "shape of rank %d", rank);
    int64_t n = 1;
    for (int i = 0; i < rank; i++) {
        if (dims[i] < 0)
            return ts_fail(TS_ERR_SHAPE, "shape: dimension %d is %lld, negative", i,
                           (long long)dims[i]);
        if (__builtin_mul_overflow(n, dims[i], &n))
            return ts_fail(TS_ERR_SHAPE,
                           "shape: %lld elements up to dimension %d (of size %lld) overflow a "
                           "64-bit count",
                           (long long)n, i, (long long)dims[i]);
    }
    *out = n;
    return TS_OK;
}

uint64_t ts_hash64(const void *data, size_t n, uint64_t seed) {
    /* FNV-1a followed by a splitmix finaliser: cheap, stable across builds. */
    const unsigned char *p = data;
    uint64_t h = 1469598103934665603ULL ^ seed;
    for (size_t i = 0; i < n; i++) h = (h ^ p[i]) * 1099511628211ULL;
    h ^= h >> 33;
    h *= 0xff51afd7ed558ccdULL;
    h ^= h >> 33;
    return h;
}

uint64_t ts_hash_str(const char *s) {
    size_t n = 0;
    while (s[n]) n++;
    return ts_hash64(s, n, 0);
}

int ts_cache_dir(const char *off_env, char *dir, size_t n) {
    const char *e = getenv(off_env);
    if (e && !strcmp(e, "0")) return 0;
    const char *xdg = getenv("XDG_CACHE_HOME"), *home = getenv("HOME");
    if (xdg && *xdg)
        snprintf(dir, n, "%s/tessel", xdg);
    else if (home && *home)
        snprintf(dir, n, "%s/.cache/tessel", home);
    else
        return 0;
    return 1;
}

double ts_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static int cmp_f64(const void *a, const void *b) {
    const double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

double ts_median(double *v, int n) {
    if (n < 1) return 0.0;
    qsort(v, (size_t)n, sizeof *v, cmp_f64);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

double ts_process_age(void) {
    /* Field 22 of /proc/self/stat, after the command name in parentheses
     * (which may hold spaces and ')'), is the start in clock ticks since
     * boot, the epoch of CLOCK_BOOTTIME. */
    char buf[1024];
    FILE *f = fopen("/proc/self/stat", "r");
    if (!f) return NAN;
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = 0;
    const char *p = strrchr(buf, ')');
    /* after ')': state (field 3), fields 4 to 21, then starttime */
    for (int field = 2; p && field < 22; field++) p = strchr(p + 1, ' ');
    char *end = NULL;
    unsigned long long ticks = p ? strtoull(p + 1, &end, 10) : 0;
    if (!p || end == p + 1) return NAN;
    long hz = sysconf(_SC_CLK_TCK);
    struct timespec ts;
    if (hz <= 0 || clock_gettime(CLOCK_BOOTTIME, &ts) != 0) return NAN;
    double age = (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec - (double)ticks / (double)hz;
    return age >= 0 ? age : 0;
}

void ts_catf(char *buf, size_t cap, size_t *len, const char *fmt, ...) {
    if (!cap || *len >= cap - 1) return;
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(buf + *len, cap - *len, fmt, ap);
    va_end(ap);
    if (n > 0) *len = *len + (size_t)n < cap - 1 ? *len + (size_t)n : cap - 1;
}
