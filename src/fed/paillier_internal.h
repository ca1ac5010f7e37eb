/* paillier_internal.h — the key structures, shared by paillier.c (the
 * arithmetic and the r^n pool) and paillier_keys.c (key generation and
 * files). Not for use outside src/fed. */
#ifndef TS_FED_PAILLIER_INTERNAL_H
#define TS_FED_PAILLIER_INTERNAL_H

#include <pthread.h>
#include "fed/paillier.h"

/* The r^n pool: a stack of precomputed values the background threads keep
 * full; `mu` guards every field below it. */
typedef struct rn_pool {
    pthread_t *thread;
    int n_threads; /* started */
    pthread_mutex_t mu;
    pthread_cond_t space; /* signalled when an entry is taken or on stop */
    mpz_t *slot;
    int cap, count, stop;
    int busy; /* entries the threads are computing now */
    int64_t hits, misses;
} rn_pool;

/* The fixed-base table of the DJN r^n (paillier_djn.c): row i holds
 * hs^(d·2^(w·i)) mod n² for every digit d in [0, 2^w), each entry `nl`
 * limbs zero-padded, so a secret digit selects its entry in constant time
 * (mpn_sec_tabselect). */
typedef struct djn_table {
    mp_limb_t *tab;
    int rows, w, exp_bits;
    mp_size_t nl;
} djn_table;

struct ts_paillier_pub {
    mpz_t n, n2;
    int bits;
    int has_hs;            /* hs below is set: r^n = hs^a with a short a (DJN) */
    mpz_t hs;              /* (-h²)^n mod n² for a random h in Z*_n, public */
    pthread_mutex_t fb_mu; /* guards fb: built on the first r^n */
    djn_table *fb;
    rn_pool *pool; /* NULL when no pool runs */
};

/* The CRT decryption's exponentiations (paillier_crt.c): p², q², p - 1,
 * q - 1 and the Montgomery contexts of p² and q² in OpenSSL's form, made
 * once per key; a decryption scratch holds what one thread needs. */
typedef struct ts_paillier_crt ts_paillier_crt;
typedef struct ts_paillier_dec_scratch ts_paillier_dec_scratch;

struct ts_paillier_priv {
    mpz_t p, q, n, n2, p2, q2, pm1, qm1;
    mpz_t hp, hq;  /* L_p(g^(p-1) mod p²)^-1 mod p, and the same for q */
    mpz_t q_inv_p; /* q^-1 mod p, for the CRT */
    ts_paillier_crt *crt;
    int bits;
};

/* Clears an mpz after overwriting its limbs (for secrets). */
void ts_paillier_mpz_wipe(mpz_t x);

/* r uniform in Z*_n (getrandom(2), 64 extra bits reduced mod n). */
ts_status ts_paillier_random_unit(const mpz_t n, int bits, mpz_t r);
/* r^n mod n² the classic way: r uniform in Z*_n, one full exponentiation. */
ts_status ts_paillier_full_rn(const ts_paillier_pub *pk, mpz_t rn);
/* r^n = hs^a mod n² for a uniform a of exp_bits = bits/2 bits, through the
 * fixed-base table (built on the first call, under fb_mu). pk must have hs. */
ts_status ts_paillier_djn_rn(ts_paillier_pub *pk, mpz_t rn);
/* rn = hs^a mod n² through the table for a given exponent: a is
 * (exp_bits + 7) / 8 little-endian bytes (what djn_rn draws; for tests). */
int ts_paillier_djn_exp_bits(const ts_paillier_pub *pk);
ts_status ts_paillier_djn_pow(ts_paillier_pub *pk, mpz_t rn, const unsigned char *a, size_t len);
void ts_paillier_djn_free(ts_paillier_pub *pk);
/* Checks a DJN base against n: 1 < hs < n² - 1, gcd(hs, n) = 1, hs² != 1;
 * the message names `where`. */
ts_status ts_paillier_check_hs(const mpz_t n, const mpz_t n2, const mpz_t hs, const char *where);

/* The exponentiation tables of a key: which = 0 raises to p - 1 mod p²,
 * 1 to q - 1 mod q² (pass the same numbers twice for one modulus). */
ts_status ts_paillier_crt_init(const mpz_t p2, const mpz_t q2, const mpz_t pm1, const mpz_t qm1,
                               ts_paillier_crt **out);
void ts_paillier_crt_free(ts_paillier_crt *crt);
/* One thread's scratch for crt_pow and decrypt_with; not shared between
 * threads running at the same time. */
ts_status ts_paillier_dec_scratch_new(const ts_paillier_crt *crt, ts_paillier_dec_scratch **out);
void ts_paillier_dec_scratch_free(ts_paillier_dec_scratch *w);
/* out = base^(p-1) mod p² (which = 0) or base^(q-1) mod q² (1), in constant
 * time in the exponent; base must be reduced (0 <= base < p² or q²). */
ts_status ts_paillier_crt_pow(const ts_paillier_crt *crt, ts_paillier_dec_scratch *w, int which,
                              mpz_t out, const mpz_t base);
/* ts_paillier_decrypt with a scratch the caller keeps (one per thread). */
ts_status ts_paillier_decrypt_with(const ts_paillier_priv *sk, ts_paillier_dec_scratch *w, mpz_t m,
                                   const mpz_t c);

#endif
