/* paillier.h — the Paillier cryptosystem on GMP (docs/federated.md).
 *
 * Additively homomorphic: E(a)·E(b) mod n² = E(a + b) and E(a)^k = E(k·a),
 * so an aggregator adds clients' encrypted updates without a secret key.
 * g = n + 1 (so g^m = 1 + m·n mod n²), decryption by the Chinese remainder
 * theorem over p² and q², secret exponents through mpz_powm_sec.
 *
 *     ts_paillier_priv *sk; ts_paillier_pub *pk;
 *     ts_paillier_keygen(2048, &sk);                 // primes from getrandom(2)
 *     ts_paillier_pub_of(sk, &pk);                   // with a DJN base hs: cheap r^n
 *     ts_paillier_pool_start(pk, 64, 1);             // r^n precomputed in a thread
 *     mpz_t m, c; mpz_inits(m, c, NULL);
 *     mpz_set_ui(m, 42);
 *     ts_paillier_encrypt(pk, c, m);                 // c = (1 + m n) r^n mod n²
 *     ts_paillier_add(pk, c, c, c);                  // E(84)
 *     ts_paillier_decrypt(sk, m, c);                 // m = 84
 *     ts_paillier_pub_free(pk); ts_paillier_priv_free(sk);   // also stops the pool
 *
 * Plaintexts are integers in [0, n); ts_paillier_encode_si / decode_si map
 * signed values the way python-paillier does (a negative m is n + m).
 * Keys are read and written as text files (ts_paillier_priv_save/_load);
 * a private key file is written 0600 and refused when group or others can
 * read it. */
#ifndef TS_FED_PAILLIER_H
#define TS_FED_PAILLIER_H

#include <gmp.h>
#include <stdint.h>
#include "core/core.h"

typedef struct ts_paillier_pub ts_paillier_pub;
typedef struct ts_paillier_priv ts_paillier_priv;

/* A fresh key pair with an n of `bits` bits (1024, 2048, 3072 or 4096; 1024
 * is for tests and fixtures only). */
ts_status ts_paillier_keygen(int bits, ts_paillier_priv **out);
/* A private key from its primes (p != q, both probable primes of equal size). */
ts_status ts_paillier_priv_from_pq(const mpz_t p, const mpz_t q, ts_paillier_priv **out);
/* A public key from its modulus, without the DJN base hs: its encryptions
 * compute full r^n (python-paillier's keys are n alone). */
ts_status ts_paillier_pub_from_n(const mpz_t n, ts_paillier_pub **out);
/* The same with the DJN base hs = (-h²)^n mod n², checked (1 < hs < n² - 1,
 * coprime to n, hs² != 1). */
ts_status ts_paillier_pub_from_n_hs(const mpz_t n, const mpz_t hs, ts_paillier_pub **out);
/* The public half of a private key (an independent object) with a fresh DJN
 * base: hs = (-h²)^n mod n² for h uniform in Z*_n from getrandom(2). */
ts_status ts_paillier_pub_of(const ts_paillier_priv *sk, ts_paillier_pub **out);
void ts_paillier_pub_free(ts_paillier_pub *pk);
void ts_paillier_priv_free(ts_paillier_priv *sk);

/* The modulus n and its size in bits (read only). */
const mpz_t *ts_paillier_n(const ts_paillier_pub *pk);
int ts_paillier_bits(const ts_paillier_pub *pk);

/* Precompute r^n mod n² for up to `capacity` encryptions in `threads`
 * background threads (1 to 256), refilled as encryptions take them. An
 * encryption that finds the pool empty computes its own r^n. Stopped by
 * ts_paillier_pool_stop or ts_paillier_pub_free. */
ts_status ts_paillier_pool_start(ts_paillier_pub *pk, int capacity, int threads);
void ts_paillier_pool_stop(ts_paillier_pub *pk);
/* How many encryptions took a precomputed r^n, and how many computed their own. */
void ts_paillier_pool_stats(const ts_paillier_pub *pk, int64_t *hits, int64_t *misses);

/* c = E(m) with fresh randomness; m in [0, n). c may not alias m. */
ts_status ts_paillier_encrypt(ts_paillier_pub *pk, mpz_t c, const mpz_t m);
/* c = E(m) with a given rn = r^n mod n² (from ts_paillier_fresh_rn). For
 * benchmarks and tests: two ciphertexts made with one r^n reveal that they
 * share it, so real encryptions take a fresh one (ts_paillier_encrypt). */
ts_status ts_paillier_encrypt_rn(const ts_paillier_pub *pk, mpz_t c, const mpz_t m, const mpz_t rn);
/* rn = r^n mod n² with fresh randomness (what the pool precomputes): with
 * the key's DJN base hs, hs^a for a uniform a of bits/2 bits through a
 * fixed-base table built on the first call (about 170 products mod n² for
 * 2048 bits); without hs (a key from n alone or a v1 key file), r^n for a
 * uniform r in Z*_n, one full exponentiation (docs/federated.md). */
ts_status ts_paillier_fresh_rn(ts_paillier_pub *pk, mpz_t rn);
/* Whether the key has the DJN base hs (the cheap r^n). */
int ts_paillier_has_hs(const ts_paillier_pub *pk);
/* m = D(c); c must be in [1, n²) and coprime to n. */
ts_status ts_paillier_decrypt(const ts_paillier_priv *sk, mpz_t m, const mpz_t c);
/* out = a · b mod n² (the encryption of the sum); out may alias a or b. */
ts_status ts_paillier_add(const ts_paillier_pub *pk, mpz_t out, const mpz_t a, const mpz_t b);
/* out = c^k mod n² (the encryption of k·m); k in [0, n), public. */
ts_status ts_paillier_mul(const ts_paillier_pub *pk, mpz_t out, const mpz_t c, const mpz_t k);
/* Refresh c's randomness: out = c · r^n mod n² (same plaintext). */
ts_status ts_paillier_rerandomize(ts_paillier_pub *pk, mpz_t out, const mpz_t c);
/* Checks that c is a valid ciphertext (0 < c < n², gcd(c, n) = 1). */
ts_status ts_paillier_check_ciphertext(const ts_paillier_pub *pk, const mpz_t c);

/* Signed plaintexts as python-paillier maps them: v >= 0 is v, v < 0 is n + v.
 * decode_si fails when the value is not within int64 of 0 or n. */
void ts_paillier_encode_si(const ts_paillier_pub *pk, mpz_t m, int64_t v);
ts_status ts_paillier_decode_si(const ts_paillier_pub *pk, const mpz_t m, int64_t *v);

/* Key files (format in docs/federated.md). The private key file holds p and
 * q, is written with mode 0600 and is refused on load when its mode lets
 * group or others read it; the message names the file and its mode. */
ts_status ts_paillier_priv_save(const ts_paillier_priv *sk, const char *path);
ts_status ts_paillier_priv_load(const char *path, ts_paillier_priv **out);
ts_status ts_paillier_pub_save(const ts_paillier_pub *pk, const char *path);
ts_status ts_paillier_pub_load(const char *path, ts_paillier_pub **out);

/* The public key file's text (malloc'd) and a key from such text (what the
 * key holder sends over the network). */
ts_status ts_paillier_pub_to_text(const ts_paillier_pub *pk, char **text);
ts_status ts_paillier_pub_from_text(const char *text, size_t len, ts_paillier_pub **out);

/* Fills buf with n bytes from the OS (getrandom(2), retried on EINTR). */
ts_status ts_fed_os_random(void *buf, size_t n);

#endif
