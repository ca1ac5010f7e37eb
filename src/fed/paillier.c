/* paillier.c — Paillier encryption, CRT decryption, the homomorphic
 * operations and the background pool of precomputed r^n. Key generation
 * and key files are paillier_keys.c, the cheap (DJN) r^n paillier_djn.c. */
#include <errno.h>
#include <limits.h>
#include <sodium.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include "fed/paillier_internal.h"

ts_status ts_fed_os_random(void *buf, size_t n) {
    unsigned char *b = buf;
    while (n > 0) {
        ssize_t k = getrandom(b, n, 0);
        if (k < 0) {
            if (errno == EINTR) continue;
            return ts_fail(TS_ERR_IO, "fed: getrandom: %s", strerror(errno));
        }
        b += k;
        n -= (size_t)k;
    }
    return TS_OK;
}

void ts_paillier_mpz_wipe(mpz_t x) {
    size_t k = mpz_size(x);
    if (k > 0) sodium_memzero(mpz_limbs_modify(x, (mp_size_t)k), k * sizeof(mp_limb_t));
    mpz_clear(x);
}

const mpz_t *ts_paillier_n(const ts_paillier_pub *pk) {
    return &pk->n;
}
int ts_paillier_bits(const ts_paillier_pub *pk) {
    return pk->bits;
}

ts_status ts_paillier_random_unit(const mpz_t n, int bits, mpz_t r) {
    /* 64 bits more than n, reduced mod n: the bias is below 2^-64. */
    size_t nb = (size_t)(bits + 7) / 8 + 8;
    unsigned char buf[4096 / 8 + 8 + 64];
    if (nb > sizeof buf)
        return ts_fail(TS_ERR_INTERNAL, "paillier: n of %d bits is too large", bits);
    mpz_t g;
    mpz_init(g);
    ts_status s = TS_OK;
    for (int tries = 0;; tries++) {
        if ((s = ts_fed_os_random(buf, nb)) != TS_OK) break;
        mpz_import(r, nb, 1, 1, 0, 0, buf);
        mpz_mod(r, r, n);
        mpz_gcd(g, r, n);
        if (mpz_sgn(r) != 0 && mpz_cmp_ui(g, 1) == 0) break;
        if (tries > 64) {
            s = ts_fail(TS_ERR_INTERNAL, "paillier: no random unit mod n after 64 tries");
            break;
        }
    }
    sodium_memzero(buf, sizeof buf);
    mpz_clear(g);
    return s;
}

ts_status ts_paillier_full_rn(const ts_paillier_pub *pk, mpz_t rn) {
    mpz_t r;
    mpz_init(r);
    ts_status s = ts_paillier_random_unit(pk->n, pk->bits, r);
    if (s == TS_OK) mpz_powm(rn, r, pk->n, pk->n2); /* the exponent n is public */
    ts_paillier_mpz_wipe(r);
    return s;
}

ts_status ts_paillier_fresh_rn(ts_paillier_pub *pk, mpz_t rn) {
    return pk->has_hs ? ts_paillier_djn_rn(pk, rn) : ts_paillier_full_rn(pk, rn);
}

int ts_paillier_has_hs(const ts_paillier_pub *pk) {
    return pk->has_hs;
}

/* ---- the r^n pool ---- */

static void *pool_main(void *arg) {
    ts_paillier_pub *pk = arg;
    rn_pool *pl = pk->pool;
    mpz_t v;
    mpz_init(v);
    for (;;) {
        pthread_mutex_lock(&pl->mu);
        /* entries being computed count as taken, so threads never compute
         * more than the pool has room for */
        while (!pl->stop && pl->count + pl->busy >= pl->cap) pthread_cond_wait(&pl->space, &pl->mu);
        int stop = pl->stop;
        if (!stop) pl->busy++;
        pthread_mutex_unlock(&pl->mu);
        if (stop) break;
        /* On a failure the thread ends; encryptions then compute their own
         * r^n and report the failure themselves. */
        ts_status s = ts_paillier_fresh_rn(pk, v);
        pthread_mutex_lock(&pl->mu);
        pl->busy--;
        if (s == TS_OK && !pl->stop && pl->count < pl->cap) mpz_swap(pl->slot[pl->count++], v);
        pthread_mutex_unlock(&pl->mu);
        if (s != TS_OK) break;
    }
    ts_paillier_mpz_wipe(v);
    return NULL;
}

ts_status ts_paillier_pool_start(ts_paillier_pub *pk, int capacity, int threads) {
    if (pk->pool) return ts_fail(TS_ERR_INVALID, "paillier: the r^n pool already runs");
    if (capacity < 1 || capacity > (1 << 20))
        return ts_fail(TS_ERR_INVALID, "paillier: pool capacity %d not in [1, 2^20]", capacity);
    if (threads < 1 || threads > 256)
        return ts_fail(TS_ERR_INVALID, "paillier: %d pool threads not in [1, 256]", threads);
    rn_pool *pl = calloc(1, sizeof *pl);
    if (!pl) return ts_fail(TS_ERR_NOMEM, "paillier: pool");
    pl->slot = calloc((size_t)capacity, sizeof *pl->slot);
    pl->thread = calloc((size_t)threads, sizeof *pl->thread);
    if (!pl->slot || !pl->thread) {
        free(pl->slot);
        free(pl->thread);
        free(pl);
        return ts_fail(TS_ERR_NOMEM, "paillier: pool of %d entries", capacity);
    }
    for (int i = 0; i < capacity; i++) mpz_init(pl->slot[i]);
    pl->cap = capacity;
    pthread_mutex_init(&pl->mu, NULL);
    pthread_cond_init(&pl->space, NULL);
    pk->pool = pl;
    for (int t = 0; t < threads; t++) {
        int e = pthread_create(&pl->thread[t], NULL, pool_main, pk);
        if (e != 0) {
            ts_paillier_pool_stop(pk); /* joins the threads already started */
            return ts_fail(TS_ERR_INTERNAL, "paillier: cannot start pool thread %d of %d: %s",
                           t + 1, threads, strerror(e));
        }
        pl->n_threads++;
    }
    return TS_OK;
}

void ts_paillier_pool_stop(ts_paillier_pub *pk) {
    rn_pool *pl = pk ? pk->pool : NULL;
    if (!pl) return;
    pthread_mutex_lock(&pl->mu);
    pl->stop = 1;
    pthread_cond_broadcast(&pl->space);
    pthread_mutex_unlock(&pl->mu);
    for (int t = 0; t < pl->n_threads; t++) pthread_join(pl->thread[t], NULL);
    free(pl->thread);
    pthread_mutex_destroy(&pl->mu);
    pthread_cond_destroy(&pl->space);
    for (int i = 0; i < pl->cap; i++) ts_paillier_mpz_wipe(pl->slot[i]);
    free(pl->slot);
    free(pl);
    pk->pool = NULL;
}

void ts_paillier_pool_stats(const ts_paillier_pub *pk, int64_t *hits, int64_t *misses) {
    rn_pool *pl = pk->pool;
    *hits = *misses = 0;
    if (!pl) return;
    pthread_mutex_lock(&pl->mu);
    *hits = pl->hits;
    *misses = pl->misses;
    pthread_mutex_unlock(&pl->mu);
}

/* r^n from the pool when it has one, else computed here. */
static ts_status take_rn(ts_paillier_pub *pk, mpz_t rn) {
    rn_pool *pl = pk->pool;
    if (pl) {
        int got = 0;
        pthread_mutex_lock(&pl->mu);
        if (pl->count > 0) {
            mpz_swap(rn, pl->slot[--pl->count]);
            pl->hits++;
            got = 1;
            pthread_cond_signal(&pl->space);
        } else {
            pl->misses++;
        }
        pthread_mutex_unlock(&pl->mu);
        if (got) return TS_OK;
    }
    return ts_paillier_fresh_rn(pk, rn);
}

/* ---- encryption, decryption, homomorphic operations ---- */

ts_status ts_paillier_encrypt_rn(const ts_paillier_pub *pk, mpz_t c, const mpz_t m,
                                 const mpz_t rn) {
    if (mpz_sgn(m) < 0 || mpz_cmp(m, pk->n) >= 0)
        return ts_fail(TS_ERR_INVALID, "paillier: plaintext not in [0, n) (n has %d bits)",
                       pk->bits);
    /* g^m = (1 + n)^m = 1 + m n mod n² */
    mpz_mul(c, m, pk->n);
    mpz_add_ui(c, c, 1);
    mpz_mul(c, c, rn);
    mpz_mod(c, c, pk->n2);
    return TS_OK;
}

ts_status ts_paillier_encrypt(ts_paillier_pub *pk, mpz_t c, const mpz_t m) {
    if (mpz_sgn(m) < 0 || mpz_cmp(m, pk->n) >= 0)
        return ts_fail(TS_ERR_INVALID, "paillier: plaintext not in [0, n) (n has %d bits)",
                       pk->bits);
    mpz_t rn;
    mpz_init(rn);
    ts_status s = take_rn(pk, rn);
    if (s == TS_OK) s = ts_paillier_encrypt_rn(pk, c, m, rn);
    ts_paillier_mpz_wipe(rn);
    return s;
}

ts_status ts_paillier_rerandomize(ts_paillier_pub *pk, mpz_t out, const mpz_t c) {
    ts_status s = ts_paillier_check_ciphertext(pk, c);
    if (s != TS_OK) return s;
    mpz_t rn;
    mpz_init(rn);
    if ((s = take_rn(pk, rn)) == TS_OK) {
        mpz_mul(out, c, rn);
        mpz_mod(out, out, pk->n2);
    }
    ts_paillier_mpz_wipe(rn);
    return s;
}

ts_status ts_paillier_check_ciphertext(const ts_paillier_pub *pk, const mpz_t c) {
    if (mpz_sgn(c) <= 0 || mpz_cmp(c, pk->n2) >= 0)
        return ts_fail(TS_ERR_FORMAT, "paillier: ciphertext not in (0, n²)");
    mpz_t g;
    mpz_init(g);
    mpz_gcd(g, c, pk->n);
    int unit = mpz_cmp_ui(g, 1) == 0;
    mpz_clear(g);
    if (!unit) return ts_fail(TS_ERR_FORMAT, "paillier: ciphertext shares a factor with n");
    return TS_OK;
}

/* L_p(c^(p-1) mod p²) · h mod p: one half of the CRT decryption (which = 0
 * for p, 1 for q). */
static ts_status decrypt_half(const ts_paillier_priv *sk, ts_paillier_dec_scratch *w, int which,
                              mpz_t out, const mpz_t c) {
    const mpz_t *pr = which ? &sk->q : &sk->p, *pr2 = which ? &sk->q2 : &sk->p2;
    mpz_mod(out, c, *pr2);
    ts_status s = ts_paillier_crt_pow(sk->crt, w, which, out, out); /* p - 1 is secret */
    if (s != TS_OK) return s;
    mpz_sub_ui(out, out, 1);
    mpz_divexact(out, out, *pr);
    mpz_mul(out, out, which ? sk->hq : sk->hp);
    mpz_mod(out, out, *pr);
    return TS_OK;
}

ts_status ts_paillier_decrypt_with(const ts_paillier_priv *sk, ts_paillier_dec_scratch *w, mpz_t m,
                                   const mpz_t c) {
    if (mpz_sgn(c) <= 0 || mpz_cmp(c, sk->n2) >= 0)
        return ts_fail(TS_ERR_FORMAT, "paillier: ciphertext not in (0, n²)");
    mpz_t mp, mq, g;
    mpz_inits(mp, mq, g, NULL);
    mpz_gcd(g, c, sk->n);
    ts_status s = TS_OK;
    if (mpz_cmp_ui(g, 1) != 0)
        s = ts_fail(TS_ERR_FORMAT, "paillier: ciphertext shares a factor with n");
    if (s == TS_OK) s = decrypt_half(sk, w, 0, mp, c);
    if (s == TS_OK) s = decrypt_half(sk, w, 1, mq, c);
    if (s == TS_OK) {
        /* m = mq + ((mp - mq) q^-1 mod p) q */
        mpz_sub(mp, mp, mq);
        mpz_mul(mp, mp, sk->q_inv_p);
        mpz_mod(mp, mp, sk->p);
        mpz_mul(mp, mp, sk->q);
        mpz_add(m, mq, mp);
    }
    ts_paillier_mpz_wipe(mp);
    ts_paillier_mpz_wipe(mq);
    mpz_clear(g);
    return s;
}

ts_status ts_paillier_decrypt(const ts_paillier_priv *sk, mpz_t m, const mpz_t c) {
    ts_paillier_dec_scratch *w;
    ts_status s = ts_paillier_dec_scratch_new(sk->crt, &w);
    if (s == TS_OK) s = ts_paillier_decrypt_with(sk, w, m, c);
    ts_paillier_dec_scratch_free(w);
    return s;
}

ts_status ts_paillier_add(const ts_paillier_pub *pk, mpz_t out, const mpz_t a, const mpz_t b) {
    if (mpz_sgn(a) <= 0 || mpz_cmp(a, pk->n2) >= 0 || mpz_sgn(b) <= 0 || mpz_cmp(b, pk->n2) >= 0)
        return ts_fail(TS_ERR_FORMAT, "paillier: add: ciphertext not in (0, n²)");
    mpz_mul(out, a, b);
    mpz_mod(out, out, pk->n2);
    return TS_OK;
}

ts_status ts_paillier_mul(const ts_paillier_pub *pk, mpz_t out, const mpz_t c, const mpz_t k) {
    if (mpz_sgn(k) < 0 || mpz_cmp(k, pk->n) >= 0)
        return ts_fail(TS_ERR_INVALID, "paillier: scalar not in [0, n)");
    if (mpz_sgn(c) <= 0 || mpz_cmp(c, pk->n2) >= 0)
        return ts_fail(TS_ERR_FORMAT, "paillier: mul: ciphertext not in (0, n²)");
    mpz_powm(out, c, k, pk->n2); /* the scalar is public */
    return TS_OK;
}

void ts_paillier_encode_si(const ts_paillier_pub *pk, mpz_t m, int64_t v) {
    if (v >= 0) {
        mpz_set_ui(m, (unsigned long)v);
    } else {
        /* n - |v|, with |INT64_MIN| done in unsigned arithmetic */
        mpz_set_ui(m, (unsigned long)(0 - (uint64_t)v));
        mpz_sub(m, pk->n, m);
    }
}

ts_status ts_paillier_decode_si(const ts_paillier_pub *pk, const mpz_t m, int64_t *v) {
    if (mpz_sgn(m) < 0 || mpz_cmp(m, pk->n) >= 0)
        return ts_fail(TS_ERR_INVALID, "paillier: plaintext not in [0, n)");
    if (mpz_sizeinbase(m, 2) <= 63) {
        *v = (int64_t)mpz_get_ui(m);
        return TS_OK;
    }
    mpz_t d;
    mpz_init(d);
    mpz_sub(d, pk->n, m); /* the magnitude of a negative value */
    ts_status s = TS_OK;
    if (mpz_sizeinbase(d, 2) <= 63) {
        *v = -(int64_t)mpz_get_ui(d);
    } else if (mpz_sizeinbase(d, 2) == 64 && mpz_scan1(d, 0) == 63) {
        *v = INT64_MIN;
    } else {
        s = ts_fail(TS_ERR_NUMERIC, "paillier: plaintext of %zu bits does not fit int64 (overflow)",
                    mpz_sizeinbase(m, 2));
    }
    mpz_clear(d);
    return s;
}
