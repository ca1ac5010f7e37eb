/* paillier_internal.h — the key structures, shared by paillier.c (the
 * arithmetic and the r^n pool) and paillier_keys.c (key generation and
 * files). Not for use outside src/fed. */
#ifndef TS_FED_PAILLIER_INTERNAL_H
#define TS_FED_PAILLIER_INTERNAL_H

#include <pthread.h>
#include "fed/paillier.h"

/* The r^n pool: a stack of precomputed values the background thread keeps
 * full; `mu` guards every field below it. */
typedef struct rn_pool {
    pthread_t thread;
    pthread_mutex_t mu;
    pthread_cond_t space; /* signalled when an entry is taken or on stop */
    mpz_t *slot;
    int cap, count, stop;
    int64_t hits, misses;
} rn_pool;

struct ts_paillier_pub {
    mpz_t n, n2;
    int bits;
    rn_pool *pool; /* NULL when no pool runs */
};

struct ts_paillier_priv {
    mpz_t p, q, n, n2, p2, q2, pm1, qm1;
    mpz_t hp, hq;  /* L_p(g^(p-1) mod p²)^-1 mod p, and the same for q */
    mpz_t q_inv_p; /* q^-1 mod p, for the CRT */
    int bits;
};

/* Clears an mpz after overwriting its limbs (for secrets). */
void ts_paillier_mpz_wipe(mpz_t x);

#endif
