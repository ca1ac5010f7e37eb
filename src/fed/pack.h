/* pack.h — fixed-point encoding of a float update and packing of many
 * values per Paillier plaintext (docs/federated.md, "Packing").
 *
 * A value x is clipped to [-clip, clip] and encoded as
 *     u = round(x · scale) + qmax,   qmax = round(clip · scale),
 * an integer in [0, 2·qmax]. A sum of k ≤ max_clients encodings lies in
 * [0, 2·qmax·k], so a slot of slot_bits = bits(2·qmax·max_clients) never
 * overflows, and the sum decodes as (Σu − k·qmax) / scale. Error bound:
 * each encoding rounds by at most 0.5/scale, so a decoded sum of k values
 * differs from the sum of the clipped inputs by at most k·0.5/scale (plus
 * double rounding of x·scale, relative 2^-53). A slot above 2·qmax·k when
 * decoded, or bits above the last slot, is reported as an overflow
 * (TS_ERR_NUMERIC), never wrapped.
 *
 *     ts_fed_pack pk;
 *     ts_fed_pack_init(&pk, 1 << 20, 1.0, 16, 2048);  // scale, clip, clients, n bits
 *     ts_fed_quantize(&pk, x, n, u, &clipped);          // u: n uint64
 *     for (i = 0; i < ts_fed_pack_count(&pk, n); i++)
 *         ts_fed_pack_plain(&pk, u, n, i, m);           // plaintext i: slots i·slots ...
 *     ...                                               // encrypt, add k clients, decrypt
 *     ts_fed_unpack_sum(&pk, m, i, n, k, out);          // out: the decoded sums (double)
 */
#ifndef TS_FED_PACK_H
#define TS_FED_PACK_H

#include <gmp.h>
#include <stdint.h>
#include "core/core.h"

typedef struct ts_fed_pack {
    double scale, clip;
    int max_clients;
    int64_t qmax;  /* round(clip · scale) */
    int slot_bits; /* bits of 2·qmax·max_clients */
    int slots;     /* slots per plaintext: (n_bits - 1) / slot_bits */
} ts_fed_pack;

/* Checks the parameters: scale > 0, clip > 0, qmax >= 1, 1 <= max_clients,
 * slot_bits <= 62 and at least one slot in a plaintext of n_bits - 1 bits
 * (n_bits 0: no plaintext, only quantising, as the masking mode does). */
ts_status ts_fed_pack_init(ts_fed_pack *p, double scale, double clip, int max_clients, int n_bits);
/* Plaintexts needed for n values. */
int64_t ts_fed_pack_count(const ts_fed_pack *p, int64_t n);
/* The largest error of a decoded sum of k values (k · 0.5 / scale). */
double ts_fed_pack_bound(const ts_fed_pack *p, int k);

/* u[i] = encoding of x[i] (times weight, which must be in [0, 1]: FedAvg's
 * n_i / N); *clipped counts values beyond ±clip. A NaN or infinity is an
 * error naming its index. */
ts_status ts_fed_quantize(const ts_fed_pack *p, const float *x, int64_t n, double weight,
                          uint64_t *u, int64_t *clipped);
/* m = slots [index·slots, index·slots + slots) of u (fewer in the last one). */
ts_status ts_fed_pack_plain(const ts_fed_pack *p, const uint64_t *u, int64_t n, int64_t index,
                            mpz_t m);
/* Decodes plaintext `index` holding the sum of k encodings into out[index·slots ...]. */
ts_status ts_fed_unpack_sum(const ts_fed_pack *p, const mpz_t m, int64_t index, int64_t n, int k,
                            double *out);
/* Decodes sums of k encodings held in plain integers (the masking mode). */
ts_status ts_fed_decode_sums(const ts_fed_pack *p, const uint64_t *sum, int64_t n, int k,
                             double *out);

#endif
