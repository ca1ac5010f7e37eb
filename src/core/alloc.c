#include <stdlib.h>
#include <string.h>
#include "core.h"

void *ts_alloc(size_t bytes, const char *what) {
    void *p = malloc(bytes ? bytes : 1);
    if (!p) ts_fail(TS_ERR_NOMEM, "out of memory allocating %zu bytes for %s", bytes, what);
    return p;
}

void *ts_zalloc(size_t bytes, const char *what) {
    void *p = calloc(1, bytes ? bytes : 1);
    if (!p) ts_fail(TS_ERR_NOMEM, "out of memory allocating %zu bytes for %s", bytes, what);
    return p;
}

void *ts_realloc(void *p, size_t bytes, const char *what) {
    void *q = realloc(p, bytes ? bytes : 1);
    if (!q) ts_fail(TS_ERR_NOMEM, "out of memory growing %s to %zu bytes", what, bytes);
    return q;
}

void *ts_aligned_alloc(size_t bytes, const char *what) {
    void *p = NULL;
    if (posix_memalign(&p, TS_ALIGN, TS_ALIGN_UP(bytes ? bytes : 1, TS_ALIGN)) != 0) {
        ts_fail(TS_ERR_NOMEM, "out of memory allocating %zu aligned bytes for %s", bytes, what);
        return NULL;
    }
    return p;
}

void ts_aligned_free(void *p) { free(p); }

char *ts_strdup(const char *s) {
    if (!s) return NULL;
    size_t n = strlen(s) + 1;
    char *d = ts_alloc(n, "string");
    if (d) memcpy(d, s, n);
    return d;
}

ts_status ts_grow(void **arr, int *cap, int need, size_t esz, const char *what) {
    if (need <= *cap) return TS_OK;
    int nc = *cap ? *cap : 16;
    while (nc < need) nc *= 2;
    void *p = ts_realloc(*arr, (size_t)nc * esz, what);
    if (!p) return TS_ERR_NOMEM;
    memset((char *)p + (size_t)*cap * esz, 0, (size_t)(nc - *cap) * esz);
    *arr = p;
    *cap = nc;
    return TS_OK;
}
