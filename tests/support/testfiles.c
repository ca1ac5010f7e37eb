#include "testfiles.h"
#include <stdio.h>

void tf_write_npy(const char *path, const char *descr, int64_t n, int64_t cols, const void *data,
                  size_t elem, size_t cut) {
    char shape[64], header[256];
    if (cols)
        snprintf(shape, sizeof shape, "(%lld, %lld)", (long long)n, (long long)cols);
    else
        snprintf(shape, sizeof shape, "(%lld,)", (long long)n);
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
    fwrite(data, 1, (size_t)(n * (cols ? cols : 1)) * elem - cut, f);
    fclose(f);
}
