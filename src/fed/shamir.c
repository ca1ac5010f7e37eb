/* shamir.c — Shamir secret sharing over GF(2^61 - 1) (shamir.h). */
#include <sodium.h>
#include <string.h>
#include "fed/shamir.h"

#define P TS_SHAMIR_P

static uint64_t fadd(uint64_t a, uint64_t b) {
    uint64_t s = a + b; /* < 2^62: no wrap */
    return s >= P ? s - P : s;
}

static uint64_t fsub(uint64_t a, uint64_t b) {
    return a >= b ? a - b : a + P - b;
}

static uint64_t fmul(uint64_t a, uint64_t b) {
    unsigned __int128 r = (unsigned __int128)a * b;
    uint64_t lo = (uint64_t)r & P, hi = (uint64_t)(r >> 61);
    return fadd(lo, hi); /* 2^61 = 1 mod p */
}

static uint64_t fpow(uint64_t a, uint64_t e) {
    uint64_t r = 1;
    while (e) {
        if (e & 1) r = fmul(r, a);
        a = fmul(a, a);
        e >>= 1;
    }
    return r;
}

static uint64_t finv(uint64_t a) {
    return fpow(a, P - 2);
} /* a != 0 */

static uint64_t frandom(void) {
    for (;;) {
        uint64_t v;
        randombytes_buf(&v, sizeof v);
        v &= P; /* 61 bits; P itself is rejected */
        if (v != P) return v;
    }
}

/* 32 bytes as 5 elements of 7 bytes (the last one 4), little endian. */
static void to_field(const uint8_t s[TS_SHAMIR_SECRET], uint64_t e[TS_SHAMIR_K]) {
    for (int i = 0; i < TS_SHAMIR_K; i++) {
        e[i] = 0;
        for (int b = 0; b < 7 && 7 * i + b < TS_SHAMIR_SECRET; b++)
            e[i] |= (uint64_t)s[7 * i + b] << (8 * b);
    }
}

static int from_field(const uint64_t e[TS_SHAMIR_K], uint8_t s[TS_SHAMIR_SECRET]) {
    for (int i = 0; i < TS_SHAMIR_K; i++) {
        int nb = 7 * i + 7 <= TS_SHAMIR_SECRET ? 7 : TS_SHAMIR_SECRET - 7 * i;
        if (e[i] >> (8 * nb)) return 0; /* not an encoding of bytes */
        for (int b = 0; b < nb; b++) s[7 * i + b] = (uint8_t)(e[i] >> (8 * b));
    }
    return 1;
}

ts_status ts_shamir_split(const uint8_t secret[TS_SHAMIR_SECRET], int n, int t,
                          uint64_t (*shares)[TS_SHAMIR_K]) {
    if (t < 2 || t > n || n > 65535)
        return ts_fail(TS_ERR_INVALID,
                       "shamir: threshold %d of %d parties (need 2 <= t <= n <= 65535)", t, n);
    uint64_t e[TS_SHAMIR_K], coef[TS_SHAMIR_K][64];
    if (t > 64) return ts_fail(TS_ERR_INVALID, "shamir: threshold %d above 64", t);
    to_field(secret, e);
    for (int k = 0; k < TS_SHAMIR_K; k++) {
        coef[k][0] = e[k];
        for (int d = 1; d < t; d++) coef[k][d] = frandom();
    }
    for (int i = 0; i < n; i++) {
        uint64_t x = (uint64_t)(i + 1);
        for (int k = 0; k < TS_SHAMIR_K; k++) { /* Horner */
            uint64_t y = 0;
            for (int d = t - 1; d >= 0; d--) y = fadd(fmul(y, x), coef[k][d]);
            shares[i][k] = y;
        }
    }
    sodium_memzero(coef, sizeof coef);
    sodium_memzero(e, sizeof e);
    return TS_OK;
}

/* The polynomial through (xs[j], ys[j][k]), j < t, evaluated at x0. */
static uint64_t lagrange_at(const int *xs, const uint64_t *const *ys, int t, int k, uint64_t x0) {
    uint64_t acc = 0;
    for (int j = 0; j < t; j++) {
        uint64_t num = 1, den = 1, xj = (uint64_t)xs[j];
        for (int l = 0; l < t; l++) {
            if (l == j) continue;
            uint64_t xl = (uint64_t)xs[l];
            num = fmul(num, fsub(x0, xl));
            den = fmul(den, fsub(xj, xl));
        }
        acc = fadd(acc, fmul(ys[j][k], fmul(num, finv(den))));
    }
    return acc;
}

ts_status ts_shamir_combine(const int *xs, const uint64_t *const *ys, int m, int t,
                            uint8_t secret[TS_SHAMIR_SECRET]) {
    if (t < 2 || t > 64) return ts_fail(TS_ERR_INVALID, "shamir: threshold %d not in [2, 64]", t);
    if (m < t) return ts_fail(TS_ERR_INVALID, "shamir: %d shares, %d needed", m, t);
    for (int j = 0; j < m; j++) {
        if (xs[j] < 1 || xs[j] > 65535)
            return ts_fail(TS_ERR_FORMAT, "shamir: party %d out of range", xs[j]);
        for (int l = 0; l < j; l++)
            if (xs[l] == xs[j])
                return ts_fail(TS_ERR_FORMAT, "shamir: two shares of party %d", xs[j]);
        for (int k = 0; k < TS_SHAMIR_K; k++)
            if (ys[j][k] >= P)
                return ts_fail(TS_ERR_FORMAT, "shamir: share of party %d outside the field", xs[j]);
    }
    uint64_t e[TS_SHAMIR_K];
    for (int k = 0; k < TS_SHAMIR_K; k++) e[k] = lagrange_at(xs, ys, t, k, 0);
    /* every share beyond the first t must agree with their polynomial */
    for (int j = t; j < m; j++)
        for (int k = 0; k < TS_SHAMIR_K; k++)
            if (lagrange_at(xs, ys, t, k, (uint64_t)xs[j]) != ys[j][k]) {
                sodium_memzero(e, sizeof e);
                return ts_fail(TS_ERR_FORMAT,
                               "shamir: the share of party %d does not match the others' "
                               "(corrupted or forged)",
                               xs[j]);
            }
    int ok = from_field(e, secret);
    sodium_memzero(e, sizeof e);
    if (!ok)
        return ts_fail(TS_ERR_FORMAT,
                       "shamir: the shares do not combine to a secret (corrupted shares)");
    return TS_OK;
}
