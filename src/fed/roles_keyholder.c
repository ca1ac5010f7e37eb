/* roles_keyholder.c — the key holder's loop (roles.h): it owns the Paillier
 * key pair (none in masking and plain mode), sends the public key and the
 * first global model, then per round turns the aggregate into the new
 * global model, commits it (on_global: checkpoint and audit entry) and only
 * then hands it back to the aggregator. Payloads as in roles.c. */
#include <errno.h>
#include <math.h>
#include <sys/stat.h>
#include "fed/roles_internal.h"

/* ---- key holder ---- */

/* Loads the key file, or makes one when (and only when) there is none: a
 * file that exists but cannot be read is reported, never replaced. */
static ts_status load_or_make_key(const char *path, int bits, ts_paillier_priv **sk) {
    struct stat st;
    if (lstat(path, &st) == 0 || errno != ENOENT) return ts_paillier_priv_load(path, sk);
    ts_status s = ts_paillier_keygen(bits, sk);
    if (s == TS_OK && (s = ts_paillier_priv_save(*sk, path)) != TS_OK) {
        ts_paillier_priv_free(*sk);
        *sk = NULL;
    }
    return s;
}

ts_status fedr_recv_setup(const ts_fed_params *fp, ts_fed_conn *c, const char *role,
                          int *headroom) {
    ts_fed_msg m;
    ts_status s = ts_fed_recv(c, FEDR_DONE_MAX, &m);
    if (s != TS_OK) return s;
    if (m.type == TS_FED_MSG_DONE) {
        s = fedr_done_status(&m, role, 0, fp->rounds);
    } else if (m.type != TS_FED_MSG_SETUP || m.round != 0 || m.len != 4) {
        s = ts_fail(TS_ERR_FORMAT,
                    "fed: %s: a message of type %u, round %llu, %llu bytes where the setup "
                    "(clients admitted) was due",
                    role, m.type, (unsigned long long)m.round, (unsigned long long)m.len);
    } else {
        uint32_t h = get_u32(m.data);
        if (h < 1 || h > (uint32_t)fp->max_clients)
            s = ts_fail(TS_ERR_FORMAT, "fed: %s: %u clients admitted, fed.max_clients is %d", role,
                        h, fp->max_clients);
        else
            *headroom = (int)h;
    }
    ts_fed_msg_free(&m);
    return s;
}

ts_status ts_fed_keyholder_run(const ts_fed_params *fp, const ts_fed_tls *tls, const char *host,
                               int port, const char *server_name, const char *key_path,
                               const float *init, int64_t n, ts_fed_global_fn on_global,
                               void *user) {
    ts_paillier_priv *sk = NULL;
    ts_paillier_pub *pk = NULL;
    ts_fed_conn *c = NULL;
    char *text = NULL;
    uint8_t *signed_key = NULL;
    size_t signed_len = 0;
    float *global = malloc((size_t)n * sizeof *global);
    double *sum = malloc((size_t)n * sizeof *sum);
    ts_fed_pack pack;
    ts_status s = global && sum
                      ? TS_OK
                      : ts_fail(TS_ERR_NOMEM, "fed: key holder: a model of %lld", (long long)n);
    if (s == TS_OK && fp->secure == 1) {
        s = fedr_mask_pack(fp, &pack); /* masking: no key; the sums come in plain */
    } else if (s == TS_OK && fp->secure == 0) {
        s = load_or_make_key(key_path, fp->key_bits, &sk);
        if (s == TS_OK) s = ts_paillier_pub_of(sk, &pk);
        if (s == TS_OK) s = ts_paillier_pub_to_text(pk, &text);
        /* signed with this role's TLS key, so clients can tell it from a key
         * the aggregator relaying it might substitute */
        if (s == TS_OK) s = ts_fed_pubkey_sign(tls, text, strlen(text), &signed_key, &signed_len);
    }
    if (s == TS_OK) s = ts_fed_connect(tls, host, port, server_name, &c);
    if (s == TS_OK && fp->secure == 0)
        s = ts_fed_send(c, TS_FED_MSG_PUBKEY, 0, signed_key, signed_len);
    if (s == TS_OK) {
        memcpy(global, init, (size_t)n * sizeof *global);
        s = ts_fed_send(c, TS_FED_MSG_GLOBAL, 1, global, (uint64_t)n * 4);
    }
    ts_fed_round_info info = {0};
    if (s == TS_OK && on_global) s = on_global(user, global, n, &info);
    /* the slots hold sums of as many updates as clients were admitted */
    int headroom = 0;
    if (s == TS_OK && fp->secure == 0) s = fedr_recv_setup(fp, c, "key holder", &headroom);
    if (s == TS_OK && fp->secure == 0)
        s = ts_fed_pack_init(&pack, fp->scale, fp->clip, headroom, ts_paillier_bits(pk));
    /* the aggregate's body: ciphertexts, (masking) the uint32 sums or (none)
     * the f64 sums */
    size_t ct_bytes = s != TS_OK        ? 0
                      : fp->secure == 1 ? (size_t)n * 4
                      : fp->secure == 2 ? (size_t)n * 8
                                        : (size_t)ts_fed_pack_count(&pack, n) * ts_fed_ct_bytes(pk);
    for (int r = 1; s == TS_OK; r++) {
        ts_fed_msg m;
        if ((s = ts_fed_recv(c, 16 + (uint64_t)MAX_PEERS * 400 + ct_bytes, &m)) != TS_OK) break;
        if (m.type == TS_FED_MSG_DONE) {
            s = fedr_done_status(&m, "key holder", (uint64_t)r - 1, fp->rounds);
            ts_fed_msg_free(&m);
            break;
        }
        if (m.type != TS_FED_MSG_AGGREGATE || m.round != (uint64_t)r) {
            s = ts_fail(TS_ERR_FORMAT,
                        "fed: key holder: a message of type %u, round %llu, during round %d "
                        "(replayed or stale)",
                        m.type, (unsigned long long)m.round, r);
            ts_fed_msg_free(&m);
            break;
        }
        uint32_t k = m.len >= 16 ? get_u32(m.data) : 0, tl = m.len >= 16 ? get_u32(m.data + 12) : 0;
        double wsum = m.len >= 16 ? get_f64(m.data + 4) : 0;
        if (m.len < 16 || m.len != 16 + (uint64_t)tl + ct_bytes || k < (uint32_t)fp->min_clients ||
            k > (uint32_t)(fp->secure == 0 ? pack.max_clients : fp->max_clients) ||
            !(wsum > 0 && wsum <= 1 + 1e-9)) {
            s = ts_fail(TS_ERR_FORMAT,
                        "fed: key holder: round %d: a malformed aggregate (%u updates, weights %g, "
                        "%llu bytes)",
                        r, k, wsum, (unsigned long long)m.len);
            ts_fed_msg_free(&m);
            break;
        }
        char *who = malloc((size_t)tl + 1);
        if (!who) {
            ts_fed_msg_free(&m);
            s = ts_fail(TS_ERR_NOMEM, "fed: key holder");
            break;
        }
        memcpy(who, m.data + 16, tl);
        who[tl] = 0;
        double t0 = now_s();
        if (fp->secure == 2) {
            memcpy(sum, m.data + 16 + tl, (size_t)n * 8);
            for (int64_t i = 0; s == TS_OK && i < n; i++)
                if (!isfinite(sum[i]))
                    s = ts_fail(TS_ERR_NUMERIC,
                                "fed: key holder: round %d: the aggregate is not finite at %lld", r,
                                (long long)i);
        } else if (fp->secure == 1) {
            uint32_t v;
            for (int64_t i = 0; s == TS_OK && i < n; i++) {
                memcpy(&v, m.data + 16 + tl + 4 * (size_t)i, 4);
                uint64_t w = v;
                s = ts_fed_decode_sums(&pack, &w, 1, (int)k, &sum[i]);
            }
        } else {
            s = ts_fed_decrypt_sum(sk, &pack, m.data + 16 + tl, n, (int)k, sum);
        }
        info = (ts_fed_round_info){.round = r,
                                   .clients = (int)k,
                                   .weight_sum = wsum,
                                   .participants = who,
                                   .bytes_up = ct_bytes * k,
                                   .decrypt_s = now_s() - t0};
        ts_fed_msg_free(&m);
        /* FedAvg over the clients that finished: Σ wᵢΔᵢ / Σ wᵢ */
        for (int64_t i = 0; s == TS_OK && i < n; i++)
            global[i] = (float)((double)global[i] + sum[i] / wsum);
        /* committed (on_global) before it is published: no client ever
         * trains from a global model a resumed key holder would not know */
        if (s == TS_OK && on_global) s = on_global(user, global, n, &info);
        if (s == TS_OK)
            s = ts_fed_send(c, TS_FED_MSG_GLOBAL, (uint64_t)r + 1, global, (uint64_t)n * 4);
        if (s == TS_OK) {
            ts_fed_obs_round_info oi = {.round = r,
                                        .clients = (int)k,
                                        .dropped = -1,
                                        .train_s = -1,
                                        .encrypt_s = -1,
                                        .aggregate_s = -1,
                                        .decrypt_s = info.decrypt_s,
                                        .round_s = -1,
                                        .upload_s = -1,
                                        .broadcast_s = -1,
                                        .updates_s = -1,
                                        .keyholder_s = -1};
            s = ts_fed_obs_round(fp->obs, &oi);
        }
        free(who);
    }
    if (s != TS_OK) ts_error_prefix("key holder");
    ts_fed_close(c);
    free(text);
    free(signed_key);
    free(global);
    free(sum);
    ts_paillier_pub_free(pk);
    ts_paillier_priv_free(sk);
    return s;
}
