/* Memory-mapped .npy and IDX data sets: x is read from the file's mapping
 * and widened to f32 one example at a time, never copied whole.
 *
 * The in-memory readers (npy.c, idx.c) hold x as f32: four times an IDX
 * file's bytes. Here the file is mapped read-only and the loader converts
 * each example as it assembles a batch, with the very conversion those
 * readers apply (ts_npy_convert; byte / 255.0f for IDX images), so batches
 * and every weight trained from them are bit for bit the same.
 *
 * Loading is one pass over the mapping, chunk by chunk: each chunk is
 * hashed into the lineage (the SHA-256 of the whole file, as before),
 * checked (finite values, f64 values that fit f32: the errors the
 * in-memory reader gives, naming the same element) and its pages handed
 * back to the page cache. Training then maps pages again as batches read
 * them, and the loader drops them every 16 examples (dataset.c), so
 * resident memory stays far below the file's size.
 *
 * As for token files, the hash covers the bytes as they were at load time:
 * the file must not change while a run uses it. A gzip IDX file cannot be
 * mapped; it is inflated into memory as bytes (ts_data_read_idx) and
 * widened per example the same way. */
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>
#include "core/sha256.h"
#include "data/data_internal.h"

/* Elements hashed and checked between two drops of the load pass. */
#define SCAN_ELEMS ((size_t)1 << 20)

struct ts_xmap {
    int refs;     /* data sets sharing it (an unsplit one and its views) */
    uint8_t *buf; /* the mapped file, or inflated bytes owned (gzip IDX) */
    size_t len;
    int mapped;    /* 1: munmap buf; 0: free it */
    size_t offset; /* the first element's byte offset in buf */
    ts_dtype from; /* element type stored */
    int scale;     /* IDX images: x = byte / 255 */
    int64_t per;   /* elements per example */
};

/* Drops the pages covering [from, to) of buf; madvise needs a page-aligned
 * start, so the first page may be shared with bytes before `from` (dropping
 * it only costs a fault if they are read again). MADV_DONTNEED on a
 * read-only private mapping drops page table entries, never data. */
static void drop_range(ts_xmap *m, size_t from, size_t to) {
    if (!m->mapped || to <= from) return;
    const size_t page = (size_t)sysconf(_SC_PAGESIZE);
    const size_t start = from / page * page;
    (void)madvise(m->buf + start, to - start, MADV_DONTNEED);
}

void ts_xmap_ref(ts_xmap *m) {
    if (m) m->refs++;
}

void ts_xmap_unref(ts_xmap *m) {
    if (!m || --m->refs > 0) return;
    if (m->mapped)
        munmap(m->buf, m->len);
    else
        free(m->buf);
    free(m);
}

void ts_xmap_drop(ts_xmap *m) {
    if (m) drop_range(m, 0, m->len);
}

void ts_xmap_example(const ts_xmap *m, int64_t e, float *x) {
    const size_t es = ts_dtype_size(m->from);
    const uint8_t *src = m->buf + m->offset + (size_t)e * (size_t)m->per * es;
    if (m->scale) {
        for (int64_t i = 0; i < m->per; i++) x[i] = (float)src[i] / 255.0f;
        return;
    }
    /* Checked at load: this conversion to f32 cannot fail. */
    (void)ts_npy_convert("", m->from, src, m->per, TS_F32, x, 0);
}

/* Maps `path` whole and read-only (an empty file gets no mapping). */
static ts_status map_file(const char *path, ts_xmap **out) {
    *out = NULL;
    if (!path) return ts_fail(TS_ERR_INVALID, "reading a file: no path given");
    const int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return ts_fail(errno == ENOENT ? TS_ERR_NOT_FOUND : TS_ERR_IO, "%s: cannot open: %s", path,
                       strerror(errno));
    struct stat st;
    ts_status s = TS_OK;
    if (fstat(fd, &st) != 0) s = ts_fail(TS_ERR_IO, "%s: cannot stat: %s", path, strerror(errno));
    const size_t len = s == TS_OK && st.st_size > 0 ? (size_t)st.st_size : 0;
    void *base = NULL;
    if (s == TS_OK && len && (base = mmap(NULL, len, PROT_READ, MAP_PRIVATE, fd, 0)) == MAP_FAILED)
        s = ts_fail(TS_ERR_IO, "%s: cannot map %zu bytes: %s", path, len, strerror(errno));
    close(fd);
    if (s != TS_OK) return s;
    ts_xmap *m = ts_zalloc(sizeof *m, "mapped data");
    if (!m) {
        if (base) munmap(base, len);
        return TS_ERR_NOMEM;
    }
    *m = (ts_xmap){.refs = 1, .buf = base, .len = len, .mapped = base != NULL};
    *out = m;
    return TS_OK;
}

/* Checks elements [first, first + count) of a .npy x as the in-memory
 * reader would: finite, and (from f64) representable in f32. */
static ts_status check_npy(const char *path, const npy_header *h, const uint8_t *src, size_t first,
                           size_t count) {
    ts_status s = ts_npy_check_finite(path, h, src, first, count);
    if (s != TS_OK || h->dtype != TS_F64) return s;
    float tmp[1024];
    for (size_t i = 0; s == TS_OK && i < count; i += 1024) {
        const size_t n = count - i < 1024 ? count - i : 1024;
        s = ts_npy_convert(path, TS_F64, src + 8 * i, (int64_t)n, TS_F32, tmp,
                           (int64_t)(first + i));
    }
    return s;
}

/* The load pass: hashes the whole file into lin (path, SHA-256, size),
 * checking the numel elements from m->offset on as it goes (h: a .npy
 * header, NULL for IDX bytes) and dropping each chunk once done. */
static ts_status scan(ts_xmap *m, const char *path, const npy_header *h, size_t numel,
                      ts_lineage *lin) {
    memset(lin, 0, sizeof *lin);
    ts_sha256 sha = {NULL};
    ts_status s = ts_sha256_begin(&sha, path);
    if (s != TS_OK) return s;
    const size_t es = ts_dtype_size(m->from);
    if (m->mapped) (void)madvise(m->buf, m->len, MADV_SEQUENTIAL);
    ts_sha256_update(&sha, m->buf, m->offset);
    for (size_t i = 0; s == TS_OK && i < numel; i += SCAN_ELEMS) {
        const size_t n = numel - i < SCAN_ELEMS ? numel - i : SCAN_ELEMS;
        const uint8_t *src = m->buf + m->offset + i * es;
        ts_sha256_update(&sha, src, n * es);
        if (h) s = check_npy(path, h, src, i, n);
        drop_range(m, m->offset + i * es, m->offset + (i + n) * es);
    }
    const size_t end = m->offset + numel * es; /* the size checks made this len */
    if (s == TS_OK) ts_sha256_update(&sha, m->buf + end, m->len - end);
    if (m->mapped) (void)madvise(m->buf, m->len, MADV_RANDOM);
    if (s != TS_OK) {
        ts_sha256_abort(&sha);
        ts_xmap_drop(m);
        return s;
    }
    ts_sha256_end(&sha, lin->sha256);
    lin->bytes = (int64_t)m->len;
    if (!(lin->path = ts_strdup(path))) return TS_ERR_NOMEM;
    return TS_OK;
}

/* A data set of n examples whose x is m (f32, x_rank/x_dims per example)
 * and y the in-memory array y (leading axis n); lineage: x, then y. Takes
 * m, y's data and both lineages in all cases. */
static ts_status make(ts_xmap *m, int x_rank, const int64_t *x_dims, ts_lineage *xl, ts_array *y,
                      int64_t n, ts_dataset **out) {
    ts_dataset *d = ts_zalloc(sizeof *d, "dataset");
    ts_status s = d ? TS_OK : TS_ERR_NOMEM;
    if (s == TS_OK) {
        d->n = n;
        d->x_dtype = TS_F32, d->y_dtype = y->dtype;
        d->x_rank = x_rank, d->y_rank = y->rank - 1;
        memcpy(d->x_dims, x_dims, (size_t)x_rank * sizeof *x_dims);
        memcpy(d->y_dims, y->dims + 1, (size_t)d->y_rank * sizeof *y->dims);
        d->xmap = m, m = NULL;
        d->y = y->data, y->data = NULL;
        s = ts_dataset_add_lineage(d, xl);
        if (s == TS_OK) s = ts_dataset_add_lineage(d, &y->lineage);
    }
    ts_xmap_unref(m);
    ts_lineage_clear(xl);
    ts_array_free(y);
    if (s != TS_OK) {
        ts_dataset_free(d);
        return s;
    }
    *out = d;
    return TS_OK;
}

ts_status ts_data_map_npy_pair(const char *x_path, const char *y_path, ts_dataset **out) {
    if (!out) return ts_fail(TS_ERR_INVALID, "npy pair: no output pointer");
    *out = NULL;
    ts_xmap *m;
    ts_status s = map_file(x_path, &m);
    if (s != TS_OK) return s;
    npy_header h = {0};
    size_t numel = 0;
    ts_lineage xl = {0};
    if ((s = ts_npy_parse_header(x_path, m->buf, m->len, &h)) != TS_OK ||
        (s = ts_npy_check_size(x_path, &h, m->len, &numel)) != TS_OK) {
        ts_xmap_unref(m);
        return s;
    }
    m->offset = h.data_offset, m->from = h.dtype;
    if ((s = scan(m, x_path, &h, numel, &xl)) != TS_OK) {
        ts_lineage_clear(&xl);
        ts_xmap_unref(m);
        return s;
    }
    ts_array y;
    if ((s = ts_npy_read(y_path, TS_F32, TS_I64, &y)) != TS_OK) {
        ts_lineage_clear(&xl);
        ts_xmap_unref(m);
        return s;
    }
    /* The checks and messages of ts_data_load_npy_pair, in its order. */
    if (h.rank < 1 || y.rank < 1)
        s = ts_fail(TS_ERR_SHAPE, "%s: a dataset array needs a leading example axis, not shape ()",
                    h.rank < 1 ? x_path : y_path);
    else if ((s = ts_data_check_examples(x_path, h.rank, h.dims)) != TS_OK ||
             (s = ts_data_check_examples(y_path, y.rank, y.dims)) != TS_OK) {
    } else if (h.dims[0] != y.dims[0]) {
        s = ts_fail(TS_ERR_SHAPE, "npy pair: %s holds %lld examples but %s holds %lld", x_path,
                    (long long)h.dims[0], y_path, (long long)y.dims[0]);
    }
    if (s != TS_OK) {
        ts_lineage_clear(&xl);
        ts_array_free(&y);
        ts_xmap_unref(m);
        return s;
    }
    m->per = ts_shape_numel(h.rank - 1, h.dims + 1);
    return make(m, h.rank - 1, h.dims + 1, &xl, &y, h.dims[0], out);
}

ts_status ts_data_map_idx_pair(const char *images, const char *labels, ts_dataset **out) {
    if (!out) return ts_fail(TS_ERR_INVALID, "IDX pair: no output pointer");
    *out = NULL;
    ts_xmap *m;
    ts_status s = map_file(images, &m);
    if (s != TS_OK) return s;
    int rank = 0;
    int64_t dims[TS_MAX_RANK] = {0};
    ts_lineage xl = {0};
    if (m->len >= 2 && m->buf[0] == 0x1f && m->buf[1] == 0x8b) {
        /* gzip: inflated into memory as bytes (hashing the compressed file). */
        ts_xmap_unref(m);
        ts_array im;
        if ((s = ts_data_read_idx(images, TS_U8, &im)) != TS_OK) return s;
        if (!(m = ts_zalloc(sizeof *m, "IDX images"))) {
            ts_array_free(&im);
            return TS_ERR_NOMEM;
        }
        *m = (ts_xmap){.refs = 1, .buf = im.data, .len = 0, .mapped = 0};
        rank = im.rank;
        memcpy(dims, im.dims, sizeof dims);
        xl = im.lineage;
        im.data = NULL;
        memset(&im.lineage, 0, sizeof im.lineage);
        ts_array_free(&im);
    } else {
        size_t off = 0;
        if ((s = ts_idx_plain_header(images, m->buf, m->len, &rank, dims, &off)) != TS_OK) {
            ts_xmap_unref(m);
            return s;
        }
        m->offset = off;
        m->from = TS_U8;
        if ((s = scan(m, images, NULL, m->len - off, &xl)) != TS_OK) {
            ts_lineage_clear(&xl);
            ts_xmap_unref(m);
            return s;
        }
    }
    m->from = TS_U8, m->scale = 1;
    ts_array lb;
    if ((s = ts_data_read_idx(labels, TS_I64, &lb)) != TS_OK) {
        ts_lineage_clear(&xl);
        ts_xmap_unref(m);
        return s;
    }
    /* The checks and messages of ts_data_load_idx_pair, in its order. */
    if (rank < 2)
        s = ts_fail(TS_ERR_SHAPE, "%s: images need at least 2 dimensions ([n, rows, cols]), not %d",
                    images, rank);
    else if (lb.rank != 1)
        s = ts_fail(TS_ERR_SHAPE, "%s: labels need 1 dimension ([n]), not %d", labels, lb.rank);
    else if ((s = ts_data_check_examples(images, rank, dims)) != TS_OK) {
    } else if (dims[0] != lb.dims[0]) {
        s = ts_fail(TS_ERR_SHAPE, "IDX pair: %s holds %lld images but %s holds %lld labels", images,
                    (long long)dims[0], labels, (long long)lb.dims[0]);
    }
    if (s != TS_OK) {
        ts_lineage_clear(&xl);
        ts_array_free(&lb);
        ts_xmap_unref(m);
        return s;
    }
    /* Images are flattened: [n, rows * cols] per example, as in memory. */
    m->per = ts_shape_numel(rank - 1, dims + 1);
    return make(m, 1, &m->per, &xl, &lb, dims[0], out);
}
