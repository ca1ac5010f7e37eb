/* paillier_djn.c — the cheap r^n of Damgård, Jurik and Nielsen (docs/federated.md,
 * "Cheap rⁿ"): the key holder publishes hs = (-h²)^n mod n² for a random h
 * in Z*_n; a client's r^n is hs^a = ((-h²)^a)^n mod n² for a uniform a of
 * bits/2 bits, an n-th residue like any r^n, so the ciphertext, decryption
 * and the homomorphic operations are unchanged.
 *
 * hs is a fixed base, so its powers hs^(d·2^(w·i)) are tabulated once per
 * public key and hs^a is one product per w-bit digit of a: for a 2048-bit n,
 * 171 multiplications mod n² against a 2048-bit exponentiation. a is
 * secret (it would reveal the plaintext), so each entry is selected with
 * mpn_sec_tabselect, which reads the whole row whatever the digit. */
#include <sodium.h>
#include <stdlib.h>
#include <string.h>
#include "fed/paillier_internal.h"

/* Digit width: 2^6 entries per row; 5.6 MB of table for a 2048-bit n. */
enum { DJN_W = 6 };

ts_status ts_paillier_check_hs(const mpz_t n, const mpz_t n2, const mpz_t hs, const char *where) {
    mpz_t t;
    mpz_init(t);
    ts_status s = TS_OK;
    mpz_sub_ui(t, n2, 1);
    if (mpz_cmp_ui(hs, 1) <= 0 || mpz_cmp(hs, t) >= 0) {
        s = ts_fail(TS_ERR_FORMAT, "paillier: %s: hs is not in (1, n² - 1)", where);
    } else {
        mpz_gcd(t, hs, n);
        if (mpz_cmp_ui(t, 1) != 0) {
            s = ts_fail(TS_ERR_FORMAT, "paillier: %s: hs shares a factor with n", where);
        } else {
            /* an element of order 2 would make every r^n one of two values */
            mpz_mul(t, hs, hs);
            mpz_mod(t, t, n2);
            if (mpz_cmp_ui(t, 1) == 0)
                s = ts_fail(TS_ERR_FORMAT, "paillier: %s: hs² = 1 mod n² (order 2)", where);
        }
    }
    mpz_clear(t);
    return s;
}

static void put_entry(mp_limb_t *dst, mp_size_t nl, const mpz_t v) {
    size_t k = mpz_size(v);
    memset(dst, 0, (size_t)nl * sizeof *dst);
    memcpy(dst, mpz_limbs_read(v), k * sizeof *dst);
}

static ts_status build_table(const ts_paillier_pub *pk, djn_table **out) {
    djn_table *t = calloc(1, sizeof *t);
    if (!t) return ts_fail(TS_ERR_NOMEM, "paillier: DJN table");
    t->w = DJN_W;
    t->exp_bits = pk->bits / 2;
    t->rows = (t->exp_bits + t->w - 1) / t->w;
    t->nl = (mp_size_t)mpz_size(pk->n2);
    size_t per_row = ((size_t)1 << t->w) * (size_t)t->nl;
    t->tab = malloc((size_t)t->rows * per_row * sizeof *t->tab);
    if (!t->tab) {
        int rows = t->rows;
        free(t);
        return ts_fail(TS_ERR_NOMEM, "paillier: DJN table of %d rows", rows);
    }
    mpz_t base, e, prod;
    mpz_inits(base, e, prod, NULL);
    mpz_set(base, pk->hs);
    for (int i = 0; i < t->rows; i++) {
        mp_limb_t *row = t->tab + (size_t)i * per_row;
        mpz_set_ui(e, 1);
        for (int d = 0; d < (1 << t->w); d++) {
            put_entry(row + (size_t)d * (size_t)t->nl, t->nl, e);
            mpz_mul(prod, e, base);
            mpz_mod(e, prod, pk->n2);
        }
        mpz_set(base, e); /* base^(2^w): the next row's base */
    }
    mpz_clears(base, e, prod, NULL);
    *out = t;
    return TS_OK;
}

void ts_paillier_djn_free(ts_paillier_pub *pk) {
    if (!pk->fb) return;
    free(pk->fb->tab);
    free(pk->fb);
    pk->fb = NULL;
}

/* The table, built on first use. */
static ts_status table_of(ts_paillier_pub *pk, const djn_table **out) {
    *out = NULL;
    if (!pk->has_hs) return ts_fail(TS_ERR_INTERNAL, "paillier: a DJN r^n without hs");
    ts_status s = TS_OK;
    pthread_mutex_lock(&pk->fb_mu);
    if (!pk->fb) s = build_table(pk, &pk->fb);
    *out = pk->fb;
    pthread_mutex_unlock(&pk->fb_mu);
    return s;
}

int ts_paillier_djn_exp_bits(const ts_paillier_pub *pk) {
    return pk->bits / 2;
}

ts_status ts_paillier_djn_pow(ts_paillier_pub *pk, mpz_t rn, const unsigned char *a, size_t len) {
    const djn_table *t;
    ts_status s = table_of(pk, &t);
    if (s != TS_OK || !t) return s != TS_OK ? s : ts_fail(TS_ERR_INTERNAL, "paillier: no table");
    mp_limb_t sel[2 * 4096 / GMP_NUMB_BITS + 2];
    if (len != (size_t)(t->exp_bits + 7) / 8 || (size_t)t->nl > sizeof sel / sizeof *sel)
        return ts_fail(TS_ERR_INTERNAL, "paillier: a DJN exponent of %zu bytes for %d bits", len,
                       t->exp_bits);
    mpz_t view, prod;
    mpz_init(prod);
    size_t per_row = ((size_t)1 << t->w) * (size_t)t->nl;
    for (int i = 0; i < t->rows; i++) {
        /* digit i: bits [w·i, w·i + w) of a */
        unsigned d = 0;
        for (int b = 0; b < t->w; b++) {
            int bit = i * t->w + b;
            if (bit < t->exp_bits) d |= (unsigned)((a[bit / 8] >> (bit % 8)) & 1) << b;
        }
        mpn_sec_tabselect(sel, t->tab + (size_t)i * per_row, t->nl, (mp_size_t)1 << t->w, d);
        if (i == 0) {
            mpz_set(rn, mpz_roinit_n(view, sel, t->nl));
        } else {
            mpz_mul(prod, rn, mpz_roinit_n(view, sel, t->nl));
            mpz_mod(rn, prod, pk->n2);
        }
    }
    sodium_memzero(sel, sizeof sel);
    ts_paillier_mpz_wipe(prod);
    return TS_OK;
}

ts_status ts_paillier_djn_rn(ts_paillier_pub *pk, mpz_t rn) {
    unsigned char a[4096 / 16];
    size_t len = (size_t)(ts_paillier_djn_exp_bits(pk) + 7) / 8;
    if (len > sizeof a)
        return ts_fail(TS_ERR_INTERNAL, "paillier: n of %d bits is too large", pk->bits);
    ts_status s = ts_fed_os_random(a, len);
    if (s == TS_OK) s = ts_paillier_djn_pow(pk, rn, a, len);
    sodium_memzero(a, sizeof a);
    return s;
}
