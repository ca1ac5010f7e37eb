/* NumPy .npy reader (format versions 1.0, 2.0 and 3.0).
 *
 * The header is a Python dict literal; it is parsed strictly rather than
 * evaluated: exactly the keys 'descr', 'fortran_order' and 'shape', each
 * once, with a plain string, a boolean and a tuple of non-negative integers.
 * Anything else is reported as malformed or unsupported, naming the file,
 * instead of being guessed at. Data must be C order, little-endian, and
 * exactly as long as the shape says. */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include "data/data_internal.h"

/* A cursor over the header text; `path` is for messages. */
typedef struct cursor {
    const char *path;
    const char *s, *end;
} cursor;

static void skip_spaces(cursor *c) {
    while (c->s < c->end && (*c->s == ' ' || *c->s == '\t')) c->s++;
}

static ts_status expect(cursor *c, char ch, const char *where) {
    skip_spaces(c);
    if (c->s >= c->end || *c->s != ch)
        return ts_fail(TS_ERR_FORMAT, "%s: .npy header: expected '%c' %s", c->path, ch, where);
    c->s++;
    return TS_OK;
}

/* A quoted string without escapes (numpy never writes any in a header). */
static ts_status parse_string(cursor *c, char *out, size_t cap) {
    skip_spaces(c);
    if (c->s >= c->end || (*c->s != '\'' && *c->s != '"'))
        return ts_fail(TS_ERR_FORMAT, "%s: .npy header: expected a quoted string", c->path);
    const char q = *c->s++;
    size_t n = 0;
    while (c->s < c->end && *c->s != q) {
        if (*c->s == '\\' || *c->s == '\n')
            return ts_fail(TS_ERR_FORMAT, "%s: .npy header: unexpected character in a string",
                           c->path);
        if (n + 1 >= cap)
            return ts_fail(TS_ERR_FORMAT, "%s: .npy header: string too long", c->path);
        out[n++] = *c->s++;
    }
    if (c->s >= c->end)
        return ts_fail(TS_ERR_FORMAT, "%s: .npy header: unterminated string", c->path);
    c->s++;
    out[n] = 0;
    return TS_OK;
}

static int starts(const cursor *c, const char *word) {
    size_t n = strlen(word);
    return (size_t)(c->end - c->s) >= n && !memcmp(c->s, word, n);
}

/* (), (n,), (n, m), (n, m,) — a one-element tuple needs its comma, as in
 * Python, where (n) is just an integer. */
static ts_status parse_shape(cursor *c, npy_header *h) {
    ts_status s = expect(c, '(', "to open the shape tuple");
    if (s != TS_OK) return s;
    h->rank = 0;
    int trailing_comma = 0;
    for (;;) {
        skip_spaces(c);
        if (c->s < c->end && *c->s == ')') {
            c->s++;
            break;
        }
        if (c->s >= c->end || *c->s < '0' || *c->s > '9')
            return ts_fail(TS_ERR_FORMAT,
                           "%s: .npy header: shape holds something other than "
                           "non-negative integers",
                           c->path);
        int64_t v = 0;
        while (c->s < c->end && *c->s >= '0' && *c->s <= '9') {
            if (v > (INT64_MAX - 9) / 10)
                return ts_fail(TS_ERR_FORMAT, "%s: .npy header: a dimension is too large", c->path);
            v = v * 10 + (*c->s++ - '0');
        }
        if (c->s < c->end && *c->s == 'L') c->s++; /* written by Python 2 */
        if (h->rank == TS_MAX_RANK)
            return ts_fail(TS_ERR_UNSUPPORTED, "%s: .npy array has more than %d dimensions",
                           c->path, TS_MAX_RANK);
        h->dims[h->rank++] = v;
        skip_spaces(c);
        trailing_comma = 0;
        if (c->s < c->end && *c->s == ',') {
            c->s++;
            trailing_comma = 1;
        } else if (c->s < c->end && *c->s == ')') {
            c->s++;
            break;
        } else {
            return ts_fail(TS_ERR_FORMAT, "%s: .npy header: expected ',' or ')' in the shape",
                           c->path);
        }
    }
    if (h->rank == 1 && !trailing_comma)
        return ts_fail(TS_ERR_FORMAT,
                       "%s: .npy header: shape (%lld) is not a tuple; a "
                       "one-dimensional shape is written (%lld,)",
                       c->path, (long long)h->dims[0], (long long)h->dims[0]);
    return TS_OK;
}

static ts_status parse_descr(cursor *c, npy_header *h) {
    skip_spaces(c);
    if (c->s < c->end && *c->s == '[')
        return ts_fail(TS_ERR_UNSUPPORTED,
                       "%s: structured dtypes are not supported (use a plain numeric array)",
                       c->path);
    char d[32];
    ts_status s = parse_string(c, d, sizeof d);
    if (s != TS_OK) return s;
    static const struct {
        const char *descr;
        ts_dtype dt;
    } known[] = {
        {"<f4", TS_F32}, {"<f8", TS_F64}, {"<i4", TS_I32}, {"<i8", TS_I64}, {"|u1", TS_U8}};
    for (size_t i = 0; i < sizeof known / sizeof known[0]; i++)
        if (!strcmp(d, known[i].descr)) {
            h->dtype = known[i].dt;
            return TS_OK;
        }
    if (d[0] == '>')
        return ts_fail(TS_ERR_UNSUPPORTED,
                       "%s: big-endian data ('%s') is not supported; save it little-endian, "
                       "e.g. a.astype('<%s')",
                       c->path, d, d + 1);
    return ts_fail(TS_ERR_UNSUPPORTED,
                   "%s: dtype '%s' is not supported (supported: '<f4', '<f8', '<i4', '<i8', "
                   "'|u1')",
                   c->path, d);
}

ts_status ts_npy_parse_header(const char *path, const uint8_t *buf, size_t len, npy_header *h) {
    static const uint8_t magic[6] = {0x93, 'N', 'U', 'M', 'P', 'Y'};
    if (len < 10 || memcmp(buf, magic, sizeof magic))
        return ts_fail(TS_ERR_FORMAT, "%s: not a .npy file (bad magic)", path);
    const int major = buf[6], minor = buf[7];
    if (major < 1 || major > 3 || minor != 0)
        return ts_fail(TS_ERR_UNSUPPORTED,
                       "%s: .npy format version %d.%d is not supported (1.0, 2.0, 3.0 are)", path,
                       major, minor);
    size_t start = major == 1 ? 10 : 12;
    if (len < start)
        return ts_fail(TS_ERR_FORMAT, "%s: truncated .npy header (%zu bytes)", path, len);
    const size_t hlen = major == 1 ? ts_le16(buf + 8) : ts_le32(buf + 8);
    if (hlen > len - start)
        return ts_fail(TS_ERR_FORMAT,
                       "%s: truncated .npy file: the header says %zu bytes, %zu follow", path, hlen,
                       len - start);
    cursor c = {path, (const char *)buf + start, (const char *)buf + start + hlen};
    if (hlen == 0 || c.end[-1] != '\n')
        return ts_fail(TS_ERR_FORMAT, "%s: .npy header does not end with a newline", path);
    c.end--;

    ts_status s = expect(&c, '{', "at the start of the header");
    int seen_descr = 0, seen_fortran = 0, seen_shape = 0;
    for (; s == TS_OK;) {
        skip_spaces(&c);
        if (c.s < c.end && *c.s == '}') {
            c.s++;
            break;
        }
        char key[32];
        if ((s = parse_string(&c, key, sizeof key)) != TS_OK) break;
        if ((s = expect(&c, ':', "after a key")) != TS_OK) break;
        int *seen = !strcmp(key, "descr")           ? &seen_descr
                    : !strcmp(key, "fortran_order") ? &seen_fortran
                    : !strcmp(key, "shape")         ? &seen_shape
                                                    : NULL;
        if (!seen) {
            s = ts_fail(TS_ERR_FORMAT, "%s: .npy header: unexpected key '%s'", path, key);
            break;
        }
        if (*seen) {
            s = ts_fail(TS_ERR_FORMAT, "%s: .npy header: key '%s' appears twice", path, key);
            break;
        }
        *seen = 1;
        if (seen == &seen_descr) {
            s = parse_descr(&c, h);
        } else if (seen == &seen_shape) {
            s = parse_shape(&c, h);
        } else {
            skip_spaces(&c);
            if (starts(&c, "False")) {
                c.s += 5;
            } else if (starts(&c, "True")) {
                s = ts_fail(TS_ERR_UNSUPPORTED,
                            "%s: Fortran-order arrays are not supported; save a C-order array "
                            "(np.ascontiguousarray)",
                            path);
            } else {
                s = ts_fail(TS_ERR_FORMAT, "%s: .npy header: fortran_order is not True or False",
                            path);
            }
        }
        if (s != TS_OK) break;
        skip_spaces(&c);
        if (c.s < c.end && *c.s == ',') {
            c.s++;
        } else if (!(c.s < c.end && *c.s == '}')) {
            s = ts_fail(TS_ERR_FORMAT, "%s: .npy header: expected ',' or '}' after '%s'", path,
                        key);
        }
    }
    if (s != TS_OK) return s;
    skip_spaces(&c);
    if (c.s != c.end)
        return ts_fail(TS_ERR_FORMAT, "%s: .npy header: unexpected text after the dict", path);
    if (!seen_descr || !seen_fortran || !seen_shape)
        return ts_fail(TS_ERR_FORMAT, "%s: .npy header lacks '%s'", path,
                       !seen_descr     ? "descr"
                       : !seen_fortran ? "fortran_order"
                                       : "shape");
    h->data_offset = start + hlen;
    return TS_OK;
}

static int is_int_dtype(ts_dtype t) {
    return t == TS_I32 || t == TS_I64 || t == TS_U8;
}

ts_status ts_npy_convert(const char *path, ts_dtype from, const uint8_t *src, int64_t numel,
                         ts_dtype to, void *dst, int64_t first) {
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
    if (from == to) {
        memcpy(dst, src, (size_t)numel * ts_dtype_size(from));
        return TS_OK;
    }
#endif
    const size_t es = ts_dtype_size(from);
    for (int64_t i = 0; i < numel; i++) {
        const uint8_t *p = src + (size_t)i * es;
        double v = 0;
        int64_t k = 0;
        int is_float = 1;
        switch (from) {
        case TS_F32: {
            uint32_t b = ts_le32(p);
            float f;
            memcpy(&f, &b, sizeof f);
            v = f;
            break;
        }
        case TS_F64: {
            uint64_t b = ts_le64(p);
            memcpy(&v, &b, sizeof v);
            break;
        }
        case TS_I32: k = (int32_t)ts_le32(p), is_float = 0; break;
        case TS_I64: k = (int64_t)ts_le64(p), is_float = 0; break;
        default: k = p[0], is_float = 0; break;
        }
        if (to == TS_F32 || to == TS_F64) {
            double d = is_float ? v : (double)k;
            if (to == TS_F64) {
                ((double *)dst)[i] = d;
            } else {
                float f = (float)d;
                if (isfinite(d) && !isfinite(f))
                    return ts_fail(TS_ERR_FORMAT, "%s: element %lld holds %g, too large for f32",
                                   path, (long long)(first + i), d);
                ((float *)dst)[i] = f;
            }
            continue;
        }
        if (is_float) {
            /* 2^63 is exact in a double; the i64 range is [-2^63, 2^63). */
            if (!(v >= -9223372036854775808.0 && v < 9223372036854775808.0) || v != floor(v))
                return ts_fail(TS_ERR_FORMAT,
                               "%s: element %lld holds %g, not a whole number that "
                               "fits %s",
                               path, (long long)(first + i), v, ts_dtype_name(to));
            k = (int64_t)v;
        }
        const int64_t lo = to == TS_U8 ? 0 : to == TS_I32 ? INT32_MIN : INT64_MIN;
        const int64_t hi = to == TS_U8 ? 255 : to == TS_I32 ? INT32_MAX : INT64_MAX;
        if (k < lo || k > hi)
            return ts_fail(TS_ERR_FORMAT, "%s: element %lld holds %lld, which does not fit %s",
                           path, (long long)(first + i), (long long)k, ts_dtype_name(to));
        if (to == TS_I64)
            ((int64_t *)dst)[i] = k;
        else if (to == TS_I32)
            ((int32_t *)dst)[i] = (int32_t)k;
        else
            ((uint8_t *)dst)[i] = (uint8_t)k;
    }
    return TS_OK;
}

/* The number rule (docs/data.md, "Numbers"): every value read as data is
 * finite, as in a CSV file; a NaN or infinity in an input would only turn
 * into a NaN loss many steps later, far from its cause. The message names
 * the element by its flat index and by its index in the shape. */
ts_status ts_npy_check_finite(const char *path, const npy_header *h, const uint8_t *src,
                              size_t first, size_t count) {
    if (h->dtype != TS_F32 && h->dtype != TS_F64) return TS_OK;
    for (size_t i = first; i < first + count; i++) {
        double v;
        if (h->dtype == TS_F32) {
            uint32_t b = ts_le32(src + 4 * (i - first));
            float f;
            memcpy(&f, &b, sizeof f);
            v = f;
        } else {
            uint64_t b = ts_le64(src + 8 * (i - first));
            memcpy(&v, &b, sizeof v);
        }
        if (isfinite(v)) continue;
        char at[24 * TS_MAX_RANK] = "";
        size_t k = 0, rest = i;
        for (int d = h->rank - 1; d >= 0; d--) {
            /* The index of dimension d, written right to left. */
            char one[24];
            const size_t dim = (size_t)h->dims[d];
            int w = snprintf(one, sizeof one, d ? ", %zu" : "%zu", rest % dim);
            rest /= dim;
            memmove(at + w, at, k + 1);
            memcpy(at, one, (size_t)w);
            k += (size_t)w;
        }
        return ts_fail(TS_ERR_FORMAT,
                       "%s: element %zu (index [%s]) is %s; data must be finite numbers", path, i,
                       at,
                       isnan(v) ? "nan"
                       : v > 0  ? "inf"
                                : "-inf");
    }
    return TS_OK;
}

static int convertible(ts_dtype t) {
    return t == TS_F32 || t == TS_F64 || t == TS_I32 || t == TS_I64 || t == TS_U8;
}

ts_status ts_npy_check_size(const char *path, const npy_header *h, size_t len, size_t *numel) {
    const size_t es = ts_dtype_size(h->dtype);
    int64_t count;
    ts_status s = ts_data_check_shape(path, h->rank, h->dims, 16, &count);
    if (s != TS_OK) return s;
    *numel = (size_t)count;
    const size_t need = *numel * es, have = len - h->data_offset;
    if (have < need)
        return ts_fail(TS_ERR_FORMAT,
                       "%s: truncated .npy data: the shape needs %zu bytes, %zu follow", path, need,
                       have);
    if (have > need)
        return ts_fail(TS_ERR_FORMAT, "%s: %zu unexpected bytes after the .npy data (offset %zu)",
                       path, have - need, h->data_offset + need);
    return TS_OK;
}

ts_status ts_npy_read(const char *path, ts_dtype want_float, ts_dtype want_int, ts_array *out) {
    memset(out, 0, sizeof *out);
    if (!convertible(want_float) || !convertible(want_int))
        return ts_fail(TS_ERR_UNSUPPORTED, "%s: cannot convert .npy data to %s", path,
                       ts_dtype_name(convertible(want_float) ? want_int : want_float));
    uint8_t *buf;
    size_t len;
    ts_lineage lin;
    ts_status s = ts_data_slurp(path, &buf, &len, &lin);
    if (s != TS_OK) return s;
    npy_header h = {0};
    size_t numel;
    if ((s = ts_npy_parse_header(path, buf, len, &h)) != TS_OK ||
        (s = ts_npy_check_size(path, &h, len, &numel)) != TS_OK ||
        (s = ts_npy_check_finite(path, &h, buf + h.data_offset, 0, numel)) != TS_OK)
        goto fail;
    const ts_dtype to = is_int_dtype(h.dtype) ? want_int : want_float;
    out->data = ts_alloc(numel * ts_dtype_size(to), path);
    if (!out->data) {
        s = TS_ERR_NOMEM;
        goto fail;
    }
    s = ts_npy_convert(path, h.dtype, buf + h.data_offset, (int64_t)numel, to, out->data, 0);
    if (s != TS_OK) goto fail;
    out->dtype = to;
    out->rank = h.rank;
    memcpy(out->dims, h.dims, sizeof h.dims);
    out->lineage = lin;
    free(buf);
    return TS_OK;
fail:
    free(out->data);
    memset(out, 0, sizeof *out);
    ts_lineage_clear(&lin);
    free(buf);
    return s;
}

ts_status ts_data_read_npy(const char *path, ts_dtype want, ts_array *out) {
    if (!out) return ts_fail(TS_ERR_INVALID, "%s: no output array", path ? path : "(null)");
    return ts_npy_read(path, want, want, out);
}

void ts_array_free(ts_array *a) {
    if (!a) return;
    free(a->data);
    ts_lineage_clear(&a->lineage);
    memset(a, 0, sizeof *a);
}

ts_status ts_data_load_npy_pair(const char *x_path, const char *y_path, ts_dataset **out) {
    if (!out) return ts_fail(TS_ERR_INVALID, "npy pair: no output pointer");
    *out = NULL;
    ts_array x, y;
    ts_status s = ts_npy_read(x_path, TS_F32, TS_F32, &x);
    if (s != TS_OK) return s;
    s = ts_npy_read(y_path, TS_F32, TS_I64, &y);
    if (s != TS_OK) {
        ts_array_free(&x);
        return s;
    }
    ts_dataset *d = NULL;
    if (x.rank < 1 || y.rank < 1) {
        s = ts_fail(TS_ERR_SHAPE, "%s: a dataset array needs a leading example axis, not shape ()",
                    x.rank < 1 ? x_path : y_path);
    } else if ((s = ts_data_check_examples(x_path, x.rank, x.dims)) != TS_OK ||
               (s = ts_data_check_examples(y_path, y.rank, y.dims)) != TS_OK) {
    } else if (x.dims[0] != y.dims[0]) {
        s = ts_fail(TS_ERR_SHAPE, "npy pair: %s holds %lld examples but %s holds %lld", x_path,
                    (long long)x.dims[0], y_path, (long long)y.dims[0]);
    } else if (!(d = ts_zalloc(sizeof *d, "dataset"))) {
        s = TS_ERR_NOMEM;
    }
    if (s == TS_OK) {
        d->n = x.dims[0];
        d->x_dtype = x.dtype, d->y_dtype = y.dtype;
        d->x_rank = x.rank - 1, d->y_rank = y.rank - 1;
        memcpy(d->x_dims, x.dims + 1, (size_t)d->x_rank * sizeof *x.dims);
        memcpy(d->y_dims, y.dims + 1, (size_t)d->y_rank * sizeof *y.dims);
        d->x = x.data, d->y = y.data;
        x.data = y.data = NULL;
        s = ts_dataset_add_lineage(d, &x.lineage);
        if (s == TS_OK) s = ts_dataset_add_lineage(d, &y.lineage);
    }
    ts_array_free(&x);
    ts_array_free(&y);
    if (s != TS_OK) {
        ts_dataset_free(d);
        return s;
    }
    *out = d;
    return TS_OK;
}
