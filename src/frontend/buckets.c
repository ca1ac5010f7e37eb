/* Shape buckets: the text of shape.batch_buckets / shape.seq_buckets and
 * the bucket a batch of a given size runs on (buckets.h). */
#include "frontend/buckets.h"

#include <ctype.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include "frontend/check.h"
#include "frontend/keys.h"

static ts_status bad(const char *key, const char *where, const char *text, const char *why) {
    return ts_fail(TS_ERR_INVALID, "%s: %s '%s': %s", where, key, text, why);
}

ts_status ts_buckets_parse(const char *text, const char *key, const char *where, ts_buckets *out) {
    memset(out, 0, sizeof *out);
    const char *p = text;
    while (isspace((unsigned char)*p)) p++;
    if (!*p)
        return bad(key, where, text, "the bucket list is empty (give sizes, multiple:N or pow2)");
    if (!strncmp(p, "pow2", 4)) {
        const char *e = p + 4;
        while (isspace((unsigned char)*e)) e++;
        if (*e) return bad(key, where, text, "pow2 takes no argument");
        out->kind = TS_BUCKETS_POW2;
        return TS_OK;
    }
    if (!strncmp(p, "multiple:", 9)) {
        char *e;
        errno = 0;
        long long n = strtoll(p + 9, &e, 10);
        while (isspace((unsigned char)*e)) e++;
        if (e == p + 9 || *e || errno || n < 1 || n > 1000000000LL)
            return bad(key, where, text, "multiple:N needs a whole N in [1, 1e9]");
        out->kind = TS_BUCKETS_MULTIPLE;
        out->step = n;
        return TS_OK;
    }
    out->kind = TS_BUCKETS_LIST;
    while (*p) {
        while (isspace((unsigned char)*p) || *p == ',') p++;
        if (!*p) break;
        char *e;
        errno = 0;
        long long v = strtoll(p, &e, 10);
        if (e == p || errno || (*e && *e != ',' && !isspace((unsigned char)*e)))
            return bad(key, where, text,
                       "expected whole sizes separated by commas, multiple:N or pow2");
        if (v < 1 || v > 1000000000LL) {
            char why[96];
            snprintf(why, sizeof why, "size %lld is out of range [1, 1e9]", v);
            return bad(key, where, text, why);
        }
        if (out->n == TS_MAX_BUCKETS) {
            char why[64];
            snprintf(why, sizeof why, "more than %d buckets", TS_MAX_BUCKETS);
            return bad(key, where, text, why);
        }
        if (out->n > 0 && v <= out->v[out->n - 1]) {
            char why[128];
            snprintf(why, sizeof why, "not increasing: %lld follows %lld", v,
                     (long long)out->v[out->n - 1]);
            return bad(key, where, text, why);
        }
        out->v[out->n++] = v;
        p = e;
    }
    if (out->n == 0) return bad(key, where, text, "the bucket list is empty");
    return TS_OK;
}

int64_t ts_buckets_pick(const ts_buckets *b, int64_t need, int64_t full) {
    if (need < 1) need = 1;
    switch (b->kind) {
    case TS_BUCKETS_LIST:
        for (int i = 0; i < b->n; i++)
            if (b->v[i] >= need) return b->v[i];
        return 0;
    case TS_BUCKETS_MULTIPLE: {
        if (need > full) return 0;
        int64_t m = (need + b->step - 1) / b->step * b->step;
        return m < full ? m : full;
    }
    case TS_BUCKETS_POW2: {
        if (need > full) return 0;
        int64_t m = 1;
        while (m < need) m *= 2;
        return m < full ? m : full;
    }
    }
    return 0;
}

int64_t ts_buckets_largest(const ts_buckets *b, int64_t full) {
    return b->kind == TS_BUCKETS_LIST ? b->v[b->n - 1] : full;
}

int ts_buckets_all(const ts_buckets *b, int64_t full, int64_t *out, int cap) {
    int n = 0;
    for (int64_t need = 1; n < cap;) {
        int64_t v = ts_buckets_pick(b, need, full);
        if (!v) break;
        out[n++] = v;
        need = v + 1;
    }
    return n;
}

ts_status cfg_check_shape(ts_config *c) {
    char where[600];
    const int i_b = ts_config_key_find("shape.batch_buckets"),
              i_l = ts_config_key_find("shape.seq_buckets"),
              i_drop = ts_config_key_find("data.drop_last");
    ts_buckets b;
    ts_status s = ts_buckets_parse(c->shape.batch_buckets, "shape.batch_buckets",
                                   cfg_origin(c, i_b, where, sizeof where), &b);
    if (s == TS_OK)
        s = ts_buckets_parse(c->shape.seq_buckets, "shape.seq_buckets",
                             cfg_origin(c, i_l, where, sizeof where), &b);
    if (s != TS_OK) return s;
    const int i_eot = ts_config_key_find("data.eot_id"),
              i_off = ts_config_key_find("data.doc_offsets");
    if (c->data.doc_offsets[0] && c->data.eot_id >= 0)
        return ts_fail(TS_ERR_INVALID,
                       "%s: data.doc_offsets and data.eot_id both mark documents: set one",
                       cfg_origin(c, c->set[i_off] ? i_off : i_eot, where, sizeof where));
    /* Every policy trains an epoch's short last batch unless the user drops
     * it (#20: no silent drop); paths that cannot train it refuse at setup,
     * naming data.drop_last (ts_sess_shape_setup). */
    if (!c->set[i_drop]) c->data.drop_last = 0;
    return TS_OK;
}
