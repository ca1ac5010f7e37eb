/* roles.c — the aggregator and client loops (roles.h; the key holder's is
 * in roles_keyholder.c).
 *
 * Payloads (little endian):
 *   PUBKEY     the public key file's text with the key holder's certificate and
 *              signature (keysig.h); clients check it, the aggregator relays it
 *   HELLO      u64 samples
 *   GLOBAL     f32 params[n]
 *   ROUND      f64 weight, f32 params[n]
 *   UPDATE     ciphertexts[count] (update.h)
 *   AGGREGATE  u32 k, f64 weight sum, u32 text length, text, ciphertexts[count]
 *   DONE       empty when every round is done, else the aggregator's error
 *              message (at most FEDR_DONE_MAX bytes)
 *   SETUP      u32 clients admitted (Paillier, once admission is over)
 * The aggregator talks to its peers one after the other, each read bounded
 * by the transport's timeout, so a slow or silent client costs at most one
 * timeout per round and is then dropped. */
#include <math.h>
#include <openssl/evp.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <errno.h>
#include <sys/stat.h>
#include "fed/roles_internal.h"

ts_status fedr_done_status(const ts_fed_msg *m, const char *role, uint64_t last, int rounds) {
    if (m->len > 0)
        return ts_fail(TS_ERR_IO,
                       "fed: %s: the aggregator ended the run (rounds taken part in: %llu of "
                       "%d): %.*s",
                       role, (unsigned long long)last, rounds, (int)m->len, (const char *)m->data);
    if (last < (uint64_t)rounds)
        return ts_fail(TS_ERR_IO,
                       "fed: %s: the aggregator ended the run after round %llu of %d (fed.rounds)",
                       role, (unsigned long long)last, rounds);
    return TS_OK;
}

ts_fed_params ts_fed_params_default(void) {
    return (ts_fed_params){.rounds = 5,
                           .min_clients = 2,
                           .max_clients = 16,
                           .key_bits = 2048,
                           .scale = 1 << 20,
                           .clip = 1.0,
                           .join_s = 30,
                           .pool = 0,
                           .pool_threads = 1,
                           .keyholder_name = "keyholder"};
}

/* The fixed point of masking: sums must fit the uint32 lanes. */
ts_status fedr_mask_pack(const ts_fed_params *fp, ts_fed_pack *pack) {
    ts_status s = ts_fed_pack_init(pack, fp->scale, fp->clip, fp->max_clients, 0);
    if (s == TS_OK && pack->slot_bits > 32)
        s = ts_fail(
            TS_ERR_INVALID,
            "fed: masking sums in 32 bits, but 2 · clip · scale · max_clients needs %d: lower "
            "fed.scale, fed.clip or fed.max_clients",
            pack->slot_bits);
    return s;
}

/* The key holder's public key and first global model. */
static ts_status agg_keyholder_hello(agg *a) {
    ts_fed_msg m;
    ts_status s = TS_OK;
    if (a->fp->secure == 1) {
        s = fedr_mask_pack(a->fp, &a->pack);
    } else if (a->fp->secure == 0) {
        if ((s = expect(a->kh, TS_FED_MSG_PUBKEY, 0, 1 << 16, &m)) != TS_OK) return s;
        /* n alone, to add ciphertexts; the signature is for the clients to
         * check (they trust the aggregator with nothing) */
        const char *text;
        size_t text_len;
        s = ts_fed_pubkey_text(m.data, m.len, &text, &text_len);
        if (s == TS_OK) s = ts_paillier_pub_from_text(text, text_len, &a->pk);
        a->pub_text = (char *)m.data; /* kept to forward */
        a->pub_len = m.len;
        m.data = NULL;
    }
    if (s != TS_OK) return s;
    if ((s = expect(a->kh, TS_FED_MSG_GLOBAL, 1, (uint64_t)1 << 34, &m)) != TS_OK) return s;
    if (m.len % 4 != 0 || m.len == 0) {
        ts_fed_msg_free(&m);
        return ts_fail(TS_ERR_FORMAT, "fed: a global model of %llu bytes",
                       (unsigned long long)m.len);
    }
    a->n = (int64_t)(m.len / 4);
    a->global = (float *)m.data;
    return TS_OK;
}

/* Sends the public key to the clients that do not have it yet. */
static void agg_send_key(agg *a) {
    for (int i = 0; a->pk && i < a->n_cl; i++) {
        peer *p = &a->cl[i];
        if (!p->alive || p->has_key) continue;
        if (ts_fed_send(p->c, TS_FED_MSG_PUBKEY, 0, a->pub_text, a->pub_len) != TS_OK)
            drop(p, ts_last_error());
        else
            p->has_key = 1;
    }
}

/* Admits the key holder and up to max_clients clients: until all are in, or
 * fed.join_s has passed with the key holder and min_clients clients in. */
static ts_status agg_admit(agg *a, ts_fed_listener *l, const char *kh_name) {
    double deadline = now_s() + a->fp->join_s;
    while (!a->kh || a->n_cl < a->fp->max_clients) {
        int enough = a->kh && a->n_cl >= a->fp->min_clients;
        if (enough && now_s() > deadline) break;
        ts_fed_conn *c = NULL;
        /* with enough in, more may join only until the deadline: waiting a
         * whole timeout for one more would let the key holder and the
         * clients, waiting for the next message as long, time out first */
        ts_status s =
            enough ? ts_fed_accept_within(l, deadline - now_s(), &c) : ts_fed_accept(l, &c);
        if (s != TS_OK) {
            if (!strstr(ts_last_error(), "no connection")) { /* a failed handshake: log, go on */
                ts_logf(TS_LOG_WARN, "fed: refused a connection: %s", ts_last_error());
                continue;
            }
            if (enough) break;
            if (now_s() > deadline)
                return ts_fail(TS_ERR_IO,
                               "fed: %s and %d clients (fed.min_clients = %d) joined within %g s",
                               a->kh ? "the key holder" : "no key holder", a->n_cl,
                               a->fp->min_clients, a->fp->join_s);
            continue;
        }
        if (!strcmp(ts_fed_peer(c), kh_name)) {
            if (a->kh) {
                ts_logf(TS_LOG_WARN, "fed: refused a second key holder");
                ts_fed_close(c);
                continue;
            }
            a->kh = c;
            if ((s = agg_keyholder_hello(a)) != TS_OK) return s;
            agg_send_key(a);
            continue;
        }
        int dup = 0;
        for (int i = 0; i < a->n_cl; i++) dup |= !strcmp(a->cl[i].name, ts_fed_peer(c));
        ts_fed_msg m;
        if (dup || expect(c, TS_FED_MSG_HELLO, 0, 8, &m) != TS_OK || m.len != 8) {
            ts_logf(TS_LOG_WARN, "fed: refused client %s: %s", ts_fed_peer(c),
                    dup ? "a client of that name is already in" : ts_last_error());
            if (!dup) ts_fed_msg_free(&m);
            ts_fed_close(c);
            continue;
        }
        peer *p = &a->cl[a->n_cl++];
        p->c = c;
        snprintf(p->name, sizeof p->name, "%s", ts_fed_peer(c));
        memcpy(&p->samples, m.data, 8);
        p->alive = 1;
        ts_fed_msg_free(&m);
        ts_logf(TS_LOG_INFO, "fed: client %s joined with %llu samples", p->name,
                (unsigned long long)p->samples);
        agg_send_key(a);
    }
    return TS_OK;
}

/* Paillier, once admission is over: the slots need headroom for the sum of
 * the clients admitted, not of fed.max_clients (fewer, narrower slots: with
 * 3 of 16, 23 bits instead of 26 at scale 2^20 and 12 % fewer ciphertexts).
 * The key holder and every client are told (SETUP); a client that cannot
 * take it is dropped. */
static ts_status agg_setup(agg *a) {
    uint32_t h = 0;
    for (int i = 0; i < a->n_cl; i++) h += (uint32_t)a->cl[i].alive;
    ts_status s = h >= 1 ? TS_OK : ts_fail(TS_ERR_IO, "fed: every client was dropped on joining");
    if (s == TS_OK)
        s = ts_fed_pack_init(&a->pack, a->fp->scale, a->fp->clip, (int)h, ts_paillier_bits(a->pk));
    if (s == TS_OK) s = ts_fed_send(a->kh, TS_FED_MSG_SETUP, 0, &h, 4);
    for (int i = 0; s == TS_OK && i < a->n_cl; i++) {
        peer *p = &a->cl[i];
        if (p->alive && ts_fed_send(p->c, TS_FED_MSG_SETUP, 0, &h, 4) != TS_OK)
            drop(p, ts_last_error());
    }
    return s;
}

ts_status fedr_send_rounds(agg *a, int r, double *weights, double *total, int *dropped,
                           uint64_t *down) {
    *total = 0;
    for (int i = 0; i < a->n_cl; i++)
        if (a->cl[i].alive) *total += (double)a->cl[i].samples;
    size_t bytes = 8 + (size_t)a->n * 4;
    uint8_t *msg = malloc(bytes);
    if (!msg) return ts_fail(TS_ERR_NOMEM, "fed: round %d message", r);
    memcpy(msg + 8, a->global, (size_t)a->n * 4);
    for (int i = 0; i < a->n_cl; i++) {
        peer *p = &a->cl[i];
        if (!p->alive) continue;
        weights[i] = *total > 0 ? (double)p->samples / *total : 0;
        put_f64(msg, weights[i]);
        send_round(a, p, r, msg, bytes, dropped, down);
    }
    free(msg);
    return TS_OK;
}

static ts_status agg_round(agg *a, int r, FILE *metrics) {
    double t0 = now_s(), total = 0;
    int64_t count = ts_fed_pack_count(&a->pack, a->n);
    size_t w = ts_fed_ct_bytes(a->pk), ct_bytes = (size_t)count * w;
    uint8_t *acc = malloc(ct_bytes);
    fedr_text text;
    if (!fedr_text_init(&text, a->n_cl) || !acc) {
        free(acc);
        free(text.s);
        return ts_fail(TS_ERR_NOMEM, "fed: round %d buffers", r);
    }
    uint64_t down = 0, up = 0;
    double weights[MAX_PEERS] = {0};
    int k = 0, dropped = 0;
    ts_status s = fedr_send_rounds(a, r, weights, &total, &dropped, &down);
    double t_sent = now_s();
    ts_fed_aggregate_init(a->pk, acc, count);
    double wsum = 0, t_agg = 0;
    for (int i = 0; s == TS_OK && i < a->n_cl; i++) {
        peer *p = &a->cl[i];
        if (!p->alive) continue;
        ts_fed_msg m;
        if (!recv_update(p, r, ct_bytes, &m, &dropped)) continue;
        /* the range of every ciphertext first, so a bad one leaves acc untouched */
        uint8_t *tmp = malloc(ct_bytes);
        if (!tmp) {
            ts_fed_msg_free(&m);
            s = ts_fail(TS_ERR_NOMEM, "fed: round %d", r);
            break;
        }
        memcpy(tmp, acc, ct_bytes);
        double ta = now_s();
        if (ts_fed_aggregate(a->pk, tmp, m.data, count) != TS_OK) {
            free(tmp);
            ts_fed_msg_free(&m);
            drop(p, ts_last_error());
            dropped++;
            continue;
        }
        t_agg += now_s() - ta;
        memcpy(acc, tmp, ct_bytes);
        free(tmp);
        fedr_accept(a, p, &m, &text, &up, &wsum);
        k++;
        ts_fed_msg_free(&m);
    }
    wsum = total > 0 ? wsum / total : 0; /* the same in every order clients joined in */
    if (s == TS_OK) s = fedr_quorum(a, r, k, dropped);
    if (s == TS_OK)
        s = fedr_agg_finish(a, r, k, dropped, wsum, text.s, text.len, acc, ct_bytes, up, down, t0,
                            t_sent, t_agg, metrics);
    free(acc);
    free(text.s);
    return s;
}

ts_status fedr_agg_finish(agg *a, int r, int k, int dropped, double wsum, const char *text,
                          size_t text_len, const void *body, size_t body_len, uint64_t up,
                          uint64_t down, double t0, double t_sent, double t_agg, FILE *metrics) {
    ts_status s = TS_OK;
    /* every update is in: what follows is the key holder's turn */
    double t_in = now_s(), t_kh = 0;
    size_t hb = 16 + text_len, ab = hb + body_len;
    uint8_t *am = malloc(ab);
    if (!am) return ts_fail(TS_ERR_NOMEM, "fed: round %d aggregate", r);
    put_u32(am, (uint32_t)k);
    put_f64(am + 4, wsum);
    put_u32(am + 12, (uint32_t)text_len);
    memcpy(am + 16, text, text_len);
    memcpy(am + hb, body, body_len);
    s = ts_fed_send(a->kh, TS_FED_MSG_AGGREGATE, (uint64_t)r, am, ab);
    free(am);
    ts_fed_msg m;
    if (s == TS_OK &&
        (s = expect(a->kh, TS_FED_MSG_GLOBAL, (uint64_t)r + 1, (uint64_t)a->n * 4, &m)) == TS_OK) {
        if (m.len != (uint64_t)a->n * 4)
            s = ts_fail(TS_ERR_FORMAT, "fed: a global model of the wrong size");
        else
            memcpy(a->global, m.data, m.len);
        ts_fed_msg_free(&m);
    }
    t_kh = now_s() - t_in;
    if (s == TS_OK && metrics) {
        fprintf(metrics,
                "{\"round\": %d, \"clients\": %d, \"dropped\": %d, \"bytes_up\": %llu, "
                "\"bytes_down\": %llu, "
                "\"broadcast_s\": %.6f, \"train_and_encrypt_s\": %.6f, \"aggregate_s\": %.6f, "
                "\"keyholder_s\": %.6f, \"round_s\": %.6f}\n",
                r, k, dropped, (unsigned long long)up, (unsigned long long)down, t_sent - t0,
                t_in - t_sent - t_agg, t_agg, t_kh, now_s() - t0);
        fflush(metrics);
    }
    if (s == TS_OK) {
        ts_fed_obs_round_info oi = {.round = r,
                                    .clients = k,
                                    .dropped = dropped,
                                    .train_s = -1,
                                    .encrypt_s = -1,
                                    .aggregate_s = t_agg,
                                    .decrypt_s = -1,
                                    .round_s = now_s() - t0,
                                    .upload_s = -1,
                                    .broadcast_s = t_sent - t0,
                                    .updates_s = t_in - t_sent - t_agg,
                                    .keyholder_s = t_kh};
        s = ts_fed_obs_round(a->fp->obs, &oi);
    }
    return s;
}

ts_status ts_fed_aggregator_run(const ts_fed_params *fp, ts_fed_listener *l,
                                const char *keyholder_name, FILE *metrics) {
    if (fp->max_clients > MAX_PEERS || fp->min_clients < 1 || fp->min_clients > fp->max_clients)
        return ts_fail(TS_ERR_INVALID,
                       "fed: min_clients %d, max_clients %d (need 1 <= min <= max <= %d)",
                       fp->min_clients, fp->max_clients, MAX_PEERS);
    agg a = {.fp = fp};
    ts_status s = agg_admit(&a, l, keyholder_name);
    if (s == TS_OK && fp->secure == 0) s = agg_setup(&a);
    for (int r = 1; s == TS_OK && r <= fp->rounds; r++) {
        s = fp->secure == 1   ? fedr_agg_round_mask(&a, r, metrics)
            : fp->secure == 2 ? fedr_agg_round_plain(&a, r, metrics)
                              : agg_round(&a, r, metrics);
        if (s != TS_OK) ts_error_prefix("aggregator");
    }
    /* DONE to everyone still there, success or not. A failed run's DONE
     * carries its message (the first FEDR_DONE_MAX bytes), so clients and
     * the key holder fail too and say which role ended it; an empty DONE
     * means every round is done. Sending to a peer that is gone must not
     * replace this run's own error. */
    char why[1024] = "";
    if (s != TS_OK) snprintf(why, sizeof why, "%s", ts_last_error());
    size_t why_len = strlen(why) < FEDR_DONE_MAX ? strlen(why) : FEDR_DONE_MAX;
    for (int i = 0; i < a.n_cl; i++)
        if (a.cl[i].c) {
            ts_fed_send(a.cl[i].c, TS_FED_MSG_DONE, 0, why, why_len);
            ts_fed_close(a.cl[i].c);
        }
    if (a.kh) {
        ts_fed_send(a.kh, TS_FED_MSG_DONE, 0, why, why_len);
        ts_fed_close(a.kh);
    }
    if (s != TS_OK) ts_fail(s, "%s", why);
    ts_paillier_pub_free(a.pk);
    free(a.pub_text);
    free(a.global);
    return s;
}

/* ---- client ---- */

/* A client's round in its metrics: its own bytes (whole frames sent and
 * received from the round message on, as series client="self") and times. */
static ts_status client_observe(const ts_fed_params *fp, ts_fed_conn *c, int r, uint64_t sent0,
                                uint64_t recv0, double train_s, double enc_s, double up_s,
                                double t0, const int64_t pool[2]) {
    uint64_t sent, recv;
    ts_fed_conn_bytes(c, &sent, &recv);
    ts_fed_obs_bytes(fp->obs, "self", sent - sent0, recv - recv0);
    ts_fed_obs_round_info oi = {.round = r,
                                .clients = -1,
                                .dropped = -1,
                                .train_s = train_s,
                                .encrypt_s = enc_s,
                                .aggregate_s = -1,
                                .decrypt_s = -1,
                                .round_s = now_s() - t0,
                                .upload_s = up_s,
                                .broadcast_s = -1,
                                .updates_s = -1,
                                .keyholder_s = -1,
                                .has_pool = pool != NULL,
                                .pool_hits = pool ? pool[0] : 0,
                                .pool_misses = pool ? pool[1] : 0};
    return ts_fed_obs_round(fp->obs, &oi);
}

ts_status ts_fed_client_run(const ts_fed_params *fp, const ts_fed_tls *tls, const char *host,
                            int port, const char *server_name, int64_t samples, int64_t n,
                            ts_fed_train_fn train, void *user) {
    ts_fed_conn *c = NULL;
    ts_paillier_pub *pk = NULL;
    ts_fed_pack pack;
    float *local = malloc((size_t)n * sizeof *local), *delta = malloc((size_t)n * sizeof *delta);
    uint64_t *u = malloc((size_t)n * sizeof *u);
    uint8_t *ct = NULL;
    ts_status s = local && delta && u
                      ? TS_OK
                      : ts_fail(TS_ERR_NOMEM, "fed: client: a model of %lld", (long long)n);
    uint64_t hello = (uint64_t)samples;
    ts_fed_msg m = {0};
    if (s == TS_OK) s = ts_fed_connect(tls, host, port, server_name, &c);
    if (s == TS_OK) s = ts_fed_send(c, TS_FED_MSG_HELLO, 0, &hello, 8);
    size_t ct_bytes = 0;
    if (s == TS_OK && fp->secure == 1) {
        s = fedr_mask_pack(fp, &pack);
    } else if (s == TS_OK && fp->secure == 0) {
        s = expect(c, TS_FED_MSG_PUBKEY, 0, 1 << 16, &m);
        /* only a key the key holder signed: one the aggregator made could be
         * decrypted by it */
        const char *text = NULL;
        size_t text_len = 0;
        if (s == TS_OK)
            s = ts_fed_pubkey_verify(tls->ca, fp->keyholder_name, m.data, m.len, &text, &text_len);
        if (s == TS_OK) s = ts_paillier_pub_from_text(text, text_len, &pk);
        ts_fed_msg_free(&m);
        /* the pool thread fills while the others join and during local
         * training; a pool smaller than a round leaves the rest to the
         * encryption itself */
        if (s == TS_OK && fp->pool > 0) s = ts_paillier_pool_start(pk, fp->pool, fp->pool_threads);
        int headroom = 0;
        if (s == TS_OK) s = fedr_recv_setup(fp, c, "client", &headroom);
        if (s == TS_OK)
            s = ts_fed_pack_init(&pack, fp->scale, fp->clip, headroom, ts_paillier_bits(pk));
        if (s == TS_OK) ct_bytes = (size_t)ts_fed_pack_count(&pack, n) * ts_fed_ct_bytes(pk);
        if (s == TS_OK && !(ct = malloc(ct_bytes)))
            s = ts_fail(TS_ERR_NOMEM, "fed: client: %zu bytes", ct_bytes);
        int64_t count = s == TS_OK ? ts_fed_pack_count(&pack, n) : 0;
        if (s == TS_OK && fp->pool > 0 && fp->pool < count)
            ts_logf(TS_LOG_WARN,
                    "fed: client: fed.pool = %d holds fewer r^n than the %lld ciphertexts of a "
                    "round; the rest are computed while encrypting (fed.pool >= %lld avoids it)",
                    fp->pool, (long long)count, (long long)count);
    }
    uint64_t last = 0, head = fp->secure == 1 ? 20 : 8; /* the round message before the model */
    const uint64_t most =
        head + (uint64_t)n * 4 > FEDR_DONE_MAX ? head + (uint64_t)n * 4 : FEDR_DONE_MAX;
    while (s == TS_OK) {
        uint64_t sent0, recv0; /* this round's bytes: from its round message on */
        ts_fed_conn_bytes(c, &sent0, &recv0);
        if ((s = ts_fed_recv(c, most, &m)) != TS_OK) break;
        if (m.type == TS_FED_MSG_DONE) {
            s = fedr_done_status(&m, "client", last, fp->rounds);
            ts_fed_msg_free(&m);
            break;
        }
        if (m.type != TS_FED_MSG_ROUND || m.round <= last || m.len != head + (uint64_t)n * 4) {
            s = ts_fail(
                TS_ERR_FORMAT,
                "fed: client: a message of type %u, round %llu, %llu bytes after round %llu "
                "(replayed, stale or for another model)",
                m.type, (unsigned long long)m.round, (unsigned long long)m.len,
                (unsigned long long)last);
            ts_fed_msg_free(&m);
            break;
        }
        last = m.round;
        double t0 = now_s(), train_s = 0, enc_s = 0, up_s = -1;
        if (fp->secure) {
            s = fp->secure == 1
                    ? fedr_client_round_mask(fp, c, &m, &pack, n, train, user, local, delta, u,
                                             &train_s, &enc_s, &up_s)
                    : fedr_client_round_plain(c, &m, n, train, user, local, delta, &train_s, &up_s);
            ts_fed_msg_free(&m);
            if (s == TS_OK)
                s = client_observe(fp, c, (int)last, sent0, recv0, train_s, enc_s, up_s, t0, NULL);
            continue;
        }
        double weight = get_f64(m.data);
        const float *global = (const float *)(m.data + 8);
        int64_t clipped = 0;
        s = train(user, (int)m.round, global, local, n);
        train_s = now_s() - t0;
        for (int64_t i = 0; s == TS_OK && i < n; i++) delta[i] = local[i] - global[i];
        if (s == TS_OK) s = ts_fed_quantize(&pack, delta, n, weight, u, &clipped);
        if (s == TS_OK && clipped)
            ts_logf(TS_LOG_WARN,
                    "fed: round %llu: %lld update values beyond ±fed.clip = %g were clipped",
                    (unsigned long long)m.round, (long long)clipped, fp->clip);
        int64_t h0, m0, h1, m1;
        ts_paillier_pool_stats(pk, &h0, &m0);
        if (s == TS_OK) s = ts_fed_encrypt_update(pk, &pack, u, n, ct, NULL, 0);
        enc_s = now_s() - t0 - train_s;
        ts_paillier_pool_stats(pk, &h1, &m1);
        const int64_t pool[2] = {h1 - h0, m1 - m0};
        double tu = now_s();
        if (s == TS_OK) s = ts_fed_send(c, TS_FED_MSG_UPDATE, m.round, ct, ct_bytes);
        up_s = now_s() - tu;
        ts_fed_msg_free(&m);
        if (s == TS_OK)
            s = client_observe(fp, c, (int)last, sent0, recv0, train_s, enc_s, up_s, t0,
                               fp->pool > 0 ? pool : NULL);
    }
    if (s != TS_OK) ts_error_prefix("client");
    ts_fed_close(c);
    ts_paillier_pub_free(pk);
    free(local);
    free(delta);
    free(u);
    free(ct);
    return s;
}
