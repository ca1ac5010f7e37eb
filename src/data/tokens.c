/* Raw token files: a flat array of little-endian uint16 or uint32 token ids
 * (as written by e.g. numpy's tofile on a tokenised corpus).
 *
 * Example k holds tokens [k*ctx, k*ctx + ctx + 1): x is its first ctx
 * tokens and y the next-token targets, its last ctx. Examples start every
 * ctx tokens, so consecutive windows share exactly one token (the last
 * target of one is the first input of the next) and every token is a
 * target once (except the first). n = (tokens - 1) / ctx; a tail too short
 * for a whole window is left out. */
#include <stdlib.h>
#include <string.h>
#include "data/data_internal.h"

static int64_t token(const uint8_t *buf, int bits, size_t i) {
    return bits == 16 ? ts_le16(buf + 2 * i) : ts_le32(buf + 4 * i);
}

ts_status ts_data_load_tokens(const char *path, int bits, int64_t ctx, int64_t vocab,
                              ts_dataset **out) {
    if (!out) return ts_fail(TS_ERR_INVALID, "tokens: no output pointer");
    *out = NULL;
    const char *p = path ? path : "(null)";
    if (bits != 16 && bits != 32)
        return ts_fail(TS_ERR_INVALID, "%s: token width %d bits (16 or 32 are read)", p, bits);
    if (ctx < 1) return ts_fail(TS_ERR_INVALID, "%s: context length %lld", p, (long long)ctx);
    if (vocab < 1) return ts_fail(TS_ERR_INVALID, "%s: vocabulary size %lld", p, (long long)vocab);

    uint8_t *buf;
    size_t len;
    ts_lineage lin;
    ts_status s = ts_data_slurp(path, &buf, &len, &lin);
    if (s != TS_OK) return s;
    const size_t tb = (size_t)bits / 8;
    size_t ntok = 0;
    ts_dataset *d = NULL;
    if ((s = ts_tokens_count(path, len, bits, &ntok)) != TS_OK ||
        (s = ts_tokens_check_window(path, ntok, ctx)) != TS_OK)
        goto done;
    /* Every token is checked, including an unused tail: a value out of
     * range means the file and the vocabulary do not belong together. */
    for (size_t i = 0; i < ntok; i++) {
        const int64_t t = token(buf, bits, i);
        if (t >= vocab) {
            s = ts_fail(TS_ERR_FORMAT,
                        "%s: token at byte offset %zu is %lld, not below the vocabulary size %lld",
                        path, i * tb, (long long)t, (long long)vocab);
            goto done;
        }
    }
    const int64_t n = (int64_t)(ntok - 1) / ctx;
    if (!(d = ts_zalloc(sizeof *d, "dataset"))) {
        s = TS_ERR_NOMEM;
        goto done;
    }
    d->n = n;
    d->shuffle_bijection = 1;
    d->x_dtype = d->y_dtype = TS_I64;
    d->x_rank = d->y_rank = 1;
    d->x_dims[0] = d->y_dims[0] = ctx;
    int64_t *x = d->x = ts_alloc((size_t)(n * ctx) * sizeof *x, "token inputs");
    int64_t *y = d->y = ts_alloc((size_t)(n * ctx) * sizeof *y, "token targets");
    if (!x || !y) {
        s = TS_ERR_NOMEM;
        goto done;
    }
    for (int64_t i = 0; i < n * ctx; i++) {
        x[i] = token(buf, bits, (size_t)i);
        y[i] = token(buf, bits, (size_t)i + 1);
    }
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

ts_status ts_tokens_count(const char *path, size_t len, int bits, size_t *ntok) {
    const size_t tb = (size_t)bits / 8;
    *ntok = len / tb;
    if (len % tb)
        return ts_fail(TS_ERR_FORMAT, "%s: %zu bytes is not a whole number of %d-bit tokens", path,
                       len, bits);
    return TS_OK;
}

ts_status ts_tokens_check_window(const char *path, size_t ntok, int64_t ctx) {
    /* ctx comes from the config ([1, 1e9]) but the API takes any int64:
     * compare without forming ctx + 1. */
    if (ntok == 0 || (uint64_t)(ntok - 1) < (uint64_t)ctx)
        return ts_fail(TS_ERR_INVALID,
                       "%s: %zu tokens, fewer than one example of ctx + 1 tokens (model.ctx %lld)",
                       path, ntok, (long long)ctx);
    return TS_OK;
}
