/* update.c — encrypting, adding and decrypting whole updates (update.h),
 * parallel over plaintexts. A failure inside the parallel loop keeps the
 * message of the lowest failing plaintext. */
#include <stdio.h>
#include <string.h>
#include "fed/paillier_internal.h"
#include "fed/update.h"

size_t ts_fed_ct_bytes(const ts_paillier_pub *pk) {
    return 2 * (((size_t)pk->bits + 7) / 8);
}

/* The first failure of a parallel loop: its index, status and message. */
typedef struct first_fail {
    int64_t at;
    ts_status s;
    char msg[512];
} first_fail;

static void note_fail(first_fail *f, int64_t i, ts_status s) {
#pragma omp critical(ts_fed_fail)
    if (i < f->at) {
        f->at = i;
        f->s = s;
        snprintf(f->msg, sizeof f->msg, "%s", ts_last_error());
    }
}

static ts_status report(const first_fail *f, const char *what) {
    if (f->s == TS_OK) return TS_OK;
    return ts_fail(f->s, "fed: %s, ciphertext %lld: %s", what, (long long)f->at, f->msg);
}

static void put_ct(const ts_paillier_pub *pk, uint8_t *dst, const mpz_t c) {
    size_t w = ts_fed_ct_bytes(pk), nb = (mpz_sizeinbase(c, 2) + 7) / 8, got = 0;
    memset(dst, 0, w);
    if (mpz_sgn(c) != 0) mpz_export(dst + (w - nb), &got, 1, 1, 1, 0, c);
}

static void get_ct(const ts_paillier_pub *pk, mpz_t c, const uint8_t *src) {
    mpz_import(c, ts_fed_ct_bytes(pk), 1, 1, 1, 0, src);
}

ts_status ts_fed_encrypt_update(ts_paillier_pub *pk, const ts_fed_pack *p, const uint64_t *u,
                                int64_t n, uint8_t *ct, const mpz_t *rn_ring, int n_ring) {
    int64_t count = ts_fed_pack_count(p, n);
    size_t w = ts_fed_ct_bytes(pk);
    first_fail f = {INT64_MAX, TS_OK, ""};
#pragma omp parallel
    {
        mpz_t m, c;
        mpz_inits(m, c, NULL);
#pragma omp for schedule(dynamic, 16)
        for (int64_t i = 0; i < count; i++) {
            ts_status s = ts_fed_pack_plain(p, u, n, i, m);
            if (s == TS_OK)
                s = rn_ring ? ts_paillier_encrypt_rn(pk, c, m, rn_ring[i % n_ring])
                            : ts_paillier_encrypt(pk, c, m);
            if (s == TS_OK)
                put_ct(pk, ct + (size_t)i * w, c);
            else
                note_fail(&f, i, s);
        }
        ts_paillier_mpz_wipe(m);
        mpz_clear(c);
    }
    return report(&f, "encrypting an update");
}

void ts_fed_aggregate_init(const ts_paillier_pub *pk, uint8_t *acc, int64_t count) {
    size_t w = ts_fed_ct_bytes(pk);
    memset(acc, 0, (size_t)count * w);
    for (int64_t i = 0; i < count; i++) acc[(size_t)(i + 1) * w - 1] = 1;
}

ts_status ts_fed_aggregate(const ts_paillier_pub *pk, uint8_t *acc, const uint8_t *ct,
                           int64_t count) {
    size_t w = ts_fed_ct_bytes(pk);
    first_fail f = {INT64_MAX, TS_OK, ""};
#pragma omp parallel
    {
        mpz_t a, c;
        mpz_inits(a, c, NULL);
#pragma omp for schedule(static)
        for (int64_t i = 0; i < count; i++) {
            get_ct(pk, a, acc + (size_t)i * w);
            get_ct(pk, c, ct + (size_t)i * w);
            /* the range only: gcd(c, n) costs more than the product and is
             * checked once, on the aggregate, by the key holder */
            ts_status s = ts_paillier_add(pk, a, a, c);
            if (s == TS_OK)
                put_ct(pk, acc + (size_t)i * w, a);
            else
                note_fail(&f, i, s);
        }
        mpz_clears(a, c, NULL);
    }
    return report(&f, "adding an update");
}

ts_status ts_fed_decrypt_sum(const ts_paillier_priv *sk, const ts_fed_pack *p, const uint8_t *acc,
                             int64_t n, int k, double *out) {
    int64_t count = ts_fed_pack_count(p, n);
    size_t w = 2 * (((size_t)sk->bits + 7) / 8); /* ts_fed_ct_bytes of its public key */
    first_fail f = {INT64_MAX, TS_OK, ""};
#pragma omp parallel
    {
        mpz_t c, m;
        mpz_inits(c, m, NULL);
        /* one scratch per thread: nothing is allocated per ciphertext */
        ts_paillier_dec_scratch *ws = NULL;
        ts_status sw = ts_paillier_dec_scratch_new(sk->crt, &ws);
#pragma omp for schedule(dynamic, 4)
        for (int64_t i = 0; i < count; i++) {
            if (!ws) { /* this thread's ciphertexts fail, naming the first */
                note_fail(&f, i, sw);
                continue;
            }
            mpz_import(c, w, 1, 1, 1, 0, acc + (size_t)i * w);
            ts_status s = ts_paillier_decrypt_with(sk, ws, m, c);
            if (s == TS_OK) s = ts_fed_unpack_sum(p, m, i, n, k, out);
            if (s != TS_OK) note_fail(&f, i, s);
        }
        ts_paillier_dec_scratch_free(ws);
        mpz_clear(c);
        ts_paillier_mpz_wipe(m);
    }
    return report(&f, "decrypting the aggregate");
}
