#include "testfiles.h"
#include <stdio.h>

static void write_npy(const char *path, const char *descr, const char *shape, size_t bytes,
                      const void *data);

void tf_write_npy(const char *path, const char *descr, int64_t n, int64_t cols, const void *data,
                  size_t elem, size_t cut) {
    char shape[64];
    if (cols)
        snprintf(shape, sizeof shape, "(%lld, %lld)", (long long)n, (long long)cols);
    else
        snprintf(shape, sizeof shape, "(%lld,)", (long long)n);
    write_npy(path, descr, shape, (size_t)(n * (cols ? cols : 1)) * elem - cut, data);
}

void tf_write_npy_dims(const char *path, const char *descr, int rank, const int64_t *dims,
                       const void *data, size_t elem) {
    char shape[160] = "(";
    size_t k = 1, count = 1;
    for (int i = 0; i < rank && k < sizeof shape; i++) {
        k += (size_t)snprintf(shape + k, sizeof shape - k, "%lld,%s", (long long)dims[i],
                              i + 1 < rank ? " " : "");
        count *= (size_t)dims[i];
    }
    if (k < sizeof shape - 1) shape[k] = ')', shape[k + 1] = 0;
    write_npy(path, descr, shape, count * elem, data);
}

static void write_npy(const char *path, const char *descr, const char *shape, size_t bytes,
                      const void *data) {
    char header[256];
    int len = snprintf(header, sizeof header,
                       "{'descr': '%s', 'fortran_order': False, 'shape': %s, }", descr, shape);
    /* The header, magic and length included, ends on a 64-byte boundary. */
    int pad = (64 - (10 + len + 1) % 64) % 64;
    FILE *f = fopen(path, "wb");
    if (!f) return;
    unsigned short hl = (unsigned short)(len + pad + 1);
    fwrite("\x93NUMPY\x01\x00", 1, 8, f);
    fputc(hl & 0xff, f), fputc(hl >> 8, f);
    fwrite(header, 1, (size_t)len, f);
    for (int i = 0; i < pad; i++) fputc(' ', f);
    fputc('\n', f);
    fwrite(data, 1, bytes, f);
    fclose(f);
}

const char *tf_path(const char *dir, const char *name) {
    static char buf[4][256];
    static int k;
    k = (k + 1) % 4;
    snprintf(buf[k], sizeof buf[k], "%s/%s", dir, name);
    return buf[k];
}
