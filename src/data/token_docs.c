/* Token files as documents (data.eot_id or data.doc_offsets,
 * docs/shapes.md): one example per document or per ctx + 1 tokens of a
 * long one, padded, so a batch never mixes documents inside a row and a
 * causal model never attends across one (data.h: ts_data_load_token_docs).
 * A document ends after its end-of-text id, or where the offsets file
 * says the next one starts. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "data/data_internal.h"

static int64_t token(const uint8_t *buf, int bits, size_t i) {
    return bits == 16 ? ts_le16(buf + 2 * i) : ts_le32(buf + 4 * i);
}

/* Where the document starting at token s ends (one past its last token):
 * after the next end-of-text id, or at the next offset (starts[] holds
 * the nstart offsets, increasing, the first 0). */
static size_t doc_end(const uint8_t *buf, int bits, size_t ntok, int64_t eot, const size_t *starts,
                      size_t nstart, size_t *next, size_t s) {
    if (starts) {
        while (*next < nstart && starts[*next] <= s) (*next)++;
        return *next < nstart ? starts[*next] : ntok;
    }
    size_t e = s;
    while (e < ntok && token(buf, bits, e) != eot) e++;
    return e < ntok ? e + 1 : e; /* the document keeps its end-of-text token */
}

/* Counts the examples of the file into *n and, with x and y, writes them;
 * padded inputs hold `pad`. */
static void pieces(const uint8_t *buf, int bits, size_t ntok, int64_t ctx, int64_t eot,
                   const size_t *starts, size_t nstart, int64_t pad, int64_t *n, int64_t *x,
                   int64_t *y) {
    int64_t k = 0;
    size_t next = 0;
    for (size_t s = 0; s < ntok;) {
        const size_t e = doc_end(buf, bits, ntok, eot, starts, nstart, &next, s);
        for (size_t p = s; p + 1 < e; p += (size_t)ctx) {
            const size_t len = e - p - 1 < (size_t)ctx ? e - p - 1 : (size_t)ctx;
            if (x) {
                for (size_t i = 0; i < (size_t)ctx; i++) {
                    x[k * ctx + (int64_t)i] = i < len ? token(buf, bits, p + i) : pad;
                    y[k * ctx + (int64_t)i] = i < len ? token(buf, bits, p + i + 1) : -100;
                }
            }
            k++;
        }
        s = e;
    }
    *n = k;
}

/* The offsets file: whole numbers separated by white space, the first 0,
 * increasing, each below the token count. */
static ts_status read_offsets(const char *path, size_t ntok, size_t **out, size_t *n,
                              ts_lineage *lin) {
    uint8_t *buf;
    size_t len;
    *out = NULL, *n = 0;
    ts_status s = ts_data_slurp(path, &buf, &len, lin);
    if (s != TS_OK) return s;
    size_t cap = 0, line = 1;
    const char *p = (const char *)buf, *end = p + len;
    while (s == TS_OK) {
        while (p < end && (*p == ' ' || *p == '\t' || *p == '\r' || *p == '\n'))
            line += *p++ == '\n';
        if (p == end) break;
        char num[32];
        size_t k = 0;
        while (p < end && k < sizeof num - 1 && *p >= '0' && *p <= '9') num[k++] = *p++;
        num[k] = 0;
        if (k == 0 || k == sizeof num - 1 ||
            (p < end && *p != ' ' && *p != '\t' && *p != '\r' && *p != '\n')) {
            s = ts_fail(TS_ERR_FORMAT,
                        "%s:%zu: data.doc_offsets: expected a whole token offset per entry", path,
                        line);
            break;
        }
        errno = 0;
        const unsigned long long v = strtoull(num, NULL, 10);
        const size_t prev = *n ? (*out)[*n - 1] : 0;
        if (errno || v >= ntok || (*n == 0 && v != 0) || (*n > 0 && v <= prev)) {
            s = ts_fail(TS_ERR_INVALID, "%s:%zu: data.doc_offsets: offset %s %s", path, line, num,
                        *n == 0 && v != 0 ? "must be 0 (the first document starts the file)"
                        : errno || v >= ntok
                            ? "is past the token file's end"
                            : "does not follow the previous offset (offsets increase)");
            if (!errno && v<ntok && * n> 0 && v <= prev) ts_error_prefix("previous %zu", prev);
            break;
        }
        if (*n == cap) {
            size_t *nb = realloc(*out, sizeof(size_t) * (cap = cap ? 2 * cap : 1024));
            if (!nb) {
                s = ts_fail(TS_ERR_NOMEM, "%s: out of memory for the offsets", path);
                break;
            }
            *out = nb;
        }
        (*out)[(*n)++] = (size_t)v;
    }
    if (s == TS_OK && *n == 0)
        s = ts_fail(TS_ERR_INVALID, "%s: data.doc_offsets: the file has no offset", path);
    free(buf);
    if (s != TS_OK) free(*out), *out = NULL;
    return s;
}

ts_status ts_data_load_token_docs(const char *path, int bits, int64_t ctx, int64_t vocab,
                                  int64_t eot, ts_dataset **out) {
    return ts_data_load_token_docs_at(path, bits, ctx, vocab, eot, NULL, out);
}

ts_status ts_data_load_token_docs_at(const char *path, int bits, int64_t ctx, int64_t vocab,
                                     int64_t eot, const char *offsets, ts_dataset **out) {
    if (!out) return ts_fail(TS_ERR_INVALID, "tokens: no output pointer");
    *out = NULL;
    const char *p = path ? path : "(null)";
    if (bits != 16 && bits != 32)
        return ts_fail(TS_ERR_INVALID, "%s: token width %d bits (16 or 32 are read)", p, bits);
    if (ctx < 1 || ctx > ((int64_t)1 << 30))
        return ts_fail(TS_ERR_INVALID, "%s: context length %lld", p, (long long)ctx);
    if (vocab < 1) return ts_fail(TS_ERR_INVALID, "%s: vocabulary size %lld", p, (long long)vocab);
    if (!offsets && (eot < 0 || eot >= vocab))
        return ts_fail(TS_ERR_INVALID,
                       "%s: data.eot_id %lld is not a token of the vocabulary [0, %lld)", p,
                       (long long)eot, (long long)vocab);
    uint8_t *buf;
    size_t len;
    ts_lineage lin, olin = {0};
    size_t *starts = NULL, nstart = 0;
    ts_status s = ts_data_slurp(path, &buf, &len, &lin);
    if (s != TS_OK) return s;
    const size_t tb = (size_t)bits / 8;
    size_t ntok = 0;
    ts_dataset *d = NULL;
    int64_t n = 0;
    if ((s = ts_tokens_count(path, len, bits, &ntok)) != TS_OK) goto done;
    for (size_t i = 0; i < ntok; i++) {
        const int64_t t = token(buf, bits, i);
        if (t >= vocab) {
            s = ts_fail(TS_ERR_FORMAT,
                        "%s: token at byte offset %zu is %lld, not below the vocabulary size %lld",
                        path, i * tb, (long long)t, (long long)vocab);
            goto done;
        }
    }
    if (offsets && (s = read_offsets(offsets, ntok, &starts, &nstart, &olin)) != TS_OK) goto done;
    /* padded inputs: the end-of-text id, or token 0 (never attended to) */
    const int64_t pad = offsets ? 0 : eot;
    pieces(buf, bits, ntok, ctx, eot, starts, nstart, pad, &n, NULL, NULL);
    if (n == 0) {
        s = offsets
                ? ts_fail(TS_ERR_INVALID,
                          "%s: no document of 2 tokens or more (data.doc_offsets %s)", path,
                          offsets)
                : ts_fail(TS_ERR_INVALID, "%s: no document of 2 tokens or more (data.eot_id %lld)",
                          path, (long long)eot);
        goto done;
    }
    if (!(d = ts_zalloc(sizeof *d, "dataset"))) {
        s = TS_ERR_NOMEM;
        goto done;
    }
    d->n = n;
    d->x_dtype = d->y_dtype = TS_I64;
    d->x_rank = d->y_rank = 1;
    d->x_dims[0] = d->y_dims[0] = ctx;
    d->x = ts_alloc((size_t)(n * ctx) * sizeof(int64_t), "token inputs");
    d->y = ts_alloc((size_t)(n * ctx) * sizeof(int64_t), "token targets");
    if (!d->x || !d->y) {
        s = TS_ERR_NOMEM;
        goto done;
    }
    pieces(buf, bits, ntok, ctx, eot, starts, nstart, pad, &n, d->x, d->y);
    s = ts_dataset_add_lineage(d, &lin);
    if (s == TS_OK && offsets) s = ts_dataset_add_lineage(d, &olin);
done:
    free(buf);
    free(starts);
    ts_lineage_clear(&lin);
    if (offsets) ts_lineage_clear(&olin);
    if (s != TS_OK) {
        ts_dataset_free(d);
        return s;
    }
    *out = d;
    return TS_OK;
}
