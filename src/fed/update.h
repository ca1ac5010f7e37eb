/* update.h — a whole update under Paillier: packed plaintexts encrypted into
 * a flat array of fixed-width ciphertexts, ciphertext arrays multiplied
 * (added) by the aggregator, the aggregate decrypted and decoded by the key
 * holder. Plaintexts are independent, so each step runs in parallel
 * (OpenMP) over them; results do not depend on the number of threads.
 *
 *     size_t w = ts_fed_ct_bytes(pk);                    // 2·bits/8 bytes each
 *     int64_t k = ts_fed_pack_count(&pack, n);           // ciphertexts per update
 *     ts_fed_encrypt_update(pk, &pack, u, n, ct);        // client: ct has k·w bytes
 *     ts_fed_aggregate(pk, acc, ct, k);                  // aggregator: acc ·= ct
 *     ts_fed_decrypt_sum(sk, &pack, acc, n, clients, out); // key holder: out[n] sums
 *
 * A ciphertext is n² as a big-endian number of exactly ts_fed_ct_bytes bytes.
 */
#ifndef TS_FED_UPDATE_H
#define TS_FED_UPDATE_H

#include "fed/pack.h"
#include "fed/paillier.h"

size_t ts_fed_ct_bytes(const ts_paillier_pub *pk);
/* Encrypts the packed encodings u[0..n) (from ts_fed_quantize). With rn_ring
 * (n_ring precomputed r^n, benchmarks only) those are used in turn instead of
 * fresh ones. */
ts_status ts_fed_encrypt_update(ts_paillier_pub *pk, const ts_fed_pack *p, const uint64_t *u,
                                int64_t n, uint8_t *ct, const mpz_t *rn_ring, int n_ring);
/* acc = E(1) (r = 1) for each of `count` ciphertexts: the start of a sum. */
void ts_fed_aggregate_init(const ts_paillier_pub *pk, uint8_t *acc, int64_t count);
/* acc[i] = acc[i] · ct[i] mod n², each ct[i] checked to lie in (0, n²). */
ts_status ts_fed_aggregate(const ts_paillier_pub *pk, uint8_t *acc, const uint8_t *ct,
                           int64_t count);
/* out[0..n) = the decoded sums of k updates held in acc. */
ts_status ts_fed_decrypt_sum(const ts_paillier_priv *sk, const ts_fed_pack *p, const uint8_t *acc,
                             int64_t n, int k, double *out);

#endif
