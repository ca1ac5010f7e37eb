/* mask.h — secure aggregation by masking (Bonawitz et al., CCS'17, the
 * semi-honest protocol; docs/federated.md, "Masking"). The server learns
 * the sum of the clients' vectors (uint32 lanes, sums mod 2^32), never one
 * client's vector, and the round completes when clients drop out, as long
 * as t of them answer the unmasking step.
 *
 * Clients are numbered 1..n. One round, with the messages the server relays:
 *
 *   0 keys     each client: ts_mask_client_new; ts_mask_client_keys -> server
 *              -> everyone (two X25519 public keys per client)
 *   1 shares   each client: ts_mask_client_share(all keys) -> n boxes, box v
 *              for client v (its t-of-n Shamir shares of its self-mask seed b
 *              and of its mask secret key, sealed with crypto_box); the
 *              server forwards them: ts_mask_client_accept(from, box).
 *              U2 = the clients whose boxes arrived.
 *   2 masked   each client in U2: y = x + PRG(b) + Σ_{v>u} PRG(s_uv)
 *              - Σ_{v<u} PRG(s_uv) (s_uv from X25519, PRG = ChaCha20):
 *              ts_mask_client_mask -> server: ts_mask_server_add.
 *              U3 = the clients whose y arrived.
 *   3 unmask   each client still there: ts_mask_client_unmask(U2, U3) ->
 *              for u in U3 its share of b_u, for u in U2 \ U3 its share of
 *              u's mask key (never both for one u) -> ts_mask_server_shares.
 *   finish     ts_mask_server_finish: with shares from >= t clients,
 *              removes the self-masks of U3 and the pairwise masks between
 *              U3 and the dropped clients; fewer than t -> a clear error.
 *
 * Sets of clients are byte arrays of n + 1 flags indexed by id (0 unused).
 */
#ifndef TS_FED_MASK_H
#define TS_FED_MASK_H

#include <stdint.h>
#include "core/core.h"
#include "fed/shamir.h"

#define TS_MASK_KEYBYTES 32
/* A sealed share box: nonce, MAC and (from, to, round, two shares). */
#define TS_MASK_BOX_PLAIN (4 + 4 + 8 + 2 * 8 * TS_SHAMIR_K)
#define TS_MASK_BOX       (24 + 16 + TS_MASK_BOX_PLAIN)

typedef struct ts_mask_keys {
    uint8_t box_pk[TS_MASK_KEYBYTES];  /* seals the share boxes */
    uint8_t mask_pk[TS_MASK_KEYBYTES]; /* agrees the pairwise mask seeds */
} ts_mask_keys;

/* What a client answers in step 3 about client u. */
typedef struct ts_mask_share {
    uint8_t kind; /* 0 none, 1 a share of b_u (u sent y), 2 a share of u's mask key (u dropped) */
    uint64_t y[TS_SHAMIR_K];
} ts_mask_share;

typedef struct ts_mask_client ts_mask_client;
typedef struct ts_mask_server ts_mask_server;

/* Client `id` of n (1..n) in round `round`, threshold t (2 <= t <= n). */
ts_status ts_mask_client_new(int id, int n, int t, uint64_t round, ts_mask_client **out);
void ts_mask_client_free(ts_mask_client *c);
void ts_mask_client_keys(const ts_mask_client *c, ts_mask_keys *k);
/* Step 1: boxes (n · TS_MASK_BOX bytes; box v - 1 for client v, its own
 * left zero) for the clients present in `u1`, whose keys are keys[1..n]. */
ts_status ts_mask_client_share(ts_mask_client *c, const ts_mask_keys *keys, const uint8_t *u1,
                               uint8_t *boxes);
/* Step 1, receiving: the box client `from` sealed for this client. */
ts_status ts_mask_client_accept(ts_mask_client *c, int from, const uint8_t *box);
/* Step 2: y = x + masks over `len` lanes, with partners u2 (must include this client). */
ts_status ts_mask_client_mask(const ts_mask_client *c, const uint8_t *u2, const uint32_t *x,
                              int64_t len, uint32_t *y);
/* Step 3: out[1..n] (out[0] unused). u3 must be a subset of u2 with at least t members. */
ts_status ts_mask_client_unmask(const ts_mask_client *c, const uint8_t *u2, const uint8_t *u3,
                                ts_mask_share *out);

ts_status ts_mask_server_new(int n, int t, uint64_t round, int64_t len, ts_mask_server **out);
void ts_mask_server_free(ts_mask_server *s);
/* Step 0: client id's public keys. */
ts_status ts_mask_server_keys(ts_mask_server *s, int id, const ts_mask_keys *k);
/* Step 2: adds client id's masked vector (once per client). */
ts_status ts_mask_server_add(ts_mask_server *s, int id, const uint32_t *y);
/* Step 3: client id's answers (out of ts_mask_client_unmask). */
ts_status ts_mask_server_shares(ts_mask_server *s, int id, const ts_mask_share *shares);
/* The sum of the U3 clients' x (len lanes) and how many they are; u2 as
 * announced in step 2. Fails with fewer than t answers in step 3. */
ts_status ts_mask_server_finish(ts_mask_server *s, const uint8_t *u2, uint32_t *sum, int *n_summed);

/* The PRG: len uint32 lanes of ChaCha20 keyed by seed, nonce = round. */
void ts_mask_prg_add(const uint8_t seed[32], uint64_t round, int sign, uint32_t *v, int64_t len);

#endif
