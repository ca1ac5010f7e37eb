/* The files of an emitted program: writing them (parent folders made, each
 * recorded for the manifest), and kernels/, the library's own sources
 * copied byte for byte from the copy embedded at build time (sources.h). */
#include "codegen/sources.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include "codegen/codegen.h"

const ts_embedded_file *ts_embedded_find(const char *path) {
    for (int i = 0; i < ts_n_embedded_files; i++)
        if (!strcmp(ts_embedded_files[i].path, path)) return &ts_embedded_files[i];
    return NULL;
}

/* mkdir -p of the folders above `path`. */
static ts_status make_parents(const char *path) {
    char buf[1024];
    if (snprintf(buf, sizeof buf, "%s", path) >= (int)sizeof buf)
        return ts_fail(TS_ERR_INVALID, "emit-c: path '%.60s...' too long", path);
    for (char *p = buf + 1; *p; p++) {
        if (*p != '/') continue;
        *p = 0;
        if (mkdir(buf, 0755) != 0 && errno != EEXIST)
            return ts_fail(TS_ERR_IO, "emit-c: cannot make folder %s: %s", buf, strerror(errno));
        *p = '/';
    }
    return TS_OK;
}

ts_status cg_write_file(cg_ctx *g, const char *rel, const void *data, size_t n) {
    if (g->n_files == CG_MAX_FILES)
        return ts_fail(TS_ERR_INTERNAL, "emit-c: more than %d files", CG_MAX_FILES);
    char path[1024];
    if (snprintf(path, sizeof path, "%s/%s", g->dir, rel) >= (int)sizeof path)
        return ts_fail(TS_ERR_INVALID, "emit-c: path of %s too long", rel);
    ts_status s = make_parents(path);
    if (s != TS_OK) return s;
    FILE *f = fopen(path, "wb");
    if (!f) return ts_fail(TS_ERR_IO, "emit-c: cannot write %s: %s", path, strerror(errno));
    size_t w = n ? fwrite(data, 1, n, f) : 0;
    int bad = w != n || ferror(f);
    if (fclose(f) != 0) bad = 1;
    if (bad) return ts_fail(TS_ERR_IO, "emit-c: writing %s failed", path);
    return cg_record(g, rel);
}

ts_status cg_record(cg_ctx *g, const char *rel) {
    if (g->n_files == CG_MAX_FILES)
        return ts_fail(TS_ERR_INTERNAL, "emit-c: more than %d files", CG_MAX_FILES);
    if (!(g->files[g->n_files] = ts_strdup(rel))) return TS_ERR_NOMEM;
    g->n_files++;
    return TS_OK;
}

ts_status cg_mem_open(cg_mem *m) {
    memset(m, 0, sizeof *m);
    m->f = open_memstream(&m->buf, &m->len);
    return m->f ? TS_OK : ts_fail(TS_ERR_NOMEM, "emit-c: no memory for a generated file");
}

void cg_mem_free(cg_mem *m) {
    if (m->f) fclose(m->f);
    free(m->buf);
    memset(m, 0, sizeof *m);
}

ts_status cg_mem_write(cg_ctx *g, cg_mem *m, const char *rel) {
    int bad = ferror(m->f);
    if (fclose(m->f) != 0) bad = 1;
    m->f = NULL;
    ts_status s = bad ? ts_fail(TS_ERR_NOMEM, "emit-c: generating %s failed", rel)
                      : cg_write_file(g, rel, m->buf, m->len);
    cg_mem_free(m);
    return s;
}

void cg_ident(char *out, size_t n, const char *s) {
    size_t j = 0;
    for (; s && *s && j + 1 < n; s++) {
        char ch = *s;
        int ok = (ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || (ch >= '0' && ch <= '9');
        out[j++] = ok ? ch : '_';
    }
    out[j] = 0;
}

const char *cg_st_dtype(ts_dtype dt) {
    switch (dt) {
    case TS_F32: return "F32";
    case TS_F64: return "F64";
    case TS_F16: return "F16";
    case TS_BF16: return "BF16";
    case TS_F8E4M3: return "F8_E4M3";
    case TS_F8E5M2: return "F8_E5M2";
    case TS_I32: return "I32";
    case TS_I64: return "I64";
    case TS_U8: return "U8";
    default: return NULL;
    }
}

const char *cg_dtype_enum(ts_dtype dt) {
    static const char *const names[] = {"TS_F32",    "TS_F64", "TS_F16", "TS_BF16", "TS_F8E4M3",
                                        "TS_F8E5M2", "TS_I32", "TS_I64", "TS_U8"};
    return (unsigned)dt < sizeof names / sizeof names[0] ? names[dt] : "TS_DTYPE_COUNT";
}

/* Every embedded file goes out: kernels look ops up in the op table
 * (src/ops/registry.c), which names every op's kernel, so a step using any
 * op links all of src/ops, the collectives' kernels need src/dist (its
 * one-process paths here), and the op files need src/ir, src/core and the
 * public headers. */
ts_status cg_write_kernels(cg_ctx *g) {
    for (int i = 0; i < ts_n_embedded_files; i++) {
        const ts_embedded_file *e = &ts_embedded_files[i];
        char rel[512];
        snprintf(rel, sizeof rel, "kernels/%s", e->path);
        ts_status s = cg_write_file(g, rel, e->data, e->size);
        if (s != TS_OK) return s;
    }
    return TS_OK;
}
