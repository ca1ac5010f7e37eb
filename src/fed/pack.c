/* pack.c — fixed-point encoding and slot packing (pack.h says the scheme
 * and its error bound). */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include "fed/pack.h"

static int bits_of(uint64_t v) {
    return v ? 64 - __builtin_clzll(v) : 0;
}

ts_status ts_fed_pack_init(ts_fed_pack *p, double scale, double clip, int max_clients, int n_bits) {
    memset(p, 0, sizeof *p);
    if (!(scale > 0) || !isfinite(scale) || !(clip > 0) || !isfinite(clip))
        return ts_fail(TS_ERR_INVALID, "fed: scale (%g) and clip (%g) must be finite and > 0",
                       scale, clip);
    if (max_clients < 1 || max_clients > (1 << 20))
        return ts_fail(TS_ERR_INVALID, "fed: max_clients %d not in [1, 2^20]", max_clients);
    double q = nearbyint(clip * scale);
    if (q < 1 || q > 0x1p61)
        return ts_fail(TS_ERR_INVALID, "fed: clip · scale = %g must be in [1, 2^61]", clip * scale);
    p->scale = scale;
    p->clip = clip;
    p->max_clients = max_clients;
    p->qmax = (int64_t)q;
    /* the largest slot sum: 2·qmax·max_clients, which must fit in 62 bits */
    if ((uint64_t)(2 * p->qmax) > (UINT64_C(1) << 62) / (uint64_t)max_clients)
        return ts_fail(TS_ERR_INVALID,
                       "fed: 2 · clip · scale · max_clients = %g does not fit a 62-bit slot: "
                       "lower fed.scale, fed.clip or fed.max_clients",
                       2.0 * (double)p->qmax * max_clients);
    p->slot_bits = bits_of((uint64_t)(2 * p->qmax) * (uint64_t)max_clients);
    if (n_bits > 0) {
        p->slots = (n_bits - 1) / p->slot_bits;
        if (p->slots < 1)
            return ts_fail(TS_ERR_INVALID, "fed: a %d-bit slot does not fit a %d-bit plaintext",
                           p->slot_bits, n_bits);
    }
    return TS_OK;
}

int64_t ts_fed_pack_count(const ts_fed_pack *p, int64_t n) {
    return p->slots > 0 ? (n + p->slots - 1) / p->slots : 0;
}

double ts_fed_pack_bound(const ts_fed_pack *p, int k) {
    return k * 0.5 / p->scale;
}

ts_status ts_fed_quantize(const ts_fed_pack *p, const float *x, int64_t n, double weight,
                          uint64_t *u, int64_t *clipped) {
    if (!(weight >= 0 && weight <= 1))
        return ts_fail(TS_ERR_INVALID, "fed: update weight %g not in [0, 1]", weight);
    int64_t nc = 0;
    for (int64_t i = 0; i < n; i++) {
        double v = (double)x[i] * weight;
        if (!isfinite(v))
            return ts_fail(TS_ERR_NUMERIC, "fed: update value %lld is %g", (long long)i, v);
        if (v > p->clip)
            v = p->clip, nc++;
        else if (v < -p->clip)
            v = -p->clip, nc++;
        int64_t q = (int64_t)nearbyint(v * p->scale);
        /* clip · scale rounds to qmax, but v · scale may round one past it */
        if (q > p->qmax) q = p->qmax;
        if (q < -p->qmax) q = -p->qmax;
        u[i] = (uint64_t)(q + p->qmax);
    }
    if (clipped) *clipped = nc;
    return TS_OK;
}

ts_status ts_fed_pack_plain(const ts_fed_pack *p, const uint64_t *u, int64_t n, int64_t index,
                            mpz_t m) {
    int64_t first = index * p->slots;
    if (p->slots < 1 || index < 0 || first >= n)
        return ts_fail(TS_ERR_INVALID, "fed: plaintext %lld outside %lld values", (long long)index,
                       (long long)n);
    int count = (int)(n - first < p->slots ? n - first : p->slots);
    size_t nw = ((size_t)count * (size_t)p->slot_bits + 63) / 64;
    uint64_t stack[128], *w = nw <= 128 ? stack : calloc(nw, sizeof *w);
    if (!w) return ts_fail(TS_ERR_NOMEM, "fed: packing");
    memset(w, 0, nw * sizeof *w);
    uint64_t limit = (uint64_t)(2 * p->qmax);
    ts_status s = TS_OK;
    for (int j = 0; j < count; j++) {
        uint64_t v = u[first + j];
        if (v > limit) {
            s = ts_fail(TS_ERR_NUMERIC, "fed: encoded value %lld is %llu, above 2·qmax = %llu",
                        (long long)(first + j), (unsigned long long)v, (unsigned long long)limit);
            break;
        }
        size_t bit = (size_t)j * (size_t)p->slot_bits, k = bit / 64, o = bit % 64;
        w[k] |= v << o;
        if (o + (size_t)p->slot_bits > 64) w[k + 1] |= v >> (64 - o);
    }
    if (s == TS_OK) mpz_import(m, nw, -1, sizeof *w, 0, 0, w);
    if (w != stack) free(w);
    return s;
}

ts_status ts_fed_unpack_sum(const ts_fed_pack *p, const mpz_t m, int64_t index, int64_t n, int k,
                            double *out) {
    int64_t first = index * p->slots;
    if (p->slots < 1 || index < 0 || first >= n)
        return ts_fail(TS_ERR_INVALID, "fed: plaintext %lld outside %lld values", (long long)index,
                       (long long)n);
    if (k < 1 || k > p->max_clients)
        return ts_fail(TS_ERR_NUMERIC,
                       "fed: a sum of %d updates, but slots have room for %d (fed.max_clients)", k,
                       p->max_clients);
    int count = (int)(n - first < p->slots ? n - first : p->slots);
    size_t used = (size_t)count * (size_t)p->slot_bits;
    if (mpz_sgn(m) < 0 || mpz_sizeinbase(m, 2) > used)
        return ts_fail(TS_ERR_NUMERIC,
                       "fed: plaintext %lld has %zu bits, more than its %d slots of %d bits: "
                       "overflow or a corrupted aggregate",
                       (long long)index, mpz_sizeinbase(m, 2), count, p->slot_bits);
    size_t nw = (used + 63) / 64, got = 0;
    uint64_t stack[128], *w = nw <= 128 ? stack : calloc(nw, sizeof *w);
    if (!w) return ts_fail(TS_ERR_NOMEM, "fed: unpacking");
    memset(w, 0, nw * sizeof *w);
    mpz_export(w, &got, -1, sizeof *w, 0, 0, m);
    uint64_t mask = (UINT64_C(1) << p->slot_bits) - 1;
    ts_status s = TS_OK;
    for (int j = 0; j < count && s == TS_OK; j++) {
        size_t bit = (size_t)j * (size_t)p->slot_bits, q = bit / 64, o = bit % 64;
        uint64_t v = w[q] >> o;
        if (o + (size_t)p->slot_bits > 64) v |= w[q + 1] << (64 - o);
        v &= mask;
        s = ts_fed_decode_sums(p, &v, 1, k, &out[first + j]);
        if (s != TS_OK) ts_error_prefix("plaintext %lld slot %d", (long long)index, j);
    }
    if (w != stack) free(w);
    return s;
}

ts_status ts_fed_decode_sums(const ts_fed_pack *p, const uint64_t *sum, int64_t n, int k,
                             double *out) {
    if (k < 1 || k > p->max_clients)
        return ts_fail(TS_ERR_NUMERIC,
                       "fed: a sum of %d updates, but slots have room for %d (fed.max_clients)", k,
                       p->max_clients);
    uint64_t limit = (uint64_t)(2 * p->qmax) * (uint64_t)k;
    for (int64_t i = 0; i < n; i++) {
        if (sum[i] > limit)
            return ts_fail(TS_ERR_NUMERIC,
                           "fed: sum %lld of %d updates is %llu, above %llu: overflow or a "
                           "corrupted aggregate",
                           (long long)i, k, (unsigned long long)sum[i], (unsigned long long)limit);
        out[i] = (double)((int64_t)sum[i] - (int64_t)k * p->qmax) / p->scale;
    }
    return TS_OK;
}
