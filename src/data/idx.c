/* IDX reader (the MNIST / Fashion-MNIST format), plain or gzip.
 *
 * Layout: two zero bytes, an element type byte (0x08: unsigned byte, the
 * only type supported), a dimension count, each dimension as a big-endian
 * uint32, then the elements in row-major order.
 *
 * The file is read whole and hashed first; gzip (recognised by its magic
 * bytes 1f 8b, not by the file name) is then inflated from that memory, so
 * the lineage hash covers exactly the bytes decoded. Concatenated gzip
 * members are read in sequence, as gunzip does. The data must fill the
 * dimensions exactly: a short file and trailing bytes are both errors. */
#include <limits.h>
#include <stdlib.h>
#include <string.h>
#include <zlib.h>
#include "data/data_internal.h"

/* A byte source over the file in memory: a copy for plain files, inflate
 * for gzip. */
typedef struct source {
    const char *path;
    const uint8_t *buf;
    size_t len, pos; /* pos: input bytes consumed (plain) or handed to zlib (gzip) */
    int gz, z_open, z_end;
    z_stream z;
} source;

static ts_status source_open(source *s, const char *path, const uint8_t *buf, size_t len) {
    memset(s, 0, sizeof *s);
    s->path = path, s->buf = buf, s->len = len;
    s->gz = len >= 2 && buf[0] == 0x1f && buf[1] == 0x8b;
    if (!s->gz) return TS_OK;
    /* 16 + MAX_WBITS: a gzip wrapper (header and CRC-32 checked by zlib). */
    int rc = inflateInit2(&s->z, 16 + MAX_WBITS);
    if (rc != Z_OK)
        return ts_fail(rc == Z_MEM_ERROR ? TS_ERR_NOMEM : TS_ERR_INTERNAL,
                       "%s: zlib could not start inflating (%d)", path, rc);
    s->z_open = 1;
    return TS_OK;
}

static void source_close(source *s) {
    if (s->z_open) inflateEnd(&s->z);
    s->z_open = 0;
}

/* Reads up to n bytes; *got < n only at the end of the data. */
static ts_status source_read(source *s, uint8_t *dst, size_t n, size_t *got) {
    *got = 0;
    if (!s->gz) {
        size_t k = s->len - s->pos < n ? s->len - s->pos : n;
        memcpy(dst, s->buf + s->pos, k);
        s->pos += k;
        *got = k;
        return TS_OK;
    }
    while (*got < n && !s->z_end) {
        /* zlib counts in uInt: feed and drain at most UINT_MAX at a time. */
        if (s->z.avail_in == 0 && s->pos < s->len) {
            size_t k = s->len - s->pos < UINT_MAX ? s->len - s->pos : UINT_MAX;
            s->z.next_in = (Bytef *)(uintptr_t)(s->buf + s->pos);
            s->z.avail_in = (uInt)k;
            s->pos += k;
        }
        size_t want = n - *got < UINT_MAX ? n - *got : UINT_MAX;
        s->z.next_out = dst + *got;
        s->z.avail_out = (uInt)want;
        int rc = inflate(&s->z, Z_NO_FLUSH);
        *got += want - s->z.avail_out;
        const size_t unread = s->len - s->pos + s->z.avail_in;
        if (rc == Z_STREAM_END) {
            if (unread == 0) {
                s->z_end = 1;
            } else {
                const uint8_t *next = s->buf + (s->len - unread);
                if (unread < 2 || next[0] != 0x1f || next[1] != 0x8b)
                    return ts_fail(TS_ERR_FORMAT,
                                   "%s: %zu bytes after the end of the gzip stream (offset %zu)",
                                   s->path, unread, s->len - unread);
                inflateReset(&s->z); /* another member follows */
            }
        } else if ((rc == Z_OK || rc == Z_BUF_ERROR) && unread == 0 && s->z.avail_out) {
            /* Every input byte is consumed, output is still wanted and the
             * stream has not ended. */
            return ts_fail(TS_ERR_FORMAT, "%s: the gzip stream is truncated", s->path);
        } else if (rc == Z_BUF_ERROR) {
            /* No progress although input and output space remain: cannot
             * happen with a sound zlib, but must not loop forever. */
            return ts_fail(TS_ERR_INTERNAL, "%s: zlib made no progress at compressed offset %zu",
                           s->path, s->len - unread);
        } else if (rc == Z_MEM_ERROR) {
            return ts_fail(TS_ERR_NOMEM, "%s: out of memory inflating gzip data", s->path);
        } else if (rc != Z_OK) {
            return ts_fail(TS_ERR_FORMAT, "%s: corrupt gzip data near compressed offset %zu: %s",
                           s->path, s->len - unread, s->z.msg ? s->z.msg : "inflate failed");
        }
    }
    return TS_OK;
}

static ts_status read_idx(const char *path, ts_dtype want, ts_array *out) {
    memset(out, 0, sizeof *out);
    if (!(want == TS_U8 || want == TS_F32 || want == TS_F64 || want == TS_I32 || want == TS_I64))
        return ts_fail(TS_ERR_UNSUPPORTED, "%s: cannot convert IDX data to %s", path,
                       ts_dtype_name(want));
    uint8_t *buf, *raw = NULL;
    size_t len, got;
    ts_lineage lin;
    ts_status s = ts_data_slurp(path, &buf, &len, &lin);
    if (s != TS_OK) return s;
    source src;
    if ((s = source_open(&src, path, buf, len)) != TS_OK) goto done;
    uint8_t head[4 + 4 * TS_MAX_RANK];
    if ((s = source_read(&src, head, 4, &got)) != TS_OK) goto done;
    if (got < 4 || head[0] != 0 || head[1] != 0) {
        s = ts_fail(TS_ERR_FORMAT, "%s: not an IDX file (bad magic)", path);
        goto done;
    }
    if (head[2] != 0x08) {
        const int known = head[2] == 0x09 || (head[2] >= 0x0b && head[2] <= 0x0e);
        s = ts_fail(known ? TS_ERR_UNSUPPORTED : TS_ERR_FORMAT,
                    "%s: IDX element type 0x%02x is %s; only unsigned bytes (0x08) are read", path,
                    head[2], known ? "not supported" : "unknown");
        goto done;
    }
    const int rank = head[3];
    if (rank < 1 || rank > TS_MAX_RANK) {
        s = ts_fail(TS_ERR_FORMAT, "%s: IDX file has %d dimensions (1 to %d are read)", path, rank,
                    TS_MAX_RANK);
        goto done;
    }
    if ((s = source_read(&src, head + 4, 4 * (size_t)rank, &got)) != TS_OK) goto done;
    if (got < 4 * (size_t)rank) {
        s = ts_fail(TS_ERR_FORMAT, "%s: truncated IDX header (%d dimensions announced)", path,
                    rank);
        goto done;
    }
    for (int i = 0; i < rank; i++) out->dims[i] = ts_be32(head + 4 + 4 * i);
    int64_t count;
    if ((s = ts_data_check_shape(path, rank, out->dims, 16, &count)) != TS_OK) goto done;
    const size_t numel = (size_t)count;
    /* Refuse a size the file cannot hold before allocating it: a damaged
     * dimension must not turn into a huge allocation. Deflate expands at
     * most 1032-fold. */
    const size_t left = src.gz ? src.len - src.pos + src.z.avail_in : src.len - src.pos;
    if (!src.gz && numel > left) {
        s = ts_fail(TS_ERR_FORMAT,
                    "%s: truncated IDX data: the dimensions need %zu bytes, %zu follow the "
                    "header",
                    path, numel, left);
        goto done;
    }
    if (src.gz && left < SIZE_MAX / 2048 && numel > left * 1032 + 1024) {
        s = ts_fail(TS_ERR_FORMAT,
                    "%s: truncated IDX data: the dimensions need %zu bytes, more than %zu bytes "
                    "of gzip data can hold",
                    path, numel, left);
        goto done;
    }
    if (!(raw = ts_alloc(numel, path))) {
        s = TS_ERR_NOMEM;
        goto done;
    }
    if ((s = source_read(&src, raw, numel, &got)) != TS_OK) goto done;
    if (got < numel) {
        s = ts_fail(TS_ERR_FORMAT,
                    "%s: truncated IDX data: the dimensions need %zu bytes, %zu follow the "
                    "header",
                    path, numel, got);
        goto done;
    }
    /* Reading on to the end also makes zlib check the gzip CRC. */
    uint8_t extra;
    if ((s = source_read(&src, &extra, 1, &got)) != TS_OK) goto done;
    if (got) {
        s = ts_fail(TS_ERR_FORMAT, "%s: unexpected data after the %zu IDX data bytes", path, numel);
        goto done;
    }
    if (want == TS_U8) {
        out->data = raw;
        raw = NULL;
    } else {
        if (!(out->data = ts_alloc(numel * ts_dtype_size(want), path))) {
            s = TS_ERR_NOMEM;
            goto done;
        }
        for (size_t i = 0; i < numel; i++) {
            switch (want) {
            case TS_F32: ((float *)out->data)[i] = raw[i]; break;
            case TS_F64: ((double *)out->data)[i] = raw[i]; break;
            case TS_I32: ((int32_t *)out->data)[i] = raw[i]; break;
            default: ((int64_t *)out->data)[i] = raw[i]; break;
            }
        }
    }
    out->dtype = want;
    out->rank = rank;
    out->lineage = lin;
    memset(&lin, 0, sizeof lin);
done:
    source_close(&src);
    free(raw);
    free(buf);
    ts_lineage_clear(&lin);
    if (s != TS_OK) {
        free(out->data);
        memset(out, 0, sizeof *out);
    }
    return s;
}

ts_status ts_data_read_idx(const char *path, ts_dtype want, ts_array *out) {
    if (!out) return ts_fail(TS_ERR_INVALID, "%s: no output array", path ? path : "(null)");
    return read_idx(path, want, out);
}

ts_status ts_data_load_idx_pair(const char *images, const char *labels, ts_dataset **out) {
    if (!out) return ts_fail(TS_ERR_INVALID, "IDX pair: no output pointer");
    *out = NULL;
    ts_array im, lb;
    ts_status s = read_idx(images, TS_U8, &im);
    if (s != TS_OK) return s;
    if ((s = read_idx(labels, TS_I64, &lb)) != TS_OK) {
        ts_array_free(&im);
        return s;
    }
    ts_dataset *d = NULL;
    if (im.rank < 2) {
        s = ts_fail(TS_ERR_SHAPE, "%s: images need at least 2 dimensions ([n, rows, cols]), not %d",
                    images, im.rank);
    } else if (lb.rank != 1) {
        s = ts_fail(TS_ERR_SHAPE, "%s: labels need 1 dimension ([n]), not %d", labels, lb.rank);
    } else if ((s = ts_data_check_examples(images, im.rank, im.dims)) != TS_OK) {
    } else if (im.dims[0] != lb.dims[0]) {
        s = ts_fail(TS_ERR_SHAPE, "IDX pair: %s holds %lld images but %s holds %lld labels", images,
                    (long long)im.dims[0], labels, (long long)lb.dims[0]);
    } else if (!(d = ts_zalloc(sizeof *d, "dataset"))) {
        s = TS_ERR_NOMEM;
    }
    if (s == TS_OK) {
        const int64_t n = im.dims[0], feat = ts_shape_numel(im.rank - 1, im.dims + 1);
        d->n = n;
        d->x_dtype = TS_F32, d->y_dtype = TS_I64;
        d->x_rank = 1, d->x_dims[0] = feat;
        d->y_rank = 0;
        if (!(d->x = ts_alloc((size_t)(n * feat) * sizeof(float), "IDX images"))) {
            s = TS_ERR_NOMEM;
        } else {
            const uint8_t *px = im.data;
            for (int64_t i = 0; i < n * feat; i++) ((float *)d->x)[i] = (float)px[i] / 255.0f;
            d->y = lb.data;
            lb.data = NULL;
            s = ts_dataset_add_lineage(d, &im.lineage);
            if (s == TS_OK) s = ts_dataset_add_lineage(d, &lb.lineage);
        }
    }
    ts_array_free(&im);
    ts_array_free(&lb);
    if (s != TS_OK) {
        ts_dataset_free(d);
        return s;
    }
    *out = d;
    return TS_OK;
}

ts_status ts_idx_plain_header(const char *path, const uint8_t *buf, size_t len, int *rank,
                              int64_t *dims, size_t *data_offset) {
    if (len < 4 || buf[0] != 0 || buf[1] != 0)
        return ts_fail(TS_ERR_FORMAT, "%s: not an IDX file (bad magic)", path);
    if (buf[2] != 0x08) {
        const int known = buf[2] == 0x09 || (buf[2] >= 0x0b && buf[2] <= 0x0e);
        return ts_fail(known ? TS_ERR_UNSUPPORTED : TS_ERR_FORMAT,
                       "%s: IDX element type 0x%02x is %s; only unsigned bytes (0x08) are read",
                       path, buf[2], known ? "not supported" : "unknown");
    }
    const int r = buf[3];
    if (r < 1 || r > TS_MAX_RANK)
        return ts_fail(TS_ERR_FORMAT, "%s: IDX file has %d dimensions (1 to %d are read)", path, r,
                       TS_MAX_RANK);
    const size_t off = 4 + 4 * (size_t)r;
    if (len < off)
        return ts_fail(TS_ERR_FORMAT, "%s: truncated IDX header (%d dimensions announced)", path,
                       r);
    for (int i = 0; i < r; i++) dims[i] = ts_be32(buf + 4 + 4 * i);
    int64_t count;
    ts_status s = ts_data_check_shape(path, r, dims, 16, &count);
    if (s != TS_OK) return s;
    const size_t numel = (size_t)count, left = len - off;
    if (numel > left)
        return ts_fail(TS_ERR_FORMAT,
                       "%s: truncated IDX data: the dimensions need %zu bytes, %zu follow the "
                       "header",
                       path, numel, left);
    if (numel < left)
        return ts_fail(TS_ERR_FORMAT, "%s: unexpected data after the %zu IDX data bytes", path,
                       numel);
    *rank = r;
    *data_offset = off;
    return TS_OK;
}
