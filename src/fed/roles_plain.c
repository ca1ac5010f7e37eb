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
    size_t up_bytes = (size_t)a->n * 4;
    double *sum = calloc((size_t)a->n, sizeof *sum);
    fedr_text text;
    if (!fedr_text_init(&text, a->n_cl) || !sum) {
        free(sum);
        free(text.s);
        return ts_fail(TS_ERR_NOMEM, "fed: round %d buffers", r);
    }
    uint64_t down = 0, up = 0;
    double weights[MAX_PEERS] = {0};
    int k = 0, dropped = 0, got[MAX_PEERS];
    ts_status s = fedr_send_rounds(a, r, weights, &total, &dropped, &down);
    double t_sent = now_s(), t_agg = 0, wsum = 0;
    ts_fed_msg upd[MAX_PEERS];
    for (int i = 0; s == TS_OK && i < a->n_cl; i++) {
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
        fedr_accept(a, p, &m, &text, &up, &wsum);
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
    if (s == TS_OK) s = fedr_quorum(a, r, k, dropped);
    if (s == TS_OK)
        s = fedr_agg_finish(a, r, k, dropped, wsum, text.s, text.len, sum, (size_t)a->n * 8, up,
                            down, t0, t_sent, t_agg, metrics);
    free(sum);
    free(text.s);
    return s;
}

ts_status fedr_client_round_plain(ts_fed_conn *c, const ts_fed_msg *m, int64_t n,
                                  ts_fed_train_fn train, void *user, float *local, float *delta,
                                  double *train_s, double *up_s) {
    const float *global = (const float *)(m->data + 8);
    double t0 = now_s();
    ts_status s = train(user, (int)m->round, global, local, n);
    *train_s = now_s() - t0;
    for (int64_t i = 0; s == TS_OK && i < n; i++) delta[i] = local[i] - global[i];
    double tu = now_s();
    if (s == TS_OK) s = ts_fed_send(c, TS_FED_MSG_UPDATE, m->round, delta, (uint64_t)n * 4);
    *up_s = now_s() - tu;
    return s;
}
