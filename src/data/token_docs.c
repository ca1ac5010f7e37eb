/* Token files as documents (data.eot_id, docs/shapes.md): one example per
 * document or per ctx + 1 tokens of a long one, padded, so a batch never
 * mixes documents inside a row and a causal model never attends across
 * one (data.h: ts_data_load_token_docs). */
#include <stdlib.h>
#include <string.h>
#include "data/data_internal.h"

static int64_t token(const uint8_t *buf, int bits, size_t i) {
    return bits == 16 ? ts_le16(buf + 2 * i) : ts_le32(buf + 4 * i);
}

/* Counts the examples of the file into *n and, with x and y, writes them. */
static void pieces(const uint8_t *buf, int bits, size_t ntok, int64_t ctx, int64_t eot, int64_t *n,
                   int64_t *x, int64_t *y) {
    int64_t k = 0;
    for (size_t s = 0; s < ntok;) {
        size_t e = s;
        while (e < ntok && token(buf, bits, e) != eot) e++;
        if (e < ntok) e++; /* the document keeps its end-of-text token */
        for (size_t p = s; p + 1 < e; p += (size_t)ctx) {
            const size_t len = e - p - 1 < (size_t)ctx ? e - p - 1 : (size_t)ctx;
            if (x) {
                for (size_t i = 0; i < (size_t)ctx; i++) {
                    x[k * ctx + (int64_t)i] = i < len ? token(buf, bits, p + i) : eot;
                    y[k * ctx + (int64_t)i] = i < len ? token(buf, bits, p + i + 1) : -100;
                }
            }
            k++;
        }
        s = e;
    }
    *n = k;
}

ts_status ts_data_load_token_docs(const char *path, int bits, int64_t ctx, int64_t vocab,
                                  int64_t eot, ts_dataset **out) {
    if (!out) return ts_fail(TS_ERR_INVALID, "tokens: no output pointer");
    *out = NULL;
    const char *p = path ? path : "(null)";
    if (bits != 16 && bits != 32)
        return ts_fail(TS_ERR_INVALID, "%s: token width %d bits (16 or 32 are read)", p, bits);
    if (ctx < 1 || ctx > ((int64_t)1 << 30))
        return ts_fail(TS_ERR_INVALID, "%s: context length %lld", p, (long long)ctx);
    if (vocab < 1) return ts_fail(TS_ERR_INVALID, "%s: vocabulary size %lld", p, (long long)vocab);
    if (eot < 0 || eot >= vocab)
        return ts_fail(TS_ERR_INVALID,
                       "%s: data.eot_id %lld is not a token of the vocabulary [0, %lld)", p,
                       (long long)eot, (long long)vocab);
    uint8_t *buf;
    size_t len;
    ts_lineage lin;
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
    pieces(buf, bits, ntok, ctx, eot, &n, NULL, NULL);
    if (n == 0) {
        s = ts_fail(TS_ERR_INVALID, "%s: no document of 2 tokens or more (data.eot_id %lld)", path,
                    (long long)eot);
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
    pieces(buf, bits, ntok, ctx, eot, &n, d->x, d->y);
    s = ts_dataset_add_lineage(d, &lin);
done:
    free(buf);
    ts_lineage_clear(&lin);
    if (s != TS_OK) {
        ts_dataset_free(d);
        return s;
    }
    *out = d;
    return TS_OK;
}
