/* roles_plain.c — a round with fed.secure: none: plain FedAvg over the same
 * TLS transport, audit log and checkpoints as the protected modes. It is
 * the baseline the protected modes are measured against (bytes and time,
 * docs/federated.md), and offers no privacy from the aggregator: it sees
 * every client's update in the clear.
 *
 * Payloads (little endian), all of the round:
 *   ROUND      aggregator -> client: f64 weight, f32 params[n] (as Paillier)
 *   UPDATE     client -> aggregator: f32 delta[n] = local - global, unweighted
 *   AGGREGATE  aggregator -> key holder: the usual header, then f64 sum[n]
 *              = Σ wᵢ·deltaᵢ over the clients that finished, added in
 *              the order of their names: floating-point addition is not
 *              associative, and the order clients connect in varies from
 *              run to run, so any other order would break determinism. */
#include <math.h>
#include "fed/roles_internal.h"

static ts_status check_update(const float *delta, int64_t n, const char *who) {
    for (int64_t i = 0; i < n; i++)
        if (!isfinite(delta[i]))
            return ts_fail(TS_ERR_NUMERIC, "fed: client %s sent a non-finite update value at %lld",
                           who, (long long)i);
    return TS_OK;
}

/* Sorts the peer indices got[k] by their names (insertion sort: k is at
 * most MAX_PEERS, and qsort would need the peers in a global). */
static void sort_by_name(const agg *a, int *got, int k) {
    for (int i = 1; i < k; i++)
        for (int j = i; j > 0 && strcmp(a->cl[got[j - 1]].name, a->cl[got[j]].name) > 0; j--) {
            int t = got[j];
            got[j] = got[j - 1];
            got[j - 1] = t;
        }
}

ts_status fedr_agg_round_plain(agg *a, int r, FILE *metrics) {
    double t0 = now_s(), total = 0;
    for (int i = 0; i < a->n_cl; i++)
        if (a->cl[i].alive) total += (double)a->cl[i].samples;
    size_t bytes = 8 + (size_t)a->n * 4, up_bytes = (size_t)a->n * 4;
    uint8_t *msg = malloc(bytes);
    double *sum = calloc((size_t)a->n, sizeof *sum);
    size_t text_cap = (size_t)a->n_cl * 400 + 1, text_len = 0;
    char *text = malloc(text_cap);
    if (!msg || !sum || !text) {
        free(msg);
        free(sum);
        free(text);
        return ts_fail(TS_ERR_NOMEM, "fed: round %d buffers", r);
    }
    text[0] = 0;
    memcpy(msg + 8, a->global, (size_t)a->n * 4);
    uint64_t down = 0, up = 0;
    double weights[MAX_PEERS] = {0};
    int k = 0, dropped = 0, got[MAX_PEERS];
    for (int i = 0; i < a->n_cl; i++) {
        peer *p = &a->cl[i];
        if (!p->alive) continue;
        weights[i] = total > 0 ? (double)p->samples / total : 0;
        put_f64(msg, weights[i]);
        send_round(a, p, r, msg, bytes, &dropped, &down);
    }
    free(msg);
    double t_sent = now_s(), t_agg = 0, wsum = 0;
    ts_fed_msg upd[MAX_PEERS];
    for (int i = 0; i < a->n_cl; i++) {
        peer *p = &a->cl[i];
        if (!p->alive) continue;
        ts_fed_msg m;
        if (!recv_update(p, r, up_bytes, &m, &dropped)) continue;
        if (check_update((const float *)m.data, a->n, p->name) != TS_OK) {
            ts_fed_msg_free(&m);
            drop(p, ts_last_error());
            dropped++;
            continue;
        }
        char hex[65];
        sha256_hex(m.data, m.len, hex);
        text_len += (size_t)snprintf(text + text_len, text_cap - text_len, "%s%s %llu %s",
                                     k ? ";" : "", p->name, (unsigned long long)m.len, hex);
        up += m.len;
        fedr_obs_client(a, p->name, m.len, 0);
        wsum += (double)p->samples; /* integers: exact in any order */
        got[k] = i;
        upd[i] = m; /* kept until every update is in */
        k++;
    }
    wsum = total > 0 ? wsum / total : 0;
    double ta = now_s();
    sort_by_name(a, got, k);
    for (int j = 0; j < k; j++) {
        const float *d = (const float *)upd[got[j]].data;
        for (int64_t x = 0; x < a->n; x++) sum[x] += weights[got[j]] * (double)d[x];
        ts_fed_msg_free(&upd[got[j]]);
    }
    t_agg = now_s() - ta;
    ts_status s = TS_OK;
    if (k < a->fp->min_clients)
        s = ts_fail(TS_ERR_IO,
                    "fed: round %d: %d updates arrived (%d clients dropped), fed.min_clients is %d",
                    r, k, dropped, a->fp->min_clients);
    if (s == TS_OK)
        s = fedr_agg_finish(a, r, k, dropped, wsum, text, text_len, sum, (size_t)a->n * 8, up, down,
                            t0, t_sent, t_agg, metrics);
    free(sum);
    free(text);
    return s;
}

ts_status fedr_client_round_plain(ts_fed_conn *c, const ts_fed_msg *m, int64_t n,
                                  ts_fed_train_fn train, void *user, float *local, float *delta,
                                  double *train_s) {
    const float *global = (const float *)(m->data + 8);
    double t0 = now_s();
    ts_status s = train(user, (int)m->round, global, local, n);
    *train_s = now_s() - t0;
    for (int64_t i = 0; s == TS_OK && i < n; i++) delta[i] = local[i] - global[i];
    if (s == TS_OK) s = ts_fed_send(c, TS_FED_MSG_UPDATE, m->round, delta, (uint64_t)n * 4);
    return s;
}
