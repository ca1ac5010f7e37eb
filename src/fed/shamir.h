/* shamir.h — t-of-n Shamir secret sharing over GF(p), p = 2^61 - 1 (a
 * Mersenne prime, so products fit in 128 bits and reduce with shifts).
 * A 32-byte secret (a seed or an X25519 secret key) is cut into 5 field
 * elements of 7 bytes each, and each element gets its own random polynomial
 * of degree t - 1; the share of party x (1..n) is the 5 values at x.
 *
 *     uint64_t sh[N][TS_SHAMIR_K];
 *     ts_shamir_split(secret32, n, t, sh);              // sh[i] is party i+1's share
 *     int xs[] = {1, 3, 4}; const uint64_t *ys[] = {sh[0], sh[2], sh[3]};
 *     ts_shamir_combine(xs, ys, 3, t, back32);          // any t shares; extra ones checked
 */
#ifndef TS_FED_SHAMIR_H
#define TS_FED_SHAMIR_H

#include <stdint.h>
#include "core/core.h"

#define TS_SHAMIR_K      5 /* field elements per 32-byte secret */
#define TS_SHAMIR_SECRET 32
#define TS_SHAMIR_P      ((UINT64_C(1) << 61) - 1)

/* shares[i] = the share of party i + 1; 2 <= t <= n <= 65535. */
ts_status ts_shamir_split(const uint8_t secret[TS_SHAMIR_SECRET], int n, int t,
                          uint64_t (*shares)[TS_SHAMIR_K]);
/* The secret from m >= t shares of parties xs[0..m) (distinct, 1..65535):
 * interpolated from the first t, and every further share must lie on the
 * same polynomials (else TS_ERR_FORMAT naming the party: a corrupted or
 * forged share). A value outside the field is refused the same way. */
ts_status ts_shamir_combine(const int *xs, const uint64_t *const *ys, int m, int t,
                            uint8_t secret[TS_SHAMIR_SECRET]);

#endif
