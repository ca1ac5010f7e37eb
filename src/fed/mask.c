/* mask.c — secure aggregation by pairwise and self masks (mask.h has the
 * protocol). Pairwise seeds: X25519 (crypto_scalarmult) hashed with both
 * public keys in id order; masks: ChaCha20 keystreams (crypto_stream_chacha20)
 * as uint32 lanes; share boxes: crypto_box (X25519 + XSalsa20-Poly1305). */
#include <sodium.h>
#include <stdlib.h>
#include <string.h>
#include "fed/mask.h"
#include "fed/wire.h"

#define MAX_CLIENTS 256

struct ts_mask_client {
    int id, n, t;
    uint64_t round;
    uint8_t box_pk[32], box_sk[32], mask_pk[32], mask_sk[32], b[32];
    ts_mask_keys *keys; /* [n + 1], from step 1 */
    uint8_t *have;      /* [n + 1]: a share box from client v arrived */
    uint64_t (*b_share)[TS_SHAMIR_K], (*s_share)[TS_SHAMIR_K]; /* [n + 1]: shares of v's secrets */
};

struct ts_mask_server {
    int n, t;
    uint64_t round;
    int64_t len;
    ts_mask_keys *keys;
    uint8_t *has_keys, *u3, *answered;
    uint32_t *sum;
    ts_mask_share *shares; /* [(n + 1) · (n + 1)]: shares[from · (n + 1) + u] */
};

void ts_mask_prg_add(const uint8_t seed[32], uint64_t round, int sign, uint32_t *v, int64_t len) {
    enum { LANES = 4096 }; /* 16 KiB = 256 ChaCha20 blocks per call */
    uint8_t nonce[crypto_stream_chacha20_NONCEBYTES], buf[LANES * 4];
    put_u64(nonce, round);
    uint64_t block = 0;
    for (int64_t i = 0; i < len; i += LANES) {
        int64_t m = len - i < LANES ? len - i : LANES;
        memset(buf, 0, sizeof buf);
        crypto_stream_chacha20_xor_ic(buf, buf, (unsigned long long)m * 4, nonce, block, seed);
        block += LANES * 4 / 64;
        if (sign > 0)
            for (int64_t j = 0; j < m; j++) v[i + j] += get_u32(buf + 4 * j);
        else
            for (int64_t j = 0; j < m; j++) v[i + j] -= get_u32(buf + 4 * j);
    }
    sodium_memzero(buf, sizeof buf);
}

/* The seed both u and v derive: H(X25519(sk_u, pk_v) || pk of the lower id || pk of the higher). */
static ts_status pair_seed(const uint8_t sk_u[32], int u, const uint8_t pk_u[32], int v,
                           const uint8_t pk_v[32], uint8_t seed[32]) {
    uint8_t shared[crypto_scalarmult_BYTES];
    if (crypto_scalarmult(shared, sk_u, pk_v) != 0)
        return ts_fail(TS_ERR_FORMAT, "masking: client %d's public key is a low-order point", v);
    crypto_generichash_state st;
    crypto_generichash_init(&st, NULL, 0, 32);
    crypto_generichash_update(&st, shared, sizeof shared);
    crypto_generichash_update(&st, u < v ? pk_u : pk_v, 32);
    crypto_generichash_update(&st, u < v ? pk_v : pk_u, 32);
    crypto_generichash_final(&st, seed, 32);
    sodium_memzero(shared, sizeof shared);
    return TS_OK;
}

static ts_status check_ids(int n, int t) {
    if (sodium_init() < 0)
        return ts_fail(TS_ERR_INTERNAL, "masking: libsodium failed to initialise");
    if (n < 2 || n > MAX_CLIENTS || t < 2 || t > n)
        return ts_fail(TS_ERR_INVALID,
                       "masking: threshold %d of %d clients (need 2 <= t <= n <= %d)", t, n,
                       MAX_CLIENTS);
    return TS_OK;
}

/* ---- client ---- */

ts_status ts_mask_client_new(int id, int n, int t, uint64_t round, ts_mask_client **out) {
    *out = NULL;
    ts_status s = check_ids(n, t);
    if (s != TS_OK) return s;
    if (id < 1 || id > n)
        return ts_fail(TS_ERR_INVALID, "masking: client id %d not in [1, %d]", id, n);
    ts_mask_client *c = calloc(1, sizeof *c);
    if (!c) return ts_fail(TS_ERR_NOMEM, "masking: client");
    c->keys = calloc((size_t)n + 1, sizeof *c->keys);
    c->have = calloc((size_t)n + 1, 1);
    c->b_share = calloc((size_t)n + 1, sizeof *c->b_share);
    c->s_share = calloc((size_t)n + 1, sizeof *c->s_share);
    if (!c->keys || !c->have || !c->b_share || !c->s_share) {
        ts_mask_client_free(c);
        return ts_fail(TS_ERR_NOMEM, "masking: client of %d", n);
    }
    c->id = id;
    c->n = n;
    c->t = t;
    c->round = round;
    crypto_box_keypair(c->box_pk, c->box_sk);
    randombytes_buf(c->mask_sk, sizeof c->mask_sk);
    crypto_scalarmult_base(c->mask_pk, c->mask_sk);
    randombytes_buf(c->b, sizeof c->b);
    *out = c;
    return TS_OK;
}

void ts_mask_client_free(ts_mask_client *c) {
    if (!c) return;
    if (c->b_share) sodium_memzero(c->b_share, ((size_t)c->n + 1) * sizeof *c->b_share);
    if (c->s_share) sodium_memzero(c->s_share, ((size_t)c->n + 1) * sizeof *c->s_share);
    sodium_memzero(c->box_sk, 32);
    sodium_memzero(c->mask_sk, 32);
    sodium_memzero(c->b, 32);
    free(c->keys);
    free(c->have);
    free(c->b_share);
    free(c->s_share);
    free(c);
}

void ts_mask_client_keys(const ts_mask_client *c, ts_mask_keys *k) {
    memcpy(k->box_pk, c->box_pk, 32);
    memcpy(k->mask_pk, c->mask_pk, 32);
}

ts_status ts_mask_client_share(ts_mask_client *c, const ts_mask_keys *keys, const uint8_t *u1,
                               uint8_t *boxes) {
    int members = 0;
    for (int v = 1; v <= c->n; v++) members += u1[v] != 0;
    if (!u1[c->id] || members < c->t)
        return ts_fail(TS_ERR_INVALID, "masking: client %d: %d clients announced keys, %d needed",
                       c->id, members, c->t);
    uint64_t(*bs)[TS_SHAMIR_K] = calloc((size_t)c->n, sizeof *bs);
    uint64_t(*ss)[TS_SHAMIR_K] = calloc((size_t)c->n, sizeof *ss);
    ts_status s = bs && ss ? TS_OK : ts_fail(TS_ERR_NOMEM, "masking: shares");
    if (s == TS_OK) s = ts_shamir_split(c->b, c->n, c->t, bs);
    if (s == TS_OK) s = ts_shamir_split(c->mask_sk, c->n, c->t, ss);
    memcpy(c->keys, keys, ((size_t)c->n + 1) * sizeof *keys);
    memset(boxes, 0, (size_t)c->n * TS_MASK_BOX);
    uint8_t plain[TS_MASK_BOX_PLAIN];
    for (int v = 1; v <= c->n && s == TS_OK; v++) {
        if (!u1[v]) continue;
        if (v == c->id) { /* this client's own shares stay here */
            memcpy(c->b_share[v], bs[v - 1], sizeof bs[0]);
            memcpy(c->s_share[v], ss[v - 1], sizeof ss[0]);
            c->have[v] = 1;
            continue;
        }
        put_u32(plain, (uint32_t)c->id);
        put_u32(plain + 4, (uint32_t)v);
        put_u64(plain + 8, c->round);
        for (int k = 0; k < TS_SHAMIR_K; k++) {
            put_u64(plain + 16 + 8 * k, bs[v - 1][k]);
            put_u64(plain + 16 + 8 * (TS_SHAMIR_K + k), ss[v - 1][k]);
        }
        uint8_t *box = boxes + (size_t)(v - 1) * TS_MASK_BOX;
        randombytes_buf(box, crypto_box_NONCEBYTES);
        if (crypto_box_easy(box + crypto_box_NONCEBYTES, plain, sizeof plain, box, keys[v].box_pk,
                            c->box_sk) != 0)
            s = ts_fail(TS_ERR_FORMAT, "masking: cannot seal client %d's shares for client %d",
                        c->id, v);
    }
    sodium_memzero(plain, sizeof plain);
    if (bs) sodium_memzero(bs, (size_t)c->n * sizeof *bs);
    if (ss) sodium_memzero(ss, (size_t)c->n * sizeof *ss);
    free(bs);
    free(ss);
    return s;
}

ts_status ts_mask_client_accept(ts_mask_client *c, int from, const uint8_t *box) {
    if (from < 1 || from > c->n || from == c->id)
        return ts_fail(TS_ERR_INVALID, "masking: client %d: share box from client %d", c->id, from);
    uint8_t plain[TS_MASK_BOX_PLAIN];
    if (crypto_box_open_easy(plain, box + crypto_box_NONCEBYTES,
                             TS_MASK_BOX - crypto_box_NONCEBYTES, box, c->keys[from].box_pk,
                             c->box_sk) != 0)
        return ts_fail(TS_ERR_FORMAT,
                       "masking: client %d: the share box from client %d does not open "
                       "(tampered, or sealed with another key)",
                       c->id, from);
    ts_status s = TS_OK;
    if (get_u32(plain) != (uint32_t)from || get_u32(plain + 4) != (uint32_t)c->id ||
        get_u64(plain + 8) != c->round)
        s = ts_fail(TS_ERR_FORMAT,
                    "masking: client %d: the share box from client %d names client %u to %u, "
                    "round %llu (replayed or misrouted)",
                    c->id, from, get_u32(plain), get_u32(plain + 4),
                    (unsigned long long)get_u64(plain + 8));
    for (int k = 0; k < TS_SHAMIR_K && s == TS_OK; k++) {
        c->b_share[from][k] = get_u64(plain + 16 + 8 * k);
        c->s_share[from][k] = get_u64(plain + 16 + 8 * (TS_SHAMIR_K + k));
    }
    if (s == TS_OK) c->have[from] = 1;
    sodium_memzero(plain, sizeof plain);
    return s;
}

ts_status ts_mask_client_mask(const ts_mask_client *c, const uint8_t *u2, const uint32_t *x,
                              int64_t len, uint32_t *y) {
    int members = 0;
    for (int v = 1; v <= c->n; v++) members += u2[v] != 0;
    if (!u2[c->id] || members < c->t)
        return ts_fail(TS_ERR_INVALID,
                       "masking: client %d: %d clients shared their keys, %d needed", c->id,
                       members, c->t);
    if (y != x) memcpy(y, x, (size_t)len * sizeof *y);
    ts_mask_prg_add(c->b, c->round, +1, y, len);
    for (int v = 1; v <= c->n; v++) {
        if (!u2[v] || v == c->id) continue;
        uint8_t seed[32];
        ts_status s = pair_seed(c->mask_sk, c->id, c->mask_pk, v, c->keys[v].mask_pk, seed);
        if (s != TS_OK) return s;
        ts_mask_prg_add(seed, c->round, v > c->id ? +1 : -1, y, len);
        sodium_memzero(seed, sizeof seed);
    }
    return TS_OK;
}

ts_status ts_mask_client_unmask(const ts_mask_client *c, const uint8_t *u2, const uint8_t *u3,
                                ts_mask_share *out) {
    int members = 0;
    for (int v = 1; v <= c->n; v++) {
        if (u3[v] && !u2[v])
            return ts_fail(TS_ERR_INVALID,
                           "masking: client %d: client %d sent a masked update without sharing "
                           "its keys",
                           c->id, v);
        members += u3[v] != 0;
    }
    if (!u3[c->id] || members < c->t)
        return ts_fail(TS_ERR_INVALID,
                       "masking: client %d: %d masked updates arrived, %d needed (or this "
                       "client's own is missing)",
                       c->id, members, c->t);
    memset(out, 0, ((size_t)c->n + 1) * sizeof *out);
    for (int u = 1; u <= c->n; u++) {
        if (!u2[u] || !c->have[u]) continue;
        /* never both shares for one client: b when it sent y, its key when it dropped */
        out[u].kind = u3[u] ? 1 : 2;
        memcpy(out[u].y, u3[u] ? c->b_share[u] : c->s_share[u], sizeof out[u].y);
    }
    return TS_OK;
}

/* ---- server ---- */

ts_status ts_mask_server_new(int n, int t, uint64_t round, int64_t len, ts_mask_server **out) {
    *out = NULL;
    ts_status s = check_ids(n, t);
    if (s != TS_OK) return s;
    if (len < 1) return ts_fail(TS_ERR_INVALID, "masking: vector of %lld lanes", (long long)len);
    ts_mask_server *sv = calloc(1, sizeof *sv);
    if (!sv) return ts_fail(TS_ERR_NOMEM, "masking: server");
    size_t m = (size_t)n + 1;
    sv->keys = calloc(m, sizeof *sv->keys);
    sv->has_keys = calloc(m, 1);
    sv->u3 = calloc(m, 1);
    sv->answered = calloc(m, 1);
    sv->sum = calloc((size_t)len, sizeof *sv->sum);
    sv->shares = calloc(m * m, sizeof *sv->shares);
    sv->n = n;
    sv->t = t;
    sv->round = round;
    sv->len = len;
    if (!sv->keys || !sv->has_keys || !sv->u3 || !sv->answered || !sv->sum || !sv->shares) {
        ts_mask_server_free(sv);
        return ts_fail(TS_ERR_NOMEM, "masking: server for %d clients and %lld lanes", n,
                       (long long)len);
    }
    *out = sv;
    return TS_OK;
}

void ts_mask_server_free(ts_mask_server *s) {
    if (!s) return;
    free(s->keys);
    free(s->has_keys);
    free(s->u3);
    free(s->answered);
    free(s->sum);
    free(s->shares);
    free(s);
}

ts_status ts_mask_server_keys(ts_mask_server *s, int id, const ts_mask_keys *k) {
    if (id < 1 || id > s->n)
        return ts_fail(TS_ERR_INVALID, "masking: keys of client %d (not in [1, %d])", id, s->n);
    if (s->has_keys[id])
        return ts_fail(TS_ERR_INVALID, "masking: client %d announced its keys twice", id);
    s->keys[id] = *k;
    s->has_keys[id] = 1;
    return TS_OK;
}

ts_status ts_mask_server_add(ts_mask_server *s, int id, const uint32_t *y) {
    if (id < 1 || id > s->n || !s->has_keys[id])
        return ts_fail(TS_ERR_INVALID,
                       "masking: masked update from client %d, which announced no keys", id);
    if (s->u3[id]) return ts_fail(TS_ERR_INVALID, "masking: client %d sent two masked updates", id);
    for (int64_t i = 0; i < s->len; i++) s->sum[i] += y[i];
    s->u3[id] = 1;
    return TS_OK;
}

ts_status ts_mask_server_shares(ts_mask_server *s, int id, const ts_mask_share *shares) {
    if (id < 1 || id > s->n || !s->u3[id])
        return ts_fail(TS_ERR_INVALID,
                       "masking: unmasking answer from client %d, which sent no masked update", id);
    if (s->answered[id]) return ts_fail(TS_ERR_INVALID, "masking: client %d answered twice", id);
    memcpy(&s->shares[(size_t)id * ((size_t)s->n + 1)], shares,
           ((size_t)s->n + 1) * sizeof *shares);
    s->answered[id] = 1;
    return TS_OK;
}

/* The secret of client u from the kind-`kind` shares the answering clients gave. */
static ts_status recover(const ts_mask_server *s, int u, int kind, uint8_t secret[32]) {
    int xs[MAX_CLIENTS];
    const uint64_t *ys[MAX_CLIENTS];
    int m = 0;
    for (int v = 1; v <= s->n; v++) {
        if (!s->answered[v]) continue;
        const ts_mask_share *sh = &s->shares[(size_t)v * ((size_t)s->n + 1) + (size_t)u];
        if (sh->kind != kind) continue;
        xs[m] = v;
        ys[m++] = sh->y;
    }
    if (m < s->t)
        return ts_fail(TS_ERR_INVALID,
                       "masking: %d shares of client %d's %s arrived, %d (fed.threshold) needed: "
                       "the round fails",
                       m, u, kind == 1 ? "self-mask" : "mask key", s->t);
    ts_status st = ts_shamir_combine(xs, ys, m, s->t, secret);
    if (st != TS_OK) ts_error_prefix("masking: client %d", u);
    return st;
}

ts_status ts_mask_server_finish(ts_mask_server *s, const uint8_t *u2, uint32_t *sum,
                                int *n_summed) {
    int answers = 0, n3 = 0;
    for (int v = 1; v <= s->n; v++) {
        answers += s->answered[v];
        n3 += s->u3[v];
        if (s->u3[v] && !u2[v])
            return ts_fail(TS_ERR_INVALID,
                           "masking: client %d sent a masked update but is not in U2", v);
    }
    if (n3 < s->t)
        return ts_fail(TS_ERR_INVALID,
                       "masking: %d masked updates arrived, %d (fed.threshold) needed: the round "
                       "fails",
                       n3, s->t);
    if (answers < s->t)
        return ts_fail(TS_ERR_INVALID,
                       "masking: %d clients answered the unmasking step, %d (fed.threshold) "
                       "needed: the round fails",
                       answers, s->t);
    memcpy(sum, s->sum, (size_t)s->len * sizeof *sum);
    uint8_t secret[32], seed[32], pk[32];
    ts_status st = TS_OK;
    for (int u = 1; u <= s->n && st == TS_OK; u++) {
        if (!u2[u]) continue;
        if (s->u3[u]) { /* remove u's self-mask */
            if ((st = recover(s, u, 1, secret)) == TS_OK)
                ts_mask_prg_add(secret, s->round, -1, sum, s->len);
            continue;
        }
        /* u dropped after sharing: remove the pairwise masks the others added for it */
        if ((st = recover(s, u, 2, secret)) != TS_OK) break;
        crypto_scalarmult_base(pk, secret);
        if (sodium_memcmp(pk, s->keys[u].mask_pk, 32) != 0) {
            st = ts_fail(TS_ERR_FORMAT,
                         "masking: the recovered mask key of client %d does not match its public "
                         "key (corrupted shares)",
                         u);
            break;
        }
        for (int v = 1; v <= s->n && st == TS_OK; v++) {
            if (!s->u3[v]) continue;
            if ((st = pair_seed(secret, u, s->keys[u].mask_pk, v, s->keys[v].mask_pk, seed)) !=
                TS_OK)
                break;
            /* v added +PRG(s_uv) when u > v, -PRG when u < v */
            ts_mask_prg_add(seed, s->round, u > v ? -1 : +1, sum, s->len);
        }
    }
    sodium_memzero(secret, sizeof secret);
    sodium_memzero(seed, sizeof seed);
    if (st == TS_OK) *n_summed = n3;
    return st;
}
