/* sources.h — the library source files an emitted program compiles
 * (internal; docs/aot.md).
 *
 * cmake/embed_sources.cmake writes them, at build time, into a generated
 * C file as arrays of their bytes: the copy an emitted program gets in its
 * kernels/ is the very source this library was built from, so the two
 * cannot drift.
 *
 *     const ts_embedded_file *f = ts_embedded_find("src/ops/unary.c");
 *     fwrite(f->data, 1, f->size, out);
 */
#ifndef TS_CODEGEN_SOURCES_H
#define TS_CODEGEN_SOURCES_H

#include <stddef.h>

typedef struct ts_embedded_file {
    const char *path; /* relative to the repository: "src/ops/unary.c" */
    const unsigned char *data;
    size_t size;
} ts_embedded_file;

extern const ts_embedded_file ts_embedded_files[];
extern const int ts_n_embedded_files;

/* The embedded file at `path`, NULL if none. */
const ts_embedded_file *ts_embedded_find(const char *path);

#endif
